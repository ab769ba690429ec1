//! One real GPU, over oxccl-cuda, as the device path uses it: the staging
//! [`Backend`], the words the host and the kernels share, and what every
//! kernel launch needs (the module a call runs, the copy/scale/average
//! launch).
#![allow(unsafe_code)]

use super::backend::{Backend, Marker, Pinned, Words};
use crate::buf::{CudaStream, DeviceBuf, Region};
use crate::call::Call;
use oxccl_core::{DataType, Error, Result};
use oxccl_cuda::{Device, Event, HostMapped, KernelOp, Module, ReduceArgs, Stream};
use std::sync::Arc;
use std::time::Duration;

/// Threads per block of every kernel of the device path.
pub(super) const THREADS: u32 = 512;

/// The module a call runs (collectives that only move bytes run the byte
/// module) and the count it is given.
pub(super) fn module_of(call: &Call<DeviceBuf>) -> (DataType, KernelOp, usize) {
    if call.kind.reduces() {
        (call.dtype, KernelOp::of(call.op), call.count)
    } else {
        (DataType::Uint8, KernelOp::Sum, call.count * call.dtype.size())
    }
}

/// Enqueues one `oxccl_reduce` of `count` elements of `module`'s type,
/// `dst ← src`, with (premul, scale, avg divisor): a copy with `(0, 1.0, 0)`.
///
/// # Safety
/// `src` and `dst` must be device memory of `count` elements each, alive
/// until the stream has passed the launch (they may be the same).
pub(super) unsafe fn reduce_one(
    module: &Module,
    stream: &Stream,
    blocks: u32,
    (src, dst): (u64, u64),
    count: usize,
    (premul, scale, avg_div): (u32, f64, u32),
) -> Result<()> {
    if count == 0 {
        return Ok(());
    }
    let mut a = ReduceArgs { count: count as u64, scale, nsrcs: 1, ndsts: 1, premul, avg_div, ..Default::default() };
    (a.srcs[0], a.dsts[0]) = (src, dst);
    // SAFETY: the caller vouches for both ranges (see above).
    Ok(unsafe { module.launch_reduce(stream, blocks, THREADS, &a) }?)
}

/// Host-mapped words: `u64[0]` D2H, `u64[1]` H2D, then `u32[4]` the
/// kernels' status code and `u32[5]` the abort request (cuda/args.h's
/// `status` pair, at byte 16).
pub(crate) struct CudaWords(HostMapped);

/// Byte offset of the status pair in the words.
const STATUS_AT: u64 = 16;

/// The status pair's code and abort request, as u32 word indices.
const STATUS_CODE: usize = STATUS_AT as usize / 4;
const STATUS_ABORT: usize = STATUS_CODE + 1;

impl CudaWords {
    fn status_addr(&self) -> u64 {
        self.0.dev_addr() + STATUS_AT
    }

    /// Counter `i`'s device address.
    fn word_addr(&self, i: usize) -> u64 {
        self.0.dev_addr() + 8 * i as u64
    }
}

/// `d` in nanoseconds, as the kernels' timeouts take it.
pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Words for CudaWords {
    fn get(&self, i: usize) -> u64 {
        self.0.u64s()[i].load(std::sync::atomic::Ordering::Acquire)
    }
    fn set(&self, i: usize, v: u64) {
        self.0.u64s()[i].store(v, std::sync::atomic::Ordering::Release)
    }
    fn abort(&self) {
        self.0.u32s()[STATUS_ABORT].store(1, std::sync::atomic::Ordering::Release)
    }
    fn status(&self) -> u32 {
        self.0.u32s()[STATUS_CODE].load(std::sync::atomic::Ordering::Acquire)
    }
}

struct CudaPinned(oxccl_cuda::Pinned);

impl Pinned for CudaPinned {
    fn region(&self) -> Region {
        // SAFETY: the allocation lives as long as `self`, which the stager
        // keeps until the stream has passed the call's last copy; it hands
        // out sub-regions of one chunk at a time to the engine, between
        // that chunk's copy in and copy out (see `Region::from_raw`).
        unsafe { Region::from_raw(self.0.as_ptr(), self.0.len(), true) }
    }
}

struct CudaMarker(Event);

impl Marker for CudaMarker {
    fn done(&self) -> Result<bool> {
        Ok(self.0.query()?)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// One GPU, as the device path uses it.
pub(crate) struct Gpu {
    pub dev: Device,
    pub words: CudaWords,
    /// The module the type-free kernels (signal, wait, copies) come from.
    pub bytes: Arc<Module>,
}

impl Gpu {
    /// Opens GPU `ordinal` and loads the byte module, with `also` (the
    /// modules compile in parallel; a failure of `also` shows when it is
    /// asked for again).
    pub(super) fn open(ordinal: usize, also: &[(DataType, KernelOp)]) -> Result<Gpu> {
        let dev = Device::open(ordinal)?;
        let words = CudaWords(dev.host_mapped(32)?);
        let byte = (DataType::Uint8, KernelOp::Sum);
        if dev.preload(&[&[byte], also].concat()).is_err() {
            tracing::debug!("GPU {ordinal}: preloading {also:?} failed; the byte module alone then");
        }
        let bytes = dev.module(byte.0, byte.1)?;
        Ok(Gpu { dev, words, bytes })
    }

    /// The caller's stream on this device.
    pub fn stream(&self, s: CudaStream) -> Stream {
        // SAFETY: the handle is the caller's stream (or 0, the legacy
        // default stream), which the API contract keeps alive while calls
        // on it are pending; the wrapper does not own or destroy it.
        unsafe { self.dev.wrap_stream(s.0 as usize as *mut std::ffi::c_void) }
    }

    /// The status pair's device address (for kernels).
    pub fn status_addr(&self) -> u64 {
        self.words.status_addr()
    }
}

impl Backend for Gpu {
    fn words(&self) -> &dyn Words {
        &self.words
    }

    fn pinned(&self, bytes: usize) -> Result<Box<dyn Pinned>> {
        Ok(Box::new(CudaPinned(self.dev.pinned(bytes)?)))
    }

    fn check(&self, _what: &str, buf: DeviceBuf) -> Result<()> {
        Ok(self.dev.check_device_range(buf.addr(), buf.len())?)
    }

    fn enqueue_d2h(&self, s: CudaStream, dst: Region, src: DeviceBuf) -> Result<()> {
        // SAFETY: `dst` is page-locked staging memory of `src.len()` bytes
        // that nothing touches until the stream signals the copy done;
        // `src` was checked to be device memory of that length.
        Ok(unsafe { self.stream(s).memcpy_dtoh(dst.addr() as *mut u8, src.addr(), src.len()) }?)
    }

    fn enqueue_h2d(&self, s: CudaStream, dst: DeviceBuf, src: Region) -> Result<()> {
        // SAFETY: as above, the other way: the host wrote `src` before it
        // signalled, and leaves it alone until the stream has passed.
        Ok(unsafe { self.stream(s).memcpy_htod(dst.addr(), src.addr() as *const u8, dst.len()) }?)
    }

    fn enqueue_signal(&self, s: CudaStream, i: usize, v: u64) -> Result<()> {
        // SAFETY: the address is one of our host-mapped u64 counters.
        Ok(unsafe { self.bytes.signal_host(&self.stream(s), self.words.word_addr(i), v) }?)
    }

    fn enqueue_wait(&self, s: CudaStream, i: usize, v: u64, timeout: Duration) -> Result<()> {
        let (word, ns) = (self.words.word_addr(i), nanos(timeout));
        // SAFETY: `word` and the status pair are our host-mapped memory,
        // alive as long as the communicator.
        Ok(unsafe { self.bytes.wait_host(&self.stream(s), word, v, self.status_addr(), ns) }?)
    }

    fn enqueue_after(&self, s: CudaStream, m: &dyn Marker) -> Result<()> {
        let m = m.as_any().downcast_ref::<CudaMarker>().ok_or_else(|| Error::Internal("a foreign marker".into()))?;
        Ok(self.stream(s).wait_event(&m.0)?)
    }

    fn marker(&self, s: CudaStream) -> Result<Box<dyn Marker>> {
        let e = self.dev.new_event()?;
        e.record(&self.stream(s))?;
        Ok(Box::new(CudaMarker(e)))
    }

    fn synchronize(&self, s: CudaStream, timeout: Duration) -> Result<()> {
        Ok(self.stream(s).synchronize(timeout)?)
    }
}
