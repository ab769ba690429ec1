//! The conformance suite over TCP (loopback).

use oxccl_transport::conformance::{self, Provider};
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
    conformance::run_all(&Tcp);
}
