//! The device path's host side over the fake device: staged collectives,
//! checked against the host path on the same communicators.

use crate::device::fake::Fake;
use crate::{Communicator, Config, CudaStream, DeviceBuf, Op, Spec};
use oxccl_algo::collective::{CollKind, Collective};
use oxccl_core::{DataType, Error, ReduceOp};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Rank `r`'s input: small integers, exact in every type and any order.
fn input(rank: usize, elems: usize, dtype: DataType) -> Vec<u8> {
    let vals: Vec<f64> = (0..elems).map(|i| ((rank * 7 + i * 3) % 5) as f64).collect();
    oxccl_core::with_element_type!(dtype, T => {
        let v: Vec<T> = vals.iter().map(|&x| <T as oxccl_core::Element>::from_scalar(x)).collect();
        bytemuck::cast_slice::<T, u8>(&v).to_vec()
    })
}

/// Runs `kind` on every rank, staged through fake devices, in and out of
/// place, and compares with the host collective.
fn staged_matches_host(n: usize, kind: CollKind, count: usize, dtype: DataType, op: ReduceOp, root: usize) {
    let comms = Communicator::init_threads(n).unwrap();
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let fake = Fake::new();
                // Chunks of 12 bytes: most calls take several.
                c.use_device_backend(fake.clone(), 12);
                let coll = Collective { kind, nranks: n, count, root, dtype };
                let es = dtype.size();
                let (ni, no) = (coll.input_len(c.rank()), coll.output_len(c.rank()));
                let send = input(c.rank(), ni.max(count * n), dtype)[..ni * es].to_vec();
                let mut want = vec![0u8; no * es];
                let spec = Spec::new(kind, count, dtype).with_op(op).with_root(root);
                c.collective_bytes(spec, Some(&send), &mut want).unwrap();
                // Out of place.
                let (ds, dr) = (fake.alloc(ni * es + 3), fake.alloc(no * es + 5));
                fake.write(ds, &send);
                let stream = CudaStream(7);
                c.collective_device(spec, Some(ds), dr, stream).unwrap();
                c.device_synchronize(stream).unwrap();
                assert_eq!(fake.read(dr.sub(0, no * es).unwrap()), want, "{kind} out of place, rank {}", c.rank());
                // In place, on another stream.
                let l = coll.in_place_layout(c.rank());
                let whole = fake.alloc(l.len * es);
                fake.write(whole.sub(l.input_at * es, ni * es).unwrap(), &send);
                c.collective_device(spec, None, whole, CudaStream(8)).unwrap();
                c.device_synchronize(CudaStream(8)).unwrap();
                let got = fake.read(whole.sub(l.output_at * es, no * es).unwrap());
                assert_eq!(got, want, "{kind} in place, rank {}", c.rank());
            });
        }
    });
}

#[test]
fn every_collective_staged_matches_host() {
    for kind in CollKind::ALL {
        if kind == CollKind::SendRecv {
            continue;
        }
        for n in [1, 3] {
            staged_matches_host(n, kind, 10, DataType::Float32, ReduceOp::Sum, n - 1);
        }
    }
}

#[test]
fn staged_types_and_ops() {
    for dtype in [DataType::Int8, DataType::Float16, DataType::Bfloat16, DataType::Float64, DataType::Float8E4M3] {
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg, ReduceOp::PreMulSum { scalar: 2.0 }] {
            staged_matches_host(2, CollKind::AllReduce, 9, dtype, op, 0);
        }
    }
    staged_matches_host(2, CollKind::ReduceScatter, 5, DataType::Int32, ReduceOp::Prod, 0);
    staged_matches_host(2, CollKind::AllReduce, 0, DataType::Int32, ReduceOp::Sum, 0);
}

#[test]
fn many_calls_in_flight_reuse_staging_memory_in_order() {
    let comms = Communicator::init_threads(2).unwrap();
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let fake = Fake::new();
                c.use_device_backend(fake.clone(), 64);
                let bufs: Vec<DeviceBuf> = (0..20).map(|_| fake.alloc(400)).collect();
                for (i, b) in bufs.iter().enumerate() {
                    let v: Vec<f32> = (0..100).map(|j| (i * 100 + j + c.rank()) as f32).collect();
                    fake.write(*b, bytemuck::cast_slice(&v));
                    // Alternate streams: the calls stay in call order.
                    let st = CudaStream(1 + (i % 2) as u64);
                    c.all_reduce_device(None, *b, 100, DataType::Float32, ReduceOp::Sum, st).unwrap();
                }
                c.device_synchronize(CudaStream(1)).unwrap();
                c.device_synchronize(CudaStream(2)).unwrap();
                for (i, b) in bufs.iter().enumerate() {
                    let got: Vec<f32> = bytemuck::cast_slice(&fake.read(*b)).to_vec();
                    let want: Vec<f32> = (0..100).map(|j| (2 * (i * 100 + j) + 1) as f32).collect();
                    assert_eq!(got, want, "call {i}");
                }
            });
        }
    });
}

#[test]
fn bad_device_arguments_are_errors_that_change_nothing() {
    let comms = Communicator::init_threads(1).unwrap();
    let c = &comms[0];
    let fake = Fake::new();
    c.use_device_backend(fake.clone(), 64);
    let b = fake.alloc(16);
    fake.write(b, &[9; 16]);
    let short = c.all_reduce_device(Some(b), b, 5, DataType::Float32, ReduceOp::Sum, CudaStream(1));
    assert!(
        matches!(&short, Err(Error::InvalidArgument(m)) if m.contains("rank 0") && m.contains("all_reduce")),
        "{short:?}"
    );
    let wild = c.all_reduce_device(
        None,
        DeviceBuf::new(0xdead_0000_0000, 16),
        4,
        DataType::Int32,
        ReduceOp::Sum,
        CudaStream(1),
    );
    assert!(
        matches!(&wild, Err(Error::InvalidArgument(m)) if m.contains("the buffer") && m.contains("0xdead00000000")),
        "{wild:?}"
    );
    let null = DeviceBuf::new(0, 0);
    c.collective_device(Spec::new(CollKind::AllGather, 0, DataType::Int32), Some(null), null, CudaStream(1))
        .expect("count 0 moves nothing, whatever the pointers");
    let bcast = Spec::new(CollKind::Broadcast, 4, DataType::Int32).with_root(3);
    let root = c.collective_device(bcast, None, b, CudaStream(1));
    assert!(root.is_err());
    c.device_synchronize(CudaStream(1)).unwrap();
    assert_eq!(fake.read(b), vec![9; 16]);
}

#[test]
fn a_missing_peer_stops_the_stream_with_an_error_not_a_hang() {
    let config = Config { timeout: Some(Duration::from_millis(1500)), ..Config::default() };
    let comms = Communicator::init_threads_with(2, config).unwrap();
    // A first call together (it sets up the staging memory, which waits
    // for every rank), then rank 1 goes missing.
    let fakes: Vec<Arc<Fake>> = (0..2).map(|_| Fake::new()).collect();
    let bufs: Vec<DeviceBuf> = fakes.iter().map(|f| f.alloc(64)).collect();
    std::thread::scope(|s| {
        for ((c, fake), b) in comms.iter().zip(&fakes).zip(&bufs) {
            s.spawn(move || {
                c.use_device_backend(fake.clone(), 1 << 20);
                c.all_reduce_device(None, *b, 16, DataType::Float32, ReduceOp::Sum, CudaStream(3)).unwrap();
                c.device_synchronize(CudaStream(3)).unwrap();
            });
        }
    });
    let c = &comms[0];
    let start = Instant::now();
    c.all_reduce_device(None, bufs[0], 16, DataType::Float32, ReduceOp::Sum, CudaStream(3)).unwrap();
    let r = c.device_synchronize(CudaStream(3));
    assert!(r.is_err(), "rank 1 never called, yet {r:?}");
    assert!(start.elapsed() < Duration::from_secs(20), "took {:?}", start.elapsed());
    assert!(c.async_error().is_some());
}

#[test]
fn misaligned_device_buffers_are_refused_before_anything_runs() {
    let comms = Communicator::init_threads(1).unwrap();
    let c = &comms[0];
    let fake = Fake::new();
    c.use_device_backend(fake.clone(), 64);
    let b = fake.alloc(64);
    fake.write(b, &[9; 64]);
    let odd = DeviceBuf::new(b.addr() + 2, 32);
    let e = c.all_reduce_device(None, odd, 8, DataType::Float32, ReduceOp::Sum, CudaStream(1)).unwrap_err();
    let want = format!("{:#x}", b.addr() + 2);
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("rank 0") && m.contains("all_reduce")
            && m.contains("the buffer") && m.contains(&want) && m.contains("4 bytes")),
        "{e:?}"
    );
    let e = c.all_reduce_device(Some(odd), b, 8, DataType::Float32, ReduceOp::Sum, CudaStream(1)).unwrap_err();
    assert!(e.to_string().contains("the send buffer"), "{e}");
    // Bytes have no alignment to keep.
    c.all_reduce_device(None, DeviceBuf::new(b.addr() + 1, 8), 8, DataType::Uint8, ReduceOp::Max, CudaStream(1))
        .unwrap();
    c.device_synchronize(CudaStream(1)).unwrap();
    assert_eq!(fake.read(b), vec![9; 64]);
}

#[test]
fn staging_memory_grows_with_nothing_in_flight_at_the_same_call_on_every_rank() {
    let comms = Communicator::init_threads(2).unwrap();
    // Two ranks as if on one GPU: an allocation there can wait for the
    // other rank's queued work, so none of a call may be queued before
    // every rank has grown for it. Slow allocations let a rank run ahead.
    let shared = Arc::default();
    let fakes: Vec<Arc<Fake>> = (0..2).map(|_| Fake::beside(&shared)).collect();
    fakes[0].slow_pinned(Duration::from_millis(10));
    std::thread::scope(|s| {
        for (c, fake) in comms.iter().zip(&fakes) {
            s.spawn(move || {
                c.use_device_backend(fake.clone(), 1 << 20);
                let big = fake.alloc(400_000 * 4);
                let small: Vec<DeviceBuf> = (0..30).map(|_| fake.alloc(400)).collect();
                let (s1, s2) = (CudaStream(1), CudaStream(2));
                let f32s = |b, n| c.all_reduce_device(None, b, n, DataType::Float32, ReduceOp::Sum, s1);
                // Many small calls in flight, then larger ones.
                for b in &small[..20] {
                    f32s(*b, 100).unwrap();
                }
                f32s(big, 100_000).unwrap();
                for b in &small[20..] {
                    f32s(*b, 100).unwrap();
                }
                // All-gather: the output is twice the input on every rank.
                let (half, whole) = (big.sub(0, 400_000).unwrap(), big.sub(400_000, 800_000).unwrap());
                let u8s = DataType::Uint8;
                c.collective_device(Spec::new(CollKind::AllGather, 400_000, u8s), Some(half), whole, s2).unwrap();
                f32s(big, 400_000).unwrap();
                c.device_synchronize(s1).unwrap();
                c.device_synchronize(s2).unwrap();
            });
        }
    });
    let log = fakes[0].pinned_log();
    // Each rank's own calls were all passed when it allocated.
    assert!(log.iter().all(|&(_, pending, _)| pending == 0), "allocated with calls in flight: {log:?}");
    // Calls 0, 20, 31 and 32 grew (one end marker per call and rank): no
    // rank had enqueued its growing call when any rank allocated for it.
    let at: std::collections::BTreeSet<u64> = log.iter().map(|&(_, _, created)| created).collect();
    assert_eq!(at, [0, 40, 62, 64].into(), "{log:?}");
    // Both ranks grew alike: 64 KiB in every slot, then 512 KiB (the budget
    // allows all eight), then 1 MiB outputs only, then 2 MiB.
    let sizes: Vec<usize> = log.iter().map(|&(b, _, _)| b).collect();
    let count = |b: usize| sizes.iter().filter(|&&x| x == b).count();
    let want = [(64 << 10, 32), (512 << 10, 32), (1 << 20, 16), (2 << 20, 32)];
    assert_eq!(want.map(|(b, _)| (b, count(b))), want, "{sizes:?}");
    assert_eq!(sizes.len(), 112);
}

/// Bytes of message `k` from `from` to `to` (recognisable, different per message).
fn p2p_bytes(from: usize, to: usize, k: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (from * 31 + to * 7 + k * 13 + i) as u8).collect()
}

/// Every rank sends `per_pair` messages of `lens` to every rank (itself
/// too) and receives them, sends first in its group (both ends of every
/// pair send before they receive), through the staged path on fake
/// devices; every byte lands in its own buffer, in order.
fn staged_exchange(n: usize, per_pair: usize, lens: &[usize]) {
    let comms = Communicator::init_threads(n).unwrap();
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let fake = Fake::new();
                c.use_device_backend(fake.clone(), 1 << 20);
                let me = c.rank();
                let len = |peer: usize, k: usize| lens[(me + peer + k) % lens.len()];
                let rlen = |peer: usize, k: usize| lens[(peer + me + k) % lens.len()];
                let mut ops = Vec::new();
                let mut recvs = Vec::new();
                for peer in 0..n {
                    for k in 0..per_pair {
                        let b = fake.alloc(len(peer, k));
                        fake.write(b, &p2p_bytes(me, peer, k, len(peer, k)));
                        ops.push(Op::send(b, DataType::Uint8, peer));
                    }
                }
                for peer in (0..n).rev() {
                    for k in 0..per_pair {
                        let b = fake.alloc(rlen(peer, k));
                        recvs.push((peer, k, b));
                        ops.push(Op::recv(b, DataType::Uint8, peer));
                    }
                }
                let stream = CudaStream(3);
                c.run_ops(&ops, &[stream]).unwrap();
                c.device_synchronize(stream).unwrap();
                for (peer, k, b) in recvs {
                    assert_eq!(
                        fake.read(b),
                        p2p_bytes(peer, me, k, rlen(peer, k)),
                        "rank {me}: message {k} from {peer}"
                    );
                }
            });
        }
    });
}

#[test]
fn staged_groups_of_sends_and_receives_deliver_in_order() {
    // Messages of several pieces (P2P_CHUNK is 128 KiB), empty ones, and
    // several per pair.
    staged_exchange(3, 2, &[0, 5, 300_001, 1000]);
    staged_exchange(2, 3, &[131_072, 7]);
    staged_exchange(1, 2, &[9]);
}

#[test]
fn device_send_recv_errors_name_the_operation_and_change_nothing() {
    let comms = Communicator::init_threads(2).unwrap();
    let c = &comms[0];
    let fake = Fake::new();
    c.use_device_backend(fake.clone(), 1 << 20);
    let b = fake.alloc(8);
    let e = c.send_device(b, DataType::Float32, 2, CudaStream(1)).unwrap_err().to_string();
    assert!(e.contains("rank 0") && e.contains("send (operation 0") && e.contains("peer 2"), "{e}");
    let odd = fake.alloc(6);
    let e = c.recv_device(odd, DataType::Float32, 1, CudaStream(1)).unwrap_err().to_string();
    assert!(e.contains("recv (operation 0") && e.contains("6 bytes"), "{e}");
    let too_many: Vec<Op> = (0..33).map(|_| Op::send(b, DataType::Uint8, 1)).collect();
    let e = c.run_ops(&too_many, &[CudaStream(1)]).unwrap_err().to_string();
    assert!(e.contains("33 sends") && e.contains("split the group"), "{e}");
    // Nothing was sent: rank 1 sees no message, rank 0 still works.
    assert!(c.async_error().is_none());
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

/// One launch may mix host and device operations: every rank's group
/// holds a device all-reduce, a host all-reduce, a device ring exchange and
/// a host ring exchange. The host part has ended when the group returns;
/// the device part when its stream has run.
#[test]
fn a_launch_mixing_host_and_device_operations_runs_both() {
    let n = 3;
    let comms = Communicator::init_threads(n).unwrap();
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let fake = Fake::new();
                c.use_device_backend(fake.clone(), 16);
                let me = c.rank();
                let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
                let dsum = fake.alloc(40);
                fake.write(dsum, &f32_bytes(&[(me + 1) as f32; 10]));
                let (dsend, drecv) = (fake.alloc(8), fake.alloc(8));
                fake.write(dsend, &[me as u8 + 100; 8]);
                let hs = vec![(me * 10) as i32; 5];
                let mut hr = vec![0i32; 5];
                let hsend = vec![me as u8; 3];
                let mut hrecv = vec![9u8; 3];
                let stream = CudaStream(5);
                c.group(|g| {
                    g.stream(stream);
                    g.send(&hsend, next).recv_device(drecv, DataType::Uint8, prev);
                    g.collective_device(Spec::new(CollKind::AllReduce, 10, DataType::Float32), None, dsum);
                    g.all_reduce(&hs, &mut hr, ReduceOp::Sum);
                    g.recv(&mut hrecv, prev).send_device(dsend, DataType::Uint8, next);
                })
                .unwrap();
                assert_eq!(hr, vec![30; 5], "rank {me}: the host all-reduce");
                assert_eq!(hrecv, vec![prev as u8; 3], "rank {me}: the host message");
                c.device_synchronize(stream).unwrap();
                assert_eq!(fake.read(dsum), f32_bytes(&[6.0; 10]), "rank {me}: the device all-reduce");
                assert_eq!(fake.read(drecv), vec![prev as u8 + 100; 8], "rank {me}: the device message");
            });
        }
    });
}

/// A launch on several streams: they all wait for what came before on any
/// of them, and all of them wait for the launch (NCCL's rule), so waiting
/// for the second stream waits for a collective that ran on the first.
#[test]
fn a_launch_on_several_streams_joins_them() {
    let comms = Communicator::init_threads(2).unwrap();
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let fake = Fake::new();
                c.use_device_backend(fake.clone(), 1 << 20);
                let b = fake.alloc(4000);
                fake.write(b, &f32_bytes(&[1.0; 1000]));
                if c.rank() == 1 {
                    // Rank 0's launch cannot finish before rank 1's starts.
                    std::thread::sleep(Duration::from_millis(300));
                }
                let (s1, s2) = (CudaStream(1), CudaStream(2));
                c.group(|g| {
                    g.stream(s1).stream(s2);
                    g.collective_device(Spec::new(CollKind::AllReduce, 1000, DataType::Float32), None, b);
                })
                .unwrap();
                c.device_synchronize(s2).unwrap();
                assert_eq!(fake.read(b), f32_bytes(&[2.0; 1000]), "rank {}: after its second stream", c.rank());
                c.device_synchronize(s1).unwrap();
            });
        }
    });
}

#[test]
fn streams_go_with_device_operations_only() {
    let comms = Communicator::init_threads(1).unwrap();
    let c = &comms[0];
    let fake = Fake::new();
    c.use_device_backend(fake.clone(), 64);
    let b = fake.alloc(16);
    let op = Op::collective(Spec::new(CollKind::AllReduce, 4, DataType::Int32), None, b.into(), 0, 1).unwrap();
    let e = c.run_ops(&[op], &[]).unwrap_err().to_string();
    assert!(e.contains("rank 0") && e.contains("all_reduce on device memory needs a CUDA stream"), "{e}");
    let mut host = [0u8; 4];
    let hop = Op::collective(
        Spec::new(CollKind::AllReduce, 1, DataType::Int32),
        None,
        crate::Buffer::Host(crate::Region::of_mut(&mut host)),
        0,
        1,
    )
    .unwrap();
    let e = c.run_ops(&[hop], &[CudaStream(7)]).unwrap_err().to_string();
    assert!(e.contains("host memory") && e.contains("pass none") && e.contains("0x7"), "{e}");
    // An operation checked for another communicator's rank is refused.
    let other = Op::collective(Spec::new(CollKind::AllReduce, 4, DataType::Int32), None, b.into(), 1, 2).unwrap();
    let e = c.run_ops(&[other], &[CudaStream(1)]).unwrap_err().to_string();
    assert!(e.contains("checked for rank 1 of 2"), "{e}");
    c.run_ops(&[op, hop], &[CudaStream(1)]).unwrap();
    c.device_synchronize(CudaStream(1)).unwrap();
}
