//! The device path on a real GPU, over oxccl-cuda: the staging
//! [`Backend`], and the set-up a communicator's first device call runs.
#![allow(unsafe_code)]

use super::backend::{Backend, Marker, Pinned, Words};
use super::direct::Direct;
use super::route::{self, Card, Route};
use super::{Ctx, DeviceComm};
use crate::buf::{CudaStream, DeviceBuf, Region};
use crate::config::DevicePath;
use oxccl_core::{DataType, Error, Result};
use oxccl_cuda::{Device, Event, HostMapped, KernelOp, Module, Stream};
use std::sync::Arc;
use std::time::Duration;

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
    bytes: Arc<Module>,
}

impl Gpu {
    fn open(ordinal: usize) -> Result<Gpu> {
        let dev = Device::open(ordinal)?;
        let words = CudaWords(dev.host_mapped(32)?);
        let bytes = dev.module(DataType::Uint8, KernelOp::Sum)?;
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

/// Sets up the device side of `comm` on the GPU that holds `buf`:
/// collective (every rank's first device call runs it).
pub(super) fn open(ctx: &Ctx<'_>, buf: DeviceBuf) -> Result<DeviceComm> {
    let who = ctx.who;
    oxccl_cuda::driver_available().map_err(|e| Error::Unavailable(format!("{who}: {e}")))?;
    let ordinal = oxccl_cuda::device_of(buf.addr())?;
    let gpu = Arc::new(Gpu::open(ordinal)?);
    let cfg = ctx.cfg;
    // Everyone exchanges a card, even ranks that want the staged path, so
    // that all decide together.
    let window = if cfg.device_path == DevicePath::Staged {
        None
    } else {
        gpu.dev.alloc_zeroed(oxccl_cuda::FLAG_BYTES + cfg.device_window).ok()
    };
    let handle = window.as_ref().and_then(|w| w.ipc_handle().ok());
    let card = Card {
        pid: std::process::id(),
        uuid: gpu.dev.uuid(),
        base: window.as_ref().map_or(0, |w| w.addr()),
        window: cfg.device_window as u64,
        blocks: cfg.device_blocks as u32,
        wants: cfg.device_path,
        ready: window.is_some() && (handle.is_some() || ctx.nranks == 1),
        handle: handle.unwrap_or([0; 64]),
    };
    let gathered = ctx.boot.all_gather(&card.encode())?;
    let cards = gathered
        .iter()
        .enumerate()
        .map(|(r, b)| Card::decode(r, b))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(Error::Internal)?;
    let hosts: Vec<&str> = ctx.boot.peers().iter().map(|p| p.host.as_str()).collect();
    let route = route::decide(ctx.rank, &cards, &hosts).map_err(|e| Error::InvalidUsage(format!("{who}: {e}")))?;
    let direct = match (route, window) {
        (Route::Direct { blocks, window: bytes, peers }, Some(mem)) => {
            let d = Direct::open(ctx, gpu.clone(), mem, &peers, blocks, bytes);
            // Everyone must have opened every peer, or nobody goes direct.
            let ok = ctx.boot.all_gather(&[d.is_ok() as u8])?;
            match d {
                Ok(d) if ok.iter().all(|b| b == &[1]) => Some(d),
                Err(e) if cfg.device_path == DevicePath::Direct => return Err(e),
                other => {
                    let why = other.err().map_or_else(|| "a peer could not open the windows".into(), |e| e.to_string());
                    tracing::warn!("{who}: device path staged: {why}");
                    None
                }
            }
        }
        (Route::Staged(reason), _) => {
            tracing::info!("{who}: device path staged: {reason}");
            None
        }
        (Route::Direct { .. }, None) => return Err(Error::Internal("direct route without a window".into())),
    };
    if direct.is_some() {
        tracing::info!("{who}: device path direct on GPU {ordinal}");
    }
    Ok(DeviceComm {
        stager: super::stage::Stager::new(gpu.clone(), cfg.stage_chunk, cfg.timeout, who),
        dev: gpu,
        direct,
    })
}
