//! `poll` and a non-blocking `recv` for the monitor thread.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::RawFd;

/// Waits up to `timeout_ms` for events on `fds`; returns how many have
/// events (0 on timeout or a signal).
pub(super) fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize> {
    // SAFETY: `fds` is a valid, exclusively borrowed array of `fds.len()`
    // pollfd structs for the duration of the call; the kernel writes only
    // their `revents` fields.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted { Ok(0) } else { Err(e) };
    }
    Ok(r as usize)
}

/// `recv(fd, buf, MSG_DONTWAIT)`: `Ok(0)` is EOF, `WouldBlock` is "nothing
/// yet". The socket's own blocking mode (shared with the writing side) is
/// left alone.
pub(super) fn recv_nowait(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is a valid, exclusively borrowed buffer of `buf.len()`
    // bytes; recv writes at most that many bytes into it.
    let r = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r as usize) }
}
