//! Tests that look at the wire: a TCP relay that forwards every connection
//! made to it on to a target, records what crosses each way and can flip a
//! byte on the way; and the addresses this process listens on (to crowd
//! them with silent connections).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;

/// What crossed a relay: towards its target, and back.
#[derive(Clone, Default)]
pub struct Seen {
    /// Bytes towards the target, all connections in arrival order.
    pub there: Arc<Mutex<Vec<u8>>>,
    /// Bytes back from the target.
    pub back: Arc<Mutex<Vec<u8>>>,
}

/// Starts a relay on loopback to `to`; its address and what it sees. With
/// `flip`, byte `flip` of the bytes towards the target (counted over all
/// connections) is altered.
pub fn relay(to: SocketAddr, flip: Option<usize>) -> (SocketAddr, Seen) {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("a loopback port for the relay");
    let addr = l.local_addr().expect("the relay's address");
    let seen = Seen::default();
    let s = seen.clone();
    thread::spawn(move || {
        for inc in l.incoming() {
            let Ok(a) = inc else { return };
            let Ok(b) = TcpStream::connect(to) else { return };
            let (a2, b2) = (a.try_clone().expect("clone"), b.try_clone().expect("clone"));
            pump(b2, a2, s.back.clone(), None);
            pump(a, b, s.there.clone(), flip);
        }
    });
    (addr, seen)
}

/// Copies `from` to `to` on a thread of its own, recording into `log`.
fn pump(mut from: TcpStream, mut to: TcpStream, log: Arc<Mutex<Vec<u8>>>, flip: Option<usize>) {
    thread::spawn(move || {
        let mut buf = [0u8; 65536];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => {
                    let _ = to.shutdown(std::net::Shutdown::Write);
                    return;
                }
                Ok(n) => n,
            };
            let mut g = log.lock().expect("relay log");
            let at = g.len();
            g.extend_from_slice(&buf[..n]);
            drop(g);
            if let Some(f) = flip.filter(|f| (at..at + n).contains(f)) {
                buf[f - at] ^= 0x40;
            }
            if to.write_all(&buf[..n]).is_err() {
                return;
            }
        }
    });
}

/// Whether `needle` occurs in `hay`.
pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Addresses this process's sockets listen on (/proc/net/tcp's LISTEN
/// entries whose inode is one of our fds), loopback for a wildcard.
pub fn own_listening_addrs() -> Vec<SocketAddr> {
    let inodes: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .filter_map(|l| l.to_string_lossy().strip_prefix("socket:[")?.strip_suffix(']').map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let table = std::fs::read_to_string("/proc/self/net/tcp").unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (local, state, inode) = (f.get(1)?, f.get(3)?, f.get(9)?);
            if *state != "0A" || !inodes.iter().any(|i| i == inode) {
                return None;
            }
            let (ip, port) = local.split_once(':')?;
            let ip = Ipv4Addr::from(u32::from_str_radix(ip, 16).ok()?.swap_bytes());
            let ip = if ip.is_unspecified() { Ipv4Addr::LOCALHOST } else { ip };
            Some(SocketAddr::from((ip, u16::from_str_radix(port, 16).ok()?)))
        })
        .collect()
}
