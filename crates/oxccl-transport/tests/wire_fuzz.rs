//! Hostile bytes against the wire decoders and a live TCP receiver: random
//! streams, truncated valid streams and single-byte mutations. Never a
//! panic, never a hang (the finite stream ends in `Ok` or an error), and no
//! allocation beyond a bound (a length field of 1 TiB allocates nothing).
#![allow(unsafe_code)]

use oxccl_transport::Error;
use oxccl_transport::tcp::{Tcp, TcpOptions};
use oxccl_transport::wire::{Expect, HANDSHAKE_LEN, HEADER_LEN, Handshake, Header, MAX_MSG};
use proptest::prelude::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Shutdown, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Records the largest single allocation.
struct Counting;
static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call forwards unchanged to the system allocator; the only
// addition is a relaxed atomic maximum, which allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Far above the receiver's 64 KiB FIFO, far below what a length field
/// could ask for.
const ALLOC_BOUND: usize = 8 << 20;
const NONCE: [u8; 16] = [3; 16];
const EXPECT: Expect = Expect { nonce: NONCE, receiver: 1, nranks: 2 };

fn handshake() -> [u8; HANDSHAKE_LEN] {
    Handshake { nonce: NONCE, sender: 0, receiver: 1, channel: 0, stripe: 0, nstripes: 1 }.encode()
}

/// A valid one-stream body: headers and payloads of `sizes`.
fn valid_stream(sizes: &[u32]) -> Vec<u8> {
    let mut v = Vec::new();
    for (k, &n) in sizes.iter().enumerate() {
        v.extend_from_slice(&Header::new(k as u64, u64::from(n), 1, 0).encode());
        v.extend((0..n).map(|i| i as u8));
    }
    v
}

/// Feeds `body` after a valid handshake to a fresh receiver, closes the
/// socket, and drives the receiver until it reports an error (it must:
/// the stream ends). Returns the bytes it delivered.
fn feed(body: &[u8]) -> (u64, Error) {
    let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let opts = TcpOptions { streams: 1, buffer: 64 << 10, ..TcpOptions::default() };
    let tcp = Tcp::new(1, 2, NONCE, lo, opts).unwrap();
    tcp.set_peer_addrs(vec![tcp.addr(), tcp.addr()]).unwrap();
    let mut rx = tcp.receiver(0, 0).unwrap();
    let mut s = TcpStream::connect(tcp.addr()).unwrap();
    s.set_nonblocking(true).unwrap();
    let mut out = handshake().to_vec();
    out.extend_from_slice(body);
    let mut at = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(Instant::now() < deadline, "receiver neither finished nor failed");
        if at < out.len() {
            match s.write(&out[at..]) {
                Ok(n) => at += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => at = out.len(), // the receiver gave up and closed
            }
            if at == out.len() {
                let _ = s.shutdown(Shutdown::Write);
            }
        }
        let r = rx.progress().and_then(|_| match rx.peek()? {
            Some(p) => {
                let n = p.data.len();
                rx.consume(n)
            }
            None => Ok(()),
        });
        if let Err(e) = r {
            return (rx.bytes(), e);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic_the_decoders(b in proptest::collection::vec(any::<u8>(), 0..100)) {
        let _ = Handshake::decode(&b, &EXPECT);
        for n in 1..=4u16 {
            for i in 0..n {
                if let Ok(h) = Header::decode(&b, n, i) {
                    prop_assert!(h.msg_len <= MAX_MSG);
                }
            }
        }
    }

    #[test]
    fn every_single_byte_change_of_a_handshake_is_caught(at in 0..HANDSHAKE_LEN, x in 1..=255u8) {
        let mut b = handshake();
        b[at] ^= x;
        prop_assert!(Handshake::decode(&b, &EXPECT).is_err());
        prop_assert!(Handshake::decode(&b[..at], &EXPECT).is_err(), "truncated");
    }

    #[test]
    fn every_single_byte_change_of_a_header_is_caught(
        seq in any::<u64>(), len in 0..MAX_MSG, at in 0..HEADER_LEN, x in 1..=255u8, n in 1..=8u16,
    ) {
        let h = Header::new(seq, len, n, 0);
        prop_assert_eq!(Header::decode(&h.encode(), n, 0).unwrap(), h);
        let mut b = h.encode();
        b[at] ^= x;
        prop_assert!(Header::decode(&b, n, 0).is_err());
        prop_assert!(Header::decode(&b[..at], n, 0).is_err(), "truncated");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn a_receiver_survives_random_streams(body in proptest::collection::vec(any::<u8>(), 0..4000)) {
        let (_, e) = feed(&body);
        prop_assert!(matches!(e, Error::Remote(_)), "{e:?}");
        prop_assert!(LARGEST.load(Ordering::Relaxed) < ALLOC_BOUND);
    }

    #[test]
    fn a_receiver_survives_truncated_valid_streams(
        sizes in proptest::collection::vec(0..100_000u32, 1..6), cut in any::<proptest::sample::Index>(),
    ) {
        let v = valid_stream(&sizes);
        let cut = cut.index(v.len() + 1);
        let (got, e) = feed(&v[..cut]);
        let msg = e.to_string();
        prop_assert!(msg.contains("rank 0 closed the connection"), "{msg}");
        prop_assert!(got <= sizes.iter().map(|&n| u64::from(n)).sum::<u64>());
        if cut == v.len() {
            prop_assert_eq!(got, sizes.iter().map(|&n| u64::from(n)).sum::<u64>());
        }
        prop_assert!(LARGEST.load(Ordering::Relaxed) < ALLOC_BOUND);
    }

    #[test]
    fn a_receiver_survives_mutated_streams(
        sizes in proptest::collection::vec(0..20_000u32, 1..5), at in any::<proptest::sample::Index>(), x in 1..=255u8,
    ) {
        let mut v = valid_stream(&sizes);
        let at = at.index(v.len());
        v[at] ^= x;
        let (_, e) = feed(&v);
        prop_assert!(matches!(e, Error::Remote(_)), "{e:?}");
        prop_assert!(LARGEST.load(Ordering::Relaxed) < ALLOC_BOUND);
    }
}

#[test]
fn a_huge_length_field_allocates_nothing() {
    let mut v = Header::new(0, MAX_MSG, 1, 0).encode().to_vec();
    v.extend_from_slice(&[1; 1000]);
    let (got, e) = feed(&v);
    assert!(e.to_string().contains("closed the connection") && e.to_string().contains("middle of message 0"), "{e}");
    assert!(got <= 1000, "{got} bytes delivered of 1000 sent");
    let (_, e) = feed(&Header::new(0, MAX_MSG + 1, 1, 0).encode());
    assert!(e.to_string().contains("exceeds the limit"), "{e}");
    let (_, e) = feed(&Header::new(1, 10, 1, 0).encode());
    assert!(e.to_string().contains("skipped"), "{e}");
    let mut v = valid_stream(&[10]);
    v.extend_from_slice(&Header::new(0, 10, 1, 0).encode());
    let (_, e) = feed(&v);
    assert!(e.to_string().contains("repeated"), "{e}");
    assert!(LARGEST.load(Ordering::Relaxed) < ALLOC_BOUND);
}
