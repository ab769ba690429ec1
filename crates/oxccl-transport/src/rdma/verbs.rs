//! The verbs-shaped seam between the RDMA protocol engine and an HCA.
//!
//! Two backends implement it: [`super::ibv`] (libibverbs, opened at run
//! time) and [`super::soft`] (a software RC HCA over TCP, for tests and
//! machines without a NIC). The protocol engine (connections and
//! one-sided access) sees only these traits, so everything it does runs
//! here against the software HCA.
//!
//! The shapes follow verbs closely (a reader who knows `ibv_post_send`
//! knows [`Qp::post_send`]), minus what oxccl never uses: one protection
//! domain per [`Device`], reliable-connected QPs only, one scatter/gather
//! entry per work request.
//!
//! ## Memory
//! Addresses are `u64`s in this process's address space, as in verbs.
//! [`Device::reg_mr`] is `unsafe`: the caller promises the memory stays
//! allocated until [`Device::dereg_mr`], and that it reads memory a peer may
//! write only after the completion that says the write has landed (never
//! through a `&[u8]` while the NIC can change it).
#![allow(unsafe_code)]

use crate::{Error, Result};
use std::fmt;
use std::os::fd::RawFd;
use std::sync::Arc;

/// Access rights of a memory registration (verbs' `IBV_ACCESS_*` bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Access {
    /// The local HCA may write it (receives, READ responses).
    pub local_write: bool,
    /// Peers may RDMA WRITE into it.
    pub remote_write: bool,
    /// Peers may RDMA READ from it.
    pub remote_read: bool,
}

impl Access {
    /// Local writes only (a source or a READ destination).
    pub const LOCAL: Access = Access { local_write: true, remote_write: false, remote_read: false };
    /// What a ring or a user buffer peers write into needs.
    pub const REMOTE_WRITE: Access = Access { local_write: true, remote_write: true, remote_read: false };
    /// Everything (user buffers exposed for gets and puts).
    pub const ALL: Access = Access { local_write: true, remote_write: true, remote_read: true };

    /// Whether `self` grants at least what `need` asks.
    pub fn covers(self, need: Access) -> bool {
        (self.local_write || !need.local_write)
            && (self.remote_write || !need.remote_write)
            && (self.remote_read || !need.remote_read)
    }
}

/// A memory registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mr {
    /// First byte registered.
    pub addr: u64,
    /// Bytes registered.
    pub len: u64,
    /// Key for local work requests.
    pub lkey: u32,
    /// Key peers present.
    pub rkey: u32,
    /// The backend's handle (`ibv_mr *`, or the soft HCA's index).
    pub handle: u64,
    /// The rights granted.
    pub access: Access,
}

/// The link layer of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    /// InfiniBand: peers addressed by LID (and GID across subnets).
    InfiniBand,
    /// Ethernet (RoCE): peers addressed by GID.
    Ethernet,
}

impl fmt::Display for LinkLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LinkLayer::InfiniBand => "InfiniBand",
            LinkLayer::Ethernet => "Ethernet (RoCE)",
        })
    }
}

/// A port's state (verbs' `ibv_port_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortState {
    /// `IBV_PORT_DOWN` (1).
    Down,
    /// `IBV_PORT_INIT` (2).
    Init,
    /// `IBV_PORT_ARMED` (3).
    Armed,
    /// `IBV_PORT_ACTIVE` (4): the only state traffic flows in.
    Active,
    /// Anything else (`IBV_PORT_NOP`, `IBV_PORT_ACTIVE_DEFER`, unknown).
    Other(u32),
}

impl PortState {
    /// From verbs' number.
    pub fn from_raw(v: u32) -> PortState {
        match v {
            1 => PortState::Down,
            2 => PortState::Init,
            3 => PortState::Armed,
            4 => PortState::Active,
            o => PortState::Other(o),
        }
    }
}

/// A GID: 16 bytes (for RoCE v2, an IPv6 or IPv4-mapped address).
pub type Gid = [u8; 16];

/// The kind of a GID table entry (RoCE v1, v2), as sysfs reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GidType {
    /// InfiniBand or RoCE v1.
    IbRoceV1,
    /// RoCE v2 (routable, UDP/IP).
    RoceV2,
    /// Unknown (no sysfs entry).
    Unknown,
}

/// One GID table entry of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidEntry {
    /// Index in the port's table.
    pub index: u8,
    /// The GID.
    pub gid: Gid,
    /// Its kind.
    pub kind: GidType,
}

/// What oxccl needs to know of a port.
#[derive(Clone, Debug, PartialEq)]
pub struct PortInfo {
    /// Port number (from 1).
    pub num: u8,
    /// Its state.
    pub state: PortState,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// Local identifier (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Active MTU as verbs' enum (1 = 256 … 5 = 4096 bytes).
    pub active_mtu: u8,
    /// Link speed in bytes per second (width × lane speed), for the tuner.
    pub bw: f64,
    /// The GID table's valid entries.
    pub gids: Vec<GidEntry>,
}

/// The state of a queue pair (verbs' `ibv_qp_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpState {
    /// Just created.
    Reset,
    /// Receives may be posted.
    Init,
    /// Ready to receive: the remote end is known.
    Rtr,
    /// Ready to send.
    Rts,
    /// Failed: every outstanding and later work request completes with
    /// [`Status::WrFlush`].
    Error,
}

/// Sizes of a new queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// Send queue depth (work requests posted and not yet retired).
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Bytes a send may carry inline (0: none).
    pub max_inline: u32,
}

/// The remote end and the protocol settings of an RC connection: what
/// INIT→RTR→RTS needs (NCCL's attributes and defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Connect {
    /// The remote QP number.
    pub remote_qpn: u32,
    /// The remote side's first PSN (what this side expects).
    pub remote_psn: u32,
    /// This side's first PSN.
    pub local_psn: u32,
    /// The remote LID (InfiniBand).
    pub remote_lid: u16,
    /// The remote GID (RoCE; InfiniBand across subnets).
    pub remote_gid: Gid,
    /// Whether to address by GID (a global route header).
    pub use_gid: bool,
    /// The local GID index.
    pub gid_index: u8,
    /// Path MTU (verbs' enum), the smaller of both ports'.
    pub mtu: u8,
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout (NCCL: 20, ~4.3 s).
    pub timeout: u8,
    /// Transport retries before `RETRY_EXC_ERR` (NCCL: 7).
    pub retry_cnt: u8,
    /// RNR retries before `RNR_RETRY_EXC_ERR`; 7 means forever (NCCL: 7).
    pub rnr_retry: u8,
    /// Minimal RNR NAK timer (verbs' 5-bit code; NCCL: 12, 0.64 ms).
    pub min_rnr_timer: u8,
    /// Service level (`OXCCL_IB_SL`).
    pub sl: u8,
    /// Traffic class (`OXCCL_IB_TC`).
    pub traffic_class: u8,
    /// Outstanding RDMA READs this side may issue and serve.
    pub max_rd_atomic: u8,
}

impl Connect {
    /// The ACK timeout in seconds ([`ack_timeout_secs`] of `timeout`).
    pub fn ack_timeout_secs(&self) -> f64 {
        ack_timeout_secs(self.timeout)
    }
}

/// The local ACK timeout an exponent stands for: 4.096 µs × 2^`exp`.
pub fn ack_timeout_secs(exp: u8) -> f64 {
    4.096e-6 * (1u64 << exp.min(31)) as f64
}

/// The operation of a send work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opcode {
    /// RDMA WRITE into the peer's memory.
    Write,
    /// RDMA WRITE, then consume a receive at the peer carrying `imm`.
    WriteImm(u32),
    /// RDMA READ from the peer's memory.
    Read,
}

/// A send work request: one scatter/gather entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub op: Opcode,
    /// Local address (source of a write, destination of a read).
    pub local: u64,
    /// Bytes.
    pub len: u32,
    /// Key of the local registration.
    pub lkey: u32,
    /// Remote address.
    pub remote: u64,
    /// Key of the remote registration.
    pub rkey: u32,
    /// Whether it produces a completion on success (errors always do).
    pub signaled: bool,
}

/// A receive work request (for WRITE_WITH_IMM: no buffer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvWr {
    /// Returned in the completion.
    pub wr_id: u64,
}

/// A completion's status (verbs' `ibv_wc_status`, the values oxccl names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// `IBV_WC_SUCCESS`.
    Success,
    /// `IBV_WC_LOC_LEN_ERR` (1).
    LocLen,
    /// `IBV_WC_LOC_QP_OP_ERR` (2).
    LocQpOp,
    /// `IBV_WC_LOC_PROT_ERR` (4): a bad lkey or local bounds.
    LocProt,
    /// `IBV_WC_WR_FLUSH_ERR` (5).
    WrFlush,
    /// `IBV_WC_REM_INV_REQ_ERR` (9).
    RemInvReq,
    /// `IBV_WC_REM_ACCESS_ERR` (10).
    RemAccess,
    /// `IBV_WC_REM_OP_ERR` (11).
    RemOp,
    /// `IBV_WC_RETRY_EXC_ERR` (12).
    RetryExc,
    /// `IBV_WC_RNR_RETRY_EXC_ERR` (13).
    RnrRetryExc,
    /// Any other (verbs' number).
    Other(u32),
}

/// (status, verbs' number, name, meaning and likely cause).
const STATUSES: &[(Status, u32, &str, &str)] = &[
    (Status::Success, 0, "SUCCESS", "success"),
    (Status::LocLen, 1, "LOC_LEN_ERR", "local length error: a message longer than the receive buffer"),
    (Status::LocQpOp, 2, "LOC_QP_OP_ERR", "local QP operation error: a work request the QP cannot run"),
    (
        Status::LocProt,
        4,
        "LOC_PROT_ERR",
        "local protection error: a bad lkey or an address outside the local registration (an internal bug)",
    ),
    (Status::WrFlush, 5, "WR_FLUSH_ERR", "flushed: the queue pair had already failed (see the first error)"),
    (
        Status::RemInvReq,
        9,
        "REM_INV_REQ_ERR",
        "remote invalid request: the peer's QP refused the operation (not enabled, or too long)",
    ),
    (
        Status::RemAccess,
        10,
        "REM_ACCESS_ERR",
        "remote access error: a bad rkey, an address outside the peer's registration or a right it lacks (an internal bug, or memory the peer already unregistered)",
    ),
    (Status::RemOp, 11, "REM_OP_ERR", "remote operation error: the peer could not complete the operation"),
    (
        Status::RetryExc,
        12,
        "RETRY_EXC_ERR",
        "transport retries exhausted: the peer is dead, its port is down or the link between is broken",
    ),
    (
        Status::RnrRetryExc,
        13,
        "RNR_RETRY_EXC_ERR",
        "receiver not ready, retries exhausted: the peer posted no receive in time (it stopped making progress)",
    ),
];

impl Status {
    /// From verbs' number.
    pub fn from_raw(v: u32) -> Status {
        STATUSES.iter().find(|s| s.1 == v).map_or(Status::Other(v), |s| s.0)
    }

    /// Verbs' number.
    pub fn raw(self) -> u32 {
        match self {
            Status::Other(v) => v,
            s => STATUSES.iter().find(|e| e.0 == s).map_or(u32::MAX, |e| e.1),
        }
    }

    /// Verbs' name without the `IBV_WC_` prefix.
    pub fn name(self) -> String {
        STATUSES.iter().find(|e| e.0 == self).map_or_else(|| format!("status {}", self.raw()), |e| e.2.to_string())
    }

    /// What it means and the likely cause, in words.
    pub fn meaning(self) -> &'static str {
        STATUSES.iter().find(|e| e.0 == self).map_or("an error verbs reports without a name oxccl knows", |e| e.3)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.meaning())
    }
}

/// What completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcOpcode {
    /// An RDMA WRITE (with or without immediate) this side posted.
    Write,
    /// An RDMA READ this side posted.
    Read,
    /// A receive consumed by the peer's WRITE_WITH_IMM.
    RecvImm,
    /// Unknown (errors carry no reliable opcode in verbs).
    Unknown,
}

/// A work completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The work request's id.
    pub wr_id: u64,
    /// Its status.
    pub status: Status,
    /// What completed (valid on success).
    pub opcode: WcOpcode,
    /// Bytes (receives: the bytes the peer wrote with the immediate).
    pub byte_len: u32,
    /// The immediate value of a `RecvImm`.
    pub imm: Option<u32>,
    /// The local QP number.
    pub qpn: u32,
    /// Vendor error code (for the log).
    pub vendor_err: u32,
}

/// An asynchronous event (verbs' `ibv_event_type`, the ones oxccl acts on).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AsyncEvent {
    /// `IBV_EVENT_QP_FATAL`: the QP failed on its own.
    QpFatal(u32),
    /// `IBV_EVENT_QP_REQ_ERR` / `QP_ACCESS_ERR`: the peer's request broke a rule.
    QpError(u32),
    /// `IBV_EVENT_CQ_ERR`: a completion queue overflowed (its QPs fail).
    CqErr,
    /// `IBV_EVENT_PORT_ERR` on a port (link down).
    PortErr(u8),
    /// `IBV_EVENT_PORT_ACTIVE` on a port.
    PortActive(u8),
    /// `IBV_EVENT_DEVICE_FATAL`: the HCA is gone.
    DeviceFatal,
    /// Another event (verbs' number), logged only.
    Other(u32),
}

impl fmt::Display for AsyncEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AsyncEvent::QpFatal(q) => write!(f, "QP_FATAL on QP {q}"),
            AsyncEvent::QpError(q) => write!(f, "a request error on QP {q}"),
            AsyncEvent::CqErr => f.write_str("CQ_ERR (a completion queue overflowed)"),
            AsyncEvent::PortErr(p) => write!(f, "PORT_ERR: port {p} went down"),
            AsyncEvent::PortActive(p) => write!(f, "port {p} became active"),
            AsyncEvent::DeviceFatal => f.write_str("DEVICE_FATAL: the HCA failed"),
            AsyncEvent::Other(v) => write!(f, "event {v}"),
        }
    }
}

/// An opened HCA (an `ibv_context` with one protection domain).
pub trait Device: Send + Sync {
    /// The device's name (`mlx5_0`, `soft0`).
    fn name(&self) -> &str;
    /// The ports' attributes (GID tables included).
    fn ports(&self) -> Result<Vec<PortInfo>>;
    /// Registers `len` bytes at `addr` with `access`.
    ///
    /// # Safety
    /// `addr..addr + len` must stay allocated until [`dereg_mr`](Device::dereg_mr),
    /// and be read by the caller only where no peer or local work request
    /// can be writing it (after the completion that says it landed).
    unsafe fn reg_mr(&self, addr: u64, len: usize, access: Access) -> Result<Mr>;
    /// Ends a registration.
    fn dereg_mr(&self, mr: &Mr) -> Result<()>;
    /// A completion queue of `depth` entries with a completion channel.
    fn create_cq(&self, depth: u32) -> Result<Arc<dyn Cq>>;
    /// A reliable-connected queue pair in `Reset`, whose sends and receives
    /// complete on `cq`, moved to `Init` on `port` with remote access
    /// (WRITE and READ) enabled.
    fn create_qp(&self, cq: &Arc<dyn Cq>, caps: QpCaps, port: u8) -> Result<Box<dyn Qp>>;
    /// The next asynchronous event, if any (never blocks).
    fn async_event(&self) -> Option<AsyncEvent>;
}

/// A completion queue.
pub trait Cq: Send + Sync {
    /// Moves up to `max` completions into `out`; how many. An error if the
    /// queue overflowed.
    fn poll(&self, out: &mut Vec<Completion>, max: usize) -> Result<usize>;
    /// The completion channel's descriptor: readable once a completion
    /// arrives after [`arm`](Cq::arm).
    fn fd(&self) -> Option<RawFd>;
    /// Drains the channel's events and asks for one more on the next
    /// completion (`ibv_get_cq_event` + `ibv_ack_cq_events` +
    /// `ibv_req_notify_cq`). Poll after arming: completions that arrived
    /// before it raise no event.
    fn arm(&self) -> Result<()>;
    /// The concrete queue (a backend finds its own type behind the trait
    /// object when a QP is created on it).
    fn as_any(&self) -> &dyn std::any::Any;
}

/// A reliable-connected queue pair.
pub trait Qp: Send {
    /// Its number.
    fn qpn(&self) -> u32;
    /// Its state as last set or reached.
    fn state(&self) -> QpState;
    /// INIT→RTR→RTS towards the remote end `c`.
    fn connect(&mut self, c: &Connect) -> Result<()>;
    /// Moves it to `Error` (outstanding work is flushed).
    fn fail(&mut self) -> Result<()>;
    /// Posts send work requests, in order. Refused before RTS, and when
    /// the send queue has no room (work requests posted and not yet retired
    /// by a polled completion of theirs or of a later signaled one).
    fn post_send(&mut self, wrs: &[SendWr]) -> Result<()>;
    /// Posts receives (for WRITE_WITH_IMM).
    fn post_recv(&mut self, wrs: &[RecvWr]) -> Result<()>;
}

/// A verbs-level failure: the call, the device, and errno in words.
pub fn verbs_error(call: &str, dev: &str, errno: i32) -> Error {
    let what = std::io::Error::from_raw_os_error(errno);
    let hint = match errno {
        libc::ENOMEM if call.contains("reg_mr") => {
            "; registering pins memory: raise the locked-memory limit (ulimit -l unlimited, or memlock in /etc/security/limits.conf; in containers, --ulimit memlock=-1)"
        }
        libc::ENOMEM => "; the HCA ran out of resources (queues, memory)",
        libc::EINVAL => "; the HCA refused the arguments (an attribute it does not support)",
        libc::ENOSYS => "; the kernel has no RDMA support",
        _ => "",
    };
    Error::System(format!("{call} on {dev}: {what}{hint}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_have_words_and_round_trip() {
        for v in 0..30 {
            assert_eq!(Status::from_raw(v).raw(), v);
        }
        let s = Status::from_raw(12);
        assert_eq!(s, Status::RetryExc);
        assert!(s.to_string().starts_with("RETRY_EXC_ERR (") && s.to_string().contains("peer is dead"));
        assert!(Status::from_raw(5).to_string().contains("first error"));
        assert_eq!(Status::from_raw(21).name(), "status 21");
        assert!(Access::ALL.covers(Access::REMOTE_WRITE) && !Access::LOCAL.covers(Access::REMOTE_WRITE));
        let c = Connect {
            remote_qpn: 1,
            remote_psn: 0,
            local_psn: 0,
            remote_lid: 0,
            remote_gid: [0; 16],
            use_gid: true,
            gid_index: 0,
            mtu: 5,
            timeout: 20,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            sl: 0,
            traffic_class: 0,
            max_rd_atomic: 1,
        };
        assert!((c.ack_timeout_secs() - 4.294967).abs() < 1e-3);
    }
}
