//! Watching the interfaces a provider's rails go over: a rail whose
//! interface is set down, loses its carrier or vanishes is an error of
//! the rank within a second (a shorter flap is no failure), naming the
//! rail and its interface, instead of a timeout after `OXCCL_TIMEOUT`. Nothing moves
//! to another rail: the channels on a failed rail fail with it.

use crate::{Error, Result};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long an interface may be down (set down, no carrier) before its
/// rail fails: a carrier flap (a NIC's firmware reset, a reseated cable)
/// that TCP and RC queue pairs survive is no failure. An interface that
/// vanished fails at once.
const GRACE: Duration = Duration::from_secs(1);

/// Why an interface cannot carry traffic, from its sysfs directory
/// (`/sys/class/net/<name>`): `None` while it is up with a carrier.
pub(crate) fn down_reason(dir: &Path) -> Option<&'static str> {
    if !dir.exists() {
        return Some("gone");
    }
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).map(|s| s.trim().to_string());
    let flags = read("flags").ok().and_then(|f| u32::from_str_radix(f.trim_start_matches("0x"), 16).ok());
    if flags.is_some_and(|f| f & libc::IFF_UP as u32 == 0) {
        return Some("set down");
    }
    // `carrier` reads 0 without a carrier (a veth whose peer is down, a
    // pulled cable) and fails while the interface is down.
    match read("carrier").as_deref() {
        Ok("0") => Some("no carrier"),
        _ => None,
    }
}

/// The rails of one provider on this rank, and which of them carry a
/// channel.
pub(crate) struct RailWatch {
    rank: usize,
    /// What the provider says before the rail ("tcp", "RDMA (soft HCA)").
    what: &'static str,
    /// Each rail's interface and its sysfs directory (`None`: not an
    /// interface of this host's, or not one there was at start).
    rails: Vec<(String, Option<PathBuf>)>,
    used: Vec<bool>,
    /// Since when each rail's interface has been down.
    down_since: Vec<Option<Instant>>,
    failed: Option<Error>,
}

impl RailWatch {
    /// Watches `names`' interfaces (rail `i` on `names[i]`); an interface
    /// not found in sysfs now is never watched.
    pub(crate) fn new(rank: usize, what: &'static str, names: &[String]) -> RailWatch {
        let rails = names
            .iter()
            .map(|n| {
                let dir = Path::new("/sys/class/net").join(n);
                let watched = !n.is_empty() && !n.contains('/') && dir.exists();
                (n.clone(), watched.then_some(dir))
            })
            .collect();
        RailWatch {
            rank,
            what,
            rails,
            used: vec![false; names.len()],
            down_since: vec![None; names.len()],
            failed: None,
        }
    }

    /// Keeps the first `n` rails (the rest are closed).
    pub(crate) fn truncate(&mut self, n: usize) {
        self.rails.truncate(n);
        self.used.truncate(n);
        self.down_since.truncate(n);
    }

    /// Rail `i` carries a channel from now on.
    pub(crate) fn used(&mut self, i: usize) {
        if let Some(u) = self.used.get_mut(i) {
            *u = true;
        }
    }

    /// An error naming the first rail in use whose interface is down (two
    /// small sysfs reads per rail: the fabric checks every 50 ms while
    /// it waits, and at once when a peer failed); once failed, stays
    /// failed. With `peer_failed` there is no grace: the peer at the
    /// other end of a down rail fails too, often first (its side went
    /// down a check earlier), and its failure is this rail's, not a
    /// second cause.
    pub(crate) fn check(&mut self, peer_failed: bool) -> Result<()> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let n = self.rails.len();
        for (i, (name, dir)) in self.rails.iter().enumerate() {
            let Some(dir) = dir.as_ref().filter(|_| self.used[i]) else { continue };
            let why = down_reason(dir);
            let since = match why {
                None => {
                    self.down_since[i] = None;
                    continue;
                }
                Some(_) => *self.down_since[i].get_or_insert_with(Instant::now),
            };
            if let Some(why) = why.filter(|&w| w == "gone" || peer_failed || since.elapsed() >= GRACE) {
                let e = Error::System(format!(
                    "rank {}: {} rail {} of {n} ({name}) is down ({why}): the channels on it cannot reach their \
                     peers, and traffic does not move to another rail",
                    self.rank,
                    self.what,
                    i + 1
                ));
                tracing::warn!("{e}");
                self.failed = Some(e.clone());
                return Err(e);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(flags: &str, carrier: Option<&str>) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("flags"), flags).unwrap();
        if let Some(c) = carrier {
            std::fs::write(d.path().join("carrier"), c).unwrap();
        }
        d
    }

    #[test]
    fn an_interface_is_down_when_set_down_without_carrier_or_gone() {
        assert_eq!(down_reason(fake("0x1003\n", Some("1\n")).path()), None);
        assert_eq!(down_reason(fake("0x1002\n", None).path()), Some("set down"));
        assert_eq!(down_reason(fake("0x1003\n", Some("0\n")).path()), Some("no carrier"));
        assert_eq!(down_reason(Path::new("/sys/class/net/no-such-interface-here")), Some("gone"));
    }

    #[test]
    fn only_rails_in_use_fail_and_the_error_names_the_rail() {
        let (up, down) = (fake("0x1003", Some("1")), fake("0x1003", Some("0")));
        let mut w = RailWatch::new(3, "tcp", &["eth0".into(), "eth1".into()]);
        w.rails[0].1 = Some(up.path().to_path_buf());
        w.rails[1].1 = Some(down.path().to_path_buf());
        w.used(0);
        assert!(w.check(false).is_ok(), "rail 2 is down but carries no channel");
        w.used(1);
        // Down for less than the grace: a flap, no failure yet...
        assert!(w.check(false).is_ok(), "a carrier lost just now");
        // ...unless a peer failed meanwhile: then the rail is the cause.
        let mut eager = RailWatch::new(3, "tcp", &["eth1".into()]);
        eager.rails[0].1 = Some(down.path().to_path_buf());
        eager.used(0);
        let e = eager.check(true).unwrap_err().to_string();
        assert!(e.contains("rail 1 of 1 (eth1)") && e.contains("no carrier"), "{e}");
        w.down_since[1] = Some(Instant::now() - GRACE);
        let e = w.check(false).unwrap_err().to_string();
        assert!(e.contains("rank 3") && e.contains("rail 2 of 2 (eth1)") && e.contains("no carrier"), "{e}");
        // Failed stays failed, even once the interface is back.
        std::fs::write(down.path().join("carrier"), "1").unwrap();
        assert!(w.check(false).is_err());
    }

    #[test]
    fn names_that_are_no_interface_are_not_watched() {
        let mut w = RailWatch::new(0, "tcp", &["default".into(), String::new()]);
        w.used(0);
        w.used(1);
        assert!(w.check(false).is_ok());
    }
}
