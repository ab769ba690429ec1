//! nccl-tests' `all_reduce_perf` on oxccl.

fn main() {
    oxccl_perf::main(oxccl_perf::CollKind::AllReduce)
}
