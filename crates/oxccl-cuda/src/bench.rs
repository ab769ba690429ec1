//! The reduce kernel's bandwidth next to a device-to-device copy on the
//! same GPU, in the same run (`oxccl-kernel-bw`).
#![allow(unsafe_code)]

use crate::args::ReduceArgs;
use crate::error::Result;
use crate::op::KernelOp;
use crate::{DevMem, Device};
use oxccl_core::DataType;
use std::time::{Duration, Instant};

/// One measurement: seconds per operation and bytes read + written by it.
#[derive(Clone, Copy, Debug)]
pub struct Rate {
    /// Seconds per operation (mean over the timed iterations).
    pub sec: f64,
    /// Bytes the operation reads and writes.
    pub bytes: usize,
}

impl Rate {
    /// GB/s (10⁹ bytes) of memory traffic.
    pub fn gbps(&self) -> f64 {
        self.bytes as f64 / self.sec / 1e9
    }
}

/// Times `iters` runs of `f` on `dev`'s null stream after `warm` untimed ones.
fn time(dev: &Device, warm: usize, iters: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let s = dev.null_stream();
    for _ in 0..warm {
        f()?;
    }
    s.synchronize(Duration::from_secs(60))?;
    let t0 = Instant::now();
    for _ in 0..iters {
        f()?;
    }
    s.synchronize(Duration::from_secs(600))?;
    Ok(t0.elapsed().as_secs_f64() / iters.max(1) as f64)
}

/// A copy of `bytes` (`cuMemcpyDtoDAsync`) and a `nsrcs`-source sum of
/// `dtype` over the same bytes per source (`oxccl_reduce`), each timed over
/// `iters` runs. Needs a GPU.
pub fn reduce_vs_copy(dev: &Device, dtype: DataType, bytes: usize, nsrcs: usize, iters: usize) -> Result<(Rate, Rate)> {
    let count = bytes / dtype.size();
    let bytes = count * dtype.size();
    let srcs: Vec<DevMem> = (0..nsrcs.max(1)).map(|_| dev.alloc_zeroed(bytes)).collect::<Result<_>>()?;
    let dst = dev.alloc_zeroed(bytes)?;
    let s = dev.null_stream();
    let copy = time(dev, 2, iters, || {
        // SAFETY: both are our allocations of `bytes` bytes.
        unsafe { s.memcpy_dtod(dst.addr(), srcs[0].addr(), bytes) }
    })?;
    let module = dev.module(dtype, KernelOp::Sum)?;
    let mut args = ReduceArgs { count: count as u64, nsrcs: srcs.len() as u32, ndsts: 1, ..Default::default() };
    for (i, m) in srcs.iter().enumerate() {
        args.srcs[i] = m.addr();
    }
    args.dsts[0] = dst.addr();
    let grid = dev.sm_count() * 4;
    let reduce = time(dev, 2, iters, || {
        // SAFETY: every address is one of our allocations of `count` elements.
        unsafe { module.launch_reduce(&s, grid, 512, &args) }
    })?;
    Ok((Rate { sec: copy, bytes: 2 * bytes }, Rate { sec: reduce, bytes: (srcs.len() + 1) * bytes }))
}
