//! Launches on raw host buffers, for callers outside Rust's borrow rules:
//! the C ABI (`libnccl.so.2`) and the Python binding hold addresses, not
//! slices.
//!
//! The checks are those of every other entry point (a [`Call`] is checked
//! when it is made; peers, lengths and element sizes when the launch is
//! planned; an error changes nothing). What the borrow checker proves for
//! the safe API, the caller promises here: the buffers stay valid until
//! the launch has ended.
#![allow(unsafe_code)]

use crate::buf::Region;
use crate::call::Call;
use crate::comm::Communicator;
use crate::group::Op;
use oxccl_core::{DataType, Result};

/// One operation of a raw launch.
#[derive(Clone, Copy, Debug)]
pub enum RawOp {
    /// A collective, checked by [`Call::new`].
    Collective(Call<Region>),
    /// Send `buf` (whole elements of `dtype`) to `peer`.
    Send {
        /// What is sent.
        buf: Region,
        /// To whom.
        peer: usize,
        /// Element type (the byte count must be whole elements).
        dtype: DataType,
    },
    /// Receive into `buf` from `peer`.
    Recv {
        /// Where it lands.
        buf: Region,
        /// From whom.
        peer: usize,
        /// Element type.
        dtype: DataType,
    },
}

impl From<RawOp> for Op {
    fn from(op: RawOp) -> Op {
        match op {
            RawOp::Collective(call) => Op::Coll(call),
            RawOp::Send { buf, peer, dtype } => Op::P2p { send: true, peer, region: buf, dtype },
            RawOp::Recv { buf, peer, dtype } => Op::P2p { send: false, peer, region: buf, dtype },
        }
    }
}

impl Communicator {
    /// Runs `ops` as one group ([`Communicator::group`]'s semantics) and
    /// waits for the end: on the calling thread when nothing is queued
    /// ahead of it.
    ///
    /// # Safety
    /// Every region must stay allocated, and not be written by anyone else
    /// (nor read, for receive buffers), until this returns.
    pub unsafe fn run_raw(&self, ops: Vec<RawOp>) -> Result<()> {
        match self.group_job(ops.into_iter().map(Op::from).collect())? {
            Some(job) => self.run(job),
            None => Ok(()),
        }
    }

    /// [`all_to_allv`](Communicator::all_to_allv) on raw regions of
    /// `dtype` elements (counts and displacements in elements), with its
    /// checks.
    ///
    /// # Safety
    /// As [`run_raw`](Communicator::run_raw): both regions stay allocated
    /// and untouched by anyone else until this returns.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_to_allv_raw(
        &self,
        send: Region,
        send_counts: &[usize],
        send_displs: &[usize],
        recv: Region,
        recv_counts: &[usize],
        recv_displs: &[usize],
        dtype: DataType,
    ) -> Result<()> {
        self.all_to_allv_regions(send, send_counts, send_displs, recv, recv_counts, recv_displs, dtype)
    }
}
