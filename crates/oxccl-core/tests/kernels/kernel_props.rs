//! Property tests: random lengths, misalignments, values and source counts.

use crate::common;

use common::{Buf, Ref, Rng, assert_same, random_vec};
use half::bf16;
use oxccl_core::kernels::{reduce_into, reduce_n, reduce2};
use oxccl_core::{F8E4M3, F8E5M2, ReduceOp};
use proptest::prelude::*;

/// `reduce2` at the given offsets equals the reference, and `reduce_n` of
/// `n` sources equals the chain of `reduce2` and `reduce_into` (bit for bit,
/// any NaN for a NaN).
fn check<T: Ref>(len: usize, offs: [usize; 3], op: ReduceOp, n: usize, seed: u64) {
    let t = T::DTYPE;
    let mut rng = Rng::new(seed);
    let srcs: Vec<Vec<T>> = (0..n.max(2)).map(|_| random_vec(&mut rng, len, false)).collect();
    let (a, b) = (Buf::new(&srcs[0], offs[1]), Buf::new(&srcs[1], offs[2]));
    let mut dst = Buf::filled(len * t.size(), offs[0], 0x5A);
    reduce2(t, op, dst.bytes_mut(), a.bytes(), b.bytes()).unwrap();
    let want: Vec<T> = srcs[0].iter().zip(&srcs[1]).map(|(x, y)| T::reference(op, *x, *y)).collect();
    assert_same(&dst.values::<T>(), &want, &format!("{t} {op} len {len} offsets {offs:?}"));

    let bufs: Vec<Buf> = srcs[..n].iter().enumerate().map(|(i, s)| Buf::new(s, offs[i % 3])).collect();
    let refs: Vec<&[u8]> = bufs.iter().map(Buf::bytes).collect();
    let mut chain = Buf::new(&srcs[0], offs[0]);
    if n > 1 {
        reduce2(t, op, chain.bytes_mut(), refs[0], refs[1]).unwrap();
    }
    for s in refs.iter().skip(2) {
        reduce_into(t, op, chain.bytes_mut(), s).unwrap();
    }
    reduce_n(t, op, dst.bytes_mut(), &refs).unwrap();
    let ctx = format!("{t} {op} len {len} n {n}");
    assert_same(&dst.values::<T>(), &chain.values::<T>(), &ctx);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn random_shapes_match_the_reference(
        ty in 0usize..6,
        len in 0usize..3000,
        offs in prop::array::uniform3(0usize..8),
        op in prop::sample::select(ReduceOp::ALL.to_vec()),
        n in 1usize..6,
        seed in any::<u64>(),
    ) {
        match ty {
            0 => check::<f32>(len, offs, op, n, seed),
            1 => check::<i32>(len, offs, op, n, seed),
            2 => check::<bf16>(len, offs, op, n, seed),
            3 => check::<F8E4M3>(len, offs, op, n, seed),
            4 => check::<F8E5M2>(len, offs, op, n, seed),
            _ => check::<u64>(len, offs, op, n, seed),
        }
    }
}
