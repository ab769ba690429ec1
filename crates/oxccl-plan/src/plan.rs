//! The planner's answers as plain data: what `oxccl-plan memory` and
//! `oxccl-plan min-gpus` print, as text or as JSON.

use crate::comm::{StepVolume, step_volume};
use crate::memory::{MinGpus, Model, Stage, min_gpus};
use crate::units::{gb, gib};
use crate::variants::Variant;
use oxccl_algo::cost::Link;
use serde::Serialize;

/// One value per stage, serialized as `{"ddp": …, "zero1": …, "zero2": …,
/// "zero3": …}`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PerStage<T> {
    /// DDP.
    pub ddp: T,
    /// ZeRO-1.
    pub zero1: T,
    /// ZeRO-2.
    pub zero2: T,
    /// ZeRO-3.
    pub zero3: T,
}

impl<T> PerStage<T> {
    /// `f` of every stage.
    pub fn from_fn(mut f: impl FnMut(Stage) -> T) -> PerStage<T> {
        PerStage { ddp: f(Stage::Ddp), zero1: f(Stage::Zero1), zero2: f(Stage::Zero2), zero3: f(Stage::Zero3) }
    }

    /// The value of `stage`.
    pub fn get(&self, stage: Stage) -> &T {
        match stage {
            Stage::Ddp => &self.ddp,
            Stage::Zero1 => &self.zero1,
            Stage::Zero2 => &self.zero2,
            Stage::Zero3 => &self.zero3,
        }
    }
}

/// One stage's memory per GPU.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StageMemory {
    /// Model-state bytes per GPU; `None` where the variant has no formula.
    pub bytes_per_rank: Option<f64>,
    /// The same in GB (10⁹ bytes).
    pub gb: Option<f64>,
    /// The same in GiB (2³⁰ bytes).
    pub gib: Option<f64>,
    /// The numbers used, `4Ψ + 12Ψ/N`.
    pub formula: Option<String>,
    /// The formula in symbols, `(P+G)·Ψ + O·Ψ/N`.
    pub symbolic: String,
    /// With a GPU size: whether states plus reserve fit in it.
    pub fits: Option<bool>,
    /// Why there is no number.
    pub reason: Option<String>,
    /// Something to know about the number.
    pub note: Option<String>,
    /// The collectives of one training step.
    pub comm_per_step: StepVolume,
}

/// Everything `oxccl-plan memory` answers.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MemoryPlan {
    /// Whose formulas.
    pub variant: Variant,
    /// Where they come from.
    pub source: &'static str,
    /// `Ψ`.
    pub params: u64,
    /// Tensor-parallel degree.
    pub tp: u64,
    /// Pipeline-parallel degree.
    pub pp: u64,
    /// `N`: data-parallel ranks.
    pub dp: u64,
    /// `N·tp·pp`.
    pub gpus: u64,
    /// `Ψ' = Ψ/(tp·pp)`.
    pub params_per_rank: f64,
    /// GPU memory the `fits` answers compare with.
    pub gpu_mem: Option<f64>,
    /// Bytes per GPU set aside for activations and workspace.
    pub reserve: f64,
    /// The answer per stage.
    pub stages: PerStage<StageMemory>,
}

/// Model-state memory of `model` on `dp` data-parallel ranks under each
/// stage of `variant`; `gpu_mem` (with `reserve`) to say what fits,
/// `link` (with `γ`) to time each step's collectives.
pub fn memory(
    model: &Model,
    dp: u64,
    variant: &Variant,
    gpu_mem: Option<f64>,
    reserve: f64,
    link: Option<(Link, f64)>,
) -> MemoryPlan {
    let psi = model.params_per_rank();
    let (pb, gb_el) = variant.element_bytes();
    let stages = PerStage::from_fn(|stage| {
        let comm_per_step = step_volume(stage, psi, dp, pb, gb_el, link);
        let symbolic = variant.symbolic(stage);
        let note = variant.note(stage);
        match variant.cost(stage) {
            Ok(cost) => {
                let bytes = cost.bytes(psi, dp);
                StageMemory {
                    bytes_per_rank: Some(bytes),
                    gb: Some(gb(bytes)),
                    gib: Some(gib(bytes)),
                    formula: Some(cost.formula()),
                    symbolic,
                    fits: gpu_mem.map(|m| bytes + reserve <= m),
                    reason: None,
                    note,
                    comm_per_step,
                }
            }
            Err(reason) => StageMemory {
                bytes_per_rank: None,
                gb: None,
                gib: None,
                formula: None,
                symbolic,
                fits: None,
                reason: Some(reason),
                note,
                comm_per_step,
            },
        }
    });
    MemoryPlan {
        variant: *variant,
        source: variant.source(),
        params: model.params,
        tp: model.tp,
        pp: model.pp,
        dp,
        gpus: dp * model.model_parallel(),
        params_per_rank: psi,
        gpu_mem,
        reserve,
        stages,
    }
}

/// The fewest GPUs of `gpu_mem` bytes (`reserve` of them for activations
/// and workspace) that hold `model` under `stage` of `variant`; a stage
/// the variant has no formula for gets `None` with the reason.
pub fn min_gpus_for(stage: Stage, variant: &Variant, model: &Model, gpu_mem: f64, reserve: f64) -> MinGpus {
    match variant.cost(stage) {
        Ok(cost) => min_gpus(stage, &cost, model, gpu_mem, reserve),
        Err(reason) => MinGpus {
            stage,
            min_gpus: None,
            dp: None,
            bytes_per_rank: None,
            reason: Some(reason),
            min_model_parallel: None,
        },
    }
}

/// Everything `oxccl-plan min-gpus` answers.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MinGpusPlan {
    /// Whose formulas.
    pub variant: Variant,
    /// Where they come from.
    pub source: &'static str,
    /// `Ψ`.
    pub params: u64,
    /// Tensor-parallel degree.
    pub tp: u64,
    /// Pipeline-parallel degree.
    pub pp: u64,
    /// Memory of one GPU.
    pub gpu_mem: f64,
    /// Bytes per GPU set aside for activations and workspace.
    pub reserve: f64,
    /// One answer per stage asked about.
    pub answers: Vec<MinGpus>,
}

/// [`min_gpus_for`] of each of `stages`.
pub fn min_gpus_plan(stages: &[Stage], variant: &Variant, model: &Model, gpu_mem: f64, reserve: f64) -> MinGpusPlan {
    MinGpusPlan {
        variant: *variant,
        source: variant.source(),
        params: model.params,
        tp: model.tp,
        pp: model.pp,
        gpu_mem,
        reserve,
        answers: stages.iter().map(|&s| min_gpus_for(s, variant, model, gpu_mem, reserve)).collect(),
    }
}
