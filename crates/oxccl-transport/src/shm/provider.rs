//! The shared-memory provider over [`Inbox`]/[`Outbox`] segments, with
//! native one-sided access by cross-memory attach (`process_vm_readv`,
//! `process_vm_writev`: Open MPI's CMA) where the kernel allows it.
//!
//! Registrations live in the owner's process; a peer copies straight
//! between them and its own memory with one system call per piece, and
//! checks the registration's token in the owner's segment before and after
//! (the owner clears it when the call ends), so a peer that lags behind a
//! failed owner gets an error, not the bytes of a buffer it no longer
//! owns. Where the kernel refuses (Yama `ptrace_scope` ≥ 2, containers
//! without `CAP_SYS_PTRACE`, `OXCCL_SHM_CMA=0`), the peer is not
//! [`reached`](Direct::reaches) and the fabric emulates one-sided access
//! with messages through the segment's FIFOs.

use super::{Inbox, Outbox, PidWatch, REG_SLOTS, vm_read, vm_read_permitted, vm_read_raw, vm_write_raw};
use crate::bootstrap::PeerInfo;
use crate::futex::Doorbell;
use crate::provider::{Direct, Factory, LinkCost, LinkParams, MemDesc, Pending, Provider, Setup, Wake};
use crate::region::Region;
use crate::wire::{u32_at, u64_at};
use crate::{CHANNELS, Channel, Error, Kind, Receiver, Result, Sender};
use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Instant;

/// What this machine measured once per process: how fast bytes go
/// through the FIFO's two user-space copies and through one kernel copy
/// (cross-memory attach), and from which message size the single copy
/// is the better way between processes.
#[derive(Clone, Copy, Debug)]
pub struct Measured {
    /// Bytes per second through two `memcpy`s of 1 MiB, in cache.
    pub fifo_bw: f64,
    /// Bytes per second of `process_vm_readv` of 1 MiB (0 when refused).
    pub cma_bw: f64,
    /// The crossover: where one copy measured faster than two in cache,
    /// and at the latest the core's private (L2) cache size, beyond which
    /// the FIFO's second copy pays memory bandwidth the single copy does
    /// not (between two processes the FIFO's bytes also cross cores; on the
    /// development VM, 1 MiB: a 2-rank all_gather of 2 MiB takes 142 µs
    /// through the FIFO and 86 µs by reference, Open MPI 91 µs).
    pub single_copy_min: usize,
}

/// The private cache of a core (L2), from sysfs; 1 MiB where unknown.
fn l2_bytes() -> usize {
    let read = |f: &str| std::fs::read_to_string(format!("/sys/devices/system/cpu/cpu0/cache/index2/{f}"));
    let level_ok = read("level").is_ok_and(|l| l.trim() == "2");
    let size = read("size").ok().and_then(|s| {
        let s = s.trim();
        let (num, mult) = match s.strip_suffix('K') {
            Some(n) => (n, 1 << 10),
            None => match s.strip_suffix('M') {
                Some(n) => (n, 1 << 20),
                None => (s, 1),
            },
        };
        num.parse::<usize>().ok().map(|n| n * mult)
    });
    match (level_ok, size) {
        (true, Some(n)) if n >= 64 << 10 => n,
        _ => 1 << 20,
    }
}

/// Times `f` over `n` bytes a few times; the best bytes per second.
fn rate(n: usize, mut f: impl FnMut() -> bool) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        if !f() {
            return 0.0;
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    n as f64 / best.max(1e-9)
}

/// The machine's copy costs (measured on first use; about a millisecond).
pub fn measured() -> Measured {
    static M: OnceLock<Measured> = OnceLock::new();
    *M.get_or_init(|| {
        let me = std::process::id() as i32;
        let mut crossover = usize::MAX;
        let (mut fifo_bw, mut cma_bw) = (0.0, 0.0);
        for n in [256 << 10, 1 << 20, 4 << 20] {
            let (src, mut mid, mut dst) = (vec![1u8; n], vec![0u8; n], vec![0u8; n]);
            let two = rate(n, || {
                mid.copy_from_slice(&src);
                dst.copy_from_slice(&mid);
                true
            });
            let one = rate(n, || vm_read(me, src.as_ptr() as usize, &mut dst).is_ok_and(|k| k == n));
            if n == 1 << 20 {
                fifo_bw = two;
                cma_bw = one;
            }
            if one > two && crossover == usize::MAX {
                crossover = n;
            }
        }
        let single_copy_min = if cma_bw > 0.0 { crossover.min(l2_bytes()) } else { usize::MAX };
        Measured { fifo_bw, cma_bw, single_copy_min }
    })
}

/// Settings of the shared-memory provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShmOptions {
    /// Peers may read and write each other's memory with
    /// `process_vm_readv`/`process_vm_writev` (cross-memory attach) where
    /// the kernel allows it (`OXCCL_SHM_CMA`, default on).
    pub cma: bool,
    /// Messages of at least this many bytes go by reference (the receiver
    /// copies them once, straight from the sender's buffer); `None`: from
    /// where this machine's measured single copy beats the FIFO's two
    /// (perhaps never); `usize::MAX`: never (`OXCCL_SINGLE_COPY_MIN`).
    pub single_copy_min: Option<usize>,
}

impl Default for ShmOptions {
    fn default() -> ShmOptions {
        ShmOptions { cma: true, single_copy_min: None }
    }
}

/// Makes [`ShmProvider`]s: processes on one host.
pub struct ShmFactory {
    /// The provider's settings.
    pub opts: ShmOptions,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Factory for ShmFactory {
    fn kind(&self) -> Kind {
        Kind::Shm
    }
    fn reaches(&self, me: &PeerInfo, peer: &PeerInfo) -> bool {
        me.host == peer.host
    }
    fn open(&self, setup: &Setup<'_>) -> Result<Box<dyn Provider>> {
        let n = setup.nranks();
        let inbox = if setup.serves_any() {
            let name = format!("oxccl-{}-{}", hex(&setup.nonce[..8]), setup.rank);
            Some(Inbox::create(&name, setup.rank, n, CHANNELS, setup.buffsize)?)
        } else {
            None
        };
        let single_copy = match (self.opts.cma, self.opts.single_copy_min) {
            (false, _) => usize::MAX,
            (true, Some(min)) => min,
            (true, None) if setup.serves_any() => measured().single_copy_min,
            (true, None) => usize::MAX,
        };
        Ok(Box::new(ShmProvider {
            rank: setup.rank,
            single_copy,
            inbox,
            outboxes: HashMap::new(),
            watches: Vec::new(),
            allow_cma: self.opts.cma,
            cma: vec![false; n],
            pids: setup.peers.iter().map(|p| p.pid as i32).collect(),
            slots: [0; REG_SLOTS],
            next_token: 1,
        }))
    }
}

/// One rank's side of the shared-memory provider.
pub struct ShmProvider {
    rank: usize,
    /// Messages at least this long go by reference (`usize::MAX`: never).
    single_copy: usize,
    inbox: Option<Inbox>,
    outboxes: HashMap<usize, Outbox>,
    watches: Vec<(usize, PidWatch)>,
    /// Cross-memory attach allowed ([`ShmOptions::cma`]).
    allow_cma: bool,
    /// Per peer: cross-memory attach works.
    cma: Vec<bool>,
    pids: Vec<i32>,
    /// Tokens of this rank's registrations by slot (0: free).
    slots: [u64; REG_SLOTS],
    next_token: u64,
}

impl ShmProvider {
    fn outbox(&self, peer: usize) -> Result<&Outbox> {
        self.outboxes.get(&peer).ok_or_else(|| {
            Error::Internal(format!("rank {}: shared memory does not carry traffic with rank {peer}", self.rank))
        })
    }

    /// Where a descriptor points: (pid, slot, token), checked against what
    /// this rank knows of the owner.
    fn target(&self, peer: usize, desc: &MemDesc) -> Result<(i32, usize, u64)> {
        let (pid, slot, token) = key_fields(desc);
        if desc.kind != Some(Kind::Shm) || pid != self.pids[peer] || slot >= REG_SLOTS || token == 0 {
            return Err(Error::Remote(format!(
                "rank {peer} sent a shared-memory descriptor for pid {pid}, slot {slot}: it is not rank {peer}'s \
                 (pid {})",
                self.pids[peer]
            )));
        }
        Ok((pid, slot, token))
    }

    fn check_token(&self, peer: usize, slot: usize, token: u64) -> Result<()> {
        if self.outbox(peer)?.reg(slot) != token {
            return Err(Error::Remote(format!(
                "rank {peer}'s buffer is no longer registered: it left the call (or failed) while this rank \
                 still used it"
            )));
        }
        Ok(())
    }

    /// Copies with `op` (a `process_vm_*` call on (offset, local piece))
    /// until all `len` bytes are done.
    fn cross(
        &self,
        peer: usize,
        desc: &MemDesc,
        len: usize,
        what: &str,
        mut op: impl FnMut(usize) -> std::result::Result<usize, i32>,
    ) -> Result<()> {
        let (pid, slot, token) = self.target(peer, desc)?;
        self.check_token(peer, slot, token)?;
        let mut done = 0;
        while done < len {
            match op(done) {
                Ok(0) => {
                    return Err(Error::Remote(format!(
                        "{what} rank {peer} (pid {pid}): the kernel moved nothing at byte {done} of {len}"
                    )));
                }
                Ok(n) => done += n,
                Err(libc::EINTR) => {}
                Err(errno) => {
                    let why = match errno {
                        libc::ESRCH => "the process is gone".to_string(),
                        libc::EFAULT => "its buffer is not mapped any more".to_string(),
                        e => std::io::Error::from_raw_os_error(e).to_string(),
                    };
                    return Err(Error::Remote(format!("{what} rank {peer} (pid {pid}) failed: {why}")));
                }
            }
        }
        self.check_token(peer, slot, token)
    }
}

/// Why the kernel may refuse cross-memory attach, for the log.
fn ptrace_hint() -> String {
    match std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope") {
        Ok(s) => format!("kernel.yama.ptrace_scope = {}", s.trim()),
        Err(_) => "no Yama ptrace_scope; a container may lack CAP_SYS_PTRACE".to_string(),
    }
}

impl Provider for ShmProvider {
    fn kind(&self) -> Kind {
        Kind::Shm
    }
    fn link(&self) -> LinkParams {
        // FIFO messages cost two copies, cross-memory attach one kernel
        // copy with its page pinning: this machine's rates, measured in
        // cache, scaled by what traffic between two processes keeps of them
        // (a fifth on the development VM, compare-peers). One-sided steps
        // also pay the control plane's signals and exposures (latencies
        // from compare-peers there).
        const CROSS_PROCESS: f64 = 0.2;
        let native = self.outboxes.keys().all(|&p| self.cma[p]);
        // A provider that serves nobody (no inbox) reports the table.
        let m = if self.inbox.is_some() {
            measured()
        } else {
            Measured { fifo_bw: 25e9, cma_bw: 12e9, single_copy_min: 0 }
        };
        let fifo = LinkCost { bw: m.fifo_bw * CROSS_PROCESS, lat: 2e-6 };
        let one_sided = match native {
            true => LinkCost { bw: m.cma_bw * CROSS_PROCESS, lat: 4e-6 },
            false => LinkCost { bw: fifo.bw / 2.0, lat: 8e-6 },
        };
        LinkParams { fifo, one_sided, native }
    }
    fn shared_bell(&self) -> Option<Doorbell> {
        self.inbox.as_ref().map(Inbox::doorbell)
    }
    fn publish(&self) -> Vec<u8> {
        self.inbox.as_ref().map(|i| i.name().as_bytes().to_vec()).unwrap_or_default()
    }
    fn connect(&mut self, setup: &Setup<'_>, published: &[Vec<u8>], _bell: &Doorbell) -> Result<()> {
        let mut refused = Vec::new();
        for (p, serves) in setup.serves.iter().enumerate() {
            if !serves || p == self.rank {
                continue;
            }
            let name = String::from_utf8(published[p].clone())
                .map_err(|_| Error::Remote(format!("rank {p} published a malformed segment name")))?;
            if name.is_empty() {
                return Err(Error::Remote(format!("rank {p} did not create a shared segment for rank {}", self.rank)));
            }
            let outbox = Outbox::open(&name, self.rank)?;
            let pid = outbox.peer_pid();
            let watch = PidWatch::new(pid).map_err(|e| {
                Error::Remote(format!(
                    "rank {}: cannot watch rank {p} (pid {pid}) for its death: {e} (it exited during set-up, or \
                     the kernel lacks pidfd_open)",
                    self.rank
                ))
            })?;
            self.watches.push((p, watch));
            self.outboxes.insert(p, outbox);
            self.cma[p] = self.allow_cma && vm_read_permitted(self.pids[p]);
            if self.allow_cma && !self.cma[p] {
                refused.push(p);
            }
        }
        if !refused.is_empty() {
            tracing::info!(
                "rank {}: the kernel refuses process_vm_readv on ranks {refused:?} ({}); one-sided steps with \
                 them go through messages (two copies)",
                self.rank,
                ptrace_hint()
            );
        }
        Ok(())
    }
    fn ready(&mut self) -> Result<()> {
        match &mut self.inbox {
            Some(i) => i.unlink(),
            None => Ok(()),
        }
    }
    fn sender(&mut self, peer: usize, ch: Channel) -> Result<Box<dyn Sender>> {
        Ok(Box::new(self.outbox(peer)?.shm_sender(ch)?.with_single_copy(self.single_copy)))
    }
    fn receiver(&mut self, peer: usize, ch: Channel) -> Result<Box<dyn Receiver>> {
        let bell = self.outbox(peer)?.doorbell();
        let inbox = self.inbox.as_ref().ok_or_else(|| Error::Internal("shm receiver without an inbox".into()))?;
        let r = inbox.shm_receiver(peer, ch, bell)?;
        if self.cma[peer] && ch != crate::CONTROL_CHANNEL {
            // Probed when the peer was connected.
            r.c.allow_ref(true);
        }
        Ok(Box::new(r))
    }
    fn wake(&self) -> Wake {
        Wake { rings_bell: true, fds: Vec::new() }
    }
    fn closing(&mut self) {
        if let Some(i) = &self.inbox {
            i.mark_closed();
        }
    }
    fn check(&mut self, _peer_failed: bool) -> Result<()> {
        // A peer that closed its communicator before its process ended
        // finished (it may end before this rank reads what it sent).
        let outboxes = &self.outboxes;
        self.watches.retain(|(p, w)| !(w.exited() && outboxes.get(p).is_some_and(|o| o.owner_closed())));
        for (p, w) in &self.watches {
            if w.exited() {
                return Err(Error::Remote(format!("rank {p} (on this host) exited")));
            }
        }
        Ok(())
    }
    fn direct(&mut self) -> Option<&mut dyn Direct> {
        Some(self)
    }
}

impl Direct for ShmProvider {
    fn reaches(&self, peer: usize) -> bool {
        self.cma.get(peer).copied().unwrap_or(false)
    }
    fn register(&mut self, region: &Region, desc: &mut MemDesc) -> Result<()> {
        let inbox = self.inbox.as_ref().ok_or_else(|| Error::Internal("shm registration without an inbox".into()))?;
        let slot = self.slots.iter().position(|&t| t == 0).ok_or_else(|| {
            Error::Internal(format!("rank {}: all {REG_SLOTS} shared-memory registrations are in use", self.rank))
        })?;
        let token = self.next_token;
        self.next_token += 1;
        self.slots[slot] = token;
        inbox.set_reg(slot, token);
        desc.kind = Some(Kind::Shm);
        desc.addr = region.addr() as u64;
        desc.key[0..4].copy_from_slice(&(std::process::id() as i32).to_le_bytes());
        desc.key[4..8].copy_from_slice(&(slot as u32).to_le_bytes());
        desc.key[8..16].copy_from_slice(&token.to_le_bytes());
        Ok(())
    }
    fn unregister(&mut self, desc: &MemDesc) {
        let (_, slot, token) = key_fields(desc);
        if slot < REG_SLOTS && self.slots[slot] == token {
            self.slots[slot] = 0;
            // A peer's write in progress ends before the caller may reuse
            // its buffer (bounded: a peer that died mid-write never ends).
            if let Some(i) = &self.inbox
                && !i.revoke(slot, std::time::Duration::from_secs(2))
            {
                tracing::warn!("rank {}: a peer was still writing into a buffer this rank gave up", self.rank);
            }
        }
    }
    fn read(&mut self, peer: usize, desc: &MemDesc, off: usize, dst: &Region) -> Result<Pending> {
        let (pid, base) = (self.pids[peer], desc.addr as usize + off);
        dst.write(|d| {
            self.cross(peer, desc, d.len(), "reading from", |at| vm_read_raw(pid, base + at, &mut d[at..]))
        })??;
        Ok(Pending::Done)
    }
    fn write(&mut self, peer: usize, src: &Region, desc: &MemDesc, off: usize) -> Result<Pending> {
        let (pid, base) = (self.pids[peer], desc.addr as usize + off);
        let (_, slot, token) = self.target(peer, desc)?;
        // Announced, so the owner does not end the registration mid-write.
        if !self.outbox(peer)?.begin_write(slot, token) {
            return Err(Error::Remote(format!(
                "rank {peer}'s buffer is no longer registered: it left the call (or failed) while this rank \
                 still used it"
            )));
        }
        let r =
            src.read(|s| self.cross(peer, desc, s.len(), "writing into", |at| vm_write_raw(pid, base + at, &s[at..])));
        self.outbox(peer)?.end_write(slot);
        r?;
        Ok(Pending::Done)
    }
}

/// A shared-memory descriptor's key as registered: (pid, registration
/// slot, revocation token), unchecked.
fn key_fields(desc: &MemDesc) -> (i32, usize, u64) {
    (u32_at(&desc.key, 0) as i32, u32_at(&desc.key, 4) as usize, u64_at(&desc.key, 8))
}
