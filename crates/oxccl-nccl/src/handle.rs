//! Communicator handles: what `ncclComm_t` points at.
//!
//! A handle is an opaque number, never an address the library frees: the
//! registry maps it to the communicator, numbers are never reused, so a
//! handle that was destroyed (or never existed) is refused with
//! `ncclInvalidArgument` instead of being dereferenced.
//!
//! Ownership and threads: the caller owns a handle from `ncclCommInit*` /
//! `ncclCommSplit` / `ncclCommShrink` until `ncclCommDestroy` or
//! `ncclCommAbort`, which make it invalid. A handle runs one thread's calls
//! at a time (NCCL's rule): a collective, send/recv or group end that
//! enters a handle another thread's call is in is refused with
//! `ncclInvalidUsage` naming the handle ([`Comm::enter`]), since calls from
//! several threads would reach the ranks in different orders and pair
//! crosswise. Queries, `ncclCommGetAsyncError` and `ncclCommAbort` may come
//! from any thread at any time.

use oxccl::{Communicator, DataType, Error, ReduceOp, Result};
use parking_lot::Condvar;
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// NCCL's `ncclNumOps`: user-created operators are numbered from here.
pub const NUM_OPS: i32 = 5;

/// Where an init running on its own thread leaves its outcome.
#[derive(Default)]
struct Slot {
    /// `(finished, outcome)`: the outcome is taken once, by whoever settles
    /// the handle first; `finished` stays.
    state: Mutex<(bool, Option<Result<Communicator>>)>,
    cv: Condvar,
}

/// A communicator's life.
enum State {
    /// An init still running on its own thread (non-blocking, or in a
    /// group).
    Pending(Arc<Slot>),
    Ready(Arc<Communicator>),
    /// Init failed (non-blocking init reports it through
    /// `ncclCommGetAsyncError`).
    Failed(Error),
}

/// A pre-multiplied sum created by `ncclRedOpCreatePreMulSum`.
#[derive(Clone, Copy, Debug)]
pub enum Scalar {
    /// Read when the operator was created (`ncclScalarHostImmediate`).
    Value(f64),
    /// Read at each call from this address (`ncclScalarDevice`: device or
    /// host memory).
    At(usize),
}

/// What a handle holds.
pub struct Comm {
    /// The number the handle is.
    pub handle: usize,
    state: Mutex<State>,
    /// The CUDA device current when it was made, or the one
    /// `ncclCommInitAll`'s list names (`ncclCommCuDevice`); -1 without one.
    pub cuda_device: i32,
    /// Rank and size, known before a non-blocking init ends.
    pub rank: usize,
    /// Number of ranks.
    pub nranks: usize,
    /// User operators: `op - NUM_OPS` indexes them; `None` once destroyed.
    ops: Mutex<Vec<Option<(DataType, Scalar)>>>,
    /// Live registration handles (`ncclCommRegister`).
    pub regs: Mutex<HashSet<usize>>,
    /// A thread's call is in this handle ([`Comm::enter`]).
    busy: AtomicBool,
}

/// A thread's call in a handle; leaving it when dropped.
pub struct Entered(Arc<Comm>);

impl Drop for Entered {
    fn drop(&mut self) {
        self.0.busy.store(false, Ordering::Release);
    }
}

static COMMS: Mutex<Option<HashMap<usize, Arc<Comm>>>> = Mutex::new(None);
/// Handle numbers: multiples of 16 from 0x10000, never reused, so they
/// look like (and print as) addresses but are never dereferenced.
static NEXT: AtomicUsize = AtomicUsize::new(0x1000);

/// A fresh number, never handed out before (handles, registrations).
pub fn fresh() -> usize {
    NEXT.fetch_add(1, Ordering::Relaxed) << 4
}

impl Comm {
    fn new(rank: usize, nranks: usize, cuda_device: i32, state: State) -> Arc<Comm> {
        let c = Arc::new(Comm {
            handle: fresh(),
            state: Mutex::new(state),
            cuda_device,
            rank,
            nranks,
            ops: Mutex::new(Vec::new()),
            regs: Mutex::new(HashSet::new()),
            busy: AtomicBool::new(false),
        });
        COMMS.lock().get_or_insert_with(HashMap::new).insert(c.handle, c.clone());
        c
    }

    /// Registers a communicator made now, on the calling thread's device.
    pub fn ready(comm: Communicator) -> Arc<Comm> {
        Comm::ready_on(comm, cuda_device())
    }

    /// Registers a communicator made now for CUDA device `device`
    /// (`ncclCommInitAll`'s list).
    pub fn ready_on(comm: Communicator, device: i32) -> Arc<Comm> {
        let (rank, nranks) = (comm.rank(), comm.size());
        Comm::new(rank, nranks, device, State::Ready(Arc::new(comm)))
    }

    /// Registers a communicator whose init `f` runs on a thread of its
    /// own (non-blocking init, an init in a group).
    pub fn spawn(
        rank: usize,
        nranks: usize,
        f: impl FnOnce() -> Result<Communicator> + Send + 'static,
    ) -> Result<Arc<Comm>> {
        let slot = Arc::new(Slot::default());
        let s2 = slot.clone();
        std::thread::Builder::new()
            .name(format!("oxccl-init-r{rank}"))
            .spawn(move || {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
                    .unwrap_or_else(|_| Err(Error::Internal("the init thread panicked".into())));
                *s2.state.lock() = (true, Some(r));
                s2.cv.notify_all();
            })
            .map_err(|e| Error::System(format!("cannot start the init thread: {e}")))?;
        Ok(Comm::new(rank, nranks, cuda_device(), State::Pending(slot)))
    }

    /// Enters the handle for a call that runs collectives or send/recv on
    /// it: refused while another thread's call is in it.
    pub fn enter(self: &Arc<Self>) -> Result<Entered> {
        if self.busy.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            return Err(Error::InvalidUsage(format!(
                "communicator {:#x} (rank {} of {}) is in a call of another thread: a communicator takes one \
                 thread's calls at a time (NCCL's rule; use a communicator per thread, or order the calls)",
                self.handle, self.rank, self.nranks
            )));
        }
        Ok(Entered(self.clone()))
    }

    /// The handle `h` (an error names it when it is NULL, unknown or
    /// destroyed).
    pub fn get(h: usize) -> Result<Arc<Comm>> {
        if h == 0 {
            return Err(Error::invalid("comm is NULL"));
        }
        COMMS.lock().as_ref().and_then(|m| m.get(&h).cloned()).ok_or_else(|| {
            Error::invalid(format!("comm {h:#x} is not a communicator (never created, or already destroyed)"))
        })
    }

    /// Forgets a handle (destroy, abort): later uses are refused.
    pub fn remove(&self) {
        if let Some(m) = COMMS.lock().as_mut() {
            m.remove(&self.handle);
        }
    }

    /// Moves a finished init to its outcome (under the state's lock, once).
    fn settle(&self) {
        let mut st = self.state.lock();
        let taken = match &*st {
            State::Pending(slot) => slot.state.lock().1.take(),
            _ => None,
        };
        if let Some(r) = taken {
            *st = match r {
                Ok(c) => State::Ready(Arc::new(c)),
                Err(e) => State::Failed(e),
            };
        }
    }

    /// The communicator, when its init has ended well.
    pub fn comm(&self) -> Result<Arc<Communicator>> {
        if let State::Ready(c) = &*self.state.lock() {
            return Ok(c.clone());
        }
        self.settle();
        match &*self.state.lock() {
            State::Ready(c) => Ok(c.clone()),
            State::Pending(_) => Err(Error::InvalidUsage(format!(
                "comm {:#x} (rank {}) is still initializing: poll ncclCommGetAsyncError until it is not ncclInProgress",
                self.handle, self.rank
            ))),
            State::Failed(e) => Err(e.clone()),
        }
    }

    /// `None` while a non-blocking init runs; else its outcome, then the
    /// communicator's asynchronous error.
    pub fn async_error(&self) -> Option<Option<Error>> {
        self.settle();
        match &*self.state.lock() {
            State::Pending(_) => None,
            State::Failed(e) => Some(Some(e.clone())),
            State::Ready(c) => Some(c.async_error()),
        }
    }

    /// Waits for a running init to end (the state reads `Pending`
    /// meanwhile, so other threads see `ncclInProgress`).
    pub fn join(&self) {
        let slot = match &*self.state.lock() {
            State::Pending(slot) => slot.clone(),
            _ => return,
        };
        let mut st = slot.state.lock();
        while !st.0 {
            slot.cv.wait(&mut st);
        }
        drop(st);
        self.settle();
    }

    /// Forgets the handle and ends the communicator: dropped (`abort`:
    /// aborted, which the other ranks learn). An init still running is
    /// left to finish on its thread and is ended then, so this never
    /// waits for a rendezvous.
    pub fn discard(self: Arc<Self>, abort: bool) {
        self.remove();
        self.settle();
        let end = move |c: &Comm| {
            if let State::Ready(comm) =
                std::mem::replace(&mut *c.state.lock(), State::Failed(Error::InvalidUsage("destroyed".into())))
                && abort
            {
                comm.abort();
            }
        };
        if matches!(&*self.state.lock(), State::Pending(_)) {
            std::thread::spawn(move || {
                self.join();
                end(&self);
            });
        } else {
            end(&self);
        }
    }

    /// Adds a user operator; its number.
    pub fn add_op(&self, dtype: DataType, scalar: Scalar) -> Result<i32> {
        let mut ops = self.ops.lock();
        let slot = ops.iter().position(Option::is_none).unwrap_or(ops.len());
        let n = NUM_OPS
            .checked_add(i32::try_from(slot).map_err(|_| Error::invalid("too many reduction operators"))?)
            .ok_or_else(|| Error::invalid("too many reduction operators"))?;
        if slot == ops.len() {
            ops.push(None);
        }
        ops[slot] = Some((dtype, scalar));
        Ok(n)
    }

    /// Removes user operator `op`.
    pub fn remove_op(&self, op: i32) -> Result<()> {
        let mut ops = self.ops.lock();
        match op.checked_sub(NUM_OPS).and_then(|i| usize::try_from(i).ok()).and_then(|i| ops.get_mut(i)) {
            Some(slot @ Some(_)) => {
                *slot = None;
                Ok(())
            }
            _ => Err(Error::invalid(format!(
                "op {op} is not a reduction operator ncclRedOpCreatePreMulSum made on this communicator"
            ))),
        }
    }

    /// Operator `op` for elements of `dtype`: a built-in one, or a user
    /// operator (whose scalar is read now when it lives in memory).
    pub fn op(&self, op: i32, dtype: DataType) -> Result<ReduceOp> {
        let builtin = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg];
        if let Some(&o) = usize::try_from(op).ok().and_then(|i| builtin.get(i)) {
            return Ok(o);
        }
        let user = op
            .checked_sub(NUM_OPS)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| self.ops.lock().get(i).copied().flatten());
        let Some((made_for, scalar)) = user else {
            return Err(Error::invalid(format!(
                "op {op} is neither a built-in ncclRedOp_t (0 to 4) nor an operator made by ncclRedOpCreatePreMulSum on this communicator"
            )));
        };
        if made_for != dtype {
            return Err(Error::invalid(format!("op {op} was made for {made_for} elements; this call is on {dtype}")));
        }
        let scalar = match scalar {
            Scalar::Value(v) => v,
            Scalar::At(addr) => crate::scalar::read(addr, dtype)?,
        };
        Ok(ReduceOp::PreMulSum { scalar })
    }
}

/// The calling thread's CUDA device, -1 without one.
fn cuda_device() -> i32 {
    #[cfg(feature = "cuda")]
    if let Some(d) = oxccl_cuda::current_device() {
        return d as i32;
    }
    -1
}
