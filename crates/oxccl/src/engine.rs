//! The progress engine: one thread per communicator that runs submitted
//! jobs in order (a stream), drives the fabric, and enforces deadlines.
//!
//! The API thread plans a call into a [`Job`] (tasks with raw buffer
//! views, actions before and after) and queues it; the engine runs jobs
//! one after another, so calls complete in the order they were made, as
//! on a CUDA stream. A failure (a dead peer, a timeout, an abort) poisons
//! the communicator: the failing job and every later one end with the
//! error, which [`Shared::poison`] keeps for `async_error`.

use crate::exec;
use crate::job::{Action, Counters, Job};
use crate::replay::Slot;
use oxccl_core::{Error, Result};
use oxccl_transport::fabric::Fabric;
use oxccl_transport::futex::Doorbell;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// What the engine's lock guards: the fabric, and the jobs of the last
/// small calls ([`crate::replay`]), which run again under the same lock
/// (one lock per replayed call).
pub(crate) struct Locked {
    pub fabric: Fabric,
    pub replay: Slot,
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
    /// Jobs in the queue (a blocking call looks here, not in the queue,
    /// whether one is ahead of it: no lock on the way of a small call).
    pub queued: AtomicUsize,
    pub state: Mutex<Locked>,
    /// The fabric's doorbell: peers ring it when data or room arrives.
    pub bell: Doorbell,
    /// Wakes the progress thread (a job queued, a shutdown).
    pub kick: Doorbell,
    pub poison: Mutex<Option<Error>>,
    /// Whether `poison` holds an error (read without its lock).
    pub poisoned: AtomicBool,
    pub abort: AtomicBool,
    pub shutdown: AtomicBool,
    pub timeout: Duration,
    /// How long a waiting rank polls before it sleeps.
    pub spin: Duration,
    /// How long it polls before it starts yielding its core ([`hot_spin`]).
    pub hot_spin: Duration,
    pub who: String,
    /// Run once when the communicator is poisoned (device paths abort
    /// their kernels' waits).
    pub on_poison: Mutex<Vec<Box<dyn Fn() + Send + Sync>>>,
}

impl Shared {
    /// Queues a job for the progress thread; after shutdown it ends at
    /// once with the reason (nobody would run it).
    pub fn submit(&self, mut job: Job) {
        {
            let mut q = self.queue.lock();
            if !self.shutdown.load(Ordering::Acquire) {
                q.push_back(job);
                self.queued.store(q.len(), Ordering::Release);
                drop(q);
                self.kick.ring();
                return;
            }
        }
        let e = self
            .poisoned()
            .unwrap_or_else(|| Error::InvalidUsage(format!("{}: the communicator was destroyed", self.who)));
        job.done.finish(Err(e), job.keep.take());
    }

    /// Runs a job to its end: on the calling thread when nothing is queued
    /// ahead of it (calls stay in order), else through the queue.
    pub fn run(&self, mut job: Job) -> Result<()> {
        if let Some(r) = self.run_here(&mut job) {
            return r;
        }
        let done = job.done.clone();
        self.submit(job);
        done.wait().0
    }

    /// Runs a job to its end on the calling thread if nothing is queued
    /// ahead of it; `None` (and the job untouched) otherwise. The result
    /// goes straight back to the caller: nobody waits on the job's
    /// completion, and the job may run again ([`crate::replay`]).
    pub fn run_here(&self, job: &mut Job) -> Option<Result<()>> {
        self.run_locked(&mut self.state.lock().fabric, job)
    }

    /// [`run_here`](Shared::run_here) for a caller that holds the lock.
    pub fn run_locked(&self, fabric: &mut Fabric, job: &mut Job) -> Option<Result<()>> {
        if self.queued.load(Ordering::Acquire) != 0 || self.shutdown.load(Ordering::Acquire) {
            return None;
        }
        let r = self.execute(fabric, job);
        job.settled = true;
        if !fabric.flushed() {
            // Bytes still queued in a transport: the progress thread
            // pushes them out.
            self.kick.ring();
        }
        Some(r)
    }

    pub fn poisoned(&self) -> Option<Error> {
        if !self.poisoned.load(Ordering::Acquire) {
            return None;
        }
        self.poison.lock().clone()
    }

    pub(crate) fn set_poison(&self, e: &Error) {
        let mut p = self.poison.lock();
        if p.is_none() {
            self.poisoned.store(true, Ordering::Release);
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
            None => run_job(self, fabric, job).map_err(|e| {
                // Misuse seen only mid-call (the ranks' calls disagree:
                // signature, length): the peers cannot know; tell them,
                // unless a peer's failure already explains it (what is left
                // of a call it abandoned).
                if let Error::InvalidUsage(m) = &e {
                    if let Err(Error::Remote(cause)) = fabric.check() {
                        return Error::Remote(format!("{cause} (seen here as: {m})"));
                    }
                    fabric.fail_everywhere(m);
                }
                fabric.explain(e)
            }),
        };
        // A call fails here only after it started moving bytes (its
        // arguments were checked when it was planned): whatever the error,
        // its connections may be out of step, so it poisons.
        if let Err(e) = &result {
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
    let left: Vec<Job> = {
        let mut q = shared.queue.lock();
        shared.shutdown.store(true, Ordering::Release);
        shared.queued.store(0, Ordering::Release);
        q.drain(..).collect()
    };
    for mut job in left {
        job.done.finish(Err(err.clone()), job.keep.take());
    }
    let mut st = shared.state.lock();
    let fabric = &mut st.fabric;
    // Let the last bytes of finished calls reach the peers (a failed
    // call's were abandoned when it ended): a peer may still be in a call
    // this rank finished before its own next call failed. Briefly when
    // poisoned: a peer may be gone.
    let wait = if shared.poisoned().is_none() { Duration::from_secs(10) } else { Duration::from_secs(1) };
    let end = Instant::now() + shared.timeout.min(wait);
    while !fabric.flushed() && Instant::now() < end {
        if fabric.progress().is_err() {
            break;
        }
        fabric.wait(Duration::from_millis(1));
    }
    fabric.closing();
}

fn main_loop(shared: &Shared) {
    loop {
        let seen = shared.kick.seq();
        let mut st = shared.state.lock();
        let job = {
            let mut q = shared.queue.lock();
            let job = q.pop_front();
            shared.queued.store(q.len(), Ordering::Release);
            job
        };
        if let Some(mut job) = job {
            let result = shared.execute(&mut st.fabric, &mut job);
            drop(st);
            job.done.finish(result, job.keep.take());
            continue;
        }
        if shared.shutdown.load(Ordering::Acquire) {
            return;
        }
        // Idle: keep flushing. A peer that is gone by now (it may have
        // finished and exited cleanly) is not an error until a call needs
        // it; the bootstrap still reports deaths through async_error. A
        // poisoned communicator still pushes out what its finished calls
        // sent (a failed call's sends were abandoned). Bytes that cannot
        // leave (a connection failed) are tried again at the slow pace.
        let flushed = st.fabric.progress().is_err() || st.fabric.flushed();
        drop(st);
        // Sleep on the kick, not on the fabric's doorbell: peers ring that
        // for whichever thread runs a job, and waking this one for nothing
        // would take a core from it.
        shared.kick.wait(seen, if flushed { Duration::from_millis(100) } else { Duration::from_micros(200) });
    }
}

fn run_action(shared: &Shared, a: &Action) -> Result<()> {
    match a {
        Action::Await { dev, word, value } => await_word(shared, &**dev, *word, *value),
        other => other.run_local(),
    }
}

fn run_job(shared: &Shared, fabric: &mut Fabric, job: &mut Job) -> Result<()> {
    tracing::trace!("{} op #{} {}: start", shared.who, job.label.seq, job.label);
    for a in &job.pre {
        run_action(shared, a)?;
    }
    for batch in &mut job.batches {
        let r = run_batch(shared, fabric, &job.label, batch);
        exec::release(fabric, batch);
        r?;
    }
    for a in &job.post {
        run_action(shared, a)?;
    }
    Ok(())
}

/// Idle polls between two reads of the clock while a call waits.
const CLOCK_EVERY: u32 = 16;

/// How long a call waits with nothing moving before it asks the peers it
/// waits on whether they run the same call ([`exec::probe`]).
const PROBE: Duration = Duration::from_secs(1);

/// Runs the tasks of one batch to their end.
fn run_batch(shared: &Shared, fabric: &mut Fabric, label: &exec::Label, batch: &mut [exec::Task]) -> Result<()> {
    let mut turns = exec::Turns::book(batch);
    // When the lane last stopped moving (None: it is moving).
    let mut idle_since: Option<Instant> = None;
    // The doorbell's value read before the last poll, once the rank is
    // about to sleep (not while it spins: peers ring that word on every
    // message, and reading it in a tight loop would fight them for it).
    let mut seen: Option<u32> = None;
    // Whether the peers were asked for their calls in this wait.
    let mut probed = false;
    // Idle polls so far, and whether the last look at the clock found the
    // call still in its first, hot phase of waiting.
    let (mut spins, mut hot) = (0u32, true);
    loop {
        if shared.abort.load(Ordering::Acquire) {
            return Err(Error::Remote(format!("{} op #{} {label}: aborted", shared.who, label.seq)));
        }
        // The lanes first, then the fabric: a call's first sends go out
        // before its receiving sockets are polled (system calls that
        // would only delay them).
        let mut moved = exec::poll(fabric, batch, &mut turns)?;
        if !exec::finished(batch) {
            moved |= fabric.progress()?;
            moved |= exec::poll(fabric, batch, &mut turns)?;
        }
        if exec::finished(batch) {
            // What the last steps committed goes out now: a peer waits for
            // it, and left to the progress thread it would wait for that
            // thread's wake-up (over TCP, the rank that finished first left
            // its last message in its FIFO on almost every small call:
            // 28 µs per 2-rank 8-byte all_reduce). Its errors stick to the
            // connection and fail the next call that uses it. Only pushed:
            // polling the receiving sockets here would cost system calls
            // on the way of the next call.
            let _ = fabric.push();
            return Ok(());
        }
        if moved {
            idle_since = None;
            seen = None;
            probed = false;
            hot = true;
            continue;
        }
        // Nothing moved: poll again at once for a moment, then yield the
        // core to whoever is runnable (on a full machine, likely the peer
        // this rank waits for), and after `spin` sleep until a peer rings.
        // The first phase is timed, not counted: a poll over sockets costs
        // syscalls, one over shared memory does not. In it the clock is
        // read once every few polls: a poll over shared memory costs less
        // than reading it, and every poll saved brings the reaction to the
        // next arrival closer.
        spins = spins.wrapping_add(1);
        if hot && idle_since.is_some() && !spins.is_multiple_of(CLOCK_EVERY) {
            std::hint::spin_loop();
            continue;
        }
        let Some(since) = idle_since else {
            idle_since = Some(Instant::now());
            continue;
        };
        let idle = since.elapsed();
        hot = idle < shared.hot_spin;
        if hot {
            std::hint::spin_loop();
            continue;
        }
        fabric.check()?;
        if let Some(e) = closed_before(fabric, batch) {
            return Err(e);
        }
        if !probed && idle > PROBE.min(shared.timeout / 2) {
            probed = true;
            exec::probe(fabric, batch)?;
        }
        if idle > shared.timeout {
            return Err(Error::Timeout(format!(
                "{} op #{} {label}: no progress for {:.0?} (OXCCL_TIMEOUT): {}",
                shared.who,
                label.seq,
                shared.timeout,
                exec::waiting_for(fabric, batch)
            )));
        }
        if idle < shared.spin {
            std::thread::yield_now();
        } else {
            match seen {
                // Read the bell, then poll once more before sleeping on it:
                // a ring after the read wakes the sleep at once.
                None => seen = Some(shared.bell.seq()),
                Some(s) => {
                    fabric.wait_bell(s, Duration::from_millis(20));
                    seen = None;
                }
            }
        }
    }
}

/// A collective of `batch` that a rank which closed its communicator
/// never ran (it closed after an earlier one, and its goodbye came while
/// this call waited): it cannot finish.
fn closed_before(fabric: &Fabric, batch: &[exec::Task]) -> Option<Error> {
    let (_, who, done) = fabric.left()?;
    // Collective numbers in signatures are modulo 2^24.
    const MOD: u64 = 1 << 24;
    let n = batch.iter().filter_map(|t| t.sig).map(|s| s.number()).find(|&n| {
        let ahead = n.wrapping_sub(done) % MOD;
        (1..MOD / 2).contains(&ahead)
    })?;
    Some(Error::Remote(format!(
        "{who} closed its communicator after collective #{done}; this call runs collective #{n}, which needs every rank"
    )))
}

/// Waits until the device's counter `word` reaches `value`: polls for a
/// moment, then naps; gives up on an abort, a device's error or the timeout.
fn await_word(shared: &Shared, words: &dyn Counters, word: usize, value: u64) -> Result<()> {
    let start = Instant::now();
    while words.get(word) < value {
        if shared.abort.load(Ordering::Acquire) {
            return Err(Error::Remote(format!("{}: aborted while waiting for the device", shared.who)));
        }
        if let Some(e) = words.failure() {
            return Err(e);
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

/// How long a waiting rank polls without yielding its core, unless it has
/// a CPU to itself ([`hot_spin`]).
const HOT_SPIN: Duration = Duration::from_micros(3);

/// The host's online CPUs (`/sys/devices/system/cpu/online`, ranges like
/// `0-3,8-11`); `None` where it cannot be read.
pub(crate) fn online_cpus() -> Option<usize> {
    cpu_list_len(std::fs::read_to_string("/sys/devices/system/cpu/online").ok()?.trim())
}

/// How many CPUs a kernel CPU list (`0-3,8,10-11`) names.
fn cpu_list_len(list: &str) -> Option<usize> {
    let mut n = 0;
    for part in list.split(',').filter(|p| !p.is_empty()) {
        n += match part.split_once('-') {
            Some((a, b)) => b.parse::<usize>().ok()?.checked_sub(a.parse::<usize>().ok()?)? + 1,
            None => part.parse::<usize>().map(|_| 1).ok()?,
        };
    }
    (n > 0).then_some(n)
}

/// How long a waiting rank polls before it yields its core:
/// - all of `spin` when it is the only rank of its process and bound to
///   one CPU (oxccl-run, mpirun and srun bind ranks so): its peers run on
///   other CPUs, and a yield would hand the core to whatever else is
///   runnable there (a busy process) for a whole time slice, on every call
///   (a 2-rank 8-byte all_reduce beside one busy process took 6–600 µs per
///   call, Open MPI's 0.2–2.5);
/// - nothing when its ranks outnumber the CPUs it may run on (`cpus`):
///   ranks of this process (threads), or, when this rank is not bound
///   (it may run on every one of the host's `online` CPUs), this host's
///   ranks. The rank it waits for is likely waiting for this core, and
///   every poll delays it (4 ranks on 2 CPUs: a 64-byte all_reduce took
///   10–23 µs per call polling [`HOT_SPIN`] first, 5–12 yielding at once;
///   Open MPI yields at once when oversubscribed). A rank bound to a few
///   CPUs of a host with more ranks than those CPUs (a core and its
///   hyperthread per rank) is not oversubscribed: its peers run elsewhere;
/// - else [`HOT_SPIN`]: the rank it waits for may need this core.
pub(crate) fn hot_spin(
    (process_ranks, host_ranks): (usize, usize),
    cpus: Option<std::num::NonZeroUsize>,
    online: Option<usize>,
    spin: Duration,
) -> Duration {
    match cpus.map(std::num::NonZeroUsize::get) {
        Some(1) if process_ranks == 1 => spin.max(HOT_SPIN),
        Some(n) if process_ranks > n => Duration::ZERO,
        Some(n) if online == Some(n) && host_ranks > n => Duration::ZERO,
        _ => HOT_SPIN,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroUsize;

    #[test]
    fn cpu_lists_are_counted() {
        assert_eq!(cpu_list_len("0-1"), Some(2));
        assert_eq!(cpu_list_len("0-3,8,10-11"), Some(7));
        assert_eq!(cpu_list_len("5"), Some(1));
        assert_eq!(cpu_list_len(""), None);
        assert_eq!(cpu_list_len("3-1"), None);
        assert_eq!(cpu_list_len("x"), None);
    }

    #[test]
    fn only_a_rank_alone_on_its_cpu_polls_without_yielding() {
        let (one, two) = (NonZeroUsize::new(1), NonZeroUsize::new(2));
        let spin = Duration::from_millis(2);
        let host = Some(2);
        assert_eq!(hot_spin((1, 4), one, host, spin), spin, "bound, alone in its process: polls all of spin");
        assert_eq!(hot_spin((2, 2), one, host, spin), Duration::ZERO, "threads on one CPU need each other's turns");
        assert_eq!(hot_spin((1, 2), two, host, spin), HOT_SPIN, "not bound: a peer may share the core");
        assert_eq!(hot_spin((1, 4), two, host, spin), Duration::ZERO, "4 ranks on a host of 2 CPUs: yield at once");
        assert_eq!(hot_spin((4, 4), two, host, spin), Duration::ZERO, "4 ranks as threads on 2 CPUs");
        assert_eq!(hot_spin((1, 8), two, Some(16), spin), HOT_SPIN, "bound to 2 of 16 CPUs: the peers run elsewhere");
        assert_eq!(hot_spin((1, 4), None, host, spin), HOT_SPIN, "unknown CPUs");
        assert_eq!(hot_spin((1, 1), one, Some(1), Duration::ZERO), HOT_SPIN, "OXCCL_SPIN_US=0 still polls a moment");
    }
}
