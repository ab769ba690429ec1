//! Topologies as JSON files (`OXCCL_TOPO_DUMP_FILE`, `OXCCL_TOPO_FILE`):
//! writing, reading, and the checks that make a file describe exactly the
//! communicator's ranks.

use std::path::Path;

use oxccl_core::{Error, Result};

use super::{RankEntry, Topology};

impl Topology {
    /// The topology as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a topology always serializes")
    }

    /// A topology for `nranks` ranks from JSON ([`to_json`](Self::to_json)'s
    /// or hand-written: `ranks` and each host's `facts` may be left out).
    ///
    /// Every rank `0..nranks` must be on exactly one host, and every host
    /// must have a rank; where `ranks` is given it must agree with the
    /// hosts. Hosts are renumbered in order of their first rank and their
    /// rank lists sorted, so equal layouts give equal topologies. Errors
    /// name the rank or host (numbered as the file lists them).
    pub fn from_json(text: &str, nranks: usize) -> Result<Topology> {
        parse(text, nranks).map_err(|e| Error::invalid(format!("OXCCL_TOPO_FILE: {e}")))
    }

    /// [`from_json`](Self::from_json) of the file at `path`; errors name
    /// the path.
    pub fn load(path: &Path, nranks: usize) -> Result<Topology> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::System(format!("OXCCL_TOPO_FILE {}: cannot read it: {e}", path.display())))?;
        parse(&text, nranks).map_err(|e| Error::invalid(format!("OXCCL_TOPO_FILE {}: {e}", path.display())))
    }
}

fn parse(text: &str, nranks: usize) -> std::result::Result<Topology, String> {
    let file: Topology = serde_json::from_str(text).map_err(|e| format!("not a topology: {e}"))?;
    // owner[r]: the host (file numbering) that lists rank r.
    let mut owner: Vec<Option<usize>> = vec![None; nranks];
    for (i, h) in file.hosts.iter().enumerate() {
        if let Some(j) = file.hosts[..i].iter().position(|o| o.id == h.id) {
            return Err(format!("hosts {j} and {i} have the same id {:?}", h.id));
        }
        if h.ranks.is_empty() {
            return Err(format!("host {i} ({:?}) has no ranks", h.id));
        }
        for &r in &h.ranks {
            let slot =
                owner.get_mut(r).ok_or_else(|| format!("rank {r} is out of range for {nranks} ranks (host {i})"))?;
            match *slot {
                Some(j) if j == i => return Err(format!("rank {r} is listed twice on host {i}")),
                Some(j) => return Err(format!("rank {r} is on hosts {j} and {i}")),
                None => *slot = Some(i),
            }
        }
    }
    let owner: Vec<usize> = owner
        .iter()
        .enumerate()
        .map(|(r, o)| o.ok_or_else(|| format!("rank {r} is on no host")))
        .collect::<std::result::Result<_, _>>()?;

    let mut hosts = file.hosts;
    for h in &mut hosts {
        h.ranks.sort_unstable();
        if h.facts.name.is_empty() {
            h.facts.name = h.id.clone();
        }
    }
    let local = |r: usize| hosts[owner[r]].ranks.binary_search(&r).expect("the owner lists the rank");
    if !file.ranks.is_empty() {
        if file.ranks.len() != nranks {
            return Err(format!("\"ranks\" has {} entries for {nranks} ranks", file.ranks.len()));
        }
        for (r, e) in file.ranks.iter().enumerate() {
            if e.host != owner[r] {
                return Err(format!(
                    "rank {r} is on host {} in \"ranks\" but on host {} in \"hosts\"",
                    e.host, owner[r]
                ));
            }
            if e.local != local(r) {
                return Err(format!(
                    "rank {r} has local index {} in \"ranks\" but {} on host {}",
                    e.local,
                    local(r),
                    e.host
                ));
            }
        }
    }

    // Renumber hosts in order of their first rank.
    let mut order: Vec<usize> = (0..hosts.len()).collect();
    order.sort_by_key(|&i| hosts[i].ranks[0]);
    let mut new_index = vec![0; hosts.len()];
    for (new, &old) in order.iter().enumerate() {
        new_index[old] = new;
    }
    let ranks = (0..nranks)
        .map(|r| {
            let (pid, cpus, numa) =
                file.ranks.get(r).map_or((0, Vec::new(), None), |e| (e.pid, e.cpus.clone(), e.numa));
            RankEntry { host: new_index[owner[r]], local: local(r), pid, cpus, numa }
        })
        .collect();
    let mut slots: Vec<Option<_>> = hosts.into_iter().map(Some).collect();
    let hosts = order.iter().map(|&i| slots[i].take().expect("each host once")).collect();
    Ok(Topology { hosts, ranks })
}
