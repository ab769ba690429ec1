//! FP8 conversions, exhaustively: every code's value against the OCP spec,
//! every code through f32 and back, every midpoint between neighbours and
//! the values just beside it, saturation, and a million f32 inputs against
//! rounding by search.

use crate::common;

use common::{Rng, fp8_max, fp8_round, fp8_value};
use oxccl_core::{F8E4M3, F8E5M2};

/// Both formats behind one face: (name, e4m3?, to_f32, from_f32).
type Conv = (&'static str, bool, fn(u8) -> f32, fn(f32) -> u8);

const FORMATS: [Conv; 2] = [
    ("e4m3", true, |c| F8E4M3::from_bits(c).to_f32(), |x| F8E4M3::from_f32(x).to_bits()),
    ("e5m2", false, |c| F8E5M2::from_bits(c).to_f32(), |x| F8E5M2::from_f32(x).to_bits()),
];

#[test]
fn every_code_decodes_to_its_spec_value_and_round_trips() {
    for (name, e4m3, to, from) in FORMATS {
        let mut nans = 0;
        for code in 0..=255u8 {
            let (got, want) = (to(code), fp8_value(code, e4m3));
            if want.is_nan() {
                nans += 1;
                assert!(got.is_nan(), "{name} {code:#04x} is NaN");
                assert_eq!(from(got), 0x7F, "{name} NaN {code:#04x} narrows to 0x7F");
                continue;
            }
            assert_eq!(f64::from(got), want, "{name} {code:#04x}");
            assert_eq!(got.is_sign_negative(), code & 0x80 != 0, "{name} {code:#04x} sign");
            assert_eq!(from(got), code, "{name} {code:#04x} round trip");
        }
        assert_eq!(nans, if e4m3 { 2 } else { 6 }, "{name} NaN count");
    }
}

#[test]
fn midpoints_round_to_even_and_neighbours_round_to_nearest() {
    for (name, e4m3, to, from) in FORMATS {
        for sign in [0u8, 0x80] {
            for c in 0..fp8_max(e4m3) {
                let (lo, hi) = (c | sign, (c + 1) | sign);
                let mid = (to(lo) + to(hi)) / 2.0;
                assert_eq!(f64::from(mid), (fp8_value(lo, e4m3) + fp8_value(hi, e4m3)) / 2.0);
                let even = if c % 2 == 0 { lo } else { hi };
                assert_eq!(from(mid), even, "{name} midpoint {mid} of {lo:#04x},{hi:#04x}");
                // The f32 values one ulp toward each neighbour.
                let toward_hi = f32::from_bits(mid.to_bits() + 1);
                let toward_lo = f32::from_bits(mid.to_bits() - 1);
                assert_eq!(from(toward_hi), hi, "{name} just beyond {mid}");
                assert_eq!(from(toward_lo), lo, "{name} just short of {mid}");
                // A quarter of the gap from each end.
                let quarter = (to(hi) - to(lo)) / 4.0;
                assert_eq!(from(to(lo) + quarter), lo, "{name} near {lo:#04x}");
                assert_eq!(from(to(hi) - quarter), hi, "{name} near {hi:#04x}");
            }
        }
    }
}

#[test]
fn overflow_saturates_to_the_largest_finite_value() {
    for (name, e4m3, to, from) in FORMATS {
        let max = fp8_max(e4m3);
        let top = to(max);
        assert_eq!(top, if e4m3 { 448.0 } else { 57344.0 });
        let gap = top - to(max - 1);
        for x in [top + gap / 2.0, top + gap, top * 1.5, 1e10, f32::MAX] {
            assert_eq!(from(x), max, "{name} {x}");
            assert_eq!(from(-x), max | 0x80, "{name} -{x}");
        }
        let inf = if e4m3 { 0x7E } else { 0x7C };
        assert_eq!(from(f32::INFINITY), inf, "{name} inf");
        assert_eq!(from(f32::NEG_INFINITY), inf | 0x80, "{name} -inf");
        assert_eq!((from(f32::NAN), from(-f32::NAN)), (0x7F, 0x7F), "{name} canonical NaN");
    }
}

#[test]
fn subnormals_and_underflow() {
    for (name, e4m3, to, from) in FORMATS {
        let tiny = to(1);
        assert_eq!(f64::from(tiny), if e4m3 { 2f64.powi(-9) } else { 2f64.powi(-16) });
        assert_eq!(from(tiny / 2.0), 0, "{name} half the smallest ties to 0");
        assert_eq!(from(-tiny / 2.0), 0x80, "{name} keeps the sign of zero");
        assert_eq!(from(tiny * 0.75), 1, "{name}");
        assert_eq!(from(tiny * 1.5), 2, "{name} tie to even");
        assert_eq!(from(tiny * 2.5), 2, "{name} tie to even");
        assert_eq!(from(f32::from_bits(1)), 0, "{name} f32 subnormal");
        assert_eq!(from(f32::MIN_POSITIVE), 0, "{name}");
    }
}

#[test]
fn a_million_f32_values_match_rounding_by_search() {
    for (name, e4m3, _, from) in FORMATS {
        let mut rng = Rng::new(if e4m3 { 7 } else { 8 });
        for i in 0..(1u32 << 20) {
            // Half spread over all bit patterns, half near the format's range.
            let bits = if i % 2 == 0 {
                rng.next() as u32
            } else {
                let exp = 127 - 20 + (rng.next() % 40) as u32;
                (rng.next() as u32 & 0x807F_FFFF) | (exp << 23)
            };
            let x = f32::from_bits(bits);
            let want = fp8_round(f64::from(x), e4m3);
            let got = from(x);
            if x.is_nan() {
                assert_eq!(got, 0x7F, "{name} {bits:#010x}");
            } else {
                assert_eq!(got, want, "{name} {x:e} ({bits:#010x})");
            }
        }
    }
}

#[test]
fn from_f64_rounds_once() {
    let mut rng = Rng::new(9);
    for _ in 0..200_000 {
        let x = f64::from_bits(rng.next() & 0x80FF_FFFF_FFFF_FFFF | (1012 + rng.next() % 30) << 52);
        assert_eq!(F8E4M3::from_f64(x).to_bits(), fp8_round(x, true), "e4m3 {x:e}");
        assert_eq!(F8E5M2::from_f64(x).to_bits(), fp8_round(x, false), "e5m2 {x:e}");
    }
}
