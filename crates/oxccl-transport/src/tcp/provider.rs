//! The TCP provider as the fabric sees it: a [`Tcp`] listener per rank whose
//! address travels through the bootstrap. One-sided access is emulated by
//! the fabric's control plane (requests and answers on a connection of
//! their own), so TCP offers no [`Direct`](crate::provider::Direct).

use super::{Tcp, TcpOptions};
use crate::bootstrap::PeerInfo;
use crate::futex::Doorbell;
use crate::provider::{Factory, LinkCost, LinkParams, Provider, Setup, Wake};
use crate::{Channel, Error, Kind, Receiver, Result, Sender};

/// Makes [`TcpProvider`]s: anything reachable.
pub struct TcpFactory {
    /// The provider's settings (`connect_timeout` is capped by the
    /// fabric's set-up deadline).
    pub opts: TcpOptions,
}

impl Factory for TcpFactory {
    fn kind(&self) -> Kind {
        Kind::Tcp
    }
    fn reaches(&self, _me: &PeerInfo, _peer: &PeerInfo) -> bool {
        true
    }
    fn open(&self, setup: &Setup<'_>) -> Result<Box<dyn Provider>> {
        if !setup.serves_any() {
            return Ok(Box::new(TcpProvider { tcp: None }));
        }
        let ip = match &self.opts.ifname {
            Some(name) => crate::id::interface_ip(Some(name))?,
            None => setup.boot.local_ip(),
        };
        let topts = TcpOptions { connect_timeout: self.opts.connect_timeout.min(setup.timeout), ..self.opts.clone() };
        Ok(Box::new(TcpProvider {
            tcp: Some(Tcp::new(setup.rank, setup.nranks(), setup.nonce, setup.boot.secret(), ip, topts)?),
        }))
    }
}

/// One rank's side of the TCP provider (`None` inside when it serves no
/// peer).
pub struct TcpProvider {
    tcp: Option<Tcp>,
}

impl TcpProvider {
    fn tcp(&self) -> Result<&Tcp> {
        self.tcp.as_ref().ok_or_else(|| Error::Internal("TCP traffic with a peer TCP does not serve".into()))
    }
}

impl Provider for TcpProvider {
    fn kind(&self) -> Kind {
        Kind::Tcp
    }
    fn link(&self) -> LinkParams {
        // Loopback on the 2-core development VM (compare-peers); one-sided
        // access is a request and an answer through the sockets.
        LinkParams {
            fifo: LinkCost { bw: 1.5e9, lat: 40e-6 },
            one_sided: LinkCost { bw: 1.2e9, lat: 80e-6 },
            native: false,
        }
    }
    fn publish(&self) -> Vec<u8> {
        self.tcp.as_ref().map(|t| t.addr().to_string().into_bytes()).unwrap_or_default()
    }
    fn connect(&mut self, _setup: &Setup<'_>, published: &[Vec<u8>], _bell: &Doorbell) -> Result<()> {
        let Some(t) = &self.tcp else { return Ok(()) };
        let mut list = Vec::with_capacity(published.len());
        for (p, a) in published.iter().enumerate() {
            let text = String::from_utf8_lossy(a).to_string();
            // Ranks without TCP peers publish nothing; nobody connects to
            // them over TCP, so any placeholder does.
            let sa = if text.is_empty() {
                t.addr()
            } else {
                text.parse().map_err(|_| Error::Remote(format!("rank {p} published a bad address {text:?}")))?
            };
            list.push(sa);
        }
        t.set_peer_addrs(list)
    }
    fn sender(&mut self, peer: usize, ch: Channel) -> Result<Box<dyn Sender>> {
        self.tcp()?.sender(peer, ch)
    }
    fn receiver(&mut self, peer: usize, ch: Channel) -> Result<Box<dyn Receiver>> {
        self.tcp()?.receiver(peer, ch)
    }
    fn needs_progress(&self) -> bool {
        self.tcp.is_some()
    }
    fn progress(&mut self) -> Result<bool> {
        match &self.tcp {
            Some(t) => t.progress(),
            None => Ok(false),
        }
    }
    fn wake(&self) -> Wake {
        Wake { rings_bell: false, fds: self.tcp.as_ref().map(Tcp::poll_fds).unwrap_or_default() }
    }
    fn close(&mut self) {
        if let Some(t) = &self.tcp {
            t.close();
        }
    }
}
