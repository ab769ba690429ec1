//! The direct path's shared state, in one place: every rank's device
//! window and flag areas as addressable from this rank, and what the
//! direct kernels and the device executor both need to know (this rank,
//! the rank count, the timeout).
//!
//! Each rank's allocation is laid out as: the direct kernels' flag area
//! (`FLAG_BYTES`), the window (`OXCCL_DEVICE_WINDOW`), the executor's flag
//! area (`PROG_FLAG_BYTES`), then the executor's FIFOs.

use oxccl_cuda::MAX_RANKS;
use oxccl_cuda::program::PROG_FLAG_BYTES;
use std::time::Duration;

/// Every rank's areas, and this rank's place among them.
pub(super) struct Windows {
    /// Each rank's window (the programs' scratch, the kernels' staging).
    pub windows: [u64; MAX_RANKS],
    /// Each rank's flag area of the direct kernels (before its window).
    pub flags: [u64; MAX_RANKS],
    /// Bytes of every window (the same on every rank where the executor
    /// runs).
    pub window_bytes: u64,
    /// Every rank is a thread of this process (plain pointers reach
    /// everything, callers' buffers included).
    pub same_process: bool,
    pub rank: usize,
    pub nranks: usize,
    pub timeout: Duration,
}

impl Windows {
    /// The timeout in nanoseconds, as kernels take it.
    pub fn timeout_ns(&self) -> u64 {
        u64::try_from(self.timeout.as_nanos()).unwrap_or(u64::MAX)
    }

    /// Rank `q`'s flag area of the device executor (after its window).
    pub fn prog_flags(&self, q: usize) -> u64 {
        self.windows[q] + self.window_bytes
    }

    /// Rank `q`'s FIFOs of the device executor (after its flag area).
    pub fn fifo(&self, q: usize) -> u64 {
        self.prog_flags(q) + PROG_FLAG_BYTES as u64
    }

    /// The executor's flag areas and FIFOs of every rank, as kernels take
    /// them.
    pub fn prog_areas(&self) -> ([u64; MAX_RANKS], [u64; MAX_RANKS]) {
        let (mut flags, mut fifos) = ([0; MAX_RANKS], [0; MAX_RANKS]);
        for q in 0..self.nranks {
            flags[q] = self.prog_flags(q);
            fifos[q] = self.fifo(q);
        }
        (flags, fifos)
    }
}
