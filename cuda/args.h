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

#endif
