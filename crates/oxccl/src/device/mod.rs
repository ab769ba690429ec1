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
//! Gather, scatter and send/recv take the staged path everywhere.
//!
//! Failure: every device wait has the communicator's timeout; a dead peer,
//! an abort or a failed host step poisons the communicator and tells every
//! kernel waiting for it to give up. `Communicator::device_synchronize`
//! waits for a stream and reports such an error; so does
//! `Communicator::async_error`.
//!
//! This module knows nothing of the communicator: its set-up takes a
//! [`Ctx`] (rank, bootstrap, configuration), and the staging path returns
//! the host jobs it needs run ([`stage::Stager::run`]); the communicator's
//! device methods call in here.

pub(crate) mod backend;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
mod direct;
#[cfg(test)]
pub(crate) mod fake;
mod route;
pub(crate) mod stage;

use crate::buf::{CudaStream, DeviceBuf};
use crate::call::Call;
use crate::config::Resolved;
use crate::job::Counters;
use backend::Backend;
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
}

impl DeviceComm {
    /// Sets up the device side on the GPU that holds `buf` (collective:
    /// every rank's first device call runs it).
    #[cfg(feature = "cuda")]
    pub fn open(ctx: &Ctx<'_>, buf: DeviceBuf) -> Result<DeviceComm> {
        cuda::open(ctx, buf)
    }

    /// Without the `cuda` feature there is no device.
    #[cfg(not(feature = "cuda"))]
    pub fn open(ctx: &Ctx<'_>, _buf: DeviceBuf) -> Result<DeviceComm> {
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
        }
    }

    /// The error a kernel recorded, if any.
    pub fn failure(&self) -> Option<Error> {
        self.stager.failure()
    }

    /// Enqueues `call` on the direct path if it takes it: `Ok(true)`.
    #[cfg(feature = "cuda")]
    pub fn run_direct(&self, call: &Call<DeviceBuf>, stream: CudaStream) -> Result<bool> {
        match &self.direct {
            Some(d) if direct_kind(call.kind) => d.run(call, stream).map(|()| true),
            _ => Ok(false),
        }
    }

    /// Without the `cuda` feature nothing is direct.
    #[cfg(not(feature = "cuda"))]
    pub fn run_direct(&self, _call: &Call<DeviceBuf>, _stream: CudaStream) -> Result<bool> {
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
