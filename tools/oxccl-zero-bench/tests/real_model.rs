//! The ZeRO claims on the real model (a GPT-style character model of 1.2M
//! parameters trained by candle): per-rank bytes per step of ZeRO-1/2 equal
//! DDP's and ZeRO-3's are 1.5× (ring), memory is the formula, the loss
//! curves agree within 1e-5 relative per step, every rank holds identical
//! parameters; the same from `oxccl-zero-bench` run as processes over
//! shared memory, and its JSON's shape.

use oxccl::{Communicator, Config};
use oxccl_zero::Stage;
use oxccl_zero_bench::data::{CORPUS, Corpus};
use oxccl_zero_bench::{ModelConfig, Options, run};
use serde_json::Value;
use std::process::{Command, Stdio};

fn options(steps: u64, dim: usize, blocks: usize, bf16: bool) -> Options {
    let vocab = Corpus::new(CORPUS).vocab.len();
    Options {
        steps,
        batch: 2,
        model: ModelConfig { vocab, dim, blocks, heads: 4, ctx: 32 },
        lr: 3e-3,
        seed: 7,
        bf16,
        stages: Stage::ALL.to_vec(),
    }
}

fn u64s(v: &Value) -> Vec<u64> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect()
}

/// Every assertion the issue names, on one report.
fn check(r: &Value, n: usize) {
    let st = &r["stages"];
    let ddp_sent = u64s(&st["ddp"]["sent_bytes_per_step"]);
    let ddp_recv = u64s(&st["ddp"]["recv_bytes_per_step"]);
    assert_eq!(ddp_sent.len(), n);
    let ring = r["ring_all_reduce_bytes_per_rank"].as_u64().unwrap();
    assert!(ddp_sent.iter().chain(&ddp_recv).all(|&b| b == ring), "DDP {ddp_sent:?} vs the ring's {ring}");
    let ddp_loss: Vec<f64> = st["ddp"]["loss"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    assert!(ddp_loss.last() < ddp_loss.first(), "the model learns: {ddp_loss:?}");
    let padding = (r["padded_params"].as_u64().unwrap() - r["params"].as_u64().unwrap()) as f64;
    for stage in Stage::ALL {
        let s = &st[stage.key()];
        let (sent, recv) = (u64s(&s["sent_bytes_per_step"]), u64s(&s["recv_bytes_per_step"]));
        let (num, den) = if stage == Stage::Zero3 { (3, 2) } else { (1, 1) };
        for r in 0..n {
            assert_eq!(sent[r] * den, ddp_sent[r] * num, "{stage} rank {r} sent");
            assert_eq!(recv[r] * den, ddp_recv[r] * num, "{stage} rank {r} received");
        }
        assert_eq!(s["bytes_same_every_step"], true, "{stage}");
        // Memory: the padded formula exactly, the paper's within the padding.
        let state = u64s(&s["state_bytes_by_rank"]);
        let padded = s["formula_padded_state_bytes_per_rank"].as_u64().unwrap();
        assert!(state.iter().all(|&b| b == padded), "{stage}: {state:?} vs {padded}");
        let paper = s["formula_state_bytes_per_rank"].as_f64().unwrap();
        assert!((padded as f64 - paper).abs() <= padding * 20.0, "{stage}: {padded} vs {paper}");
        // Threads share one process: together they never held more than
        // its peak resident set.
        let peaks: u64 = u64s(&s["peak_bytes_by_rank"]).iter().sum();
        let rss = u64s(&s["peak_rss_bytes_by_rank"]).into_iter().max().unwrap();
        assert!(peaks <= rss, "{stage}: the optimizer counted {peaks} bytes, the process peaked at {rss}");
        let loss = s["loss"].as_array().unwrap();
        for (i, (a, b)) in loss.iter().zip(&ddp_loss).enumerate() {
            let a = a.as_f64().unwrap();
            assert!((a - b).abs() <= 1e-5 * b.abs(), "{stage} step {i}: loss {a} vs DDP's {b}");
        }
        assert_eq!(s["ranks_identical"], true, "{stage}: ranks hold different parameters");
        if stage != Stage::Ddp {
            // Ring reduce-scatter adds in ring all-reduce's order, and AdamW
            // is elementwise: the parameters are DDP's, bit for bit, in
            // bf16 as in f32 (the issue asks 1e-5 of the losses, above).
            let d = s["max_abs_param_diff_vs_ddp"].as_f64().unwrap();
            assert_eq!(d, 0.0, "{stage}: parameters {d} from DDP's");
            assert_eq!(s["loss"], st["ddp"]["loss"], "{stage}");
        }
    }
    let state = |s: &str| st[s]["state_bytes_per_rank"].as_u64().unwrap();
    assert!(state("zero3") < state("zero2") && state("zero2") < state("zero1") && state("zero1") < state("ddp"));
}

#[test]
fn stages_on_threads() {
    for (n, bf16) in [(2, false), (3, false), (4, true)] {
        let o = options(3, 128, 6, bf16);
        assert!(o.model.params() >= 1_000_000, "{} parameters", o.model.params());
        let comms =
            Communicator::init_threads_with(n, Config { algo: Some("ring".into()), ..Config::default() }).unwrap();
        let reports: Vec<Value> = std::thread::scope(|s| {
            let hs: Vec<_> = comms.iter().map(|c| s.spawn(|| run(c, &o).unwrap())).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(reports.windows(2).all(|w| w[0] == w[1]), "every rank reports the same");
        check(&reports[0], n);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn processes_over_shared_memory() {
    let n = 3;
    let dir = std::env::temp_dir().join(format!("oxccl-zero-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("zero.json");
    let port = free_port().to_string();
    let kids: Vec<_> = (0..n)
        .map(|r| {
            Command::new(env!("CARGO_BIN_EXE_oxccl-zero-bench"))
                .args(["--steps", "2", "--dim", "32", "--blocks", "2", "--batch", "2", "--json"])
                .arg(&json)
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", n.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .env("OXCCL_SECRET", "zero-bench-test")
                .env("OXCCL_TRANSPORT", "shm")
                .env("OXCCL_TIMEOUT", "60")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<_> = kids.into_iter().map(|k| k.wait_with_output().unwrap()).collect();
    for (r, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "rank {r}: {}", String::from_utf8_lossy(&o.stderr));
    }
    let table = String::from_utf8_lossy(&outs[0].stdout);
    assert!(table.contains("zero3") && table.contains("1.500"), "{table}");
    assert!(outs[1].stdout.is_empty(), "only rank 0 prints");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(r["nranks"], 3);
    for s in ["ddp", "zero1", "zero2", "zero3"] {
        for k in [
            "sent_bytes_per_step",
            "recv_bytes_per_step",
            "state_bytes_per_rank",
            "formula_state_bytes_per_rank",
            "loss",
            "max_abs_param_diff_vs_ddp",
        ] {
            assert!(r["stages"][s].get(k).is_some(), "{s}.{k} missing");
        }
    }
    // One process per rank: each held at most its own peak.
    for s in Stage::ALL {
        let st = &r["stages"][s.key()];
        let (peak, rss) = (u64s(&st["peak_bytes_by_rank"]), u64s(&st["peak_rss_bytes_by_rank"]));
        assert!(peak.iter().zip(&rss).all(|(p, r)| p <= r), "{s}: {peak:?} vs {rss:?}");
    }
    check_processes(&r);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Processes: the same claims, except the shared-process memory check.
fn check_processes(r: &Value) {
    let st = &r["stages"];
    let ddp = u64s(&st["ddp"]["sent_bytes_per_step"]);
    assert!(ddp.iter().all(|&b| b == r["ring_all_reduce_bytes_per_rank"].as_u64().unwrap()));
    for s in ["zero1", "zero2"] {
        assert_eq!(u64s(&st[s]["sent_bytes_per_step"]), ddp, "{s}");
    }
    let z3: Vec<u64> = u64s(&st["zero3"]["sent_bytes_per_step"]).iter().map(|b| b * 2).collect();
    assert_eq!(z3, ddp.iter().map(|b| b * 3).collect::<Vec<_>>());
    for s in ["zero1", "zero2", "zero3"] {
        assert_eq!(st[s]["ranks_identical"], true);
        assert_eq!(st[s]["max_abs_param_diff_vs_ddp"].as_f64().unwrap(), 0.0, "{s}");
    }
}

#[test]
fn bad_flags_are_named() {
    let o = Command::new(env!("CARGO_BIN_EXE_oxccl-zero-bench")).args(["-t", "1", "--dtype", "f8"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--dtype \"f8\""), "{}", String::from_utf8_lossy(&o.stderr));
    let o = Command::new(env!("CARGO_BIN_EXE_oxccl-zero-bench"))
        .args(["-t", "1", "--stages", "ddp,zero9"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("zero9"));
    let o = Command::new(env!("CARGO_BIN_EXE_oxccl-zero-bench")).args(["-t", "1", "--heads", "3"]).output().unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("--heads 3 must divide --dim 128"));
}
