//! The command line: mpirun's spelling (`-np 4`) turned into clap's
//! (`--np 4`), then parsed and checked.

use clap::Parser;
use std::ffi::OsString;
use std::time::Duration;

/// Transports a rank may be told to use between processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// Shared memory (`/dev/shm` segments).
    Shm,
    /// TCP sockets.
    Tcp,
}

impl Transport {
    /// The value of `OXCCL_TRANSPORT`.
    pub fn env_value(self) -> &'static str {
        match self {
            Transport::Shm => "shm",
            Transport::Tcp => "tcp",
        }
    }
}

fn parse_transport(s: &str) -> Result<Transport, String> {
    match s.to_ascii_lowercase().as_str() {
        "shm" => Ok(Transport::Shm),
        "tcp" => Ok(Transport::Tcp),
        "mem" => Err("mem connects ranks that are threads of one process, and oxccl-run starts processes; \
                      use shm or tcp here, or run the program with threads (oxccl-perf's -t)"
            .into()),
        _ => Err(format!("{s:?} is not a transport: use shm or tcp")),
    }
}

fn parse_np(s: &str) -> Result<usize, String> {
    let n: usize = s.parse().map_err(|_| format!("{s:?} is not a number of ranks"))?;
    if n == 0 {
        return Err("the number of ranks must be at least 1".into());
    }
    Ok(n)
}

fn parse_secs(s: &str) -> Result<Duration, String> {
    let v: f64 = s.parse().map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(v > 0.0 && v.is_finite() && v < 1e9) {
        return Err(format!("{s:?}: seconds must be positive"));
    }
    Ok(Duration::from_secs_f64(v))
}

const AFTER_HELP: &str = "\
Every rank gets the variables Communicator::from_env() reads: RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, OXCCL_ADDR=127.0.0.1:<a free port>, OXCCL_JOB (unique
per run), OXCCL_SECRET (random per run, unless OXCCL_SECRET or OXCCL_SECRET_FILE is
set already); OXCCL_TRANSPORT with --transport; OXCCL_SOCKET_IFNAME=lo with
--transport tcp (or the --ifname given). For torch scripts (init_process_group's
env:// store) also MASTER_ADDR=127.0.0.1 and MASTER_PORT=<another free port>, unless
either is set already. Standard input is closed for every rank.

Ranks are bound to a CPU each (rank r to the r-th CPU oxccl-run may use) when
there are at least as many CPUs as ranks, as mpirun binds; --bind-to none lets
the kernel place them, --bind-to core insists (an error when CPUs are too few).

With --tag-output each line a rank writes is prefixed with `[R] ` (R right-aligned
to the width of the largest rank: `[ 3] ` for 16 ranks), stdout to stdout and
stderr to stderr.

When a rank exits with a non-zero status or is killed, the others are sent
SIGTERM (their whole process group), then SIGKILL after --grace seconds, and
oxccl-run exits with that rank's status (128 + N for a rank killed by signal N).
SIGINT, SIGTERM and SIGHUP sent to oxccl-run are forwarded to the ranks the same
way (a second one kills them at once); oxccl-run then exits with 128 + N.
--timeout stops the job the same way after SECS seconds and exits with 124.

Examples:
  oxccl-run -np 4 ./target/release/all_reduce_perf -b 8 -e 64M -f 4
  oxccl-run -np 2 --transport tcp --tag-output sh -c 'echo $RANK of $WORLD_SIZE'";

/// oxccl-run: starts N ranks of a program on this machine, like mpirun.
#[derive(Parser, Debug)]
#[command(name = "oxccl-run", version, after_help = AFTER_HELP, override_usage = "oxccl-run -np N [OPTIONS] PROGRAM [ARGS]...")]
pub struct Cli {
    /// Number of ranks to start (also written -np N, as for mpirun).
    #[arg(short = 'n', long = "np", value_name = "N", value_parser = parse_np)]
    pub np: usize,
    /// Force the transport between the ranks: shm or tcp (sets OXCCL_TRANSPORT).
    #[arg(long, value_name = "shm|tcp", value_parser = parse_transport)]
    pub transport: Option<Transport>,
    /// Prefix every output line with the rank that wrote it: `[R] `.
    #[arg(long)]
    pub tag_output: bool,
    /// Network interface for TCP (sets OXCCL_SOCKET_IFNAME; default lo with --transport tcp).
    #[arg(long, value_name = "IF")]
    pub ifname: Option<String>,
    /// Bind each rank to a CPU of its own (core), or not (none). Default:
    /// core when every rank can have one of the CPUs oxccl-run may use,
    /// else none (mpirun's default).
    #[arg(long = "bind-to", value_name = "core|none", value_parser = crate::bind::parse)]
    pub bind_to: Option<crate::bind::BindTo>,
    /// Stop the job after SECS seconds (exit status 124).
    #[arg(long, value_name = "SECS", value_parser = parse_secs)]
    pub timeout: Option<Duration>,
    /// Seconds between SIGTERM and SIGKILL when ranks are stopped.
    #[arg(long, value_name = "SECS", value_parser = parse_secs, default_value = "3")]
    pub grace: Duration,
    /// The program each rank runs, and its arguments.
    #[arg(value_name = "PROGRAM", required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<OsString>,
}

/// Options that take a value: what follows them is not the program.
const VALUED: [&str; 8] = ["-n", "-np", "--np", "--transport", "--ifname", "--bind-to", "--timeout", "--grace"];

/// Rewrites mpirun's `-np` (and `-np=N`) into `--np` among oxccl-run's own
/// options, leaving the program and its arguments untouched.
pub fn normalize(args: Vec<OsString>) -> Vec<OsString> {
    let mut out = Vec::with_capacity(args.len());
    let mut it = args.into_iter();
    if let Some(argv0) = it.next() {
        out.push(argv0);
    }
    let mut expect_value = false;
    for a in it.by_ref() {
        if expect_value {
            expect_value = false;
            out.push(a);
            continue;
        }
        let s = a.to_string_lossy();
        if s == "--" || !s.starts_with('-') || s == "-" {
            out.push(a);
            break;
        }
        if s == "-np" {
            out.push("--np".into());
            expect_value = true;
        } else if let Some(v) = s.strip_prefix("-np=") {
            out.push(format!("--np={v}").into());
        } else {
            expect_value = VALUED.contains(&s.as_ref());
            out.push(a);
        }
    }
    out.extend(it);
    out
}

/// Parses the process's arguments; `Err` holds the exit status after clap
/// printed its message (help and version exit 0).
pub fn parse() -> Result<Cli, i32> {
    let args = normalize(std::env::args_os().collect());
    Cli::try_parse_from(args).map_err(|e| {
        let code = if e.use_stderr() { 2 } else { 0 };
        let _ = e.print();
        code
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strs(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn np_is_rewritten_only_before_the_program() {
        let got = normalize(strs(&["oxccl-run", "-np", "4", "--tag-output", "prog", "-np", "2"]));
        assert_eq!(got, strs(&["oxccl-run", "--np", "4", "--tag-output", "prog", "-np", "2"]));
        let got = normalize(strs(&["oxccl-run", "--transport", "-np", "-np=3", "p"]));
        assert_eq!(got, strs(&["oxccl-run", "--transport", "-np", "--np=3", "p"]));
    }

    #[test]
    fn parses_and_rejects() {
        let cli =
            Cli::try_parse_from(normalize(strs(&["r", "-np", "2", "--transport", "tcp", "prog", "-b", "8"]))).unwrap();
        assert_eq!((cli.np, cli.transport), (2, Some(Transport::Tcp)));
        assert_eq!(cli.command, strs(&["prog", "-b", "8"]));
        let e = Cli::try_parse_from(strs(&["r", "--np", "0", "prog"])).unwrap_err().to_string();
        assert!(e.contains("at least 1"), "{e}");
        let e = Cli::try_parse_from(strs(&["r", "--np", "2", "--transport", "mem", "p"])).unwrap_err().to_string();
        assert!(e.contains("threads of one process"), "{e}");
        let e = Cli::try_parse_from(strs(&["r", "--np", "2"])).unwrap_err().to_string();
        assert!(e.contains("PROGRAM"), "{e}");
        let e = Cli::try_parse_from(strs(&["r", "--np", "2", "--timeout", "-1", "p"])).unwrap_err().to_string();
        assert!(e.contains("positive"), "{e}");
    }
}
