//! Loom model of the ring: a producer and a consumer thread pass messages
//! (one of 0 bytes) whose payloads wrap around a 4 KiB data area, in
//! pieces; every byte must arrive in order. Loom explores the interleavings
//! of the counter atomics (the data bytes are plain memory, which loom does
//! not model: the model checks the index and publication logic).
//!
//! `RUSTFLAGS="--cfg loom" cargo test -p oxccl-transport --test loom_ring --release`
#![cfg(loom)]

use oxccl_transport::futex::Doorbell;
use oxccl_transport::ring::{Label, Ring};
use oxccl_transport::{Receiver, Sender};

const SIZES: [usize; 3] = [2000, 0, 2600];
const PIECE: usize = 2048;

fn byte(i: usize, off: usize) -> u8 {
    (i * 37 + off) as u8
}

#[test]
fn wrapping_messages_arrive_in_order() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(2);
    b.check(|| {
        let ring = Ring::heap(4096).unwrap();
        let (pbell, cbell) = (Doorbell::heap(), Doorbell::heap());
        let mut p = ring.producer(cbell.clone(), Label { peer: 1, ch: 0 }).unwrap();
        let mut c = ring.consumer(pbell.clone(), Label { peer: 0, ch: 0 }).unwrap();
        let t = loom::thread::spawn(move || {
            for (i, &len) in SIZES.iter().enumerate() {
                p.begin(len).unwrap();
                let mut off = 0;
                while off < len {
                    let room = p.room((len - off).min(PIECE)).unwrap();
                    if room.is_empty() {
                        p.progress().unwrap();
                        loom::thread::yield_now();
                        continue;
                    }
                    let n = room.len();
                    room.iter_mut().enumerate().for_each(|(k, b)| *b = byte(i, off + k));
                    p.commit(n).unwrap();
                    off += n;
                }
            }
            while !p.flushed() {
                p.progress().unwrap();
                loom::thread::yield_now();
            }
            p
        });
        for (i, &len) in SIZES.iter().enumerate() {
            let mut off = 0;
            loop {
                let Some(piece) = c.peek().unwrap() else {
                    loom::thread::yield_now();
                    continue;
                };
                assert_eq!((piece.msg_len, piece.offset), (len, off));
                for (k, &b) in piece.data.iter().enumerate() {
                    assert_eq!(b, byte(i, off + k), "message {i} byte {}", off + k);
                }
                let n = piece.data.len();
                c.consume(n).unwrap();
                off += n;
                if off == len {
                    break;
                }
            }
        }
        let p = t.join().unwrap();
        assert_eq!(p.bytes(), c.bytes());
        assert_eq!(c.bytes(), SIZES.iter().sum::<usize>() as u64);
        drop(p);
        assert!(c.peek().is_err(), "producer closed");
    });
}
