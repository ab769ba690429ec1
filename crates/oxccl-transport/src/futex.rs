//! Doorbells: a counter word that peers ring and a rank sleeps on.
//!
//! A [`Doorbell`] is a pair of `u32` words, [`DoorbellWord`]: a sequence
//! number that [`Doorbell::ring`] increments, and a count of sleepers so
//! that a ring skips the wake-up syscall when no one sleeps. The words may
//! live on the heap ([`Doorbell::heap`]) or inside a shared mapping
//! ([`Doorbell::from_raw`]); the futex calls are *shared* (no
//! `FUTEX_PRIVATE_FLAG`), so a ring in one process wakes a waiter in another.
//!
//! The usual pattern: read [`Doorbell::seq`], look for work, and if there is
//! none, [`Doorbell::wait`] with the sequence read before looking; a ring in
//! between makes the wait return at once.
#![allow(unsafe_code)]

use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// The memory of one doorbell: 8 bytes, 4-aligned, all-zero is a valid
/// initial state (so a freshly truncated shared file holds valid doorbells).
#[repr(C)]
#[derive(Default)]
pub struct DoorbellWord {
    seq: AtomicU32,
    sleepers: AtomicU32,
}

impl DoorbellWord {
    /// A doorbell word at sequence 0 with no sleepers.
    pub fn new() -> DoorbellWord {
        DoorbellWord { seq: AtomicU32::new(0), sleepers: AtomicU32::new(0) }
    }
}

/// A handle on a doorbell word; clones ring and wait on the same word. The
/// handle keeps the memory that holds the word alive.
#[derive(Clone)]
pub struct Doorbell {
    word: *const DoorbellWord,
    _keep: Arc<dyn Any + Send + Sync>,
}

// SAFETY: the word is only accessed through atomics, and `_keep` keeps its
// memory mapped/allocated for as long as any handle exists.
unsafe impl Send for Doorbell {}
// SAFETY: as above; every method takes `&self` and uses atomics only.
unsafe impl Sync for Doorbell {}

impl std::fmt::Debug for Doorbell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Doorbell({:p}, seq {})", self.word, self.seq())
    }
}

/// Spins before a waiter goes to sleep.
const SPINS: u32 = 200;

impl Doorbell {
    /// A standalone doorbell on the heap.
    pub fn heap() -> Doorbell {
        let keep: Arc<DoorbellWord> = Arc::new(DoorbellWord::new());
        let word = Arc::as_ptr(&keep);
        Doorbell { word, _keep: keep }
    }

    /// A doorbell over a word inside memory that `keep` owns (a shared
    /// mapping).
    ///
    /// # Safety
    /// `word` must be 4-aligned, point to 8 bytes that stay valid while
    /// `keep` lives, and be accessed by everyone (every process) only as a
    /// [`DoorbellWord`] (atomically).
    pub unsafe fn from_raw(word: *const DoorbellWord, keep: Arc<dyn Any + Send + Sync>) -> Doorbell {
        Doorbell { word, _keep: keep }
    }

    fn word(&self) -> &DoorbellWord {
        // SAFETY: `_keep` keeps the memory alive (heap/from_raw contract) and
        // the word is only accessed atomically.
        unsafe { &*self.word }
    }

    /// The current sequence number.
    pub fn seq(&self) -> u32 {
        self.word().seq.load(Ordering::SeqCst)
    }

    /// Increments the sequence number and wakes every waiter.
    pub fn ring(&self) {
        let w = self.word();
        w.seq.fetch_add(1, Ordering::SeqCst);
        // SeqCst on both sides (the waiter increments `sleepers`, then reads
        // `seq`): either the waiter sees the new sequence, or we see it sleep.
        if w.sleepers.load(Ordering::SeqCst) > 0 {
            futex_wake(&w.seq);
        }
    }

    /// Waits until the sequence number differs from `seen` or `timeout`
    /// passes: spins briefly, then sleeps on the futex. Returns true if the
    /// sequence changed.
    pub fn wait(&self, seen: u32, timeout: Duration) -> bool {
        let w = self.word();
        for _ in 0..SPINS {
            if w.seq.load(Ordering::Acquire) != seen {
                return true;
            }
            std::hint::spin_loop();
        }
        let deadline = Instant::now() + timeout;
        w.sleepers.fetch_add(1, Ordering::SeqCst);
        let changed = loop {
            if w.seq.load(Ordering::SeqCst) != seen {
                break true;
            }
            let now = Instant::now();
            if now >= deadline {
                break false;
            }
            futex_wait(&w.seq, seen, deadline - now);
        };
        w.sleepers.fetch_sub(1, Ordering::SeqCst);
        changed
    }
}

#[cfg(not(loom))]
fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a valid, aligned u32; shared (not private) so
    // waiters in other processes mapping the same page are woken.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX, 0usize, 0usize, 0u32);
    }
}

#[cfg(not(loom))]
fn futex_wait(word: &AtomicU32, seen: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT on a valid, aligned u32 with a relative timeout that
    // lives across the call; the kernel returns at once if the word is no
    // longer `seen`. Spurious wake-ups and EINTR are handled by the caller's
    // loop.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            seen,
            &ts as *const libc::timespec,
            0usize,
            0u32,
        );
    }
}

#[cfg(loom)]
fn futex_wake(_word: &AtomicU32) {}

#[cfg(loom)]
fn futex_wait(_word: &AtomicU32, _seen: u32, _timeout: Duration) {
    loom::thread::yield_now();
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn ring_changes_seq_and_wait_sees_it() {
        let d = Doorbell::heap();
        let s = d.seq();
        assert!(!d.wait(s, Duration::from_millis(5)), "nothing rang");
        d.clone().ring();
        assert_eq!(d.seq(), s.wrapping_add(1));
        assert!(d.wait(s, Duration::from_millis(5)));
    }

    #[test]
    fn ring_wakes_a_sleeper_on_another_thread() {
        let d = Doorbell::heap();
        let s = d.seq();
        let d2 = d.clone();
        let t = std::thread::spawn(move || d2.wait(s, Duration::from_secs(30)));
        std::thread::sleep(Duration::from_millis(20));
        d.ring();
        assert!(t.join().unwrap(), "the waiter saw the ring");
    }
}
