//! Groups: several calls launched together, so matched sends and receives
//! that would deadlock one by one (both ranks send first) complete.

use crate::buf::Region;
use crate::call::Call;
use crate::comm::Communicator;
use crate::exec::{Label, Task};
use crate::job::{Action, Extras, Job};
use crate::plan;
use oxccl_algo::collective::CollKind;
use oxccl_core::{DataType, Element, Error, ReduceOp, Result};
use std::marker::PhantomData;

pub(crate) enum Op {
    P2p { send: bool, peer: usize, region: Region, dtype: DataType },
    Coll(Call<Region>),
}

/// Calls recorded for one launch; see [`Communicator::group`]. Buffers
/// stay borrowed until the group has run. Nothing is launched if an
/// argument is wrong: [`Communicator::group`] returns the first error.
pub struct Group<'a> {
    comm: &'a Communicator,
    ops: Vec<Op>,
    error: Option<Error>,
    _buffers: PhantomData<&'a mut [u8]>,
}

impl<'a> Group<'a> {
    fn note(&mut self, r: Result<()>) {
        if let (Err(e), None) = (r, &self.error) {
            self.error = Some(e);
        }
    }

    /// Sends `buf` to `peer`.
    pub fn send<T: Element>(&mut self, buf: &'a [T], peer: usize) -> &mut Self {
        let r = self.comm.check_peer(peer, "send");
        self.note(r);
        let region = Region::of(bytemuck::cast_slice(buf));
        self.ops.push(Op::P2p { send: true, peer, region, dtype: T::DTYPE });
        self
    }

    /// Receives `buf.len()` elements from `peer`.
    pub fn recv<T: Element>(&mut self, buf: &'a mut [T], peer: usize) -> &mut Self {
        let r = self.comm.check_peer(peer, "recv");
        self.note(r);
        let region = Region::of_mut(bytemuck::cast_slice_mut(buf));
        self.ops.push(Op::P2p { send: false, peer, region, dtype: T::DTYPE });
        self
    }

    /// An all-reduce in the group.
    pub fn all_reduce<T: Element>(&mut self, send: &'a [T], recv: &'a mut [T], op: ReduceOp) -> &mut Self {
        let (s, r) = (Region::of(bytemuck::cast_slice(send)), Region::of_mut(bytemuck::cast_slice_mut(recv)));
        self.coll(CollKind::AllReduce, (send.len(), T::DTYPE, op, 0), s, r)
    }

    /// Checks a collective now (an error is kept for the launch) and
    /// records it.
    fn coll(&mut self, kind: CollKind, args: (usize, DataType, ReduceOp, usize), s: Region, r: Region) -> &mut Self {
        match self.comm.call(kind, args, Some(s), r) {
            Ok(call) => self.ops.push(Op::Coll(call)),
            Err(e) => self.note(Err(e)),
        }
        self
    }

    /// Any collective in the group, on byte buffers (`count` and the
    /// buffers as in [`Communicator::collective_bytes`], out of place).
    #[allow(clippy::too_many_arguments)]
    pub fn collective_bytes(
        &mut self,
        kind: CollKind,
        send: &'a [u8],
        recv: &'a mut [u8],
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
    ) -> &mut Self {
        self.coll(kind, (count, dtype, op, root), Region::of(send), Region::of_mut(recv))
    }
}

impl Communicator {
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

    /// Records the calls `f` makes on a [`Group`] and runs them together:
    /// collectives one after another in the order recorded, then every
    /// send and receive at once (per peer in the order recorded). Blocks
    /// until all are done.
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
        let mut g = Group { comm: self, ops: Vec::new(), error: None, _buffers: PhantomData };
        f(&mut g);
        if let Some(e) = g.error {
            return Err(e);
        }
        match self.group_job(g.ops)? {
            Some(job) => self.run(job),
            None => Ok(()),
        }
    }

    /// Plans recorded operations into one job (`None`: nothing to do):
    /// collectives one after another in the order recorded, then every
    /// send and receive at once. Nothing changes on an error.
    pub(crate) fn group_job(&self, ops: Vec<Op>) -> Result<Option<Job>> {
        self.usable()?;
        let mut extras = Extras::default();
        let mut batches: Vec<Vec<Task>> = Vec::new();
        let mut p2p = Vec::new();
        // One operation keeps its own label; several are a "group" named by
        // the first one's number.
        let mut label: Option<Label> = None;
        let mut name = |l: Label| label = Some(label.map_or(l, |first| Label::new("group", first.seq)));
        for op in ops {
            match op {
                Op::Coll(call) => {
                    let task = self.plan(&call, &mut extras)?;
                    name(task.label);
                    batches.push(vec![task]);
                }
                Op::P2p { send, peer, region, dtype } => {
                    self.check_peer(peer, if send { "send" } else { "recv" })?;
                    if region.len() % dtype.size() != 0 {
                        return Err(Error::invalid(format!(
                            "rank {}: {}: a buffer of {} bytes is not whole {dtype} elements",
                            self.rank(),
                            if send { "send" } else { "recv" },
                            region.len()
                        )));
                    }
                    p2p.push((send, peer, region, dtype));
                }
            }
        }
        if !p2p.is_empty() {
            let seq = self.next_seq();
            let mut tasks = Vec::new();
            let mut selfs: (Vec<Region>, Vec<Region>) = (Vec::new(), Vec::new());
            for (send, peer, region, dtype) in p2p {
                if peer == self.rank() {
                    if send {
                        selfs.0.push(region)
                    } else {
                        selfs.1.push(region)
                    }
                    continue;
                }
                tasks.push(plan::p2p(send, peer, region, dtype, Label::new("p2p", seq)));
            }
            if selfs.0.len() != selfs.1.len() {
                return Err(Error::invalid(format!(
                    "rank {}: a group sends {} and receives {} buffers to and from itself",
                    self.rank(),
                    selfs.0.len(),
                    selfs.1.len()
                )));
            }
            for (s, r) in selfs.0.into_iter().zip(selfs.1) {
                if s.len() != r.len() {
                    return Err(Error::invalid(format!(
                        "rank {}: self send of {} bytes matched with a receive of {}",
                        self.rank(),
                        s.len(),
                        r.len()
                    )));
                }
                extras.pre.push(Action::Copy { dst: r, src: s });
            }
            name(Label::new("p2p", seq));
            batches.push(tasks);
        }
        if batches.is_empty() && extras.pre.is_empty() {
            return Ok(None);
        }
        let label = label.unwrap_or(Label::new("group", self.last_seq()));
        Ok(Some(Job::new(label, batches, extras, None)))
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
        let (send, recv) = (Region::of(bytemuck::cast_slice(send)), Region::of_mut(bytemuck::cast_slice_mut(recv)));
        self.all_to_allv_regions(send, send_counts, send_displs, recv, recv_counts, recv_displs, T::DTYPE)
    }

    /// [`all_to_allv`](Communicator::all_to_allv) on regions of `dtype`
    /// elements (the safe and the raw entry points).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn all_to_allv_regions(
        &self,
        src: Region,
        send_counts: &[usize],
        send_displs: &[usize],
        whole: Region,
        recv_counts: &[usize],
        recv_displs: &[usize],
        dtype: DataType,
    ) -> Result<()> {
        self.usable()?;
        let (n, me) = (self.size(), self.rank());
        let es = dtype.size();
        for (name, v) in [
            ("send_counts", send_counts),
            ("send_displs", send_displs),
            ("recv_counts", recv_counts),
            ("recv_displs", recv_displs),
        ] {
            if v.len() != n {
                return Err(Error::invalid(format!(
                    "rank {me}: all_to_allv: {name} has {} entries for {n} ranks",
                    v.len()
                )));
            }
        }
        let span = |what: &str, len: usize, c: usize, d: usize, j: usize| match c.checked_add(d) {
            Some(end) if end <= len => Ok(d..end),
            _ => Err(Error::invalid(format!(
                "rank {me}: all_to_allv: {what} block for rank {j} ({c} elements at {d}) is outside the buffer of {len}"
            ))),
        };
        let mut sends = Vec::with_capacity(n);
        let mut recvs = Vec::with_capacity(n);
        for j in 0..n {
            sends.push(span("send", src.len() / es, send_counts[j], send_displs[j], j)?);
            recvs.push(span("recv", whole.len() / es, recv_counts[j], recv_displs[j], j)?);
        }
        if send_counts[me] != recv_counts[me] {
            return Err(Error::invalid(format!(
                "rank {me}: all_to_allv: sends {} elements to itself but receives {}",
                send_counts[me], recv_counts[me]
            )));
        }
        // Split the receive buffer into disjoint blocks (they must not overlap).
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&j| recvs[j].start);
        for w in order.windows(2) {
            if recvs[w[0]].end > recvs[w[1]].start && !recvs[w[0]].is_empty() && !recvs[w[1]].is_empty() {
                return Err(Error::invalid(format!(
                    "rank {me}: all_to_allv: receive blocks of ranks {} and {} overlap",
                    w[0], w[1]
                )));
            }
        }
        let seq = self.next_seq();
        let mut tasks = Vec::new();
        let mut extras = Extras::default();
        for k in 1..n {
            let to = (me + k) % n;
            let from = (me + n - k) % n;
            let s = src.sub(sends[to].start * es, send_counts[to] * es)?;
            tasks.push(plan::p2p(true, to, s, dtype, Label::new("all_to_allv", seq)));
            let r = whole.sub(recvs[from].start * es, recv_counts[from] * es)?;
            tasks.push(plan::p2p(false, from, r, dtype, Label::new("all_to_allv", seq)));
        }
        let own = whole.sub(recvs[me].start * es, recv_counts[me] * es)?;
        extras.pre.push(Action::Copy { dst: own, src: src.sub(sends[me].start * es, send_counts[me] * es)? });
        self.run(Job::new(Label::new("all_to_allv", seq), vec![tasks], extras, None))
    }
}
