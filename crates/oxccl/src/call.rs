//! One call descriptor: what NCCL packs into `ncclInfo` before
//! `ncclEnqueueCheck`. Every collective is described once, checked once
//! here (an error names the rank, the operation and the buffer, and
//! changes nothing), and handed down as it is: to the host planner, into a
//! group, to the device path, and from the C ABI.

use crate::buf::Span;
use oxccl_algo::collective::{CollKind, Collective};
use oxccl_core::{DataType, Error, ReduceOp, Result};

/// What a collective computes, as NCCL's arguments say it, buffers apart:
/// the collective, NCCL's count (see [`Collective`]), the element type,
/// the reduction (ignored by collectives that do not reduce) and the root
/// (of rooted collectives; 0 otherwise).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spec {
    /// What is computed.
    pub kind: CollKind,
    /// NCCL's count.
    pub count: usize,
    /// Element type.
    pub dtype: DataType,
    /// Reduction.
    pub op: ReduceOp,
    /// Root of rooted collectives.
    pub root: usize,
}

impl Spec {
    /// `kind` of `count` elements of `dtype`, summing, rooted at 0.
    pub const fn new(kind: CollKind, count: usize, dtype: DataType) -> Spec {
        Spec { kind, count, dtype, op: ReduceOp::Sum, root: 0 }
    }

    /// The same with reduction `op`.
    pub const fn with_op(self, op: ReduceOp) -> Spec {
        Spec { op, ..self }
    }

    /// The same rooted at `root`.
    pub const fn with_root(self, root: usize) -> Spec {
        Spec { root, ..self }
    }

    /// What the algorithms see, on `nranks` ranks.
    pub const fn collective(&self, nranks: usize) -> Collective {
        Collective { kind: self.kind, nranks, count: self.count, root: self.root, dtype: self.dtype }
    }
}

/// One collective call on `B` buffers (host [`Region`](crate::buf::Region)s,
/// [`DeviceBuf`](crate::DeviceBuf)s or [`Buffer`](crate::Buffer)s), checked
/// and resolved to this rank's input and output. Only [`Call::new`] makes
/// one, so a `Call` is always a checked call.
#[derive(Clone, Copy, Debug)]
pub struct Call<B> {
    pub(crate) kind: CollKind,
    pub(crate) count: usize,
    pub(crate) dtype: DataType,
    pub(crate) op: ReduceOp,
    pub(crate) root: usize,
    pub(crate) rank: usize,
    pub(crate) nranks: usize,
    /// This rank's input: exactly `input_len` elements (empty where the
    /// rank has none).
    pub(crate) input: B,
    /// This rank's output: exactly `output_len` elements.
    pub(crate) output: B,
}

impl<B: Span> Call<B> {
    /// Checks `spec` on `rank` of `nranks` and resolves its buffers:
    /// `send: None` is in place (NCCL's in-place layout inside `recv`);
    /// buffers may be longer than the call needs. An error names the rank,
    /// the operation and the buffer.
    pub fn new(spec: Spec, send: Option<B>, recv: B, rank: usize, nranks: usize) -> Result<Call<B>> {
        let coll = spec.collective(nranks);
        let ((ia, il), (oa, ol)) = spans(&coll, spec.op, rank, send.map(|s| s.len()), recv.len())?;
        let input = send.unwrap_or(recv).sub(ia, il)?;
        let output = recv.sub(oa, ol)?;
        let Spec { kind, count, dtype, op, root } = spec;
        Ok(Call { kind, count, dtype, op, root, rank, nranks, input, output })
    }
}

impl<B> Call<B> {
    /// The same call on other buffers (a staged device call's host copy).
    pub(crate) fn with_buffers<C>(&self, input: C, output: C) -> Call<C> {
        Call {
            kind: self.kind,
            count: self.count,
            dtype: self.dtype,
            op: self.op,
            root: self.root,
            rank: self.rank,
            nranks: self.nranks,
            input,
            output,
        }
    }

    /// What it computes.
    pub fn spec(&self) -> Spec {
        Spec { kind: self.kind, count: self.count, dtype: self.dtype, op: self.op, root: self.root }
    }

    /// The rank it was checked for, and the number of ranks.
    pub fn ranks(&self) -> (usize, usize) {
        (self.rank, self.nranks)
    }

    /// This rank's input (empty where it has none).
    pub fn input(&self) -> &B {
        &self.input
    }

    /// This rank's output.
    pub fn output(&self) -> &B {
        &self.output
    }

    /// What the algorithms see.
    pub fn collective(&self) -> Collective {
        Collective { kind: self.kind, nranks: self.nranks, count: self.count, root: self.root, dtype: self.dtype }
    }

    /// Whether the call moves nothing (count 0 on every rank alike).
    pub fn is_empty(&self) -> bool
    where
        B: Span,
    {
        self.input.is_empty() && self.output.is_empty()
    }
}

/// Checks that a caller's buffer of `have` elements holds `need`.
pub(crate) fn check_len(what: &str, op: &str, rank: usize, have: usize, need: usize) -> Result<()> {
    if have < need {
        return Err(Error::invalid(format!(
            "rank {rank}: {op}: {what} holds {have} elements but the call needs {need}"
        )));
    }
    Ok(())
}

/// Where `rank`'s input and output of `coll` lie, as (offset, length) in
/// bytes: in the send and receive buffers of `send_len` and `recv_len`
/// bytes, or, in place (`send_len: None`), both in the receive buffer at
/// NCCL's in-place offsets. Checks the collective and the lengths first
/// (errors name the rank, the operation and the buffer), so the offsets
/// cannot overflow.
pub(crate) fn spans(
    coll: &Collective,
    op: ReduceOp,
    rank: usize,
    send_len: Option<usize>,
    recv_len: usize,
) -> Result<((usize, usize), (usize, usize))> {
    check_collective(coll, op, rank)?;
    let (es, name) = (coll.dtype.size(), coll.kind.name());
    let (ni, no) = (coll.input_len(rank), coll.output_len(rank));
    match send_len {
        Some(s) => {
            check_len("the send buffer", name, rank, s / es, ni)?;
            check_len("the receive buffer", name, rank, recv_len / es, no)?;
            Ok(((0, ni * es), (0, no * es)))
        }
        None => {
            let l = coll.in_place_layout(rank);
            check_len("the buffer", name, rank, recv_len / es, l.len)?;
            Ok(((l.input_at * es, ni * es), (l.output_at * es, no * es)))
        }
    }
}

/// Checks a collective's arguments on `rank`: rank count, root, op for
/// the type, sizes that fit in memory.
pub(crate) fn check_collective(coll: &Collective, op: ReduceOp, rank: usize) -> Result<()> {
    if coll.nranks == 0 || rank >= coll.nranks {
        return Err(Error::invalid(format!("rank {rank} is out of range for {} ranks", coll.nranks)));
    }
    coll.validate().map_err(|e| match e {
        Error::InvalidArgument(m) => Error::invalid(format!("rank {rank}: {m}")),
        other => other,
    })?;
    if coll.kind.reduces() {
        op.check(coll.dtype).map_err(|e| Error::invalid(format!("rank {rank}: {}: {e}", coll.kind)))?;
    }
    if coll.kind == CollKind::SendRecv {
        return Err(Error::invalid("sendrecv is not a call; use send and recv in a group"));
    }
    Ok(())
}

/// Where a call's input and output lie: `send: None` is in place inside
/// `recv`. Addresses and byte lengths.
#[derive(Debug, PartialEq, Eq)]
pub struct Resolved {
    /// The send buffer's address and length, `None` when in place.
    pub send: Option<(usize, usize)>,
    /// The receive buffer's address and length.
    pub recv: (usize, usize),
}

/// Resolves NCCL's buffers for `rank` of `coll`: lengths from the count,
/// NULL only where nothing is read or written, and NCCL's in-place layout
/// (e.g. all-gather's `sendbuff == recvbuff + rank × count`) recognised.
/// Overlapping buffers in any other layout are refused.
pub fn resolve_addrs(coll: &Collective, rank: usize, send: usize, recv: usize) -> Result<Resolved> {
    let es = coll.dtype.size();
    let bytes = |n: usize, what: &str| {
        n.checked_mul(es).filter(|b| *b <= isize::MAX as usize).ok_or_else(|| {
            Error::invalid(format!(
                "count {} of {}: the {what} buffer would exceed the address space",
                coll.count, coll.dtype
            ))
        })
    };
    let (ni, no) = (bytes(coll.input_len(rank), "send")?, bytes(coll.output_len(rank), "receive")?);
    let name = coll.kind.name();
    if ni > 0 && send == 0 {
        return Err(Error::invalid(format!("{name}: sendbuff is NULL but rank {rank} sends {ni} bytes")));
    }
    if no > 0 && recv == 0 {
        return Err(Error::invalid(format!("{name}: recvbuff is NULL but rank {rank} receives {no} bytes")));
    }
    if ni > 0 && no > 0 {
        let l = coll.in_place_layout(rank);
        let base = recv.checked_sub(l.output_at * es);
        if base.is_some_and(|b| b.checked_add(l.input_at * es) == Some(send)) {
            let base = base.expect("checked");
            return Ok(Resolved { send: None, recv: (base, bytes(l.len, "in-place")?) });
        }
        let overlap = send < recv.saturating_add(no) && recv < send.saturating_add(ni);
        if overlap {
            return Err(Error::invalid(format!(
                "{name}: sendbuff and recvbuff overlap, but not in NCCL's in-place layout \
                 (rank {rank}'s input at element {} of the output buffer)",
                l.input_at as isize - l.output_at as isize
            )));
        }
    }
    Ok(Resolved { send: Some((send, ni)), recv: (recv, no) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buf::Region;

    #[test]
    fn resolves_in_and_out_of_place_and_names_bad_buffers() {
        let send = [0u8; 16];
        let mut recv = [0u8; 64];
        let ag = |count| Spec::new(CollKind::AllGather, count, DataType::Float32);
        let c = Call::new(ag(4), Some(Region::of(&send)), Region::of_mut(&mut recv), 1, 4).unwrap();
        assert_eq!((c.input.len(), c.output.len()), (16, 64));
        let whole = Region::of_mut(&mut recv);
        let c = Call::new(ag(4), None, whole, 1, 4).unwrap();
        assert_eq!(c.input.addr(), whole.addr() + 16, "rank 1's block is its input");
        let e = Call::new(ag(5), None, whole, 1, 4).unwrap_err().to_string();
        assert!(e.contains("rank 1") && e.contains("all_gather") && e.contains("16 elements"), "{e}");
        let reduce = Spec::new(CollKind::Reduce, 1, DataType::Float32).with_root(4);
        let e = Call::new(reduce, None, whole, 1, 4).unwrap_err().to_string();
        assert!(e.contains("root"), "{e}");
    }

    #[test]
    fn in_place_layouts_are_recognised_and_other_overlaps_refused() {
        let ag = Collective { kind: CollKind::AllGather, nranks: 4, count: 10, root: 0, dtype: DataType::Float32 };
        // sendbuff = recvbuff + rank × count × 4 bytes.
        let r = resolve_addrs(&ag, 2, 0x1000 + 80, 0x1000).unwrap();
        assert_eq!(r, Resolved { send: None, recv: (0x1000, 160) });
        let e = resolve_addrs(&ag, 2, 0x1000, 0x1000).unwrap_err().to_string();
        assert!(e.contains("overlap") && e.contains("in-place"), "{e}");
        let rs = Collective { kind: CollKind::ReduceScatter, ..ag };
        // recvbuff = sendbuff + rank × recvcount × 4 bytes.
        let r = resolve_addrs(&rs, 3, 0x2000, 0x2000 + 120).unwrap();
        assert_eq!(r, Resolved { send: None, recv: (0x2000, 160) });
        let ar = Collective { kind: CollKind::AllReduce, ..ag };
        assert_eq!(resolve_addrs(&ar, 1, 0x10, 0x10).unwrap(), Resolved { send: None, recv: (0x10, 40) });
        assert_eq!(
            resolve_addrs(&ar, 1, 0x10, 0x1000).unwrap(),
            Resolved { send: Some((0x10, 40)), recv: (0x1000, 40) }
        );
        let e = resolve_addrs(&ar, 1, 0, 0x1000).unwrap_err().to_string();
        assert!(e.contains("sendbuff is NULL") && e.contains("rank 1"), "{e}");
        // A non-root's broadcast send buffer is never read: NULL is fine.
        let bc = Collective { kind: CollKind::Broadcast, ..ag };
        assert_eq!(resolve_addrs(&bc, 1, 0, 0x1000).unwrap().send, Some((0, 0)));
        let huge = Collective { count: usize::MAX / 2, ..ar };
        assert!(resolve_addrs(&huge, 0, 0x10, 0x1000).unwrap_err().to_string().contains("address space"));
    }
}
