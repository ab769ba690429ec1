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
//!
//! One-sided steps ([`one_sided`]) address peers' buffers: a task with
//! any registers its buffers when it starts and sends their descriptors
//! to the peers whose steps access them; it reads a peer's descriptors
//! when it first needs them; the registration ends with the task
//! ([`release`]), success or not.

mod one_sided;
pub(crate) mod sig;
mod two_sided;

use crate::buf::{self, Owned, Region};
use oxccl_algo::ir::{Buf, Slice, Step};
use oxccl_algo::scale::OneSidedPeers;
use oxccl_core::{DataType, Error, ReduceOp, Result};
use oxccl_transport::fabric::{Exposure, Fabric, OpId};
use oxccl_transport::provider::MemDesc;
use oxccl_transport::{Channel, P2P_CHANNEL};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use two_sided::pump;

/// A task's three buffers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bufs {
    pub input: Region,
    pub output: Region,
    pub scratch: Region,
}

impl Bufs {
    pub(super) fn region(&self, s: &Slice, es: usize) -> Result<Region> {
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
    /// The current one-sided step's operation in flight.
    op: Option<OpId>,
    /// Where a get-reduce lands the peer's bytes before reducing them.
    stage: Option<Owned>,
    /// The current send's token when it went straight from its source
    /// ([`Sender::send_from`](oxccl_transport::Sender::send_from)).
    token: Option<u64>,
}

/// A plain send still draining into its connection while the lane goes on.
struct Deferred {
    peer: usize,
    src: Region,
    put: usize,
    /// The rest of the message, copied aside when a later step overwrote
    /// its source (`src` then points here).
    _copy: Option<Owned>,
    /// Sent straight from `src`: done when the provider releases it.
    token: Option<u64>,
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

// The linear all-to-all's sends of one group are all in flight before its
// receives: none may wait for a receiver (which sends its own group first).
const _: () = assert!(MAX_DEFERRED >= oxccl_algo::algos::LINEAR_GROUP);

impl Lane {
    pub fn new(steps: Arc<Vec<Step>>, wire: Channel) -> Lane {
        Lane {
            steps,
            wire,
            pc: 0,
            got: 0,
            put: 0,
            begun: false,
            deferred: Vec::new(),
            op: None,
            stage: None,
            token: None,
        }
    }
    fn done(&self) -> bool {
        self.pc >= self.steps.len() && self.deferred.is_empty()
    }

    /// Back to its first step, as [`Lane::new`] left it (its staging
    /// storage kept).
    fn rearm(&mut self) {
        (self.pc, self.got, self.put, self.begun) = (0, 0, 0, false);
        self.deferred.clear();
        self.op = None;
        self.token = None;
    }
}

/// Where a step writes this rank's buffers, if anywhere (a put writes the
/// peer's).
fn written(step: &Step) -> Option<&Slice> {
    if let Step::Put { .. } = step { None } else { step.dst() }
}

/// Whether a step after the current one of `lane` writes bytes of `src`
/// (then a send from `src` cannot leave it as its source: the receiver
/// would read the later bytes).
fn rewritten_later(lane: &Lane, bufs: &Bufs, src: &Region, es: usize) -> Result<bool> {
    for step in &lane.steps[lane.pc + 1..] {
        if let Some(w) = written(step)
            && bufs.region(w, es)?.overlaps(src)
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Drains a lane's deferred sends as far as room allows.
fn drain(fabric: &mut Fabric, lane: &mut Lane, es: usize) -> Result<bool> {
    if lane.deferred.is_empty() {
        return Ok(false);
    }
    let mut moved = false;
    for d in &mut lane.deferred {
        let s = fabric.sender(d.peer, lane.wire)?;
        match d.token {
            Some(t) => {
                let (m, done) = s.progress_from(t)?;
                if done {
                    d.put = d.src.len();
                }
                moved |= m;
            }
            None => moved |= pump(s, &d.src, &mut d.put, es)?,
        }
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
        && lane.deferred.iter().any(|d| d.peer == p && d.token.is_none())
    {
        return Ok(true);
    }
    if let Some(w) = written(step) {
        let w = bufs.region(w, es)?;
        if lane.deferred.iter().any(|d| d.token.is_some() && d.src.overlaps(&w)) {
            return Ok(true);
        }
        for d in lane.deferred.iter_mut().filter(|d| d.src.overlaps(&w)) {
            let rest = d.src.sub(d.put, d.src.len() - d.put)?;
            let mut copy = Owned::zeroed(rest.len());
            let to = copy.region();
            buf::copy(&to, &rest)?;
            *d = Deferred { peer: d.peer, src: to, put: 0, _copy: Some(copy), token: None };
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
    pub algo: Option<crate::tuner::Choice>,
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
    /// One-sided programs: whose buffers are involved.
    pub peers: Option<Arc<OneSidedPeers>>,
    /// A collective's signature: its messages carry it, and what arrives
    /// must carry the same ([`sig`]).
    pub sig: Option<sig::Sig>,
    /// A collective's count: one-sided peers compare it with theirs.
    pub count: u64,
    started: bool,
    exposure: Option<Exposure>,
    /// Peers' buffer descriptors (input, output, scratch) for this task.
    remote: HashMap<usize, Vec<MemDesc>>,
}

impl Task {
    /// A task of `lanes` over `bufs`.
    pub fn new(
        lanes: Vec<Lane>,
        bufs: Bufs,
        dtype: DataType,
        op: ReduceOp,
        label: Label,
        peers: Option<Arc<OneSidedPeers>>,
    ) -> Task {
        let remote = HashMap::new();
        Task { lanes, bufs, dtype, op, label, peers, sig: None, count: 0, started: false, exposure: None, remote }
    }

    /// This task, a collective of `count` elements, its messages signed
    /// with `sig`.
    pub fn signed(self, sig: sig::Sig, count: usize) -> Task {
        Task { sig: Some(sig), count: count as u64, ..self }
    }

    /// The same task ready to run again from its first steps, as call
    /// number `seq` and collective number `coll_seq` (a replayed call:
    /// the last one ran to its end and was released).
    pub fn rearm(&mut self, seq: u64, coll_seq: u64) {
        self.label.seq = seq;
        self.sig = self.sig.map(|s| s.numbered(coll_seq));
        self.started = false;
        self.exposure = None;
        self.remote.clear();
        self.lanes.iter_mut().for_each(Lane::rearm);
    }

    /// Registers this rank's buffers for the peers that access them (once,
    /// when the task first runs).
    fn start(&mut self, fabric: &mut Fabric) -> Result<()> {
        if std::mem::replace(&mut self.started, true) {
            return Ok(());
        }
        // For a peer that finds this call's messages of another length
        // than its own, and asks what this rank runs.
        if let Some(s) = self.sig {
            fabric.publish(s.number(), &s.record(self.count));
        }
        if let Some(p) = &self.peers
            && !p.accessed_by.is_empty()
        {
            let b = &self.bufs;
            let tag = self.sig.map_or(0, |s| s.tag());
            self.exposure = Some(fabric.expose(&[b.input, b.output, b.scratch], &p.accessed_by, tag, self.count)?);
        }
        Ok(())
    }
}

/// Ends what `tasks` registered and started with the fabric: after this,
/// no peer touches their buffers and no one-sided operation writes them.
/// The engine calls it when a batch ends, whether it succeeded or not.
pub(crate) fn release(fabric: &mut Fabric, tasks: &mut [Task]) {
    for t in tasks {
        for lane in &mut t.lanes {
            if let Some(op) = lane.op.take() {
                fabric.forget(op);
            }
            // Sends that may still read their sources, a receive that may
            // still land in its destination (a failed call's).
            let mut senders: Vec<usize> =
                lane.deferred.drain(..).filter(|d| d.token.is_some()).map(|d| d.peer).collect();
            match lane.steps.get(lane.pc) {
                Some(Step::Send { peer, .. }) if lane.token.take().is_some() => senders.push(*peer),
                Some(Step::Recv { peer, .. }) if lane.begun => {
                    if let Ok(r) = fabric.receiver(*peer, lane.wire) {
                        r.abandon();
                    }
                }
                _ => {}
            }
            for p in senders {
                if let Ok(s) = fabric.sender(p, lane.wire) {
                    s.abandon();
                }
            }
        }
        if let Some(e) = t.exposure.take() {
            fabric.unexpose(e);
        }
    }
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
        task.start(fabric).map_err(|e| annotate(e, &format!("{}: registering its buffers", task.label)))?;
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
                let advance = if step.is_one_sided() { one_sided::advance } else { two_sided::advance };
                let (progressed, finished) = advance(fabric, task, li, &step).map_err(|e| {
                    let where_ = format!("{}: channel {} step {} ({step})", task.label, li, task.lanes[li].pc);
                    annotate(name_the_call(fabric, task, &step, e), &where_)
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
                        let (put, token) = (lane.put, lane.token.take());
                        lane.deferred.push(Deferred { peer: *peer, src, put, _copy: None, token });
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
                lane.token = None;
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

/// What the lanes of `tasks` are waiting for, and over what, for timeout
/// messages.
pub(crate) fn waiting_for(fabric: &Fabric, tasks: &[Task]) -> String {
    let mut out = Vec::new();
    for t in tasks {
        for (li, lane) in t.lanes.iter().enumerate() {
            if let Some(step) = lane.steps.get(lane.pc) {
                let what = match (step.recv_peer(), step.send_peer(), step) {
                    (_, _, Step::Wait { peer }) => format!("a signal from rank {peer}"),
                    (_, _, Step::Put { peer, .. } | Step::Get { peer, .. } | Step::GetReduce { peer, .. }) => {
                        match t.remote.contains_key(peer) {
                            false => format!("rank {peer}'s buffer descriptors (it has not started the call)"),
                            true => format!("one-sided access to rank {peer}'s buffers to complete"),
                        }
                    }
                    (Some(p), _, _) if lane.got < step.wire_elems() || step.wire_elems() == 0 => {
                        format!("data from rank {p} ({})", fabric.route(p, lane.wire, false))
                    }
                    (_, Some(p), _) => format!("room to send to rank {p} ({})", fabric.route(p, lane.wire, true)),
                    _ => "a local step".to_string(),
                };
                out.push(format!("{} channel {li} step {} ({step}) waits for {what}", t.label, lane.pc));
            }
        }
    }
    out.truncate(4);
    out.join("; ")
}

/// A call that has waited with nothing moving: asks each peer its lanes
/// wait on which call it runs under the same number, and fails naming
/// both ranks where the peer's disagrees. Ranks whose counts differ may
/// pick different algorithms, which then wait on each other without a
/// message of the wrong length to show it; a peer that has not reached
/// the call yet, or agrees, says nothing.
pub(crate) fn probe(fabric: &Fabric, tasks: &[Task]) -> Result<()> {
    for t in tasks {
        let Some(sig) = t.sig else { continue };
        let mut asked = Vec::new();
        for lane in &t.lanes {
            let Some(step) = lane.steps.get(lane.pc) else { continue };
            let peer = match step {
                Step::Wait { peer }
                | Step::Put { peer, .. }
                | Step::Get { peer, .. }
                | Step::GetReduce { peer, .. } => Some(*peer),
                _ => step.recv_peer().or(step.send_peer()),
            };
            let Some(peer) = peer.filter(|p| !asked.contains(p)) else { continue };
            asked.push(peer);
            let theirs = fabric.ask(peer, sig.number(), std::time::Duration::from_millis(500));
            if let Some((tag, count)) = theirs.and_then(|r| sig::Sig::read_record(&r)) {
                sig::Expect { sig: Some(sig), count: t.count, me: fabric.rank() }.exposure(tag, count, peer)?;
            }
        }
    }
    Ok(())
}

/// A misuse seen on a message (one of another length than this call's
/// step expects): the peer's call, asked for through the bootstrap, names
/// what differs (both ranks, both counts) where it can; otherwise `e`.
fn name_the_call(fabric: &Fabric, task: &Task, step: &Step, e: Error) -> Error {
    let (Error::InvalidUsage(_), Some(sig)) = (&e, task.sig) else { return e };
    let Some(peer) = step.recv_peer().or(step.send_peer()) else { return e };
    let theirs = fabric.ask(peer, sig.number(), std::time::Duration::from_secs(1));
    match theirs.and_then(|r| sig::Sig::read_record(&r)) {
        Some((tag, count)) => {
            let x = sig::Expect { sig: Some(sig), count: task.count, me: fabric.rank() };
            x.exposure(tag, count, peer).err().unwrap_or(e)
        }
        None => e,
    }
}

pub(crate) fn annotate(e: Error, where_: &str) -> Error {
    match e {
        Error::Remote(m) => Error::Remote(format!("{where_}: {m}")),
        Error::Timeout(m) => Error::Timeout(format!("{where_}: {m}")),
        Error::System(m) => Error::System(format!("{where_}: {m}")),
        Error::Internal(m) => Error::Internal(format!("{where_}: {m}")),
        other => other,
    }
}
