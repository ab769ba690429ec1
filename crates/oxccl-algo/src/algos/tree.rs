//! Binary trees and NCCL's double binary tree.
//!
//! [`btree`] is the in-order binary tree NCCL builds over ranks `0..n`: a
//! rank whose lowest set bit is `b` has children `r - b/2` and the first of
//! `r + b/2, r + b/4, …` that exists; its parent is `(r ^ b) | 2b`, or
//! `r ^ b` when that is out of range. Rank 0 is the root, with one child
//! (the highest power of two below `n`). The depth is `⌈log2 n⌉`.
//!
//! [`dtree`] adds the complementary tree NCCL pairs with it: mirrored
//! (`r ↦ n-1-r`) when `n` is even, shifted by one when it is odd, so that
//! most ranks that are leaves in one tree are inner nodes in the other.
//! Tree all-reduce gives each tree half the data (one channel each):
//! every chunk is reduced up to the root, then broadcast down.
//!
//! Volume: a tree carrying `S_t` bytes makes each rank send `S_t` to its
//! parent (if any) and `S_t` to each child, and receive as much; over all
//! ranks a tree moves `2(n-1)·S_t`, so the double tree moves `2(n-1)·S`
//! in total, like the ring, but a rank with two children in one tree and a
//! parent in both sends up to `1.5·S`.
//!
//! On ranks spread over hosts ([`host_tree`]), the trees take NCCL's shape:
//! a chain through each host's ranks, and a double binary tree over the
//! hosts joining the chains' heads; each tree crosses between hosts
//! `H-1` times, in `⌈log2 H⌉ + L - 1` hops from the deepest rank.

use super::ring::chunks;
use super::{BuildOptions, copy_nonempty};
use crate::collective::{Collective, part};
use crate::ir::{Program, Slice, Step};
use crate::placement::Placement;

/// A rank's neighbours in one tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeLinks {
    /// The parent (`None` at the root).
    pub parent: Option<usize>,
    /// Zero, one or two children.
    pub children: Vec<usize>,
}

/// Rank `r`'s links in NCCL's binary tree over `n` ranks (root 0).
pub fn btree(n: usize, r: usize) -> TreeLinks {
    assert!(r < n, "rank {r} out of range for {n} ranks");
    if r == 0 {
        let children = if n > 1 { vec![1 << (usize::BITS - 1 - (n - 1).leading_zeros())] } else { vec![] };
        return TreeLinks { parent: None, children };
    }
    let b = 1 << r.trailing_zeros();
    let up = (r ^ b) | (b << 1);
    let parent = if up < n { up } else { r ^ b };
    let mut children = Vec::with_capacity(2);
    let mut low = b >> 1;
    if low > 0 {
        children.push(r - low);
        while low > 0 && r + low >= n {
            low >>= 1;
        }
        if low > 0 {
            children.push(r + low);
        }
    }
    TreeLinks { parent: Some(parent), children }
}

/// Rank `r`'s links in tree `t` (0 or 1) of NCCL's double binary tree.
pub fn dtree(n: usize, r: usize, t: usize) -> TreeLinks {
    if t == 0 {
        return btree(n, r);
    }
    // Tree 1 is tree 0 over relabelled ranks: mirrored for even n,
    // shifted by one for odd n.
    let even = n.is_multiple_of(2);
    let to = |x: usize| if even { n - 1 - x } else { (x + n - 1) % n };
    let from = |x: usize| if even { n - 1 - x } else { (x + 1) % n };
    let l = btree(n, to(r));
    TreeLinks { parent: l.parent.map(&from), children: l.children.into_iter().map(&from).collect() }
}

/// Rank `r`'s links in tree `t` (0 or 1) over hosts: a chain through each
/// host's ranks (ascending in tree 0, descending in tree 1, so the chains'
/// heads differ), the heads joined by [`dtree`] over the hosts.
pub fn host_tree(at: &Placement, r: usize, t: usize) -> TreeLinks {
    let (h, nh) = (at.host_of(r), at.nhosts());
    let chain = |x: usize| {
        let mut g = at.ranks_of(x);
        if t == 1 {
            g.reverse();
        }
        g
    };
    let mine = chain(h);
    let q = mine.iter().position(|&x| x == r).expect("r is on its host");
    let mut children: Vec<usize> = mine.get(q + 1).copied().into_iter().collect();
    let parent = if q > 0 {
        Some(mine[q - 1])
    } else {
        let up = dtree(nh, h, t);
        children.extend(up.children.iter().map(|&x| chain(x)[0]));
        up.parent.map(|x| chain(x)[0])
    };
    TreeLinks { parent, children }
}

/// Double binary tree all-reduce: over the ranks, or where they are on
/// several hosts, over the hosts with a chain through each ([`host_tree`]).
pub(crate) fn all_reduce(p: &mut Program, c: Collective, o: &BuildOptions, at: &Placement) {
    let n = c.nranks;
    p.reset("tree", c);
    p.in_place = true;
    for r in 0..n {
        if n == 1 {
            copy_nonempty(p, r, Slice::input(0, c.count), Slice::output(0, c.count));
            continue;
        }
        for t in 0..2 {
            let (hoff, hlen) = part(c.count, 2, t);
            let links = if at.is_flat() { dtree(n, r, t) } else { host_tree(at, r, t) };
            let k = o.chunking(hlen, c.dtype.size());
            let pieces: Vec<(usize, usize)> = chunks(hlen, k).map(|(off, len)| (hoff + off, len)).collect();
            for &(off, len) in &pieces {
                reduce_up(p, r, t, &links, Slice::input(off, len), Slice::output(off, len));
            }
            for &(off, len) in &pieces {
                broadcast_down(p, r, t, &links, Slice::output(off, len));
            }
        }
    }
}

/// One chunk's reduction towards the root: `acc` is where a rank with two
/// children keeps its partial sum (and the root its result).
pub(super) fn reduce_up(p: &mut Program, r: usize, ch: usize, l: &TreeLinks, input: Slice, acc: Slice) {
    let mut src = input;
    for (i, &child) in l.children.iter().enumerate() {
        let last = i + 1 == l.children.len();
        match (last, l.parent) {
            (true, Some(parent)) => p.push(r, ch, Step::RecvReduceSend { recv: child, send: parent, src }),
            _ => {
                p.push(r, ch, Step::RecvReduce { peer: child, src, dst: acc });
                src = acc;
            }
        }
    }
    if let (true, Some(parent)) = (l.children.is_empty(), l.parent) {
        p.push(r, ch, Step::Send { peer: parent, src: input });
    }
}

/// One chunk's broadcast away from the root, landing in `dst`.
pub(super) fn broadcast_down(p: &mut Program, r: usize, ch: usize, l: &TreeLinks, dst: Slice) {
    let mut rest = &l.children[..];
    if let Some(parent) = l.parent {
        match rest.split_first() {
            Some((&first, tail)) => {
                p.push(r, ch, Step::RecvCopySend { recv: parent, send: first, dst });
                rest = tail;
            }
            None => p.push(r, ch, Step::Recv { peer: parent, dst }),
        }
    }
    for &child in rest {
        p.push(r, ch, Step::Send { peer: child, src: dst });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_tree(n: usize, t: usize) -> usize {
        let mut depth_max = 0;
        for r in 0..n {
            let l = dtree(n, r, t);
            assert!(l.children.len() <= 2);
            for &c in &l.children {
                assert_eq!(dtree(n, c, t).parent, Some(r), "n={n} t={t}: {c}'s parent should be {r}");
            }
            // Walk to the root: no cycles.
            let (mut x, mut depth) = (r, 0);
            while let Some(up) = dtree(n, x, t).parent {
                assert!(dtree(n, up, t).children.contains(&x));
                x = up;
                depth += 1;
                assert!(depth <= n);
            }
            depth_max = depth_max.max(depth);
        }
        depth_max
    }

    #[test]
    fn trees_are_consistent_and_shallow() {
        for n in 1..=130 {
            for t in 0..2 {
                let d = check_tree(n, t);
                let log = usize::BITS - (n - 1).leading_zeros(); // ⌈log2 n⌉
                assert!(d <= log as usize, "n={n} t={t}: depth {d} > {log}");
            }
        }
        assert_eq!(btree(6, 4), TreeLinks { parent: Some(0), children: vec![2, 5] });
        assert_eq!(btree(8, 0).children, vec![4]);
    }

    #[test]
    fn host_trees_chain_hosts_and_join_their_heads() {
        for at in [Placement::blocked(4, 3), Placement::cyclic(5, 2), Placement::from_keys(&[0, 1, 1, 0, 2, 2, 2])] {
            let n = at.nranks();
            for t in 0..2 {
                let (mut roots, mut crossings) = (0, 0);
                for r in 0..n {
                    let l = host_tree(&at, r, t);
                    for &c in &l.children {
                        assert_eq!(host_tree(&at, c, t).parent, Some(r), "{at} t={t}: {c}'s parent should be {r}");
                        crossings += usize::from(at.crosses(r, c));
                    }
                    roots += usize::from(l.parent.is_none());
                    // At most one child on the host, at most two elsewhere.
                    assert!(l.children.iter().filter(|&&c| !at.crosses(r, c)).count() <= 1);
                    let (mut x, mut depth) = (r, 0);
                    while let Some(up) = host_tree(&at, x, t).parent {
                        x = up;
                        depth += 1;
                        assert!(depth <= n, "{at} t={t}: a cycle");
                    }
                }
                assert_eq!((roots, crossings), (1, at.nhosts() - 1), "{at} t={t}");
            }
        }
    }

    #[test]
    fn the_two_trees_have_few_shared_inner_ranks() {
        for n in [8, 16, 17, 64, 255] {
            let both = (0..n).filter(|&r| !btree(n, r).children.is_empty() && !dtree(n, r, 1).children.is_empty());
            assert!(both.count() <= 2, "n={n}: inner in both trees");
        }
    }
}
