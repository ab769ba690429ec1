//! Closed forms of the direct (one-sided) algorithms, the pairwise
//! all-to-all and the linear gather/scatter, as the simulator runs them on
//! one kind of link.
//!
//! Notation: `α` the link's latency, `β = 1/bw`, `γ` seconds per byte
//! reduced, `κ` seconds per byte copied locally (0 when copies are free),
//! `S` the collective's size in bytes ([`Collective::size_bytes`]) and
//! `b = S/n` a rank's block (reduce-scatter, all-gather, all-to-all,
//! gather, scatter). A round of signals costs one `α`. A rank's one-sided
//! reads are issued back to back, so `m` reads of `d` seconds each land at
//! `α + d, α + 2d, …, α + m·d`; a reduction of read data runs when its data
//! has landed and the previous one is done (see [`reads`]). One rank, or a
//! count of 0, costs the local copy (if any) alone.
//!
//! [`Collective::size_bytes`]: crate::Collective::size_bytes

use super::{Link, nf};

/// Seconds from issuing `m` reads of `d` seconds each, back to back over
/// one port with latency `lat`, until the reductions that follow them are
/// done: one reduction of `w` seconds per read (but the first when
/// `first_plain`) plus `tail` local ones after the last read, each waiting
/// for its data and for the one before. `max_i(lat + i·d + (reductions
/// from read i on)·w)`; 0 when there is nothing to do.
pub fn reads(m: usize, d: f64, lat: f64, w: f64, first_plain: bool, tail: usize) -> f64 {
    let reductions_from = |i: usize| nf(m - i + 1 - usize::from(first_plain && i == 1) + tail);
    // Linear in i but for the first read: the extremes and i = 2 suffice.
    [1, 2, m]
        .into_iter()
        .filter(|&i| i >= 1 && i <= m)
        .map(|i| lat + nf(i) * d + reductions_from(i) * w)
        .fold(nf(tail) * w, f64::max)
}

/// One-shot all-reduce: a barrier (`α`), every rank reads and reduces
/// every peer's whole input in rank order `0, 1, …, n-1`, a barrier, a
/// copy of the result (`S·κ`). The common order makes the reads queue:
/// rank `r` first waits for `r-1` others reading rank 0, then reads ranks
/// `1 … r-1`, reduces its own input, and reads the rest. The time is the
/// slowest rank's path, `α + (r-1)·S·β + reads(r) + reads(n-1-r)` (rank 0:
/// its first copy and `n-1` reads), then `α + S·κ`. For large `S` the last
/// rank decides: `3α + (2n-3)·S·β + 2·S·γ + S·κ` when `γ ≤ β`; for small
/// `S` the one before it, `4α + (2n-4)·S·β`. In between, early ranks'
/// later reads also queue behind late ranks' first ones (and slow copies
/// or reductions shift rank 0's reads into the others'), which this
/// leaves out: it never exceeds the simulated time and is exact in both
/// limits; the simulator says up to 15% more up to 9 ranks and 40% up to
/// 64 where `n·S·β` is a few `α` (tests/algo/sim.rs).
pub fn one_shot_all_reduce(n: usize, bytes: usize, link: Link, gamma: f64, copy: f64) -> f64 {
    let s = nf(bytes);
    if n <= 1 || bytes == 0 {
        return s * copy;
    }
    let (a, d, w) = (link.lat, s / link.bw, s * gamma);
    let rank0 = s * copy + reads(n - 1, d, a, w, false, 0);
    let slowest = (1..n)
        .map(|r| nf(r - 1) * d + reads(r, d, a, w, true, 1) + reads(n - 1 - r, d, a, w, false, 0))
        .fold(rank0, f64::max);
    a + slowest + a + s * copy
}

/// Two-shot all-reduce: a barrier, rank `r` reads and reduces block `r`
/// of every peer (the peers in turn from `r+1` on, so no two readers
/// share a port), a barrier, every rank reads the finished blocks, a
/// barrier: `5α + 2(n-1)·b·β + γ-chain`, exactly
/// `3α + reads(n-1 reduced reads of b) + α + (n-1)·b·β + α`, which is
/// `5α + 2(n-1)/n·S·β + S/n·γ` when `γ ≤ β` (the reductions hide behind
/// the reads). Balanced blocks: exact when `n` divides the count.
pub fn two_shot_all_reduce(n: usize, bytes: usize, link: Link, gamma: f64, copy: f64) -> f64 {
    let s = nf(bytes);
    if n <= 1 || bytes == 0 {
        return s * copy;
    }
    let (a, d, w) = (link.lat, s / nf(n) / link.bw, s / nf(n) * gamma);
    a + reads(n - 1, d, a, w, false, 0) + a + (a + nf(n - 1) * d) + a
}

/// Direct reduce-scatter: a barrier, rank `r` reads and reduces block `r`
/// of every peer's input, a barrier: `2α + reads(n-1 reduced reads of b)`,
/// i.e. `3α + (n-1)/n·S·β + S/n·γ` when `γ ≤ β`.
pub fn direct_reduce_scatter(n: usize, bytes: usize, link: Link, gamma: f64, copy: f64) -> f64 {
    let s = nf(bytes);
    if n <= 1 || bytes == 0 {
        return s * copy;
    }
    let (a, d, w) = (link.lat, s / nf(n) / link.bw, s / nf(n) * gamma);
    a + reads(n - 1, d, a, w, false, 0) + a
}

/// Direct all-gather (each rank writes its input into every peer's
/// output) and all-to-all (each rank reads its block from every peer):
/// a local copy of the own block, a barrier, `n-1` transfers of a block
/// back to back, a barrier: `b·κ + 3α + (n-1)/n·S·β`.
pub fn direct_all_gather(n: usize, bytes: usize, link: Link, copy: f64) -> f64 {
    let s = nf(bytes);
    if n <= 1 || bytes == 0 {
        return s * copy;
    }
    let b = s / nf(n);
    b * copy + 3.0 * link.lat + nf(n - 1) * b / link.bw
}

/// Direct broadcast (`block` false: every rank reads the root's whole
/// input) or scatter (`block` true: its block): the root copies its own
/// part, signals, the `n-1` readers queue at its port, and tell it they
/// are done: `m·κ + 3α + (n-1)·m·β` with `m = S` or `b`.
pub fn direct_from_root(n: usize, bytes: usize, block: bool, link: Link, copy: f64) -> f64 {
    let s = nf(bytes);
    if n <= 1 || bytes == 0 {
        return s * copy;
    }
    let m = if block { s / nf(n) } else { s };
    m * copy + 3.0 * link.lat + nf(n - 1) * m / link.bw
}

/// Direct gather: the others signal the root while it copies its own
/// block; it reads the `n-1` blocks back to back and releases them:
/// `max(α, b·κ) + α + (n-1)·b·β + α`.
pub fn direct_gather(n: usize, bytes: usize, link: Link, copy: f64) -> f64 {
    let s = nf(bytes);
    if n <= 1 || bytes == 0 {
        return s * copy;
    }
    let (a, b) = (link.lat, s / nf(n));
    a.max(b * copy) + a + nf(n - 1) * b / link.bw + a
}

/// Direct reduce: the others signal the root while it copies its input
/// (`S·κ`: to its output at root 0, else to scratch); it reads and
/// reduces every input in rank order, its own joining at its turn with a
/// local reduction, which waits for the reads before it (a second round
/// of reads after it: one more `α` when `0 < root < n-1`); then it
/// releases them: `max(α, S·κ) + reads(ranks before the root) +
/// reads(ranks after it) + α`, i.e. `3α + (n-1)·S·β + S·γ` at root 0
/// when `γ ≤ β`.
pub fn direct_reduce(n: usize, root: usize, bytes: usize, link: Link, gamma: f64, copy: f64) -> f64 {
    let s = nf(bytes);
    if n <= 1 || bytes == 0 {
        return s * copy;
    }
    let (a, d, w) = (link.lat, s / link.bw, s * gamma);
    let root = root.min(n - 1);
    let before = if root == 0 { 0.0 } else { reads(root, d, a, w, true, 1) };
    a.max(s * copy) + before + reads(n - 1 - root, d, a, w, false, 0) + a
}

/// Pairwise all-to-all: a copy of the own block, then `n-1` rounds of
/// one block each way with a different peer: `b·κ + (n-1)·(α + b·β)`.
pub fn pairwise_all_to_all(n: usize, bytes: usize, link: Link, copy: f64) -> f64 {
    let s = nf(bytes);
    if n <= 1 || bytes == 0 {
        return s * copy;
    }
    let b = s / nf(n);
    b * copy + nf(n - 1) * link.time(b)
}

/// Linear all-to-all: a copy of the own block, then the `n-1` blocks
/// sent back to back, each to another rank, in `g` groups whose sends are
/// in flight at once (the receivers of one slot are all different):
/// `b·κ + g·α + (n-1)·b·β`, with `g = ⌈(n-1)/8⌉`: one latency on up to 9
/// ranks, where pairwise exchange pays `n-1`.
pub fn linear_all_to_all(n: usize, bytes: usize, link: Link, copy: f64) -> f64 {
    let s = nf(bytes);
    if n <= 1 || bytes == 0 {
        return s * copy;
    }
    let b = s / nf(n);
    let groups = (n - 1).div_ceil(crate::algos::LINEAR_GROUP);
    b * copy + nf(groups) * link.lat + nf(n - 1) * b / link.bw
}

/// Linear gather: every rank sends its block to the root at once; the
/// blocks queue at the root's port while it copies its own:
/// `max(b·κ, α + (n-1)·b·β)`.
pub fn linear_gather(n: usize, bytes: usize, link: Link, copy: f64) -> f64 {
    let s = nf(bytes);
    if n <= 1 || bytes == 0 {
        return s * copy;
    }
    let b = s / nf(n);
    (b * copy).max(link.lat + nf(n - 1) * b / link.bw)
}

/// Linear scatter: the root sends the `n-1` blocks back to back, then
/// copies its own: `(n-1)·b·β + max(α, b·κ)`.
pub fn linear_scatter(n: usize, bytes: usize, link: Link, copy: f64) -> f64 {
    let s = nf(bytes);
    if n <= 1 || bytes == 0 {
        return s * copy;
    }
    let b = s / nf(n);
    nf(n - 1) * b / link.bw + link.lat.max(b * copy)
}
