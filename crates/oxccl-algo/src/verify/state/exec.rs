//! Executing one step.

use super::{Block, Machine, Msg, Rec};
use crate::ir::{Slice, Step};
use crate::verify::sym::{Clash, Piece, Site, combine, first_undef};
use oxccl_core::Result;

impl Machine<'_> {
    /// Runs (part of) process `pi`'s current step: `Ok(None)` when it made
    /// progress, `Ok(Some(block))` when it must wait.
    pub(super) fn exec(&mut self, pi: usize) -> Result<Option<Block>> {
        let (rank, chan) = self.procs[pi];
        let [inbound, outbound] = self.conn_of[pi][self.pc[pi]];
        if let Some((peer, data)) = self.pending[pi].take() {
            if self.conns[outbound].msgs.len() >= self.slots {
                self.pending[pi] = Some((peer, data));
                return Ok(Some(Block::Full(peer)));
            }
            let len: usize = data.iter().map(|p| p.len).sum();
            let clock = self.race.as_mut().map(|r| r.release(pi));
            self.conns[outbound].msgs.push_back(Msg { data, pc: self.pc[pi], clock });
            self.wake(peer, chan);
            self.sent[rank] += len as u64 * self.esize;
            self.messages += 1;
            self.advance(pi);
            return Ok(None);
        }
        let step = self.step_at(rank, chan, self.pc[pi]);
        let mut incoming = Vec::new();
        if let Some(peer) = step.recv_peer() {
            // A step that forwards needs the incoming message and room for
            // the outgoing one at once, as NCCL's primitives do.
            if let Some(to) = step.send_peer()
                && self.conns[outbound].msgs.len() >= self.slots
            {
                return Ok(Some(Block::Full(to)));
            }
            let Some(msg) = self.conns[inbound].msgs.pop_front() else {
                return Ok(Some(Block::Recv(peer)));
            };
            self.wake(peer, chan);
            let got: usize = msg.data.iter().map(|p| p.len).sum();
            let want = step.wire_elems();
            if got != want {
                let from = self.at(peer, chan, msg.pc);
                return Err(self.fail(pi, format!("expects {want} elements from rank {peer}, but the message it receives is {got} elements from {from}: lengths or order of sends and receives do not match")));
            }
            if let (Some(r), Some(c)) = (self.race.as_mut(), &msg.clock) {
                r.acquire(pi, c);
            }
            self.recv[rank] += got as u64 * self.esize;
            incoming = msg.data;
        }
        match step {
            Step::Send { peer, src } => {
                let d = self.load(pi, rank, src)?;
                self.pending[pi] = Some((*peer, d));
            }
            Step::Recv { dst, .. } => self.store(pi, dst, &incoming)?,
            Step::RecvReduce { src, dst, .. } => {
                let a = self.load(pi, rank, src)?;
                let v = self.reduce(pi, &a, &incoming, src, "the received data")?;
                self.store(pi, dst, &v)?;
            }
            Step::RecvReduceSend { send, src, .. } => {
                let a = self.load(pi, rank, src)?;
                let v = self.reduce(pi, &a, &incoming, src, "the received data")?;
                self.pending[pi] = Some((*send, v));
            }
            Step::RecvCopySend { send, dst, .. } => {
                self.store(pi, dst, &incoming)?;
                self.pending[pi] = Some((*send, incoming));
            }
            Step::RecvReduceCopySend { send, src, dst, .. } => {
                let a = self.load(pi, rank, src)?;
                let v = self.reduce(pi, &a, &incoming, src, "the received data")?;
                self.store(pi, dst, &v)?;
                self.pending[pi] = Some((*send, v));
            }
            Step::Copy { src, dst } => {
                let v = self.load(pi, rank, src)?;
                self.store(pi, dst, &v)?;
            }
            Step::Reduce { srcs, dst } => {
                let mut acc = self.load(pi, rank, &srcs[0])?;
                for s in &srcs[1..] {
                    let b = self.load(pi, rank, s)?;
                    acc = self.reduce(pi, &acc, &b, &srcs[0], &s.to_string())?;
                }
                self.store(pi, dst, &acc)?;
            }
            Step::Put { peer, src, dst } => {
                let v = self.load(pi, rank, src)?;
                self.store_to(pi, *peer, dst, &v)?;
                self.count_one_sided(rank, *peer, src.len);
            }
            Step::Get { peer, src, dst } => {
                let v = self.load(pi, *peer, src)?;
                self.store(pi, dst, &v)?;
                self.count_one_sided(*peer, rank, src.len);
            }
            Step::GetReduce { peer, src, acc, dst } => {
                let a = self.load(pi, rank, acc)?;
                let b = self.load(pi, *peer, src)?;
                let v = self.reduce(pi, &a, &b, acc, &format!("rank {peer}'s {src}"))?;
                self.store(pi, dst, &v)?;
                self.count_one_sided(*peer, rank, src.len);
            }
            Step::Signal { peer } => {
                let clock = self.race.as_mut().map(|r| r.release(pi));
                self.conns[outbound].sigs.push_back((self.pc[pi], clock));
                self.wake(*peer, chan);
            }
            Step::Wait { peer } => {
                let Some((_, clock)) = self.conns[inbound].sigs.pop_front() else {
                    return Ok(Some(Block::Signal(*peer)));
                };
                if let (Some(r), Some(c)) = (self.race.as_mut(), &clock) {
                    r.acquire(pi, c);
                }
            }
        }
        if self.pending[pi].is_none() {
            self.advance(pi);
        }
        Ok(None)
    }

    fn advance(&mut self, pi: usize) {
        self.pc[pi] += 1;
        self.steps += 1;
        self.blocked[pi] = None;
    }

    fn count_one_sided(&mut self, from: usize, to: usize, elems: usize) {
        self.sent[from] += elems as u64 * self.esize;
        self.recv[to] += elems as u64 * self.esize;
    }

    /// Reads `owner`'s slice on behalf of process `pi`; data never written
    /// is an error.
    fn load(&mut self, pi: usize, owner: usize, s: &Slice) -> Result<Vec<Piece>> {
        let (pb, off) = self.layout[owner].phys(s);
        self.track(pi, owner, pb, off, s.len, false)?;
        let data = self.bufs[owner][pb].read(off, s.len);
        if let Some(k) = first_undef(&data) {
            let at = s.off + k;
            if owner == self.procs[pi].0 {
                return Err(self.fail(pi, format!("reads {s} but element {at} was never written")));
            }
            return Err(self.fail(
                pi,
                format!("reads rank {owner}'s {s} but element {at} has not been written: nothing writes it, or the write is not ordered before this read by signal/wait"),
            ));
        }
        Ok(data)
    }

    fn store(&mut self, pi: usize, s: &Slice, data: &[Piece]) -> Result<()> {
        let rank = self.procs[pi].0;
        self.store_to(pi, rank, s, data)
    }

    fn store_to(&mut self, pi: usize, owner: usize, s: &Slice, data: &[Piece]) -> Result<()> {
        let (pb, off) = self.layout[owner].phys(s);
        self.track(pi, owner, pb, off, s.len, true)?;
        self.bufs[owner][pb].write(off, data);
        Ok(())
    }

    fn track(&mut self, pi: usize, owner: usize, pb: usize, off: usize, len: usize, write: bool) -> Result<()> {
        let pc = self.pc[pi];
        let Some(race) = self.race.as_mut() else {
            return Ok(());
        };
        match race.access((pi, pc), (owner, pb), off..off + len, write) {
            Ok(()) => Ok(()),
            Err((rec, s, e)) => {
                let what = if write { "writes" } else { "reads" };
                let place = self.buf_name(owner, pb, off.max(s), (off + len).min(e));
                Err(self.fail(
                    pi,
                    format!(
                        "{what} {place}, racing with {}: no signal/wait or message orders the two",
                        self.describe(rec)
                    ),
                ))
            }
        }
    }

    /// Names the element range of a physical buffer (`rank 3's output[0..8]`).
    pub(super) fn buf_name(&self, owner: usize, pb: usize, start: usize, end: usize) -> String {
        let l = self.layout[owner];
        let name = match (pb, l.aliased) {
            (0, Some(_)) => "in-place buffer",
            (0, None) => "input",
            (1, _) => "output",
            _ => "scratch",
        };
        format!("rank {owner}'s {name}[{start}..{end}]")
    }

    /// Describes a recorded access.
    pub(super) fn describe(&self, rec: Rec) -> String {
        if let Some(r) = self.race.as_ref().and_then(|c| c.entry_of(rec.proc)) {
            return format!(
                "rank {r}'s own use of its buffers before the collective (a peer must wait for rank {r}'s signal)"
            );
        }
        let (r, c) = self.procs[rec.proc];
        let kind = if rec.write { "write" } else { "read" };
        format!("the {kind} by {}", self.at(r, c, rec.pc))
    }

    fn reduce(&self, pi: usize, a: &[Piece], b: &[Piece], a_name: &Slice, b_name: &str) -> Result<Vec<Piece>> {
        let (rank, chan) = self.procs[pi];
        let site = Site { nranks: self.coll.nranks, rank, chan, pc: self.pc[pi] };
        combine(a, b, &site).map_err(|clash| {
            let msg = match clash {
                Clash::Undef { at, operand } => {
                    let which = if operand == 0 { a_name.to_string() } else { b_name.to_string() };
                    format!("reduces element {at} of {which}, which was never written")
                }
                Clash::Index { at, a, b } => {
                    format!("reduces {a} with {b} (element {at} of {a_name} and {b_name}): contributions of different elements")
                }
                Clash::Twice { at, rank } => {
                    format!("counts rank {rank}'s contribution twice (element {at} of {a_name} and {b_name})")
                }
            };
            self.fail(pi, msg)
        })
    }
}
