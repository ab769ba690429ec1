//! Direct algorithms: every rank reads (or writes) its peers' buffers
//! itself, over shared memory, CUDA IPC or RDMA.
//!
//! Each program opens with a barrier of signals ("my buffers are ready")
//! and closes with one ("I am done with yours"), so no rank touches a
//! peer's memory before the peer entered the collective or after it left;
//! the verifier checks exactly that. One-shot all-reduce moves `(n-1)·S`
//! into each rank in one round (latency-bound sizes); two-shot moves
//! `2(n-1)/n · S` like the ring, in two rounds.
//!
//! The rooted collectives need no barrier: only the root's buffers are
//! shared (broadcast, scatter: everyone reads the root's input; reduce,
//! gather: the root reads everyone's input), so signals go between the
//! root and each other rank, one each way: "ready" before the first
//! access, "done" after the last.

use super::copy_nonempty;
use crate::collective::{Collective, part};
use crate::ir::{Program, Slice, Step};

/// Every rank but `r`, starting after it.
pub(super) fn peers(r: usize, n: usize) -> impl Iterator<Item = usize> {
    (1..n).map(move |k| (r + k) % n)
}

fn barrier(p: &mut Program, r: usize, n: usize) {
    for q in peers(r, n) {
        p.push(r, 0, Step::Signal { peer: q });
    }
    for q in peers(r, n) {
        p.push(r, 0, Step::Wait { peer: q });
    }
}

/// `dst = local ⊕ Σ_q peer q's src` by direct reads, `local` and `src` at
/// the same offsets.
fn reduce_from_peers(p: &mut Program, r: usize, n: usize, local: Slice, remote: Slice, dst: Slice) {
    let mut acc = local;
    for q in peers(r, n) {
        p.push(r, 0, Step::GetReduce { peer: q, src: remote, acc, dst });
        acc = dst;
    }
}

/// The whole input to the output (nothing when `len` is 0): a single rank's
/// collective.
fn copy_alone(p: &mut Program, r: usize, len: usize) {
    copy_nonempty(p, r, Slice::input(0, len), Slice::output(0, len));
}

/// One-shot all-reduce: each rank reduces all inputs itself, in rank order
/// `0, 1, …, n-1` on every rank so that all of them end with the same bits
/// (into scratch, so an in-place call's input stays intact while peers
/// read it).
pub(crate) fn one_shot(p: &mut Program, c: Collective) {
    let (n, count) = (c.nranks, c.count);
    p.reset("oneshot", c);
    p.in_place = true;
    let (input, acc) = (Slice::input(0, count), Slice::scratch(0, count));
    for r in 0..n {
        if n == 1 || count == 0 {
            copy_alone(p, r, count);
            continue;
        }
        p.need_scratch(r, count);
        barrier(p, r, n);
        for j in 0..n {
            let step = match (j, j == r) {
                (0, true) => Step::Copy { src: input, dst: acc },
                (0, false) => Step::Get { peer: 0, src: input, dst: acc },
                (_, true) => Step::Reduce { srcs: vec![acc, input], dst: acc },
                (_, false) => Step::GetReduce { peer: j, src: input, acc, dst: acc },
            };
            p.push(r, 0, step);
        }
        barrier(p, r, n);
        p.push(r, 0, Step::Copy { src: acc, dst: Slice::output(0, count) });
    }
}

/// Two-shot all-reduce: rank `r` reduces block `r` reading every peer's
/// input, then every rank reads the finished blocks from their owners.
pub(crate) fn two_shot(p: &mut Program, c: Collective) {
    let (n, count) = (c.nranks, c.count);
    p.reset("twoshot", c);
    p.in_place = true;
    let block = |j: usize| {
        let (off, len) = part(count, n, j);
        Slice::output(off, len)
    };
    for r in 0..n {
        if n == 1 || count == 0 {
            copy_alone(p, r, count);
            continue;
        }
        barrier(p, r, n);
        let mine = block(r);
        if mine.len > 0 {
            let input = Slice::input(mine.off, mine.len);
            reduce_from_peers(p, r, n, input, input, mine);
        }
        barrier(p, r, n);
        for q in peers(r, n) {
            let theirs = block(q);
            if theirs.len > 0 {
                p.push(r, 0, Step::Get { peer: q, src: theirs, dst: theirs });
            }
        }
        barrier(p, r, n);
    }
}

/// Direct reduce-scatter: rank `r` reduces block `r` of every input.
pub(crate) fn reduce_scatter(p: &mut Program, c: Collective) {
    let (n, cnt) = (c.nranks, c.count);
    p.reset("direct", c);
    p.in_place = true;
    for r in 0..n {
        if n == 1 || cnt == 0 {
            copy_alone(p, r, cnt);
            continue;
        }
        barrier(p, r, n);
        let mine = Slice::input(r * cnt, cnt);
        reduce_from_peers(p, r, n, mine, mine, Slice::output(0, cnt));
        barrier(p, r, n);
    }
}

/// Direct all-gather: each rank writes its input into every peer's output.
pub(crate) fn all_gather(p: &mut Program, c: Collective) {
    let (n, cnt) = (c.nranks, c.count);
    p.reset("direct", c);
    p.in_place = true;
    for r in 0..n {
        let mine = Slice::output(r * cnt, cnt);
        if cnt == 0 {
            continue;
        }
        p.push(r, 0, Step::Copy { src: Slice::input(0, cnt), dst: mine });
        if n == 1 {
            continue;
        }
        barrier(p, r, n);
        for q in peers(r, n) {
            p.push(r, 0, Step::Put { peer: q, src: Slice::input(0, cnt), dst: mine });
        }
        barrier(p, r, n);
    }
}

/// Direct all-to-all: each rank reads its block from every peer's input.
/// Not in-place safe: a rank would overwrite blocks a peer still reads.
pub(crate) fn all_to_all(p: &mut Program, c: Collective) {
    let (n, cnt) = (c.nranks, c.count);
    p.reset("direct", c);
    p.in_place = false;
    for r in 0..n {
        if cnt == 0 {
            continue;
        }
        p.push(r, 0, Step::Copy { src: Slice::input(r * cnt, cnt), dst: Slice::output(r * cnt, cnt) });
        if n == 1 {
            continue;
        }
        barrier(p, r, n);
        for q in peers(r, n) {
            p.push(r, 0, Step::Get { peer: q, src: Slice::input(r * cnt, cnt), dst: Slice::output(q * cnt, cnt) });
        }
        barrier(p, r, n);
    }
}

/// Rooted direct collectives where the others read the root's input
/// (broadcast, scatter): the root does its local `copy` (before its
/// signals, so an in-place copy onto itself is ordered before every read),
/// tells every rank its input is ready and waits until all are done; each
/// other rank waits, reads `src(r)` into `dst`, and says it is done.
fn readers_of_root(p: &mut Program, c: Collective, copy: (Slice, Slice), src: &dyn Fn(usize) -> Slice, dst: Slice) {
    let (n, root) = (c.nranks, c.root);
    for r in 0..n {
        if r == root {
            copy_nonempty(p, r, copy.0, copy.1);
            for q in peers(r, n) {
                p.push(r, 0, Step::Signal { peer: q });
            }
            for q in peers(r, n) {
                p.push(r, 0, Step::Wait { peer: q });
            }
        } else {
            p.push(r, 0, Step::Wait { peer: root });
            p.push(r, 0, Step::Get { peer: root, src: src(r), dst });
            p.push(r, 0, Step::Signal { peer: root });
        }
    }
}

/// Direct broadcast: every rank reads the root's input.
pub(crate) fn broadcast(p: &mut Program, c: Collective) {
    let cnt = c.count;
    p.reset("direct", c);
    p.in_place = true;
    if cnt == 0 {
        return;
    }
    let whole = Slice::input(0, cnt);
    readers_of_root(p, c, (whole, Slice::output(0, cnt)), &|_| whole, Slice::output(0, cnt));
}

/// Direct scatter: every rank reads its block of the root's input.
pub(crate) fn scatter(p: &mut Program, c: Collective) {
    let (cnt, root) = (c.count, c.root);
    p.reset("direct", c);
    p.in_place = true;
    if cnt == 0 {
        return;
    }
    let block = |r: usize| Slice::input(r * cnt, cnt);
    readers_of_root(p, c, (block(root), Slice::output(0, cnt)), &block, Slice::output(0, cnt));
}

/// Rooted direct collectives where the root reads everyone's input
/// (reduce, gather): every other rank says its input is ready and waits to
/// be released; the root does `first` (its local work), waits for every
/// rank, runs `reads` (all posted back to back), then releases them.
fn root_reads(p: &mut Program, c: Collective, first: Option<Step>, reads: Vec<Step>) {
    let (n, root) = (c.nranks, c.root);
    for r in 0..n {
        if r != root {
            p.push(r, 0, Step::Signal { peer: root });
            p.push(r, 0, Step::Wait { peer: root });
        }
    }
    if let Some(step) = first {
        p.push(root, 0, step);
    }
    for q in peers(root, n) {
        p.push(root, 0, Step::Wait { peer: q });
    }
    for step in reads {
        p.push(root, 0, step);
    }
    for q in peers(root, n) {
        p.push(root, 0, Step::Signal { peer: q });
    }
}

/// Direct gather: the root reads every rank's input into its block.
pub(crate) fn gather(p: &mut Program, c: Collective) {
    let (n, cnt, root) = (c.nranks, c.count, c.root);
    p.reset("direct", c);
    p.in_place = true;
    if cnt == 0 {
        return;
    }
    let input = Slice::input(0, cnt);
    let block = |q: usize| Slice::output(q * cnt, cnt);
    let reads = peers(root, n).map(|q| Step::Get { peer: q, src: input, dst: block(q) }).collect();
    root_reads(p, c, Some(Step::Copy { src: input, dst: block(root) }), reads);
}

/// Direct reduce: the root get-reduces every rank's input into its
/// output, in rank order `0, 1, …, n-1` whatever the root, so the result's
/// bits do not depend on the root. The root's own input joins at its
/// turn; a root other than 0 first keeps a copy of it in scratch, so an
/// in-place call (input and output one buffer) does not lose it when rank
/// 0's data lands.
pub(crate) fn reduce(p: &mut Program, c: Collective) {
    let (n, cnt, root) = (c.nranks, c.count, c.root);
    p.reset("direct", c);
    p.in_place = true;
    if cnt == 0 {
        return;
    }
    let (input, out) = (Slice::input(0, cnt), Slice::output(0, cnt));
    if n == 1 {
        p.push(root, 0, Step::Copy { src: input, dst: out });
        return;
    }
    let own = if root == 0 { out } else { Slice::scratch(0, cnt) };
    if root != 0 {
        p.need_scratch(root, cnt);
    }
    let reads = (0..n)
        .filter_map(|j| match (j, j == root) {
            (0, true) => None,
            (0, false) => Some(Step::Get { peer: 0, src: input, dst: out }),
            (_, true) => Some(Step::Reduce { srcs: vec![out, own], dst: out }),
            (_, false) => Some(Step::GetReduce { peer: j, src: input, acc: out, dst: out }),
        })
        .collect();
    root_reads(p, c, Some(Step::Copy { src: input, dst: own }), reads);
}
