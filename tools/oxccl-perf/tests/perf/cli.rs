//! The command line: errors, help, `oxccl-perf COLL`, the JSON record,
//! exit statuses; and the output parser itself (it must reject wrong
//! output, or the other tests prove nothing).

use crate::common;

use common::{Expect, combos, exe, run_threads, run_with_deadline, sizes, verify};
use std::process::Command;
use std::time::Duration;

#[test]
fn bad_flags_are_errors_naming_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (&["-q", "1"], "unknown option -q"),
        (&["--nosuch=3"], "--nosuch"),
        (&["-n", "0"], "-n"),
        (&["-b", "12X"], "-b"),
        (&["-d", "float128"], "float128"),
        (&["-o", "xor"], "xor"),
        (&["-g", "2"], "-g 2"),
        (&["-b", "1M", "-e", "1K"], "minbytes"),
        (&["-t"], "needs a value"),
        (&["-G", "2"], "-G 2"),
    ];
    for (args, needle) in cases {
        let r = run_threads("all_reduce", args);
        assert_eq!(r.code, Some(2), "{args:?}: {r:?}");
        assert!(r.stderr.contains(needle), "{args:?}: {}", r.stderr);
        assert!(r.stdout.is_empty(), "{args:?} printed {}", r.stdout);
    }
    // Device buffers where there is no GPU: an error that says so.
    if oxccl_cuda::driver_available().is_err() {
        let r = run_threads("all_reduce", &["-H", "gpu", "-b", "8", "-e", "8"]);
        assert_eq!(r.code, Some(1), "{r:?}");
        assert!(r.stderr.contains("CUDA unavailable"), "{}", r.stderr);
    }
    let r = run_threads("broadcast", &["-t", "2", "-r", "2", "-b", "8", "-e", "8"]);
    assert_eq!(r.code, Some(1), "{r:?}");
    assert!(r.stderr.contains("root out of range for 2 ranks"), "{}", r.stderr);
}

#[test]
fn help_and_the_named_form() {
    let r = run_threads("gather", &["-h"]);
    assert_eq!(r.code, Some(0));
    assert!(r.stdout.starts_with("USAGE: gather_perf") && r.stdout.contains("--datatype"), "{}", r.stdout);
    let r = run_threads("oxccl-perf", &["alltoall", "-t", "3", "-b", "1K", "-e", "4K", "-f", "2", "-n", "2"]);
    assert_eq!(r.code, Some(0), "{r:?}");
    let e = Expect {
        stem: "alltoall",
        nranks: 3,
        sizes: sizes(1024, 4096, 2),
        combos: combos("alltoall", &["float"], &[], &[0]),
        checked: true,
    };
    verify(&r.stdout, &e).unwrap_or_else(|err| panic!("{err}\n{}", r.stdout));
    for (args, code, needle) in [(&["nosuch"][..], 2, "unknown collective"), (&[], 2, "USAGE: oxccl-perf")] {
        let r = run_threads("oxccl-perf", args);
        assert_eq!(r.code, Some(code), "{args:?}: {r:?}");
        assert!(r.stderr.contains(needle) || r.stdout.contains(needle), "{args:?}: {r:?}");
    }
}

#[test]
fn json_record() {
    let dir = std::env::temp_dir().join(format!("oxccl-perf-json-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("run.json");
    let _ = std::fs::remove_file(&path);
    let p = path.to_str().unwrap();
    let args = ["-t", "2", "-b", "8", "-e", "1K", "-f", "4", "-n", "2", "-d", "all", "-J", p, "-I", "1"];
    let r = run_threads("reduce", &args);
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(r.stdout.starts_with(&format!("# Writing JSON output to {p}\n")), "{}", r.stdout);
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(v["version"], 2);
    assert_eq!(v["config"]["nthreads"], 2);
    assert_eq!(v["config"]["minimum_bytes"], 8);
    assert_eq!(v["config"]["step_factor"], 4);
    assert_eq!(v["config"]["devices"].as_array().unwrap().len(), 2);
    let rows = v["results"].as_array().unwrap();
    assert_eq!(rows.len(), 12 * 4, "12 types × 4 sizes");
    assert_eq!(rows[0]["type"], "int8");
    assert_eq!(rows[47]["type"], "f8e5m2");
    for row in rows {
        assert_eq!(row["redop"], "sum");
        assert_eq!(row["root"], 0);
        for place in ["out_of_place", "in_place"] {
            assert!(row[place]["time"].as_f64().unwrap() > 0.0, "{row}");
            assert_eq!(row[place]["nwrong"], 0, "{row}");
            assert_eq!(row[format!("{place}_per_iter")]["times_us"].as_array().unwrap().len(), 2);
        }
    }
    assert_eq!(v["out_of_bounds"]["count"], 0);
    assert_eq!(v["out_of_bounds"]["okay"], true);
    assert!(v["average_bus_bandwidth"]["bandwidth"].as_f64().unwrap() >= 0.0);
    assert!(v["args"].as_array().unwrap().iter().any(|a| a == "-J"));
    // The file is never overwritten: a second run writes run.json.0.
    let r = run_threads("reduce", &["-t", "2", "-b", "8", "-e", "8", "-J", p]);
    assert_eq!(r.code, Some(0), "{r:?}");
    let second = dir.join("run.json.0");
    assert!(r.stdout.contains(second.to_str().unwrap()), "{}", r.stdout);
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&second).unwrap()).unwrap();
    assert_eq!(v["results"].as_array().unwrap().len(), 1);
    // An unwritable place is an error naming it (nccl-tests skips it and
    // exits 0: a script would lose its results without a sign).
    let nowhere = dir.join("no-such-dir").join("x.json");
    let r = run_threads("reduce", &["-t", "2", "-b", "8", "-e", "8", "-J", nowhere.to_str().unwrap()]);
    assert_ne!(r.code, Some(0), "{r:?}");
    assert!(r.stderr.contains("-J") && r.stderr.contains("no-such-dir"), "{}", r.stderr);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn malformed_variables_are_errors_naming_them() {
    let cases: &[(&str, &str, &[&str])] = &[
        ("OXCCL_BUFFSIZE", "1000", &["OXCCL_BUFFSIZE=\"1000\"", "between 16 KiB and 1 GiB"]),
        ("OXCCL_BUFFSIZE", "lots", &["OXCCL_BUFFSIZE=\"lots\"", "4M"]),
        ("OXCCL_TRANSPORT", "foo", &["OXCCL_TRANSPORT", "mem", "shm", "tcp (or socket, net)"]),
        ("OXCCL_SINGLE_COPY_MIN", "big", &["OXCCL_SINGLE_COPY_MIN", "auto, off"]),
    ];
    for (var, value, needles) in cases {
        let mut cmd = Command::new(exe("all_reduce"));
        cmd.args(["-t", "2", "-b", "8", "-e", "8"]).env(var, value);
        let r = run_with_deadline(cmd, Duration::from_secs(60));
        assert_ne!(r.code, Some(0), "{var}={value}: {r:?}");
        for n in *needles {
            assert!(r.stderr.contains(n), "{var}={value}: {n:?} not in {}", r.stderr);
        }
    }
    // Sizes take the benchmarks' suffixes.
    let mut cmd = Command::new(exe("all_reduce"));
    cmd.args(["-t", "2", "-b", "8", "-e", "8"]).env("OXCCL_BUFFSIZE", "4M").env("OXCCL_SINGLE_COPY_MIN", "64K");
    let r = run_with_deadline(cmd, Duration::from_secs(60));
    assert_eq!(r.code, Some(0), "{r:?}");
}

#[test]
fn exit_status_follows_the_verdicts() {
    // nccl-tests' NCCL_TESTS_MIN_BW: an unreachable bandwidth fails the run.
    let mut cmd = Command::new(exe("all_reduce"));
    cmd.args(["-t", "2", "-b", "8", "-e", "8"]).env("NCCL_TESTS_MIN_BW", "1000000");
    let r = run_with_deadline(cmd, Duration::from_secs(60));
    assert_eq!(r.code, Some(1), "{r:?}");
    assert!(r.stdout.contains("# Avg bus bandwidth    : ") && r.stdout.contains(" FAILED\n"), "{}", r.stdout);
    // Launcher variables for several processes but no rendezvous address.
    let mut cmd = Command::new(exe("all_reduce"));
    cmd.args(["-b", "8", "-e", "8"])
        .env("RANK", "0")
        .env("WORLD_SIZE", "2")
        .env_remove("OXCCL_ADDR")
        .env_remove("MASTER_ADDR");
    let r = run_with_deadline(cmd, Duration::from_secs(60));
    assert_eq!(r.code, Some(1), "{r:?}");
    assert!(r.stderr.contains("OXCCL_ADDR"), "{}", r.stderr);
}

#[test]
fn the_parser_rejects_wrong_output() {
    let r = run_threads("all_gather", &["-t", "2", "-b", "64K", "-e", "1M", "-f", "4", "-n", "3"]);
    assert_eq!(r.code, Some(0), "{r:?}");
    let e = Expect {
        stem: "all_gather",
        nranks: 2,
        sizes: sizes(64 << 10, 1 << 20, 4),
        combos: combos("all_gather", &["float"], &[], &[0]),
        checked: true,
    };
    let good = r.stdout.clone();
    verify(&good, &e).unwrap();
    let rows: Vec<&str> = good.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).collect();
    let last = rows.last().unwrap().to_string();
    let f: Vec<&str> = last.split_whitespace().collect();
    let mutate = |i: usize, v: &str| {
        let mut g = f.clone();
        g[i] = v;
        good.replace(&last, &g.join("  "))
    };
    let bad_bus = format!("{:.2}", f[7].parse::<f64>().unwrap() * 2.0 + 1.0);
    for (what, text) in [
        ("a wrong count", mutate(8, "1")),
        ("busbw not algbw × factor", mutate(7, &bad_bus)),
        ("a wrong size", mutate(0, "12345")),
        ("a missing row", good.replace(&format!("{last}\n"), "")),
        ("a failed footer", good.replace("values : 0 OK", "values : 1 FAILED")),
        ("another header", good.replace("#wrong", "errors")),
    ] {
        assert!(verify(&text, &e).is_err(), "{what} passed:\n{text}");
    }
}
