//! Completion queues and RC queue pairs over libibverbs.
//!
//! - [`IbvCq`]: `ibv_create_cq` with a completion channel of its own; the
//!   channel's descriptor is non-blocking. `poll` is `ibv_poll_cq` in
//!   batches of 32; `arm` reads every pending channel event
//!   (`ibv_get_cq_event` until `EAGAIN`), acknowledges them
//!   (`ibv_ack_cq_events`) and asks for the next (`ibv_req_notify_cq(cq, 0)`).
//!   Events are acknowledged at once, so `ibv_destroy_cq` never waits.
//! - [`IbvQp`]: `ibv_create_qp` (RC, one SGE each way, unsignaled sends
//!   unless asked), moved to INIT at once. `connect` is NCCL's two steps:
//!   RTR with `STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN |
//!   MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER`, then RTS with `STATE | TIMEOUT |
//!   RETRY_CNT | RNR_RETRY | SQ_PSN | MAX_QP_RD_ATOMIC`. Writes no longer
//!   than the QP's inline size go inline. The immediate is sent and read
//!   big-endian, as verbs wants.

use super::sys::{self, IbvRecvWr, IbvSendWr, IbvSge, IbvWc};
use super::{Ctx, errno, set_nonblocking};
use crate::rdma::verbs::{
    Completion, Connect, Cq, Opcode, Qp, QpCaps, QpState, RecvWr, SendWr, Status, WcOpcode, verbs_error,
};
use crate::{Error, Result};
use std::ffi::{c_int, c_void};
use std::os::fd::RawFd;
use std::sync::Arc;

/// PSNs are 24 bits.
const PSN_MASK: u32 = 0xff_ffff;

/// Work requests or completions handled per verbs call.
const BATCH: usize = 32;

/// A completion queue with its completion channel.
pub(super) struct IbvCq {
    ctx: Arc<Ctx>,
    pub(super) cq: *mut sys::IbvCq,
    channel: *mut sys::IbvCompChannel,
    depth: u32,
}

// SAFETY: libibverbs CQs may be polled, armed and read from any thread
// (providers lock internally); the pointers are owned here and freed in Drop.
unsafe impl Send for IbvCq {}
// SAFETY: see Send.
unsafe impl Sync for IbvCq {}

impl IbvCq {
    pub(super) fn create(ctx: &Arc<Ctx>, depth: u32) -> Result<IbvCq> {
        let dev = &ctx.name;
        let max = ctx.attr.max_cqe.max(0) as u32;
        if depth == 0 || (max > 0 && depth > max) {
            return Err(Error::invalid(format!(
                "ibv_create_cq on {dev}: a depth of {depth} entries is outside 1..={max} (the device's max_cqe)"
            )));
        }
        // SAFETY: the context is live.
        let channel = unsafe { (ctx.lib.f.create_comp_channel)(ctx.ctx) };
        if channel.is_null() {
            return Err(verbs_error("ibv_create_comp_channel", dev, errno()));
        }
        // SAFETY: the channel belongs to this context; no cq_context is used.
        let cq = unsafe { (ctx.lib.f.create_cq)(ctx.ctx, depth as c_int, std::ptr::null_mut(), channel, 0) };
        if cq.is_null() {
            let e = errno();
            // SAFETY: the channel was just created and has no CQ.
            unsafe { (ctx.lib.f.destroy_comp_channel)(channel) };
            return Err(verbs_error(&format!("ibv_create_cq ({depth} entries)"), dev, e));
        }
        let me = IbvCq { ctx: Arc::clone(ctx), cq, channel, depth };
        // SAFETY: the channel is live.
        let fd = unsafe { (*channel).fd };
        set_nonblocking(fd)
            .map_err(|e| Error::System(format!("{dev}: cannot make a completion channel non-blocking: {e}")))?;
        Ok(me)
    }
}

impl IbvCq {
    /// Whether this CQ was made on `ctx`.
    pub(super) fn belongs_to(&self, ctx: &Arc<Ctx>) -> bool {
        Arc::ptr_eq(&self.ctx, ctx)
    }
}

impl Drop for IbvCq {
    fn drop(&mut self) {
        let f = &self.ctx.lib.f;
        // SAFETY: no QP uses this CQ any more (each holds it until destroyed),
        // and every channel event was acknowledged in `arm`.
        let rc = unsafe { (f.destroy_cq)(self.cq) };
        if rc != 0 {
            tracing::warn!("ibv_destroy_cq on {}: {}", self.ctx.name, std::io::Error::from_raw_os_error(rc.abs()));
        }
        // SAFETY: its only CQ is gone.
        let rc = unsafe { (f.destroy_comp_channel)(self.channel) };
        if rc != 0 {
            tracing::warn!("ibv_destroy_comp_channel on {}: {}", self.ctx.name, std::io::Error::last_os_error());
        }
    }
}

/// A verbs completion as the seam's.
fn completion(wc: &IbvWc) -> Completion {
    let ok = wc.status == sys::IBV_WC_SUCCESS;
    let opcode = match wc.opcode {
        _ if !ok => WcOpcode::Unknown,
        sys::IBV_WC_RDMA_WRITE => WcOpcode::Write,
        sys::IBV_WC_RDMA_READ => WcOpcode::Read,
        sys::IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvImm,
        _ => WcOpcode::Unknown,
    };
    Completion {
        wr_id: wc.wr_id,
        status: Status::from_raw(wc.status),
        opcode,
        byte_len: wc.byte_len,
        imm: (ok && wc.wc_flags & sys::IBV_WC_WITH_IMM != 0).then(|| u32::from_be(wc.imm_data)),
        qpn: wc.qp_num,
        vendor_err: wc.vendor_err,
    }
}

impl Cq for IbvCq {
    fn poll(&self, out: &mut Vec<Completion>, max: usize) -> Result<usize> {
        let mut wc = [IbvWc::default(); BATCH];
        let mut total = 0;
        while total < max {
            let want = (max - total).min(BATCH);
            // SAFETY: `wc` has room for `want` entries; the CQ is live. This is
            // verbs.h's ibv_poll_cq: cq->context->ops.poll_cq.
            let n = unsafe { (self.ctx.ops.poll_cq)(self.cq, want as c_int, wc.as_mut_ptr()) };
            if n < 0 {
                return Err(Error::System(format!(
                    "ibv_poll_cq on {}: the completion queue failed (rc {n}): it overflowed (more than {} completions \
                     not yet polled) or the HCA failed",
                    self.ctx.name, self.depth
                )));
            }
            for w in &wc[..n as usize] {
                if w.status != sys::IBV_WC_SUCCESS {
                    tracing::debug!(
                        "RDMA {}: QP {} wr {} completed with {} (vendor error {:#x})",
                        self.ctx.name,
                        w.qp_num,
                        w.wr_id,
                        self.ctx.lib.status_str(w.status),
                        w.vendor_err
                    );
                }
                out.push(completion(w));
            }
            total += n as usize;
            if (n as usize) < want {
                break;
            }
        }
        Ok(total)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn fd(&self) -> Option<RawFd> {
        // SAFETY: the channel is live while self is.
        Some(unsafe { (*self.channel).fd })
    }

    fn arm(&self) -> Result<()> {
        let f = &self.ctx.lib.f;
        let mut events = 0u32;
        let result = loop {
            let mut cq: *mut sys::IbvCq = std::ptr::null_mut();
            let mut cq_ctx: *mut c_void = std::ptr::null_mut();
            // SAFETY: the channel's descriptor is non-blocking, so this returns
            // -1/EAGAIN when no event is pending; the out-pointers are valid.
            let rc = unsafe { (f.get_cq_event)(self.channel, &mut cq, &mut cq_ctx) };
            if rc == 0 {
                events += 1;
                continue;
            }
            let e = errno();
            break if e == libc::EAGAIN || e == libc::EWOULDBLOCK {
                Ok(())
            } else {
                Err(verbs_error("ibv_get_cq_event", &self.ctx.name, e))
            };
        };
        if events > 0 {
            // SAFETY: acknowledges exactly the events read above (the channel
            // serves this CQ only).
            unsafe { (f.ack_cq_events)(self.cq, events) };
        }
        result?;
        // SAFETY: verbs.h's ibv_req_notify_cq: cq->context->ops.req_notify_cq.
        let rc = unsafe { (self.ctx.ops.req_notify_cq)(self.cq, 0) };
        if rc != 0 {
            return Err(verbs_error("ibv_req_notify_cq", &self.ctx.name, rc.abs()));
        }
        Ok(())
    }
}

/// A reliable-connected queue pair.
pub(super) struct IbvQp {
    ctx: Arc<Ctx>,
    qp: *mut sys::IbvQp,
    /// Keeps the CQ alive while the QP exists.
    _cq: Arc<dyn Cq>,
    qpn: u32,
    port: u8,
    /// The sizes the provider granted.
    caps: QpCaps,
    state: QpState,
}

// SAFETY: a QP may be used from any thread; `Qp`'s `&mut self` methods keep
// one thread at a time on it. The pointer is owned here and freed in Drop.
unsafe impl Send for IbvQp {}

impl IbvQp {
    pub(super) fn create(ctx: &Arc<Ctx>, cq: Arc<dyn Cq>, raw: &IbvCq, caps: QpCaps, port: u8) -> Result<IbvQp> {
        let dev = &ctx.name;
        let max_wr = ctx.attr.max_qp_wr.max(0) as u32;
        if caps.max_send_wr == 0 || (max_wr > 0 && (caps.max_send_wr > max_wr || caps.max_recv_wr > max_wr)) {
            return Err(Error::invalid(format!(
                "ibv_create_qp on {dev}: max_send_wr {} and max_recv_wr {} must be 1..={max_wr} (the device's max_qp_wr)",
                caps.max_send_wr, caps.max_recv_wr
            )));
        }
        let mut init = sys::IbvQpInitAttr {
            qp_context: std::ptr::null_mut(),
            send_cq: raw.cq,
            recv_cq: raw.cq,
            srq: std::ptr::null_mut(),
            cap: sys::IbvQpCap {
                max_send_wr: caps.max_send_wr,
                max_recv_wr: caps.max_recv_wr,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: caps.max_inline,
            },
            qp_type: sys::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: the PD and CQ are live and belong to this context.
        let qp = unsafe { (ctx.lib.f.create_qp)(ctx.pd, &mut init) };
        if qp.is_null() {
            return Err(verbs_error(
                &format!("ibv_create_qp (RC, {} send / {} receive WRs)", caps.max_send_wr, caps.max_recv_wr),
                dev,
                errno(),
            ));
        }
        // SAFETY: `qp` is live.
        let qpn = unsafe { (*qp).qp_num };
        let granted = QpCaps {
            max_send_wr: init.cap.max_send_wr,
            max_recv_wr: init.cap.max_recv_wr,
            max_inline: init.cap.max_inline_data,
        };
        let mut me = IbvQp { ctx: Arc::clone(ctx), qp, _cq: cq, qpn, port, caps: granted, state: QpState::Reset };
        let mut a = sys::IbvQpAttr {
            qp_state: sys::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: port,
            qp_access_flags: (sys::IBV_ACCESS_REMOTE_WRITE | sys::IBV_ACCESS_REMOTE_READ | sys::IBV_ACCESS_LOCAL_WRITE)
                as u32,
            ..Default::default()
        };
        let mask = sys::IBV_QP_STATE | sys::IBV_QP_PKEY_INDEX | sys::IBV_QP_PORT | sys::IBV_QP_ACCESS_FLAGS;
        me.modify(&mut a, mask, &format!("ibv_modify_qp (QP {qpn} to INIT on port {port})"))?;
        me.state = QpState::Init;
        Ok(me)
    }

    fn modify(&mut self, a: &mut sys::IbvQpAttr, mask: c_int, what: &str) -> Result<()> {
        // SAFETY: the QP is live; `a` is a full ibv_qp_attr.
        let rc = unsafe { (self.ctx.lib.f.modify_qp)(self.qp, a, mask) };
        if rc != 0 {
            let e = if rc == -1 { errno() } else { rc.abs() };
            return Err(verbs_error(what, &self.ctx.name, e));
        }
        Ok(())
    }
}

impl Drop for IbvQp {
    fn drop(&mut self) {
        // SAFETY: destroyed once; its async events were acknowledged when read.
        let rc = unsafe { (self.ctx.lib.f.destroy_qp)(self.qp) };
        if rc != 0 {
            tracing::warn!(
                "ibv_destroy_qp (QP {}) on {}: {}",
                self.qpn,
                self.ctx.name,
                std::io::Error::from_raw_os_error(rc.abs())
            );
        }
    }
}

fn mtu_bytes(m: u8) -> u32 {
    128 << m
}

impl Qp for IbvQp {
    fn qpn(&self) -> u32 {
        self.qpn
    }

    fn state(&self) -> QpState {
        self.state
    }

    fn connect(&mut self, c: &Connect) -> Result<()> {
        let (dev, qpn) = (self.ctx.name.clone(), self.qpn);
        if self.state != QpState::Init {
            return Err(Error::InvalidUsage(format!(
                "connect on QP {qpn} of {dev}: the QP is {:?}; only a new QP (INIT) can be connected",
                self.state
            )));
        }
        if !(1..=5).contains(&c.mtu) {
            return Err(Error::invalid(format!("connect on QP {qpn} of {dev}: path MTU code {} is not 1..=5", c.mtu)));
        }
        let (max_dest_rd, max_init_rd) = (self.ctx.attr.max_qp_rd_atom, self.ctx.attr.max_qp_init_rd_atom);
        let clamp = |v: u8, dev_max: c_int| if dev_max > 0 { v.min(dev_max.min(255) as u8) } else { v };
        let mut a = sys::IbvQpAttr {
            qp_state: sys::IBV_QPS_RTR,
            path_mtu: c.mtu as u32,
            dest_qp_num: c.remote_qpn,
            rq_psn: c.remote_psn & PSN_MASK,
            max_dest_rd_atomic: clamp(c.max_rd_atomic, max_dest_rd),
            min_rnr_timer: c.min_rnr_timer,
            ..Default::default()
        };
        a.ah_attr.dlid = c.remote_lid;
        a.ah_attr.sl = c.sl;
        a.ah_attr.src_path_bits = 0;
        a.ah_attr.port_num = self.port;
        if c.use_gid {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid.raw = c.remote_gid;
            a.ah_attr.grh.flow_label = 0;
            a.ah_attr.grh.sgid_index = c.gid_index;
            a.ah_attr.grh.hop_limit = 255;
            a.ah_attr.grh.traffic_class = c.traffic_class;
        }
        let to = if c.use_gid {
            format!("GID {} (local GID index {})", crate::rdma::env::gid_to_string(&c.remote_gid), c.gid_index)
        } else {
            format!("LID {}", c.remote_lid)
        };
        let mask = sys::IBV_QP_STATE
            | sys::IBV_QP_AV
            | sys::IBV_QP_PATH_MTU
            | sys::IBV_QP_DEST_QPN
            | sys::IBV_QP_RQ_PSN
            | sys::IBV_QP_MAX_DEST_RD_ATOMIC
            | sys::IBV_QP_MIN_RNR_TIMER;
        self.modify(
            &mut a,
            mask,
            &format!(
                "ibv_modify_qp (QP {qpn} to RTR towards QP {} at {to}, port {}, path MTU {})",
                c.remote_qpn,
                self.port,
                mtu_bytes(c.mtu)
            ),
        )?;
        self.state = QpState::Rtr;
        let mut a = sys::IbvQpAttr {
            qp_state: sys::IBV_QPS_RTS,
            timeout: c.timeout,
            retry_cnt: c.retry_cnt,
            rnr_retry: c.rnr_retry,
            sq_psn: c.local_psn & PSN_MASK,
            max_rd_atomic: clamp(c.max_rd_atomic, max_init_rd),
            ..Default::default()
        };
        let mask = sys::IBV_QP_STATE
            | sys::IBV_QP_TIMEOUT
            | sys::IBV_QP_RETRY_CNT
            | sys::IBV_QP_RNR_RETRY
            | sys::IBV_QP_SQ_PSN
            | sys::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(&mut a, mask, &format!("ibv_modify_qp (QP {qpn} to RTS)"))?;
        self.state = QpState::Rts;
        Ok(())
    }

    fn fail(&mut self) -> Result<()> {
        let mut a = sys::IbvQpAttr { qp_state: sys::IBV_QPS_ERR, ..Default::default() };
        let qpn = self.qpn;
        self.modify(&mut a, sys::IBV_QP_STATE, &format!("ibv_modify_qp (QP {qpn} to ERROR)"))?;
        self.state = QpState::Error;
        Ok(())
    }

    fn post_send(&mut self, wrs: &[SendWr]) -> Result<()> {
        if self.state != QpState::Rts {
            return Err(Error::InvalidUsage(format!(
                "post_send on QP {} of {}: the QP is {:?}, not RTS (connect it first)",
                self.qpn, self.ctx.name, self.state
            )));
        }
        for (b, batch) in wrs.chunks(BATCH).enumerate() {
            let mut sge = [IbvSge::default(); BATCH];
            let mut v = [IbvSendWr::ZERO; BATCH];
            for (i, w) in batch.iter().enumerate() {
                sge[i] = IbvSge { addr: w.local, length: w.len, lkey: w.lkey };
                let (opcode, imm) = match w.op {
                    Opcode::Write => (sys::IBV_WR_RDMA_WRITE, 0),
                    Opcode::WriteImm(imm) => (sys::IBV_WR_RDMA_WRITE_WITH_IMM, imm.to_be()),
                    Opcode::Read => (sys::IBV_WR_RDMA_READ, 0),
                };
                let mut flags = if w.signaled { sys::IBV_SEND_SIGNALED } else { 0 };
                if opcode != sys::IBV_WR_RDMA_READ && w.len > 0 && w.len <= self.caps.max_inline {
                    flags |= sys::IBV_SEND_INLINE;
                }
                v[i].wr_id = w.wr_id;
                v[i].num_sge = (w.len > 0) as c_int;
                v[i].opcode = opcode;
                v[i].send_flags = flags;
                v[i].imm_data = imm;
                v[i].wr.rdma = sys::WrRdma { remote_addr: w.remote, rkey: w.rkey };
            }
            let n = batch.len();
            let (sp, vp) = (sge.as_mut_ptr(), v.as_mut_ptr());
            for i in 0..n {
                // SAFETY: i < n <= BATCH, and i + 1 < n where used: in bounds of
                // the two arrays on this frame.
                unsafe {
                    (*vp.add(i)).sg_list = sp.add(i);
                    (*vp.add(i)).next = if i + 1 < n { vp.add(i + 1) } else { std::ptr::null_mut() };
                }
            }
            let mut bad: *mut IbvSendWr = std::ptr::null_mut();
            // SAFETY: verbs.h's ibv_post_send (qp->context->ops.post_send) on a
            // live QP; the list and its SGEs live on this stack frame for the
            // call (the provider copies work requests when they are posted).
            let rc = unsafe { (self.ctx.ops.post_send)(self.qp, vp, &mut bad) };
            if rc != 0 {
                let e = if rc == -1 { errno() } else { rc.abs() };
                let base = vp as usize;
                let at = (bad as usize).checked_sub(base).map_or(0, |d| d / size_of::<IbvSendWr>()).min(n);
                let posted = b * BATCH + at;
                if e == libc::ENOMEM {
                    return Err(Error::System(format!(
                        "ibv_post_send on {}: the send queue of QP {} is full ({posted} of {} work requests posted; \
                         max_send_wr {}): more work requests were posted than completions retired",
                        self.ctx.name,
                        self.qpn,
                        wrs.len(),
                        self.caps.max_send_wr
                    )));
                }
                return Err(verbs_error(
                    &format!("ibv_post_send (QP {}, {posted} of {} work requests posted)", self.qpn, wrs.len()),
                    &self.ctx.name,
                    e,
                ));
            }
        }
        Ok(())
    }

    fn post_recv(&mut self, wrs: &[RecvWr]) -> Result<()> {
        if self.state == QpState::Reset {
            return Err(Error::InvalidUsage(format!(
                "post_recv on QP {} of {}: the QP is in RESET",
                self.qpn, self.ctx.name
            )));
        }
        for (b, batch) in wrs.chunks(BATCH).enumerate() {
            let mut v = [IbvRecvWr::ZERO; BATCH];
            for (i, w) in batch.iter().enumerate() {
                v[i].wr_id = w.wr_id;
            }
            let n = batch.len();
            let vp = v.as_mut_ptr();
            for i in 0..n.saturating_sub(1) {
                // SAFETY: i + 1 < n <= BATCH: in bounds of the array on this frame.
                unsafe { (*vp.add(i)).next = vp.add(i + 1) };
            }
            let mut bad: *mut IbvRecvWr = std::ptr::null_mut();
            // SAFETY: verbs.h's ibv_post_recv (qp->context->ops.post_recv) on a
            // live QP with a list of buffer-less receives on this stack frame.
            let rc = unsafe { (self.ctx.ops.post_recv)(self.qp, vp, &mut bad) };
            if rc != 0 {
                let e = if rc == -1 { errno() } else { rc.abs() };
                let at = (bad as usize).checked_sub(vp as usize).map_or(0, |d| d / size_of::<IbvRecvWr>()).min(n);
                let posted = b * BATCH + at;
                let what = if e == libc::ENOMEM {
                    format!(
                        "ibv_post_recv (QP {}: receive queue full, max_recv_wr {}; {posted} of {} posted)",
                        self.qpn,
                        self.caps.max_recv_wr,
                        wrs.len()
                    )
                } else {
                    format!("ibv_post_recv (QP {}, {posted} of {} posted)", self.qpn, wrs.len())
                };
                return Err(verbs_error(&what, &self.ctx.name, e));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_convert() {
        let mut wc = IbvWc {
            wr_id: 7,
            status: 0,
            opcode: sys::IBV_WC_RECV_RDMA_WITH_IMM,
            byte_len: 100,
            imm_data: 0x1234_5678u32.to_be(),
            qp_num: 9,
            wc_flags: sys::IBV_WC_WITH_IMM,
            ..Default::default()
        };
        let c = completion(&wc);
        assert_eq!((c.wr_id, c.opcode, c.imm, c.byte_len, c.qpn), (7, WcOpcode::RecvImm, Some(0x1234_5678), 100, 9));
        wc.opcode = sys::IBV_WC_RDMA_READ;
        wc.wc_flags = 0;
        assert_eq!((completion(&wc).opcode, completion(&wc).imm), (WcOpcode::Read, None));
        wc.status = 12;
        wc.opcode = sys::IBV_WC_RDMA_WRITE;
        let c = completion(&wc);
        assert_eq!((c.status, c.opcode), (Status::RetryExc, WcOpcode::Unknown));
        assert_eq!(mtu_bytes(5), 4096);
        assert_eq!(mtu_bytes(1), 256);
    }
}
