//! What the transports count is what the verifier proves: for every
//! algorithm × collective it implements, on every transport, the bytes
//! `Communicator::stats()` counts for one call equal, rank by rank, the
//! bytes the verifier returns for that call's program.
//!
//! Counting conventions (see `PeerStats`): messages are counted at both
//! ends; one-sided traffic at the rank that starts it (`put`, `got`), so a
//! rank's bytes sent are its messages sent, its puts, and what its peers
//! got from it; its bytes received the converse. The verifier counts the
//! same way (`Report::sent_bytes`).

use oxccl::{CollKind, Communicator, Config, DataType, Kind, PeerStats, ReduceOp};
use oxccl_algo::algos::{Algorithm, BuildOptions, build};
use oxccl_algo::collective::Collective;
use oxccl_algo::verify::verify;
use oxccl_e2e::run_case;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// One rank's counters per peer: (sent, recv, put, got).
type Counts = BTreeMap<usize, (u64, u64, u64, u64)>;

fn counts(s: &[PeerStats]) -> Counts {
    s.iter().map(|p| (p.peer, (p.sent, p.recv, p.put, p.got))).collect()
}

fn delta(before: &Counts, after: &Counts) -> Counts {
    after
        .iter()
        .map(|(&p, a)| {
            let b = before.get(&p).copied().unwrap_or_default();
            (p, (a.0 - b.0, a.1 - b.1, a.2 - b.2, a.3 - b.3))
        })
        .collect()
}

/// Per rank (sent, received) as the verifier counts them, from every
/// rank's per-peer deltas.
fn per_rank(d: &[Counts]) -> Vec<(u64, u64)> {
    let n = d.len();
    (0..n)
        .map(|r| {
            let (mut sent, mut recv) = (0, 0);
            for &(s, rv, put, got) in d[r].values() {
                sent += s + put;
                recv += rv + got;
            }
            // What q read from or wrote into r is counted at q.
            for (q, dq) in d.iter().enumerate() {
                if let Some(&(_, _, put, got)) = dq.get(&r)
                    && q != r
                {
                    sent += got;
                    recv += put;
                }
            }
            (sent, recv)
        })
        .collect()
}

fn check(kind: Kind, n: usize, algo: Algorithm, coll_kind: CollKind) {
    let (count, root, dtype) = (1001, 1 % n, DataType::Float32);
    let coll = Collective { kind: coll_kind, nranks: n, count, root, dtype };
    let report = verify(&build(algo, &coll, &BuildOptions::default()).unwrap()).unwrap();
    let filter = format!("{}:{algo}", coll_kind.name().replace('_', ""));
    let cfg = Config { algo: Some(filter), buffsize: Some(64 << 10), ..oxccl_e2e::config(Some(kind)) };
    let comms = Communicator::init_threads_with(n, cfg).unwrap();
    let deltas = Mutex::new(vec![Counts::new(); n]);
    std::thread::scope(|s| {
        for c in &comms {
            let deltas = &deltas;
            s.spawn(move || {
                let before = counts(&c.stats());
                run_case(c, coll_kind, dtype, count, ReduceOp::Sum, root, false)
                    .unwrap_or_else(|e| panic!("{kind} {algo}: {e}"));
                deltas.lock().unwrap()[c.rank()] = delta(&before, &counts(&c.stats()));
            });
        }
    });
    let got = per_rank(&deltas.into_inner().unwrap());
    let want: Vec<(u64, u64)> = report.sent_bytes.iter().copied().zip(report.recv_bytes.iter().copied()).collect();
    assert_eq!(got, want, "{kind}, {n} ranks, {algo} {coll_kind} of {count} floats: counted (sent, received) per rank");
}

fn every_algorithm(kind: Kind) {
    let mut pairs = 0;
    for n in [3, 4] {
        for algo in Algorithm::ALL {
            for coll_kind in algo.kinds().iter().copied().filter(|k| *k != CollKind::SendRecv) {
                check(kind, n, algo, coll_kind);
                pairs += 1;
            }
        }
    }
    assert!(pairs >= 40, "{pairs} (algorithm, collective) pairs");
}

#[test]
fn counted_bytes_equal_the_verifiers_over_mem() {
    every_algorithm(Kind::Mem);
}

#[test]
fn counted_bytes_equal_the_verifiers_over_shm() {
    every_algorithm(Kind::Shm);
}

#[test]
fn counted_bytes_equal_the_verifiers_over_tcp() {
    every_algorithm(Kind::Tcp);
}
