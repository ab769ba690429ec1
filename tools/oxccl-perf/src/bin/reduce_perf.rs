//! nccl-tests' `reduce_perf` on oxccl.

fn main() {
    oxccl_perf::main(oxccl_perf::CollKind::Reduce)
}
