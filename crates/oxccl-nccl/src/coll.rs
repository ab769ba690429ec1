//! Collectives and point-to-point calls: the checks at the boundary, the
//! choice between host and device memory, NCCL's in-place conventions,
//! and one [`Call`] per collective handed to oxccl.

use crate::group::{self, DeviceCall, Pending};
use crate::handle::Comm;
use oxccl::call::resolve_addrs;
use oxccl::{Call, CollKind, CudaStream, DataType, DeviceBuf, Error, RawOp, ReduceOp, Region, Result};
use oxccl_algo::collective::Collective;
use std::ffi::c_void;

/// The raw arguments of one collective call.
pub struct Args {
    /// Which collective.
    pub kind: CollKind,
    /// `sendbuff`.
    pub send: *const c_void,
    /// `recvbuff`.
    pub recv: *mut c_void,
    /// NCCL's count.
    pub count: usize,
    /// `ncclDataType_t`.
    pub dtype: i32,
    /// `ncclRedOp_t`; `None` for collectives that do not reduce.
    pub op: Option<i32>,
    /// Root rank (0 where there is none).
    pub root: i32,
    /// The `ncclComm_t` handle.
    pub comm: usize,
    /// The `cudaStream_t`.
    pub stream: usize,
}

/// Whether memory at `addr` is on a GPU (never without the `cuda`
/// feature or a driver).
fn on_device(addr: usize) -> bool {
    #[cfg(feature = "cuda")]
    if addr != 0 {
        return oxccl_cuda::is_device_memory(addr as u64);
    }
    let _ = addr;
    false
}

/// The element type `dt`, or an error naming it.
pub fn dtype_of(dt: i32) -> Result<DataType> {
    DataType::from_nccl(dt).map_err(|_| {
        Error::invalid(format!("datatype {dt} is not an ncclDataType_t (0 = ncclInt8 … 11 = ncclFloat8e5m2)"))
    })
}

/// A host region (a dangling, never-read address for empty ones).
fn region(addr: usize, len: usize, writable: bool) -> Region {
    if len == 0 {
        return Region::empty();
    }
    // SAFETY: the C caller guarantees `len` bytes at `addr` (NCCL's
    // contract for its buffers) until the call, or its group, has ended;
    // the group launcher waits for that before returning.
    unsafe { Region::from_raw(addr as *mut u8, len, writable) }
}

/// `ncclAllReduce` and every other collective.
pub fn collective(a: Args) -> Result<()> {
    let h = Comm::get(a.comm)?;
    let c = h.comm()?;
    let dtype = dtype_of(a.dtype)?;
    let op = match a.op {
        Some(o) => h.op(o, dtype)?,
        None => ReduceOp::Sum,
    };
    let root = usize::try_from(a.root)
        .ok()
        .filter(|&r| r < c.size())
        .ok_or_else(|| Error::invalid(format!("root {} is out of range for {} ranks", a.root, c.size())))?;
    let coll = Collective { kind: a.kind, nranks: c.size(), count: a.count, root, dtype };
    // Sizes that fit in memory before any length is computed.
    coll.validate().map_err(|e| match e {
        Error::InvalidArgument(m) => Error::invalid(format!("rank {}: {m}", c.rank())),
        other => other,
    })?;
    let res = resolve_addrs(&coll, c.rank(), a.send as usize, a.recv as usize)?;
    let device = on_device(a.send as usize) || on_device(a.recv as usize);
    let pending = if device {
        let buf = |(addr, len): (usize, usize)| DeviceBuf::new(addr as u64, len);
        Pending::Device(DeviceCall {
            kind: a.kind,
            send: res.send.map(buf),
            recv: buf(res.recv),
            count: a.count,
            dtype,
            op,
            root,
            stream: CudaStream::from_raw(a.stream as u64),
        })
    } else {
        host_stream(a.stream, a.kind.name())?;
        let send = res.send.map(|(addr, len)| region(addr, len, false));
        let recv = region(res.recv.0, res.recv.1, true);
        let call = Call::new(a.kind, a.count, dtype, op, root, send, recv, c.rank(), c.size())?;
        Pending::Host(RawOp::Collective(call))
    };
    group::submit(h, c, pending)
}

/// Host calls run to their end before returning: a stream would promise
/// an ordering that does not hold.
fn host_stream(stream: usize, what: &str) -> Result<()> {
    if stream != 0 {
        return Err(Error::invalid(format!(
            "{what} on host memory runs on the calling thread (an oxccl extension): pass a NULL stream, \
             not {stream:#x}"
        )));
    }
    Ok(())
}

/// `ncclSend` / `ncclRecv`.
pub fn p2p(send: bool, buf: usize, count: usize, dt: i32, peer: i32, comm: usize, stream: usize) -> Result<()> {
    let what = if send { "ncclSend" } else { "ncclRecv" };
    let h = Comm::get(comm)?;
    let c = h.comm()?;
    let dtype = dtype_of(dt)?;
    let peer = usize::try_from(peer).ok().filter(|&p| p < c.size()).ok_or_else(|| {
        Error::invalid(format!("{what}: peer {peer} is out of range for {} ranks (rank {})", c.size(), c.rank()))
    })?;
    let len = count
        .checked_mul(dtype.size())
        .filter(|b| *b <= isize::MAX as usize)
        .ok_or_else(|| Error::invalid(format!("{what}: count {count} of {dtype} exceeds the address space")))?;
    if len > 0 && buf == 0 {
        return Err(Error::invalid(format!("{what}: the buffer is NULL but count is {count}")));
    }
    if on_device(buf) {
        let op = oxccl::DeviceP2p { send, peer, buf: DeviceBuf::new(buf as u64, len), dtype };
        return group::submit(h, c, Pending::DeviceP2p(op, CudaStream::from_raw(stream as u64)));
    }
    host_stream(stream, what)?;
    let region = region(buf, len, !send);
    let op = if send { RawOp::Send { buf: region, peer, dtype } } else { RawOp::Recv { buf: region, peer, dtype } };
    group::submit(h, c, Pending::Host(op))
}
