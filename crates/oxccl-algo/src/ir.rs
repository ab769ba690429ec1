//! The program IR: what every rank does, step by step, over slices of its
//! buffers.
//!
//! A [`Program`] is plain data (serde: JSON by hand or by machine). It holds
//! the [`Collective`] it claims to implement and, for each rank, one or more
//! *channels*: sequences of [`Step`]s that run concurrently with each other
//! (NCCL's channels; the double binary tree runs one tree per channel).
//! Steps of one channel run in order. Messages flow over connections keyed
//! by (sender, receiver, channel) and are matched in order.
//!
//! Slices are counted in elements of the collective's data type and name one
//! of the rank's three buffers: the user's input, the user's output, and a
//! scratch buffer the program declares. Their JSON form is a string,
//! `"input[0..1024]"`.
//!
//! Pipelining lives in the program: a generator cuts each slice into chunks
//! and emits the steps chunk by chunk, so an executor that runs steps as
//! soon as their data is there keeps several chunks in flight per peer.

use crate::collective::Collective;
use oxccl_core::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// One of a rank's buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Buf {
    /// The user's send buffer.
    Input,
    /// The user's receive buffer.
    Output,
    /// Working space owned by the program ([`RankProgram::scratch`] elements).
    Scratch,
}

impl Buf {
    /// The name used in slices' text form.
    pub const fn name(self) -> &'static str {
        match self {
            Buf::Input => "input",
            Buf::Output => "output",
            Buf::Scratch => "scratch",
        }
    }
}

/// A contiguous range of elements in one buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Slice {
    /// Which buffer.
    pub buf: Buf,
    /// First element.
    pub off: usize,
    /// Number of elements.
    pub len: usize,
}

impl Slice {
    /// `buf[off..off + len]`.
    pub const fn new(buf: Buf, off: usize, len: usize) -> Slice {
        Slice { buf, off, len }
    }
    /// `input[off..off + len]`.
    pub const fn input(off: usize, len: usize) -> Slice {
        Slice::new(Buf::Input, off, len)
    }
    /// `output[off..off + len]`.
    pub const fn output(off: usize, len: usize) -> Slice {
        Slice::new(Buf::Output, off, len)
    }
    /// `scratch[off..off + len]`.
    pub const fn scratch(off: usize, len: usize) -> Slice {
        Slice::new(Buf::Scratch, off, len)
    }
    /// One past the last element (saturating: a slice past the address
    /// space is out of every buffer's bounds).
    pub const fn end(&self) -> usize {
        self.off.saturating_add(self.len)
    }
    /// The sub-slice `[from, from + len)` relative to this slice's start.
    pub fn sub(&self, from: usize, len: usize) -> Slice {
        debug_assert!(from + len <= self.len, "sub-slice {from}+{len} outside {self}");
        Slice::new(self.buf, self.off + from, len)
    }
}

impl fmt::Display for Slice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}..{}]", self.buf.name(), self.off, self.end())
    }
}

impl FromStr for Slice {
    type Err = Error;
    fn from_str(s: &str) -> Result<Slice> {
        let bad = || Error::invalid(format!("slice {s:?} is not of the form \"input[0..16]\""));
        let (name, rest) = s.trim().split_once('[').ok_or_else(bad)?;
        let range = rest.strip_suffix(']').ok_or_else(bad)?;
        let (a, b) = range.split_once("..").ok_or_else(bad)?;
        let buf = match name.trim() {
            "input" => Buf::Input,
            "output" => Buf::Output,
            "scratch" => Buf::Scratch,
            _ => return Err(bad()),
        };
        let a: usize = a.trim().parse().map_err(|_| bad())?;
        let b: usize = b.trim().parse().map_err(|_| bad())?;
        if b < a {
            return Err(Error::invalid(format!("slice {s:?} ends before it starts")));
        }
        Ok(Slice::new(buf, a, b - a))
    }
}

impl TryFrom<String> for Slice {
    type Error = Error;
    fn try_from(s: String) -> Result<Slice> {
        s.parse()
    }
}

impl From<Slice> for String {
    fn from(s: Slice) -> String {
        s.to_string()
    }
}

/// One step of a channel.
///
/// Two-sided steps follow NCCL's device primitives; `⊕` is the
/// collective's reduction. A step that receives and sends does the receive
/// first, then the send (an executor may pipeline both at chunk
/// granularity). One-sided steps address a peer's buffers directly (shared
/// memory, CUDA IPC, RDMA). Every step completes before the next step of
/// its channel starts (a put's data is visible at the peer once the put
/// completes), so across ranks one-sided accesses are ordered by what
/// follows them: `signal`/`wait`, or a message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Step {
    /// Send `src` to `peer`.
    Send {
        /// Receiver.
        peer: usize,
        /// What to send.
        src: Slice,
    },
    /// Receive from `peer` into `dst`.
    Recv {
        /// Sender.
        peer: usize,
        /// Where the data lands.
        dst: Slice,
    },
    /// Receive from `peer`; `dst = src ⊕ received`.
    RecvReduce {
        /// Sender.
        peer: usize,
        /// Local operand.
        src: Slice,
        /// Result.
        dst: Slice,
    },
    /// Receive from `recv`; send `src ⊕ received` to `send` (nothing stored).
    RecvReduceSend {
        /// Sender of the incoming data.
        recv: usize,
        /// Receiver of the result.
        send: usize,
        /// Local operand.
        src: Slice,
    },
    /// Receive from `recv` into `dst` and forward it to `send`.
    RecvCopySend {
        /// Sender of the incoming data.
        recv: usize,
        /// Receiver of the forwarded data.
        send: usize,
        /// Where the data lands.
        dst: Slice,
    },
    /// Receive from `recv`; `dst = src ⊕ received`; send `dst` to `send`.
    RecvReduceCopySend {
        /// Sender of the incoming data.
        recv: usize,
        /// Receiver of the result.
        send: usize,
        /// Local operand.
        src: Slice,
        /// Result.
        dst: Slice,
    },
    /// `dst = src`.
    Copy {
        /// Source.
        src: Slice,
        /// Destination.
        dst: Slice,
    },
    /// `dst = srcs[0] ⊕ srcs[1] ⊕ …` (one pass).
    Reduce {
        /// At least one operand, all of `dst`'s length.
        srcs: Vec<Slice>,
        /// Result.
        dst: Slice,
    },
    /// Write local `src` into `peer`'s `dst`.
    Put {
        /// Owner of `dst`.
        peer: usize,
        /// Local source.
        src: Slice,
        /// Slice of the peer's buffers.
        dst: Slice,
    },
    /// Read `peer`'s `src` into local `dst`.
    Get {
        /// Owner of `src`.
        peer: usize,
        /// Slice of the peer's buffers.
        src: Slice,
        /// Local destination.
        dst: Slice,
    },
    /// `dst = acc ⊕ peer's src` (local `acc` and `dst`).
    GetReduce {
        /// Owner of `src`.
        peer: usize,
        /// Slice of the peer's buffers.
        src: Slice,
        /// Local operand.
        acc: Slice,
        /// Local result.
        dst: Slice,
    },
    /// Tell `peer` (same channel) that everything before this point is done.
    Signal {
        /// Who is told.
        peer: usize,
    },
    /// Wait for the next signal from `peer` (same channel).
    Wait {
        /// Who is waited for.
        peer: usize,
    },
}

impl Step {
    /// The peer this step receives from, if any.
    pub fn recv_peer(&self) -> Option<usize> {
        match *self {
            Step::Recv { peer, .. } | Step::RecvReduce { peer, .. } => Some(peer),
            Step::RecvReduceSend { recv, .. }
            | Step::RecvCopySend { recv, .. }
            | Step::RecvReduceCopySend { recv, .. } => Some(recv),
            _ => None,
        }
    }

    /// The peer this step sends to, if any.
    pub fn send_peer(&self) -> Option<usize> {
        match *self {
            Step::Send { peer, .. } => Some(peer),
            Step::RecvReduceSend { send, .. }
            | Step::RecvCopySend { send, .. }
            | Step::RecvReduceCopySend { send, .. } => Some(send),
            _ => None,
        }
    }

    /// The peer whose buffers a one-sided step touches, or who is signalled
    /// or waited for.
    pub fn one_sided_peer(&self) -> Option<usize> {
        match *self {
            Step::Put { peer, .. }
            | Step::Get { peer, .. }
            | Step::GetReduce { peer, .. }
            | Step::Signal { peer }
            | Step::Wait { peer } => Some(peer),
            _ => None,
        }
    }

    /// The slice the step writes, if any: a local one, or for `put` the
    /// peer's.
    pub fn dst(&self) -> Option<&Slice> {
        match self {
            Step::Recv { dst, .. }
            | Step::RecvReduce { dst, .. }
            | Step::RecvCopySend { dst, .. }
            | Step::RecvReduceCopySend { dst, .. }
            | Step::Copy { dst, .. }
            | Step::Reduce { dst, .. }
            | Step::Put { dst, .. }
            | Step::Get { dst, .. }
            | Step::GetReduce { dst, .. } => Some(dst),
            Step::Send { .. } | Step::RecvReduceSend { .. } | Step::Signal { .. } | Step::Wait { .. } => None,
        }
    }

    /// Whether the step is one-sided (put, get, signal, wait).
    pub fn is_one_sided(&self) -> bool {
        self.one_sided_peer().is_some()
    }

    /// Elements this step moves over the network or between ranks' memory
    /// (the message or the remote slice), 0 for local steps and signals.
    pub fn wire_elems(&self) -> usize {
        match self {
            Step::Send { src, .. } | Step::RecvReduceSend { src, .. } => src.len,
            Step::Recv { dst, .. }
            | Step::RecvReduce { dst, .. }
            | Step::RecvCopySend { dst, .. }
            | Step::RecvReduceCopySend { dst, .. } => dst.len,
            Step::Put { src, .. } | Step::Get { src, .. } | Step::GetReduce { src, .. } => src.len,
            Step::Copy { .. } | Step::Reduce { .. } | Step::Signal { .. } | Step::Wait { .. } => 0,
        }
    }

    /// The element count of the message this step receives (or remote data
    /// it reads) and reduces into something, for pricing reductions.
    pub fn reduce_elems(&self) -> usize {
        match self {
            Step::RecvReduce { dst, .. } | Step::RecvReduceCopySend { dst, .. } => dst.len,
            Step::RecvReduceSend { src, .. } => src.len,
            Step::GetReduce { dst, .. } => dst.len,
            Step::Reduce { srcs, dst } => dst.len * srcs.len().saturating_sub(1),
            _ => 0,
        }
    }

    /// The same step with every peer `p` renamed `f(p)`.
    pub fn map_peers(&self, f: impl Fn(usize) -> usize) -> Step {
        let mut s = self.clone();
        match &mut s {
            Step::Send { peer, .. }
            | Step::Recv { peer, .. }
            | Step::RecvReduce { peer, .. }
            | Step::Put { peer, .. }
            | Step::Get { peer, .. }
            | Step::GetReduce { peer, .. }
            | Step::Signal { peer }
            | Step::Wait { peer } => *peer = f(*peer),
            Step::RecvReduceSend { recv, send, .. }
            | Step::RecvCopySend { recv, send, .. }
            | Step::RecvReduceCopySend { recv, send, .. } => (*recv, *send) = (f(*recv), f(*send)),
            Step::Copy { .. } | Step::Reduce { .. } => {}
        }
        s
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Send { peer, src } => write!(f, "send {src} to {peer}"),
            Step::Recv { peer, dst } => write!(f, "recv {dst} from {peer}"),
            Step::RecvReduce { peer, src, dst } => {
                write!(f, "recv-reduce {dst} = {src} + recv from {peer}")
            }
            Step::RecvReduceSend { recv, send, src } => {
                write!(f, "recv-reduce-send {src} + recv from {recv} to {send}")
            }
            Step::RecvCopySend { recv, send, dst } => {
                write!(f, "recv-copy-send {dst} from {recv} to {send}")
            }
            Step::RecvReduceCopySend { recv, send, src, dst } => {
                write!(f, "recv-reduce-copy-send {dst} = {src} + recv from {recv}, to {send}")
            }
            Step::Copy { src, dst } => write!(f, "copy {src} to {dst}"),
            Step::Reduce { srcs, dst } => {
                write!(f, "reduce {dst} =")?;
                for (i, s) in srcs.iter().enumerate() {
                    write!(f, "{}{s}", if i == 0 { " " } else { " + " })?;
                }
                Ok(())
            }
            Step::Put { peer, src, dst } => write!(f, "put {src} into rank {peer}'s {dst}"),
            Step::Get { peer, src, dst } => write!(f, "get rank {peer}'s {src} into {dst}"),
            Step::GetReduce { peer, src, acc, dst } => {
                write!(f, "get-reduce {dst} = {acc} + rank {peer}'s {src}")
            }
            Step::Signal { peer } => write!(f, "signal {peer}"),
            Step::Wait { peer } => write!(f, "wait for {peer}"),
        }
    }
}

/// What one rank runs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankProgram {
    /// Elements of scratch space the program needs on this rank.
    #[serde(default)]
    pub scratch: usize,
    /// Concurrent sequences of steps.
    pub channels: Vec<Vec<Step>>,
}

impl RankProgram {
    /// All steps of all channels.
    pub fn steps(&self) -> impl Iterator<Item = &Step> {
        self.channels.iter().flatten()
    }
}

/// A collective algorithm instantiated for one collective: a program per
/// rank.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Program {
    /// The algorithm's name (`ring`, `tree`, …) or a researcher's label.
    pub name: String,
    /// What the program claims to compute.
    pub collective: Collective,
    /// Whether the program is correct when the input and output buffers
    /// alias as NCCL's in-place convention has them (see
    /// [`Collective::in_place_layout`]); the verifier checks the claim.
    /// Absent in JSON and in [`Program::new`]: no claim.
    #[serde(default)]
    pub in_place: bool,
    /// One entry per rank.
    pub ranks: Vec<RankProgram>,
}

impl Program {
    /// An empty program (no steps) for `collective`.
    pub fn new(name: impl Into<String>, collective: Collective) -> Program {
        Program {
            name: name.into(),
            collective,
            in_place: false,
            ranks: vec![RankProgram::default(); collective.nranks],
        }
    }

    /// Makes this an empty program for `collective`, keeping the memory
    /// its steps occupied for the next ones.
    pub fn reset(&mut self, name: &str, collective: Collective) {
        self.name.clear();
        self.name.push_str(name);
        self.collective = collective;
        self.in_place = false;
        self.ranks.truncate(collective.nranks);
        for r in &mut self.ranks {
            r.scratch = 0;
            r.channels.iter_mut().for_each(Vec::clear);
        }
        self.ranks.resize_with(collective.nranks, RankProgram::default);
    }

    /// Drops trailing channels without steps (left over by [`reset`]).
    ///
    /// [`reset`]: Program::reset
    pub fn trim(&mut self) {
        for r in &mut self.ranks {
            while r.channels.last().is_some_and(Vec::is_empty) {
                r.channels.pop();
            }
        }
    }

    /// Appends `step` to `rank`'s channel `channel`, creating channels as
    /// needed.
    pub fn push(&mut self, rank: usize, channel: usize, step: Step) {
        let chans = &mut self.ranks[rank].channels;
        if chans.len() <= channel {
            chans.resize_with(channel + 1, Vec::new);
        }
        chans[channel].push(step);
    }

    /// Makes `rank`'s scratch at least `elems` long.
    pub fn need_scratch(&mut self, rank: usize, elems: usize) {
        let s = &mut self.ranks[rank].scratch;
        *s = (*s).max(elems);
    }

    /// The same communication with rank `r` renamed `new[r]` (a
    /// permutation): what the simulator prices, since it only times
    /// messages. The result does not compute the collective in general
    /// (blocks belong to ranks by number).
    pub fn relabeled(&self, new: &[usize]) -> Program {
        let mut out = self.clone();
        for (r, rp) in self.ranks.iter().enumerate() {
            let mut rp = rp.clone();
            for ch in &mut rp.channels {
                ch.iter_mut().for_each(|s| *s = s.map_peers(|p| new.get(p).copied().unwrap_or(p)));
            }
            out.ranks[new[r]] = rp;
        }
        out
    }

    /// Total number of steps over all ranks and channels.
    pub fn step_count(&self) -> usize {
        self.ranks.iter().map(|r| r.steps().count()).sum()
    }

    /// Whether any step is one-sided.
    pub fn has_one_sided(&self) -> bool {
        self.ranks.iter().any(|r| r.steps().any(Step::is_one_sided))
    }

    /// A readable listing: one line per step, grouped by rank and channel.
    pub fn listing(&self) -> String {
        use std::fmt::Write;
        let mut out = format!("{} ({})\n", self.name, self.collective);
        for (r, rp) in self.ranks.iter().enumerate() {
            let scratch = if rp.scratch > 0 { format!(", scratch {}", rp.scratch) } else { String::new() };
            let _ = writeln!(out, "rank {r}{scratch}:");
            for (c, steps) in rp.channels.iter().enumerate() {
                if rp.channels.len() > 1 {
                    let _ = writeln!(out, "  channel {c}:");
                }
                for (i, s) in steps.iter().enumerate() {
                    let _ = writeln!(out, "  {i:>4}  {s}");
                }
            }
        }
        out
    }

    /// The program as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("programs always serialize")
    }

    /// Parses a program from JSON, with an error naming the line and column.
    pub fn from_json(text: &str) -> Result<Program> {
        serde_json::from_str(text).map_err(|e| Error::invalid(format!("program JSON: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_text_form_round_trips() {
        let s = Slice::scratch(5, 7);
        assert_eq!(s.to_string(), "scratch[5..12]");
        assert_eq!("scratch[5..12]".parse::<Slice>().unwrap(), s);
        assert_eq!(" output[0..0] ".parse::<Slice>().unwrap(), Slice::output(0, 0));
        for bad in ["inputs[0..1]", "input[3..1]", "input[0..]", "input 0..1", "input[a..b]"] {
            assert!(bad.parse::<Slice>().is_err(), "{bad} parsed");
        }
    }

    #[test]
    fn step_json_is_hand_writable() {
        let step: Step =
            serde_json::from_str(r#"{"op": "recv_reduce_send", "recv": 1, "send": 2, "src": "input[0..4]"}"#).unwrap();
        assert_eq!(step, Step::RecvReduceSend { recv: 1, send: 2, src: Slice::input(0, 4) });
        assert_eq!(step.recv_peer(), Some(1));
        assert_eq!(step.send_peer(), Some(2));
        let back: Step = serde_json::from_str(&serde_json::to_string(&step).unwrap()).unwrap();
        assert_eq!(back, step);
    }
}
