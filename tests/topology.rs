//! Hosts as network namespaces (see `oxccl_e2e::netns`), ranks numbered
//! blocked (host `h` has ranks `h·L ..`) and cyclically (rank `r` on host
//! `r mod H`): every collective across them, and the bytes the hosts'
//! interfaces carry against what the verifier says crosses hosts. On
//! threads: the discovered topology, and hosts declared by a topology file
//! (`OXCCL_TOPO_FILE`), which the algorithms follow.

use oxccl::{CollKind, Communicator, Config, DataType, ReduceOp};
use oxccl_algo::placement::Placement;
use oxccl_e2e::child;
use oxccl_e2e::netns::{Hosts, host};
use oxccl_e2e::{DTYPES, config, matrix, on_threads, run_case};
use std::path::PathBuf;

/// Every collective × type, checked, on 2 and 3 hosts of 2 or 3 ranks,
/// numbered both ways, with the hierarchical algorithms, the rings that
/// follow the hosts, the trees over hosts, Bruck's and the tuner's picks; shared memory inside hosts and
/// TCP across, or the software RDMA HCA between every pair.
#[test]
fn every_collective_across_hosts() {
    for (h, l, cyclic, algo, rdma) in [
        (2, 2, true, "hier", false),
        (3, 2, false, "hier", false),
        (2, 3, true, "", false),
        (3, 2, true, "ring", false),
        (2, 2, true, "hier", true),
        (3, 2, true, "tree", false),
        (2, 3, false, "bruck", false),
    ] {
        let Some(hosts) = Hosts::many("every_collective_across_hosts", h) else { return };
        let mut envs = vec![("OXCCL_ALGO", algo)];
        if rdma {
            envs.extend([("OXCCL_TRANSPORT", "rdma"), ("OXCCL_IB_PROVIDER", "soft")]);
        }
        let (outs, _) = hosts.run(l, cyclic, "matrix", &envs);
        for (r, out) in outs.iter().enumerate() {
            let h_r = host(cyclic, h, l, r);
            for p in (0..h * l).filter(|&p| p != r) {
                let kind = match (rdma, host(cyclic, h, l, p) == h_r) {
                    (true, _) => "rdma",
                    (false, true) => "shm",
                    (false, false) => "tcp",
                };
                assert!(out.contains(&format!(" {p}:{kind}")), "rank {r}: not {p}:{kind}:\n{out}");
            }
        }
    }
}

/// An all_reduce of S bytes on 2 hosts × 2 ranks: whatever the numbering,
/// the tuner's pick (priced by simulating the placement: `hier`, or `rhd`
/// when cyclic numbering puts its first exchange inside the hosts) moves
/// 2S across (S each way, the lower bound); the ring that follows the
/// hosts 3S (two crossings of 1.5 S).
/// The interfaces count frames with their headers and init's traffic:
/// up to 10% and 1 MiB more.
#[test]
fn bytes_crossing_hosts_follow_the_topology() {
    let count = 4usize << 20;
    let s = (count * 4) as u64;
    for cyclic in [false, true] {
        for (algo, want) in [("", 2 * s), ("ring", 3 * s)] {
            let Some(hosts) = Hosts::new("bytes_crossing_hosts_follow_the_topology") else { return };
            let envs = [("OXCCL_ALGO", algo), ("OXCCL_TEST_COUNT", &count.to_string())];
            let (outs, crossed) = hosts.run(2, cyclic, "volume", &envs);
            let picked = outs[0].split("CHOICE ").nth(1).and_then(|l| l.split_whitespace().next()).unwrap_or("?");
            assert!(outs.iter().all(|o| o.contains(&format!("CHOICE {picked}"))), "{outs:?}");
            assert!(algo.is_empty() || picked == algo, "{outs:?}");
            let what = format!("{picked}, cyclic {cyclic}: {crossed} bytes crossed, {} S", crossed as f64 / s as f64);
            println!("{what}");
            assert!(crossed >= want && crossed <= want + want / 10 + (1 << 20), "{what}; want {want}");
        }
    }
    // What a rank-order ring does with cyclic numbering (the topology file
    // puts every rank on one host, so the ring follows rank numbers):
    // every hop crosses, 6S.
    let flat = temp("flat.json");
    std::fs::write(&flat, r#"{"hosts":[{"id":"one","ranks":[0,1,2,3]}]}"#).unwrap();
    let Some(hosts) = Hosts::new("bytes_crossing_hosts_follow_the_topology") else { return };
    let envs =
        [("OXCCL_ALGO", "ring"), ("OXCCL_TEST_COUNT", &count.to_string()), ("OXCCL_TOPO_FILE", flat.to_str().unwrap())];
    let (_, crossed) = hosts.run(2, true, "volume", &envs);
    println!("rank-order ring, cyclic true: {crossed} bytes crossed, {} S", crossed as f64 / s as f64);
    assert!(crossed >= 6 * s && crossed <= 6 * s + 6 * s / 10 + (1 << 20), "{crossed}");
    let _ = std::fs::remove_file(&flat);
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("oxccl-topo-{}-{name}", std::process::id()))
}

/// Threads of one process are one host; rank 0 dumps what every rank
/// agreed on, and the dump loads back as a topology file.
#[test]
fn threads_are_one_host_and_the_dump_loads_back() {
    let dump = temp("dump.json");
    let cfg = Config { topo_dump_file: Some(dump.clone()), ..config(None) };
    let comms = Communicator::init_threads_with(3, cfg).unwrap();
    for c in &comms {
        let t = c.topology();
        assert_eq!((t.nhosts(), t.ranks_per_host(), t.host_of()), (1, Some(3), vec![0, 0, 0]));
        assert_eq!(t, comms[0].topology(), "rank {} agrees with rank 0", c.rank());
        assert!(!t.hosts[0].facts.numa.is_empty() || !std::path::Path::new("/sys/devices/system/node").exists());
        assert!(c.placement().is_flat());
    }
    drop(comms);
    let text = std::fs::read_to_string(&dump).unwrap();
    let cfg = Config { topo_file: Some(dump.clone()), algo: Some("hier".into()), ..config(None) };
    on_threads(3, cfg, |c| run_case(c, CollKind::AllReduce, DataType::Float32, 1001, ReduceOp::Sum, 0, false));
    assert!(text.contains("\"hosts\""), "{text}");
    let _ = std::fs::remove_file(&dump);
}

/// Hosts declared by a file: the algorithms follow them (rings along the
/// hosts, hier across them) and every collective is right, numbered
/// cyclically.
#[test]
fn declared_hosts_are_followed() {
    let file = temp("cyclic.json");
    std::fs::write(&file, r#"{"hosts":[{"id":"a","ranks":[0,2,4]},{"id":"b","ranks":[1,3,5]}]}"#).unwrap();
    for algo in ["hier", "ring", ""] {
        let cfg = Config { topo_file: Some(file.clone()), algo: Some(algo.into()), ..config(None) };
        on_threads(6, cfg, |c| {
            if *c.placement() != Placement::cyclic(2, 3) {
                return Err(format!("placement {}", c.placement()));
            }
            matrix(c, &[0, 1, 7, 1000], &DTYPES).map(|_| ())?;
            for in_place in [false, true] {
                for kind in [CollKind::AllReduce, CollKind::ReduceScatter, CollKind::AllGather] {
                    run_case(c, kind, DataType::Bfloat16, 300_007, ReduceOp::Sum, 0, in_place)?;
                }
            }
            Ok(())
        });
    }
    let _ = std::fs::remove_file(&file);
}

/// A file that leaves a rank out, or ranks that read different files, fail
/// init naming what is wrong.
#[test]
fn bad_or_different_topology_files_fail_init() {
    let bad = temp("bad.json");
    std::fs::write(&bad, r#"{"hosts":[{"id":"a","ranks":[0]},{"id":"b","ranks":[2]}]}"#).unwrap();
    let cfg = Config { topo_file: Some(bad.clone()), ..config(None) };
    let Err(e) = Communicator::init_threads_with(3, cfg).map(drop) else { panic!("a file without rank 1 was taken") };
    let e = e.to_string();
    assert!(e.contains("rank 1 is on no host") && e.contains("bad.json"), "{e}");
    let (a, b) = (temp("a.json"), temp("b.json"));
    std::fs::write(&a, r#"{"hosts":[{"id":"a","ranks":[0,1]},{"id":"b","ranks":[2,3]}]}"#).unwrap();
    std::fs::write(&b, r#"{"hosts":[{"id":"a","ranks":[0,2]},{"id":"b","ranks":[1,3]}]}"#).unwrap();
    let errs = oxccl_e2e::init_failures(4, |r| Config {
        topo_file: Some(if r == 3 { b.clone() } else { a.clone() }),
        ..config(None)
    });
    for (r, e) in errs.iter().enumerate() {
        assert!(e.contains("OXCCL_TOPO_FILE") && e.contains("every rank must read the same"), "rank {r}: {e}");
    }
    for f in [bad, a, b] {
        let _ = std::fs::remove_file(f);
    }
}

/// The shaped-link benchmark of docs/TOPOLOGY.md: 2 hosts × 2 ranks
/// numbered cyclically, each host's interface shaped to `OXCCL_TEST_RATE`
/// (default 1gbit) with `tc tbf`; all_reduce at 1, 4 and 16 MiB with the
/// tuner's pick, with `hier`, with the ring along the hosts and with the
/// rank-order ring (a topology file that puts every rank on one host).
/// Prints each one's seconds per call and the ratios; asserts nothing on
/// time.
#[test]
#[ignore = "a benchmark (a minute): cargo test --release -p oxccl-e2e --test e2e -- --ignored --nocapture topology::shaped"]
fn shaped_link_benchmark() {
    let Some(hosts) = Hosts::new("shaped_link_benchmark") else { return };
    let rate = std::env::var("OXCCL_TEST_RATE").unwrap_or_else(|_| "1gbit".into());
    assert!(hosts.shape(0, &rate) && hosts.shape(1, &rate), "tc tbf failed (is tc installed?)");
    let flat = temp("bench-flat.json");
    std::fs::write(&flat, r#"{"hosts":[{"id":"one","ranks":[0,1,2,3]}]}"#).unwrap();
    let runs: [(&str, Vec<(&str, &str)>); 4] = [
        ("tuner", vec![]),
        ("hier", vec![("OXCCL_ALGO", "hier")]),
        ("ring along the hosts", vec![("OXCCL_ALGO", "ring")]),
        ("rank-order ring", vec![("OXCCL_ALGO", "ring"), ("OXCCL_TOPO_FILE", flat.to_str().unwrap())]),
    ];
    let mut table: Vec<(String, Vec<(u64, f64)>)> = Vec::new();
    for (name, envs) in &runs {
        let (outs, _) = hosts.run(2, true, "bench", envs);
        let rows = child::bench_rows(&outs[0]);
        assert_eq!(rows.len(), 3, "{name}: {}", outs[0]);
        table.push((name.to_string(), rows));
    }
    println!("all_reduce, 2 hosts x 2 ranks numbered cyclically, links shaped to {rate}: seconds per call");
    for (name, rows) in &table {
        let cells: Vec<String> = rows.iter().map(|(b, t)| format!("{} MiB {t:.4} s", b >> 20)).collect();
        println!("  {name:>22}: {}", cells.join(", "));
    }
    let base = &table[3].1;
    for (name, rows) in &table[..3] {
        let ratios: Vec<String> =
            rows.iter().zip(base).map(|((b, t), (_, r))| format!("{} MiB {:.2}x", b >> 20, r / t)).collect();
        println!("  rank-order ring / {name}: {}", ratios.join(", "));
    }
    let _ = std::fs::remove_file(&flat);
}
