//! `split`: new communicators from groups of this one's ranks, and
//! `from_env`: a communicator from the variables launchers set.

use crate::comm::Communicator;
use crate::config::Config;
use oxccl_core::{Error, Result};
use oxccl_transport::id::UniqueId;
use std::net::{SocketAddr, ToSocketAddrs};

impl Communicator {
    /// Splits the ranks by `color` (`None`: this rank joins no new
    /// communicator, NCCL's `NCCL_SPLIT_NOCOLOR`), ordered by `key` then by
    /// rank. Collective over this communicator; the new one has this one's
    /// configuration.
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Communicator>> {
        let me = self.rank();
        let mut mine = Vec::with_capacity(9);
        mine.push(color.is_some() as u8);
        mine.extend_from_slice(&color.unwrap_or(0).to_le_bytes());
        mine.extend_from_slice(&key.to_le_bytes());
        let all = self.boot().all_gather(&mine)?;
        let mut members: Vec<(i32, usize)> = Vec::new();
        for (r, v) in all.iter().enumerate() {
            if v.len() != 9 {
                return Err(Error::Remote(format!("split: rank {r} sent a malformed color")));
            }
            let c = u32::from_le_bytes(v[1..5].try_into().expect("4 bytes"));
            let k = i32::from_le_bytes(v[5..9].try_into().expect("4 bytes"));
            if v[0] == 1 && Some(c) == color {
                members.push((k, r));
            }
        }
        members.sort();
        let new_rank = members.iter().position(|&(_, r)| r == me);
        // Round two: each color's first member publishes a fresh id.
        let leader = color.is_some() && new_rank == Some(0);
        let id = if leader { Some(self.config().unique_id()?) } else { None };
        let ids = self.boot().all_gather(id.as_ref().map(|i| &i.as_bytes()[..]).unwrap_or(&[]))?;
        let (Some(new_rank), Some(&(_, first))) = (new_rank, members.first()) else {
            return Ok(None);
        };
        let bytes: &[u8; UniqueId::SIZE] = ids[first]
            .as_slice()
            .try_into()
            .map_err(|_| Error::Remote(format!("split: rank {first} published no id for its color")))?;
        let id = UniqueId::from_bytes(bytes)?;
        Communicator::init(&id, members.len(), new_rank, self.config().clone()).map(Some)
    }

    /// A new communicator of this one's ranks but those in `exclude`
    /// (NCCL's `ncclCommShrink`), numbered in this one's order; only the
    /// remaining ranks call it, and they must all pass the same list. The
    /// new communicator's id travels from its rank 0 over this
    /// communicator, which must therefore still be usable.
    pub fn shrink(&self, exclude: &[usize]) -> Result<Communicator> {
        let (stay, new_rank) = self.staying(exclude)?;
        let mut bytes = [0u8; UniqueId::SIZE];
        if new_rank == 0 {
            bytes = *self.config().unique_id()?.as_bytes();
            let sent = bytes;
            self.group(|g| {
                for &r in &stay[1..] {
                    g.send(&sent, r);
                }
            })?;
        } else {
            self.recv(&mut bytes, stay[0])?;
        }
        let id = UniqueId::from_bytes(&bytes)?;
        Communicator::init(&id, stay.len(), new_rank, self.config().clone())
    }

    /// [`shrink`](Communicator::shrink) after a failure (NCCL's
    /// `NCCL_SHRINK_ABORT`): stops this rank's work on this communicator
    /// first (without disturbing ranks still finishing theirs), and needs
    /// nothing of it but what every rank learnt at init, so the excluded
    /// ranks may be dead and this communicator poisoned. Every remaining
    /// rank derives the same rendezvous: the new rank 0's address (from
    /// this communicator's peer table) and a port and nonce computed from
    /// this communicator's id, the list and how many such shrinks it has
    /// made; the new rank 0 binds that port (an error if it is taken).
    pub fn shrink_after_failure(&self, exclude: &[usize]) -> Result<Communicator> {
        let (stay, new_rank) = self.staying(exclude)?;
        self.stop_locally("the communicator was shrunk after a failure (NCCL_SHRINK_ABORT); use the new one");
        let ip = self.boot().peers()[stay[0]].addr;
        let nonce: String = self.id().nonce().iter().map(|b| format!("{b:02x}")).collect();
        let key = format!("oxccl-shrink/{nonce}/{}/{exclude:?}", self.next_shrink());
        let port = port_from("shrink-port", key.as_bytes());
        // The secret comes from the parent's, which never travelled.
        let id = UniqueId::for_env(SocketAddr::new(ip, port), &key)
            .with_secret_from(&[&self.id().secret()[..], key.as_bytes()].concat());
        Communicator::init(&id, stay.len(), new_rank, self.config().clone()).map_err(|e| match e {
            Error::System(m) => Error::System(format!(
                "shrink: the new communicator's rendezvous {ip}:{port} (derived, so every rank finds it): {m}"
            )),
            other => other,
        })
    }

    /// The ranks that stay when `exclude` leave, and this rank's place
    /// among them (an error names a bad list).
    fn staying(&self, exclude: &[usize]) -> Result<(Vec<usize>, usize)> {
        let (me, n) = (self.rank(), self.size());
        let mut out = vec![false; n];
        for &r in exclude {
            if r >= n {
                return Err(Error::invalid(format!(
                    "rank {me}: shrink: excluded rank {r} is out of range for {n} ranks"
                )));
            }
            out[r] = true;
        }
        if out[me] {
            return Err(Error::invalid(format!(
                "rank {me}: shrink: this rank is in the exclude list; only the ranks that stay call shrink"
            )));
        }
        let stay: Vec<usize> = (0..n).filter(|&r| !out[r]).collect();
        let new_rank = stay.iter().position(|&r| r == me).expect("this rank stays");
        Ok((stay, new_rank))
    }

    /// A communicator from the environment a launcher set: torchrun
    /// (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`), Open MPI
    /// (`OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`), PMI (`PMI_RANK`,
    /// `PMI_SIZE`) or Slurm (`SLURM_PROCID`, `SLURM_NTASKS`); the
    /// rendezvous address, where rank 0 listens, is `OXCCL_ADDR`
    /// (host:port), else `MASTER_ADDR` with a port derived from
    /// `MASTER_PORT` and the job (torchrun's store listens on
    /// `MASTER_PORT` itself; see [`Launch::addr`]).
    ///
    /// Connections prove they know the communicator's secret: set it with
    /// `OXCCL_SECRET` (a passphrase) or `OXCCL_SECRET_FILE` (a file only
    /// the job can read), the same on every rank. Without either, the
    /// secret is derived from the address and the job key, which anyone
    /// who knows them can compute (a warning says so once).
    pub fn from_env() -> Result<Communicator> {
        // Logging starts first: what the launch path warns must be seen.
        crate::config::init_logging();
        let env = Launch::from_vars(|k| std::env::var(k).ok())?;
        let id = with_launch_secret(UniqueId::for_env(env.addr, &env.job), |k| std::env::var(k).ok())?;
        Communicator::init(&id, env.size, env.rank, Config::default()).map_err(|e| env.explain(e))
    }
}

/// `id` with the secret `OXCCL_SECRET` or `OXCCL_SECRET_FILE` gives (read
/// through `get`); unchanged, with a warning once, when neither is set
/// (logging starts here if it has not: tools call this before any
/// communicator exists).
pub fn with_launch_secret(id: UniqueId, get: impl Fn(&str) -> Option<String>) -> Result<UniqueId> {
    if let Some(s) = get("OXCCL_SECRET").filter(|s| !s.is_empty()) {
        return Ok(id.with_secret_from(s.as_bytes()));
    }
    if let Some(path) = get("OXCCL_SECRET_FILE").filter(|s| !s.is_empty()) {
        let bytes = std::fs::read(&path)
            .map_err(|e| Error::invalid(format!("OXCCL_SECRET_FILE={path:?}: cannot read it: {e}")))?;
        if bytes.is_empty() {
            return Err(Error::invalid(format!("OXCCL_SECRET_FILE={path:?} is empty")));
        }
        return Ok(id.with_secret_from(&bytes));
    }
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        crate::config::init_logging();
        tracing::warn!(
            "no OXCCL_SECRET or OXCCL_SECRET_FILE: the communicator's secret is derived from the rendezvous \
             address and the job key, so anyone who knows both can join; set one of them on every rank"
        )
    });
    Ok(id)
}

/// What a launcher told this process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// This process's rank.
    pub rank: usize,
    /// Number of ranks.
    pub size: usize,
    /// Rank on this host, when the launcher says.
    pub local_rank: Option<usize>,
    /// Where rank 0 listens: `OXCCL_ADDR`, else `MASTER_ADDR` and a port
    /// of 10000..31999 derived from `MASTER_PORT` and the job key (never
    /// `MASTER_PORT`, where torchrun's store listens).
    pub addr: SocketAddr,
    /// Where the address came from, for error messages.
    pub addr_from: String,
    /// A key shared by the job's ranks (job id, else the address).
    pub job: String,
    /// Which launcher's variables were used.
    pub launcher: &'static str,
}

impl Launch {
    /// Reads the variables through `get` (so tests need not touch the
    /// process environment).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Launch> {
        let sets: [(&'static str, &str, &str, &str); 4] = [
            ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
            ("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
            ("PMI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
            ("Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
        ];
        let num = |name: &str| -> Result<Option<usize>> {
            match get(name) {
                None => Ok(None),
                Some(v) => {
                    v.trim().parse().map(Some).map_err(|_| Error::invalid(format!("{name}={v:?} is not a number")))
                }
            }
        };
        let mut found = None;
        for (launcher, r, s, l) in sets {
            if let (Some(rank), Some(size)) = (num(r)?, num(s)?) {
                found = Some((launcher, rank, size, num(l)?));
                break;
            }
        }
        let Some((launcher, rank, size, local_rank)) = found else {
            return Err(Error::invalid(
                "no launcher variables: set RANK and WORLD_SIZE (torchrun), OMPI_COMM_WORLD_RANK/SIZE (Open MPI), \
                 PMI_RANK/SIZE or SLURM_PROCID/NTASKS",
            ));
        };
        if size == 0 || rank >= size {
            return Err(Error::invalid(format!("{launcher}: rank {rank} is out of range for {size} ranks")));
        }
        let resolve = |text: &str, var: &str| {
            text.to_socket_addrs().ok().and_then(|mut a| a.next()).ok_or_else(|| {
                Error::invalid(format!("rendezvous address {text:?} ({var}) does not resolve to a host and port"))
            })
        };
        let job_var = ["OXCCL_JOB", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "OMPI_MCA_ess_base_jobid", "PMI_JOBID"]
            .iter()
            .find_map(|k| get(k));
        let (addr, addr_from, job) = match (get("OXCCL_ADDR"), get("MASTER_ADDR"), get("MASTER_PORT")) {
            (Some(a), _, _) => {
                let addr = resolve(&a, "OXCCL_ADDR")?;
                (addr, format!("OXCCL_ADDR={a}"), job_var.unwrap_or_else(|| format!("{addr}/{size}")))
            }
            (None, Some(h), Some(p)) => {
                let master = resolve(&format!("{h}:{p}"), "MASTER_ADDR:MASTER_PORT")?;
                let job = job_var.unwrap_or_else(|| format!("{master}/{size}"));
                let port = derived_port(master.port(), &job);
                (
                    SocketAddr::new(master.ip(), port),
                    format!(
                        "MASTER_ADDR={h} and port {port}, derived from MASTER_PORT={p}, where torchrun's store listens"
                    ),
                    job,
                )
            }
            _ => {
                return Err(Error::invalid(format!(
                    "{launcher} variables found, but no rendezvous address: set OXCCL_ADDR=host:port (a free port on \
                     rank 0's host), or MASTER_ADDR and MASTER_PORT"
                )));
            }
        };
        Ok(Launch { rank, size, local_rank, addr, addr_from, job, launcher })
    }

    /// `e` from the init of a communicator at this launch's address, with
    /// which variable to set where the address is at fault.
    pub fn explain(&self, e: Error) -> Error {
        let hint = format!(
            " (the rendezvous address came from {}: set OXCCL_ADDR=host:port to a free port on rank 0's host, the \
             same on every rank, to choose another)",
            self.addr_from
        );
        match e {
            Error::System(m) if m.contains("cannot listen") => Error::System(format!("{m}{hint}")),
            Error::Timeout(m) if m.contains("could not reach rank 0") => Error::Timeout(format!("{m}{hint}")),
            other => other,
        }
    }
}

/// Lowest and count of the ports [`port_from`] derives: 10000 to 31999,
/// below Linux's ephemeral range, where outgoing connections take theirs.
const DERIVED_PORTS: (u16, u16) = (10_000, 22_000);

/// A port every rank derives alike from `label` and `material`.
fn port_from(label: &str, material: &[u8]) -> u16 {
    let h = oxccl_transport::auth::derive(label, material);
    DERIVED_PORTS.0 + u16::from_le_bytes([h[0], h[1]]) % DERIVED_PORTS.1
}

/// The rendezvous port derived from torchrun's `MASTER_PORT` and the job:
/// the same on every rank, never `master` itself.
fn derived_port(master: u16, job: &str) -> u16 {
    let (low, count) = DERIVED_PORTS;
    let port = port_from("launch-port", format!("{master}/{job}").as_bytes());
    if port == master { low + (port - low + 1) % count } else { port }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(kv: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn the_derived_port_is_stable_in_range_and_never_the_master_port() {
        for master in [10_000u16, 29_500, 31_999, 40_000] {
            for job in ["a", "b", "torchrun-run-7"] {
                let p = derived_port(master, job);
                assert!((10_000..32_000).contains(&p) && p != master, "{master} {job}: {p}");
                assert_eq!(p, derived_port(master, job));
            }
        }
        assert_ne!(derived_port(29_500, "a"), derived_port(29_501, "a"));
    }

    #[test]
    fn launchers() {
        let t = Launch::from_vars(vars(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
        ]))
        .unwrap();
        assert_eq!((t.rank, t.size, t.local_rank, t.launcher), (3, 4, Some(1), "torchrun"));
        // Not torchrun's own port: its store listens there.
        assert_eq!(t.addr.ip(), "127.0.0.1".parse::<std::net::IpAddr>().unwrap());
        assert_eq!(t.addr.port(), derived_port(29500, "127.0.0.1:29500/4"));
        assert!(t.addr_from.contains("MASTER_PORT=29500"), "{}", t.addr_from);
        let e = t.explain(Error::System("rank 0 cannot listen on x".into())).to_string();
        assert!(e.contains("set OXCCL_ADDR=host:port") && e.contains("derived from MASTER_PORT"), "{e}");
        let o = Launch::from_vars(vars(&[
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("OXCCL_ADDR", "127.0.0.1:5000"),
        ]))
        .unwrap();
        assert_eq!((o.rank, o.size, o.launcher), (0, 2, "Open MPI"));
        let p =
            Launch::from_vars(vars(&[("PMI_RANK", "1"), ("PMI_SIZE", "2"), ("OXCCL_ADDR", "127.0.0.1:1")])).unwrap();
        assert_eq!(p.launcher, "PMI");
        let s = Launch::from_vars(vars(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_JOB_ID", "77"),
            ("OXCCL_ADDR", "127.0.0.1:1"),
        ]))
        .unwrap();
        assert_eq!((s.rank, s.local_rank, s.job.as_str(), s.launcher), (5, Some(1), "77", "Slurm"));
        let e = Launch::from_vars(vars(&[("RANK", "4"), ("WORLD_SIZE", "4"), ("OXCCL_ADDR", "127.0.0.1:1")]));
        assert!(e.unwrap_err().to_string().contains("rank 4 is out of range for 4"));
        let e = Launch::from_vars(vars(&[("RANK", "0"), ("WORLD_SIZE", "4")])).unwrap_err().to_string();
        assert!(e.contains("MASTER_ADDR"), "{e}");
        assert!(Launch::from_vars(vars(&[])).unwrap_err().to_string().contains("RANK"));
        let e = Launch::from_vars(vars(&[("RANK", "x"), ("WORLD_SIZE", "4")])).unwrap_err().to_string();
        assert!(e.contains("RANK=\"x\""), "{e}");
    }
}
