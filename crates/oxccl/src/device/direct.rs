//! The direct path: one `oxccl_collective` kernel per call, over windows
//! every rank shares with the others (cuda/README.md has the protocol).
#![allow(unsafe_code)]

use super::Ctx;
use super::cuda::Gpu;
use super::route::Reach;
use crate::buf::{CudaStream, DeviceBuf};
use crate::call::Call;
use oxccl_algo::collective::CollKind;
use oxccl_core::{DataType, Error, ReduceOp, Result};
use oxccl_cuda::{Coll, CollArgs, DevMem, Event, FLAG_BYTES, IpcMapping, KernelOp, MAX_RANKS};
use parking_lot::Mutex;
use std::sync::Arc;

/// Threads per block of the collective kernel.
const THREADS: u32 = 512;

/// All-reduces up to this size (per rank) read every peer's whole input
/// (one-shot: one step, fewer barriers); larger ones reduce a slice each
/// and gather (two-shot: `2(n-1)/n` of the data read per rank instead of
/// `n-1`). Two ranks read the same either way: always one-shot.
const ONE_SHOT_MAX: usize = 256 << 10;

/// One communicator's direct path.
pub(crate) struct Direct {
    gpu: Arc<Gpu>,
    /// This rank's window allocation (flags, then the window).
    _mem: DevMem,
    /// Peers' allocations opened through CUDA IPC.
    _maps: Vec<IpcMapping>,
    /// Every rank's window and flag area, as addressable here.
    windows: [u64; MAX_RANKS],
    flags: [u64; MAX_RANKS],
    window_bytes: u64,
    blocks: u32,
    rank: usize,
    nranks: usize,
    timeout_ns: u64,
    one_shot: bool,
    two_shot: bool,
    /// Launches in call order (the kernels' barrier epochs depend on it),
    /// and the stream of the last launch with an event recorded after it:
    /// a call on another stream waits for it, because every call uses the
    /// same window.
    order: Mutex<Option<(CudaStream, Event)>>,
}

impl Direct {
    /// Maps every peer's window; `mem` is this rank's (flags first).
    pub fn open(
        ctx: &Ctx<'_>,
        gpu: Arc<Gpu>,
        mem: DevMem,
        peers: &[Reach],
        blocks: u32,
        window_bytes: u64,
    ) -> Result<Direct> {
        let (mut windows, mut flags) = ([0u64; MAX_RANKS], [0u64; MAX_RANKS]);
        let mut maps = Vec::new();
        for (q, reach) in peers.iter().enumerate() {
            let base = match reach {
                Reach::Own => mem.addr(),
                Reach::Pointer(a) => *a,
                Reach::Ipc(h) => {
                    let m = gpu.dev.open_ipc(h).map_err(|e| {
                        Error::System(format!("rank {}: cannot open rank {q}'s device window: {e}", ctx.rank))
                    })?;
                    let a = m.addr();
                    maps.push(m);
                    a
                }
            };
            flags[q] = base;
            windows[q] = base + FLAG_BYTES as u64;
        }
        Ok(Direct {
            gpu,
            _mem: mem,
            _maps: maps,
            windows,
            flags,
            window_bytes,
            blocks,
            rank: ctx.rank,
            nranks: ctx.nranks,
            timeout_ns: super::cuda::nanos(ctx.cfg.timeout),
            one_shot: ctx.one_shot,
            two_shot: ctx.two_shot,
            order: Mutex::new(None),
        })
    }

    /// The kernel algorithm for `call`.
    fn coll(&self, call: &Call<DeviceBuf>) -> Coll {
        match call.kind {
            CollKind::AllReduce => {
                let bytes = call.count * call.dtype.size();
                let small = self.nranks <= 2 || bytes <= ONE_SHOT_MAX;
                if (small && self.one_shot) || !self.two_shot { Coll::AllReduceOneShot } else { Coll::AllReduceTwoShot }
            }
            CollKind::ReduceScatter => Coll::ReduceScatter,
            CollKind::AllGather => Coll::AllGather,
            CollKind::Broadcast => Coll::Broadcast,
            CollKind::Reduce => Coll::Reduce,
            _ => Coll::AllToAll,
        }
    }

    /// Enqueues `call` on `stream`.
    pub fn run(&self, call: &Call<DeviceBuf>, stream: CudaStream) -> Result<()> {
        let coll = self.coll(call);
        // Collectives that only move bytes run the byte module.
        let (dtype, kop, count) = if call.kind.reduces() {
            (call.dtype, KernelOp::of(call.op), call.count)
        } else {
            (DataType::Uint8, KernelOp::Sum, call.count * call.dtype.size())
        };
        let module = self.gpu.dev.module(dtype, kop)?;
        let (premul, scale) = match call.op {
            ReduceOp::PreMulSum { scalar } if call.kind.reduces() => (1, scalar),
            _ => (0, 1.0),
        };
        let args = CollArgs {
            window: self.windows,
            flags: self.flags,
            send: call.input.addr(),
            recv: call.output.addr(),
            count: count as u64,
            window_bytes: self.window_bytes,
            timeout_ns: self.timeout_ns,
            status: self.gpu.status_addr(),
            scale,
            nranks: self.nranks as u32,
            rank: self.rank as u32,
            root: call.root as u32,
            coll: coll as u32,
            premul,
            avg: (call.kind.reduces() && call.op == ReduceOp::Avg) as u32,
            pad0: 0,
            pad1: 0,
        };
        let raw = stream;
        let stream = self.gpu.stream(raw);
        let mut last = self.order.lock();
        if let Some((prev, ev)) = &*last
            && *prev != raw
        {
            stream.wait_event(ev)?;
        }
        // SAFETY: every address in `args` is device memory of the right
        // size: the caller's buffers were checked against the driver's
        // allocation ranges, the windows and flag areas are this
        // communicator's allocations (own, same-process or IPC-mapped,
        // alive as long as `self`), the status pair is our host-mapped
        // memory; every rank launches the same grid in the same order.
        unsafe { module.launch_collective(&stream, self.blocks, THREADS, &args) }?;
        let ev = match last.take() {
            Some((_, ev)) => ev,
            None => self.gpu.dev.new_event()?,
        };
        ev.record(&stream)?;
        *last = Some((raw, ev));
        Ok(())
    }
}
