//! Host reduction kernels: every [`DataType`] × [`ReduceOp`], on byte
//! buffers ([`reduce2`], [`reduce_into`], [`reduce_n`]) or typed slices
//! ([`reduce2_typed`] …, for the [`Element`] types).
//!
//! ```
//! use oxccl_core::{DataType, ReduceOp, kernels};
//! let mut acc = [1.0f32, 2.0, 3.0];
//! kernels::reduce_into_typed(ReduceOp::Sum, &mut acc, &[10.0, 20.0, 30.0]).unwrap();
//! assert_eq!(acc, [11.0, 22.0, 33.0]);
//!
//! // The same on bytes, as an executor holds them; then average over 2 ranks.
//! let mut buf: Vec<u8> = acc.iter().flat_map(|x| x.to_ne_bytes()).collect();
//! kernels::finish_avg(DataType::Float32, &mut buf, 2).unwrap();
//! assert_eq!(&buf[..4], &5.5f32.to_ne_bytes());
//! ```
//!
//! # Semantics
//!
//! - **Integers**: `sum` and `prod` wrap (two's complement), as in C on the
//!   GPU. `max`/`min` are the obvious ones.
//! - **`max`/`min` on floats** follow CUDA's `fmaxf`/`fminf` (IEEE
//!   `maxNum`): a NaN operand is ignored in favour of the other one; only
//!   two NaNs give NaN (the first). `+0` against `-0` gives `+0` for `max`
//!   and `-0` for `min` whichever comes first, so a reduction's result does
//!   not depend on the order of its operands (the deterministic mode fixes
//!   the tree; this makes the operand order within a node irrelevant). `sum` and `prod` propagate NaN as IEEE arithmetic does;
//!   which NaN (sign, payload) comes out is unspecified (the compiler may
//!   commute an addition's operands), and FP8 has one NaN code, `0x7F`.
//! - **`f16`, `bf16` and the FP8 types** ([`F8E4M3`], [`F8E5M2`]) are
//!   widened to `f32`, combined, and rounded back to nearest even after
//!   **each** binary operation, as a GPU kernel applying `__hadd` one
//!   operation at a time does. (`f32` has more than twice their precision,
//!   so this equals the correctly rounded operation in the narrow type.) The
//!   fused [`reduce_n`] rounds after each source too, so its result is bit
//!   for bit the one of the chain of [`reduce2`] calls (a NaN for a NaN);
//!   it is one pass over memory, not one rounding. FP8 results saturate to the largest finite
//!   value on overflow (see [`fp8`]).
//! - **`Avg`** reduces as `Sum`: a kernel does not know the number of ranks.
//!   [`finish_avg`] divides the final sum by it: floats divide (`x / n`,
//!   correctly rounded, not `x × (1/n)`; narrow floats in `f32`, rounded
//!   once), integers truncate toward zero (as NCCL does for integer
//!   averages).
//! - **`PreMulSum`** reduces as `Sum`; [`premul`] is the multiplication by the
//!   rank's scalar that comes before. The scalar is first converted to the
//!   element type (floats round to nearest; integers truncate toward zero and
//!   saturate at the type's bounds), then multiplied with the type's `prod`.
//!
//! # Errors and alignment
//!
//! Every buffer of a call must have the same length, a multiple of the
//! element size; otherwise the call returns an error naming the lengths, the
//! type and the operator, and writes nothing. Byte buffers need no alignment:
//! aligned ones are reduced in place, misaligned ones through aligned stack
//! blocks (slower, same results). Elements are in the machine's byte order.
//!
//! # Speed
//!
//! The loops are written for the compiler to vectorize (operator and type
//! chosen once per call, plain loops without bounds checks) and built three
//! times on x86-64: for the baseline (SSE2), for AVX2 and for AVX-512 (F,
//! BW, VL, DQ), the widest the CPU has chosen at run time. The
//! f32 sum runs at the speed of `a[i] += b[i]` built by `gcc -O3
//! -march=native` (`tools/bench-kernels` compares them). [`reduce_n`] walks
//! the data in 4 KiB blocks so that all sources' blocks stay in L1: one pass
//! over memory for any number of sources.

mod binop;
mod bytes;
mod element;
pub mod fp8;
mod loops;
mod round;
mod typed;
mod wide;

pub use element::Element;
pub use fp8::{F8E4M3, F8E5M2};
pub use typed::{
    finish_avg_typed, premul_in_place_typed, premul_typed, reduce_into_typed, reduce_n_typed, reduce2_typed,
};

use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::op::ReduceOp;
use loops::Kind;
use typed::{check_n, check_nranks, check_scalar, mismatch};

use crate::with_element_type as dispatch;

/// Checks that byte buffers of lengths `lens` (the first is the destination)
/// are equal in length and hold whole elements of `dtype`.
#[inline]
fn check_bytes(what: &str, op: ReduceOp, dtype: DataType, lens: &[(&str, usize)]) -> Result<()> {
    let dst = lens[0].1;
    // Sizes are powers of two: a mask rather than a division, on a path
    // every call takes.
    if lens.iter().all(|&(_, l)| l == dst) && dst & (dtype.size() - 1) == 0 {
        return Ok(());
    }
    Err(bytes_error(what, op, dtype, lens))
}

/// The error [`check_bytes`] found.
#[cold]
#[inline(never)]
fn bytes_error(what: &str, op: ReduceOp, dtype: DataType, lens: &[(&str, usize)]) -> Error {
    let dst = lens[0].1;
    if lens.iter().any(|&(_, l)| l != dst) {
        return mismatch(what, op, dtype, "bytes", lens);
    }
    Error::invalid(format!(
        "{what} {op} on {dtype}: buffers of {dst} bytes are not a whole number of \
         {}-byte elements",
        dtype.size()
    ))
}

/// `dst = a op b`, element by element, on buffers of `dtype` elements.
///
/// `Avg` and `PreMulSum` reduce as `Sum` (see the [module doc](self)).
/// Errors, leaving `dst` unchanged, unless the three buffers have the same
/// length, a multiple of `dtype.size()`.
pub fn reduce2(dtype: DataType, op: ReduceOp, dst: &mut [u8], a: &[u8], b: &[u8]) -> Result<()> {
    let lens = [("dst", dst.len()), ("a", a.len()), ("b", b.len())];
    check_bytes("reduce2", op, dtype, &lens)?;
    dispatch!(dtype, T => bytes::reduce2::<T>(Kind::of(op), dst, a, b));
    Ok(())
}

/// `acc = acc op b`, element by element: the accumulating form executors
/// use. Same rules as [`reduce2`].
pub fn reduce_into(dtype: DataType, op: ReduceOp, acc: &mut [u8], b: &[u8]) -> Result<()> {
    check_bytes("reduce_into", op, dtype, &[("acc", acc.len()), ("b", b.len())])?;
    dispatch!(dtype, T => bytes::reduce_into::<T>(Kind::of(op), acc, b));
    Ok(())
}

/// `dst = srcs[0] op srcs[1] op …` in one pass over memory (4 KiB blocks of
/// every source at a time), with the results, bit for bit (a NaN for a
/// NaN), of the chain `reduce2(srcs[0], srcs[1])`, then `reduce_into` of
/// each further source.
/// One source copies it. Errors, leaving `dst` unchanged, without a source or
/// unless every buffer has `dst`'s length, a multiple of `dtype.size()`.
pub fn reduce_n(dtype: DataType, op: ReduceOp, dst: &mut [u8], srcs: &[&[u8]]) -> Result<()> {
    check_n(op, dtype, "bytes", dst.len(), srcs.iter().map(|s| s.len()))?;
    check_bytes("reduce_n", op, dtype, &[("dst", dst.len())])?;
    dispatch!(dtype, T => bytes::reduce_n::<T>(Kind::of(op), dst, srcs));
    Ok(())
}

/// Turns the sum of `nranks` contributions in `buf` into their average, in
/// place: floats divide by `nranks`, integers divide truncating toward zero.
/// Errors, changing nothing, if `nranks` is 0 or `buf` does not hold whole
/// elements.
pub fn finish_avg(dtype: DataType, buf: &mut [u8], nranks: usize) -> Result<()> {
    check_nranks(dtype, nranks)?;
    check_bytes("finish_avg", ReduceOp::Avg, dtype, &[("buf", buf.len())])?;
    dispatch!(dtype, T => bytes::unary::<T>(buf, None, |x: T| x.div_count(nranks)));
    Ok(())
}

/// `dst = src × scalar`, the scalar first converted to `dtype` (see the
/// [module doc](self)): the multiplication `PreMulSum` applies to each rank's
/// input before the sum. Errors, leaving `dst` unchanged, on a non-finite
/// scalar or buffers of different or partial-element lengths.
pub fn premul(dtype: DataType, dst: &mut [u8], src: &[u8], scalar: f64) -> Result<()> {
    check_scalar(dtype, scalar)?;
    let op = ReduceOp::PreMulSum { scalar };
    check_bytes("premul", op, dtype, &[("dst", dst.len()), ("src", src.len())])?;
    dispatch!(dtype, T => {
        let s = T::from_scalar(scalar);
        bytes::unary::<T>(dst, Some(src), |x: T| x.prod(s))
    });
    Ok(())
}

/// `buf = buf × scalar` in place (see [`premul`]).
pub fn premul_in_place(dtype: DataType, buf: &mut [u8], scalar: f64) -> Result<()> {
    check_scalar(dtype, scalar)?;
    let op = ReduceOp::PreMulSum { scalar };
    check_bytes("premul", op, dtype, &[("buf", buf.len())])?;
    dispatch!(dtype, T => {
        let s = T::from_scalar(scalar);
        bytes::unary::<T>(buf, None, |x: T| x.prod(s))
    });
    Ok(())
}
