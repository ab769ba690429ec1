//! The binary operators as types, so that the loops monomorphize on them,
//! and the plain zipped loops every wider loop is built from.

use super::element::Element;

/// A binary operator, as a type, so that the loops monomorphize on it.
pub(crate) trait BinOp<T> {
    /// `op(a, b)`.
    fn apply(a: T, b: T) -> T;
}

macro_rules! bin_op {
    ($name:ident, $method:ident) => {
        pub(crate) struct $name;
        impl<T: Element> BinOp<T> for $name {
            #[inline(always)]
            fn apply(a: T, b: T) -> T {
                a.$method(b)
            }
        }
    };
}

bin_op!(SumOp, sum);
bin_op!(ProdOp, prod);
bin_op!(MaxOp, max);
bin_op!(MinOp, min);

/// The loop of `loops::map2`, to inline into a function built for some target.
#[inline(always)]
pub(crate) fn zip2<T: Copy, O: BinOp<T>>(dst: &mut [T], a: &[T], b: &[T]) {
    let n = dst.len();
    let (a, b) = (&a[..n], &b[..n]);
    for ((d, x), y) in dst.iter_mut().zip(a).zip(b) {
        *d = O::apply(*x, *y);
    }
}

/// The loop of `loops::map_into`, to inline into a function built for some target.
#[inline(always)]
pub(crate) fn zip_into<T: Copy, O: BinOp<T>>(acc: &mut [T], b: &[T]) {
    let b = &b[..acc.len()];
    for (d, y) in acc.iter_mut().zip(b) {
        *d = O::apply(*d, *y);
    }
}
