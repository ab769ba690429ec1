//! The native half of the `oxccl` Python package (`oxccl._oxccl`).
//!
//! Python resolves its objects (numpy arrays, torch tensors, anything with
//! the buffer protocol, DLPack or `__cuda_array_interface__`) to addresses
//! and byte lengths and keeps them alive; this module checks the calls,
//! runs them with the GIL released and turns oxccl's errors into the
//! package's exceptions. It trades only in integers and strings, so one
//! abi3 wheel serves every CPython from 3.9.
//!
//! The Python side is the public API (`python/oxccl`); nothing here is
//! meant to be called directly.

#![allow(unsafe_code)]

mod algo;
mod comm;
mod errors;
mod interrupt;
mod ops;

use pyo3::prelude::*;

/// The module.
#[pymodule]
fn _oxccl(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<comm::Comm>()?;
    m.add_function(wrap_pyfunction!(comm::unique_id, m)?)?;
    m.add_function(wrap_pyfunction!(comm::codes, m)?)?;
    m.add_function(wrap_pyfunction!(algo::verify, m)?)?;
    m.add_function(wrap_pyfunction!(algo::simulate, m)?)?;
    m.add_function(wrap_pyfunction!(algo::register, m)?)?;
    m.add_function(wrap_pyfunction!(algo::build, m)?)?;
    m.add_function(wrap_pyfunction!(algo::listing, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
