//! One-sided cases of the conformance suite: two ranks (threads of this
//! process) joined by a fabric forced onto one provider, exercising
//! registration, exposures, gets, puts, signals, bounds and a peer that
//! goes away during a get. Each provider's test file calls them with its
//! [`Kind`]; every provider must pass them, natively or emulated.

use crate::bootstrap::{BootOptions, Bootstrap};
use crate::fabric::{Fabric, FabricOptions, OpId, RdmaOptions, ShmOptions, TcpOptions};
use crate::id::UniqueId;
use crate::provider::MemDesc;
use crate::region::Region;
use crate::{Error, Kind, Result};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a case may wait for anything.
const DEADLINE: Duration = Duration::from_secs(60);

/// Runs `f0` and `f1` as ranks 0 and 1 of a fabric forced onto `kind`
/// (with `cma` for shared memory; RDMA as the test's `OXCCL_IB_*`
/// variables say, as oxccl's `Config` would read them: the RDMA test runs
/// these cases in a child with `OXCCL_IB_PROVIDER=soft`), each on its own
/// thread.
pub fn two_ranks(
    kind: Kind,
    cma: bool,
    f0: impl FnOnce(Fabric) + Send + 'static,
    f1: impl FnOnce(Fabric) + Send + 'static,
) {
    let id = UniqueId::new().expect("a unique id");
    let rdma = RdmaOptions::from_lookup(|n| std::env::var(n).ok()).expect("the test's OXCCL_IB_* variables");
    let opts = FabricOptions {
        transport: Some(kind),
        buffsize: 64 << 10,
        timeout: DEADLINE,
        shm: ShmOptions { cma, ..ShmOptions::default() },
        tcp: TcpOptions { buffer: 64 << 10, ..FabricOptions::default().tcp },
        rdma,
    };
    let make = move |rank: usize| {
        let boot = Bootstrap::init(&id, 2, rank, &BootOptions { timeout: DEADLINE, ..BootOptions::default() })
            .unwrap_or_else(|e| panic!("{kind}: bootstrap of rank {rank}: {e}"));
        Fabric::new(Arc::new(boot), id.nonce(), &opts).unwrap_or_else(|e| panic!("{kind}: fabric of rank {rank}: {e}"))
    };
    let make1 = make.clone();
    let t1 = std::thread::spawn(move || f1(make1(1)));
    let t0 = std::thread::spawn(move || f0(make(0)));
    let (r0, r1) = (t0.join(), t1.join());
    if let Err(e) = r0.and(r1) {
        std::panic::resume_unwind(e);
    }
}

/// Polls `f` (driving the fabric) until it yields, with the deadline.
pub fn until<T>(fabric: &mut Fabric, what: &str, mut f: impl FnMut(&mut Fabric) -> Result<Option<T>>) -> Result<T> {
    let start = Instant::now();
    loop {
        fabric.progress()?;
        if let Some(v) = f(fabric)? {
            return Ok(v);
        }
        if start.elapsed() > DEADLINE {
            panic!("rank {}: no {what} within {DEADLINE:?}", fabric.rank());
        }
        fabric.wait(Duration::from_millis(1));
    }
}

fn done(fabric: &mut Fabric, op: OpId) -> Result<()> {
    until(fabric, "one-sided completion", |f| Ok(f.test(op)?.then_some(())))
}

/// Waits for a signal: its tag.
fn wait_signal(fabric: &mut Fabric, peer: usize, ch: u32) -> Result<u64> {
    until(fabric, "signal", |f| f.take_signal(peer, ch))
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31) ^ (i >> 9) as u8 ^ seed).collect()
}

/// Rank 1 exposes a read-only input and a writable output; rank 0 gets
/// ranges of the input (small, unaligned, larger than any FIFO) and puts
/// a pattern into the whole output in pieces; a signal orders the puts
/// before rank 1 looks. Counters count what moved.
pub fn get_and_put(kind: Kind, cma: bool) {
    const LEN: usize = 3 << 20;
    two_ranks(
        kind,
        cma,
        move |mut f| {
            let crate::control::Exposed { descs, tag, count } = until(&mut f, "exposure", |f| f.exposed(1)).unwrap();
            assert_eq!(
                (descs.len(), tag, count),
                (2, 0xfeed, 77),
                "{kind}: two buffers exposed, with their tag and count"
            );
            let (input, output) = (descs[0], descs[1]);
            assert!(!input.writable && output.writable, "{kind}: writability travels in the descriptor");
            let want = pattern(LEN, 7);
            for (off, len) in [(0, 1), (5, 3), (4096 - 1, 2), (100, 70_000), (0, LEN), (LEN - 9, 9), (LEN, 0)] {
                let mut buf = vec![0u8; len];
                let op = f.read(1, &input, off, Region::of_mut(&mut buf)).unwrap();
                done(&mut f, op).unwrap();
                assert!(buf == want[off..off + len], "{kind}: get of {len} bytes at {off}");
            }
            let src = pattern(LEN, 99);
            let mut at = 0;
            for piece in [1, 63, 4096, 100_001, 1 << 20] {
                let n = piece.min(LEN - at);
                let op = f.write(1, Region::of(&src[at..at + n]), &output, at).unwrap();
                done(&mut f, op).unwrap();
                at += n;
            }
            let op = f.write(1, Region::of(&src[at..]), &output, at).unwrap();
            done(&mut f, op).unwrap();
            f.signal(1, 3, 0).unwrap();
            wait_signal(&mut f, 1, 3).unwrap();
            let s = f.stats();
            let got: u64 = s.iter().map(|p| p.got).sum();
            let put: u64 = s.iter().map(|p| p.put).sum();
            let two_sided: u64 = s.iter().map(|p| p.sent + p.recv).sum();
            let reads = 1 + 3 + 2 + 70_000 + LEN + 9;
            assert_eq!((got, put, two_sided), (reads as u64, LEN as u64, 0), "{kind}: one-sided counters {s:?}");
        },
        move |mut f| {
            let input = pattern(LEN, 7);
            let mut output = vec![0u8; LEN];
            let out = Region::of_mut(&mut output);
            let e = f.expose(&[Region::of(&input), out], &[0], 0xfeed, 77).unwrap();
            wait_signal(&mut f, 0, 3).unwrap();
            assert!(output == pattern(LEN, 99), "{kind}: the puts landed before the signal");
            f.signal(0, 3, 0).unwrap();
            until(&mut f, "flush", |f| Ok(f.flushed().then_some(()))).unwrap();
            f.unexpose(e);
        },
    );
}

/// Out-of-range and read-only accesses are errors naming the access and
/// the owner; they change nothing and the fabric stays usable.
pub fn bounds_and_read_only(kind: Kind, cma: bool) {
    two_ranks(
        kind,
        cma,
        move |mut f| {
            let descs = until(&mut f, "exposure", |f| f.exposed(1)).unwrap().descs;
            let mut b = vec![0u8; 16];
            let e = f.read(1, &descs[0], 4090, Region::of_mut(&mut b)).unwrap_err();
            assert!(
                matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("outside the 4096 bytes rank 1"),
                "{kind}: {e}"
            );
            let e = f.write(1, Region::of(&b), &descs[0], 0).unwrap_err();
            assert!(e.to_string().contains("read-only"), "{kind}: {e}");
            // A descriptor altered to claim more than was registered: the
            // owner's side refuses it (cross-memory attach has no owner's
            // side: a rank that may read a peer's memory may read all of it).
            if !(kind == Kind::Shm && cma) {
                let forged = MemDesc { len: 1 << 40, ..descs[1] };
                let e = match f.read(1, &forged, 1 << 20, Region::of_mut(&mut b)) {
                    Err(e) => e,
                    Ok(op) => done(&mut f, op).unwrap_err(),
                };
                assert!(e.to_string().contains("rank 1"), "{kind}: a descriptor lying about its length: {e}");
            }
            let op = f.read(1, &descs[0], 0, Region::of_mut(&mut b)).unwrap();
            done(&mut f, op).unwrap();
            assert_eq!(b, vec![5u8; 16], "{kind}: still usable");
            f.signal(1, 0, 0).unwrap();
        },
        move |mut f| {
            let (input, mut output) = (vec![5u8; 4096], vec![0u8; 64]);
            let e = f.expose(&[Region::of(&input), Region::of_mut(&mut output)], &[0], 0, 0).unwrap();
            wait_signal(&mut f, 0, 0).unwrap();
            assert_eq!(output, vec![0u8; 64], "{kind}: nothing written");
            f.unexpose(e);
        },
    );
}

/// Signals never block and are counted per channel: many sent before
/// the peer waits for any all arrive, each channel's on its own, each with
/// its tag, in order.
pub fn signals_never_block(kind: Kind, cma: bool) {
    // Runs of equal tags, as calls signal.
    let tag = |i: u64| i / 7;
    two_ranks(
        kind,
        cma,
        move |mut f| {
            for i in 0..3000 {
                f.signal(1, (i % 3) as u32, tag(i)).unwrap();
            }
            f.signal(1, crate::P2P_CHANNEL, 5).unwrap();
            wait_signal(&mut f, 1, 9).unwrap();
        },
        move |mut f| {
            std::thread::sleep(Duration::from_millis(50));
            for ch in [2, 0, 1] {
                for k in 0..1000 {
                    let got = wait_signal(&mut f, 0, ch).unwrap();
                    assert_eq!(got, tag(k * 3 + u64::from(ch)), "{kind}: signal {k} on channel {ch}");
                }
            }
            assert_eq!(wait_signal(&mut f, 0, crate::P2P_CHANNEL).unwrap(), 5);
            for ch in 0..3 {
                assert!(f.take_signal(0, ch).unwrap().is_none(), "{kind}: exactly 1000 signals on channel {ch}");
            }
            f.signal(0, 9, 0).unwrap();
            until(&mut f, "flush", |f| Ok(f.flushed().then_some(()))).unwrap();
        },
    );
}

/// A peer that leaves (unregisters and drops its fabric, as a dying or
/// aborting rank does) while this rank reads its buffer: the next access
/// is an error naming it, not a hang and not stale bytes.
pub fn peer_leaves_during_get(kind: Kind, cma: bool) {
    const LEN: usize = 16 << 20;
    two_ranks(
        kind,
        cma,
        move |mut f| {
            let descs = until(&mut f, "exposure", |f| f.exposed(1)).unwrap().descs;
            f.signal(1, 0, 0).unwrap();
            let mut buf = vec![0u8; 1 << 20];
            let start = Instant::now();
            let e = loop {
                let r = f.read(1, &descs[0], 0, Region::of_mut(&mut buf)).and_then(|op| done(&mut f, op));
                if let Err(e) = r {
                    break e;
                }
                assert!(start.elapsed() < DEADLINE, "{kind}: reads kept succeeding after the peer left");
            };
            assert!(matches!(e, Error::Remote(_)) && e.to_string().contains("rank 1"), "{kind}: {e}");
        },
        move |mut f| {
            let input = vec![1u8; LEN];
            let e = f.expose(&[Region::of(&input)], &[0], 0, 0).unwrap();
            wait_signal(&mut f, 0, 0).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            f.unexpose(e);
            f.close();
            drop(f);
        },
    );
}

/// Every one-sided case.
pub fn run_all(kind: Kind, cma: bool) {
    get_and_put(kind, cma);
    bounds_and_read_only(kind, cma);
    signals_never_block(kind, cma);
    peer_leaves_during_get(kind, cma);
}
