//! Loading libibverbs at run time, NCCL's way.
//!
//! [`load`] `dlopen`s the library (`OXCCL_IBVERBS_LIB`, else
//! `libibverbs.so.1`) with `RTLD_NOW | RTLD_LOCAL` and resolves every call
//! with `dlvsym` at the symbol version whose ABI [`super::sys`] lays out:
//! `IBVERBS_1.1` for all of them, except `ibv_create_comp_channel` and
//! `ibv_destroy_comp_channel`, which exist only at `IBVERBS_1.0` (never
//! re-versioned). No call falls back to the 1.0 version of a symbol that
//! 1.1 re-versioned: those take the pre-1.1 structs and would corrupt
//! memory. Nothing links against libibverbs at build time.
//!
//! A library is loaded once per path and never closed (objects from it
//! live as long as the process may use them; NCCL does the same). A
//! missing library or symbol is an [`Unavailable`] value, not a panic.

use super::sys::*;
use super::{Unavailable, UnavailableKind};
use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::sync::{Mutex, OnceLock};

/// The library opened when no path is given.
pub const DEFAULT_LIB: &str = "libibverbs.so.1";

macro_rules! ibv_fns {
    ($($field:ident: $name:literal @ $ver:literal => fn($($arg:ty),*) $(-> $ret:ty)?;)*) => {
        /// The resolved entry points.
        pub(crate) struct Fns {
            $(pub(crate) $field: unsafe extern "C" fn($($arg),*) $(-> $ret)?,)*
        }

        /// Every symbol this backend resolves, with its version.
        pub(crate) const SYMBOLS: &[(&str, &str)] = &[$(($name, $ver)),*];

        impl Fns {
            /// Resolves every entry point.
            ///
            /// # Safety
            /// `handle` is a live `dlopen` handle of a libibverbs whose
            /// symbols at these versions have the signatures declared here
            /// (those of rdma-core's verbs.h).
            unsafe fn resolve(handle: *mut c_void, path: &str) -> Result<Fns, Unavailable> {
                Ok(Fns {
                    $($field: {
                        let p = sym(handle, $name, $ver, path)?;
                        // SAFETY: `p` is the non-null address of `$name` at
                        // `$ver`, whose C signature is the one declared
                        // (the caller's contract); a data pointer and an
                        // `extern "C"` function pointer have one size.
                        unsafe {
                            std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) $(-> $ret)?>(p)
                        }
                    },)*
                })
            }
        }
    };
}

ibv_fns! {
    fork_init: "ibv_fork_init" @ "IBVERBS_1.1" => fn() -> c_int;
    get_device_list: "ibv_get_device_list" @ "IBVERBS_1.1" => fn(*mut c_int) -> *mut *mut c_void;
    free_device_list: "ibv_free_device_list" @ "IBVERBS_1.1" => fn(*mut *mut c_void);
    get_device_name: "ibv_get_device_name" @ "IBVERBS_1.1" => fn(*mut c_void) -> *const c_char;
    open_device: "ibv_open_device" @ "IBVERBS_1.1" => fn(*mut c_void) -> *mut IbvContext;
    close_device: "ibv_close_device" @ "IBVERBS_1.1" => fn(*mut IbvContext) -> c_int;
    query_device: "ibv_query_device" @ "IBVERBS_1.1" => fn(*mut IbvContext, *mut IbvDeviceAttr) -> c_int;
    query_port: "ibv_query_port" @ "IBVERBS_1.1" => fn(*mut IbvContext, u8, *mut IbvPortAttr) -> c_int;
    query_gid: "ibv_query_gid" @ "IBVERBS_1.1" => fn(*mut IbvContext, u8, c_int, *mut IbvGid) -> c_int;
    alloc_pd: "ibv_alloc_pd" @ "IBVERBS_1.1" => fn(*mut IbvContext) -> *mut c_void;
    dealloc_pd: "ibv_dealloc_pd" @ "IBVERBS_1.1" => fn(*mut c_void) -> c_int;
    reg_mr: "ibv_reg_mr" @ "IBVERBS_1.1" => fn(*mut c_void, *mut c_void, usize, c_int) -> *mut IbvMr;
    dereg_mr: "ibv_dereg_mr" @ "IBVERBS_1.1" => fn(*mut IbvMr) -> c_int;
    create_comp_channel: "ibv_create_comp_channel" @ "IBVERBS_1.0" => fn(*mut IbvContext) -> *mut IbvCompChannel;
    destroy_comp_channel: "ibv_destroy_comp_channel" @ "IBVERBS_1.0" => fn(*mut IbvCompChannel) -> c_int;
    create_cq: "ibv_create_cq" @ "IBVERBS_1.1" =>
        fn(*mut IbvContext, c_int, *mut c_void, *mut IbvCompChannel, c_int) -> *mut IbvCq;
    destroy_cq: "ibv_destroy_cq" @ "IBVERBS_1.1" => fn(*mut IbvCq) -> c_int;
    get_cq_event: "ibv_get_cq_event" @ "IBVERBS_1.1" =>
        fn(*mut IbvCompChannel, *mut *mut IbvCq, *mut *mut c_void) -> c_int;
    ack_cq_events: "ibv_ack_cq_events" @ "IBVERBS_1.1" => fn(*mut IbvCq, c_uint);
    create_qp: "ibv_create_qp" @ "IBVERBS_1.1" => fn(*mut c_void, *mut IbvQpInitAttr) -> *mut IbvQp;
    modify_qp: "ibv_modify_qp" @ "IBVERBS_1.1" => fn(*mut IbvQp, *mut IbvQpAttr, c_int) -> c_int;
    destroy_qp: "ibv_destroy_qp" @ "IBVERBS_1.1" => fn(*mut IbvQp) -> c_int;
    get_async_event: "ibv_get_async_event" @ "IBVERBS_1.1" => fn(*mut IbvContext, *mut IbvAsyncEvent) -> c_int;
    ack_async_event: "ibv_ack_async_event" @ "IBVERBS_1.1" => fn(*mut IbvAsyncEvent);
    wc_status_str: "ibv_wc_status_str" @ "IBVERBS_1.1" => fn(u32) -> *const c_char;
}

/// A loaded libibverbs.
pub(crate) struct Lib {
    /// The path or name it was opened by.
    pub(crate) path: String,
    /// Its entry points.
    pub(crate) f: Fns,
    /// `ibv_fork_init`'s result (errno on failure), once.
    fork: OnceLock<Result<(), i32>>,
}

impl Lib {
    /// Calls `ibv_fork_init` the first time (before the first
    /// registration, as its manual asks); its errno if it failed (logged
    /// once, at WARN).
    pub(crate) fn fork_init_once(&self) -> Result<(), i32> {
        *self.fork.get_or_init(|| {
            // SAFETY: `ibv_fork_init` takes no arguments; it is called once,
            // before any memory is registered through this library.
            let rc = unsafe { (self.f.fork_init)() };
            if rc == 0 {
                return Ok(());
            }
            tracing::warn!(
                "ibv_fork_init ({}): {} (memory registered from now on is not protected in forked children)",
                self.path,
                std::io::Error::from_raw_os_error(rc.abs())
            );
            Err(rc.abs())
        })
    }

    /// `ibv_wc_status_str` (the library's name of a completion status).
    pub(crate) fn status_str(&self, status: u32) -> String {
        // SAFETY: ibv_wc_status_str accepts any value and returns a pointer
        // to a static string ("unknown" for values it does not know).
        let p = unsafe { (self.f.wc_status_str)(status) };
        if p.is_null() {
            return format!("status {status}");
        }
        // SAFETY: `p` is non-null and points to a static NUL-terminated string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// The last `dlerror` of this thread, in words.
fn dl_error() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string valid until the
    // next dl* call on this thread; it is copied at once.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        "no error reported".to_string()
    } else {
        // SAFETY: non-null, NUL-terminated (see above).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// `dlvsym(handle, name, version)`, or the reason it is missing.
fn sym(handle: *mut c_void, name: &str, version: &str, path: &str) -> Result<*mut c_void, Unavailable> {
    let (cname, cver) = (CString::new(name).expect("symbol name"), CString::new(version).expect("version"));
    // SAFETY: dlerror only clears this thread's pending error.
    unsafe { libc::dlerror() };
    // SAFETY: `handle` is a live dlopen handle; both strings are NUL-terminated.
    let p = unsafe { libc::dlvsym(handle, cname.as_ptr(), cver.as_ptr()) };
    if p.is_null() {
        return Err(Unavailable::new(
            UnavailableKind::Symbol,
            format!(
                "{path} has no {name}@{version} ({}): an rdma-core libibverbs (v13 or later) is needed",
                dl_error()
            ),
        ));
    }
    Ok(p)
}

/// Libraries loaded so far (each once, never closed).
static LOADED: Mutex<Vec<&'static Lib>> = Mutex::new(Vec::new());

/// Loads libibverbs from `path` (else [`DEFAULT_LIB`], found the way
/// `dlopen` searches), once per path.
pub(crate) fn load(path: Option<&str>) -> Result<&'static Lib, Unavailable> {
    let path = path.filter(|p| !p.trim().is_empty()).unwrap_or(DEFAULT_LIB);
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(lib) = loaded.iter().find(|l| l.path == path) {
        return Ok(lib);
    }
    let cpath = CString::new(path).map_err(|_| {
        Unavailable::new(UnavailableKind::Library, format!("library path {path:?} contains a NUL byte"))
    })?;
    // SAFETY: dlerror only clears this thread's pending error.
    unsafe { libc::dlerror() };
    // SAFETY: `cpath` is NUL-terminated. Loading runs libibverbs' constructors,
    // which only initialise its own state.
    let handle = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(Unavailable::new(
            UnavailableKind::Library,
            format!(
                "cannot load libibverbs from {path:?}: {} (install rdma-core's libibverbs, e.g. the \
                 libibverbs1 or rdma-core package, or set OXCCL_IBVERBS_LIB to its path)",
                dl_error()
            ),
        ));
    }
    // SAFETY: `handle` was just opened; the symbols resolved at these versions
    // have verbs.h's signatures, which `Fns` declares.
    let f = match unsafe { Fns::resolve(handle, path) } {
        Ok(f) => f,
        Err(e) => {
            // SAFETY: nothing resolved from `handle` is kept.
            unsafe { libc::dlclose(handle) };
            return Err(e);
        }
    };
    let lib: &'static Lib = Box::leak(Box::new(Lib { path: path.to_string(), f, fork: OnceLock::new() }));
    loaded.push(lib);
    Ok(lib)
}
