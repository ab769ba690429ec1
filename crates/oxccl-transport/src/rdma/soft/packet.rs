//! The soft HCA's packets: what one QP sends its peer, over TCP or within
//! the process.

use crate::wire::{u32_at, u64_at};
use crate::{Error, Result};
use std::io::{Read, Write};

/// Bytes of a packet header on TCP.
pub const HEADER: usize = 32;

/// Why a responder refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Nak {
    /// No receive posted for a WRITE_WITH_IMM: retry later.
    Rnr,
    /// A bad rkey, bounds or rights: fatal for both QPs.
    RemAccess,
    /// A request the QP cannot serve (too long).
    RemInvReq,
}

/// One packet.
#[derive(Debug)]
pub enum Packet {
    /// RDMA WRITE (with an immediate if `imm`).
    Write { psn: u32, addr: u64, rkey: u32, imm: Option<u32>, data: Vec<u8> },
    /// RDMA READ request.
    ReadReq { psn: u32, addr: u64, rkey: u32, len: u32 },
    /// Everything up to `psn` is placed.
    Ack { psn: u32 },
    /// The data of the READ `psn` (acknowledges everything before it).
    ReadResp { psn: u32, data: Vec<u8> },
    /// The request `psn` was refused.
    Nak { psn: u32, why: Nak },
}

impl Packet {
    /// Writes it to `w` (one header, then the payload).
    pub fn write_to(&self, w: &mut impl Write) -> std::io::Result<()> {
        let mut h = [0u8; HEADER];
        let (kind, psn, addr, rkey, imm, len, data): (u8, u32, u64, u32, Option<u32>, u32, &[u8]) = match self {
            Packet::Write { psn, addr, rkey, imm, data } => (1, *psn, *addr, *rkey, *imm, data.len() as u32, data),
            Packet::ReadReq { psn, addr, rkey, len } => (2, *psn, *addr, *rkey, None, *len, &[]),
            Packet::Ack { psn } => (3, *psn, 0, 0, None, 0, &[]),
            Packet::ReadResp { psn, data } => (4, *psn, 0, 0, None, data.len() as u32, data),
            Packet::Nak { psn, why } => (5 + *why as u8, *psn, 0, 0, None, 0, &[]),
        };
        h[0] = kind;
        h[1] = imm.is_some() as u8;
        h[4..8].copy_from_slice(&psn.to_le_bytes());
        h[8..16].copy_from_slice(&addr.to_le_bytes());
        h[16..20].copy_from_slice(&rkey.to_le_bytes());
        h[20..24].copy_from_slice(&imm.unwrap_or(0).to_le_bytes());
        h[24..28].copy_from_slice(&len.to_le_bytes());
        w.write_all(&h)?;
        w.write_all(data)
    }

    /// Reads one packet from `r`; `Ok(None)` at a clean end of stream.
    pub fn read_from(r: &mut impl Read) -> Result<Option<Packet>> {
        let mut h = [0u8; HEADER];
        let mut got = 0;
        while got < HEADER {
            match r.read(&mut h[got..]) {
                Ok(0) if got == 0 => return Ok(None),
                Ok(0) => return Err(Error::Remote("soft HCA: the link closed inside a packet".into())),
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::Remote(format!("soft HCA: link: {e}"))),
            }
        }
        let psn = u32_at(&h, 4);
        let addr = u64_at(&h, 8);
        let rkey = u32_at(&h, 16);
        let imm = (h[1] == 1).then(|| u32_at(&h, 20));
        let len = u32_at(&h, 24);
        let mut payload = || -> Result<Vec<u8>> {
            let mut d = vec![0u8; len as usize];
            r.read_exact(&mut d).map_err(|e| Error::Remote(format!("soft HCA: link: {e}")))?;
            Ok(d)
        };
        Ok(Some(match h[0] {
            1 => Packet::Write { psn, addr, rkey, imm, data: payload()? },
            2 => Packet::ReadReq { psn, addr, rkey, len },
            3 => Packet::Ack { psn },
            4 => Packet::ReadResp { psn, data: payload()? },
            5 => Packet::Nak { psn, why: Nak::Rnr },
            6 => Packet::Nak { psn, why: Nak::RemAccess },
            7 => Packet::Nak { psn, why: Nak::RemInvReq },
            k => return Err(Error::Remote(format!("soft HCA: unknown packet kind {k}"))),
        }))
    }
}

/// PSNs are 24 bits.
pub const PSN_MASK: u32 = 0xff_ffff;

/// `a` comes before `b` in 24-bit PSN order.
pub fn psn_before(a: u32, b: u32) -> bool {
    let d = b.wrapping_sub(a) & PSN_MASK;
    d != 0 && d < (1 << 23)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_round_trip() {
        let ps = vec![
            Packet::Write { psn: 7, addr: 0x1000, rkey: 9, imm: Some(3), data: vec![1, 2, 3] },
            Packet::Write { psn: 8, addr: 0x1000, rkey: 9, imm: None, data: vec![] },
            Packet::ReadReq { psn: 9, addr: 5, rkey: 6, len: 77 },
            Packet::Ack { psn: 10 },
            Packet::ReadResp { psn: 11, data: vec![4; 10] },
            Packet::Nak { psn: 12, why: Nak::RemAccess },
        ];
        let mut buf = Vec::new();
        for p in &ps {
            p.write_to(&mut buf).unwrap();
        }
        let mut r = &buf[..];
        for p in &ps {
            let q = Packet::read_from(&mut r).unwrap().unwrap();
            assert_eq!(format!("{p:?}"), format!("{q:?}"));
        }
        assert!(Packet::read_from(&mut r).unwrap().is_none());
        assert!(Packet::read_from(&mut &buf[..5]).is_err());
        assert!(psn_before(PSN_MASK, 0) && psn_before(1, 2) && !psn_before(2, 2) && !psn_before(3, 2));
    }
}
