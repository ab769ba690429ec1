//! Throughput of the f32 sum `reduce_into` (acc += b) on byte buffers, timed
//! exactly as the C baseline `benches/c/add.c` times `a[i] += b[i]`, so that
//! `tools/bench-kernels` can print the two side by side.
//!
//! For each size S (bytes of ONE buffer: 4 KiB, 256 KiB, 64 MiB): two
//! 64-byte-aligned buffers of S bytes, touched first; one repetition calls
//! the kernel max(16, 1 GiB / S) times; 9 repetitions. GB/s counts S (the
//! destination's bytes) per call, 1 GB = 1e9 bytes. Prints one line per
//! size: `S best_GBps median_GBps`.
//!
//! `cargo run --release -p oxccl-core --example kernel_speed [TYPE]`
//!
//! With a type name (`bfloat16`, `half`, `int8` …), times that type's sum
//! instead, on buffers of ones (in the type) rather than the f32 data the C
//! baseline uses.

use bytemuck::{Pod, Zeroable};
use oxccl_core::{DataType, ReduceOp, kernels};
use std::hint::black_box;
use std::time::Instant;

const REPS: usize = 9;

/// 64 bytes of floats, 64-byte aligned, as the C baseline's buffers.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C, align(64))]
struct Line([f32; 16]);

fn buffer(bytes: usize, f: impl Fn(usize) -> f32) -> Vec<Line> {
    let mut v = vec![Line([0.0; 16]); bytes / 64];
    for (i, x) in bytemuck::cast_slice_mut::<Line, f32>(&mut v).iter_mut().enumerate() {
        *x = f(i);
    }
    v
}

/// A buffer of ones of type `t`.
fn ones(t: DataType, bytes: usize) -> Vec<Line> {
    let one: Vec<u8> = match t {
        DataType::Float16 => half::f16::ONE.to_ne_bytes().to_vec(),
        DataType::Float32 => 1f32.to_ne_bytes().to_vec(),
        DataType::Float64 => 1f64.to_ne_bytes().to_vec(),
        DataType::Bfloat16 => half::bf16::ONE.to_ne_bytes().to_vec(),
        DataType::Float8E4M3 => vec![oxccl_core::F8E4M3::from_f32(1.0).to_bits()],
        DataType::Float8E5M2 => vec![oxccl_core::F8E5M2::from_f32(1.0).to_bits()],
        DataType::Int8 | DataType::Uint8 => vec![1],
        DataType::Int32 | DataType::Uint32 => 1u32.to_ne_bytes().to_vec(),
        DataType::Int64 | DataType::Uint64 => 1u64.to_ne_bytes().to_vec(),
    };
    let mut v = vec![Line([0.0; 16]); bytes / 64];
    for chunk in bytemuck::cast_slice_mut::<Line, u8>(&mut v).chunks_exact_mut(t.size()) {
        chunk.copy_from_slice(&one);
    }
    v
}

fn main() {
    let t: Option<DataType> = std::env::args().nth(1).map(|s| s.parse().expect("a data type name"));
    let dtype = t.unwrap_or(DataType::Float32);
    for bytes in [4096usize, 256 << 10, 64 << 20] {
        let (mut a, b) = match t {
            None => (buffer(bytes, |i| (i % 1000) as f32), buffer(bytes, |_| 1e-3)),
            Some(t) => (ones(t, bytes), ones(t, bytes)),
        };
        let iters = ((1usize << 30) / bytes).max(16);
        let mut gbps = [0f64; REPS];
        for g in &mut gbps {
            let t0 = Instant::now();
            for _ in 0..iters {
                let acc: &mut [u8] = bytemuck::cast_slice_mut(black_box(&mut a[..]));
                let src: &[u8] = bytemuck::cast_slice(black_box(&b[..]));
                kernels::reduce_into(dtype, ReduceOp::Sum, acc, src).expect("equal lengths");
            }
            *g = (bytes * iters) as f64 / t0.elapsed().as_secs_f64() / 1e9;
        }
        gbps.sort_by(f64::total_cmp);
        println!("{bytes} {:.2} {:.2}", gbps[REPS - 1], gbps[REPS / 2]);
    }
}
