//! Versions, ids, communicators and their queries, errors, operators,
//! registrations.

use crate::abi::{self, ConfigC, UniqueIdC, out};
use crate::coll::dtype_of;
use crate::error::{self, IN_PROGRESS, NcclResult};
use crate::handle::{self, Comm, Scalar};
use crate::nccl_api;
use oxccl::{Communicator, Config, Error, Result, UniqueId};
use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;

type CommOut = *mut *mut c_void;

fn id_of(id: &UniqueIdC) -> Result<UniqueId> {
    let bytes: [u8; 128] = std::array::from_fn(|i| id.internal[i] as u8);
    UniqueId::from_bytes(&bytes)
}

fn ranks(nranks: c_int, rank: c_int) -> Result<(usize, usize)> {
    match (usize::try_from(nranks), usize::try_from(rank)) {
        (Ok(n), Ok(r)) if n > 0 && r < n => Ok((n, r)),
        _ => Err(Error::invalid(format!("rank {rank} of nranks {nranks}: need 0 <= rank < nranks"))),
    }
}

fn handle_ptr(c: &Arc<Comm>) -> *mut c_void {
    c.handle as *mut c_void
}

/// Makes a communicator, now or (non-blocking config) on a thread; the
/// handle goes to `comm` either way.
fn init(comm: CommOut, nranks: c_int, id: &UniqueIdC, rank: c_int, config: *const ConfigC) -> Result<NcclResult> {
    crate::setup();
    if comm.is_null() {
        return Err(Error::invalid("comm (the ncclComm_t* out-argument) is NULL"));
    }
    let (n, r) = ranks(nranks, rank)?;
    let opts = abi::read_config(config)?;
    let (id, cfg) = encrypted(id_of(id)?);
    let in_group = crate::group::active();
    if opts.blocking && !in_group {
        let c = Comm::ready(Communicator::init(&id, n, r, cfg)?);
        out(comm, handle_ptr(&c), "comm")?;
        return Ok(error::SUCCESS);
    }
    let c = Comm::spawn(r, n, move || Communicator::init(&id, n, r, cfg))?;
    out(comm, handle_ptr(&c), "comm")?;
    if !in_group {
        return Ok(IN_PROGRESS);
    }
    // In a group the init ends at ncclGroupEnd, which waits for it: one
    // thread may make several ranks.
    crate::group::defer(Box::new(move || {
        c.join();
        c.comm().map(|_| ())
    }))?;
    Ok(error::SUCCESS)
}

/// The pre-shared key of `ncclSetEncryption` (PSK mode), for
/// communicators made from now on; `None`: no encryption asked for.
pub(crate) static ENCRYPTION: parking_lot::Mutex<Option<Vec<u8>>> = parking_lot::Mutex::new(None);

/// `id` and the configuration to make a communicator with: under
/// `ncclSetEncryption`'s PSK, encrypted, its secret mixed with the key.
fn encrypted(id: UniqueId) -> (UniqueId, Config) {
    match ENCRYPTION.lock().as_ref() {
        Some(psk) => (id.with_key(psk), Config { encrypt: Some(true), ..Config::default() }),
        None => (id, Config::default()),
    }
}

/// The communicator behind a C handle (an error names a NULL, unknown or
/// destroyed one).
pub(super) fn get(comm: *const c_void) -> Result<Arc<Comm>> {
    Comm::get(comm as usize)
}

/// Makes a communicator from `parent` (split, shrink) with `make`, at the
/// end of the open group (beside the group's others) or now, and writes
/// its handle, or NULL for none, to `newcomm` then. It is on the parent's
/// CUDA device.
fn hand_out(
    parent: &Comm,
    newcomm: CommOut,
    config: *const ConfigC,
    make: impl FnOnce() -> Result<Option<Communicator>> + Send + 'static,
) -> Result<()> {
    abi::read_config(config)?;
    if newcomm.is_null() {
        return Err(Error::invalid("newcomm is NULL"));
    }
    let (target, device) = (newcomm as usize, parent.cuda_device);
    crate::group::defer(Box::new(move || {
        let p = make()?.map_or(std::ptr::null_mut(), |c| handle_ptr(&Comm::ready_on(c, device)));
        // SAFETY: the caller keeps `newcomm` valid until the call (or its
        // group) has ended, which is when this runs.
        unsafe { (target as CommOut).write(p) };
        Ok(())
    }))
}

nccl_api! {
    /// `ncclGetVersion`: the NCCL API version implemented (23203).
    fn ncclGetVersion / pncclGetVersion(version: *mut c_int) {
        crate::setup();
        out(version, abi::VERSION_CODE, "version")
    }

    /// `ncclGetUniqueId`: a fresh id (rank 0's rendezvous bound now), or,
    /// with `NCCL_COMM_ID=host:port`, the id every process derives from it.
    fn ncclGetUniqueId / pncclGetUniqueId(unique_id: *mut UniqueIdC) {
        crate::setup();
        let id = match oxccl::config::lookup("OXCCL_COMM_ID") {
            Some((name, v)) => {
                use std::net::ToSocketAddrs;
                let addr = v.to_socket_addrs().ok().and_then(|mut a| a.next()).ok_or_else(|| {
                    Error::invalid(format!("{name}={v:?} is not host:port"))
                })?;
                oxccl::with_launch_secret(UniqueId::for_env(addr, "NCCL_COMM_ID"), |k| std::env::var(k).ok())?
            }
            None => oxccl::unique_id()?,
        };
        let mut c = UniqueIdC { internal: [0; 128] };
        for (d, s) in c.internal.iter_mut().zip(id.as_bytes()) {
            *d = *s as c_char;
        }
        out(unique_id, c, "uniqueId")
    }

    /// `ncclCommInitRankConfig`.
    fn ncclCommInitRankConfig / pncclCommInitRankConfig(
        comm: CommOut, nranks: c_int, comm_id: UniqueIdC, rank: c_int, config: *mut ConfigC
    ) {
        init(comm, nranks, &comm_id, rank, config)
    }

    /// `ncclCommInitRank`.
    fn ncclCommInitRank / pncclCommInitRank(comm: CommOut, nranks: c_int, comm_id: UniqueIdC, rank: c_int) {
        init(comm, nranks, &comm_id, rank, std::ptr::null())
    }

    /// `ncclCommInitRankScalable`: the first of the ids names the rendezvous.
    fn ncclCommInitRankScalable / pncclCommInitRankScalable(
        newcomm: CommOut, nranks: c_int, myrank: c_int, n_id: c_int, comm_ids: *mut UniqueIdC, config: *mut ConfigC
    ) {
        if n_id < 1 || comm_ids.is_null() {
            return Err(Error::invalid(format!("nId is {n_id} and commIds {comm_ids:p}: need at least one id")));
        }
        // SAFETY: commIds holds nId >= 1 ids (checked non-NULL).
        let first = unsafe { *comm_ids };
        init(newcomm, nranks, &first, myrank, config)
    }

    /// `ncclCommInitAll`: `ndev` ranks as threads of this process.
    fn ncclCommInitAll / pncclCommInitAll(comm: CommOut, ndev: c_int, devlist: *const c_int) {
        crate::setup();
        let n = usize::try_from(ndev).ok().filter(|&n| n > 0).ok_or_else(|| {
            Error::invalid(format!("ndev is {ndev}: need at least one rank"))
        })?;
        if comm.is_null() {
            return Err(Error::invalid("comm (the array of ndev handles) is NULL"));
        }
        // Ranks are threads; the device list (else 0, 1, …) names each
        // rank's GPU where there is one.
        let gpus = crate::api::misc::gpu_present();
        let mut devs = Vec::with_capacity(n);
        for i in 0..n {
            // SAFETY: a non-NULL devlist holds ndev ints (NCCL's contract).
            let d = if devlist.is_null() { i as c_int } else { unsafe { *devlist.add(i) } };
            if d < 0 {
                return Err(Error::invalid(format!("devlist[{i}] is {d}: not a CUDA device")));
            }
            devs.push(if gpus { d } else { -1 });
        }
        let comms = Communicator::init_threads(n)?;
        for (i, c) in comms.into_iter().enumerate() {
            let h = Comm::ready_on(c, devs[i]);
            // SAFETY: `comm` has room for ndev handles (NCCL's contract).
            unsafe { comm.add(i).write(handle_ptr(&h)) };
        }
        Ok(())
    }

    /// `ncclCommFinalize`: every call on host memory has already ended when
    /// it returned; waits for a non-blocking init.
    fn ncclCommFinalize / pncclCommFinalize(comm: *mut c_void) {
        let h = get(comm)?;
        h.join();
        h.comm().map(|_| ())
    }

    /// `ncclCommDestroy`: frees the communicator (local; the handle dies).
    fn ncclCommDestroy / pncclCommDestroy(comm: *mut c_void) {
        get(comm)?.discard(false);
        Ok(())
    }

    /// `ncclCommAbort`: stops everything; the other ranks learn it.
    fn ncclCommAbort / pncclCommAbort(comm: *mut c_void) {
        get(comm)?.discard(true);
        Ok(())
    }

    /// `ncclCommRevoke`: stops this communicator's work; it must then be
    /// destroyed.
    fn ncclCommRevoke / pncclCommRevoke(comm: *mut c_void, revoke_flags: c_int) {
        let h = get(comm)?;
        if revoke_flags != 0 {
            return Err(Error::invalid(format!("revokeFlags is {revoke_flags}; only NCCL_REVOKE_DEFAULT (0) exists")));
        }
        h.comm()?.abort();
        Ok(())
    }

    /// `ncclCommSplit`: `color` NCCL_SPLIT_NOCOLOR (-1) joins nothing
    /// (`*newcomm` = NULL).
    fn ncclCommSplit / pncclCommSplit(comm: *mut c_void, color: c_int, key: c_int, newcomm: CommOut, config: *mut ConfigC) {
        let h = get(comm)?;
        let c = h.comm()?;
        let color = match color {
            -1 => None,
            c if c >= 0 => Some(c as u32),
            c => return Err(Error::invalid(format!("color {c}: need >= 0 or NCCL_SPLIT_NOCOLOR (-1)"))),
        };
        hand_out(&h, newcomm, config, move || c.split(color, key))
    }

    /// `ncclCommShrink`: a communicator without the excluded ranks (called
    /// by the ranks that stay).
    fn ncclCommShrink / pncclCommShrink(
        comm: *mut c_void, exclude_ranks_list: *mut c_int, exclude_ranks_count: c_int,
        newcomm: CommOut, config: *mut ConfigC, shrink_flags: c_int
    ) {
        let h = get(comm)?;
        let c = h.comm()?;
        let n = usize::try_from(exclude_ranks_count)
            .map_err(|_| Error::invalid(format!("excludeRanksCount is {exclude_ranks_count}")))?;
        if n > 0 && exclude_ranks_list.is_null() {
            return Err(Error::invalid("excludeRanksList is NULL but excludeRanksCount is not 0"));
        }
        let after_failure = match shrink_flags {
            0 => false,
            1 => true,
            f => {
                return Err(Error::invalid(format!(
                    "shrinkFlags {f}: need NCCL_SHRINK_DEFAULT (0) or NCCL_SHRINK_ABORT (1)"
                )));
            }
        };
        let list: Vec<usize> = (0..n)
            // SAFETY: the list holds excludeRanksCount ints (checked non-NULL).
            .map(|i| unsafe { *exclude_ranks_list.add(i) })
            .map(|r| usize::try_from(r).map_err(|_| Error::invalid(format!("excluded rank {r} is negative"))))
            .collect::<Result<_>>()?;
        hand_out(&h, newcomm, config, move || {
            if after_failure { c.shrink_after_failure(&list) } else { c.shrink(&list) }.map(Some)
        })
    }

    /// `ncclCommGetUniqueId`: an id for `ncclCommGrow`, which oxccl lacks.
    fn ncclCommGetUniqueId / pncclCommGetUniqueId(comm: *mut c_void, unique_id: *mut UniqueIdC) {
        get(comm)?;
        let _ = unique_id;
        Err::<(), _>(Error::InvalidUsage("ncclCommGetUniqueId is for ncclCommGrow, which oxccl does not support".into()))
    }

    /// `ncclCommGrow`: not supported.
    fn ncclCommGrow / pncclCommGrow(
        comm: *mut c_void, n_ranks: c_int, unique_id: *const UniqueIdC, rank: c_int, newcomm: CommOut, config: *mut ConfigC
    ) {
        let _ = (comm, n_ranks, unique_id, rank, newcomm, config);
        Err::<(), _>(Error::InvalidUsage("ncclCommGrow is not supported by oxccl: make a new communicator".into()))
    }

    /// `ncclCommGetAsyncError`: `ncclInProgress` while a non-blocking init
    /// runs, then the init's or the communicator's error (a dead peer, an
    /// abort, a timeout).
    fn ncclCommGetAsyncError / pncclCommGetAsyncError(comm: *mut c_void, async_error: *mut NcclResult) {
        let h = get(comm)?;
        let code = match h.async_error() {
            None => IN_PROGRESS,
            Some(None) => error::SUCCESS,
            Some(Some(e)) => {
                error::set_last(&format!("ncclCommGetAsyncError: {e}"));
                error::code_of(&e)
            }
        };
        out(async_error, code, "asyncError")
    }

    /// `ncclCommCount`.
    fn ncclCommCount / pncclCommCount(comm: *const c_void, count: *mut c_int) {
        out(count, get(comm)?.nranks as c_int, "count")
    }

    /// `ncclCommCuDevice`: the CUDA device current when the communicator
    /// was made; -1 for a communicator made without one (host memory).
    fn ncclCommCuDevice / pncclCommCuDevice(comm: *const c_void, device: *mut c_int) {
        out(device, get(comm)?.cuda_device, "device")
    }

    /// `ncclCommUserRank`.
    fn ncclCommUserRank / pncclCommUserRank(comm: *const c_void, rank: *mut c_int) {
        out(rank, get(comm)?.rank as c_int, "rank")
    }

    /// `ncclCommRegister`: recorded (oxccl needs no registration ahead of
    /// a call); the handle is for `ncclCommDeregister`.
    fn ncclCommRegister / pncclCommRegister(comm: *const c_void, buff: *mut c_void, size: usize, handle: *mut *mut c_void) {
        let h = get(comm)?;
        if buff.is_null() && size > 0 {
            return Err(Error::invalid(format!("buff is NULL but size is {size}")));
        }
        let id = handle::fresh();
        out(handle, id as *mut c_void, "handle")?;
        h.regs.lock().insert(id);
        Ok(())
    }

    /// `ncclCommDeregister`.
    fn ncclCommDeregister / pncclCommDeregister(comm: *const c_void, handle: *mut c_void) {
        let h = get(comm)?;
        if h.regs.lock().remove(&(handle as usize)) {
            return Ok(());
        }
        Err(Error::invalid(format!("handle {handle:p} is not a registration of this communicator (or was deregistered)")))
    }

    /// `ncclRedOpCreatePreMulSum`: `scalar` × input, summed.
    fn ncclRedOpCreatePreMulSum / pncclRedOpCreatePreMulSum(
        op: *mut c_int, scalar: *mut c_void, datatype: c_int, residence: c_int, comm: *mut c_void
    ) {
        let h = get(comm)?;
        let dtype = dtype_of(datatype)?;
        let s = match residence {
            1 => Scalar::Value(crate::scalar::read(scalar as usize, dtype)?),
            0 if !scalar.is_null() => Scalar::At(scalar as usize),
            0 => return Err(Error::invalid("scalar is NULL")),
            r => return Err(Error::invalid(format!(
                "residence {r}: need ncclScalarDevice (0) or ncclScalarHostImmediate (1)"
            ))),
        };
        if op.is_null() {
            return Err(Error::invalid("op is NULL"));
        }
        let n = h.add_op(dtype, s)?;
        out(op, n, "op")
    }

    /// `ncclRedOpDestroy`.
    fn ncclRedOpDestroy / pncclRedOpDestroy(op: c_int, comm: *mut c_void) {
        get(comm)?.remove_op(op)
    }
}

/// `ncclGetErrorString`: NCCL's text for a result code.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGetErrorString(result: NcclResult) -> *const c_char {
    error::code_text(result).as_ptr().cast()
}

/// [`ncclGetErrorString`] under its profiling name.
#[unsafe(no_mangle)]
pub extern "C" fn pncclGetErrorString(result: NcclResult) -> *const c_char {
    ncclGetErrorString(result)
}

/// `ncclGetLastError`: this thread's last error message (any
/// communicator, or none).
#[unsafe(no_mangle)]
pub extern "C" fn ncclGetLastError(comm: *mut c_void) -> *const c_char {
    let _ = comm;
    error::last()
}

/// [`ncclGetLastError`] under its profiling name.
#[unsafe(no_mangle)]
pub extern "C" fn pncclGetLastError(comm: *mut c_void) -> *const c_char {
    ncclGetLastError(comm)
}

/// `ncclResetDebugInit`: logging is set up once per process; nothing to
/// reset.
#[unsafe(no_mangle)]
pub extern "C" fn ncclResetDebugInit() {}

/// [`ncclResetDebugInit`] under its profiling name.
#[unsafe(no_mangle)]
pub extern "C" fn pncclResetDebugInit() {}
