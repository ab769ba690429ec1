//! The bootstrap under `OXCCL_ENCRYPT=1`: after the proofs, every frame
//! either way travels as one [`crate::seal`] record inside a
//! [`tag::SEALED`] frame, under keys salted with the rank's fresh
//! challenge and bound to the communicator's nonce, the rank and the
//! direction. Rank 0 sends the peer table sealed already, so a rank that
//! does not encrypt (or does, against rank 0) finds out at once and says
//! so; such a rank's report to rank 0 is the one frame taken in clear
//! from an encrypted connection (an abort notice).

use super::frame::{self, tag};
use crate::seal::{Opener, Sealer};
use std::io::{self, Write};
use std::net::TcpStream;

/// One end's keys of a connection between rank 0 and `rank`.
pub(super) struct Keys {
    pub seal: Sealer,
    pub open: Opener,
}

impl Keys {
    /// The keys of rank `rank`'s connection, whose hello carried
    /// `challenge`, at rank 0's end (`root`) or at the rank's.
    pub fn new(id: &crate::id::UniqueId, rank: usize, challenge: &[u8], root: bool) -> Keys {
        let (secret, nonce) = (id.secret(), id.nonce());
        let r = (rank as u32).to_le_bytes();
        let k = |dir: &[u8]| crate::seal::key(&secret, challenge, &[b"oxccl-boot-seal-v1", dir, &nonce, &r]);
        let (down, up) = (k(b"down"), k(b"up"));
        if root {
            Keys { seal: Sealer::new(&down), open: Opener::new(&up) }
        } else {
            Keys { seal: Sealer::new(&up), open: Opener::new(&down) }
        }
    }
}

/// `frame` sealed into a [`tag::SEALED`] frame.
pub(super) fn seal(s: &mut Sealer, frame: &[u8]) -> io::Result<Vec<u8>> {
    let mut rec = frame.to_vec();
    s.seal(&mut rec, 0)?;
    Ok(frame::frame(tag::SEALED, &rec))
}

/// The frame a [`tag::SEALED`] frame's payload holds.
pub(super) fn open(o: &mut Opener, payload: &mut [u8]) -> Result<(u8, Vec<u8>), String> {
    let plain = o.open(payload).map_err(|e| e.to_string())?;
    frame::unframe(plain)
}

/// The writing end of a bootstrap connection.
pub(super) struct Writer {
    pub stream: TcpStream,
    pub seal: Option<Sealer>,
}

impl Writer {
    /// Writes one whole frame (sealed where this connection is).
    pub fn write_frame(&mut self, f: &[u8]) -> io::Result<()> {
        match &mut self.seal {
            Some(s) => {
                let sealed = seal(s, f)?;
                self.stream.write_all(&sealed)
            }
            None => self.stream.write_all(f),
        }
    }
}

/// What a frame `t` arriving on a connection that does (`open`) or does
/// not encrypt turns into: the frame to handle, or why it is refused.
pub(super) fn receive(open: Option<&mut Opener>, t: u8, mut payload: Vec<u8>) -> Result<(u8, Vec<u8>), String> {
    match (open, t) {
        (Some(o), tag::SEALED) => self::open(o, &mut payload),
        (Some(_), tag::ABORT) => Ok((t, payload)),
        (Some(_), t) => Err(format!("sent frame tag {t} in clear on an encrypted bootstrap connection")),
        (None, tag::SEALED) => {
            Err("sent an encrypted frame (OXCCL_ENCRYPT=1) but this rank does not encrypt; set OXCCL_ENCRYPT the \
                 same on every rank"
                .into())
        }
        (None, t) => Ok((t, payload)),
    }
}
