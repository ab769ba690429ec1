//! Ranks as processes (see `oxccl_e2e::child`): over shared memory, over TCP,
//! across two network namespaces, and a rank killed mid-collective.

use oxccl::{Communicator, Config, DataType, ReduceOp, UniqueId};
use oxccl_e2e::child::{self, fresh_id, output, spawn};
use oxccl_e2e::{DTYPES, matrix, run_case};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

#[test]
#[ignore = "a rank's body, started by the other tests of this file"]
fn child() {
    let Some((mode, id, rank, size)) = child::rank_env() else { return };
    let comm = match Communicator::init(&id, size, rank, Config::default()) {
        Ok(c) => c,
        Err(e) => {
            println!("ERROR init: {e}");
            std::process::exit(3);
        }
    };
    let kinds: Vec<String> =
        (0..size).filter(|&p| p != rank).map(|p| format!("{p}:{}", comm.transport_to(p).unwrap())).collect();
    println!("KINDS {}", kinds.join(" "));
    let result = match mode.as_str() {
        "matrix" => matrix(&comm, &[0, 1, 7, 1000], &DTYPES).and_then(|cases| {
            for kind in oxccl_e2e::kinds() {
                run_case(&comm, kind, DataType::Float32, 1_000_003, ReduceOp::Sum, size - 1, false)?;
                run_case(&comm, kind, DataType::Int32, 1_000_003, ReduceOp::Max, 0, true)?;
            }
            println!("CASES {cases}");
            Ok(())
        }),
        "loop" => {
            let mut buf = vec![1.0f32; 4 << 20];
            let mut i = 0u64;
            loop {
                if let Err(e) = comm.all_reduce_in_place(&mut buf, ReduceOp::Max) {
                    break Err(e.to_string());
                }
                i += 1;
                if i == 2 {
                    println!("READY");
                }
            }
        }
        other => Err(format!("unknown mode {other}")),
    };
    child::report(result);
}

/// The matrix on `n` ranks over `transport`, with `env` besides.
fn run_matrix(n: usize, transport: &str, env: &[(&str, &str)]) {
    let id = fresh_id();
    let mut envs = vec![("OXCCL_TRANSPORT", transport)];
    envs.extend_from_slice(env);
    let kids: Vec<Child> = (0..n).map(|r| spawn(&[], &id, n, r, "matrix", &envs)).collect();
    for (r, k) in kids.into_iter().enumerate() {
        let (ok, out) = output(k);
        assert!(ok && out.contains("\nOK") || out.starts_with("OK"), "rank {r} of {n} over {transport}:\n{out}");
        assert!(out.contains(&format!(":{transport}")) || n == 1, "rank {r} did not use {transport}:\n{out}");
    }
}

#[test]
fn processes_over_shm() {
    for n in 2..=4 {
        run_matrix(n, "shm", &[]);
    }
}

#[test]
fn processes_over_tcp() {
    for n in 2..=4 {
        run_matrix(n, "tcp", &[]);
    }
}

/// Every collective × type over RDMA with the software HCA, ranks as
/// processes.
#[test]
fn processes_over_rdma_soft() {
    for n in [2, 3] {
        run_matrix(n, "rdma", &[("OXCCL_IB_PROVIDER", "soft")]);
    }
}

fn leftover_segments(id: &UniqueId) -> Vec<String> {
    let tag: String = id.nonce()[..8].iter().map(|b| format!("{b:02x}")).collect();
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten().map(|e| e.file_name().to_string_lossy().to_string()).filter(|n| n.contains(&tag)).collect()
        })
        .unwrap_or_default()
}

fn kill_mid_collective(transport: &str, env: &[(&str, &str)]) {
    let n = 3;
    let id = fresh_id();
    let mut envs = vec![("OXCCL_TRANSPORT", transport)];
    envs.extend_from_slice(env);
    let mut kids: Vec<Child> = (0..n).map(|r| spawn(&[], &id, n, r, "loop", &envs)).collect();
    // Wait until every rank is inside the loop.
    let mut readers = Vec::new();
    for k in &mut kids {
        let mut r = BufReader::new(k.stdout.take().unwrap());
        let mut line = String::new();
        loop {
            line.clear();
            assert!(r.read_line(&mut line).unwrap() > 0, "a rank ended before it was ready");
            if line.starts_with("READY") {
                break;
            }
        }
        readers.push(r);
    }
    kids[1].kill().unwrap();
    let killed = Instant::now();
    kids[1].wait().unwrap();
    for r in [0, 2] {
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut readers[r], &mut rest).unwrap();
        let status = kids[r].wait().unwrap();
        let took = killed.elapsed();
        assert!(!status.success(), "rank {r} did not fail:\n{rest}");
        assert!(rest.contains("ERROR") && rest.contains("rank 1"), "rank {r} over {transport} said:\n{rest}");
        assert!(took < Duration::from_secs(10), "rank {r} took {took:?} to notice");
    }
    assert!(leftover_segments(&id).is_empty(), "segments left in /dev/shm: {:?}", leftover_segments(&id));
}

#[test]
fn killed_rank_is_an_error_everywhere_over_shm() {
    kill_mid_collective("shm", &[]);
}

#[test]
fn killed_rank_is_an_error_everywhere_over_tcp() {
    kill_mid_collective("tcp", &[]);
}

#[test]
fn killed_rank_is_an_error_everywhere_over_rdma() {
    kill_mid_collective("rdma", &[("OXCCL_IB_PROVIDER", "soft")]);
}

/// Two "hosts": network namespaces joined by a veth pair, two ranks in
/// each; ranks talk TCP across and shared memory inside a namespace.
#[test]
fn two_hosts_over_veth() {
    over_veth("two_hosts_over_veth", &[], |r| {
        let other_host = if r < 2 { "2:tcp" } else { "0:tcp" };
        let same_host = if r < 2 { format!("{}:shm", 1 - r) } else { format!("{}:shm", 5 - r) };
        vec![other_host.to_string(), same_host]
    });
}

/// The same two hosts with every pair forced onto RDMA (the software HCA
/// over the veth link).
#[test]
fn two_hosts_over_veth_rdma() {
    over_veth("two_hosts_over_veth_rdma", &[("OXCCL_TRANSPORT", "rdma"), ("OXCCL_IB_PROVIDER", "soft")], |r| {
        (0..4).filter(|&p| p != r).map(|p| format!("{p}:rdma")).collect()
    });
}

fn over_veth(name: &str, envs: &[(&str, &str)], expect: impl Fn(usize) -> Vec<String>) {
    // SAFETY-free root check: the effective uid from /proc.
    let root = std::fs::read_to_string("/proc/self/status")
        .map(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0")))
        .unwrap_or(false);
    let has_ip = Command::new("ip").arg("-V").output().is_ok_and(|o| o.status.success());
    if !root || !has_ip {
        println!("SKIPPED {name}: needs root and iproute2 (root: {root}, ip: {has_ip})");
        return;
    }
    // Unique per test of this process: the two veth tests may run at once.
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let tag = (std::process::id() % 10_000) * 10 + NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 10;
    let (a, b) = (format!("oxa{tag}"), format!("oxb{tag}"));
    let sh = |args: &str| {
        let ok = Command::new("sh").arg("-c").arg(args).status().is_ok_and(|s| s.success());
        assert!(ok, "`{args}` failed");
    };
    struct Cleanup(String, String);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
            let _ = Command::new("ip").args(["netns", "del", &self.1]).status();
        }
    }
    let _guard = Cleanup(a.clone(), b.clone());
    sh(&format!("ip netns add {a} && ip netns add {b}"));
    sh(&format!("ip link add va{tag} netns {a} type veth peer name vb{tag} netns {b}"));
    sh(&format!(
        "ip -n {a} addr add 10.211.0.1/24 dev va{tag} && ip -n {a} link set va{tag} up && ip -n {a} link set lo up"
    ));
    sh(&format!(
        "ip -n {b} addr add 10.211.0.2/24 dev vb{tag} && ip -n {b} link set vb{tag} up && ip -n {b} link set lo up"
    ));
    let port = 20000 + (tag % 20000) as u16;
    let id = UniqueId::from_addr(format!("10.211.0.1:{port}").parse().unwrap(), rand_nonce());
    let n = 4;
    let kids: Vec<Child> = (0..n)
        .map(|r| {
            let ns = if r < 2 { &a } else { &b };
            let prefix: Vec<String> = ["ip", "netns", "exec", ns].iter().map(|s| s.to_string()).collect();
            spawn(&prefix, &id, n, r, "matrix", envs)
        })
        .collect();
    for (r, k) in kids.into_iter().enumerate() {
        let (ok, out) = output(k);
        assert!(ok, "rank {r}:\n{out}");
        for e in expect(r) {
            assert!(out.contains(&e), "rank {r}: no {e} among its transports:\n{out}");
        }
    }
}

fn rand_nonce() -> [u8; 16] {
    let mut n = [0u8; 16];
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    n.copy_from_slice(&(t ^ (std::process::id() as u128) << 64).to_le_bytes());
    n
}

#[test]
fn stale_and_foreign_ids_fail_fast() {
    // Nobody listens at a fresh id's address.
    let id = fresh_id();
    let cfg = Config { timeout: Some(Duration::from_secs(3)), ..Config::default() };
    let t = Instant::now();
    let e = Communicator::init(&id, 2, 1, cfg).unwrap_err().to_string();
    assert!(t.elapsed() < Duration::from_secs(10), "{e}");
    assert!(e.contains(&id.addr().to_string()) || e.contains("rendezvous"), "{e}");
    assert!("00ff".parse::<UniqueId>().is_err());
}
