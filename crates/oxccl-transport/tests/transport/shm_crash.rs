//! Crash safety of shared memory: what a killed rank left in `/dev/shm`
//! (a published segment it had not yet unlinked, a half-built one) is
//! removed by the next run, which then works under the same name.

use oxccl_transport::shm::Inbox;
use std::path::Path;
use std::process::Command;

const CHILD: &str = "OXCCL_SHM_CRASH_CHILD";

/// In the child: publish a segment and exit without unlinking it (as a
/// rank killed between publishing and unlinking would).
fn child(name: &str) -> ! {
    let inbox = Inbox::create(name, 0, 2, 1, 4096).expect("create");
    std::mem::forget(inbox);
    std::process::exit(0)
}

#[test]
fn leftovers_of_dead_processes_are_removed_and_the_name_reused() {
    if let Ok(name) = std::env::var(CHILD) {
        child(&name);
    }
    let name = format!("oxccl-crashtest{}-0", std::process::id());
    let seg = Path::new("/dev/shm").join(&name);
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", "shm_crash::leftovers_of_dead_processes_are_removed_and_the_name_reused", "--nocapture"])
        .env(CHILD, &name);
    let mut kid = c.spawn().unwrap();
    let dead = kid.id();
    assert!(kid.wait().unwrap().success());
    assert!(seg.exists(), "the child left {} behind", seg.display());
    // A half-built segment of the dead process, and one of a live process
    // (this one), which must stay.
    let dead_tmp = Path::new("/dev/shm").join(format!(".{name}x.{dead}.tmp"));
    let live_tmp = Path::new("/dev/shm").join(format!(".oxccl-crashtest-live.{}.tmp", std::process::id()));
    std::fs::write(&dead_tmp, b"").unwrap();
    std::fs::write(&live_tmp, b"").unwrap();
    // The rerun under the same name works.
    let mut inbox = Inbox::create(&name, 0, 2, 1, 4096).expect("a leftover of a dead process is removed");
    assert!(!dead_tmp.exists(), "the dead process's half-built segment was removed");
    assert!(live_tmp.exists(), "a live process's file stays");
    std::fs::remove_file(&live_tmp).unwrap();
    inbox.unlink().unwrap();
    assert!(!seg.exists());
    // A segment whose creator is alive is never taken over.
    let _live = Inbox::create(&name, 0, 2, 1, 4096).unwrap();
    let e = Inbox::create(&name, 0, 2, 1, 4096).err().expect("a live segment of that name");
    assert!(e.to_string().contains("exists"), "{e}");
}
