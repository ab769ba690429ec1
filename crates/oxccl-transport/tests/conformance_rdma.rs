//! The conformance suite over the RDMA provider with the software HCA:
//! two-sided cases on connection pairs (QPs joined in memory and over TCP,
//! one and several QPs, poisoned shuffled placement and late source
//! reads), then the one-sided cases on two ranks whose fabric is forced
//! onto RDMA.

use oxccl_transport::conformance::{self, Provider};
use oxccl_transport::rdma::provider::soft_pair;
use oxccl_transport::rdma::soft::SoftOptions;
use oxccl_transport::{Channel, Receiver, Sender};
use std::time::Duration;

struct Rdma {
    name: String,
    qps: u32,
    chunk: usize,
    soft: SoftOptions,
}

impl Provider for Rdma {
    fn name(&self) -> &str {
        &self.name
    }
    fn pair(&self, ch: Channel, capacity: usize) -> (Box<dyn Sender>, Box<dyn Receiver>) {
        let cap = capacity.next_power_of_two();
        soft_pair(ch, cap, self.qps, self.chunk.min(cap / 2), self.soft)
            .unwrap_or_else(|e| panic!("{}: {e}", self.name))
    }
    fn max_in_flight(&self, capacity: usize) -> usize {
        capacity.next_power_of_two()
    }
}

#[test]
fn rdma_conformance() {
    let base = SoftOptions::default();
    let variants = [
        ("rdma-soft (in memory, 1 QP)", 1, 64 << 10, base),
        ("rdma-soft (TCP, 1 QP)", 1, 64 << 10, SoftOptions { tcp_only: true, ..base }),
        ("rdma-soft (3 QPs, 4 KiB chunks)", 3, 4 << 10, base),
        (
            "rdma-soft (shuffled placement, late reads, 2 QPs)",
            2,
            8 << 10,
            SoftOptions { shuffle: true, late_read: Some(Duration::from_millis(1)), tcp_only: true },
        ),
    ];
    for (name, qps, chunk, soft) in variants {
        conformance::two_sided(&Rdma { name: name.into(), qps, chunk, soft });
    }
}

/// One-sided, two ranks forced onto RDMA: in a child process of this test
/// binary that has `OXCCL_IB_PROVIDER=soft` in its environment.
#[test]
fn rdma_one_sided() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "one_sided_child", "--ignored", "--nocapture"])
        .env("OXCCL_IB_PROVIDER", "soft")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("1 passed"), "{text}");
}

#[test]
#[ignore = "run by rdma_one_sided with OXCCL_IB_PROVIDER=soft"]
fn one_sided_child() {
    assert_eq!(std::env::var("OXCCL_IB_PROVIDER").as_deref(), Ok("soft"), "run through rdma_one_sided");
    use conformance::one_sided::*;
    let k = oxccl_transport::Kind::Rdma;
    get_and_put(k, true);
    bounds_and_read_only(k, true);
    peer_leaves_during_get(k, true);
    signals_never_block(k, true);
}
