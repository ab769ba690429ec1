//! The communicator's calls on device buffers (see [`crate::device`]).

use crate::buf::{CudaStream, DeviceBuf, Region};
use crate::call::Call;
use crate::comm::Communicator;
use crate::config::DeviceExec;
use crate::device::{Ctx, DeviceComm, Source};
use oxccl_algo::algos::Algorithm;
use oxccl_algo::collective::CollKind;
use oxccl_core::{DataType, Error, ReduceOp, Result};
use std::sync::Arc;

#[cfg(test)]
mod tests;

/// One send or receive of a group of device buffers (see
/// [`Communicator::group_device`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceP2p {
    /// A send (else a receive).
    pub send: bool,
    /// The other rank (this rank itself is allowed).
    pub peer: usize,
    /// The buffer: whole elements of `dtype`, aligned to them.
    pub buf: DeviceBuf,
    /// The element type (for the checks; the bytes move as they are).
    pub dtype: DataType,
}

impl Communicator {
    /// Runs a collective on device buffers, ordered on `stream` (NCCL's
    /// `ncclAllReduce` … with device pointers): checks the arguments,
    /// enqueues the work and returns. `count` follows NCCL's conventions
    /// (see [`Collective`](oxccl_algo::collective::Collective)); `send:
    /// None` is in place, with NCCL's in-place layout inside `recv`.
    /// Buffers may be longer than needed.
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
        let call = Call::new(kind, count, dtype, op, root, send, recv, self.rank(), self.size())?;
        if call.is_empty() {
            // count 0, on every rank alike: nothing to move (NCCL accepts
            // any pointers then).
            return Ok(());
        }
        let names = if send.is_some() { ["the send buffer", "the receive buffer"] } else { ["the buffer"; 2] };
        let named = |what: &str, e: Error| {
            let why = match e {
                Error::InvalidArgument(m) => m,
                e => e.to_string(),
            };
            Error::invalid(format!("rank {}: {}: {what}: {why}", self.rank(), kind.name()))
        };
        for (what, b) in names.into_iter().zip([call.input, call.output]) {
            crate::device::check_aligned(b.addr(), b.len(), dtype).map_err(|e| named(what, e))?;
        }
        let dc = self.device_comm(if call.output.is_empty() { call.input } else { call.output }, Some(&call))?;
        crate::device::check_stream(dc.process_ranks, stream).map_err(|e| match e {
            Error::InvalidUsage(m) => Error::InvalidUsage(format!("rank {}: {}: {m}", self.rank(), kind.name())),
            e => e,
        })?;
        for (what, b) in names.into_iter().zip([call.input, call.output]) {
            if !b.is_empty() {
                dc.dev.check(what, b).map_err(|e| named(what, e))?;
            }
        }
        // The device executor runs the tuner's program where the user
        // named the algorithm (or asked for the executor), and for the
        // collectives the hand-written kernel lacks.
        let coll = call.collective();
        let exec = self.resolved().device_exec;
        let named = self.tuner().names_algorithm(kind);
        let wants = match exec {
            DeviceExec::Program => true,
            DeviceExec::Kernel => false,
            DeviceExec::Auto => named || matches!(kind, CollKind::Gather | CollKind::Scatter),
        };
        let choice = if wants && dc.is_direct() { Some(self.tuner().pick(&coll)?) } else { None };
        let build = |chunk: usize| match choice {
            Some(c) => self.tuner().build_chunked(c, &coll, chunk),
            None => Err(Error::Internal("no program chosen".into())),
        };
        let required = exec == DeviceExec::Program;
        let src = choice.map(|c| Source { name: c.to_string(), build: &build, named, required });
        if dc.run_direct(&call, stream, src.as_ref())? {
            return Ok(());
        }
        let plan = |c: &Call<Region>| self.collective_job(c, None);
        let barrier = || self.boot().barrier();
        for job in dc.stager.run(&plan, &barrier, &call, stream)? {
            self.submit(job);
        }
        Ok(())
    }

    /// Sends `buf` (whole `dtype` elements) to `peer`, ordered on `stream`
    /// (NCCL's `ncclSend` on device memory): a group of one.
    pub fn send_device(&self, buf: DeviceBuf, dtype: DataType, peer: usize, stream: CudaStream) -> Result<()> {
        self.group_device(&[DeviceP2p { send: true, peer, buf, dtype }], stream)
    }

    /// Receives into `buf` from `peer`, ordered on `stream` (`ncclRecv`).
    pub fn recv_device(&self, buf: DeviceBuf, dtype: DataType, peer: usize, stream: CudaStream) -> Result<()> {
        self.group_device(&[DeviceP2p { send: false, peer, buf, dtype }], stream)
    }

    /// Sends and receives of device buffers launched together (NCCL's
    /// `ncclGroupStart` … `ncclGroupEnd` of `ncclSend`/`ncclRecv`), ordered
    /// on `stream`: matched sends and receives complete whatever their
    /// order in each rank's group (both ranks may send first); messages
    /// between two ranks arrive in the order they were sent. On the direct
    /// path one kernel moves the whole group (at most 64 operations); on
    /// the staged path it goes through host memory in pieces (at most 32
    /// sends and 32 receives at once). A rank may send to itself: its sends
    /// to itself land in its receives from itself, in order. Empty buffers
    /// move nothing (on both ends). An error changes nothing.
    pub fn group_device(&self, ops: &[DeviceP2p], stream: CudaStream) -> Result<()> {
        if let Some(e) = self.async_error() {
            return Err(e);
        }
        let rank = self.rank();
        for (i, o) in ops.iter().enumerate() {
            let what = if o.send { "send_device" } else { "recv_device" };
            if o.peer >= self.size() {
                return Err(Error::invalid(format!(
                    "rank {rank}: {what} (operation {i} of the group): peer {} is out of range for {} ranks",
                    o.peer,
                    self.size()
                )));
            }
            if o.buf.len() % o.dtype.size() != 0 {
                return Err(Error::invalid(format!(
                    "rank {rank}: {what} (operation {i}): a buffer of {} bytes is not whole {} elements",
                    o.buf.len(),
                    o.dtype
                )));
            }
            crate::device::check_aligned(o.buf.addr(), o.buf.len(), o.dtype)
                .map_err(|e| Error::invalid(format!("rank {rank}: {what} (operation {i}): {e}")))?;
        }
        let live: Vec<(bool, usize, DeviceBuf)> =
            ops.iter().filter(|o| !o.buf.is_empty()).map(|o| (o.send, o.peer, o.buf)).collect();
        let Some(&(_, _, first)) = live.first() else { return Ok(()) };
        // A communicator's first device call sets the device side up (with
        // no collective to prepare for: groups differ from rank to rank).
        let dc = self.device_comm(first, None)?;
        crate::device::check_stream(dc.process_ranks, stream).map_err(|e| match e {
            Error::InvalidUsage(m) => Error::InvalidUsage(format!("rank {rank}: send/recv: {m}")),
            e => e,
        })?;
        for (i, (send, _, b)) in live.iter().enumerate() {
            let what = if *send { "the send buffer" } else { "the receive buffer" };
            dc.dev.check(what, *b).map_err(|e| Error::invalid(format!("rank {rank}: group operation {i}: {e}")))?;
        }
        let plan = |ops: Vec<crate::group::Op>| self.group_job(ops);
        for job in dc.run_p2p(&plan, &live, stream)? {
            self.submit(job);
        }
        Ok(())
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
        let dc = self.device_slot().lock().clone();
        let Some(dc) = dc else {
            return self.async_error().map_or(Ok(()), Err);
        };
        if let Err(e) = dc.dev.synchronize(stream, self.resolved().timeout) {
            self.shared().set_poison(&e);
            return Err(e);
        }
        self.async_error().map_or(Ok(()), Err)
    }

    /// The device side, set up on first use (collective: every rank's first
    /// device call gets here in the same order).
    fn device_comm(&self, buf: DeviceBuf, first: Option<&Call<DeviceBuf>>) -> Result<Arc<DeviceComm>> {
        let mut slot = self.device_slot().lock();
        if let Some(dc) = &*slot {
            return Ok(dc.clone());
        }
        let ctx = Ctx {
            who: &self.shared().who,
            rank: self.rank(),
            nranks: self.size(),
            boot: self.boot(),
            cfg: self.resolved(),
            one_shot: self.tuner().allows(CollKind::AllReduce, Algorithm::OneShot),
            two_shot: self.tuner().allows(CollKind::AllReduce, Algorithm::TwoShot),
        };
        let dc = Arc::new(DeviceComm::open(&ctx, buf, first)?);
        self.hook_device(&dc);
        *slot = Some(dc.clone());
        Ok(dc)
    }

    /// A poisoned communicator or a dead peer tells the device's kernels
    /// to give up.
    fn hook_device(&self, dc: &Arc<DeviceComm>) {
        let abort_dev = dc.dev.clone();
        self.shared().on_poison.lock().push(Box::new(move || abort_dev.words().abort()));
        let abort_dev = dc.dev.clone();
        self.boot().on_failure(Box::new(move || abort_dev.words().abort()));
    }

    /// Tests: a communicator whose device is `dev`, on the staged path.
    #[cfg(test)]
    pub(crate) fn use_device_backend(&self, dev: Arc<dyn crate::device::backend::Backend>, chunk: usize) {
        let dc = Arc::new(DeviceComm::staged_only(dev, chunk, self.resolved().timeout, &self.shared().who));
        self.hook_device(&dc);
        *self.device_slot().lock() = Some(dc);
    }
}
