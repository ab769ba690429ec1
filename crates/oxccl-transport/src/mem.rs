//! The in-process provider: ranks that are threads of one process.
//!
//! Ranks of one communicator find each other through a process-global
//! [`Hub`] keyed by a `u128` (the communicator's unique id). Each
//! connection (source, destination, channel) is a heap [`Ring`] created on
//! the first [`Hub::sender`] or [`Hub::receiver`] call for it; each end is
//! handed out once. The producer rings the destination's doorbell, the
//! consumer the source's. When one end is dropped, the other end's calls
//! fail with [`Error::Remote`] naming the peer.
//!
//! One-sided access is native ([`MemProvider`]'s [`Direct`]): a rank
//! registers a region in the hub; a peer reads or writes it with a plain
//! copy, or reduces straight from it, under the registration's read lock,
//! and unregistering takes the write lock, so it waits for a copy in
//! progress and no peer touches the memory afterwards.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, LazyLock, Weak};

use parking_lot::{Mutex, RwLock};

use crate::bootstrap::PeerInfo;
use crate::futex::Doorbell;
use crate::provider::{Direct, Factory, LinkCost, LinkParams, MemDesc, Pending, Provider, Setup, Wake};
use crate::region::Region;
use crate::ring::{Label, Ring};
use crate::{Channel, Error, Kind, Receiver, Result, Sender};

static HUBS: LazyLock<Mutex<HashMap<u128, Weak<Hub>>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// The meeting point of the ranks of one communicator inside a process.
pub struct Hub {
    key: u128,
    nranks: usize,
    bells: Mutex<Vec<Doorbell>>,
    rings: Mutex<HashMap<(usize, usize, Channel), Ring>>,
    regs: Mutex<HashMap<(usize, u64), Registration>>,
    next_reg: AtomicU64,
}

/// A region a rank registered: `None` once unregistered.
type Registration = Arc<RwLock<Option<Region>>>;

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Hub({:#x}, {} ranks)", self.key, self.nranks)
    }
}

impl Hub {
    /// The hub for `key`, created if no rank holds it. Every rank of a
    /// communicator passes the same `nranks`; a different count is an error.
    /// The hub goes away when the last `Arc` is dropped.
    pub fn get(key: u128, nranks: usize) -> Result<Arc<Hub>> {
        if nranks == 0 {
            return Err(Error::invalid("mem hub with 0 ranks: nranks must be at least 1"));
        }
        let mut hubs = HUBS.lock();
        hubs.retain(|_, w| w.strong_count() > 0);
        if let Some(h) = hubs.get(&key).and_then(Weak::upgrade) {
            if h.nranks != nranks {
                return Err(Error::invalid(format!(
                    "mem hub {key:#x} has {} ranks but this rank asked for {nranks}: every rank of a \
                     communicator must pass the same nranks",
                    h.nranks
                )));
            }
            return Ok(h);
        }
        let h = Arc::new(Hub {
            key,
            nranks,
            bells: Mutex::new((0..nranks).map(|_| Doorbell::heap()).collect()),
            rings: Mutex::new(HashMap::new()),
            regs: Mutex::new(HashMap::new()),
            next_reg: AtomicU64::new(1),
        });
        hubs.insert(key, Arc::downgrade(&h));
        Ok(h)
    }

    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// The doorbell of `rank` (rung by its peers' commits and consumes).
    pub fn doorbell(&self, rank: usize) -> Result<Doorbell> {
        self.check_rank(rank, "doorbell")?;
        Ok(self.bells.lock()[rank].clone())
    }

    /// Makes `bell` the doorbell of `rank` (a rank's one doorbell, which its
    /// shared-memory peers ring too); before any connection is made.
    pub fn set_doorbell(&self, rank: usize, bell: Doorbell) -> Result<()> {
        self.check_rank(rank, "doorbell")?;
        self.bells.lock()[rank] = bell;
        Ok(())
    }

    fn check_rank(&self, rank: usize, what: &str) -> Result<()> {
        if rank >= self.nranks {
            return Err(Error::invalid(format!("{what}: rank {rank} out of range for {} ranks", self.nranks)));
        }
        Ok(())
    }

    fn ring(&self, src: usize, dst: usize, ch: Channel, capacity: usize) -> Result<Ring> {
        self.check_rank(src, "mem connection source")?;
        self.check_rank(dst, "mem connection destination")?;
        let mut rings = self.rings.lock();
        if let Some(r) = rings.get(&(src, dst, ch)) {
            if r.capacity() != capacity {
                return Err(Error::invalid(format!(
                    "mem connection {src}->{dst} channel {ch}: capacity {capacity} differs from the other \
                     end's {}; both ends must use the same FIFO size",
                    r.capacity()
                )));
            }
            return Ok(r.clone());
        }
        let r = Ring::heap(capacity)?;
        rings.insert((src, dst, ch), r.clone());
        Ok(r)
    }

    /// The sending end of connection `src` → `dst` on `ch` (once).
    pub fn sender(&self, src: usize, dst: usize, ch: Channel, capacity: usize) -> Result<Box<dyn Sender>> {
        let r = self.ring(src, dst, ch, capacity)?;
        let p = r.producer(self.doorbell(dst)?, Label { peer: dst, ch })?;
        Ok(Box::new(p))
    }

    /// The receiving end of connection `src` → `dst` on `ch` (once).
    pub fn receiver(&self, src: usize, dst: usize, ch: Channel, capacity: usize) -> Result<Box<dyn Receiver>> {
        let r = self.ring(src, dst, ch, capacity)?;
        let c = r.consumer(self.doorbell(src)?, Label { peer: src, ch })?;
        Ok(Box::new(c))
    }

    /// Registers `region` of `rank`; the registration's id.
    pub fn register(&self, rank: usize, region: Region) -> Result<u64> {
        self.check_rank(rank, "registration")?;
        let id = self.next_reg.fetch_add(1, AtomicOrdering::Relaxed);
        self.regs.lock().insert((rank, id), Arc::new(RwLock::new(Some(region))));
        Ok(id)
    }

    /// Ends registration `id` of `rank`, waiting for a peer's copy in
    /// progress.
    pub fn unregister(&self, rank: usize, id: u64) {
        let reg = self.regs.lock().remove(&(rank, id));
        if let Some(r) = reg {
            *r.write() = None;
        }
    }

    /// Runs `f` on bytes `[off, off + len)` of registration `id` of
    /// `owner`, under its read lock; an error if it is gone.
    pub fn with_registered<R>(
        &self,
        owner: usize,
        id: u64,
        off: usize,
        len: usize,
        f: impl FnOnce(&Region) -> Result<R>,
    ) -> Result<R> {
        let reg = self.regs.lock().get(&(owner, id)).cloned();
        let gone = || {
            Error::Remote(format!(
                "rank {owner}'s buffer (registration {id}) is no longer registered: it left the call (or \
                 failed) while a peer still used it"
            ))
        };
        let reg = reg.ok_or_else(gone)?;
        let guard = reg.read();
        let region = guard.as_ref().ok_or_else(gone)?;
        let part = region.sub(off, len).map_err(|_| {
            Error::invalid(format!(
                "bytes {off}..+{len} are outside the {} bytes rank {owner} registered",
                region.len()
            ))
        })?;
        f(&part)
    }
}

/// Makes [`MemProvider`]s: ranks that are threads of one process.
pub struct MemFactory;

impl Factory for MemFactory {
    fn kind(&self) -> Kind {
        Kind::Mem
    }
    fn reaches(&self, me: &PeerInfo, peer: &PeerInfo) -> bool {
        me.host == peer.host && me.pid == peer.pid
    }
    fn open(&self, setup: &Setup<'_>) -> Result<Box<dyn Provider>> {
        let hub = Hub::get(u128::from_le_bytes(setup.nonce), setup.nranks())?;
        Ok(Box::new(MemProvider { hub, rank: setup.rank, buffsize: setup.buffsize }))
    }
}

/// One rank's side of the in-process provider.
pub struct MemProvider {
    hub: Arc<Hub>,
    rank: usize,
    buffsize: usize,
}

impl Provider for MemProvider {
    fn kind(&self) -> Kind {
        Kind::Mem
    }
    fn link(&self) -> LinkParams {
        // Measured on the 2-core development VM: a FIFO message costs two
        // copies; a one-sided access one.
        LinkParams { fifo: LinkCost { bw: 8e9, lat: 2e-6 }, one_sided: LinkCost { bw: 12e9, lat: 1e-6 }, native: true }
    }
    fn publish(&self) -> Vec<u8> {
        Vec::new()
    }
    fn connect(&mut self, _setup: &Setup<'_>, _published: &[Vec<u8>], bell: &Doorbell) -> Result<()> {
        self.hub.set_doorbell(self.rank, bell.clone())
    }
    fn sender(&mut self, peer: usize, ch: Channel) -> Result<Box<dyn Sender>> {
        self.hub.sender(self.rank, peer, ch, self.buffsize)
    }
    fn receiver(&mut self, peer: usize, ch: Channel) -> Result<Box<dyn Receiver>> {
        self.hub.receiver(peer, self.rank, ch, self.buffsize)
    }
    fn wake(&self) -> Wake {
        Wake { rings_bell: true, fds: Vec::new() }
    }
    fn direct(&mut self) -> Option<&mut dyn Direct> {
        Some(self)
    }
}

fn reg_id(desc: &MemDesc) -> u64 {
    u64::from_le_bytes(desc.key[..8].try_into().expect("8 bytes"))
}

impl Direct for MemProvider {
    fn reaches(&self, _peer: usize) -> bool {
        true
    }
    fn register(&mut self, region: &Region, desc: &mut MemDesc) -> Result<()> {
        let id = self.hub.register(self.rank, *region)?;
        desc.kind = Some(Kind::Mem);
        desc.addr = region.addr() as u64;
        desc.key[..8].copy_from_slice(&id.to_le_bytes());
        Ok(())
    }
    fn unregister(&mut self, desc: &MemDesc) {
        self.hub.unregister(self.rank, reg_id(desc));
    }
    fn read(&mut self, peer: usize, desc: &MemDesc, off: usize, dst: &Region) -> Result<Pending> {
        self.hub.with_registered(peer, reg_id(desc), off, dst.len(), |src| dst.copy_from(src))?;
        Ok(Pending::Done)
    }
    fn write(&mut self, peer: usize, src: &Region, desc: &MemDesc, off: usize) -> Result<Pending> {
        self.hub.with_registered(peer, reg_id(desc), off, src.len(), |dst| dst.copy_from(src))?;
        Ok(Pending::Done)
    }
    fn with_view(
        &mut self,
        peer: usize,
        desc: &MemDesc,
        off: usize,
        len: usize,
        f: &mut dyn FnMut(&Region) -> Result<()>,
    ) -> Result<bool> {
        self.hub.with_registered(peer, reg_id(desc), off, len, |r| f(r))?;
        Ok(true)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn same_key_same_hub_and_goes_away() {
        let a = Hub::get(0xabc1, 2).unwrap();
        let b = Hub::get(0xabc1, 2).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert!(Hub::get(0xabc1, 3).is_err());
        drop((a, b));
        let c = Hub::get(0xabc1, 3).unwrap();
        assert_eq!(c.nranks(), 3);
    }

    #[test]
    fn ends_once_and_dead_peer_named() {
        let h = Hub::get(0xabc2, 4).unwrap();
        let mut s = h.sender(1, 3, 0, 4096).unwrap();
        let e = h.sender(1, 3, 0, 4096).err().unwrap().to_string();
        assert!(e.contains("already handed out"), "{e}");
        assert!(h.receiver(1, 3, 0, 8192).is_err(), "capacity mismatch");
        let r = h.receiver(1, 3, 0, 4096).unwrap();
        let seen = h.doorbell(1).unwrap().seq();
        drop(r);
        assert_ne!(h.doorbell(1).unwrap().seq(), seen, "closing rang the peer");
        let e = s.begin(4).unwrap_err();
        assert!(matches!(e, Error::Remote(_)));
        assert!(e.to_string().contains("rank 3 closed its connection on channel 0"), "{e}");
        assert!(h.doorbell(4).is_err());
    }
}
