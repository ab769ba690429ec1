//! Ring algorithms, as NCCL runs them on one channel.
//!
//! The count is cut into `n` blocks (balanced: sizes differ by at most one
//! element) and each block into `k` pipeline chunks. For each chunk, in
//! order, a rank runs the ring's steps: reduce-scatter passes partial sums
//! around the ring (`n-1` hops), all-gather passes finished blocks (`n-1`
//! hops). Per rank, all-reduce sends exactly `2(n-1)` blocks, i.e.
//! `2(n-1)/n · S` when `n` divides the count; reduce-scatter and
//! all-gather send `(n-1)` blocks.

use super::{BuildOptions, copy_nonempty};
use crate::collective::{Collective, part};
use crate::ir::{Program, Slice, Step};

/// The non-empty chunks of a `len`-element range cut into `k` pieces:
/// `(offset, len)` relative to the range.
pub(super) fn chunks(len: usize, k: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..k).map(move |c| part(len, k, c)).filter(|&(_, l)| l > 0)
}

/// Rank `r`'s successor and predecessor on the ring `0 → 1 → … → n-1 → 0`.
pub(super) fn ring_next(r: usize, n: usize) -> (usize, usize) {
    ((r + 1) % n, (r + n - 1) % n)
}

/// Ring all-reduce: reduce-scatter then all-gather, fused at the turn
/// (`recv-reduce-copy-send`).
pub(crate) fn all_reduce(p: &mut Program, c: Collective, o: &BuildOptions) {
    let n = c.nranks;
    p.reset("ring", c);
    p.in_place = true;
    let block = |j: usize| part(c.count, n, j % n);
    let k = o.chunking(block(0).1, c.dtype.size());
    for r in 0..n {
        let (next, prev) = ring_next(r, n);
        if n == 1 {
            copy_nonempty(p, r, Slice::input(0, c.count), Slice::output(0, c.count));
            continue;
        }
        for ch in 0..k {
            // The chunk `ch` of block j, as a (offset, len) in the buffers.
            let piece = |j: usize| {
                let (boff, blen) = block(j);
                let (coff, clen) = part(blen, k, ch);
                (boff + coff, clen)
            };
            let mut emit = |j: usize, f: &dyn Fn(usize, usize) -> Step| {
                let (off, len) = piece(j);
                if len > 0 {
                    p.push(r, 0, f(off, len));
                }
            };
            // Reduce-scatter, as `reduce_scatter` runs it (so that the sums are
            // added in the same order, bit for bit): after step s, rank r has
            // added its part to block r-1-s.
            emit(r + n - 1, &|off, len| Step::Send { peer: next, src: Slice::input(off, len) });
            for s in 1..n - 1 {
                emit(r + 2 * n - 1 - s, &|off, len| Step::RecvReduceSend {
                    recv: prev,
                    send: next,
                    src: Slice::input(off, len),
                });
            }
            // Block r is complete here: keep it and start the all-gather.
            emit(r, &|off, len| Step::RecvReduceCopySend {
                recv: prev,
                send: next,
                src: Slice::input(off, len),
                dst: Slice::output(off, len),
            });
            for s in 1..n - 1 {
                emit(r + n - s, &|off, len| Step::RecvCopySend {
                    recv: prev,
                    send: next,
                    dst: Slice::output(off, len),
                });
            }
            emit(r + 1, &|off, len| Step::Recv { peer: prev, dst: Slice::output(off, len) });
        }
    }
}

/// Ring reduce-scatter: block `j` (of `count` elements) of every input
/// travels the ring and ends, fully reduced, at rank `j`.
pub(crate) fn reduce_scatter(p: &mut Program, c: Collective, o: &BuildOptions) {
    let (n, cnt) = (c.nranks, c.count);
    p.reset("ring", c);
    p.in_place = true;
    let k = o.chunking(cnt, c.dtype.size());
    for r in 0..n {
        let (next, prev) = ring_next(r, n);
        for (off, len) in chunks(cnt, k) {
            let at = |j: usize| Slice::input((j % n) * cnt + off, len);
            if n == 1 {
                p.push(r, 0, Step::Copy { src: at(0), dst: Slice::output(off, len) });
                continue;
            }
            p.push(r, 0, Step::Send { peer: next, src: at(r + n - 1) });
            for s in 1..n - 1 {
                p.push(r, 0, Step::RecvReduceSend { recv: prev, send: next, src: at(r + 2 * n - 1 - s) });
            }
            p.push(r, 0, Step::RecvReduce { peer: prev, src: at(r), dst: Slice::output(off, len) });
        }
    }
}

/// Ring all-gather: every input travels the ring once.
pub(crate) fn all_gather(p: &mut Program, c: Collective, o: &BuildOptions) {
    let (n, cnt) = (c.nranks, c.count);
    p.reset("ring", c);
    p.in_place = true;
    let k = o.chunking(cnt, c.dtype.size());
    for r in 0..n {
        let (next, prev) = ring_next(r, n);
        for (off, len) in chunks(cnt, k) {
            let at = |j: usize| Slice::output((j % n) * cnt + off, len);
            p.push(r, 0, Step::Copy { src: Slice::input(off, len), dst: at(r) });
            if n == 1 {
                continue;
            }
            p.push(r, 0, Step::Send { peer: next, src: Slice::input(off, len) });
            for s in 1..n - 1 {
                p.push(r, 0, Step::RecvCopySend { recv: prev, send: next, dst: at(r + n - s) });
            }
            p.push(r, 0, Step::Recv { peer: prev, dst: at(r + 1) });
        }
    }
}
