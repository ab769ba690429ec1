//! Every algorithm × its collectives × ranks 1..=33, 64, 128, 256 × counts
//! {0, 1, 2, 7, 1000, 1_000_003} × every root, verified out of place and
//! (where the algorithm claims it) in place, with per-rank volumes asserted
//! against each algorithm's formula.

use oxccl_algo::algos::{Algorithm, BuildOptions, build, dtree};
use oxccl_algo::collective::part;
use oxccl_algo::verify::{Report, VerifyOptions, verify, verify_with};
use oxccl_algo::{CollKind, Collective};

const COUNTS: [usize; 6] = [0, 1, 2, 7, 1000, 1_000_003];

fn ranks() -> impl Iterator<Item = usize> {
    (1..=33).chain([64, 128, 256])
}

/// The bytes each rank must send, where the algorithm fixes them exactly.
fn expected_sent(algo: Algorithm, c: &Collective) -> Option<Vec<u64>> {
    let (n, e) = (c.nranks, c.dtype.size() as u64);
    let s = c.count as u64 * e; // bytes of a rank's buffer (block for RS/AG/A2A)
    let nn = n as u64;
    let v = match (algo, c.kind) {
        (Algorithm::Ring, CollKind::AllReduce) | (Algorithm::TwoShot, _) if c.count.is_multiple_of(n) => {
            vec![2 * (nn - 1) * s / nn; n]
        }
        (Algorithm::Ring | Algorithm::Direct | Algorithm::Rhd, CollKind::ReduceScatter | CollKind::AllGather)
            if algo != Algorithm::Rhd || n.is_power_of_two() =>
        {
            vec![(nn - 1) * s; n]
        }
        (Algorithm::Rhd, CollKind::AllReduce) if n.is_power_of_two() && c.count.is_multiple_of(n) => {
            vec![2 * (nn - 1) * s / nn; n]
        }
        (Algorithm::Pairwise | Algorithm::Direct, CollKind::AllToAll) => vec![(nn - 1) * s; n],
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
        (Algorithm::Linear, CollKind::Gather) => (0..n).map(|r| if r == c.root { 0 } else { s }).collect(),
        (Algorithm::Linear, CollKind::Scatter) => (0..n).map(|r| if r == c.root { (nn - 1) * s } else { 0 }).collect(),
        (Algorithm::Direct, CollKind::SendRecv) => vec![if n > 1 { s } else { 0 }; n],
        _ => return None,
    };
    Some(v)
}

/// Bytes all ranks send together (holds for every count).
fn expected_total(algo: Algorithm, c: &Collective) -> u64 {
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
        (_, CollKind::AllReduce) if algo == Algorithm::OneShot => n * (n - 1) * s,
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

fn check(algo: Algorithm, kind: CollKind) {
    let opts = BuildOptions::default();
    let mut runs = 0;
    for n in ranks() {
        for count in COUNTS {
            let roots: Vec<usize> = if kind.is_rooted() { (0..n).collect() } else { vec![0] };
            for root in roots {
                let c = Collective::new(kind, n, count).with_root(root);
                let p = build(algo, &c, &opts).unwrap();
                let report: Report = verify(&p).unwrap_or_else(|e| panic!("{algo} {c}: {e}"));
                assert_eq!(report.total_sent(), report.recv_bytes.iter().sum::<u64>());
                assert_eq!(report.total_sent(), expected_total(algo, &c), "{algo} {c}: total bytes sent");
                if let Some(want) = expected_sent(algo, &c) {
                    assert_eq!(report.sent_bytes, want, "{algo} {c}: bytes sent per rank");
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
    oneshot_all_reduce: OneShot AllReduce;
    twoshot_all_reduce: TwoShot AllReduce;
    direct_reduce_scatter: Direct ReduceScatter;
    direct_all_gather: Direct AllGather;
    direct_all_to_all: Direct AllToAll;
    direct_send_recv: Direct SendRecv;
    pairwise_all_to_all: Pairwise AllToAll;
    linear_gather: Linear Gather;
    linear_scatter: Linear Scatter;
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
