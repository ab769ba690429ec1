//! Encrypted TCP (`OXCCL_ENCRYPT=1`) seen from the wire: a relay between
//! two ranks records what crosses. Without encryption a message's bytes
//! are there to read; with it they are not, and the message still arrives
//! whole; a byte altered on the way is an error at the receiver, not wrong
//! data.

use oxccl_transport::conformance::relay::{contains, relay};
use oxccl_transport::tcp::{Tcp, TcpOptions};
use oxccl_transport::{Receiver, Sender};
use std::net::{IpAddr, Ipv4Addr};
use std::thread;
use std::time::{Duration, Instant};

const LO: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const LIMIT: Duration = Duration::from_secs(30);

/// Rank 0 sends `msg` to rank 1 through a relay; what rank 1 received (or
/// its error) and what the relay saw.
fn through_relay(encrypt: bool, flip: Option<usize>, msg: &[u8]) -> (Result<Vec<u8>, String>, Vec<u8>) {
    let opts = TcpOptions { streams: 1, buffer: 1 << 20, encrypt, ..TcpOptions::default() };
    let (nonce, secret) = ([3u8; 16], [9u8; 32]);
    let a = Tcp::new(0, 2, nonce, secret, LO, opts.clone()).unwrap();
    let b = Tcp::new(1, 2, nonce, secret, LO, opts).unwrap();
    let (via, seen) = relay(b.addr(), flip);
    let seen = seen.there;
    a.set_peer_addrs(vec![a.addr(), via]).unwrap();
    b.set_peer_addrs(vec![a.addr(), b.addr()]).unwrap();
    let (mut tx, mut rx) = (a.sender(1, 0).unwrap(), b.receiver(0, 0).unwrap());
    let got = thread::scope(|s| {
        s.spawn(|| send(&mut *tx, msg));
        recv(&mut *rx, msg.len())
    });
    let seen = seen.lock().unwrap().clone();
    (got, seen)
}

fn send(tx: &mut dyn Sender, msg: &[u8]) {
    let deadline = Instant::now() + LIMIT;
    tx.begin(msg.len()).unwrap();
    let mut off = 0;
    while off < msg.len() {
        assert!(Instant::now() < deadline, "sender stuck");
        let room = tx.room(msg.len() - off).unwrap();
        let n = room.len();
        room.copy_from_slice(&msg[off..off + n]);
        tx.commit(n).unwrap();
        off += n;
        if n == 0 && tx.progress().is_err() {
            return;
        }
    }
    while !tx.flushed() && Instant::now() < deadline {
        if tx.progress().is_err() {
            return;
        }
    }
}

fn recv(rx: &mut dyn Receiver, len: usize) -> Result<Vec<u8>, String> {
    let deadline = Instant::now() + LIMIT;
    let mut out = Vec::new();
    while out.len() < len {
        assert!(Instant::now() < deadline, "receiver stuck at {} of {len}", out.len());
        rx.progress().map_err(|e| e.to_string())?;
        let n = match rx.peek().map_err(|e| e.to_string())? {
            Some(p) => {
                out.extend_from_slice(p.data);
                p.data.len()
            }
            None => continue,
        };
        rx.consume(n).map_err(|e| e.to_string())?;
    }
    Ok(out)
}

fn message() -> Vec<u8> {
    let mut m: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 253) as u8).collect();
    m[1000..1032].copy_from_slice(b"THIS IS A PLAINTEXT MARKER 12345");
    m
}

#[test]
fn encrypted_bytes_are_unreadable_on_the_wire_and_arrive_whole() {
    let msg = message();
    let (got, seen) = through_relay(false, None, &msg);
    assert_eq!(got.unwrap(), msg);
    assert!(contains(&seen, b"PLAINTEXT MARKER"), "in clear, the relay reads the message");
    let (got, seen) = through_relay(true, None, &msg);
    assert_eq!(got.unwrap(), msg, "encrypted, the message arrives whole");
    assert!(seen.len() > msg.len(), "the relay saw the records");
    assert!(!contains(&seen, b"PLAINTEXT MARKER"), "encrypted, the relay reads nothing of it");
}

#[test]
fn a_byte_altered_on_the_way_is_an_error_not_data() {
    let msg = message();
    // Well past the hello (which is in clear), inside the records.
    let (got, _) = through_relay(true, Some(5000), &msg);
    let e = got.expect_err("an altered record must not be delivered");
    assert!(e.contains("rank 0") && e.contains("does not authenticate"), "{e}");
}
