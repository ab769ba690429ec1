use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use super::discover::{numa_of, parse_cpulist, parse_rate, parse_state};
use super::*;

/// A directory under the system's temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("oxccl-topo-{tag}-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Writes `text` at `root/rel`, creating directories.
fn put(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, text).unwrap();
}

/// A NIC whose device lives at `root/devices/<dev>` and is linked from
/// `class/net/<name>` the way sysfs does it.
fn nic(root: &Path, name: &str, dev: &str, attrs: &[(&str, &str)]) {
    for (k, v) in attrs {
        put(root, &format!("devices/{dev}/{k}"), v);
    }
    fs::create_dir_all(root.join("class/net")).unwrap();
    symlink(format!("../../devices/{dev}"), root.join("class/net").join(name)).unwrap();
}

fn fake_sysfs(root: &Path) {
    nic(
        root,
        "eth0",
        "pci0000:00/0000:00:03.0/net/eth0",
        &[("speed", "25000\n"), ("operstate", "up\n"), ("device/numa_node", "1\n")],
    );
    nic(
        root,
        "eth1",
        "pci0000:00/0000:00:04.0/net/eth1",
        &[("speed", "-1\n"), ("operstate", "down\n"), ("device/numa_node", "-1\n")],
    );
    nic(root, "lo", "virtual/net/lo", &[("operstate", "unknown\n")]);
    nic(root, "veth0", "virtual/net/veth0", &[("speed", "10000\n"), ("operstate", "up\n")]);
    put(root, "class/net/bonding_masters", "\n");
    put(root, "class/infiniband/mlx5_0/ports/1/rate", "400 Gb/sec (4X NDR)\n");
    put(root, "class/infiniband/mlx5_0/ports/1/state", "4: ACTIVE\n");
    put(root, "class/infiniband/mlx5_0/ports/1/gid_attrs/ndevs/0", "eth0\n");
    put(root, "class/infiniband/mlx5_0/ports/2/rate", "100 Gb/sec (4X EDR)\n");
    put(root, "class/infiniband/mlx5_0/ports/2/state", "1: DOWN\n");
    for (bdf, vendor, class, numa) in [
        ("0000:3b:00.0", "0x10de", "0x030200", "1"),
        ("0000:05:00.0", "0x10de", "0x068000", "0"), // an NVIDIA bridge, not a GPU
        ("0000:00:1f.0", "0x8086", "0x030000", "0"), // a display controller, not NVIDIA
    ] {
        put(root, &format!("bus/pci/devices/{bdf}/vendor"), &format!("{vendor}\n"));
        put(root, &format!("bus/pci/devices/{bdf}/class"), &format!("{class}\n"));
        put(root, &format!("bus/pci/devices/{bdf}/numa_node"), &format!("{numa}\n"));
    }
    put(root, "devices/system/node/node1/cpulist", "4-7,12\n");
    put(root, "devices/system/node/node0/cpulist", "0-3\n");
    put(root, "devices/system/node/possible", "0-1\n");
}

#[test]
fn discover_in_reads_a_fake_sysfs() {
    let tmp = TempDir::new("sysfs");
    fake_sysfs(&tmp.0);
    let f = HostFacts::discover_in(&tmp.0);
    assert!(!f.name.is_empty());
    let nic = |name: &str, speed, up, numa, virtual_| Nic { name: name.into(), speed_mbps: speed, up, numa, virtual_ };
    assert_eq!(
        f.nics,
        vec![
            nic("eth0", Some(25000), true, Some(1), false),
            nic("eth1", None, false, None, false),
            nic("veth0", Some(10000), true, None, true),
        ]
    );
    assert_eq!(
        f.rdma,
        vec![
            RdmaPort {
                device: "mlx5_0".into(),
                port: 1,
                rate_gbps: Some(400.0),
                state: "ACTIVE".into(),
                netdev: Some("eth0".into())
            },
            RdmaPort { device: "mlx5_0".into(), port: 2, rate_gbps: Some(100.0), state: "DOWN".into(), netdev: None },
        ]
    );
    assert_eq!(f.gpus, vec![Gpu { pci_bus_id: "0000:3b:00.0".into(), numa: Some(1) }]);
    assert_eq!(
        f.numa,
        vec![NumaNode { id: 0, cpus: vec![0, 1, 2, 3] }, NumaNode { id: 1, cpus: vec![4, 5, 6, 7, 12] }]
    );
}

#[test]
fn discover_in_an_empty_tree_finds_nothing() {
    let tmp = TempDir::new("empty");
    let f = HostFacts::discover_in(&tmp.0.join("missing"));
    assert_eq!((f.nics.len(), f.rdma.len(), f.gpus.len(), f.numa.len()), (0, 0, 0, 0));
}

#[test]
fn cpulists_parse_and_junk_is_refused() {
    assert_eq!(parse_cpulist(""), Ok(vec![]));
    assert_eq!(parse_cpulist("\n"), Ok(vec![]));
    assert_eq!(parse_cpulist("5"), Ok(vec![5]));
    assert_eq!(parse_cpulist("0-3,8-9\n"), Ok(vec![0, 1, 2, 3, 8, 9]));
    assert_eq!(parse_cpulist(" 8, 1-2 ,2"), Ok(vec![1, 2, 8]));
    assert!(parse_cpulist("3-1").unwrap_err().contains("\"3-1\""));
    assert!(parse_cpulist("0-3,x").unwrap_err().contains("\"x\""));
    assert!(parse_cpulist("0-7:2").is_err());
    assert!(parse_cpulist("-1").is_err());
}

#[test]
fn numa_of_needs_exactly_one_holder() {
    let nodes = [NumaNode { id: 0, cpus: vec![0, 1] }, NumaNode { id: 1, cpus: vec![2, 3] }];
    assert_eq!(numa_of(&[2, 3], &nodes), Some(1));
    assert_eq!(numa_of(&[1, 2], &nodes), None);
    assert_eq!(numa_of(&[], &nodes), None);
    assert_eq!(numa_of(&[9], &nodes), None);
}

#[test]
fn rates_and_states_parse() {
    assert_eq!(parse_rate("400 Gb/sec (4X NDR)"), Some(400.0));
    assert_eq!(parse_rate("2.5 Gb/sec (1X SDR)"), Some(2.5));
    assert_eq!(parse_rate("junk"), None);
    assert_eq!(parse_state("4: ACTIVE"), "ACTIVE");
    assert_eq!(parse_state("DOWN"), "DOWN");
}

fn facts(host: &str, pid: u32) -> (RankFacts, HostFacts) {
    let r = RankFacts { host_id: host.into(), pid, cpus: vec![pid], numa: Some(0) };
    (r, HostFacts { name: format!("name-{host}-{pid}"), ..HostFacts::default() })
}

fn cyclic() -> Topology {
    Topology::assemble(vec![facts("a", 10), facts("b", 11), facts("a", 12), facts("b", 13)])
}

#[test]
fn assemble_numbers_hosts_by_first_rank() {
    let t = cyclic();
    assert_eq!(t.nhosts(), 2);
    assert_eq!(t.hosts[0].ranks, vec![0, 2]);
    assert_eq!(t.hosts[1].ranks, vec![1, 3]);
    assert_eq!(t.hosts[1].facts.name, "name-b-11", "a host's facts come from its first rank");
    assert_eq!((t.ranks[3].host, t.ranks[3].local, t.ranks[3].pid), (1, 1, 13));
    assert_eq!(t.host_of(), vec![0, 1, 0, 1]);
    assert_eq!(t.ranks_per_host(), Some(2));
    let uneven = Topology::assemble(vec![facts("a", 1), facts("a", 2), facts("b", 3)]);
    assert_eq!(uneven.ranks_per_host(), None);
}

#[test]
fn facts_encode_and_decode() {
    let (r, h) = facts("a", 7);
    assert_eq!(decode(3, &encode(&r, &h)).unwrap(), (r, h));
    let e = decode(3, b"{not json").unwrap_err().to_string();
    assert!(e.contains("rank 3"), "{e}");
}

#[test]
fn json_round_trips() {
    let tmp = TempDir::new("json");
    fake_sysfs(&tmp.0);
    let host = HostFacts::discover_in(&tmp.0);
    let mut t = cyclic();
    t.hosts[0].facts = host;
    let text = t.to_json();
    assert!(text.contains("\"virtual\": true"), "{text}");
    assert_eq!(Topology::from_json(&text, 4).unwrap(), t);
    let e = Topology::from_json(&text, 5).unwrap_err().to_string();
    assert!(e.contains("rank 4 is on no host"), "{e}");
}

#[test]
fn a_minimal_hand_written_file_loads() {
    let tmp = TempDir::new("file");
    let path = tmp.0.join("topo.json");
    fs::write(&path, r#"{"hosts":[{"id":"x","ranks":[1,0]},{"id":"y","ranks":[2,3]}]}"#).unwrap();
    let t = Topology::load(&path, 4).unwrap();
    assert_eq!(t.host_of(), vec![0, 0, 1, 1]);
    assert_eq!(t.hosts[0].ranks, vec![0, 1]);
    assert_eq!(t.hosts[1].facts.name, "y");
    assert_eq!((t.ranks[1].local, t.ranks[1].pid, t.ranks[1].cpus.len()), (1, 0, 0));
    let e = Topology::load(&tmp.0.join("absent.json"), 4).unwrap_err().to_string();
    assert!(e.contains("absent.json"), "{e}");
    fs::write(&path, r#"{"hosts":[{"id":"x","ranks":[0,0]}]}"#).unwrap();
    let e = Topology::load(&path, 1).unwrap_err().to_string();
    assert!(e.contains("topo.json") && e.contains("rank 0 is listed twice on host 0"), "{e}");
}

#[test]
fn bad_files_are_refused_naming_the_rank_or_host() {
    let cases = [
        (r#"{"hosts":[{"id":"x","ranks":[0,1,3]},{"id":"y","ranks":[2,3]}]}"#, "rank 3 is on hosts 0 and 1"),
        (r#"{"hosts":[{"id":"x","ranks":[0,1]},{"id":"y","ranks":[2]}]}"#, "rank 3 is on no host"),
        (r#"{"hosts":[{"id":"x","ranks":[0,1]},{"id":"y","ranks":[2,3,9]}]}"#, "rank 9 is out of range for 4 ranks"),
        (r#"{"hosts":[{"id":"x","ranks":[0,1,2,3]},{"id":"y","ranks":[]}]}"#, "host 1 (\"y\") has no ranks"),
        (r#"{"hosts":[{"id":"x","ranks":[0,1]},{"id":"x","ranks":[2,3]}]}"#, "hosts 0 and 1 have the same id"),
        (r#"{"hosts":[{"id":"x","ranks":[0,1,2,3]}],"rnaks":[]}"#, "unknown field `rnaks`"),
        (r#"{"hosts":"#, "not a topology"),
    ];
    for (text, want) in cases {
        let e = Topology::from_json(text, 4).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        let e = e.to_string();
        assert!(e.contains("OXCCL_TOPO_FILE") && e.contains(want), "{text}: {e}");
    }
}

#[test]
fn rank_entries_must_agree_with_hosts() {
    let mut t = cyclic();
    t.ranks[2].local = 0;
    let e = Topology::from_json(&t.to_json(), 4).unwrap_err().to_string();
    assert!(e.contains("rank 2 has local index 0"), "{e}");
    let mut t = cyclic();
    t.ranks[1].host = 0;
    let e = Topology::from_json(&t.to_json(), 4).unwrap_err().to_string();
    assert!(e.contains("rank 1 is on host 0 in \"ranks\" but on host 1"), "{e}");
    let mut t = cyclic();
    t.ranks.pop();
    let e = Topology::from_json(&t.to_json(), 4).unwrap_err().to_string();
    assert!(e.contains("3 entries for 4 ranks"), "{e}");
}

#[test]
fn hosts_out_of_order_are_renumbered() {
    let text = r#"{"hosts":[{"id":"late","ranks":[3,1]},{"id":"early","ranks":[2,0]}],
        "ranks":[{"host":1,"local":0,"pid":40},{"host":0,"local":0,"pid":41},
                 {"host":1,"local":1,"pid":42},{"host":0,"local":1,"pid":43}]}"#;
    let t = Topology::from_json(text, 4).unwrap();
    assert_eq!(t.hosts.iter().map(|h| h.id.as_str()).collect::<Vec<_>>(), ["early", "late"]);
    assert_eq!(t.host_of(), vec![0, 1, 0, 1]);
    assert_eq!(t.ranks.iter().map(|r| r.pid).collect::<Vec<_>>(), [40, 41, 42, 43]);
    assert_eq!(t, Topology::from_json(&t.to_json(), 4).unwrap(), "canonical after one pass");
}

#[test]
fn summary_is_one_line_per_host() {
    let tmp = TempDir::new("summary");
    fake_sysfs(&tmp.0);
    let host = HostFacts { name: "node7".into(), ..HostFacts::discover_in(&tmp.0) };
    let mut rank_facts: Vec<_> = (0..9).map(|r| facts(if r == 4 || r == 5 { "b" } else { "a" }, r)).collect();
    rank_facts[0].1 = host;
    let lines = Topology::assemble(rank_facts).summary();
    assert_eq!(lines.len(), 2);
    assert_eq!(
        lines[0],
        "host 0 \"node7\": ranks 0-3,6-8 · NUMA 2 · nics eth0 25Gb/s, eth1 (no speed) down, +1 virtual · \
         rdma mlx5_0:1 400Gb/s ACTIVE, mlx5_0:2 100Gb/s DOWN · gpus 1"
    );
    assert_eq!(lines[1], "host 1 \"name-b-4\": ranks 4,5 · NUMA 0 · nics none · rdma none · gpus 0");
}

#[test]
fn discover_on_this_machine() {
    let h = HostFacts::discover();
    assert!(!h.numa.is_empty(), "no NUMA node under /sys/devices/system/node: {h:?}");
    assert!(h.nics.iter().all(|n| n.name != "lo"));
    let r = RankFacts::discover("me".into());
    assert_eq!(r.pid, std::process::id());
    assert!(!r.cpus.is_empty(), "no Cpus_allowed_list in /proc/thread-self/status");
    let t = Topology::assemble(vec![(r.clone(), h.clone()), (r, h)]);
    assert_eq!(Topology::from_json(&t.to_json(), 2).unwrap(), t);
}
