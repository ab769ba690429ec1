//! The in-process provider: ranks that are threads of one process.
//!
//! Ranks of one communicator find each other through a process-global
//! [`Hub`] keyed by a `u128` (the communicator's unique id). Each
//! connection (source, destination, channel) is a heap [`Ring`] created on
//! the first [`Hub::sender`] or [`Hub::receiver`] call for it; each end is
//! handed out once. The producer rings the destination's doorbell, the
//! consumer the source's. When one end is dropped, the other end's calls
//! fail with [`Error::Remote`] naming the peer.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Weak};

use parking_lot::Mutex;

use crate::futex::Doorbell;
use crate::ring::{Label, Ring};
use crate::{Channel, Error, Receiver, Result, Sender};

static HUBS: LazyLock<Mutex<HashMap<u128, Weak<Hub>>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// The meeting point of the ranks of one communicator inside a process.
pub struct Hub {
    key: u128,
    nranks: usize,
    bells: Vec<Doorbell>,
    rings: Mutex<HashMap<(usize, usize, Channel), Ring>>,
}

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
            bells: (0..nranks).map(|_| Doorbell::heap()).collect(),
            rings: Mutex::new(HashMap::new()),
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
        Ok(self.bells[rank].clone())
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
        let p = r.producer(self.bells[dst].clone(), Label { peer: dst, ch })?;
        Ok(Box::new(p))
    }

    /// The receiving end of connection `src` → `dst` on `ch` (once).
    pub fn receiver(&self, src: usize, dst: usize, ch: Channel, capacity: usize) -> Result<Box<dyn Receiver>> {
        let r = self.ring(src, dst, ch, capacity)?;
        let c = r.consumer(self.bells[src].clone(), Label { peer: src, ch })?;
        Ok(Box::new(c))
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
