//! The TCP bootstrap: rendezvous at rank 0, small all-gathers, and failure
//! propagation.
//!
//! [`Bootstrap::init`] connects the ranks of one communicator in a star:
//! rank 0 listens on the [`UniqueId`]'s address, every other rank connects
//! and says hello (magic, version, nonce, rank, nranks, host identity, pid).
//! Rank 0 drops connections that are not real ranks of this communicator
//! (wrong nonce, garbage, silence for 2 s, port scanners) and keeps waiting;
//! it refuses a hello with the wrong `nranks`, a rank out of range or a rank
//! already taken with a message the rank's init reports. When all `nranks`
//! ranks have arrived, rank 0 sends everyone the table of [`PeerInfo`].
//!
//! The star stays connected for the communicator's life. A monitor thread
//! per rank reads it: all-gather contributions and results, abort notices,
//! and goodbyes. When rank 0 sees a rank's connection end without a
//! goodbye it records "rank k died" and tells every other rank; when a rank
//! sees rank 0's connection end it records "rank 0 died". From then on
//! [`failure`](Bootstrap::failure) reports it, the
//! [`on_failure`](Bootstrap::on_failure) callbacks have run, and
//! [`all_gather`](Bootstrap::all_gather) / [`barrier`](Bootstrap::barrier)
//! fail at once. TCP keepalive (10 s idle, 3 probes 2 s apart) catches a
//! host that vanishes without closing its sockets.
//!
//! Dropping a `Bootstrap` (or [`close`](Bootstrap::close)) says goodbye
//! first, so a clean shutdown is never reported as a death.

mod frame;
mod monitor;
mod query;
mod rendezvous;
mod sealed;
mod sys;

use std::collections::HashMap;
use std::io::Write;
use std::net::{IpAddr, Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::id::UniqueId;
use crate::{Error, Result};
use frame::tag;
pub use query::RECORD;
use sealed::Writer;

/// Options of [`Bootstrap::init`].
#[derive(Clone, Debug)]
pub struct BootOptions {
    /// Deadline of every wait: the rendezvous, each all-gather, each
    /// write.
    pub timeout: Duration,
    /// Overrides this rank's host identity (normally hostname, boot id and
    /// network namespace). Ranks with equal identities are on one host (may
    /// share memory); tests use it to fake several hosts.
    pub host_id: Option<String>,
    /// Encrypt every frame after the proofs (`OXCCL_ENCRYPT=1`; every rank
    /// must agree, or init fails saying so).
    pub encrypt: bool,
}

impl Default for BootOptions {
    /// A 120 s timeout and the real host identity.
    fn default() -> BootOptions {
        BootOptions { timeout: Duration::from_secs(120), host_id: None, encrypt: false }
    }
}

/// What every rank learns about every other rank at init.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PeerInfo {
    /// The rank.
    pub rank: usize,
    /// Host identity: `hostname/boot_id/net:[inode]` (or
    /// [`BootOptions::host_id`]). Equal strings mean one host and one
    /// network namespace.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// The address this rank reached rank 0 from (its interface's IP); for
    /// rank 0, the address it was reached at.
    pub addr: IpAddr,
}

/// This rank's host identity: hostname, boot id and network namespace
/// inode, so two containers (namespaces) on one machine are two hosts.
pub fn host_identity() -> String {
    let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_string()).unwrap_or_default();
    let hostname = read("/proc/sys/kernel/hostname");
    let boot_id = read("/proc/sys/kernel/random/boot_id");
    let netns = std::fs::read_link("/proc/self/ns/net").map(|p| p.display().to_string()).unwrap_or_default();
    format!("{}/{}/{}", if hostname.is_empty() { "unknown-host" } else { &hostname }, boot_id, netns)
}

type Callback = Arc<dyn Fn() + Send + Sync>;

/// Mutable state shared with the monitor thread.
#[derive(Default)]
struct State {
    /// The first failure seen.
    failure: Option<Error>,
    /// Rank 0: contributions by sequence number, then rank.
    gathers: HashMap<u64, Vec<Option<Vec<u8>>>>,
    /// Other ranks: results by sequence number.
    results: HashMap<u64, Vec<Vec<u8>>>,
    /// Ranks that said goodbye (rank 0: any rank; others: index 0 only).
    gone: Vec<bool>,
    /// Ranks known to have closed their communicator (their goodbye, or
    /// rank 0's notice of it; every rank), with the number of collectives
    /// each had run by then and the order in which this rank heard of it.
    left: Vec<Option<(u64, usize)>>,
    /// How many closes this rank heard of.
    heard_left: usize,
    /// The last question this rank asked ([`Bootstrap::ask`]).
    next_query: u64,
    /// Answers by question.
    answers: HashMap<u64, Option<[u8; query::RECORD]>>,
}

/// What the API side and the monitor thread share.
struct Shared {
    rank: usize,
    nranks: usize,
    timeout: Duration,
    peers: Vec<PeerInfo>,
    /// Writing ends, by rank (rank 0: every other rank; others: only index
    /// 0). `None` for oneself.
    writers: Vec<Option<Mutex<Writer>>>,
    state: Mutex<State>,
    cond: Condvar,
    callbacks: Mutex<Vec<Callback>>,
    closed: AtomicBool,
    /// Whether any rank is in `State::left` (checked without the lock).
    any_left: AtomicBool,
    /// Whether `State::failure` is set (checked without the lock).
    failed: AtomicBool,
    /// Collectives this rank ran, said with its goodbye.
    done: AtomicU64,
    /// What this rank published ([`Bootstrap::publish`]).
    records: query::Records,
}

impl Shared {
    /// Records that `rank` closed its communicator after `done`
    /// collectives; rank 0 tells the others.
    fn note_left(&self, rank: usize, done: u64) {
        {
            let mut st = self.state.lock();
            let order = st.heard_left;
            if let Some(l) = st.left.get_mut(rank)
                && l.is_none()
            {
                *l = Some((done, order));
                st.heard_left += 1;
            }
            self.any_left.store(true, Ordering::Release);
            self.cond.notify_all();
        }
        if self.rank == 0 {
            let mut notice = (rank as u32).to_le_bytes().to_vec();
            notice.extend_from_slice(&done.to_le_bytes());
            let f = frame::frame(tag::LEFT, &notice);
            for k in (1..self.nranks).filter(|&k| k != rank) {
                if !self.state.lock().gone[k] {
                    let _ = self.send(k, &f);
                }
            }
        }
    }

    fn describe(&self, rank: usize) -> String {
        match self.peers.get(rank) {
            Some(p) => format!("rank {rank} (pid {} on {})", p.pid, p.host.split('/').next().unwrap_or("")),
            None => format!("rank {rank}"),
        }
    }

    /// Writes one frame to `rank` (whole, under that connection's lock).
    fn send(&self, rank: usize, bytes: &[u8]) -> std::io::Result<()> {
        match self.writers.get(rank).and_then(Option::as_ref) {
            Some(w) => w.lock().write_frame(bytes),
            None => Err(std::io::Error::new(std::io::ErrorKind::NotConnected, "no connection")),
        }
    }

    /// Records `err` if it is the first failure, wakes waiters and runs the
    /// callbacks. Returns whether it was the first.
    fn record_failure(&self, err: Error) -> bool {
        // The callbacks are snapshot under the state lock, which
        // `on_failure` also takes: each callback runs exactly once.
        let callbacks: Vec<Callback> = {
            let mut st = self.state.lock();
            if st.failure.is_some() {
                return false;
            }
            tracing::warn!(rank = self.rank, "bootstrap failure: {err}");
            st.failure = Some(err);
            self.failed.store(true, Ordering::Release);
            self.cond.notify_all();
            self.callbacks.lock().clone()
        };
        for cb in callbacks {
            cb();
        }
        true
    }

    /// Rank 0: tells every rank except `skip` about a failure.
    fn broadcast_failure(&self, msg: &str, skip: Option<usize>) {
        let f = frame::frame(tag::FAILURE, msg.as_bytes());
        for k in 1..self.nranks {
            if Some(k) != skip && !self.state.lock().gone[k] {
                // Best effort: a rank we cannot reach is found by its own EOF.
                let _ = self.send(k, &f);
            }
        }
    }

    /// The error an operation reports when the bootstrap is unusable.
    fn check(&self, what: &str) -> Result<()> {
        if let Some(e) = self.state.lock().failure.clone() {
            return Err(e);
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::InvalidUsage(format!("{what} on rank {}: the bootstrap is closed", self.rank)));
        }
        Ok(())
    }
}

/// One rank's bootstrap: the star of connections to rank 0 and its monitor
/// thread. `Send + Sync`; every method takes `&self`.
pub struct Bootstrap {
    shared: Arc<Shared>,
    local_ip: IpAddr,
    /// The communicator's secret (the id's), for the providers' proofs.
    secret: crate::auth::Secret,
    /// Serializes collective calls and numbers them.
    seq: Mutex<u64>,
    monitor: Mutex<Option<JoinHandle<()>>>,
    /// Writing this wakes the monitor for shutdown.
    wake: Option<UnixStream>,
}

impl std::fmt::Debug for Bootstrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bootstrap")
            .field("rank", &self.shared.rank)
            .field("nranks", &self.shared.nranks)
            .field("local_ip", &self.local_ip)
            .finish_non_exhaustive()
    }
}

impl Bootstrap {
    /// Joins the rendezvous of `id` as `rank` of `nranks` and returns once
    /// every rank has arrived (or fails at `opts.timeout`).
    ///
    /// Errors: `InvalidArgument` for a rank out of range, an `nranks`
    /// differing from rank 0's or a rank already taken (naming the values);
    /// `Timeout` when rank 0 is unreachable or not all ranks arrive in
    /// time; `Remote` when the listener at the id's address drops us (a
    /// stale or foreign id); `System` when rank 0 cannot listen.
    pub fn init(id: &UniqueId, nranks: usize, rank: usize, opts: &BootOptions) -> Result<Bootstrap> {
        if nranks == 0 || nranks > u32::MAX as usize {
            return Err(Error::invalid(format!("nranks is {nranks}: must be at least 1")));
        }
        if rank >= nranks {
            return Err(Error::invalid(format!("rank {rank} is out of range for nranks {nranks} (0..{nranks})")));
        }
        let host = opts.host_id.clone().unwrap_or_else(host_identity);
        let deadline = Instant::now() + opts.timeout;
        let (streams, peers, local_ip) = if rank == 0 {
            rendezvous::root(id, nranks, &host, opts, deadline)?
        } else {
            let (s, keys, peers, ip) = rendezvous::client(id, nranks, rank, &host, opts, deadline)?;
            (vec![Some((s, keys))], peers, ip)
        };
        let mut readers = Vec::new();
        let mut writers = Vec::new();
        for (k, s) in streams.into_iter().enumerate() {
            match s {
                Some((s, keys)) => {
                    tune(&s, opts.timeout);
                    let r = s.try_clone().map_err(|e| {
                        Error::System(format!("rank {rank}: cannot clone the bootstrap socket to rank {k}: {e}"))
                    })?;
                    let (seal, open) = keys.map(|k| (k.seal, k.open)).unzip();
                    readers.push((k, r, open));
                    writers.push(Some(Mutex::new(Writer { stream: s, seal })));
                }
                None => writers.push(None),
            }
        }
        let gone = vec![false; if rank == 0 { nranks } else { 1 }];
        let shared = Arc::new(Shared {
            rank,
            nranks,
            timeout: opts.timeout,
            peers,
            writers,
            state: Mutex::new(State { gone, left: vec![None; nranks], ..State::default() }),
            cond: Condvar::new(),
            callbacks: Mutex::new(Vec::new()),
            closed: AtomicBool::new(false),
            any_left: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            done: AtomicU64::new(0),
            records: query::Records::default(),
        });
        let mut boot = Bootstrap {
            shared: shared.clone(),
            local_ip,
            secret: id.secret(),
            seq: Mutex::new(0),
            monitor: Mutex::new(None),
            wake: None,
        };
        if !readers.is_empty() {
            let (wake_tx, wake_rx) = UnixStream::pair()
                .map_err(|e| Error::System(format!("rank {rank}: cannot create a wake pipe: {e}")))?;
            let handle = std::thread::Builder::new()
                .name(format!("oxccl-boot-{rank}"))
                .spawn(move || monitor::run(shared, readers, wake_rx))
                .map_err(|e| Error::System(format!("rank {rank}: cannot start the bootstrap monitor thread: {e}")))?;
            *boot.monitor.lock() = Some(handle);
            boot.wake = Some(wake_tx);
        }
        Ok(boot)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.shared.rank
    }

    /// The communicator's secret, which connections prove they know
    /// ([`crate::auth`]).
    pub fn secret(&self) -> crate::auth::Secret {
        self.secret
    }

    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.shared.nranks
    }

    /// Every rank's [`PeerInfo`], indexed by rank.
    pub fn peers(&self) -> &[PeerInfo] {
        &self.shared.peers
    }

    /// The IP this rank reaches rank 0 from (rank 0: the IP it was reached
    /// at): the interface to bind data listeners on.
    pub fn local_ip(&self) -> IpAddr {
        self.local_ip
    }

    /// The first failure seen (a rank died or aborted), without blocking.
    pub fn failure(&self) -> Option<Error> {
        if !self.shared.failed.load(Ordering::Acquire) {
            return None;
        }
        self.shared.state.lock().failure.clone()
    }

    /// Of the ranks known to have closed their communicator (said
    /// goodbye), the one that had run the fewest collectives (of those,
    /// the first heard of: ranks that close because it did come later):
    /// its description (`rank 3 (pid 123 on host)`) and that number;
    /// `None` while every rank is in (a lock-free check then).
    pub fn left(&self) -> Option<(usize, String, u64)> {
        if !self.shared.any_left.load(Ordering::Acquire) {
            return None;
        }
        let st = self.shared.state.lock();
        let (k, (done, _)) =
            st.left.iter().enumerate().filter_map(|(k, l)| l.map(|d| (k, d))).min_by_key(|&(_, d)| d)?;
        Some((k, self.shared.describe(k), done))
    }

    /// Sets the number of collectives this rank ran, which its goodbye
    /// tells the others (a peer that closes after its last collective
    /// does not fail the others' calls of that collective).
    pub fn set_collectives_done(&self, n: u64) {
        self.shared.done.store(n, Ordering::Release);
    }

    /// Registers a callback run exactly once when a failure is recorded,
    /// on the thread that records it (the monitor thread; the caller of
    /// [`abort`](Bootstrap::abort) for a local abort); run at once if a
    /// failure already was recorded. It must be quick and must not wait on
    /// this `Bootstrap`'s collectives: ring a doorbell.
    pub fn on_failure(&self, callback: Box<dyn Fn() + Send + Sync>) {
        let st = self.shared.state.lock();
        if st.failure.is_none() {
            self.shared.callbacks.lock().push(Arc::from(callback));
        } else {
            drop(st);
            callback();
        }
    }

    /// Gathers every rank's `mine` (up to 64 MiB) on every rank, in rank
    /// order. Collective: every rank calls it, in the same order with the
    /// other collectives. Fails at once when a failure is recorded, and
    /// with `Timeout` after the options' timeout.
    pub fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let sh = &*self.shared;
        if mine.len() > frame::MAX_CONTRIBUTION {
            return Err(Error::invalid(format!(
                "bootstrap all_gather on rank {}: contribution of {} bytes exceeds the {} byte limit; \
                 move bulk data over the data transports",
                sh.rank,
                mine.len(),
                frame::MAX_CONTRIBUTION
            )));
        }
        let mut seq_guard = self.seq.lock();
        let seq = *seq_guard;
        *seq_guard += 1;
        sh.check("all_gather")?;
        if sh.nranks == 1 {
            return Ok(vec![mine.to_vec()]);
        }
        let deadline = Instant::now() + sh.timeout;
        if sh.rank == 0 { self.gather_root(seq, mine, deadline) } else { self.gather_leaf(seq, mine, deadline) }
    }

    fn gather_root(&self, seq: u64, mine: &[u8], deadline: Instant) -> Result<Vec<Vec<u8>>> {
        let sh = &*self.shared;
        let n = sh.nranks;
        let parts = {
            let mut st = sh.state.lock();
            st.gathers.entry(seq).or_insert_with(|| vec![None; n])[0] = Some(mine.to_vec());
            loop {
                if let Some(e) = st.failure.clone() {
                    return Err(e);
                }
                let entry = &st.gathers[&seq];
                let missing: Vec<usize> = (0..n).filter(|&k| entry[k].is_none()).collect();
                if missing.is_empty() {
                    break;
                }
                if let Some(&k) = missing.iter().find(|&&k| st.gone[k]) {
                    return Err(Error::Remote(format!(
                        "all_gather #{seq}: {} closed its bootstrap (shut down cleanly) before contributing",
                        sh.describe(k)
                    )));
                }
                if self.closed() {
                    return Err(Error::InvalidUsage("all_gather on rank 0: the bootstrap was closed".into()));
                }
                if sh.cond.wait_until(&mut st, deadline).timed_out() {
                    return Err(Error::Timeout(format!(
                        "all_gather #{seq} on rank 0: ranks {missing:?} did not contribute within {:?}; \
                         every rank must make the same bootstrap calls in the same order",
                        sh.timeout
                    )));
                }
            }
            let entry = st.gathers.remove(&seq).unwrap_or_default();
            entry.into_iter().map(Option::unwrap_or_default).collect::<Vec<_>>()
        };
        let total: usize = parts.iter().map(|p| p.len() + 4).sum::<usize>() + 12;
        if total > frame::MAX_FRAME {
            let msg = format!(
                "rank 0 aborted: all_gather #{seq} result of {total} bytes exceeds the bootstrap frame limit {}",
                frame::MAX_FRAME
            );
            sh.record_failure(Error::Remote(msg.clone()));
            sh.broadcast_failure(&msg, None);
            return Err(Error::invalid(msg));
        }
        let f = frame::encode_result(seq, &parts);
        for k in 1..n {
            if let Err(e) = sh.send(k, &f) {
                sh.check("all_gather")?;
                return Err(Error::Remote(format!(
                    "all_gather #{seq}: cannot send the result to {}: {e}",
                    sh.describe(k)
                )));
            }
        }
        Ok(parts)
    }

    fn gather_leaf(&self, seq: u64, mine: &[u8], deadline: Instant) -> Result<Vec<Vec<u8>>> {
        let sh = &*self.shared;
        let mut e = frame::Enc::default();
        e.u64(seq).raw(mine);
        if let Err(err) = sh.send(0, &frame::frame(tag::GATHER, &e.0)) {
            sh.check("all_gather")?;
            return Err(Error::Remote(format!(
                "all_gather #{seq} on rank {}: cannot reach {}: {err}",
                sh.rank,
                sh.describe(0)
            )));
        }
        let mut st = sh.state.lock();
        loop {
            if let Some(parts) = st.results.remove(&seq) {
                return Ok(parts);
            }
            if let Some(e) = st.failure.clone() {
                return Err(e);
            }
            if st.gone[0] {
                return Err(Error::Remote(format!(
                    "all_gather #{seq} on rank {}: rank 0 closed the bootstrap (shut down cleanly) before answering",
                    sh.rank
                )));
            }
            if self.closed() {
                return Err(Error::InvalidUsage(format!("all_gather on rank {}: the bootstrap was closed", sh.rank)));
            }
            if sh.cond.wait_until(&mut st, deadline).timed_out() {
                return Err(Error::Timeout(format!(
                    "all_gather #{seq} on rank {}: no result from rank 0 within {:?}; some rank did not call it \
                     (every rank must make the same bootstrap calls in the same order)",
                    sh.rank, sh.timeout
                )));
            }
        }
    }

    /// Returns once every rank has called it (an empty all-gather).
    pub fn barrier(&self) -> Result<()> {
        self.all_gather(&[]).map(|_| ())
    }

    /// Tells every rank that this rank aborts: each records
    /// `Error::Remote("rank r aborted: reason")` (this rank too).
    pub fn abort(&self, reason: &str) {
        let sh = &*self.shared;
        let msg = format!("rank {} aborted: {reason}", sh.rank);
        // Tell first, then record (recording wakes this rank's calls, which
        // may end the process before the notice went out).
        if sh.rank == 0 {
            sh.broadcast_failure(&msg, None);
        } else {
            let _ = sh.send(0, &frame::frame(tag::ABORT, reason.as_bytes()));
        }
        sh.record_failure(Error::Remote(msg));
    }

    fn closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }

    /// Shuts down cleanly: says goodbye on every connection (so the others
    /// do not report this rank as dead), stops the monitor and closes the
    /// sockets. Idempotent; also done by `Drop`. Operations afterwards fail
    /// with `InvalidUsage`.
    pub fn close(&self) {
        let sh = &*self.shared;
        if sh.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let bye = frame::frame(tag::GOODBYE, &sh.done.load(Ordering::Acquire).to_le_bytes());
        for w in sh.writers.iter().flatten() {
            let mut w = w.lock();
            let _ = w.write_frame(&bye);
            let _ = w.stream.shutdown(Shutdown::Write);
        }
        sh.cond.notify_all();
        if let Some(w) = &self.wake {
            let _ = (&*w).write_all(&[1]);
        }
        if let Some(h) = self.monitor.lock().take()
            && h.thread().id() != std::thread::current().id()
        {
            let _ = h.join();
        }
    }
}

impl Drop for Bootstrap {
    fn drop(&mut self) {
        self.close();
    }
}

/// Socket options of an established bootstrap connection.
fn tune(s: &TcpStream, timeout: Duration) {
    let _ = s.set_nodelay(true);
    let _ = s.set_read_timeout(None);
    let _ = s.set_write_timeout(Some(timeout.max(Duration::from_millis(1))));
    let ka = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(10))
        .with_interval(Duration::from_secs(2))
        .with_retries(3);
    let _ = socket2::SockRef::from(s).set_tcp_keepalive(&ka);
}
