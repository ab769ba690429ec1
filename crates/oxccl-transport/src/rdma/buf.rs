//! Registered memory oxccl owns: a connection's ring or staging FIFO.
#![allow(unsafe_code)]

use super::verbs::{Access, Device, Mr};
use crate::{Error, Result};
use std::alloc::Layout;
use std::sync::Arc;

/// A page-aligned, zeroed allocation registered with a device; it is
/// deregistered, then freed, on drop (drop its QPs first: their HCA may
/// still touch it until then).
pub(crate) struct Buf {
    ptr: *mut u8,
    layout: Layout,
    pub(crate) mr: Mr,
    dev: Arc<dyn Device>,
}

// SAFETY: Buf owns its allocation; the HCA and this rank's engine access it
// only through addresses under the protocol's ordering (see conn).
unsafe impl Send for Buf {}
// SAFETY: shared references only read fields.
unsafe impl Sync for Buf {}

impl Buf {
    /// `len` zeroed bytes registered with `access`.
    pub(crate) fn new(dev: &Arc<dyn Device>, len: usize, access: Access) -> Result<Buf> {
        let layout = Layout::from_size_align(len.max(64), 4096)
            .map_err(|_| Error::invalid(format!("an RDMA buffer of {len} bytes")))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(Error::System(format!("out of memory allocating an RDMA buffer of {len} bytes")));
        }
        // SAFETY: the allocation lives until Drop, which deregisters first.
        match unsafe { dev.reg_mr(ptr as u64, layout.size(), access) } {
            Ok(mr) => Ok(Buf { ptr, layout, mr, dev: dev.clone() }),
            Err(e) => {
                // SAFETY: allocated above with this layout, never shared.
                unsafe { std::alloc::dealloc(ptr, layout) };
                Err(e)
            }
        }
    }

    /// Its address.
    pub(crate) fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// `len` bytes at `off` as a slice.
    ///
    /// # Safety
    /// No work request or peer may write those bytes while the slice lives
    /// (they landed, and the protocol lets nobody overwrite them yet).
    pub(crate) unsafe fn slice(&self, off: usize, len: usize) -> &[u8] {
        assert!(off + len <= self.layout.size(), "slice inside the buffer");
        // SAFETY: in bounds (asserted); the caller guarantees no writer.
        unsafe { std::slice::from_raw_parts(self.ptr.add(off), len) }
    }

    /// `len` bytes at `off`, writable.
    ///
    /// # Safety
    /// No work request may read or write those bytes while the slice lives.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice_mut(&self, off: usize, len: usize) -> &mut [u8] {
        assert!(off + len <= self.layout.size(), "slice inside the buffer");
        // SAFETY: in bounds (asserted); the caller guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(off), len) }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        if let Err(e) = self.dev.dereg_mr(&self.mr) {
            // Still registered: leaking is the only safe choice.
            tracing::warn!("RDMA: deregistering a buffer failed ({e}); leaking it");
            return;
        }
        // SAFETY: allocated with this layout; deregistered above, so the
        // HCA no longer touches it.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}
