//! Reproducible reductions: inputs whose sums depend on the order they
//! are added in, and the canonical order of `OXCCL_DETERMINISTIC=1`
//! computed here, independently of oxccl (its own recursion, and the
//! arithmetic of each type written out: `f16`/`bf16` rounded after every
//! operation from `f32`, as the README documents).
//!
//! The canonical value over ranks `l..r` is `x_l` for one rank, else the
//! value over the left part `⊕` the value over the right part, the left
//! part being the largest power of two of ranks smaller than `r - l`.

use crate::{bytes, bytes_mut, zeroed};
use half::{bf16, f16};
use oxccl::{CollKind, Communicator, DataType, ReduceOp, Spec};
use oxccl_algo::exact::premul_scalar;

/// The floating-point types the tests run.
pub const TYPES: [DataType; 4] = [DataType::Float32, DataType::Float16, DataType::Bfloat16, DataType::Float64];

/// The operators whose results depend on the order (mulsum's scalar is
/// set per rank by [`op_of`]).
pub const OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Avg, ReduceOp::PreMulSum { scalar: 0.0 }];

/// One element type's arithmetic, rounded as a GPU kernel rounds.
trait El: Copy + PartialEq {
    const SIZE: usize;
    fn of(x: f64) -> Self;
    fn add(a: Self, b: Self) -> Self;
    fn mul(a: Self, b: Self) -> Self;
    fn div(a: Self, n: usize) -> Self;
    fn put(self, out: &mut [u8]);
}

macro_rules! wide {
    ($t:ty) => {
        impl El for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn of(x: f64) -> $t {
                x as $t
            }
            fn add(a: $t, b: $t) -> $t {
                a + b
            }
            fn mul(a: $t, b: $t) -> $t {
                a * b
            }
            fn div(a: $t, n: usize) -> $t {
                a / n as $t
            }
            fn put(self, out: &mut [u8]) {
                out.copy_from_slice(&self.to_le_bytes());
            }
        }
    };
}
wide!(f32);
wide!(f64);

macro_rules! narrow {
    ($t:ty) => {
        impl El for $t {
            const SIZE: usize = 2;
            fn of(x: f64) -> $t {
                <$t>::from_f64(x)
            }
            fn add(a: $t, b: $t) -> $t {
                <$t>::from_f32(a.to_f32() + b.to_f32())
            }
            fn mul(a: $t, b: $t) -> $t {
                <$t>::from_f32(a.to_f32() * b.to_f32())
            }
            fn div(a: $t, n: usize) -> $t {
                <$t>::from_f32(a.to_f32() / n as f32)
            }
            fn put(self, out: &mut [u8]) {
                out.copy_from_slice(&self.to_le_bytes());
            }
        }
    };
}
narrow!(f16);
narrow!(bf16);

/// The operator rank `rank` passes (mulsum: its own scalar).
pub fn op_of(op: ReduceOp, rank: usize) -> ReduceOp {
    match op {
        ReduceOp::PreMulSum { .. } => ReduceOp::PreMulSum { scalar: premul_scalar(rank) },
        o => o,
    }
}

fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Rank `rank`'s element `i`: for products a factor near 1, else a signed
/// value whose magnitude spans several binades (so that reordering a sum
/// changes its last bits), within the type's range for 8 ranks.
fn value(dtype: DataType, op: ReduceOp, rank: usize, i: usize) -> f64 {
    let h = mix((rank as u64) << 40 ^ i as u64 ^ 0x5eed);
    let m = 1.0 + (h & 0xffff) as f64 / 65536.0;
    let sign = if h >> 63 == 1 { -1.0 } else { 1.0 };
    if op == ReduceOp::Prod {
        return 1.0 + sign * (m - 1.0) / 8.0;
    }
    let span = match dtype {
        DataType::Float16 => 6,
        DataType::Bfloat16 | DataType::Float32 => 12,
        _ => 30,
    };
    let e = ((h >> 20) % (2 * span + 1)) as i32 - span as i32;
    sign * m * 2f64.powi(e)
}

/// The canonical value of `leaf(0) … leaf(n-1)` under `op`.
fn canon<T: El>(l: usize, r: usize, leaf: &dyn Fn(usize) -> T, op: fn(T, T) -> T) -> T {
    if r - l == 1 {
        return leaf(l);
    }
    let mut half = 1;
    while half * 2 < r - l {
        half *= 2;
    }
    op(canon(l, l + half, leaf, op), canon(l + half, r, leaf, op))
}

/// The bytes rank `rank` contributes (`len` elements from `from`).
fn input<T: El>(dtype: DataType, op: ReduceOp, rank: usize, from: usize, len: usize) -> Vec<T> {
    let scalar = match op_of(op, rank) {
        ReduceOp::PreMulSum { scalar } => Some(T::of(scalar)),
        _ => None,
    };
    (from..from + len).map(|i| T::of(value(dtype, op, rank, i))).map(|x| scalar.map_or(x, |s| T::mul(x, s))).collect()
}

fn raw<T: El>(dtype: DataType, op: ReduceOp, rank: usize, from: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len * T::SIZE];
    for (k, i) in (from..from + len).enumerate() {
        T::of(value(dtype, op, rank, i)).put(&mut out[k * T::SIZE..][..T::SIZE]);
    }
    out
}

/// The canonical result of elements `from..from + len` over `n` ranks.
fn expected<T: El>(dtype: DataType, op: ReduceOp, n: usize, from: usize, len: usize) -> Vec<u8> {
    let inputs: Vec<Vec<T>> = (0..n).map(|r| input::<T>(dtype, op, r, from, len)).collect();
    let combine: fn(T, T) -> T = if op == ReduceOp::Prod { T::mul } else { T::add };
    let mut out = vec![0u8; len * T::SIZE];
    for k in 0..len {
        let mut v = canon(0, n, &|r| inputs[r][k], combine);
        if op == ReduceOp::Avg {
            v = T::div(v, n);
        }
        v.put(&mut out[k * T::SIZE..][..T::SIZE]);
    }
    out
}

macro_rules! by_type {
    ($dtype:expr, $f:ident ( $($a:expr),* )) => {
        match $dtype {
            DataType::Float32 => $f::<f32>($($a),*),
            DataType::Float64 => $f::<f64>($($a),*),
            DataType::Float16 => $f::<f16>($($a),*),
            DataType::Bfloat16 => $f::<bf16>($($a),*),
            other => panic!("{other}: not a type of these tests"),
        }
    };
}

/// One case: a collective of `kind` (all_reduce, reduce_scatter, reduce)
/// on `comm`, the rank's input made here.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    /// The collective.
    pub kind: CollKind,
    /// Its type.
    pub dtype: DataType,
    /// Its operator (mulsum: each rank's scalar is set by [`op_of`]).
    pub op: ReduceOp,
    /// Elements per rank (reduce-scatter: per block).
    pub count: usize,
    /// The root of a reduce.
    pub root: usize,
    /// Input and output one buffer (NCCL's in-place layout).
    pub in_place: bool,
}

/// Runs `case` on this rank: the number of output elements whose bits
/// differ from the canonical order's (an error when the call fails, or
/// when the input was modified). Elements that differ are described in
/// `first` (the first one).
pub fn run(comm: &Communicator, case: Case, first: &mut Option<String>) -> Result<usize, String> {
    let (n, rank) = (comm.size(), comm.rank());
    let Case { kind, dtype, op, count, root, in_place } = case;
    let es = dtype.size();
    // This rank's input: the whole buffer (reduce-scatter: n blocks).
    let blocks = if kind == CollKind::ReduceScatter { n } else { 1 };
    let ni = count * blocks * es;
    let mine = by_type!(dtype, raw(dtype, op, rank, 0, count * blocks));
    let out_len = match kind {
        CollKind::Reduce if rank != root => 0,
        _ => count,
    };
    let what = format!("rank {rank}/{n} {kind} {dtype} {} count {count} root {root} in place {in_place}", op.name());
    let spec = Spec::new(kind, count, dtype).with_op(op_of(op, rank)).with_root(root);
    let got: Vec<u8> = if in_place {
        let mut buf = zeroed(ni);
        bytes_mut(&mut buf, ni).copy_from_slice(&mine);
        comm.collective_bytes(spec, None, bytes_mut(&mut buf, ni)).map_err(|e| format!("{what}: {e}"))?;
        let at = if kind == CollKind::ReduceScatter { rank * count * es } else { 0 };
        bytes(&buf, ni)[at..][..out_len * es].to_vec()
    } else {
        let mut out = zeroed(out_len * es);
        let keep = mine.clone();
        comm.collective_bytes(spec, Some(&mine), bytes_mut(&mut out, out_len * es))
            .map_err(|e| format!("{what}: {e}"))?;
        if mine != keep {
            return Err(format!("{what}: the send buffer was modified"));
        }
        bytes(&out, out_len * es).to_vec()
    };
    let from = if kind == CollKind::ReduceScatter { rank * count } else { 0 };
    let want = by_type!(dtype, expected(dtype, op, n, from, out_len));
    let mut wrong = 0;
    for (k, (g, w)) in got.chunks(es).zip(want.chunks(es)).enumerate() {
        if g != w {
            if wrong == 0 && first.is_none() {
                *first = Some(format!("{what}: element {k} has bits {g:02x?}, the canonical order gives {w:02x?}"));
            }
            wrong += 1;
        }
    }
    Ok(wrong)
}

/// Runs every case of `cases` on this rank and fails on the first
/// element that is not the canonical order's.
pub fn check_all(comm: &Communicator, cases: &[Case]) -> Result<usize, String> {
    for &c in cases {
        let mut first = None;
        if run(comm, c, &mut first)? > 0 {
            return Err(first.unwrap_or_default());
        }
    }
    Ok(cases.len())
}

/// Every kind × type × operator × placement at `counts` (reduce rooted
/// at the last rank).
pub fn cases(n: usize, counts: &[usize], types: &[DataType], ops: &[ReduceOp]) -> Vec<Case> {
    let mut v = Vec::new();
    for kind in [CollKind::AllReduce, CollKind::ReduceScatter, CollKind::Reduce] {
        for &dtype in types {
            for &op in ops {
                for &count in counts {
                    for in_place in [false, true] {
                        v.push(Case { kind, dtype, op, count, root: n - 1, in_place });
                    }
                }
            }
        }
    }
    v
}
