//! A software RC HCA: the verbs seam implemented in software, so the RDMA
//! protocol engine runs, and is tested, on machines without a NIC.
//!
//! A [`SoftDevice`] has one port (Ethernet link layer, like RoCE) whose GID
//! table holds a link-local entry and a RoCE v2 IPv4-mapped entry for the
//! address it listens on; its "LID" is its TCP port. Two queue pairs are
//! joined by one TCP stream (the one with the smaller address connects, the
//! other's device accepts and hands the stream to the QP by number), or,
//! when both devices live in one process, by in-memory channels.
//!
//! Each QP has an engine thread that plays the HCA: it takes posted work
//! requests in order, reads their source late (when it transmits them),
//! and keeps the RC rules the protocol depends on:
//! - placement in order per QP, none across QPs;
//! - a completion only after the data is placed at the peer (the peer's
//!   acknowledgement);
//! - a WRITE_WITH_IMM that finds no posted receive is refused (RNR) and
//!   retried after the RNR timer, `rnr_retry` times (7: forever), then
//!   `RNR_RETRY_EXC_ERR`;
//! - rkey, bounds and rights are checked; a violation is `REM_ACCESS_ERR`
//!   at the requester and moves both QPs to the error state (the
//!   responder's device raises a QP access event);
//! - after a QP's first error, every outstanding and later work request
//!   completes with `WR_FLUSH_ERR`, receives too;
//! - a send queue that is full refuses `post_send`; a completion queue that
//!   overflows fails its QPs and raises `CQ_ERR`;
//! - `post_send` before RTS is refused;
//! - a link that carries no acknowledgement for `retry_cnt + 1` ACK
//!   timeouts (4.096 µs × 2^timeout each) fails with `RETRY_EXC_ERR`.
//!
//! [`SoftOptions`] make bugs visible: `shuffle` first writes a poison
//! pattern over a WRITE's destination and then places its pieces in random
//! order (code that reads before the completion sees poison), and
//! `late_read` holds a work request for a while before reading its source
//! (code that reuses a source before the completion sends the wrong bytes).
//!
//! Not modelled: packet loss (TCP does not lose), MTU segmentation, atomics,
//! SEND/RECV with buffers, shared receive queues. A soft QP accepts a
//! stream only from the address and QP number its `connect` named, which
//! the authenticated bootstrap exchanged; it is a test vehicle, not a
//! security boundary.
#![allow(unsafe_code)]

pub(crate) mod packet;
mod qp;
#[cfg(test)]
mod tests;

use super::verbs::{
    Access, AsyncEvent, Completion, Cq, Device, GidEntry, GidType, LinkLayer, Mr, PortInfo, PortState, Qp, QpCaps,
};
use crate::{Error, Result};
use parking_lot::Mutex;
use qp::SoftQp;
use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

/// Bug-finding options of the soft HCA.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SoftOptions {
    /// Poison a WRITE's destination, then place its pieces in random order
    /// (`OXCCL_IB_SOFT_SHUFFLE=1`).
    pub shuffle: bool,
    /// Read a work request's source this long after it was posted
    /// (`OXCCL_IB_SOFT_LATE_READ=<ms>`).
    pub late_read: Option<Duration>,
    /// Join QPs of devices in this process in memory rather than over TCP
    /// (default; tests turn it off to exercise the TCP path in one process).
    pub tcp_only: bool,
}

impl SoftOptions {
    /// From `OXCCL_IB_SOFT_SHUFFLE` and `OXCCL_IB_SOFT_LATE_READ` through
    /// `get` (the environment, or a test's table).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<SoftOptions> {
        let shuffle = match get("OXCCL_IB_SOFT_SHUFFLE").as_deref().map(str::trim) {
            None | Some("") | Some("0") => false,
            Some("1") => true,
            Some(v) => return Err(Error::invalid(format!("OXCCL_IB_SOFT_SHUFFLE={v:?}: expected 0 or 1"))),
        };
        let late_read = match get("OXCCL_IB_SOFT_LATE_READ").as_deref().map(str::trim) {
            None | Some("") | Some("0") => None,
            Some(v) => Some(Duration::from_millis(v.parse::<u64>().map_err(|_| {
                Error::invalid(format!("OXCCL_IB_SOFT_LATE_READ={v:?}: expected milliseconds (0..=10000)"))
            })?)),
        };
        if late_read.is_some_and(|d| d > Duration::from_secs(10)) {
            return Err(Error::invalid("OXCCL_IB_SOFT_LATE_READ: at most 10000 ms"));
        }
        Ok(SoftOptions { shuffle, late_read, tcp_only: false })
    }
}

/// A registered region in the soft HCA's table.
#[derive(Clone, Copy, Debug)]
struct MrEntry {
    addr: u64,
    len: u64,
    access: Access,
}

/// What a soft device shares with its QPs' engines and its accept thread.
pub(crate) struct DevInner {
    name: String,
    ip: Ipv4Addr,
    port: u16,
    id: u64,
    opts: SoftOptions,
    /// rkey (= lkey) → registration.
    mrs: Mutex<HashMap<u32, MrEntry>>,
    next_key: AtomicU32,
    next_qpn: AtomicU32,
    /// QP number → the QP's engine, for streams accepted and local peers.
    qps: Mutex<HashMap<u32, Weak<qp::Shared>>>,
    events: Mutex<VecDeque<AsyncEvent>>,
    closed: AtomicBool,
}

/// Devices of this process by (address, port), for QPs joined in memory.
type Registry = Mutex<HashMap<(Ipv4Addr, u16), Weak<DevInner>>>;

fn local_devices() -> &'static Registry {
    static LOCAL: OnceLock<Registry> = OnceLock::new();
    LOCAL.get_or_init(Default::default)
}

impl DevInner {
    /// Runs `f` if `key` allows an access of `len` bytes at `addr` needing
    /// `need`, holding the registration table meanwhile (so a registration
    /// cannot end, and its memory be freed, during the access); whether it
    /// ran.
    fn access(&self, key: u32, addr: u64, len: u64, need: Access, f: impl FnOnce()) -> bool {
        let mrs = self.mrs.lock();
        let Some(m) = mrs.get(&key).copied() else { return false };
        let Some(end) = addr.checked_add(len) else { return false };
        if !(addr >= m.addr && end <= m.addr + m.len && m.access.covers(need)) {
            return false;
        }
        f();
        true
    }

    fn event(&self, e: AsyncEvent) {
        tracing::debug!(device = %self.name, "soft HCA async event: {e}");
        self.events.lock().push_back(e);
    }

    /// Copies `len` bytes from local `src` into `dst` (both checked against
    /// registrations by the caller).
    ///
    /// # Safety
    /// Both ranges lie in live registrations (the `reg_mr` contract).
    unsafe fn copy(src: u64, dst: u64, len: usize) {
        // SAFETY: the caller checked both ranges against registrations,
        // whose owners keep them allocated until dereg (reg_mr's contract);
        // they may overlap only if a user asked for that, so use copy.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
    }
}

/// A software HCA (see the module docs).
pub struct SoftDevice {
    inner: Arc<DevInner>,
}

impl SoftDevice {
    /// Opens a soft device listening on `ip` (an ephemeral port).
    pub fn open(ip: Ipv4Addr, opts: SoftOptions) -> Result<Arc<SoftDevice>> {
        let l = TcpListener::bind(SocketAddr::from((ip, 0)))
            .map_err(|e| Error::System(format!("soft HCA: cannot listen on {ip}: {e}")))?;
        l.set_nonblocking(true).map_err(|e| Error::System(format!("soft HCA: listener: {e}")))?;
        let port = l.local_addr().map_err(|e| Error::System(format!("soft HCA: listener: {e}")))?.port();
        let mut idb = [0u8; 8];
        getrandom::fill(&mut idb).map_err(|e| Error::System(format!("soft HCA: random id: {e}")))?;
        let inner = Arc::new(DevInner {
            name: format!("soft:{ip}:{port}"),
            ip,
            port,
            id: u64::from_le_bytes(idb),
            opts,
            mrs: Mutex::new(HashMap::new()),
            next_key: AtomicU32::new(u32::from_le_bytes([idb[0], idb[1], 0, 0]) | 1),
            next_qpn: AtomicU32::new(0x100 + (idb[2] as u32)),
            qps: Mutex::new(HashMap::new()),
            events: Mutex::new(VecDeque::new()),
            closed: AtomicBool::new(false),
        });
        if !opts.tcp_only {
            local_devices().lock().insert((ip, port), Arc::downgrade(&inner));
        }
        let weak = Arc::downgrade(&inner);
        std::thread::Builder::new()
            .name("oxccl-softhca-accept".into())
            .spawn(move || qp::accept_loop(l, weak))
            .map_err(|e| Error::System(format!("soft HCA: thread: {e}")))?;
        Ok(Arc::new(SoftDevice { inner }))
    }

    /// Makes the port fail as a link going down does: every QP's link
    /// breaks (their work then fails with retries exhausted) and the
    /// device raises `PORT_ERR`.
    pub fn port_down(&self) {
        let qps: Vec<_> = self.inner.qps.lock().values().filter_map(Weak::upgrade).collect();
        for q in qps {
            q.link_down();
        }
        self.inner.event(AsyncEvent::PortErr(1));
    }
}

impl Drop for SoftDevice {
    fn drop(&mut self) {
        self.inner.closed.store(true, Ordering::Release);
        local_devices().lock().remove(&(self.inner.ip, self.inner.port));
    }
}

impl Device for SoftDevice {
    fn name(&self) -> &str {
        &self.inner.name
    }

    fn ports(&self) -> Result<Vec<PortInfo>> {
        let mut ll = [0u8; 16];
        ll[0] = 0xfe;
        ll[1] = 0x80;
        ll[8..16].copy_from_slice(&self.inner.id.to_be_bytes());
        let mut v2 = [0u8; 16];
        v2[10] = 0xff;
        v2[11] = 0xff;
        v2[12..16].copy_from_slice(&self.inner.ip.octets());
        Ok(vec![PortInfo {
            num: 1,
            state: PortState::Active,
            link_layer: LinkLayer::Ethernet,
            lid: self.inner.port,
            active_mtu: 5,
            bw: 1.5e9,
            gids: vec![
                GidEntry { index: 0, gid: ll, kind: GidType::IbRoceV1 },
                GidEntry { index: 1, gid: v2, kind: GidType::RoceV2 },
            ],
        }])
    }

    unsafe fn reg_mr(&self, addr: u64, len: usize, access: Access) -> Result<Mr> {
        if access.remote_write && !access.local_write {
            return Err(super::verbs::verbs_error("ibv_reg_mr", &self.inner.name, libc::EINVAL));
        }
        if addr.checked_add(len as u64).is_none() {
            return Err(super::verbs::verbs_error("ibv_reg_mr", &self.inner.name, libc::EINVAL));
        }
        let key = self.inner.next_key.fetch_add(0x1_0001, Ordering::Relaxed);
        self.inner.mrs.lock().insert(key, MrEntry { addr, len: len as u64, access });
        Ok(Mr { addr, len: len as u64, lkey: key, rkey: key, handle: key as u64, access })
    }

    fn dereg_mr(&self, mr: &Mr) -> Result<()> {
        match self.inner.mrs.lock().remove(&mr.rkey) {
            Some(_) => Ok(()),
            None => Err(super::verbs::verbs_error("ibv_dereg_mr", &self.inner.name, libc::EINVAL)),
        }
    }

    fn create_cq(&self, depth: u32) -> Result<Arc<dyn Cq>> {
        Ok(Arc::new(SoftCq::new(depth, Arc::downgrade(&self.inner))?))
    }

    fn create_qp(&self, cq: &Arc<dyn Cq>, caps: QpCaps, port: u8) -> Result<Box<dyn Qp>> {
        if port != 1 {
            return Err(Error::invalid(format!("{}: no port {port} (the soft HCA has port 1)", self.inner.name)));
        }
        let Some(soft) = cq.as_any().downcast_ref::<SoftCq>() else {
            return Err(Error::invalid(format!("{}: the completion queue is not a soft HCA's", self.inner.name)));
        };
        let soft = soft.inner.clone();
        let qpn = self.inner.next_qpn.fetch_add(1, Ordering::Relaxed) & 0xff_ffff;
        Ok(Box::new(SoftQp::new(self.inner.clone(), soft, caps, qpn)?))
    }

    fn async_event(&self) -> Option<AsyncEvent> {
        self.inner.events.lock().pop_front()
    }
}

/// A completion with what polling it retires in its send queue.
pub(crate) struct Entry {
    pub(crate) wc: Completion,
    pub(crate) retire: Option<(Arc<AtomicU64>, u64)>,
}

pub(crate) struct CqState {
    entries: VecDeque<Entry>,
    overflowed: bool,
    armed: bool,
}

/// The queue behind a [`SoftCq`], shared with QP engines.
pub(crate) struct CqInner {
    depth: usize,
    st: Mutex<CqState>,
    efd: OwnedFd,
    dev: Weak<DevInner>,
}

impl CqInner {
    /// Adds a completion; false if the queue overflowed (it is then failed).
    pub(crate) fn push(&self, e: Entry) -> bool {
        let mut st = self.st.lock();
        if st.overflowed {
            return false;
        }
        if st.entries.len() >= self.depth {
            st.overflowed = true;
            drop(st);
            if let Some(d) = self.dev.upgrade() {
                d.event(AsyncEvent::CqErr);
            }
            self.ring();
            return false;
        }
        st.entries.push_back(e);
        if std::mem::take(&mut st.armed) {
            drop(st);
            self.ring();
        }
        true
    }

    fn ring(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live array to our own eventfd.
        unsafe { libc::write(self.efd.as_raw_fd(), one.as_ptr().cast(), 8) };
    }
}

/// A soft completion queue: a bounded queue and an eventfd as its channel.
pub struct SoftCq {
    inner: Arc<CqInner>,
}

impl SoftCq {
    fn new(depth: u32, dev: Weak<DevInner>) -> Result<SoftCq> {
        // SAFETY: eventfd has no memory arguments.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::System(format!("soft HCA: eventfd: {}", std::io::Error::last_os_error())));
        }
        // SAFETY: fd is a fresh descriptor we own.
        let efd = unsafe { OwnedFd::from_raw_fd(fd) };
        let inner = Arc::new(CqInner {
            depth: depth.max(1) as usize,
            st: Mutex::new(CqState { entries: VecDeque::new(), overflowed: false, armed: false }),
            efd,
            dev,
        });
        Ok(SoftCq { inner })
    }
}

impl Cq for SoftCq {
    fn poll(&self, out: &mut Vec<Completion>, max: usize) -> Result<usize> {
        let mut st = self.inner.st.lock();
        if st.overflowed {
            return Err(Error::System(format!(
                "completion queue of {} entries overflowed (CQ_ERR): its queue pairs failed",
                self.inner.depth
            )));
        }
        let n = max.min(st.entries.len());
        for e in st.entries.drain(..n) {
            if let Some((ctr, v)) = e.retire {
                ctr.fetch_max(v, Ordering::AcqRel);
            }
            out.push(e.wc);
        }
        Ok(n)
    }

    fn fd(&self) -> Option<RawFd> {
        Some(self.inner.efd.as_raw_fd())
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn arm(&self) -> Result<()> {
        let mut b = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live array from our own
        // non-blocking eventfd (EAGAIN when nothing is pending).
        unsafe { libc::read(self.inner.efd.as_raw_fd(), b.as_mut_ptr().cast(), 8) };
        self.inner.st.lock().armed = true;
        Ok(())
    }
}
