//! # oxccl
//!
//! Collective communication on host memory: ranks that are threads of one
//! process, processes on one host (shared memory) and processes on
//! different hosts (TCP), with NCCL's collectives and semantics.
//!
//! ```no_run
//! use oxccl::{Communicator, ReduceOp};
//! // Four ranks as threads of this process (NCCL's ncclCommInitAll).
//! let comms = Communicator::init_threads(4).unwrap();
//! std::thread::scope(|s| {
//!     for c in &comms {
//!         s.spawn(move || {
//!             let send = vec![c.rank() as f32; 1024];
//!             let mut recv = vec![0.0f32; 1024];
//!             c.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
//!             assert_eq!(recv[0], 6.0);
//!         });
//!     }
//! });
//! ```
//!
//! Processes join with [`Communicator::init`] and a [`UniqueId`] that rank
//! 0 created and passed on (its hex form travels in environment variables
//! and files), or with [`Communicator::from_env`] under torchrun, mpirun,
//! PMI or Slurm.
//!
//! ## How a call runs
//! Every call is one or more operations ([`Op`]: a collective, a send or a
//! receive, on host or device [`Buffer`]s), checked once when made (an
//! error changes nothing) and run by [`Communicator::launch`], the one
//! entry point of the typed methods, [`Group`]s, the C ABI and the Python
//! package. The launch routes each operation by its memory: host ones to
//! the host executor, device ones to the device path on the caller's
//! stream. For host memory it picks an algorithm or a researcher's program
//! ([`tuner`], [`programs`]) and takes this rank's part of its program;
//! the executor runs it over the transports of oxccl-transport, calls in
//! the order they were made. A blocking call that finds nothing queued
//! ahead of it runs on the calling thread; otherwise, and for `*_async`
//! methods (which take owned storage and return a [`Work`] that hands it
//! back), the communicator's progress thread runs it, and it also pushes
//! out bytes a call left queued. [`Communicator::group`] launches matched
//! sends and receives together.
//!
//! ## Researchers' programs
//! A JSON program of oxccl-algo's IR, verified when loaded, runs like a
//! built-in algorithm at any count ([`programs`]; `OXCCL_ALGO_FILE`).
//!
//! ## Device buffers
//! With the `cuda` feature (default), operations on [`DeviceBuf`]s
//! ([`Communicator::collective_device`], [`Group::collective_device`],
//! [`Group::send_device`] …, or [`Op`]s through a launch) run on GPU
//! buffers, enqueued on the caller's CUDA stream: kernels over the peers'
//! memory (CUDA IPC) on one host, staged through host memory otherwise
//! ([`device`]). A launch may mix host and device operations.
//!
//! ## Failure
//! Every wait has a deadline (`OXCCL_TIMEOUT`, 300 s). A dead peer is an
//! error naming it on every rank within seconds; the communicator is then
//! poisoned ([`Communicator::async_error`]) and must be dropped.
//!
//! ## Thread safety
//! `Communicator` is `Send + Sync`. All ranks must issue collectives in
//! the same order.

#[cfg(test)]
mod alloc_count;
mod buf;
pub mod call;
mod check;
mod colls;
mod comm;
pub mod config;
pub mod device;
mod device_api;
mod engine;
mod exec;
mod group;
mod host;
mod job;
mod launch;
pub mod op;
mod plan;
pub mod programs;
mod replay;
mod split;
mod topology;
pub mod tuner;

pub use buf::{Buffer, CudaStream, DeviceBuf, Memory, Span};
pub use call::{Call, Spec};
pub use colls::Work;
pub use comm::{Aborter, Communicator};
pub use config::{Config, DeviceExec, DevicePath, SingleCopy, unique_id};
pub use group::Group;
/// The `half` crate oxccl's `f16`/`bf16` element types come from, so users
/// name them without guessing its version (`oxccl::half::bf16`).
pub use half;
pub use op::{Blocks, Op, P2p};
pub use oxccl_algo::collective::CollKind;
pub use oxccl_algo::ir::Program;
pub use oxccl_core::{DataType, Element, Error, ReduceOp, Result};
pub use oxccl_transport::id::UniqueId;
pub use oxccl_transport::region::Region;
pub use oxccl_transport::{Kind, PeerStats};
pub use programs::ProgramId;
pub use split::{Launch, with_launch_secret};
pub use tuner::Choice;
