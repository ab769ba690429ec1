//! # oxccl-sim
//!
//! Prices collective algorithms on a modelled cluster with oxccl-algo's
//! simulator and prints the result in nccl-tests' columns, one block of
//! `time algbw busbw` per algorithm and the fastest one per size:
//!
//! ```text
//! oxccl-sim all_reduce --nodes 128 --ranks-per-node 8 \
//!     --intra 450GB/s,0.6us --inter 50GB/s,5us -b 8 -e 8G -f 2 --algo ring,tree,rhd
//! oxccl-sim all_reduce --ranks-per-node 4 -b 64 --algo ring --emit > my_allreduce.json
//! oxccl-sim --program my_allreduce.json --nodes 2 --ranks-per-node 4
//! ```
//!
//! `--emit` prints a generated program as JSON to start from; `--program`
//! proves a program correct with the verifier (unless `--no-verify`), then
//! prices it.
//!
//! Sizes take nccl-tests' K/M/G suffixes (powers of 1024). Time is in
//! microseconds, `algbw = size / time` and `busbw = algbw ·` the
//! collective's bus factor, both in GB/s (10⁹ bytes per second), as
//! nccl-tests has them. Sizes run in parallel on `--threads` threads,
//! biggest programs first, never more at once than fits in memory.

mod sweep;

use clap::Parser;
use oxccl_algo::algos::{Algorithm, BuildOptions};
use oxccl_algo::cost::{Link, Topology, parse_bandwidth};
use oxccl_algo::sim::simulate;
use oxccl_algo::verify::verify;
use oxccl_algo::{CollKind, Collective, Program};
use oxccl_core::{DataType, ReduceOp};
use std::path::PathBuf;
use std::process::ExitCode;
use sweep::{Row, Table};

#[derive(Parser, Debug)]
#[command(
    name = "oxccl-sim",
    version,
    about = "Predict collective algorithms' time, algbw and busbw on a modelled cluster (nccl-tests columns)",
    after_help = "Examples:\n  oxccl-sim all_reduce --nodes 128 --ranks-per-node 8 --intra 450GB/s,0.6us --inter 50GB/s,5us -b 8 -e 8G -f 2 --algo ring,tree,rhd\n  oxccl-sim all_reduce --ranks-per-node 4 -b 64 --algo ring --emit > prog.json\n  oxccl-sim --program prog.json --nodes 2 --ranks-per-node 4\n\nModel: per-rank intra-node ports, one NIC per node shared by its ranks, first-come first-served; see oxccl_algo::sim."
)]
struct Args {
    /// Collective, as nccl-tests names it: all_reduce, all_gather,
    /// reduce_scatter, alltoall, broadcast, reduce, gather, scatter,
    /// sendrecv (optional with --program).
    #[arg(value_parser = parse_kind)]
    collective: Option<CollKind>,
    /// Number of nodes [default: 1].
    #[arg(long)]
    nodes: Option<usize>,
    /// Ranks on each node [default: 8; with --program: the program's ranks
    /// over the nodes].
    #[arg(long = "ranks-per-node")]
    ranks_per_node: Option<usize>,
    /// Link between ranks of one node: BANDWIDTH,LATENCY.
    #[arg(long, default_value = "450GB/s,0.6us", value_parser = parse_link)]
    intra: Link,
    /// Link between nodes, one NIC per node shared by its ranks.
    #[arg(long, default_value = "50GB/s,5us", value_parser = parse_link)]
    inter: Link,
    /// Smallest size in bytes (K/M/G suffixes).
    #[arg(short = 'b', long = "minbytes", default_value = "32M", value_parser = parse_size)]
    minbytes: u64,
    /// Largest size in bytes (K/M/G suffixes).
    #[arg(short = 'e', long = "maxbytes", default_value = "32M", value_parser = parse_size)]
    maxbytes: u64,
    /// Multiply the size by this much from one row to the next.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
    stepfactor: u64,
    /// Add this many bytes from one row to the next instead of -f.
    #[arg(short = 'i', long = "stepbytes", value_parser = parse_size)]
    stepbytes: Option<u64>,
    /// Algorithms to compare, comma-separated [default: every algorithm
    /// that implements the collective].
    #[arg(short = 'a', long, value_delimiter = ',', value_parser = parse_algo)]
    algo: Vec<Algorithm>,
    /// Reduction throughput (γ = 1/bw), e.g. 500GB/s [default: inf, free].
    #[arg(long = "reduce-bw", value_parser = parse_bw)]
    reduce_bw: Option<f64>,
    /// Local copy throughput [default: inf, free].
    #[arg(long = "copy-bw", value_parser = parse_bw)]
    copy_bw: Option<f64>,
    /// Data type.
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    dtype: DataType,
    /// Reduction operator (printed only: it does not change the price).
    #[arg(short = 'o', long = "op", default_value = "sum")]
    op: ReduceOp,
    /// Root of rooted collectives.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    root: usize,
    /// Largest pipeline chunk in bytes (K/M suffixes) [default: 2M, NCCL's].
    #[arg(long = "chunk", value_parser = parse_size)]
    chunk: Option<u64>,
    /// At most this many pipeline chunks per slice [default: 64].
    #[arg(long = "max-chunks")]
    max_chunks: Option<usize>,
    /// Price this program (JSON, as `Program::to_json` writes it) instead
    /// of generating one per size.
    #[arg(long, value_name = "FILE.json")]
    program: Option<PathBuf>,
    /// With --program: price it without proving it correct first.
    #[arg(long = "no-verify")]
    no_verify: bool,
    /// Print the generated program for the smallest size (-b) as JSON,
    /// for one algorithm (--algo), instead of pricing: a starting point for
    /// a hand-written one.
    #[arg(long)]
    emit: bool,
    /// Worker threads [default: the machine's cores].
    #[arg(short = 't', long)]
    threads: Option<usize>,
    /// Print each simulation's step count and build/simulate times to
    /// stderr.
    #[arg(short = 'v', long)]
    verbose: bool,
}

fn parse_kind(s: &str) -> Result<CollKind, String> {
    s.parse().map_err(|e: oxccl_core::Error| plain(&e))
}

fn parse_link(s: &str) -> Result<Link, String> {
    s.parse().map_err(|e: oxccl_core::Error| plain(&e))
}

fn parse_bw(s: &str) -> Result<f64, String> {
    parse_bandwidth(s).map_err(|e| plain(&e))
}

fn parse_algo(s: &str) -> Result<Algorithm, String> {
    s.parse().map_err(|e: oxccl_core::Error| plain(&e))
}

/// The message of an error without its "invalid argument:" kind.
fn plain(e: &oxccl_core::Error) -> String {
    match e {
        oxccl_core::Error::InvalidArgument(m) | oxccl_core::Error::InvalidProgram(m) => m.clone(),
        other => other.to_string(),
    }
}

/// Parses nccl-tests sizes: a number with an optional K, M, G or T suffix
/// (powers of 1024) and an optional trailing B.
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let body = t.strip_suffix(['B', 'b']).unwrap_or(t);
    let (num, mult) = match body.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&body[..body.len() - 1], 1u64 << 10),
        Some('M') => (&body[..body.len() - 1], 1 << 20),
        Some('G') => (&body[..body.len() - 1], 1 << 30),
        Some('T') => (&body[..body.len() - 1], 1 << 40),
        _ => (body, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("size {s:?} is not a number with an optional K, M, G suffix (e.g. 8, 128K, 8G)"))?;
    n.checked_mul(mult).ok_or_else(|| format!("size {s:?} is too large"))
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("oxccl-sim: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), String> {
    let mut opts = BuildOptions::default();
    if let Some(c) = args.chunk {
        if c == 0 {
            return Err("--chunk must be at least 1 byte".into());
        }
        opts.chunk_bytes = usize::try_from(c).map_err(|_| "--chunk is too large")?;
    }
    if let Some(m) = args.max_chunks {
        if m == 0 {
            return Err("--max-chunks must be at least 1".into());
        }
        opts.max_chunks = m;
    }
    match &args.program {
        Some(path) => run_program(args, path),
        None => run_sweep(args, &opts),
    }
}

fn topology(args: &Args, nodes: usize, rpn: usize) -> Result<Topology, String> {
    let mut topo = Topology::new(nodes, rpn, args.intra, args.inter);
    if let Some(bw) = args.reduce_bw {
        topo = topo.with_reduce_bw(bw);
    }
    if let Some(bw) = args.copy_bw {
        topo = topo.with_copy_bw(bw);
    }
    topo.validate().map_err(|e| plain(&e))?;
    Ok(topo)
}

fn run_sweep(args: &Args, opts: &BuildOptions) -> Result<(), String> {
    let kind = args.collective.ok_or("name a collective (all_reduce, all_gather, …) or give --program FILE.json")?;
    let topo = topology(args, args.nodes.unwrap_or(1), args.ranks_per_node.unwrap_or(8))?;
    let n = topo.nranks();
    let algos = if args.algo.is_empty() { Algorithm::for_kind(kind) } else { args.algo.clone() };
    for a in &algos {
        if !a.supports(kind) {
            let have: Vec<&str> = Algorithm::for_kind(kind).iter().map(|a| a.name()).collect();
            return Err(format!("algorithm {a} does not implement {kind}; {kind} has: {}", have.join(" ")));
        }
    }
    if algos.is_empty() {
        return Err(format!("no algorithm implements {kind}"));
    }
    let sizes = sweep::sizes(args.minbytes, args.maxbytes, args.stepfactor, args.stepbytes)?;
    let root = if kind.is_rooted() { args.root } else { 0 };
    let colls: Vec<Collective> = sizes
        .iter()
        .map(|&size| {
            let per = if matches!(
                kind,
                CollKind::ReduceScatter
                    | CollKind::AllGather
                    | CollKind::AllToAll
                    | CollKind::Gather
                    | CollKind::Scatter
            ) {
                n * args.dtype.size()
            } else {
                args.dtype.size()
            };
            let count = usize::try_from(size).unwrap_or(usize::MAX) / per;
            let c = Collective { kind, nranks: n, count, root, dtype: args.dtype };
            c.validate().map(|()| c).map_err(|e| plain(&e))
        })
        .collect::<Result<_, _>>()?;
    if args.emit {
        let [algo] = algos[..] else {
            return Err(format!("--emit prints one program: name one algorithm with --algo, not {}", algos.len()));
        };
        let p = oxccl_algo::algos::build(algo, &colls[0], opts).map_err(|e| plain(&e))?;
        println!("{}", p.to_json());
        return Ok(());
    }
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |t| t.get())).max(1);
    let results = sweep::run(&colls, &algos, opts, &topo, threads, args.verbose)?;
    let mut table = Table::new(kind, args.op, algos.iter().map(|a| a.name().to_string()).collect());
    println!("# oxccl-sim: {kind}, {n} ranks on {topo}");
    println!(
        "# pipeline chunk {} bytes, at most {} chunks; times are predicted by oxccl_algo::sim",
        opts.chunk_bytes, opts.max_chunks
    );
    println!("#");
    table.print_header();
    for (c, times) in colls.iter().zip(results) {
        table.print_row(&Row { coll: *c, times });
    }
    table.print_footer();
    Ok(())
}

fn run_program(args: &Args, path: &PathBuf) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let program = Program::from_json(&text).map_err(|e| format!("{}: {}", path.display(), plain(&e)))?;
    let coll = program.collective;
    if let Some(kind) = args.collective.filter(|&k| k != coll.kind) {
        return Err(format!("{} is a {} program, not {kind}", path.display(), coll.kind));
    }
    let n = program.ranks.len();
    if n == 0 {
        return Err(format!("{} has no ranks", path.display()));
    }
    let (nodes, rpn) = match (args.nodes, args.ranks_per_node) {
        (Some(a), Some(b)) => (a, b),
        (Some(a), None) if a > 0 && n % a == 0 => (a, n / a),
        (None, Some(b)) if b > 0 && n % b == 0 => (n / b, b),
        (None, None) => (1, n),
        (a, b) => {
            return Err(format!(
                "{} has {n} ranks, which {} nodes × {} ranks per node do not place",
                path.display(),
                a.map_or("?".into(), |a| a.to_string()),
                b.map_or("?".into(), |b| b.to_string())
            ));
        }
    };
    if !args.no_verify {
        let v = verify(&program)
            .map_err(|e| format!("{}: not a correct {} program: {}", path.display(), coll.kind, plain(&e)))?;
        let in_place = if program.in_place { " and in place" } else { "" };
        println!(
            "# verified: computes {coll} out of place{in_place}; bytes sent per rank: max {}, total {}",
            v.max_sent(),
            v.total_sent()
        );
    }
    let topo = topology(args, nodes, rpn)?;
    let report = simulate(&program, &topo).map_err(|e| format!("{}: {}", path.display(), plain(&e)))?;
    println!("# oxccl-sim: program {:?} ({}), {} ranks on {topo}", program.name, path.display(), n);
    let fin = &report.rank_finish;
    let first = fin.iter().copied().fold(f64::INFINITY, f64::min);
    println!(
        "# {} steps, {} messages, {} bytes within nodes, {} bytes between nodes; ranks finish between {:.3} and {:.3} us",
        report.steps,
        report.messages,
        report.intra_bytes,
        report.inter_bytes,
        first * 1e6,
        report.time * 1e6
    );
    println!("#");
    let mut table = Table::new(coll.kind, args.op, vec![program.name.clone()]);
    table.print_header();
    table.print_row(&Row { coll, times: vec![report.time] });
    table.print_footer();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_like_nccl_tests() {
        assert_eq!(parse_size("8").unwrap(), 8);
        assert_eq!(parse_size("128K").unwrap(), 128 << 10);
        assert_eq!(parse_size("8G").unwrap(), 8 << 30);
        assert_eq!(parse_size("32MB").unwrap(), 32 << 20);
        assert_eq!(parse_size("1k").unwrap(), 1024);
        assert!(parse_size("eight").unwrap_err().contains("not a number"));
        assert!(parse_size("99999999999T").unwrap_err().contains("too large"));
    }
}
