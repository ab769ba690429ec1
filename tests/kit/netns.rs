//! "Hosts" for tests: network namespaces, removed on drop. Two are joined
//! by a veth pair (10.211.0.1 and 10.211.0.2); three or more each by a
//! veth to a bridge in a switch namespace of their own (10.211.0.h+1).
//! Each host's interface counts the bytes that leave and enter it, and can
//! be shaped (`tc tbf`). [`Hosts::railed`] adds rails: more links
//! between the same hosts, each on a subnet of its own. Needs root and iproute2: without them the test
//! skips, or fails where `OXCCL_REQUIRE_NETNS` is set (CI).

use crate::child::{output, spawn};
use oxccl::UniqueId;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU32, Ordering};

/// Namespaces joined by veth (and a bridge for three or more).
pub struct Hosts {
    ns: Vec<String>,
    /// The switch namespace, for three or more hosts.
    switch: Option<String>,
    /// Links between the hosts (rails).
    rails: usize,
    tag: u32,
}

impl Hosts {
    /// Two hosts joined by a veth pair, or `None` after saying why not
    /// (not root, or no `ip`): a skip, or a failure where
    /// `OXCCL_REQUIRE_NETNS` is set.
    pub fn new(test: &str) -> Option<Hosts> {
        Hosts::many(test, 2)
    }

    /// `k` hosts joined by `rails` links each, rail `i` on
    /// 10.(211+i).0.0/24 (interfaces `v…` for rail 0, `w{i}…` for the
    /// others): veth pairs between two hosts, a bridge per rail in the
    /// switch namespace for three or more; or `None` as for
    /// [`Hosts::new`].
    pub fn railed(test: &str, k: usize, rails: usize) -> Option<Hosts> {
        let mut hosts = Hosts::many(test, k)?;
        hosts.rails = rails;
        for i in 1..rails {
            hosts.join(i);
        }
        Some(hosts)
    }

    /// Runs `mode` with `l` ranks on each host (numbered as [`host`]
    /// says), `envs` added; every rank's output (each must succeed) and
    /// the bytes that left the hosts' rail-0 interfaces meanwhile.
    pub fn run(&self, l: usize, cyclic: bool, mode: &str, envs: &[(&str, &str)]) -> (Vec<String>, u64) {
        let h = self.len();
        let n = h * l;
        let sent = || (0..h).map(|x| self.bytes(x).0).sum::<u64>();
        let before = sent();
        let id = self.id();
        let kids: Vec<Child> =
            (0..n).map(|r| spawn(&self.prefix(host(cyclic, h, l, r)), &id, n, r, mode, envs)).collect();
        let outs: Vec<String> = kids
            .into_iter()
            .enumerate()
            .map(|(r, k)| {
                let (ok, out) = output(k);
                assert!(ok, "rank {r} of {h}x{l} (cyclic: {cyclic}), {mode} {envs:?}:\n{out}");
                out
            })
            .collect();
        (outs, sent() - before)
    }

    /// `k` hosts (at least 2, at most 26), or `None` as for [`Hosts::new`].
    pub fn many(test: &str, k: usize) -> Option<Hosts> {
        assert!((2..=26).contains(&k), "{k} hosts");
        // The effective uid from /proc (no unsafe in tests).
        let root = std::fs::read_to_string("/proc/self/status")
            .map(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0")))
            .unwrap_or(false);
        let has_ip = Command::new("ip").arg("-V").output().is_ok_and(|o| o.status.success());
        if !root || !has_ip {
            let why = format!(
                "{k} hosts for {test} need root and iproute2 (root: {root}, ip: {has_ip}; apt-get install iproute2)"
            );
            crate::skip_or_fail("OXCCL_REQUIRE_NETNS", why);
            return None;
        }
        // Unique per test of this process: tests of one binary run at once.
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let tag = (std::process::id() % 10_000) * 10 + NEXT.fetch_add(1, Ordering::Relaxed) % 10;
        let ns: Vec<String> = (0..k).map(|h| format!("ox{}{tag}", letter(h))).collect();
        let switch = (k > 2).then(|| format!("oxs{tag}"));
        let hosts = Hosts { ns, switch, rails: 1, tag };
        for n in hosts.ns.iter().chain(&hosts.switch) {
            sh(&format!("ip netns add {n} && ip -n {n} link set lo up"));
        }
        hosts.join(0);
        Some(hosts)
    }

    /// Joins the hosts by rail `i` on 10.(211+i).0.0/24: a veth pair
    /// between two hosts, else a veth from each to a bridge of the rail's
    /// own in the switch namespace.
    fn join(&self, i: usize) {
        let tag = self.tag;
        match &self.switch {
            None => {
                let (a, b) = (&self.ns[0], &self.ns[1]);
                let (da, db) = (self.rail_dev(0, i), self.rail_dev(1, i));
                sh(&format!("ip link add {da} netns {a} type veth peer name {db} netns {b}"));
            }
            Some(s) => {
                sh(&format!("ip -n {s} link add b{i}r{tag} type bridge && ip -n {s} link set b{i}r{tag} up"));
                for (h, n) in self.ns.iter().enumerate() {
                    let (dev, port) = (self.rail_dev(h, i), format!("s{i}{}{tag}", letter(h)));
                    sh(&format!("ip link add {dev} netns {n} type veth peer name {port} netns {s}"));
                    sh(&format!("ip -n {s} link set {port} master b{i}r{tag} && ip -n {s} link set {port} up"));
                }
            }
        }
        for (h, n) in self.ns.iter().enumerate() {
            let dev = self.rail_dev(h, i);
            let ip = format!("10.{}.0.{}/24", 211 + i, h + 1);
            sh(&format!("ip -n {n} addr add {ip} dev {dev} && ip -n {n} link set {dev} up"));
        }
    }

    /// Number of hosts.
    pub fn len(&self) -> usize {
        self.ns.len()
    }

    /// Whether there are none (never: at least two).
    pub fn is_empty(&self) -> bool {
        self.ns.is_empty()
    }

    /// Host `h`'s interface.
    fn dev(&self, h: usize) -> String {
        format!("v{}{}", letter(h), self.tag)
    }

    /// Host `h`'s interface on rail `i`.
    fn rail_dev(&self, h: usize, i: usize) -> String {
        match i {
            0 => self.dev(h),
            _ => format!("w{i}{}{}", letter(h), self.tag),
        }
    }

    /// Bytes host `h` sent on each rail.
    pub fn rail_bytes(&self, h: usize) -> Vec<u64> {
        (0..self.rails).map(|i| self.counter(h, &self.rail_dev(h, i), "tx")).collect()
    }

    /// The command prefix that runs a program on host `h`.
    pub fn prefix(&self, h: usize) -> Vec<String> {
        ["ip", "netns", "exec", &self.ns[h]].iter().map(|s| s.to_string()).collect()
    }

    /// A fresh id whose rendezvous is on host 0, at a port unique to these
    /// hosts.
    pub fn id(&self) -> UniqueId {
        let addr = format!("10.211.0.1:{}", 20000 + self.tag % 20000).parse().unwrap();
        UniqueId::from_addr(addr, UniqueId::new().unwrap().nonce())
    }

    /// Bytes host `h`'s interface has sent and received (its counters,
    /// frames with their headers).
    pub fn bytes(&self, h: usize) -> (u64, u64) {
        let dev = self.dev(h);
        (self.counter(h, &dev, "tx"), self.counter(h, &dev, "rx"))
    }

    fn counter(&self, h: usize, dev: &str, what: &str) -> u64 {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns[h], "cat"])
            .arg(format!("/sys/class/net/{dev}/statistics/{what}_bytes"))
            .output()
            .expect("ip netns exec cat");
        let text = String::from_utf8_lossy(&out.stdout);
        text.trim().parse::<u64>().unwrap_or_else(|_| panic!("{dev} {what}_bytes: {out:?}"))
    }

    /// Shapes what host `h` sends on every rail (see [`Hosts::shape`]).
    pub fn shape_rails(&self, h: usize, rate: &str) -> bool {
        (0..self.rails).all(|i| self.shape_dev(h, &self.rail_dev(h, i), rate))
    }

    /// Shapes what host `h` sends to `rate` (`tc tbf`, e.g. "200mbit"), or
    /// says why it cannot (no `tc`) and returns false.
    pub fn shape(&self, h: usize, rate: &str) -> bool {
        self.shape_dev(h, &self.dev(h), rate)
    }

    fn shape_dev(&self, h: usize, dev: &str, rate: &str) -> bool {
        let cmd = format!("tc -n {} qdisc replace dev {dev} root tbf rate {rate} burst 256kb latency 50ms", self.ns[h]);
        Command::new("sh").arg("-c").arg(&cmd).status().is_ok_and(|s| s.success())
    }

    /// Takes rail `i` down at host 0's end (see [`Hosts::link_down`]).
    pub fn rail_down(&self, i: usize) {
        sh(&format!("ip -n {} link set {} down", self.ns[0], self.rail_dev(0, i)));
    }

    /// Takes the link down at host 0's end: nothing crosses any more, and
    /// neither end is told (no reset, no FIN).
    pub fn link_down(&self) {
        sh(&format!("ip -n {} link set {} down", self.ns[0], self.dev(0)));
    }
}

/// The host of rank `r` among `h` hosts of `l` ranks: blocked (host `x`
/// has ranks `x·l ..`) or cyclic (rank `r` on host `r mod h`).
pub fn host(cyclic: bool, h: usize, l: usize, r: usize) -> usize {
    if cyclic { r % h } else { r / l }
}

/// Host `h`'s letter in names.
fn letter(h: usize) -> char {
    (b'a' + h as u8) as char
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for ns in self.ns.iter().chain(&self.switch) {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

fn sh(args: &str) {
    let ok = Command::new("sh").arg("-c").arg(args).status().is_ok_and(|s| s.success());
    assert!(ok, "`{args}` failed");
}
