//! The fabric: one rank's connections to every peer, over the provider
//! each peer needs, and one-sided access to peers' registered memory.
//!
//! [`Fabric::new`] is collective over the bootstrap. It picks a provider
//! per peer from [`registry`], in order (the first whose factory reaches
//! the peer: same process → `mem`, same host → `shm`, else `tcp`;
//! `OXCCL_TRANSPORT` forces one), then sets every provider up the same way
//! on every rank (open, all-gather what each publishes, connect, barrier,
//! ready). Two-sided connections are made on first use, keyed by (peer,
//! channel). One-sided access goes to the provider's native path where it
//! has one for that peer, else through the control plane ([`crate::control`]).
//!
//! [`FabricOptions`] hold what every provider shares and each provider's
//! own typed settings ([`ShmOptions`], [`TcpOptions`], [`RdmaOptions`]);
//! [`registry`] hands each factory its part. Nothing here reads the
//! environment: oxccl's `Config` resolves the variables once and builds
//! these.
//!
//! Adding a provider: implement [`Factory`] and [`Provider`], give its
//! settings a field here and add the factory to [`registry`]; nothing here
//! matches on kinds.
#![allow(unsafe_code)]

use crate::bootstrap::Bootstrap;
use crate::control::Plane;
use crate::futex::Doorbell;
use crate::provider::{Factory, LinkCost, LinkParams, MemDesc, Pending, Provider, Setup};
use crate::region::Region;
use crate::wire::u64_at;
use crate::{CONTROL_CHANNEL, Channel, Kind, P2P_CHANNEL, PeerStats, Receiver, Sender};
use oxccl_core::{Error, Result};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use crate::CHANNELS;
pub use crate::rdma::RdmaOptions;
pub use crate::shm::ShmOptions;
pub use crate::tcp::TcpOptions;

/// Connection slots per peer: the collective channels and p2p (the
/// control plane holds its own ends).
const SLOTS: usize = CHANNELS + 1;

/// How long [`Fabric::explain`] waits, once a rank closed its
/// communicator, for news that another rank died (the likelier cause).
const LEFT_GRACE: Duration = Duration::from_millis(250);

/// How the fabric is built: what every provider shares, then each
/// provider's own settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FabricOptions {
    /// Force one provider between all ranks (also ranks of one process).
    pub transport: Option<Kind>,
    /// Bytes of each connection's FIFO (in-process, shared memory, RDMA
    /// rings; TCP has its own, [`TcpOptions::buffer`]).
    pub buffsize: usize,
    /// Deadline of set-up waits.
    pub timeout: Duration,
    /// Shared memory.
    pub shm: ShmOptions,
    /// TCP. `connect_timeout` is capped by `timeout`.
    pub tcp: TcpOptions,
    /// RDMA (the `OXCCL_IB_*` settings, the software HCA's, injected
    /// faults).
    pub rdma: RdmaOptions,
}

impl Default for FabricOptions {
    /// oxccl's defaults: FIFOs of 4 MiB, TCP's of 512 KiB (smaller chunks
    /// pipeline better through the kernel's socket buffers), 300 s.
    fn default() -> FabricOptions {
        FabricOptions {
            transport: None,
            buffsize: 4 << 20,
            timeout: Duration::from_secs(300),
            shm: ShmOptions::default(),
            tcp: TcpOptions { buffer: 512 << 10, ..TcpOptions::default() },
            rdma: RdmaOptions::default(),
        }
    }
}

/// The providers, in order of preference, each with its settings.
pub fn registry(opts: &FabricOptions) -> Vec<Box<dyn Factory>> {
    vec![
        Box::new(crate::mem::MemFactory),
        Box::new(crate::shm::ShmFactory { opts: opts.shm }),
        Box::new(crate::rdma::RdmaFactory { opts: opts.rdma.clone(), ifname: opts.tcp.ifname.clone() }),
        Box::new(crate::tcp::TcpFactory { opts: opts.tcp.clone() }),
    ]
}

/// One rank's connections.
pub struct Fabric {
    boot: Arc<Bootstrap>,
    rank: usize,
    providers: Vec<Box<dyn Provider>>,
    /// Per provider: its link parameters as every rank agreed them.
    links: Vec<LinkParams>,
    /// Per rank: the provider that carries traffic with it (this rank: the
    /// in-process one, for messages to itself).
    carrier: Vec<usize>,
    /// Per provider: whether it carries traffic with another rank.
    serving: Vec<bool>,
    /// Providers whose connections move bytes only when polled.
    polled: Vec<bool>,
    bell: Doorbell,
    senders: Table<dyn Sender>,
    receivers: Table<dyn Receiver>,
    plane: Plane,
    ops: HashMap<u64, OneSided>,
    next_op: u64,
    /// Per peer: one-sided bytes (put, got).
    one_sided: Vec<(u64, u64)>,
    last_check: Instant,
}

/// A one-sided operation in flight.
#[derive(Clone, Copy, Debug)]
struct OneSided {
    peer: usize,
    via: Via,
    bytes: u64,
    read: bool,
}

#[derive(Clone, Copy, Debug)]
enum Via {
    Done,
    Native(u64),
    Plane(u64),
}

/// A started one-sided operation: ask [`Fabric::test`] until it is done.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OpId(u64);

/// This rank's buffers registered for one call ([`Fabric::expose`]).
#[derive(Debug, Default)]
pub struct Exposure {
    emu: Vec<u64>,
    native: Vec<(usize, MemDesc)>,
}

/// One direction's connections, indexed by (peer, channel) without
/// hashing: the executor looks one up for every piece it moves.
struct Table<T: ?Sized> {
    slots: Vec<Option<(usize, Box<T>)>>,
    /// Indices of the slots in use, in the order they were made.
    live: Vec<usize>,
}

/// The table slot of (peer, ch); both already checked.
fn slot(peer: usize, ch: Channel) -> usize {
    peer * SLOTS
        + match ch {
            P2P_CHANNEL => CHANNELS,
            c => c as usize,
        }
}

impl<T: ?Sized> Table<T> {
    fn new(nranks: usize) -> Table<T> {
        Table { slots: (0..nranks * SLOTS).map(|_| None).collect(), live: Vec::new() }
    }

    fn get(&mut self, i: usize) -> &mut T {
        self.slots[i].as_mut().expect("made").1.as_mut()
    }

    fn insert(&mut self, i: usize, c: (usize, Box<T>)) {
        self.slots[i] = Some(c);
        self.live.push(i);
    }

    /// Every connection with its peer, provider and channel slot.
    fn iter(&self) -> impl Iterator<Item = (usize, usize, usize, &T)> {
        self.live.iter().map(|&i| {
            let (p, c) = self.slots[i].as_ref().expect("live");
            (i / SLOTS, i % SLOTS, *p, c.as_ref())
        })
    }

    /// Calls `f` on every connection of a polled provider.
    fn each_polled(&mut self, polled: &[bool], mut f: impl FnMut(&mut T) -> Result<bool>) -> Result<bool> {
        let mut any = false;
        for &i in &self.live {
            if let Some((p, c)) = &mut self.slots[i]
                && polled[*p]
            {
                any |= f(c.as_mut())?;
            }
        }
        Ok(any)
    }
}

/// The worse of two links (lower bandwidth, higher latency).
fn worst(a: LinkParams, b: LinkParams) -> LinkParams {
    let w = |x: LinkCost, y: LinkCost| LinkCost { bw: x.bw.min(y.bw), lat: x.lat.max(y.lat) };
    LinkParams { fifo: w(a.fifo, b.fifo), one_sided: w(a.one_sided, b.one_sided), native: a.native && b.native }
}

/// Every rank's link parameters per provider, all-gathered: each
/// provider's worst over the ranks it serves. Providers may measure their
/// links; the tuner must decide alike on every rank, so they agree first.
fn agree(boot: &Bootstrap, providers: &[Box<dyn Provider>], serving: &[bool]) -> Result<Vec<LinkParams>> {
    let mut mine = Vec::with_capacity(providers.len() * 41);
    for (p, &any) in providers.iter().zip(serving) {
        let l = p.link();
        mine.push(u8::from(any) | (u8::from(l.native) << 1));
        for v in [l.fifo.bw, l.fifo.lat, l.one_sided.bw, l.one_sided.lat, 0.0] {
            mine.extend_from_slice(&v.to_le_bytes());
        }
    }
    let all = boot.all_gather(&mine)?;
    let mut out: Vec<LinkParams> = providers.iter().map(|p| p.link()).collect();
    let mut seen = vec![false; providers.len()];
    for (r, b) in all.iter().enumerate() {
        if b.len() != mine.len() {
            return Err(Error::Remote(format!("rank {r} sent link parameters of {} bytes", b.len())));
        }
        for (i, rec) in b.chunks_exact(41).enumerate() {
            if rec[0] & 1 == 0 {
                continue;
            }
            let f = |k: usize| f64::from_bits(u64_at(rec, 1 + 8 * k));
            let l = LinkParams {
                fifo: LinkCost { bw: f(0), lat: f(1) },
                one_sided: LinkCost { bw: f(2), lat: f(3) },
                native: rec[0] & 2 != 0,
            };
            out[i] = if seen[i] { worst(out[i], l) } else { l };
            seen[i] = true;
        }
    }
    Ok(out)
}

impl Fabric {
    /// Sets up this rank's side; every rank of the bootstrap calls it.
    pub fn new(boot: Arc<Bootstrap>, nonce: [u8; 16], opts: &FabricOptions) -> Result<Fabric> {
        let (rank, n) = (boot.rank(), boot.nranks());
        let peers = boot.peers().to_vec();
        let me = &peers[rank];
        let factories = registry(opts);
        // Which providers each rank can use at all: a pair uses one only
        // where both can.
        let why_not: Vec<Option<String>> = factories.iter().map(|f| f.available().err()).collect();
        let mask: Vec<u8> = why_not.iter().map(|w| u8::from(w.is_none())).collect();
        let usable = boot.all_gather(&mask)?;
        let mut carrier = Vec::with_capacity(n);
        for (p, info) in peers.iter().enumerate() {
            let both = |i: usize| mask[i] == 1 && usable[p].get(i) == Some(&1);
            let first = |skip_forced: bool| {
                factories.iter().enumerate().position(|(i, f)| {
                    (skip_forced || opts.transport.is_none_or(|k| f.kind() == k)) && both(i) && f.reaches(me, info)
                })
            };
            let c = if p == rank {
                first(true)
            } else {
                match opts.transport {
                    Some(k) if !factories.iter().any(|f| f.kind() == k) => {
                        return Err(Error::invalid(format!("OXCCL_TRANSPORT={k}: no such provider in this build")));
                    }
                    Some(k) => Some(first(false).ok_or_else(|| {
                        let i = factories.iter().position(|f| f.kind() == k).expect("checked above");
                        let why = match (&why_not[i], usable[p].get(i)) {
                            (Some(w), _) => format!(": {k} is unavailable on rank {rank}: {w}"),
                            (None, Some(0)) => format!(": {k} is unavailable on rank {p}"),
                            _ => String::new(),
                        };
                        Error::InvalidUsage(format!(
                            "OXCCL_TRANSPORT={k}, but rank {p} on host {} cannot be reached with {k} from rank \
                             {rank} on host {}{why}",
                            info.host, me.host
                        ))
                    })?),
                    None => first(true),
                }
            };
            carrier.push(c.ok_or_else(|| Error::InvalidUsage(format!("no provider reaches rank {p}")))?);
        }
        let mut providers = Vec::with_capacity(factories.len());
        let (buffsize, timeout) = (opts.buffsize, opts.timeout);
        let serves: Vec<Vec<bool>> = (0..factories.len()).map(|i| carrier.iter().map(|&c| c == i).collect()).collect();
        for (i, f) in factories.iter().enumerate() {
            let setup = Setup { rank, peers: &peers, nonce, buffsize, timeout, serves: &serves[i], boot: &boot };
            providers.push(f.open(&setup)?);
        }
        let bell = providers.iter().find_map(|p| p.shared_bell()).unwrap_or_else(Doorbell::heap);
        for (i, p) in providers.iter_mut().enumerate() {
            let published = boot.all_gather(&p.publish())?;
            let setup = Setup { rank, peers: &peers, nonce, buffsize, timeout, serves: &serves[i], boot: &boot };
            p.connect(&setup, &published, &bell)?;
        }
        boot.barrier()?;
        for p in &mut providers {
            p.ready()?;
        }
        let serving: Vec<bool> = serves.iter().map(|s| s.iter().enumerate().any(|(r, &on)| on && r != rank)).collect();
        let links = agree(&boot, &providers, &serving)?;
        let polled = providers.iter().map(|p| p.needs_progress()).collect();
        Ok(Fabric {
            boot,
            rank,
            providers,
            links,
            carrier,
            serving,
            polled,
            bell,
            senders: Table::new(n),
            receivers: Table::new(n),
            plane: Plane::new(rank, n),
            ops: HashMap::new(),
            next_op: 1,
            one_sided: vec![(0, 0); n],
            last_check: Instant::now(),
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.carrier.len()
    }

    /// The provider that carries traffic with `peer` (`None` for this rank).
    pub fn kind_of(&self, peer: usize) -> Option<Kind> {
        (peer != self.rank).then(|| self.carrier.get(peer).map(|&c| self.providers[c].kind())).flatten()
    }

    /// How traffic to `peer` (`sending`) or from it on channel `ch`
    /// travels: the provider's kind, and its rail where it has several
    /// (`tcp over eth1, rail 2 of 2`), for messages.
    pub fn route(&self, peer: usize, ch: Channel, sending: bool) -> String {
        match self.carrier.get(peer).filter(|_| peer != self.rank) {
            None => "this rank".into(),
            Some(&c) => {
                let p = &self.providers[c];
                p.route(peer, ch, sending).unwrap_or_else(|| p.kind().to_string())
            }
        }
    }

    /// The link parameters to peers on this rank's host and on other
    /// hosts (the worst of the providers carrying them), for the tuner.
    pub fn links(&self) -> (Option<LinkParams>, Option<LinkParams>) {
        let peers = self.boot.peers();
        let me = &peers[self.rank].host;
        let (mut intra, mut inter): (Option<LinkParams>, Option<LinkParams>) = (None, None);
        for (p, &c) in self.carrier.iter().enumerate() {
            if p == self.rank {
                continue;
            }
            let l = self.links[c];
            let slot = if &peers[p].host == me { &mut intra } else { &mut inter };
            *slot = Some(slot.map_or(l, |s| worst(s, l)));
        }
        (intra, inter)
    }

    /// How many rails traffic to other hosts spreads over: the fewest of
    /// the providers carrying it (every rank counts the same: a provider
    /// uses as many rails as the rank with the fewest); 1 on one host.
    pub fn rails(&self) -> usize {
        let peers = self.boot.peers();
        let me = &peers[self.rank].host;
        let across = self.carrier.iter().enumerate().filter(|&(p, _)| p != self.rank && &peers[p].host != me);
        across.map(|(_, &c)| self.providers[c].rails()).min().unwrap_or(1).max(1)
    }

    /// The doorbell this rank's progress thread sleeps on; ring it to wake
    /// the thread (a new call was queued).
    pub fn bell(&self) -> Doorbell {
        self.bell.clone()
    }

    fn check_peer(&self, peer: usize, ch: Channel) -> Result<()> {
        if peer >= self.carrier.len() {
            return Err(Error::invalid(format!("rank {}: peer {peer} out of range", self.rank)));
        }
        if ch as usize >= CHANNELS && ch != P2P_CHANNEL {
            return Err(Error::invalid(format!(
                "rank {}: channel {ch} is beyond the {CHANNELS} channels a connection set has",
                self.rank
            )));
        }
        Ok(())
    }

    /// The sending end to `peer` on `ch`, made on first use.
    pub fn sender(&mut self, peer: usize, ch: Channel) -> Result<&mut dyn Sender> {
        self.check_peer(peer, ch)?;
        let i = slot(peer, ch);
        if self.senders.slots[i].is_none() {
            let c = self.carrier[peer];
            let s = self.providers[c].sender(peer, ch)?;
            self.senders.insert(i, (c, s));
        }
        Ok(self.senders.get(i))
    }

    /// The receiving end from `peer` on `ch`, made on first use.
    pub fn receiver(&mut self, peer: usize, ch: Channel) -> Result<&mut dyn Receiver> {
        self.check_peer(peer, ch)?;
        let i = slot(peer, ch);
        if self.receivers.slots[i].is_none() {
            let c = self.carrier[peer];
            let r = self.providers[c].receiver(peer, ch)?;
            self.receivers.insert(i, (c, r));
        }
        Ok(self.receivers.get(i))
    }

    /// Both ends a forwarding step needs: from `from` and to `to`, on `ch`.
    pub fn pair(&mut self, from: usize, to: usize, ch: Channel) -> Result<(&mut dyn Receiver, &mut dyn Sender)> {
        self.receiver(from, ch)?;
        self.sender(to, ch)?;
        let r = self.receivers.get(slot(from, ch));
        let s = self.senders.get(slot(to, ch));
        Ok((r, s))
    }

    /// Moves bytes on every connection that needs polling, accepts new
    /// ones, and serves and drains the control plane; true if anything
    /// moved.
    pub fn progress(&mut self) -> Result<bool> {
        let mut moved = false;
        for (p, polled) in self.providers.iter_mut().zip(&self.polled) {
            if *polled {
                moved |= p.progress()?;
            }
        }
        if self.polled.iter().any(|&p| p) {
            moved |= self.senders.each_polled(&self.polled, |s| s.progress())?;
            moved |= self.receivers.each_polled(&self.polled, |r| r.progress())?;
        }
        // Headers other providers held back for want of room (a 0-byte or
        // by-reference message behind a full FIFO) go out when room frees.
        moved |= self.flush_senders(false)?;
        moved |= self.plane.progress()?;
        Ok(moved)
    }

    /// Pushes out what this rank's senders and control links hold, and
    /// reads nothing: what a finished call does so that its last message
    /// leaves now (a full [`progress`](Fabric::progress) would also poll
    /// every receiving socket, system calls on the way of the next call).
    pub fn push(&mut self) -> Result<bool> {
        Ok(self.flush_senders(true)? | self.plane.flush_all()?)
    }

    /// Progresses the senders that hold unsent bytes: all of them, or
    /// (`all` false) those of providers that `progress` does not poll.
    fn flush_senders(&mut self, all: bool) -> Result<bool> {
        let mut moved = false;
        for &i in &self.senders.live {
            if let Some((p, s)) = &mut self.senders.slots[i]
                && (all || !self.polled[*p])
                && !s.flushed()
            {
                moved |= s.progress()?;
            }
        }
        Ok(moved)
    }

    /// Whether every committed byte has left this rank.
    pub fn flushed(&self) -> bool {
        self.senders.iter().all(|(_, _, _, s)| s.flushed()) && self.plane.flushed()
    }

    /// An error if a peer died or aborted.
    /// A cause of this rank's own (a rail down: a system error) comes
    /// before a peer's failure, which a peer that died of the same cause
    /// explains less well; a provider's news of a peer does not (the
    /// bootstrap's failure says why the peer left, when it said).
    pub fn check(&mut self) -> Result<()> {
        let failure = self.boot.failure();
        if failure.is_none() && self.last_check.elapsed() < Duration::from_millis(50) {
            return Ok(());
        }
        self.last_check = Instant::now();
        for p in &mut self.providers {
            match (p.check(failure.is_some()), &failure) {
                (Ok(()), _) => {}
                (Err(e @ Error::System(_)), _) | (Err(e), None) => return Err(e),
                (Err(_), Some(_)) => {}
            }
        }
        failure.map_or(Ok(()), Err)
    }

    /// Publishes `what` under `key` for peers to [`ask`](Fabric::ask) (the
    /// engine: each collective's call under its number).
    pub fn publish(&self, key: u64, what: &[u8]) {
        self.boot.publish(key, what);
    }

    /// What `peer` published under `key`, if it did and answers within
    /// `wait` (its monitor answers even while its calls block).
    pub fn ask(&self, peer: usize, key: u64, wait: Duration) -> Option<[u8; crate::bootstrap::RECORD]> {
        self.boot.ask(peer, key, wait)
    }

    /// A rank that closed its communicator (the one that ran the fewest
    /// collectives): (rank, in words, collectives it ran).
    pub fn left(&self) -> Option<(usize, String, u64)> {
        self.boot.left()
    }

    /// Tells every rank that this rank's call failed for `reason`, a
    /// failure only it can see (its call disagrees with a peer's): each
    /// records it and fails its own calls at once, naming this rank.
    pub fn fail_everywhere(&self, reason: &str) {
        self.boot.abort(reason);
    }

    /// The root cause behind a transport error: when a peer dies, its
    /// neighbours see broken connections (and may fail and close theirs,
    /// too) before the bootstrap reports who died; wait a moment for that
    /// report so every rank names the rank that died. Once it comes, a
    /// fault of this rank's own (a rail down here, even for less than its
    /// grace) comes first: the peer beyond it failed because of it.
    pub fn explain(&mut self, e: Error) -> Error {
        if !matches!(e, Error::Remote(_)) {
            return e;
        }
        let start = Instant::now();
        let end = start + Duration::from_secs(2);
        loop {
            if let Some(f) = self.boot.failure() {
                // A peer lost over a rail that is down here: the rail is
                // the cause.
                for p in &mut self.providers {
                    if let Err(local @ Error::System(_)) = p.check(true) {
                        return local;
                    }
                }
                return match f {
                    Error::Remote(m) if e.to_string().contains(&m) => e,
                    Error::Remote(m) => Error::Remote(format!("{m} (seen here as: {e})")),
                    other => other,
                };
            }
            // A rank that closed its communicator is no death to wait for;
            // but it may have closed because a peer died, and the news of
            // that death may come a moment after its goodbye: a death
            // seen within `LEFT_GRACE` is the cause named (above).
            if let Some((_, who, _)) = self.boot.left()
                && start.elapsed() >= LEFT_GRACE
            {
                return Error::Remote(format!("{who} closed its communicator (seen here as: {e})"));
            }
            if Instant::now() >= end {
                return e;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Sleeps until the doorbell moves past `seen`, a socket is ready, or
    /// `timeout` passes.
    pub fn wait_bell(&mut self, seen: u32, timeout: Duration) {
        let mut rings = false;
        let mut fds = Vec::new();
        for (p, _) in self.providers.iter().zip(&self.serving).filter(|(_, s)| **s) {
            let w = p.wake();
            rings |= w.rings_bell;
            fds.extend(w.fds);
        }
        if fds.is_empty() {
            self.bell.wait(seen, timeout);
            return;
        }
        // Sockets (and perhaps a doorbell): spin on the bell briefly, then
        // poll the sockets for a short while.
        if rings && (self.bell.wait(seen, Duration::from_micros(50)) || self.bell.seq() != seen) {
            return;
        }
        let mut pfds: Vec<libc::pollfd> =
            fds.into_iter().map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
        let ms = if rings { timeout.as_millis().clamp(0, 1) } else { timeout.as_millis().clamp(0, 20) } as i32;
        // SAFETY: pfds is a valid, exclusively borrowed array of pollfd for
        // the length passed; poll only writes revents.
        unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
    }

    /// Sleeps as [`wait_bell`](Fabric::wait_bell) from the bell's current value.
    pub fn wait(&mut self, timeout: Duration) {
        let seen = self.bell.seq();
        self.wait_bell(seen, timeout);
    }

    /// Payload bytes per peer and provider (control traffic not counted).
    pub fn stats(&self) -> Vec<PeerStats> {
        let mut by: BTreeMap<usize, PeerStats> = BTreeMap::new();
        let blank = |p: usize| PeerStats {
            peer: p,
            kind: Some(self.providers[self.carrier[p]].kind()),
            ..PeerStats::default()
        };
        for (p, _, _, s) in self.senders.iter() {
            by.entry(p).or_insert_with(|| blank(p)).sent += s.bytes();
        }
        for (p, _, _, r) in self.receivers.iter() {
            by.entry(p).or_insert_with(|| blank(p)).recv += r.bytes();
        }
        for (p, &(put, got)) in self.one_sided.iter().enumerate().filter(|(_, c)| c.0 + c.1 > 0) {
            let e = by.entry(p).or_insert_with(|| blank(p));
            e.put += put;
            e.got += got;
        }
        by.into_values().collect()
    }

    /// This rank closes its communicator: every provider says so where
    /// peers look when its process ends (after the last bytes left).
    pub fn closing(&mut self) {
        for p in &mut self.providers {
            p.closing();
        }
    }

    /// Shuts every provider's connections down (peers see them close).
    pub fn close(&mut self) {
        for p in &mut self.providers {
            p.close();
        }
    }

    // ---- one-sided access ----

    fn one_sided_peer(&self, peer: usize, what: &str) -> Result<usize> {
        if peer >= self.carrier.len() || peer == self.rank {
            return Err(Error::invalid(format!(
                "rank {}: {what}: peer {peer} is not another rank of {}",
                self.rank,
                self.carrier.len()
            )));
        }
        Ok(self.carrier[peer])
    }

    /// Makes sure the control link with `peer` exists.
    fn link(&mut self, peer: usize) -> Result<()> {
        if !self.plane.has_link(peer) {
            let c = self.one_sided_peer(peer, "one-sided access")?;
            let tx = self.providers[c].sender(peer, CONTROL_CHANNEL)?;
            let rx = self.providers[c].receiver(peer, CONTROL_CHANNEL)?;
            self.plane.add_link(peer, tx, rx);
        }
        Ok(())
    }

    /// Registers `regions` (this rank's buffers of one call) and sends
    /// their descriptors, tagged `tag` and `count` (the call's signature
    /// and count, for the peers to check), to every rank of `to` (those whose
    /// steps access them), in call order. Pass the result to [`unexpose`]
    /// when the call ends, whether it succeeded or not.
    ///
    /// [`unexpose`]: Fabric::unexpose
    pub fn expose(&mut self, regions: &[Region], to: &[usize], tag: u64, count: u64) -> Result<Exposure> {
        let mut e = Exposure::default();
        let r = self.expose_into(regions, to, (tag, count), &mut e);
        if r.is_err() {
            self.unexpose(std::mem::take(&mut e));
        }
        r.map(|()| e)
    }

    fn expose_into(
        &mut self,
        regions: &[Region],
        to: &[usize],
        (tag, count): (u64, u64),
        e: &mut Exposure,
    ) -> Result<()> {
        let emulated: Vec<MemDesc> = regions
            .iter()
            .map(|r| {
                let id = self.plane.register(*r);
                e.emu.push(id);
                MemDesc::emulated(self.rank, id, r.len(), r.writable())
            })
            .collect();
        // Native registrations, once per provider that serves a peer of `to`.
        let mut native: HashMap<usize, Vec<MemDesc>> = HashMap::new();
        for &q in to {
            let c = self.one_sided_peer(q, "exposing buffers")?;
            if native.contains_key(&c) {
                continue;
            }
            let Some(d) = self.providers[c].direct() else { continue };
            let mut descs = emulated.clone();
            for (desc, r) in descs.iter_mut().zip(regions) {
                d.register(r, desc)?;
                e.native.push((c, *desc));
            }
            native.insert(c, descs);
        }
        for &q in to {
            self.link(q)?;
            let descs = native.get(&self.carrier[q]).unwrap_or(&emulated);
            self.plane.expose(q, descs, tag, count)?;
        }
        Ok(())
    }

    /// Ends a call's registrations: afterwards no peer reads or writes them
    /// (a native copy in progress is waited for; emulated answers not yet
    /// sent fail).
    pub fn unexpose(&mut self, e: Exposure) {
        for id in e.emu {
            self.plane.unregister(id);
        }
        for (c, d) in e.native {
            if let Some(direct) = self.providers[c].direct() {
                direct.unregister(&d);
            }
        }
    }

    /// The next exposure `peer` sent this rank (its buffers' descriptors
    /// for the next call in which this rank accesses them, with the call's
    /// tag and count), if it arrived.
    pub fn exposed(&mut self, peer: usize) -> Result<Option<crate::control::Exposed>> {
        self.link(peer)?;
        self.plane.exposed(peer)
    }

    /// Signals `peer` on channel `ch` with tag `tag` (never blocks).
    pub fn signal(&mut self, peer: usize, ch: Channel, tag: u64) -> Result<()> {
        self.link(peer)?;
        self.plane.signal(peer, ch, tag)
    }

    /// Takes the next signal from `peer` on `ch`, if it arrived: its tag.
    pub fn take_signal(&mut self, peer: usize, ch: Channel) -> Result<Option<u64>> {
        self.link(peer)?;
        self.plane.take_signal(peer, ch)
    }

    /// Whether one-sided access to `peer` is native (single copy).
    pub fn native(&mut self, peer: usize, desc: &MemDesc) -> bool {
        let Ok(c) = self.one_sided_peer(peer, "") else { return false };
        let kind = self.providers[c].kind();
        desc.kind == Some(kind) && self.providers[c].direct().is_some_and(|d| d.reaches(peer))
    }

    fn start(&mut self, peer: usize, bytes: usize, read: bool, via: Via) -> OpId {
        let id = self.next_op;
        self.next_op += 1;
        self.ops.insert(id, OneSided { peer, via, bytes: bytes as u64, read });
        OpId(id)
    }

    /// Starts reading `dst.len()` bytes at `off` of `peer`'s memory `desc`
    /// into `dst`.
    pub fn read(&mut self, peer: usize, desc: &MemDesc, off: usize, dst: Region) -> Result<OpId> {
        desc.check(off, dst.len(), false, || format!("rank {}: a get from rank {peer}", self.rank))?;
        let via = if self.native(peer, desc) {
            let c = self.carrier[peer];
            match self.providers[c].direct().expect("native").read(peer, desc, off, &dst)? {
                Pending::Done => Via::Done,
                Pending::Ticket(t) => Via::Native(t),
            }
        } else {
            self.link(peer)?;
            Via::Plane(self.plane.read(peer, desc, off, dst)?)
        };
        Ok(self.start(peer, dst.len(), true, via))
    }

    /// Starts writing `src` into `peer`'s memory `desc` at `off`.
    pub fn write(&mut self, peer: usize, src: Region, desc: &MemDesc, off: usize) -> Result<OpId> {
        desc.check(off, src.len(), true, || format!("rank {}: a put into rank {peer}", self.rank))?;
        let via = if self.native(peer, desc) {
            let c = self.carrier[peer];
            match self.providers[c].direct().expect("native").write(peer, &src, desc, off)? {
                Pending::Done => Via::Done,
                Pending::Ticket(t) => Via::Native(t),
            }
        } else {
            self.link(peer)?;
            Via::Plane(self.plane.write(peer, src, desc, off)?)
        };
        Ok(self.start(peer, src.len(), false, via))
    }

    /// Whether `op` is complete (its data in place; a put visible at the
    /// peer). Completed operations are counted and forgotten.
    pub fn test(&mut self, op: OpId) -> Result<bool> {
        let o = *self.ops.get(&op.0).ok_or_else(|| Error::Internal(format!("unknown one-sided op {}", op.0)))?;
        let done = match o.via {
            Via::Done => true,
            Via::Native(t) => {
                let c = self.carrier[o.peer];
                self.providers[c].direct().expect("native").test(t)?
            }
            Via::Plane(id) => self.plane.test(id)?,
        };
        if done {
            self.ops.remove(&op.0);
            if let Via::Plane(id) = o.via {
                self.plane.forget(id);
            }
            let counts = &mut self.one_sided[o.peer];
            if o.read {
                counts.1 += o.bytes;
            } else {
                counts.0 += o.bytes;
            }
        }
        Ok(done)
    }

    /// Abandons `op` (its call failed): its destination or source is not
    /// touched afterwards.
    pub fn forget(&mut self, op: OpId) {
        match self.ops.remove(&op.0) {
            Some(OneSided { via: Via::Plane(id), .. }) => self.plane.forget(id),
            Some(OneSided { via: Via::Native(t), peer, .. }) => {
                let c = self.carrier[peer];
                if let Some(d) = self.providers[c].direct() {
                    d.forget(t);
                }
            }
            _ => {}
        }
    }

    /// Runs `f` on a view of `len` bytes at `off` of `peer`'s memory where
    /// the provider can give one (ranks of one process): a reduction reads
    /// them in place. `Ok(false)`: no view, read instead. Counted as got.
    pub fn with_view(
        &mut self,
        peer: usize,
        desc: &MemDesc,
        off: usize,
        len: usize,
        f: &mut dyn FnMut(&Region) -> Result<()>,
    ) -> Result<bool> {
        desc.check(off, len, false, || format!("rank {}: a get from rank {peer}", self.rank))?;
        if !self.native(peer, desc) {
            return Ok(false);
        }
        let c = self.carrier[peer];
        let viewed = self.providers[c].direct().expect("native").with_view(peer, desc, off, len, f)?;
        if viewed {
            self.one_sided[peer].1 += len as u64;
        }
        Ok(viewed)
    }
}
