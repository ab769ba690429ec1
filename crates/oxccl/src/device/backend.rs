//! What the device path needs from a GPU, as a trait: the CUDA
//! implementation lives in [`super::cuda`]; tests run the same staging
//! logic over a host-memory fake ([`super::fake`]).

use super::{CudaStream, DeviceBuf};
use crate::buf::Region;
use oxccl_core::Result;
use std::time::Duration;

/// Word indices of [`Words`].
pub(crate) mod word {
    /// Staged chunks whose input reached host memory (the stream counts up).
    pub const D2H: usize = 0;
    /// Staged chunks whose result is ready in host memory (the host counts up).
    pub const H2D: usize = 1;
}

/// Counters the host and the device's streams share (host-mapped memory on
/// a GPU), plus the status pair every kernel honours: an error code the
/// device writes and an abort request the host writes.
pub(crate) trait Words: Send + Sync {
    /// Reads counter `i`.
    fn get(&self, i: usize) -> u64;
    /// Writes counter `i`.
    fn set(&self, i: usize, v: u64);
    /// Asks every kernel that waits on a peer or on the host to give up.
    fn abort(&self);
    /// The first error a kernel recorded (0: none; see cuda/args.h).
    fn status(&self) -> u32;
}

/// Host memory a device copies to and from (page-locked on a GPU).
pub(crate) trait Pinned: Send + Sync {
    /// The whole allocation.
    fn region(&self) -> Region;
}

/// A point in a stream: done once the stream has passed it.
pub(crate) trait Marker: Send + Sync {
    /// Whether the stream has passed the point.
    fn done(&self) -> Result<bool>;
    /// The implementation's own type (for [`Backend::enqueue_after`]).
    fn as_any(&self) -> &dyn std::any::Any;
}

/// One GPU as the staging path sees it. Every `enqueue_*` returns at once;
/// the work runs in stream order.
pub(crate) trait Backend: Send + Sync {
    /// The shared counters and status.
    fn words(&self) -> &dyn Words;
    /// `bytes` of host memory the device can copy to and from.
    fn pinned(&self, bytes: usize) -> Result<Box<dyn Pinned>>;
    /// Checks that `buf` is device memory this backend can use, naming
    /// what is wrong (`what`: "the send buffer" …).
    fn check(&self, what: &str, buf: DeviceBuf) -> Result<()>;
    /// Enqueues `dst ← src` (device to host).
    fn enqueue_d2h(&self, s: CudaStream, dst: Region, src: DeviceBuf) -> Result<()>;
    /// Enqueues `dst ← src` (host to device).
    fn enqueue_h2d(&self, s: CudaStream, dst: DeviceBuf, src: Region) -> Result<()>;
    /// Enqueues: when the stream gets here, counter `i` becomes `v`.
    fn enqueue_signal(&self, s: CudaStream, i: usize, v: u64) -> Result<()>;
    /// Enqueues: the stream waits here until counter `i` ≥ `v` (or the
    /// abort request, or `timeout`: the status records which).
    fn enqueue_wait(&self, s: CudaStream, i: usize, v: u64, timeout: Duration) -> Result<()>;
    /// Enqueues: the stream waits here until another stream passed `m`.
    fn enqueue_after(&self, s: CudaStream, m: &dyn Marker) -> Result<()>;
    /// A marker at the stream's current end.
    fn marker(&self, s: CudaStream) -> Result<Box<dyn Marker>>;
    /// Waits until the stream has run everything enqueued, at most `timeout`.
    fn synchronize(&self, s: CudaStream, timeout: Duration) -> Result<()>;
}
