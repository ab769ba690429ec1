//! Accepted sockets still presenting their handshake, watched by readiness
//! (epoll, through mio): a poll reads only the sockets with bytes waiting,
//! so idle or hostile connections cost the data path one `epoll_wait`,
//! whatever their number; their deadlines are swept a few times a second.

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use socket2::Socket;
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

/// How often deadlines are looked at.
const SWEEP_EVERY: Duration = Duration::from_millis(100);

/// An accepted socket whose handshake and proof are still being read.
pub(super) struct Pending {
    pub sock: Socket,
    pub from: String,
    /// The challenge sent to it on accept.
    pub challenge: [u8; crate::auth::CHALLENGE_LEN],
    pub buf: [u8; super::HELLO_LEN],
    pub got: usize,
    pub deadline: Instant,
}

/// The pending sockets, oldest first, and the readiness set they are in.
pub(super) struct Handshakes {
    poll: Poll,
    events: Events,
    map: BTreeMap<usize, Pending>,
    next: usize,
    last_sweep: Instant,
}

impl Handshakes {
    pub fn new() -> std::io::Result<Handshakes> {
        Ok(Handshakes {
            poll: Poll::new()?,
            events: Events::with_capacity(64),
            map: BTreeMap::new(),
            next: 0,
            last_sweep: Instant::now(),
        })
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Watches `p`; beyond `max`, the oldest is dropped and returned.
    pub fn add(&mut self, p: Pending, max: usize) -> std::io::Result<Option<Pending>> {
        let old = if self.map.len() >= max { self.map.pop_first().map(|(_, o)| self.forget(o)) } else { None };
        let key = self.next;
        self.next += 1;
        self.poll.registry().register(&mut SourceFd(&p.sock.as_raw_fd()), Token(key), Interest::READABLE)?;
        self.map.insert(key, p);
        Ok(old)
    }

    /// Keys of sockets that became readable since the last call, and of
    /// those past their deadline (at most every [`SWEEP_EVERY`]).
    pub fn due(&mut self, now: Instant) -> Vec<usize> {
        let mut keys = Vec::new();
        if self.map.is_empty() {
            return keys;
        }
        if self.poll.poll(&mut self.events, Some(Duration::ZERO)).is_ok() {
            keys.extend(self.events.iter().map(|e| e.token().0).filter(|k| self.map.contains_key(k)));
        }
        if now.duration_since(self.last_sweep) >= SWEEP_EVERY {
            self.last_sweep = now;
            let late: Vec<usize> =
                self.map.iter().filter(|(k, p)| now >= p.deadline && !keys.contains(k)).map(|(k, _)| *k).collect();
            keys.extend(late);
        }
        keys
    }

    pub fn get_mut(&mut self, key: usize) -> Option<&mut Pending> {
        self.map.get_mut(&key)
    }

    /// Stops watching `key`'s socket; it, to keep or drop.
    pub fn remove(&mut self, key: usize) -> Option<Pending> {
        self.map.remove(&key).map(|p| self.forget(p))
    }

    fn forget(&self, p: Pending) -> Pending {
        let _ = self.poll.registry().deregister(&mut SourceFd(&p.sock.as_raw_fd()));
        p
    }

    pub fn fds(&self) -> impl Iterator<Item = RawFd> + '_ {
        self.map.values().map(|p| p.sock.as_raw_fd())
    }

    pub fn clear(&mut self) {
        while let Some((_, p)) = self.map.pop_first() {
            self.forget(p);
        }
    }
}
