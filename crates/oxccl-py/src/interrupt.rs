//! Ctrl-C while a call blocks with the GIL released.
//!
//! Python runs its SIGINT handler (raising `KeyboardInterrupt`) only when
//! the main thread next runs bytecode, which a call blocked in oxccl does
//! not do before its deadline (`OXCCL_TIMEOUT`). So the first blocking call
//! hooks SIGINT (chained to Python's handler, which still runs) to a pipe
//! that a watcher thread reads: at a SIGINT it aborts every communicator
//! with a call in flight (each registered once, when Python gets it;
//! a call counts itself in flight), that call returns at once, and the caller, with
//! the GIL again, lets Python run its handler (`check_signals`), which
//! raises `KeyboardInterrupt` in its place. The communicator is left
//! aborted, as after any failure, and its peers learn it.
//!
//! A handler that Python code installs later (`signal.signal(SIGINT, …)`)
//! replaces the hook at the OS level: calls then wait for their deadline.

use oxccl::{Aborter, Communicator};
use parking_lot::Mutex;
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

/// Every communicator Python holds, as the watcher sees it.
static WATCHED: Mutex<Vec<Weak<Watch>>> = Mutex::new(Vec::new());

/// Hooks SIGINT once; whether it is hooked (a failure is logged once and
/// leaves calls as they were: ended by their deadline).
fn hooked() -> bool {
    static HOOK: OnceLock<bool> = OnceLock::new();
    *HOOK.get_or_init(|| match hook() {
        Ok(()) => true,
        Err(e) => {
            eprintln!("oxccl: Ctrl-C cannot interrupt blocked calls: {e}");
            false
        }
    })
}

fn hook() -> std::io::Result<()> {
    let (mut read, write) = UnixStream::pair()?;
    signal_hook::low_level::pipe::register(signal_hook::consts::SIGINT, write)?;
    std::thread::Builder::new().name("oxccl-sigint".into()).spawn(move || {
        let mut b = [0u8; 64];
        loop {
            match read.read(&mut b) {
                Ok(0) => return,
                Ok(_) => {
                    // The calls in flight at the signal, all of them before
                    // any is aborted: an abort lets its caller go on, and a
                    // call it then makes on another communicator (a peer's,
                    // in a process of thread ranks) was not interrupted.
                    let hit: Vec<Arc<Watch>> = WATCHED
                        .lock()
                        .iter()
                        .filter_map(Weak::upgrade)
                        .filter(|w| w.in_flight.load(Ordering::Acquire) > 0)
                        .collect();
                    for w in hit {
                        w.hits.fetch_add(1, Ordering::AcqRel);
                        w.aborter.abort();
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    })?;
    Ok(())
}

/// One communicator's calls in flight, registered with the watcher once
/// (a call then costs two atomic counts, not a registration).
pub(crate) struct Watch {
    in_flight: AtomicUsize,
    /// SIGINTs that aborted a call of this communicator.
    hits: AtomicU64,
    aborter: Aborter,
}

impl Watch {
    /// Watches the calls on `c`. SIGINT itself is hooked at the first
    /// blocking call, as before: a handler the program installs between
    /// init and that call is chained to, not replaced.
    pub(crate) fn new(c: &Communicator) -> Arc<Watch> {
        let w = Arc::new(Watch { in_flight: AtomicUsize::new(0), hits: AtomicU64::new(0), aborter: c.aborter() });
        let mut all = WATCHED.lock();
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(&w));
        w
    }

    /// Runs `f`, a call on the watched communicator; whether a SIGINT
    /// aborted it (never, when SIGINT cannot be hooked).
    pub(crate) fn call<T>(&self, f: impl FnOnce() -> T) -> (T, bool) {
        if !hooked() {
            return (f(), false);
        }
        let before = self.hits.load(Ordering::Acquire);
        let r = {
            let _flight = InFlight::enter(&self.in_flight);
            f()
        };
        (r, self.hits.load(Ordering::Acquire) != before)
    }
}

/// A call counted in flight until dropped (also when it unwinds: a count
/// left behind would let every later SIGINT abort the communicator).
struct InFlight<'a>(&'a AtomicUsize);

impl<'a> InFlight<'a> {
    fn enter(n: &'a AtomicUsize) -> InFlight<'a> {
        n.fetch_add(1, Ordering::AcqRel);
        InFlight(n)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
