//! Conversions between floating-point formats that the element types and
//! the widened loops share: round-to-odd from `f64` (so that a second
//! rounding to a narrower format is as if done once), and branch-free
//! `bf16` ↔ `f32` (loops over them vectorize).

use half::bf16;

/// Rounds `x` to `f32` so that a second rounding to a narrower format is as
/// if it were done once from `x`: round to odd (truncate, then set the last
/// bit if anything was lost). Finite values beyond `f32::MAX` become
/// ±`f32::MAX`, so that they saturate rather than become infinite.
pub(crate) fn f64_to_f32_odd(x: f64) -> f32 {
    if x.is_nan() {
        return f32::NAN;
    }
    if x.is_infinite() {
        return x as f32;
    }
    if x.abs() > f64::from(f32::MAX) {
        return f32::MAX.copysign(x as f32);
    }
    let r = x as f32;
    if f64::from(r) == x {
        return r;
    }
    // Truncate toward zero, then make the last bit odd.
    let mut bits = r.to_bits();
    if f64::from(r).abs() > x.abs() {
        bits -= 1;
    }
    f32::from_bits(bits | 1)
}

/// `bf16` to `f32` (exact): the upper half of the bits.
#[inline(always)]
pub(crate) fn bf16_to_f32(x: bf16) -> f32 {
    f32::from_bits(u32::from(x.to_bits()) << 16)
}

/// `f32` to `bf16`, to nearest even; NaN stays NaN (quiet bit set). The
/// same bits as `bf16::from_f32`, without branches, so that loops over it
/// vectorize.
#[inline(always)]
pub(crate) fn f32_to_bf16(f: f32) -> bf16 {
    let x = f.to_bits();
    let rounded = x.wrapping_add(0x7FFF + ((x >> 16) & 1)) >> 16;
    let nan = (x >> 16) | 0x40;
    let bits = if x & 0x7FFF_FFFF > 0x7F80_0000 { nan } else { rounded };
    bf16::from_bits(bits as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branch_free_bf16_conversion_matches_half() {
        let mut x = 0x2545_F491u32;
        for i in 0..1u32 << 20 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            // Every other pattern near the rounding boundary, NaN and inf.
            let bits = if i % 2 == 0 { x } else { x & 0xFFFF_8001 | 0x7FFF };
            let f = f32::from_bits(bits);
            assert_eq!(f32_to_bf16(f).to_bits(), bf16::from_f32(f).to_bits(), "{bits:#010x}");
            // Widening is exact (`half` also sets the quiet bit of NaNs).
            let h = bf16::from_bits(bits as u16);
            if !h.is_nan() {
                assert_eq!(bf16_to_f32(h).to_bits(), h.to_f32().to_bits());
            }
        }
        for f in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -f32::NAN, f32::MAX, 0.0, -0.0] {
            assert_eq!(f32_to_bf16(f).to_bits(), bf16::from_f32(f).to_bits(), "{f}");
        }
    }
}
