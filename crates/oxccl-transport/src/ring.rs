//! A lock-free single-producer/single-consumer byte FIFO with message
//! framing, over a raw region: heap memory ([`Ring::heap`], the `mem`
//! provider) or a shared mapping ([`Ring::from_raw`], the `shm` provider).
//!
//! ## Layout
//! A [`RingHeader`] (`RING_HEADER` = 256 bytes: a metadata line, the
//! producer's `tail` line and the consumer's `head` line, each on its own
//! cache line) and a data area of `capacity` bytes, a power of two ≥ 4 KiB.
//! `tail` counts bytes published by the producer, `head` bytes released by
//! the consumer (both ever-growing, position = counter mod capacity); the
//! producer stores `tail` with Release after writing, the consumer loads it
//! with Acquire before reading, and the other way round for `head`.
//!
//! ## Framing and alignment
//! Each message is a 64-byte header record (`magic`, `flags`, `msg_len`,
//! `tag`, for a by-reference message `pid`, `addr`, `token`, and a
//! `stamp`) followed by the payload, padded to 64. So every payload starts
//! 64-aligned in the data area and a wrap point is always a multiple of 64
//! into a payload. The producer sees free space only up to the consumer's
//! head rounded down to 64, so if both sides always commit/consume
//! multiples of an element size (1..8 bytes), every `room` and `peek`
//! holds whole elements.
//!
//! ## Small messages: one cache line
//! A payload of at most [`INLINE_MAX`] bytes travels inside its header
//! record, and a header is found by its `stamp` (its position in the
//! stream, salted per ring), stored last with Release: the consumer polls
//! the line where the next header will be, not `tail`, so a small message
//! costs the consumer one cache line from the producer, where the tail,
//! the header and the payload cost three (NCCL's LL protocol and Open
//! MPI's fast boxes poll the data the same way). The line the consumer
//! polls is written by the producer only as a header: every message starts
//! with one, and a payload never starts where the next header is awaited.
//! The salt makes a stale payload word of an earlier lap that happens to
//! equal the position (an `arange` tensor, say) no header. `tail` still
//! publishes payloads beyond the header line. Under loom, which models
//! atomics but not the data bytes, headers are found through `tail`.
//!
//! ## Wake-ups
//! After a commit the producer rings the consumer's [`Doorbell`]; after a
//! consume the consumer rings the producer's (a producer waiting for room
//! wakes). Dropping an end marks it closed in the header and rings the
//! other side, whose calls then fail with [`Error::Remote`].
#![allow(unsafe_code)]

use std::any::Any;
use std::collections::VecDeque;
use std::sync::Arc;

use crate::futex::{AtomicU32, AtomicU64, Doorbell, Ordering};
use crate::wire::{u32_at, u64_at};
use crate::{Channel, Error, Piece, Receiver, Result, Sender};

/// Bytes reserved for the [`RingHeader`] in front of the data area.
pub const RING_HEADER: usize = 256;
/// Smallest data area.
pub const MIN_CAPACITY: usize = 4096;
/// Bytes of a message header record in the data area.
pub const MSG_HEADER: usize = 64;
/// Largest message length accepted from a peer (2^48 bytes).
pub const MAX_MSG: u64 = 1 << 48;
/// Bytes a by-reference message is read in at once.
pub const REF_STAGE: usize = 1 << 20;
/// The largest payload that travels inside its header record.
pub const INLINE_MAX: usize = 32;
/// Where an inline payload starts in its header record (at its start: a
/// payload is 64-aligned in the FIFO, inline too).
const INLINE_AT: usize = 0;
/// Where the fixed fields (magic, flags, length, tag) start in a header
/// record, after the inline payload or a by-reference message's source.
const FIELDS_AT: usize = INLINE_MAX;
/// Where the stamp lies in a header record.
const STAMP_AT: usize = 56;

const RING_MAGIC: u64 = 0x4f58_4343_4c52_494e; // "OXCCLRIN"
const MSG_MAGIC: u32 = 0x4f58_4d53; // "OXMS"
const FLAG_REF: u32 = 1;
const FLAG_INLINE: u32 = 2;
const END_FREE: u32 = 0;
const END_ATTACHED: u32 = 1;
const END_CLOSED: u32 = 2;

/// The shared control block of a ring. All-zero plus `magic`/`capacity`
/// (see [`Ring::init_raw`]) is the initial state.
#[repr(C, align(64))]
pub struct RingHeader {
    magic: AtomicU64,
    capacity: AtomicU64,
    prod_state: AtomicU32,
    cons_state: AtomicU32,
    ref_ok: AtomicU32,
    _pad: u32,
    /// Mixed into every header's stamp ([`stamp`]).
    salt: AtomicU64,
    _meta: [u64; 3],
    tail: AtomicU64,
    _line1: [u64; 7],
    head: AtomicU64,
    ref_acked: AtomicU64,
    /// By-reference messages up to this token were abandoned by the sender
    /// (its call failed): their sources may be gone.
    ref_abandoned: AtomicU64,
    _line2: [u64; 5],
}

#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<RingHeader>() <= RING_HEADER);

impl RingHeader {
    fn new(capacity: usize) -> RingHeader {
        RingHeader {
            magic: AtomicU64::new(RING_MAGIC),
            capacity: AtomicU64::new(capacity as u64),
            prod_state: AtomicU32::new(END_FREE),
            cons_state: AtomicU32::new(END_FREE),
            ref_ok: AtomicU32::new(0),
            _pad: 0,
            salt: AtomicU64::new(fresh_salt()),
            _meta: [0; 3],
            tail: AtomicU64::new(0),
            _line1: [0; 7],
            head: AtomicU64::new(0),
            ref_acked: AtomicU64::new(0),
            ref_abandoned: AtomicU64::new(0),
            _line2: [0; 5],
        }
    }
}

/// A random salt for a new ring's stamps.
fn fresh_salt() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_usize(&h as *const _ as usize);
    h.finish()
}

/// The stamp of a header at stream position `pos` in a ring salted with
/// `salt`: never 0 (the value of untouched memory) for a salt's own
/// positions but by chance.
fn stamp(pos: u64, salt: u64) -> u64 {
    (pos / MSG_HEADER as u64 + 1) ^ salt
}

/// Checks a FIFO capacity: a power of two of at least 4 KiB.
pub fn check_capacity(capacity: usize) -> Result<()> {
    if capacity < MIN_CAPACITY || !capacity.is_power_of_two() || capacity > (1 << 40) {
        return Err(Error::invalid(format!(
            "FIFO capacity {capacity} bytes: must be a power of two between {MIN_CAPACITY} and 2^40 \
             (e.g. 4194304)"
        )));
    }
    Ok(())
}

/// Who is at the other end of an endpoint, for error messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Label {
    /// The peer's rank (the receiver for a producer, the sender for a
    /// consumer).
    pub peer: usize,
    /// The connection's channel.
    pub ch: Channel,
}

impl std::fmt::Display for Label {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.ch {
            crate::P2P_CHANNEL => write!(f, "rank {} on the p2p channel", self.peer),
            crate::CONTROL_CHANNEL => write!(f, "rank {} on the control channel", self.peer),
            ch => write!(f, "rank {} on channel {ch}", self.peer),
        }
    }
}

struct HeapRegion {
    hdr: *mut RingHeader,
    /// An anonymous mapping of `len` bytes.
    data: *mut u8,
    len: usize,
}

// SAFETY: the region is plain memory accessed through the ring protocol
// (atomics for the header, SPSC ownership for the data).
unsafe impl Send for HeapRegion {}
// SAFETY: as above.
unsafe impl Sync for HeapRegion {}

impl Drop for HeapRegion {
    fn drop(&mut self) {
        // SAFETY: both were made in `Ring::heap` and are freed once, here,
        // when the last ring handle is gone.
        unsafe {
            drop(Box::from_raw(self.hdr));
            libc::munmap(self.data.cast(), self.len);
        }
    }
}

/// A handle on a ring region; [`producer`](Ring::producer) and
/// [`consumer`](Ring::consumer) attach the two ends (each once).
#[derive(Clone)]
pub struct Ring {
    hdr: *const RingHeader,
    data: *mut u8,
    cap: usize,
    _keep: Arc<dyn Any + Send + Sync>,
}

// SAFETY: the header is accessed with atomics only; data bytes are owned by
// the producer between head and tail+capacity and by the consumer between
// head and tail (SPSC protocol); `_keep` keeps the memory alive.
unsafe impl Send for Ring {}
// SAFETY: as above.
unsafe impl Sync for Ring {}

impl Ring {
    /// A ring in this process's memory with a data area of `capacity`
    /// bytes: an anonymous mapping, whose pages the kernel provides (zeroed)
    /// only where the FIFO is written. Zeroing it up front cost the first
    /// call of 32 ranks as threads seconds: a FIFO (4 MiB by default) per
    /// connection, and connections grow as the square of the ranks.
    pub fn heap(capacity: usize) -> Result<Ring> {
        check_capacity(capacity)?;
        // SAFETY: a fresh private anonymous mapping; no existing memory is
        // touched.
        let data = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                capacity,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if data == libc::MAP_FAILED {
            return Err(Error::System(format!(
                "cannot map a FIFO of {capacity} bytes: {}",
                std::io::Error::last_os_error()
            )));
        }
        let data = data.cast::<u8>();
        let hdr = Box::into_raw(Box::new(RingHeader::new(capacity)));
        let region = Arc::new(HeapRegion { hdr, data, len: capacity });
        Ok(Ring { hdr, data, cap: capacity, _keep: region })
    }

    /// Writes a fresh header (magic, capacity, everything else zero) at
    /// `base`, the start of a region of `RING_HEADER + capacity` bytes.
    ///
    /// # Safety
    /// `base` must be 64-aligned, valid for writes of `RING_HEADER` bytes
    /// and not in use by anyone yet.
    pub unsafe fn init_raw(base: *mut u8, capacity: usize) {
        // SAFETY: the caller guarantees `base` is aligned, writable and
        // unused.
        unsafe { std::ptr::write(base as *mut RingHeader, RingHeader::new(capacity)) }
    }

    /// A ring over a region prepared by [`Ring::init_raw`] (possibly in
    /// another process). Checks the magic and the capacity.
    ///
    /// # Safety
    /// `base` must be 64-aligned and point to `RING_HEADER + capacity`
    /// bytes that stay mapped while `keep` lives and that everyone uses
    /// only through this ring protocol.
    pub unsafe fn from_raw(base: *mut u8, capacity: usize, keep: Arc<dyn Any + Send + Sync>) -> Result<Ring> {
        check_capacity(capacity)?;
        let hdr = base as *const RingHeader;
        // SAFETY: the caller guarantees the header memory is valid; only
        // atomics read it.
        let (magic, cap) = unsafe { ((*hdr).magic.load(Ordering::Acquire), (*hdr).capacity.load(Ordering::Acquire)) };
        if magic != RING_MAGIC || cap != capacity as u64 {
            return Err(Error::Remote(format!(
                "ring header corrupt: magic {magic:#x} (want {RING_MAGIC:#x}), capacity {cap} (want {capacity}); \
                 the segment was not made by this oxccl version"
            )));
        }
        // SAFETY: RING_HEADER bytes into a region of RING_HEADER+capacity.
        let data = unsafe { base.add(RING_HEADER) };
        Ok(Ring { hdr, data, cap: capacity, _keep: keep })
    }

    fn hdr(&self) -> &RingHeader {
        // SAFETY: `_keep` keeps the header alive; it is only accessed
        // through atomics.
        unsafe { &*self.hdr }
    }

    /// The data area's size in bytes.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// The stamp word of the header record at data offset `at`.
    #[cfg(not(loom))]
    fn stamp_word(&self, at: usize) -> &std::sync::atomic::AtomicU64 {
        debug_assert!(at.is_multiple_of(MSG_HEADER) && at < self.cap);
        // SAFETY: `at` is a 64-aligned offset inside the data area (the
        // callers take it modulo the capacity from 64-aligned positions),
        // so the 8 bytes at `at + STAMP_AT` are in bounds and 8-aligned;
        // that word is accessed atomically by both ends while it is a
        // header's (see the module docs), and `_keep` keeps it mapped.
        unsafe { &*(self.data.add(at + STAMP_AT) as *const std::sync::atomic::AtomicU64) }
    }

    fn attach(&self, state: &AtomicU32, what: &str, label: Label) -> Result<()> {
        state.compare_exchange(END_FREE, END_ATTACHED, Ordering::AcqRel, Ordering::Acquire).map(|_| ()).map_err(|_| {
            Error::InvalidUsage(format!(
                "the {what} end of the connection with {label} was already handed out; each end exists once"
            ))
        })
    }

    /// Attaches the producing end; `peer_bell` is the consumer's doorbell,
    /// rung after every commit.
    pub fn producer(&self, peer_bell: Doorbell, label: Label) -> Result<Producer> {
        self.attach(&self.hdr().prod_state, "sending", label)?;
        Ok(Producer {
            ring: self.clone(),
            bell: peer_bell,
            label,
            tail: self.hdr().tail.load(Ordering::Acquire),
            published: self.hdr().tail.load(Ordering::Acquire),
            head_seen: self.hdr().head.load(Ordering::Acquire) & !63,
            pending: VecDeque::new(),
            cur: None,
            line: None,
            last_room: 0,
            bytes: 0,
            ref_next: self.hdr().ref_acked.load(Ordering::Acquire),
            salt: self.hdr().salt.load(Ordering::Acquire),
        })
    }

    /// Attaches the consuming end; `peer_bell` is the producer's doorbell,
    /// rung after every consume.
    pub fn consumer(&self, peer_bell: Doorbell, label: Label) -> Result<Consumer> {
        self.attach(&self.hdr().cons_state, "receiving", label)?;
        Ok(Consumer {
            ring: self.clone(),
            bell: peer_bell,
            label,
            pos: self.hdr().head.load(Ordering::Acquire),
            salt: self.hdr().salt.load(Ordering::Acquire),
            cur: None,
            last_peek: 0,
            bytes: 0,
            staging: Vec::new(),
            staged: 0,
            stage_off: 0,
        })
    }
}

fn closed(label: Label) -> Error {
    let ch = match label.ch {
        crate::P2P_CHANNEL => "the p2p channel".to_string(),
        crate::CONTROL_CHANNEL => "the control channel".to_string(),
        ch => format!("channel {ch}"),
    };
    Error::Remote(format!(
        "rank {} closed its connection on {ch} (it died, was aborted or destroyed its communicator)",
        label.peer
    ))
}

#[derive(Clone, Copy, Debug)]
struct Header {
    flags: u32,
    len: u64,
    pid: u32,
    addr: u64,
    token: u64,
    tag: u64,
}

impl Header {
    /// The record: an inline payload (0..32) or a by-reference message's
    /// pid 0..4, address 8..16 and token 16..24; then magic 32..36, flags
    /// 36..40, length 40..48, tag 48..56, and the stamp (written apart,
    /// last) at [`STAMP_AT`].
    fn encode(&self) -> [u8; MSG_HEADER] {
        let mut b = [0u8; MSG_HEADER];
        if self.flags & FLAG_REF != 0 {
            b[0..4].copy_from_slice(&self.pid.to_le_bytes());
            b[8..16].copy_from_slice(&self.addr.to_le_bytes());
            b[16..24].copy_from_slice(&self.token.to_le_bytes());
        }
        b[FIELDS_AT..FIELDS_AT + 4].copy_from_slice(&MSG_MAGIC.to_le_bytes());
        b[FIELDS_AT + 4..FIELDS_AT + 8].copy_from_slice(&self.flags.to_le_bytes());
        b[FIELDS_AT + 8..FIELDS_AT + 16].copy_from_slice(&self.len.to_le_bytes());
        b[FIELDS_AT + 16..FIELDS_AT + 24].copy_from_slice(&self.tag.to_le_bytes());
        b
    }

    fn decode(b: &[u8; MSG_HEADER], label: Label) -> Result<Header> {
        let (magic, flags, len) = (u32_at(b, FIELDS_AT), u32_at(b, FIELDS_AT + 4), u64_at(b, FIELDS_AT + 8));
        let inline_ok = flags & FLAG_INLINE == 0 || (flags == FLAG_INLINE && len <= INLINE_MAX as u64);
        if magic != MSG_MAGIC || len > MAX_MSG || flags & !(FLAG_REF | FLAG_INLINE) != 0 || !inline_ok {
            return Err(Error::Remote(format!(
                "{label} sent a malformed message header (magic {magic:#x}, flags {flags:#x}, length {len}): \
                 the FIFO is corrupt or the peer runs a different oxccl version"
            )));
        }
        let tag = u64_at(b, FIELDS_AT + 16);
        Ok(Header { flags, len, pid: u32_at(b, 0), addr: u64_at(b, 8), token: u64_at(b, 16), tag })
    }

    fn inline(&self) -> bool {
        self.flags & FLAG_INLINE != 0
    }

    fn by_ref(&self) -> bool {
        self.flags & FLAG_REF != 0
    }
}

/// A header record on its own cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; MSG_HEADER]);

fn round_up(x: u64) -> u64 {
    (x + 63) & !63
}

/// The producing end of a ring: implements [`Sender`].
pub struct Producer {
    ring: Ring,
    bell: Doorbell,
    label: Label,
    tail: u64,
    pending: VecDeque<[u8; MSG_HEADER]>,
    /// The tail the consumer has been told of.
    published: u64,
    /// The consumer's head as last read (rounded down to 64).
    head_seen: u64,
    /// (length, bytes written) of the message being written.
    cur: Option<(u64, u64)>,
    /// The header record of the inline message being written (its
    /// payload filled in place, 64-aligned as in the FIFO).
    line: Option<Line>,
    last_room: usize,
    bytes: u64,
    ref_next: u64,
    salt: u64,
}

impl Producer {
    fn check_peer(&self) -> Result<()> {
        if self.ring.hdr().cons_state.load(Ordering::Acquire) == END_CLOSED {
            return Err(closed(self.label));
        }
        Ok(())
    }

    /// Free bytes, at least `need` if there are: from the consumer's head
    /// as last seen, reloaded only when that is not enough (the head lives
    /// on the consumer's cache line).
    fn free(&mut self, need: u64) -> u64 {
        let cap = self.ring.cap as u64;
        let known = cap.saturating_sub(self.tail.wrapping_sub(self.head_seen));
        if known >= need {
            return known;
        }
        self.head_seen = self.ring.hdr().head.load(Ordering::Acquire) & !63;
        cap.saturating_sub(self.tail.wrapping_sub(self.head_seen))
    }

    /// Publishes what was written (the tail) and rings the consumer.
    fn publish(&mut self) {
        if self.published != self.tail {
            self.published = self.tail;
            self.ring.hdr().tail.store(self.tail, Ordering::Release);
            self.bell.ring();
        }
    }

    /// Writes queued headers while there is room (publishing them unless
    /// a payload follows at once); true when none is left.
    fn flush_headers(&mut self) -> bool {
        self.write_headers();
        self.publish();
        self.pending.is_empty()
    }

    /// Writes queued headers while there is room, without publishing them;
    /// true when none is left.
    fn write_headers(&mut self) -> bool {
        while !self.pending.is_empty() {
            if self.free(MSG_HEADER as u64) < MSG_HEADER as u64 {
                break;
            }
            let h = self.pending.front().expect("checked");
            let at = (self.tail % self.ring.cap as u64) as usize;
            let stamp = stamp(self.tail, self.salt);
            // SAFETY: `at` is 64-aligned and at most cap-64 (tail is a
            // multiple of 64 between messages), the 64 bytes are free (the
            // consumer released them and reads the record only once its
            // stamp, stored last, is this one) and in bounds.
            unsafe { std::ptr::copy_nonoverlapping(h.as_ptr(), self.ring.data.add(at), STAMP_AT) };
            #[cfg(not(loom))]
            self.ring.stamp_word(at).store(stamp, Ordering::Release);
            #[cfg(loom)]
            // SAFETY: as above; under loom the consumer finds headers
            // through `tail`, published after this.
            unsafe {
                std::ptr::copy_nonoverlapping(stamp.to_le_bytes().as_ptr(), self.ring.data.add(at + STAMP_AT), 8)
            };
            self.tail += MSG_HEADER as u64;
            self.pending.pop_front();
        }
        self.pending.is_empty()
    }

    /// Room for `want` more bytes of the inline message being written
    /// (`written` of its `len` so far): in its header record.
    fn inline_room(&mut self, want: usize, len: u64, written: u64) -> &mut [u8] {
        let n = (want as u64).min(len - written) as usize;
        let at = INLINE_AT + written as usize;
        self.last_room = n;
        let line = self.line.get_or_insert(Line([0; MSG_HEADER]));
        &mut line.0[at..at + n]
    }

    fn check_idle(&self, what: impl FnOnce() -> String) -> Result<()> {
        if let Some((len, written)) = self.cur {
            return Err(Error::InvalidUsage(format!(
                "{} to {} while the previous message has {} of its {len} bytes uncommitted; \
                 commit the rest first",
                what(),
                self.label,
                len - written
            )));
        }
        Ok(())
    }

    /// Sends a by-reference message (the receiver reads `len` bytes at
    /// `addr` of process `pid`); `Ok(None)` when the receiver has not
    /// allowed it. Returns the token to pass to [`ref_done`](Self::ref_done).
    pub fn send_ref(&mut self, pid: u32, addr: u64, len: usize, tag: u64) -> Result<Option<u64>> {
        self.check_peer()?;
        self.check_idle(|| "send_ref".into())?;
        if !self.ref_allowed() {
            return Ok(None);
        }
        self.ref_next += 1;
        let h = Header { flags: FLAG_REF, len: len as u64, pid, addr, token: self.ref_next, tag };
        self.pending.push_back(h.encode());
        self.bytes += len as u64;
        self.flush_headers();
        Ok(Some(self.ref_next))
    }

    /// Marks every by-reference message sent so far and not yet read as
    /// abandoned (its call failed; the source may go): the receiver fails
    /// to read it rather than take what is there by then.
    pub fn abandon_refs(&self) {
        if !self.ref_done(self.ref_next) {
            self.ring.hdr().ref_abandoned.store(self.ref_next, Ordering::Release);
        }
    }

    /// Whether the receiver allows by-reference messages.
    pub fn ref_allowed(&self) -> bool {
        self.ring.hdr().ref_ok.load(Ordering::Acquire) != 0
    }

    /// Whether the receiver has finished reading by-reference message
    /// `token` (so its source buffer may be reused).
    pub fn ref_done(&self, token: u64) -> bool {
        self.ring.hdr().ref_acked.load(Ordering::Acquire) >= token
    }
}

impl Sender for Producer {
    fn begin_tagged(&mut self, len: usize, tag: u64) -> Result<()> {
        self.check_peer()?;
        self.check_idle(|| format!("begin({len})"))?;
        if len as u64 > MAX_MSG {
            return Err(Error::invalid(format!("message of {len} bytes to {}: at most 2^48 bytes", self.label)));
        }
        let h = Header { flags: 0, len: len as u64, pid: 0, addr: 0, token: 0, tag };
        self.last_room = 0;
        if (1..=INLINE_MAX).contains(&len) {
            // Written into its header record, which goes out whole.
            self.line = Some(Line(Header { flags: FLAG_INLINE, ..h }.encode()));
            self.cur = Some((len as u64, 0));
            return Ok(());
        }
        self.pending.push_back(h.encode());
        if len > 0 {
            // The header goes out with the first bytes of the payload (one
            // publication, one ring), or at the next progress.
            self.cur = Some((len as u64, 0));
            self.write_headers();
        } else {
            self.flush_headers();
        }
        Ok(())
    }

    fn room(&mut self, want: usize) -> Result<&mut [u8]> {
        self.check_peer()?;
        self.last_room = 0;
        let Some((len, written)) = self.cur else {
            if want == 0 {
                return Ok(&mut []);
            }
            return Err(Error::InvalidUsage(format!(
                "room({want}) to {} without a message in progress: call begin(len) first",
                self.label
            )));
        };
        if self.line.is_some() {
            // Committed bytes are in the FIFO, inline ones too: room only
            // once the record fits behind what is queued.
            if !self.write_headers() || self.free(MSG_HEADER as u64) < MSG_HEADER as u64 {
                self.publish();
                return Ok(&mut []);
            }
            return Ok(self.inline_room(want, len, written));
        }
        if !self.write_headers() {
            self.publish();
            return Ok(&mut []);
        }
        let at = self.tail % self.ring.cap as u64;
        let most = (want as u64).min(len - written).min(self.ring.cap as u64 - at);
        let n = most.min(self.free(most)) as usize;
        if n == 0 {
            // Headers written but no room for bytes yet: let them out.
            self.publish();
        }
        self.last_room = n;
        // SAFETY: [at, at+n) is inside the data area and free: the consumer
        // released it (head) and reads only below the published tail, so
        // nobody else touches it until we publish it in `commit`.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ring.data.add(at as usize), n) })
    }

    fn commit(&mut self, n: usize) -> Result<()> {
        self.check_peer()?;
        if n > self.last_room {
            return Err(Error::InvalidUsage(format!(
                "commit({n}) to {} exceeds the {} bytes of the last room()",
                self.label, self.last_room
            )));
        }
        if n == 0 {
            return Ok(());
        }
        let Some((len, written)) = self.cur.as_mut() else {
            return Err(Error::Internal(format!("commit({n}) to {} without a message", self.label)));
        };
        *written += n as u64;
        let whole = *written == *len;
        self.last_room -= n;
        self.bytes += n as u64;
        if let Some(line) = self.line {
            if whole {
                self.cur = None;
                self.line = None;
                self.pending.push_back(line.0);
                self.flush_headers();
            }
            return Ok(());
        }
        self.tail += n as u64;
        if whole {
            self.tail = round_up(self.tail);
            self.cur = None;
        }
        self.publish();
        Ok(())
    }

    fn progress(&mut self) -> Result<bool> {
        self.check_peer()?;
        let had = (self.pending.len(), self.published);
        self.flush_headers();
        Ok((self.pending.len(), self.published) != had)
    }

    fn flushed(&self) -> bool {
        self.line.is_none() && self.pending.is_empty() && self.published == self.tail
    }

    fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        self.ring.hdr().prod_state.store(END_CLOSED, Ordering::Release);
        self.bell.ring();
    }
}

#[derive(Clone, Copy, Debug)]
struct CurMsg {
    hdr: Header,
    off: u64,
}

/// The consuming end of a ring: implements [`Receiver`].
pub struct Consumer {
    ring: Ring,
    bell: Doorbell,
    label: Label,
    pos: u64,
    #[cfg_attr(loom, allow(dead_code))]
    salt: u64,
    cur: Option<CurMsg>,
    last_peek: usize,
    bytes: u64,
    /// Where pieces of a by-reference message are read to (its first
    /// `staged` bytes are valid; kept allocated between messages).
    staging: Vec<u8>,
    staged: usize,
    stage_off: u64,
}

impl Consumer {
    /// Lets the producer send by-reference messages (read here with
    /// [`crate::cma::vm_read`]).
    pub fn allow_ref(&self, allow: bool) {
        self.ring.hdr().ref_ok.store(allow as u32, Ordering::Release);
    }

    /// The tag of the current message, once its header has arrived (read
    /// without touching its payload: by reference, that is the sender's
    /// memory).
    pub fn current_tag(&mut self) -> Result<Option<u64>> {
        if self.cur.is_none() && !self.next_header()? {
            return self.nothing().map(|_| None);
        }
        Ok(self.cur.map(|m| m.hdr.tag))
    }

    /// The current message, once its header has arrived: (length, sent by
    /// reference).
    pub fn current(&mut self) -> Result<Option<(usize, bool)>> {
        if self.cur.is_none() && !self.next_header()? {
            return self.nothing().map(|_| None);
        }
        Ok(self.cur.map(|m| (m.hdr.len as usize, m.hdr.flags & FLAG_REF != 0)))
    }

    /// Reads the rest of the current by-reference message straight from the
    /// sender's memory into `dst` (the whole message's length), at most
    /// `max` bytes per call; true when it is complete (then consumed and
    /// acknowledged: the sender may reuse its buffer).
    pub fn read_ref_into(&mut self, dst: &mut [u8], max: usize) -> Result<bool> {
        let Some(mut m) = self.cur.filter(|m| m.hdr.flags & FLAG_REF != 0) else {
            return Err(Error::Internal(format!("{}: no by-reference message to read", self.label)));
        };
        if dst.len() as u64 != m.hdr.len || self.stage_off + self.staged as u64 > m.off {
            return Err(Error::Internal(format!(
                "{}: by-reference read of {} bytes into {}",
                self.label,
                m.hdr.len,
                dst.len()
            )));
        }
        let end = (m.off + max as u64).min(m.hdr.len) as usize;
        read_remote(self.label, &m.hdr, m.off as usize, &mut dst[m.off as usize..end])?;
        self.bytes += (end as u64) - m.off;
        m.off = end as u64;
        if m.off == m.hdr.len {
            self.check_abandoned(&m)?;
            self.finish(m);
            self.ring.hdr().head.store(self.pos, Ordering::Release);
            self.bell.ring();
            return Ok(true);
        }
        self.cur = Some(m);
        Ok(false)
    }

    fn peer_closed(&self) -> bool {
        self.ring.hdr().prod_state.load(Ordering::Acquire) == END_CLOSED
    }

    fn nothing(&self) -> Result<Option<Piece<'_>>> {
        if self.peer_closed() {
            // Re-check: what was written before the close still counts.
            let more = match self.cur {
                None => self.header_ready()?,
                Some(_) => self.published()? > 0,
            };
            if !more {
                return Err(closed(self.label));
            }
        }
        Ok(None)
    }

    /// Payload bytes published beyond `pos`.
    fn published(&self) -> Result<u64> {
        let tail = self.ring.hdr().tail.load(Ordering::Acquire);
        // A header can be seen before the tail that covers it is stored:
        // then nothing beyond it is published yet.
        let n = tail.saturating_sub(self.pos);
        if n > self.ring.cap as u64 {
            return Err(Error::Remote(format!(
                "{}: FIFO counters are inconsistent (tail {tail}, head {}); the segment is corrupt",
                self.label, self.pos
            )));
        }
        Ok(n)
    }

    /// Whether the next header record, at `pos`, has been written.
    #[cfg(not(loom))]
    fn header_ready(&self) -> Result<bool> {
        let at = (self.pos % self.ring.cap as u64) as usize;
        Ok(self.ring.stamp_word(at).load(Ordering::Acquire) == stamp(self.pos, self.salt))
    }

    /// Whether the next header record, at `pos`, has been published.
    #[cfg(loom)]
    fn header_ready(&self) -> Result<bool> {
        Ok(self.published()? >= MSG_HEADER as u64)
    }

    fn next_header(&mut self) -> Result<bool> {
        if !self.header_ready()? {
            return Ok(false);
        }
        let at = (self.pos % self.ring.cap as u64) as usize;
        let mut b = [0u8; MSG_HEADER];
        // SAFETY: a header record written before its stamp (Acquire above)
        // at a 64-aligned position inside the data area; the producer does
        // not touch it until we release it.
        unsafe { std::ptr::copy_nonoverlapping(self.ring.data.add(at), b.as_mut_ptr(), STAMP_AT) };
        let hdr = Header::decode(&b, self.label)?;
        if hdr.flags & FLAG_REF != 0 && self.ring.hdr().ref_ok.load(Ordering::Acquire) == 0 {
            return Err(Error::Remote(format!(
                "{} sent a by-reference message on a connection that does not allow them",
                self.label
            )));
        }
        self.pos += MSG_HEADER as u64;
        self.cur = Some(CurMsg { hdr, off: 0 });
        self.staged = 0;
        self.stage_off = 0;
        Ok(true)
    }

    /// A by-reference message read to its end after the sender gave its
    /// source up (its call failed): what was read may be anything.
    fn check_abandoned(&self, m: &CurMsg) -> Result<()> {
        if self.ring.hdr().ref_abandoned.load(Ordering::Acquire) >= m.hdr.token {
            return Err(Error::Remote(format!(
                "{}: the sender abandoned a by-reference message of {} bytes (its call failed)",
                self.label, m.hdr.len
            )));
        }
        Ok(())
    }

    fn finish(&mut self, m: CurMsg) {
        if m.hdr.flags & FLAG_REF != 0 {
            self.ring.hdr().ref_acked.store(m.hdr.token, Ordering::Release);
        } else {
            self.pos = round_up(self.pos);
        }
        self.cur = None;
        self.staged = 0;
    }
}

/// Reads `dst.len()` bytes at offset `at` of by-reference message `hdr`
/// straight from the sender's memory.
fn read_remote(label: Label, hdr: &Header, at: usize, dst: &mut [u8]) -> Result<()> {
    let mut done = 0;
    while done < dst.len() {
        let got = crate::cma::vm_read(hdr.pid as i32, hdr.addr as usize + at + done, &mut dst[done..])
            .map_err(|e| Error::Remote(format!("{label}: reading a by-reference message: {e}")))?;
        if got == 0 {
            return Err(Error::Remote(format!(
                "{label}: by-reference message of {} bytes at {:#x} in pid {} is no longer readable",
                hdr.len, hdr.addr, hdr.pid
            )));
        }
        done += got;
    }
    Ok(())
}

impl Receiver for Consumer {
    fn peek(&mut self) -> Result<Option<Piece<'_>>> {
        self.last_peek = 0;
        if self.cur.is_none() && !self.next_header()? {
            return self.nothing();
        }
        let Some(m) = self.cur else { return self.nothing() };
        let len = m.hdr.len;
        if len == 0 {
            return Ok(Some(Piece { msg_len: 0, offset: 0, data: &[], tag: m.hdr.tag }));
        }
        if m.hdr.flags & FLAG_REF != 0 {
            let staged_end = self.stage_off + self.staged as u64;
            if m.off >= staged_end {
                let n = (len - m.off).min(REF_STAGE as u64) as usize;
                if self.staging.len() < n {
                    self.staging.resize(n, 0);
                }
                self.staged = n;
                self.stage_off = m.off;
                read_remote(self.label, &m.hdr, m.off as usize, &mut self.staging[..n])?;
            }
            let from = (m.off - self.stage_off) as usize;
            self.last_peek = self.staged - from;
            let data = &self.staging[from..self.staged];
            return Ok(Some(Piece { msg_len: len as usize, offset: m.off as usize, data, tag: m.hdr.tag }));
        }
        if m.hdr.inline() {
            let at = ((self.pos - MSG_HEADER as u64) % self.ring.cap as u64) as usize + INLINE_AT + m.off as usize;
            let n = (len - m.off) as usize;
            self.last_peek = n;
            // SAFETY: the rest of the payload inside the header record just
            // behind `pos` (read after its stamp; not released until the
            // message is consumed).
            let data = unsafe { std::slice::from_raw_parts(self.ring.data.add(at), n) };
            return Ok(Some(Piece { msg_len: len as usize, offset: m.off as usize, data, tag: m.hdr.tag }));
        }
        let at = self.pos % self.ring.cap as u64;
        let n = self.published()?.min(len - m.off).min(self.ring.cap as u64 - at) as usize;
        if n == 0 {
            return self.nothing();
        }
        self.last_peek = n;
        // SAFETY: [at, at+n) holds bytes the producer published (below tail,
        // Acquire) and will not touch until we release them with `head`.
        let data = unsafe { std::slice::from_raw_parts(self.ring.data.add(at as usize), n) };
        Ok(Some(Piece { msg_len: len as usize, offset: m.off as usize, data, tag: m.hdr.tag }))
    }

    fn consume(&mut self, n: usize) -> Result<()> {
        let Some(mut m) = self.cur else {
            return Err(Error::InvalidUsage(format!(
                "consume({n}) from {} without a message: peek() first",
                self.label
            )));
        };
        if n > self.last_peek {
            return Err(Error::InvalidUsage(format!(
                "consume({n}) from {} exceeds the {} bytes of the last peek()",
                self.label, self.last_peek
            )));
        }
        if n == 0 && m.hdr.len != 0 {
            return Ok(());
        }
        m.off += n as u64;
        self.last_peek -= n;
        self.bytes += n as u64;
        if !m.hdr.by_ref() && !m.hdr.inline() {
            self.pos += n as u64;
        }
        if m.off == m.hdr.len {
            if m.hdr.flags & FLAG_REF != 0 {
                self.check_abandoned(&m)?;
            }
            self.finish(m);
        } else {
            self.cur = Some(m);
        }
        // An inline message read in part still lies in its header record,
        // just behind `pos`: the producer must not have that line back yet.
        let release = match self.cur {
            Some(m) if m.hdr.inline() => self.pos - MSG_HEADER as u64,
            _ => self.pos,
        };
        self.ring.hdr().head.store(release, Ordering::Release);
        self.bell.ring();
        Ok(())
    }

    fn progress(&mut self) -> Result<bool> {
        Ok(false)
    }

    fn bytes(&self) -> u64 {
        self.bytes
    }

    fn next_tag(&mut self) -> Result<Option<u64>> {
        self.current_tag()
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.ring.hdr().cons_state.store(END_CLOSED, Ordering::Release);
        self.bell.ring();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn pair(cap: usize) -> (Producer, Consumer, Doorbell, Doorbell) {
        let r = Ring::heap(cap).unwrap();
        let (pb, cb) = (Doorbell::heap(), Doorbell::heap());
        let p = r.producer(cb.clone(), Label { peer: 1, ch: 0 }).unwrap();
        let c = r.consumer(pb.clone(), Label { peer: 0, ch: 0 }).unwrap();
        (p, c, pb, cb)
    }

    #[test]
    fn capacity_checked() {
        assert!(Ring::heap(4095).is_err());
        assert!(Ring::heap(6144).is_err());
        assert!(Ring::heap(2048).is_err());
        assert_eq!(Ring::heap(8192).unwrap().capacity(), 8192);
    }

    #[test]
    fn roundtrip_rings_both_doorbells() {
        let (mut p, mut c, pb, cb) = pair(4096);
        let (s0, s1) = (pb.seq(), cb.seq());
        p.begin(5).unwrap();
        let room = p.room(100).unwrap();
        assert_eq!(room.len(), 5);
        room.copy_from_slice(b"hello");
        p.commit(5).unwrap();
        assert_ne!(cb.seq(), s1, "commit rang the consumer");
        let piece = c.peek().unwrap().unwrap();
        assert_eq!((piece.msg_len, piece.offset, piece.data), (5, 0, &b"hello"[..]));
        c.consume(5).unwrap();
        assert_ne!(pb.seq(), s0, "consume rang the producer");
        assert!(c.peek().unwrap().is_none());
        assert_eq!((p.bytes(), c.bytes()), (5, 5));
    }

    #[test]
    fn each_end_once_and_close_is_reported() {
        let r = Ring::heap(4096).unwrap();
        let l = Label { peer: 3, ch: 0 };
        let p = r.producer(Doorbell::heap(), l).unwrap();
        assert!(r.producer(Doorbell::heap(), l).is_err());
        let mut c = r.consumer(Doorbell::heap(), l).unwrap();
        drop(p);
        let e = c.peek().unwrap_err().to_string();
        assert!(e.contains("rank 3 closed its connection on channel 0"), "{e}");
    }

    #[test]
    fn bytes_committed_before_close_are_delivered() {
        let (mut p, mut c, _pb, _cb) = pair(4096);
        p.begin(3).unwrap();
        p.room(3).unwrap().copy_from_slice(b"abc");
        p.commit(3).unwrap();
        drop(p);
        assert_eq!(c.peek().unwrap().unwrap().data, b"abc");
        c.consume(3).unwrap();
        assert!(matches!(c.peek(), Err(Error::Remote(_))));
    }

    #[test]
    fn bad_header_is_a_remote_error() {
        // A header written at begin (a payload of its own), and an inline
        // message's, written whole at its commit.
        for (len, scribble_after_commit) in [(64, false), (8, true)] {
            let (mut p, mut c, _pb, _cb) = pair(4096);
            p.begin(len).unwrap();
            // SAFETY: test: scribble on the header's magic (nobody reads it concurrently).
            let scribble = |p: &Producer| unsafe { *p.ring.data.add(FIELDS_AT) = 0xff };
            if !scribble_after_commit {
                scribble(&p);
            }
            p.room(len).unwrap();
            p.commit(len).unwrap();
            if scribble_after_commit {
                scribble(&p);
            }
            let e = c.peek().unwrap_err();
            assert!(matches!(e, Error::Remote(_)), "{e}");
            assert!(e.to_string().contains("malformed"), "{e}");
        }
    }

    /// Messages of every size up to the inline limit and beyond, over many
    /// laps of the FIFO, written and read in two pieces each: every byte
    /// arrives, in order, with its tag; an inline message takes one line.
    #[test]
    fn small_messages_travel_inside_their_header_over_many_laps() {
        let (mut p, mut c, _pb, _cb) = pair(4096);
        let sizes: Vec<usize> = (0..=INLINE_MAX + 8).chain([64, 100, 1000]).collect();
        let byte = |i: usize, k: usize| (i * 31 + k * 7) as u8;
        for lap in 0..40 {
            for (i, &len) in sizes.iter().enumerate() {
                let before = p.tail;
                p.begin_tagged(len, (lap * 1000 + i) as u64).unwrap();
                let half = len / 2;
                for (mut from, to) in [(0, half), (half, len)] {
                    while from < to {
                        // Room stops at the end of the data area.
                        let room = p.room(to - from).unwrap();
                        assert!(!room.is_empty(), "a message of {len} bytes fits");
                        let n = room.len();
                        room.iter_mut().enumerate().for_each(|(k, b)| *b = byte(i, from + k));
                        p.commit(n).unwrap();
                        from += n;
                    }
                }
                assert!(p.flushed());
                if (1..=INLINE_MAX).contains(&len) {
                    assert_eq!(p.tail - before, MSG_HEADER as u64, "{len} bytes inline");
                }
                let mut got = Vec::new();
                while got.len() < len || (len == 0 && got.is_empty()) {
                    let piece = c.peek().unwrap().expect("published");
                    assert_eq!((piece.msg_len, piece.offset, piece.tag), (len, got.len(), (lap * 1000 + i) as u64));
                    let take = piece.data.len().min(len.div_ceil(2).max(1)).min(len - got.len());
                    got.extend_from_slice(&piece.data[..take]);
                    c.consume(take).unwrap();
                    if len == 0 {
                        break;
                    }
                }
                assert!(got.iter().enumerate().all(|(k, &b)| b == byte(i, k)), "lap {lap}, {len} bytes");
                assert!(c.peek().unwrap().is_none());
            }
        }
    }

    /// An inline message read in part keeps its line: the producer cannot
    /// write over the rest of it a lap later, even with the FIFO full
    /// behind it; its bytes arrive intact, and the next message goes out
    /// once the line is released.
    #[test]
    fn an_inline_message_read_in_part_keeps_its_line() {
        let (mut p, mut c, _pb, _cb) = pair(4096);
        p.begin(32).unwrap();
        p.room(32).unwrap().iter_mut().enumerate().for_each(|(k, b)| *b = k as u8);
        p.commit(32).unwrap();
        assert_eq!(c.peek().unwrap().unwrap().data.len(), 32);
        c.consume(8).unwrap();
        // Fill the rest of the data area: one message up to its end...
        let len = 4096 - 2 * MSG_HEADER;
        p.begin(len).unwrap();
        let mut off = 0;
        while off < len {
            let n = p.room(len - off).unwrap().len();
            assert!(n > 0, "the first lap has room");
            p.commit(n).unwrap();
            off += n;
        }
        // ...and an inline one, whose record would land on the line of
        // the message being read.
        p.begin(4).unwrap();
        assert!(p.room(4).unwrap().is_empty(), "no room while the line is still being read");
        let piece = c.peek().unwrap().unwrap();
        assert_eq!((piece.offset, piece.data), (8, &(8..32).collect::<Vec<u8>>()[..]));
        c.consume(24).unwrap();
        p.room(4).unwrap().copy_from_slice(b"next");
        p.commit(4).unwrap();
        assert!(p.flushed());
        let n = c.peek().unwrap().unwrap().data.len();
        c.consume(n).unwrap();
        while c.peek().unwrap().is_some_and(|p| p.msg_len == len) {
            let n = c.peek().unwrap().unwrap().data.len();
            c.consume(n).unwrap();
        }
        assert_eq!(c.peek().unwrap().unwrap().data, b"next");
    }

    /// Where the consumer waits for the next header lie the bytes of an
    /// earlier lap: a payload made to look like the header due there
    /// (magic, and the position's stamp without the ring's salt) is no
    /// message.
    #[test]
    fn a_stale_payload_that_looks_like_the_next_header_is_none() {
        let (mut p, mut c, _pb, _cb) = pair(4096);
        let len = 4096 - MSG_HEADER;
        p.begin(len).unwrap();
        let room = p.room(len).unwrap();
        for (line, chunk) in room.chunks_mut(MSG_HEADER).enumerate() {
            // This line lies at offset 64 (line + 1); the header due there
            // one lap later sits at position 4096 + that offset.
            let pos = 4096 + MSG_HEADER as u64 * (line as u64 + 1);
            chunk[FIELDS_AT..FIELDS_AT + 4].copy_from_slice(&MSG_MAGIC.to_le_bytes());
            chunk[STAMP_AT..].copy_from_slice(&(pos / MSG_HEADER as u64 + 1).to_le_bytes());
        }
        p.commit(len).unwrap();
        let n = c.peek().unwrap().unwrap().data.len();
        c.consume(n).unwrap();
        // One inline message at offset 0; the consumer then waits at 64.
        p.begin(4).unwrap();
        p.room(4).unwrap().copy_from_slice(b"ping");
        p.commit(4).unwrap();
        assert_eq!(c.peek().unwrap().unwrap().data, b"ping");
        c.consume(4).unwrap();
        assert!(c.peek().unwrap().is_none(), "a stale payload line was taken for a header");
    }

    #[test]
    fn zero_byte_headers_queue_when_full() {
        let (mut p, mut c, _pb, _cb) = pair(4096);
        p.begin(4096 - 64).unwrap();
        let n = p.room(usize::MAX).unwrap().len();
        assert_eq!(n, 4096 - 64);
        p.commit(n).unwrap();
        p.begin(0).unwrap();
        p.begin(0).unwrap();
        assert!(!p.flushed());
        assert_eq!(c.peek().unwrap().unwrap().data.len(), 4096 - 64);
        c.consume(4096 - 64).unwrap();
        assert!(p.progress().unwrap());
        assert!(p.flushed());
        for _ in 0..2 {
            let piece = c.peek().unwrap().unwrap();
            assert_eq!(piece.msg_len, 0);
            c.consume(0).unwrap();
        }
        assert!(c.peek().unwrap().is_none());
    }
}
