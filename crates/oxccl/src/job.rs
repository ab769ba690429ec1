//! Jobs: what the API hands the engine, as plain data. A job is a call (or
//! a group) planned into batches of executor tasks, with whole-buffer
//! actions before and after, and the storage it must keep alive.

use crate::buf::{self, Owned, Region};
use crate::exec::{Label, Task};
use oxccl_core::{DataType, Error, Result, kernels};
use parking_lot::{Condvar, Mutex};
use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

/// Counters a device shares with the host (page-locked memory on a GPU):
/// the engine waits on them and sets them, and knows the device through
/// nothing else.
pub(crate) trait Counters: Send + Sync {
    /// Reads counter `i`.
    fn get(&self, i: usize) -> u64;
    /// Writes counter `i`.
    fn set(&self, i: usize, v: u64);
    /// The error the device recorded, if any.
    fn failure(&self) -> Option<Error>;
}

/// Something the engine does to whole buffers before or after the tasks.
pub(crate) enum Action {
    /// `dst = src`.
    Copy { dst: Region, src: Region },
    /// `dst = src × scalar` (PreMulSum's inputs).
    Premul { dtype: DataType, dst: Region, src: Region, scalar: f64 },
    /// `buf /= n` (Avg's result).
    Avg { dtype: DataType, buf: Region, n: usize },
    /// Waits until a device counter reaches `value` (staged device buffers).
    Await { dev: Arc<dyn Counters>, word: usize, value: u64 },
    /// Sets a device counter.
    Signal { dev: Arc<dyn Counters>, word: usize, value: u64 },
}

impl Action {
    /// Runs a buffer action; the device ones are the engine's (they wait).
    pub fn run_local(&self) -> Result<()> {
        match self {
            Action::Copy { dst, src } => buf::copy(dst, src),
            Action::Premul { dtype, dst, src, scalar } => {
                src.read(|s| dst.write(|d| kernels::premul(*dtype, d, s, *scalar)))?
            }
            Action::Avg { dtype, buf, n } => buf.write(|b| kernels::finish_avg(*dtype, b, *n))?,
            Action::Signal { dev, word, value } => {
                dev.set(*word, *value);
                Ok(())
            }
            Action::Await { .. } => Err(Error::Internal("a device wait outside the engine".into())),
        }
    }
}

/// One submitted call (or group): batches of tasks run one batch after
/// another, the tasks of a batch concurrently.
pub(crate) struct Job {
    /// What the job is; its `seq` is the call's operation number.
    pub label: Label,
    pub pre: Vec<Action>,
    pub batches: Vec<Vec<Task>>,
    pub post: Vec<Action>,
    /// Scratch and temporaries the tasks point into (kept alive, never
    /// read directly; zeroed again when the job runs again).
    pub owned: Vec<Owned>,
    /// Caller storage moved into the call (owned-buffer API), handed back
    /// at completion.
    pub keep: Option<Box<dyn Any + Send>>,
    pub done: Arc<Completion>,
    /// Run to its end by a caller that took the result itself (a blocking
    /// call on its own thread): nobody waits on `done`, and dropping the
    /// job finishes nothing.
    pub settled: bool,
}

impl Job {
    /// A job of planned batches with their extras.
    pub fn new(label: Label, batches: Vec<Vec<Task>>, extras: Extras, keep: Option<Box<dyn Any + Send>>) -> Job {
        Job {
            label,
            pre: extras.pre,
            batches,
            post: extras.post,
            owned: extras.owned,
            keep,
            done: Arc::new(Completion::default()),
            settled: false,
        }
    }
}

impl Job {
    /// The same job ready to run again as call number `seq` (collective
    /// number `coll_seq`), on the caller's buffers `to` (input, output)
    /// where it last ran on `from`: it ran to its end on the caller's
    /// thread last time ([`crate::replay`]), and the buffers are laid out
    /// alike (same lengths; in place at the same offset, or apart).
    pub fn rearm(&mut self, seq: u64, coll_seq: u64, from: (Region, Region), to: (Region, Region)) -> Result<()> {
        self.label.seq = seq;
        // Nobody waits on it yet: if it goes through the queue and is
        // dropped unfinished, its waiter must hear of it.
        self.settled = false;
        let moved = |r: &mut Region| -> Result<()> {
            *r = relocate(*r, from, to)?;
            Ok(())
        };
        for t in self.batches.iter_mut().flatten() {
            t.rearm(seq, coll_seq);
            moved(&mut t.bufs.input)?;
            moved(&mut t.bufs.output)?;
        }
        for a in self.pre.iter_mut().chain(&mut self.post) {
            match a {
                Action::Copy { dst, src } | Action::Premul { dst, src, .. } => {
                    moved(dst)?;
                    moved(src)?;
                }
                Action::Avg { buf, .. } => moved(buf)?,
                Action::Await { .. } | Action::Signal { .. } => {}
            }
        }
        self.owned.iter_mut().for_each(Owned::zero);
        Ok(())
    }
}

/// `r` moved from the caller's buffers `from` (input, output) to `to`:
/// the same offset in the buffer it lies in (the output first: in place,
/// the input lies inside it); a temporary of the job's own stays.
fn relocate(r: Region, from: (Region, Region), to: (Region, Region)) -> Result<Region> {
    let inside = |b: &Region| !r.is_empty() && r.addr() >= b.addr() && r.addr() + r.len() <= b.addr() + b.len();
    if inside(&from.1) {
        to.1.sub(r.addr() - from.1.addr(), r.len())
    } else if inside(&from.0) {
        to.0.sub(r.addr() - from.0.addr(), r.len())
    } else {
        Ok(r)
    }
}

/// A job never ends unfinished: whatever drops it without finishing it (a
/// panic while it runs, a queue torn down) finishes its completion with
/// an error, so no waiter can wait on it forever.
impl Drop for Job {
    fn drop(&mut self) {
        if !self.settled && !self.done.is_done() {
            self.done.finish(
                Err(Error::Internal(format!("{} ended without finishing (its progress thread failed)", self.label))),
                self.keep.take(),
            );
        }
    }
}

/// What the engine must own and do around a job's tasks.
#[derive(Default)]
pub(crate) struct Extras {
    pub pre: Vec<Action>,
    pub post: Vec<Action>,
    pub owned: Vec<Owned>,
}

impl Extras {
    /// `len` zeroed bytes owned by the job.
    pub fn temp(&mut self, len: usize) -> Region {
        let mut o = Owned::zeroed(len);
        let r = o.region();
        self.owned.push(o);
        r
    }
}

/// A job's result and the caller's storage it hands back.
type Outcome = (Result<()>, Option<Box<dyn Any + Send>>);

/// Where a job's outcome lands.
#[derive(Default)]
pub struct Completion {
    state: Mutex<Option<Outcome>>,
    cv: Condvar,
}

impl Completion {
    pub(crate) fn finish(&self, r: Result<()>, keep: Option<Box<dyn Any + Send>>) {
        *self.state.lock() = Some((r, keep));
        self.cv.notify_all();
    }

    /// Whether the job has ended.
    pub fn is_done(&self) -> bool {
        self.state.lock().is_some()
    }

    /// Blocks until the job ends (the engine guarantees it ends: every wait
    /// inside has a deadline); the result and the caller's storage.
    pub(crate) fn wait(&self) -> Outcome {
        let mut st = self.state.lock();
        while st.is_none() {
            self.cv.wait(&mut st);
        }
        let (r, keep) = st.as_mut().expect("checked");
        (r.clone(), keep.take())
    }

    /// Like [`wait`](Completion::wait) with a limit: `None` if still running.
    pub(crate) fn wait_for(&self, d: Duration) -> Option<Result<()>> {
        let mut st = self.state.lock();
        if st.is_none() {
            self.cv.wait_for(&mut st, d);
        }
        st.as_ref().map(|(r, _)| r.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_dropped_unfinished_finishes_its_waiters_with_an_error() {
        let job = Job::new(Label::new("all_reduce", 7), Vec::new(), Extras::default(), Some(Box::new(vec![1u8; 4])));
        let done = job.done.clone();
        let waiter = std::thread::spawn(move || done.wait());
        drop(job);
        let (r, keep) = waiter.join().unwrap();
        let e = r.unwrap_err().to_string();
        assert!(e.contains("all_reduce") && e.contains("ended without finishing"), "{e}");
        assert!(keep.is_some(), "the caller's storage comes back");
    }
}
