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
//! prices it: at its own count in one row, or, when any of `-b -e -f -i`
//! is given, at every size of the sweep, instantiated for each count by
//! `oxccl_algo::scale` (and verified at each):
//!
//! ```text
//! oxccl-sim --program hand.json -b 8 -e 64M -f 4
//! ```
//!
//! `--channels C` cuts each algorithm's program by data into `C` parts on
//! channels of their own (`oxccl_algo::channels`, what `OXCCL_NCHANNELS`
//! does in the library); an algorithm whose program cannot be split runs
//! on one channel, and a `#` line says so. `--rails channel` puts channel
//! `c` of every connection between nodes on NIC `c mod N` of both nodes;
//! `--rails sender` puts channel `c` of local rank `i`'s sends on NIC
//! `(c + i) mod N` of both nodes (oxccl's TCP and RDMA rails,
//! `OXCCL_SOCKET_IFNAME=eth0,eth1`); the default,
//! `--rails rank`, puts local rank `i` on NIC `i mod N` (NCCL's
//! rail-optimized layout):
//!
//! ```text
//! oxccl-sim all_reduce --nodes 2 --ranks-per-node 2 --numbering cyclic --algo ring \
//!     --inter 125MB/s,60us --intra 2GB/s,5us --nics-per-node 2 --rails sender --channels 2 -b 1M -e 16M -f 4
//! ```
//!
//! `--plot FILE.png` also draws the sweep's predicted busbw against size,
//! one curve per algorithm (matplotlib, through the same script as
//! `tools/compare-peers --plot`).
//!
//! A program that is not index-aligned runs only at multiples of its
//! count: a size it cannot run at gets a `#` line saying why instead of a
//! row (the exit status stays 0; scripts that skip `#` lines see only the
//! sizes that ran).
//!
//! Sizes are bytes with an optional unit, read as everywhere in oxccl's
//! tools (`oxccl_plan::units`): `KB`, `MB`, `GB`, `TB` are powers of 1000
//! (`8GB` = 8·10⁹), `KiB`, `MiB`, `GiB`, `TiB` powers of 1024 (`8GiB` =
//! 8·2³⁰); a bare `K`, `M`, `G`, `T` (`-e 8G`) keeps nccl-tests' meaning,
//! a power of 1024. Bandwidths likewise (`450GB/s` = 450·10⁹ bytes per
//! second, `50GiB/s`, `100Gb/s` in bits). Time is in microseconds, `algbw
//! = size / time` and `busbw = algbw ·` the collective's bus factor, both
//! in GB/s (10⁹ bytes per second), as nccl-tests has them. Sizes run in parallel on `--threads` threads,
//! biggest programs first, never more at once than fits in memory.

mod plot;
mod program;
mod sweep;

use clap::Parser;
use oxccl_algo::algos::{Algorithm, BuildOptions};
use oxccl_algo::cost::{Link, Rails, Topology, parse_bandwidth};
use oxccl_algo::placement::Placement;
use oxccl_algo::{CollKind, Collective};
use oxccl_core::{DataType, ReduceOp};
use std::path::PathBuf;
use std::process::ExitCode;
use sweep::{Row, Table};

#[derive(Parser, Debug)]
#[command(
    name = "oxccl-sim",
    version,
    about = "Predict collective algorithms' time, algbw and busbw on a modelled cluster (nccl-tests columns)",
    after_help = "Examples:\n  oxccl-sim all_reduce --nodes 128 --ranks-per-node 8 --intra 450GB/s,0.6us --inter 50GB/s,5us -b 8 -e 8G -f 2 --algo ring,tree,rhd\n  oxccl-sim all_reduce --ranks-per-node 4 -b 64 --algo ring --emit > prog.json\n  oxccl-sim --program prog.json --nodes 2 --ranks-per-node 4\n  oxccl-sim --program prog.json -b 8 -e 64M -f 4\n  oxccl-sim all_reduce --nodes 2 --ranks-per-node 2 --numbering cyclic --algo ring --inter 125MB/s,60us --intra 2GB/s,5us --nics-per-node 2 --rails sender --channels 2 -b 1M -e 16M -f 4\n\nSizes: 8GB = 8·10^9 bytes, 8GiB = 8·2^30, and a bare 8G = 8·2^30 as in nccl-tests; bandwidths 450GB/s = 450·10^9 bytes/s, 50GiB/s, 100Gb/s (bits).\n\n--program without -b/-e/-f/-i prices the program at its own count (one row). With any of them it is instantiated at every size (count from the size as nccl-tests does for the program's collective and data type; see oxccl_algo::scale) and verified at each (unless --no-verify). A program that is not index-aligned runs only at multiples of its count: at other sizes a '#' line says why instead of a row, and the exit status stays 0.\n\n--channels C cuts each algorithm's program by data into C parts, each on channels and connections of its own (oxccl_algo::channels, as OXCCL_NCHANNELS does); an algorithm that cannot be split runs on one channel and a '#' line says so.\n\nModel: per-rank intra-node ports, --nics-per-node NICs per node shared by the connections that use them, first-come first-served; every channel has connections of its own. --rails rank: local rank i uses NIC i mod N (rail-optimized, as on DGX nodes); --rails channel: channel c uses NIC c mod N of both nodes; --rails sender: channel c of local rank i's sends uses NIC (c + i) mod N of both nodes (oxccl's TCP and RDMA rails). See oxccl_algo::sim."
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
    /// How ranks are numbered over the nodes: blocked (rank r on node
    /// r / ranks-per-node) or cyclic (node r mod nodes, as `srun
    /// --distribution=cyclic`); algorithms follow the nodes either way.
    #[arg(long, default_value = "blocked", value_parser = ["blocked", "cyclic"])]
    numbering: String,
    /// Link between ranks of one node: BANDWIDTH,LATENCY.
    #[arg(long, default_value = "450GB/s,0.6us", value_parser = parse_link)]
    intra: Link,
    /// Link between nodes: one NIC, shared by the ranks that use it.
    #[arg(long, default_value = "50GB/s,5us", value_parser = parse_link)]
    inter: Link,
    /// NICs per node (8 on DGX H100 nodes): NIC j of every node is on
    /// rail j; --rails says which one a connection takes.
    #[arg(long = "nics-per-node", default_value_t = 1)]
    nics_per_node: usize,
    /// Which NIC a connection between nodes takes: rank (local rank i
    /// uses NIC i mod N on every channel: NCCL's rail-optimized layout),
    /// channel (channel c uses NIC c mod N of both nodes, whatever the
    /// ranks) or sender (channel c of local rank i's sends on NIC
    /// (c + i) mod N of both nodes: oxccl's TCP and RDMA rails).
    #[arg(long, default_value = "rank", value_parser = ["rank", "channel", "sender"])]
    rails: String,
    /// Cut each algorithm's program by data into C parts, each on channels
    /// of its own (oxccl_algo::channels, as OXCCL_NCHANNELS does; 1 to
    /// 16). Where a program cannot be split it runs on one channel and a
    /// '#' line says so.
    #[arg(long, default_value_t = 1)]
    channels: usize,
    /// Smallest size in bytes (8K = 8KiB = 8192, 8KB = 8000) [default: 32M].
    #[arg(short = 'b', long = "minbytes", value_parser = parse_size)]
    minbytes: Option<u64>,
    /// Largest size in bytes (8G = 8GiB = 8·2³⁰, 8GB = 8·10⁹) [default: 32M].
    #[arg(short = 'e', long = "maxbytes", value_parser = parse_size)]
    maxbytes: Option<u64>,
    /// Multiply the size by this much from one row to the next [default: 2].
    #[arg(short = 'f', long = "stepfactor")]
    stepfactor: Option<u64>,
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
    /// Data type (with --program: the program's).
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    dtype: DataType,
    /// Reduction operator (printed only: it does not change the price).
    #[arg(short = 'o', long = "op", default_value = "sum")]
    op: ReduceOp,
    /// Root of rooted collectives.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    root: usize,
    /// Largest pipeline chunk in bytes (2M = 2MiB, 2MB = 2·10⁶) [default: 2M, NCCL's].
    #[arg(long = "chunk", value_parser = parse_size)]
    chunk: Option<u64>,
    /// At most this many pipeline chunks per slice [default: 64].
    #[arg(long = "max-chunks")]
    max_chunks: Option<usize>,
    /// Price this program (JSON, as `Program::to_json` writes it) instead
    /// of generating one per size: at its own count, or instantiated at
    /// every size when -b, -e, -f or -i is given.
    #[arg(long, value_name = "FILE.json")]
    program: Option<PathBuf>,
    /// With --program: price it without proving it correct first (at
    /// each size).
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
    /// Also draw the sweep's predicted busbw against size, one curve per
    /// algorithm (log-log), into this PNG (matplotlib through python3;
    /// Debian's python3-matplotlib is installed when missing).
    #[arg(long, value_name = "FILE.png")]
    plot: Option<PathBuf>,
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

/// Parses a size in bytes: a whole number with an optional unit, `GB` =
/// 10⁹ and `GiB` = 2³⁰ as the planner reads them
/// ([`oxccl_plan::units::parse_bytes`]), or a bare `K`, `M`, `G`, `T`
/// (either case) for a power of 1024, as nccl-tests' `-e 8G`.
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let bare = t.char_indices().last().and_then(|(i, c)| {
        let shift = match c.to_ascii_uppercase() {
            'K' => 10,
            'M' => 20,
            'G' => 30,
            'T' => 40,
            _ => return None,
        };
        Some((&t[..i], shift))
    });
    let bytes = match bare {
        Some((num, shift)) => num.trim().parse::<f64>().ok().map(|n| n * 2f64.powi(shift)),
        None => oxccl_plan::units::parse_bytes(t).ok(),
    }
    .ok_or_else(|| {
        format!(
            "size {s:?} is not a number with an optional unit: K, M, G, T (powers of 1024, as nccl-tests), \
             KiB … TiB (powers of 1024) or KB … TB (powers of 1000), e.g. 8, 128K, 8GiB, 8GB"
        )
    })?;
    if bytes < 0.0 || bytes.fract() != 0.0 {
        return Err(format!("size {s:?} is not a whole number of bytes, at least 0"));
    }
    if bytes >= 2f64.powi(64) {
        return Err(format!("size {s:?} is too large"));
    }
    Ok(bytes as u64)
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
    if args.channels == 0 || args.channels > oxccl_algo::channels::MAX {
        return Err(format!("--channels must be 1 to {}, got {}", oxccl_algo::channels::MAX, args.channels));
    }
    if args.program.is_some() && args.channels > 1 {
        return Err("--channels splits the built-in algorithms; a --program file keeps its own channels".into());
    }
    if args.plot.is_some() && (args.emit || (args.program.is_some() && !args.sweeps())) {
        return Err("--plot draws a sweep: give -b/-e/-f (with --program), and not --emit".into());
    }
    match &args.program {
        Some(path) => program::run(args, path),
        None => run_sweep(args, &opts),
    }
}

fn topology(args: &Args, nodes: usize, rpn: usize) -> Result<Topology, String> {
    let rails = match args.rails.as_str() {
        "channel" => Rails::ByChannel,
        "sender" => Rails::BySender,
        _ => Rails::ByRank,
    };
    let mut topo = Topology::new(nodes, rpn, args.intra, args.inter).with_nics(args.nics_per_node).with_rails(rails);
    if let Some(bw) = args.reduce_bw {
        topo = topo.with_reduce_bw(bw);
    }
    if let Some(bw) = args.copy_bw {
        topo = topo.with_copy_bw(bw);
    }
    topo.validate().map_err(|e| plain(&e))?;
    Ok(topo)
}

impl Args {
    /// The sizes of the sweep, with nccl-tests' defaults (32M, 32M, ×2).
    fn sizes(&self) -> Result<Vec<u64>, String> {
        sweep::sizes(
            self.minbytes.unwrap_or(32 << 20),
            self.maxbytes.unwrap_or(32 << 20),
            self.stepfactor.unwrap_or(2),
            self.stepbytes,
        )
    }

    /// The topology's ranks, numbered as `--numbering` says.
    fn placement(&self, topo: &Topology) -> Placement {
        match self.numbering.as_str() {
            "cyclic" => Placement::cyclic(topo.nodes, topo.ranks_per_node),
            _ => Placement::blocked(topo.nodes, topo.ranks_per_node),
        }
    }

    /// `program` with its ranks renamed as the topology numbers them
    /// (blocked), for the simulator: itself where `--numbering` is blocked.
    fn placed<'p>(
        &self,
        topo: &Topology,
        program: &'p oxccl_algo::Program,
    ) -> std::borrow::Cow<'p, oxccl_algo::Program> {
        match self.numbering.as_str() {
            "cyclic" => std::borrow::Cow::Owned(program.relabeled(&self.placement(topo).blocked_number())),
            _ => std::borrow::Cow::Borrowed(program),
        }
    }

    /// Whether the command line sets any of the sweep's sizes.
    fn sweeps(&self) -> bool {
        self.minbytes.is_some() || self.maxbytes.is_some() || self.stepfactor.is_some() || self.stepbytes.is_some()
    }
}

/// The count nccl-tests runs for a `size`-byte collective of `kind` on `n`
/// ranks: `size` is a rank's whole buffer, `n` blocks of `count` for the
/// collectives whose count is per block.
fn count_of(kind: CollKind, n: usize, dtype: DataType, size: u64) -> usize {
    let per = match kind {
        CollKind::ReduceScatter | CollKind::AllGather | CollKind::AllToAll | CollKind::Gather | CollKind::Scatter => {
            n * dtype.size()
        }
        _ => dtype.size(),
    };
    usize::try_from(size).unwrap_or(usize::MAX) / per.max(1)
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
    let sizes = args.sizes()?;
    let root = if kind.is_rooted() { args.root } else { 0 };
    let colls: Vec<Collective> = sizes
        .iter()
        .map(|&size| {
            let count = count_of(kind, n, args.dtype, size);
            let c = Collective { kind, nranks: n, count, root, dtype: args.dtype };
            c.validate().map(|()| c).map_err(|e| plain(&e))
        })
        .collect::<Result<_, _>>()?;
    let placement = args.placement(&topo);
    if args.emit {
        let [algo] = algos[..] else {
            return Err(format!("--emit prints one program: name one algorithm with --algo, not {}", algos.len()));
        };
        let (p, _) = sweep::build(algo, &colls[0], opts, &placement, args.channels).map_err(|e| plain(&e))?;
        println!("{}", p.to_json());
        return Ok(());
    }
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |t| t.get())).max(1);
    let results = sweep::run(&colls, &algos, opts, &topo, &placement, args.channels, threads, args.verbose)?;
    let mut table = Table::new(kind, args.op, algos.iter().map(|a| a.name().to_string()).collect());
    println!("# oxccl-sim: {kind}, {n} ranks on {topo}, numbered {}", args.numbering);
    println!(
        "# pipeline chunk {} bytes, at most {} chunks; times are predicted by oxccl_algo::sim",
        opts.chunk_bytes, opts.max_chunks
    );
    if args.channels > 1 {
        println!("# each program cut into {} channels (oxccl_algo::channels)", args.channels);
        for (a, algo) in algos.iter().enumerate() {
            let single: Vec<&String> = results.iter().filter_map(|r| r[a].2.as_ref()).collect();
            if let Some(why) = single.first() {
                let at = match single.len() == colls.len() {
                    true => "every size".to_string(),
                    false => format!("{} of {} sizes", single.len(), colls.len()),
                };
                println!("# {algo}: one channel at {at}, it cannot be split: {why}");
            }
        }
    }
    println!("#");
    table.print_header();
    let bounds: Vec<Vec<oxccl_algo::sim::Bound>> = results.iter().map(|r| r.iter().map(|x| x.1).collect()).collect();
    let rows: Vec<Row> =
        colls.iter().zip(&results).map(|(c, r)| Row { coll: *c, times: r.iter().map(|x| x.0).collect() }).collect();
    for row in &rows {
        table.print_row(row);
    }
    table.print_footer();
    if let (Some(last), Some(c)) = (bounds.last(), colls.last()) {
        let each: Vec<String> = algos.iter().zip(last).map(|(a, b)| format!("{a}: {b}")).collect();
        println!("# bound at {} bytes: {}", c.size_bytes(), each.join("; "));
    }
    if let Some(out) = &args.plot {
        let names: Vec<String> = algos.iter().map(|a| a.name().to_string()).collect();
        let title = format!("{kind}, {n} ranks: predicted busbw\n{topo}");
        plot::draw(&plot::spec(kind, &names, &rows, &title, &caption()), out)?;
        eprintln!("oxccl-sim: wrote {}", out.display());
    }
    Ok(())
}

/// The command line, for a plot's caption.
fn caption() -> String {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    format!("oxccl-sim {}", argv.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_like_nccl_tests() {
        assert_eq!(parse_size("8").unwrap(), 8);
        assert_eq!(parse_size("128K").unwrap(), 128 << 10);
        assert_eq!(parse_size("8G").unwrap(), 8 << 30);
        assert_eq!(parse_size("1k").unwrap(), 1024);
        assert!(parse_size("eight").unwrap_err().contains("not a number"));
        assert!(parse_size("99999999999T").unwrap_err().contains("too large"));
    }

    #[test]
    fn gigabytes_are_decimal_and_gibibytes_binary() {
        // The planner's convention: GB = 10⁹, GiB = 2³⁰ (nccl-tests'
        // bare G stays 2³⁰).
        assert_eq!(parse_size("32MB").unwrap(), 32_000_000);
        assert_eq!(parse_size("32MiB").unwrap(), 32 << 20);
        assert_eq!(parse_size("8GB").unwrap(), 8_000_000_000);
        assert_eq!(parse_size("8 GiB").unwrap(), 8 << 30);
        assert_eq!(parse_size("1.5KB").unwrap(), 1500);
        assert_eq!(parse_size("1.5K").unwrap(), 1536);
        assert_eq!(parse_size("2TB").unwrap(), 2_000_000_000_000);
        assert_eq!(parse_size("64B").unwrap(), 64);
        assert!(parse_size("1.5").unwrap_err().contains("whole number"));
        assert!(parse_size("-8K").unwrap_err().contains("at least 0"));
        assert!(parse_size("8XB").unwrap_err().contains("KB … TB"));
    }

    #[test]
    fn counts_follow_nccl_tests() {
        // A rank's whole buffer: n blocks for the per-block collectives.
        assert_eq!(count_of(CollKind::AllReduce, 8, DataType::Float32, 1024), 256);
        assert_eq!(count_of(CollKind::AllGather, 8, DataType::Float32, 1024), 32);
        assert_eq!(count_of(CollKind::AllToAll, 4, DataType::Float64, 1024), 32);
        assert_eq!(count_of(CollKind::Broadcast, 4, DataType::Float16, 10), 5);
        assert_eq!(count_of(CollKind::Scatter, 3, DataType::Float32, 100), 8);
    }
}
