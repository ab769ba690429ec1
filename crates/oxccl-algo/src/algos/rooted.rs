//! Rooted collectives (broadcast, reduce as a pipelined chain or a binary
//! tree; gather and scatter), pairwise all-to-all and send/recv.

use super::ring::{chunks, ring_next};
use super::tree::{TreeLinks, broadcast_down, btree, reduce_up};
use super::{BuildOptions, copy_nonempty};
use crate::collective::Collective;
use crate::ir::{Program, Slice, Step};
use crate::placement::Placement;

/// The chain of a rooted collective, crossing each host boundary once:
/// the root's host (from the root, in rank order around the host), then
/// the other hosts in [`Placement::ring`]'s order; for `reduce` it ends at
/// the root instead (the other hosts, then the root's host from the rank
/// after the root). With one host, `root, root+1, …, root-1` (broadcast)
/// and `root+1, …, root` (reduce). Returns `i ↦ (rank, next, prev)`.
fn chain(at: &Placement, root: usize, reduce: bool) -> impl Fn(usize) -> (usize, usize, usize) {
    let (h0, nh) = (at.host_of(root), at.nhosts());
    let mut mine = at.ranks_of(h0);
    let me = mine.iter().position(|&r| r == root).unwrap_or(0);
    let len = mine.len();
    mine.rotate_left((me + usize::from(reduce)) % len);
    let others = (1..nh).flat_map(|d| at.ranks_of((h0 + d) % nh));
    let order: Vec<usize> =
        if reduce { others.chain(mine).collect() } else { mine.into_iter().chain(others).collect() };
    move |i| {
        let n = order.len();
        let (next, prev) = ring_next(i % n, n);
        (order[i % n], order[next], order[prev])
    }
}

/// Pipelined chain broadcast from the root ([`chain`]: root → root+1 → …
/// → root-1 on one host), chunk by chunk.
pub(crate) fn chain_broadcast(p: &mut Program, c: Collective, o: &BuildOptions, at: &Placement) {
    let (n, count, root) = (c.nranks, c.count, c.root);
    p.reset("ring", c);
    p.in_place = true;
    let link = chain(at, root, false);
    for (off, len) in chunks(count, o.chunking(count, c.dtype.size())) {
        for i in 0..n {
            let (r, next, prev) = link(i);
            let out = Slice::output(off, len);
            if i == 0 {
                copy_nonempty(p, r, Slice::input(off, len), out);
                if n > 1 {
                    p.push(r, 0, Step::Send { peer: next, src: Slice::input(off, len) });
                }
            } else if i + 1 < n {
                p.push(r, 0, Step::RecvCopySend { recv: prev, send: next, dst: out });
            } else {
                p.push(r, 0, Step::Recv { peer: prev, dst: out });
            }
        }
    }
}

/// Pipelined chain reduce to the root ([`chain`]: root+1 → root+2 → … →
/// root on one host), accumulating.
pub(crate) fn chain_reduce(p: &mut Program, c: Collective, o: &BuildOptions, at: &Placement) {
    let (n, count, root) = (c.nranks, c.count, c.root);
    p.reset("ring", c);
    p.in_place = true;
    let link = chain(at, root, true);
    for (off, len) in chunks(count, o.chunking(count, c.dtype.size())) {
        let input = Slice::input(off, len);
        for i in 0..n {
            let (r, next, prev) = link(i);
            let step = match (i, i + 1 == n) {
                (_, true) if n == 1 => Step::Copy { src: input, dst: Slice::output(off, len) },
                (_, true) => Step::RecvReduce { peer: prev, src: input, dst: Slice::output(off, len) },
                (0, false) => Step::Send { peer: next, src: input },
                _ => Step::RecvReduceSend { recv: prev, send: next, src: input },
            };
            p.push(r, 0, step);
        }
    }
}

/// Rank `r`'s links in the binary tree rooted at `root` (ranks relabelled
/// so that `root` is the tree's rank 0).
fn rooted_tree(n: usize, root: usize, r: usize) -> TreeLinks {
    let l = btree(n, (r + n - root) % n);
    let real = |v: usize| (v + root) % n;
    TreeLinks { parent: l.parent.map(real), children: l.children.into_iter().map(real).collect() }
}

/// Binary-tree broadcast, pipelined chunk by chunk.
pub(crate) fn tree_broadcast(p: &mut Program, c: Collective, o: &BuildOptions) {
    let (n, count, root) = (c.nranks, c.count, c.root);
    p.reset("tree", c);
    p.in_place = true;
    for r in 0..n {
        let links = rooted_tree(n, root, r);
        for (off, len) in chunks(count, o.chunking(count, c.dtype.size())) {
            if r == root {
                copy_nonempty(p, r, Slice::input(off, len), Slice::output(off, len));
                for &child in &links.children {
                    p.push(r, 0, Step::Send { peer: child, src: Slice::input(off, len) });
                }
            } else {
                broadcast_down(p, r, 0, &links, Slice::output(off, len));
            }
        }
    }
}

/// Binary-tree reduce, pipelined; inner ranks keep partial sums in scratch.
pub(crate) fn tree_reduce(p: &mut Program, c: Collective, o: &BuildOptions) {
    let (n, count, root) = (c.nranks, c.count, c.root);
    p.reset("tree", c);
    p.in_place = true;
    for r in 0..n {
        let links = rooted_tree(n, root, r);
        if n == 1 {
            copy_nonempty(p, r, Slice::input(0, count), Slice::output(0, count));
            continue;
        }
        if r != root && links.children.len() > 1 {
            p.need_scratch(r, count);
        }
        for (off, len) in chunks(count, o.chunking(count, c.dtype.size())) {
            let acc = if r == root { Slice::output(off, len) } else { Slice::scratch(off, len) };
            reduce_up(p, r, 0, &links, Slice::input(off, len), acc);
        }
    }
}

/// nccl-tests' send/recv: rank `r` sends to `r+1` and receives from `r-1`.
pub(crate) fn send_recv(p: &mut Program, c: Collective) {
    let (n, count) = (c.nranks, c.count);
    p.reset("direct", c);
    p.in_place = true;
    for r in 0..n {
        if n == 1 {
            copy_nonempty(p, r, Slice::input(0, count), Slice::output(0, count));
        } else if count > 0 {
            let (next, prev) = ring_next(r, n);
            p.push(r, 0, Step::Send { peer: next, src: Slice::input(0, count) });
            p.push(r, 0, Step::Recv { peer: prev, dst: Slice::output(0, count) });
        }
    }
}

/// Pairwise all-to-all: in round `k`, rank `r` sends block `r+k` to rank
/// `r+k` and receives block `r` from rank `r-k`. In place only for two
/// ranks: with more, a rank overwrites blocks it has yet to send.
pub(crate) fn pairwise_all_to_all(p: &mut Program, c: Collective) {
    let (n, cnt) = (c.nranks, c.count);
    p.reset("pairwise", c);
    p.in_place = n <= 2;
    for r in 0..n {
        if cnt == 0 {
            continue;
        }
        copy_nonempty(p, r, Slice::input(r * cnt, cnt), Slice::output(r * cnt, cnt));
        for k in 1..n {
            let (to, from) = ((r + k) % n, (r + n - k) % n);
            p.push(r, 0, Step::Send { peer: to, src: Slice::input(to * cnt, cnt) });
            p.push(r, 0, Step::Recv { peer: from, dst: Slice::output(from * cnt, cnt) });
        }
    }
}

/// Sends a linear all-to-all rank posts before it receives: its peers
/// in groups of this many, each group's sends, then its receives. A send
/// that has begun (its header queued) runs on while its lane moves past
/// it, up to this many at once (the engine's `MAX_DEFERRED`), so a group's
/// sends never wait for a receiver that waits on its own group's sends.
pub const LINEAR_GROUP: usize = 8;

/// Linear all-to-all: rank `r` sends block `r+k` to rank `r+k` for every
/// `k` of a group, then receives block `r-k` from rank `r-k` for the same
/// `k`s; groups of [`LINEAR_GROUP`] peers in turn. Every message of a group
/// is in flight at once, so on few ranks the call takes one latency, not
/// pairwise exchange's `n-1` (its rounds each wait for the last). In place
/// with one group: every block is sent before any is received.
pub(crate) fn linear_all_to_all(p: &mut Program, c: Collective) {
    let (n, cnt) = (c.nranks, c.count);
    p.reset("linear", c);
    p.in_place = n <= LINEAR_GROUP + 1;
    for r in 0..n {
        if cnt == 0 {
            continue;
        }
        copy_nonempty(p, r, Slice::input(r * cnt, cnt), Slice::output(r * cnt, cnt));
        let ks: Vec<usize> = (1..n).collect();
        for group in ks.chunks(LINEAR_GROUP) {
            for &k in group {
                let to = (r + k) % n;
                p.push(r, 0, Step::Send { peer: to, src: Slice::input(to * cnt, cnt) });
            }
            for &k in group {
                let from = (r + n - k) % n;
                p.push(r, 0, Step::Recv { peer: from, dst: Slice::output(from * cnt, cnt) });
            }
        }
    }
}

/// Linear gather: every rank sends its input to the root.
pub(crate) fn gather(p: &mut Program, c: Collective) {
    let (n, cnt, root) = (c.nranks, c.count, c.root);
    p.reset("linear", c);
    p.in_place = true;
    if cnt == 0 {
        return;
    }
    for r in 0..n {
        if r == root {
            copy_nonempty(p, r, Slice::input(0, cnt), Slice::output(r * cnt, cnt));
            for q in (1..n).map(|k| (root + k) % n) {
                p.push(r, 0, Step::Recv { peer: q, dst: Slice::output(q * cnt, cnt) });
            }
        } else {
            p.push(r, 0, Step::Send { peer: root, src: Slice::input(0, cnt) });
        }
    }
}

/// Linear scatter: the root sends block `r` of its input to rank `r`.
pub(crate) fn scatter(p: &mut Program, c: Collective) {
    let (n, cnt, root) = (c.nranks, c.count, c.root);
    p.reset("linear", c);
    p.in_place = true;
    if cnt == 0 {
        return;
    }
    for r in 0..n {
        if r == root {
            for q in (1..n).map(|k| (root + k) % n) {
                p.push(r, 0, Step::Send { peer: q, src: Slice::input(q * cnt, cnt) });
            }
            copy_nonempty(p, r, Slice::input(r * cnt, cnt), Slice::output(0, cnt));
        } else {
            p.push(r, 0, Step::Recv { peer: root, dst: Slice::output(0, cnt) });
        }
    }
}
