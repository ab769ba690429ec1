//! The algorithms: each turns a [`Collective`] into a [`Program`].
//!
//! | algorithm  | collectives |
//! |------------|-------------|
//! | `ring`     | all-reduce, reduce-scatter, all-gather; broadcast and reduce as a pipelined chain |
//! | `tree`     | all-reduce (NCCL's double binary tree); broadcast and reduce (binary tree) |
//! | `rhd`      | all-reduce (Rabenseifner), reduce-scatter (recursive halving), all-gather (recursive doubling) |
//! | `doubling` | all-reduce: recursive doubling of the whole buffer (fewest messages, for small ones) |
//! | `oneshot`  | all-reduce: every rank reads every peer's whole input |
//! | `twoshot`  | all-reduce: reduce-scatter then all-gather by direct reads |
//! | `direct`   | reduce-scatter, all-gather, all-to-all, broadcast, reduce, gather, scatter over one-sided access; send/recv |
//! | `pairwise` | all-to-all: n-1 rounds of pairwise exchange |
//! | `linear`   | gather, scatter: the root talks to every rank |
//!
//! All of them work for any number of ranks (powers of two or not), any
//! count (0, 1, counts that do not divide by the rank count) and any root.
//! Zero-length pieces generate no steps.

mod direct;
mod rhd;
mod ring;
mod rooted;
mod tree;

pub use tree::{TreeLinks, btree, dtree};

use crate::collective::{CollKind, Collective};
use crate::ir::Program;
use oxccl_core::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A collective algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// Ring (pipelined chain for rooted collectives).
    Ring,
    /// Double binary tree (binary tree for rooted collectives).
    Tree,
    /// Recursive halving / doubling.
    Rhd,
    /// Recursive doubling of whole buffers (all-reduce).
    Doubling,
    /// Direct one-shot all-reduce.
    OneShot,
    /// Direct two-shot all-reduce.
    TwoShot,
    /// Direct one-sided access (or plain send/recv).
    Direct,
    /// Pairwise exchange all-to-all.
    Pairwise,
    /// The root exchanges with every rank.
    Linear,
}

impl Algorithm {
    /// Every algorithm.
    pub const ALL: [Algorithm; 9] = [
        Algorithm::Ring,
        Algorithm::Tree,
        Algorithm::Rhd,
        Algorithm::Doubling,
        Algorithm::OneShot,
        Algorithm::TwoShot,
        Algorithm::Direct,
        Algorithm::Pairwise,
        Algorithm::Linear,
    ];

    /// The name used on command lines and in `OXCCL_ALGO`.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::Tree => "tree",
            Algorithm::Rhd => "rhd",
            Algorithm::Doubling => "doubling",
            Algorithm::OneShot => "oneshot",
            Algorithm::TwoShot => "twoshot",
            Algorithm::Direct => "direct",
            Algorithm::Pairwise => "pairwise",
            Algorithm::Linear => "linear",
        }
    }

    /// The collectives this algorithm implements.
    pub fn kinds(self) -> &'static [CollKind] {
        use CollKind::*;
        match self {
            Algorithm::Ring => &[AllReduce, ReduceScatter, AllGather, Broadcast, Reduce],
            Algorithm::Tree => &[AllReduce, Broadcast, Reduce],
            Algorithm::Rhd => &[AllReduce, ReduceScatter, AllGather],
            Algorithm::Doubling | Algorithm::OneShot | Algorithm::TwoShot => &[AllReduce],
            Algorithm::Direct => &[ReduceScatter, AllGather, AllToAll, Broadcast, Reduce, Gather, Scatter, SendRecv],
            Algorithm::Pairwise => &[AllToAll],
            Algorithm::Linear => &[Gather, Scatter],
        }
    }

    /// Whether this algorithm implements `kind`.
    pub fn supports(self, kind: CollKind) -> bool {
        self.kinds().contains(&kind)
    }

    /// The algorithms that implement `kind`.
    pub fn for_kind(kind: CollKind) -> Vec<Algorithm> {
        Algorithm::ALL.into_iter().filter(|a| a.supports(kind)).collect()
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = Error;
    fn from_str(s: &str) -> Result<Algorithm> {
        let key = s.trim().to_ascii_lowercase();
        let alias = match key.as_str() {
            "halving_doubling" | "rabenseifner" | "recursive" => "rhd",
            "one_shot" => "oneshot",
            "two_shot" => "twoshot",
            "recursive_doubling" | "rd" => "doubling",
            "chain" => "ring",
            other => other,
        };
        Algorithm::ALL.into_iter().find(|a| a.name() == alias).ok_or_else(|| {
            Error::invalid(format!(
                "unknown algorithm {s:?}; expected one of ring tree rhd doubling oneshot twoshot direct pairwise linear"
            ))
        })
    }
}

/// Knobs of program generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildOptions {
    /// Largest pipeline chunk, in bytes: pipelined algorithms (ring,
    /// tree, chain) cut every slice they move into pieces of at most this
    /// size so several are in flight per peer. The default, 2 MiB, is
    /// NCCL's chunk for its simple protocol (a 4 MiB buffer in 8 steps, 4
    /// steps a chunk).
    pub chunk_bytes: usize,
    /// At most this many chunks per pipelined slice: for big buffers the
    /// chunk grows instead, bounding the program's size.
    pub max_chunks: usize,
}

impl Default for BuildOptions {
    fn default() -> BuildOptions {
        BuildOptions { chunk_bytes: 2 << 20, max_chunks: 64 }
    }
}

impl BuildOptions {
    /// Into how many pipeline chunks a `len`-element slice is cut.
    pub fn chunking(&self, len: usize, elem_size: usize) -> usize {
        let by_size = len.saturating_mul(elem_size).div_ceil(self.chunk_bytes.max(1));
        by_size.clamp(1, self.max_chunks.max(1))
    }
}

/// Appends `copy src → dst` to rank `r`'s channel 0, unless it is empty.
fn copy_nonempty(p: &mut Program, r: usize, src: crate::ir::Slice, dst: crate::ir::Slice) {
    if src.len > 0 {
        p.push(r, 0, crate::ir::Step::Copy { src, dst });
    }
}

/// Builds `algo`'s program for `coll`, or an error naming why it cannot
/// (the algorithm does not implement that collective, or the collective's
/// description is invalid).
pub fn build(algo: Algorithm, coll: &Collective, opts: &BuildOptions) -> Result<Program> {
    let mut p = Program::new(algo.name(), *coll);
    build_into(algo, coll, opts, &mut p)?;
    Ok(p)
}

/// [`build`] into an existing program, reusing its allocations (a sweep
/// over sizes builds programs of millions of steps one after another).
/// On error the program is left as it was.
pub fn build_into(algo: Algorithm, coll: &Collective, opts: &BuildOptions, program: &mut Program) -> Result<()> {
    coll.validate()?;
    if !algo.supports(coll.kind) {
        let have: Vec<&str> = Algorithm::for_kind(coll.kind).iter().map(|a| a.name()).collect();
        return Err(Error::invalid(format!(
            "algorithm {algo} does not implement {}; {} has: {}",
            coll.kind,
            coll.kind,
            have.join(" ")
        )));
    }
    let c = *coll;
    let p = program;
    match (algo, coll.kind) {
        (Algorithm::Ring, CollKind::AllReduce) => ring::all_reduce(p, c, opts),
        (Algorithm::Ring, CollKind::ReduceScatter) => ring::reduce_scatter(p, c, opts),
        (Algorithm::Ring, CollKind::AllGather) => ring::all_gather(p, c, opts),
        (Algorithm::Ring, CollKind::Broadcast) => rooted::chain_broadcast(p, c, opts),
        (Algorithm::Ring, CollKind::Reduce) => rooted::chain_reduce(p, c, opts),
        (Algorithm::Tree, CollKind::AllReduce) => tree::all_reduce(p, c, opts),
        (Algorithm::Tree, CollKind::Broadcast) => rooted::tree_broadcast(p, c, opts),
        (Algorithm::Tree, CollKind::Reduce) => rooted::tree_reduce(p, c, opts),
        (Algorithm::Rhd, CollKind::AllReduce) => rhd::all_reduce(p, c),
        (Algorithm::Rhd, CollKind::ReduceScatter) => rhd::reduce_scatter(p, c),
        (Algorithm::Rhd, CollKind::AllGather) => rhd::all_gather(p, c),
        (Algorithm::Doubling, _) => rhd::all_reduce_doubling(p, c),
        (Algorithm::OneShot, _) => direct::one_shot(p, c),
        (Algorithm::TwoShot, _) => direct::two_shot(p, c),
        (Algorithm::Direct, CollKind::ReduceScatter) => direct::reduce_scatter(p, c),
        (Algorithm::Direct, CollKind::AllGather) => direct::all_gather(p, c),
        (Algorithm::Direct, CollKind::AllToAll) => direct::all_to_all(p, c),
        (Algorithm::Direct, CollKind::Broadcast) => direct::broadcast(p, c),
        (Algorithm::Direct, CollKind::Reduce) => direct::reduce(p, c),
        (Algorithm::Direct, CollKind::Gather) => direct::gather(p, c),
        (Algorithm::Direct, CollKind::Scatter) => direct::scatter(p, c),
        (Algorithm::Direct, CollKind::SendRecv) => rooted::send_recv(p, c),
        (Algorithm::Pairwise, _) => rooted::pairwise_all_to_all(p, c),
        (Algorithm::Linear, CollKind::Gather) => rooted::gather(p, c),
        (Algorithm::Linear, CollKind::Scatter) => rooted::scatter(p, c),
        _ => unreachable!("supports() and this table disagree on {algo} {}", coll.kind),
    }
    p.trim();
    Ok(())
}
