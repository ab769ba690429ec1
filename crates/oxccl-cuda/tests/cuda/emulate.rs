//! The CUDA kernels' own source (cuda/), run on the host by the emulation
//! harness (cuda/test/emulate.cpp through cuda/host_shim.h: one thread per
//! CUDA thread of every block of every rank), checked against oxccl-core's
//! host kernels: conversions bit for bit, `oxccl_reduce` for every type and
//! operator, `oxccl_collective` for every algorithm, and the failure paths
//! (timeout, abort, bad arguments, host signalling).
//!
//! The harness is built once per source version with `c++ -std=c++20 -O1`
//! into `CARGO_TARGET_TMPDIR` (`$CXX` overrides the compiler); without a C++
//! compiler the tests say so and pass, or fail where `OXCCL_REQUIRE_CC` is
//! set (CI).

use crate::common;

use common::*;
use half::{bf16, f16};
use oxccl_core::{DataType, F8E4M3, F8E5M2, ReduceOp, kernels};

const NARROW: [DataType; 4] = [DataType::Float16, DataType::Bfloat16, DataType::Float8E4M3, DataType::Float8E5M2];

// ---------------------------------------------------------------------------
// Conversions.

/// f32 patterns for narrowing: specials, every narrow code's value and the
/// midpoints to its neighbours (±1 ulp), then random bits.
fn narrow_patterns(rng: &mut Rng) -> Vec<u32> {
    let mut v: Vec<u32> = vec![
        0,
        0x8000_0000,
        0x7F80_0000,
        0xFF80_0000,
        0x7FC0_0000,
        0xFFC0_0000,
        0x7F80_0001,
        0xFFBF_FFFF,
        0x7FA0_1234,
        0x7F7F_FFFF,
        0xFF7F_FFFF,
        1,
        0x8000_0001,
        0x0080_0000,
        0x007F_FFFF,
    ];
    let mut vals: Vec<f32> = Vec::new();
    for c in 0..=u16::MAX {
        vals.push(f16::from_bits(c).to_f32());
        vals.push(bf16::from_bits(c).to_f32());
    }
    for c in 0..=u8::MAX {
        vals.push(F8E4M3::from_bits(c).to_f32());
        vals.push(F8E5M2::from_bits(c).to_f32());
    }
    vals.extend([448.0f32, 464.0, 480.0, 57344.0, 61440.0, 65504.0, 65520.0, 65536.0]);
    vals.retain(|x| x.is_finite());
    vals.sort_by(|a, b| a.partial_cmp(b).unwrap());
    vals.dedup();
    for w in vals.windows(2) {
        let mid = (f64::from(w[0]) + f64::from(w[1])) / 2.0;
        for x in [w[0], mid as f32] {
            let b = x.to_bits();
            v.extend([b, b.wrapping_add(1), b.wrapping_sub(1)]);
        }
    }
    v.extend((0..300_000).map(|_| rng.next() as u32));
    v
}

#[test]
fn conversions_match_oxccl_core_and_half_bit_for_bit() {
    let Some(exe) = harness() else { return };
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let pats = narrow_patterns(&mut rng);
    let scalars: Vec<f64> = [0.0, -0.0, 1.0, -1.0, 0.5, 3.7, -2.9, 127.5, -128.5, 255.9, 1e30, -1e30, 65519.0, 65520.0]
        .into_iter()
        .chain([448.0, 464.0, 57344.0, 61440.0, 1e-8, -6e-8, f64::from(f32::MAX) * 1.5, 4294967295.7, -2147483648.9])
        .chain([9.3e18, -9.3e18, 1.9e19, 1.0 + 2f64.powi(-4) + 2f64.powi(-40), 2f64.powi(-24) * 1.0000001])
        .chain((0..20_000).map(|_| f64::from_bits(rng.next()) % 1e6))
        .filter(|s| s.is_finite())
        .collect();
    let mut input = Vec::new();
    for d in NARROW {
        input.extend(format!("widen {}\n", d as i32).bytes());
        input.extend(format!("narrow {} {}\n", d as i32, pats.len()).bytes());
        input.extend(pats.iter().flat_map(|p| p.to_ne_bytes()));
    }
    for d in DataType::ALL {
        input.extend(format!("scale {} {}\n", d as i32, scalars.len()).bytes());
        input.extend(scalars.iter().flat_map(|s| s.to_ne_bytes()));
    }
    let answers = run_jobs(exe, input);
    let mut a = answers.iter();
    for d in NARROW {
        let widened = &a.next().unwrap().data;
        let codes = 1usize << (8 * d.size());
        assert_eq!(widened.len(), codes * 4);
        for c in 0..codes {
            let got = u32::from_ne_bytes(widened[c * 4..c * 4 + 4].try_into().unwrap());
            let want = match d {
                DataType::Float16 => f16::from_bits(c as u16).to_f32().to_bits(),
                // oxccl-core widens bf16 by shifting (a NaN keeps its bits).
                DataType::Bfloat16 => (c as u32) << 16,
                DataType::Float8E4M3 => F8E4M3::from_bits(c as u8).to_f32().to_bits(),
                _ => F8E5M2::from_bits(c as u8).to_f32().to_bits(),
            };
            assert_eq!(got, want, "widening {d} code {c:#x}: got {got:#010x}, want {want:#010x}");
        }
        let narrowed = &a.next().unwrap().data;
        for (i, &p) in pats.iter().enumerate() {
            let x = f32::from_bits(p);
            let (got, want) = match d {
                DataType::Float16 | DataType::Bfloat16 => {
                    let got = u16::from_ne_bytes(narrowed[i * 2..i * 2 + 2].try_into().unwrap());
                    let want =
                        if d == DataType::Float16 { f16::from_f32(x).to_bits() } else { bf16::from_f32(x).to_bits() };
                    (u32::from(got), u32::from(want))
                }
                DataType::Float8E4M3 => (u32::from(narrowed[i]), u32::from(F8E4M3::from_f32(x).to_bits())),
                _ => (u32::from(narrowed[i]), u32::from(F8E5M2::from_f32(x).to_bits())),
            };
            assert_eq!(got, want, "narrowing f32 {p:#010x} ({x:e}) to {d}: got {got:#x}, want {want:#x}");
        }
    }
    for d in DataType::ALL {
        let got = &a.next().unwrap().data;
        for (i, &s) in scalars.iter().enumerate() {
            // premul by the scalar of a one: oxccl-core's scalar conversion.
            let one = elem(d, 1.0);
            let mut want = vec![0u8; d.size()];
            kernels::premul(d, &mut want, &one, s).unwrap();
            let g = &got[i * d.size()..(i + 1) * d.size()];
            assert_eq!(g, &want[..], "premul scalar {s:e} as {d}: got {g:02x?}, want {want:02x?}");
        }
    }
}

// ---------------------------------------------------------------------------
// oxccl_reduce.

const OPS: [ReduceOp; 6] =
    [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg, ReduceOp::PreMulSum { scalar: 1.0 }];

struct ReduceCase {
    dtype: DataType,
    op: ReduceOp,
    count: usize,
    ndst: usize,
    alias: bool,
    header: String,
    srcs: Vec<Vec<u8>>,
    scale: f64,
    avg: usize,
}

#[test]
fn reduce_matches_oxccl_core_for_every_type_op_and_alignment() {
    let Some(exe) = harness() else { return };
    let mut rng = Rng(0x1234_5678_9ABC_DEF1);
    let mut cases = Vec::new();
    for dtype in DataType::ALL {
        for op in OPS {
            for nsrc in [1usize, 2, 3, 8] {
                for count in [0usize, 1, 7, 1000, 4099] {
                    let e = dtype.size() as u64;
                    let i = cases.len() as u64;
                    // Offsets: all aligned, all equally misaligned, or each its own.
                    let same = rng.below(16 / e) * e;
                    let off = |rng: &mut Rng| match i % 3 {
                        0 => 0,
                        1 => same,
                        _ => rng.below(16 / e) * e,
                    };
                    let ndst = 1 + rng.below(3) as usize;
                    let alias = rng.below(3) == 0;
                    let soff: Vec<u64> = (0..nsrc).map(|_| off(&mut rng)).collect();
                    let doff: Vec<u64> = (0..ndst).map(|_| off(&mut rng)).collect();
                    let premul = matches!(op, ReduceOp::PreMulSum { .. });
                    let scale = if premul { gen_scale(&mut rng, dtype) } else { 1.0 };
                    let avg = if op == ReduceOp::Avg { nsrc + (i as usize % 2) } else { 0 };
                    let (grid, block) = (1 + i % 3, 32 << (i % 2));
                    let header = format!(
                        "reduce {} {} {count} {nsrc} {ndst} {} {} {avg} {grid} {block} {} {} {}\n",
                        dtype as i32,
                        kernel_op(op),
                        u32::from(premul),
                        scale.to_bits(),
                        u32::from(alias),
                        soff.iter().map(u64::to_string).collect::<Vec<_>>().join(" "),
                        doff.iter().map(u64::to_string).collect::<Vec<_>>().join(" "),
                    );
                    let srcs = (0..nsrc).map(|_| inputs_for(&mut rng, dtype, op, count)).collect();
                    cases.push(ReduceCase { dtype, op, count, ndst, alias, header, srcs, scale, avg });
                }
            }
        }
    }
    let mut input = Vec::new();
    for c in &cases {
        input.extend(c.header.bytes());
        c.srcs.iter().for_each(|s| input.extend(s));
    }
    let answers = run_jobs(exe, input);
    assert_eq!(answers.len(), cases.len());
    for (c, a) in cases.iter().zip(&answers) {
        let what = format!(
            "reduce {} {} of {} sources, {} elements, {} dsts (alias {}); job {}",
            c.op,
            c.dtype,
            c.srcs.len(),
            c.count,
            c.ndst,
            c.alias,
            c.header.trim()
        );
        assert_eq!(a.head, [1], "{what}: bytes outside the buffers changed");
        let refs: Vec<&[u8]> = c.srcs.iter().map(|s| &s[..]).collect();
        let want = reference(c.dtype, c.op, &refs, &[c.scale], c.avg);
        for (j, got) in a.data.chunks(want.len().max(1)).enumerate().take(c.ndst) {
            assert!(got == &want[..], "{what}: dst {j}: {}", first_diff(c.dtype, got, &want));
        }
        assert_eq!(a.data.len(), want.len() * c.ndst, "{what}");
    }
}

// ---------------------------------------------------------------------------
// oxccl_collective.

const AR1: u32 = 0;
const AR2: u32 = 1;
const RS: u32 = 2;
const AG: u32 = 3;
const BC: u32 = 4;
const RD: u32 = 5;
const A2A: u32 = 6;

/// Elements of a rank's send and recv buffers (NCCL's layouts).
fn coll_sizes(coll: u32, n: usize, count: usize) -> (usize, usize) {
    let send = if coll == RS || coll == A2A { n * count } else { count };
    let recv = if coll == AG || coll == A2A { n * count } else { count };
    (send, recv)
}

/// One collective job: `n` ranks, each with its input.
#[derive(Clone)]
struct Coll {
    dtype: DataType,
    op: ReduceOp,
    coll: u32,
    n: usize,
    count: usize,
    grid: u32,
    block: u32,
    window: usize,
    root: usize,
    inplace: bool,
    timeout_ns: u64,
    skip: Option<usize>,
    abort: bool,
    repeat: u32,
    send_off: usize,
    recv_off: usize,
    scales: Vec<f64>,
    inputs: Vec<Vec<u8>>,
}

impl Coll {
    fn header(&self) -> String {
        let premul = matches!(self.op, ReduceOp::PreMulSum { .. });
        let scales: Vec<String> = self.scales.iter().map(|s| s.to_bits().to_string()).collect();
        format!(
            "coll {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {}\n",
            self.dtype as i32,
            kernel_op(self.op),
            self.coll,
            self.n,
            self.count,
            self.grid,
            self.block,
            self.window,
            self.root,
            u32::from(self.inplace),
            u32::from(premul),
            u32::from(self.op == ReduceOp::Avg),
            self.timeout_ns,
            self.skip.map_or(-1, |s| s as i64),
            u32::from(self.abort),
            self.repeat,
            self.send_off,
            self.recv_off,
            scales.join(" ")
        )
    }

    /// Every rank's expected recv region, from oxccl-core.
    fn expected(&self, rank: usize) -> Vec<u8> {
        let (e, count, n) = (self.dtype.size(), self.count, self.n);
        let slice = |q: usize, i: usize| &self.inputs[q][i * count * e..(i + 1) * count * e];
        let reduce = |i: usize| {
            let srcs: Vec<&[u8]> = (0..n).map(|q| slice(q, i)).collect();
            let avg = if self.op == ReduceOp::Avg { n } else { 0 };
            reference(self.dtype, self.op, &srcs, &self.scales, avg)
        };
        match self.coll {
            AR1 | AR2 => reduce(0),
            RS => reduce(rank),
            AG => (0..n).flat_map(|q| slice(q, 0).to_vec()).collect(),
            BC => self.inputs[self.root].clone(),
            RD if rank == self.root => reduce(0),
            // A non-root's recv: untouched (the harness's fill), or its input in place.
            RD if self.inplace => self.inputs[rank].clone(),
            RD => vec![0x5A; count * e],
            _ => (0..n).flat_map(|q| slice(q, rank).to_vec()).collect(),
        }
    }
}

/// Per rank: status[0], guards intact, send intact, recv region.
fn rank_results(c: &Coll, a: &Answer) -> Vec<(u32, bool, bool, Vec<u8>)> {
    let (_, recv) = coll_sizes(c.coll, c.n, c.count);
    let bytes = recv * c.dtype.size();
    let word = |d: &[u8], i: usize| u32::from_ne_bytes(d[i * 4..i * 4 + 4].try_into().unwrap());
    assert_eq!(a.data.len(), c.n * (16 + bytes), "answer size of {}", c.header().trim());
    a.data.chunks(16 + bytes).map(|d| (word(d, 0), word(d, 1) == 1, word(d, 2) == 1, d[16..].to_vec())).collect()
}

fn run_colls(cases: &[Coll]) -> Option<Vec<Answer>> {
    let exe = harness()?;
    let mut input = Vec::new();
    for c in cases {
        input.extend(c.header().bytes());
        c.inputs.iter().for_each(|s| input.extend(s));
    }
    let answers = run_jobs(exe, input);
    assert_eq!(answers.len(), cases.len());
    Some(answers)
}

/// (type, op) pairs the collective cases cycle through.
const COLL_TYPES: [(DataType, ReduceOp); 10] = [
    (DataType::Float32, ReduceOp::Sum),
    (DataType::Bfloat16, ReduceOp::Avg),
    (DataType::Int32, ReduceOp::Prod),
    (DataType::Float8E4M3, ReduceOp::Max),
    (DataType::Float16, ReduceOp::PreMulSum { scalar: 1.0 }),
    (DataType::Uint8, ReduceOp::Min),
    (DataType::Float64, ReduceOp::Avg),
    (DataType::Int64, ReduceOp::Sum),
    (DataType::Float8E5M2, ReduceOp::Sum),
    (DataType::Int8, ReduceOp::PreMulSum { scalar: 1.0 }),
];

fn coll_case(rng: &mut Rng, i: usize, coll: u32, n: usize, count: usize, window: usize) -> Coll {
    let (mut dtype, mut op) = COLL_TYPES[i % COLL_TYPES.len()];
    if n > 8 && dtype.size() == 1 && dtype.is_float() && !matches!(op, ReduceOp::Max | ReduceOp::Min) {
        // Sums of more than 8 values in {-1, 0, 1} leave FP8's exact range.
        (dtype, op) = (DataType::Float32, ReduceOp::Sum);
    }
    let e = dtype.size();
    let (send, _) = coll_sizes(coll, n, count);
    let misalign = |rng: &mut Rng| if rng.below(2) == 0 { 0 } else { rng.below(16 / e as u64) as usize * e };
    Coll {
        dtype,
        op,
        coll,
        n,
        count,
        grid: 2 + (i % 2) as u32,
        block: 32 << (i % 2),
        window,
        root: rng.below(n as u64) as usize,
        inplace: i % 2 == 1,
        timeout_ns: 20_000_000_000,
        skip: None,
        abort: false,
        repeat: 1 + u32::from(i.is_multiple_of(5)),
        send_off: misalign(rng),
        recv_off: misalign(rng),
        scales: (0..n).map(|_| gen_scale(rng, dtype)).collect(),
        inputs: (0..n).map(|_| inputs_for(rng, dtype, op, send)).collect(),
    }
}

fn check_colls(colls: &[u32]) {
    let mut rng = Rng(0xC0FF_EE00_D15E_A5E5 ^ u64::from(colls[0]));
    let mut cases = Vec::new();
    for &coll in colls {
        for n in 1..=4 {
            // (count, window bytes): nothing, one element, primes, several
            // iterations through a small window.
            for (count, window) in [(0, 4096), (1, 4096), (13, 4096), (1031, 1024), (2053, 4096)] {
                for _ in 0..2 {
                    cases.push(coll_case(&mut rng, cases.len(), coll, n, count, window));
                }
            }
        }
        // The most ranks a launch takes, through several iterations.
        let big = coll_case(&mut rng, cases.len(), coll, 16, 100, 16 * 16 * 8);
        cases.push(Coll { grid: 2, block: 32, ..big });
    }
    let Some(answers) = run_colls(&cases) else { return };
    for (c, a) in cases.iter().zip(&answers) {
        for (r, (status, guards, intact, recv)) in rank_results(c, a).into_iter().enumerate() {
            let what = format!("rank {r} of {} {} on {}: {}", c.op, c.dtype, c.n, c.header().trim());
            assert_eq!(status, 0, "{what}: status");
            assert!(guards, "{what}: bytes outside the buffers, windows or flags changed");
            assert!(intact, "{what}: the send buffer changed");
            let want = c.expected(r);
            assert!(recv == want, "{what}: {}", first_diff(c.dtype, &recv, &want));
        }
    }
}

#[test]
fn all_reduce_one_and_two_shot_match_oxccl_core() {
    check_colls(&[AR1, AR2]);
}

#[test]
fn reduce_scatter_and_reduce_match_oxccl_core() {
    check_colls(&[RS, RD]);
}

#[test]
fn all_gather_broadcast_and_all_to_all_move_every_byte() {
    check_colls(&[AG, BC, A2A]);
}

// ---------------------------------------------------------------------------
// Failures.

#[test]
fn a_missing_rank_times_out_an_abort_stops_bad_arguments_are_refused() {
    let mut rng = Rng(77);
    let base = coll_case(&mut rng, 0, AR1, 3, 1000, 4096);
    let timeout = Coll { skip: Some(1), timeout_ns: 300_000_000, ..base.clone() };
    let abort = Coll { skip: Some(2), abort: true, ..base.clone() };
    let two_shot = Coll { coll: AR2, skip: Some(0), timeout_ns: 300_000_000, ..base.clone() };
    // A reduce-scatter window must hold a 16-byte vector per rank.
    let small = Coll { coll: RS, window: 32, inputs: vec![vec![1; 3 * 1000 * 4]; 3], ..base.clone() };
    let bad_root = Coll { coll: BC, root: 3, ..base.clone() };
    let cases = [timeout, abort, two_shot, small, bad_root];
    let Some(answers) = run_colls(&cases) else { return };
    for (i, (c, a)) in cases.iter().zip(&answers).enumerate() {
        let elapsed_ms = a.head[0];
        for (r, (status, guards, intact, recv)) in rank_results(c, a).into_iter().enumerate() {
            let what = format!("case {i} rank {r}: {}", c.header().trim());
            assert!(guards && intact, "{what}: memory outside the outputs changed");
            let want = match i {
                _ if c.skip == Some(r) => 0,
                0 | 2 => 1,
                1 => 2,
                _ => 3,
            };
            assert_eq!(status, want, "{what}: status[0]");
            if i >= 3 {
                assert!(recv.iter().all(|&b| b == 0x5A), "{what}: refused arguments wrote recv");
            }
        }
        // Every wait gives up after its timeout: the whole launch well within
        // a few of them (the machine may be slow and busy).
        let bound = if c.abort { 5_000 } else { 10 * c.timeout_ns / 1_000_000 + 5_000 };
        assert!(elapsed_ms < bound, "case {i} took {elapsed_ms} ms");
        if c.skip.is_some() {
            assert!(elapsed_ms >= c.timeout_ns / 1_000_000 || c.abort, "case {i} returned before the timeout");
        }
    }
}

#[test]
fn host_signalling_waits_times_out_and_aborts() {
    let Some(exe) = harness() else { return };
    let input = b"stage 0 5000000000\nstage 1 200000000\nstage 2 5000000000\n".to_vec();
    let answers = run_jobs(exe, input);
    // (status[0], the word signal_host wrote, elapsed ms)
    let [set, never, aborted] = [&answers[0].head, &answers[1].head, &answers[2].head];
    assert_eq!(set[..2], [0, 42], "wait_host returns once the host writes the word");
    assert!(set[2] >= 15 && set[2] < 4_000, "wait_host waited {} ms for a word set after 20 ms", set[2]);
    assert_eq!(never[..2], [1, 42], "wait_host on a word never set times out (status 1)");
    assert!(never[2] >= 190 && never[2] < 4_000, "a 200 ms timeout took {} ms", never[2]);
    assert_eq!(aborted[..2], [2, 42], "wait_host stops on the abort word (status 2)");
    assert!(aborted[2] < 4_000, "abort took {} ms", aborted[2]);
}
