//! Cross-memory attach: `process_vm_readv`/`process_vm_writev`, the
//! system calls through which a process on this host reads or writes
//! another's memory (where the kernel allows it: same user, and Yama's
//! `ptrace_scope` permitting). Shared memory's by-reference messages and
//! native one-sided access stand on them.
#![allow(unsafe_code)]

use crate::{Error, Result};

/// Reads `dst.len()` bytes at `remote_addr` in process `pid`
/// (`process_vm_readv`); returns the bytes read (possibly fewer).
pub fn vm_read(pid: i32, remote_addr: usize, dst: &mut [u8]) -> Result<usize> {
    vm_read_raw(pid, remote_addr, dst).map_err(|errno| {
        Error::System(format!(
            "process_vm_readv of {} bytes at {remote_addr:#x} in pid {pid}: {}",
            dst.len(),
            std::io::Error::from_raw_os_error(errno)
        ))
    })
}

/// Reads `dst.len()` bytes at `remote_addr` in process `pid`
/// (`process_vm_readv`); the bytes read (possibly fewer), or the errno.
pub fn vm_read_raw(pid: i32, remote_addr: usize, dst: &mut [u8]) -> std::result::Result<usize, i32> {
    if dst.is_empty() {
        return Ok(0);
    }
    let local = libc::iovec { iov_base: dst.as_mut_ptr() as *mut libc::c_void, iov_len: dst.len() };
    let remote = libc::iovec { iov_base: remote_addr as *mut libc::c_void, iov_len: dst.len() };
    // SAFETY: `local` describes `dst`, writable for its length; the kernel
    // checks the remote range and fails with EFAULT if it is not mapped.
    let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    Ok(n as usize)
}

/// Writes `src` at `remote_addr` in process `pid` (`process_vm_writev`);
/// returns the bytes written (possibly fewer). The errno on failure.
pub fn vm_write_raw(pid: i32, remote_addr: usize, src: &[u8]) -> std::result::Result<usize, i32> {
    if src.is_empty() {
        return Ok(0);
    }
    let local = libc::iovec { iov_base: src.as_ptr() as *mut libc::c_void, iov_len: src.len() };
    let remote = libc::iovec { iov_base: remote_addr as *mut libc::c_void, iov_len: src.len() };
    // SAFETY: `local` describes `src`, readable for its length (the kernel
    // only reads it); the kernel checks the remote range and fails with
    // EFAULT if it is not mapped writable in `pid`.
    let n = unsafe { libc::process_vm_writev(pid, &local, 1, &remote, 1, 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    Ok(n as usize)
}

/// Whether the kernel lets this process read process `pid`'s memory.
pub fn vm_read_permitted(pid: i32) -> bool {
    let mut b = [0u8; 1];
    // Address 0 is never mapped: a permitted read fails with EFAULT, a
    // refused one with EPERM (or ESRCH for no such process).
    pid > 0 && matches!(vm_read_raw(pid, 0, &mut b), Ok(_) | Err(libc::EFAULT))
}
