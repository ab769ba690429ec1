//! The typed collectives on host memory: slices of any [`Element`] in,
//! blocking calls and calls on owned storage that return a [`Work`]. Each
//! is one operation ([`Op`]) through [`Communicator::launch`].

use crate::buf::{Buffer, Region};
use crate::call::{Call, Spec};
use crate::comm::Communicator;
use crate::job::Completion;
use crate::op::Op;
use oxccl_algo::collective::CollKind;
use oxccl_core::{Element, Error, ReduceOp, Result};
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

/// A submitted call: wait for it or poll it. Owned-buffer calls hand the
/// storage back from [`wait`](Work::wait).
#[must_use = "a Work is the only way to learn whether the call succeeded"]
pub struct Work<B = ()> {
    done: Arc<Completion>,
    _b: PhantomData<fn() -> B>,
}

impl<B: 'static> Work<B> {
    /// Whether the call has ended.
    pub fn is_done(&self) -> bool {
        self.done.is_done()
    }

    /// Waits at most `d`: `None` while the call runs, else its outcome.
    pub fn wait_timeout(&self, d: Duration) -> Option<Result<()>> {
        self.done.wait_for(d)
    }

    /// Waits for the end (which always comes: every wait inside has a
    /// deadline) and returns the caller's storage.
    pub fn wait(self) -> Result<B> {
        let (r, keep) = self.done.wait();
        r?;
        keep.and_then(|k| k.downcast::<B>().ok())
            .map(|b| *b)
            .ok_or_else(|| Error::Internal("a work item lost its buffer".into()))
    }
}

impl Work<()> {
    /// Waits for the end of a call that owns no storage.
    pub fn wait_done(self) -> Result<()> {
        self.done.wait().0
    }
}

fn bytes<T: Element>(s: &[T]) -> &[u8] {
    bytemuck::cast_slice(s)
}

fn bytes_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    bytemuck::cast_slice_mut(s)
}

impl Communicator {
    /// Runs the collective `spec` describes on byte buffers (NCCL's
    /// conventions for the count, see
    /// [`Collective`](oxccl_algo::collective::Collective)); `send: None` is
    /// in place (the receive buffer holds the input where NCCL's in-place
    /// layout puts it). Blocks until done.
    pub fn collective_bytes(&self, spec: Spec, send: Option<&[u8]>, recv: &mut [u8]) -> Result<()> {
        let (s, r) = (send.map(|s| Buffer::Host(Region::of(s))), Buffer::Host(Region::of_mut(recv)));
        let op = Op::collective(spec, s, r, self.rank(), self.size())?;
        // Both slices stay borrowed until the launch has ended.
        self.run_ops(&[op], &[])
    }

    /// Sum (or `op`) of every rank's `send` into every rank's `recv`.
    pub fn all_reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        self.collective_bytes(
            Spec::new(CollKind::AllReduce, send.len(), T::DTYPE).with_op(op),
            Some(bytes(send)),
            bytes_mut(recv),
        )
    }

    /// [`all_reduce`](Communicator::all_reduce) in place.
    pub fn all_reduce_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let n = buf.len();
        self.collective_bytes(Spec::new(CollKind::AllReduce, n, T::DTYPE).with_op(op), None, bytes_mut(buf))
    }

    /// Rank `r` receives block `r` (of `recv.len()` elements) of the
    /// reduction of every rank's `send` (`size() × recv.len()` elements).
    pub fn reduce_scatter<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        let n = recv.len();
        self.collective_bytes(
            Spec::new(CollKind::ReduceScatter, n, T::DTYPE).with_op(op),
            Some(bytes(send)),
            bytes_mut(recv),
        )
    }

    /// [`reduce_scatter`](Communicator::reduce_scatter) in place: `buf`
    /// holds `size()` blocks; this rank's block ends up reduced.
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let n = self.blocks(buf.len(), "reduce_scatter")?;
        self.collective_bytes(Spec::new(CollKind::ReduceScatter, n, T::DTYPE).with_op(op), None, bytes_mut(buf))
    }

    /// Every rank receives all ranks' `send`, concatenated in rank order.
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let n = send.len();
        self.collective_bytes(Spec::new(CollKind::AllGather, n, T::DTYPE), Some(bytes(send)), bytes_mut(recv))
    }

    /// [`all_gather`](Communicator::all_gather) in place: this rank's
    /// block of `buf` is its input.
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let n = self.blocks(buf.len(), "all_gather")?;
        self.collective_bytes(Spec::new(CollKind::AllGather, n, T::DTYPE), None, bytes_mut(buf))
    }

    /// Block `j` of this rank's `send` goes to rank `j`; block `j` of
    /// `recv` comes from rank `j` (`size()` equal blocks).
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let n = self.blocks(send.len(), "alltoall")?;
        self.collective_bytes(Spec::new(CollKind::AllToAll, n, T::DTYPE), Some(bytes(send)), bytes_mut(recv))
    }

    /// The root's `buf` to every rank's `buf`.
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        let n = buf.len();
        self.collective_bytes(Spec::new(CollKind::Broadcast, n, T::DTYPE).with_root(root), None, bytes_mut(buf))
    }

    /// The reduction of every rank's `send` into the root's `recv`
    /// (ignored elsewhere; pass an empty slice).
    pub fn reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp, root: usize) -> Result<()> {
        let n = send.len();
        self.collective_bytes(
            Spec::new(CollKind::Reduce, n, T::DTYPE).with_op(op).with_root(root),
            Some(bytes(send)),
            bytes_mut(recv),
        )
    }

    /// Every rank's `send` into the root's `recv`, in rank order.
    pub fn gather<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        let n = send.len();
        self.collective_bytes(
            Spec::new(CollKind::Gather, n, T::DTYPE).with_root(root),
            Some(bytes(send)),
            bytes_mut(recv),
        )
    }

    /// Block `r` of the root's `send` into rank `r`'s `recv`.
    pub fn scatter<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        let n = recv.len();
        self.collective_bytes(
            Spec::new(CollKind::Scatter, n, T::DTYPE).with_root(root),
            Some(bytes(send)),
            bytes_mut(recv),
        )
    }

    /// Waits until every rank has reached the barrier.
    pub fn barrier(&self) -> Result<()> {
        let mut x = [0u8];
        self.all_reduce_in_place(&mut x, ReduceOp::Max)
    }

    /// In-place all-reduce on owned storage, returned by [`Work::wait`].
    pub fn all_reduce_async<T: Element>(&self, mut buf: Vec<T>, op: ReduceOp) -> Result<Work<Vec<T>>> {
        let n = buf.len();
        let spec = Spec::new(CollKind::AllReduce, n, T::DTYPE).with_op(op);
        let call = Call::new(spec, None, Region::of_mut(bytes_mut(&mut buf)), self.rank(), self.size())?;
        let done = self.submit(self.collective_job(&call, Some(Box::new(buf)))?);
        Ok(Work { done, _b: PhantomData })
    }

    /// In-place collective of any kind on owned storage (NCCL's in-place
    /// layout; `count` as in [`collective_bytes`]). The storage comes back
    /// from [`Work::wait`].
    ///
    /// [`collective_bytes`]: Communicator::collective_bytes
    pub fn collective_async<T: Element>(
        &self,
        kind: CollKind,
        mut buf: Vec<T>,
        count: usize,
        op: ReduceOp,
        root: usize,
    ) -> Result<Work<Vec<T>>> {
        let spec = Spec::new(kind, count, T::DTYPE).with_op(op).with_root(root);
        let call = Call::new(spec, None, Region::of_mut(bytes_mut(&mut buf)), self.rank(), self.size())?;
        let done = self.submit(self.collective_job(&call, Some(Box::new(buf)))?);
        Ok(Work { done, _b: PhantomData })
    }

    fn blocks(&self, len: usize, what: &str) -> Result<usize> {
        let n = self.size();
        if !len.is_multiple_of(n) {
            return Err(Error::invalid(format!(
                "rank {}: {what}: a buffer of {len} elements does not split into {n} equal blocks",
                self.rank()
            )));
        }
        Ok(len / n)
    }
}
