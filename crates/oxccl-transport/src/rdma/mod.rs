//! The RDMA provider: RC queue pairs over verbs, between hosts.
//!
//! ## Layers
//! - [`verbs`]: the verbs-shaped seam (devices, completion queues, RC QPs)
//!   the protocol engine is written against. Two backends:
//!   [`ibv`] (libibverbs, opened at run time with `dlopen`/`dlvsym`, so
//!   one binary runs with or without rdma-core) and [`soft`] (a software
//!   RC HCA over TCP that keeps the RC rules, so every line of the engine
//!   runs in CI; `OXCCL_IB_PROVIDER=soft`).
//! - `setup`: connection setup over an authenticated TCP side channel
//!   (QP numbers, PSNs, the ring's address and rkey; INIT→RTR→RTS with
//!   NCCL's attributes); the side socket stays open so a dead peer is seen
//!   at once.
//! - `conn`: two-sided connections: RDMA WRITE_WITH_IMM into a ring the
//!   receiver registered, credits written back, chunks striped over QPs,
//!   selective signalling.
//! - `direct`: one-sided gets and puts by RDMA READ/WRITE into registered
//!   user buffers, with a registration cache.
//! - [`provider`]: the fabric's view ([`RdmaFactory`], [`RdmaProvider`]).
//! - [`env`](mod@env): the `OXCCL_IB_*` variables, parsed through a lookup
//!   function ([`RdmaOptions::from_lookup`] gathers every RDMA setting;
//!   oxccl's `Config` calls it once: the provider reads no variable).
//!
//! ## Availability
//! No library, no device or no kernel support (`ENOSYS`) makes RDMA
//! unavailable as a value, logged once at INFO with the reason; the fabric
//! then uses TCP between hosts. `OXCCL_TRANSPORT=rdma` forces it between
//! every pair (an error naming the rank and the reason where a pair cannot
//! use it).

mod buf;
mod conn;
mod direct;
pub mod env;
pub mod ibv;
pub mod provider;
mod setup;
pub mod soft;
pub mod verbs;

pub use provider::{RdmaFactory, RdmaOptions, RdmaProvider};
pub use setup::Faults;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Weak;
use std::time::Duration;

/// Accepts connections on the non-blocking listener `l` and hands each to
/// `serve`, for as long as `owner` lives and is not `closed`, looking again
/// every `pause` when none waits; `what` names the listener in warnings.
/// The body of the soft HCA's and the side channel's accept threads.
fn accept_while<T>(
    l: TcpListener,
    owner: Weak<T>,
    pause: Duration,
    what: &str,
    closed: impl Fn(&T) -> bool,
    mut serve: impl FnMut(&T, TcpStream, SocketAddr),
) {
    loop {
        let Some(o) = owner.upgrade() else { return };
        if closed(&o) {
            return;
        }
        match l.accept() {
            Ok((s, from)) => serve(&o, s, from),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                drop(o);
                std::thread::sleep(pause);
            }
            Err(e) => {
                tracing::warn!("{what}: accept: {e}");
                drop(o);
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}
