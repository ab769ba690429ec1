//! Shared by the end-to-end tests: running the binaries (as threads or as
//! launcher processes, always with a deadline) and a parser of nccl-tests
//! output written the way a script that reads nccl-tests would be.
#![allow(dead_code)]

use std::io::Read;
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The collectives, by nccl-tests' binary stem.
pub const KINDS: [&str; 9] =
    ["all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast", "reduce", "gather", "scatter", "sendrecv"];

/// Path of a binary of this package.
pub fn exe(stem: &str) -> &'static str {
    match stem {
        "all_reduce" => env!("CARGO_BIN_EXE_all_reduce_perf"),
        "all_gather" => env!("CARGO_BIN_EXE_all_gather_perf"),
        "reduce_scatter" => env!("CARGO_BIN_EXE_reduce_scatter_perf"),
        "alltoall" => env!("CARGO_BIN_EXE_alltoall_perf"),
        "broadcast" => env!("CARGO_BIN_EXE_broadcast_perf"),
        "reduce" => env!("CARGO_BIN_EXE_reduce_perf"),
        "gather" => env!("CARGO_BIN_EXE_gather_perf"),
        "scatter" => env!("CARGO_BIN_EXE_scatter_perf"),
        "sendrecv" => env!("CARGO_BIN_EXE_sendrecv_perf"),
        "oxccl-perf" => env!("CARGO_BIN_EXE_oxccl-perf"),
        other => panic!("no binary {other}"),
    }
}

/// What a finished (or killed) process left.
#[derive(Debug)]
pub struct Run {
    /// Exit code (`None`: killed at the deadline or by a signal).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

fn drain(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

/// Starts `cmd` and waits at most `limit`, killing it then.
pub fn run_with_deadline(mut cmd: Command, limit: Duration) -> Run {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn the benchmark");
    let (out, err) = (drain(child.stdout.take().unwrap()), drain(child.stderr.take().unwrap()));
    let deadline = Instant::now() + limit;
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Run { code, stdout: out.join().unwrap(), stderr: err.join().unwrap() }
}

/// Runs `stem` with `args` in this process's environment minus launcher
/// variables (ranks as threads).
pub fn run_threads(stem: &str, args: &[&str]) -> Run {
    let mut cmd = Command::new(exe(stem));
    cmd.args(args);
    for k in ["RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "SLURM_PROCID"] {
        cmd.env_remove(k);
    }
    cmd.env("OXCCL_TIMEOUT", "60");
    run_with_deadline(cmd, Duration::from_secs(90))
}

/// A port nothing listens on (bound and released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Runs `nprocs` copies of `stem` as torchrun would start them, over
/// `transport`, each with a deadline; their outputs in rank order.
pub fn run_procs(stem: &str, nprocs: usize, transport: &str, extra: &[(&str, &str)], args: &[&str]) -> Vec<Run> {
    let addr = format!("127.0.0.1:{}", free_port());
    let handles: Vec<_> = (0..nprocs)
        .map(|r| {
            let mut cmd = Command::new(exe(stem));
            cmd.args(args)
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", nprocs.to_string())
                .env("LOCAL_RANK", r.to_string())
                .env("OXCCL_ADDR", &addr)
                .env("OXCCL_TRANSPORT", transport)
                .env("OXCCL_TIMEOUT", "60");
            for (k, v) in extra {
                cmd.env(k, v);
            }
            std::thread::spawn(move || run_with_deadline(cmd, Duration::from_secs(90)))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// One block of a row.
#[derive(Clone, Debug, PartialEq)]
pub struct Block {
    pub time: f64,
    pub algbw: f64,
    pub busbw: f64,
    /// `None`: `N/A`.
    pub wrong: Option<f64>,
}

/// One result row.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub size: u64,
    pub count: u64,
    pub dtype: String,
    pub op: String,
    pub root: i64,
    pub out_of_place: Block,
    pub in_place: Block,
}

/// What a script takes from nccl-tests output.
#[derive(Debug, Default)]
pub struct Parsed {
    /// `# Using devices` lines: (rank, pid, host).
    pub ranks: Vec<(usize, u32, String)>,
    /// The column names of the header (without `#`).
    pub columns: Vec<String>,
    pub rows: Vec<Row>,
    pub out_of_bounds: Option<(u64, String)>,
    pub avg_busbw: Option<f64>,
    pub nthread: Option<usize>,
}

fn num(s: &str, what: &str, line: &str) -> Result<f64, String> {
    s.parse().map_err(|_| format!("{what} {s:?} is not a number in {line:?}"))
}

fn block(f: &[&str], line: &str) -> Result<Block, String> {
    let wrong = if f[3] == "N/A" { None } else { Some(num(f[3], "#wrong", line)?) };
    Ok(Block {
        time: num(f[0], "time", line)?,
        algbw: num(f[1], "algbw", line)?,
        busbw: num(f[2], "busbw", line)?,
        wrong,
    })
}

/// Parses benchmark output: comment lines start with `#`, result rows are
/// 13 whitespace-separated fields.
pub fn parse(out: &str) -> Result<Parsed, String> {
    let mut p = Parsed::default();
    for line in out.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.is_empty() {
            continue;
        }
        if f[0] == "#" {
            match f.get(1).copied() {
                Some("Rank") if f.len() >= 8 => {
                    p.ranks.push((num(f[2], "rank", line)? as usize, num(f[6], "pid", line)? as u32, f[8].to_string()))
                }
                Some("size") => p.columns = f[1..].iter().map(|s| s.to_string()).collect(),
                Some("nThread") => p.nthread = Some(num(f[2], "nThread", line)? as usize),
                Some("Out") => {
                    let v = line.split(':').nth(1).ok_or("no value")?.split_whitespace().collect::<Vec<_>>();
                    p.out_of_bounds =
                        Some((num(v[0], "out of bounds", line)? as u64, v.get(1).unwrap_or(&"").to_string()));
                }
                Some("Avg") => {
                    let v = line.split(':').nth(1).ok_or("no value")?.split_whitespace().next().ok_or("empty")?;
                    p.avg_busbw = Some(num(v, "avg busbw", line)?);
                }
                _ => {}
            }
            continue;
        }
        if f.len() != 13 {
            return Err(format!("a result row has {} fields, not 13: {line:?}", f.len()));
        }
        p.rows.push(Row {
            size: num(f[0], "size", line)? as u64,
            count: num(f[1], "count", line)? as u64,
            dtype: f[2].to_string(),
            op: f[3].to_string(),
            root: num(f[4], "root", line)? as i64,
            out_of_place: block(&f[5..9], line)?,
            in_place: block(&f[9..13], line)?,
        });
    }
    Ok(p)
}

/// Bytes of one element of an nccl-tests type name.
pub fn type_size(t: &str) -> u64 {
    match t {
        "int8" | "uint8" | "f8e4m3" | "f8e5m2" => 1,
        "half" | "bfloat16" => 2,
        "int32" | "uint32" | "float" => 4,
        "int64" | "uint64" | "double" => 8,
        other => panic!("unknown type {other}"),
    }
}

/// PERFORMANCE.md's bus-bandwidth factor (written out again here, not
/// taken from the code under test).
pub fn factor(stem: &str, n: usize) -> f64 {
    let n = n as f64;
    match stem {
        "all_reduce" => 2.0 * (n - 1.0) / n,
        "all_gather" | "reduce_scatter" | "alltoall" | "gather" | "scatter" => (n - 1.0) / n,
        _ => 1.0,
    }
}

/// (size, count) nccl-tests (before v2.13.12) and the peer benchmarks
/// print for a requested size: the split collectives' count per rank is
/// `count / nranks`.
pub fn expected_size_count(stem: &str, bytes: u64, es: u64, n: u64) -> (u64, u64) {
    let count = bytes / es;
    let per_rank = count / n;
    match stem {
        "all_gather" | "reduce_scatter" | "alltoall" | "gather" | "scatter" => (per_rank * n * es, per_rank),
        _ => (count * es, count),
    }
}

/// What a run must show: `nranks` ranks, rows for `sizes` (requested
/// bytes) for each (type, op, root) in `combos`, in order.
pub struct Expect<'a> {
    pub stem: &'a str,
    pub nranks: usize,
    pub sizes: Vec<u64>,
    pub combos: Vec<(String, String, i64)>,
    /// Whether results are checked (`-c` above 0): `#wrong` is 0, else N/A.
    pub checked: bool,
}

fn close(a: f64, b: f64, what: &str, line: &Row) -> Result<(), String> {
    // Printed with two decimals (or fewer digits when large).
    if (a - b).abs() > 0.011 + 0.01 * a.abs().max(b.abs()) {
        return Err(format!("{what}: {a} vs {b} in {line:?}"));
    }
    Ok(())
}

/// Checks everything a script would: the header, a row per expected size
/// and combination with positive times, #wrong 0, busbw = algbw × factor,
/// algbw = size / time, and the footer.
pub fn verify(out: &str, e: &Expect) -> Result<Parsed, String> {
    let p = parse(out)?;
    let cols = "size count type redop root time algbw busbw #wrong time algbw busbw #wrong";
    if p.columns.join(" ") != cols {
        return Err(format!("header columns {:?}", p.columns));
    }
    let headers = out.lines().filter(|l| l.contains("out-of-place") && l.contains("in-place")).count();
    if headers != 1 || !out.contains("(B)    (elements)") {
        return Err("the block titles or the units line are missing".into());
    }
    if p.ranks.len() != e.nranks || p.ranks.iter().enumerate().any(|(i, r)| r.0 != i) {
        return Err(format!("device lines for ranks {:?}, expected 0..{}", p.ranks, e.nranks));
    }
    let want = e.combos.len() * e.sizes.len();
    if p.rows.len() != want {
        return Err(format!("{} rows, expected {want}", p.rows.len()));
    }
    let factor = factor(e.stem, e.nranks);
    let mut rows = p.rows.iter();
    for (t, op, root) in &e.combos {
        for &bytes in &e.sizes {
            let r = rows.next().expect("counted");
            let (size, count) = expected_size_count(e.stem, bytes, type_size(t), e.nranks as u64);
            if (&r.dtype, &r.op, r.root, r.size, r.count) != (t, op, *root, size, count) {
                return Err(format!("row {r:?}: expected {t} {op} root {root} size {size} count {count}"));
            }
            for (which, b) in [("out-of-place", &r.out_of_place), ("in-place", &r.in_place)] {
                if !(b.time > 0.0 && b.algbw >= 0.0 && b.busbw >= 0.0) {
                    return Err(format!("{which}: non-positive numbers in {r:?}"));
                }
                close(b.busbw, b.algbw * factor, &format!("{which} busbw = algbw × {factor}"), r)?;
                close(b.algbw, r.size as f64 / (b.time * 1e3), &format!("{which} algbw = size / time"), r)?;
                let na_ok = !e.checked || (which == "in-place" && e.stem == "sendrecv");
                match b.wrong {
                    Some(w) if w == 0.0 && e.checked => {}
                    None if na_ok => {}
                    other => return Err(format!("{which}: #wrong {other:?} in {r:?}")),
                }
            }
        }
    }
    match (&p.out_of_bounds, p.avg_busbw) {
        (Some((0, ok)), Some(bw)) if ok == "OK" && bw >= 0.0 => {}
        other => return Err(format!("footer {other:?}")),
    }
    if !out.contains(&format!("# Collective test concluded: {}_perf", e.stem)) {
        return Err("no end line".into());
    }
    Ok(p)
}

/// The sizes of `-b min -e max -f factor`.
pub fn sizes(min: u64, max: u64, factor: u64) -> Vec<u64> {
    let mut v = vec![min];
    while v.last().unwrap() * factor <= max {
        v.push(v.last().unwrap() * factor);
    }
    v
}

/// The (type, op, root) combinations a run visits, in order.
pub fn combos(stem: &str, types: &[&str], ops: &[&str], roots: &[i64]) -> Vec<(String, String, i64)> {
    let reduces = matches!(stem, "all_reduce" | "reduce_scatter" | "reduce" | "sendrecv");
    let rooted = matches!(stem, "broadcast" | "reduce" | "gather" | "scatter");
    let ops: Vec<&str> = if reduces { ops.to_vec() } else { vec!["none"] };
    let roots: Vec<i64> = if rooted { roots.to_vec() } else { vec![-1] };
    let mut v = Vec::new();
    for t in types {
        for op in &ops {
            for r in &roots {
                v.push((t.to_string(), op.to_string(), *r));
            }
        }
    }
    v
}

/// Every type, in nccl-tests' order.
pub const TYPES: [&str; 12] =
    ["int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double", "bfloat16", "f8e4m3", "f8e5m2"];

/// Every operator, in nccl-tests' order.
pub const OPS: [&str; 6] = ["sum", "prod", "max", "min", "avg", "mulsum"];
