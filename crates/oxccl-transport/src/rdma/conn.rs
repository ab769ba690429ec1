//! Two-sided connections over RC queue pairs: a FIFO in the receiver's
//! registered memory, written by RDMA WRITE_WITH_IMM from the sender's
//! registered staging FIFO, with credits written back.
//!
//! Both FIFOs have the same capacity and layout, so a byte at stream
//! position `p` lives at `p mod capacity` on both sides: the sender writes
//! bytes where they will land. Messages are framed as in the shared-memory
//! ring: a 64-byte header record (magic, length), then the payload padded
//! to 64, so payloads start 64-aligned.
//!
//! - Stream positions are cut into chunks of `OXCCL_IB_CHUNK` (a power of
//!   two dividing the capacity, so no write crosses the wrap); chunk `k`
//!   travels on QP `k mod qps`. Every data write carries an immediate (its
//!   end position's low 32 bits), so the receiver learns of each arrival
//!   from a completion: per QP it advances a cursor over that QP's chunks,
//!   and the bytes below the smallest cursor have all landed (RC orders
//!   placement per QP only).
//! - The receiver keeps `RECV_DEPTH` receives posted per QP and reposts one
//!   per arrival; the sender keeps fewer than that many writes per QP
//!   whose bytes are not yet credited, so a write never finds no receive.
//! - Credits: after consuming, the receiver posts a 0-byte WRITE_WITH_IMM
//!   on QP 0 whose immediate is its consumed position (low 32 bits); the
//!   sender's completion for it says how far it may reuse its FIFO (the
//!   data left long before: the receiver read it).
//! - Sends are signaled selectively (every `SQ_DEPTH / 4`, a chunk's last
//!   write and the write that empties the FIFO) and never outrun the send
//!   queue.
//! - Errors stick and name the rank, the peer, the channel, the device and
//!   port, the completion status in words; WR_FLUSH after a first error is
//!   reported as that error's consequence.
#![allow(unsafe_code)]

use super::buf::Buf;
use super::verbs::{Completion, Cq, Opcode, Qp, RecvWr, SendWr, Status, WcOpcode};
use crate::{Channel, Error, Piece, Receiver, Result, Sender};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io::Read;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Receives the receiver keeps posted per QP (data arrivals).
pub(crate) const RECV_DEPTH: u32 = 128;
/// Receives the sender keeps posted on QP 0 (credits).
pub(crate) const CREDIT_RECVS: u32 = 2 * RECV_DEPTH + 16;
/// Send queue depth per QP.
pub(crate) const SQ_DEPTH: u32 = 256;
/// Bytes of a message header record.
const HDR: usize = 64;
const MAGIC: u32 = u32::from_le_bytes(*b"OXRM");

const KIND_DATA: u64 = 1;
const KIND_CREDIT: u64 = 2;
const KIND_RECV: u64 = 3;

fn wr_id(kind: u64, qp: usize, seq: u64) -> u64 {
    (kind << 56) | ((qp as u64) << 48) | (seq & 0xffff_ffff_ffff)
}

fn wr_kind(id: u64) -> (u64, usize, u64) {
    (id >> 56, ((id >> 48) & 0xff) as usize, id & 0xffff_ffff_ffff)
}

/// Posts `n` receives (for WRITE_WITH_IMM: no buffers) on QP `j`.
fn post_recvs(qp: &mut dyn Qp, j: usize, n: u64) -> Result<()> {
    let r: Vec<RecvWr> = (0..n).map(|i| RecvWr { wr_id: wr_id(KIND_RECV, j, i) }).collect();
    qp.post_recv(&r)
}

/// The descriptors the engine sleeps on: those of every connection end in
/// use (a completion channel and a side socket each).
#[derive(Default)]
pub(crate) struct WakeSet {
    next: AtomicUsize,
    fds: Mutex<HashMap<usize, Vec<RawFd>>>,
}

impl WakeSet {
    /// Every descriptor registered.
    pub(crate) fn all(&self) -> Vec<RawFd> {
        self.fds.lock().values().flatten().copied().collect()
    }
}

/// A link's descriptors in a [`WakeSet`], removed when it drops.
struct Watched {
    set: Weak<WakeSet>,
    id: usize,
}

impl Watched {
    /// Stops watching `fd` (a side socket at its end: always readable, it
    /// would wake the engine for nothing).
    fn forget(&self, fd: RawFd) {
        if let Some(s) = self.set.upgrade()
            && let Some(fds) = s.fds.lock().get_mut(&self.id)
        {
            fds.retain(|&f| f != fd);
        }
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        if let Some(s) = self.set.upgrade() {
            s.fds.lock().remove(&self.id);
        }
    }
}

/// Who a connection joins, for messages.
#[derive(Clone, Debug)]
pub(crate) struct Who {
    pub rank: usize,
    pub peer: usize,
    pub ch: Channel,
    pub dev: String,
    pub port: u8,
    /// The ACK timeout and retries in force (for RETRY_EXC's message).
    pub timeout: String,
}

impl Who {
    fn chan(&self) -> String {
        match self.ch {
            crate::P2P_CHANNEL => "point-to-point channel".into(),
            crate::CONTROL_CHANNEL => "control channel".into(),
            c => format!("channel {c}"),
        }
    }

    /// The error for the first failed completion of a connection, of
    /// `what` (errors stick, so there is no second).
    pub(crate) fn completion(&self, what: &str, wc: &Completion) -> Error {
        let base = format!(
            "rank {}: RDMA {what} with rank {} on {} failed on {} port {} (QP {}): {}",
            self.rank,
            self.peer,
            self.chan(),
            self.dev,
            self.port,
            wc.qpn,
            wc.status
        );
        let extra = match wc.status {
            Status::RetryExc => format!("; {} elapsed without an acknowledgement", self.timeout),
            Status::WrFlush => {
                "; this queue pair failed earlier without a completion of its own: the peer's side broke an RDMA \
                 rule or its port failed (see that rank's error)"
                    .to_string()
            }
            _ => String::new(),
        };
        Error::Remote(format!("{base}{extra}"))
    }

    /// The side socket failed (not closed): its host stopped answering.
    pub(crate) fn unreachable(&self, e: &std::io::Error) -> Error {
        Error::Remote(format!(
            "rank {}: rank {} stopped answering on {} (its side channel failed: {e}; no TCP keepalive answered \
             for {} s: its host is down or the link between is broken)",
            self.rank,
            self.peer,
            self.chan(),
            SIDE_KEEPALIVE.0 + SIDE_KEEPALIVE.1 * SIDE_KEEPALIVE.2
        ))
    }

    pub(crate) fn closed(&self) -> Error {
        Error::Remote(format!(
            "rank {}: rank {} closed the RDMA connection on {} (its side channel ended: it exited, aborted or crashed)",
            self.rank,
            self.peer,
            self.chan()
        ))
    }
}

/// How long a sender whose peer closed waits for the acknowledgements of
/// writes it posted before (see `RdmaSender::progress`).
const GONE_GRACE: Duration = Duration::from_secs(1);

/// TCP keepalive on side sockets (idle seconds, seconds between probes,
/// probes): a peer whose host stops answering (link down, host dead) is
/// found within their sum even when no work request is outstanding to
/// time out (a rank waiting only to receive).
const SIDE_KEEPALIVE: (u64, u64, u64) = (1, 1, 3);

/// The QPs, completion queue and side socket of one connection.
pub(crate) struct Link {
    pub qps: Vec<Box<dyn Qp>>,
    pub cq: Arc<dyn Cq>,
    pub side: TcpStream,
    pub who: Who,
    last_side_check: Instant,
    wc: Vec<Completion>,
    /// The peer's side socket closed: what to say once that matters (what
    /// landed before stays readable; a sender with nothing left to send is
    /// not failed by a peer that finished).
    pub gone: Option<Error>,
    watched: Option<Watched>,
}

impl Link {
    pub(crate) fn new(qps: Vec<Box<dyn Qp>>, cq: Arc<dyn Cq>, side: TcpStream, who: Who) -> Result<Link> {
        side.set_nonblocking(true).map_err(|e| Error::System(format!("RDMA side channel: {e}")))?;
        let (idle, every, probes) = SIDE_KEEPALIVE;
        let ka = socket2::TcpKeepalive::new()
            .with_time(Duration::from_secs(idle))
            .with_interval(Duration::from_secs(every))
            .with_retries(probes as u32);
        // Best effort: without it a silent peer is still found by the
        // bootstrap's own keepalive, later.
        let _ = socket2::SockRef::from(&side).set_tcp_keepalive(&ka);
        Ok(Link {
            qps,
            cq,
            side,
            who,
            last_side_check: Instant::now(),
            wc: Vec::with_capacity(64),
            gone: None,
            watched: None,
        })
    }

    /// Puts the completion channel and the side socket into `set` for as
    /// long as the link lives.
    fn watch(&mut self, set: &Arc<WakeSet>) {
        let id = set.next.fetch_add(1, Ordering::Relaxed);
        let fds = self.cq.fd().into_iter().chain([self.side.as_raw_fd()]).collect();
        set.fds.lock().insert(id, fds);
        self.watched = Some(Watched { set: Arc::downgrade(set), id });
    }

    /// Notes in `gone` when the peer's side socket has closed or failed
    /// (no keepalive answered), and stops watching it.
    pub(crate) fn check_side(&mut self) {
        if self.last_side_check.elapsed() >= Duration::from_millis(10) {
            self.check_side_now();
        }
    }

    /// [`check_side`](Self::check_side) at once, however recent the last look.
    fn check_side_now(&mut self) {
        if self.gone.is_some() {
            return;
        }
        self.last_side_check = Instant::now();
        let mut b = [0u8; 16];
        self.gone = match (&self.side).read(&mut b) {
            Ok(0) => Some(self.who.closed()),
            Ok(_) => None,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted) => None,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Some(self.who.closed()),
            Err(e) => Some(self.who.unreachable(&e)),
        };
        if self.gone.is_some()
            && let Some(w) = &self.watched
        {
            w.forget(self.side.as_raw_fd());
        }
    }

    /// How long ago the peer was found gone (zero while it is not): the
    /// side was last looked at then.
    fn gone_for(&self) -> Duration {
        if self.gone.is_some() { self.last_side_check.elapsed() } else { Duration::ZERO }
    }

    /// Polls the CQ until it is empty (arming it when it was); the
    /// completions. All of them, not a batch: a peer found gone is judged
    /// on everything that arrived before (a sender whose last writes
    /// retired is done; a receiver reads every write that landed).
    fn poll(&mut self) -> Result<Vec<Completion>> {
        self.wc.clear();
        let mut wc = std::mem::take(&mut self.wc);
        let mut armed = false;
        loop {
            let n = self.cq.poll(&mut wc, 64).map_err(|e| self.cq_error(e))?;
            if n == 64 {
                continue;
            }
            if !wc.is_empty() || armed {
                return Ok(wc);
            }
            self.cq.arm()?;
            armed = true;
        }
    }

    fn cq_error(&self, e: Error) -> Error {
        Error::Remote(format!(
            "rank {}: RDMA connection with rank {} on {}: {} on {} port {}",
            self.who.rank,
            self.who.peer,
            self.who.chan(),
            e,
            self.who.dev,
            self.who.port
        ))
    }
}

/// Remembers the first error and explains later ones by it.
struct Sticky(Option<Error>);

impl Sticky {
    fn check(&self) -> Result<()> {
        match &self.0 {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
    fn fail(&mut self, e: Error) -> Error {
        self.0.get_or_insert(e).clone()
    }
}

/// The sending end.
pub struct RdmaSender {
    link: Link,
    buf: Buf,
    cap: u64,
    chunk: u64,
    remote_addr: u64,
    remote_rkey: u32,
    /// Committed (published) bytes.
    tail: u64,
    /// Bytes written to the peer.
    posted: u64,
    /// Bytes the peer consumed.
    head: u64,
    /// Bytes of the current message not yet committed; `None`: no message.
    left: Option<u64>,
    /// Bytes the last room gave.
    roomed: u64,
    /// Lengths of messages whose header records wait for room.
    hdr_pending: std::collections::VecDeque<(u64, u64)>,
    bytes: u64,
    /// Per QP: work requests posted, retired, unsignaled in a row.
    wr_posted: Vec<u64>,
    wr_retired: Vec<u64>,
    unsignaled: Vec<u32>,
    /// Per QP: end positions of writes not yet credited.
    inflight: Vec<std::collections::VecDeque<u64>>,
    err: Sticky,
    /// Test fault: write to a wrong rkey after this many bytes.
    bad_rkey_after: Option<u64>,
}

impl RdmaSender {
    /// A sender over `link` from `buf`, into the receiver's ring of `cap`
    /// bytes at `(remote_addr, remote_rkey)`, writing at most `chunk`
    /// bytes at once.
    pub(crate) fn new(
        mut link: Link,
        buf: Buf,
        (cap, chunk): (usize, usize),
        (remote_addr, remote_rkey): (u64, u32),
        bad_rkey_after: Option<u64>,
    ) -> Result<RdmaSender> {
        let q = link.qps.len();
        post_recvs(&mut *link.qps[0], 0, CREDIT_RECVS as u64)?;
        link.cq.arm()?;
        Ok(RdmaSender {
            link,
            buf,
            cap: cap as u64,
            chunk: chunk as u64,
            remote_addr,
            remote_rkey,
            tail: 0,
            posted: 0,
            head: 0,
            left: None,
            roomed: 0,
            hdr_pending: Default::default(),
            bytes: 0,
            wr_posted: vec![0; q],
            wr_retired: vec![0; q],
            unsignaled: vec![0; q],
            inflight: vec![Default::default(); q],
            err: Sticky(None),
            bad_rkey_after,
        })
    }

    /// Free bytes, up to the consumer's head rounded down to 64: a
    /// message's padding then never runs past it.
    fn free(&self) -> u64 {
        self.cap - (self.tail - (self.head & !(HDR as u64 - 1)))
    }

    /// Writes held-back header records while there is room.
    fn write_header(&mut self) {
        while let Some(&(len, tag)) = self.hdr_pending.front() {
            if self.free() < HDR as u64 {
                return;
            }
            self.put_header(len, tag);
            self.hdr_pending.pop_front();
        }
    }

    fn put_header(&mut self, len: u64, tag: u64) {
        let off = (self.tail % self.cap) as usize;
        // SAFETY: [tail, tail + 64) is free: credited by the receiver (or
        // never used), so no work request reads it and no peer writes it.
        let h = unsafe { self.buf.slice_mut(off, HDR) };
        h.fill(0);
        h[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        h[8..16].copy_from_slice(&len.to_le_bytes());
        h[16..24].copy_from_slice(&tag.to_le_bytes());
        self.tail += HDR as u64;
    }

    /// Takes completions: credits and retired sends.
    fn reap(&mut self) -> Result<bool> {
        let wcs = self.link.poll()?;
        let mut moved = false;
        let mut reposts = 0;
        for wc in &wcs {
            let (kind, qp, seq) = wr_kind(wc.wr_id);
            if wc.status != Status::Success {
                let what = if kind == KIND_RECV { "credit receive" } else { "write" };
                return Err(self.err.fail(self.link.who.completion(what, wc)));
            }
            match (kind, wc.opcode) {
                (KIND_RECV, WcOpcode::RecvImm) => {
                    let imm = wc.imm.unwrap_or(0);
                    let back = (self.tail as u32).wrapping_sub(imm) as u64;
                    let head = self.tail - back.min(self.tail);
                    if head > self.head {
                        self.head = head;
                        for f in &mut self.inflight {
                            while f.front().is_some_and(|&e| e <= head) {
                                f.pop_front();
                            }
                        }
                        moved = true;
                    }
                    reposts += 1;
                }
                (KIND_DATA, _) => self.wr_retired[qp] = self.wr_retired[qp].max(seq),
                _ => {}
            }
        }
        if reposts > 0 {
            post_recvs(&mut *self.link.qps[0], 0, reposts).map_err(|e| self.err.fail(e))?;
        }
        self.link.wc = wcs;
        Ok(moved)
    }

    /// Posts writes for committed bytes, as far as queues allow.
    fn pump(&mut self) -> Result<bool> {
        let mut moved = false;
        let q = self.link.qps.len();
        while self.posted < self.tail {
            let chunk_no = self.posted / self.chunk;
            let j = (chunk_no % q as u64) as usize;
            let end = ((chunk_no + 1) * self.chunk).min(self.tail);
            if self.inflight[j].len() as u32 >= RECV_DEPTH - 1
                || self.wr_posted[j] - self.wr_retired[j] >= SQ_DEPTH as u64 - 1
            {
                break;
            }
            let off = self.posted % self.cap;
            let len = end - self.posted;
            self.unsignaled[j] += 1;
            // A QP's last write is always signaled (it ends a chunk or the
            // committed bytes), so `flushed` can see every QP drain.
            let signaled = self.unsignaled[j] >= SQ_DEPTH / 4 || end == self.tail || end.is_multiple_of(self.chunk);
            if signaled {
                self.unsignaled[j] = 0;
            }
            let seq = self.wr_posted[j] + 1;
            let rkey = match self.bad_rkey_after {
                Some(after) if self.posted >= after => self.remote_rkey ^ 0x5a5a_0000,
                _ => self.remote_rkey,
            };
            let wr = SendWr {
                wr_id: wr_id(KIND_DATA, j, seq),
                op: Opcode::WriteImm(end as u32),
                local: self.buf.addr() + off,
                len: len as u32,
                lkey: self.buf.mr.lkey,
                remote: self.remote_addr + off,
                rkey,
                signaled,
            };
            self.link.qps[j].post_send(&[wr]).map_err(|e| self.err.fail(e))?;
            self.wr_posted[j] = seq;
            self.inflight[j].push_back(end);
            self.posted = end;
            moved = true;
        }
        Ok(moved)
    }
}

impl Drop for RdmaSender {
    /// Lets committed bytes land before the QPs go (destroying a QP drops
    /// its outstanding writes; a closing socket would still deliver them),
    /// for at most two seconds.
    fn drop(&mut self) {
        let end = Instant::now() + Duration::from_secs(2);
        while !self.flushed() && self.err.0.is_none() && Instant::now() < end {
            if self.progress().is_err() {
                break;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}

impl RdmaSender {
    /// Lets the engine sleep on this end's descriptors (see [`WakeSet`]).
    pub(crate) fn watch(&mut self, set: &Arc<WakeSet>) {
        self.link.watch(set);
    }
}

impl Sender for RdmaSender {
    fn begin_tagged(&mut self, len: usize, tag: u64) -> Result<()> {
        self.err.check()?;
        if let Some(e) = self.link.gone.clone() {
            return Err(self.err.fail(e));
        }
        if self.left.is_some() {
            return Err(Error::InvalidUsage(format!(
                "rank {}: a message to rank {} was started before the previous one was complete",
                self.link.who.rank, self.link.who.peer
            )));
        }
        self.left = (len > 0).then_some(len as u64);
        self.hdr_pending.push_back((len as u64, tag));
        self.write_header();
        self.pump()?;
        Ok(())
    }

    fn room(&mut self, want: usize) -> Result<&mut [u8]> {
        self.err.check()?;
        self.write_header();
        let Some(left) = self.left else {
            return Err(Error::InvalidUsage(format!(
                "rank {}: room for a message to rank {} before begin",
                self.link.who.rank, self.link.who.peer
            )));
        };
        if !self.hdr_pending.is_empty() {
            self.roomed = 0;
            return Ok(&mut []);
        }
        let off = self.tail % self.cap;
        let n = (want as u64).min(left).min(self.free()).min(self.cap - off) as usize;
        self.roomed = n as u64;
        // SAFETY: [tail, tail + n) is free (credited), inside the buffer,
        // and neither a work request nor a peer touches it until commit.
        Ok(unsafe { self.buf.slice_mut(off as usize, n) })
    }

    fn commit(&mut self, n: usize) -> Result<()> {
        self.err.check()?;
        let Some(left) = self.left else {
            return Err(Error::InvalidUsage("commit without a message".into()));
        };
        if n as u64 > self.roomed.min(left) {
            return Err(Error::InvalidUsage(format!(
                "commit of {n} bytes beyond the {} of the last room",
                self.roomed
            )));
        }
        self.roomed = 0;
        self.tail += n as u64;
        self.bytes += n as u64;
        if left == n as u64 {
            self.tail = self.tail.next_multiple_of(HDR as u64);
            self.left = None;
        } else {
            self.left = Some(left - n as u64);
        }
        self.pump()?;
        Ok(())
    }

    fn progress(&mut self) -> Result<bool> {
        self.err.check()?;
        self.link.check_side();
        let mut moved = self.reap()?;
        // A peer that is gone fails a sender with bytes still to write
        // (waiting for room) or to post, not one that is done. Writes
        // posted and not yet acknowledged may have landed, been read and
        // the receiver closed before their acknowledgements came: they
        // have `GONE_GRACE` to retire.
        if let Some(e) = self.link.gone.clone() {
            let unsent = self.left.is_some() || !self.hdr_pending.is_empty() || self.posted != self.tail;
            if unsent || (!self.flushed() && self.link.gone_for() >= GONE_GRACE) {
                return Err(self.err.fail(e));
            }
        }
        self.write_header();
        moved |= self.pump()?;
        Ok(moved)
    }

    fn flushed(&self) -> bool {
        self.hdr_pending.is_empty()
            && self.posted == self.tail
            && self.wr_posted.iter().zip(&self.wr_retired).all(|(p, r)| p == r)
    }

    fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// The receiving end.
pub struct RdmaReceiver {
    link: Link,
    ring: Buf,
    cap: u64,
    chunk: u64,
    /// Per QP: the next position it will fill.
    next: Vec<u64>,
    /// Landed bytes (the smallest cursor).
    tail: u64,
    /// Consumed bytes.
    head: u64,
    /// Consumed bytes the sender has been told of.
    credited: u64,
    credits_out: u32,
    credit_seq: u64,
    /// The current message: (length, payload bytes consumed, tag).
    msg: Option<(u64, u64, u64)>,
    /// Bytes the last peek showed and consume may release.
    peeked: u64,
    bytes: u64,
    err: Sticky,
    /// Test fault: stop reposting receives.
    starve: bool,
}

impl RdmaReceiver {
    pub(crate) fn new(mut link: Link, ring: Buf, cap: usize, chunk: usize, starve: bool) -> Result<RdmaReceiver> {
        for (j, qp) in link.qps.iter_mut().enumerate() {
            post_recvs(&mut **qp, j, RECV_DEPTH as u64)?;
        }
        link.cq.arm()?;
        let q = link.qps.len() as u64;
        Ok(RdmaReceiver {
            next: (0..q).map(|j| j * chunk as u64).collect(),
            link,
            ring,
            cap: cap as u64,
            chunk: chunk as u64,
            tail: 0,
            head: 0,
            credited: 0,
            credits_out: 0,
            credit_seq: 0,
            msg: None,
            peeked: 0,
            bytes: 0,
            err: Sticky(None),
            starve,
        })
    }

    /// Nothing to read: fine, unless the sender is gone and nothing it
    /// wrote before is left to take.
    fn nothing<'a>(&mut self) -> Result<Option<Piece<'a>>> {
        let Some(e) = self.link.gone.clone() else { return Ok(None) };
        let tail = self.tail;
        self.reap()?;
        if self.tail != tail {
            return Ok(None);
        }
        Err(self.err.fail(e))
    }

    fn reap(&mut self) -> Result<bool> {
        let wcs = self.link.poll()?;
        let q = self.link.qps.len() as u64;
        let mut moved = false;
        let mut repost = vec![0u64; q as usize];
        for wc in &wcs {
            let (kind, j, _) = wr_kind(wc.wr_id);
            if wc.status != Status::Success {
                // A sender that finished and closed: the last credit write
                // finds no one (after the retries), and the QP's error
                // flushes the posted receives. What landed stays readable;
                // `nothing` reports the close once it is read.
                self.link.check_side_now();
                if self.link.gone.is_some() {
                    continue;
                }
                let what = if kind == KIND_CREDIT { "credit write" } else { "receive" };
                return Err(self.err.fail(self.link.who.completion(what, wc)));
            }
            match kind {
                KIND_RECV => {
                    let n = wc.byte_len as u64;
                    let next = &mut self.next[j];
                    *next += n;
                    if wc.imm != Some(*next as u32) {
                        let e = Error::Remote(format!(
                            "rank {}: the RDMA stream from rank {} is out of step (write ending at {:?}, expected {})",
                            self.link.who.rank, self.link.who.peer, wc.imm, *next as u32
                        ));
                        return Err(self.err.fail(e));
                    }
                    if next.is_multiple_of(self.chunk) {
                        *next += (q - 1) * self.chunk;
                    }
                    repost[j] += 1;
                    moved = true;
                }
                KIND_CREDIT => self.credits_out -= 1,
                _ => {}
            }
        }
        if !self.starve {
            for (j, &n) in repost.iter().enumerate() {
                if n > 0 {
                    post_recvs(&mut *self.link.qps[j], j, n).map_err(|e| self.err.fail(e))?;
                }
            }
        }
        self.tail = self.next.iter().copied().min().unwrap_or(0);
        self.link.wc = wcs;
        Ok(moved)
    }

    /// Tells the sender how far this end consumed, when it matters.
    fn credit(&mut self) -> Result<()> {
        if self.head == self.credited || self.credits_out >= 8 || self.link.gone.is_some() {
            return Ok(());
        }
        if self.head - self.credited < self.cap / 4 && self.head != self.tail {
            return Ok(());
        }
        self.credit_seq += 1;
        let wr = SendWr {
            wr_id: wr_id(KIND_CREDIT, 0, self.credit_seq),
            op: Opcode::WriteImm(self.head as u32),
            local: 0,
            len: 0,
            lkey: 0,
            remote: 0,
            rkey: 0,
            signaled: true,
        };
        self.link.qps[0].post_send(&[wr]).map_err(|e| self.err.fail(e))?;
        self.credits_out += 1;
        self.credited = self.head;
        Ok(())
    }
}

impl RdmaReceiver {
    /// Lets the engine sleep on this end's descriptors (see [`WakeSet`]).
    pub(crate) fn watch(&mut self, set: &Arc<WakeSet>) {
        self.link.watch(set);
    }
}

impl Receiver for RdmaReceiver {
    fn peek(&mut self) -> Result<Option<Piece<'_>>> {
        self.err.check()?;
        if self.msg.is_none() {
            if self.tail - self.head < HDR as u64 {
                return self.nothing();
            }
            let off = (self.head % self.cap) as usize;
            // SAFETY: the header landed (below tail) and the sender does not
            // overwrite it before this end credits it.
            let h = unsafe { self.ring.slice(off, HDR) };
            let magic = u32::from_le_bytes(h[0..4].try_into().expect("4 bytes"));
            let len = u64::from_le_bytes(h[8..16].try_into().expect("8 bytes"));
            let tag = u64::from_le_bytes(h[16..24].try_into().expect("8 bytes"));
            if magic != MAGIC || len > crate::ring::MAX_MSG {
                let e = Error::Remote(format!(
                    "rank {}: malformed message header from rank {} over RDMA (magic {magic:#x}, length {len})",
                    self.link.who.rank, self.link.who.peer
                ));
                return Err(self.err.fail(e));
            }
            self.head += HDR as u64;
            self.msg = Some((len, 0, tag));
        }
        let (len, done, tag) = self.msg.expect("set above");
        if len == 0 {
            self.peeked = 0;
            return Ok(Some(Piece { msg_len: 0, offset: 0, data: &[], tag }));
        }
        let off = self.head % self.cap;
        let avail = (self.tail - self.head).min(len - done).min(self.cap - off);
        if avail == 0 {
            return self.nothing();
        }
        // SAFETY: these bytes landed (below tail, after their completions)
        // and stay until this end credits them.
        let data = unsafe { self.ring.slice(off as usize, avail as usize) };
        self.peeked = avail;
        Ok(Some(Piece { msg_len: len as usize, offset: done as usize, data, tag }))
    }

    fn consume(&mut self, n: usize) -> Result<()> {
        self.err.check()?;
        let Some((len, done, tag)) = self.msg else {
            return Err(Error::InvalidUsage("consume without a message".into()));
        };
        let n = n as u64;
        if n > self.peeked || done + n > len {
            return Err(Error::InvalidUsage(format!(
                "consume of {n} bytes beyond the {} the last peek showed",
                self.peeked
            )));
        }
        self.peeked -= n;
        self.head += n;
        self.bytes += n;
        if done + n == len {
            self.head = self.head.next_multiple_of(HDR as u64);
            self.msg = None;
        } else {
            self.msg = Some((len, done + n, tag));
        }
        self.credit()
    }

    fn progress(&mut self) -> Result<bool> {
        self.err.check()?;
        self.link.check_side();
        let moved = self.reap()?;
        self.credit()?;
        Ok(moved)
    }

    fn bytes(&self) -> u64 {
        self.bytes
    }
}
