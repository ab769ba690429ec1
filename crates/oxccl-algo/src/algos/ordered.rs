//! Reductions in the canonical order ([`crate::canon`]) for any number of
//! ranks, over plain messages: the algorithm the deterministic mode runs
//! where nothing faster is proven canonical.
//!
//! Each block of the result has an owner (block `j`: rank `j`; for
//! all-reduce and reduce the blocks are sized by [`weighted`], which cuts
//! even blocks for an even rank count). Every rank sends its piece of block `j` to rank
//! `j`, which reduces the `n` pieces in the canonical tree as they come,
//! keeping the subtrees it has not finished in scratch; then the owners
//! send the finished blocks to everyone (all-reduce), or to the root
//! (reduce). With even blocks every rank sends and receives `(n-1)/n · S`
//! per half, as the ring does, in two rounds of `n-1` messages instead of
//! `n-1` rounds of one. Blocks are cut into pipeline chunks: chunk `c` of
//! every block goes out before chunk `c + 1`.
//!
//! [`Tree`] writes the canonical evaluation of one block from leaves that
//! are local slices or messages (a one-sided leaf would be one more arm).

use super::BuildOptions;
use super::direct::peers;
use crate::canon::split;
use crate::collective::{Collective, part};
use crate::ir::{Program, Slice, Step};

/// Where a leaf of the tree (one rank's contribution) comes from.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Leaf {
    /// A slice of the rank's own buffers.
    Local(Slice),
    /// The next message from this peer.
    Msg(usize),
}

/// Writes the canonical reduction of one block into a rank's channel 0.
pub(crate) struct Tree<'a> {
    pub p: &'a mut Program,
    pub rank: usize,
    /// Scratch slots of `len` elements start here.
    pub scratch_at: usize,
}

impl Tree<'_> {
    /// `out = canon(leaves)`: the leaves are taken in rank order, and
    /// `out` is written only by the last step (so it may alias a local
    /// leaf, as in place). Uses scratch slots past `scratch_at`.
    pub(crate) fn reduce(&mut self, leaves: &[Leaf], out: Slice) {
        if out.len > 0 && !leaves.is_empty() {
            self.eval(leaves, 0, leaves.len(), out, 0);
        }
    }

    fn slot(&mut self, d: usize, len: usize) -> Slice {
        let s = Slice::scratch(self.scratch_at + d * len, len);
        self.p.need_scratch(self.rank, s.end());
        s
    }

    fn push(&mut self, step: Step) {
        self.p.push(self.rank, 0, step);
    }

    /// `dst = leaf` (a copy or a receive).
    fn load(&mut self, leaf: Leaf, dst: Slice) {
        self.push(match leaf {
            Leaf::Local(src) => Step::Copy { src, dst },
            Leaf::Msg(peer) => Step::Recv { peer, dst },
        });
    }

    /// `dst = acc ⊕ leaf`.
    fn add(&mut self, acc: Slice, leaf: Leaf, dst: Slice) {
        self.push(match leaf {
            Leaf::Local(src) => Step::Reduce { srcs: vec![acc, src], dst },
            Leaf::Msg(peer) => Step::RecvReduce { peer, src: acc, dst },
        });
    }

    fn eval(&mut self, leaves: &[Leaf], l: usize, r: usize, out: Slice, d: usize) {
        let len = out.len;
        if r - l == 1 {
            return self.load(leaves[l], out);
        }
        if r - l == 2 {
            return match (leaves[l], leaves[l + 1]) {
                (Leaf::Local(a), b) => self.add(a, b, out),
                (a, Leaf::Local(b)) => self.add(b, a, out),
                (a, b) => {
                    let t = self.slot(d, len);
                    self.load(a, t);
                    self.add(t, b, out);
                }
            };
        }
        let m = split(l, r);
        let left = self.slot(d, len);
        self.eval(leaves, l, m, left, d + 1);
        if r - m == 1 {
            return self.add(left, leaves[m], out);
        }
        let right = self.slot(d + 1, len);
        self.eval(leaves, m, r, right, d + 2);
        self.push(Step::Reduce { srcs: vec![left, right], dst: out });
    }
}

/// The shape of one call: the blocks, and into how many pipeline chunks
/// each is cut.
struct Shape {
    n: usize,
    chunks: usize,
    /// Input offset and length of each block.
    blocks: Vec<(usize, usize)>,
}

impl Shape {
    fn chunk(&self, j: usize, c: usize) -> (usize, usize) {
        let (off, len) = self.blocks[j];
        let (o, l) = part(len, self.chunks, c);
        (off + o, l)
    }

    /// The longest chunk of any block (the first chunk of the longest).
    fn widest_chunk(&self) -> usize {
        self.blocks.iter().map(|b| part(b.1, self.chunks, 0).1).max().unwrap_or(0)
    }
}

/// The canonical reduction of block `r`'s chunk `c` at rank `r`, its
/// pieces sent to their owners first.
fn scatter_chunk(p: &mut Program, s: &Shape, r: usize, c: usize, out: Slice, scratch_at: usize) {
    for q in peers(r, s.n) {
        let (off, len) = s.chunk(q, c);
        if len > 0 {
            p.push(r, 0, Step::Send { peer: q, src: Slice::input(off, len) });
        }
    }
    let (off, len) = s.chunk(r, c);
    let leaves: Vec<Leaf> =
        (0..s.n).map(|j| if j == r { Leaf::Local(Slice::input(off, len)) } else { Leaf::Msg(j) }).collect();
    Tree { p, rank: r, scratch_at }.reduce(&leaves, out);
}

/// Memory passes rank `r` makes to reduce one element of its block in the
/// canonical tree over `n`: one per node, plus a copy for each node whose
/// children are two other ranks' pieces (one is staged in scratch).
fn passes(n: usize, r: usize) -> usize {
    fn pairs(l: usize, rr: usize, r: usize) -> usize {
        match rr - l {
            1 => 0,
            2 => usize::from(r != l && r != l + 1),
            _ => {
                let m = split(l, rr);
                pairs(l, m, r) + pairs(m, rr, r)
            }
        }
    }
    n.saturating_sub(1) + pairs(0, n.max(1), r)
}

/// Rank `j`'s block of `count` elements (offset, length) in the ordered
/// all-reduce and reduce: sizes inversely proportional to
/// [`passes`], so that every owner reduces for about as long (on 3 ranks
/// rank 2 stages one piece per element that ranks 0 and 1 reduce at once:
/// its block is 2/8 of the buffer, theirs 3/8).
pub fn weighted(count: usize, n: usize, j: usize) -> (usize, usize) {
    weighted_all(count, n)[j]
}

/// Every rank's block of [`weighted`].
fn weighted_all(count: usize, n: usize) -> Vec<(usize, usize)> {
    let w: Vec<u128> = (0..n).map(|r| 720_720 / passes(n, r).max(1) as u128).collect();
    let total: u128 = w.iter().sum();
    let mut at = vec![0usize; n + 1];
    let mut acc = 0u128;
    for k in 0..n {
        acc += w[k];
        at[k + 1] = (count as u128 * acc / total) as usize;
    }
    (0..n).map(|k| (at[k], at[k + 1] - at[k])).collect()
}

fn start(p: &mut Program, c: Collective, o: &BuildOptions, blocks: Vec<(usize, usize)>) -> Shape {
    p.reset("ordered", c);
    p.in_place = true;
    let n = c.nranks;
    let widest = blocks.iter().map(|b| b.1).max().unwrap_or(0);
    Shape { n, chunks: o.chunking(widest, c.dtype.size()), blocks }
}

/// All-reduce: canonical reduce-scatter of the [`weighted`] blocks, then every
/// owner sends its block to everyone.
pub(crate) fn all_reduce(p: &mut Program, c: Collective, o: &BuildOptions) {
    let (n, count) = (c.nranks, c.count);
    let s = start(p, c, o, weighted_all(count, n));
    for r in 0..n {
        for k in 0..s.chunks {
            let (off, len) = s.chunk(r, k);
            scatter_chunk(p, &s, r, k, Slice::output(off, len), 0);
            if len > 0 {
                for q in peers(r, n) {
                    p.push(r, 0, Step::Send { peer: q, src: Slice::output(off, len) });
                }
            }
            for q in peers(r, n) {
                let (off, len) = s.chunk(q, k);
                if len > 0 {
                    p.push(r, 0, Step::Recv { peer: q, dst: Slice::output(off, len) });
                }
            }
        }
    }
}

/// Reduce-scatter: rank `j`'s output is the canonical reduction of every
/// rank's input block `j`.
pub(crate) fn reduce_scatter(p: &mut Program, c: Collective, o: &BuildOptions) {
    let cnt = c.count;
    let s = start(p, c, o, (0..c.nranks).map(|j| (j * cnt, cnt)).collect());
    for r in 0..c.nranks {
        for k in 0..s.chunks {
            let (_, len) = s.chunk(r, k);
            let (at, _) = part(cnt, s.chunks, k);
            scatter_chunk(p, &s, r, k, Slice::output(at, len), 0);
        }
    }
}

/// Reduce: canonical reduce-scatter of the [`weighted`] blocks, then every
/// owner sends its block to the root (the others' blocks wait in
/// scratch, before the tree's slots).
pub(crate) fn reduce(p: &mut Program, c: Collective, o: &BuildOptions) {
    let (n, count, root) = (c.nranks, c.count, c.root);
    let s = start(p, c, o, weighted_all(count, n));
    let held = s.widest_chunk();
    for r in 0..n {
        for k in 0..s.chunks {
            let (off, len) = s.chunk(r, k);
            if r == root {
                scatter_chunk(p, &s, r, k, Slice::output(off, len), 0);
                for q in peers(r, n) {
                    let (off, len) = s.chunk(q, k);
                    if len > 0 {
                        p.push(r, 0, Step::Recv { peer: q, dst: Slice::output(off, len) });
                    }
                }
            } else {
                let mine = Slice::scratch(0, len);
                p.need_scratch(r, mine.end());
                scatter_chunk(p, &s, r, k, mine, held);
                if len > 0 {
                    p.push(r, 0, Step::Send { peer: root, src: mine });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_that_stage_get_smaller_blocks() {
        assert_eq!((passes(3, 0), passes(3, 1), passes(3, 2)), (2, 2, 3));
        assert!((0..4).all(|r| passes(4, r) == 4) && (0..6).all(|r| passes(6, r) == 7));
        assert_eq!((passes(5, 3), passes(5, 4), passes(1, 0)), (5, 6, 0));
        assert_eq!((0..3).map(|j| weighted(800, 3, j)).collect::<Vec<_>>(), [(0, 300), (300, 300), (600, 200)]);
        for (count, n) in [(0, 1), (1, 3), (7, 5), (1_000_003, 7), (10, 16)] {
            let blocks: Vec<_> = (0..n).map(|j| weighted(count, n, j)).collect();
            assert_eq!(blocks.iter().map(|b| b.1).sum::<usize>(), count);
            assert!(blocks.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0));
        }
        assert_eq!(weighted(100, 4, 1), part(100, 4, 1), "no staging: even blocks");
    }
}
