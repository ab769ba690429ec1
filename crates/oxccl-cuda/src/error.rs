//! The crate's error type and the mapping of driver result codes.

use cudarc::driver::DriverError;
use oxccl_core::DataType;

use crate::op::KernelOp;

/// Result with [`CudaError`].
pub type Result<T, E = CudaError> = std::result::Result<T, E>;

/// Everything that can go wrong on the GPU path, as a value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CudaError {
    /// No usable CUDA: the library is missing, `cuInit` failed, no device.
    /// The string is the reason; the message reads `CUDA unavailable: <reason>`.
    #[error("CUDA unavailable: {0}")]
    Unavailable(String),
    /// NVRTC rejected the kernel sources, or compiled them with a warning
    /// (warnings are errors). `log` is NVRTC's log.
    #[error("NVRTC could not compile the oxccl kernels for compute_{arch}, {dtype} {op}:\n{log}")]
    Nvrtc {
        /// The `compute_XX` number.
        arch: u32,
        /// The module's element type.
        dtype: DataType,
        /// The module's operator.
        op: KernelOp,
        /// NVRTC's log (or the failing step, if there is no log).
        log: String,
    },
    /// A driver call failed. `code` is the driver's name for the result
    /// (`CUDA_ERROR_…`), its description, and where known a remedy.
    #[error("CUDA driver call {call} failed: {code}")]
    Driver {
        /// The driver entry point (`cuMemAlloc`, …).
        call: &'static str,
        /// The result code's name and description.
        code: String,
    },
    /// A caller passed something wrong; nothing was done.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// A wait passed its deadline (on the host, or a kernel's status word said so).
    #[error("timed out: {0}")]
    Timeout(String),
    /// A kernel gave up because the host asked it to (abort request).
    #[error("aborted: {0}")]
    Aborted(String),
}

impl From<CudaError> for oxccl_core::Error {
    fn from(e: CudaError) -> Self {
        match e {
            CudaError::Unavailable(reason) => oxccl_core::Error::Unavailable(format!("CUDA: {reason}")),
            CudaError::Invalid(msg) => oxccl_core::Error::InvalidArgument(msg),
            CudaError::Timeout(msg) => oxccl_core::Error::Timeout(msg),
            e @ CudaError::Nvrtc { .. } => oxccl_core::Error::Internal(e.to_string()),
            e @ (CudaError::Driver { .. } | CudaError::Aborted(_)) => oxccl_core::Error::System(e.to_string()),
        }
    }
}

/// The driver's name and description of `e` (`CUDA_ERROR_NO_DEVICE (no
/// CUDA-capable device is detected)`). Only call once libcuda is loaded.
pub(crate) fn describe(e: DriverError) -> String {
    let name = format!("{:?}", e.0);
    match e.error_string() {
        Ok(s) => format!("{name} ({})", s.to_string_lossy()),
        Err(_) => name,
    }
}

/// A closure turning a [`DriverError`] of `call` into a [`CudaError::Driver`].
pub(crate) fn drv(call: &'static str) -> impl FnOnce(DriverError) -> CudaError {
    move |e| CudaError::Driver { call, code: describe(e) }
}

/// A [`CudaError::Invalid`] with this message.
pub(crate) fn invalid(msg: impl Into<String>) -> CudaError {
    CudaError::Invalid(msg.into())
}
