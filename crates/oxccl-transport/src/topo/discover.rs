//! What a rank finds out about its host and itself: sysfs and procfs
//! reads only. A file or directory that is missing or unreadable means
//! "unknown" (an empty list, `None`), never an error: containers and
//! virtual machines hide much of sysfs.

use std::fs;
use std::path::{Path, PathBuf};

use super::{Gpu, HostFacts, Nic, NumaNode, RankFacts, RdmaPort};

/// PCI vendor id of NVIDIA.
const NVIDIA: &str = "0x10de";

impl HostFacts {
    /// This host's facts, from `/sys`.
    pub fn discover() -> HostFacts {
        HostFacts::discover_in(Path::new("/sys"))
    }

    /// This host's facts from a sysfs tree rooted at `sys_root` (in place of
    /// `/sys`; tests build a fake one). The name is the real hostname.
    /// Every list is sorted by name or id.
    pub fn discover_in(sys_root: &Path) -> HostFacts {
        HostFacts {
            name: hostname(),
            nics: nics(sys_root),
            rdma: rdma_ports(sys_root),
            gpus: gpus(sys_root),
            numa: numa_nodes(sys_root),
        }
    }
}

impl RankFacts {
    /// This rank's facts: `host_id` (the bootstrap's host identity), the
    /// process id, the CPUs this thread may run on (`Cpus_allowed_list` of
    /// `/proc/thread-self/status`) and the NUMA node that holds all of them.
    pub fn discover(host_id: String) -> RankFacts {
        let cpus = ["/proc/thread-self/status", "/proc/self/status"]
            .iter()
            .find_map(|p| allowed_cpus(&fs::read_to_string(p).ok()?))
            .unwrap_or_default();
        let numa = numa_of(&cpus, &numa_nodes(Path::new("/sys")));
        RankFacts { host_id, pid: std::process::id(), cpus, numa }
    }
}

/// The `Cpus_allowed_list` line of a `/proc/…/status` text, parsed.
fn allowed_cpus(status: &str) -> Option<Vec<u32>> {
    let line = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
    parse_cpulist(line).ok()
}

/// The one NUMA node whose CPUs include every one of `cpus`; `None` when
/// `cpus` is empty or no node, or more than one, holds them all.
pub(super) fn numa_of(cpus: &[u32], nodes: &[NumaNode]) -> Option<u32> {
    if cpus.is_empty() {
        return None;
    }
    let mut holders = nodes.iter().filter(|n| cpus.iter().all(|c| n.cpus.contains(c)));
    match (holders.next(), holders.next()) {
        (Some(n), None) => Some(n.id),
        _ => None,
    }
}

/// Parses a kernel CPU list (`"0-3,8-11"`, `"5"`, `""`) into sorted,
/// distinct CPU numbers. Whitespace around items is ignored; anything else
/// (a reversed range, a stride, a word) is an error naming the item.
pub(super) fn parse_cpulist(text: &str) -> Result<Vec<u32>, String> {
    let mut cpus = Vec::new();
    for item in text.trim().split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let num = |s: &str| s.trim().parse::<u32>().map_err(|_| format!("bad CPU list item {item:?} in {text:?}"));
        match item.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(format!("reversed CPU range {item:?} in {text:?}"));
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(num(item)?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

fn hostname() -> String {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .filter_map(|p| read_trim(Path::new(p)))
        .find(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown-host".to_string())
}

/// A sysfs attribute, trimmed; `None` if it cannot be read.
fn read_trim(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// A sysfs number attribute where `-1` (or anything unparsable) means
/// unknown.
fn read_num<T: std::str::FromStr>(path: &Path) -> Option<T> {
    read_trim(path)?.parse().ok()
}

/// The entries of a directory as (name, path), sorted by name; empty when
/// it cannot be read.
fn entries(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
        .collect();
    out.sort();
    out
}

/// This host's network interfaces (loopback left out), from `/sys`.
pub(crate) fn nics_here() -> Vec<Nic> {
    nics(Path::new("/sys"))
}

fn nics(sys: &Path) -> Vec<Nic> {
    entries(&sys.join("class/net"))
        .into_iter()
        .filter(|(name, path)| name != "lo" && path.is_dir())
        .map(|(name, path)| Nic {
            speed_mbps: read_num(&path.join("speed")),
            up: read_trim(&path.join("operstate")).as_deref() == Some("up"),
            numa: read_num(&path.join("device/numa_node")),
            virtual_: fs::read_link(&path).is_ok_and(|t| t.to_string_lossy().contains("/virtual/")),
            name,
        })
        .collect()
}

fn rdma_ports(sys: &Path) -> Vec<RdmaPort> {
    let mut out = Vec::new();
    for (device, dev_path) in entries(&sys.join("class/infiniband")) {
        let mut ports: Vec<(u32, PathBuf)> =
            entries(&dev_path.join("ports")).into_iter().filter_map(|(n, p)| Some((n.parse().ok()?, p))).collect();
        ports.sort_by_key(|p| p.0);
        for (port, path) in ports {
            out.push(RdmaPort {
                device: device.clone(),
                port,
                rate_gbps: read_trim(&path.join("rate")).and_then(|r| parse_rate(&r)),
                state: read_trim(&path.join("state")).map(|s| parse_state(&s)).unwrap_or_default(),
                netdev: read_trim(&path.join("gid_attrs/ndevs/0")).filter(|s| !s.is_empty()),
            });
        }
    }
    out
}

/// `"400 Gb/sec (4X NDR)"` → 400.0.
pub(super) fn parse_rate(text: &str) -> Option<f64> {
    text.split_whitespace().next()?.parse().ok()
}

/// `"4: ACTIVE"` → `"ACTIVE"` (a text without a number is kept whole).
pub(super) fn parse_state(text: &str) -> String {
    text.split_once(':').map_or(text, |(_, s)| s).trim().to_string()
}

fn gpus(sys: &Path) -> Vec<Gpu> {
    entries(&sys.join("bus/pci/devices"))
        .into_iter()
        .filter(|(_, path)| {
            read_trim(&path.join("vendor")).is_some_and(|v| v.eq_ignore_ascii_case(NVIDIA))
                && read_trim(&path.join("class")).is_some_and(|c| c.starts_with("0x03"))
        })
        .map(|(pci_bus_id, path)| Gpu { numa: read_num(&path.join("numa_node")), pci_bus_id })
        .collect()
}

pub(super) fn numa_nodes(sys: &Path) -> Vec<NumaNode> {
    let mut nodes: Vec<NumaNode> = entries(&sys.join("devices/system/node"))
        .into_iter()
        .filter_map(|(name, path)| {
            let id = name.strip_prefix("node")?.parse().ok()?;
            let cpus = read_trim(&path.join("cpulist")).and_then(|l| parse_cpulist(&l).ok()).unwrap_or_default();
            Some(NumaNode { id, cpus })
        })
        .collect();
    nodes.sort_by_key(|n| n.id);
    nodes
}
