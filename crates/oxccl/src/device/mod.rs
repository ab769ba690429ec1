//! Collectives on device (GPU) buffers, stream-ordered as in NCCL.
//!
//! A call checks its arguments on the calling thread (an error changes
//! nothing), enqueues its work on the caller's CUDA stream and returns at
//! once; the results are there when the stream gets past the call. Two
//! paths, chosen per communicator when its first device call sets it up:
//!
//! - **direct** (every rank on one host, CUDA IPC works between them; ranks
//!   may share a GPU): each rank shares a device window and a flag area
//!   with the others (CUDA IPC between processes, plain pointers between
//!   threads), and one kernel per call stages its input into its window,
//!   meets the peers on device flags and reads their windows (one-shot or
//!   two-shot all-reduce, reduce-scatter, all-gather, broadcast, reduce,
//!   all-to-all; see `cuda/README.md`). The host is not involved.
//! - **staged** (ranks on other hosts, or `OXCCL_DEVICE_PATH=staged`):
//!   chunks go to page-locked host memory, through the host collectives over
//!   TCP or shared memory, and back, pipelined ([`stage`]).
//!
//! On the direct path, the **device executor** ([`exec`], `oxccl_program`)
//! runs any verified program of oxccl-algo, a built-in algorithm's or a
//! researcher's, where `OXCCL_ALGO` or a program file names the algorithm,
//! for gather and scatter (which the hand-written kernel lacks), and for
//! everything under `OXCCL_DEVICE_EXEC=program`. Groups of sends and
//! receives (`Communicator::group_device`) are one `oxccl_p2p` kernel on
//! the direct path and pieces through host memory on the staged one.
//!
//! The modules: `setup` (the first launch: GPU, cards, route), `gpu` (one
//! GPU: the staging backend, shared words, kernel helpers), `windows`
//! (every rank's device areas: the state the direct kernels and the
//! executor share), `direct` (the hand-written kernels and the launch
//! order), `exec` (the device executor), `stage` (the staged path),
//! `route` (direct or staged).
//!
//! Ranks that are threads of one process share the GPU's context: each
//! needs its own stream (the legacy default stream is refused then, see
//! [`check_stream`]; one stream shared by two ranks of a thread deadlocks
//! alike, which is not detected), and nothing that waits for the GPU's
//! queued work (module loading, allocating or freeing memory) may run
//! while a kernel of theirs waits for the other ranks: see `cuda::open`.
//! Ranks that share a GPU from different processes take the staged path
//! unless MPS is on (without it the GPU time-slices their kernels).
//!
//! Failure: every device wait has the communicator's timeout; a dead peer,
//! an abort or a failed host step poisons the communicator and tells every
//! kernel waiting for it to give up. `Communicator::device_synchronize`
//! waits for a stream and reports such an error; so does
//! `Communicator::async_error`.
//!
//! This module knows nothing of the communicator: its set-up takes a
//! [`Ctx`] (rank, bootstrap, configuration), and the staging path returns
//! the host jobs it needs run ([`stage::Stager::run`]), planned by closures
//! the caller passes; the launch's device part (`device_api`) calls in
//! here.

// Without the `cuda` feature no GPU can be opened: the route, the cards
// and the staging path are reached only by the tests' fake device.
#![cfg_attr(not(feature = "cuda"), allow(dead_code))]

pub(crate) mod backend;
#[cfg(feature = "cuda")]
mod direct;
#[cfg(feature = "cuda")]
mod exec;
#[cfg(test)]
pub(crate) mod fake;
#[cfg(feature = "cuda")]
mod gpu;
mod route;
#[cfg(feature = "cuda")]
mod setup;
pub(crate) mod stage;
#[cfg(feature = "cuda")]
mod windows;

use crate::buf::{CudaStream, DeviceBuf};

/// Channels of every rank's device FIFO layout: the device executor runs
/// programs of up to this many channels (the tuner splits device programs
/// no further).
pub(crate) const FIFO_CHANS: usize = 4;
use crate::call::Call;
use crate::config::Resolved;
use crate::job::{Counters, Job};
use crate::op::Op;
use backend::Backend;
#[cfg(feature = "cuda")]
use oxccl_algo::collective::CollKind;
use oxccl_core::{Error, Result};
use oxccl_transport::bootstrap::Bootstrap;
use stage::Stager;
use std::sync::Arc;

/// The error a kernel's status code stands for.
pub(crate) fn status_error(who: &str, status: u32) -> Error {
    match status {
        1 => Error::Timeout(format!("{who}: a device kernel waited for a peer or the host past OXCCL_TIMEOUT")),
        2 => Error::Remote(format!(
            "{who}: device kernels were told to stop (a peer died or the communicator was aborted)"
        )),
        3 => {
            Error::Internal(format!("{who}: a device kernel rejected its arguments (a bug in oxccl: please report it)"))
        }
        s => Error::Internal(format!("{who}: a device kernel reported status {s}")),
    }
}

/// Where a call's program for the device executor comes from (the
/// communicator's tuner).
pub(crate) struct Source<'a> {
    /// The algorithm's name, for the cache and messages.
    pub name: String,
    /// Builds the program with pipeline chunks of at most the given bytes.
    pub build: &'a dyn Fn(usize) -> Result<oxccl_algo::ir::Program>,
    /// The user named the algorithm: a program that cannot run here is
    /// a warning, not a quiet fallback.
    pub named: bool,
    /// `OXCCL_DEVICE_EXEC=program`: a program that cannot run here is an
    /// error (with why), not a fallback.
    pub required: bool,
}

/// What the device set-up needs of its communicator.
pub(crate) struct Ctx<'a> {
    /// The communicator, for messages.
    pub who: &'a str,
    pub rank: usize,
    pub nranks: usize,
    pub boot: &'a Bootstrap,
    pub cfg: &'a Resolved,
    /// Whether `OXCCL_ALGO` allows the direct kernels' one-shot and
    /// two-shot all-reduce.
    pub one_shot: bool,
    pub two_shot: bool,
}

/// A device's counters as the engine sees them.
struct DevCounters {
    dev: Arc<dyn Backend>,
    who: String,
}

impl Counters for DevCounters {
    fn get(&self, i: usize) -> u64 {
        self.dev.words().get(i)
    }
    fn set(&self, i: usize, v: u64) {
        self.dev.words().set(i, v)
    }
    fn failure(&self) -> Option<Error> {
        let status = self.dev.words().status();
        (status != 0).then(|| status_error(&self.who, status))
    }
}

/// The device side of one communicator, set up by its first device call.
pub(crate) struct DeviceComm {
    pub(crate) dev: Arc<dyn Backend>,
    pub(crate) stager: Stager,
    #[cfg(feature = "cuda")]
    direct: Option<direct::Direct>,
    /// Ranks of the communicator in this process (this one included).
    pub(crate) process_ranks: usize,
}

impl DeviceComm {
    /// Sets up the device side on the GPU that holds `buf` (collective:
    /// every rank's first device call, `first`, runs it).
    #[cfg(feature = "cuda")]
    pub fn open(ctx: &Ctx<'_>, buf: DeviceBuf, first: Option<&Call<DeviceBuf>>) -> Result<DeviceComm> {
        setup::open(ctx, buf, first)
    }

    /// Without the `cuda` feature there is no device.
    #[cfg(not(feature = "cuda"))]
    pub fn open(ctx: &Ctx<'_>, _buf: DeviceBuf, _first: Option<&Call<DeviceBuf>>) -> Result<DeviceComm> {
        Err(Error::InvalidUsage(format!("{}: device buffers need oxccl built with the `cuda` feature", ctx.who)))
    }

    /// The staged path only, over `dev` (tests: a fake device).
    #[cfg(test)]
    pub fn staged_only(dev: Arc<dyn Backend>, chunk: usize, timeout: std::time::Duration, who: &str) -> DeviceComm {
        DeviceComm {
            stager: Stager::new(dev.clone(), chunk, timeout, who),
            dev,
            #[cfg(feature = "cuda")]
            direct: None,
            process_ranks: 1,
        }
    }

    /// The error a kernel recorded, if any.
    pub fn failure(&self) -> Option<Error> {
        self.stager.failure()
    }

    /// Whether `call` may take the direct path (then the communicator
    /// offers it a program when the executor should run it).
    pub fn is_direct(&self) -> bool {
        #[cfg(feature = "cuda")]
        return self.direct.is_some();
        #[cfg(not(feature = "cuda"))]
        false
    }

    /// Enqueues `call` on the direct path if it takes it: `Ok(true)`. With
    /// a program `src`, the device executor runs it if it can; else the
    /// hand-written kernel for the collectives it has.
    #[cfg(feature = "cuda")]
    pub fn run_direct(&self, call: &Call<DeviceBuf>, stream: CudaStream, src: Option<&Source<'_>>) -> Result<bool> {
        let Some(d) = &self.direct else { return Ok(false) };
        if src.is_none() && !direct_kind(call.kind) {
            return Ok(false);
        }
        if d.needs_load(call) {
            // A first call of a new type or operator: nothing of ours may
            // be queued while its module loads.
            self.stager.drain()?;
            d.load_for(call)?;
        }
        if let Some(src) = src
            && d.run_program(call, stream, src)?
        {
            return Ok(true);
        }
        if !direct_kind(call.kind) {
            return Ok(false);
        }
        d.run(call, stream).map(|()| true)
    }

    /// Enqueues a group of sends and receives of device buffers on
    /// `stream`: one kernel on the direct path, else through host memory;
    /// the host jobs to queue (none on the direct path).
    pub fn run_p2p(
        &self,
        plan: &dyn Fn(Vec<Op>) -> Result<Option<Job>>,
        ops: &[stage::P2pOp],
        stream: CudaStream,
    ) -> Result<Vec<Job>> {
        #[cfg(feature = "cuda")]
        if let Some(d) = &self.direct {
            // The byte module was loaded at set-up.
            d.run_p2p(ops, stream)?;
            return Ok(Vec::new());
        }
        self.stager.run_p2p(plan, ops, stream)
    }

    /// Without the `cuda` feature nothing is direct.
    #[cfg(not(feature = "cuda"))]
    pub fn run_direct(&self, _call: &Call<DeviceBuf>, _stream: CudaStream, _src: Option<&Source<'_>>) -> Result<bool> {
        Ok(false)
    }
}

/// Collectives that the direct kernels implement.
#[cfg(feature = "cuda")]
fn direct_kind(kind: CollKind) -> bool {
    matches!(
        kind,
        CollKind::AllReduce
            | CollKind::ReduceScatter
            | CollKind::AllGather
            | CollKind::Broadcast
            | CollKind::Reduce
            | CollKind::AllToAll
    )
}

/// An error when `stream` is the legacy default stream (`0`, or its
/// explicit handle `cudaStreamLegacy`, `1`) and this process runs several
/// ranks of the communicator: their kernels, which wait for each other,
/// would run one after another on that one stream (each rank's call is
/// stuck behind a kernel waiting for it). Per-thread default streams
/// (`cudaStreamPerThread`, `2`) and created streams are distinct per rank,
/// if the application gives each rank its own.
pub(crate) fn check_stream(process_ranks: usize, stream: CudaStream) -> Result<()> {
    if process_ranks > 1 && stream.0 <= 1 {
        return Err(Error::InvalidUsage(format!(
            "the legacy default stream ({:#x}) cannot carry device collectives when this process runs {process_ranks} \
             ranks of the communicator: their kernels wait for each other, and one stream runs them one after \
             another (a deadlock); give each rank its own stream (cudaStreamCreate, or cudaStreamPerThread with \
             one thread per rank)",
            stream.0
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_legacy_stream_is_refused_to_several_ranks_of_one_process() {
        check_stream(1, CudaStream::DEFAULT).unwrap();
        check_stream(4, CudaStream(2)).unwrap();
        check_stream(4, CudaStream(0x7f00_1234)).unwrap();
        for legacy in [0, 1] {
            let e = check_stream(2, CudaStream(legacy)).unwrap_err();
            assert!(
                matches!(&e, Error::InvalidUsage(m) if m.contains("legacy default stream") && m.contains("2 ranks"))
            );
        }
    }
}
