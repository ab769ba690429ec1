//! What idle or hostile connections cost the data path: two ranks (threads)
//! over TCP run all_reduce of 1 MiB; then N connections per listening port
//! of this process (the bootstrap's and each rank's data port) are opened
//! and left silent, as a scanner or a stuck client would, and the same
//! runs again (after a warm-up that sees them accepted: at most 256 stay
//! pending per port, the rest are dropped). Prints both busbw figures and
//! their ratio.
//!
//! `cargo run --release -p oxccl --example idle_connections [N] [iterations]`

use oxccl::{Communicator, Config, Kind, ReduceOp};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// busbw of `iters` all_reduces of 1 MiB of f32 on every rank of `comms`,
/// after `warm` untimed ones.
fn busbw(comms: &[Communicator], warm: usize, iters: usize) -> f64 {
    let n = comms.len() as f64;
    let bytes = 1 << 20;
    let t = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let mut buf = vec![1.0f32; bytes / 4];
                    for _ in 0..warm {
                        c.all_reduce_in_place(&mut buf, ReduceOp::Sum).expect("warm-up");
                    }
                    let start = Instant::now();
                    for _ in 0..iters {
                        c.all_reduce_in_place(&mut buf, ReduceOp::Sum).expect("all_reduce");
                    }
                    start.elapsed()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank")).max().expect("ranks")
    });
    let per = t.as_secs_f64() / iters as f64;
    bytes as f64 / per / 1e9 * 2.0 * (n - 1.0) / n
}

fn main() {
    let mut args = std::env::args().skip(1);
    let idle: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let iters: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(300);
    let cfg = Config { transport: Some(Kind::Tcp), timeout: Some(Duration::from_secs(60)), ..Config::default() };
    let comms = Communicator::init_threads_with(2, cfg).expect("two ranks over TCP");
    let before = busbw(&comms, 100, iters);
    let ports = oxccl_transport::conformance::relay::own_listening_addrs();
    let mut held = Vec::new();
    for &p in &ports {
        for _ in 0..idle {
            match TcpStream::connect(p) {
                Ok(s) => held.push(s),
                Err(e) => {
                    eprintln!("port {p}: stopped after {} connections: {e}", held.len());
                    break;
                }
            }
        }
    }
    // The warm-up lets the ranks accept the new connections first (a
    // burst of accepts, challenges and drops), then the idle ones stay.
    let after = busbw(&comms, 100, iters);
    println!(
        "all_reduce 1 MiB, 2 ranks over TCP: {before:.2} GB/s busbw; with {idle} idle connections on each of {} \
         listening ports ({} open): {after:.2} GB/s ({:.3}x)",
        ports.len(),
        held.len(),
        after / before
    );
}
