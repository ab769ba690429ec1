//! What Python hands over for one launch: a list of tuples of integers and
//! names, checked here into oxccl's [`RawOp`]s (an error changes nothing
//! and names the rank, the operation and the buffer).
//!
//! - `("coll", kind, send, recv, count, dtype, op, scalar, root)`: `send`
//!   is `None` (in place) or `(addr, nbytes)`, `recv` is `(addr, nbytes)`;
//!   a send buffer at NCCL's in-place position inside the receive buffer
//!   (or the reverse, for reduce-scatter) is in place too.
//! - `("send", (addr, nbytes), peer, dtype)`, `("recv", (addr, nbytes), peer, dtype)`.

use crate::errors::IntoPy;
use oxccl::call::resolve_addrs;
use oxccl::{Call, CollKind, DataType, Error, RawOp, ReduceOp, Region, Result};
use oxccl_algo::collective::Collective;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

/// An address and a length in bytes.
pub type Span = (usize, usize);

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

/// A host region of the caller's memory (empty ones need no address).
pub fn region((addr, len): Span, writable: bool) -> Region {
    if len == 0 {
        return Region::empty();
    }
    // SAFETY: the Python side holds a reference to the object that owns
    // these bytes (and, for buffer-protocol objects, an exported view that
    // pins them) until the launch has returned; the launch waits for its
    // end before returning.
    unsafe { Region::from_raw(addr as *mut u8, len, writable) }
}

/// A collective's kind, element type and reduction, from their names.
pub fn names(kind: &str, dtype_name: &str, op: &str, scalar: f64) -> Result<(CollKind, DataType, ReduceOp)> {
    Ok((kind.parse()?, dtype(dtype_name)?, reduce_op(op, scalar)?))
}

/// One collective's arguments, checked for `rank` of `nranks`.
#[allow(clippy::too_many_arguments)]
fn collective(
    kind: &str,
    send: Option<Span>,
    recv: Span,
    count: usize,
    dtype_name: &str,
    op: &str,
    scalar: f64,
    root: usize,
    rank: usize,
    nranks: usize,
) -> Result<Call<Region>> {
    let (kind, dt, op) = names(kind, dtype_name, op, scalar)?;
    let coll = Collective { kind, nranks, count, root, dtype: dt };
    let (send, recv) = match send {
        None => (None, recv),
        Some(s) => in_place(&coll, rank, s, recv)?,
    };
    Call::new(kind, count, dt, op, root, send.map(|s| region(s, false)), region(recv, true), rank, nranks)
}

/// `send` and `recv` as the call sees them: `(None, buffer)` when they are
/// NCCL's in-place layout of one buffer, else unchanged (oxccl checks the
/// lengths; overlaps in any other layout are refused).
fn in_place(coll: &Collective, rank: usize, send: Span, recv: Span) -> Result<(Option<Span>, Span)> {
    if send.1 == 0 || recv.1 == 0 {
        return Ok((Some(send), recv));
    }
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
    Ok((None, (base, len)))
}

/// The launch `ops` describe, for `rank` of `nranks`.
pub fn parse(ops: &[Bound<'_, PyTuple>], rank: usize, nranks: usize) -> PyResult<Vec<RawOp>> {
    let mut out = Vec::with_capacity(ops.len());
    for t in ops {
        let tag: String = t.get_item(0)?.extract()?;
        let op = match tag.as_str() {
            "coll" => {
                #[allow(clippy::type_complexity)]
                let (_, kind, send, recv, count, dt, op, scalar, root): (
                    String,
                    String,
                    Option<Span>,
                    Span,
                    usize,
                    String,
                    String,
                    f64,
                    usize,
                ) = t.extract()?;
                RawOp::Collective(collective(&kind, send, recv, count, &dt, &op, scalar, root, rank, nranks).py()?)
            }
            "send" | "recv" => {
                let (_, buf, peer, dt): (String, Span, usize, String) = t.extract()?;
                let dtype = dtype(&dt).py()?;
                if tag == "send" {
                    RawOp::Send { buf: region(buf, false), peer, dtype }
                } else {
                    RawOp::Recv { buf: region(buf, true), peer, dtype }
                }
            }
            other => {
                return Err(crate::errors::to_py(Error::Internal(format!("unknown operation tag {other:?}"))));
            }
        };
        out.push(op);
    }
    Ok(out)
}
