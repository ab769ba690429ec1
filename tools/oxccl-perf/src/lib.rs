//! oxccl-perf: nccl-tests' benchmarks (`all_reduce_perf` and friends) on
//! oxccl communicators, with ranks as threads (`-t`) or as processes under
//! a launcher (`oxccl-run`, `mpirun`, `torchrun`, `srun`).
