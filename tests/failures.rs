//! Failure and bad input at the communicator level (threads): deadlines,
//! argument checks across ranks, abort, inconsistent init.

use oxccl::{CollKind, Communicator, Config, DataType, ReduceOp, Spec, UniqueId};
use std::time::{Duration, Instant};

#[test]
fn a_missing_rank_is_a_timeout_not_a_hang() {
    let cfg = Config { timeout: Some(Duration::from_secs(2)), ..Config::default() };
    let comms = Communicator::init_threads_with(3, cfg).unwrap();
    let t = Instant::now();
    std::thread::scope(|s| {
        for c in comms.iter().filter(|c| c.rank() != 1) {
            s.spawn(move || {
                let mut x = vec![1.0f32; 1000];
                let e = c.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap_err();
                let m = e.to_string();
                assert!(matches!(e, oxccl::Error::Timeout(_)), "{m}");
                assert!(m.contains("all_reduce") && m.contains("OXCCL_TIMEOUT") && m.contains("waits for"), "{m}");
                // Poisoned: later calls fail at once with the same error.
                assert_eq!(c.async_error().map(|e| e.to_string()), Some(m.clone()));
                assert!(c.barrier().is_err());
            });
        }
    });
    assert!(t.elapsed() < Duration::from_secs(20), "took {:?}", t.elapsed());
}

#[test]
fn oxccl_check_names_the_rank_that_differs() {
    let cfg = Config { check: Some(true), timeout: Some(Duration::from_secs(20)), ..Config::default() };
    let comms = Communicator::init_threads_with(4, cfg).unwrap();
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let count = if c.rank() == 2 { 10 } else { 12 };
                let mut x = vec![1i32; count];
                let e = c.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap_err().to_string();
                assert!(
                    e.contains("rank 2 called all_reduce count 10") && e.contains("rank 0 called all_reduce count 12"),
                    "{e}"
                );
                assert_eq!(x, vec![1; count], "a refused call changed data");
                // The mismatch was caught before running: still usable.
                let mut y = vec![1i32; 5];
                c.all_reduce_in_place(&mut y, ReduceOp::Sum).unwrap();
                assert_eq!(y, vec![4; 5]);
                let kind = if c.rank() == 3 { CollKind::Broadcast } else { CollKind::AllReduce };
                let mut z = vec![0u8; 8];
                let e = c
                    .collective_bytes(Spec::new(kind, 2, DataType::Float32).with_op(ReduceOp::Max), None, &mut z)
                    .unwrap_err();
                assert!(e.to_string().contains("rank 3 called broadcast"), "{e}");
            });
        }
    });
}

#[test]
fn abort_reaches_every_rank() {
    let cfg = Config { timeout: Some(Duration::from_secs(30)), ..Config::default() };
    let comms = Communicator::init_threads_with(3, cfg).unwrap();
    let t = Instant::now();
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                if c.rank() == 0 {
                    std::thread::sleep(Duration::from_millis(200));
                    c.abort();
                    assert!(c.barrier().is_err());
                } else {
                    let mut x = vec![1.0f64; 100];
                    let e = c.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap_err().to_string();
                    assert!(e.contains("rank 0 aborted"), "{e}");
                }
            });
        }
    });
    assert!(t.elapsed() < Duration::from_secs(10));
}

#[test]
fn inconsistent_init_is_an_error() {
    let id = UniqueId::new().unwrap();
    let e = Communicator::init(&id, 2, 2, Config::default()).unwrap_err().to_string();
    assert!(e.contains("rank 2 is out of range for 2 ranks"), "{e}");
    let cfg = Config { timeout: Some(Duration::from_secs(5)), ..Config::default() };
    std::thread::scope(|s| {
        let a = s.spawn(|| Communicator::init(&id, 2, 0, cfg.clone()));
        let b = s.spawn(|| Communicator::init(&id, 3, 1, cfg.clone()));
        let dup = s.spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            Communicator::init(&id, 2, 0, cfg.clone())
        });
        let c = s.spawn(|| {
            std::thread::sleep(Duration::from_millis(600));
            Communicator::init(&id, 2, 1, cfg.clone())
        });
        let eb = b.join().unwrap().unwrap_err().to_string();
        assert!(eb.contains('3') && eb.contains('2'), "{eb}");
        let ed = dup.join().unwrap().unwrap_err().to_string();
        assert!(ed.contains("rank 0") || ed.contains("port"), "{ed}");
        let (a, c) = (a.join().unwrap().unwrap(), c.join().unwrap().unwrap());
        std::thread::scope(|s2| {
            for comm in [&a, &c] {
                s2.spawn(move || {
                    let mut v = vec![comm.rank() as u64 + 1; 3];
                    comm.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
                    assert_eq!(v, vec![3; 3]);
                });
            }
        });
    });
    let bad = Config { algo: Some("allreduce:spiral".into()), ..Config::default() };
    assert!(Communicator::init_threads_with(1, bad).unwrap_err().to_string().contains("spiral"));
}

/// A named call on a communicator.
type NamedCall<'a> = (&'static str, Box<dyn Fn() -> oxccl::Result<()> + Sync + 'a>);

/// Every kind of call on `c`, each with a deadline: all must fail, each
/// within `limit`.
fn every_call_fails_fast(c: &Communicator, limit: Duration) {
    let peer = (c.rank() + 1) % c.size();
    let n = c.size();
    let calls: Vec<NamedCall<'_>> = vec![
        ("all_reduce", Box::new(|| c.all_reduce_in_place(&mut [1.0f32; 64], ReduceOp::Sum))),
        ("barrier", Box::new(|| c.barrier())),
        ("send", Box::new(move || c.send(&[1u8; 64], peer))),
        ("recv", Box::new(move || c.recv(&mut [0u8; 64], peer))),
        (
            "group",
            Box::new(move || {
                let (out, mut inc) = ([1u8; 8], [0u8; 8]);
                c.group(|g| {
                    g.send(&out, peer);
                    g.recv(&mut inc, peer);
                })
            }),
        ),
        (
            "all_to_allv",
            Box::new(move || {
                let counts = vec![1usize; n];
                let displs: Vec<usize> = (0..n).collect();
                let send = vec![1u32; n];
                let mut recv = vec![0u32; n];
                c.all_to_allv(&send, &counts, &displs, &mut recv, &counts, &displs)
            }),
        ),
        ("async all_reduce", Box::new(|| c.all_reduce_async(vec![1.0f32; 64], ReduceOp::Sum)?.wait().map(|_| ()))),
        ("split", Box::new(|| c.split(Some(0), 0).map(|_| ()))),
        ("shrink", Box::new(|| c.shrink(&[]).map(|_| ()))),
    ];
    for (name, call) in &calls {
        let t = Instant::now();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| {
                let _ = tx.send(call());
            });
            match rx.recv_timeout(limit + Duration::from_secs(5)) {
                Ok(r) => assert!(r.is_err(), "rank {}: {name} on an aborted communicator succeeded", c.rank()),
                // The scope would wait for the hung call: end the process.
                Err(_) => {
                    eprintln!("rank {}: {name} on an aborted communicator hangs", c.rank());
                    std::process::abort();
                }
            }
        });
        assert!(t.elapsed() < limit, "rank {}: {name} took {:?} to fail", c.rank(), t.elapsed());
    }
}

#[test]
fn after_abort_every_call_fails_at_once_on_every_rank() {
    let cfg = Config { timeout: Some(Duration::from_secs(10)), ..Config::default() };
    let comms = Communicator::init_threads_with(3, cfg).unwrap();
    comms[0].abort();
    // The aborting rank: at once.
    every_call_fails_fast(&comms[0], Duration::from_millis(500));
    // The others learn it from the bootstrap within moments.
    std::thread::sleep(Duration::from_millis(200));
    std::thread::scope(|s| {
        for c in &comms[1..] {
            s.spawn(move || every_call_fails_fast(c, Duration::from_secs(3)));
        }
    });
}

#[test]
fn a_call_racing_abort_ends_within_the_aborts_bound() {
    for (transport, trials) in [(None, 100usize), (Some(oxccl::Kind::Shm), 30), (Some(oxccl::Kind::Tcp), 30)] {
        racing_abort(transport, trials);
    }
}

fn racing_abort(transport: Option<oxccl::Kind>, trials: usize) {
    let cfg = Config { timeout: Some(Duration::from_secs(10)), transport, ..Config::default() };
    for trial in 0..trials {
        let comms = Communicator::init_threads_with(2, cfg.clone()).unwrap();
        let t = Instant::now();
        std::thread::scope(|s| {
            for c in &comms {
                s.spawn(move || {
                    // Both ranks all-reduce until the abort stops them.
                    let mut x = vec![1.0f32; 4096];
                    while c.all_reduce_in_place(&mut x, ReduceOp::Sum).is_ok() {}
                });
            }
            std::thread::sleep(Duration::from_micros(200 * (trial % 10) as u64));
            comms[trial % 2].abort();
        });
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{transport:?} trial {trial}: the racing calls took {:?}",
            t.elapsed()
        );
    }
}

/// An abort after a failure carries the failure: a rank that hears of the
/// abort first (before the failure's own notice, or never) still learns
/// the cause, not only "rank r aborted".
#[test]
fn an_abort_after_a_failure_names_the_failure() {
    let cfg = Config { timeout: Some(Duration::from_secs(1)), ..Config::default() };
    let comms = Communicator::init_threads_with(3, cfg).unwrap();
    let c0 = &comms[0];
    let mut x = vec![1.0f32; 100];
    // Rank 0 alone: a timeout naming what it waited for.
    let e = c0.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap_err().to_string();
    assert!(e.contains("timed out"), "{e}");
    c0.abort();
    // The notice travels over the bootstrap (a few ms).
    std::thread::sleep(Duration::from_millis(300));
    for c in &comms[1..] {
        let e = c.barrier().unwrap_err().to_string();
        assert!(
            e.contains("rank 0 aborted: the application called abort after:") && e.contains("timed out"),
            "rank {}: {e}",
            c.rank()
        );
    }
}

/// Three ranks as threads (a deadline of 8 s) that have run a barrier.
fn three_past_a_barrier(transport: Option<oxccl::Kind>) -> Vec<Communicator> {
    let cfg = Config { timeout: Some(Duration::from_secs(8)), transport, ..Config::default() };
    let comms = Communicator::init_threads_with(3, cfg).unwrap();
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || c.barrier().unwrap());
        }
    });
    comms
}

#[test]
fn a_peer_that_closed_is_named_at_once_within_one_process() {
    // Rank 1 closes its communicator; the next collective of ranks 0 and 2
    // (rank 2 hears of it from rank 0) fails naming rank 1, not at the
    // 8 s deadline.
    for transport in [None, Some(oxccl::Kind::Tcp)] {
        let mut comms = three_past_a_barrier(transport);
        drop(comms.remove(1));
        std::thread::scope(|s| {
            for c in &comms {
                s.spawn(move || {
                    let t = Instant::now();
                    let e = c.all_reduce_in_place(&mut [1.0f32; 64], ReduceOp::Sum).unwrap_err().to_string();
                    let secs = t.elapsed().as_secs_f64();
                    println!("{transport:?} rank {}: {secs:.3} s: {e}", c.rank());
                    assert!(e.contains("rank 1") && e.contains("closed its communicator"), "{e}");
                    assert!(secs < 2.0, "{transport:?}: noticed after {secs:.2} s: {e}");
                });
            }
        });
    }
}

#[test]
fn a_rank_that_closed_because_another_failed_is_not_named_as_the_cause() {
    // Rank 2 closes, and at once rank 1 fails (as a rank that saw rank 1
    // die closes): rank 0, waiting in a collective, hears of the close
    // first and of the failure a moment later. It names the failure.
    for transport in [None, Some(oxccl::Kind::Tcp)] {
        let mut comms = three_past_a_barrier(transport);
        let (c2, c1) = (comms.pop().unwrap(), comms.pop().unwrap());
        let c0 = &comms[0];
        std::thread::scope(|s| {
            let waiter = s.spawn(move || c0.all_reduce_in_place(&mut [1.0f32; 64], ReduceOp::Sum));
            std::thread::sleep(Duration::from_millis(100));
            drop(c2);
            c1.abort();
            let e = waiter.join().unwrap().unwrap_err().to_string();
            println!("{transport:?}: {e}");
            assert!(e.contains("rank 1 aborted"), "{transport:?}: {e}");
        });
    }
}

#[test]
fn a_peer_that_closed_after_its_part_of_a_collective_does_not_fail_the_others() {
    // Rank 1 finishes a broadcast (its part done once it has the data and
    // passed it on) and closes; rank 2, later, runs the same broadcast:
    // rank 1 ran it, so it goes through (its goodbye says how far it got).
    let cfg = Config { timeout: Some(Duration::from_secs(8)), ..Config::default() };
    let mut comms: Vec<Option<Communicator>> =
        Communicator::init_threads_with(3, cfg).unwrap().into_iter().map(Some).collect();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let [c0, c1, c2] = &mut comms[..] else { unreachable!() };
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut x = [7.0f32; 16];
            c0.as_ref().unwrap().broadcast(&mut x, 0).unwrap();
        });
        s.spawn(move || {
            let mut x = [0.0f32; 16];
            c1.as_ref().unwrap().broadcast(&mut x, 0).unwrap();
            assert_eq!(x, [7.0; 16]);
            drop(c1.take());
            tx.send(()).unwrap();
        });
        s.spawn(move || {
            let _ = rx.recv_timeout(Duration::from_secs(1));
            let mut x = [0.0f32; 16];
            c2.as_ref().unwrap().broadcast(&mut x, 0).unwrap();
            assert_eq!(x, [7.0; 16]);
        });
    });
}
