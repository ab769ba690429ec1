//! Collectives on device buffers, on a real GPU: every collective × type ×
//! operator against the host path on the same communicator, with ranks as
//! threads and as processes sharing GPU 0, on the direct and the staged
//! path, and a rank killed mid-collective.
//!
//! Every test here needs a CUDA GPU and is `#[ignore]`d; on the GPU machine:
//! `test-device_gpu --ignored --test-threads=1`. Without one, `no_gpu_is_an_error_value`
//! runs everywhere.
//!
//! Nothing here can hang a run: communicators have a short `OXCCL_TIMEOUT`
//! (a kernel waiting for a peer gives up with an error), and children are
//! waited for with a deadline (then killed). Each rank allocates its device
//! buffers and stream once: freeing device memory (and some allocations)
//! waits for every kernel queued on the GPU, a peer thread's too, which
//! may be waiting for this rank's next call.

use oxccl::{CollKind, Communicator, Config, CudaStream, DataType, DeviceBuf, DeviceExec, DevicePath, ReduceOp, Spec};
use oxccl_algo::algos::Algorithm;
use oxccl_algo::collective::Collective;
use oxccl_cuda::Device;
use oxccl_cuda::{DevMem, Stream};
use oxccl_e2e::child::{self, await_line, fresh_id, output_within, spawn};
use std::time::{Duration, Instant};

/// How long a device wait may take in these tests (a hang becomes an error).
const TIMEOUT: Duration = Duration::from_secs(20);

/// How long a child process may run.
const CHILD_LIMIT: Duration = Duration::from_secs(300);

/// One rank's device buffers and stream, made once and reused by every case.
struct Bufs {
    send: DevMem,
    recv: DevMem,
    whole: DevMem,
    stream: Stream,
}

impl Bufs {
    /// Room for every case of [`matrix`] up to `max_count` elements on `n` ranks.
    fn new(dev: &Device, n: usize, max_count: usize) -> Result<Bufs, String> {
        let bytes = max_count.max(1) * n * 8 + 64;
        let alloc = || dev.alloc_zeroed(bytes).map_err(|e| e.to_string());
        Ok(Bufs {
            send: alloc()?,
            recv: alloc()?,
            whole: alloc()?,
            stream: dev.new_stream().map_err(|e| e.to_string())?,
        })
    }
}

/// One call on device buffers, in or out of place, against the host path.
fn check(c: &Communicator, bufs: &Bufs, spec: Spec, in_place: bool) -> Result<(), String> {
    let Spec { kind, count, dtype, op, root } = spec;
    let (n, rank, es) = (c.size(), c.rank(), dtype.size());
    let coll = Collective { kind, nranks: n, count, root, dtype };
    let (ni, no) = (coll.input_len(rank), coll.output_len(rank));
    // The kit's exact inputs: their reductions are exact in every type
    // whatever the rounding order (the device kernels round once, the host
    // path after every step).
    let (input, _) = oxccl_e2e::input_of(&coll, op, rank);
    let send = oxccl_e2e::bytes(&input, ni * es).to_vec();
    let op = oxccl_e2e::rank_op(op, rank);
    let spec = spec.with_op(op);
    let mut want = vec![0u8; no * es];
    c.collective_bytes(spec, Some(&send), &mut want).map_err(|e| e.to_string())?;
    let s = CudaStream::from_raw(bufs.stream.raw() as usize as u64);
    let got = if in_place {
        let l = coll.in_place_layout(rank);
        let whole = &bufs.whole;
        whole.write(0, &vec![0u8; l.len * es]).map_err(|e| e.to_string())?;
        whole.write(l.input_at * es, &send).map_err(|e| e.to_string())?;
        c.collective_device(spec, None, DeviceBuf::new(whole.addr(), l.len * es), s).map_err(|e| e.to_string())?;
        c.device_synchronize(s).map_err(|e| e.to_string())?;
        let mut out = vec![0u8; no * es];
        whole.read(l.output_at * es, &mut out).map_err(|e| e.to_string())?;
        out
    } else {
        let (ds, dr) = (&bufs.send, &bufs.recv);
        dr.write(0, &vec![0u8; no * es]).map_err(|e| e.to_string())?;
        ds.write(0, &send).map_err(|e| e.to_string())?;
        let (bs, br) = (DeviceBuf::new(ds.addr(), ni * es), DeviceBuf::new(dr.addr(), no * es));
        c.collective_device(spec, Some(bs), br, s).map_err(|e| e.to_string())?;
        c.device_synchronize(s).map_err(|e| e.to_string())?;
        let mut out = vec![0u8; no * es];
        dr.read(0, &mut out).map_err(|e| e.to_string())?;
        out
    };
    if got != want {
        let first = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
        return Err(format!(
            "rank {rank}: {kind} {dtype} {op} count {count} root {root} in_place {in_place}: byte {first} differs"
        ));
    }
    Ok(())
}

/// Every collective × type × operator on one rank (the others run the same).
fn matrix(c: &Communicator, counts: &[usize]) -> Result<usize, String> {
    let dev = Device::open(0).map_err(|e| e.to_string())?;
    let bufs = Bufs::new(&dev, c.size(), counts.iter().copied().max().unwrap_or(0))?;
    let mut cases = 0;
    for kind in oxccl_e2e::kinds() {
        let dtypes: &[DataType] = if kind.reduces() { &DataType::ALL } else { &[DataType::Float32, DataType::Int8] };
        for &dtype in dtypes {
            for op in oxccl_e2e::ops(kind, dtype) {
                for &count in counts {
                    for in_place in [false, true] {
                        let spec = Spec::new(kind, count, dtype).with_op(op).with_root(c.size() - 1);
                        check(c, &bufs, spec, in_place).map_err(|e| {
                            format!("rank {} case {cases} ({spec:?}, in_place {in_place}): {e}", c.rank())
                        })?;
                        cases += 1;
                    }
                }
            }
        }
    }
    Ok(cases)
}

fn threads(n: usize, path: DevicePath) {
    let cfg =
        Config { device_path: Some(path), device_window: Some(256 << 10), timeout: Some(TIMEOUT), ..Config::default() };
    let comms = Communicator::init_threads_with(n, cfg).unwrap();
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                // 100_003 elements: larger than the window, so the kernels iterate.
                let cases = matrix(c, &[0, 1, 7, 1000, 100_003]).unwrap();
                assert!(cases > 1000, "{cases}");
            });
        }
    });
}

#[test]
fn no_gpu_is_an_error_value() {
    // Here (CI) there is no driver: the first device call says so, and the
    // host path keeps working. On a GPU machine the call is checked instead.
    let comms = Communicator::init_threads(1).unwrap();
    let c = &comms[0];
    let r = c.all_reduce_device(
        None,
        DeviceBuf::new(0x1000, 64),
        16,
        DataType::Float32,
        ReduceOp::Sum,
        CudaStream::DEFAULT,
    );
    if oxccl_cuda::driver_available().is_err() {
        let e = r.unwrap_err().to_string();
        assert!(e.contains("CUDA unavailable"), "{e}");
    } else {
        assert!(r.is_err(), "0x1000 is not device memory");
    }
    let mut v = [1.0f32; 4];
    c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
    assert_eq!(v, [1.0; 4]);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn threads_direct_2_and_4_ranks_on_one_gpu() {
    threads(2, DevicePath::Direct);
    threads(4, DevicePath::Direct);
}

/// Every algorithm of oxccl-algo for every collective it implements,
/// through the device executor (`OXCCL_DEVICE_EXEC=program`: a program it
/// cannot run is an error, so nothing falls back to the hand-written
/// kernel unseen), `n` ranks as threads on one GPU, against the host path;
/// on `nchannels` channels where given (programs split by data, up to the
/// device FIFOs' 4).
fn executor_threads(n: usize, algos: &[Algorithm], nchannels: Option<usize>) {
    for &algo in algos {
        let cfg = Config {
            nchannels,
            device_path: Some(DevicePath::Direct),
            device_exec: Some(DeviceExec::Program),
            algo: Some(algo.name().into()),
            // rhd and the premul copy of 70_001 doubles on 4 ranks need
            // more than 4 MiB of window.
            device_window: Some(8 << 20),
            // The executor refuses a message longer than its FIFO (8
            // slots): 70_001 doubles on 2 ranks (rhd, doubling) need more
            // than the default 512 KiB.
            device_fifo: Some(8 << 20),
            timeout: Some(TIMEOUT),
            ..Config::default()
        };
        let comms = Communicator::init_threads_with(n, cfg).unwrap();
        let kinds: Vec<CollKind> = algo.kinds().iter().copied().filter(|k| *k != CollKind::SendRecv).collect();
        std::thread::scope(|s| {
            for c in &comms {
                let kinds = &kinds;
                s.spawn(move || {
                    let dev = Device::open(0).unwrap();
                    let bufs = Bufs::new(&dev, n, 70_001).unwrap();
                    for &kind in kinds {
                        for (dtype, op) in [
                            (DataType::Float32, ReduceOp::Sum),
                            (DataType::Bfloat16, ReduceOp::Avg),
                            (DataType::Int32, ReduceOp::Max),
                            (DataType::Float64, ReduceOp::PreMulSum { scalar: 0.5 }),
                        ] {
                            if !kind.reduces() && dtype != DataType::Float32 {
                                continue;
                            }
                            for count in [1, 1000, 70_001] {
                                for in_place in [false, true] {
                                    let spec = Spec::new(kind, count, dtype).with_op(op).with_root(n - 1);
                                    check(c, &bufs, spec, in_place).unwrap_or_else(|e| {
                                        panic!("{algo}: rank {} {spec:?} in_place {in_place}: {e}", c.rank())
                                    });
                                }
                            }
                        }
                    }
                });
            }
        });
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_algorithm_through_the_device_executor_2_and_4_threads() {
    executor_threads(2, &Algorithm::ALL, None);
    executor_threads(4, &Algorithm::ALL, None);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn split_programs_through_the_device_executor_on_3_channels() {
    let algos = [Algorithm::Ring, Algorithm::Tree, Algorithm::OneShot, Algorithm::Ordered];
    executor_threads(2, &algos, Some(3));
    executor_threads(4, &algos, Some(3));
}

/// Every rank sends two messages to every rank (itself included) and
/// receives them, sends first in each group (both ends of a pair send
/// before they receive), on device buffers; every byte checked.
fn p2p_threads(n: usize, path: DevicePath) {
    let cfg = Config { device_path: Some(path), timeout: Some(TIMEOUT), ..Config::default() };
    let comms = Communicator::init_threads_with(n, cfg).unwrap();
    let bytes = |from: usize, to: usize, k: usize, len: usize| -> Vec<u8> {
        (0..len).map(|i| (from * 31 + to * 7 + k * 13 + i) as u8).collect()
    };
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let dev = Device::open(0).unwrap();
                let stream = dev.new_stream().unwrap();
                let cs = CudaStream::from_raw(stream.raw() as usize as u64);
                let me = c.rank();
                // Buffers live to the end: freeing device memory waits for
                // the GPU's queued work, a peer's waiting kernel too.
                let mut keep = Vec::new();
                for len in [1usize, 4096, 3 << 20] {
                    let mut ops = Vec::new();
                    for peer in 0..n {
                        for k in 0..2 {
                            let b = dev.alloc_zeroed(len).unwrap();
                            b.write(0, &bytes(me, peer, k, len)).unwrap();
                            ops.push((true, peer, DeviceBuf::new(b.addr(), len)));
                            keep.push(b);
                        }
                    }
                    let mut recvs = Vec::new();
                    for peer in (0..n).rev() {
                        for k in 0..2 {
                            let b = dev.alloc_zeroed(len).unwrap();
                            ops.push((false, peer, DeviceBuf::new(b.addr(), len)));
                            recvs.push((peer, k, b));
                        }
                    }
                    c.group(|g| {
                        g.stream(cs);
                        for &(send, peer, b) in &ops {
                            if send {
                                g.send_device(b, DataType::Uint8, peer);
                            } else {
                                g.recv_device(b, DataType::Uint8, peer);
                            }
                        }
                    })
                    .unwrap();
                    c.device_synchronize(cs).unwrap();
                    for (peer, k, b) in &recvs {
                        let mut got = vec![0u8; len];
                        b.read(0, &mut got).unwrap();
                        assert!(got == bytes(*peer, me, *k, len), "rank {me}: {len} bytes, message {k} from {peer}");
                    }
                    keep.extend(recvs.into_iter().map(|r| r.2));
                }
                // Every rank is past its kernels before any frees.
                c.barrier().unwrap();
                drop(keep);
            });
        }
    });
}

/// One group per rank mixing host and device buffers (ranks as threads):
/// a device all-reduce and a device ring exchange enqueued on the stream,
/// a host all-reduce and a host ring exchange run to their end.
fn mixed_threads(n: usize, path: DevicePath) {
    let cfg = Config { device_path: Some(path), timeout: Some(TIMEOUT), ..Config::default() };
    let comms = Communicator::init_threads_with(n, cfg).unwrap();
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let dev = Device::open(0).unwrap();
                let stream = dev.new_stream().unwrap();
                let cs = CudaStream::from_raw(stream.raw() as usize as u64);
                let me = c.rank();
                let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
                let count = 1000;
                let sum = dev.alloc_zeroed(count * 4).unwrap();
                sum.write(0, bytemuck::cast_slice(&vec![(me + 1) as f32; count])).unwrap();
                let (dsend, drecv) = (dev.alloc_zeroed(64).unwrap(), dev.alloc_zeroed(64).unwrap());
                dsend.write(0, &[me as u8 + 100; 64]).unwrap();
                let hs = vec![me as i64; 10];
                let mut hr = vec![0i64; 10];
                let hsend = vec![me as u8; 5];
                let mut hrecv = vec![0u8; 5];
                c.group(|g| {
                    g.stream(cs);
                    let spec = Spec::new(CollKind::AllReduce, count, DataType::Float32);
                    g.collective_device(spec, None, DeviceBuf::new(sum.addr(), count * 4));
                    g.all_reduce(&hs, &mut hr, ReduceOp::Sum);
                    g.send_device(DeviceBuf::new(dsend.addr(), 64), DataType::Uint8, next);
                    g.recv_device(DeviceBuf::new(drecv.addr(), 64), DataType::Uint8, prev);
                    g.send(&hsend, next).recv(&mut hrecv, prev);
                })
                .unwrap();
                assert_eq!(hr, vec![(n * (n - 1) / 2) as i64; 10], "rank {me}: host all-reduce");
                assert_eq!(hrecv, vec![prev as u8; 5], "rank {me}: host message");
                c.device_synchronize(cs).unwrap();
                let mut got = vec![0u8; count * 4];
                sum.read(0, &mut got).unwrap();
                let want = (n * (n + 1) / 2) as f32;
                assert!(
                    bytemuck::cast_slice::<u8, f32>(&got).iter().all(|&x| x == want),
                    "rank {me}: device all-reduce"
                );
                let mut msg = vec![0u8; 64];
                drecv.read(0, &mut msg).unwrap();
                assert_eq!(msg, vec![prev as u8 + 100; 64], "rank {me}: device message");
                // Every rank is past its kernels before any frees.
                c.barrier().unwrap();
            });
        }
    });
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn groups_mixing_host_and_device_buffers_direct_and_staged() {
    mixed_threads(2, DevicePath::Direct);
    mixed_threads(3, DevicePath::Staged);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn device_send_recv_groups_direct_and_staged() {
    p2p_threads(2, DevicePath::Direct);
    p2p_threads(4, DevicePath::Direct);
    p2p_threads(3, DevicePath::Staged);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn threads_staged_2_ranks() {
    threads(2, DevicePath::Staged);
}

#[test]
#[ignore = "a rank's body, started by the process tests"]
fn child() {
    let Some((mode, id, rank, size)) = child::rank_env() else { return };
    let cfg = Config { device_window: Some(256 << 10), timeout: Some(TIMEOUT), ..Config::default() };
    let comm = Communicator::init(&id, size, rank, cfg).unwrap();
    let result = match mode.as_str() {
        "matrix" => matrix(&comm, &[0, 7, 100_003]).map(|n| println!("CASES {n}")),
        "loop" => {
            let dev = Device::open(0).unwrap();
            let buf = dev.alloc_zeroed(16 << 20).unwrap();
            let b = DeviceBuf::new(buf.addr(), 16 << 20);
            let mut i = 0u64;
            loop {
                let r = comm
                    .all_reduce_device(None, b, 4 << 20, DataType::Float32, ReduceOp::Max, CudaStream::DEFAULT)
                    .and_then(|()| comm.device_synchronize(CudaStream::DEFAULT));
                if let Err(e) = r {
                    break Err(e.to_string());
                }
                i += 1;
                if i == 3 {
                    println!("READY");
                }
            }
        }
        other => Err(format!("unknown mode {other}")),
    };
    child::report(result);
}

/// The variables of a child: its path, and a short timeout.
fn child_env(path: &str) -> [(&str, &str); 2] {
    [("OXCCL_DEVICE_PATH", path), ("OXCCL_TIMEOUT", "20")]
}

fn processes(n: usize, path: &str) {
    let id = fresh_id();
    let kids: Vec<_> = (0..n).map(|r| spawn(&[], &id, n, r, "matrix", &child_env(path))).collect();
    let start = Instant::now();
    for (r, k) in kids.into_iter().enumerate() {
        let (ok, text) = output_within(k, CHILD_LIMIT.saturating_sub(start.elapsed()));
        assert!(ok && text.contains("\nOK"), "rank {r} ({path}):\n{text}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn processes_2_and_4_ranks_on_one_gpu_through_cuda_ipc() {
    processes(2, "direct");
    processes(4, "direct");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn processes_staged_through_shared_memory() {
    processes(2, "staged");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_killed_rank_is_an_error_on_the_others_not_a_hang() {
    for path in ["direct", "staged"] {
        let id = fresh_id();
        let mut kids: Vec<_> = (0..3).map(|r| spawn(&[], &id, 3, r, "loop", &child_env(path))).collect();
        let ready = await_line(&mut kids[1], "READY", Duration::from_secs(120));
        kids[1].kill().unwrap();
        let _ = kids[1].wait();
        let start = Instant::now();
        let mut texts = Vec::new();
        for r in [0, 2] {
            let (_, text) = output_within(kids.remove(if r == 0 { 0 } else { 1 }), Duration::from_secs(60));
            texts.push(text);
        }
        assert!(ready, "{path}: rank 1 never got going; the others said {texts:?}");
        for (r, text) in [0, 2].iter().zip(&texts) {
            assert!(text.contains("ERROR"), "rank {r} ({path}): {text}");
        }
        assert!(start.elapsed() < Duration::from_secs(15), "{path}: took {:?}", start.elapsed());
    }
}
