//! The planner against published numbers and numbers worked out by hand
//! from each source's formula.

use oxccl_algo::algos::BuildOptions;
use oxccl_algo::cost::Link;
use oxccl_plan::comm::{closed_form, simulate};
use oxccl_plan::memory::{Model, Stage};
use oxccl_plan::pipeline::bubble;
use oxccl_plan::plan::{memory, min_gpus_for};
use oxccl_plan::variants::{Precision, Variant};

/// Rounds `v` to `digits` significant digits, as a paper prints it.
fn sig(v: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits - 1 - v.abs().log10().floor() as i32);
    (v * scale).round() / scale
}

fn gb_of(variant: &Variant, model: &Model, dp: u64, stage: Stage) -> Option<f64> {
    memory(model, dp, variant, None, 0.0, None).stages.get(stage).gb
}

#[test]
fn zero_paper_figure_1_at_7_5b_parameters_on_64_gpus() {
    // Rajbhandari et al. (SC'20), Figure 1: Ψ = 7.5B, N_d = 64, K = 12:
    // 120 GB, 31.4 GB, 16.6 GB, 1.88 GB.
    let (m, v) = (Model::new(7_500_000_000), Variant::default());
    let got: Vec<f64> = Stage::ALL.iter().map(|&s| gb_of(&v, &m, 64, s).unwrap()).collect();
    assert_eq!(got, [120.0, 31.40625, 16.640625, 1.875]);
    assert_eq!(sig(got[0], 3), 120.0);
    assert_eq!(sig(got[1], 3), 31.4);
    assert_eq!(sig(got[2], 3), 16.6);
    assert_eq!(sig(got[3], 3), 1.88);
}

#[test]
fn zero_paper_trillion_parameters_on_1024_gpus_need_16_gb_each() {
    // §1: "a trillion parameter model ... using 1024 GPUs" under P_os+g+p:
    // 16 × 10¹² / 1024 = 15.625 GB per GPU, the paper's "16 GB".
    let gb = gb_of(&Variant::default(), &Model::new(1_000_000_000_000), 1024, Stage::Zero3).unwrap();
    assert_eq!(gb, 15.625);
    assert_eq!(gb.round(), 16.0);
}

#[test]
fn model_parallelism_divides_before_data_parallelism() {
    // 70B over tp 8 × pp 4: Ψ' = 2.1875B; ZeRO-1 on 16 ranks:
    // 4·2.1875e9 + 12·2.1875e9/16 = 8.75e9 + 1.640625e9 bytes.
    let p = memory(&Model { params: 70_000_000_000, tp: 8, pp: 4 }, 16, &Variant::default(), Some(80e9), 0.0, None);
    assert_eq!(p.gpus, 512);
    assert_eq!(p.params_per_rank, 2.1875e9);
    assert_eq!(p.stages.zero1.bytes_per_rank, Some(8.75e9 + 1.640625e9));
    assert_eq!(p.stages.ddp.fits, Some(true)); // 35 GB
}

#[test]
fn seventy_billion_on_80gb_cannot_fit_zero1_at_any_count() {
    // ZeRO-1 keeps (P+G)Ψ = 4 × 70e9 = 280 GB on every rank: > 80 GB for
    // every N; with tp·pp = 4 that term is 70 GB and some N fits.
    let m = Model::new(70_000_000_000);
    let r = min_gpus_for(Stage::Zero1, &Variant::default(), &m, 80e9, 0.0);
    assert_eq!((r.min_gpus, r.dp), (None, None));
    let why = r.reason.as_deref().unwrap();
    assert!(why.contains("4·Ψ'") && why.contains("280 GB") && why.contains("exceeds the 80 GB"), "{why}");
    assert_eq!(r.min_model_parallel, Some(4));
    let with_tp4 = min_gpus_for(Stage::Zero1, &Variant::default(), &Model { tp: 4, ..m }, 80e9, 0.0);
    assert!(with_tp4.min_gpus.is_some());
    // DDP needs all 1120 GB in one replica: tp·pp ≥ 14.
    let ddp = min_gpus_for(Stage::Ddp, &Variant::default(), &m, 80e9, 0.0);
    assert_eq!((ddp.min_gpus, ddp.min_model_parallel), (None, Some(14)));
}

#[test]
fn fitting_counts_worked_by_hand() {
    let v = Variant::default();
    let m = Model::new(70_000_000_000);
    // ZeRO-3: 16·70e9/N ≤ 80e9 → N = 14 exactly.
    let r = min_gpus_for(Stage::Zero3, &v, &m, 80e9, 0.0);
    assert_eq!((r.min_gpus, r.dp, r.bytes_per_rank), (Some(14), Some(14), Some(80e9)));
    // With 20 GB reserved: 1120/N ≤ 60 → N = ⌈18.67⌉ = 19.
    assert_eq!(min_gpus_for(Stage::Zero3, &v, &m, 80e9, 20e9).min_gpus, Some(19));
    // ZeRO-2, tp 2 × pp 2: Ψ' = 17.5e9, 35 GB fixed, 245e9/N ≤ 45e9 → N = 6
    // (N = 5 gives 84 GB), 24 GPUs in all.
    let r = min_gpus_for(Stage::Zero2, &v, &Model { tp: 2, pp: 2, ..m }, 80e9, 0.0);
    assert_eq!((r.dp, r.min_gpus), (Some(6), Some(24)));
    // DDP with tp 16: Ψ' = 4.375e9, 70 GB fits on one replica of 16 GPUs.
    let r = min_gpus_for(Stage::Ddp, &v, &Model { tp: 16, ..m }, 80e9, 0.0);
    assert_eq!((r.dp, r.min_gpus), (Some(1), Some(16)));
    // GB against GiB: 16·65e9 = 1040 GB needs 13 GPUs of 80 GB (exactly),
    // 14 of 75 GB (13.9), but 13 of 75 GiB (80.5 GB each).
    let m65 = Model::new(65_000_000_000);
    assert_eq!(min_gpus_for(Stage::Zero3, &v, &m65, 80e9, 0.0).min_gpus, Some(13));
    assert_eq!(min_gpus_for(Stage::Zero3, &v, &m65, 75e9, 0.0).min_gpus, Some(14));
    assert_eq!(min_gpus_for(Stage::Zero3, &v, &m65, 75.0 * 1024f64.powi(3), 0.0).min_gpus, Some(13));
}

#[test]
fn deepspeed_estimators_reproduce_their_documented_example() {
    // DeepSpeed docs/code-docs/source/memory.rst, 2851M params, 1 node × 8
    // GPUs, largest layer 32M, offload none: ZeRO-2 "15.93GB" (printed
    // from the pre-v0.14.3 formula 4Ψ + int(16Ψ/N)), ZeRO-3 "6.09GB";
    // DeepSpeed's GB is gpu_mem/2**30.
    let m = Model::new(2_851_000_000);
    let legacy = Variant::DeepspeedLegacy { largest_layer: 32e6 };
    let current = Variant::Deepspeed { largest_layer: 32e6 };
    let z2_legacy = memory(&m, 8, &legacy, None, 0.0, None).stages.zero2;
    assert_eq!(z2_legacy.bytes_per_rank, Some(4.0 * 2851e6 + 5_702_000_000.0));
    assert_eq!((z2_legacy.gib.unwrap() * 100.0).round() / 100.0, 15.93);
    // v0.14.3 on: 2Ψ + int(18Ψ/N) = 5702e6 + 6414750000.
    let z2 = memory(&m, 8, &current, None, 0.0, None).stages.zero2;
    assert_eq!(z2.bytes_per_rank, Some(12_116_750_000.0));
    // ZeRO-3: 4·32e6 + int(18·2851e6/8) = 128e6 + 6414750000.
    let z3 = memory(&m, 8, &current, None, 0.0, None).stages.zero3;
    assert_eq!(z3.bytes_per_rank, Some(6_542_750_000.0));
    assert_eq!((z3.gib.unwrap() * 100.0).round() / 100.0, 6.09);
    // int() rounds the sharded part down: 18·1001/8 = 2252.25 → 2252.
    let small = memory(&Model::new(1001), 8, &current, None, 0.0, None).stages.zero2;
    assert_eq!(small.bytes_per_rank, Some(2002.0 + 2252.0));
    // No DDP or ZeRO-1 estimator: null with a reason.
    let ddp = memory(&m, 8, &current, None, 0.0, None).stages.ddp;
    assert_eq!(ddp.bytes_per_rank, None);
    assert!(ddp.reason.unwrap().contains("estimate_zero2_model_states_mem_needs"));
}

#[test]
fn megatron_table_by_hand() {
    // Megatron-LM dist_optimizer.md, bytes per parameter, d = 64, Ψ = 7.5B.
    let m = Model::new(7_500_000_000);
    let rows = [
        (Precision::Fp16, 20.0 * 7.5e9, 4.0 * 7.5e9 + 16.0 * 7.5e9 / 64.0),
        (Precision::Bf16, 18.0 * 7.5e9, 6.0 * 7.5e9 + 12.0 * 7.5e9 / 64.0),
        (Precision::Fp32, 16.0 * 7.5e9, 8.0 * 7.5e9 + 8.0 * 7.5e9 / 64.0),
    ];
    for (precision, ddp, dist) in rows {
        let p = memory(&m, 64, &Variant::Megatron { precision }, None, 0.0, None);
        assert_eq!(p.stages.ddp.bytes_per_rank, Some(ddp), "{precision:?}");
        assert_eq!(p.stages.zero1.bytes_per_rank, Some(dist), "{precision:?}");
        assert!(p.stages.zero2.reason.is_some() && p.stages.zero3.reason.is_some());
    }
    // bf16: 45 GB + 1.40625 GB.
    assert_eq!(gb_of(&Variant::Megatron { precision: Precision::Bf16 }, &m, 64, Stage::Zero1), Some(46.40625));
}

#[test]
fn ring_closed_forms_by_hand() {
    // S = 1e9 B, N = 16, β = 25e9 B/s, α = 5 µs: one hop α + S/(Nβ) =
    // 5e-6 + 2.5e-3 = 2.505e-3 s; all-reduce 30 hops, RS and AG 15.
    let t = closed_form(16, 1_000_000_000, Link::new(25e9, 5e-6), 0.0);
    assert!((t.all_reduce_s - 0.075_15).abs() < 1e-12, "{t:?}");
    assert!((t.reduce_scatter_s - 0.037_575).abs() < 1e-12, "{t:?}");
    assert!((t.all_gather_s - 0.037_575).abs() < 1e-12, "{t:?}");
    // Latency-bound: 8 bytes on 1024 ranks ≈ 2·1023·5 µs.
    let small = closed_form(1024, 8, Link::new(25e9, 5e-6), 0.0);
    assert!((small.all_reduce_s - 2.0 * 1023.0 * 5e-6).abs() < 1e-9);
}

#[test]
fn the_simulator_agrees_with_the_closed_form() {
    let (n, s, link) = (16usize, 1_000_000_000u64, Link::new(25e9, 5e-6));
    let closed = closed_form(n, s, link, 0.0);
    // One chunk per block: every hop is α + S/(Nβ) on the critical path,
    // exactly the closed form; the tolerance is float rounding only
    // (the simulator adds the hops one at a time).
    let one = BuildOptions { max_chunks: 1, ..BuildOptions::default() };
    let sim = simulate(n, s, link, f64::INFINITY, &one).unwrap();
    assert_eq!(sim.chunks, 1);
    for (a, b) in [
        (sim.times.all_reduce_s, closed.all_reduce_s),
        (sim.times.reduce_scatter_s, closed.reduce_scatter_s),
        (sim.times.all_gather_s, closed.all_gather_s),
    ] {
        assert!((a / b - 1.0).abs() < 1e-9, "simulated {a} vs closed {b}");
    }
    // oxccl-sim's default chunking (2 MiB chunks: k = ⌈62.5e6/2²¹⌉ = 30)
    // runs each chunk's whole ring in turn, so every hop pays α k times:
    // 2(N−1)(k·α + S/(Nβ)). Chunks differ by at most a byte, so a hop may
    // take one byte-time (1/β) longer: the bound is 2(N−1)·k/β.
    let sim = simulate(n, s, link, f64::INFINITY, &BuildOptions::default()).unwrap();
    assert_eq!(sim.chunks, 30);
    let k = 30.0;
    let hops = 2.0 * 15.0;
    let want = hops * (k * 5e-6 + 1e9 / 16.0 / 25e9);
    assert!((sim.times.all_reduce_s - want).abs() <= hops * k / 25e9 + 1e-12, "{} vs {want}", sim.times.all_reduce_s);
    assert!(sim.times.all_reduce_s > closed.all_reduce_s);
    let want_rs = want / 2.0;
    assert!((sim.times.reduce_scatter_s - want_rs).abs() <= hops * k / 25e9, "{}", sim.times.reduce_scatter_s);
    assert!((sim.times.all_gather_s - want_rs).abs() <= hops * k / 25e9, "{}", sim.times.all_gather_s);
}

#[test]
fn big_rings_are_simulated_with_fewer_chunks_or_not_at_all() {
    // 512 ranks, 10 GB: oxccl-sim would cut a 19.5 MB block into 10 chunks;
    // 2·512·511 steps per chunk allow 7 under MAX_STEPS.
    let link = Link::new(25e9, 5e-6);
    let sim = simulate(512, 10_000_000_000, link, f64::INFINITY, &BuildOptions::default()).unwrap();
    assert_eq!((sim.chunks, sim.chunks_capped_from), (7, Some(10)));
    let err = simulate(4096, 1_000_000, link, f64::INFINITY, &BuildOptions::default()).unwrap_err();
    assert!(err.contains("4096 ranks") && err.contains("oxccl-sim"), "{err}");
}

#[test]
fn pipeline_bubble_of_8_stages_and_16_microbatches() {
    let b = bubble(8, 16, 1);
    assert_eq!(b.bubble_fraction, 7.0 / 23.0);
    assert_eq!(bubble(8, 16, 4).bubble_over_ideal, 7.0 / 64.0);
}
