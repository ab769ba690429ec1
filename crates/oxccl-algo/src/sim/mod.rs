//! A discrete-event simulator that prices a [`Program`] on a [`Topology`]
//! with link contention.
//!
//! ```
//! use oxccl_algo::cost::{Link, Topology};
//! use oxccl_algo::ir::{Program, Slice, Step};
//! use oxccl_algo::{sim::simulate, CollKind, Collective};
//! // Rank 0 sends 1000 floats to rank 1 over a 1 GB/s, 1 µs link.
//! let mut p = Program::new("hand", Collective::new(CollKind::SendRecv, 2, 1000));
//! p.push(0, 0, Step::Send { peer: 1, src: Slice::input(0, 1000) });
//! p.push(1, 0, Step::Recv { peer: 0, dst: Slice::output(0, 1000) });
//! let r = simulate(&p, &Topology::single_node(2, Link::new(1e9, 1e-6))).unwrap();
//! assert!((r.time - (1e-6 + 4000.0 / 1e9)).abs() < 1e-15);
//! ```
//!
//! # The model
//!
//! Every (rank, channel) is a sequential process running its steps in
//! order; the channels of a rank run concurrently. Time advances in global
//! order: a priority queue of processes keyed by time, ties served first
//! come, first served (all processes start at 0 in rank order), so results
//! are deterministic.
//!
//! **Connections.** Every (sender, receiver, channel, kind) is a
//! connection of its own: two channels between the same pair of ranks are
//! two connections, which proceed concurrently and meet only on the ports
//! and NICs they share (NCCL's channels; oxccl's one socket per channel).
//!
//! **Resources.** Every rank has an intra-node send port and receive port;
//! every node has [`Topology::nics`] NICs (one by default) with a send side
//! and a receive side, each shared by the connections that use it (NIC
//! `j` of every node is on rail `j`). Which NIC a connection between nodes
//! takes is [`Topology::rails`]: by local rank (the default, rail-optimized
//! as on DGX nodes: local rank `i` uses NIC `i mod nics` on every channel)
//! or by channel ([`Rails::ByChannel`](crate::cost::Rails): channel `c`
//! uses NIC `c mod nics` of both nodes, whatever the ranks), or by channel
//! and sender (`Rails::BySender`: NIC `(c + i) mod nics` of both nodes,
//! `i` the sender's local rank: oxccl's TCP and RDMA rails). A transfer of `m` bytes between two ranks of one
//! node holds the sender's send port and the receiver's receive port;
//! between nodes it holds the sender's NIC send side and the receiver's
//! NIC receive side. A transfer requested at time `t`
//! starts at `s = max(t, both resources free)`, holds both for `m/bw`
//! (first come, first served: requests are granted in simulated-time
//! order), and arrives at `s + m/bw + lat` (cut-through: the resources
//! are held together, the latency is paid once). Zero-byte transfers and
//! signals hold nothing and arrive after `lat`.
//!
//! **Two-sided steps.** A send is eager (unbounded buffering): it is
//! requested when the step is reached and the sender moves on when its last
//! byte has left (`s + m/bw`). A receiving step waits until the next
//! message on its connection (sender, receiver, channel; FIFO) has arrived,
//! then spends its local work (below), then, if it also sends, sends.
//!
//! **One-sided steps.** `put`, `get` and `get_reduce` are posted: a put
//! moves on when its last byte has left, a get at once; consecutive
//! one-sided steps therefore overlap, queueing on the ports. A rank issues
//! its reads in program order, each when its receive port is free: a read
//! that cannot start yet claims nothing, so it does not hold a peer's send
//! port idle while others could use it (the readers of one buffer still
//! queue at its owner's port, first come, first served). Their data
//! arrives `lat` after the transfer; a `get_reduce`'s reduction runs when
//! its data has arrived and after the previous one. Every other step
//! (including `signal`, `wait` and the end of the channel) first waits for
//! all posted one-sided transfers of its channel and their reductions.
//! `signal` is a zero-byte message to the peer's same channel; `wait`
//! receives the next one.
//!
//! **Local work.** Reducing `m` bytes of received (or read) data costs
//! `m·γ`, `γ = 1/reduce_bw`, per extra operand ([`Step::reduce_elems`]);
//! a local `copy` costs `m/copy_bw`. Data landing in place (the copy of a
//! `recv_copy_send`) is free. Both throughputs are infinite by default.
//!
//! A program that cannot finish gets an error naming the blocked ranks,
//! channels and steps, never a hang; a program whose sends and receives do
//! not pair up gets an error naming the connection.
//!
//! # Speed
//!
//! The program is compiled to flat arrays: one 12-byte record per step,
//! laid out so that processes advancing together read memory together,
//! connection ids resolved once through per-process tables (no hashing).
//! Each step then costs O(1) work and at most a push and a pop on a radix
//! heap (keys only grow, so a pop only moves entries to lower buckets). A
//! 4096-rank ring all-reduce, 33 million steps, compiles and runs in about
//! two seconds; [`Simulator`] keeps its buffers from one program to the
//! next for sweeps.

mod compile;
#[cfg(test)]
mod tests;

use crate::cost::Topology;
use crate::ir::{Program, Step};
use compile::{Compiled, NONE, Op, TILE};
use oxccl_core::{Error, Result};
use std::collections::VecDeque;
use std::fmt::Write as _;

/// What the simulator predicts for one program.
#[derive(Clone, Debug, PartialEq)]
pub struct SimReport {
    /// Seconds until the last rank finishes.
    pub time: f64,
    /// Seconds until each rank's last channel finishes.
    pub rank_finish: Vec<f64>,
    /// Bytes moved between ranks of one node (messages and one-sided data).
    pub intra_bytes: u64,
    /// Bytes moved between nodes.
    pub inter_bytes: u64,
    /// Two-sided messages and signals delivered.
    pub messages: u64,
    /// Steps executed.
    pub steps: u64,
    /// Seconds the busiest rank port inside a node spent transferring.
    pub port_busy: f64,
    /// Seconds the busiest NIC (send or receive side) spent transferring.
    pub nic_busy: f64,
    /// Seconds each NIC's send and receive sides spent transferring,
    /// numbered as [`Topology::nic_for`] numbers them (node `h`'s NICs at
    /// `h·nics ..`): how the rails share the traffic.
    pub nics: Vec<(f64, f64)>,
}

/// What bounds a simulated time ([`SimReport::bound`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Bound {
    /// A NIC was busy this fraction of the time.
    Nic(f64),
    /// A rank's port inside a node was busy this fraction of the time.
    Port(f64),
    /// No resource was busy half the time: latencies and dependencies.
    Latency(f64),
}

impl std::fmt::Display for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Bound::Nic(x) => write!(f, "NIC {:.0}% busy", x * 100.0),
            Bound::Port(x) => write!(f, "intra-node port {:.0}% busy", x * 100.0),
            Bound::Latency(x) => write!(f, "latency (busiest link {:.0}% busy)", x * 100.0),
        }
    }
}

impl SimReport {
    /// Which link class bounds the time: the busier of the busiest NIC
    /// and the busiest intra-node port, as a fraction of the time, or
    /// latency where neither was busy half of it.
    pub fn bound(&self) -> Bound {
        if self.time <= 0.0 {
            return Bound::Latency(0.0);
        }
        let (nic, port) = (self.nic_busy / self.time, self.port_busy / self.time);
        match (nic.max(port) < 0.5, nic >= port) {
            (true, _) => Bound::Latency(nic.max(port)),
            (false, true) => Bound::Nic(nic),
            (false, false) => Bound::Port(port),
        }
    }

    /// nccl-tests' algorithm bandwidth in GB/s for a collective of
    /// `size_bytes` ([`Collective::size_bytes`](crate::Collective::size_bytes)).
    pub fn algbw_gbs(&self, size_bytes: usize) -> f64 {
        if self.time > 0.0 { size_bytes as f64 / self.time / 1e9 } else { 0.0 }
    }
}

/// Simulates `program` on `topo`: the predicted completion time, each
/// rank's finish time and the bytes over each link class.
///
/// Errors: the topology is invalid or has another number of ranks than
/// the program; a step names a peer out of range; sends and receives of a
/// connection do not pair up; the program deadlocks.
pub fn simulate(program: &Program, topo: &Topology) -> Result<SimReport> {
    Simulator::new().simulate(program, topo)
}

/// [`simulate`] with the ranks on hosts as `placement` says: the
/// topology's node `h` is the placement's host `h` (rank `r` of `topo`,
/// numbered blocked, is the placement's [`ring`](crate::placement::Placement::ring)`[r]`),
/// so a program of cyclically numbered ranks is priced on the links it
/// really takes.
///
/// Errors also when the placement's shape is not the topology's.
pub fn simulate_on(program: &Program, topo: &Topology, placement: &crate::placement::Placement) -> Result<SimReport> {
    if placement.nhosts() != topo.nodes || placement.per_host() != Some(topo.ranks_per_node) {
        return Err(Error::invalid(format!(
            "the placement ({placement}) is not the topology's {} nodes × {} ranks",
            topo.nodes, topo.ranks_per_node
        )));
    }
    if program.ranks.len() != placement.nranks() {
        return simulate(program, topo); // the error naming both counts
    }
    simulate(&program.relabeled(&placement.blocked_number()), topo)
}

/// A simulator that keeps its buffers from one program to the next: the
/// same results as [`simulate`], faster in a sweep over many programs.
#[derive(Default)]
pub struct Simulator {
    compiled: Compiled,
    state: State,
}

impl Simulator {
    /// A simulator with empty buffers.
    pub fn new() -> Simulator {
        Simulator::default()
    }

    /// Simulates `program` on `topo`, like [`simulate`].
    pub fn simulate(&mut self, program: &Program, topo: &Topology) -> Result<SimReport> {
        topo.validate()?;
        if program.ranks.len() != topo.nranks() {
            return Err(Error::invalid(format!(
                "program {:?} has {} ranks but the topology has {} ({} nodes × {})",
                program.name,
                program.ranks.len(),
                topo.nranks(),
                topo.nodes,
                topo.ranks_per_node
            )));
        }
        let c = &mut self.compiled;
        c.load(program, topo)?;
        let sim = &mut self.state;
        sim.reset(c, topo);
        sim.run(c);
        let mut rank_finish = vec![0.0f64; program.ranks.len()];
        let mut blocked = Vec::new();
        for p in 0..c.nprocs() {
            if sim.pc[p] != c.len[p] {
                blocked.push(p);
            }
            let r = c.rank[p] as usize;
            rank_finish[r] = rank_finish[r].max(sim.time[p]);
        }
        if !blocked.is_empty() {
            return Err(deadlock(program, c, sim, &blocked));
        }
        Ok(SimReport {
            time: rank_finish.iter().copied().fold(0.0, f64::max),
            rank_finish,
            intra_bytes: c.intra_bytes,
            inter_bytes: c.inter_bytes,
            messages: c.messages,
            steps: program.step_count() as u64,
            port_busy: sim.busiest(0..topo.nranks()),
            nic_busy: sim.busiest(topo.nranks()..sim.tx_busy.len()),
            nics: (topo.nranks()..sim.tx_busy.len()).map(|i| (sim.tx_busy[i], sim.rx_busy[i])).collect(),
        })
    }
}

fn deadlock(program: &Program, c: &Compiled, sim: &State, blocked: &[usize]) -> Error {
    let mut msg =
        format!("program {:?} deadlocks: {} of {} channels never finish;", program.name, blocked.len(), c.nprocs());
    for &p in blocked.iter().take(8) {
        let (r, ch, i) = (c.rank[p] as usize, c.chan[p] as usize, sim.pc[p] as usize);
        let step: &Step = &program.ranks[r].channels[ch][i];
        let _ = write!(msg, " rank {r} channel {ch} step {i} ({step}) waits at t={:.3e}s;", sim.time[p]);
    }
    if blocked.len() > 8 {
        let _ = write!(msg, " and {} more", blocked.len() - 8);
    }
    Error::program(msg.trim_end_matches(';').to_string())
}

/// A monotone priority queue of processes keyed by time (a radix heap):
/// keys never go below the last one popped, so an entry lives in the
/// bucket of the highest bit in which it differs from that key, and a pop
/// only ever moves entries to lower buckets. Times are not negative, so
/// their bit patterns order like them. Entries of equal time pop first in,
/// first out (buckets keep their order when they are split), so ties go
/// to the process scheduled first.
#[derive(Default)]
struct Queue {
    last: u64,
    /// The processes at time `last`, in order; `now[head..]` are pending.
    now: Vec<u32>,
    head: usize,
    buckets: Vec<Vec<(u64, u32)>>,
    /// Bit `b` set when bucket `b` (1..=64) is not empty.
    full: u128,
}

impl Queue {
    fn reset(&mut self) {
        self.buckets.resize_with(65, Vec::new);
        self.buckets.iter_mut().for_each(Vec::clear);
        self.now.clear();
        (self.last, self.full, self.head) = (0, 0, 0);
    }

    fn bucket(&self, key: u64) -> usize {
        (64 - (key ^ self.last).leading_zeros()) as usize
    }

    fn push(&mut self, t: f64, p: usize) {
        let key = t.to_bits();
        debug_assert!(key >= self.last, "time went backwards");
        let (b, p) = (self.bucket(key), p as u32);
        if b == 0 {
            self.now.push(p);
        } else {
            self.buckets[b].push((key, p));
            self.full |= 1 << b;
        }
    }

    fn pop(&mut self) -> Option<(f64, usize)> {
        if self.head == self.now.len() {
            self.now.clear();
            self.head = 0;
            if self.full == 0 {
                return None;
            }
            let b = self.full.trailing_zeros() as usize;
            let mut items = std::mem::take(&mut self.buckets[b]);
            self.full &= !(1 << b);
            self.last = items.iter().map(|&(k, _)| k).min().unwrap_or(self.last);
            for &(k, p) in &items {
                match self.bucket(k) {
                    0 => self.now.push(p),
                    nb => {
                        self.buckets[nb].push((k, p));
                        self.full |= 1 << nb;
                    }
                }
            }
            items.clear();
            self.buckets[b] = items;
        }
        let p = *self.now.get(self.head)?;
        self.head += 1;
        Some((f64::from_bits(self.last), p as usize))
    }
}

/// A connection's messages in flight (their arrival times, FIFO) and the
/// process blocked receiving on it.
struct Channel {
    queue: VecDeque<f64>,
    waiter: u32,
}

/// The simulation's state, kept between programs for its buffers.
#[derive(Default)]
struct State {
    chans: Vec<Channel>,
    tx_free: Vec<f64>,
    rx_free: Vec<f64>,
    /// Seconds each resource's send and receive sides were held.
    tx_busy: Vec<f64>,
    rx_busy: Vec<f64>,
    pc: Vec<u32>,
    time: Vec<f64>,
    /// Completion of the posted one-sided transfers (and their reductions).
    pend: Vec<f64>,
    /// Whether the receive half of the current step is done.
    half: Vec<bool>,
    queue: Queue,
}

impl State {
    fn reset(&mut self, c: &Compiled, topo: &Topology) {
        let (np, nres) = (c.nprocs(), topo.nranks() + topo.nodes * topo.nics.max(1));
        self.chans.truncate(c.conns.len());
        for ch in &mut self.chans {
            ch.queue.clear();
            ch.waiter = NONE;
        }
        self.chans.resize_with(c.conns.len(), || Channel { queue: VecDeque::new(), waiter: NONE });
        for v in [&mut self.tx_free, &mut self.rx_free, &mut self.tx_busy, &mut self.rx_busy] {
            v.clear();
            v.resize(nres, 0.0);
        }
        for v in [&mut self.time, &mut self.pend] {
            v.clear();
            v.resize(np, 0.0);
        }
        self.pc.clear();
        self.pc.resize(np, 0);
        self.half.clear();
        self.half.resize(np, false);
        self.queue.reset();
    }

    /// The most seconds any of `range`'s resources held a side.
    fn busiest(&self, range: std::ops::Range<usize>) -> f64 {
        range.map(|i| self.tx_busy[i].max(self.rx_busy[i])).fold(0.0, f64::max)
    }

    /// Reserves the resources of connection `id` for `dur` from `t` on;
    /// returns (end of transmission, arrival).
    #[inline]
    fn transfer(&mut self, c: &Compiled, id: u32, t: f64, dur: f64) -> (f64, f64) {
        let conn = &c.conns[id as usize];
        if dur == 0.0 {
            return (t, t + conn.lat);
        }
        let (tx, rx) = (conn.tx as usize, conn.rx as usize);
        let start = t.max(self.tx_free[tx]).max(self.rx_free[rx]);
        let end = start + dur;
        self.tx_free[tx] = end;
        self.rx_free[rx] = end;
        self.tx_busy[tx] += dur;
        self.rx_busy[rx] += dur;
        (end, end + conn.lat)
    }

    fn run(&mut self, c: &Compiled) {
        for p in 0..self.pc.len() {
            self.queue.push(0.0, p);
        }
        while let Some((now, p)) = self.queue.pop() {
            self.advance(c, p, now);
        }
    }

    /// Runs process `p` from time `now` until it blocks, must wait for a
    /// later time before claiming a resource, or finishes.
    fn advance(&mut self, c: &Compiled, p: usize, now: f64) {
        let (len, at) = (c.len[p] as usize, c.at(p, 0));
        let (mut pc, mut t, mut pend, mut half) = (self.pc[p], now.max(self.time[p]), self.pend[p], self.half[p]);
        loop {
            if pc as usize == len {
                t = t.max(pend);
                break;
            }
            let s = c.steps[at + pc as usize * TILE];
            let op = s.op();
            let cost = c.costs[s.cost as usize];
            if !half && matches!(op, Op::Recv | Op::RecvSend) {
                t = t.max(pend);
                let chan = &mut self.chans[c.in_conn[s.recv()] as usize];
                let Some(a) = chan.queue.pop_front() else {
                    chan.waiter = p as u32;
                    break;
                };
                t = t.max(a) + cost.work;
                if op == Op::Recv {
                    pc += 1;
                    continue;
                }
                half = true;
            }
            match op {
                Op::Local => {
                    t = t.max(pend) + cost.work;
                    pc += 1;
                    continue;
                }
                Op::Send => t = t.max(pend),
                // A rank issues its reads in order as its receive port
                // frees: one that cannot start yet claims nothing, so a
                // peer's port is not held idle for it.
                Op::Get => t = t.max(self.rx_free[c.conns[s.send as usize].rx as usize]),
                _ => {}
            }
            if t > now {
                // Claim resources in simulated-time order: come back at t.
                self.queue.push(t, p);
                break;
            }
            let (sent, arrived) = self.transfer(c, s.send, t, cost.dur);
            match op {
                Op::Put => {
                    pend = pend.max(arrived) + cost.work;
                    t = sent;
                }
                Op::Get => pend = pend.max(arrived) + cost.work,
                _ => {
                    let chan = &mut self.chans[s.send as usize];
                    chan.queue.push_back(arrived);
                    let q = chan.waiter;
                    if q != NONE {
                        chan.waiter = NONE;
                        let q = q as usize;
                        self.queue.push(self.time[q].max(arrived), q);
                    }
                    t = sent;
                }
            }
            pc += 1;
            half = false;
        }
        self.pc[p] = pc;
        self.time[p] = t;
        self.pend[p] = pend;
        self.half[p] = half;
    }
}
