//! [`UniqueId`]: the 128-byte token that names one communicator's
//! rendezvous (NCCL's `ncclUniqueId`), and the choice of network interface.
//!
//! An id holds a magic, a version, a random 16-byte nonce and rank 0's
//! bootstrap listening address. [`UniqueId::new`] binds that listener at
//! once (like `ncclGetUniqueId`) and parks it in a process-global registry,
//! so the rank-0 [`Bootstrap::init`](crate::bootstrap::Bootstrap::init) of
//! this process takes it ([`take_listener`]) and no other program can grab
//! the port in between. When rank 0 runs in another process (the id was
//! passed through a file or the environment), rank 0's init binds the id's
//! address itself.
//!
//! Interface choice ([`interface_ip`]): a spec in the syntax of
//! `OXCCL_SOCKET_IFNAME` and NCCL's `NCCL_SOCKET_IFNAME`: a comma-separated
//! list of name prefixes (`eth,ib`), `^` in front to exclude them
//! (`^docker,lo`), `=` for exact names (`=eth0`, `^=docker0`). Without one,
//! the first non-loopback IPv4 interface that is up (docker bridges and
//! link-local addresses skipped), else loopback. Nothing here reads the
//! variable: oxccl's `Config` does (`Config::unique_id`, `oxccl::unique_id`)
//! and passes the spec to [`UniqueId::new_on`].

#![allow(unsafe_code)]

use std::ffi::CStr;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, TcpListener};
use std::str::FromStr;

use parking_lot::Mutex;
use socket2::{Domain, Protocol, Socket, Type};

use crate::wire::{u16_at, u32_at};
use crate::{Error, Result};

/// The environment variable naming the interface(s) to use (read by
/// oxccl's `Config`; named here in error messages).
pub const SOCKET_IFNAME_ENV: &str = "OXCCL_SOCKET_IFNAME";

const MAGIC: [u8; 8] = *b"OXCCLUID";
const VERSION: u16 = 2;
const OFF_VERSION: usize = 8;
const OFF_FAMILY: usize = 10;
/// Bit 0: the secret is derived from what travels in clear (an id made by
/// [`for_env`](UniqueId::for_env) that no secret was given since).
const OFF_FLAGS: usize = 11;
const OFF_NONCE: usize = 12;
const OFF_PORT: usize = 28;
const OFF_IP: usize = 30;
const OFF_FLOWINFO: usize = 46;
const OFF_SCOPE: usize = 50;
const OFF_SECRET: usize = 64;
const OFF_BASE: usize = 96;

/// The 128-byte token every rank of one communicator is given.
///
/// Layout (all other bytes zero): `0..8` magic `OXCCLUID`, `8..10` version
/// (little endian), `10` address family (4 or 6), `11` flags (bit 0: the
/// secret is derived from the address and a job key), `12..28` nonce, `28..30`
/// port (big endian), `30..46` IP address (IPv4 in the first 4 bytes),
/// `46..50` IPv6 flow info, `50..54` IPv6 scope id, `64..96` the secret,
/// `96..128` the secret before a key was mixed in
/// ([`with_key`](UniqueId::with_key); zero for none).
///
/// The nonce names the communicator and travels in clear; the secret
/// never leaves the id: connections prove they know it ([`crate::auth`]).
/// Pass the id between processes as NCCL's is passed (MPI, a file only
/// the job can read, the launcher's environment): whoever holds it can
/// join.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct UniqueId {
    bytes: [u8; 128],
}

impl UniqueId {
    /// Size of an id in bytes (NCCL's `NCCL_UNIQUE_ID_BYTES`).
    pub const SIZE: usize = 128;

    /// A fresh id on the default interface ([`interface_ip`]`(None)`):
    /// binds rank 0's bootstrap listener on it (ephemeral port) now, draws
    /// a random nonce and parks the listener for this process's rank 0
    /// ([`take_listener`]). A listener whose rank 0 never runs in this
    /// process stays open until the process exits. It does not read
    /// `OXCCL_SOCKET_IFNAME`: programs call `oxccl::unique_id` (or
    /// `Config::unique_id`), which does.
    pub fn new() -> Result<UniqueId> {
        UniqueId::new_on(None)
    }

    /// [`new`](UniqueId::new) on the interface `ifname` selects (an
    /// [`interface_ip`] spec; `None`: the default interface).
    pub fn new_on(ifname: Option<&str>) -> Result<UniqueId> {
        let ip = interface_ip(ifname)?;
        let listener = listen(SocketAddr::new(ip, 0)).map_err(|e| {
            Error::System(format!("cannot bind the bootstrap listener on {ip}: {e}; set {SOCKET_IFNAME_ENV}"))
        })?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::System(format!("bootstrap listener on {ip} has no local address: {e}")))?;
        let mut nonce = [0u8; 16];
        getrandom::fill(&mut nonce).map_err(|e| Error::System(format!("cannot draw a random nonce: {e}")))?;
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).map_err(|e| Error::System(format!("cannot draw a random secret: {e}")))?;
        let id = UniqueId::from_addr(addr, nonce).with_secret(secret);
        LISTENERS.lock().push((nonce, addr, listener));
        Ok(id)
    }

    /// An id naming `addr` as rank 0's listener, with this nonce. Nothing is
    /// bound: rank 0's init binds `addr`.
    pub fn from_addr(addr: SocketAddr, nonce: [u8; 16]) -> UniqueId {
        let mut bytes = [0u8; 128];
        bytes[..8].copy_from_slice(&MAGIC);
        bytes[OFF_VERSION..OFF_VERSION + 2].copy_from_slice(&VERSION.to_le_bytes());
        bytes[OFF_NONCE..OFF_NONCE + 16].copy_from_slice(&nonce);
        bytes[OFF_PORT..OFF_PORT + 2].copy_from_slice(&addr.port().to_be_bytes());
        match addr {
            SocketAddr::V4(a) => {
                bytes[OFF_FAMILY] = 4;
                bytes[OFF_IP..OFF_IP + 4].copy_from_slice(&a.ip().octets());
            }
            SocketAddr::V6(a) => {
                bytes[OFF_FAMILY] = 6;
                bytes[OFF_IP..OFF_IP + 16].copy_from_slice(&a.ip().octets());
                bytes[OFF_FLOWINFO..OFF_FLOWINFO + 4].copy_from_slice(&a.flowinfo().to_le_bytes());
                bytes[OFF_SCOPE..OFF_SCOPE + 4].copy_from_slice(&a.scope_id().to_le_bytes());
            }
        }
        UniqueId { bytes }
    }

    /// A deterministic id for launchers where every rank only knows rank
    /// 0's address (torchrun's `MASTER_ADDR:MASTER_PORT`): the nonce is
    /// derived from `addr` and `job_key` (e.g. the job id plus a
    /// communicator counter), so all ranks compute the same id. Rank 0
    /// binds `addr` in its init; pick a port nothing else (such as the
    /// launcher's own store) uses.
    ///
    /// Its secret is derived from the same two, so anyone who knows them
    /// can compute it: give it a real one with
    /// [`with_secret_from`](UniqueId::with_secret_from) (`OXCCL_SECRET`,
    /// `OXCCL_SECRET_FILE`).
    pub fn for_env(addr: SocketAddr, job_key: &str) -> UniqueId {
        let mut input = Vec::with_capacity(64 + job_key.len());
        input.extend_from_slice(b"oxccl-for-env\0");
        input.extend_from_slice(addr.to_string().as_bytes());
        input.push(0);
        input.extend_from_slice(job_key.as_bytes());
        let a = mix(fnv1a(&input, 0xcbf2_9ce4_8422_2325));
        let b = mix(fnv1a(&input, 0x6c62_272e_07bb_0142) ^ a);
        let mut nonce = [0u8; 16];
        nonce[..8].copy_from_slice(&a.to_le_bytes());
        nonce[8..].copy_from_slice(&b.to_le_bytes());
        let mut id = UniqueId::from_addr(addr, nonce).with_secret(crate::auth::derive("for-env", &input));
        id.bytes[OFF_FLAGS] |= 1;
        id
    }

    /// The same id with this secret (and no key mixed in).
    pub fn with_secret(mut self, secret: crate::auth::Secret) -> UniqueId {
        self.bytes[OFF_SECRET..OFF_SECRET + 32].copy_from_slice(&secret);
        self.bytes[OFF_BASE..OFF_BASE + 32].fill(0);
        self.bytes[OFF_FLAGS] &= !1;
        self
    }

    /// The same id with a secret derived from key material every rank has
    /// (a passphrase, a key file's bytes).
    pub fn with_secret_from(self, material: &[u8]) -> UniqueId {
        self.with_secret(crate::auth::derive("material", material))
    }

    /// The same id with `key` (a pre-shared key: NCCL's `ncclSetEncryption`)
    /// mixed into its secret. The secret it had is kept as its base, so
    /// ranks whose keys differ (or one of which has none) can still prove
    /// to each other that they hold this id, and both say at once that
    /// the keys differ instead of taking each other for strangers. Mixing
    /// a second key keeps the first base.
    ///
    /// An id whose secret anyone can derive ([`for_env`](UniqueId::for_env)
    /// without `OXCCL_SECRET`) keeps no base: a proof of it would prove
    /// nothing, and letting it end a rendezvous would let strangers do so.
    pub fn with_key(self, key: &[u8]) -> UniqueId {
        let base = (!self.public()).then(|| self.base());
        let material = [key, &self.secret()[..]].concat();
        let mut id = self.with_secret_from(&material);
        if let Some(base) = base {
            id.bytes[OFF_BASE..OFF_BASE + 32].copy_from_slice(&base);
        }
        id
    }

    /// Whether the secret is derived from what travels in clear (an id of
    /// [`for_env`](UniqueId::for_env) given no secret since).
    pub fn public(&self) -> bool {
        self.bytes[OFF_FLAGS] & 1 != 0
    }

    /// The secret before a key was mixed in ([`with_key`](UniqueId::with_key)),
    /// or the secret itself when none was.
    pub fn base(&self) -> crate::auth::Secret {
        let mut s = [0u8; 32];
        s.copy_from_slice(&self.bytes[OFF_BASE..OFF_BASE + 32]);
        if s == [0u8; 32] { self.secret() } else { s }
    }

    /// Whether a key was mixed into the secret (and a base kept).
    pub fn keyed(&self) -> bool {
        self.bytes[OFF_BASE..OFF_BASE + 32] != [0u8; 32]
    }

    /// The secret connections prove they know (never sent anywhere).
    pub fn secret(&self) -> crate::auth::Secret {
        let mut s = [0u8; 32];
        s.copy_from_slice(&self.bytes[OFF_SECRET..OFF_SECRET + 32]);
        s
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8; 128] {
        &self.bytes
    }

    /// Parses raw bytes, checking the magic, the version and the address
    /// family.
    pub fn from_bytes(bytes: &[u8; 128]) -> Result<UniqueId> {
        if bytes[..8] != MAGIC {
            return Err(Error::invalid(
                "not an oxccl UniqueId (bad magic): pass the id that rank 0's UniqueId::new (ncclGetUniqueId) made",
            ));
        }
        let version = u16_at(bytes, OFF_VERSION);
        if version != VERSION {
            return Err(Error::invalid(format!(
                "UniqueId version {version} is not supported by this oxccl (version {VERSION}): \
                 every rank must run the same oxccl"
            )));
        }
        match bytes[OFF_FAMILY] {
            4 | 6 => Ok(UniqueId { bytes: *bytes }),
            f => Err(Error::invalid(format!("UniqueId has address family {f}, expected 4 or 6: the id is corrupt"))),
        }
    }

    /// The random (or derived) nonce that tells this communicator's
    /// connections from others.
    pub fn nonce(&self) -> [u8; 16] {
        let mut n = [0u8; 16];
        n.copy_from_slice(&self.bytes[OFF_NONCE..OFF_NONCE + 16]);
        n
    }

    /// Rank 0's bootstrap listening address.
    pub fn addr(&self) -> SocketAddr {
        let b = &self.bytes;
        let port = u16::from_be_bytes([b[OFF_PORT], b[OFF_PORT + 1]]);
        if b[OFF_FAMILY] == 4 {
            let ip = Ipv4Addr::new(b[OFF_IP], b[OFF_IP + 1], b[OFF_IP + 2], b[OFF_IP + 3]);
            SocketAddr::V4(SocketAddrV4::new(ip, port))
        } else {
            let mut o = [0u8; 16];
            o.copy_from_slice(&b[OFF_IP..OFF_IP + 16]);
            SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(o), port, u32_at(b, OFF_FLOWINFO), u32_at(b, OFF_SCOPE)))
        }
    }
}

impl fmt::Display for UniqueId {
    /// 256 lowercase hex characters.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.bytes {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// Shows the address and nonce, never the secret.
impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nonce: String = self.nonce().iter().map(|b| format!("{b:02x}")).collect();
        f.debug_struct("UniqueId").field("addr", &self.addr()).field("nonce", &nonce).finish()
    }
}

impl FromStr for UniqueId {
    type Err = Error;

    /// Parses the 256 hex characters of [`Display`](fmt::Display)
    /// (surrounding whitespace ignored, either case).
    fn from_str(s: &str) -> Result<UniqueId> {
        let s = s.trim();
        if s.len() != 2 * UniqueId::SIZE {
            return Err(Error::invalid(format!(
                "a UniqueId is {} hex characters, got {}: pass the whole id as printed by rank 0",
                2 * UniqueId::SIZE,
                s.len()
            )));
        }
        let mut bytes = [0u8; 128];
        for (i, pair) in s.as_bytes().chunks_exact(2).enumerate() {
            let digit = |k: usize| {
                (pair[k] as char).to_digit(16).ok_or_else(|| {
                    Error::invalid(format!(
                        "UniqueId has a non-hex character {:?} at position {}",
                        s[2 * i + k..].chars().next().unwrap_or('?'),
                        2 * i + k
                    ))
                })
            };
            bytes[i] = (digit(0)? * 16 + digit(1)?) as u8;
        }
        UniqueId::from_bytes(&bytes)
    }
}

/// Listeners bound by [`UniqueId::new`], waiting for this process's rank 0:
/// (nonce, address, listener).
static LISTENERS: Mutex<Vec<([u8; 16], SocketAddr, TcpListener)>> = Mutex::new(Vec::new());

/// Takes the listener [`UniqueId::new`] bound for `id` in this process, if
/// any (and if nobody took it yet).
pub fn take_listener(id: &UniqueId) -> Option<TcpListener> {
    let (nonce, addr) = (id.nonce(), id.addr());
    let mut list = LISTENERS.lock();
    let i = list.iter().position(|(n, a, _)| *n == nonce && *a == addr)?;
    Some(list.swap_remove(i).2)
}

/// A TCP listener on `addr` with `SO_REUSEADDR` and a deep backlog (many
/// ranks connect at once).
pub(crate) fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(4096)?;
    Ok(socket.into())
}

/// One address of one interface.
#[derive(Clone, Debug)]
struct IfAddr {
    name: String,
    ip: IpAddr,
    up: bool,
    loopback: bool,
}

/// The IP address to bind and advertise.
///
/// `ifname` is a spec in the `OXCCL_SOCKET_IFNAME` syntax (see the module
/// docs); `None` (or a blank spec) picks the first non-loopback IPv4
/// interface that is up, else `127.0.0.1`. Among the interfaces a spec
/// selects, an IPv4 address is preferred over a (non link-local) IPv6 one.
/// A spec that selects nothing is an error listing the interfaces there
/// are.
pub fn interface_ip(ifname: Option<&str>) -> Result<IpAddr> {
    let addrs = interfaces()?;
    match ifname.map(str::trim).filter(|s| !s.is_empty()) {
        Some(spec) => pick_by_spec(&addrs, spec),
        None => Ok(pick_default(&addrs)),
    }
}

/// Every interface `spec` selects (one address each, IPv4 preferred), in
/// the system's order: the rails of a rank. `None` (or a blank spec): the
/// interface [`interface_ip`] picks, and beside it every other physical
/// interface of its speed ([`default_rails`]). The same errors as
/// [`interface_ip`].
pub fn interface_ips(ifname: Option<&str>) -> Result<Vec<(String, IpAddr)>> {
    let addrs = interfaces()?;
    let Some(spec) = ifname.map(str::trim).filter(|s| !s.is_empty()) else {
        let nics = crate::topo::nics_here();
        let rails = default_rails(&addrs, &nics);
        if rails.len() > 1 {
            let names: Vec<&str> = rails.iter().map(|(n, _)| n.as_str()).collect();
            let speed = nics.iter().find(|n| n.name == names[0]).and_then(|n| n.speed_mbps).unwrap_or(0);
            tracing::info!(
                "TCP rails by default: {} (every physical interface up at {speed} Mb/s); \
                 {SOCKET_IFNAME_ENV}={} uses one",
                names.join(", "),
                names[0]
            );
        }
        return Ok(rails);
    };
    rails_by_spec(&addrs, spec)
}

/// The rails without a spec: the interface [`pick_default`] picks, then,
/// where it is a physical interface (not a bridge, veth, tunnel: not
/// under `/devices/virtual/`) that is up with a known speed, every other
/// such interface of the same speed with a usable IPv4 address, in the
/// system's order (NCCL, too, uses every interface by default but
/// loopback and docker's). Otherwise the default interface alone.
fn default_rails(addrs: &[IfAddr], nics: &[crate::topo::Nic]) -> Vec<(String, IpAddr)> {
    let ip = pick_default(addrs);
    let name = addrs.iter().find(|a| a.ip == ip).map_or_else(|| "lo".to_string(), |a| a.name.clone());
    let mut out = vec![(name.clone(), ip)];
    let physical = |n: &str| {
        nics.iter()
            .find(|x| x.name == n)
            .filter(|x| x.up && !x.virtual_ && x.speed_mbps.is_some_and(|s| s > 0))
            .and_then(|x| x.speed_mbps)
    };
    let Some(speed) = physical(&name) else { return out };
    for a in addrs {
        let ok = a.up && !a.loopback && a.ip.is_ipv4() && usable(&a.ip) && !a.name.starts_with("docker");
        if ok && physical(&a.name) == Some(speed) && !out.iter().any(|(n, _)| *n == a.name) {
            out.push((a.name.clone(), a.ip));
        }
    }
    out
}

/// Every interface of `addrs` that `spec` selects, with the address
/// [`pick_by_spec`] would take of it, in order; an error as
/// [`pick_by_spec`]'s when there is none.
fn rails_by_spec(addrs: &[IfAddr], spec: &str) -> Result<Vec<(String, IpAddr)>> {
    pick_by_spec(addrs, spec)?;
    let mut out: Vec<(String, IpAddr)> = Vec::new();
    for a in addrs {
        if !out.iter().any(|(n, _)| *n == a.name)
            && selects(spec, &a.name)
            && let Ok(ip) = pick_by_spec(addrs, &format!("={}", a.name))
        {
            out.push((a.name.clone(), ip));
        }
    }
    Ok(out)
}

/// Whether `spec` (`OXCCL_SOCKET_IFNAME` syntax) selects interface `name`.
fn selects(spec: &str, name: &str) -> bool {
    let (exclude, rest) = match spec.strip_prefix('^') {
        Some(r) => (true, r),
        None => (false, spec),
    };
    let (exact, rest) = match rest.strip_prefix('=') {
        Some(r) => (true, r),
        None => (false, rest),
    };
    let hit = rest
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .any(|p| if exact { name == p } else { name.starts_with(p) });
    hit != exclude
}

fn usable(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => !v4.is_link_local() && !v4.is_unspecified(),
        IpAddr::V6(v6) => !v6.is_unicast_link_local() && !v6.is_unspecified(),
    }
}

fn pick_default(addrs: &[IfAddr]) -> IpAddr {
    addrs
        .iter()
        .find(|a| a.up && !a.loopback && a.ip.is_ipv4() && usable(&a.ip) && !a.name.starts_with("docker"))
        .map(|a| a.ip)
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

fn pick_by_spec(addrs: &[IfAddr], spec: &str) -> Result<IpAddr> {
    let candidates: Vec<&IfAddr> = addrs.iter().filter(|a| a.up && usable(&a.ip) && selects(spec, &a.name)).collect();
    candidates.iter().find(|a| a.ip.is_ipv4()).or_else(|| candidates.first()).map(|a| a.ip).ok_or_else(|| {
        let list: Vec<String> =
            addrs.iter().map(|a| format!("{} ({}{})", a.name, a.ip, if a.up { "" } else { ", down" })).collect();
        Error::invalid(format!(
            "interface spec {spec:?} ({SOCKET_IFNAME_ENV}) selects no interface that is up with a usable address; \
             interfaces here: {}",
            if list.is_empty() { "none".to_string() } else { list.join(", ") }
        ))
    })
}

/// Every IPv4/IPv6 address of every interface, in `getifaddrs` order.
fn interfaces() -> Result<Vec<IfAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a pointer to a list it allocates into
    // `head`; we free it with freeifaddrs below and never keep pointers
    // into it.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(Error::System(format!("getifaddrs failed: {}", std::io::Error::last_os_error())));
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, valid
        // until freeifaddrs; we only read it.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points at a sockaddr owned by
        // the list; sa_family is valid for every sockaddr.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        let ip = match family {
            libc::AF_INET => {
                // SAFETY: for AF_INET the kernel stores a sockaddr_in at
                // ifa_addr (suitably aligned, owned by the list).
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
            }
            libc::AF_INET6 => {
                // SAFETY: for AF_INET6 the kernel stores a sockaddr_in6 at
                // ifa_addr (suitably aligned, owned by the list).
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
            }
            _ => continue,
        };
        // SAFETY: ifa_name is a non-null NUL-terminated string owned by the
        // list; we copy it before freeifaddrs.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
        let flags = ifa.ifa_flags;
        out.push(IfAddr {
            name,
            ip,
            up: flags & libc::IFF_UP as u32 != 0,
            loopback: flags & libc::IFF_LOOPBACK as u32 != 0 || ip.is_loopback(),
        });
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed once;
    // nothing borrowed from the list outlives this point.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

fn fnv1a(data: &[u8], basis: u64) -> u64 {
    data.iter().fold(basis, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// splitmix64's finalizer: spreads the FNV state over all bits.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ifa(name: &str, ip: &str, up: bool) -> IfAddr {
        let ip: IpAddr = ip.parse().unwrap();
        IfAddr { name: name.into(), ip, up, loopback: ip.is_loopback() }
    }

    fn nic(name: &str, speed: Option<u64>, up: bool, virtual_: bool) -> crate::topo::Nic {
        crate::topo::Nic { name: name.into(), speed_mbps: speed, up, numa: None, virtual_ }
    }

    #[test]
    fn by_default_every_physical_interface_of_the_default_ones_speed_is_a_rail() {
        let addrs = [
            ifa("lo", "127.0.0.1", true),
            ifa("eth0", "10.0.0.1", true),
            ifa("docker0", "172.17.0.1", true),
            ifa("eth1", "10.1.0.1", true),
            ifa("eth2", "10.2.0.1", true),
            ifa("eth3", "fd00::3", true),
            ifa("veth9", "10.9.0.1", true),
            ifa("br0", "10.8.0.1", true),
        ];
        let rails = |nics: &[crate::topo::Nic]| -> Vec<String> {
            default_rails(&addrs, nics).into_iter().map(|(n, _)| n).collect()
        };
        let g25 = Some(25_000);
        // Two of one speed (and a slower one, one without IPv4, a bridge
        // and a veth of that speed): both.
        let nics = [
            nic("eth0", g25, true, false),
            nic("docker0", g25, true, true),
            nic("eth1", g25, true, false),
            nic("eth2", Some(10_000), true, false),
            nic("eth3", g25, true, false),
            nic("veth9", g25, true, true),
        ];
        assert_eq!(rails(&nics), ["eth0", "eth1"]);
        // Different speeds, or the other one down: one.
        assert_eq!(rails(&[nic("eth0", g25, true, false), nic("eth1", Some(100_000), true, false)]), ["eth0"]);
        assert_eq!(rails(&[nic("eth0", g25, true, false), nic("eth1", g25, false, false)]), ["eth0"]);
        // One physical interface beside a veth, a bridge and docker's of
        // its speed: one.
        let one = [
            nic("eth0", g25, true, false),
            nic("docker0", g25, true, true),
            nic("veth9", g25, true, true),
            nic("br0", g25, true, true),
        ];
        assert_eq!(rails(&one), ["eth0"]);
        // The default interface virtual, or of unknown speed: one.
        assert_eq!(rails(&[nic("eth0", g25, true, true), nic("eth1", g25, true, false)]), ["eth0"]);
        assert_eq!(rails(&[nic("eth0", None, true, false), nic("eth1", None, true, false)]), ["eth0"]);
        // No interface: loopback, as before.
        assert_eq!(
            default_rails(&[ifa("lo", "127.0.0.1", true)], &[]),
            [("lo".to_string(), "127.0.0.1".parse().unwrap())]
        );
    }

    #[test]
    fn layout_round_trip_v4_and_v6() {
        let a: SocketAddr = "10.1.2.3:4567".parse().unwrap();
        let id = UniqueId::from_addr(a, [7; 16]);
        assert_eq!(id.addr(), a);
        assert_eq!(id.nonce(), [7; 16]);
        assert_eq!(UniqueId::from_bytes(id.as_bytes()).unwrap(), id);
        let b = SocketAddr::V6(SocketAddrV6::new("fd00::2".parse().unwrap(), 99, 5, 3));
        let id6 = UniqueId::from_addr(b, [1; 16]);
        assert_eq!(id6.addr(), b);
        assert_eq!(id6.to_string().parse::<UniqueId>().unwrap(), id6);
    }

    #[test]
    fn bad_bytes() {
        let mut raw = *UniqueId::from_addr("1.2.3.4:5".parse().unwrap(), [0; 16]).as_bytes();
        raw[OFF_FAMILY] = 5;
        assert!(UniqueId::from_bytes(&raw).unwrap_err().to_string().contains("family 5"));
        raw[OFF_FAMILY] = 4;
        raw[OFF_VERSION] = 9;
        assert!(UniqueId::from_bytes(&raw).unwrap_err().to_string().contains("version 9"));
        raw[0] = b'X';
        assert!(UniqueId::from_bytes(&raw).unwrap_err().to_string().contains("not an oxccl UniqueId"));
    }

    #[test]
    fn for_env_is_deterministic() {
        let a: SocketAddr = "10.0.0.1:29500".parse().unwrap();
        assert_eq!(UniqueId::for_env(a, "job1"), UniqueId::for_env(a, "job1"));
        assert_ne!(UniqueId::for_env(a, "job1").nonce(), UniqueId::for_env(a, "job2").nonce());
        assert_eq!(UniqueId::for_env(a, "job1").addr(), a);
    }

    #[test]
    fn a_key_keeps_the_secret_it_was_mixed_into_as_the_base() {
        let a: SocketAddr = "10.0.0.1:29500".parse().unwrap();
        let id = UniqueId::from_addr(a, [7; 16]).with_secret([9; 32]);
        assert!(!id.keyed() && !id.public());
        assert_eq!(id.base(), id.secret());
        let k = id.with_key(b"psk-1");
        assert!(k.keyed());
        assert_ne!(k.secret(), id.secret());
        assert_eq!(k.base(), id.secret());
        // The secret is what it always was for a key (compatible with the
        // ids of before), and a second key keeps the first base.
        assert_eq!(k.secret(), id.with_secret_from(&[&b"psk-1"[..], &[9; 32]].concat()).secret());
        assert_eq!(k.with_key(b"psk-2").base(), id.secret());
        // Travels in the bytes.
        assert_eq!(UniqueId::from_bytes(k.as_bytes()).unwrap().base(), id.secret());
        // A new secret forgets the base.
        assert!(!k.with_secret([1; 32]).keyed());
        // An id whose secret anyone can derive keeps none; with a secret of
        // its own (OXCCL_SECRET), it does.
        let env = UniqueId::for_env(a, "job");
        assert!(env.public());
        assert!(!env.with_key(b"psk").keyed());
        let private = env.with_secret_from(b"OXCCL_SECRET");
        assert!(!private.public());
        assert_eq!(private.with_key(b"psk").base(), private.secret());
    }

    #[test]
    fn spec_selection() {
        let addrs = vec![
            ifa("lo", "127.0.0.1", true),
            ifa("docker0", "172.17.0.1", true),
            ifa("eth0", "fe80::1", true),
            ifa("eth0", "fd00::2", true),
            ifa("eth0", "192.0.2.2", true),
            ifa("ib0", "10.9.0.1", false),
            ifa("ib1", "10.9.0.2", true),
        ];
        assert_eq!(pick_default(&addrs), "192.0.2.2".parse::<IpAddr>().unwrap());
        assert_eq!(pick_by_spec(&addrs, "ib").unwrap(), "10.9.0.2".parse::<IpAddr>().unwrap());
        assert_eq!(pick_by_spec(&addrs, "=lo").unwrap(), "127.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(pick_by_spec(&addrs, "^lo,docker,eth").unwrap(), "10.9.0.2".parse::<IpAddr>().unwrap());
        assert_eq!(pick_by_spec(&addrs, "^=lo").unwrap(), "172.17.0.1".parse::<IpAddr>().unwrap());
        let e = pick_by_spec(&addrs, "=ib").unwrap_err().to_string();
        assert!(e.contains("\"=ib\"") && e.contains("ib0 (10.9.0.1, down)"), "{e}");
        let only_lo = vec![ifa("lo", "127.0.0.1", true)];
        assert_eq!(pick_default(&only_lo), IpAddr::V4(Ipv4Addr::LOCALHOST));
        // Rails: every interface selected, once, with its preferred address.
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let two = [ifa("eth1", "10.1.0.1", true)];
        let all: Vec<IfAddr> = addrs.iter().cloned().chain(two).collect();
        assert_eq!(
            rails_by_spec(&all, "eth").unwrap(),
            vec![("eth0".into(), ip("192.0.2.2")), ("eth1".into(), ip("10.1.0.1"))]
        );
        assert_eq!(
            rails_by_spec(&all, "ib,eth1").unwrap(),
            vec![("ib1".into(), ip("10.9.0.2")), ("eth1".into(), ip("10.1.0.1"))]
        );
        assert!(rails_by_spec(&all, "=ib").is_err());
    }

    #[test]
    fn real_interfaces_have_loopback() {
        let addrs = interfaces().unwrap();
        assert!(addrs.iter().any(|a| a.loopback), "{addrs:?}");
        assert!(interface_ip(Some("=lo")).unwrap().is_loopback());
    }
}
