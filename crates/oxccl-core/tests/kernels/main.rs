//! The integration tests of oxccl-core, one binary: the host kernels against an
//! independent reference, their errors, property tests, and FP8 conversions.

#[macro_use]
mod common;
mod fp8;
mod kernel_errors;
mod kernel_props;
mod kernels;
