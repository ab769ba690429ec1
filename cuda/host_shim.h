// The CUDA built-ins and oxccl.cuh's primitives for the host emulation
// (g++ -std=c++20): the kernels' own source runs with one host thread per
// CUDA thread. Never seen by NVRTC.
//
// - threadIdx/blockIdx/blockDim/gridDim are thread_local, set by the
//   launcher (cuda/test/emulate.cpp) before a thread enters a kernel;
// - __syncthreads() waits on the block's std::barrier;
// - OX_SHARED(type, name) binds `name` to the block's shared storage
//   (OX_HOST_SMEM_BYTES, one object per block; kernels keep all their shared
//   state in one struct);
// - flags use __atomic builtins (release/acquire), the timer steady_clock,
//   spin loops yield the CPU.
#ifndef OXCCL_HOST_SHIM_H
#define OXCCL_HOST_SHIM_H

#include <barrier>
#include <chrono>
#include <sched.h>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define OX_DEV inline
#define OX_NOINLINE __attribute__((noinline))
#define OX_UNROLL

#define OX_HOST_SMEM_BYTES 4096
#define OX_SHARED(type, name)                                                                                         \
    static_assert(sizeof(type) <= OX_HOST_SMEM_BYTES, "shared state too large for the emulation");                  \
    type &name = *static_cast<type *>(ox_host_smem)

struct alignas(16) uint4 {
    u32 x, y, z, w;
};

struct ox_dim3 {
    u32 x, y, z;
};

inline thread_local ox_dim3 threadIdx, blockIdx, blockDim, gridDim;
inline thread_local std::barrier<> *ox_host_bar;
inline thread_local void *ox_host_smem;

inline void __syncthreads() { ox_host_bar->arrive_and_wait(); }

inline u32 ox_f2u(float f) { return __builtin_bit_cast(u32, f); }
inline float ox_u2f(u32 u) { return __builtin_bit_cast(float, u); }
inline u64 ox_d2u(double d) { return __builtin_bit_cast(u64, d); }
// ISO C++ mode (-std=c++20): GCC does not contract a * b + c.
inline float ox_fmul(float a, float b) { return a * b; }
inline double ox_dmul(double a, double b) { return a * b; }

inline void ox_st_release_sys(u64 addr, u64 v) { __atomic_store_n((u64 *)addr, v, __ATOMIC_RELEASE); }
inline u64 ox_ld_acquire_sys(u64 addr) { return __atomic_load_n((u64 *)addr, __ATOMIC_ACQUIRE); }
inline u32 ox_ld_relaxed_sys_u32(u64 addr) { return __atomic_load_n((u32 *)addr, __ATOMIC_RELAXED); }
inline u32 ox_cas_u32(u64 addr, u32 expect, u32 v) {
    __atomic_compare_exchange_n((u32 *)addr, &expect, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return expect;
}
inline void ox_fence_sys() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void ox_atom_add_u64(u64 addr, u64 v) { __atomic_fetch_add((u64 *)addr, v, __ATOMIC_RELAXED); }
inline u64 ox_ld_u64(u64 addr) { return __atomic_load_n((u64 *)addr, __ATOMIC_RELAXED); }
inline void ox_st_u64(u64 addr, u64 v) { __atomic_store_n((u64 *)addr, v, __ATOMIC_RELAXED); }
inline u64 ox_timer_ns() {
    return (u64)std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}
inline void ox_pause() { sched_yield(); }

#endif  // OXCCL_HOST_SHIM_H
