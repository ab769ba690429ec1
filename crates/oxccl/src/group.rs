//! Groups: several operations launched together ([`Communicator::launch`]'s
//! semantics), so matched sends and receives that would deadlock one by
//! one (both ranks send first) complete; and the typed point-to-point
//! methods, which are groups of one.

use crate::buf::{Buffer, CudaStream, DeviceBuf, Region};
use crate::call::Spec;
use crate::comm::Communicator;
use crate::op::{self, Blocks, Op};
use oxccl_algo::collective::CollKind;
use oxccl_core::{DataType, Element, Error, ReduceOp, Result};
use std::marker::PhantomData;

/// Operations recorded for one launch; see [`Communicator::group`]. Host
/// buffers stay borrowed until the group has run. Nothing is launched if an
/// argument is wrong: [`Communicator::group`] returns the first error.
pub struct Group<'a> {
    comm: &'a Communicator,
    ops: Vec<Op>,
    streams: Vec<CudaStream>,
    error: Option<Error>,
    _buffers: PhantomData<&'a mut [u8]>,
}

impl<'a> Group<'a> {
    fn note(&mut self, r: Result<Op>) -> &mut Self {
        match r {
            Ok(op) => self.ops.push(op),
            Err(e) => {
                self.error.get_or_insert(e);
            }
        }
        self
    }

    /// Sends `buf` to `peer`.
    pub fn send<T: Element>(&mut self, buf: &'a [T], peer: usize) -> &mut Self {
        self.note(Ok(Op::send(Region::of(bytemuck::cast_slice(buf)), T::DTYPE, peer)))
    }

    /// Receives `buf.len()` elements from `peer`.
    pub fn recv<T: Element>(&mut self, buf: &'a mut [T], peer: usize) -> &mut Self {
        self.note(Ok(Op::recv(Region::of_mut(bytemuck::cast_slice_mut(buf)), T::DTYPE, peer)))
    }

    /// An all-reduce in the group.
    pub fn all_reduce<T: Element>(&mut self, send: &'a [T], recv: &'a mut [T], op: ReduceOp) -> &mut Self {
        let spec = Spec::new(CollKind::AllReduce, send.len(), T::DTYPE).with_op(op);
        self.collective_bytes(spec, bytemuck::cast_slice(send), bytemuck::cast_slice_mut(recv))
    }

    /// Any collective in the group, on byte buffers (as
    /// [`Communicator::collective_bytes`], out of place).
    pub fn collective_bytes(&mut self, spec: Spec, send: &'a [u8], recv: &'a mut [u8]) -> &mut Self {
        let (s, r) = (Buffer::Host(Region::of(send)), Buffer::Host(Region::of_mut(recv)));
        let op = Op::collective(spec, Some(s), r, self.comm.rank(), self.comm.size());
        self.note(op)
    }

    /// Orders the group's device operations on `stream` (NCCL's stream
    /// argument); several streams join as [`Communicator::launch`] says.
    pub fn stream(&mut self, stream: CudaStream) -> &mut Self {
        if !self.streams.contains(&stream) {
            self.streams.push(stream);
        }
        self
    }

    /// A collective on device buffers (`send: None`: in place), ordered
    /// on the group's stream.
    pub fn collective_device(&mut self, spec: Spec, send: Option<DeviceBuf>, recv: DeviceBuf) -> &mut Self {
        let op =
            Op::collective(spec, send.map(Buffer::Device), Buffer::Device(recv), self.comm.rank(), self.comm.size());
        self.note(op)
    }

    /// Sends device buffer `buf` (whole `dtype` elements) to `peer`.
    pub fn send_device(&mut self, buf: DeviceBuf, dtype: DataType, peer: usize) -> &mut Self {
        self.note(Ok(Op::send(buf, dtype, peer)))
    }

    /// Receives into device buffer `buf` from `peer`.
    pub fn recv_device(&mut self, buf: DeviceBuf, dtype: DataType, peer: usize) -> &mut Self {
        self.note(Ok(Op::recv(buf, dtype, peer)))
    }
}

impl Communicator {
    /// Records the operations `f` makes on a [`Group`] and launches them
    /// together ([`launch`](Communicator::launch)): device ones enqueued on
    /// the group's [`stream`](Group::stream), host ones run to their end
    /// before this returns (collectives one after another in the order
    /// recorded, then every send and receive at once, per peer in the order
    /// recorded).
    ///
    /// ```no_run
    /// # let comms = oxccl::Communicator::init_threads(2).unwrap();
    /// # let comm = &comms[0];
    /// let (out, mut inc) = (vec![1.0f32; 4], vec![0.0f32; 4]);
    /// let peer = 1 - comm.rank();
    /// comm.group(|g| {
    ///     g.send(&out, peer);
    ///     g.recv(&mut inc, peer);
    /// })
    /// .unwrap();
    /// ```
    pub fn group<'a>(&'a self, f: impl FnOnce(&mut Group<'a>)) -> Result<()> {
        self.usable()?;
        let mut g = Group { comm: self, ops: Vec::new(), streams: Vec::new(), error: None, _buffers: PhantomData };
        f(&mut g);
        if let Some(e) = g.error {
            return Err(e);
        }
        // The group borrows every host buffer for `'a`, which outlives this
        // call, and the launch has ended with them when it returns; device
        // buffers are addresses the launch checks against the driver's
        // allocations.
        self.run_ops(&g.ops, &g.streams)
    }

    /// Sends `buf` to `peer` (blocks until it is on its way; pair with the
    /// peer's [`recv`](Communicator::recv), or use a [`group`] when both
    /// sides send first).
    ///
    /// [`group`]: Communicator::group
    pub fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<()> {
        self.group(|g| {
            g.send(buf, peer);
        })
    }

    /// Receives `buf.len()` elements from `peer`.
    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<()> {
        self.group(|g| {
            g.recv(buf, peer);
        })
    }

    /// Sends device buffer `buf` (whole `dtype` elements) to `peer`,
    /// ordered on `stream` (NCCL's `ncclSend` on device memory).
    pub fn send_device(&self, buf: DeviceBuf, dtype: DataType, peer: usize, stream: CudaStream) -> Result<()> {
        self.group(|g| {
            g.stream(stream).send_device(buf, dtype, peer);
        })
    }

    /// Receives into device buffer `buf` from `peer`, ordered on `stream`
    /// (`ncclRecv`).
    pub fn recv_device(&self, buf: DeviceBuf, dtype: DataType, peer: usize, stream: CudaStream) -> Result<()> {
        self.group(|g| {
            g.stream(stream).recv_device(buf, dtype, peer);
        })
    }

    /// All-to-all with per-peer counts and displacements (elements):
    /// `send[send_displs[j]..][..send_counts[j]]` goes to rank `j`, whose
    /// `recv_counts[me]` must match.
    pub fn all_to_allv<T: Element>(
        &self,
        send: &[T],
        send_counts: &[usize],
        send_displs: &[usize],
        recv: &mut [T],
        recv_counts: &[usize],
        recv_displs: &[usize],
    ) -> Result<()> {
        let s =
            (Buffer::Host(Region::of(bytemuck::cast_slice(send))), Blocks { counts: send_counts, displs: send_displs });
        let r = (
            Buffer::Host(Region::of_mut(bytemuck::cast_slice_mut(recv))),
            Blocks { counts: recv_counts, displs: recv_displs },
        );
        let ops = self.all_to_allv_ops(s, r, T::DTYPE)?;
        // Both slices stay borrowed until the launch has ended.
        self.run_ops(&ops, &[])
    }

    /// The operations of an all-to-all with per-peer counts and
    /// displacements (elements of `dtype`), checked, for a
    /// [`launch`](Communicator::launch) (host or device buffers): block `j`
    /// of the send buffer goes to rank `j`, whose receive count for this
    /// rank must match; receive blocks must not overlap.
    pub fn all_to_allv_ops(
        &self,
        send: (Buffer, Blocks<'_>),
        recv: (Buffer, Blocks<'_>),
        dtype: DataType,
    ) -> Result<Vec<Op>> {
        op::all_to_allv(send, recv, dtype, (self.rank(), self.size()))
    }
}
