//! The conformance suite over the shared-memory provider, plus shm-specific
//! tests: two processes, segment validation, nothing left in /dev/shm,
//! by-reference sends, PidWatch.
#![cfg(not(loom))]

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use oxccl_transport::conformance::{self, Provider};
use oxccl_transport::futex::Doorbell;
use oxccl_transport::shm::{Inbox, Outbox, PidWatch, vm_read, vm_read_permitted};
use oxccl_transport::{Channel, Error, P2P_CHANNEL, Receiver, Sender};

static NEXT: AtomicU64 = AtomicU64::new(1);

fn fresh_name(tag: &str) -> String {
    format!("oxccl-test-{tag}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

fn exists(name: &str) -> bool {
    Path::new("/dev/shm").join(name).exists()
}

struct Shm;

impl Provider for Shm {
    fn name(&self) -> &str {
        "shm"
    }
    fn pair(&self, ch: Channel, capacity: usize) -> (Box<dyn Sender>, Box<dyn Receiver>) {
        let name = fresh_name("conf");
        let mut inbox = Inbox::create(&name, 1, 2, 16, capacity).unwrap();
        let outbox = Outbox::open(&name, 0).unwrap();
        inbox.unlink().unwrap();
        assert!(!exists(&name));
        // Messages of 4 KiB and more go by reference where a case offers
        // them through send_from (the receiver allows it: same process).
        let s = outbox.shm_sender(ch).unwrap().with_single_copy(4096);
        let r = inbox.shm_receiver(0, ch, Doorbell::heap()).unwrap();
        assert!(r.allow_ref(std::process::id() as i32));
        (Box::new(s), Box::new(r))
    }
}

#[test]
fn in_order_random_sizes() {
    conformance::in_order_random_sizes(&Shm);
}
#[test]
fn element_multiples() {
    conformance::element_multiples(&Shm);
}
#[test]
fn back_pressure() {
    conformance::back_pressure(&Shm);
}
#[test]
fn zero_byte_messages() {
    conformance::zero_byte_messages(&Shm);
}
#[test]
fn misuse_errors() {
    conformance::misuse_errors(&Shm);
}
#[test]
fn payload_alignment() {
    conformance::payload_alignment(&Shm);
}
#[test]
fn peer_drop() {
    conformance::peer_drop(&Shm);
}

#[test]
fn names_are_removed_on_unlink_and_on_drop() {
    let name = fresh_name("unlink");
    let mut a = Inbox::create(&name, 0, 2, 1, 4096).unwrap();
    assert!(exists(&name));
    let e = Inbox::create(&name, 1, 2, 1, 4096).err().unwrap();
    assert!(matches!(e, Error::System(_)), "{e}");
    a.unlink().unwrap();
    assert!(!exists(&name));
    assert!(Outbox::open(&name, 1).is_err(), "the name is gone");
    drop(a);
    let name2 = fresh_name("drop");
    drop(Inbox::create(&name2, 0, 2, 1, 4096).unwrap());
    assert!(!exists(&name2));
    // No private build files (`.NAME.PID.tmp`) are left either. Only this
    // test's names: other tests of this process build segments meanwhile.
    for e in std::fs::read_dir("/dev/shm").unwrap().flatten() {
        let n = e.file_name().to_string_lossy().to_string();
        assert!(!(n.contains(&name) || n.contains(&name2)), "{n}");
    }
}

#[test]
fn bad_segments_are_errors() {
    let name = fresh_name("bad");
    let path = Path::new("/dev/shm").join(&name);
    std::fs::write(&path, b"not a segment").unwrap();
    let e = Outbox::open(&name, 0).err().unwrap().to_string();
    assert!(e.contains("not a valid oxccl inbox"), "{e}");
    std::fs::write(&path, vec![0u8; 8192]).unwrap();
    let e = Outbox::open(&name, 0).err().unwrap().to_string();
    assert!(e.contains("magic"), "{e}");
    std::fs::remove_file(&path).unwrap();
    // A real segment, truncated.
    let inbox = Inbox::create(&name, 0, 2, 1, 4096).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(4096 + 100).unwrap();
    let e = Outbox::open(&name, 1).err().unwrap().to_string();
    assert!(e.contains("does not match"), "{e}");
    drop(inbox);
    assert!(Outbox::open("../etc/passwd", 0).is_err());
    assert!(Inbox::create(&fresh_name("cap"), 0, 2, 1, 5000).is_err());
    assert!(Inbox::create(&fresh_name("rank"), 2, 2, 1, 4096).is_err());
}

#[test]
fn channels_and_ranks_checked() {
    let name = fresh_name("ch");
    let inbox = Inbox::create(&name, 2, 3, 2, 4096).unwrap();
    let out = Outbox::open(&name, 0).unwrap();
    assert_eq!((out.peer(), out.peer_pid()), (2, std::process::id() as i32));
    assert!(out.sender(2).is_err(), "channel 2 of 2");
    assert!(out.sender(P2P_CHANNEL).is_ok());
    assert!(out.sender(P2P_CHANNEL).is_err(), "each end once");
    assert!(inbox.receiver(3, 0, Doorbell::heap()).is_err(), "rank 3 of 3");
    assert!(Outbox::open(&name, 3).is_err());
}

#[test]
fn by_reference_send() {
    let name = fresh_name("ref");
    let inbox = Inbox::create(&name, 1, 2, 1, 4096).unwrap();
    let out = Outbox::open(&name, 0).unwrap();
    let mut s = out.shm_sender(0).unwrap();
    let mut r = inbox.shm_receiver(0, 0, Doorbell::heap()).unwrap();
    let src: Vec<u8> = (0..3_000_017u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(s.send_ref(src.as_ptr(), src.len(), 0).unwrap(), None, "not allowed yet");
    let me = std::process::id() as i32;
    assert!(vm_read_permitted(me));
    assert!(!vm_read_permitted(i32::MAX - 1), "no such process");
    assert!(r.allow_ref(me));
    let tok = s.send_ref(src.as_ptr(), src.len(), 0).unwrap().expect("allowed");
    // An inline message after it keeps its order.
    s.begin(3).unwrap();
    s.room(3).unwrap().copy_from_slice(b"xyz");
    s.commit(3).unwrap();
    let mut got = Vec::new();
    while got.len() < src.len() {
        assert!(!s.ref_done(tok));
        let p = r.peek().unwrap().unwrap();
        assert_eq!((p.msg_len, p.offset), (src.len(), got.len()));
        assert!(p.data.len() <= 1 << 20);
        let d = p.data.to_vec();
        r.consume(d.len()).unwrap();
        got.extend(d);
    }
    assert!(got == src, "by-reference bytes differ");
    assert!(s.ref_done(tok));
    assert_eq!(r.peek().unwrap().unwrap().data, b"xyz");
    let mut b = [0u8; 4];
    assert_eq!(vm_read(me, src.as_ptr() as usize + 1, &mut b).unwrap(), 4);
    assert_eq!(b, [1, 2, 3, 4]);
    assert!(vm_read(me, 0, &mut b).is_err());
}

#[test]
fn pid_watch_sees_a_killed_process() {
    let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    let w = PidWatch::new(child.id() as i32).unwrap();
    assert!(!w.exited());
    // Child::kill sends SIGKILL.
    child.kill().unwrap();
    let t0 = Instant::now();
    while !w.exited() {
        assert!(t0.elapsed() < Duration::from_secs(30), "PidWatch never saw pid {} die", w.pid());
        std::thread::sleep(Duration::from_millis(1));
    }
    child.wait().unwrap();
    assert!(PidWatch::new(i32::MAX - 1).is_err());
}

const CHILD_ENV: &str = "OXCCL_SHM_TEST_CHILD";
const N_MSGS: usize = 2000;

fn msg_len(i: usize) -> usize {
    (i * 7919) % 9000
}

/// The child half of `two_processes`, which starts it (`--ignored --exact
/// child_sender`) with the segment's name in `OXCCL_SHM_TEST_CHILD`.
#[test]
#[ignore = "helper: the child process of two_processes"]
fn child_sender() {
    let Ok(name) = std::env::var(CHILD_ENV) else { return };
    let out = Outbox::open(&name, 0).unwrap();
    let mut s = out.shm_sender(0).unwrap();
    let t0 = Instant::now();
    for i in 0..N_MSGS {
        let len = msg_len(i);
        s.begin(len).unwrap();
        let mut off = 0;
        while off < len {
            let room = s.room(len - off).unwrap();
            if room.is_empty() {
                assert!(t0.elapsed() < Duration::from_secs(60), "child: no room for 60 s");
                std::thread::yield_now();
                continue;
            }
            let n = room.len();
            room.iter_mut().enumerate().for_each(|(k, b)| *b = (i + off + k) as u8);
            s.commit(n).unwrap();
            off += n;
        }
    }
    // Then one message by reference, if the parent allowed it.
    let src: Vec<u8> = (0..REF_LEN).map(|i| (i % 253) as u8).collect();
    let tok = loop {
        if let Some(t) = s.send_ref(src.as_ptr(), src.len(), 0).unwrap() {
            break t;
        }
        if t0.elapsed() > Duration::from_secs(10) {
            eprintln!("child: the parent did not allow by-reference messages");
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    while !s.ref_done(tok) {
        assert!(t0.elapsed() < Duration::from_secs(60), "child: by-reference message never acknowledged");
        std::thread::yield_now();
    }
}

const REF_LEN: usize = 2_500_000;

#[test]
fn two_processes() {
    let name = fresh_name("2proc");
    let mut inbox = Inbox::create(&name, 1, 2, 1, 8192).unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "conformance_shm::child_sender", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, &name)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let watch = PidWatch::new(child.id() as i32).unwrap();
    let bell = inbox.doorbell();
    let mut r = inbox.shm_receiver(0, 0, Doorbell::heap()).unwrap();
    // The parent may read its child's memory unless ptrace is locked down.
    let by_ref = r.allow_ref(child.id() as i32);
    let t0 = Instant::now();
    let mut unlinked = false;
    for i in 0..N_MSGS {
        let len = msg_len(i);
        let mut off = 0;
        loop {
            let seen = bell.seq();
            match r.peek().unwrap() {
                Some(p) => {
                    assert_eq!((p.msg_len, p.offset), (len, off), "message {i}");
                    assert!(p.data.iter().enumerate().all(|(k, &b)| b == (i + off + k) as u8), "message {i}");
                    let n = p.data.len();
                    r.consume(n).unwrap();
                    off += n;
                    if !unlinked {
                        // The child has mapped it: the name can go.
                        inbox.unlink().unwrap();
                        unlinked = true;
                    }
                    if off == len {
                        break;
                    }
                }
                None => {
                    assert!(t0.elapsed() < Duration::from_secs(60), "no message {i} from the child for 60 s");
                    bell.wait(seen, Duration::from_millis(100));
                }
            }
        }
    }
    if by_ref {
        let mut got = Vec::new();
        while got.len() < REF_LEN {
            let seen = bell.seq();
            match r.peek().unwrap() {
                Some(p) => {
                    assert_eq!((p.msg_len, p.offset), (REF_LEN, got.len()));
                    let d = p.data.to_vec();
                    r.consume(d.len()).unwrap();
                    got.extend(d);
                }
                None => {
                    assert!(t0.elapsed() < Duration::from_secs(60), "no by-reference message from the child");
                    bell.wait(seen, Duration::from_millis(100));
                }
            }
        }
        assert!(got.iter().enumerate().all(|(i, &b)| b == (i % 253) as u8), "by-reference bytes differ");
    } else {
        let why = "its by-reference part: this process may not read its child's memory (ptrace_scope; root may)";
        oxccl_skip::skip_or_fail("OXCCL_REQUIRE_CMA", why);
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "child failed: {status}");
    assert!(watch.exited());
    let e = r.peek().unwrap_err();
    assert!(e.to_string().contains("rank 0 closed its connection on channel 0"), "{e}");
    assert!(!exists(&name));
}

#[test]
fn one_sided_by_cross_memory_attach() {
    oxccl_transport::conformance::one_sided::run_all(oxccl_transport::Kind::Shm, true);
}

#[test]
fn one_sided_emulated_through_the_fifos() {
    // As where the kernel refuses process_vm_readv (OXCCL_SHM_CMA=0).
    oxccl_transport::conformance::one_sided::run_all(oxccl_transport::Kind::Shm, false);
}

#[test]
fn send_from_and_recv_into() {
    conformance::send_from_and_recv_into(&Shm);
}

#[test]
fn released_after_the_receiver_closed() {
    assert!(conformance::released_after_the_receiver_closed(&Shm), "shm did not take a 1 MiB message from its source");
}

/// A by-reference message whose sender's call failed: the receiver fails
/// to read it rather than take whatever the buffer holds by then.
#[test]
fn an_abandoned_by_reference_message_is_an_error() {
    use oxccl_transport::region::Region;
    let (mut s, mut r) = Shm.pair(2, 64 << 10);
    let src = vec![5u8; 100_000];
    assert!(s.takes_from(src.len()));
    s.send_from(Region::of(&src), 0).unwrap().expect("by reference");
    s.abandon();
    let mut dst = vec![0u8; src.len()];
    let e = r.recv_into(&Region::of_mut(&mut dst)).unwrap_err().to_string();
    assert!(e.contains("abandoned"), "{e}");
}
