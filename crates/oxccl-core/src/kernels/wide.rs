//! `f16` reduced through `f32` blocks: widen a block of each operand
//! (exact), combine with the `f32` loop, narrow back to nearest even. That
//! is one rounding per binary operation, the result of [`Element::sum`] and
//! its siblings element by element, at the speed of `half`'s slice
//! conversions (F16C on x86-64 where the CPU has it, chosen at run time;
//! element by element, `half` checks for F16C on every conversion).

use super::element::Element;
use super::loops::{BinOp, zip_into};
use half::f16;
use half::slice::HalfFloatSliceExt;
use multiversion::multiversion;

/// Elements per widened block (two `f32` stack buffers of 1 KiB).
const BLOCK: usize = 256;

/// A type narrower than `f32` whose every value `f32` holds exactly.
pub(crate) trait Narrow: Element {
    /// `dst[i] = src[i]` as `f32`; equal lengths.
    fn widen(src: &[Self], dst: &mut [f32]);
    /// `dst[i] = src[i]` rounded to nearest even (the type's `from_f32`).
    fn narrow(src: &[f32], dst: &mut [Self]);
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
}

/// `dst = a op b` for a narrow type; `a` and `b` have at least `dst.len()`
/// elements.
#[multiversion(targets("x86_64+avx2+fma+f16c"))]
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
#[multiversion(targets("x86_64+avx2+fma+f16c"))]
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
