//! The device executor on the direct path: a program of oxccl-algo (a
//! built-in algorithm's or a researcher's, verified) run by
//! `oxccl_program` (cuda/program.cu) over the ranks' device memory.
//!
//! Every rank's window allocation carries, after the window, the
//! executor's flag area and its FIFOs ([`extra_bytes`]): `FIFO_CHANS`
//! channels × `SLOTS` slots from every rank, `OXCCL_DEVICE_FIFO` bytes a
//! connection. The window is the programs' scratch (every rank reaches the
//! others'), followed by the premul copy of the input when the operator
//! asks for one. A program for a (collective, algorithm) is encoded and
//! uploaded once, on the caller's stream, into the program memory that
//! set-up allocated ([`PROGRAM_BYTES`]; a call allocates nothing: an
//! allocation can wait for every kernel queued in the context, a peer
//! thread's waiting for this one too), and cached with the verdict of
//! whether it can run here: a program that does not fit (channels, scratch,
//! messages larger than half a FIFO, an encoding larger than the program
//! memory, one-sided access to peers' input or output across processes)
//! falls back to the hand-written kernel or the staged path, the same way
//! on every rank (the verdict depends only on the program, the
//! configuration and the route, which all ranks share).
#![allow(unsafe_code)]

use super::Source;
use super::gpu::{Gpu, THREADS, module_of, reduce_one};
use super::windows::Windows;
use crate::buf::DeviceBuf;
use crate::call::Call;
use oxccl_algo::collective::Collective;
use oxccl_algo::ir::{Buf, Program, Step};
use oxccl_core::{DataType, Error, ReduceOp, Result};
use oxccl_cuda::program::{DeviceProgram, MAX_TEAM, PROG_FLAG_BYTES, ProgArgs, fifo_bytes};
use oxccl_cuda::{DevMem, Event, Module, Pinned, Stream};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::FIFO_CHANS;
/// Slots per connection.
pub(super) const SLOTS: usize = 8;
/// Device memory for uploaded programs (steps and slice tables), per rank,
/// and as much pinned host memory they are copied from.
pub(super) const PROGRAM_BYTES: usize = 4 << 20;

/// Bytes of one FIFO slot for `fifo` bytes a connection.
fn slot_bytes(fifo: usize) -> usize {
    (fifo / SLOTS) / 16 * 16
}

/// Bytes the executor adds after a rank's window: its flag area, then its
/// FIFOs.
pub(super) fn extra_bytes(nranks: usize, fifo: usize) -> usize {
    PROG_FLAG_BYTES + fifo_bytes(nranks, FIFO_CHANS, SLOTS, slot_bytes(fifo))
}

/// The largest pipeline chunk of a program the FIFOs carry: two messages
/// to a connection (what the verifier proves deadlock-free) at most.
pub(super) fn chunk_bytes(fifo: usize) -> usize {
    slot_bytes(fifo) * SLOTS / 2
}

/// A program uploaded for one collective, or why it cannot run.
enum Plan {
    Ready(Box<Ready>),
    /// Cannot run here: why (said once, when the plan was made).
    Unfit(String),
}

struct Ready {
    /// Device address of the steps, then the slice table (in the program
    /// memory).
    at: u64,
    slices_at: u64,
    prog: DeviceProgram,
    /// Channels of the busiest rank.
    nchan_max: usize,
    /// Ranks whose input or output this rank reaches one-sidedly, and its
    /// own bit when a peer reaches its own (the kernel's `exchange`).
    exchange: u32,
    /// Byte offset of the premul copy of the input in the window.
    premul_at: u64,
    /// The program is correct with input and output aliased (NCCL's layouts).
    in_place: bool,
}

/// The executor's part of a communicator's direct path (the windows,
/// ranks and timeout are the path's [`Windows`], passed in).
pub(super) struct Exec {
    slot_bytes: usize,
    /// Pipeline chunk of built-in algorithms' programs.
    chunk: usize,
    /// Plans by (algorithm, collective, whether the input is scaled first:
    /// the window then holds the scaled copy too).
    cache: Mutex<HashMap<(String, Collective, bool), Arc<Plan>>>,
    /// Program launches so far (the address exchange's key).
    seq: AtomicU64,
    /// Where uploads go: allocated at set-up, filled front to back.
    programs: Mutex<Programs>,
}

/// The program memory, the pinned host memory uploads are copied from
/// (at the same offsets: a pageable source could block the copy call
/// behind other copies queued after kernels waiting for this thread), and
/// how much of them the cached plans use.
struct Programs {
    mem: Option<(DevMem, Pinned)>,
    used: usize,
}

impl Exec {
    /// The executor with FIFOs of `fifo` bytes a connection, uploading
    /// into `programs` (device memory and pinned host memory of the same
    /// size; none: nothing can be uploaded, for tests of the verdicts).
    pub fn new(fifo: usize, programs: Option<(DevMem, Pinned)>) -> Exec {
        Exec {
            slot_bytes: slot_bytes(fifo),
            chunk: chunk_bytes(fifo),
            cache: Mutex::new(HashMap::new()),
            seq: AtomicU64::new(0),
            programs: Mutex::new(Programs { mem: programs, used: 0 }),
        }
    }

    /// The FIFOs, flag areas and limits of a send/receive launch.
    pub fn fill_p2p(&self, w: &Windows, a: &mut oxccl_cuda::program::P2pArgs, status: u64) {
        (a.flags, a.fifo) = w.prog_areas();
        a.slot_bytes = self.slot_bytes as u64;
        a.timeout_ns = w.timeout_ns();
        a.status = status;
        a.fifo_chans = FIFO_CHANS as u32;
        a.slots = SLOTS as u32;
    }

    /// The plan for `call` (built, checked and uploaded on first use).
    fn plan(
        &self,
        w: &Windows,
        (stream, prev): (&Stream, Option<&Event>),
        call: &Call<DeviceBuf>,
        src: &Source<'_>,
    ) -> Result<Arc<Plan>> {
        let coll = call.collective();
        let key = (src.name.clone(), coll, premul_of(call).is_some());
        if let Some(p) = self.cache.lock().get(&key) {
            return Ok(p.clone());
        }
        let program = (src.build)(self.chunk)?;
        let plan = match self.fit(w, &program, call) {
            Ok(ready) => Plan::Ready(Box::new(self.upload(w, (stream, prev), ready)?)),
            Err(why) => {
                let msg = format!("the device executor cannot run {} for {coll}: {why}", src.name);
                if src.named {
                    tracing::warn!("rank {}: {msg}", w.rank);
                } else {
                    tracing::info!("rank {}: {msg}", w.rank);
                }
                Plan::Unfit(msg)
            }
        };
        let plan = Arc::new(plan);
        self.cache.lock().insert(key, plan.clone());
        Ok(plan)
    }

    /// Whether `program` runs here, the same verdict on every rank; the
    /// encoded program of this rank if so.
    fn fit(&self, w: &Windows, program: &Program, call: &Call<DeviceBuf>) -> std::result::Result<Unloaded, String> {
        let c = program.collective;
        let (_, _, unit) = unit_of(call);
        let es = call.dtype.size();
        let mut chans = 0;
        let mut scratch = 0;
        let mut exchange = 0u32;
        // Whether another rank's program reaches this rank's buffers.
        let mut reached = false;
        let mut mine = None;
        for (r, rp) in program.ranks.iter().enumerate() {
            let d = DeviceProgram::encode(rp, r, w.nranks, unit).map_err(|e| e.to_string())?;
            if d.channels.len() > FIFO_CHANS {
                return Err(format!("rank {r} has {} channels; the FIFOs have {FIFO_CHANS}", d.channels.len()));
            }
            let need = d.slots_needed(es / unit, self.slot_bytes);
            if need > SLOTS {
                return Err(format!(
                    "its longest message ({} bytes) needs {need} FIFO slots of {} bytes, there are {SLOTS} \
                     (OXCCL_DEVICE_FIFO)",
                    d.max_message() as usize * (es / unit),
                    self.slot_bytes
                ));
            }
            if d.upload_len() > PROGRAM_BYTES {
                return Err(format!(
                    "rank {r}'s encoding takes {} bytes, more than the executor's program memory ({PROGRAM_BYTES} bytes)",
                    d.upload_len()
                ));
            }
            chans = chans.max(d.channels.len());
            // The premul copy, or the copy an in-place call makes of its
            // input for a program that does not claim in-place safety.
            let premul = if premul_of(call).is_some() || !program.in_place { c.input_len(r) * es } else { 0 };
            scratch = scratch.max((d.scratch * (es / unit)).next_multiple_of(256) + premul);
            let reach = peer_buffers(rp);
            if reach != 0 && !w.same_process {
                return Err("it reads or writes peers' input or output directly, which ranks of different \
                            processes cannot (only their windows are mapped)"
                    .into());
            }
            if r == w.rank {
                exchange |= reach;
                mine = Some(d);
            } else {
                reached |= reach >> w.rank & 1 == 1;
            }
        }
        if reached {
            // This rank's own bit: it publishes its input and output for
            // the peers that reach them, even where it reaches nobody.
            exchange |= 1 << w.rank;
        }
        if scratch as u64 > w.window_bytes {
            return Err(format!(
                "it needs {scratch} bytes of scratch on a rank, the window has {} (OXCCL_DEVICE_WINDOW)",
                w.window_bytes
            ));
        }
        let prog = mine.ok_or("no program for this rank")?;
        let premul_at = (prog.scratch * (es / unit)).next_multiple_of(256) as u64;
        Ok(Unloaded { prog, nchan_max: chans, exchange, premul_at, in_place: program.in_place })
    }

    /// Uploads the encoded program on `stream` (asynchronously, from the
    /// pinned copy) after what the cached plans use of the program memory.
    /// When it does not fit there, every cached plan goes and the memory is
    /// filled from the start again once `prev` has passed: the event after
    /// the last direct launch, which every earlier upload and every reader
    /// of the programs precedes (the copy itself is ordered after it too).
    fn upload(&self, w: &Windows, (stream, prev): (&Stream, Option<&Event>), u: Unloaded) -> Result<Ready> {
        let mut host = u.prog.step_bytes();
        let slices_at = host.len() as u64;
        host.extend_from_slice(&u.prog.slice_bytes());
        let mut programs = self.programs.lock();
        let Programs { mem: Some((dev, pinned)), used } = &mut *programs else {
            return Err(Error::Internal(format!("rank {}: the executor has no program memory", w.rank)));
        };
        let cap = dev.len().min(pinned.len());
        if host.len() > cap {
            return Err(Error::Internal(format!(
                "rank {}: a program of {} bytes, the executor's program memory has {cap}",
                w.rank,
                host.len()
            )));
        }
        if *used + host.len() > cap {
            if let Some(ev) = prev {
                ev.synchronize(w.timeout).map_err(|e| {
                    Error::Timeout(format!("rank {}: before reusing the executor's program memory: {e}", w.rank))
                })?;
            }
            self.cache.lock().clear();
            *used = 0;
        }
        let at = dev.addr() + *used as u64;
        if !host.is_empty() {
            // SAFETY: [used, used + len) lies in both allocations (checked
            // above). No queued copy reads that part of the pinned memory
            // and no queued kernel reads that part of the device memory:
            // each part is written once per filling, and a new filling
            // starts only after `prev` has passed (see above).
            unsafe {
                let src = pinned.as_ptr().add(*used);
                std::ptr::copy_nonoverlapping(host.as_ptr(), src, host.len());
                stream.memcpy_htod(at, src, host.len())
            }?;
        }
        *used += host.len().next_multiple_of(256);
        Ok(Ready {
            at,
            slices_at,
            prog: u.prog,
            nchan_max: u.nchan_max,
            exchange: u.exchange,
            premul_at: u.premul_at,
            in_place: u.in_place,
        })
    }

    /// Enqueues `call` as a program on `stream` (the caller orders direct
    /// launches): `Ok(false)` when the program cannot run here.
    pub fn run(
        &self,
        gpu: &Gpu,
        w: &Windows,
        (stream, prev): (&Stream, Option<&Event>),
        call: &Call<DeviceBuf>,
        src: &Source<'_>,
        (blocks, on_gpu): (u32, u32),
    ) -> Result<bool> {
        let plan = self.plan(w, (stream, prev), call, src)?;
        let r = match &*plan {
            Plan::Ready(r) => r,
            Plan::Unfit(msg) if src.required => return Err(Error::InvalidUsage(format!("rank {}: {msg}", w.rank))),
            Plan::Unfit(_) => return Ok(false),
        };
        let (dtype, kop, unit) = unit_of(call);
        let module = gpu.dev.module(dtype, kop)?;
        tracing::trace!("rank {}: program {} for {}: planned", w.rank, src.name, call.collective());
        let team = self.team(gpu, w.rank, &module, r.nchan_max, (blocks, on_gpu))?;
        tracing::trace!("rank {}: {} channels, teams of {team} blocks", w.rank, r.nchan_max);
        let me = w.rank;
        let mut input = call.input.addr();
        let premul = premul_of(call);
        if premul.is_some() || (call.input.overlaps(&call.output) && !r.in_place) {
            // Scaled, or kept aside from the output the program writes.
            let pre = w.windows[me] + r.premul_at;
            let (flag, scale) = premul.map_or((0, 1.0), |s| (1, s));
            // In the module's elements (bytes for data movement).
            let n = call.collective().input_len(me) * unit;
            // SAFETY: the input is the caller's checked buffer; the copy
            // lands in this rank's window, which `fit` checked holds it
            // after the program's scratch.
            unsafe { reduce_one(&module, stream, blocks, (input, pre), n, (flag, scale, 0)) }?;
            input = pre;
        }
        let mut a = ProgArgs {
            steps: r.at,
            slices: r.at + r.slices_at,
            slot_bytes: self.slot_bytes as u64,
            timeout_ns: w.timeout_ns(),
            status: gpu.status_addr(),
            nranks: w.nranks as u32,
            rank: me as u32,
            fifo_chans: FIFO_CHANS as u32,
            slots: SLOTS as u32,
            team,
            exchange: r.exchange,
            seq: self.seq.fetch_add(1, Ordering::Relaxed) + 1,
            ..ProgArgs::default()
        };
        for q in 0..w.nranks {
            a.bufs[q][2] = w.windows[q];
            a.fifo[q] = w.fifo(q);
            a.flags[q] = w.prog_flags(q);
        }
        a.bufs[me][0] = input;
        a.bufs[me][1] = call.output.addr();
        r.prog.fill(&mut a);
        // SAFETY: the steps and slices are this plan's upload (alive with
        // the communicator), encoded for this rank; every buffer address is
        // the caller's checked buffer, a window of this communicator or an
        // address a peer of this process publishes for this launch; the
        // FIFOs and flag areas follow every rank's window in its allocation
        // (zeroed once); every rank launches its part of the same programs
        // in the same order (the launch order is the caller's).
        unsafe { module.launch_program(stream, THREADS, &a) }?;
        if call.kind.reduces() && call.op == ReduceOp::Avg {
            let out = call.output.addr();
            let n = call.collective().output_len(me);
            // SAFETY: the caller's checked output, `n` elements, in place.
            unsafe { reduce_one(&module, stream, blocks, (out, out), n, (0, 1.0, w.nranks as u32)) }?;
        }
        Ok(true)
    }

    /// Blocks per channel: the grid budget over the busiest rank's
    /// channels, within what the GPU holds for every rank on it at once.
    fn team(&self, gpu: &Gpu, rank: usize, module: &Module, nchan: usize, (blocks, on_gpu): (u32, u32)) -> Result<u32> {
        let nchan = nchan.max(1) as u32;
        let holds = gpu.dev.sm_count() * module.max_active_blocks("oxccl_program", THREADS)?;
        let fit = holds / (on_gpu.max(1) * nchan);
        if fit == 0 {
            return Err(Error::Unavailable(format!(
                "rank {rank}: {on_gpu} ranks' programs of {nchan} channels do not fit on GPU {} at once ({holds} blocks)",
                gpu.dev.ordinal()
            )));
        }
        Ok((blocks / nchan).clamp(1, MAX_TEAM as u32).min(fit))
    }
}

/// An encoded program not yet uploaded.
struct Unloaded {
    prog: DeviceProgram,
    nchan_max: usize,
    exchange: u32,
    premul_at: u64,
    in_place: bool,
}

/// The module a call's program runs in and its encoding unit: reductions
/// in their type, data movement in bytes.
fn unit_of(call: &Call<DeviceBuf>) -> (DataType, oxccl_cuda::KernelOp, usize) {
    let (dtype, kop, _) = module_of(call);
    let unit = if call.kind.reduces() { 1 } else { call.dtype.size() };
    (dtype, kop, unit)
}

/// The premul scalar, when the call scales its input first.
fn premul_of(call: &Call<DeviceBuf>) -> Option<f64> {
    match call.op {
        ReduceOp::PreMulSum { scalar } if call.kind.reduces() => Some(scalar),
        _ => None,
    }
}

/// Ranks (bit q) whose input or output `rp` reads or writes one-sidedly.
fn peer_buffers(rp: &oxccl_algo::ir::RankProgram) -> u32 {
    let user = |b: Buf| b != Buf::Scratch;
    rp.steps().fold(0, |m, s| match s {
        Step::Put { peer, dst, .. } if user(dst.buf) => m | 1 << peer,
        Step::Get { peer, src, .. } | Step::GetReduce { peer, src, .. } if user(src.buf) => m | 1 << peer,
        _ => m,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl_algo::algos::{Algorithm, BuildOptions, build};
    use oxccl_algo::collective::CollKind;
    use oxccl_core::DataType;

    #[test]
    fn the_layout_leaves_room_for_every_connection() {
        assert_eq!(slot_bytes(512 << 10), 64 << 10);
        assert_eq!(chunk_bytes(512 << 10), 256 << 10);
        assert_eq!(extra_bytes(4, 512 << 10), PROG_FLAG_BYTES + 4 * FIFO_CHANS * (512 << 10));
    }

    /// Rank 0 of `n`'s windows at fake addresses.
    fn windows(n: usize, window: u64, same_process: bool) -> Windows {
        windows_of(0, n, window, same_process)
    }

    /// Rank `rank` of `n`'s windows at fake addresses.
    fn windows_of(rank: usize, n: usize, window: u64, same_process: bool) -> Windows {
        let mut windows = [0; oxccl_cuda::MAX_RANKS];
        for (q, a) in windows.iter_mut().enumerate().take(n) {
            *a = 0x1000_0000 * (q as u64 + 1);
        }
        let flags = windows.map(|a| a.saturating_sub(oxccl_cuda::FLAG_BYTES as u64));
        let timeout = std::time::Duration::from_nanos(1);
        Windows { windows, flags, window_bytes: window, same_process, rank, nranks: n, timeout }
    }

    /// Whether the executor of rank 0 of `n` would run `program`.
    fn fit(
        n: usize,
        window: u64,
        same_process: bool,
        program: &Program,
        call: &Call<DeviceBuf>,
    ) -> std::result::Result<Unloaded, String> {
        Exec::new(64 << 10, None).fit(&windows(n, window, same_process), program, call)
    }

    fn call(kind: CollKind, n: usize, count: usize, op: ReduceOp) -> Call<DeviceBuf> {
        let c = Collective::new(kind, n, count);
        let (i, o) = (c.input_len(0) * 4, c.output_len(0) * 4);
        let (s, r) = (DeviceBuf::new(0x10_0000, i), DeviceBuf::new(0x90_0000, o));
        let spec = crate::call::Spec::new(kind, count, DataType::Float32).with_op(op);
        Call::new(spec, Some(s), r, 0, n).unwrap()
    }

    #[test]
    fn the_verdict_says_why_a_program_cannot_run_here() {
        let ar = call(CollKind::AllReduce, 4, 1000, ReduceOp::Sum);
        let c = ar.collective();
        let opts = BuildOptions { chunk_bytes: chunk_bytes(64 << 10), max_chunks: usize::MAX };
        // Ring: two-sided, fits; its slices are the FIFO's half at most.
        let ring = build(Algorithm::Ring, &c, &opts).unwrap();
        let u = fit(4, 1 << 20, false, &ring, &ar).unwrap();
        assert_eq!((u.nchan_max, u.exchange), (1, 0));
        assert_eq!(u.premul_at, 0, "the ring needs no scratch");
        // One-shot reads the peers' inputs: threads of one process only.
        let one = build(Algorithm::OneShot, &c, &opts).unwrap();
        let e = fit(4, 1 << 20, false, &one, &ar).err().unwrap();
        assert!(e.contains("different processes"), "{e}");
        let u = fit(4, 1 << 20, true, &one, &ar).unwrap();
        assert_eq!(u.exchange, 0b1111, "reads ranks 1-3, and publishes its own buffers for them");
        assert_eq!(u.premul_at, 4096, "scratch of 1000 floats, rounded to 256 bytes");
        // Scratch beyond the window.
        let e = fit(4, 2048, true, &one, &ar).err().unwrap();
        assert!(e.contains("OXCCL_DEVICE_WINDOW"), "{e}");
        // Messages beyond half a FIFO: the host's chunking is not the device's.
        let big = call(CollKind::AllReduce, 4, 200_000, ReduceOp::Sum);
        let host = build(Algorithm::Ring, &big.collective(), &BuildOptions::default()).unwrap();
        let e = fit(4, 1 << 20, false, &host, &big).err().unwrap();
        assert!(e.contains("FIFO slots") && e.contains("OXCCL_DEVICE_FIFO"), "{e}");
        // More channels than the FIFOs have.
        let mut wide = ring.clone();
        for r in &mut wide.ranks {
            r.channels.resize(FIFO_CHANS + 1, Vec::new());
        }
        let e = fit(4, 1 << 20, false, &wide, &ar).err().unwrap();
        assert!(e.contains("channels"), "{e}");
    }

    /// A rank whose input or output a peer's program reaches publishes
    /// them (its own bit), even where its program reaches nobody's (a
    /// rooted one-sided program's other ranks): else the peer waits for
    /// the addresses until the timeout. Every built-in algorithm and
    /// collective, rooted at the last rank.
    #[test]
    fn every_rank_a_peer_reaches_publishes_its_buffers() {
        let opts = BuildOptions { chunk_bytes: chunk_bytes(64 << 10), max_chunks: usize::MAX };
        let mut checked = 0;
        for algo in Algorithm::ALL {
            for &kind in algo.kinds().iter().filter(|k| **k != CollKind::SendRecv) {
                for n in [2, 3, 4] {
                    let coll = Collective { root: n - 1, ..Collective::new(kind, n, 1000) };
                    let Ok(p) = build(algo, &coll, &opts) else { continue };
                    let spec = crate::call::Spec::new(kind, 1000, DataType::Float32).with_root(n - 1);
                    let (i, o) = (coll.input_len(0) * 4, coll.output_len(0) * 4);
                    let (s, r) = (DeviceBuf::new(0x10_0000, i.max(4)), DeviceBuf::new(0x90_0000, o.max(4)));
                    let Ok(c) = Call::new(spec, Some(s), r, 0, n) else { continue };
                    for me in 0..n {
                        let Ok(u) = Exec::new(64 << 10, None).fit(&windows_of(me, n, 1 << 30, true), &p, &c) else {
                            continue;
                        };
                        let reached = (0..n).any(|q| q != me && peer_buffers(&p.ranks[q]) >> me & 1 == 1);
                        assert_eq!(
                            u.exchange >> me & 1 == 1,
                            reached,
                            "{algo} {kind} n {n} rank {me}: {:#b}",
                            u.exchange
                        );
                        assert_eq!(
                            u.exchange & !(1 << me),
                            peer_buffers(&p.ranks[me]),
                            "{algo} {kind} n {n} rank {me}"
                        );
                        checked += reached as usize;
                    }
                }
            }
        }
        assert!(checked > 10, "only {checked} reached ranks: the one-sided algorithms are not covered");
    }

    #[test]
    fn one_sided_programs_name_the_peers_whose_buffers_they_reach() {
        let c = Collective::new(CollKind::AllReduce, 3, 30);
        let p = build(Algorithm::OneShot, &c, &BuildOptions::default()).unwrap();
        assert_eq!(peer_buffers(&p.ranks[1]), 0b101);
        let p = build(Algorithm::Ring, &c, &BuildOptions::default()).unwrap();
        assert_eq!(peer_buffers(&p.ranks[1]), 0);
    }
}
