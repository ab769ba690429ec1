//! One rank's benchmark, as nccl-tests' `TimeTest` and `BenchTime` run it:
//! per (type, op, root), warm-up over the sizes, then per size an
//! out-of-place and an in-place measurement: a synchronising call,
//! `-n` timed iterations of `-m` operations, the time combined over
//! ranks (`-a`), then untimed check runs on fresh data.
//!
//! The timed loop neither allocates nor formats: buffers are allocated
//! once at `-e` bytes, every call's slices are computed in place.

use crate::args::{Average, Options};
use crate::buffer::Buffer;
use crate::gpu::Gpu;
use crate::report::Reporter;
use crate::shape::{Shape, bandwidth, sweep, warmup_sizes};
use oxccl::{CollKind, Communicator, DataType, ReduceOp, Result, Spec};
use oxccl_algo::collective::Collective;
use oxccl_algo::exact::{Pattern, premul_scalar};
use std::time::Instant;

/// What a rank reports when its benchmark is over.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Outcome {
    /// Failed checks, summed over ranks (nccl-tests' out-of-bounds count).
    pub errors: u64,
    /// Sum of every block's bus bandwidth.
    pub bw_sum: f64,
    /// Number of blocks.
    pub bw_count: u64,
}

/// One measurement's geometry, computed once per size.
struct Step {
    coll: Collective,
    shape: Shape,
    /// The operator this rank passes (mulsum carries its own scalar).
    op: ReduceOp,
    es: usize,
    /// Bytes each iteration moves on from the last (nccl-tests' `shift`).
    total: usize,
    /// How many distinct `total`-byte places fit in the buffers.
    steps: usize,
    /// First byte of the buffers (`-u`).
    base: usize,
    /// In place: where oxccl's buffer starts in the receive buffer (bytes
    /// from `base`) and its length.
    slice_at: usize,
    slice_len: usize,
}

/// One rank's state.
pub struct Bench<'a> {
    comm: &'a Communicator,
    opts: &'a Options,
    kind: CollKind,
    send: Buffer,
    recv: Buffer,
    report: Option<&'a mut Reporter>,
    rep: u64,
    failed: u64,
    out: Outcome,
    iter_times: Vec<f64>,
    /// `-H gpu`: the device buffers (`send`/`recv` are then their host
    /// mirrors).
    gpu: Option<Gpu>,
}

impl<'a> Bench<'a> {
    /// A rank's benchmark of `kind`; `report` is `Some` on global rank 0.
    pub fn new(
        comm: &'a Communicator,
        opts: &'a Options,
        kind: CollKind,
        report: Option<&'a mut Reporter>,
        gpu: Option<Gpu>,
    ) -> Bench<'a> {
        let bytes = Self::buffer_bytes(opts);
        let times = if opts.per_iter_timing { opts.iters } else { 0 };
        Bench {
            comm,
            opts,
            kind,
            send: Buffer::new(bytes),
            recv: Buffer::new(bytes),
            report,
            rep: 0,
            failed: 0,
            out: Outcome::default(),
            iter_times: vec![0.0; times],
            gpu,
        }
    }

    /// Whether this rank prints the report (global rank 0).
    pub fn reports(&self) -> bool {
        self.report.is_some()
    }

    /// Buffer bytes each rank needs (`-e` and `-u`).
    pub fn buffer_bytes(opts: &Options) -> usize {
        opts.max_bytes + 8 * opts.unalign
    }

    fn step(&self, bytes: usize, dtype: DataType, op: Option<ReduceOp>, root: Option<usize>) -> Result<Step> {
        let (n, rank, es) = (self.comm.size(), self.comm.rank(), dtype.size());
        let shape = Shape::new(self.kind, bytes, dtype, n);
        let coll = Collective { kind: self.kind, nranks: n, count: shape.param, root: root.unwrap_or(0), dtype };
        let op = match op {
            Some(ReduceOp::PreMulSum { .. }) => ReduceOp::PreMulSum { scalar: premul_scalar(rank) },
            Some(o) if self.kind.reduces() => o,
            _ => ReduceOp::Sum,
        };
        let total = shape.size_bytes(dtype);
        let steps = self.opts.max_bytes.checked_div(total).unwrap_or(1).max(1);
        // Place oxccl's in-place buffer so that its layout is nccl-tests'
        // (input at send_inplace·rank, output at recv_inplace·rank).
        let l = coll.in_place_layout(rank);
        let (ni, no) = (coll.input_len(rank), coll.output_len(rank));
        let from_out = (shape.recv_inplace * rank).checked_sub(l.output_at);
        let from_in = (shape.send_inplace * rank).checked_sub(l.input_at);
        let at = match (ni > 0, no > 0) {
            (true, true) if from_in != from_out => None,
            (_, true) => from_out,
            _ => from_in,
        };
        let at = at.ok_or_else(|| {
            oxccl::Error::Internal(format!(
                "{}: oxccl's in-place layout differs from nccl-tests' on rank {rank}",
                self.kind
            ))
        })?;
        let base = self.opts.unalign * es;
        Ok(Step { coll, shape, op, es, total, steps, base, slice_at: at * es, slice_len: l.len * es })
    }

    fn pattern(&self, st: &Step, seed: u64) -> Pattern {
        Pattern::new(self.kind, st.coll.dtype, st.op, self.comm.size(), seed)
    }

    /// The time of one operation as `-a` combines the ranks' times.
    fn combine_time(&self, sec: f64) -> Result<f64> {
        let mut t = [sec];
        match self.opts.average {
            Average::Rank0 => self.comm.broadcast(&mut t, 0)?,
            Average::Mean => {
                self.comm.all_reduce_in_place(&mut t, ReduceOp::Sum)?;
                t[0] /= self.comm.size() as f64;
            }
            Average::Min => self.comm.all_reduce_in_place(&mut t, ReduceOp::Min)?,
            Average::Max => self.comm.all_reduce_in_place(&mut t, ReduceOp::Max)?,
        }
        Ok(t[0])
    }

    /// Waits for the device (`-H gpu`) to finish what was enqueued.
    fn sync(&self) -> Result<()> {
        match &self.gpu {
            Some(g) => self.comm.device_synchronize(g.stream()),
            None => Ok(()),
        }
    }

    /// The receive window the check reads: its first element (counted from
    /// the buffers' base) and its bytes in the receive buffer.
    fn window(&self, st: &Step, in_place: bool) -> (usize, std::ops::Range<usize>) {
        let s = &st.shape;
        let w0 = if in_place { s.recv_inplace * self.comm.rank() } else { 0 };
        let at = st.base + w0 * st.es;
        (w0, at..at + s.recv * st.es)
    }

    /// `-H gpu`: copies the receive window down into the host mirror.
    fn download(&mut self, st: &Step, in_place: bool) -> Result<()> {
        let (_, w) = self.window(st, in_place);
        match &self.gpu {
            Some(g) => g.download(self.recv.bytes_mut(), w.start, w.len()),
            None => Ok(()),
        }
    }

    /// Zeroes what the check will examine and writes this rank's input
    /// where the call reads it (and, on a GPU, copies both up).
    fn init_data(&mut self, st: &Step, p: &Pattern, in_place: bool) -> Result<()> {
        let (rank, es) = (self.comm.rank(), st.es);
        let s = &st.shape;
        let input = st.coll.input_len(rank) * es;
        let window_end = (if in_place { s.recv_inplace * rank } else { 0 } + s.recv) * es;
        let end = window_end.max(if in_place { st.slice_at + st.slice_len } else { 0 });
        self.recv.bytes_mut()[st.base..st.base + end].fill(0);
        let at = if in_place { st.base + s.send_inplace * rank * es } else { st.base };
        let dst = if in_place { &mut self.recv } else { &mut self.send };
        p.fill(rank, &mut dst.bytes_mut()[at..at + input]);
        if let Some(g) = &self.gpu {
            g.upload(true, self.recv.bytes(), st.base, end)?;
            g.upload(in_place, if in_place { self.recv.bytes() } else { self.send.bytes() }, at, input)?;
        }
        Ok(())
    }

    fn count_wrong(&self, st: &Step, p: &Pattern, in_place: bool) -> u64 {
        let (rank, es) = (self.comm.rank(), st.es);
        let s = &st.shape;
        let (w0, w) = self.window(st, in_place);
        let window = &self.recv.bytes()[w];
        if in_place {
            let l = st.coll.in_place_layout(rank);
            let input_at = (s.send_inplace * rank) as isize - w0 as isize;
            let output_at = (st.slice_at / es + l.output_at) as isize - w0 as isize;
            p.count_wrong(&st.coll, rank, window, Some(input_at), output_at)
        } else {
            p.count_wrong(&st.coll, rank, window, None, 0)
        }
    }

    /// One timed iteration: `-m` operations, grouped when out of place.
    fn start(&mut self, st: &Step, iter: usize, in_place: bool) -> Result<()> {
        let agg = self.opts.agg_iters;
        if agg == 1 {
            return self.issue(st, iter, in_place);
        }
        let mut a = 0;
        while a < agg {
            let first = (iter * agg + a) % st.steps;
            let run = (st.steps - first).min(agg - a);
            if in_place {
                for k in 0..run {
                    self.issue(st, first + k, true)?;
                }
            } else {
                self.group(st, first, run)?;
            }
            a += run;
        }
        Ok(())
    }

    /// Operations `first..first+run` (at distinct places) in one group
    /// (on a GPU, one after another on the stream).
    fn group(&mut self, st: &Step, first: usize, run: usize) -> Result<()> {
        if self.gpu.is_some() {
            for k in 0..run {
                self.issue(st, first + k, false)?;
            }
            return Ok(());
        }
        let (kind, c) = (self.kind, &st.coll);
        let (sb, rb) = (st.shape.send * st.es, st.shape.recv * st.es);
        let (n, rank) = (self.comm.size(), self.comm.rank());
        let send = self.send.bytes();
        let spec = Spec::new(kind, c.count, c.dtype).with_op(st.op).with_root(c.root);
        let mut rest = &mut self.recv.bytes_mut()[st.base + first * st.total..];
        self.comm.group(|g| {
            for k in 0..run {
                let (head, tail) = std::mem::take(&mut rest).split_at_mut(st.total.max(rb));
                let at = st.base + (first + k) * st.total;
                let src = &send[at..at + sb];
                if kind == CollKind::SendRecv {
                    g.send(src, (rank + 1) % n);
                    g.recv(&mut head[..rb], (rank + n - 1) % n);
                } else {
                    g.collective_bytes(spec, src, &mut head[..rb]);
                }
                rest = tail;
            }
        })?;
        if self.opts.blocking == 1 {
            self.comm.barrier()?;
        }
        Ok(())
    }

    /// One operation at place `iter % steps`.
    fn issue(&mut self, st: &Step, iter: usize, in_place: bool) -> Result<()> {
        let c = &st.coll;
        let at = st.base + st.total * (iter % st.steps);
        let (sb, rb) = (st.shape.send * st.es, st.shape.recv * st.es);
        let (n, rank) = (self.comm.size(), self.comm.rank());
        let spec = Spec::new(self.kind, c.count, c.dtype).with_op(st.op).with_root(c.root);
        if let Some(g) = &self.gpu {
            let s = g.stream();
            let kind = self.kind;
            if kind == CollKind::SendRecv {
                // As on host memory: in place, the buffers swap roles.
                let (src, dst) = if in_place {
                    (g.buf(true, at, sb), g.buf(false, at, rb))
                } else {
                    (g.buf(false, at, sb), g.buf(true, at, rb))
                };
                self.comm.group(|g| {
                    g.stream(s).send_device(src, c.dtype, (rank + 1) % n).recv_device(dst, c.dtype, (rank + n - 1) % n);
                })?;
            } else if in_place {
                let buf = g.buf(true, at + st.slice_at, st.slice_len);
                self.comm.collective_device(spec, None, buf, s)?;
            } else {
                let (src, dst) = (g.buf(false, at, sb), g.buf(true, at, rb));
                self.comm.collective_device(spec, Some(src), dst, s)?;
            }
            if self.opts.blocking > 0 {
                self.sync()?;
            }
            if self.opts.blocking == 1 {
                self.comm.barrier()?;
            }
            return Ok(());
        }
        if self.kind == CollKind::SendRecv {
            // In place, the send and receive buffers swap roles: oxccl's
            // safe API cannot send from and receive into one buffer.
            let (src, dst) = if in_place { (&self.recv, &mut self.send) } else { (&self.send, &mut self.recv) };
            let (src, dst) = (&src.bytes()[at..at + sb], &mut dst.bytes_mut()[at..at + rb]);
            self.comm.group(|g| {
                g.send(src, (rank + 1) % n);
                g.recv(dst, (rank + n - 1) % n);
            })?;
        } else if in_place {
            let buf = &mut self.recv.bytes_mut()[at + st.slice_at..][..st.slice_len];
            self.comm.collective_bytes(spec, None, buf)?;
        } else {
            let (src, dst) = (&self.send.bytes()[at..at + sb], &mut self.recv.bytes_mut()[at..at + rb]);
            self.comm.collective_bytes(spec, Some(src), dst)?;
        }
        if self.opts.blocking == 1 {
            self.comm.barrier()?;
        }
        Ok(())
    }
}

/// The ranks one thread drives: one on host memory, `-g` of them with
/// `-H gpu`, as nccl-tests' `-g` does: the thread enqueues each operation
/// of every rank in turn (device calls return once enqueued), then waits
/// for every stream. Host steps that wait for all ranks (barriers, the
/// times combined over ranks, the check's counts) run on a thread per rank
/// ([`Team::all`]); so does the warm-up, which sets each communicator's
/// device side up (a collective step of every rank).
pub struct Team<'a> {
    ranks: Vec<Bench<'a>>,
}

/// Warm-up calls per size when a thread drives several ranks: oxccl's
/// staged path sizes its in-flight staging slots (8) at the first calls of
/// a size, each growth a barrier of every rank, which only the concurrent
/// warm-up can pass.
const TEAM_WARMUP: usize = 8;

impl<'a> Team<'a> {
    /// The ranks this thread drives (the one with a reporter first, if any).
    pub fn new(ranks: Vec<Bench<'a>>) -> Team<'a> {
        Team { ranks }
    }

    /// `f` on every rank at once (steps that wait for all ranks): on this
    /// thread for one rank, else on a thread each.
    fn all<R: Send>(&mut self, f: impl Fn(usize, &mut Bench<'a>) -> Result<R> + Sync) -> Result<Vec<R>> {
        if let [b] = &mut self.ranks[..] {
            return Ok(vec![f(0, b)?]);
        }
        std::thread::scope(|s| {
            let f = &f;
            let hs: Vec<_> = self.ranks.iter_mut().enumerate().map(|(i, b)| s.spawn(move || f(i, b))).collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(oxccl::Error::Internal("a rank panicked".into()))))
                .collect()
        })
    }

    /// `f` on every rank in turn, on this thread (enqueueing work).
    fn each(&mut self, mut f: impl FnMut(usize, &mut Bench<'a>) -> Result<()>) -> Result<()> {
        for (i, b) in self.ranks.iter_mut().enumerate() {
            f(i, b)?;
        }
        Ok(())
    }

    /// Runs every (type, op, root) the options name; each rank's outcome,
    /// the same on every rank except `bw_*` (rank 0's are the ones printed).
    pub fn run(mut self) -> Result<Vec<Outcome>> {
        let lead = &self.ranks[0];
        let n = lead.comm.size();
        let types: Vec<DataType> = lead.opts.dtype.map_or(DataType::ALL.to_vec(), |t| vec![t]);
        let ops: Vec<Option<ReduceOp>> = if lead.kind.reduces() || lead.kind == CollKind::SendRecv {
            lead.opts.op.map_or(ReduceOp::ALL.map(Some).to_vec(), |o| vec![Some(o)])
        } else {
            vec![None]
        };
        let roots: Vec<Option<usize>> = if lead.kind.is_rooted() {
            lead.opts.root.map_or((0..n).map(Some).collect(), |r| vec![Some(r)])
        } else {
            vec![None]
        };
        for &t in &types {
            for &op in &ops {
                for &root in &roots {
                    self.time_test(t, op, root)?;
                }
            }
        }
        let errors = self.all(|_, b| {
            let mut e = [b.failed];
            b.comm.all_reduce_in_place(&mut e, ReduceOp::Sum)?;
            Ok(e[0])
        })?;
        Ok(self.ranks.iter().zip(errors).map(|(b, errors)| Outcome { errors, ..b.out }).collect())
    }

    /// Every rank's geometry of a size.
    fn steps(&self, size: usize, dtype: DataType, op: Option<ReduceOp>, root: Option<usize>) -> Result<Vec<Step>> {
        self.ranks.iter().map(|b| b.step(size, dtype, op, root)).collect()
    }

    fn time_test(&mut self, dtype: DataType, op: Option<ReduceOp>, root: Option<usize>) -> Result<()> {
        self.all(|_, b| b.comm.barrier())?;
        let o = self.ranks[0].opts;
        let warm = if self.ranks.len() > 1 { o.warmup_iters.max(TEAM_WARMUP) } else { o.warmup_iters };
        self.all(|_, b| {
            for size in warmup_sizes(o.min_bytes, o.max_bytes) {
                let st = b.step(size, dtype, op, root)?;
                for iter in 0..warm {
                    b.issue(&st, iter, false)?;
                }
            }
            Ok(())
        })?;
        let op_name = op.map_or("none", |o| o.name());
        let root_col = root.map_or(-1, |r| r as i64);
        let mut cycle = 0;
        while o.run_cycles == 0 || cycle < o.run_cycles {
            cycle += 1;
            for size in sweep(o.min_bytes, o.max_bytes, o.step_bytes, o.step_factor) {
                let sts = self.steps(size, dtype, op, root)?;
                if let Some(r) = self.ranks[0].report.as_deref_mut() {
                    r.row_start(sts[0].shape.size_bytes(dtype), sts[0].shape.param, dtype.name(), op_name, root_col);
                }
                self.bench_time(&sts, false)?;
                self.bench_time(&sts, true)?;
                if let Some(r) = self.ranks[0].report.as_deref_mut() {
                    r.row_end(o.iters);
                }
            }
        }
        Ok(())
    }

    fn bench_time(&mut self, sts: &[Step], in_place: bool) -> Result<()> {
        let lead = &self.ranks[0];
        let (o, n, kind) = (lead.opts, lead.comm.size(), lead.kind);
        let check = o.check > 0 && !(in_place && kind == CollKind::SendRecv);
        if o.check > 0 {
            self.each(|i, b| b.init_data(&sts[i], &b.pattern(&sts[i], 99), in_place))?;
        }
        self.each(|i, b| b.issue(&sts[i], 0, in_place))?;
        self.each(|_, b| b.sync())?;
        self.all(|_, b| b.comm.barrier())?;
        let (agg, timed) = (o.agg_iters, self.ranks[0].iter_times.len());
        let t0 = Instant::now();
        let mut last = t0;
        for iter in 0..o.iters {
            self.each(|i, b| b.start(&sts[i], iter, in_place))?;
            if iter < timed {
                self.each(|_, b| b.sync())?;
                let now = Instant::now();
                let t = (now - last).as_secs_f64() / agg as f64;
                last = now;
                self.ranks.iter_mut().for_each(|b| b.iter_times[iter] = t);
            }
        }
        self.each(|_, b| b.sync())?;
        let sec = t0.elapsed().as_secs_f64() / (o.iters * agg) as f64;
        let sec = self.all(|_, b| b.combine_time(sec))?[0];
        let (alg, bus) = bandwidth(kind, sts[0].shape.size_bytes(sts[0].coll.dtype), sec, n);
        if timed > 0 {
            self.all(|_, b| b.comm.all_reduce_in_place(&mut b.iter_times, ReduceOp::Max))?;
        }
        self.all(|_, b| b.comm.barrier())?;
        let mut wrong = None;
        for _ in 0..if check { o.check } else { 0 } {
            let mut pats = Vec::with_capacity(self.ranks.len());
            self.each(|i, b| {
                b.rep += 1;
                let p = b.pattern(&sts[i], b.rep);
                b.init_data(&sts[i], &p, in_place)?;
                pats.push(p);
                Ok(())
            })?;
            self.each(|i, b| b.issue(&sts[i], 0, in_place))?;
            self.each(|i, b| {
                b.sync()?;
                b.download(&sts[i], in_place)
            })?;
            let counts = self.all(|i, b| {
                let local = b.count_wrong(&sts[i], &pats[i], in_place);
                b.failed += u64::from(local > 0);
                let mut w = [local];
                b.comm.all_reduce_in_place(&mut w, ReduceOp::Sum)?;
                Ok(w[0])
            })?;
            wrong = Some(counts[0]);
            if counts[0] > 0 {
                break;
            }
        }
        let lead = &mut self.ranks[0];
        if let Some(r) = lead.report.as_deref_mut() {
            let times = (!lead.iter_times.is_empty()).then_some(&lead.iter_times[..]);
            r.block(in_place, sec * 1e6, alg, bus, wrong, times);
        }
        for b in &mut self.ranks {
            b.out.bw_sum += bus;
            b.out.bw_count += 1;
        }
        Ok(())
    }
}
