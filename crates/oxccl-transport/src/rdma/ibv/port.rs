//! Port attributes: `ibv_query_port` (the compat call, see `sys`), the GID
//! table (`ibv_query_gid`, all-zero entries skipped, types from sysfs) and
//! the link speed.
//!
//! Speed = lanes × per-lane rate. `active_width`: 1, 2, 4, 8, 16 = 1x, 4x,
//! 8x, 12x, 2x lanes. `active_speed`: 1, 2, 4, 8, 16, 32, 64, 128 = 2.5
//! (SDR), 5 (DDR), 10 (QDR), 10 (FDR10), 14 (FDR), 25 (EDR), 50 (HDR), 100
//! (NDR) Gb/s per lane (NCCL's `ibvSpeeds`). XDR and later are reported only
//! in `active_speed_ex`, beyond the compat struct; for them, and wherever
//! the tables give nothing, sysfs `rate` (`800 Gb/sec (4X XDR)`) is read;
//! where that fails too, 100 Gb/s is assumed.

use super::Ctx;
use super::sys;
use crate::Result;
use crate::rdma::verbs::{GidEntry, GidType, LinkLayer, PortInfo, PortState, verbs_error};

impl Ctx {
    /// Queries port `port`; its GID table included.
    pub(super) fn port_info(&self, port: u8) -> Result<PortInfo> {
        let mut pa = sys::IbvPortAttr::default();
        // SAFETY: `pa` is zeroed and at least COMPAT_PORT_ATTR_SIZE bytes, what
        // ibv_query_port@IBVERBS_1.1 writes (verbs.h's inline does the same).
        let rc = unsafe { (self.lib.f.query_port)(self.ctx, port, &mut pa) };
        if rc != 0 {
            return Err(verbs_error(&format!("ibv_query_port (port {port})"), &self.name, rc.abs()));
        }
        let link_layer =
            if pa.link_layer == sys::IBV_LINK_LAYER_ETHERNET { LinkLayer::Ethernet } else { LinkLayer::InfiniBand };
        let mut gids = Vec::new();
        for index in 0..pa.gid_tbl_len.clamp(0, 256) {
            let mut g = sys::IbvGid::default();
            // SAFETY: `g` is a valid out-pointer of 16 bytes.
            let rc = unsafe { (self.lib.f.query_gid)(self.ctx, port, index, &mut g) };
            if rc != 0 || g.raw.iter().all(|&b| b == 0) {
                continue;
            }
            let kind = match sysfs(&self.name, port, &format!("gid_attrs/types/{index}")).as_deref() {
                Some("IB/RoCE v1") => GidType::IbRoceV1,
                Some("RoCE v2") => GidType::RoceV2,
                _ => GidType::Unknown,
            };
            gids.push(GidEntry { index: index as u8, gid: g.raw, kind });
        }
        let bw = match (width_lanes(pa.active_width), lane_gbps(pa.active_speed)) {
            (Some(l), Some(s)) => l * s,
            _ => sysfs(&self.name, port, "rate").and_then(|r| parse_rate_gbps(&r)).unwrap_or(100.0),
        } * 1e9
            / 8.0;
        Ok(PortInfo {
            num: port,
            state: PortState::from_raw(pa.state),
            link_layer,
            lid: pa.lid,
            active_mtu: pa.active_mtu as u8,
            bw,
            gids,
        })
    }
}

/// `/sys/class/infiniband/<dev>/ports/<port>/<rel>`, trimmed.
fn sysfs(dev: &str, port: u8, rel: &str) -> Option<String> {
    std::fs::read_to_string(format!("/sys/class/infiniband/{dev}/ports/{port}/{rel}"))
        .ok()
        .map(|s| s.trim().to_string())
}

/// Lanes of an `active_width` (IBTA encoding).
fn width_lanes(w: u8) -> Option<f64> {
    Some(match w {
        1 => 1.0,
        2 => 4.0,
        4 => 8.0,
        8 => 12.0,
        16 => 2.0,
        _ => return None,
    })
}

/// Gb/s per lane of an `active_speed` (NCCL's `ibvSpeeds`).
fn lane_gbps(s: u8) -> Option<f64> {
    Some(match s {
        1 => 2.5,
        2 => 5.0,
        4 => 10.0,
        8 => 10.0,
        16 => 14.0,
        32 => 25.0,
        64 => 50.0,
        128 => 100.0,
        _ => return None,
    })
}

/// The Gb/s of a sysfs `rate` ("400 Gb/sec (4X NDR)").
fn parse_rate_gbps(r: &str) -> Option<f64> {
    r.split_whitespace().next()?.parse::<f64>().ok().filter(|g| *g > 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        assert_eq!(width_lanes(2).zip(lane_gbps(32)).map(|(l, s)| l * s), Some(100.0));
        assert_eq!(width_lanes(2).zip(lane_gbps(128)).map(|(l, s)| l * s), Some(400.0));
        assert_eq!(width_lanes(16).zip(lane_gbps(64)).map(|(l, s)| l * s), Some(100.0));
        assert_eq!(lane_gbps(0), None);
        assert_eq!(width_lanes(3), None);
        assert_eq!(parse_rate_gbps("400 Gb/sec (4X NDR)"), Some(400.0));
        assert_eq!(parse_rate_gbps("junk"), None);
    }

    #[test]
    fn sysfs_absent_is_none() {
        assert_eq!(sysfs("no_such_dev", 1, "rate"), None);
    }
}
