//! A conformance suite for connection providers, public so that each
//! provider's integration tests (`tests/conformance_{mem,shm,tcp}.rs`) run
//! the same cases: implement [`Provider`] and call [`run_all`] or the cases
//! one by one.
//!
//! Every loop drives both ends with `progress()` (sockets need it) and has a
//! deadline: a case that stops moving panics naming the provider and the
//! case instead of hanging. The cases panic on failure (they are tests).

use std::time::{Duration, Instant};

use crate::{Channel, Error, P2P_CHANNEL, Receiver, Result, Sender};

pub mod one_sided;
pub mod relay;

/// A provider under test.
pub trait Provider {
    /// Name for failure messages.
    fn name(&self) -> &str;
    /// A fresh, connected pair of ends of one connection on `ch` whose FIFO
    /// holds `capacity` bytes.
    fn pair(&self, ch: Channel, capacity: usize) -> (Box<dyn Sender>, Box<dyn Receiver>);
    /// The most payload bytes the sender may accept before the receiver
    /// consumes anything, for a FIFO of `capacity` (the back-pressure case
    /// checks room runs out by then). Providers with extra buffering (socket
    /// buffers) override it.
    fn max_in_flight(&self, capacity: usize) -> usize {
        capacity
    }
}

/// How long a case may go without progress.
const STALL: Duration = Duration::from_secs(60);

/// The cases every provider's FIFOs pass.
fn fifo_cases(p: &dyn Provider) {
    in_order_random_sizes(p);
    element_multiples(p);
    back_pressure(p);
    zero_byte_messages(p);
    misuse_errors(p);
    payload_alignment(p);
}

/// Runs every case.
pub fn run_all(p: &dyn Provider) {
    fifo_cases(p);
    peer_drop(p);
}

/// Every two-sided case but [`peer_drop`] (where dropping a receiver the
/// sender never connected to is a timeout, not a remote error, as with TCP
/// and RDMA's lazily connected pairs), and [`send_from_and_recv_into`].
pub fn two_sided(p: &dyn Provider) {
    fifo_cases(p);
    send_from_and_recv_into(p);
    released_after_the_receiver_closed(p);
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
}

/// Message `i`'s tag in [`send_from_and_recv_into`] (one untagged).
fn tag(i: usize) -> u64 {
    if i == 3 { 0 } else { (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) }
}

fn byte(msg: usize, off: usize) -> u8 {
    (msg.wrapping_mul(31) ^ off.wrapping_mul(7) ^ (off >> 8)) as u8
}

struct Clock<'a> {
    p: &'a str,
    case: &'a str,
    last: Instant,
}

impl<'a> Clock<'a> {
    fn new(p: &'a str, case: &'a str) -> Clock<'a> {
        Clock { p, case, last: Instant::now() }
    }
    fn moved(&mut self) {
        self.last = Instant::now();
    }
    fn idle(&self, what: &str) {
        assert!(self.last.elapsed() < STALL, "provider {}: case {}: stalled for {STALL:?} ({what})", self.p, self.case);
        std::thread::yield_now();
    }
}

/// Sends `sizes` messages with contents from [`byte`], committing pieces of
/// at most `piece(i)` bytes, in multiples of `elem`. Returns the sender.
fn send_all(p: &str, case: &str, mut s: Box<dyn Sender>, sizes: &[usize], elem: usize, seed: u64) -> Box<dyn Sender> {
    let mut clock = Clock::new(p, case);
    let mut rng = Rng(seed | 1);
    for (i, &len) in sizes.iter().enumerate() {
        s.begin(len).unwrap_or_else(|e| panic!("provider {p}: case {case}: begin({len}) of message {i}: {e}"));
        let mut off = 0;
        while off < len {
            let want = ((rng.below(3 * 4096) as usize / elem) + 1) * elem;
            let room = s.room(want).unwrap_or_else(|e| panic!("provider {p}: case {case}: room: {e}"));
            assert!(room.len() <= want && room.len() <= len - off, "provider {p}: case {case}: room too big");
            assert_eq!(
                room.len() % elem,
                0,
                "provider {p}: case {case}: room of {} bytes, elements of {elem}",
                room.len()
            );
            if room.is_empty() {
                s.progress().unwrap_or_else(|e| panic!("provider {p}: case {case}: progress: {e}"));
                clock.idle("sender waits for room");
                continue;
            }
            let n = room.len();
            let n = if rng.below(4) == 0 && n > elem { (n / 2 / elem).max(1) * elem } else { n };
            for (k, b) in room[..n].iter_mut().enumerate() {
                *b = byte(i, off + k);
            }
            s.commit(n).unwrap_or_else(|e| panic!("provider {p}: case {case}: commit({n}): {e}"));
            off += n;
            clock.moved();
        }
        s.progress().unwrap_or_else(|e| panic!("provider {p}: case {case}: progress: {e}"));
    }
    while !s.flushed() {
        if s.progress().unwrap_or_else(|e| panic!("provider {p}: case {case}: progress: {e}")) {
            clock.moved();
        }
        clock.idle("sender flushes");
    }
    let total: usize = sizes.iter().sum();
    assert_eq!(s.bytes(), total as u64, "provider {p}: case {case}: sender byte counter");
    s
}

/// Receives and checks `sizes` messages, consuming multiples of `elem`.
fn recv_all(p: &str, case: &str, r: &mut dyn Receiver, sizes: &[usize], elem: usize, seed: u64) {
    let mut clock = Clock::new(p, case);
    let mut rng = Rng(seed.rotate_left(17) | 1);
    for (i, &len) in sizes.iter().enumerate() {
        let mut off = 0;
        loop {
            r.progress().unwrap_or_else(|e| panic!("provider {p}: case {case}: progress: {e}"));
            let piece = r.peek().unwrap_or_else(|e| panic!("provider {p}: case {case}: peek: {e}"));
            let Some(piece) = piece else {
                clock.idle("receiver waits for bytes");
                continue;
            };
            assert_eq!(
                (piece.msg_len, piece.offset),
                (len, off),
                "provider {p}: case {case}: message {i}: wrong length/offset"
            );
            let d = piece.data;
            assert!(!d.is_empty() || len == 0, "provider {p}: case {case}: empty piece of a non-empty message");
            assert!(off + d.len() <= len, "provider {p}: case {case}: piece past the message end");
            assert_eq!(d.len() % elem, 0, "provider {p}: case {case}: peek of {} bytes, elements of {elem}", d.len());
            assert!(
                d.is_empty() || (d.as_ptr() as usize) % 64 == off % 64,
                "provider {p}: case {case}: payload of message {i} not 64-aligned in the FIFO"
            );
            for (k, &b) in d.iter().enumerate() {
                assert_eq!(b, byte(i, off + k), "provider {p}: case {case}: message {i} byte {}", off + k);
            }
            let mut n = d.len();
            if rng.below(3) == 0 && n > elem {
                n = (n / 2 / elem).max(1) * elem;
            }
            r.consume(n).unwrap_or_else(|e| panic!("provider {p}: case {case}: consume({n}): {e}"));
            off += n;
            clock.moved();
            if off == len {
                break;
            }
        }
    }
    let total: usize = sizes.iter().sum();
    assert_eq!(r.bytes(), total as u64, "provider {p}: case {case}: receiver byte counter");
}

/// Runs sender and receiver on two threads.
fn two_threads(p: &dyn Provider, case: &str, ch: Channel, cap: usize, sizes: Vec<usize>, elem: usize, seed: u64) {
    let (s, mut r) = p.pair(ch, cap);
    let name = p.name().to_string();
    let (n2, c2, sz) = (name.clone(), case.to_string(), sizes.clone());
    let t = std::thread::spawn(move || send_all(&n2, &c2, s, &sz, elem, seed));
    recv_all(&name, case, r.as_mut(), &sizes, elem, seed);
    let s = t.join().unwrap_or_else(|_| panic!("provider {name}: case {case}: sender thread panicked"));
    drop(s);
}

/// Many messages of random sizes (0 bytes, tiny, around the capacity, several
/// times the capacity) arrive in order and intact across wraps; byte
/// counters match.
pub fn in_order_random_sizes(p: &dyn Provider) {
    let cap = 4096;
    let mut rng = Rng(0x5eed_0001);
    let mut sizes = vec![0, 1, 63, 64, 65, cap - 64, cap, cap + 1, 3 * cap + 17, 0, 0];
    for _ in 0..300 {
        sizes.push(match rng.below(5) {
            0 => 0,
            1 => rng.below(64) as usize,
            2 => rng.below(cap as u64) as usize,
            3 => rng.below(4 * cap as u64) as usize,
            _ => 64 * rng.below(80) as usize,
        });
    }
    two_threads(p, "in_order_random_sizes", 0, cap, sizes.clone(), 1, 0x1234);
    two_threads(p, "in_order_random_sizes/p2p", P2P_CHANNEL, 2 * cap, sizes, 1, 0x9876);
}

/// Committing and consuming multiples of the element size (mixed sizes from
/// message to message), every room and peek holds whole elements.
pub fn element_multiples(p: &dyn Provider) {
    let cap = 4096;
    let mut rng = Rng(0x5eed_0002);
    for elem in [2usize, 4, 8] {
        let sizes: Vec<usize> = (0..200).map(|_| elem * rng.below(3 * cap as u64 / elem as u64) as usize).collect();
        two_threads(p, &format!("element_multiples/{elem}"), 1, cap, sizes, elem, 77 + elem as u64);
    }
    // Element sizes change between messages while the receiver lags: one
    // thread, alternating steps.
    let (mut s, mut r) = p.pair(2, cap);
    let name = p.name();
    let case = "element_multiples/mixed";
    let mut clock = Clock::new(name, case);
    let msgs: Vec<(usize, usize)> = (0..120)
        .map(|i| {
            let e = [1usize, 2, 4, 8, 2, 1][i % 6];
            (e, e * (1 + rng.below(2 * cap as u64 / e as u64) as usize))
        })
        .collect();
    let (mut si, mut soff, mut begun) = (0usize, 0usize, false);
    let (mut ri, mut roff) = (0usize, 0usize);
    while ri < msgs.len() {
        let mut moved = false;
        if si < msgs.len() {
            let (e, len) = msgs[si];
            if !begun {
                s.begin(len).unwrap();
                begun = true;
            }
            let want = e * (1 + rng.below(300) as usize);
            let room = s.room(want).unwrap();
            assert_eq!(room.len() % e, 0, "provider {name}: case {case}: room {} for elements of {e}", room.len());
            let n = room.len();
            for (k, b) in room.iter_mut().enumerate() {
                *b = byte(si, soff + k);
            }
            s.commit(n).unwrap();
            soff += n;
            moved |= n > 0;
            if soff == len {
                (si, soff, begun) = (si + 1, 0, false);
            }
        }
        s.progress().unwrap();
        r.progress().unwrap();
        if rng.below(2) == 0 {
            let (e, len) = msgs[ri];
            if let Some(piece) = r.peek().unwrap() {
                assert_eq!((piece.msg_len, piece.offset), (len, roff), "provider {name}: case {case}: message {ri}");
                let d = piece.data;
                assert_eq!(d.len() % e, 0, "provider {name}: case {case}: peek {} for elements of {e}", d.len());
                let n = e * rng.below(d.len() as u64 / e as u64 + 1) as usize;
                for (k, &b) in d[..n].iter().enumerate() {
                    assert_eq!(b, byte(ri, roff + k), "provider {name}: case {case}: message {ri}");
                }
                r.consume(n).unwrap();
                roff += n;
                moved |= n > 0;
                if roff == len {
                    (ri, roff) = (ri + 1, 0);
                }
            }
        }
        if moved {
            clock.moved();
        } else {
            clock.idle("mixed element sizes");
        }
    }
}

/// Without consuming, the sender's room runs out, and not before the FIFO
/// is full; consuming frees room again.
pub fn back_pressure(p: &dyn Provider) {
    let cap = 4096;
    let name = p.name();
    let case = "back_pressure";
    let limit = p.max_in_flight(cap);
    let (mut s, mut r) = p.pair(3, cap);
    let len = limit + 4 * cap;
    s.begin(len).unwrap();
    let (mut sent, mut empty_tries) = (0usize, 0);
    let mut clock = Clock::new(name, case);
    while empty_tries < 200 || sent == 0 {
        clock.idle("filling");
        let room = s.room(len - sent).unwrap();
        if room.is_empty() {
            assert!(
                sent == 0 || sent >= cap - 64 || empty_tries > 0,
                "provider {name}: case {case}: room empty after only {sent} of {cap} bytes"
            );
            empty_tries += 1;
            s.progress().unwrap();
            r.progress().unwrap();
            std::thread::yield_now();
            continue;
        }
        empty_tries = 0;
        let n = room.len();
        room.iter_mut().enumerate().for_each(|(k, b)| *b = byte(0, sent + k));
        s.commit(n).unwrap();
        sent += n;
        assert!(sent <= limit, "provider {name}: case {case}: accepted {sent} bytes, more than {limit} in flight");
        s.progress().unwrap();
        r.progress().unwrap();
    }
    assert!(sent >= cap - 64, "provider {name}: case {case}: only {sent} bytes fit in a {cap}-byte FIFO");
    // Drain: everything arrives, room reappears, the message completes.
    let mut got = 0;
    clock.moved();
    while got < len {
        s.progress().unwrap();
        r.progress().unwrap();
        if let Some(piece) = r.peek().unwrap() {
            let d = piece.data;
            assert!(d.iter().enumerate().all(|(k, &b)| b == byte(0, got + k)), "provider {name}: case {case}: data");
            let n = d.len();
            r.consume(n).unwrap();
            got += n;
            clock.moved();
        }
        if sent < len {
            let room = s.room(len - sent).unwrap();
            let n = room.len();
            room.iter_mut().enumerate().for_each(|(k, b)| *b = byte(0, sent + k));
            s.commit(n).unwrap();
            sent += n;
        }
        clock.idle("draining");
    }
}

/// Runs of 0-byte messages, also while the FIFO is full, arrive as 0-byte
/// pieces in order.
pub fn zero_byte_messages(p: &dyn Provider) {
    let mut sizes = vec![0; 50];
    sizes.extend([4096 - 64, 0, 0, 0, 8192, 0, 1, 0]);
    sizes.extend(vec![0; 50]);
    two_threads(p, "zero_byte_messages", 4, 4096, sizes, 1, 5);
}

fn expect_usage(p: &str, what: &str, r: Result<()>) {
    match r {
        Err(Error::InvalidUsage(_) | Error::InvalidArgument(_)) => {}
        other => panic!("provider {p}: case misuse_errors: {what} should be an invalid-usage error, got {other:?}"),
    }
}

/// Misuse is an error, not a panic, and leaves the connection usable:
/// commit beyond room, begin while a message is unfinished, room without a
/// message, consume beyond the peek, consume without a message.
pub fn misuse_errors(p: &dyn Provider) {
    let name = p.name();
    let (mut s, mut r) = p.pair(5, 4096);
    expect_usage(name, "room(8) before begin", s.room(8).map(|_| ()));
    s.begin(100).unwrap();
    let n = s.room(10).unwrap().len();
    assert!(n <= 10);
    expect_usage(name, "commit beyond room", s.commit(n + 1));
    expect_usage(name, "begin twice", s.begin(5));
    expect_usage(name, "consume without a message", r.consume(1));
    let clock = Clock::new(name, "misuse_errors");
    let mut sent = 0;
    let mut peeked = None;
    while peeked.is_none() || sent < 100 {
        if sent < 100 {
            let room = s.room(100 - sent).unwrap();
            let k = room.len();
            room.iter_mut().enumerate().for_each(|(j, b)| *b = byte(9, sent + j));
            s.commit(k).unwrap();
            sent += k;
        }
        s.progress().unwrap();
        r.progress().unwrap();
        if peeked.is_none() {
            peeked = r.peek().unwrap().map(|piece| piece.data.len());
        }
        clock.idle("misuse: first bytes");
    }
    let k = peeked.unwrap_or(0);
    expect_usage(name, "consume beyond the peek", r.consume(k + 1));
    let mut got = 0;
    while got < 100 {
        s.progress().unwrap();
        r.progress().unwrap();
        if let Some(piece) = r.peek().unwrap() {
            assert_eq!(piece.offset, got);
            assert!(piece.data.iter().enumerate().all(|(j, &b)| b == byte(9, got + j)), "provider {name}: misuse data");
            let n = piece.data.len();
            r.consume(n).unwrap();
            got += n;
        }
        clock.idle("misuse: drain");
    }
}

/// Every payload starts 64-aligned in the FIFO: a piece at offset `o` lies
/// at an address ≡ `o` (mod 64), room too. (The receive side is also
/// checked in every two-thread case.)
pub fn payload_alignment(p: &dyn Provider) {
    let name = p.name();
    let (mut s, mut r) = p.pair(6, 4096);
    let clock = Clock::new(name, "payload_alignment");
    for (i, len) in [1usize, 7, 100, 64, 200, 3000, 5].into_iter().enumerate() {
        s.begin(len).unwrap();
        let mut off = 0;
        while off < len {
            let room = s.room(len - off).unwrap();
            if !room.is_empty() {
                assert_eq!(room.as_ptr() as usize % 64, off % 64, "provider {name}: room of message {i} misaligned");
            }
            let n = room.len();
            room.iter_mut().enumerate().for_each(|(k, b)| *b = byte(i, off + k));
            s.commit(n).unwrap();
            off += n;
            s.progress().unwrap();
            r.progress().unwrap();
            if let Some(piece) = r.peek().unwrap() {
                let (o, n) = (piece.offset, piece.data.len());
                assert!(n == 0 || piece.data.as_ptr() as usize % 64 == o % 64, "provider {name}: piece misaligned");
                r.consume(n).unwrap();
            }
            clock.idle("alignment");
        }
    }
}

/// Dropping one end makes the other end's calls fail with a remote error
/// (after the bytes committed before the drop were delivered).
pub fn peer_drop(p: &dyn Provider) {
    let name = p.name();
    let clock = Clock::new(name, "peer_drop");
    let (mut s, r) = p.pair(7, 4096);
    drop(r);
    let mut left = 0usize;
    loop {
        let mut step = || -> Result<()> {
            s.progress()?;
            if left == 0 {
                s.begin(8)?;
                left = 8;
            }
            let n = s.room(left)?.len();
            s.commit(n)?;
            left -= n;
            Ok(())
        };
        match step() {
            Err(Error::Remote(_)) => break,
            Err(e) => {
                panic!("provider {name}: case peer_drop: sender to a dropped receiver: {e} (want a remote error)")
            }
            Ok(()) => clock.idle("sender sees the receiver gone"),
        }
    }
    let (mut s, mut r) = p.pair(8, 4096);
    s.begin(3).unwrap();
    while s.room(3).map(|r| r.len()).unwrap_or(0) < 3 {
        s.progress().unwrap();
        clock.idle("room for 3 bytes");
    }
    s.room(3).unwrap().copy_from_slice(b"abc");
    s.commit(3).unwrap();
    while !s.flushed() {
        s.progress().unwrap();
        clock.idle("flush before drop");
    }
    drop(s);
    let mut got = Vec::new();
    loop {
        match r.progress().and_then(|_| r.peek().map(|piece| piece.map(|p| p.data.to_vec()))) {
            Ok(Some(d)) => {
                r.consume(d.len()).unwrap();
                got.extend(d);
            }
            Ok(None) => clock.idle("receiver sees the sender gone"),
            Err(Error::Remote(_)) => break,
            Err(e) => panic!("provider {name}: case peer_drop: receiver from a dropped sender: {e}"),
        }
    }
    assert_eq!(got, b"abc", "provider {name}: case peer_drop: bytes committed before the drop");
}

/// One pass of receiving into `dst`: progress, then `recv_into`; whether
/// the message is complete (the clock told of the pass otherwise).
fn recv_into_step(r: &mut dyn Receiver, dst: &crate::region::Region, clock: &mut Clock, name: &str) -> bool {
    r.progress().unwrap();
    let (moved, done) = r.recv_into(dst).unwrap_or_else(|e| panic!("provider {name}: recv_into: {e}"));
    if !done {
        if moved {
            clock.moved();
        }
        clock.idle("recv_into");
    }
    done
}

/// A message sent straight from its source that the receiver read whole
/// and then closed its end: the sender's next look
/// ([`Sender::progress_from`]) finds it released, not the connection
/// closed (the receiver's part of the call was done; an error here failed
/// a rank whose sends had all arrived). Returns whether the provider took
/// the message from its source (`false`: nothing to check).
pub fn released_after_the_receiver_closed(p: &dyn Provider) -> bool {
    let name = p.name();
    let mut clock = Clock::new(name, "released_after_the_receiver_closed");
    let (mut s, mut r) = p.pair(11, 64 << 10);
    let src: Vec<u8> = (0..1 << 20).map(|k| byte(11, k)).collect();
    if !s.takes_from(src.len()) {
        return false;
    }
    let t = s.send_from(crate::region::Region::of(&src), 5).unwrap().expect("takes_from said it would");
    let mut got = vec![0u8; src.len()];
    let dst = crate::region::Region::of_mut(&mut got);
    let mut released = false;
    loop {
        // The sender looks before the receiver reads, never after the
        // last read: its first look after that comes once the receiver
        // has closed.
        if !released {
            released = s.progress_from(t).unwrap_or_else(|e| panic!("provider {name}: progress_from: {e}")).1;
        }
        if recv_into_step(&mut *r, &dst, &mut clock, name) {
            break;
        }
    }
    assert!(got == src, "provider {name}: the message arrived wrong");
    drop(r);
    match s.progress_from(t) {
        Ok((_, done)) => assert!(done, "provider {name}: a message the receiver read whole is not released"),
        Err(e) => panic!("provider {name}: a message the receiver read whole, then closed: {e} (want it released)"),
    }
    true
}

/// Messages sent straight from their source (`send_from`, where the
/// provider takes them) and through the FIFO interleave in order, and are
/// received into their destination (`recv_into`) or by peek whatever way
/// they were sent; a source is released only after it was sent, and a
/// length that differs from the destination's is an error. Every message's
/// tag arrives with it, whichever way ([`Receiver::next_tag`] before a
/// `recv_into`, [`crate::Piece::tag`] by peek).
pub fn send_from_and_recv_into(p: &dyn Provider) {
    let name = p.name().to_string();
    let cap = 64 << 10;
    let sizes: Vec<usize> = vec![0, 1, 100_000, 64, 3 * cap + 5, 40_000, 0, 1 << 20, 7, 200_000];
    let (mut s, mut r) = p.pair(9, cap);
    let msgs: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &n)| (0..n).map(|k| byte(i, k)).collect()).collect();
    let (n2, m2) = (name.clone(), msgs.clone());
    let t = std::thread::spawn(move || {
        let mut clock = Clock::new(&n2, "send_from_and_recv_into");
        let mut tokens = Vec::new();
        let mut from = 0;
        for (i, m) in m2.iter().enumerate() {
            // Every other large message straight from its buffer.
            if i % 2 == 0 && s.takes_from(m.len()) {
                let t = s.send_from(crate::region::Region::of(m), tag(i)).unwrap().expect("takes_from said it would");
                tokens.push(t);
                from += 1;
                continue;
            }
            s.begin_tagged(m.len(), tag(i)).unwrap();
            let mut off = 0;
            while off < m.len() {
                let room = s.room(m.len() - off).unwrap();
                let n = room.len();
                room.copy_from_slice(&m[off..off + n]);
                s.commit(n).unwrap();
                off += n;
                if n == 0 {
                    s.progress().unwrap();
                    clock.idle("room");
                } else {
                    clock.moved();
                }
            }
        }
        while !s.flushed() || !tokens.iter().all(|&t| s.released(t)) {
            if s.progress().unwrap() {
                clock.moved();
            }
            clock.idle("release");
        }
        (s, from)
    });
    let mut clock = Clock::new(&name, "send_from_and_recv_into");
    for (i, m) in msgs.iter().enumerate() {
        let mut got = vec![0u8; m.len()];
        if i % 3 != 1 {
            let dst = crate::region::Region::of_mut(&mut got);
            loop {
                r.progress().unwrap();
                match r.next_tag().unwrap_or_else(|e| panic!("provider {name}: next_tag: {e}")) {
                    Some(t) => {
                        assert_eq!(t, tag(i), "provider {name}: message {i}'s tag");
                        break;
                    }
                    None => clock.idle("next_tag"),
                }
            }
            while !recv_into_step(&mut *r, &dst, &mut clock, &name) {}
        } else {
            let mut off = 0;
            while off < m.len() || (m.is_empty() && off == 0) {
                r.progress().unwrap();
                match r.peek().unwrap() {
                    Some(piece) => {
                        let seen = (piece.msg_len, piece.offset, piece.tag);
                        assert_eq!(seen, (m.len(), off, tag(i)), "provider {name}: message {i}");
                        let n = piece.data.len();
                        got[off..off + n].copy_from_slice(piece.data);
                        r.consume(n).unwrap();
                        off += n;
                        clock.moved();
                        if m.is_empty() {
                            break;
                        }
                    }
                    None => clock.idle("peek"),
                }
            }
        }
        assert!(got == *m, "provider {name}: message {i} of {} bytes arrived wrong", m.len());
    }
    let (s, from) = t.join().unwrap_or_else(|_| panic!("provider {name}: sender panicked"));
    let total: usize = sizes.iter().sum();
    assert_eq!((s.bytes(), r.bytes()), (total as u64, total as u64), "provider {name}: byte counters");
    if from == 0 {
        eprintln!("provider {name}: sends every message through its FIFO (send_from not taken)");
    }
    // A destination of the wrong length is an error, whichever way.
    let (mut s, mut r) = p.pair(10, cap);
    let big = vec![7u8; 100_000];
    let by_ref = s.takes_from(big.len());
    if by_ref {
        s.send_from(crate::region::Region::of(&big), 0).unwrap();
    } else {
        s.begin(big.len()).unwrap();
    }
    let mut small = vec![0u8; 10];
    let dst = crate::region::Region::of_mut(&mut small);
    loop {
        if !by_ref {
            let n = s.room(64).map(|r| r.len()).unwrap_or(0);
            s.commit(n).unwrap();
        }
        s.progress().unwrap();
        // The mismatch shows wherever the message meets the destination:
        // in progress (a landing armed) or in recv_into.
        match r.progress().and_then(|_| r.recv_into(&dst)) {
            Err(e) => {
                assert!(e.to_string().contains("100000") && e.to_string().contains("10"), "provider {name}: {e}");
                break;
            }
            Ok((_, done)) => assert!(!done, "provider {name}: a 100000-byte message received into 10 bytes"),
        }
        clock.idle("length mismatch");
    }
}
