//! Groups (`ncclGroupStart`/`ncclGroupEnd`): per thread, nestable, and
//! spanning communicators. Calls inside a group are checked when they are
//! made (an error is returned at once and fails the group) and launched
//! together at the outermost `ncclGroupEnd`: each communicator's calls as
//! one oxccl launch (`Communicator::launch`: device calls enqueued on their
//! streams, host calls run to their end; a group may mix them), several
//! communicators' at once from this thread (as `ncclCommInitAll` clients
//! and nccl-tests `-g` drive them).

use crate::handle::Comm;
use oxccl::{Communicator, CudaStream, Error, Op, Result};
use std::cell::RefCell;
use std::sync::Arc;

/// A checked call waiting for its launch: the operation and, for device
/// memory, the stream it is ordered on.
type Entry = (Arc<Comm>, Arc<Communicator>, Op, Option<CudaStream>);

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
            Some(e) => Err(context(e, "nothing in the group was launched: a call of it failed")),
            None => Ok(Some((deferred, ops))),
        }
    })
}

/// The same error (and so the same code) with `what` in front of its message.
fn context(e: Error, what: &str) -> Error {
    match e {
        Error::InvalidArgument(m) => Error::InvalidArgument(format!("{what}: {m}")),
        Error::InvalidUsage(m) => Error::InvalidUsage(format!("{what}: {m}")),
        Error::InvalidProgram(m) => Error::InvalidProgram(format!("{what}: {m}")),
        Error::System(m) => Error::System(format!("{what}: {m}")),
        Error::Remote(m) => Error::Remote(format!("{what}: {m}")),
        Error::Timeout(m) => Error::Timeout(format!("{what}: {m}")),
        Error::Unavailable(m) => Error::Unavailable(format!("{what}: {m}")),
        Error::Internal(m) => Error::Internal(format!("{what}: {m}")),
        other => other,
    }
}

/// `ncclGroupEnd`.
pub fn end() -> Result<()> {
    match close()? {
        Some((deferred, ops)) => {
            all_at_once(deferred)?;
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

/// Runs jobs at once, on this thread when there is one, else one thread
/// each; waits for all of them and returns the first error.
fn all_at_once<F: FnOnce() -> Result<()> + Send>(jobs: Vec<F>) -> Result<()> {
    if jobs.len() == 1 {
        return jobs.into_iter().next().expect("one")();
    }
    std::thread::scope(|s| {
        let threads: Vec<_> = jobs.into_iter().map(|f| s.spawn(f)).collect();
        let mut first = None;
        for t in threads {
            let r = t.join().unwrap_or_else(|_| Err(Error::Internal("a thread of an NCCL group panicked".into())));
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    })
}

/// `ncclGroupSimulateEnd`: closes the group without launching it; the
/// predicted time of its collectives in seconds.
pub fn simulate_end() -> Result<f64> {
    let Some((deferred, ops)) = close()? else {
        return Ok(0.0);
    };
    // Inits, splits and shrinks happen even in a simulated group (NCCL's
    // rule): only the calls are priced instead of run.
    all_at_once(deferred)?;
    let mut t = 0.0;
    for (_, c, op, _) in ops {
        if let Op::Collective(call) = op {
            let s = call.spec();
            t += c.estimate(s.kind, s.count, s.dtype, s.root)?.unwrap_or(0.0);
        }
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

/// Runs a checked call now, or records it in the open group (`stream`:
/// the device stream it is ordered on, `None` for host memory).
pub fn submit(h: Arc<Comm>, c: Arc<Communicator>, op: Op, stream: Option<CudaStream>) -> Result<()> {
    let entry = (h, c, op, stream);
    let entry = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 {
            g.ops.push(entry);
            None
        } else {
            Some(entry)
        }
    });
    match entry {
        // One call outside a group, the common case: straight to its
        // communicator (what `launch` does for one, without its lists).
        Some((h, c, op, stream)) => {
            let _entered = h.enter()?;
            // SAFETY: as in `launch`: the C caller keeps its buffers valid
            // until this call returns (host memory: after the operation
            // ended) or their stream passes it (device memory).
            unsafe { c.launch(std::slice::from_ref(&op), stream.as_slice()) }
        }
        None => Ok(()),
    }
}

/// Launches calls, each communicator's as one launch, in order: on this
/// thread when there is one communicator, else one thread per
/// communicator, all at once (a communicator's first device call and
/// `OXCCL_CHECK`'s comparison wait for the other ranks, which later
/// communicators of this thread are).
fn launch(ops: Vec<Entry>) -> Result<()> {
    // Per communicator handle: the communicator, its operations and the
    // streams they name, in order.
    type Launch = (usize, Arc<Communicator>, Vec<Op>, Vec<CudaStream>);
    let mut per: Vec<Launch> = Vec::new();
    // Each handle is entered for the launch (refused when another thread's
    // call is in it), and left when the launch has ended or been enqueued.
    let mut entered = Vec::new();
    for (h, c, op, stream) in ops {
        let i = match per.iter().position(|p| p.0 == h.handle) {
            Some(i) => i,
            None => {
                entered.push(h.enter()?);
                per.push((h.handle, c, Vec::new(), Vec::new()));
                per.len() - 1
            }
        };
        let (_, _, v, streams) = &mut per[i];
        v.push(op);
        if let Some(s) = stream
            && !streams.contains(&s)
        {
            streams.push(s);
        }
    }
    all_at_once(
        per.into_iter()
            .map(|(_, c, ops, streams)| {
                // SAFETY: the C caller keeps its buffers valid until the
                // call (or the group) returns, which is after this launch
                // has ended (host operations) or been enqueued (device
                // operations, valid until their streams pass them, NCCL's
                // contract): `launch` returns then, and `all_at_once` joins
                // every thread before returning.
                move || unsafe { c.launch(&ops, &streams) }
            })
            .collect(),
    )
}
