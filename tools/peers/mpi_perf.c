/* mpi_perf: MPI collectives measured the way nccl-tests measures NCCL's,
 * so tools/compare-peers can put Open MPI next to oxccl-perf.
 *
 *   mpicc -O3 -o mpi_perf tools/peers/mpi_perf.c
 *   mpirun -np 4 ./mpi_perf all_reduce -b 8 -e 64M -f 4 -n 20 -w 5
 *
 * COLL is one of all_reduce all_gather reduce_scatter alltoall broadcast
 * reduce gather scatter sendrecv (nccl-tests' binaries without "_perf").
 * Flags are nccl-tests': -b -e -i -f -n -w -d -o -r -c -a (long forms too).
 *
 * What nccl-tests does and this does too:
 *  - the sweep size S gives N = S / sizeof(type) elements; collectives
 *    that split a buffer among ranks (all_gather, reduce_scatter, alltoall,
 *    gather, scatter) use N / nranks elements per rank: that is the "count"
 *    column, and "size" is the larger of the send and receive buffers;
 *  - algbw = bytes / time with bytes = count * type size, times nranks for
 *    the split collectives; busbw = algbw * 2(n-1)/n for all_reduce,
 *    (n-1)/n for the split ones, 1 for broadcast, reduce and sendrecv;
 *  - time is the mean over -n iterations after -w warm-up ones, one
 *    barrier before, averaged over ranks (-a 1; 0 rank 0, 2 min, 3 max);
 *  - each size runs out of place, then in place (MPI_IN_PLACE; for
 *    broadcast the root's send buffer is also its receive buffer, the
 *    out-of-place root copies its input first; sendrecv in place is
 *    MPI_Sendrecv_replace);
 *  - with -c 1 (default) one more call on fresh inputs is checked: every
 *    input is a small integer, so every reduction order gives the same
 *    exact result, and #wrong counts mismatching elements over all ranks.
 */
#include <mpi.h>
#include <getopt.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum op { OP_SUM, OP_PROD, OP_MAX, OP_MIN };
enum shape { WHOLE, SPLIT }; /* SPLIT: count = N / nranks per rank */

struct dtype {
  const char *name; /* nccl-tests' name */
  MPI_Datatype mpi;
  size_t size;
};

static const struct dtype DTYPES[] = {
    {"float", MPI_FLOAT, 4},     {"double", MPI_DOUBLE, 8}, {"int32", MPI_INT32_T, 4},
    {"int64", MPI_INT64_T, 8},   {"uint8", MPI_UINT8_T, 1}, {"int8", MPI_INT8_T, 1},
    {"uint32", MPI_UINT32_T, 4}, {"uint64", MPI_UINT64_T, 8},
};
static const char *OP_NAMES[] = {"sum", "prod", "max", "min"};

struct run {
  int rank, nranks, root;
  const struct dtype *t;
  enum op op;
  MPI_Op mpi_op;
  size_t count; /* the "count" column */
};

/* One collective: buffer sizes, the call, the expected output. */
struct coll {
  const char *name;
  enum shape shape;
  int reduces, rooted;
  double (*busfactor)(int n);
  /* send and receive buffer elements on this rank */
  void (*lengths)(const struct run *r, size_t *send, size_t *recv);
  /* in place: where the input is put in the receive buffer (elements),
   * or -1 when the input is not in the receive buffer */
  long (*inplace_input)(const struct run *r);
  int (*call)(const struct run *r, void *send, void *recv, int in_place);
  /* expected receive element i on this rank; returns 0 when this rank's
   * receive buffer holds nothing to check */
  int (*expect)(const struct run *r, size_t i, double *want);
  size_t (*checked)(const struct run *r); /* receive elements to check */
};

/* ---- inputs and expected values ---- */

static double input(const struct run *r, int rank, size_t i) {
  if (r->op == OP_PROD) return ((size_t)rank + i) % 13 == 0 ? 2 : 1;
  return (double)(((size_t)rank * 3 + i * 7) % 13);
}

static double fold(const struct run *r, size_t i) {
  double acc = input(r, 0, i);
  for (int p = 1; p < r->nranks; p++) {
    double v = input(r, p, i);
    switch (r->op) {
      case OP_SUM: acc += v; break;
      case OP_PROD: acc *= v; break;
      case OP_MAX: acc = v > acc ? v : acc; break;
      case OP_MIN: acc = v < acc ? v : acc; break;
    }
  }
  return acc;
}

static void store(const struct dtype *t, void *buf, size_t i, double v) {
  switch (t->mpi == MPI_FLOAT ? 0 : t->mpi == MPI_DOUBLE ? 1 : t->size == 8 ? 2 : t->size == 4 ? 3 : 4) {
    case 0: ((float *)buf)[i] = (float)v; break;
    case 1: ((double *)buf)[i] = v; break;
    case 2: ((int64_t *)buf)[i] = (int64_t)v; break;
    case 3: ((int32_t *)buf)[i] = (int32_t)v; break;
    default: ((uint8_t *)buf)[i] = (uint8_t)v; break;
  }
}

static int same(const struct dtype *t, const void *buf, size_t i, double want) {
  if (t->mpi == MPI_FLOAT) return ((const float *)buf)[i] == (float)want;
  if (t->mpi == MPI_DOUBLE) return ((const double *)buf)[i] == want;
  if (t->size == 8) return ((const int64_t *)buf)[i] == (int64_t)want;
  if (t->size == 4) return ((const int32_t *)buf)[i] == (int32_t)want;
  if (t->mpi == MPI_INT8_T) return ((const int8_t *)buf)[i] == (int8_t)want;
  return ((const uint8_t *)buf)[i] == (uint8_t)want;
}


/* ---- the collectives ---- */

static double f_allreduce(int n) { return 2.0 * (n - 1) / n; }
static double f_split(int n) { return (double)(n - 1) / n; }
static double f_one(int n) { (void)n; return 1.0; }

static void len_whole(const struct run *r, size_t *s, size_t *d) { *s = *d = r->count; }
static void len_gather(const struct run *r, size_t *s, size_t *d) { *s = r->count; *d = r->count * r->nranks; }
static void len_scatter(const struct run *r, size_t *s, size_t *d) { *s = r->count * r->nranks; *d = r->count; }
static void len_square(const struct run *r, size_t *s, size_t *d) { *s = *d = r->count * r->nranks; }

static long at_start(const struct run *r) { (void)r; return 0; }
static long at_my_block(const struct run *r) { return (long)(r->rank * r->count); }
static long at_root_block(const struct run *r) { return r->rank == r->root ? (long)(r->root * r->count) : -1; }
static long nowhere(const struct run *r) { (void)r; return -1; }

#define SEND(ip) ((ip) ? MPI_IN_PLACE : send)
#define N(c) ((int)(c))

static int c_allreduce(const struct run *r, void *send, void *recv, int ip) {
  return MPI_Allreduce(SEND(ip), recv, N(r->count), r->t->mpi, r->mpi_op, MPI_COMM_WORLD);
}
static int c_allgather(const struct run *r, void *send, void *recv, int ip) {
  return MPI_Allgather(SEND(ip), N(r->count), r->t->mpi, recv, N(r->count), r->t->mpi, MPI_COMM_WORLD);
}
static int c_reducescatter(const struct run *r, void *send, void *recv, int ip) {
  return MPI_Reduce_scatter_block(SEND(ip), recv, N(r->count), r->t->mpi, r->mpi_op, MPI_COMM_WORLD);
}
static int c_alltoall(const struct run *r, void *send, void *recv, int ip) {
  return MPI_Alltoall(SEND(ip), N(r->count), r->t->mpi, recv, N(r->count), r->t->mpi, MPI_COMM_WORLD);
}
static int c_broadcast(const struct run *r, void *send, void *recv, int ip) {
  if (!ip && r->rank == r->root) memcpy(recv, send, r->count * r->t->size);
  return MPI_Bcast(recv, N(r->count), r->t->mpi, r->root, MPI_COMM_WORLD);
}
static int c_reduce(const struct run *r, void *send, void *recv, int ip) {
  void *s = ip && r->rank == r->root ? MPI_IN_PLACE : ip ? recv : send;
  return MPI_Reduce(s, recv, N(r->count), r->t->mpi, r->mpi_op, r->root, MPI_COMM_WORLD);
}
static int c_gather(const struct run *r, void *send, void *recv, int ip) {
  void *s = ip && r->rank == r->root ? MPI_IN_PLACE : ip ? recv : send;
  return MPI_Gather(s, N(r->count), r->t->mpi, recv, N(r->count), r->t->mpi, r->root, MPI_COMM_WORLD);
}
static int c_scatter(const struct run *r, void *send, void *recv, int ip) {
  /* in place: the root's own block stays where it is in the send buffer */
  if (ip && r->rank == r->root)
    return MPI_Scatter(recv, N(r->count), r->t->mpi, MPI_IN_PLACE, N(r->count), r->t->mpi, r->root, MPI_COMM_WORLD);
  return MPI_Scatter(send, N(r->count), r->t->mpi, recv, N(r->count), r->t->mpi, r->root, MPI_COMM_WORLD);
}
static int c_sendrecv(const struct run *r, void *send, void *recv, int ip) {
  int next = (r->rank + 1) % r->nranks, prev = (r->rank + r->nranks - 1) % r->nranks;
  if (ip) return MPI_Sendrecv_replace(recv, N(r->count), r->t->mpi, next, 7, prev, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  return MPI_Sendrecv(send, N(r->count), r->t->mpi, next, 7, recv, N(r->count), r->t->mpi, prev, 7, MPI_COMM_WORLD,
                      MPI_STATUS_IGNORE);
}

/* Inputs: rank p's send element j is input(p, j) for every collective;
 * for the split ones, element j of block b is element b*count + j. */
static int e_allreduce(const struct run *r, size_t i, double *w) { *w = fold(r, i); return 1; }
static int e_allgather(const struct run *r, size_t i, double *w) {
  *w = input(r, (int)(i / r->count), i % r->count);
  return 1;
}
static int e_reducescatter(const struct run *r, size_t i, double *w) { *w = fold(r, r->rank * r->count + i); return 1; }
static int e_alltoall(const struct run *r, size_t i, double *w) {
  /* block b of my output is block `rank` of rank b's input */
  *w = input(r, (int)(i / r->count), r->rank * r->count + i % r->count);
  return 1;
}
static int e_broadcast(const struct run *r, size_t i, double *w) { *w = input(r, r->root, i); return 1; }
static int e_reduce(const struct run *r, size_t i, double *w) {
  if (r->rank != r->root) return 0;
  *w = fold(r, i);
  return 1;
}
static int e_gather(const struct run *r, size_t i, double *w) {
  if (r->rank != r->root) return 0;
  return e_allgather(r, i, w);
}
static int e_scatter(const struct run *r, size_t i, double *w) {
  *w = input(r, r->root, r->rank * r->count + i);
  return 1;
}
static int e_sendrecv(const struct run *r, size_t i, double *w) {
  *w = input(r, (r->rank + r->nranks - 1) % r->nranks, i);
  return 1;
}

static size_t k_whole(const struct run *r) { return r->count; }
static size_t k_square(const struct run *r) { return r->count * r->nranks; }

static const struct coll COLLS[] = {
    {"all_reduce", WHOLE, 1, 0, f_allreduce, len_whole, at_start, c_allreduce, e_allreduce, k_whole},
    {"all_gather", SPLIT, 0, 0, f_split, len_gather, at_my_block, c_allgather, e_allgather, k_square},
    {"reduce_scatter", SPLIT, 1, 0, f_split, len_scatter, at_start, c_reducescatter, e_reducescatter, k_whole},
    {"alltoall", SPLIT, 0, 0, f_split, len_square, at_start, c_alltoall, e_alltoall, k_square},
    {"broadcast", WHOLE, 0, 1, f_one, len_whole, at_start, c_broadcast, e_broadcast, k_whole},
    {"reduce", WHOLE, 1, 1, f_one, len_whole, at_start, c_reduce, e_reduce, k_whole},
    {"gather", SPLIT, 0, 1, f_split, len_gather, at_root_block, c_gather, e_gather, k_square},
    {"scatter", SPLIT, 0, 1, f_split, len_scatter, nowhere, c_scatter, e_scatter, k_whole},
    {"sendrecv", WHOLE, 0, 0, f_one, len_whole, at_start, c_sendrecv, e_sendrecv, k_whole},
};
#define NCOLLS (sizeof COLLS / sizeof COLLS[0])

/* Writes this rank's inputs for one call. In place, the input goes into
 * the receive buffer (scatter in place: the root's send buffer is the
 * receive buffer argument of c_scatter, so it gets the whole input). */
static void prepare(const struct coll *c, const struct run *r, void *send, void *recv, int ip) {
  size_t ns, nr;
  c->lengths(r, &ns, &nr);
  memset(recv, 0, nr * r->t->size);
  if (!ip) {
    for (size_t j = 0; j < ns; j++) store(r->t, send, j, input(r, r->rank, j));
    return;
  }
  if (c->call == c_scatter) {
    if (r->rank == r->root)
      for (size_t j = 0; j < ns; j++) store(r->t, recv, j, input(r, r->rank, j));
    return;
  }
  long at = c->inplace_input(r);
  if (at >= 0) {
    for (size_t j = 0; j < ns; j++) store(r->t, recv, (size_t)at + j, input(r, r->rank, j));
  } else {
    /* reduce and gather on a non-root rank: the input is read from recv */
    for (size_t j = 0; j < ns; j++) store(r->t, recv, j, input(r, r->rank, j));
  }
}

static long count_wrong(const struct coll *c, const struct run *r, const void *recv, int ip) {
  long wrong = 0;
  size_t n = c->checked(r);
  /* scatter in place: the root's block stays in its send buffer */
  size_t offset = (ip && c->call == c_scatter && r->rank == r->root) ? r->rank * r->count : 0;
  for (size_t i = 0; i < n; i++) {
    double want;
    if (!c->expect(r, i, &want)) return 0;
    if (!same(r->t, recv, offset + i, want)) wrong++;
  }
  return wrong;
}

/* ---- output ---- */

/* A number in `width` columns with as many decimals as fit. */
static void fmt_num(char *out, size_t cap, double v, int width) {
  int digits = 1;
  for (double p = 10; v >= p && digits < 30; p *= 10) digits++;
  if (digits <= width - 3) snprintf(out, cap, "%*.2f", width, v);
  else if (digits <= width - 2) snprintf(out, cap, "%*.1f", width, v);
  else if (digits <= width) snprintf(out, cap, "%*.0f", width, v);
  else snprintf(out, cap, "%*.1e", width, v);
}

static size_t parse_size(const char *s, int *ok) {
  char *end;
  double v = strtod(s, &end);
  double mult = 1;
  switch (*end) {
    case 'K': case 'k': mult = 1024.0; end++; break;
    case 'M': case 'm': mult = 1024.0 * 1024; end++; break;
    case 'G': case 'g': mult = 1024.0 * 1024 * 1024; end++; break;
    default: break;
  }
  if (*end == 'B' || *end == 'b') end++;
  *ok = end != s && *end == 0 && v >= 0;
  return (size_t)(v * mult);
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: mpirun -np N mpi_perf COLL [flags]\n"
          "  COLL: all_reduce all_gather reduce_scatter alltoall broadcast reduce gather scatter sendrecv\n"
          "  -b,--minbytes SIZE (32M)  -e,--maxbytes SIZE (32M)  -i,--stepbytes SIZE (1M)  -f,--stepfactor F\n"
          "  -n,--iters N (20)  -w,--warmup_iters N (5)  -c,--check 0|1 (1)  -a,--average 0|1|2|3 (1)\n"
          "  -d,--datatype float|double|int32|int64|uint8|int8|uint32|uint64 (float)\n"
          "  -o,--op sum|prod|max|min (sum)  -r,--root R (0)\n"
          "  SIZE takes K, M, G suffixes (powers of 1024).\n");
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  struct run r = {0};
  MPI_Comm_rank(MPI_COMM_WORLD, &r.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &r.nranks);
  const MPI_Op ops[] = {MPI_SUM, MPI_PROD, MPI_MAX, MPI_MIN};
  int me = r.rank;
#define FAIL(...)                                  \
  do {                                             \
    if (me == 0) fprintf(stderr, "mpi_perf: " __VA_ARGS__); \
    MPI_Finalize();                                \
    return 2;                                      \
  } while (0)

  size_t minb = 32 << 20, maxb = 32 << 20, stepb = 1 << 20, factor = 1;
  int iters = 20, warmup = 5, check = 1, average = 1, ok;
  const char *dtype = "float", *opname = "sum";
  static const struct option longs[] = {
      {"minbytes", 1, 0, 'b'}, {"maxbytes", 1, 0, 'e'}, {"stepbytes", 1, 0, 'i'},   {"stepfactor", 1, 0, 'f'},
      {"iters", 1, 0, 'n'},    {"warmup_iters", 1, 0, 'w'}, {"check", 1, 0, 'c'}, {"average", 1, 0, 'a'},
      {"datatype", 1, 0, 'd'}, {"op", 1, 0, 'o'},        {"root", 1, 0, 'r'},       {"help", 0, 0, 'h'},
      {0, 0, 0, 0}};
  opterr = 0;
  int ch;
  char *end;
  while ((ch = getopt_long(argc, argv, "b:e:i:f:n:w:c:a:d:o:r:h", longs, NULL)) != -1) {
    switch (ch) {
      case 'b': minb = parse_size(optarg, &ok); if (!ok) FAIL("-b %s: not a size\n", optarg); break;
      case 'e': maxb = parse_size(optarg, &ok); if (!ok) FAIL("-e %s: not a size\n", optarg); break;
      case 'i': stepb = parse_size(optarg, &ok); if (!ok || !stepb) FAIL("-i %s: not a positive size\n", optarg); break;
      case 'f': factor = strtoul(optarg, &end, 10); if (*end || !*optarg) FAIL("-f %s: not a number\n", optarg); break;
      case 'n': iters = (int)strtol(optarg, &end, 10); if (*end || iters < 1) FAIL("-n %s: need a count >= 1\n", optarg); break;
      case 'w': warmup = (int)strtol(optarg, &end, 10); if (*end || warmup < 0) FAIL("-w %s: need a count >= 0\n", optarg); break;
      case 'c': check = (int)strtol(optarg, &end, 10); if (*end) FAIL("-c %s: not a number\n", optarg); break;
      case 'a': average = (int)strtol(optarg, &end, 10); if (*end || average < 0 || average > 3) FAIL("-a %s: use 0, 1, 2 or 3\n", optarg); break;
      case 'd': dtype = optarg; break;
      case 'o': opname = optarg; break;
      case 'r': r.root = (int)strtol(optarg, &end, 10); if (*end || r.root < 0 || r.root >= r.nranks) FAIL("-r %s: root must be 0..%d\n", optarg, r.nranks - 1); break;
      case 'h': if (me == 0) usage(stdout); MPI_Finalize(); return 0;
      default:
        if (me == 0) {
          if (optopt) fprintf(stderr, "mpi_perf: -%c: unknown flag or missing value\n", optopt);
          else fprintf(stderr, "mpi_perf: %s: unknown flag or missing value\n", argv[optind - 1]);
          usage(stderr);
        }
        MPI_Finalize();
        return 2;
    }
  }
  if (optind != argc - 1) {
    if (me == 0) usage(stderr);
    FAIL("give exactly one collective\n");
  }
  const struct coll *c = NULL;
  for (size_t k = 0; k < NCOLLS; k++)
    if (!strcmp(argv[optind], COLLS[k].name) ||
        (!strncmp(argv[optind], COLLS[k].name, strlen(COLLS[k].name)) && !strcmp(argv[optind] + strlen(COLLS[k].name), "_perf")))
      c = &COLLS[k];
  if (!c) FAIL("unknown collective %s (all_reduce all_gather reduce_scatter alltoall broadcast reduce gather scatter sendrecv)\n", argv[optind]);
  for (size_t k = 0; k < sizeof DTYPES / sizeof DTYPES[0]; k++)
    if (!strcmp(dtype, DTYPES[k].name)) r.t = &DTYPES[k];
  if (!r.t) FAIL("-d %s: use float double int32 int64 uint8 int8 uint32 uint64\n", dtype);
  int opi = -1;
  for (int k = 0; k < 4; k++)
    if (!strcmp(opname, OP_NAMES[k])) opi = k;
  if (opi < 0) FAIL("-o %s: use sum prod max min\n", opname);
  r.op = (enum op)opi;
  r.mpi_op = ops[opi];
  if (minb > maxb) FAIL("-b %zu is above -e %zu\n", minb, maxb);
  if (maxb / r.t->size > (size_t)INT_MAX) FAIL("-e %zu: over INT_MAX elements, more than an MPI count holds\n", maxb);

  size_t cap = maxb / r.t->size + 1;
  char *send = malloc(cap * r.t->size), *recv = malloc(cap * r.t->size);
  if (!send || !recv) FAIL("cannot allocate 2 x %zu bytes\n", cap * r.t->size);
  memset(send, 0, cap * r.t->size);
  memset(recv, 0, cap * r.t->size);

  if (me == 0) {
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len;
    MPI_Get_library_version(lib, &len);
    char *nl = strchr(lib, '\n');
    if (nl) *nl = 0;
    nl = strchr(lib, ',');
    if (nl) *nl = 0;
    printf("# mpi_perf %s: %s\n", c->name, lib);
    printf("# nranks %d minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d validation: %d average: %d\n",
           r.nranks, minb, maxb, factor > 1 ? factor : stepb, factor > 1 ? "factor" : "bytes", warmup, iters, check,
           average);
  }
  {
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    char line[512];
    snprintf(line, sizeof line, "#  Rank %2d Pid %6d on %10s", me, (int)getpid(), host);
    char *all = me == 0 ? malloc(512 * (size_t)r.nranks) : NULL;
    MPI_Gather(line, 512, MPI_CHAR, all, 512, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (me == 0) {
      printf("#\n");
      for (int p = 0; p < r.nranks; p++) printf("%s\n", all + 512 * (size_t)p);
      free(all);
    }
  }
  if (me == 0) {
    printf("#\n# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n", "", "", "",
           "", "");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "size", "count", "type", "redop",
           "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "(B)", "(elements)", "", "", "",
           "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
    fflush(stdout);
  }

  double bus_sum = 0;
  int bus_n = 0;
  long wrong_total = 0;
  for (size_t size = minb; size <= maxb;) {
    size_t n = size / r.t->size;
    r.count = c->shape == SPLIT ? n / r.nranks : n;
    size_t ns, nr;
    c->lengths(&r, &ns, &nr);
    if (me == 0)
      printf("%12zu  %12zu  %8s  %6s  %6d", (ns > nr ? ns : nr) * r.t->size, r.count, r.t->name,
             c->reduces ? OP_NAMES[r.op] : "none", c->rooted ? r.root : -1);
    /* Like nccl-tests (and oxccl-perf), iteration k works at offset
       total * (k % steps) of buffers -e bytes long, so a sweep up to -e
       cycles through the same memory on every peer. */
    size_t total = (ns > nr ? ns : nr) * r.t->size, steps = total ? maxb / total : 1;
    if (steps < 1) steps = 1;
    for (int ip = 0; ip < 2; ip++) {
      prepare(c, &r, send, recv, ip);
      for (int k = 0; k < warmup; k++) {
        size_t at = total * ((size_t)k % steps);
        c->call(&r, send + at, recv + at, ip);
      }
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      for (int k = 0; k < iters; k++) {
        size_t at = total * ((size_t)k % steps);
        c->call(&r, send + at, recv + at, ip);
      }
      double mine = (MPI_Wtime() - t0) / iters, t;
      if (average == 0) {
        t = mine;
        MPI_Bcast(&t, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
      } else {
        MPI_Allreduce(&mine, &t, 1, MPI_DOUBLE, average == 1 ? MPI_SUM : average == 2 ? MPI_MIN : MPI_MAX,
                      MPI_COMM_WORLD);
        if (average == 1) t /= r.nranks;
      }
      long wrong = 0, wrong_all = 0;
      if (check) {
        prepare(c, &r, send, recv, ip);
        c->call(&r, send, recv, ip);
        wrong = count_wrong(c, &r, recv, ip);
        MPI_Allreduce(&wrong, &wrong_all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        wrong_total += wrong_all;
      }
      double bytes = (double)r.count * r.t->size * (c->shape == SPLIT ? r.nranks : 1);
      double alg = t > 0 ? bytes / 1e9 / t : 0, bus = alg * c->busfactor(r.nranks);
      bus_sum += bus;
      bus_n++;
      if (me == 0) {
        char ts[32], as[32], bs[32];
        fmt_num(ts, sizeof ts, t * 1e6, 7);
        fmt_num(as, sizeof as, alg, 6);
        fmt_num(bs, sizeof bs, bus, 6);
        if (check) printf("  %7s  %6s  %6s  %6ld", ts, as, bs, wrong_all);
        else printf("  %7s  %6s  %6s  %6s", ts, as, bs, "N/A");
      }
    }
    if (me == 0) {
      printf("\n");
      fflush(stdout);
    }
    if (factor > 1) {
      if (size == 0 || size > maxb / factor) break;
      size *= factor;
    } else {
      if (size > maxb - stepb) break;
      size += stepb;
    }
  }
  if (me == 0) {
    printf("# %-20s : %ld %s\n", "Out of bounds values", wrong_total, wrong_total ? "FAILED" : "OK");
    printf("# %-20s : %g\n#\n", "Avg bus bandwidth", bus_n ? bus_sum / bus_n : 0.0);
  }
  free(send);
  free(recv);
  MPI_Finalize();
  return wrong_total ? 1 : 0;
}
