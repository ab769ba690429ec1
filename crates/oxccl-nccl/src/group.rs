//! Groups (`ncclGroupStart`/`ncclGroupEnd`): per thread, nestable, and
//! spanning communicators. Calls inside a group are checked when they are
//! made (an error is returned at once and fails the group) and launched
//! together at the outermost `ncclGroupEnd`: each communicator's host
//! calls as one oxccl group (collectives in order, then every send and
//! receive at once), several communicators' at once from this thread (as
//! `ncclCommInitAll` clients and nccl-tests `-g` drive them), device calls
//! enqueued on their streams in order.

use crate::handle::Comm;
use oxccl::{CollKind, Communicator, CudaStream, DataType, DeviceBuf, Error, RawOp, ReduceOp, Result};
use std::cell::RefCell;
use std::sync::Arc;

/// A collective on device buffers, for the device path.
#[derive(Clone, Copy, Debug)]
pub struct DeviceCall {
    /// What is computed.
    pub kind: CollKind,
    /// `None`: in place.
    pub send: Option<DeviceBuf>,
    /// The receive (or in-place) buffer.
    pub recv: DeviceBuf,
    /// NCCL's count.
    pub count: usize,
    /// Element type.
    pub dtype: DataType,
    /// Reduction.
    pub op: ReduceOp,
    /// Root.
    pub root: usize,
    /// The caller's stream.
    pub stream: CudaStream,
}

/// A checked call waiting for its launch.
#[derive(Clone, Copy, Debug)]
pub enum Pending {
    /// On host memory.
    Host(RawOp),
    /// On device memory.
    Device(DeviceCall),
}

type Entry = (Arc<Comm>, Arc<Communicator>, Pending);

/// Work a group defers to its end and runs on threads of its own, all at
/// once: communicator inits and splits, which are collective and would
/// deadlock one by one when one thread makes several ranks' (nccl-tests'
/// `ncclGroupStart(); ncclCommInitRank(…) × n; ncclGroupEnd()`).
pub type Deferred = Box<dyn FnOnce() -> Result<()> + Send>;

#[derive(Default)]
struct State {
    depth: usize,
    ops: Vec<Entry>,
    deferred: Vec<Deferred>,
    error: Option<Error>,
}

thread_local! {
    static GROUP: RefCell<State> = RefCell::new(State::default());
}

/// `ncclGroupStart`.
pub fn start() {
    GROUP.with(|g| g.borrow_mut().depth += 1);
}

/// Ends one level; the recorded calls at the outermost level (an error
/// recorded in the group fails it, and nothing is launched).
fn close() -> Result<Option<(Vec<Deferred>, Vec<Entry>)>> {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(Error::InvalidUsage("ncclGroupEnd without a matching ncclGroupStart".into()));
        }
        g.depth -= 1;
        if g.depth > 0 {
            return Ok(None);
        }
        let ops = std::mem::take(&mut g.ops);
        let deferred = std::mem::take(&mut g.deferred);
        match g.error.take() {
            Some(e) => Err(Error::InvalidUsage(format!(
                "a call of this group failed ({e}); nothing in the group was launched"
            ))),
            None => Ok(Some((deferred, ops))),
        }
    })
}

/// `ncclGroupEnd`.
pub fn end() -> Result<()> {
    match close()? {
        Some((deferred, ops)) => {
            run_deferred(deferred)?;
            launch(ops)
        }
        None => Ok(()),
    }
}

/// Runs `f` at the end of the open group (on a thread of its own, beside
/// the group's other deferred work), or now when no group is open.
pub fn defer(f: Deferred) -> Result<()> {
    let f = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 {
            g.deferred.push(f);
            None
        } else {
            Some(f)
        }
    });
    match f {
        Some(f) => f(),
        None => Ok(()),
    }
}

/// Runs deferred work on threads, all at once; the first error.
fn run_deferred(work: Vec<Deferred>) -> Result<()> {
    if work.len() == 1 {
        return work.into_iter().next().expect("one")();
    }
    let threads: Vec<_> = work.into_iter().map(std::thread::spawn).collect();
    let mut first = None;
    for t in threads {
        let r = t.join().unwrap_or_else(|_| Err(Error::Internal("a group's init thread panicked".into())));
        if let Err(e) = r {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

/// `ncclGroupSimulateEnd`: closes the group without launching it; the
/// predicted time of its collectives in seconds.
pub fn simulate_end() -> Result<f64> {
    let Some((_, ops)) = close()? else {
        return Ok(0.0);
    };
    let mut t = 0.0;
    for (_, c, p) in ops {
        let (kind, count, dtype, root) = match p {
            Pending::Host(RawOp::Collective(call)) => (call.kind, call.count, call.dtype, call.root),
            Pending::Device(d) => (d.kind, d.count, d.dtype, d.root),
            Pending::Host(_) => continue,
        };
        t += c.estimate(kind, count, dtype, root)?.unwrap_or(0.0);
    }
    Ok(t)
}

/// Whether the calling thread is inside a group.
pub fn active() -> bool {
    GROUP.with(|g| g.borrow().depth > 0)
}

/// Records a failed call of an open group (the group then fails).
pub fn fail(e: &Error) {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 && g.error.is_none() {
            g.error = Some(e.clone());
        }
    });
}

/// Runs a checked call now, or records it in the open group.
pub fn submit(h: Arc<Comm>, c: Arc<Communicator>, p: Pending) -> Result<()> {
    let queued = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 {
            g.ops.push((h.clone(), c.clone(), p));
            true
        } else {
            false
        }
    });
    if queued { Ok(()) } else { launch(vec![(h, c, p)]) }
}

/// Launches calls: device ones on their streams in order, host ones as one
/// oxccl group per communicator (on this thread when there is one
/// communicator, else started on each and then waited for).
fn launch(ops: Vec<Entry>) -> Result<()> {
    let mut host: Vec<(usize, Arc<Communicator>, Vec<RawOp>)> = Vec::new();
    for (h, c, p) in ops {
        match p {
            Pending::Device(d) => {
                c.collective_device(d.kind, d.send, d.recv, d.count, d.dtype, d.op, d.root, d.stream)?;
            }
            Pending::Host(op) => match host.iter_mut().find(|(k, _, _)| *k == h.handle) {
                Some((_, _, v)) => v.push(op),
                None => host.push((h.handle, c, vec![op])),
            },
        }
    }
    if host.len() == 1 {
        let (_, c, ops) = host.pop().expect("one");
        // SAFETY: the C caller keeps its buffers valid until the call (or
        // the group) returns, which is after the launch has ended.
        return unsafe { c.run_raw(ops) };
    }
    let mut works = Vec::with_capacity(host.len());
    let mut first: Option<Error> = None;
    for (_, c, ops) in host {
        // SAFETY: as above: this function waits for every started launch
        // before it returns.
        match unsafe { c.start_raw(ops) } {
            Ok(w) => works.push(w),
            Err(e) => {
                first.get_or_insert(e);
            }
        }
    }
    for w in works {
        if let Err(e) = w.wait_done() {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}
