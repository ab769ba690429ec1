//! The sending end of a TCP connection.
//!
//! The FIFO is a ring of `buffer` bytes indexed by a 64-bit stream position
//! (position `p` lives at `p % cap`); each message starts at a 64-aligned
//! position. `room`/`commit` write into it; `progress` moves committed
//! bytes to the sockets, each socket carrying its stripe of every message
//! behind a [`Header`]. Space is released up to the least position not yet
//! handed to the kernel on any socket, rounded down to 64 so `room` always
//! returns whole elements.
//!
//! A message given to [`send_from`](Sender::send_from) takes no FIFO space:
//! its stripes are written to the sockets straight from the caller's
//! buffer, each behind its header in one `writev`, in order with the other
//! messages; the buffer is released once the kernel has all of it.

use super::seal::{self, Sealer};
use super::{HELLO_LEN, handshake_proof};
use super::{Shared, aligned_buffer, start_connect};
use crate::region::Region;
use crate::wire::{HANDSHAKE_LEN, HEADER_LEN, Handshake, Header, MAX_MSG, stripe_range};
use crate::{Channel, Error, Result, Sender};
use socket2::{SockAddr, Socket};
use std::collections::VecDeque;
use std::io::{ErrorKind, IoSlice};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most slices in one `writev`.
const MAX_IOV: usize = 64;

/// One stripe of one message, queued on its socket.
struct Job {
    hdr: [u8; HEADER_LEN],
    hdr_sent: usize,
    /// Stream position of the stripe's first byte (FIFO messages).
    pos: u64,
    len: u64,
    sent: u64,
    /// The stripe's bytes in the caller's buffer (`send_from`), and the
    /// message's token.
    ext: Option<(Region, u64)>,
    /// A copy of the stripe, once its call failed and the caller's buffer
    /// may go ([`Sender::abandon`]; `ext` then points here).
    kept: Option<Vec<u8>>,
}

impl Job {
    fn done(&self) -> bool {
        self.hdr_sent == HEADER_LEN && self.sent == self.len
    }
}

/// Messages at least this long go straight from the caller's buffer.
const FROM_MIN: usize = 32 << 10;

struct Stream {
    sock: Arc<Socket>,
    connected: bool,
    /// The handshake, then (once the accepting side's challenge is in)
    /// its proof: what this socket sends first.
    hs: [u8; HELLO_LEN],
    /// The accepting side's challenge, as it arrives.
    challenge: [u8; crate::auth::CHALLENGE_LEN],
    challenge_got: usize,
    hs_sent: usize,
    /// With encryption, what seals the bytes after the hello.
    seal: Option<Sealer>,
}

impl Stream {
    fn new(sock: Arc<Socket>, handshake: [u8; HANDSHAKE_LEN]) -> Stream {
        let mut hs = [0; HELLO_LEN];
        hs[..HANDSHAKE_LEN].copy_from_slice(&handshake);
        Stream {
            sock,
            connected: false,
            hs,
            challenge: [0; crate::auth::CHALLENGE_LEN],
            challenge_got: 0,
            hs_sent: 0,
            seal: None,
        }
    }

    /// A fresh socket in place of this one (refused, or dropped before its
    /// challenge came in full): connecting, awaiting a new challenge.
    fn reopen(&mut self, target: &SockAddr, shared: &Shared, who: &str, i: usize) -> Result<()> {
        let sock = start_connect(target, &shared.opts)
            .map_err(|e| Error::System(format!("{who}: reopening stream {i}: {e}")))?;
        self.sock = Arc::new(sock);
        self.connected = false;
        self.challenge_got = 0;
        shared.register(&self.sock);
        Ok(())
    }

    /// Whether the challenge is in and the proof made.
    fn proven(&self) -> bool {
        self.challenge_got == crate::auth::CHALLENGE_LEN
    }

    /// Reads what has come of the challenge; `Err` if the accepting side
    /// closed first (it refused or dropped the socket: reconnect).
    fn read_challenge(&mut self, secret: &crate::auth::Secret, encrypt: bool) -> std::io::Result<bool> {
        use std::io::Read;
        let mut moved = false;
        while !self.proven() {
            match (&*self.sock).read(&mut self.challenge[self.challenge_got..]) {
                Ok(0) => return Err(std::io::Error::new(ErrorKind::ConnectionAborted, "closed before the challenge")),
                Ok(n) => {
                    self.challenge_got += n;
                    moved = true;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        if self.proven() && moved {
            let proof = handshake_proof(secret, &self.challenge, &self.hs[..HANDSHAKE_LEN]);
            self.hs[HANDSHAKE_LEN..].copy_from_slice(&proof);
            self.seal = encrypt.then(|| Sealer::new(&seal::key(secret, &self.challenge, &self.hs[..HANDSHAKE_LEN])));
        }
        Ok(moved)
    }
}

/// The message being written.
struct Cur {
    len: u64,
    written: u64,
}

pub(super) struct TcpSender {
    shared: Arc<Shared>,
    peer: usize,
    ch: Channel,
    addr: SocketAddr,
    nstripes: u16,
    streams: Vec<Stream>,
    /// Per stripe, the stripes of messages not yet in the kernel.
    queues: Vec<VecDeque<Job>>,
    /// When connecting started (`None`: not yet).
    since: Option<Instant>,
    retry_at: Option<Instant>,
    ready: bool,
    /// Every socket has the accepting side's challenge and its proof.
    proven: bool,
    /// The FIFO is `buf[base..base + cap]`, 64-aligned in memory.
    buf: Vec<u8>,
    base: usize,
    cap: u64,
    /// Stream position after the last committed byte.
    commit: u64,
    cur: Option<Cur>,
    next_start: u64,
    seq: u64,
    last_room: usize,
    bytes: u64,
    failed: Option<Error>,
}

fn align64(x: u64) -> u64 {
    x.div_ceil(64) * 64
}

impl TcpSender {
    pub(super) fn new(shared: Arc<Shared>, peer: usize, ch: Channel, addr: SocketAddr) -> TcpSender {
        let cap = shared.opts.buffer as u64;
        let (buf, base) = aligned_buffer(shared.opts.buffer);
        let nstripes = shared.opts.streams as u16;
        TcpSender {
            buf,
            base,
            shared,
            peer,
            ch,
            addr,
            nstripes,
            streams: Vec::new(),
            queues: (0..nstripes).map(|_| VecDeque::new()).collect(),
            since: None,
            retry_at: None,
            ready: false,
            proven: false,
            cap,
            commit: 0,
            cur: None,
            next_start: 0,
            seq: 0,
            last_room: 0,
            bytes: 0,
            failed: None,
        }
    }

    fn who(&self) -> String {
        format!("rank {} → rank {} at {} (channel {})", self.shared.me, self.peer, self.addr, self.ch)
    }

    /// Opens the sockets (first use), checks whether they are connected,
    /// and reads the accepting side's challenges. Connected sockets take
    /// messages into the FIFO (`ready`); a socket carries them once its
    /// proof is made (`proven`).
    fn connect(&mut self) -> Result<bool> {
        if self.ready && self.proven {
            return Ok(false);
        }
        let now = Instant::now();
        let who = self.who();
        let since = *self.since.get_or_insert(now);
        if self.retry_at.is_some_and(|t| now < t) {
            return Ok(false);
        }
        self.retry_at = None;
        let target = SockAddr::from(self.addr);
        let opts = &self.shared.opts;
        let mut moved = false;
        for i in 0..usize::from(self.nstripes) {
            if i >= self.streams.len() {
                let sock = start_connect(&target, opts)
                    .map_err(|e| Error::System(format!("{}: opening stream {i}: {e}", who)))?;
                let sock = Arc::new(sock);
                self.shared.register(&sock);
                let hs = Handshake {
                    nonce: self.shared.nonce,
                    sender: self.shared.me as u32,
                    receiver: self.peer as u32,
                    channel: self.ch,
                    stripe: i as u16,
                    nstripes: self.nstripes,
                };
                self.streams.push(Stream::new(sock, hs.encode()));
                moved = true;
            }
            let s = &mut self.streams[i];
            if s.connected {
                if s.proven() {
                    continue;
                }
                match s.read_challenge(&self.shared.secret, self.shared.opts.encrypt) {
                    Ok(m) => moved |= m,
                    Err(e) => {
                        // The accepting side dropped the socket before its
                        // challenge (too many pending, a restart): again,
                        // until the deadline.
                        if now.duration_since(since) >= opts.connect_timeout {
                            return Err(Error::Timeout(format!(
                                "{}: the peer accepted but sent no challenge within {:?}: {e}",
                                who, opts.connect_timeout
                            )));
                        }
                        s.reopen(&target, &self.shared, &who, i)?;
                        self.retry_at = Some(now + Duration::from_millis(20));
                    }
                }
                continue;
            }
            if let Ok(Some(e)) | Err(e) = s.sock.take_error() {
                // Refused or unreachable: the peer may not listen yet; retry
                // with a fresh socket until the deadline.
                if now.duration_since(since) >= opts.connect_timeout {
                    return Err(Error::Timeout(format!(
                        "{}: could not connect within {:?}: {e}; is the peer alive and its address reachable?",
                        who, opts.connect_timeout
                    )));
                }
                s.reopen(&target, &self.shared, &who, i)?;
                self.retry_at = Some(now + Duration::from_millis(20));
                continue;
            }
            if s.sock.peer_addr().is_ok() {
                s.connected = true;
                moved = true;
            } else if now.duration_since(since) >= opts.connect_timeout {
                return Err(Error::Timeout(format!(
                    "{}: not connected after {:?}; is the peer alive and its address reachable?",
                    who, opts.connect_timeout
                )));
            }
        }
        self.ready = self.streams.iter().all(|s| s.connected);
        self.proven = self.ready && self.streams.iter().all(Stream::proven);
        Ok(moved)
    }

    /// Lowest stream position some socket still needs.
    fn release(&self) -> u64 {
        let mut r = self.commit;
        for q in &self.queues {
            if let Some(j) = q.iter().find(|j| j.ext.is_none() && !j.done()) {
                r = r.min(j.pos + j.sent);
            }
        }
        r
    }

    /// Writes what each socket can take; true if anything moved. Each
    /// `writev` carries the handshake if due, then headers and payloads of
    /// consecutive messages: FIFO bytes, and at most one caller's buffer
    /// (last).
    fn push(&mut self) -> Result<bool> {
        let mut moved = false;
        let (cap, commit) = (self.cap, self.commit);
        let ring = &self.buf[self.base..self.base + cap as usize];
        for (i, (s, jobs)) in self.streams.iter_mut().zip(&mut self.queues).enumerate() {
            if !s.proven() {
                // Nothing goes out before the proof (the handshake is its
                // first part).
                continue;
            }
            if let Some(seal) = &mut s.seal {
                let before = seal.idle();
                let done =
                    seal.flush(&s.sock).map_err(|e| self.shared.lost(self.peer, self.ch, i, &format!(": {e}")))?;
                moved |= done && !before;
                if !done {
                    continue;
                }
            }
            loop {
                let mut iov: Vec<IoSlice<'_>> = Vec::with_capacity(8);
                if s.hs_sent < HELLO_LEN {
                    iov.push(IoSlice::new(&s.hs[s.hs_sent..]));
                }
                let mut ext: Option<(Region, u64)> = None;
                for j in jobs.iter() {
                    if iov.len() + 3 > MAX_IOV {
                        break;
                    }
                    if j.hdr_sent < HEADER_LEN {
                        iov.push(IoSlice::new(&j.hdr[j.hdr_sent..]));
                    }
                    if let Some((src, _)) = j.ext {
                        ext = (j.sent < j.len).then_some((src, j.sent));
                        break;
                    }
                    let from = j.pos + j.sent;
                    let to = (j.pos + j.len).min(commit);
                    if to > from {
                        let (a, b) = ((from % cap) as usize, (to - from) as usize);
                        let first = b.min(ring.len() - a);
                        iov.push(IoSlice::new(&ring[a..a + first]));
                        if first < b {
                            iov.push(IoSlice::new(&ring[..b - first]));
                        }
                    }
                    if to < j.pos + j.len {
                        break;
                    }
                }
                if iov.is_empty() && ext.is_none() {
                    break;
                }
                // The hello in clear, then (encrypting) sealed records.
                let hello_done = s.hs_sent == HELLO_LEN;
                let mut send = |iov: &[IoSlice<'_>]| match &mut s.seal {
                    Some(seal) if hello_done => seal.send(&s.sock, iov),
                    Some(_) => s.sock.send_with_flags(&iov[0], libc::MSG_NOSIGNAL),
                    None => s.sock.send_vectored_with_flags(iov, libc::MSG_NOSIGNAL),
                };
                let r = match ext {
                    None => send(&iov),
                    Some((src, from)) => src.read(|b| {
                        let mut all: Vec<IoSlice<'_>> = iov.iter().map(|s| IoSlice::new(s)).collect();
                        all.push(IoSlice::new(&b[from as usize..]));
                        send(&all)
                    }),
                };
                let n = match r {
                    Ok(n) => n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) => {
                        return Err(self.shared.lost(self.peer, self.ch, i, &format!(": {e}")));
                    }
                };
                if n == 0 {
                    break;
                }
                moved = true;
                let mut n = n;
                let hs = n.min(HELLO_LEN - s.hs_sent);
                s.hs_sent += hs;
                n -= hs;
                let mut k = 0;
                while n > 0 {
                    let Some(j) = jobs.get_mut(k) else { break };
                    let h = n.min(HEADER_LEN - j.hdr_sent);
                    j.hdr_sent += h;
                    n -= h;
                    let p = (n as u64).min(j.len - j.sent);
                    j.sent += p;
                    n -= p as usize;
                    k += 1;
                }
                while jobs.front().is_some_and(Job::done) {
                    jobs.pop_front();
                }
            }
        }
        Ok(moved)
    }

    fn check(&self) -> Result<()> {
        self.failed.as_ref().map_or(Ok(()), |e| Err(e.clone()))
    }

    /// Queues the next message, `len` bytes, one job per non-empty stripe
    /// (stripe 0 always): its bytes come through the FIFO from
    /// `next_start`, or straight from `src`. Returns its sequence number
    /// (a straight send's token). `what` names the call for errors.
    fn enqueue(&mut self, len: u64, tag: u64, what: impl Fn() -> String, src: Option<Region>) -> Result<u64> {
        if let Some(c) = &self.cur {
            return Err(Error::InvalidUsage(format!(
                "{}: {} while message {} has {} of {} bytes committed; commit the whole message first",
                self.who(),
                what(),
                self.seq - 1,
                c.written,
                c.len
            )));
        }
        if len > MAX_MSG {
            return Err(Error::invalid(format!("{}: message of {len} bytes exceeds {MAX_MSG}", self.who())));
        }
        let (seq, start) = (self.seq, self.next_start);
        for i in 0..self.nstripes {
            let r = stripe_range(len, self.nstripes, i);
            if i == 0 || r.end > r.start {
                let hdr = Header::new(seq, len, self.nstripes, i).tagged(tag).encode();
                let (pos, ext) = match src {
                    None => (start + r.start, None),
                    Some(src) => (0, Some((src.sub(r.start as usize, (r.end - r.start) as usize)?, seq))),
                };
                let job = Job { hdr, hdr_sent: 0, pos, len: r.end - r.start, sent: 0, ext, kept: None };
                self.queues[usize::from(i)].push_back(job);
            }
        }
        self.seq += 1;
        Ok(seq)
    }

    fn fail<T>(&mut self, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            self.failed = Some(e.clone());
        }
        r
    }
}

impl Sender for TcpSender {
    fn begin_tagged(&mut self, len: usize, tag: u64) -> Result<()> {
        self.check()?;
        let len64 = len as u64;
        let start = self.next_start;
        self.enqueue(len64, tag, || format!("begin({len})"), None)?;
        self.commit = start;
        self.next_start = align64(start + len64);
        self.cur = (len > 0).then_some(Cur { len: len64, written: 0 });
        self.last_room = 0;
        let r = self.connect();
        self.fail(r).map(|_| ())
    }

    fn room(&mut self, want: usize) -> Result<&mut [u8]> {
        self.check()?;
        self.last_room = 0;
        if !self.ready {
            let r = self.connect();
            self.fail(r)?;
        }
        let Some(c) = &self.cur else {
            if want > 0 {
                return Err(Error::InvalidUsage(format!("{}: room({want}) before begin", self.who())));
            }
            return Ok(&mut []);
        };
        if !self.ready {
            return Ok(&mut []);
        }
        let free_end = (self.release() & !63) + self.cap;
        let off = self.commit % self.cap;
        let n = (want as u64).min(c.len - c.written).min(free_end.saturating_sub(self.commit)).min(self.cap - off);
        self.last_room = n as usize;
        let off = self.base + off as usize;
        Ok(&mut self.buf[off..off + n as usize])
    }

    fn commit(&mut self, n: usize) -> Result<()> {
        self.check()?;
        if n > self.last_room {
            return Err(Error::InvalidUsage(format!(
                "{}: commit({n}) exceeds the {} bytes of the last room",
                self.who(),
                self.last_room
            )));
        }
        if n == 0 {
            return Ok(());
        }
        self.last_room -= n;
        let Some(c) = &mut self.cur else {
            return Err(Error::Internal(format!("{}: room without a message", self.who())));
        };
        c.written += n as u64;
        self.commit += n as u64;
        self.bytes += n as u64;
        if c.written == c.len {
            self.cur = None;
            self.last_room = 0;
        }
        Ok(())
    }

    fn progress(&mut self) -> Result<bool> {
        self.check()?;
        let r = self.connect();
        let connected = self.fail(r)?;
        if !self.ready {
            return Ok(connected);
        }
        let r = self.push();
        Ok(self.fail(r)? || connected)
    }

    fn flushed(&self) -> bool {
        self.streams.iter().all(|s| s.hs_sent == HELLO_LEN && s.seal.as_ref().is_none_or(Sealer::idle))
            && self.queues.iter().flatten().all(|j| match j.ext {
                Some(_) => j.done(),
                None => j.hdr_sent == HEADER_LEN && j.pos + j.sent >= (j.pos + j.len).min(self.commit),
            })
    }

    fn bytes(&self) -> u64 {
        self.bytes
    }

    fn takes_from(&self, len: usize) -> bool {
        len >= FROM_MIN
    }

    fn send_from(&mut self, src: Region, tag: u64) -> Result<Option<u64>> {
        self.check()?;
        let len = src.len() as u64;
        let token = self.enqueue(len, tag, || "send_from".into(), Some(src))?;
        self.bytes += len;
        let r = self.connect().and_then(|_| if self.ready { self.push() } else { Ok(false) });
        self.fail(r)?;
        Ok(Some(token))
    }

    fn released(&self, token: u64) -> bool {
        !self.queues.iter().flatten().any(|j| j.ext.is_some_and(|(_, t)| t == token))
    }

    fn abandon(&mut self) {
        for j in self.queues.iter_mut().flatten() {
            if let (Some((src, token)), None) = (j.ext, &j.kept) {
                let copy = src.read(<[u8]>::to_vec);
                j.ext = Some((Region::of(&copy), token));
                j.kept = Some(copy);
            }
        }
    }
}
