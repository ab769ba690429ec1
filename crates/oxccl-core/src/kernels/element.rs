//! [`Element`]: what the kernels need of an element type, for the twelve
//! types of [`DataType`].

use super::fp8::{F8E4M3, F8E5M2};
use super::round::{bf16_to_f32, f32_to_bf16, f64_to_f32_odd};
use crate::dtype::DataType;
use bytemuck::Pod;
use half::{bf16, f16};
use std::fmt::Debug;

/// An element type the host kernels reduce: one per [`DataType`].
///
/// The operations are the kernels' semantics, element by element (see the
/// [module doc](super) for the rules: wrapping integers, `max`/`min` that
/// skip NaN, narrow floats computed in `f32` and rounded after each
/// operation).
pub trait Element: Pod + Debug + Send + Sync + 'static {
    /// The [`DataType`] whose elements this type holds.
    const DTYPE: DataType;
    /// `a + b`.
    fn sum(self, b: Self) -> Self;
    /// `a × b`.
    fn prod(self, b: Self) -> Self;
    /// The larger of `a` and `b`.
    fn max(self, b: Self) -> Self;
    /// The smaller of `a` and `b`.
    fn min(self, b: Self) -> Self;
    /// `self / n`, for [`ReduceOp::Avg`](crate::ReduceOp::Avg); `n >= 1`.
    fn div_count(self, n: usize) -> Self;
    /// A pre-multiplication scalar converted to this type.
    fn from_scalar(s: f64) -> Self;
}

macro_rules! int_element {
    ($t:ty, $dtype:ident, $wide:ty) => {
        impl Element for $t {
            const DTYPE: DataType = DataType::$dtype;
            #[inline(always)]
            fn sum(self, b: Self) -> Self {
                self.wrapping_add(b)
            }
            #[inline(always)]
            fn prod(self, b: Self) -> Self {
                self.wrapping_mul(b)
            }
            #[inline(always)]
            fn max(self, b: Self) -> Self {
                Ord::max(self, b)
            }
            #[inline(always)]
            fn min(self, b: Self) -> Self {
                Ord::min(self, b)
            }
            #[inline]
            fn div_count(self, n: usize) -> Self {
                // Truncating division in a type wide enough for both; a count
                // beyond it leaves a quotient of 0 (or -1 for the minimum).
                let n = <$wide>::try_from(n).unwrap_or(<$wide>::MAX);
                (<$wide>::from(self) / n) as $t
            }
            #[inline]
            fn from_scalar(s: f64) -> Self {
                // Truncates toward zero and saturates at the type's bounds.
                s as $t
            }
        }
    };
}

int_element!(i8, Int8, i64);
int_element!(u8, Uint8, u64);
int_element!(i32, Int32, i64);
int_element!(u32, Uint32, u64);
int_element!(i64, Int64, i128);
int_element!(u64, Uint64, u64);

/// A float's sign bit: which of `+0` and `-0` a tie between them keeps.
trait SignBit: PartialOrd + Copy {
    fn negative(self) -> bool;
}

macro_rules! sign_bit {
    ($($t:ty: $neg:expr),*) => {$(
        impl SignBit for $t {
            #[inline(always)]
            fn negative(self) -> bool {
                $neg(self)
            }
        }
    )*};
}
sign_bit!(f32: f32::is_sign_negative, f64: f64::is_sign_negative, f16: f16::is_sign_negative,
    bf16: bf16::is_sign_negative, F8E4M3: |x: F8E4M3| x.to_bits() & 0x80 != 0,
    F8E5M2: |x: F8E5M2| x.to_bits() & 0x80 != 0);

/// `a` if it is larger than `b` or `b` is NaN, else `b`: IEEE `maxNum` (as
/// CUDA's `fmaxf`), with `+0` against `-0` giving `+0` in either order (so
/// the result does not depend on the operands' order: reductions in the
/// deterministic mode rely on that); two NaNs give the first.
#[inline(always)]
fn fmax<T: SignBit>(a: T, b: T) -> T {
    #[allow(clippy::eq_op)]
    let b_nan = b != b;
    if a > b || b_nan || (a == b && b.negative() && !a.negative()) { a } else { b }
}

/// `a` if it is smaller than `b` or `b` is NaN, else `b`, with `+0` against
/// `-0` giving `-0` in either order (see [`fmax`]).
#[inline(always)]
fn fmin<T: SignBit>(a: T, b: T) -> T {
    #[allow(clippy::eq_op)]
    let b_nan = b != b;
    if a < b || b_nan || (a == b && a.negative() && !b.negative()) { a } else { b }
}

macro_rules! float_element {
    ($t:ty, $dtype:ident) => {
        impl Element for $t {
            const DTYPE: DataType = DataType::$dtype;
            #[inline(always)]
            fn sum(self, b: Self) -> Self {
                self + b
            }
            #[inline(always)]
            fn prod(self, b: Self) -> Self {
                self * b
            }
            #[inline(always)]
            fn max(self, b: Self) -> Self {
                fmax(self, b)
            }
            #[inline(always)]
            fn min(self, b: Self) -> Self {
                fmin(self, b)
            }
            #[inline]
            fn div_count(self, n: usize) -> Self {
                self / n as $t
            }
            #[inline]
            fn from_scalar(s: f64) -> Self {
                s as $t
            }
        }
    };
}

float_element!(f32, Float32);
float_element!(f64, Float64);

/// Types narrower than `f32`: arithmetic in `f32`, rounded back to nearest
/// even after each operation. Since `f32` carries more than twice their
/// precision plus two bits, that equals the correctly rounded operation in
/// the narrow type (no double-rounding error), i.e. what `__hadd` computes.
macro_rules! narrow_element {
    ($t:ty, $dtype:ident, $to:expr, $from:expr) => {
        impl Element for $t {
            const DTYPE: DataType = DataType::$dtype;
            #[inline(always)]
            fn sum(self, b: Self) -> Self {
                $from($to(self) + $to(b))
            }
            #[inline(always)]
            fn prod(self, b: Self) -> Self {
                $from($to(self) * $to(b))
            }
            #[inline(always)]
            fn max(self, b: Self) -> Self {
                fmax(self, b)
            }
            #[inline(always)]
            fn min(self, b: Self) -> Self {
                fmin(self, b)
            }
            #[inline]
            fn div_count(self, n: usize) -> Self {
                $from($to(self) / n as f32)
            }
            #[inline]
            fn from_scalar(s: f64) -> Self {
                // Not `half`'s `from_f64`: it rounds twice (through `f32`
                // with F16C) or drops the low half of the f64 (without).
                $from(f64_to_f32_odd(s))
            }
        }
    };
}

narrow_element!(f16, Float16, f16::to_f32, f16::from_f32);
narrow_element!(bf16, Bfloat16, bf16_to_f32, f32_to_bf16);
narrow_element!(F8E4M3, Float8E4M3, F8E4M3::to_f32, F8E4M3::from_f32);
narrow_element!(F8E5M2, Float8E5M2, F8E5M2::to_f32, F8E5M2::from_f32);
