//! Device buffers through host memory: the path for ranks that cannot read
//! each other's GPU memory (other hosts; no CUDA IPC), over the host
//! transports (TCP, shared memory).
//!
//! A call becomes, for each chunk `k` (elementwise collectives are cut into
//! chunks of `OXCCL_STAGE_CHUNK` bytes, the others are one chunk):
//!
//! ```text
//! stream:  d2h(k) · signal(D2H = s+k)      …all chunks…      wait(H2D ≥ s+k) · h2d(k)  …all chunks…
//! engine:                       await(D2H ≥ s+k) · host collective(k) · set(H2D = s+k)
//! ```
//!
//! All copies out are enqueued before the first copy back, so chunk `k`'s
//! network time overlaps chunk `k+1`'s copy out and chunk `k-1`'s copy back,
//! and every input byte is read before an output byte is written (in place
//! works). The engine runs the host collectives in call order, like every
//! other call.
//!
//! Staging memory: call `k` uses the buffer pair of slot `k mod
//! MAX_IN_FLIGHT`, free again once the stream has passed the call `k -
//! MAX_IN_FLIGHT` that used it before. Allocating page-locked memory (and
//! freeing it) can wait for all work queued on the GPU, and a peer thread's
//! kernel waiting for the host collective, which needs our copy, may be
//! queued there. So a slot grows only at the same call on every rank (its
//! size is the largest any rank needs for that call, and a slot's size
//! depends only on the calls so far), with none of this rank's staged
//! calls in flight, and before a barrier of every rank: no rank enqueues
//! anything of that call before all have allocated, and what the ranks
//! enqueued before finishes without us. A growth also fills, at that
//! size, the next slots that are smaller, up to `GROW_BUDGET` bytes, so
//! that calls of a new size do not drain the pipeline once per slot.

use super::DevCounters;
use super::backend::{Backend, Marker, Pinned, word};
use crate::buf::{CudaStream, DeviceBuf, Region};
use crate::call::Call;
use crate::job::{Action, Counters, Job};
use crate::op::Op;
use oxccl_algo::collective::CollKind;
use oxccl_core::{Error, Result};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Calls whose staging memory may be in use at once; one more waits for
/// the oldest to leave its stream.
const MAX_IN_FLIGHT: usize = 8;

/// Staging bytes a growth allocates at most beyond the slot that needs it.
const GROW_BUDGET: usize = 64 << 20;

/// The smallest staging buffer.
const MIN_STAGE: usize = 64 << 10;

/// Sends and receives of device buffers go through host memory in pieces
/// of this many bytes (both ends cut a message the same way: the same
/// host messages, whatever each side's group holds).
pub(crate) const P2P_CHUNK: usize = 128 << 10;

/// Sends (and, apart, receives) of one staged group.
pub(crate) const P2P_MAX_OPS: usize = 32;

/// A send or receive of a staged group: (send, peer, buffer).
pub(crate) type P2pOp = (bool, usize, DeviceBuf);

/// Pieces of a message of `len` bytes: an empty message is one empty piece.
fn pieces(len: usize) -> usize {
    len.div_ceil(P2P_CHUNK).max(1)
}

/// Element ranges `[a, b)` of the chunks of a call: elementwise collectives
/// in pieces of at most `chunk_bytes` (at least one element), the others
/// whole; nothing for an empty call.
pub(crate) fn chunks(kind: CollKind, count: usize, es: usize, chunk_bytes: usize) -> Vec<(usize, usize)> {
    if count == 0 {
        return Vec::new();
    }
    let elementwise = matches!(kind, CollKind::AllReduce | CollKind::Broadcast | CollKind::Reduce);
    if !elementwise {
        return vec![(0, count)];
    }
    let step = (chunk_bytes / es).max(1);
    (0..count).step_by(step).map(|a| (a, (a + step).min(count))).collect()
}

/// Staging bytes (input, output) of `call` on the rank that needs the most:
/// the same on every rank.
pub(crate) fn staging_bytes(call: &Call<DeviceBuf>) -> [usize; 2] {
    let coll = call.collective();
    let es = call.dtype.size();
    let most = |f: &dyn Fn(usize) -> usize| (0..call.nranks).map(f).max().unwrap_or(0) * es;
    [most(&|r| coll.input_len(r)), most(&|r| coll.output_len(r))]
}

/// A staging buffer for `bytes`: a power of two from `MIN_STAGE`.
fn stage_size(bytes: usize) -> usize {
    bytes.max(MIN_STAGE).next_power_of_two()
}

/// A slot's staging buffers (input, output).
type Slot = [Box<dyn Pinned>; 2];

/// Whether `slot` holds `need` bytes each way.
fn fits(slot: &Option<Slot>, need: [usize; 2]) -> bool {
    slot.as_ref().is_some_and(|[i, o]| i.region().len() >= need[0] && o.region().len() >= need[1])
}

struct Pool {
    /// Chunks staged so far (the counters' next values start above it).
    seq: u64,
    /// Staged calls so far (call `k` uses slot `k % MAX_IN_FLIGHT`).
    calls: u64,
    /// The ends of the calls whose stream has not passed them, oldest first.
    in_flight: VecDeque<Box<dyn Marker>>,
    slots: Vec<Option<Slot>>,
    /// The stream of the last call.
    last: Option<CudaStream>,
    /// The two staging slots of sends and receives (allocated once), and
    /// the rounds staged so far (round `k` uses slot `k % 2`).
    p2p: Option<[Slot; 2]>,
    p2p_rounds: u64,
}

/// The staging path of one communicator.
pub(crate) struct Stager {
    dev: Arc<dyn Backend>,
    counters: Arc<dyn Counters>,
    chunk: usize,
    timeout: Duration,
    pool: Mutex<Pool>,
}

impl Stager {
    pub fn new(dev: Arc<dyn Backend>, chunk: usize, timeout: Duration, who: &str) -> Stager {
        let counters = Arc::new(DevCounters { dev: dev.clone(), who: who.to_string() });
        let pool = Pool {
            seq: 0,
            calls: 0,
            in_flight: VecDeque::new(),
            slots: (0..MAX_IN_FLIGHT).map(|_| None).collect(),
            last: None,
            p2p: None,
            p2p_rounds: 0,
        };
        Stager { dev, counters, chunk: chunk.max(1), timeout, pool: Mutex::new(pool) }
    }

    /// Allocates the staging memory `first` (this communicator's first
    /// staged call) needs, at set-up: the caller's set-up then waits for
    /// every rank (a bootstrap exchange) before any rank enqueues a call,
    /// which is the barrier a growth needs ([`Stager::run`] then finds the
    /// memory there and grows, with its own barrier, only for larger calls).
    pub fn prepare(&self, first: &Call<DeviceBuf>) -> Result<()> {
        let mut pool = self.pool.lock();
        let slot = (pool.calls % MAX_IN_FLIGHT as u64) as usize;
        let need = staging_bytes(first);
        if fits(&pool.slots[slot], need) { Ok(()) } else { self.grow(&mut pool, slot, need) }
    }

    /// Allocates the staging memory of sends and receives (once; at
    /// set-up on a GPU, where allocating later could wait for a peer's
    /// queued kernel, see the module's documentation).
    pub fn prepare_p2p(&self) -> Result<()> {
        let mut pool = self.pool.lock();
        if pool.p2p.is_none() {
            let bytes = P2P_MAX_OPS * P2P_CHUNK;
            let slot = || -> Result<Slot> { Ok([self.dev.pinned(bytes)?, self.dev.pinned(bytes)?]) };
            pool.p2p = Some([slot()?, slot()?]);
        }
        Ok(())
    }

    /// Enqueues a group of sends and receives (`ops`, in call order) on
    /// `stream` and returns the host jobs to queue, in order (`plan` makes
    /// one from a host group). Every message moves in pieces of
    /// [`P2P_CHUNK`] bytes; round `k` carries piece `k` of every message
    /// that has one: the sends' pieces are copied out, the host group sends
    /// and receives them all at once, the receives' pieces are copied back.
    /// Rounds alternate between two staging slots, round `k + 1`'s copies
    /// out enqueued before round `k`'s copies back, all in stream order.
    /// Nothing is enqueued when planning fails.
    pub fn run_p2p(
        &self,
        plan: &dyn Fn(Vec<Op>) -> Result<Option<Job>>,
        ops: &[P2pOp],
        stream: CudaStream,
    ) -> Result<Vec<Job>> {
        let (nsend, nrecv) = (ops.iter().filter(|o| o.0).count(), ops.iter().filter(|o| !o.0).count());
        if nsend.max(nrecv) > P2P_MAX_OPS {
            return Err(Error::InvalidUsage(format!(
                "a group of {nsend} sends and {nrecv} receives of device buffers through host memory; at most \
                 {P2P_MAX_OPS} each way at once (split the group)"
            )));
        }
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        self.prepare_p2p()?;
        let mut pool = self.pool.lock();
        let rounds = ops.iter().map(|o| pieces(o.2.len())).max().unwrap_or(0);
        let piece = |buf: &DeviceBuf, k: usize| -> Option<(usize, usize)> {
            let (a, len) = (k * P2P_CHUNK, buf.len());
            (a < len || (k == 0 && len == 0)).then(|| (a, (len - a).min(P2P_CHUNK)))
        };
        // Plan every round first: an error changes nothing.
        let base = pool.seq;
        let first = pool.p2p_rounds;
        let mut jobs = Vec::with_capacity(rounds);
        let mut copies = Vec::with_capacity(rounds);
        {
            let slots = pool.p2p.as_ref().expect("allocated above");
            for k in 0..rounds {
                let [pin_in, pin_out] = &slots[((first + k as u64) % 2) as usize];
                let (hin, hout) = (pin_in.region(), pin_out.region());
                let (mut host, mut outs, mut backs) = (Vec::new(), Vec::new(), Vec::new());
                let (mut si, mut ri) = (0, 0);
                for &(send, peer, buf) in ops {
                    let at = if send { &mut si } else { &mut ri };
                    let slot_off = *at * P2P_CHUNK;
                    *at += 1;
                    let Some((a, len)) = piece(&buf, k) else { continue };
                    let region = if send { hin.sub(slot_off, len)? } else { hout.sub(slot_off, len)? };
                    let dev = buf.sub(a, len)?;
                    if send {
                        outs.push((region, dev))
                    } else {
                        backs.push((region, dev))
                    }
                    let dtype = oxccl_core::DataType::Uint8;
                    host.push(if send { Op::send(region, dtype, peer) } else { Op::recv(region, dtype, peer) });
                }
                let v = base + k as u64 + 1;
                let mut job = plan(host)?.ok_or_else(|| Error::Internal("an empty staged round".into()))?;
                job.pre.insert(0, Action::Await { dev: self.counters.clone(), word: word::D2H, value: v });
                job.post.push(Action::Signal { dev: self.counters.clone(), word: word::H2D, value: v });
                jobs.push(job);
                copies.push((outs, backs));
            }
        }
        self.follow(&pool, stream)?;
        pool.seq += rounds as u64;
        pool.p2p_rounds += rounds as u64;
        let back = |k: usize, backs: &[(Region, DeviceBuf)]| -> Result<()> {
            self.dev.enqueue_wait(stream, word::H2D, base + k as u64 + 1, self.timeout)?;
            for (h, d) in backs {
                if !h.is_empty() {
                    self.dev.enqueue_h2d(stream, *d, *h)?;
                }
            }
            Ok(())
        };
        for (k, (outs, _)) in copies.iter().enumerate() {
            for (h, d) in outs {
                if !h.is_empty() {
                    self.dev.enqueue_d2h(stream, *h, *d)?;
                }
            }
            self.dev.enqueue_signal(stream, word::D2H, base + k as u64 + 1)?;
            if k > 0 {
                back(k - 1, &copies[k - 1].1)?;
            }
        }
        back(rounds - 1, &copies[rounds - 1].1)?;
        self.close(&mut pool, stream)?;
        Ok(jobs)
    }

    /// Makes `stream` wait for the last staged call when that was on
    /// another stream: calls still reach the counters in call order.
    fn follow(&self, pool: &Pool, stream: CudaStream) -> Result<()> {
        if let (Some(prev), Some(last)) = (pool.in_flight.back(), pool.last)
            && last != stream
        {
            self.dev.enqueue_after(stream, prev.as_ref())?;
        }
        Ok(())
    }

    /// Records the end of a call just enqueued on `stream`.
    fn close(&self, pool: &mut Pool, stream: CudaStream) -> Result<()> {
        pool.in_flight.push_back(self.dev.marker(stream)?);
        pool.last = Some(stream);
        Ok(())
    }

    /// Waits until the stream has passed every staged call (at most the
    /// timeout): then none of this communicator's staging kernels is queued.
    pub fn drain(&self) -> Result<()> {
        self.wait_in_flight(&mut self.pool.lock(), 0)
    }

    /// The error a kernel recorded, if any.
    pub fn failure(&self) -> Option<Error> {
        self.counters.failure()
    }

    /// Enqueues `call` on `stream` and returns the host jobs to queue, in
    /// order (each planned by `plan` from a host call on staging memory):
    /// the caller submits them and returns at once. Nothing is enqueued
    /// when planning fails. `barrier` waits for every rank (when the
    /// staging memory grows; see the module's documentation).
    pub fn run(
        &self,
        plan: &dyn Fn(&Call<Region>) -> Result<Job>,
        barrier: &dyn Fn() -> Result<()>,
        call: &Call<DeviceBuf>,
        stream: CudaStream,
    ) -> Result<Vec<Job>> {
        let es = call.dtype.size();
        let ranges = chunks(call.kind, call.count, es, self.chunk);
        if ranges.is_empty() {
            return Ok(Vec::new());
        }
        let mut pool = self.pool.lock();
        // The call that used this slot before must be done with it.
        self.wait_in_flight(&mut pool, MAX_IN_FLIGHT - 1)?;
        let slot = (pool.calls % MAX_IN_FLIGHT as u64) as usize;
        let need = staging_bytes(call);
        if !fits(&pool.slots[slot], need) {
            // Every rank gets here at this call: all pass the barrier, even
            // one whose allocation failed (its error then stops only it).
            let grown = self.grow(&mut pool, slot, need);
            barrier()?;
            grown?;
        }
        self.follow(&pool, stream)?;
        let [pin_in, pin_out] = pool.slots[slot].as_ref().expect("fits after growing");
        let (hin, hout) = (pin_in.region().sub(0, call.input.len())?, pin_out.region().sub(0, call.output.len())?);
        let whole = ranges.len() == 1;
        let piece = |r: &Region, d: &DeviceBuf, (a, b): (usize, usize)| -> Result<(Region, DeviceBuf)> {
            if whole || r.is_empty() {
                return Ok((*r, *d));
            }
            Ok((r.sub(a * es, (b - a) * es)?, d.sub(a * es, (b - a) * es)?))
        };
        // Plan every host collective first: an error changes nothing.
        let base = pool.seq;
        let mut jobs = Vec::with_capacity(ranges.len());
        for (k, &(a, b)) in ranges.iter().enumerate() {
            let n = if whole { call.count } else { b - a };
            let v = base + k as u64 + 1;
            let (i, _) = piece(&hin, &call.input, (a, b))?;
            let (o, _) = piece(&hout, &call.output, (a, b))?;
            let mut host = call.with_buffers(i, o);
            host.count = n;
            let mut job = plan(&host)?;
            job.pre.insert(0, Action::Await { dev: self.counters.clone(), word: word::D2H, value: v });
            job.post.push(Action::Signal { dev: self.counters.clone(), word: word::H2D, value: v });
            jobs.push(job);
        }
        pool.seq += ranges.len() as u64;
        for (k, &r) in ranges.iter().enumerate() {
            let (h, d) = piece(&hin, &call.input, r)?;
            if !h.is_empty() {
                self.dev.enqueue_d2h(stream, h, d)?;
            }
            self.dev.enqueue_signal(stream, word::D2H, base + k as u64 + 1)?;
        }
        for (k, &r) in ranges.iter().enumerate() {
            self.dev.enqueue_wait(stream, word::H2D, base + k as u64 + 1, self.timeout)?;
            let (h, d) = piece(&hout, &call.output, r)?;
            if !h.is_empty() {
                self.dev.enqueue_h2d(stream, d, h)?;
            }
        }
        self.close(&mut pool, stream)?;
        pool.calls += 1;
        Ok(jobs)
    }

    /// Forgets the calls the stream has passed; waits (at most the
    /// timeout) until at most `most` are left.
    fn wait_in_flight(&self, pool: &mut Pool, most: usize) -> Result<()> {
        let start = Instant::now();
        loop {
            while let Some(end) = pool.in_flight.front() {
                if !end.done()? {
                    break;
                }
                pool.in_flight.pop_front();
            }
            if pool.in_flight.len() <= most {
                return Ok(());
            }
            if start.elapsed() > self.timeout {
                return Err(Error::Timeout(format!(
                    "{} staged device calls still in flight after {:.0?} (OXCCL_TIMEOUT)",
                    pool.in_flight.len(),
                    self.timeout
                )));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// Makes slot `slot` hold `need` bytes each way, with nothing of ours in
    /// flight (see the module's documentation; the caller then waits for
    /// every rank); the next slots that are smaller grow to the same size
    /// while the budget lasts.
    fn grow(&self, pool: &mut Pool, slot: usize, need: [usize; 2]) -> Result<()> {
        self.wait_in_flight(pool, 0)?;
        let need = need.map(stage_size);
        let mut spent = 0;
        for k in 0..MAX_IN_FLIGHT {
            let s = (slot + k) % MAX_IN_FLIGHT;
            if fits(&pool.slots[s], need) {
                continue;
            }
            let had = pool.slots[s].as_ref().map_or([0, 0], |[i, o]| [i.region().len(), o.region().len()]);
            let size = [need[0].max(had[0]), need[1].max(had[1])];
            if k > 0 && spent + size[0] + size[1] > GROW_BUDGET {
                break;
            }
            // A buffer that is too small goes first (freeing is as safe now
            // as allocating); one that fits stays.
            let [mut keep_in, mut keep_out] = match pool.slots[s].take() {
                Some([i, o]) => [Some(i), Some(o)],
                None => [None, None],
            };
            keep_in = keep_in.filter(|b| b.region().len() >= size[0]);
            keep_out = keep_out.filter(|b| b.region().len() >= size[1]);
            let mut fresh = |keep: Option<Box<dyn Pinned>>, bytes: usize| match keep {
                Some(b) => Ok(b),
                None => {
                    spent += bytes;
                    self.dev.pinned(bytes)
                }
            };
            pool.slots[s] = Some([fresh(keep_in, size[0])?, fresh(keep_out, size[1])?]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elementwise_calls_are_cut_into_chunks() {
        assert_eq!(chunks(CollKind::AllReduce, 10, 4, 16), vec![(0, 4), (4, 8), (8, 10)]);
        assert_eq!(chunks(CollKind::Broadcast, 3, 8, 4), vec![(0, 1), (1, 2), (2, 3)]);
        assert_eq!(chunks(CollKind::AllGather, 10, 4, 16), vec![(0, 10)]);
        assert_eq!(chunks(CollKind::AllToAll, 0, 4, 16), Vec::<(usize, usize)>::new());
        assert_eq!(chunks(CollKind::Reduce, 7, 2, 1 << 20), vec![(0, 7)]);
    }
}
