//! The integration tests of libnccl.so.2 that need no GPU, one binary (the GPU
//! tests are c_abi_gpu.rs, their own binary, which tools/gpu-check packs): C
//! programs compiled against include/nccl.h and run on the library, its
//! exports against NVIDIA's, its header against NVIDIA's nccl.h, and one
//! thread per communicator.

mod c_abi;
mod exports;
mod nvidia_header;
mod one_thread_per_comm;
