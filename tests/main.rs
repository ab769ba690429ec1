//! oxccl's end-to-end tests, one binary (the GPU tests are device_gpu.rs,
//! their own binary, which tools/gpu-check packs): every collective on
//! ranks as threads and as processes over every transport, network
//! namespaces as hosts and rails, failures and mismatches, the
//! deterministic mode, byte counts against the verifier, researchers'
//! programs; and checks of the sources themselves (module structure,
//! messages, the workspace's layering and test layout).
//!
//! Ranks as processes are this binary started again: the ignored test
//! [`child`] is every rank's body (tests/kit/child.rs).

mod bytes;
mod deterministic;
mod failures;
mod layout;
mod messages;
mod mismatch;
mod modules;
mod procs;
mod programs;
mod rails;
mod rdma_faults;
mod threads;
mod topology;
mod workspace_deps;

use oxccl_e2e::child;

/// A rank's body, started by the process tests of every module
/// (`oxccl_e2e::child::spawn`) and told what to do by `OXCCL_TEST_MODE`.
#[test]
#[ignore = "a rank's body, started by the process tests"]
fn child() {
    match child::rank_env() {
        Some((mode, id, rank, size)) if mode == "hand" => programs::hand_rank(&id, rank, size),
        _ => child::body(),
    }
}
