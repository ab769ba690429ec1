// oxccl_collective: one launch runs a whole collective over the ranks'
// windows (peer memory mapped into this rank's address space).
//
// Per iteration, a chunk of the message: every rank stages its piece into its
// own window, the ranks meet (ox_barrier), every rank reads the peers'
// windows, they meet again (so the next staging cannot overwrite what a peer
// still reads). Block b works on the same contiguous range of every slice on
// every rank, so block b's barrier orders all the data block b touches: no
// grid-wide synchronisation. See cuda/README.md for the data flows.
#ifndef OXCCL_COLLECTIVE_CU
#define OXCCL_COLLECTIVE_CU
#ifndef OXCCL_NVRTC
#include "oxccl.cuh"
#include "reduce.cu"
#endif

// Per-block state of one launch.
struct ox_ctx {
    u32 tid, nthr, blk, nblk, n, r;
    u32 k;          // the plan buffer last filled
    u32 pre, avg;   // premul this rank's input; divisor of reductions (0: none)
    u64 E, VE;      // element bytes; elements per 16 bytes
    u64 ep;         // barrier epoch
};

// This block's range [lo, hi) of a slice of L elements out of a full slice of
// F: the piece [blk * P, (blk + 1) * P) of whole 16-byte vectors that the
// block takes of a full slice, clipped to L. P depends on F only, so that a
// block touches the same window bytes in every iteration (the shorter last
// one included): only its own barrier then orders them.
OX_DEV void ox_block_range(const ox_ctx &c, u64 F, u64 L, u64 &lo, u64 &hi) {
    u64 per = (F + c.nblk - 1) / c.nblk;
    per = (per + c.VE - 1) & ~(c.VE - 1);
    lo = (u64)c.blk * per;
    if (lo > L) lo = L;
    hi = lo + per < L ? lo + per : L;
}

// Fills the next plan (thread 0), publishes it to the block and runs it over
// m elements. Two plans alternate, so this one __syncthreads is enough: a
// plan is refilled only after every thread passed the next step's sync.
// Destinations equal to the source are dropped (in-place identity copies).
template <class T, int OP>
OX_DEV void ox_step(ox_smem &sh, ox_ctx &c, u64 m, u64 src, u32 pre, u64 dst0, u64 dst1, u32 avg,
                    typename T::A scale) {
    c.k ^= 1;
    ox_plan &p = sh.plan[c.k];
    if (c.tid == 0) {
        p.src[0] = src;
        p.nsrc = 1;
        u32 nd = 0;
        if (dst0 != 0 && (dst0 != src || pre || avg)) p.dst[nd++] = dst0;
        if (dst1 != 0 && (dst1 != src || pre || avg)) p.dst[nd++] = dst1;
        p.ndst = nd;
        p.pre = pre;
        p.avg = avg;
    }
    __syncthreads();
    if (p.ndst != 0 && m != 0) ox_run_plan<T, OP>(p, m, c.tid, c.nthr, scale);
}

// Reduces woff bytes into every rank's window (in rank order, so that every
// rank computes the same bits) into dst0 (and dst1 if not 0).
template <class T, int OP>
OX_DEV void ox_step_reduce(const oxccl_coll_args &a, ox_smem &sh, ox_ctx &c, u64 m, u64 woff, u64 dst0, u64 dst1,
                           typename T::A scale) {
    c.k ^= 1;
    ox_plan &p = sh.plan[c.k];
    if (c.tid == 0) {
        for (u32 q = 0; q < c.n; q++) p.src[q] = a.window[q] + woff;
        p.nsrc = c.n;
        p.dst[0] = dst0;
        p.dst[1] = dst1;
        p.ndst = dst1 != 0 ? 2 : 1;
        p.pre = 0;
        p.avg = c.avg;
    }
    __syncthreads();
    if (m != 0) ox_run_plan<T, OP>(p, m, c.tid, c.nthr, scale);
}

// One iteration: the chunk [off, off + cnt) of the message, C elements per
// window slot. Returns false when a barrier failed (the block must return).
template <class T, int OP>
OX_DEV bool ox_iteration(const oxccl_coll_args &a, ox_smem &sh, ox_ctx &c, u64 off, u64 cnt, u64 C,
                         typename T::A scale) {
    const u64 E = c.E, n = c.n, r = c.r, count = a.count;
    const u64 win = a.window[r];
    u64 lo, hi;
    switch (a.coll) {
    case OXCCL_COLL_ALL_REDUCE_ONE_SHOT:
        ox_block_range(c, C, cnt, lo, hi);
        ox_step<T, OP>(sh, c, hi - lo, a.send + (off + lo) * E, c.pre, win + lo * E, 0, 0, scale);
        if (!ox_barrier(a, sh, c.ep)) return false;
        ox_step_reduce<T, OP>(a, sh, c, hi - lo, lo * E, a.recv + (off + lo) * E, 0, scale);
        return ox_barrier(a, sh, c.ep);
    case OXCCL_COLL_ALL_REDUCE_TWO_SHOT: {
        // n slices of S elements (of the full chunk C: the last ones, and in
        // the last iteration more, shorter or empty); rank q reduces slice q,
        // then everyone gathers the reduced slices.
        u64 S = (C + n - 1) / n;
        S = (S + c.VE - 1) & ~(c.VE - 1);
        for (u64 s = 0; s < n; s++) {
            const u64 s0 = s * S < cnt ? s * S : cnt, s1 = s0 + S < cnt ? s0 + S : cnt;
            ox_block_range(c, S, s1 - s0, lo, hi);
            lo += s0, hi += s0;
            ox_step<T, OP>(sh, c, hi - lo, a.send + (off + lo) * E, c.pre, win + lo * E, 0, 0, scale);
        }
        if (!ox_barrier(a, sh, c.ep)) return false;
        {
            const u64 s0 = r * S < cnt ? r * S : cnt, s1 = s0 + S < cnt ? s0 + S : cnt;
            ox_block_range(c, S, s1 - s0, lo, hi);
            lo += s0, hi += s0;
            ox_step_reduce<T, OP>(a, sh, c, hi - lo, lo * E, win + lo * E, a.recv + (off + lo) * E, scale);
        }
        if (!ox_barrier(a, sh, c.ep)) return false;
        for (u64 s = 0; s < n; s++) {
            if (s == r) continue;
            const u64 s0 = s * S < cnt ? s * S : cnt, s1 = s0 + S < cnt ? s0 + S : cnt;
            ox_block_range(c, S, s1 - s0, lo, hi);
            lo += s0, hi += s0;
            ox_step<T, OP>(sh, c, hi - lo, a.window[s] + lo * E, 0, a.recv + (off + lo) * E, 0, 0, scale);
        }
        return ox_barrier(a, sh, c.ep);
    }
    case OXCCL_COLL_REDUCE_SCATTER:
        ox_block_range(c, C, cnt, lo, hi);
        for (u64 q = 0; q < n; q++) {
            ox_step<T, OP>(sh, c, hi - lo, a.send + (q * count + off + lo) * E, c.pre, win + (q * C + lo) * E, 0, 0,
                           scale);
        }
        if (!ox_barrier(a, sh, c.ep)) return false;
        ox_step_reduce<T, OP>(a, sh, c, hi - lo, (r * C + lo) * E, a.recv + (off + lo) * E, 0, scale);
        return ox_barrier(a, sh, c.ep);
    case OXCCL_COLL_ALL_GATHER:
        ox_block_range(c, C, cnt, lo, hi);
        ox_step<T, OP>(sh, c, hi - lo, a.send + (off + lo) * E, 0, n > 1 ? win + lo * E : 0,
                       a.recv + (r * count + off + lo) * E, 0, scale);
        if (!ox_barrier(a, sh, c.ep)) return false;
        for (u64 q = 0; q < n; q++) {
            if (q == r) continue;
            ox_step<T, OP>(sh, c, hi - lo, a.window[q] + lo * E, 0, a.recv + (q * count + off + lo) * E, 0, 0, scale);
        }
        return ox_barrier(a, sh, c.ep);
    case OXCCL_COLL_BROADCAST:
        ox_block_range(c, C, cnt, lo, hi);
        if (r == a.root) {
            ox_step<T, OP>(sh, c, hi - lo, a.send + (off + lo) * E, 0, n > 1 ? win + lo * E : 0,
                           a.recv + (off + lo) * E, 0, scale);
        }
        if (!ox_barrier(a, sh, c.ep)) return false;
        if (r != a.root) {
            ox_step<T, OP>(sh, c, hi - lo, a.window[a.root] + lo * E, 0, a.recv + (off + lo) * E, 0, 0, scale);
        }
        return ox_barrier(a, sh, c.ep);
    case OXCCL_COLL_REDUCE:
        ox_block_range(c, C, cnt, lo, hi);
        ox_step<T, OP>(sh, c, hi - lo, a.send + (off + lo) * E, c.pre, win + lo * E, 0, 0, scale);
        if (!ox_barrier(a, sh, c.ep)) return false;
        if (r == a.root) ox_step_reduce<T, OP>(a, sh, c, hi - lo, lo * E, a.recv + (off + lo) * E, 0, scale);
        return ox_barrier(a, sh, c.ep);
    default:  // OXCCL_COLL_ALL_TO_ALL
        ox_block_range(c, C, cnt, lo, hi);
        for (u64 q = 0; q < n; q++) {
            const u64 from = a.send + (q * count + off + lo) * E;
            const u64 to = q == r ? a.recv + (q * count + off + lo) * E : win + (q * C + lo) * E;
            ox_step<T, OP>(sh, c, hi - lo, from, 0, to, 0, 0, scale);
        }
        if (!ox_barrier(a, sh, c.ep)) return false;
        for (u64 q = 0; q < n; q++) {
            if (q == r) continue;
            ox_step<T, OP>(sh, c, hi - lo, a.window[q] + (r * C + lo) * E, 0, a.recv + (q * count + off + lo) * E, 0,
                           0, scale);
        }
        return ox_barrier(a, sh, c.ep);
    }
}

template <class T, int OP>
OX_DEV void ox_collective_kernel(const oxccl_coll_args &a) {
    OX_SHARED(ox_smem, sh);
    ox_ctx c;
    c.tid = threadIdx.x;
    c.nthr = blockDim.x;
    c.blk = blockIdx.x;
    c.nblk = gridDim.x;
    c.n = a.nranks;
    c.r = a.rank;
    c.k = 0;
    c.E = sizeof(typename T::S);
    c.VE = 16 / c.E;
    c.pre = OP == OXCCL_OP_SUM && a.premul != 0 ? 1 : 0;
    c.avg = OP == OXCCL_OP_SUM && a.avg != 0 ? a.nranks : 0;
    // Elements per window slot per iteration: whole 16-byte vectors.
    const bool slots = a.coll == OXCCL_COLL_REDUCE_SCATTER || a.coll == OXCCL_COLL_ALL_TO_ALL;
    u64 C = 0;
    if (c.n != 0) C = (a.window_bytes / (c.E * (slots ? c.n : 1))) & ~(c.VE - 1);
    const bool rooted = a.coll == OXCCL_COLL_BROADCAST || a.coll == OXCCL_COLL_REDUCE;
    if (c.n == 0 || c.n > OXCCL_MAX_RANKS || c.r >= c.n || c.nblk > OXCCL_MAX_BLOCKS || c.nthr < c.n ||
        a.coll > OXCCL_COLL_ALL_TO_ALL || (rooted && a.root >= c.n) || (C == 0 && a.count != 0)) {
        if (c.tid == 0 && c.blk == 0) ox_set_status(a.status, OXCCL_STATUS_INVALID);
        return;
    }
    if (a.count == 0) return;
    if (c.tid == 0) sh.epoch = ox_ld_u64(a.flags[c.r] + ox_epoch_off(c.blk));
    __syncthreads();
    c.ep = sh.epoch;
    const typename T::A scale = T::scale(a.scale);
    for (u64 off = 0; off < a.count; off += C) {
        const u64 cnt = a.count - off < C ? a.count - off : C;
        if (!ox_iteration<T, OP>(a, sh, c, off, cnt, C, scale)) return;
    }
}

#if defined(OXCCL_DTYPE) && defined(OXCCL_OP)
extern "C" __global__ void __launch_bounds__(512) oxccl_collective(oxccl_coll_args a) {
    ox_collective_kernel<ox_dtype<OXCCL_DTYPE>::type, OXCCL_OP>(a);
}
#endif

#endif  // OXCCL_COLLECTIVE_CU
