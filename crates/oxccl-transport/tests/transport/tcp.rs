//! The TCP provider over loopback: in-order delivery of many messages of
//! random sizes on both ends' own threads, striping over 1..4 sockets,
//! back-pressure, whole-element pieces, misuse errors, bad connections
//! dropped without disturbing a working pair, and a peer that vanishes.

use oxccl_transport::tcp::{Tcp, TcpOptions, tcp_pair, tcp_pair_with};
use oxccl_transport::wire::{Handshake, Header};
use oxccl_transport::{Error, P2P_CHANNEL, Receiver, Sender};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(60);
const LO: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn byte(msg: usize, off: usize) -> u8 {
    (msg.wrapping_mul(131) ^ off.wrapping_mul(7) ^ (off >> 8)) as u8
}

fn opts(streams: usize, buffer: usize) -> TcpOptions {
    TcpOptions { streams, buffer, ..TcpOptions::default() }
}

/// Sends `sizes` (multiples of `elem`), writing pattern bytes in random
/// whole-element pieces; returns when everything is in the kernel.
fn send_all(tx: &mut dyn Sender, sizes: &[usize], elem: usize, seed: u64) {
    let mut rng = Rng(seed | 1);
    let deadline = Instant::now() + LIMIT;
    let before = tx.bytes();
    for (k, &n) in sizes.iter().enumerate() {
        tx.begin(n).unwrap();
        let mut off = 0;
        while off < n {
            assert!(Instant::now() < deadline, "sender stuck at message {k} offset {off} of {n}");
            let want = (1 + rng.below(1 << 18)) * elem;
            let room = tx.room(want).unwrap();
            if room.is_empty() {
                tx.progress().unwrap();
                continue;
            }
            assert!(room.len() <= want && room.len() <= n - off);
            assert!(room.len().is_multiple_of(elem), "room of {} bytes for {elem}-byte elements", room.len());
            if off == 0 {
                assert_eq!(room.as_ptr() as usize % 64, 0, "message {k} does not start 64-aligned");
            }
            let take = if rng.below(3) == 0 { (1 + rng.below(room.len() / elem)) * elem } else { room.len() };
            for (i, b) in room[..take].iter_mut().enumerate() {
                *b = byte(k, off + i);
            }
            tx.commit(take).unwrap();
            off += take;
        }
        if rng.below(4) == 0 {
            tx.progress().unwrap();
        }
    }
    while !tx.flushed() {
        assert!(Instant::now() < deadline, "sender never flushed");
        tx.progress().unwrap();
    }
    assert_eq!(tx.bytes() - before, sizes.iter().sum::<usize>() as u64);
}

/// Receives and checks `sizes`, consuming random whole-element amounts.
fn recv_all(rx: &mut dyn Receiver, sizes: &[usize], elem: usize, seed: u64) {
    let mut rng = Rng(seed | 1);
    let deadline = Instant::now() + LIMIT;
    let before = rx.bytes();
    for (k, &n) in sizes.iter().enumerate() {
        let mut off = 0;
        loop {
            assert!(Instant::now() < deadline, "receiver stuck at message {k} offset {off} of {n}");
            let Some(p) = rx.peek().unwrap() else {
                rx.progress().unwrap();
                continue;
            };
            assert_eq!((p.msg_len, p.offset), (n, off), "message {k}");
            if n == 0 {
                assert!(p.data.is_empty());
                rx.consume(0).unwrap();
                break;
            }
            let len = p.data.len();
            assert!(len > 0 && off + len <= n);
            assert!(len.is_multiple_of(elem), "piece of {len} bytes for {elem}-byte elements");
            if off == 0 {
                assert_eq!(p.data.as_ptr() as usize % 64, 0, "message {k} payload not 64-aligned");
            }
            for (i, &b) in p.data.iter().enumerate() {
                assert_eq!(b, byte(k, off + i), "message {k} byte {}", off + i);
            }
            let take = if rng.below(3) == 0 { (1 + rng.below(len / elem)) * elem } else { len };
            rx.consume(take).unwrap();
            off += take;
            if off == n {
                break;
            }
        }
    }
    assert_eq!(rx.bytes() - before, sizes.iter().sum::<usize>() as u64);
}

fn sizes(seed: u64, count: usize, max: usize, elem: usize) -> Vec<usize> {
    let mut rng = Rng(seed);
    (0..count)
        .map(|_| match rng.below(6) {
            0 => 0,
            1 => elem * rng.below(8),
            2 => max,
            _ => elem * rng.below(max / elem),
        })
        .collect()
}

type Pair = (Box<dyn Sender>, Box<dyn Receiver>);

/// Both ends on their own threads; gives the pair back.
fn run(mut tx: Box<dyn Sender>, mut rx: Box<dyn Receiver>, sizes: Vec<usize>, elem: usize) -> Pair {
    let s2 = sizes.clone();
    let t = thread::spawn(move || {
        send_all(&mut *tx, &s2, elem, 7);
        tx
    });
    recv_all(&mut *rx, &sizes, elem, 11);
    (t.join().unwrap(), rx)
}

/// The communicator's secret of these tests' providers.
const SECRET: [u8; 32] = [0x5e; 32];

#[test]
fn random_messages_over_1_2_4_streams() {
    for streams in [1, 2, 4] {
        for (buffer, max) in [(4096, 20_000), (256 << 10, 1 << 20)] {
            for elem in [1, 4, 8] {
                let (tx, rx) = tcp_pair_with(3, opts(streams, buffer)).unwrap();
                run(tx, rx, sizes(streams as u64 * 977 + elem as u64, 60, max, elem), elem);
            }
        }
    }
}

#[test]
fn default_pair_and_zero_byte_messages() {
    let (tx, rx) = tcp_pair(0, 64 << 10);
    run(tx, rx, vec![0; 500], 1);
    let (tx, rx) = tcp_pair(P2P_CHANNEL, 1 << 20);
    run(tx, rx, vec![0, 3 << 20, 0, 1, 0, 64, 65, 0], 1);
}

#[test]
fn several_channels_both_directions_share_one_tcp_per_rank() {
    let nonce = [9; 16];
    let a = Tcp::new(0, 2, nonce, SECRET, LO, opts(2, 64 << 10)).unwrap();
    let b = Tcp::new(1, 2, nonce, SECRET, LO, opts(3, 64 << 10)).unwrap();
    let addrs = vec![a.addr(), b.addr()];
    a.set_peer_addrs(addrs.clone()).unwrap();
    b.set_peer_addrs(addrs).unwrap();
    let mut threads = Vec::new();
    for ch in [0, 1, 5, P2P_CHANNEL] {
        for (s, r, peer_of_r, to) in [(&a, &b, 0, 1), (&b, &a, 1, 0)] {
            let tx = s.sender(to, ch).unwrap();
            let rx = r.receiver(peer_of_r, ch).unwrap();
            let sz = sizes(u64::from(ch) * 31 + to as u64 + 1, 40, 300_000, 4);
            threads.push(thread::spawn(move || run(tx, rx, sz, 4)));
        }
    }
    let pairs: Vec<Pair> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    // Every connection has 2 or 3 sockets at each end, plus the listener.
    assert_eq!(a.poll_fds().len(), 1 + 4 * 2 + 4 * 3);
    assert_eq!(b.poll_fds().len(), 1 + 4 * 2 + 4 * 3);
    drop(pairs);
    assert_eq!(a.poll_fds().len(), 1, "dropped connections leave the poll set");
}

#[test]
fn receiver_created_after_the_data_arrived() {
    let nonce = [1; 16];
    let a = Tcp::new(0, 2, nonce, SECRET, LO, opts(2, 1 << 20)).unwrap();
    let b = Tcp::new(1, 2, nonce, SECRET, LO, opts(2, 1 << 20)).unwrap();
    a.set_peer_addrs(vec![a.addr(), b.addr()]).unwrap();
    b.set_peer_addrs(vec![a.addr(), b.addr()]).unwrap();
    let mut tx = a.sender(1, 2).unwrap();
    let sz = vec![20_000, 0, 7];
    let deadline = Instant::now() + LIMIT;
    thread::scope(|s| {
        s.spawn(|| send_all(&mut *tx, &sz, 1, 3));
        // Sockets accepted and validated, waiting for their receiver.
        while b.pending_handshakes() > 0 || b.poll_fds().len() < 3 {
            assert!(Instant::now() < deadline);
            b.progress().unwrap();
            thread::sleep(Duration::from_millis(1));
        }
    });
    let mut rx = b.receiver(0, 2).unwrap();
    recv_all(&mut *rx, &sz, 1, 5);
}

#[test]
fn back_pressure_bounds_what_a_sender_accepts() {
    let (mut tx, mut rx) = tcp_pair_with(1, opts(2, 64 << 10)).unwrap();
    let total = 256 << 20;
    tx.begin(total).unwrap();
    let mut committed = 0;
    let mut idle = 0;
    let deadline = Instant::now() + LIMIT;
    // The receiver only accepts the sockets (one progress), never reads.
    while idle < 2000 && committed < total {
        assert!(Instant::now() < deadline);
        rx.progress().unwrap();
        tx.progress().unwrap();
        let room = tx.room(usize::MAX).unwrap();
        let n = room.len();
        for (i, b) in room.iter_mut().enumerate() {
            *b = byte(0, committed + i);
        }
        tx.commit(n).unwrap();
        committed += n;
        idle = if n == 0 { idle + 1 } else { 0 };
        if rx.peek().unwrap().is_some() {
            // Receiving into its FIFO is allowed, consuming is not.
        }
    }
    assert!(committed < total, "a sender took {committed} bytes with nobody consuming");
    assert!(!tx.flushed());
    // Now drain it all.
    let t = thread::spawn(move || {
        send_rest(&mut *tx, committed, total);
        tx
    });
    recv_all(&mut *rx, &[total], 1, 1);
    drop(t.join().unwrap());
}

fn send_rest(tx: &mut dyn Sender, mut off: usize, n: usize) {
    let deadline = Instant::now() + LIMIT;
    while off < n || !tx.flushed() {
        assert!(Instant::now() < deadline);
        // Once every byte is committed, only flushing is left (asking for
        // room without a message is a misuse).
        if off < n {
            let room = tx.room(n - off).unwrap();
            let k = room.len();
            for (i, b) in room.iter_mut().enumerate() {
                *b = byte(0, off + i);
            }
            tx.commit(k).unwrap();
            off += k;
        }
        tx.progress().unwrap();
    }
}

#[test]
fn misuse_is_an_error() {
    let (mut tx, mut rx) = tcp_pair(0, 4096);
    tx.begin(100).unwrap();
    assert!(matches!(tx.begin(5), Err(Error::InvalidUsage(_))));
    assert!(matches!(tx.commit(1), Err(Error::InvalidUsage(_))), "commit without room");
    let deadline = Instant::now() + LIMIT;
    let n = loop {
        assert!(Instant::now() < deadline);
        let n = tx.room(64).unwrap().len();
        if n > 0 {
            break n;
        }
        tx.progress().unwrap();
    };
    assert_eq!(n, 64);
    assert!(matches!(tx.commit(65), Err(Error::InvalidUsage(_))));
    tx.commit(64).unwrap();
    assert_eq!(tx.room(1000).unwrap().len(), 36, "room is capped by what the message lacks");
    tx.commit(36).unwrap();
    assert!(matches!(tx.room(10), Err(Error::InvalidUsage(_))), "room with no message in progress");
    assert!(matches!(rx.consume(1), Err(Error::InvalidUsage(_))), "consume without peek");
    let got = loop {
        assert!(Instant::now() < deadline);
        tx.progress().unwrap();
        rx.progress().unwrap();
        if let Some(p) = rx.peek().unwrap() {
            break p.data.len();
        }
    };
    assert!(matches!(rx.consume(got + 1), Err(Error::InvalidUsage(_))));

    let t = Tcp::new(0, 2, [0; 16], SECRET, LO, TcpOptions::default()).unwrap();
    assert!(matches!(t.sender(1, 0), Err(Error::InvalidUsage(_))), "sender before set_peer_addrs");
    assert!(matches!(t.set_peer_addrs(vec![t.addr()]), Err(Error::InvalidArgument(_))));
    t.set_peer_addrs(vec![t.addr(), t.addr()]).unwrap();
    assert!(matches!(t.sender(2, 0), Err(Error::InvalidArgument(_))));
    assert!(t.sender(1, 0).is_ok());
    assert!(matches!(t.sender(1, 0), Err(Error::InvalidUsage(_))), "two senders for one connection");
    assert!(t.receiver(1, 0).is_ok());
    assert!(matches!(t.receiver(1, 0), Err(Error::InvalidUsage(_))));
    for bad in [opts(0, 4096), opts(65, 4096), opts(2, 100), opts(2, 0)] {
        assert!(matches!(Tcp::new(0, 2, [0; 16], SECRET, LO, bad), Err(Error::InvalidArgument(_))));
    }
    assert!(matches!(Tcp::new(2, 2, [0; 16], SECRET, LO, TcpOptions::default()), Err(Error::InvalidArgument(_))));
}

#[test]
fn bad_connections_are_dropped_while_a_real_pair_works() {
    let nonce = [5; 16];
    let o = TcpOptions { connect_timeout: Duration::from_secs(1), ..opts(2, 64 << 10) };
    let a = Tcp::new(0, 3, nonce, SECRET, LO, o.clone()).unwrap();
    let b = Tcp::new(1, 3, nonce, SECRET, LO, o).unwrap();
    let addrs = vec![a.addr(), b.addr(), a.addr()];
    a.set_peer_addrs(addrs.clone()).unwrap();
    b.set_peer_addrs(addrs).unwrap();
    let mut tx = a.sender(1, 0).unwrap();
    let mut rx = b.receiver(0, 0).unwrap();

    let hs = |nonce, receiver, sender, stripe| {
        Handshake { nonce, sender, receiver, channel: 0, stripe, nstripes: 2 }.encode().to_vec()
    };
    // A handshake with a proof: made with `secret` over the challenge the
    // accepting rank sends (read from `s`), or replayed from another one.
    let proven = |s: &mut TcpStream, h: Vec<u8>, secret: &[u8; 32]| {
        // Rank 1 accepts (and sends its challenge) when it makes progress.
        let mut challenge = [0u8; 16];
        let mut got = 0;
        s.set_nonblocking(true).unwrap();
        while got < 16 {
            b.progress().unwrap();
            match s.read(&mut challenge[got..]) {
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(1)),
                Err(e) => panic!("reading the challenge: {e}"),
            }
        }
        s.set_nonblocking(false).unwrap();
        let p = oxccl_transport::auth::prove(secret, &[b"oxccl-tcp", &challenge, &h]);
        [h, p.to_vec()].concat()
    };
    let mut garbage = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
    garbage.resize(200, b'z');
    let intruders: Vec<Vec<u8>> = vec![
        garbage,
        hs([6; 16], 1, 0, 0),              // another job
        hs(nonce, 2, 0, 0),                // meant for rank 2
        hs(nonce, 1, 7, 0),                // no such rank
        hs(nonce, 1, 0, 5),                // stripe out of range
        hs(nonce, 1, 0, 0)[..30].to_vec(), // truncated
        vec![],                            // port scanner: connect and close
    ];
    let mut socks = Vec::new();
    for bytes in &intruders {
        let mut s = TcpStream::connect(b.addr()).unwrap();
        s.write_all(bytes).unwrap();
        if !bytes.is_empty() {
            socks.push(s); // keep open: only the handshake is judged
        }
    }
    // Strangers who know the nonce (it travels in clear) but not the
    // secret; one who replays a proof made for another challenge; an
    // insider naming a channel that does not exist (1000). None takes a
    // place or a socket for long.
    let mut forger = TcpStream::connect(b.addr()).unwrap();
    let forged = proven(&mut forger, hs(nonce, 1, 0, 0), &[9; 32]);
    forger.write_all(&forged).unwrap();
    let mut first = TcpStream::connect(b.addr()).unwrap();
    let good = proven(&mut first, hs(nonce, 1, 2, 0), &SECRET);
    let mut replayer = TcpStream::connect(b.addr()).unwrap();
    replayer.write_all(&good).unwrap();
    let mut insider = TcpStream::connect(b.addr()).unwrap();
    let far = Handshake { nonce, sender: 2, receiver: 1, channel: 1000, stripe: 0, nstripes: 1 }.encode().to_vec();
    let far = proven(&mut insider, far, &SECRET);
    insider.write_all(&far).unwrap();
    socks.extend([forger, first, replayer, insider]);
    // Silent connections: dropped at the deadline.
    let silent: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(b.addr()).unwrap()).collect();

    let sz = sizes(42, 50, 100_000, 1);
    let s2 = sz.clone();
    thread::scope(|s| {
        s.spawn(|| send_all(&mut *tx, &s2, 1, 9));
        recv_all(&mut *rx, &sz, 1, 10);
    });
    let deadline = Instant::now() + LIMIT;
    while b.pending_handshakes() > 0 {
        assert!(Instant::now() < deadline, "{} handshakes never judged", b.pending_handshakes());
        b.progress().unwrap();
        thread::sleep(Duration::from_millis(5));
    }
    // A valid-looking duplicate of stripe 0 after the pair connected is
    // dropped too, and the pair still works.
    let mut dup = TcpStream::connect(b.addr()).unwrap();
    dup.write_all(&hs(nonce, 1, 0, 0)).unwrap();
    dup.write_all(&Header::new(0, 5, 2, 0).encode()).unwrap();
    let sz = vec![10, 0, 70_000];
    let s2 = sz.clone();
    thread::scope(|s| {
        s.spawn(|| send_all(&mut *tx, &s2, 1, 9));
        recv_all(&mut *rx, &sz, 1, 10);
    });
    while b.pending_handshakes() > 0 {
        assert!(Instant::now() < deadline);
        b.progress().unwrap();
    }
    assert_eq!(b.poll_fds().len(), 1 + 2, "listener and the pair's two sockets only");
    drop((silent, socks, dup));
}

fn expect_closed(rx: &mut dyn Receiver, before: usize) -> Error {
    let deadline = Instant::now() + LIMIT;
    let mut got = 0;
    loop {
        assert!(Instant::now() < deadline, "no error after the peer vanished");
        let r = rx.progress().and_then(|_| {
            let n = rx.peek()?.map(|p| p.data.len());
            if let Some(n) = n {
                rx.consume(n)?;
                got += n;
            }
            Ok(())
        });
        if let Err(e) = r {
            assert!(got >= before, "only {got} of {before} bytes arrived before the error");
            return e;
        }
    }
}

#[test]
fn peer_drop_mid_message_is_a_remote_error_naming_the_rank() {
    for close_tcp in [false, true] {
        let nonce = [2; 16];
        let a = Tcp::new(3, 4, nonce, SECRET, LO, opts(2, 64 << 10)).unwrap();
        let b = Tcp::new(1, 4, nonce, SECRET, LO, opts(2, 64 << 10)).unwrap();
        let addrs = vec![b.addr(), b.addr(), b.addr(), a.addr()];
        a.set_peer_addrs(addrs.clone()).unwrap();
        b.set_peer_addrs(addrs).unwrap();
        let mut tx = a.sender(1, 6).unwrap();
        let mut rx = b.receiver(3, 6).unwrap();
        tx.begin(1 << 20).unwrap();
        let mut sent = 0;
        let deadline = Instant::now() + LIMIT;
        while sent < 100_000 {
            assert!(Instant::now() < deadline);
            let n = tx.room(100_000 - sent).unwrap().len();
            tx.commit(n).unwrap();
            sent += n;
            tx.progress().unwrap();
            rx.progress().unwrap();
        }
        while !tx.flushed() {
            assert!(Instant::now() < deadline);
            tx.progress().unwrap();
        }
        if close_tcp {
            a.close();
        }
        drop(tx);
        let e = expect_closed(&mut *rx, 0);
        let msg = e.to_string();
        assert!(matches!(e, Error::Remote(_)), "{e:?}");
        assert!(msg.contains("rank 3 closed the connection") && msg.contains("channel 6"), "{msg}");
        assert!(rx.progress().is_err(), "the error sticks");
    }
}

#[test]
fn peer_drop_between_messages_delivers_what_was_sent_first() {
    let (mut tx, mut rx) = tcp_pair_with(0, opts(4, 256 << 10)).unwrap();
    establish(&mut *tx, &mut *rx);
    let sz = vec![200_000, 0, 5, 150_000];
    send_all(&mut *tx, &sz, 1, 4);
    drop(tx);
    recv_all(&mut *rx, &sz, 1, 8);
    let e = expect_closed(&mut *rx, 0);
    assert!(e.to_string().contains("rank 0 closed the connection"), "{e}");
}

#[test]
fn connecting_to_nobody_times_out_with_the_peer_named() {
    // A port that was just free: connections are refused.
    let dead = std::net::TcpListener::bind((LO, 0)).unwrap().local_addr().unwrap();
    let o = TcpOptions { connect_timeout: Duration::from_millis(300), ..opts(2, 4096) };
    let a = Tcp::new(0, 2, [0; 16], SECRET, LO, o).unwrap();
    a.set_peer_addrs(vec![a.addr(), dead]).unwrap();
    let mut tx = a.sender(1, 4).unwrap();
    tx.begin(10).unwrap();
    let deadline = Instant::now() + LIMIT;
    let e = loop {
        assert!(Instant::now() < deadline, "connecting never gave up");
        assert!(tx.room(10).map(|r| r.is_empty()).unwrap_or(true), "room before the connection exists");
        if let Err(e) = tx.progress() {
            break e;
        }
        thread::sleep(Duration::from_millis(5));
    };
    assert!(matches!(e, Error::Timeout(_)), "{e:?}");
    assert!(e.to_string().contains("rank 1") && e.to_string().contains(&dead.to_string()), "{e}");
    assert!(!tx.flushed());
}

/// A landing receive whose call failed: after `abandon` nothing is written
/// into its destination, and the connection says it lost a message.
#[test]
fn an_abandoned_landing_writes_nothing() {
    use oxccl_transport::region::Region;
    let (mut tx, mut rx) = tcp_pair_with(3, opts(2, 64 << 10)).unwrap();
    establish(&mut *tx, &mut *rx);
    let mut dst = vec![7u8; 1 << 20];
    let d = Region::of_mut(&mut dst);
    assert_eq!(rx.recv_into(&d).unwrap(), (false, false), "nothing arrived yet");
    rx.abandon();
    let src = vec![1u8; 1 << 20];
    send_all_from(&mut *tx, &src);
    let deadline = Instant::now() + LIMIT;
    let e = loop {
        assert!(Instant::now() < deadline, "the receiver never said it lost the message");
        tx.progress().unwrap();
        if let Err(e) = rx.progress().and_then(|_| rx.peek().map(|_| ())) {
            break e;
        }
    };
    assert!(e.to_string().contains("lost a message"), "{e}");
    assert!(dst.iter().all(|&b| b == 7), "an abandoned destination was written");
}

/// A message sent straight from its buffer whose call failed: after
/// `abandon` the sender keeps a copy, so the buffer may change or go and
/// the receiver still gets what was sent.
#[test]
fn an_abandoned_send_from_sends_what_it_had() {
    use oxccl_transport::region::Region;
    let (mut tx, mut rx) = tcp_pair_with(4, opts(2, 64 << 10)).unwrap();
    let mut src: Vec<u8> = (0..4 << 20).map(|i| (i % 251) as u8).collect();
    let want = src.clone();
    let token = tx.send_from(Region::of(&src), 0).unwrap().expect("large messages go from the buffer");
    tx.progress().unwrap();
    tx.abandon();
    src.iter_mut().for_each(|b| *b = 0);
    drop(src);
    let mut got = vec![0u8; want.len()];
    let d = Region::of_mut(&mut got);
    let deadline = Instant::now() + LIMIT;
    loop {
        assert!(Instant::now() < deadline);
        tx.progress().unwrap();
        rx.progress().unwrap();
        if rx.recv_into(&d).unwrap().1 {
            break;
        }
    }
    assert!(got == want, "the receiver got what the buffer held when it was sent");
    assert!(tx.released(token));
}

/// Progresses both ends until the connection is up and proven (the
/// accepting side must answer: its challenge comes before anything the
/// sender sends), so that a sender driven alone afterwards gets its bytes
/// into the kernel.
fn establish(tx: &mut dyn Sender, rx: &mut dyn Receiver) {
    let deadline = Instant::now() + LIMIT;
    // The first progress opens the sockets; flushed then means the
    // handshake and its proof are out.
    loop {
        tx.progress().unwrap();
        rx.progress().unwrap();
        if tx.flushed() {
            break;
        }
        assert!(Instant::now() < deadline, "the connection never came up");
        thread::sleep(Duration::from_micros(200));
    }
}

fn send_all_from(tx: &mut dyn Sender, src: &[u8]) {
    tx.begin(src.len()).unwrap();
    let mut off = 0;
    let deadline = Instant::now() + LIMIT;
    while off < src.len() {
        assert!(Instant::now() < deadline);
        let room = tx.room(src.len() - off).unwrap();
        let k = room.len();
        room.copy_from_slice(&src[off..off + k]);
        tx.commit(k).unwrap();
        off += k;
        tx.progress().unwrap();
    }
}

/// A flood of silent connections (more than may wait at once) neither
/// stops a real pair from connecting nor holds more than 256 sockets; the
/// ones past their deadline go.
#[test]
fn a_flood_of_silent_connections_is_bounded_and_swept() {
    let nonce = [8; 16];
    let o = TcpOptions { connect_timeout: Duration::from_secs(1), ..opts(2, 64 << 10) };
    let a = Tcp::new(0, 2, nonce, SECRET, LO, o.clone()).unwrap();
    let b = Tcp::new(1, 2, nonce, SECRET, LO, o).unwrap();
    let addrs = vec![a.addr(), b.addr()];
    a.set_peer_addrs(addrs.clone()).unwrap();
    b.set_peer_addrs(addrs).unwrap();
    let silent: Vec<TcpStream> = (0..400).map(|_| TcpStream::connect(b.addr()).unwrap()).collect();
    let deadline = Instant::now() + LIMIT;
    // Accepted (and the oldest dropped) as rank 1 makes progress.
    let mut most = 0;
    while most < 256 {
        assert!(Instant::now() < deadline, "only {most} silent connections were ever pending");
        b.progress().unwrap();
        most = most.max(b.pending_handshakes());
        assert!(b.pending_handshakes() <= 256, "{} pending", b.pending_handshakes());
    }
    let (mut tx, mut rx) = (a.sender(1, 0).unwrap(), b.receiver(0, 0).unwrap());
    let sz = sizes(7, 20, 50_000, 1);
    let s2 = sz.clone();
    thread::scope(|s| {
        s.spawn(|| send_all(&mut *tx, &s2, 1, 3));
        recv_all(&mut *rx, &sz, 1, 4);
    });
    // Past the handshake deadline (1 s here), every silent one is gone.
    while b.pending_handshakes() > 0 {
        assert!(Instant::now() < deadline, "{} silent connections outlived their deadline", b.pending_handshakes());
        b.progress().unwrap();
        thread::sleep(Duration::from_millis(10));
    }
    drop(silent);
}
