//! The conformance suite over the in-process provider.
#![cfg(not(loom))]

use std::sync::atomic::{AtomicU64, Ordering};

use oxccl_transport::conformance::{self, Provider};
use oxccl_transport::mem::Hub;
use oxccl_transport::{Channel, Receiver, Sender};

struct Mem;

static NEXT: AtomicU64 = AtomicU64::new(1);

impl Provider for Mem {
    fn name(&self) -> &str {
        "mem"
    }
    fn pair(&self, ch: Channel, capacity: usize) -> (Box<dyn Sender>, Box<dyn Receiver>) {
        let key = 0x6d65_6d00_0000 + NEXT.fetch_add(1, Ordering::Relaxed) as u128;
        let hub = Hub::get(key, 2).unwrap();
        (hub.sender(0, 1, ch, capacity).unwrap(), hub.receiver(0, 1, ch, capacity).unwrap())
    }
}

#[test]
fn in_order_random_sizes() {
    conformance::in_order_random_sizes(&Mem);
}
#[test]
fn element_multiples() {
    conformance::element_multiples(&Mem);
}
#[test]
fn back_pressure() {
    conformance::back_pressure(&Mem);
}
#[test]
fn zero_byte_messages() {
    conformance::zero_byte_messages(&Mem);
}
#[test]
fn misuse_errors() {
    conformance::misuse_errors(&Mem);
}
#[test]
fn payload_alignment() {
    conformance::payload_alignment(&Mem);
}
#[test]
fn peer_drop() {
    conformance::peer_drop(&Mem);
}

#[test]
fn one_sided() {
    oxccl_transport::conformance::one_sided::run_all(oxccl_transport::Kind::Mem, true);
}

#[test]
fn send_from_and_recv_into() {
    conformance::send_from_and_recv_into(&Mem);
}
