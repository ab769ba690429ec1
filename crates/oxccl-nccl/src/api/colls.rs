//! Collectives, their per-call-config forms, point to point, groups.

use crate::abi::{self, CollConfigHead, SimInfoC};
use crate::coll::{self, Args};
use crate::group;
use crate::nccl_api;
use oxccl::{CollKind, Error};
use std::ffi::{c_int, c_uint, c_void};

type Stream = *mut c_void;
type CommH = *mut c_void;

fn call(args: Args, comm: CommH, stream: Stream) -> oxccl::Result<()> {
    crate::setup();
    coll::collective(args, comm as usize, stream as usize)
}

fn unsupported(what: &str) -> oxccl::Result<()> {
    Err(Error::InvalidUsage(format!(
        "{what} works on NCCL's symmetric memory windows (ncclCommWindowRegister), which oxccl does not support"
    )))
}

nccl_api! {
    /// `ncclAllReduce`.
    fn ncclAllReduce / pncclAllReduce(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, op: c_int, comm: CommH, stream: Stream
    ) {
        call(Args::new(CollKind::AllReduce, sendbuff, recvbuff, count, datatype).op(op), comm, stream)
    }

    /// `ncclReduce`.
    fn ncclReduce / pncclReduce(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, op: c_int, root: c_int,
        comm: CommH, stream: Stream
    ) {
        call(Args::new(CollKind::Reduce, sendbuff, recvbuff, count, datatype).op(op).root(root), comm, stream)
    }

    /// `ncclBcast`: in-place broadcast.
    fn ncclBcast / pncclBcast(buff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: CommH, stream: Stream) {
        call(Args::new(CollKind::Broadcast, buff, buff, count, datatype).root(root), comm, stream)
    }

    /// `ncclBroadcast`.
    fn ncclBroadcast / pncclBroadcast(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: CommH,
        stream: Stream
    ) {
        call(Args::new(CollKind::Broadcast, sendbuff, recvbuff, count, datatype).root(root), comm, stream)
    }

    /// `ncclReduceScatter`.
    fn ncclReduceScatter / pncclReduceScatter(
        sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize, datatype: c_int, op: c_int, comm: CommH,
        stream: Stream
    ) {
        call(Args::new(CollKind::ReduceScatter, sendbuff, recvbuff, recvcount, datatype).op(op), comm, stream)
    }

    /// `ncclAllGather`.
    fn ncclAllGather / pncclAllGather(
        sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize, datatype: c_int, comm: CommH, stream: Stream
    ) {
        call(Args::new(CollKind::AllGather, sendbuff, recvbuff, sendcount, datatype), comm, stream)
    }

    /// `ncclAlltoAll`.
    fn ncclAlltoAll / pncclAlltoAll(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, comm: CommH, stream: Stream
    ) {
        call(Args::new(CollKind::AllToAll, sendbuff, recvbuff, count, datatype), comm, stream)
    }

    /// `ncclGather`.
    fn ncclGather / pncclGather(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: CommH,
        stream: Stream
    ) {
        call(Args::new(CollKind::Gather, sendbuff, recvbuff, count, datatype).root(root), comm, stream)
    }

    /// `ncclScatter`.
    fn ncclScatter / pncclScatter(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: CommH,
        stream: Stream
    ) {
        call(Args::new(CollKind::Scatter, sendbuff, recvbuff, count, datatype).root(root), comm, stream)
    }

    /// `ncclAllReduceConfig`.
    fn ncclAllReduceConfig / pncclAllReduceConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, op: c_int, comm: CommH,
        stream: Stream, config: *const CollConfigHead
    ) {
        abi::check_coll_config(config)?;
        call(Args::new(CollKind::AllReduce, sendbuff, recvbuff, count, datatype).op(op), comm, stream)
    }

    /// `ncclBroadcastConfig`.
    fn ncclBroadcastConfig / pncclBroadcastConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: CommH,
        stream: Stream, config: *const CollConfigHead
    ) {
        abi::check_coll_config(config)?;
        call(Args::new(CollKind::Broadcast, sendbuff, recvbuff, count, datatype).root(root), comm, stream)
    }

    /// `ncclReduceConfig`.
    fn ncclReduceConfig / pncclReduceConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, op: c_int, root: c_int,
        comm: CommH, stream: Stream, config: *const CollConfigHead
    ) {
        abi::check_coll_config(config)?;
        call(Args::new(CollKind::Reduce, sendbuff, recvbuff, count, datatype).op(op).root(root), comm, stream)
    }

    /// `ncclAllGatherConfig`.
    fn ncclAllGatherConfig / pncclAllGatherConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize, datatype: c_int, comm: CommH,
        stream: Stream, config: *const CollConfigHead
    ) {
        abi::check_coll_config(config)?;
        call(Args::new(CollKind::AllGather, sendbuff, recvbuff, sendcount, datatype), comm, stream)
    }

    /// `ncclReduceScatterConfig`.
    fn ncclReduceScatterConfig / pncclReduceScatterConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize, datatype: c_int, op: c_int, comm: CommH,
        stream: Stream, config: *const CollConfigHead
    ) {
        abi::check_coll_config(config)?;
        call(Args::new(CollKind::ReduceScatter, sendbuff, recvbuff, recvcount, datatype).op(op), comm, stream)
    }

    /// `ncclAlltoAllConfig`.
    fn ncclAlltoAllConfig / pncclAlltoAllConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, comm: CommH,
        stream: Stream, config: *const CollConfigHead
    ) {
        abi::check_coll_config(config)?;
        call(Args::new(CollKind::AllToAll, sendbuff, recvbuff, count, datatype), comm, stream)
    }

    /// `ncclGatherConfig`.
    fn ncclGatherConfig / pncclGatherConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: CommH,
        stream: Stream, config: *const CollConfigHead
    ) {
        abi::check_coll_config(config)?;
        call(Args::new(CollKind::Gather, sendbuff, recvbuff, count, datatype).root(root), comm, stream)
    }

    /// `ncclScatterConfig`.
    fn ncclScatterConfig / pncclScatterConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: CommH,
        stream: Stream, config: *const CollConfigHead
    ) {
        abi::check_coll_config(config)?;
        call(Args::new(CollKind::Scatter, sendbuff, recvbuff, count, datatype).root(root), comm, stream)
    }

    /// `ncclSend`.
    fn ncclSend / pncclSend(
        sendbuff: *const c_void, count: usize, datatype: c_int, peer: c_int, comm: CommH, stream: Stream
    ) {
        crate::setup();
        coll::p2p(true, sendbuff as usize, count, datatype, peer, comm as usize, stream as usize)
    }

    /// `ncclRecv`.
    fn ncclRecv / pncclRecv(recvbuff: *mut c_void, count: usize, datatype: c_int, peer: c_int, comm: CommH, stream: Stream) {
        crate::setup();
        coll::p2p(false, recvbuff as usize, count, datatype, peer, comm as usize, stream as usize)
    }

    /// `ncclPutSignal`: not supported.
    fn ncclPutSignal / pncclPutSignal(
        localbuff: *const c_void, count: usize, datatype: c_int, peer: c_int, peer_win: *mut c_void,
        peer_win_offset: usize, sig_idx: c_int, ctx: c_int, flags: c_uint, comm: CommH, stream: Stream
    ) {
        let _ = (localbuff, count, datatype, peer, peer_win, peer_win_offset, sig_idx, ctx, flags, comm, stream);
        unsupported("ncclPutSignal")
    }

    /// `ncclSignal`: not supported.
    fn ncclSignal / pncclSignal(peer: c_int, sig_idx: c_int, ctx: c_int, flags: c_uint, comm: CommH, stream: Stream) {
        let _ = (peer, sig_idx, ctx, flags, comm, stream);
        unsupported("ncclSignal")
    }

    /// `ncclWaitSignal`: not supported.
    fn ncclWaitSignal / pncclWaitSignal(n_desc: c_int, signal_descs: *mut c_void, comm: CommH, stream: Stream) {
        let _ = (n_desc, signal_descs, comm, stream);
        unsupported("ncclWaitSignal")
    }

    /// `ncclGroupStart`.
    fn ncclGroupStart / pncclGroupStart() {
        crate::setup();
        group::start();
        Ok(())
    }

    /// `ncclGroupEnd`: launches the group's calls (host calls have ended
    /// when it returns).
    fn ncclGroupEnd / pncclGroupEnd() {
        group::end()
    }

    /// `ncclGroupSimulateEnd`: closes the group without running it; the
    /// cost model's time for its collectives, in microseconds.
    fn ncclGroupSimulateEnd / pncclGroupSimulateEnd(sim_info: *mut SimInfoC) {
        if !sim_info.is_null() {
            // SAFETY: a non-NULL simInfo points at an ncclSimInfo_t.
            let magic = unsafe { (*sim_info).magic };
            if magic != abi::SIM_MAGIC {
                // Close the group anyway: the caller cannot retry it.
                let _ = group::simulate_end();
                return Err(Error::invalid(format!(
                    "simInfo.magic is {magic:#x}: initialise it with NCCL_SIM_INFO_INITIALIZER"
                )));
            }
        }
        let t = group::simulate_end()?;
        if !sim_info.is_null() {
            // SAFETY: checked above.
            unsafe { (*sim_info).estimatedTime = (t * 1e6) as f32 };
        }
        Ok(())
    }
}
