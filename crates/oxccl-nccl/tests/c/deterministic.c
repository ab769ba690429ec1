/* The deterministic mode through the C ABI (OXCCL_DETERMINISTIC, read from
 * the environment): 3 ranks (ncclCommInitAll) all-reduce 1, 1e8 and -1e8 in
 * float at every element. The canonical order, (x0 + x1) + x2, gives 0
 * everywhere; an order that adds x1 + x2 first gives 1.
 *   deterministic canon     expects 0 at every element of every rank
 *   deterministic differs   expects some element that is not 0 (no mode)
 *   deterministic refused   expects the all-reduce to fail naming the mode */
#include "common.h"

#define N 3
#define COUNT 3000

int main(int argc, char** argv) {
  if (argc < 2) return 1;
  ncclComm_t c[N];
  CHECK(ncclCommInitAll(c, N, NULL));
  static float x[N][COUNT], y[N][COUNT];
  const float v[N] = {1.0f, 1e8f, -1e8f};
  for (int r = 0; r < N; r++)
    for (int i = 0; i < COUNT; i++) x[r][i] = v[r];
  CHECK(ncclGroupStart());
  for (int r = 0; r < N; r++) CHECK(ncclAllReduce(x[r], y[r], COUNT, ncclFloat, ncclSum, c[r], NULL));
  ncclResult_t res = ncclGroupEnd();
  if (!strcmp(argv[1], "refused")) {
    EXPECT(res != ncclSuccess, "the all-reduce ran");
    EXPECT(strstr(ncclGetLastError(NULL), "OXCCL_DETERMINISTIC=1"), "last error \"%s\"", ncclGetLastError(NULL));
  } else {
    CHECK(res);
    int nonzero = 0;
    for (int r = 0; r < N; r++)
      for (int i = 0; i < COUNT; i++) nonzero += y[r][i] != 0.0f;
    if (!strcmp(argv[1], "canon")) EXPECT(nonzero == 0, "%d elements are not 0", nonzero);
    else EXPECT(nonzero > 0, "every element is 0: the order did not matter");
  }
  for (int r = 0; r < N; r++) ncclCommDestroy(c[r]);
  printf("PASS\n");
  return 0;
}
