// The n-ary reduce/copy engine (used by both kernels) and oxccl_reduce, the
// local reduce/copy kernel: dst[j][i] = fin(op(pre(src[0][i]), src[1][i], …)).
#ifndef OXCCL_REDUCE_CU
#define OXCCL_REDUCE_CU
#ifndef OXCCL_NVRTC
#include "oxccl.cuh"
#endif

// NV vectors of VB bytes, at byte offsets o, o + stride, …, o + (NV-1)·stride
// of every source and destination of the plan. ARITH false: a copy of the
// bits of src[0]. ARITH true: widen every source, premul src[0] if `pre`,
// combine in source order, divide by `avg` if not 0 (sum module only),
// narrow once. All NV loads of a source are issued before its math.
template <class T, int OP, int VB, bool ARITH, int NV>
OX_DEV void ox_vecs(const ox_plan &p, u64 o, u64 stride, typename T::A scale, bool pre, u32 avg) {
    typedef typename T::S S;
    typedef typename T::A A;
    typedef typename T::C C;
    typedef typename ox_vec<VB>::type V;
    const int K = VB / (int)sizeof(S);
    union U {
        V v;
        S e[K];
    };
    const u32 nsrc = p.nsrc, ndst = p.ndst;
    U x[NV];
OX_UNROLL
    for (int u = 0; u < NV; u++) x[u].v = ox_ld<V>(p.src[0] + o + u * stride);
    if (ARITH && (OP == OXCCL_OP_SUM || OP == OXCCL_OP_PROD)) {
        A acc[NV][K];
OX_UNROLL
        for (int u = 0; u < NV; u++) {
OX_UNROLL
            for (int k = 0; k < K; k++) acc[u][k] = T::widen(x[u].e[k]);
        }
        if (pre) {
OX_UNROLL
            for (int u = 0; u < NV; u++) {
OX_UNROLL
                for (int k = 0; k < K; k++) acc[u][k] = T::mul(acc[u][k], scale);
            }
        }
        for (u32 s = 1; s < nsrc; s++) {
            const u64 src = p.src[s] + o;
            U y[NV];
OX_UNROLL
            for (int u = 0; u < NV; u++) y[u].v = ox_ld<V>(src + u * stride);
OX_UNROLL
            for (int u = 0; u < NV; u++) {
OX_UNROLL
                for (int k = 0; k < K; k++) acc[u][k] = ox_combine<T, OP>(acc[u][k], T::widen(y[u].e[k]));
            }
        }
        if (avg != 0) {
OX_UNROLL
            for (int u = 0; u < NV; u++) {
OX_UNROLL
                for (int k = 0; k < K; k++) acc[u][k] = T::div(acc[u][k], avg);
            }
        }
OX_UNROLL
        for (int u = 0; u < NV; u++) {
OX_UNROLL
            for (int k = 0; k < K; k++) x[u].e[k] = T::narrow(acc[u][k]);
        }
    } else if (ARITH) {
        // max/min: select by value (keys: exact values, f32 for the narrow
        // floats), then store the winner narrowed back: its own bits, but a
        // narrow NaN comes out as oxccl-core's widen-then-narrow gives it
        // (f16/bf16 quieted, FP8 0x7F).
        C key[NV][K];
OX_UNROLL
        for (int u = 0; u < NV; u++) {
OX_UNROLL
            for (int k = 0; k < K; k++) key[u][k] = T::key(x[u].e[k]);
        }
        for (u32 s = 1; s < nsrc; s++) {
            const u64 src = p.src[s] + o;
            U y[NV];
OX_UNROLL
            for (int u = 0; u < NV; u++) y[u].v = ox_ld<V>(src + u * stride);
OX_UNROLL
            for (int u = 0; u < NV; u++) {
OX_UNROLL
                for (int k = 0; k < K; k++) {
                    const C c = T::key(y[u].e[k]);
                    key[u][k] = ox_keep_first<T, OP>(key[u][k], c) ? key[u][k] : c;
                }
            }
        }
OX_UNROLL
        for (int u = 0; u < NV; u++) {
OX_UNROLL
            for (int k = 0; k < K; k++) x[u].e[k] = T::narrow((A)key[u][k]);
        }
    }
    for (u32 d = 0; d < ndst; d++) {
        const u64 dst = p.dst[d] + o;
OX_UNROLL
        for (int u = 0; u < NV; u++) ox_st<V>(dst + u * stride, x[u].v);
    }
}

// One pass over `nv` vectors of VB bytes starting `boff` bytes into every
// source and destination; vector v goes to thread v mod nthr, which takes
// its vectors several at a time (more loads in flight), the rest singly.
template <class T, int OP, int VB, bool ARITH>
OX_NOINLINE void ox_body(const ox_plan &p, u64 boff, u64 nv, u32 tid, u32 nthr, typename T::A scale) {
    // Accumulators stay within ~32 registers: 2 vectors of 16 elements, else 4.
    const int NV = ARITH && VB / sizeof(typename T::S) >= 16 ? 2 : 4;
    const bool pre = OP == OXCCL_OP_SUM && p.pre != 0;
    const u32 avg = OP == OXCCL_OP_SUM ? p.avg : 0;
    const u64 stride = (u64)nthr * VB;
    u64 v = tid;
    for (; v + (NV - 1) * (u64)nthr < nv; v += NV * (u64)nthr) {
        ox_vecs<T, OP, VB, ARITH, NV>(p, boff + v * VB, stride, scale, pre, avg);
    }
    for (; v < nv; v += nthr) ox_vecs<T, OP, VB, ARITH, 1>(p, boff + v * VB, stride, scale, pre, avg);
}

// n elements with VB-byte vectors: the elements before src[0]'s first
// VB-aligned one and those after the last whole vector go one at a time.
template <class T, int OP, int VB, bool ARITH>
OX_DEV void ox_run_vb(const ox_plan &p, u64 n, u32 tid, u32 nthr, typename T::A scale) {
    const u64 E = sizeof(typename T::S);
    if (VB == (int)E) {
        ox_body<T, OP, VB, ARITH>(p, 0, n, tid, nthr, scale);
        return;
    }
    const u64 K = VB / E;
    u64 head = ((VB - (p.src[0] & (VB - 1))) & (VB - 1)) / E;
    if (head > n) head = n;
    const u64 nv = (n - head) / K;
    const u64 tail = head + nv * K;
    ox_body<T, OP, VB, ARITH>(p, head * E, nv, tid, nthr, scale);
    // Head and tail (fewer than 2K elements): the last threads take them.
    const u32 rt = nthr - 1 - tid;
    ox_body<T, OP, (int)sizeof(typename T::S), ARITH>(p, 0, head, rt, nthr, scale);
    ox_body<T, OP, (int)sizeof(typename T::S), ARITH>(p, tail * E, n - tail, rt, nthr, scale);
}

// Runs a plan over n elements: the widest vector (16, 8, 4 bytes or one
// element) that every pointer can share, i.e. that divides all their
// differences. ARITH false copies src[0] (no conversion: bits are kept).
template <class T, int OP, bool ARITH>
OX_DEV void ox_run(const ox_plan &p, u64 n, u32 tid, u32 nthr, typename T::A scale) {
    const int E = (int)sizeof(typename T::S);
    const u64 p0 = p.src[0];
    u64 mis = 0;
    for (u32 s = 1; s < p.nsrc; s++) mis |= p.src[s] - p0;
    for (u32 d = 0; d < p.ndst; d++) mis |= p.dst[d] - p0;
    if ((mis & 15) == 0) {
        ox_run_vb<T, OP, 16, ARITH>(p, n, tid, nthr, scale);
    } else if ((mis & 7) == 0) {
        ox_run_vb<T, OP, (E > 8 ? E : 8), ARITH>(p, n, tid, nthr, scale);
    } else if ((mis & 3) == 0) {
        ox_run_vb<T, OP, (E > 4 ? E : 4), ARITH>(p, n, tid, nthr, scale);
    } else {
        ox_run_vb<T, OP, E, ARITH>(p, n, tid, nthr, scale);
    }
}

// Whether a plan needs arithmetic (else it is a copy): more than one source,
// or (sum module) a premul or an average.
template <int OP>
OX_DEV bool ox_plan_arith(const ox_plan &p) {
    return p.nsrc > 1 || (OP == OXCCL_OP_SUM && (p.pre != 0 || p.avg != 0));
}

template <class T, int OP>
OX_NOINLINE void ox_run_plan(const ox_plan &p, u64 n, u32 tid, u32 nthr, typename T::A scale) {
    if (ox_plan_arith<OP>(p)) {
        ox_run<T, OP, true>(p, n, tid, nthr, scale);
    } else {
        ox_run<T, OP, false>(p, n, tid, nthr, scale);
    }
}

// The local reduce/copy over the whole grid. Arguments out of range (no
// source or destination, more than 16) make it return without writing.
template <class T, int OP>
OX_DEV void ox_reduce_kernel(const oxccl_reduce_args &a) {
    OX_SHARED(ox_smem, sh);
    if (a.nsrcs == 0 || a.nsrcs > OXCCL_MAX_SRCS || a.ndsts == 0 || a.ndsts > OXCCL_MAX_SRCS) return;
    ox_plan &p = sh.plan[0];
    const u32 t = threadIdx.x;
    if (t < a.nsrcs) p.src[t] = a.srcs[t];
    if (t < a.ndsts) p.dst[t] = a.dsts[t];
    if (t == 0) {
        // Fewer than 16 threads in a block: thread 0 fills the rest.
        for (u32 s = blockDim.x; s < a.nsrcs; s++) p.src[s] = a.srcs[s];
        for (u32 d = blockDim.x; d < a.ndsts; d++) p.dst[d] = a.dsts[d];
        p.nsrc = a.nsrcs;
        p.ndst = a.ndsts;
        p.pre = a.premul;
        p.avg = a.avg_div;
    }
    __syncthreads();
    const u32 nthr = gridDim.x * blockDim.x;
    ox_run_plan<T, OP>(p, a.count, blockIdx.x * blockDim.x + t, nthr, T::scale(a.scale));
}

#if defined(OXCCL_DTYPE) && defined(OXCCL_OP)
extern "C" __global__ void __launch_bounds__(512) oxccl_reduce(oxccl_reduce_args a) {
    ox_reduce_kernel<ox_dtype<OXCCL_DTYPE>::type, OXCCL_OP>(a);
}
#endif

#endif  // OXCCL_REDUCE_CU
