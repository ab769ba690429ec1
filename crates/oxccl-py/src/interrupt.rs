//! Ctrl-C while a call blocks with the GIL released.
//!
//! Python runs its SIGINT handler (raising `KeyboardInterrupt`) only when
//! the main thread next runs bytecode, which a call blocked in oxccl does
//! not do before its deadline (`OXCCL_TIMEOUT`). So the first blocking call
//! hooks SIGINT (chained to Python's handler, which still runs) to a pipe
//! that a watcher thread reads: at a SIGINT it aborts every communicator
//! with a call in flight, that call returns at once, and the caller, with
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
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The calls in flight: their communicators and whether a SIGINT hit them.
static ACTIVE: Mutex<Vec<(u64, Aborter, Arc<AtomicBool>)>> = Mutex::new(Vec::new());
static NEXT: AtomicU64 = AtomicU64::new(0);

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
                    for (_, aborter, hit) in ACTIVE.lock().iter() {
                        hit.store(true, Ordering::Release);
                        aborter.abort();
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    })?;
    Ok(())
}

/// One call in flight, registered with the watcher until dropped.
pub(crate) struct Watch {
    id: u64,
    hit: Arc<AtomicBool>,
}

impl Watch {
    /// Watches a call on `c` (nothing when SIGINT cannot be hooked).
    pub(crate) fn new(c: &Communicator) -> Option<Watch> {
        if !hooked() {
            return None;
        }
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        let hit = Arc::new(AtomicBool::new(false));
        ACTIVE.lock().push((id, c.aborter(), hit.clone()));
        Some(Watch { id, hit })
    }

    /// Whether a SIGINT aborted the call.
    pub(crate) fn interrupted(&self) -> bool {
        self.hit.load(Ordering::Acquire)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        ACTIVE.lock().retain(|(id, _, _)| *id != self.id);
    }
}
