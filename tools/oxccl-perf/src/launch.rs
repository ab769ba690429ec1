//! Ranks: `-t N` ranks as threads of this process, or, under a launcher
//! (torchrun, mpirun, PMI, Slurm, oxccl-run variables), `-t` ranks per
//! process with global rank `process rank × t + thread`. Global rank 0
//! prints; the exit status is non-zero when a check failed or a rank
//! failed.

use crate::args::{self, Command, Options};
use crate::bench::{Bench, Outcome, Team};
use crate::report::{RankInfo, Reporter};
use oxccl::{CollKind, Communicator, Config, Launch, UniqueId};
use std::collections::BTreeSet;
use std::time::Duration;

/// Exit status of a usage error.
pub const USAGE: i32 = 2;

/// The launcher's description of this process, or `None` to run every
/// rank in this process. A launcher that says there is more than one
/// process but is missing something (the rendezvous address) is an error.
fn detect(get: impl Fn(&str) -> Option<String>) -> Result<Option<Launch>, String> {
    match Launch::from_vars(&get) {
        Ok(l) => Ok(Some(l)),
        Err(e) => {
            let sizes = ["WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"];
            let many = sizes.iter().any(|k| get(k).and_then(|v| v.trim().parse::<usize>().ok()).is_some_and(|n| n > 1));
            if many { Err(format!("launcher variables found but unusable: {e}")) } else { Ok(None) }
        }
    }
}

/// This host's name up to the first dot, as nccl-tests prints it.
fn hostname() -> String {
    let h = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let h = h.trim().split('.').next().unwrap_or("").to_string();
    if h.is_empty() { "localhost".into() } else { h }
}

const FIELD: usize = 64;
const RECORD: usize = 8 + 2 * FIELD;

fn put(dst: &mut [u8], s: &str) {
    let b = &s.as_bytes()[..s.len().min(FIELD - 1)];
    dst[..b.len()].copy_from_slice(b);
}

fn get(src: &[u8]) -> String {
    let end = src.iter().position(|&b| b == 0).unwrap_or(src.len());
    String::from_utf8_lossy(&src[..end]).into_owned()
}

/// Every rank's `# Using devices` line, gathered through the communicator
/// (fixed-size records: pid, device, host, transports).
fn rank_infos(comm: &Communicator, device: usize) -> oxccl::Result<Vec<RankInfo>> {
    let me = comm.rank();
    let kinds: BTreeSet<&str> =
        (0..comm.size()).filter(|&p| p != me).filter_map(|p| comm.transport_to(p)).map(|k| k.name()).collect();
    let transport = if kinds.is_empty() { "self".to_string() } else { kinds.into_iter().collect::<Vec<_>>().join("+") };
    let mut rec = [0u8; RECORD];
    rec[..4].copy_from_slice(&std::process::id().to_le_bytes());
    rec[4..8].copy_from_slice(&(device as u32).to_le_bytes());
    put(&mut rec[8..8 + FIELD], &hostname());
    put(&mut rec[8 + FIELD..], &transport);
    let mut all = vec![0u8; RECORD * comm.size()];
    comm.all_gather(&rec, &mut all)?;
    Ok(all
        .chunks_exact(RECORD)
        .enumerate()
        .map(|(rank, r)| RankInfo {
            rank,
            pid: u32::from_le_bytes(r[..4].try_into().expect("4 bytes")),
            device: u32::from_le_bytes(r[4..8].try_into().expect("4 bytes")) as usize,
            host: get(&r[8..8 + FIELD]),
            transport: get(&r[8 + FIELD..]),
        })
        .collect())
}

/// Bytes each of a rank's two buffers may take: three quarters of the
/// available memory shared by this process's `threads` ranks (`None`
/// when /proc/meminfo does not say).
fn memory_budget(threads: usize) -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: usize = info
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb.saturating_mul(1024) / 4 * 3 / (2 * threads.max(1)))
}

/// The options with `-e` lowered to what every rank's memory allows (the
/// smallest budget over ranks, as nccl-tests takes the smallest GPU).
fn fitted(comm: &Communicator, o: &Options) -> oxccl::Result<Options> {
    let mine = memory_budget(o.nthreads).unwrap_or(usize::MAX).saturating_sub(8 * o.unalign + 64);
    let mut m = [mine as u64];
    comm.all_reduce_in_place(&mut m, oxccl::ReduceOp::Min)?;
    let mut fit = o.clone();
    fit.max_bytes = o.max_bytes.min(usize::try_from(m[0]).unwrap_or(usize::MAX));
    fit.min_bytes = fit.min_bytes.min(fit.max_bytes);
    Ok(fit)
}

/// The configuration every rank uses: `-T`, and with `-A` the program,
/// loaded, verified and selected for `kind` (an error says why it cannot
/// run that benchmark).
fn config(kind: CollKind, o: &Options) -> Result<Config, String> {
    let mut config = Config { timeout: (o.timeout > 0).then(|| Duration::from_secs(o.timeout)), ..Config::default() };
    if let Some(path) = &o.program {
        let ids = oxccl::programs::load(path).map_err(|e| e.to_string())?;
        let id = *ids
            .iter()
            .find(|&&id| oxccl::programs::collective(id).kind == kind)
            .ok_or_else(|| format!("{}: no {kind} program in the file", path.display()))?;
        let name = oxccl::programs::name(id);
        config.algo = Some(format!("{}:{name}", kind.name().replace('_', "")));
        config.programs = ids;
    }
    Ok(config)
}

/// The collective of the first program in `path` (`oxccl-perf -A FILE`
/// without a collective's name).
pub fn program_kind(path: &str) -> Result<CollKind, String> {
    let ids = oxccl::programs::load(path).map_err(|e| e.to_string())?;
    Ok(oxccl::programs::collective(ids[0]).kind)
}

/// This process's communicators: (communicator, device index) per thread.
fn communicators(kind: CollKind, o: &Options, launch: Option<&Launch>) -> Result<Vec<(Communicator, usize)>, String> {
    let config = config(kind, o)?;
    // On GPUs, each of the -t threads drives -g ranks (each its own thread
    // here: oxccl's calls block only until enqueued, but set-up is collective).
    let t = o.nthreads * if o.gpu { o.ngpus } else { 1 };
    let comms = match launch {
        None => Communicator::init_threads_with(t, config).map_err(|e| e.to_string())?,
        Some(l) => {
            let id = oxccl::with_launch_secret(UniqueId::for_env(l.addr, &l.job), |k| std::env::var(k).ok())
                .map_err(|e| e.to_string())?;
            let nranks = l.size * t;
            let handles: Vec<_> = (0..t)
                .map(|i| {
                    let (cfg, rank) = (config.clone(), l.rank * t + i);
                    std::thread::spawn(move || Communicator::init(&id, nranks, rank, cfg))
                })
                .collect();
            let mut v = Vec::with_capacity(t);
            for h in handles {
                v.push(h.join().map_err(|_| "a rank's init panicked".to_string())?.map_err(|e| e.to_string())?);
            }
            v
        }
    };
    let first = launch.and_then(|l| l.local_rank).unwrap_or(0) * t;
    if o.gpu {
        let count = oxccl_cuda::Device::count().map_err(|e| e.to_string())?;
        return comms
            .into_iter()
            .enumerate()
            .map(|(i, c)| Ok((c, crate::gpu::ordinal(first + i, o.ranks_per_gpu, count)?)))
            .collect();
    }
    Ok(comms.into_iter().enumerate().map(|(i, c)| (c, first + i)).collect())
}

/// One thread's ranks (`team`, rank 0's reporter if it is among them):
/// their set-up, each on a thread of its own (it waits for every rank),
/// then the benchmark driven from this thread.
fn run_team(
    kind: CollKind,
    o: &Options,
    team: &[(Communicator, usize)],
    mut report: Option<&mut Reporter>,
) -> oxccl::Result<Vec<Outcome>> {
    let prep: Vec<oxccl::Result<(Vec<RankInfo>, Options)>> = std::thread::scope(|s| {
        let hs: Vec<_> = team
            .iter()
            .map(|(comm, device)| s.spawn(move || Ok((rank_infos(comm, *device)?, fitted(comm, o)?))))
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(oxccl::Error::Internal("a rank panicked".into()))))
            .collect()
    });
    let prep = prep.into_iter().collect::<oxccl::Result<Vec<_>>>()?;
    // Every rank fitted the same sizes (a minimum over all of them).
    let fit = prep[0].1.clone();
    if let Some(rep) = report.as_deref_mut() {
        rep.preamble(o, &prep[0].0, (fit.max_bytes < o.max_bytes).then_some(fit.max_bytes));
    }
    let mut benches = Vec::with_capacity(team.len());
    for (comm, device) in team {
        let gpu = if o.gpu { Some(crate::gpu::Gpu::new(*device, Bench::buffer_bytes(&fit))?) } else { None };
        let mine = if comm.rank() == 0 { report.take() } else { None };
        benches.push(Bench::new(comm, &fit, kind, mine, gpu));
    }
    // The reporting rank leads (its row is printed).
    if let Some(i) = benches.iter().position(|b| b.reports()) {
        benches.swap(0, i);
        let mut outs = Team::new(benches).run()?;
        outs.swap(0, i);
        return Ok(outs);
    }
    Team::new(benches).run()
}

/// Runs the benchmark; the exit status.
fn run(kind: CollKind, o: &Options, prog: &str, argv: &[String]) -> Result<i32, String> {
    let launch = detect(|k| std::env::var(k).ok())?;
    let main_proc = launch.as_ref().is_none_or(|l| l.rank == 0);
    let mut reporter = if main_proc { Some(Reporter::new(prog, o, argv)?) } else { None };
    let comms = communicators(kind, o, launch.as_ref()).map_err(|e| format!("cannot create the communicators: {e}"))?;
    let n = comms[0].0.size();
    if let (Some(path), true) = (&o.program, main_proc) {
        let c = comms[0].0.choice(kind, 0, oxccl::DataType::Float32, o.root.unwrap_or(0)).map_err(|e| e.to_string())?;
        println!("# Program: {c} from {}", path.display());
    }
    if let (true, Some(r)) = (kind.is_rooted(), o.root)
        && r >= n
    {
        return Err(format!("-r {r}: root out of range for {n} ranks"));
    }
    // Each thread drives a team of ranks: one, or -g with -H gpu.
    let per = if o.gpu { o.ngpus } else { 1 };
    let mut slot = reporter.as_mut();
    let results: Vec<oxccl::Result<Outcome>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .chunks(per)
            .map(|team| {
                let mine = if team.iter().any(|(c, _)| c.rank() == 0) { slot.take() } else { None };
                s.spawn(move || {
                    let r = run_team(kind, o, team, mine);
                    let r = match r {
                        Ok(outs) => outs.into_iter().map(Ok).collect(),
                        Err(e) => vec![Err(e); team.len()],
                    };
                    for ((comm, _), r) in team.iter().zip(&r) {
                        if r.is_err() {
                            comm.abort();
                        }
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .zip(comms.chunks(per))
            .flat_map(|(h, team)| {
                h.join().unwrap_or_else(|_| vec![Err(oxccl::Error::Internal("a rank panicked".into())); team.len()])
            })
            .collect()
    });
    let mut failures = Vec::new();
    for ((comm, _), r) in comms.iter().zip(&results) {
        if let Err(e) = r {
            failures.push(format!("rank {}: {e}", comm.rank()));
        }
    }
    drop(comms);
    for f in &failures {
        eprintln!("{prog}: {f}");
    }
    let mut status = i32::from(!failures.is_empty());
    if let Some(mut rep) = reporter {
        if let Some(Ok(out)) = results.first() {
            let min_bw = std::env::var("NCCL_TESTS_MIN_BW").ok().and_then(|v| v.trim().parse::<f64>().ok());
            let avg = out.bw_sum / out.bw_count as f64;
            rep.footer(out.errors, avg, min_bw);
            if out.errors > 0 || min_bw.is_some_and(|m| avg < m * 0.9) {
                status = 1;
            }
        }
        rep.finish(&failures)?;
    } else if let Some(Ok(out)) = results.first()
        && out.errors > 0
    {
        status = 1;
    }
    Ok(status)
}

/// Parses `rest` (the options) and runs `kind`; the exit status.
pub fn cli(kind: CollKind, prog: &str, rest: &[String], argv: &[String]) -> i32 {
    match args::parse(rest) {
        Err(e) => {
            eprintln!("{prog}: {e}\n{prog}: '{prog} -h' lists the options");
            USAGE
        }
        Ok(Command::Help) => {
            print!("{}", args::usage(prog));
            0
        }
        Ok(Command::Run(o)) => run(kind, &o, prog, argv).unwrap_or_else(|e| {
            eprintln!("{prog}: {e}");
            1
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launcher_detection() {
        let none = detect(|_| None).unwrap();
        assert!(none.is_none());
        let env = |k: &str| match k {
            "RANK" => Some("1".to_string()),
            "WORLD_SIZE" => Some("2".to_string()),
            "OXCCL_ADDR" => Some("127.0.0.1:5000".to_string()),
            _ => None,
        };
        let l = detect(env).unwrap().unwrap();
        assert_eq!((l.rank, l.size), (1, 2));
        let partial = |k: &str| match k {
            "RANK" => Some("1".to_string()),
            "WORLD_SIZE" => Some("2".to_string()),
            _ => None,
        };
        assert!(detect(partial).unwrap_err().contains("OXCCL_ADDR"));
        // A one-process Slurm allocation without an address runs threads.
        let one = |k: &str| (k == "SLURM_NTASKS" || k == "SLURM_PROCID").then(|| "1".to_string());
        assert!(detect(|k| if k == "SLURM_PROCID" { Some("0".into()) } else { one(k) }).unwrap().is_none());
    }

    #[test]
    fn memory_budget_shares_available_memory() {
        if let (Some(one), Some(four)) = (memory_budget(1), memory_budget(4)) {
            assert!(one > 0 && four <= one / 4 + 1, "{one} {four}");
        }
    }

    #[test]
    fn records_round_trip() {
        let mut rec = [0u8; RECORD];
        put(&mut rec[8..8 + FIELD], "host-with-a-very-long-name-that-does-not-fit-in-the-sixty-four-byte-field");
        let h = get(&rec[8..8 + FIELD]);
        assert_eq!(h.len(), FIELD - 1);
        assert!(!hostname().is_empty() && !hostname().contains('.'));
    }
}
