//! The tuner: which algorithm and chunk size for a collective, from the
//! cost model with parameters per transport, unless `OXCCL_ALGO` says.
//!
//! `OXCCL_ALGO` (and `NCCL_ALGO` through the C ABI) takes NCCL's grammar:
//! a comma-separated list of algorithms (`ring,tree`), a list to exclude
//! (`^tree`), or per-collective lists separated by semicolons
//! (`allreduce:tree;broadcast:ring`). Names of NCCL algorithms oxccl does
//! not have (`collnet`, `nvls`, `pat`, …) are ignored with a warning.

use oxccl_algo::algos::Algorithm;
use oxccl_algo::collective::{CollKind, Collective};
use oxccl_algo::cost::{self, Link, Topology};
use oxccl_core::{Error, Result};
use oxccl_transport::Kind;
use std::collections::HashMap;

/// Link parameters per transport, from measurements on a 2-core x86 host
/// (README's table): bandwidth in bytes/s, latency in seconds.
pub fn link_of(kind: Kind) -> Link {
    match kind {
        Kind::Mem => Link { bw: 8e9, lat: 2e-6 },
        Kind::Shm => Link { bw: 5e9, lat: 5e-6 },
        Kind::Tcp => Link { bw: 1.5e9, lat: 40e-6 },
    }
}

/// Bytes per second a host core reduces (about what it copies): whole-buffer
/// algorithms (recursive doubling) pay for reducing everything on every
/// rank, which only small messages can afford.
const HOST_REDUCE_BW: f64 = 10e9;

/// Algorithms the host executor runs: those whose programs are two-sided
/// (`oneshot`, `twoshot` and `direct` read and write peers' buffers, which
/// needs the one-sided transports of the GPU path).
const HOST_ALGOS: [Algorithm; 6] =
    [Algorithm::Ring, Algorithm::Tree, Algorithm::Rhd, Algorithm::Doubling, Algorithm::Pairwise, Algorithm::Linear];

/// Which algorithms each collective may use.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AlgoFilter {
    /// For all collectives without an entry of their own: allowed set.
    all: Option<(bool, Vec<Algorithm>)>,
    per: HashMap<CollKind, (bool, Vec<Algorithm>)>,
}

fn kind_key(s: &str) -> Option<CollKind> {
    let k: String = s.chars().filter(|c| c.is_ascii_alphanumeric()).collect::<String>().to_ascii_lowercase();
    CollKind::ALL.into_iter().find(|c| c.name().replace('_', "") == k)
}

impl AlgoFilter {
    /// Parses NCCL's `NCCL_ALGO` grammar.
    pub fn parse(text: &str) -> Result<AlgoFilter> {
        let mut f = AlgoFilter::default();
        for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (kinds, list) = match part.split_once(':') {
                Some((k, l)) => {
                    let kinds = k
                        .split(',')
                        .map(|k| {
                            kind_key(k.trim()).ok_or_else(|| {
                                Error::invalid(format!("OXCCL_ALGO={text:?}: unknown collective {:?}", k.trim()))
                            })
                        })
                        .collect::<Result<Vec<_>>>()?;
                    (Some(kinds), l)
                }
                None => (None, part),
            };
            let (negate, list) = match list.trim().strip_prefix('^') {
                Some(rest) => (true, rest),
                None => (false, list.trim()),
            };
            let mut algos = Vec::new();
            for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                match name.parse::<Algorithm>() {
                    Ok(a) => algos.push(a),
                    Err(_)
                        if ["collnet", "collnetdirect", "collnetchain", "nvls", "nvlstree", "pat"]
                            .contains(&name.to_ascii_lowercase().as_str()) =>
                    {
                        tracing::warn!("OXCCL_ALGO: oxccl has no {name} algorithm; ignored");
                    }
                    Err(e) => return Err(Error::invalid(format!("OXCCL_ALGO={text:?}: {e}"))),
                }
            }
            match kinds {
                None => f.all = Some((negate, algos)),
                Some(ks) => {
                    for k in ks {
                        f.per.insert(k, (negate, algos.clone()));
                    }
                }
            }
        }
        Ok(f)
    }

    /// Whether `algo` may run `kind`.
    pub fn allows(&self, kind: CollKind, algo: Algorithm) -> bool {
        match self.per.get(&kind).or(self.all.as_ref()) {
            None => true,
            Some((negate, list)) => list.contains(&algo) != *negate,
        }
    }
}

/// Picks algorithms for one communicator.
#[derive(Clone, Debug)]
pub struct Tuner {
    topo: Topology,
    filter: AlgoFilter,
    /// FIFO capacity of the slowest connection kind: chunks must fit twice.
    fifo: usize,
}

impl Tuner {
    /// A tuner for ranks spread over `nodes` hosts with `per_node` ranks each
    /// (1 host per rank when uneven), linked by `intra` inside a host and
    /// `inter` between hosts.
    pub fn new(nodes: usize, per_node: usize, intra: Kind, inter: Kind, filter: AlgoFilter, fifo: usize) -> Tuner {
        let topo =
            Topology::new(nodes.max(1), per_node.max(1), link_of(intra), link_of(inter)).with_reduce_bw(HOST_REDUCE_BW);
        Tuner { topo, filter, fifo }
    }

    /// Whether the filter lets `algo` run `kind`.
    pub fn allows(&self, kind: CollKind, algo: Algorithm) -> bool {
        self.filter.allows(kind, algo)
    }

    /// The algorithm for `coll`, or an error when the filter leaves none.
    /// A list for all collectives (`OXCCL_ALGO=tree`) applies to those it
    /// names an algorithm of; the others keep every algorithm (a tree-only
    /// run still needs its all-gathers). A list for one collective
    /// (`allgather:tree`) is strict.
    pub fn pick(&self, coll: &Collective) -> Result<Algorithm> {
        let supported = || HOST_ALGOS.into_iter().filter(|a| a.supports(coll.kind));
        let mut allowed: Vec<Algorithm> = supported().filter(|a| self.filter.allows(coll.kind, *a)).collect();
        if allowed.is_empty() && !self.filter.per.contains_key(&coll.kind) {
            allowed = supported().collect();
        }
        if allowed.is_empty() {
            let have: Vec<&str> =
                HOST_ALGOS.into_iter().filter(|a| a.supports(coll.kind)).map(Algorithm::name).collect();
            return Err(Error::InvalidUsage(format!(
                "OXCCL_ALGO allows no algorithm for {}; it has {}",
                coll.kind,
                have.join(", ")
            )));
        }
        let mut topo = self.topo;
        if topo.nranks() != coll.nranks {
            topo = Topology::one_rank_per_node(coll.nranks, topo.bottleneck()).with_reduce_bw(HOST_REDUCE_BW);
        }
        let best = allowed
            .iter()
            .map(|a| (cost::estimate(*a, coll, &topo).unwrap_or(f64::INFINITY), *a))
            .min_by(|x, y| x.0.total_cmp(&y.0))
            .map(|(_, a)| a)
            .unwrap_or(allowed[0]);
        Ok(best)
    }

    /// Pipeline chunk in bytes: two messages (the verifier's two slots)
    /// plus their headers must fit in every connection's FIFO.
    pub fn chunk_bytes(&self) -> usize {
        ((self.fifo / 2).saturating_sub(128) / 64 * 64).max(64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_grammar() {
        let f = AlgoFilter::parse("ring").unwrap();
        assert!(f.allows(CollKind::AllReduce, Algorithm::Ring));
        assert!(!f.allows(CollKind::AllReduce, Algorithm::Tree));
        let f = AlgoFilter::parse("^tree").unwrap();
        assert!(f.allows(CollKind::AllReduce, Algorithm::Ring) && !f.allows(CollKind::Broadcast, Algorithm::Tree));
        let f = AlgoFilter::parse("allreduce:tree;broadcast:ring").unwrap();
        assert!(f.allows(CollKind::AllReduce, Algorithm::Tree) && !f.allows(CollKind::AllReduce, Algorithm::Ring));
        assert!(f.allows(CollKind::Broadcast, Algorithm::Ring) && !f.allows(CollKind::Broadcast, Algorithm::Tree));
        assert!(f.allows(CollKind::AllGather, Algorithm::Rhd));
        let f = AlgoFilter::parse("ring,nvls").unwrap();
        assert!(f.allows(CollKind::AllReduce, Algorithm::Ring));
        let e = AlgoFilter::parse("allreduce:spiral").unwrap_err().to_string();
        assert!(e.contains("spiral"), "{e}");
        assert!(AlgoFilter::parse("allscatter:ring").unwrap_err().to_string().contains("allscatter"));
    }

    #[test]
    fn picks_by_cost_and_respects_filter() {
        let t = Tuner::new(1, 8, Kind::Shm, Kind::Tcp, AlgoFilter::default(), 4 << 20);
        // Bandwidth-optimal algorithms for big messages (ring and
        // Rabenseifner tie on bandwidth; the model prefers fewer latencies),
        // not the ring's 2(n-1) latencies for tiny ones.
        let big = Collective::new(CollKind::AllReduce, 8, 64 << 20);
        assert!(matches!(t.pick(&big).unwrap(), Algorithm::Ring | Algorithm::Rhd));
        assert_eq!(t.pick(&Collective::new(CollKind::AllReduce, 8, 2)).unwrap(), Algorithm::Doubling);
        // Two ranks: one exchange of the whole buffer while it is small,
        // halves (each rank reduces half) once reduction time dominates.
        let t2 = Tuner::new(1, 2, Kind::Shm, Kind::Tcp, AlgoFilter::default(), 4 << 20);
        assert_eq!(t2.pick(&Collective::new(CollKind::AllReduce, 2, 256)).unwrap(), Algorithm::Doubling);
        assert_ne!(t2.pick(&Collective::new(CollKind::AllReduce, 2, 2 << 20)).unwrap(), Algorithm::Doubling);
        let t = Tuner::new(1, 8, Kind::Shm, Kind::Tcp, AlgoFilter::parse("tree").unwrap(), 4 << 20);
        assert_eq!(t.pick(&big).unwrap(), Algorithm::Tree);
        // A global list leaves collectives it has nothing for alone ...
        assert!(t.pick(&Collective::new(CollKind::AllGather, 8, 4)).is_ok());
        // ... a list for one collective is strict.
        let t = Tuner::new(1, 8, Kind::Shm, Kind::Tcp, AlgoFilter::parse("allgather:tree").unwrap(), 4 << 20);
        let none = t.pick(&Collective::new(CollKind::AllGather, 8, 4)).unwrap_err().to_string();
        assert!(none.contains("all_gather") && none.contains("ring"), "{none}");
        assert_eq!(t.chunk_bytes(), (2 << 20) - 128);
    }
}
