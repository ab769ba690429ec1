// oxccl_program: the device executor. One launch runs one rank's program of
// oxccl-algo's IR (the programs its verifier proves) over device memory.
//
// Channel c of the program is run by a team of `team` blocks (blocks
// c * team .. c * team + team - 1); the team's blocks share every step's
// elements (member m takes the m-th of `team` contiguous parts, whole
// 16-byte vectors) and meet after every step and every piece of a message
// (ox_team_sync), so a step sees everything its channel did before.
//
// Two-sided steps go through FIFOs in the receiver's memory: connection
// (sender q, receiver r, channel c) has `slots` slots of `slot_bytes`; the
// sender writes a piece into the next slot when it has a credit and then
// raises the receiver's HEAD word; the receiver reads it in place (reduce,
// copy, forward straight into the next receiver's slot) and returns the
// credit by raising the sender's TAIL word. One-sided steps read and write
// the peers' buffers directly; `signal` raises the peer's SIG word after a
// system-wide fence, `wait` waits for it. Every publication is a fence and
// a release store at system scope, every wait an acquire load, so a put is
// visible at the peer once a later message or signal is (the ordering the
// verifier assumes). Counters only grow, and each rank keeps its own in its
// flag area from launch to launch, so no reset is ever needed; every wait
// has the timeout and honours the abort word, as ox_wait_geq does.
#ifndef OXCCL_PROGRAM_CU
#define OXCCL_PROGRAM_CU
#ifndef OXCCL_NVRTC
#include "oxccl.cuh"
#include "reduce.cu"
#endif

// Block-shared state: the plan being run, the current step, the channel's
// counters per peer (every member keeps its own copy), a failure code.
struct ox_psmem {
    u64 bufs[OXCCL_MAX_RANKS][3];  // every rank's buffers (args.bufs, exchanged ones filled in)
    ox_plan plan;
    oxccl_pstep st;
    u64 sent[OXCCL_MAX_RANKS], recvd[OXCCL_MAX_RANKS], sigsent[OXCCL_MAX_RANKS], sigseen[OXCCL_MAX_RANKS];
    u64 team_at;  // the team barrier's target so far
    u32 fail;     // a wait's failure (written by thread 0 before a barrier, read after it)
    u32 bad;      // the current step is malformed (likewise)
    u32 team_fail;  // the team barrier's failure (its own word: read after it, rewritten only in the next one)
};

struct ox_pctx {
    u32 tid, nthr, n, r, c, m, W;
    u32 w;   // the FIFO channel of the lane's connections (a program's channel; 0 for send/recv)
    u64 E, VE;
    u64 pe;  // elements per FIFO slot
};

OX_DEV u64 ox_pf_off(u32 peer, u32 chan, u32 word) {
    return (((u64)peer * OXCCL_MAX_CHANNELS + chan) * OXCCL_PF_WORDS + word) * 8;
}
OX_DEV u64 ox_team_off(u32 chan, u32 word) {
    return (u64)OXCCL_MAX_RANKS * OXCCL_MAX_CHANNELS * OXCCL_PF_WORDS * 8 + ((u64)chan * 2 + word) * 8;
}
// Thread 0: fence, then the release store that publishes it to a peer.
OX_DEV void ox_publish(u64 addr, u64 v) {
    ox_fence_sys();
    ox_st_release_sys(addr, v);
}

// The address exchange: word 0 the launch, then addr[seq % 2][input, output].
OX_DEV u64 ox_xchg_off(u32 word) {
    return (u64)OXCCL_MAX_RANKS * OXCCL_MAX_CHANNELS * OXCCL_PF_WORDS * 8 + (u64)OXCCL_MAX_CHANNELS * 16 + word * 8;
}

// The address of `slice` (element offset `from` into it) in rank q's buffers.
OX_DEV u64 ox_slice_addr(const ox_psmem &sh, const ox_pctx &c, u32 q, u64 slice, u64 from) {
    const u32 buf = (u32)(slice >> OXCCL_SLICE_BUF_SHIFT);
    const u64 off = slice & ((1ull << OXCCL_SLICE_BUF_SHIFT) - 1);
    return sh.bufs[q][buf] + (off + from) * c.E;
}

// Every block: its copy of the ranks' buffers; with an exchange, block 0
// first publishes this rank's input and output for launch `seq`, and every
// block reads those of the ranks in the mask once they are published for
// this launch. (A peer overwrites its slot of launch `seq` only at `seq + 2`,
// after launch `seq + 1`, which it cannot end before this rank, which
// touches its buffers in `seq`, has signalled it is done with them: the
// verifier's rule that nothing touches a rank's buffers after it returns.)
OX_DEV bool ox_load_bufs(const oxccl_prog_args &a, ox_psmem &sh, const ox_pctx &c) {
    if (c.tid < c.n) {
        for (u32 b = 0; b < 3; b++) sh.bufs[c.tid][b] = a.bufs[c.tid][b];
    }
    if (c.tid == 0) {
        for (u32 q = c.nthr; q < c.n; q++) {
            for (u32 b = 0; b < 3; b++) sh.bufs[q][b] = a.bufs[q][b];
        }
        sh.fail = 0;
    }
    __syncthreads();
    if (c.tid == 0) {
        if (a.exchange != 0) {
            const u64 own = a.flags[c.r], slot = 1 + (a.seq & 1) * 2;
            if (blockIdx.x == 0) {
                ox_st_u64(own + ox_xchg_off(slot), a.bufs[c.r][0]);
                ox_st_u64(own + ox_xchg_off(slot + 1), a.bufs[c.r][1]);
                ox_publish(own + ox_xchg_off(0), a.seq);
            }
            for (u32 q = 0; q < c.n && sh.fail == 0; q++) {
                if (q == c.r || ((a.exchange >> q) & 1) == 0) continue;
                const u64 theirs = a.flags[q];
                sh.fail = ox_wait_geq(theirs + ox_xchg_off(0), a.seq, a.status, a.timeout_ns);
                sh.bufs[q][0] = ox_ld_u64(theirs + ox_xchg_off(slot));
                sh.bufs[q][1] = ox_ld_u64(theirs + ox_xchg_off(slot + 1));
            }
        }
    }
    __syncthreads();
    return sh.fail == 0;
}

// Slot k of connection (sender q -> receiver to, FIFO channel c.w) in `to`'s
// FIFO. (A: oxccl_prog_args or oxccl_p2p_args, which share these fields.)
template <class A>
OX_DEV u64 ox_slot(const A &a, const ox_pctx &c, u32 to, u32 q, u64 seq) {
    return a.fifo[to] + (((u64)q * a.fifo_chans + c.w) * a.slots + seq % a.slots) * a.slot_bytes;
}

// A block's context: its lane (c) and place in the team (m) from its index.
template <class T, class A>
OX_DEV ox_pctx ox_make_ctx(const A &a) {
    ox_pctx c;
    c.tid = threadIdx.x;
    c.nthr = blockDim.x;
    c.n = a.nranks;
    c.r = a.rank;
    c.W = a.team;
    c.E = sizeof(typename T::S);
    c.VE = 16 / c.E;
    c.c = c.W != 0 ? blockIdx.x / c.W : 0;
    c.m = c.W != 0 ? blockIdx.x % c.W : 0;
    c.w = c.c;
    c.pe = a.slot_bytes / c.E;
    return c;
}

// This member's part [lo, hi) of len elements.
OX_DEV void ox_member_range(const ox_pctx &c, u64 len, u64 &lo, u64 &hi) {
    u64 per = (len + c.W - 1) / c.W;
    per = (per + c.VE - 1) & ~(c.VE - 1);
    lo = (u64)c.m * per;
    if (lo > len) lo = len;
    hi = lo + per < len ? lo + per : len;
}

// Every thread of every member block calls it: all the team's writes so far
// are done and visible system-wide. False: a wait failed (status[0] holds
// the code), the block must return.
template <class A>
OX_DEV bool ox_team_sync(const A &a, ox_psmem &sh, const ox_pctx &c) {
    __syncthreads();
    if (c.W == 1) return true;
    if (c.tid == 0) {
        const u64 word = a.flags[c.r] + ox_team_off(c.c, 0);
        ox_fence_sys();
        ox_atom_add_u64(word, 1);
        sh.team_at += c.W;
        sh.team_fail = ox_wait_geq(word, sh.team_at, a.status, a.timeout_ns);
    }
    __syncthreads();
    return sh.team_fail == 0;
}

// Runs the plan thread 0 filled over this member's n elements (all threads).
template <class T, int OP>
OX_DEV void ox_prun(ox_psmem &sh, const ox_pctx &c, u64 n, typename T::A one) {
    if (n != 0 && sh.plan.ndst != 0) ox_run_plan<T, OP>(sh.plan, n, c.tid, c.nthr, one);
}

// A two-sided step: its message piece by piece. Returns false on failure.
template <class T, int OP, class A>
OX_DEV bool ox_pmessage(const A &a, ox_psmem &sh, const ox_pctx &c, typename T::A one) {
    const oxccl_pstep &st = sh.st;
    const u32 op = st.op;
    const bool rx = op != OXCCL_PS_SEND;
    const bool tx = op == OXCCL_PS_SEND || op == OXCCL_PS_RECV_REDUCE_SEND || op == OXCCL_PS_RECV_COPY_SEND ||
                    op == OXCCL_PS_RECV_REDUCE_COPY_SEND;
    const bool has_src = op == OXCCL_PS_SEND || op == OXCCL_PS_RECV_REDUCE || op == OXCCL_PS_RECV_REDUCE_SEND ||
                         op == OXCCL_PS_RECV_REDUCE_COPY_SEND;
    const bool has_dst = op == OXCCL_PS_RECV || op == OXCCL_PS_RECV_REDUCE || op == OXCCL_PS_RECV_COPY_SEND ||
                         op == OXCCL_PS_RECV_REDUCE_COPY_SEND;
    const u32 from = st.recv, to = st.send;
    for (u64 off = 0; off < st.len; off += c.pe) {
        const u64 pe = st.len - off < c.pe ? st.len - off : c.pe;
        u64 lo, hi;
        ox_member_range(c, pe, lo, hi);
        if (c.tid == 0) {
            u32 fail = 0;
            if (rx) fail = ox_wait_geq(a.flags[c.r] + ox_pf_off(from, c.w, OXCCL_PF_HEAD), sh.recvd[from] + 1, a.status,
                                       a.timeout_ns);
            if (tx && fail == 0 && sh.sent[to] + 1 > a.slots) {
                fail = ox_wait_geq(a.flags[c.r] + ox_pf_off(to, c.w, OXCCL_PF_TAIL), sh.sent[to] + 1 - a.slots,
                                   a.status, a.timeout_ns);
            }
            sh.fail = fail;
            ox_plan &p = sh.plan;
            u32 ns = 0, nd = 0;
            if (has_src) p.src[ns++] = ox_slice_addr(sh, c, c.r, st.src, off + lo);
            if (rx) p.src[ns++] = ox_slot(a, c, c.r, from, sh.recvd[from]) + lo * c.E;
            if (has_dst) p.dst[nd++] = ox_slice_addr(sh, c, c.r, st.dst, off + lo);
            if (tx) p.dst[nd++] = ox_slot(a, c, to, c.r, sh.sent[to]) + lo * c.E;
            p.nsrc = ns;
            p.ndst = nd;
            p.pre = 0;
            p.avg = 0;
        }
        __syncthreads();
        if (sh.fail != 0) return false;
        ox_prun<T, OP>(sh, c, hi - lo, one);
        if (!ox_team_sync(a, sh, c)) return false;
        if (c.tid == 0) {
            if (rx) {
                sh.recvd[from]++;
                if (c.m == 0) ox_publish(a.flags[from] + ox_pf_off(c.r, c.w, OXCCL_PF_TAIL), sh.recvd[from]);
            }
            if (tx) {
                sh.sent[to]++;
                if (c.m == 0) ox_publish(a.flags[to] + ox_pf_off(c.r, c.w, OXCCL_PF_HEAD), sh.sent[to]);
            }
        }
    }
    return true;
}

// A local or one-sided step. Returns false on failure.
template <class T, int OP>
OX_DEV bool ox_plocal(const oxccl_prog_args &a, ox_psmem &sh, const ox_pctx &c, typename T::A one) {
    const oxccl_pstep &st = sh.st;
    const u32 op = st.op, q = st.recv;
    if (op == OXCCL_PS_SIGNAL) {
        // Everything this channel did before is done (the team met after
        // every step) and visible: the fence in ox_publish.
        if (c.tid == 0) {
            sh.sigsent[q]++;
            if (c.m == 0) ox_publish(a.flags[q] + ox_pf_off(c.r, c.w, OXCCL_PF_SIG), sh.sigsent[q]);
        }
        return true;
    }
    if (op == OXCCL_PS_WAIT) {
        if (c.tid == 0) {
            sh.sigseen[q]++;
            sh.fail = ox_wait_geq(a.flags[c.r] + ox_pf_off(q, c.w, OXCCL_PF_SIG), sh.sigseen[q], a.status,
                                  a.timeout_ns);
        }
        __syncthreads();
        return sh.fail == 0;
    }
    u64 lo, hi;
    ox_member_range(c, st.len, lo, hi);
    if (c.tid == 0) {
        ox_plan &p = sh.plan;
        p.nsrc = 1;
        p.ndst = 1;
        p.pre = 0;
        p.avg = 0;
        switch (op) {
        case OXCCL_PS_COPY:
            p.src[0] = ox_slice_addr(sh, c, c.r, st.src, lo);
            p.dst[0] = ox_slice_addr(sh, c, c.r, st.dst, lo);
            break;
        case OXCCL_PS_REDUCE:
            p.nsrc = st.nsrc;
            for (u32 s = 0; s < st.nsrc; s++) p.src[s] = ox_slice_addr(sh, c, c.r, ((const u64 *)a.slices)[st.src + s], lo);
            p.dst[0] = ox_slice_addr(sh, c, c.r, st.dst, lo);
            break;
        case OXCCL_PS_PUT:
            p.src[0] = ox_slice_addr(sh, c, c.r, st.src, lo);
            p.dst[0] = ox_slice_addr(sh, c, q, st.dst, lo);
            break;
        case OXCCL_PS_GET:
            p.src[0] = ox_slice_addr(sh, c, q, st.src, lo);
            p.dst[0] = ox_slice_addr(sh, c, c.r, st.dst, lo);
            break;
        default:  // OXCCL_PS_GET_REDUCE: dst = acc + peer's src
            p.nsrc = 2;
            p.src[0] = ox_slice_addr(sh, c, c.r, st.acc, lo);
            p.src[1] = ox_slice_addr(sh, c, q, st.src, lo);
            p.dst[0] = ox_slice_addr(sh, c, c.r, st.dst, lo);
            break;
        }
        // A copy onto itself moves nothing.
        if (p.nsrc == 1 && p.src[0] == p.dst[0]) p.ndst = 0;
    }
    __syncthreads();
    ox_prun<T, OP>(sh, c, hi - lo, one);
    return ox_team_sync(a, sh, c);
}

// Whether a step names peers and operands in range (the host checked the
// program when it encoded it; this keeps a bad upload from wild accesses).
OX_DEV bool ox_step_ok(const oxccl_prog_args &a, const oxccl_pstep &s) {
    if (s.op > OXCCL_PS_WAIT) return false;
    const bool rx = s.op != OXCCL_PS_SEND && s.op != OXCCL_PS_COPY && s.op != OXCCL_PS_REDUCE;
    const bool tx = s.op == OXCCL_PS_SEND || s.op == OXCCL_PS_RECV_REDUCE_SEND || s.op == OXCCL_PS_RECV_COPY_SEND ||
                    s.op == OXCCL_PS_RECV_REDUCE_COPY_SEND;
    if (rx && (s.recv >= a.nranks || s.recv == a.rank)) return false;
    if (tx && (s.send >= a.nranks || s.send == a.rank)) return false;
    return s.op != OXCCL_PS_REDUCE || (s.nsrc != 0 && s.nsrc <= OXCCL_MAX_SRCS);
}

template <class T, int OP>
OX_DEV void ox_program_kernel(const oxccl_prog_args &a) {
    OX_SHARED(ox_psmem, sh);
    ox_pctx c = ox_make_ctx<T>(a);
    c.w = c.c;
    const bool bad = c.n == 0 || c.n > OXCCL_MAX_RANKS || c.r >= c.n || a.nchan > OXCCL_MAX_CHANNELS ||
                     a.nchan > a.fifo_chans || c.W == 0 || c.W > OXCCL_MAX_TEAM || gridDim.x != a.nchan * c.W ||
                     a.slots == 0 || a.slot_bytes == 0 || (a.slot_bytes & 15) != 0;
    if (bad) {
        if (c.tid == 0 && blockIdx.x == 0) ox_set_status(a.status, OXCCL_STATUS_INVALID);
        return;
    }
    // The counters this launch continues from (the previous launch on this
    // flag area ended before this one started: stream order).
    const u64 pf = a.flags[c.r];
    if (c.tid < c.n) {
        const u32 q = c.tid;
        sh.sent[q] = ox_ld_u64(pf + ox_pf_off(q, c.c, OXCCL_PF_SENT));
        sh.recvd[q] = ox_ld_u64(pf + ox_pf_off(q, c.c, OXCCL_PF_RECVD));
        sh.sigsent[q] = ox_ld_u64(pf + ox_pf_off(q, c.c, OXCCL_PF_SIGSENT));
        sh.sigseen[q] = ox_ld_u64(pf + ox_pf_off(q, c.c, OXCCL_PF_SIGSEEN));
    }
    if (c.tid == 0) {
        for (u32 q = c.nthr; q < c.n; q++) {
            sh.sent[q] = ox_ld_u64(pf + ox_pf_off(q, c.c, OXCCL_PF_SENT));
            sh.recvd[q] = ox_ld_u64(pf + ox_pf_off(q, c.c, OXCCL_PF_RECVD));
            sh.sigsent[q] = ox_ld_u64(pf + ox_pf_off(q, c.c, OXCCL_PF_SIGSENT));
            sh.sigseen[q] = ox_ld_u64(pf + ox_pf_off(q, c.c, OXCCL_PF_SIGSEEN));
        }
        sh.team_at = ox_ld_u64(pf + ox_team_off(c.c, 1));
    }
    if (!ox_load_bufs(a, sh, c)) return;
    const typename T::A one = T::scale(1.0);
    const oxccl_pstep *steps = (const oxccl_pstep *)a.steps;
    for (u32 i = 0; i < a.chan_steps[c.c]; i++) {
        __syncthreads();
        if (c.tid == 0) {
            sh.st = steps[a.chan_first[c.c] + i];
            sh.bad = ox_step_ok(a, sh.st) ? 0 : 1;
            if (sh.bad != 0) ox_set_status(a.status, OXCCL_STATUS_INVALID);
        }
        __syncthreads();
        if (sh.bad != 0) return;
        const bool ok = sh.st.op <= OXCCL_PS_RECV_REDUCE_COPY_SEND ? ox_pmessage<T, OP, oxccl_prog_args>(a, sh, c, one)
                                                                    : ox_plocal<T, OP>(a, sh, c, one);
        if (!ok) return;
    }
    __syncthreads();
    // The leader keeps the counters for the next launch (every member
    // counted the same).
    if (c.m == 0 && c.tid < c.n) {
        const u32 q = c.tid;
        ox_st_u64(pf + ox_pf_off(q, c.c, OXCCL_PF_SENT), sh.sent[q]);
        ox_st_u64(pf + ox_pf_off(q, c.c, OXCCL_PF_RECVD), sh.recvd[q]);
        ox_st_u64(pf + ox_pf_off(q, c.c, OXCCL_PF_SIGSENT), sh.sigsent[q]);
        ox_st_u64(pf + ox_pf_off(q, c.c, OXCCL_PF_SIGSEEN), sh.sigseen[q]);
    }
    if (c.m == 0 && c.tid == 0) {
        for (u32 q = c.nthr; q < c.n; q++) {
            ox_st_u64(pf + ox_pf_off(q, c.c, OXCCL_PF_SENT), sh.sent[q]);
            ox_st_u64(pf + ox_pf_off(q, c.c, OXCCL_PF_RECVD), sh.recvd[q]);
            ox_st_u64(pf + ox_pf_off(q, c.c, OXCCL_PF_SIGSENT), sh.sigsent[q]);
            ox_st_u64(pf + ox_pf_off(q, c.c, OXCCL_PF_SIGSEEN), sh.sigseen[q]);
        }
        // Every member passed the last team barrier: nobody adds to the
        // team word in this launch any more.
        ox_st_u64(pf + ox_team_off(c.c, 1), sh.team_at);
    }
}


// oxccl_p2p: a group of sends and receives of one rank. Lane l (a team of
// blocks, as a program's channel) carries the operations with one peer in
// one direction, in order, over FIFO channel 0 of that connection: every
// connection has one lane at each end, so all of them progress at once and
// messages between two ranks stay in order, whatever the grouping.
template <class T, int OP>
OX_DEV void ox_p2p_kernel(const oxccl_p2p_args &a) {
    OX_SHARED(ox_psmem, sh);
    ox_pctx c = ox_make_ctx<T>(a);
    c.w = 0;
    bool bad = c.n == 0 || c.n > OXCCL_MAX_RANKS || c.r >= c.n || a.nlanes > OXCCL_MAX_CHANNELS || c.W == 0 ||
               c.W > OXCCL_MAX_TEAM || gridDim.x != a.nlanes * c.W || a.slots == 0 || a.slot_bytes == 0 ||
               (a.slot_bytes & 15) != 0 || a.fifo_chans == 0;
    const u32 q = bad ? 0 : a.lane_peer[c.c];
    const bool tx = !bad && a.lane_send[c.c] != 0;
    bad = bad || q >= c.n || q == c.r || a.lane_first[c.c] + a.lane_ops[c.c] > OXCCL_MAX_P2P;
    if (bad) {
        if (c.tid == 0) ox_set_status(a.status, OXCCL_STATUS_INVALID);
        return;
    }
    const u64 pf = a.flags[c.r];
    if (c.tid == 0) {
        sh.sent[q] = ox_ld_u64(pf + ox_pf_off(q, 0, OXCCL_PF_SENT));
        sh.recvd[q] = ox_ld_u64(pf + ox_pf_off(q, 0, OXCCL_PF_RECVD));
        sh.team_at = ox_ld_u64(pf + ox_team_off(c.c, 1));
    }
    const typename T::A one = T::scale(1.0);
    for (u32 i = 0; i < a.lane_ops[c.c]; i++) {
        __syncthreads();
        if (c.tid == 0) {
            const u32 k = a.lane_first[c.c] + i;
            sh.bufs[c.r][0] = sh.bufs[c.r][1] = a.addr[k];
            sh.st.op = tx ? OXCCL_PS_SEND : OXCCL_PS_RECV;
            sh.st.recv = sh.st.send = q;
            sh.st.len = a.len[k] / c.E;
            sh.st.src = 0;                                 // input[0..]
            sh.st.dst = 1ull << OXCCL_SLICE_BUF_SHIFT;     // output[0..]
        }
        __syncthreads();
        if (!ox_pmessage<T, OP, oxccl_p2p_args>(a, sh, c, one)) return;
    }
    __syncthreads();
    // Only this lane's counter: the lane of the other direction keeps its own.
    if (c.m == 0 && c.tid == 0) {
        if (tx) ox_st_u64(pf + ox_pf_off(q, 0, OXCCL_PF_SENT), sh.sent[q]);
        if (!tx) ox_st_u64(pf + ox_pf_off(q, 0, OXCCL_PF_RECVD), sh.recvd[q]);
        ox_st_u64(pf + ox_team_off(c.c, 1), sh.team_at);
    }
}

#if defined(OXCCL_DTYPE) && defined(OXCCL_OP)
extern "C" __global__ void __launch_bounds__(512) oxccl_program(oxccl_prog_args a) {
    ox_program_kernel<ox_dtype<OXCCL_DTYPE>::type, OXCCL_OP>(a);
}

// Moves bytes: every module has it, the byte module runs it.
extern "C" __global__ void __launch_bounds__(512) oxccl_p2p(oxccl_p2p_args a) {
    ox_p2p_kernel<ox_dtype<1>::type, OXCCL_OP_SUM>(a);
}
#endif

#endif  // OXCCL_PROGRAM_CU
