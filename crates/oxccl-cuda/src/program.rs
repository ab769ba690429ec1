//! The device executor's side of `cuda/args.h`: one rank's program of
//! oxccl-algo's IR encoded for `oxccl_program` ([`DeviceProgram`]), the
//! kernel's argument block ([`ProgArgs`]) and the sizes of the FIFO and flag
//! areas every rank shares with its peers.
//!
//! A program is checked once, here, when it is encoded (peers, channels,
//! operand counts, offsets); the kernel re-checks only what keeps a bad
//! upload from wild accesses.
#![allow(unsafe_code)]

use crate::args::{MAX_RANKS, MAX_SRCS};
use crate::error::{Result, invalid};
use oxccl_algo::ir::{Buf, RankProgram, Slice, Step};

/// `OXCCL_MAX_CHANNELS`: channels of one program.
pub const MAX_CHANNELS: usize = 32;
/// `OXCCL_MAX_TEAM`: blocks per channel.
pub const MAX_TEAM: usize = 16;
/// `OXCCL_PF_WORDS`: u64 words per (peer, channel) in a program flag area.
pub const PF_WORDS: usize = 8;
/// `OXCCL_PROG_FLAG_BYTES`: bytes of each rank's program flag area (zeroed once).
pub const PROG_FLAG_BYTES: usize = MAX_RANKS * MAX_CHANNELS * PF_WORDS * 8 + MAX_CHANNELS * 16 + 64;
/// `OXCCL_SLICE_BUF_SHIFT`: a slice's buffer sits in the bits above this.
pub const SLICE_BUF_SHIFT: u32 = 62;

/// `OXCCL_PS_*`: the step kinds, in oxccl-algo's [`Step`] order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
#[allow(missing_docs)]
pub enum StepOp {
    Send = 0,
    Recv = 1,
    RecvReduce = 2,
    RecvReduceSend = 3,
    RecvCopySend = 4,
    RecvReduceCopySend = 5,
    Copy = 6,
    Reduce = 7,
    Put = 8,
    Get = 9,
    GetReduce = 10,
    Signal = 11,
    Wait = 12,
}

/// `struct oxccl_pstep`: one encoded step (see `cuda/args.h`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PStep {
    /// [`StepOp`] as u32.
    pub op: u32,
    /// The peer received from, or the peer of a one-sided step.
    pub recv: u32,
    /// The peer sent to.
    pub send: u32,
    /// A reduce's operand count.
    pub nsrc: u32,
    /// Elements.
    pub len: u64,
    /// Destination slice (a put's: the peer's).
    pub dst: u64,
    /// Source slice (get, get-reduce: the peer's); a reduce: index into the slice table.
    pub src: u64,
    /// Get-reduce's local operand.
    pub acc: u64,
}

/// `struct oxccl_prog_args`: one rank's launch of `oxccl_program`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProgArgs {
    /// Every rank's input, output and scratch, as addressable from this rank.
    pub bufs: [[u64; 3]; MAX_RANKS],
    /// Every rank's FIFO area ([`fifo_bytes`]).
    pub fifo: [u64; MAX_RANKS],
    /// Every rank's program flag area ([`PROG_FLAG_BYTES`], zeroed at allocation).
    pub flags: [u64; MAX_RANKS],
    /// This rank's steps ([`PStep`]s in device memory).
    pub steps: u64,
    /// Its slice table (u64s in device memory).
    pub slices: u64,
    /// Bytes of one FIFO slot (a multiple of 16).
    pub slot_bytes: u64,
    /// A single wait gives up after this long.
    pub timeout_ns: u64,
    /// Address of `u32[2]` in host-mapped memory: status code, abort request.
    pub status: u64,
    /// First step of each channel.
    pub chan_first: [u32; MAX_CHANNELS],
    /// Steps of each channel.
    pub chan_steps: [u32; MAX_CHANNELS],
    /// Ranks, 1..=16.
    pub nranks: u32,
    /// This rank.
    pub rank: u32,
    /// Channels of this rank's program (the grid is `nchan * team` blocks).
    pub nchan: u32,
    /// Channels of every rank's FIFO layout (at least every rank's `nchan`).
    pub fifo_chans: u32,
    /// Slots per connection.
    pub slots: u32,
    /// Blocks per channel, 1..=16.
    pub team: u32,
    /// Ranks (bit q) whose input and output the program reaches
    /// one-sidedly and whose addresses it takes from their flag areas at
    /// the start of the launch rather than from `bufs` (ranks that are
    /// threads of one process: the addresses change from call to call).
    /// With the mask non-zero the rank also publishes its own, so a rank
    /// whose buffers a peer reaches sets its own bit even where it reaches
    /// nobody's (a peer would wait for them forever).
    pub exchange: u32,
    /// This launch's number on the communicator (1, 2, …; the same on
    /// every rank): the address exchange's key.
    pub seq: u64,
}

impl Default for ProgArgs {
    fn default() -> ProgArgs {
        ProgArgs {
            bufs: [[0; 3]; MAX_RANKS],
            fifo: [0; MAX_RANKS],
            flags: [0; MAX_RANKS],
            steps: 0,
            slices: 0,
            slot_bytes: 0,
            timeout_ns: 0,
            status: 0,
            chan_first: [0; MAX_CHANNELS],
            chan_steps: [0; MAX_CHANNELS],
            nranks: 0,
            rank: 0,
            nchan: 0,
            fifo_chans: 0,
            slots: 0,
            team: 0,
            exchange: 0,
            seq: 0,
        }
    }
}

// SAFETY: #[repr(C)] plain-old-data laid out exactly as `struct
// oxccl_prog_args` (tests/cuda/layout.rs checks every offset), passed by value
// as the kernel's only parameter.
unsafe impl cudarc::driver::DeviceRepr for ProgArgs {}

/// Bytes of one rank's FIFO area: a connection from every rank on every
/// FIFO channel, `slots` slots of `slot_bytes` each.
pub fn fifo_bytes(nranks: usize, fifo_chans: usize, slots: usize, slot_bytes: usize) -> usize {
    nranks * fifo_chans * slots * slot_bytes
}

impl ProgArgs {
    /// Checks the shape and the addresses the kernel uses (grid: blocks
    /// launched). Errors name the field.
    pub fn validate(&self, grid: u32) -> Result<()> {
        let bad = |msg: String| -> Result<()> { Err(invalid(format!("program: {msg}"))) };
        let n = self.nranks;
        if n == 0 || n as usize > MAX_RANKS || self.rank >= n {
            return bad(format!("rank {} of {n} ranks (at most {MAX_RANKS})", self.rank));
        }
        if self.nchan as usize > MAX_CHANNELS || self.nchan > self.fifo_chans {
            return bad(format!(
                "{} channels with a FIFO layout of {} (at most {MAX_CHANNELS})",
                self.nchan, self.fifo_chans
            ));
        }
        if self.team == 0 || self.team as usize > MAX_TEAM || grid != self.nchan * self.team {
            return bad(format!("grid of {grid} blocks for {} channels × team {}", self.nchan, self.team));
        }
        if self.slots == 0 || self.slot_bytes == 0 || !self.slot_bytes.is_multiple_of(16) {
            return bad(format!("{} slots of {} bytes (a multiple of 16)", self.slots, self.slot_bytes));
        }
        if self.timeout_ns == 0 {
            return bad("timeout_ns is 0; every wait needs a deadline".into());
        }
        if self.exchange != 0 && (self.seq == 0 || self.exchange >> n != 0) {
            return bad(format!("address exchange with ranks {:#x} at launch {}", self.exchange, self.seq));
        }
        if self.status == 0 || !self.status.is_multiple_of(4) {
            return bad(format!("status address {:#x} is null or not 4-byte aligned", self.status));
        }
        for q in 0..n as usize {
            if self.fifo[q] == 0 || self.flags[q] == 0 || !self.flags[q].is_multiple_of(8) {
                return bad(format!("rank {q}'s FIFO {:#x} or flag area {:#x} is null", self.fifo[q], self.flags[q]));
            }
        }
        Ok(())
    }
}

/// `OXCCL_MAX_P2P`: sends and receives of one `oxccl_p2p` launch.
pub const MAX_P2P: usize = 64;

/// `struct oxccl_p2p_args`: one rank's group of sends and receives.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct P2pArgs {
    /// Every rank's FIFO area (as for [`ProgArgs`]).
    pub fifo: [u64; MAX_RANKS],
    /// Every rank's program flag area.
    pub flags: [u64; MAX_RANKS],
    /// The operations' buffers, lane after lane.
    pub addr: [u64; MAX_P2P],
    /// Their bytes.
    pub len: [u64; MAX_P2P],
    /// Bytes of one FIFO slot.
    pub slot_bytes: u64,
    /// A single wait gives up after this long.
    pub timeout_ns: u64,
    /// Address of the status pair.
    pub status: u64,
    /// First operation of each lane.
    pub lane_first: [u32; MAX_CHANNELS],
    /// Operations of each lane.
    pub lane_ops: [u32; MAX_CHANNELS],
    /// Each lane's peer.
    pub lane_peer: [u32; MAX_CHANNELS],
    /// 1: the lane sends; 0: it receives.
    pub lane_send: [u32; MAX_CHANNELS],
    /// Ranks.
    pub nranks: u32,
    /// This rank.
    pub rank: u32,
    /// Lanes (the grid is `nlanes * team` blocks).
    pub nlanes: u32,
    /// Channels of every rank's FIFO layout.
    pub fifo_chans: u32,
    /// Slots per connection.
    pub slots: u32,
    /// Blocks per lane.
    pub team: u32,
    /// Padding (keep 0).
    pub pad0: u32,
    /// Padding (keep 0).
    pub pad1: u32,
}

impl Default for P2pArgs {
    fn default() -> P2pArgs {
        P2pArgs {
            fifo: [0; MAX_RANKS],
            flags: [0; MAX_RANKS],
            addr: [0; MAX_P2P],
            len: [0; MAX_P2P],
            slot_bytes: 0,
            timeout_ns: 0,
            status: 0,
            lane_first: [0; MAX_CHANNELS],
            lane_ops: [0; MAX_CHANNELS],
            lane_peer: [0; MAX_CHANNELS],
            lane_send: [0; MAX_CHANNELS],
            nranks: 0,
            rank: 0,
            nlanes: 0,
            fifo_chans: 0,
            slots: 0,
            team: 0,
            pad0: 0,
            pad1: 0,
        }
    }
}

// SAFETY: #[repr(C)] plain-old-data laid out exactly as `struct
// oxccl_p2p_args` (tests/cuda/layout.rs checks every offset), passed by value.
unsafe impl cudarc::driver::DeviceRepr for P2pArgs {}

/// One send or receive of a group (bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct P2pOp {
    /// A send (else a receive).
    pub send: bool,
    /// The other rank.
    pub peer: usize,
    /// Device address of the buffer.
    pub addr: u64,
    /// Bytes.
    pub len: u64,
}

impl P2pArgs {
    /// The lanes of `ops`, one rank's group in call order: one lane per
    /// (peer, direction), its operations in order (messages between two
    /// ranks stay in order, and every connection progresses at once).
    /// Returns the arguments (lane tables, buffers) and, for each slot of
    /// `addr`, the index of its operation in `ops`. Errors name the
    /// operation.
    pub fn group(ops: &[P2pOp], rank: usize, nranks: usize) -> Result<(P2pArgs, Vec<usize>)> {
        if nranks == 0 || nranks > MAX_RANKS || rank >= nranks {
            return Err(invalid(format!("send/recv: rank {rank} of {nranks} ranks (the device runs 1..={MAX_RANKS})")));
        }
        if ops.len() > MAX_P2P {
            return Err(invalid(format!(
                "a group of {} sends and receives on device buffers; one launch carries at most {MAX_P2P}",
                ops.len()
            )));
        }
        let mut lanes: Vec<(usize, bool, Vec<usize>)> = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            if op.peer >= nranks || op.peer == rank {
                let what = if op.send { "send to" } else { "receive from" };
                return Err(invalid(format!(
                    "operation {i} of the group: rank {rank} cannot {what} rank {} ({nranks} ranks)",
                    op.peer
                )));
            }
            match lanes.iter_mut().find(|(p, s, _)| *p == op.peer && *s == op.send) {
                Some((_, _, v)) => v.push(i),
                None => lanes.push((op.peer, op.send, vec![i])),
            }
        }
        let mut a =
            P2pArgs { nranks: nranks as u32, rank: rank as u32, nlanes: lanes.len() as u32, ..Default::default() };
        let mut order = Vec::with_capacity(ops.len());
        for (l, (peer, send, idx)) in lanes.iter().enumerate() {
            (a.lane_first[l], a.lane_ops[l]) = (order.len() as u32, idx.len() as u32);
            (a.lane_peer[l], a.lane_send[l]) = (*peer as u32, *send as u32);
            for &i in idx {
                (a.addr[order.len()], a.len[order.len()]) = (ops[i].addr, ops[i].len);
                order.push(i);
            }
        }
        Ok((a, order))
    }
}

/// One rank's program as the kernel reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceProgram {
    /// Every channel's steps, channel after channel.
    pub steps: Vec<PStep>,
    /// Operands of reduce steps.
    pub slices: Vec<u64>,
    /// (first step, step count) of each channel.
    pub channels: Vec<(u32, u32)>,
    /// Scratch elements (in the encoding's unit) the program needs.
    pub scratch: usize,
}

impl DeviceProgram {
    /// Encodes `rank`'s program of an `nranks`-rank collective. `unit`
    /// scales every offset and length: 1 runs the program in its own
    /// element type, the element size in bytes runs it in the byte module
    /// (collectives that only move data). Errors name the step.
    pub fn encode(prog: &RankProgram, rank: usize, nranks: usize, unit: usize) -> Result<DeviceProgram> {
        if nranks == 0 || nranks > MAX_RANKS || rank >= nranks {
            return Err(invalid(format!("program: rank {rank} of {nranks} ranks (the device runs 1..={MAX_RANKS})")));
        }
        if prog.channels.len() > MAX_CHANNELS {
            return Err(invalid(format!(
                "program: rank {rank} has {} channels; the device runs at most {MAX_CHANNELS}",
                prog.channels.len()
            )));
        }
        let mut out = DeviceProgram { scratch: prog.scratch * unit, ..Default::default() };
        for (ch, steps) in prog.channels.iter().enumerate() {
            let first = out.steps.len() as u32;
            for (i, step) in steps.iter().enumerate() {
                let e = encode_step(step, rank, nranks, unit, &mut out.slices)
                    .map_err(|m| invalid(format!("program: rank {rank} channel {ch} step {i} ({step}): {m}")))?;
                out.steps.push(e);
            }
            out.channels.push((first, steps.len() as u32));
        }
        Ok(out)
    }

    /// The longest message of the program, in the encoding's unit.
    pub fn max_message(&self) -> u64 {
        self.steps.iter().filter(|s| s.op <= StepOp::RecvReduceCopySend as u32).map(|s| s.len).max().unwrap_or(0)
    }

    /// FIFO slots per connection the program needs with slots of
    /// `slot_bytes` when a unit is `unit_bytes`: twice the pieces of its
    /// longest message (at least 1). The verifier proves a program free of
    /// deadlock when every connection buffers two whole messages; cut into
    /// pieces, that is two messages' worth of slots.
    pub fn slots_needed(&self, unit_bytes: usize, slot_bytes: usize) -> usize {
        let bytes = self.max_message() as usize * unit_bytes;
        (2 * bytes.div_ceil(slot_bytes.max(1))).max(1)
    }

    /// Fills the channel table of `args`.
    pub fn fill(&self, args: &mut ProgArgs) {
        args.nchan = self.channels.len() as u32;
        for (c, &(first, n)) in self.channels.iter().enumerate() {
            args.chan_first[c] = first;
            args.chan_steps[c] = n;
        }
    }

    /// Bytes of the upload: the steps, then the slice table.
    pub fn upload_len(&self) -> usize {
        self.steps.len() * std::mem::size_of::<PStep>() + self.slices.len() * 8
    }

    /// The steps as bytes (for an upload).
    pub fn step_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.steps.len() * std::mem::size_of::<PStep>());
        for s in &self.steps {
            for w in [s.op, s.recv, s.send, s.nsrc] {
                v.extend_from_slice(&w.to_le_bytes());
            }
            for w in [s.len, s.dst, s.src, s.acc] {
                v.extend_from_slice(&w.to_le_bytes());
            }
        }
        v
    }

    /// The slice table as bytes.
    pub fn slice_bytes(&self) -> Vec<u8> {
        self.slices.iter().flat_map(|s| s.to_le_bytes()).collect()
    }
}

fn slice(s: &Slice, unit: usize) -> std::result::Result<u64, String> {
    let off = s.off.checked_mul(unit).filter(|&o| (o as u64) < (1u64 << SLICE_BUF_SHIFT));
    let off = off.ok_or_else(|| format!("slice {s} is out of the device's range"))?;
    let buf = match s.buf {
        Buf::Input => 0u64,
        Buf::Output => 1,
        Buf::Scratch => 2,
    };
    Ok(buf << SLICE_BUF_SHIFT | off as u64)
}

fn encode_step(
    step: &Step,
    rank: usize,
    nranks: usize,
    unit: usize,
    table: &mut Vec<u64>,
) -> std::result::Result<PStep, String> {
    let peer = |p: usize| -> std::result::Result<u32, String> {
        if p >= nranks {
            return Err(format!("peer {p} is not below {nranks}"));
        }
        if p == rank {
            return Err("a rank cannot be its own peer".into());
        }
        Ok(p as u32)
    };
    let len = |s: &Slice| (s.len * unit) as u64;
    let mut e = PStep::default();
    let op = match step {
        Step::Send { peer: p, src } => {
            (e.send, e.src, e.len) = (peer(*p)?, slice(src, unit)?, len(src));
            StepOp::Send
        }
        Step::Recv { peer: p, dst } => {
            (e.recv, e.dst, e.len) = (peer(*p)?, slice(dst, unit)?, len(dst));
            StepOp::Recv
        }
        Step::RecvReduce { peer: p, src, dst } => {
            (e.recv, e.src, e.dst, e.len) = (peer(*p)?, slice(src, unit)?, slice(dst, unit)?, len(dst));
            StepOp::RecvReduce
        }
        Step::RecvReduceSend { recv, send, src } => {
            (e.recv, e.send, e.src, e.len) = (peer(*recv)?, peer(*send)?, slice(src, unit)?, len(src));
            StepOp::RecvReduceSend
        }
        Step::RecvCopySend { recv, send, dst } => {
            (e.recv, e.send, e.dst, e.len) = (peer(*recv)?, peer(*send)?, slice(dst, unit)?, len(dst));
            StepOp::RecvCopySend
        }
        Step::RecvReduceCopySend { recv, send, src, dst } => {
            (e.recv, e.send, e.src, e.dst, e.len) =
                (peer(*recv)?, peer(*send)?, slice(src, unit)?, slice(dst, unit)?, len(dst));
            StepOp::RecvReduceCopySend
        }
        Step::Copy { src, dst } => {
            (e.src, e.dst, e.len) = (slice(src, unit)?, slice(dst, unit)?, len(dst));
            StepOp::Copy
        }
        Step::Reduce { srcs, dst } => {
            if srcs.is_empty() || srcs.len() > MAX_SRCS {
                return Err(format!("{} operands; the device reduces 1..={MAX_SRCS} at once", srcs.len()));
            }
            (e.src, e.nsrc, e.dst, e.len) = (table.len() as u64, srcs.len() as u32, slice(dst, unit)?, len(dst));
            for s in srcs {
                table.push(slice(s, unit)?);
            }
            StepOp::Reduce
        }
        Step::Put { peer: p, src, dst } => {
            (e.recv, e.src, e.dst, e.len) = (peer(*p)?, slice(src, unit)?, slice(dst, unit)?, len(src));
            StepOp::Put
        }
        Step::Get { peer: p, src, dst } => {
            (e.recv, e.src, e.dst, e.len) = (peer(*p)?, slice(src, unit)?, slice(dst, unit)?, len(dst));
            StepOp::Get
        }
        Step::GetReduce { peer: p, src, acc, dst } => {
            (e.recv, e.src, e.acc, e.dst, e.len) =
                (peer(*p)?, slice(src, unit)?, slice(acc, unit)?, slice(dst, unit)?, len(dst));
            StepOp::GetReduce
        }
        Step::Signal { peer: p } => {
            e.recv = peer(*p)?;
            StepOp::Signal
        }
        Step::Wait { peer: p } => {
            e.recv = peer(*p)?;
            StepOp::Wait
        }
    };
    e.op = op as u32;
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_those_of_the_header() {
        assert_eq!(std::mem::size_of::<PStep>(), 48);
        assert_eq!(std::mem::size_of::<ProgArgs>(), (48 + 16 + 16 + 5) * 8 + 64 * 4 + 8 * 4 + 8);
    }

    #[test]
    fn steps_encode_with_their_peers_and_slices() {
        let mut p = RankProgram::default();
        p.channels.push(vec![
            Step::RecvReduceSend { recv: 2, send: 1, src: Slice::input(4, 8) },
            Step::Reduce { srcs: vec![Slice::scratch(0, 3), Slice::output(3, 3)], dst: Slice::output(0, 3) },
        ]);
        p.channels.push(vec![Step::Signal { peer: 1 }]);
        p.scratch = 3;
        let d = DeviceProgram::encode(&p, 0, 3, 4).unwrap();
        assert_eq!(d.channels, vec![(0, 2), (2, 1)]);
        assert_eq!(d.scratch, 12);
        let s = d.steps[0];
        assert_eq!((s.op, s.recv, s.send, s.len, s.src), (StepOp::RecvReduceSend as u32, 2, 1, 32, 16));
        let r = d.steps[1];
        assert_eq!((r.op, r.nsrc, r.src, r.dst), (StepOp::Reduce as u32, 2, 0, 1 << 62));
        assert_eq!(d.slices, vec![2 << 62, (1 << 62) | 12]);
        assert_eq!(d.step_bytes().len(), 3 * 48);
        assert_eq!(d.max_message(), 32);
        assert_eq!(d.slots_needed(1, 16), 4);
        assert_eq!(d.slots_needed(1, 4096), 2);
    }

    #[test]
    fn bad_programs_name_the_step() {
        let mut p = RankProgram::default();
        p.channels.push(vec![Step::Copy { src: Slice::input(0, 1), dst: Slice::output(0, 1) }, Step::Wait { peer: 1 }]);
        let e = DeviceProgram::encode(&p, 1, 2, 1).unwrap_err().to_string();
        assert!(e.contains("rank 1 channel 0 step 1") && e.contains("own peer"), "{e}");
        let e = DeviceProgram::encode(&p, 0, 17, 1).unwrap_err().to_string();
        assert!(e.contains("17 ranks"), "{e}");
        p.channels = vec![vec![Step::Send { peer: 5, src: Slice::input(0, 1) }]];
        assert!(DeviceProgram::encode(&p, 0, 2, 1).unwrap_err().to_string().contains("peer 5"));
        p.channels = vec![vec![]; MAX_CHANNELS + 1];
        assert!(DeviceProgram::encode(&p, 0, 2, 1).unwrap_err().to_string().contains("33 channels"));
    }

    #[test]
    fn a_group_has_one_lane_per_peer_and_direction_in_call_order() {
        let op = |send, peer, addr| P2pOp { send, peer, addr, len: 8 };
        let ops = [op(true, 2, 10), op(false, 2, 20), op(true, 1, 30), op(true, 2, 40), op(false, 1, 50)];
        let (a, order) = P2pArgs::group(&ops, 0, 3).unwrap();
        assert_eq!(a.nlanes, 4);
        assert_eq!(order, vec![0, 3, 1, 2, 4]);
        assert_eq!(&a.addr[..5], &[10, 40, 20, 30, 50]);
        assert_eq!((&a.lane_first[..4], &a.lane_ops[..4]), (&[0, 2, 3, 4][..], &[2, 1, 1, 1][..]));
        assert_eq!((&a.lane_peer[..4], &a.lane_send[..4]), (&[2, 2, 1, 1][..], &[1, 0, 1, 0][..]));
        let e = P2pArgs::group(&[op(true, 0, 1)], 0, 3).unwrap_err().to_string();
        assert!(e.contains("operation 0") && e.contains("send to rank 0"), "{e}");
        assert!(P2pArgs::group(&vec![op(true, 1, 1); 65], 0, 3).unwrap_err().to_string().contains("65 sends"));
    }

    #[test]
    fn args_validation_names_the_field() {
        let mut a = ProgArgs {
            nranks: 2,
            nchan: 2,
            fifo_chans: 2,
            team: 2,
            slots: 4,
            slot_bytes: 4096,
            timeout_ns: 1,
            status: 0x1000,
            ..Default::default()
        };
        for q in 0..2 {
            (a.fifo[q], a.flags[q]) = (0x10_0000 << q, 0x20_0000 << q);
        }
        a.validate(4).unwrap();
        assert!(a.validate(3).unwrap_err().to_string().contains("grid of 3"));
        assert!(ProgArgs { slot_bytes: 24, ..a }.validate(4).unwrap_err().to_string().contains("24 bytes"));
        assert!(ProgArgs { nchan: 3, ..a }.validate(6).unwrap_err().to_string().contains("3 channels"));
        a.flags[1] = 0;
        assert!(a.validate(4).unwrap_err().to_string().contains("rank 1"));
    }
}
