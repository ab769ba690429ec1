//! `oxccl-plan`: the command line of the training memory/communication
//! planner (package `oxccl-plan-cli`; the formulas and answers are the
//! `oxccl-plan` crate's, `crates/oxccl-plan`, which has no command line).
//! Only argument parsing and printing live here.
//!
//! Every subcommand prints a table, or with `--json` one JSON object;
//! `--explain` adds the formulas used. Bad input is an error on stderr
//! naming the flag and value, exit status 2, nothing on stdout.

mod render;
mod table;

use clap::{Args, Parser, Subcommand, ValueEnum};
use oxccl_algo::algos::BuildOptions;
use oxccl_algo::cost::{Link, parse_bandwidth, parse_latency};
use oxccl_plan::comm::DEFAULT_LATENCY_S;
use oxccl_plan::memory::{Model, Reserve, Stage, StateBytes};
use oxccl_plan::units::{parse_bytes, parse_bytes_per_param, parse_count};
use oxccl_plan::variants::{Precision, Variant};
use std::process::ExitCode;

const AFTER_HELP: &str = "Examples:
  oxccl-plan memory --params 7.5e9 --dp 64
  oxccl-plan memory --params 70B --gpus 512 --tp 8 --pp 4 --gpu-mem 80GB --explain
  oxccl-plan memory --params 7.5B --dp 64 --variant megatron --precision bf16
  oxccl-plan memory --params 70e9 --dp 16 --stage 3 --gpu-mem 80GB
  oxccl-plan min-gpus --params 70e9 --gpu-mem 80GB --stage 3 --json
  oxccl-plan min-gpus --params 70e9 --gpu-mem 80GB --reserve 20GB
  oxccl-plan comm --bytes 1e9 --ranks 16 --bandwidth 25GB/s --latency 5us
  oxccl-plan bubble --stages 8 --microbatches 16

Counts take 7.5e9, 7.5B, 175M, 1T; sizes take GB (10^9 bytes) or GiB (2^30),
and print as both; a bare G is refused as ambiguous.
--gpu-mem keeps a reserve free for activations, workspace, fragmentation and
the CUDA context: 10% of the GPU unless --reserve says otherwise (a size or a
percentage; --reserve 0 for the bare formulas).
--latency is 5us unless given (oxccl-sim's inter-node link); the output says
when it was assumed.
--explain prints the formulas; --json prints one JSON object.";

#[derive(Parser, Debug)]
#[command(
    name = "oxccl-plan",
    version,
    about = "Plan training memory and communication: ZeRO stage memory per GPU, the fewest GPUs, ring collective times, pipeline bubbles",
    after_help = AFTER_HELP
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Print one JSON object instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// Also print the formulas used (with --json: an "explain" array).
    #[arg(long, global = true)]
    explain: bool,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Model-state bytes per GPU under DDP and ZeRO-1/2/3, and each
    /// stage's communication per training step.
    Memory(MemoryArgs),
    /// The fewest GPUs of a given memory that hold the model, per stage,
    /// or why no number does.
    MinGpus(MinGpusArgs),
    /// Ring all-reduce, reduce-scatter and all-gather times: closed form
    /// next to oxccl-algo's simulation.
    Comm(CommArgs),
    /// The pipeline bubble fraction.
    Bubble(BubbleArgs),
}

/// The model and how it is split.
#[derive(Args, Debug)]
struct ModelArgs {
    /// Parameters Ψ of the whole model (7.5e9, 7.5B, 175M, 1T).
    #[arg(long, allow_hyphen_values = true, value_parser = parse_count)]
    params: u64,
    /// Tensor-parallel degree: divides the parameters.
    #[arg(long, allow_hyphen_values = true, default_value = "1", value_parser = parse_count)]
    tp: u64,
    /// Pipeline-parallel degree: divides the parameters.
    #[arg(long, allow_hyphen_values = true, default_value = "1", value_parser = parse_count)]
    pp: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum VariantName {
    /// The ZeRO paper's formulas, bytes per state configurable.
    Zero,
    /// DeepSpeed's estimators (ZeRO-2 and ZeRO-3, v0.14.3 on).
    Deepspeed,
    /// DeepSpeed's ZeRO-2 estimator before v0.14.3.
    DeepspeedLegacy,
    /// Megatron-LM's distributed-optimizer table (DDP and ZeRO-1).
    Megatron,
}

/// Whose formulas, and bytes per parameter for the `zero` variant.
#[derive(Args, Debug)]
struct VariantArgs {
    /// Whose formulas to use.
    #[arg(long, value_enum, default_value = "zero")]
    variant: VariantName,
    /// Bytes per parameter of the working weights P [default: 2, bf16].
    #[arg(long = "param-bytes", allow_hyphen_values = true, value_parser = parse_bytes_per_param)]
    param_bytes: Option<f64>,
    /// Bytes per parameter of the gradients G [default: 2, bf16].
    #[arg(long = "grad-bytes", allow_hyphen_values = true, value_parser = parse_bytes_per_param)]
    grad_bytes: Option<f64>,
    /// Bytes per parameter of the fp32 master weights [default: 4].
    #[arg(long = "master-bytes", allow_hyphen_values = true, value_parser = parse_bytes_per_param)]
    master_bytes: Option<f64>,
    /// Bytes per parameter of each of Adam's two moments [default: 4].
    #[arg(long = "moment-bytes", allow_hyphen_values = true, value_parser = parse_bytes_per_param)]
    moment_bytes: Option<f64>,
    /// All optimizer-state bytes per parameter O (the paper's K), instead
    /// of --master-bytes + 2 × --moment-bytes [default: 12].
    #[arg(
        long = "optimizer-bytes",
        allow_hyphen_values = true,
        value_parser = parse_bytes_per_param,
        conflicts_with_all = ["master_bytes", "moment_bytes"]
    )]
    optimizer_bytes: Option<f64>,
    /// DeepSpeed variants: parameters of the largest layer (ZeRO-3's 4·L).
    #[arg(long = "largest-layer", allow_hyphen_values = true, value_parser = parse_count)]
    largest_layer: Option<u64>,
    /// Megatron variant: the table's row (fp16: fp16 params and grads;
    /// bf16: bf16 params, fp32 grads; fp32).
    #[arg(long, allow_hyphen_values = true, value_parser = parse_precision)]
    precision: Option<Precision>,
}

#[derive(Args, Debug)]
#[command(group = clap::ArgGroup::new("ranks").required(true).args(["dp", "gpus"]))]
struct MemoryArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Data-parallel ranks N.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_count)]
    dp: Option<u64>,
    /// All GPUs instead of --dp: N = gpus/(tp·pp).
    #[arg(long, allow_hyphen_values = true, value_parser = parse_count)]
    gpus: Option<u64>,
    /// One stage: 0 (ddp), 1, 2 or 3 [default: all four].
    #[arg(long, allow_hyphen_values = true, value_parser = parse_stage)]
    stage: Option<Stage>,
    #[command(flatten)]
    variant: VariantArgs,
    /// GPU memory, to say which stages fit (80GB = 80·10⁹, 80GiB = 80·2³⁰).
    #[arg(long = "gpu-mem", allow_hyphen_values = true, value_parser = parse_bytes)]
    gpu_mem: Option<f64>,
    /// Kept free on each GPU for activations, workspace, fragmentation and
    /// the CUDA context: a size (8GB) or a share of --gpu-mem (10%)
    /// [default: 10%; 0 for none].
    #[arg(long, allow_hyphen_values = true, value_parser = parse_reserve, requires = "gpu_mem")]
    reserve: Option<Reserve>,
    /// Data-parallel link bandwidth, to time each step's collectives (25GB/s, 200Gb/s).
    #[arg(long, allow_hyphen_values = true, value_parser = parse_bw)]
    bandwidth: Option<f64>,
    /// Data-parallel link latency (5us, 500ns) [default: 5us, oxccl-sim's inter-node link].
    #[arg(long, allow_hyphen_values = true, value_parser = parse_lat, requires = "bandwidth")]
    latency: Option<f64>,
    /// Reduction throughput: adds γ = 1/reduce-bw per reduced byte [default: free].
    #[arg(long = "reduce-bw", allow_hyphen_values = true, value_parser = parse_bw, requires = "bandwidth")]
    reduce_bw: Option<f64>,
}

#[derive(Args, Debug)]
struct MinGpusArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Memory of one GPU (80GB = 80·10⁹ bytes, 80GiB = 80·2³⁰).
    #[arg(long = "gpu-mem", allow_hyphen_values = true, value_parser = parse_bytes)]
    gpu_mem: f64,
    /// Kept free on each GPU for activations, workspace, fragmentation and
    /// the CUDA context: a size (8GB) or a share of --gpu-mem (10%)
    /// [default: 10%; 0 for none].
    #[arg(long, allow_hyphen_values = true, value_parser = parse_reserve)]
    reserve: Option<Reserve>,
    /// One stage: 0 (ddp), 1, 2 or 3 [default: all four].
    #[arg(long, allow_hyphen_values = true, value_parser = parse_stage)]
    stage: Option<Stage>,
    #[command(flatten)]
    variant: VariantArgs,
}

#[derive(Args, Debug)]
struct CommArgs {
    /// S: the collective's whole buffer in bytes (1e9, 1GB, 256MiB).
    #[arg(long, allow_hyphen_values = true, value_parser = parse_bytes)]
    bytes: f64,
    /// N: ranks in the ring.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_count)]
    ranks: u64,
    /// β: link bandwidth per rank and direction (25GB/s, 200Gb/s, 50GiB/s).
    #[arg(long, allow_hyphen_values = true, value_parser = parse_bw)]
    bandwidth: f64,
    /// α: link latency per message (5us, 500ns, 0) [default: 5us,
    /// oxccl-sim's inter-node link; the output says it was assumed].
    #[arg(long, allow_hyphen_values = true, value_parser = parse_lat)]
    latency: Option<f64>,
    /// Reduction throughput: adds γ = 1/reduce-bw per reduced byte to
    /// all-reduce and reduce-scatter [default: off, the textbook form].
    #[arg(long = "reduce-bw", allow_hyphen_values = true, value_parser = parse_bw)]
    reduce_bw: Option<f64>,
    /// Skip the simulation.
    #[arg(long = "no-sim")]
    no_sim: bool,
    /// Simulation: largest pipeline chunk, as oxccl-sim's --chunk [default: 2MiB].
    #[arg(long, allow_hyphen_values = true, value_parser = parse_bytes)]
    chunk: Option<f64>,
    /// Simulation: at most this many chunks per block [default: 64].
    #[arg(long = "max-chunks", allow_hyphen_values = true, value_parser = parse_count)]
    max_chunks: Option<u64>,
}

#[derive(Args, Debug)]
struct BubbleArgs {
    /// p: pipeline stages.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_count)]
    stages: u64,
    /// m: micro-batches per step.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_count)]
    microbatches: u64,
    /// v: model chunks per stage (Megatron's interleaved schedule).
    #[arg(long, allow_hyphen_values = true, default_value = "1", value_parser = parse_count)]
    interleave: u64,
}

fn parse_bw(s: &str) -> Result<f64, String> {
    parse_bandwidth(s).map_err(|e| plain(&e))
}

fn parse_lat(s: &str) -> Result<f64, String> {
    parse_latency(s).map_err(|e| plain(&e))
}

fn parse_stage(s: &str) -> Result<Stage, String> {
    s.parse()
}

fn parse_precision(s: &str) -> Result<Precision, String> {
    s.parse()
}

fn parse_reserve(s: &str) -> Result<Reserve, String> {
    s.parse()
}

fn plain(e: &oxccl_core::Error) -> String {
    match e {
        oxccl_core::Error::InvalidArgument(m) => m.clone(),
        other => other.to_string(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("oxccl-plan: error: {e}");
            ExitCode::from(2)
        }
    }
}

/// The whole output, or an error naming the flag; nothing is printed
/// before everything is computed.
fn run(cli: &Cli) -> Result<String, String> {
    let out = render::Out { json: cli.json, explain: cli.explain };
    match &cli.command {
        Command::Memory(a) => {
            let model = a.model.checked()?;
            let dp = match (a.dp, a.gpus) {
                (Some(dp), _) => dp,
                (None, Some(g)) => {
                    let mp = model.model_parallel();
                    if g % mp != 0 {
                        return Err(format!(
                            "--gpus {g} is not a multiple of tp·pp = {mp} (--tp {} × --pp {})",
                            model.tp, model.pp
                        ));
                    }
                    g / mp
                }
                (None, None) => return Err("give --dp N or --gpus N".into()),
            };
            dp.checked_mul(model.model_parallel())
                .ok_or_else(|| format!("--dp {dp} × tp·pp {} is too many GPUs", model.model_parallel()))?;
            let variant = a.variant.variant()?;
            let reserve = a.gpu_mem.map(|m| check_mem(m, a.reserve)).transpose()?;
            let link = a.bandwidth.map(|bw| link(bw, a.latency));
            let timed = link.map(|l| (l.link, gamma(a.reduce_bw)));
            let plan =
                oxccl_plan::plan::memory(&model, dp, &variant, a.gpu_mem, reserve.map_or(0.0, |r| r.bytes), timed);
            Ok(render::memory(&plan, &render::Given { stage: a.stage, reserve, link }, out))
        }
        Command::MinGpus(a) => {
            let model = a.model.checked()?;
            let reserve = check_mem(a.gpu_mem, a.reserve)?;
            let variant = a.variant.variant()?;
            let stages = a.stage.map_or(Stage::ALL.to_vec(), |s| vec![s]);
            let plan = oxccl_plan::plan::min_gpus_plan(&stages, &variant, &model, a.gpu_mem, reserve.bytes);
            let given = render::Given { stage: a.stage, reserve: Some(reserve), link: None };
            Ok(render::min_gpus(&plan, &given, out))
        }
        Command::Comm(a) => {
            if a.bytes < 1.0 || a.bytes.fract() != 0.0 {
                return Err(format!("--bytes {} must be a whole number of bytes, at least 1", a.bytes));
            }
            let ranks = usize::try_from(a.ranks).map_err(|_| format!("--ranks {} is too many", a.ranks))?;
            let link = link(a.bandwidth, a.latency);
            let mut opts = BuildOptions::default();
            if let Some(c) = a.chunk {
                if c < 1.0 {
                    return Err(format!("--chunk {c} must be at least 1 byte"));
                }
                opts.chunk_bytes = c as usize;
            }
            if let Some(k) = a.max_chunks {
                opts.max_chunks = usize::try_from(k).unwrap_or(usize::MAX);
            }
            let plan = oxccl_plan::comm::plan(ranks, a.bytes as u64, link.link, a.reduce_bw, &opts, !a.no_sim);
            Ok(render::comm(&plan, &link, &opts, out))
        }
        Command::Bubble(a) => {
            let b = oxccl_plan::pipeline::bubble(a.stages, a.microbatches, a.interleave);
            Ok(render::bubble(&b, out))
        }
    }
}

/// `γ` for a reduction throughput, 0 when none is given.
fn gamma(reduce_bw: Option<f64>) -> f64 {
    reduce_bw.map_or(0.0, |bw| 1.0 / bw)
}

/// A link of `bandwidth` and `--latency`, or the default latency,
/// remembering which.
fn link(bandwidth: f64, latency: Option<f64>) -> render::LinkUsed {
    render::LinkUsed {
        link: Link::new(bandwidth, latency.unwrap_or(DEFAULT_LATENCY_S)),
        latency_assumed: latency.is_none(),
    }
}

/// The reserve for a GPU of `gpu_mem` bytes: `--reserve`, or the default;
/// an error when it leaves nothing for model states.
fn check_mem(gpu_mem: f64, reserve: Option<Reserve>) -> Result<render::ReserveUsed, String> {
    if gpu_mem <= 0.0 {
        return Err(format!("--gpu-mem {gpu_mem} must be more than 0 bytes"));
    }
    let rule = reserve.unwrap_or(Reserve::DEFAULT);
    let bytes = rule.bytes(gpu_mem);
    if bytes >= gpu_mem {
        return Err(format!(
            "--reserve {} leaves nothing of --gpu-mem {} for model states",
            oxccl_plan::units::format_gb_gib(bytes),
            oxccl_plan::units::format_gb_gib(gpu_mem)
        ));
    }
    Ok(render::ReserveUsed { rule, bytes, gpu_mem, assumed: reserve.is_none() })
}

impl ModelArgs {
    fn checked(&self) -> Result<Model, String> {
        let m = Model { params: self.params, tp: self.tp, pp: self.pp };
        if self.tp.checked_mul(self.pp).is_none() {
            return Err(format!("--tp {} × --pp {} overflows", self.tp, self.pp));
        }
        if m.model_parallel() > m.params {
            return Err(format!(
                "--tp {} × --pp {} = {} splits {} parameters (--params) into less than one each",
                self.tp,
                self.pp,
                m.model_parallel(),
                self.params
            ));
        }
        Ok(m)
    }
}

impl VariantArgs {
    /// The variant, refusing flags that do not apply to it.
    fn variant(&self) -> Result<Variant, String> {
        let v = self.variant;
        let name = v.to_possible_value().map(|p| p.get_name().to_string()).unwrap_or_default();
        let zero_flags = [
            ("--param-bytes", self.param_bytes),
            ("--grad-bytes", self.grad_bytes),
            ("--master-bytes", self.master_bytes),
            ("--moment-bytes", self.moment_bytes),
            ("--optimizer-bytes", self.optimizer_bytes),
        ];
        if v != VariantName::Zero
            && let Some((flag, _)) = zero_flags.iter().find(|(_, x)| x.is_some())
        {
            return Err(format!(
                "{flag} applies to --variant zero; --variant {name} fixes its bytes per parameter (see --explain)"
            ));
        }
        if self.largest_layer.is_some() && !matches!(v, VariantName::Deepspeed | VariantName::DeepspeedLegacy) {
            return Err(format!("--largest-layer applies to --variant deepspeed and deepspeed-legacy, not {name}"));
        }
        if self.precision.is_some() && v != VariantName::Megatron {
            return Err(format!("--precision applies to --variant megatron, not {name}"));
        }
        let largest_layer = self.largest_layer.unwrap_or(0) as f64;
        Ok(match v {
            VariantName::Zero => {
                let d = StateBytes::default();
                let (p, g) = (self.param_bytes.unwrap_or(d.param), self.grad_bytes.unwrap_or(d.grad));
                let b = match self.optimizer_bytes {
                    Some(o) => StateBytes { param: p, grad: g, optimizer: o },
                    None => StateBytes::adam(p, g, self.master_bytes.unwrap_or(4.0), self.moment_bytes.unwrap_or(4.0)),
                };
                if b.total() <= 0.0 {
                    return Err("--param-bytes, --grad-bytes and the optimizer bytes add up to 0".into());
                }
                Variant::Zero(b)
            }
            VariantName::Deepspeed => Variant::Deepspeed { largest_layer },
            VariantName::DeepspeedLegacy => Variant::DeepspeedLegacy { largest_layer },
            VariantName::Megatron => Variant::Megatron { precision: self.precision.unwrap_or(Precision::Bf16) },
        })
    }
}
