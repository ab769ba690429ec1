//! Driver availability, devices (primary contexts) and loaded kernel modules.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::{CString, c_int, c_void};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use cudarc::driver::{CudaContext, result, sys};
use oxccl_core::DataType;

use crate::args::{CollArgs, ReduceArgs};
use crate::context::bind;
use crate::error::{CudaError, Result, describe, drv, invalid};
use crate::kernels::{self, ENTRY_POINTS, Image, KernelOp};
use crate::program::{MAX_TEAM, P2pArgs, ProgArgs};
use crate::stream::{Event, Stream};

/// Whether the CUDA driver can be used: libcuda loads and `cuInit`
/// succeeds. `Err(CudaError::Unavailable)` with the reason otherwise (no
/// library, `CUDA_ERROR_NO_DEVICE`, …). Never panics; the answer is computed
/// once per process.
pub fn driver_available() -> Result<()> {
    static STATE: OnceLock<Result<()>> = OnceLock::new();
    STATE
        .get_or_init(|| {
            // SAFETY: is_culib_present only tries to dlopen libcuda's candidate
            // names; it calls nothing in the library.
            if !unsafe { sys::is_culib_present() } {
                return Err(CudaError::Unavailable(
                    "libcuda.so.1 not found (no NVIDIA driver on this machine)".to_string(),
                ));
            }
            result::init().map_err(|e| CudaError::Unavailable(format!("cuInit failed: {}", describe(e))))
        })
        .clone()
}

/// The driver's CUDA version as major × 1000 + minor × 10 (12040 for 12.4).
pub fn driver_version() -> Result<u32> {
    driver_available()?;
    let mut v: c_int = 0;
    // SAFETY: the driver is loaded and initialised; `v` is valid for writes.
    unsafe { sys::cuDriverGetVersion(&mut v) }.result().map_err(drv("cuDriverGetVersion"))?;
    Ok(v as u32)
}

/// One CUDA device, through its primary context (the one the CUDA runtime,
/// PyTorch and NCCL use). Cheap to clone; [`Device::open`] of the same
/// ordinal gives the same device (and its module cache) while one is alive.
#[derive(Clone)]
pub struct Device(Arc<DeviceInner>);

struct DeviceInner {
    ctx: Arc<CudaContext>,
    ordinal: usize,
    sm_count: u32,
    arch: u32,
    uuid: [u8; 16],
    name: String,
    mps: bool,
    compute_mode: u32,
    modules: Mutex<HashMap<(DataType, KernelOp), ModuleSlot>>,
}

/// One module of a device: loaded once, by the first thread that asks, while
/// it holds the slot's lock (the others wait for it, never load a copy).
type ModuleSlot = Arc<Mutex<Option<Arc<Module>>>>;

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("ordinal", &self.0.ordinal)
            .field("name", &self.0.name)
            .field("arch", &self.0.arch)
            .field("sm_count", &self.0.sm_count)
            .finish()
    }
}

impl Device {
    /// Number of CUDA devices (0 is an error: [`CudaError::Unavailable`]).
    pub fn count() -> Result<usize> {
        driver_available()?;
        let n = CudaContext::device_count().map_err(drv("cuDeviceGetCount"))?;
        if n <= 0 {
            return Err(CudaError::Unavailable("the driver sees no CUDA device".into()));
        }
        Ok(n as usize)
    }

    /// Opens device `ordinal` (retains its primary context).
    pub fn open(ordinal: usize) -> Result<Device> {
        static OPEN: OnceLock<Mutex<HashMap<usize, Weak<DeviceInner>>>> = OnceLock::new();
        let count = Device::count()?;
        if ordinal >= count {
            return Err(invalid(format!("CUDA device {ordinal} does not exist: this machine has {count}")));
        }
        let mut open = OPEN.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
        if let Some(inner) = open.get(&ordinal).and_then(Weak::upgrade) {
            return Ok(Device(inner));
        }
        let ctx = CudaContext::new(ordinal).map_err(drv("cuDevicePrimaryCtxRetain"))?;
        let attr = |a| ctx.attribute(a).map_err(drv("cuDeviceGetAttribute"));
        let sm_count = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
        let (major, minor) = ctx.compute_capability().map_err(drv("cuDeviceGetAttribute"))?;
        let uuid = ctx.uuid().map_err(drv("cuDeviceGetUuid"))?.bytes.map(|b| b as u8);
        let name = ctx.name().map_err(drv("cuDeviceGetName"))?;
        // Drivers older than CUDA 12.5 do not know the attribute: no MPS then.
        let mps = ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MPS_ENABLED).is_ok_and(|v| v != 0);
        let compute_mode = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_MODE)? as u32;
        let inner = Arc::new(DeviceInner {
            ctx,
            ordinal,
            sm_count,
            arch: (major * 10 + minor) as u32,
            uuid,
            name,
            mps,
            compute_mode,
            modules: Mutex::new(HashMap::new()),
        });
        open.insert(ordinal, Arc::downgrade(&inner));
        Ok(Device(inner))
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.0.ordinal
    }
    /// Streaming multiprocessors.
    pub fn sm_count(&self) -> u32 {
        self.0.sm_count
    }
    /// Compute capability as major × 10 + minor (90 for an H100).
    pub fn arch(&self) -> u32 {
        self.0.arch
    }
    /// The device's UUID (what `nvidia-smi -L` prints), to tell whether two
    /// ranks share a GPU.
    pub fn uuid(&self) -> [u8; 16] {
        self.0.uuid
    }
    /// The device's name.
    pub fn name(&self) -> &str {
        &self.0.name
    }
    /// Whether this process's contexts on the device go through MPS
    /// (`CU_DEVICE_ATTRIBUTE_MPS_ENABLED`; false where the driver predates
    /// the attribute): only then do kernels of different processes run at
    /// the same time; without MPS they are time-sliced.
    pub fn mps_enabled(&self) -> bool {
        self.0.mps
    }
    /// The device's compute mode (`CU_DEVICE_ATTRIBUTE_COMPUTE_MODE`: 0
    /// default, 2 prohibited, 3 exclusive process).
    pub fn compute_mode(&self) -> u32 {
        self.0.compute_mode
    }
    /// The primary context, for callers that also use cudarc directly.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.0.ctx
    }

    /// Makes this device's context current on the calling thread (every
    /// method here does so itself; this is for callers making raw driver calls).
    pub fn bind(&self) -> Result<()> {
        bind(&self.0.ctx)
    }

    /// Waits until all work on the device is done (`cuCtxSynchronize`; no
    /// deadline: prefer [`crate::Event::synchronize`] on a stream).
    pub fn synchronize(&self) -> Result<()> {
        self.0.ctx.synchronize().map_err(drv("cuCtxSynchronize"))
    }

    /// The kernels for `dtype` × `op`, compiled for this device (process-wide
    /// cache, see [`kernels::image`]) and loaded into its context once: the
    /// first thread to ask loads it, resolving every entry point, while the
    /// others asking for the same module wait (see [`Device::preload`]).
    pub fn module(&self, dtype: DataType, op: KernelOp) -> Result<Arc<Module>> {
        let slot = self.slot(dtype, op);
        let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = slot.as_ref() {
            return Ok(m.clone());
        }
        let image = kernels::image(self.0.arch, dtype, op)?;
        let module = match Module::load(&self.0.ctx, &image, dtype, op) {
            Ok(m) => m,
            Err(e) => {
                // An image from the disk cache may be one this driver cannot
                // load (made by a newer NVRTC): compile it here and try once more.
                let fresh = kernels::image_fresh(self.0.arch, dtype, op).map_err(|_| e.clone())?;
                if fresh == *image {
                    return Err(e);
                }
                tracing::warn!("oxccl kernels: {dtype} {op} from the cache did not load ({e}); compiled it again");
                Module::load(&self.0.ctx, &fresh, dtype, op)?
            }
        };
        let module = Arc::new(module);
        *slot = Some(module.clone());
        Ok(module)
    }

    /// The cache slot of module (dtype, op).
    fn slot(&self, dtype: DataType, op: KernelOp) -> ModuleSlot {
        self.0.modules.lock().unwrap_or_else(|p| p.into_inner()).entry((dtype, op)).or_default().clone()
    }

    /// Whether module (dtype, op) is loaded already ([`Device::module`]
    /// returns it without touching the driver). False while another thread
    /// is loading it.
    pub fn loaded(&self, dtype: DataType, op: KernelOp) -> bool {
        let slot = self.slot(dtype, op);
        slot.try_lock().is_ok_and(|s| s.is_some())
    }

    /// Loads the modules `keys` (compiling those not compiled yet, in
    /// parallel) before they are needed.
    ///
    /// Why: loading a module can wait for the work queued in the context
    /// (with lazy loading, the default since CUDA 12.2, while holding the
    /// context's lock). If a kernel that spins until a peer's kernel starts
    /// is queued, and that peer is a thread of this process whose launch
    /// then waits for the lock, nothing moves again. So a collective loads
    /// what it needs while none of its kernels are queued: its set-up
    /// preloads, and a later first use of another module waits for its
    /// earlier kernels first. (`CUDA_MODULE_LOADING=EAGER` would not help a
    /// library: the driver reads it once, at `cuInit`, which the
    /// application may have run long before.)
    pub fn preload(&self, keys: &[(DataType, KernelOp)]) -> Result<()> {
        std::thread::scope(|s| {
            let compiling: Vec<_> = keys
                .iter()
                .filter(|&&(d, o)| !self.loaded(d, o))
                .map(|&(d, o)| s.spawn(move || kernels::image(self.0.arch, d, o).map(|_| ())))
                .collect();
            compiling.into_iter().try_for_each(|h| h.join().unwrap_or_else(|_| Err(invalid("NVRTC panicked"))))
        })?;
        keys.iter().try_for_each(|&(d, o)| self.module(d, o).map(|_| ()))
    }
}

/// The kernels of one (dtype, op) loaded in one context. Launches are
/// asynchronous on the given stream; the stream must belong to the same device.
pub struct Module {
    ctx: Arc<CudaContext>,
    module: sys::CUmodule,
    functions: [sys::CUfunction; ENTRY_POINTS.len()],
    arch: u32,
    dtype: DataType,
    op: KernelOp,
}

// SAFETY: a CUmodule and its CUfunctions are plain handles into a context;
// the driver API is thread-safe and every use binds the context on the
// calling thread first. The module is unloaded once, in Drop.
unsafe impl Send for Module {}
// SAFETY: as above; no method mutates the handles.
unsafe impl Sync for Module {}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Module(arch {}, {} {}, device {})", self.arch, self.dtype, self.op, self.ctx.ordinal())
    }
}

impl Module {
    /// Loads `image` and resolves every entry point (`cuModuleGetFunction`:
    /// with lazy loading, the default since CUDA 12.2, that is what loads a
    /// kernel onto the device; doing it here keeps it off the launch path).
    fn load(ctx: &Arc<CudaContext>, image: &Image, dtype: DataType, op: KernelOp) -> Result<Module> {
        bind(ctx)?;
        let arch = image.arch();
        let text;
        let data: *const c_void = match image {
            Image::Cubin { bytes, .. } => bytes.as_ptr().cast(),
            Image::Ptx { ptx, .. } => {
                text = CString::new(ptx.as_str()).map_err(|_| invalid("PTX contains a NUL byte"))?;
                text.as_ptr().cast()
            }
        };
        // SAFETY: `data` is a CUBIN (an ELF image, which carries its size)
        // or a NUL-terminated PTX text, alive until the call returns; the
        // context is current.
        let module = unsafe { result::module::load_data(data) }.map_err(|e| {
            let mut code = describe(e);
            if e.0 == sys::CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION {
                let nv = kernels::nvrtc_version().map(|(a, b)| format!("{a}.{b}")).unwrap_or_default();
                let dv = driver_version().map(|v| format!("{}.{}", v / 1000, v % 1000 / 10)).unwrap_or_default();
                code.push_str(&format!(
                    "; the PTX comes from NVRTC {nv} but the driver supports CUDA {dv}: use an NVRTC no newer \
                     than the driver, or update the driver"
                ));
            }
            CudaError::Driver { call: "cuModuleLoadData", code }
        })?;
        let mut m =
            Module { ctx: ctx.clone(), module, functions: [std::ptr::null_mut(); ENTRY_POINTS.len()], arch, dtype, op };
        for (i, name) in ENTRY_POINTS.iter().enumerate() {
            let cname = CString::new(*name).map_err(|_| invalid("entry point name contains NUL"))?;
            // SAFETY: `m.module` is a loaded module (unloaded only by m's Drop).
            m.functions[i] = unsafe { result::module::get_function(m.module, cname) }.map_err(|e| {
                CudaError::Driver { call: "cuModuleGetFunction", code: format!("{name}: {}", describe(e)) }
            })?;
        }
        m.settle()?;
        Ok(m)
    }

    /// Makes the first launch of every entry point one that waits for
    /// nothing (as NCCL does for its kernels at init): each function is
    /// loaded now (an attribute query loads it under lazy loading), and the
    /// context's stack is raised to the largest local memory of them (a
    /// launch needing more than the context has resizes it, waiting for
    /// every kernel queued in the context, one that spins until this
    /// thread's peer kernel starts too). Runs where loading runs: while
    /// none of this communicator's kernels are queued.
    fn settle(&self) -> Result<()> {
        let mut local = 0;
        for (i, name) in ENTRY_POINTS.iter().enumerate() {
            let mut v: c_int = 0;
            let attr = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES;
            // SAFETY: the function belongs to this loaded module; `v` is valid for writes.
            unsafe { sys::cuFuncGetAttribute(&mut v, attr, self.functions[i]) }.result().map_err(|e| {
                CudaError::Driver { call: "cuFuncGetAttribute", code: format!("{name}: {}", describe(e)) }
            })?;
            local = local.max(v.max(0) as usize);
        }
        let limit = sys::CUlimit::CU_LIMIT_STACK_SIZE;
        let mut stack: usize = 0;
        // SAFETY: the context is current (bound by `load`); `stack` is valid for writes.
        unsafe { sys::cuCtxGetLimit(&mut stack, limit) }.result().map_err(drv("cuCtxGetLimit"))?;
        if local > stack {
            // SAFETY: as above; raising the stack limit has no other effect.
            unsafe { sys::cuCtxSetLimit(limit, local) }.result().map_err(drv("cuCtxSetLimit"))?;
        }
        Ok(())
    }

    /// The module's element type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }
    /// The module's operator.
    pub fn op(&self) -> KernelOp {
        self.op
    }
    /// The architecture it was compiled for (`sm_XX` or `compute_XX`).
    pub fn arch(&self) -> u32 {
        self.arch
    }

    /// How many blocks of `threads` threads of entry point `entry` one
    /// multiprocessor holds at once (`cuOccupancyMaxActiveBlocksPerMultiprocessor`,
    /// no dynamic shared memory): kernels that wait for each other must all
    /// be resident, so their grids together must fit in `sm_count` × this.
    pub fn max_active_blocks(&self, entry: &str, threads: u32) -> Result<u32> {
        let f = ENTRY_POINTS
            .iter()
            .position(|e| *e == entry)
            .ok_or_else(|| invalid(format!("no entry point {entry} (there are {ENTRY_POINTS:?})")))?;
        bind(&self.ctx)?;
        let mut n: c_int = 0;
        // SAFETY: the function belongs to this loaded module; `n` is valid for writes.
        unsafe { sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut n, self.functions[f], threads as c_int, 0) }
            .result()
            .map_err(|e| CudaError::Driver {
                call: "cuOccupancyMaxActiveBlocksPerMultiprocessor",
                code: format!("{entry}, {threads} threads: {}", describe(e)),
            })?;
        Ok(n.max(0) as u32)
    }

    /// Launches entry point `f` with `params` (pointers to each argument).
    ///
    /// SAFETY (caller): `params` match the entry point's signature and point
    /// to live values (the driver copies them before returning).
    unsafe fn launch(
        &self,
        f: usize,
        stream: &Stream,
        grid: u32,
        block: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        if stream.context().cu_ctx() != self.ctx.cu_ctx() {
            return Err(invalid(format!(
                "stream of device {} used with a module of device {}",
                stream.context().ordinal(),
                self.ctx.ordinal()
            )));
        }
        if grid == 0 || block == 0 || block > 1024 {
            return Err(invalid(format!("{}: launch of {grid} blocks of {block} threads", ENTRY_POINTS[f])));
        }
        bind(&self.ctx)?;
        // SAFETY: the function belongs to this loaded module, the context is
        // current, and the caller vouches for `params`.
        unsafe { result::launch_kernel(self.functions[f], (grid, 1, 1), (block, 1, 1), 0, stream.raw(), params) }
            .map_err(|e| CudaError::Driver {
                call: "cuLaunchKernel",
                code: format!("{}: {}", ENTRY_POINTS[f], describe(e)),
            })
    }

    /// Launches `oxccl_reduce` (after [`ReduceArgs::validate`]).
    ///
    /// # Safety
    /// Every used address in `args` must be device-accessible memory of at
    /// least `count` elements of the module's type, staying valid, and not
    /// written by anyone else, until the kernel has finished.
    pub unsafe fn launch_reduce(&self, stream: &Stream, grid: u32, block: u32, args: &ReduceArgs) -> Result<()> {
        args.validate()?;
        let mut params = [args as *const ReduceArgs as *mut c_void];
        // SAFETY: oxccl_reduce takes one oxccl_reduce_args by value; `args` mirrors it.
        unsafe { self.launch(0, stream, grid, block, &mut params) }
    }

    /// Launches `oxccl_collective` (after [`CollArgs::validate`]). Every rank
    /// of the collective must launch it with the same grid, block and shape.
    ///
    /// # Safety
    /// The windows, flag areas, status word, send and recv buffers must be
    /// valid device-accessible memory of the sizes the collective needs, alive
    /// until the kernel has finished; the flag areas must be zeroed once at
    /// allocation and used by no other kernel meanwhile.
    pub unsafe fn launch_collective(&self, stream: &Stream, grid: u32, block: u32, args: &CollArgs) -> Result<()> {
        args.validate(grid, block)?;
        let mut params = [args as *const CollArgs as *mut c_void];
        // SAFETY: oxccl_collective takes one oxccl_coll_args by value; `args` mirrors it.
        unsafe { self.launch(1, stream, grid, block, &mut params) }
    }

    /// Launches `oxccl_program` (after [`ProgArgs::validate`]): one rank's
    /// program, `args.nchan * args.team` blocks of `block` threads.
    ///
    /// # Safety
    /// Every buffer, FIFO and flag area in `args` must be valid
    /// device-accessible memory of the sizes the program's slices and the
    /// FIFO layout need, alive until the kernel has finished; `args.steps`
    /// and `args.slices` must hold the program encoded by
    /// [`crate::program::DeviceProgram`]; the flag areas must be zeroed once
    /// at allocation and used by no other kernel meanwhile; every rank runs
    /// its part of the same programs in the same order.
    pub unsafe fn launch_program(&self, stream: &Stream, block: u32, args: &ProgArgs) -> Result<()> {
        let grid = args.nchan * args.team;
        args.validate(grid)?;
        if grid == 0 {
            return Ok(());
        }
        let mut params = [args as *const ProgArgs as *mut c_void];
        // SAFETY: oxccl_program takes one oxccl_prog_args by value; `args` mirrors it.
        unsafe { self.launch(4, stream, grid, block, &mut params) }
    }

    /// Launches `oxccl_p2p` (byte module): one rank's group of sends and
    /// receives, `args.nlanes * args.team` blocks of `block` threads.
    ///
    /// # Safety
    /// Every buffer in `args` must be device memory of its length, alive
    /// until the kernel has finished; the FIFO and flag areas as for
    /// [`Module::launch_program`]; the peers launch the matching receives
    /// and sends.
    pub unsafe fn launch_p2p(&self, stream: &Stream, block: u32, args: &P2pArgs) -> Result<()> {
        let grid = args.nlanes * args.team;
        if args.nlanes as usize > crate::program::MAX_CHANNELS || args.team == 0 || args.team as usize > MAX_TEAM {
            return Err(invalid(format!("p2p: {} lanes × team {}", args.nlanes, args.team)));
        }
        if args.timeout_ns == 0 || args.status == 0 || args.slots == 0 || args.slot_bytes == 0 {
            return Err(invalid("p2p: a timeout, a status word and FIFO slots are needed"));
        }
        if grid == 0 {
            return Ok(());
        }
        let mut params = [args as *const P2pArgs as *mut c_void];
        // SAFETY: oxccl_p2p takes one oxccl_p2p_args by value; `args` mirrors it.
        unsafe { self.launch(5, stream, grid, block, &mut params) }
    }

    /// Enqueues `oxccl_signal_host`: after all earlier work on `stream`,
    /// stores `value` into the u64 at device address `word` (host-mapped
    /// memory, see [`crate::HostMapped`]) after a system-wide fence.
    ///
    /// # Safety
    /// `word` must be an 8-byte aligned device address of a live u64.
    pub unsafe fn signal_host(&self, stream: &Stream, word: u64, value: u64) -> Result<()> {
        if word == 0 || !word.is_multiple_of(8) {
            return Err(invalid(format!("signal_host: word address {word:#x} is null or not 8-byte aligned")));
        }
        let mut params = [&word as *const u64 as *mut c_void, &value as *const u64 as *mut c_void];
        // SAFETY: oxccl_signal_host(u64 word, u64 value).
        unsafe { self.launch(2, stream, 1, 1, &mut params) }
    }

    /// Enqueues `oxccl_wait_host`: `stream` waits until the u64 at `word` is
    /// at least `value`, or the abort word (`status[1]`) is set (status code
    /// 2), or `timeout_ns` passes (status code 1, written to `status[0]` if it
    /// is 0).
    ///
    /// # Safety
    /// `word` (u64) and `status` (`u32[2]`) must be live device-accessible
    /// addresses, aligned, until the kernel has finished.
    pub unsafe fn wait_host(&self, stream: &Stream, word: u64, value: u64, status: u64, timeout_ns: u64) -> Result<()> {
        if word == 0 || !word.is_multiple_of(8) || status == 0 || !status.is_multiple_of(4) {
            return Err(invalid(format!(
                "wait_host: word {word:#x} (8-byte aligned) or status {status:#x} (4-byte aligned) is null or misaligned"
            )));
        }
        if timeout_ns == 0 {
            return Err(invalid("wait_host: timeout_ns is 0; every wait needs a deadline"));
        }
        let mut params = [&word, &value, &status, &timeout_ns].map(|p| p as *const u64 as *mut c_void);
        // SAFETY: oxccl_wait_host(u64 word, u64 value, u64 status, u64 timeout_ns).
        unsafe { self.launch(3, stream, 1, 1, &mut params) }
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        if bind(&self.ctx).is_ok() {
            // SAFETY: the module was loaded in this context and is unloaded once, here.
            let _ = unsafe { result::module::unload(self.module) };
        }
    }
}

impl Device {
    /// The legacy default stream (`NULL`, NCCL's "stream 0").
    pub fn null_stream(&self) -> Stream {
        Stream::null(self.context())
    }

    /// A new non-blocking stream, destroyed when the last clone is dropped.
    ///
    /// Created with `cuStreamCreate` directly, not cudarc's `new_stream`:
    /// that one calls `cuCtxSynchronize` when the context's first cudarc
    /// stream is made, which waits for every kernel in the context, a
    /// collective's spinning kernel too (it would wait forever for a peer
    /// thread stuck here).
    pub fn new_stream(&self) -> Result<Stream> {
        Stream::create(self.context())
    }

    /// Wraps a caller's stream handle (a `cudaStream_t` / `CUstream` from C,
    /// PyTorch, …) without taking ownership.
    ///
    /// # Safety
    /// `raw` must be null or a stream of this device's primary context that
    /// stays alive while the returned `Stream` (or a clone) is used.
    pub unsafe fn wrap_stream(&self, raw: *mut c_void) -> Stream {
        Stream::borrowed(self.context(), raw)
    }

    /// A new event (no timing).
    pub fn new_event(&self) -> Result<Event> {
        Event::create(self.context())
    }
}
