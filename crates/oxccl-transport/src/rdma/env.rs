//! The `OXCCL_IB_*` variables (NCCL's `NCCL_IB_*` meanings), the HCA
//! filter and the choice of a port's GID.
//!
//! | Variable | Meaning | Default |
//! |---|---|---|
//! | `OXCCL_IB_DISABLE` | `1`: never use RDMA (TCP instead) | `0` |
//! | `OXCCL_IB_HCA` | which HCAs and ports ([`HcaFilter`]) | all |
//! | `OXCCL_IB_GID_INDEX` | GID table index (RoCE) | automatic ([`choose_gid`]) |
//! | `OXCCL_IB_TIMEOUT` | ACK timeout exponent, 4.096 µs × 2^v (1–31) | 20 (~4.3 s) |
//! | `OXCCL_IB_RETRY_CNT` | transport retries (0–7) | 7 |
//! | `OXCCL_IB_RNR_RETRY` | receiver-not-ready retries, 7 = forever (0–7; oxccl's own) | 7 |
//! | `OXCCL_IB_SL` | InfiniBand service level (0–15) | 0 |
//! | `OXCCL_IB_TC` | traffic class (0–255) | 0 |
//! | `OXCCL_IB_QPS_PER_CONNECTION` | queue pairs per connection (1–64) | 1 |
//! | `OXCCL_IB_CHUNK` | bytes per RDMA WRITE (4 KiB–64 MiB; `512K`, `1M`) | 512 KiB |
//! | `OXCCL_IBVERBS_LIB` | libibverbs to `dlopen` | `libibverbs.so.1` |
//! | `OXCCL_IB_PROVIDER` | `ibv` (libibverbs) or `soft` (the software HCA) | `ibv` |
//!
//! [`IbOptions::from_lookup`] reads them through a function (oxccl's
//! `Config` passes its own lookup of the environment, once; tests pass a
//! table), so the provider itself never reads a variable. An empty value
//! counts as unset. A bad value is an error naming the variable, the value
//! and what is allowed.

use super::verbs::{GidEntry, GidType, LinkLayer, PortInfo};
use crate::{Error, Result};
use oxccl_core::size::{SIZE_FORMS, parse_size};
use std::fmt;

/// Which backend implements the verbs seam (`OXCCL_IB_PROVIDER`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IbProvider {
    /// libibverbs, opened at run time (a real HCA).
    #[default]
    Ibv,
    /// The software RC HCA over TCP (tests, machines without a NIC).
    Soft,
}

/// One entry of an [`HcaFilter`]: a device name and perhaps a port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HcaEntry {
    /// Device name, or its prefix.
    pub name: String,
    /// The one port it admits; `None`: all.
    pub port: Option<u8>,
}

/// `OXCCL_IB_HCA` (NCCL's `NCCL_IB_HCA` syntax): a comma-separated list of
/// `dev` or `dev:port`.
///
/// - `mlx5` admits every device whose name starts with `mlx5` (all ports);
///   `mlx5_1` admits `mlx5_1` and also `mlx5_10`.
/// - A leading `=` asks for exact names: `=mlx5_0:1,mlx5_1` admits port 1
///   of `mlx5_0` and every port of `mlx5_1`, nothing else.
/// - A leading `^` inverts the list: `^mlx5_1` admits everything except
///   `mlx5_1*`; `^=mlx5_1` everything except exactly `mlx5_1`.
/// - An empty filter admits everything.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct HcaFilter {
    /// The entries (empty: no restriction).
    pub entries: Vec<HcaEntry>,
    /// `^`: the entries name what is excluded.
    pub exclude: bool,
    /// `=`: names match exactly instead of by prefix.
    pub exact: bool,
}

impl HcaFilter {
    /// Parses NCCL's syntax; an error names what is wrong in `s`.
    pub fn parse(s: &str) -> Result<HcaFilter> {
        let mut rest = s.trim();
        let mut f = HcaFilter::default();
        if let Some(r) = rest.strip_prefix('^') {
            f.exclude = true;
            rest = r;
        }
        if let Some(r) = rest.strip_prefix('=') {
            f.exact = true;
            rest = r;
        }
        for item in rest.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, port) = match item.split_once(':') {
                None => (item, None),
                Some((n, p)) => {
                    let port = p.trim().parse::<u8>().ok().filter(|&p| p >= 1).ok_or_else(|| {
                        Error::invalid(format!("OXCCL_IB_HCA={s:?}: {p:?} in {item:?} is not a port number (1 to 255)"))
                    })?;
                    (n.trim(), Some(port))
                }
            };
            if name.is_empty() || name.contains(|c: char| c.is_whitespace() || c == '/') {
                return Err(Error::invalid(format!(
                    "OXCCL_IB_HCA={s:?}: {item:?} does not name a device (expected dev or dev:port, as mlx5_0:1)"
                )));
            }
            f.entries.push(HcaEntry { name: name.to_string(), port });
        }
        Ok(f)
    }

    /// Whether port `port` of device `dev` may be used.
    pub fn matches(&self, dev: &str, port: u8) -> bool {
        if self.entries.is_empty() {
            return true;
        }
        let listed = self.entries.iter().any(|e| {
            let name_ok = if self.exact { dev == e.name } else { dev.starts_with(&e.name) };
            name_ok && e.port.is_none_or(|p| p == port)
        });
        listed != self.exclude
    }

    /// Whether some port of `dev` may be used (for a device whose ports are
    /// not known yet).
    pub fn admits_device(&self, dev: &str) -> bool {
        if self.entries.is_empty() {
            return true;
        }
        if !self.exclude {
            return self.entries.iter().any(|e| if self.exact { dev == e.name } else { dev.starts_with(&e.name) });
        }
        // Excluded as a whole only by an entry without a port.
        !self
            .entries
            .iter()
            .any(|e| e.port.is_none() && if self.exact { dev == e.name } else { dev.starts_with(&e.name) })
    }
}

impl fmt::Display for HcaFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.exclude {
            f.write_str("^")?;
        }
        if self.exact {
            f.write_str("=")?;
        }
        for (i, e) in self.entries.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(&e.name)?;
            if let Some(p) = e.port {
                write!(f, ":{p}")?;
            }
        }
        Ok(())
    }
}

/// The RDMA settings from the environment (see the module's table).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IbOptions {
    /// `OXCCL_IB_DISABLE`.
    pub disable: bool,
    /// `OXCCL_IB_HCA`.
    pub hca: HcaFilter,
    /// `OXCCL_IB_GID_INDEX`; `None`: automatic ([`choose_gid`]).
    pub gid_index: Option<u8>,
    /// `OXCCL_IB_TIMEOUT` (1–31).
    pub timeout: u8,
    /// `OXCCL_IB_RETRY_CNT` (0–7).
    pub retry_cnt: u8,
    /// `OXCCL_IB_RNR_RETRY` (0–7; 7: forever).
    pub rnr_retry: u8,
    /// `OXCCL_IB_SL` (0–15).
    pub sl: u8,
    /// `OXCCL_IB_TC` (0–255).
    pub tc: u8,
    /// `OXCCL_IB_QPS_PER_CONNECTION` (1–64).
    pub qps_per_connection: u32,
    /// `OXCCL_IB_CHUNK`, bytes (4 KiB–64 MiB).
    pub chunk: usize,
    /// `OXCCL_IBVERBS_LIB`; `None`: `libibverbs.so.1`.
    pub ibverbs_lib: Option<String>,
    /// `OXCCL_IB_PROVIDER`.
    pub provider: IbProvider,
}

impl Default for IbOptions {
    fn default() -> IbOptions {
        IbOptions {
            disable: false,
            hca: HcaFilter::default(),
            gid_index: None,
            timeout: 20,
            retry_cnt: 7,
            rnr_retry: 7,
            sl: 0,
            tc: 0,
            qps_per_connection: 1,
            chunk: 512 << 10,
            ibverbs_lib: None,
            provider: IbProvider::Ibv,
        }
    }
}

/// An integer variable in `lo..=hi`.
fn int_in(name: &str, v: &str, lo: u64, hi: u64, what: &str) -> Result<u64> {
    v.parse::<u64>()
        .ok()
        .filter(|x| (lo..=hi).contains(x))
        .ok_or_else(|| Error::invalid(format!("{name}={v:?}: expected an integer from {lo} to {hi} ({what})")))
}

impl IbOptions {
    /// Reads the variables through `get` (a name → its value); unset and
    /// empty values take the defaults.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<IbOptions> {
        let get = |n: &str| get(n).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let mut o = IbOptions::default();
        if let Some(v) = get("OXCCL_IB_DISABLE") {
            o.disable = match v.to_ascii_lowercase().as_str() {
                "1" | "true" | "yes" | "on" => true,
                "0" | "false" | "no" | "off" => false,
                _ => return Err(Error::invalid(format!("OXCCL_IB_DISABLE={v:?}: expected 1 (no RDMA) or 0"))),
            };
        }
        if let Some(v) = get("OXCCL_IB_HCA") {
            o.hca = HcaFilter::parse(&v)?;
        }
        if let Some(v) = get("OXCCL_IB_GID_INDEX") {
            o.gid_index = match v.to_ascii_lowercase().as_str() {
                "-1" | "auto" => None,
                _ => Some(int_in(
                    "OXCCL_IB_GID_INDEX",
                    &v,
                    0,
                    255,
                    "an index in the port's GID table, or -1 for automatic",
                )? as u8),
            };
        }
        let small = |name: &str, lo: u64, hi: u64, what: &str, dflt: u8| -> Result<u8> {
            get(name).map_or(Ok(dflt), |v| int_in(name, &v, lo, hi, what).map(|x| x as u8))
        };
        o.timeout = small("OXCCL_IB_TIMEOUT", 1, 31, "the ACK timeout is 4.096 us x 2^value; default 20", 20)?;
        o.retry_cnt = small("OXCCL_IB_RETRY_CNT", 0, 7, "transport retries; default 7", 7)?;
        o.rnr_retry = small("OXCCL_IB_RNR_RETRY", 0, 7, "receiver-not-ready retries, 7 = forever; default 7", 7)?;
        o.sl = small("OXCCL_IB_SL", 0, 15, "InfiniBand service level; default 0", 0)?;
        o.tc = small("OXCCL_IB_TC", 0, 255, "traffic class; default 0", 0)?;
        if let Some(v) = get("OXCCL_IB_QPS_PER_CONNECTION") {
            o.qps_per_connection = int_in("OXCCL_IB_QPS_PER_CONNECTION", &v, 1, 64, "default 1")? as u32;
        }
        if let Some(v) = get("OXCCL_IB_CHUNK") {
            let (lo, hi) = (4usize << 10, 64usize << 20);
            o.chunk = parse_size(&v).filter(|c| (lo..=hi).contains(c)).ok_or_else(|| {
                Error::invalid(format!(
                    "OXCCL_IB_CHUNK={v:?}: expected {SIZE_FORMS}, from 4 KiB to 64 MiB (default 512K)"
                ))
            })?;
        }
        o.ibverbs_lib = get("OXCCL_IBVERBS_LIB");
        if let Some(v) = get("OXCCL_IB_PROVIDER") {
            o.provider = match v.to_ascii_lowercase().as_str() {
                "ibv" | "verbs" | "ibverbs" => IbProvider::Ibv,
                "soft" => IbProvider::Soft,
                _ => {
                    return Err(Error::invalid(format!(
                        "OXCCL_IB_PROVIDER={v:?}: expected ibv (libibverbs, the default) or soft (the software HCA)"
                    )));
                }
            };
        }
        Ok(o)
    }
}

/// Whether a GID is an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`).
pub fn gid_is_ipv4_mapped(g: &[u8; 16]) -> bool {
    g[..10].iter().all(|&b| b == 0) && g[10] == 0xff && g[11] == 0xff
}

/// Whether a GID is an IPv6 link-local address (`fe80::/10`).
pub fn gid_is_link_local(g: &[u8; 16]) -> bool {
    g[0] == 0xfe && (g[1] & 0xc0) == 0x80
}

/// A GID in words (`::ffff:10.0.0.1`, `fe80::…`).
pub fn gid_to_string(g: &[u8; 16]) -> String {
    std::net::Ipv6Addr::from(*g).to_string()
}

/// The GID a port uses, as NCCL chooses it.
///
/// With `index` (`OXCCL_IB_GID_INDEX`): that entry, an error naming the
/// device, the port and the valid indices if the table has none there.
/// Otherwise, on Ethernet (RoCE), the first (lowest-index) of: a RoCE v2
/// IPv4-mapped GID, a RoCE v2 IPv6 GID that is not link-local, any RoCE v2
/// GID, a RoCE v1 GID, then GIDs of unknown type (no sysfs entry) in the
/// same address order (IPv4-mapped, global IPv6, link-local); on
/// InfiniBand, index 0.
pub fn choose_gid(dev: &str, port: &PortInfo, index: Option<u8>) -> Result<GidEntry> {
    let valid = || {
        if port.gids.is_empty() {
            "the table has no valid entry".to_string()
        } else {
            let list: Vec<String> = port.gids.iter().map(|g| g.index.to_string()).collect();
            format!("valid indices: {}", list.join(", "))
        }
    };
    if let Some(i) = index {
        return port.gids.iter().find(|g| g.index == i).copied().ok_or_else(|| {
            Error::invalid(format!(
                "OXCCL_IB_GID_INDEX={i}: port {} of {dev} has no GID at index {i} ({})",
                port.num,
                valid()
            ))
        });
    }
    match port.link_layer {
        LinkLayer::InfiniBand => port.gids.iter().find(|g| g.index == 0).copied().ok_or_else(|| {
            Error::System(format!("port {} of {dev} (InfiniBand) has no GID at index 0 ({})", port.num, valid()))
        }),
        LinkLayer::Ethernet => {
            let addr = |g: &GidEntry| match g.gid {
                ref a if gid_is_ipv4_mapped(a) => 0,
                ref a if !gid_is_link_local(a) => 1,
                _ => 2,
            };
            let rank = |g: &GidEntry| match g.kind {
                GidType::RoceV2 => addr(g),
                GidType::IbRoceV1 => 3,
                GidType::Unknown => 4 + addr(g),
            };
            port.gids.iter().min_by_key(|g| (rank(g), g.index)).copied().ok_or_else(|| {
                Error::System(format!(
                    "port {} of {dev} (RoCE) has no GID: give its network interface an IP address, or set \
                     OXCCL_IB_HCA to another device",
                    port.num
                ))
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rdma::verbs::PortState;
    use std::collections::HashMap;

    fn opts(vars: &[(&str, &str)]) -> Result<IbOptions> {
        let m: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        IbOptions::from_lookup(|n| m.get(n).cloned())
    }

    #[test]
    fn filter_syntax() {
        let all = HcaFilter::parse("").unwrap();
        assert!(all.matches("anything", 3) && all.admits_device("x"));

        let prefix = HcaFilter::parse("mlx5").unwrap();
        assert!(prefix.matches("mlx5_0", 1) && prefix.matches("mlx5_1", 2));
        assert!(!prefix.matches("mlx4_0", 1) && !prefix.admits_device("bnxt_re0"));

        let p0 = HcaFilter::parse("mlx5_0").unwrap();
        assert!(p0.matches("mlx5_0", 1) && !p0.matches("mlx5_1", 1) && !p0.matches("mlx5", 1));
        // NCCL's prefix match: mlx5_1 also admits mlx5_10; = does not.
        assert!(HcaFilter::parse("mlx5_1").unwrap().matches("mlx5_10", 1));
        assert!(!HcaFilter::parse("=mlx5_1").unwrap().matches("mlx5_10", 1));

        let ex = HcaFilter::parse("^mlx5_1").unwrap();
        assert!(ex.exclude && !ex.exact);
        assert!(ex.matches("mlx5_0", 1) && !ex.matches("mlx5_1", 1) && !ex.matches("mlx5_1", 2));
        assert!(!ex.admits_device("mlx5_1") && ex.admits_device("mlx5_0"));

        let exact = HcaFilter::parse("=mlx5_0:1,mlx5_1").unwrap();
        assert_eq!(
            exact.entries,
            vec![HcaEntry { name: "mlx5_0".into(), port: Some(1) }, HcaEntry { name: "mlx5_1".into(), port: None }]
        );
        assert!(exact.exact && !exact.exclude);
        assert!(exact.matches("mlx5_0", 1) && !exact.matches("mlx5_0", 2));
        assert!(exact.matches("mlx5_1", 1) && exact.matches("mlx5_1", 2));
        assert!(!exact.matches("mlx5_10", 1) && !exact.matches("mlx5", 1));
        assert!(exact.admits_device("mlx5_0") && !exact.admits_device("mlx5_2"));
        assert_eq!(exact.to_string(), "=mlx5_0:1,mlx5_1");

        let ex_port = HcaFilter::parse("^=mlx5_0:2").unwrap();
        assert!(ex_port.matches("mlx5_0", 1) && !ex_port.matches("mlx5_0", 2) && ex_port.admits_device("mlx5_0"));
        assert_eq!(HcaFilter::parse(" mlx5_0 , , mlx5_1:1 ").unwrap().entries.len(), 2);

        for bad in ["mlx5_0:x", "mlx5_0:0", "mlx5_0:256", ":1", "=:1", "mlx 5"] {
            let e = HcaFilter::parse(bad).unwrap_err().to_string();
            assert!(e.contains("OXCCL_IB_HCA") && e.contains(&format!("{bad:?}")), "{bad}: {e}");
        }
    }

    #[test]
    fn defaults_and_values() {
        let d = opts(&[]).unwrap();
        assert_eq!(d, IbOptions::default());
        assert_eq!((d.timeout, d.retry_cnt, d.rnr_retry, d.sl, d.tc), (20, 7, 7, 0, 0));
        assert_eq!((d.qps_per_connection, d.chunk, d.gid_index), (1, 512 << 10, None));
        assert!(!d.disable && d.ibverbs_lib.is_none() && d.provider == IbProvider::Ibv);

        let o = opts(&[
            ("OXCCL_IB_DISABLE", "1"),
            ("OXCCL_IB_HCA", "^=mlx5_1"),
            ("OXCCL_IB_GID_INDEX", "3"),
            ("OXCCL_IB_TIMEOUT", "22"),
            ("OXCCL_IB_RETRY_CNT", "0"),
            ("OXCCL_IB_RNR_RETRY", "6"),
            ("OXCCL_IB_SL", "15"),
            ("OXCCL_IB_TC", "106"),
            ("OXCCL_IB_QPS_PER_CONNECTION", "4"),
            ("OXCCL_IB_CHUNK", "128K"),
            ("OXCCL_IBVERBS_LIB", "/opt/lib/libibverbs.so.1"),
            ("OXCCL_IB_PROVIDER", "soft"),
        ])
        .unwrap();
        assert!(o.disable && o.hca.exclude && o.hca.exact);
        assert_eq!((o.gid_index, o.timeout, o.retry_cnt, o.rnr_retry, o.sl, o.tc), (Some(3), 22, 0, 6, 15, 106));
        assert_eq!((o.qps_per_connection, o.chunk), (4, 128 << 10));
        assert_eq!(o.ibverbs_lib.as_deref(), Some("/opt/lib/libibverbs.so.1"));
        assert_eq!(o.provider, IbProvider::Soft);

        assert_eq!(opts(&[("OXCCL_IB_CHUNK", "1M")]).unwrap().chunk, 1 << 20);
        assert_eq!(opts(&[("OXCCL_IB_CHUNK", "4096")]).unwrap().chunk, 4096);
        assert_eq!(opts(&[("OXCCL_IB_GID_INDEX", "-1")]).unwrap().gid_index, None);
        assert!(!opts(&[("OXCCL_IB_DISABLE", "off")]).unwrap().disable);
        assert_eq!(opts(&[("OXCCL_IB_TIMEOUT", "  ")]).unwrap().timeout, 20, "blank is unset");
    }

    #[test]
    fn bad_values_name_variable_value_and_range() {
        let cases: &[(&str, &str, &str)] = &[
            ("OXCCL_IB_TIMEOUT", "0", "1 to 31"),
            ("OXCCL_IB_TIMEOUT", "32", "1 to 31"),
            ("OXCCL_IB_TIMEOUT", "fast", "1 to 31"),
            ("OXCCL_IB_RETRY_CNT", "8", "0 to 7"),
            ("OXCCL_IB_RNR_RETRY", "-1", "0 to 7"),
            ("OXCCL_IB_SL", "16", "0 to 15"),
            ("OXCCL_IB_TC", "256", "0 to 255"),
            ("OXCCL_IB_QPS_PER_CONNECTION", "0", "1 to 64"),
            ("OXCCL_IB_QPS_PER_CONNECTION", "65", "1 to 64"),
            ("OXCCL_IB_CHUNK", "1K", "4 KiB to 64 MiB"),
            ("OXCCL_IB_CHUNK", "128M", "4 KiB to 64 MiB"),
            ("OXCCL_IB_CHUNK", "lots", "4 KiB to 64 MiB"),
            ("OXCCL_IB_GID_INDEX", "256", "0 to 255"),
            ("OXCCL_IB_DISABLE", "maybe", "1"),
            ("OXCCL_IB_PROVIDER", "efa", "soft"),
            ("OXCCL_IB_HCA", "mlx5_0:a", "port"),
        ];
        for (name, value, range) in cases {
            let e = opts(&[(name, value)]).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
            let m = e.to_string();
            assert!(m.contains(name) && m.contains(&format!("{value:?}")) && m.contains(range), "{name}={value}: {m}");
        }
    }

    fn gid(index: u8, kind: GidType, g: [u8; 16]) -> GidEntry {
        GidEntry { index, gid: g, kind }
    }
    fn v4(a: u8) -> [u8; 16] {
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, a]
    }
    fn link_local() -> [u8; 16] {
        [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 2, 1, 2, 0xff, 0xfe, 3, 4, 5]
    }
    fn global6() -> [u8; 16] {
        [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7]
    }
    fn port(link_layer: LinkLayer, gids: Vec<GidEntry>) -> PortInfo {
        PortInfo { num: 1, state: PortState::Active, link_layer, lid: 0, active_mtu: 5, bw: 12.5e9, gids }
    }

    #[test]
    fn gid_choice() {
        use GidType::*;
        // A typical mlx5 RoCE table: v1 and v2 for each address.
        let typical = port(
            LinkLayer::Ethernet,
            vec![
                gid(0, IbRoceV1, link_local()),
                gid(1, RoceV2, link_local()),
                gid(2, IbRoceV1, v4(1)),
                gid(3, RoceV2, v4(1)),
                gid(4, IbRoceV1, global6()),
                gid(5, RoceV2, global6()),
            ],
        );
        assert_eq!(choose_gid("mlx5_0", &typical, None).unwrap().index, 3);
        // No IPv4: the global IPv6 v2 entry, not the link-local one.
        let v6: Vec<_> = typical.gids.iter().copied().filter(|g| !gid_is_ipv4_mapped(&g.gid)).collect();
        assert_eq!(choose_gid("mlx5_0", &port(LinkLayer::Ethernet, v6), None).unwrap().index, 5);
        // Only link-local: any v2 beats v1.
        let ll = vec![gid(0, IbRoceV1, link_local()), gid(1, RoceV2, link_local())];
        assert_eq!(choose_gid("mlx5_0", &port(LinkLayer::Ethernet, ll), None).unwrap().index, 1);
        // Only v1 entries: the IPv4 one is not preferred over a lower index.
        let v1 = vec![gid(2, IbRoceV1, v4(2)), gid(0, IbRoceV1, link_local())];
        assert_eq!(choose_gid("mlx5_0", &port(LinkLayer::Ethernet, v1), None).unwrap().index, 0);
        // Types unknown (no sysfs): after v1, by address (IPv4, global, link-local).
        let unk = vec![gid(4, Unknown, v4(3)), gid(2, Unknown, link_local()), gid(3, Unknown, global6())];
        assert_eq!(choose_gid("x", &port(LinkLayer::Ethernet, unk.clone()), None).unwrap().index, 4);
        assert_eq!(choose_gid("x", &port(LinkLayer::Ethernet, unk[1..].to_vec()), None).unwrap().index, 3);
        let with_v1 = vec![gid(4, Unknown, v4(3)), gid(5, IbRoceV1, link_local())];
        assert_eq!(choose_gid("x", &port(LinkLayer::Ethernet, with_v1), None).unwrap().index, 5);
        // Two IPv4 v2 entries: the lower index.
        let two = vec![gid(7, RoceV2, v4(9)), gid(6, RoceV2, v4(8))];
        assert_eq!(choose_gid("x", &port(LinkLayer::Ethernet, two), None).unwrap().index, 6);
        // InfiniBand: index 0 whatever else the table holds.
        let ib = port(LinkLayer::InfiniBand, vec![gid(1, IbRoceV1, global6()), gid(0, IbRoceV1, link_local())]);
        assert_eq!(choose_gid("mlx5_0", &ib, None).unwrap().index, 0);
        // An explicit index wins, even on Ethernet.
        assert_eq!(choose_gid("mlx5_0", &typical, Some(0)).unwrap().index, 0);
        let e = choose_gid("mlx5_0", &typical, Some(9)).unwrap_err().to_string();
        assert!(e.contains("port 1 of mlx5_0") && e.contains("0, 1, 2, 3, 4, 5") && e.contains("index 9"), "{e}");
        // Empty tables.
        let e = choose_gid("mlx5_2", &port(LinkLayer::Ethernet, vec![]), None).unwrap_err().to_string();
        assert!(e.contains("mlx5_2") && e.contains("no GID"), "{e}");
        assert!(choose_gid("mlx5_2", &port(LinkLayer::InfiniBand, vec![]), None).is_err());
        assert!(
            choose_gid("mlx5_2", &port(LinkLayer::Ethernet, vec![]), Some(0))
                .unwrap_err()
                .to_string()
                .contains("no valid entry")
        );
    }

    #[test]
    fn gid_words() {
        assert!(gid_is_ipv4_mapped(&v4(1)) && !gid_is_ipv4_mapped(&link_local()));
        assert!(gid_is_link_local(&link_local()) && !gid_is_link_local(&global6()));
        assert_eq!(gid_to_string(&v4(1)), "::ffff:10.0.0.1");
    }
}
