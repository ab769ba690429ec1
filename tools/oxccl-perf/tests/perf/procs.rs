//! Ranks as processes, started as torchrun starts them (RANK, WORLD_SIZE,
//! LOCAL_RANK, OXCCL_ADDR): every binary over shared memory, one over TCP
//! on the loopback interface, and threads inside processes (`-t 2`).

use crate::common;

use common::{Expect, Run, combos, run_procs, sizes, verify};

fn check(stem: &str, runs: &[Run], e: &Expect) {
    for (r, run) in runs.iter().enumerate() {
        assert_eq!(run.code, Some(0), "{stem}: process {r} failed:\n{}\n{}", run.stdout, run.stderr);
        if r > 0 {
            assert!(run.stdout.trim().is_empty(), "{stem}: process {r} printed:\n{}", run.stdout);
        }
    }
    let p = verify(&runs[0].stdout, e).unwrap_or_else(|err| panic!("{stem}: {err}\n{}", runs[0].stdout));
    // One pid per process.
    let pids: std::collections::BTreeSet<u32> = p.ranks.iter().map(|r| r.1).collect();
    assert_eq!(pids.len(), runs.len(), "{stem}: {:?}", p.ranks);
}

#[test]
fn every_binary_as_processes_over_shm() {
    for (i, stem) in common::KINDS.into_iter().enumerate() {
        let n = 2 + i % 2;
        let args = ["-b", "100", "-e", "64K", "-f", "16", "-n", "3", "-d", "bfloat16", "-o", "min", "-r", "1"];
        let runs = run_procs(stem, n, "shm", &[], &args);
        let e = Expect {
            stem,
            nranks: n,
            sizes: sizes(100, 1 << 16, 16),
            combos: combos(stem, &["bfloat16"], &["min"], &[1]),
            checked: true,
        };
        check(stem, &runs, &e);
        assert!(runs[0].stdout.contains("shm transport"), "{}", runs[0].stdout);
    }
}

#[test]
fn tcp_on_loopback() {
    let args = ["-b", "8", "-e", "256K", "-f", "8", "-n", "3", "-d", "int64", "-o", "prod"];
    let runs = run_procs("reduce_scatter", 3, "tcp", &[("OXCCL_SOCKET_IFNAME", "lo")], &args);
    let e = Expect {
        stem: "reduce_scatter",
        nranks: 3,
        sizes: sizes(8, 256 << 10, 8),
        combos: combos("reduce_scatter", &["int64"], &["prod"], &[0]),
        checked: true,
    };
    check("reduce_scatter", &runs, &e);
    assert!(runs[0].stdout.contains("tcp transport"), "{}", runs[0].stdout);
}

#[test]
fn threads_inside_processes() {
    // 2 processes × 2 threads = 4 ranks; rank = process × 2 + thread.
    let args = ["-t", "2", "-b", "1K", "-e", "16K", "-f", "4", "-n", "3", "-d", "f8e4m3", "-o", "mulsum"];
    let runs = run_procs("all_reduce", 2, "shm", &[], &args);
    let e = Expect {
        stem: "all_reduce",
        nranks: 4,
        sizes: sizes(1024, 16384, 4),
        combos: combos("all_reduce", &["f8e4m3"], &["mulsum"], &[0]),
        checked: true,
    };
    check("all_reduce", &runs, &e);
    let p = common::parse(&runs[0].stdout).unwrap();
    assert_eq!(p.nthread, Some(2));
    assert_eq!(p.ranks[0].1, p.ranks[1].1, "ranks 0 and 1 share a process");
    assert_ne!(p.ranks[1].1, p.ranks[2].1, "ranks 1 and 2 do not");
}

/// The README's program under a launcher: two processes over shared memory
/// and over TCP, at sizes that are not multiples of its count.
#[test]
fn a_researchers_program_as_processes() {
    let file = std::env::temp_dir().join(format!("oxccl-perf-procs-hand-{}.json", std::process::id()));
    std::fs::write(&file, include_str!("../../../../tests/programs/hand.json")).unwrap();
    for transport in ["shm", "tcp"] {
        let args = ["--program", file.to_str().unwrap(), "-b", "4", "-e", "1M", "-f", "9", "-n", "2"];
        let runs = run_procs("all_reduce", 2, transport, &[], &args);
        let e = Expect {
            stem: "all_reduce",
            nranks: 2,
            sizes: sizes(4, 1 << 20, 9),
            combos: combos("all_reduce", &["float"], &["sum"], &[0]),
            checked: true,
        };
        check("all_reduce", &runs, &e);
        assert!(runs[0].stdout.contains("# Program: program hand"), "{}", runs[0].stdout);
    }
}
