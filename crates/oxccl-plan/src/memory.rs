//! Model-state memory per GPU for DDP and ZeRO-1/2/3, and the fewest GPUs
//! of a given memory that hold a model.
//!
//! Every stage of every [variant](crate::variants) has the shape
//!
//! ```text
//! bytes per GPU = a·Ψ' + b·Ψ'/N + c        Ψ' = Ψ/(tp·pp)
//! ```
//!
//! with `a` the bytes per parameter every data-parallel rank keeps whole
//! ([`StageCost::replicated`]), `b` the bytes per parameter split over
//! the `N` data-parallel ranks ([`StageCost::sharded`]) and `c` a constant
//! ([`StageCost::constant`], DeepSpeed's largest-layer buffer). `Ψ'` is
//! the share of the `Ψ` parameters one model-parallel rank holds: tensor
//! parallelism (degree `tp`) and pipeline parallelism (`pp`) split the
//! parameters, data parallelism (`N`) replicates or shards what is left.
//! A run uses `N·tp·pp` GPUs.
//!
//! Because `a·Ψ'` does not shrink with `N`, a stage with `a > 0` (DDP,
//! ZeRO-1, ZeRO-2) fits on no number of data-parallel ranks once `a·Ψ'`
//! alone fills the GPU: [`min_gpus`] then says so, and how much model
//! parallelism would make room.

use crate::units::{format_count, format_gb_gib, parse_bytes, short};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A data-parallel training scheme: what each data-parallel rank keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// Plain data parallelism: every rank holds all parameters, gradients
    /// and optimizer states.
    Ddp,
    /// ZeRO-1 (P_os): optimizer states sharded.
    Zero1,
    /// ZeRO-2 (P_os+g): optimizer states and gradients sharded.
    Zero2,
    /// ZeRO-3 (P_os+g+p): everything sharded.
    Zero3,
}

impl Stage {
    /// Every stage, in order.
    pub const ALL: [Stage; 4] = [Stage::Ddp, Stage::Zero1, Stage::Zero2, Stage::Zero3];

    /// The key in JSON output and on the command line: `ddp`, `zero1` …
    pub const fn key(self) -> &'static str {
        match self {
            Stage::Ddp => "ddp",
            Stage::Zero1 => "zero1",
            Stage::Zero2 => "zero2",
            Stage::Zero3 => "zero3",
        }
    }

    /// The name people write: `DDP`, `ZeRO-1` …
    pub const fn label(self) -> &'static str {
        match self {
            Stage::Ddp => "DDP",
            Stage::Zero1 => "ZeRO-1",
            Stage::Zero2 => "ZeRO-2",
            Stage::Zero3 => "ZeRO-3",
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

impl FromStr for Stage {
    type Err = String;
    /// `0`/`ddp`, `1`/`zero1`/`zero-1`, `2` …, `3` …
    fn from_str(s: &str) -> Result<Stage, String> {
        let k = s.trim().to_ascii_lowercase().replace(['-', '_'], "");
        Ok(match k.as_str() {
            "0" | "ddp" | "zero0" => Stage::Ddp,
            "1" | "zero1" => Stage::Zero1,
            "2" | "zero2" => Stage::Zero2,
            "3" | "zero3" => Stage::Zero3,
            _ => return Err(format!("{s:?} is not a stage; use 0 (ddp), 1, 2 or 3")),
        })
    }
}

/// Bytes per parameter of each model state, the ZeRO paper's `2 + 2 + K`
/// for mixed-precision Adam by default.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct StateBytes {
    /// `P`: the working copy of the parameters (bf16/fp16: 2).
    pub param: f64,
    /// `G`: the gradients (bf16/fp16: 2).
    pub grad: f64,
    /// `O` (the paper's `K`): optimizer states, fp32 master weights plus
    /// Adam's momentum and variance (4 + 4 + 4 = 12).
    pub optimizer: f64,
}

impl Default for StateBytes {
    fn default() -> StateBytes {
        StateBytes { param: 2.0, grad: 2.0, optimizer: 12.0 }
    }
}

impl StateBytes {
    /// Optimizer bytes from their parts: the master copy plus two moments.
    pub fn adam(param: f64, grad: f64, master: f64, moment: f64) -> StateBytes {
        StateBytes { param, grad, optimizer: master + 2.0 * moment }
    }

    /// `P + G + O`.
    pub fn total(&self) -> f64 {
        self.param + self.grad + self.optimizer
    }
}

/// One stage's memory per GPU: `a·Ψ' + b·Ψ'/N + c` (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct StageCost {
    /// `a`: bytes per parameter every data-parallel rank keeps whole.
    pub replicated: f64,
    /// `b`: bytes per parameter divided over the data-parallel ranks.
    pub sharded: f64,
    /// `c`: bytes that depend on neither `Ψ'` nor `N`.
    pub constant: f64,
    /// Round `b·Ψ'/N` down to whole bytes, as DeepSpeed's `int(…)` does.
    #[serde(skip)]
    pub floor_sharded: bool,
}

impl StageCost {
    /// `a·Ψ' + b·Ψ'/N`, no constant, no rounding.
    pub const fn new(replicated: f64, sharded: f64) -> StageCost {
        StageCost { replicated, sharded, constant: 0.0, floor_sharded: false }
    }

    /// The ZeRO paper's stage `stage` for states of `b` bytes per parameter.
    pub fn zero(stage: Stage, b: &StateBytes) -> StageCost {
        let (p, g, o) = (b.param, b.grad, b.optimizer);
        match stage {
            Stage::Ddp => StageCost::new(p + g + o, 0.0),
            Stage::Zero1 => StageCost::new(p + g, o),
            Stage::Zero2 => StageCost::new(p, g + o),
            Stage::Zero3 => StageCost::new(0.0, p + g + o),
        }
    }

    /// Bytes per GPU for `psi` parameters per model-parallel rank on `dp`
    /// data-parallel ranks.
    pub fn bytes(&self, psi: f64, dp: u64) -> f64 {
        let shard = self.sharded * psi / dp.max(1) as f64;
        let shard = if self.floor_sharded { shard.floor() } else { shard };
        self.replicated * psi + shard + self.constant
    }

    /// `4Ψ + 12Ψ/N`, `16Ψ/N + 4·L` …: the numbers of this cost.
    pub fn formula(&self) -> String {
        let mut terms = Vec::new();
        if self.replicated > 0.0 {
            terms.push(format!("{}Ψ", short(self.replicated)));
        }
        if self.sharded > 0.0 {
            let floor = if self.floor_sharded { "⌊" } else { "" };
            let close = if self.floor_sharded { "⌋" } else { "" };
            terms.push(format!("{floor}{}Ψ/N{close}", short(self.sharded)));
        }
        if self.constant > 0.0 {
            terms.push(format!("{} GB", short(self.constant / 1e9)));
        }
        if terms.is_empty() { "0".to_string() } else { terms.join(" + ") }
    }
}

/// What each GPU keeps free besides the model states: a number of bytes,
/// or a share of the GPU's memory.
///
/// The formulas count parameters, gradients and optimizer states only. A
/// training process also holds activations (which depend on the batch,
/// the sequence length and recomputation, none of which the planner
/// knows), temporary buffers and communication buckets, what the caching
/// allocator loses to fragmentation, and the CUDA context (hundreds of
/// megabytes per process). A plan that fills 100% of the memory with
/// model states does not run, so the planner keeps [`Reserve::DEFAULT`]
/// (10% of the GPU) free unless told otherwise. That is a floor for
/// those costs, not an estimate of the activations: give a measured
/// figure where there is one (`--reserve 20GB`), or `--reserve 0` for the
/// bare formulas.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Reserve {
    /// This many bytes per GPU.
    Bytes(f64),
    /// This share of each GPU's memory, `0 ≤ f < 1`.
    Fraction(f64),
}

impl Reserve {
    /// 10% of the GPU's memory (see the type's doc for why).
    pub const DEFAULT: Reserve = Reserve::Fraction(0.10);

    /// The bytes kept free on a GPU of `gpu_mem` bytes.
    pub fn bytes(self, gpu_mem: f64) -> f64 {
        match self {
            Reserve::Bytes(b) => b,
            Reserve::Fraction(f) => f * gpu_mem,
        }
    }

    /// `"10% of the GPU = 8 GB (7.451 GiB)"`, `"8 GB (7.451 GiB)"`, `"none"`.
    pub fn describe(self, gpu_mem: f64) -> String {
        match self {
            _ if self.bytes(gpu_mem) == 0.0 => "none".to_string(),
            Reserve::Bytes(b) => format_gb_gib(b),
            Reserve::Fraction(f) => format!("{}% of the GPU = {}", short(f * 100.0), format_gb_gib(f * gpu_mem)),
        }
    }
}

impl FromStr for Reserve {
    type Err = String;
    /// A share of the GPU, `10%` (at least 0, below 100), or a byte size
    /// as [`parse_bytes`] reads it: `8GB`, `7.5GiB`, `0`.
    fn from_str(s: &str) -> Result<Reserve, String> {
        let Some(pct) = s.trim().strip_suffix('%') else { return parse_bytes(s).map(Reserve::Bytes) };
        let p: f64 = pct.trim().parse().map_err(|_| format!("{s:?} is not a percentage (write 10% or a size, 8GB)"))?;
        if !(0.0..100.0).contains(&p) {
            return Err(format!("{s:?} must be at least 0% and below 100% of the GPU"));
        }
        Ok(Reserve::Fraction(p / 100.0 + 0.0))
    }
}

/// What is being trained: `Ψ` parameters split `tp·pp` ways.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Model {
    /// `Ψ`: parameters of the whole model.
    pub params: u64,
    /// Tensor-parallel degree.
    pub tp: u64,
    /// Pipeline-parallel degree.
    pub pp: u64,
}

impl Model {
    /// `params` parameters, no model parallelism.
    pub const fn new(params: u64) -> Model {
        Model { params, tp: 1, pp: 1 }
    }

    /// `tp·pp`: GPUs that share one copy of the model.
    pub const fn model_parallel(&self) -> u64 {
        self.tp * self.pp
    }

    /// `Ψ' = Ψ/(tp·pp)`: parameters on one model-parallel rank (the
    /// planner assumes an even split).
    pub fn params_per_rank(&self) -> f64 {
        self.params as f64 / self.model_parallel() as f64
    }
}

/// The fewest GPUs for one stage, or why there is no such number.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MinGpus {
    /// The stage.
    pub stage: Stage,
    /// All GPUs, `dp·tp·pp`; `None` when no data-parallel size fits.
    pub min_gpus: Option<u64>,
    /// The data-parallel size of that answer.
    pub dp: Option<u64>,
    /// Model-state bytes per GPU at that size.
    pub bytes_per_rank: Option<f64>,
    /// Why no data-parallel size fits (`None` when one does).
    pub reason: Option<String>,
    /// When nothing fits: the smallest `tp·pp` with which some
    /// data-parallel size would (`None` when none would).
    pub min_model_parallel: Option<u64>,
}

/// The fewest GPUs of `gpu_mem` bytes, `reserve` of which go to
/// activations and workspace, that hold `model`'s states under `cost`.
pub fn min_gpus(stage: Stage, cost: &StageCost, model: &Model, gpu_mem: f64, reserve: f64) -> MinGpus {
    let psi = model.params_per_rank();
    let budget = gpu_mem - reserve;
    let fits = |dp: u64| cost.bytes(psi, dp) <= budget;
    let fixed = cost.replicated * psi + cost.constant;
    let none = |reason: String, mp: Option<u64>| MinGpus {
        stage,
        min_gpus: None,
        dp: None,
        bytes_per_rank: None,
        reason: Some(reason),
        min_model_parallel: mp,
    };
    let room = if reserve > 0.0 {
        format!(
            "{} left per GPU ({} GPU − {} reserve)",
            format_gb_gib(budget.max(0.0)),
            format_gb_gib(gpu_mem),
            format_gb_gib(reserve)
        )
    } else {
        format!("{} GPU", format_gb_gib(gpu_mem))
    };
    if budget <= cost.constant || budget <= 0.0 {
        let what = if cost.constant > 0.0 {
            format!("the constant term ({}) alone is not below the {room}", format_gb_gib(cost.constant))
        } else {
            format!("the reserve leaves no room: {room}")
        };
        return none(format!("{stage}: {what}, whatever tp, pp and the data-parallel size"), None);
    }
    // The stage fits at some N exactly when its fixed part leaves room
    // (strictly, if anything is sharded: b·Ψ'/N > 0 for every finite N).
    let leaves_room = if cost.sharded > 0.0 && !cost.floor_sharded { fixed < budget } else { fixed <= budget };
    if !leaves_room {
        let need = min_model_parallel(cost, model.params as f64, budget);
        let what = if cost.sharded > 0.0 {
            "on every data-parallel rank, however many there are"
        } else {
            "on every GPU (DDP replicates everything: more data-parallel ranks do not help)"
        };
        let reason = format!(
            "{stage} keeps {}·Ψ' = {} B/param × {} params = {} {what}; that alone {} the {room}. \
             Split the model over tensor/pipeline ranks (tp·pp ≥ {}) or use a stage that shards more",
            short(cost.replicated),
            short(cost.replicated),
            format_count(psi),
            format_gb_gib(cost.replicated * psi),
            if fixed > budget { "exceeds" } else { "fills" },
            need.map_or("?".into(), |k| k.to_string()),
        );
        return none(reason, need);
    }
    let dp = if cost.sharded <= 0.0 {
        1
    } else {
        let guess = (cost.sharded * psi / (budget - fixed)).ceil().max(1.0);
        let mut dp = if guess > 9.0e18 { u64::MAX / 2 } else { guess as u64 };
        while !fits(dp) && dp < u64::MAX / 2 {
            dp += 1;
        }
        while dp > 1 && fits(dp - 1) {
            dp -= 1;
        }
        dp
    };
    MinGpus {
        stage,
        min_gpus: dp.checked_mul(model.model_parallel()),
        dp: Some(dp),
        bytes_per_rank: Some(cost.bytes(psi, dp)),
        reason: None,
        min_model_parallel: None,
    }
}

/// The smallest `k = tp·pp` with which `a·Ψ/k + c` leaves room in
/// `budget` (strictly when something is sharded); `None` if no `k` does.
fn min_model_parallel(cost: &StageCost, psi: f64, budget: f64) -> Option<u64> {
    let room = budget - cost.constant;
    if room <= 0.0 {
        return None;
    }
    let need = cost.replicated * psi / room;
    let k = if cost.sharded > 0.0 { need.floor() + 1.0 } else { need.ceil() };
    Some(k.max(1.0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_parse_by_number_and_name() {
        assert_eq!("3".parse(), Ok(Stage::Zero3));
        assert_eq!("ZeRO-2".parse(), Ok(Stage::Zero2));
        assert_eq!("ddp".parse(), Ok(Stage::Ddp));
        assert_eq!("zero_1".parse(), Ok(Stage::Zero1));
        assert!("4".parse::<Stage>().unwrap_err().contains("not a stage"));
    }

    #[test]
    fn default_states_give_the_papers_coefficients() {
        let b = StateBytes::default();
        assert_eq!(b, StateBytes::adam(2.0, 2.0, 4.0, 4.0));
        let f: Vec<String> = Stage::ALL.iter().map(|&s| StageCost::zero(s, &b).formula()).collect();
        assert_eq!(f, ["16Ψ", "4Ψ + 12Ψ/N", "2Ψ + 14Ψ/N", "16Ψ/N"]);
    }

    #[test]
    fn model_parallelism_divides_the_parameters() {
        let m = Model { params: 8_000, tp: 4, pp: 2 };
        assert_eq!(m.params_per_rank(), 1000.0);
        let c = StageCost::zero(Stage::Zero1, &StateBytes::default());
        assert_eq!(c.bytes(m.params_per_rank(), 4), 4.0 * 1000.0 + 12.0 * 1000.0 / 4.0);
    }

    #[test]
    fn the_answer_is_the_smallest_count_that_fits() {
        // 16Ψ/N ≤ 100 with Ψ = 1000: N = 160, and 159 does not fit.
        let c = StageCost::zero(Stage::Zero3, &StateBytes::default());
        let m = Model::new(1000);
        let r = min_gpus(Stage::Zero3, &c, &m, 100.0, 0.0);
        assert_eq!((r.dp, r.min_gpus), (Some(160), Some(160)));
        assert!(c.bytes(1000.0, 159) > 100.0);
        // A reserve takes from the budget: 16000/N ≤ 50 → N = 320.
        assert_eq!(min_gpus(Stage::Zero3, &c, &m, 100.0, 50.0).dp, Some(320));
        // DDP fits on one replica or none.
        let d = StageCost::zero(Stage::Ddp, &StateBytes::default());
        assert_eq!(min_gpus(Stage::Ddp, &d, &Model { params: 1000, tp: 2, pp: 2 }, 4000.0, 0.0).min_gpus, Some(4));
    }

    #[test]
    fn a_term_that_does_not_shrink_with_n_can_never_fit() {
        let c = StageCost::zero(Stage::Zero2, &StateBytes::default());
        let r = min_gpus(Stage::Zero2, &c, &Model::new(1000), 2000.0, 0.0);
        assert_eq!((r.min_gpus, r.dp), (None, None));
        let why = r.reason.unwrap();
        assert!(why.contains("ZeRO-2 keeps 2·Ψ'"), "{why}");
        // 2·1000/k < 2000 needs k ≥ 2.
        assert_eq!(r.min_model_parallel, Some(2));
        // A reserve as big as the GPU leaves nothing for any stage.
        let z3 = StageCost::zero(Stage::Zero3, &StateBytes::default());
        let r = min_gpus(Stage::Zero3, &z3, &Model::new(1000), 2000.0, 2000.0);
        assert!(r.reason.unwrap().contains("reserve leaves no room"));
    }

    #[test]
    fn reserves_are_a_share_or_a_size() {
        assert_eq!("10%".parse(), Ok(Reserve::Fraction(0.1)));
        assert_eq!(" 0% ".parse(), Ok(Reserve::Fraction(0.0)));
        assert_eq!("8GB".parse(), Ok(Reserve::Bytes(8e9)));
        assert_eq!("1GiB".parse(), Ok(Reserve::Bytes(1024f64.powi(3))));
        assert_eq!("0".parse(), Ok(Reserve::Bytes(0.0)));
        assert!("100%".parse::<Reserve>().unwrap_err().contains("below 100%"));
        assert!("-5%".parse::<Reserve>().unwrap_err().contains("at least 0%"));
        assert!("lots%".parse::<Reserve>().unwrap_err().contains("not a percentage"));
        assert!("8G".parse::<Reserve>().unwrap_err().contains("ambiguous"));
        assert_eq!(Reserve::DEFAULT.bytes(80e9), 8e9);
        assert_eq!(Reserve::DEFAULT.describe(80e9), "10% of the GPU = 8 GB (7.451 GiB)");
        assert_eq!(Reserve::Bytes(20e9).describe(80e9), "20 GB (18.63 GiB)");
        assert_eq!(Reserve::Fraction(0.0).describe(80e9), "none");
    }
}
