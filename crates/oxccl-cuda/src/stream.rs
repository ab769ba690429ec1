//! Streams (the caller's, borrowed, or owned), asynchronous copies on raw
//! addresses, and events with deadline-bounded waits.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaStream, result, sys};

use crate::context::bind;
use crate::error::{CudaError, Result, drv, invalid};

/// A CUDA stream of one device: a borrowed handle (the caller's
/// `cudaStream_t`, or the legacy default stream) or one this crate owns.
/// Cloning shares the handle.
#[derive(Clone)]
pub struct Stream {
    ctx: Arc<CudaContext>,
    raw: sys::CUstream,
    /// Keeps an owned (or cudarc-held) stream alive; `None` for borrowed handles.
    _keep: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

/// A stream this crate created, destroyed when dropped (cuStreamDestroy
/// returns at once; the driver frees the stream once its work is done).
struct OwnedStream {
    ctx: Arc<CudaContext>,
    raw: sys::CUstream,
}

// SAFETY: a CUstream handle is usable from any thread (the driver API is
// thread-safe); it is destroyed once, in Drop.
unsafe impl Send for OwnedStream {}
// SAFETY: as above; nothing mutates the handle.
unsafe impl Sync for OwnedStream {}

impl Drop for OwnedStream {
    fn drop(&mut self) {
        if bind(&self.ctx).is_ok() {
            // SAFETY: the stream was created by new_stream and is destroyed once, here.
            let _ = unsafe { result::stream::destroy(self.raw) };
        }
    }
}

// SAFETY: a CUstream is a handle the driver API accepts from any thread (it
// is thread-safe); every use binds the stream's context first. Owned streams
// are destroyed by cudarc's CudaStream, once, when the last clone goes.
unsafe impl Send for Stream {}
// SAFETY: as above; no method mutates the handle.
unsafe impl Sync for Stream {}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stream({:p} on device {})", self.raw, self.ctx.ordinal())
    }
}

impl Stream {
    /// The legacy default stream (`NULL`) of `ctx`.
    pub(crate) fn null(ctx: &Arc<CudaContext>) -> Stream {
        Stream { ctx: ctx.clone(), raw: std::ptr::null_mut(), _keep: None }
    }

    /// A new non-blocking stream of `ctx`, destroyed when the last clone is
    /// dropped.
    pub(crate) fn create(ctx: &Arc<CudaContext>) -> Result<Stream> {
        bind(ctx)?;
        let raw = result::stream::create(result::stream::StreamKind::NonBlocking).map_err(drv("cuStreamCreate"))?;
        let owned = Arc::new(OwnedStream { ctx: ctx.clone(), raw });
        Ok(Stream { ctx: ctx.clone(), raw, _keep: Some(owned) })
    }

    /// A caller's stream handle of `ctx`, not owned (see `Device::wrap_stream`).
    pub(crate) fn borrowed(ctx: &Arc<CudaContext>, raw: *mut c_void) -> Stream {
        Stream { ctx: ctx.clone(), raw: raw.cast(), _keep: None }
    }
}

impl Event {
    /// A new event of `ctx` (no timing).
    pub(crate) fn create(ctx: &Arc<CudaContext>) -> Result<Event> {
        bind(ctx)?;
        let raw = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).map_err(drv("cuEventCreate"))?;
        Ok(Event { ctx: ctx.clone(), raw })
    }
}

impl Stream {
    /// Wraps a cudarc stream (kept alive by the `Stream`).
    pub fn from_cudarc(stream: Arc<CudaStream>) -> Stream {
        Stream { ctx: stream.context().clone(), raw: stream.cu_stream(), _keep: Some(stream) }
    }

    /// The raw `CUstream` handle (null for the default stream).
    pub fn raw(&self) -> sys::CUstream {
        self.raw
    }

    /// The context the stream belongs to.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Enqueues a copy of `bytes` from host memory `src` to device address `dst`.
    ///
    /// # Safety
    /// `src..src+bytes` must be readable host memory and `dst..dst+bytes`
    /// writable device memory, both valid (and `src` unmodified) until the
    /// copy has completed on the stream (pageable `src` is copied before the
    /// call returns; pinned `src` is read later).
    pub unsafe fn memcpy_htod(&self, dst: u64, src: *const u8, bytes: usize) -> Result<()> {
        check_copy("memcpy_htod", dst, src as u64, bytes)?;
        bind(&self.ctx)?;
        // SAFETY: the caller vouches for both ranges; the context is current.
        unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), bytes, self.raw) }
            .result()
            .map_err(drv("cuMemcpyHtoDAsync"))
    }

    /// Enqueues a copy of `bytes` from device address `src` to host memory `dst`.
    ///
    /// # Safety
    /// `dst..dst+bytes` must be writable host memory that nothing else reads
    /// or writes until the copy has completed on the stream; `src..src+bytes`
    /// readable device memory until then.
    pub unsafe fn memcpy_dtoh(&self, dst: *mut u8, src: u64, bytes: usize) -> Result<()> {
        check_copy("memcpy_dtoh", dst as u64, src, bytes)?;
        bind(&self.ctx)?;
        // SAFETY: the caller vouches for both ranges; the context is current.
        unsafe { sys::cuMemcpyDtoHAsync_v2(dst.cast(), src, bytes, self.raw) }
            .result()
            .map_err(drv("cuMemcpyDtoHAsync"))
    }

    /// Enqueues a device-to-device copy (also between devices with UVA, and
    /// from or to IPC mappings and host-mapped memory).
    ///
    /// # Safety
    /// Both ranges must be device-accessible memory valid until the copy has
    /// completed; they must not overlap.
    pub unsafe fn memcpy_dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        check_copy("memcpy_dtod", dst, src, bytes)?;
        bind(&self.ctx)?;
        // SAFETY: the caller vouches for both ranges; the context is current.
        unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, self.raw) }.result().map_err(drv("cuMemcpyDtoDAsync"))
    }

    /// Enqueues setting `bytes` bytes at device address `dst` to `value`.
    ///
    /// # Safety
    /// `dst..dst+bytes` must be writable device memory valid until the memset
    /// has completed.
    pub unsafe fn memset(&self, dst: u64, value: u8, bytes: usize) -> Result<()> {
        check_copy("memset", dst, 1, bytes)?;
        bind(&self.ctx)?;
        // SAFETY: the caller vouches for the range; the context is current.
        unsafe { sys::cuMemsetD8Async(dst, value, bytes, self.raw) }.result().map_err(drv("cuMemsetD8Async"))
    }

    /// Makes later work on this stream wait for `event` (no host blocking).
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        bind(&self.ctx)?;
        // SAFETY: both handles are live; the context is current.
        unsafe { result::stream::wait_event(self.raw, event.raw, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT) }
            .map_err(drv("cuStreamWaitEvent"))
    }

    /// Waits until all work enqueued so far on the stream has finished, or
    /// errors with [`CudaError::Timeout`] after `timeout` (the work goes on).
    pub fn synchronize(&self, timeout: Duration) -> Result<()> {
        let dev_event = {
            bind(&self.ctx)?;
            let raw =
                result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).map_err(drv("cuEventCreate"))?;
            Event { ctx: self.ctx.clone(), raw }
        };
        dev_event.record(self)?;
        dev_event.synchronize(timeout)
    }
}

/// Rejects a copy with a null address or a range that wraps around.
fn check_copy(what: &str, dst: u64, src: u64, bytes: usize) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    let end = |a: u64| a.checked_add(bytes as u64).is_none();
    if dst == 0 || src == 0 || end(dst) || end(src) {
        return Err(invalid(format!("{what}: {bytes} bytes from {src:#x} to {dst:#x}: null address or range wraps")));
    }
    Ok(())
}

/// A CUDA event (no timing) of one device.
pub struct Event {
    ctx: Arc<CudaContext>,
    raw: sys::CUevent,
}

// SAFETY: a CUevent is a handle the thread-safe driver API accepts from any
// thread; every use binds the context first; it is destroyed once, in Drop.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl Event {
    /// The raw `CUevent` handle.
    pub fn raw(&self) -> sys::CUevent {
        self.raw
    }

    /// Records the event at the current end of `stream`.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        bind(&self.ctx)?;
        // SAFETY: both handles are live; the context is current.
        unsafe { result::event::record(self.raw, stream.raw()) }.map_err(drv("cuEventRecord"))
    }

    /// Whether the work before the last [`Event::record`] has finished (an
    /// event never recorded counts as finished). A failure of that work (an
    /// illegal address, …) is returned as the error.
    pub fn query(&self) -> Result<bool> {
        bind(&self.ctx)?;
        // SAFETY: the handle is live; the context is current.
        match unsafe { result::event::query(self.raw) } {
            Ok(()) => Ok(true),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            Err(e) => Err(drv("cuEventQuery")(e)),
        }
    }

    /// Waits until [`Event::query`] says finished, polling (spinning briefly,
    /// then yielding, then sleeping 50 µs between polls); errors with
    /// [`CudaError::Timeout`] after `timeout`.
    pub fn synchronize(&self, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            if self.query()? {
                return Ok(());
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(CudaError::Timeout(format!(
                    "GPU work on device {} not finished after {timeout:?}",
                    self.ctx.ordinal()
                )));
            }
            if waited < Duration::from_micros(50) {
                std::hint::spin_loop();
            } else if waited < Duration::from_millis(2) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if bind(&self.ctx).is_ok() {
            // SAFETY: the event was created in this context and is destroyed once, here.
            let _ = unsafe { result::event::destroy(self.raw) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::check_copy;

    #[test]
    fn copies_with_null_or_wrapping_ranges_are_rejected() {
        check_copy("memcpy_dtod", 0x1000, 0x2000, 64).unwrap();
        check_copy("memcpy_dtod", 0, 0, 0).unwrap();
        let e = check_copy("memcpy_htod", 0, 0x2000, 64).unwrap_err().to_string();
        assert!(e.contains("memcpy_htod") && e.contains("64 bytes") && e.contains("0x2000"), "{e}");
        assert!(check_copy("memcpy_dtoh", u64::MAX - 8, 0x2000, 64).is_err());
    }
}
