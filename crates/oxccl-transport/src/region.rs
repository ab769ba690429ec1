//! Raw views of caller buffers: the one place where oxccl turns a caller's
//! memory into an address and a length that outlive the borrow.
//!
//! A [`Region`] is a non-owning view of host memory: a caller's send or
//! receive buffer, a scratch allocation, a staging buffer, or memory a
//! peer registered for one-sided access. The executor reads and writes
//! regions while a call is outstanding, and providers copy into and out of
//! them (a TCP get's response, a shared-memory `process_vm_readv`).
//!
//! The contract that makes this sound is the communicator's: every entry
//! point keeps the memory alive and unaliased by other writers for as long
//! as any region of it is in use (blocking calls wait until the engine is
//! done, owned-buffer calls move the storage into the work item,
//! registrations end before their call returns). Device buffers are not
//! regions: they travel as `DeviceBuf` through the device path.
#![allow(unsafe_code)]

use crate::{Error, Result};

/// A raw view of `len` bytes of host memory.
#[derive(Clone, Copy, Debug)]
pub struct Region {
    ptr: *mut u8,
    len: usize,
    writable: bool,
}

// SAFETY: a Region is an address and a length; the contract in the module
// docs guarantees the memory outlives every use and that accesses through
// regions are ordered by the executor (one step at a time) or by the
// program (the verifier proves one-sided accesses race-free).
unsafe impl Send for Region {}
// SAFETY: as above; shared references to a Region only read its fields.
unsafe impl Sync for Region {}

impl Region {
    /// A read-only view of `s`.
    pub fn of(s: &[u8]) -> Region {
        Region { ptr: s.as_ptr() as *mut u8, len: s.len(), writable: false }
    }

    /// A writable view of `s`.
    pub fn of_mut(s: &mut [u8]) -> Region {
        Region { ptr: s.as_mut_ptr(), len: s.len(), writable: true }
    }

    /// A view of `len` bytes at `ptr`: memory the caller owns outside
    /// Rust's knowledge (page-locked staging memory of a GPU, a peer's
    /// registered buffer in this process).
    ///
    /// # Safety
    /// `ptr..ptr + len` must stay allocated, and be read and written only
    /// in ways ordered with this region's uses, while any view from the
    /// region is alive.
    pub unsafe fn from_raw(ptr: *mut u8, len: usize, writable: bool) -> Region {
        Region { ptr, len, writable }
    }

    /// An empty region.
    pub const fn empty() -> Region {
        Region { ptr: std::ptr::NonNull::<u8>::dangling().as_ptr(), len: 0, writable: true }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether [`write`](Region::write) is allowed.
    pub fn writable(&self) -> bool {
        self.writable
    }

    /// The address (for overlap checks, descriptors and by-reference sends).
    pub fn addr(&self) -> usize {
        self.ptr as usize
    }

    /// The bytes `[off, off + len)` as a sub-region, or an error naming the
    /// overrun.
    pub fn sub(&self, off: usize, len: usize) -> Result<Region> {
        match off.checked_add(len) {
            Some(end) if end <= self.len => {
                // SAFETY: off + len <= self.len, so the pointer stays in
                // (or one past) the caller's buffer.
                let ptr = unsafe { self.ptr.add(off) };
                Ok(Region { ptr, len, ..*self })
            }
            _ => Err(Error::Internal(format!("bytes {off}..+{len} outside a buffer of {} bytes", self.len))),
        }
    }

    /// Whether the two regions share a byte.
    pub fn overlaps(&self, other: &Region) -> bool {
        let (a, b) = (self.addr(), other.addr());
        self.len > 0 && other.len > 0 && a < b + other.len && b < a + self.len
    }

    /// Whether the two regions are the same bytes.
    pub fn same(&self, other: &Region) -> bool {
        self.addr() == other.addr() && self.len == other.len
    }

    /// Runs `f` on the bytes.
    ///
    /// Callers (the executor, the providers) never hold a view of a region
    /// while another view of overlapping bytes is writable: the verifier
    /// proves programs free of such overlaps, and reductions copy aliasing
    /// operands first.
    pub fn read<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        // SAFETY: the contract keeps the memory alive and unaliased by
        // writers for the whole operation (module docs); len bytes from
        // ptr are in the caller's buffer.
        f(unsafe { std::slice::from_raw_parts(self.ptr, self.len) })
    }

    /// Runs `f` on the bytes, writable.
    pub fn write<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> Result<R> {
        if !self.writable {
            return Err(Error::Internal("write to a read-only buffer".into()));
        }
        // SAFETY: as in `read`; the region came from a `&mut [u8]` (or
        // writable owned storage), and no other view of these bytes is
        // alive while `f` runs.
        Ok(f(unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }))
    }

    /// `self = src` (same length; they may overlap).
    pub fn copy_from(&self, src: &Region) -> Result<()> {
        if self.len != src.len {
            return Err(Error::Internal(format!("copy of {} bytes into {}", src.len, self.len)));
        }
        if self.same(src) || self.len == 0 {
            return Ok(());
        }
        if self.overlaps(src) {
            let tmp = src.read(<[u8]>::to_vec);
            return self.write(|d| d.copy_from_slice(&tmp));
        }
        src.read(|s| self.write(|d| d.copy_from_slice(s)))
    }
}

/// Storage owned for the length of an operation (scratch space, staging,
/// temporaries): 64-byte aligned, zeroed.
pub struct Owned {
    words: Vec<Line>,
    len: usize,
}

/// One cache line.
#[repr(C, align(64))]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Line([u64; 8]);

impl Owned {
    /// `len` zeroed bytes.
    pub fn zeroed(len: usize) -> Owned {
        Owned { words: vec![Line([0; 8]); len.div_ceil(64)], len }
    }

    /// Zeroes every byte again (storage reused for another call).
    pub fn zero(&mut self) {
        self.words.fill(Line([0; 8]));
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A writable region over the storage (valid while `self` lives and is
    /// not moved out of its heap allocation; the Vec's buffer never moves).
    pub fn region(&mut self) -> Region {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut self.words);
        Region::of_mut(&mut bytes[..self.len])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_overlap_and_copy() {
        let mut a = vec![1u8, 2, 3, 4, 5, 6];
        let r = Region::of_mut(&mut a);
        assert!(r.sub(4, 3).is_err());
        let (x, y) = (r.sub(0, 3).unwrap(), r.sub(2, 3).unwrap());
        assert!(x.overlaps(&y) && !x.sub(0, 2).unwrap().overlaps(&r.sub(2, 2).unwrap()));
        y.copy_from(&x).unwrap();
        assert_eq!(a, [1, 2, 1, 2, 3, 6]);
        let ro = Region::of(&[9u8, 9]);
        assert!(ro.write(|_| ()).is_err());
        let mut o = Owned::zeroed(100);
        assert_eq!(o.region().len(), 100);
        assert_eq!(o.region().addr() % 64, 0);
    }
}
