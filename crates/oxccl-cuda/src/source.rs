//! The kernel sources (`cuda/`, embedded) and the NVRTC options of each
//! module: what [`crate::kernels`] compiles and what the disk cache
//! ([`crate::cache`]) keys its entries by.

use oxccl_core::DataType;

use crate::op::KernelOp;

/// The kernel sources in the order [`source`] concatenates them: (file name,
/// text). `.cu` files include `oxccl.cuh` only without `OXCCL_NVRTC`.
pub const SOURCES: [(&str, &str); 6] = [
    ("args.h", include_str!("../../../cuda/args.h")),
    ("oxccl.cuh", include_str!("../../../cuda/oxccl.cuh")),
    ("reduce.cu", include_str!("../../../cuda/reduce.cu")),
    ("collective.cu", include_str!("../../../cuda/collective.cu")),
    ("stage.cu", include_str!("../../../cuda/stage.cu")),
    ("program.cu", include_str!("../../../cuda/program.cu")),
];

/// The kernels' entry points, present in every module.
pub const ENTRY_POINTS: [&str; 6] =
    ["oxccl_reduce", "oxccl_collective", "oxccl_signal_host", "oxccl_wait_host", "oxccl_program", "oxccl_p2p"];

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

/// The NVRTC options of the module (arch, dtype, op), compiled to PTX for
/// the virtual architecture `compute_<arch>`.
pub fn options(arch: u32, dtype: DataType, op: KernelOp) -> Vec<String> {
    options_for(arch, dtype, op, false)
}

/// [`options`], for the real architecture `sm_<arch>` (a CUBIN) when `cubin`.
pub(crate) fn options_for(arch: u32, dtype: DataType, op: KernelOp, cubin: bool) -> Vec<String> {
    vec![
        "-DOXCCL_NVRTC".to_string(),
        format!("-DOXCCL_DTYPE={}", dtype.to_nccl()),
        format!("-DOXCCL_OP={}", op as u32),
        format!("--gpu-architecture={}_{arch}", if cubin { "sm" } else { "compute" }),
        "-std=c++17".to_string(),
        "-default-device".to_string(),
    ]
}
