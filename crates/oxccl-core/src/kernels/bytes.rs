//! Kernels on untyped byte buffers, for one element type `T`.
//!
//! Buffers whose addresses suit `T` are viewed as `&[T]` (bytemuck checks
//! the alignment; no copy) and reduced by the typed loops. Any misaligned
//! operand sends the whole call down a slower path that copies blocks of
//! elements through aligned stack buffers, reduces them there with the same
//! loops and copies the result out. Both paths apply the same operations in
//! the same order, so their results are identical bit for bit (a NaN for a
//! NaN).
//!
//! Elements are in the machine's byte order, as everywhere in the library.
//! Lengths have been checked by the caller (equal, a multiple of `T`'s size).

use super::binop::{MaxOp, MinOp, ProdOp, SumOp};
use super::element::Element;
use super::loops::{Kind, Op, by_kind, fused, map_into, map1, map2};
use bytemuck::{cast_slice, try_cast_slice, try_cast_slice_mut};

/// Elements per stack buffer of the misaligned path.
const SCRATCH: usize = 512;

/// Whether `bytes` can be viewed as `&[T]` where it lies.
fn aligned<T: Element>(bytes: &[u8]) -> bool {
    try_cast_slice::<u8, T>(bytes).is_ok()
}

/// Copies `bytes` into `out` (the same number of bytes).
fn load<T: Element>(out: &mut [T], bytes: &[u8]) {
    bytemuck::cast_slice_mut::<T, u8>(out).copy_from_slice(bytes);
}

/// `dst = a op b`.
#[inline]
pub(crate) fn reduce2<T: Element>(kind: Kind, dst: &mut [u8], a: &[u8], b: &[u8]) {
    if let (Ok(a), Ok(b)) = (try_cast_slice::<u8, T>(a), try_cast_slice::<u8, T>(b))
        && let Ok(d) = try_cast_slice_mut::<u8, T>(dst)
    {
        by_kind!(kind, map2::<T>(d, a, b));
        return;
    }
    by_kind!(kind, misaligned::<T>(dst, false, &[a, b]));
}

/// `acc = acc op b`.
#[inline]
pub(crate) fn reduce_into<T: Element>(kind: Kind, acc: &mut [u8], b: &[u8]) {
    if let Ok(b) = try_cast_slice::<u8, T>(b)
        && let Ok(a) = try_cast_slice_mut::<u8, T>(acc)
    {
        by_kind!(kind, map_into::<T>(a, b));
        return;
    }
    by_kind!(kind, misaligned::<T>(acc, true, &[b]));
}

/// `dst = srcs[0] op srcs[1] op …`; `srcs` is not empty.
#[inline]
pub(crate) fn reduce_n<T: Element>(kind: Kind, dst: &mut [u8], srcs: &[&[u8]]) {
    if srcs.iter().all(|s| aligned::<T>(s))
        && let Ok(d) = try_cast_slice_mut::<u8, T>(dst)
    {
        // Offsets are whole elements of aligned buffers: the casts succeed.
        let size = size_of::<T>();
        let src = |k: usize, r: std::ops::Range<usize>| cast_slice::<u8, T>(&srcs[k][r.start * size..r.end * size]);
        by_kind!(kind, fused::<T>(d, srcs.len(), src));
        return;
    }
    by_kind!(kind, misaligned::<T>(dst, false, srcs));
}

/// `dst[i] = f(src[i])`, or `f(dst[i])` in place without a source.
pub(crate) fn unary<T: Element>(dst: &mut [u8], src: Option<&[u8]>, f: impl Fn(T) -> T) {
    if src.is_none_or(aligned::<T>)
        && let Ok(d) = try_cast_slice_mut::<u8, T>(dst)
    {
        map1(d, src.map(cast_slice::<u8, T>), f);
        return;
    }
    let step = SCRATCH * size_of::<T>();
    let mut buf = [T::zeroed(); SCRATCH];
    for (i, d) in dst.chunks_mut(step).enumerate() {
        let buf = &mut buf[..d.len() / size_of::<T>()];
        load(buf, src.map_or(&*d, |s| &s[i * step..i * step + d.len()]));
        map1(buf, None, &f);
        d.copy_from_slice(cast_slice(buf));
    }
}

/// The misaligned path: per block of `SCRATCH` elements, the first operand
/// (`dst` itself when `in_place`, else `srcs[0]`) is copied into an aligned
/// accumulator, every further source into a second buffer and reduced into
/// the accumulator, which is then copied to `dst`.
fn misaligned<T: Element, O: Op<T>>(dst: &mut [u8], in_place: bool, srcs: &[&[u8]]) {
    let step = SCRATCH * size_of::<T>();
    let mut acc = [T::zeroed(); SCRATCH];
    let mut tmp = [T::zeroed(); SCRATCH];
    for (i, d) in dst.chunks_mut(step).enumerate() {
        let range = i * step..i * step + d.len();
        let n = d.len() / size_of::<T>();
        let (acc, tmp) = (&mut acc[..n], &mut tmp[..n]);
        let (first, rest) = if in_place { (&*d, srcs) } else { (&srcs[0][range.clone()], &srcs[1..]) };
        load(acc, first);
        for s in rest {
            load(tmp, &s[range.clone()]);
            map_into::<T, O>(acc, tmp);
        }
        d.copy_from_slice(cast_slice(acc));
    }
}
