//! What Python hands over for one launch: a list of tuples of integers and
//! names, checked here into oxccl's [`Op`]s (an error changes nothing and
//! names the rank, the operation and the buffer). A buffer is `(addr,
//! nbytes, device)`: `device` says whether the memory is on a GPU.
//!
//! - `("coll", kind, send, recv, count, dtype, op, scalar, root)`: `send`
//!   is `None` (in place) or a buffer; a send buffer at NCCL's in-place
//!   position inside the receive buffer (or the reverse, for
//!   reduce-scatter) is in place too.
//! - `("send", buf, peer, dtype)`, `("recv", buf, peer, dtype)`.
//! - `("all_to_allv", send, send_counts, send_displs, recv, recv_counts,
//!   recv_displs, dtype)`: the sends and receives that make it.

use crate::errors::IntoPy;
use oxccl::call::resolve_addrs;
use oxccl::{Blocks, Buffer, CollKind, Communicator, DataType, Error, Memory, Op, ReduceOp, Result, Spec};
use oxccl_algo::collective::Collective;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

/// A buffer as Python describes it: address, length in bytes, on a device.
pub type Span = (usize, usize, bool);

/// The element type named `name`.
pub fn dtype(name: &str) -> Result<DataType> {
    name.parse()
}

/// The reduction named `name` (`premul_sum` takes `scalar`).
pub fn reduce_op(name: &str, scalar: f64) -> Result<ReduceOp> {
    let op: ReduceOp = name.replace('_', "").parse()?;
    Ok(match op {
        ReduceOp::PreMulSum { .. } => ReduceOp::PreMulSum { scalar },
        other => other,
    })
}

/// The caller's buffer `span`.
fn buffer((addr, len, device): Span, writable: bool) -> Buffer {
    let memory = if device { Memory::Device } else { Memory::Host };
    // SAFETY: the Python side holds a reference to the object that owns
    // these bytes (and, for buffer-protocol objects, an exported view that
    // pins them) until the launch has returned; host operations have ended
    // then, and device memory stays the tensor's until its stream has
    // passed the launch (the caller keeps the tensor, as with NCCL).
    unsafe { Buffer::from_raw(memory, addr, len, writable) }
}

/// A collective's kind, element type and reduction, from their names.
pub fn names(kind: &str, dtype_name: &str, op: &str, scalar: f64) -> Result<(CollKind, DataType, ReduceOp)> {
    Ok((kind.parse()?, dtype(dtype_name)?, reduce_op(op, scalar)?))
}

/// The arguments of one collective as Python passes them, named.
struct Coll {
    kind: CollKind,
    send: Option<Span>,
    recv: Span,
    count: usize,
    dtype: DataType,
    op: ReduceOp,
    root: usize,
}

/// The indices of a collective's kind, element type and reduction in
/// [`CollKind::ALL`], [`DataType::ALL`] and [`ReduceOp::ALL`]: what the
/// Python side keeps per name, so that a call passes integers
/// ([`coll`]). An error names what is unknown.
pub fn codes(kind: &str, dtype_name: &str, op: &str) -> Result<(usize, usize, usize)> {
    let (kind, dtype, op) = names(kind, dtype_name, op, 1.0)?;
    let at =
        |found: Option<usize>| found.ok_or_else(|| Error::Internal(format!("{kind:?}/{dtype:?}/{op:?} has no index")));
    Ok((
        at(CollKind::ALL.iter().position(|k| *k == kind))?,
        at(DataType::ALL.iter().position(|d| *d == dtype))?,
        at(ReduceOp::ALL.iter().position(|o| std::mem::discriminant(o) == std::mem::discriminant(&op)))?,
    ))
}

/// A collective from [`codes`]' indices, checked for `comm`'s rank.
pub fn coll(
    comm: &Communicator,
    (kind, dtype, op): (usize, usize, usize),
    send: Option<Span>,
    recv: Span,
    count: usize,
    scalar: f64,
    root: i64,
) -> Result<Op> {
    let (rank, nranks) = (comm.rank(), comm.size());
    let bad = |what: &str, i: usize| Error::invalid(format!("rank {rank}: {what} index {i} is not one oxccl has"));
    let kind = *CollKind::ALL.get(kind).ok_or_else(|| bad("collective", kind))?;
    let dtype = *DataType::ALL.get(dtype).ok_or_else(|| bad("element type", dtype))?;
    let op = match *ReduceOp::ALL.get(op).ok_or_else(|| bad("reduction", op))? {
        ReduceOp::PreMulSum { .. } => ReduceOp::PreMulSum { scalar },
        other => other,
    };
    let root = rank_arg(root, format_args!("{}: root", kind.name()), rank, nranks)?;
    Coll { kind, send, recv, count, dtype, op, root }.op(rank, nranks)
}

/// A root or peer as Python passed it: a negative one is refused here,
/// naming it (Python ints are signed); one past the last rank is refused
/// by the call's own checks, like every other argument.
fn rank_arg(v: i64, what: std::fmt::Arguments<'_>, rank: usize, nranks: usize) -> Result<usize> {
    usize::try_from(v).map_err(|_| {
        Error::invalid(format!("rank {rank}: {what} {v} is not a rank of this communicator (0..{})", nranks - 1))
    })
}

impl Coll {
    /// Checked for `rank` of `nranks`.
    fn op(&self, rank: usize, nranks: usize) -> Result<Op> {
        let spec = Spec { kind: self.kind, count: self.count, dtype: self.dtype, op: self.op, root: self.root };
        let coll = spec.collective(nranks);
        let (send, recv) = match self.send {
            Some(s) if s.2 == self.recv.2 => in_place(&coll, rank, s, self.recv)?,
            other => (other, self.recv),
        };
        Op::collective(spec, send.map(|s| buffer(s, false)), buffer(recv, true), rank, nranks)
    }
}

/// `send` and `recv` as the call sees them: `(None, buffer)` when they are
/// NCCL's in-place layout of one buffer, else unchanged (oxccl checks the
/// lengths; overlaps in any other layout are refused).
fn in_place(coll: &Collective, rank: usize, send: Span, recv: Span) -> Result<(Option<Span>, Span)> {
    if send.1 == 0 || recv.1 == 0 {
        return Ok((Some(send), recv));
    }
    let device = recv.2;
    let r = resolve_addrs(coll, rank, send.0, recv.0)?;
    if r.send.is_some() {
        return Ok((Some(send), recv));
    }
    let (base, len) = r.recv;
    let (lo, hi) = (send.0.min(recv.0), (send.0 + send.1).max(recv.0 + recv.1));
    if base < lo || base + len > hi {
        return Err(Error::invalid(format!(
            "rank {rank}: {}: in place, the buffer needs {len} bytes from address {base:#x}, \
             past the {} and {} bytes given",
            coll.kind.name(),
            send.1,
            recv.1
        )));
    }
    Ok((None, (base, len, device)))
}

/// The launch `ops` describe, for `comm`'s rank.
pub fn parse(ops: &[Bound<'_, PyTuple>], comm: &Communicator) -> PyResult<Vec<Op>> {
    let (rank, nranks) = (comm.rank(), comm.size());
    let mut out = Vec::with_capacity(ops.len());
    for t in ops {
        let tag: String = t.get_item(0)?.extract()?;
        match tag.as_str() {
            "coll" => {
                #[allow(clippy::type_complexity)]
                let (_, kind, send, recv, count, dtype, op, scalar, root): (
                    String,
                    String,
                    Option<Span>,
                    Span,
                    usize,
                    String,
                    String,
                    f64,
                    i64,
                ) = t.extract()?;
                let root = rank_arg(root, format_args!("{kind}: root"), rank, nranks).py()?;
                let (kind, dtype, op) = names(&kind, &dtype, &op, scalar).py()?;
                out.push(Coll { kind, send, recv, count, dtype, op, root }.op(rank, nranks).py()?);
            }
            "send" | "recv" => {
                let (_, buf, peer, dt): (String, Span, i64, String) = t.extract()?;
                let peer = rank_arg(peer, format_args!("{tag}: peer"), rank, nranks).py()?;
                let dtype = dtype(&dt).py()?;
                out.push(if tag == "send" {
                    Op::send(buffer(buf, false), dtype, peer)
                } else {
                    Op::recv(buffer(buf, true), dtype, peer)
                });
            }
            "all_to_allv" => {
                #[allow(clippy::type_complexity)]
                let (_, send, sc, sd, recv, rc, rd, dt): (
                    String,
                    Span,
                    Vec<usize>,
                    Vec<usize>,
                    Span,
                    Vec<usize>,
                    Vec<usize>,
                    String,
                ) = t.extract()?;
                let s = (buffer(send, false), Blocks { counts: &sc, displs: &sd });
                let r = (buffer(recv, true), Blocks { counts: &rc, displs: &rd });
                out.extend(comm.all_to_allv_ops(s, r, dtype(&dt).py()?).py()?);
            }
            other => {
                return Err(crate::errors::to_py(Error::Internal(format!("unknown operation tag {other:?}"))));
            }
        }
    }
    Ok(out)
}
