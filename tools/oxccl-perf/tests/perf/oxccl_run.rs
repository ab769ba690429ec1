//! oxccl-run end to end: the environment each rank gets, tagged output,
//! a failing rank stopping the job, signals, bad input, and real oxccl
//! communicators (this test binary is its own rank program:
//! `child_allreduce`, ignored by default).

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const RUN: &str = env!("CARGO_BIN_EXE_oxccl-run");

struct Out {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    took: Duration,
}

fn drain(r: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = BufReader::new(r).read_to_string(&mut s);
        let _ = tx.send(s);
    });
    rx
}

/// Waits for `c` at most `limit`, killing it past that (a test failure).
fn wait_for(mut c: Child, limit: Duration, what: &str) -> Out {
    let t = Instant::now();
    let (out, err) = (drain(c.stdout.take().unwrap()), drain(c.stderr.take().unwrap()));
    let status = loop {
        if let Some(st) = c.try_wait().unwrap() {
            break st;
        }
        if t.elapsed() > limit {
            let _ = c.kill();
            let _ = c.wait();
            panic!("{what}: still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = t.elapsed();
    let get = |rx: mpsc::Receiver<String>| rx.recv_timeout(Duration::from_secs(10)).expect("output closed");
    Out { status, stdout: get(out), stderr: get(err), took }
}

fn oxccl_run(args: &[&str]) -> Out {
    let c = Command::new(RUN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start oxccl-run");
    wait_for(c, Duration::from_secs(60), &format!("oxccl-run {args:?}"))
}

#[test]
fn ranks_get_their_environment() {
    let o = oxccl_run(&[
        "-np",
        "4",
        "sh",
        "-c",
        "echo $RANK $WORLD_SIZE $OXCCL_ADDR $LOCAL_RANK $LOCAL_WORLD_SIZE $OXCCL_JOB",
    ]);
    assert!(o.status.success(), "{}", o.stderr);
    let rows: Vec<Vec<&str>> = o.stdout.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows.len(), 4, "{}", o.stdout);
    let mut ranks: Vec<&str> = rows.iter().map(|r| r[0]).collect();
    ranks.sort();
    assert_eq!(ranks, ["0", "1", "2", "3"]);
    for r in &rows {
        assert_eq!(r.len(), 6, "{r:?}");
        assert_eq!((r[1], r[2], r[4], r[5]), ("4", rows[0][2], "4", rows[0][5]), "{r:?}");
        assert_eq!(r[3], r[0], "LOCAL_RANK differs from RANK: {r:?}");
        let (host, port) = r[2].split_once(':').unwrap();
        assert_eq!(host, "127.0.0.1");
        assert!(port.parse::<u16>().unwrap() > 0);
    }
    // A second run has another job id.
    let again = oxccl_run(&["-np", "1", "sh", "-c", "echo $OXCCL_JOB"]);
    assert_ne!(again.stdout.trim(), rows[0][5]);
}

/// torch scripts' `env://` store gets `MASTER_ADDR`/`MASTER_PORT`: another
/// free port than oxccl's rendezvous, the same on every rank; a caller's
/// own values are inherited instead.
#[test]
fn ranks_get_a_store_address_for_torch() {
    let show = "echo $MASTER_ADDR $MASTER_PORT $OXCCL_ADDR";
    let run = |extra: &[(&str, &str)]| {
        let mut c = Command::new(RUN);
        c.args(["-np", "2", "sh", "-c", show]).env_remove("MASTER_ADDR").env_remove("MASTER_PORT");
        for (k, v) in extra {
            c.env(k, v);
        }
        let c = c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        wait_for(c, Duration::from_secs(60), "oxccl-run with MASTER_*")
    };
    let o = run(&[]);
    assert!(o.status.success(), "{}", o.stderr);
    let rows: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(rows.len(), 2, "{}", o.stdout);
    assert_eq!(rows[0], rows[1], "every rank gets the same store address");
    let f: Vec<&str> = rows[0].split_whitespace().collect();
    assert_eq!(f[0], "127.0.0.1", "{rows:?}");
    let store: u16 = f[1].parse().unwrap();
    let rendezvous: u16 = f[2].rsplit_once(':').unwrap().1.parse().unwrap();
    assert!(store > 0 && store != rendezvous, "{rows:?}");
    let o = run(&[("MASTER_ADDR", "10.1.2.3"), ("MASTER_PORT", "29511")]);
    assert!(o.stdout.lines().all(|l| l.starts_with("10.1.2.3 29511 ")), "{}", o.stdout);
}

#[test]
fn transport_and_interface_variables() {
    let show = "echo T=${OXCCL_TRANSPORT-unset} I=${OXCCL_SOCKET_IFNAME-unset}";
    let o = oxccl_run(&["-np", "2", "--transport", "tcp", "sh", "-c", show]);
    assert_eq!(o.stdout.lines().filter(|l| *l == "T=tcp I=lo").count(), 2, "{}{}", o.stdout, o.stderr);
    let o = oxccl_run(&["--np", "1", "--transport", "tcp", "--ifname", "=eth0", "sh", "-c", show]);
    assert_eq!(o.stdout.trim(), "T=tcp I==eth0");
    let o = oxccl_run(&["-n", "1", "--transport", "shm", "sh", "-c", show]);
    assert!(o.stdout.starts_with("T=shm "), "{}", o.stdout);
}

#[test]
fn tagged_output() {
    // Each rank writes two stdout lines (the second without a newline) and
    // one stderr line.
    let script = "echo out $RANK; printf 'tail %s' $RANK; echo err $RANK >&2";
    let o = oxccl_run(&["-np", "3", "--tag-output", "sh", "-c", script]);
    assert!(o.status.success(), "{}", o.stderr);
    for r in 0..3 {
        for want in [format!("[{r}] out {r}"), format!("[{r}] tail {r}")] {
            assert!(o.stdout.lines().any(|l| l == want), "no {want:?} in\n{}", o.stdout);
        }
        assert!(o.stderr.lines().any(|l| l == format!("[{r}] err {r}")), "{}", o.stderr);
    }
    assert_eq!(o.stdout.lines().count(), 6, "{}", o.stdout);
    // Untagged, lines are the ranks' own.
    let o = oxccl_run(&["-np", "2", "sh", "-c", "echo plain"]);
    assert_eq!(o.stdout, "plain\nplain\n");
}

fn gone(pid: u32) -> bool {
    // Gone, or a zombie waiting for a reaper that is not ours.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("oxccl-run-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn sleeper_pids(dir: &Path) -> Vec<u32> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| std::fs::read_to_string(e.path()).unwrap().trim().parse().unwrap())
        .collect()
}

#[test]
fn a_failing_rank_stops_the_others() {
    let dir = scratch("fail");
    // Ranks 0, 2, 3 start a child sleep (in their process group) and wait;
    // rank 1 waits until they have, then exits 3.
    let script = format!(
        "d={}; if [ \"$RANK\" = 1 ]; then while [ $(ls $d | wc -l) -lt 3 ]; do sleep 0.05; done; exit 3; fi; \
         sleep 30 & echo $! > $d/.$RANK; mv $d/.$RANK $d/$RANK; wait",
        dir.display()
    );
    let o = oxccl_run(&["-np", "4", "--timeout", "50", "sh", "-c", &script]);
    assert_eq!(o.status.code(), Some(3), "{}", o.stderr);
    assert!(o.took < Duration::from_secs(10), "took {:?}", o.took);
    assert!(o.stderr.contains("rank 1") && o.stderr.contains("status 3"), "{}", o.stderr);
    let pids = sleeper_pids(&dir);
    assert_eq!(pids.len(), 3);
    let t = Instant::now();
    while !pids.iter().all(|&p| gone(p)) && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(pids.iter().all(|&p| gone(p)), "sleeps left running: {pids:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_rank_killed_by_a_signal_gives_128_plus_the_signal() {
    let o = oxccl_run(&["-np", "2", "sh", "-c", "if [ $RANK = 0 ]; then kill -9 $$; fi; sleep 30"]);
    assert_eq!(o.status.code(), Some(137), "{}", o.stderr);
    assert!(o.stderr.contains("rank 0") && o.stderr.contains("SIGKILL"), "{}", o.stderr);
    assert!(o.took < Duration::from_secs(10));
}

#[test]
fn timeout_stops_the_job() {
    let o = oxccl_run(&["-np", "2", "--timeout", "0.5", "sleep", "30"]);
    assert_eq!(o.status.code(), Some(124), "{}", o.stderr);
    assert!(o.took < Duration::from_secs(10) && o.stderr.contains("--timeout"), "{:?} {}", o.took, o.stderr);
}

#[test]
fn sigterm_is_forwarded() {
    let script = "trap 'echo got TERM; exit 7' TERM; echo ready; sleep 30 & wait";
    let mut c = Command::new(RUN)
        .args(["-np", "2", "--tag-output", "sh", "-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(c.stdout.take().unwrap()).lines();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in lines.by_ref() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    while seen.iter().filter(|l: &&String| l.ends_with("ready")).count() < 2 {
        seen.push(rx.recv_timeout(Duration::from_secs(30)).expect("ranks never said ready"));
    }
    let ok = Command::new("kill").args(["-s", "TERM", &c.id().to_string()]).status().unwrap().success();
    assert!(ok);
    let t = Instant::now();
    let status = loop {
        if let Some(st) = c.try_wait().unwrap() {
            break st;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "oxccl-run did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(status.code(), Some(128 + 15));
    while let Ok(l) = rx.recv_timeout(Duration::from_secs(5)) {
        seen.push(l);
    }
    for r in 0..2 {
        assert!(seen.contains(&format!("[{r}] got TERM")), "{seen:?}");
    }
}

#[test]
fn bad_input_is_named() {
    let o = oxccl_run(&["-np", "2", "no-such-program-oxccl"]);
    assert_eq!(o.status.code(), Some(127));
    assert!(o.stderr.contains("no-such-program-oxccl") && o.stderr.contains("not found"), "{}", o.stderr);
    let o = oxccl_run(&["-np", "2", "./no/such/path"]);
    assert!(!o.status.success() && o.stderr.contains("./no/such/path"), "{}", o.stderr);
    let o = oxccl_run(&["-np", "0", "true"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(o.stderr.contains("at least 1"), "{}", o.stderr);
    let o = oxccl_run(&["-np", "2"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(o.stderr.contains("PROGRAM"), "{}", o.stderr);
    let o = oxccl_run(&["sh", "-c", "true"]);
    assert!(o.status.code() == Some(2) && o.stderr.contains("--np"), "{}", o.stderr);
    let o = oxccl_run(&["-np", "2", "--transport", "mem", "true"]);
    assert!(o.status.code() == Some(2) && o.stderr.contains("threads"), "{}", o.stderr);
    // All ranks succeeding is success.
    assert!(oxccl_run(&["-np", "3", "true"]).status.success());
}

/// The rank program of `real_communicators_*`: oxccl from the environment
/// oxccl-run set, one all-reduce, the sum checked.
#[test]
#[ignore = "a rank's body, started through oxccl-run by the tests below"]
fn child_allreduce() {
    let Ok(want) = std::env::var("OXCCL_RUN_TEST_TRANSPORT") else { return };
    let comm = oxccl::Communicator::from_env().expect("Communicator::from_env");
    let (rank, n) = (comm.rank(), comm.size());
    assert_eq!(rank.to_string(), std::env::var("RANK").unwrap());
    assert_eq!(n.to_string(), std::env::var("WORLD_SIZE").unwrap());
    for p in (0..n).filter(|&p| p != rank) {
        assert_eq!(comm.transport_to(p).map(|k| k.to_string()).as_deref(), Some(want.as_str()));
    }
    let count = 100_003;
    let send: Vec<f32> = (0..count).map(|i| ((rank + 1) * (i % 5 + 1)) as f32).collect();
    let mut recv = vec![0f32; count];
    comm.all_reduce(&send, &mut recv, oxccl::ReduceOp::Sum).unwrap();
    let ranks_sum = (n * (n + 1) / 2) as f32;
    for (i, v) in recv.iter().enumerate() {
        assert_eq!(*v, ranks_sum * (i % 5 + 1) as f32, "element {i} on rank {rank}");
    }
    println!("ALLREDUCE OK rank {rank} of {n}");
}

fn real_communicators(transport: &str) {
    let exe = std::env::current_exe().unwrap();
    let c = Command::new(RUN)
        .args(["-np", "3", "--transport", transport, "--tag-output", "--timeout", "90"])
        .arg(&exe)
        .args(["--ignored", "--exact", "oxccl_run::child_allreduce", "--nocapture", "--test-threads=1"])
        .env("OXCCL_RUN_TEST_TRANSPORT", transport)
        .env("OXCCL_TIMEOUT", "60")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let o = wait_for(c, Duration::from_secs(120), "oxccl-run of child_allreduce");
    assert!(o.status.success(), "{}\n{}", o.stdout, o.stderr);
    for r in 0..3 {
        let mine = |l: &&str| l.starts_with(&format!("[{r}] ")) && l.contains(&format!("ALLREDUCE OK rank {r} of 3"));
        assert!(o.stdout.lines().any(|l| mine(&l)), "{}\n{}", o.stdout, o.stderr);
    }
}

#[test]
fn real_communicators_over_shm() {
    real_communicators("shm");
}

#[test]
fn real_communicators_over_tcp() {
    real_communicators("tcp");
}

fn tools_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn have(program: &str, arg: &str) -> bool {
    Command::new(program).arg(arg).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

/// tools/compare-peers parses nccl-tests output and builds its tables
/// (its embedded samples), where python3 exists (else a skip, a failure
/// where `OXCCL_REQUIRE_PYTHON` is set).
#[test]
fn compare_peers_selftest() {
    if !have("python3", "--version") {
        oxccl_skip::skip_or_fail("OXCCL_REQUIRE_PYTHON", "no python3");
        return;
    }
    let c = Command::new("python3")
        .arg(tools_dir().join("compare-peers"))
        .arg("--selftest")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let o = wait_for(c, Duration::from_secs(60), "compare-peers --selftest");
    assert!(o.status.success() && o.stdout.contains("selftest: ok"), "{}\n{}", o.stdout, o.stderr);
}

/// tools/peers/mpi_perf.c builds and checks every collective at 3 ranks,
/// where Open MPI is installed (else a skip, a failure where
/// `OXCCL_REQUIRE_MPI` is set).
#[test]
fn mpi_peer_benchmark() {
    if !have("mpicc", "--showme:version") || !have("mpirun", "--version") {
        oxccl_skip::skip_or_fail("OXCCL_REQUIRE_MPI", "no Open MPI (apt-get install openmpi-bin libopenmpi-dev)");
        return;
    }
    let dir = scratch("mpi");
    let bin = dir.join("mpi_perf");
    let ok = Command::new("mpicc")
        .args(["-O2", "-o"])
        .arg(&bin)
        .arg(tools_dir().join("peers/mpi_perf.c"))
        .status()
        .unwrap()
        .success();
    assert!(ok, "mpicc failed");
    for coll in [
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "alltoall",
        "broadcast",
        "reduce",
        "gather",
        "scatter",
        "sendrecv",
    ] {
        let run = || {
            let c = Command::new("mpirun")
                .args(["--allow-run-as-root", "--oversubscribe", "-np", "3", "--mca", "btl", "self,vader"])
                .arg(&bin)
                .args([coll, "-b", "8", "-e", "40K", "-f", "9", "-n", "2", "-w", "1", "-r", "1"])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            wait_for(c, Duration::from_secs(60), coll)
        };
        let mut o = run();
        // Seen once in CI on a loaded machine: every rank printed its
        // results, then mpirun said a rank "exited improperly" with PID 0
        // (Open MPI's teardown, not the benchmark). Such a run is repeated
        // once; whatever the second run prints is checked as below.
        let finished = o.stdout.contains("Out of bounds values");
        let improper = o.stdout.contains("exiting improperly") || o.stderr.contains("exiting improperly");
        if !o.status.success() && finished && improper {
            eprintln!("{coll}: mpirun's teardown failed after the benchmark had finished; running it again");
            o = run();
        }
        assert!(o.status.success(), "{coll}:\n{}\n{}", o.stdout, o.stderr);
        assert!(o.stdout.contains("Out of bounds values : 0 OK"), "{coll}:\n{}", o.stdout);
        let rows: Vec<&str> = o.stdout.lines().filter(|l| !l.starts_with('#')).collect();
        // 8, 72, 648, 5832 and 52488 > 40K: four sizes.
        assert_eq!(rows.len(), 4, "{coll}:\n{}", o.stdout);
        for r in rows {
            let f: Vec<&str> = r.split_whitespace().collect();
            assert_eq!(f.len(), 13, "{r}");
            assert_eq!((f[8], f[12]), ("0", "0"), "{coll}: {r}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// tools/peers/gloo_perf.py at 2 ranks, where a python3 with torch exists:
/// all_reduce checks out, and reduce_scatter either does too or says that
/// Gloo lacks it (status 3). Without torch a skip, a failure where
/// `OXCCL_REQUIRE_TORCH` is set.
#[test]
fn gloo_peer_benchmark() {
    let torch = |py: &str| {
        Command::new(py)
            .args(["-c", "import torch.distributed as d; assert d.is_gloo_available()"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let Some(py) = ["python3", "/usr/bin/python3"].into_iter().find(|p| torch(p)) else {
        oxccl_skip::skip_or_fail("OXCCL_REQUIRE_TORCH", "no python3 with torch (apt-get install python3-torch)");
        return;
    };
    let once = |coll: &str| {
        let c = Command::new(py)
            .arg(tools_dir().join("peers/gloo_perf.py"))
            .args([coll, "-np", "2", "-b", "8", "-e", "4K", "-f", "8", "-n", "2", "-w", "1", "--timeout", "100"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_for(c, Duration::from_secs(120), coll)
    };
    // The script picks a free port for torch's store and binds it a moment
    // later; the other tests here open ports meanwhile (seen once in CI:
    // "Address already in use"). That, and only that, is tried once more.
    let run = |coll: &str| {
        let o = once(coll);
        if !o.status.success() && o.stderr.contains("Address already in use") { once(coll) } else { o }
    };
    let o = run("all_reduce");
    assert!(o.status.success() && o.stdout.contains("Out of bounds values : 0 OK"), "{}\n{}", o.stdout, o.stderr);
    assert_eq!(o.stdout.lines().filter(|l| !l.starts_with('#')).count(), 4, "{}", o.stdout);
    let o = run("reduce_scatter");
    let unsupported = o.status.code() == Some(3) && o.stdout.contains("# unsupported: reduce_scatter");
    assert!(unsupported || o.stdout.contains("Out of bounds values : 0 OK"), "{}\n{}", o.stdout, o.stderr);
}

/// The CPUs each rank may run on, by rank (`Cpus_allowed_list` of its
/// /proc status).
fn cpus_by_rank(args: &[&str]) -> Vec<String> {
    let script = "echo $RANK $(grep Cpus_allowed_list /proc/self/status | cut -f2)";
    let mut a: Vec<&str> = args.to_vec();
    a.extend(["sh", "-c", script]);
    let out = oxccl_run(&a);
    assert!(out.status.success(), "{args:?}: {}", out.stderr);
    let mut rows: Vec<(usize, String)> = out
        .stdout
        .lines()
        .map(|l| {
            let (r, c) = l.split_once(' ').unwrap_or_else(|| panic!("odd line {l:?}"));
            (r.parse().unwrap(), c.to_string())
        })
        .collect();
    rows.sort();
    rows.into_iter().map(|(_, c)| c).collect()
}

#[test]
fn ranks_are_bound_to_a_cpu_each_when_there_are_enough() {
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    let unbound = cpus_by_rank(&["-np", "1", "--bind-to", "none"]);
    if all < 2 {
        eprintln!("one CPU here: only the refusal to bind 2 ranks is checked");
    } else {
        let bound = cpus_by_rank(&["-np", "2"]);
        assert_eq!(bound.len(), 2);
        assert!(bound.iter().all(|c| c.parse::<usize>().is_ok()), "one CPU each: {bound:?}");
        assert_ne!(bound[0], bound[1], "distinct CPUs: {bound:?}");
        assert_eq!(
            cpus_by_rank(&["-np", "2", "--bind-to", "none"]),
            vec![unbound[0].clone(); 2],
            "none: the launcher's"
        );
    }
    // More ranks than CPUs: not bound by default, refused when insisted on.
    let many = (all + 1).to_string();
    let shared = cpus_by_rank(&["-np", &many]);
    assert!(shared.iter().all(|c| *c == unbound[0]), "{shared:?} vs {unbound:?}");
    let out = oxccl_run(&["-np", &many, "--bind-to", "core", "true"]);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("--bind-to none"), "{}", out.stderr);
}
