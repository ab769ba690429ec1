//! The set-up a communicator's first device launch runs: which GPU, the
//! card every rank publishes, the route (direct or staged) and the memory
//! each path needs.

use super::direct::{self, Direct};
use super::gpu::{Gpu, module_of};
use super::route::{self, Card, Route};
use super::{Ctx, DeviceComm};
use crate::buf::DeviceBuf;
use crate::call::Call;
use crate::config::DevicePath;
use oxccl_core::{DataType, Error, Result};
use oxccl_cuda::KernelOp;
use std::sync::Arc;

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
        let (d, k, _) = module_of(c);
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
