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

use crate::buf::{CudaStream, Memory, Region};
use crate::call::Call;
use crate::comm::Communicator;
use crate::op::Op;
use crate::replay::{Key, Replay};
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

impl Communicator {
    /// Runs one checked blocking collective on host memory: a kept job
    /// again when `call` is one of the last distinct calls once more, else
    /// a newly planned one (kept if small, once it has succeeded). A
    /// replayed call takes one lock, the engine's, for all of it.
    pub(crate) fn run_collective(&self, call: &Call<Region>) -> Result<()> {
        let Some(key) = Key::of(call) else { return self.run(self.collective_job(call, None)?) };
        let shared = self.shared();
        let bufs = (call.input, call.output);
        let mut st = shared.state.lock();
        let mut kept = match st.replay.take(&key) {
            Some(mut r) => {
                if self.resolved().check {
                    // The check asks every rank: not under the lock, which
                    // the progress thread needs to push out what earlier
                    // calls left queued for the ranks that answer.
                    drop(st);
                    self.admit(call)?;
                    st = shared.state.lock();
                } else {
                    self.admit(call)?;
                }
                let (seq, coll_seq) = self.number();
                r.job.rearm(seq, coll_seq, r.bufs, bufs)?;
                r.bufs = bufs;
                st.replay.replayed += 1;
                r
            }
            None => {
                // Planned without the lock (the progress thread may need
                // it meanwhile), then run under it.
                drop(st);
                let r = Box::new(Replay { key, bufs, job: self.collective_job(call, None)? });
                st = shared.state.lock();
                r
            }
        };
        match shared.run_locked(&mut st.fabric, &mut kept.job) {
            Some(Ok(())) => {
                st.replay.keep(kept);
                Ok(())
            }
            Some(Err(e)) => Err(e),
            // Calls queued ahead of this one (asynchronous ones): in turn,
            // through the queue, whose thread needs the lock.
            None => {
                drop(st);
                self.run(kept.job)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{Communicator, Config, ReduceOp};
    use oxccl_transport::Kind;

    /// A replayed small call allocates nothing on the calling thread: one
    /// rank, two thread ranks in memory, and two thread ranks over shared
    /// memory (the code processes on one host run), out of place and in
    /// place, sum and average, on buffers that move between calls.
    #[test]
    fn a_replayed_small_call_allocates_nothing() {
        const CALLS: u64 = 2000;
        let setups: [(usize, Option<Kind>); 3] = [(1, None), (2, None), (2, Some(Kind::Shm))];
        for (n, transport) in setups {
            let config = Config { transport, check: Some(false), ..Config::default() };
            let comms = Communicator::init_threads_with(n, config).unwrap();
            std::thread::scope(|s| {
                for c in &comms {
                    s.spawn(move || {
                        let (mut send, mut recv) = ([0f32; 8], [0f32; 8]);
                        let mut calls = |count: u64| {
                            for i in 0..count {
                                let at = (i % 4) as usize * 2;
                                send[at..at + 2].copy_from_slice(&[i as f32, 1.0]);
                                c.all_reduce(&send[at..at + 2], &mut recv[at..at + 2], ReduceOp::Sum).unwrap();
                                assert_eq!(recv[at..at + 2], [n as f32 * i as f32, n as f32], "call {i}");
                                let mut x = [1.5f64];
                                c.all_reduce_in_place(&mut x, ReduceOp::Avg).unwrap();
                                assert_eq!(x, [1.5], "call {i} in place");
                            }
                        };
                        // The first calls plan, connect and fill the caches.
                        calls(8);
                        // A round of calls may still meet a one-time
                        // allocation of the machinery around them (the
                        // first time this thread parks on a lock, a
                        // stall's probe): one of three rounds must make
                        // none.
                        let mut made = Vec::new();
                        for _ in 0..3 {
                            let (before, replayed) = (crate::alloc_count::made(), c.replayed());
                            calls(CALLS);
                            made.push(crate::alloc_count::made() - before);
                            assert_eq!(c.replayed() - replayed, 2 * CALLS, "{n} ranks ({transport:?}): replayed calls");
                        }
                        assert!(
                            made.contains(&0),
                            "{n} ranks ({transport:?}): allocations in three rounds of {} replayed calls: {made:?}",
                            2 * CALLS
                        );
                    });
                }
            });
        }
    }

    /// A small blocking call made while asynchronous calls are still
    /// queued runs after them, in turn, through the queue (whose thread
    /// needs the engine's lock: the call must not hold it while it waits),
    /// replayed or not.
    #[test]
    fn a_small_call_behind_queued_asynchronous_ones_runs_after_them() {
        let comms = Communicator::init_threads(2).unwrap();
        std::thread::scope(|s| {
            for c in &comms {
                s.spawn(move || {
                    for round in 0..20 {
                        let works: Vec<_> = (0..3)
                            .map(|k| c.all_reduce_async(vec![1.0f32 + k as f32; 1 << 16], ReduceOp::Sum).unwrap())
                            .collect();
                        let mut x = [round as f32];
                        c.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
                        assert_eq!(x, [2.0 * round as f32], "round {round}");
                        for (k, w) in works.into_iter().enumerate() {
                            let v = w.wait().unwrap();
                            assert!(v.iter().all(|&e| e == 2.0 + 2.0 * k as f32), "round {round}, call {k}");
                        }
                    }
                });
            }
        });
    }

    /// Each small call many times in a row, on buffers that move from call
    /// to call (as a benchmark walks its buffers) and in place, with
    /// actions around the tasks (Avg's division, an in-place input's
    /// copy): every result checked, and all but the first of each run
    /// replayed.
    #[test]
    fn repeated_calls_run_again_on_moved_buffers_and_give_what_fresh_ones_give() {
        const RUN: usize = 20;
        let comms = Communicator::init_threads(3).unwrap();
        std::thread::scope(|s| {
            for c in &comms {
                s.spawn(move || {
                    let (r, me) = (c.rank() as f32, c.rank());
                    let (mut send, mut recv) = (vec![0f32; 64], vec![0f32; 64]);
                    let before = c.replayed();
                    for kind in 0..5 {
                        for i in 0..RUN {
                            // A new place every call.
                            let at = (i * 3) % 40;
                            let v = [r + i as f32, 2.0 * r, 1.0];
                            send[at..at + 3].copy_from_slice(&v);
                            match kind {
                                0 => {
                                    c.all_reduce(&send[at..at + 3], &mut recv[at + 1..at + 4], ReduceOp::Sum).unwrap();
                                    assert_eq!(recv[at + 1..at + 4], [3.0 + 3.0 * i as f32, 6.0, 3.0], "call {i}");
                                }
                                1 => {
                                    c.all_reduce(&send[at..at + 3], &mut recv[at..at + 3], ReduceOp::Avg).unwrap();
                                    assert_eq!(recv[at..at + 3], [1.0 + i as f32, 2.0, 1.0], "avg, call {i}");
                                }
                                2 => {
                                    let mut inplace = [r + i as f32; 5];
                                    let w = &mut inplace[i % 3..i % 3 + 3];
                                    c.all_reduce_in_place(w, ReduceOp::Max).unwrap();
                                    assert_eq!(*w, [2.0 + i as f32; 3], "call {i} in place");
                                }
                                3 => {
                                    // Block k is k + 10 i on every rank; each
                                    // keeps the sum of its own, in place.
                                    let mut rs = vec![0f32; 6 + at];
                                    (0..6).for_each(|k| rs[at + k] = (k / 2) as f32 + 10.0 * i as f32);
                                    c.reduce_scatter_in_place(&mut rs[at..], ReduceOp::Sum).unwrap();
                                    let want = 3.0 * (me as f32 + 10.0 * i as f32);
                                    assert_eq!(rs[at + 2 * me..at + 2 * me + 2], [want; 2], "call {i}");
                                }
                                _ => {
                                    let mut g = vec![0f32; 9 + at];
                                    g[3 * me + at..3 * me + at + 3].copy_from_slice(&v);
                                    c.all_gather_in_place(&mut g[at..]).unwrap();
                                    let want: Vec<f32> =
                                        (0..3).flat_map(|k| [k as f32 + i as f32, 2.0 * k as f32, 1.0]).collect();
                                    assert_eq!(g[at..], want[..], "all_gather, call {i}");
                                }
                            }
                        }
                    }
                    assert_eq!(c.replayed() - before, 5 * (RUN as u64 - 1), "replayed calls");
                    // Two calls in turn (a loss and a norm, say): both kept.
                    let before = c.replayed();
                    for i in 0..RUN {
                        let mut x = [r + i as f32; 2];
                        c.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
                        assert_eq!(x, [3.0 + 3.0 * i as f32; 2], "alternating call {i}");
                        let mut g = [0f64; 3];
                        g[me] = i as f64;
                        c.all_gather_in_place(&mut g).unwrap();
                        assert_eq!(g, [i as f64; 3], "alternating all_gather {i}");
                    }
                    assert_eq!(c.replayed() - before, 2 * (RUN as u64 - 1), "alternating calls replayed");
                });
            }
        });
    }
}
