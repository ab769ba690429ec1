//! Native one-sided access over RDMA: a peer's registered buffer is read
//! with RDMA READ and written with RDMA WRITE, on a one-sided link (one QP)
//! per peer, set up at first use. Registrations are cached: registering
//! pins memory and costs far more than a copy of a small buffer, and a
//! call's buffers are usually the previous call's.
//!
//! The cache keeps up to [`CACHE`] page-aligned registrations (least
//! recently used out first). A cached registration stays valid after the
//! call that made it ended, as NCCL's registered user buffers do; the
//! fabric never hands its descriptor out again. On a real HCA a cached
//! registration pins the pages it was made on: memory freed and mapped
//! again at the same address would need the cache flushed (not done here;
//! see docs/RDMA.md).
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
            clock: 0,
            tickets: HashMap::new(),
            next: 1,
            wc: Vec::new(),
            registrations: 0,
        }
    }

    /// A registration covering `len` bytes at `addr` with `need`.
    fn mr(&mut self, addr: u64, len: u64, need: Access) -> Result<Mr> {
        self.clock += 1;
        let end = addr + len;
        if let Some(c) = self.cache.iter_mut().find(|c| c.start <= addr && end <= c.end && c.mr.access.covers(need)) {
            c.used = self.clock;
            return Ok(c.mr);
        }
        let start = addr & !(PAGE - 1);
        let stop = end.next_multiple_of(PAGE);
        let access = if need.remote_write || need.remote_read || need.local_write { need } else { Access::LOCAL };
        let dev = self.ep.local.dev.clone();
        // SAFETY: the pages hold a caller's region, which the communicator
        // keeps alive while a call uses it; a cached registration outlives
        // the call, but the fabric hands its key out only for live calls
        // and the HCA touches memory only for work requests of those.
        let mr = unsafe { dev.reg_mr(start, (stop - start) as usize, access) }.map_err(|e| {
            Error::System(format!("rank {}: registering {len} bytes for one-sided RDMA: {e}", self.ep.local.rank))
        })?;
        self.registrations += 1;
        if self.cache.len() >= CACHE {
            let old = self.cache.iter().enumerate().min_by_key(|(_, c)| c.used).map(|(i, _)| i).expect("full");
            let gone = self.cache.swap_remove(old);
            let _ = dev.dereg_mr(&gone.mr);
        }
        self.cache.push(Cached { start, end: stop, mr, used: self.clock });
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
        let mr =
            if region.is_empty() { None } else { Some(self.mr(region.addr() as u64, region.len() as u64, need)?) };
        desc.kind = Some(Kind::Rdma);
        desc.addr = region.addr() as u64;
        desc.len = region.len() as u64;
        desc.key = [0; 64];
        desc.key[..4].copy_from_slice(&mr.map_or(0, |m| m.rkey).to_le_bytes());
        Ok(())
    }

    fn unregister(&mut self, _desc: &MemDesc) {
        // Kept in the cache (see the module docs).
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
    }
}
