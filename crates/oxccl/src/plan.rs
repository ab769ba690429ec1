//! Planning: a call's arguments → checked buffers → tasks of the executor.

use crate::buf::{Owned, Region};
use crate::engine::Action;
use crate::exec::{Bufs, Label, Lane, Task};
use crate::tuner::Tuner;
use oxccl_algo::algos::{Algorithm, BuildOptions, build};
use oxccl_algo::collective::{CollKind, Collective};
use oxccl_algo::ir::{Slice, Step};
use oxccl_core::{DataType, Error, ReduceOp, Result};
use oxccl_transport::P2P_CHANNEL;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// One rank's share of a built program, cached per collective.
#[derive(Clone)]
pub(crate) struct Part {
    pub algo: Algorithm,
    pub channels: Vec<Arc<Vec<Step>>>,
    pub scratch: usize,
    pub in_place: bool,
}

/// A cached program: the collective and a forced algorithm, if any.
type Key = (Collective, Option<Algorithm>);

/// The cached parts and their keys, oldest first.
type Entries = (HashMap<Key, Arc<Part>>, VecDeque<Key>);

/// Recently built programs (a training loop or a benchmark repeats calls).
#[derive(Default)]
pub(crate) struct Cache {
    map: Mutex<Entries>,
}

const CACHE_ENTRIES: usize = 64;

impl Cache {
    /// This rank's part of the program for `coll`, with `algo` or the
    /// tuner's choice.
    pub fn part(&self, tuner: &Tuner, coll: &Collective, rank: usize, algo: Option<Algorithm>) -> Result<Arc<Part>> {
        let key = (*coll, algo);
        if let Some(p) = self.map.lock().0.get(&key) {
            return Ok(p.clone());
        }
        let algo_used = match algo {
            Some(a) => a,
            None => tuner.pick(coll)?,
        };
        let opts = BuildOptions { chunk_bytes: tuner.chunk_bytes(), max_chunks: usize::MAX };
        let mut prog = build(algo_used, coll, &opts)?;
        let rp = std::mem::take(&mut prog.ranks[rank]);
        let part = Arc::new(Part {
            algo: algo_used,
            channels: rp.channels.into_iter().map(Arc::new).collect(),
            scratch: rp.scratch,
            in_place: prog.in_place,
        });
        let mut g = self.map.lock();
        if g.1.len() >= CACHE_ENTRIES
            && let Some(old) = g.1.pop_front()
        {
            g.0.remove(&old);
        }
        g.0.insert(key, part.clone());
        g.1.push_back(key);
        Ok(part)
    }
}

/// What the engine must own and do around a task.
#[derive(Default)]
pub(crate) struct Extras {
    pub pre: Vec<Action>,
    pub post: Vec<Action>,
    pub owned: Vec<Owned>,
}

impl Extras {
    fn temp(&mut self, len: usize) -> Region {
        let mut o = Owned::zeroed(len);
        let r = o.region();
        self.owned.push(o);
        r
    }
}

/// A collective's task: `input` and `output` are the caller's regions
/// (already checked against the collective's sizes; they alias when the
/// call is in place).
#[allow(clippy::too_many_arguments)]
pub(crate) fn collective(
    cache: &Cache,
    tuner: &Tuner,
    coll: &Collective,
    rank: usize,
    op: ReduceOp,
    mut input: Region,
    output: Region,
    mut label: Label,
    extras: &mut Extras,
) -> Result<Task> {
    let es = coll.dtype.size();
    let part = cache.part(tuner, coll, rank, None)?;
    let in_place = input.overlaps(&output);
    let layout = coll.in_place_layout(rank);
    let nccl_layout = output.addr() as isize + (layout.input_at as isize - layout.output_at as isize) * es as isize
        == input.addr() as isize;
    if coll.kind.reduces()
        && let ReduceOp::PreMulSum { scalar } = op
    {
        let t = extras.temp(input.len());
        extras.pre.push(Action::Premul { dtype: coll.dtype, dst: t, src: input, scalar });
        input = t;
    } else if in_place && !(part.in_place && nccl_layout) {
        let t = extras.temp(input.len());
        extras.pre.push(Action::Copy { dst: t, src: input });
        input = t;
    }
    if coll.kind.reduces() && op == ReduceOp::Avg && !output.is_empty() {
        extras.post.push(Action::Avg { dtype: coll.dtype, buf: output, n: coll.nranks });
    }
    let scratch = if part.scratch == 0 { Region::empty() } else { extras.temp(part.scratch * es) };
    let kop = match op {
        ReduceOp::Avg | ReduceOp::PreMulSum { .. } => ReduceOp::Sum,
        o => o,
    };
    let lanes = part.channels.iter().enumerate().map(|(i, ch)| Lane::new(ch.clone(), i as u32)).collect();
    Ok(Task {
        lanes,
        bufs: Bufs { input, output, scratch },
        dtype: coll.dtype,
        op: kop,
        label: {
            label.algo = Some(part.algo);
            label
        },
    })
}

/// A point-to-point task: one send or one receive on [`P2P_CHANNEL`].
pub(crate) fn p2p(send: bool, peer: usize, region: Region, dtype: DataType, mut label: Label) -> Task {
    label.p2p = Some((send, peer));
    let n = region.len() / dtype.size();
    let step =
        if send { Step::Send { peer, src: Slice::input(0, n) } } else { Step::Recv { peer, dst: Slice::output(0, n) } };
    let (input, output) = if send { (region, Region::empty()) } else { (Region::empty(), region) };
    Task {
        lanes: vec![Lane::new(Arc::new(vec![step]), P2P_CHANNEL)],
        bufs: Bufs { input, output, scratch: Region::empty() },
        dtype,
        op: ReduceOp::Sum,
        label,
    }
}

/// Checks that a caller's buffer of `have` elements holds `need`.
pub(crate) fn check_len(what: &str, op: &str, rank: usize, have: usize, need: usize) -> Result<()> {
    if have < need {
        return Err(Error::invalid(format!(
            "rank {rank}: {op}: {what} holds {have} elements but the call needs {need}"
        )));
    }
    Ok(())
}

/// Where `rank`'s input and output of `coll` lie, as (offset, length) in
/// bytes: in the send and receive buffers of `send_len` and `recv_len`
/// bytes, or, in place (`send_len: None`), both in the receive buffer at
/// NCCL's in-place offsets. Checks the collective and the lengths first
/// (errors name the rank, the operation and the buffer), so the offsets
/// cannot overflow.
pub(crate) fn spans(
    coll: &Collective,
    op: ReduceOp,
    rank: usize,
    send_len: Option<usize>,
    recv_len: usize,
) -> Result<((usize, usize), (usize, usize))> {
    check_collective(coll, op, rank)?;
    let (es, name) = (coll.dtype.size(), coll.kind.name());
    let (ni, no) = (coll.input_len(rank), coll.output_len(rank));
    match send_len {
        Some(s) => {
            check_len("the send buffer", name, rank, s / es, ni)?;
            check_len("the receive buffer", name, rank, recv_len / es, no)?;
            Ok(((0, ni * es), (0, no * es)))
        }
        None => {
            let l = coll.in_place_layout(rank);
            check_len("the buffer", name, rank, recv_len / es, l.len)?;
            Ok(((l.input_at * es, ni * es), (l.output_at * es, no * es)))
        }
    }
}

/// Checks a collective's arguments on `rank`: root, op for the type,
/// sizes that fit in memory.
pub(crate) fn check_collective(coll: &Collective, op: ReduceOp, rank: usize) -> Result<()> {
    coll.validate().map_err(|e| match e {
        Error::InvalidArgument(m) => Error::invalid(format!("rank {rank}: {m}")),
        other => other,
    })?;
    if coll.kind.reduces() {
        op.check(coll.dtype).map_err(|e| Error::invalid(format!("rank {rank}: {}: {e}", coll.kind)))?;
    }
    if coll.kind == CollKind::SendRecv {
        return Err(Error::invalid("sendrecv is not a call; use send and recv in a group"));
    }
    Ok(())
}
