//! The host kernels against an independent reference: every type × op ×
//! length × alignment, wrap-around, rounding, NaN, avg and premul, and the
//! fused n-ary form against the chain of binary ones, bit for bit (any NaN
//! for a NaN).

use crate::common;

use common::{Buf, Ref, Rng, assert_same, random_vec, values};
use half::{bf16, f16};
use oxccl_core::kernels::{
    Element, finish_avg, finish_avg_typed, premul, premul_in_place, premul_in_place_typed, premul_typed, reduce_into,
    reduce_into_typed, reduce_n, reduce_n_typed, reduce2, reduce2_typed,
};
use oxccl_core::{DataType, F8E4M3, F8E5M2, ReduceOp};

const LENS: [usize; 9] = [0, 1, 2, 7, 31, 33, 1000, 1027, 5000];
/// Byte offsets of (dst, a, b): aligned, all misaligned, each alone.
const OFFSETS: [(usize, usize, usize); 6] = [(0, 0, 0), (1, 1, 1), (1, 0, 0), (0, 1, 0), (0, 0, 1), (3, 5, 7)];

fn every_op_against_reference<T: Ref>() {
    let mut rng = Rng::new(T::DTYPE.to_nccl() as u64 + 1);
    let t = T::DTYPE;
    for len in LENS {
        let a: Vec<T> = random_vec(&mut rng, len, false);
        let b: Vec<T> = random_vec(&mut rng, len, false);
        let c: Vec<T> = random_vec(&mut rng, len, false);
        for op in ReduceOp::ALL {
            let ctx = format!("{t} {op} len {len}");
            let ab: Vec<T> = a.iter().zip(&b).map(|(x, y)| T::reference(op, *x, *y)).collect();
            let abc: Vec<T> = ab.iter().zip(&c).map(|(x, y)| T::reference(op, *x, *y)).collect();

            let mut d = vec![T::zeroed(); len];
            reduce2_typed(op, &mut d, &a, &b).unwrap();
            assert_same(&d, &ab, &format!("{ctx} reduce2_typed"));
            let mut acc = a.clone();
            reduce_into_typed(op, &mut acc, &b).unwrap();
            assert_same(&acc, &ab, &format!("{ctx} reduce_into_typed"));
            reduce_n_typed(op, &mut d, &[&a, &b, &c]).unwrap();
            assert_same(&d, &abc, &format!("{ctx} reduce_n_typed"));

            for (od, oa, ob) in OFFSETS {
                let ctx = format!("{ctx} offsets {od}/{oa}/{ob}");
                let (ba, bb, bc) = (Buf::new(&a, oa), Buf::new(&b, ob), Buf::new(&c, oa));
                let mut dst = Buf::filled(len * t.size(), od, 0xA5);
                reduce2(t, op, dst.bytes_mut(), ba.bytes(), bb.bytes()).unwrap();
                assert_same(&dst.values::<T>(), &ab, &format!("{ctx} reduce2"));

                let mut acc = Buf::new(&a, od);
                reduce_into(t, op, acc.bytes_mut(), bb.bytes()).unwrap();
                assert_same(&acc.values::<T>(), &ab, &format!("{ctx} reduce_into"));

                let srcs = [ba.bytes(), bb.bytes(), bc.bytes()];
                reduce_n(t, op, dst.bytes_mut(), &srcs).unwrap();
                assert_same(&dst.values::<T>(), &abc, &format!("{ctx} reduce_n"));
            }
        }
    }
}

#[test]
fn every_type_and_op_matches_the_reference_at_any_length_and_alignment() {
    for_all_types!(every_op_against_reference);
}

/// `reduce_n` over 1..=5 sources equals `reduce2` then `reduce_into` of each
/// further source, bit for bit (a NaN for a NaN: which one an addition
/// passes on depends on operand order, which the compiler may commute), on
/// arbitrary bit patterns (NaN included),
/// aligned or not, across several 4 KiB blocks.
fn fused_equals_chain<T: Ref>() {
    let mut rng = Rng::new(1000 + T::DTYPE.to_nccl() as u64);
    let t = T::DTYPE;
    for len in [33, 1027, 5000] {
        let srcs: Vec<Vec<T>> = (0..5).map(|_| random_vec(&mut rng, len, true)).collect();
        for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min] {
            for n in 1..=5 {
                for offset in [0, 1] {
                    let bufs: Vec<Buf> = srcs[..n].iter().map(|s| Buf::new(s, offset)).collect();
                    let refs: Vec<&[u8]> = bufs.iter().map(Buf::bytes).collect();
                    let mut chain = Buf::new(&srcs[0], 0);
                    if n > 1 {
                        reduce2(t, op, chain.bytes_mut(), refs[0], refs[1]).unwrap();
                    }
                    for s in refs.iter().skip(2) {
                        reduce_into(t, op, chain.bytes_mut(), s).unwrap();
                    }
                    let mut fused = Buf::filled(len * t.size(), offset, 0);
                    reduce_n(t, op, fused.bytes_mut(), &refs).unwrap();
                    let ctx = format!("{t} {op} len {len} n {n} offset {offset}");
                    assert_same(&fused.values::<T>(), &chain.values::<T>(), &ctx);
                    let typed: Vec<&[T]> = srcs[..n].iter().map(Vec::as_slice).collect();
                    let mut d = vec![T::zeroed(); len];
                    reduce_n_typed(op, &mut d, &typed).unwrap();
                    assert_same(&d, &chain.values::<T>(), &ctx);
                }
            }
        }
    }
}

#[test]
fn reduce_n_is_bit_identical_to_a_chain_of_reduce2_for_every_type() {
    for_all_types!(fused_equals_chain);
}

#[test]
fn integers_wrap() {
    let mut d = [0i8; 2];
    reduce2_typed(ReduceOp::Sum, &mut d, &[127, -128], &[1, -1]).unwrap();
    assert_eq!(d, [-128, 127]);
    let mut u = [255u8, 16];
    reduce_into_typed(ReduceOp::Prod, &mut u, &[2, 16]).unwrap();
    assert_eq!(u, [254, 0]);
    let mut i = [i32::MAX, i32::MIN];
    reduce_into_typed(ReduceOp::Sum, &mut i, &[1, -1]).unwrap();
    assert_eq!(i, [i32::MIN, i32::MAX]);
    let mut l = [i64::MIN, 3];
    reduce_into_typed(ReduceOp::Prod, &mut l, &[-1, i64::MAX]).unwrap();
    assert_eq!(l, [i64::MIN, i64::MAX.wrapping_mul(3)]);
    let mut q = [u64::MAX, u32::MAX as u64];
    reduce_into_typed(ReduceOp::Sum, &mut q, &[2, 1]).unwrap();
    assert_eq!(q, [1, 1 << 32]);
    let mut w = [u32::MAX];
    reduce_into_typed(ReduceOp::Prod, &mut w, &[u32::MAX]).unwrap();
    assert_eq!(w, [1]);
}

/// `1 + h` where `h` is half an ulp of 1 is a tie: to even gives 1; `(1 + u)
/// + h` is a tie between an odd and an even mantissa: to even goes up.
fn ties_to_even<T: Element + PartialEq + std::fmt::Debug>(from: impl Fn(f64) -> T, ulp_of_one: f64) {
    let (one, h) = (from(1.0), from(ulp_of_one / 2.0));
    let up = from(1.0 + ulp_of_one);
    let mut d = [one, up];
    reduce_into_typed(ReduceOp::Sum, &mut d, &[h, h]).unwrap();
    assert_eq!(d, [one, from(1.0 + 2.0 * ulp_of_one)], "{}", T::DTYPE);
    // Rounding after each operation: 1 + h + h stays 1 (one rounding of the
    // f32 sum would give 1 + ulp), in the fused form as in the chain.
    let mut f = [from(0.0)];
    reduce_n_typed(ReduceOp::Sum, &mut f, &[&[one], &[h], &[h]]).unwrap();
    assert_eq!(f, [one], "{} per-op rounding", T::DTYPE);
    let mut g = [from(0.0)];
    reduce_n_typed(ReduceOp::Sum, &mut g, &[&[h], &[h], &[one]]).unwrap();
    assert_eq!(g, [from(1.0 + ulp_of_one)], "{} h + h is exact", T::DTYPE);
}

#[test]
fn narrow_floats_round_to_nearest_even_after_each_operation() {
    ties_to_even(common::round_f16, 2f64.powi(-10));
    ties_to_even(common::round_bf16, 2f64.powi(-7));
    ties_to_even(F8E4M3::from_f64, 2f64.powi(-3));
    ties_to_even(F8E5M2::from_f64, 2f64.powi(-2));
}

#[test]
fn fp8_sums_saturate() {
    let mut d = [F8E4M3::MAX, F8E4M3::from_f32(-300.0)];
    reduce_into_typed(ReduceOp::Sum, &mut d, &[F8E4M3::MAX, F8E4M3::from_f32(-300.0)]).unwrap();
    assert_eq!(d.map(F8E4M3::to_bits), [0x7E, 0xFE]);
    let mut e = [F8E5M2::MAX];
    reduce_into_typed(ReduceOp::Prod, &mut e, &[F8E5M2::from_f32(2.0)]).unwrap();
    assert_eq!(e[0].to_bits(), 0x7B);
    reduce_into_typed(ReduceOp::Sum, &mut e, &[F8E5M2::INFINITY]).unwrap();
    assert_eq!(e[0].to_bits(), 0x7C, "E5M2 keeps infinity");
}

#[test]
fn max_and_min_skip_nan_and_sum_propagates_it() {
    let nan = f32::NAN;
    let mut d = [0f32; 4];
    reduce2_typed(ReduceOp::Max, &mut d, &[nan, 1.0, nan, -0.0], &[1.0, nan, nan, 0.0]).unwrap();
    assert_eq!(&d[..2], &[1.0, 1.0]);
    assert!(d[2].is_nan());
    assert!(d[3] == 0.0 && d[3].is_sign_positive(), "+0 against -0: +0");
    // Either order: the same bits (the deterministic mode's order fixes the
    // tree, not which operand comes first).
    for (x, y) in [(0.0f32, -0.0f32), (-0.0, 0.0)] {
        let (mut mx, mut mn) = ([0f32], [0f32]);
        reduce2_typed(ReduceOp::Max, &mut mx, &[x], &[y]).unwrap();
        reduce2_typed(ReduceOp::Min, &mut mn, &[x], &[y]).unwrap();
        assert_eq!((mx[0].to_bits(), mn[0].to_bits()), (0, 0x8000_0000), "max/min of {x} and {y}");
        let (mut h, mut e) = ([f16::from_f32(x)], [F8E5M2::from_f32(x)]);
        reduce_into_typed(ReduceOp::Max, &mut h, &[f16::from_f32(y)]).unwrap();
        reduce_into_typed(ReduceOp::Min, &mut e, &[F8E5M2::from_f32(y)]).unwrap();
        assert_eq!((h[0].to_bits(), e[0].to_bits()), (0, 0x80), "f16 max, e5m2 min of {x} and {y}");
    }
    reduce2_typed(ReduceOp::Min, &mut d, &[nan, 2.0, 5.0, 1.0], &[2.0, nan, 3.0, 1.0]).unwrap();
    assert_eq!(d, [2.0, 2.0, 3.0, 1.0]);
    reduce2_typed(ReduceOp::Sum, &mut d, &[nan, 1.0, 1.0, 1.0], &[1.0, 1.0, 1.0, 1.0]).unwrap();
    assert!(d[0].is_nan() && d[1] == 2.0);
    let mut h = [f16::NAN, f16::ONE];
    reduce_into_typed(ReduceOp::Max, &mut h, &[f16::ONE, f16::NAN]).unwrap();
    assert_eq!(h, [f16::ONE, f16::ONE]);
    let mut e = [F8E4M3::NAN, F8E4M3::from_f32(2.0)];
    reduce_into_typed(ReduceOp::Min, &mut e, &[F8E4M3::from_f32(3.0), F8E4M3::NAN]).unwrap();
    assert_eq!(e.map(F8E4M3::to_f32), [3.0, 2.0]);
}

#[test]
fn finish_avg_divides_floats_and_truncates_integers() {
    let mut i = [7i32, -7, 8, i32::MIN];
    finish_avg_typed(&mut i, 2).unwrap();
    assert_eq!(i, [3, -3, 4, i32::MIN / 2]);
    let mut b: Vec<u8> = [-7i8, 127, -128].iter().flat_map(|x| x.to_ne_bytes()).collect();
    finish_avg(DataType::Int8, &mut b, 200).unwrap();
    assert_eq!(values::<i8>(&b), [0, 0, 0]);
    let mut m = [i8::MIN, -1];
    finish_avg_typed(&mut m, usize::MAX).unwrap();
    assert_eq!(m, [0, 0]);
    let mut u = [u64::MAX];
    finish_avg_typed(&mut u, 3).unwrap();
    assert_eq!(u, [u64::MAX / 3]);
    let mut l = [i64::MIN, i64::MAX];
    finish_avg_typed(&mut l, 7).unwrap();
    assert_eq!(l, [i64::MIN / 7, i64::MAX / 7]);
    // Division, not multiplication by the rounded reciprocal: for 5 and 7
    // they differ, in f32 as in f64.
    let mut f = Buf::new(&[3.0f32, 5.0, 7.0], 1);
    finish_avg(DataType::Float32, f.bytes_mut(), 3).unwrap();
    assert_eq!(f.values::<f32>(), [1.0, 5.0f32 / 3.0, 7.0f32 / 3.0]);
    assert_ne!(5.0f32 / 3.0, 5.0 * (1.0f32 / 3.0));
    let mut g = [5.0f64, 7.0];
    finish_avg_typed(&mut g, 3).unwrap();
    assert_eq!(g, [5.0 / 3.0, 7.0 / 3.0]);
    assert_ne!(7.0 / 3.0, 7.0 * (1.0f64 / 3.0));
    let mut h = [f16::from_f32(3.0), f16::from_f32(1.0)];
    finish_avg_typed(&mut h, 3).unwrap();
    assert_eq!(h, [f16::ONE, common::round_f16(1.0 / 3.0)]);
    let mut e = [F8E4M3::from_f32(448.0)];
    finish_avg_typed(&mut e, 4).unwrap();
    assert_eq!(e[0].to_f32(), 112.0);
}

#[test]
fn premul_converts_the_scalar_to_the_element_type_first() {
    let mut i = [0i32; 3];
    premul_typed(&mut i, &[10, -10, 3], 2.9).unwrap();
    assert_eq!(i, [20, -20, 6], "2.9 truncates to 2");
    let mut u = [0u8; 2];
    premul_typed(&mut u, &[1, 2], 300.0).unwrap();
    assert_eq!(u, [255, 254], "300 saturates to 255, then the product wraps");
    let mut n = [5i8];
    premul_typed(&mut n, &[5], -1.5).unwrap();
    assert_eq!(n, [-5]);
    // f16: the scalar 1 + 2^-11 + 2^-13 rounds to 1 + 2^-10 first.
    let s = 1.0 + 2f64.powi(-11) + 2f64.powi(-13);
    let mut h = [f16::ZERO];
    premul_typed(&mut h, &[f16::from_f32(3.0)], s).unwrap();
    assert_eq!(h[0].to_f64(), common::round_f16(3.0 * (1.0 + 2f64.powi(-10))).to_f64());
    assert_ne!(common::round_f16(3.0 * s), h[0]);
    // A scalar that `half`'s `from_f64` misrounds (1 + 2^-11 + 2^-40 is above
    // the midpoint 1 + 2^-11, but not once rounded to f32): f16 1 + 2^-10.
    let s = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
    let mut one = [f16::ONE];
    premul_in_place_typed(&mut one, s).unwrap();
    assert_eq!(one[0].to_f64(), 1.0 + 2f64.powi(-10));
    let mut b = [bf16::ONE];
    premul_in_place_typed(&mut b, 1.0 + 2f64.powi(-8) + 2f64.powi(-40)).unwrap();
    assert_eq!(b[0].to_f64(), 1.0 + 2f64.powi(-7));
    let mut f = Buf::new(&[1.5f32, -2.0], 1);
    premul_in_place(DataType::Float32, f.bytes_mut(), 0.1).unwrap();
    assert_eq!(f.values::<f32>(), [1.5 * 0.1f32, -2.0 * 0.1f32]);
    let src = Buf::new(&[1.5f64], 3);
    let mut dst = Buf::filled(8, 1, 0);
    premul(DataType::Float64, dst.bytes_mut(), src.bytes(), 0.1).unwrap();
    assert_eq!(dst.values::<f64>(), [1.5 * 0.1]);
    let mut e = [F8E5M2::ZERO];
    premul_typed(&mut e, &[F8E5M2::MAX], 4.0).unwrap();
    assert_eq!(e[0].to_bits(), 0x7B, "saturates");
}

#[test]
fn avg_and_premulsum_reduce_as_sum() {
    let scaled = ReduceOp::PreMulSum { scalar: 7.0 };
    for op in [ReduceOp::Avg, scaled] {
        let mut d = [0f32; 2];
        reduce2_typed(op, &mut d, &[1.0, 2.0], &[3.0, 4.0]).unwrap();
        assert_eq!(d, [4.0, 6.0], "{op}");
    }
}
