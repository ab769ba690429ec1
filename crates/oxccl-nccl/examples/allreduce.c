/* NCCL's API on host memory: 4 ranks as threads of this process, one
 * thread driving them in a group, as nccl-tests' -g does.
 *   gcc allreduce.c -I ../include -L <dir of libnccl.so.2> -l:libnccl.so.2 */
#include <stdio.h>

#include "nccl.h"

#define N 4

int main(void) {
  ncclComm_t comms[N];
  if (ncclCommInitAll(comms, N, NULL) != ncclSuccess) {
    fprintf(stderr, "init: %s\n", ncclGetLastError(NULL));
    return 1;
  }
  float send[N][1024], recv[N][1024];
  for (int r = 0; r < N; r++)
    for (int i = 0; i < 1024; i++) send[r][i] = (float)r;
  ncclGroupStart();
  for (int r = 0; r < N; r++) ncclAllReduce(send[r], recv[r], 1024, ncclFloat, ncclSum, comms[r], NULL);
  if (ncclGroupEnd() != ncclSuccess) {
    fprintf(stderr, "all-reduce: %s\n", ncclGetLastError(NULL));
    return 1;
  }
  printf("rank 3 holds %g (0+1+2+3 = 6)\n", recv[3][0]);
  for (int r = 0; r < N; r++) ncclCommDestroy(comms[r]);
  return recv[3][0] == 6.0f ? 0 : 1;
}
