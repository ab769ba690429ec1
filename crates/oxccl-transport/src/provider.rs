//! The provider seam: what a transport implements to carry oxccl traffic.
//!
//! A [`Factory`] says which peers its provider can reach (same process,
//! same host, anyone) and opens this rank's side. The [`Provider`] it
//! returns publishes what peers need through the bootstrap, connects,
//! hands out two-sided connection ends ([`Sender`]/[`Receiver`], the FIFO
//! contract), makes progress, says what the engine's wait loop sleeps on
//! and which link parameters the tuner should use, and may offer native
//! one-sided access ([`Direct`]) to memory peers registered. The fabric
//! drives factories from one table (`fabric::registry`); nothing outside a
//! provider matches on its [`Kind`].
//!
//! Setup is collective and has the same shape for every provider: every
//! rank opens every factory of the table (also one that serves no peer),
//! all-gathers each provider's [`publish`](Provider::publish), calls
//! [`connect`](Provider::connect), meets the others at a barrier, then
//! calls [`ready`](Provider::ready).
//!
//! One-sided access without a native path (TCP) is emulated by the
//! fabric's control plane over the provider's own connections
//! (`control`), so every program runs on every provider.

use crate::bootstrap::{Bootstrap, PeerInfo};
use crate::futex::Doorbell;
use crate::region::Region;
use crate::wire::{u32_at, u64_at};
use crate::{Channel, Error, Kind, Receiver, Result, Sender};
use std::os::fd::RawFd;
use std::time::Duration;

/// A link's cost: bandwidth in bytes per second, latency in seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkCost {
    /// Bytes per second in each direction.
    pub bw: f64,
    /// Seconds from the start of a transfer to its first byte's use.
    pub lat: f64,
}

/// What a provider tells the tuner about its links.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkParams {
    /// Messages through the connections' FIFOs (two copies on shared
    /// memory, socket copies on TCP).
    pub fifo: LinkCost,
    /// One-sided gets and puts (a signal costs about `fifo.lat`).
    pub one_sided: LinkCost,
    /// Whether one-sided access is native (single copy) to every peer
    /// this provider serves, rather than emulated with messages.
    pub native: bool,
}

/// What a provider needs to open and connect.
pub struct Setup<'a> {
    /// This rank.
    pub rank: usize,
    /// Every rank's identity, from the bootstrap.
    pub peers: &'a [PeerInfo],
    /// The communicator's nonce (names, handshakes).
    pub nonce: [u8; 16],
    /// Bytes of each connection's FIFO (providers with settings of their
    /// own, as TCP, may use those instead).
    pub buffsize: usize,
    /// Deadline of set-up waits.
    pub timeout: Duration,
    /// Per rank: whether this provider carries traffic with it.
    pub serves: &'a [bool],
    /// The bootstrap (its local address picks the TCP interface).
    pub boot: &'a Bootstrap,
}

impl Setup<'_> {
    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.peers.len()
    }

    /// Each rank's index among the ranks of its host (by rank), from the
    /// bootstrap's host identities: which rail is "its own" where a host
    /// has as many rails as ranks.
    pub fn locals(&self) -> Vec<usize> {
        (0..self.peers.len()).map(|r| self.peers[..r].iter().filter(|p| p.host == self.peers[r].host).count()).collect()
    }

    /// Whether this provider serves any peer.
    pub fn serves_any(&self) -> bool {
        self.serves.iter().any(|&s| s)
    }
}

/// Makes providers of one kind. A factory holds its provider's own
/// settings (the fabric builds it from `FabricOptions`: see
/// `fabric::registry`); what every provider shares comes in [`Setup`].
pub trait Factory: Send + Sync {
    /// The kind of provider it makes.
    fn kind(&self) -> Kind;
    /// Whether this rank can use the provider at all; `Err` says why not
    /// (no library, no device). A provider carries traffic only between
    /// ranks where both say yes (the fabric all-gathers the answers).
    fn available(&self) -> std::result::Result<(), String> {
        Ok(())
    }
    /// Whether its provider can carry traffic between `me` and `peer`.
    fn reaches(&self, me: &PeerInfo, peer: &PeerInfo) -> bool;
    /// Opens this rank's side (collective: every rank opens every factory).
    fn open(&self, setup: &Setup<'_>) -> Result<Box<dyn Provider>>;
}

/// What the engine's wait loop sleeps on for one provider.
#[derive(Clone, Debug, Default)]
pub struct Wake {
    /// Peers ring this rank's doorbell when data or room arrives.
    pub rings_bell: bool,
    /// Descriptors to poll for readability (sockets).
    pub fds: Vec<RawFd>,
}

/// One rank's side of a transport.
pub trait Provider: Send {
    /// Its kind.
    fn kind(&self) -> Kind;
    /// Link parameters for the tuner (measured or tabled).
    fn link(&self) -> LinkParams;
    /// A doorbell in memory that other processes can ring, if this
    /// provider owns one (it becomes the rank's doorbell).
    fn shared_bell(&self) -> Option<Doorbell> {
        None
    }
    /// What peers need to connect, all-gathered through the bootstrap.
    fn publish(&self) -> Vec<u8>;
    /// Connects with every rank's published bytes; `bell` is this rank's
    /// doorbell (peers of providers that ring one ring it).
    fn connect(&mut self, setup: &Setup<'_>, published: &[Vec<u8>], bell: &Doorbell) -> Result<()>;
    /// After every rank has connected: release what only setup needed.
    fn ready(&mut self) -> Result<()> {
        Ok(())
    }
    /// The sending end to `peer` on `ch` (each once).
    fn sender(&mut self, peer: usize, ch: Channel) -> Result<Box<dyn Sender>>;
    /// The receiving end from `peer` on `ch` (each once).
    fn receiver(&mut self, peer: usize, ch: Channel) -> Result<Box<dyn Receiver>>;
    /// How traffic to `peer` (`sending`) or from it on channel `ch`
    /// travels, for messages (the interface or port of its rail), where
    /// there is more to say than the provider's kind.
    fn route(&self, _peer: usize, _ch: Channel, _sending: bool) -> Option<String> {
        None
    }
    /// How many rails (interfaces, HCA ports) this provider's channels
    /// spread over, after [`connect`](Provider::connect): see
    /// [`rail_of`].
    fn rails(&self) -> usize {
        1
    }
    /// Whether this provider's connections move bytes only in `progress`
    /// (sockets), so the fabric must call it on every poll.
    fn needs_progress(&self) -> bool {
        false
    }
    /// Provider-wide progress (accepting connections); true if anything
    /// happened.
    fn progress(&mut self) -> Result<bool> {
        Ok(false)
    }
    /// What to sleep on.
    fn wake(&self) -> Wake;
    /// An error naming the peer if one this provider serves has died, or
    /// this rank's own failure (a rail down). `peer_failed`: a peer is
    /// known to have failed, so a local fault seen only just now is taken
    /// as the cause rather than waited on as a possible flap.
    fn check(&mut self, _peer_failed: bool) -> Result<()> {
        Ok(())
    }
    /// Native one-sided access, if this provider has one.
    fn direct(&mut self) -> Option<&mut dyn Direct> {
        None
    }
    /// Shuts the provider's connections down (peers see them close).
    fn close(&mut self) {}
    /// This rank closes its communicator (it said goodbye): say so where
    /// peers look when its process ends, so that the end is no failure.
    fn closing(&mut self) {}
}

/// Where a started one-sided operation stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pending {
    /// Complete: the data is in place.
    Done,
    /// Still moving; ask [`Direct::test`] with this ticket.
    Ticket(u64),
}

/// Native one-sided access: registered memory that peers read and write
/// without the owner's involvement (cross-memory attach, RDMA, CUDA IPC).
pub trait Direct: Send {
    /// Whether this rank can reach `peer`'s registered memory natively (the
    /// kernel may refuse some peers: then the fabric emulates).
    fn reaches(&self, peer: usize) -> bool;
    /// Makes `region` accessible to peers until
    /// [`unregister`](Direct::unregister): fills the native part of a
    /// descriptor (`addr`, `len`, `key`).
    fn register(&mut self, region: &Region, desc: &mut MemDesc) -> Result<()>;
    /// Ends a registration: afterwards no peer can use the descriptor.
    fn unregister(&mut self, desc: &MemDesc);
    /// Starts copying `dst.len()` bytes at `off` of `peer`'s memory `desc`
    /// into `dst`.
    fn read(&mut self, peer: usize, desc: &MemDesc, off: usize, dst: &Region) -> Result<Pending>;
    /// Starts copying `src` into `peer`'s memory `desc` at `off`.
    fn write(&mut self, peer: usize, src: &Region, desc: &MemDesc, off: usize) -> Result<Pending>;
    /// Whether the operation of `ticket` is complete.
    fn test(&mut self, _ticket: u64) -> Result<bool> {
        Ok(true)
    }
    /// Abandons the operation of `ticket` (its call failed): once this
    /// returns, its source and destination are not touched (a provider
    /// whose operations run asynchronously stops them, at whatever cost).
    fn forget(&mut self, _ticket: u64) {}
    /// Runs `f` on a view of `len` bytes at `off` of `peer`'s memory, if
    /// this provider can give one (ranks of one process): a reduction
    /// then reads the peer's bytes once, with no copy. `Ok(false)`: no
    /// view; read instead.
    fn with_view(
        &mut self,
        _peer: usize,
        _desc: &MemDesc,
        _off: usize,
        _len: usize,
        _f: &mut dyn FnMut(&Region) -> Result<()>,
    ) -> Result<bool> {
        Ok(false)
    }
}

/// Bytes of an encoded [`MemDesc`].
pub const DESC_LEN: usize = 96;

/// A serializable, bytes-only descriptor of registered memory, what a peer
/// needs to read or write it: the registering rank, the provider that
/// registered it natively (if any) with its address, length and opaque key
/// (a pid and a revocation slot for shared memory; an RDMA rkey; a CUDA
/// IPC handle), and the id under which the fabric's emulation serves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemDesc {
    /// Provider of the native registration, if any.
    pub kind: Option<Kind>,
    /// The registering rank.
    pub owner: u32,
    /// Peers may write it.
    pub writable: bool,
    /// Id in the owner's emulation registry (gets and puts by message).
    pub emu_id: u64,
    /// Address in the owner's address space (native).
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// The native provider's key.
    pub key: [u8; 64],
}

impl MemDesc {
    /// A descriptor of `len` bytes registered by `owner` for emulation only.
    pub fn emulated(owner: usize, emu_id: u64, len: usize, writable: bool) -> MemDesc {
        MemDesc { kind: None, owner: owner as u32, writable, emu_id, addr: 0, len: len as u64, key: [0; 64] }
    }

    /// The fixed 96-byte form.
    pub fn encode(&self) -> [u8; DESC_LEN] {
        let mut b = [0u8; DESC_LEN];
        b[0] = self.kind.map_or(0, Kind::code);
        b[1] = self.writable as u8;
        b[4..8].copy_from_slice(&self.owner.to_le_bytes());
        b[8..16].copy_from_slice(&self.emu_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.addr.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b[32..96].copy_from_slice(&self.key);
        b
    }

    /// Parses [`encode`](MemDesc::encode)'s form; `from` names the sender
    /// in errors.
    pub fn decode(b: &[u8], from: usize) -> Result<MemDesc> {
        let bad = |why: &str| Error::Remote(format!("rank {from} sent a malformed memory descriptor: {why}"));
        if b.len() != DESC_LEN {
            return Err(bad(&format!("{} bytes instead of {DESC_LEN}", b.len())));
        }
        let kind = match b[0] {
            0 => None,
            c => Some(Kind::from_code(c).ok_or_else(|| bad(&format!("unknown provider code {c}")))?),
        };
        if b[1] > 1 {
            return Err(bad("bad flags"));
        }
        let mut key = [0u8; 64];
        key.copy_from_slice(&b[32..96]);
        Ok(MemDesc {
            kind,
            owner: u32_at(b, 4),
            writable: b[1] == 1,
            emu_id: u64_at(b, 8),
            addr: u64_at(b, 16),
            len: u64_at(b, 24),
            key,
        })
    }

    /// Checks that `[off, off + len)` lies inside the registered memory
    /// (and that it may be written, for a write); `what` names the access.
    pub fn check(&self, off: usize, len: usize, write: bool, what: impl Fn() -> String) -> Result<()> {
        let end = off.checked_add(len).map(|e| e as u64);
        if end.is_none_or(|e| e > self.len) {
            return Err(Error::invalid(format!(
                "{}: bytes {off}..+{len} are outside the {} bytes rank {} registered",
                what(),
                self.len,
                self.owner
            )));
        }
        if write && !self.writable {
            return Err(Error::invalid(format!("{}: rank {}'s buffer is read-only (its input)", what(), self.owner)));
        }
        Ok(())
    }
}

/// The rail of a connection on channel `ch` whose sending rank is the
/// `local`-th of its host, among `rails`: `(ch + local) mod rails`. Both
/// ends compute the same. With as many rails as ranks per host and one
/// channel, local rank `i` sends on rail `i` (NCCL's rail-optimized
/// layout: the rail-aligned exchanges of `hier` never leave their rail);
/// with more channels, each rank's channels take the rails in turn.
pub fn rail_of(ch: Channel, local: usize, rails: usize) -> usize {
    (ch as usize + local) % rails.max(1)
}

/// [`rail_of`] for rank `me`'s connection to `peer` (`sending`) or from
/// it: the sender's index on its host from `locals` ([`Setup::locals`]).
pub fn rail_between(locals: &[usize], me: usize, peer: usize, ch: Channel, sending: bool, rails: usize) -> usize {
    rail_of(ch, locals.get(if sending { me } else { peer }).copied().unwrap_or(0), rails)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_round_trip_and_reject_garbage() {
        let mut d = MemDesc::emulated(3, 77, 4096, true);
        d.kind = Some(Kind::Shm);
        d.addr = 0xdead_beef;
        d.key[5] = 9;
        let b = d.encode();
        assert_eq!(MemDesc::decode(&b, 3).unwrap(), d);
        assert!(MemDesc::decode(&b[..95], 3).unwrap_err().to_string().contains("rank 3"));
        let mut bad = b;
        bad[0] = 200;
        assert!(MemDesc::decode(&bad, 1).unwrap_err().to_string().contains("provider code 200"));
        assert!(d.check(4000, 96, true, || "get".into()).is_ok());
        let e = d.check(4000, 97, false, || "get from rank 3".into()).unwrap_err().to_string();
        assert!(e.contains("get from rank 3: bytes") && e.contains("outside the 4096 bytes rank 3 registered"), "{e}");
        d.writable = false;
        assert!(d.check(0, 1, true, || "put".into()).unwrap_err().to_string().contains("read-only"));
        assert!(d.check(usize::MAX, 2, false, || "x".into()).is_err());
    }

    #[test]
    fn rails_follow_local_ranks_then_channels() {
        // 2 rails, one channel: local rank i on rail i.
        assert_eq!((0..4).map(|i| rail_of(0, i, 2)).collect::<Vec<_>>(), [0, 1, 0, 1]);
        // Two channels of one rank take both rails, starting at its own.
        assert_eq!([rail_of(0, 1, 2), rail_of(1, 1, 2)], [1, 0]);
        assert_eq!(rail_of(5, 3, 1), 0);
        assert_eq!(rail_of(0, 0, 0), 0, "no rails is one");
    }
}
