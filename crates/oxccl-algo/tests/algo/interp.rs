//! Programs run on real data: exact results against a reference computed
//! from the collective's definition alone, and all-reduce results that are
//! the same bits on every rank.

use oxccl_algo::algos::{Algorithm, BuildOptions, build};
use oxccl_algo::interp::run;
use oxccl_algo::{CollKind, Collective};
use oxccl_core::{DataType, ReduceOp};

fn pairs() -> Vec<(Algorithm, CollKind)> {
    Algorithm::ALL.iter().flat_map(|a| a.kinds().iter().map(move |k| (*a, *k))).collect()
}

/// Small integers: every sum and product of them is exact in f32.
fn exact_input(r: usize, i: usize) -> f32 {
    ((r * 7 + i * 3) % 5) as f32 - 1.0
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

#[test]
fn every_algorithm_computes_its_collective_exactly() {
    for (algo, kind) in pairs() {
        for n in [1, 2, 3, 5, 8] {
            for count in [0, 1, 7, 100] {
                for root in [0, n - 1] {
                    let c = Collective::new(kind, n, count).with_root(root);
                    let p = build(algo, &c, &BuildOptions { chunk_bytes: 40, max_chunks: 4 }).unwrap();
                    let inputs: Vec<Vec<u8>> = (0..n)
                        .map(|r| (0..c.input_len(r)).flat_map(|i| exact_input(r, i).to_le_bytes()).collect())
                        .collect();
                    for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Prod] {
                        let out = run(&p, &[op], &inputs).unwrap_or_else(|e| panic!("{algo} {c}: {e}"));
                        for (r, got) in out.iter().enumerate() {
                            let got = f32s(got);
                            for e in c.expected(r) {
                                for k in 0..e.len {
                                    let vals = e.ranks.iter().map(|&q| exact_input(q, e.base + k));
                                    let want = match op {
                                        ReduceOp::Max => vals.fold(f32::MIN, f32::max),
                                        ReduceOp::Prod => vals.product(),
                                        _ => vals.sum(),
                                    };
                                    assert_eq!(
                                        got[e.start + k],
                                        want,
                                        "{algo} {c} {op}: rank {r} output[{}]",
                                        e.start + k
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// 50 values per rank (f32 or bf16) whose sums round differently in
/// different orders.
fn order_sensitive(n: usize, dtype: DataType) -> Vec<Vec<u8>> {
    (0..n)
        .map(|r| {
            (0..50)
                .flat_map(|i| {
                    let x = 1.0f32 / (1.0 + r as f32 * 0.37 + i as f32 * 1.91) * 1e3 + 1e-3 * r as f32;
                    let b = x.to_le_bytes();
                    if dtype == DataType::Float32 { b.to_vec() } else { b[2..].to_vec() }
                })
                .collect()
        })
        .collect()
}

#[test]
fn all_reduce_gives_every_rank_the_same_bits() {
    // Values whose sums round differently in different orders.
    for dtype in [DataType::Float32, DataType::Bfloat16] {
        for algo in Algorithm::for_kind(CollKind::AllReduce) {
            for n in [2, 3, 4, 7, 8] {
                let c = Collective::new(CollKind::AllReduce, n, 50).with_dtype(dtype);
                let p = build(algo, &c, &BuildOptions { chunk_bytes: 64, max_chunks: 4 }).unwrap();
                let inputs = order_sensitive(n, dtype);
                let out = run(&p, &[ReduceOp::Sum], &inputs).unwrap();
                for (r, o) in out.iter().enumerate() {
                    assert_eq!(o, &out[0], "{algo} {dtype} on {n} ranks: rank {r} differs from rank 0");
                }
            }
        }
    }
}

#[test]
fn direct_reduce_gives_the_same_bits_whatever_the_root() {
    // The root reduces in rank order 0..n-1 whoever it is; the chain (and
    // a sum in another order) would not.
    for dtype in [DataType::Float32, DataType::Bfloat16] {
        for n in [2, 3, 5, 8] {
            let inputs = order_sensitive(n, dtype);
            let result = |algo: Algorithm, root: usize| {
                let c = Collective::new(CollKind::Reduce, n, 50).with_dtype(dtype).with_root(root);
                let p = build(algo, &c, &BuildOptions::default()).unwrap();
                run(&p, &[ReduceOp::Sum], &inputs).unwrap().swap_remove(root)
            };
            let first = result(Algorithm::Direct, 0);
            for root in 1..n {
                assert_eq!(
                    result(Algorithm::Direct, root),
                    first,
                    "{dtype} on {n} ranks: root {root} differs from root 0"
                );
            }
            if n >= 3 {
                let chain = (0..n).map(|root| result(Algorithm::Ring, root)).collect::<Vec<_>>();
                assert!(chain.iter().any(|b| *b != first), "{dtype} on {n} ranks: the inputs do not tell orders apart");
            }
        }
    }
}
