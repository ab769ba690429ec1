/*
 * nccl.h for oxccl's libnccl.so.2: NCCL's C API (version 2.32.3: names,
 * enum values, struct layouts, functions), implemented by oxccl.
 *
 * Build against it as against NVIDIA's header; link with -lnccl (the
 * library's soname is libnccl.so.2), or LD_PRELOAD the library under a
 * program built against NVIDIA's header.
 *
 * CUDA headers are optional: where <cuda_runtime.h> can be included it is
 * (as NCCL's header does); otherwise cudaStream_t and cudaEvent_t are
 * declared as the opaque pointers the CUDA runtime declares them as.
 * Define OXCCL_NO_CUDA_RUNTIME to skip the CUDA headers even where they
 * exist.
 *
 * oxccl extension - host memory: a call whose buffers are host memory (or
 * any call where no CUDA driver is present) runs on host memory and returns
 * when it is done; its stream must be NULL (else ncclInvalidArgument).
 * Calls on device memory are enqueued on the stream and return at once, as
 * with NCCL.
 *
 * Handles and threads:
 *  - ncclComm_t: owned by the caller from ncclCommInit*, ncclCommSplit or
 *    ncclCommShrink until ncclCommDestroy or ncclCommAbort; a destroyed
 *    handle is refused (ncclInvalidArgument), never dereferenced. Calls on
 *    one communicator from several threads are serialised in the order they
 *    arrive; every rank must issue them in the same order.
 *  - Groups (ncclGroupStart/End) belong to the calling thread and may span
 *    several communicators.
 *  - ncclGetLastError returns this thread's last error message, valid
 *    until this thread's next failing call.
 *  - ncclUniqueId is plain bytes: copy it, send it, store it.
 *  - Reduction operators from ncclRedOpCreatePreMulSum belong to their
 *    communicator and end with it or with ncclRedOpDestroy.
 *  - Registration handles (ncclCommRegister) belong to their communicator.
 *  - Memory from ncclMemAlloc is the caller's until ncclMemFree (device
 *    memory where a CUDA device is present, host memory otherwise).
 * Functions oxccl cannot honour (the device-side API, symmetric windows,
 * one-sided signals, memory suspension, growing a communicator) return
 * ncclInvalidUsage and say so through ncclGetLastError.
 */
#ifndef NCCL_H_
#define NCCL_H_

#if !defined(OXCCL_NO_CUDA_RUNTIME) && defined(__has_include)
#if __has_include(<cuda_runtime.h>)
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#if defined(CUDART_VERSION) && CUDART_VERSION >= 11000
#include <cuda_bf16.h>
#endif
#define OXCCL_HAVE_CUDA_RUNTIME 1
#endif
#endif

#ifndef OXCCL_HAVE_CUDA_RUNTIME
/* The CUDA runtime's own declarations (identical typedefs may repeat). */
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
#endif

#define NCCL_MAJOR 2
#define NCCL_MINOR 32
#define NCCL_PATCH 3
#define NCCL_SUFFIX ""

#define NCCL_VERSION_CODE 23203
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))

/* oxccl's own version, beside the NCCL API version it implements. */
#define OXCCL_VERSION_STRING "0.1.0"

#ifdef __cplusplus
extern "C" {
#endif

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ncclComm* ncclComm_t;
typedef struct ncclWindow_vidmem* ncclWindow_t;
#define NCCL_COMM_NULL NULL

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclTimeout = 8,
  ncclNumResults = 9
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f

typedef enum {
  ncclHostCftDefault = NCCL_CONFIG_UNDEF_INT,
  ncclHostCftEnable = 1,
  ncclHostCftDisable = 2,
  ncclHostCftFallback = 3
} ncclHostCftMode_t;

typedef enum {
  ncclNvlsHostModeDefault = NCCL_CONFIG_UNDEF_INT,
  ncclNvlsHostModeEnable = 0,
  ncclNvlsHostModeDisableTransport = 1 << 0,
  ncclNvlsHostModeDisableSymmetricMultimem = 1 << 1,
  ncclNvlsHostModeDisable = INT_MAX
} ncclNvlsHostMode_t;

/* Communicator configuration (ncclCommInitRankConfig, ncclCommSplit,
 * ncclCommShrink). oxccl reads size, magic, version and blocking; the other
 * fields are accepted and have no effect. */
typedef struct ncclConfig_v23100 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
  int trafficClass;
  const char* commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
  int graphUsageMode;
  int numRmaCtx;
  int maxP2pPeers;
  int graphStreamOrdering;
  int launchOrderImplicit;
  int numRmaSig;
  int rmaEagerInit;
  int hostCftMode;
  int nvlsHostMode;
} ncclConfig_t;

#define NCCL_API_MAGIC 0xcafebeef

#define NCCL_CONFIG_INITIALIZER {                                           \
  sizeof(ncclConfig_t), NCCL_API_MAGIC, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), \
  NCCL_CONFIG_UNDEF_INT, /* blocking */                                     \
  NCCL_CONFIG_UNDEF_INT, /* cgaClusterSize */                               \
  NCCL_CONFIG_UNDEF_INT, /* minCTAs */                                      \
  NCCL_CONFIG_UNDEF_INT, /* maxCTAs */                                      \
  NCCL_CONFIG_UNDEF_PTR, /* netName */                                      \
  NCCL_CONFIG_UNDEF_INT, /* splitShare */                                   \
  NCCL_CONFIG_UNDEF_INT, /* trafficClass */                                 \
  NCCL_CONFIG_UNDEF_PTR, /* commName */                                     \
  NCCL_CONFIG_UNDEF_INT, /* collnetEnable */                                \
  NCCL_CONFIG_UNDEF_INT, /* CTAPolicy */                                    \
  NCCL_CONFIG_UNDEF_INT, /* shrinkShare */                                  \
  NCCL_CONFIG_UNDEF_INT, /* nvlsCTAs */                                     \
  NCCL_CONFIG_UNDEF_INT, /* nChannelsPerNetPeer */                          \
  NCCL_CONFIG_UNDEF_INT, /* nvlinkCentricSched */                           \
  NCCL_CONFIG_UNDEF_INT, /* graphUsageMode */                               \
  NCCL_CONFIG_UNDEF_INT, /* numRmaCtx */                                    \
  NCCL_CONFIG_UNDEF_INT, /* maxP2pPeers */                                  \
  NCCL_CONFIG_UNDEF_INT, /* graphStreamOrdering */                          \
  NCCL_CONFIG_UNDEF_INT, /* launchOrderImplicit */                          \
  NCCL_CONFIG_UNDEF_INT, /* numRmaSig */                                    \
  NCCL_CONFIG_UNDEF_INT, /* rmaEagerInit */                                 \
  NCCL_CONFIG_UNDEF_INT, /* hostCftMode */                                  \
  NCCL_CONFIG_UNDEF_INT, /* nvlsHostMode */                                 \
}

/* Per-call options of the nccl*Config collectives; oxccl checks size and
 * magic and otherwise ignores them. */
typedef struct ncclConfigExt {
  struct ncclConfigExt* next;
  struct {
    int vendorId;
    int optionId;
  } key;
  union {
    int i;
    const char* s;
    void* raw;
  } val;
} ncclConfigExt_t;

typedef struct ncclCollConfig_v23200 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  ncclConfigExt_t* ext;
  int minCTAs;
  int maxCTAs;
  int nvlsCTAs;
  int cgaClusterSize;
  const char* algSelection;
  int forceAlgSelection;
  int CTAPolicy;
  uint64_t userProfilerTag;
  cudaEvent_t launchCompletionEvent;
} ncclCollConfig_t;

#define NCCL_COLLCONFIG_INITIALIZER {                                       \
  sizeof(ncclCollConfig_t), NCCL_API_MAGIC, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), \
  NCCL_CONFIG_UNDEF_PTR, /* ext */                                          \
  NCCL_CONFIG_UNDEF_INT, /* minCTAs */                                      \
  NCCL_CONFIG_UNDEF_INT, /* maxCTAs */                                      \
  NCCL_CONFIG_UNDEF_INT, /* nvlsCTAs */                                     \
  NCCL_CONFIG_UNDEF_INT, /* cgaClusterSize */                               \
  NCCL_CONFIG_UNDEF_PTR, /* algSelection */                                 \
  1,                     /* forceAlgSelection */                            \
  NCCL_CONFIG_UNDEF_INT, /* CTAPolicy */                                    \
  0,                     /* userProfilerTag */                              \
  NCCL_CONFIG_UNDEF_PTR, /* launchCompletionEvent */                        \
}

/* ncclGroupSimulateEnd's answer: oxccl's cost model's prediction of the
 * group's time, in microseconds. */
typedef struct ncclSimInfo_v22200 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  float estimatedTime;
} ncclSimInfo_t;

#define NCCL_SIM_INFO_INITIALIZER \
  { sizeof(ncclSimInfo_t), 0x74685283, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), NCCL_UNDEF_FLOAT }

#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#define NCCL_WIN_STRICT_ORDERING 0x02
#define NCCL_WIN_GIN_ONLY 0x04
#define NCCL_WIN_CFT_COUNTED 0x08
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01
#define NCCL_CTA_POLICY_ZERO 0x02

#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01

#define NCCL_REVOKE_DEFAULT 0x00

#define NCCL_SUSPEND_MEM 0x01

typedef enum {
  ncclStatGpuMemSuspend = 0,
  ncclStatGpuMemSuspended = 1,
  ncclStatGpuMemPersist = 2,
  ncclStatGpuMemTotal = 3
} ncclCommMemStat_t;

typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  /* Operators from ncclRedOpCreatePreMulSum are numbered from here. */
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

typedef enum {
  /* The scalar is in memory (device or host) and is read at each call. */
  ncclScalarDevice = 0,
  /* The scalar is on the host and is read once, when the operator is made. */
  ncclScalarHostImmediate = 1
} ncclScalarResidence_t;

typedef struct {
  int opCnt;
  int peer;
  int sigIdx;
  int ctx;
} ncclWaitSignalDesc_t;

typedef enum { NCCL_ENCRYPTION_MODE_NONE = 0, NCCL_ENCRYPTION_MODE_PSK = 1 } ncclEncryptionMode_t;

typedef struct ncclEncryptionConfig_v23200 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int mode;
  const char* psk;
} ncclEncryptionConfig_t;

#define NCCL_ENCRYPTION_CONFIG_INITIALIZER {                                \
  sizeof(ncclEncryptionConfig_t), NCCL_API_MAGIC, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), \
  NCCL_ENCRYPTION_MODE_NONE, NCCL_CONFIG_UNDEF_PTR,                         \
}

typedef struct ncclParamHandle* ncclParamHandle_t;

/* Every function has a pnccl* twin with the same parameters (the name a
 * profiler that overrides nccl* calls). */
#define OXCCL_API(ret, name, args) ret nccl##name args; ret pnccl##name args;

/* Memory: device memory where a CUDA device is present, else host memory. */
OXCCL_API(ncclResult_t, MemAlloc, (void** ptr, size_t size))
OXCCL_API(ncclResult_t, MemFree, (void* ptr))

/* Versions and ids. */
OXCCL_API(ncclResult_t, GetVersion, (int* version))
OXCCL_API(ncclResult_t, GetUniqueId, (ncclUniqueId* uniqueId))

/* Communicators. One thread's calls at a time per communicator (NCCL's
 * rule): a collective, send/recv or group end that enters a communicator
 * another thread's call is in returns ncclInvalidUsage and changes nothing
 * (calls from two threads would reach the ranks in different orders).
 * Queries, ncclCommGetAsyncError and ncclCommAbort may come from any thread. */
OXCCL_API(ncclResult_t, CommInitRankConfig,
          (ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config))
OXCCL_API(ncclResult_t, CommInitRank, (ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank))
OXCCL_API(ncclResult_t, CommInitAll, (ncclComm_t* comm, int ndev, const int* devlist))
OXCCL_API(ncclResult_t, CommFinalize, (ncclComm_t comm))
OXCCL_API(ncclResult_t, CommDestroy, (ncclComm_t comm))
OXCCL_API(ncclResult_t, CommAbort, (ncclComm_t comm))
OXCCL_API(ncclResult_t, CommRevoke, (ncclComm_t comm, int revokeFlags))
OXCCL_API(ncclResult_t, CommSplit, (ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config))
OXCCL_API(ncclResult_t, CommShrink,
          (ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm, ncclConfig_t* config,
           int shrinkFlags))
/* Growing a communicator: not supported by oxccl (ncclInvalidUsage). */
OXCCL_API(ncclResult_t, CommGetUniqueId, (ncclComm_t comm, ncclUniqueId* uniqueId))
OXCCL_API(ncclResult_t, CommGrow,
          (ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank, ncclComm_t* newcomm,
           ncclConfig_t* config))
OXCCL_API(ncclResult_t, CommInitRankScalable,
          (ncclComm_t* newcomm, int nranks, int myrank, int nId, ncclUniqueId* commIds, ncclConfig_t* config))

/* Errors. */
OXCCL_API(const char*, GetErrorString, (ncclResult_t result))
OXCCL_API(const char*, GetLastError, (ncclComm_t comm))
#ifdef NCCL_OS_LINUX
OXCCL_API(void, ResetDebugInit, ())
#else
#define ncclResetDebugInit()
#define pncclResetDebugInit()
#endif
OXCCL_API(ncclResult_t, CommGetAsyncError, (ncclComm_t comm, ncclResult_t* asyncError))

/* Queries. */
OXCCL_API(ncclResult_t, CommCount, (const ncclComm_t comm, int* count))
OXCCL_API(ncclResult_t, CommCuDevice, (const ncclComm_t comm, int* device))
OXCCL_API(ncclResult_t, CommUserRank, (const ncclComm_t comm, int* rank))

/* Registration (a hint: oxccl registers nothing ahead of time). */
OXCCL_API(ncclResult_t, CommRegister, (const ncclComm_t comm, void* buff, size_t size, void** handle))
OXCCL_API(ncclResult_t, CommDeregister, (const ncclComm_t comm, void* handle))

/* Not supported by oxccl (ncclInvalidUsage). */
OXCCL_API(ncclResult_t, CommSuspend, (ncclComm_t comm, int flags))
OXCCL_API(ncclResult_t, CommResume, (ncclComm_t comm))
OXCCL_API(ncclResult_t, CommMemStats, (ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value))
OXCCL_API(ncclResult_t, CommWindowRegister, (ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags))
OXCCL_API(ncclResult_t, CommWindowDeregister, (ncclComm_t comm, ncclWindow_t win))
OXCCL_API(ncclResult_t, WinGetUserPtr, (ncclComm_t comm, ncclWindow_t win, void** outUserPtr))

/* Reduction operators. */
OXCCL_API(ncclResult_t, RedOpCreatePreMulSum,
          (ncclRedOp_t* op, void* scalar, ncclDataType_t datatype, ncclScalarResidence_t residence, ncclComm_t comm))
OXCCL_API(ncclResult_t, RedOpDestroy, (ncclRedOp_t op, ncclComm_t comm))

/* Collectives. */
OXCCL_API(ncclResult_t, Reduce,
          (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, int root,
           ncclComm_t comm, cudaStream_t stream))
OXCCL_API(ncclResult_t, Bcast,
          (void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream))
OXCCL_API(ncclResult_t, Broadcast,
          (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
           cudaStream_t stream))
OXCCL_API(ncclResult_t, AllReduce,
          (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
           ncclComm_t comm, cudaStream_t stream))
OXCCL_API(ncclResult_t, ReduceScatter,
          (const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op,
           ncclComm_t comm, cudaStream_t stream))
OXCCL_API(ncclResult_t, AllGather,
          (const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype, ncclComm_t comm,
           cudaStream_t stream))
OXCCL_API(ncclResult_t, AlltoAll,
          (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclComm_t comm,
           cudaStream_t stream))
OXCCL_API(ncclResult_t, Gather,
          (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
           cudaStream_t stream))
OXCCL_API(ncclResult_t, Scatter,
          (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
           cudaStream_t stream))

/* The same with per-call options (checked, then ignored). */
OXCCL_API(ncclResult_t, AllReduceConfig,
          (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
           ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config))
OXCCL_API(ncclResult_t, BroadcastConfig,
          (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
           cudaStream_t stream, const ncclCollConfig_t* config))
OXCCL_API(ncclResult_t, ReduceConfig,
          (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, int root,
           ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config))
OXCCL_API(ncclResult_t, AllGatherConfig,
          (const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype, ncclComm_t comm,
           cudaStream_t stream, const ncclCollConfig_t* config))
OXCCL_API(ncclResult_t, ReduceScatterConfig,
          (const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op,
           ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config))
OXCCL_API(ncclResult_t, AlltoAllConfig,
          (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclComm_t comm,
           cudaStream_t stream, const ncclCollConfig_t* config))
OXCCL_API(ncclResult_t, GatherConfig,
          (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
           cudaStream_t stream, const ncclCollConfig_t* config))
OXCCL_API(ncclResult_t, ScatterConfig,
          (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
           cudaStream_t stream, const ncclCollConfig_t* config))

/* Point to point (in a group, matched sends and receives run together). */
OXCCL_API(ncclResult_t, Send,
          (const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
           cudaStream_t stream))
OXCCL_API(ncclResult_t, Recv,
          (void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream))

/* One-sided signals on symmetric windows: not supported by oxccl. */
OXCCL_API(ncclResult_t, PutSignal,
          (const void* localbuff, size_t count, ncclDataType_t datatype, int peer, ncclWindow_t peerWin,
           size_t peerWinOffset, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm, cudaStream_t stream))
OXCCL_API(ncclResult_t, Signal,
          (int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm, cudaStream_t stream))
OXCCL_API(ncclResult_t, WaitSignal,
          (int nDesc, ncclWaitSignalDesc_t* signalDescs, ncclComm_t comm, cudaStream_t stream))

/* Groups. */
OXCCL_API(ncclResult_t, GroupStart, ())
OXCCL_API(ncclResult_t, GroupEnd, ())
OXCCL_API(ncclResult_t, GroupSimulateEnd, (ncclSimInfo_t* simInfo))

/* Encryption: PSK mode encrypts the bootstrap and TCP traffic of the
 * communicators made afterwards (every rank must pass the same key). */
OXCCL_API(ncclResult_t, SetEncryption, (const ncclEncryptionConfig_t* config))

/* Parameters: the NCCL_* and OXCCL_* variables oxccl reads. */
OXCCL_API(ncclResult_t, ParamBind, (ncclParamHandle_t* out, const char* key))
OXCCL_API(ncclResult_t, ParamGetI8, (ncclParamHandle_t h, int8_t* out))
OXCCL_API(ncclResult_t, ParamGetI16, (ncclParamHandle_t h, int16_t* out))
OXCCL_API(ncclResult_t, ParamGetI32, (ncclParamHandle_t h, int32_t* out))
OXCCL_API(ncclResult_t, ParamGetI64, (ncclParamHandle_t h, int64_t* out))
OXCCL_API(ncclResult_t, ParamGetU8, (ncclParamHandle_t h, uint8_t* out))
OXCCL_API(ncclResult_t, ParamGetU16, (ncclParamHandle_t h, uint16_t* out))
OXCCL_API(ncclResult_t, ParamGetU32, (ncclParamHandle_t h, uint32_t* out))
OXCCL_API(ncclResult_t, ParamGetU64, (ncclParamHandle_t h, uint64_t* out))
OXCCL_API(ncclResult_t, ParamGetStr, (ncclParamHandle_t h, const char** out))
OXCCL_API(ncclResult_t, ParamGet, (ncclParamHandle_t h, void* out, int maxLen, int* len))
OXCCL_API(ncclResult_t, ParamGetParameter, (const char* key, const char** value, int* valueLen))
OXCCL_API(ncclResult_t, ParamGetAllParameterKeys, (const char*** table, int* tableLen))
OXCCL_API(void, ParamDumpAll, (void))

#undef OXCCL_API

#ifdef __cplusplus
}
#endif

#endif /* NCCL_H_ */
