//! The command line: output that parses like nccl-tests', the best
//! marker, hand-written programs and clear errors.

use std::process::{Command, Output};

fn sim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_oxccl-sim")).args(args).output().expect("oxccl-sim runs")
}

fn stdout(args: &[&str]) -> String {
    let out = sim(args);
    assert!(out.status.success(), "{args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn stderr_of_failure(args: &[&str]) -> String {
    let out = sim(args);
    assert!(!out.status.success(), "{args:?} should fail");
    String::from_utf8(out.stderr).unwrap()
}

/// The data rows, split on whitespace.
fn data_rows(text: &str) -> Vec<Vec<String>> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

fn num(s: &str) -> f64 {
    s.parse().unwrap_or_else(|_| panic!("{s:?} is not a number"))
}

#[test]
fn sweep_prints_nccl_tests_columns_and_marks_the_best() {
    let text = stdout(&[
        "all_reduce",
        "--nodes",
        "2",
        "--ranks-per-node",
        "4",
        "-b",
        "8",
        "-e",
        "4M",
        "-f",
        "4",
        "--algo",
        "ring,tree,rhd",
    ]);
    let header = text.lines().find(|l| l.contains("size") && l.contains("count")).unwrap();
    let names: Vec<&str> = header.split_whitespace().collect();
    assert_eq!(&names[..6], ["#", "size", "count", "type", "redop", "root"]);
    assert_eq!(names.iter().filter(|&&w| w == "busbw").count(), 3);
    assert_eq!(names.last(), Some(&"best"));
    let algos = ["ring", "tree", "rhd"];
    let rows = data_rows(&text);
    let sizes: Vec<f64> = rows.iter().map(|r| num(&r[0])).collect();
    assert_eq!(sizes, [8.0, 32.0, 128.0, 512.0, 2048.0, 8192.0, 32768.0, 131072.0, 524288.0, 2097152.0]);
    for r in &rows {
        assert_eq!(r.len(), 5 + 3 * algos.len() + 1, "{r:?}");
        let (size, count) = (num(&r[0]), num(&r[1]));
        assert_eq!(size, count * 4.0);
        assert_eq!((r[2].as_str(), r[3].as_str(), r[4].as_str()), ("float", "sum", "-1"));
        let times: Vec<f64> = (0..3).map(|a| num(&r[5 + 3 * a])).collect();
        for a in 0..3 {
            let (t, algbw, busbw) = (times[a], num(&r[6 + 3 * a]), num(&r[7 + 3 * a]));
            assert!(t > 0.0, "{r:?}");
            // algbw = size / time in GB/s; busbw = algbw · 2(n-1)/n.
            assert!((algbw - size / t / 1e3).abs() <= 0.006, "{r:?}");
            assert!((busbw - algbw * 1.75).abs() <= 0.011, "{r:?}");
        }
        let best = times.iter().enumerate().min_by(|a, b| a.1.total_cmp(b.1)).unwrap().0;
        assert_eq!(r.last().unwrap(), algos[best], "{r:?}");
    }
    // Latency-bound sizes go to a logarithmic algorithm, the biggest to
    // the ring.
    assert_ne!(rows[0].last().unwrap(), "ring");
    assert!(text.contains("# Avg bus bandwidth"));
}

#[test]
fn defaults_compare_every_algorithm_of_the_collective() {
    let text = stdout(&["alltoall", "--ranks-per-node", "4", "-b", "1K", "-e", "1K"]);
    let header = text.lines().find(|l| l.contains("size")).unwrap();
    let above = text.lines().take_while(|l| *l != header).last().unwrap();
    assert!(above.contains("direct") && above.contains("pairwise"), "{above}");
    let rows = data_rows(&text);
    assert_eq!(rows.len(), 1);
    // nccl-tests' all-to-all size is the whole buffer: count per peer × n.
    assert_eq!((num(&rows[0][0]), num(&rows[0][1]), rows[0][3].as_str()), (1024.0, 64.0, "none"));
    let text = stdout(&["broadcast", "--ranks-per-node", "4", "-b", "64", "-e", "64", "-r", "2", "-d", "double"]);
    let row = &data_rows(&text)[0];
    assert_eq!((row[1].as_str(), row[2].as_str(), row[4].as_str()), ("8", "double", "2"));
}

#[test]
fn a_hand_written_program_is_priced() {
    let dir = std::env::temp_dir().join(format!("oxccl-sim-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("pair.json");
    std::fs::write(
        &path,
        r#"{
          "name": "one-message",
          "collective": {"kind": "send_recv", "nranks": 2, "count": 250000, "dtype": "float32"},
          "ranks": [
            {"channels": [[{"op": "send", "peer": 1, "src": "input[0..250000]"}]]},
            {"channels": [[{"op": "recv", "peer": 0, "dst": "output[0..250000]"}]]}
          ]
        }"#,
    )
    .unwrap();
    let file = path.to_str().unwrap();
    // One node of two ranks: 1 MB over 100 GB/s after 10 µs is 20 µs.
    // One message alone is no collective: price it without verifying.
    let text = stdout(&["--program", file, "--no-verify", "--intra", "100GB/s,10us"]);
    let rows = data_rows(&text);
    assert_eq!(rows.len(), 1, "{text}");
    let r = &rows[0];
    assert_eq!((num(&r[0]), r.last().unwrap().as_str()), (1e6, "one-message"));
    assert!((num(&r[5]) - 20.0).abs() < 1e-9, "{r:?}");
    assert!((num(&r[6]) - 50.0).abs() < 1e-9, "{r:?}");
    assert!(text.contains("1000000 bytes within nodes"), "{text}");
    // Two nodes: the same message crosses the inter-node link.
    let text = stdout(&["--program", file, "--no-verify", "--nodes", "2", "--inter", "10GB/s,1us"]);
    assert!((num(&data_rows(&text)[0][5]) - 101.0).abs() < 1e-9, "{text}");
    let e = stderr_of_failure(&["all_gather", "--program", file]);
    assert!(e.contains("is a sendrecv program, not all_gather"), "{e}");
    let e = stderr_of_failure(&["--program", file, "--nodes", "3"]);
    assert!(e.contains("2 ranks"), "{e}");
    std::fs::write(&path, r#"{"name": "broken"}"#).unwrap();
    let e = stderr_of_failure(&["--program", file]);
    assert!(e.contains("program JSON"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn gigabytes_are_decimal_and_gibibytes_binary() {
    // One convention with oxccl-plan: GB = 10⁹ bytes, GiB = 2³⁰; a bare G
    // is nccl-tests' 2³⁰. Bandwidths alike, printed in GB/s of 10⁹.
    let sizes = |b: &str, e: &str, step: &str, intra: &str| {
        let text = stdout(&[
            "all_reduce",
            "--ranks-per-node",
            "2",
            "--algo",
            "ring",
            "-b",
            b,
            "-e",
            e,
            "-i",
            step,
            "--intra",
            intra,
        ]);
        (data_rows(&text).iter().map(|r| num(&r[0])).collect::<Vec<f64>>(), text)
    };
    let (got, text) = sizes("1GB", "1GiB", "73741824", "450GB/s,0.6us");
    assert_eq!(got, [1e9, 1073741824.0]);
    assert!(text.contains("intra 450GB/s,600ns"), "{text}");
    let (got, text) = sizes("1G", "1G", "1", "50GiB/s,0.6us");
    assert_eq!(got, [1073741824.0]);
    assert!(text.contains("intra 53.687091GB/s"), "{text}");
    let (got, _) = sizes("500MB", "500MiB", "24288000", "450GB/s,0.6us");
    assert_eq!(got, [500e6, 524288000.0]);
}

#[test]
fn bad_flags_get_clear_errors() {
    let e = stderr_of_failure(&["all_reduce", "--intra", "450GB/s"]);
    assert!(e.contains("BANDWIDTH,LATENCY"), "{e}");
    let e = stderr_of_failure(&["all_reduce", "--inter", "50XB/s,5us"]);
    assert!(e.contains("unit"), "{e}");
    let e = stderr_of_failure(&["all_reduce", "--algo", "ring,bogus"]);
    assert!(e.contains("unknown algorithm") && e.contains("rhd"), "{e}");
    let e = stderr_of_failure(&["all_gather", "--algo", "tree"]);
    assert!(e.contains("does not implement all_gather") && e.contains("ring"), "{e}");
    let e = stderr_of_failure(&["allscatter"]);
    assert!(e.contains("unknown collective"), "{e}");
    let e = stderr_of_failure(&["all_reduce", "-b", "1G", "-e", "1K"]);
    assert!(e.contains("larger than"), "{e}");
    let e = stderr_of_failure(&["all_reduce", "-b", "lots"]);
    assert!(e.contains("K, M, G"), "{e}");
    let e = stderr_of_failure(&["broadcast", "--ranks-per-node", "4", "-r", "9"]);
    assert!(e.contains("root 9"), "{e}");
    let e = stderr_of_failure(&[]);
    assert!(e.contains("--program"), "{e}");
}

#[test]
fn emitted_programs_verify_and_price_and_broken_ones_are_refused() {
    let dir = std::env::temp_dir().join(format!("oxccl-sim-emit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = stdout(&["all_reduce", "--ranks-per-node", "4", "-b", "64", "--algo", "ring", "--emit"]);
    assert!(json.contains("\"recv_reduce_send\""), "{json}");
    let good = dir.join("ring.json");
    std::fs::write(&good, &json).unwrap();
    let text = stdout(&["--program", good.to_str().unwrap()]);
    assert!(text.contains("# verified: computes all_reduce of 16 × float on 4 ranks"), "{text}");
    assert!(text.contains("bytes sent per rank: max 96, total 384"), "{text}");
    assert!(text.contains("# order: not canonical (refused under OXCCL_DETERMINISTIC=1): ring: rank"), "{text}");
    assert_eq!(data_rows(&text).len(), 1);
    // The ordered algorithm's program is canonical, and says so.
    let ordered = dir.join("ordered.json");
    std::fs::write(
        &ordered,
        stdout(&["all_reduce", "--ranks-per-node", "3", "-b", "60", "--algo", "ordered", "--emit"]),
    )
    .unwrap();
    let text = stdout(&["--program", ordered.to_str().unwrap()]);
    assert!(text.contains("# order: canonical (runs under OXCCL_DETERMINISTIC=1)"), "{text}");
    // The first send of input[8..12] (rank 0's third step) sends another block.
    let broken = json.replacen("\"src\": \"input[8..12]\"", "\"src\": \"input[12..16]\"", 1);
    assert_ne!(broken, json);
    let bad = dir.join("broken.json");
    std::fs::write(&bad, broken).unwrap();
    let err = stderr_of_failure(&["--program", bad.to_str().unwrap()]);
    assert!(err.contains("not a correct all_reduce program") && err.contains("different elements"), "{err}");
    // Asked not to verify, it prices the broken program anyway.
    stdout(&["--program", bad.to_str().unwrap(), "--no-verify"]);
    assert!(stderr_of_failure(&["all_reduce", "--emit"]).contains("one algorithm"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The README's hand-written 2-rank all-reduce of 4 floats.
const README: &str = include_str!("../../../tests/programs/hand.json");

/// A correct 2-rank all-gather of 3 floats whose staging copy is not
/// index-aligned: it runs only at multiples of 3.
const STAGED: &str = r#"{ "name": "staged", "collective": {"kind": "all_gather", "nranks": 2, "count": 3, "dtype": "float32"},
  "ranks": [
    {"scratch": 3, "channels": [[ {"op": "copy", "src": "input[0..3]", "dst": "output[0..3]"},
                    {"op": "copy", "src": "input[0..2]", "dst": "scratch[1..3]"},
                    {"op": "send", "peer": 1, "src": "scratch[1..3]"},
                    {"op": "send", "peer": 1, "src": "input[2..3]"},
                    {"op": "recv", "peer": 1, "dst": "output[3..6]"} ]]},
    {"channels": [[ {"op": "copy", "src": "input[0..3]", "dst": "output[3..6]"},
                    {"op": "recv", "peer": 0, "dst": "output[0..2]"},
                    {"op": "recv", "peer": 0, "dst": "output[2..3]"},
                    {"op": "send", "peer": 0, "src": "input[0..3]"} ]]} ] }"#;

fn write_temp(name: &str, text: &str) -> (std::path::PathBuf, String) {
    let dir = std::env::temp_dir().join(format!("oxccl-sim-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, text).unwrap();
    let file = path.to_str().unwrap().to_string();
    (dir, file)
}

#[test]
fn a_program_is_swept_at_every_size() {
    let (dir, file) = write_temp("readme", README);
    // 1 µs latency, 1 GB/s: every size costs 2·(1 µs + half the bytes / 1 GB/s)
    // (an exchange of halves, then of results); times are exact.
    let link = ["--intra", "1GB/s,1us"];
    let text = stdout(&[&["--program", &file, "-b", "4", "-e", "1M", "-f", "4"][..], &link].concat());
    let rows = data_rows(&text);
    let sizes: Vec<f64> = rows.iter().map(|r| num(&r[0])).collect();
    assert_eq!(sizes, [4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0], "{text}");
    assert_eq!(text.matches("# verified: computes all_reduce of").count(), rows.len(), "{text}");
    assert!(text.contains("index-aligned") && text.contains("written for count 4"), "{text}");
    for r in &rows {
        let (size, count, t) = (num(&r[0]), num(&r[1]), num(&r[5]));
        assert_eq!(size, count * 4.0, "{r:?}");
        // Rank 0 sends the second half (⌊c/2⌋ elements), receives the
        // first from rank 1 and sends it back reduced (⌈c/2⌉): the
        // longer half decides each exchange.
        let half = (count / 2.0).ceil() * 4.0;
        let want = 2.0 * (1.0 + half / 1e3);
        // (printed with two decimals, or one from 10000 us on)
        assert!((t - want).abs() <= 0.006 + want * 1e-5, "{r:?}: want {want} us");
        assert_eq!(r.last().unwrap(), "hand");
    }
    // Its own count without sweep flags: one row, the same time as the
    // sweep's row at 16 bytes.
    let one = data_rows(&stdout(&[&["--program", &file][..], &link].concat()));
    assert_eq!(one.len(), 1);
    assert_eq!(one[0], rows[1]);
    // -i steps by bytes, counts that do not divide by 4 included; without
    // verification, no "verified" lines.
    let text = stdout(&["--program", &file, "-b", "20", "-e", "44", "-i", "12", "--no-verify"]);
    let counts: Vec<f64> = data_rows(&text).iter().map(|r| num(&r[1])).collect();
    assert_eq!(counts, [5.0, 8.0, 11.0]);
    assert!(!text.contains("# verified"), "{text}");
    // A broken program is refused at the first size it runs at, named
    // (it sends the wrong half, which is not index-aligned either: at 8
    // bytes, count 2, it cannot run at all).
    let (dir2, bad) = write_temp("broken", &README.replacen("input[2..4]\"}", "input[0..2]\"}", 1));
    let e = stderr_of_failure(&["--program", &bad, "-b", "8", "-e", "64"]);
    assert!(e.contains("not a correct all_reduce program at count 4") && e.contains("different elements"), "{e}");
    for d in [dir, dir2] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn a_misaligned_program_runs_only_at_multiples_of_its_count() {
    let (dir, file) = write_temp("staged", STAGED);
    // All-gather sizes are both ranks' blocks: count = size / 8.
    let out = sim(&["--program", &file, "-b", "24", "-e", "48", "-i", "8"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (text, err) = (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap());
    let counts: Vec<f64> = data_rows(&text).iter().map(|r| num(&r[1])).collect();
    assert_eq!(counts, [3.0, 6.0], "{text}");
    assert!(text.contains("not index-aligned, so it runs only at multiples of count 3"), "{text}");
    assert!(text.contains("rank 0 channel 0 step 1") && text.contains("scratch[1..3]"), "{text}");
    let skipped: Vec<&str> = text.lines().filter(|l| l.contains("cannot run")).collect();
    assert_eq!(skipped.len(), 2, "{text}");
    for (line, count) in skipped.iter().zip(["4", "5"]) {
        assert!(line.starts_with('#'), "{line}");
        assert_eq!(line.trim_start_matches('#').split_whitespace().nth(1), Some(count), "{line}");
        assert!(line.contains("multiples of count 3"), "{line}");
    }
    assert!(err.contains("cannot run at 2 of 4 sizes"), "{err}");
    // At multiples only, nothing is skipped.
    let text = stdout(&["--program", &file, "-b", "24", "-e", "96", "-f", "2"]);
    assert_eq!(data_rows(&text).len(), 3);
    assert!(!text.contains("cannot run"), "{text}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// Whether a Python here can draw (what `tools/plot` runs under).
fn have_matplotlib() -> bool {
    ["python3", "/usr/bin/python3"]
        .iter()
        .any(|py| Command::new(py).args(["-c", "import matplotlib"]).output().is_ok_and(|o| o.status.success()))
}

#[test]
fn plot_draws_the_sweep_as_a_png() {
    if !have_matplotlib() {
        oxccl_skip::skip_or_fail(
            "OXCCL_REQUIRE_MATPLOTLIB",
            "no python3 with matplotlib (apt-get install python3-matplotlib)",
        );
        return;
    }
    let out = std::env::temp_dir().join(format!("oxccl-sim-plot-test-{}.png", std::process::id()));
    let path = out.to_str().unwrap();
    let text = stdout(&[
        "all_reduce",
        "--ranks-per-node",
        "4",
        "-b",
        "1K",
        "-e",
        "1M",
        "-f",
        "4",
        "--algo",
        "ring,tree",
        "--plot",
        path,
    ]);
    assert_eq!(data_rows(&text).len(), 6, "the table still prints: {text}");
    let png = std::fs::read(&out).expect("the PNG was written");
    let _ = std::fs::remove_file(&out);
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    assert!(png.len() > 10_000, "a {}-byte PNG holds no plot", png.len());
}

#[test]
fn plot_needs_a_sweep() {
    let err = stderr_of_failure(&["all_reduce", "--algo", "ring", "--emit", "--plot", "x.png"]);
    assert!(err.contains("--plot draws a sweep"), "{err}");
}

#[test]
fn channels_on_rails_by_channel_share_the_nics() {
    // The shaped two-rail run of docs/TOPOLOGY.md: a ring in two
    // channels over two rails takes about half the time of one rail.
    let run = |nics: &str, extra: &[&str]| {
        let mut args = vec![
            "all_reduce",
            "--nodes",
            "2",
            "--ranks-per-node",
            "2",
            "--numbering",
            "cyclic",
            "--algo",
            "ring",
            "--inter",
            "125MB/s,60us",
            "--intra",
            "2GB/s,5us",
            "-b",
            "16M",
            "-e",
            "16M",
            "--nics-per-node",
            nics,
        ];
        args.extend_from_slice(extra);
        let text = stdout(&args);
        (num(&data_rows(&text)[0][5]), text)
    };
    let (one_rail, text) = run("1", &["--rails", "channel", "--channels", "2"]);
    assert!(text.contains("cut into 2 channels"), "{text}");
    let (two_rails, text) = run("2", &["--rails", "channel", "--channels", "2"]);
    assert!(text.contains("× 2 NICs (rails by channel)"), "{text}");
    let ratio = one_rail / two_rails;
    assert!((1.9..=2.05).contains(&ratio), "{one_rail} / {two_rails} = {ratio}");
    // By rank, the ring's crossings keep one NIC each way.
    let (by_rank, _) = run("2", &["--channels", "2"]);
    assert!(by_rank > 0.95 * one_rail, "{by_rank} vs {one_rail}");
    // An algorithm that cannot be split runs on one channel, and says so.
    let text = stdout(&["all_gather", "--ranks-per-node", "4", "--algo", "rhd,ring", "--channels", "2", "-b", "1M"]);
    let said = text.lines().find(|l| l.starts_with("# rhd: one channel")).unwrap_or_else(|| panic!("{text}"));
    assert!(said.contains("every size") && said.contains("cannot be split"), "{said}");
    assert!(!text.contains("# ring: one channel"), "{text}");
    let e = stderr_of_failure(&["all_reduce", "--channels", "0"]);
    assert!(e.contains("--channels must be 1 to 16"), "{e}");
    let e = stderr_of_failure(&["all_reduce", "--rails", "socket"]);
    assert!(e.contains("rank") && e.contains("channel"), "{e}");
    let help = stdout(&["--help"]);
    assert!(help.contains("--channels") && help.contains("--rails"), "{help}");
}
