//! The pipeline bubble: the share of a step that pipeline stages sit idle
//! while the first micro-batches fill the pipeline and the last drain it.
//!
//! With `p` stages, `m` micro-batches per step and equal forward/backward
//! times per stage (GPipe and 1F1B schedules alike), a step lasts
//! `(m + p − 1)` micro-batch slots of which `p − 1` are bubble:
//!
//! ```text
//! bubble fraction of the step   (p − 1) / (m + p − 1)
//! bubble over ideal compute     (p − 1) / m
//! ```
//!
//! With Megatron-LM's interleaved schedule of `v` model chunks per stage
//! the bubble shrinks `v`-fold: `(p − 1)/(v·m)` of the ideal time, so
//! `(p − 1)/(v·m + p − 1)` of the step (Narayanan et al., "Efficient
//! Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
//! SC'21, §2.2).

use serde::Serialize;

/// The bubble of one pipeline configuration.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Bubble {
    /// `p`: pipeline stages.
    pub stages: u64,
    /// `m`: micro-batches per step.
    pub microbatches: u64,
    /// `v`: model chunks per stage (1 without interleaving).
    pub interleave: u64,
    /// `(p − 1)/(v·m + p − 1)`: the share of the step spent idle.
    pub bubble_fraction: f64,
    /// `(p − 1)/(v·m)`: idle time over ideal (bubble-free) compute time.
    pub bubble_over_ideal: f64,
    /// `v·m/(v·m + p − 1)`: the share of the step doing work.
    pub efficiency: f64,
}

/// The bubble of `stages` stages running `microbatches` micro-batches,
/// `interleave` model chunks per stage (all at least 1).
pub fn bubble(stages: u64, microbatches: u64, interleave: u64) -> Bubble {
    let (p, m, v) = (stages as f64, microbatches as f64, interleave as f64);
    let total = v * m + p - 1.0;
    Bubble {
        stages,
        microbatches,
        interleave,
        bubble_fraction: (p - 1.0) / total,
        bubble_over_ideal: (p - 1.0) / (v * m),
        efficiency: v * m / total,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eight_stages_sixteen_microbatches() {
        let b = bubble(8, 16, 1);
        assert_eq!(b.bubble_fraction, 7.0 / 23.0);
        assert_eq!(b.bubble_over_ideal, 7.0 / 16.0);
        assert!((b.efficiency + b.bubble_fraction - 1.0).abs() < 1e-15);
    }

    #[test]
    fn one_stage_has_no_bubble_and_interleaving_shrinks_it() {
        assert_eq!(bubble(1, 4, 1).bubble_fraction, 0.0);
        assert_eq!(bubble(4, 8, 2).bubble_over_ideal, bubble(4, 8, 1).bubble_over_ideal / 2.0);
        assert_eq!(bubble(4, 8, 2).bubble_fraction, 3.0 / 19.0);
    }
}
