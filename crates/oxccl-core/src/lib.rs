//! # oxccl-core
//!
//! The vocabulary every other oxccl crate speaks, with no I/O:
//!
//! - [`DataType`]: the twelve element types, numbered and named as NCCL and
//!   nccl-tests number and name them;
//! - [`ReduceOp`]: sum, prod, max, min, avg and pre-multiplied sum;
//! - [`Error`]: the one error type of the workspace;
//! - [`kernels`]: host reduction kernels for every type × op, on byte
//!   buffers or typed slices, and the FP8 element types [`F8E4M3`] and
//!   [`F8E5M2`].
//!
//! ```
//! use oxccl_core::{DataType, ReduceOp};
//! let t: DataType = "bfloat16".parse().unwrap();
//! assert_eq!((t.size(), t.to_nccl()), (2, 9));
//! assert_eq!(ReduceOp::Max.to_nccl(), 2);
//! ```
//!
//! Everything here is plain data or pure functions: `Send + Sync`, no
//! global state.

pub mod dtype;
pub mod error;
pub mod kernels;
pub mod op;

pub use dtype::DataType;
pub use error::{Error, Result};
pub use kernels::{Element, F8E4M3, F8E5M2};
pub use op::ReduceOp;
