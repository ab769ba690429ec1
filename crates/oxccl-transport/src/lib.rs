//! # oxccl-transport
//!
//! How oxccl ranks find each other and move bytes; nothing here knows
//! collectives.
//!
//! - [`id::UniqueId`] and [`bootstrap::Bootstrap`]: rank 0 listens, every
//!   rank connects to it with the id's nonce, and the ranks all-gather their
//!   addresses and host identities. The bootstrap connections stay open for
//!   the communicator's life: they carry small all-gathers (split, argument
//!   checks) and tell every rank when another one dies.
//! - Providers ([`provider`]): the seam a transport implements: which
//!   peers it reaches, what it publishes through the bootstrap and how it
//!   connects, its link parameters for the tuner, connection ends,
//!   progress, what the engine sleeps on, and native one-sided access if
//!   it has any. [`mem`] (ranks that are threads of one process), [`shm`]
//!   (processes on one host, shared segments) and [`tcp`] (anything
//!   reachable). The [`fabric::Fabric`] picks one per peer from one table
//!   ([`fabric::registry`]) and matches on no [`Kind`].
//! - Connections: messages from one rank to one peer on one channel, in
//!   order ([`Sender`], [`Receiver`]).
//! - One-sided access: a rank registers its buffers for a call
//!   ([`fabric::Fabric::expose`]) and peers read and write them through
//!   serializable descriptors ([`provider::MemDesc`]): natively where the
//!   provider can ([`provider::Direct`]: copies between threads, cross-
//!   memory attach between processes), else by request and answer over the
//!   control plane ([`control`]), which also carries signals.
//! - A connection is a bounded FIFO of bytes with message boundaries. The
//!   sender asks for *room* and writes into it directly; the receiver
//!   *peeks* at arrived bytes and reads them in place. So an executor
//!   fuses receive-reduce-send in one pass: it reads the incoming piece and
//!   its local operand and writes the result straight into the outgoing
//!   room.
//!
//! Every call is non-blocking: "not yet" is an empty room or `None`, never
//! a wait. Waiting is [`fabric::Fabric::wait`], with a deadline, on the
//! rank's [`futex::Doorbell`] (rung by peers' commits and consumes) and on
//! sockets.
//!
//! ## Thread safety
//! Senders and receivers are `Send`: one thread (the communicator's
//! progress thread) drives them. The two ends of one connection live in
//! different ranks, which may be different threads or processes.
//!
//! ## Unsafe
//! Only where memory is shared with another process or the kernel: the
//! ring over a shared mapping, futexes, `process_vm_readv`/`writev`,
//! segment mapping, `poll`; and [`region`], the one module that turns a
//! caller's buffer into a raw view. Each block has a `// SAFETY:` comment.

pub mod auth;
pub mod bootstrap;
pub mod cma;
pub mod conformance;
pub mod control;
pub mod fabric;
pub mod futex;
pub mod id;
pub mod mem;
pub mod provider;
mod rail;
pub mod rdma;
pub mod region;
pub mod ring;
pub mod seal;
pub mod shm;
pub mod tcp;
pub mod topo;
pub mod wire;

pub use oxccl_core::{Error, Result};
use region::Region;

/// Channel number of a connection. Collectives use small numbers; point-to-
/// point operations use [`P2P_CHANNEL`].
pub type Channel = u32;

/// The channel that carries user send/recv: the n-th send from a rank to a
/// peer matches the n-th receive from that rank at the peer.
pub const P2P_CHANNEL: Channel = u32::MAX;

/// Collective channels a connection set supports (plus [`P2P_CHANNEL`] and
/// [`CONTROL_CHANNEL`]).
pub const CHANNELS: usize = 16;

/// The channel that carries the one-sided control plane between two ranks
/// (signals, buffer descriptors, emulated gets and puts; see
/// [`control`]); never used by programs.
pub const CONTROL_CHANNEL: Channel = u32::MAX - 1;

/// Whether `ch` names a channel a connection may have: `0..CHANNELS`,
/// [`P2P_CHANNEL`] or [`CONTROL_CHANNEL`] (checked before anything is set
/// up for a connection a peer announces).
pub fn valid_channel(ch: Channel) -> bool {
    (ch as usize) < CHANNELS || ch == P2P_CHANNEL || ch == CONTROL_CHANNEL
}

/// Which provider carries a connection.
///
/// Non-exhaustive: providers are added without touching any `match` on
/// this type outside this file; names, aliases and wire codes come from
/// one table ([`Kind::all`], [`Kind::from_str`](std::str::FromStr)).
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// Ranks in one process.
    Mem,
    /// Processes on one host.
    Shm,
    /// Sockets.
    Tcp,
    /// RDMA verbs (InfiniBand, RoCE, or the software HCA).
    Rdma,
}

/// Every kind: (kind, name, other names accepted, wire code).
const KINDS: &[(Kind, &str, &[&str], u8)] = &[
    (Kind::Mem, "mem", &[], 1),
    (Kind::Shm, "shm", &[], 2),
    (Kind::Tcp, "tcp", &["socket", "net"], 3),
    (Kind::Rdma, "rdma", &["ib", "verbs"], 4),
];

impl Kind {
    fn info(self) -> &'static (Kind, &'static str, &'static [&'static str], u8) {
        KINDS.iter().find(|k| k.0 == self).expect("every kind is in the table")
    }

    /// Every kind, in the table's order.
    pub fn all() -> impl Iterator<Item = Kind> {
        KINDS.iter().map(|k| k.0)
    }

    /// `mem`, `shm`, `tcp`, …
    pub fn name(self) -> &'static str {
        self.info().1
    }

    /// The byte that stands for this kind in descriptors.
    pub fn code(self) -> u8 {
        self.info().3
    }

    /// The kind a descriptor's byte stands for.
    pub fn from_code(code: u8) -> Option<Kind> {
        KINDS.iter().find(|k| k.3 == code).map(|k| k.0)
    }
}

impl std::str::FromStr for Kind {
    type Err = Error;
    /// A kind by name or alias, any case (`tcp`, `socket`, `shm` …).
    fn from_str(s: &str) -> Result<Kind> {
        let key = s.trim().to_ascii_lowercase();
        KINDS.iter().find(|k| k.1 == key || k.2.contains(&key.as_str())).map(|k| k.0).ok_or_else(|| {
            let names: Vec<String> = KINDS
                .iter()
                .map(|k| if k.2.is_empty() { k.1.to_string() } else { format!("{} (or {})", k.1, k.2.join(", ")) })
                .collect();
            Error::invalid(format!("unknown transport {s:?}; expected one of {}", names.join(", ")))
        })
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The sending end of one connection.
///
/// A message is announced with [`begin`](Sender::begin) (its length), then
/// written piece by piece: [`room`](Sender::room) hands out writable space
/// (empty when the FIFO is full: call [`progress`](Sender::progress) and
/// retry later), [`commit`](Sender::commit) publishes the first `n` bytes
/// written there. A message of length 0 is complete at `begin`.
///
/// Every message carries a 64-bit tag in its header, which its receiver
/// sees ([`Piece::tag`], [`Receiver::next_tag`]); the transport gives it no
/// meaning (the engine puts the call's signature there; 0: none).
pub trait Sender: Send {
    /// Starts a message of `len` bytes tagged `tag`. An error if the
    /// previous message is not complete.
    fn begin_tagged(&mut self, len: usize, tag: u64) -> Result<()>;
    /// Starts an untagged message (tag 0) of `len` bytes.
    fn begin(&mut self, len: usize) -> Result<()> {
        self.begin_tagged(len, 0)
    }
    /// Writable space for the next bytes of the current message: at most
    /// `want` bytes and at most what the message still lacks; empty when
    /// there is no room yet (or the connection is still being set up).
    fn room(&mut self, want: usize) -> Result<&mut [u8]>;
    /// Publishes the first `n` bytes of the last [`room`](Sender::room).
    fn commit(&mut self, n: usize) -> Result<()>;
    /// Moves bytes on (sockets); true if anything moved. Errors when the
    /// peer is gone.
    fn progress(&mut self) -> Result<bool>;
    /// Whether every committed byte has left this rank's buffers.
    fn flushed(&self) -> bool;
    /// Payload bytes committed so far (message headers not counted).
    fn bytes(&self) -> u64;
    /// Whether [`send_from`](Sender::send_from) would take a message of
    /// `len` bytes (the provider sends it without a copy into the FIFO
    /// and prefers to, at that size).
    fn takes_from(&self, _len: usize) -> bool {
        false
    }
    /// Sends a whole message straight from `src`, without copying it into
    /// the FIFO: TCP writes it from there, shared memory lets the receiver
    /// read it from there. No message may be in progress. `src` must stay
    /// unchanged and alive until [`released`](Sender::released) says so for
    /// the returned token. The message is tagged `tag`. `Ok(None)`: not
    /// here (use begin/room/commit).
    fn send_from(&mut self, _src: Region, _tag: u64) -> Result<Option<u64>> {
        Ok(None)
    }
    /// Whether the message of `token` no longer needs its source.
    fn released(&self, _token: u64) -> bool {
        true
    }
    /// Moves the message of `token` (from [`send_from`](Sender::send_from))
    /// on: (whether anything moved, whether it is [released](Sender::released)).
    /// Released is looked at first: a receiver that read the message and
    /// then closed its end (its part of the call was done) has released it,
    /// and [`progress`](Sender::progress) would fail on the closed connection.
    fn progress_from(&mut self, token: u64) -> Result<(bool, bool)> {
        if self.released(token) {
            return Ok((true, true));
        }
        let moved = self.progress()?;
        let done = self.released(token);
        Ok((moved || done, done))
    }
    /// The call that sent the messages of `send_from` failed and their
    /// sources are about to go away: afterwards this end never reads them
    /// (TCP keeps a copy of what it still has to send), and a receiver
    /// that still reads one from there is told it was abandoned.
    fn abandon(&mut self) {}
}

/// Arrived bytes of the incoming message, read in place.
#[derive(Debug)]
pub struct Piece<'a> {
    /// Length of the whole message.
    pub msg_len: usize,
    /// Offset of `data` in the message.
    pub offset: usize,
    /// The bytes; empty only for a message of length 0.
    pub data: &'a [u8],
    /// The message's tag (see [`Sender`]).
    pub tag: u64,
}

/// The receiving end of one connection.
pub trait Receiver: Send {
    /// The next arrived bytes of the current message, `None` if nothing has
    /// arrived. Errors when the peer is gone or sent something malformed.
    fn peek(&mut self) -> Result<Option<Piece<'_>>>;
    /// Releases the first `n` bytes of the last piece; the message is done
    /// when its last byte is consumed (for a 0-byte message: `consume(0)`).
    fn consume(&mut self, n: usize) -> Result<()>;
    /// Moves bytes on (sockets); true if anything moved.
    fn progress(&mut self) -> Result<bool>;
    /// Payload bytes consumed so far.
    fn bytes(&self) -> u64;
    /// The tag of the current message (the next one not yet consumed) once
    /// its header has arrived, `None` before. Providers that can land a
    /// message straight in its destination ([`recv_into`](Self::recv_into))
    /// read only the header here, so that still happens after.
    fn next_tag(&mut self) -> Result<Option<u64>> {
        Ok(self.peek()?.map(|p| p.tag))
    }
    /// Receives the current message (the next one not yet consumed)
    /// straight into `dst`, which must be exactly its length: call it until
    /// it says the message is complete (it is then consumed); (anything
    /// moved, complete). Providers skip the FIFO where they can: TCP reads
    /// the sockets into `dst` (when none of the message has arrived yet),
    /// shared memory copies a by-reference message from the sender's
    /// buffer. This default copies what [`peek`](Receiver::peek) shows.
    /// `dst` must stay alive until complete.
    fn recv_into(&mut self, dst: &Region) -> Result<(bool, bool)> {
        recv_by_peek(self, dst)
    }
    /// The call that received into a `recv_into` destination failed and
    /// the destination is about to go away: afterwards nothing is written
    /// there (a message landing there is lost, and the connection is
    /// failed: it is out of step).
    fn abandon(&mut self) {}
}

/// What a receiver says of a message whose length is not the one its step
/// expects (callers name the peer where they know it).
pub fn wrong_length(got: impl std::fmt::Display, want: usize) -> String {
    format!(
        "a message of {got} bytes arrived where {want} were expected: the ranks are running different operations \
         (set OXCCL_CHECK=1 to find the rank that differs)"
    )
}

/// [`Receiver::recv_into`] the plain way: copies what `peek` shows into
/// `dst` and consumes it; (anything moved, complete). Providers that
/// override `recv_into` fall back to it for messages they cannot land.
pub fn recv_by_peek<R: Receiver + ?Sized>(r: &mut R, dst: &Region) -> Result<(bool, bool)> {
    let mut moved = false;
    while let Some(piece) = r.peek()? {
        if piece.msg_len != dst.len() {
            return Err(Error::InvalidUsage(wrong_length(piece.msg_len, dst.len())));
        }
        let (off, n) = (piece.offset, piece.data.len());
        dst.sub(off, n)?.write(|d| d.copy_from_slice(piece.data))?;
        r.consume(n)?;
        moved = true;
        if off + n == dst.len() {
            return Ok((true, true));
        }
    }
    Ok((moved, false))
}

/// Bytes moved with one peer over one provider.
///
/// Two-sided traffic is counted at both ends (`sent` here is `recv` at
/// the peer); one-sided traffic at the rank that starts it: `put` bytes
/// this rank wrote into the peer's memory, `got` bytes it read from the
/// peer's memory (a peer that reads this rank's memory does not show up in
/// this rank's counters, since with shared memory, RDMA or CUDA IPC this
/// rank takes no part). Protocol bytes (headers, signals, descriptors) are
/// not counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerStats {
    /// The peer's rank.
    pub peer: usize,
    /// The provider.
    pub kind: Option<Kind>,
    /// Payload bytes sent to the peer in messages.
    pub sent: u64,
    /// Payload bytes received from the peer in messages.
    pub recv: u64,
    /// Bytes this rank wrote into the peer's registered memory.
    pub put: u64,
    /// Bytes this rank read from the peer's registered memory.
    pub got: u64,
}
