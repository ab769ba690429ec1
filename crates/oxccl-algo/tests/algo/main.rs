//! The integration tests of oxccl-algo, one binary: every algorithm verified
//! over the matrix of collectives, rank counts, sizes and roots; programs at any
//! size, channels, the canonical order, the interpreter, JSON programs, the
//! verifier's rejections, snapshots, the cost model's table and the simulator.

mod canonical;
mod channels;
mod common;
mod interp;
mod json;
mod matrix;
mod props;
mod reject;
mod scale;
mod sim;
mod snapshots;
mod table;
mod topology;
