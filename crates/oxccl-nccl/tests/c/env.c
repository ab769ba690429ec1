/* Makes a 2-rank communicator (ncclCommInitAll) and all-reduces once:
 *   env ok          expects success
 *   env fail TEXT   expects init to fail with TEXT in ncclGetLastError
 * The NCCL_* variables under test come from the environment. */
#include "common.h"

int main(int argc, char** argv) {
  if (argc < 2) return 1;
  ncclComm_t c[2];
  ncclResult_t r = ncclCommInitAll(c, 2, NULL);
  if (!strcmp(argv[1], "fail")) {
    EXPECT(r != ncclSuccess, "init succeeded");
    EXPECT(argc == 3 && strstr(ncclGetLastError(NULL), argv[2]), "last error \"%s\"", ncclGetLastError(NULL));
    printf("PASS\n");
    return 0;
  }
  CHECK(r);
  float x[4] = {1, 2, 3, 4}, y[2][4];
  CHECK(ncclGroupStart());
  for (int j = 0; j < 2; j++) CHECK(ncclAllReduce(x, y[j], 4, ncclFloat, ncclSum, c[j], NULL));
  CHECK(ncclGroupEnd());
  EXPECT(y[1][3] == 8, "all-reduce gave %g", y[1][3]);
  for (int j = 0; j < 2; j++) CHECK(ncclCommDestroy(c[j]));
  printf("PASS\n");
  return 0;
}
