//! One-sided steps: `put`, `get`, `get_reduce` on peers' registered
//! buffers, and `signal`/`wait`.
//!
//! The ordering the verifier assumes holds: a step completes only when
//! its data is in place (a put is visible at the peer, a get's data has
//! landed), and a signal leaves after everything before it on its channel
//! completed, so whoever waits for it sees those accesses. A get-reduce
//! reduces straight from the peer's memory where the provider gives a view
//! (ranks of one process); elsewhere it lands the peer's bytes in a small
//! staging buffer (a cache-sized piece at a time) and reduces from there.

use super::sig::Expect;
use super::{Lane, Task};
use crate::buf::{self, Operand, Owned, Region};
use oxccl_algo::ir::{Buf, Slice, Step};
use oxccl_core::{Error, Result};
use oxccl_transport::fabric::Fabric;
use oxccl_transport::provider::MemDesc;

/// Bytes a get-reduce lands at once: small enough to stay in cache
/// between the copy and the reduction.
const STAGE: usize = 256 << 10;

/// The descriptor of `peer`'s buffer `buf` for this task, once the peer's
/// exposure has arrived (`None` until then).
fn remote(fabric: &mut Fabric, task: &mut Task, peer: usize, buf: Buf) -> Result<Option<MemDesc>> {
    let i = match buf {
        Buf::Input => 0,
        Buf::Output => 1,
        Buf::Scratch => 2,
    };
    if let Some(d) = task.remote.get(&peer) {
        return Ok(Some(d[i]));
    }
    let Some(oxccl_transport::control::Exposed { descs, tag, count }) = fabric.exposed(peer)? else {
        return Ok(None);
    };
    Expect { sig: task.sig, count: task.count, me: fabric.rank() }.exposure(tag, count, peer)?;
    if descs.len() != 3 {
        return Err(Error::Remote(format!(
            "rank {peer} exposed {} buffers where 3 (input, output, scratch) were expected: the ranks run \
             different operations",
            descs.len()
        )));
    }
    let d = descs[i];
    task.remote.insert(peer, descs);
    Ok(Some(d))
}

/// Byte offset and length of a slice of elements of `es` bytes.
fn bytes(s: &Slice, es: usize) -> Result<(usize, usize)> {
    match (s.off.checked_mul(es), s.len.checked_mul(es)) {
        (Some(o), Some(l)) => Ok((o, l)),
        _ => Err(Error::Internal(format!("slice {s} overflows"))),
    }
}

/// Waits for the lane's operation in flight; true when it is done (or
/// there is none).
fn settle(fabric: &mut Fabric, lane: &mut Lane) -> Result<bool> {
    match lane.op {
        None => Ok(true),
        Some(op) => {
            let done = fabric.test(op)?;
            if done {
                lane.op = None;
            }
            Ok(done)
        }
    }
}

/// One one-sided step's progress: (moved anything, step complete).
pub(super) fn advance(fabric: &mut Fabric, task: &mut Task, li: usize, step: &Step) -> Result<(bool, bool)> {
    let es = task.dtype.size();
    let wire = task.lanes[li].wire;
    let x = Expect { sig: task.sig, count: task.count, me: fabric.rank() };
    match step {
        Step::Signal { peer } => {
            fabric.signal(*peer, wire, x.own())?;
            Ok((true, true))
        }
        Step::Wait { peer } => match fabric.take_signal(*peer, wire)? {
            Some(tag) => x.tag(tag, *peer).map(|()| (true, true)),
            None => Ok((false, false)),
        },
        Step::Put { peer, src, dst } => {
            let Some(desc) = remote(fabric, task, *peer, dst.buf)? else { return Ok((false, false)) };
            let lane = &mut task.lanes[li];
            if !lane.begun {
                let (off, _) = bytes(dst, es)?;
                lane.op = Some(fabric.write(*peer, task.bufs.region(src, es)?, &desc, off)?);
                lane.begun = true;
            }
            let done = settle(fabric, lane)?;
            Ok((done, done))
        }
        Step::Get { peer, src, dst } => {
            let Some(desc) = remote(fabric, task, *peer, src.buf)? else { return Ok((false, false)) };
            let lane = &mut task.lanes[li];
            if !lane.begun {
                let (off, _) = bytes(src, es)?;
                lane.op = Some(fabric.read(*peer, &desc, off, task.bufs.region(dst, es)?)?);
                lane.begun = true;
            }
            let done = settle(fabric, lane)?;
            Ok((done, done))
        }
        Step::GetReduce { peer, src, acc, dst } => {
            let Some(desc) = remote(fabric, task, *peer, src.buf)? else { return Ok((false, false)) };
            let (off, len) = bytes(src, es)?;
            let (dtype, op) = (task.dtype, task.op);
            let (acc, dst) = (task.bufs.region(acc, es)?, task.bufs.region(dst, es)?);
            let lane = &mut task.lanes[li];
            if !lane.begun {
                lane.begun = true;
                let mut reduce =
                    |view: &Region| buf::reduce(dtype, op, &dst, Operand::Region(acc), Operand::Region(*view));
                if fabric.with_view(*peer, &desc, off, len, &mut reduce)? {
                    return Ok((true, true));
                }
            }
            get_reduce_staged(fabric, lane, (*peer, &desc, off, len), (dtype, op), acc, dst)
        }
        _ => Err(Error::Internal(format!("two-sided step ({step}) among the one-sided ones"))),
    }
}

/// A get-reduce through a staging buffer, one piece at a time: the piece
/// in flight is `lane.op`, `lane.got` bytes are reduced.
fn get_reduce_staged(
    fabric: &mut Fabric,
    lane: &mut Lane,
    (peer, desc, off, len): (usize, &MemDesc, usize, usize),
    (dtype, op): (oxccl_core::DataType, oxccl_core::ReduceOp),
    acc: Region,
    dst: Region,
) -> Result<(bool, bool)> {
    let mut moved = false;
    loop {
        if lane.got == len {
            return Ok((true, true));
        }
        let n = (len - lane.got).min(STAGE);
        if lane.stage.as_ref().is_none_or(|s| s.len() < n) {
            lane.stage = Some(Owned::zeroed(STAGE.min(len)));
        }
        let stage = lane.stage.as_mut().expect("made").region().sub(0, n)?;
        if lane.op.is_none() {
            lane.op = Some(fabric.read(peer, desc, off + lane.got, stage)?);
        }
        if !settle(fabric, lane)? {
            return Ok((moved, false));
        }
        let at = lane.got;
        buf::reduce(dtype, op, &dst.sub(at, n)?, Operand::Region(acc.sub(at, n)?), Operand::Region(stage))?;
        lane.got += n;
        moved = true;
    }
}
