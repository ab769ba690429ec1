//! Two threads calling collectives on one communicator at once (a user
//! error, as in NCCL): the call that finds the other inside is refused with
//! `ncclInvalidUsage` naming the communicator, at once, and changes nothing;
//! the other completes with the right result. Before this rule, one of the
//! two could return `ncclSuccess` with data crossed with the other's.

use nccl::api_for_benches::{ncclAllReduce, ncclCommDestroy, ncclCommInitAll, ncclGetLastError};
use std::ffi::{CStr, c_void};
use std::sync::{Barrier, mpsc};
use std::time::Duration;

/// `ncclFloat32`, `ncclSum`, `ncclInvalidUsage` (nccl.h).
const FLOAT32: i32 = 7;
const SUM: i32 = 0;
const INVALID_USAGE: i32 = 5;

#[derive(Clone, Copy)]
struct Handle(*mut c_void);
// SAFETY: an ncclComm_t may be passed between threads; the rule under test
// is about calls at the same time, which the library must refuse.
unsafe impl Send for Handle {}
// SAFETY: as above: the handle is an opaque number.
unsafe impl Sync for Handle {}

/// All-reduce of 1024 floats of `value` on `comm`; the return code, the
/// result's first element and this thread's last error.
fn all_reduce(comm: Handle, value: f32) -> (i32, f32, String) {
    let send = vec![value; 1024];
    let mut recv = vec![-1.0f32; 1024];
    // SAFETY: both buffers hold 1024 floats and outlive the call (host
    // memory: the call has ended when it returns); `comm` is live.
    let rc = unsafe {
        ncclAllReduce(send.as_ptr().cast(), recv.as_mut_ptr().cast(), 1024, FLOAT32, SUM, comm.0, std::ptr::null_mut())
    };
    // SAFETY: the library's thread-local message, valid until this thread's next failure.
    let err = unsafe { CStr::from_ptr(ncclGetLastError(comm.0)) }.to_string_lossy().into_owned();
    (rc, recv[0], err)
}

#[test]
fn a_second_thread_in_one_communicator_is_refused_and_the_first_is_right() {
    let mut comms = [std::ptr::null_mut::<c_void>(); 2];
    // SAFETY: room for 2 handles; a NULL device list (host memory here).
    assert_eq!(unsafe { ncclCommInitAll(comms.as_mut_ptr().cast(), 2, std::ptr::null()) }, 0);
    let (c0, c1) = (Handle(comms[0]), Handle(comms[1]));
    for _ in 0..20 {
        let start = Barrier::new(2);
        let (tx, rx) = mpsc::channel();
        std::thread::scope(|s| {
            for value in [1.0f32, 10.0] {
                let (tx, start) = (tx.clone(), &start);
                s.spawn(move || {
                    start.wait();
                    tx.send((value, all_reduce(c0, value))).unwrap();
                });
            }
            // One of the two returns at once, refused; then rank 1 joins the other.
            let (v_refused, refused) = rx.recv_timeout(Duration::from_secs(10)).expect("neither call returned");
            assert_eq!(refused.0, INVALID_USAGE, "the second call was not refused: {refused:?}");
            assert!(
                refused.2.contains("in a call of another thread") && refused.2.contains("rank 0 of 2"),
                "{}",
                refused.2
            );
            assert_eq!(refused.1, -1.0, "a refused call writes nothing");
            let v_other = if v_refused == 1.0 { 10.0 } else { 1.0 };
            let (rc1, got1, _) = all_reduce(c1, 100.0);
            let (v_done, done) = rx.recv_timeout(Duration::from_secs(10)).expect("the admitted call never ended");
            assert_eq!((v_done, done.0, rc1), (v_other, 0, 0));
            assert_eq!((done.1, got1), (v_other + 100.0, v_other + 100.0), "the admitted call's sum, on both ranks");
        });
    }
    for c in comms {
        // SAFETY: live handles, destroyed once.
        assert_eq!(unsafe { ncclCommDestroy(c) }, 0);
    }
}
