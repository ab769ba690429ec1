//! Ring collective times, closed form and simulated, and the bytes a
//! training step moves under each ZeRO stage.
//!
//! For `S` bytes on `N` ranks over a link of latency `α` and bandwidth
//! `β` (bytes per second) the textbook ring costs are
//!
//! ```text
//! all-reduce      2(N−1)·(α + S/(N·β))
//! reduce-scatter   (N−1)·(α + S/(N·β))      S = the whole, unsharded buffer
//! all-gather       (N−1)·(α + S/(N·β))
//! ```
//!
//! (`oxccl_algo::cost::ring_all_reduce` and friends, which these call).
//! With a reduction throughput (`γ = 1/reduce_bw`, off by default)
//! all-reduce and reduce-scatter add `(N−1)/N·S·γ`. Each rank sends
//! `2(N−1)/N·S` bytes in an all-reduce and `(N−1)/N·S` in the others.
//!
//! [`simulate`] builds the ring programs `oxccl-sim all_reduce --algo
//! ring` would (same [`BuildOptions`]: 2 MiB pipeline chunks, at most
//! 64 per block) for one-byte elements and prices them with
//! `oxccl_algo::sim` on `N` ranks that each have their own port on one
//! non-blocking switch. Each rank runs a chunk's whole ring before the
//! next chunk, so with `k` chunks per block every hop pays `α` `k` times:
//! the simulated all-reduce is `2(N−1)·(k·α + S/(N·β))`; with one chunk
//! it is the closed form.
//!
//! Per training step ([`step_volume`], ZeRO paper §7): DDP all-reduces the
//! gradients (`2Ψ` elements through each rank); ZeRO-1 and ZeRO-2
//! reduce-scatter the gradients and all-gather the updated parameters
//! (`Ψ + Ψ = 2Ψ`); ZeRO-3 all-gathers the parameters in the forward and
//! again in the backward pass and reduce-scatters the gradients (`3Ψ`).

use crate::memory::Stage;
use oxccl_algo::algos::{Algorithm, BuildOptions, build};
use oxccl_algo::cost::{Link, Topology, format_bandwidth, ring_all_gather, ring_all_reduce, ring_reduce_scatter};
use oxccl_algo::{CollKind, Collective};
use oxccl_core::DataType;
use serde::Serialize;

/// `α` when none is given: 5 µs per message, oxccl-sim's default
/// inter-node link (`--inter 50GB/s,5us`), the order of one message
/// across a switch between hosts. Intra-node links are faster (oxccl-sim
/// takes 0.6 µs); latency matters only for small buffers or many ranks,
/// so give the link's own figure there.
pub const DEFAULT_LATENCY_S: f64 = 5e-6;

/// Times of the three ring collectives, in seconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct RingTimes {
    /// All-reduce of `S` bytes.
    pub all_reduce_s: f64,
    /// Reduce-scatter of `S` bytes in all (`S/N` out per rank).
    pub reduce_scatter_s: f64,
    /// All-gather of `S` bytes in all (`S/N` in per rank).
    pub all_gather_s: f64,
}

impl RingTimes {
    /// Each of `self` divided by the same of `other`.
    pub fn ratio(&self, other: &RingTimes) -> RingTimes {
        let r = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
        RingTimes {
            all_reduce_s: r(self.all_reduce_s, other.all_reduce_s),
            reduce_scatter_s: r(self.reduce_scatter_s, other.reduce_scatter_s),
            all_gather_s: r(self.all_gather_s, other.all_gather_s),
        }
    }
}

/// The textbook ring times of `bytes` on `ranks` over `link`, with a
/// reduction cost of `gamma` seconds per byte (0 for none).
pub fn closed_form(ranks: usize, bytes: u64, link: Link, gamma: f64) -> RingTimes {
    let s = usize::try_from(bytes).unwrap_or(usize::MAX);
    RingTimes {
        all_reduce_s: ring_all_reduce(ranks, s, link, gamma),
        reduce_scatter_s: ring_reduce_scatter(ranks, s, link, gamma),
        all_gather_s: ring_all_gather(ranks, s, link),
    }
}

/// Bytes each rank sends: all-reduce `2(N−1)/N·S`, the others `(N−1)/N·S`.
pub fn bytes_sent_per_rank(ranks: u64, bytes: f64) -> (f64, f64) {
    let n = ranks as f64;
    let one = (n - 1.0) / n * bytes;
    (2.0 * one, one)
}

/// What the simulator said, and about which programs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Simulated {
    /// Predicted times.
    #[serde(flatten)]
    pub times: RingTimes,
    /// Pipeline chunks per block of the all-reduce (`k`).
    pub chunks: usize,
    /// Bytes the reduce-scatter and all-gather programs move in all
    /// (`S` rounded down to a multiple of `N`: one-byte elements).
    pub rs_ag_bytes: u64,
    /// Chunks per block oxccl-sim would use, when the step budget
    /// ([`MAX_STEPS`]) lowered it to `chunks`.
    pub chunks_capped_from: Option<usize>,
    /// The topology in words.
    pub topology: String,
}

/// At most this many steps in one simulated program: the chunk count is
/// lowered to stay under it (a step is tens of bytes in memory).
pub const MAX_STEPS: usize = 4_000_000;

/// Simulates the ring programs of `bytes` on `ranks` over `link` with
/// oxccl-algo's simulator (see the module doc); `opts` as oxccl-sim's
/// `--chunk` and `--max-chunks`. The chunk count is lowered so that no
/// program exceeds [`MAX_STEPS`]; an error says why a ring cannot be
/// simulated.
pub fn simulate(
    ranks: usize,
    bytes: u64,
    link: Link,
    reduce_bw: f64,
    opts: &BuildOptions,
) -> Result<Simulated, String> {
    let per_chunk = 2 * ranks * ranks.saturating_sub(1);
    if per_chunk > MAX_STEPS {
        return Err(format!(
            "an all-reduce ring of {ranks} ranks has {per_chunk} steps even in one chunk, more than the {MAX_STEPS} \
             simulated here; oxccl-sim all_reduce --algo ring --nodes {ranks} --ranks-per-node 1 prices it"
        ));
    }
    let wanted = *opts;
    let mut opts = *opts;
    opts.max_chunks = opts.max_chunks.min((MAX_STEPS / per_chunk.max(1)).max(1));
    let topo = Topology::one_rank_per_node(ranks, link).with_reduce_bw(reduce_bw);
    topo.validate().map_err(|e| e.to_string())?;
    let count = usize::try_from(bytes).map_err(|_| format!("{bytes} bytes do not fit this machine's usize"))?;
    let block = count / ranks.max(1);
    let run = |kind: CollKind, count: usize| -> Result<f64, String> {
        let coll = Collective::new(kind, ranks, count).with_dtype(DataType::Uint8);
        let program = build(Algorithm::Ring, &coll, &opts).map_err(|e| e.to_string())?;
        oxccl_algo::sim::simulate(&program, &topo).map(|r| r.time).map_err(|e| e.to_string())
    };
    let times = RingTimes {
        all_reduce_s: run(CollKind::AllReduce, count)?,
        reduce_scatter_s: run(CollKind::ReduceScatter, block)?,
        all_gather_s: run(CollKind::AllGather, block)?,
    };
    let block_ar = count.div_ceil(ranks.max(1));
    let (chunks, uncapped) = (opts.chunking(block_ar, 1), wanted.chunking(block_ar, 1));
    let reduce =
        if reduce_bw.is_finite() { format!(", reductions at {}", format_bandwidth(reduce_bw)) } else { String::new() };
    Ok(Simulated {
        times,
        chunks,
        chunks_capped_from: (uncapped != chunks).then_some(uncapped),
        rs_ag_bytes: (block * ranks) as u64,
        topology: format!("{ranks} ranks, each with its own {link} port on one non-blocking switch{reduce}"),
    })
}

/// Bytes each rank sends in each ring collective.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SentPerRank {
    /// `2(N−1)/N·S`.
    pub all_reduce: f64,
    /// `(N−1)/N·S`.
    pub reduce_scatter: f64,
    /// `(N−1)/N·S`.
    pub all_gather: f64,
}

/// Everything `oxccl-plan comm` answers; the closed-form times are the
/// top-level `all_reduce_s`, `reduce_scatter_s`, `all_gather_s`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CommPlan {
    /// `S`.
    pub bytes: u64,
    /// `N`.
    pub ranks: u64,
    /// `β` in bytes per second.
    pub bandwidth_bytes_per_s: f64,
    /// `α` in seconds.
    pub latency_s: f64,
    /// Reduction throughput (`γ = 1/reduce_bw`), `None` when free.
    pub reduce_bw_bytes_per_s: Option<f64>,
    /// The closed forms.
    #[serde(flatten)]
    pub closed_form: RingTimes,
    /// Bytes each rank sends.
    pub sent_per_rank: SentPerRank,
    /// The simulator's times, `None` when skipped.
    pub simulated: Option<Simulated>,
    /// Simulated over closed form, per collective.
    pub sim_over_closed: Option<RingTimes>,
    /// Why there is no simulation.
    pub simulation_skipped: Option<String>,
}

/// The closed forms of `bytes` on `ranks` over `link` and, if `simulate`,
/// the simulator's times of the ring programs built with `opts`.
pub fn plan(
    ranks: usize,
    bytes: u64,
    link: Link,
    reduce_bw: Option<f64>,
    opts: &BuildOptions,
    run_sim: bool,
) -> CommPlan {
    let closed_form = closed_form(ranks, bytes, link, reduce_bw.map_or(0.0, |bw| 1.0 / bw));
    let sim = if run_sim {
        simulate(ranks, bytes, link, reduce_bw.unwrap_or(f64::INFINITY), opts)
    } else {
        Err("not asked for (--no-sim)".to_string())
    };
    let (all_reduce, one) = bytes_sent_per_rank(ranks as u64, bytes as f64);
    let (simulated, simulation_skipped) = match sim {
        Ok(s) => (Some(s), None),
        Err(why) => (None, Some(why)),
    };
    CommPlan {
        bytes,
        ranks: ranks as u64,
        bandwidth_bytes_per_s: link.bw,
        latency_s: link.lat,
        reduce_bw_bytes_per_s: reduce_bw,
        closed_form,
        sent_per_rank: SentPerRank { all_reduce, reduce_scatter: one, all_gather: one },
        sim_over_closed: simulated.as_ref().map(|s| s.times.ratio(&closed_form)),
        simulated,
        simulation_skipped,
    }
}

/// One collective of a training step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepCollective {
    /// `all_reduce`, `reduce_scatter` or `all_gather`.
    pub collective: &'static str,
    /// What it moves and when.
    pub of: &'static str,
    /// `S`: the whole buffer, `Ψ'` elements.
    pub bytes: f64,
    /// Bytes each rank sends in a ring.
    pub sent_per_rank: f64,
    /// Closed-form ring time, when a link was given.
    pub time_s: Option<f64>,
}

/// The collectives of one training step of a stage.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepVolume {
    /// Elements moved per parameter: 2 (DDP, ZeRO-1, ZeRO-2) or 3 (ZeRO-3).
    pub elements_per_param: f64,
    /// `elements_per_param · Ψ'`.
    pub elements: f64,
    /// The collectives, in the order a step runs them.
    pub collectives: Vec<StepCollective>,
    /// Bytes each rank sends in all of them (ring).
    pub sent_per_rank: f64,
    /// Their closed-form ring times added up, when a link was given.
    pub time_s: Option<f64>,
}

/// A step's collectives under `stage` for `psi` parameters per
/// model-parallel rank on `dp` data-parallel ranks, parameters of
/// `param_bytes` and gradients of `grad_bytes` per element; timed with
/// the closed forms when `link` (and `gamma`) is given.
pub fn step_volume(
    stage: Stage,
    psi: f64,
    dp: u64,
    param_bytes: f64,
    grad_bytes: f64,
    link: Option<(Link, f64)>,
) -> StepVolume {
    use CollKind::{AllGather, AllReduce, ReduceScatter};
    let plan: &[(CollKind, &str)] = match stage {
        Stage::Ddp => &[(AllReduce, "gradients, after the backward pass")],
        Stage::Zero1 | Stage::Zero2 => {
            &[(ReduceScatter, "gradients, after the backward pass"), (AllGather, "parameters, after the update")]
        }
        Stage::Zero3 => &[
            (AllGather, "parameters, in the forward pass"),
            (AllGather, "parameters, in the backward pass"),
            (ReduceScatter, "gradients, in the backward pass"),
        ],
    };
    let n = usize::try_from(dp).unwrap_or(usize::MAX);
    let collectives: Vec<StepCollective> = plan
        .iter()
        .map(|&(kind, of)| {
            let bytes = psi * if kind == AllGather { param_bytes } else { grad_bytes };
            let (ar, one) = bytes_sent_per_rank(dp, bytes);
            let t = link.map(|(l, g)| {
                let s = bytes.round() as usize;
                match kind {
                    AllReduce => ring_all_reduce(n, s, l, g),
                    ReduceScatter => ring_reduce_scatter(n, s, l, g),
                    _ => ring_all_gather(n, s, l),
                }
            });
            let name = match kind {
                AllReduce => "all_reduce",
                ReduceScatter => "reduce_scatter",
                _ => "all_gather",
            };
            StepCollective {
                collective: name,
                of,
                bytes,
                sent_per_rank: if kind == AllReduce { ar } else { one },
                time_s: t,
            }
        })
        .collect();
    let elements_per_param = if stage == Stage::Zero3 { 3.0 } else { 2.0 };
    StepVolume {
        elements_per_param,
        elements: elements_per_param * psi,
        sent_per_rank: collectives.iter().map(|c| c.sent_per_rank).sum(),
        time_s: link.map(|_| collectives.iter().filter_map(|c| c.time_s).sum()),
        collectives,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_forms_by_hand() {
        // S = 1 GB, N = 16, 25 GB/s, 5 µs: a hop is 5e-6 + 1e9/16/25e9 = 2.505 ms.
        let link = Link::new(25e9, 5e-6);
        let t = closed_form(16, 1_000_000_000, link, 0.0);
        assert!((t.all_reduce_s - 30.0 * 2.505e-3).abs() < 1e-12, "{t:?}");
        assert!((t.reduce_scatter_s - 15.0 * 2.505e-3).abs() < 1e-12, "{t:?}");
        assert!((t.all_gather_s - 15.0 * 2.505e-3).abs() < 1e-12, "{t:?}");
        // γ adds (N−1)/N·S·γ to the reducing ones only.
        let g = closed_form(16, 1_000_000_000, link, 1.0 / 100e9);
        assert!((g.all_reduce_s - t.all_reduce_s - 15.0 / 16.0 * 0.01).abs() < 1e-12);
        assert_eq!(g.all_gather_s, t.all_gather_s);
    }

    #[test]
    fn per_rank_bytes_are_the_ring_volumes() {
        assert_eq!(bytes_sent_per_rank(4, 1000.0), (1500.0, 750.0));
    }

    #[test]
    fn zero3_moves_half_again_as_much_as_ddp() {
        let v = |s| step_volume(s, 1000.0, 8, 2.0, 2.0, None);
        let (ddp, z1, z3) = (v(Stage::Ddp), v(Stage::Zero1), v(Stage::Zero3));
        assert_eq!(ddp.collectives.len(), 1);
        assert_eq!(ddp.sent_per_rank, 2.0 * 7.0 / 8.0 * 2000.0);
        assert_eq!(z1.sent_per_rank, ddp.sent_per_rank);
        assert_eq!(z3.sent_per_rank, 1.5 * ddp.sent_per_rank);
        assert_eq!((z3.elements_per_param, z3.elements), (3.0, 3000.0));
        // Megatron's bf16/fp32 row reduces 4-byte gradients, gathers 2-byte parameters.
        let m = step_volume(Stage::Zero1, 1000.0, 8, 2.0, 4.0, None);
        assert_eq!(m.collectives[0].bytes, 4000.0);
        assert_eq!(m.collectives[1].bytes, 2000.0);
    }
}
