// Stream-ordered signalling between a kernel stream and the host (staging
// through pinned host memory): the stream tells the host it got this far, or
// waits for the host to say the next piece is ready. Both are type-independent
// and in every module; launch them with one thread (others do nothing).
#ifndef OXCCL_STAGE_CU
#define OXCCL_STAGE_CU
#ifndef OXCCL_NVRTC
#include "oxccl.cuh"
#endif

// *word = value (u64, host-mapped), after everything the stream did before
// is visible system-wide.
OX_DEV void ox_signal_host(u64 word, u64 value) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    ox_fence_sys();
    ox_st_release_sys(word, value);
}

// Spins until *word >= value (the host wrote it), the host set the abort word
// status[1] (status[0] := 2), or timeout_ns passed (status[0] := 1). The
// first failure code wins; status may be 0 (no status: the wait gives up
// silently on timeout).
OX_DEV void ox_wait_host(u64 word, u64 value, u64 status, u64 timeout_ns) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    ox_wait_geq(word, value, status, timeout_ns);
}

extern "C" __global__ void __launch_bounds__(512) oxccl_signal_host(u64 word, u64 value) {
    ox_signal_host(word, value);
}

extern "C" __global__ void __launch_bounds__(512) oxccl_wait_host(u64 word, u64 value, u64 status, u64 timeout_ns) {
    ox_wait_host(word, value, status, timeout_ns);
}

#endif  // OXCCL_STAGE_CU
