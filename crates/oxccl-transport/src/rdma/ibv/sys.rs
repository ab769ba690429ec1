//! The parts of `<infiniband/verbs.h>` (rdma-core) this backend touches,
//! laid out `#[repr(C)]` field by field, and the enum values it uses.
//!
//! Only what oxccl reads or writes is named; the rest of a struct is kept
//! as opaque padding of the right size and alignment so that offsets and
//! sizes match the C definitions (`tests/transport/ibv_layout.rs` compiles a C
//! program against the installed header and compares every entry of
//! `layout::layout_table`).
//!
//! Notes that matter:
//! - `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq` and `ibv_req_notify_cq`
//!   are static inlines in verbs.h that jump through
//!   `context->ops`; [`IbvContextOps`] lays that table out (32 pointers,
//!   most of them `_compat_*` placeholders).
//! - `ibv_query_port` is a macro around a static inline that, without an
//!   extended context op, calls the exported `ibv_query_port@IBVERBS_1.1`
//!   with the legacy `struct _compat_ibv_port_attr` (everything up to and
//!   including `flags`, [`COMPAT_PORT_ATTR_SIZE`] bytes). The caller zeroes
//!   a full [`IbvPortAttr`] first, as the inline does.
//! - `imm_data` (in `ibv_send_wr` and `ibv_wc`) is big-endian.
//! - `union ibv_gid` is 8-aligned (its `global` member holds two `__be64`).
#![allow(dead_code)] // FFI layouts: fields exist to give the right offsets.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::mem::offset_of;

/// `union ibv_gid`: 16 bytes, 8-aligned.
#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
pub struct IbvGid {
    pub raw: [u8; 16],
}

/// `struct ibv_device_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvDeviceAttr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_uint,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: u32,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

/// `struct ibv_port_attr` as in rdma-core v44 (the legacy
/// `_compat_ibv_port_attr` is its prefix up to `flags`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvPortAttr {
    pub state: u32,
    pub max_mtu: u32,
    pub active_mtu: u32,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
    /// Room for fields later rdma-core versions append (`active_speed_ex`);
    /// the compat call never writes here.
    pub _reserved: [u32; 4],
}

/// Bytes `ibv_query_port@IBVERBS_1.1` writes (`struct _compat_ibv_port_attr`).
pub const COMPAT_PORT_ATTR_SIZE: usize = offset_of!(IbvPortAttr, flags) + 1;

/// `struct ibv_context_ops`: 32 function pointers.
#[repr(C)]
pub struct IbvContextOps {
    /// `_compat_query_device` … `_compat_create_cq` (11 entries).
    pub _compat0: [*mut c_void; 11],
    pub poll_cq: Option<unsafe extern "C" fn(*mut IbvCq, c_int, *mut IbvWc) -> c_int>,
    pub req_notify_cq: Option<unsafe extern "C" fn(*mut IbvCq, c_int) -> c_int>,
    /// `_compat_cq_event` … `_compat_destroy_qp` (12 entries, `post_srq_recv` among them).
    pub _compat1: [*mut c_void; 12],
    pub post_send: Option<unsafe extern "C" fn(*mut IbvQp, *mut IbvSendWr, *mut *mut IbvSendWr) -> c_int>,
    pub post_recv: Option<unsafe extern "C" fn(*mut IbvQp, *mut IbvRecvWr, *mut *mut IbvRecvWr) -> c_int>,
    /// `_compat_create_ah` … `_compat_async_event` (5 entries).
    pub _compat2: [*mut c_void; 5],
}

/// `struct ibv_context`.
#[repr(C)]
pub struct IbvContext {
    pub device: *mut c_void,
    pub ops: IbvContextOps,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: libc::pthread_mutex_t,
    pub abi_compat: *mut c_void,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
pub struct IbvCompChannel {
    pub context: *mut IbvContext,
    pub fd: c_int,
    pub refcnt: c_int,
}

/// `struct ibv_cq`.
#[repr(C)]
pub struct IbvCq {
    pub context: *mut IbvContext,
    pub channel: *mut IbvCompChannel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: libc::pthread_mutex_t,
    pub cond: libc::pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

/// `struct ibv_qp`.
#[repr(C)]
pub struct IbvQp {
    pub context: *mut IbvContext,
    pub qp_context: *mut c_void,
    pub pd: *mut c_void,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
    pub state: u32,
    pub qp_type: u32,
    pub mutex: libc::pthread_mutex_t,
    pub cond: libc::pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct IbvMr {
    pub context: *mut IbvContext,
    pub pd: *mut c_void,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvSge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `ibv_send_wr.wr.rdma`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct WrRdma {
    pub remote_addr: u64,
    pub rkey: u32,
}

/// `ibv_send_wr.wr.atomic`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct WrAtomic {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

/// `ibv_send_wr.wr.ud`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct WrUd {
    pub ah: *mut c_void,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

/// `ibv_send_wr.wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union WrUnion {
    pub rdma: WrRdma,
    pub atomic: WrAtomic,
    pub ud: WrUd,
}

/// `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvSendWr {
    pub wr_id: u64,
    pub next: *mut IbvSendWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
    pub opcode: u32,
    pub send_flags: c_uint,
    /// Big-endian (`htonl`) for `*_WITH_IMM`.
    pub imm_data: u32,
    pub wr: WrUnion,
    /// `qp_type.xrc.remote_srqn`.
    pub qp_type: u32,
    /// The `bind_mw` / `tso` union (48 bytes).
    pub _bind_mw_tso: [u64; 6],
}

impl IbvSendWr {
    /// An all-zero work request (null pointers, no flags).
    pub const ZERO: IbvSendWr = IbvSendWr {
        wr_id: 0,
        next: std::ptr::null_mut(),
        sg_list: std::ptr::null_mut(),
        num_sge: 0,
        opcode: 0,
        send_flags: 0,
        imm_data: 0,
        wr: WrUnion { atomic: WrAtomic { remote_addr: 0, compare_add: 0, swap: 0, rkey: 0 } },
        qp_type: 0,
        _bind_mw_tso: [0; 6],
    };
}

/// `struct ibv_recv_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvRecvWr {
    pub wr_id: u64,
    pub next: *mut IbvRecvWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
}

impl IbvRecvWr {
    /// An all-zero receive.
    pub const ZERO: IbvRecvWr =
        IbvRecvWr { wr_id: 0, next: std::ptr::null_mut(), sg_list: std::ptr::null_mut(), num_sge: 0 };
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvWc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// Big-endian when `wc_flags & IBV_WC_WITH_IMM`.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvQpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub struct IbvQpInitAttr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut c_void,
    pub cap: IbvQpCap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvGlobalRoute {
    pub dgid: IbvGid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvAhAttr {
    pub grh: IbvGlobalRoute,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvQpAttr {
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: IbvQpCap,
    pub ah_attr: IbvAhAttr,
    pub alt_ah_attr: IbvAhAttr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_async_event`: `element` is a union of `ibv_cq *`,
/// `ibv_qp *`, `ibv_srq *`, `ibv_wq *` and `int port_num`; read it as the
/// event type says.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvAsyncEvent {
    pub element: *mut c_void,
    pub event_type: u32,
}

impl IbvAsyncEvent {
    /// `element.port_num` (the low 32 bits of the union, little- or
    /// big-endian alike: it is the union's first `int`).
    pub fn port_num(&self) -> c_int {
        let bytes = (self.element as usize).to_ne_bytes();
        let mut first = [0u8; 4];
        // The union's `int` member occupies its first four bytes in memory.
        first.copy_from_slice(&bytes[..4]);
        c_int::from_ne_bytes(first)
    }
}

// enum ibv_wr_opcode
pub const IBV_WR_RDMA_WRITE: u32 = 0;
pub const IBV_WR_RDMA_WRITE_WITH_IMM: u32 = 1;
pub const IBV_WR_RDMA_READ: u32 = 4;
// enum ibv_send_flags
pub const IBV_SEND_FENCE: c_uint = 1;
pub const IBV_SEND_SIGNALED: c_uint = 1 << 1;
pub const IBV_SEND_INLINE: c_uint = 1 << 3;
// enum ibv_access_flags
pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub const IBV_ACCESS_REMOTE_WRITE: c_int = 1 << 1;
pub const IBV_ACCESS_REMOTE_READ: c_int = 1 << 2;
// enum ibv_qp_attr_mask
pub const IBV_QP_STATE: c_int = 1;
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub const IBV_QP_PORT: c_int = 1 << 5;
pub const IBV_QP_AV: c_int = 1 << 7;
pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;
// enum ibv_qp_state
pub const IBV_QPS_RESET: u32 = 0;
pub const IBV_QPS_INIT: u32 = 1;
pub const IBV_QPS_RTR: u32 = 2;
pub const IBV_QPS_RTS: u32 = 3;
pub const IBV_QPS_ERR: u32 = 6;
// enum ibv_qp_type
pub const IBV_QPT_RC: u32 = 2;
// enum ibv_wc_opcode
pub const IBV_WC_RDMA_WRITE: u32 = 1;
pub const IBV_WC_RDMA_READ: u32 = 2;
pub const IBV_WC_RECV: u32 = 1 << 7;
pub const IBV_WC_RECV_RDMA_WITH_IMM: u32 = (1 << 7) + 1;
// enum ibv_wc_flags
pub const IBV_WC_WITH_IMM: c_uint = 1 << 1;
// enum ibv_wc_status
pub const IBV_WC_SUCCESS: u32 = 0;
// link layers
pub const IBV_LINK_LAYER_UNSPECIFIED: u8 = 0;
pub const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;
// enum ibv_port_state
pub const IBV_PORT_ACTIVE: u32 = 4;
// enum ibv_event_type
pub const IBV_EVENT_CQ_ERR: u32 = 0;
pub const IBV_EVENT_QP_FATAL: u32 = 1;
pub const IBV_EVENT_QP_REQ_ERR: u32 = 2;
pub const IBV_EVENT_QP_ACCESS_ERR: u32 = 3;
pub const IBV_EVENT_COMM_EST: u32 = 4;
pub const IBV_EVENT_SQ_DRAINED: u32 = 5;
pub const IBV_EVENT_PATH_MIG: u32 = 6;
pub const IBV_EVENT_PATH_MIG_ERR: u32 = 7;
pub const IBV_EVENT_DEVICE_FATAL: u32 = 8;
pub const IBV_EVENT_PORT_ACTIVE: u32 = 9;
pub const IBV_EVENT_PORT_ERR: u32 = 10;
pub const IBV_EVENT_LID_CHANGE: u32 = 11;
pub const IBV_EVENT_PKEY_CHANGE: u32 = 12;
pub const IBV_EVENT_SM_CHANGE: u32 = 13;
pub const IBV_EVENT_SRQ_ERR: u32 = 14;
pub const IBV_EVENT_SRQ_LIMIT_REACHED: u32 = 15;
pub const IBV_EVENT_QP_LAST_WQE_REACHED: u32 = 16;
pub const IBV_EVENT_CLIENT_REREGISTER: u32 = 17;
pub const IBV_EVENT_GID_CHANGE: u32 = 18;

/// Whether an async event's `element` is a QP (the QP events).
pub fn event_is_qp(t: u32) -> bool {
    matches!(
        t,
        IBV_EVENT_QP_FATAL
            | IBV_EVENT_QP_REQ_ERR
            | IBV_EVENT_QP_ACCESS_ERR
            | IBV_EVENT_COMM_EST
            | IBV_EVENT_SQ_DRAINED
            | IBV_EVENT_PATH_MIG
            | IBV_EVENT_PATH_MIG_ERR
            | IBV_EVENT_QP_LAST_WQE_REACHED
    )
}

/// Whether an async event's `element` is a port number.
pub fn event_is_port(t: u32) -> bool {
    matches!(
        t,
        IBV_EVENT_PORT_ACTIVE
            | IBV_EVENT_PORT_ERR
            | IBV_EVENT_LID_CHANGE
            | IBV_EVENT_PKEY_CHANGE
            | IBV_EVENT_SM_CHANGE
            | IBV_EVENT_CLIENT_REREGISTER
            | IBV_EVENT_GID_CHANGE
    )
}
