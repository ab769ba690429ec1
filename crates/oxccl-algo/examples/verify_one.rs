//! Builds and verifies one algorithm's program, printing the time and the
//! volumes: `cargo run --release --example verify_one -- ring all_reduce 256 1000003`.

use oxccl_algo::algos::{BuildOptions, build};
use oxccl_algo::verify::verify;
use oxccl_algo::{CollKind, Collective};
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 4 {
        eprintln!("usage: verify_one ALGO COLLECTIVE NRANKS COUNT [ROOT]");
        std::process::exit(2);
    }
    let algo = args[0].parse().unwrap_or_else(|e| panic!("{e}"));
    let kind: CollKind = args[1].parse().unwrap_or_else(|e| panic!("{e}"));
    let n: usize = args[2].parse().expect("NRANKS");
    let count: usize = args[3].parse().expect("COUNT");
    let root: usize = args.get(4).map_or(0, |r| r.parse().expect("ROOT"));
    let coll = Collective::new(kind, n, count).with_root(root);
    let t = Instant::now();
    let p = build(algo, &coll, &BuildOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let built = t.elapsed();
    let t = Instant::now();
    match verify(&p) {
        Ok(r) => println!(
            "{algo} {coll}: {} steps, built in {built:?}, verified in {:?}; max sent {} B, total {} B",
            p.step_count(),
            t.elapsed(),
            r.max_sent(),
            r.total_sent()
        ),
        Err(e) => {
            println!("{e}");
            std::process::exit(1);
        }
    }
}
