//! `oxccl-zero-bench`: trains a small GPT-style character model (candle on
//! the CPU, forward and backward one layer at a time) under DDP and
//! ZeRO-1/2/3 of [`oxccl_zero`] and reports, per stage, the bytes each rank
//! moved per step as `Communicator::stats()` counted them, the model-state
//! memory the optimizer held next to the ZeRO paper's formula, the loss
//! curve, and how far the parameters are from DDP's.
//!
//! # Quick start
//!
//! ```text
//! cargo run --release -p oxccl-zero-bench -- -t 4 --steps 10
//! oxccl-run -n 4 target/release/oxccl-zero-bench --steps 10 --json zero.json
//! ```

pub mod bench;
pub mod data;
pub mod model;
pub mod table;

pub use bench::{Options, run};
pub use model::{ModelConfig, Res};
