//! Rails: hosts (network namespaces) joined by two links each, the rails
//! (`oxccl_e2e::netns::Hosts::railed`), over TCP (`OXCCL_SOCKET_IFNAME`
//! naming both interfaces) and over the software RDMA HCA (a device over
//! each interface). Every collective right, the channels the tuner chooses
//! from the rails, each rail's share of the bytes, local rank `i` on rail
//! `i`, a rail set down, and the two-rail benchmark.

use oxccl_e2e::child::{self, spawn};
use oxccl_e2e::netns::Hosts;
use std::process::Child;
use std::time::{Duration, Instant};

/// Both rails' interfaces, on every transport.
const BOTH: (&str, &str) = ("OXCCL_SOCKET_IFNAME", "v,w");

/// What forces the software RDMA HCA between every pair.
const SOFT_RDMA: [(&str, &str); 2] = [("OXCCL_TRANSPORT", "rdma"), ("OXCCL_IB_PROVIDER", "soft")];

/// The bytes each rail carried out of all hosts, so far.
fn rail_bytes(hosts: &Hosts) -> [u64; 2] {
    (0..hosts.len()).map(|h| hosts.rail_bytes(h)).fold([0, 0], |a, b| [a[0] + b[0], a[1] + b[1]])
}

/// `h` hosts × `l` ranks over two rails, over TCP or the soft RDMA HCA,
/// without `OXCCL_NCHANNELS`: every collective × type right; then an
/// all_reduce of 16 MiB, for which the tuner takes a channel per rail,
/// and each rail carries half its bytes (within 10%).
fn every_collective_and_half_each(h: usize, l: usize, rdma: bool) {
    let Some(hosts) = Hosts::railed("rails", h, 2) else { return };
    let mut envs = vec![BOTH];
    if rdma {
        envs.extend(SOFT_RDMA);
    }
    let (outs, _) = hosts.run(l, true, "matrix", &envs);
    if rdma {
        assert!(outs[0].contains(":rdma"), "{}", outs[0]);
    }
    let before = rail_bytes(&hosts);
    let count = (4usize << 20).to_string();
    envs.push(("OXCCL_TEST_COUNT", &count));
    let (outs, _) = hosts.run(l, true, "volume", &envs);
    let choice = outs[0].lines().find(|l| l.starts_with("CHOICE")).unwrap_or("no CHOICE line").to_string();
    let after = rail_bytes(&hosts);
    let rail = [after[0] - before[0], after[1] - before[1]];
    let total = rail[0] + rail[1];
    println!(
        "{h} hosts x {l} ranks over {} ({choice}): rails carried {} and {} bytes ({:.3} / {:.3})",
        if rdma { "soft RDMA" } else { "tcp" },
        rail[0],
        rail[1],
        rail[0] as f64 / total as f64,
        rail[1] as f64 / total as f64
    );
    assert!(total >= 16 << 20, "{total} bytes crossed: less than the all_reduce's 16 MiB");
    for (i, &b) in rail.iter().enumerate() {
        assert!(
            b.abs_diff(total / 2) <= total / 20,
            "rail {i}: {b} of {total} bytes ({h}x{l}, rdma: {rdma}, {choice})\n{}",
            outs[0]
        );
    }
}

#[test]
fn two_hosts_of_two_ranks_over_tcp_rails() {
    every_collective_and_half_each(2, 2, false);
}

#[test]
fn three_hosts_of_one_rank_over_tcp_rails() {
    every_collective_and_half_each(3, 1, false);
}

#[test]
fn two_hosts_of_one_rank_over_soft_rdma_rails() {
    every_collective_and_half_each(2, 1, true);
}

#[test]
fn three_hosts_of_two_ranks_over_soft_rdma_rails() {
    every_collective_and_half_each(3, 2, true);
}

/// NCCL's rail-optimized layout: 2 hosts × 2 ranks, one channel, `hier`
/// (whose exchanges between hosts pair local rank `i` with local rank
/// `i`): local rank `i` sends on rail `i`, so both rails carry half the
/// bytes of an all_reduce without channels.
#[test]
fn one_channel_local_rank_i_sends_on_rail_i() {
    let Some(hosts) = Hosts::railed("rail_per_local_rank", 2, 2) else { return };
    let count = (4usize << 20).to_string();
    let envs = [BOTH, ("OXCCL_NCHANNELS", "1"), ("OXCCL_ALGO", "hier"), ("OXCCL_TEST_COUNT", &count)];
    let before = rail_bytes(&hosts);
    hosts.run(2, false, "volume", &envs);
    let after = rail_bytes(&hosts);
    let rail = [after[0] - before[0], after[1] - before[1]];
    let total = rail[0] + rail[1];
    println!("one channel, hier, 2x2: rails carried {} and {} bytes", rail[0], rail[1]);
    assert!(total >= 16 << 20, "{total} bytes crossed");
    for (i, &b) in rail.iter().enumerate() {
        assert!(b.abs_diff(total / 2) <= total / 20, "rail {i}: {b} of {total} bytes");
    }
}

/// A rail set down mid-collective (no reset, no FIN: the interface just
/// stops): every rank fails within seconds, long before `OXCCL_TIMEOUT`
/// (60 s here), and says which rail's interface is down; traffic does not
/// move to the other rail.
fn a_rail_set_down(rdma: bool) {
    let Some(hosts) = Hosts::railed("rail_down", 2, 2) else { return };
    let mut envs = vec![BOTH, ("OXCCL_NCHANNELS", "2"), ("OXCCL_ALGO", "ring")];
    if rdma {
        envs.extend(SOFT_RDMA);
    }
    let id = hosts.id();
    let mut kids: Vec<Child> = (0..2).map(|r| spawn(&hosts.prefix(r), &id, 2, r, "loop", &envs)).collect();
    let mut readers = child::wait_ready(&mut kids);
    let t0 = Instant::now();
    hosts.rail_down(1);
    let said = child::failures(&mut kids, &mut readers, &[0, 1], t0, Duration::from_secs(15));
    for (r, s) in said.iter().enumerate() {
        assert!(s.contains("rail 2 of 2") && s.contains("w1"), "rank {r} should name rail 2 (w1…):\n{s}");
    }
    println!("rail down (rdma: {rdma}): both ranks failed within {:.1?}", t0.elapsed());
}

#[test]
fn a_tcp_rail_set_down_is_an_error_naming_it() {
    a_rail_set_down(false);
}

#[test]
fn a_soft_rdma_rail_set_down_is_an_error_naming_it() {
    a_rail_set_down(true);
}

/// The two-rail benchmark of docs/TOPOLOGY.md: 2 hosts × 2 ranks, both
/// rails shaped to `OXCCL_TEST_RATE` (default 1gbit) on both hosts;
/// all_reduce with two channels over two rails against the same over one,
/// over TCP and over the soft RDMA HCA. Prints seconds per call and the
/// ratio; asserts nothing on time.
#[test]
#[ignore = "a benchmark (two minutes): cargo test --release -p oxccl-e2e --test e2e -- --ignored --nocapture rails::two_rails_benchmark"]
fn two_rails_benchmark() {
    let Some(hosts) = Hosts::railed("two_rails_benchmark", 2, 2) else { return };
    let rate = std::env::var("OXCCL_TEST_RATE").unwrap_or_else(|_| "1gbit".into());
    assert!(hosts.shape_rails(0, &rate) && hosts.shape_rails(1, &rate), "tc tbf failed");
    for rdma in [false, true] {
        let mut rows = Vec::new();
        for ifname in ["v,w", "v"] {
            let mut envs = vec![("OXCCL_SOCKET_IFNAME", ifname), ("OXCCL_NCHANNELS", "2"), ("OXCCL_ALGO", "ring")];
            if rdma {
                envs.extend(SOFT_RDMA);
            }
            let (outs, _) = hosts.run(2, true, "bench", &envs);
            let times = child::bench_rows(&outs[0]);
            println!("  {} OXCCL_SOCKET_IFNAME={ifname:>4}: {times:?}", if rdma { "soft RDMA" } else { "tcp" });
            rows.push(times);
        }
        for ((b, two), (_, one)) in rows[0].iter().zip(&rows[1]) {
            println!("  {} MiB: one rail / two rails = {:.2}x", b >> 20, one / two);
        }
    }
}
