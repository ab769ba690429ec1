//! Two-sided steps: messages through the connections' FIFOs, read and
//! written in place piece by piece.

use super::sig::Expect;
use super::{Lane, Task, rewritten_later};
use crate::buf::{self, Operand, Region};
use oxccl_algo::ir::{Slice, Step};
use oxccl_core::{Error, Result};
use oxccl_transport::fabric::Fabric;
use oxccl_transport::{Channel, Piece, Sender};

/// Copies `src[*put..]` into the connection as far as room allows, whole
/// elements at a time; true if anything moved.
pub(super) fn pump(s: &mut dyn Sender, src: &Region, put: &mut usize, es: usize) -> Result<bool> {
    let mut moved = false;
    while *put < src.len() {
        let room = s.room(src.len() - *put)?;
        let n = room.len() / es * es;
        if n == 0 {
            break;
        }
        src.sub(*put, n)?.read(|b| room[..n].copy_from_slice(b));
        s.commit(n)?;
        *put += n;
        moved = true;
    }
    Ok(moved)
}

/// Checks a piece against what the step expects; the usable length in
/// whole elements.
fn usable(piece: &Piece<'_>, x: Expect, expect: usize, got: usize, es: usize, peer: usize) -> Result<usize> {
    x.tag(piece.tag, peer)?;
    if piece.msg_len != expect {
        return Err(Error::InvalidUsage(format!(
            "rank {peer}: {}",
            oxccl_transport::wrong_length(piece.msg_len, expect)
        )));
    }
    if piece.offset != got {
        return Err(Error::Internal(format!("piece at byte {} of a message, expected {got}", piece.offset)));
    }
    Ok(piece.data.len() / es * es)
}

/// One two-sided or local step's progress: (moved anything, step
/// complete).
pub(super) fn advance(fabric: &mut Fabric, task: &mut Task, li: usize, step: &Step) -> Result<(bool, bool)> {
    let es = task.dtype.size();
    let (bufs, dtype, op) = (task.bufs, task.dtype, task.op);
    let x = Expect { sig: task.sig, count: task.count, me: fabric.rank() };
    let tag = x.own();
    let lane = &mut task.lanes[li];
    let wire = lane.wire;
    let reg = |s: &Slice| bufs.region(s, es);
    match step {
        Step::Copy { src, dst } => {
            buf::copy(&reg(dst)?, &reg(src)?)?;
            Ok((true, true))
        }
        Step::Reduce { srcs, dst } => {
            let d = reg(dst)?;
            let first = reg(&srcs[0])?;
            if srcs.len() == 1 {
                buf::copy(&d, &first)?;
            } else {
                buf::reduce(dtype, op, &d, Operand::Region(first), Operand::Region(reg(&srcs[1])?))?;
                for s in &srcs[2..] {
                    buf::reduce(dtype, op, &d, Operand::Region(d), Operand::Region(reg(s)?))?;
                }
            }
            Ok((true, true))
        }
        Step::Send { peer, src } => {
            let src = reg(src)?;
            let s = fabric.sender(*peer, wire)?;
            if !lane.begun {
                // Large messages straight from their source where the
                // provider takes them and no later step rewrites it.
                if s.takes_from(src.len()) && !rewritten_later(lane, &bufs, &src, es)? {
                    lane.token = s.send_from(src, tag)?;
                }
                if lane.token.is_none() {
                    s.begin_tagged(src.len(), tag)?;
                }
                lane.begun = true;
            }
            if let Some(t) = lane.token {
                return s.progress_from(t);
            }
            let moved = pump(s, &src, &mut lane.put, es)?;
            Ok((moved, lane.put == src.len()))
        }
        Step::Recv { peer, dst } => {
            let d = reg(dst)?;
            let r = fabric.receiver(*peer, wire)?;
            if !lane.begun && x.sig.is_some() {
                // The signature first: a message of another call must not
                // land in this one's output.
                match r.next_tag()? {
                    Some(t) => x.tag(t, *peer)?,
                    None => return Ok((false, false)),
                }
            }
            let (moved, done) = r.recv_into(&d).map_err(|e| match e {
                Error::Remote(m) if !m.contains(&format!("rank {peer}")) => Error::Remote(format!("rank {peer}: {m}")),
                other => other,
            })?;
            lane.begun = true;
            Ok((moved, done))
        }
        Step::RecvReduce { peer, src, dst } => {
            let (d, l) = (reg(dst)?, reg(src)?);
            let r = fabric.receiver(*peer, wire)?;
            let mut moved = false;
            while let Some(piece) = r.peek()? {
                let n = usable(&piece, x, d.len(), lane.got, es, *peer)?;
                if d.is_empty() {
                    r.consume(0)?;
                    return Ok((true, true));
                }
                if n == 0 {
                    break;
                }
                let out = d.sub(lane.got, n)?;
                buf::reduce(dtype, op, &out, Operand::Region(l.sub(lane.got, n)?), Operand::Bytes(&piece.data[..n]))?;
                r.consume(n)?;
                lane.got += n;
                moved = true;
                if lane.got == d.len() {
                    return Ok((true, true));
                }
            }
            Ok((moved, false))
        }
        Step::RecvReduceSend { recv, send, src } => {
            let l = reg(src)?;
            forward(fabric, lane, (*recv, *send, wire), (x, tag), l.len(), es, |off, piece, room| {
                buf::reduce(
                    dtype,
                    op,
                    &Region::of_mut(room),
                    Operand::Region(l.sub(off, piece.len())?),
                    Operand::Bytes(piece),
                )
            })
        }
        Step::RecvCopySend { recv, send, dst } => {
            let d = reg(dst)?;
            forward(fabric, lane, (*recv, *send, wire), (x, tag), d.len(), es, |off, piece, room| {
                room.copy_from_slice(piece);
                buf::write_at(&d, off, piece)
            })
        }
        Step::RecvReduceCopySend { recv, send, src, dst } => {
            let (l, d) = (reg(src)?, reg(dst)?);
            forward(fabric, lane, (*recv, *send, wire), (x, tag), d.len(), es, |off, piece, room| {
                let out = d.sub(off, piece.len())?;
                buf::reduce(dtype, op, &out, Operand::Region(l.sub(off, piece.len())?), Operand::Bytes(piece))?;
                out.read(|o| room.copy_from_slice(o));
                Ok(())
            })
        }
        Step::Put { .. } | Step::Get { .. } | Step::GetReduce { .. } | Step::Signal { .. } | Step::Wait { .. } => {
            Err(Error::Internal(format!("one-sided step ({step}) among the two-sided ones")))
        }
    }
}

/// A receive-and-send step: for each arrived piece, `f(offset, piece,
/// room)` fills the outgoing room (of the piece's length) and stores what
/// the step stores.
fn forward(
    fabric: &mut Fabric,
    lane: &mut Lane,
    (from, to, wire): (usize, usize, Channel),
    (x, tag): (Expect, u64),
    len: usize,
    es: usize,
    mut f: impl FnMut(usize, &[u8], &mut [u8]) -> Result<()>,
) -> Result<(bool, bool)> {
    let (r, s) = fabric.pair(from, to, wire)?;
    if !lane.begun {
        s.begin_tagged(len, tag)?;
        lane.begun = true;
    }
    let mut moved = false;
    while let Some(piece) = r.peek()? {
        let n = usable(&piece, x, len, lane.got, es, from)?;
        if len == 0 {
            r.consume(0)?;
            return Ok((true, true));
        }
        let room = s.room(n)?;
        let m = room.len().min(n) / es * es;
        if m == 0 {
            break;
        }
        f(lane.got, &piece.data[..m], &mut room[..m])?;
        s.commit(m)?;
        r.consume(m)?;
        lane.got += m;
        lane.put += m;
        moved = true;
        if lane.got == len {
            return Ok((true, true));
        }
    }
    Ok((moved, false))
}
