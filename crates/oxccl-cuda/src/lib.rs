//! oxccl's CUDA glue: devices, device memory, CUDA IPC, host-mapped flag
//! words, pinned staging buffers, streams and events, and the oxccl kernels
//! (`cuda/*.cu`, compiled with NVRTC at run time), over
//! [cudarc](https://docs.rs/cudarc) with dynamic loading.
//!
//! # No GPU, no problem
//!
//! The crate is always built; libcuda and libnvrtc are loaded when first
//! needed. Without them every entry point returns
//! [`CudaError::Unavailable`] ("CUDA unavailable: libcuda.so.1 not found …")
//! instead of panicking. Ask first with [`driver_available`] and
//! [`nvrtc_available`]. NVRTC needs no GPU: [`kernels::compile`] works on any
//! machine with `libnvrtc.so.12`/`.13` on the library path (PyPI's
//! `nvidia-cuda-nvrtc-cu12` ships one).
//!
//! # Quick start
//!
//! ```no_run
//! use oxccl_core::{DataType, ReduceOp};
//! use oxccl_cuda::{Device, KernelOp, ReduceArgs};
//! use std::time::Duration;
//!
//! # fn main() -> Result<(), oxccl_cuda::CudaError> {
//! oxccl_cuda::driver_available()?;
//! let dev = Device::open(0)?;
//! let (a, b) = (dev.alloc_zeroed(4096)?, dev.alloc_zeroed(4096)?);
//! a.write(0, &1.5f32.to_ne_bytes())?;
//! let module = dev.module(DataType::Float32, KernelOp::of(ReduceOp::Sum))?;
//! let stream = dev.new_stream()?;
//! let mut args = ReduceArgs { count: 1024, nsrcs: 2, ndsts: 1, ..Default::default() };
//! (args.srcs[0], args.srcs[1], args.dsts[0]) = (a.addr(), b.addr(), b.addr());
//! // SAFETY: a and b hold 1024 f32 each and outlive the kernel (we wait below).
//! unsafe { module.launch_reduce(&stream, 4 * dev.sm_count(), 512, &args)? };
//! stream.synchronize(Duration::from_secs(10))?;
//! # Ok(()) }
//! ```
//!
//! # What is here
//!
//! - [`Device`]: a GPU through its primary context (the CUDA runtime's, so
//!   pointers and streams from PyTorch or a C caller work). Properties
//!   (`sm_count`, `arch`, `uuid`), allocation ([`Device::alloc`],
//!   [`Device::host_mapped`], [`Device::pinned`]), IPC ([`Device::open_ipc`]),
//!   streams and events, [`Device::check_device_range`] for user buffers, and
//!   [`Device::module`]: the kernels for one data type × operator.
//! - [`kernels`]: the embedded sources ([`kernels::SOURCES`], concatenated by
//!   [`kernels::source`]), NVRTC compilation ([`kernels::compile`]; any NVRTC
//!   log — a warning too — is an error) and the process-wide PTX cache
//!   ([`kernels::ptx`], keyed by architecture, type and operator).
//! - [`cache`]: the kernel cache on disk (`OXCCL_CACHE_DIR`), which
//!   [`kernels::image`] reads and fills and [`kernels::fill`] (the
//!   `oxccl-kernel-cache` tool) fills ahead of time, without a GPU.
//! - [`Module`]: the four entry points of `cuda/` loaded in a context;
//!   `launch_reduce`, `launch_collective`, `signal_host`, `wait_host`.
//! - [`ReduceArgs`], [`CollArgs`]: `#[repr(C)]` mirrors of `cuda/args.h`
//!   (a test compares every offset with the C compiler's).
//! - [`Stream`] (borrowed handle or owned), asynchronous copies on raw
//!   addresses, [`Event`]s. Every host wait takes a deadline.
//!
//! # Safety and threads
//!
//! Everything is `Send + Sync`; every call binds the device's context to the
//! calling thread first. Device memory is reached only through addresses,
//! never as `&[u8]`. What the compiler cannot check is `unsafe`: kernel
//! launches and copies on raw addresses (the caller vouches that the memory
//! is valid until the stream has finished), borrowed stream handles, and the
//! host side of [`Pinned`] staging buffers. [`HostMapped`] memory, written by
//! kernels while the host reads it, is exposed only as atomics.
#![deny(unsafe_code)]

mod args;
pub mod bench;
pub mod cache;
mod context;
mod device;
mod error;
pub mod kernels;
mod memory;
mod op;
pub mod program;
mod source;
mod stream;

pub use args::{
    Coll, CollArgs, FLAG_BYTES, MAX_BLOCKS, MAX_RANKS, MAX_SRCS, ReduceArgs, STATUS_ABORTED, STATUS_INVALID, STATUS_OK,
    STATUS_TIMEOUT, check_status,
};
pub use device::{Device, Module, driver_available, driver_version};
pub use error::{CudaError, Result};
pub use kernels::{KernelOp, Ptx, nvrtc_available};
pub use memory::{
    DevMem, HostMapped, IPC_HANDLE_BYTES, IpcMapping, Pinned, alloc_device, current_device, device_of, free_device,
    is_device_memory, read_device,
};
pub use stream::{Event, Stream};

/// cudarc, re-exported for callers that need its types (`CudaStream`, `sys`).
pub use cudarc;

// Every handle can be shared between threads (checked at compile time).
const _: () = {
    const fn shareable<T: Send + Sync>() {}
    shareable::<Device>();
    shareable::<Module>();
    shareable::<Stream>();
    shareable::<Event>();
    shareable::<DevMem>();
    shareable::<IpcMapping>();
    shareable::<HostMapped>();
    shareable::<Pinned>();
    shareable::<CudaError>();
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_availability_is_an_error_value() {
        match driver_available() {
            Ok(()) => assert!(Device::count().unwrap() > 0, "cuInit succeeded, so a device is visible"),
            Err(e) => {
                let msg = e.to_string();
                eprintln!("driver_available() on this machine: {msg}");
                assert!(msg.starts_with("CUDA unavailable: "), "{msg}");
                assert!(matches!(e, CudaError::Unavailable(_)));
                // Everything that needs the driver says the same, without panicking.
                assert_eq!(Device::count().unwrap_err(), e);
                assert_eq!(Device::open(0).unwrap_err(), e);
                assert!(driver_version().is_err());
            }
        }
    }

    #[test]
    fn errors_map_to_core_errors() {
        let core: oxccl_core::Error = CudaError::Unavailable("libcuda.so.1 not found".into()).into();
        assert_eq!(core.to_string(), "unavailable: CUDA: libcuda.so.1 not found");
        let core: oxccl_core::Error = CudaError::Invalid("bad".into()).into();
        assert_eq!(core.nccl_code(), 4);
        let core: oxccl_core::Error = CudaError::Driver { call: "cuMemAlloc", code: "OOM".into() }.into();
        assert!(core.to_string().contains("cuMemAlloc"));
    }
}
