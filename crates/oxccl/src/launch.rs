//! [`Communicator::launch`]: the one entry point every operation goes
//! through — the typed Rust methods, [`Group`](crate::Group), the C ABI and
//! the Python package — routing each operation by its memory.
//!
//! `unsafe` here: `launch` takes raw host buffers from callers outside
//! Rust's borrow rules (the C ABI and Python hold addresses, not slices),
//! who promise that the buffers outlive it. Inside the crate, the typed
//! methods and groups hold borrows for as long as [`Communicator::run_ops`]
//! runs and call it directly.
#![allow(unsafe_code)]

use crate::buf::{CudaStream, Memory};
use crate::comm::Communicator;
use crate::op::Op;
use oxccl_core::{Error, Result};

impl Communicator {
    /// Runs `ops` together, as one group (NCCL's `ncclGroupStart` …
    /// `ncclGroupEnd`). Every operation is checked before anything runs
    /// (an error changes nothing). Then:
    ///
    /// 1. the operations on **device** memory are enqueued on `streams` and
    ///    this returns without waiting for them: their collectives one
    ///    after another in the order given, then their sends and receives
    ///    together (matched ones complete whatever their order on each
    ///    rank: both ranks may send first). With several streams, the
    ///    launch waits for all of them and all of them wait for the launch
    ///    (NCCL's rule for a group on several streams);
    /// 2. the operations on **host** memory run on the calling thread (or
    ///    the progress thread, behind earlier calls) and have ended when
    ///    this returns: collectives in order, then sends and receives
    ///    together.
    ///
    /// A launch may mix both. Every rank must launch its collectives in the
    /// same order and in the same memory kind, and a send and the receive
    /// it matches must be in the same memory kind (both host, or both
    /// device). Device operations need at least one stream; host-only
    /// launches take none (nothing of theirs is ordered on a stream).
    ///
    /// # Safety
    /// Host buffers (the [`Region`](crate::Region)s in `ops`) must stay
    /// allocated, and not be written by anyone else (nor read, for those
    /// the launch writes), until this returns; device buffers until the
    /// streams have passed the launch. The typed methods and
    /// [`Group`](crate::Group) guarantee it with borrows.
    pub unsafe fn launch(&self, ops: &[Op], streams: &[CudaStream]) -> Result<()> {
        self.run_ops(ops, streams)
    }

    /// [`launch`](Communicator::launch), for callers that hold every host
    /// buffer of `ops` borrowed until it returns (the typed methods and
    /// groups).
    pub(crate) fn run_ops(&self, ops: &[Op], streams: &[CudaStream]) -> Result<()> {
        // Whether the communicator is usable is checked where each part is
        // planned (`plan`, `host_job`, `launch_device`), once per call.
        let (rank, nranks) = (self.rank(), self.size());
        for (i, op) in ops.iter().enumerate() {
            op.check(i, rank, nranks)?;
        }
        // One collective on host memory, the common case: straight to its
        // job (what the general path below builds, with less on the way:
        // small calls are latency-bound).
        if let ([Op::Collective(call)], []) = (ops, streams)
            && let (Some(i), Some(o)) = (call.input.host(), call.output.host())
        {
            return self.run_collective(&call.with_buffers(i, o));
        }
        if ops.is_empty() {
            return Ok(());
        }
        let (device, host): (Vec<&Op>, Vec<&Op>) = ops.iter().partition(|o| o.memory() == Memory::Device);
        if !device.is_empty() && streams.is_empty() {
            return Err(Error::InvalidUsage(format!(
                "rank {rank}: {} on device memory needs a CUDA stream to be ordered on",
                device[0].name()
            )));
        }
        if device.is_empty() && !streams.is_empty() {
            return Err(Error::invalid(format!(
                "rank {rank}: {} on host memory runs on the calling thread and is ordered on no stream: pass none, \
                 not {:#x}",
                host.first().map_or("a launch", |o| o.name()),
                streams[0].0
            )));
        }
        // The host part is planned first: a planning error then changes
        // nothing on either side.
        let job = self.host_job(&host)?;
        if !device.is_empty() {
            self.launch_device(&device, streams)?;
        }
        match job {
            Some(job) => self.run(job),
            None => Ok(()),
        }
    }
}
