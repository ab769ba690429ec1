//! The alpha-beta-gamma cost model: a [`Topology`] of nodes and links, link
//! specs parsed from text (`450GB/s,0.6us`), and the textbook closed-form
//! costs of the classic algorithms.
//!
//! A message of `m` bytes over a [`Link`] costs `α + m·β` with `α` the
//! link's latency and `β = 1/bw`; reducing `m` bytes into a buffer costs
//! `m·γ` with `γ = 1/reduce_bw`. The closed forms below take `S`, the
//! collective's size in bytes as nccl-tests reports it
//! ([`Collective::size_bytes`]), and one link for every hop; they are what
//! the [`sim`](crate::sim) simulator reproduces on a uniform topology, and
//! a quick first guess (see [`estimate`]) where it does not. The direct
//! (one-sided) algorithms, pairwise all-to-all and linear gather/scatter
//! have theirs too ([`one_shot_all_reduce`] and the functions after it),
//! written from the simulator's schedule: signal rounds cost `α`, one-sided
//! reads queue at the ports they use, local copies cost `κ` per byte
//! ([`Topology::copy_cost`]).
//!
//! ```
//! use oxccl_algo::cost::{ring_all_reduce, Link, Topology};
//! let link: Link = "50GB/s,5us".parse().unwrap();
//! let topo = Topology::new(128, 8, "450GB/s,0.6us".parse().unwrap(), link);
//! assert_eq!(topo.nranks(), 1024);
//! let t = ring_all_reduce(4, 1 << 20, link, 0.0);
//! assert!((t - (6.0 * 5e-6 + 1.5 * (1u64 << 20) as f64 / 50e9)).abs() < 1e-15);
//! ```

use crate::collective::Collective;
use oxccl_core::{Error, Result};
use std::fmt;
use std::str::FromStr;

/// A point-to-point link: bandwidth in bytes per second (may be infinite)
/// and latency in seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    /// Bytes per second in each direction.
    pub bw: f64,
    /// Seconds from the last byte leaving the sender to its arrival.
    pub lat: f64,
}

impl Link {
    /// A link of `bw` bytes per second and `lat` seconds.
    pub const fn new(bw: f64, lat: f64) -> Link {
        Link { bw, lat }
    }

    /// `α + m/bw`: the time one message of `bytes` takes on an idle link.
    pub fn time(&self, bytes: f64) -> f64 {
        self.lat + bytes / self.bw
    }

    /// Checks that the bandwidth is positive and the latency finite and not
    /// negative; `what` names the link in the error.
    pub fn validate(&self, what: &str) -> Result<()> {
        if self.bw.is_nan() || self.bw <= 0.0 {
            return Err(Error::invalid(format!("{what} bandwidth must be positive, got {}", self.bw)));
        }
        if !(self.lat.is_finite() && self.lat >= 0.0) {
            return Err(Error::invalid(format!("{what} latency must be finite and not negative, got {}", self.lat)));
        }
        Ok(())
    }
}

impl FromStr for Link {
    type Err = Error;
    /// Parses `BANDWIDTH,LATENCY`, e.g. `450GB/s,0.6us` or `100Gb/s, 2us`.
    fn from_str(s: &str) -> Result<Link> {
        let (bw, lat) = s.split_once(',').ok_or_else(|| {
            Error::invalid(format!(
                "link {s:?} is not BANDWIDTH,LATENCY (for example \"450GB/s,0.6us\" or \"100Gb/s,2us\")"
            ))
        })?;
        let link = Link::new(
            parse_bandwidth(bw).map_err(|e| Error::invalid(format!("link {s:?}: {}", message(&e))))?,
            parse_latency(lat).map_err(|e| Error::invalid(format!("link {s:?}: {}", message(&e))))?,
        );
        link.validate(&format!("link {s:?}"))?;
        Ok(link)
    }
}

impl fmt::Display for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{},{}", format_bandwidth(self.bw), format_seconds(self.lat))
    }
}

fn message(e: &Error) -> String {
    match e {
        Error::InvalidArgument(m) => m.clone(),
        other => other.to_string(),
    }
}

/// Parses a bandwidth into bytes per second: a number and a unit `B/s`,
/// `KB/s`, `MB/s`, `GB/s`, `TB/s` (decimal prefixes), `KiB/s` … `TiB/s`
/// (binary), or the same with a lowercase `b` for bits (`100Gb/s` is
/// 12.5 GB/s); `inf` means no bandwidth limit.
pub fn parse_bandwidth(s: &str) -> Result<f64> {
    let t = s.trim();
    if matches!(t.to_ascii_lowercase().as_str(), "inf" | "infinite" | "infinity") {
        return Ok(f64::INFINITY);
    }
    let bad = |why: &str| {
        Error::invalid(format!(
            "bandwidth {t:?} {why}; expected a number and a unit such as 450GB/s, 100Gb/s, 25GiB/s or inf"
        ))
    };
    let (num, unit) = split_number(t);
    let value: f64 = num.parse().map_err(|_| bad("does not start with a number"))?;
    let unit = unit.trim();
    let per_s = unit.strip_suffix("/s").or_else(|| unit.strip_suffix("ps")).ok_or_else(|| bad("has no unit"))?;
    let (prefix, base) = match per_s.char_indices().last() {
        Some((i, 'B')) => (&per_s[..i], 1.0),
        Some((i, 'b')) => (&per_s[..i], 0.125),
        _ => return Err(bad("has an unknown unit")),
    };
    let scale = match prefix {
        "" => 1.0,
        "k" | "K" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" | "ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return Err(bad("has an unknown unit prefix")),
    };
    let bw = value * scale * base;
    if bw.is_nan() || bw <= 0.0 {
        return Err(bad("is not positive"));
    }
    Ok(bw)
}

/// Parses a duration into seconds: a number and a unit `ns`, `us` (or
/// `µs`), `ms` or `s`; a bare `0` is zero.
pub fn parse_latency(s: &str) -> Result<f64> {
    let t = s.trim();
    let bad = |why: &str| {
        Error::invalid(format!("latency {t:?} {why}; expected a number and a unit such as 0.6us, 500ns, 2ms"))
    };
    let (num, unit) = split_number(t);
    let value: f64 = num.parse().map_err(|_| bad("does not start with a number"))?;
    let scale = match unit.trim() {
        "ns" => 1e-9,
        "us" | "µs" | "μs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "" if value == 0.0 => 0.0,
        "" => return Err(bad("has no unit")),
        _ => return Err(bad("has an unknown unit")),
    };
    let lat = value * scale + 0.0; // `+ 0.0` turns -0 into 0
    if !(lat.is_finite() && lat >= 0.0) {
        return Err(bad("is negative or not finite"));
    }
    Ok(lat)
}

/// Splits `"12.5GB/s"` into `("12.5", "GB/s")`.
fn split_number(s: &str) -> (&str, &str) {
    let end = s
        .char_indices()
        .find(|&(i, c)| {
            !(c.is_ascii_digit()
                || c == '.'
                || ((c == 'e' || c == 'E') && s[i + 1..].starts_with(|d: char| d.is_ascii_digit() || d == '-'))
                || ((c == '-' || c == '+') && (i == 0 || s[..i].ends_with(['e', 'E']))))
        })
        .map_or(s.len(), |(i, _)| i);
    (&s[..end], &s[end..])
}

/// Formats bytes per second with a decimal prefix (`450 GB/s`).
pub fn format_bandwidth(bw: f64) -> String {
    if bw.is_infinite() {
        return "inf".to_string();
    }
    let (v, unit) = scaled(bw, &["B/s", "KB/s", "MB/s", "GB/s", "TB/s"]);
    format!("{v}{unit}")
}

/// Formats seconds with a suitable unit (`0.6us`).
pub fn format_seconds(t: f64) -> String {
    if t == 0.0 {
        return "0s".to_string();
    }
    let (v, unit) = if t < 1e-6 {
        (t * 1e9, "ns")
    } else if t < 1e-3 {
        (t * 1e6, "us")
    } else if t < 1.0 {
        (t * 1e3, "ms")
    } else {
        (t, "s")
    };
    format!("{}{unit}", round_sig(v))
}

fn scaled(mut v: f64, units: &[&'static str]) -> (f64, &'static str) {
    let mut i = 0;
    while v >= 1000.0 && i + 1 < units.len() {
        v /= 1000.0;
        i += 1;
    }
    (round_sig(v), units[i])
}

fn round_sig(v: f64) -> f64 {
    (v * 1e6).round() / 1e6
}

/// Which NIC of its node a connection between two nodes goes through
/// ([`Topology::rails`]); NIC `j` of every node is on rail `j` either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Rails {
    /// Local rank `i` uses NIC `i mod nics` for all its channels: NCCL's
    /// rail-optimized layout on DGX nodes (one NIC next to each GPU).
    #[default]
    ByRank,
    /// Channel `c` of every connection uses NIC `c mod nics` of both
    /// nodes, whatever the local ranks. The channels on one rail share
    /// its NICs.
    ByChannel,
    /// Channel `c` of a connection whose sender is local rank `i` uses NIC
    /// `(c + i) mod nics` of both nodes: oxccl's TCP and RDMA rails
    /// (`oxccl_transport::provider::rail_of`). With one channel, local
    /// rank `i` sends on rail `i` as [`Rails::ByRank`]; its receiver takes
    /// the data on that rail too.
    BySender,
}

/// Where the ranks live and how they are connected.
///
/// Rank `r` lives on node `r / ranks_per_node`. Ranks of one node talk over
/// [`Topology::intra`] links; every rank has its own send port and receive
/// port of that bandwidth. Ranks of different nodes talk through their
/// nodes' NICs, of [`Topology::inter`] bandwidth each in each direction:
/// [`Topology::nics`] per node (one by default), rail-optimized as on
/// DGX nodes: local rank `i` uses NIC `i mod nics` of its node, NIC `j` of
/// every node is on rail `j`, and each NIC is *shared* by the ranks that
/// use it. [`Topology::rails`] says which NIC a connection between
/// nodes takes: the local rank's (that default) or its channel's
/// ([`Rails::ByChannel`]) or its channel's and sender's
/// ([`Rails::BySender`], oxccl's rails).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Topology {
    /// Number of nodes.
    pub nodes: usize,
    /// Ranks on each node.
    pub ranks_per_node: usize,
    /// Link between two ranks of one node (per-rank ports).
    pub intra: Link,
    /// Link between nodes: one NIC (shared by the ranks that use it).
    pub inter: Link,
    /// NICs per node (rails); at least 1.
    pub nics: usize,
    /// Which NIC of its node a connection between nodes takes.
    pub rails: Rails,
    /// Reduction throughput in bytes of incoming data per second
    /// (`γ = 1/reduce_bw`); infinite by default: reductions are free.
    pub reduce_bw: f64,
    /// Local copy throughput in bytes per second; infinite by default:
    /// local copies are free.
    pub copy_bw: f64,
}

impl Topology {
    /// `nodes` nodes of `ranks_per_node` ranks; reductions and copies free.
    pub fn new(nodes: usize, ranks_per_node: usize, intra: Link, inter: Link) -> Topology {
        Topology {
            nodes,
            ranks_per_node,
            intra,
            inter,
            nics: 1,
            rails: Rails::ByRank,
            reduce_bw: f64::INFINITY,
            copy_bw: f64::INFINITY,
        }
    }

    /// `nranks` ranks on one node, every pair connected by `link`.
    pub fn single_node(nranks: usize, link: Link) -> Topology {
        Topology::new(1, nranks, link, link)
    }

    /// `nranks` nodes of one rank each, connected by `link`.
    pub fn one_rank_per_node(nranks: usize, link: Link) -> Topology {
        Topology::new(nranks, 1, link, link)
    }

    /// The same with `k` NICs per node (rails).
    pub fn with_nics(mut self, k: usize) -> Topology {
        self.nics = k;
        self
    }

    /// The same with connections between nodes on rails as `rails` says.
    pub fn with_rails(mut self, rails: Rails) -> Topology {
        self.rails = rails;
        self
    }

    /// The same with channel `c` of every connection between nodes on
    /// NIC `c mod nics` of both nodes, whatever the local ranks: how
    /// close to how oxccl's rails go ([`Rails::ByChannel`]; they add the
    /// sender's local rank).
    pub fn rails_by_channel(self) -> Topology {
        self.with_rails(Rails::ByChannel)
    }

    /// The NIC `rank` sends and receives through by its local rank
    /// ([`Rails::ByRank`]), numbered over all nodes (node `h`'s are
    /// `h·nics ..`).
    pub fn nic_of(&self, rank: usize) -> usize {
        let local = rank % self.ranks_per_node.max(1);
        self.node_of(rank) * self.nics.max(1) + local % self.nics.max(1)
    }

    /// The NIC channel `channel` of `rank` sends and receives through
    /// between nodes, as [`Topology::rails`] says, numbered as
    /// [`nic_of`](Topology::nic_of) numbers them.
    /// ([`Rails::BySender`] counts as by channel here: see
    /// [`nics_between`](Topology::nics_between)).
    pub fn nic_for(&self, rank: usize, channel: usize) -> usize {
        match self.rails {
            Rails::ByRank => self.nic_of(rank),
            Rails::ByChannel | Rails::BySender => self.node_of(rank) * self.nics.max(1) + channel % self.nics.max(1),
        }
    }

    /// The NICs (send side of `from`'s node, receive side of `to`'s) that
    /// channel `channel` from `from` to `to` on another node crosses, as
    /// [`Topology::rails`] says.
    pub fn nics_between(&self, from: usize, to: usize, channel: usize) -> (usize, usize) {
        match self.rails {
            Rails::BySender => {
                let k = self.nics.max(1);
                let rail = (channel + from % self.ranks_per_node.max(1)) % k;
                (self.node_of(from) * k + rail, self.node_of(to) * k + rail)
            }
            _ => (self.nic_for(from, channel), self.nic_for(to, channel)),
        }
    }

    /// The same with reductions at `bw` bytes per second.
    pub fn with_reduce_bw(mut self, bw: f64) -> Topology {
        self.reduce_bw = bw;
        self
    }

    /// The same with local copies at `bw` bytes per second.
    pub fn with_copy_bw(mut self, bw: f64) -> Topology {
        self.copy_bw = bw;
        self
    }

    /// Total number of ranks.
    pub fn nranks(&self) -> usize {
        self.nodes * self.ranks_per_node
    }

    /// The node rank `r` lives on.
    pub fn node_of(&self, rank: usize) -> usize {
        rank / self.ranks_per_node.max(1)
    }

    /// The link a message from `a` to `b` takes.
    pub fn link(&self, a: usize, b: usize) -> Link {
        if self.node_of(a) == self.node_of(b) { self.intra } else { self.inter }
    }

    /// `γ`: seconds per byte reduced.
    pub fn gamma(&self) -> f64 {
        1.0 / self.reduce_bw
    }

    /// `κ`: seconds per byte copied locally (0 when copies are free).
    pub fn copy_cost(&self) -> f64 {
        1.0 / self.copy_bw
    }

    /// The slowest hop: the inter-node link when there is more than one
    /// node (with the larger latency and smaller bandwidth of the two),
    /// else the intra-node link. The closed forms use it in
    /// [`estimate`].
    pub fn bottleneck(&self) -> Link {
        if self.nodes > 1 {
            Link::new(self.intra.bw.min(self.inter.bw), self.intra.lat.max(self.inter.lat))
        } else {
            self.intra
        }
    }

    /// Checks every field: at least one node and one rank per node, valid
    /// links, positive throughputs.
    pub fn validate(&self) -> Result<()> {
        if self.nics == 0 {
            return Err(Error::invalid("topology needs at least one NIC per node, got 0"));
        }
        if self.nodes == 0 || self.ranks_per_node == 0 {
            return Err(Error::invalid(format!(
                "topology needs at least one node and one rank per node, got {} × {}",
                self.nodes, self.ranks_per_node
            )));
        }
        if self.nodes.checked_mul(self.ranks_per_node).is_none_or(|n| n > u32::MAX as usize / 4) {
            return Err(Error::invalid(format!(
                "topology of {} × {} ranks is too big",
                self.nodes, self.ranks_per_node
            )));
        }
        self.intra.validate("intra-node")?;
        self.inter.validate("inter-node")?;
        for (what, bw) in [("reduce", self.reduce_bw), ("copy", self.copy_bw)] {
            if bw.is_nan() || bw <= 0.0 {
                return Err(Error::invalid(format!("{what} bandwidth must be positive, got {bw}")));
            }
        }
        Ok(())
    }
}

impl fmt::Display for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} nodes × {} ranks, intra {}, inter {}{}, reduce {}",
            self.nodes,
            self.ranks_per_node,
            self.intra,
            self.inter,
            match (self.nics, self.rails) {
                (k, _) if k <= 1 => String::new(),
                (k, Rails::ByRank) => format!(" × {k} NICs"),
                (k, Rails::ByChannel) => format!(" × {k} NICs (rails by channel)"),
                (k, Rails::BySender) => format!(" × {k} NICs (rails by channel and sender)"),
            },
            format_bandwidth(self.reduce_bw)
        )?;
        if self.copy_bw.is_finite() {
            write!(f, ", copy {}", format_bandwidth(self.copy_bw))?;
        }
        Ok(())
    }
}

fn nf(n: usize) -> f64 {
    n as f64
}

/// `⌈log2 n⌉` as a float (0 for one rank).
pub fn log2_ceil(n: usize) -> f64 {
    nf(n.max(1).next_power_of_two().trailing_zeros() as usize)
}

/// Ring all-reduce: reduce-scatter then all-gather around the ring, each
/// `n-1` steps of an `S/n` block:
/// `2(n-1)·α + 2(n-1)/n · S·β + (n-1)/n · S·γ`.
pub fn ring_all_reduce(n: usize, bytes: usize, link: Link, gamma: f64) -> f64 {
    let (n, s) = (nf(n), nf(bytes));
    if n <= 1.0 {
        return 0.0;
    }
    2.0 * (n - 1.0) * link.lat + 2.0 * (n - 1.0) / n * s / link.bw + (n - 1.0) / n * s * gamma
}

/// Ring reduce-scatter of `S` bytes in all (nccl-tests' size: `n` blocks):
/// `(n-1)·α + (n-1)/n · S·β + (n-1)/n · S·γ`.
pub fn ring_reduce_scatter(n: usize, bytes: usize, link: Link, gamma: f64) -> f64 {
    let (n, s) = (nf(n), nf(bytes));
    if n <= 1.0 {
        return 0.0;
    }
    (n - 1.0) * link.lat + (n - 1.0) / n * s / link.bw + (n - 1.0) / n * s * gamma
}

/// Ring all-gather of `S` bytes in all: `(n-1)·α + (n-1)/n · S·β`.
pub fn ring_all_gather(n: usize, bytes: usize, link: Link) -> f64 {
    ring_reduce_scatter(n, bytes, link, 0.0)
}

/// Recursive halving/doubling all-reduce (Rabenseifner) for `n` a power of
/// two: `2·log2(n)·α + 2(n-1)/n · S·β + (n-1)/n · S·γ`. For other `n`
/// the ranks beyond the largest power of two first fold into it and get
/// the result back at the end: two more messages of `S`,
/// `+ 2·(α + S·β) + S·γ`.
pub fn rhd_all_reduce(n: usize, bytes: usize, link: Link, gamma: f64) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let p = if n.is_power_of_two() { n } else { n.next_power_of_two() / 2 };
    let (pf, s) = (nf(p), nf(bytes));
    let core = 2.0 * log2_ceil(p) * link.lat + 2.0 * (pf - 1.0) / pf * s / link.bw + (pf - 1.0) / pf * s * gamma;
    if p == n { core } else { core + 2.0 * link.time(s) + s * gamma }
}

/// Recursive-doubling all-reduce: `log2 p` rounds that each move and
/// reduce the whole buffer, `log2 p·(α + S·β + S·γ)`, plus the fold of
/// ranks beyond the power of two as for [`rhd_all_reduce`].
pub fn doubling_all_reduce(n: usize, bytes: usize, link: Link, gamma: f64) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let p = if n.is_power_of_two() { n } else { n.next_power_of_two() / 2 };
    let s = nf(bytes);
    let core = log2_ceil(p) * (link.time(s) + s * gamma);
    if p == n { core } else { core + 2.0 * link.time(s) + s * gamma }
}

/// Pipelined (double) binary tree all-reduce in the limit of many chunks:
/// the reduction climbs and the broadcast descends `log2 n` levels, and in
/// steady state every rank's ports carry about `S` each way per phase:
/// `2·⌈log2 n⌉·α + 2·S·β + S·γ`. Without pipelining (one chunk) the
/// bandwidth term is multiplied by the depth instead; this is the
/// textbook bound NCCL's tree approaches for large messages.
pub fn tree_all_reduce(n: usize, bytes: usize, link: Link, gamma: f64) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let s = nf(bytes);
    2.0 * log2_ceil(n) * link.lat + 2.0 * s / link.bw + s * gamma
}

/// Pipelined chain (or tree) broadcast / reduce in the many-chunk limit:
/// `depth·α + S·β (+ S·γ for reduce)` with `depth = n-1` for the chain and
/// `⌈log2 n⌉` for the binary tree.
pub fn pipelined_rooted(depth: usize, bytes: usize, link: Link, gamma: f64) -> f64 {
    let s = nf(bytes);
    if depth == 0 {
        return 0.0;
    }
    nf(depth) * link.lat + s / link.bw + s * gamma
}

/// What the closed forms price a collective with: every hop at the
/// topology's [`bottleneck`](Topology::bottleneck) link.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Terms {
    /// Ranks.
    pub nranks: usize,
    /// `S`: the collective's size in bytes ([`Collective::size_bytes`]).
    pub bytes: usize,
    /// The root of a rooted collective.
    pub root: usize,
    /// The link every hop takes.
    pub link: Link,
    /// `γ`, seconds per byte reduced; 0 for a collective that does not
    /// reduce.
    pub gamma: f64,
    /// `κ`, seconds per byte copied locally.
    pub copy: f64,
    /// Hosts (the topology's nodes) and ranks on each.
    pub hosts: usize,
    /// Ranks per host.
    pub per_host: usize,
    /// The link between two ranks of one host.
    pub intra: Link,
    /// The link between hosts (one NIC, shared by the ranks that use it).
    pub inter: Link,
    /// NICs per host.
    pub nics: usize,
}

impl Terms {
    /// The terms of `coll` on `topo`.
    pub fn of(coll: &Collective, topo: &Topology) -> Terms {
        Terms {
            nranks: coll.nranks,
            bytes: coll.size_bytes(),
            root: coll.root,
            link: topo.bottleneck(),
            gamma: if coll.kind.reduces() { topo.gamma() } else { 0.0 },
            copy: topo.copy_cost(),
            hosts: topo.nodes,
            per_host: topo.ranks_per_node,
            intra: topo.intra,
            inter: topo.inter,
            nics: topo.nics,
        }
    }
}

mod direct;
pub mod models;
pub use direct::{
    direct_all_gather, direct_from_root, direct_gather, direct_reduce, direct_reduce_scatter, linear_all_to_all,
    linear_gather, linear_scatter, one_shot_all_reduce, pairwise_all_to_all, reads, two_shot_all_reduce,
};

#[cfg(test)]
mod tests;
