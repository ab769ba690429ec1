//! Seconds from `Communicator::init_threads` to the end of a first
//! all_reduce, at the rank counts given (default 16 64 256): what init
//! costs, topology discovery included.
//!
//! `cargo run --release -p oxccl --example init_time -- 16 64 256`

use oxccl::{Communicator, ReduceOp};
use std::time::Instant;

fn main() {
    let counts: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    for n in if counts.is_empty() { vec![16, 64, 256] } else { counts } {
        let t = Instant::now();
        let comms = Communicator::init_threads(n).expect("init");
        let init = t.elapsed().as_secs_f64();
        std::thread::scope(|s| {
            for c in &comms {
                s.spawn(move || {
                    let mut x = [1.0f32; 16];
                    c.all_reduce_in_place(&mut x, ReduceOp::Sum).expect("all_reduce");
                    assert_eq!(x[0], n as f32);
                });
            }
        });
        println!("{n:>4} ranks: init {init:.3} s, first all_reduce done at {:.3} s", t.elapsed().as_secs_f64());
    }
}
