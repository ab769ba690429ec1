//! NCCL's parameter API (`ncclParam*`): the `NCCL_*` and `OXCCL_*`
//! variables oxccl reads, by name (`ALGO`, `NCCL_ALGO` or `OXCCL_ALGO`:
//! the `OXCCL_*` twin wins where both are set).

use crate::abi::out;
use crate::handle;
use crate::nccl_api;
use oxccl::{Error, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_void};

/// The variables oxccl's C ABI reads (without prefix).
const KEYS: [&str; 14] = [
    "DEBUG",
    "DEBUG_FILE",
    "ALGO",
    "PROTO",
    "SOCKET_IFNAME",
    "BUFFSIZE",
    "COMM_ID",
    "MULTI_RANK_GPU_ENABLE",
    "TIMEOUT",
    "TRANSPORT",
    "NSOCKS",
    "CHECK",
    "SPIN_US",
    "ALGO_FILE",
];

/// Bound handles → key; strings handed out (kept for the process's life,
/// as NCCL's are).
#[derive(Default)]
struct Params {
    bound: HashMap<usize, String>,
    strings: Vec<CString>,
    table: Option<Vec<*const c_char>>,
}

// SAFETY: the raw pointers in `table` point into `strings`, which is only
// appended to (never moved out of or freed) under the mutex.
unsafe impl Send for Params {}

static PARAMS: Mutex<Option<Params>> = Mutex::new(None);

fn with<R>(f: impl FnOnce(&mut Params) -> R) -> R {
    f(PARAMS.lock().get_or_insert_with(Params::default))
}

/// `key` without its prefix.
fn bare(key: &str) -> &str {
    key.strip_prefix("OXCCL_").or_else(|| key.strip_prefix("NCCL_")).unwrap_or(key)
}

/// The value of `key`: `OXCCL_X`, else `NCCL_X`.
fn value(key: &str) -> Option<String> {
    let k = bare(key);
    [format!("OXCCL_{k}"), format!("NCCL_{k}")].iter().find_map(|n| std::env::var(n).ok())
}

/// A string kept alive for the process; its address.
fn keep(s: &str) -> *const c_char {
    with(|p| {
        p.strings.push(CString::new(s.replace('\0', " ")).unwrap_or_default());
        p.strings.last().expect("pushed").as_ptr()
    })
}

fn key_of(h: *mut c_void) -> Result<String> {
    with(|p| p.bound.get(&(h as usize)).cloned())
        .ok_or_else(|| Error::invalid(format!("handle {h:p} is not a parameter bound by ncclParamBind")))
}

fn int<T: std::str::FromStr>(h: *mut c_void, out_p: *mut T) -> Result<()> {
    let key = key_of(h)?;
    let v = value(&key).ok_or_else(|| Error::invalid(format!("parameter {key} is not set")))?;
    let n = v.trim().parse::<T>().map_err(|_| {
        Error::invalid(format!("parameter {key}={v:?} is not a number of {}", std::any::type_name::<T>()))
    })?;
    out(out_p, n, "out")
}

nccl_api! {
    /// `ncclParamBind`: a handle on the variable `key`.
    fn ncclParamBind / pncclParamBind(out_h: *mut *mut c_void, key: *const c_char) {
        if key.is_null() {
            return Err(Error::invalid("key is NULL"));
        }
        // SAFETY: a non-NULL key is a NUL-terminated string.
        let k = unsafe { CStr::from_ptr(key) }.to_string_lossy().into_owned();
        let h = handle::fresh();
        out(out_h, h as *mut c_void, "out")?;
        with(|p| p.bound.insert(h, k));
        Ok(())
    }

    /// `ncclParamGetI8`.
    fn ncclParamGetI8 / pncclParamGetI8(h: *mut c_void, o: *mut i8) { int(h, o) }
    /// `ncclParamGetI16`.
    fn ncclParamGetI16 / pncclParamGetI16(h: *mut c_void, o: *mut i16) { int(h, o) }
    /// `ncclParamGetI32`.
    fn ncclParamGetI32 / pncclParamGetI32(h: *mut c_void, o: *mut i32) { int(h, o) }
    /// `ncclParamGetI64`.
    fn ncclParamGetI64 / pncclParamGetI64(h: *mut c_void, o: *mut i64) { int(h, o) }
    /// `ncclParamGetU8`.
    fn ncclParamGetU8 / pncclParamGetU8(h: *mut c_void, o: *mut u8) { int(h, o) }
    /// `ncclParamGetU16`.
    fn ncclParamGetU16 / pncclParamGetU16(h: *mut c_void, o: *mut u16) { int(h, o) }
    /// `ncclParamGetU32`.
    fn ncclParamGetU32 / pncclParamGetU32(h: *mut c_void, o: *mut u32) { int(h, o) }
    /// `ncclParamGetU64`.
    fn ncclParamGetU64 / pncclParamGetU64(h: *mut c_void, o: *mut u64) { int(h, o) }

    /// `ncclParamGetStr`: the value (NULL when unset).
    fn ncclParamGetStr / pncclParamGetStr(h: *mut c_void, o: *mut *const c_char) {
        let key = key_of(h)?;
        let p = value(&key).map_or(std::ptr::null(), |v| keep(&v));
        out(o, p, "out")
    }

    /// `ncclParamGet`: the value's bytes (NUL-terminated, truncated to
    /// `maxLen`); `len` gets the bytes the whole value needs.
    fn ncclParamGet / pncclParamGet(h: *mut c_void, o: *mut c_void, max_len: c_int, len: *mut c_int) {
        let key = key_of(h)?;
        let v = value(&key).ok_or_else(|| Error::invalid(format!("parameter {key} is not set")))?;
        let need = v.len() + 1;
        if !o.is_null() && max_len > 0 {
            let n = need.min(max_len as usize);
            let mut b = v.into_bytes();
            b.push(0);
            // SAFETY: `o` has room for maxLen >= n bytes (the caller's contract).
            unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), o.cast::<u8>(), n) };
        }
        if !len.is_null() {
            out(len, need as c_int, "len")?;
        }
        Ok(())
    }

    /// `ncclParamGetParameter`: the value of `key` by name.
    fn ncclParamGetParameter / pncclParamGetParameter(key: *const c_char, v: *mut *const c_char, value_len: *mut c_int) {
        if key.is_null() {
            return Err(Error::invalid("key is NULL"));
        }
        // SAFETY: a non-NULL key is a NUL-terminated string.
        let k = unsafe { CStr::from_ptr(key) }.to_string_lossy().into_owned();
        let val = value(&k).ok_or_else(|| Error::invalid(format!("parameter {k} is not set")))?;
        if !value_len.is_null() {
            out(value_len, val.len() as c_int, "valueLen")?;
        }
        out(v, keep(&val), "value")
    }

    /// `ncclParamGetAllParameterKeys`: the variables oxccl reads.
    fn ncclParamGetAllParameterKeys / pncclParamGetAllParameterKeys(table: *mut *const *const c_char, table_len: *mut c_int) {
        let names: Vec<*const c_char> = KEYS.iter().map(|k| keep(&format!("NCCL_{k}"))).collect();
        let p = with(|p| p.table.get_or_insert(names).as_ptr());
        out(table, p, "table")?;
        out(table_len, KEYS.len() as c_int, "tableLen")
    }
}

/// `ncclParamDumpAll`: prints every variable oxccl reads that is set.
#[unsafe(no_mangle)]
pub extern "C" fn ncclParamDumpAll() {
    for k in KEYS {
        if let Some(v) = value(k) {
            eprintln!("NCCL_{k}={v}");
        }
    }
}

/// [`ncclParamDumpAll`] under its profiling name.
#[unsafe(no_mangle)]
pub extern "C" fn pncclParamDumpAll() {
    ncclParamDumpAll()
}
