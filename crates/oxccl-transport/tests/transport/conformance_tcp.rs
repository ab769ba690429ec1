//! The conformance suite over TCP (loopback).

use oxccl_transport::conformance::{self, Provider};
use oxccl_transport::tcp::TcpOptions;
use oxccl_transport::{Channel, Receiver, Sender};

struct Tcp;

impl Provider for Tcp {
    fn name(&self) -> &str {
        "tcp"
    }
    fn pair(&self, ch: Channel, capacity: usize) -> (Box<dyn Sender>, Box<dyn Receiver>) {
        oxccl_transport::tcp::tcp_pair(ch, capacity)
    }
    fn max_in_flight(&self, capacity: usize) -> usize {
        // Socket buffers hold bytes beyond the FIFO.
        capacity + (64 << 20)
    }
}

// `conformance::two_sided` leaves out `peer_drop`: TCP retries a refused
// connection until its connect timeout (peers start at different times), so
// that case is a Timeout here; tcp.rs covers a peer dropped
// mid-message and between messages.

#[test]
fn tcp_conformance() {
    conformance::two_sided(&Tcp);
}

/// TCP with every data socket encrypted (`OXCCL_ENCRYPT=1`).
struct Sealed;

impl Provider for Sealed {
    fn name(&self) -> &str {
        "tcp+encrypt"
    }
    fn pair(&self, ch: Channel, capacity: usize) -> (Box<dyn Sender>, Box<dyn Receiver>) {
        let opts = TcpOptions { buffer: capacity, encrypt: true, ..TcpOptions::default() };
        oxccl_transport::tcp::tcp_pair_with(ch, opts).expect("an encrypted loopback pair")
    }
    fn max_in_flight(&self, capacity: usize) -> usize {
        // Socket buffers, and a sealed record per socket, beyond the FIFO.
        capacity + (64 << 20) + 2 * (64 << 10)
    }
}

#[test]
fn tcp_encrypted_conformance() {
    conformance::two_sided(&Sealed);
}

#[test]
fn one_sided() {
    oxccl_transport::conformance::one_sided::run_all(oxccl_transport::Kind::Tcp, true);
}
