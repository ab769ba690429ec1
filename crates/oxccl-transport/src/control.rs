//! The one-sided control plane: small records on a dedicated connection
//! ([`CONTROL_CHANNEL`](crate::CONTROL_CHANNEL)) between two ranks, over
//! whichever provider carries their traffic.
//!
//! It carries what every provider needs for one-sided programs, and
//! emulates what a provider lacks:
//! - **signals** (`signal`/`wait` steps): counted per (peer, channel),
//!   never blocking the signaller, matched in order;
//! - **exposures**: the descriptors of the buffers a rank registered for a
//!   call, sent to each peer that will access them, in call order;
//! - **emulated gets and puts** for peers without native access (TCP, or
//!   shared memory where the kernel refuses cross-memory attach): a get is
//!   a request answered by data records written straight into the
//!   requester's destination; a put is a data record the owner copies into
//!   its registered memory and acknowledges. An operation completes only
//!   when its data is in place (for a put: acknowledged), so a completed
//!   put is visible at the peer, as the verifier assumes.
//!
//! Every record is one message: a 48-byte header, then its payload. The
//! receiving side is drained on every [`Plane::progress`], whatever the
//! executor is doing, so a rank serves its peers' requests while it waits
//! for something else, and a full FIFO never blocks a signal: records
//! queue locally until there is room.

use crate::provider::{DESC_LEN, MemDesc};
use crate::region::Region;
use crate::wire::{u16_at, u32_at, u64_at};
use crate::{Channel, Error, Receiver, Result, Sender};
use std::collections::{HashMap, VecDeque};

const MAGIC: u32 = u32::from_le_bytes(*b"OXCR");
const HDR: usize = 48;
/// Largest data record: bigger gets are answered in pieces, so signals
/// and other records are not stuck behind a long response.
const DATA_CHUNK: usize = 1 << 20;
/// Most descriptors in one exposure.
const MAX_DESCS: u32 = 16;

const SIGNAL: u16 = 1;
const EXPOSE: u16 = 2;
const GET: u16 = 3;
const DATA: u16 = 4;
const PUT: u16 = 5;
const ACK: u16 = 6;
const FAIL: u16 = 7;

/// A record's header.
#[derive(Clone, Copy, Debug, Default)]
struct Hdr {
    kind: u16,
    ch: u32,
    count: u32,
    id: u64,
    /// Registration id (get, put); the caller's tag (signal, expose).
    reg: u64,
    /// Offset: in the registration (get, put) or in the operation (data);
    /// the call's count (expose).
    off: u64,
    /// Bytes asked for (get) or carried (data, put, fail, expose).
    len: u64,
}

/// A peer's buffers for one call in which this rank accesses them: their
/// descriptors, and the call's tag and count as the peer gave them (so a
/// rank can tell a peer that runs another call, or the same call on
/// another count, before touching its buffers).
#[derive(Clone, Debug)]
pub struct Exposed {
    /// The buffers' descriptors, in the order the peer gave them.
    pub descs: Vec<MemDesc>,
    /// The call's signature tag.
    pub tag: u64,
    /// The call's count (elements).
    pub count: u64,
}

impl Hdr {
    fn encode(&self) -> [u8; HDR] {
        let mut b = [0u8; HDR];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&self.kind.to_le_bytes());
        b[8..12].copy_from_slice(&self.ch.to_le_bytes());
        b[12..16].copy_from_slice(&self.count.to_le_bytes());
        b[16..24].copy_from_slice(&self.id.to_le_bytes());
        b[24..32].copy_from_slice(&self.reg.to_le_bytes());
        b[32..40].copy_from_slice(&self.off.to_le_bytes());
        b[40..48].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Bytes of payload after the header (signals, gets and acks carry
    /// none; their `len` means something else).
    fn payload_len(&self) -> u64 {
        match self.kind {
            SIGNAL | GET | ACK => 0,
            _ => self.len,
        }
    }

    fn decode(b: &[u8; HDR], peer: usize, msg_len: usize) -> Result<Hdr> {
        let h = Hdr {
            kind: u16_at(b, 4),
            ch: u32_at(b, 8),
            count: u32_at(b, 12),
            id: u64_at(b, 16),
            reg: u64_at(b, 24),
            off: u64_at(b, 32),
            len: u64_at(b, 40),
        };
        if u32_at(b, 0) != MAGIC || !(SIGNAL..=FAIL).contains(&h.kind) || (msg_len - HDR) as u64 != h.payload_len() {
            return Err(Error::Remote(format!(
                "rank {peer} sent a malformed control record (kind {}, {msg_len} bytes): the peer runs a \
                 different oxccl version or its memory is corrupt",
                h.kind
            )));
        }
        if h.kind == EXPOSE && (h.count > MAX_DESCS || h.len != h.count as u64 * DESC_LEN as u64) {
            return Err(Error::Remote(format!("rank {peer} sent an exposure of {} descriptors", h.count)));
        }
        Ok(h)
    }
}

/// Where an outgoing record's payload comes from.
enum Payload {
    None,
    Bytes(Vec<u8>),
    /// A registered region (a get's answer) or a put's source.
    Region {
        region: Region,
        reg: Option<u64>,
    },
}

impl Payload {
    fn len(&self) -> usize {
        match self {
            Payload::None => 0,
            Payload::Bytes(b) => b.len(),
            Payload::Region { region, .. } => region.len(),
        }
    }
}

struct Out {
    hdr: Hdr,
    payload: Payload,
    /// Bytes of the message (header, then payload) written so far.
    done: usize,
    begun: bool,
}

impl Out {
    fn new(hdr: Hdr, payload: Payload) -> Out {
        Out { hdr, payload, done: 0, begun: false }
    }

    /// A failure answer to operation `op`, saying `why`.
    fn fail(op: u64, why: &[u8]) -> Out {
        let hdr = Hdr { kind: FAIL, id: op, len: why.len() as u64, ..Hdr::default() };
        Out::new(hdr, Payload::Bytes(why.to_vec()))
    }
}

/// What the payload of the incoming message goes to.
enum Sink {
    /// Accumulate (descriptors, failure text).
    Collect(Vec<u8>),
    /// Into an operation's destination.
    Data { op: u64, at: usize },
    /// Into a registered region, then acknowledge.
    Put { reg: u64, at: usize, id: u64 },
    /// Nowhere (an operation or registration that is gone).
    Skip,
}

struct In {
    hdr: Hdr,
    sink: Sink,
    /// Payload bytes consumed so far.
    got: usize,
}

/// One control connection: this rank and `peer`.
struct Link {
    peer: usize,
    tx: Box<dyn Sender>,
    rx: Box<dyn Receiver>,
    out: VecDeque<Out>,
    hdr: [u8; HDR],
    hdr_got: usize,
    cur: Option<In>,
    /// Per channel: arrived signals, runs of (tag, count) in order.
    signals: HashMap<Channel, VecDeque<(u64, u64)>>,
    /// Arrived exposures and their tags.
    exposed: VecDeque<Exposed>,
    exposes_sent: u64,
    exposes_seen: u64,
    /// Sending failed (the peer is gone or stopped receiving): reported to
    /// whoever sends on this link next.
    tx_failed: Option<Error>,
    /// Receiving failed: reported to whoever waits for something from the
    /// peer, once everything that arrived before is used up.
    failed: Option<Error>,
}

enum OpKind {
    Read { dst: Region },
    Write,
}

struct Op {
    peer: usize,
    kind: OpKind,
    len: usize,
    got: usize,
    acked: bool,
    error: Option<Error>,
}

impl Op {
    /// Whether its data is in place (a read's) or acknowledged (a write's).
    fn complete(&self) -> bool {
        match self.kind {
            OpKind::Read { .. } => self.got == self.len,
            OpKind::Write => self.acked,
        }
    }
}

/// One rank's control plane: a link per peer it has one-sided business
/// with, its emulated registrations and its operations in flight.
pub struct Plane {
    rank: usize,
    links: Vec<Option<Link>>,
    regs: HashMap<u64, Region>,
    ops: HashMap<u64, Op>,
    next: u64,
}

impl Plane {
    /// The plane of `rank` among `nranks`.
    pub fn new(rank: usize, nranks: usize) -> Plane {
        Plane { rank, links: (0..nranks).map(|_| None).collect(), regs: HashMap::new(), ops: HashMap::new(), next: 1 }
    }

    /// Whether the link with `peer` exists.
    pub fn has_link(&self, peer: usize) -> bool {
        self.links.get(peer).is_some_and(Option::is_some)
    }

    /// Adds the link with `peer` (its control connection's two ends).
    pub fn add_link(&mut self, peer: usize, tx: Box<dyn Sender>, rx: Box<dyn Receiver>) {
        self.links[peer] = Some(Link {
            peer,
            tx,
            rx,
            out: VecDeque::new(),
            hdr: [0; HDR],
            hdr_got: 0,
            cur: None,
            signals: HashMap::new(),
            exposed: VecDeque::new(),
            exposes_sent: 0,
            exposes_seen: 0,
            tx_failed: None,
            failed: None,
        });
    }

    fn link(&mut self, peer: usize) -> Result<&mut Link> {
        self.links
            .get_mut(peer)
            .and_then(Option::as_mut)
            .ok_or_else(|| Error::Internal(format!("rank {}: no control link with rank {peer}", self.rank)))
    }

    fn push(&mut self, peer: usize, hdr: Hdr, payload: Payload) -> Result<()> {
        let link = self.link(peer)?;
        if let Some(e) = link.tx_failed.as_ref().or(link.failed.as_ref()) {
            return Err(e.clone());
        }
        link.out.push_back(Out::new(hdr, payload));
        self.flush_link(peer)?;
        // A record already in the connection is sent, whatever the
        // connection said afterwards (the peer may have got it and left).
        let link = self.link(peer)?;
        match &link.tx_failed {
            Some(e) if !link.out.is_empty() => Err(e.clone()),
            _ => Ok(()),
        }
    }

    /// Counts a signal tagged `tag` to `peer` on channel `ch` (never
    /// blocks).
    pub fn signal(&mut self, peer: usize, ch: Channel, tag: u64) -> Result<()> {
        self.push(peer, Hdr { kind: SIGNAL, ch, count: 1, reg: tag, ..Hdr::default() }, Payload::None)
    }

    /// Takes one signal from `peer` on `ch` if one has arrived: its tag.
    pub fn take_signal(&mut self, peer: usize, ch: Channel) -> Result<Option<u64>> {
        self.drain_link(peer)?;
        let link = self.link(peer)?;
        if let Some(runs) = link.signals.get_mut(&ch)
            && let Some((tag, n)) = runs.front_mut()
        {
            let tag = *tag;
            *n -= 1;
            if *n == 0 {
                runs.pop_front();
            }
            return Ok(Some(tag));
        }
        link.failed.clone().map_or(Ok(None), Err)
    }

    /// Sends `descs` (this rank's registered buffers for one call, tagged
    /// `tag`, of `count` elements) to `peer`.
    pub fn expose(&mut self, peer: usize, descs: &[MemDesc], tag: u64, count: u64) -> Result<()> {
        if descs.len() > MAX_DESCS as usize {
            return Err(Error::Internal(format!("{} descriptors in one exposure", descs.len())));
        }
        let bytes: Vec<u8> = descs.iter().flat_map(|d| d.encode()).collect();
        let link = self.link(peer)?;
        let id = link.exposes_sent;
        link.exposes_sent += 1;
        let len = bytes.len() as u64;
        let hdr = Hdr { kind: EXPOSE, count: descs.len() as u32, id, reg: tag, off: count, len, ..Hdr::default() };
        self.push(peer, hdr, Payload::Bytes(bytes))
    }

    /// The next exposure `peer` sent, if it has arrived.
    pub fn exposed(&mut self, peer: usize) -> Result<Option<Exposed>> {
        self.drain_link(peer)?;
        let link = self.link(peer)?;
        match link.exposed.pop_front() {
            Some(d) => Ok(Some(d)),
            None => link.failed.clone().map_or(Ok(None), Err),
        }
    }

    /// Registers `region` for emulated access; its id.
    pub fn register(&mut self, region: Region) -> u64 {
        let id = self.next;
        self.next += 1;
        self.regs.insert(id, region);
        id
    }

    /// Ends registration `id`: answers not yet written become failures,
    /// one being written is finished from a copy (its region may be freed
    /// once this returns), and a put arriving into it is discarded.
    pub fn unregister(&mut self, id: u64) {
        self.regs.remove(&id);
        for link in self.links.iter_mut().flatten() {
            cancel(link, |o| matches!(o.payload, Payload::Region { reg: Some(r), .. } if r == id), true);
            if let Some(cur) = &mut link.cur
                && let Sink::Put { reg, .. } = cur.sink
                && reg == id
            {
                cur.sink = Sink::Skip;
            }
        }
    }

    fn new_op(&mut self, peer: usize, kind: OpKind, len: usize) -> u64 {
        let id = self.next;
        self.next += 1;
        self.ops.insert(id, Op { peer, kind, len, got: 0, acked: false, error: None });
        id
    }

    /// Starts an emulated read of `dst.len()` bytes at `off` of `desc`
    /// (registered by `peer`) into `dst`; the operation's id.
    pub fn read(&mut self, peer: usize, desc: &MemDesc, off: usize, dst: Region) -> Result<u64> {
        let len = dst.len();
        let id = self.new_op(peer, OpKind::Read { dst }, len);
        let hdr = Hdr { kind: GET, id, reg: desc.emu_id, off: off as u64, len: len as u64, ..Hdr::default() };
        self.push(peer, hdr, Payload::None).inspect_err(|_| {
            self.ops.remove(&id);
        })?;
        Ok(id)
    }

    /// Starts an emulated write of `src` into `desc` (registered by
    /// `peer`) at `off`; the operation's id.
    pub fn write(&mut self, peer: usize, src: Region, desc: &MemDesc, off: usize) -> Result<u64> {
        let len = src.len();
        let id = self.new_op(peer, OpKind::Write, len);
        let hdr = Hdr { kind: PUT, id, reg: desc.emu_id, off: off as u64, len: len as u64, ..Hdr::default() };
        self.push(peer, hdr, Payload::Region { region: src, reg: None }).inspect_err(|_| {
            self.ops.remove(&id);
        })?;
        Ok(id)
    }

    /// Whether operation `id` is complete; an error if it failed.
    pub fn test(&mut self, id: u64) -> Result<bool> {
        let peer = self.ops.get(&id).map(|o| o.peer).ok_or_else(|| Error::Internal(format!("unknown op {id}")))?;
        self.flush_link(peer)?;
        self.drain_link(peer)?;
        let link = self.link(peer)?;
        let failed = link.failed.clone().or_else(|| link.tx_failed.clone());
        let op = self.ops.get(&id).expect("checked");
        if op.complete() {
            return Ok(true);
        }
        match op.error.clone().or(failed) {
            Some(e) => Err(e),
            None => Ok(false),
        }
    }

    /// Drops operation `id` (finished, or its call failed): later answers
    /// for it are discarded, and a put's source still being written is
    /// copied (its region may be freed once this returns).
    pub fn forget(&mut self, id: u64) {
        if let Some(op) = self.ops.remove(&id)
            && matches!(op.kind, OpKind::Write)
            && let Some(link) = self.links[op.peer].as_mut()
        {
            cancel(link, |o| o.hdr.kind == PUT && o.hdr.id == id, false);
        }
    }

    /// Flushes and drains every link; true if anything moved. A link whose
    /// peer is gone records the error for whoever needs that link.
    pub fn progress(&mut self) -> Result<bool> {
        let mut moved = false;
        for peer in 0..self.links.len() {
            if self.links[peer].is_some() {
                moved |= self.flush_link(peer).unwrap_or(false);
                moved |= self.drain_link(peer).unwrap_or(false);
            }
        }
        Ok(moved)
    }

    /// Flushes every link without draining any; true if anything moved.
    pub fn flush_all(&mut self) -> Result<bool> {
        let mut moved = false;
        for peer in 0..self.links.len() {
            if self.links[peer].is_some() {
                moved |= self.flush_link(peer).unwrap_or(false);
            }
        }
        Ok(moved)
    }

    /// Whether every record has left this rank.
    pub fn flushed(&self) -> bool {
        self.links.iter().flatten().all(|l| l.tx_failed.is_some() || (l.out.is_empty() && l.tx.flushed()))
    }

    /// Writes queued records while there is room.
    fn flush_link(&mut self, peer: usize) -> Result<bool> {
        let link = self.link(peer)?;
        if link.tx_failed.is_some() || (link.out.is_empty() && link.tx.flushed()) {
            return Ok(false);
        }
        let r = flush(link);
        self.note(peer, r, true)
    }

    /// Records a link's failure (of sending, or of receiving); returns the
    /// result without it. Operations that need an answer from the peer
    /// fail with it.
    fn note(&mut self, peer: usize, r: Result<bool>, sending: bool) -> Result<bool> {
        match r {
            Ok(m) => Ok(m),
            Err(e) => {
                let e = match e {
                    Error::Remote(m) => Error::Remote(format!("one-sided traffic with rank {peer}: {m}")),
                    other => other,
                };
                for op in self.ops.values_mut().filter(|o| o.peer == peer && !o.complete()) {
                    op.error.get_or_insert_with(|| e.clone());
                }
                let link = self.link(peer)?;
                if sending {
                    link.tx_failed = Some(e);
                } else {
                    link.failed = Some(e);
                }
                Ok(true)
            }
        }
    }

    /// Reads whatever has arrived from `peer`.
    fn drain_link(&mut self, peer: usize) -> Result<bool> {
        if self.link(peer)?.failed.is_some() {
            return Ok(false);
        }
        let r = self.drain(peer);
        self.note(peer, r, false)
    }

    fn drain(&mut self, peer: usize) -> Result<bool> {
        let mut moved = false;
        let link = self.links[peer].as_mut().expect("checked");
        link.rx.progress()?;
        loop {
            let link = self.links[peer].as_mut().expect("checked");
            let Some(piece) = link.rx.peek()? else { break };
            let msg_len = piece.msg_len;
            if msg_len < HDR {
                return Err(Error::Remote(format!("rank {peer} sent a control record of {msg_len} bytes")));
            }
            let data = piece.data;
            // Header bytes first.
            if link.cur.is_none() {
                let n = (HDR - link.hdr_got).min(data.len());
                link.hdr[link.hdr_got..link.hdr_got + n].copy_from_slice(&data[..n]);
                link.hdr_got += n;
                link.rx.consume(n)?;
                moved = true;
                if link.hdr_got < HDR {
                    continue;
                }
                link.hdr_got = 0;
                let hdr = Hdr::decode(&link.hdr, peer, msg_len)?;
                let sink = self.sink_for(peer, &hdr)?;
                let link = self.links[peer].as_mut().expect("checked");
                link.cur = Some(In { hdr, sink, got: 0 });
                if hdr.payload_len() == 0 {
                    self.finish(peer)?;
                }
                continue;
            }
            // Payload.
            let cur = link.cur.as_mut().expect("checked");
            let n = data.len().min(cur.hdr.len as usize - cur.got);
            let bytes = &data[..n];
            match &mut cur.sink {
                Sink::Collect(v) => v.extend_from_slice(bytes),
                Sink::Data { op, at } => {
                    if let Some(Op { kind: OpKind::Read { dst }, got, .. }) = self.ops.get_mut(op) {
                        dst.sub(*at + cur.got, n)?.write(|d| d.copy_from_slice(bytes))?;
                        *got += n;
                    }
                }
                Sink::Put { reg, at, .. } => {
                    if let Some(region) = self.regs.get(reg) {
                        region.sub(*at + cur.got, n)?.write(|d| d.copy_from_slice(bytes))?;
                    }
                }
                Sink::Skip => {}
            }
            cur.got += n;
            let complete = cur.got == cur.hdr.len as usize;
            link.rx.consume(n)?;
            moved = true;
            if complete {
                self.finish(peer)?;
            }
        }
        Ok(moved)
    }

    /// Decides where an arriving record's payload goes (checking bounds).
    fn sink_for(&mut self, peer: usize, h: &Hdr) -> Result<Sink> {
        Ok(match h.kind {
            EXPOSE | FAIL => Sink::Collect(Vec::with_capacity(h.len as usize)),
            DATA => match self.ops.get(&h.id) {
                Some(Op { kind: OpKind::Read { dst }, peer: p, .. }) if *p == peer => {
                    if h.off.checked_add(h.len).is_none_or(|e| e > dst.len() as u64) {
                        return Err(Error::Remote(format!(
                            "rank {peer} answered a get with bytes {}..+{} of a {}-byte read",
                            h.off,
                            h.len,
                            dst.len()
                        )));
                    }
                    Sink::Data { op: h.id, at: h.off as usize }
                }
                _ => Sink::Skip,
            },
            PUT => match self.check_reg(h, true) {
                Ok(()) => Sink::Put { reg: h.reg, at: h.off as usize, id: h.id },
                Err(why) => {
                    self.reply_fail(peer, h.id, &why)?;
                    Sink::Skip
                }
            },
            _ => Sink::Skip,
        })
    }

    fn check_reg(&self, h: &Hdr, write: bool) -> std::result::Result<(), String> {
        let Some(r) = self.regs.get(&h.reg) else {
            return Err(format!("rank {} has no buffer registered as {} (the call is over)", self.rank, h.reg));
        };
        if h.off.checked_add(h.len).is_none_or(|e| e > r.len() as u64) {
            return Err(format!(
                "bytes {}..+{} are outside rank {}'s {}-byte buffer",
                h.off,
                h.len,
                self.rank,
                r.len()
            ));
        }
        if write && !r.writable() {
            return Err(format!("rank {}'s buffer is read-only", self.rank));
        }
        Ok(())
    }

    fn reply_fail(&mut self, peer: usize, op: u64, why: &str) -> Result<()> {
        self.link(peer)?.out.push_back(Out::fail(op, why.as_bytes()));
        Ok(())
    }

    /// Acts on a complete incoming record.
    fn finish(&mut self, peer: usize) -> Result<()> {
        let link = self.links[peer].as_mut().expect("checked");
        let In { hdr, sink, .. } = link.cur.take().expect("a record");
        match hdr.kind {
            SIGNAL => {
                let runs = link.signals.entry(hdr.ch).or_default();
                match runs.back_mut() {
                    Some((tag, n)) if *tag == hdr.reg => *n += u64::from(hdr.count),
                    _ => runs.push_back((hdr.reg, u64::from(hdr.count))),
                }
            }
            EXPOSE => {
                if hdr.id != link.exposes_seen {
                    return Err(Error::Remote(format!(
                        "rank {peer} exposed buffers of its one-sided call {} where this rank expected call {}: \
                         the ranks run different operations (set OXCCL_CHECK=1 to find the rank that differs)",
                        hdr.id, link.exposes_seen
                    )));
                }
                link.exposes_seen += 1;
                let Sink::Collect(bytes) = sink else { unreachable!("exposures collect") };
                let descs =
                    bytes.chunks_exact(DESC_LEN).map(|c| MemDesc::decode(c, peer)).collect::<Result<Vec<_>>>()?;
                if descs.iter().any(|d| d.owner as usize != peer) {
                    return Err(Error::Remote(format!("rank {peer} exposed a buffer it does not own")));
                }
                link.exposed.push_back(Exposed { descs, tag: hdr.reg, count: hdr.off });
            }
            GET => match self.check_reg(&hdr, false) {
                Ok(()) => {
                    let region = *self.regs.get(&hdr.reg).expect("checked");
                    let (start, len) = (hdr.off as usize, hdr.len as usize);
                    let link = self.links[peer].as_mut().expect("checked");
                    // In pieces of at most DATA_CHUNK; one empty piece for 0 bytes.
                    let mut at = 0;
                    loop {
                        let n = (len - at).min(DATA_CHUNK);
                        let part = region.sub(start + at, n)?;
                        let h = Hdr { kind: DATA, id: hdr.id, off: at as u64, len: n as u64, ..Hdr::default() };
                        link.out.push_back(Out::new(h, Payload::Region { region: part, reg: Some(hdr.reg) }));
                        at += n;
                        if at >= len {
                            break;
                        }
                    }
                    self.flush_link(peer)?;
                }
                Err(why) => self.reply_fail(peer, hdr.id, &why)?,
            },
            DATA => {}
            PUT => {
                if let Sink::Put { id, .. } = sink {
                    let h = Hdr { kind: ACK, id, ..Hdr::default() };
                    link.out.push_back(Out::new(h, Payload::None));
                    self.flush_link(peer)?;
                }
            }
            ACK => {
                if let Some(op) = self.ops.get_mut(&hdr.id) {
                    op.acked = true;
                }
            }
            FAIL => {
                let Sink::Collect(bytes) = sink else { unreachable!("failures collect") };
                if let Some(op) = self.ops.get_mut(&hdr.id) {
                    let why = String::from_utf8_lossy(&bytes);
                    op.error = Some(Error::Remote(format!("rank {peer} refused a one-sided access: {why}")));
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// Stops reading the regions of the queued records `which` selects (they
/// are still alive now, not afterwards): one being written is finished
/// from a copy; the others are dropped, and with `fail` the operation each
/// answers gets a failure record instead.
fn cancel(link: &mut Link, which: impl Fn(&Out) -> bool, fail: bool) {
    let mut fails = Vec::new();
    link.out.retain_mut(|o| {
        if !which(o) {
            return true;
        }
        if o.begun {
            if let Payload::Region { region, .. } = o.payload {
                o.payload = Payload::Bytes(region.read(<[u8]>::to_vec));
            }
            return true;
        }
        fails.push(o.hdr.id);
        false
    });
    for op in fails.into_iter().filter(|_| fail) {
        link.out.push_back(Out::fail(op, b"the owner left the call before answering"));
    }
}

/// Writes a link's queued records into its connection while there is room.
fn flush(link: &mut Link) -> Result<bool> {
    let mut moved = false;
    while let Some(o) = link.out.front_mut() {
        let total = HDR + o.payload.len();
        if !o.begun {
            link.tx.begin(total)?;
            o.begun = true;
        }
        while o.done < total {
            let room = link.tx.room(total - o.done)?;
            if room.is_empty() {
                break;
            }
            let mut n = 0;
            if o.done < HDR {
                n = (HDR - o.done).min(room.len());
                room[..n].copy_from_slice(&o.hdr.encode()[o.done..o.done + n]);
            }
            let m = (room.len() - n).min(total - o.done - n);
            if m > 0 {
                let from = o.done + n - HDR;
                match &o.payload {
                    Payload::None => {}
                    Payload::Bytes(b) => room[n..n + m].copy_from_slice(&b[from..from + m]),
                    Payload::Region { region, .. } => {
                        region.sub(from, m)?.read(|s| room[n..n + m].copy_from_slice(s));
                    }
                }
            }
            link.tx.commit(n + m)?;
            o.done += n + m;
            moved = true;
        }
        if o.done < total {
            break;
        }
        link.out.pop_front();
    }
    // Records still queued wait for room, which only progress may free
    // (a provider that learns of room from completions: RDMA credits).
    if !link.tx.flushed() || !link.out.is_empty() {
        moved |= link.tx.progress()?;
    }
    Ok(moved)
}

impl std::fmt::Debug for Plane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let peers: Vec<usize> = self.links.iter().flatten().map(|l| l.peer).collect();
        write!(f, "Plane(rank {}, links {peers:?}, {} ops)", self.rank, self.ops.len())
    }
}
