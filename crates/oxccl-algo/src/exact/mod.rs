//! Inputs whose results any reduction order gives bit for bit, and the
//! check of a rank's receive buffer against a reference computed here.
//!
//! Every input is a small integer, chosen per type and operator so that
//! every partial result is exactly representable (the "budget" of a type
//! is the largest integer below which all integers are exact: 16 for
//! f8e4m3, 8 for f8e5m2, 256 for bfloat16, 2048 for half):
//! - sum, mulsum: non-negative values; with many ranks only every `s`-th
//!   rank contributes to an element, so no element's total exceeds the
//!   budget (halved for mulsum, whose per-rank scalar is 1 or 2);
//! - avg: every rank holds `w(i)` plus or minus one on two ranks, so the
//!   sum is `n × w(i)` and the average exactly `w(i)`;
//! - prod: ones and twos, few enough twos per element for a power of two
//!   the type holds;
//! - max, min and the collectives that move data: values in a range the
//!   type holds, different per rank and position.
//!
//! The reference is f64 arithmetic over the contributions that
//! [`Collective::expected`] names, converted to the element type; the
//! check compares bits. oxccl-perf's check and the end-to-end tests both
//! use this one generator and reference.

use crate::collective::{CollKind, Collective, Expect};
use oxccl_core::{DataType, ReduceOp};

/// The largest integer below which every integer is exact in `dtype`
/// (capped: larger budgets add nothing to the check).
pub fn budget(dtype: DataType) -> u64 {
    match dtype {
        DataType::Int8 => 127,
        DataType::Uint8 => 255,
        DataType::Float8E4M3 => 16,
        DataType::Float8E5M2 => 8,
        DataType::Bfloat16 => 256,
        DataType::Float16 => 2048,
        _ => 1 << 20,
    }
}

/// The largest power of two (its exponent) a product may reach in `dtype`.
fn max_twos(dtype: DataType) -> u64 {
    match dtype {
        DataType::Int8 => 6,
        DataType::Uint8 => 7,
        DataType::Float8E4M3 => 8,
        DataType::Float8E5M2 | DataType::Float16 => 15,
        _ => 30,
    }
}

fn mix(rank: usize, i: usize, seed: u64) -> u64 {
    let x = (i as u64) ^ ((rank as u64) << 40) ^ seed.wrapping_mul(0x2545_f491_4f6c_dd1d);
    let x = x.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (x ^ (x >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9) >> 32
}

/// The multiplier rank `rank` applies under mulsum (a power of two, so
/// products stay exact).
pub fn premul_scalar(rank: usize) -> f64 {
    1.0 + (rank % 2) as f64
}

/// The inputs of one measurement: a pure function of (rank, index), so
/// every rank can compute every other rank's input.
#[derive(Clone, Copy, Debug)]
pub struct Pattern {
    kind: CollKind,
    dtype: DataType,
    op: ReduceOp,
    nranks: usize,
    seed: u64,
    /// sum/mulsum/avg/prod: stride of contributing ranks; others: unused.
    stride: usize,
    /// Upper bound of the varying part of a value.
    vmax: u64,
}

impl Pattern {
    /// The pattern for `kind` with `op` (ignored unless `kind` reduces) on
    /// `nranks` ranks; `seed` makes each measurement's data different.
    pub fn new(kind: CollKind, dtype: DataType, op: ReduceOp, nranks: usize, seed: u64) -> Pattern {
        let n = nranks.max(1) as u64;
        let b = budget(dtype);
        let op = if kind.reduces() { op } else { ReduceOp::Max };
        let (stride, vmax) = match op {
            ReduceOp::Sum | ReduceOp::PreMulSum { .. } => {
                let cap = if matches!(op, ReduceOp::Sum) { b } else { b / 2 };
                let s = n.div_ceil(cap).max(1);
                let k = n.div_ceil(s);
                (s, (cap / k).clamp(1, 255))
            }
            ReduceOp::Avg => (1, ((b - 1) / n).min(255)),
            ReduceOp::Prod => (n.div_ceil(max_twos(dtype)).max(2), 1),
            ReduceOp::Max | ReduceOp::Min => (1, b.min(254)),
        };
        Pattern { kind, dtype, op, nranks: n as usize, seed, stride: stride as usize, vmax }
    }

    /// Rank `rank`'s input element `i`.
    pub fn value(&self, rank: usize, i: usize) -> f64 {
        let h = mix(rank, i, self.seed);
        match self.op {
            ReduceOp::Sum | ReduceOp::PreMulSum { .. } => {
                if (i + rank).is_multiple_of(self.stride) {
                    (1 + h % self.vmax) as f64
                } else {
                    0.0
                }
            }
            ReduceOp::Avg => {
                if self.vmax == 0 {
                    return 0.0;
                }
                let w = 1 + mix(0, i, self.seed) % self.vmax;
                let up = (i + self.seed as usize) % self.nranks;
                let down = (up + 1) % self.nranks;
                let d = match self.nranks {
                    1 => 0.0,
                    _ if rank == up => 1.0,
                    _ if rank == down => -1.0,
                    _ => 0.0,
                };
                w as f64 + d
            }
            ReduceOp::Prod => {
                if (i + rank + self.seed as usize).is_multiple_of(self.stride) {
                    2.0
                } else {
                    1.0
                }
            }
            ReduceOp::Max | ReduceOp::Min => {
                let v = h % (self.vmax + 1);
                if self.dtype.is_float() || self.dtype.is_signed_int() {
                    v as f64 - (self.vmax / 2) as f64
                } else {
                    v as f64
                }
            }
        }
    }

    /// The value output element `k` of segment `e` must hold.
    fn reference(&self, e: &Expect, k: usize) -> f64 {
        let idx = e.base + k;
        if !self.kind.reduces() {
            return self.value(e.ranks[0], idx);
        }
        let vals = e.ranks.iter().map(|&r| (r, self.value(r, idx)));
        match self.op {
            ReduceOp::Sum => vals.map(|(_, v)| v).sum(),
            ReduceOp::PreMulSum { .. } => vals.map(|(r, v)| v * premul_scalar(r)).sum(),
            ReduceOp::Avg => (vals.map(|(_, v)| v).sum::<f64>() / e.ranks.len() as f64).trunc(),
            ReduceOp::Prod => vals.map(|(_, v)| v).product(),
            ReduceOp::Max => vals.map(|(_, v)| v).fold(f64::MIN, f64::max),
            ReduceOp::Min => vals.map(|(_, v)| v).fold(f64::MAX, f64::min),
        }
    }

    /// Writes rank `rank`'s input (elements `0..dst.len()/size`) into `dst`.
    pub fn fill(&self, rank: usize, dst: &mut [u8]) {
        oxccl_core::with_element_type!(self.dtype, T => fill_typed::<T>(dst, |i| self.value(rank, i)))
    }

    /// Counts the elements of `window` that differ from what it must hold:
    /// `window` is the part of a receive buffer the check examines, which
    /// was zero before the call except for the input at `input_at` (in
    /// place); the call's output sits at `output_at` (elements from the
    /// window's start; either may lie outside it).
    pub fn count_wrong(
        &self,
        coll: &Collective,
        rank: usize,
        window: &[u8],
        input_at: Option<isize>,
        output_at: isize,
    ) -> u64 {
        let segs = coll.expected(rank);
        let input_len = coll.input_len(rank) as isize;
        let want = |w: usize| -> f64 {
            let at = w as isize;
            let o = at - output_at;
            if o >= 0 {
                // Segments come in increasing order of `start`.
                let o = o as usize;
                let j = segs.partition_point(|e| e.start <= o);
                if let Some(e) = j.checked_sub(1).map(|j| &segs[j]).filter(|e| o < e.start + e.len) {
                    return self.reference(e, o - e.start);
                }
            }
            match input_at {
                Some(i) if at >= i && at < i + input_len => self.value(rank, (at - i) as usize),
                _ => 0.0,
            }
        };
        oxccl_core::with_element_type!(self.dtype, T => count_wrong_typed::<T>(window, want))
    }
}

fn fill_typed<T: oxccl_core::Element>(dst: &mut [u8], value: impl Fn(usize) -> f64) {
    for (i, chunk) in dst.chunks_exact_mut(size_of::<T>()).enumerate() {
        chunk.copy_from_slice(bytemuck::bytes_of(&T::from_scalar(value(i))));
    }
}

fn count_wrong_typed<T: oxccl_core::Element>(window: &[u8], want: impl Fn(usize) -> f64) -> u64 {
    let mut wrong = 0;
    for (i, chunk) in window.chunks_exact(size_of::<T>()).enumerate() {
        if chunk != bytemuck::bytes_of(&T::from_scalar(want(i))) {
            wrong += 1;
        }
    }
    wrong
}

#[cfg(test)]
mod tests;
