//! # oxccl-nccl: NCCL's C ABI on oxccl (`libnccl.so.2`)
//!
//! A drop-in `libnccl.so.2` with NCCL 2.32.3's API (`include/nccl.h`: its
//! names, enum values and struct layouts) whose calls run on oxccl: on GPU
//! buffers through oxccl's device path, enqueued on the caller's stream,
//! and, beyond NCCL, on host memory, where a call runs on the calling
//! thread and returns when it is done (its stream must be NULL).
//!
//! ## Quick start
//! ```text
//! cargo build --release -p oxccl-nccl        # target/release/libnccl.so.2
//! gcc app.c -I crates/oxccl-nccl/include -L target/release -l:libnccl.so.2 -o app
//! LD_PRELOAD=target/release/libnccl.so.2 python train.py   # under an NCCL client
//! ```
//!
//! ## Boundary rules
//! - Every exported function goes through one guard ([`error::guard`]): a
//!   panic is caught (`ncclInternalError`), an error becomes its code and
//!   this thread's `ncclGetLastError` text, naming the function and the
//!   argument.
//! - Handles are numbers looked up in a registry ([`handle`]), so a
//!   destroyed or invented `ncclComm_t` is refused, never dereferenced.
//! - Every function has its `pnccl*` twin, as NCCL exports them.
//! - `NCCL_DEBUG`, `NCCL_DEBUG_FILE`, `NCCL_ALGO`, `NCCL_SOCKET_IFNAME`,
//!   `NCCL_BUFFSIZE` and `NCCL_COMM_ID` are read where their `OXCCL_*`
//!   twin is unset; `NCCL_PROTO` and `NCCL_MULTI_RANK_GPU_ENABLE` are
//!   accepted.
//!
//! ## Thread safety
//! Handles may be used from any thread; calls on one communicator are
//! serialised. Groups belong to the calling thread and may span
//! communicators.
//!
//! ## What it owns
//! The communicators behind its handles (until `ncclCommDestroy` or
//! `ncclCommAbort`), user reduction operators, registration records, and
//! host memory from `ncclMemAlloc` where there is no GPU.
#![allow(unsafe_code, non_snake_case)]

pub mod abi;
pub mod coll;
pub mod error;
pub mod group;
pub mod handle;
pub mod scalar;

mod api;

/// The exported functions, for Rust callers that link this crate (its
/// benches and tests): C programs call them by their symbols.
pub mod api_for_benches {
    pub use crate::api::colls::{ncclAllReduce, ncclGroupEnd, ncclGroupStart, ncclRecv, ncclSend};
    pub use crate::api::comms::{ncclCommDestroy, ncclCommInitAll, ncclGetLastError, ncclGetVersion};
}

/// Defines exported C functions that return `ncclResult_t`, each with its
/// `pnccl*` twin, their bodies run inside [`error::guard`].
macro_rules! nccl_api {
    ($( $(#[$m:meta])* fn $name:ident / $pname:ident ( $($arg:ident : $ty:ty),* $(,)? ) $body:block )*) => { $(
        $(#[$m])*
        ///
        /// # Safety
        /// NCCL's contract for this function's pointers and handles.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $crate::error::NcclResult {
            $crate::error::guard(stringify!($name), || $body)
        }

        #[doc = concat!("[`", stringify!($name), "`] under its profiling name.")]
        ///
        /// # Safety
        /// As the function it forwards to.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $pname($($arg: $ty),*) -> $crate::error::NcclResult {
            // SAFETY: the caller keeps the contract of the function forwarded to.
            unsafe { $name($($arg),*) }
        }
    )* };
}
pub(crate) use nccl_api;

/// Once per process, at the first call: NCCL's variable names are honoured
/// and `NCCL_DEBUG=VERSION` prints the version line.
pub(crate) fn setup() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        oxccl::config::honour_nccl_names();
        oxccl::config::init_logging();
        oxccl::config::announce(&format!(
            "NCCL version 2.32.3 (oxccl {}: NCCL's API on oxccl)",
            env!("CARGO_PKG_VERSION")
        ));
        if let Ok(p) = std::env::var("NCCL_PROTO") {
            let others: Vec<&str> =
                p.split(',').map(str::trim).filter(|s| !s.is_empty() && !s.eq_ignore_ascii_case("simple")).collect();
            if !others.is_empty() {
                tracing::warn!("NCCL_PROTO={p:?}: oxccl has one protocol (like NCCL's Simple); {others:?} ignored");
            }
        }
    });
}
