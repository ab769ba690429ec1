//! Loopback throughput of the TCP provider: 1 GiB from rank 0 to rank 1 in
//! 2 MiB messages, with 1, 2 and 4 sockets per connection; and, for
//! reference, plain blocking `std::net` sockets moving the same bytes.
//!
//! `cargo run --release -p oxccl-transport --example tcp_bw [MiB] [msg KiB]`

use oxccl_transport::tcp::{TcpOptions, tcp_pair_with};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

/// The same bytes over one blocking std socket: what the kernel allows.
fn baseline(total: usize, chunk: usize) -> f64 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let start = Instant::now();
    let t = std::thread::spawn(move || {
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        let buf = vec![7u8; chunk];
        let mut left = total;
        while left > 0 {
            let n = left.min(chunk);
            s.write_all(&buf[..n]).expect("write");
            left -= n;
        }
    });
    let (mut s, _) = l.accept().expect("accept");
    let mut buf = vec![0u8; chunk];
    let mut got = 0;
    while got < total {
        let n = s.read(&mut buf).expect("read");
        assert!(n > 0, "baseline: early EOF");
        got += n;
    }
    t.join().expect("baseline sender");
    total as f64 / start.elapsed().as_secs_f64() / 1e9
}

fn main() {
    let mut args = std::env::args().skip(1);
    let total: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1024) << 20;
    let msg: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2048) << 10;
    let count = total.div_ceil(msg);
    println!("{} MiB in {count} messages of {} KiB over loopback", total >> 20, msg >> 10);
    println!("std::net blocking, 1 socket: {:.2} GB/s", baseline(total, msg));
    for streams in [1, 2, 4] {
        let opts = TcpOptions { streams, ..TcpOptions::default() };
        let (mut tx, mut rx) = tcp_pair_with(0, opts).expect("loopback pair");
        let deadline = Instant::now() + Duration::from_secs(120);
        let start = Instant::now();
        let sender = std::thread::spawn(move || {
            for k in 0..count {
                let n = msg.min(total - k * msg);
                tx.begin(n).expect("begin");
                let mut off = 0;
                while off < n {
                    let room = tx.room(n - off).expect("room");
                    let r = room.len();
                    if r == 0 {
                        assert!(Instant::now() < deadline, "sender stuck");
                        if !tx.progress().expect("progress") {
                            std::thread::yield_now(); // an integrator would poll() here
                        }
                        continue;
                    }
                    room.fill(k as u8);
                    tx.commit(r).expect("commit");
                    off += r;
                }
                tx.progress().expect("progress");
            }
            while !tx.flushed() {
                assert!(Instant::now() < deadline, "sender never flushed");
                if !tx.progress().expect("progress") {
                    std::thread::yield_now();
                }
            }
            tx
        });
        let mut sum = 0u64;
        for k in 0..count {
            let n = msg.min(total - k * msg);
            let mut off = 0;
            while off < n {
                match rx.peek().expect("peek") {
                    Some(p) => {
                        let len = p.data.len();
                        sum += u64::from(p.data[len - 1]);
                        rx.consume(len).expect("consume");
                        off += len;
                    }
                    None => {
                        assert!(Instant::now() < deadline, "receiver stuck");
                        if !rx.progress().expect("progress") {
                            std::thread::yield_now();
                        }
                    }
                }
            }
        }
        let secs = start.elapsed().as_secs_f64();
        let tx = sender.join().expect("sender thread");
        assert_eq!(rx.bytes(), total as u64);
        assert_eq!(tx.bytes(), total as u64);
        println!("streams {streams}: {:.2} GB/s ({secs:.3} s, check {sum})", total as f64 / secs / 1e9);
    }
}
