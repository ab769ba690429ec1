//! The RDMA provider as the fabric sees it: one HCA port per rank, a side
//! channel listener whose address travels through the bootstrap with the
//! port's LID and GID, data connections set up lazily (at the sender's
//! first use), and native one-sided access by RDMA READ and WRITE into
//! registered user buffers.

use super::conn::{Link, RdmaReceiver, WakeSet};
use super::direct::DirectState;
use super::env::{IbOptions, IbProvider, choose_gid};
use super::setup::{self, Accepted, Card, Conn, Endpoint, Faults, Local};
use super::soft::{SoftDevice, SoftOptions};
use super::verbs::{AsyncEvent, Device, GidEntry, LinkLayer, PortInfo, PortState};
use crate::bootstrap::PeerInfo;
use crate::futex::Doorbell;
use crate::provider::{Direct, Factory, LinkCost, LinkParams, Provider, Setup, Wake, rail_between};
use crate::rail::RailWatch;
use crate::{Channel, Error, Kind, Piece, Receiver, Result, Sender};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

/// The HCAs libibverbs gives this process, opened once (as NCCL does) and
/// kept; `Err` says why there are none (logged once, at INFO).
fn ibv_devices(opts: &IbOptions) -> std::result::Result<Vec<Arc<dyn Device>>, String> {
    static IBV: OnceLock<std::result::Result<Vec<Arc<dyn Device>>, String>> = OnceLock::new();
    IBV.get_or_init(|| {
        let r = super::ibv::open(opts).map_err(|u| u.to_string());
        match &r {
            Ok(_) => tracing::info!("RDMA available (libibverbs)"),
            Err(why) => tracing::info!("RDMA unavailable, using TCP between hosts: {why}"),
        }
        r
    })
    .clone()
}

/// Whether RDMA can be used here: `Err` says why not.
fn availability(opts: &IbOptions) -> std::result::Result<(), String> {
    if opts.disable {
        return Err("OXCCL_IB_DISABLE is set".into());
    }
    match opts.provider {
        IbProvider::Soft => Ok(()),
        IbProvider::Ibv => ibv_devices(opts).map(|_| ()),
    }
}

/// The first active port the filter admits, and its GID.
fn pick_port(dev: &Arc<dyn Device>, opts: &IbOptions) -> Result<(PortInfo, GidEntry)> {
    let ports = dev.ports()?;
    let port =
        ports.into_iter().find(|p| p.state == PortState::Active && opts.hca.matches(dev.name(), p.num)).ok_or_else(
            || Error::Unavailable(format!("RDMA device {} has no active port OXCCL_IB_HCA admits", dev.name())),
        )?;
    let gid = choose_gid(dev.name(), &port, opts.gid_index)?;
    Ok((port, gid))
}

/// Settings of the RDMA provider.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RdmaOptions {
    /// The `OXCCL_IB_*` settings (NCCL's `NCCL_IB_*` meanings).
    pub ib: IbOptions,
    /// The software HCA's bug-finding options (`OXCCL_IB_SOFT_*`).
    pub soft: SoftOptions,
    /// Faults to inject (`OXCCL_IB_INJECT`; tests only).
    pub faults: Faults,
}

impl RdmaOptions {
    /// Every RDMA variable read through `get` (a name → its value; unset
    /// and blank values take the defaults); an error names the variable,
    /// its value and what it accepts.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<RdmaOptions> {
        Ok(RdmaOptions {
            ib: IbOptions::from_lookup(&get)?,
            soft: SoftOptions::from_lookup(&get)?,
            faults: Faults::parse(get("OXCCL_IB_INJECT").as_deref())?,
        })
    }
}

/// Makes [`RdmaProvider`]s.
pub struct RdmaFactory {
    /// The provider's settings.
    pub opts: RdmaOptions,
    /// `OXCCL_SOCKET_IFNAME`: the software HCA opens a device over every
    /// interface it selects (a rail each); without it, one over the
    /// bootstrap's address.
    pub ifname: Option<String>,
}

/// One rail before its side channel: an HCA port (or a software HCA over
/// an interface) and a name for messages.
struct RailPort {
    dev: Arc<dyn Device>,
    port: PortInfo,
    gid: GidEntry,
    /// Where its side channel listens.
    side_ip: Ipv4Addr,
    /// The interface it runs over (the software HCA), to watch.
    ifname: Option<String>,
    /// How messages name it.
    label: String,
}

impl RdmaFactory {
    /// Every rail of this rank: each interface `ifname` selects with a
    /// software HCA over it, or every active port `OXCCL_IB_HCA` admits of
    /// every device libibverbs lists (of the first one's link layer).
    fn rail_ports(&self, rank: usize, boot: Ipv4Addr) -> Result<Vec<RailPort>> {
        let opts = &self.opts.ib;
        let mut out = Vec::new();
        match opts.provider {
            IbProvider::Soft => {
                let ifs = match &self.ifname {
                    Some(spec) => crate::id::interface_ips(Some(spec))?
                        .into_iter()
                        .filter_map(|(n, ip)| match ip {
                            IpAddr::V4(v) => Some((Some(n), v)),
                            IpAddr::V6(_) => None,
                        })
                        .collect(),
                    None => vec![(None, boot)],
                };
                for (ifname, ip) in ifs {
                    let dev: Arc<dyn Device> = SoftDevice::open(ip, self.opts.soft)?;
                    let (port, gid) = pick_port(&dev, opts)?;
                    let label = match &ifname {
                        Some(n) => format!("soft HCA over {n}"),
                        None => format!("soft HCA on {ip}"),
                    };
                    out.push(RailPort { dev, port, gid, side_ip: ip, ifname, label });
                }
            }
            IbProvider::Ibv => {
                let devs = ibv_devices(opts).map_err(|u| Error::Unavailable(format!("rank {rank}: RDMA: {u}")))?;
                let mut why = Vec::new();
                for dev in devs {
                    for port in dev.ports()? {
                        if port.state != PortState::Active || !opts.hca.matches(dev.name(), port.num) {
                            continue;
                        }
                        match choose_gid(dev.name(), &port, opts.gid_index) {
                            Ok(gid) => {
                                let label = format!("{} port {}", dev.name(), port.num);
                                out.push(RailPort { dev: dev.clone(), port, gid, side_ip: boot, ifname: None, label });
                            }
                            Err(e) => why.push(e.to_string()),
                        }
                    }
                }
                if out.is_empty() {
                    return Err(Error::Unavailable(format!(
                        "rank {rank}: no active RDMA port OXCCL_IB_HCA admits{}",
                        if why.is_empty() { String::new() } else { format!(" ({})", why.join("; ")) }
                    )));
                }
                let ll = out[0].port.link_layer;
                let skipped: Vec<String> =
                    out.iter().filter(|r| r.port.link_layer != ll).map(|r| r.label.clone()).collect();
                if !skipped.is_empty() {
                    tracing::info!(
                        rank,
                        "RDMA: {} left out: not {ll} like {} (choose ports with OXCCL_IB_HCA)",
                        skipped.join(", "),
                        out[0].label
                    );
                    out.retain(|r| r.port.link_layer == ll);
                }
            }
        }
        Ok(out)
    }
}

impl Factory for RdmaFactory {
    fn kind(&self) -> Kind {
        Kind::Rdma
    }
    fn available(&self) -> std::result::Result<(), String> {
        availability(&self.opts.ib)
    }
    fn reaches(&self, _me: &PeerInfo, _peer: &PeerInfo) -> bool {
        // Whether both ends have RDMA is the fabric's check (available);
        // shared memory and threads come first in the table.
        true
    }
    fn open(&self, setup: &Setup<'_>) -> Result<Box<dyn Provider>> {
        if !setup.serves_any() {
            return Ok(Box::new(RdmaProvider {
                rank: setup.rank,
                rails: Vec::new(),
                locals: Vec::new(),
                watch: None,
                direct: None,
                sticky: None,
            }));
        }
        let opts = self.opts.ib.clone();
        let boot = match setup.boot.local_ip() {
            IpAddr::V4(v) => v,
            IpAddr::V6(_) => Ipv4Addr::LOCALHOST,
        };
        let faults = self.opts.faults;
        let cap = setup.buffsize.next_power_of_two().max(64 << 10);
        let chunk = opts.chunk.next_power_of_two().min(cap / 2);
        let mut rails = Vec::new();
        let mut ifnames = Vec::new();
        for r in self.rail_ports(setup.rank, boot)? {
            let ip = r.side_ip;
            let listener = TcpListener::bind(SocketAddr::new(IpAddr::V4(ip), 0)).map_err(|e| {
                Error::System(format!("rank {}: RDMA side channel: cannot listen on {ip}: {e}", setup.rank))
            })?;
            listener.set_nonblocking(true).map_err(|e| Error::System(format!("RDMA side channel: {e}")))?;
            tracing::info!(
                rank = setup.rank,
                "RDMA rail {}: {} ({}), GID index {}",
                rails.len() + 1,
                r.label,
                r.port.link_layer,
                r.gid.index
            );
            let local = Local {
                rank: setup.rank,
                dev: r.dev,
                port: r.port,
                gid: r.gid,
                opts: opts.clone(),
                secret: setup.boot.secret(),
                cap,
                chunk,
                timeout: setup.timeout,
                faults,
            };
            let ep = Arc::new(Endpoint { local, cards: OnceLock::new() });
            ifnames.push(r.ifname.unwrap_or_default());
            rails.push(Arc::new(Inner {
                ep,
                label: r.label,
                side: listener.local_addr().map_err(|e| Error::System(e.to_string()))?,
                listener: Mutex::new(Some(listener)),
                accepted: Mutex::new(HashMap::new()),
                one_sided_in: Mutex::new(Vec::new()),
                wake: Arc::new(WakeSet::default()),
                closed: AtomicBool::new(false),
                unproven: Mutex::new(std::collections::VecDeque::new()),
                next_unproven: AtomicU64::new(0),
            }));
        }
        if rails.is_empty() {
            return Err(Error::Unavailable(format!(
                "rank {}: the soft RDMA HCA needs an IPv4 address on an interface OXCCL_SOCKET_IFNAME selects",
                setup.rank
            )));
        }
        let watch = RailWatch::new(setup.rank, "RDMA", &ifnames);
        Ok(Box::new(RdmaProvider {
            rank: setup.rank,
            direct: Some(DirectState::new(rails[0].ep.clone())),
            rails,
            locals: setup.locals(),
            watch: Some(watch),
            sticky: None,
        }))
    }
}

/// One rail of the provider: what it shares with its accept thread and
/// receiving ends.
struct Inner {
    ep: Arc<Endpoint>,
    /// The rail's name in messages (`mlx5_1 port 1`, `soft HCA over eth1`).
    label: String,
    side: SocketAddr,
    listener: Mutex<Option<TcpListener>>,
    accepted: Mutex<HashMap<(usize, Channel), Box<RdmaReceiver>>>,
    one_sided_in: Mutex<Vec<Link>>,
    /// What the engine sleeps on: the connection ends in use.
    wake: Arc<WakeSet>,
    closed: AtomicBool,
    /// Side-channel connections still proving themselves, oldest first:
    /// a number and a handle to cut it short.
    unproven: Mutex<std::collections::VecDeque<(u64, TcpStream)>>,
    next_unproven: AtomicU64,
}

/// Most side-channel connections proving themselves at once; beyond it
/// the oldest is cut short (a real peer proves itself in milliseconds, a
/// silent one would hold its place for 10 s).
const MAX_UNPROVEN: usize = 64;

fn accept_loop(inner: Weak<Inner>, l: TcpListener) {
    let Some(what) = inner.upgrade().map(|i| format!("rank {}: RDMA side channel", i.ep.local.rank)) else { return };
    let closed = |i: &Inner| i.closed.load(Ordering::Acquire);
    let weak = inner.clone();
    super::accept_while(l, inner, Duration::from_millis(2), &what, closed, |i, s, from| {
        // Each connection proves itself on a thread of its own, so a silent
        // one (a scanner, a stuck client) holds up no real peer.
        let id = i.next_unproven.fetch_add(1, Ordering::Relaxed);
        if let Ok(handle) = s.try_clone() {
            let mut q = i.unproven.lock();
            if q.len() >= MAX_UNPROVEN
                && let Some((_, oldest)) = q.pop_front()
            {
                let _ = oldest.shutdown(std::net::Shutdown::Both);
                tracing::warn!(
                    rank = i.ep.local.rank,
                    "RDMA: too many side-channel connections unproven; cut the oldest"
                );
            }
            q.push_back((id, handle));
        }
        let w = weak.clone();
        let spawned = std::thread::Builder::new().name("oxccl-rdma-accept".into()).spawn(move || {
            let Some(i) = w.upgrade() else { return };
            match setup::accept(&i.ep, s) {
                Ok(Accepted::Data(peer, ch, r)) => {
                    i.accepted.lock().insert((peer, ch), r);
                }
                Ok(Accepted::OneSided(link)) => i.one_sided_in.lock().push(link),
                Err(e) => tracing::warn!(rank = i.ep.local.rank, "RDMA: refused a connection from {from}: {e}"),
            }
            i.unproven.lock().retain(|(k, _)| *k != id);
        });
        if let Err(e) = spawned {
            i.unproven.lock().retain(|(k, _)| *k != id);
            tracing::warn!(rank = i.ep.local.rank, "RDMA: refused a connection from {from}: no thread: {e}");
        }
    });
}

/// One rank's side of the RDMA provider: a rail per HCA port (no rail
/// when it serves no peer). Channel `c` of a connection whose sender is
/// the `i`-th rank of its host goes over rail `(c + i) mod R`
/// ([`crate::provider::rail_of`]), `R` the fewest rails any rank has; one-sided access
/// over the first.
pub struct RdmaProvider {
    rank: usize,
    rails: Vec<Arc<Inner>>,
    /// Each rank's index on its host ([`rail_between`]).
    locals: Vec<usize>,
    /// The interfaces the software HCA's rails run over, watched while
    /// channels use them.
    watch: Option<RailWatch>,
    direct: Option<DirectState>,
    sticky: Option<Error>,
}

impl RdmaProvider {
    /// The index of the rail of channel `ch` to `peer` (`sending`) or
    /// from it.
    fn rail_index(&self, peer: usize, ch: Channel, sending: bool) -> usize {
        rail_between(&self.locals, self.rank, peer, ch, sending, self.rails.len())
    }

    /// The rail of channel `ch` to `peer` (`sending`) or from it, from now
    /// on watched.
    fn rail(&mut self, peer: usize, ch: Channel, sending: bool) -> Result<Arc<Inner>> {
        if self.rails.is_empty() {
            return Err(Error::Internal("RDMA traffic with a peer RDMA does not serve".into()));
        }
        let i = self.rail_index(peer, ch, sending);
        if let Some(w) = &mut self.watch {
            w.used(i);
        }
        Ok(self.rails[i].clone())
    }
}

/// What a rank publishes: each rail's card, length-prefixed.
fn encode_cards(cards: &[Vec<u8>]) -> Vec<u8> {
    let mut b = Vec::new();
    for c in cards {
        b.extend_from_slice(&(c.len() as u16).to_le_bytes());
        b.extend_from_slice(c);
    }
    b
}

/// Rank `from`'s rails' cards from what it published.
fn decode_cards(mut b: &[u8], from: usize) -> Result<Vec<Card>> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let bad = || Error::Remote(format!("rank {from} published a malformed list of RDMA addresses"));
        let len = usize::from(u16::from_le_bytes([b[0], *b.get(1).ok_or_else(bad)?]));
        let card = b.get(2..2 + len).ok_or_else(bad)?;
        out.push(Card::decode(card, from)?);
        b = &b[2 + len..];
    }
    if out.is_empty() {
        return Err(Error::Remote(format!("rank {from} published no RDMA address")));
    }
    Ok(out)
}

impl Provider for RdmaProvider {
    fn kind(&self) -> Kind {
        Kind::Rdma
    }

    fn link(&self) -> LinkParams {
        let bw = self.rails.first().map_or(12.5e9, |i| i.ep.local.port.bw);
        LinkParams { fifo: LinkCost { bw, lat: 5e-6 }, one_sided: LinkCost { bw, lat: 4e-6 }, native: true }
    }

    fn publish(&self) -> Vec<u8> {
        if self.rails.is_empty() {
            return Vec::new();
        }
        encode_cards(&self.rails.iter().map(|i| i.ep.local.card(i.side).encode()).collect::<Vec<_>>())
    }

    fn connect(&mut self, setup: &Setup<'_>, published: &[Vec<u8>], _bell: &Doorbell) -> Result<()> {
        if self.rails.is_empty() {
            return Ok(());
        }
        // Every rank with RDMA peers published its rails: the fewest of
        // them all, so that every rank counts the same (a rank reaches
        // only some of them over RDMA).
        let mut lists: Vec<Option<Vec<Card>>> = Vec::with_capacity(published.len());
        let mut fewest = self.rails.len();
        for (p, b) in published.iter().enumerate() {
            let cards = if b.is_empty() || p == self.rank { None } else { Some(decode_cards(b, p)?) };
            fewest = fewest.min(cards.as_ref().map_or(usize::MAX, Vec::len));
            lists.push(cards.filter(|_| setup.serves[p]));
        }
        let r = fewest.max(1);
        if r < self.rails.len() {
            let gone: Vec<String> = self.rails[r..].iter().map(|i| i.label.clone()).collect();
            tracing::info!(
                "rank {}: RDMA over {r} of its {} rails: a peer has {r} ({} unused)",
                self.rank,
                self.rails.len(),
                gone.join(", ")
            );
            for i in self.rails.drain(r..) {
                i.closed.store(true, Ordering::Release);
            }
            if let Some(w) = &mut self.watch {
                w.truncate(r);
            }
        } else if r > 1 {
            let names: Vec<&str> = self.rails.iter().map(|i| i.label.as_str()).collect();
            tracing::info!(
                "rank {}: RDMA over {r} rails ({}); channel c of the i-th rank of a host sends on rail (c + i) mod {r}",
                self.rank,
                names.join(", ")
            );
        }
        for (k, i) in self.rails.iter().enumerate() {
            let mine = i.ep.local.port.link_layer == LinkLayer::Ethernet;
            let mut cards = Vec::with_capacity(lists.len());
            for (p, list) in lists.iter().enumerate() {
                let Some(c) = list.as_ref().map(|l| l[k].clone()) else {
                    cards.push(None);
                    continue;
                };
                if c.ethernet != mine {
                    let ll = |e: bool| if e { LinkLayer::Ethernet } else { LinkLayer::InfiniBand };
                    return Err(Error::InvalidUsage(format!(
                        "rank {}'s RDMA port ({} port {}, {}) and rank {p}'s ({} port {}, {}) on rail {} have \
                         different link layers: they cannot connect (choose matching ports with OXCCL_IB_HCA, or \
                         OXCCL_IB_DISABLE=1 for TCP)",
                        self.rank,
                        i.ep.local.dev.name(),
                        i.ep.local.port.num,
                        ll(mine),
                        c.dev,
                        c.port,
                        ll(c.ethernet),
                        k + 1
                    )));
                }
                cards.push(Some(c));
            }
            let _ = i.ep.cards.set(cards);
        }
        for i in &self.rails {
            let l = i.listener.lock().take().expect("connect runs once");
            let weak = Arc::downgrade(i);
            std::thread::Builder::new()
                .name(format!("oxccl-rdma-accept-{}", self.rank))
                .spawn(move || accept_loop(weak, l))
                .map_err(|e| Error::System(format!("RDMA: thread: {e}")))?;
        }
        Ok(())
    }

    fn sender(&mut self, peer: usize, ch: Channel) -> Result<Box<dyn Sender>> {
        let i = self.rail(peer, ch, true)?;
        match setup::connect(&i.ep, peer, Some(ch))? {
            Conn::Data(mut s) => {
                s.watch(&i.wake);
                Ok(s)
            }
            Conn::OneSided(_) => Err(Error::Internal("a one-sided link where a connection was asked".into())),
        }
    }

    fn receiver(&mut self, peer: usize, ch: Channel) -> Result<Box<dyn Receiver>> {
        let i = self.rail(peer, ch, false)?;
        i.ep.card(peer)?;
        Ok(Box::new(Pending { inner: i, key: (peer, ch), end: None }))
    }

    fn route(&self, peer: usize, ch: Channel, sending: bool) -> Option<String> {
        let r = self.rails.len();
        (r > 1).then(|| {
            let k = self.rail_index(peer, ch, sending);
            format!("rdma over {}, rail {} of {r}", self.rails[k].label, k + 1)
        })
    }

    fn rails(&self) -> usize {
        self.rails.len().max(1)
    }

    fn needs_progress(&self) -> bool {
        true
    }

    fn wake(&self) -> Wake {
        let fds = self.rails.iter().flat_map(|i| i.wake.all()).collect();
        Wake { rings_bell: false, fds }
    }

    fn check(&mut self, peer_failed: bool) -> Result<()> {
        if let Some(e) = &self.sticky {
            return Err(e.clone());
        }
        if let Some(w) = &mut self.watch {
            w.check(peer_failed)?;
        }
        for i in &self.rails {
            self.sticky = self.sticky.take().or_else(|| device_events(self.rank, i));
        }
        self.sticky.clone().map_or(Ok(()), Err)
    }

    fn direct(&mut self) -> Option<&mut dyn Direct> {
        self.direct.as_mut().map(|d| d as &mut dyn Direct)
    }

    fn close(&mut self) {
        self.direct = None;
        for i in &self.rails {
            i.closed.store(true, Ordering::Release);
            i.accepted.lock().clear();
            i.one_sided_in.lock().clear();
        }
    }
}

/// The failure among rail `i`'s device's asynchronous events, if any
/// (the others are logged).
fn device_events(rank: usize, i: &Inner) -> Option<Error> {
    let mut failed = None;
    let (dev, port) = (i.ep.local.dev.name().to_string(), i.ep.local.port.num);
    while let Some(ev) = i.ep.local.dev.async_event() {
        let e = match ev {
            AsyncEvent::PortErr(p) => format!(
                "rank {rank}: RDMA port {p} of {dev} went down (PORT_ERR): its connections fail (link down, \
                 cable, switch)"
            ),
            AsyncEvent::DeviceFatal => format!("rank {rank}: RDMA device {dev} failed (DEVICE_FATAL)"),
            AsyncEvent::CqErr => format!(
                "rank {rank}: a completion queue on {dev} port {port} overflowed (CQ_ERR): its connections failed"
            ),
            AsyncEvent::QpFatal(q) => format!("rank {rank}: queue pair {q} on {dev} port {port} failed (QP_FATAL)"),
            AsyncEvent::QpError(q) => {
                // The peer that sent the request sees REM_ACCESS and
                // says so; a data connection on this QP fails with its
                // flushed receives.
                tracing::warn!(
                    rank,
                    "a peer's request broke an RDMA rule on queue pair {q} on {dev} port {port} (a bad rkey or \
                     bounds), which failed"
                );
                continue;
            }
            other => {
                tracing::info!(rank, "RDMA event on {dev}: {other}");
                continue;
            }
        };
        tracing::warn!("{e}");
        // This rank's own port or device: a system error, which comes
        // before a peer's failure in the fabric's check.
        failed = Some(Error::System(e));
    }
    failed
}

impl Drop for RdmaProvider {
    fn drop(&mut self) {
        self.close();
    }
}

/// A receiving end whose connection the peer may not have opened yet.
struct Pending {
    inner: Arc<Inner>,
    key: (usize, Channel),
    end: Option<Box<RdmaReceiver>>,
}

impl Pending {
    fn ready(&mut self) -> Option<&mut RdmaReceiver> {
        if self.end.is_none() {
            let mut r = self.inner.accepted.lock().remove(&self.key)?;
            r.watch(&self.inner.wake);
            self.end = Some(r);
        }
        self.end.as_deref_mut()
    }
}

impl Receiver for Pending {
    fn peek(&mut self) -> Result<Option<Piece<'_>>> {
        match self.ready() {
            Some(r) => r.peek(),
            None => Ok(None),
        }
    }
    fn consume(&mut self, n: usize) -> Result<()> {
        match self.ready() {
            Some(r) => r.consume(n),
            None => Err(Error::InvalidUsage("consume before anything arrived".into())),
        }
    }
    fn progress(&mut self) -> Result<bool> {
        match self.ready() {
            Some(r) => r.progress(),
            None => Ok(false),
        }
    }
    fn bytes(&self) -> u64 {
        self.end.as_ref().map_or(0, |r| r.bytes())
    }
}

/// A connected sender and receiver of channel `ch` over two software HCAs
/// of this process (the conformance suite's pair): a FIFO of `capacity`
/// bytes (a power of two), `qps` QPs per connection, chunks of `chunk`.
pub fn soft_pair(
    ch: Channel,
    capacity: usize,
    qps: u32,
    chunk: usize,
    soft: SoftOptions,
) -> Result<(Box<dyn Sender>, Box<dyn Receiver>)> {
    soft_pair_timed(ch, capacity, qps, chunk, soft, IbOptions::default().timeout)
}

/// [`soft_pair`] whose QPs wait `4.096 µs × 2^timeout` for an
/// acknowledgement (`OXCCL_IB_TIMEOUT`), `retry_cnt + 1` times.
pub fn soft_pair_timed(
    ch: Channel,
    capacity: usize,
    qps: u32,
    chunk: usize,
    soft: SoftOptions,
    timeout: u8,
) -> Result<(Box<dyn Sender>, Box<dyn Receiver>)> {
    if !capacity.is_power_of_two() || !chunk.is_power_of_two() || chunk > capacity {
        return Err(Error::invalid(format!("soft_pair: capacity {capacity} and chunk {chunk} must be powers of two")));
    }
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(|e| Error::System(e.to_string()))?;
    let local = |rank: usize| -> Result<Local> {
        let dev: Arc<dyn Device> = SoftDevice::open(Ipv4Addr::LOCALHOST, soft)?;
        let opts =
            IbOptions { provider: IbProvider::Soft, qps_per_connection: qps, chunk, timeout, ..IbOptions::default() };
        let (port, gid) = pick_port(&dev, &opts)?;
        Ok(Local {
            rank,
            dev,
            port,
            gid,
            opts,
            secret,
            cap: capacity,
            chunk,
            timeout: Duration::from_secs(30),
            faults: Faults::default(),
        })
    };
    let (a, b) = (local(0)?, local(1)?);
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| Error::System(e.to_string()))?;
    let side = l.local_addr().map_err(|e| Error::System(e.to_string()))?;
    // Only rank 1 has a side channel; rank 0 connects to it.
    let card_a = a.card(SocketAddr::from(([127, 0, 0, 1], 0)));
    let card_b = b.card(side);
    let a = Endpoint { local: a, cards: OnceLock::from(vec![None, Some(card_b)]) };
    let b = Endpoint { local: b, cards: OnceLock::from(vec![Some(card_a), None]) };
    let acceptor = std::thread::spawn(move || -> Result<Box<RdmaReceiver>> {
        let (s, _) = l.accept().map_err(|e| Error::System(e.to_string()))?;
        match setup::accept(&b, s)? {
            Accepted::Data(_, _, r) => Ok(r),
            Accepted::OneSided(_) => Err(Error::Internal("a one-sided link".into())),
        }
    });
    let s = match setup::connect(&a, 1, Some(ch))? {
        Conn::Data(s) => s,
        Conn::OneSided(_) => return Err(Error::Internal("a one-sided link".into())),
    };
    let r = acceptor.join().map_err(|_| Error::Internal("the acceptor panicked".into()))??;
    Ok((s, r))
}
