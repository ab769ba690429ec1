//! The verifier proves the reduction order: every program of the ordered
//! algorithm is canonical at 1–16 ranks (in place too), and a program
//! that reorders is reported naming the rank, step and element where it
//! leaves the canonical tree.

use oxccl_algo::algos::{Algorithm, BuildOptions, build};
use oxccl_algo::canon;
use oxccl_algo::verify::{VerifyOptions, verify, verify_with};
use oxccl_algo::{CollKind, Collective, Program, Slice, Step};

#[test]
fn the_ordered_algorithm_is_canonical_at_every_rank_count_count_and_chunking() {
    let chunked = BuildOptions { chunk_bytes: 64, max_chunks: 8 };
    for n in 1..=16 {
        for kind in [CollKind::AllReduce, CollKind::ReduceScatter, CollKind::Reduce] {
            for count in [0, 1, 7, 100, 1000] {
                for opts in [BuildOptions::default(), chunked] {
                    let c = Collective::new(kind, n, count).with_root(n / 3);
                    let p = build(Algorithm::Ordered, &c, &opts).unwrap();
                    for in_place in [false, true] {
                        let r = verify_with(&p, &VerifyOptions { in_place, ..Default::default() }).unwrap();
                        assert!(r.is_canonical(), "{c} in place {in_place}: {}", r.departure.unwrap());
                    }
                }
            }
        }
    }
}

#[test]
fn collectives_that_do_not_reduce_are_canonical_and_the_ring_is_not() {
    let ag = build(Algorithm::Ring, &Collective::new(CollKind::AllGather, 5, 10), &BuildOptions::default()).unwrap();
    assert!(verify(&ag).unwrap().is_canonical());
    // Two ranks: a ⊕ b is the tree; the ring does nothing else.
    let two = build(Algorithm::Ring, &Collective::new(CollKind::AllReduce, 2, 10), &BuildOptions::default()).unwrap();
    assert!(verify(&two).unwrap().is_canonical());
    let ring = build(Algorithm::Ring, &Collective::new(CollKind::AllReduce, 4, 12), &BuildOptions::default()).unwrap();
    let d = verify(&ring).unwrap().departure.expect("the ring starts block j at rank j+1");
    assert!(d.message.contains("(x0 ⊕ x1) ⊕ (x2 ⊕ x3)"), "{d}");
}

/// Reduce to rank 0 of 3 ranks, 10 elements: elements `0..split` as
/// `(x0 ⊕ x1) ⊕ x2`, the rest as `x0 ⊕ (x1 ⊕ x2)`.
fn reduce_of_3(split: usize) -> Program {
    let c = Collective::new(CollKind::Reduce, 3, 10);
    let mut p = Program::new("reordered", c);
    let (lo, hi) = (Slice::input(0, split), Slice::input(split, 10 - split));
    // Canonical part: rank 1 → rank 0 (x0 ⊕ x1), then rank 2 → rank 0.
    p.push(1, 0, Step::Send { peer: 0, src: lo });
    p.push(0, 0, Step::RecvReduce { peer: 1, src: lo, dst: Slice::output(0, split) });
    p.push(2, 0, Step::Send { peer: 0, src: lo });
    p.push(0, 0, Step::RecvReduce { peer: 2, src: Slice::output(0, split), dst: Slice::output(0, split) });
    // Reordered part: rank 2 → rank 1 (x1 ⊕ x2), then to rank 0.
    p.push(2, 0, Step::Send { peer: 1, src: hi });
    p.push(1, 0, Step::RecvReduceSend { recv: 2, send: 0, src: hi });
    p.push(0, 0, Step::RecvReduce { peer: 1, src: hi, dst: Slice::output(split, 10 - split) });
    p
}

#[test]
fn a_reordered_program_is_named_by_rank_step_and_element() {
    let r = verify(&reduce_of_3(10)).unwrap();
    assert!(r.is_canonical(), "{:?}", r.departure);
    let r = verify(&reduce_of_3(4)).unwrap();
    let d = r.departure.expect("x1 ⊕ x2 is not a node of (x0 ⊕ x1) ⊕ x2");
    assert_eq!((d.rank, d.channel, d.step, d.element, d.output), (1, 0, 1, 4, (0, 4)));
    let text = d.to_string();
    for want in ["reordered: rank 1 step 1", "ranks {1} with ranks {2}", "input[4]", canon::expr(3).as_str()] {
        assert!(text.contains(want), "{text} does not say {want:?}");
    }
    // The set of contributions is right, so the program still verifies.
    assert_eq!(r.messages, 4);
}

#[test]
fn an_order_that_departs_only_in_place_is_reported() {
    // Rank 0 first swaps its element with rank 2's (into its output, which
    // in place is its input), then adds rank 1's to its input: out of place
    // x0 ⊕ x1, in place x2 ⊕ x1. Both hold the right contributions.
    let (i, o) = (Slice::input(0, 1), Slice::output(0, 1));
    let mut p = Program::new("swap", Collective::new(CollKind::AllReduce, 3, 1));
    p.in_place = true;
    let ranks = [
        vec![
            Step::Send { peer: 2, src: i },
            Step::Recv { peer: 2, dst: o },
            Step::RecvReduce { peer: 1, src: i, dst: o },
            Step::Send { peer: 2, src: o },
            Step::Recv { peer: 2, dst: o },
        ],
        vec![Step::Send { peer: 0, src: i }, Step::Recv { peer: 2, dst: o }],
        vec![
            Step::Send { peer: 0, src: i },
            Step::Recv { peer: 0, dst: o },
            Step::RecvReduce { peer: 0, src: i, dst: o },
            Step::Send { peer: 0, src: o },
            Step::Send { peer: 1, src: o },
        ],
    ];
    for (r, steps) in ranks.into_iter().enumerate() {
        steps.into_iter().for_each(|s| p.push(r, 0, s));
    }
    let out = verify_with(&p, &VerifyOptions::default()).unwrap();
    assert!(out.is_canonical(), "{:?}", out.departure);
    let d = verify(&p).unwrap().departure.expect("in place, rank 0 adds x2 and x1 first");
    assert_eq!((d.rank, d.step), (0, 2));
    assert!(d.message.ends_with("(in place)") && d.message.contains("ranks {2} with ranks {1}"), "{d}");
}
