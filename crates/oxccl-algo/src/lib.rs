//! # oxccl-algo
//!
//! Collective algorithms as data. An algorithm is a function from a
//! [`Collective`] to a [`Program`]: for every rank, channels of steps over
//! slices of its input, output and scratch buffers, in NCCL's primitive
//! vocabulary (send, recv, recv-reduce-send …) plus one-sided put, get,
//! signal and wait. Programs serialize to JSON, so a hand-written one goes
//! through everything below like a generated one.
//!
//! - [`algos`]: ring, double binary tree, recursive halving/doubling,
//!   direct one-sided access (one-shot/two-shot all-reduce and every other
//!   collective), pipelined chain and binary tree for rooted collectives,
//!   pairwise all-to-all, linear gather/scatter, send/recv.
//! - [`channels`]: a program cut by data into parts on channels of their
//!   own, which run concurrently.
//! - [`placement`]: which ranks share a host; rings that follow the
//!   hosts and the hierarchical algorithms are built on one.
//! - [`verify`]: executes a program symbolically for all ranks, over
//!   intervals, and proves it computes its collective (every output element
//!   holds each required contribution exactly once), never deadlocks under
//!   bounded buffering, and has no data race on one-sided accesses; returns
//!   bytes sent and received per rank.
//! - [`canon`]: the canonical reduction order of the deterministic mode,
//!   which the verifier proves programs follow.
//! - [`cost`] and [`sim`]: an alpha-beta-gamma model over a topology and a
//!   simulator that prices a program with link contention.
//! - [`interp`]: runs a program on real data in one thread, with the host
//!   kernels: the bits it produces.
//! - [`scale`]: one program at every count (each element a contiguous
//!   piece), with the argument why verification carries over.
//! - [`exact`]: inputs every reduction order reduces bit for bit, and the
//!   reference to check any rank's output against.
//!
//! ```
//! use oxccl_algo::{algos::{build, Algorithm}, verify::verify, CollKind, Collective};
//! let coll = Collective::new(CollKind::AllReduce, 4, 1000);
//! let program = build(Algorithm::Ring, &coll, &Default::default()).unwrap();
//! let report = verify(&program).unwrap();
//! assert_eq!(report.sent_bytes[0], 2 * 3 * 250 * 4); // 2(n-1)/n · S
//! ```
//!
//! No I/O, no clocks, no `unsafe`: everything here is deterministic and
//! `Send + Sync`.

pub mod algos;
pub mod canon;
pub mod channels;
pub mod collective;
pub mod cost;
pub mod exact;
pub mod interp;
pub mod ir;
pub mod placement;
pub mod scale;
pub mod sim;
pub mod verify;

pub use collective::{CollKind, Collective};
pub use ir::{Buf, Program, RankProgram, Slice, Step};
