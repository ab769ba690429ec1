//! Finding the program and starting one rank of it.

use crate::cli::{Cli, Transport};
use std::ffi::{OsStr, OsString};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

fn executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The file `name` runs: itself when it has a slash, else the first
/// executable file of that name in `PATH`. The error names the program.
pub fn resolve(name: &OsStr, path_var: Option<&OsStr>) -> Result<PathBuf, String> {
    let shown = name.to_string_lossy();
    if name.is_empty() {
        return Err("the program name is empty".into());
    }
    if shown.contains('/') {
        let p = PathBuf::from(name);
        return match std::fs::metadata(&p) {
            Err(e) => Err(format!("program {shown:?} not found: {e}")),
            Ok(m) if m.is_dir() => Err(format!("program {shown:?} is a directory")),
            Ok(_) if !executable(&p) => Err(format!("program {shown:?} is not executable")),
            Ok(_) => Ok(p),
        };
    }
    let path = path_var.unwrap_or_else(|| OsStr::new(""));
    std::env::split_paths(path)
        .map(|dir| if dir.as_os_str().is_empty() { PathBuf::from(".") } else { dir }.join(name))
        .find(|p| executable(p))
        .ok_or_else(|| format!("program {shown:?} not found in PATH"))
}

/// What every rank of one run shares.
pub struct Job {
    /// The resolved program.
    pub program: PathBuf,
    /// argv\[0\] as the user wrote it, then the arguments.
    pub command: Vec<OsString>,
    /// Where rank 0 listens (`OXCCL_ADDR`).
    pub addr: String,
    /// `OXCCL_JOB`.
    pub id: String,
    /// `MASTER_ADDR:MASTER_PORT` for torch's `env://` store (another free
    /// port than `addr`'s); `None` when the caller set either variable,
    /// which the ranks inherit.
    pub master: Option<(String, u16)>,
    /// `OXCCL_SECRET`: fresh random bytes per run (unless the caller set
    /// `OXCCL_SECRET` or `OXCCL_SECRET_FILE`, which the ranks inherit).
    pub secret: Option<String>,
    /// Number of ranks.
    pub np: usize,
    /// `OXCCL_TRANSPORT`, if set.
    pub transport: Option<Transport>,
    /// `OXCCL_SOCKET_IFNAME`, if set.
    pub ifname: Option<String>,
    /// Pipe the ranks' output (for tagging) instead of sharing ours.
    pub piped: bool,
}

/// 32 random bytes in hex for the ranks' `OXCCL_SECRET`; `None` when the
/// environment already names a secret.
fn fresh_secret() -> Result<Option<String>, String> {
    use std::io::Read;
    if ["OXCCL_SECRET", "OXCCL_SECRET_FILE"].iter().any(|k| std::env::var_os(k).is_some_and(|v| !v.is_empty())) {
        return Ok(None);
    }
    let mut b = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| format!("cannot read /dev/urandom for the ranks' secret: {e}"))?;
    Ok(Some(b.iter().map(|x| format!("{x:02x}")).collect()))
}

impl Job {
    /// The job for `cli`: picks a free port on loopback and a unique id.
    pub fn new(cli: &Cli, program: PathBuf) -> Result<Job, String> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .map_err(|e| format!("cannot find a free port on 127.0.0.1 for the rendezvous: {e}"))?;
        let port = listener.local_addr().map_err(|e| format!("cannot read the rendezvous port: {e}"))?.port();
        // torch's env:// store (a Python rank's init_process_group) listens
        // on MASTER_PORT: another free port, found while the first is held.
        let master = if ["MASTER_ADDR", "MASTER_PORT"].iter().any(|k| std::env::var_os(k).is_some()) {
            None
        } else {
            let store = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map_err(|e| format!("cannot find a free port on 127.0.0.1 for MASTER_PORT: {e}"))?;
            Some(("127.0.0.1".to_string(), store.port()))
        };
        // Rank 0 binds it; released now, so the window is that of a process start.
        drop(listener);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let ifname = match (&cli.ifname, cli.transport) {
            (Some(i), _) => Some(i.clone()),
            (None, Some(Transport::Tcp)) => Some("lo".to_string()),
            (None, _) => None,
        };
        Ok(Job {
            program,
            command: cli.command.clone(),
            addr: format!("127.0.0.1:{port}"),
            id: format!("oxccl-run-{}-{port}-{nanos:x}", std::process::id()),
            master,
            secret: fresh_secret()?,
            np: cli.np,
            transport: cli.transport,
            ifname,
            piped: cli.tag_output,
        })
    }

    /// The variables rank `rank` gets, beyond the inherited environment.
    pub fn env(&self, rank: usize) -> Vec<(&'static str, String)> {
        let mut v = vec![
            ("RANK", rank.to_string()),
            ("WORLD_SIZE", self.np.to_string()),
            ("LOCAL_RANK", rank.to_string()),
            ("LOCAL_WORLD_SIZE", self.np.to_string()),
            ("OXCCL_ADDR", self.addr.clone()),
            ("OXCCL_JOB", self.id.clone()),
        ];
        if let Some(s) = &self.secret {
            v.push(("OXCCL_SECRET", s.clone()));
        }
        if let Some((host, port)) = &self.master {
            v.push(("MASTER_ADDR", host.clone()));
            v.push(("MASTER_PORT", port.to_string()));
        }
        if let Some(t) = self.transport {
            v.push(("OXCCL_TRANSPORT", t.env_value().to_string()));
        }
        if let Some(i) = &self.ifname {
            v.push(("OXCCL_SOCKET_IFNAME", i.clone()));
        }
        v
    }

    /// Starts rank `rank` in a process group of its own (so a terminal's
    /// Ctrl-C reaches oxccl-run only, and stopping a rank reaches its
    /// children too).
    pub fn spawn(&self, rank: usize) -> std::io::Result<Child> {
        let mut cmd = Command::new(&self.program);
        cmd.arg0(&self.command[0]).args(&self.command[1..]).envs(self.env(rank)).process_group(0).stdin(Stdio::null());
        if self.piped {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        cmd.spawn()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolution() {
        let sh = resolve(OsStr::new("sh"), Some(OsStr::new("/nonexistent:/bin:/usr/bin"))).unwrap();
        assert!(sh.ends_with("sh") && sh.is_absolute(), "{sh:?}");
        let e = resolve(OsStr::new("no-such-program-xyz"), Some(OsStr::new("/bin"))).unwrap_err();
        assert!(e.contains("\"no-such-program-xyz\" not found in PATH"), "{e}");
        let e = resolve(OsStr::new("./no/such/file"), None).unwrap_err();
        assert!(e.contains("\"./no/such/file\" not found"), "{e}");
        assert!(resolve(OsStr::new("/"), None).unwrap_err().contains("directory"));
        let e = resolve(OsStr::new("/etc/passwd"), None).unwrap_err();
        assert!(e.contains("not executable"), "{e}");
    }
}
