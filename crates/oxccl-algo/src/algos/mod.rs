//! The algorithms: each turns a [`Collective`] into a [`Program`].
//!
//! | algorithm  | collectives |
//! |------------|-------------|
//! | `ring`     | all-reduce, reduce-scatter, all-gather; broadcast and reduce as a pipelined chain |
//! | `tree`     | all-reduce (NCCL's double binary tree; over hosts, a chain through each host joined by the trees); broadcast and reduce (binary tree) |
//! | `rhd`      | all-reduce (Rabenseifner), reduce-scatter (recursive halving), all-gather (recursive doubling) |
//! | `doubling` | all-reduce: recursive doubling of the whole buffer (fewest messages, for small ones) |
//! | `oneshot`  | all-reduce: every rank reads every peer's whole input |
//! | `twoshot`  | all-reduce: reduce-scatter then all-gather by direct reads |
//! | `direct`   | reduce-scatter, all-gather, all-to-all, broadcast, reduce, gather, scatter over one-sided access; send/recv |
//! | `pairwise` | all-to-all: n-1 rounds of pairwise exchange |
//! | `linear`   | gather, scatter: the root talks to every rank; all-to-all: every rank sends every block at once, then receives (groups of 8 peers) |
//! | `hier`     | all-reduce, reduce-scatter, all-gather: inside hosts, then between the ranks of one local index across hosts (rail-aligned), then inside hosts ([`Placement`]) |
//! | `bruck`    | all-gather, reduce-scatter in `⌈log2 n⌉` messages per rank (Bruck's rotation; for latency-bound sizes on many ranks) |
//! | `ordered`  | all-reduce, reduce-scatter, reduce in the canonical order ([`crate::canon`]) for any rank count: each block's owner reduces every rank's piece in the tree, then sends it on |
//!
//! Rings and chains follow the hosts ([`Placement::ring`]): built with
//! [`build_on`], they visit each host's ranks contiguously whatever the
//! numbering; [`build`] places every rank on one host.
//!
//! All of them work for any number of ranks (powers of two or not), any
//! count (0, 1, counts that do not divide by the rank count) and any root.
//! Zero-length pieces generate no steps.
//!
//! Each is described by its entry in [`TABLE`] (name, aliases,
//! collectives, builder, cost model); everything here that enumerates
//! algorithms reads the table.

mod bruck;
mod direct;
mod hier;
mod ordered;
mod rhd;
mod ring;
mod rooted;
mod table;
mod tree;

pub use ordered::weighted as ordered_block;
pub use rooted::LINEAR_GROUP;
pub use table::{AlgoSpec, Builder, CostModel, NCCL_ONLY, TABLE};
pub use tree::{TreeLinks, btree, dtree, host_tree};

use crate::collective::{CollKind, Collective};
use crate::ir::Program;
use crate::placement::Placement;
use oxccl_core::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A collective algorithm: the key of its entry in [`TABLE`] (in the same
/// order, checked when the crate compiles).
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
    /// The root exchanges with every rank (all-to-all: every rank with
    /// every rank at once).
    Linear,
    /// Hierarchical: inside hosts, across them rail by rail, inside again.
    Hier,
    /// Bruck's all-gather and its dual reduce-scatter: `⌈log2 n⌉` messages.
    Bruck,
    /// Reductions in the canonical order, over messages.
    Ordered,
}

impl Algorithm {
    /// Every algorithm, in [`TABLE`]'s order.
    pub const ALL: [Algorithm; TABLE.len()] = table::all();

    /// Its entry in [`TABLE`].
    pub const fn spec(self) -> &'static AlgoSpec {
        &TABLE[self as usize]
    }

    /// The name used on command lines and in `OXCCL_ALGO`.
    pub const fn name(self) -> &'static str {
        self.spec().name
    }

    /// The collectives this algorithm implements.
    pub fn kinds(self) -> &'static [CollKind] {
        self.spec().collectives
    }

    /// Whether this algorithm implements `kind`.
    pub fn supports(self, kind: CollKind) -> bool {
        self.kinds().contains(&kind)
    }

    /// Whether its programs use one-sided access, so that the tuner prices
    /// it with the providers' one-sided links.
    pub fn one_sided(self) -> bool {
        self.spec().one_sided
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
    /// An algorithm by its name or one of its aliases, in any case.
    fn from_str(s: &str) -> Result<Algorithm> {
        let key = s.trim().to_ascii_lowercase();
        let found = TABLE.iter().find(|e| e.name == key || e.aliases.contains(&key.as_str()));
        found.map(|e| e.algorithm).ok_or_else(|| {
            let names: Vec<&str> = TABLE.iter().map(|e| e.name).collect();
            Error::invalid(format!("unknown algorithm {s:?}; expected one of {}", names.join(" ")))
        })
    }
}

/// Whether `name` is one of NCCL's algorithms that oxccl does not have
/// ([`NCCL_ONLY`], in any case).
pub fn is_nccl_only(name: &str) -> bool {
    NCCL_ONLY.contains(&name.trim().to_ascii_lowercase().as_str())
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
    build_on(algo, coll, opts, &Placement::flat(coll.nranks))
}

/// [`build`] for ranks placed on hosts as `placement` says: rings follow
/// the hosts, hierarchical algorithms use them. An error also when the
/// placement has another number of ranks.
pub fn build_on(algo: Algorithm, coll: &Collective, opts: &BuildOptions, placement: &Placement) -> Result<Program> {
    let mut p = Program::new(algo.name(), *coll);
    build_into_on(algo, coll, opts, placement, &mut p)?;
    Ok(p)
}

/// [`build`] into an existing program, reusing its allocations (a sweep
/// over sizes builds programs of millions of steps one after another).
/// On error the program is left as it was.
pub fn build_into(algo: Algorithm, coll: &Collective, opts: &BuildOptions, program: &mut Program) -> Result<()> {
    build_into_on(algo, coll, opts, &Placement::flat(coll.nranks), program)
}

/// [`build_into`] on a placement ([`build_on`]).
pub fn build_into_on(
    algo: Algorithm,
    coll: &Collective,
    opts: &BuildOptions,
    placement: &Placement,
    program: &mut Program,
) -> Result<()> {
    coll.validate()?;
    if placement.nranks() != coll.nranks {
        return Err(Error::invalid(format!(
            "{coll} has {} ranks; the placement ({placement}) has {}",
            coll.nranks,
            placement.nranks()
        )));
    }
    if !algo.supports(coll.kind) {
        let have: Vec<&str> = Algorithm::for_kind(coll.kind).iter().map(|a| a.name()).collect();
        return Err(Error::invalid(format!(
            "algorithm {algo} does not implement {}; {} has: {}",
            coll.kind,
            coll.kind,
            have.join(" ")
        )));
    }
    (algo.spec().build)(program, *coll, opts, placement);
    program.trim();
    Ok(())
}

/// A quick closed-form guess of `algo`'s time for `coll` on `topo`, every
/// hop priced as the topology's [`bottleneck`](crate::cost::Topology::bottleneck) link:
/// the algorithm's cost model ([`AlgoSpec::cost`](AlgoSpec::cost),
/// in [`models`](crate::cost::models)); `Some` for every pair [`build`]
/// accepts, `None` for the others. A first guess for a tuner, not the
/// simulator: it ignores NIC sharing and the placement of ranks. The
/// direct algorithms, pairwise and linear follow the simulator's schedule
/// on one node (see [`one_shot_all_reduce`](crate::cost::one_shot_all_reduce) and the functions after it),
/// local copies priced at the topology's [`copy_cost`](crate::cost::Topology::copy_cost).
pub fn estimate(algo: Algorithm, coll: &Collective, topo: &crate::cost::Topology) -> Option<f64> {
    if !algo.supports(coll.kind) {
        return None;
    }
    (algo.spec().cost)(coll.kind, &crate::cost::Terms::of(coll, topo))
}
