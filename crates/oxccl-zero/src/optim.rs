//! [`Zero`]: the sharded optimizer.

use crate::adam::AdamW;
use crate::layout::{Bucket, LayerSpec, Layout};
use crate::mem::{Charge, Meter, Tracked};
use crate::param::Param;
use crate::stage::{Stage, paper_bytes, shards_grads};
use oxccl::{CollKind, Communicator, Error, ReduceOp, Result, Work};
use std::ops::Range;
use std::sync::Arc;

/// A buffer lent to an asynchronous collective; its bytes stay charged.
struct InFlight<P: Param> {
    work: Work<Vec<P>>,
    charge: Charge,
}

impl<P: Param> InFlight<P> {
    fn start(comm: &Communicator, kind: CollKind, t: Tracked<P>, count: usize) -> Result<InFlight<P>> {
        let (v, charge) = t.split();
        let work = comm.collective_async(kind, v, count, ReduceOp::Sum, 0)?;
        Ok(InFlight { work, charge })
    }

    fn finish(self) -> Result<Tracked<P>> {
        Ok(Tracked::join(self.work.wait()?, self.charge))
    }
}

/// One bucket's state on this rank.
pub(crate) struct State<P: Param> {
    /// Working parameters, whole: always in stages 0–2; in stage 3 only
    /// while the layer is gathered.
    full: Option<Tracked<P>>,
    /// Stage 3: this rank's shard of the working parameters.
    shard: Option<Tracked<P>>,
    /// Stages 0–1: the whole gradient; stages 2–3: this rank's slice
    /// (lent out while stages 0–1 reduce it).
    grad: Option<Tracked<P>>,
    /// fp32 master weights and moments: whole in stage 0, else this rank's
    /// slice.
    master: Tracked<f32>,
    m: Tracked<f32>,
    v: Tracked<f32>,
    /// The gradient being reduced.
    reducing: Option<InFlight<P>>,
    /// Stage 3: the parameters being gathered.
    gathering: Option<InFlight<P>>,
}

/// What a step did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepReport {
    /// The global L2 norm of the averaged gradient, before clipping.
    pub grad_norm: f64,
    /// The factor gradients were scaled by to clip them (1: not clipped).
    pub clip: f32,
    /// Bytes this rank sent for scalars (the norm), not for buckets.
    pub scalar_sent: u64,
    /// Bytes this rank received for scalars.
    pub scalar_recv: u64,
}

/// Bytes this rank has sent and received so far, over every peer and
/// provider (messages, and one-sided traffic it started).
pub fn traffic(comm: &Communicator) -> (u64, u64) {
    comm.stats().iter().fold((0, 0), |(s, r), p| (s + p.sent + p.put, r + p.recv + p.got))
}

/// Mixed-precision AdamW over a model's layers, sharded per [`Stage`].
///
/// Call pattern per step, the same on every rank: for each layer in order
/// [`params`](Zero::params) (stage 3 gathers; [`prefetch`](Zero::prefetch)
/// the next one first to overlap) then [`release`](Zero::release) after
/// its forward; in backward, for each layer in reverse, `params` again,
/// compute, `release`, and [`reduce_grads`](Zero::reduce_grads) (which
/// starts the bucket's reduction in the background); then
/// [`step`](Zero::step).
pub struct Zero<'c, P: Param> {
    comm: &'c Communicator,
    stage: Stage,
    layout: Layout,
    adam: AdamW,
    step: u64,
    meter: Arc<Meter>,
    state: Vec<State<P>>,
}

impl<'c, P: Param> Zero<'c, P> {
    /// An optimizer for `layers` whose parameters start at `init` (fp32,
    /// canonical order: layer by layer, tensor by tensor). Every rank must
    /// pass the same `init` (checked: a rank that differs is named).
    pub fn new(comm: &'c Communicator, stage: Stage, layers: &[LayerSpec], init: &[f32], adam: AdamW) -> Result<Self> {
        let layout = Layout::new(layers, comm.size())?;
        if init.len() != layout.params() {
            return Err(Error::invalid(format!(
                "rank {}: oxccl-zero: {} initial parameters given, the layers have {}",
                comm.rank(),
                init.len(),
                layout.params()
            )));
        }
        same_everywhere(comm, init)?;
        let meter = Arc::new(Meter::default());
        let rank = comm.rank();
        let mut state = Vec::with_capacity(layout.buckets.len());
        for b in &layout.buckets {
            let own = held(stage, b, rank);
            let mut master = Tracked::<f32>::zeroed(&meter, own.len());
            for (i, x) in own.clone().enumerate() {
                if x < b.numel {
                    master.v[i] = init[b.canonical_start + x];
                }
            }
            let working = |len: usize, from: usize| {
                let mut t = Tracked::<P>::zeroed(&meter, len);
                for (i, x) in (from..from + len).enumerate() {
                    if x < b.numel {
                        t.v[i] = P::from_f32(init[b.canonical_start + x]);
                    }
                }
                t
            };
            let (full, shard) = match stage {
                Stage::Zero3 => (None, Some(working(b.shard, own.start))),
                _ => (Some(working(b.padded, 0)), None),
            };
            let grad_len = if shards_grads(stage) { b.shard } else { b.padded };
            state.push(State {
                full,
                shard,
                grad: Some(Tracked::zeroed(&meter, grad_len)),
                m: Tracked::zeroed(&meter, own.len()),
                v: Tracked::zeroed(&meter, own.len()),
                master,
                reducing: None,
                gathering: None,
            });
        }
        Ok(Zero { comm, stage, layout, adam, step: 0, meter, state })
    }

    /// The stage.
    pub fn stage(&self) -> Stage {
        self.stage
    }

    /// The buckets.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The hyperparameters.
    pub fn adam(&self) -> &AdamW {
        &self.adam
    }

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// The communicator.
    pub fn comm(&self) -> &'c Communicator {
        self.comm
    }

    /// The optimizer's memory accounting (every buffer it holds, in flight
    /// included).
    pub fn meter(&self) -> &Arc<Meter> {
        &self.meter
    }

    /// What the stage's formula says this rank keeps between steps, for the
    /// padded buckets (what [`Meter::now`] reads between steps).
    pub fn formula_bytes(&self) -> usize {
        let p = size_of::<P>();
        self.layout
            .buckets
            .iter()
            .map(|b| {
                let (full, shard) = (b.padded, b.shard);
                match self.stage {
                    Stage::Ddp => full * (2 * p + 12),
                    Stage::Zero1 => full * 2 * p + shard * 12,
                    Stage::Zero2 => full * p + shard * (p + 12),
                    Stage::Zero3 => shard * (2 * p + 12),
                }
            })
            .sum()
    }

    /// The paper's formula for the unpadded parameters, as bytes.
    pub fn paper_bytes(&self) -> f64 {
        paper_bytes(self.stage, self.layout.params(), self.comm.size(), size_of::<P>())
    }

    fn layer(&self, layer: usize, what: &str) -> Result<&Bucket> {
        self.layout.buckets.get(layer).ok_or_else(|| {
            Error::invalid(format!(
                "rank {}: oxccl-zero {what}: layer {layer} is out of range ({} layers)",
                self.comm.rank(),
                self.layout.buckets.len()
            ))
        })
    }

    /// Stage 3: starts gathering `layer`'s parameters in the background (a
    /// later [`params`](Zero::params) waits for it). Other stages, or a
    /// layer already gathered: nothing.
    pub fn prefetch(&mut self, layer: usize) -> Result<()> {
        let b = self.layer(layer, "prefetch")?.clone();
        let st = &mut self.state[layer];
        if self.stage != Stage::Zero3 || st.full.is_some() || st.gathering.is_some() {
            return Ok(());
        }
        let mut buf = Tracked::<P>::zeroed(&self.meter, b.padded);
        let shard = st.shard.as_ref().expect("stage 3 keeps a shard");
        buf.v[b.own(self.comm.rank())].copy_from_slice(&shard.v);
        st.gathering = Some(InFlight::start(self.comm, CollKind::AllGather, buf, b.shard)?);
        Ok(())
    }

    /// `layer`'s working parameters, whole and unpadded (stage 3 gathers
    /// them, or waits for a prefetch).
    pub fn params(&mut self, layer: usize) -> Result<&[P]> {
        let numel = self.layer(layer, "params")?.numel;
        if self.state[layer].full.is_none() {
            self.prefetch(layer)?;
            let g = self.state[layer].gathering.take().expect("prefetch started a gather");
            self.state[layer].full = Some(g.finish()?);
        }
        Ok(&self.state[layer].full.as_ref().expect("gathered").v[..numel])
    }

    /// Stage 3: frees `layer`'s gathered parameters. Other stages: nothing.
    pub fn release(&mut self, layer: usize) -> Result<()> {
        self.layer(layer, "release")?;
        if self.stage == Stage::Zero3 {
            self.state[layer].full = None;
        }
        Ok(())
    }

    /// Starts reducing `layer`'s gradient (`grads`, this rank's, unpadded;
    /// converted to the parameter type) in the background. Each layer once
    /// per step, in the same order on every rank.
    pub fn reduce_grads(&mut self, layer: usize, grads: &[f32]) -> Result<()> {
        let b = self.layer(layer, "reduce_grads")?.clone();
        let rank = self.comm.rank();
        if grads.len() != b.numel {
            return Err(Error::invalid(format!(
                "rank {rank}: oxccl-zero reduce_grads: layer {layer} ({}) has {} parameters, {} gradients given",
                b.name,
                b.numel,
                grads.len()
            )));
        }
        let st = &mut self.state[layer];
        if st.reducing.is_some() {
            return Err(Error::invalid(format!(
                "rank {rank}: oxccl-zero reduce_grads: layer {layer} ({}) was already given its gradient this step",
                b.name
            )));
        }
        let mut buf = if shards_grads(self.stage) {
            Tracked::<P>::zeroed(&self.meter, b.padded)
        } else {
            st.grad.take().expect("a whole gradient buffer between steps")
        };
        for (d, &g) in buf.v.iter_mut().zip(grads) {
            *d = P::from_f32(g);
        }
        let kind = match self.stage {
            Stage::Ddp => CollKind::AllReduce,
            _ => CollKind::ReduceScatter,
        };
        let count = if kind == CollKind::AllReduce { b.padded } else { b.shard };
        st.reducing = Some(InFlight::start(self.comm, kind, buf, count)?);
        Ok(())
    }

    /// Waits for every bucket's gradient, clips by the global norm, updates
    /// this rank's share with AdamW and brings every rank's parameters up
    /// to date (stages 1–2 all-gather them; stage 3 keeps its shard).
    pub fn step(&mut self) -> Result<StepReport> {
        let rank = self.comm.rank();
        if let Some((i, b)) = self.layout.buckets.iter().enumerate().find(|(i, _)| self.state[*i].reducing.is_none()) {
            return Err(Error::invalid(format!(
                "rank {rank}: oxccl-zero step: layer {i} ({}) has no gradient this step (call reduce_grads for every layer)",
                b.name
            )));
        }
        // In the order they were started.
        for (b, st) in self.layout.buckets.iter().zip(&mut self.state) {
            let reduced = st.reducing.take().expect("checked above").finish()?;
            if shards_grads(self.stage) {
                let slice = st.grad.as_mut().expect("a gradient slice");
                slice.v.copy_from_slice(&reduced.v[b.own(rank)]);
            } else {
                st.grad = Some(reduced);
            }
        }
        let inv_n = 1.0 / self.comm.size() as f32;
        // Every stage sums the squares of the same elements (this rank's
        // slices) in the same order, then all-reduces the partial sums: the
        // norm is the same in every stage, bit for bit.
        let mut partial = 0f64;
        for (b, st) in self.layout.buckets.iter().zip(&self.state) {
            let g = &st.grad.as_ref().expect("a gradient").v;
            let own = if shards_grads(self.stage) { 0..b.shard } else { b.own(rank) };
            partial += g[own].iter().map(|&x| f64::from(x.to_f32() * inv_n).powi(2)).sum::<f64>();
        }
        let before = traffic(self.comm);
        let mut sum = [partial];
        self.comm.all_reduce_in_place(&mut sum, ReduceOp::Sum)?;
        let after = traffic(self.comm);
        let grad_norm = sum[0].sqrt();
        let clip = self.adam.clip_factor(grad_norm);
        let scale = inv_n * clip;
        self.step += 1;
        let mut gathers = Vec::new();
        for (b, st) in self.layout.buckets.iter().zip(&mut self.state) {
            let grad = &st.grad.as_ref().expect("a gradient").v;
            let (master, m, v) = (&mut st.master.v, &mut st.m.v, &mut st.v.v);
            match self.stage {
                Stage::Ddp => {
                    let out = &mut st.full.as_mut().expect("whole parameters").v;
                    self.adam.update(self.step, master, m, v, grad, scale, out);
                }
                Stage::Zero1 | Stage::Zero2 => {
                    let own = b.own(rank);
                    let g = if self.stage == Stage::Zero1 { &grad[own.clone()] } else { &grad[..] };
                    let mut full = st.full.take().expect("whole parameters");
                    self.adam.update(self.step, master, m, v, g, scale, &mut full.v[own]);
                    gathers.push(InFlight::start(self.comm, CollKind::AllGather, full, b.shard)?);
                }
                Stage::Zero3 => {
                    let out = &mut st.shard.as_mut().expect("a parameter shard").v;
                    self.adam.update(self.step, master, m, v, grad, scale, out);
                }
            }
        }
        let mut gathers = gathers.into_iter();
        for st in &mut self.state {
            if st.full.is_none() && self.stage != Stage::Zero3 {
                st.full = Some(gathers.next().expect("one gather per bucket").finish()?);
            }
        }
        Ok(StepReport { grad_norm, clip, scalar_sent: after.0 - before.0, scalar_recv: after.1 - before.1 })
    }

    /// Every parameter as fp32, unpadded, in canonical order (stage 3
    /// gathers each layer: a collective, call it on every rank).
    pub fn full_params(&mut self) -> Result<Vec<f32>> {
        let mut out = Vec::with_capacity(self.layout.params());
        for l in 0..self.layout.buckets.len() {
            let held = self.state[l].full.is_some();
            out.extend(self.params(l)?.iter().map(|x| x.to_f32()));
            if !held {
                self.release(l)?;
            }
        }
        Ok(out)
    }

    pub(crate) fn parts(&mut self) -> (&'c Communicator, &Layout, &mut [State<P>]) {
        (self.comm, &self.layout, &mut self.state)
    }

    pub(crate) fn set_steps(&mut self, step: u64) {
        self.step = step;
    }
}

impl<P: Param> State<P> {
    /// fp32 master, momentum and variance.
    pub(crate) fn optim(&mut self) -> [&mut Vec<f32>; 3] {
        [&mut self.master.v, &mut self.m.v, &mut self.v.v]
    }

    /// Sets the working parameters from the master weights, which lie at
    /// `held` of the bucket ([`held`]), and clears the gradient. Stages 1–2
    /// then hold only their slice up to date: see [`State::whole`].
    pub(crate) fn refresh(&mut self, held: Range<usize>) {
        let from = |m: &[f32], out: &mut [P]| out.iter_mut().zip(m).for_each(|(o, &x)| *o = P::from_f32(x));
        if let Some(s) = self.shard.as_mut() {
            from(&self.master.v, &mut s.v);
        } else if let Some(f) = self.full.as_mut() {
            from(&self.master.v, &mut f.v[held]);
        }
        if let Some(g) = self.grad.as_mut() {
            g.v.fill(P::default());
        }
    }

    /// The whole working parameters (stages 0–2, and stage 3 while
    /// gathered).
    pub(crate) fn whole(&mut self) -> Option<&mut Vec<P>> {
        self.full.as_mut().map(|f| &mut f.v)
    }

    /// Whether collectives are in flight.
    pub(crate) fn busy(&self) -> bool {
        self.reducing.is_some() || self.gathering.is_some()
    }
}

/// The elements of bucket `b` whose fp32 master weights and moments `rank`
/// holds: all of them in DDP, its own slice in every ZeRO stage.
pub(crate) fn held(stage: Stage, b: &Bucket, rank: usize) -> Range<usize> {
    if stage == Stage::Ddp { 0..b.padded } else { b.own(rank) }
}

/// Whether every rank holds the same `v`, bit for bit (compares a hash of
/// its bits by max and min: a collective, call it on every rank).
pub fn same_on_every_rank(comm: &Communicator, v: &[f32]) -> Result<bool> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    v.iter().for_each(|x| x.to_bits().hash(&mut h));
    let (mut hi, mut lo) = ([h.finish()], [h.finish()]);
    comm.all_reduce_in_place(&mut hi, ReduceOp::Max)?;
    comm.all_reduce_in_place(&mut lo, ReduceOp::Min)?;
    Ok(hi == lo)
}

/// Errors unless `init` is the same on every rank.
fn same_everywhere(comm: &Communicator, init: &[f32]) -> Result<()> {
    if !same_on_every_rank(comm, init)? {
        return Err(Error::invalid(format!(
            "rank {}: oxccl-zero: the ranks were given different initial parameters (every rank must pass the same)",
            comm.rank()
        )));
    }
    Ok(())
}
