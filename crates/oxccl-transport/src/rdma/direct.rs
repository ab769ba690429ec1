//! Native one-sided access over RDMA: a peer's registered buffer is read
//! with RDMA READ and written with RDMA WRITE, on a one-sided link (one QP)
//! per peer, set up at first use. Registrations are cached: registering
//! pins memory and costs far more than a copy of a small buffer, and a
//! call's buffers are usually the previous call's.
//!
//! Two kinds of registration:
//! - **local** (the source or destination of this rank's own READ and
//!   WRITE work requests; no peer can use them): cached, up to [`CACHE`]
//!   page-aligned registrations, least recently used out first;
//! - **exposed** (a call's buffers that peers read or write): made per
//!   call and deregistered when the call ends ([`Direct::unregister`]),
//!   so no peer reaches them afterwards, whatever it still has in flight
//!   (a failed call's peers may), and whatever the application does with
//!   the memory next. Keeping them too would need memory windows bound per
//!   call (see docs/RDMA.md).
//!
//! On a real HCA a cached registration pins the pages it was made on:
//! memory freed and mapped again at the same address would need the cache
//! flushed (not done here; see docs/RDMA.md).
#![allow(unsafe_code)]

use super::conn::Link;
use super::setup::{self, Conn, Endpoint};
use super::verbs::{Access, Completion, Mr, Opcode, SendWr, Status};
use crate::provider::{Direct, MemDesc, Pending};
use crate::region::Region;
use crate::{Error, Kind, Result};
use std::collections::HashMap;
use std::sync::Arc;

/// Registrations kept.
const CACHE: usize = 64;
/// Largest piece of one work request.
const PIECE: u64 = 1 << 30;
const PAGE: u64 = 4096;

struct Cached {
    start: u64,
    end: u64,
    mr: Mr,
    used: u64,
}

struct Ticket {
    peer: usize,
    left: u32,
}

/// One-sided state of a rank.
pub(crate) struct DirectState {
    ep: Arc<Endpoint>,
    links: HashMap<usize, Link>,
    cache: Vec<Cached>,
    /// Exposed registrations by rkey, until their call ends.
    exposed: HashMap<u32, Mr>,
    clock: u64,
    tickets: HashMap<u64, Ticket>,
    next: u64,
    wc: Vec<Completion>,
    /// Registrations made (for tests and the log).
    pub(crate) registrations: u64,
}

impl DirectState {
    pub(crate) fn new(ep: Arc<Endpoint>) -> DirectState {
        DirectState {
            ep,
            links: HashMap::new(),
            cache: Vec::new(),
            exposed: HashMap::new(),
            clock: 0,
            tickets: HashMap::new(),
            next: 1,
            wc: Vec::new(),
            registrations: 0,
        }
    }

    /// A local registration covering `len` bytes at `addr` with `need`
    /// (no remote rights), from the cache where one covers it.
    fn mr(&mut self, addr: u64, len: u64, need: Access) -> Result<Mr> {
        self.clock += 1;
        let end = addr + len;
        if let Some(c) = self.cache.iter_mut().find(|c| c.start <= addr && end <= c.end && c.mr.access.covers(need)) {
            c.used = self.clock;
            return Ok(c.mr);
        }
        // SAFETY: the pages hold a caller's region, which the communicator
        // keeps alive while a call uses it; a cached registration outlives
        // the call, but grants no peer anything, and this HCA touches the
        // memory only for work requests of live calls.
        let mr = unsafe { self.reg(addr, len, Access::LOCAL) }?;
        let dev = self.ep.local.dev.clone();
        if self.cache.len() >= CACHE {
            let old = self.cache.iter().enumerate().min_by_key(|(_, c)| c.used).map(|(i, _)| i).expect("full");
            let gone = self.cache.swap_remove(old);
            let _ = dev.dereg_mr(&gone.mr);
        }
        self.cache.push(Cached { start: mr.addr, end: mr.addr + mr.len, mr, used: self.clock });
        Ok(mr)
    }

    /// Registers the pages around `len` bytes at `addr` with `access`.
    ///
    /// # Safety
    /// The pages stay allocated until the registration ends (`reg_mr`'s
    /// contract).
    unsafe fn reg(&mut self, addr: u64, len: u64, access: Access) -> Result<Mr> {
        let start = addr & !(PAGE - 1);
        let stop = (addr + len).next_multiple_of(PAGE);
        // SAFETY: the caller's promise.
        let mr = unsafe { self.ep.local.dev.reg_mr(start, (stop - start) as usize, access) }.map_err(|e| {
            Error::System(format!("rank {}: registering {len} bytes for one-sided RDMA: {e}", self.ep.local.rank))
        })?;
        self.registrations += 1;
        Ok(mr)
    }

    fn link(&mut self, peer: usize) -> Result<&mut Link> {
        if !self.links.contains_key(&peer) {
            match setup::connect(&self.ep, peer, None)? {
                Conn::OneSided(l) => {
                    self.links.insert(peer, l);
                }
                Conn::Data(_) => {
                    return Err(Error::Internal("a data connection where a one-sided link was asked".into()));
                }
            }
        }
        Ok(self.links.get_mut(&peer).expect("inserted"))
    }

    /// Posts `op` between the local `region` (registered under `lkey`)
    /// and `peer`'s memory `desc` at `off`, in pieces of at most [`PIECE`].
    fn start(
        &mut self,
        peer: usize,
        op: Opcode,
        region: &Region,
        lkey: u32,
        desc: &MemDesc,
        off: usize,
    ) -> Result<Pending> {
        let (laddr, len) = (region.addr() as u64, region.len() as u64);
        let rkey = u32::from_le_bytes(desc.key[..4].try_into().expect("4 bytes"));
        let t = self.next;
        self.next += 1;
        let parts = len.div_ceil(PIECE);
        let wrs: Vec<SendWr> = (0..parts)
            .map(|k| {
                let o = k * PIECE;
                SendWr {
                    wr_id: (t << 16) | k,
                    op,
                    local: laddr + o,
                    len: (len - o).min(PIECE) as u32,
                    lkey,
                    remote: desc.addr + off as u64 + o,
                    rkey,
                    signaled: true,
                }
            })
            .collect();
        let link = self.link(peer)?;
        link.qps[0].post_send(&wrs)?;
        self.tickets.insert(t, Ticket { peer, left: parts as u32 });
        Ok(Pending::Ticket(t))
    }

    /// Drops the link to `peer` with every ticket on it (its QP failed,
    /// or the peer left); the next access to that peer connects again.
    fn drop_link(&mut self, peer: usize) {
        self.links.remove(&peer);
        self.tickets.retain(|_, t| t.peer != peer);
    }
}

impl Direct for DirectState {
    fn reaches(&self, peer: usize) -> bool {
        self.ep.card(peer).is_ok()
    }

    fn register(&mut self, region: &Region, desc: &mut MemDesc) -> Result<()> {
        let need = if region.writable() {
            Access::ALL
        } else {
            Access { local_write: false, remote_write: false, remote_read: true }
        };
        let mr = if region.is_empty() {
            None
        } else {
            // SAFETY: the communicator keeps a call's buffers alive until
            // the call ends, and unregister ends this registration then.
            let mr = unsafe { self.reg(region.addr() as u64, region.len() as u64, need) }?;
            self.exposed.insert(mr.rkey, mr);
            Some(mr)
        };
        desc.kind = Some(Kind::Rdma);
        desc.addr = region.addr() as u64;
        desc.len = region.len() as u64;
        desc.key = [0; 64];
        desc.key[..4].copy_from_slice(&mr.map_or(0, |m| m.rkey).to_le_bytes());
        Ok(())
    }

    fn unregister(&mut self, desc: &MemDesc) {
        let rkey = u32::from_le_bytes(desc.key[..4].try_into().expect("4 bytes"));
        if let Some(mr) = self.exposed.remove(&rkey) {
            // The soft HCA waits here for an access in progress; a real
            // one refuses the rkey from now on.
            let _ = self.ep.local.dev.dereg_mr(&mr);
        }
    }

    fn read(&mut self, peer: usize, desc: &MemDesc, off: usize, dst: &Region) -> Result<Pending> {
        if !dst.writable() {
            return Err(Error::Internal("a one-sided read into a read-only region".into()));
        }
        if dst.is_empty() {
            return Ok(Pending::Done);
        }
        let mr = self.mr(dst.addr() as u64, dst.len() as u64, Access::LOCAL)?;
        self.start(peer, Opcode::Read, dst, mr.lkey, desc, off)
    }

    fn write(&mut self, peer: usize, src: &Region, desc: &MemDesc, off: usize) -> Result<Pending> {
        if src.is_empty() {
            return Ok(Pending::Done);
        }
        let mr = self.mr(src.addr() as u64, src.len() as u64, Access::default())?;
        self.start(peer, Opcode::Write, src, mr.lkey, desc, off)
    }

    /// An operation still in flight is stopped the only way RC allows:
    /// the peer's one-sided link (its QP) goes, and a later access sets up
    /// a new one.
    fn forget(&mut self, ticket: u64) {
        if let Some(t) = self.tickets.remove(&ticket)
            && t.left > 0
        {
            self.drop_link(t.peer);
        }
    }

    fn test(&mut self, ticket: u64) -> Result<bool> {
        let Some(peer) = self.tickets.get(&ticket).map(|t| t.peer) else { return Ok(true) };
        let mut wc = std::mem::take(&mut self.wc);
        wc.clear();
        let link = self.links.get_mut(&peer).expect("a ticket's link exists");
        link.check_side();
        let polled = link.cq.poll(&mut wc, 64);
        let who = link.who.clone();
        let gone = link.gone.clone();
        polled?;
        for c in &wc {
            if c.status != Status::Success {
                // The QP is in the error state (RC).
                self.drop_link(peer);
                let e = who.completion("one-sided access", c);
                self.wc = wc;
                return Err(e);
            }
            if let Some(t) = self.tickets.get_mut(&(c.wr_id >> 16)) {
                t.left -= 1;
            }
        }
        self.wc = wc;
        if self.tickets.get(&ticket).is_some_and(|t| t.left == 0) {
            self.tickets.remove(&ticket);
            return Ok(true);
        }
        if let Some(e) = gone {
            self.drop_link(peer);
            return Err(e);
        }
        Ok(false)
    }
}

impl Drop for DirectState {
    fn drop(&mut self) {
        // QPs first (they may still touch registered memory), then the cache.
        self.links.clear();
        for c in self.cache.drain(..) {
            let _ = self.ep.local.dev.dereg_mr(&c.mr);
        }
        for (_, mr) in self.exposed.drain() {
            let _ = self.ep.local.dev.dereg_mr(&mr);
        }
    }
}
