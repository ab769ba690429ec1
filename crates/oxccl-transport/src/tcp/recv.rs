//! The receiving end of a TCP connection.
//!
//! The FIFO is a ring of `buffer` bytes indexed by a 64-bit stream position
//! as at the sender: message `k` starts at the 64-aligned position after
//! message `k - 1`, so payloads start 64-aligned in the buffer. Socket 0
//! carries a header for every message and so fixes the layout; socket `i`
//! reads its stripe of each message straight to its place, but never past
//! `consumer position + capacity`. `peek` returns the bytes arrived
//! contiguously from the consumer position, cut to a multiple of 8 bytes
//! of the message (whole elements) unless they end the message.
//!
//! [`recv_into`](Receiver::recv_into) lands a message in the caller's
//! buffer instead: when none of its payload has arrived yet, the sockets
//! read its stripes straight to their place there (the message still
//! occupies its stream positions, not FIFO memory). A socket reads the
//! rest of a stripe and the next header in one `readv`, and a short read
//! ends that socket's turn (the next read would only say "nothing").
//!
//! A header read asks for up to [`CARRY`] bytes more: a small message's
//! payload (and what follows it) arrives with its header in one system
//! call, kept in the stream's carry and handed out before the socket is
//! read again. The stream is still parsed as before, byte for byte.

use super::seal::Opener;
use super::{Shared, aligned_buffer};
use crate::region::Region;
use crate::wire::{HEADER_LEN, Header, stripe_range};
use crate::{Channel, Error, Piece, Receiver, Result};
use socket2::Socket;
use std::collections::VecDeque;
use std::io::IoSliceMut;
use std::io::{ErrorKind, Read};
use std::sync::Arc;

/// Most messages whose header has arrived but which are not consumed yet
/// (0-byte messages take no FIFO space; this bounds their bookkeeping).
const MAX_MSGS: usize = 4096;

/// Bytes read beyond a header in the same system call.
const CARRY: usize = 512;

/// A message whose header has arrived.
struct Msg {
    seq: u64,
    start: u64,
    len: u64,
    tag: u64,
}

struct Stream {
    sock: Arc<Socket>,
    /// Encrypting: what opens the sealed records.
    open: Option<Opener>,
    hdr: [u8; HEADER_LEN],
    hdr_got: usize,
    /// Bytes read past a header and not yet handed out:
    /// `carry[carry_at..carry_at + carry_len]`, the stream's next bytes.
    carry: Box<[u8; CARRY]>,
    carry_at: usize,
    carry_len: usize,
    /// The read that filled the carry got less than it asked for: the
    /// socket has nothing more, so once the carry is handed out the
    /// stream's turn ends (as after any short read).
    carry_short: bool,
    /// The stripe being read: message, next position, end position.
    cur: Option<(u64, u64, u64)>,
    /// Last message whose stripe this socket finished.
    done: Option<u64>,
    /// Clean EOF between stripes.
    eof: bool,
}

pub(super) struct TcpReceiver {
    shared: Arc<Shared>,
    peer: usize,
    ch: Channel,
    nstripes: u16,
    streams: Vec<Stream>,
    /// The FIFO is `buf[base..base + cap]`, 64-aligned in memory.
    buf: Vec<u8>,
    base: usize,
    cap: u64,
    msgs: VecDeque<Msg>,
    next_seq: u64,
    next_start: u64,
    /// Consumer's stream position.
    rpos: u64,
    last_peek: usize,
    peeked_empty: bool,
    bytes: u64,
    failed: Option<Error>,
    /// Where the current message lands (`recv_into`): its sequence number
    /// once its header is known, and the caller's buffer.
    land: Option<(Option<u64>, Region)>,
    /// Bytes of the landing message in place at the last look.
    landed: u64,
}

impl Stream {
    /// Moves carried bytes into the header being read, as far as it goes.
    fn header_from_carry(&mut self) {
        let (from, to) = (self.carry_at, self.hdr_got);
        let k = self.carry_len.min(HEADER_LEN - to);
        self.hdr[to..to + k].copy_from_slice(&self.carry[from..from + k]);
        self.hdr_got += k;
        self.skip_carry(k);
    }

    /// Drops the first `n` carried bytes (handed out).
    fn skip_carry(&mut self, n: usize) {
        self.carry_at += n;
        self.carry_len -= n;
    }
}

fn align64(x: u64) -> u64 {
    x.div_ceil(64) * 64
}

enum Step {
    Moved,
    /// Read less than asked: the socket has nothing more for now.
    Drained,
    Blocked,
}

impl TcpReceiver {
    pub(super) fn new(shared: Arc<Shared>, peer: usize, ch: Channel) -> TcpReceiver {
        let cap = shared.opts.buffer as u64;
        let (buf, base) = aligned_buffer(shared.opts.buffer);
        TcpReceiver {
            buf,
            base,
            shared,
            peer,
            ch,
            nstripes: 0,
            streams: Vec::new(),
            cap,
            msgs: VecDeque::new(),
            next_seq: 0,
            next_start: 0,
            rpos: 0,
            last_peek: 0,
            peeked_empty: false,
            bytes: 0,
            failed: None,
            land: None,
            landed: 0,
        }
    }

    fn remote(&self, i: usize, what: impl std::fmt::Display) -> Error {
        Error::Remote(format!(
            "rank {} (at rank {}, channel {}, stream {i}): {what}",
            self.peer, self.shared.me, self.ch
        ))
    }

    fn closed(&self, i: usize, detail: &str) -> Error {
        self.shared.lost(self.peer, self.ch, i, detail)
    }

    /// Filled bytes of stripe `i` of message `m` (message offsets).
    fn filled(&self, m: &Msg, i: usize) -> u64 {
        let r = stripe_range(m.len, self.nstripes, i as u16);
        let s = &self.streams[i];
        if r.is_empty() || s.done.is_some_and(|d| d >= m.seq) {
            return r.end - r.start;
        }
        match s.cur {
            Some((seq, pos, _)) if seq == m.seq => pos - (m.start + r.start),
            _ => 0,
        }
    }

    /// Reads a header on socket `i`; Blocked when nothing more can be read
    /// now. Completes the header into the stream's `cur` when it matches.
    fn read_header(&mut self, i: usize) -> Result<Step> {
        let s = &mut self.streams[i];
        if s.hdr_got < HEADER_LEN {
            if i == 0 && self.msgs.len() >= MAX_MSGS {
                return Ok(Step::Blocked);
            }
            s.header_from_carry();
        }
        if s.hdr_got < HEADER_LEN {
            // The carry is empty: the header's rest and what follows.
            let mut iov = [IoSliceMut::new(&mut s.hdr[s.hdr_got..]), IoSliceMut::new(&mut s.carry[..])];
            let r = match &mut s.open {
                Some(o) => o.read_vectored(&s.sock, &mut iov),
                None => (&*s.sock).read_vectored(&mut iov),
            };
            match r {
                Ok(0) if s.hdr_got == 0 => {
                    s.eof = true;
                    return Ok(Step::Blocked);
                }
                Ok(0) => {
                    let got = s.hdr_got;
                    return Err(self.closed(i, &format!(" inside a message header ({got} of {HEADER_LEN} bytes)")));
                }
                Ok(n) => {
                    let h = n.min(HEADER_LEN - s.hdr_got);
                    s.carry_short = n < h + CARRY || h < HEADER_LEN - s.hdr_got;
                    s.hdr_got += h;
                    (s.carry_at, s.carry_len) = (0, n - h);
                }
                Err(e) => return self.io_err(i, e),
            }
            if self.streams[i].hdr_got < HEADER_LEN {
                return Ok(Step::Moved);
            }
        }
        let h = Header::decode(&self.streams[i].hdr, self.nstripes, i as u16).map_err(|e| self.remote(i, e))?;
        let (seq, start) = if i == 0 {
            h.check_seq(self.next_seq).map_err(|e| self.remote(i, e))?;
            let start = self.next_start;
            if self.msgs.is_empty()
                && let Some((None, dst)) = self.land
            {
                if dst.len() as u64 != h.msg_len {
                    return Err(Error::InvalidUsage(format!(
                        "rank {} (at rank {}, channel {}, stream {i}): {}",
                        self.peer,
                        self.shared.me,
                        self.ch,
                        crate::wrong_length(h.msg_len, dst.len())
                    )));
                }
                self.land = Some((Some(h.seq), dst));
            }
            self.msgs.push_back(Msg { seq: h.seq, start, len: h.msg_len, tag: h.tag });
            self.next_seq += 1;
            self.next_start = align64(start + h.msg_len);
            (h.seq, start)
        } else {
            match self.next_on(i) {
                Some(m) => {
                    h.check_seq(m.seq).map_err(|e| self.remote(i, e))?;
                    if h.msg_len != m.len {
                        return Err(self.remote(
                            i,
                            format!("message {} is {} bytes on stream 0 but {} here", m.seq, m.len, h.msg_len),
                        ));
                    }
                    (m.seq, m.start)
                }
                None if h.seq < self.next_seq => {
                    return Err(self.remote(i, format!("message {} has no bytes on this stream or repeats", h.seq)));
                }
                None => return Ok(Step::Blocked), // wait for stream 0's header
            }
        };
        let r = stripe_range(h.msg_len, self.nstripes, i as u16);
        let s = &mut self.streams[i];
        s.hdr_got = 0;
        if r.is_empty() {
            s.done = Some(seq);
        } else {
            s.cur = Some((seq, start + r.start, start + r.end));
        }
        Ok(Step::Moved)
    }

    fn io_err(&self, i: usize, e: std::io::Error) -> Result<Step> {
        match e.kind() {
            ErrorKind::WouldBlock => Ok(Step::Blocked),
            ErrorKind::Interrupted => Ok(Step::Moved),
            _ => Err(self.closed(i, &format!(": {e}"))),
        }
    }

    /// One read on socket `i`: the rest of its stripe (into the FIFO, or
    /// where the message lands) and the next header after it.
    fn step(&mut self, i: usize) -> Result<Step> {
        if self.streams[i].eof {
            return Ok(Step::Blocked);
        }
        let Some((seq, pos, end)) = self.streams[i].cur else {
            return self.read_header(i);
        };
        let landing = match &self.land {
            Some((Some(s), dst)) if *s == seq => Some(*dst),
            _ => None,
        };
        let limit = if landing.is_some() { end } else { end.min(self.rpos + self.cap) };
        if pos >= limit {
            return Ok(Step::Blocked);
        }
        let want = (limit - pos) as usize;
        if self.streams[i].carry_len > 0 {
            return self.step_from_carry(i, (seq, pos, end), want, landing);
        }
        let s = &mut self.streams[i];
        let hdr_room = if limit == end && s.hdr_got == 0 { HEADER_LEN } else { 0 };
        let (sock, open) = (&s.sock, &mut s.open);
        let mut read = |buf: &mut [u8], hdr: &mut [u8]| {
            let mut iov = [IoSliceMut::new(buf), IoSliceMut::new(hdr)];
            match open {
                Some(o) => o.read_vectored(sock, &mut iov),
                None => (&**sock).read_vectored(&mut iov),
            }
        };
        let (r, n) = match landing {
            Some(dst) => {
                let start = self.msgs.iter().find(|m| m.seq == seq).map_or(0, |m| m.start);
                let at = (pos - start) as usize;
                let r = dst.sub(at, want)?.write(|b| read(b, &mut s.hdr[..hdr_room]))?;
                (r, want)
            }
            None => {
                let off = (pos % self.cap) as usize;
                let n = want.min(self.cap as usize - off);
                let off = self.base + off;
                let room = if n < want { 0 } else { hdr_room };
                (read(&mut self.buf[off..off + n], &mut s.hdr[..room]), n)
            }
        };
        match r {
            Ok(0) => {
                let left = end - pos;
                Err(self.closed(i, &format!(" in the middle of message {seq} ({left} bytes of its stripe missing)")))
            }
            Ok(k) => {
                let s = &mut self.streams[i];
                let (payload, extra) = (k.min(n), k.saturating_sub(n));
                let pos = pos + payload as u64;
                if pos == end {
                    s.cur = None;
                    s.done = Some(seq);
                    s.hdr_got += extra;
                } else {
                    s.cur = Some((seq, pos, end));
                }
                Ok(if k < n + hdr_room && payload < n { Step::Drained } else { Step::Moved })
            }
            Err(e) => self.io_err(i, e),
        }
    }

    /// [`step`](Self::step) from the bytes carried past a header: up to
    /// `want` of the stripe at `pos` (in the FIFO, or where the message
    /// lands).
    fn step_from_carry(
        &mut self,
        i: usize,
        (seq, pos, end): (u64, u64, u64),
        want: usize,
        landing: Option<Region>,
    ) -> Result<Step> {
        let n = match landing {
            Some(dst) => {
                let start = self.msgs.iter().find(|m| m.seq == seq).map_or(0, |m| m.start);
                let n = want.min(self.streams[i].carry_len);
                let s = &mut self.streams[i];
                let from = &s.carry[s.carry_at..s.carry_at + n];
                dst.sub((pos - start) as usize, n)?.write(|b| b.copy_from_slice(from))?;
                n
            }
            None => {
                let off = (pos % self.cap) as usize;
                let n = want.min(self.cap as usize - off).min(self.streams[i].carry_len);
                let at = self.base + off;
                let s = &self.streams[i];
                self.buf[at..at + n].copy_from_slice(&s.carry[s.carry_at..s.carry_at + n]);
                n
            }
        };
        let s = &mut self.streams[i];
        s.skip_carry(n);
        let pos = pos + n as u64;
        if pos == end {
            s.cur = None;
            s.done = Some(seq);
        } else {
            s.cur = Some((seq, pos, end));
        }
        // All the socket had is handed out when the carry is, unless the
        // carry holds more (the next header, read on the next step).
        Ok(if s.carry_len == 0 && s.carry_short { Step::Drained } else { Step::Moved })
    }

    /// Takes this connection's sockets once they have all arrived; false
    /// until then.
    fn attach(&mut self) -> bool {
        if self.streams.is_empty() {
            self.shared.poll();
            let Some(socks) = self.shared.take(self.peer, self.ch) else { return false };
            self.nstripes = socks.len() as u16;
            self.streams = socks
                .into_iter()
                .map(|(sock, open)| Stream {
                    sock,
                    open,
                    hdr: [0; HEADER_LEN],
                    hdr_got: 0,
                    carry: Box::new([0; CARRY]),
                    carry_at: 0,
                    carry_len: 0,
                    carry_short: false,
                    cur: None,
                    done: None,
                    eof: false,
                })
                .collect();
        }
        true
    }

    /// Reads stream 0 up to the end of the next message's header, no
    /// further (its payload may still land in place).
    fn read_next_header(&mut self) -> Result<()> {
        if !self.attach() {
            return Ok(());
        }
        while self.msgs.is_empty() && self.streams[0].cur.is_none() {
            if let Step::Blocked = self.step(0)? {
                break;
            }
        }
        Ok(())
    }

    fn pump(&mut self) -> Result<bool> {
        if !self.attach() {
            return Ok(false);
        }
        let mut moved = false;
        for _round in 0..4 {
            let mut any = false;
            for i in 0..self.streams.len() {
                if !self.wanted(i) {
                    continue;
                }
                for _ in 0..64 {
                    match self.step(i) {
                        Ok(Step::Moved) => any = true,
                        Ok(Step::Drained) => {
                            any = true;
                            break;
                        }
                        Ok(Step::Blocked) => break,
                        Err(e) => return Err(e),
                    }
                }
            }
            moved |= any;
            if !any {
                break;
            }
        }
        Ok(moved)
    }

    /// Whether socket `i` has anything to read that is known to be on its
    /// way: socket 0 always (it carries every header); another one while
    /// it is inside a header or stripe, or once socket 0 has announced a
    /// message with bytes on it. A small message has none beyond socket 0,
    /// so waiting for one costs one system call per pass, not one per
    /// socket.
    fn wanted(&self, i: usize) -> bool {
        let s = &self.streams[i];
        i == 0 || s.cur.is_some() || s.carry_len > 0 || s.hdr_got > 0 || self.next_on(i).is_some()
    }

    /// The first known message after socket `i`'s last one that has bytes
    /// on it.
    fn next_on(&self, i: usize) -> Option<&Msg> {
        let after = self.streams[i].done.map_or(0, |d| d + 1);
        self.msgs.iter().find(|m| m.seq >= after && !stripe_range(m.len, self.nstripes, i as u16).is_empty())
    }

    /// The error when nothing can arrive any more for the next byte.
    fn starved(&self) -> Option<Error> {
        if self.streams.is_empty() {
            return None;
        }
        let Some(m) = self.msgs.front() else {
            return self.streams[0].eof.then(|| self.closed(0, ""));
        };
        let off = self.rpos - m.start;
        let i = (0..self.streams.len()).find(|&i| {
            let r = stripe_range(m.len, self.nstripes, i as u16);
            r.end > off && r.start + self.filled(m, i) < r.end
        })?;
        let s = &self.streams[i];
        (s.eof && s.cur.is_none()).then(|| self.closed(i, &format!(" before message {} was complete", m.seq)))
    }
}

impl Receiver for TcpReceiver {
    fn peek(&mut self) -> Result<Option<Piece<'_>>> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        self.last_peek = 0;
        self.peeked_empty = false;
        let Some(m) = self.msgs.front() else {
            return match self.starved() {
                Some(e) => Err(e),
                None => Ok(None),
            };
        };
        if m.len == 0 {
            self.peeked_empty = true;
            return Ok(Some(Piece { msg_len: 0, offset: 0, data: &[], tag: m.tag }));
        }
        let off = self.rpos - m.start;
        // Contiguous arrived bytes of the message, stripe after stripe.
        let mut arrived = 0;
        for i in 0..self.streams.len() {
            let r = stripe_range(m.len, self.nstripes, i as u16);
            if r.is_empty() {
                break;
            }
            let f = self.filled(m, i);
            arrived = r.start + f;
            if r.start + f < r.end {
                break;
            }
        }
        if arrived < m.len {
            arrived &= !7;
        }
        if arrived <= off {
            let e = self.starved();
            return match e {
                Some(e) => {
                    self.failed = Some(e.clone());
                    Err(e)
                }
                None => Ok(None),
            };
        }
        let at = (self.rpos % self.cap) as usize;
        let n = ((arrived - off) as usize).min(self.cap as usize - at);
        let at = self.base + at;
        self.last_peek = n;
        let (msg_len, tag) = (m.len as usize, m.tag);
        Ok(Some(Piece { msg_len, offset: off as usize, data: &self.buf[at..at + n], tag }))
    }

    fn consume(&mut self, n: usize) -> Result<()> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if n > self.last_peek {
            return Err(Error::InvalidUsage(format!(
                "rank {} receiving from rank {} (channel {}): consume({n}) exceeds the {} bytes of the last peek",
                self.shared.me, self.peer, self.ch, self.last_peek
            )));
        }
        let Some(m) = self.msgs.front() else { return Ok(()) };
        if n == 0 {
            if m.len == 0 && self.peeked_empty {
                self.peeked_empty = false;
                self.msgs.pop_front();
            }
            return Ok(());
        }
        self.last_peek -= n;
        self.rpos += n as u64;
        self.bytes += n as u64;
        if self.rpos == m.start + m.len {
            self.rpos = align64(self.rpos);
            self.last_peek = 0;
            self.msgs.pop_front();
        }
        Ok(())
    }

    fn progress(&mut self) -> Result<bool> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let r = self.pump();
        if let Err(e) = &r {
            self.failed = Some(e.clone());
        }
        r
    }

    fn bytes(&self) -> u64 {
        self.bytes
    }

    fn next_tag(&mut self) -> Result<Option<u64>> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.msgs.is_empty()
            && let Err(e) = self.read_next_header()
        {
            self.failed = Some(e.clone());
            return Err(e);
        }
        match self.msgs.front() {
            Some(m) => Ok(Some(m.tag)),
            None => self.starved().map_or(Ok(None), Err),
        }
    }

    fn recv_into(&mut self, dst: &Region) -> Result<(bool, bool)> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.land.is_none() {
            match self.msgs.front() {
                Some(m) if m.len != dst.len() as u64 => {
                    return Err(Error::InvalidUsage(format!(
                        "rank {}: {}",
                        self.peer,
                        crate::wrong_length(m.len, dst.len())
                    )));
                }
                // Its bytes already started arriving in the FIFO: copy.
                Some(m) if self.rpos != m.start || (0..self.streams.len()).any(|i| self.filled(m, i) > 0) => {
                    return crate::recv_by_peek(self, dst);
                }
                Some(m) => self.land = Some((Some(m.seq), *dst)),
                None => self.land = Some((None, *dst)),
            }
            self.landed = 0;
        }
        self.progress()?;
        let Some((Some(seq), _)) = self.land else { return Ok((false, false)) };
        let m = self.msgs.front().filter(|m| m.seq == seq).expect("the landing message is the front one");
        let filled: u64 = (0..self.streams.len()).map(|i| self.filled(m, i)).sum();
        let moved = filled > self.landed;
        self.landed = filled;
        if filled < m.len {
            if let Some(e) = self.starved() {
                self.failed = Some(e.clone());
                return Err(e);
            }
            return Ok((moved, false));
        }
        self.rpos = align64(m.start + m.len);
        self.bytes += m.len;
        self.msgs.pop_front();
        self.land = None;
        self.last_peek = 0;
        Ok((true, true))
    }

    fn abandon(&mut self) {
        if self.land.take().is_some() {
            self.failed.get_or_insert_with(|| {
                Error::InvalidUsage(format!(
                    "rank {}: the connection from rank {} (channel {}) lost a message whose call failed",
                    self.shared.me, self.peer, self.ch
                ))
            });
        }
    }
}
