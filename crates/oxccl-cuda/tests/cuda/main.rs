//! The integration tests of oxccl-cuda that need no GPU, one binary (the GPU
//! tests are cuda_gpu.rs, their own binary, which tools/gpu-check packs): the
//! kernels compiled by NVRTC, the kernel cache, the argument and program
//! layouts shared with the CUDA source, and the CUDA source run through its
//! host emulation (collective kernels, the device executor, send/recv).

mod common;
mod emulate;
mod kernel_cache;
mod layout;
mod nvrtc;
mod p2p_emulate;
mod program_emulate;
