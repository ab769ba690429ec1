//! Each algorithm's cost model: its closed form per collective, from the
//! collective's [`Terms`]. The algorithm table
//! ([`AlgoSpec::cost`](crate::algos::AlgoSpec::cost)) points here; every
//! collective an entry lists has a `Some` (tests/algo/table.rs checks it).

use super::{
    Terms, direct_all_gather, direct_from_root, direct_gather, direct_reduce, direct_reduce_scatter,
    doubling_all_reduce, linear_all_to_all, linear_gather, linear_scatter, log2_ceil, nf, one_shot_all_reduce,
    pairwise_all_to_all, pipelined_rooted, rhd_all_reduce, ring_all_gather, ring_all_reduce, ring_reduce_scatter,
    tree_all_reduce, two_shot_all_reduce,
};
use crate::collective::CollKind::{self, *};

/// Ring; broadcast and reduce as a pipelined chain of depth `n-1`.
pub fn ring(kind: CollKind, t: &Terms) -> Option<f64> {
    let (n, s, link, g) = (t.nranks, t.bytes, t.link, t.gamma);
    Some(match kind {
        AllReduce => ring_all_reduce(n, s, link, g),
        ReduceScatter => ring_reduce_scatter(n, s, link, g),
        AllGather => ring_all_gather(n, s, link),
        Broadcast | Reduce => pipelined_rooted(n.saturating_sub(1), s, link, g),
        _ => return None,
    })
}

/// Double binary tree; broadcast and reduce down or up a binary tree.
pub fn tree(kind: CollKind, t: &Terms) -> Option<f64> {
    let (n, s, link, g) = (t.nranks, t.bytes, t.link, t.gamma);
    Some(match kind {
        AllReduce => tree_all_reduce(n, s, link, g),
        Broadcast | Reduce => pipelined_rooted(log2_ceil(n) as usize, s, link, g),
        _ => return None,
    })
}

/// Recursive halving/doubling: the ring's bandwidth terms with `⌈log2 n⌉`
/// latencies.
pub fn rhd(kind: CollKind, t: &Terms) -> Option<f64> {
    let (n, s, link, g) = (t.nranks, t.bytes, t.link, t.gamma);
    Some(match kind {
        AllReduce => rhd_all_reduce(n, s, link, g),
        ReduceScatter => ring_reduce_scatter(n, s, link, g).max(log2_ceil(n) * link.lat),
        AllGather => ring_all_gather(n, s, link) - nf(n.saturating_sub(1)) * link.lat + log2_ceil(n) * link.lat,
        _ => return None,
    })
}

/// Recursive doubling of whole buffers (all-reduce).
pub fn doubling(kind: CollKind, t: &Terms) -> Option<f64> {
    (kind == AllReduce).then(|| doubling_all_reduce(t.nranks, t.bytes, t.link, t.gamma))
}

/// One-shot all-reduce.
pub fn one_shot(kind: CollKind, t: &Terms) -> Option<f64> {
    (kind == AllReduce).then(|| one_shot_all_reduce(t.nranks, t.bytes, t.link, t.gamma, t.copy))
}

/// Two-shot all-reduce.
pub fn two_shot(kind: CollKind, t: &Terms) -> Option<f64> {
    (kind == AllReduce).then(|| two_shot_all_reduce(t.nranks, t.bytes, t.link, t.gamma, t.copy))
}

/// Direct one-sided access; send/recv is one message (a local copy on
/// one rank or for nothing to send).
pub fn direct(kind: CollKind, t: &Terms) -> Option<f64> {
    let (n, s, link, g, k) = (t.nranks, t.bytes, t.link, t.gamma, t.copy);
    Some(match kind {
        ReduceScatter => direct_reduce_scatter(n, s, link, g, k),
        AllGather | AllToAll => direct_all_gather(n, s, link, k),
        Broadcast => direct_from_root(n, s, false, link, k),
        Scatter => direct_from_root(n, s, true, link, k),
        Gather => direct_gather(n, s, link, k),
        Reduce => direct_reduce(n, t.root, s, link, g, k),
        SendRecv if n > 1 && s > 0 => link.time(nf(s)),
        SendRecv => nf(s) * k,
        _ => return None,
    })
}

/// Pairwise all-to-all.
pub fn pairwise(kind: CollKind, t: &Terms) -> Option<f64> {
    (kind == AllToAll).then(|| pairwise_all_to_all(t.nranks, t.bytes, t.link, t.copy))
}

/// Linear gather, scatter and all-to-all.
pub fn linear(kind: CollKind, t: &Terms) -> Option<f64> {
    let (n, s, link, k) = (t.nranks, t.bytes, t.link, t.copy);
    match kind {
        Gather => Some(linear_gather(n, s, link, k)),
        Scatter => Some(linear_scatter(n, s, link, k)),
        AllToAll => Some(linear_all_to_all(n, s, link, k)),
        _ => None,
    }
}

/// Hierarchical: the rings inside hosts at the intra-host link, the `L`
/// rings across hosts (one per local index) sharing each host's NICs, so
/// each at `min(nics, L)/L` of one NIC's bandwidth; reduce-scatter and all-gather run the
/// host's ring once per host (`(H-1)(L-1)` more intra-host latencies).
/// Where the topology has one host or one rank per host, the ring's
/// (pairwise exchange's for all-to-all).
pub fn hier(kind: CollKind, t: &Terms) -> Option<f64> {
    let (h, l, s, g) = (t.hosts, t.per_host, t.bytes, t.gamma);
    if h <= 1 || l <= 1 || h * l != t.nranks {
        return if kind == AllToAll { pairwise(kind, t) } else { ring(kind, t) };
    }
    let rail = super::Link::new(t.inter.bw * nf(t.nics.clamp(1, l)) / nf(l), t.inter.lat);
    let rounds = nf(h - 1) * nf(l - 1) * t.intra.lat;
    Some(match kind {
        AllReduce => {
            ring_reduce_scatter(l, s, t.intra, g) + ring_all_reduce(h, s / l, rail, g) + ring_all_gather(l, s, t.intra)
        }
        ReduceScatter => ring_reduce_scatter(l, s, t.intra, g) + rounds + ring_reduce_scatter(h, s / l, rail, g),
        AllGather => ring_all_gather(h, s / l, rail) + ring_all_gather(l, s, t.intra) + rounds,
        // Pairwise inside the host (H blocks of S/n per peer), then H-1
        // messages of L blocks across hosts, the host's L ranks sharing
        // its NICs, plus copying every block twice.
        AllToAll => {
            let intra = nf(l - 1) * (nf(h) * t.intra.lat + nf(h) * nf(s) / nf(t.nranks) / t.intra.bw);
            let inter = nf(h - 1) * (rail.lat + nf(s) / nf(h) / rail.bw);
            intra + inter + 2.0 * nf(s) * t.copy
        }
        _ => return None,
    })
}

/// Bruck: `⌈log2 n⌉` latencies, the ring's bandwidth term, and copying the
/// blocks into rotated scratch and back (`S(n+1)/n` locally).
pub fn bruck(kind: CollKind, t: &Terms) -> Option<f64> {
    let (n, s, link, g, k) = (t.nranks, t.bytes, t.link, t.gamma, t.copy);
    if n <= 1 {
        return Some(nf(s) * k);
    }
    let bw = nf(n - 1) / nf(n) * nf(s) / link.bw + log2_ceil(n) * link.lat + nf(s) * (nf(n) + 1.0) / nf(n) * k;
    Some(match kind {
        AllGather => bw,
        ReduceScatter => bw + nf(n - 1) / nf(n) * nf(s) * g,
        _ => return None,
    })
}

/// The canonical-order reductions: the ring's bandwidth and latency terms
/// (two rounds of `n-1` messages, each rank's link carrying `(n-1)/n · S`
/// per half), plus copying about half the pieces into scratch before they
/// are reduced.
pub fn ordered(kind: CollKind, t: &Terms) -> Option<f64> {
    let (n, s, link, g, k) = (t.nranks, t.bytes, t.link, t.gamma, t.copy);
    let staged = nf(n.saturating_sub(1)) / nf(n.max(1)) * nf(s) * k / 2.0;
    Some(match kind {
        AllReduce | Reduce => ring_all_reduce(n, s, link, g) + staged,
        ReduceScatter => ring_reduce_scatter(n, s, link, g) + staged,
        _ => return None,
    })
}
