//! Ranks whose calls disagree (type, operator, root, collective) without
//! `OXCCL_CHECK`: every rank fails within seconds (or, where its own part
//! agreed with the peers it dealt with, its next call does), and the rank
//! that sees the disagreement names both ranks and what differs (the call
//! signature every collective's messages carry), over every transport.

use oxccl::{CollKind, Communicator, Config, DataType, Kind, ReduceOp, Spec};
use std::time::{Duration, Instant};

/// What one rank calls: kind, type, operator, root, count.
type Call = (CollKind, DataType, ReduceOp, usize, usize);

/// Runs `call(rank)` on 3 threads over `transport`; every rank's error.
fn disagree(transport: Option<Kind>, call: impl Fn(usize) -> Call + Sync) -> Vec<String> {
    let cfg = Config { timeout: Some(Duration::from_secs(30)), transport, ..Config::default() };
    let comms = Communicator::init_threads_with(3, cfg).unwrap();
    let t = Instant::now();
    let errors = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                let call = &call;
                s.spawn(move || {
                    let (kind, dtype, op, root, count) = call(c.rank());
                    let out_count = if kind == CollKind::AllGather { count * 3 } else { count };
                    let send = vec![1u8; count * dtype.size()];
                    let mut recv = vec![0u8; out_count * dtype.size()];
                    match c.collective_bytes(
                        Spec::new(kind, count, dtype).with_op(op).with_root(root),
                        Some(&send),
                        &mut recv,
                    ) {
                        Err(e) => e.to_string(),
                        // Its part agreed with the peers it dealt with; the
                        // rank that saw the disagreement tells everyone,
                        // so its next call fails.
                        Ok(()) => format!("next call: {}", c.barrier().expect_err("the communicator goes on")),
                    }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
    });
    assert!(t.elapsed() < Duration::from_secs(10), "{transport:?}: took {:?}: {errors:#?}", t.elapsed());
    errors
}

/// Some rank's error says `what` and names ranks `a` and `b` running the
/// calls described by `mine` and `theirs` (either way round).
fn assert_named(errors: &[String], what: &str, calls: &[&str], transport: Option<Kind>) {
    let hit = errors
        .iter()
        .any(|e| e.contains(what) && calls.iter().all(|c| e.contains(c)) && e.matches("rank ").count() >= 2);
    assert!(hit, "{transport:?}: no rank said {what:?} naming {calls:?}:\n{errors:#?}");
}

const TRANSPORTS: [Option<Kind>; 3] = [None, Some(Kind::Shm), Some(Kind::Tcp)];

#[test]
fn a_different_type_is_an_error_not_wrong_data() {
    for t in TRANSPORTS {
        let errors = disagree(t, |r| {
            let dtype = if r == 1 { DataType::Int32 } else { DataType::Float32 };
            (CollKind::AllReduce, dtype, ReduceOp::Sum, 0, 10_000)
        });
        assert_named(&errors, "the data type differs", &["(int32, sum)", "(float, sum)"], t);
    }
}

#[test]
fn a_different_operator_is_an_error() {
    for t in TRANSPORTS {
        let errors = disagree(t, |r| {
            let op = if r == 2 { ReduceOp::Max } else { ReduceOp::Sum };
            (CollKind::AllReduce, DataType::Float64, op, 0, 1000)
        });
        assert_named(&errors, "the operator differs", &["(double, max)", "(double, sum)"], t);
    }
}

/// Rank 0 and rank 1 each think they are the root. A ring broadcast's
/// roots only send, so each rank may finish its part; the message rank 0
/// sent is then found by rank 1's next call. (Where no rank thinks it is
/// the root, every rank waits for one and nothing is sent: a timeout, or
/// `OXCCL_CHECK=1`'s comparison before the call.)
#[test]
fn a_different_root_is_an_error_on_every_rank() {
    for t in TRANSPORTS {
        let errors = disagree(t, |r| (CollKind::Broadcast, DataType::Int8, ReduceOp::Sum, usize::from(r != 0), 5000));
        assert_named(&errors, "disagree", &["broadcast #1 (int8, root 0)"], t);
    }
}

#[test]
fn a_different_collective_is_an_error() {
    for t in TRANSPORTS {
        // The same bytes in flight: 3000 reduced, or 3 × 1000 gathered.
        let errors = disagree(t, |r| match r {
            2 => (CollKind::AllGather, DataType::Float32, ReduceOp::Sum, 0, 1000),
            _ => (CollKind::AllReduce, DataType::Float32, ReduceOp::Sum, 0, 3000),
        });
        assert_named(&errors, "the collective differs", &["all_gather #1", "all_reduce #1"], t);
    }
}

/// A count that differs shows as an access outside a peer's buffers, or
/// a message of another length: either way every rank names both ranks
/// and both counts (the peer's exposure carries its count; a peer whose
/// message has another length is asked for its call).
#[test]
fn a_different_count_is_named_on_every_rank() {
    for t in TRANSPORTS {
        let errors = disagree(t, |r| {
            let count = if r == 1 { 12_000 } else { 10_000 };
            (CollKind::AllReduce, DataType::Float32, ReduceOp::Sum, 0, count)
        });
        for e in &errors {
            let named = e.contains("the count differs")
                && e.contains("of 10000 elements")
                && e.contains("of 12000 elements")
                && e.contains("rank 1 runs");
            assert!(named, "{t:?}: a rank did not name both counts:\n{errors:#?}");
        }
    }
}
