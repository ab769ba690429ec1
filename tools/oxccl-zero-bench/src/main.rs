//! `oxccl-zero-bench`: see the crate documentation.

use clap::Parser;
use oxccl::{Communicator, Config, Launch, UniqueId, with_launch_secret};
use oxccl_zero::Stage;
use oxccl_zero_bench::data::{CORPUS, Corpus};
use oxccl_zero_bench::{ModelConfig, Options, Res, run, table};

/// Trains a small GPT-style model under DDP and ZeRO-1/2/3 and reports
/// bytes moved, memory held and equality per stage. Ranks are threads
/// (`-t N`) or processes started by a launcher (oxccl-run, mpirun,
/// torchrun: their variables are read when `-t` is absent).
#[derive(Parser, Debug)]
#[command(name = "oxccl-zero-bench", version)]
struct Args {
    /// Ranks as threads of this process.
    #[arg(short = 't', long)]
    threads: Option<usize>,
    /// Optimizer steps per stage.
    #[arg(long, default_value_t = 10)]
    steps: u64,
    /// Stages to run, comma-separated (ddp first to compare against it).
    #[arg(long, default_value = "ddp,zero1,zero2,zero3")]
    stages: String,
    /// Sequences per rank per step.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Model width.
    #[arg(long, default_value_t = 128)]
    dim: usize,
    /// Transformer blocks.
    #[arg(long, default_value_t = 6)]
    blocks: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 4)]
    heads: usize,
    /// Context length.
    #[arg(long, default_value_t = 32)]
    ctx: usize,
    /// Learning rate.
    #[arg(long, default_value_t = 3e-3)]
    lr: f32,
    /// Seed of the weights and the data order.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Parameter and gradient type: f32 or bf16.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Collective algorithm (OXCCL_ALGO's grammar); ring makes the byte
    /// counts the textbook ones.
    #[arg(long, default_value = "ring")]
    algo: String,
    /// Also write the report as JSON here.
    #[arg(long)]
    json: Option<String>,
}

fn options(a: &Args) -> Res<Options> {
    let stages = a
        .stages
        .split(',')
        .map(str::parse::<Stage>)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("--stages: {e}"))?;
    let bf16 = match a.dtype.as_str() {
        "f32" => false,
        "bf16" => true,
        d => return Err(format!("--dtype {d:?}: use f32 or bf16").into()),
    };
    for (name, v) in [("--steps", a.steps as usize), ("--batch", a.batch), ("--dim", a.dim), ("--blocks", a.blocks)] {
        if v == 0 {
            return Err(format!("{name} must be at least 1").into());
        }
    }
    if a.heads == 0 || !a.dim.is_multiple_of(a.heads) {
        return Err(format!("--heads {} must divide --dim {}", a.heads, a.dim).into());
    }
    let vocab = Corpus::new(CORPUS).vocab.len();
    let model = ModelConfig { vocab, dim: a.dim, blocks: a.blocks, heads: a.heads, ctx: a.ctx };
    Ok(Options { steps: a.steps, batch: a.batch, model, lr: a.lr, seed: a.seed, bf16, stages })
}

fn main() {
    let a = Args::parse();
    if let Err(e) = main_(&a) {
        eprintln!("oxccl-zero-bench: {e}");
        std::process::exit(2);
    }
}

fn main_(a: &Args) -> Res<()> {
    let o = options(a)?;
    let cfg = Config { algo: Some(a.algo.clone()), ..Config::default() };
    let report = match a.threads {
        Some(n) => {
            let comms = Communicator::init_threads_with(n, cfg)?;
            let reports: Vec<Res<serde_json::Value>> = std::thread::scope(|s| {
                let hs: Vec<_> = comms.iter().map(|c| s.spawn(|| run(c, &o))).collect();
                hs.into_iter().map(|h| h.join().expect("a rank panicked")).collect()
            });
            reports.into_iter().next().expect("one rank at least")?
        }
        None => {
            let env = Launch::from_vars(|k| std::env::var(k).ok())?;
            let id = with_launch_secret(UniqueId::for_env(env.addr, &env.job), |k| std::env::var(k).ok())?;
            let c = Communicator::init(&id, env.size, env.rank, cfg)?;
            let r = run(&c, &o)?;
            if c.rank() != 0 {
                return Ok(());
            }
            r
        }
    };
    print!("{}", table::render(&report));
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")
            .map_err(|e| format!("--json {path}: cannot write it: {e}"))?;
    }
    Ok(())
}
