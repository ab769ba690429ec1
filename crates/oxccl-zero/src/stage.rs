//! The stages and the memory each keeps per rank: the planner's
//! ([`oxccl_plan::memory`]), so that what the optimizer measures and what
//! `oxccl-plan` predicts come from one formula.

pub use oxccl_plan::memory::{Stage, StageCost, StateBytes};

/// Whether `stage` keeps only this rank's slice of the gradients.
pub(crate) fn shards_grads(stage: Stage) -> bool {
    matches!(stage, Stage::Zero2 | Stage::Zero3)
}

/// The ZeRO paper's model-state bytes per rank for `params` parameters of
/// `param_bytes` bytes (gradients alike; fp32 master weights and moments)
/// over `nranks` ranks.
pub(crate) fn paper_bytes(stage: Stage, params: usize, nranks: usize, param_bytes: usize) -> f64 {
    let p = param_bytes as f64;
    StageCost::zero(stage, &StateBytes::adam(p, p, 4.0, 4.0)).bytes(params as f64, nranks as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_papers_table() {
        // ZeRO (SC'20), figure 1: 7.5B parameters, N = 64.
        let gb = |s: Stage| paper_bytes(s, 7_500_000_000, 64, 2) / 1e9;
        assert_eq!(gb(Stage::Ddp), 120.0);
        assert!((gb(Stage::Zero1) - 31.4).abs() < 0.05);
        assert!((gb(Stage::Zero2) - 16.6).abs() < 0.05);
        assert!((gb(Stage::Zero3) - 1.88).abs() < 0.005);
        assert!(shards_grads(Stage::Zero2) && !shards_grads(Stage::Zero1));
    }
}
