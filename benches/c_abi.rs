//! What the C ABI adds per call: an 8-byte all-reduce on a one-rank
//! communicator (nothing moves, so the call path is all that is timed)
//! through `Communicator::all_reduce` and through `ncclAllReduce`, side by
//! side; and a two-rank all-reduce, one thread driving both ranks in an
//! NCCL group. `cargo bench -p oxccl-benches --bench c_abi`.
#![allow(unsafe_code, missing_docs)]

use criterion::{Criterion, criterion_group, criterion_main};
use oxccl::{Communicator, ReduceOp};
use std::ffi::c_void;
use std::hint::black_box;

fn one_rank(c: &mut Criterion) {
    let comm = Communicator::init_threads(1).unwrap().pop().unwrap();
    let (send, mut recv) = ([1.0f32, 2.0], [0.0f32; 2]);
    let mut g = c.benchmark_group("allreduce_8B_1rank");
    g.bench_function("rust_api", |b| b.iter(|| comm.all_reduce(black_box(&send), &mut recv, ReduceOp::Sum).unwrap()));
    let mut h: *mut c_void = std::ptr::null_mut();
    // SAFETY: `h` receives one handle.
    assert_eq!(unsafe { nccl::api_for_benches::ncclCommInitAll(&mut h, 1, std::ptr::null()) }, 0);
    g.bench_function("c_abi", |b| {
        b.iter(|| {
            // SAFETY: 2 floats each, a live handle, a NULL stream for host memory.
            let r = unsafe {
                nccl::api_for_benches::ncclAllReduce(
                    black_box(send.as_ptr().cast()),
                    recv.as_mut_ptr().cast(),
                    2,
                    7,
                    0,
                    h,
                    std::ptr::null_mut(),
                )
            };
            assert_eq!(r, 0);
        })
    });
    g.finish();
    // SAFETY: destroys the handle made above, once.
    assert_eq!(unsafe { nccl::api_for_benches::ncclCommDestroy(h) }, 0);
}

criterion_group!(benches, one_rank);
criterion_main!(benches);
