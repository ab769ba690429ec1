//! One program, every count: [`instantiate`] turns a program written for
//! count `C` (its `collective.count`) into the program for any count `N`,
//! so a hand-written program verified once runs at every message size.
//!
//! # The rule
//!
//! Write `N = q·C + r` with `0 ≤ r < C`. Every buffer (input, output,
//! scratch) is viewed as consecutive blocks of `C` elements. Within a
//! block, index `k` stands for a contiguous *piece* of `q+1` elements if
//! `k < r`, else `q`, starting at `start(k) = k·q + min(k, r)`; block `b`
//! starts at `b·N`. So element `j` maps to
//!
//! ```text
//! pos(j) = (j / C)·N + start(j % C)
//! ```
//!
//! and a slice `[a, b)` to `[pos(a), pos(b))`: contiguous, and adjacent
//! slices stay adjacent, across block boundaries too. A scratch length `L`
//! becomes `pos(L)`. Steps, peers, channels and their order are kept as
//! they are; a step whose slices all become empty (`N < C`) is kept too, so
//! zero-length messages still pair up. When `C` divides `N` (`r = 0`) this
//! is uniform scaling, `pos(j) = q·j`. A program written for `C = 0` has
//! nothing to scale and runs only at count 0.
//!
//! # Index alignment
//!
//! A step relates some pairs of slices element by element: copy src/dst,
//! reduce srcs/dst, recv-reduce src/dst, put/get local and remote slice,
//! get-reduce acc/src/dst, and a message's source with what receives it
//! (the `k`-th send on connection (sender, receiver, channel) with the
//! `k`-th receiving step on it, in program order). The program is
//! *index-aligned* when every such pair starts at the same within-block
//! offset (`off mod C`) and has the same length (two empty slices relate
//! nothing and always qualify). [`check_aligned`] decides it.
//!
//! # Why verification carries over (aligned programs, every `N`)
//!
//! Let `P` be aligned and verified at `C`, and `P_N = instantiate(P, N)`.
//!
//! 1. *Shape.* `pos(j + C) = pos(j) + N`, so the scaled length of `[a, a+l)`
//!    depends only on `a mod C` and `l`: aligned pairs keep equal lengths,
//!    and element `a+i` of one side and `a'+i` of the other (same
//!    residue) map to pieces of the same length, related offset by offset
//!    (`pos(a+i) + u ↔ pos(a'+i) + u`). `pos` is monotone: slices inside a
//!    buffer stay inside its scaled length (every buffer length the
//!    collective defines is a multiple of `C` and maps to the same multiple
//!    of `N`; scratch maps to `pos(L)`); disjoint slices stay disjoint and
//!    equal ones equal, so the verifier's overlap rules still hold. Peers
//!    and the no-write-to-input rule do not depend on the count. In place,
//!    input and output sit at multiples of `C` in the one buffer
//!    (`rank·C`, or 0), which map to the same multiples of `N`, so the
//!    aliasing is the image of the one at `C`.
//! 2. *Matching and deadlock freedom.* Every process runs the same steps in
//!    the same order with the same peers; the verifier's connections buffer
//!    a number of *messages* (not bytes), so the schedules of `P` and `P_N`
//!    correspond step for step. Matched messages have equal lengths by 1.
//! 3. *Result.* By induction over that common schedule: the value at
//!    element `pos(j) + u` of a buffer in `P_N` is the value at element `j`
//!    in `P` with every input index `i` replaced by `pos(i) + u`. It holds
//!    at the start (inputs hold their own elements; scratch and output are
//!    undefined), and every step relates pieces offset by offset (1), so it
//!    is preserved; in particular a residue-`k` element only ever holds
//!    indices of residue `k`, whose pieces have the same length, so `u`
//!    stays in range. Reductions meet the same contributor sets, so
//!    nothing is counted twice and no two different indices are reduced.
//!    The collective's expectations are block-structured: every expected
//!    range starts at a multiple of `C`, is `C` long and reads its
//!    contributors' inputs from a multiple of `C` (`base`); at `N` they are
//!    exactly the images. So every output element holds what it must, and
//!    no element is read before it is written.
//! 4. *Races.* Happens-before is built from signals, waits and messages,
//!    which are the same (2). An access in `P_N` is the image of one in
//!    `P`; two images overlap only if the originals overlap (monotone), so
//!    any unordered conflict in `P_N` is one in `P`. The same goes for
//!    touching a rank's buffers before it entered or after it returned.
//!
//! Without alignment, uniform scaling (`C | N`) still carries everything
//! over: it relates element `j` to `[q·j, q·j+q)` for every `j` alike. So
//! [`instantiate`] refuses a non-aligned program only at counts that are
//! not multiples of `C`, and says where it is not aligned.
//!
//! ```
//! use oxccl_algo::algos::{build, Algorithm};
//! use oxccl_algo::{scale, verify::verify, CollKind, Collective};
//! let p = build(Algorithm::Ring, &Collective::new(CollKind::AllReduce, 4, 8), &Default::default()).unwrap();
//! scale::check_aligned(&p).unwrap();
//! let big = scale::instantiate(&p, 1_000_003).unwrap();
//! assert_eq!(big.collective.count, 1_000_003);
//! verify(&big).unwrap();
//! ```

use crate::ir::{Program, Slice, Step};
use oxccl_core::{Error, Result};
use std::collections::HashMap;

/// The map from count `c` to count `n` (`c > 0`).
#[derive(Clone, Copy, Debug)]
struct Scaling {
    c: usize,
    n: usize,
    q: usize,
    r: usize,
}

impl Scaling {
    fn new(c: usize, n: usize) -> Scaling {
        Scaling { c, n, q: n / c, r: n % c }
    }

    /// `pos(j)`, `None` when it overflows.
    fn pos(&self, j: usize) -> Option<usize> {
        let (b, k) = (j / self.c, j % self.c);
        b.checked_mul(self.n)?.checked_add(k * self.q + k.min(self.r))
    }

    fn slice(&self, s: Slice) -> Option<Slice> {
        let start = self.pos(s.off)?;
        let end = self.pos(s.off.checked_add(s.len)?)?;
        Some(Slice::new(s.buf, start, end - start))
    }
}

/// An error's message without its kind.
fn message(e: Error) -> String {
    match e {
        Error::InvalidArgument(m) | Error::InvalidProgram(m) => m,
        other => other.to_string(),
    }
}

/// Where a step is, for messages: `rank 2 channel 0 step 5 (send …)`.
fn at(rank: usize, chan: usize, idx: usize, step: &Step) -> String {
    format!("rank {rank} channel {chan} step {idx} ({step})")
}

/// The same step with every slice passed through `f`.
fn map_step(step: &Step, f: &dyn Fn(Slice) -> Option<Slice>) -> Option<Step> {
    Some(match step {
        Step::Send { peer, src } => Step::Send { peer: *peer, src: f(*src)? },
        Step::Recv { peer, dst } => Step::Recv { peer: *peer, dst: f(*dst)? },
        Step::RecvReduce { peer, src, dst } => Step::RecvReduce { peer: *peer, src: f(*src)?, dst: f(*dst)? },
        Step::RecvReduceSend { recv, send, src } => Step::RecvReduceSend { recv: *recv, send: *send, src: f(*src)? },
        Step::RecvCopySend { recv, send, dst } => Step::RecvCopySend { recv: *recv, send: *send, dst: f(*dst)? },
        Step::RecvReduceCopySend { recv, send, src, dst } => {
            Step::RecvReduceCopySend { recv: *recv, send: *send, src: f(*src)?, dst: f(*dst)? }
        }
        Step::Copy { src, dst } => Step::Copy { src: f(*src)?, dst: f(*dst)? },
        Step::Reduce { srcs, dst } => {
            Step::Reduce { srcs: srcs.iter().map(|s| f(*s)).collect::<Option<_>>()?, dst: f(*dst)? }
        }
        Step::Put { peer, src, dst } => Step::Put { peer: *peer, src: f(*src)?, dst: f(*dst)? },
        Step::Get { peer, src, dst } => Step::Get { peer: *peer, src: f(*src)?, dst: f(*dst)? },
        Step::GetReduce { peer, src, acc, dst } => {
            Step::GetReduce { peer: *peer, src: f(*src)?, acc: f(*acc)?, dst: f(*dst)? }
        }
        Step::Signal { peer } => Step::Signal { peer: *peer },
        Step::Wait { peer } => Step::Wait { peer: *peer },
    })
}

/// The program `p` at `count` elements (see the module's doc for the
/// rule): same name, in-place claim and steps, the collective's count
/// replaced, every slice and scratch length scaled.
///
/// Errors: the collective at `count` is invalid (too big); `p` is written
/// for count 0 and `count` is not 0; `p` is not index-aligned and its
/// count does not divide `count` (the error names where it is not
/// aligned); a slice out of any buffer's range overflows when scaled.
pub fn instantiate(p: &Program, count: usize) -> Result<Program> {
    let c = p.collective.count;
    let mut coll = p.collective;
    coll.count = count;
    coll.validate().map_err(|e| Error::invalid(format!("{}: at count {count}: {}", p.name, message(e))))?;
    if c == 0 {
        if count == 0 {
            return Ok(p.clone());
        }
        return Err(Error::invalid(format!(
            "{}: written for count 0, it runs only at count 0, not {count}: write it for a positive count",
            p.name
        )));
    }
    if !count.is_multiple_of(c) {
        check_aligned(p).map_err(|e| {
            Error::invalid(format!(
                "{}; a program that is not index-aligned runs only at multiples of its count {c} (0, {c}, {}, …), not at {count}",
                message(e),
                2 * c
            ))
        })?;
    }
    let s = Scaling::new(c, count);
    let mut out = Program { name: p.name.clone(), collective: coll, in_place: p.in_place, ranks: Vec::new() };
    out.ranks.reserve(p.ranks.len());
    for (r, rp) in p.ranks.iter().enumerate() {
        let scratch = s.pos(rp.scratch).ok_or_else(|| {
            Error::invalid(format!(
                "{}: rank {r}'s scratch of {} elements overflows at count {count}",
                p.name, rp.scratch
            ))
        })?;
        let mut channels = Vec::with_capacity(rp.channels.len());
        for (ch, steps) in rp.channels.iter().enumerate() {
            let mapped = steps
                .iter()
                .enumerate()
                .map(|(i, step)| {
                    map_step(step, &|sl| s.slice(sl)).ok_or_else(|| {
                        Error::invalid(format!(
                            "{}: {}: a slice overflows at count {count} (is it outside its buffer?)",
                            p.name,
                            at(r, ch, i, step)
                        ))
                    })
                })
                .collect::<Result<Vec<Step>>>()?;
            channels.push(mapped);
        }
        out.ranks.push(crate::ir::RankProgram { scratch, channels });
    }
    Ok(out)
}

/// The pairs of slices `step` relates element by element, within the
/// step (the local and remote operands of one-sided steps included).
fn related(step: &Step) -> Vec<(Slice, Slice)> {
    match step {
        Step::Copy { src, dst }
        | Step::RecvReduce { src, dst, .. }
        | Step::RecvReduceCopySend { src, dst, .. }
        | Step::Put { src, dst, .. }
        | Step::Get { src, dst, .. } => vec![(*src, *dst)],
        Step::Reduce { srcs, dst } => srcs.iter().map(|s| (*s, *dst)).collect(),
        Step::GetReduce { src, acc, dst, .. } => vec![(*acc, *dst), (*src, *dst)],
        _ => vec![],
    }
}

/// The local slice the data a step sends comes from.
fn sent_slice(step: &Step) -> Option<Slice> {
    match step {
        Step::Send { src, .. } | Step::RecvReduceSend { src, .. } => Some(*src),
        Step::RecvCopySend { dst, .. } | Step::RecvReduceCopySend { dst, .. } => Some(*dst),
        _ => None,
    }
}

/// The local slice a received message is related to.
fn received_slice(step: &Step) -> Option<Slice> {
    match step {
        Step::Recv { dst, .. }
        | Step::RecvReduce { dst, .. }
        | Step::RecvCopySend { dst, .. }
        | Step::RecvReduceCopySend { dst, .. } => Some(*dst),
        Step::RecvReduceSend { src, .. } => Some(*src),
        _ => None,
    }
}

/// Why `a` and `b` are not index-aligned for count `c`, if they are not.
fn misaligned(c: usize, a: &Slice, b: &Slice) -> Option<String> {
    if a.len != b.len {
        return Some(format!("{a} and {b} differ in length ({} and {} elements)", a.len, b.len));
    }
    if a.len == 0 || c == 0 || a.off % c == b.off % c {
        return None;
    }
    Some(format!(
        "{a} and {b} start at different offsets within their blocks of {c} elements ({} and {})",
        a.off % c,
        b.off % c
    ))
}

/// Whether `p` is index-aligned (see the module's doc): `Ok`, or an
/// [`Error::InvalidProgram`] naming the rank, channel and step (and, for a
/// message, the sending step) and the two slices that are not aligned.
/// The first problem in (rank, channel, step) order is reported.
pub fn check_aligned(p: &Program) -> Result<()> {
    let c = p.collective.count;
    // The sending steps of every connection (sender, receiver, channel),
    // in program order.
    let mut sends: HashMap<(usize, usize, usize), Vec<(usize, Slice)>> = HashMap::new();
    for (r, rp) in p.ranks.iter().enumerate() {
        for (ch, steps) in rp.channels.iter().enumerate() {
            for (i, step) in steps.iter().enumerate() {
                if let (Some(to), Some(s)) = (step.send_peer(), sent_slice(step)) {
                    sends.entry((r, to, ch)).or_default().push((i, s));
                }
            }
        }
    }
    let mut received: HashMap<(usize, usize, usize), usize> = HashMap::new();
    for (r, rp) in p.ranks.iter().enumerate() {
        for (ch, steps) in rp.channels.iter().enumerate() {
            for (i, step) in steps.iter().enumerate() {
                let bad = |why: String| {
                    Error::program(format!("{}: {}: not index-aligned: {why}", p.name, at(r, ch, i, step)))
                };
                for (a, b) in related(step) {
                    if let Some(why) = misaligned(c, &a, &b) {
                        return Err(bad(why));
                    }
                }
                let (Some(from), Some(mine)) = (step.recv_peer(), received_slice(step)) else { continue };
                let k = received.entry((from, r, ch)).or_insert(0);
                let sent = sends.get(&(from, r, ch)).and_then(|v| v.get(*k));
                *k += 1;
                if let Some(&(j, theirs)) = sent
                    && let Some(why) = misaligned(c, &theirs, &mine)
                {
                    let src = &p.ranks[from].channels[ch][j];
                    return Err(bad(format!("the message it receives comes from {} and {why}", at(from, ch, j, src))));
                }
            }
        }
    }
    Ok(())
}

/// Whose buffers a rank's one-sided steps touch, and who touches its own.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OneSidedPeers {
    /// Peers whose buffers the rank's put, get and get-reduce steps touch
    /// (sorted, each once).
    pub accesses: Vec<usize>,
    /// Peers whose put, get and get-reduce steps touch the rank's buffers
    /// (sorted, each once).
    pub accessed_by: Vec<usize>,
}

/// [`one_sided_peers`] of every rank of `p`, in one pass over its steps
/// (what a process running many ranks wants: one call per rank would read
/// the whole program once per rank).
pub fn one_sided_peers_all(p: &Program) -> Vec<OneSidedPeers> {
    let mut out = vec![OneSidedPeers::default(); p.ranks.len()];
    for (r, rp) in p.ranks.iter().enumerate() {
        for step in rp.steps() {
            if let Step::Put { peer, .. } | Step::Get { peer, .. } | Step::GetReduce { peer, .. } = step {
                out[r].accesses.push(*peer);
                if *peer != r
                    && let Some(o) = out.get_mut(*peer)
                {
                    o.accessed_by.push(r);
                }
            }
        }
    }
    for o in &mut out {
        for v in [&mut o.accesses, &mut o.accessed_by] {
            v.sort_unstable();
            v.dedup();
        }
    }
    out
}

/// The peers `rank` exchanges buffer descriptors with for one-sided
/// access: those whose buffers it reads or writes, and those that read or
/// write its own. Signals and waits touch no buffer and do not count.
/// Empty lists for a rank the program does not have.
pub fn one_sided_peers(p: &Program, rank: usize) -> OneSidedPeers {
    let mut all = one_sided_peers_all(p);
    if rank < all.len() { all.swap_remove(rank) } else { OneSidedPeers::default() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CollKind, Collective};

    #[test]
    fn pos_cuts_blocks_into_balanced_contiguous_pieces() {
        // C = 4, N = 10: q = 2, r = 2 → pieces 3, 3, 2, 2.
        let s = Scaling::new(4, 10);
        let starts: Vec<usize> = (0..=8).map(|j| s.pos(j).unwrap()).collect();
        assert_eq!(starts, [0, 3, 6, 8, 10, 13, 16, 18, 20]);
        // Multiples: uniform scaling.
        let u = Scaling::new(4, 12);
        assert!((0..40).all(|j| u.pos(j) == Some(3 * j)));
        // N < C: some pieces are empty.
        let z = Scaling::new(5, 2);
        assert_eq!((0..=5).map(|j| z.pos(j).unwrap()).collect::<Vec<_>>(), [0, 1, 2, 2, 2, 2]);
        assert_eq!(Scaling::new(3, usize::MAX / 2).pos(usize::MAX - 1), None);
    }

    #[test]
    fn one_sided_peers_lists_both_directions() {
        let mut p = Program::new("t", Collective::new(CollKind::AllReduce, 4, 4));
        p.push(0, 0, Step::Get { peer: 2, src: Slice::input(0, 4), dst: Slice::output(0, 4) });
        p.push(0, 0, Step::Signal { peer: 3 });
        p.push(1, 0, Step::Put { peer: 0, src: Slice::input(0, 4), dst: Slice::output(0, 4) });
        p.push(
            3,
            1,
            Step::GetReduce { peer: 0, src: Slice::input(0, 4), acc: Slice::output(0, 4), dst: Slice::output(0, 4) },
        );
        p.push(3, 0, Step::Get { peer: 2, src: Slice::input(0, 4), dst: Slice::output(0, 4) });
        p.push(3, 0, Step::Get { peer: 2, src: Slice::input(0, 4), dst: Slice::output(0, 4) });
        assert_eq!(one_sided_peers(&p, 0), OneSidedPeers { accesses: vec![2], accessed_by: vec![1, 3] });
        assert_eq!(one_sided_peers(&p, 2), OneSidedPeers { accesses: vec![], accessed_by: vec![0, 3] });
        assert_eq!(one_sided_peers(&p, 3), OneSidedPeers { accesses: vec![0, 2], accessed_by: vec![] });
        assert_eq!(one_sided_peers(&p, 9), OneSidedPeers::default());
    }
}
