//! Repeated small calls. A training loop's scalars and norms, a
//! benchmark's iterations, an inference step's small collectives: the
//! same call again and again, often on other buffers of the same size
//! (a framework allocates a fresh tensor each step; nccl-tests-style
//! benchmarks walk their buffers). The job of the last small blocking
//! collective is kept, with its tasks and temporaries, and run again when
//! the next call is the same collective on buffers laid out alike, moved
//! to the new buffers. Such a call is still checked (its arguments, and
//! whether the communicator may run it) and numbered (its messages carry
//! their own signature), but it is not planned, and nothing is allocated
//! for it.

use crate::buf::Region;
use crate::call::{Call, Spec};
use crate::comm::Communicator;
use crate::job::Job;
use oxccl_core::Result;

/// Calls up to this size are kept (beyond it the call's own time dwarfs
/// planning, and its temporaries would stay allocated).
pub(crate) const MAX_BYTES: usize = 64 << 10;

/// What makes a call the same as the last one: what it computes, its
/// buffers' lengths, and whether it runs in place (and where its input
/// lies in its output then): the plan depends on nothing else.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Key {
    spec: Spec,
    lens: (usize, usize),
    in_place_at: Option<isize>,
}

impl Key {
    /// The key of `call`, if it is small enough to keep.
    fn of(call: &Call<Region>) -> Option<Key> {
        let (i, o) = (call.input, call.output);
        (call.collective().size_bytes() <= MAX_BYTES).then(|| Key {
            spec: call.spec(),
            lens: (i.len(), o.len()),
            in_place_at: i.overlaps(&o).then(|| i.addr() as isize - o.addr() as isize),
        })
    }
}

/// The last small call's job, ready to run again, and the buffers it ran
/// on.
pub(crate) struct Replay {
    key: Key,
    bufs: (Region, Region),
    job: Job,
}

impl Communicator {
    /// Runs one checked blocking collective on host memory: the kept job
    /// again when `call` is the last call once more, else a newly planned
    /// one (kept if small, once it has succeeded).
    pub(crate) fn run_collective(&self, call: &Call<Region>) -> Result<()> {
        let Some(key) = Key::of(call) else { return self.run(self.collective_job(call, None)?) };
        let bufs = (call.input, call.output);
        let kept = self.replay_slot().lock().take().filter(|r| r.key == key);
        let mut job = match kept {
            Some(Replay { mut job, bufs: from, .. }) => {
                self.admit(call)?;
                let (seq, coll_seq) = self.number();
                job.rearm(seq, coll_seq, from, bufs)?;
                self.count_replay();
                job
            }
            None => self.collective_job(call, None)?,
        };
        match self.shared().run_here(&mut job) {
            Some(Ok(())) => {
                *self.replay_slot().lock() = Some(Replay { key, bufs, job });
                Ok(())
            }
            Some(Err(e)) => Err(e),
            // Calls queued ahead of this one (asynchronous ones): in turn.
            None => self.run(job),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{Communicator, ReduceOp};

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
                });
            }
        });
    }
}
