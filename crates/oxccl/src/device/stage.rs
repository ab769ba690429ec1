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
//! other call. Staging memory comes from a pool and goes back to it once
//! the stream has passed the call's end.

use super::DevCounters;
use super::backend::{Backend, Marker, Pinned, word};
use crate::buf::{CudaStream, DeviceBuf, Region};
use crate::call::Call;
use crate::job::{Action, Counters, Job};
use oxccl_algo::collective::CollKind;
use oxccl_core::{Error, Result};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Calls whose staging memory may be in use at once; one more waits for
/// the oldest to leave its stream.
const MAX_IN_FLIGHT: usize = 8;

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

struct InFlight {
    bufs: [Box<dyn Pinned>; 2],
    end: Box<dyn Marker>,
}

#[derive(Default)]
struct Pool {
    /// Chunks staged so far (the counters' next values start above it).
    seq: u64,
    in_flight: VecDeque<InFlight>,
    free: Vec<Box<dyn Pinned>>,
    /// The stream of the last call and its end.
    last: Option<CudaStream>,
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
        Stager { dev, counters, chunk: chunk.max(1), timeout, pool: Mutex::new(Pool::default()) }
    }

    /// The error a kernel recorded, if any.
    pub fn failure(&self) -> Option<Error> {
        self.counters.failure()
    }

    /// Enqueues `call` on `stream` and returns the host jobs to queue, in
    /// order (each planned by `plan` from a host call on staging memory):
    /// the caller submits them and returns at once. Nothing is enqueued
    /// when planning fails.
    pub fn run(
        &self,
        plan: &dyn Fn(&Call<Region>) -> Result<Job>,
        call: &Call<DeviceBuf>,
        stream: CudaStream,
    ) -> Result<Vec<Job>> {
        let es = call.dtype.size();
        let ranges = chunks(call.kind, call.count, es, self.chunk);
        if ranges.is_empty() {
            return Ok(Vec::new());
        }
        let mut pool = self.pool.lock();
        self.reap(&mut pool)?;
        // Calls on different streams still reach the counters in call order.
        if let (Some(prev), Some(last)) = (pool.in_flight.back(), pool.last)
            && last != stream
        {
            self.dev.enqueue_after(stream, prev.end.as_ref())?;
        }
        let pin_in = take(&mut pool, &*self.dev, call.input.len())?;
        let pin_out = take(&mut pool, &*self.dev, call.output.len())?;
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
        let end = self.dev.marker(stream)?;
        pool.in_flight.push_back(InFlight { bufs: [pin_in, pin_out], end });
        pool.last = Some(stream);
        Ok(jobs)
    }

    /// Returns the staging memory of calls their streams have passed to
    /// the pool; with too many calls in flight, waits for the oldest.
    fn reap(&self, pool: &mut Pool) -> Result<()> {
        let start = Instant::now();
        loop {
            while let Some(f) = pool.in_flight.front() {
                if !f.end.done()? {
                    break;
                }
                let f = pool.in_flight.pop_front().expect("checked");
                pool.free.extend(f.bufs);
            }
            if pool.in_flight.len() < MAX_IN_FLIGHT {
                return Ok(());
            }
            if start.elapsed() > self.timeout {
                return Err(Error::Timeout(format!(
                    "{MAX_IN_FLIGHT} staged device calls still in flight after {:.0?} (OXCCL_TIMEOUT)",
                    self.timeout
                )));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// Staging memory of at least `len` bytes: the smallest free one that fits,
/// else a new one (a power of two from 64 KiB, so that it fits later calls).
fn take(pool: &mut Pool, dev: &dyn Backend, len: usize) -> Result<Box<dyn Pinned>> {
    let fits =
        pool.free.iter().enumerate().filter(|(_, p)| p.region().len() >= len).min_by_key(|(_, p)| p.region().len());
    if let Some((i, _)) = fits {
        return Ok(pool.free.swap_remove(i));
    }
    dev.pinned(len.max(64 << 10).next_power_of_two())
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
