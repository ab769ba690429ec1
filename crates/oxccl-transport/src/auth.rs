//! Proof of membership: every bootstrap and data connection proves that
//! its end knows the communicator's secret (32 bytes in the
//! [`UniqueId`](crate::id::UniqueId), never sent on any socket) by
//! challenge and response: HMAC-SHA-256 (the `hmac` and `sha2` crates) of
//! a fresh random challenge of the other end, bound to what the
//! connection claims (ranks, channel, stripe). A stranger who knows the
//! rendezvous address and the nonce (both travel in clear) can neither
//! join, nor replay a peer's proof (the challenge is new each time), nor
//! impersonate rank 0 to a joining rank.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// Bytes of a challenge.
pub const CHALLENGE_LEN: usize = 16;
/// Bytes of a proof.
pub const PROOF_LEN: usize = 32;

/// A communicator's secret.
pub type Secret = [u8; 32];

/// A fresh random challenge.
pub fn challenge() -> [u8; CHALLENGE_LEN] {
    let mut c = [0u8; CHALLENGE_LEN];
    // The OS's generator failing is not something to continue from.
    getrandom::fill(&mut c).expect("the OS random number generator failed");
    c
}

/// The proof of `secret` over `parts` (a domain label first, so a proof
/// made for one purpose never serves another).
pub fn prove(secret: &Secret, parts: &[&[u8]]) -> [u8; PROOF_LEN] {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes any key length");
    for p in parts {
        m.update(&(p.len() as u64).to_le_bytes());
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

/// Whether `proof` is the proof of `secret` over `parts` (compared in
/// constant time).
pub fn verify(secret: &Secret, parts: &[&[u8]], proof: &[u8]) -> bool {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes any key length");
    for p in parts {
        m.update(&(p.len() as u64).to_le_bytes());
        m.update(p);
    }
    m.verify_slice(proof).is_ok()
}

/// A secret derived from key material (a passphrase, a key file's bytes,
/// or, without either, what every rank of a launch knows).
pub fn derive(label: &str, material: &[u8]) -> Secret {
    let mut h = Sha256::new();
    h.update(b"oxccl-secret\0");
    h.update(label.as_bytes());
    h.update([0]);
    h.update(material);
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// A proof verifies only with the same secret, parts and bytes:
        /// forged (another secret), replayed (another challenge),
        /// truncated or flipped proofs all fail.
        #[test]
        fn proofs_bind_secret_challenge_and_claims(
            secret in any::<[u8; 32]>(),
            other in any::<[u8; 32]>(),
            ch in any::<[u8; 16]>(),
            ch2 in any::<[u8; 16]>(),
            claim in proptest::collection::vec(any::<u8>(), 0..80),
            cut in 0usize..32,
            flip in 0usize..256,
        ) {
            let p = prove(&secret, &[b"label", &ch, &claim]);
            prop_assert!(verify(&secret, &[b"label", &ch, &claim], &p));
            if other != secret {
                prop_assert!(!verify(&other, &[b"label", &ch, &claim], &p));
            }
            if ch2 != ch {
                prop_assert!(!verify(&secret, &[b"label", &ch2, &claim], &p), "a replay under a new challenge");
            }
            prop_assert!(!verify(&secret, &[b"other", &ch, &claim], &p), "another purpose");
            prop_assert!(!verify(&secret, &[b"label", &ch, &claim], &p[..cut]), "truncated");
            let mut bad = p;
            bad[flip / 8] ^= 1 << (flip % 8);
            prop_assert!(!verify(&secret, &[b"label", &ch, &claim], &bad), "a flipped bit");
            // Parts are length-prefixed: moving a byte across a boundary
            // changes the proof.
            if !claim.is_empty() {
                let mut ch3 = ch.to_vec();
                ch3.push(claim[0]);
                prop_assert!(!verify(&secret, &[b"label", &ch3, &claim[1..]], &p));
            }
        }
    }
}
