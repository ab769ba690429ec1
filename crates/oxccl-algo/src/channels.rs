//! Several channels at once: a program cut by data into `C` parts, each
//! the algorithm's own program for its part on channels of its own, so
//! the parts run concurrently (each channel has its own connections, and
//! can go over its own NIC: NCCL's channels).
//!
//! Part `k` of `C` is the balanced piece `part(count, C, k)` of every
//! block: of the buffer for all-reduce, broadcast and reduce, of each
//! rank's block for the collectives whose buffers hold `n` blocks
//! (reduce-scatter's input, all-gather's output, all-to-all's both,
//! gather's and scatter's root). The part's program is built for a count
//! of that piece and moved into place: a slice of its blocked buffer at
//! element `e` lands at `(e / len)·count + off + e mod len`, scratch
//! after the earlier parts' scratch, channels after theirs. A copy or
//! reduction that spans blocks is cut at their boundaries; a message that
//! does is an error (the program cannot be split: run it on one channel).
//!
//! In-place safety carries over: the part's in-place layout maps onto the
//! whole one (rank `r`'s block of a reduce-scatter's input is its output
//! in both). The verifier checks split programs like any other (tests).
//!
//! ```
//! use oxccl_algo::{algos::Algorithm, channels, placement::Placement, verify::verify, CollKind, Collective};
//! let c = Collective::new(CollKind::ReduceScatter, 4, 1000);
//! let p = channels::build(Algorithm::Ring, &c, &Default::default(), &Placement::flat(4), 3).unwrap();
//! assert_eq!(p.ranks[0].channels.len(), 3);
//! assert_eq!(verify(&p).unwrap().sent_bytes[0], 3 * 1000 * 4);
//! ```

use crate::algos::{Algorithm, BuildOptions, build_on};
use crate::collective::{CollKind, Collective, part};
use crate::ir::{Buf, Program, Slice, Step};
use crate::placement::Placement;
use oxccl_core::{Error, Result};

/// Most channels a program may use (the transports' channel numbers).
pub const MAX: usize = 16;

/// Whether `kind`'s input and output buffers hold `n` blocks of `count`.
fn blocked(kind: CollKind) -> (bool, bool) {
    use CollKind::*;
    match kind {
        ReduceScatter | Scatter => (true, false),
        AllGather | Gather => (false, true),
        AllToAll => (true, true),
        AllReduce | Broadcast | Reduce | SendRecv => (false, false),
    }
}

/// Where one part's slices go.
struct Place {
    /// Whole count, the part's offset and length.
    count: usize,
    off: usize,
    len: usize,
    /// Input and output blocked.
    blocked: (bool, bool),
    /// Scratch base of every rank for this part.
    scratch: Vec<usize>,
}

impl Place {
    fn is_blocked(&self, b: Buf) -> bool {
        match b {
            Buf::Input => self.blocked.0,
            Buf::Output => self.blocked.1,
            Buf::Scratch => false,
        }
    }

    /// Where element `e` of `b` goes (`rank` owns the slice).
    fn elem(&self, rank: usize, b: Buf, e: usize) -> usize {
        match b {
            Buf::Scratch => self.scratch[rank] + e,
            _ if self.is_blocked(b) && self.len > 0 => (e / self.len) * self.count + self.off + e % self.len,
            _ => self.off + e,
        }
    }

    /// Elements of `s` before it crosses a block boundary, from `from`.
    fn run(&self, s: &Slice, from: usize) -> usize {
        if !self.is_blocked(s.buf) || self.len == 0 {
            return s.len - from;
        }
        let e = s.off + from;
        (self.len - e % self.len).min(s.len - from)
    }

    /// `s` of `rank`, moved; an error when it spans blocks.
    fn slice(&self, rank: usize, s: &Slice) -> Result<Slice> {
        if s.len > 0 && self.run(s, 0) < s.len {
            return Err(Error::invalid(format!(
                "{s} of rank {rank} spans blocks of {} elements: the message cannot be split into channels",
                self.len
            )));
        }
        Ok(Slice::new(s.buf, if s.len == 0 { self.off } else { self.elem(rank, s.buf, s.off) }, s.len))
    }

    /// `step` of `rank` moved, cut where a local copy or reduction spans
    /// blocks.
    fn step(&self, rank: usize, step: &Step) -> Result<Vec<Step>> {
        if self.spans(step) {
            return Ok(self.cut(rank, step));
        }
        let one = |s: &Slice| self.slice(rank, s);
        // A peer's slice is placed with the peer's scratch base.
        let peer = step.one_sided_peer().unwrap_or(rank);
        let remote = |s: &Slice| self.slice(peer, s);
        Ok(vec![match step {
            Step::Send { peer, src } => Step::Send { peer: *peer, src: one(src)? },
            Step::Recv { peer, dst } => Step::Recv { peer: *peer, dst: one(dst)? },
            Step::RecvReduce { peer, src, dst } => Step::RecvReduce { peer: *peer, src: one(src)?, dst: one(dst)? },
            Step::RecvReduceSend { recv, send, src } => {
                Step::RecvReduceSend { recv: *recv, send: *send, src: one(src)? }
            }
            Step::RecvCopySend { recv, send, dst } => Step::RecvCopySend { recv: *recv, send: *send, dst: one(dst)? },
            Step::RecvReduceCopySend { recv, send, src, dst } => {
                Step::RecvReduceCopySend { recv: *recv, send: *send, src: one(src)?, dst: one(dst)? }
            }
            Step::Copy { src, dst } => Step::Copy { src: one(src)?, dst: one(dst)? },
            Step::Reduce { srcs, dst } => {
                Step::Reduce { srcs: srcs.iter().map(one).collect::<Result<_>>()?, dst: one(dst)? }
            }
            Step::Put { peer, src, dst } => Step::Put { peer: *peer, src: one(src)?, dst: remote(dst)? },
            Step::Get { peer, src, dst } => Step::Get { peer: *peer, src: remote(src)?, dst: one(dst)? },
            Step::GetReduce { peer, src, acc, dst } => {
                Step::GetReduce { peer: *peer, src: remote(src)?, acc: one(acc)?, dst: one(dst)? }
            }
            Step::Signal { .. } | Step::Wait { .. } => step.clone(),
        }])
    }

    /// Whether a local copy or reduction has a slice that spans blocks.
    fn spans(&self, step: &Step) -> bool {
        let all: Vec<&Slice> = match step {
            Step::Copy { src, dst } => vec![src, dst],
            Step::Reduce { srcs, dst } => srcs.iter().chain([dst]).collect(),
            _ => return false,
        };
        all.iter().any(|s| s.len > 0 && self.run(s, 0) < s.len)
    }

    /// A copy or reduction cut into pieces that each stay within a block
    /// of every slice it names.
    fn cut(&self, rank: usize, step: &Step) -> Vec<Step> {
        let (srcs, dst): (Vec<Slice>, &Slice) = match step {
            Step::Copy { src, dst } => (vec![*src], dst),
            Step::Reduce { srcs, dst } => (srcs.clone(), dst),
            _ => unreachable!("only copies and reductions are cut"),
        };
        let mut out = Vec::new();
        let mut from = 0;
        while from < dst.len {
            let n = srcs.iter().chain([dst]).map(|s| self.run(s, from)).min().unwrap_or(0).max(1);
            let piece = |s: &Slice| Slice::new(s.buf, self.elem(rank, s.buf, s.off + from), n);
            out.push(match step {
                Step::Copy { .. } => Step::Copy { src: piece(&srcs[0]), dst: piece(dst) },
                _ => Step::Reduce { srcs: srcs.iter().map(piece).collect(), dst: piece(dst) },
            });
            from += n;
        }
        out
    }
}

/// `algo`'s program for `coll` in `c` parts on channels of their own
/// (see the [module docs](self)); one part is [`build_on`] itself.
///
/// Errors: what [`build_on`] refuses; `c` is 0 or the parts need more
/// than [`MAX`] channels; a part's message spans blocks.
pub fn build(
    algo: Algorithm,
    coll: &Collective,
    opts: &BuildOptions,
    placement: &Placement,
    c: usize,
) -> Result<Program> {
    if c == 0 {
        return Err(Error::invalid(format!("{coll}: 0 channels; use 1 to {MAX}")));
    }
    if c == 1 {
        return build_on(algo, coll, opts, placement);
    }
    let n = coll.nranks;
    let parts: Vec<(usize, usize, Program)> = (0..c)
        .map(|k| {
            let (off, len) = part(coll.count, c, k);
            build_on(algo, &Collective { count: len, ..*coll }, opts, placement).map(|p| (off, len, p))
        })
        .collect::<Result<_>>()?;
    let mut out = Program::new(algo.name(), *coll);
    out.in_place = parts.iter().all(|(_, _, p)| p.in_place);
    let mut scratch = vec![0usize; n];
    let mut base = 0;
    for (off, len, p) in &parts {
        let place =
            Place { count: coll.count, off: *off, len: *len, blocked: blocked(coll.kind), scratch: scratch.clone() };
        let width = p.ranks.iter().map(|r| r.channels.len()).max().unwrap_or(0);
        if base + width > MAX {
            return Err(Error::invalid(format!(
                "{coll} in {c} parts of {} needs more than {MAX} channels ({width} a part)",
                algo.name()
            )));
        }
        for (r, rp) in p.ranks.iter().enumerate() {
            for (k, steps) in rp.channels.iter().enumerate() {
                for s in steps {
                    for moved in place.step(r, s)? {
                        out.push(r, base + k, moved);
                    }
                }
            }
        }
        for (r, rp) in p.ranks.iter().enumerate() {
            scratch[r] += rp.scratch;
            out.need_scratch(r, scratch[r]);
        }
        base += width;
    }
    out.trim();
    Ok(out)
}
