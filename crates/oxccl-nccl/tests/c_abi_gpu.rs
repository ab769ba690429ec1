//! The C ABI on a GPU, through the functions C programs call (linked as a
//! Rust library): a group that mixes host and device buffers. Needs a CUDA
//! GPU, so `#[ignore]`d; the GPU check runs it.

use nccl::api_for_benches::{
    ncclAllReduce, ncclCommDestroy, ncclCommInitAll, ncclGroupEnd, ncclGroupStart, ncclRecv, ncclSend,
};
use oxccl_cuda::Device;
use std::ffi::c_void;

/// `ncclInt32`, `ncclUint8`, `ncclFloat32`, `ncclSum` (nccl.h).
const INT32: i32 = 2;
const UINT8: i32 = 1;
const FLOAT32: i32 = 7;
const SUM: i32 = 0;

/// A handle that crosses to a rank's thread.
#[derive(Clone, Copy)]
struct Handle(*mut c_void);
// SAFETY: an ncclComm_t is usable from any thread (one at a time, which
// each rank's thread is).
unsafe impl Send for Handle {}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_group_mixing_host_and_device_buffers() {
    let n = 2;
    let mut comms = vec![std::ptr::null_mut::<c_void>(); n];
    let devs = vec![0i32; n];
    // SAFETY: `comms` holds `n` handles; `devs` names `n` devices.
    assert_eq!(unsafe { ncclCommInitAll(comms.as_mut_ptr().cast(), n as i32, devs.as_ptr()) }, 0);
    let handles: Vec<Handle> = comms.iter().map(|&c| Handle(c)).collect();
    std::thread::scope(|s| {
        for (rank, &h) in handles.iter().enumerate() {
            s.spawn(move || {
                let comm = h;
                let dev = Device::open(0).unwrap();
                let stream = dev.new_stream().unwrap();
                let st = stream.raw() as *mut c_void;
                let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
                let count = 4096;
                let sum = dev.alloc_zeroed(count * 4).unwrap();
                sum.write(0, bytemuck::cast_slice(&vec![(rank + 1) as f32; count])).unwrap();
                let hs = [rank as i32 + 1; 16];
                let mut hr = vec![0i32; 16];
                let hsend = [rank as u8; 8];
                let mut hrecv = vec![0u8; 8];
                let d = sum.addr() as *mut c_void;
                let null = std::ptr::null_mut();
                // SAFETY: every buffer outlives the group (host ones are
                // done when ncclGroupEnd returns, the device one is read
                // after the stream is synchronized); `comm` is this rank's.
                let rcs = unsafe {
                    [
                        ncclGroupStart(),
                        ncclAllReduce(d, d, count, FLOAT32, SUM, comm.0, st),
                        ncclAllReduce(hs.as_ptr().cast(), hr.as_mut_ptr().cast(), 16, INT32, SUM, comm.0, null),
                        ncclSend(hsend.as_ptr().cast(), 8, UINT8, next as i32, comm.0, null),
                        ncclRecv(hrecv.as_mut_ptr().cast(), 8, UINT8, prev as i32, comm.0, null),
                        ncclGroupEnd(),
                    ]
                };
                assert_eq!(rcs, [0; 6], "rank {rank}");
                assert_eq!(hr, vec![3; 16], "rank {rank}: the host all-reduce");
                assert_eq!(hrecv, vec![prev as u8; 8], "rank {rank}: the host message");
                stream.synchronize(std::time::Duration::from_secs(20)).unwrap();
                let mut got = vec![0u8; count * 4];
                sum.read(0, &mut got).unwrap();
                assert!(bytemuck::cast_slice::<u8, f32>(&got).iter().all(|&x| x == 3.0), "rank {rank}: device");
            });
        }
    });
    for c in comms {
        // SAFETY: each handle is destroyed once, after its rank's thread ended.
        assert_eq!(unsafe { ncclCommDestroy(c.cast()) }, 0);
    }
}
