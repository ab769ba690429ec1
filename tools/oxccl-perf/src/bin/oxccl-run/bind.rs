//! Binding each rank to a CPU of its own, as `mpirun` does by default
//! (`--bind-to core`): two ranks that the kernel first places on one core
//! ping-pong through context switches until its load balancer moves one
//! away (tens of milliseconds: a 2-rank 8-byte all_reduce took 6.6 µs per
//! call for its first 40 ms, then 0.7 µs).
//!
//! A child inherits the affinity of the thread that forks it, so the
//! launcher binds its own thread to rank `r`'s CPU just before starting
//! rank `r` and restores its mask right after: the rank is bound before it
//! runs a single instruction, threads included, without code between fork
//! and exec.

use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;

/// How ranks are bound (`--bind-to`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindTo {
    /// A CPU each, from the CPUs oxccl-run may use, in order.
    Core,
    /// No binding: the kernel places the ranks.
    None,
}

/// Parses `--bind-to`.
pub fn parse(s: &str) -> Result<BindTo, String> {
    match s.to_ascii_lowercase().as_str() {
        "core" | "cpu" => Ok(BindTo::Core),
        "none" => Ok(BindTo::None),
        _ => Err(format!("{s:?} is not a binding: use core or none")),
    }
}

/// The launcher's side of binding.
pub struct Binder {
    /// Rank `r`'s CPU is `cpus[r]`; empty when not binding.
    cpus: Vec<usize>,
    original: Option<CpuSet>,
}

impl Binder {
    /// Binds `np` ranks as `mode` says; `None` (no `--bind-to`) binds when
    /// every rank can have a CPU of its own, as mpirun does.
    pub fn new(mode: Option<BindTo>, np: usize) -> Result<Binder, String> {
        let unbound = Binder { cpus: Vec::new(), original: None };
        if mode == Some(BindTo::None) {
            return Ok(unbound);
        }
        let (original, cpus) = match allowed() {
            Ok(a) => a,
            Err(e) if mode.is_none() => {
                eprintln!("oxccl-run: warning: not binding ranks: reading this process's CPUs: {e}");
                return Ok(unbound);
            }
            Err(e) => return Err(format!("--bind-to core: reading this process's CPUs: {e}")),
        };
        if np > cpus.len() {
            return match mode {
                Some(_) => Err(format!(
                    "--bind-to core: {np} ranks, but oxccl-run may run on {} CPUs ({}); use --bind-to none to \
                     share them",
                    cpus.len(),
                    list(&cpus)
                )),
                None => Ok(unbound),
            };
        }
        Ok(Binder { cpus: cpus[..np].to_vec(), original: Some(original) })
    }

    /// Rank `rank`'s CPU, if ranks are bound.
    pub fn cpu(&self, rank: usize) -> Option<usize> {
        self.cpus.get(rank).copied()
    }

    /// Binds the calling thread to `rank`'s CPU, so that the child it
    /// starts next inherits it.
    pub fn enter(&self, rank: usize) -> Result<(), String> {
        let Some(cpu) = self.cpu(rank) else { return Ok(()) };
        let mut one = CpuSet::new();
        one.set(cpu).map_err(|e| format!("binding rank {rank} to CPU {cpu}: {e}"))?;
        sched_setaffinity(Pid::from_raw(0), &one).map_err(|e| format!("binding rank {rank} to CPU {cpu}: {e}"))
    }

    /// Gives the calling thread its own CPUs back.
    pub fn leave(&self) {
        if let Some(set) = &self.original
            && let Err(e) = sched_setaffinity(Pid::from_raw(0), set)
        {
            eprintln!("oxccl-run: warning: restoring the launcher's CPUs: {e}");
        }
    }
}

/// The calling thread's CPU mask, and the CPUs in it in order.
fn allowed() -> nix::Result<(CpuSet, Vec<usize>)> {
    let set = sched_getaffinity(Pid::from_raw(0))?;
    let cpus = (0..CpuSet::count()).filter(|&c| set.is_set(c).unwrap_or(false)).collect();
    Ok((set, cpus))
}

/// CPUs as `0-3,6`.
fn list(cpus: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if i == j { cpus[i].to_string() } else { format!("{}-{}", cpus[i], cpus[j]) });
        i = j + 1;
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_lists() {
        assert_eq!(parse("core"), Ok(BindTo::Core));
        assert_eq!(parse("NONE"), Ok(BindTo::None));
        assert!(parse("socket").unwrap_err().contains("core or none"));
        assert_eq!(list(&[0, 1, 2, 3, 6, 8, 9]), "0-3,6,8-9");
    }

    #[test]
    fn too_many_ranks_to_bind_is_an_error_only_when_asked() {
        let n = allowed().unwrap().1.len();
        let e = Binder::new(Some(BindTo::Core), n + 1).err().expect("more ranks than CPUs");
        assert!(e.contains(&format!("{} ranks", n + 1)) && e.contains("--bind-to none"), "{e}");
        assert!(Binder::new(None, n + 1).unwrap().cpu(0).is_none(), "unasked: no binding, no error");
        let b = Binder::new(None, n).unwrap();
        let mine: Vec<usize> = (0..n).map(|r| b.cpu(r).unwrap()).collect();
        assert_eq!(mine.len(), n);
        assert!(mine.windows(2).all(|w| w[0] < w[1]), "a CPU each, in order: {mine:?}");
    }
}
