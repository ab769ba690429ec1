//! The kernel sources (`cuda/`, embedded) and their compilation to PTX with
//! NVRTC: one module per (architecture, data type, operator), compiled once
//! per process ([`ptx`] caches; [`compile`] does not).
//!
//! NVRTC runs without a GPU; it is loaded at run time (`libnvrtc.so.13` or
//! `.12`, found through `LD_LIBRARY_PATH` or the system's library path). Its
//! log must be empty: a warning fails the build like an error.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int};
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::nvrtc::{result as nvrtc, sys as nsys};
use oxccl_core::{DataType, ReduceOp};

use crate::error::{CudaError, Result, invalid};

/// The kernel sources in the order [`source`] concatenates them: (file name,
/// text). `.cu` files include `oxccl.cuh` only without `OXCCL_NVRTC`.
pub const SOURCES: [(&str, &str); 5] = [
    ("args.h", include_str!("../../../cuda/args.h")),
    ("oxccl.cuh", include_str!("../../../cuda/oxccl.cuh")),
    ("reduce.cu", include_str!("../../../cuda/reduce.cu")),
    ("collective.cu", include_str!("../../../cuda/collective.cu")),
    ("stage.cu", include_str!("../../../cuda/stage.cu")),
];

/// The kernels' entry points, present in every module.
pub const ENTRY_POINTS: [&str; 4] = ["oxccl_reduce", "oxccl_collective", "oxccl_signal_host", "oxccl_wait_host"];

/// The operator a module is built for (`OXCCL_OP`). `Avg` and `PreMulSum`
/// run the `Sum` module with flags in the arguments ([`KernelOp::of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum KernelOp {
    /// Sum (integers wrap); also `Avg` and `PreMulSum`.
    Sum = 0,
    /// Product (integers wrap).
    Prod = 1,
    /// Maximum (`fmaxf` semantics on floats).
    Max = 2,
    /// Minimum (`fminf` semantics on floats).
    Min = 3,
}

impl KernelOp {
    /// Every operator, in `OXCCL_OP` order.
    pub const ALL: [KernelOp; 4] = [KernelOp::Sum, KernelOp::Prod, KernelOp::Max, KernelOp::Min];

    /// The module that runs `op`.
    pub fn of(op: ReduceOp) -> KernelOp {
        match op {
            ReduceOp::Prod => KernelOp::Prod,
            ReduceOp::Max => KernelOp::Max,
            ReduceOp::Min => KernelOp::Min,
            ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PreMulSum { .. } => KernelOp::Sum,
        }
    }

    /// `sum`, `prod`, `max` or `min`.
    pub const fn name(self) -> &'static str {
        match self {
            KernelOp::Sum => "sum",
            KernelOp::Prod => "prod",
            KernelOp::Max => "max",
            KernelOp::Min => "min",
        }
    }
}

impl fmt::Display for KernelOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// PTX text of one module, as NVRTC produced it (no trailing NUL).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ptx(pub String);

impl Ptx {
    /// The PTX text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The concatenated source NVRTC compiles: every file of [`SOURCES`] after a
/// `#line 1 "<file>"` directive, so NVRTC's messages name the file and line.
pub fn source() -> String {
    let mut s = String::with_capacity(SOURCES.iter().map(|(_, t)| t.len() + 32).sum());
    for (name, text) in SOURCES {
        s.push_str(&format!("#line 1 \"{name}\"\n"));
        s.push_str(text);
        if !text.ends_with('\n') {
            s.push('\n');
        }
    }
    s
}

/// The NVRTC options of the module (arch, dtype, op).
pub fn options(arch: u32, dtype: DataType, op: KernelOp) -> Vec<String> {
    vec![
        "-DOXCCL_NVRTC".to_string(),
        format!("-DOXCCL_DTYPE={}", dtype.to_nccl()),
        format!("-DOXCCL_OP={}", op as u32),
        format!("--gpu-architecture=compute_{arch}"),
        "-std=c++17".to_string(),
        "-default-device".to_string(),
    ]
}

/// Whether NVRTC can be loaded: `Err(CudaError::Unavailable)` naming the
/// library otherwise. Never panics.
pub fn nvrtc_available() -> Result<()> {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: is_culib_present only tries to dlopen NVRTC's candidate names
    // (and closes what it opened); it calls nothing in the library.
    if *PRESENT.get_or_init(|| unsafe { nsys::is_culib_present() }) {
        Ok(())
    } else {
        Err(CudaError::Unavailable(
            "libnvrtc.so (.13 or .12) not found; put its directory on LD_LIBRARY_PATH \
             (pip install nvidia-cuda-nvrtc-cu12 ships one)"
                .to_string(),
        ))
    }
}

/// NVRTC's version (major, minor).
pub fn nvrtc_version() -> Result<(u32, u32)> {
    nvrtc_available()?;
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: NVRTC is present (checked above); both pointers are valid for writes.
    let r = unsafe { nsys::nvrtcVersion(&mut major, &mut minor) };
    r.result().map_err(|e| CudaError::Unavailable(format!("nvrtcVersion failed: {:?}", e.0)))?;
    Ok((major as u32, minor as u32))
}

/// The `compute_XX` numbers this NVRTC can compile for, ascending.
pub fn supported_archs() -> Result<Vec<u32>> {
    nvrtc_available()?;
    let mut n: c_int = 0;
    // SAFETY: NVRTC is present; `n` is valid for writes.
    let r = unsafe { nsys::nvrtcGetNumSupportedArchs(&mut n) };
    r.result().map_err(|e| CudaError::Unavailable(format!("nvrtcGetNumSupportedArchs failed: {:?}", e.0)))?;
    let mut archs = vec![0 as c_int; n.max(0) as usize];
    // SAFETY: `archs` has room for the `n` entries NVRTC writes.
    let r = unsafe { nsys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) };
    r.result().map_err(|e| CudaError::Unavailable(format!("nvrtcGetSupportedArchs failed: {:?}", e.0)))?;
    let mut archs: Vec<u32> = archs.into_iter().filter_map(|a| u32::try_from(a).ok()).collect();
    archs.sort_unstable();
    Ok(archs)
}

/// The architecture to compile for on a device of compute capability
/// `device_arch` (major × 10 + minor): the highest one NVRTC supports that is
/// not above the device's (PTX runs on later devices through the driver's JIT).
pub fn arch_for_device(device_arch: u32) -> Result<u32> {
    let archs = supported_archs()?;
    archs.iter().rev().copied().find(|&a| a <= device_arch).ok_or_else(|| {
        CudaError::Unavailable(format!(
            "this NVRTC compiles for compute_{archs:?}, none of which runs on a device of compute capability \
             {}.{}",
            device_arch / 10,
            device_arch % 10
        ))
    })
}

/// Destroys an NVRTC program when dropped.
struct Program(nsys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by nvrtcCreateProgram and is destroyed once, here.
        let _ = unsafe { nvrtc::destroy_program(self.0) };
    }
}

/// NVRTC's log of `prog`, trimmed of NULs and white space.
fn program_log(prog: &Program) -> String {
    // SAFETY: `prog` is a live program.
    match unsafe { nvrtc::get_program_log(prog.0) } {
        Ok(bytes) => c_chars_to_string(&bytes).trim().to_string(),
        Err(e) => format!("(no log: nvrtcGetProgramLog failed: {:?})", e.0),
    }
}

/// The text up to the first NUL of a `c_char` buffer.
fn c_chars_to_string(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Compiles the module (arch, dtype, op) to PTX, without caching (see
/// [`ptx`]). Errors with [`CudaError::Nvrtc`] and NVRTC's log if compilation
/// fails or logs anything (warnings are errors); with
/// [`CudaError::Unavailable`] if NVRTC cannot be loaded.
pub fn compile(arch: u32, dtype: DataType, op: KernelOp) -> Result<Ptx> {
    if !(30..=1000).contains(&arch) {
        return Err(invalid(format!(
            "architecture {arch} is not a compute capability number like 80 or 90 (major × 10 + minor)"
        )));
    }
    compile_text(&source(), arch, dtype, op)
}

/// [`compile`] of `text` instead of the embedded source.
fn compile_text(text: &str, arch: u32, dtype: DataType, op: KernelOp) -> Result<Ptx> {
    nvrtc_available()?;
    let fail = |log: String| CudaError::Nvrtc { arch, dtype, op, log };
    let src = CString::new(text).map_err(|_| fail("the kernel source contains a NUL byte".into()))?;
    let name: &CStr = c"oxccl.cu";
    let prog =
        Program(nvrtc::create_program(&src, Some(name)).map_err(|e| fail(format!("nvrtcCreateProgram: {:?}", e.0)))?);
    let opts = options(arch, dtype, op);
    // SAFETY: `prog` is live; `src` and `name`, which it refers to, outlive it.
    let compiled = unsafe { nvrtc::compile_program(prog.0, &opts) };
    let log = program_log(&prog);
    if let Err(e) = compiled {
        return Err(fail(format!("{:?} with options {}:\n{log}", e.0, opts.join(" "))));
    }
    if !log.is_empty() {
        return Err(fail(format!("warnings are errors (options {}):\n{log}", opts.join(" "))));
    }
    // SAFETY: `prog` is live and compiled.
    let chars = unsafe { nvrtc::get_ptx(prog.0) }.map_err(|e| fail(format!("nvrtcGetPTX: {:?}", e.0)))?;
    let text = c_chars_to_string(&chars);
    if text.is_empty() {
        return Err(fail("NVRTC returned empty PTX".into()));
    }
    Ok(Ptx(text))
}

/// One cache slot: filled once by the first thread that compiles it.
type Slot = Arc<Mutex<Option<Arc<Ptx>>>>;

/// The PTX cache: (arch, dtype, op) → slot.
type Cache = Mutex<HashMap<(u32, DataType, KernelOp), Slot>>;

/// The PTX of module (arch, dtype, op), compiled on first use and cached for
/// the life of the process. Threads asking for different modules compile in
/// parallel; threads asking for the same one wait for the first. Failures are
/// not cached.
pub fn ptx(arch: u32, dtype: DataType, op: KernelOp) -> Result<Arc<Ptx>> {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let slot: Slot = {
        let mut map = CACHE.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
        map.entry((arch, dtype, op)).or_default().clone()
    };
    let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(ptx) = slot.as_ref() {
        return Ok(ptx.clone());
    }
    let ptx = Arc::new(compile(arch, dtype, op)?);
    *slot = Some(ptx.clone());
    Ok(ptx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_is_the_files_in_order_with_line_markers() {
        let s = source();
        let mut at = 0;
        for (name, text) in SOURCES {
            let marker = format!("#line 1 \"{name}\"\n");
            let found = s[at..].find(&marker).unwrap_or_else(|| panic!("{name} missing or out of order"));
            at += found + marker.len();
            assert!(s[at..].starts_with(text), "{name}'s text does not follow its marker");
            at += text.len();
        }
        assert!(s.contains("struct oxccl_reduce_args"));
    }

    #[test]
    fn options_name_type_op_and_arch() {
        let o = options(90, DataType::Bfloat16, KernelOp::Min);
        for want in ["-DOXCCL_NVRTC", "-DOXCCL_DTYPE=9", "-DOXCCL_OP=3", "--gpu-architecture=compute_90", "-std=c++17"]
        {
            assert!(o.iter().any(|x| x == want), "{want} missing from {o:?}");
        }
    }

    #[test]
    fn kernel_op_of_reduce_op() {
        assert_eq!(KernelOp::of(ReduceOp::Avg), KernelOp::Sum);
        assert_eq!(KernelOp::of(ReduceOp::PreMulSum { scalar: 2.0 }), KernelOp::Sum);
        assert_eq!(KernelOp::of(ReduceOp::Min), KernelOp::Min);
        assert_eq!(KernelOp::ALL.map(|o| o as u32), [0, 1, 2, 3]);
        assert_eq!(KernelOp::Prod.to_string(), "prod");
    }

    /// Whether NVRTC is here; prints why a test is skipped if not.
    fn have_nvrtc() -> bool {
        match nvrtc_available() {
            Ok(()) => true,
            Err(e) if std::env::var("OXCCL_REQUIRE_NVRTC").as_deref() == Ok("1") => {
                panic!("OXCCL_REQUIRE_NVRTC=1: {e}")
            }
            Err(e) => {
                eprintln!("skipped (no NVRTC): {e}");
                false
            }
        }
    }

    #[test]
    fn warnings_and_errors_fail_with_the_log() {
        if !have_nvrtc() {
            return;
        }
        let ok = "extern \"C\" __global__ void k(int *p) { p[threadIdx.x] = 1; }\n";
        let ptx = compile_text(ok, 80, DataType::Int32, KernelOp::Sum).unwrap();
        assert!(ptx.as_str().contains(".entry k"), "{}", ptx.as_str());
        assert!(ptx.as_str().contains(".target sm_80"));
        let warn = "extern \"C\" __global__ void k(int *p) { int unused; p[0] = 1; }\n";
        match compile_text(warn, 80, DataType::Int32, KernelOp::Sum) {
            Err(CudaError::Nvrtc { log, arch: 80, .. }) => {
                assert!(log.contains("warnings are errors") && log.contains("unused"), "{log}")
            }
            other => panic!("a warning must fail the build: {other:?}"),
        }
        let broken = "#line 1 \"reduce.cu\"\nextern \"C\" __global__ void k(int *p) { p[0] = q; }\n";
        match compile_text(broken, 90, DataType::Float32, KernelOp::Max) {
            Err(e @ CudaError::Nvrtc { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains("reduce.cu(1)") && msg.contains("compute_90, float max"), "{msg}");
            }
            other => panic!("an error must fail the build: {other:?}"),
        }
    }

    #[test]
    fn bad_arch_is_rejected_before_nvrtc() {
        let e = compile(7, DataType::Float32, KernelOp::Sum).unwrap_err();
        assert!(e.to_string().contains("architecture 7"), "{e}");
    }
}
