//! Two "hosts" for tests: network namespaces joined by a veth pair
//! (10.211.0.1 and 10.211.0.2), removed on drop. Needs root and iproute2:
//! without them the test skips, or fails where `OXCCL_REQUIRE_NETNS` is set
//! (CI).

use oxccl::UniqueId;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Two namespaces joined by a veth pair.
pub struct Hosts {
    ns: [String; 2],
    tag: u32,
}

impl Hosts {
    /// Makes them, or says why it cannot and returns `None` (not root, or
    /// no `ip`): a skip, or a failure where `OXCCL_REQUIRE_NETNS` is set.
    pub fn new(test: &str) -> Option<Hosts> {
        // The effective uid from /proc (no unsafe in tests).
        let root = std::fs::read_to_string("/proc/self/status")
            .map(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0")))
            .unwrap_or(false);
        let has_ip = Command::new("ip").arg("-V").output().is_ok_and(|o| o.status.success());
        if !root || !has_ip {
            let why = format!(
                "two hosts for {test} need root and iproute2 (root: {root}, ip: {has_ip}; apt-get install iproute2)"
            );
            crate::skip_or_fail("OXCCL_REQUIRE_NETNS", why);
            return None;
        }
        // Unique per test of this process: tests of one binary run at once.
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let tag = (std::process::id() % 10_000) * 10 + NEXT.fetch_add(1, Ordering::Relaxed) % 10;
        let hosts = Hosts { ns: [format!("oxa{tag}"), format!("oxb{tag}")], tag };
        let [a, b] = &hosts.ns;
        sh(&format!("ip netns add {a} && ip netns add {b}"));
        sh(&format!("ip link add va{tag} netns {a} type veth peer name vb{tag} netns {b}"));
        for (i, (ns, end)) in [(a, "va"), (b, "vb")].into_iter().enumerate() {
            sh(&format!(
                "ip -n {ns} addr add 10.211.0.{}/24 dev {end}{tag} && ip -n {ns} link set {end}{tag} up && ip -n {ns} link set lo up",
                i + 1
            ));
        }
        Some(hosts)
    }

    /// The command prefix that runs a program on host `h` (0 or 1).
    pub fn prefix(&self, h: usize) -> Vec<String> {
        ["ip", "netns", "exec", &self.ns[h]].iter().map(|s| s.to_string()).collect()
    }

    /// A fresh id whose rendezvous is on host 0, at a port unique to these
    /// hosts.
    pub fn id(&self) -> UniqueId {
        let addr = format!("10.211.0.1:{}", 20000 + self.tag % 20000).parse().unwrap();
        UniqueId::from_addr(addr, UniqueId::new().unwrap().nonce())
    }

    /// Takes the link down at host 0's end: nothing crosses any more, and
    /// neither end is told (no reset, no FIN).
    pub fn link_down(&self) {
        sh(&format!("ip -n {} link set va{} down", self.ns[0], self.tag));
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for ns in &self.ns {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

fn sh(args: &str) {
    let ok = Command::new("sh").arg("-c").arg(args).status().is_ok_and(|s| s.success());
    assert!(ok, "`{args}` failed");
}
