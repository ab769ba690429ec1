//! The hosts of a communicator and what is on them: NICs, RDMA ports,
//! GPUs, NUMA nodes, and where each rank runs.
//!
//! Each rank discovers its own facts at init ([`RankFacts::discover`],
//! [`HostFacts::discover`]; sysfs and procfs reads, nothing fails), the
//! communicator all-gathers them through the bootstrap ([`encode`],
//! [`decode`]) and every rank builds the same [`Topology`]
//! ([`Topology::assemble`]). A topology can be written as JSON
//! ([`Topology::to_json`], for `OXCCL_TOPO_DUMP_FILE`) and read back in
//! place of discovery ([`Topology::load`], for `OXCCL_TOPO_FILE`), like
//! NCCL's `NCCL_TOPO_DUMP_FILE` and `NCCL_TOPO_FILE`. A hand-written file
//! may be as small as
//! `{"hosts":[{"id":"x","ranks":[0,1]},{"id":"y","ranks":[2,3]}]}`.
//!
//! ```
//! use oxccl_transport::topo::{HostFacts, RankFacts, Topology};
//! let me = (RankFacts::discover("h".into()), HostFacts::discover());
//! let topo = Topology::assemble(vec![me.clone(), me]);
//! assert_eq!(topo.host_of(), vec![0, 0]);
//! ```
#![forbid(unsafe_code)]

mod discover;
pub(crate) use discover::nics_here;
mod file;
#[cfg(test)]
mod tests;

use std::collections::HashMap;

use oxccl_core::{Error, Result};
use serde::{Deserialize, Serialize};

/// A network interface of `/sys/class/net` (loopback left out).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Nic {
    /// Interface name (`eth0`).
    pub name: String,
    /// Link speed in Mb/s; `None` where the kernel does not know it.
    #[serde(default)]
    pub speed_mbps: Option<u64>,
    /// Whether its operational state is `up`.
    #[serde(default)]
    pub up: bool,
    /// NUMA node of its PCI device, if it has one.
    #[serde(default)]
    pub numa: Option<u32>,
    /// A software interface (bridge, veth, tunnel …): its sysfs entry
    /// lies under `/devices/virtual/`.
    #[serde(default, rename = "virtual")]
    pub virtual_: bool,
}

/// One port of an RDMA device (`/sys/class/infiniband`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RdmaPort {
    /// Device name (`mlx5_0`).
    pub device: String,
    /// Port number, from 1.
    pub port: u32,
    /// Link rate in Gb/s.
    #[serde(default)]
    pub rate_gbps: Option<f64>,
    /// Port state (`ACTIVE`, `DOWN` …; empty if unknown).
    #[serde(default)]
    pub state: String,
    /// The network interface of the port (RoCE), if any.
    #[serde(default)]
    pub netdev: Option<String>,
}

/// An NVIDIA GPU on the PCI bus.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Gpu {
    /// PCI address (`0000:3b:00.0`).
    pub pci_bus_id: String,
    /// Its NUMA node, if known.
    #[serde(default)]
    pub numa: Option<u32>,
}

/// A NUMA node and its CPUs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NumaNode {
    /// Node number.
    pub id: u32,
    /// Its CPUs, ascending.
    #[serde(default)]
    pub cpus: Vec<u32>,
}

/// What one host has; every list sorted by name or id.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HostFacts {
    /// Hostname.
    pub name: String,
    /// Network interfaces.
    pub nics: Vec<Nic>,
    /// RDMA ports.
    pub rdma: Vec<RdmaPort>,
    /// NVIDIA GPUs.
    pub gpus: Vec<Gpu>,
    /// NUMA nodes.
    pub numa: Vec<NumaNode>,
}

/// What one rank knows of itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankFacts {
    /// Host identity (the bootstrap's): equal ids mean one host.
    pub host_id: String,
    /// Process id.
    pub pid: u32,
    /// CPUs the rank's thread may run on, ascending.
    pub cpus: Vec<u32>,
    /// The NUMA node that holds all of `cpus`, if exactly one does.
    pub numa: Option<u32>,
}

/// One host of a topology.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Host {
    /// Host identity.
    pub id: String,
    /// What it has (in a file: may be left out).
    #[serde(default)]
    pub facts: HostFacts,
    /// Its ranks, ascending.
    pub ranks: Vec<usize>,
}

/// Where one rank runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RankEntry {
    /// Index of its host in [`Topology::hosts`].
    pub host: usize,
    /// Its index among its host's ranks.
    pub local: usize,
    /// Process id (0: unknown).
    #[serde(default)]
    pub pid: u32,
    /// CPUs it may run on (empty: unknown).
    #[serde(default)]
    pub cpus: Vec<u32>,
    /// Its NUMA node, if known.
    #[serde(default)]
    pub numa: Option<u32>,
}

/// Every host of a communicator and where each rank runs. Hosts are
/// numbered in order of their first rank (rank 0 is on host 0).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    /// The hosts.
    pub hosts: Vec<Host>,
    /// One entry per rank (in a file: may be left out).
    #[serde(default)]
    pub ranks: Vec<RankEntry>,
}

/// One rank's facts as bytes for the bootstrap's all-gather.
pub fn encode(r: &RankFacts, h: &HostFacts) -> Vec<u8> {
    serde_json::to_vec(&(r, h)).expect("topology facts always serialize")
}

/// The facts `rank` sent ([`encode`]); an error naming the rank if they do
/// not parse.
pub fn decode(rank: usize, bytes: &[u8]) -> Result<(RankFacts, HostFacts)> {
    serde_json::from_slice(bytes)
        .map_err(|e| Error::Remote(format!("rank {rank} sent topology facts that do not parse: {e}")))
}

impl Topology {
    /// The topology of the ranks whose facts these are (index = rank).
    /// Ranks with equal host ids share a host, whose facts are those its
    /// first rank sent.
    pub fn assemble(facts: Vec<(RankFacts, HostFacts)>) -> Topology {
        let mut index: HashMap<String, usize> = HashMap::new();
        let mut hosts: Vec<Host> = Vec::new();
        let mut ranks = Vec::with_capacity(facts.len());
        for (rank, (r, h)) in facts.into_iter().enumerate() {
            let host = *index.entry(r.host_id.clone()).or_insert_with(|| {
                hosts.push(Host { id: r.host_id.clone(), facts: h, ranks: Vec::new() });
                hosts.len() - 1
            });
            let local = hosts[host].ranks.len();
            hosts[host].ranks.push(rank);
            ranks.push(RankEntry { host, local, pid: r.pid, cpus: r.cpus, numa: r.numa });
        }
        Topology { hosts, ranks }
    }

    /// The host index of every rank.
    pub fn host_of(&self) -> Vec<u32> {
        self.ranks.iter().map(|r| r.host as u32).collect()
    }

    /// Number of hosts.
    pub fn nhosts(&self) -> usize {
        self.hosts.len()
    }

    /// Ranks per host when every host has the same number.
    pub fn ranks_per_host(&self) -> Option<usize> {
        let n = self.hosts.first()?.ranks.len();
        self.hosts.iter().all(|h| h.ranks.len() == n).then_some(n)
    }

    /// One line per host, for logs: `host 1 "name": ranks 2,3 · NUMA 2 ·
    /// nics eth0 25Gb/s · rdma mlx5_0:1 400Gb/s ACTIVE · gpus 8`
    /// (NUMA and gpus are counts; virtual NICs are only counted).
    pub fn summary(&self) -> Vec<String> {
        self.hosts.iter().enumerate().map(|(i, h)| host_line(i, h)).collect()
    }
}

fn host_line(index: usize, h: &Host) -> String {
    let f = &h.facts;
    let mut nics: Vec<String> = f.nics.iter().filter(|n| !n.virtual_).map(nic_text).collect();
    let virtuals = f.nics.iter().filter(|n| n.virtual_).count();
    if virtuals > 0 {
        nics.push(format!("+{virtuals} virtual"));
    }
    let nics = if nics.is_empty() { "none".to_string() } else { nics.join(", ") };
    let rdma: Vec<String> = f
        .rdma
        .iter()
        .map(|p| {
            let rate = p.rate_gbps.map_or("(no rate)".to_string(), |r| format!("{r}Gb/s"));
            format!("{}:{} {rate} {}", p.device, p.port, if p.state.is_empty() { "?" } else { &p.state })
        })
        .collect();
    let rdma = if rdma.is_empty() { "none".to_string() } else { rdma.join(", ") };
    format!(
        "host {index} {:?}: ranks {} · NUMA {} · nics {nics} · rdma {rdma} · gpus {}",
        f.name,
        ranges(&h.ranks),
        f.numa.len(),
        f.gpus.len()
    )
}

fn nic_text(n: &Nic) -> String {
    let speed = match n.speed_mbps {
        None => "(no speed)".to_string(),
        Some(s) if s >= 1000 => format!("{}Gb/s", s as f64 / 1000.0),
        Some(s) => format!("{s}Mb/s"),
    };
    format!("{} {speed}{}", n.name, if n.up { "" } else { " down" })
}

/// `[0,1,2,3,8]` → `"0-3,8"`; runs of two stay apart (`"2,3"`).
fn ranges(ranks: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        match j - i {
            0 => parts.push(ranks[i].to_string()),
            1 => parts.extend([ranks[i].to_string(), ranks[j].to_string()]),
            _ => parts.push(format!("{}-{}", ranks[i], ranks[j])),
        }
        i = j + 1;
    }
    if parts.is_empty() { "none".to_string() } else { parts.join(",") }
}
