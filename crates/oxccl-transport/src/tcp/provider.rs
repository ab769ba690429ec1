//! The TCP provider as the fabric sees it: a [`Tcp`] listener per rank and
//! rail whose addresses travel through the bootstrap. One-sided access is
//! emulated by the fabric's control plane (requests and answers on a
//! connection of their own), so TCP offers no [`Direct`](crate::provider::Direct).
//!
//! **Rails.** Every interface `OXCCL_SOCKET_IFNAME` selects (`eth0,eth1`,
//! a prefix such as `eth`, NCCL's `^`/`=` syntax) is a rail with a
//! listener of its own; without the variable, the bootstrap's interface
//! and the physical interfaces of its speed ([`crate::id::interface_ips`]).
//! Channel `c` of a connection whose sender is the `i`-th rank of its host
//! goes over rail `(c + i) mod R` ([`crate::provider::rail_of`]), `R` the fewest rails any
//! rank has (each rank publishes its rails' addresses; a rank with more
//! uses its first `R` and says so at INFO). Traffic never moves to another
//! rail: a rail that fails is the error of the channels on it, and a rail
//! whose interface is set down, loses its carrier or vanishes fails the
//! rank once it has been down for a second (checked every 50 ms while
//! the rank waits), naming it.

use super::{Tcp, TcpOptions};
use crate::bootstrap::PeerInfo;
use crate::futex::Doorbell;
use crate::provider::{Factory, LinkCost, LinkParams, Provider, Setup, Wake, rail_between};
use crate::rail::RailWatch;
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
            return Ok(Box::new(TcpProvider {
                tcp: None,
                names: Vec::new(),
                watch: None,
                locals: Vec::new(),
                rank: setup.rank,
            }));
        }
        let rails = match &self.opts.ifname {
            Some(name) => crate::id::interface_ips(Some(name))?,
            None => default_rails(setup.boot.local_ip()),
        };
        let topts = TcpOptions { connect_timeout: self.opts.connect_timeout.min(setup.timeout), ..self.opts.clone() };
        let tcps = rails
            .iter()
            .map(|(_, ip)| Tcp::new(setup.rank, setup.nranks(), setup.nonce, setup.boot.secret(), *ip, topts.clone()))
            .collect::<Result<Vec<_>>>()?;
        let names: Vec<String> = rails.into_iter().map(|(n, _)| n).collect();
        let watch = RailWatch::new(setup.rank, "tcp", &names);
        Ok(Box::new(TcpProvider {
            tcp: Some(tcps),
            names,
            watch: Some(watch),
            locals: setup.locals(),
            rank: setup.rank,
        }))
    }
}

/// The rails without `OXCCL_SOCKET_IFNAME`: every interface of one speed
/// where [`crate::id::interface_ips`] finds several beside the bootstrap's
/// (its rules), else the bootstrap's interface alone.
fn default_rails(boot: std::net::IpAddr) -> Vec<(String, std::net::IpAddr)> {
    let found = crate::id::interface_ips(None).unwrap_or_default();
    if found.len() > 1 && found.first().is_some_and(|(_, ip)| *ip == boot) {
        return found;
    }
    let name = found.iter().find(|(_, ip)| *ip == boot).map_or_else(|| "default".to_string(), |(n, _)| n.clone());
    vec![(name, boot)]
}

/// One rank's side of the TCP provider: a [`Tcp`] per rail (`None` when it
/// serves no peer).
pub struct TcpProvider {
    tcp: Option<Vec<Tcp>>,
    /// The rails' interface names.
    names: Vec<String>,
    /// Their interfaces, watched while channels use them.
    watch: Option<RailWatch>,
    /// Each rank's index on its host ([`rail_between`]).
    locals: Vec<usize>,
    rank: usize,
}

impl TcpProvider {
    /// The rail of channel `ch` to `peer` (`sending`) or from it.
    fn rail(&self, peer: usize, ch: Channel, sending: bool) -> usize {
        rail_between(&self.locals, self.rank, peer, ch, sending, self.rails())
    }

    /// The rail of channel `ch` to `peer` (`sending`) or from it, from now
    /// on watched.
    fn tcp(&mut self, peer: usize, ch: Channel, sending: bool) -> Result<&Tcp> {
        let i = self.rail(peer, ch, sending);
        let tcps =
            self.tcp.as_ref().ok_or_else(|| Error::Internal("TCP traffic with a peer TCP does not serve".into()))?;
        if let Some(w) = &mut self.watch {
            w.used(i);
        }
        Ok(&tcps[i])
    }

    /// How many rails this rank uses (after [`Provider::connect`]: as many
    /// as the rank with the fewest).
    pub fn rails(&self) -> usize {
        self.tcp.as_ref().map_or(0, Vec::len)
    }

    fn all(&self) -> impl Iterator<Item = &Tcp> {
        self.tcp.iter().flatten()
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
        let addrs: Vec<String> = self.all().map(|t| t.addr().to_string()).collect();
        addrs.join(",").into_bytes()
    }
    fn connect(&mut self, _setup: &Setup<'_>, published: &[Vec<u8>], _bell: &Doorbell) -> Result<()> {
        let Some(tcps) = &mut self.tcp else { return Ok(()) };
        // Ranks without TCP peers publish nothing; nobody connects to them
        // over TCP, so any placeholder does.
        let mut lists = Vec::with_capacity(published.len());
        for (p, a) in published.iter().enumerate() {
            let text = String::from_utf8_lossy(a).to_string();
            let list = text
                .split(',')
                .filter(|t| !t.is_empty())
                .map(|t| t.parse().map_err(|_| Error::Remote(format!("rank {p} published a bad address {t:?}"))))
                .collect::<Result<Vec<std::net::SocketAddr>>>()?;
            lists.push(list);
        }
        let rails = lists.iter().map(Vec::len).filter(|&l| l > 0).min().unwrap_or(1).min(tcps.len()).max(1);
        if rails < tcps.len() {
            tracing::info!(
                "rank {}: TCP over {rails} of its {} rails ({}): a peer has {rails}",
                self.rank,
                tcps.len(),
                self.names.join(", ")
            );
            for t in tcps.drain(rails..) {
                t.close();
            }
            if let Some(w) = &mut self.watch {
                w.truncate(rails);
            }
        } else if rails > 1 {
            tracing::info!(
                "rank {}: TCP over {rails} rails ({}); channel c of the i-th rank of a host sends on rail (c + i) mod {rails}",
                self.rank,
                self.names[..rails].join(", ")
            );
        }
        for (i, t) in tcps.iter().enumerate() {
            let addrs = lists.iter().map(|l| l.get(i).copied().unwrap_or_else(|| t.addr())).collect();
            t.set_peer_addrs(addrs)?;
        }
        Ok(())
    }
    fn sender(&mut self, peer: usize, ch: Channel) -> Result<Box<dyn Sender>> {
        self.tcp(peer, ch, true)?.sender(peer, ch)
    }
    fn receiver(&mut self, peer: usize, ch: Channel) -> Result<Box<dyn Receiver>> {
        self.tcp(peer, ch, false)?.receiver(peer, ch)
    }
    fn route(&self, peer: usize, ch: Channel, sending: bool) -> Option<String> {
        let rails = self.rails();
        (rails > 1).then(|| {
            let i = self.rail(peer, ch, sending);
            format!("tcp over {}, rail {} of {rails}", self.names[i], i + 1)
        })
    }
    fn needs_progress(&self) -> bool {
        self.tcp.is_some()
    }
    fn progress(&mut self) -> Result<bool> {
        let mut moved = false;
        for t in self.all() {
            moved |= t.progress()?;
        }
        Ok(moved)
    }
    fn wake(&self) -> Wake {
        Wake { rings_bell: false, fds: self.all().flat_map(Tcp::poll_fds).collect() }
    }
    fn rails(&self) -> usize {
        TcpProvider::rails(self).max(1)
    }
    fn check(&mut self, peer_failed: bool) -> Result<()> {
        self.watch.as_mut().map_or(Ok(()), |w| w.check(peer_failed))
    }
    fn close(&mut self) {
        self.all().for_each(Tcp::close);
    }
}
