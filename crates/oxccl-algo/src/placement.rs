//! Where ranks live: which ranks share a host.
//!
//! A [`Placement`] gives every rank a host index, hosts numbered in the
//! order of their first rank (rank 0's host is host 0), so two placements
//! that group ranks the same way are equal whatever the hosts were called.
//! Algorithms that follow the topology take one ([`build_on`]): rings visit
//! each host's ranks contiguously, so a ring crosses each host boundary
//! once whatever the numbering; hierarchical algorithms run inside hosts
//! and between ranks of the same local index across hosts.
//!
//! Launchers number ranks *blocked* (host `h` has ranks `h·L .. h·L+L`) or
//! *cyclically* (rank `r` on host `r mod H`, as `srun
//! --distribution=cyclic` does); [`Placement::blocked`] and
//! [`Placement::cyclic`] build both, [`Placement::parse`] reads them as
//! `HxL` and `HxL:cyclic`.
//!
//! ```
//! use oxccl_algo::placement::Placement;
//! let p = Placement::cyclic(2, 2);
//! assert_eq!(p.ranks_of(0), vec![0, 2]);
//! assert_eq!(p.ring(), vec![0, 2, 1, 3]);
//! assert_eq!(p.local_index(3), 1);
//! ```
//!
//! [`build_on`]: crate::algos::build_on

use crate::ir::Program;
use oxccl_core::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The host of every rank (see the [module docs](self)).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "Vec<usize>", into = "Vec<usize>")]
pub struct Placement {
    host: Vec<usize>,
}

impl Placement {
    /// `n` ranks on one host.
    pub fn flat(n: usize) -> Placement {
        Placement { host: vec![0; n] }
    }

    /// Ranks grouped by equal keys (`keys[r]` is rank `r`'s host name or
    /// identity); hosts are numbered in the order of their first rank.
    pub fn from_keys<K: PartialEq>(keys: &[K]) -> Placement {
        let mut firsts: Vec<&K> = Vec::new();
        let host = keys
            .iter()
            .map(|k| {
                firsts.iter().position(|f| *f == k).unwrap_or_else(|| {
                    firsts.push(k);
                    firsts.len() - 1
                })
            })
            .collect();
        Placement { host }
    }

    /// `hosts` hosts of `per_host` ranks numbered blocked: rank `r` on host
    /// `r / per_host`.
    pub fn blocked(hosts: usize, per_host: usize) -> Placement {
        Placement { host: (0..hosts * per_host).map(|r| r / per_host.max(1)).collect() }
    }

    /// `hosts` hosts of `per_host` ranks numbered cyclically: rank `r` on
    /// host `r mod hosts`.
    pub fn cyclic(hosts: usize, per_host: usize) -> Placement {
        Placement { host: (0..hosts * per_host).map(|r| r % hosts.max(1)).collect() }
    }

    /// `HxL` (blocked) or `HxL:cyclic` / `HxL:blocked`: `H` hosts of `L`
    /// ranks each.
    pub fn parse(spec: &str) -> Result<Placement> {
        let bad = || {
            Error::invalid(format!(
                "placement {spec:?} is not HOSTSxRANKS[:blocked|:cyclic] (for example \"2x4\" or \"16x8:cyclic\")"
            ))
        };
        let (shape, numbering) = spec.trim().split_once(':').unwrap_or((spec.trim(), "blocked"));
        let (h, l) = shape.split_once(['x', 'X']).ok_or_else(bad)?;
        let h: usize = h.trim().parse().map_err(|_| bad())?;
        let l: usize = l.trim().parse().map_err(|_| bad())?;
        if h == 0 || l == 0 {
            return Err(Error::invalid(format!("placement {spec:?}: hosts and ranks per host must be at least 1")));
        }
        match numbering.trim() {
            "blocked" | "block" => Ok(Placement::blocked(h, l)),
            "cyclic" => Ok(Placement::cyclic(h, l)),
            _ => Err(bad()),
        }
    }

    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.host.len()
    }

    /// Number of hosts.
    pub fn nhosts(&self) -> usize {
        self.host.iter().max().map_or(0, |&h| h + 1)
    }

    /// The host of `rank`.
    pub fn host_of(&self, rank: usize) -> usize {
        self.host[rank]
    }

    /// Every rank's host.
    pub fn hosts(&self) -> &[usize] {
        &self.host
    }

    /// The ranks on host `h`, ascending.
    pub fn ranks_of(&self, h: usize) -> Vec<usize> {
        (0..self.nranks()).filter(|&r| self.host[r] == h).collect()
    }

    /// `rank`'s index among its host's ranks.
    pub fn local_index(&self, rank: usize) -> usize {
        self.host[..rank].iter().filter(|&&h| h == self.host[rank]).count()
    }

    /// Ranks per host when every host has as many, else `None`.
    pub fn per_host(&self) -> Option<usize> {
        let n = self.nhosts();
        let per = self.nranks() / n.max(1);
        (0..n).all(|h| self.host.iter().filter(|&&x| x == h).count() == per).then_some(per)
    }

    /// Whether `a` and `b` are on different hosts.
    pub fn crosses(&self, a: usize, b: usize) -> bool {
        self.host[a] != self.host[b]
    }

    /// Whether one host holds every rank or every rank has a host of its
    /// own: then nothing here depends on the topology.
    pub fn is_flat(&self) -> bool {
        self.nhosts() <= 1 || self.nhosts() == self.nranks()
    }

    /// The ring that follows the hosts: host 0's ranks ascending, then host
    /// 1's, …; it crosses each host boundary once (rank order where the
    /// numbering is blocked or [flat](Placement::is_flat)).
    pub fn ring(&self) -> Vec<usize> {
        (0..self.nhosts()).flat_map(|h| self.ranks_of(h)).collect()
    }

    /// `rank`'s number when the same hosts are numbered blocked (its
    /// position in [`ring`](Placement::ring)).
    pub fn blocked_number(&self) -> Vec<usize> {
        let mut out = vec![0; self.nranks()];
        for (pos, r) in self.ring().into_iter().enumerate() {
            out[r] = pos;
        }
        out
    }

    /// Elements `program` moves between ranks on different hosts (messages
    /// and one-sided data, counted once at the sender or the accessing
    /// rank): the traffic the hosts' network carries, in elements.
    ///
    /// Errors when the program has another number of ranks.
    pub fn crossing_elems(&self, program: &Program) -> Result<u64> {
        self.check(program)?;
        let mut total = 0u64;
        for (r, rp) in program.ranks.iter().enumerate() {
            for s in rp.steps() {
                let peer = s.send_peer().or_else(|| s.one_sided_peer());
                if let Some(q) = peer
                    && q < self.nranks()
                    && self.crosses(r, q)
                {
                    total += s.wire_elems() as u64;
                }
            }
        }
        Ok(total)
    }

    fn check(&self, program: &Program) -> Result<()> {
        if program.ranks.len() != self.nranks() {
            return Err(Error::invalid(format!(
                "program {:?} has {} ranks; the placement has {}",
                program.name,
                program.ranks.len(),
                self.nranks()
            )));
        }
        Ok(())
    }
}

impl TryFrom<Vec<usize>> for Placement {
    type Error = Error;
    /// Host indices per rank; renumbered in the order of first rank.
    fn try_from(host: Vec<usize>) -> Result<Placement> {
        Ok(Placement::from_keys(&host))
    }
}

impl From<Placement> for Vec<usize> {
    fn from(p: Placement) -> Vec<usize> {
        p.host
    }
}

impl fmt::Display for Placement {
    /// `2x2:cyclic`, `2x4`, or the hosts' rank lists where uneven.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (h, n) = (self.nhosts(), self.nranks());
        if let Some(l) = self.per_host() {
            if *self == Placement::blocked(h, l) {
                return write!(f, "{h}x{l}");
            }
            if *self == Placement::cyclic(h, l) {
                return write!(f, "{h}x{l}:cyclic");
            }
        }
        let hosts: Vec<String> = (0..h).map(|x| format!("{:?}", self.ranks_of(x))).collect();
        write!(f, "{n} ranks on {h} hosts {}", hosts.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_numbered_by_first_rank() {
        let p = Placement::from_keys(&["b", "a", "b", "c", "a"]);
        assert_eq!(p.hosts(), &[0, 1, 0, 2, 1]);
        assert_eq!(p.nhosts(), 3);
        assert_eq!(p.per_host(), None);
        assert_eq!(p.ring(), vec![0, 2, 1, 4, 3]);
        assert_eq!(Placement::try_from(vec![5, 5, 2, 2]).unwrap(), Placement::blocked(2, 2));
    }

    #[test]
    fn blocked_and_cyclic() {
        let b = Placement::blocked(3, 2);
        assert_eq!(b.hosts(), &[0, 0, 1, 1, 2, 2]);
        assert_eq!(b.ring(), (0..6).collect::<Vec<_>>());
        let c = Placement::cyclic(3, 2);
        assert_eq!(c.hosts(), &[0, 1, 2, 0, 1, 2]);
        assert_eq!(c.ring(), vec![0, 3, 1, 4, 2, 5]);
        assert_eq!(c.blocked_number(), vec![0, 2, 4, 1, 3, 5]);
        assert_eq!(c.local_index(4), 1);
        assert_eq!(c.per_host(), Some(2));
        assert!(!c.is_flat() && Placement::flat(4).is_flat() && Placement::cyclic(4, 1).is_flat());
        assert_eq!(c.to_string(), "3x2:cyclic");
        assert_eq!(b.to_string(), "3x2");
    }

    #[test]
    fn parse_names_what_is_wrong() {
        assert_eq!(Placement::parse("2x4").unwrap(), Placement::blocked(2, 4));
        assert_eq!(Placement::parse("16X8:cyclic").unwrap(), Placement::cyclic(16, 8));
        for bad in ["2", "2x", "x4", "2x4:random", "0x4"] {
            let e = Placement::parse(bad).unwrap_err().to_string();
            assert!(e.contains(bad), "{e}");
        }
    }

    #[test]
    fn the_ring_crosses_each_boundary_once() {
        for p in [Placement::cyclic(4, 3), Placement::from_keys(&[0, 1, 1, 0, 2, 0, 2])] {
            let ring = p.ring();
            let n = ring.len();
            let crossings = (0..n).filter(|&i| p.crosses(ring[i], ring[(i + 1) % n])).count();
            assert_eq!(crossings, p.nhosts());
        }
    }
}
