//! Encrypted TCP data streams (`OXCCL_ENCRYPT=1`, see [`crate::seal`]):
//! after a data socket's handshake and proof (which stay in clear), every
//! byte the sender writes goes in records:
//!
//! ```text
//! u32 length of what follows (LE) | ciphertext | 16-byte tag
//! ```
//!
//! at most [`RECORD`] bytes of plaintext each, under a key salted with the
//! accepting side's fresh challenge and bound to the handshake (ranks,
//! channel, stripe): every socket has its own.
//!
//! Both ends keep non-blocking semantics: a sender's bytes are taken once
//! sealed into its outgoing buffer (flushed as the socket allows; the
//! stream is not flushed before that buffer is empty), a receiver reads
//! what has been opened and reads the socket for more only when that is
//! used up.

use crate::seal::{self as core, TAG};
use socket2::Socket;
use std::io::{self, ErrorKind, IoSlice, IoSliceMut, Read};

/// Most plaintext bytes in one record.
pub(super) const RECORD: usize = 64 << 10;
const LEN: usize = 4;

/// The key of the data socket whose handshake is `hello` and whose
/// accepting side sent `challenge`.
pub(super) fn key(secret: &crate::auth::Secret, challenge: &[u8], hello: &[u8]) -> [u8; 32] {
    core::key(secret, challenge, &[b"oxccl-tcp-seal-v1", hello])
}

/// The sending end of an encrypted socket.
pub(super) struct Sealer {
    records: core::Sealer,
    /// Sealed records not yet on the wire: `out[sent..]`.
    out: Vec<u8>,
    sent: usize,
}

impl Sealer {
    pub fn new(key: &[u8; 32]) -> Sealer {
        Sealer { records: core::Sealer::new(key), out: Vec::new(), sent: 0 }
    }

    /// Whether every sealed byte is on the wire.
    pub fn idle(&self) -> bool {
        self.sent == self.out.len()
    }

    /// Writes what is sealed and waiting; true once nothing is left.
    pub fn flush(&mut self, sock: &Socket) -> io::Result<bool> {
        while self.sent < self.out.len() {
            match sock.send_with_flags(&self.out[self.sent..], libc::MSG_NOSIGNAL) {
                Ok(0) => return Err(io::Error::new(ErrorKind::WriteZero, "the socket took nothing")),
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.out.clear();
        self.sent = 0;
        Ok(true)
    }

    /// Seals up to one record of `iov`'s bytes once the previous records
    /// are on the wire, and starts writing it: the plaintext bytes taken
    /// (`WouldBlock` while earlier records still wait).
    pub fn send(&mut self, sock: &Socket, iov: &[IoSlice<'_>]) -> io::Result<usize> {
        if !self.flush(sock)? {
            return Err(ErrorKind::WouldBlock.into());
        }
        let rec = &mut self.out;
        rec.clear();
        rec.extend_from_slice(&[0; LEN]);
        for s in iov {
            let n = s.len().min(LEN + RECORD - rec.len());
            rec.extend_from_slice(&s[..n]);
            if rec.len() == LEN + RECORD {
                break;
            }
        }
        let taken = rec.len() - LEN;
        if taken == 0 {
            rec.clear();
            return Ok(0);
        }
        self.records.seal(rec, LEN)?;
        let body = (rec.len() - LEN) as u32;
        rec[..LEN].copy_from_slice(&body.to_le_bytes());
        self.sent = 0;
        self.flush(sock)?;
        Ok(taken)
    }
}

/// The receiving end of an encrypted socket.
pub(super) struct Opener {
    records: core::Opener,
    /// Bytes read from the socket, not yet a whole record.
    inbuf: Vec<u8>,
    /// Opened plaintext: `plain[taken..]` not yet read.
    plain: Vec<u8>,
    taken: usize,
}

impl Opener {
    pub fn new(key: &[u8; 32]) -> Opener {
        Opener { records: core::Opener::new(key), inbuf: Vec::new(), plain: Vec::new(), taken: 0 }
    }

    /// Opens every whole record in `inbuf` into `plain`.
    fn open(&mut self) -> io::Result<()> {
        let mut at = 0;
        while self.inbuf.len() - at >= LEN {
            let n = u32::from_le_bytes(self.inbuf[at..at + LEN].try_into().expect("4 bytes")) as usize;
            if !(TAG + 1..=TAG + RECORD).contains(&n) {
                return Err(io::Error::new(ErrorKind::InvalidData, format!("an encrypted record of {n} bytes")));
            }
            if self.inbuf.len() - at - LEN < n {
                break;
            }
            let plain = self.records.open(&mut self.inbuf[at + LEN..at + LEN + n])?;
            self.plain.extend_from_slice(plain);
            at += LEN + n;
        }
        self.inbuf.drain(..at);
        Ok(())
    }

    /// Like `read_vectored` on the socket, of the plaintext.
    pub fn read_vectored(&mut self, sock: &Socket, iov: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        let want: usize = iov.iter().map(|b| b.len()).sum();
        let mut got = 0;
        let mut chunk = [0u8; 64 << 10];
        loop {
            // Hand out what is open, then read the socket for more.
            got += self.copy_out(iov, got);
            if got == want {
                return Ok(got);
            }
            match (&*sock).read(&mut chunk) {
                Ok(0) if !self.inbuf.is_empty() => {
                    return Err(io::Error::new(ErrorKind::UnexpectedEof, "the connection ended inside a record"));
                }
                Ok(0) => return Ok(got),
                Ok(n) => {
                    self.inbuf.extend_from_slice(&chunk[..n]);
                    self.open()?;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if got > 0 && e.kind() == ErrorKind::WouldBlock => return Ok(got),
                Err(e) => return Err(e),
            }
        }
    }

    /// Copies open plaintext into `iov` from byte `skip` of it on; how much.
    fn copy_out(&mut self, iov: &mut [IoSliceMut<'_>], mut skip: usize) -> usize {
        let mut copied = 0;
        for b in iov.iter_mut() {
            if skip >= b.len() {
                skip -= b.len();
                continue;
            }
            let room = &mut b[skip..];
            skip = 0;
            let n = room.len().min(self.plain.len() - self.taken);
            room[..n].copy_from_slice(&self.plain[self.taken..self.taken + n]);
            self.taken += n;
            copied += n;
            if self.taken == self.plain.len() {
                self.plain.clear();
                self.taken = 0;
                break;
            }
        }
        copied
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use socket2::{Domain, Type};

    fn pair() -> (Socket, Socket) {
        let (a, b) = Socket::pair(Domain::UNIX, Type::STREAM, None).unwrap();
        a.set_nonblocking(true).unwrap();
        b.set_nonblocking(true).unwrap();
        (a, b)
    }

    /// Reads until `n` bytes (or an error).
    fn read_n(o: &mut Opener, s: &Socket, n: usize) -> io::Result<Vec<u8>> {
        let mut out = vec![0u8; n];
        let mut got = 0;
        for _ in 0..100_000 {
            match o.read_vectored(s, &mut [IoSliceMut::new(&mut out[got..])]) {
                Ok(0) if got < n => return Err(ErrorKind::UnexpectedEof.into()),
                Ok(k) => got += k,
                Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => return Err(e),
            }
            if got == n {
                return Ok(out);
            }
        }
        Err(ErrorKind::TimedOut.into())
    }

    #[test]
    fn records_round_trip_and_are_not_plaintext() {
        let (a, b) = pair();
        let k = key(&[7; 32], &[1; 16], b"hello");
        let (mut tx, mut rx) = (Sealer::new(&k), Opener::new(&k));
        let msg: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let mut sent = 0;
        let t = std::thread::scope(|sc| {
            let h = sc.spawn(|| read_n(&mut rx, &b, msg.len()));
            while sent < msg.len() || !tx.idle() {
                match tx.send(&a, &[IoSlice::new(&msg[sent..]), IoSlice::new(&[])]) {
                    Ok(n) => sent += n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::yield_now(),
                    Err(e) => panic!("{e}"),
                }
                if sent == msg.len() {
                    while !tx.flush(&a).unwrap() {}
                }
            }
            h.join().unwrap()
        });
        assert_eq!(t.unwrap(), msg);
        // Another key opens nothing.
        let (a, b) = pair();
        let mut tx = Sealer::new(&k);
        let mut wrong = Opener::new(&key(&[7; 32], &[2; 16], b"hello"));
        assert_eq!(tx.send(&a, &[IoSlice::new(b"secret bytes")]).unwrap(), 12);
        let e = read_n(&mut wrong, &b, 12).unwrap_err();
        assert!(e.to_string().contains("does not authenticate"), "{e}");
        // On the wire: no plaintext.
        let (a, b) = pair();
        let mut tx = Sealer::new(&k);
        tx.send(&a, &[IoSlice::new(b"a very recognisable plaintext")]).unwrap();
        let mut wire = [0u8; 256];
        let n = (&b).read(&mut wire).unwrap();
        assert!(!wire[..n].windows(10).any(|w| w == b"recognisab"), "plaintext on the wire");
    }

    #[test]
    fn an_altered_or_cut_record_is_an_error() {
        let k = key(&[3; 32], &[4; 16], b"h");
        let (a, b) = pair();
        let mut tx = Sealer::new(&k);
        tx.send(&a, &[IoSlice::new(&[5u8; 1000])]).unwrap();
        let mut wire = vec![0u8; 2000];
        let n = (&b).read(&mut wire).unwrap();
        for (what, bytes) in [
            ("flipped", {
                let mut w = wire[..n].to_vec();
                w[100] ^= 1;
                w
            }),
            ("cut", wire[..n - 1].to_vec()),
        ] {
            let (c, d) = pair();
            (&c).write_all_now(&bytes);
            drop(c);
            let e = read_n(&mut Opener::new(&k), &d, 1000).unwrap_err();
            assert!(matches!(e.kind(), ErrorKind::InvalidData | ErrorKind::UnexpectedEof), "{what}: {e}");
        }
    }

    trait WriteAllNow {
        fn write_all_now(self, b: &[u8]);
    }

    impl WriteAllNow for &Socket {
        fn write_all_now(self, b: &[u8]) {
            use std::io::Write;
            let mut s = self;
            s.write_all(b).unwrap();
        }
    }
}
