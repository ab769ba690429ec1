//! Result codes, the thread's last error, and the boundary every entry
//! point goes through: panics are caught there and never unwind into C.

use oxccl::Error;
use std::cell::RefCell;
use std::ffi::{CString, c_char};

/// NCCL's `ncclResult_t`.
pub type NcclResult = i32;

/// `ncclSuccess`.
pub const SUCCESS: NcclResult = 0;
/// `ncclUnhandledCudaError`.
pub const UNHANDLED_CUDA_ERROR: NcclResult = 1;
/// `ncclSystemError`.
pub const SYSTEM_ERROR: NcclResult = 2;
/// `ncclInternalError`.
pub const INTERNAL_ERROR: NcclResult = 3;
/// `ncclInvalidArgument`.
pub const INVALID_ARGUMENT: NcclResult = 4;
/// `ncclInvalidUsage`.
pub const INVALID_USAGE: NcclResult = 5;
/// `ncclRemoteError`.
pub const REMOTE_ERROR: NcclResult = 6;
/// `ncclInProgress`.
pub const IN_PROGRESS: NcclResult = 7;
/// `ncclTimeout`.
pub const TIMEOUT: NcclResult = 8;
/// `ncclNumResults`.
pub const NUM_RESULTS: NcclResult = 9;

/// The text for each code (`ncclGetErrorString`), NUL-terminated: NCCL's,
/// with hints that hold here. NCCL's "run with NCCL_DEBUG=WARN for
/// details" would add nothing: WARN is oxccl's default level, and the
/// failed call's message is already logged at it. The details are in
/// `ncclGetLastError`; INFO adds how the communicator was set up.
pub fn code_text(code: NcclResult) -> &'static [u8] {
    match code {
        SUCCESS => b"no error\0",
        UNHANDLED_CUDA_ERROR => {
            b"unhandled cuda error (ncclGetLastError() says which call failed; NCCL_DEBUG=INFO also logs the \
              device set-up)\0"
        }
        SYSTEM_ERROR => {
            b"unhandled system error (ncclGetLastError() says what failed; NCCL_DEBUG=INFO also logs the \
              transports' set-up)\0"
        }
        INTERNAL_ERROR => b"internal error - please report this issue to the oxccl developers\0",
        INVALID_ARGUMENT => b"invalid argument (ncclGetLastError() says which and why)\0",
        INVALID_USAGE => b"invalid usage (ncclGetLastError() says what was wrong)\0",
        REMOTE_ERROR => b"remote process exited or there was a network error\0",
        IN_PROGRESS => b"NCCL operation in progress\0",
        TIMEOUT => b"operation timed out\0",
        _ => b"unknown result code\0",
    }
}

/// The code an oxccl error is reported as.
pub fn code_of(e: &Error) -> NcclResult {
    e.nccl_code()
}

thread_local! {
    /// The last error message of this thread (`ncclGetLastError`).
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `msg` as this thread's last error (and logs it at WARN, as
/// NCCL does).
pub fn set_last(msg: &str) {
    tracing::warn!("{msg}");
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST.with(|l| *l.borrow_mut() = c);
}

/// This thread's last error message; valid until the thread's next failed
/// call.
pub fn last() -> *const c_char {
    LAST.with(|l| l.borrow().as_ptr())
}

/// What an entry point's body returns: `()` for success, or a code
/// (`ncclInProgress`).
pub trait Code {
    /// The code to return.
    fn code(self) -> NcclResult;
}

impl Code for () {
    fn code(self) -> NcclResult {
        SUCCESS
    }
}

impl Code for NcclResult {
    fn code(self) -> NcclResult {
        self
    }
}

/// Runs an entry point's body: an error becomes its code and the thread's
/// last error (prefixed with the function's name); a panic becomes
/// `ncclInternalError` and never crosses into C.
pub fn guard<R: Code>(func: &str, body: impl FnOnce() -> oxccl::Result<R>) -> NcclResult {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(r)) => r.code(),
        Ok(Err(e)) => {
            set_last(&format!("{func}: {e}"));
            // A failed call fails the group it was made in (its peers
            // must not be left waiting for it).
            crate::group::fail(&e);
            code_of(&e)
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            let msg = format!("{func}: internal error: {what} (please report this to the oxccl developers)");
            set_last(&msg);
            crate::group::fail(&Error::Internal(msg));
            INTERNAL_ERROR
        }
    }
}
