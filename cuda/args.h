// The kernels' argument blocks, shared by the CUDA sources (NVRTC), the host
// emulation (g++) and crates/oxccl-cuda (whose #[repr(C)] mirrors are checked
// against this header's offsetof by a test). Plain C: no CUDA constructs, no
// system headers.
#ifndef OXCCL_ARGS_H
#define OXCCL_ARGS_H

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef signed char i8;
typedef int i32;
typedef long long i64;

#define OXCCL_MAX_SRCS 16
#define OXCCL_MAX_RANKS 16
#define OXCCL_MAX_BLOCKS 64
// Bytes every rank reserves for its flag area: flags[OXCCL_MAX_RANKS][OXCCL_MAX_BLOCKS]
// (row: sender rank; column: block) then epochs[OXCCL_MAX_BLOCKS], all u64.
#define OXCCL_FLAG_BYTES 16384

// Status codes a kernel writes into status[0] (the first one wins).
#define OXCCL_STATUS_OK 0
#define OXCCL_STATUS_TIMEOUT 1
#define OXCCL_STATUS_ABORTED 2
// The kernel found its arguments unusable (rank count, window too small for
// one vector per slot …) and wrote nothing.
#define OXCCL_STATUS_INVALID 3

// oxccl_collective's algorithms (oxccl_coll_args.coll).
#define OXCCL_COLL_ALL_REDUCE_ONE_SHOT 0
#define OXCCL_COLL_ALL_REDUCE_TWO_SHOT 1
#define OXCCL_COLL_REDUCE_SCATTER 2
#define OXCCL_COLL_ALL_GATHER 3
#define OXCCL_COLL_BROADCAST 4
#define OXCCL_COLL_REDUCE 5
#define OXCCL_COLL_ALL_TO_ALL 6

// The local n-ary reduce/copy: dst[j][i] = fin(op(pre(src[0][i]), src[1][i], ...)).
struct oxccl_reduce_args {
    u64 srcs[OXCCL_MAX_SRCS];
    u64 dsts[OXCCL_MAX_SRCS];
    u64 count;
    double scale;
    u32 nsrcs;
    u32 ndsts;
    u32 premul;
    u32 avg_div;
};

// One whole collective over the ranks' windows (see cuda/README.md).
struct oxccl_coll_args {
    u64 window[OXCCL_MAX_RANKS];
    u64 flags[OXCCL_MAX_RANKS];
    u64 send;
    u64 recv;
    u64 count;
    u64 window_bytes;
    u64 timeout_ns;
    u64 status;
    double scale;
    u32 nranks;
    u32 rank;
    u32 root;
    u32 coll;
    u32 premul;
    u32 avg;
    u32 pad0;
    u32 pad1;
};

// ---------------------------------------------------------------------------
// oxccl_program: one rank's program of oxccl-algo's IR (cuda/program.cu).

#define OXCCL_MAX_CHANNELS 32
// Blocks that share one channel's steps (a team).
#define OXCCL_MAX_TEAM 16
// A rank's program flag area: pf[peer][channel][8] u64 words (the OXCCL_PF_*
// below), then team[channel][2] u64, then the address exchange: the launch
// it is for, and the rank's input and output of the last two launches
// (addr[seq % 2][2]); zeroed at allocation.
#define OXCCL_PF_WORDS 8
#define OXCCL_PROG_FLAG_BYTES (OXCCL_MAX_RANKS * OXCCL_MAX_CHANNELS * OXCCL_PF_WORDS * 8 + OXCCL_MAX_CHANNELS * 16 + 64)
// Written by the peer: pieces it posted into my FIFO; pieces of mine it
// consumed from its FIFO (credits); signals it sent me.
#define OXCCL_PF_HEAD 0
#define OXCCL_PF_TAIL 1
#define OXCCL_PF_SIG 2
// Mine, kept across launches: pieces I posted to the peer, pieces of its I
// consumed, signals I sent it, signals of its I waited for.
#define OXCCL_PF_SENT 3
#define OXCCL_PF_RECVD 4
#define OXCCL_PF_SIGSENT 5
#define OXCCL_PF_SIGSEEN 6

// Step kinds (oxccl-algo's Step, in its order).
#define OXCCL_PS_SEND 0
#define OXCCL_PS_RECV 1
#define OXCCL_PS_RECV_REDUCE 2
#define OXCCL_PS_RECV_REDUCE_SEND 3
#define OXCCL_PS_RECV_COPY_SEND 4
#define OXCCL_PS_RECV_REDUCE_COPY_SEND 5
#define OXCCL_PS_COPY 6
#define OXCCL_PS_REDUCE 7
#define OXCCL_PS_PUT 8
#define OXCCL_PS_GET 9
#define OXCCL_PS_GET_REDUCE 10
#define OXCCL_PS_SIGNAL 11
#define OXCCL_PS_WAIT 12

// A slice: the buffer in bits 62-63 (0 input, 1 output, 2 scratch), the
// first element in bits 0-61.
#define OXCCL_SLICE_BUF_SHIFT 62

// One step. Peers: `recv` is the peer received from, or the peer of a
// one-sided step; `send` the peer sent to. Slices: `dst` local (a put's is
// the peer's), `src` local (a get's and get-reduce's is the peer's),
// `acc` get-reduce's local operand; a reduce's `nsrc` operands are
// slices[src .. src + nsrc) of the program's slice table.
struct oxccl_pstep {
    u32 op;
    u32 recv;
    u32 send;
    u32 nsrc;
    u64 len;
    u64 dst;
    u64 src;
    u64 acc;
};

struct oxccl_prog_args {
    u64 bufs[OXCCL_MAX_RANKS][3];  // every rank's input, output, scratch as addressable here
    u64 fifo[OXCCL_MAX_RANKS];     // every rank's FIFO area
    u64 flags[OXCCL_MAX_RANKS];    // every rank's program flag area
    u64 steps;                     // this rank's steps (oxccl_pstep, device memory)
    u64 slices;                    // its slice table (u64, device memory)
    u64 slot_bytes;                // bytes of one FIFO slot (a multiple of 16)
    u64 timeout_ns;
    u64 status;
    u32 chan_first[OXCCL_MAX_CHANNELS];
    u32 chan_steps[OXCCL_MAX_CHANNELS];
    u32 nranks;
    u32 rank;
    u32 nchan;       // channels of this rank's program (grid: nchan * team blocks)
    u32 fifo_chans;  // channels of every rank's FIFO layout (>= every rank's nchan)
    u32 slots;       // slots per connection
    u32 team;        // blocks per channel
    // Ranks whose input and output this program reaches one-sidedly but
    // whose addresses are not in `bufs` (they change from call to call):
    // with the mask non-zero, this rank publishes its own in its flag area
    // at the start of launch `seq` and reads those of the other ranks in
    // the mask (bit q). Its own bit alone: it only publishes (a peer reaches
    // its buffers, it reaches nobody's). Only for ranks whose pointers are
    // valid here (threads of one process).
    u32 exchange;
    u64 seq;
};


// oxccl_p2p: a group of sends and receives (bytes) of one rank.
#define OXCCL_MAX_P2P 64
struct oxccl_p2p_args {
    u64 fifo[OXCCL_MAX_RANKS];   // every rank's FIFO area (as for oxccl_program)
    u64 flags[OXCCL_MAX_RANKS];  // every rank's program flag area
    u64 addr[OXCCL_MAX_P2P];     // the operations' buffers, lane after lane
    u64 len[OXCCL_MAX_P2P];      // their bytes
    u64 slot_bytes;
    u64 timeout_ns;
    u64 status;
    u32 lane_first[OXCCL_MAX_CHANNELS];  // first operation of each lane
    u32 lane_ops[OXCCL_MAX_CHANNELS];    // operations of each lane
    u32 lane_peer[OXCCL_MAX_CHANNELS];   // the lane's peer
    u32 lane_send[OXCCL_MAX_CHANNELS];   // 1: it sends, 0: it receives
    u32 nranks;
    u32 rank;
    u32 nlanes;  // grid: nlanes * team blocks
    u32 fifo_chans;
    u32 slots;
    u32 team;
    u32 pad0;
    u32 pad1;
};

#endif
