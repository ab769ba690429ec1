//! Ranks as processes: the test binary is its own child. A `child` test
//! (ignored by default) is the rank's body, started with `--ignored --exact
//! child` and told what to do through `OXCCL_TEST_*` variables.

use crate::{DTYPES, matrix, run_case};
use oxccl::{CollKind, Communicator, Config, DataType, ReduceOp, UniqueId};
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// A rank's body, for the ignored `child` test of a test binary: joins the
/// communicator, prints `KINDS p:transport …`, then runs its mode:
/// `matrix` (every collective × type, checked), `loop` (all_reduce until
/// an error; `READY` after the second), `stall` (`loop`, with the last
/// rank asleep for 3 s after `READY`: the others wait on it with nothing
/// of their own outstanding) or `crowded` (`loop`, after the last rank
/// opened 100 silent connections to each of its own listening ports and
/// the others waited a second: connections are made at first use) or
/// `count` (one all_reduce, rank 1's count another than the others'),
/// `canon` (every reduction × float type × operator, checked bit for bit
/// against the canonical order: run with `OXCCL_DETERMINISTIC=1`),
/// `first` (one all_reduce, checked; prints the seconds from before init
/// to its result), `early-exit` (rank 0 broadcasts and exits; the others broadcast 0.5 s
/// later) or `closer` (the last rank closes after one all_reduce; the
/// others run a second), `volume` (prints `CHOICE` the tuner's pick, then
/// one all_reduce of `OXCCL_TEST_COUNT` floats, checked) or `bench`
/// (all_reduce at 1, 4 and 16 MiB, out of place, checked once, then timed:
/// prints `BENCH bytes seconds-per-call`).
pub fn body() {
    let Some((mode, id, rank, size)) = rank_env() else { return };
    let started = Instant::now();
    let comm = match Communicator::init(&id, size, rank, Config::default()) {
        Ok(c) => c,
        Err(e) => {
            println!("ERROR init: {e}");
            std::process::exit(3);
        }
    };
    let kinds: Vec<String> =
        (0..size).filter(|&p| p != rank).map(|p| format!("{p}:{}", comm.transport_to(p).unwrap())).collect();
    println!("KINDS {}", kinds.join(" "));
    let mut _silent = Vec::new();
    if mode == "crowded" {
        if rank == size - 1 {
            for a in oxccl_transport::conformance::relay::own_listening_addrs() {
                _silent.extend((0..100).filter_map(|_| std::net::TcpStream::connect(a).ok()));
            }
            println!("SILENT {}", _silent.len());
        } else {
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    let result = match mode.as_str() {
        "matrix" => matrix(&comm, &[0, 1, 7, 1000], &DTYPES).and_then(|cases| {
            for kind in crate::kinds() {
                run_case(&comm, kind, DataType::Float32, 1_000_003, ReduceOp::Sum, size - 1, false)?;
                run_case(&comm, kind, DataType::Int32, 1_000_003, ReduceOp::Max, 0, true)?;
            }
            println!("CASES {cases}");
            Ok(())
        }),
        "loop" | "stall" | "crowded" => {
            let mut buf = vec![1.0f32; 4 << 20];
            let mut i = 0u64;
            loop {
                if let Err(e) = comm.all_reduce_in_place(&mut buf, ReduceOp::Max) {
                    break Err(e.to_string());
                }
                i += 1;
                if i == 2 {
                    println!("READY");
                    if mode == "stall" && rank == size - 1 {
                        std::thread::sleep(Duration::from_secs(3));
                    }
                }
            }
        }
        // One all_reduce, checked, and the time from before init to its
        // result (the process's start is not counted).
        "first" => {
            let mut x = [rank as f64, 1.0];
            comm.all_reduce_in_place(&mut x, ReduceOp::Sum).map_err(|e| e.to_string()).and_then(|()| {
                let want = [(size * (size - 1) / 2) as f64, size as f64];
                if x != want {
                    return Err(format!("got {x:?}, not {want:?}"));
                }
                println!("FIRST {:.3}", started.elapsed().as_secs_f64());
                Ok(())
            })
        }
        // Rank 0, the root and the bootstrap's hub, sends its broadcast
        // and exits; the others call it later and read what it sent.
        "early-exit" => {
            let mut x = vec![rank as f32; 1000];
            let first = comm.all_reduce_in_place(&mut x, ReduceOp::Sum).map_err(|e| e.to_string());
            let mut y = vec![if rank == 0 { 7.5f32 } else { 0.0 }; 100_000];
            first.and_then(|()| {
                if rank == 0 {
                    comm.broadcast(&mut y, 0).map_err(|e| e.to_string())?;
                    drop(comm);
                    report(Ok(()));
                    std::process::exit(0);
                }
                std::thread::sleep(Duration::from_millis(500));
                comm.broadcast(&mut y, 0).map_err(|e| e.to_string())?;
                if y.iter().all(|&v| v == 7.5) { Ok(()) } else { Err("wrong broadcast data".into()) }
            })
        }
        // The last rank closes after one all_reduce; the others run a
        // second, which it never runs: they fail naming it.
        "closer" => {
            let mut x = vec![1.0f32; 1000];
            comm.all_reduce_in_place(&mut x, ReduceOp::Sum).map_err(|e| e.to_string()).and_then(|()| {
                if rank == size - 1 {
                    drop(comm);
                    report(Ok(()));
                    std::process::exit(0);
                }
                comm.all_reduce_in_place(&mut x, ReduceOp::Sum).map_err(|e| e.to_string())
            })
        }
        // Rank 1 passes another count than the others: an error naming
        // both counts is expected on every rank.
        "canon" => {
            let counts = [1, 7, 1003, 70_001];
            let mut cases = crate::canon::cases(size, &counts, &crate::canon::TYPES, &crate::canon::OPS);
            // Several MiB: 4 MiB of f32, 2.4 MiB of f64 to rank 0.
            let big = |kind, dtype, count, in_place| crate::canon::Case {
                kind,
                dtype,
                op: ReduceOp::Sum,
                count,
                root: 0,
                in_place,
            };
            cases.push(big(CollKind::AllReduce, DataType::Float32, 1_000_003, false));
            cases.push(big(CollKind::Reduce, DataType::Float64, 300_001, true));
            crate::canon::check_all(&comm, &cases).map(|k| println!("CASES {k}"))
        }
        "count" => {
            let count = if rank == 1 { 12_000 } else { 10_000 };
            let mut buf = vec![1.0f32; count];
            comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)
                .map_err(|e| e.to_string())
                .and_then(|()| comm.barrier().map_err(|e| format!("next call: {e}")))
                .and_then(|()| Err("the calls that disagree succeeded".to_string()))
        }
        "volume" => {
            let count = std::env::var("OXCCL_TEST_COUNT").ok().and_then(|c| c.parse().ok()).unwrap_or(4 << 20);
            let choice = comm.choice(CollKind::AllReduce, count, DataType::Float32, 0).map_err(|e| e.to_string());
            choice.and_then(|c| {
                println!("CHOICE {c}");
                let mut x = vec![(rank + 1) as f32; count];
                comm.all_reduce_in_place(&mut x, ReduceOp::Sum).map_err(|e| e.to_string())?;
                let want = (size * (size + 1) / 2) as f32;
                match x.iter().position(|&v| v != want) {
                    None => Ok(()),
                    Some(i) => Err(format!("element {i} is {}, not {want}", x[i])),
                }
            })
        }
        "bench" => bench(&comm, rank, size),
        other => Err(format!("unknown mode {other}")),
    };
    report(result);
}

/// `bench` mode: all_reduce at 1, 4 and 16 MiB, each checked once, then
/// the best of 3 runs of a few calls each (after a barrier).
fn bench(comm: &Communicator, rank: usize, size: usize) -> Result<(), String> {
    let e = |e: oxccl::Error| e.to_string();
    for bytes in [1usize << 20, 4 << 20, 16 << 20] {
        let n = bytes / 4;
        let x = vec![(rank + 1) as f32; n];
        let mut y = vec![0f32; n];
        comm.all_reduce(&x, &mut y, ReduceOp::Sum).map_err(e)?;
        let want = (size * (size + 1) / 2) as f32;
        if y.iter().any(|&v| v != want) {
            return Err(format!("{bytes} bytes: wrong sum"));
        }
        let calls = (16 << 20) / bytes;
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            comm.barrier().map_err(e)?;
            let t = Instant::now();
            for _ in 0..calls {
                comm.all_reduce(&x, &mut y, ReduceOp::Sum).map_err(e)?;
            }
            best = best.min(t.elapsed().as_secs_f64() / calls as f64);
        }
        println!("BENCH {bytes} {best:.6}");
    }
    Ok(())
}

/// Waits until every child in `loop` mode has printed `READY`; their
/// stdouts, to read the rest from.
pub fn wait_ready(kids: &mut [Child]) -> Vec<BufReader<ChildStdout>> {
    let mut readers = Vec::new();
    for (r, k) in kids.iter_mut().enumerate() {
        let mut out = BufReader::new(k.stdout.take().unwrap());
        let mut line = String::new();
        loop {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "rank {r} ended before it was ready");
            if line.starts_with("READY") {
                break;
            }
        }
        readers.push(out);
    }
    readers
}

/// Every child's stdout, to read from (for children that may fail before
/// they are ready).
pub fn stdouts(kids: &mut [Child]) -> Vec<BufReader<ChildStdout>> {
    kids.iter_mut().map(|k| BufReader::new(k.stdout.take().unwrap())).collect()
}

/// Each of `ranks` fails within `limit` of `since`; what each said (its
/// stdout from `READY` on).
pub fn failures(
    kids: &mut [Child],
    readers: &mut [BufReader<ChildStdout>],
    ranks: &[usize],
    since: Instant,
    limit: Duration,
) -> Vec<String> {
    ranks
        .iter()
        .map(|&r| {
            let mut bytes = Vec::new();
            readers[r].read_to_end(&mut bytes).unwrap();
            let rest = String::from_utf8_lossy(&bytes).to_string();
            let status = kids[r].wait().unwrap();
            let took = since.elapsed();
            assert!(!status.success(), "rank {r} did not fail:\n{rest}");
            assert!(rest.contains("ERROR"), "rank {r} said no error ({status}, {} bytes):\n{rest}", bytes.len());
            assert!(took < limit, "rank {r} took {took:?} to fail (limit {limit:?}):\n{rest}");
            rest
        })
        .collect()
}

/// What a child was started to do: (mode, id, rank, size), or `None`
/// when the `child` test runs on its own (not started by a test).
pub fn rank_env() -> Option<(String, UniqueId, usize, usize)> {
    let mode = std::env::var("OXCCL_TEST_MODE").ok()?;
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} not set"));
    let id: UniqueId = var("OXCCL_TEST_ID").parse().unwrap();
    Some((mode, id, var("OXCCL_TEST_RANK").parse().unwrap(), var("OXCCL_TEST_SIZE").parse().unwrap()))
}

/// Prints the child's outcome the way the parent reads it (`OK`, or
/// `ERROR …` and exit status 3).
pub fn report(result: Result<(), String>) {
    match result {
        Ok(()) => println!("OK"),
        Err(e) => {
            println!("ERROR {e}");
            std::process::exit(3);
        }
    }
}

/// A fresh id whose port rank 0 (a child) will bind.
pub fn fresh_id() -> UniqueId {
    let id = UniqueId::new().unwrap();
    drop(oxccl_transport::id::take_listener(&id));
    id
}

/// Starts rank `rank` of `size` in `mode` (under `prefix`, e.g. `ip netns
/// exec NS`), with `envs` added; its stdout is piped.
pub fn spawn(prefix: &[String], id: &UniqueId, size: usize, rank: usize, mode: &str, envs: &[(&str, &str)]) -> Child {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = if prefix.is_empty() {
        Command::new(&exe)
    } else {
        let mut c = Command::new(&prefix[0]);
        c.args(&prefix[1..]).arg(&exe);
        c
    };
    cmd.args(["--ignored", "--exact", "child", "--nocapture", "--test-threads=1"])
        .env("OXCCL_TEST_MODE", mode)
        .env("OXCCL_TEST_ID", id.to_string())
        .env("OXCCL_TEST_RANK", rank.to_string())
        .env("OXCCL_TEST_SIZE", size.to_string())
        .env("OXCCL_TIMEOUT", "60")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn a rank")
}

/// Waits for a child: whether it succeeded, and its stdout.
pub fn output(c: Child) -> (bool, String) {
    let out = c.wait_with_output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).to_string())
}

/// [`output`], waiting at most `limit`: a child still running then is
/// killed, and reported as failed with a line saying so (a test fails
/// instead of hanging the run).
pub fn output_within(mut c: Child, limit: Duration) -> (bool, String) {
    let mut out = c.stdout.take();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(o) = out.as_mut() {
            let _ = o.read_to_string(&mut text);
        }
        text
    });
    let start = Instant::now();
    let status = loop {
        if let Some(st) = c.try_wait().unwrap() {
            break Some(st);
        }
        if start.elapsed() > limit {
            let _ = c.kill();
            let _ = c.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = reader.join().unwrap_or_default();
    match status {
        Some(st) => (st.success(), text),
        None => (false, format!("{text}\n(killed by the test: still running after {limit:?})")),
    }
}

/// Waits at most `limit` for a line of the child's stdout that contains
/// `pat`; the rest of its stdout is read and dropped. `false` if the child
/// ended or `limit` passed first.
pub fn await_line(c: &mut Child, pat: &str, limit: Duration) -> bool {
    let out = c.stdout.take().expect("a piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    let pat = pat.to_string();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if line.contains(&pat) {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(limit).is_ok()
}

/// The `BENCH bytes seconds` lines of a rank's output.
pub fn bench_rows(out: &str) -> Vec<(u64, f64)> {
    out.lines()
        .filter_map(|l| l.split("BENCH ").nth(1))
        .map(|l| {
            let mut w = l.split_whitespace();
            (w.next().unwrap().parse().unwrap(), w.next().unwrap().parse().unwrap())
        })
        .collect()
}
