//! Connection setup over the side channel: a TCP socket from the rank that
//! sends to the rank that receives, authenticated with the communicator's
//! secret, carrying the QP numbers, PSNs and the ring's address and rkey;
//! then INIT→RTR→RTS on both sides. The socket stays open for the
//! connection's life: its end tells the other side at once that the peer
//! is gone (RC retries alone take `timeout × retry_cnt`, ~30 s).

use super::buf::Buf;
use super::conn::{CREDIT_RECVS, Link, RECV_DEPTH, RdmaReceiver, RdmaSender, SQ_DEPTH, Who};
use super::env::IbOptions;
use super::verbs::{Access, Connect, Device, Gid, GidEntry, LinkLayer, PortInfo, Qp, QpCaps};
use crate::wire::{u32_at, u64_at};
use crate::{Channel, Error, Result};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

const MAGIC: &[u8; 8] = b"OXRDMA01";
const LABEL: &[u8] = b"oxccl-rdma";
/// Longest a setup message may be.
const MAX_FRAME: usize = 64 << 10;

/// What one rank publishes through the bootstrap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Card {
    pub side: SocketAddr,
    pub lid: u16,
    pub gid: Gid,
    pub gid_index: u8,
    pub ethernet: bool,
    pub mtu: u8,
    pub dev: String,
    pub port: u8,
}

impl Card {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(64);
        let ip = match self.side.ip() {
            IpAddr::V4(v) => v.to_ipv6_mapped(),
            IpAddr::V6(v) => v,
        };
        b.extend_from_slice(&ip.octets());
        b.extend_from_slice(&self.side.port().to_le_bytes());
        b.extend_from_slice(&self.lid.to_le_bytes());
        b.extend_from_slice(&self.gid);
        b.extend_from_slice(&[self.gid_index, self.ethernet as u8, self.mtu, self.port]);
        b.extend_from_slice(self.dev.as_bytes());
        b
    }

    pub(crate) fn decode(b: &[u8], from: usize) -> Result<Card> {
        if b.len() < 40 {
            return Err(Error::Remote(format!("rank {from} published a malformed RDMA address ({} bytes)", b.len())));
        }
        let mut ip = [0u8; 16];
        ip.copy_from_slice(&b[..16]);
        let ip6 = std::net::Ipv6Addr::from(ip);
        let ip = ip6.to_ipv4_mapped().map_or(IpAddr::V6(ip6), IpAddr::V4);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[20..36]);
        Ok(Card {
            side: SocketAddr::new(ip, u16::from_le_bytes([b[16], b[17]])),
            lid: u16::from_le_bytes([b[18], b[19]]),
            gid,
            gid_index: b[36],
            ethernet: b[37] == 1,
            mtu: b[38],
            port: b[39],
            dev: String::from_utf8_lossy(&b[40..]).into_owned(),
        })
    }
}

/// This rank's HCA, port and settings, shared by setup on both sides.
pub(crate) struct Local {
    pub rank: usize,
    pub dev: Arc<dyn Device>,
    pub port: PortInfo,
    pub gid: GidEntry,
    pub opts: IbOptions,
    pub secret: crate::auth::Secret,
    pub cap: usize,
    pub chunk: usize,
    pub timeout: Duration,
    pub faults: Faults,
}

/// This rank's RDMA endpoint: its HCA and settings, and the cards of the
/// peers it serves (set once the bootstrap has exchanged them); what
/// connecting and accepting need.
pub(crate) struct Endpoint {
    pub local: Local,
    pub cards: OnceLock<Vec<Option<Card>>>,
}

impl Endpoint {
    /// `peer`'s card; an error if this rank does not serve it.
    pub(crate) fn card(&self, peer: usize) -> Result<&Card> {
        self.cards.get().and_then(|c| c.get(peer)).and_then(Option::as_ref).ok_or_else(|| {
            Error::Internal(format!("rank {}: RDMA with rank {peer}, which it does not serve", self.local.rank))
        })
    }
}

/// Faults tests inject (`OXCCL_IB_INJECT`; never set it otherwise).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// `rkey:<bytes>`: senders write with a wrong rkey after that many bytes.
    pub bad_rkey_after: Option<u64>,
    /// `rnr`: receivers stop reposting receives.
    pub starve: bool,
    /// `cq:<entries>`: completion queues of this depth.
    pub cq_depth: Option<u32>,
}

impl Faults {
    /// Parses a value of `OXCCL_IB_INJECT` (`None` or blank: no faults);
    /// an error names the variable, the value and what it accepts.
    pub fn parse(v: Option<&str>) -> Result<Faults> {
        let mut f = Faults::default();
        let Some(v) = v.map(str::trim).filter(|v| !v.is_empty()) else { return Ok(f) };
        let bad = || Error::invalid(format!("OXCCL_IB_INJECT={v:?}: expected rkey:<bytes>, rnr or cq:<entries>"));
        match v.split_once(':') {
            Some(("rkey", n)) => f.bad_rkey_after = Some(n.parse().map_err(|_| bad())?),
            Some(("cq", n)) => f.cq_depth = Some(n.parse().map_err(|_| bad())?),
            None if v == "rnr" => f.starve = true,
            _ => return Err(bad()),
        }
        Ok(f)
    }
}

impl Local {
    /// What this rank publishes, with its side channel at `side`.
    pub(crate) fn card(&self, side: SocketAddr) -> Card {
        Card {
            side,
            lid: self.port.lid,
            gid: self.gid.gid,
            gid_index: self.gid.index,
            ethernet: self.port.link_layer == LinkLayer::Ethernet,
            mtu: self.port.active_mtu,
            dev: self.dev.name().to_string(),
            port: self.port.num,
        }
    }

    fn who(&self, peer: usize, ch: Channel) -> Who {
        let secs = super::verbs::ack_timeout_secs(self.opts.timeout);
        Who {
            rank: self.rank,
            peer,
            ch,
            dev: self.dev.name().to_string(),
            port: self.port.num,
            timeout: format!(
                "{} retries of the {:.2} s ACK timeout (OXCCL_IB_TIMEOUT={}, OXCCL_IB_RETRY_CNT={})",
                self.opts.retry_cnt + 1,
                secs,
                self.opts.timeout,
                self.opts.retry_cnt
            ),
        }
    }

    /// A CQ and `n` QPs (receive queues of `recvs`).
    fn queues(&self, n: usize, recvs: u32) -> Result<Queues> {
        let depth = self.faults.cq_depth.unwrap_or(n as u32 * (recvs + SQ_DEPTH) + 64);
        let cq = self.dev.create_cq(depth)?;
        let caps = QpCaps { max_send_wr: SQ_DEPTH, max_recv_wr: recvs.max(1), max_inline: 0 };
        let qps = (0..n).map(|_| self.dev.create_qp(&cq, caps, self.port.num)).collect::<Result<Vec<_>>>()?;
        Ok((cq, qps))
    }

    /// The attributes to connect to `peer`'s QP.
    fn attrs(&self, peer: &Card, remote_qpn: u32, remote_psn: u32, local_psn: u32) -> Connect {
        Connect {
            remote_qpn,
            remote_psn,
            local_psn,
            remote_lid: peer.lid,
            remote_gid: peer.gid,
            use_gid: self.port.link_layer == LinkLayer::Ethernet || self.opts.gid_index.is_some(),
            gid_index: self.gid.index,
            mtu: self.port.active_mtu.min(peer.mtu),
            timeout: self.opts.timeout,
            retry_cnt: self.opts.retry_cnt,
            rnr_retry: self.opts.rnr_retry,
            min_rnr_timer: 12,
            sl: self.opts.sl,
            traffic_class: self.opts.tc,
            max_rd_atomic: 16,
        }
    }
}

/// A completion queue and the QPs that complete on it.
type Queues = (Arc<dyn super::verbs::Cq>, Vec<Box<dyn Qp>>);

fn psn() -> u32 {
    let mut b = [0u8; 4];
    let _ = getrandom::fill(&mut b);
    u32::from_le_bytes(b) & 0xff_ffff
}

fn send_frame(s: &mut TcpStream, b: &[u8]) -> Result<()> {
    let mut v = (b.len() as u32).to_le_bytes().to_vec();
    v.extend_from_slice(b);
    s.write_all(&v).map_err(|e| Error::Remote(format!("RDMA side channel: {e}")))
}

fn recv_frame(s: &mut TcpStream) -> Result<Vec<u8>> {
    let mut l = [0u8; 4];
    s.read_exact(&mut l).map_err(|e| Error::Remote(format!("RDMA side channel: {e}")))?;
    let n = u32::from_le_bytes(l) as usize;
    if n > MAX_FRAME {
        return Err(Error::Remote(format!("RDMA side channel: a frame of {n} bytes")));
    }
    let mut b = vec![0u8; n];
    s.read_exact(&mut b).map_err(|e| Error::Remote(format!("RDMA side channel: {e}")))?;
    Ok(b)
}

/// A request: from, to, channel, kind (0: data, 1: one-sided), QPs.
struct Request {
    from: u32,
    to: u32,
    ch: Channel,
    one_sided: bool,
    cap: u64,
    chunk: u64,
    qpns: Vec<(u32, u32)>,
}

impl Request {
    fn encode(&self) -> Vec<u8> {
        let mut b = MAGIC.to_vec();
        for v in [self.from, self.to, self.ch, self.one_sided as u32, self.qpns.len() as u32] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&self.cap.to_le_bytes());
        b.extend_from_slice(&self.chunk.to_le_bytes());
        for (q, p) in &self.qpns {
            b.extend_from_slice(&q.to_le_bytes());
            b.extend_from_slice(&p.to_le_bytes());
        }
        b
    }

    fn decode(b: &[u8]) -> Result<Request> {
        let bad = || Error::Remote("RDMA side channel: a malformed connection request".into());
        if b.len() < 44 || &b[..8] != MAGIC {
            return Err(bad());
        }
        let n = u32_at(b, 24) as usize;
        if n == 0 || n > 64 || b.len() != 44 + 8 * n {
            return Err(bad());
        }
        Ok(Request {
            from: u32_at(b, 8),
            to: u32_at(b, 12),
            ch: u32_at(b, 16),
            one_sided: u32_at(b, 20) == 1,
            cap: u64_at(b, 28),
            chunk: u64_at(b, 36),
            qpns: (0..n).map(|i| (u32_at(b, 44 + 8 * i), u32_at(b, 48 + 8 * i))).collect(),
        })
    }
}

/// What the accepting side built for a request.
pub(crate) enum Accepted {
    Data(usize, Channel, Box<RdmaReceiver>),
    OneSided(Link),
}

/// The connecting side: opens a data connection (`Some(ch)`) or a
/// one-sided link (`None`) to `peer`.
pub(crate) fn connect(ep: &Endpoint, peer: usize, ch: Option<Channel>) -> Result<Conn> {
    let (l, card) = (&ep.local, ep.card(peer)?);
    let q = if ch.is_some() { l.opts.qps_per_connection as usize } else { 1 };
    let ctx = |e: Error| {
        Error::Remote(format!(
            "rank {}: setting up an RDMA connection to rank {peer} ({} port {} at {}): {e}",
            l.rank, card.dev, card.port, card.side
        ))
    };
    let mut s = TcpStream::connect_timeout(&card.side, l.timeout.min(Duration::from_secs(30)))
        .map_err(|e| ctx(Error::Remote(format!("cannot reach its side channel: {e}"))))?;
    let _ = s.set_nodelay(true);
    s.set_read_timeout(Some(l.timeout.min(Duration::from_secs(60)))).map_err(|e| ctx(Error::System(e.to_string())))?;
    let challenge = recv_frame(&mut s).map_err(ctx)?;
    let (cq, mut qps) = l.queues(q, if ch.is_some() { CREDIT_RECVS } else { 1 }).map_err(ctx)?;
    let psns: Vec<u32> = (0..q).map(|_| psn()).collect();
    let req = Request {
        from: l.rank as u32,
        to: peer as u32,
        ch: ch.unwrap_or(u32::MAX),
        one_sided: ch.is_none(),
        cap: l.cap as u64,
        chunk: l.chunk as u64,
        qpns: qps.iter().zip(&psns).map(|(qp, &p)| (qp.qpn(), p)).collect(),
    };
    let body = req.encode();
    let proof = crate::auth::prove(&l.secret, &[LABEL, &challenge, &body]);
    let mut msg = body;
    msg.extend_from_slice(&proof);
    // The staging FIFO and credit receives exist before the peer can write.
    let staging = match ch {
        Some(_) => Some(Buf::new(&l.dev, l.cap, Access::LOCAL).map_err(ctx)?),
        None => None,
    };
    send_frame(&mut s, &msg).map_err(ctx)?;
    let reply = recv_frame(&mut s).map_err(ctx)?;
    if reply.first() != Some(&0) {
        return Err(ctx(Error::Remote(format!(
            "it refused: {}",
            String::from_utf8_lossy(reply.get(1..).unwrap_or(&[]))
        ))));
    }
    if reply.len() != 13 + 8 * q {
        return Err(ctx(Error::Remote("a malformed reply".into())));
    }
    let (raddr, rkey) = (u64_at(&reply, 1), u32_at(&reply, 9));
    for (i, qp) in qps.iter_mut().enumerate() {
        let a = l.attrs(card, u32_at(&reply, 13 + 8 * i), u32_at(&reply, 17 + 8 * i), psns[i]);
        qp.connect(&a).map_err(ctx)?;
    }
    let who = l.who(peer, ch.unwrap_or(crate::CONTROL_CHANNEL));
    let link = Link::new(qps, cq, s, who)?;
    Ok(match (ch, staging) {
        (Some(_), Some(buf)) => {
            Conn::Data(Box::new(RdmaSender::new(link, buf, (l.cap, l.chunk), (raddr, rkey), l.faults.bad_rkey_after)?))
        }
        _ => Conn::OneSided(link),
    })
}

/// What [`connect`] made.
pub(crate) enum Conn {
    Data(Box<RdmaSender>),
    OneSided(Link),
}

/// The accepting side of one side-channel socket.
pub(crate) fn accept(ep: &Endpoint, mut s: TcpStream) -> Result<Accepted> {
    let l = &ep.local;
    s.set_nonblocking(false).map_err(|e| Error::System(e.to_string()))?;
    let _ = s.set_nodelay(true);
    s.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| Error::System(e.to_string()))?;
    let challenge = crate::auth::challenge();
    send_frame(&mut s, &challenge)?;
    let msg = recv_frame(&mut s)?;
    if msg.len() < crate::auth::PROOF_LEN {
        return Err(Error::Remote("RDMA side channel: a short request".into()));
    }
    let (body, proof) = msg.split_at(msg.len() - crate::auth::PROOF_LEN);
    if !crate::auth::verify(&l.secret, &[LABEL, &challenge, body], proof) {
        return Err(Error::Remote("RDMA side channel: a request without this communicator's proof".into()));
    }
    let req = Request::decode(body)?;
    let from = req.from as usize;
    let refuse = |s: &mut TcpStream, why: String| -> Error {
        let mut r = vec![1u8];
        r.extend_from_slice(why.as_bytes());
        let _ = send_frame(s, &r);
        Error::Remote(why)
    };
    if req.to as usize != l.rank || ep.card(from).is_err() {
        return Err(refuse(
            &mut s,
            format!("rank {} got a request meant for rank {} from rank {from}", l.rank, req.to),
        ));
    }
    if !req.one_sided && (req.cap != l.cap as u64 || req.chunk != l.chunk as u64) {
        return Err(refuse(
            &mut s,
            format!(
                "ranks {from} and {} differ in OXCCL_BUFFSIZE or OXCCL_IB_CHUNK ({}/{} against {}/{})",
                l.rank, req.cap, req.chunk, l.cap, l.chunk
            ),
        ));
    }
    if !req.one_sided && !crate::valid_channel(req.ch) {
        return Err(refuse(&mut s, format!("rank {from} asked for channel {}", req.ch)));
    }
    let card = ep.card(from)?;
    let q = req.qpns.len();
    let built = (|| -> Result<_> {
        let (cq, mut qps) = l.queues(q, if req.one_sided { 1 } else { RECV_DEPTH })?;
        let ring = if req.one_sided { None } else { Some(Buf::new(&l.dev, l.cap, Access::REMOTE_WRITE)?) };
        let psns: Vec<u32> = (0..q).map(|_| psn()).collect();
        for (i, qp) in qps.iter_mut().enumerate() {
            qp.connect(&l.attrs(card, req.qpns[i].0, req.qpns[i].1, psns[i]))?;
        }
        Ok((cq, qps, ring, psns))
    })();
    let (cq, qps, ring, psns) = match built {
        Ok(b) => b,
        Err(e) => return Err(refuse(&mut s, format!("rank {}: {e}", l.rank))),
    };
    let mut reply = vec![0u8];
    reply.extend_from_slice(&ring.as_ref().map_or(0, |r| r.addr()).to_le_bytes());
    reply.extend_from_slice(&ring.as_ref().map_or(0, |r| r.mr.rkey).to_le_bytes());
    for (qp, p) in qps.iter().zip(&psns) {
        reply.extend_from_slice(&qp.qpn().to_le_bytes());
        reply.extend_from_slice(&p.to_le_bytes());
    }
    let ch = if req.one_sided { crate::CONTROL_CHANNEL } else { req.ch };
    let link = Link::new(qps, cq, s.try_clone().map_err(|e| Error::System(e.to_string()))?, l.who(from, ch))?;
    let out = match ring {
        // Receives are posted (in RdmaReceiver::new) before the reply.
        Some(ring) => {
            Accepted::Data(from, req.ch, Box::new(RdmaReceiver::new(link, ring, l.cap, l.chunk, l.faults.starve)?))
        }
        None => Accepted::OneSided(link),
    };
    // Small enough for an empty socket buffer, though the link made the
    // socket non-blocking.
    send_frame(&mut s, &reply)?;
    Ok(out)
}
