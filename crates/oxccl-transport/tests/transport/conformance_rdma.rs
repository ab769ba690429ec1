//! The conformance suite over the RDMA provider with the software HCA:
//! two-sided cases on connection pairs (QPs joined in memory and over TCP,
//! one and several QPs, poisoned shuffled placement and late source
//! reads), then the one-sided cases on two ranks whose fabric is forced
//! onto RDMA.

use oxccl_transport::conformance::{self, Provider};
use oxccl_transport::rdma::provider::{soft_pair, soft_pair_timed};
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
        .args(["--exact", "conformance_rdma::one_sided_child", "--ignored", "--nocapture"])
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

/// A pair of 1 QP with 256-byte chunks, and a 25 600-byte message: with
/// its header, 101 writes, more than one poll of a completion queue takes.
fn small_chunks() -> (Box<dyn Sender>, Box<dyn Receiver>, Vec<u8>) {
    // Acknowledgements are awaited 4 ms (2^10 × 4.096 µs), 8 times: a
    // write to a QP that is gone fails after about 34 ms.
    let (s, r) = soft_pair_timed(3, 64 << 10, 1, 256, SoftOptions::default(), 10).unwrap();
    (s, r, (0..100 * 256).map(|k| (k % 251) as u8).collect())
}

fn send_all(s: &mut dyn Sender, msg: &[u8]) {
    s.begin(msg.len()).unwrap();
    let mut off = 0;
    while off < msg.len() {
        let room = s.room(msg.len() - off).unwrap();
        let n = room.len();
        room.copy_from_slice(&msg[off..off + n]);
        s.commit(n).unwrap();
        off += n;
        assert!(n > 0, "the receiver's ring has room for the whole message");
    }
}

/// Reads `len` bytes by peek and consume, without progress in between
/// (as the executor's receive does); an error names the byte it stopped at.
fn read_all(r: &mut dyn Receiver, len: usize) -> Result<Vec<u8>, String> {
    let mut got = Vec::new();
    let start = std::time::Instant::now();
    while got.len() < len {
        match r.peek().map_err(|e| format!("after {} of {len} bytes: {e}", got.len()))? {
            Some(p) => {
                let n = p.data.len();
                got.extend_from_slice(p.data);
                r.consume(n).unwrap();
            }
            None => {
                assert!(start.elapsed() < Duration::from_secs(10), "stalled after {} of {len} bytes", got.len());
                r.progress().map_err(|e| format!("progress after {} of {len} bytes: {e}", got.len()))?;
            }
        }
    }
    Ok(got)
}

/// A sender that wrote everything and closed before its receiver looked:
/// the receiver reads every write that landed (more than one poll of its
/// completion queue), and its last credit, to a sender that is gone,
/// fails nothing; only a read past the end reports the close.
#[test]
fn a_closed_senders_landed_writes_are_all_read() {
    let (mut s, mut r, msg) = small_chunks();
    send_all(&mut *s, &msg);
    let start = std::time::Instant::now();
    while !s.flushed() {
        s.progress().unwrap();
        assert!(start.elapsed() < Duration::from_secs(10), "the sender did not flush");
    }
    drop(s);
    std::thread::sleep(Duration::from_millis(30));
    r.progress().unwrap();
    assert_eq!(read_all(&mut *r, msg.len()).unwrap(), msg);
    // Longer than a write to the gone sender would take to fail.
    for _ in 0..30 {
        r.progress().expect("a receiver that read everything of a sender that closed");
        std::thread::sleep(Duration::from_millis(10));
    }
    let e = r.peek().map(|p| p.map(|p| p.data.len())).expect_err("a read past the close");
    assert!(e.to_string().contains("closed"), "{e}");
}

/// A receiver that read everything and closed before the sender looked
/// at its completions (more than one poll's worth): the sender is done,
/// not failed.
#[test]
fn a_sender_whose_receiver_read_everything_and_closed_is_done() {
    let (mut s, mut r, msg) = small_chunks();
    send_all(&mut *s, &msg);
    r.progress().unwrap();
    assert_eq!(read_all(&mut *r, msg.len()).unwrap(), msg);
    drop(r);
    std::thread::sleep(Duration::from_millis(30));
    s.progress().expect("a sender whose every write was read");
    assert!(s.flushed(), "every write retired");
    // A new message to the closed receiver is an error.
    let e = s.begin(8).expect_err("a message to a receiver that closed");
    assert!(e.to_string().contains("closed"), "{e}");
}
