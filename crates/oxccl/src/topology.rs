//! The communicator's topology at init: every rank's discovered facts
//! all-gathered through the bootstrap and assembled alike on every rank,
//! or the file `OXCCL_TOPO_FILE` names (every rank must read the same
//! grouping); rank 0 dumps it to `OXCCL_TOPO_DUMP_FILE` and logs one line
//! per host at INFO.

use crate::config::Resolved;
use oxccl_core::{Error, Result};
use oxccl_transport::bootstrap::Bootstrap;
use oxccl_transport::topo::{self, HostFacts, RankFacts, Topology};

/// The topology every rank of `boot` agrees on; `who` names the
/// communicator in messages.
pub(crate) fn agree(boot: &Bootstrap, cfg: &Resolved, who: &str) -> Result<Topology> {
    let (rank, n) = (boot.rank(), boot.nranks());
    let topology = match &cfg.topo_file {
        Some(path) => {
            let t = Topology::load(path, n).map_err(|e| Error::InvalidUsage(format!("{who}: {e}")))?;
            let mine: Vec<u8> = t.host_of().iter().flat_map(|h| h.to_le_bytes()).collect();
            let all = boot.all_gather(&mine)?;
            if let Some(q) = all.iter().position(|v| *v != mine) {
                return Err(Error::InvalidUsage(format!(
                    "{who}: OXCCL_TOPO_FILE {} groups the ranks into hosts otherwise than rank {q}'s: every rank must read the same topology",
                    path.display()
                )));
            }
            t
        }
        None => {
            let host = boot.peers()[rank].host.clone();
            let mine = topo::encode(&RankFacts::discover(host), &HostFacts::discover());
            let all = boot.all_gather(&mine)?;
            let facts = all.iter().enumerate().map(|(r, b)| topo::decode(r, b)).collect::<Result<Vec<_>>>()?;
            Topology::assemble(facts)
        }
    };
    if rank == 0 {
        for line in topology.summary() {
            tracing::info!("{who}: {line}");
        }
        if let Some(path) = &cfg.topo_dump_file {
            match std::fs::write(path, topology.to_json()) {
                Ok(()) => tracing::info!("{who}: topology written to {} (OXCCL_TOPO_DUMP_FILE)", path.display()),
                Err(e) => tracing::warn!("{who}: cannot write OXCCL_TOPO_DUMP_FILE {}: {e}", path.display()),
            }
        }
    }
    Ok(topology)
}
