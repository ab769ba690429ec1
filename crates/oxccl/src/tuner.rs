//! The tuner: which algorithm (built-in, or a researcher's program) and
//! chunk size for a collective, from the cost model with the link
//! parameters the providers report, unless `OXCCL_ALGO` says.
//!
//! `OXCCL_ALGO` (and `NCCL_ALGO` through the C ABI) takes NCCL's grammar:
//! a comma-separated list of algorithms (`ring,tree`), a list to exclude
//! (`^tree`), or per-collective lists separated by semicolons
//! (`allreduce:tree;broadcast:ring`). Names of NCCL algorithms oxccl does
//! not have (`collnet`, `nvls`, `pat`, …) are ignored with a warning; the
//! names of the communicator's programs ([`crate::programs`]) are
//! algorithms too. A name that cannot run is an error when the
//! communicator is made, saying why.
//!
//! Two-sided algorithms are priced with the providers' FIFO links,
//! one-sided ones (`oneshot`, `twoshot`, `direct`: the table's
//! [`one_sided`](oxccl_algo::algos::AlgoSpec::one_sided)) with their
//! one-sided links, programs with the simulator on the matching links.
//!
//! Built-in algorithms are built on the communicator's
//! [`Placement`]: rings follow the hosts, `hier` runs inside hosts and
//! rail by rail across them, and the cost model prices them with the
//! hosts' shape (hosts × ranks per host) where it is uniform.
//!
//! [`Tuner::decide`] also says what decided ([`Reason`]): the algorithm
//! setting (`OXCCL_ALGO`, `NCCL_ALGO` or `Config::algo`) leaving one
//! candidate, a collective only one algorithm runs, or the cost model;
//! `OXCCL_DEBUG=INFO` logs it with the first call of each (collective,
//! size), and names the file a chosen program was loaded from.

use crate::programs::{self, ProgramId};
use oxccl_algo::algos::{Algorithm, BuildOptions, build, build_on, is_nccl_only};
use oxccl_algo::collective::{CollKind, Collective};
use oxccl_algo::cost::{Link, Rails, Topology};
use oxccl_algo::ir::Program;
use oxccl_algo::placement::Placement;
use oxccl_core::{Error, Result};
use oxccl_transport::provider::{LinkCost, LinkParams};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::LazyLock;

/// What runs a collective: a built-in algorithm or a registered program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Choice {
    /// A built-in algorithm.
    Builtin(Algorithm),
    /// A researcher's program.
    Program(ProgramId),
}

impl std::fmt::Display for Choice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Choice::Builtin(a) => write!(f, "{a}"),
            Choice::Program(id) => write!(f, "program {}", programs::name(*id)),
        }
    }
}

/// Bytes per second a host core reduces (about what it copies): whole-buffer
/// algorithms (recursive doubling) pay for reducing everything on every
/// rank, which only small messages can afford.
const HOST_REDUCE_BW: f64 = 10e9;

/// Bytes per second of a local copy (one-shot copies its result out).
const HOST_COPY_BW: f64 = 10e9;

/// Up to this many ranks on several hosts, the tuner prices built-in
/// algorithms by simulating them on the placement (once per collective
/// and size: decisions are cached); beyond, by their closed forms.
pub const SIMULATED_RANKS: usize = 64;

/// Pipeline chunks per slice in the programs the tuner simulates (the
/// programs it runs have as many as the FIFOs ask for).
const SIMULATED_CHUNKS: usize = 4;

/// Where the tuner simulates the placement, it picks, among the algorithms
/// predicted within this factor of the fastest, the one that moves the
/// fewest bytes between hosts: the network is what other jobs share, and
/// TCP's link parameters are a table, not a measurement (on one machine,
/// namespaces joined by veth are no slower than shared memory).
pub const CROSSING_MARGIN: f64 = 1.25;

/// `t` with a host core's reduce and copy rates.
fn on_host(t: Topology) -> Topology {
    t.with_reduce_bw(HOST_REDUCE_BW).with_copy_bw(HOST_COPY_BW)
}

/// Why [`Tuner::decide`] chose what it chose.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The algorithm setting left this one alone for the collective;
    /// `setting` names it and its text (`OXCCL_ALGO="ring"`).
    Forced {
        /// The setting and its text.
        setting: String,
    },
    /// Nothing else runs the collective here.
    Only,
    /// The cheapest by the cost model (programs: the simulator) among
    /// every candidate, or among those `setting` allows.
    Cost {
        /// The setting and its text when it ruled some candidates out.
        among: Option<String>,
    },
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reason::Forced { setting } => write!(f, "forced by {setting}"),
            Reason::Only => f.write_str("the only one that runs it"),
            Reason::Cost { among: None } => f.write_str("the tuner's pick"),
            Reason::Cost { among: Some(setting) } => write!(f, "the tuner's pick of those {setting} allows"),
        }
    }
}

/// What runs a collective, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// What runs it.
    pub choice: Choice,
    /// What decided.
    pub reason: Reason,
}

impl std::fmt::Display for Decision {
    /// `ring (the tuner's pick)`; a program loaded from a file says which.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}", self.choice, self.reason)?;
        if let Choice::Program(id) = self.choice
            && let Some(file) = programs::file(id)
        {
            write!(f, "; loaded from {}", file.display())?;
        }
        f.write_str(")")
    }
}

/// Which algorithms each collective may use.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AlgoFilter {
    /// For all collectives without an entry of their own: allowed set.
    all: Option<(bool, Vec<Choice>)>,
    per: HashMap<CollKind, (bool, Vec<Choice>)>,
    /// The setting it was parsed from and its text, as the log names it
    /// (`OXCCL_ALGO="ring"`); empty when nothing was set.
    setting: String,
}

fn kind_key(s: &str) -> Option<CollKind> {
    let k: String = s.chars().filter(|c| c.is_ascii_alphanumeric()).collect::<String>().to_ascii_lowercase();
    CollKind::ALL.into_iter().find(|c| c.name().replace('_', "") == k)
}

impl AlgoFilter {
    /// Parses NCCL's `NCCL_ALGO` grammar; `programs` are the names
    /// (besides the built-in algorithms') it may use.
    pub fn parse(text: &str, programs: &[ProgramId]) -> Result<AlgoFilter> {
        let mut f = AlgoFilter::default();
        if !text.trim().is_empty() {
            f.setting = format!("OXCCL_ALGO={:?}", text.trim());
        }
        for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (kinds, list) = match part.split_once(':') {
                Some((k, l)) => {
                    let kinds = k
                        .split(',')
                        .map(|k| {
                            kind_key(k.trim()).ok_or_else(|| {
                                Error::invalid(format!("OXCCL_ALGO={text:?}: unknown collective {:?}", k.trim()))
                            })
                        })
                        .collect::<Result<Vec<_>>>()?;
                    (Some(kinds), l)
                }
                None => (None, part),
            };
            let (negate, list) = match list.trim().strip_prefix('^') {
                Some(rest) => (true, rest),
                None => (false, list.trim()),
            };
            let mut algos = Vec::new();
            for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                if let Some(&id) = programs.iter().find(|&&id| programs::name(id) == name) {
                    algos.push(Choice::Program(id));
                    continue;
                }
                match name.parse::<Algorithm>() {
                    Ok(a) => algos.push(Choice::Builtin(a)),
                    Err(_) if is_nccl_only(name) => {
                        tracing::warn!("OXCCL_ALGO: oxccl has no {name} algorithm; ignored");
                    }
                    Err(e) => {
                        let extra = match programs.is_empty() {
                            true => String::new(),
                            false => {
                                let names: Vec<String> = programs.iter().map(|&i| programs::name(i)).collect();
                                format!(", or one of this communicator's programs: {}", names.join(" "))
                            }
                        };
                        return Err(Error::invalid(format!("OXCCL_ALGO={text:?}: {e}{extra}")));
                    }
                }
            }
            match kinds {
                None => f.all = Some((negate, algos)),
                Some(ks) => {
                    for k in ks {
                        f.per.insert(k, (negate, algos.clone()));
                    }
                }
            }
        }
        Ok(f)
    }

    /// The same, saying that it came from `name` (`NCCL_ALGO`,
    /// `Config::algo`) rather than `OXCCL_ALGO`, as the log says what
    /// decided a choice.
    pub fn set_by(mut self, name: &str) -> AlgoFilter {
        if let Some((_, text)) = self.setting.split_once('=') {
            self.setting = format!("{name}={text}");
        }
        self
    }

    /// Whether `algo` may run `kind`.
    pub fn allows(&self, kind: CollKind, algo: Choice) -> bool {
        match self.per.get(&kind).or(self.all.as_ref()) {
            None => true,
            Some((negate, list)) => list.contains(&algo) != *negate,
        }
    }

    /// Checks that every per-collective list leaves the collective an
    /// algorithm that implements it (`allreduce:pairwise` cannot run).
    fn check(&self, candidates: impl Fn(CollKind) -> Vec<Choice>) -> Result<()> {
        for (kind, (negate, list)) in &self.per {
            let have = candidates(*kind);
            if !have.iter().any(|c| list.contains(c) != *negate) {
                let names: Vec<String> = have.iter().map(Choice::to_string).collect();
                let asked: Vec<String> = list.iter().map(Choice::to_string).collect();
                return Err(Error::invalid(format!(
                    "OXCCL_ALGO: {kind}:{}{} leaves {kind} no algorithm that implements it; it has {}",
                    if *negate { "^" } else { "" },
                    asked.join(","),
                    names.join(", ")
                )));
            }
        }
        Ok(())
    }
}

/// Picks algorithms for one communicator.
#[derive(Clone, Debug)]
pub struct Tuner {
    /// Priced with FIFO links (two-sided algorithms and programs).
    two: Topology,
    /// Priced with one-sided links.
    one: Topology,
    filter: AlgoFilter,
    programs: Vec<ProgramId>,
    /// FIFO capacity of the slowest connection kind: chunks must fit twice.
    fifo: usize,
    /// `OXCCL_DETERMINISTIC`: floating-point reductions run only programs
    /// proven canonical.
    deterministic: bool,
    /// Which ranks share a host.
    placement: Placement,
    /// Channels host programs of built-in algorithms are cut into.
    channels: ChannelChoice,
    /// Whether every link has native one-sided access (shared memory,
    /// threads, RDMA; not sockets): a message there costs microseconds,
    /// so the canonical trees take chunks of at most [`TREE_CHUNK`].
    native: bool,
}

/// The largest pipeline chunk of the canonical trees (`ordered`) on
/// links with native one-sided access: a chunk's partial sums wait in
/// scratch between the tree's steps, and at this size they are still in
/// the core's cache when the next step reads them. Measured on 3 and 4
/// ranks over shared memory (docs/PERFORMANCE.md): the mode's all-reduce
/// took 1.12–1.75× the default's time at 1–16 MiB with the FIFO's 2 MiB
/// chunks, 0.86–1.31× with these, better at every point. Over TCP a
/// message costs more than the cache saves (3 ranks: 0.80–1.10× the
/// default with 2 MiB chunks, 1.06–1.31× with these), so sockets keep
/// the FIFO's chunk.
pub const TREE_CHUNK: usize = 128 << 10;

/// How many channels host programs run on: a count every collective
/// takes (`OXCCL_NCHANNELS`), or the tuner's per collective, from `lo`
/// up to `most` (the rails), as its size allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelChoice {
    /// Set by the user: every collective runs on `most`.
    pub fixed: bool,
    /// The fewest channels (`OXCCL_MIN_NCHANNELS`).
    pub lo: usize,
    /// The most (the rails between hosts, within the bounds).
    pub most: usize,
    /// The rails between hosts (interfaces, HCA ports): the simulated
    /// NICs per host, channel `c` of local rank `i`'s sends on rail
    /// `(c + i) mod rails` as the transports do.
    pub rails: usize,
}

impl ChannelChoice {
    /// Every collective on `n` channels.
    pub fn fixed(n: usize) -> ChannelChoice {
        ChannelChoice { fixed: true, lo: n.max(1), most: n.max(1), rails: 1 }
    }
}

/// The smallest share of a collective's bytes worth a channel of its own:
/// four bandwidth-delay products of the link between hosts (so that its
/// latency is at most a fifth of the share's time), and at least 64 KiB.
pub fn min_channel_bytes(inter: oxccl_algo::cost::Link) -> usize {
    ((4.0 * inter.bw * inter.lat) as usize).max(64 << 10)
}

/// The variable (and value) that turns the deterministic mode on, as
/// messages name it.
pub const DETERMINISTIC: &str = "OXCCL_DETERMINISTIC=1";

/// What the verifier said of a (choice, collective kind, ranks, root):
/// `None` when canonical, else why not.
type Proofs = HashMap<(Choice, CollKind, usize, usize), Option<String>>;

/// The canonical tree over `n` ranks, written out up to 16 ranks.
fn tree_text(n: usize) -> String {
    match n {
        ..=16 => oxccl_algo::canon::expr(n),
        _ => format!("the balanced tree over ranks 0..{n}"),
    }
}

/// Why `program` cannot run in the deterministic mode (`None`: it can):
/// the verifier's departure from the canonical order (in or out of
/// place), its error, or a reduce step of more than two operands (the
/// device kernel adds those in `f32` and rounds narrow types once, where
/// the canonical order rounds at every node).
pub(crate) fn departure(program: &Program) -> Option<String> {
    for (r, rp) in program.ranks.iter().enumerate() {
        for (c, chan) in rp.channels.iter().enumerate() {
            for (i, step) in chan.iter().enumerate() {
                if let oxccl_algo::ir::Step::Reduce { srcs, .. } = step
                    && srcs.len() > 2
                {
                    return Some(format!(
                        "{}: rank {r} channel {c} step {i} reduces {} operands in one step, which the device rounds once; the deterministic mode takes two at a time",
                        program.name,
                        srcs.len()
                    ));
                }
            }
        }
    }
    match oxccl_algo::verify::verify(program) {
        Ok(report) => report.departure.map(|d| d.message),
        Err(e) => Some(e.to_string()),
    }
}

/// The error for `coll` about to run `program`, which `why` keeps from
/// the canonical order.
pub(crate) fn refusal(coll: &Collective, program: &str, why: &str) -> Error {
    Error::InvalidUsage(format!(
        "{DETERMINISTIC}: {} of {} ranks would run {program}, which is not canonical: {why}",
        coll.kind, coll.nranks
    ))
}

/// Proofs of canonical order, per process (the same algorithm at the same
/// rank count is proven once).
static PROOFS: LazyLock<Mutex<Proofs>> = LazyLock::new(Default::default);

/// Whether the verifier proves `c`'s programs for `coll`'s kind, ranks
/// and root canonical ([`oxccl_algo::canon`]); why not, when not. A
/// built-in algorithm is proven at a count that leaves uneven blocks,
/// in several pipeline chunks (every program that runs is proven again
/// at its own count before it runs: [`Tuner::prove`]); a program, as
/// registered (scaling keeps its order).
fn canonical(c: Choice, coll: &Collective) -> std::result::Result<(), String> {
    let root = if coll.kind.is_rooted() { coll.root } else { 0 };
    let key = (c, coll.kind, coll.nranks, root);
    if let Some(v) = PROOFS.lock().get(&key) {
        return v.clone().map_or(Ok(()), Err);
    }
    let program = match c {
        Choice::Builtin(a) => {
            let at = Collective { count: 3 * coll.nranks + 1, ..*coll };
            build(a, &at, &BuildOptions { chunk_bytes: 4 * at.dtype.size(), max_chunks: 3 })
        }
        Choice::Program(id) => Ok(programs::get(id).program.clone()),
    };
    let verdict = match program {
        Ok(p) => departure(&p),
        Err(e) => Some(e.to_string()),
    };
    PROOFS.lock().insert(key, verdict.clone());
    verdict.map_or(Ok(()), Err)
}

fn link(c: LinkCost) -> Link {
    Link::new(c.bw, c.lat)
}

impl Tuner {
    /// A tuner for ranks placed on hosts as `placement` says (priced as
    /// one host per rank when the hosts are uneven), with the link
    /// parameters the providers report for peers on this host (`intra`)
    /// and on others (`inter`); `programs` join the built-in algorithms.
    /// An error when the filter asks for what cannot run here, saying why.
    pub fn new(
        placement: Placement,
        (intra, inter): (Option<LinkParams>, Option<LinkParams>),
        filter: AlgoFilter,
        programs: Vec<ProgramId>,
        fifo: usize,
    ) -> Result<Tuner> {
        let fallback = LinkParams {
            fifo: LinkCost { bw: 5e9, lat: 5e-6 },
            one_sided: LinkCost { bw: 5e9, lat: 5e-6 },
            native: true,
        };
        let (nodes, per_node) = match placement.per_host() {
            Some(l) => (placement.nhosts(), l),
            None => (placement.nranks(), 1),
        };
        let intra = intra.or(inter).unwrap_or(fallback);
        let inter = inter.unwrap_or(intra);
        let topo = |f: fn(&LinkParams) -> LinkCost| {
            on_host(Topology::new(nodes.max(1), per_node.max(1), link(f(&intra)), link(f(&inter))))
        };
        let t = Tuner {
            two: topo(|l| l.fifo),
            one: topo(|l| l.one_sided),
            filter,
            programs,
            fifo,
            deterministic: false,
            placement,
            channels: ChannelChoice::fixed(1),
            native: intra.native && inter.native,
        };
        t.filter.check(|k| t.candidates(k))?;
        Ok(t)
    }

    /// The same tuner in the deterministic mode ([`DETERMINISTIC`]) or
    /// not. In it, a program of a reducing collective that is not proven
    /// canonical is an error, naming where its order departs.
    pub fn deterministic(mut self, on: bool) -> Result<Tuner> {
        self.deterministic = on;
        if on {
            for &id in &self.programs {
                let c = programs::get(id).program.collective;
                if c.kind.reduces()
                    && let Err(why) = canonical(Choice::Program(id), &c)
                {
                    return Err(Error::InvalidUsage(format!(
                        "{DETERMINISTIC}: program {:?} is not proven to reduce in the canonical order, so it cannot run in the deterministic mode: {why}",
                        programs::name(id)
                    )));
                }
            }
        }
        Ok(self)
    }

    /// The same tuner building host programs of built-in algorithms on
    /// `n` channels ([`oxccl_algo::channels`]; a program whose messages
    /// cannot be split runs on one).
    pub fn channels(self, n: usize) -> Tuner {
        self.channel_choice(ChannelChoice::fixed(n))
    }

    /// The same tuner choosing channels as `choice` says.
    pub fn channel_choice(mut self, choice: ChannelChoice) -> Tuner {
        self.channels =
            ChannelChoice { lo: choice.lo.clamp(1, choice.most.max(1)), most: choice.most.max(1), ..choice };
        self
    }

    /// The channels `coll`'s host program runs on: the fixed count, or as
    /// many of the rails as give each a share of at least
    /// [`min_channel_bytes`] (never fewer than the lower bound).
    pub fn channels_for(&self, coll: &Collective) -> usize {
        let c = self.channels;
        if c.fixed {
            return c.most;
        }
        (coll.size_bytes() / min_channel_bytes(self.two.inter)).clamp(c.lo, c.most)
    }

    /// Whether `coll` must run in the canonical order: the deterministic
    /// mode is on, it reduces, and its type is floating point (integer
    /// sums, products, min and max give the same bits in every order).
    pub fn strict(&self, coll: &Collective) -> bool {
        self.deterministic && coll.kind.reduces() && coll.dtype.is_float()
    }

    /// Checks that `program`, about to run `coll`, is proven canonical
    /// where [`strict`](Tuner::strict) asks for it.
    pub fn prove(&self, program: &Program, coll: &Collective) -> Result<()> {
        match self.strict(coll).then(|| departure(program)).flatten() {
            None => Ok(()),
            Some(why) => Err(refusal(coll, &program.name, &why)),
        }
    }

    /// Everything that implements `kind` here: built-in algorithms, then
    /// the communicator's programs of that kind.
    fn candidates(&self, kind: CollKind) -> Vec<Choice> {
        let builtin = Algorithm::ALL.into_iter().filter(|a| a.supports(kind)).map(Choice::Builtin);
        let progs = self.programs.iter().filter(|&&id| programs::get(id).program.collective.kind == kind);
        builtin.chain(progs.map(|&id| Choice::Program(id))).collect()
    }

    /// Whether the filter lets `algo` run `kind`.
    pub fn allows(&self, kind: CollKind, algo: Algorithm) -> bool {
        self.filter.allows(kind, Choice::Builtin(algo))
    }

    /// Whether the user named what runs `kind`: `OXCCL_ALGO` has a list
    /// for it, or a list for all collectives that names one of its
    /// algorithms, or a program of that kind was loaded.
    pub fn names_algorithm(&self, kind: CollKind) -> bool {
        if self.filter.per.contains_key(&kind) {
            return true;
        }
        let candidates = self.candidates(kind);
        let listed = self.filter.all.as_ref().is_some_and(|(_, list)| list.iter().any(|c| candidates.contains(c)));
        listed || candidates.iter().any(|c| matches!(c, Choice::Program(_)))
    }

    /// The algorithm for `coll`, or an error when the filter leaves none.
    /// A list for all collectives (`OXCCL_ALGO=tree`) applies to those it
    /// names an algorithm of; the others keep every algorithm (a tree-only
    /// run still needs its all-gathers). A list for one collective
    /// (`allgather:tree`) is strict. Programs are candidates where they run
    /// `coll` (kind, ranks, root; a count they scale to).
    pub fn pick(&self, coll: &Collective) -> Result<Choice> {
        self.decide(coll).map(|d| d.choice)
    }

    /// [`pick`](Tuner::pick)'s choice and what decided it: the algorithm
    /// setting left one candidate ([`Reason::Forced`]), only one runs
    /// `coll` ([`Reason::Only`]), or the cost model chose
    /// ([`Reason::Cost`]).
    pub fn decide(&self, coll: &Collective) -> Result<Decision> {
        let runs = |c: &Choice| match c {
            Choice::Builtin(_) => true,
            Choice::Program(id) => programs::runs(*id, coll),
        };
        let supported: Vec<Choice> = self.candidates(coll.kind).into_iter().filter(runs).collect();
        let mut allowed: Vec<Choice> =
            supported.iter().copied().filter(|a| self.filter.allows(coll.kind, *a)).collect();
        let mut restricted = allowed.len() < supported.len();
        if allowed.is_empty() && !self.filter.per.contains_key(&coll.kind) {
            allowed = supported.iter().copied().filter(|c| matches!(c, Choice::Builtin(_))).collect();
            restricted = false;
        }
        if allowed.is_empty() {
            let have: Vec<String> = supported.iter().map(Choice::to_string).collect();
            return Err(Error::InvalidUsage(format!(
                "OXCCL_ALGO allows no algorithm that runs {coll}; it has {}",
                have.join(", ")
            )));
        }
        let strict = self.strict(coll);
        if strict {
            let mut refused = Vec::new();
            allowed.retain(|&c| match canonical(c, coll) {
                Ok(()) => true,
                Err(why) => {
                    refused.push(format!("{c}: {why}"));
                    false
                }
            });
            if allowed.is_empty() {
                return Err(Error::InvalidUsage(format!(
                    "{DETERMINISTIC}: {} allows no algorithm proven to reduce {coll} in the canonical order ({}); {}",
                    if restricted { self.filter.setting.as_str() } else { "oxccl" },
                    tree_text(coll.nranks),
                    refused.join("; ")
                )));
            }
        }
        let setting = || match (strict, restricted) {
            (true, true) => format!("{} and {DETERMINISTIC}", self.filter.setting),
            (true, false) => DETERMINISTIC.to_string(),
            (false, _) => self.filter.setting.clone(),
        };
        let restricted = restricted || strict;
        if allowed.len() == 1 {
            let reason = if restricted { Reason::Forced { setting: setting() } } else { Reason::Only };
            return Ok(Decision { choice: allowed[0], reason });
        }
        let priced: Vec<(f64, u64, Choice)> = allowed
            .iter()
            .map(|&c| {
                let (t, crossing) = self.price(c, coll);
                (t.unwrap_or(f64::INFINITY), crossing, c)
            })
            .collect();
        let fastest = priced.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
        // Among those within the margin of the fastest, the fewest bytes
        // between hosts (0 for all on one host: then the fastest).
        let best = priced
            .iter()
            .filter(|p| p.0 <= fastest * CROSSING_MARGIN)
            .min_by(|x, y| x.1.cmp(&y.1).then(x.0.total_cmp(&y.0)))
            .map(|p| p.2)
            .unwrap_or(allowed[0]);
        Ok(Decision { choice: best, reason: Reason::Cost { among: restricted.then(setting) } })
    }

    /// The topology priced for `coll` with `two` or `one`-sided links
    /// (one rank per node at the bottleneck when the rank count differs).
    fn topo(&self, coll: &Collective, one_sided: bool) -> Topology {
        let topo = if one_sided { self.one } else { self.two };
        if topo.nranks() == coll.nranks {
            return topo;
        }
        on_host(Topology::one_rank_per_node(coll.nranks, topo.bottleneck()))
    }

    /// The predicted time of `c` for `coll`, if there is a model for it.
    /// Where ranks are on several hosts (not one per rank) and there are
    /// at most [`SIMULATED_RANKS`], built-in algorithms are simulated on
    /// the placement rather than priced by their closed forms, which
    /// assume every hop takes the slowest link: which of their messages
    /// cross hosts depends on how ranks are numbered.
    pub fn estimate(&self, c: Choice, coll: &Collective) -> Option<f64> {
        self.price(c, coll).0
    }

    /// [`estimate`](Tuner::estimate), and the elements its program moves
    /// between hosts where it was simulated on the placement (else 0).
    fn price(&self, c: Choice, coll: &Collective) -> (Option<f64>, u64) {
        let simulate = |p: &Program| {
            let rails = self.channels.rails.max(1);
            let topo = self.topo(coll, p.has_one_sided()).with_nics(rails).with_rails(Rails::BySender);
            let time = match self.placement.per_host() {
                Some(_) if self.simulates(coll) => oxccl_algo::sim::simulate_on(p, &topo, &self.placement),
                _ => oxccl_algo::sim::simulate(p, &topo),
            };
            let crossing = if self.simulates(coll) { self.placement.crossing_elems(p).unwrap_or(0) } else { 0 };
            (time.ok().map(|r| r.time), crossing)
        };
        match c {
            Choice::Builtin(a) if self.simulates(coll) => {
                // On the channels it would run on, over the rails.
                let opts = BuildOptions { chunk_bytes: self.chunk_for(c), max_chunks: SIMULATED_CHUNKS };
                let ch = self.channels_for(coll);
                let split = (ch > 1).then(|| oxccl_algo::channels::build(a, coll, &opts, &self.placement, ch).ok());
                let p = split.flatten().map_or_else(|| build_on(a, coll, &opts, &self.placement), Ok);
                p.map_or((None, 0), |p| simulate(&p))
            }
            Choice::Builtin(a) => (oxccl_algo::algos::estimate(a, coll, &self.topo(coll, a.one_sided())), 0),
            Choice::Program(_) => self.build(c, coll).map_or((None, 0), |p| simulate(&p)),
        }
    }

    /// Whether [`estimate`](Tuner::estimate) simulates built-in
    /// algorithms for `coll`.
    fn simulates(&self, coll: &Collective) -> bool {
        !self.placement.is_flat() && self.placement.nranks() == coll.nranks && coll.nranks <= SIMULATED_RANKS
    }

    /// The program of `c` for `coll` on the host: built-in algorithms on
    /// the tuner's channels.
    pub fn build(&self, c: Choice, coll: &Collective) -> Result<Program> {
        self.build_chunked(c, coll, self.chunk_for(c), oxccl_algo::channels::MAX)
    }

    /// The pipeline chunk of `c`'s host programs: [`chunk_bytes`](Tuner::chunk_bytes),
    /// at most [`TREE_CHUNK`] for the canonical trees on native links.
    pub fn chunk_for(&self, c: Choice) -> usize {
        match c {
            Choice::Builtin(Algorithm::Ordered) if self.native => self.chunk_bytes().min(TREE_CHUNK),
            _ => self.chunk_bytes(),
        }
    }

    /// The program of `c` for `coll`, built-in algorithms pipelined in
    /// chunks of at most `chunk_bytes` on the tuner's channels, at most
    /// `max_channels` (the device executor's FIFOs are not the host's; a
    /// program whose messages cannot be split runs on one).
    pub fn build_chunked(
        &self,
        c: Choice,
        coll: &Collective,
        chunk_bytes: usize,
        max_channels: usize,
    ) -> Result<Program> {
        let a = match c {
            Choice::Builtin(a) => a,
            Choice::Program(id) => return programs::instantiate(id, coll),
        };
        let opts = BuildOptions { chunk_bytes, max_chunks: usize::MAX };
        if self.placement.nranks() != coll.nranks {
            return build(a, coll, &opts);
        }
        let channels = self.channels_for(coll).min(max_channels.max(1));
        if channels > 1 {
            match oxccl_algo::channels::build(a, coll, &opts, &self.placement, channels) {
                Ok(p) => return Ok(p),
                Err(e) => tracing::debug!("{a} for {coll} on one channel: {e}"),
            }
        }
        build_on(a, coll, &opts, &self.placement)
    }

    /// Which ranks share a host.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// Pipeline chunk in bytes: two messages (the verifier's two slots)
    /// plus their headers must fit in every connection's FIFO.
    pub fn chunk_bytes(&self) -> usize {
        ((self.fifo / 2).saturating_sub(128) / 64 * 64).max(64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: fn(Algorithm) -> Choice = Choice::Builtin;

    #[test]
    fn nccl_grammar() {
        let p = |t: &str| AlgoFilter::parse(t, &[]);
        let f = p("ring").unwrap();
        assert!(f.allows(CollKind::AllReduce, B(Algorithm::Ring)));
        assert!(!f.allows(CollKind::AllReduce, B(Algorithm::Tree)));
        let f = p("^tree").unwrap();
        assert!(
            f.allows(CollKind::AllReduce, B(Algorithm::Ring)) && !f.allows(CollKind::Broadcast, B(Algorithm::Tree))
        );
        let f = p("allreduce:tree;broadcast:ring").unwrap();
        assert!(
            f.allows(CollKind::AllReduce, B(Algorithm::Tree)) && !f.allows(CollKind::AllReduce, B(Algorithm::Ring))
        );
        assert!(
            f.allows(CollKind::Broadcast, B(Algorithm::Ring)) && !f.allows(CollKind::Broadcast, B(Algorithm::Tree))
        );
        assert!(f.allows(CollKind::AllGather, B(Algorithm::Rhd)));
        let f = p("ring,nvls").unwrap();
        assert!(f.allows(CollKind::AllReduce, B(Algorithm::Ring)));
        let e = p("allreduce:spiral").unwrap_err().to_string();
        assert!(e.contains("spiral"), "{e}");
        assert!(p("allscatter:ring").unwrap_err().to_string().contains("allscatter"));
    }

    fn shm() -> LinkParams {
        LinkParams { fifo: LinkCost { bw: 5e9, lat: 5e-6 }, one_sided: LinkCost { bw: 8e9, lat: 6e-6 }, native: true }
    }

    fn tuner(n: usize, filter: &str) -> Result<Tuner> {
        Tuner::new(Placement::flat(n), (Some(shm()), None), AlgoFilter::parse(filter, &[])?, Vec::new(), 4 << 20)
    }

    #[test]
    fn a_named_algorithm_is_told_apart_from_the_default() {
        // What decides whether device calls go through the executor
        // (OXCCL_DEVICE_EXEC=auto).
        assert!(!tuner(4, "").unwrap().names_algorithm(CollKind::AllReduce));
        let t = tuner(4, "tree").unwrap();
        assert!(t.names_algorithm(CollKind::AllReduce) && t.names_algorithm(CollKind::Broadcast));
        // A list for all collectives names nothing for one it has no algorithm of.
        assert!(!t.names_algorithm(CollKind::AllGather));
        let t = tuner(4, "allgather:ring").unwrap();
        assert!(t.names_algorithm(CollKind::AllGather) && !t.names_algorithm(CollKind::AllReduce));
        assert!(tuner(4, "^ring").unwrap().names_algorithm(CollKind::AllReduce));
    }

    #[test]
    fn picks_by_cost_and_respects_filter() {
        let t = tuner(8, "").unwrap();
        // Few latencies for tiny messages, bandwidth-optimal algorithms
        // for big ones.
        let tiny = t.pick(&Collective::new(CollKind::AllReduce, 8, 2)).unwrap();
        assert!(matches!(tiny, Choice::Builtin(Algorithm::Doubling | Algorithm::OneShot)), "{tiny}");
        let big = Collective::new(CollKind::AllReduce, 8, 64 << 20);
        let pick = t.pick(&big).unwrap();
        assert!(
            matches!(pick, Choice::Builtin(Algorithm::Ring | Algorithm::Rhd | Algorithm::TwoShot)),
            "{pick} for 256 MiB"
        );
        let t = tuner(8, "tree").unwrap();
        assert_eq!(t.pick(&big).unwrap(), B(Algorithm::Tree));
        // A global list leaves collectives it has nothing for alone ...
        assert!(t.pick(&Collective::new(CollKind::AllGather, 8, 4)).is_ok());
        assert_eq!(t.chunk_bytes(), (2 << 20) - 128);
        // ... a list for one collective is strict, and one that leaves it
        // nothing is an error when the communicator is made.
        let e = tuner(8, "allgather:tree").unwrap_err().to_string();
        assert!(e.contains("all_gather") && e.contains("ring") && e.contains("tree"), "{e}");
        assert!(tuner(8, "allreduce:pairwise").is_err());
        let t = tuner(8, "allreduce:twoshot").unwrap();
        assert_eq!(t.pick(&big).unwrap(), B(Algorithm::TwoShot), "one-sided algorithms run on host transports");
    }

    #[test]
    fn on_several_hosts_the_tuner_prices_the_placement() {
        let tcp = LinkParams {
            fifo: LinkCost { bw: 1e9, lat: 30e-6 },
            one_sided: LinkCost { bw: 1e9, lat: 60e-6 },
            native: false,
        };
        for (h, l) in [(2, 2), (2, 4), (4, 2)] {
            for at in [Placement::blocked(h, l), Placement::cyclic(h, l)] {
                let t = Tuner::new(at.clone(), (Some(shm()), Some(tcp)), AlgoFilter::default(), Vec::new(), 4 << 20)
                    .unwrap();
                let big = Collective::new(CollKind::AllReduce, h * l, 4 << 20);
                // hier, or what the simulator finds as fast and crossing
                // hosts no more (rhd on cyclic numbering with a power of
                // two of hosts: its first exchanges are inside the hosts).
                let Choice::Builtin(a) = t.pick(&big).unwrap() else { panic!("{at}: a program") };
                let est = |a| t.estimate(Choice::Builtin(a), &big).unwrap();
                assert!(est(a) <= est(Algorithm::Hier), "{at}: {a}");
                let opts = BuildOptions::default();
                let cross = |a| at.crossing_elems(&build_on(a, &big, &opts, &at).unwrap()).unwrap();
                assert!(cross(a) <= cross(Algorithm::Hier), "{at}: {a} crosses more than hier");
                assert!(matches!(a, Algorithm::Hier | Algorithm::Rhd), "{at}: {a}");
                // The simulated ring follows the hosts: the same time
                // whatever the numbering.
                let ring = t.estimate(Choice::Builtin(Algorithm::Ring), &big).unwrap();
                let blocked = Tuner::new(
                    Placement::blocked(h, l),
                    (Some(shm()), Some(tcp)),
                    AlgoFilter::default(),
                    Vec::new(),
                    4 << 20,
                )
                .unwrap();
                let same = blocked.estimate(Choice::Builtin(Algorithm::Ring), &big).unwrap();
                assert!((ring - same).abs() <= 1e-9 * ring, "{at}: {ring} vs {same}");
            }
        }
        // One host: closed forms, and hier is the ring (the ring wins the tie).
        let t = tuner(4, "ring,hier").unwrap();
        let big = Collective::new(CollKind::AllReduce, 4, 4 << 20);
        assert_eq!(t.pick(&big).unwrap(), Choice::Builtin(Algorithm::Ring));
    }

    #[test]
    fn host_programs_run_on_the_tuners_channels() {
        let t = tuner(4, "").unwrap().channels(3);
        let big = Collective::new(CollKind::AllReduce, 4, 1 << 20);
        let p = t.build(Choice::Builtin(Algorithm::Ring), &big).unwrap();
        assert!(p.ranks.iter().all(|r| r.channels.len() == 3));
        // rhd's reduce-scatter sends halves of the blocks: one channel.
        let rs = Collective::new(CollKind::ReduceScatter, 4, 1 << 18);
        assert_eq!(t.build(Choice::Builtin(Algorithm::Rhd), &rs).unwrap().ranks[0].channels.len(), 1);
        // The device path's programs take as many as its FIFOs have.
        let ring = Choice::Builtin(Algorithm::Ring);
        assert_eq!(t.build_chunked(ring, &big, 1 << 16, 4).unwrap().ranks[0].channels.len(), 3);
        assert_eq!(t.build_chunked(ring, &big, 1 << 16, 2).unwrap().ranks[0].channels.len(), 2);
        assert_eq!(t.build_chunked(ring, &big, 1 << 16, 1).unwrap().ranks[0].channels.len(), 1);
    }

    #[test]
    fn without_a_count_the_tuner_gives_each_rail_a_channel_where_the_size_is_worth_it() {
        let t = tuner(4, "").unwrap().channel_choice(ChannelChoice { fixed: false, lo: 1, most: 2, rails: 2 });
        let min = min_channel_bytes(t.two.inter);
        assert!(min >= 64 << 10);
        let f32s = |bytes: usize| Collective::new(CollKind::AllReduce, 4, bytes / 4);
        assert_eq!(t.channels_for(&f32s(8)), 1);
        assert_eq!(t.channels_for(&f32s(2 * min - 4)), 1, "a share below the minimum");
        assert_eq!(t.channels_for(&f32s(2 * min)), 2);
        assert_eq!(t.channels_for(&f32s(64 << 20)), 2, "never more than the rails");
        let p = t.build(Choice::Builtin(Algorithm::Ring), &f32s(64 << 20)).unwrap();
        assert!(p.ranks.iter().all(|r| r.channels.len() == 2));
        assert_eq!(t.build(Choice::Builtin(Algorithm::Ring), &f32s(4096)).unwrap().ranks[0].channels.len(), 1);
        // A lower bound holds for small collectives too; a fixed count
        // for every size.
        let t = t.channel_choice(ChannelChoice { fixed: false, lo: 2, most: 3, rails: 3 });
        assert_eq!(t.channels_for(&f32s(8)), 2);
        let t = t.channels(3);
        assert_eq!(t.channels_for(&f32s(8)), 3);
    }

    #[test]
    fn the_decision_says_what_decided() {
        let big = Collective::new(CollKind::AllReduce, 8, 64 << 20);
        let d = tuner(8, "").unwrap().decide(&big).unwrap();
        assert_eq!(d.reason, Reason::Cost { among: None });
        assert_eq!(d.to_string(), format!("{} (the tuner's pick)", d.choice));
        let d = tuner(8, "tree").unwrap().decide(&big).unwrap();
        assert_eq!(d.to_string(), r#"tree (forced by OXCCL_ALGO="tree")"#);
        let d = tuner(8, "allreduce:twoshot").unwrap().decide(&big).unwrap();
        assert_eq!(d.reason, Reason::Forced { setting: r#"OXCCL_ALGO="allreduce:twoshot""#.into() });
        // Through the C ABI the same list is NCCL_ALGO's; from a Config, its field's.
        let filter = AlgoFilter::parse("tree", &[]).unwrap().set_by("NCCL_ALGO");
        let t = Tuner::new(Placement::flat(8), (Some(shm()), None), filter, Vec::new(), 4 << 20).unwrap();
        assert_eq!(t.decide(&big).unwrap().to_string(), r#"tree (forced by NCCL_ALGO="tree")"#);
        // A list that leaves several: the tuner picks among them.
        let d = tuner(8, "ring,tree").unwrap().decide(&big).unwrap();
        assert!(matches!(d.choice, Choice::Builtin(Algorithm::Ring | Algorithm::Tree)), "{d}");
        assert_eq!(d.reason, Reason::Cost { among: Some(r#"OXCCL_ALGO="ring,tree""#.into()) });
        assert!(d.to_string().ends_with(r#"(the tuner's pick of those OXCCL_ALGO="ring,tree" allows)"#), "{d}");
        // A list for all collectives does not decide those it names nothing of.
        let gather = Collective::new(CollKind::AllGather, 8, 1 << 20);
        assert_eq!(tuner(8, "tree").unwrap().decide(&gather).unwrap().reason, Reason::Cost { among: None });
        // Send/recv has one algorithm whatever the list says.
        let p2p = Collective::new(CollKind::SendRecv, 8, 16);
        let d = tuner(8, "ring").unwrap().decide(&p2p).unwrap();
        assert_eq!((d.choice, d.reason), (B(Algorithm::Direct), Reason::Only));
        assert_eq!(tuner(8, "").unwrap().pick(&p2p).unwrap(), d.choice);
    }

    #[test]
    fn the_deterministic_mode_picks_only_what_the_verifier_proves_canonical() {
        let det = |n: usize, filter: &str| tuner(n, filter).unwrap().deterministic(true).unwrap();
        for count in [2, 1000, 64 << 20] {
            let coll = Collective::new(CollKind::AllReduce, 5, count);
            let d = det(5, "").decide(&coll).unwrap();
            // On 5 ranks only the ordered algorithm is canonical.
            assert_eq!(d.choice, B(Algorithm::Ordered), "{count}");
            assert_eq!(d.reason, Reason::Forced { setting: DETERMINISTIC.into() });
        }
        // Doubling is canonical on 4 ranks (and 3, 6, 7, 8): the cost model
        // chooses among the proven ones.
        let small = det(4, "").decide(&Collective::new(CollKind::AllReduce, 4, 2)).unwrap();
        assert_eq!(small.choice, B(Algorithm::Doubling), "{small}");
        assert!(small.to_string().ends_with("(the tuner's pick of those OXCCL_DETERMINISTIC=1 allows)"), "{small}");
        // Integers give the same bits in every order: not restricted.
        let ints =
            Collective { dtype: oxccl_core::DataType::Int32, ..Collective::new(CollKind::AllReduce, 5, 1 << 20) };
        assert_eq!(det(5, "").decide(&ints).unwrap(), tuner(5, "").unwrap().decide(&ints).unwrap());
        // A list that leaves nothing canonical says why each was refused.
        let e = det(5, "allreduce:ring,tree").decide(&Collective::new(CollKind::AllReduce, 5, 100)).unwrap_err();
        let e = e.to_string();
        for want in [DETERMINISTIC, "ring: ring: rank", "tree: tree: rank", "((x0 ⊕ x1) ⊕ (x2 ⊕ x3)) ⊕ x4"] {
            assert!(e.contains(want), "{e} does not say {want:?}");
        }
    }

    #[test]
    fn the_canonical_trees_take_small_chunks_only_on_native_links() {
        let ordered = B(Algorithm::Ordered);
        let t = tuner(4, "").unwrap();
        assert_eq!(t.chunk_bytes(), (2 << 20) - 128);
        assert_eq!(t.chunk_for(ordered), TREE_CHUNK);
        assert_eq!(t.chunk_for(B(Algorithm::Ring)), t.chunk_bytes());
        // A FIFO smaller than the cap keeps its own chunk.
        let small = Tuner::new(Placement::flat(4), (Some(shm()), None), AlgoFilter::default(), Vec::new(), 64 << 10);
        let small = small.unwrap();
        assert_eq!(small.chunk_for(ordered), small.chunk_bytes());
        // Sockets (no native one-sided access): a message costs more than the cache saves.
        let tcp = LinkParams { native: false, ..shm() };
        let tcp = Tuner::new(Placement::flat(4), (Some(shm()), Some(tcp)), AlgoFilter::default(), Vec::new(), 4 << 20);
        let tcp = tcp.unwrap();
        assert_eq!(tcp.chunk_for(ordered), (2 << 20) - 128);
        // The built program is cut at the cap: 8 MiB of f32 on 4 ranks,
        // 2 MiB blocks in 16 chunks of 128 KiB, not in two (the FIFO's
        // chunk is 128 bytes short of 2 MiB); 6 sends per chunk.
        let coll = Collective::new(CollKind::AllReduce, 4, 2 << 20);
        let sends = |t: &Tuner| {
            let p = t.build(ordered, &coll).unwrap();
            p.ranks[0].steps().filter(|s| matches!(s, oxccl_algo::ir::Step::Send { .. })).count()
        };
        assert_eq!((sends(&t), sends(&tcp)), (16 * 6, 2 * 6));
    }

    #[test]
    fn a_program_file_is_named_in_the_decision() {
        let coll = Collective::new(CollKind::AllReduce, 8, 64);
        let mut p = build(Algorithm::Ring, &coll, &BuildOptions::default()).unwrap();
        p.name = "tuner_reason_ring".into();
        let file = std::env::temp_dir().join(format!("oxccl-tuner-{}.json", std::process::id()));
        std::fs::write(&file, p.to_json()).unwrap();
        let ids = programs::load(&file);
        std::fs::remove_file(&file).unwrap();
        let ids = ids.unwrap();
        let filter = AlgoFilter::parse("tuner_reason_ring", &ids).unwrap();
        let t = Tuner::new(Placement::flat(8), (Some(shm()), None), filter, ids.clone(), 4 << 20).unwrap();
        let d = t.decide(&coll).unwrap();
        assert_eq!(d.choice, Choice::Program(ids[0]));
        let want = format!(
            r#"program tuner_reason_ring (forced by OXCCL_ALGO="tuner_reason_ring"; loaded from {})"#,
            file.display()
        );
        assert_eq!(d.to_string(), want);
    }
}
