//! Planning: a checked call → this rank's task of the executor, with the
//! actions and storage around it.

use crate::buf::Region;
use crate::call::Call;
use crate::exec::sig::Sig;
use crate::exec::{Bufs, Label, Lane, Task};
use crate::job::{Action, Extras};
use crate::tuner::{Choice, Decision, Reason, Tuner};
use oxccl_algo::collective::Collective;
use oxccl_algo::ir::{Program, Slice, Step};
use oxccl_algo::scale::{OneSidedPeers, one_sided_peers_all};
use oxccl_core::{DataType, ReduceOp, Result};
use oxccl_transport::P2P_CHANNEL;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, LazyLock, OnceLock};

/// One rank's share of a built program, cached per collective.
#[derive(Clone)]
pub(crate) struct Part {
    pub choice: Choice,
    pub channels: Vec<Arc<Vec<Step>>>,
    pub scratch: usize,
    pub in_place: bool,
    pub peers: Option<Arc<OneSidedPeers>>,
}

impl Part {
    /// `rank`'s share of a program built in this process.
    fn of(choice: Choice, built: &Built, rank: usize) -> Part {
        let rp = &built.prog.ranks[rank];
        Part {
            choice,
            channels: rp.channels.iter().cloned().map(Arc::new).collect(),
            scratch: rp.scratch,
            in_place: built.prog.in_place,
            peers: built.peers.as_ref().map(|p| p[rank].clone()),
        }
    }
}

/// A program built in this process, every rank's one-sided peers, and
/// (once a deterministic communicator asked) why it is not canonical.
struct Built {
    prog: Program,
    peers: Option<Vec<Arc<OneSidedPeers>>>,
    order: OnceLock<Option<String>>,
}

/// What a build depends on: the choice, the collective (ranks, count,
/// type, root), the pipeline chunk, the channels and the placement (a
/// hash of it: communicators of one process may span hosts differently).
type BuildKey = (Choice, Collective, usize, usize, u64);

/// Programs recently built in this process, shared by its ranks: ranks
/// that are threads of one process build each program once, not once
/// each (a one-shot all-reduce of n ranks has n² steps: n threads each
/// building it, and each reading it whole for its one-sided peers, took
/// seconds for the first call of 256 ranks).
#[allow(clippy::type_complexity)]
static BUILT: LazyLock<Mutex<(HashMap<BuildKey, Arc<Built>>, VecDeque<BuildKey>)>> = LazyLock::new(Default::default);

/// The program `choice` gives for `coll`: built once per process when
/// `shared` (other ranks here want it too), else for this call.
fn built(tuner: &Tuner, choice: Choice, coll: &Collective, shared: bool) -> Result<Arc<Built>> {
    let make = || -> Result<Arc<Built>> {
        let prog = tuner.build(choice, coll)?;
        let peers = prog.has_one_sided().then(|| one_sided_peers_all(&prog).into_iter().map(Arc::new).collect());
        Ok(Arc::new(Built { prog, peers, order: OnceLock::new() }))
    };
    if !shared {
        return make();
    }
    let placement = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        tuner.placement().hash(&mut h);
        h.finish()
    };
    let key = (choice, *coll, tuner.chunk_for(choice), tuner.channels_for(coll), placement);
    if let Some(b) = BUILT.lock().0.get(&key) {
        return Ok(b.clone());
    }
    let b = make()?;
    let mut g = BUILT.lock();
    if !g.0.contains_key(&key) {
        let (map, order) = &mut *g;
        remember(map, order, key, b.clone());
    }
    Ok(b)
}

/// Inserts `key` into a cache of at most [`CACHE_ENTRIES`], dropping the
/// oldest entry (by `order`) when full.
fn remember<K: std::hash::Hash + Eq + Copy, V>(map: &mut HashMap<K, V>, order: &mut VecDeque<K>, key: K, v: V) {
    if order.len() >= CACHE_ENTRIES
        && let Some(old) = order.pop_front()
    {
        map.remove(&old);
    }
    map.insert(key, v);
    order.push_back(key);
}

/// A cached program: the collective and a forced choice, if any.
type Key = (Collective, Option<Choice>);

/// The cached parts, their keys oldest first, and the last one used (a
/// loop repeats one call: no hashing then).
type Entries = (HashMap<Key, Arc<Part>>, VecDeque<Key>, Option<(Key, Arc<Part>)>);

/// Recently built programs (a training loop or a benchmark repeats calls).
#[derive(Default)]
pub(crate) struct Cache {
    map: Mutex<Entries>,
    /// Whether other ranks of the communicator run in this process: their
    /// programs are then built once for all ([`BUILT`]); alone, a rank
    /// keeps only its own part.
    shared: bool,
}

const CACHE_ENTRIES: usize = 64;

impl Cache {
    /// An empty cache; `shared`: other ranks of the communicator run in
    /// this process.
    pub fn new(shared: bool) -> Cache {
        Cache { map: Mutex::default(), shared }
    }

    /// This rank's part of the program for `coll`, with `forced` or the
    /// tuner's choice; `who` names the communicator in the log line that
    /// says which algorithm a new (collective, size) runs and what decided
    /// it (`OXCCL_ALGO`, a program file, the cost model).
    pub fn part(
        &self,
        tuner: &Tuner,
        coll: &Collective,
        rank: usize,
        forced: Option<Choice>,
        who: &str,
    ) -> Result<Arc<Part>> {
        let key = (*coll, forced);
        {
            let mut g = self.map.lock();
            if let Some((k, p)) = &g.2
                && *k == key
            {
                return Ok(p.clone());
            }
            if let Some(p) = g.0.get(&key).cloned() {
                g.2 = Some((key, p.clone()));
                return Ok(p);
            }
        }
        let decision = match forced {
            Some(choice) => Decision { choice, reason: Reason::Forced { setting: "the caller".into() } },
            None => tuner.decide(coll)?,
        };
        let choice = decision.choice;
        let built = built(tuner, choice, coll, self.shared)?;
        // The deterministic mode proves every program before its first run
        // (once per program in this process, whoever built it).
        if tuner.strict(coll)
            && let Some(why) = built.order.get_or_init(|| crate::tuner::departure(&built.prog))
        {
            return Err(crate::tuner::refusal(coll, &built.prog.name, why));
        }
        tracing::info!(
            "{who}: {} of {} bytes ({}) on {} ranks runs {decision}",
            coll.kind,
            coll.size_bytes(),
            coll.dtype,
            coll.nranks,
        );
        let part = Arc::new(Part::of(choice, &built, rank));
        let mut g = self.map.lock();
        let (map, order, last) = &mut *g;
        remember(map, order, key, part.clone());
        *last = Some((key, part.clone()));
        Ok(part)
    }
}

/// A collective's task from a checked call (whose input and output alias
/// when it is in place); `coll_seq` numbers it among the communicator's
/// collectives (for its signature).
pub(crate) fn collective(
    part: &Part,
    call: &Call<Region>,
    mut label: Label,
    coll_seq: u64,
    extras: &mut Extras,
) -> Result<Task> {
    let coll = call.collective();
    let (rank, op) = (call.rank, call.op);
    let (mut input, output) = (call.input, call.output);
    let es = coll.dtype.size();
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
    label.algo = Some(part.choice);
    let sig = Sig::new(coll.kind, coll.dtype, op, coll.root, coll_seq);
    Ok(Task::new(lanes, Bufs { input, output, scratch }, coll.dtype, kop, label, part.peers.clone())
        .signed(sig, coll.count))
}

/// A point-to-point task: one send or one receive on [`P2P_CHANNEL`].
pub(crate) fn p2p(send: bool, peer: usize, region: Region, dtype: DataType, mut label: Label) -> Task {
    label.p2p = Some((send, peer));
    let n = region.len() / dtype.size();
    let step =
        if send { Step::Send { peer, src: Slice::input(0, n) } } else { Step::Recv { peer, dst: Slice::output(0, n) } };
    let (input, output) = if send { (region, Region::empty()) } else { (Region::empty(), region) };
    let lanes = vec![Lane::new(Arc::new(vec![step]), P2P_CHANNEL)];
    Task::new(lanes, Bufs { input, output, scratch: Region::empty() }, dtype, ReduceOp::Sum, label, None)
}
