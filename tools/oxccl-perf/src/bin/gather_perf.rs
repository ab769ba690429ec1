//! nccl-tests' `gather_perf` on oxccl.

fn main() {
    oxccl_perf::main(oxccl_perf::CollKind::Gather)
}
