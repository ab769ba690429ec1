//! Device memory, CUDA IPC mappings, host-mapped words, pinned staging
//! buffers, and checks of caller-supplied device ranges.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64};

use cudarc::driver::{CudaContext, sys};

use crate::context::bind;
use crate::device::Device;
use crate::error::{CudaError, Result, describe, drv, invalid};

/// Size of a CUDA IPC memory handle (`CUipcMemHandle`).
pub const IPC_HANDLE_BYTES: usize = 64;

/// An owned device allocation (`cuMemAlloc`), freed on drop. The memory is
/// reached only through its address (kernels, copies): the host never gets a
/// Rust reference to it.
pub struct DevMem {
    ctx: Arc<CudaContext>,
    addr: u64,
    len: usize,
}

impl std::fmt::Debug for DevMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DevMem({:#x}, {} bytes, device {})", self.addr, self.len, self.ctx.ordinal())
    }
}

impl Device {
    /// Allocates `bytes` (> 0) of device memory, uninitialised.
    pub fn alloc(&self, bytes: usize) -> Result<DevMem> {
        if bytes == 0 {
            return Err(invalid("device allocation of 0 bytes"));
        }
        bind(self.context())?;
        let mut addr: sys::CUdeviceptr = 0;
        // SAFETY: the context is current; `addr` is valid for writes.
        unsafe { sys::cuMemAlloc_v2(&mut addr, bytes) }.result().map_err(|e| CudaError::Driver {
            call: "cuMemAlloc",
            code: format!("{bytes} bytes on device {}: {}", self.ordinal(), describe(e)),
        })?;
        Ok(DevMem { ctx: self.context().clone(), addr, len: bytes })
    }

    /// Allocates `bytes` (> 0) of device memory set to zero (synchronously).
    pub fn alloc_zeroed(&self, bytes: usize) -> Result<DevMem> {
        let mem = self.alloc(bytes)?;
        // SAFETY: `mem` is a live allocation of `bytes` bytes; the context is current.
        unsafe { sys::cuMemsetD8_v2(mem.addr, 0, bytes) }.result().map_err(drv("cuMemsetD8"))?;
        // The memset is asynchronous to the host; wait so that kernels on any
        // stream (non-blocking ones too) see zeros.
        sync_legacy_stream()?;
        Ok(mem)
    }

    /// Maps a peer process's allocation from its [`DevMem::ipc_handle`]
    /// (`cuIpcOpenMemHandle` with lazy peer access). A handle exported by this
    /// same process cannot be opened (CUDA's rule): ranks of one process share
    /// plain device addresses instead.
    pub fn open_ipc(&self, handle: &[u8; IPC_HANDLE_BYTES]) -> Result<IpcMapping> {
        bind(self.context())?;
        let h = sys::CUipcMemHandle { reserved: handle.map(|b| b as std::ffi::c_char) };
        let mut addr: sys::CUdeviceptr = 0;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: the context is current; `addr` is valid for writes; a bad
        // handle is reported by the driver as an error.
        unsafe { sys::cuIpcOpenMemHandle_v2(&mut addr, h, flags) }.result().map_err(|e| CudaError::Driver {
            call: "cuIpcOpenMemHandle",
            code: format!(
                "{} (handles exported by this same process cannot be opened; the exporting process must \
                 keep the allocation alive)",
                describe(e)
            ),
        })?;
        let mut mapping = IpcMapping { ctx: self.context().clone(), addr, len: 0 };
        mapping.len = range_of(addr)?.1;
        Ok(mapping)
    }

    /// `bytes` (> 0, rounded up to 8) of zeroed pinned host memory that kernels
    /// reach at [`HostMapped::dev_addr`] (`cuMemHostAlloc` with
    /// `PORTABLE | DEVICEMAP`): flags and status words shared by the host and
    /// the GPU.
    pub fn host_mapped(&self, bytes: usize) -> Result<HostMapped> {
        Ok(HostMapped(self.host_alloc(bytes.checked_add(7).ok_or_else(|| invalid("size overflows"))? & !7)?))
    }

    /// `bytes` (> 0) of zeroed pinned host memory for staging copies
    /// (`cuMemHostAlloc` with `PORTABLE | DEVICEMAP`).
    pub fn pinned(&self, bytes: usize) -> Result<Pinned> {
        Ok(Pinned(self.host_alloc(bytes)?))
    }

    /// `bytes` of zeroed pinned, device-mapped host memory.
    fn host_alloc(&self, bytes: usize) -> Result<HostAlloc> {
        if bytes == 0 {
            return Err(invalid("pinned host allocation of 0 bytes"));
        }
        bind(self.context())?;
        let mut host: *mut c_void = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: the context is current; `host` is valid for writes.
        unsafe { sys::cuMemHostAlloc(&mut host, bytes, flags) }.result().map_err(|e| CudaError::Driver {
            call: "cuMemHostAlloc",
            code: format!("{bytes} bytes: {}", describe(e)),
        })?;
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: `host` is a DEVICEMAP allocation; `dev` is valid for writes.
        if let Err(e) = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0) }.result() {
            // SAFETY: `host` came from cuMemHostAlloc above and is freed once.
            let _ = unsafe { sys::cuMemFreeHost(host) };
            return Err(drv("cuMemHostGetDevicePointer")(e));
        }
        // SAFETY: `host` is a fresh allocation of `bytes` bytes nobody else knows yet.
        unsafe { std::ptr::write_bytes(host.cast::<u8>(), 0, bytes) };
        Ok(HostAlloc { ctx: self.context().clone(), host: host.cast(), dev, len: bytes })
    }

    /// Checks that `addr..addr+bytes` lies inside memory the driver knows (one
    /// allocation, or adjacent mappings; device memory of this device, or
    /// pinned / host-mapped memory),
    /// with `cuPointerGetAttribute` (range start and size). `bytes == 0` is
    /// always fine. The error names the address, the size and what is wrong.
    pub fn check_device_range(&self, addr: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        bind(self.context())?;
        let (start, size) = range_of(addr).map_err(|e| {
            invalid(format!(
                "buffer at {addr:#x} ({bytes} bytes) is not memory CUDA knows (cudaMalloc, cuMemAlloc, \
                 pinned or registered host memory): {e}"
            ))
        })?;
        let end = addr
            .checked_add(bytes as u64)
            .ok_or_else(|| invalid(format!("buffer at {addr:#x} ({bytes} bytes) wraps around the address space")))?;
        // A buffer may span adjacent mappings (cuMemMap, as PyTorch's
        // expandable segments make): walk the ranges while they abut.
        let mut range_end = start + size as u64;
        while range_end < end {
            match range_of(range_end) {
                Ok((next, next_size)) if next == range_end && next_size > 0 => range_end = next + next_size as u64,
                _ => {
                    return Err(invalid(format!(
                        "buffer at {addr:#x} ({bytes} bytes) runs past the end of its allocation \
                         ({start:#x}, {size} bytes) by {} bytes",
                        end - range_end
                    )));
                }
            }
        }
        let mut mem_type: u32 = 0;
        // SAFETY: MEMORY_TYPE writes one CUmemorytype (u32) into `mem_type`.
        let r = unsafe {
            sys::cuPointerGetAttribute(
                (&mut mem_type as *mut u32).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                addr,
            )
        };
        r.result().map_err(drv("cuPointerGetAttribute"))?;
        if mem_type == sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
            let mut ordinal: i32 = -1;
            // SAFETY: DEVICE_ORDINAL writes one int into `ordinal`.
            let r = unsafe {
                sys::cuPointerGetAttribute(
                    (&mut ordinal as *mut i32).cast(),
                    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                    addr,
                )
            };
            r.result().map_err(drv("cuPointerGetAttribute"))?;
            if ordinal >= 0 && ordinal as usize != self.ordinal() {
                return Err(invalid(format!(
                    "buffer at {addr:#x} ({bytes} bytes) is on CUDA device {ordinal}, not on device {} of this \
                     communicator",
                    self.ordinal()
                )));
            }
        }
        Ok(())
    }
}

/// The ordinal of the GPU that holds the memory at `addr` (what a
/// communicator's first device call runs on). An error when the driver
/// does not know the address.
pub fn device_of(addr: u64) -> Result<usize> {
    crate::driver_available()?;
    Device::open(0)?.bind()?;
    let mut ordinal: i32 = -1;
    // SAFETY: DEVICE_ORDINAL writes one int into `ordinal`; a context is
    // current.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut ordinal as *mut i32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            addr,
        )
    };
    match (r.result(), usize::try_from(ordinal)) {
        (Ok(()), Ok(o)) => Ok(o),
        (r, _) => Err(invalid(format!(
            "{addr:#x} is not memory CUDA knows (cudaMalloc, cuMemAlloc, pinned or registered host memory){}",
            r.err().map_or(String::new(), |e| format!(": {}", describe(e)))
        ))),
    }
}

/// Whether `addr` is memory a GPU holds (`cudaMalloc`, `cuMemAlloc`,
/// managed memory): `false` for host memory (pageable, pinned or
/// registered, which the host reads directly), for addresses the driver
/// does not know, and on machines without a driver. Never binds a context.
pub fn is_device_memory(addr: u64) -> bool {
    if crate::driver_available().is_err() || addr == 0 {
        return false;
    }
    let mut kind: u32 = 0;
    // SAFETY: MEMORY_TYPE writes one unsigned int into `kind`; with unified
    // addressing the driver answers for any address without a current
    // context (an unknown address is an error, not a fault).
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut kind as *mut u32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            addr,
        )
    };
    r.result().is_ok() && kind == sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32
}

/// Copies `dst.len()` bytes of device memory at `addr` to `dst`
/// (blocking: a pre-multiplication scalar, a small read). Binds the
/// primary context of the device holding `addr`.
pub fn read_device(addr: u64, dst: &mut [u8]) -> Result<()> {
    let dev = Device::open(device_of(addr)?)?;
    dev.bind()?;
    let (start, size) = range_of(addr)?;
    if addr + dst.len() as u64 > start + size as u64 {
        return Err(invalid(format!("{} bytes at {addr:#x} run past the allocation holding them", dst.len())));
    }
    // SAFETY: the range lies inside a live device allocation (checked just
    // now); `dst` is writable for its length.
    unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), addr, dst.len()) }.result().map_err(drv("cuMemcpyDtoH"))
}

/// Allocates `bytes` of device memory on the device current in the
/// calling thread (else device 0) for a caller that frees it with
/// [`free_device`] (`ncclMemAlloc`).
pub fn alloc_device(bytes: usize) -> Result<u64> {
    let dev = Device::open(current_device().unwrap_or(0))?;
    dev.bind()?;
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: a context is current; `p` receives the allocation.
    unsafe { sys::cuMemAlloc_v2(&mut p, bytes.max(1)) }.result().map_err(drv("cuMemAlloc"))?;
    Ok(p)
}

/// Frees memory from [`alloc_device`].
pub fn free_device(addr: u64) -> Result<()> {
    let dev = Device::open(device_of(addr)?)?;
    dev.bind()?;
    // SAFETY: the caller passes an allocation from alloc_device, freed once.
    unsafe { sys::cuMemFree_v2(addr) }.result().map_err(drv("cuMemFree"))
}

/// The device of the calling thread's current context (what the CUDA
/// runtime's `cudaGetDevice` reports once the thread has used a device);
/// `None` without a driver or a current context.
pub fn current_device() -> Option<usize> {
    crate::driver_available().ok()?;
    let mut dev: sys::CUdevice = -1;
    // SAFETY: cuCtxGetDevice writes one CUdevice; with no current context
    // it returns an error and writes nothing.
    let r = unsafe { sys::cuCtxGetDevice(&mut dev) };
    r.result().ok()?;
    usize::try_from(dev).ok()
}

/// Waits for the legacy default stream (where the synchronous copies and
/// memsets go); a context must be current.
fn sync_legacy_stream() -> Result<()> {
    // SAFETY: the null stream always exists in the current context.
    unsafe { cudarc::driver::result::stream::synchronize(std::ptr::null_mut()) }.map_err(drv("cuStreamSynchronize"))
}

/// (start, size) of the allocation holding `addr`; a context must be current.
fn range_of(addr: u64) -> Result<(u64, usize)> {
    let mut start: sys::CUdeviceptr = 0;
    let mut size: usize = 0;
    // SAFETY: RANGE_START_ADDR writes a CUdeviceptr, RANGE_SIZE a size_t;
    // both pointers are valid for those writes.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut start as *mut u64).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            addr,
        )
        .result()
        .and_then(|()| {
            sys::cuPointerGetAttribute(
                (&mut size as *mut usize).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                addr,
            )
            .result()
        })
    };
    r.map_err(drv("cuPointerGetAttribute"))?;
    Ok((start, size))
}

impl DevMem {
    /// Device address.
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Always false (allocations have at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The CUDA IPC handle another process opens with [`Device::open_ipc`].
    pub fn ipc_handle(&self) -> Result<[u8; IPC_HANDLE_BYTES]> {
        bind(&self.ctx)?;
        let mut h = sys::CUipcMemHandle { reserved: [0; IPC_HANDLE_BYTES] };
        // SAFETY: `self.addr` is the base of a live cuMemAlloc allocation; `h` is valid for writes.
        unsafe { sys::cuIpcGetMemHandle(&mut h, self.addr) }.result().map_err(drv("cuIpcGetMemHandle"))?;
        Ok(h.reserved.map(|c| c as u8))
    }

    fn check(&self, what: &str, offset: usize, bytes: usize) -> Result<()> {
        if offset.checked_add(bytes).is_none_or(|end| end > self.len) {
            return Err(invalid(format!(
                "{what}: {bytes} bytes at offset {offset} exceed the {} bytes allocated",
                self.len
            )));
        }
        Ok(())
    }

    /// Copies `src` to `offset` through the legacy default stream and waits
    /// until it has landed (blocking; for set-up and tests, not hot paths).
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.check("DevMem::write", offset, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        bind(&self.ctx)?;
        // SAFETY: the range lies inside this live allocation (checked); `src` is readable.
        unsafe { sys::cuMemcpyHtoD_v2(self.addr + offset as u64, src.as_ptr().cast(), src.len()) }
            .result()
            .map_err(drv("cuMemcpyHtoD"))?;
        sync_legacy_stream()
    }

    /// Copies from `offset` into `dst` (blocking, like [`DevMem::write`]).
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check("DevMem::read", offset, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        bind(&self.ctx)?;
        // SAFETY: the range lies inside this live allocation (checked); `dst` is writable.
        unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), self.addr + offset as u64, dst.len()) }
            .result()
            .map_err(drv("cuMemcpyDtoH"))
    }
}

impl Drop for DevMem {
    fn drop(&mut self) {
        if bind(&self.ctx).is_ok() {
            // SAFETY: the allocation came from cuMemAlloc and is freed once, here.
            let _ = unsafe { sys::cuMemFree_v2(self.addr) };
        }
    }
}

/// A peer process's allocation mapped into this one (closed on drop).
pub struct IpcMapping {
    ctx: Arc<CudaContext>,
    addr: u64,
    len: usize,
}

impl std::fmt::Debug for IpcMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IpcMapping({:#x}, {} bytes)", self.addr, self.len)
    }
}

impl IpcMapping {
    /// Address of the mapping in this process.
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Size of the mapped allocation.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the mapping is empty (never, for a real allocation).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        if bind(&self.ctx).is_ok() {
            // SAFETY: the address came from cuIpcOpenMemHandle and is closed once, here.
            let _ = unsafe { sys::cuIpcCloseMemHandle(self.addr) };
        }
    }
}

/// A `cuMemHostAlloc` allocation (page-locked, mapped for the device),
/// freed once when dropped.
struct HostAlloc {
    ctx: Arc<CudaContext>,
    host: *mut u8,
    dev: u64,
    len: usize,
}

// SAFETY: a HostAlloc is an address pair and a length; who may touch the
// bytes is the wrapping type's contract (atomics only, or `unsafe` copies).
// Freed once, in Drop.
unsafe impl Send for HostAlloc {}
// SAFETY: as above.
unsafe impl Sync for HostAlloc {}

impl Drop for HostAlloc {
    fn drop(&mut self) {
        let _ = bind(&self.ctx);
        // SAFETY: `host` came from cuMemHostAlloc and is freed once, here.
        let _ = unsafe { sys::cuMemFreeHost(self.host.cast()) };
    }
}

/// Pinned host memory mapped for the device: the host reads and writes it
/// only through atomics ([`HostMapped::u32s`], [`HostMapped::u64s`]; use one
/// width per word), kernels at [`HostMapped::dev_addr`].
pub struct HostMapped(HostAlloc);

impl HostMapped {
    /// The address kernels use.
    pub fn dev_addr(&self) -> u64 {
        self.0.dev
    }
    /// Bytes (a multiple of 8).
    pub fn len(&self) -> usize {
        self.0.len
    }
    /// Always false.
    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }
    /// The memory as u32 words (word `i` is at `dev_addr() + 4 i`).
    pub fn u32s(&self) -> &[AtomicU32] {
        // SAFETY: `host` is page-aligned, `len` bytes long, live as long as
        // `self`, and only ever accessed through atomics (or by the device).
        unsafe { std::slice::from_raw_parts(self.0.host.cast::<AtomicU32>(), self.0.len / 4) }
    }
    /// The memory as u64 words (word `i` is at `dev_addr() + 8 i`).
    pub fn u64s(&self) -> &[AtomicU64] {
        // SAFETY: as for u32s; `len` is a multiple of 8.
        unsafe { std::slice::from_raw_parts(self.0.host.cast::<AtomicU64>(), self.0.len / 8) }
    }
}

/// Pinned host memory for staging copies (raw pointer and length; the host
/// touches it only while no copy or kernel uses the bytes it touches).
pub struct Pinned(HostAlloc);

impl Pinned {
    /// Host address (for `memcpy_htod`/`memcpy_dtoh`, or RDMA registration).
    pub fn as_ptr(&self) -> *mut u8 {
        self.0.host
    }
    /// The address kernels use.
    pub fn dev_addr(&self) -> u64 {
        self.0.dev
    }
    /// Bytes.
    pub fn len(&self) -> usize {
        self.0.len
    }
    /// Always false.
    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }

    fn check(&self, what: &str, offset: usize, bytes: usize) -> Result<()> {
        if offset.checked_add(bytes).is_none_or(|end| end > self.0.len) {
            return Err(invalid(format!(
                "{what}: {bytes} bytes at offset {offset} exceed the {} bytes pinned",
                self.0.len
            )));
        }
        Ok(())
    }

    /// Copies `src` into the buffer at `offset` (bounds checked).
    ///
    /// # Safety
    /// No copy, kernel or other thread may read or write those bytes meanwhile.
    pub unsafe fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.check("Pinned::write", offset, src.len())?;
        // SAFETY: in bounds (checked); exclusive access is the caller's promise.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.0.host.add(offset), src.len()) };
        Ok(())
    }

    /// Copies the buffer's bytes at `offset` into `dst` (bounds checked).
    ///
    /// # Safety
    /// No copy, kernel or other thread may write those bytes meanwhile.
    pub unsafe fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check("Pinned::read", offset, dst.len())?;
        // SAFETY: in bounds (checked); no concurrent writer is the caller's promise.
        unsafe { std::ptr::copy_nonoverlapping(self.0.host.add(offset), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }
}
