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
//!
//! This module holds what is kept; the communicator's side is
//! `Communicator::run_collective` in `launch.rs` (the communicator holds
//! the slot, so this module may not know the communicator).

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

/// The last small call's job, ready to run again, and the buffers it ran
/// on.
pub(crate) struct Replay {
    pub key: Key,
    pub bufs: (Region, Region),
    pub job: Job,
}
