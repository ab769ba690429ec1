//! The integration tests of oxccl-perf, one binary: nccl-tests' flags and
//! output, ranks as threads and as processes (every collective checked), and
//! the oxccl-run launcher.

mod cli;
mod common;
mod oxccl_run;
mod procs;
mod threads;
