//! Ring algorithms, one channel, along the ring that follows the hosts.
//!
//! The ring is [`Placement::ring`]: each host's ranks contiguously, so it
//! crosses each host boundary once whatever the numbering (rank order
//! when ranks are numbered blocked, or all on one host). The count is cut
//! into `n` blocks (balanced: sizes differ by at most one element) and
//! each block into `k` pipeline chunks. For each chunk, in order, a rank
//! runs the ring's steps: reduce-scatter passes partial sums around the
//! ring (`n-1` hops), all-gather passes finished blocks (`n-1` hops). Per
//! rank, all-reduce sends exactly `2(n-1)` blocks, i.e. `2(n-1)/n · S`
//! when `n` divides the count; reduce-scatter and all-gather send `(n-1)`
//! blocks. Rank `r` completes block `r` in all three, whatever the ring's
//! order, so all-reduce equals reduce-scatter + all-gather bit for bit.
//!
//! The three patterns run on any ring of members over any blocks
//! ([`reduce_scatter_on`], [`all_gather_on`], [`all_reduce_on`]): the
//! hierarchical algorithms run them inside hosts and across them.

use super::BuildOptions;
use crate::collective::{Collective, part};
use crate::ir::{Program, Slice, Step};
use crate::placement::Placement;

/// The non-empty chunks of a `len`-element range cut into `k` pieces:
/// `(offset, len)` relative to the range.
pub(super) fn chunks(len: usize, k: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..k).map(move |c| part(len, k, c)).filter(|&(_, l)| l > 0)
}

/// Rank `r`'s successor and predecessor on the ring `0 → 1 → … → n-1 → 0`.
pub(super) fn ring_next(r: usize, n: usize) -> (usize, usize) {
    ((r + 1) % n, (r + n - 1) % n)
}

/// Block `q` of a member's buffers: the slice, same on every member.
pub(super) type Blocks<'a> = &'a dyn Fn(usize) -> Slice;

/// Chunk `c` of `k` of a block.
fn chunk(s: Slice, k: usize, c: usize) -> Slice {
    let (off, len) = part(s.len, k, c);
    s.sub(off, len)
}

/// A ring's members (ranks in ring order) and the channel it runs on.
pub(super) struct On<'a> {
    /// Ranks in ring order.
    pub ring: &'a [usize],
    /// The channel its steps go to.
    pub ch: usize,
}

/// Pushes `f(chunk c of block)` to `r`'s channel `ch` unless it is empty.
fn emit(p: &mut Program, (r, ch): (usize, usize), block: Slice, k: usize, c: usize, f: impl FnOnce(Slice) -> Step) {
    let s = chunk(block, k, c);
    if s.len > 0 {
        p.push(r, ch, f(s));
    }
}

/// Reduce-scatter around `ring` (ranks in ring order, `n` of them): block
/// `q` of every member's `src` ends reduced in `ring[q]`'s `dst(q)`, in
/// `k` pipeline chunks. After step `s` of a chunk, the member at position
/// `q` has added its part to block `q-1-s`.
pub(super) fn reduce_scatter_on(p: &mut Program, on: On, k: usize, src: Blocks, dst: Blocks) {
    let (ring, n) = (on.ring, on.ring.len());
    for (q, &r) in ring.iter().enumerate() {
        let r = (r, on.ch);
        if n == 1 {
            (0..k).for_each(|c| emit(p, r, src(0), k, c, |s| Step::Copy { src: s, dst: chunk(dst(0), k, c) }));
            continue;
        }
        let (next, prev) = (ring[(q + 1) % n], ring[(q + n - 1) % n]);
        for c in 0..k {
            emit(p, r, src((q + n - 1) % n), k, c, |s| Step::Send { peer: next, src: s });
            for s in 1..n - 1 {
                emit(p, r, src((q + 2 * n - 1 - s) % n), k, c, |s| Step::RecvReduceSend {
                    recv: prev,
                    send: next,
                    src: s,
                });
            }
            emit(p, r, src(q), k, c, |s| Step::RecvReduce { peer: prev, src: s, dst: chunk(dst(q), k, c) });
        }
    }
}

/// All-gather around `ring`: `ring[q]`'s `own(q)` (copied to its `dst(q)`
/// first unless `own` is `dst`) ends in every member's `dst(q)`.
pub(super) fn all_gather_on(p: &mut Program, on: On, k: usize, own: Blocks, dst: Blocks, copy_own: bool) {
    let (ring, n) = (on.ring, on.ring.len());
    for (q, &r) in ring.iter().enumerate() {
        let r = (r, on.ch);
        let (next, prev) = (ring[(q + 1) % n], ring[(q + n - 1) % n]);
        for c in 0..k {
            if copy_own {
                emit(p, r, own(q), k, c, |s| Step::Copy { src: s, dst: chunk(dst(q), k, c) });
            }
            if n == 1 {
                continue;
            }
            emit(p, r, own(q), k, c, |s| Step::Send { peer: next, src: s });
            for s in 1..n - 1 {
                emit(p, r, dst((q + n - s) % n), k, c, |d| Step::RecvCopySend { recv: prev, send: next, dst: d });
            }
            emit(p, r, dst((q + 1) % n), k, c, |d| Step::Recv { peer: prev, dst: d });
        }
    }
}

/// All-reduce around `ring`: reduce-scatter then all-gather, fused at the
/// turn (`recv-reduce-copy-send`); member `q` completes block `q` of
/// `dst` from every member's `src(q)`, then every `dst(j)` arrives.
pub(super) fn all_reduce_on(p: &mut Program, on: On, k: usize, src: Blocks, dst: Blocks) {
    let (ring, n) = (on.ring, on.ring.len());
    for (q, &r) in ring.iter().enumerate() {
        let r = (r, on.ch);
        if n == 1 {
            (0..n).for_each(|j| emit(p, r, src(j), 1, 0, |s| Step::Copy { src: s, dst: dst(j) }));
            continue;
        }
        let (next, prev) = (ring[(q + 1) % n], ring[(q + n - 1) % n]);
        for c in 0..k {
            // Reduce-scatter, as `reduce_scatter_on` runs it (so that the
            // sums are added in the same order, bit for bit).
            emit(p, r, src((q + n - 1) % n), k, c, |s| Step::Send { peer: next, src: s });
            for s in 1..n - 1 {
                emit(p, r, src((q + 2 * n - 1 - s) % n), k, c, |s| Step::RecvReduceSend {
                    recv: prev,
                    send: next,
                    src: s,
                });
            }
            // Block q is complete here: keep it and start the all-gather.
            emit(p, r, src(q), k, c, |s| Step::RecvReduceCopySend {
                recv: prev,
                send: next,
                src: s,
                dst: chunk(dst(q), k, c),
            });
            for s in 1..n - 1 {
                emit(p, r, dst((q + n - s) % n), k, c, |d| Step::RecvCopySend { recv: prev, send: next, dst: d });
            }
            emit(p, r, dst((q + 1) % n), k, c, |d| Step::Recv { peer: prev, dst: d });
        }
    }
}

/// Ring all-reduce: block `r` of `n` completes at rank `r`.
pub(crate) fn all_reduce(p: &mut Program, c: Collective, o: &BuildOptions, at: &Placement) {
    p.reset("ring", c);
    p.in_place = true;
    let ring = at.ring();
    let block = |q: usize| part(c.count, c.nranks, ring[q]);
    let k = o.chunking(part(c.count, c.nranks, 0).1, c.dtype.size());
    all_reduce_on(
        p,
        On { ring: &ring, ch: 0 },
        k,
        &|q| {
            let (off, len) = block(q);
            Slice::input(off, len)
        },
        &|q| {
            let (off, len) = block(q);
            Slice::output(off, len)
        },
    );
}

/// Ring reduce-scatter: block `j` (of `count` elements) of every input
/// travels the ring and ends, fully reduced, at rank `j`.
pub(crate) fn reduce_scatter(p: &mut Program, c: Collective, o: &BuildOptions, at: &Placement) {
    let cnt = c.count;
    p.reset("ring", c);
    p.in_place = true;
    let ring = at.ring();
    let k = o.chunking(cnt, c.dtype.size());
    reduce_scatter_on(p, On { ring: &ring, ch: 0 }, k, &|q| Slice::input(ring[q] * cnt, cnt), &|_| {
        Slice::output(0, cnt)
    });
}

/// Ring all-gather: every input travels the ring once.
pub(crate) fn all_gather(p: &mut Program, c: Collective, o: &BuildOptions, at: &Placement) {
    let cnt = c.count;
    p.reset("ring", c);
    p.in_place = true;
    let ring = at.ring();
    let k = o.chunking(cnt, c.dtype.size());
    all_gather_on(
        p,
        On { ring: &ring, ch: 0 },
        k,
        &|_| Slice::input(0, cnt),
        &|q| Slice::output(ring[q] * cnt, cnt),
        true,
    );
}
