//! The deterministic mode (`OXCCL_DETERMINISTIC=1`, `Config::deterministic`):
//! every floating-point all_reduce, reduce_scatter and reduce gives the
//! bits of the canonical order, computed independently in the test kit
//! (`tests/kit/canon.rs`), at every size, buffer size, placement, rank
//! count and algorithm the mode admits; ranks as threads and as processes
//! over shared memory and TCP.

use oxccl::{CollKind, Communicator, Config, DataType, ReduceOp, UniqueId};
use oxccl_algo::algos::Algorithm;
use oxccl_algo::algos::{BuildOptions, build};
use oxccl_algo::{Collective, verify};
use oxccl_e2e::canon::{self, Case, OPS, TYPES};
use oxccl_e2e::child::{fresh_id, output, spawn};
use oxccl_e2e::{on_threads, run_case};
use std::process::Child;
use std::time::Duration;

fn cfg(on: bool, algo: Option<&str>, buffsize: Option<usize>) -> Config {
    Config {
        deterministic: Some(on),
        algo: algo.map(str::to_string),
        buffsize,
        timeout: Some(Duration::from_secs(60)),
        ..Config::default()
    }
}

fn case(kind: CollKind, dtype: DataType, count: usize, root: usize, in_place: bool) -> Case {
    Case { kind, dtype, op: ReduceOp::Sum, count, root, in_place }
}

#[test]
fn threads_1_to_8_give_the_canonical_bits_at_every_size_type_operator_and_buffer_size() {
    for n in 1..=8 {
        // 64 KiB FIFOs cut the larger messages into many pipeline chunks.
        for buffsize in [None, Some(64 << 10)] {
            let mut cases = canon::cases(n, &[1, 7, 1000 + 3 * n + 1], &TYPES, &OPS);
            cases.push(case(CollKind::AllReduce, DataType::Bfloat16, 70_001, 0, true));
            cases.push(case(CollKind::ReduceScatter, DataType::Float32, 30_011, 0, false));
            cases.push(case(CollKind::Reduce, DataType::Float16, 50_001, n / 2, false));
            if n == 3 {
                // Several MiB: 4 MiB of f32, 2 MiB of bf16 per block.
                cases.push(case(CollKind::AllReduce, DataType::Float32, 1_000_003, 0, false));
                cases.push(case(CollKind::ReduceScatter, DataType::Bfloat16, 1 << 20, 0, true));
            }
            on_threads(n, cfg(true, None, buffsize), |c| canon::check_all(c, &cases).map(|_| ()));
        }
    }
}

/// Whether the verifier proves `algo`'s programs of `kind` on `n` ranks
/// canonical (as the tuner asks it).
fn proven(algo: Algorithm, kind: CollKind, n: usize) -> bool {
    let c = Collective::new(kind, n, 3 * n + 1).with_root(n - 1);
    let p = build(algo, &c, &BuildOptions { chunk_bytes: 16, max_chunks: 3 }).unwrap();
    verify::verify(&p).unwrap().is_canonical()
}

#[test]
fn every_algorithm_the_mode_admits_gives_the_same_bits_and_the_others_are_refused() {
    let mut admitted = 0;
    for n in [2, 3, 4, 5, 6, 8] {
        for kind in [CollKind::AllReduce, CollKind::ReduceScatter, CollKind::Reduce] {
            for algo in Algorithm::for_kind(kind) {
                let ok = proven(algo, kind, n);
                admitted += usize::from(ok);
                // What the verifier must say, known without it: the ordered
                // algorithm is built canonical, the ring starts block j at
                // rank j+1 (canonical only for 2; its reduce is a chain, which
                // is the tree on 3 ranks when it ends at rank 2), doubling
                // pairs ranks at distance 1 first (canonical on 4 and 8).
                match algo {
                    Algorithm::Ordered => assert!(ok, "ordered {kind} on {n}"),
                    Algorithm::Ring if kind != CollKind::Reduce => assert_eq!(ok, n == 2, "ring {kind} on {n}"),
                    Algorithm::Doubling if n.is_power_of_two() => assert!(ok, "doubling on {n}"),
                    _ => {}
                }
                let name = format!("{}:{}", kind.name().replace('_', ""), algo.name());
                on_threads(n, cfg(true, Some(&name), Some(64 << 10)), |c| {
                    let mut first = None;
                    let cases = [case(kind, DataType::Float32, 2000 + n, n - 1, false)];
                    match (ok, canon::run(c, cases[0], &mut first)) {
                        (true, Ok(0)) => Ok(()),
                        (true, Ok(_)) => Err(format!("{name} on {n} ranks: {}", first.unwrap())),
                        (true, Err(e)) => Err(format!("{name} on {n} ranks is proven canonical but fails: {e}")),
                        (false, Err(e)) if e.contains("OXCCL_DETERMINISTIC=1") && e.contains(algo.name()) => Ok(()),
                        (false, other) => Err(format!("{name} on {n} ranks is not canonical but ran: {other:?}")),
                    }
                });
            }
        }
    }
    // The ordered algorithm at every n and kind, and others where they
    // happen to be canonical (two ranks: all of them).
    assert!(admitted > 18 + 6, "{admitted}");
}

#[test]
fn the_inputs_tell_orders_apart_the_ring_without_the_mode_differs() {
    // Without the mode, the ring adds block j from rank j+1 on: these
    // inputs then give other bits than the canonical order (so the tests
    // above would see an algorithm that is not canonical).
    let differ = std::sync::atomic::AtomicUsize::new(0);
    on_threads(4, cfg(false, Some("ring"), None), |c| {
        let mut first = None;
        let wrong = canon::run(c, case(CollKind::AllReduce, DataType::Float32, 4000, 0, false), &mut first)?;
        differ.fetch_add(wrong, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    });
    assert!(differ.into_inner() > 100, "the ring gave the canonical bits: the inputs do not depend on the order");
}

#[test]
fn integers_and_min_max_are_exact_in_the_mode() {
    // Integer sums and products, min and max give the same bits in every
    // order: the mode leaves their algorithm to the tuner; the results are
    // exact (the kit's patterns) either way.
    on_threads(5, cfg(true, None, None), |c| {
        for (dtype, op) in [
            (DataType::Int32, ReduceOp::Sum),
            (DataType::Int64, ReduceOp::Prod),
            (DataType::Uint8, ReduceOp::Max),
            (DataType::Float32, ReduceOp::Min),
            (DataType::Float32, ReduceOp::Max),
        ] {
            for kind in [CollKind::AllReduce, CollKind::ReduceScatter, CollKind::Reduce] {
                for count in [1, 1000, 100_003] {
                    run_case(c, kind, dtype, count, op, 2, false)?;
                }
            }
        }
        Ok(())
    });
}

#[test]
fn float_max_and_min_of_signed_zeros_are_the_same_bits_on_every_rank_and_algorithm() {
    // +0, -0 and two -inf on 4 ranks: max is +0 and min of (+0, -0, +inf,
    // +inf) is -0, whichever operand each rank's algorithm puts first (the
    // doubling partners each compute op(own, peer); the kernels used to
    // return the second of two equal operands, so ranks disagreed).
    for algo in ["", "ring", "doubling", "oneshot", "twoshot", "rhd", "tree", "ordered"] {
        // The mode admits on 4 ranks only the canonical ones.
        let modes: &[bool] = if matches!(algo, "" | "doubling" | "ordered") { &[false, true] } else { &[false] };
        for &on in modes {
            let name = (!algo.is_empty()).then(|| format!("allreduce:{algo}"));
            on_threads(4, cfg(on, name.as_deref(), None), |c| {
                let r = c.rank();
                let zero = if r == 1 { -0.0f32 } else { 0.0 };
                let mut mx = vec![if r >= 2 { f32::NEG_INFINITY } else { zero }; 5];
                let mut mn = vec![if r >= 2 { f32::INFINITY } else { zero }; 5];
                c.all_reduce_in_place(&mut mx, ReduceOp::Max).map_err(|e| e.to_string())?;
                c.all_reduce_in_place(&mut mn, ReduceOp::Min).map_err(|e| e.to_string())?;
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                if bits(&mx) != [0; 5] || bits(&mn) != [0x8000_0000; 5] {
                    return Err(format!("{algo:?} mode {on} rank {r}: max {mx:?} min {mn:?}"));
                }
                Ok(())
            });
        }
    }
}

#[test]
fn ranks_that_disagree_on_the_mode_fail_at_init_naming_one() {
    let id = UniqueId::new().unwrap();
    let errs: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..3)
            .map(|r| {
                let id = &id;
                s.spawn(move || match Communicator::init(id, 3, r, cfg(r != 1, None, None)) {
                    Ok(_) => "initialized".to_string(),
                    Err(e) => e.to_string(),
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, e) in errs.iter().enumerate() {
        assert!(e.contains("deterministic mode") && e.contains("OXCCL_DETERMINISTIC"), "rank {r}: {e}");
        assert!(e.contains(if r == 1 { "rank 0 does" } else { "rank 1 does not" }), "rank {r}: {e}");
    }
}

#[test]
fn a_program_that_is_not_canonical_is_refused_in_the_mode_and_one_that_is_runs() {
    let dir = std::env::temp_dir().join(format!("oxccl-det-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let c = Collective::new(CollKind::AllReduce, 3, 6);
    let mut ring = build(Algorithm::Ring, &c, &BuildOptions::default()).unwrap();
    ring.name = "det_ring_3".into();
    let mut ordered = build(Algorithm::Ordered, &c, &BuildOptions::default()).unwrap();
    ordered.name = "det_ordered_3".into();
    let (rf, of) = (dir.join("ring.json"), dir.join("ordered.json"));
    std::fs::write(&rf, ring.to_json()).unwrap();
    std::fs::write(&of, ordered.to_json()).unwrap();
    let ring_ids = oxccl::programs::load(&rf).unwrap();
    let ordered_ids = oxccl::programs::load(&of).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();

    let config = Config { programs: ring_ids.clone(), ..cfg(true, None, None) };
    let e = match Communicator::init_threads_with(3, config) {
        Ok(_) => panic!("a ring program initialized in the mode"),
        Err(e) => e.to_string(),
    };
    for want in ["det_ring_3", "OXCCL_DETERMINISTIC=1", "not proven", "combines ranks"] {
        assert!(e.contains(want), "{e} does not say {want:?}");
    }
    // Without the mode it loads.
    assert!(Communicator::init_threads_with(3, Config { programs: ring_ids, ..cfg(false, None, None) }).is_ok());

    let config = Config { programs: ordered_ids, ..cfg(true, Some("det_ordered_3"), None) };
    on_threads(3, config, |c| {
        // It was written for 6 elements: it runs at multiples of 6.
        canon::check_all(c, &[case(CollKind::AllReduce, DataType::Float32, 6 * 1001, 0, false)]).map(|_| ())
    });
}

fn processes(n: usize, transport: &str, extra: &[(&str, &str)]) {
    let id = fresh_id();
    let mut envs = vec![("OXCCL_TRANSPORT", transport), ("OXCCL_DETERMINISTIC", "1")];
    envs.extend_from_slice(extra);
    let kids: Vec<Child> = (0..n).map(|r| spawn(&[], &id, n, r, "canon", &envs)).collect();
    let outs: Vec<(bool, String)> = kids.into_iter().map(output).collect();
    // Every rank's output: the one that failed first is seldom rank 0.
    let all = || outs.iter().enumerate().map(|(r, (_, o))| format!("--- rank {r}:\n{o}")).collect::<String>();
    for (r, (ok, out)) in outs.iter().enumerate() {
        assert!(*ok && out.contains("CASES"), "rank {r} of {n} over {transport} {extra:?} failed:\n{}", all());
        assert!(out.contains(&format!(":{transport}")), "rank {r} did not use {transport}:\n{out}");
    }
}

#[test]
fn processes_over_shared_memory_give_the_canonical_bits() {
    for n in 2..=4 {
        processes(n, "shm", &[]);
    }
    processes(3, "shm", &[("OXCCL_BUFFSIZE", "65536")]);
}

#[test]
fn processes_over_tcp_give_the_canonical_bits() {
    for n in 2..=4 {
        processes(n, "tcp", &[]);
    }
    processes(3, "tcp", &[("OXCCL_BUFFSIZE", "65536")]);
}
