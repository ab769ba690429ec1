//! The formulas other tools use, so their numbers can be reconciled with
//! the planner's.
//!
//! | variant | DDP | ZeRO-1 | ZeRO-2 | ZeRO-3 |
//! |---|---|---|---|---|
//! | `zero` (default) | `(P+G+O)Ψ` | `(P+G)Ψ + OΨ/N` | `PΨ + (G+O)Ψ/N` | `(P+G+O)Ψ/N` |
//! | `deepspeed` | — | — | `2Ψ + ⌊18Ψ/N⌋` | `4L + ⌊18Ψ/N⌋` |
//! | `deepspeed-legacy` | — | — | `4Ψ + ⌊16Ψ/N⌋` | `4L + ⌊18Ψ/N⌋` |
//! | `megatron` (bf16 params, fp32 grads) | `18Ψ` | `6Ψ + 12Ψ/d` | — | — |
//!
//! Sources (the formulas, as the code computes them):
//!
//! - `zero`: Rajbhandari et al., "ZeRO: Memory Optimizations Toward
//!   Training Trillion Parameter Models", SC'20, §3.1 and §5.1/Figure 1:
//!   mixed-precision Adam keeps `2Ψ + 2Ψ + KΨ` bytes, `K = 12` (fp32
//!   parameters, momentum, variance), and the three stages partition the
//!   optimizer states, then the gradients, then the parameters. `P`, `G`,
//!   `O` (= `K`) are configurable.
//! - `deepspeed`: DeepSpeed (deepspeedai/DeepSpeed)
//!   `deepspeed/runtime/zero/stage_1_and_2.py`,
//!   `estimate_zero2_model_states_mem_needs(total_params,
//!   num_gpus_per_node, num_nodes, cpu_offload=False)`: `gpu_mem = 2 *
//!   total_params + int(18 * total_params / total_gpus)` with `total_gpus
//!   = num_nodes * num_gpus_per_node` (v0.14.3 on, PR #5099: 2 = 16-bit
//!   params; 18 = 16-bit grads 2 + fp32 grads 4 + fp32 params 4 + Adam
//!   states 8); and `deepspeed/runtime/zero/stage3.py`,
//!   `estimate_zero3_model_states_mem_needs(…, cpu_offload=False)`:
//!   `gpu_mem = 4 * largest_layer_params + int(18 * total_params /
//!   total_gpus)`. Neither has a DDP or ZeRO-1 estimate. DeepSpeed's
//!   printed "GB" are 2³⁰ bytes (`gpu_mem/2**30`), the planner's GiB.
//! - `deepspeed-legacy`: the same ZeRO-2 function before v0.14.3:
//!   `4 * total_params + int(16 * total_params / total_gpus)`; the worked
//!   example in DeepSpeed's `docs/code-docs/source/memory.rst` (2851M
//!   params, 8 GPUs, offload_optimizer=none: 15.93GB) still shows it.
//! - `megatron`: Megatron-LM (NVIDIA/Megatron-LM)
//!   `docs/user-guide/features/dist_optimizer.md` (first
//!   `docs/distrib_optimizer.md`), the table of theoretical bytes per
//!   parameter, `d` the data-parallel size: fp16 params/fp16 grads 20 vs
//!   `4 + 16/d`; bf16 params/fp32 grads 18 vs `6 + 12/d`; fp32/fp32 16 vs
//!   `8 + 8/d`. Non-distributed is DDP; the distributed optimizer shards
//!   the optimizer states (and fp32 main gradients), ZeRO-1's place.

use crate::memory::{Stage, StageCost, StateBytes};
use crate::units::short;
use serde::Serialize;
use std::fmt;
use std::str::FromStr;

/// Megatron-LM's three rows: parameter and main-gradient data types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// fp16 parameters, fp16 gradients.
    Fp16,
    /// bf16 parameters, fp32 main gradients (the default).
    Bf16,
    /// fp32 parameters, fp32 gradients.
    Fp32,
}

impl Precision {
    /// (non-distributed bytes, distributed replicated bytes, distributed
    /// sharded bytes) per parameter, Megatron's table.
    const fn table(self) -> (f64, f64, f64) {
        match self {
            Precision::Fp16 => (20.0, 4.0, 16.0),
            Precision::Bf16 => (18.0, 6.0, 12.0),
            Precision::Fp32 => (16.0, 8.0, 8.0),
        }
    }

    /// (parameter, main-gradient) element bytes.
    const fn elements(self) -> (f64, f64) {
        match self {
            Precision::Fp16 => (2.0, 2.0),
            Precision::Bf16 => (2.0, 4.0),
            Precision::Fp32 => (4.0, 4.0),
        }
    }

    /// How the table's row is named.
    pub const fn describe(self) -> &'static str {
        match self {
            Precision::Fp16 => "fp16 parameters, fp16 gradients",
            Precision::Bf16 => "bf16 parameters, fp32 gradients",
            Precision::Fp32 => "fp32 parameters, fp32 gradients",
        }
    }
}

impl FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> Result<Precision, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "fp16" | "half" => Ok(Precision::Fp16),
            "bf16" | "bfloat16" => Ok(Precision::Bf16),
            "fp32" | "float" => Ok(Precision::Fp32),
            _ => Err(format!("{s:?} is not one of Megatron's precisions fp16, bf16, fp32")),
        }
    }
}

/// Whose formulas to use.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(tag = "name", rename_all = "kebab-case")]
pub enum Variant {
    /// The ZeRO paper's, with configurable bytes per state.
    Zero(StateBytes),
    /// DeepSpeed's estimators (v0.14.3 on); `largest_layer` in parameters.
    #[serde(rename_all = "snake_case")]
    Deepspeed {
        /// DeepSpeed's `largest_layer_params` (ZeRO-3's `4L` buffer).
        largest_layer: f64,
    },
    /// DeepSpeed's ZeRO-2 estimator before v0.14.3.
    #[serde(rename_all = "snake_case")]
    DeepspeedLegacy {
        /// As for [`Variant::Deepspeed`].
        largest_layer: f64,
    },
    /// Megatron-LM's distributed-optimizer table.
    #[serde(rename_all = "snake_case")]
    Megatron {
        /// The table's row.
        precision: Precision,
    },
}

impl Default for Variant {
    fn default() -> Variant {
        Variant::Zero(StateBytes::default())
    }
}

/// The variants' command-line names.
pub const NAMES: [&str; 4] = ["zero", "deepspeed", "deepspeed-legacy", "megatron"];

impl Variant {
    /// The command-line name.
    pub const fn key(&self) -> &'static str {
        match self {
            Variant::Zero(_) => "zero",
            Variant::Deepspeed { .. } => "deepspeed",
            Variant::DeepspeedLegacy { .. } => "deepspeed-legacy",
            Variant::Megatron { .. } => "megatron",
        }
    }

    /// The cost of `stage`, or why this variant has no formula for it.
    pub fn cost(&self, stage: Stage) -> Result<StageCost, String> {
        let ds = |replicated: f64, sharded: f64, constant: f64| StageCost {
            replicated,
            sharded,
            constant,
            floor_sharded: true,
        };
        match (self, stage) {
            (Variant::Zero(b), s) => Ok(StageCost::zero(s, b)),
            (Variant::Deepspeed { .. }, Stage::Zero2) => Ok(ds(2.0, 18.0, 0.0)),
            (Variant::DeepspeedLegacy { .. }, Stage::Zero2) => Ok(ds(4.0, 16.0, 0.0)),
            (Variant::Deepspeed { largest_layer } | Variant::DeepspeedLegacy { largest_layer }, Stage::Zero3) => {
                Ok(ds(0.0, 18.0, 4.0 * largest_layer))
            }
            (Variant::Deepspeed { .. } | Variant::DeepspeedLegacy { .. }, s) => Err(format!(
                "DeepSpeed's estimators cover ZeRO-2 (estimate_zero2_model_states_mem_needs) and ZeRO-3 \
                 (estimate_zero3_model_states_mem_needs) only, not {s}"
            )),
            (Variant::Megatron { precision }, Stage::Ddp) => Ok(StageCost::new(precision.table().0, 0.0)),
            (Variant::Megatron { precision }, Stage::Zero1) => {
                let (_, a, b) = precision.table();
                Ok(StageCost::new(a, b))
            }
            (Variant::Megatron { .. }, s) => Err(format!(
                "Megatron-LM's table has the non-distributed optimizer (DDP) and the distributed optimizer \
                 (ZeRO-1's sharding) only, not {s}"
            )),
        }
    }

    /// `stage`'s formula in words and symbols, for `--explain`.
    pub fn symbolic(&self, stage: Stage) -> String {
        match (self, stage) {
            (Variant::Zero(_), Stage::Ddp) => "(P+G+O)·Ψ".into(),
            (Variant::Zero(_), Stage::Zero1) => "(P+G)·Ψ + O·Ψ/N".into(),
            (Variant::Zero(_), Stage::Zero2) => "P·Ψ + (G+O)·Ψ/N".into(),
            (Variant::Zero(_), Stage::Zero3) => "(P+G+O)·Ψ/N".into(),
            (Variant::Deepspeed { .. }, Stage::Zero2) => "2·Ψ + int(18·Ψ/N)".into(),
            (Variant::DeepspeedLegacy { .. }, Stage::Zero2) => "4·Ψ + int(16·Ψ/N)".into(),
            (Variant::Deepspeed { .. } | Variant::DeepspeedLegacy { .. }, Stage::Zero3) => "4·L + int(18·Ψ/N)".into(),
            (Variant::Megatron { precision }, Stage::Ddp) => {
                format!("{}·Ψ (non-distributed optimizer, {})", short(precision.table().0), precision.describe())
            }
            (Variant::Megatron { precision }, Stage::Zero1) => {
                let (_, a, b) = precision.table();
                format!("({} + {}/d)·Ψ (distributed optimizer, {})", short(a), short(b), precision.describe())
            }
            (_, s) => format!("none for {s}"),
        }
    }

    /// What the symbols of [`Variant::symbolic`] stand for, for `--explain`.
    pub fn details(&self) -> Vec<String> {
        match self {
            Variant::Zero(_) => vec![
                "P = weights, G = gradients, O = optimizer states (fp32 master + Adam momentum + variance), \
                 bytes per parameter; Ψ = parameters per model-parallel rank, N = data-parallel ranks"
                    .into(),
            ],
            Variant::Deepspeed { .. } | Variant::DeepspeedLegacy { .. } => {
                let mut d = vec![
                    "ZeRO-2 (v0.14.3 on): 2 = 16-bit params; 18 = 16-bit grads 2 + fp32 grads 4 + fp32 params 4 \
                     + Adam momentum and variance 8"
                        .to_string(),
                    "ZeRO-3: 4·L = largest layer's parameters (--largest-layer) in fp32; 18 as for ZeRO-2".into(),
                    "N = total_gpus = num_nodes·num_gpus_per_node; int() rounds down to whole bytes".into(),
                    "DeepSpeed prints gpu_mem/2**30 and calls it GB: compare with the GiB column".into(),
                ];
                if matches!(self, Variant::DeepspeedLegacy { .. }) {
                    d.push(
                        "legacy ZeRO-2 (before v0.14.3, PR #5099): 4·Ψ + int(16·Ψ/N), the docs' 15.93GB example".into(),
                    );
                }
                d
            }
            Variant::Megatron { .. } => vec![
                "Megatron-LM's table, bytes per parameter, d = data-parallel size: fp16 params/fp16 grads 20 vs \
                 4 + 16/d; bf16 params/fp32 grads 18 vs 6 + 12/d; fp32/fp32 16 vs 8 + 8/d"
                    .into(),
                "non-distributed optimizer = DDP; distributed optimizer = ZeRO-1's sharding (optimizer states \
                 and fp32 main gradients split over d)"
                    .into(),
            ],
        }
    }

    /// Where the formulas come from.
    pub const fn source(&self) -> &'static str {
        match self {
            Variant::Zero(_) => {
                "Rajbhandari et al., ZeRO (SC'20), §3.1 and Figure 1: 2Ψ + 2Ψ + KΨ for mixed-precision Adam, K = 12"
            }
            Variant::Deepspeed { .. } => {
                "DeepSpeed deepspeed/runtime/zero/stage_1_and_2.py estimate_zero2_model_states_mem_needs and \
                 deepspeed/runtime/zero/stage3.py estimate_zero3_model_states_mem_needs, cpu_offload=False \
                 (v0.14.3 on); N = num_nodes·num_gpus_per_node; DeepSpeed prints GB meaning GiB"
            }
            Variant::DeepspeedLegacy { .. } => {
                "DeepSpeed before v0.14.3 (estimate_zero2_model_states_mem_needs: 4Ψ + int(16Ψ/N)); the worked \
                 example of docs/code-docs/source/memory.rst; DeepSpeed prints GB meaning GiB"
            }
            Variant::Megatron { .. } => {
                "Megatron-LM docs/user-guide/features/dist_optimizer.md (first docs/distrib_optimizer.md): \
                 theoretical bytes per parameter, d = data-parallel size"
            }
        }
    }

    /// (parameter, gradient) bytes per element moved by the collectives
    /// of a training step.
    pub fn element_bytes(&self) -> (f64, f64) {
        match self {
            Variant::Zero(b) => (b.param, b.grad),
            Variant::Deepspeed { .. } | Variant::DeepspeedLegacy { .. } => (2.0, 2.0),
            Variant::Megatron { precision } => precision.elements(),
        }
    }

    /// Something the user should know about `stage`'s number.
    pub fn note(&self, stage: Stage) -> Option<String> {
        match (self, stage) {
            (Variant::Deepspeed { largest_layer } | Variant::DeepspeedLegacy { largest_layer }, Stage::Zero3)
                if *largest_layer == 0.0 =>
            {
                Some("largest layer not given (--largest-layer): its 4·L bytes are counted as 0".into())
            }
            _ => None,
        }
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_names_the_stages_it_lacks() {
        let ds = Variant::Deepspeed { largest_layer: 0.0 };
        assert!(ds.cost(Stage::Zero1).unwrap_err().contains("ZeRO-2"));
        let mg = Variant::Megatron { precision: Precision::Bf16 };
        assert!(mg.cost(Stage::Zero3).unwrap_err().contains("distributed optimizer"));
        assert!(Variant::default().cost(Stage::Zero3).is_ok());
    }

    #[test]
    fn precisions_parse() {
        assert_eq!("BF16".parse(), Ok(Precision::Bf16));
        assert_eq!("fp16".parse(), Ok(Precision::Fp16));
        assert!("int4".parse::<Precision>().unwrap_err().contains("fp16, bf16, fp32"));
    }

    #[test]
    fn megatron_element_sizes_follow_the_row() {
        // bf16 parameters are gathered, fp32 main gradients reduced.
        assert_eq!(Variant::Megatron { precision: Precision::Bf16 }.element_bytes(), (2.0, 4.0));
        assert_eq!(Variant::Megatron { precision: Precision::Fp32 }.element_bytes(), (4.0, 4.0));
    }
}
