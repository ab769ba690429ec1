//! The device part of a launch (see [`crate::device`]), and the
//! communicator's methods on device buffers.

use crate::buf::{CudaStream, DeviceBuf, Region};
use crate::call::{Call, Spec};
use crate::comm::Communicator;
use crate::config::DeviceExec;
use crate::device::{Ctx, DeviceComm, Source, check_stream};
use crate::op::{Op, message};
use oxccl_algo::algos::Algorithm;
use oxccl_algo::collective::CollKind;
use oxccl_core::{DataType, Error, ReduceOp, Result};
use std::sync::Arc;

#[cfg(test)]
mod tests;

impl Communicator {
    /// Runs the collective `spec` describes on device buffers, ordered on
    /// `stream` (NCCL's `ncclAllReduce` … with device pointers): checks the
    /// arguments, enqueues the work and returns. `send: None` is in place,
    /// with NCCL's in-place layout inside `recv`; buffers may be longer
    /// than needed. A launch of one operation.
    pub fn collective_device(
        &self,
        spec: Spec,
        send: Option<DeviceBuf>,
        recv: DeviceBuf,
        stream: CudaStream,
    ) -> Result<()> {
        self.group(|g| {
            g.stream(stream).collective_device(spec, send, recv);
        })
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
        self.collective_device(Spec::new(CollKind::AllReduce, count, dtype).with_op(op), send, recv, stream)
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

    /// Enqueues a launch's device operations (checked by the launch) on
    /// `streams` (at least one): the other streams join the first, which
    /// runs every collective in order and then the sends and receives as
    /// one group, and then wait for it. Operations that move nothing are
    /// left out; a launch of only those enqueues nothing.
    pub(crate) fn launch_device(&self, ops: &[&Op], streams: &[CudaStream]) -> Result<()> {
        if let Some(e) = self.async_error() {
            return Err(e);
        }
        let rank = self.rank();
        let internal = |what: &str| Error::Internal(format!("{what} on host memory reached the device path"));
        let mut colls: Vec<Call<DeviceBuf>> = Vec::new();
        let mut p2p: Vec<(bool, usize, DeviceBuf)> = Vec::new();
        for op in ops {
            match op {
                Op::Collective(c) => {
                    let (Some(i), Some(o)) = (c.input.device(), c.output.device()) else {
                        return Err(internal(c.kind.name()));
                    };
                    let call = c.with_buffers(i, o);
                    // count 0, on every rank alike: nothing to move (NCCL
                    // accepts any pointers then).
                    if !call.is_empty() {
                        colls.push(call);
                    }
                }
                Op::Send(_) | Op::Recv(_) => {
                    let (send, p) = op.p2p().expect("a send or a receive");
                    let b = p.buf.device().ok_or_else(|| internal(op.name()))?;
                    if !b.is_empty() {
                        p2p.push((send, p.peer, b));
                    }
                }
            }
        }
        let first = colls.first().map(|c| if c.output.is_empty() { c.input } else { c.output });
        let Some(first) = first.or_else(|| p2p.first().map(|o| o.2)) else { return Ok(()) };
        // A communicator's first device launch sets the device side up: for
        // its first collective, or for none when it holds only sends and
        // receives (which differ from rank to rank).
        let dc = self.device_comm(first, colls.first())?;
        let what = ops[0].name();
        for &s in streams {
            check_stream(dc.process_ranks, s).map_err(|e| match e {
                Error::InvalidUsage(m) => Error::InvalidUsage(format!("rank {rank}: {what}: {m}")),
                e => e,
            })?;
        }
        for call in &colls {
            let names = if call.input.overlaps(&call.output) {
                ["the buffer"; 2]
            } else {
                ["the send buffer", "the receive buffer"]
            };
            for (what, b) in names.into_iter().zip([call.input, call.output]) {
                if !b.is_empty() {
                    dc.dev.check(what, b).map_err(|e| {
                        Error::invalid(format!("rank {rank}: {}: {what}: {}", call.kind.name(), message(e)))
                    })?;
                }
            }
        }
        for (i, (send, _, b)) in p2p.iter().enumerate() {
            let what = if *send { "the send buffer" } else { "the receive buffer" };
            dc.dev.check(what, *b).map_err(|e| Error::invalid(format!("rank {rank}: group operation {i}: {e}")))?;
        }
        let (main, others) = (streams[0], &streams[1..]);
        for &s in others {
            let m = dc.dev.marker(s)?;
            dc.dev.enqueue_after(main, m.as_ref())?;
        }
        for call in &colls {
            self.enqueue_collective(&dc, call, main)?;
        }
        if !p2p.is_empty() {
            let plan = |ops: Vec<Op>| self.host_job(&ops.iter().collect::<Vec<_>>());
            for job in dc.run_p2p(&plan, &p2p, main)? {
                self.submit(job);
            }
        }
        if !others.is_empty() {
            let m = dc.dev.marker(main)?;
            for &s in others {
                dc.dev.enqueue_after(s, m.as_ref())?;
            }
        }
        Ok(())
    }

    /// Enqueues one checked device collective on `stream`: on the direct
    /// path (the hand-written kernel, or the tuner's program through the
    /// device executor), else staged through host memory.
    fn enqueue_collective(&self, dc: &DeviceComm, call: &Call<DeviceBuf>, stream: CudaStream) -> Result<()> {
        // The device executor runs the tuner's program where the user
        // named the algorithm (or asked for the executor), and for the
        // collectives the hand-written kernel lacks.
        let (kind, coll) = (call.kind, call.collective());
        let exec = self.resolved().device_exec;
        let named = self.tuner().names_algorithm(kind);
        // The deterministic mode runs proven programs only: the kernel's
        // order is its own.
        let strict = self.tuner().strict(&coll);
        let wants = match exec {
            DeviceExec::Program => true,
            DeviceExec::Kernel if strict => {
                return Err(Error::InvalidUsage(format!(
                    "OXCCL_DEVICE_EXEC=kernel cannot run {coll} in the deterministic mode ({}): the kernel's reduction order is not the canonical one; unset one of the two",
                    crate::tuner::DETERMINISTIC
                )));
            }
            DeviceExec::Kernel => false,
            DeviceExec::Auto => strict || named || matches!(kind, CollKind::Gather | CollKind::Scatter),
        };
        let choice = if wants && dc.is_direct() { Some(self.tuner().pick(&coll)?) } else { None };
        let build = |chunk: usize| match choice {
            Some(c) => {
                let p = self.tuner().build_chunked(c, &coll, chunk, crate::device::FIFO_CHANS)?;
                self.tuner().prove(&p, &coll)?;
                Ok(p)
            }
            None => Err(Error::Internal("no program chosen".into())),
        };
        // Where the program cannot run on the device, the deterministic
        // mode fails rather than fall back to the kernel.
        let required = exec == DeviceExec::Program || strict;
        let src = choice.map(|c| Source { name: c.to_string(), build: &build, named, required });
        if dc.run_direct(call, stream, src.as_ref())? {
            return Ok(());
        }
        let plan = |c: &Call<Region>| self.collective_job(c, None);
        let barrier = || self.boot().barrier();
        for job in dc.stager.run(&plan, &barrier, call, stream)? {
            self.submit(job);
        }
        Ok(())
    }

    /// The device side, set up on first use (collective: every rank's first
    /// device launch gets here in the same order).
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
