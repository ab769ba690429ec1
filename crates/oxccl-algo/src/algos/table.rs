//! The algorithm table: one [`AlgoSpec`] per [`Algorithm`], in the enum's
//! order. Everything that enumerates algorithms reads it: names and
//! aliases ([`Algorithm::from_str`](std::str::FromStr)), the collectives
//! each builds ([`Algorithm::kinds`]), its builder ([`build`](super::build)),
//! its closed-form cost ([`estimate`](super::estimate)) and which
//! links the tuner prices it with ([`Algorithm::one_sided`]).
//!
//! Adding an algorithm: a variant of [`Algorithm`], its entry at the same
//! place in [`TABLE`] (a compile-time check keeps the two in order), its
//! builder below (the functions it calls live in the module of its
//! family), and its cost in [`crate::cost::models`]. The table's tests
//! (tests/algo/table.rs) then build, verify and price every collective it
//! lists; docs/EXTENDING.md has the whole checklist.

use super::{Algorithm, BuildOptions, bruck, direct, hier, ordered, rhd, ring, rooted, tree};
use crate::collective::{CollKind, Collective};
use crate::cost::{Terms, models};
use crate::ir::Program;
use crate::placement::Placement;

/// Writes an algorithm's program for `c` into `p`, which it first resets
/// ([`Program::reset`], under the algorithm's name); `c` is valid and its
/// kind one of the entry's collectives; the placement has its rank count.
pub type Builder = fn(&mut Program, Collective, &BuildOptions, &Placement);

/// An algorithm's closed-form time in seconds for a collective, from the
/// collective's [`Terms`]; `None` for a collective it does not build.
pub type CostModel = fn(CollKind, &Terms) -> Option<f64>;

/// One algorithm: what the rest of oxccl knows of it.
#[derive(Clone, Copy, Debug)]
pub struct AlgoSpec {
    /// The variant this entry describes.
    pub algorithm: Algorithm,
    /// Its name on command lines, in `OXCCL_ALGO` / `NCCL_ALGO` and in
    /// programs it builds (lowercase).
    pub name: &'static str,
    /// Other names `OXCCL_ALGO` / `NCCL_ALGO` accept for it (lowercase;
    /// NCCL's grammar is case-insensitive).
    pub aliases: &'static [&'static str],
    /// The collectives it builds.
    pub collectives: &'static [CollKind],
    /// Whether the tuner prices it with the providers' one-sided links
    /// (its programs read or write peers' buffers) rather than their FIFOs.
    pub one_sided: bool,
    /// Its program for one of [`collectives`](AlgoSpec::collectives).
    pub build: Builder,
    /// Its cost model (the tuner's first guess; the simulator prices
    /// programs exactly).
    pub cost: CostModel,
}

use CollKind::*;

/// Every algorithm, in [`Algorithm`]'s order.
pub const TABLE: &[AlgoSpec] = &[
    AlgoSpec {
        algorithm: Algorithm::Ring,
        name: "ring",
        aliases: &["chain"],
        collectives: &[AllReduce, ReduceScatter, AllGather, Broadcast, Reduce],
        one_sided: false,
        build: build_ring,
        cost: models::ring,
    },
    AlgoSpec {
        algorithm: Algorithm::Tree,
        name: "tree",
        aliases: &[],
        collectives: &[AllReduce, Broadcast, Reduce],
        one_sided: false,
        build: build_tree,
        cost: models::tree,
    },
    AlgoSpec {
        algorithm: Algorithm::Rhd,
        name: "rhd",
        aliases: &["halving_doubling", "rabenseifner", "recursive"],
        collectives: &[AllReduce, ReduceScatter, AllGather],
        one_sided: false,
        build: build_rhd,
        cost: models::rhd,
    },
    AlgoSpec {
        algorithm: Algorithm::Doubling,
        name: "doubling",
        aliases: &["recursive_doubling", "rd"],
        collectives: &[AllReduce],
        one_sided: false,
        build: |p, c, _, _| rhd::all_reduce_doubling(p, c),
        cost: models::doubling,
    },
    AlgoSpec {
        algorithm: Algorithm::OneShot,
        name: "oneshot",
        aliases: &["one_shot"],
        collectives: &[AllReduce],
        one_sided: true,
        build: |p, c, _, _| direct::one_shot(p, c),
        cost: models::one_shot,
    },
    AlgoSpec {
        algorithm: Algorithm::TwoShot,
        name: "twoshot",
        aliases: &["two_shot"],
        collectives: &[AllReduce],
        one_sided: true,
        build: |p, c, _, _| direct::two_shot(p, c),
        cost: models::two_shot,
    },
    AlgoSpec {
        algorithm: Algorithm::Direct,
        name: "direct",
        aliases: &[],
        collectives: &[ReduceScatter, AllGather, AllToAll, Broadcast, Reduce, Gather, Scatter, SendRecv],
        one_sided: true,
        build: build_direct,
        cost: models::direct,
    },
    AlgoSpec {
        algorithm: Algorithm::Pairwise,
        name: "pairwise",
        aliases: &[],
        collectives: &[AllToAll],
        one_sided: false,
        build: |p, c, _, _| rooted::pairwise_all_to_all(p, c),
        cost: models::pairwise,
    },
    AlgoSpec {
        algorithm: Algorithm::Linear,
        name: "linear",
        aliases: &[],
        collectives: &[Gather, Scatter, AllToAll],
        one_sided: false,
        build: build_linear,
        cost: models::linear,
    },
    AlgoSpec {
        algorithm: Algorithm::Hier,
        name: "hier",
        aliases: &["hierarchical", "2d"],
        collectives: &[AllReduce, ReduceScatter, AllGather, AllToAll],
        one_sided: false,
        build: build_hier,
        cost: models::hier,
    },
    AlgoSpec {
        algorithm: Algorithm::Bruck,
        name: "bruck",
        aliases: &["log"],
        collectives: &[ReduceScatter, AllGather],
        one_sided: false,
        build: build_bruck,
        cost: models::bruck,
    },
    AlgoSpec {
        algorithm: Algorithm::Ordered,
        name: "ordered",
        aliases: &["canonical", "deterministic"],
        collectives: &[AllReduce, ReduceScatter, Reduce],
        one_sided: false,
        build: build_ordered,
        cost: models::ordered,
    },
];

/// Names of NCCL's algorithms that oxccl does not have: `OXCCL_ALGO` /
/// `NCCL_ALGO` ignore them with a warning (a list written for NCCL still
/// runs).
pub const NCCL_ONLY: &[&str] = &["collnet", "collnetdirect", "collnetchain", "nvls", "nvlstree", "pat"];

// The table is indexed by the enum's discriminant.
const _: () = {
    let mut i = 0;
    while i < TABLE.len() {
        assert!(TABLE[i].algorithm as usize == i, "TABLE is not in Algorithm's order");
        i += 1;
    }
};

/// [`Algorithm::ALL`]: the table's algorithms, in order.
pub(super) const fn all() -> [Algorithm; TABLE.len()] {
    let mut out = [Algorithm::Ring; TABLE.len()];
    let mut i = 0;
    while i < TABLE.len() {
        out[i] = TABLE[i].algorithm;
        i += 1;
    }
    out
}

/// A builder reached with a collective its entry does not list (build
/// checks the list first): the entry and its builder disagree.
fn unlisted(algo: &str, kind: CollKind) -> ! {
    unreachable!("the table lists {kind} for {algo}, but its builder has no program for it")
}

fn build_ring(p: &mut Program, c: Collective, o: &BuildOptions, at: &Placement) {
    match c.kind {
        AllReduce => ring::all_reduce(p, c, o, at),
        ReduceScatter => ring::reduce_scatter(p, c, o, at),
        AllGather => ring::all_gather(p, c, o, at),
        Broadcast => rooted::chain_broadcast(p, c, o, at),
        Reduce => rooted::chain_reduce(p, c, o, at),
        k => unlisted("ring", k),
    }
}

fn build_tree(p: &mut Program, c: Collective, o: &BuildOptions, at: &Placement) {
    match c.kind {
        AllReduce => tree::all_reduce(p, c, o, at),
        Broadcast => rooted::tree_broadcast(p, c, o),
        Reduce => rooted::tree_reduce(p, c, o),
        k => unlisted("tree", k),
    }
}

fn build_rhd(p: &mut Program, c: Collective, _: &BuildOptions, _: &Placement) {
    match c.kind {
        AllReduce => rhd::all_reduce(p, c),
        ReduceScatter => rhd::reduce_scatter(p, c),
        AllGather => rhd::all_gather(p, c),
        k => unlisted("rhd", k),
    }
}

fn build_direct(p: &mut Program, c: Collective, _: &BuildOptions, _: &Placement) {
    match c.kind {
        ReduceScatter => direct::reduce_scatter(p, c),
        AllGather => direct::all_gather(p, c),
        AllToAll => direct::all_to_all(p, c),
        Broadcast => direct::broadcast(p, c),
        Reduce => direct::reduce(p, c),
        Gather => direct::gather(p, c),
        Scatter => direct::scatter(p, c),
        SendRecv => rooted::send_recv(p, c),
        k => unlisted("direct", k),
    }
}

fn build_linear(p: &mut Program, c: Collective, _: &BuildOptions, _: &Placement) {
    match c.kind {
        Gather => rooted::gather(p, c),
        Scatter => rooted::scatter(p, c),
        AllToAll => rooted::linear_all_to_all(p, c),
        k => unlisted("linear", k),
    }
}

fn build_hier(p: &mut Program, c: Collective, o: &BuildOptions, at: &Placement) {
    match c.kind {
        AllReduce => hier::all_reduce(p, c, o, at),
        ReduceScatter => hier::reduce_scatter(p, c, o, at),
        AllGather => hier::all_gather(p, c, o, at),
        AllToAll => hier::all_to_all(p, c, at),
        k => unlisted("hier", k),
    }
}

fn build_bruck(p: &mut Program, c: Collective, o: &BuildOptions, _: &Placement) {
    match c.kind {
        ReduceScatter => bruck::reduce_scatter(p, c, o),
        AllGather => bruck::all_gather(p, c, o),
        k => unlisted("bruck", k),
    }
}

fn build_ordered(p: &mut Program, c: Collective, o: &BuildOptions, _: &Placement) {
    match c.kind {
        AllReduce => ordered::all_reduce(p, c, o),
        ReduceScatter => ordered::reduce_scatter(p, c, o),
        Reduce => ordered::reduce(p, c, o),
        k => unlisted("ordered", k),
    }
}
