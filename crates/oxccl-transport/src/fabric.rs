//! The fabric: one rank's connections to every peer, over the provider
//! each peer needs.
//!
//! [`Fabric::new`] is collective over the bootstrap: it decides per peer
//! (same process → [`mem`](crate::mem), same host → [`shm`](crate::shm),
//! else [`tcp`](crate::tcp); `OXCCL_TRANSPORT` forces one), creates and
//! exchanges shared segments (unlinked as soon as every peer mapped them)
//! and TCP listener addresses. Connections are then made on first use,
//! keyed by (peer, channel).
#![allow(unsafe_code)]

use crate::bootstrap::Bootstrap;
use crate::futex::Doorbell;
use crate::{Channel, Kind, P2P_CHANNEL, PeerStats, Receiver, Sender, mem, shm, tcp};
use oxccl_core::{Error, Result};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Collective channels a connection set supports (plus [`P2P_CHANNEL`]).
pub const CHANNELS: usize = 16;

/// How the fabric is built.
#[derive(Clone, Debug)]
pub struct FabricOptions {
    /// Force one provider between ranks of different processes.
    pub transport: Option<Kind>,
    /// Bytes of each connection's FIFO.
    pub buffsize: usize,
    /// Bytes of each TCP connection's FIFO.
    pub tcp_buffsize: usize,
    /// Sockets per TCP connection.
    pub nsocks: usize,
    /// Interface for TCP (NCCL's `NCCL_SOCKET_IFNAME` syntax).
    pub ifname: Option<String>,
    /// Deadline of setup waits.
    pub timeout: Duration,
}

/// One rank's connections.
pub struct Fabric {
    boot: Arc<Bootstrap>,
    rank: usize,
    kinds: Vec<Option<Kind>>,
    bell: Doorbell,
    hub: Option<Arc<mem::Hub>>,
    inbox: Option<shm::Inbox>,
    outboxes: HashMap<usize, shm::Outbox>,
    tcp: Option<tcp::Tcp>,
    senders: Table<dyn Sender>,
    receivers: Table<dyn Receiver>,
    watches: Vec<(usize, shm::PidWatch)>,
    layout: (usize, usize),
    buffsize: usize,
    last_check: Instant,
}

/// One direction's connections, indexed by (peer, channel) without
/// hashing: the executor looks one up for every piece it moves.
struct Table<T: ?Sized> {
    slots: Vec<Option<(Kind, Box<T>)>>,
    /// Indices of the slots in use, in the order they were made.
    live: Vec<usize>,
}

/// The table slot of (peer, ch); both already checked.
fn slot(peer: usize, ch: Channel) -> usize {
    peer * (CHANNELS + 1) + if ch == P2P_CHANNEL { CHANNELS } else { ch as usize }
}

impl<T: ?Sized> Table<T> {
    fn new(nranks: usize) -> Table<T> {
        Table { slots: (0..nranks * (CHANNELS + 1)).map(|_| None).collect(), live: Vec::new() }
    }

    fn get(&mut self, i: usize) -> &mut T {
        self.slots[i].as_mut().expect("made").1.as_mut()
    }

    fn insert(&mut self, i: usize, c: (Kind, Box<T>)) {
        self.slots[i] = Some(c);
        self.live.push(i);
    }

    /// Every connection, with its peer.
    fn iter(&self) -> impl Iterator<Item = (usize, Kind, &T)> {
        self.live.iter().map(|&i| {
            let (k, c) = self.slots[i].as_ref().expect("live");
            (i / (CHANNELS + 1), *k, c.as_ref())
        })
    }

    /// Calls `f` on every connection of kind `kind`; true if any call was.
    fn each_of_kind(&mut self, kind: Kind, mut f: impl FnMut(&mut T) -> Result<bool>) -> Result<bool> {
        let mut any = false;
        for &i in &self.live {
            if let Some((k, c)) = &mut self.slots[i]
                && *k == kind
            {
                any |= f(c.as_mut())?;
            }
        }
        Ok(any)
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Fabric {
    /// Sets up this rank's side; every rank of the bootstrap calls it.
    pub fn new(boot: Arc<Bootstrap>, nonce: [u8; 16], opts: &FabricOptions) -> Result<Fabric> {
        let (rank, n) = (boot.rank(), boot.nranks());
        let peers = boot.peers().to_vec();
        let me = &peers[rank];
        let forced = opts.transport;
        let mut kinds = Vec::with_capacity(n);
        for (p, info) in peers.iter().enumerate() {
            let same_host = info.host == me.host;
            let same_proc = same_host && info.pid == me.pid;
            let k = if p == rank {
                None
            } else {
                Some(match forced {
                    Some(Kind::Tcp) => Kind::Tcp,
                    Some(Kind::Shm) if same_host => Kind::Shm,
                    Some(Kind::Shm) => {
                        return Err(Error::InvalidUsage(format!(
                            "OXCCL_TRANSPORT=shm, but rank {p} is on another host ({}) than rank {rank} ({})",
                            info.host, me.host
                        )));
                    }
                    _ if same_proc => Kind::Mem,
                    _ if same_host => Kind::Shm,
                    _ => Kind::Tcp,
                })
            };
            kinds.push(k);
        }
        let any = |k: Kind| kinds.contains(&Some(k));
        let buffsize = opts.buffsize;

        // Shared memory: every rank creates its inbox if it has a local
        // peer; names travel through the bootstrap; once everyone has
        // mapped what they need, the names go.
        let my_name = if any(Kind::Shm) { format!("oxccl-{}-{rank}", hex(&nonce[..8])) } else { String::new() };
        let mut inbox = None;
        if !my_name.is_empty() {
            inbox = Some(shm::Inbox::create(&my_name, rank, n, CHANNELS, buffsize)?);
        }
        let names = boot.all_gather(my_name.as_bytes())?;
        let mut outboxes = HashMap::new();
        let mut watches = Vec::new();
        for (p, k) in kinds.iter().enumerate() {
            if *k == Some(Kind::Shm) {
                let name = String::from_utf8(names[p].clone())
                    .map_err(|_| Error::Remote(format!("rank {p} published a malformed segment name")))?;
                if name.is_empty() {
                    return Err(Error::Remote(format!("rank {p} did not create a shared segment for rank {rank}")));
                }
                outboxes.insert(p, shm::Outbox::open(&name, rank)?);
                watches.push((p, shm::PidWatch::new(peers[p].pid as i32)?));
            }
        }
        boot.barrier()?;
        if let Some(i) = &mut inbox {
            i.unlink()?;
        }

        // TCP: listeners' addresses travel through the bootstrap.
        let mut tcp = None;
        if any(Kind::Tcp) {
            let ip = match &opts.ifname {
                Some(name) => crate::id::interface_ip(Some(name))?,
                None => boot.local_ip(),
            };
            let topts = tcp::TcpOptions {
                streams: opts.nsocks,
                buffer: opts.tcp_buffsize,
                connect_timeout: opts.timeout.min(Duration::from_secs(30)),
                ..tcp::TcpOptions::default()
            };
            tcp = Some(tcp::Tcp::new(rank, n, nonce, ip, topts)?);
        }
        let addr = tcp.as_ref().map(|t| t.addr().to_string()).unwrap_or_default();
        let addrs = boot.all_gather(addr.as_bytes())?;
        if let Some(t) = &mut tcp {
            let mut list = Vec::with_capacity(n);
            for (p, a) in addrs.iter().enumerate() {
                let text = String::from_utf8_lossy(a).to_string();
                // Ranks without TCP peers publish nothing; nobody connects
                // to them over TCP, so any placeholder does.
                let sa = if text.is_empty() {
                    t.addr()
                } else {
                    text.parse().map_err(|_| Error::Remote(format!("rank {p} published a bad address {text:?}")))?
                };
                list.push(sa);
            }
            t.set_peer_addrs(list)?;
        }

        // The hub also carries a rank's messages to itself.
        let hub = Some(mem::Hub::get(u128::from_le_bytes(nonce), n)?);
        let bell = match (&inbox, &hub) {
            (Some(i), _) => i.doorbell(),
            (None, Some(h)) => h.doorbell(rank)?,
            _ => Doorbell::heap(),
        };
        let mut hosts: BTreeMap<&str, usize> = BTreeMap::new();
        for p in &peers {
            *hosts.entry(p.host.as_str()).or_default() += 1;
        }
        let per = *hosts.values().next().unwrap_or(&1);
        let layout = if hosts.values().all(|&c| c == per) { (hosts.len(), per) } else { (n, 1) };
        Ok(Fabric {
            boot,
            rank,
            kinds,
            bell,
            hub,
            inbox,
            outboxes,
            tcp,
            senders: Table::new(n),
            receivers: Table::new(n),
            watches,
            layout,
            buffsize,
            last_check: Instant::now(),
        })
    }

    /// The provider that carries traffic with `peer` (`None` for this rank).
    pub fn kind_of(&self, peer: usize) -> Option<Kind> {
        self.kinds.get(peer).copied().flatten()
    }

    /// (hosts, ranks per host), or (ranks, 1) when hosts hold different
    /// numbers of ranks.
    pub fn layout(&self) -> (usize, usize) {
        self.layout
    }

    /// The doorbell this rank's progress thread sleeps on; ring it to wake
    /// the thread (a new call was queued).
    pub fn bell(&self) -> Doorbell {
        self.bell.clone()
    }

    fn check_peer(&self, peer: usize, ch: Channel) -> Result<()> {
        if peer >= self.kinds.len() {
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

    fn connect_send(&mut self, peer: usize, ch: Channel) -> Result<(Kind, Box<dyn Sender>)> {
        self.check_peer(peer, ch)?;
        let kind = self.kinds[peer].unwrap_or(Kind::Mem);
        let s = match kind {
            Kind::Mem => self.hub.as_ref().expect("hub").sender(self.rank, peer, ch, self.buffsize)?,
            Kind::Shm => self.outboxes.get(&peer).expect("outbox").sender(ch)?,
            Kind::Tcp => self.tcp.as_ref().expect("tcp").sender(peer, ch)?,
        };
        Ok((kind, s))
    }

    fn connect_recv(&mut self, peer: usize, ch: Channel) -> Result<(Kind, Box<dyn Receiver>)> {
        self.check_peer(peer, ch)?;
        let kind = self.kinds[peer].unwrap_or(Kind::Mem);
        let r = match kind {
            Kind::Mem => self.hub.as_ref().expect("hub").receiver(peer, self.rank, ch, self.buffsize)?,
            Kind::Shm => {
                let bell = self.outboxes.get(&peer).expect("outbox").doorbell();
                self.inbox.as_ref().expect("inbox").receiver(peer, ch, bell)?
            }
            Kind::Tcp => self.tcp.as_ref().expect("tcp").receiver(peer, ch)?,
        };
        Ok((kind, r))
    }

    /// The sending end to `peer` on `ch`, made on first use.
    pub fn sender(&mut self, peer: usize, ch: Channel) -> Result<&mut dyn Sender> {
        self.check_peer(peer, ch)?;
        let i = slot(peer, ch);
        if self.senders.slots[i].is_none() {
            let c = self.connect_send(peer, ch)?;
            self.senders.insert(i, c);
        }
        Ok(self.senders.get(i))
    }

    /// The receiving end from `peer` on `ch`, made on first use.
    pub fn receiver(&mut self, peer: usize, ch: Channel) -> Result<&mut dyn Receiver> {
        self.check_peer(peer, ch)?;
        let i = slot(peer, ch);
        if self.receivers.slots[i].is_none() {
            let c = self.connect_recv(peer, ch)?;
            self.receivers.insert(i, c);
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

    /// Moves bytes on every connection and accepts new sockets; true if
    /// anything moved.
    pub fn progress(&mut self) -> Result<bool> {
        let mut moved = false;
        if let Some(t) = &mut self.tcp {
            moved |= t.progress()?;
            moved |= self.senders.each_of_kind(Kind::Tcp, |s| s.progress())?;
            moved |= self.receivers.each_of_kind(Kind::Tcp, |r| r.progress())?;
        }
        Ok(moved)
    }

    /// Whether every committed byte has left this rank.
    pub fn flushed(&self) -> bool {
        self.senders.iter().all(|(_, _, s)| s.flushed())
    }

    /// An error if a peer died or aborted.
    pub fn check(&mut self) -> Result<()> {
        if let Some(e) = self.boot.failure() {
            return Err(e);
        }
        if self.last_check.elapsed() < Duration::from_millis(50) {
            return Ok(());
        }
        self.last_check = Instant::now();
        for (p, w) in &self.watches {
            if w.exited() {
                return Err(Error::Remote(format!("rank {p} (on this host) exited")));
            }
        }
        Ok(())
    }

    /// The root cause behind a transport error: when a peer dies, its
    /// neighbours see broken connections (and may fail and close theirs,
    /// too) before the bootstrap reports who died; wait a moment for that
    /// report so every rank names the rank that died.
    pub fn explain(&self, e: Error) -> Error {
        if !matches!(e, Error::Remote(_)) {
            return e;
        }
        let end = Instant::now() + Duration::from_secs(2);
        loop {
            if let Some(f) = self.boot.failure() {
                return match f {
                    Error::Remote(m) if e.to_string().contains(&m) => e,
                    Error::Remote(m) => Error::Remote(format!("{m} (seen here as: {e})")),
                    other => other,
                };
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
        match &self.tcp {
            None if self.inbox.is_none() || self.kinds.iter().flatten().all(|k| *k == Kind::Shm) => {
                self.bell.wait(seen, timeout);
            }
            None => {
                self.bell.wait(seen, timeout.min(Duration::from_micros(200)));
            }
            Some(t) => {
                // Sockets and a doorbell: spin on the bell briefly, then
                // poll the sockets for a short while.
                if self.bell.wait(seen, Duration::from_micros(50)) || self.bell.seq() != seen {
                    return;
                }
                if self.bell.seq() != seen {
                    return;
                }
                let mut fds: Vec<libc::pollfd> =
                    t.poll_fds().into_iter().map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
                let ms = timeout.as_millis().clamp(0, 1) as i32;
                // SAFETY: fds is a valid, exclusively borrowed array of
                // pollfd for the length passed; poll only writes revents.
                unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
            }
        }
    }

    /// Sleeps as [`wait_bell`](Fabric::wait_bell) from the bell's current value.
    pub fn wait(&mut self, timeout: Duration) {
        let seen = self.bell.seq();
        self.wait_bell(seen, timeout);
    }

    /// Payload bytes per peer and provider.
    pub fn stats(&self) -> Vec<PeerStats> {
        let mut by: BTreeMap<usize, PeerStats> = BTreeMap::new();
        for (p, k, s) in self.senders.iter() {
            let e = by.entry(p).or_insert(PeerStats { peer: p, kind: Some(k), sent: 0, recv: 0 });
            e.sent += s.bytes();
        }
        for (p, k, r) in self.receivers.iter() {
            let e = by.entry(p).or_insert(PeerStats { peer: p, kind: Some(k), sent: 0, recv: 0 });
            e.recv += r.bytes();
        }
        by.into_values().collect()
    }
}
