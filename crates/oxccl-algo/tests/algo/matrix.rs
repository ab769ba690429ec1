//! Every algorithm × its collectives × ranks 1..=33, 64, 128, 256 × counts
//! {0, 1, 2, 7, 1000, 1_000_003} × every root, verified out of place and
//! (where the algorithm claims it) in place, with per-rank volumes asserted
//! against each algorithm's formula.

use crate::common;

use common::{expected_sent, expected_total};
use oxccl_algo::algos::{Algorithm, BuildOptions, build};
use oxccl_algo::verify::{Report, VerifyOptions, verify, verify_with};
use oxccl_algo::{CollKind, Collective};

const COUNTS: [usize; 6] = [0, 1, 2, 7, 1000, 1_000_003];

/// The algorithms that reduce in the canonical order at every rank count
/// (others do at some: the tuner asks the verifier).
const CANONICAL: [Algorithm; 1] = [Algorithm::Ordered];

fn ranks() -> impl Iterator<Item = usize> {
    (1..=33).chain([64, 128, 256])
}

fn check(algo: Algorithm, kind: CollKind) {
    let opts = BuildOptions::default();
    let mut runs = 0;
    for n in ranks() {
        for count in COUNTS {
            // The ordered reduce has n² steps per root: every root up to
            // 33 ranks, three beyond.
            let roots: Vec<usize> = match kind.is_rooted() {
                false => vec![0],
                true if algo == Algorithm::Ordered && n > 33 => vec![0, n / 2, n - 1],
                true => (0..n).collect(),
            };
            for root in roots {
                let c = Collective::new(kind, n, count).with_root(root);
                let p = build(algo, &c, &opts).unwrap();
                let report: Report = verify(&p).unwrap_or_else(|e| panic!("{algo} {c}: {e}"));
                assert_eq!(report.total_sent(), expected_total(algo, &c), "{algo} {c}: total bytes sent");
                if let Some(want) = expected_sent(algo, &c) {
                    assert_eq!(report.sent_bytes, want, "{algo} {c}: bytes sent per rank");
                }
                if CANONICAL.contains(&algo) {
                    assert_eq!(report.departure, None, "{algo} {c} reduces in the canonical order");
                }
                if !p.in_place && n > 1 && count > 0 {
                    let r = verify_with(&p, &VerifyOptions { in_place: true, ..Default::default() });
                    assert!(r.is_err(), "{algo} {c} says it is not in-place safe, but verifies in place");
                }
                runs += 1;
            }
        }
    }
    assert!(runs >= 36 * COUNTS.len());
}

macro_rules! matrix {
    ($($name:ident: $algo:ident $kind:ident;)*) => {$(
        #[test]
        fn $name() {
            check(Algorithm::$algo, CollKind::$kind);
        }
    )*};
}

matrix! {
    ring_all_reduce: Ring AllReduce;
    ring_reduce_scatter: Ring ReduceScatter;
    ring_all_gather: Ring AllGather;
    ring_broadcast: Ring Broadcast;
    ring_reduce: Ring Reduce;
    tree_all_reduce: Tree AllReduce;
    tree_broadcast: Tree Broadcast;
    tree_reduce: Tree Reduce;
    rhd_all_reduce: Rhd AllReduce;
    rhd_reduce_scatter: Rhd ReduceScatter;
    rhd_all_gather: Rhd AllGather;
    doubling_all_reduce: Doubling AllReduce;
    oneshot_all_reduce: OneShot AllReduce;
    twoshot_all_reduce: TwoShot AllReduce;
    direct_reduce_scatter: Direct ReduceScatter;
    direct_all_gather: Direct AllGather;
    direct_all_to_all: Direct AllToAll;
    direct_broadcast: Direct Broadcast;
    direct_reduce: Direct Reduce;
    direct_gather: Direct Gather;
    direct_scatter: Direct Scatter;
    direct_send_recv: Direct SendRecv;
    pairwise_all_to_all: Pairwise AllToAll;
    linear_gather: Linear Gather;
    linear_scatter: Linear Scatter;
    linear_all_to_all: Linear AllToAll;
    hier_all_reduce: Hier AllReduce;
    hier_reduce_scatter: Hier ReduceScatter;
    hier_all_gather: Hier AllGather;
    hier_all_to_all: Hier AllToAll;
    bruck_reduce_scatter: Bruck ReduceScatter;
    bruck_all_gather: Bruck AllGather;
    ordered_all_reduce: Ordered AllReduce;
    ordered_reduce_scatter: Ordered ReduceScatter;
    ordered_reduce: Ordered Reduce;
}

#[test]
fn every_algorithm_kind_pair_is_in_the_matrix() {
    let src = include_str!("matrix.rs");
    for a in Algorithm::ALL {
        for k in a.kinds() {
            let line = format!("{:?} {:?};", a, k);
            assert!(src.contains(&line), "matrix misses {line}");
        }
    }
}
