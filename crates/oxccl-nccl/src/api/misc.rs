//! Memory, and what oxccl does not support (each says so).

use crate::abi::out;
use crate::handle::Comm;
use crate::nccl_api;
use oxccl::Error;
use parking_lot::Mutex;
use std::alloc::Layout;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};

/// Host allocations of `ncclMemAlloc` (no GPU): address → layout.
static HOST: Mutex<Option<HashMap<usize, Layout>>> = Mutex::new(None);

/// Whether `ncclMemAlloc` gives device memory: a driver and a device.
pub(crate) fn gpu_present() -> bool {
    #[cfg(feature = "cuda")]
    if oxccl_cuda::Device::count().is_ok_and(|n| n > 0) {
        return true;
    }
    false
}

fn not_supported(what: &str) -> oxccl::Result<()> {
    Err(Error::InvalidUsage(format!("{what} is not supported by oxccl")))
}

nccl_api! {
    /// `ncclMemAlloc`: device memory on the current device where a GPU is
    /// present; page-aligned host memory otherwise (an oxccl extension).
    fn ncclMemAlloc / pncclMemAlloc(ptr: *mut *mut c_void, size: usize) {
        if ptr.is_null() {
            return Err(Error::invalid("ptr is NULL"));
        }
        #[cfg(feature = "cuda")]
        if gpu_present() {
            let p = oxccl_cuda::alloc_device(size)
                .map_err(|e| Error::System(format!("cannot allocate {size} bytes of device memory: {e}")))?;
            return out(ptr, p as *mut c_void, "ptr");
        }
        let layout = Layout::from_size_align(size.max(1), 4096)
            .map_err(|_| Error::invalid(format!("size {size} is too large")))?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(Error::System(format!("cannot allocate {size} bytes of host memory")));
        }
        HOST.lock().get_or_insert_with(HashMap::new).insert(p as usize, layout);
        out(ptr, p.cast(), "ptr")
    }

    /// `ncclMemFree`.
    fn ncclMemFree / pncclMemFree(ptr: *mut c_void) {
        if ptr.is_null() {
            return Ok(());
        }
        if let Some(layout) = HOST.lock().as_mut().and_then(|m| m.remove(&(ptr as usize))) {
            // SAFETY: `ptr` came from alloc_zeroed with this layout and is
            // freed once (removed from the map first).
            unsafe { std::alloc::dealloc(ptr.cast(), layout) };
            return Ok(());
        }
        #[cfg(feature = "cuda")]
        if gpu_present() && oxccl_cuda::is_device_memory(ptr as u64) {
            return oxccl_cuda::free_device(ptr as u64).map_err(|e| Error::invalid(format!("cannot free {ptr:p}: {e}")));
        }
        Err(Error::invalid(format!("ptr {ptr:p} did not come from ncclMemAlloc (or was freed already)")))
    }

    /// `ncclCommSuspend`: not supported.
    fn ncclCommSuspend / pncclCommSuspend(comm: *mut c_void, flags: c_int) {
        Comm::get(comm as usize)?;
        let _ = flags;
        not_supported("ncclCommSuspend (releasing a communicator's GPU memory)")
    }

    /// `ncclCommResume`: not supported.
    fn ncclCommResume / pncclCommResume(comm: *mut c_void) {
        Comm::get(comm as usize)?;
        not_supported("ncclCommResume")
    }

    /// `ncclCommMemStats`: not supported.
    fn ncclCommMemStats / pncclCommMemStats(comm: *mut c_void, stat: c_int, value: *mut u64) {
        Comm::get(comm as usize)?;
        let _ = (stat, value);
        not_supported("ncclCommMemStats")
    }

    /// `ncclCommWindowRegister`: symmetric windows are not supported.
    fn ncclCommWindowRegister / pncclCommWindowRegister(
        comm: *mut c_void, buff: *mut c_void, size: usize, win: *mut *mut c_void, win_flags: c_int
    ) {
        Comm::get(comm as usize)?;
        let _ = (buff, size, win, win_flags);
        not_supported("ncclCommWindowRegister (symmetric memory windows)")
    }

    /// `ncclCommWindowDeregister`: not supported.
    fn ncclCommWindowDeregister / pncclCommWindowDeregister(comm: *mut c_void, win: *mut c_void) {
        let _ = (comm, win);
        not_supported("ncclCommWindowDeregister (symmetric memory windows)")
    }

    /// `ncclWinGetUserPtr`: not supported.
    fn ncclWinGetUserPtr / pncclWinGetUserPtr(comm: *mut c_void, win: *mut c_void, out_user_ptr: *mut *mut c_void) {
        let _ = (comm, win, out_user_ptr);
        not_supported("ncclWinGetUserPtr (symmetric memory windows)")
    }

    /// `ncclSetEncryption`: PSK mode encrypts the bootstrap and TCP traffic
    /// of communicators made afterwards in this process (`OXCCL_ENCRYPT`),
    /// the key mixed into each communicator's secret (every rank must pass
    /// the same); NONE turns it off again.
    fn ncclSetEncryption / pncclSetEncryption(config: *const crate::abi::EncryptionC) {
        let psk = crate::abi::read_encryption(config)?;
        *super::comms::ENCRYPTION.lock() = psk;
        Ok(())
    }
}
