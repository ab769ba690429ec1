//! oxccl's errors as the package's exceptions (`oxccl.errors`): the class
//! says what kind of failure it is, the message is oxccl's own.

use oxccl::Error;
use pyo3::prelude::*;

/// The exception of `oxccl.errors` for `e`, carrying its message.
pub fn to_py(e: Error) -> PyErr {
    let class = match &e {
        Error::InvalidArgument(_) => "InvalidArgument",
        Error::InvalidUsage(_) => "InvalidUsage",
        Error::InvalidProgram(_) => "InvalidProgram",
        Error::System(_) => "SystemFailure",
        Error::Remote(_) => "PeerError",
        Error::Timeout(_) => "Timeout",
        Error::Unavailable(_) => "Unavailable",
        _ => "InternalError",
    };
    let msg = e.to_string();
    Python::attach(|py| match py.import("oxccl.errors").and_then(|m| m.getattr(class)) {
        Ok(cls) => match cls.call1((msg.clone(),)) {
            Ok(obj) => PyErr::from_value(obj),
            Err(err) => err,
        },
        // Imported without its Python half: still an exception with the message.
        Err(_) => pyo3::exceptions::PyRuntimeError::new_err(msg),
    })
}

/// `Result<T, oxccl::Error>` into a Python result.
pub trait IntoPy<T> {
    /// The value, or the package's exception.
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for oxccl::Result<T> {
    fn py(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}
