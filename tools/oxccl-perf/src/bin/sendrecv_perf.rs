//! nccl-tests' `sendrecv_perf` on oxccl.

fn main() {
    oxccl_perf::main(oxccl_perf::CollKind::SendRecv)
}
