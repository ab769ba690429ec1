//! # oxccl-plan
//!
//! The training memory/communication planner: how much memory the model
//! states of a data-parallel run take per GPU under DDP and ZeRO-1/2/3,
//! the fewest GPUs that hold a model (or why no number does), what the
//! ring collectives of a step cost, and how much of a step a pipeline
//! sits idle, as plain, serializable data. This crate is the library
//! (package `oxccl-plan`, no command-line parsing); the `oxccl-plan`
//! command that prints its answers is `tools/oxccl-plan` (package
//! `oxccl-plan-cli`), and `oxccl-zero` takes its memory formulas from
//! [`memory`], so that what the optimizer measures and what the planner
//! predicts come from one formula.
//!
//! ## Quick start
//!
//! The command (`cargo build --release -p oxccl-plan-cli`, then
//! `target/release/oxccl-plan`):
//!
//! ```text
//! oxccl-plan memory --params 7.5e9 --dp 64              # the ZeRO paper's Figure 1 row
//! oxccl-plan memory --params 70B --gpus 512 --tp 8 --pp 4 --gpu-mem 80GB
//! oxccl-plan min-gpus --params 70e9 --gpu-mem 80GB --stage 3 --json   # 10% kept free
//! oxccl-plan min-gpus --params 70e9 --gpu-mem 80GB --reserve 20GB
//! oxccl-plan memory --params 70e9 --dp 16 --stage 3 --gpu-mem 80GB
//! oxccl-plan comm --bytes 1e9 --ranks 16 --bandwidth 25GB/s --latency 5us
//! oxccl-plan bubble --stages 8 --microbatches 16
//! ```
//!
//! Every subcommand prints a table (notes on `#` lines), or one JSON
//! object with `--json`; `--explain` adds the formulas used (in JSON, an
//! `"explain"` array). Counts take `7.5e9`, `7.5B`, `175M`, `1T`; byte
//! sizes take `GB` (10⁹) or `GiB` (2³⁰) and the planner prints both,
//! each under its own name ([`units`]; oxccl-sim reads them the same
//! way). Bad input (zero ranks, a negative size, nonsense, `--gpus`
//! not a multiple of `tp·pp` …) is an error on stderr naming the flag and
//! value, exit status 2, nothing on stdout.
//!
//! The library:
//!
//! ```
//! use oxccl_plan::memory::{Model, Stage};
//! use oxccl_plan::{plan, variants::Variant};
//! let p = plan::memory(&Model::new(7_500_000_000), 64, &Variant::default(), None, 0.0, None);
//! assert_eq!(p.stages.get(Stage::Ddp).gb, Some(120.0));       // 16Ψ
//! assert_eq!(p.stages.get(Stage::Zero3).gb, Some(1.875));     // 16Ψ/N
//! ```
//!
//! ## What it computes
//!
//! - [`memory`]: bytes per GPU `a·Ψ' + b·Ψ'/N + c` for each stage, with
//!   `Ψ' = Ψ/(tp·pp)`; by default the ZeRO paper's `(P+G+O)Ψ`,
//!   `(P+G)Ψ + OΨ/N`, `PΨ + (G+O)Ψ/N`, `(P+G+O)Ψ/N` with `P = G = 2`,
//!   `O = 12` (`--param-bytes`, `--grad-bytes`, `--master-bytes`,
//!   `--moment-bytes` ×2, or `--optimizer-bytes` for all of `O`); the
//!   fewest GPUs (`dp·tp·pp`) of a given memory, less a reserve kept
//!   free for activations, workspace, fragmentation and the CUDA context
//!   ([`memory::Reserve`]: 10% of the GPU unless `--reserve` says
//!   otherwise), and why DDP/ZeRO-1/ZeRO-2 may fit on no count: their
//!   `a·Ψ'` does not shrink with `N`.
//! - [`variants`]: the formulas of DeepSpeed's estimators and Megatron-LM's
//!   distributed-optimizer table (`--variant deepspeed`,
//!   `deepspeed-legacy`, `megatron`), sources cited there.
//! - [`comm`]: ring all-reduce / reduce-scatter / all-gather closed forms
//!   (`oxccl_algo::cost`) next to the simulator's time of the same ring
//!   programs (`oxccl_algo::sim`), over a link of bandwidth `β` and
//!   latency `α` (5 µs unless given: [`comm::DEFAULT_LATENCY_S`]), and the
//!   collectives of a training step per stage (`2Ψ`, `2Ψ`, `2Ψ`, `3Ψ`
//!   elements).
//! - [`pipeline`]: the bubble `(p−1)/(m+p−1)`.
//! - [`plan`]: the answers as plain, serializable data.
//!
//! ## Thread safety and resources
//!
//! Pure functions of their arguments: no I/O, no global state, no
//! `unsafe`; everything is `Send + Sync`. [`comm::simulate`] allocates
//! the ring programs (bounded by [`comm::MAX_STEPS`] steps).

#![forbid(unsafe_code)]

pub mod comm;
pub mod memory;
pub mod pipeline;
pub mod plan;
pub mod units;
pub mod variants;
