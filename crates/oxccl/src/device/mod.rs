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
//! kernel waiting for it to give up. [`Communicator::device_synchronize`]
//! waits for a stream and reports such an error; so does
//! [`Communicator::async_error`].

pub(crate) mod backend;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
mod direct;
#[cfg(test)]
mod fake;
mod route;
pub(crate) mod stage;
#[cfg(test)]
mod tests;

use crate::comm::Communicator;
use crate::plan::spans;
use backend::Backend;
use oxccl_algo::collective::{CollKind, Collective};
use oxccl_core::{DataType, Error, ReduceOp, Result};
use stage::{Call, Stager};
use std::sync::Arc;

/// A device buffer: an address in the GPU's unified address space (a
/// `CUdeviceptr`, what cudarc's `DevicePtr::device_ptr`, CuPy's
/// `data.ptr` or PyTorch's `data_ptr()` give) and its length in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceBuf {
    addr: u64,
    len: usize,
}

impl DeviceBuf {
    /// `len` bytes at device address `addr`. Nothing is checked here; the
    /// collective checks that the range is device memory.
    pub const fn new(addr: u64, len: usize) -> DeviceBuf {
        DeviceBuf { addr, len }
    }

    /// The address.
    pub const fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub const fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes.
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes `[off, off + len)`, or an error naming the overrun.
    pub fn sub(&self, off: usize, len: usize) -> Result<DeviceBuf> {
        match off.checked_add(len) {
            Some(end) if end <= self.len => Ok(DeviceBuf { addr: self.addr + off as u64, len }),
            _ => Err(Error::invalid(format!("bytes {off}..+{len} outside a device buffer of {} bytes", self.len))),
        }
    }
}

/// A CUDA stream (`CUstream` / `cudaStream_t`, as an integer): the caller
/// keeps it alive while calls on it are pending.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CudaStream(pub u64);

impl CudaStream {
    /// The legacy default stream (`0`).
    pub const DEFAULT: CudaStream = CudaStream(0);

    /// A stream from its raw handle.
    pub const fn from_raw(handle: u64) -> CudaStream {
        CudaStream(handle)
    }
}

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

/// The device side of one communicator, set up by its first device call.
pub(crate) struct DeviceComm {
    dev: Arc<dyn Backend>,
    stager: Stager,
    #[cfg(feature = "cuda")]
    direct: Option<direct::Direct>,
}

impl DeviceComm {
    #[cfg(test)]
    fn staged_only(dev: Arc<dyn Backend>, chunk: usize, timeout: std::time::Duration) -> DeviceComm {
        DeviceComm {
            stager: Stager::new(dev.clone(), chunk, timeout),
            dev,
            #[cfg(feature = "cuda")]
            direct: None,
        }
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

impl Communicator {
    /// Runs a collective on device buffers, ordered on `stream` (NCCL's
    /// `ncclAllReduce` … with device pointers): checks the arguments,
    /// enqueues the work and returns. `count` follows NCCL's conventions
    /// (see [`Collective`]); `send: None` is in place, with NCCL's in-place
    /// layout inside `recv`. Buffers may be longer than needed.
    #[allow(clippy::too_many_arguments)]
    pub fn collective_device(
        &self,
        kind: CollKind,
        send: Option<DeviceBuf>,
        recv: DeviceBuf,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
        stream: CudaStream,
    ) -> Result<()> {
        if let Some(e) = self.async_error() {
            return Err(e);
        }
        let rank = self.rank();
        let coll = Collective { kind, nranks: self.size(), count, root, dtype };
        let ((ia, il), (oa, ol)) = spans(&coll, op, rank, send.map(|s| s.len), recv.len)?;
        let (input, output) = (send.unwrap_or(recv).sub(ia, il)?, recv.sub(oa, ol)?);
        if input.is_empty() && output.is_empty() {
            // count 0, on every rank alike: nothing to move (NCCL accepts
            // any pointers then).
            return Ok(());
        }
        let dc = self.device_comm(if output.is_empty() { input } else { output })?;
        let names = if send.is_some() { ["the send buffer", "the receive buffer"] } else { ["the buffer"; 2] };
        for (what, b) in names.into_iter().zip([input, output]) {
            if !b.is_empty() {
                dc.dev.check(what, b).map_err(|e| {
                    let why = match e {
                        Error::InvalidArgument(m) => m,
                        e => e.to_string(),
                    };
                    Error::invalid(format!("rank {rank}: {}: {what}: {why}", kind.name()))
                })?;
            }
        }
        let call = Call { kind, count, dtype, op, root, input, output };
        #[cfg(feature = "cuda")]
        if let Some(d) = &dc.direct
            && direct_kind(kind)
        {
            return d.run(&call, stream);
        }
        dc.stager.run(self, &call, stream)
    }

    /// All-reduce of `count` elements on device buffers (in place when
    /// `send` is `None`).
    pub fn all_reduce_device(
        &self,
        send: Option<DeviceBuf>,
        recv: DeviceBuf,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: CudaStream,
    ) -> Result<()> {
        self.collective_device(CollKind::AllReduce, send, recv, count, dtype, op, 0, stream)
    }

    /// Waits until `stream` has run everything enqueued on it (at most the
    /// communicator's timeout), then reports any error of the device path:
    /// a kernel that timed out or was stopped, a failed host step, a dead
    /// peer.
    pub fn device_synchronize(&self, stream: CudaStream) -> Result<()> {
        let dc = self.inner.device.lock().clone();
        let Some(dc) = dc else {
            return self.async_error().map_or(Ok(()), Err);
        };
        if let Err(e) = dc.dev.synchronize(stream, self.inner.cfg.timeout) {
            self.inner.shared.set_poison(&e);
            return Err(e);
        }
        self.async_error().map_or(Ok(()), Err)
    }

    /// The error a device kernel recorded, which poisons the communicator.
    pub(crate) fn device_error(&self) -> Option<Error> {
        let dc = self.inner.device.lock().clone()?;
        let status = dc.dev.words().status();
        if status == 0 {
            return None;
        }
        let e = status_error(&self.inner.shared.who, status);
        self.inner.shared.set_poison(&e);
        self.inner.shared.poisoned()
    }

    /// The device side, set up on first use (collective: every rank's first
    /// device call gets here in the same order).
    fn device_comm(&self, buf: DeviceBuf) -> Result<Arc<DeviceComm>> {
        let mut slot = self.inner.device.lock();
        if let Some(dc) = &*slot {
            return Ok(dc.clone());
        }
        let dc = Arc::new(self.open_device(buf)?);
        let abort_dev = dc.dev.clone();
        self.inner.shared.on_poison.lock().push(Box::new(move || abort_dev.words().abort()));
        let abort_dev = dc.dev.clone();
        self.inner.boot.on_failure(Box::new(move || abort_dev.words().abort()));
        *slot = Some(dc.clone());
        Ok(dc)
    }

    #[cfg(feature = "cuda")]
    fn open_device(&self, buf: DeviceBuf) -> Result<DeviceComm> {
        cuda::open(self, buf)
    }

    #[cfg(not(feature = "cuda"))]
    fn open_device(&self, _buf: DeviceBuf) -> Result<DeviceComm> {
        Err(Error::InvalidUsage(format!(
            "rank {}: device buffers need oxccl built with the `cuda` feature",
            self.rank()
        )))
    }

    /// Tests: a communicator whose device is `dev`, on the staged path.
    #[cfg(test)]
    pub(crate) fn use_device_backend(&self, dev: Arc<dyn Backend>, chunk: usize) {
        *self.inner.device.lock() = Some(Arc::new(DeviceComm::staged_only(dev, chunk, self.inner.cfg.timeout)));
    }
}
