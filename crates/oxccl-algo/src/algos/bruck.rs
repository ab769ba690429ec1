//! Bruck's all-gather and its dual reduce-scatter: `⌈log2 n⌉` messages per
//! rank for any `n` (the ring sends `n-1`), each rank still sending only
//! `(n-1)` blocks in all: latency-bound collectives on many ranks, where
//! NCCL uses PAT.
//!
//! Each rank keeps the blocks in scratch rotated to start at its own:
//! scratch block `i` is block `r+i mod n`. All-gather: after the rounds
//! so far a rank holds `h` blocks (`1, 2, 4, …`); it sends them all to
//! rank `r-h` and receives rank `r+h`'s first `min(h, n-h)`, appended; at
//! the end it copies the rotated blocks to their places. Reduce-scatter
//! runs the same rounds backwards: a rank sends the partial sums of its
//! blocks `[h, h+s)` to rank `r+h`, which adds them to its blocks
//! `[0, s)`; the last round leaves block 0, its own, complete.
//!
//! Messages are pipelined in chunks like the rings'.

use super::BuildOptions;
use crate::collective::Collective;
use crate::ir::{Program, Slice, Step};

/// The rounds of `n` ranks: (blocks held before, blocks sent).
fn rounds(n: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut h = 1;
    while h < n {
        let s = h.min(n - h);
        out.push((h, s));
        h += s;
    }
    out
}

/// The non-empty chunks of a slice cut in `k`.
fn pieces(s: Slice, k: usize) -> impl Iterator<Item = Slice> {
    (0..k).map(move |c| crate::collective::part(s.len, k, c)).filter(|&(_, l)| l > 0).map(move |(o, l)| s.sub(o, l))
}

/// Copies `n` rotated blocks of `cnt` between `rotated` (block `i` is
/// block `r+i`) and `plain` (block `b` at `b·cnt`), in two slices.
fn unrotate(p: &mut Program, r: usize, n: usize, cnt: usize, rotated: Slice, plain: Slice, to_plain: bool) {
    for (roff, poff, len) in [(0, r * cnt, (n - r) * cnt), ((n - r) * cnt, 0, r * cnt)] {
        let (a, b) = (rotated.sub(roff, len), plain.sub(poff, len));
        if len > 0 {
            let (src, dst) = if to_plain { (a, b) } else { (b, a) };
            p.push(r, 0, Step::Copy { src, dst });
        }
    }
}

/// Resets `p` for `c` with every rank's scratch; true when that is all
/// (one rank: a copy).
fn begin(p: &mut Program, c: Collective) -> bool {
    let (n, cnt) = (c.nranks, c.count);
    p.reset("bruck", c);
    p.in_place = true;
    if n == 1 && cnt > 0 {
        p.push(0, 0, Step::Copy { src: Slice::input(0, cnt), dst: Slice::output(0, cnt) });
    }
    (0..n).for_each(|r| p.need_scratch(r, if n > 1 { n * cnt } else { 0 }));
    n == 1
}

/// Bruck all-gather.
pub(crate) fn all_gather(p: &mut Program, c: Collective, o: &BuildOptions) {
    let (n, cnt) = (c.nranks, c.count);
    if begin(p, c) {
        return;
    }
    let blocks = |from: usize, len: usize| Slice::scratch(from * cnt, len * cnt);
    for r in 0..n {
        if cnt > 0 {
            p.push(r, 0, Step::Copy { src: Slice::input(0, cnt), dst: blocks(0, 1) });
        }
        for (h, s) in rounds(n) {
            let k = o.chunking(s * cnt, c.dtype.size());
            let (to, from) = ((r + n - h) % n, (r + h) % n);
            for (out, inn) in pieces(blocks(0, s), k).zip(pieces(blocks(h, s), k)) {
                p.push(r, 0, Step::Send { peer: to, src: out });
                p.push(r, 0, Step::Recv { peer: from, dst: inn });
            }
        }
        unrotate(p, r, n, cnt, blocks(0, n), Slice::output(0, n * cnt), true);
    }
}

/// Bruck reduce-scatter: the all-gather's rounds backwards, reducing.
pub(crate) fn reduce_scatter(p: &mut Program, c: Collective, o: &BuildOptions) {
    let (n, cnt) = (c.nranks, c.count);
    if begin(p, c) {
        return;
    }
    let blocks = |from: usize, len: usize| Slice::scratch(from * cnt, len * cnt);
    for r in 0..n {
        unrotate(p, r, n, cnt, blocks(0, n), Slice::input(0, n * cnt), false);
        let all = rounds(n);
        for (i, &(h, s)) in all.iter().enumerate().rev() {
            let k = o.chunking(s * cnt, c.dtype.size());
            let (to, from) = ((r + h) % n, (r + n - h) % n);
            // The last round writes block 0, complete, to the output.
            let last = i == 0;
            for (out, acc) in pieces(blocks(h, s), k).zip(pieces(blocks(0, s), k)) {
                p.push(r, 0, Step::Send { peer: to, src: out });
                let dst = if last { Slice::output(acc.off, acc.len) } else { acc };
                p.push(r, 0, Step::RecvReduce { peer: from, src: acc, dst });
            }
        }
    }
}
