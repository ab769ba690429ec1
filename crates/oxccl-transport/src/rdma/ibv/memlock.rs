//! Pinned-memory accounting: registrations pin pages, which the kernel
//! counts against `RLIMIT_MEMLOCK` unless the process has `CAP_IPC_LOCK`.
//! [`check_memlock`] refuses, before verbs does, a registration the limit
//! would refuse, and says the limit and the remedy (verbs says only
//! `ENOMEM`).

use crate::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes this process has registered through this backend (all devices),
/// counted in whole pages as the kernel counts them against
/// `RLIMIT_MEMLOCK`.
pub(super) static PINNED: AtomicU64 = AtomicU64::new(0);

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as u64 } else { 4096 }
}

/// Bytes of the pages `addr..addr + len` touches.
pub(super) fn pinned_bytes(addr: u64, len: u64) -> u64 {
    let page = page_size();
    let first = addr / page;
    let last = (addr.saturating_add(len).saturating_sub(1)) / page;
    (last - first + 1) * page
}

/// `CAP_IPC_LOCK`'s bit in the capability sets (linux/capability.h).
const CAP_IPC_LOCK: u32 = 14;

/// Whether this process may lock memory beyond its limit (`CAP_IPC_LOCK`).
fn has_cap_ipc_lock() -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else { return false };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// Refuses a registration the locked-memory limit would refuse, with the
/// limit and the remedy in words.
pub(super) fn check_memlock(dev: &str, len: usize, pinned: u64) -> Result<()> {
    let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `rl` is a valid out-pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl) } != 0 || rl.rlim_cur == libc::RLIM_INFINITY {
        return Ok(());
    }
    let total = PINNED.load(Ordering::Relaxed) + pinned;
    memlock_verdict(dev, len, total, rl.rlim_cur, has_cap_ipc_lock)
}

/// Whether `total` pinned bytes fit under `limit` (or the process may
/// exceed it: `capable`); the error gives the limit and the remedy.
fn memlock_verdict(dev: &str, len: usize, total: u64, limit: u64, capable: impl Fn() -> bool) -> Result<()> {
    if total <= limit || capable() {
        return Ok(());
    }
    Err(Error::System(format!(
        "cannot register {len} bytes on {dev}: registration pins memory, and {total} bytes pinned in all would exceed \
         the locked-memory limit (RLIMIT_MEMLOCK) of {limit} bytes; raise it: ulimit -l unlimited, or `* - memlock \
         unlimited` in /etc/security/limits.conf, or in a container docker run --ulimit memlock=-1"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages() {
        let p = page_size();
        assert_eq!(pinned_bytes(0, 1), p);
        assert_eq!(pinned_bytes(p - 1, 2), 2 * p);
        assert_eq!(pinned_bytes(p, p), p);
    }

    #[test]
    fn memlock_limit_is_named() {
        let e = memlock_verdict("mlx5_0", 65536, 73728, 8192, || false).unwrap_err().to_string();
        assert!(e.contains("mlx5_0") && e.contains("of 8192 bytes") && e.contains("65536 bytes"), "{e}");
        assert!(e.contains("ulimit -l unlimited") && e.contains("limits.conf") && e.contains("memlock=-1"), "{e}");
        assert!(memlock_verdict("mlx5_0", 4096, 8192, 8192, || false).is_ok());
        assert!(memlock_verdict("mlx5_0", 4096, 1 << 30, 8192, || true).is_ok(), "CAP_IPC_LOCK lifts the limit");
        // The live check runs (whatever this machine's limit).
        let _ = check_memlock("mlx5_0", 1, 0);
    }
}
