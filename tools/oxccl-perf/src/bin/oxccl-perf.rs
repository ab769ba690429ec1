//! `oxccl-perf COLLECTIVE [options]`: any nccl-tests benchmark by name.

fn main() {
    oxccl_perf::main_named()
}
