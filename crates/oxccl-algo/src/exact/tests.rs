//! The checker against collectives simulated with oxccl-core's kernels, in
//! different reduction orders.

use super::*;
use oxccl_core::kernels::{finish_avg, premul, reduce_into};

const OPS: [ReduceOp; 6] =
    [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg, ReduceOp::PreMulSum { scalar: 1.0 }];

/// All-reduce of every rank's input, reducing in `order`, with the
/// kernels oxccl's executor uses.
fn simulate(p: &Pattern, dtype: DataType, op: ReduceOp, n: usize, count: usize, order: &[usize]) -> Vec<u8> {
    let es = dtype.size();
    let input = |r: usize| {
        let mut b = vec![0u8; count * es];
        p.fill(r, &mut b);
        if let ReduceOp::PreMulSum { .. } = op {
            let src = b.clone();
            premul(dtype, &mut b, &src, premul_scalar(r)).unwrap();
        }
        b
    };
    let mut acc = input(order[0]);
    for &r in &order[1..] {
        reduce_into(dtype, op, &mut acc, &input(r)).unwrap();
    }
    if op == ReduceOp::Avg {
        finish_avg(dtype, &mut acc, n).unwrap();
    }
    acc
}

#[test]
fn any_reduction_order_gives_the_reference_bit_for_bit() {
    let count = 300;
    for dtype in DataType::ALL {
        for op in OPS {
            for n in [1, 2, 3, 4, 7, 8, 9, 16, 33, 100] {
                let p = Pattern::new(CollKind::AllReduce, dtype, op, n, 5);
                let coll = Collective { kind: CollKind::AllReduce, nranks: n, count, root: 0, dtype };
                let fwd: Vec<usize> = (0..n).collect();
                let rev: Vec<usize> = (0..n).rev().collect();
                let mut mid: Vec<usize> = (0..n).collect();
                mid.rotate_left(n / 2);
                let what = format!("{dtype} {op} on {n} ranks");
                for order in [&fwd, &rev, &mid] {
                    let got = simulate(&p, dtype, op, n, count, order);
                    assert_eq!(p.count_wrong(&coll, n - 1, &got, None, 0), 0, "{what}, order {order:?}");
                }
                // Not all zeros: the data tests something (except avg where
                // no exact average exists: n beyond the type's budget).
                let vacuous = op == ReduceOp::Avg && (budget(dtype) - 1) / n as u64 == 0;
                let nonzero = (0..count).filter(|&i| p.value(n - 1, i) != 0.0).count();
                assert!(vacuous || nonzero > 0, "{what}: all inputs are zero");
            }
        }
    }
}

#[test]
fn a_wrong_element_is_counted() {
    for dtype in DataType::ALL {
        for op in OPS {
            let n = 4;
            let p = Pattern::new(CollKind::AllReduce, dtype, op, n, 9);
            let coll = Collective { kind: CollKind::AllReduce, nranks: n, count: 64, root: 0, dtype };
            let order: Vec<usize> = (0..n).collect();
            let mut got = simulate(&p, dtype, op, n, 64, &order);
            assert_eq!(p.count_wrong(&coll, 0, &got, None, 0), 0);
            // Flip a low mantissa / value bit of element 17 and of element 40.
            let es = dtype.size();
            got[17 * es] ^= 1;
            got[40 * es] ^= 2;
            assert_eq!(p.count_wrong(&coll, 0, &got, None, 0), 2, "{dtype} {op}");
            // A rank missing from the reduction is found too (prod: a
            // rank of ones is indistinguishable, so use another op there).
            if op != ReduceOp::Prod && op != ReduceOp::Max && op != ReduceOp::Min {
                let partial = simulate(&p, dtype, op, n, 64, &order[..3]);
                assert!(p.count_wrong(&coll, 0, &partial, None, 0) > 0, "{dtype} {op}: a missing rank");
            }
        }
    }
}

#[test]
fn windows_place_input_and_output() {
    // All-gather of 3 elements on 2 ranks, in place on rank 1: the window
    // is the whole receive buffer; the input sat at element 3.
    let dtype = DataType::Int32;
    let coll = Collective { kind: CollKind::AllGather, nranks: 2, count: 3, root: 0, dtype };
    let p = Pattern::new(CollKind::AllGather, dtype, ReduceOp::Sum, 2, 1);
    let mut buf = vec![0u8; 6 * 4];
    p.fill(0, &mut buf[..12]);
    p.fill(1, &mut buf[12..]);
    assert_eq!(p.count_wrong(&coll, 1, &buf, Some(3), 0), 0);
    // Rank 0's block missing: 3 wrong (unless a value is 0).
    let zeros = (0..3).filter(|&i| p.value(0, i) == 0.0).count() as u64;
    buf[..12].fill(0);
    assert_eq!(p.count_wrong(&coll, 1, &buf, Some(3), 0), 3 - zeros);
    // Reduce on a non-root: its buffer must be untouched (zero, or its
    // input in place).
    let coll = Collective { kind: CollKind::Reduce, nranks: 2, count: 3, root: 0, dtype };
    let p = Pattern::new(CollKind::Reduce, dtype, ReduceOp::Max, 2, 1);
    let mut buf = vec![0u8; 12];
    assert_eq!(p.count_wrong(&coll, 1, &buf, None, 0), 0);
    p.fill(1, &mut buf);
    assert_eq!(p.count_wrong(&coll, 1, &buf, Some(0), 0), 0);
    let nonzero = (0..3).filter(|&i| p.value(1, i) != 0.0).count() as u64;
    assert_eq!(p.count_wrong(&coll, 1, &buf, None, 0), nonzero);
}
