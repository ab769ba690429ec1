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

/// The two-sided cases TCP runs. `peer_drop` is not among them: it drops
/// the receiver before the sender ever connected, and TCP retries a
/// refused connection until its connect timeout (peers start at different
/// times), so that case is a Timeout there, not a Remote error; tests/tcp.rs
/// covers a peer dropped mid-message and between messages.
fn two_sided(p: &dyn Provider) {
    conformance::in_order_random_sizes(p);
    conformance::element_multiples(p);
    conformance::back_pressure(p);
    conformance::zero_byte_messages(p);
    conformance::misuse_errors(p);
    conformance::payload_alignment(p);
    conformance::send_from_and_recv_into(p);
}

#[test]
fn tcp_conformance() {
    two_sided(&Tcp);
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
    two_sided(&Sealed);
}

#[test]
fn one_sided() {
    oxccl_transport::conformance::one_sided::run_all(oxccl_transport::Kind::Tcp, true);
}
