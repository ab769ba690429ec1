//! The shared-memory provider: processes on one host.
//!
//! Each rank creates one *inbox* segment, a file in `/dev/shm`, holding its
//! [`Doorbell`] and one [`Ring`] per (sender rank, channel slot): slots
//! `0..nchannels` for channels `0..nchannels` and one more for
//! [`P2P_CHANNEL`]. A peer maps it as an [`Outbox`] and writes into its
//! ring. The integrator:
//!
//! 1. `Inbox::create(name, my_rank, nranks, nchannels, capacity)` and
//!    publishes `name` (bootstrap all-gather);
//! 2. `Outbox::open(peer_name, my_rank)` for every local peer, then a
//!    barrier, then [`Inbox::unlink`] (nothing stays in `/dev/shm`, even if
//!    the process dies later);
//! 3. sends with `outbox.sender(ch)` (rings the peer's doorbell) and
//!    receives with `inbox.receiver(from, ch, from_doorbell)`, where
//!    `from_doorbell` is `outbox_to_from.doorbell()` — the consumer rings the
//!    producer's doorbell when it frees room, so it needs the producer's
//!    segment mapped (every rank maps every local peer's inbox);
//! 4. watches local peers with [`PidWatch`] (pids from
//!    [`Outbox::peer_pid`]).
//!
//! ## Single copy
//! [`ShmSender::send_ref`] puts a descriptor {pid, address, length} in the
//! FIFO instead of the bytes; the receiver reads them with
//! [`vm_read`] (`process_vm_readv`) in pieces of at most 1 MiB, served by
//! `peek` as usual, and acknowledges through a counter in the ring header
//! ([`ShmSender::ref_done`]). The receiver must first allow it with
//! [`ShmReceiver::allow_ref`], which probes whether the kernel lets it read
//! the sender (same user and ptrace permission, see `yama/ptrace_scope`).
#![allow(unsafe_code)]

use std::any::Any;
use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::Arc;

use crate::futex::{Doorbell, DoorbellWord};
use crate::region::Region;
use crate::ring::{Consumer, Label, Producer, RING_HEADER, Ring, check_capacity};
use crate::{CONTROL_CHANNEL, Channel, Error, P2P_CHANNEL, Piece, Receiver, Result, Sender};
use std::sync::atomic::{AtomicU64, Ordering};

mod provider;
pub use provider::{ShmFactory, ShmOptions, ShmProvider};

/// A word the owner sets when it drops its inbox (its communicator closed,
/// not killed): peers then take its process's end for no failure.
const CLOSED_OFFSET: usize = BUSY_OFFSET + 8 * REG_SLOTS;
const _: () = assert!(CLOSED_OFFSET + 8 <= SEG_HEADER && REG_OFFSET >= BELL_OFFSET + 8);

const SEG_MAGIC: u64 = 0x4f58_4343_4c53_484d; // "OXCCLSHM"
const SEG_VERSION: u32 = 3;
const SEG_HEADER: usize = 4096;
const BELL_OFFSET: usize = 64;
/// Registration slots (one `u64` token each) after the doorbell: a peer
/// checks the token before every cross-memory access to a registration.
const REG_OFFSET: usize = 128;
/// Registrations a rank can have at once.
pub const REG_SLOTS: usize = 32;
/// Per registration slot, how many peers are writing into it right now
/// (after the tokens): the owner revoking a registration waits for them.
const BUSY_OFFSET: usize = REG_OFFSET + 8 * REG_SLOTS;

/// The fixed fields at the start of a segment (written once, before the
/// segment gets its public name).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct SegHeader {
    magic: u64,
    version: u32,
    owner: u32,
    nranks: u32,
    nslots: u32,
    capacity: u64,
    stride: u64,
    total: u64,
    pid: u32,
    /// The creator's pid namespace (its inode's low 32 bits): a pid means
    /// something only there.
    pidns: u32,
}

struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is shared memory accessed only through atomics and
// the ring protocol.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` came from a successful mmap and nobody uses the
        // mapping any more (every ring and doorbell handle holds the Arc).
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

fn sys(what: String) -> Error {
    Error::System(format!("{what}: {}", std::io::Error::last_os_error()))
}

fn map(file: &File, len: usize, what: &str) -> Result<Arc<Mapping>> {
    // SAFETY: mapping `len` bytes of an open file, shared, read-write; the
    // result is checked.
    let ptr = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, file.as_raw_fd(), 0)
    };
    if ptr == libc::MAP_FAILED {
        return Err(sys(format!("mmap of {len} bytes of shm segment {what}")));
    }
    Ok(Arc::new(Mapping { ptr: ptr as *mut u8, len }))
}

fn shm_path(name: &str) -> Result<PathBuf> {
    if name.is_empty() || name.len() > 200 || name.contains('/') || name.starts_with('.') || name.contains('\0') {
        return Err(Error::invalid(format!(
            "shm segment name {name:?}: must be 1..200 characters, without '/' or NUL, not starting with '.'"
        )));
    }
    Ok(PathBuf::from("/dev/shm").join(name))
}

/// Whether process `pid` exists (a process of another user counts).
fn pid_alive(pid: u32) -> bool {
    let Ok(p) = libc::pid_t::try_from(pid) else { return false };
    if p <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists; no memory is
    // touched.
    let r = unsafe { libc::kill(p, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// This process's pid namespace (the low 32 bits of its inode; 0 if
/// unknown).
fn pid_namespace() -> u32 {
    std::fs::read_link("/proc/self/ns/pid")
        .ok()
        .and_then(|p| p.to_string_lossy().trim_start_matches("pid:[").trim_end_matches(']').parse::<u64>().ok())
        .map_or(0, |ino| ino as u32)
}

/// The creator's pid recorded in the segment file at `path`, if it is an
/// oxccl segment (magic checked) made in this pid namespace.
fn segment_pid(path: &std::path::Path) -> Option<u32> {
    use std::io::Read;
    let mut b = [0u8; std::mem::size_of::<SegHeader>()];
    std::fs::File::open(path).ok()?.read_exact(&mut b).ok()?;
    let word = |at: usize| u32::from_ne_bytes(b[at..at + 4].try_into().expect("4 bytes"));
    let magic = u64::from_ne_bytes(b[..8].try_into().ok()?);
    let ns = word(std::mem::offset_of!(SegHeader, pidns));
    (magic == SEG_MAGIC && ns == pid_namespace() && ns != 0).then(|| word(std::mem::offset_of!(SegHeader, pid)))
}

/// Whether `/dev/shm/<file>` is something a crashed process left: a
/// segment (published under `name`, or any `oxccl-*` one) whose creator
/// is gone, or a half-built `.<name>.<pid>.tmp` whose builder is gone.
fn stale(file: &str, name: &str) -> bool {
    let path = PathBuf::from("/dev/shm").join(file);
    if let Some(rest) = file.strip_prefix('.').and_then(|f| f.strip_suffix(".tmp")) {
        let Some((base, pid)) = rest.rsplit_once('.') else { return false };
        let ours = base == name || base.starts_with("oxccl-");
        return ours && pid.parse().is_ok_and(|p| !pid_alive(p));
    }
    (file == name || file.starts_with("oxccl-")) && segment_pid(&path).is_some_and(|p| !pid_alive(p))
}

/// Removes what crashed processes left in `/dev/shm` (see [`stale`]): a
/// rank killed between publishing its segment and unlinking it leaves one,
/// and a rerun under the same name must not fail for it. Files of other
/// users cannot be removed and are left alone.
fn sweep_stale(name: &str) {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else { return };
    for e in dir.flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        if stale(&file, name) && std::fs::remove_file(e.path()).is_ok() {
            tracing::info!("removed {}: left by a process that is gone", e.path().display());
        }
    }
}

fn layout(nranks: usize, nslots: usize, capacity: usize) -> Option<(usize, usize)> {
    let stride = (RING_HEADER + capacity).next_multiple_of(4096);
    let total = nranks.checked_mul(nslots)?.checked_mul(stride)?.checked_add(SEG_HEADER)?;
    Some((stride, total))
}

/// The common view of a mapped segment.
struct Segment {
    map: Arc<Mapping>,
    hdr: SegHeader,
    name: String,
}

impl Segment {
    fn slot(&self, ch: Channel) -> Result<usize> {
        let nch = self.hdr.nslots as usize - 2;
        if ch == P2P_CHANNEL {
            Ok(nch)
        } else if ch == CONTROL_CHANNEL {
            Ok(nch + 1)
        } else if (ch as usize) < nch {
            Ok(ch as usize)
        } else {
            Err(Error::invalid(format!(
                "channel {ch} out of range: shm segment {} has {nch} channels (plus p2p and control)",
                self.name
            )))
        }
    }

    /// Registration slot `i`'s token word.
    fn reg_word(&self, i: usize) -> &AtomicU64 {
        self.header_word(REG_OFFSET, i)
    }

    /// Registration slot `i`'s count of writers in progress.
    fn busy_word(&self, i: usize) -> &AtomicU64 {
        self.header_word(BUSY_OFFSET, i)
    }

    /// The word the owner sets when it closes.
    fn closed_word(&self) -> &AtomicU64 {
        // SAFETY: CLOSED_OFFSET + 8 <= SEG_HEADER (checked at compile
        // time) lies inside the mapping's header page, 8-aligned; every
        // process accesses it only atomically; the mapping outlives `&self`.
        unsafe { &*(self.map.ptr.add(CLOSED_OFFSET) as *const AtomicU64) }
    }

    fn header_word(&self, base: usize, i: usize) -> &AtomicU64 {
        assert!(i < REG_SLOTS, "registration slot {i} of {REG_SLOTS}");
        // SAFETY: base + 8 * REG_SLOTS <= SEG_HEADER (checked at compile
        // time for both bases) lies inside the mapping's header page,
        // 8-aligned; every process accesses these words only atomically;
        // the mapping outlives `&self`.
        unsafe { &*(self.map.ptr.add(base + 8 * i) as *const AtomicU64) }
    }

    fn ring(&self, from: usize, ch: Channel) -> Result<Ring> {
        if from >= self.hdr.nranks as usize {
            return Err(Error::invalid(format!(
                "sender rank {from} out of range for shm segment {} of {} ranks",
                self.name, self.hdr.nranks
            )));
        }
        let slot = self.slot(ch)?;
        let off = SEG_HEADER + (from * self.hdr.nslots as usize + slot) * self.hdr.stride as usize;
        let keep: Arc<dyn Any + Send + Sync> = self.map.clone();
        // SAFETY: `off + RING_HEADER + capacity <= total == mapping length`
        // (checked at create/open); the offset is 4096-aligned; the ring
        // region is used only through the ring protocol; `keep` holds the
        // mapping.
        unsafe { Ring::from_raw(self.map.ptr.add(off), self.hdr.capacity as usize, keep) }
    }

    fn doorbell(&self) -> Doorbell {
        let keep: Arc<dyn Any + Send + Sync> = self.map.clone();
        // SAFETY: BELL_OFFSET is 4-aligned, inside the header page, used
        // only as a DoorbellWord by every process; `keep` holds the mapping.
        unsafe { Doorbell::from_raw(self.map.ptr.add(BELL_OFFSET) as *const DoorbellWord, keep) }
    }
}

/// A rank's own segment: the rings its local peers write into.
pub struct Inbox {
    seg: Segment,
    path: PathBuf,
    linked: bool,
    my_rank: usize,
}

impl Inbox {
    /// Creates the segment `/dev/shm/<name>` (an error if it exists) for
    /// rank `my_rank` of `nranks`, with `nchannels` channels plus the p2p
    /// and control channels, each FIFO `capacity` bytes (a power of two ≥
    /// 4 KiB; pages are touched only as they are used).
    pub fn create(name: &str, my_rank: usize, nranks: usize, nchannels: usize, capacity: usize) -> Result<Inbox> {
        #[cfg(loom)]
        if true {
            return Err(Error::Unavailable("shm segments are not modelled under loom".into()));
        }
        check_capacity(capacity)?;
        if my_rank >= nranks || nranks > u32::MAX as usize || nchannels >= 1 << 16 {
            return Err(Error::invalid(format!(
                "shm inbox {name}: rank {my_rank} of {nranks} with {nchannels} channels is out of range"
            )));
        }
        let path = shm_path(name)?;
        sweep_stale(name);
        let nslots = nchannels + 2;
        let (stride, total) = layout(nranks, nslots, capacity).ok_or_else(|| {
            Error::invalid(format!("shm inbox {name}: {nranks} ranks x {nslots} slots x {capacity} bytes overflows"))
        })?;
        // Build under a private name, then link it to the public one so a
        // peer never sees a half-initialised segment.
        let tmp = PathBuf::from("/dev/shm").join(format!(".{name}.{}.tmp", std::process::id()));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| Error::System(format!("creating shm segment {}: {e}", tmp.display())))?;
        let built = (|| -> Result<Segment> {
            file.set_len(total as u64).map_err(|e| {
                Error::System(format!("sizing shm segment {name} to {total} bytes: {e} (is /dev/shm full?)"))
            })?;
            let map = map(&file, total, name)?;
            let hdr = SegHeader {
                magic: SEG_MAGIC,
                version: SEG_VERSION,
                owner: my_rank as u32,
                nranks: nranks as u32,
                nslots: nslots as u32,
                capacity: capacity as u64,
                stride: stride as u64,
                total: total as u64,
                pid: std::process::id(),
                pidns: pid_namespace(),
            };
            // SAFETY: the fresh mapping is ours alone (private name); the
            // header and each ring header lie inside it and are aligned.
            unsafe {
                std::ptr::write(map.ptr as *mut SegHeader, hdr);
                for i in 0..nranks * nslots {
                    Ring::init_raw(map.ptr.add(SEG_HEADER + i * stride), capacity);
                }
            }
            Ok(Segment { map, hdr, name: name.to_string() })
        })();
        let linked = built.is_ok().then(|| std::fs::hard_link(&tmp, &path));
        let _ = std::fs::remove_file(&tmp);
        let seg = built?;
        linked.unwrap_or(Ok(())).map_err(|e| {
            Error::System(format!(
                "publishing shm segment {}: {e} (a segment of that name exists: another communicator \
                 or a leftover; pick a fresh name)",
                path.display()
            ))
        })?;
        Ok(Inbox { seg, path, linked: true, my_rank })
    }

    /// The owning rank.
    pub fn rank(&self) -> usize {
        self.my_rank
    }

    /// The segment's name.
    pub fn name(&self) -> &str {
        &self.seg.name
    }

    /// This rank's doorbell (rung by peers' commits into this inbox and by
    /// their consumes of what this rank sent).
    pub fn doorbell(&self) -> Doorbell {
        self.seg.doorbell()
    }

    /// Sets registration slot `i` to `token` (a new registration).
    pub fn set_reg(&self, i: usize, token: u64) {
        self.seg.reg_word(i).store(token, Ordering::SeqCst);
    }

    /// Revokes registration slot `i` and waits (at most `limit`) until no
    /// peer is still writing into it; false if one still was.
    pub fn revoke(&self, i: usize, limit: std::time::Duration) -> bool {
        self.seg.reg_word(i).store(0, Ordering::SeqCst);
        let end = std::time::Instant::now() + limit;
        while self.seg.busy_word(i).load(Ordering::SeqCst) != 0 {
            if std::time::Instant::now() > end {
                return false;
            }
            std::thread::yield_now();
        }
        true
    }

    /// Removes the name from `/dev/shm` (mappings stay valid). Call once
    /// every peer has opened its [`Outbox`]; also done on drop.
    pub fn unlink(&mut self) -> Result<()> {
        if self.linked {
            self.linked = false;
            std::fs::remove_file(&self.path)
                .map_err(|e| Error::System(format!("unlinking shm segment {}: {e}", self.path.display())))?;
        }
        Ok(())
    }

    /// The receiving end for messages from rank `from` on `ch`;
    /// `from_doorbell` is rank `from`'s doorbell (`Outbox::doorbell` of its
    /// segment), rung when room is freed.
    pub fn receiver(&self, from: usize, ch: Channel, from_doorbell: Doorbell) -> Result<Box<dyn Receiver>> {
        Ok(Box::new(self.shm_receiver(from, ch, from_doorbell)?))
    }

    /// Like [`receiver`](Self::receiver), with the shm-specific methods.
    pub fn shm_receiver(&self, from: usize, ch: Channel, from_doorbell: Doorbell) -> Result<ShmReceiver> {
        let ring = self.seg.ring(from, ch)?;
        Ok(ShmReceiver { c: ring.consumer(from_doorbell, Label { peer: from, ch })? })
    }
}

impl Inbox {
    /// Says, where local peers look, that this rank closed its
    /// communicator: its process ending afterwards is no failure
    /// ([`Outbox::owner_closed`]).
    pub fn mark_closed(&self) {
        self.seg.closed_word().store(1, Ordering::Release);
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        // Before the process ends: a peer that sees it end reads this.
        self.mark_closed();
        let _ = self.unlink();
    }
}

/// A peer's inbox mapped by this rank, to send to it.
pub struct Outbox {
    seg: Segment,
    my_rank: usize,
}

impl Outbox {
    /// Whether the owner closed its inbox (dropped its communicator): its
    /// process ending afterwards is no failure.
    pub fn owner_closed(&self) -> bool {
        self.seg.closed_word().load(Ordering::Acquire) != 0
    }

    /// Maps the inbox `name` of a peer; `my_rank` is this rank (the ring
    /// row it writes). Checks the segment header: a foreign, truncated or
    /// mismatched file is an error.
    pub fn open(name: &str, my_rank: usize) -> Result<Outbox> {
        #[cfg(loom)]
        if true {
            return Err(Error::Unavailable("shm segments are not modelled under loom".into()));
        }
        let path = shm_path(name)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| Error::System(format!("opening shm segment {}: {e}", path.display())))?;
        let size = file.metadata().map_err(|e| Error::System(format!("stat of shm segment {name}: {e}")))?.len();
        let bad = |why: String| {
            Err(Error::InvalidUsage(format!(
                "shm segment {name} is not a valid oxccl inbox: {why} (wrong name, a leftover or another version)"
            )))
        };
        if size < SEG_HEADER as u64 || size > isize::MAX as u64 {
            return bad(format!("size {size} bytes"));
        }
        let map = map(&file, size as usize, name)?;
        // SAFETY: the mapping holds at least SEG_HEADER bytes; the header was
        // written before the name was published and is never changed.
        let hdr: SegHeader = unsafe { std::ptr::read(map.ptr as *const SegHeader) };
        if hdr.magic != SEG_MAGIC {
            return bad(format!("magic {:#x}", hdr.magic));
        }
        if hdr.version != SEG_VERSION {
            return bad(format!("version {} (this build speaks {SEG_VERSION})", hdr.version));
        }
        if check_capacity(hdr.capacity as usize).is_err() || hdr.nranks == 0 || hdr.nslots < 2 {
            return bad(format!("capacity {}, {} ranks, {} slots", hdr.capacity, hdr.nranks, hdr.nslots));
        }
        match layout(hdr.nranks as usize, hdr.nslots as usize, hdr.capacity as usize) {
            Some((stride, total))
                if stride as u64 == hdr.stride && total as u64 == hdr.total && total as u64 == size => {}
            _ => return bad(format!("size {size} does not match its header {hdr:?}")),
        }
        if my_rank >= hdr.nranks as usize {
            return bad(format!("rank {my_rank} out of range for {} ranks", hdr.nranks));
        }
        Ok(Outbox { seg: Segment { map, hdr, name: name.to_string() }, my_rank })
    }

    /// The rank that owns the segment.
    pub fn peer(&self) -> usize {
        self.seg.hdr.owner as usize
    }

    /// The pid of the process that created the segment.
    pub fn peer_pid(&self) -> i32 {
        self.seg.hdr.pid as i32
    }

    /// The peer's doorbell.
    pub fn doorbell(&self) -> Doorbell {
        self.seg.doorbell()
    }

    /// The token in the peer's registration slot `i` (0: none).
    pub fn reg(&self, i: usize) -> u64 {
        self.seg.reg_word(i).load(Ordering::Acquire)
    }

    /// Announces a write into the peer's registration slot `i`; false (and
    /// nothing announced) if its token is no longer `token`. The peer does
    /// not end the registration until [`end_write`](Outbox::end_write).
    pub fn begin_write(&self, i: usize, token: u64) -> bool {
        self.seg.busy_word(i).fetch_add(1, Ordering::SeqCst);
        if self.seg.reg_word(i).load(Ordering::SeqCst) == token {
            return true;
        }
        self.seg.busy_word(i).fetch_sub(1, Ordering::SeqCst);
        false
    }

    /// Ends a write [`begin_write`](Outbox::begin_write) announced.
    pub fn end_write(&self, i: usize) {
        self.seg.busy_word(i).fetch_sub(1, Ordering::SeqCst);
    }

    /// The sending end to the peer on `ch` (once per process group).
    pub fn sender(&self, ch: Channel) -> Result<Box<dyn Sender>> {
        Ok(Box::new(self.shm_sender(ch)?))
    }

    /// Like [`sender`](Self::sender), with [`ShmSender::send_ref`].
    pub fn shm_sender(&self, ch: Channel) -> Result<ShmSender> {
        let ring = self.seg.ring(self.my_rank, ch)?;
        Ok(ShmSender { p: ring.producer(self.doorbell(), Label { peer: self.peer(), ch })?, single_copy: usize::MAX })
    }
}

/// The sending end of an shm connection.
pub struct ShmSender {
    p: Producer,
    /// Messages at least this long go by reference through
    /// [`Sender::send_from`] (where the receiver allows it).
    single_copy: usize,
}

impl ShmSender {
    /// Sends messages of at least `min` bytes by reference when offered
    /// through [`Sender::send_from`] (the receiver reads them straight
    /// from this process's buffer; `usize::MAX`: never).
    pub fn with_single_copy(mut self, min: usize) -> ShmSender {
        self.single_copy = min;
        self
    }

    /// Sends `len` bytes at `src` by reference: the receiver reads them from
    /// this process with `process_vm_readv`. `Ok(None)` when the receiver
    /// has not allowed it (use begin/room/commit instead). No message may be
    /// in progress. The bytes must stay unchanged until
    /// [`ref_done`](Self::ref_done) returns true for the returned token (if
    /// they are freed, the receiver fails with an error, not this process).
    pub fn send_ref(&mut self, src: *const u8, len: usize, tag: u64) -> Result<Option<u64>> {
        self.p.send_ref(std::process::id(), src as usize as u64, len, tag)
    }

    /// Whether the receiver has read by-reference message `token`.
    pub fn ref_done(&self, token: u64) -> bool {
        self.p.ref_done(token)
    }
}

impl Sender for ShmSender {
    fn begin_tagged(&mut self, len: usize, tag: u64) -> Result<()> {
        self.p.begin_tagged(len, tag)
    }
    fn room(&mut self, want: usize) -> Result<&mut [u8]> {
        self.p.room(want)
    }
    fn commit(&mut self, n: usize) -> Result<()> {
        self.p.commit(n)
    }
    fn progress(&mut self) -> Result<bool> {
        self.p.progress()
    }
    fn flushed(&self) -> bool {
        self.p.flushed()
    }
    fn bytes(&self) -> u64 {
        self.p.bytes()
    }
    fn takes_from(&self, len: usize) -> bool {
        len >= self.single_copy && self.p.ref_allowed()
    }
    fn send_from(&mut self, src: Region, tag: u64) -> Result<Option<u64>> {
        if !self.takes_from(src.len()) {
            return Ok(None);
        }
        self.send_ref(src.addr() as *const u8, src.len(), tag)
    }
    fn released(&self, token: u64) -> bool {
        self.ref_done(token)
    }
    fn abandon(&mut self) {
        self.p.abandon_refs();
    }
}

/// The receiving end of an shm connection.
pub struct ShmReceiver {
    c: Consumer,
}

impl ShmReceiver {
    /// Allows by-reference messages if this process may read process `pid`
    /// (the sender, [`Outbox::peer_pid`]); returns whether it is allowed.
    pub fn allow_ref(&self, pid: i32) -> bool {
        let ok = vm_read_permitted(pid);
        self.c.allow_ref(ok);
        ok
    }
}

impl Receiver for ShmReceiver {
    fn peek(&mut self) -> Result<Option<Piece<'_>>> {
        self.c.peek()
    }
    fn consume(&mut self, n: usize) -> Result<()> {
        self.c.consume(n)
    }
    fn progress(&mut self) -> Result<bool> {
        self.c.progress()
    }
    fn bytes(&self) -> u64 {
        self.c.bytes()
    }
    fn next_tag(&mut self) -> Result<Option<u64>> {
        self.c.current_tag()
    }
    fn recv_into(&mut self, dst: &Region) -> Result<(bool, bool)> {
        match self.c.current()? {
            Some((len, true)) => {
                if len != dst.len() {
                    return Err(Error::InvalidUsage(crate::wrong_length(len, dst.len())));
                }
                // A piece at a time, so the rank keeps serving its peers.
                let done = dst.write(|d| self.c.read_ref_into(d, 8 << 20))??;
                Ok((true, done))
            }
            Some((_, false)) => crate::recv_by_peek(&mut self.c, dst),
            None => Ok((false, false)),
        }
    }
}

pub use crate::cma::{vm_read, vm_read_permitted, vm_read_raw, vm_write_raw};

/// Watches a local peer process: [`exited`](PidWatch::exited) turns true
/// once it has died (pidfd).
pub struct PidWatch {
    pid: i32,
    fd: OwnedFd,
}

impl PidWatch {
    /// Starts watching `pid` (an error if there is no such process or the
    /// kernel lacks `pidfd_open`, Linux < 5.3).
    pub fn new(pid: i32) -> Result<PidWatch> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(sys(format!("pidfd_open({pid})")));
        }
        // SAFETY: `fd` is a fresh descriptor that we own.
        Ok(PidWatch { pid, fd: unsafe { OwnedFd::from_raw_fd(fd as i32) } })
    }

    /// The watched pid.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Whether the process has exited (non-blocking).
    pub fn exited(&self) -> bool {
        let mut p = libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: polling one valid pollfd with a zero timeout.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n > 0 && p.revents & (libc::POLLIN | libc::POLLHUP) != 0
    }
}
