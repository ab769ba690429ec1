//! Throughput of the host reduction kernels (crate `oxccl-core`).
//!
//! `cargo bench -p oxccl-benches --bench reduce` (add a filter such as `float`
//! or `64MiB` to run a part).
//!
//! - `reduce_into_sum_<size>/<type>`: `acc += b` on byte buffers of every
//!   type;
//! - `reduce_n4_sum_<size>/<type>`: `dst = s0 + s1 + s2 + s3`, fused, for
//!   float and bfloat16;
//!
//! at 4 KiB (L1), 256 KiB (L2) and 64 MiB (memory) per buffer.
//!
//! Throughput counts the bytes of ONE buffer (the destination) per call, as
//! nccl-tests' `algbw` counts the message size and as `benches/c/add.c` and
//! `examples/kernel_speed.rs` count (`tools/bench-kernels` compares those
//! two). The memory traffic of `acc += b` is three times that (two reads, one
//! write); of the fused 4-source sum, five times.

use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput, criterion_main};
use half::{bf16, f16};
use oxccl_core::kernels::{reduce_into, reduce_n};
use oxccl_core::{DataType, F8E4M3, F8E5M2, ReduceOp};
use std::time::Duration;

const SIZES: [(usize, &str); 3] = [(4 << 10, "4KiB"), (256 << 10, "256KiB"), (64 << 20, "64MiB")];

/// The bytes of the value 1 in `t`: sums of ones stay normal numbers (no
/// subnormal slow paths) and saturate or wrap without NaN.
fn one(t: DataType) -> Vec<u8> {
    match t {
        DataType::Int8 | DataType::Uint8 => vec![1],
        DataType::Int32 | DataType::Uint32 => 1u32.to_ne_bytes().to_vec(),
        DataType::Int64 | DataType::Uint64 => 1u64.to_ne_bytes().to_vec(),
        DataType::Float16 => f16::ONE.to_ne_bytes().to_vec(),
        DataType::Float32 => 1f32.to_ne_bytes().to_vec(),
        DataType::Float64 => 1f64.to_ne_bytes().to_vec(),
        DataType::Bfloat16 => bf16::ONE.to_ne_bytes().to_vec(),
        DataType::Float8E4M3 => vec![F8E4M3::from_f32(1.0).to_bits()],
        DataType::Float8E5M2 => vec![F8E5M2::from_f32(1.0).to_bits()],
    }
}

/// A buffer of `bytes` bytes holding ones, 8-byte aligned.
fn ones(t: DataType, bytes: usize) -> Vec<u64> {
    let mut v = vec![0u64; bytes / 8];
    let one = one(t);
    for chunk in bytemuck::cast_slice_mut::<u64, u8>(&mut v).chunks_exact_mut(one.len()) {
        chunk.copy_from_slice(&one);
    }
    v
}

/// A group for one size, with a short default run.
fn group<'a>(
    c: &'a mut Criterion,
    name: &str,
    bytes: usize,
    label: &str,
) -> criterion::BenchmarkGroup<'a, criterion::measurement::WallTime> {
    let mut g = c.benchmark_group(format!("{name}_{label}"));
    g.throughput(Throughput::Bytes(bytes as u64));
    g.warm_up_time(Duration::from_millis(500));
    if bytes >= 1 << 24 {
        g.sample_size(10).sampling_mode(SamplingMode::Flat);
        g.measurement_time(Duration::from_secs(2));
    } else {
        g.sample_size(20).measurement_time(Duration::from_secs(1));
    }
    g
}

// Buffers are made on a benchmark's first run (`get_or_insert_with`), so that
// benchmarks a filter leaves out allocate nothing.

fn sum_into(c: &mut Criterion) {
    for (bytes, label) in SIZES {
        let mut g = group(c, "reduce_into_sum", bytes, label);
        for t in DataType::ALL {
            let mut bufs = None;
            g.bench_function(BenchmarkId::from_parameter(t), |bench| {
                let (acc, b) = bufs.get_or_insert_with(|| (ones(t, bytes), ones(t, bytes)));
                bench.iter(|| {
                    let acc: &mut [u8] = bytemuck::cast_slice_mut(acc);
                    reduce_into(t, ReduceOp::Sum, acc, bytemuck::cast_slice(b))
                })
            });
        }
        g.finish();
    }
}

fn fused4(c: &mut Criterion) {
    for (bytes, label) in SIZES {
        let mut g = group(c, "reduce_n4_sum", bytes, label);
        for t in [DataType::Float32, DataType::Bfloat16] {
            let mut bufs = None;
            g.bench_function(BenchmarkId::from_parameter(t), |bench| {
                let (srcs, dst) = bufs.get_or_insert_with(|| {
                    let srcs: Vec<Vec<u64>> = (0..4).map(|_| ones(t, bytes)).collect();
                    (srcs, vec![0u64; bytes / 8])
                });
                let refs: Vec<&[u8]> = srcs.iter().map(|s| bytemuck::cast_slice(s)).collect();
                bench.iter(|| reduce_n(t, ReduceOp::Sum, bytemuck::cast_slice_mut(dst), &refs))
            });
        }
        g.finish();
    }
}

// `criterion_group!` defines an undocumented public function.
#[allow(missing_docs)]
mod harness {
    criterion::criterion_group!(benches, super::sum_into, super::fused4);
}
criterion_main!(harness::benches);
