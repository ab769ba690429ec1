//! Buffers: host memory as raw [`Region`]s (oxccl-transport's one raw-view
//! module), device memory as [`DeviceBuf`]s, and the host copy and reduce
//! the executor and the engine's actions use.
//!
//! Memory kind is explicit in the types: a host buffer is a `Region` and
//! runs through the host executor; a device buffer is a `DeviceBuf` and
//! runs through the device path on the caller's stream. [`Buffer`] is
//! either, so one operation descriptor ([`crate::Op`]) serves both; [`Span`]
//! is what the call descriptor needs of any of them.
//!
//! `unsafe` here: [`Buffer::from_raw`], the one place the bindings turn a
//! caller's address into a buffer of either kind.
#![allow(unsafe_code)]

use oxccl_core::{DataType, Error, ReduceOp, Result, kernels};
pub use oxccl_transport::region::{Owned, Region};

/// A contiguous buffer whose length and sub-ranges the call descriptor
/// needs: host [`Region`]s and [`DeviceBuf`]s.
pub trait Span: Copy {
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Bytes `[off, off + len)`, or an error naming the overrun.
    fn sub(&self, off: usize, len: usize) -> Result<Self>;
    /// Whether it has no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Span for Region {
    fn len(&self) -> usize {
        Region::len(self)
    }
    fn sub(&self, off: usize, len: usize) -> Result<Region> {
        Region::sub(self, off, len)
    }
}

/// A device buffer: an address in the GPU's unified address space (a
/// `CUdeviceptr`, what cudarc's `DevicePtr::device_ptr`, CuPy's
/// `data.ptr` or PyTorch's `data_ptr()` give) and its length in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceBuf {
    addr: u64,
    len: usize,
}

impl DeviceBuf {
    /// `len` bytes at device address `addr`. Nothing is checked here; the
    /// collective checks that the range is device memory.
    pub const fn new(addr: u64, len: usize) -> DeviceBuf {
        DeviceBuf { addr, len }
    }

    /// The address.
    pub const fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub const fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes.
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the two buffers share a byte (as `Region::overlaps`).
    pub fn overlaps(&self, other: &DeviceBuf) -> bool {
        let (a, b) = (self.addr, other.addr);
        self.len > 0 && other.len > 0 && a < b + other.len as u64 && b < a + self.len as u64
    }

    /// Bytes `[off, off + len)`, or an error naming the overrun.
    pub fn sub(&self, off: usize, len: usize) -> Result<DeviceBuf> {
        match off.checked_add(len) {
            Some(end) if end <= self.len => Ok(DeviceBuf { addr: self.addr + off as u64, len }),
            _ => Err(Error::invalid(format!("bytes {off}..+{len} outside a device buffer of {} bytes", self.len))),
        }
    }
}

impl Span for DeviceBuf {
    fn len(&self) -> usize {
        self.len
    }
    fn sub(&self, off: usize, len: usize) -> Result<DeviceBuf> {
        DeviceBuf::sub(self, off, len)
    }
}

/// Where a buffer's memory is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Memory {
    /// Host memory: the host executor runs it on the calling thread.
    Host,
    /// Device (GPU) memory: the device path enqueues it on a stream.
    Device,
}

impl Memory {
    /// "host" or "device".
    pub const fn name(self) -> &'static str {
        match self {
            Memory::Host => "host",
            Memory::Device => "device",
        }
    }
}

/// A buffer of an operation: host or device memory.
#[derive(Clone, Copy, Debug)]
pub enum Buffer {
    /// Host memory (a raw view: whoever made it keeps the bytes alive).
    Host(Region),
    /// Device memory, by address.
    Device(DeviceBuf),
}

impl Buffer {
    /// A buffer of `len` bytes at `addr` in `memory` (`writable`: the
    /// operation may write it; device memory is always writable). An empty
    /// buffer needs no address.
    ///
    /// # Safety
    /// For host memory, as [`Region::from_raw`]: `len` bytes at `addr` stay
    /// allocated (and, when `writable`, written by nobody else) while an
    /// operation on the buffer runs.
    pub unsafe fn from_raw(memory: Memory, addr: usize, len: usize, writable: bool) -> Buffer {
        match memory {
            Memory::Device => Buffer::Device(DeviceBuf::new(addr as u64, len)),
            Memory::Host if len == 0 => Buffer::Host(Region::empty()),
            // SAFETY: the caller's promise above.
            Memory::Host => Buffer::Host(unsafe { Region::from_raw(addr as *mut u8, len, writable) }),
        }
    }

    /// Where its memory is.
    pub const fn memory(&self) -> Memory {
        match self {
            Buffer::Host(_) => Memory::Host,
            Buffer::Device(_) => Memory::Device,
        }
    }

    /// The host region, if it is one.
    pub const fn host(&self) -> Option<Region> {
        match self {
            Buffer::Host(r) => Some(*r),
            Buffer::Device(_) => None,
        }
    }

    /// The device buffer, if it is one.
    pub const fn device(&self) -> Option<DeviceBuf> {
        match self {
            Buffer::Device(d) => Some(*d),
            Buffer::Host(_) => None,
        }
    }

    /// Its address, as an integer.
    pub fn addr(&self) -> u64 {
        match self {
            Buffer::Host(r) => r.addr() as u64,
            Buffer::Device(d) => d.addr(),
        }
    }
}

impl From<Region> for Buffer {
    fn from(r: Region) -> Buffer {
        Buffer::Host(r)
    }
}

impl From<DeviceBuf> for Buffer {
    fn from(d: DeviceBuf) -> Buffer {
        Buffer::Device(d)
    }
}

impl Span for Buffer {
    fn len(&self) -> usize {
        match self {
            Buffer::Host(r) => r.len(),
            Buffer::Device(d) => d.len(),
        }
    }
    fn sub(&self, off: usize, len: usize) -> Result<Buffer> {
        Ok(match self {
            Buffer::Host(r) => Buffer::Host(r.sub(off, len)?),
            Buffer::Device(d) => Buffer::Device(d.sub(off, len)?),
        })
    }
}

/// A CUDA stream (`CUstream` / `cudaStream_t`, as an integer): the caller
/// keeps it alive while calls on it are pending.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CudaStream(pub u64);

impl CudaStream {
    /// The legacy default stream (`0`).
    pub const DEFAULT: CudaStream = CudaStream(0);

    /// A stream from its raw handle.
    pub const fn from_raw(handle: u64) -> CudaStream {
        CudaStream(handle)
    }
}

/// `dst = src` (same length; they may overlap).
pub fn copy(dst: &Region, src: &Region) -> Result<()> {
    dst.copy_from(src)
}

/// `dst = a ⊕ b`, where `a` and `b` are regions or an arrived piece of a
/// message (`Operand::Bytes`); `dst` may be the very same bytes as an
/// operand, and partial overlap is handled with a copy.
pub fn reduce(dtype: DataType, op: ReduceOp, dst: &Region, a: Operand<'_>, b: Operand<'_>) -> Result<()> {
    let aliases = |o: &Operand<'_>| matches!(o, Operand::Region(r) if r.overlaps(dst));
    if let (Operand::Region(r), false) = (&a, aliases(&b))
        && r.same(dst)
    {
        return b.read(|bb| dst.write(|d| kernels::reduce_into(dtype, op, d, bb)))?;
    }
    if let (Operand::Region(r), false) = (&b, aliases(&a))
        && r.same(dst)
    {
        return a.read(|aa| dst.write(|d| kernels::reduce_into(dtype, op, d, aa)))?;
    }
    if aliases(&a) || aliases(&b) {
        let (ta, tb) = (a.read(<[u8]>::to_vec), b.read(<[u8]>::to_vec));
        return dst.write(|d| kernels::reduce2(dtype, op, d, &ta, &tb))?;
    }
    a.read(|aa| b.read(|bb| dst.write(|d| kernels::reduce2(dtype, op, d, aa, bb))))?
}

/// An operand of [`reduce`]: memory, or bytes already in hand.
pub enum Operand<'a> {
    /// A caller's (or scratch, or a peer's registered) region.
    Region(Region),
    /// Bytes read in place from a connection.
    Bytes(&'a [u8]),
}

impl Operand<'_> {
    fn read<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        match self {
            Operand::Region(r) => r.read(f),
            Operand::Bytes(b) => f(b),
        }
    }
}

/// Writes `bytes` into `dst` at `off`.
pub fn write_at(dst: &Region, off: usize, bytes: &[u8]) -> Result<()> {
    dst.sub(off, bytes.len())?.write(|d| d.copy_from_slice(bytes))
}
