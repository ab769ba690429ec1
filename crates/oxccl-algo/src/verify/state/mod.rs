//! The symbolic machine behind [`super::verify_with`].

use super::race::{Clocks, Rec};
use super::sym::{self, Piece, Ranks, SymBuf, Val};
use super::{Departure, Report, VerifyOptions};
use crate::collective::Collective;
use crate::ir::{Buf, Program, Slice, Step};
use oxccl_core::{Error, Result};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;

/// A connection (sender, receiver, channel): its messages and signals.
#[derive(Default)]
struct Conn {
    msgs: VecDeque<Msg>,
    sigs: VecDeque<(usize, Option<Rc<Vec<u32>>>)>,
}

struct Msg {
    data: Vec<Piece>,
    pc: usize,
    clock: Option<Rc<Vec<u32>>>,
}

#[derive(Clone, Copy)]
enum Block {
    Recv(usize),
    Full(usize),
    Signal(usize),
}

/// Where a rank's logical buffers live in its physical ones.
#[derive(Clone, Copy)]
struct Layout {
    lens: [usize; 3],
    /// In place: `(input_at, output_at)` inside physical buffer 0.
    aliased: Option<(usize, usize)>,
}

impl Layout {
    fn phys(&self, s: &Slice) -> (usize, usize) {
        match (s.buf, self.aliased) {
            (Buf::Input, Some((i, _))) => (0, i + s.off),
            (Buf::Output, Some((_, o))) => (0, o + s.off),
            (Buf::Input, None) => (0, s.off),
            (Buf::Output, None) => (1, s.off),
            (Buf::Scratch, _) => (2, s.off),
        }
    }
    fn logical_len(&self, coll: &Collective, rank: usize, buf: Buf) -> usize {
        match buf {
            Buf::Input => coll.input_len(rank),
            Buf::Output => coll.output_len(rank),
            Buf::Scratch => self.lens[2],
        }
    }
}

pub(crate) struct Machine<'a> {
    p: &'a Program,
    coll: Collective,
    slots: usize,
    /// (rank, channel) of each process.
    procs: Vec<(usize, usize)>,
    pc: Vec<usize>,
    pending: Vec<Option<(usize, Vec<Piece>)>>,
    blocked: Vec<Option<Block>>,
    bufs: Vec<[SymBuf; 3]>,
    layout: Vec<Layout>,
    conns: Vec<Conn>,
    /// (sender, receiver, channel) of each connection.
    ends: Vec<(usize, usize, usize)>,
    /// Per process and step: the connection it receives (or waits) on and
    /// the one it sends (or signals) on; `usize::MAX` for none.
    conn_of: Vec<Vec<[usize; 2]>>,
    first_proc: Vec<usize>,
    /// Processes that may be able to make progress.
    ready: Vec<usize>,
    race: Option<Clocks>,
    sent: Vec<u64>,
    recv: Vec<u64>,
    messages: u64,
    steps: u64,
    esize: u64,
}

impl<'a> Machine<'a> {
    pub(crate) fn new(p: &'a Program, opts: &VerifyOptions) -> Result<Machine<'a>> {
        let coll = p.collective;
        coll.validate().map_err(|e| Error::program(format!("{}: {e}", p.name)))?;
        let n = coll.nranks;
        if p.ranks.len() != n {
            return Err(Error::program(format!(
                "{}: has programs for {} ranks but the collective has {n}",
                p.name,
                p.ranks.len()
            )));
        }
        if opts.slots == 0 {
            return Err(Error::invalid("verifier slots must be at least 1"));
        }
        let mut layout = Vec::with_capacity(n);
        let mut bufs = Vec::with_capacity(n);
        let mut procs = Vec::new();
        for (r, rp) in p.ranks.iter().enumerate() {
            let (i, o) = (coll.input_len(r), coll.output_len(r));
            let l = if opts.in_place {
                let ip = coll.in_place_layout(r);
                Layout { lens: [ip.len, 0, rp.scratch], aliased: Some((ip.input_at, ip.output_at)) }
            } else {
                Layout { lens: [i, o, rp.scratch], aliased: None }
            };
            let mut b = l.lens.map(SymBuf::undef);
            let (pb, off) = l.phys(&Slice::input(0, i));
            b[pb].write(off, &[Piece { len: i, val: Val::input(r) }]);
            layout.push(l);
            bufs.push(b);
            procs.extend((0..rp.channels.len()).map(|c| (r, c)));
        }
        let np = procs.len();
        let tracked = p.has_one_sided() || p.ranks.iter().any(|r| r.channels.len() > 1);
        let race = tracked.then(|| {
            let per_rank: Vec<usize> = p.ranks.iter().map(|r| r.channels.len()).collect();
            let lens: Vec<[usize; 3]> = layout.iter().map(|l| l.lens).collect();
            Clocks::new(&per_rank, &lens)
        });
        let mut first_proc = Vec::with_capacity(n);
        for (r, rp) in p.ranks.iter().enumerate() {
            first_proc.push(procs.partition_point(|&(q, _)| q < r));
            debug_assert!(rp.channels.is_empty() || procs[first_proc[r]] == (r, 0));
        }
        let mut ids: HashMap<(usize, usize, usize), usize> = HashMap::new();
        let mut ends = Vec::new();
        let mut id = |key: (usize, usize, usize)| {
            *ids.entry(key).or_insert_with(|| {
                ends.push(key);
                ends.len() - 1
            })
        };
        let conn_of: Vec<Vec<[usize; 2]>> = procs
            .iter()
            .map(|&(r, c)| {
                p.ranks[r].channels[c]
                    .iter()
                    .map(|step| {
                        let inbound = match step {
                            Step::Wait { peer } => Some(*peer),
                            _ => step.recv_peer(),
                        };
                        let outbound = match step {
                            Step::Signal { peer } => Some(*peer),
                            _ => step.send_peer(),
                        };
                        [inbound.map_or(usize::MAX, |q| id((q, r, c))), outbound.map_or(usize::MAX, |q| id((r, q, c)))]
                    })
                    .collect()
            })
            .collect();
        let conns = (0..ends.len()).map(|_| Conn::default()).collect();
        let m = Machine {
            p,
            coll,
            slots: opts.slots,
            procs,
            pc: vec![0; np],
            pending: vec![None; np].into_iter().collect(),
            blocked: vec![None; np],
            bufs,
            layout,
            conns,
            ends,
            conn_of,
            first_proc,
            ready: (0..np).rev().collect(),
            race,
            sent: vec![0; n],
            recv: vec![0; n],
            messages: 0,
            steps: 0,
            esize: coll.dtype.size() as u64,
        };
        m.check_shapes()?;
        Ok(m)
    }

    fn step_at(&self, rank: usize, chan: usize, pc: usize) -> &'a Step {
        &self.p.ranks[rank].channels[chan][pc]
    }

    fn at(&self, rank: usize, chan: usize, pc: usize) -> String {
        let step = self.step_at(rank, chan, pc);
        if self.p.ranks[rank].channels.len() > 1 {
            format!("rank {rank} channel {chan} step {pc} ({step})")
        } else {
            format!("rank {rank} step {pc} ({step})")
        }
    }

    fn here(&self, pi: usize) -> String {
        let (r, c) = self.procs[pi];
        self.at(r, c, self.pc[pi])
    }

    fn fail(&self, pi: usize, what: impl AsRef<str>) -> Error {
        Error::program(format!("{}: {}: {}", self.p.name, self.here(pi), what.as_ref()))
    }

    /// Peers, bounds and operand lengths, before anything runs.
    fn check_shapes(&self) -> Result<()> {
        let n = self.coll.nranks;
        for (r, rp) in self.p.ranks.iter().enumerate() {
            for (c, chan) in rp.channels.iter().enumerate() {
                for (s, step) in chan.iter().enumerate() {
                    let bad = |what: String| Error::program(format!("{}: {}: {what}", self.p.name, self.at(r, c, s)));
                    let peers = [step.recv_peer(), step.send_peer(), step.one_sided_peer()];
                    for peer in peers.into_iter().flatten() {
                        if peer >= n {
                            return Err(bad(format!("peer {peer} is out of range for {n} ranks")));
                        }
                        if peer == r {
                            return Err(bad("names the rank itself as its peer (use copy for local data)".into()));
                        }
                    }
                    let remote = step.one_sided_peer();
                    if let Some(dst) = step.dst().filter(|d| d.buf == Buf::Input) {
                        return Err(bad(format!("writes {dst}: the input buffer is the caller's and read-only")));
                    }
                    let (local, far, lens) = operands(step);
                    for sl in local {
                        self.check_bounds(r, sl).map_err(&bad)?;
                    }
                    if let (Some(peer), Some(sl)) = (remote, far) {
                        self.check_bounds(peer, sl).map_err(|e| bad(format!("rank {peer}'s {e}")))?;
                    }
                    if let Some(first) = lens.first()
                        && lens.iter().any(|l| l != first)
                    {
                        return Err(bad(format!("operand lengths differ: {lens:?}")));
                    }
                    if let Step::Reduce { srcs, .. } = step
                        && srcs.is_empty()
                    {
                        return Err(bad("reduce has no sources".into()));
                    }
                    for (a, b) in read_write_pairs(step) {
                        let l = &self.layout[r];
                        let ((pa, oa), (pb, ob)) = (l.phys(a), l.phys(b));
                        let overlap = pa == pb && oa < ob + b.len && ob < oa + a.len;
                        if overlap && !(oa == ob && a.len == b.len) {
                            let how = if self.layout[r].aliased.is_some() {
                                " (input and output alias in place)"
                            } else {
                                ""
                            };
                            return Err(bad(format!(
                                "{a} and {b} partially overlap{how}: a kernel working on all elements at once would read elements it already overwrote"
                            )));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn check_bounds(&self, rank: usize, s: &Slice) -> std::result::Result<(), String> {
        let len = self.layout[rank].logical_len(&self.coll, rank, s.buf);
        if s.off.checked_add(s.len).is_none_or(|end| end > len) {
            return Err(format!("{s} is outside the {} buffer of {len} elements", s.buf.name()));
        }
        Ok(())
    }

    pub(crate) fn run(mut self) -> Result<Report> {
        // Each process runs until it blocks; it is woken by the one event
        // it waits for (a message, a free slot, a signal on its
        // connection), so the whole run costs O(steps).
        while let Some(pi) = self.ready.pop() {
            while !self.finished(pi) {
                if let Some(b) = self.exec(pi)? {
                    self.blocked[pi] = Some(b);
                    break;
                }
            }
        }
        if (0..self.procs.len()).any(|pi| !self.finished(pi)) {
            return Err(self.deadlock());
        }
        self.check_leftovers()?;
        let departure = self.check_results()?;
        Ok(Report {
            sent_bytes: self.sent,
            recv_bytes: self.recv,
            messages: self.messages,
            steps: self.steps,
            departure,
        })
    }

    fn finished(&self, pi: usize) -> bool {
        let (r, c) = self.procs[pi];
        self.pending[pi].is_none() && self.pc[pi] >= self.p.ranks[r].channels[c].len()
    }

    fn deadlock(&self) -> Error {
        let mut lines = Vec::new();
        let stuck: Vec<usize> = (0..self.procs.len()).filter(|&pi| !self.finished(pi)).collect();
        for &pi in stuck.iter().take(6) {
            let why = match self.blocked[pi] {
                Some(Block::Recv(p)) => format!("waits for a message from rank {p}"),
                Some(Block::Signal(p)) => format!("waits for a signal from rank {p}"),
                Some(Block::Full(p)) => {
                    format!("cannot send to rank {p}: its connection holds {} unreceived message(s)", self.slots)
                }
                None => "is blocked".into(),
            };
            lines.push(format!("{} {why}", self.here(pi)));
        }
        if stuck.len() > 6 {
            lines.push(format!("and {} more blocked", stuck.len() - 6));
        }
        Error::program(format!("{}: deadlock: {}", self.p.name, lines.join("; ")))
    }

    /// Makes the process of (`rank`, `chan`), if it exists and is blocked,
    /// ready to run again.
    fn wake(&mut self, rank: usize, chan: usize) {
        if chan < self.p.ranks[rank].channels.len() {
            let pi = self.first_proc[rank] + chan;
            if self.blocked[pi].take().is_some() {
                self.ready.push(pi);
            }
        }
    }

    fn check_leftovers(&self) -> Result<()> {
        let mut left: Vec<usize> = (0..self.conns.len()).filter(|&i| !self.conns[i].msgs.is_empty()).collect();
        left.sort_by_key(|&i| self.ends[i]);
        if let Some(&i) = left.first() {
            let (s, d, c) = self.ends[i];
            return Err(Error::program(format!(
                "{}: {} sends a message that rank {d} never receives",
                self.p.name,
                self.at(s, c, self.conns[i].msgs[0].pc)
            )));
        }
        let mut left: Vec<usize> = (0..self.conns.len()).filter(|&i| !self.conns[i].sigs.is_empty()).collect();
        left.sort_by_key(|&i| self.ends[i]);
        if let Some(&i) = left.first() {
            let (s, d, c) = self.ends[i];
            return Err(Error::program(format!(
                "{}: {} signals rank {d}, which never waits for it",
                self.p.name,
                self.at(s, c, self.conns[i].sigs[0].0)
            )));
        }
        if let Some(race) = &self.race {
            for r in 0..self.coll.nranks {
                if let Some((buf, rec, start, end)) = race.unfinished(r) {
                    return Err(Error::program(format!(
                        "{}: rank {r} returns while {} on its {} is not ordered before its end (no signal or message from the accessor after it)",
                        self.p.name,
                        self.describe(rec),
                        self.buf_name(r, buf, start, end)
                    )));
                }
            }
        }
        Ok(())
    }

    /// Checks every output element's contributions; the first one (by rank,
    /// then element) reduced in an order that is not the canonical one.
    fn check_results(&self) -> Result<Option<Departure>> {
        let mut first: Option<Departure> = None;
        for r in 0..self.coll.nranks {
            let l = self.layout[r];
            for e in self.coll.expected(r) {
                let (pb, off) = l.phys(&Slice::output(e.start, e.len));
                let want = Ranks::from_iter(e.ranks.iter().copied());
                let mut at = e.start;
                for piece in self.bufs[r][pb].read(off, e.len) {
                    let problem = match &piece.val {
                        Val::Undef => Some("was never written".to_string()),
                        Val::Sym { ranks, base, off } => {
                            if let (None, Some(d)) = (&first, off) {
                                first = Some(self.departure(d, r, at));
                            }
                            let want_base = e.base + (at - e.start);
                            let missing = want.minus(ranks);
                            let extra = ranks.minus(&want);
                            if *base != want_base {
                                Some(format!("holds {} but should hold input[{want_base}]", piece.val))
                            } else if !missing.is_empty() {
                                Some(format!("is missing the contribution of ranks {}", Ranks::from_iter(missing)))
                            } else if !extra.is_empty() {
                                Some(format!(
                                    "holds contributions of ranks {} that do not belong there",
                                    Ranks::from_iter(extra)
                                ))
                            } else {
                                None
                            }
                        }
                    };
                    if let Some(problem) = problem {
                        return Err(Error::program(format!(
                            "{}: rank {r} output[{at}..{}] {problem}; {} needs input[{}] of ranks {want} there",
                            self.p.name,
                            at + piece.len,
                            self.coll,
                            e.base + (at - e.start)
                        )));
                    }
                    at += piece.len;
                }
            }
        }
        Ok(first)
    }

    /// What the report says of a reduction `d` that left the canonical
    /// order and reached rank `rank`'s `output[at]`.
    fn departure(&self, d: &sym::Departure, rank: usize, at: usize) -> Departure {
        let n = self.coll.nranks;
        let tree = if n <= 16 { format!(" ({})", crate::canon::expr(n)) } else { String::new() };
        let message = format!(
            "{}: {} combines ranks {} with ranks {} at input[{}], which are not the two halves of one node of the canonical tree over {n} ranks{tree}; the result reaches rank {rank}'s output[{at}]",
            self.p.name,
            self.at(d.rank, d.chan, d.pc),
            d.left,
            d.right,
            d.element,
        );
        Departure { rank: d.rank, channel: d.chan, step: d.pc, element: d.element, output: (rank, at), message }
    }
}

/// The local operands a step reads paired with the local slice it writes:
/// these must be the same elements or disjoint.
fn read_write_pairs(step: &Step) -> Vec<(&Slice, &Slice)> {
    match step {
        Step::Copy { src, dst } | Step::RecvReduce { src, dst, .. } | Step::RecvReduceCopySend { src, dst, .. } => {
            vec![(src, dst)]
        }
        Step::Reduce { srcs, dst } => srcs.iter().map(|s| (s, dst)).collect(),
        Step::GetReduce { acc, dst, .. } => vec![(acc, dst)],
        _ => vec![],
    }
}

/// A step's local slices, its remote slice, and the lengths that must agree.
fn operands(step: &Step) -> (Vec<&Slice>, Option<&Slice>, Vec<usize>) {
    match step {
        Step::Send { src, .. } | Step::RecvReduceSend { src, .. } => (vec![src], None, vec![]),
        Step::Recv { dst, .. } | Step::RecvCopySend { dst, .. } => (vec![dst], None, vec![]),
        Step::RecvReduce { src, dst, .. } | Step::RecvReduceCopySend { src, dst, .. } | Step::Copy { src, dst } => {
            (vec![src, dst], None, vec![src.len, dst.len])
        }
        Step::Reduce { srcs, dst } => {
            let mut v: Vec<&Slice> = srcs.iter().collect();
            v.push(dst);
            let lens = v.iter().map(|s| s.len).collect();
            (v, None, lens)
        }
        Step::Put { src, dst, .. } => (vec![src], Some(dst), vec![src.len, dst.len]),
        Step::Get { src, dst, .. } => (vec![dst], Some(src), vec![src.len, dst.len]),
        Step::GetReduce { src, acc, dst, .. } => (vec![acc, dst], Some(src), vec![src.len, acc.len, dst.len]),
        Step::Signal { .. } | Step::Wait { .. } => (vec![], None, vec![]),
    }
}

mod exec;
