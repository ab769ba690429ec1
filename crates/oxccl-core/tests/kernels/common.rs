//! Helpers shared by the kernel tests: a small deterministic generator, an
//! independent reference for every type × op (integers in i128/u128, floats
//! in f64 with one rounding, FP8 decoded from the spec and rounded by
//! exhaustive search), and byte buffers at chosen misalignments.

#![allow(dead_code)]

use bytemuck::Zeroable;
use half::{bf16, f16};
use oxccl_core::kernels::Element;
use oxccl_core::{F8E4M3, F8E5M2, ReduceOp};
use std::sync::OnceLock;

/// xorshift64*: deterministic, no dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// The value of an FP8 code, from the OCP spec (not from the crate's table).
pub fn fp8_value(code: u8, e4m3: bool) -> f64 {
    let (mant_bits, bias) = if e4m3 { (3, 7) } else { (2, 15) };
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let mag = code & 0x7F;
    let exp = i32::from(mag >> mant_bits);
    let mant = f64::from(mag & ((1 << mant_bits) - 1));
    let scale = f64::from(1u32 << mant_bits);
    if e4m3 && mag == 0x7F || !e4m3 && exp == 31 && mant != 0.0 {
        return f64::NAN;
    }
    if !e4m3 && exp == 31 {
        return sign * f64::INFINITY;
    }
    if exp == 0 {
        sign * mant / scale * 2f64.powi(1 - bias)
    } else {
        sign * (1.0 + mant / scale) * 2f64.powi(exp - bias)
    }
}

/// Largest finite magnitude's code.
pub fn fp8_max(e4m3: bool) -> u8 {
    if e4m3 { 0x7E } else { 0x7B }
}

/// Every non-negative code's value, from [`fp8_value`].
fn magnitudes(e4m3: bool) -> &'static [f64; 128] {
    static TABLES: OnceLock<[[f64; 128]; 2]> = OnceLock::new();
    let t = TABLES.get_or_init(|| [true, false].map(|e| std::array::from_fn(|c| fp8_value(c as u8, e))));
    &t[usize::from(!e4m3)]
}

/// `x` rounded to FP8 by search: the nearest finite magnitude, ties to the
/// even code, beyond the largest finite the largest (saturation); NaN to
/// NaN; infinity to the largest finite (E4M3) or infinity (E5M2).
pub fn fp8_round(x: f64, e4m3: bool) -> u8 {
    if x.is_nan() {
        return 0x7F;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    if x.is_infinite() {
        return sign | if e4m3 { 0x7E } else { 0x7C };
    }
    let a = x.abs();
    let table = magnitudes(e4m3);
    let mut best = 0usize;
    for c in 1..=usize::from(fp8_max(e4m3)) {
        let (d, db) = ((table[c] - a).abs(), (table[best] - a).abs());
        if d < db || d == db && c % 2 == 0 {
            best = c;
        }
    }
    // Beyond the largest finite value the distances above lose precision;
    // the nearest finite value is the largest anyway.
    if a >= table[usize::from(fp8_max(e4m3))] {
        best = usize::from(fp8_max(e4m3));
    }
    let best = best as u8;
    sign | best
}

/// `x` rounded to the 16-bit format whose values `to` gives for bit
/// patterns (nearest, ties to the even pattern; IEEE overflow to infinity
/// from `max + ulp/2` on), by checking the neighbours of a first guess in
/// exact f64 arithmetic. Independent of `half`'s `from_f64`, which is not
/// correctly rounded (it rounds through f32, or drops the low 32 bits).
fn round16(x: f64, to: fn(u16) -> f64, guess: u16, max: u16) -> u16 {
    if x.is_nan() {
        return guess;
    }
    let sign = if x.is_sign_negative() { 0x8000 } else { 0 };
    let a = x.abs();
    let (top, below) = (to(max), to(max - 1));
    if a >= top + (top - below) / 2.0 {
        return sign | (max + 1); // infinity
    }
    let g = (guess & 0x7FFF).min(max);
    let mut best = g;
    for c in [g.saturating_sub(1), g, (g + 1).min(max)] {
        let (d, db) = ((to(c) - a).abs(), (to(best) - a).abs());
        if d < db || d == db && c % 2 == 0 {
            best = c;
        }
    }
    sign | best
}

/// `x` correctly rounded to f16.
pub fn round_f16(x: f64) -> f16 {
    let to = |b: u16| f16::from_bits(b).to_f64();
    f16::from_bits(round16(x, to, f16::from_f32(x as f32).to_bits(), 0x7BFF))
}

/// `x` correctly rounded to bf16.
pub fn round_bf16(x: f64) -> bf16 {
    let to = |b: u16| bf16::from_bits(b).to_f64();
    bf16::from_bits(round16(x, to, bf16::from_f32(x as f32).to_bits(), 0x7F7F))
}

/// The reference semantics of one element type.
pub trait Ref: Element + Zeroable {
    /// A random value; `any_bits` allows NaN and infinities.
    fn random(rng: &mut Rng, any_bits: bool) -> Self;
    /// `a op b`, computed independently of the crate.
    fn reference(op: ReduceOp, a: Self, b: Self) -> Self;
    /// Whether this is a NaN.
    fn nan(self) -> bool;
    /// Equal bits, or both NaN.
    fn same(self, other: Self) -> bool {
        bytemuck::bytes_of(&self) == bytemuck::bytes_of(&other) || self.nan() && other.nan()
    }
}

macro_rules! int_ref {
    ($t:ty, $wide:ty) => {
        impl Ref for $t {
            fn random(rng: &mut Rng, _: bool) -> Self {
                rng.next() as $t
            }
            fn reference(op: ReduceOp, a: Self, b: Self) -> Self {
                let (x, y) = (a as $wide, b as $wide);
                match op {
                    ReduceOp::Prod => x.wrapping_mul(y) as $t,
                    ReduceOp::Max => x.max(y) as $t,
                    ReduceOp::Min => x.min(y) as $t,
                    _ => (x + y) as $t,
                }
            }
            fn nan(self) -> bool {
                false
            }
        }
    };
}

int_ref!(i8, i128);
int_ref!(u8, u128);
int_ref!(i32, i128);
int_ref!(u32, u128);
int_ref!(i64, i128);
int_ref!(u64, u128);

/// The documented `max`/`min`: `a` if it wins or `b` is NaN, else `b`;
/// of `+0` and `-0` (equal values, other signs), `+0` for max and `-0` for
/// min in either order.
fn pick<T>(op: ReduceOp, a: T, b: T, x: f64, y: f64) -> T {
    let a_wins = if op == ReduceOp::Max { x > y } else { x < y };
    let tie = x == y && x.is_sign_negative() != y.is_sign_negative();
    let a_by_sign = if op == ReduceOp::Max { y.is_sign_negative() } else { x.is_sign_negative() };
    if a_wins || y.is_nan() || (tie && a_by_sign) { a } else { b }
}

/// Sum and product in f64 (exact for every narrow pair), then one rounding.
fn arith(op: ReduceOp, x: f64, y: f64) -> f64 {
    if op == ReduceOp::Prod { x * y } else { x + y }
}

macro_rules! float_ref {
    ($t:ty, $to:expr, $from:expr, $finite:expr) => {
        impl Ref for $t {
            fn random(rng: &mut Rng, any_bits: bool) -> Self {
                loop {
                    let x: $t = bytemuck::cast_slice::<u64, $t>(&[rng.next()])[0];
                    if any_bits || $finite(x) {
                        return x;
                    }
                }
            }
            fn reference(op: ReduceOp, a: Self, b: Self) -> Self {
                let (x, y) = ($to(a), $to(b));
                match op {
                    ReduceOp::Max | ReduceOp::Min => pick(op, a, b, x, y),
                    _ => $from(arith(op, x, y)),
                }
            }
            fn nan(self) -> bool {
                $to(self).is_nan()
            }
        }
    };
}

float_ref!(f32, f64::from, |v: f64| v as f32, f32::is_finite);
float_ref!(f64, |v: f64| v, |v: f64| v, f64::is_finite);
float_ref!(f16, f16::to_f64, round_f16, f16::is_finite);
float_ref!(bf16, bf16::to_f64, round_bf16, bf16::is_finite);
float_ref!(
    F8E4M3,
    |v: F8E4M3| fp8_value(v.to_bits(), true),
    |v: f64| F8E4M3::from_bits(fp8_round(v, true)),
    |v: F8E4M3| fp8_value(v.to_bits(), true).is_finite()
);
float_ref!(
    F8E5M2,
    |v: F8E5M2| fp8_value(v.to_bits(), false),
    |v: f64| F8E5M2::from_bits(fp8_round(v, false)),
    |v: F8E5M2| fp8_value(v.to_bits(), false).is_finite()
);

/// `len` bytes at `offset` into 8-aligned storage: offset 0 is aligned for
/// every type, an odd offset misaligned for every type wider than a byte.
pub struct Buf {
    store: Vec<u64>,
    offset: usize,
    len: usize,
}

impl Buf {
    pub fn new<T: Element>(values: &[T], offset: usize) -> Buf {
        let bytes: &[u8] = bytemuck::cast_slice(values);
        let mut b = Buf::filled(bytes.len(), offset, 0);
        b.bytes_mut().copy_from_slice(bytes);
        b
    }
    pub fn filled(len: usize, offset: usize, byte: u8) -> Buf {
        let mut store = vec![0u64; (len + offset).div_ceil(8) + 1];
        bytemuck::cast_slice_mut::<u64, u8>(&mut store).fill(byte);
        Buf { store, offset, len }
    }
    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice::<u64, u8>(&self.store)[self.offset..self.offset + self.len]
    }
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut::<u64, u8>(&mut self.store)[self.offset..self.offset + self.len]
    }
    pub fn values<T: Element>(&self) -> Vec<T> {
        values(self.bytes())
    }
}

/// Elements read from bytes at any alignment.
pub fn values<T: Element>(bytes: &[u8]) -> Vec<T> {
    bytes.chunks_exact(size_of::<T>()).map(bytemuck::pod_read_unaligned).collect()
}

/// `n` random values.
pub fn random_vec<T: Ref>(rng: &mut Rng, n: usize, any_bits: bool) -> Vec<T> {
    (0..n).map(|_| T::random(rng, any_bits)).collect()
}

/// Asserts `got` and `want` agree element by element ([`Ref::same`]).
#[track_caller]
pub fn assert_same<T: Ref>(got: &[T], want: &[T], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(g.same(*w), "{what}: element {i}: got {g:?}, want {w:?}");
    }
}

/// Runs `$f::<T>()` for every element type.
#[macro_export]
macro_rules! for_all_types {
    ($f:ident) => {{
        $f::<i8>();
        $f::<u8>();
        $f::<i32>();
        $f::<u32>();
        $f::<i64>();
        $f::<u64>();
        $f::<half::f16>();
        $f::<f32>();
        $f::<f64>();
        $f::<half::bf16>();
        $f::<oxccl_core::F8E4M3>();
        $f::<oxccl_core::F8E5M2>();
    }};
}
