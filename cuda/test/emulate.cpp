// Host emulation of the oxccl kernels: the very source NVRTC compiles, run by
// host threads (one per CUDA thread of every block of every rank) through
// host_shim.h. Driven by crates/oxccl-cuda/tests/emulate.rs.
//
//   c++ -std=c++20 -O1 -pthread -fno-strict-aliasing cuda/test/emulate.cpp -o emulate
//
// Reads jobs from stdin, one header line each (decimal tokens), followed by
// its input bytes; answers each with "ok <numbers…> <nbytes>\n" and nbytes of
// output (or "err <message>\n"). dt: oxccl-core DataType number; op 0..3.
//
//   widen DT                      out: f32 bits of every code of a narrow type
//   narrow DT N                   in: N f32; out: N elements
//   scale DT N                    in: N f64; out: N premul scalars as elements
//   reduce DT OP COUNT NSRC NDST PREMUL SCALE_BITS AVG GRID BLOCK ALIAS SOFF[NSRC] DOFF[NDST]
//                                 in: NSRC sources; out: NDST results (ALIAS: dst 0 is src 0);
//                                 answer "ok GUARDS_OK nbytes"
//   coll DT OP COLL N COUNT GRID BLOCK WBYTES ROOT INPLACE PREMUL AVG TIMEOUT_NS SKIP ABORT REPEAT
//        SEND_OFF RECV_OFF SCALE_BITS[N]
//                                 in: every rank's send buffer; out per rank: u32 status[0],
//                                 u32 guards_ok, u32 send_intact, u32 0, then its recv region;
//                                 answer "ok ELAPSED_MS nbytes". SKIP: a rank not launched
//                                 (-1: none); ABORT: the host's abort word set before launch;
//                                 REPEAT: launches in a row on the same windows and flags.
//   prog DT OP N TEAM BLOCK SLOTS SLOT_BYTES FIFO_CHANS TIMEOUT_NS REPEAT PREMUL AVG SKIP ABORT EXCHANGE
//                                 oxccl_program for every rank; in per rank: u64 IN_N OUT_N
//                                 SCRATCH_N IN_AT OUT_AT SHARED_N NCHAN NSTEPS NSLICES SCALE_BITS,
//                                 u32 CHAN_FIRST[NCHAN] CHAN_STEPS[NCHAN], the steps
//                                 (oxccl_pstep), u64 slices[NSLICES], IN_N input elements.
//                                 SHARED_N != 0: input and output share one buffer of that
//                                 many elements (input at IN_AT, output at OUT_AT). PREMUL:
//                                 the input is first scaled into a copy (oxccl_reduce), AVG:
//                                 the output divided by N after (oxccl_reduce), as oxccl does.
//                                 EXCHANGE: peers' input and output addresses are not in the
//                                 arguments; the kernels exchange them (launch k has seq k).
//                                 Out per rank: u32 status[0], guards_ok, input_intact, 0,
//                                 then its output; answer "ok ELAPSED_MS nbytes".
//   p2p N TEAM BLOCK SLOTS SLOT_BYTES FIFO_CHANS TIMEOUT_NS REPEAT SKIP
//                                 oxccl_p2p for every rank; in per rank: u64 NLANES NOPS, u32
//                                 LANE_FIRST LANE_OPS LANE_PEER LANE_SEND [NLANES each], u64
//                                 LEN[NOPS] (lane order), then every send's bytes (lane order).
//                                 Out per rank: u32 status[0], guards_ok, then every receive's
//                                 bytes (lane order); answer "ok 0 nbytes".
//   stage MODE TIMEOUT_NS         wait_host with the word set (0), never set (1) or the
//                                 abort word set (2) by a host thread 20 ms later, then
//                                 signal_host; answer "ok STATUS WORD ELAPSED_MS 0"
#include "../oxccl.cuh"
#include "../reduce.cu"
#include "../collective.cu"
#include "../stage.cu"
#include "../program.cu"

#include <pthread.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

[[noreturn]] void die(const std::string &msg) {
    std::fprintf(stderr, "emulate: %s\n", msg.c_str());
    std::exit(2);
}

// ---------------------------------------------------------------------------
// The launcher: grid x block threads per kernel, all kernels of a launch at
// once (the ranks of a collective spin on each other).
struct Block {
    explicit Block(u32 n) : bar(n) { std::memset(smem, 0xCD, sizeof smem); }  // shared memory starts as garbage
    std::barrier<> bar;
    alignas(64) unsigned char smem[OX_HOST_SMEM_BYTES];
};

struct Thread {
    const std::function<void()> *fn;
    Block *blk;
    u32 b, t, grid, block;
    pthread_t id;
};

void *thread_main(void *arg) {
    const Thread &th = *static_cast<Thread *>(arg);
    threadIdx = {th.t, 0, 0};
    blockIdx = {th.b, 0, 0};
    blockDim = {th.block, 1, 1};
    gridDim = {th.grid, 1, 1};
    ox_host_bar = &th.blk->bar;
    ox_host_smem = th.blk->smem;
    (*th.fn)();
    return nullptr;
}

// Every kernel with its own grid, all at once.
void launch_grids(const std::vector<std::function<void()>> &kernels, const std::vector<u32> &grids, u32 block) {
    std::vector<std::unique_ptr<Block>> blocks;
    std::vector<Thread> threads;
    size_t total = 0;
    for (u32 g : grids) total += (size_t)g * block;
    threads.reserve(total);
    for (size_t i = 0; i < kernels.size(); i++) {
        const auto &k = kernels[i];
        const u32 grid = grids[i];
        for (u32 b = 0; b < grid; b++) {
            blocks.push_back(std::make_unique<Block>(block));
            for (u32 t = 0; t < block; t++) threads.push_back({&k, blocks.back().get(), b, t, grid, block, {}});
        }
    }
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 << 10);
    for (auto &th : threads) {
        if (pthread_create(&th.id, &attr, thread_main, &th) != 0) die("pthread_create failed");
    }
    for (auto &th : threads) pthread_join(th.id, nullptr);
    pthread_attr_destroy(&attr);
}

void launch(const std::vector<std::function<void()>> &kernels, u32 grid, u32 block) {
    launch_grids(kernels, std::vector<u32>(kernels.size(), grid), block);
}

// ---------------------------------------------------------------------------
// A buffer of len bytes at byte offset off from a 64-byte boundary, inside
// 64-byte guards; everything outside [off, off + len) must keep its fill.
const unsigned char FILL = 0x5A;

struct Buf {
    Buf(size_t off_, size_t len_) : off(off_), len(len_), mem((128 + off + len + 63) / 64) {
        std::memset(mem.data(), FILL, mem.size() * 64);
    }
    u64 addr() const { return (u64)(uintptr_t)(base() + off); }
    unsigned char *base() const { return (unsigned char *)mem.data() + 64; }
    unsigned char *data() const { return base() + off; }
    bool guards_ok() const {
        const unsigned char *p = (const unsigned char *)mem.data();
        const size_t lo = 64 + off, hi = lo + len;
        for (size_t i = 0; i < mem.size() * 64; i++) {
            if ((i < lo || i >= hi) && p[i] != FILL) return false;
        }
        return true;
    }
    size_t off, len;
    struct alignas(64) Line {
        unsigned char b[64];
    };
    std::vector<Line> mem;
};

std::vector<unsigned char> read_bytes(size_t n) {
    std::vector<unsigned char> v(n);
    if (n != 0 && !std::cin.read((char *)v.data(), (std::streamsize)n)) die("input ended inside a job's data");
    return v;
}

void answer(const std::string &head, const std::vector<unsigned char> &out) {
    std::cout << "ok " << head << " " << out.size() << "\n";
    std::cout.write((const char *)out.data(), (std::streamsize)out.size());
}

template <class T> void put(std::vector<unsigned char> &out, T v) {
    const unsigned char *p = (const unsigned char *)&v;
    out.insert(out.end(), p, p + sizeof v);
}

// Runs f.template operator()<T, OP>() for dtype number dt and op number op.
template <class F> void with_type(int dt, int op, F &&f) {
    auto by_op = [&]<class T>() {
        switch (op) {
        case 0: f.template operator()<T, 0>(); break;
        case 1: f.template operator()<T, 1>(); break;
        case 2: f.template operator()<T, 2>(); break;
        case 3: f.template operator()<T, 3>(); break;
        default: die("op out of range");
        }
    };
    switch (dt) {
    case 0: by_op.template operator()<ox_i8>(); break;
    case 1: by_op.template operator()<ox_u8>(); break;
    case 2: by_op.template operator()<ox_i32>(); break;
    case 3: by_op.template operator()<ox_u32>(); break;
    case 4: by_op.template operator()<ox_i64>(); break;
    case 5: by_op.template operator()<ox_u64>(); break;
    case 6: by_op.template operator()<ox_f16>(); break;
    case 7: by_op.template operator()<ox_f32>(); break;
    case 8: by_op.template operator()<ox_f64>(); break;
    case 9: by_op.template operator()<ox_bf16>(); break;
    case 10: by_op.template operator()<ox_e4m3>(); break;
    case 11: by_op.template operator()<ox_e5m2>(); break;
    default: die("dtype out of range");
    }
}

// ---------------------------------------------------------------------------
void job_convert(const std::string &kind, std::istringstream &in) {
    int dt = -1;
    u64 n = 0;
    in >> dt;
    if (kind != "widen") in >> n;
    std::vector<unsigned char> out;
    with_type(dt, 0, [&]<class T, int OP>() {
        typedef typename T::S S;
        if (kind == "widen") {
            if constexpr (sizeof(S) <= 2 && sizeof(typename T::A) == 4) {
                for (u32 c = 0; c < (1u << (8 * sizeof(S))); c++) put<u32>(out, ox_f2u(T::widen((S)c)));
            } else {
                die("widen: not a narrow float type");
            }
        } else if (kind == "narrow") {
            const auto in_bytes = read_bytes(n * 4);
            for (u64 i = 0; i < n; i++) {
                u32 bits;
                std::memcpy(&bits, &in_bytes[i * 4], 4);
                put<S>(out, T::narrow((typename T::A)ox_u2f(bits)));
            }
        } else {
            const auto in_bytes = read_bytes(n * 8);
            for (u64 i = 0; i < n; i++) {
                double s;
                std::memcpy(&s, &in_bytes[i * 8], 8);
                put<S>(out, T::narrow(T::scale(s)));
            }
        }
    });
    answer("", out);
}

void job_reduce(std::istringstream &in) {
    int dt, op;
    oxccl_reduce_args a{};
    u64 scale_bits;
    u32 grid, block, alias;
    in >> dt >> op >> a.count >> a.nsrcs >> a.ndsts >> a.premul >> scale_bits >> a.avg_div >> grid >> block >> alias;
    std::memcpy(&a.scale, &scale_bits, 8);
    if (a.nsrcs < 1 || a.nsrcs > 16 || a.ndsts < 1 || a.ndsts > 16 || !in) die("reduce: bad header");
    std::vector<u64> soff(a.nsrcs), doff(a.ndsts);
    for (auto &o : soff) in >> o;
    for (auto &o : doff) in >> o;
    bool ok = true;
    std::vector<unsigned char> out;
    with_type(dt, op, [&]<class T, int OP>() {
        const size_t bytes = a.count * sizeof(typename T::S);
        std::vector<std::unique_ptr<Buf>> srcs, dsts;
        for (u32 s = 0; s < a.nsrcs; s++) {
            srcs.push_back(std::make_unique<Buf>(soff[s], bytes));
            const auto data = read_bytes(bytes);
            if (bytes) std::memcpy(srcs.back()->data(), data.data(), bytes);
            a.srcs[s] = srcs.back()->addr();
        }
        for (u32 d = 0; d < a.ndsts; d++) {
            if (d == 0 && alias) {
                a.dsts[0] = a.srcs[0];
                continue;
            }
            dsts.push_back(std::make_unique<Buf>(doff[d], bytes));
            a.dsts[d] = dsts.back()->addr();
        }
        std::function<void()> k = [&] { ox_reduce_kernel<T, OP>(a); };
        launch({k}, grid, block);
        for (u32 d = 0; d < a.ndsts; d++) {
            const unsigned char *p = (const unsigned char *)(uintptr_t)a.dsts[d];
            out.insert(out.end(), p, p + bytes);
        }
        for (auto &b : srcs) ok = ok && b->guards_ok();
        for (auto &b : dsts) ok = ok && b->guards_ok();
    });
    answer(std::to_string(ok ? 1 : 0), out);
}

// Elements of the send and recv buffers of a rank (NCCL's layouts).
void coll_sizes(u32 coll, u64 n, u64 count, u64 &send, u64 &recv) {
    const bool nsend = coll == OXCCL_COLL_REDUCE_SCATTER || coll == OXCCL_COLL_ALL_TO_ALL;
    const bool nrecv = coll == OXCCL_COLL_ALL_GATHER || coll == OXCCL_COLL_ALL_TO_ALL;
    send = nsend ? n * count : count;
    recv = nrecv ? n * count : count;
}

void job_coll(std::istringstream &in) {
    int dt, op, skip;
    u32 n, grid, block, inplace, abort_word, repeat;
    u64 count, wbytes, timeout, send_off, recv_off;
    oxccl_coll_args proto{};
    in >> dt >> op >> proto.coll >> n >> count >> grid >> block >> wbytes >> proto.root >> inplace >> proto.premul >>
        proto.avg >> timeout >> skip >> abort_word >> repeat >> send_off >> recv_off;
    if (!in || n < 1 || n > OXCCL_MAX_RANKS) die("coll: bad header");
    std::vector<double> scales(n);
    for (auto &s : scales) {
        u64 bits;
        in >> bits;
        std::memcpy(&s, &bits, 8);
    }
    std::vector<unsigned char> out;
    double elapsed_ms = 0;
    with_type(dt, op, [&]<class T, int OP>() {
        const u64 E = sizeof(typename T::S);
        u64 send_n, recv_n;
        coll_sizes(proto.coll, n, count, send_n, recv_n);
        std::vector<std::vector<unsigned char>> input(n);
        for (auto &v : input) v = read_bytes(send_n * E);
        std::vector<std::unique_ptr<Buf>> bufs, windows, flags;
        std::vector<oxccl_coll_args> args(n, proto);
        std::vector<u32> status(2 * n, 0);
        std::vector<u64> send(n), recv(n);
        for (u32 r = 0; r < n; r++) {
            windows.push_back(std::make_unique<Buf>(0, wbytes));
            flags.push_back(std::make_unique<Buf>(0, OXCCL_FLAG_BYTES));
            std::memset(flags.back()->data(), 0, OXCCL_FLAG_BYTES);
            if (inplace) {
                const u64 big = send_n > recv_n ? send_n : recv_n;
                bufs.push_back(std::make_unique<Buf>(recv_off, big * E));
                const u64 base = bufs.back()->addr();
                send[r] = recv[r] = base;
                if (proto.coll == OXCCL_COLL_REDUCE_SCATTER) recv[r] = base + r * count * E;
                if (proto.coll == OXCCL_COLL_ALL_GATHER) send[r] = base + r * count * E;
            } else {
                bufs.push_back(std::make_unique<Buf>(send_off, send_n * E));
                send[r] = bufs.back()->addr();
                bufs.push_back(std::make_unique<Buf>(recv_off, recv_n * E));
                recv[r] = bufs.back()->addr();
            }
        }
        for (u32 r = 0; r < n; r++) {
            oxccl_coll_args &a = args[r];
            for (u32 q = 0; q < n; q++) {
                a.window[q] = windows[q]->addr();
                a.flags[q] = flags[q]->addr();
            }
            a.send = send[r];
            a.recv = recv[r];
            a.count = count;
            a.window_bytes = wbytes;
            a.timeout_ns = timeout;
            a.status = (u64)(uintptr_t)&status[2 * r];
            a.scale = scales[r];
            a.nranks = n;
            a.rank = r;
            if (abort_word) status[2 * r + 1] = 1;
        }
        std::vector<std::function<void()>> kernels;
        for (u32 r = 0; r < n; r++) {
            if ((int)r != skip) kernels.push_back([&args, r] { ox_collective_kernel<T, OP>(args[r]); });
        }
        const auto t0 = std::chrono::steady_clock::now();
        for (u32 rep = 0; rep < repeat; rep++) {
            for (u32 r = 0; r < n; r++) {
                if (send_n) std::memcpy((void *)(uintptr_t)send[r], input[r].data(), send_n * E);
            }
            launch(kernels, grid, block);
        }
        elapsed_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        for (u32 r = 0; r < n; r++) {
            bool guards = windows[r]->guards_ok() && flags[r]->guards_ok();
            for (auto &b : bufs) guards = guards && b->guards_ok();
            const bool intact = inplace || send_n == 0 ||
                                std::memcmp((void *)(uintptr_t)send[r], input[r].data(), send_n * E) == 0;
            put<u32>(out, status[2 * r]);
            put<u32>(out, guards ? 1 : 0);
            put<u32>(out, intact ? 1 : 0);
            put<u32>(out, 0);
            const unsigned char *p = (const unsigned char *)(uintptr_t)recv[r];
            out.insert(out.end(), p, p + recv_n * E);
        }
    });
    answer(std::to_string((u64)elapsed_ms), out);
}

// One rank's part of a "prog" job (see the header).
struct ProgRank {
    u64 in_n, out_n, scratch_n, in_at, out_at, shared_n, nchan, nsteps, nslices;
    double scale;
    std::vector<u32> chan_first, chan_steps;
    std::vector<oxccl_pstep> steps;
    std::vector<u64> slices;
    std::vector<unsigned char> input;
};

template <class V> std::vector<V> read_vec(size_t n) {
    std::vector<V> v(n);
    const auto bytes = read_bytes(n * sizeof(V));
    if (n) std::memcpy(v.data(), bytes.data(), n * sizeof(V));
    return v;
}

void job_prog(std::istringstream &in) {
    int dt, op, skip;
    u32 n, team, block, slots, fifo_chans, premul, avg, abort_word, repeat, exchange;
    u64 slot_bytes, timeout;
    in >> dt >> op >> n >> team >> block >> slots >> slot_bytes >> fifo_chans >> timeout >> repeat >> premul >> avg >>
        skip >> abort_word >> exchange;
    if (!in || n < 1 || n > OXCCL_MAX_RANKS) die("prog: bad header");
    std::vector<unsigned char> out;
    double elapsed_ms = 0;
    with_type(dt, op, [&]<class T, int OP>() {
        const u64 E = sizeof(typename T::S);
        std::vector<ProgRank> ranks(n);
        for (auto &pr : ranks) {
            const auto head = read_vec<u64>(10);
            pr.in_n = head[0], pr.out_n = head[1], pr.scratch_n = head[2], pr.in_at = head[3], pr.out_at = head[4];
            pr.shared_n = head[5], pr.nchan = head[6], pr.nsteps = head[7], pr.nslices = head[8];
            std::memcpy(&pr.scale, &head[9], 8);
            if (pr.nchan > OXCCL_MAX_CHANNELS) die("prog: too many channels");
            pr.chan_first = read_vec<u32>(pr.nchan);
            pr.chan_steps = read_vec<u32>(pr.nchan);
            pr.steps = read_vec<oxccl_pstep>(pr.nsteps);
            pr.slices = read_vec<u64>(pr.nslices);
            pr.input = read_bytes(pr.in_n * E);
        }
        // Buffers: input and output (one shared buffer when in place),
        // scratch, the premul copy of the input, FIFO and flag areas.
        std::vector<std::unique_ptr<Buf>> all;
        auto buf = [&](size_t off, size_t len) {
            all.push_back(std::make_unique<Buf>(off, len));
            return all.back().get();
        };
        const u64 fifo_bytes = (u64)n * fifo_chans * slots * slot_bytes;
        std::vector<oxccl_prog_args> args(n);
        std::vector<u32> status(2 * n, 0);
        std::vector<u64> input(n), output(n), pre(n);
        std::vector<Buf *> flags(n);
        for (u32 r = 0; r < n; r++) {
            const ProgRank &pr = ranks[r];
            if (pr.shared_n) {
                const u64 base = buf(8, pr.shared_n * E)->addr();
                input[r] = base + pr.in_at * E;
                output[r] = base + pr.out_at * E;
            } else {
                input[r] = buf(8, pr.in_n * E)->addr();
                output[r] = buf(24, pr.out_n * E)->addr();
            }
            pre[r] = premul ? buf(0, pr.in_n * E)->addr() : input[r];
            const u64 scratch = buf(0, pr.scratch_n * E)->addr();
            args[r].fifo[r] = buf(0, fifo_bytes)->addr();
            flags[r] = buf(0, OXCCL_PROG_FLAG_BYTES);
            std::memset(flags[r]->data(), 0, OXCCL_PROG_FLAG_BYTES);
            args[r].bufs[r][0] = pre[r];
            args[r].bufs[r][1] = output[r];
            args[r].bufs[r][2] = scratch;
        }
        std::vector<std::vector<oxccl_pstep>> steps(n);
        std::vector<std::vector<u64>> slices(n);
        for (u32 r = 0; r < n; r++) {
            oxccl_prog_args &a = args[r];
            for (u32 q = 0; q < n; q++) {
                // Exchanged: peers' input and output come from their flag areas.
                for (int b = 0; b < 3; b++) a.bufs[q][b] = exchange && q != r && b < 2 ? 0 : args[q].bufs[q][b];
                if (exchange && q != r) a.exchange |= 1u << q;
                a.fifo[q] = args[q].fifo[q];
                a.flags[q] = flags[q]->addr();
            }
            steps[r] = ranks[r].steps;
            slices[r] = ranks[r].slices;
            a.steps = (u64)(uintptr_t)steps[r].data();
            a.slices = (u64)(uintptr_t)slices[r].data();
            a.slot_bytes = slot_bytes;
            a.timeout_ns = timeout;
            a.status = (u64)(uintptr_t)&status[2 * r];
            for (u64 ch = 0; ch < ranks[r].nchan; ch++) {
                a.chan_first[ch] = ranks[r].chan_first[ch];
                a.chan_steps[ch] = ranks[r].chan_steps[ch];
            }
            a.nranks = n;
            a.rank = r;
            a.nchan = (u32)ranks[r].nchan;
            a.fifo_chans = fifo_chans;
            a.slots = slots;
            a.team = team;
            if (abort_word) status[2 * r + 1] = 1;
        }
        std::vector<std::function<void()>> kernels, pro, epi;
        std::vector<u32> grids;
        std::vector<oxccl_reduce_args> pre_args(n), avg_args(n);
        for (u32 r = 0; r < n; r++) {
            if ((int)r == skip) continue;
            if (ranks[r].nchan != 0) {
                kernels.push_back([&args, r] { ox_program_kernel<T, OP>(args[r]); });
                grids.push_back((u32)ranks[r].nchan * team);
            }
            oxccl_reduce_args &p = pre_args[r];
            p.srcs[0] = input[r], p.dsts[0] = pre[r], p.count = ranks[r].in_n, p.nsrcs = 1, p.ndsts = 1;
            p.premul = 1, p.scale = ranks[r].scale;
            if (premul) pro.push_back([&pre_args, r] { ox_reduce_kernel<T, OP>(pre_args[r]); });
            oxccl_reduce_args &v = avg_args[r];
            v.srcs[0] = v.dsts[0] = output[r], v.count = ranks[r].out_n, v.nsrcs = 1, v.ndsts = 1, v.avg_div = n;
            if (avg) epi.push_back([&avg_args, r] { ox_reduce_kernel<T, OP>(avg_args[r]); });
        }
        const auto t0 = std::chrono::steady_clock::now();
        for (u32 rep = 0; rep < repeat; rep++) {
            for (u32 r = 0; r < n; r++) {
                if (ranks[r].in_n) std::memcpy((void *)(uintptr_t)input[r], ranks[r].input.data(), ranks[r].in_n * E);
            }
            for (u32 r = 0; r < n; r++) args[r].seq = rep + 1;
            if (!pro.empty()) launch(pro, 2, block);
            launch_grids(kernels, grids, block);
            if (!epi.empty()) launch(epi, 2, block);
        }
        elapsed_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        bool guards = true;
        for (auto &b : all) guards = guards && b->guards_ok();
        for (u32 r = 0; r < n; r++) {
            const ProgRank &pr = ranks[r];
            const bool intact = pr.shared_n != 0 || pr.in_n == 0 ||
                                std::memcmp((void *)(uintptr_t)input[r], pr.input.data(), pr.in_n * E) == 0;
            put<u32>(out, status[2 * r]);
            put<u32>(out, guards ? 1 : 0);
            put<u32>(out, intact ? 1 : 0);
            put<u32>(out, 0);
            const unsigned char *p = (const unsigned char *)(uintptr_t)output[r];
            out.insert(out.end(), p, p + pr.out_n * E);
        }
    });
    answer(std::to_string((u64)elapsed_ms), out);
}

// A "p2p" job: every rank's group of sends and receives (see the header).
void job_p2p(std::istringstream &in) {
    u32 n, team, block, slots, fifo_chans, repeat;
    int skip;
    u64 slot_bytes, timeout;
    in >> n >> team >> block >> slots >> slot_bytes >> fifo_chans >> timeout >> repeat >> skip;
    if (!in || n < 1 || n > OXCCL_MAX_RANKS) die("p2p: bad header");
    std::vector<oxccl_p2p_args> args(n);
    std::vector<std::vector<std::unique_ptr<Buf>>> bufs(n);
    std::vector<std::vector<std::vector<unsigned char>>> data(n);
    std::vector<u32> status(2 * n, 0);
    std::vector<std::unique_ptr<Buf>> areas;
    const u64 fifo_bytes = (u64)n * fifo_chans * slots * slot_bytes;
    for (u32 r = 0; r < n; r++) {
        oxccl_p2p_args &a = args[r];
        a = oxccl_p2p_args{};
        const auto head = read_vec<u64>(2);
        a.nlanes = (u32)head[0];
        const u64 nops = head[1];
        if (a.nlanes > OXCCL_MAX_CHANNELS || nops > OXCCL_MAX_P2P) die("p2p: too many lanes or operations");
        const auto first = read_vec<u32>(a.nlanes), ops = read_vec<u32>(a.nlanes), peer = read_vec<u32>(a.nlanes),
                   send = read_vec<u32>(a.nlanes);
        for (u32 l = 0; l < a.nlanes; l++) {
            a.lane_first[l] = first[l], a.lane_ops[l] = ops[l], a.lane_peer[l] = peer[l], a.lane_send[l] = send[l];
        }
        const auto len = read_vec<u64>(nops);
        data[r].resize(nops);
        for (u32 l = 0; l < a.nlanes; l++) {
            for (u32 i = 0; i < ops[l]; i++) {
                const u32 k = first[l] + i;
                bufs[r].push_back(std::make_unique<Buf>(k % 16, len[k]));
                a.addr[k] = bufs[r].back()->addr();
                a.len[k] = len[k];
                if (send[l]) {
                    data[r][k] = read_bytes(len[k]);
                } else {
                    std::memset(bufs[r].back()->data(), 0, len[k]);
                }
            }
        }
        areas.push_back(std::make_unique<Buf>(0, fifo_bytes));
        a.fifo[r] = areas.back()->addr();
        areas.push_back(std::make_unique<Buf>(0, OXCCL_PROG_FLAG_BYTES));
        std::memset(areas.back()->data(), 0, OXCCL_PROG_FLAG_BYTES);
        a.flags[r] = areas.back()->addr();
        a.slot_bytes = slot_bytes, a.timeout_ns = timeout, a.status = (u64)(uintptr_t)&status[2 * r];
        a.nranks = n, a.rank = r, a.fifo_chans = fifo_chans, a.slots = slots, a.team = team;
    }
    for (u32 r = 0; r < n; r++) {
        for (u32 q = 0; q < n; q++) args[r].fifo[q] = args[q].fifo[q], args[r].flags[q] = args[q].flags[q];
    }
    std::vector<std::function<void()>> kernels;
    std::vector<u32> grids;
    for (u32 r = 0; r < n; r++) {
        if ((int)r == skip || args[r].nlanes == 0) continue;
        kernels.push_back([&args, r] { ox_p2p_kernel<ox_u8, 0>(args[r]); });
        grids.push_back(args[r].nlanes * team);
    }
    for (u32 rep = 0; rep < repeat; rep++) {
        for (u32 r = 0; r < n; r++) {
            for (u32 k = 0; k < data[r].size(); k++) {
                if (!data[r][k].empty()) std::memcpy((void *)(uintptr_t)args[r].addr[k], data[r][k].data(), data[r][k].size());
            }
        }
        launch_grids(kernels, grids, block);
    }
    std::vector<unsigned char> out;
    bool guards = true;
    for (auto &b : areas) guards = guards && b->guards_ok();
    for (u32 r = 0; r < n; r++) {
        for (auto &b : bufs[r]) guards = guards && b->guards_ok();
    }
    for (u32 r = 0; r < n; r++) {
        put<u32>(out, status[2 * r]);
        put<u32>(out, guards ? 1 : 0);
        const oxccl_p2p_args &a = args[r];
        for (u32 l = 0; l < a.nlanes; l++) {
            if (a.lane_send[l]) continue;
            for (u32 i = 0; i < a.lane_ops[l]; i++) {
                const u32 k = a.lane_first[l] + i;
                const unsigned char *p = (const unsigned char *)(uintptr_t)a.addr[k];
                out.insert(out.end(), p, p + a.len[k]);
            }
        }
    }
    answer("0", out);
}

void job_stage(std::istringstream &in) {
    u32 mode;
    u64 timeout;
    in >> mode >> timeout;
    u64 word = 0, sig = 0;
    u32 status[2] = {0, 0};
    const u64 w = (u64)(uintptr_t)&word, st = (u64)(uintptr_t)status;
    const auto t0 = std::chrono::steady_clock::now();
    std::thread host([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        if (mode == 0) __atomic_store_n(&word, 7, __ATOMIC_RELEASE);
        if (mode == 2) __atomic_store_n(&status[1], 1, __ATOMIC_RELAXED);
    });
    std::function<void()> wait = [&] { oxccl_wait_host(w, 7, st, timeout); };
    launch({wait}, 1, 1);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    host.join();
    std::function<void()> signal = [&] { oxccl_signal_host((u64)(uintptr_t)&sig, 42); };
    launch({signal}, 1, 2);
    std::ostringstream head;
    head << status[0] << " " << __atomic_load_n(&sig, __ATOMIC_ACQUIRE) << " " << (u64)ms;
    answer(head.str(), {});
}

}  // namespace

int main() {
    std::ios::sync_with_stdio(false);
    std::string line;
    while (std::getline(std::cin, line)) {
        if (line.empty()) continue;
        std::istringstream in(line);
        std::string kind;
        in >> kind;
        if (kind == "widen" || kind == "narrow" || kind == "scale") {
            job_convert(kind, in);
        } else if (kind == "reduce") {
            job_reduce(in);
        } else if (kind == "coll") {
            job_coll(in);
        } else if (kind == "prog") {
            job_prog(in);
        } else if (kind == "p2p") {
            job_p2p(in);
        } else if (kind == "stage") {
            job_stage(in);
        } else {
            die("unknown job '" + kind + "'");
        }
        std::cout.flush();
    }
    return 0;
}
