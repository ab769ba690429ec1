//! The operation descriptor: one collective, send or receive on host or
//! device buffers, the unit of every launch ([`Communicator::launch`]).
//!
//! Every entry point makes operations: the typed Rust methods and
//! [`Group`](crate::Group), the C ABI's calls and groups, the Python
//! package. A collective is checked when it is made ([`Op::collective`]:
//! counts, root, operator, buffer lengths and NCCL's in-place layouts,
//! memory kinds, alignment of device buffers); what needs the communicator
//! (peers in range, the device's allocations, streams) is checked by the
//! launch, before anything runs. An error names the rank, the operation and
//! the buffer, and changes nothing.
//!
//! [`Communicator::launch`]: crate::Communicator::launch

use crate::buf::{Buffer, Memory, Span};
use crate::call::{Call, Spec};
use oxccl_core::{DataType, Error, Result};

/// One send or receive: `buf` holds whole elements of `dtype` (the bytes
/// move as they are; the type is for the checks).
#[derive(Clone, Copy, Debug)]
pub struct P2p {
    /// The other rank (this rank itself is allowed: its sends land in its
    /// receives from itself, in order).
    pub peer: usize,
    /// What is sent, or where it lands.
    pub buf: Buffer,
    /// Element type.
    pub dtype: DataType,
}

/// One operation of a launch.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    /// A collective, checked by [`Op::collective`].
    Collective(Call<Buffer>),
    /// A send to `peer`.
    Send(P2p),
    /// A receive from `peer`.
    Recv(P2p),
}

impl Op {
    /// Checks a collective on `rank` of `nranks` (see [`Call::new`]): `send:
    /// None` is in place, with NCCL's in-place layout inside `recv`; both
    /// buffers must be in the same memory, device buffers aligned to their
    /// elements.
    pub fn collective(spec: Spec, send: Option<Buffer>, recv: Buffer, rank: usize, nranks: usize) -> Result<Op> {
        let name = spec.kind.name();
        if let Some(s) = send
            && s.memory() != recv.memory()
        {
            return Err(Error::invalid(format!(
                "rank {rank}: {name}: the send buffer is in {} memory and the receive buffer in {} memory; a \
                 collective's buffers are one kind",
                s.memory().name(),
                recv.memory().name()
            )));
        }
        let call = Call::new(spec, send, recv, rank, nranks)?;
        if recv.memory() == Memory::Device {
            let names = if send.is_some() { ["the send buffer", "the receive buffer"] } else { ["the buffer"; 2] };
            for (what, b) in names.into_iter().zip([call.input, call.output]) {
                check_aligned(b.addr(), b.len(), spec.dtype)
                    .map_err(|e| Error::invalid(format!("rank {rank}: {name}: {what}: {}", message(e))))?;
            }
        }
        Ok(Op::Collective(call))
    }

    /// A send of `buf` (whole `dtype` elements) to `peer`.
    pub fn send(buf: impl Into<Buffer>, dtype: DataType, peer: usize) -> Op {
        Op::Send(P2p { peer, buf: buf.into(), dtype })
    }

    /// A receive into `buf` from `peer`.
    pub fn recv(buf: impl Into<Buffer>, dtype: DataType, peer: usize) -> Op {
        Op::Recv(P2p { peer, buf: buf.into(), dtype })
    }

    /// Where its buffers are.
    pub fn memory(&self) -> Memory {
        match self {
            Op::Collective(c) => c.output.memory(),
            Op::Send(p) | Op::Recv(p) => p.buf.memory(),
        }
    }

    /// Its name in messages: the collective's, `send` or `recv`.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Collective(c) => c.kind.name(),
            Op::Send(_) => "send",
            Op::Recv(_) => "recv",
        }
    }

    /// The send or receive, with whether it sends.
    pub(crate) fn p2p(&self) -> Option<(bool, &P2p)> {
        match self {
            Op::Send(p) => Some((true, p)),
            Op::Recv(p) => Some((false, p)),
            Op::Collective(_) => None,
        }
    }

    /// What a launch checks of it on `rank` of `nranks` (`index`: its place
    /// in the launch, for messages): the collective was checked for this
    /// rank; a send or receive names a rank of the communicator and whole
    /// elements, aligned to them on a device.
    pub(crate) fn check(&self, index: usize, rank: usize, nranks: usize) -> Result<()> {
        let name = self.name();
        let at = |m: String| Error::invalid(format!("rank {rank}: {name} (operation {index} of the launch): {m}"));
        match self {
            Op::Collective(c) if (c.rank, c.nranks) != (rank, nranks) => Err(Error::InvalidUsage(format!(
                "rank {rank}: {name} (operation {index} of the launch) was checked for rank {} of {}, not for this \
                 communicator's rank {rank} of {nranks}",
                c.rank, c.nranks
            ))),
            Op::Collective(_) => Ok(()),
            Op::Send(p) | Op::Recv(p) => {
                if p.peer >= nranks {
                    return Err(at(format!("peer {} is out of range for {nranks} ranks", p.peer)));
                }
                if p.buf.len() % p.dtype.size() != 0 {
                    return Err(at(format!("a buffer of {} bytes is not whole {} elements", p.buf.len(), p.dtype)));
                }
                if let Buffer::Device(d) = p.buf {
                    check_aligned(d.addr(), d.len(), p.dtype).map_err(|e| at(message(e)))?;
                }
                Ok(())
            }
        }
    }
}

/// An error's message without its kind.
pub(crate) fn message(e: Error) -> String {
    match e {
        Error::InvalidArgument(m) | Error::InvalidUsage(m) => m,
        e => e.to_string(),
    }
}

/// An error unless a device buffer at `addr` is aligned to its element
/// size: kernels read elements at their natural alignment, and a
/// misaligned one faults, which poisons the whole CUDA context.
pub(crate) fn check_aligned(addr: u64, len: usize, dtype: DataType) -> Result<()> {
    let es = dtype.size() as u64;
    if len > 0 && !addr.is_multiple_of(es) {
        return Err(Error::invalid(format!(
            "address {addr:#x} is not a multiple of {es} bytes, the size of a {dtype} element (a kernel \
             would fault on it)"
        )));
    }
    Ok(())
}

/// How an all-to-all-v cuts one rank's buffer: `counts[j]` elements at
/// element `displs[j]` for rank `j`.
#[derive(Clone, Copy, Debug)]
pub struct Blocks<'a> {
    /// Elements per rank.
    pub counts: &'a [usize],
    /// Where each rank's block starts, in elements.
    pub displs: &'a [usize],
}

/// All-to-all with per-peer counts and displacements on `rank` of
/// `nranks`, as the sends and receives that make it (a launch runs them
/// as one group): `send`'s block `j` goes to rank `j`, whose receive
/// block for this rank must have the same count. The receive blocks must
/// not overlap; this rank's own block is a send to itself.
pub(crate) fn all_to_allv(
    (send, sb): (Buffer, Blocks<'_>),
    (recv, rb): (Buffer, Blocks<'_>),
    dtype: DataType,
    (rank, nranks): (usize, usize),
) -> Result<Vec<Op>> {
    let (n, me) = (nranks, rank);
    let err = |m: String| Error::invalid(format!("rank {me}: all_to_allv: {m}"));
    if send.memory() != recv.memory() {
        return Err(err(format!(
            "the send buffer is in {} memory and the receive buffer in {} memory",
            send.memory().name(),
            recv.memory().name()
        )));
    }
    for (name, v) in
        [("send_counts", sb.counts), ("send_displs", sb.displs), ("recv_counts", rb.counts), ("recv_displs", rb.displs)]
    {
        if v.len() != n {
            return Err(err(format!("{name} has {} entries for {n} ranks", v.len())));
        }
    }
    let es = dtype.size();
    let span = |what: &str, len: usize, c: usize, d: usize, j: usize| match c.checked_add(d) {
        Some(end) if end <= len => Ok(d..end),
        _ => Err(err(format!("{what} block for rank {j} ({c} elements at {d}) is outside the buffer of {len}"))),
    };
    let mut recvs = Vec::with_capacity(n);
    let mut sends = Vec::with_capacity(n);
    for j in 0..n {
        sends.push(span("send", send.len() / es, sb.counts[j], sb.displs[j], j)?);
        recvs.push(span("recv", recv.len() / es, rb.counts[j], rb.displs[j], j)?);
    }
    if sb.counts[me] != rb.counts[me] {
        return Err(err(format!("sends {} elements to itself but receives {}", sb.counts[me], rb.counts[me])));
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&j| recvs[j].start);
    for w in order.windows(2) {
        if recvs[w[0]].end > recvs[w[1]].start && !recvs[w[0]].is_empty() && !recvs[w[1]].is_empty() {
            return Err(err(format!("receive blocks of ranks {} and {} overlap", w[0], w[1])));
        }
    }
    let block = |b: &Buffer, r: &std::ops::Range<usize>| b.sub(r.start * es, (r.end - r.start) * es);
    // This rank's own block first (a copy), then rank me+k and me-k.
    let mut ops = vec![Op::send(block(&send, &sends[me])?, dtype, me), Op::recv(block(&recv, &recvs[me])?, dtype, me)];
    for k in 1..n {
        let (to, from) = ((me + k) % n, (me + n - k) % n);
        ops.push(Op::send(block(&send, &sends[to])?, dtype, to));
        ops.push(Op::recv(block(&recv, &recvs[from])?, dtype, from));
    }
    Ok(ops)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buf::{DeviceBuf, Region};
    use oxccl_algo::collective::CollKind;
    use oxccl_core::ReduceOp;

    #[test]
    fn a_collective_on_two_kinds_of_memory_is_refused() {
        let send = [0u8; 16];
        let e = Op::collective(
            Spec::new(CollKind::AllReduce, 4, DataType::Float32),
            Some(Buffer::Host(Region::of(&send))),
            Buffer::Device(DeviceBuf::new(0x1000, 16)),
            0,
            2,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("rank 0") && e.contains("all_reduce") && e.contains("host memory"), "{e}");
    }

    #[test]
    fn misaligned_device_buffers_are_named() {
        let spec = Spec::new(CollKind::AllReduce, 2, DataType::Float64).with_op(ReduceOp::Max);
        let e = Op::collective(spec, None, Buffer::Device(DeviceBuf::new(0x1004, 16)), 1, 2).unwrap_err().to_string();
        assert!(e.contains("rank 1") && e.contains("the buffer") && e.contains("0x1004"), "{e}");
        Op::collective(spec, None, Buffer::Device(DeviceBuf::new(0x1008, 16)), 1, 2).unwrap();
        check_aligned(0x1001, 0, DataType::Float64).unwrap();
        check_aligned(0x1001, 3, DataType::Uint8).unwrap();
        let e = check_aligned(0x1002, 8, DataType::Float32).unwrap_err().to_string();
        assert!(e.contains("0x1002") && e.contains("4 bytes") && e.contains("float element"), "{e}");
    }

    #[test]
    fn the_launch_checks_peers_elements_and_the_communicator() {
        let b = [0u8; 6];
        let ok = Op::send(Region::of(&b[..4]), DataType::Int32, 1);
        ok.check(0, 0, 2).unwrap();
        let e = Op::send(Region::of(&b[..4]), DataType::Int32, 2).check(3, 0, 2).unwrap_err().to_string();
        assert!(e.contains("rank 0") && e.contains("send (operation 3") && e.contains("peer 2"), "{e}");
        let e = Op::recv(Region::of(&b), DataType::Int32, 1).check(0, 1, 2).unwrap_err().to_string();
        assert!(e.contains("recv") && e.contains("6 bytes") && e.contains("int32"), "{e}");
        let e = Op::recv(DeviceBuf::new(0x1002, 4), DataType::Int32, 1).check(0, 1, 2).unwrap_err().to_string();
        assert!(e.contains("0x1002"), "{e}");
        let mut out = [0u8; 16];
        let c = Op::collective(
            Spec::new(CollKind::AllReduce, 4, DataType::Float32),
            None,
            Buffer::Host(Region::of_mut(&mut out)),
            1,
            4,
        )
        .unwrap();
        c.check(0, 1, 4).unwrap();
        let e = c.check(0, 0, 4).unwrap_err().to_string();
        assert!(e.contains("checked for rank 1 of 4"), "{e}");
    }

    #[test]
    fn all_to_allv_is_a_group_of_sends_and_receives() {
        let send = [0u8; 24];
        let mut recv = [0u8; 24];
        let (s, r) = (Buffer::Host(Region::of(&send)), Buffer::Host(Region::of_mut(&mut recv)));
        let counts = [1, 2, 3];
        let displs = [0, 1, 3];
        let b = Blocks { counts: &counts, displs: &displs };
        let ops = all_to_allv((s, b), (r, b), DataType::Float32, (1, 3)).unwrap();
        let seen: Vec<(&str, usize, usize)> = ops
            .iter()
            .map(|o| {
                let (_, p) = o.p2p().unwrap();
                (o.name(), p.peer, p.buf.len())
            })
            .collect();
        assert_eq!(
            seen,
            vec![("send", 1, 8), ("recv", 1, 8), ("send", 2, 12), ("recv", 0, 4), ("send", 0, 4), ("recv", 2, 12)]
        );
        let over = [0, 0, 3];
        let e = all_to_allv((s, b), (r, Blocks { counts: &counts, displs: &over }), DataType::Float32, (1, 3))
            .unwrap_err()
            .to_string();
        assert!(e.contains("ranks 0 and 1 overlap"), "{e}");
        let e = all_to_allv((s, Blocks { counts: &counts[..2], displs: &displs }), (r, b), DataType::Float32, (1, 3))
            .unwrap_err()
            .to_string();
        assert!(e.contains("send_counts has 2 entries for 3 ranks"), "{e}");
    }
}
