/* A stand-in for the CUDA runtime's header, with what NVIDIA's nccl.h
 * uses: the stream and event handles, declared as the CUDA runtime
 * declares them (opaque pointers). For nvidia_header.rs, which compiles
 * NVIDIA's nccl.h where no CUDA toolkit is installed. */
#ifndef OXCCL_CUDA_STUB_RUNTIME_H
#define OXCCL_CUDA_STUB_RUNTIME_H
#define CUDART_VERSION 13000
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
#endif
