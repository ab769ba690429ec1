//! The `oxccl-plan` binary: its JSON shapes, its tables, `--explain`, and
//! errors that name the flag, exit with 2 and print nothing on stdout.

use serde_json::Value;
use std::process::{Command, Output};

fn plan(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_oxccl-plan")).args(args).output().expect("oxccl-plan runs")
}

fn stdout(args: &[&str]) -> String {
    let out = plan(args);
    assert!(out.status.success(), "{args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn json(args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.push("--json");
    let text = stdout(&a);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}):\n{text}"))
}

/// Runs a command that must be refused; returns its stderr.
fn refused(args: &[&str]) -> String {
    let out = plan(args);
    assert_eq!(out.status.code(), Some(2), "{args:?} should exit with 2");
    assert!(out.stdout.is_empty(), "{args:?} printed on stdout: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8(out.stderr).unwrap()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("{v} is not a number"))
}

#[test]
fn memory_json_has_every_stage() {
    let v = json(&["memory", "--params", "7.5e9", "--dp", "64"]);
    let s = &v["stages"];
    assert_eq!(f(&s["ddp"]["bytes_per_rank"]), 120e9);
    assert_eq!(f(&s["zero1"]["bytes_per_rank"]), 31.40625e9);
    assert_eq!(f(&s["zero2"]["bytes_per_rank"]), 16.640625e9);
    assert_eq!(f(&s["zero3"]["bytes_per_rank"]), 1.875e9);
    assert_eq!(f(&s["zero3"]["gb"]), 1.875);
    assert!((f(&s["zero3"]["gib"]) - 1.875e9 / 1024f64.powi(3)).abs() < 1e-12);
    assert_eq!(s["zero1"]["formula"], "4Ψ + 12Ψ/N");
    // A step's communication: 2Ψ elements for DDP, 3Ψ for ZeRO-3, bf16.
    assert_eq!(f(&s["ddp"]["comm_per_step"]["elements_per_param"]), 2.0);
    assert_eq!(f(&s["zero3"]["comm_per_step"]["elements_per_param"]), 3.0);
    assert_eq!(f(&s["ddp"]["comm_per_step"]["sent_per_rank"]), 2.0 * 63.0 / 64.0 * 15e9);
    assert_eq!(v["dp"], 64);
    assert_eq!(v["variant"]["name"], "zero");
}

#[test]
fn memory_with_model_parallelism_and_a_gpu_size() {
    let v = json(&["memory", "--params", "7.5B", "--gpus", "64", "--tp", "2", "--pp", "2", "--gpu-mem", "80GB"]);
    assert_eq!((v["dp"].as_u64(), v["gpus"].as_u64()), (Some(16), Some(64)));
    assert_eq!(f(&v["params_per_rank"]), 1.875e9);
    assert_eq!(f(&v["stages"]["ddp"]["bytes_per_rank"]), 30e9);
    assert_eq!(v["stages"]["ddp"]["fits"], true);
    // 30 GB of states + a 60 GB reserve do not fit in 80 GB.
    let v = json(&["memory", "--params", "7.5B", "--dp", "16", "--tp", "4", "--gpu-mem", "80GB", "--reserve", "60GB"]);
    assert_eq!(v["stages"]["ddp"]["fits"], false);
    assert_eq!(v["stages"]["zero3"]["fits"], true);
}

#[test]
fn memory_optimizer_bytes_are_configurable() {
    // fp32 SGD with momentum: P = 4, G = 4, O = 4 → DDP 12Ψ.
    let v = json(&[
        "memory",
        "--params",
        "1e9",
        "--dp",
        "4",
        "--param-bytes",
        "4",
        "--grad-bytes",
        "4",
        "--optimizer-bytes",
        "4",
    ]);
    assert_eq!(f(&v["stages"]["ddp"]["bytes_per_rank"]), 12e9);
    assert_eq!(f(&v["stages"]["zero2"]["bytes_per_rank"]), 4e9 + 8e9 / 4.0);
    // The parts of O: master 4 + 2 × moment 2 = 8.
    let v = json(&["memory", "--params", "1e9", "--dp", "4", "--moment-bytes", "2"]);
    assert_eq!(f(&v["stages"]["ddp"]["bytes_per_rank"]), (2.0 + 2.0 + 8.0) * 1e9);
}

#[test]
fn memory_step_times_with_a_link() {
    let v = json(&["memory", "--params", "1e9", "--dp", "16", "--bandwidth", "25GB/s", "--latency", "5us"]);
    // DDP: all-reduce of 2 GB of bf16 gradients: 30·(5e-6 + 2e9/16/25e9).
    let t = f(&v["stages"]["ddp"]["comm_per_step"]["time_s"]);
    assert!((t - 30.0 * (5e-6 + 5e-3)).abs() < 1e-12, "{t}");
    // ZeRO-3: three 2 GB collectives of 15 hops each.
    let t3 = f(&v["stages"]["zero3"]["comm_per_step"]["time_s"]);
    assert!((t3 - 45.0 * (5e-6 + 5e-3)).abs() < 1e-12, "{t3}");
}

#[test]
fn variants_are_selectable() {
    let v = json(&["memory", "--params", "2851M", "--dp", "8", "--variant", "deepspeed", "--largest-layer", "32M"]);
    assert_eq!(f(&v["stages"]["zero3"]["bytes_per_rank"]), 6_542_750_000.0);
    assert!(v["stages"]["ddp"]["bytes_per_rank"].is_null());
    assert!(v["stages"]["ddp"]["reason"].as_str().unwrap().contains("ZeRO-2"));
    assert!(v["source"].as_str().unwrap().contains("stage_1_and_2.py"));
    // Without --largest-layer the 4·L term is 0, and the output says so.
    let v = json(&["memory", "--params", "2851M", "--dp", "8", "--variant", "deepspeed"]);
    assert_eq!(f(&v["stages"]["zero3"]["bytes_per_rank"]), 6_414_750_000.0);
    assert!(v["stages"]["zero3"]["note"].as_str().unwrap().contains("--largest-layer"));
    let v = json(&["memory", "--params", "7.5e9", "--dp", "64", "--variant", "megatron", "--precision", "fp32"]);
    assert_eq!(f(&v["stages"]["zero1"]["bytes_per_rank"]), 60.9375e9);
    assert!(v["source"].as_str().unwrap().contains("dist_optimizer.md"));
}

#[test]
fn min_gpus_json_one_stage() {
    // The bare formula (no reserve): 16·70e9/N ≤ 80e9 → N = 14.
    let v = json(&["min-gpus", "--params", "70e9", "--gpu-mem", "80GB", "--stage", "3", "--reserve", "0"]);
    assert_eq!(v["min_gpus"], 14);
    assert_eq!(v["dp"], 14);
    assert!(v["reason"].is_null());
    let v = json(&["min-gpus", "--params", "70e9", "--gpu-mem", "80GB", "--stage", "1"]);
    assert!(v["min_gpus"].is_null());
    let why = v["reason"].as_str().unwrap();
    assert!(why.contains("280 GB") && why.contains("tp·pp ≥ 4"), "{why}");
    assert_eq!(v["min_model_parallel"], 4);
}

#[test]
fn min_gpus_json_every_stage() {
    let v = json(&["min-gpus", "--params", "70e9", "--gpu-mem", "80GB", "--tp", "8", "--reserve", "0"]);
    let s = &v["stages"];
    // Ψ' = 8.75e9: DDP 140 GB never; ZeRO-1 35 GB + 105/N → N = 3;
    // ZeRO-2 17.5 GB + 122.5/N → N = 2; ZeRO-3 140/N → N = 2; ×8 GPUs.
    assert!(s["ddp"]["min_gpus"].is_null());
    assert_eq!(s["zero1"]["min_gpus"], 24);
    assert_eq!(s["zero2"]["min_gpus"], 16);
    assert_eq!(s["zero3"]["min_gpus"], 16);
    assert_eq!(s["zero1"]["dp"], 3);
}

#[test]
fn min_gpus_keeps_a_default_reserve_and_says_so() {
    // 10% of 80 GB kept free: 1120 GB / N ≤ 72 GB → N = 16 (not 14).
    let v = json(&["min-gpus", "--params", "70e9", "--gpu-mem", "80GB", "--stage", "3"]);
    assert_eq!(v["min_gpus"], 16);
    assert_eq!(f(&v["reserve"]), 8e9);
    assert_eq!(v["reserve_assumed"], true);
    assert_eq!(f(&v["reserve_rule"]["fraction"]), 0.1);
    let t = stdout(&["min-gpus", "--params", "70e9", "--gpu-mem", "80GB", "--stage", "3"]);
    assert!(t.contains("# reserve: 10% of the GPU = 8 GB (7.451 GiB) kept free") && t.contains("the default"), "{t}");
    assert!(t.lines().any(|l| l.starts_with("ZeRO-3") && l.contains("16")), "{t}");
    // A size or a share instead: 1120/N ≤ 60 → N = 19, either way.
    for reserve in ["20GB", "25%"] {
        let v = json(&["min-gpus", "--params", "70e9", "--gpu-mem", "80GB", "--stage", "3", "--reserve", reserve]);
        assert_eq!((v["min_gpus"].as_u64(), f(&v["reserve"])), (Some(19), 20e9), "--reserve {reserve}");
        assert_eq!(v["reserve_assumed"], false);
    }
    let t = stdout(&["min-gpus", "--params", "70e9", "--gpu-mem", "80GB", "--reserve", "0"]);
    assert!(t.contains("# reserve: none kept free"), "{t}");
    // memory's fits column keeps the same reserve: 70 GB + 8 GB fit in 80 GB, 75 GB + 8 GB do not.
    let fits = |params: &str| {
        let v = json(&["memory", "--params", params, "--dp", "16", "--stage", "3", "--gpu-mem", "80GB"]);
        assert_eq!((f(&v["reserve"]), &v["reserve_assumed"]), (8e9, &Value::Bool(true)));
        v["fits"].as_bool().unwrap()
    };
    assert!(fits("70e9"));
    assert!(!fits("75e9"));
}

#[test]
fn memory_stage_shows_that_stage_only() {
    let v = json(&["memory", "--params", "7.5e9", "--dp", "64", "--stage", "3"]);
    assert_eq!(v["stage"], "zero3");
    assert_eq!(f(&v["bytes_per_rank"]), 1.875e9);
    assert_eq!(v["formula"], "16Ψ/N");
    assert_eq!(f(&v["comm_per_step"]["elements_per_param"]), 3.0);
    assert!(v.get("stages").is_none(), "{v}");
    assert_eq!(v["dp"], 64);
    // The same answer as in the all-stage output.
    let all = json(&["memory", "--params", "7.5e9", "--dp", "64"]);
    assert_eq!(all["stages"]["zero3"]["bytes_per_rank"], v["bytes_per_rank"]);
    let t = stdout(&["memory", "--params", "7.5e9", "--dp", "64", "--stage", "zero-1", "--explain"]);
    let rows: Vec<&str> = t.lines().filter(|l| ["DDP", "ZeRO-"].iter().any(|s| l.starts_with(s))).collect();
    assert_eq!(rows.len(), 1, "{t}");
    assert!(rows[0].starts_with("ZeRO-1") && rows[0].contains("31.41"), "{t}");
    // --explain: that stage's formula, not the others'.
    assert!(t.contains("  ZeRO-1  (P+G)·Ψ + O·Ψ/N = 4Ψ + 12Ψ/N"), "{t}");
    assert!(!t.contains("= 16Ψ =") && !t.contains("= 2Ψ + 14Ψ/N =") && !t.contains("= 16Ψ/N ="), "{t}");
}

#[test]
fn comm_latency_defaults_to_5us_and_says_so() {
    let base = ["comm", "--bytes", "1e9", "--ranks", "16", "--bandwidth", "25GB/s", "--no-sim"];
    let v = json(&base);
    assert_eq!(f(&v["latency_s"]), 5e-6);
    assert_eq!(v["latency_assumed"], true);
    let mut given = base.to_vec();
    given.extend(["--latency", "5us"]);
    let g = json(&given);
    assert_eq!(g["latency_assumed"], false);
    assert_eq!(g["all_reduce_s"], v["all_reduce_s"]);
    let t = stdout(&base);
    assert!(t.contains("α = 5 us (assumed: the --latency default"), "{t}");
    assert!(!stdout(&given).contains("assumed"));
    // memory's step times take the same default, and say so.
    let m = json(&["memory", "--params", "1e9", "--dp", "16", "--bandwidth", "25GB/s"]);
    assert_eq!((f(&m["latency_s"]), &m["latency_assumed"]), (5e-6, &Value::Bool(true)));
    let t = f(&m["stages"]["ddp"]["comm_per_step"]["time_s"]);
    assert!((t - 30.0 * (5e-6 + 5e-3)).abs() < 1e-12, "{t}");
    let text = stdout(&["memory", "--params", "1e9", "--dp", "16", "--bandwidth", "25GB/s"]);
    assert!(text.contains("# comm time: ring closed forms over a link of β = 25GB/s, α = 5 us (assumed"), "{text}");
}

#[test]
fn gigabytes_are_decimal_and_gibibytes_binary_and_print_as_such() {
    let v = json(&["min-gpus", "--params", "70e9", "--gpu-mem", "80GiB", "--reserve", "0", "--stage", "3"]);
    assert_eq!(f(&v["gpu_mem"]), 80.0 * 1024f64.powi(3));
    // 1120e9 / N ≤ 85.9e9 → N = 14 (13.04 → 14); at 80GB it is also 14, at 75GB 15.
    assert_eq!(v["min_gpus"], 14);
    let t = stdout(&["min-gpus", "--params", "70e9", "--gpu-mem", "80GiB", "--reserve", "0"]);
    assert!(t.contains("GPUs of 85.9 GB (80 GiB)"), "{t}");
    let t = stdout(&["min-gpus", "--params", "70e9", "--gpu-mem", "80GB", "--reserve", "0"]);
    assert!(t.contains("GPUs of 80 GB (74.51 GiB)"), "{t}");
}

#[test]
fn comm_json_has_closed_form_and_simulation() {
    let v = json(&["comm", "--bytes", "1e9", "--ranks", "16", "--bandwidth", "25GB/s", "--latency", "5us"]);
    assert!((f(&v["all_reduce_s"]) - 0.07515).abs() < 1e-12);
    assert!((f(&v["reduce_scatter_s"]) - 0.037575).abs() < 1e-12);
    assert!((f(&v["all_gather_s"]) - 0.037575).abs() < 1e-12);
    let sim = &v["simulated"];
    assert_eq!(sim["chunks"], 30);
    // 2(N−1)(k·α + S/(Nβ)) with k = 30 (see tests/published.rs).
    assert!((f(&sim["all_reduce_s"]) - 30.0 * (30.0 * 5e-6 + 2.5e-3)).abs() < 1e-6);
    let ratio = f(&v["sim_over_closed"]["all_reduce_s"]);
    assert!((ratio - f(&sim["all_reduce_s"]) / f(&v["all_reduce_s"])).abs() < 1e-12);
    assert_eq!(f(&v["sent_per_rank"]["all_reduce"]), 1.875e9);
    let v = json(&["comm", "--bytes", "1e9", "--ranks", "16", "--bandwidth", "25GB/s", "--latency", "5us", "--no-sim"]);
    assert!(v["simulated"].is_null());
    assert!(v["simulation_skipped"].as_str().unwrap().contains("--no-sim"));
}

#[test]
fn comm_reduction_term_is_opt_in() {
    let base = ["comm", "--bytes", "1e9", "--ranks", "16", "--bandwidth", "25GB/s", "--latency", "5us", "--no-sim"];
    let v = json(&base);
    let mut with_gamma = base.to_vec();
    with_gamma.extend(["--reduce-bw", "100GB/s"]);
    let g = json(&with_gamma);
    // + (N−1)/N·S·γ = 15/16 · 1e9 / 100e9 on the reducing collectives only.
    assert!((f(&g["all_reduce_s"]) - f(&v["all_reduce_s"]) - 0.009375).abs() < 1e-12);
    assert!((f(&g["reduce_scatter_s"]) - f(&v["reduce_scatter_s"]) - 0.009375).abs() < 1e-12);
    assert_eq!(f(&g["all_gather_s"]), f(&v["all_gather_s"]));
}

#[test]
fn bubble_json() {
    let v = json(&["bubble", "--stages", "8", "--microbatches", "16"]);
    assert_eq!(f(&v["bubble_fraction"]), 7.0 / 23.0);
    assert_eq!(f(&v["bubble_over_ideal"]), 7.0 / 16.0);
}

#[test]
fn tables_and_explanations_for_people() {
    let t = stdout(&["memory", "--params", "7.5e9", "--dp", "64"]);
    assert!(t.contains("stage") && t.contains("GB/GPU") && t.contains("GiB/GPU"), "{t}");
    let zero1 = t.lines().find(|l| l.starts_with("ZeRO-1")).unwrap();
    assert!(zero1.contains("31.41") && zero1.contains("29.25"), "{zero1}");
    assert!(!t.contains("Formulas"));
    let e = stdout(&["memory", "--params", "7.5e9", "--dp", "64", "--explain"]);
    assert!(e.contains("Formulas:") && e.contains("(P+G)·Ψ + O·Ψ/N") && e.contains("Rajbhandari"), "{e}");
    let c = stdout(&["comm", "--bytes", "1e9", "--ranks", "16", "--bandwidth", "25GB/s", "--latency", "5us"]);
    assert!(c.contains("closed form") && c.contains("simulated") && c.contains("sim/closed"), "{c}");
    assert!(c.lines().any(|l| l.starts_with("all_reduce") && l.contains("75.15 ms") && l.contains("1.058")), "{c}");
    let m = stdout(&["min-gpus", "--params", "70e9", "--gpu-mem", "80GB", "--reserve", "0"]);
    assert!(m.lines().any(|l| l.starts_with("ZeRO-3") && l.contains("14")), "{m}");
    assert!(m.contains("# ZeRO-1: no GPU count fits"), "{m}");
    let b = stdout(&["bubble", "--stages", "8", "--microbatches", "16"]);
    assert!(b.contains("0.3043") && b.contains("7/23"), "{b}");
    // --explain with --json: an "explain" array.
    let v = json(&["bubble", "--stages", "8", "--microbatches", "16", "--explain"]);
    assert!(v["explain"].as_array().is_some_and(|a| !a.is_empty()));
}

#[test]
fn counts_in_any_spelling_agree() {
    let a = json(&["memory", "--params", "7.5B", "--dp", "64"]);
    let b = json(&["memory", "--params", "7500000000", "--dp", "6.4e1"]);
    assert_eq!(a["stages"], b["stages"]);
}

#[test]
fn bad_input_names_the_flag_and_exits_2() {
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["comm", "--bytes", "1e9", "--ranks", "0", "--bandwidth", "25GB/s", "--latency", "5us"],
            &["--ranks", "'0'", "at least 1"],
        ),
        (&["comm", "--bytes", "-5", "--ranks", "4", "--bandwidth", "25GB/s", "--latency", "5us"], &["--bytes", "-5"]),
        (
            &["comm", "--bytes", "1e9", "--ranks", "4", "--bandwidth", "fast", "--latency", "5us"],
            &["--bandwidth", "fast"],
        ),
        (
            &["comm", "--bytes", "1e9", "--ranks", "4", "--bandwidth", "25GB/s", "--latency", "-1us"],
            &["--latency", "-1us"],
        ),
        (&["comm", "--bytes", "0", "--ranks", "4", "--bandwidth", "25GB/s", "--latency", "5us"], &["--bytes 0"]),
        (&["memory", "--params", "banana", "--dp", "4"], &["--params", "banana", "not a number"]),
        (&["memory", "--params", "-7e9", "--dp", "4"], &["--params", "-7e9"]),
        (&["memory", "--params", "7.5e9", "--dp", "2.5"], &["--dp", "2.5", "whole number"]),
        (&["memory", "--params", "7.5e9", "--gpus", "64", "--tp", "3"], &["--gpus 64", "tp·pp = 3"]),
        (&["memory", "--params", "7.5e9"], &["--dp", "--gpus"]),
        (
            &["memory", "--params", "100", "--dp", "1", "--tp", "64", "--pp", "4"],
            &["--tp 64", "--pp 4", "less than one"],
        ),
        (
            &["memory", "--params", "7.5e9", "--dp", "4", "--variant", "megatron", "--param-bytes", "4"],
            &["--param-bytes", "megatron"],
        ),
        (&["memory", "--params", "7.5e9", "--dp", "4", "--precision", "bf16"], &["--precision", "megatron"]),
        (&["memory", "--params", "7.5e9", "--dp", "4", "--largest-layer", "1e6"], &["--largest-layer", "deepspeed"]),
        (&["memory", "--params", "7.5e9", "--dp", "4", "--grad-bytes", "-2"], &["--grad-bytes", "-2"]),
        (&["memory", "--params", "7.5e9", "--dp", "4", "--variant", "colossal"], &["--variant", "colossal"]),
        (&["min-gpus", "--params", "70e9", "--gpu-mem", "80G"], &["--gpu-mem", "80G", "ambiguous"]),
        (&["min-gpus", "--params", "70e9", "--gpu-mem", "0"], &["--gpu-mem"]),
        (&["min-gpus", "--params", "70e9", "--gpu-mem", "80GB", "--reserve", "90GB"], &["--reserve", "--gpu-mem"]),
        (&["min-gpus", "--params", "70e9", "--gpu-mem", "80GB", "--stage", "5"], &["--stage", "'5'"]),
        (&["min-gpus", "--params", "70e9", "--gpu-mem", "80GB", "--reserve", "100%"], &["--reserve", "below 100%"]),
        (&["min-gpus", "--params", "70e9", "--gpu-mem", "80GB", "--reserve", "8G"], &["--reserve", "ambiguous"]),
        (&["memory", "--params", "7.5e9", "--dp", "4", "--reserve", "8GB"], &["--reserve", "--gpu-mem"]),
        (&["memory", "--params", "7.5e9", "--dp", "4", "--stage", "7"], &["--stage", "'7'", "not a stage"]),
        (&["memory", "--params", "7.5e9", "--dp", "4", "--latency", "5us"], &["--latency", "--bandwidth"]),
        (&["bubble", "--stages", "0", "--microbatches", "4"], &["--stages", "'0'"]),
        (&["bubble", "--stages", "8", "--microbatches", "nonsense"], &["--microbatches", "nonsense"]),
    ];
    for (args, needles) in cases {
        let err = refused(args);
        for n in *needles {
            assert!(err.contains(n), "{args:?}: {n:?} not in {err:?}");
        }
    }
}
