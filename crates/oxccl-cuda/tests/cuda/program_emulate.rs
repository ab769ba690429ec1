//! The device executor (`oxccl_program`, cuda/program.cu) run on the host
//! by the emulation harness: every algorithm of oxccl-algo for every
//! collective it implements, 1–8 ranks, counts that do not divide evenly,
//! several types and operators, in and out of place, teams of blocks per
//! channel, FIFOs small enough that messages take many pieces, relaunches
//! on the same flags; the results bit for bit those of oxccl-algo's
//! reference interpreter over oxccl-core's kernels (the host path's
//! arithmetic). Then the failure paths: a rank that never runs (timeout),
//! the abort word, a program the kernel must refuse.
//!
//! Without a C++ compiler the tests say so and pass, or fail where
//! `OXCCL_REQUIRE_CC` is set (see emulate.rs).

use crate::common;

use common::*;
use oxccl_algo::algos::{Algorithm, BuildOptions, build};
use oxccl_algo::collective::{CollKind, Collective};
use oxccl_algo::interp;
use oxccl_algo::ir::Program;
use oxccl_core::{DataType, ReduceOp};
use oxccl_cuda::program::{DeviceProgram, PStep, StepOp};

/// How a program is launched.
#[derive(Clone, Copy, Debug)]
struct Shape {
    team: u32,
    block: u32,
    slots: u32,
    slot_bytes: u64,
    in_place: bool,
    repeat: u32,
    /// A rank that is never launched (its peers must time out).
    skip: Option<usize>,
    abort: bool,
    timeout_ms: u64,
    /// Peers' input and output addresses exchanged by the kernels.
    exchange: bool,
}

impl Default for Shape {
    fn default() -> Shape {
        Shape {
            team: 1,
            block: 8,
            slots: 2,
            slot_bytes: 64,
            in_place: false,
            repeat: 1,
            skip: None,
            abort: false,
            timeout_ms: 20_000,
            exchange: false,
        }
    }
}

/// One job: the program, its data, what to expect.
struct Case {
    what: String,
    program: Program,
    op: ReduceOp,
    scales: Vec<f64>,
    inputs: Vec<Vec<u8>>,
    shape: Shape,
    /// Encoded programs (replaces the encoding of `program` when set).
    raw: Option<Vec<DeviceProgram>>,
}

/// The kernel module and the encoding unit: reductions run in their type,
/// data movement in bytes (as oxccl runs them).
fn module_of(c: &Collective, op: ReduceOp) -> (u32, u32, usize, bool, bool) {
    if c.kind.reduces() {
        let dt = c.dtype as u32;
        let pre = matches!(op, ReduceOp::PreMulSum { .. });
        (dt, kernel_op(op), 1, pre, op == ReduceOp::Avg)
    } else {
        (DataType::Uint8 as u32, 0, c.dtype.size(), false, false)
    }
}

/// Bytes of the module's element type.
fn module_size(dt: u32) -> usize {
    DataType::ALL.into_iter().find(|d| *d as u32 == dt).expect("a data type").size()
}

fn push_u64s(out: &mut Vec<u8>, xs: &[u64]) {
    for x in xs {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

/// The job's header line and input bytes, and every rank's output length.
fn encode_job(case: &Case) -> (Vec<u8>, Vec<usize>) {
    let c = case.program.collective;
    let (n, s) = (c.nranks, case.shape);
    let (dt, op, unit, pre, avg) = module_of(&c, case.op);
    let progs: Vec<DeviceProgram> = match &case.raw {
        Some(r) => r.clone(),
        None => (0..n)
            .map(|r| DeviceProgram::encode(&case.program.ranks[r], r, n, unit).unwrap_or_else(|e| panic!("{e}")))
            .collect(),
    };
    let fifo_chans = progs.iter().map(|p| p.channels.len()).max().unwrap_or(1).max(1);
    // At least what the longest message needs (see DeviceProgram::slots_needed).
    let need = progs.iter().map(|p| p.slots_needed(module_size(dt), s.slot_bytes as usize)).max().unwrap_or(1);
    let s = Shape { slots: s.slots.max(need as u32), ..s };
    let mut job = format!(
        "prog {dt} {op} {n} {} {} {} {} {fifo_chans} {} {} {} {} {} {} {}\n",
        s.team,
        s.block,
        s.slots,
        s.slot_bytes,
        s.timeout_ms * 1_000_000,
        s.repeat,
        pre as u32,
        avg as u32,
        s.skip.map_or(-1, |r| r as i64),
        s.abort as u32,
        s.exchange as u32
    )
    .into_bytes();
    let mut outs = Vec::new();
    for (r, d) in progs.iter().enumerate() {
        let (i, o) = (c.input_len(r) * unit, c.output_len(r) * unit);
        let lay = c.in_place_layout(r);
        let (shared, at_in, at_out) =
            if s.in_place { (lay.len * unit, lay.input_at * unit, lay.output_at * unit) } else { (0, 0, 0) };
        let scale = case.scales.get(r).copied().unwrap_or(1.0);
        push_u64s(&mut job, &[i as u64, o as u64, d.scratch as u64, at_in as u64, at_out as u64, shared as u64]);
        let nslices = d.slices.len() as u64;
        push_u64s(&mut job, &[d.channels.len() as u64, d.steps.len() as u64, nslices, scale.to_bits()]);
        for &(first, _) in &d.channels {
            job.extend_from_slice(&first.to_le_bytes());
        }
        for &(_, len) in &d.channels {
            job.extend_from_slice(&len.to_le_bytes());
        }
        job.extend_from_slice(&d.step_bytes());
        job.extend_from_slice(&d.slice_bytes());
        job.extend_from_slice(&case.inputs[r]);
        assert_eq!(case.inputs[r].len(), c.input_len(r) * c.dtype.size(), "{}: rank {r}'s input", case.what);
        outs.push(c.output_len(r) * c.dtype.size());
        let _ = o;
    }
    (job, outs)
}

/// Per rank: (status, guards intact, input intact, output bytes).
type Results = Vec<(u32, bool, bool, Vec<u8>)>;

/// Runs every case in one harness process; `None` without a compiler.
fn run_cases(cases: &[Case]) -> Option<Vec<Results>> {
    let exe = harness()?;
    let mut input = Vec::new();
    let mut lens = Vec::new();
    for c in cases {
        let (job, outs) = encode_job(c);
        input.extend_from_slice(&job);
        lens.push(outs);
    }
    let answers = run_jobs(exe, input);
    assert_eq!(answers.len(), cases.len());
    Some(
        answers
            .iter()
            .zip(&lens)
            .map(|(a, outs)| {
                let mut at = 0;
                outs.iter()
                    .map(|&o| {
                        let w = |i: usize| u32::from_ne_bytes(a.data[at + 4 * i..at + 4 * i + 4].try_into().unwrap());
                        let r = (w(0), w(1) == 1, w(2) == 1, a.data[at + 16..at + 16 + o].to_vec());
                        at += 16 + o;
                        r
                    })
                    .collect()
            })
            .collect(),
    )
}

/// Runs the cases and compares every rank's defined output with the
/// reference interpreter's, bit for bit.
fn check(cases: &[Case]) {
    let Some(results) = run_cases(cases) else { return };
    let mut bad = Vec::new();
    for (case, res) in cases.iter().zip(&results) {
        let c = case.program.collective;
        let ops: Vec<ReduceOp> = if case.scales.is_empty() {
            vec![case.op]
        } else {
            case.scales.iter().map(|&s| ReduceOp::PreMulSum { scalar: s }).collect()
        };
        let want = interp::run(&case.program, &ops, &case.inputs).unwrap_or_else(|e| panic!("{}: {e}", case.what));
        let e = c.dtype.size();
        for (r, (status, guards, intact, out)) in res.iter().enumerate() {
            if *status != 0 || !guards || !intact {
                bad.push(format!("{} rank {r}: status {status}, guards {guards}, input intact {intact}", case.what));
                continue;
            }
            for x in c.expected(r) {
                let range = x.start * e..(x.start + x.len) * e;
                if out[range.clone()] != want[r][range.clone()] {
                    let d = first_diff(c.dtype, &out[range.clone()], &want[r][range]);
                    bad.push(format!("{} rank {r}: output from element {}: {d}", case.what, x.start));
                    break;
                }
            }
        }
    }
    assert!(bad.is_empty(), "{} failures in {} cases:\n{}", bad.len(), cases.len(), bad.join("\n"));
}

/// A case for `program` with `op` (`PreMulSum`: a scalar per rank).
fn case(rng: &mut Rng, what: String, program: Program, op: ReduceOp, shape: Shape) -> Case {
    let c = program.collective;
    let data_op = if c.kind.reduces() { op } else { ReduceOp::Max };
    let inputs: Vec<Vec<u8>> = (0..c.nranks).map(|r| inputs_for(rng, c.dtype, data_op, c.input_len(r))).collect();
    let scales = match op {
        ReduceOp::PreMulSum { .. } if c.kind.reduces() => (0..c.nranks).map(|_| gen_scale(rng, c.dtype)).collect(),
        _ => Vec::new(),
    };
    Case { what, program, op, scales, inputs, shape, raw: None }
}

const COUNTS: [usize; 6] = [0, 1, 5, 37, 130, 1000];
const TYPES: [(DataType, ReduceOp); 8] = [
    (DataType::Float32, ReduceOp::Sum),
    (DataType::Int32, ReduceOp::Prod),
    (DataType::Bfloat16, ReduceOp::Sum),
    (DataType::Float64, ReduceOp::Max),
    (DataType::Uint8, ReduceOp::Min),
    (DataType::Float16, ReduceOp::Avg),
    (DataType::Int64, ReduceOp::PreMulSum { scalar: 0.0 }),
    (DataType::Float8E4M3, ReduceOp::Sum),
];

/// Every algorithm × every collective it implements × 1..=8 ranks, with
/// counts, types, roots, layouts and launch shapes rotating through the
/// cases. Programs are built with small pipeline chunks so that pipelined
/// algorithms cut messages into several steps.
fn all_algorithm_cases(ranks: std::ops::RangeInclusive<usize>) -> Vec<Case> {
    let mut rng = Rng(0x5eed_1234);
    let opts = BuildOptions { chunk_bytes: 96, max_chunks: 4 };
    let mut cases = Vec::new();
    let mut i = 0usize;
    for algo in Algorithm::ALL {
        for &kind in algo.kinds() {
            for n in ranks.clone() {
                i += 1;
                let (dtype, op) = TYPES[i % TYPES.len()];
                let count = COUNTS[(i / 2) % COUNTS.len()];
                let c = Collective::new(kind, n, count).with_root((i / 3) % n).with_dtype(dtype);
                let Ok(p) = build(algo, &c, &opts) else { continue };
                let shape = Shape {
                    team: [1, 2, 1, 3][i % 4],
                    slots: [2, 4, 1][i % 3],
                    slot_bytes: [64, 256, 16][(i / 4) % 3],
                    in_place: p.in_place && i % 2 == 1,
                    exchange: i % 5 < 2,
                    ..Shape::default()
                };
                let what = format!("{algo} {c} {op:?} {shape:?}");
                cases.push(case(&mut rng, what, p, op, shape));
            }
        }
    }
    cases
}

#[test]
fn every_algorithm_runs_every_collective_on_1_to_4_ranks() {
    check(&all_algorithm_cases(1..=4));
}

#[test]
fn every_algorithm_runs_every_collective_on_5_to_8_ranks() {
    check(&all_algorithm_cases(5..=8));
}

/// Programs cut by data into 2–4 channels (`oxccl_algo::channels`, what
/// `OXCCL_NCHANNELS` makes of a built-in algorithm; the device FIFOs have
/// 4): every algorithm × collective that can be split, 2–5 ranks, on one
/// host and on hosts of 2 (where `hier` differs from the ring), each
/// channel a team of blocks of its own.
#[test]
fn programs_split_over_channels_run_as_their_parts() {
    use oxccl_algo::placement::Placement;
    let mut rng = Rng(0xc4a7);
    let opts = BuildOptions { chunk_bytes: 96, max_chunks: 4 };
    let mut cases = Vec::new();
    let mut i = 0usize;
    for algo in Algorithm::ALL {
        for &kind in algo.kinds() {
            for n in 2..=5 {
                i += 1;
                let parts = 2 + i % 3;
                let (dtype, op) = TYPES[i % TYPES.len()];
                let count = [37, 130, 1000][i % 3];
                let c = Collective::new(kind, n, count).with_root(i % n).with_dtype(dtype);
                let at = if n % 2 == 0 { Placement::blocked(n / 2, 2) } else { Placement::flat(n) };
                let Ok(p) = oxccl_algo::channels::build(algo, &c, &opts, &at, parts) else { continue };
                if p.ranks.iter().all(|r| r.channels.len() < 2) {
                    continue;
                }
                let shape = Shape { team: [1, 2][i % 2], slots: [2, 4][(i / 2) % 2], ..Shape::default() };
                let what = format!("{algo} {c} on {parts} channels {op:?} {shape:?}");
                cases.push(case(&mut rng, what, p, op, shape));
            }
        }
    }
    assert!(cases.len() >= 20, "only {} programs could be split", cases.len());
    check(&cases);
}

#[test]
fn every_type_and_operator_through_ring_tree_and_one_shot() {
    let mut rng = Rng(0xfeed);
    let ops = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Avg,
        ReduceOp::PreMulSum { scalar: 0.0 },
    ];
    let opts = BuildOptions { chunk_bytes: 128, max_chunks: 3 };
    let mut cases = Vec::new();
    for (k, dtype) in DataType::ALL.into_iter().enumerate() {
        for (j, op) in ops.into_iter().enumerate() {
            let algo = [Algorithm::Ring, Algorithm::Tree, Algorithm::OneShot][(k + j) % 3];
            let c = Collective::new(CollKind::AllReduce, 3, 41).with_dtype(dtype);
            let p = build(algo, &c, &opts).unwrap();
            let shape = Shape { team: 1 + (j % 2) as u32, ..Shape::default() };
            cases.push(case(&mut rng, format!("{algo} {c} {op:?}"), p, op, shape));
        }
    }
    check(&cases);
}

#[test]
fn relaunches_continue_from_the_counters_the_last_launch_left() {
    let mut rng = Rng(7);
    let mut cases = Vec::new();
    for (algo, kind) in [
        (Algorithm::Ring, CollKind::AllReduce),
        (Algorithm::TwoShot, CollKind::AllReduce),
        (Algorithm::Direct, CollKind::AllToAll),
        (Algorithm::Tree, CollKind::Broadcast),
    ] {
        let c = Collective::new(kind, 4, 77);
        let p = build(algo, &c, &BuildOptions { chunk_bytes: 64, max_chunks: 8 }).unwrap();
        let shape = Shape { repeat: 3, team: 2, slots: 3, exchange: true, ..Shape::default() };
        cases.push(case(&mut rng, format!("{algo} {c} ×3"), p, ReduceOp::Sum, shape));
    }
    check(&cases);
}

#[test]
fn a_user_program_from_json_runs_as_written() {
    // Two ranks swap halves with one-sided puts, then reduce locally: not an
    // algorithm of oxccl-algo, a researcher's program.
    let json = r#"{
      "name": "put-swap", "in_place": false,
      "collective": {"kind": "all_reduce", "nranks": 2, "count": 6, "dtype": "float32"},
      "ranks": [
        {"scratch": 6, "channels": [[
          {"op": "signal", "peer": 1}, {"op": "wait", "peer": 1},
          {"op": "put", "peer": 1, "src": "input[0..6]", "dst": "scratch[0..6]"},
          {"op": "signal", "peer": 1}, {"op": "wait", "peer": 1},
          {"op": "reduce", "srcs": ["input[0..6]", "scratch[0..6]"], "dst": "output[0..6]"}]]},
        {"scratch": 6, "channels": [[
          {"op": "signal", "peer": 0}, {"op": "wait", "peer": 0},
          {"op": "put", "peer": 0, "src": "input[0..6]", "dst": "scratch[0..6]"},
          {"op": "signal", "peer": 0}, {"op": "wait", "peer": 0},
          {"op": "reduce", "srcs": ["scratch[0..6]", "input[0..6]"], "dst": "output[0..6]"}]]}
      ]}"#;
    let p = Program::from_json(json).unwrap();
    oxccl_algo::verify::verify(&p).unwrap();
    let mut rng = Rng(3);
    check(&[case(&mut rng, "put-swap".into(), p, ReduceOp::Sum, Shape::default())]);
}

#[test]
fn a_missing_rank_times_out_an_abort_stops_a_bad_program_is_refused() {
    let c = Collective::new(CollKind::AllReduce, 3, 100);
    let p = build(Algorithm::Ring, &c, &BuildOptions::default()).unwrap();
    let mut rng = Rng(11);
    let skip = Shape { skip: Some(1), timeout_ms: 200, ..Shape::default() };
    // With rank 1 missing too, the others can only leave through the abort.
    let abort = Shape { abort: true, skip: Some(1), ..Shape::default() };
    let short = Shape { timeout_ms: 300, ..Shape::default() };
    let mut bad = case(&mut rng, "bad".into(), p.clone(), ReduceOp::Sum, short);
    let mut raw: Vec<DeviceProgram> = (0..3).map(|r| DeviceProgram::encode(&p.ranks[r], r, 3, 1).unwrap()).collect();
    // Rank 2 receives from itself: the kernel must refuse, not spin.
    raw[2].steps[0] = PStep { op: StepOp::Recv as u32, recv: 2, len: 4, ..PStep::default() };
    raw[2].channels = vec![(0, 1)];
    bad.raw = Some(raw);
    let cases = [
        case(&mut rng, "skip".into(), p.clone(), ReduceOp::Sum, skip),
        case(&mut rng, "abort".into(), p.clone(), ReduceOp::Sum, abort),
        bad,
    ];
    let Some(res) = run_cases(&cases) else { return };
    for (r, (status, guards, ..)) in res[0].iter().enumerate() {
        assert!(*guards, "skip: rank {r} wrote outside its buffers");
        let want = if r == 1 { 0 } else { 1 };
        assert_eq!(*status, want, "skip: rank {r}'s status (1: timeout)");
    }
    assert_eq!((res[1][0].0, res[1][2].0), (2, 2), "abort: the ranks stop with status 2");
    assert_eq!(res[2][2].0, 3, "rank 2's own-peer step is refused (status 3)");
}
