//! The device path on a real GPU, over oxccl-cuda: the staging
//! [`Backend`], and the set-up a communicator's first device call runs.
#![allow(unsafe_code)]

use super::backend::{Backend, Marker, Pinned, Words};
use super::direct::{self, Direct};
use super::route::{self, Card, Route};
use super::{Ctx, DeviceComm};
use crate::buf::{CudaStream, DeviceBuf, Region};
use crate::call::Call;
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
    pub bytes: Arc<Module>,
}

impl Gpu {
    /// Opens GPU `ordinal` and loads the byte module, with `also` (the
    /// modules compile in parallel; a failure of `also` shows when it is
    /// asked for again).
    fn open(ordinal: usize, also: &[(DataType, KernelOp)]) -> Result<Gpu> {
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

/// Sets up the device side of `comm` on the GPU that holds `buf`:
/// collective (every rank's first device call runs it; `first` is that
/// call when it is a collective, `None` for sends and receives, which differ
/// from rank to rank).
///
/// Everything that can wait for the GPU's queued work (module loading,
/// allocations) happens here, before the exchanges that every rank must
/// pass before any launches a kernel of this communicator: the byte module
/// (staging kernels, byte collectives) and the module of the first call
/// load before the card exchange. Later calls allocate nothing on the
/// direct path; a later first use of another module waits for this rank's
/// earlier kernels before loading it (`Direct::load_for`); the staged path
/// grows its pinned pool only with none of its copies in flight (`stage`).
/// Kernels of other communicators, or the application's, queued in the same
/// context are outside oxccl's reach: a process that runs several ranks as
/// threads must not load modules or allocate while such kernels wait for
/// each other.
pub(super) fn open(ctx: &Ctx<'_>, buf: DeviceBuf, first: Option<&Call<DeviceBuf>>) -> Result<DeviceComm> {
    let who = ctx.who;
    oxccl_cuda::driver_available().map_err(|e| Error::Unavailable(format!("{who}: {e}")))?;
    let ordinal = oxccl_cuda::device_of(buf.addr())?;
    let cfg = ctx.cfg;
    // Sends and receives run the byte module, which always loads.
    let (dtype, kop) = first.map_or((DataType::Uint8, KernelOp::Sum), |c| {
        let (d, k, _) = direct::module_of(c);
        (d, k)
    });
    let also = if cfg.device_path == DevicePath::Staged { vec![] } else { vec![(dtype, kop)] };
    let gpu = Arc::new(Gpu::open(ordinal, &also)?);
    // Everyone exchanges a card, even ranks that want the staged path, so
    // that all decide together.
    let window = if cfg.device_path == DevicePath::Staged {
        None
    } else {
        gpu.dev
            .alloc_zeroed(
                oxccl_cuda::FLAG_BYTES + cfg.device_window + super::exec::extra_bytes(ctx.nranks, cfg.device_fifo),
            )
            .ok()
    };
    // The first call's module, and how many blocks of the direct kernel the
    // GPU holds at once; a failure here means no direct path.
    let resident = match &window {
        None => Ok(0),
        Some(_) => gpu
            .dev
            .module(dtype, kop)
            .map_err(Error::from)
            .and_then(|m| Ok(direct::resident(&gpu, &m)?.min(direct::resident(&gpu, &gpu.bytes)?))),
    };
    let resident = resident.unwrap_or_else(|e| {
        tracing::warn!("{who}: no direct device path on this rank: {e}");
        0
    });
    let handle = window.as_ref().and_then(|w| w.ipc_handle().ok());
    let card = Card {
        pid: std::process::id(),
        uuid: gpu.dev.uuid(),
        base: window.as_ref().map_or(0, |w| w.addr()),
        window: cfg.device_window as u64,
        blocks: cfg.device_blocks as u32,
        wants: cfg.device_path,
        ready: window.is_some() && resident > 0 && (handle.is_some() || ctx.nranks == 1),
        mps: gpu.dev.mps_enabled(),
        compute_mode: gpu.dev.compute_mode().min(255) as u8,
        handle: handle.unwrap_or([0; 64]),
        resident,
    };
    let gathered = ctx.boot.all_gather(&card.encode())?;
    let cards = gathered
        .iter()
        .enumerate()
        .map(|(r, b)| Card::decode(r, b))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(Error::Internal)?;
    let hosts: Vec<&str> = ctx.boot.peers().iter().map(|p| p.host.as_str()).collect();
    let process_ranks = route::process_ranks(ctx.rank, &cards, &hosts);
    let route = route::decide(ctx.rank, &cards, &hosts).map_err(|e| Error::InvalidUsage(format!("{who}: {e}")))?;
    let demanded = cards.iter().position(|c| c.wants == DevicePath::Direct);
    let stager = super::stage::Stager::new(gpu.clone(), cfg.stage_chunk, cfg.timeout, who);
    // The staging memory of the first call, when it is staged, is
    // allocated here, before the last exchange (see `Stager::prepare`).
    let prepare = |direct: bool| -> Result<()> {
        if let Some(first) = first
            && !(direct && super::direct_kind(first.kind))
        {
            stager.prepare(first)?;
        }
        // Sends and receives of device buffers through host memory: their
        // staging is allocated once, here, with everyone else's.
        if direct { Ok(()) } else { stager.prepare_p2p() }
    };
    let direct = match (route, window) {
        (Route::Direct { blocks, window: bytes, peers, on_gpu, capped, warning }, Some(mem)) => {
            if let Some(w) = warning {
                tracing::warn!("{who}: device path direct although {w}");
            }
            if let Some(c) = capped {
                tracing::info!("{who}: device kernels of {c}");
            }
            let uniform = cards.iter().all(|c| c.window == cfg.device_window as u64);
            let d = Direct::open(ctx, gpu.clone(), mem, &peers, (blocks, on_gpu), bytes, uniform);
            let d = d.and_then(|d| prepare(true).map(|()| d));
            // Everyone must have opened every peer, or nobody goes direct.
            let ok = ctx.boot.all_gather(&[d.is_ok() as u8])?;
            match d {
                Ok(d) if ok.iter().all(|b| b == &[1]) => Some(d),
                other => {
                    // Our window and mappings, if any, are freed here,
                    // before the barrier below.
                    let why = other.err().map_or_else(|| "a peer could not open the windows".into(), |e| e.to_string());
                    if let Some(r) = demanded {
                        return Err(Error::Unavailable(format!(
                            "{who}: rank {r} asked for the direct device path (OXCCL_DEVICE_PATH=direct), but {why}"
                        )));
                    }
                    tracing::warn!("{who}: device path staged: {why}");
                    None
                }
            }
        }
        (Route::Staged(reason), window) => {
            drop(window);
            tracing::info!("{who}: device path staged: {reason}");
            None
        }
        (Route::Direct { .. }, None) => return Err(Error::Internal("direct route without a window".into())),
    };
    match &direct {
        Some(_) => tracing::info!("{who}: device path direct on GPU {ordinal}"),
        None => {
            // Freeing device memory and allocating pinned memory wait for the
            // GPU's queued work: no rank may enqueue a staged call before
            // every rank is past them.
            let prepared = prepare(false);
            ctx.boot.barrier()?;
            prepared?;
        }
    }
    Ok(DeviceComm { stager, dev: gpu, direct, process_ranks })
}
