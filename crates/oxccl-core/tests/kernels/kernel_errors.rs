//! Bad input gets an error that names the problem, and changes nothing.

use half::bf16;
use oxccl_core::kernels::{
    finish_avg, finish_avg_typed, premul, premul_in_place, premul_typed, reduce_into, reduce_into_typed, reduce_n,
    reduce_n_typed, reduce2, reduce2_typed,
};
use oxccl_core::{DataType, Error, ReduceOp};

/// Asserts an invalid-argument error whose message holds every `needle`.
#[track_caller]
fn assert_names(r: oxccl_core::Result<()>, needles: &[&str]) {
    let e = r.expect_err("bad input must be refused");
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    let msg = e.to_string();
    for n in needles {
        assert!(msg.contains(n), "{msg:?} should name {n:?}");
    }
}

const POISON: u8 = 0xAB;

#[test]
fn byte_lengths_that_differ_are_refused_and_dst_is_untouched() {
    let (t, op) = (DataType::Float32, ReduceOp::Max);
    let mut dst = [POISON; 12];
    let r = reduce2(t, op, &mut dst, &[0; 12], &[0; 8]);
    assert_names(r, &["reduce2", "max", "float", "dst has 12 bytes", "b has 8 bytes"]);
    assert_eq!(dst, [POISON; 12]);
    let r = reduce2(t, op, &mut dst, &[0; 16], &[0; 12]);
    assert_names(r, &["a has 16 bytes"]);
    let r = reduce_into(DataType::Int64, ReduceOp::Sum, &mut dst, &[0; 24]);
    assert_names(r, &["reduce_into", "int64", "acc has 12 bytes", "b has 24 bytes"]);
    assert_eq!(dst, [POISON; 12]);
    let r = reduce_n(t, ReduceOp::Prod, &mut dst, &[&[0; 12], &[0; 12], &[0; 4]]);
    assert_names(r, &["reduce_n", "prod", "float", "source 2 has 4"]);
    assert_eq!(dst, [POISON; 12]);
    let r = premul(t, &mut dst, &[0; 8], 2.0);
    assert_names(r, &["premul", "src has 8 bytes"]);
    assert_eq!(dst, [POISON; 12]);
}

#[test]
fn partial_elements_are_refused_and_dst_is_untouched() {
    let mut dst = [POISON; 7];
    let r = reduce2(DataType::Float32, ReduceOp::Sum, &mut dst, &[0; 7], &[0; 7]);
    assert_names(r, &["reduce2", "sum", "float", "7 bytes", "4-byte"]);
    let r = reduce_into(DataType::Bfloat16, ReduceOp::Min, &mut dst, &[0; 7]);
    assert_names(r, &["bfloat16", "min", "2-byte"]);
    let r = reduce_n(DataType::Float64, ReduceOp::Avg, &mut dst, &[&[0; 7]]);
    assert_names(r, &["reduce_n", "avg", "double", "8-byte"]);
    let r = finish_avg(DataType::Int32, &mut dst, 2);
    assert_names(r, &["finish_avg", "int32", "7 bytes"]);
    let r = premul_in_place(DataType::Uint64, &mut dst, 2.0);
    assert_names(r, &["premul", "uint64", "7 bytes"]);
    assert_eq!(dst, [POISON; 7]);
    // One-byte types hold any length.
    let mut ok = [1u8; 7];
    reduce_into(DataType::Uint8, ReduceOp::Sum, &mut ok, &[1; 7]).unwrap();
    assert_eq!(ok, [2; 7]);
}

#[test]
fn no_source_zero_ranks_and_non_finite_scalars_are_refused() {
    let mut dst = [POISON; 8];
    let r = reduce_n(DataType::Float32, ReduceOp::Sum, &mut dst, &[]);
    assert_names(r, &["reduce_n", "no source"]);
    let r = finish_avg(DataType::Float32, &mut dst, 0);
    assert_names(r, &["finish_avg", "nranks is 0"]);
    for s in [f64::NAN, f64::INFINITY] {
        let r = premul(DataType::Float16, &mut dst, &[0; 8], s);
        assert_names(r, &["premulsum", "half", "not finite"]);
        let r = premul_in_place(DataType::Int8, &mut dst, s);
        assert_names(r, &["int8", "not finite"]);
    }
    assert_eq!(dst, [POISON; 8]);
}

#[test]
fn typed_forms_name_element_counts() {
    let mut d = [1.0f32; 3];
    let r = reduce2_typed(ReduceOp::Sum, &mut d, &[0.0; 3], &[0.0; 2]);
    assert_names(r, &["reduce2", "float", "b has 2 elements", "dst has 3 elements"]);
    let r = reduce_into_typed(ReduceOp::Sum, &mut d, &[0.0; 4]);
    assert_names(r, &["acc has 3 elements", "b has 4 elements"]);
    let r = reduce_n_typed::<f32>(ReduceOp::Sum, &mut d, &[]);
    assert_names(r, &["no source"]);
    let r = reduce_n_typed(ReduceOp::Sum, &mut d, &[&[0.0; 3], &[0.0; 1]]);
    assert_names(r, &["source 1 has 1"]);
    let r = premul_typed(&mut d, &[0.0; 2], 1.0);
    assert_names(r, &["premul", "src has 2 elements"]);
    let r = finish_avg_typed(&mut d, 0);
    assert_names(r, &["nranks is 0"]);
    assert_eq!(d, [1.0; 3]);
    let mut h = [bf16::ONE];
    assert_names(premul_typed(&mut h, &[bf16::ONE], f64::NAN), &["bfloat16"]);
    assert_eq!(h, [bf16::ONE]);
}

#[test]
fn empty_buffers_are_fine() {
    for t in DataType::ALL {
        for op in ReduceOp::ALL {
            reduce2(t, op, &mut [], &[], &[]).unwrap();
            reduce_into(t, op, &mut [], &[]).unwrap();
            reduce_n(t, op, &mut [], &[&[], &[]]).unwrap();
        }
        finish_avg(t, &mut [], 3).unwrap();
        premul(t, &mut [], &[], 0.5).unwrap();
    }
    // ... and a length error is still an error when dst is empty.
    assert!(reduce2(DataType::Int8, ReduceOp::Sum, &mut [], &[], &[1]).is_err());
}
