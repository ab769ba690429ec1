//! Tests on a real GPU (`cargo test -p oxccl-cuda -- --ignored`; needs
//! libcuda, a device and libnvrtc). They build everywhere and are ignored.
#![allow(unsafe_code)]

use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use oxccl_core::{DataType, ReduceOp, kernels as host};
use oxccl_cuda::{Coll, CollArgs, CudaError, DevMem, Device, FLAG_BYTES, KernelOp, ReduceArgs, STATUS_TIMEOUT};

const WAIT: Duration = Duration::from_secs(30);

fn dev() -> Device {
    Device::open(0).expect("these tests need a CUDA GPU (device 0)")
}

/// xorshift64*: deterministic bytes.
fn random_bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
        })
        .collect()
}

/// A device copy of `bytes`.
fn upload(d: &Device, bytes: &[u8]) -> DevMem {
    let m = d.alloc(bytes.len()).unwrap();
    m.write(0, bytes).unwrap();
    m
}

fn download(m: &DevMem, offset: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    m.read(offset, &mut v).unwrap();
    v
}

/// (is NaN, is ±0) of one element.
fn classify(dtype: DataType, x: &[u8]) -> (bool, bool) {
    let h = || u16::from_ne_bytes([x[0], x[1]]);
    match dtype {
        DataType::Float16 => (h() & 0x7c00 == 0x7c00 && h() & 0x3ff != 0, h() & 0x7fff == 0),
        DataType::Bfloat16 => (h() & 0x7f80 == 0x7f80 && h() & 0x7f != 0, h() & 0x7fff == 0),
        DataType::Float32 => {
            let v = f32::from_ne_bytes(x.try_into().unwrap());
            (v.is_nan(), v == 0.0)
        }
        DataType::Float64 => {
            let v = f64::from_ne_bytes(x.try_into().unwrap());
            (v.is_nan(), v == 0.0)
        }
        DataType::Float8E4M3 => (x[0] & 0x7f == 0x7f, x[0] & 0x7f == 0),
        DataType::Float8E5M2 => (x[0] & 0x7f > 0x7c, x[0] & 0x7f == 0),
        _ => (false, false),
    }
}

/// Elements agree: same bits, both NaN (any payload), or both ±0.
fn same(dtype: DataType, a: &[u8], b: &[u8]) -> bool {
    let ((na, za), (nb, zb)) = (classify(dtype, a), classify(dtype, b));
    a == b || (na && nb) || (za && zb)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn device_opens_with_its_properties() {
    oxccl_cuda::driver_available().unwrap();
    let n = Device::count().unwrap();
    let d = dev();
    assert_eq!(d.ordinal(), 0);
    assert!(d.sm_count() > 0 && d.arch() >= 50, "{d:?}");
    assert_ne!(d.uuid(), [0; 16]);
    assert!(!d.name().is_empty());
    let again = Device::open(0).unwrap();
    let m1 = d.module(DataType::Float32, KernelOp::Sum).unwrap();
    let m2 = again.module(DataType::Float32, KernelOp::Sum).unwrap();
    assert!(std::sync::Arc::ptr_eq(&m1, &m2), "one module cache per device");
    let e = Device::open(n).unwrap_err();
    assert!(matches!(&e, CudaError::Invalid(m) if m.contains(&format!("device {n} does not exist"))), "{e}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn alloc_and_copies_round_trip() {
    let d = dev();
    assert!(d.alloc(0).is_err());
    let a = d.alloc_zeroed(4099).unwrap();
    assert_eq!(download(&a, 0, 4099), vec![0; 4099]);
    let data = random_bytes(1, 4099);
    a.write(0, &data).unwrap();
    assert_eq!(download(&a, 0, 4099), data);
    assert!(a.write(4000, &data[..100]).unwrap_err().to_string().contains("exceed"));

    let b = d.alloc(4099).unwrap();
    let s = d.new_stream().unwrap();
    let mut back = vec![0u8; 4096];
    // SAFETY: both allocations hold 4099 bytes; `back` outlives the copy (we synchronize).
    unsafe {
        s.memcpy_dtod(b.addr(), a.addr() + 3, 4096).unwrap();
        s.memcpy_dtoh(back.as_mut_ptr(), b.addr(), 4096).unwrap();
    }
    s.synchronize(WAIT).unwrap();
    assert_eq!(back, data[3..4099]);

    let pinned = d.pinned(4096).unwrap();
    // SAFETY: no copy uses `pinned` yet.
    unsafe { pinned.write(0, &data[..4096]).unwrap() };
    // SAFETY: `pinned` and `b` hold 4096 bytes and outlive the copies (synchronized).
    unsafe {
        s.memcpy_htod(b.addr(), pinned.as_ptr(), 4096).unwrap();
        s.memset(b.addr() + 4096, 0xab, 3).unwrap();
    }
    s.synchronize(WAIT).unwrap();
    let mut expect = data[..4096].to_vec();
    expect.extend([0xab; 3]);
    assert_eq!(download(&b, 0, 4099), expect);
}

/// `oxccl_reduce` of `srcs` (all `count` elements at element offset `shift`)
/// against oxccl-core's host kernels.
fn check_reduce(d: &Device, dtype: DataType, op: ReduceOp, nsrcs: usize, count: usize, shift: usize) {
    let es = dtype.size();
    let bytes = count * es;
    let srcs: Vec<Vec<u8>> = (0..nsrcs).map(|k| random_bytes(k as u64 * 31 + dtype as u64, bytes)).collect();
    let mut want = vec![0u8; bytes];
    let refs: Vec<&[u8]> = srcs.iter().map(|s| s.as_slice()).collect();
    host::reduce_n(dtype, op, &mut want, &refs).unwrap();

    let pad = |v: &[u8]| [vec![0u8; shift * es], v.to_vec()].concat();
    let dev_srcs: Vec<DevMem> = srcs.iter().map(|s| upload(d, &pad(s))).collect();
    let dst = d.alloc_zeroed(bytes + shift * es).unwrap();
    let mut args = ReduceArgs { count: count as u64, nsrcs: nsrcs as u32, ndsts: 1, ..Default::default() };
    for (k, m) in dev_srcs.iter().enumerate() {
        args.srcs[k] = m.addr() + (shift * es) as u64;
    }
    args.dsts[0] = dst.addr() + (shift * es) as u64;
    let module = d.module(dtype, KernelOp::of(op)).unwrap();
    let s = d.new_stream().unwrap();
    // SAFETY: every address holds `count` elements and outlives the kernel (synchronized).
    unsafe { module.launch_reduce(&s, 4 * d.sm_count(), 512, &args).unwrap() };
    s.synchronize(WAIT).unwrap();
    let got = download(&dst, shift * es, bytes);
    for i in 0..count {
        let (g, w) = (&got[i * es..(i + 1) * es], &want[i * es..(i + 1) * es]);
        assert!(same(dtype, g, w), "{dtype} {op} shift {shift}: element {i}: GPU {g:?}, host {w:?}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn reduce_kernel_matches_the_host_for_every_dtype_and_op() {
    let d = dev();
    // f32 sum of three sources, aligned and misaligned, a size with a tail.
    for shift in [0, 1] {
        check_reduce(&d, DataType::Float32, ReduceOp::Sum, 3, 100_003, shift);
    }
    // Two sources: one rounding per element, so narrow floats agree bit for bit.
    for dtype in DataType::ALL {
        for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min] {
            check_reduce(&d, dtype, op, 2, 4099, 1);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn ipc_handle_opens_in_a_child_process() {
    let d = dev();
    let mem = d.alloc_zeroed(1 << 20).unwrap();
    mem.write(0, &random_bytes(7, 4096)).unwrap();
    let handle = mem.ipc_handle().unwrap();
    let hex: String = handle.iter().map(|b| format!("{b:02x}")).collect();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["ipc_child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env("OXCCL_TEST_IPC_HANDLE", hex)
        .spawn()
        .unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > Duration::from_secs(120) {
            child.kill().unwrap();
            panic!("the IPC child did not finish in 120 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "IPC child failed: {status}");
    // The child wrote the next 4096 random bytes after the first block.
    assert_eq!(download(&mem, 4096, 4096), random_bytes(8, 4096));
}

/// The child of [`ipc_handle_opens_in_a_child_process`]; run alone, it checks
/// that opening a handle in its own process is an error, not a crash.
#[test]
#[ignore = "needs a CUDA GPU"]
fn ipc_child() {
    let d = dev();
    let Ok(hex) = std::env::var("OXCCL_TEST_IPC_HANDLE") else {
        let mem = d.alloc(4096).unwrap();
        let e = d.open_ipc(&mem.ipc_handle().unwrap()).unwrap_err();
        assert!(e.to_string().contains("cuIpcOpenMemHandle"), "{e}");
        return;
    };
    let mut handle = [0u8; 64];
    for (i, b) in handle.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
    }
    let map = d.open_ipc(&handle).unwrap();
    // The driver may map a larger block than was allocated (its granularity).
    assert!(map.len() >= 1 << 20, "mapping of {} bytes for an allocation of 1 MiB", map.len());
    let s = d.new_stream().unwrap();
    let mut got = vec![0u8; 4096];
    let next = random_bytes(8, 4096);
    // SAFETY: the mapping is 1 MiB; `got`/`next` outlive the copies (synchronized).
    unsafe {
        s.memcpy_dtoh(got.as_mut_ptr(), map.addr(), 4096).unwrap();
        s.memcpy_htod(map.addr() + 4096, next.as_ptr(), 4096).unwrap();
    }
    s.synchronize(WAIT).unwrap();
    assert_eq!(got, random_bytes(7, 4096));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn host_mapped_words_signal_and_wait() {
    let d = dev();
    let hm = d.host_mapped(64).unwrap();
    let (word, status) = (hm.dev_addr(), hm.dev_addr() + 16);
    assert!(hm.u64s().iter().all(|w| w.load(Ordering::Relaxed) == 0), "zeroed");
    let m = d.module(DataType::Float32, KernelOp::Sum).unwrap();
    let s = d.new_stream().unwrap();
    let ev = d.new_event().unwrap();

    // The GPU waits for the host.
    // SAFETY: word and status live in `hm`, which outlives the kernels (synchronized).
    unsafe { m.wait_host(&s, word, 5, status, 10_000_000_000).unwrap() };
    ev.record(&s).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert!(!ev.query().unwrap(), "the kernel must still be waiting");
    hm.u64s()[0].store(5, Ordering::Release);
    ev.synchronize(WAIT).unwrap();
    assert_eq!(hm.u32s()[4].load(Ordering::Acquire), 0, "no error status");

    // The host waits for the GPU.
    // SAFETY: as above.
    unsafe { m.signal_host(&s, word + 8, 7).unwrap() };
    let start = Instant::now();
    while hm.u64s()[1].load(Ordering::Acquire) != 7 {
        assert!(start.elapsed() < WAIT, "signal_host never arrived");
        std::hint::spin_loop();
    }

    // A wait nobody satisfies times out inside the kernel, and a host-side
    // deadline shorter than the kernel's reports Timeout.
    // SAFETY: as above.
    unsafe { m.wait_host(&s, word, 99, status, 300_000_000).unwrap() };
    ev.record(&s).unwrap();
    assert!(matches!(ev.synchronize(Duration::from_millis(10)), Err(CudaError::Timeout(_))));
    ev.synchronize(WAIT).unwrap();
    assert_eq!(hm.u32s()[4].load(Ordering::Acquire), STATUS_TIMEOUT);
    assert!(oxccl_cuda::check_status(STATUS_TIMEOUT, "wait_host").is_err());

    // The abort word ends a wait early.
    hm.u32s()[4].store(0, Ordering::Release);
    // SAFETY: as above.
    unsafe { m.wait_host(&s, word, 99, status, 60_000_000_000).unwrap() };
    hm.u32s()[5].store(1, Ordering::Release);
    s.synchronize(WAIT).unwrap();
    assert_eq!(hm.u32s()[4].load(Ordering::Acquire), oxccl_cuda::STATUS_ABORTED);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn check_device_range_names_address_and_size() {
    let d = dev();
    let mem = d.alloc(1000).unwrap();
    d.check_device_range(mem.addr(), 1000).unwrap();
    d.check_device_range(mem.addr() + 500, 500).unwrap();
    d.check_device_range(0x1234, 0).unwrap();
    let e = d.check_device_range(mem.addr() + 500, 501).unwrap_err().to_string();
    assert!(e.contains(&format!("{:#x}", mem.addr() + 500)) && e.contains("501 bytes") && e.contains("past"), "{e}");
    let on_stack = [0u8; 64];
    let e = d.check_device_range(on_stack.as_ptr() as u64, 64).unwrap_err().to_string();
    assert!(e.contains("not memory CUDA knows") && e.contains("64 bytes"), "{e}");
    let hm = d.host_mapped(64).unwrap();
    d.check_device_range(hm.dev_addr(), 64).unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_rank_all_reduce_copies_its_input() {
    let d = dev();
    let count = 10_000usize;
    let data: Vec<u8> = (0..count).flat_map(|i| (i as f32).to_ne_bytes()).collect();
    let send = upload(&d, &data);
    let recv = d.alloc_zeroed(count * 4).unwrap();
    let window = d.alloc_zeroed(1 << 16).unwrap();
    let flags = d.alloc_zeroed(FLAG_BYTES).unwrap();
    let status = d.host_mapped(8).unwrap();
    let mut a = CollArgs {
        send: send.addr(),
        recv: recv.addr(),
        count: count as u64,
        window_bytes: 1 << 16,
        timeout_ns: 10_000_000_000,
        status: status.dev_addr(),
        nranks: 1,
        coll: Coll::AllReduceOneShot as u32,
        ..Default::default()
    };
    (a.window[0], a.flags[0]) = (window.addr(), flags.addr());
    let m = d.module(DataType::Float32, KernelOp::Sum).unwrap();
    let s = d.new_stream().unwrap();
    // SAFETY: every buffer has the size the collective needs and outlives it (synchronized).
    unsafe { m.launch_collective(&s, 16, 512, &a).unwrap() };
    s.synchronize(WAIT).unwrap();
    oxccl_cuda::check_status(status.u32s()[0].load(Ordering::Acquire), "all_reduce").unwrap();
    assert_eq!(download(&recv, 0, count * 4), data);
}
