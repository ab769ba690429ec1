//! The bootstrap wire format: frames of `u32 payload length (LE), u8 tag,
//! payload`, and the encodings of the messages.

use std::io::{self, Read};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::PeerInfo;

/// First field of a hello: "OXBS".
pub(super) const MAGIC: u32 = 0x5342_584f;
/// Bootstrap protocol version (2: hellos carry a challenge and are
/// authenticated; 3: goodbyes count collectives, LEFT; 4: a keyed rank 0's
/// challenge also proves the id's base secret, and a rank may answer it
/// with DIFFERS).
pub(super) const VERSION: u16 = 4;
/// Largest frame accepted on an established connection.
pub(super) const MAX_FRAME: usize = 1 << 30;
/// Largest hello (a hostname, a boot id, a namespace name).
pub(super) const MAX_HELLO: usize = 16 << 10;
/// Largest table reply rank 0 may send (per rank: a host string and an
/// address).
pub(super) const MAX_TABLE: usize = 1 << 28;
/// Largest all-gather contribution of one rank.
pub(super) const MAX_CONTRIBUTION: usize = 64 << 20;
/// Frame header bytes.
pub(super) const HEADER: usize = 5;

/// Message tags.
pub(super) mod tag {
    /// rank k -> 0: who I am.
    pub const HELLO: u8 = 1;
    /// 0 -> rank k: your hello is refused (message).
    pub const REJECT: u8 = 2;
    /// 0 -> rank k: the peer table; init is done.
    pub const TABLE: u8 = 3;
    /// rank k -> 0: all-gather contribution (seq, bytes).
    pub const GATHER: u8 = 4;
    /// 0 -> rank k: all-gather result (seq, n parts).
    pub const RESULT: u8 = 5;
    /// 0 -> rank k: a failure elsewhere (message).
    pub const FAILURE: u8 = 6;
    /// rank k -> 0: this rank aborts (reason).
    pub const ABORT: u8 = 7;
    /// either way: clean shutdown follows; EOF after it is no failure
    /// (u64: the collectives the rank ran).
    pub const GOODBYE: u8 = 8;
    /// 0 -> rank k: rank 0's challenge and its proof of the secret over
    /// the rank's challenge.
    pub const CHALLENGE: u8 = 9;
    /// rank k -> 0: the rank's proof of the secret over rank 0's challenge
    /// and its hello.
    pub const PROOF: u8 = 10;
    /// either way, with `OXCCL_ENCRYPT=1`: a whole frame, encrypted (every
    /// frame after the proofs; see `super::Link`).
    pub const SEALED: u8 = 11;
    /// either way, every second: this rank's process runs (see
    /// `monitor`'s heartbeat).
    pub const HEARTBEAT: u8 = 12;
    /// 0 -> rank k: rank j (u32) said goodbye (closed its communicator)
    /// after its collective number n (u64).
    pub const LEFT: u8 = 13;
    /// rank k -> 0, instead of a proof: rank 0's challenge proved that it
    /// holds this communicator's id under another key (or none where the
    /// rank has one); the rank's proof, under the id's base secret, that
    /// it holds the id too.
    pub const DIFFERS: u8 = 14;
    /// A question for a rank's monitor: what it published under a key
    /// (query id, the rank asked (to 0) or the asking rank (from 0), key).
    pub const ASK: u8 = 15;
    /// The answer (query id, the asking rank (to 0) or the rank asked
    /// (from 0), found, what was published).
    pub const ANSWER: u8 = 16;
}

/// One whole frame (header and payload).
pub(super) fn frame(tag: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER + payload.len());
    v.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    v.push(tag);
    v.extend_from_slice(payload);
    v
}

/// The one frame `bytes` holds (an opened sealed frame).
pub(super) fn unframe(bytes: &[u8]) -> Result<(u8, Vec<u8>), String> {
    let mut b = FrameBuf::default();
    b.push(bytes);
    match b.next()? {
        Some(f) if b.buf.is_empty() => Ok(f),
        _ => Err(format!("a sealed frame of {} bytes that is not one frame", bytes.len())),
    }
}

/// Reads exactly one frame from a blocking stream, refusing lengths over
/// `max` before allocating.
pub(super) fn read_frame(r: &mut impl Read, max: usize) -> io::Result<(u8, Vec<u8>)> {
    let mut h = [0u8; HEADER];
    r.read_exact(&mut h)?;
    let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
    if len > max {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("frame of {len} bytes exceeds {max}")));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload)?;
    Ok((h[4], payload))
}

/// Bytes arriving on a non-blocking connection, cut into frames.
#[derive(Default)]
pub(super) struct FrameBuf {
    buf: Vec<u8>,
}

impl FrameBuf {
    /// Appends arrived bytes.
    pub(super) fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete frame, if any; an error for an oversized length.
    pub(super) fn next(&mut self) -> Result<Option<(u8, Vec<u8>)>, String> {
        if self.buf.len() < HEADER {
            return Ok(None);
        }
        let len = u32::from_le_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        if len > MAX_FRAME {
            return Err(format!("announced a frame of {len} bytes (limit {MAX_FRAME})"));
        }
        if self.buf.len() < HEADER + len {
            return Ok(None);
        }
        let tag = self.buf[4];
        let payload = self.buf[HEADER..HEADER + len].to_vec();
        self.buf.drain(..HEADER + len);
        Ok(Some((tag, payload)))
    }
}

/// Little-endian encoder.
#[derive(Default)]
pub(super) struct Enc(pub(super) Vec<u8>);

impl Enc {
    pub(super) fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(super) fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(super) fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(super) fn raw(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    /// Length-prefixed bytes.
    pub(super) fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.u32(b.len() as u32).raw(b)
    }
    pub(super) fn ip(&mut self, ip: IpAddr) -> &mut Self {
        match ip {
            IpAddr::V4(v4) => {
                self.0.push(4);
                let mut o = [0u8; 16];
                o[..4].copy_from_slice(&v4.octets());
                self.raw(&o)
            }
            IpAddr::V6(v6) => {
                self.0.push(6);
                self.raw(&v6.octets())
            }
        }
    }
}

/// Little-endian decoder over a payload; every read is bounds-checked.
pub(super) struct Dec<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Dec<'a> {
    pub(super) fn new(buf: &'a [u8]) -> Dec<'a> {
        Dec { buf, pos: 0 }
    }
    pub(super) fn raw(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.buf.len() - self.pos < n {
            return Err(format!("truncated: wanted {n} bytes at offset {} of {}", self.pos, self.buf.len()));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    pub(super) fn u8(&mut self) -> Result<u8, String> {
        Ok(self.raw(1)?[0])
    }
    pub(super) fn u16(&mut self) -> Result<u16, String> {
        let b = self.raw(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    pub(super) fn u32(&mut self) -> Result<u32, String> {
        let b = self.raw(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub(super) fn u64(&mut self) -> Result<u64, String> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.raw(8)?);
        Ok(u64::from_le_bytes(a))
    }
    /// Length-prefixed bytes (the length is checked against what is left
    /// before anything is copied).
    pub(super) fn bytes(&mut self) -> Result<&'a [u8], String> {
        let n = self.u32()? as usize;
        self.raw(n)
    }
    pub(super) fn string(&mut self) -> Result<String, String> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| "string is not UTF-8".to_string())
    }
    pub(super) fn ip(&mut self) -> Result<IpAddr, String> {
        let fam = self.u8()?;
        let o = self.raw(16)?;
        match fam {
            4 => Ok(IpAddr::V4(Ipv4Addr::new(o[0], o[1], o[2], o[3]))),
            6 => {
                let mut a = [0u8; 16];
                a.copy_from_slice(o);
                Ok(IpAddr::V6(Ipv6Addr::from(a)))
            }
            f => Err(format!("bad address family {f}")),
        }
    }
    pub(super) fn rest(&mut self) -> &'a [u8] {
        let s = &self.buf[self.pos..];
        self.pos = self.buf.len();
        s
    }
    pub(super) fn end(&self) -> Result<(), String> {
        if self.pos == self.buf.len() { Ok(()) } else { Err(format!("{} trailing bytes", self.buf.len() - self.pos)) }
    }
}

/// A rank's first message to rank 0.
#[derive(Clone, Debug)]
pub(super) struct Hello {
    pub(super) magic: u32,
    pub(super) version: u16,
    pub(super) nonce: [u8; 16],
    pub(super) rank: u32,
    pub(super) nranks: u32,
    pub(super) pid: u32,
    pub(super) host: String,
    /// The rank's challenge to rank 0.
    pub(super) challenge: [u8; crate::auth::CHALLENGE_LEN],
}

impl Hello {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut e = Enc::default();
        e.u32(self.magic).u16(self.version).raw(&self.nonce).u32(self.rank).u32(self.nranks).u32(self.pid);
        e.bytes(self.host.as_bytes()).raw(&self.challenge);
        frame(tag::HELLO, &e.0)
    }

    pub(super) fn decode(tag: u8, payload: &[u8]) -> Result<Hello, String> {
        if tag != tag::HELLO {
            return Err(format!("first frame has tag {tag}, not a hello"));
        }
        let mut d = Dec::new(payload);
        let magic = d.u32()?;
        if magic != MAGIC {
            return Err(format!("bad magic {magic:#010x}"));
        }
        let version = d.u16()?;
        let mut nonce = [0u8; 16];
        nonce.copy_from_slice(d.raw(16)?);
        let (rank, nranks, pid) = (d.u32()?, d.u32()?, d.u32()?);
        let host = d.string()?;
        let mut challenge = [0u8; crate::auth::CHALLENGE_LEN];
        challenge.copy_from_slice(d.raw(crate::auth::CHALLENGE_LEN)?);
        d.end()?;
        Ok(Hello { magic, version, nonce, rank, nranks, pid, host, challenge })
    }
}

pub(super) fn encode_table(peers: &[PeerInfo]) -> Vec<u8> {
    let mut e = Enc::default();
    e.u32(peers.len() as u32);
    for p in peers {
        e.u32(p.rank as u32).u32(p.pid).bytes(p.host.as_bytes()).ip(p.addr);
    }
    frame(tag::TABLE, &e.0)
}

pub(super) fn decode_table(payload: &[u8]) -> Result<Vec<PeerInfo>, String> {
    let mut d = Dec::new(payload);
    let n = d.u32()? as usize;
    // Each entry takes at least 29 bytes: bound n by the payload before
    // reserving.
    let mut peers = Vec::with_capacity(n.min(payload.len() / 29));
    for _ in 0..n {
        let rank = d.u32()? as usize;
        let pid = d.u32()?;
        let host = d.string()?;
        let addr = d.ip()?;
        peers.push(PeerInfo { rank, host, pid, addr });
    }
    d.end()?;
    Ok(peers)
}

pub(super) fn encode_result(seq: u64, parts: &[Vec<u8>]) -> Vec<u8> {
    let mut e = Enc::default();
    e.u64(seq).u32(parts.len() as u32);
    for p in parts {
        e.bytes(p);
    }
    frame(tag::RESULT, &e.0)
}

pub(super) fn decode_result(payload: &[u8], nranks: usize) -> Result<(u64, Vec<Vec<u8>>), String> {
    let mut d = Dec::new(payload);
    let seq = d.u64()?;
    let n = d.u32()? as usize;
    if n != nranks {
        return Err(format!("all-gather result has {n} parts, expected {nranks}"));
    }
    let mut parts = Vec::with_capacity(n);
    for _ in 0..n {
        parts.push(d.bytes()?.to_vec());
    }
    d.end()?;
    Ok((seq, parts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framebuf_cuts_frames_and_rejects_huge_lengths() {
        let mut fb = FrameBuf::default();
        let f = frame(tag::GATHER, b"abc");
        fb.push(&f[..4]);
        assert_eq!(fb.next().unwrap(), None);
        fb.push(&f[4..]);
        fb.push(&frame(tag::GOODBYE, b""));
        assert_eq!(fb.next().unwrap(), Some((tag::GATHER, b"abc".to_vec())));
        assert_eq!(fb.next().unwrap(), Some((tag::GOODBYE, vec![])));
        assert_eq!(fb.next().unwrap(), None);
        fb.push(&[0xff, 0xff, 0xff, 0xff, 1]);
        assert!(fb.next().is_err());
    }

    #[test]
    fn table_and_result_round_trip() {
        let peers = vec![
            PeerInfo { rank: 0, host: "a".into(), pid: 1, addr: "10.0.0.1".parse().unwrap() },
            PeerInfo { rank: 1, host: "b".into(), pid: 2, addr: "fd00::1".parse().unwrap() },
        ];
        let f = encode_table(&peers);
        assert_eq!(decode_table(&f[HEADER..]).unwrap(), peers);
        let r = encode_result(9, &[b"x".to_vec(), vec![]]);
        assert_eq!(decode_result(&r[HEADER..], 2).unwrap(), (9, vec![b"x".to_vec(), vec![]]));
        assert!(decode_result(&r[HEADER..], 3).is_err());
        assert!(decode_result(&r[HEADER..r.len() - 1], 2).is_err());
        let mut bad = r[HEADER..].to_vec();
        bad[12] = 0xff; // first part's length
        assert!(decode_result(&bad, 2).is_err());
    }
}
