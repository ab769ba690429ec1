//! Every benchmark binary with ranks as threads: every type and operator
//! (`-d all -o all -r all`) on 2 ranks, other rank counts and sizes on 3
//! and 4; the output parsed as a script parses nccl-tests output.

use crate::common;

use common::{Expect, OPS, TYPES, combos, run_threads, sizes, verify};

fn check(stem: &str, nranks: usize, args: &[&str], e: Expect) {
    let t = nranks.to_string();
    let mut all = vec!["-t", t.as_str()];
    all.extend_from_slice(args);
    let run = run_threads(stem, &all);
    assert_eq!(run.code, Some(0), "{stem} {all:?} failed:\n{}\n{}", run.stdout, run.stderr);
    if let Err(err) = verify(&run.stdout, &e) {
        panic!("{stem} {all:?}: {err}\n{}", run.stdout);
    }
}

#[test]
fn every_type_op_and_root_on_two_threads() {
    for stem in common::KINDS {
        let e = Expect {
            stem,
            nranks: 2,
            sizes: sizes(64, 4096, 8),
            combos: combos(stem, &TYPES, &OPS, &[0, 1]),
            checked: true,
        };
        check(stem, 2, &["-b", "64", "-e", "4K", "-f", "8", "-n", "2", "-d", "all", "-o", "all", "-r", "all"], e);
    }
}

#[test]
fn three_and_four_threads() {
    for stem in common::KINDS {
        // Three ranks: sizes that do not split evenly, stepping by bytes.
        let e = Expect {
            stem,
            nranks: 3,
            sizes: vec![1000, 5000, 9000],
            combos: combos(stem, &["int32"], &["max"], &[2]),
            checked: true,
        };
        check(
            stem,
            3,
            &["-b", "1000", "-e", "9000", "-i", "4000", "-n", "3", "-d", "int32", "-o", "max", "-r", "2"],
            e,
        );
        // Four ranks: bandwidths large enough to test busbw = algbw × factor.
        let e = Expect {
            stem,
            nranks: 4,
            sizes: sizes(8, 1 << 20, 32),
            combos: combos(stem, &["half"], &["sum"], &[3]),
            checked: true,
        };
        check(stem, 4, &["-b", "8", "-e", "1M", "-f", "32", "-n", "4", "-d", "half", "-r", "3", "-c", "2"], e);
    }
}

#[test]
fn aggregation_blocking_and_averaging_flags() {
    let e = Expect {
        stem: "all_reduce",
        nranks: 2,
        sizes: sizes(1024, 1 << 16, 4),
        combos: combos("all_reduce", &["double"], &["avg"], &[0]),
        checked: true,
    };
    check(
        "all_reduce",
        2,
        &["-b", "1K", "-e", "64K", "-f", "4", "-m", "3", "-z", "1", "-a", "3", "-o", "avg", "-d", "double", "-u", "1"],
        e,
    );
    let e = Expect {
        stem: "sendrecv",
        nranks: 3,
        sizes: sizes(4096, 4096, 2),
        combos: combos("sendrecv", &["uint8"], &["sum"], &[0]),
        checked: true,
    };
    check("sendrecv", 3, &["-b", "4K", "-e", "4K", "-m", "4", "-a", "0", "-d", "uint8", "-w", "0", "-N", "1"], e);
    let e = Expect {
        stem: "gather",
        nranks: 2,
        sizes: sizes(256, 256, 2),
        combos: combos("gather", &["float"], &[], &[1]),
        checked: false,
    };
    check("gather", 2, &["-b", "256", "-e", "256", "-m", "5", "-a", "2", "-r", "1", "-z", "2", "-c", "0"], e)
}

#[test]
fn sizes_below_16_bytes_per_rank_run_what_they_hold() {
    // As the peer benchmarks (and nccl-tests before v2.13.12) run them:
    // 4 B of floats on 2 ranks leave no element per rank (count 0, still
    // a row), 8 B one, 16 B two; every one checked.
    for stem in ["all_gather", "reduce_scatter", "alltoall", "gather", "scatter"] {
        let args = ["-t", "2", "-b", "4", "-e", "16", "-f", "2", "-n", "2", "-d", "float", "-o", "sum", "-r", "1"];
        let run = run_threads(stem, &args);
        assert_eq!(run.code, Some(0), "{stem}: {}\n{}", run.stdout, run.stderr);
        let e = Expect {
            stem,
            nranks: 2,
            sizes: vec![4, 8, 16],
            combos: combos(stem, &["float"], &["sum"], &[1]),
            checked: true,
        };
        let p = verify(&run.stdout, &e).unwrap_or_else(|err| panic!("{stem}: {err}\n{}", run.stdout));
        let got: Vec<(u64, u64)> = p.rows.iter().map(|r| (r.size, r.count)).collect();
        assert_eq!(got, [(0, 0), (8, 1), (16, 2)], "{stem}");
    }
}

/// The README's program, written for 4 floats on 2 ranks.
const HAND: &str = include_str!("../../../../tests/programs/hand.json");

/// Writes `text` to a fresh file; its path.
pub fn program_file(name: &str, text: &str) -> String {
    let dir = std::env::temp_dir().join(format!("oxccl-perf-prog-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[test]
fn a_researchers_program_is_benchmarked_at_every_size() {
    let file = program_file("hand", HAND);
    // Sizes that are not multiples of the program's 4 elements (40 B is
    // 10 floats), every type and operator, checked.
    let e = Expect {
        stem: "all_reduce",
        nranks: 2,
        sizes: sizes(8, 9000, 5),
        combos: combos("all_reduce", &TYPES, &OPS, &[0]),
        checked: true,
    };
    let args =
        ["-A", file.as_str(), "-t", "2", "-b", "8", "-e", "9000", "-f", "5", "-n", "2", "-d", "all", "-o", "all"];
    let run = run_threads("all_reduce", &args);
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("# Program: program hand from"), "{}", run.stdout);
    verify(&run.stdout, &e).unwrap_or_else(|err| panic!("{err}\n{}", run.stdout));
    // `oxccl-perf -A FILE` finds the collective in the file.
    let run = run_threads("oxccl-perf", &["-A", &file, "-t", "2", "-b", "4K", "-e", "4K", "-n", "2"]);
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    let e = Expect { sizes: vec![4096], combos: combos("all_reduce", &["float"], &["sum"], &[0]), ..e };
    verify(&run.stdout, &e).unwrap_or_else(|err| panic!("{err}\n{}", run.stdout));
    // The wrong rank count, a broken program, a program of another
    // collective: errors that say so, before anything runs.
    let run = run_threads("all_reduce", &["-A", &file, "-t", "3", "-b", "8", "-e", "8"]);
    assert_eq!(run.code, Some(1));
    assert!(run.stderr.contains("hand") && run.stderr.contains("2 ranks"), "{}", run.stderr);
    let wrong = r#""src": "input[2..4]", "dst": "output[2..4]""#;
    let broken = program_file("broken", &HAND.replace(wrong, r#""src": "input[0..2]", "dst": "output[0..2]""#));
    let run = run_threads("all_reduce", &["-A", &broken, "-t", "2", "-b", "8", "-e", "8"]);
    assert_eq!(run.code, Some(1), "{}", run.stdout);
    assert!(run.stderr.contains("broken.json") && run.stderr.contains("rank 1"), "{}", run.stderr);
    let run = run_threads("all_gather", &["-A", &file, "-t", "2", "-b", "8", "-e", "8"]);
    assert!(run.code == Some(1) && run.stderr.contains("no all_gather program"), "{}", run.stderr);
}
