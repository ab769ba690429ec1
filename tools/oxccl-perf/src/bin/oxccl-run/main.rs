//! oxccl-run: starts N ranks of a program on this machine, each with the
//! environment `Communicator::from_env()` reads, like `mpirun -np N`.
//!
//! ```text
//! oxccl-run -np 4 [--transport shm|tcp] [--tag-output] [--ifname IF] [--bind-to core|none] [--timeout SECS] PROGRAM ARGS...
//! ```
//!
//! See `oxccl-run --help` (the text is in `cli.rs`) for the variables, the
//! output tags and what happens when a rank fails.

mod bind;
mod cli;
mod group;
mod output;
mod spawn;

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What the ranks and the signal thread report.
enum Event {
    /// Rank `.0` ended.
    Exited(usize, std::io::Result<ExitStatus>),
    /// oxccl-run received this signal.
    Signal(i32),
}

/// Shell-style status: the exit code, or 128 + the signal.
fn status_code(st: &ExitStatus) -> i32 {
    st.code().or_else(|| st.signal().map(|s| 128 + s)).unwrap_or(1)
}

fn describe(st: &ExitStatus) -> String {
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(s)) => {
            let n = group::name(s);
            if n.is_empty() {
                format!("was killed by signal {s}")
            } else {
                format!("was killed by signal {s} (SIG{n})")
            }
        }
        _ => format!("ended ({st})"),
    }
}

fn main() {
    std::process::exit(run());
}

fn run() -> i32 {
    let cli = match cli::parse() {
        Ok(c) => c,
        Err(code) => return code,
    };
    let path = std::env::var_os("PATH");
    let program = match spawn::resolve(&cli.command[0], path.as_deref()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("oxccl-run: {e}");
            return 127;
        }
    };
    let job = match spawn::Job::new(&cli, program) {
        Ok(j) => j,
        Err(e) => {
            eprintln!("oxccl-run: {e}");
            return 1;
        }
    };
    let binder = match bind::Binder::new(cli.bind_to, job.np) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("oxccl-run: {e}");
            return 2;
        }
    };
    let (tx, rx) = mpsc::channel::<Event>();
    // Signals first, so none arriving while ranks start is lost.
    let sigs = [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM, signal_hook::consts::SIGHUP];
    match signal_hook::iterator::Signals::new(sigs) {
        Ok(mut s) => {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for sig in s.forever() {
                    if tx.send(Event::Signal(sig)).is_err() {
                        break;
                    }
                }
            });
        }
        Err(e) => eprintln!("oxccl-run: warning: cannot catch SIGINT/SIGTERM ({e}); they will not be forwarded"),
    }

    let (done_tx, done_rx) = mpsc::channel::<()>();
    let mut pumps = 0;
    let mut pgids: Vec<u32> = Vec::with_capacity(job.np);
    for rank in 0..job.np {
        // The child inherits this thread's CPUs (bind.rs).
        let spawned = binder.enter(rank).map_err(std::io::Error::other).and_then(|()| job.spawn(rank));
        binder.leave();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                eprintln!("oxccl-run: cannot start rank {rank} ({}): {e}", job.program.display());
                let _ = group::signal(&pgids, "KILL");
                return 126;
            }
        };
        pgids.push(child.id());
        if job.piped {
            let tag = output::prefix(rank, job.np);
            if let Some(o) = child.stdout.take() {
                output::pump(o, || std::io::stdout().lock(), tag.clone(), done_tx.clone());
                pumps += 1;
            }
            if let Some(e) = child.stderr.take() {
                output::pump(e, || std::io::stderr().lock(), tag, done_tx.clone());
                pumps += 1;
            }
        }
        let tx = tx.clone();
        std::thread::spawn(move || {
            let st = child.wait();
            let _ = tx.send(Event::Exited(rank, st));
        });
    }
    drop(tx);
    drop(done_tx);

    let started = Instant::now();
    let mut alive = vec![true; job.np];
    let mut failure: Option<(usize, i32)> = None;
    let mut interrupted: Option<i32> = None;
    let mut timed_out = false;
    // When ranks were told to stop, and whether SIGKILL went out.
    let mut stopping: Option<Instant> = None;
    let mut killed = false;
    let stop = |sig: &str, alive: &[bool]| {
        let targets: Vec<u32> = pgids.iter().zip(alive).filter(|&(_, &a)| a).map(|(&p, _)| p).collect();
        if let Err(e) = group::signal(&targets, sig) {
            eprintln!("oxccl-run: {e}");
        }
    };
    while alive.iter().any(|&a| a) {
        let now = Instant::now();
        let mut wake = now + Duration::from_secs(3600);
        if let Some(t) = stopping {
            wake = wake.min(t + cli.grace);
            if killed {
                // SIGKILL cannot be ignored; past this a rank is stuck in the kernel.
                wake = wake.min(t + cli.grace + Duration::from_secs(10));
            }
        } else if let Some(limit) = cli.timeout {
            wake = wake.min(started + limit);
        }
        match rx.recv_timeout(wake.saturating_duration_since(now)) {
            Ok(Event::Exited(rank, st)) => {
                alive[rank] = false;
                let st = match st {
                    Ok(st) => st,
                    Err(e) => {
                        eprintln!("oxccl-run: cannot wait for rank {rank}: {e}");
                        ExitStatus::from_raw(1 << 8)
                    }
                };
                if !st.success() && stopping.is_none() {
                    let others = match alive.iter().filter(|&&a| a).count() {
                        0 => String::new(),
                        1 => "; stopping the other rank".to_string(),
                        n => format!("; stopping the other {n} ranks"),
                    };
                    eprintln!("oxccl-run: rank {rank} (pid {}) {}{others}", pgids[rank], describe(&st));
                    failure = Some((rank, status_code(&st)));
                    stopping = Some(Instant::now());
                    stop("TERM", &alive);
                }
            }
            Ok(Event::Signal(sig)) => {
                if stopping.is_some() {
                    if !killed {
                        killed = true;
                        stop("KILL", &alive);
                    }
                } else {
                    interrupted = Some(sig);
                    stopping = Some(Instant::now());
                    stop(group::name(sig), &alive);
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let now = Instant::now();
                match stopping {
                    None => {
                        if cli.timeout.is_some_and(|l| now >= started + l) {
                            eprintln!(
                                "oxccl-run: the job ran past --timeout ({:?}); stopping {} rank(s)",
                                cli.timeout.unwrap_or_default(),
                                alive.iter().filter(|&&a| a).count()
                            );
                            timed_out = true;
                            stopping = Some(now);
                            stop("TERM", &alive);
                        }
                    }
                    Some(t) if !killed && now >= t + cli.grace => {
                        killed = true;
                        stop("KILL", &alive);
                    }
                    Some(t) if killed && now >= t + cli.grace + Duration::from_secs(10) => {
                        let stuck: Vec<usize> = (0..job.np).filter(|&r| alive[r]).collect();
                        eprintln!("oxccl-run: ranks {stuck:?} survived SIGKILL for 10 s; leaving them");
                        break;
                    }
                    Some(_) => {}
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    if stopping.is_some() {
        // Whatever the ranks started in their groups and left behind.
        let all = vec![true; job.np];
        stop("KILL", &all);
    }
    // Output still in the pipes; a process a rank left running may hold
    // one open, so this wait is bounded.
    let deadline = Instant::now() + Duration::from_secs(2);
    for _ in 0..pumps {
        if done_rx.recv_timeout(deadline.saturating_duration_since(Instant::now())).is_err() {
            break;
        }
    }
    if let Some(sig) = interrupted {
        128 + sig
    } else if let Some((_, code)) = failure {
        code
    } else if timed_out {
        124
    } else {
        0
    }
}
