//! Narrow floats reduced through `f32` blocks: widen a block of each operand
//! (exact), combine with the `f32` loop, narrow back to nearest even. That
//! is one rounding per binary operation, the result of [`Element::sum`] and
//! its siblings element by element.
//!
//! Why blocks rather than one loop converting element by element? For
//! `f16`, `half`'s slice conversions use F16C (chosen at run time once per
//! slice, where element by element it checks on every conversion). For
//! `bf16`, both run at the same speed in cache, but the block form streams
//! memory twice as fast at 64 MiB (measured: 4.8 vs 2.1 GB/s). FP8 is
//! compute-bound either way (~1 ns per element).

use super::binop::{BinOp, zip_into};
use super::element::Element;
use super::fp8::{F8E4M3, F8E5M2};
use super::round::{bf16_to_f32, f32_to_bf16};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use multiversion::multiversion;
use std::ops::Range;

/// Elements per widened block (two `f32` stack buffers of 1 KiB).
const BLOCK: usize = 256;

/// A type narrower than `f32` whose every value `f32` holds exactly.
pub(crate) trait Narrow: Element {
    /// `dst[i] = src[i]` as `f32`; equal lengths.
    fn widen(src: &[Self], dst: &mut [f32]);
    /// `dst[i] = src[i]` rounded to nearest even (the type's `from_f32`).
    fn narrow(src: &[f32], dst: &mut [Self]);
    /// `buf[i]` rounded to the type and widened back: what a store and a
    /// load of the narrow type do; at most [`BLOCK`] elements.
    fn round(buf: &mut [f32]);
    /// `acc[i] = op(acc[i], src[i])`, then rounded as by [`Narrow::round`]
    /// if `round`; `scratch` has room for `acc.len()` elements.
    #[inline(always)]
    fn accumulate<O: BinOp<f32>>(acc: &mut [f32], src: &[Self], scratch: &mut [f32], round: bool) {
        let w = &mut scratch[..acc.len()];
        Self::widen(src, w);
        zip_into::<f32, O>(acc, w);
        if round {
            Self::round(acc);
        }
    }
}

/// [`Narrow::accumulate`] in one pass, for types whose conversions are
/// inline arithmetic (`to` widens, `rnd` rounds in `f32`).
#[inline(always)]
fn accumulate_in_one_pass<T: Copy, O: BinOp<f32>>(
    acc: &mut [f32],
    src: &[T],
    round: bool,
    to: impl Fn(T) -> f32,
    rnd: impl Fn(f32) -> f32,
) {
    let src = &src[..acc.len()];
    if round {
        for (a, s) in acc.iter_mut().zip(src) {
            *a = rnd(O::apply(*a, to(*s)));
        }
    } else {
        for (a, s) in acc.iter_mut().zip(src) {
            *a = O::apply(*a, to(*s));
        }
    }
}

impl Narrow for f16 {
    #[inline]
    fn widen(src: &[f16], dst: &mut [f32]) {
        // Vectorized by `half`, with F16C where the CPU has it.
        src.convert_to_f32_slice(dst);
    }
    #[inline]
    fn narrow(src: &[f32], dst: &mut [f16]) {
        dst.convert_from_f32_slice(src);
    }
    #[inline]
    fn round(buf: &mut [f32]) {
        let mut tmp = [f16::ZERO; BLOCK];
        let tmp = &mut tmp[..buf.len()];
        tmp.convert_from_f32_slice(buf);
        tmp.convert_to_f32_slice(buf);
    }
}

impl Narrow for bf16 {
    #[inline]
    fn widen(src: &[bf16], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = bf16_to_f32(*s);
        }
    }
    #[inline]
    fn narrow(src: &[f32], dst: &mut [bf16]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = f32_to_bf16(*s);
        }
    }
    #[inline]
    fn round(buf: &mut [f32]) {
        for x in buf {
            *x = bf16_to_f32(f32_to_bf16(*x));
        }
    }
    #[inline(always)]
    fn accumulate<O: BinOp<f32>>(acc: &mut [f32], src: &[bf16], _: &mut [f32], round: bool) {
        let rnd = |x| bf16_to_f32(f32_to_bf16(x));
        accumulate_in_one_pass::<bf16, O>(acc, src, round, bf16_to_f32, rnd);
    }
}

macro_rules! narrow_fp8 {
    ($t:ty) => {
        impl Narrow for $t {
            #[inline]
            fn widen(src: &[$t], dst: &mut [f32]) {
                for (d, s) in dst.iter_mut().zip(src) {
                    *d = s.to_f32();
                }
            }
            #[inline]
            fn narrow(src: &[f32], dst: &mut [$t]) {
                for (d, s) in dst.iter_mut().zip(src) {
                    *d = <$t>::from_f32(*s);
                }
            }
            #[inline]
            fn round(buf: &mut [f32]) {
                for x in buf {
                    *x = <$t>::from_f32(*x).to_f32();
                }
            }
            #[inline(always)]
            fn accumulate<O: BinOp<f32>>(acc: &mut [f32], src: &[$t], _: &mut [f32], round: bool) {
                let rnd = |x| <$t>::from_f32(x).to_f32();
                accumulate_in_one_pass::<$t, O>(acc, src, round, <$t>::to_f32, rnd);
            }
        }
    };
}

narrow_fp8!(F8E4M3);
narrow_fp8!(F8E5M2);

/// `dst = a op b` for a narrow type; `a` and `b` have at least `dst.len()`
/// elements.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx512dq+avx2+fma+f16c", "x86_64+avx2+fma+f16c"))]
pub(crate) fn map2<N: Narrow, O: BinOp<f32>>(dst: &mut [N], a: &[N], b: &[N]) {
    let (mut wa, mut wb) = ([0f32; BLOCK], [0f32; BLOCK]);
    for (i, d) in dst.chunks_mut(BLOCK).enumerate() {
        let range = i * BLOCK..i * BLOCK + d.len();
        let (wa, wb) = (&mut wa[..d.len()], &mut wb[..d.len()]);
        N::widen(&a[range.clone()], wa);
        N::widen(&b[range], wb);
        zip_into::<f32, O>(wa, wb);
        N::narrow(wa, d);
    }
}

/// `acc = acc op b` for a narrow type; `b` has at least `acc.len()` elements.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx512dq+avx2+fma+f16c", "x86_64+avx2+fma+f16c"))]
pub(crate) fn map_into<N: Narrow, O: BinOp<f32>>(acc: &mut [N], b: &[N]) {
    let (mut wa, mut wb) = ([0f32; BLOCK], [0f32; BLOCK]);
    for (i, d) in acc.chunks_mut(BLOCK).enumerate() {
        let (wa, wb) = (&mut wa[..d.len()], &mut wb[..d.len()]);
        N::widen(d, wa);
        N::widen(&b[i * BLOCK..i * BLOCK + d.len()], wb);
        zip_into::<f32, O>(wa, wb);
        N::narrow(wa, d);
    }
}

/// `dst = src(0) op src(1) op …` for a narrow type (see
/// [`loops::fused`](super::loops::fused)). The accumulator stays widened in
/// `f32` across the sources, rounded to the type after each operation, so
/// the result is the chain's, bit for bit (a NaN for a NaN); it is
/// narrowed once at the end.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx512dq+avx2+fma+f16c", "x86_64+avx2+fma+f16c"))]
pub(crate) fn fused<'a, N: Narrow, O: BinOp<f32>>(
    dst: &mut [N],
    n: usize,
    src: impl Fn(usize, Range<usize>) -> &'a [N],
) {
    let (mut acc, mut w) = ([0f32; BLOCK], [0f32; BLOCK]);
    for (i, d) in dst.chunks_mut(BLOCK).enumerate() {
        let range = i * BLOCK..i * BLOCK + d.len();
        if n == 1 {
            // A copy, as the chain of zero operations is (NaN bits kept).
            d.copy_from_slice(src(0, range));
            continue;
        }
        let (acc, w) = (&mut acc[..d.len()], &mut w[..d.len()]);
        N::widen(src(0, range.clone()), acc);
        for k in 1..n {
            N::accumulate::<O>(acc, src(k, range.clone()), w, k + 1 < n);
        }
        N::narrow(acc, d);
    }
}
