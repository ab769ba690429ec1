//! The TCP provider: connections between any two ranks that can reach each
//! other.
//!
//! Each rank has one [`Tcp`]: a non-blocking listener on an ephemeral port
//! and the table of every rank's listener address. A connection from rank
//! `s` to rank `r` on channel `c` is [`TcpOptions::streams`] sockets opened
//! by `s` (lazily, at the sender's first use), each starting with a
//! [`crate::wire::Handshake`]. Rank `r` accepts them in [`Tcp::progress`] (or in
//! any of its receivers' `progress`), checks the handshake against a
//! deadline and hands the sockets to the receiver for `(s, c)`. Anything
//! that is not a valid oxccl handshake (a port scanner, another job, a
//! stale peer) is dropped with a warning without disturbing the rest.
//!
//! Each message is split into stripes ([`crate::wire::stripe_range`]), one per
//! socket. Both ends keep a local FIFO of [`TcpOptions::buffer`] bytes laid
//! out like the shared-memory ring (payloads 64-aligned), so the
//! [`Sender`]/[`Receiver`] contract is the same as for the other providers;
//! the sockets move bytes between the two FIFOs with non-blocking
//! `writev`/`read`. No call blocks.
//!
//! ## For the integrator
//! - Exchange [`Tcp::addr`] through the bootstrap, then
//!   [`Tcp::set_peer_addrs`] before creating senders.
//! - Sockets are accepted by [`Tcp::progress`] and by the `progress` of any
//!   receiver that has not got its sockets yet; call one of them while
//!   connections are being set up.
//! - When idle, poll [`Tcp::poll_fds`] for readability; a sender that is not
//!   [`flushed`](Sender::flushed) also wants its sockets writable (or just
//!   a short poll timeout).
//! - Sizes: a message may be larger than the buffer, but its stripes only
//!   move in parallel when they fit in the buffer together (the executor's
//!   chunks, a few MiB, do).
//! - Errors: a peer that closes or resets a socket is an
//!   [`Error::Remote`] naming the rank and channel, raised by the receiver
//!   once the bytes sent before the close have been consumed; a malformed
//!   header is an [`Error::Remote`] saying what was wrong. Errors stick.

mod pending;
mod provider;
mod recv;
mod seal;
mod send;

pub use provider::{TcpFactory, TcpProvider};

use crate::wire::{Expect, HANDSHAKE_LEN, Handshake, MAX_STREAMS};
use crate::{Channel, Error, Receiver, Result, Sender};
use parking_lot::Mutex;
use pending::{Handshakes, Pending};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::collections::{HashMap, HashSet};
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Most connections waiting for their handshake; the oldest is dropped
/// beyond this (a scanner cannot exhaust file descriptors).
const MAX_PENDING: usize = 256;
/// How long an accepted socket may take to present its handshake and its
/// proof (a real peer sends both as soon as the challenge arrives).
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(5);
/// Bytes a connecting side sends first: the handshake, then its proof.
const HELLO_LEN: usize = HANDSHAKE_LEN + crate::auth::PROOF_LEN;
/// The label of a data connection's proof.
const TCP_PROOF: &[u8] = b"oxccl-tcp";

/// The proof a connecting side sends after its handshake `hs`: the secret
/// over the accepting side's challenge and the handshake's bytes (its
/// ranks, channel and stripe).
fn handshake_proof(secret: &crate::auth::Secret, challenge: &[u8], hs: &[u8]) -> [u8; crate::auth::PROOF_LEN] {
    crate::auth::prove(secret, &[TCP_PROOF, challenge, hs])
}

/// Whether `proof` is [`handshake_proof`] of `hs` over `challenge`.
fn handshake_proven(secret: &crate::auth::Secret, challenge: &[u8], hs: &[u8], proof: &[u8]) -> bool {
    crate::auth::verify(secret, &[TCP_PROOF, challenge, hs], proof)
}

/// Settings of the TCP provider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpOptions {
    /// Sockets per connection (1..=64); default 2 (oxccl: `OXCCL_NSOCKS`).
    pub streams: usize,
    /// Capacity of each connection's local FIFO at either end: a multiple
    /// of 64, default 4 MiB (the fabric's default is 512 KiB).
    pub buffer: usize,
    /// How long a sender keeps trying to connect, and how long an accepted
    /// socket may take to present its handshake. Default 30 s.
    pub connect_timeout: Duration,
    /// `SO_SNDBUF`/`SO_RCVBUF` to ask for, default 4 MiB; set only where
    /// the kernel's maximum (`net.core.{w,r}mem_max`) allows it, so kernel
    /// autotuning is not capped below its own limit. 0 leaves them alone.
    pub socket_buffer: usize,
    /// Encrypt data sockets after their handshake (AES-256-GCM, keyed from
    /// the communicator's secret: see `seal`); every rank must agree.
    pub encrypt: bool,
    /// The interface the fabric's provider listens on, in the
    /// `OXCCL_SOCKET_IFNAME` syntax ([`crate::id::interface_ip`]); `None`:
    /// the bootstrap's. [`Tcp::new`] is given its address and ignores it.
    pub ifname: Option<String>,
}

impl Default for TcpOptions {
    fn default() -> TcpOptions {
        TcpOptions {
            streams: 2,
            buffer: 4 << 20,
            connect_timeout: Duration::from_secs(30),
            socket_buffer: 4 << 20,
            encrypt: false,
            ifname: None,
        }
    }
}

/// Validated sockets of one incoming connection, waiting for its receiver.
struct Arrived {
    nstripes: u16,
    /// Per stripe: the socket and, encrypting, its key.
    socks: Vec<Option<(Socket, Option<[u8; 32]>)>>,
}

struct State {
    peers: Vec<SocketAddr>,
    pending: Handshakes,
    arrived: HashMap<(usize, Channel), Arrived>,
    /// Connections whose sockets a receiver has taken.
    taken: HashSet<(usize, Channel)>,
    senders: HashSet<(usize, Channel)>,
    receivers: HashSet<(usize, Channel)>,
    /// Every connection socket, for `poll_fds` and `close`.
    sockets: Vec<Weak<Socket>>,
    /// When the listener was last asked for connections.
    last_accept: Option<Instant>,
    drops: Drops,
}

/// Logs dropped connections: the first few of each second one by one, the
/// rest as a count (a flood of them must not cost the data path a log line
/// each).
#[derive(Default)]
struct Drops {
    since: Option<Instant>,
    logged: u32,
    quiet: u64,
}

impl Drops {
    const PER_SECOND: u32 = 5;

    fn note(&mut self, me: usize, from: &str, why: &str) {
        let now = Instant::now();
        if self.since.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1)) {
            if self.quiet > 0 {
                tracing::warn!(
                    "tcp rank {me}: dropped {} more connections in the last second (not logged)",
                    self.quiet
                );
            }
            *self = Drops { since: Some(now), logged: 0, quiet: 0 };
        }
        if self.logged < Self::PER_SECOND {
            self.logged += 1;
            tracing::warn!("tcp rank {me}: dropped a connection from {from}: {why}");
        } else {
            self.quiet += 1;
        }
    }
}

/// How often the listener is asked for new connections.
const ACCEPT_EVERY: Duration = Duration::from_micros(200);

/// What a [`Tcp`] shares with its senders and receivers.
struct Shared {
    me: usize,
    nranks: usize,
    nonce: [u8; 16],
    /// The communicator's secret: every connection proves it knows it.
    secret: crate::auth::Secret,
    opts: TcpOptions,
    listener: Socket,
    addr: SocketAddr,
    state: Mutex<State>,
    /// Set by [`Tcp::close`]: errors afterwards blame this rank, not the peer.
    closed: AtomicBool,
}

/// One rank's TCP provider: its listener and the peers' addresses.
pub struct Tcp {
    shared: Arc<Shared>,
}

fn sys(what: &str, e: std::io::Error) -> Error {
    Error::System(format!("{what}: {e}"))
}

/// A kernel limit from /proc, or `None` where it cannot be read.
fn kernel_max(name: &str) -> Option<usize> {
    std::fs::read_to_string(format!("/proc/sys/net/core/{name}")).ok()?.trim().parse().ok()
}

/// Non-blocking, no Nagle, bigger kernel buffers where allowed.
fn tune(sock: &Socket, opts: &TcpOptions) -> std::io::Result<()> {
    sock.set_nonblocking(true)?;
    let want = opts.socket_buffer;
    if want > 0 {
        if kernel_max("wmem_max").is_some_and(|m| m >= want) && sock.send_buffer_size()? < want {
            sock.set_send_buffer_size(want)?;
        }
        if kernel_max("rmem_max").is_some_and(|m| m >= want) && sock.recv_buffer_size()? < want {
            sock.set_recv_buffer_size(want)?;
        }
    }
    Ok(())
}

impl Tcp {
    /// Binds a non-blocking listener on an ephemeral port of `bind_ip` for
    /// rank `my_rank` of `nranks` in the communicator with this `nonce`
    /// and `secret` (which every connection proves it knows).
    pub fn new(
        my_rank: usize,
        nranks: usize,
        nonce: [u8; 16],
        secret: crate::auth::Secret,
        bind_ip: IpAddr,
        opts: TcpOptions,
    ) -> Result<Tcp> {
        if my_rank >= nranks || nranks > u32::MAX as usize {
            return Err(Error::invalid(format!("tcp: rank {my_rank} of {nranks} ranks")));
        }
        if opts.streams == 0 || opts.streams > usize::from(MAX_STREAMS) {
            return Err(Error::invalid(format!(
                "tcp: {} streams per connection; use 1..={MAX_STREAMS} (OXCCL_NSOCKS)",
                opts.streams
            )));
        }
        if opts.buffer == 0 || !opts.buffer.is_multiple_of(64) {
            return Err(Error::invalid(format!("tcp: buffer of {} bytes; use a positive multiple of 64", opts.buffer)));
        }
        let addr = SocketAddr::new(bind_ip, 0);
        let listener = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
            .map_err(|e| sys("tcp: creating the listener socket", e))?;
        tune(&listener, &opts).map_err(|e| sys("tcp: configuring the listener", e))?;
        listener.bind(&addr.into()).map_err(|e| sys(&format!("tcp: binding a listener to {bind_ip}"), e))?;
        listener.listen(1024).map_err(|e| sys("tcp: listen", e))?;
        let addr = listener
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .ok_or_else(|| Error::System("tcp: the listener has no address".into()))?;
        let state = State {
            peers: Vec::new(),
            pending: Handshakes::new().map_err(|e| sys("tcp: creating the handshake poller", e))?,
            arrived: HashMap::new(),
            taken: HashSet::new(),
            senders: HashSet::new(),
            receivers: HashSet::new(),
            sockets: Vec::new(),
            last_accept: None,
            drops: Drops::default(),
        };
        Ok(Tcp {
            shared: Arc::new(Shared {
                me: my_rank,
                nranks,
                nonce,
                secret,
                opts,
                listener,
                addr,
                state: Mutex::new(state),
                closed: AtomicBool::new(false),
            }),
        })
    }

    /// The listener's address, to publish to the other ranks.
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// Every rank's listener address, indexed by rank.
    pub fn set_peer_addrs(&self, addrs: Vec<SocketAddr>) -> Result<()> {
        if addrs.len() != self.shared.nranks {
            return Err(Error::invalid(format!(
                "tcp: {} peer addresses for {} ranks",
                addrs.len(),
                self.shared.nranks
            )));
        }
        self.shared.state.lock().peers = addrs;
        Ok(())
    }

    /// The sending end of the connection to `peer` on channel `ch`. It
    /// connects at its first use; until connected its room is empty.
    pub fn sender(&self, peer: usize, ch: Channel) -> Result<Box<dyn Sender>> {
        let sh = &self.shared;
        let addr = {
            let mut st = sh.state.lock();
            let Some(&addr) = st.peers.get(peer) else {
                return Err(if peer >= sh.nranks {
                    Error::invalid(format!("tcp: peer {peer} out of range ({} ranks)", sh.nranks))
                } else {
                    Error::InvalidUsage("tcp: sender before set_peer_addrs".into())
                });
            };
            if !st.senders.insert((peer, ch)) {
                return Err(Error::InvalidUsage(format!(
                    "tcp: rank {} already has a sender to rank {peer} on channel {ch}",
                    sh.me
                )));
            }
            addr
        };
        Ok(Box::new(send::TcpSender::new(Arc::clone(sh), peer, ch, addr)))
    }

    /// The receiving end of the connection from `peer` on channel `ch`; its
    /// sockets may arrive before or after this call.
    pub fn receiver(&self, peer: usize, ch: Channel) -> Result<Box<dyn Receiver>> {
        let sh = &self.shared;
        if peer >= sh.nranks {
            return Err(Error::invalid(format!("tcp: peer {peer} out of range ({} ranks)", sh.nranks)));
        }
        if !sh.state.lock().receivers.insert((peer, ch)) {
            return Err(Error::InvalidUsage(format!(
                "tcp: rank {} already has a receiver from rank {peer} on channel {ch}",
                sh.me
            )));
        }
        Ok(Box::new(recv::TcpReceiver::new(Arc::clone(sh), peer, ch)))
    }

    /// Accepts incoming sockets and checks their handshakes; true if
    /// anything happened. Bad connections are dropped and logged, never an
    /// error.
    pub fn progress(&self) -> Result<bool> {
        Ok(self.shared.poll())
    }

    /// The listener, the sockets still presenting handshakes and every
    /// connection socket: poll them for readability (and writability where
    /// a sender has bytes queued) when idle.
    pub fn poll_fds(&self) -> Vec<RawFd> {
        let mut st = self.shared.state.lock();
        st.sockets.retain(|w| w.strong_count() > 0);
        let mut fds = vec![self.shared.listener.as_raw_fd()];
        fds.extend(st.pending.fds());
        fds.extend(st.arrived.values().flat_map(|a| a.socks.iter().flatten()).map(|(s, _)| s.as_raw_fd()));
        fds.extend(st.sockets.iter().filter_map(|w| w.upgrade()).map(|s| s.as_raw_fd()));
        fds
    }

    /// Connections accepted whose handshake has not been read yet.
    pub fn pending_handshakes(&self) -> usize {
        self.shared.state.lock().pending.len()
    }

    /// Shuts down every socket of this rank's connections (the peers see
    /// EOF) and drops the pending ones. Senders and receivers report an
    /// error afterwards.
    pub fn close(&self) {
        self.shared.closed.store(true, Ordering::Relaxed);
        let mut st = self.shared.state.lock();
        for s in st.sockets.drain(..).filter_map(|w| w.upgrade()) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        st.pending.clear();
        st.arrived.clear();
    }
}

impl std::fmt::Debug for Tcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tcp").field("rank", &self.shared.me).field("addr", &self.shared.addr).finish()
    }
}

impl Shared {
    /// The error for a connection whose socket failed: the peer's fault
    /// unless this rank closed its provider.
    fn lost(&self, peer: usize, ch: Channel, stream: usize, detail: &str) -> Error {
        if self.closed.load(Ordering::Relaxed) {
            return Error::InvalidUsage(format!(
                "rank {}: connection with rank {peer} (channel {ch}) used after its tcp provider was closed",
                self.me
            ));
        }
        Error::Remote(format!(
            "rank {peer} closed the connection (channel {ch}, stream {stream}, at rank {}){detail}; the peer \
             process probably failed, see its log",
            self.me
        ))
    }

    fn register(&self, sock: &Arc<Socket>) {
        let mut st = self.state.lock();
        st.sockets.retain(|w| w.strong_count() > 0);
        st.sockets.push(Arc::downgrade(sock));
    }

    /// Takes the sockets of connection `(peer, ch)` once all have arrived.
    fn take(&self, peer: usize, ch: Channel) -> Option<Vec<(Arc<Socket>, Option<seal::Opener>)>> {
        let mut st = self.state.lock();
        let a = st.arrived.get(&(peer, ch))?;
        if a.socks.iter().any(Option::is_none) {
            return None;
        }
        let a = st.arrived.remove(&(peer, ch))?;
        st.taken.insert((peer, ch));
        let socks: Vec<(Arc<Socket>, Option<seal::Opener>)> =
            a.socks.into_iter().flatten().map(|(s, k)| (Arc::new(s), k.as_ref().map(seal::Opener::new))).collect();
        st.sockets.extend(socks.iter().map(|(s, _)| Arc::downgrade(s)));
        debug_assert_eq!(socks.len(), usize::from(a.nstripes));
        Some(socks)
    }

    /// Accepts what is waiting and advances pending handshakes.
    fn poll(&self) -> bool {
        let mut st = self.state.lock();
        let mut moved = false;
        // accept() on an empty backlog is no cheap syscall (the kernel
        // allocates a socket and frees it again): the executor polls in a
        // tight loop, so ask at most every ACCEPT_EVERY.
        let now = Instant::now();
        let accept = st.last_accept.is_none_or(|t| now.duration_since(t) >= ACCEPT_EVERY);
        if accept {
            st.last_accept = Some(now);
        }
        for _ in 0..if accept { 64 } else { 0 } {
            match self.listener.accept() {
                Ok((sock, from)) => {
                    moved = true;
                    let from = from.as_socket().map_or_else(|| "?".to_string(), |a| a.to_string());
                    if let Err(e) = sock.set_nonblocking(true).and_then(|()| sock.set_tcp_nodelay(true)) {
                        st.drops.note(self.me, &from, &e.to_string());
                        continue;
                    }
                    // The challenge goes out at once: 16 bytes always fit a
                    // fresh socket's buffer.
                    let challenge = crate::auth::challenge();
                    if let Err(e) = (&sock).write_all(&challenge) {
                        st.drops.note(self.me, &from, &format!("sending the challenge: {e}"));
                        continue;
                    }
                    let deadline = Instant::now() + HANDSHAKE_DEADLINE.min(self.opts.connect_timeout);
                    let p = Pending { sock, from, challenge, buf: [0; HELLO_LEN], got: 0, deadline };
                    match st.pending.add(p, MAX_PENDING) {
                        Ok(Some(old)) => st.drops.note(self.me, &old.from, "too many handshakes pending"),
                        Ok(None) => {}
                        Err(e) => st.drops.note(self.me, "?", &format!("watching it: {e}")),
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!("tcp rank {}: accept on {}: {e}", self.me, self.addr);
                    break;
                }
            }
        }
        // Only the sockets with bytes waiting (and, now and then, those
        // past their deadline): idle connections cost nothing here.
        let now = Instant::now();
        for key in st.pending.due(now) {
            let Some(p) = st.pending.get_mut(key) else { continue };
            let outcome = loop {
                match (&p.sock).read(&mut p.buf[p.got..]) {
                    Ok(0) => break Err(format!("closed after {} of {HELLO_LEN} handshake bytes", p.got)),
                    Ok(n) => {
                        moved = true;
                        p.got += n;
                        if p.got == HELLO_LEN {
                            break Ok(true);
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        if now >= p.deadline {
                            break Err(format!(
                                "no handshake within {:?} ({} of {HELLO_LEN} bytes)",
                                HANDSHAKE_DEADLINE.min(self.opts.connect_timeout),
                                p.got
                            ));
                        }
                        break Ok(false);
                    }
                    Err(e) => break Err(e.to_string()),
                }
            };
            match outcome {
                Ok(false) => {}
                Ok(true) => {
                    let p = st.pending.remove(key).expect("found above");
                    if let Err(why) = self.admit(&mut st, p.sock, &p.buf, &p.challenge) {
                        st.drops.note(self.me, &p.from, &why);
                    }
                    moved = true;
                }
                Err(why) => {
                    let p = st.pending.remove(key).expect("found above");
                    st.drops.note(self.me, &p.from, &why);
                    moved = true;
                }
            }
        }
        moved
    }

    /// Checks a complete handshake and its proof, and files its socket.
    fn admit(&self, st: &mut State, sock: Socket, buf: &[u8], challenge: &[u8]) -> std::result::Result<(), String> {
        let expect = Expect { nonce: self.nonce, receiver: self.me, nranks: self.nranks };
        let (hs, proof) = buf.split_at(HANDSHAKE_LEN);
        let h = Handshake::decode(hs, &expect).map_err(|e| e.to_string())?;
        if !handshake_proven(&self.secret, challenge, hs, proof) {
            return Err(format!(
                "it claims to be rank {} (channel {}) but cannot prove it knows the communicator's secret",
                h.sender, h.channel
            ));
        }
        if !crate::valid_channel(h.channel) {
            return Err(format!("rank {}: channel {} does not exist", h.sender, h.channel));
        }
        let key = (h.sender as usize, h.channel);
        if st.taken.contains(&key) {
            return Err(format!("rank {} channel {} is already connected", h.sender, h.channel));
        }
        let a = st
            .arrived
            .entry(key)
            .or_insert_with(|| Arrived { nstripes: h.nstripes, socks: (0..h.nstripes).map(|_| None).collect() });
        if a.nstripes != h.nstripes {
            return Err(format!(
                "rank {} channel {}: stripe count {} differs from the {} of its other sockets",
                h.sender, h.channel, h.nstripes, a.nstripes
            ));
        }
        let slot = &mut a.socks[usize::from(h.stripe)];
        if slot.is_some() {
            return Err(format!("rank {} channel {}: stripe {} arrived twice", h.sender, h.channel, h.stripe));
        }
        let key = self.opts.encrypt.then(|| seal::key(&self.secret, challenge, hs));
        *slot = Some((sock, key));
        Ok(())
    }
}

/// Builds a connected pair over loopback (rank 0 sends to rank 1 on `ch`),
/// with `capacity` bytes of FIFO at each end and the default streams; for
/// tests and the conformance suite. The pair keeps its listeners alive.
///
/// # Panics
/// If loopback sockets cannot be made; [`tcp_pair_with`] returns the error.
pub fn tcp_pair(ch: Channel, capacity: usize) -> (Box<dyn Sender>, Box<dyn Receiver>) {
    tcp_pair_with(ch, TcpOptions { buffer: capacity, ..TcpOptions::default() }).expect("tcp_pair over loopback")
}

/// [`tcp_pair`] with explicit options.
pub fn tcp_pair_with(ch: Channel, opts: TcpOptions) -> Result<(Box<dyn Sender>, Box<dyn Receiver>)> {
    let mut nonce = [0u8; 16];
    getrandom::fill(&mut nonce).map_err(|e| Error::System(format!("tcp: random nonce: {e}")))?;
    let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(|e| Error::System(format!("tcp: random secret: {e}")))?;
    let a = Tcp::new(0, 2, nonce, secret, lo, opts.clone())?;
    let b = Tcp::new(1, 2, nonce, secret, lo, opts)?;
    let addrs = vec![a.addr(), b.addr()];
    a.set_peer_addrs(addrs.clone())?;
    b.set_peer_addrs(addrs)?;
    Ok((a.sender(1, ch)?, b.receiver(0, ch)?))
}

/// A zeroed buffer of `cap` bytes whose data starts 64-aligned in memory:
/// the vector and the offset of its first aligned byte.
fn aligned_buffer(cap: usize) -> (Vec<u8>, usize) {
    let buf = vec![0u8; cap + 64];
    let base = buf.as_ptr().align_offset(64).min(64);
    (buf, base)
}

/// A non-blocking socket connecting to `addr` (the connect completes later).
fn start_connect(addr: &SockAddr, opts: &TcpOptions) -> std::io::Result<Socket> {
    let domain = if addr.is_ipv6() { Domain::IPV6 } else { Domain::IPV4 };
    let sock = Socket::new(domain, Type::STREAM, Some(Protocol::TCP))?;
    tune(&sock, opts)?;
    sock.set_tcp_nodelay(true)?;
    match sock.connect(addr) {
        Ok(()) => Ok(sock),
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) || e.kind() == ErrorKind::WouldBlock => Ok(sock),
        Err(e) => Err(e),
    }
}
