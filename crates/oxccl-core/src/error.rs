//! The one error type of the workspace.

use thiserror::Error as ThisError;

/// Result with the workspace's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in oxccl, as a value.
///
/// Messages name what was wrong (rank, peer, operation, size) and, where
/// there is one, the remedy. The variants mirror NCCL's result codes so the
/// C ABI maps them one to one (see [`Error::nccl_code`]).
#[derive(Debug, ThisError, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// A caller passed an argument that is wrong (`ncclInvalidArgument`).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A call made in the wrong state (`ncclInvalidUsage`).
    #[error("invalid usage: {0}")]
    InvalidUsage(String),
    /// A collective program is not correct: the verifier's finding, naming
    /// the rank, the step and what is wrong.
    #[error("invalid program: {0}")]
    InvalidProgram(String),
    /// The system refused something: a socket, a mapping, a file
    /// (`ncclSystemError`).
    #[error("system error: {0}")]
    System(String),
    /// A peer failed, vanished or sent something unexpected
    /// (`ncclRemoteError`).
    #[error("remote error: {0}")]
    Remote(String),
    /// A wait passed its deadline.
    #[error("timed out: {0}")]
    Timeout(String),
    /// A feature the build or the machine does not have (no CUDA, no verbs).
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// A broken invariant inside oxccl (`ncclInternalError`).
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// An [`Error::InvalidArgument`] with this message.
    pub fn invalid(msg: impl Into<String>) -> Error {
        Error::InvalidArgument(msg.into())
    }

    /// An [`Error::InvalidProgram`] with this message.
    pub fn program(msg: impl Into<String>) -> Error {
        Error::InvalidProgram(msg.into())
    }

    /// NCCL's `ncclResult_t` for this error (`ncclSystemError` = 2,
    /// `ncclInternalError` = 3, `ncclInvalidArgument` = 4,
    /// `ncclInvalidUsage` = 5, `ncclRemoteError` = 6, `ncclTimeout` = 8,
    /// which NCCL's API has since 2.30).
    pub fn nccl_code(&self) -> i32 {
        match self {
            Error::Timeout(_) => 8,
            Error::System(_) => 2,
            Error::Internal(_) => 3,
            Error::InvalidArgument(_) | Error::InvalidProgram(_) => 4,
            Error::InvalidUsage(_) | Error::Unavailable(_) => 5,
            Error::Remote(_) => 6,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_and_codes() {
        let e = Error::invalid("rank 3: count 7 exceeds buffer of 6 elements");
        assert_eq!(e.to_string(), "invalid argument: rank 3: count 7 exceeds buffer of 6 elements");
        assert_eq!(e.nccl_code(), 4);
        assert_eq!(Error::Remote("peer 2 closed".into()).nccl_code(), 6);
        assert_eq!(Error::Timeout("rank 1 waited 5 s".into()).nccl_code(), 8);
    }
}
