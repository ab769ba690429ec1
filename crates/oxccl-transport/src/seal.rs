//! Authenticated encryption of oxccl's own TCP traffic (`OXCCL_ENCRYPT=1`):
//! AES-256-GCM (`ring`) records under keys derived with HKDF-SHA-256 from
//! the communicator's secret, a fresh challenge of the connection and what
//! the connection is (so every connection and direction has its own key),
//! and the record's number on the connection as nonce. What a record does
//! not authenticate (altered, replayed, reordered, cut, or sealed under
//! another key) is an error; nothing of it is used.
//!
//! The framing is the caller's: TCP data sockets put records in a stream
//! of their own (`tcp::seal`), the bootstrap one record per frame.

use hkdf::Hkdf;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use sha2::Sha256;
use std::io::{self, ErrorKind};

/// Bytes of a record's authentication tag.
pub const TAG: usize = 16;

/// The key for `info` (what the connection and direction are), salted with
/// a fresh challenge of the connection.
pub fn key(secret: &crate::auth::Secret, salt: &[u8], info: &[&[u8]]) -> [u8; 32] {
    let hk = Hkdf::<Sha256>::new(Some(salt), secret);
    let mut k = [0u8; 32];
    hk.expand_multi_info(info, &mut k).expect("32 bytes is a valid HKDF length");
    k
}

/// Record `n`'s nonce (each key serves one direction of one connection, so
/// a count never repeats under it).
fn nonce(n: u64) -> Nonce {
    let mut b = [0u8; 12];
    b[4..].copy_from_slice(&n.to_le_bytes());
    Nonce::assume_unique_for_key(b)
}

fn cipher(key: &[u8; 32]) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).expect("a 32-byte AES-256 key"))
}

/// Seals one direction's records, in order.
pub struct Sealer {
    cipher: LessSafeKey,
    records: u64,
}

impl Sealer {
    /// A sealer under `key`.
    pub fn new(key: &[u8; 32]) -> Sealer {
        Sealer { cipher: cipher(key), records: 0 }
    }

    /// Encrypts `buf[from..]` in place and appends its tag: the next record.
    pub fn seal(&mut self, buf: &mut Vec<u8>, from: usize) -> io::Result<()> {
        let tag = self
            .cipher
            .seal_in_place_separate_tag(nonce(self.records), Aad::empty(), &mut buf[from..])
            .map_err(|_| io::Error::other("sealing a record failed"))?;
        self.records += 1;
        buf.extend_from_slice(tag.as_ref());
        Ok(())
    }
}

/// Opens one direction's records, in order.
pub struct Opener {
    cipher: LessSafeKey,
    records: u64,
}

impl Opener {
    /// An opener under `key`.
    pub fn new(key: &[u8; 32]) -> Opener {
        Opener { cipher: cipher(key), records: 0 }
    }

    /// Decrypts the next record (ciphertext and tag) in place: its
    /// plaintext, or an error if it does not authenticate.
    pub fn open<'a>(&mut self, record: &'a mut [u8]) -> io::Result<&'a [u8]> {
        let n = self.records;
        let plain = self.cipher.open_in_place(nonce(n), Aad::empty(), record).map_err(|_| {
            io::Error::new(
                ErrorKind::InvalidData,
                format!(
                    "encrypted record {n} does not authenticate (altered, replayed or cut on the way, or the peer's \
                     key differs: is OXCCL_ENCRYPT the same on every rank?)"
                ),
            )
        })?;
        self.records += 1;
        Ok(plain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_open_in_order_under_their_key_only() {
        let k = key(&[1; 32], b"salt", &[b"a"]);
        let (mut s, mut o) = (Sealer::new(&k), Opener::new(&k));
        let mut recs = Vec::new();
        for m in [&b"first"[..], b"second", b""] {
            let mut b = m.to_vec();
            s.seal(&mut b, 0).unwrap();
            assert_eq!(b.len(), m.len() + TAG);
            recs.push(b);
        }
        // Out of order: the second record where the first is due.
        let mut second = recs[1].clone();
        assert!(Opener::new(&k).open(&mut second).is_err());
        for (r, m) in recs.iter_mut().zip([&b"first"[..], b"second", b""]) {
            assert_eq!(o.open(r).unwrap(), m);
        }
        // Another key (another salt or info): nothing opens.
        for other in [key(&[1; 32], b"salt2", &[b"a"]), key(&[1; 32], b"salt", &[b"b"])] {
            let mut b = b"x".to_vec();
            Sealer::new(&k).seal(&mut b, 0).unwrap();
            assert!(Opener::new(&other).open(&mut b).is_err());
        }
    }
}
