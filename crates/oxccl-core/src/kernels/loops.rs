//! The inner loops, generic over the element type and the operator.
//!
//! Operator and type are chosen once per call, by monomorphization, never
//! per element. The binary loops are plain zipped iterations (no index, no
//! bounds check) that LLVM vectorizes for any target; they are compiled
//! twice, for the baseline target (SSE2 on x86-64) and for AVX2, and the
//! `multiversion` crate picks the AVX2 copy at run time where the CPU has it
//! (one relaxed atomic load per call).
//!
//! Narrow floats (`f16`, `bf16`, FP8) go through [`wide`](super::wide):
//! blocks widened to `f32`, combined by the same `f32` loop, narrowed back
//! (rounding after each operation, as element by element).
//!
//! Why not fixed-width chunks (`as_chunks::<32>()` with an inner loop over
//! the array)? They unroll better on SSE2, but with AVX-512 enabled
//! (`-C target-cpu=native` on a recent Xeon) LLVM vectorizes the loop over
//! chunks instead, with gathers and scatters, and the f32 sum runs 9× slower.
//! The plain loop is vectorized well everywhere.

use super::binop::{BinOp, zip_into, zip2};
use super::element::Element;
use super::fp8::{F8E4M3, F8E5M2};
use super::wide;
use crate::dtype::DataType;
use crate::op::ReduceOp;
use bytemuck::{cast_slice, cast_slice_mut};
use half::{bf16, f16};
use multiversion::multiversion;
use std::ops::Range;

/// Bytes of each source kept in flight by the fused n-ary loop: every source's
/// block plus the destination's stay in L1 while the block is reduced.
pub(crate) const BLOCK_BYTES: usize = 4096;

/// What a kernel computes for a [`ReduceOp`]: `Avg` and `PreMulSum` reduce
/// as `Sum` (their division and multiplication are separate passes).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kind {
    Sum,
    Prod,
    Max,
    Min,
}

impl Kind {
    pub(crate) fn of(op: ReduceOp) -> Kind {
        match op {
            ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PreMulSum { .. } => Kind::Sum,
            ReduceOp::Prod => Kind::Prod,
            ReduceOp::Max => Kind::Max,
            ReduceOp::Min => Kind::Min,
        }
    }
}

/// Calls `$f::<$T, Op>($args)` with the operator type for `$kind`.
macro_rules! by_kind {
    ($kind:expr, $f:ident::<$T:ty>($($arg:expr),* $(,)?)) => {
        match $kind {
            Kind::Sum => $f::<$T, SumOp>($($arg),*),
            Kind::Prod => $f::<$T, ProdOp>($($arg),*),
            Kind::Max => $f::<$T, MaxOp>($($arg),*),
            Kind::Min => $f::<$T, MinOp>($($arg),*),
        }
    };
}
pub(crate) use by_kind;

/// An operator on `T` that also applies to `f32`, where narrow types compute.
pub(crate) trait Op<T>: BinOp<T> + BinOp<f32> {}
impl<T, O: BinOp<T> + BinOp<f32>> Op<T> for O {}

/// Calls `wide::$wide::<N, O>(args)` with the slices cast to the narrow
/// type `N` that `T` is, or `$plain::<T, O>` for the other types. `T::DTYPE`
/// is a constant, so each instance keeps one arm; the casts between `T` and
/// the type `DTYPE` names (then the same type) cannot fail.
macro_rules! route {
    ($T:ty, $O:ty, $plain:ident, $wide:ident, ($($cast:ident($arg:expr)),*)) => {
        match <$T>::DTYPE {
            DataType::Float16 => wide::$wide::<f16, $O>($($cast($arg)),*),
            DataType::Bfloat16 => wide::$wide::<bf16, $O>($($cast($arg)),*),
            DataType::Float8E4M3 => wide::$wide::<F8E4M3, $O>($($cast($arg)),*),
            DataType::Float8E5M2 => wide::$wide::<F8E5M2, $O>($($cast($arg)),*),
            _ => $plain::<$T, $O>($($arg),*),
        }
    };
}

/// `dst[i] = op(a[i], b[i])`; `a` and `b` have at least `dst.len()` elements.
#[inline]
pub(crate) fn map2<T: Element, O: Op<T>>(dst: &mut [T], a: &[T], b: &[T]) {
    route!(T, O, plain_map2, map2, (cast_slice_mut(dst), cast_slice(a), cast_slice(b)));
}

/// `acc[i] = op(acc[i], b[i])`; `b` has at least `acc.len()` elements.
#[inline]
pub(crate) fn map_into<T: Element, O: Op<T>>(acc: &mut [T], b: &[T]) {
    route!(T, O, plain_map_into, map_into, (cast_slice_mut(acc), cast_slice(b)));
}

#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx512dq+avx2+fma+f16c", "x86_64+avx2+fma+f16c"))]
fn plain_map2<T: Copy, O: BinOp<T>>(dst: &mut [T], a: &[T], b: &[T]) {
    zip2::<T, O>(dst, a, b);
}

#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx512dq+avx2+fma+f16c", "x86_64+avx2+fma+f16c"))]
fn plain_map_into<T: Copy, O: BinOp<T>>(acc: &mut [T], b: &[T]) {
    zip_into::<T, O>(acc, b);
}

/// `dst[i] = f(src[i])`, or `dst[i] = f(dst[i])` without a source.
#[inline]
pub(crate) fn map1<T: Copy>(dst: &mut [T], src: Option<&[T]>, f: impl Fn(T) -> T) {
    match src {
        Some(src) => {
            let src = &src[..dst.len()];
            for (d, s) in dst.iter_mut().zip(src) {
                *d = f(*s);
            }
        }
        None => {
            for d in dst.iter_mut() {
                *d = f(*d);
            }
        }
    }
}

/// `dst = src(0) op src(1) op … op src(n - 1)`, where `src(k, range)` gives
/// source `k`'s elements `range`; `n >= 1`, and every source has at least
/// `dst.len()` elements. Block by block, so that all sources' blocks stay in
/// L1: one pass over memory.
pub(crate) fn fused<'a, T: Element, O: Op<T>>(dst: &mut [T], n: usize, src: impl Fn(usize, Range<usize>) -> &'a [T]) {
    macro_rules! narrow {
        ($N:ty) => {
            wide::fused::<$N, O>(cast_slice_mut(dst), n, |k, r| cast_slice(src(k, r)))
        };
    }
    match T::DTYPE {
        DataType::Float16 => narrow!(f16),
        DataType::Bfloat16 => narrow!(bf16),
        DataType::Float8E4M3 => narrow!(F8E4M3),
        DataType::Float8E5M2 => narrow!(F8E5M2),
        _ => plain_fused::<T, O>(dst, n, src),
    }
}

/// [`fused`] for the types that compute in their own width.
fn plain_fused<'a, T: Element, O: Op<T>>(dst: &mut [T], n: usize, src: impl Fn(usize, Range<usize>) -> &'a [T]) {
    let block = BLOCK_BYTES / size_of::<T>();
    for (i, d) in dst.chunks_mut(block).enumerate() {
        let range = i * block..i * block + d.len();
        if n == 1 {
            d.copy_from_slice(src(0, range));
            continue;
        }
        plain_map2::<T, O>(d, src(0, range.clone()), src(1, range.clone()));
        for k in 2..n {
            plain_map_into::<T, O>(d, src(k, range.clone()));
        }
    }
}
