//! The two OCP 8-bit floating-point formats, as storage types.
//!
//! Neither type does arithmetic of its own: the kernels widen to `f32`
//! ([`F8E4M3::to_f32`], exact), compute, and narrow back
//! ([`F8E4M3::from_f32`]).
//!
//! Narrowing rounds to nearest, ties to even, and **saturates**: a finite
//! value beyond the largest finite one becomes that largest finite value (with
//! its sign), as CUDA's `__nv_cvt_float_to_fp8(…, __NV_SATFINITE, …)` does.
//! NaN becomes the canonical NaN `0x7F` (CUDA's conversions do the same;
//! the input's sign and payload are dropped). Infinity has no E4M3
//! encoding and saturates to ±448; E5M2 keeps ±infinity (CUDA's `SATFINITE`
//! would give ±57344 there). Subnormals are produced and read.

use super::round::f64_to_f32_odd;
use bytemuck::{Pod, Zeroable};
use std::fmt;

/// The parameters of one 8-bit format: 1 sign bit, `8 - 1 - MANT` exponent
/// bits with bias `BIAS`, `MANT` mantissa bits.
struct Format {
    mant: u32,
    bias: u32,
    /// Largest finite magnitude's code.
    max: u8,
    /// Code for infinity, if the format has one.
    inf: Option<u8>,
}

const E4M3: Format = Format { mant: 3, bias: 7, max: 0x7E, inf: None };

const E5M2: Format = Format { mant: 2, bias: 15, max: 0x7B, inf: Some(0x7C) };

/// The canonical NaN magnitude of both formats.
const NAN: u8 = 0x7F;

impl Format {
    /// Whether the magnitude `mag` (code without sign) is NaN.
    const fn is_nan(&self, mag: u8) -> bool {
        match self.inf {
            None => mag == NAN,
            Some(inf) => mag > inf,
        }
    }

    /// `code`'s value (exact). Selects rather than branches or a table,
    /// so that loops over it vectorize.
    #[inline(always)]
    fn decode(&self, code: u8) -> f32 {
        let sign = u32::from(code & 0x80) << 24;
        let mag = u32::from(code & 0x7F);
        // Normal: exponent and mantissa shift into place; adding rebiases
        // the exponent.
        let normal = (mag << (23 - self.mant)) + ((127 - self.bias) << 23);
        // Subnormal (exponent field 0): mag × 2^(1 - bias - mant), exact.
        let quantum = f32::from_bits((127 + 1 - self.bias - self.mant) << 23);
        let sub = (mag as f32 * quantum).to_bits();
        let mut bits = if mag < 1 << self.mant { sub } else { normal };
        if let Some(inf) = self.inf
            && mag == u32::from(inf)
        {
            bits = 0x7F80_0000;
        }
        if self.is_nan(mag as u8) {
            bits = 0x7FC0_0000;
        }
        f32::from_bits(sign | bits)
    }

    /// `x` rounded to nearest (ties to even), saturating finite overflow.
    /// Selects rather than branches, so that loops over it vectorize.
    #[inline(always)]
    fn encode(&self, x: f32) -> u8 {
        let bits = x.to_bits();
        let sign = ((bits >> 24) & 0x80) as u8;
        let a = bits & 0x7FFF_FFFF;
        // Normal: drop `shift` mantissa bits, to nearest even (a carry out of
        // the mantissa bumps the exponent, as it should), then rebias.
        let shift = 23 - self.mant;
        let round = (1 << (shift - 1)) - 1 + ((a >> shift) & 1);
        let normal = (a.wrapping_add(round) >> shift).wrapping_sub((127 - self.bias) << self.mant);
        // Subnormal or zero: adding 2^(23 + q), where 2^q is the format's
        // smallest subnormal, rounds |x| to nearest even at that quantum in
        // the f32 adder; the sum's low bits count the quanta (2^mant of them
        // is the smallest normal's code, as it should be).
        let magic = f32::from_bits((127 + 23 + 1 - self.bias - self.mant) << 23);
        let sub = (f32::from_bits(a) + magic).to_bits().wrapping_sub(magic.to_bits());
        let min_normal = (127 + 1 - self.bias) << 23;
        let mut code = if a >= min_normal { normal } else { sub }.min(u32::from(self.max));
        if a == 0x7F80_0000 {
            code = u32::from(self.inf.unwrap_or(self.max));
        }
        let code = sign | code as u8;
        // NaN: the one canonical code, whatever the sign, as CUDA's
        // conversions give (and so that which NaN an addition passed on,
        // which the compiler may commute, cannot show).
        if a > 0x7F80_0000 { NAN } else { code }
    }
}

macro_rules! fp8_type {
    ($(#[$doc:meta])* $name:ident, $format:ident, $max:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Default, Pod, Zeroable)]
        #[repr(transparent)]
        pub struct $name(pub u8);

        impl $name {
            /// The largest finite value.
            pub const MAX: $name = $name($format.max);
            /// The largest finite value as `f32`.
            pub const MAX_F32: f32 = $max;
            /// The canonical (positive) NaN.
            pub const NAN: $name = $name(NAN);
            /// Positive zero.
            pub const ZERO: $name = $name(0);

            /// The value with this bit pattern.
            pub const fn from_bits(bits: u8) -> $name {
                $name(bits)
            }

            /// The bit pattern.
            pub const fn to_bits(self) -> u8 {
                self.0
            }

            /// The value as `f32` (exact).
            #[inline]
            pub fn to_f32(self) -> f32 {
                $format.decode(self.0)
            }

            /// The value as `f64` (exact).
            pub fn to_f64(self) -> f64 {
                f64::from(self.to_f32())
            }

            /// `x` rounded to nearest, ties to even; finite overflow saturates
            /// to ±[`Self::MAX`], NaN stays NaN (see the module doc).
            #[inline]
            pub fn from_f32(x: f32) -> $name {
                $name($format.encode(x))
            }

            /// `x` rounded once (not through an intermediate `f32` rounding),
            /// with the rules of [`Self::from_f32`].
            pub fn from_f64(x: f64) -> $name {
                $name::from_f32(f64_to_f32_odd(x))
            }

            /// Whether this is a NaN.
            pub const fn is_nan(self) -> bool {
                $format.is_nan(self.0 & 0x7F)
            }
        }

        /// IEEE comparison: NaN is unequal to everything, `-0 == +0`.
        impl PartialEq for $name {
            fn eq(&self, other: &$name) -> bool {
                self.to_f32() == other.to_f32()
            }
        }

        /// IEEE ordering (NaN is unordered).
        impl PartialOrd for $name {
            fn partial_cmp(&self, other: &$name) -> Option<std::cmp::Ordering> {
                self.to_f32().partial_cmp(&other.to_f32())
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:#04x} = {:?})", stringify!($name), self.0, self.to_f32())
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.to_f32(), f)
            }
        }

        impl From<$name> for f32 {
            fn from(x: $name) -> f32 {
                x.to_f32()
            }
        }
    };
}

fp8_type!(
    /// OCP FP8 E4M3 in its "FN" variant (NCCL's `ncclFloat8e4m3`, CUDA's
    /// `__nv_fp8_e4m3`): bias 7, no infinities, NaN = `0x7F`/`0xFF`, largest
    /// finite 448, smallest subnormal 2⁻⁹.
    F8E4M3,
    E4M3,
    448.0
);

fp8_type!(
    /// OCP FP8 E5M2 (NCCL's `ncclFloat8e5m2`, CUDA's `__nv_fp8_e5m2`): bias
    /// 15, IEEE-like infinities (`0x7C`) and NaNs (`0x7D..=0x7F`), largest
    /// finite 57344, smallest subnormal 2⁻¹⁶.
    F8E5M2,
    E5M2,
    57344.0
);

impl F8E5M2 {
    /// Positive infinity.
    pub const INFINITY: F8E5M2 = F8E5M2(0x7C);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        assert_eq!(F8E4M3::MAX.to_f32(), 448.0);
        assert_eq!(F8E5M2::MAX.to_f32(), 57344.0);
        assert_eq!(F8E4M3(0x01).to_f32(), 2f32.powi(-9));
        assert_eq!(F8E5M2(0x01).to_f32(), 2f32.powi(-16));
        assert_eq!(F8E4M3(0x38).to_f32(), 1.0);
        assert_eq!(F8E5M2(0x3C).to_f32(), 1.0);
        assert_eq!(F8E4M3(0xB8).to_f32(), -1.0);
        assert!(F8E4M3(0x7F).to_f32().is_nan() && F8E4M3(0xFF).is_nan());
        assert!(!F8E4M3(0x7E).is_nan());
        assert_eq!(F8E5M2::INFINITY.to_f32(), f32::INFINITY);
        assert_eq!(F8E5M2::from_f32(f32::NEG_INFINITY).0, 0xFC);
        assert_eq!(F8E4M3::from_f32(f32::INFINITY).0, 0x7E);
        assert_eq!(F8E4M3::from_f32(1e30).0, 0x7E);
        assert_eq!(F8E5M2::from_f32(-1e30).0, 0xFB);
        assert_eq!(F8E4M3::from_f32(-0.0).0, 0x80);
    }

    #[test]
    fn f64_rounds_once() {
        // 1 + 2^-4 + 2^-40 is just above the midpoint between 1 and 1.125 in
        // E4M3; through a plain f32 rounding it would land on the midpoint and
        // round to even (1.0).
        let x = 1.0 + 2f64.powi(-4) + 2f64.powi(-40);
        assert_eq!(F8E4M3::from_f32(x as f32).to_f32(), 1.0);
        assert_eq!(F8E4M3::from_f64(x).to_f32(), 1.125);
        assert_eq!(F8E5M2::from_f64(1e300).0, 0x7B);
        assert_eq!(F8E5M2::from_f64(f64::INFINITY).0, 0x7C);
        assert!(F8E5M2::from_f64(f64::NAN).is_nan());
    }
}
