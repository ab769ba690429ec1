/* Versions, error codes and ncclGetLastError texts, non-blocking init,
 * handles after destroy, groups, the simulator, memory, parameters: what a
 * C caller sees when it gets things wrong. Prints "PASS <checks>". */
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

static long checks;

/* `cmd` returns `code` and the last error mentions `text`. */
#define FAILS(cmd, code, text)                                                                   \
  do {                                                                                           \
    ncclResult_t r_ = (cmd);                                                                     \
    const char* m_ = ncclGetLastError(NULL);                                                     \
    EXPECT(r_ == (code), "%s returned %d, not %d (%s)", #cmd, (int)r_, (int)(code), m_);          \
    EXPECT(strstr(m_, (text)) != NULL, "%s: last error \"%s\" does not mention \"%s\"", #cmd, m_, \
           (text));                                                                              \
    checks++;                                                                                    \
  } while (0)

int main(void) {
  int v = 0;
  CHECK(ncclGetVersion(&v));
  EXPECT(v == NCCL_VERSION_CODE, "ncclGetVersion gave %d, the header says %d", v, NCCL_VERSION_CODE);
  EXPECT(NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH) == NCCL_VERSION_CODE, "NCCL_VERSION disagrees");
  EXPECT(NCCL_VERSION(2, 8, 4) == 2804 && NCCL_VERSION(2, 32, 3) == 23203, "NCCL_VERSION's two formulas");
  EXPECT(!strcmp(ncclGetErrorString(ncclSuccess), "no error"), "success text");
  EXPECT(strstr(ncclGetErrorString(ncclInvalidArgument), "invalid argument"), "invalid argument text");
  EXPECT(strstr(ncclGetErrorString(ncclInProgress), "in progress"), "in progress text");
  /* The hints point where the details are: ncclGetLastError, not NCCL_DEBUG=WARN (the default
   * level here, which adds nothing). */
  ncclResult_t hinted[] = {ncclUnhandledCudaError, ncclSystemError, ncclInvalidArgument, ncclInvalidUsage};
  for (size_t i = 0; i < sizeof hinted / sizeof hinted[0]; i++) {
    const char* t = ncclGetErrorString(hinted[i]);
    EXPECT(strstr(t, "ncclGetLastError()") && !strstr(t, "NCCL_DEBUG=WARN"), "code %d's text: %s",
           (int)hinted[i], t);
    checks++;
  }
  FAILS(ncclGetVersion(NULL), ncclInvalidArgument, "version is NULL");

  /* Non-blocking init of a 2-rank communicator from two threads' worth of
   * calls made by this one: both return at once. */
  ncclUniqueId id;
  CHECK(ncclGetUniqueId(&id));
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t c[2];
  for (int r = 0; r < 2; r++) {
    ncclResult_t res = ncclCommInitRankConfig(&c[r], 2, id, r, &cfg);
    EXPECT(res == ncclInProgress || res == ncclSuccess, "non-blocking init returned %d", (int)res);
  }
  for (int r = 0; r < 2; r++) {
    ncclResult_t st = ncclInProgress;
    for (int i = 0; i < 20000 && st == ncclInProgress; i++) {
      CHECK(ncclCommGetAsyncError(c[r], &st));
      if (st == ncclInProgress) usleep(1000);
    }
    EXPECT(st == ncclSuccess, "rank %d's non-blocking init ended with %d", r, (int)st);
    int n = 0, me = -1, dev = 7;
    CHECK(ncclCommCount(c[r], &n));
    CHECK(ncclCommUserRank(c[r], &me));
    CHECK(ncclCommCuDevice(c[r], &dev));
    EXPECT(n == 2 && me == r && dev == -1, "count %d rank %d device %d", n, me, dev);
    checks++;
  }

  /* Bad arguments: each refused, naming what was wrong, changing nothing. */
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8];
  FAILS(ncclAllReduce(x, y, 8, ncclFloat, ncclSum, NULL, NULL), ncclInvalidArgument, "comm is NULL");
  FAILS(ncclAllReduce(x, y, 8, (ncclDataType_t)99, ncclSum, c[0], NULL), ncclInvalidArgument, "datatype 99");
  FAILS(ncclAllReduce(x, y, 8, ncclFloat, (ncclRedOp_t)42, c[0], NULL), ncclInvalidArgument, "op 42");
  FAILS(ncclAllReduce(NULL, y, 8, ncclFloat, ncclSum, c[0], NULL), ncclInvalidArgument, "sendbuff is NULL");
  FAILS(ncclAllReduce(x, y, 8, ncclFloat, ncclSum, c[0], (cudaStream_t)0x1234), ncclInvalidArgument,
        "NULL stream");
  FAILS(ncclBroadcast(x, y, 8, ncclFloat, 2, c[0], NULL), ncclInvalidArgument, "root 2");
  FAILS(ncclSend(x, 8, ncclFloat, 5, c[0], NULL), ncclInvalidArgument, "peer 5");
  FAILS(ncclAllGather(x, x, 4, ncclFloat, c[1], NULL), ncclInvalidArgument, "in-place layout");
  FAILS(ncclCommInitRank(&c[0], 2, id, 2), ncclInvalidArgument, "rank 2");
  ncclUniqueId junk;
  memset(&junk, 7, sizeof junk);
  ncclComm_t bad;
  FAILS(ncclCommInitRank(&bad, 2, junk, 0), ncclInvalidArgument, "UniqueId");
  ncclConfig_t nomagic = NCCL_CONFIG_INITIALIZER;
  nomagic.magic = 0;
  FAILS(ncclCommInitRankConfig(&bad, 2, id, 0, &nomagic), ncclInvalidArgument, "NCCL_CONFIG_INITIALIZER");
  FAILS(ncclGroupEnd(), ncclInvalidUsage, "without a matching ncclGroupStart");
  FAILS(ncclRedOpDestroy((ncclRedOp_t)77, c[0]), ncclInvalidArgument, "op 77");
  FAILS(ncclCommWindowRegister(c[0], y, sizeof y, NULL, 0), ncclInvalidUsage, "not supported");
  FAILS(ncclCommShrink(c[0], NULL, 0, &bad, NULL, 5), ncclInvalidArgument, "NCCL_SHRINK_ABORT (1)");
  int me = 0;
  FAILS(ncclCommShrink(c[0], &me, 1, &bad, NULL, NCCL_SHRINK_DEFAULT), ncclInvalidArgument, "exclude list");

  /* An error inside a group fails the group and launches nothing. */
  CHECK(ncclGroupStart());
  FAILS(ncclAllReduce(x, y, 8, (ncclDataType_t)99, ncclSum, c[0], NULL), ncclInvalidArgument, "datatype");
  FAILS(ncclGroupEnd(), ncclInvalidArgument, "nothing in the group was launched");
  ncclCollConfig_t badcc = NCCL_COLLCONFIG_INITIALIZER;
  badcc.magic = 1;
  CHECK(ncclGroupStart());
  FAILS(ncclAllReduceConfig(x, y, 8, ncclFloat, ncclSum, c[0], NULL, &badcc), ncclInvalidArgument,
        "NCCL_COLLCONFIG_INITIALIZER");
  FAILS(ncclGroupEnd(), ncclInvalidArgument, "nothing in the group was launched");

  /* The communicator still works: one thread drives both ranks in a group. */
  float out[2][8];
  CHECK(ncclGroupStart());
  for (int r = 0; r < 2; r++) CHECK(ncclAllReduce(x, out[r], 8, ncclFloat, ncclSum, c[r], NULL));
  CHECK(ncclGroupEnd());
  for (int i = 0; i < 8; i++) EXPECT(out[0][i] == 2 * x[i] && out[1][i] == 2 * x[i], "element %d", i);
  checks++;

  /* The simulator prices a group without running it. */
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  CHECK(ncclGroupStart());
  CHECK(ncclAllReduce(x, out[0], 8, ncclFloat, ncclSum, c[0], NULL));
  CHECK(ncclGroupSimulateEnd(&sim));
  EXPECT(sim.estimatedTime > 0 && sim.estimatedTime < 1e6, "estimated %g us", sim.estimatedTime);
  checks++;

  /* Registration handles, memory, parameters. */
  void* h = NULL;
  CHECK(ncclCommRegister(c[0], y, sizeof y, &h));
  CHECK(ncclCommDeregister(c[0], h));
  FAILS(ncclCommDeregister(c[0], h), ncclInvalidArgument, "not a registration");
  void* mem = NULL;
  CHECK(ncclMemAlloc(&mem, 1 << 20));
  EXPECT(mem != NULL && ((uintptr_t)mem & 4095) == 0, "ncclMemAlloc gave %p", mem);
  memset(mem, 1, 1 << 20);
  CHECK(ncclMemFree(mem));
  FAILS(ncclMemFree(mem), ncclInvalidArgument, "did not come from ncclMemAlloc");
  setenv("NCCL_NSOCKS", "3", 1);
  ncclParamHandle_t ph;
  CHECK(ncclParamBind(&ph, "NSOCKS"));
  int32_t ns = 0;
  CHECK(ncclParamGetI32(ph, &ns));
  EXPECT(ns == 3, "NSOCKS read as %d", ns);
  checks++;

  /* ncclSetEncryption: bad configs are refused; with a PSK, communicators
   * made afterwards encrypt (their bootstrap here) and work. */
  FAILS(ncclSetEncryption(NULL), ncclInvalidArgument, "is NULL");
  ncclEncryptionConfig_t enc = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
  enc.magic = 0;
  FAILS(ncclSetEncryption(&enc), ncclInvalidArgument, "NCCL_API_MAGIC");
  enc.magic = NCCL_API_MAGIC;
  enc.mode = 5;
  FAILS(ncclSetEncryption(&enc), ncclInvalidArgument, "config.mode is 5");
  enc.mode = NCCL_ENCRYPTION_MODE_PSK;
  FAILS(ncclSetEncryption(&enc), ncclInvalidArgument, "psk is NULL");
  enc.psk = "a key every rank shares";
  CHECK(ncclSetEncryption(&enc));
  ncclUniqueId eid;
  CHECK(ncclGetUniqueId(&eid));
  ncclComm_t e[2];
  CHECK(ncclGroupStart());
  for (int r = 0; r < 2; r++) CHECK(ncclCommInitRank(&e[r], 2, eid, r));
  CHECK(ncclGroupEnd());
  CHECK(ncclGroupStart());
  for (int r = 0; r < 2; r++) CHECK(ncclAllReduce(x, out[r], 8, ncclFloat, ncclSum, e[r], NULL));
  CHECK(ncclGroupEnd());
  for (int i = 0; i < 8; i++) EXPECT(out[0][i] == 2 * x[i] && out[1][i] == 2 * x[i], "encrypted element %d", i);
  for (int r = 0; r < 2; r++) CHECK(ncclCommDestroy(e[r]));
  ncclEncryptionConfig_t off = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
  CHECK(ncclSetEncryption(&off));
  checks++;

  /* Keys that differ (set between two ranks' non-blocking inits, as two
   * processes with different keys would have them): both inits fail at
   * once saying so, not at their timeout; and a key on one rank only. */
  for (int with_b = 1; with_b >= 0; with_b--) {
    ncclUniqueId kid;
    CHECK(ncclGetUniqueId(&kid));
    ncclConfig_t kcfg = NCCL_CONFIG_INITIALIZER;
    kcfg.blocking = 0;
    ncclComm_t k[2];
    struct timespec k0, k1;
    clock_gettime(CLOCK_MONOTONIC, &k0);
    enc.psk = "key a";
    CHECK(ncclSetEncryption(&enc));
    ncclResult_t kr = ncclCommInitRankConfig(&k[0], 2, kid, 0, &kcfg);
    EXPECT(kr == ncclInProgress, "rank 0's keyed init returned %d", (int)kr);
    enc.psk = "key b";
    CHECK(ncclSetEncryption(with_b ? &enc : &off));
    kr = ncclCommInitRankConfig(&k[1], 2, kid, 1, &kcfg);
    EXPECT(kr == ncclInProgress, "rank 1's init returned %d", (int)kr);
    CHECK(ncclSetEncryption(&off));
    for (int r = 0; r < 2; r++) {
      ncclResult_t ks = ncclInProgress;
      for (int i = 0; i < 20000 && ks == ncclInProgress; i++) {
        CHECK(ncclCommGetAsyncError(k[r], &ks));
        if (ks == ncclInProgress) usleep(1000);
      }
      const char* m = ncclGetLastError(k[r]);
      EXPECT(ks == ncclInvalidUsage, "rank %d's init with keys that differ ended with %d (%s)", r, (int)ks, m);
      EXPECT(strstr(m, "another encryption key") != NULL, "rank %d's error: %s", r, m);
      CHECK(ncclCommAbort(k[r]));
    }
    clock_gettime(CLOCK_MONOTONIC, &k1);
    double ksecs = (double)(k1.tv_sec - k0.tv_sec) + (double)(k1.tv_nsec - k0.tv_nsec) * 1e-9;
    EXPECT(ksecs < 5.0, "keys that differ were found after %.2f s", ksecs);
    checks++;
  }

  /* Destroyed handles are refused, not dereferenced. */
  CHECK(ncclCommDestroy(c[1]));
  FAILS(ncclAllReduce(x, y, 8, ncclFloat, ncclSum, c[1], NULL), ncclInvalidArgument, "already destroyed");
  FAILS(ncclCommDestroy(c[1]), ncclInvalidArgument, "already destroyed");
  CHECK(ncclCommAbort(c[0]));
  FAILS(ncclCommCount(c[0], &v), ncclInvalidArgument, "already destroyed");

  /* Aborting a non-blocking init whose peer never comes returns at once. */
  ncclComm_t lone;
  ncclUniqueId id2;
  CHECK(ncclGetUniqueId(&id2));
  ncclResult_t rr = ncclCommInitRankConfig(&lone, 2, id2, 0, &cfg);
  EXPECT(rr == ncclInProgress, "a lone non-blocking init returned %d", (int)rr);
  ncclResult_t st = ncclSuccess;
  CHECK(ncclCommGetAsyncError(lone, &st));
  EXPECT(st == ncclInProgress, "a lone init reads %d, not ncclInProgress", (int)st);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  CHECK(ncclCommAbort(lone));
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  EXPECT(secs < 1.0, "ncclCommAbort of a pending init took %.2f s", secs);
  FAILS(ncclCommGetAsyncError(lone, &st), ncclInvalidArgument, "already destroyed");
  checks++;

  /* A rank dies (aborts); the others shrink around it with
   * NCCL_SHRINK_ABORT although their communicator is poisoned. */
  ncclComm_t three[3], two[2];
  CHECK(ncclCommInitAll(three, 3, NULL));
  CHECK(ncclCommAbort(three[2]));
  int gone = 2;
  CHECK(ncclGroupStart());
  for (int r = 0; r < 2; r++) CHECK(ncclCommShrink(three[r], &gone, 1, &two[r], NULL, NCCL_SHRINK_ABORT));
  CHECK(ncclGroupEnd());
  float twos[2][8];
  CHECK(ncclGroupStart());
  for (int r = 0; r < 2; r++) CHECK(ncclAllReduce(x, twos[r], 8, ncclFloat, ncclSum, two[r], NULL));
  CHECK(ncclGroupEnd());
  EXPECT(twos[1][7] == 16, "all-reduce after the shrink gave %g", twos[1][7]);
  for (int r = 0; r < 2; r++) {
    CHECK(ncclCommDestroy(two[r]));
    CHECK(ncclCommDestroy(three[r]));
  }
  checks++;

  /* Count 0 moves nothing and accepts NULL buffers. */
  ncclComm_t solo;
  CHECK(ncclCommInitAll(&solo, 1, NULL));
  CHECK(ncclAllReduce(NULL, NULL, 0, ncclFloat, ncclSum, solo, NULL));
  CHECK(ncclCommDestroy(solo));
  checks++;
  printf("PASS %ld\n", checks);
  return 0;
}
