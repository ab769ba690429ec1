//! The stages and the memory each keeps per rank.

use oxccl::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fmt;

/// How much of the model state is sharded over the data-parallel ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// Plain data parallelism: every rank keeps everything; gradients are
    /// all-reduced.
    Ddp,
    /// Optimizer state sharded: gradients reduce-scattered, parameters
    /// all-gathered after the update.
    Zero1,
    /// Optimizer state and gradients sharded.
    Zero2,
    /// Optimizer state, gradients and parameters sharded: each layer's
    /// parameters are gathered before its forward and again before its
    /// backward, and freed after each.
    Zero3,
}

impl Stage {
    /// Every stage, in order.
    pub const ALL: [Stage; 4] = [Stage::Ddp, Stage::Zero1, Stage::Zero2, Stage::Zero3];

    /// `ddp`, `zero1`, `zero2` or `zero3`.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Ddp => "ddp",
            Stage::Zero1 => "zero1",
            Stage::Zero2 => "zero2",
            Stage::Zero3 => "zero3",
        }
    }

    /// Parses a name (`ddp`/`0`, `zero1`/`1`, …).
    pub fn parse(s: &str) -> Result<Stage> {
        match s.trim().to_ascii_lowercase().as_str() {
            "ddp" | "0" | "zero0" => Ok(Stage::Ddp),
            "zero1" | "1" => Ok(Stage::Zero1),
            "zero2" | "2" => Ok(Stage::Zero2),
            "zero3" | "3" => Ok(Stage::Zero3),
            _ => Err(Error::invalid(format!("unknown ZeRO stage {s:?}: use ddp, zero1, zero2 or zero3"))),
        }
    }

    /// Whether gradients are kept only as this rank's slice.
    pub fn shards_grads(self) -> bool {
        matches!(self, Stage::Zero2 | Stage::Zero3)
    }

    /// Model-state bytes per rank for `params` parameters over `nranks`
    /// ranks with `bytes` per parameter of each state (the ZeRO paper's
    /// formulas: 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N for mixed-precision
    /// Adam).
    pub fn formula(self, params: f64, nranks: usize, bytes: StateBytes) -> f64 {
        let n = nranks as f64;
        let (p, g, o) = (bytes.param as f64, bytes.grad as f64, bytes.optim as f64);
        params
            * match self {
                Stage::Ddp => p + g + o,
                Stage::Zero1 => p + g + o / n,
                Stage::Zero2 => p + (g + o) / n,
                Stage::Zero3 => (p + g + o) / n,
            }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Bytes per parameter of each part of the model state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateBytes {
    /// Working parameters (2 for bf16).
    pub param: usize,
    /// Gradients (the same type as the parameters).
    pub grad: usize,
    /// Optimizer state: fp32 master weights, momentum and variance (12).
    pub optim: usize,
}

impl StateBytes {
    /// Mixed-precision Adam with parameters of `param_bytes` bytes.
    pub fn adam(param_bytes: usize) -> StateBytes {
        StateBytes { param: param_bytes, grad: param_bytes, optim: 12 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_papers_table() {
        // ZeRO (SC'20), figure 1: 7.5B parameters, N = 64.
        let gb = |s: Stage| s.formula(7.5e9, 64, StateBytes::adam(2)) / 1e9;
        assert_eq!(gb(Stage::Ddp), 120.0);
        assert!((gb(Stage::Zero1) - 31.4).abs() < 0.05);
        assert!((gb(Stage::Zero2) - 16.6).abs() < 0.05);
        assert!((gb(Stage::Zero3) - 1.88).abs() < 0.005);
    }

    #[test]
    fn names_round_trip() {
        for s in Stage::ALL {
            assert_eq!(Stage::parse(s.name()).unwrap(), s);
        }
        assert!(Stage::parse("zero4").unwrap_err().to_string().contains("zero4"));
    }
}
