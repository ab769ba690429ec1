//! The executor: runs one rank's part of a program over the fabric's
//! connections, without ever blocking.
//!
//! A [`Task`] is one operation (a collective, or one send or receive of a
//! group) with its buffers; its [`Lane`]s are the program's channels,
//! stepped concurrently. A step that moves data advances piece by piece as
//! bytes arrive and room frees up: an incoming piece is read in place, its
//! result written straight into the outgoing room (receive-reduce-send in
//! one pass over the data, as NCCL's primitives do), so every chunk of a
//! pipelined program is in flight as soon as its data is there.
//!
//! Messages are matched by (peer, wire channel) in posting order. Lanes of
//! a collective have channels of their own; point-to-point lanes share
//! [`P2P_CHANNEL`], so they take turns per peer in the order they were
//! issued.

use crate::buf::{self, Operand, Owned, Region};
use oxccl_algo::algos::Algorithm;
use oxccl_algo::ir::{Buf, Slice, Step};
use oxccl_core::{DataType, Error, ReduceOp, Result};
use oxccl_transport::fabric::Fabric;
use oxccl_transport::{Channel, P2P_CHANNEL, Piece, Sender};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// A task's three buffers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bufs {
    pub input: Region,
    pub output: Region,
    pub scratch: Region,
}

impl Bufs {
    fn region(&self, s: &Slice, es: usize) -> Result<Region> {
        let r = match s.buf {
            Buf::Input => &self.input,
            Buf::Output => &self.output,
            Buf::Scratch => &self.scratch,
        };
        let off = s.off.checked_mul(es);
        let len = s.len.checked_mul(es);
        match (off, len) {
            (Some(off), Some(len)) => r.sub(off, len),
            _ => Err(Error::Internal(format!("slice {s} overflows"))),
        }
    }
}

/// One sequence of steps.
pub(crate) struct Lane {
    steps: Arc<Vec<Step>>,
    wire: Channel,
    pc: usize,
    /// Bytes of the current step received / sent so far.
    got: usize,
    put: usize,
    begun: bool,
    /// Sends the lane moved past before they finished (see [`MAX_DEFERRED`]).
    deferred: Vec<Deferred>,
}

/// A plain send still draining into its connection while the lane goes on.
struct Deferred {
    peer: usize,
    src: Region,
    put: usize,
    /// The rest of the message, copied aside when a later step overwrote
    /// its source (`src` then points here).
    _copy: Option<Owned>,
}

/// How many unfinished sends a lane may leave behind.
///
/// Programs are verified with two message slots per connection, but a
/// connection's FIFO holds bytes, not messages: an unchunked message
/// (recursive halving/doubling, pairwise all-to-all) can be bigger than the
/// FIFO, and two ranks that each send such a message before receiving the
/// other's would wait for each other forever. So a lane does not wait for a
/// plain send to drain: it goes on with the next steps, as long as they do
/// not send on the same connection (messages stay in order); a step that
/// writes what is still to be sent first copies that rest aside. The lane
/// ends only when every send has drained, and the data sent is what
/// sequential execution sends.
const MAX_DEFERRED: usize = 8;

impl Lane {
    pub fn new(steps: Arc<Vec<Step>>, wire: Channel) -> Lane {
        Lane { steps, wire, pc: 0, got: 0, put: 0, begun: false, deferred: Vec::new() }
    }
    fn done(&self) -> bool {
        self.pc >= self.steps.len() && self.deferred.is_empty()
    }
}

/// Where a step writes, if anywhere.
fn written(step: &Step) -> Option<&Slice> {
    match step {
        Step::Recv { dst, .. }
        | Step::RecvReduce { dst, .. }
        | Step::RecvCopySend { dst, .. }
        | Step::RecvReduceCopySend { dst, .. }
        | Step::Copy { dst, .. }
        | Step::Reduce { dst, .. } => Some(dst),
        _ => None,
    }
}

/// Copies `src[*put..]` into the connection as far as room allows, whole
/// elements at a time; true if anything moved.
fn pump(s: &mut dyn Sender, src: &Region, put: &mut usize, es: usize) -> Result<bool> {
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

/// Drains a lane's deferred sends as far as room allows.
fn drain(fabric: &mut Fabric, lane: &mut Lane, es: usize) -> Result<bool> {
    let mut moved = false;
    for d in &mut lane.deferred {
        moved |= pump(fabric.sender(d.peer, lane.wire)?, &d.src, &mut d.put, es)?;
    }
    lane.deferred.retain(|d| d.put < d.src.len());
    Ok(moved)
}

/// Whether `step` must wait for the lane's deferred sends: a send on the
/// same connection must (messages stay in order). A step that writes what
/// a deferred send has yet to send need not: the rest of that send is
/// copied aside first, so the message carries what the buffer held when
/// the send step ran (two ranks that each send a message bigger than the
/// FIFO and then overwrite it would otherwise wait for each other).
fn blocked_by_deferred(lane: &mut Lane, step: &Step, bufs: &Bufs, es: usize) -> Result<bool> {
    if lane.deferred.is_empty() {
        return Ok(false);
    }
    if let Some(p) = step.send_peer()
        && lane.deferred.iter().any(|d| d.peer == p)
    {
        return Ok(true);
    }
    if let Some(w) = written(step) {
        let w = bufs.region(w, es)?;
        for d in lane.deferred.iter_mut().filter(|d| d.src.overlaps(&w)) {
            let rest = d.src.sub(d.put, d.src.len() - d.put)?;
            let mut copy = Owned::zeroed(rest.len());
            let to = copy.region();
            buf::copy(&to, &rest)?;
            *d = Deferred { peer: d.peer, src: to, put: 0, _copy: Some(copy) };
        }
    }
    Ok(false)
}

/// What a task or a job is, for messages ("all_reduce #12 (ring)", "p2p
/// #13 send to 2"); formatted only when a message needs it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Label {
    pub what: &'static str,
    pub seq: u64,
    pub algo: Option<Algorithm>,
    /// A point-to-point task's direction (true: send) and peer.
    pub p2p: Option<(bool, usize)>,
}

impl Label {
    pub fn new(what: &'static str, seq: u64) -> Label {
        Label { what, seq, algo: None, p2p: None }
    }
}

impl std::fmt::Display for Label {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} #{}", self.what, self.seq)?;
        if let Some(a) = self.algo {
            write!(f, " ({a})")?;
        }
        match self.p2p {
            Some((true, p)) => write!(f, " send to {p}"),
            Some((false, p)) => write!(f, " recv from {p}"),
            None => Ok(()),
        }
    }
}

/// One operation's lanes and buffers.
pub(crate) struct Task {
    pub lanes: Vec<Lane>,
    pub bufs: Bufs,
    pub dtype: DataType,
    /// The kernel's operator (Avg and PreMulSum reduce as Sum).
    pub op: ReduceOp,
    /// What the task is, for messages.
    pub label: Label,
}

/// The point-to-point turn book: which lane may use (direction, peer)
/// on [`P2P_CHANNEL`] next.
#[derive(Default)]
pub(crate) struct Turns {
    queues: HashMap<(bool, usize), VecDeque<(usize, usize)>>,
}

impl Turns {
    /// Books every p2p step of `tasks` in issue order.
    pub fn book(tasks: &[Task]) -> Turns {
        let mut t = Turns::default();
        for (ti, task) in tasks.iter().enumerate() {
            for (li, lane) in task.lanes.iter().enumerate() {
                if lane.wire != P2P_CHANNEL {
                    continue;
                }
                for s in lane.steps.iter() {
                    if let Some(p) = s.send_peer() {
                        t.queues.entry((true, p)).or_default().push_back((ti, li));
                    }
                    if let Some(p) = s.recv_peer() {
                        t.queues.entry((false, p)).or_default().push_back((ti, li));
                    }
                }
            }
        }
        t
    }

    fn my_turn(&self, key: (bool, usize), who: (usize, usize)) -> bool {
        self.queues.get(&key).and_then(VecDeque::front).is_none_or(|&f| f == who)
    }

    fn done(&mut self, key: (bool, usize), who: (usize, usize)) {
        if let Some(q) = self.queues.get_mut(&key)
            && q.front() == Some(&who)
        {
            q.pop_front();
        }
    }
}

/// Advances every lane of `tasks` as far as it can go; true if anything
/// moved. Errors name the task, lane, step and peer.
pub(crate) fn poll(fabric: &mut Fabric, tasks: &mut [Task], turns: &mut Turns) -> Result<bool> {
    let mut moved = false;
    for (ti, task) in tasks.iter_mut().enumerate() {
        for li in 0..task.lanes.len() {
            let es = task.dtype.size();
            moved |= drain(fabric, &mut task.lanes[li], es)
                .map_err(|e| annotate(e, &format!("{}: channel {li}, a deferred send", task.label)))?;
            loop {
                let lane = &mut task.lanes[li];
                if lane.pc >= lane.steps.len() {
                    break;
                }
                let step = lane.steps[lane.pc].clone();
                if blocked_by_deferred(lane, &step, &task.bufs, es)? {
                    break;
                }
                if lane.wire == P2P_CHANNEL {
                    let who = (ti, li);
                    let send_ok = step.send_peer().is_none_or(|p| turns.my_turn((true, p), who));
                    let recv_ok = step.recv_peer().is_none_or(|p| turns.my_turn((false, p), who));
                    if !(send_ok && recv_ok) {
                        break;
                    }
                }
                let (progressed, finished) = advance(fabric, task, li, &step).map_err(|e| {
                    let where_ = format!("{}: channel {} step {} ({step})", task.label, li, task.lanes[li].pc);
                    annotate(e, &where_)
                })?;
                moved |= progressed;
                let lane = &mut task.lanes[li];
                if !finished {
                    if let Step::Send { peer, src } = &step
                        && lane.wire != P2P_CHANNEL
                        && lane.begun
                        && lane.deferred.len() < MAX_DEFERRED
                    {
                        let src = task.bufs.region(src, es)?;
                        lane.deferred.push(Deferred { peer: *peer, src, put: lane.put, _copy: None });
                    } else {
                        break;
                    }
                }
                if lane.wire == P2P_CHANNEL {
                    if let Some(p) = step.send_peer() {
                        turns.done((true, p), (ti, li));
                    }
                    if let Some(p) = step.recv_peer() {
                        turns.done((false, p), (ti, li));
                    }
                }
                lane.pc += 1;
                lane.got = 0;
                lane.put = 0;
                lane.begun = false;
                moved = true;
            }
        }
    }
    Ok(moved)
}

/// Whether every lane of every task has run its last step.
pub(crate) fn finished(tasks: &[Task]) -> bool {
    tasks.iter().all(|t| t.lanes.iter().all(Lane::done))
}

/// What the lanes of `tasks` are waiting for, for timeout messages.
pub(crate) fn waiting_for(tasks: &[Task]) -> String {
    let mut out = Vec::new();
    for t in tasks {
        for (li, lane) in t.lanes.iter().enumerate() {
            if let Some(step) = lane.steps.get(lane.pc) {
                let what = match (step.recv_peer(), step.send_peer()) {
                    (Some(p), _) if lane.got < step.wire_elems() || step.wire_elems() == 0 => {
                        format!("data from rank {p}")
                    }
                    (_, Some(p)) => format!("room to send to rank {p}"),
                    _ => "a local step".to_string(),
                };
                out.push(format!("{} channel {li} step {} ({step}) waits for {what}", t.label, lane.pc));
            }
        }
    }
    out.truncate(4);
    out.join("; ")
}

fn annotate(e: Error, where_: &str) -> Error {
    match e {
        Error::Remote(m) => Error::Remote(format!("{where_}: {m}")),
        Error::Timeout(m) => Error::Timeout(format!("{where_}: {m}")),
        Error::System(m) => Error::System(format!("{where_}: {m}")),
        Error::Internal(m) => Error::Internal(format!("{where_}: {m}")),
        other => other,
    }
}

/// Checks a piece against what the step expects; the usable length in
/// whole elements.
fn usable(piece: &Piece<'_>, expect: usize, got: usize, es: usize, peer: usize) -> Result<usize> {
    if piece.msg_len != expect {
        return Err(Error::Remote(format!(
            "rank {peer} sent a message of {} bytes where {expect} were expected: the ranks are running different \
             operations (set OXCCL_CHECK=1 to find the rank that differs)",
            piece.msg_len
        )));
    }
    if piece.offset != got {
        return Err(Error::Internal(format!("piece at byte {} of a message, expected {got}", piece.offset)));
    }
    Ok(piece.data.len() / es * es)
}

/// One step's progress: (moved anything, step complete).
fn advance(fabric: &mut Fabric, task: &mut Task, li: usize, step: &Step) -> Result<(bool, bool)> {
    let es = task.dtype.size();
    let (bufs, dtype, op) = (task.bufs, task.dtype, task.op);
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
                s.begin(src.len())?;
                lane.begun = true;
            }
            let moved = pump(s, &src, &mut lane.put, es)?;
            Ok((moved, lane.put == src.len()))
        }
        Step::Recv { peer, dst } | Step::RecvReduce { peer, dst, .. } => {
            let d = reg(dst)?;
            let local = match step {
                Step::RecvReduce { src, .. } => Some(reg(src)?),
                _ => None,
            };
            let r = fabric.receiver(*peer, wire)?;
            let mut moved = false;
            while let Some(piece) = r.peek()? {
                let n = usable(&piece, d.len(), lane.got, es, *peer)?;
                if d.is_empty() {
                    r.consume(0)?;
                    return Ok((true, true));
                }
                if n == 0 {
                    break;
                }
                let out = d.sub(lane.got, n)?;
                match local {
                    None => out.write(|o| o.copy_from_slice(&piece.data[..n]))?,
                    Some(l) => buf::reduce(
                        dtype,
                        op,
                        &out,
                        Operand::Region(l.sub(lane.got, n)?),
                        Operand::Bytes(&piece.data[..n]),
                    )?,
                }
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
            forward(fabric, lane, (*recv, *send, wire), l.len(), es, |off, piece, room| {
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
            forward(fabric, lane, (*recv, *send, wire), d.len(), es, |off, piece, room| {
                room.copy_from_slice(piece);
                buf::write_at(&d, off, piece)
            })
        }
        Step::RecvReduceCopySend { recv, send, src, dst } => {
            let (l, d) = (reg(src)?, reg(dst)?);
            forward(fabric, lane, (*recv, *send, wire), d.len(), es, |off, piece, room| {
                let out = d.sub(off, piece.len())?;
                buf::reduce(dtype, op, &out, Operand::Region(l.sub(off, piece.len())?), Operand::Bytes(piece))?;
                out.read(|o| room.copy_from_slice(o));
                Ok(())
            })
        }
        Step::Put { .. } | Step::Get { .. } | Step::GetReduce { .. } | Step::Signal { .. } | Step::Wait { .. } => {
            Err(Error::Unavailable(format!(
                "one-sided step ({step}): the host transports run two-sided programs only; pick another algorithm"
            )))
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
    len: usize,
    es: usize,
    mut f: impl FnMut(usize, &[u8], &mut [u8]) -> Result<()>,
) -> Result<(bool, bool)> {
    let (r, s) = fabric.pair(from, to, wire)?;
    if !lane.begun {
        s.begin(len)?;
        lane.begun = true;
    }
    let mut moved = false;
    while let Some(piece) = r.peek()? {
        let n = usable(&piece, len, lane.got, es, from)?;
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
