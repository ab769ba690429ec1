//! The typed entry points, for callers that hold `&[T]`, and the argument
//! checks shared with the byte entry points.

use super::binop::{MaxOp, MinOp, ProdOp, SumOp};
use super::element::Element;
use super::loops::{Kind, by_kind, fused, map_into, map1, map2};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::op::ReduceOp;

/// The error for slices of unequal lengths.
pub(crate) fn mismatch(what: &str, op: ReduceOp, dtype: DataType, unit: &str, lens: &[(&str, usize)]) -> Error {
    let lens: Vec<String> = lens.iter().map(|(n, l)| format!("{n} has {l} {unit}")).collect();
    Error::invalid(format!(
        "{what} {op} on {dtype}: operands differ in length ({}); they must be equal",
        lens.join(", ")
    ))
}

/// `dst = a op b`, element by element. Errors (changing nothing) unless the
/// three slices have the same length.
pub fn reduce2_typed<T: Element>(op: ReduceOp, dst: &mut [T], a: &[T], b: &[T]) -> Result<()> {
    if a.len() != dst.len() || b.len() != dst.len() {
        let lens = [("dst", dst.len()), ("a", a.len()), ("b", b.len())];
        return Err(mismatch("reduce2", op, T::DTYPE, "elements", &lens));
    }
    by_kind!(Kind::of(op), map2::<T>(dst, a, b));
    Ok(())
}

/// `acc = acc op b`, element by element. Errors (changing nothing) unless the
/// slices have the same length.
pub fn reduce_into_typed<T: Element>(op: ReduceOp, acc: &mut [T], b: &[T]) -> Result<()> {
    if b.len() != acc.len() {
        let lens = [("acc", acc.len()), ("b", b.len())];
        return Err(mismatch("reduce_into", op, T::DTYPE, "elements", &lens));
    }
    by_kind!(Kind::of(op), map_into::<T>(acc, b));
    Ok(())
}

/// `dst = srcs[0] op srcs[1] op …` in one pass over memory (blocks of
/// 4 KiB per source), bit for bit (a NaN for a NaN) the result of the
/// chain of [`reduce2_typed`] calls. Errors (changing nothing) without a source or
/// unless every slice has `dst`'s length.
pub fn reduce_n_typed<T: Element>(op: ReduceOp, dst: &mut [T], srcs: &[&[T]]) -> Result<()> {
    check_n(op, T::DTYPE, "elements", dst.len(), srcs.iter().map(|s| s.len()))?;
    let src = |k: usize, r: std::ops::Range<usize>| &srcs[k][r];
    by_kind!(Kind::of(op), fused::<T>(dst, srcs.len(), src));
    Ok(())
}

/// Checks that there is a source and every source has `dst_len` units.
pub(crate) fn check_n(
    op: ReduceOp,
    dtype: DataType,
    unit: &str,
    dst_len: usize,
    lens: impl ExactSizeIterator<Item = usize> + Clone,
) -> Result<()> {
    if lens.len() == 0 {
        return Err(Error::invalid(format!("reduce_n {op} on {dtype}: no source; at least one is needed")));
    }
    if let Some((i, l)) = lens.clone().enumerate().find(|&(_, l)| l != dst_len) {
        return Err(Error::invalid(format!(
            "reduce_n {op} on {dtype}: dst has {dst_len} {unit} but source {i} has {l}; \
             every source must have dst's length"
        )));
    }
    Ok(())
}

/// Checks an [`finish_avg`](super::finish_avg) rank count.
pub(crate) fn check_nranks(dtype: DataType, nranks: usize) -> Result<()> {
    if nranks == 0 {
        return Err(Error::invalid(format!(
            "finish_avg on {dtype}: nranks is 0; the average of no ranks is undefined"
        )));
    }
    Ok(())
}

/// Checks a [`premul`](super::premul) scalar.
pub(crate) fn check_scalar(dtype: DataType, scalar: f64) -> Result<()> {
    ReduceOp::PreMulSum { scalar }.check(dtype)
}

/// Turns a sum of `nranks` contributions into their average, in place:
/// `buf[i] /= nranks` (see the [module doc](super) for the rounding).
pub fn finish_avg_typed<T: Element>(buf: &mut [T], nranks: usize) -> Result<()> {
    check_nranks(T::DTYPE, nranks)?;
    map1(buf, None, |x: T| x.div_count(nranks));
    Ok(())
}

/// `dst = src × scalar`, the scalar first converted to `T`: the step before
/// the sum of [`ReduceOp::PreMulSum`]. Errors (changing nothing) on a
/// non-finite scalar or unequal lengths.
pub fn premul_typed<T: Element>(dst: &mut [T], src: &[T], scalar: f64) -> Result<()> {
    check_scalar(T::DTYPE, scalar)?;
    if src.len() != dst.len() {
        let op = ReduceOp::PreMulSum { scalar };
        let lens = [("dst", dst.len()), ("src", src.len())];
        return Err(mismatch("premul", op, T::DTYPE, "elements", &lens));
    }
    let s = T::from_scalar(scalar);
    map1(dst, Some(src), |x: T| x.prod(s));
    Ok(())
}

/// `buf = buf × scalar` in place (see [`premul_typed`]).
pub fn premul_in_place_typed<T: Element>(buf: &mut [T], scalar: f64) -> Result<()> {
    check_scalar(T::DTYPE, scalar)?;
    let s = T::from_scalar(scalar);
    map1(buf, None, |x: T| x.prod(s));
    Ok(())
}
