//! The direct path: one `oxccl_collective` kernel per call, over windows
//! every rank shares with the others (cuda/README.md has the protocol).
#![allow(unsafe_code)]

use super::exec::{Exec, PROGRAM_BYTES};
use super::gpu::{Gpu, THREADS, module_of, reduce_one};
use super::route::Reach;
use super::windows::Windows;
use super::{Ctx, Source};
use crate::buf::{CudaStream, DeviceBuf};
use crate::call::Call;
use oxccl_algo::collective::CollKind;
use oxccl_core::{DataType, Error, ReduceOp, Result};
use oxccl_cuda::{Coll, CollArgs, CudaError, DevMem, Event, FLAG_BYTES, IpcMapping, KernelOp, MAX_RANKS, Module};
use parking_lot::Mutex;
use std::sync::Arc;

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
    /// Every rank's areas, as addressable here (shared with the executor).
    win: Windows,
    blocks: u32,
    /// Ranks whose kernels share this GPU (with `blocks`, what must be
    /// resident at once).
    on_gpu: u32,
    one_shot: bool,
    two_shot: bool,
    /// The device executor (programs of oxccl-algo); none when the ranks'
    /// windows differ in size (its areas follow each window).
    exec: Option<Exec>,
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
        (blocks, on_gpu): (u32, u32),
        window_bytes: u64,
        uniform_windows: bool,
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
        let same_process = peers.iter().all(|p| !matches!(p, Reach::Ipc(_)));
        let win = Windows {
            windows,
            flags,
            window_bytes,
            same_process,
            rank: ctx.rank,
            nranks: ctx.nranks,
            timeout: ctx.cfg.timeout,
        };
        // The executor's program memory: allocated here, at set-up, as
        // every allocation of the path (see `exec`).
        let exec = match uniform_windows {
            true => Some(Exec::new(
                ctx.cfg.device_fifo,
                Some((gpu.dev.alloc(PROGRAM_BYTES)?, gpu.dev.pinned(PROGRAM_BYTES)?)),
            )),
            false => None,
        };
        Ok(Direct {
            exec,
            gpu,
            _mem: mem,
            _maps: maps,
            win,
            blocks,
            on_gpu,
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
                let small = self.win.nranks <= 2 || bytes <= ONE_SHOT_MAX;
                if (small && self.one_shot) || !self.two_shot { Coll::AllReduceOneShot } else { Coll::AllReduceTwoShot }
            }
            CollKind::ReduceScatter => Coll::ReduceScatter,
            CollKind::AllGather => Coll::AllGather,
            CollKind::Broadcast => Coll::Broadcast,
            CollKind::Reduce => Coll::Reduce,
            _ => Coll::AllToAll,
        }
    }

    /// Whether the module `call` runs is not loaded yet in this process.
    pub fn needs_load(&self, call: &Call<DeviceBuf>) -> bool {
        let (dtype, kop, _) = module_of(call);
        !self.gpu.dev.loaded(dtype, kop)
    }

    /// Loads the module `call` runs, after this rank's earlier kernels have
    /// finished (the caller drains the staged path first): loading can
    /// wait for every kernel queued in the context, and one of ours waiting
    /// for a peer thread blocked behind that load would never finish (see
    /// `Device::preload`). Set-up preloaded the first call's module; this
    /// is for the first call of another type or operator. Also checks that
    /// the module's kernel fits as many blocks as the grid was cut for.
    pub fn load_for(&self, call: &Call<DeviceBuf>) -> Result<()> {
        let (dtype, kop, _) = module_of(call);
        if let Some((_, ev)) = &*self.order.lock() {
            ev.synchronize(self.win.timeout).map_err(|e| match e {
                CudaError::Timeout(m) => Error::Timeout(format!(
                    "rank {}: before loading the {dtype} {kop} kernels, the previous direct call did not finish: {m}",
                    self.win.rank
                )),
                e => e.into(),
            })?;
        }
        let module = self.gpu.dev.module(dtype, kop)?;
        check_resident(&self.gpu, &module, self.blocks, self.on_gpu)
    }

    /// Enqueues `call` on `stream`. The module it runs is loaded already
    /// ([`Direct::load_for`]) or loads here, before anything is enqueued.
    pub fn run(&self, call: &Call<DeviceBuf>, stream: CudaStream) -> Result<()> {
        let coll = self.coll(call);
        let (dtype, kop, count) = module_of(call);
        let module = self.gpu.dev.module(dtype, kop)?;
        let (premul, scale) = match call.op {
            ReduceOp::PreMulSum { scalar } if call.kind.reduces() => (1, scalar),
            _ => (0, 1.0),
        };
        let w = &self.win;
        let args = CollArgs {
            window: w.windows,
            flags: w.flags,
            send: call.input.addr(),
            recv: call.output.addr(),
            count: count as u64,
            window_bytes: w.window_bytes,
            timeout_ns: w.timeout_ns(),
            status: self.gpu.status_addr(),
            scale,
            nranks: w.nranks as u32,
            rank: w.rank as u32,
            root: call.root as u32,
            coll: coll as u32,
            premul,
            avg: (call.kind.reduces() && call.op == ReduceOp::Avg) as u32,
            pad0: 0,
            pad1: 0,
        };
        self.ordered(stream, |stream, _| {
            // SAFETY: every address in `args` is device memory of the right
            // size: the caller's buffers were checked against the driver's
            // allocation ranges, the windows and flag areas are this
            // communicator's allocations (own, same-process or IPC-mapped,
            // alive as long as `self`), the status pair is our host-mapped
            // memory; every rank launches the same grid in the same order.
            unsafe { module.launch_collective(stream, self.blocks, THREADS, &args) }?;
            Ok(true)
        })
        .map(|_| ())
    }

    /// Enqueues `call` as the program `src` gives through the device
    /// executor: `Ok(false)` (nothing enqueued) when it cannot run here.
    pub fn run_program(&self, call: &Call<DeviceBuf>, stream: CudaStream, src: &Source<'_>) -> Result<bool> {
        let Some(exec) = &self.exec else {
            if src.required {
                return Err(Error::InvalidUsage(format!(
                    "rank {}: OXCCL_DEVICE_EXEC=program (or OXCCL_DETERMINISTIC=1, which runs only the \
                     executor's proven programs), but the device executor is off: the ranks' OXCCL_DEVICE_WINDOW differ",
                    self.win.rank
                )));
            }
            if src.named {
                tracing::warn!(
                    "rank {}: the device executor is off: the ranks' OXCCL_DEVICE_WINDOW differ; {} runs as the \
                     hand-written kernel or staged",
                    self.win.rank,
                    src.name
                );
            }
            return Ok(false);
        };
        self.ordered(stream, |s, prev| exec.run(&self.gpu, &self.win, (s, prev), call, src, (self.blocks, self.on_gpu)))
    }

    /// Enqueues a group of sends and receives (call order) on `stream`:
    /// one `oxccl_p2p` launch; a rank's sends to itself are copies onto its
    /// receives from itself (in order, the same sizes).
    pub fn run_p2p(&self, ops: &[super::stage::P2pOp], stream: CudaStream) -> Result<()> {
        let Some(exec) = &self.exec else {
            return Err(Error::InvalidUsage(format!(
                "rank {}: sends and receives of device buffers on the direct path need the same \
                 OXCCL_DEVICE_WINDOW on every rank",
                self.win.rank
            )));
        };
        let me = self.win.rank;
        let module = self.gpu.dev.module(DataType::Uint8, KernelOp::Sum)?;
        let (own_s, own_r): (Vec<DeviceBuf>, Vec<DeviceBuf>) = (
            ops.iter().filter(|o| o.0 && o.1 == me).map(|o| o.2).collect(),
            ops.iter().filter(|o| !o.0 && o.1 == me).map(|o| o.2).collect(),
        );
        if own_s.len() != own_r.len() || own_s.iter().zip(&own_r).any(|(s, r)| s.len() != r.len()) {
            return Err(Error::invalid(format!(
                "rank {me}: a group's sends to itself ({:?} bytes) do not match its receives from itself ({:?} bytes)",
                own_s.iter().map(|b| b.len()).collect::<Vec<_>>(),
                own_r.iter().map(|b| b.len()).collect::<Vec<_>>()
            )));
        }
        let others: Vec<oxccl_cuda::program::P2pOp> = ops
            .iter()
            .filter(|o| o.1 != me)
            .map(|&(send, peer, b)| oxccl_cuda::program::P2pOp { send, peer, addr: b.addr(), len: b.len() as u64 })
            .collect();
        let (mut a, _) = oxccl_cuda::program::P2pArgs::group(&others, me, self.win.nranks)?;
        exec.fill_p2p(&self.win, &mut a, self.gpu.status_addr());
        // Every lane of every rank on this GPU waits for its peers: all
        // must be resident at once.
        let share = self.gpu.dev.sm_count() * module.max_active_blocks("oxccl_p2p", THREADS)? / self.on_gpu.max(1);
        let lanes = a.nlanes.max(1);
        if lanes > share {
            return Err(Error::Unavailable(format!(
                "rank {me}: a group of sends and receives with {lanes} peers and directions needs {lanes} blocks at \
                 once, but GPU {} holds {share} per rank for its {} ranks; split the group",
                self.gpu.dev.ordinal(),
                self.on_gpu
            )));
        }
        a.team = (self.blocks.min(share) / lanes).clamp(1, oxccl_cuda::program::MAX_TEAM as u32);
        self.ordered(stream, |s, _| {
            for (src, dst) in own_s.iter().zip(&own_r) {
                if src.addr() != dst.addr() {
                    // SAFETY: both are the caller's checked device buffers
                    // of that many bytes (the byte module).
                    unsafe { reduce_one(&module, s, self.blocks, (src.addr(), dst.addr()), src.len(), (0, 1.0, 0)) }?;
                }
            }
            // SAFETY: every buffer is the caller's checked device memory of
            // its length; the FIFOs and flag areas follow every rank's
            // window; the peers launch the matching operations.
            unsafe { module.launch_p2p(s, THREADS, &a) }?;
            Ok(true)
        })
        .map(|_| ())
    }

    /// Runs `launch` on the caller's stream in call order: after the last
    /// direct launch, on whatever stream it was (every call uses the same
    /// windows and flags). `launch` gets the stream and the event after
    /// the last launch (which the stream is past when it gets to what
    /// `launch` enqueues), and says whether it enqueued anything; after an
    /// error the event is recorded all the same (it may have enqueued part
    /// of its work, an upload, which the next launches must stay behind).
    fn ordered(
        &self,
        raw: CudaStream,
        launch: impl FnOnce(&oxccl_cuda::Stream, Option<&Event>) -> Result<bool>,
    ) -> Result<bool> {
        let stream = self.gpu.stream(raw);
        let mut last = self.order.lock();
        if let Some((prev, ev)) = &*last
            && *prev != raw
        {
            stream.wait_event(ev)?;
        }
        let launched = launch(&stream, last.as_ref().map(|(_, ev)| ev));
        tracing::trace!("rank {}: direct launch on stream {:#x}: {launched:?}", self.win.rank, raw.0);
        if let Ok(false) = launched {
            return Ok(false);
        }
        let ev = match last.take() {
            Some((_, ev)) => ev,
            None => self.gpu.dev.new_event()?,
        };
        let recorded = ev.record(&stream);
        *last = Some((raw, ev));
        let launched = launched?;
        recorded?;
        Ok(launched)
    }
}

/// Blocks of the collective kernel of `module` the GPU holds at once.
pub(super) fn resident(gpu: &Gpu, module: &Module) -> Result<u32> {
    Ok(gpu.dev.sm_count() * module.max_active_blocks("oxccl_collective", THREADS)?)
}

/// An error unless `on_gpu` grids of `blocks` blocks of `module`'s
/// collective kernel are resident at once on the GPU.
pub(super) fn check_resident(gpu: &Gpu, module: &Module, blocks: u32, on_gpu: u32) -> Result<()> {
    let holds = resident(gpu, module)?;
    if blocks * on_gpu > holds {
        return Err(Error::Unavailable(format!(
            "the {} {} direct kernel fits {holds} blocks at once on GPU {}, fewer than the {blocks} blocks of each \
             of the {on_gpu} ranks there (their kernels wait for each other, so all must be resident): set \
             OXCCL_DEVICE_BLOCKS to at most {}",
            module.dtype(),
            module.op(),
            gpu.dev.ordinal(),
            holds / on_gpu.max(1)
        )));
    }
    Ok(())
}
