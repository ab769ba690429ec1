//! Buffers the progress thread reads and writes on the caller's behalf,
//! and the memory-kind boundary.
//!
//! A [`Region`] is a raw, non-owning view of a caller's buffer: the
//! caller's memory stays where it is and the progress thread works on it
//! while the call is outstanding. Every API entry point guarantees that the
//! memory outlives the operation: blocking calls wait until the engine is
//! done with it (success, error or timeout), owned-buffer calls move the
//! storage into the work item. This is the only module of the crate with
//! `unsafe`.
//!
//! [`MemKind`] says where a buffer lives. Host memory is copied and reduced
//! with oxccl-core's vectorized loops; device memory (issue 5) will dispatch
//! to CUDA kernels on the caller's stream through the same two entry
//! points, [`copy`] and [`reduce`].
#![allow(unsafe_code)]

use oxccl_core::{DataType, Error, ReduceOp, Result, kernels};

/// Where a buffer lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemKind {
    /// Ordinary process memory.
    Host,
}

/// A raw view of `len` bytes of a caller's buffer.
#[derive(Clone, Copy, Debug)]
pub struct Region {
    ptr: *mut u8,
    len: usize,
    writable: bool,
    kind: MemKind,
}

// SAFETY: a Region is an address and a length; the API guarantees the
// memory outlives the operation and that only the progress thread touches
// it meanwhile (the caller is blocked, or gave up the storage).
unsafe impl Send for Region {}
// SAFETY: as above; shared references to a Region only read its fields.
unsafe impl Sync for Region {}

impl Region {
    /// A read-only view of `s`.
    pub fn of(s: &[u8]) -> Region {
        Region { ptr: s.as_ptr() as *mut u8, len: s.len(), writable: false, kind: MemKind::Host }
    }

    /// A writable view of `s`.
    pub fn of_mut(s: &mut [u8]) -> Region {
        Region { ptr: s.as_mut_ptr(), len: s.len(), writable: true, kind: MemKind::Host }
    }

    /// A writable view of `len` bytes at `ptr`: memory the caller owns
    /// outside Rust's knowledge (page-locked staging memory of a GPU).
    ///
    /// # Safety
    /// `ptr..ptr + len` must stay allocated and be touched by nothing else
    /// (no copy engine, no other thread) while a view from the region is
    /// alive: the staging path reads and writes a chunk only between the
    /// stream's signal that its copy in is done and the host's signal that
    /// lets the copy out start.
    #[cfg(feature = "cuda")]
    pub unsafe fn from_raw(ptr: *mut u8, len: usize) -> Region {
        Region { ptr, len, writable: true, kind: MemKind::Host }
    }

    /// An empty region.
    pub const fn empty() -> Region {
        Region { ptr: std::ptr::NonNull::<u8>::dangling().as_ptr(), len: 0, writable: true, kind: MemKind::Host }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where it lives.
    #[allow(dead_code)]
    pub fn kind(&self) -> MemKind {
        self.kind
    }

    /// The address (for overlap checks and by-reference sends).
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

    fn host(&self) -> Result<()> {
        match self.kind {
            MemKind::Host => Ok(()),
        }
    }

    /// Runs `f` on the bytes.
    ///
    /// Callers (the executor) never hold a view of a region while another
    /// view of overlapping bytes is writable: the verifier proves programs
    /// free of such overlaps, and [`reduce`] handles aliasing operands.
    pub fn read<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        // SAFETY: the API keeps the memory alive and unaliased by writers
        // for the whole operation (module docs); len bytes from ptr are in
        // the caller's buffer.
        f(unsafe { std::slice::from_raw_parts(self.ptr, self.len) })
    }

    /// Runs `f` on the bytes, writable.
    pub fn write<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> Result<R> {
        if !self.writable {
            return Err(Error::Internal("write to a read-only buffer".into()));
        }
        // SAFETY: as in `read`; the region came from a `&mut [u8]` (or
        // owned storage), and no other view of these bytes is alive while
        // `f` runs (the executor runs one step at a time).
        Ok(f(unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }))
    }
}

/// `dst = src` (same length; they may overlap).
pub fn copy(dst: &Region, src: &Region) -> Result<()> {
    dst.host()?;
    src.host()?;
    if dst.len != src.len {
        return Err(Error::Internal(format!("copy of {} bytes into {}", src.len, dst.len)));
    }
    if dst.same(src) || dst.len == 0 {
        return Ok(());
    }
    if dst.overlaps(src) {
        let tmp = src.read(<[u8]>::to_vec);
        return dst.write(|d| d.copy_from_slice(&tmp));
    }
    src.read(|s| dst.write(|d| d.copy_from_slice(s)))
}

/// `dst = a ⊕ b`, where `a` and `b` are regions or an arrived piece of a
/// message (`Operand::Bytes`); `dst` may be the very same bytes as an
/// operand, and partial overlap is handled with a copy.
pub fn reduce(dtype: DataType, op: ReduceOp, dst: &Region, a: Operand<'_>, b: Operand<'_>) -> Result<()> {
    dst.host()?;
    let aliases = |o: &Operand<'_>| matches!(o, Operand::Region(r) if r.overlaps(dst));
    if let (Operand::Region(r), false) = (&a, aliases(&b))
        && r.same(dst)
    {
        return b.read(|bb| dst.write(|d| kernels::reduce_into(dtype, op, d, bb)))??;
    }
    if let (Operand::Region(r), false) = (&b, aliases(&a))
        && r.same(dst)
    {
        return a.read(|aa| dst.write(|d| kernels::reduce_into(dtype, op, d, aa)))??;
    }
    if aliases(&a) || aliases(&b) {
        let (ta, tb) = (a.read(<[u8]>::to_vec)?, b.read(<[u8]>::to_vec)?);
        return dst.write(|d| kernels::reduce2(dtype, op, d, &ta, &tb))?;
    }
    a.read(|aa| b.read(|bb| dst.write(|d| kernels::reduce2(dtype, op, d, aa, bb))))???
}

/// An operand of [`reduce`]: caller memory, or bytes already in hand.
pub enum Operand<'a> {
    /// A caller's (or scratch) region.
    Region(Region),
    /// Bytes read in place from a connection.
    Bytes(&'a [u8]),
}

impl Operand<'_> {
    fn read<R>(&self, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        match self {
            Operand::Region(r) => {
                r.host()?;
                Ok(r.read(f))
            }
            Operand::Bytes(b) => Ok(f(b)),
        }
    }
}

/// Writes `bytes` into `dst` at `off`.
pub fn write_at(dst: &Region, off: usize, bytes: &[u8]) -> Result<()> {
    dst.sub(off, bytes.len())?.write(|d| d.copy_from_slice(bytes))
}

/// Storage the engine owns for the length of an operation (scratch space,
/// pre-multiplied inputs): 64-byte aligned.
pub struct Owned {
    words: Vec<[u64; 8]>,
    len: usize,
}

impl Owned {
    /// `len` zeroed bytes.
    pub fn zeroed(len: usize) -> Owned {
        Owned { words: vec![[0u64; 8]; len.div_ceil(64)], len }
    }

    /// A writable region over the storage (valid while `self` lives and is
    /// not moved out of its heap allocation — the Vec's buffer never moves).
    pub fn region(&mut self) -> Region {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut self.words);
        Region::of_mut(&mut bytes[..self.len])
    }
}
