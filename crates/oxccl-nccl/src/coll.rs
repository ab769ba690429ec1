//! Collectives and point-to-point calls: the checks at the boundary, the
//! memory kind of each buffer, NCCL's in-place conventions, and one
//! [`Op`] per call handed to oxccl's launch (through the group).

use crate::group;
use crate::handle::Comm;
use oxccl::call::resolve_addrs;
use oxccl::{Buffer, CollKind, CudaStream, DataType, Error, Memory, Op, ReduceOp, Result, Spec};
use oxccl_algo::collective::Collective;
use std::ffi::c_void;

/// The raw arguments of one collective call, apart from the communicator
/// and the stream.
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
}

impl Args {
    /// `kind` from `send` into `recv`, `count` elements of `dtype`, not
    /// reducing, rooted at 0.
    pub fn new(kind: CollKind, send: *const c_void, recv: *mut c_void, count: usize, dtype: i32) -> Args {
        Args { kind, send, recv, count, dtype, op: None, root: 0 }
    }

    /// The same reducing with `op`.
    pub fn op(self, op: i32) -> Args {
        Args { op: Some(op), ..self }
    }

    /// The same rooted at `root`.
    pub fn root(self, root: i32) -> Args {
        Args { root, ..self }
    }
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

/// The buffer of `len` bytes at `addr` in `memory`.
fn buffer(memory: Memory, (addr, len): (usize, usize), writable: bool) -> Buffer {
    // SAFETY: the C caller guarantees `len` bytes at `addr` (NCCL's
    // contract for its buffers) until the call, or its group, has ended;
    // the group launcher waits for that before returning.
    unsafe { Buffer::from_raw(memory, addr, len, writable) }
}

/// `ncclAllReduce` and every other collective.
pub fn collective(a: Args, comm: usize, stream: usize) -> Result<()> {
    let h = Comm::get(comm)?;
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
    let memory = if on_device(a.send as usize) || on_device(a.recv as usize) { Memory::Device } else { Memory::Host };
    let stream = on_stream(memory, stream, a.kind.name())?;
    let spec = Spec { kind: a.kind, count: a.count, dtype, op, root };
    let send = res.send.map(|s| buffer(memory, s, false));
    let op = Op::collective(spec, send, buffer(memory, res.recv, true), c.rank(), c.size())?;
    group::submit(h, c, op, stream)
}

/// The stream a call on `memory` is ordered on: the caller's for device
/// memory; none for host memory, whose calls run to their end before
/// returning (a stream would promise an ordering that does not hold), so
/// it must be NULL.
fn on_stream(memory: Memory, stream: usize, what: &str) -> Result<Option<CudaStream>> {
    match memory {
        Memory::Device => Ok(Some(CudaStream::from_raw(stream as u64))),
        Memory::Host if stream == 0 => Ok(None),
        Memory::Host => Err(Error::invalid(format!(
            "{what} on host memory runs on the calling thread (an oxccl extension): pass a NULL stream, \
             not {stream:#x}"
        ))),
    }
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
    let memory = if on_device(buf) { Memory::Device } else { Memory::Host };
    let stream = on_stream(memory, stream, what)?;
    let b = buffer(memory, (buf, len), !send);
    group::submit(h, c, if send { Op::send(b, dtype, peer) } else { Op::recv(b, dtype, peer) }, stream)
}
