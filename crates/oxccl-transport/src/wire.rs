//! The bytes oxccl puts on TCP sockets.
//!
//! A connection from rank `s` to rank `r` on channel `c` is `n` sockets
//! (streams). Each socket starts with a [`Handshake`] sent by the connecting
//! side (fixed 64-byte layout, FNV-1a checksum). Then each message `k` of
//! length `L` is split into `n` contiguous stripes ([`stripe_range`]); stripe
//! `i` travels on socket `i` as a [`Header`] (32 bytes) followed by the
//! stripe's bytes. Stripe 0 always carries a header (so a 0-byte message is
//! a bare header); other stripes only when they are not empty.
//!
//! Every field is checked before it is used: a length is bounded by
//! [`MAX_MSG`] and must equal the length the stripe rule gives, so nothing
//! is allocated from a length field; a sequence number names the message,
//! so a skipped or repeated message is caught; truncation is caught by the
//! reader (EOF inside a header or a stripe).
//!
//! All integers are little-endian.

use crate::{Channel, Error, Result};
use std::ops::Range;

/// First bytes of every handshake: a connection without them is not from
/// an oxccl peer.
pub const MAGIC: [u8; 8] = *b"OXCCLTCP";
/// Protocol version; bumped whenever the layout or the stripe rule change.
pub const VERSION: u32 = 1;
/// Size of an encoded [`Handshake`].
pub const HANDSHAKE_LEN: usize = 64;
/// First bytes of every message header (`"OXMH"`).
pub const HEADER_MAGIC: u32 = u32::from_le_bytes(*b"OXMH");
/// Size of an encoded [`Header`].
pub const HEADER_LEN: usize = 40;
/// Longest message accepted from the wire (1 TiB).
pub const MAX_MSG: u64 = 1 << 40;
/// Most sockets per connection.
pub const MAX_STREAMS: u16 = 64;
/// Stripes are whole numbers of blocks of this size (except the last).
pub const BLOCK: u64 = 64;
/// Smallest stripe: a message shorter than this goes on one socket.
pub const MIN_STRIPE: u64 = 32 << 10;

/// FNV-1a, 64 bits: catches corruption of the fixed layouts.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The little-endian integers at byte `at` of `b` (every fixed-layout
/// record of this crate reads its fields with these).
pub(crate) fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// The bytes of message of `msg_len` bytes that stripe `stripe` of
/// `nstripes` carries: contiguous, each a whole number of [`BLOCK`]s except
/// the last non-empty one, at least [`MIN_STRIPE`] bytes unless it is the
/// last; trailing stripes may be empty. `nstripes` 0 is treated as 1.
pub fn stripe_range(msg_len: u64, nstripes: u16, stripe: u16) -> Range<u64> {
    let n = u64::from(nstripes.max(1));
    let blocks = msg_len.div_ceil(BLOCK);
    let per = blocks.div_ceil(n).max(MIN_STRIPE / BLOCK) * BLOCK;
    let i = u64::from(stripe);
    let start = i.saturating_mul(per).min(msg_len);
    let end = (i + 1).saturating_mul(per).min(msg_len);
    start..end
}

/// What the accepting rank expects of a handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expect {
    /// The communicator's nonce.
    pub nonce: [u8; 16],
    /// The accepting rank.
    pub receiver: usize,
    /// Ranks in the communicator.
    pub nranks: usize,
}

/// First bytes on every socket, sent by the connecting side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handshake {
    /// The communicator's nonce (from its unique id).
    pub nonce: [u8; 16],
    /// The connecting (sending) rank.
    pub sender: u32,
    /// The rank the connection is for.
    pub receiver: u32,
    /// The connection's channel.
    pub channel: Channel,
    /// Which stripe this socket carries.
    pub stripe: u16,
    /// How many sockets the connection has.
    pub nstripes: u16,
}

impl Handshake {
    /// The 64-byte wire form: magic, version, reserved, nonce, sender,
    /// receiver, channel, stripe, nstripes, reserved, checksum.
    pub fn encode(&self) -> [u8; HANDSHAKE_LEN] {
        let mut b = [0u8; HANDSHAKE_LEN];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[16..32].copy_from_slice(&self.nonce);
        b[32..36].copy_from_slice(&self.sender.to_le_bytes());
        b[36..40].copy_from_slice(&self.receiver.to_le_bytes());
        b[40..44].copy_from_slice(&self.channel.to_le_bytes());
        b[44..46].copy_from_slice(&self.stripe.to_le_bytes());
        b[46..48].copy_from_slice(&self.nstripes.to_le_bytes());
        let sum = fnv1a(&b[..56]);
        b[56..64].copy_from_slice(&sum.to_le_bytes());
        b
    }

    /// Parses and checks a handshake: an [`Error::Remote`] saying what is
    /// wrong (not an oxccl peer, another protocol version, corrupted,
    /// another job's nonce, meant for another rank, bad sender or stripe).
    pub fn decode(b: &[u8], expect: &Expect) -> Result<Handshake> {
        if b.len() < HANDSHAKE_LEN {
            return Err(Error::Remote(format!("handshake truncated: {} of {HANDSHAKE_LEN} bytes", b.len())));
        }
        if b[0..8] != MAGIC {
            return Err(Error::Remote(format!(
                "not an oxccl peer: handshake starts with {:02x?}, expected {MAGIC:02x?} (\"OXCCLTCP\")",
                &b[0..8]
            )));
        }
        let version = u32_at(b, 8);
        if version != VERSION {
            return Err(Error::Remote(format!(
                "protocol version {version}, this build speaks {VERSION}: run the same oxccl on every rank"
            )));
        }
        let sum = u64_at(b, 56);
        if sum != fnv1a(&b[..56]) || b[12..16] != [0; 4] || b[48..56] != [0; 8] {
            return Err(Error::Remote("handshake checksum mismatch: corrupted on the way".into()));
        }
        let mut nonce = [0u8; 16];
        nonce.copy_from_slice(&b[16..32]);
        let h = Handshake {
            nonce,
            sender: u32_at(b, 32),
            receiver: u32_at(b, 36),
            channel: u32_at(b, 40),
            stripe: u16_at(b, 44),
            nstripes: u16_at(b, 46),
        };
        if h.nonce != expect.nonce {
            return Err(Error::Remote(
                "handshake nonce differs from this communicator's: a peer of another job or communicator".into(),
            ));
        }
        if h.receiver as usize != expect.receiver {
            return Err(Error::Remote(format!(
                "handshake for rank {} arrived at rank {}: mixed-up peer addresses",
                h.receiver, expect.receiver
            )));
        }
        if h.sender as usize >= expect.nranks {
            return Err(Error::Remote(format!(
                "handshake from rank {}, but the communicator has {} ranks",
                h.sender, expect.nranks
            )));
        }
        if h.nstripes == 0 || h.nstripes > MAX_STREAMS || h.stripe >= h.nstripes {
            return Err(Error::Remote(format!(
                "handshake from rank {}: bad stripe {} of {} (1..={MAX_STREAMS} streams)",
                h.sender, h.stripe, h.nstripes
            )));
        }
        Ok(h)
    }
}

/// Precedes each stripe of each message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The message's sequence number on the connection (0, 1, ...).
    pub seq: u64,
    /// Length of the whole message.
    pub msg_len: u64,
    /// Bytes of this stripe that follow the header.
    pub stripe_len: u64,
    /// The message's tag ([`crate::Sender`]), the same on every stripe.
    pub tag: u64,
}

impl Header {
    /// The header of stripe `stripe` of `nstripes` of message `seq`
    /// (untagged).
    pub fn new(seq: u64, msg_len: u64, nstripes: u16, stripe: u16) -> Header {
        let r = stripe_range(msg_len, nstripes, stripe);
        Header { seq, msg_len, stripe_len: r.end - r.start, tag: 0 }
    }

    /// This header with tag `tag`.
    pub fn tagged(self, tag: u64) -> Header {
        Header { tag, ..self }
    }

    /// The 40-byte wire form: magic, checksum (low 32 bits of FNV-1a over
    /// the rest), seq, msg_len, stripe_len, tag.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&HEADER_MAGIC.to_le_bytes());
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.msg_len.to_le_bytes());
        b[24..32].copy_from_slice(&self.stripe_len.to_le_bytes());
        b[32..40].copy_from_slice(&self.tag.to_le_bytes());
        let sum = fnv1a(&b[8..]) as u32;
        b[4..8].copy_from_slice(&sum.to_le_bytes());
        b
    }

    /// Parses the header read from socket `stripe` of `nstripes` and checks
    /// it: magic, checksum, length bounds and that the stripe length is the
    /// one the stripe rule gives (and non-empty on stripes other than 0).
    /// The sequence number is checked by the reader, which knows which
    /// message it expects ([`Header::check_seq`]).
    pub fn decode(b: &[u8], nstripes: u16, stripe: u16) -> Result<Header> {
        if b.len() < HEADER_LEN {
            return Err(Error::Remote(format!("message header truncated: {} of {HEADER_LEN} bytes", b.len())));
        }
        let magic = u32_at(b, 0);
        if magic != HEADER_MAGIC {
            return Err(Error::Remote(format!(
                "message header magic {magic:#010x}, expected {HEADER_MAGIC:#010x}: stream out of step or not oxccl"
            )));
        }
        if u32_at(b, 4) != fnv1a(&b[8..HEADER_LEN]) as u32 {
            return Err(Error::Remote("message header checksum mismatch: corrupted on the way".into()));
        }
        let h = Header { seq: u64_at(b, 8), msg_len: u64_at(b, 16), stripe_len: u64_at(b, 24), tag: u64_at(b, 32) };
        if h.msg_len > MAX_MSG {
            return Err(Error::Remote(format!(
                "message {} of {} bytes exceeds the limit of {MAX_MSG} bytes",
                h.seq, h.msg_len
            )));
        }
        if nstripes == 0 || nstripes > MAX_STREAMS || stripe >= nstripes {
            return Err(Error::Remote(format!("bad stripe {stripe} of {nstripes}")));
        }
        let want = stripe_range(h.msg_len, nstripes, stripe);
        let want = want.end - want.start;
        if h.stripe_len != want || (stripe != 0 && want == 0) {
            return Err(Error::Remote(format!(
                "message {}: stripe {stripe} of {nstripes} claims {} bytes, a {}-byte message has {want} there",
                h.seq, h.stripe_len, h.msg_len
            )));
        }
        Ok(h)
    }

    /// An error unless this is message `want`: names a skipped (`seq >
    /// want`) or repeated (`seq < want`) message.
    pub fn check_seq(&self, want: u64) -> Result<()> {
        match self.seq.cmp(&want) {
            std::cmp::Ordering::Equal => Ok(()),
            std::cmp::Ordering::Greater => Err(Error::Remote(format!(
                "message {} arrived where message {want} was expected: messages skipped",
                self.seq
            ))),
            std::cmp::Ordering::Less => Err(Error::Remote(format!(
                "message {} arrived again where message {want} was expected: repeated or reordered",
                self.seq
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const E: Expect = Expect { nonce: [7; 16], receiver: 2, nranks: 4 };

    fn hs() -> Handshake {
        Handshake { nonce: [7; 16], sender: 1, receiver: 2, channel: 5, stripe: 1, nstripes: 2 }
    }

    #[test]
    fn handshake_roundtrip_and_errors() {
        assert_eq!(Handshake::decode(&hs().encode(), &E).unwrap(), hs());
        let mut b = hs().encode();
        b[0] = b'X';
        assert!(Handshake::decode(&b, &E).unwrap_err().to_string().contains("not an oxccl peer"));
        let other = Handshake { nonce: [8; 16], ..hs() };
        assert!(Handshake::decode(&other.encode(), &E).unwrap_err().to_string().contains("nonce"));
        let other = Handshake { receiver: 3, ..hs() };
        assert!(Handshake::decode(&other.encode(), &E).unwrap_err().to_string().contains("for rank 3"));
        let other = Handshake { sender: 4, ..hs() };
        assert!(Handshake::decode(&other.encode(), &E).unwrap_err().to_string().contains("4 ranks"));
        let other = Handshake { stripe: 2, ..hs() };
        assert!(Handshake::decode(&other.encode(), &E).unwrap_err().to_string().contains("bad stripe"));
        let mut b = hs().encode();
        b[33] ^= 1;
        assert!(Handshake::decode(&b, &E).unwrap_err().to_string().contains("checksum"));
        assert!(Handshake::decode(&b[..10], &E).unwrap_err().to_string().contains("truncated"));
    }

    #[test]
    fn stripes_cover_the_message() {
        for len in [0u64, 1, 63, 64, 65, MIN_STRIPE - 1, MIN_STRIPE * 3 + 17, 10 << 20, MAX_MSG] {
            for n in [1u16, 2, 3, 4, 64] {
                let mut at = 0;
                for i in 0..n {
                    let r = stripe_range(len, n, i);
                    assert_eq!(r.start, at, "len {len} n {n} i {i}");
                    if r.end < len {
                        assert_eq!((r.end - r.start) % BLOCK, 0);
                    }
                    at = r.end;
                }
                assert_eq!(at, len);
            }
        }
    }

    #[test]
    fn header_checks() {
        let h = Header::new(9, 100_000, 4, 1);
        assert_eq!(Header::decode(&h.encode(), 4, 1).unwrap(), h);
        assert!(Header::decode(&h.encode(), 4, 3).is_err(), "stripe 3 is shorter");
        assert!(Header::decode(&Header { stripe_len: 5, ..h }.encode(), 4, 1).is_err());
        assert!(Header::decode(&Header::new(0, MAX_MSG + 1, 1, 0).encode(), 1, 0).is_err());
        assert!(Header::decode(&Header::new(0, 10, 2, 1).encode(), 2, 1).is_err(), "empty stripe 1 has no header");
        assert!(h.check_seq(9).is_ok());
        assert!(h.check_seq(8).unwrap_err().to_string().contains("skipped"));
        assert!(h.check_seq(10).unwrap_err().to_string().contains("repeated"));
        let mut b = h.encode();
        b[20] ^= 0x10;
        assert!(Header::decode(&b, 4, 1).unwrap_err().to_string().contains("checksum"));
    }
}
