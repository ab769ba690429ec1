//! The libibverbs backend of the verbs seam ([`super::verbs`]).
//!
//! ## Using it
//! [`open`] (from [`IbOptions`]) or [`open_devices`] loads libibverbs at run
//! time, lists the HCAs, opens those `OXCCL_IB_HCA` admits and that have an
//! active admitted port, and returns them as [`Device`]s, each with one
//! protection domain. When RDMA cannot be used the answer is an
//! [`Unavailable`] value whose words say why (no library, a symbol missing,
//! no kernel support, no device, none admitted, no active port); the fabric
//! then falls back to TCP. Nothing here panics on what the machine lacks.
//!
//! ```no_run
//! # use oxccl_transport::rdma::{env::{HcaFilter, IbOptions}, ibv};
//! let opts = IbOptions { hca: HcaFilter::parse("mlx5")?, ..IbOptions::default() };
//! match ibv::open(&opts) {
//!     Ok(devs) => println!("RDMA on {}", devs.iter().map(|d| d.name().to_string()).collect::<Vec<_>>().join(", ")),
//!     Err(why) => println!("no RDMA: {why}"),
//! }
//! # Ok::<(), oxccl_transport::Error>(())
//! ```
//!
//! ## What it does underneath
//! - Loading (`load`): `dlopen` + `dlvsym` at `IBVERBS_1.1`
//!   (`IBVERBS_1.0` for the completion-channel calls), never linked.
//! - Layouts: `sys` mirrors verbs.h `#[repr(C)]`; `tests/transport/ibv_layout.rs`
//!   checks it against the installed header with the C compiler
//!   ([`layout_table`]). The data-path calls (`post_send`, `post_recv`,
//!   `poll_cq`, `req_notify_cq`) go through `context->ops`, as verbs.h's
//!   inlines do.
//! - Ports: [`Device::ports`] lists the ports the filter admits (active or
//!   not; the engine uses the active ones), with the GID table read by
//!   `ibv_query_gid` (all-zero entries skipped) and each entry's type from
//!   sysfs (`/sys/class/infiniband/<dev>/ports/<port>/gid_attrs/types/<i>`:
//!   `IB/RoCE v1` or `RoCE v2`; unknown where absent). The link speed is
//!   lanes × lane rate from `active_width` and `active_speed` (the tables
//!   are in `port`), else sysfs `rate`, else 100 Gb/s.
//! - Registration: `ibv_fork_init` once before the first one;
//!   `RLIMIT_MEMLOCK` checked first (unless the process has
//!   `CAP_IPC_LOCK`): an error gives the limit and the remedy instead of
//!   verbs' bare `ENOMEM`. Registrations left at drop are undone.
//! - CQs have a completion channel whose descriptor is non-blocking; the
//!   async-event descriptor is non-blocking too, so
//!   [`Device::async_event`] never waits.
//! - QPs are RC, moved to INIT at creation (pkey index 0, remote WRITE and
//!   READ) and to RTR/RTS by [`super::verbs::Qp::connect`] with NCCL's
//!   attributes and masks.
//! - Drop order: a QP holds its CQ, a CQ and a QP hold the device context;
//!   so QPs go before CQs (and their channels), registrations and the PD
//!   before the context is closed.
#![allow(unsafe_code)]

mod layout;
#[cfg(test)]
mod live_tests;
mod load;
mod memlock;
mod port;
mod queue;
mod sys;

use super::env::{HcaFilter, IbOptions};
use super::verbs::{Access, AsyncEvent, Cq, Device, Mr, PortInfo, PortState, Qp, QpCaps, verbs_error};
use crate::{Error, Result};
use queue::{IbvCq, IbvQp};
use std::collections::HashMap;
use std::ffi::{CStr, c_int, c_void};
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

pub use load::DEFAULT_LIB;

/// Why RDMA is unavailable, by kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnavailableKind {
    /// `OXCCL_IB_DISABLE` turned it off.
    Disabled,
    /// libibverbs could not be loaded.
    Library,
    /// libibverbs lacks a symbol this backend needs.
    Symbol,
    /// `ibv_get_device_list` failed (no kernel RDMA support, no permission).
    DeviceList,
    /// No RDMA device exists.
    NoDevice,
    /// Devices exist, but `OXCCL_IB_HCA` admits none.
    Filtered,
    /// Admitted devices failed to open or have no active admitted port.
    NotUsable,
}

/// RDMA cannot be used here, and why in words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unavailable {
    /// The kind of reason.
    pub kind: UnavailableKind,
    /// The reason in words (what was tried, what failed, the remedy).
    pub reason: String,
}

impl Unavailable {
    /// A reason of `kind`.
    pub fn new(kind: UnavailableKind, reason: impl Into<String>) -> Unavailable {
        Unavailable { kind, reason: reason.into() }
    }
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for Unavailable {}

impl From<Unavailable> for Error {
    fn from(u: Unavailable) -> Error {
        Error::Unavailable(u.reason)
    }
}

/// What the layout test compares with verbs.h (see `sys`): `"struct X"`
/// → `sizeof`, `"struct X.a.b"` → `offsetof`, `IBV_*` → the constant.
pub fn layout_table() -> Vec<(&'static str, usize)> {
    layout::layout_table()
}

/// The symbols loaded, as (name, version).
pub fn symbols() -> &'static [(&'static str, &'static str)] {
    load::SYMBOLS
}

/// Opens the devices `opts` asks for: [`UnavailableKind::Disabled`] under
/// `OXCCL_IB_DISABLE=1`, else [`open_devices`] with `OXCCL_IB_HCA` and
/// `OXCCL_IBVERBS_LIB`.
pub fn open(opts: &IbOptions) -> std::result::Result<Vec<Arc<dyn Device>>, Unavailable> {
    if opts.disable {
        return Err(Unavailable::new(UnavailableKind::Disabled, "RDMA is disabled (OXCCL_IB_DISABLE=1)"));
    }
    open_devices(&opts.hca, opts.ibverbs_lib.as_deref())
}

/// Loads libibverbs from `lib` (`None`: [`DEFAULT_LIB`]; this function
/// reads no environment) and opens every device `filter` admits that has
/// an active admitted port, in the library's order. Each device's
/// [`Device::ports`] lists only its admitted ports.
pub fn open_devices(filter: &HcaFilter, lib: Option<&str>) -> std::result::Result<Vec<Arc<dyn Device>>, Unavailable> {
    let lib = load::load(lib)?;
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out-pointer; the list is freed below.
    let list = unsafe { (lib.f.get_device_list)(&mut n) };
    if list.is_null() {
        let err = std::io::Error::last_os_error();
        let hint = match err.raw_os_error() {
            Some(libc::ENOSYS) => "the kernel has no RDMA support",
            Some(libc::EPERM) | Some(libc::EACCES) => "no permission to the RDMA devices (/dev/infiniband)",
            _ => "libibverbs could not list devices",
        };
        return Err(Unavailable::new(
            UnavailableKind::DeviceList,
            format!("{hint} (ibv_get_device_list: {}; libibverbs loaded from {})", os_words(&err), lib.path),
        ));
    }
    struct List(&'static load::Lib, *mut *mut c_void);
    impl Drop for List {
        fn drop(&mut self) {
            // SAFETY: the list came from ibv_get_device_list and is freed once;
            // contexts opened from it stay valid after (verbs' rule).
            unsafe { (self.0.f.free_device_list)(self.1) }
        }
    }
    let list = List(lib, list);
    let mut names = Vec::new();
    let mut devices: Vec<Arc<dyn Device>> = Vec::new();
    let mut problems = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: the list holds `n` device pointers.
        let dev = unsafe { *list.1.add(i) };
        if dev.is_null() {
            break;
        }
        // SAFETY: `dev` is a listed device; the name is a NUL-terminated
        // string inside it, copied at once.
        let name = unsafe { CStr::from_ptr((lib.f.get_device_name)(dev)) }.to_string_lossy().into_owned();
        names.push(name.clone());
        if !filter.admits_device(&name) {
            continue;
        }
        match IbvDevice::open(lib, dev, &name, filter) {
            Ok(d) => devices.push(Arc::new(d)),
            Err(why) => problems.push(why),
        }
    }
    drop(list);
    if !devices.is_empty() {
        for p in &problems {
            tracing::info!("RDMA: skipping {p}");
        }
        return Ok(devices);
    }
    if names.is_empty() {
        return Err(Unavailable::new(
            UnavailableKind::NoDevice,
            format!(
                "no RDMA device found (libibverbs, loaded from {}, lists none: no HCA, or its kernel driver or rdma-core \
                 provider is missing)",
                lib.path
            ),
        ));
    }
    if problems.is_empty() {
        return Err(Unavailable::new(
            UnavailableKind::Filtered,
            format!("none of the RDMA devices ({}) matches OXCCL_IB_HCA={filter}", names.join(", ")),
        ));
    }
    Err(Unavailable::new(UnavailableKind::NotUsable, format!("no usable RDMA device: {}", problems.join("; "))))
}

/// An OS error in words, without std's " (os error N)" suffix.
fn os_words(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// errno of the last failed call.
fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// Sets `O_NONBLOCK` on `fd`.
fn set_nonblocking(fd: c_int) -> std::io::Result<()> {
    // SAFETY: fcntl on a descriptor libibverbs owns; only the flag changes.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The data-path entry points of a context's ops table.
#[derive(Clone, Copy)]
struct Ops {
    poll_cq: unsafe extern "C" fn(*mut sys::IbvCq, c_int, *mut sys::IbvWc) -> c_int,
    req_notify_cq: unsafe extern "C" fn(*mut sys::IbvCq, c_int) -> c_int,
    post_send: unsafe extern "C" fn(*mut sys::IbvQp, *mut sys::IbvSendWr, *mut *mut sys::IbvSendWr) -> c_int,
    post_recv: unsafe extern "C" fn(*mut sys::IbvQp, *mut sys::IbvRecvWr, *mut *mut sys::IbvRecvWr) -> c_int,
}

/// An open context and its protection domain; the last holder closes them.
struct Ctx {
    lib: &'static load::Lib,
    name: String,
    ctx: *mut sys::IbvContext,
    pd: *mut c_void,
    ops: Ops,
    attr: sys::IbvDeviceAttr,
    /// Live registrations: `ibv_mr *` → bytes pinned.
    mrs: Mutex<HashMap<u64, u64>>,
}

// SAFETY: libibverbs is thread-safe ("all verbs can be called from any thread";
// a context, PD and MR may be used from several threads at once). The raw
// pointers are owned by this struct and freed only in Drop; the map is behind
// a mutex.
unsafe impl Send for Ctx {}
// SAFETY: see Send.
unsafe impl Sync for Ctx {}

impl Drop for Ctx {
    fn drop(&mut self) {
        let mrs = std::mem::take(self.mrs.get_mut().unwrap_or_else(|e| e.into_inner()));
        for (mr, pinned) in mrs {
            // SAFETY: a registration of this PD not yet deregistered; no QP
            // or CQ remains (they hold this context).
            let rc = unsafe { (self.lib.f.dereg_mr)(mr as *mut sys::IbvMr) };
            if rc == 0 {
                memlock::PINNED.fetch_sub(pinned, Ordering::Relaxed);
            } else {
                tracing::warn!("ibv_dereg_mr on {} at close: {}", self.name, std::io::Error::from_raw_os_error(rc));
            }
        }
        // SAFETY: the PD is freed once, after its registrations and QPs.
        let rc = unsafe { (self.lib.f.dealloc_pd)(self.pd) };
        if rc != 0 {
            tracing::warn!("ibv_dealloc_pd on {}: {}", self.name, std::io::Error::from_raw_os_error(rc));
        }
        // SAFETY: the context is closed once, after everything created from it.
        let rc = unsafe { (self.lib.f.close_device)(self.ctx) };
        if rc != 0 {
            tracing::warn!("ibv_close_device on {}: {}", self.name, std::io::Error::last_os_error());
        }
    }
}

/// An opened HCA.
struct IbvDevice {
    ctx: Arc<Ctx>,
    /// The ports the filter admits.
    ports: Vec<u8>,
}

impl IbvDevice {
    /// Opens `dev`; a reason in words if it cannot be used.
    fn open(
        lib: &'static load::Lib,
        dev: *mut c_void,
        name: &str,
        filter: &HcaFilter,
    ) -> std::result::Result<IbvDevice, String> {
        // SAFETY: `dev` comes from the live device list.
        let ctx = unsafe { (lib.f.open_device)(dev) };
        if ctx.is_null() {
            return Err(format!("{name}: ibv_open_device: {}", os_words(&std::io::Error::last_os_error())));
        }
        // SAFETY: `ctx` is a live context; the ops table is filled at open.
        let raw = unsafe { &(*ctx).ops };
        let (Some(poll_cq), Some(req_notify_cq), Some(post_send), Some(post_recv)) =
            (raw.poll_cq, raw.req_notify_cq, raw.post_send, raw.post_recv)
        else {
            // SAFETY: closing the context just opened.
            unsafe { (lib.f.close_device)(ctx) };
            return Err(format!("{name}: its provider's context lacks a data-path operation"));
        };
        // SAFETY: an all-zero IbvDeviceAttr is valid (integers and chars).
        let mut attr: sys::IbvDeviceAttr = unsafe { std::mem::zeroed() };
        // SAFETY: `attr` is a valid out-pointer of the layout verbs.h declares.
        let rc = unsafe { (lib.f.query_device)(ctx, &mut attr) };
        if rc != 0 {
            // SAFETY: closing the context just opened.
            unsafe { (lib.f.close_device)(ctx) };
            return Err(format!(
                "{name}: ibv_query_device: {}",
                os_words(&std::io::Error::from_raw_os_error(rc.abs()))
            ));
        }
        // SAFETY: `ctx` is live.
        let pd = unsafe { (lib.f.alloc_pd)(ctx) };
        if pd.is_null() {
            let e = std::io::Error::last_os_error();
            // SAFETY: closing the context just opened.
            unsafe { (lib.f.close_device)(ctx) };
            return Err(format!("{name}: ibv_alloc_pd: {}", os_words(&e)));
        }
        let ops = Ops { poll_cq, req_notify_cq, post_send, post_recv };
        let ctx = Arc::new(Ctx { lib, name: name.to_string(), ctx, pd, ops, attr, mrs: Mutex::new(HashMap::new()) });
        let ports: Vec<u8> = (1..=attr.phys_port_cnt).filter(|&p| filter.matches(name, p)).collect();
        let mut states = Vec::new();
        let mut active = false;
        for &p in &ports {
            match ctx.port_info(p) {
                Ok(pi) if pi.state == PortState::Active => active = true,
                Ok(pi) => states.push(format!("port {p} is {:?}", pi.state)),
                Err(e) => states.push(format!("port {p}: {e}")),
            }
        }
        if !active {
            let why = if ports.is_empty() {
                format!("OXCCL_IB_HCA={filter} admits none of its {} ports", attr.phys_port_cnt)
            } else {
                format!("no active port ({})", states.join(", "))
            };
            return Err(format!("{name}: {why}"));
        }
        // SAFETY: `ctx.ctx` is live; async_fd is its event descriptor.
        let async_fd = unsafe { (*ctx.ctx).async_fd };
        if let Err(e) = set_nonblocking(async_fd) {
            return Err(format!("{name}: cannot make its async event descriptor non-blocking: {e}"));
        }
        Ok(IbvDevice { ctx, ports })
    }

    fn access_flags(a: Access) -> c_int {
        let mut f = 0;
        if a.local_write || a.remote_write {
            // Verbs requires LOCAL_WRITE with REMOTE_WRITE.
            f |= sys::IBV_ACCESS_LOCAL_WRITE;
        }
        if a.remote_write {
            f |= sys::IBV_ACCESS_REMOTE_WRITE;
        }
        if a.remote_read {
            f |= sys::IBV_ACCESS_REMOTE_READ;
        }
        f
    }
}

impl Device for IbvDevice {
    fn name(&self) -> &str {
        &self.ctx.name
    }

    fn ports(&self) -> Result<Vec<PortInfo>> {
        self.ports.iter().map(|&p| self.ctx.port_info(p)).collect()
    }

    unsafe fn reg_mr(&self, addr: u64, len: usize, access: Access) -> Result<Mr> {
        let dev = &self.ctx.name;
        if len == 0 {
            return Err(Error::invalid(format!("ibv_reg_mr on {dev}: cannot register 0 bytes")));
        }
        let lib = self.ctx.lib;
        // A failure is logged once there; registration works without it.
        let _ = lib.fork_init_once();
        let pinned = memlock::pinned_bytes(addr, len as u64);
        memlock::check_memlock(dev, len, pinned)?;
        let flags = IbvDevice::access_flags(access);
        // SAFETY: the caller promises `addr..addr + len` stays allocated until
        // dereg_mr (the trait's contract); the PD is live.
        let mr = unsafe { (lib.f.reg_mr)(self.ctx.pd, addr as *mut c_void, len, flags) };
        if mr.is_null() {
            return Err(verbs_error(&format!("ibv_reg_mr ({len} bytes at {addr:#x})"), dev, errno()));
        }
        // SAFETY: `mr` is a live registration just returned.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        memlock::PINNED.fetch_add(pinned, Ordering::Relaxed);
        self.ctx.mrs.lock().unwrap_or_else(|e| e.into_inner()).insert(mr as u64, pinned);
        Ok(Mr { addr, len: len as u64, lkey, rkey, handle: mr as u64, access })
    }

    fn dereg_mr(&self, mr: &Mr) -> Result<()> {
        let dev = &self.ctx.name;
        let mut mrs = self.ctx.mrs.lock().unwrap_or_else(|e| e.into_inner());
        let Some(pinned) = mrs.remove(&mr.handle) else {
            return Err(Error::invalid(format!(
                "ibv_dereg_mr on {dev}: {:#x}+{} (lkey {:#x}) is not a live registration of this device (deregistered twice?)",
                mr.addr, mr.len, mr.lkey
            )));
        };
        // SAFETY: the handle is a live registration of this PD (it was in the map).
        let rc = unsafe { (self.ctx.lib.f.dereg_mr)(mr.handle as *mut sys::IbvMr) };
        if rc != 0 {
            mrs.insert(mr.handle, pinned);
            return Err(verbs_error("ibv_dereg_mr", dev, rc.abs()));
        }
        memlock::PINNED.fetch_sub(pinned, Ordering::Relaxed);
        Ok(())
    }

    fn create_cq(&self, depth: u32) -> Result<Arc<dyn Cq>> {
        Ok(Arc::new(IbvCq::create(&self.ctx, depth)?))
    }

    fn create_qp(&self, cq: &Arc<dyn Cq>, caps: QpCaps, port: u8) -> Result<Box<dyn Qp>> {
        let dev = &self.ctx.name;
        if !self.ports.contains(&port) {
            return Err(Error::invalid(format!(
                "create_qp on {dev}: port {port} is not one of its usable ports ({:?}; OXCCL_IB_HCA may exclude it)",
                self.ports
            )));
        }
        let Some(ours) = cq.as_any().downcast_ref::<IbvCq>().filter(|c| c.belongs_to(&self.ctx)) else {
            return Err(Error::invalid(format!(
                "create_qp on {dev}: the completion queue was not made by this device"
            )));
        };
        Ok(Box::new(IbvQp::create(&self.ctx, Arc::clone(cq), ours, caps, port)?))
    }

    fn async_event(&self) -> Option<AsyncEvent> {
        let lib = self.ctx.lib;
        let mut ev = sys::IbvAsyncEvent { element: std::ptr::null_mut(), event_type: 0 };
        // SAFETY: the async descriptor is non-blocking (set at open), so this
        // returns -1/EAGAIN at once when no event is queued.
        if unsafe { (lib.f.get_async_event)(self.ctx.ctx, &mut ev) } != 0 {
            return None;
        }
        let t = ev.event_type;
        let qpn = || {
            // SAFETY: for QP events `element` is the QP, which stays alive until
            // the event is acknowledged (ibv_destroy_qp waits for that).
            unsafe { (*(ev.element as *const sys::IbvQp)).qp_num }
        };
        let port = || ev.port_num().clamp(0, 255) as u8;
        let out = match t {
            sys::IBV_EVENT_QP_FATAL => AsyncEvent::QpFatal(qpn()),
            sys::IBV_EVENT_QP_REQ_ERR | sys::IBV_EVENT_QP_ACCESS_ERR => AsyncEvent::QpError(qpn()),
            sys::IBV_EVENT_CQ_ERR => AsyncEvent::CqErr,
            sys::IBV_EVENT_PORT_ERR => AsyncEvent::PortErr(port()),
            sys::IBV_EVENT_PORT_ACTIVE => AsyncEvent::PortActive(port()),
            sys::IBV_EVENT_DEVICE_FATAL => AsyncEvent::DeviceFatal,
            other => {
                let on = if sys::event_is_qp(other) {
                    format!(" on QP {}", qpn())
                } else if sys::event_is_port(other) {
                    format!(" on port {}", port())
                } else {
                    String::new()
                };
                tracing::debug!("RDMA {}: async event {other}{on}", self.ctx.name);
                AsyncEvent::Other(other)
            }
        };
        // SAFETY: acknowledges the event just read, once.
        unsafe { (lib.f.ack_async_event)(&mut ev) };
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_flags() {
        assert_eq!(IbvDevice::access_flags(Access::REMOTE_WRITE), 3);
        assert_eq!(IbvDevice::access_flags(Access::ALL), 7);
        assert_eq!(IbvDevice::access_flags(Access::LOCAL), 1);
        assert_eq!(IbvDevice::access_flags(Access { local_write: false, remote_write: false, remote_read: true }), 4);
    }
}
