//! Repeated small calls. A training loop's scalars and norms, a
//! benchmark's iterations, an inference step's small collectives: the
//! same few calls again and again, often on other buffers of the same
//! size (a framework allocates a fresh tensor each step; nccl-tests-style
//! benchmarks walk their buffers). The jobs of the last [`KEPT`] distinct
//! small blocking collectives are kept, with their tasks and temporaries,
//! and one is run again when a call is the same collective on buffers
//! laid out alike, moved to the new buffers. Such a call is still checked (its arguments, and
//! whether the communicator may run it) and numbered (its messages carry
//! their own signature), but it is not planned, and nothing is allocated
//! for it.
//!
//! This module holds what is kept; the engine's lock guards it with the
//! fabric (`engine::Locked`: a replayed call takes that one lock), and the
//! communicator's side is `Communicator::run_collective` in `launch.rs`.

use crate::buf::Region;
use crate::call::{Call, Spec};
use crate::job::Job;

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
    pub fn of(call: &Call<Region>) -> Option<Key> {
        let (i, o) = (call.input, call.output);
        (call.collective().size_bytes() <= MAX_BYTES).then(|| Key {
            spec: call.spec(),
            lens: (i.len(), o.len()),
            in_place_at: i.overlaps(&o).then(|| i.addr() as isize - o.addr() as isize),
        })
    }
}

/// Distinct calls kept: a loop that alternates a few small calls (a
/// loss all_reduce, a norm, a barrier) runs each again.
pub(crate) const KEPT: usize = 4;

/// A small call's job, ready to run again, and the buffers it ran on.
pub(crate) struct Replay {
    pub key: Key,
    pub bufs: (Region, Region),
    pub job: Job,
}

/// What a communicator keeps: the latest distinct calls first.
#[derive(Default)]
pub(crate) struct Slot {
    /// Boxed: a job is large (hundreds of bytes), and is taken out, run
    /// and put back where it lies, not moved on every call.
    #[allow(clippy::vec_box)]
    kept: Vec<Box<Replay>>,
    /// Calls that ran a kept job again.
    pub replayed: u64,
}

impl Slot {
    /// The kept call of `key`, taken out.
    pub fn take(&mut self, key: &Key) -> Option<Box<Replay>> {
        let at = self.kept.iter().position(|r| r.key == *key)?;
        Some(self.kept.remove(at))
    }

    /// Keeps `r` as the latest call, forgetting the oldest beyond
    /// [`KEPT`].
    pub fn keep(&mut self, r: Box<Replay>) {
        self.kept.truncate(KEPT - 1);
        self.kept.insert(0, r);
    }
}
