//! Hostile bytes against the wire decoders and a live TCP receiver: random
//! streams, truncated valid streams and single-byte mutations. Never a
//! panic, never a hang (the finite stream ends in `Ok` or an error), and no
//! allocation beyond a bound (a length field of 1 TiB allocates nothing).
#![allow(unsafe_code)]

use oxccl_transport::Error;
use oxccl_transport::tcp::{Tcp, TcpOptions};
use oxccl_transport::wire::{Expect, HANDSHAKE_LEN, HEADER_LEN, Handshake, Header, MAX_MSG, stripe_range};
use proptest::prelude::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, TcpStream};
use std::time::{Duration, Instant};

/// Records the largest single allocation of each thread: the receiver
/// runs on the test's own thread (a TCP receiver spawns none), and the
/// other tests of this binary, which move large messages on theirs, do not
/// count.
struct Counting;
thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

/// The largest allocation this thread has made.
fn largest() -> usize {
    LARGEST.with(Cell::get)
}

fn note(size: usize) {
    // A const-initialised Cell has no destructor: the slot is valid for
    // the thread's whole life, and reading it allocates nothing.
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
}

// SAFETY: every call forwards unchanged to the system allocator; the only
// addition is a thread-local maximum, which allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
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

fn handshake(stripe: u16, nstripes: u16) -> [u8; HANDSHAKE_LEN] {
    Handshake { nonce: NONCE, sender: 0, receiver: 1, channel: 0, stripe, nstripes }.encode()
}

/// Valid bodies for `n` streams: each stream's headers and stripes.
fn valid_streams(sizes: &[u32], n: u16) -> Vec<Vec<u8>> {
    let mut v = vec![Vec::new(); usize::from(n)];
    for (k, &len) in sizes.iter().enumerate() {
        for i in 0..n {
            let r = stripe_range(u64::from(len), n, i);
            if i == 0 || !r.is_empty() {
                let body = &mut v[usize::from(i)];
                body.extend_from_slice(&Header::new(k as u64, u64::from(len), n, i).encode());
                body.extend(r.map(|b| b as u8));
            }
        }
    }
    v
}

fn valid_stream(sizes: &[u32]) -> Vec<u8> {
    valid_streams(sizes, 1).remove(0)
}

/// Feeds `body` after a valid handshake to a fresh receiver; see [`feed_n`].
fn feed(body: &[u8]) -> (u64, Error) {
    feed_n(&[body.to_vec()])
}

/// Feeds `bodies[i]` after a valid handshake on socket `i` of a fresh
/// receiver, closes the sockets, and drives the receiver until it reports
/// an error (it must: the streams end). Returns the bytes it delivered.
fn feed_n(bodies: &[Vec<u8>]) -> (u64, Error) {
    let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let opts = TcpOptions { streams: 1, buffer: 64 << 10, ..TcpOptions::default() };
    let tcp = Tcp::new(1, 2, NONCE, [3; 32], lo, opts).unwrap();
    tcp.set_peer_addrs(vec![tcp.addr(), tcp.addr()]).unwrap();
    let mut rx = tcp.receiver(0, 0).unwrap();
    let n = bodies.len() as u16;
    // Each socket reads the receiver's challenge, then sends the handshake,
    // its proof (the receiver's secret is [3; 32]) and the body.
    struct Sock {
        s: TcpStream,
        challenge: Vec<u8>,
        out: Vec<u8>,
        at: usize,
    }
    let mut socks: Vec<Sock> = (0..n)
        .map(|_| {
            let s = TcpStream::connect(tcp.addr()).unwrap();
            s.set_nonblocking(true).unwrap();
            Sock { s, challenge: Vec::new(), out: Vec::new(), at: 0 }
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(Instant::now() < deadline, "receiver neither finished nor failed");
        for (i, k) in socks.iter_mut().enumerate() {
            if k.challenge.len() < 16 {
                let mut b = [0u8; 16];
                match k.s.read(&mut b[..16 - k.challenge.len()]) {
                    Ok(got) => k.challenge.extend_from_slice(&b[..got]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => panic!("reading the challenge: {e}"),
                }
                if k.challenge.len() == 16 {
                    let hs = handshake(i as u16, n);
                    let proof = oxccl_transport::auth::prove(&[3; 32], &[b"oxccl-tcp", &k.challenge, &hs]);
                    k.out = [&hs[..], &proof, &bodies[i]].concat();
                }
                continue;
            }
            if k.at < k.out.len() {
                match k.s.write(&k.out[k.at..]) {
                    Ok(w) => k.at += w,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => k.at = k.out.len(), // the receiver gave up and closed
                }
                if k.at == k.out.len() {
                    let _ = k.s.shutdown(Shutdown::Write);
                }
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
        let mut b = handshake(0, 1);
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
        prop_assert!(largest() < ALLOC_BOUND);
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
        prop_assert!(largest() < ALLOC_BOUND);
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
        prop_assert!(largest() < ALLOC_BOUND);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn striped_streams_deliver_or_fail_cleanly(
        sizes in proptest::collection::vec(0..200_000u32, 1..5),
        n in 2..=4u16,
        which in any::<proptest::sample::Index>(),
        at in any::<proptest::sample::Index>(),
        x in 0..=255u8,
        cut in any::<bool>(),
    ) {
        let mut v = valid_streams(&sizes, n);
        let total: u64 = sizes.iter().map(|&s| u64::from(s)).sum();
        let i = which.index(v.len());
        let intact = if v[i].is_empty() {
            true
        } else if cut {
            let at = at.index(v[i].len());
            v[i].truncate(at);
            false
        } else {
            let at = at.index(v[i].len());
            v[i][at] ^= x;
            x == 0
        };
        let (got, e) = feed_n(&v);
        prop_assert!(matches!(e, Error::Remote(_)), "{e:?}");
        prop_assert!(got <= total);
        if intact {
            prop_assert_eq!(got, total, "{}", e);
            prop_assert!(e.to_string().contains("closed the connection"), "{}", e);
        }
        prop_assert!(largest() < ALLOC_BOUND);
    }
}

#[test]
fn striped_sequence_errors_name_the_stream() {
    // Stream 1 skips a message that has bytes on it.
    let mut v = valid_streams(&[100_000, 100_000], 2);
    let one = valid_streams(&[100_000], 2);
    let hdr1 = Header::new(0, 100_000, 2, 1).encode();
    assert_eq!(&v[1][..HEADER_LEN], &hdr1);
    let stripe1 = one[1].len();
    v[1].drain(..stripe1);
    let (_, e) = feed_n(&v);
    assert!(e.to_string().contains("stream 1") && e.to_string().contains("skipped"), "{e}");
    // Stream 1 repeats message 0.
    let mut v = valid_streams(&[100_000], 2);
    let again = v[1].clone();
    v[1].extend_from_slice(&again);
    v[0].extend_from_slice(&Header::new(1, 0, 2, 0).encode());
    let (_, e) = feed_n(&v);
    assert!(e.to_string().contains("stream 1") && e.to_string().contains("repeats"), "{e}");
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
    assert!(largest() < ALLOC_BOUND);
}
