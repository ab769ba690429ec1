/* Every collective x data type x op x in/out of place on host memory,
 * groups with send/recv, split, through NCCL's C API.
 *
 *   colls group N    N ranks as ncclCommInitAll threads, one thread driving
 *                    them all through groups (nccl-tests' -g)
 *   colls threads N  N ranks, one pthread each (ncclCommInitRank)
 *   colls procs N    N ranks, one forked process each
 * Prints "PASS <checks>" and exits 0, or names the first wrong element. */
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"

enum { AR, RED, RS, AG, BC, A2A, GATHER, SCATTER, NKINDS };
static const char* kind_name[NKINDS] = {"allreduce", "reduce", "reducescatter", "allgather",
                                         "broadcast", "alltoall", "gather", "scatter"};
enum { PREMUL = ncclNumOps }; /* our index for the pre-multiplied sum */
#define COUNT 37

typedef struct {
  ncclComm_t comm;
  int rank, n;
  char *send, *recv;
  long checks;
} Local;

static int reduces(int k) { return k == AR || k == RED || k == RS; }
static int fp8(ncclDataType_t t) { return t == ncclFloat8e4m3 || t == ncclFloat8e5m2; }

/* Rank r's input element i for op (non-reducing collectives: op = -1). */
static unsigned in_val(int op, ncclDataType_t t, int r, size_t i) {
  switch (op) {
    case ncclSum: return (unsigned)((r + i) % 2 + (fp8(t) ? 0 : i % 3));
    case ncclProd: return 1 + (r == 0 ? (unsigned)(i % 2) : 0);
    case ncclMax:
    case ncclMin: return (unsigned)((r * 3 + i) % 5);
    case ncclAvg: return (unsigned)(i % 3);
    case PREMUL: return (unsigned)((r + i) % 2);
    default: return (unsigned)((r * 7 + i) % 8);
  }
}

static double reduced(int op, ncclDataType_t t, int n, size_t i) {
  double acc = in_val(op, t, 0, i);
  for (int r = 1; r < n; r++) {
    double v = in_val(op, t, r, i);
    if (op == ncclSum || op == ncclAvg) acc += v;
    if (op == PREMUL) acc += v;
    if (op == ncclProd) acc *= v;
    if (op == ncclMax) acc = v > acc ? v : acc;
    if (op == ncclMin) acc = v < acc ? v : acc;
  }
  if (op == ncclAvg) acc /= n;
  if (op == PREMUL) acc *= 2;
  return acc;
}

static void expect_at(Local* L, const char* what, const void* buf, ncclDataType_t t, size_t i, double want,
                      int kind, int op, int inplace) {
  double got = get(buf, t, i);
  if (got != want) {
    fprintf(stderr, "rank %d of %d: %s %s op %d %s: %s[%zu] = %g, expected %g\n", L->rank, L->n,
            kind_name[kind], type_name[t], op, inplace ? "in place" : "out of place", what, i, got, want);
    exit(4);
  }
  L->checks++;
}

/* Issues one collective on L (inputs already in place). */
static ncclResult_t issue(Local* L, int kind, ncclDataType_t t, ncclRedOp_t op, int root, int inplace) {
  size_t c = COUNT, es = type_size[t];
  int r = L->rank;
  char *s = L->send, *d = L->recv;
  switch (kind) {
    case AR: return ncclAllReduce(inplace ? d : s, d, c, t, op, L->comm, NULL);
    case RED: return ncclReduce(inplace ? d : s, d, c, t, op, root, L->comm, NULL);
    case RS: return ncclReduceScatter(inplace ? d : s, inplace ? d + r * c * es : d, c, t, op, L->comm, NULL);
    case AG: return ncclAllGather(inplace ? d + r * c * es : s, d, c, t, L->comm, NULL);
    case BC: return inplace ? ncclBcast(d, c, t, root, L->comm, NULL) : ncclBroadcast(s, d, c, t, root, L->comm, NULL);
    case A2A: return ncclAlltoAll(s, d, c, t, L->comm, NULL);
    case GATHER: return ncclGather(inplace && r == root ? d + r * c * es : s, d, c, t, root, L->comm, NULL);
    case SCATTER: return ncclScatter(s, inplace && r == root ? s + r * c * es : d, c, t, root, L->comm, NULL);
  }
  return ncclInternalError;
}

/* Fills L's inputs for the call. */
static void prepare(Local* L, int kind, ncclDataType_t t, int op, int root, int inplace) {
  size_t c = COUNT, n = (size_t)L->n;
  int r = L->rank;
  memset(L->send, 0xee, n * c * 8);
  memset(L->recv, 0xee, n * c * 8);
  int v = reduces(kind) ? op : -1;
  switch (kind) {
    case AR:
    case RED:
      for (size_t i = 0; i < c; i++) put(inplace ? L->recv : L->send, t, i, in_val(v, t, r, i));
      break;
    case RS:
      for (size_t i = 0; i < n * c; i++) put(inplace ? L->recv : L->send, t, i, in_val(v, t, r, i));
      break;
    case AG:
      for (size_t i = 0; i < c; i++) put(inplace ? L->recv + r * c * type_size[t] : L->send, t, i, in_val(v, t, r, i));
      break;
    case BC:
      for (size_t i = 0; i < c; i++) put(inplace ? L->recv : L->send, t, i, in_val(v, t, r, i));
      break;
    case A2A:
      for (size_t i = 0; i < n * c; i++) put(L->send, t, i, in_val(v, t, r, i));
      break;
    case GATHER:
      for (size_t i = 0; i < c; i++)
        put(inplace && r == root ? L->recv + r * c * type_size[t] : L->send, t, i, in_val(v, t, r, i));
      break;
    case SCATTER:
      for (size_t i = 0; i < n * c; i++) put(L->send, t, i, in_val(v, t, r, i));
      break;
  }
}

static void verify(Local* L, int kind, ncclDataType_t t, int op, int root, int inplace) {
  size_t c = COUNT, n = (size_t)L->n, es = type_size[t];
  int r = L->rank, v = reduces(kind) ? op : -1;
  switch (kind) {
    case AR:
      for (size_t i = 0; i < c; i++) expect_at(L, "recv", L->recv, t, i, reduced(op, t, L->n, i), kind, op, inplace);
      break;
    case RED:
      if (r == root)
        for (size_t i = 0; i < c; i++) expect_at(L, "recv", L->recv, t, i, reduced(op, t, L->n, i), kind, op, inplace);
      break;
    case RS: {
      const char* out = inplace ? L->recv + r * c * es : L->recv;
      for (size_t i = 0; i < c; i++) expect_at(L, "recv", out, t, i, reduced(op, t, L->n, r * c + i), kind, op, inplace);
      break;
    }
    case AG:
      for (size_t j = 0; j < n; j++)
        for (size_t i = 0; i < c; i++) expect_at(L, "recv", L->recv, t, j * c + i, in_val(v, t, (int)j, i), kind, op, inplace);
      break;
    case BC:
      for (size_t i = 0; i < c; i++) expect_at(L, "recv", L->recv, t, i, in_val(v, t, root, i), kind, op, inplace);
      break;
    case A2A:
      for (size_t j = 0; j < n; j++)
        for (size_t i = 0; i < c; i++)
          expect_at(L, "recv", L->recv, t, j * c + i, in_val(v, t, (int)j, r * c + i), kind, op, inplace);
      break;
    case GATHER:
      if (r == root)
        for (size_t j = 0; j < n; j++)
          for (size_t i = 0; i < c; i++) expect_at(L, "recv", L->recv, t, j * c + i, in_val(v, t, (int)j, i), kind, op, inplace);
      break;
    case SCATTER: {
      const char* out = inplace && r == root ? L->send + r * c * es : L->recv;
      for (size_t i = 0; i < c; i++) expect_at(L, "recv", out, t, i, in_val(v, t, root, r * c + i), kind, op, inplace);
      break;
    }
  }
}

/* The whole matrix on k local ranks (a group when k > 1). */
static void matrix(Local* L, int k) {
  int n = L[0].n, combo = 0;
  for (int kind = 0; kind < NKINDS; kind++)
    for (int t = 0; t < ncclNumTypes; t++)
      for (int op = 0; op <= (reduces(kind) ? PREMUL : 0); op++)
        for (int inplace = 0; inplace < 2; inplace++, combo++) {
          if (kind == A2A && inplace) continue; /* NCCL has no in-place all-to-all */
          int root = combo % n;
          ncclRedOp_t ops[64];
          char scalar[64][8];
          for (int j = 0; j < k; j++) {
            prepare(&L[j], kind, (ncclDataType_t)t, op, root, inplace);
            ops[j] = (ncclRedOp_t)op;
            if (op == PREMUL) {
              put(scalar[j], (ncclDataType_t)t, 0, 2);
              CHECK(ncclRedOpCreatePreMulSum(&ops[j], scalar[j], (ncclDataType_t)t,
                                             inplace ? ncclScalarDevice : ncclScalarHostImmediate, L[j].comm));
              if (!inplace) memset(scalar[j], 0, 8); /* read at creation: changing it now changes nothing */
            }
          }
          if (k > 1) CHECK(ncclGroupStart());
          for (int j = 0; j < k; j++) CHECK(issue(&L[j], kind, (ncclDataType_t)t, ops[j], root, inplace));
          if (k > 1) CHECK(ncclGroupEnd());
          for (int j = 0; j < k; j++) {
            verify(&L[j], kind, (ncclDataType_t)t, op, root, inplace);
            if (op == PREMUL) CHECK(ncclRedOpDestroy(ops[j], L[j].comm));
          }
        }
}

/* Send/receive in groups: a ring shift, then an all-to-all of sends and
 * receives (each would deadlock one by one). */
static void p2p(Local* L, int k) {
  int n = L[0].n;
  size_t c = COUNT;
  for (int j = 0; j < k; j++) {
    for (size_t i = 0; i < (size_t)n * c; i++) ((int32_t*)L[j].send)[i] = L[j].rank * 1000 + (int)i;
    memset(L[j].recv, 0, (size_t)n * c * 4);
  }
  CHECK(ncclGroupStart());
  for (int j = 0; j < k; j++) {
    int r = L[j].rank;
    CHECK(ncclSend(L[j].send, c, ncclInt32, (r + 1) % n, L[j].comm, NULL));
    CHECK(ncclRecv(L[j].recv, c, ncclInt32, (r + n - 1) % n, L[j].comm, NULL));
  }
  CHECK(ncclGroupEnd());
  for (int j = 0; j < k; j++) {
    int from = (L[j].rank + n - 1) % n;
    for (size_t i = 0; i < c; i++) {
      EXPECT(((int32_t*)L[j].recv)[i] == from * 1000 + (int)i, "ring shift: rank %d element %zu", L[j].rank, i);
      L[j].checks++;
    }
  }
  CHECK(ncclGroupStart());
  for (int j = 0; j < k; j++)
    for (int p = 0; p < n; p++) {
      CHECK(ncclSend((int32_t*)L[j].send + p * c, c, ncclInt32, p, L[j].comm, NULL));
      CHECK(ncclRecv((int32_t*)L[j].recv + p * c, c, ncclInt32, p, L[j].comm, NULL));
    }
  CHECK(ncclGroupEnd());
  for (int j = 0; j < k; j++)
    for (int p = 0; p < n; p++)
      for (size_t i = 0; i < c; i++) {
        int32_t want = p * 1000 + (int)(L[j].rank * c + i);
        EXPECT(((int32_t*)L[j].recv)[p * c + i] == want, "send/recv all-to-all: rank %d from %d element %zu",
               L[j].rank, p, i);
        L[j].checks++;
      }
}

/* Split by parity, keys reversing the order; an all-reduce on the halves. */
static void split(Local* L, int k) {
  ncclComm_t sub[64];
  if (k > 1) CHECK(ncclGroupStart());
  for (int j = 0; j < k; j++) CHECK(ncclCommSplit(L[j].comm, L[j].rank % 2, -L[j].rank, &sub[j], NULL));
  if (k > 1) CHECK(ncclGroupEnd());
  int n = L[0].n;
  int32_t one[64], sum[64];
  if (k > 1) CHECK(ncclGroupStart());
  for (int j = 0; j < k; j++) {
    int size = 0, rank = -1, r = L[j].rank;
    CHECK(ncclCommCount(sub[j], &size));
    CHECK(ncclCommUserRank(sub[j], &rank));
    int want_size = (n - r % 2 + 1) / 2;
    EXPECT(size == want_size, "split: rank %d's half has %d ranks, not %d", r, size, want_size);
    EXPECT(rank == want_size - 1 - r / 2, "split: rank %d is rank %d of its half (keys reverse the order)", r, rank);
    one[j] = 1;
    CHECK(ncclAllReduce(&one[j], &sum[j], 1, ncclInt32, ncclSum, sub[j], NULL));
  }
  if (k > 1) CHECK(ncclGroupEnd());
  for (int j = 0; j < k; j++) {
    int size = 0;
    CHECK(ncclCommCount(sub[j], &size));
    EXPECT(sum[j] == size, "split: all-reduce of ones on rank %d's half gave %d", L[j].rank, sum[j]);
    CHECK(ncclCommDestroy(sub[j]));
    L[j].checks += 3;
  }
}

/* The ranks but the last make a smaller communicator (flags: NCCL_SHRINK_DEFAULT,
 * or NCCL_SHRINK_ABORT, which needs nothing of the parent but its peer table
 * and leaves the parent unusable; errors.c shrinks around an aborted rank);
 * an all-reduce on it. The caller destroys the parents. */
static void shrink(Local* L, int k, int flags) {
  int n = L[0].n;
  if (n < 2) return;
  int last = n - 1;
  ncclComm_t sub[64];
  int32_t one[64], sum[64];
  if (k > 1) CHECK(ncclGroupStart());
  for (int j = 0; j < k; j++)
    if (L[j].rank != last) CHECK(ncclCommShrink(L[j].comm, &last, 1, &sub[j], NULL, flags));
  if (k > 1) CHECK(ncclGroupEnd());
  if (k > 1) CHECK(ncclGroupStart());
  for (int j = 0; j < k; j++) {
    if (L[j].rank == last) continue;
    int size = 0, rank = -1;
    CHECK(ncclCommCount(sub[j], &size));
    CHECK(ncclCommUserRank(sub[j], &rank));
    EXPECT(size == n - 1 && rank == L[j].rank, "shrink: rank %d became %d of %d", L[j].rank, rank, size);
    one[j] = 1;
    CHECK(ncclAllReduce(&one[j], &sum[j], 1, ncclInt32, ncclSum, sub[j], NULL));
  }
  if (k > 1) CHECK(ncclGroupEnd());
  for (int j = 0; j < k; j++) {
    if (L[j].rank == last) continue;
    EXPECT(sum[j] == n - 1, "shrink (flags %d): all-reduce of ones gave %d", flags, sum[j]);
    if (flags == NCCL_SHRINK_ABORT) {
      float x = 1;
      ncclResult_t r = ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, L[j].comm, NULL);
      EXPECT(r == ncclInvalidUsage, "the parent after NCCL_SHRINK_ABORT returned %d", (int)r);
    }
    CHECK(ncclCommDestroy(sub[j]));
    L[j].checks += 2;
  }
}

static void alloc(Local* L, int n) {
  size_t bytes = (size_t)n * COUNT * 8;
  L->send = malloc(bytes);
  L->recv = malloc(bytes);
  L->n = n;
  L->checks = 0;
}

static long run(Local* L, int k) {
  matrix(L, k);
  p2p(L, k);
  split(L, k);
  shrink(L, k, NCCL_SHRINK_DEFAULT);
  shrink(L, k, NCCL_SHRINK_ABORT);
  long checks = 0;
  for (int j = 0; j < k; j++) checks += L[j].checks;
  return checks;
}

typedef struct {
  ncclUniqueId id;
  Local L;
} Thread;

static void* thread_main(void* arg) {
  Thread* t = arg;
  CHECK(ncclCommInitRank(&t->L.comm, t->L.n, t->id, t->L.rank));
  run(&t->L, 1);
  CHECK(ncclCommDestroy(t->L.comm));
  return NULL;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: colls group|threads|procs N\n");
    return 1;
  }
  int n = atoi(argv[2]);
  if (n < 1 || n > 64) return 1;
  long checks = 0;
  if (!strcmp(argv[1], "group")) {
    ncclComm_t comms[64];
    Local L[64];
    CHECK(ncclCommInitAll(comms, n, NULL));
    for (int j = 0; j < n; j++) {
      alloc(&L[j], n);
      L[j].comm = comms[j];
      L[j].rank = j;
    }
    checks = run(L, n);
    for (int j = 0; j < n; j++) CHECK(ncclCommDestroy(comms[j]));
  } else if (!strcmp(argv[1], "threads")) {
    Thread t[64];
    pthread_t th[64];
    ncclUniqueId id;
    CHECK(ncclGetUniqueId(&id));
    for (int j = 0; j < n; j++) {
      t[j].id = id;
      alloc(&t[j].L, n);
      t[j].L.rank = j;
      pthread_create(&th[j], NULL, thread_main, &t[j]);
    }
    for (int j = 0; j < n; j++) {
      pthread_join(th[j], NULL);
      checks += t[j].L.checks;
    }
  } else if (!strcmp(argv[1], "procs")) {
    ncclUniqueId id;
    CHECK(ncclGetUniqueId(&id));
    pid_t kids[64];
    for (int j = 0; j < n; j++) {
      kids[j] = fork();
      if (kids[j] == 0) {
        Thread t = {.id = id};
        alloc(&t.L, n);
        t.L.rank = j;
        thread_main(&t);
        printf("rank %d: %ld checks\n", j, t.L.checks);
        fflush(stdout);
        _exit(0);
      }
    }
    for (int j = 0; j < n; j++) {
      int st = 0;
      waitpid(kids[j], &st, 0);
      EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %d's process ended with status %#x", j, st);
    }
    checks = -1; /* counted by the ranks */
  } else {
    return 1;
  }
  printf("PASS %ld\n", checks);
  return 0;
}
