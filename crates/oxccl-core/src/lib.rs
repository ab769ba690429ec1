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
pub mod size;

pub use dtype::DataType;
pub use error::{Error, Result};
pub use kernels::{Element, F8E4M3, F8E5M2};
pub use op::ReduceOp;

#[doc(hidden)]
pub use half;

/// Runs `$body` with `$T` the [`Element`] type of the [`DataType`]
/// `$dtype`: `with_element_type!(dtype, T => sum::<T>(a, b))`.
#[macro_export]
macro_rules! with_element_type {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::DataType::Int8 => $crate::with_element_type!(@ i8, $T, $body),
            $crate::DataType::Uint8 => $crate::with_element_type!(@ u8, $T, $body),
            $crate::DataType::Int32 => $crate::with_element_type!(@ i32, $T, $body),
            $crate::DataType::Uint32 => $crate::with_element_type!(@ u32, $T, $body),
            $crate::DataType::Int64 => $crate::with_element_type!(@ i64, $T, $body),
            $crate::DataType::Uint64 => $crate::with_element_type!(@ u64, $T, $body),
            $crate::DataType::Float16 => $crate::with_element_type!(@ $crate::half::f16, $T, $body),
            $crate::DataType::Float32 => $crate::with_element_type!(@ f32, $T, $body),
            $crate::DataType::Float64 => $crate::with_element_type!(@ f64, $T, $body),
            $crate::DataType::Bfloat16 => $crate::with_element_type!(@ $crate::half::bf16, $T, $body),
            $crate::DataType::Float8E4M3 => $crate::with_element_type!(@ $crate::F8E4M3, $T, $body),
            $crate::DataType::Float8E5M2 => $crate::with_element_type!(@ $crate::F8E5M2, $T, $body),
        }
    };
    (@ $ty:ty, $T:ident, $body:expr) => {{
        type $T = $ty;
        $body
    }};
}
