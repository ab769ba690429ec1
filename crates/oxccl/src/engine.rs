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
use crate::device::backend::Backend;
use crate::exec::{self, Label, Task, Turns};
use oxccl_core::{DataType, Error, Result, kernels};
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
    /// Waits until a device counter reaches `value` (staged device buffers).
    Await { dev: Arc<dyn Backend>, word: usize, value: u64 },
    /// Sets a device counter.
    Signal { dev: Arc<dyn Backend>, word: usize, value: u64 },
}

impl Action {
    fn run(&self, shared: &Shared) -> Result<()> {
        match self {
            Action::Await { dev, word, value } => await_word(shared, &**dev, *word, *value),
            Action::Signal { dev, word, value } => {
                dev.words().set(*word, *value);
                Ok(())
            }
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
    /// What the job is; its `seq` is the call's operation number.
    pub label: Label,
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
///
/// The fabric sits behind a mutex: the progress thread holds it while it
/// runs a job, and a blocking call that finds nothing queued runs its job
/// on the calling thread instead of handing it over ([`Shared::run`]),
/// which saves two thread wake-ups per call. Both take the fabric's lock
/// before the queue's.
pub(crate) struct Shared {
    pub queue: Mutex<VecDeque<Job>>,
    pub fabric: Mutex<Fabric>,
    /// The fabric's doorbell: peers ring it when data or room arrives.
    pub bell: Doorbell,
    /// Wakes the progress thread (a job queued, a shutdown).
    pub kick: Doorbell,
    pub poison: Mutex<Option<Error>>,
    pub abort: AtomicBool,
    pub shutdown: AtomicBool,
    pub timeout: Duration,
    /// How long a waiting rank polls before it sleeps.
    pub spin: Duration,
    pub who: String,
    /// Run once when the communicator is poisoned (device paths abort
    /// their kernels' waits).
    pub on_poison: Mutex<Vec<Box<dyn Fn() + Send + Sync>>>,
}

impl Shared {
    /// Queues a job for the progress thread.
    pub fn submit(&self, job: Job) {
        self.queue.lock().push_back(job);
        self.kick.ring();
    }

    /// Runs a job to its end: on the calling thread when nothing is queued
    /// ahead of it (calls stay in order), else through the queue.
    pub fn run(&self, mut job: Job) -> Result<()> {
        {
            let mut fabric = self.fabric.lock();
            if self.queue.lock().is_empty() && !self.shutdown.load(Ordering::Acquire) {
                let r = self.execute(&mut fabric, &mut job);
                if !fabric.flushed() {
                    // Bytes still queued in a transport: the progress
                    // thread pushes them out.
                    self.kick.ring();
                }
                return r;
            }
        }
        let done = job.done.clone();
        self.submit(job);
        done.wait().0
    }

    pub fn poisoned(&self) -> Option<Error> {
        self.poison.lock().clone()
    }

    pub(crate) fn set_poison(&self, e: &Error) {
        let mut p = self.poison.lock();
        if p.is_none() {
            tracing::warn!("{}: {e}", self.who);
            *p = Some(e.clone());
            drop(p);
            for hook in self.on_poison.lock().iter() {
                hook();
            }
        }
    }

    /// Runs one job (or fails it at once if the communicator is poisoned);
    /// a failure other than bad arguments poisons the communicator.
    fn execute(&self, fabric: &mut Fabric, job: &mut Job) -> Result<()> {
        let result = match self.poisoned() {
            Some(e) => Err(e),
            None => run_job(self, fabric, job).map_err(|e| fabric.explain(e)),
        };
        if let Err(e) = &result
            && !matches!(e, Error::InvalidArgument(_) | Error::InvalidUsage(_))
        {
            self.set_poison(e);
        }
        tracing::debug!("{} op #{} {}: {:?}", self.who, job.label.seq, job.label, result.as_ref().map(|_| "done"));
        result
    }
}

/// The engine thread's body.
pub(crate) fn run(shared: Arc<Shared>) {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| main_loop(&shared)));
    if outcome.is_err() {
        shared.set_poison(&Error::Internal(format!("{}: the progress thread panicked", shared.who)));
    }
    // Whatever is left ends with the poison (or a shutdown notice).
    let err = shared.poisoned().unwrap_or_else(|| Error::InvalidUsage("communicator destroyed".into()));
    let left: Vec<Job> = shared.queue.lock().drain(..).collect();
    for job in left {
        job.done.finish(Err(err.clone()), job.keep);
    }
    let mut fabric = shared.fabric.lock();
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
}

fn main_loop(shared: &Shared) {
    loop {
        let seen = shared.kick.seq();
        let mut fabric = shared.fabric.lock();
        let job = shared.queue.lock().pop_front();
        if let Some(mut job) = job {
            let result = shared.execute(&mut fabric, &mut job);
            drop(fabric);
            job.done.finish(result, job.keep.take());
            continue;
        }
        if shared.shutdown.load(Ordering::Acquire) {
            return;
        }
        // Idle: keep flushing. A peer that is gone by now (it may have
        // finished and exited cleanly) is not an error until a call needs
        // it; the bootstrap still reports deaths through async_error.
        let _ = fabric.progress();
        let flushed = fabric.flushed();
        drop(fabric);
        // Sleep on the kick, not on the fabric's doorbell: peers ring that
        // for whichever thread runs a job, and waking this one for nothing
        // would take a core from it.
        shared.kick.wait(seen, if flushed { Duration::from_millis(100) } else { Duration::from_micros(200) });
    }
}

fn run_job(shared: &Shared, fabric: &mut Fabric, job: &mut Job) -> Result<()> {
    tracing::trace!("{} op #{} {}: start", shared.who, job.label.seq, job.label);
    for a in &job.pre {
        a.run(shared)?;
    }
    for batch in &mut job.batches {
        let mut turns = Turns::book(batch);
        // When the lane last stopped moving (None: it is moving).
        let mut idle_since: Option<Instant> = None;
        loop {
            if shared.abort.load(Ordering::Acquire) {
                return Err(Error::Remote(format!("{} op #{} {}: aborted", shared.who, job.label.seq, job.label)));
            }
            let seen = shared.bell.seq();
            let mut moved = fabric.progress()?;
            moved |= exec::poll(fabric, batch, &mut turns)?;
            if exec::finished(batch) {
                break;
            }
            if moved {
                idle_since = None;
                continue;
            }
            // Nothing moved: poll again at once for a moment, then yield
            // the core to whoever is runnable (on a full machine, likely
            // the peer this rank waits for), and after `spin` sleep until
            // a peer rings. The first phase is timed, not counted: a poll
            // over sockets costs syscalls, one over shared memory does not.
            let Some(since) = idle_since else {
                idle_since = Some(Instant::now());
                continue;
            };
            let idle = since.elapsed();
            if idle < HOT_SPIN {
                std::hint::spin_loop();
                continue;
            }
            fabric.check()?;
            if idle > shared.timeout {
                return Err(Error::Timeout(format!(
                    "{} op #{} {}: no progress for {:.0?} (OXCCL_TIMEOUT): {}",
                    shared.who,
                    job.label.seq,
                    job.label,
                    shared.timeout,
                    exec::waiting_for(batch)
                )));
            }
            if idle < shared.spin {
                std::thread::yield_now();
            } else {
                fabric.wait_bell(seen, Duration::from_millis(20));
            }
        }
    }
    for a in &job.post {
        a.run(shared)?;
    }
    Ok(())
}

/// Waits until the device's counter `word` reaches `value`: polls for a
/// moment, then naps; gives up on an abort, a kernel's error or the timeout.
fn await_word(shared: &Shared, dev: &dyn Backend, word: usize, value: u64) -> Result<()> {
    let words = dev.words();
    let start = Instant::now();
    while words.get(word) < value {
        if shared.abort.load(Ordering::Acquire) {
            return Err(Error::Remote(format!("{}: aborted while waiting for the device", shared.who)));
        }
        let status = words.status();
        if status != 0 {
            return Err(crate::device::status_error(&shared.who, status));
        }
        let idle = start.elapsed();
        if idle > shared.timeout {
            return Err(Error::Timeout(format!(
                "{}: the device did not stage its input within {:.0?} (OXCCL_TIMEOUT): counter {word} is {}, \
                 waiting for {value}",
                shared.who,
                shared.timeout,
                words.get(word)
            )));
        }
        if idle < shared.spin {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
    Ok(())
}

/// How long a waiting rank polls without yielding its core.
const HOT_SPIN: Duration = Duration::from_micros(3);
