//! Compiling a [`Program`] into the simulator's flat arrays.
//!
//! Every step becomes a 12-byte [`CStep`]: what it does, the connection it
//! receives on (as a *receive slot*: one per receiving process and peer),
//! the connection it sends on, and the index of its precomputed transfer
//! and local times (interned: programs have few distinct ones).
//!
//! Steps are stored in *tiles* of [`TILE`] consecutive processes, step
//! major within a tile: step `i` of process `p` is at
//! `tile_base[p / TILE] + i·TILE + p % TILE` (shorter processes leave
//! holes). Processes advance roughly together, so the simulator reads
//! memory almost sequentially, and compiling writes it sequentially while
//! reading the program's `TILE` step vectors side by side. Connection ids
//! come from per-process tables indexed by peer: O(1) work per step, no
//! hashing. The buffers are kept for the next program.

use crate::cost::Topology;
use crate::ir::{Program, Step};
use oxccl_core::{Error, Result};

pub(super) const NONE: u32 = u32::MAX;
const OP_SHIFT: u32 = 29;
const ID_MASK: u32 = (1 << OP_SHIFT) - 1;
/// Processes per tile of the step layout.
pub(super) const TILE: usize = 16;

/// What a compiled step does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Op {
    /// Local work only.
    Local = 0,
    /// Receive (or wait for a signal), then local work.
    Recv = 1,
    /// Receive, local work, send.
    RecvSend = 2,
    /// Send a message or a signal.
    Send = 3,
    /// One-sided write: moves on when the bytes have left.
    Put = 4,
    /// One-sided read: moves on at once.
    Get = 5,
}

const OPS: [Op; 8] = [Op::Local, Op::Recv, Op::RecvSend, Op::Send, Op::Put, Op::Get, Op::Local, Op::Local];

/// Connection kinds in the per-process lookup tables.
const MSG: usize = 0;
const SIG: usize = 1;
const PUT: usize = 2;
const GET: usize = 3;
const KINDS: usize = 4;

/// One compiled step (12 bytes).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct CStep {
    /// The op in the top bits, the receive slot in the others.
    a: u32,
    /// Connection sent on (or used by a one-sided transfer).
    pub send: u32,
    /// Index of the step's [`Cost`] in [`Compiled::costs`].
    pub cost: u32,
}

impl CStep {
    pub fn op(&self) -> Op {
        OPS[(self.a >> OP_SHIFT) as usize]
    }

    /// The receive slot (see [`Compiled::in_conn`]).
    pub fn recv(&self) -> usize {
        (self.a & ID_MASK) as usize
    }
}

/// The times of a step: programs have few distinct ones, so steps share
/// them through [`Compiled::costs`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Cost {
    /// Seconds the sent bytes hold the resources.
    pub dur: f64,
    /// Seconds of local work after the receive (or of the reduction of a
    /// get's data).
    pub work: f64,
}

/// The fixed part of a connection: which resources it holds, its link.
#[derive(Clone, Copy, Debug)]
pub(super) struct ConnInfo {
    pub lat: f64,
    pub bw: f64,
    pub tx: u32,
    pub rx: u32,
    pub inter: bool,
}

/// A receive slot: process `proc` receives from `peer` (`kind` 0: messages,
/// 1: signals), first at its step `first`, `count` times.
struct InSlot {
    proc: u32,
    peer: u32,
    kind: u32,
    first: u32,
    count: u32,
}

/// A compiled program, and the scratch space to compile the next one.
#[derive(Default)]
pub(super) struct Compiled {
    /// The steps, tiled (see the module's doc).
    pub steps: Vec<CStep>,
    pub tile_base: Vec<usize>,
    /// Steps of each process.
    pub len: Vec<u32>,
    pub rank: Vec<u32>,
    pub chan: Vec<u32>,
    /// The connection of each receive slot.
    pub in_conn: Vec<u32>,
    /// The times steps refer to.
    pub costs: Vec<Cost>,
    pub conns: Vec<ConnInfo>,
    pub messages: u64,
    pub intra_bytes: u64,
    pub inter_bytes: u64,
    // Scratch: per-process tables for the TILE processes being compiled.
    rank_proc: Vec<usize>,
    out_table: Vec<u32>,
    in_table: Vec<u32>,
    touched: Vec<Vec<usize>>,
    out_keys: Vec<(u32, u32)>,
    out_start: Vec<usize>,
    sent: Vec<u32>,
    ins: Vec<InSlot>,
    cache: Vec<(u64, u64, u32)>,
}

/// What a step does, decoded once: (receive from, kind), (send kind,
/// peer, elements), elements reduced, elements copied.
pub(super) type Decoded = (Option<(usize, usize)>, (usize, usize, usize), usize, usize);

pub(super) fn decode(step: &Step) -> Decoded {
    const NO: (usize, usize, usize) = (KINDS, 0, 0);
    match *step {
        Step::Send { peer, src } => (None, (MSG, peer, src.len), 0, 0),
        Step::Recv { peer, .. } => (Some((peer, 0)), NO, 0, 0),
        Step::RecvReduce { peer, dst, .. } => (Some((peer, 0)), NO, dst.len, 0),
        Step::RecvReduceSend { recv, send, src } => (Some((recv, 0)), (MSG, send, src.len), src.len, 0),
        Step::RecvCopySend { recv, send, dst } => (Some((recv, 0)), (MSG, send, dst.len), 0, 0),
        Step::RecvReduceCopySend { recv, send, dst, .. } => (Some((recv, 0)), (MSG, send, dst.len), dst.len, 0),
        Step::Copy { src, .. } => (None, NO, 0, src.len),
        Step::Reduce { ref srcs, dst } => (None, NO, dst.len * srcs.len().saturating_sub(1), 0),
        Step::Put { peer, src, .. } => (None, (PUT, peer, src.len), 0, 0),
        Step::Get { peer, src, .. } => (None, (GET, peer, src.len), 0, 0),
        Step::GetReduce { peer, src, dst, .. } => (None, (GET, peer, src.len), dst.len, 0),
        Step::Signal { peer } => (None, (SIG, peer, 0), 0, 0),
        Step::Wait { peer } => (Some((peer, 1)), NO, 0, 0),
    }
}

impl Compiled {
    pub fn nprocs(&self) -> usize {
        self.rank.len()
    }

    /// Where step `i` of process `p` is.
    #[inline]
    pub fn at(&self, p: usize, i: usize) -> usize {
        self.tile_base[p / TILE] + i * TILE + p % TILE
    }

    /// Compiles `program` for `topo` into `self`, reusing its buffers.
    pub fn load(&mut self, program: &Program, topo: &Topology) -> Result<()> {
        let n = program.ranks.len();
        let too_big = || Error::invalid(format!("program {:?} is too big to simulate", program.name));
        self.rank.clear();
        self.chan.clear();
        self.len.clear();
        self.rank_proc.clear();
        for (r, rp) in program.ranks.iter().enumerate() {
            self.rank_proc.push(self.rank.len());
            for (ch, steps) in rp.channels.iter().enumerate() {
                self.rank.push(r as u32);
                self.chan.push(ch as u32);
                self.len.push(u32::try_from(steps.len()).map_err(|_| too_big())?);
            }
        }
        self.rank_proc.push(self.rank.len());
        let np = self.nprocs();
        self.tile_base.clear();
        self.tile_base.push(0);
        for tile in self.len.chunks(TILE) {
            let longest = tile.iter().copied().max().unwrap_or(0) as usize;
            self.tile_base.push(self.tile_base.last().copied().unwrap_or(0) + longest * TILE);
        }
        let total = self.tile_base.last().copied().unwrap_or(0);
        if total >= ID_MASK as usize || np >= ID_MASK as usize {
            return Err(too_big());
        }
        self.steps.clear();
        self.steps.reserve(total);
        self.conns.clear();
        self.costs.clear();
        self.sent.clear();
        self.ins.clear();
        self.out_keys.clear();
        self.out_start.clear();
        self.out_start.push(0);
        self.touched.resize_with(TILE, Vec::new);
        self.touched.iter_mut().for_each(Vec::clear);
        self.out_table.clear();
        self.out_table.resize(TILE * n * KINDS, NONE);
        self.in_table.clear();
        self.in_table.resize(TILE * n * 2, NONE);
        self.cache.clear();
        self.cache.resize(64, (u64::MAX, u64::MAX, 0));
        (self.messages, self.intra_bytes, self.inter_bytes) = (0, 0, 0);
        let elem = program.collective.dtype.size() as u64;
        let gamma = topo.gamma() * elem as f64; // seconds per element reduced
        let copy = elem as f64 / topo.copy_bw;
        let mut last = (u64::MAX, u64::MAX, 0u32);
        for t in 0..self.tile_base.len() - 1 {
            let first = t * TILE;
            let procs: Vec<(usize, usize, &[Step])> = (first..np.min(first + TILE))
                .map(|p| {
                    let (r, ch) = (self.rank[p] as usize, self.chan[p] as usize);
                    (r, ch, &program.ranks[r].channels[ch][..])
                })
                .collect();
            for i in 0..(self.tile_base[t + 1] - self.tile_base[t]) / TILE {
                for k in 0..TILE {
                    let Some(step) = procs.get(k).and_then(|&(_, _, steps)| steps.get(i)) else {
                        self.steps.push(CStep::default());
                        continue;
                    };
                    let (r, ch) = (procs[k].0, procs[k].1);
                    let (from, (kind, peer, elems), reduce, copied) = decode(step);
                    debug_assert!(kind == KINDS || elems == step.wire_elems(), "{step}");
                    debug_assert_eq!(reduce, step.reduce_elems(), "{step}");
                    let bad = |peer: usize| {
                        Error::program(format!(
                            "rank {r} channel {ch} step {i} ({step}): peer {peer} is out of range for {n} ranks"
                        ))
                    };
                    let (mut op, mut recv) = (Op::Local, 0u32);
                    if let Some((q, qk)) = from {
                        if q >= n {
                            return Err(bad(q));
                        }
                        let key = q * 2 + qk;
                        let at = k * n * 2 + key;
                        if self.in_table[at] == NONE {
                            self.in_table[at] = self.ins.len() as u32;
                            self.touched[k].push(n * KINDS + key);
                            let p = (first + k) as u32;
                            let slot = InSlot { proc: p, peer: q as u32, kind: qk as u32, first: i as u32, count: 0 };
                            self.ins.push(slot);
                        }
                        recv = self.in_table[at];
                        self.ins[recv as usize].count += 1;
                        op = Op::Recv;
                    }
                    let (mut send, mut dur) = (NONE, 0.0);
                    if kind < KINDS {
                        if peer >= n {
                            return Err(bad(peer));
                        }
                        send = self.connection(topo, k, (r, ch), peer, kind);
                        let conn = self.conns[send as usize];
                        let bytes = elems as u64 * elem;
                        if conn.inter {
                            self.inter_bytes += bytes;
                        } else {
                            self.intra_bytes += bytes;
                        }
                        dur = if bytes == 0 { 0.0 } else { bytes as f64 / conn.bw };
                        op = match kind {
                            PUT => Op::Put,
                            GET => Op::Get,
                            _ if op == Op::Recv => Op::RecvSend,
                            _ => Op::Send,
                        };
                        if kind <= SIG {
                            self.sent[send as usize] += 1;
                            self.messages += 1;
                        }
                    }
                    let work = reduce as f64 * gamma + copied as f64 * copy;
                    let (d, w) = (dur.to_bits(), work.to_bits());
                    if (d, w) != (last.0, last.1) {
                        last = (d, w, self.intern(dur, work));
                    }
                    self.steps.push(CStep { a: (op as u32) << OP_SHIFT | recv, send, cost: last.2 });
                }
                if self.ins.len() >= ID_MASK as usize || self.conns.len() >= NONE as usize {
                    return Err(too_big());
                }
            }
            for k in 0..procs.len() {
                self.end_process(k, n);
            }
        }
        self.resolve(program)
    }

    /// The id of the connection of kind `kind` between `r` and `peer` on
    /// channel `ch`, created on first use by the tile's process `k` (a
    /// process is one rank's channel, so every channel has connections of
    /// its own). Between nodes it holds the NICs
    /// [`Topology::nics_between`] names for its ends on that channel.
    fn connection(&mut self, topo: &Topology, k: usize, (r, ch): (usize, usize), peer: usize, kind: usize) -> u32 {
        let n = topo.nranks();
        let key = peer * KINDS + kind;
        let at = k * n * KINDS + key;
        if self.out_table[at] == NONE {
            self.out_table[at] = self.conns.len() as u32;
            self.touched[k].push(key);
            let (from, to) = if kind == GET { (peer, r) } else { (r, peer) };
            let (f, t) = (topo.node_of(from), topo.node_of(to));
            let (tx, rx) = if f != t {
                let (a, b) = topo.nics_between(from, to, ch);
                (n + a, n + b)
            } else {
                (from, to)
            };
            let link = topo.link(from, to);
            let info = ConnInfo { lat: link.lat, bw: link.bw, tx: tx as u32, rx: rx as u32, inter: f != t };
            self.conns.push(info);
            self.sent.push(0);
        }
        self.out_table[at]
    }

    /// Files the sending connections of the tile's process `k` for the
    /// receivers to find and resets its tables.
    fn end_process(&mut self, k: usize, n: usize) {
        let mut touched = std::mem::take(&mut self.touched[k]);
        touched.sort_unstable();
        for &key in &touched {
            if key >= n * KINDS {
                self.in_table[k * n * 2 + key - n * KINDS] = NONE;
                continue;
            }
            let at = k * n * KINDS + key;
            if key % KINDS <= SIG {
                self.out_keys.push(((key / KINDS * 2 + key % KINDS) as u32, self.out_table[at]));
            }
            self.out_table[at] = NONE;
        }
        touched.clear();
        self.touched[k] = touched;
        self.out_start.push(self.out_keys.len());
    }

    /// Interns a step's times.
    fn intern(&mut self, dur: f64, work: f64) -> u32 {
        let (d, w) = (dur.to_bits(), work.to_bits());
        let h = (d ^ w.rotate_left(29)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58;
        let e = &mut self.cache[h as usize];
        if e.0 == d && e.1 == w {
            return e.2;
        }
        let id = self.costs.len() as u32;
        self.costs.push(Cost { dur, work });
        *e = (d, w, id);
        id
    }

    /// Finds the connection of every receive slot and checks that every
    /// connection is received from exactly as often as it is sent on.
    fn resolve(&mut self, program: &Program) -> Result<()> {
        let mut recvd = vec![0u32; self.conns.len()];
        self.in_conn.clear();
        for s in &self.ins {
            let p = s.proc as usize;
            let (r, ch, q) = (self.rank[p] as usize, self.chan[p] as usize, s.peer as usize);
            let qp = self.rank_proc[q] + ch;
            let key = (r * 2) as u32 + s.kind;
            let found = if qp < self.rank_proc[q + 1] {
                let keys = &self.out_keys[self.out_start[qp]..self.out_start[qp + 1]];
                keys.binary_search_by_key(&key, |&(k, _)| k).ok().map(|j| keys[j].1)
            } else {
                None
            };
            let Some(id) = found else {
                let what = if s.kind == 0 { "sends nothing" } else { "never signals" };
                return Err(Error::program(format!(
                    "rank {r} channel {ch} step {} ({}) can never complete: rank {q} {what} to rank {r} on channel {ch}",
                    s.first, program.ranks[r].channels[ch][s.first as usize]
                )));
            };
            recvd[id as usize] += s.count;
            self.in_conn.push(id);
        }
        for (id, (&s, &r)) in self.sent.iter().zip(&recvd).enumerate() {
            if s != r {
                let j = self.out_keys.iter().position(|&(_, c)| c as usize == id).unwrap_or(0);
                let p = self.out_start.partition_point(|&x| x <= j).saturating_sub(1);
                let key = self.out_keys.get(j).map_or(0, |k| k.0 as usize);
                let (from, to, ch) = (self.rank[p], key / 2, self.chan[p]);
                let (verb, noun) = if key % 2 == 0 { ("sends", "messages") } else { ("signals", "signals") };
                return Err(Error::program(format!(
                    "rank {from} {verb} {s} {noun} to rank {to} on channel {ch}, but rank {to} receives {r} of them"
                )));
            }
        }
        Ok(())
    }
}
