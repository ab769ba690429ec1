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

#[test]
fn tcp_conformance() {
    conformance::in_order_random_sizes(&Tcp);
    conformance::element_multiples(&Tcp);
    conformance::back_pressure(&Tcp);
    conformance::zero_byte_messages(&Tcp);
    conformance::misuse_errors(&Tcp);
    conformance::payload_alignment(&Tcp);
    conformance::send_from_and_recv_into(&Tcp);
    // `peer_drop` drops the receiver before the sender ever connected; TCP
    // retries a refused connection until its connect timeout (peers start at
    // different times), so that case is a Timeout there, not a Remote error.
    // tests/tcp.rs covers a peer dropped mid-message and between messages.
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
    conformance::in_order_random_sizes(&Sealed);
    conformance::element_multiples(&Sealed);
    conformance::back_pressure(&Sealed);
    conformance::zero_byte_messages(&Sealed);
    conformance::misuse_errors(&Sealed);
    conformance::payload_alignment(&Sealed);
    conformance::send_from_and_recv_into(&Sealed);
}

#[test]
fn one_sided() {
    oxccl_transport::conformance::one_sided::run_all(oxccl_transport::Kind::Tcp, true);
}
