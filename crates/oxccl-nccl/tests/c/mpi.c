/* The way many codes bootstrap NCCL: MPI broadcasts rank 0's ncclUniqueId,
 * then every rank joins and runs collectives through NCCL's API (here on
 * host memory). Run under mpirun; prints "PASS" on rank 0. */
#include <mpi.h>

#include "common.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  ncclUniqueId id;
  if (rank == 0) CHECK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, n, id, rank));
  enum { C = 1000 };
  double in[C], out[C], all[64 * C];
  for (int i = 0; i < C; i++) in[i] = rank + i;
  CHECK(ncclAllReduce(in, out, C, ncclDouble, ncclSum, comm, NULL));
  for (int i = 0; i < C; i++) EXPECT(out[i] == n * (n - 1) / 2.0 + (double)n * i, "all-reduce element %d", i);
  CHECK(ncclAllGather(in, all, C, ncclDouble, comm, NULL));
  for (int j = 0; j < n; j++)
    for (int i = 0; i < C; i++) EXPECT(all[j * C + i] == j + i, "all-gather block %d element %d", j, i);
  /* The result agrees with MPI's own all-reduce. */
  double ref[C];
  MPI_Allreduce(in, ref, C, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  EXPECT(!memcmp(ref, out, sizeof ref), "NCCL API and MPI_Allreduce disagree");
  CHECK(ncclCommDestroy(comm));
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) printf("PASS %d ranks\n", n);
  MPI_Finalize();
  return 0;
}
