//! [`Communicator`]: creation, collectives, teardown.

use crate::buf::Region;
use crate::call::Call;
use crate::config::{Config, Resolved, init_logging};
use crate::device::DeviceComm;
use crate::engine::{self, Locked, Shared};
use crate::exec::{Label, Task};
use crate::job::{Completion, Extras, Job};
use crate::plan::{self, Cache};
use crate::replay::Slot;
use crate::tuner::{AlgoFilter, ChannelChoice, Tuner};
use oxccl_algo::collective::CollKind;
use oxccl_algo::placement::Placement;
use oxccl_core::{DataType, Error, ReduceOp, Result};
use oxccl_transport::bootstrap::{BootOptions, Bootstrap};
use oxccl_transport::fabric::Fabric;
use oxccl_transport::futex::Doorbell;
use oxccl_transport::id::UniqueId;
use oxccl_transport::topo::Topology;
use oxccl_transport::{Kind, PeerStats};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;

/// A group of ranks that run collectives together.
///
/// Calls on one communicator run in the order they are made (a stream);
/// each is checked and planned on the calling thread (argument errors come
/// back at once and change nothing). A blocking call that finds nothing
/// queued ahead of it runs on the calling thread; otherwise, and for
/// `*_async` calls, the communicator's progress thread runs it.
/// `Communicator` is `Send + Sync`; calls from several threads are
/// serialized in the order they reach the queue, which must be the same on
/// every rank.
pub struct Communicator {
    inner: Arc<Inner>,
}

struct Inner {
    rank: usize,
    nranks: usize,
    id: UniqueId,
    boot: Arc<Bootstrap>,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    cfg: Resolved,
    config: Config,
    tuner: Tuner,
    cache: Cache,
    seq: AtomicU64,
    /// Collectives planned (every rank plans the same ones in the same
    /// order, unlike point-to-point operations): their signatures' number.
    coll_seq: AtomicU64,
    /// Shrinks after a failure made from this communicator (each names its
    /// new communicator's rendezvous).
    shrinks: AtomicU64,
    kinds: Vec<Option<Kind>>,
    /// The hosts and what is on them, as every rank agreed at init.
    topology: Topology,
    /// The device side, set up by the first call on device buffers.
    device: Mutex<Option<Arc<DeviceComm>>>,
}

/// Fails on every rank, naming one that differs, unless all ranks run the
/// deterministic mode or none does, and all use as many channels (they
/// would build different programs).
fn agree_on_mode(boot: &Bootstrap, rank: usize, on: bool, choice: ChannelChoice) -> Result<()> {
    let channels = choice.most;
    let mine = [u8::from(on), channels as u8, choice.lo as u8, u8::from(choice.fixed)];
    let all = boot.all_gather(&mine)?;
    if let Some(q) = all.iter().position(|v| v.first() != Some(&mine[0])) {
        return Err(Error::InvalidUsage(format!(
            "rank {rank} {} the deterministic mode ({}) but rank {q} {}: set OXCCL_DETERMINISTIC (or Config::deterministic) the same on every rank",
            if on { "runs" } else { "does not run" },
            crate::tuner::DETERMINISTIC,
            if on { "does not" } else { "does" },
        )));
    }
    match all.iter().position(|v| v.get(1..4) != Some(&mine[1..4])) {
        None => Ok(()),
        Some(q) => {
            let say = |v: &[u8]| match v {
                [_, most, _, 1] => format!("{most}"),
                [_, most, lo, _] => format!("{lo} to {most} (the tuner's choice)"),
                _ => "?".into(),
            };
            Err(Error::InvalidUsage(format!(
                "rank {rank} runs {} channels but rank {q} runs {}: set OXCCL_NCHANNELS (or Config::nchannels), \
                 OXCCL_MIN_NCHANNELS and OXCCL_MAX_NCHANNELS the same on every rank",
                say(&mine),
                say(&all[q])
            )))
        }
    }
}

impl Communicator {
    /// Joins communicator `id` as `rank` of `nranks` (NCCL's
    /// `ncclCommInitRank`): every rank calls it with the same id.
    pub fn init(id: &UniqueId, nranks: usize, rank: usize, config: Config) -> Result<Communicator> {
        init_logging();
        let cfg = config.resolve()?;
        if nranks == 0 || rank >= nranks {
            return Err(Error::invalid(format!("rank {rank} is out of range for {nranks} ranks")));
        }
        let filter = AlgoFilter::parse(cfg.algo.as_deref().unwrap_or(""), &cfg.programs)?.set_by(&cfg.algo_from);
        for &p in &cfg.programs {
            let c = crate::programs::get(p).program.collective;
            if c.nranks != nranks && cfg.algo.as_deref().is_some_and(|a| a.contains(&crate::programs::name(p))) {
                return Err(Error::InvalidUsage(format!(
                    "OXCCL_ALGO selects program {:?}, written for {} ranks; this communicator has {nranks}",
                    crate::programs::name(p),
                    c.nranks
                )));
            }
        }
        let boot = Arc::new(Bootstrap::init(
            id,
            nranks,
            rank,
            &BootOptions { timeout: cfg.timeout, host_id: None, encrypt: cfg.encrypt },
        )?);
        let fabric = Fabric::new(boot.clone(), id.nonce(), &cfg.fabric_options())?;
        // The fewest rails any rank has to other hosts: ranks reaching
        // them over different providers count differently.
        let rails = boot.all_gather(&[fabric.rails().min(255) as u8])?;
        let rails = rails.iter().filter_map(|v| v.first()).map(|&r| usize::from(r)).min().unwrap_or(1).max(1);
        let channels = cfg.nchannels.choice(rails);
        agree_on_mode(&boot, rank, cfg.deterministic, channels)?;
        let kinds: Vec<Option<Kind>> = (0..nranks).map(|p| fabric.kind_of(p)).collect();
        let fifo = if kinds.contains(&Some(Kind::Tcp)) { cfg.buffsize.min(cfg.tcp_buffsize) } else { cfg.buffsize };
        let tag: String = id.nonce()[..4].iter().map(|b| format!("{b:02x}")).collect();
        let who = format!("comm {tag} rank {rank}/{nranks}");
        let topology = crate::topology::agree(&boot, &cfg, &who)?;
        let placement = Placement::from_keys(&topology.host_of());
        let tuner = Tuner::new(placement, fabric.links(), filter, cfg.programs.clone(), fifo)?
            .deterministic(cfg.deterministic)?
            .channel_choice(channels);
        // Ranks of this communicator in this process (threads), this one
        // included: they share the programs they build.
        let me = &boot.peers()[rank];
        let process_ranks = boot.peers().iter().filter(|p| p.pid == me.pid && p.host == me.host).count();
        let host_ranks = boot.peers().iter().filter(|p| p.host == me.host).count();
        let cpus = std::thread::available_parallelism().ok();
        let hot_spin = engine::hot_spin((process_ranks, host_ranks), cpus, engine::online_cpus(), cfg.spin);
        let shared = Arc::new(Shared {
            queue: Mutex::new(Default::default()),
            queued: AtomicUsize::new(0),
            bell: fabric.bell(),
            state: Mutex::new(Locked { fabric, replay: Slot::default() }),
            kick: Doorbell::heap(),
            poison: Mutex::new(None),
            poisoned: AtomicBool::new(false),
            abort: Default::default(),
            shutdown: Default::default(),
            timeout: cfg.timeout,
            spin: cfg.spin,
            hot_spin,
            who: who.clone(),
            on_poison: Default::default(),
        });
        let bell = shared.bell.clone();
        boot.on_failure(Box::new(move || bell.ring()));
        let s2 = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("oxccl-r{rank}"))
            .spawn(move || engine::run(s2))
            .map_err(|e| Error::System(format!("{who}: cannot start the progress thread: {e}")))?;
        tracing::info!("{who}: ready ({:?})", kinds.iter().flatten().collect::<std::collections::BTreeSet<_>>());
        Ok(Communicator {
            inner: Arc::new(Inner {
                rank,
                nranks,
                id: *id,
                boot,
                shared,
                thread: Mutex::new(Some(thread)),
                cfg,
                config,
                tuner,
                cache: Cache::new(process_ranks > 1),
                seq: AtomicU64::new(0),
                coll_seq: AtomicU64::new(0),
                shrinks: AtomicU64::new(0),
                kinds,
                topology,
                device: Mutex::new(None),
            }),
        })
    }

    /// `n` ranks as threads of this process (NCCL's `ncclCommInitAll`),
    /// with the default configuration.
    pub fn init_threads(n: usize) -> Result<Vec<Communicator>> {
        Self::init_threads_with(n, Config::default())
    }

    /// [`init_threads`](Communicator::init_threads) with a configuration.
    pub fn init_threads_with(n: usize, config: Config) -> Result<Vec<Communicator>> {
        if n == 0 {
            return Err(Error::invalid("init_threads: at least one rank"));
        }
        let id = config.unique_id()?;
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let (id, config) = (id, config.clone());
                std::thread::spawn(move || Communicator::init(&id, n, r, config))
            })
            .collect();
        let mut out = Vec::with_capacity(n);
        for h in handles {
            out.push(h.join().map_err(|_| Error::Internal("init thread panicked".into()))?);
        }
        out.into_iter().collect()
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.inner.nranks
    }

    /// The id the communicator was created from.
    pub fn id(&self) -> &UniqueId {
        &self.inner.id
    }

    /// The hosts of this communicator and what is on them (NICs, RDMA
    /// ports, GPUs, NUMA nodes; where each rank runs), as every rank
    /// agreed at init: discovered, or read from `OXCCL_TOPO_FILE`.
    /// Algorithms follow its grouping of ranks into hosts.
    pub fn topology(&self) -> &Topology {
        &self.inner.topology
    }

    /// Which ranks share a host, as the algorithms see it.
    pub fn placement(&self) -> &Placement {
        self.inner.tuner.placement()
    }

    /// Which transport carries traffic with `peer` (`None` for this rank).
    pub fn transport_to(&self, peer: usize) -> Option<Kind> {
        self.inner.kinds.get(peer).copied().flatten()
    }

    /// The error that poisoned the communicator, if any (NCCL's
    /// `ncclCommGetAsyncError`): a dead peer, a timeout, an abort, a
    /// device kernel's failure.
    pub fn async_error(&self) -> Option<Error> {
        self.inner.shared.poisoned().or_else(|| self.device_error()).or_else(|| self.inner.boot.failure())
    }

    /// The error a device kernel recorded, which poisons the communicator.
    fn device_error(&self) -> Option<Error> {
        let dc = self.inner.device.lock().clone()?;
        let e = dc.failure()?;
        self.inner.shared.set_poison(&e);
        self.inner.shared.poisoned()
    }

    /// Bytes sent and received per peer and transport (waits for a call
    /// that is running to end).
    pub fn stats(&self) -> Vec<PeerStats> {
        self.inner.shared.state.lock().fabric.stats()
    }

    /// Stops everything now: pending and later calls fail, every other
    /// rank learns that this one aborted. The communicator cannot be used
    /// afterwards; drop it.
    pub fn abort(&self) {
        self.inner.abort();
    }

    /// A handle that aborts this communicator from elsewhere (a thread
    /// watching for Ctrl-C while a call blocks) without keeping it alive:
    /// once the communicator is dropped, its `abort` does nothing.
    pub fn aborter(&self) -> Aborter {
        Aborter(Arc::downgrade(&self.inner))
    }

    /// Stops this rank's use of the communicator without telling the
    /// others (they may still be finishing work on it): later calls fail
    /// with `why`.
    pub(crate) fn stop_locally(&self, why: &str) {
        let inner = &self.inner;
        inner.shared.set_poison(&Error::InvalidUsage(format!("rank {}: {why}", inner.rank)));
        inner.shared.abort.store(true, Ordering::Release);
        inner.stop();
    }

    pub(crate) fn usable(&self) -> Result<()> {
        match self.inner.shared.poisoned() {
            Some(e) => Err(e),
            None if self.inner.shared.shutdown.load(Ordering::Acquire) => {
                Err(Error::InvalidUsage(format!("rank {}: the communicator was aborted", self.inner.rank)))
            }
            None => Ok(()),
        }
    }

    pub(crate) fn next_seq(&self) -> u64 {
        self.inner.seq.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The last operation number handed out.
    pub(crate) fn last_seq(&self) -> u64 {
        self.inner.seq.load(Ordering::Relaxed)
    }

    /// What would run `kind` of `count` elements of `dtype` (rooted at
    /// `root`) on this communicator: the built-in algorithm or program
    /// `OXCCL_ALGO` forces or the tuner picks (the same on every rank).
    /// `OXCCL_DEBUG=INFO` logs the same choice when a call first runs it.
    pub fn choice(&self, kind: CollKind, count: usize, dtype: DataType, root: usize) -> Result<crate::tuner::Choice> {
        let coll = oxccl_algo::collective::Collective { kind, nranks: self.size(), count, root, dtype };
        crate::call::check_collective(&coll, ReduceOp::Sum, self.rank())?;
        let inner = &self.inner;
        Ok(inner.cache.part(&inner.tuner, &coll, inner.rank, None, &inner.shared.who)?.choice)
    }

    /// The cost model's prediction, in seconds, of `kind` of `count`
    /// elements of `dtype` with [`choice`](Communicator::choice)'s
    /// algorithm (`None` where there is no model for it).
    pub fn estimate(&self, kind: CollKind, count: usize, dtype: DataType, root: usize) -> Result<Option<f64>> {
        let choice = self.choice(kind, count, dtype, root)?;
        let coll = oxccl_algo::collective::Collective { kind, nranks: self.size(), count, root, dtype };
        Ok(self.inner.tuner.estimate(choice, &coll))
    }

    /// Plans a checked host call into a task.
    pub(crate) fn plan(&self, call: &Call<Region>, extras: &mut Extras) -> Result<Task> {
        self.admit(call)?;
        let inner = &self.inner;
        let coll = call.collective();
        let part = inner.cache.part(&inner.tuner, &coll, inner.rank, None, &inner.shared.who)?;
        let (seq, coll_seq) = self.number();
        plan::collective(&part, call, Label::new(call.kind.name(), seq), coll_seq, extras)
    }

    /// A collective's numbers: among the communicator's calls, and among
    /// its collectives (its signature's).
    pub(crate) fn number(&self) -> (u64, u64) {
        (self.next_seq(), self.inner.coll_seq.fetch_add(1, Ordering::Relaxed) + 1)
    }

    /// Whether the collective `call` may run now: the communicator is
    /// usable, no rank closed its communicator before it, and (with
    /// `OXCCL_CHECK`) every rank's arguments agree.
    pub(crate) fn admit(&self, call: &Call<Region>) -> Result<()> {
        self.usable()?;
        let inner = &self.inner;
        // A collective needs every rank: one that closed its communicator
        // before running it fails it at once.
        let next = inner.coll_seq.load(Ordering::Relaxed) + 1;
        if let Some((_, who, done)) = inner.boot.left()
            && done < next
        {
            return Err(Error::Remote(format!(
                "rank {}: {} (collective #{next}): {who} closed its communicator after collective #{done}; \
                 collectives need every rank",
                inner.rank,
                call.kind.name()
            )));
        }
        if inner.cfg.check {
            crate::check::compare(&inner.boot, &call.collective(), call.op)?;
        }
        Ok(())
    }

    /// Queues a job for the progress thread (async calls).
    pub(crate) fn submit(&self, job: Job) -> Arc<Completion> {
        let done = job.done.clone();
        self.inner.shared.submit(job);
        done
    }

    /// Runs a job to its end (blocking calls): on this thread when nothing
    /// is queued ahead of it.
    pub(crate) fn run(&self, job: Job) -> Result<()> {
        self.inner.shared.run(job)
    }

    /// The engine's shared state (device paths hook into poisoning).
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.inner.shared
    }

    /// The resolved configuration.
    pub(crate) fn resolved(&self) -> &Resolved {
        &self.inner.cfg
    }

    /// The tuner.
    pub(crate) fn tuner(&self) -> &Tuner {
        &self.inner.tuner
    }

    /// How many calls ran a kept job again ([`crate::replay`]).
    #[cfg(test)]
    pub(crate) fn replayed(&self) -> u64 {
        self.inner.shared.state.lock().replay.replayed
    }

    /// The device side's slot.
    pub(crate) fn device_slot(&self) -> &Mutex<Option<Arc<DeviceComm>>> {
        &self.inner.device
    }

    /// The configuration this communicator was made with.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The number of this communicator's next shrink after a failure.
    pub(crate) fn next_shrink(&self) -> u64 {
        self.inner.shrinks.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn boot(&self) -> &Arc<Bootstrap> {
        &self.inner.boot
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // The goodbye says how far this rank got: peers still finishing
        // those collectives are not failed by it.
        self.inner.boot.set_collectives_done(self.inner.coll_seq.load(Ordering::Relaxed));
        self.inner.stop();
    }
}

/// Aborts a communicator from another thread ([`Communicator::aborter`]).
#[derive(Clone)]
pub struct Aborter(Weak<Inner>);

impl Aborter {
    /// [`Communicator::abort`], if the communicator still exists.
    pub fn abort(&self) {
        if let Some(inner) = self.0.upgrade() {
            inner.abort();
        }
    }
}

impl std::fmt::Debug for Aborter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Aborter")
    }
}

impl Inner {
    fn abort(&self) {
        // Most aborts follow a failure: say which, so a rank that hears of
        // this abort before it hears of that failure (a peer's death
        // notice racing it) still names the cause.
        let why = match self.shared.poisoned() {
            Some(cause) => format!("the application called abort after: {cause}"),
            None => "the application called abort".to_string(),
        };
        let e = Error::Remote(format!("rank {} aborted the communicator", self.rank));
        self.shared.set_poison(&e);
        self.shared.abort.store(true, Ordering::Release);
        self.boot.abort(&why);
        self.stop();
    }

    fn stop(&self) {
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.kick.ring();
        self.shared.bell.ring();
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Communicator(rank {} of {})", self.rank(), self.size())
    }
}
