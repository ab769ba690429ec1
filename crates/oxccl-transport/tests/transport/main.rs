//! The integration tests of oxccl-transport, one binary (the loom model,
//! loom_ring.rs, is built on its own with --cfg loom): the bootstrap, the
//! conformance suite once per provider (mem, shm, tcp, rdma over the software
//! HCA), the verbs binding's layouts, shared memory after a crash, TCP's
//! framing, striping and encryption, and hostile bytes against the decoders.

mod bootstrap;
mod conformance_mem;
mod conformance_rdma;
mod conformance_shm;
mod conformance_tcp;
mod ibv_layout;
mod shm_crash;
mod tcp;
mod tcp_encrypt;
mod wire_fuzz;
