//! Volume formulas shared by the test suites.

use oxccl_algo::algos::{Algorithm, dtree};
use oxccl_algo::collective::part;
use oxccl_algo::{CollKind, Collective};

/// The bytes each rank must send, where the algorithm fixes them exactly.
pub fn expected_sent(algo: Algorithm, c: &Collective) -> Option<Vec<u64>> {
    let algo = flat(algo, c.kind);
    let (n, e) = (c.nranks, c.dtype.size() as u64);
    let s = c.count as u64 * e; // bytes of a rank's buffer (block for RS/AG/A2A)
    let nn = n as u64;
    let v = match (algo, c.kind) {
        (Algorithm::Ring, CollKind::AllReduce) | (Algorithm::TwoShot, _) if c.count.is_multiple_of(n) => {
            vec![2 * (nn - 1) * s / nn; n]
        }
        // Blocks are even where every owner pairs its piece with a peer's.
        (Algorithm::Ordered, CollKind::AllReduce) if c.count.is_multiple_of(n) && n % 2 == 0 => {
            vec![2 * (nn - 1) * s / nn; n]
        }
        (
            Algorithm::Ring | Algorithm::Direct | Algorithm::Rhd | Algorithm::Ordered | Algorithm::Bruck,
            CollKind::ReduceScatter | CollKind::AllGather,
        ) if algo != Algorithm::Rhd || n.is_power_of_two() => {
            vec![(nn - 1) * s; n]
        }
        (Algorithm::Rhd, CollKind::AllReduce) if n.is_power_of_two() && c.count.is_multiple_of(n) => {
            vec![2 * (nn - 1) * s / nn; n]
        }
        (Algorithm::Doubling, CollKind::AllReduce) if n.is_power_of_two() => {
            vec![u64::from(n.trailing_zeros()) * s; n]
        }
        (Algorithm::Pairwise | Algorithm::Direct | Algorithm::Linear, CollKind::AllToAll) => vec![(nn - 1) * s; n],
        (Algorithm::OneShot, _) => vec![(nn - 1) * s; n],
        (Algorithm::Tree, CollKind::AllReduce) if n > 1 => (0..n)
            .map(|r| {
                (0..2)
                    .map(|t| {
                        let l = dtree(n, r, t);
                        let links = l.children.len() as u64 + u64::from(l.parent.is_some());
                        part(c.count, 2, t).1 as u64 * e * links
                    })
                    .sum()
            })
            .collect(),
        (Algorithm::Ring, CollKind::Broadcast) => {
            (0..n).map(|r| if (r + 1) % n == c.root || n == 1 { 0 } else { s }).collect()
        }
        (Algorithm::Ring, CollKind::Reduce) => (0..n).map(|r| if r == c.root { 0 } else { s }).collect(),
        (Algorithm::Linear | Algorithm::Direct, CollKind::Gather) => {
            (0..n).map(|r| if r == c.root { 0 } else { s }).collect()
        }
        (Algorithm::Linear | Algorithm::Direct, CollKind::Scatter) => {
            (0..n).map(|r| if r == c.root { (nn - 1) * s } else { 0 }).collect()
        }
        // The root's data is read by the others; the others' data by the root.
        (Algorithm::Direct, CollKind::Broadcast) => {
            (0..n).map(|r| if r == c.root { (nn - 1) * s } else { 0 }).collect()
        }
        (Algorithm::Direct, CollKind::Reduce) => (0..n).map(|r| if r == c.root { 0 } else { s }).collect(),
        (Algorithm::Direct, CollKind::SendRecv) => vec![if n > 1 { s } else { 0 }; n],
        _ => return None,
    };
    Some(v)
}

/// Bytes all ranks send together (holds for every count).
pub fn expected_total(algo: Algorithm, c: &Collective) -> u64 {
    let algo = flat(algo, c.kind);
    let (n, e) = (c.nranks as u64, c.dtype.size() as u64);
    let s = c.count as u64 * e;
    match (algo, c.kind) {
        (Algorithm::Rhd, CollKind::AllReduce) => {
            let p = 1u64 << (63 - n.leading_zeros());
            2 * (p - 1) * s + 2 * (n - p) * s
        }
        (Algorithm::Rhd, CollKind::ReduceScatter) => {
            let p = 1u64 << (63 - n.leading_zeros());
            // Virtual ranks exchange (p-1)·(n·s); a folded pair moves the
            // whole input once and one block back.
            (p - 1) * n * s + (n - p) * (n * s + s)
        }
        (Algorithm::Rhd, CollKind::AllGather) => {
            let p = 1u64 << (63 - n.leading_zeros());
            (p - 1) * n * s + (n - p) * (s + (n - 1) * s)
        }
        (Algorithm::Doubling, CollKind::AllReduce) => {
            let p = 1u64 << (63 - n.leading_zeros());
            p * u64::from(p.trailing_zeros()) * s + 2 * (n - p) * s
        }
        (_, CollKind::AllReduce) if algo == Algorithm::OneShot => n * (n - 1) * s,
        // Every block to its owner, then every other owner's block to the root.
        (Algorithm::Ordered, CollKind::Reduce) => {
            let root_block = oxccl_algo::algos::ordered_block(c.count, c.nranks, c.root).1 as u64 * e;
            (n - 1) * s + s - root_block
        }
        (_, CollKind::AllReduce) => 2 * (n - 1) * s,
        (_, CollKind::ReduceScatter | CollKind::AllGather | CollKind::AllToAll) => n * (n - 1) * s,
        (_, CollKind::Broadcast | CollKind::Reduce | CollKind::Gather | CollKind::Scatter) => (n - 1) * s,
        (_, CollKind::SendRecv) => {
            if n > 1 {
                n * s
            } else {
                0
            }
        }
    }
}

/// The algorithm a build without a placement (every rank on one host)
/// runs: `hier` is the ring there (pairwise exchange for all-to-all).
fn flat(algo: Algorithm, kind: CollKind) -> Algorithm {
    match (algo, kind) {
        (Algorithm::Hier, CollKind::AllToAll) => Algorithm::Pairwise,
        (Algorithm::Hier, _) => Algorithm::Ring,
        _ => algo,
    }
}
