//! What the emulation tests share: the harness (cuda/test/emulate.cpp,
//! built once per source version), test data and oxccl-core references;
//! and what the NVRTC tests ask first ([`have_nvrtc`]).
#![allow(dead_code)]

use half::{bf16, f16};
use oxccl_core::{DataType, F8E4M3, F8E5M2, ReduceOp, kernels};
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// Whether NVRTC is here; says why the test skips if not (a failure where
/// `OXCCL_REQUIRE_NVRTC` is set).
pub fn have_nvrtc() -> bool {
    let e = oxccl_cuda::nvrtc_available().err();
    if let Some(e) = &e {
        oxccl_skip::skip_or_fail("OXCCL_REQUIRE_NVRTC", format!("NVRTC cannot be loaded: {e}"));
    }
    e.is_none()
}

// ---------------------------------------------------------------------------
// The harness.

pub const SOURCES: &[&str] =
    &["args.h", "oxccl.cuh", "reduce.cu", "collective.cu", "stage.cu", "program.cu", "host_shim.h", "test/emulate.cpp"];
// Warnings are shown, not fatal: other compilers warn about other things (the
// kernels' own gate is NVRTC's empty log). Unoptimised: the harness builds in
// 18 s instead of 50 s at -O1, and the emulation runs as fast (its time is
// the host threads' waits and yields, not the kernels' arithmetic).
pub const FLAGS: &[&str] = &["-std=c++20", "-O0", "-pthread", "-fno-strict-aliasing", "-Wall", "-Wextra"];

pub fn cuda_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../cuda")
}

/// The harness binary, built on first use; `None` (with a message) when no
/// C++ compiler runs here, a failure instead where `OXCCL_REQUIRE_CC` is
/// set. A compile error panics: the kernels are broken.
pub fn harness() -> Option<&'static Path> {
    static HARNESS: OnceLock<Option<PathBuf>> = OnceLock::new();
    HARNESS.get_or_init(build_harness).as_deref()
}

pub fn build_harness() -> Option<PathBuf> {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    if let Err(e) = Command::new(&cxx).arg("--version").output() {
        let why = format!("no C++ compiler ({cxx}: {e}): the CUDA kernel emulation did not run");
        oxccl_skip::skip_or_fail("OXCCL_REQUIRE_CC", why);
        return None;
    }
    let mut h = DefaultHasher::new();
    for f in SOURCES {
        let path = cuda_dir().join(f);
        std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display())).hash(&mut h);
    }
    FLAGS.hash(&mut h);
    cxx.hash(&mut h);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let exe = dir.join(format!("oxccl-emulate-{:016x}", h.finish()));
    if exe.exists() {
        return Some(exe);
    }
    let tmp = dir.join(format!("oxccl-emulate-{}.tmp", std::process::id()));
    let out = Command::new(&cxx)
        .args(FLAGS)
        .arg(cuda_dir().join("test/emulate.cpp"))
        .arg("-o")
        .arg(&tmp)
        .output()
        .unwrap_or_else(|e| panic!("running {cxx}: {e}"));
    assert!(out.status.success(), "building the emulation harness failed:\n{}", String::from_utf8_lossy(&out.stderr));
    if !out.stderr.is_empty() {
        eprintln!("{cxx} warned building the emulation harness:\n{}", String::from_utf8_lossy(&out.stderr));
    }
    std::fs::rename(&tmp, &exe).expect("moving the harness into place");
    Some(exe)
}

/// One answer of the harness: the numbers of its "ok" line and its bytes.
pub struct Answer {
    pub head: Vec<u64>,
    pub data: Vec<u8>,
}

/// Runs a batch of jobs (header lines with their input bytes) in one harness
/// process.
pub fn run_jobs(exe: &Path, input: Vec<u8>) -> Vec<Answer> {
    if let Ok(dir) = std::env::var("OXCCL_EMULATE_DUMP") {
        // Debugging: keep the jobs to feed the harness by hand.
        let path = Path::new(&dir).join(format!("jobs-{}-{:?}", std::process::id(), std::thread::current().id()));
        std::fs::write(&path, &input).expect("writing the dump");
        eprintln!("jobs written to {}", path.display());
    }
    let mut child = Command::new(exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the harness");
    let mut stdin = child.stdin.take().expect("stdin");
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let mut out = Vec::new();
    child.stdout.take().expect("stdout").read_to_end(&mut out).expect("reading the harness");
    let status = child.wait().expect("waiting for the harness");
    let mut err = String::new();
    child.stderr.take().expect("stderr").read_to_string(&mut err).expect("reading stderr");
    assert!(status.success(), "harness failed ({status}): {err}");
    writer.join().expect("writer").expect("writing jobs");
    let mut answers = Vec::new();
    let mut rest = &out[..];
    while !rest.is_empty() {
        let nl = rest.iter().position(|&b| b == b'\n').expect("answer line");
        let line = std::str::from_utf8(&rest[..nl]).expect("utf-8");
        let mut words = line.split_whitespace();
        assert_eq!(words.next(), Some("ok"), "harness answered {line:?}");
        let mut head: Vec<u64> = words.map(|w| w.parse().expect("number")).collect();
        let n = head.pop().expect("byte count") as usize;
        answers.push(Answer { head, data: rest[nl + 1..nl + 1 + n].to_vec() });
        rest = &rest[nl + 1 + n..];
    }
    answers
}

// ---------------------------------------------------------------------------
// Values.

/// xorshift64*: reproducible test data without a dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `v` (exactly representable, or to be rounded/truncated) as one element.
pub fn elem(dtype: DataType, v: f64) -> Vec<u8> {
    match dtype {
        DataType::Int8 => (v as i8).to_ne_bytes().to_vec(),
        DataType::Uint8 => (v as u8).to_ne_bytes().to_vec(),
        DataType::Int32 => (v as i32).to_ne_bytes().to_vec(),
        DataType::Uint32 => (v as u32).to_ne_bytes().to_vec(),
        DataType::Int64 => (v as i64).to_ne_bytes().to_vec(),
        DataType::Uint64 => (v as u64).to_ne_bytes().to_vec(),
        DataType::Float16 => f16::from_f64(v).to_bits().to_ne_bytes().to_vec(),
        DataType::Float32 => (v as f32).to_ne_bytes().to_vec(),
        DataType::Float64 => v.to_ne_bytes().to_vec(),
        DataType::Bfloat16 => bf16::from_f64(v).to_bits().to_ne_bytes().to_vec(),
        DataType::Float8E4M3 => vec![F8E4M3::from_f64(v).to_bits()],
        DataType::Float8E5M2 => vec![F8E5M2::from_f64(v).to_bits()],
    }
}

pub fn narrow_float(dtype: DataType) -> bool {
    dtype.is_float() && dtype.size() < 4
}

/// Inputs for `op` on `dtype`: random bits where every pattern must come out
/// the same (integers; max/min, which select an operand), otherwise values
/// whose partial sums and products the narrow types hold exactly (so that
/// the kernels' f32 accumulation and oxccl-core's rounding after every step
/// agree), or random finite ones for f32/f64 (same operation order: same bits).
pub fn inputs_for(rng: &mut Rng, dtype: DataType, op: ReduceOp, n: usize) -> Vec<u8> {
    let bits = !dtype.is_float() || matches!(op, ReduceOp::Max | ReduceOp::Min);
    if bits {
        return (0..n * dtype.size()).map(|_| rng.next() as u8).collect();
    }
    let value = |rng: &mut Rng| -> f64 {
        match (op, narrow_float(dtype)) {
            (ReduceOp::Prod, _) => {
                rng.pick(&[-1.0, 1.0, 2.0, 0.5, -0.5, 1.0])
                    * if narrow_float(dtype) { 1.0 } else { 1.0 + rng.unit() / 8.0 }
            }
            (_, true) if dtype.size() == 1 => rng.pick(&[-1.0, 0.0, 1.0]),
            (_, true) => (rng.below(33) as f64) - 16.0,
            (_, false) => (rng.unit() - 0.5) * 2000.0,
        }
    };
    (0..n).flat_map(|_| elem(dtype, value(rng))).collect()
}

/// A premul scalar for `dtype` that keeps [`inputs_for`]'s sums exact.
pub fn gen_scale(rng: &mut Rng, dtype: DataType) -> f64 {
    match dtype {
        DataType::Float8E5M2 => rng.pick(&[1.0, -1.0]),
        DataType::Float8E4M3 => rng.pick(&[2.0, 0.5, -1.0]),
        DataType::Float16 | DataType::Bfloat16 => rng.pick(&[2.0, 0.5, -1.0, 3.0]),
        DataType::Float32 | DataType::Float64 => (rng.unit() - 0.5) * 6.0,
        // Integers truncate and saturate.
        _ => rng.pick(&[3.7, -2.9, 0.5, 1e30, -1e30, 77.0, -128.5]),
    }
}

/// The kernel module's op number and the reduce args' premul/avg.
pub fn kernel_op(op: ReduceOp) -> u32 {
    match op {
        ReduceOp::Prod => 1,
        ReduceOp::Max => 2,
        ReduceOp::Min => 3,
        _ => 0,
    }
}

/// oxccl-core's result: premul source 0 by `scales[0]` (or each by its
/// scale), reduce in order, average over `avg` if set.
pub fn reference(dtype: DataType, op: ReduceOp, srcs: &[&[u8]], scales: &[f64], avg: usize) -> Vec<u8> {
    let pre: Vec<Vec<u8>> = srcs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut d = s.to_vec();
            if matches!(op, ReduceOp::PreMulSum { .. }) && i < scales.len() {
                kernels::premul(dtype, &mut d, s, scales[i]).unwrap();
            }
            d
        })
        .collect();
    let refs: Vec<&[u8]> = pre.iter().map(|v| &v[..]).collect();
    let mut dst = vec![0u8; srcs[0].len()];
    kernels::reduce_n(dtype, op, &mut dst, &refs).unwrap();
    if avg != 0 {
        kernels::finish_avg(dtype, &mut dst, avg).unwrap();
    }
    dst
}

/// The first differing element, for messages.
pub fn first_diff(dtype: DataType, got: &[u8], want: &[u8]) -> String {
    let e = dtype.size();
    match got.chunks(e).zip(want.chunks(e)).position(|(a, b)| a != b) {
        Some(i) => {
            format!("element {i}: got {:02x?}, want {:02x?}", &got[i * e..(i + 1) * e], &want[i * e..(i + 1) * e])
        }
        None => format!("lengths {} and {}", got.len(), want.len()),
    }
}
