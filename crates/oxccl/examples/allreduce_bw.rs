//! A quick all-reduce bandwidth sweep with ranks as processes (the real
//! nccl-tests clone is `oxccl-perf`):
//!
//! ```text
//! cargo run --release -p oxccl --example allreduce_bw -- 4 shm -b 8 -e 64M -f 4
//! ```
//!
//! Arguments: ranks, transport (`shm` or `tcp`), then nccl-tests' `-b -e -f
//! -n -w`. Prints nccl-tests' columns (out of place) from rank 0.

use oxccl::{Communicator, Config, ReduceOp, UniqueId};
use std::process::Command;
use std::time::Instant;

fn size(s: &str) -> usize {
    let (num, mul) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().expect("a size like 8, 64K, 16M") * mul
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Ok(rank) = std::env::var("OXCCL_BW_RANK") {
        return rank_main(&args, rank.parse().unwrap());
    }
    let np: usize =
        args.get(1).and_then(|a| a.parse().ok()).expect("usage: allreduce_bw NRANKS shm|tcp [-b -e -f -n -w]");
    let transport = args.get(2).cloned().unwrap_or_else(|| "shm".into());
    let id = UniqueId::new().unwrap();
    drop(oxccl_transport::id::take_listener(&id));
    let kids: Vec<_> = (0..np)
        .map(|r| {
            Command::new(&args[0])
                .args(&args[1..])
                .env("OXCCL_BW_RANK", r.to_string())
                .env("OXCCL_BW_ID", id.to_string())
                .env("OXCCL_TRANSPORT", &transport)
                .spawn()
                .unwrap()
        })
        .collect();
    let mut ok = true;
    for mut k in kids {
        ok &= k.wait().unwrap().success();
    }
    std::process::exit(if ok { 0 } else { 1 });
}

fn rank_main(args: &[String], rank: usize) {
    let np: usize = args[1].parse().unwrap();
    let (mut b, mut e, mut f, mut iters, mut warm) = (8usize, 64usize << 20, 2usize, 20usize, 5usize);
    let mut i = 3;
    while i + 1 < args.len() {
        let v = &args[i + 1];
        match args[i].as_str() {
            "-b" => b = size(v),
            "-e" => e = size(v),
            "-f" => f = v.parse().unwrap(),
            "-n" => iters = v.parse().unwrap(),
            "-w" => warm = v.parse().unwrap(),
            other => panic!("unknown flag {other}"),
        }
        i += 2;
    }
    let id: UniqueId = std::env::var("OXCCL_BW_ID").unwrap().parse().unwrap();
    let comm = Communicator::init(&id, np, rank, Config::default()).unwrap();
    if rank == 0 {
        println!("# oxccl all_reduce, {np} processes over {}", std::env::var("OXCCL_TRANSPORT").unwrap());
        println!(
            "{:>12} {:>12} {:>8} {:>6} {:>6} {:>9} {:>7} {:>7} {:>6}",
            "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong"
        );
        println!(
            "{:>12} {:>12} {:>8} {:>6} {:>6} {:>9} {:>7} {:>7} {:>6}",
            "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", ""
        );
    }
    let mut bytes = b.max(4);
    while bytes <= e {
        let count = bytes / 4;
        let send: Vec<f32> = (0..count).map(|i| ((i + rank) % 8) as f32).collect();
        let mut recv = vec![0f32; count];
        for _ in 0..warm {
            comm.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
        }
        comm.barrier().unwrap();
        let t = Instant::now();
        for _ in 0..iters {
            comm.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
        let wrong = (0..count).filter(|&i| recv[i] != (0..np).map(|r| ((i + r) % 8) as f32).sum::<f32>()).count();
        let algbw = (count * 4) as f64 / us / 1e3;
        let busbw = algbw * 2.0 * (np - 1) as f64 / np as f64;
        if rank == 0 {
            println!(
                "{:>12} {:>12} {:>8} {:>6} {:>6} {:>9.1} {:>7.2} {:>7.2} {:>6}",
                count * 4,
                count,
                "float",
                "sum",
                -1,
                us,
                algbw,
                busbw,
                wrong
            );
        }
        bytes *= f;
    }
}
