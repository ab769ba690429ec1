//! The progress engine: one thread per communicator that runs submitted
//! jobs in order (a stream), drives the fabric, and enforces deadlines.
//!
//! The API thread plans a call into a [`Job`] (tasks with raw buffer
//! views, actions before and after) and queues it; the engine runs jobs
//! one after another, so calls complete in the order they were made, as
//! on a CUDA stream. A failure (a dead peer, a timeout, an abort) poisons
//! the communicator: the failing job and every later one end with the
//! error, which [`Shared::poison`] keeps for `async_error`.

use crate::buf::{self, Owned, Region};
use crate::exec::{self, Task, Turns};
use oxccl_core::{DataType, Error, Result, kernels};
use oxccl_transport::PeerStats;
use oxccl_transport::fabric::Fabric;
use oxccl_transport::futex::Doorbell;
use parking_lot::{Condvar, Mutex};
use std::any::Any;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Something the engine does to whole buffers before or after the tasks.
pub(crate) enum Action {
    /// `dst = src`.
    Copy { dst: Region, src: Region },
    /// `dst = src × scalar` (PreMulSum's inputs).
    Premul { dtype: DataType, dst: Region, src: Region, scalar: f64 },
    /// `buf /= n` (Avg's result).
    Avg { dtype: DataType, buf: Region, n: usize },
}

impl Action {
    fn run(&self) -> Result<()> {
        match self {
            Action::Copy { dst, src } => buf::copy(dst, src),
            Action::Premul { dtype, dst, src, scalar } => {
                src.read(|s| dst.write(|d| kernels::premul(*dtype, d, s, *scalar)))?
            }
            Action::Avg { dtype, buf, n } => buf.write(|b| kernels::finish_avg(*dtype, b, *n))?,
        }
    }
}

/// One submitted call (or group): batches of tasks run one batch after
/// another, the tasks of a batch concurrently.
pub(crate) struct Job {
    pub seq: u64,
    pub label: String,
    pub pre: Vec<Action>,
    pub batches: Vec<Vec<Task>>,
    pub post: Vec<Action>,
    /// Scratch and temporaries the tasks point into (kept alive, never
    /// read directly).
    #[allow(dead_code)]
    pub owned: Vec<Owned>,
    /// Caller storage moved into the call (owned-buffer API), handed back
    /// at completion.
    pub keep: Option<Box<dyn Any + Send>>,
    pub done: Arc<Completion>,
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
    pub(crate) fn wait(&self) -> (Result<()>, Option<Box<dyn Any + Send>>) {
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

/// State shared by the API and the engine.
pub(crate) struct Shared {
    pub queue: Mutex<VecDeque<Job>>,
    pub bell: Doorbell,
    pub poison: Mutex<Option<Error>>,
    pub abort: AtomicBool,
    pub shutdown: AtomicBool,
    pub stats: Mutex<Vec<PeerStats>>,
    pub timeout: Duration,
    pub who: String,
}

impl Shared {
    pub fn submit(&self, job: Job) {
        self.queue.lock().push_back(job);
        self.bell.ring();
    }

    pub fn poisoned(&self) -> Option<Error> {
        self.poison.lock().clone()
    }

    fn set_poison(&self, e: &Error) {
        let mut p = self.poison.lock();
        if p.is_none() {
            tracing::warn!("{}: {e}", self.who);
            *p = Some(e.clone());
        }
    }
}

/// The engine thread's body.
pub(crate) fn run(shared: Arc<Shared>, mut fabric: Fabric) {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| main_loop(&shared, &mut fabric)));
    if outcome.is_err() {
        shared.set_poison(&Error::Internal(format!("{}: the progress thread panicked", shared.who)));
    }
    // Whatever is left ends with the poison (or a shutdown notice).
    let err = shared.poisoned().unwrap_or_else(|| Error::InvalidUsage("communicator destroyed".into()));
    let left: Vec<Job> = shared.queue.lock().drain(..).collect();
    for job in left {
        job.done.finish(Err(err.clone()), job.keep);
    }
    if shared.poisoned().is_none() {
        // A clean shutdown: let the last bytes reach the peers.
        let end = Instant::now() + shared.timeout.min(Duration::from_secs(10));
        while !fabric.flushed() && Instant::now() < end {
            if fabric.progress().is_err() {
                break;
            }
            fabric.wait(Duration::from_millis(1));
        }
    }
    *shared.stats.lock() = fabric.stats();
}

fn main_loop(shared: &Shared, fabric: &mut Fabric) {
    loop {
        let job = shared.queue.lock().pop_front();
        let Some(mut job) = job else {
            if shared.shutdown.load(Ordering::Acquire) {
                return;
            }
            let seen = shared.bell.seq();
            if shared.queue.lock().is_empty() {
                // Idle: keep flushing. A peer that is gone by now (it may
                // have finished and exited cleanly) is not an error until a
                // call needs it; the bootstrap still reports deaths through
                // async_error.
                let _ = fabric.progress();
                fabric.wait_bell(seen, Duration::from_millis(if fabric.flushed() { 100 } else { 1 }));
            }
            continue;
        };
        let result = match shared.poisoned() {
            Some(e) => Err(e),
            None => run_job(shared, fabric, &mut job).map_err(|e| fabric.explain(e)),
        };
        if let Err(e) = &result
            && !matches!(e, Error::InvalidArgument(_) | Error::InvalidUsage(_))
        {
            shared.set_poison(e);
        }
        *shared.stats.lock() = fabric.stats();
        tracing::debug!("{} op #{} {}: {:?}", shared.who, job.seq, job.label, result.as_ref().map(|_| "done"));
        job.done.finish(result, job.keep.take());
    }
}

fn run_job(shared: &Shared, fabric: &mut Fabric, job: &mut Job) -> Result<()> {
    tracing::trace!("{} op #{} {}: start", shared.who, job.seq, job.label);
    for a in &job.pre {
        a.run()?;
    }
    for batch in &mut job.batches {
        let mut turns = Turns::book(batch);
        let mut last = Instant::now();
        loop {
            if shared.abort.load(Ordering::Acquire) {
                return Err(Error::Remote(format!("{} op #{} {}: aborted", shared.who, job.seq, job.label)));
            }
            let seen = shared.bell.seq();
            let mut moved = fabric.progress()?;
            moved |= exec::poll(fabric, batch, &mut turns)?;
            if exec::finished(batch) {
                break;
            }
            if moved {
                last = Instant::now();
                continue;
            }
            fabric.check()?;
            if last.elapsed() > shared.timeout {
                return Err(Error::Timeout(format!(
                    "{} op #{} {}: no progress for {:.0?} (OXCCL_TIMEOUT): {}",
                    shared.who,
                    job.seq,
                    job.label,
                    shared.timeout,
                    exec::waiting_for(batch)
                )));
            }
            fabric.wait_bell(seen, Duration::from_millis(20));
        }
    }
    for a in &job.post {
        a.run()?;
    }
    Ok(())
}
