//! Faults over RDMA (the software HCA, ranks as processes): each must be an
//! error on every rank within seconds, naming the rank and the peer, the
//! completion status in words and its likely cause.
//!
//! - a bad rkey (`OXCCL_IB_INJECT=rkey:<bytes>` on one rank),
//! - a receiver not ready (`OXCCL_IB_INJECT=rnr`, few RNR retries),
//! - a completion queue that overflows (`OXCCL_IB_INJECT=cq:<entries>`),
//! - the link between two hosts set down mid-collective, with work
//!   requests outstanding (RETRY_EXC) and with a rank only waiting (the
//!   side channel's keepalive).
//!
//! A rank killed mid-collective is in `procs.rs`, with shm and TCP.

use oxccl_e2e::child::{self, fresh_id, spawn};
use oxccl_e2e::netns::Hosts;
use std::process::Child;
use std::time::{Duration, Instant};

const SOFT: [(&str, &str); 2] = [("OXCCL_TRANSPORT", "rdma"), ("OXCCL_IB_PROVIDER", "soft")];

/// How long every rank may take to fail, counted from the start (setup is
/// under a second here; the faults come within the first few collectives).
const LIMIT: Duration = Duration::from_secs(15);

/// Two ranks in `loop` mode, rank 0 with `faulty` besides: what each said
/// when it failed.
fn two_ranks(faulty: &[(&str, &str)], both: &[(&str, &str)]) -> [String; 2] {
    let id = fresh_id();
    let start = Instant::now();
    let mut kids: Vec<Child> = (0..2)
        .map(|r| {
            let mut envs = SOFT.to_vec();
            envs.extend_from_slice(both);
            if r == 0 {
                envs.extend_from_slice(faulty);
            }
            spawn(&[], &id, 2, r, "loop", &envs)
        })
        .collect();
    let mut readers = child::stdouts(&mut kids);
    let said = child::failures(&mut kids, &mut readers, &[0, 1], start, LIMIT);
    [said[0].clone(), said[1].clone()]
}

/// Rank 0 fails with `status`, naming itself and rank 1; rank 1 fails
/// naming rank 0.
fn assert_blamed(said: &[String; 2], status: &str) {
    assert!(
        said[0].contains("rank 0") && said[0].contains("rank 1") && said[0].contains(status),
        "rank 0 should name both ranks and {status}:\n{}",
        said[0]
    );
    assert!(said[1].contains("rank 0"), "rank 1 should name rank 0:\n{}", said[1]);
}

#[test]
fn a_bad_rkey_is_an_error_naming_both_ranks() {
    // Past the first two collectives (2 × 16 MiB sent by each rank).
    let said = two_ranks(&[("OXCCL_IB_INJECT", "rkey:50000000")], &[]);
    assert_blamed(&said, "REM_ACCESS_ERR");
    assert!(said[0].contains("bad rkey"), "rank 0 should give the likely cause:\n{}", said[0]);
}

#[test]
fn a_receiver_not_ready_is_an_error_naming_both_ranks() {
    // Rank 0's receivers stop reposting: rank 1's writes to it find no
    // receive, and one RNR retry later fail.
    let said = two_ranks(&[("OXCCL_IB_INJECT", "rnr")], &[("OXCCL_IB_RNR_RETRY", "1")]);
    assert!(
        said[1].contains("rank 1") && said[1].contains("rank 0") && said[1].contains("RNR_RETRY_EXC_ERR"),
        "rank 1 should name both ranks and RNR_RETRY_EXC_ERR:\n{}",
        said[1]
    );
    assert!(said[1].contains("posted no receive"), "rank 1 should give the likely cause:\n{}", said[1]);
    assert!(said[0].contains("rank 1"), "rank 0 should name rank 1:\n{}", said[0]);
}

#[test]
fn a_completion_queue_overflow_is_an_error_naming_both_ranks() {
    let said = two_ranks(&[("OXCCL_IB_INJECT", "cq:4")], &[]);
    assert_blamed(&said, "CQ_ERR");
    assert!(said[0].contains("overflowed"), "rank 0 should say the queue overflowed:\n{}", said[0]);
}

/// Two ranks on two hosts in `mode`, the link between them set down once
/// both are ready: what each said, failing within `limit`.
fn link_down(test: &str, mode: &str, limit: Duration) -> Option<Vec<String>> {
    let hosts = Hosts::new(test)?;
    let id = hosts.id();
    // ACK timeout 4.096 µs × 2^14 ≈ 67 ms, 3 tries: RETRY_EXC after ~0.2 s.
    let mut envs = SOFT.to_vec();
    envs.extend_from_slice(&[("OXCCL_IB_TIMEOUT", "14"), ("OXCCL_IB_RETRY_CNT", "2")]);
    let mut kids: Vec<Child> = (0..2).map(|r| spawn(&hosts.prefix(r), &id, 2, r, mode, &envs)).collect();
    let mut readers = child::wait_ready(&mut kids);
    hosts.link_down();
    let said = child::failures(&mut kids, &mut readers, &[0, 1], Instant::now(), limit);
    for (r, s) in said.iter().enumerate() {
        let peer = format!("rank {}", 1 - r);
        assert!(s.contains(&peer), "rank {r} should name {peer}:\n{s}");
    }
    Some(said)
}

#[test]
fn a_link_set_down_mid_collective_is_an_error_naming_both_ranks() {
    let Some(said) = link_down("a_link_set_down_mid_collective_is_an_error_naming_both_ranks", "loop", LIMIT) else {
        return;
    };
    assert!(
        said.iter().any(|s| s.contains("RETRY_EXC_ERR") && s.contains("OXCCL_IB_TIMEOUT=14")),
        "a rank should fail with RETRY_EXC_ERR and the timeout that applies:\n{}\n{}",
        said[0],
        said[1]
    );
}

/// Rank 0 only waits (its writes all acknowledged, rank 1 asleep) when the
/// link goes down: no work request of its own times out, and the side
/// channel's keepalive (≤ 4 s) finds the silence, well before the
/// bootstrap's (16 s) would.
#[test]
fn a_link_set_down_under_a_waiting_rank_is_an_error_within_seconds() {
    let test = "a_link_set_down_under_a_waiting_rank_is_an_error_within_seconds";
    let Some(said) = link_down(test, "stall", Duration::from_secs(9)) else { return };
    assert!(said[0].contains("stopped answering"), "rank 0 should find rank 1 silent:\n{}", said[0]);
}

/// A rank whose RDMA side channel (and every other listening port) holds
/// 100 silent connections still connects to its peer at once: each
/// connection proves itself on its own, and beyond 64 the oldest is cut.
#[test]
fn silent_connections_do_not_hold_up_a_real_peer() {
    let id = fresh_id();
    let start = Instant::now();
    let mut kids: Vec<Child> = (0..2).map(|r| spawn(&[], &id, 2, r, "crowded", &SOFT)).collect();
    let mut readers = child::wait_ready(&mut kids);
    let took = start.elapsed();
    assert!(took < Duration::from_secs(15), "the ranks took {took:?} to connect past the silent connections");
    for k in &mut kids {
        let _ = k.kill();
        let _ = k.wait();
    }
    drop(readers.drain(..));
}
