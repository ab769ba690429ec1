//! The kernel sources (`cuda/`, embedded) and their compilation to PTX with
//! NVRTC: one module per (architecture, data type, operator), compiled once
//! per process ([`ptx`] caches; [`compile`] does not).
//!
//! NVRTC runs without a GPU; it is loaded at run time (`libnvrtc.so.13` or
//! `.12`): from `OXCCL_NVRTC_LIB` (the library or its directory) when set,
//! else through the loader path (`LD_LIBRARY_PATH`, ldconfig), else from the
//! usual pip and toolkit locations ([`nvrtc_available`] says where it
//! looked). Its log must be empty: a warning fails the build like an error.
//!
//! A device gets a CUBIN of its exact architecture when this NVRTC can
//! target it (the driver loads it as is: no JIT at module load), else the
//! PTX of the closest lower architecture ([`image`]).
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::nvrtc::{result as nvrtc, sys as nsys};
use oxccl_core::DataType;

use crate::cache::{DiskCache, Key, Lookup};
use crate::error::{CudaError, Result, invalid};
pub use crate::op::KernelOp;
pub(crate) use crate::source::options_for;
pub use crate::source::{ENTRY_POINTS, SOURCES, options, source};

/// PTX text of one module, as NVRTC produced it (no trailing NUL).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ptx(pub String);

impl Ptx {
    /// The PTX text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Whether NVRTC can be loaded: `Err(CudaError::Unavailable)` saying where
/// it was looked for otherwise. Never panics; the search runs once per
/// process:
///
/// 1. `OXCCL_NVRTC_LIB`, when set: that library (`…/libnvrtc.so.13`) or the
///    newest `libnvrtc.so.*` in that directory, and nothing else;
/// 2. the loader path (`LD_LIBRARY_PATH`, ldconfig), under the names cudarc
///    tries (`libnvrtc.so`, `.13`, `.12`, …);
/// 3. pip's wheels (`nvidia/cu13/lib`, `nvidia/cuda_nvrtc/lib`,
///    `nvidia/cu12/lib`) of the `python3` on `PATH`, of `$VIRTUAL_ENV` and
///    of `$CONDA_PREFIX`; then `$CUDA_HOME`, `$CUDA_PATH` and
///    `/usr/local/cuda` (`lib64`, `lib`).
///
/// A library found in 1 or 3 is loaded by its full path (with the
/// `libnvrtc-builtins.so.*` beside it, which NVRTC opens by name when it
/// compiles); cudarc's later lookup by name then finds the loaded one
/// through its soname. Caveat: a `libnvrtc.so` on the loader path is
/// still the one cudarc takes first (it tries that name before `.13`).
pub fn nvrtc_available() -> Result<()> {
    static FOUND: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    FOUND.get_or_init(locate::find).clone().map_err(CudaError::Unavailable)
}

/// Finding libnvrtc off the loader path ([`nvrtc_available`]).
mod locate {
    use std::path::{Path, PathBuf};
    use std::process::{Command, Stdio};
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    use cudarc::nvrtc::sys as nsys;

    /// Whether cudarc finds NVRTC under one of its names.
    fn present() -> bool {
        // SAFETY: is_culib_present only tries to dlopen NVRTC's candidate
        // names (and closes what it opened); it calls nothing in the library.
        unsafe { nsys::is_culib_present() }
    }

    /// Libraries loaded by path, kept loaded for the life of the process.
    static LOADED: Mutex<Vec<libloading::Library>> = Mutex::new(Vec::new());

    /// Loads `path` (and the NVRTC builtins beside it); an error names it.
    fn load(path: &Path) -> std::result::Result<(), String> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut libs = Vec::new();
        for p in builtins_in(dir).into_iter().chain([path.to_path_buf()]) {
            // SAFETY: loading NVRTC runs only its (trivial) initialisers;
            // the library stays loaded for the life of the process.
            match unsafe { libloading::Library::new(&p) } {
                Ok(l) => libs.push(l),
                Err(e) => return Err(format!("{}: {e}", p.display())),
            }
        }
        LOADED.lock().unwrap_or_else(|p| p.into_inner()).extend(libs);
        Ok(())
    }

    /// The major version in a name like `libnvrtc.so.13` (`libnvrtc.so`: 0).
    fn major(name: &str) -> Option<u32> {
        let rest = name.strip_prefix("libnvrtc.so")?;
        if rest.is_empty() {
            return Some(0);
        }
        rest.strip_prefix('.')?.split('.').next()?.parse().ok()
    }

    /// The newest `libnvrtc.so*` in `dir` (not the `.alt` variant, not the builtins).
    pub(super) fn nvrtc_in(dir: &Path) -> Option<PathBuf> {
        let names = std::fs::read_dir(dir).ok()?.filter_map(|e| e.ok()?.file_name().into_string().ok());
        let best = names.filter_map(|n| Some((major(&n)?, n))).max()?;
        Some(dir.join(best.1))
    }

    /// The `libnvrtc-builtins.so.*` files in `dir` (not the `.alt` variants).
    pub(super) fn builtins_in(dir: &Path) -> Vec<PathBuf> {
        let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
        let mut v: Vec<PathBuf> = rd
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with("libnvrtc-builtins.so."))
            .map(|n| dir.join(n))
            .collect();
        v.sort();
        v
    }

    /// The directories where pip's NVRTC wheels put the library, under the
    /// `nvidia` package directory `root`.
    pub(super) fn wheel_dirs(root: &Path) -> [PathBuf; 3] {
        ["cu13/lib", "cuda_nvrtc/lib", "cu12/lib"].map(|d| root.join(d))
    }

    /// The `nvidia` package directories of the `python3` on `PATH` (empty
    /// if there is none, or it takes more than 10 s).
    fn python_roots() -> Vec<PathBuf> {
        let code = "import nvidia; print('\\n'.join(list(nvidia.__path__)))";
        let Ok(mut child) = Command::new("python3")
            .args(["-c", code])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
        else {
            return Vec::new();
        };
        let start = Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if start.elapsed() < Duration::from_secs(10) => std::thread::sleep(Duration::from_millis(10)),
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Vec::new();
                }
            }
        }
        let mut out = String::new();
        if let Some(mut s) = child.stdout.take() {
            let _ = std::io::Read::read_to_string(&mut s, &mut out);
        }
        out.lines().filter(|l| !l.trim().is_empty()).map(|l| PathBuf::from(l.trim())).collect()
    }

    /// The `site-packages/nvidia` directories under an environment prefix.
    fn prefix_roots(prefix: &Path) -> Vec<PathBuf> {
        let Ok(rd) = std::fs::read_dir(prefix.join("lib")) else { return Vec::new() };
        let mut v: Vec<PathBuf> = rd
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
            .map(|e| e.path().join("site-packages/nvidia"))
            .collect();
        v.sort();
        v
    }

    /// Every directory to look in after the loader path, in order.
    fn search_dirs() -> Vec<PathBuf> {
        let mut roots = python_roots();
        for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
            if let Some(p) = std::env::var_os(var).filter(|p| !p.is_empty()) {
                roots.extend(prefix_roots(Path::new(&p)));
            }
        }
        let mut dirs: Vec<PathBuf> = roots.iter().flat_map(|r| wheel_dirs(r)).collect();
        let mut toolkits: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH"]
            .iter()
            .filter_map(|v| std::env::var_os(v).filter(|p| !p.is_empty()).map(PathBuf::from))
            .collect();
        toolkits.push(PathBuf::from("/usr/local/cuda"));
        dirs.extend(toolkits.iter().flat_map(|t| [t.join("lib64"), t.join("lib")]));
        let mut seen = std::collections::HashSet::new();
        dirs.retain(|d| seen.insert(d.clone()));
        dirs
    }

    /// The search of [`super::nvrtc_available`]: `Err` says where it looked.
    pub(super) fn find() -> std::result::Result<(), String> {
        const HINT: &str = "set OXCCL_NVRTC_LIB to libnvrtc.so.* (or its directory), or put its directory on \
                            LD_LIBRARY_PATH (pip install nvidia-cuda-nvrtc-cu12, or nvidia-cuda-nvrtc for CUDA 13, \
                            ships one)";
        if let Some(v) = std::env::var_os("OXCCL_NVRTC_LIB").filter(|v| !v.is_empty()) {
            let p = PathBuf::from(&v);
            let lib = if p.is_dir() { nvrtc_in(&p) } else { Some(p.clone()) };
            let Some(lib) = lib else {
                return Err(format!("OXCCL_NVRTC_LIB={}: no libnvrtc.so* in that directory", p.display()));
            };
            load(&lib).map_err(|e| format!("OXCCL_NVRTC_LIB={}: cannot load {e}", p.display()))?;
            return if present() {
                Ok(())
            } else {
                Err(format!(
                    "OXCCL_NVRTC_LIB={}: loaded {}, but its soname is none of libnvrtc.so.13/.12 that cudarc \
                     looks up",
                    p.display(),
                    lib.display()
                ))
            };
        }
        if present() {
            return Ok(());
        }
        let mut looked = vec!["the loader path (LD_LIBRARY_PATH, ldconfig)".to_string()];
        let mut failed = Vec::new();
        for dir in search_dirs() {
            looked.push(dir.display().to_string());
            let Some(lib) = nvrtc_in(&dir) else { continue };
            match load(&lib) {
                Ok(()) if present() => return Ok(()),
                Ok(()) => failed.push(format!("{} loaded but not under a name cudarc looks up", lib.display())),
                Err(e) => failed.push(format!("cannot load {e}")),
            }
        }
        let failed = if failed.is_empty() { String::new() } else { format!(" ({})", failed.join("; ")) };
        Err(format!("libnvrtc.so (.13 or .12) not found; looked in {}{failed}; {HINT}", looked.join(", ")))
    }
}

/// NVRTC's version (major, minor).
pub fn nvrtc_version() -> Result<(u32, u32)> {
    nvrtc_available()?;
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: NVRTC is present (checked above); both pointers are valid for writes.
    let r = unsafe { nsys::nvrtcVersion(&mut major, &mut minor) };
    r.result().map_err(|e| CudaError::Unavailable(format!("nvrtcVersion failed: {:?}", e.0)))?;
    Ok((major as u32, minor as u32))
}

/// The `compute_XX` numbers this NVRTC can compile for, ascending.
pub fn supported_archs() -> Result<Vec<u32>> {
    nvrtc_available()?;
    let mut n: c_int = 0;
    // SAFETY: NVRTC is present; `n` is valid for writes.
    let r = unsafe { nsys::nvrtcGetNumSupportedArchs(&mut n) };
    r.result().map_err(|e| CudaError::Unavailable(format!("nvrtcGetNumSupportedArchs failed: {:?}", e.0)))?;
    let mut archs = vec![0 as c_int; n.max(0) as usize];
    // SAFETY: `archs` has room for the `n` entries NVRTC writes.
    let r = unsafe { nsys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) };
    r.result().map_err(|e| CudaError::Unavailable(format!("nvrtcGetSupportedArchs failed: {:?}", e.0)))?;
    let mut archs: Vec<u32> = archs.into_iter().filter_map(|a| u32::try_from(a).ok()).collect();
    archs.sort_unstable();
    Ok(archs)
}

/// The architecture to compile for on a device of compute capability
/// `device_arch` (major × 10 + minor): the highest one NVRTC supports that is
/// not above the device's (PTX runs on later devices through the driver's JIT).
pub fn arch_for_device(device_arch: u32) -> Result<u32> {
    let archs = supported_archs()?;
    archs.iter().rev().copied().find(|&a| a <= device_arch).ok_or_else(|| {
        CudaError::Unavailable(format!(
            "this NVRTC compiles for compute_{archs:?}, none of which runs on a device of compute capability \
             {}.{}",
            device_arch / 10,
            device_arch % 10
        ))
    })
}

/// Destroys an NVRTC program when dropped.
struct Program(nsys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by nvrtcCreateProgram and is destroyed once, here.
        let _ = unsafe { nvrtc::destroy_program(self.0) };
    }
}

/// NVRTC's log of `prog`, trimmed of NULs and white space.
fn program_log(prog: &Program) -> String {
    // SAFETY: `prog` is a live program.
    match unsafe { nvrtc::get_program_log(prog.0) } {
        Ok(bytes) => c_chars_to_string(&bytes).trim().to_string(),
        Err(e) => format!("(no log: nvrtcGetProgramLog failed: {:?})", e.0),
    }
}

/// The text up to the first NUL of a `c_char` buffer.
fn c_chars_to_string(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Compiles the module (arch, dtype, op) to PTX, without caching (see
/// [`ptx`]). Errors with [`CudaError::Nvrtc`] and NVRTC's log if compilation
/// fails or logs anything (warnings are errors); with
/// [`CudaError::Unavailable`] if NVRTC cannot be loaded.
pub fn compile(arch: u32, dtype: DataType, op: KernelOp) -> Result<Ptx> {
    if !(30..=1000).contains(&arch) {
        return Err(invalid(format!(
            "architecture {arch} is not a compute capability number like 80 or 90 (major × 10 + minor)"
        )));
    }
    compile_text(&source(), arch, dtype, op)
}

/// [`compile`] of `text` instead of the embedded source.
fn compile_text(text: &str, arch: u32, dtype: DataType, op: KernelOp) -> Result<Ptx> {
    let ptx = compile_program(text, arch, dtype, op, false)?;
    let text = c_chars_to_string(&ptx);
    if text.is_empty() {
        return Err(CudaError::Nvrtc { arch, dtype, op, log: "NVRTC returned empty PTX".into() });
    }
    Ok(Ptx(text))
}

/// Compiles the module (arch, dtype, op) to a CUBIN for the real
/// architecture `sm_<arch>`, without caching (see [`image`]); errors as
/// [`compile`].
pub fn compile_cubin(arch: u32, dtype: DataType, op: KernelOp) -> Result<Vec<u8>> {
    if !(30..=1000).contains(&arch) {
        return Err(invalid(format!(
            "architecture {arch} is not a compute capability number like 80 or 90 (major × 10 + minor)"
        )));
    }
    compile_cubin_text(&source(), arch, dtype, op)
}

/// [`compile_cubin`] of `text`.
fn compile_cubin_text(text: &str, arch: u32, dtype: DataType, op: KernelOp) -> Result<Vec<u8>> {
    let bytes: Vec<u8> = compile_program(text, arch, dtype, op, true)?.into_iter().map(|c| c as u8).collect();
    if !bytes.starts_with(b"\x7fELF") {
        return Err(CudaError::Nvrtc { arch, dtype, op, log: "NVRTC returned a CUBIN that is not ELF".into() });
    }
    Ok(bytes)
}

/// Compiles `text` for `compute_<arch>` (the PTX, NUL-terminated) or,
/// when `cubin`, for `sm_<arch>` (the CUBIN).
fn compile_program(text: &str, arch: u32, dtype: DataType, op: KernelOp, cubin: bool) -> Result<Vec<c_char>> {
    nvrtc_available()?;
    let fail = |log: String| CudaError::Nvrtc { arch, dtype, op, log };
    let src = CString::new(text).map_err(|_| fail("the kernel source contains a NUL byte".into()))?;
    let name: &CStr = c"oxccl.cu";
    let prog =
        Program(nvrtc::create_program(&src, Some(name)).map_err(|e| fail(format!("nvrtcCreateProgram: {:?}", e.0)))?);
    let opts = options_for(arch, dtype, op, cubin);
    // SAFETY: `prog` is live; `src` and `name`, which it refers to, outlive it.
    let compiled = unsafe { nvrtc::compile_program(prog.0, &opts) };
    let log = program_log(&prog);
    if let Err(e) = compiled {
        return Err(fail(format!("{:?} with options {}:\n{log}", e.0, opts.join(" "))));
    }
    if !log.is_empty() {
        return Err(fail(format!("warnings are errors (options {}):\n{log}", opts.join(" "))));
    }
    if !cubin {
        // SAFETY: `prog` is live and compiled.
        return unsafe { nvrtc::get_ptx(prog.0) }.map_err(|e| fail(format!("nvrtcGetPTX: {:?}", e.0)));
    }
    let mut size = 0usize;
    // SAFETY: `prog` is live and compiled; `size` is valid for writes.
    let r = unsafe { nsys::nvrtcGetCUBINSize(prog.0, &mut size) };
    r.result().map_err(|e| fail(format!("nvrtcGetCUBINSize: {:?}", e.0)))?;
    if size == 0 {
        return Err(fail("NVRTC returned an empty CUBIN".into()));
    }
    let mut bytes = vec![0 as c_char; size];
    // SAFETY: `bytes` has room for the `size` bytes NVRTC writes.
    let r = unsafe { nsys::nvrtcGetCUBIN(prog.0, bytes.as_mut_ptr()) };
    r.result().map_err(|e| fail(format!("nvrtcGetCUBIN: {:?}", e.0)))?;
    Ok(bytes)
}

/// One cache slot: filled once by the first thread that compiles it.
type Slot<T> = Arc<Mutex<Option<Arc<T>>>>;

/// A compile cache: (arch, dtype, op) → slot.
type Cache<T> = Mutex<HashMap<(u32, DataType, KernelOp), Slot<T>>>;

/// The value of `key` in `cache`, made by `make` on first use: threads
/// asking for different keys make them in parallel; threads asking for the
/// same one wait for the first. Failures are not cached.
fn cached<T>(
    cache: &OnceLock<Cache<T>>,
    key: (u32, DataType, KernelOp),
    make: impl FnOnce() -> Result<T>,
) -> Result<Arc<T>> {
    let slot: Slot<T> = {
        let mut map = cache.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
        map.entry(key).or_default().clone()
    };
    let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(v) = slot.as_ref() {
        return Ok(v.clone());
    }
    let v = Arc::new(make()?);
    *slot = Some(v.clone());
    Ok(v)
}

/// The PTX of module (arch, dtype, op), compiled on first use and cached for
/// the life of the process. Threads asking for different modules compile in
/// parallel; threads asking for the same one wait for the first. Failures are
/// not cached.
pub fn ptx(arch: u32, dtype: DataType, op: KernelOp) -> Result<Arc<Ptx>> {
    static CACHE: OnceLock<Cache<Ptx>> = OnceLock::new();
    cached(&CACHE, (arch, dtype, op), || compile(arch, dtype, op))
}

/// What a device of compute capability `device_arch` runs, given the
/// architectures NVRTC supports: `(arch, true)` for a CUBIN of its own
/// architecture when NVRTC can target it, else `(arch, false)` for the PTX
/// of the highest supported one below it (`None`: nothing runs there).
pub fn pick_arch(device_arch: u32, supported: &[u32]) -> Option<(u32, bool)> {
    if supported.contains(&device_arch) {
        return Some((device_arch, true));
    }
    supported.iter().copied().filter(|&a| a <= device_arch).max().map(|a| (a, false))
}

/// A compiled module, as the driver loads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Image {
    /// A CUBIN for the device's own architecture `sm_<arch>`: loaded as is.
    Cubin {
        /// The architecture (major × 10 + minor).
        arch: u32,
        /// The ELF image.
        bytes: Vec<u8>,
    },
    /// PTX for `compute_<arch>`: the driver compiles it when loading.
    Ptx {
        /// The virtual architecture (major × 10 + minor).
        arch: u32,
        /// The text.
        ptx: Arc<Ptx>,
    },
}

impl Image {
    /// The architecture it was compiled for.
    pub fn arch(&self) -> u32 {
        match self {
            Image::Cubin { arch, .. } | Image::Ptx { arch, .. } => *arch,
        }
    }

    /// What the driver loads: the ELF image, or the PTX text (no NUL).
    pub fn bytes(&self) -> &[u8] {
        match self {
            Image::Cubin { bytes, .. } => bytes,
            Image::Ptx { ptx, .. } => ptx.as_str().as_bytes(),
        }
    }

    /// Compiles the module (dtype, op) for `arch`: a CUBIN for `sm_<arch>`
    /// when `cubin`, else PTX for `compute_<arch>` (from [`ptx`]'s cache).
    fn compile(arch: u32, cubin: bool, dtype: DataType, op: KernelOp) -> Result<Image> {
        Ok(if cubin {
            Image::Cubin { arch, bytes: compile_cubin(arch, dtype, op)? }
        } else {
            Image::Ptx { arch, ptx: ptx(arch, dtype, op)? }
        })
    }
}

/// The module (dtype, op) for a device of compute capability `device_arch`
/// ([`pick_arch`]: a CUBIN of its architecture when this NVRTC can target
/// it, so that loading it runs no JIT; else PTX), cached for the life of the
/// process like [`ptx`], and on disk across processes ([`crate::cache`],
/// `OXCCL_CACHE_DIR`): a warm cache compiles nothing.
pub fn image(device_arch: u32, dtype: DataType, op: KernelOp) -> Result<Arc<Image>> {
    static CACHE: OnceLock<Cache<Image>> = OnceLock::new();
    cached(&CACHE, (device_arch, dtype, op), || {
        image_with(DiskCache::from_env().as_ref(), device_arch, dtype, op, true)
    })
}

/// [`image`] compiled afresh, whatever the caches hold; the disk cache's
/// entry is replaced. For an image from the disk cache that the driver
/// refused to load.
pub fn image_fresh(device_arch: u32, dtype: DataType, op: KernelOp) -> Result<Image> {
    image_with(DiskCache::from_env().as_ref(), device_arch, dtype, op, false)
}

/// The image for (device_arch, dtype, op): from `disk` when `read` and it
/// holds a whole entry of the running NVRTC's version; else compiled, and
/// written to `disk`. Without NVRTC, a CUBIN of the device's own
/// architecture made by any NVRTC ([`DiskCache::prebuilt`]: what a pack
/// filled elsewhere) will do; the driver checks it when loading it.
pub fn image_with(
    disk: Option<&DiskCache>,
    device_arch: u32,
    dtype: DataType,
    op: KernelOp,
    read: bool,
) -> Result<Image> {
    let from = |key: Key, bytes: Vec<u8>| -> Result<Image> {
        if key.cubin {
            return Ok(Image::Cubin { arch: key.arch, bytes });
        }
        let text = String::from_utf8(bytes).map_err(|_| invalid("a cached PTX entry is not UTF-8"))?;
        Ok(Image::Ptx { arch: key.arch, ptx: Arc::new(Ptx(text)) })
    };
    let nvrtc = nvrtc_version();
    let nvrtc = match nvrtc {
        Ok(v) => v,
        Err(e) => {
            let Some((key, bytes)) = disk.filter(|_| read).and_then(|d| d.prebuilt(device_arch, dtype, op)) else {
                return Err(e);
            };
            tracing::debug!("oxccl kernels: no NVRTC here ({e}); {} from the cache", key.file_name());
            return from(key, bytes);
        }
    };
    let archs = supported_archs()?;
    let Some((arch, cubin)) = pick_arch(device_arch, &archs) else {
        return Err(CudaError::Unavailable(format!(
            "this NVRTC compiles for compute_{archs:?}, none of which runs on a device of compute capability {}.{}",
            device_arch / 10,
            device_arch % 10
        )));
    };
    let key = Key { cubin, arch, dtype, op, nvrtc };
    if let Some(d) = disk.filter(|_| read) {
        match d.get(&key) {
            Lookup::Hit(bytes) => return from(key, bytes),
            Lookup::Corrupt(why) => tracing::warn!("oxccl kernel cache: {why}; compiling it again"),
            Lookup::Miss => {}
        }
    }
    let image = Image::compile(arch, cubin, dtype, op)?;
    if let Some(d) = disk
        && let Err(e) = d.put(&key, image.bytes())
    {
        static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::info!(
                "oxccl kernel cache {} cannot be written ({e}); kernels are compiled in each process (set {} \
                 to a writable directory, or to off)",
                d.dir().display(),
                crate::cache::ENV
            );
        }
    }
    Ok(image)
}

/// What [`fill`] did for one module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Filled {
    /// The entry.
    pub key: Key,
    /// Whether it was in the cache already (nothing compiled).
    pub present: bool,
}

/// Fills `disk` with the modules of `dtypes` × `ops` (every module:
/// [`DataType::ALL`] × [`KernelOp::ALL`]) for devices of the architectures
/// `archs`, compiling what it lacks on `threads` threads; no GPU needed.
/// What a pack for a GPU machine runs, so that its first collective
/// compiles nothing. Processes filling one cache at once each write whole
/// entries.
pub fn fill(
    disk: &DiskCache,
    archs: &[u32],
    dtypes: &[DataType],
    ops: &[KernelOp],
    threads: usize,
) -> Result<Vec<Filled>> {
    let nvrtc = nvrtc_version()?;
    let supported = supported_archs()?;
    let mut keys = Vec::new();
    for &a in archs {
        let (arch, cubin) = pick_arch(a, &supported).ok_or_else(|| {
            invalid(format!("architecture {a}: this NVRTC ({}.{}) compiles for {supported:?} only", nvrtc.0, nvrtc.1))
        })?;
        for &dtype in dtypes {
            for &op in ops {
                keys.push(Key { cubin, arch, dtype, op, nvrtc });
            }
        }
    }
    // Threads take the next key until none is left; results keep the keys' order.
    let next = std::sync::atomic::AtomicUsize::new(0);
    let work = || -> Result<Vec<(usize, Filled)>> {
        let mut done = Vec::new();
        loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(&key) = keys.get(i) else { return Ok(done) };
            let present = matches!(disk.get(&key), Lookup::Hit(_));
            if !present {
                let image = Image::compile(key.arch, key.cubin, key.dtype, key.op)?;
                disk.put(&key, image.bytes())
                    .map_err(|e| CudaError::Unavailable(format!("kernel cache {}: {e}", disk.dir().display())))?;
            }
            done.push((i, Filled { key, present }));
        }
    };
    let mut all = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads.max(1)).map(|_| s.spawn(work)).collect();
        hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(invalid("NVRTC panicked")))).collect::<Result<Vec<_>>>()
    })?
    .concat();
    all.sort_unstable_by_key(|&(i, _)| i);
    Ok(all.into_iter().map(|(_, f)| f).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_is_the_files_in_order_with_line_markers() {
        let s = source();
        let mut at = 0;
        for (name, text) in SOURCES {
            let marker = format!("#line 1 \"{name}\"\n");
            let found = s[at..].find(&marker).unwrap_or_else(|| panic!("{name} missing or out of order"));
            at += found + marker.len();
            assert!(s[at..].starts_with(text), "{name}'s text does not follow its marker");
            at += text.len();
        }
        assert!(s.contains("struct oxccl_reduce_args"));
    }

    #[test]
    fn options_name_type_op_and_arch() {
        let o = options(90, DataType::Bfloat16, KernelOp::Min);
        for want in ["-DOXCCL_NVRTC", "-DOXCCL_DTYPE=9", "-DOXCCL_OP=3", "--gpu-architecture=compute_90", "-std=c++17"]
        {
            assert!(o.iter().any(|x| x == want), "{want} missing from {o:?}");
        }
    }

    /// Whether NVRTC is here; says why a test skips if not (a failure
    /// where `OXCCL_REQUIRE_NVRTC` is set).
    fn have_nvrtc() -> bool {
        let e = nvrtc_available().err();
        if let Some(e) = &e {
            oxccl_skip::skip_or_fail("OXCCL_REQUIRE_NVRTC", format!("NVRTC cannot be loaded: {e}"));
        }
        e.is_none()
    }

    #[test]
    fn warnings_and_errors_fail_with_the_log() {
        if !have_nvrtc() {
            return;
        }
        let ok = "extern \"C\" __global__ void k(int *p) { p[threadIdx.x] = 1; }\n";
        let ptx = compile_text(ok, 80, DataType::Int32, KernelOp::Sum).unwrap();
        assert!(ptx.as_str().contains(".entry k"), "{}", ptx.as_str());
        assert!(ptx.as_str().contains(".target sm_80"));
        let warn = "extern \"C\" __global__ void k(int *p) { int unused; p[0] = 1; }\n";
        match compile_text(warn, 80, DataType::Int32, KernelOp::Sum) {
            Err(CudaError::Nvrtc { log, arch: 80, .. }) => {
                assert!(log.contains("warnings are errors") && log.contains("unused"), "{log}")
            }
            other => panic!("a warning must fail the build: {other:?}"),
        }
        let broken = "#line 1 \"reduce.cu\"\nextern \"C\" __global__ void k(int *p) { p[0] = q; }\n";
        match compile_text(broken, 90, DataType::Float32, KernelOp::Max) {
            Err(e @ CudaError::Nvrtc { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains("reduce.cu(1)") && msg.contains("compute_90, float max"), "{msg}");
            }
            other => panic!("an error must fail the build: {other:?}"),
        }
    }

    #[test]
    fn a_cubin_is_an_elf_image_for_the_real_arch() {
        if !have_nvrtc() {
            return;
        }
        let ok = "extern \"C\" __global__ void k(int *p) { p[threadIdx.x] = 1; }\n";
        let cubin = compile_cubin_text(ok, 80, DataType::Int32, KernelOp::Sum).unwrap();
        assert!(cubin.starts_with(b"\x7fELF"), "{:?}", &cubin[..cubin.len().min(16)]);
        let warn = "extern \"C\" __global__ void k(int *p) { int unused; p[0] = 1; }\n";
        assert!(matches!(compile_cubin_text(warn, 80, DataType::Int32, KernelOp::Sum), Err(CudaError::Nvrtc { .. })));
    }

    #[test]
    fn a_device_gets_its_own_cubin_or_the_closest_lower_ptx() {
        let archs = [75, 80, 86, 89, 90, 100, 120];
        assert_eq!(pick_arch(90, &archs), Some((90, true)));
        assert_eq!(pick_arch(87, &archs), Some((86, false)));
        assert_eq!(pick_arch(121, &archs), Some((120, false)));
        assert_eq!(pick_arch(70, &archs), None);
        assert!(options_for(90, DataType::Float32, KernelOp::Sum, true).contains(&"--gpu-architecture=sm_90".into()));
    }

    #[test]
    fn nvrtc_is_found_in_a_wheel_directory_by_version() {
        let dir = std::env::temp_dir().join(format!("oxccl-nvrtc-{}", std::process::id()));
        let lib = dir.join("cu13/lib");
        std::fs::create_dir_all(&lib).unwrap();
        for name in ["libnvrtc.so.12", "libnvrtc.so.13", "libnvrtc.alt.so.13", "libnvrtc-builtins.so.13.0"] {
            std::fs::write(lib.join(name), b"").unwrap();
        }
        std::fs::write(lib.join("libnvrtc-builtins.alt.so.13.0"), b"").unwrap();
        assert_eq!(locate::nvrtc_in(&lib), Some(lib.join("libnvrtc.so.13")));
        assert_eq!(locate::builtins_in(&lib), vec![lib.join("libnvrtc-builtins.so.13.0")]);
        assert_eq!(locate::wheel_dirs(&dir)[0], lib);
        assert_eq!(locate::nvrtc_in(&dir), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_arch_is_rejected_before_nvrtc() {
        let e = compile(7, DataType::Float32, KernelOp::Sum).unwrap_err();
        assert!(e.to_string().contains("architecture 7"), "{e}");
    }
}
