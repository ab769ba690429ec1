//! The host part of a launch: its operations on host memory planned into
//! one job of the engine (collectives one after another in the order
//! given, then every send and receive at once).

use crate::buf::Region;
use crate::call::Call;
use crate::comm::Communicator;
use crate::exec::{Label, Task};
use crate::job::{Action, Extras, Job};
use crate::op::Op;
use crate::plan;
use oxccl_core::{DataType, Error, Result};

impl Communicator {
    /// Plans checked host operations into one job (`None`: nothing to do):
    /// collectives one after another in the order given, then every send
    /// and receive at once (per peer in the order given; sends to this
    /// rank land in its receives from itself, in order). Nothing runs on an
    /// error. Operations on device memory are the caller's mistake.
    pub(crate) fn host_job(&self, ops: &[&Op]) -> Result<Option<Job>> {
        self.usable()?;
        let mut extras = Extras::default();
        let mut batches: Vec<Vec<Task>> = Vec::new();
        let mut p2p: Vec<(bool, usize, Region, DataType)> = Vec::new();
        // One operation keeps its own label; several are a "group" named by
        // the first one's number.
        let mut label: Option<Label> = None;
        let mut name = |l: Label| label = Some(label.map_or(l, |first| Label::new("group", first.seq)));
        let host = |what: &str| Error::Internal(format!("{what} on device memory reached the host planner"));
        for op in ops {
            match op {
                Op::Collective(call) => {
                    let (i, o) = (call.input.host(), call.output.host());
                    let (Some(i), Some(o)) = (i, o) else { return Err(host(call.kind.name())) };
                    let task = self.plan(&call.with_buffers(i, o), &mut extras)?;
                    name(task.label);
                    batches.push(vec![task]);
                }
                Op::Send(_) | Op::Recv(_) => {
                    let (send, p) = op.p2p().expect("a send or a receive");
                    let region = p.buf.host().ok_or_else(|| host(op.name()))?;
                    p2p.push((send, p.peer, region, p.dtype));
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
            self_copies(self.rank(), selfs, &mut extras)?;
            name(Label::new("p2p", seq));
            batches.push(tasks);
        }
        if batches.is_empty() && extras.pre.is_empty() {
            return Ok(None);
        }
        let label = label.unwrap_or(Label::new("group", self.last_seq()));
        Ok(Some(Job::new(label, batches, extras, None)))
    }

    /// A host collective planned into a job of its own (the staged device
    /// path's chunks, the owned-buffer calls).
    pub(crate) fn collective_job(
        &self,
        call: &Call<Region>,
        keep: Option<Box<dyn std::any::Any + Send>>,
    ) -> Result<Job> {
        let mut extras = Extras::default();
        let task = self.plan(call, &mut extras)?;
        Ok(Job::new(task.label, vec![vec![task]], extras, keep))
    }
}

/// A group's sends to this rank matched with its receives from it, in
/// order, as copies before the group's tasks.
fn self_copies(rank: usize, (sends, recvs): (Vec<Region>, Vec<Region>), extras: &mut Extras) -> Result<()> {
    if sends.len() != recvs.len() {
        return Err(Error::invalid(format!(
            "rank {rank}: a group sends {} and receives {} buffers to and from itself",
            sends.len(),
            recvs.len()
        )));
    }
    for (s, r) in sends.into_iter().zip(recvs) {
        if s.len() != r.len() {
            return Err(Error::invalid(format!(
                "rank {rank}: self send of {} bytes matched with a receive of {}",
                s.len(),
                r.len()
            )));
        }
        extras.pre.push(Action::Copy { dst: r, src: s });
    }
    Ok(())
}
