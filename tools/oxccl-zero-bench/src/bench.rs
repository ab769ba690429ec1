//! Training under each stage on one rank, and what the ranks measured,
//! gathered through the communicator (so threads and processes report the
//! same way).

use crate::data::Corpus;
use crate::model::{ModelConfig, Res, forward_backward};
use oxccl::half::bf16;
use oxccl::{Communicator, ReduceOp};
use oxccl_zero::{AdamW, Param, Stage, Zero, peak_rss, same_on_every_rank, traffic};
use serde_json::{Value, json};
use std::time::Instant;

/// What to train and how.
#[derive(Clone, Debug)]
pub struct Options {
    /// Optimizer steps per stage.
    pub steps: u64,
    /// Sequences per rank per step.
    pub batch: usize,
    /// The model.
    pub model: ModelConfig,
    /// Learning rate.
    pub lr: f32,
    /// Seed of the weights and the data order.
    pub seed: u64,
    /// bf16 parameters and gradients (else f32).
    pub bf16: bool,
    /// Stages, in the order they run.
    pub stages: Vec<Stage>,
}

/// One stage on one rank.
struct Mine {
    sent: Vec<u64>,
    recv: Vec<u64>,
    state: u64,
    peak: u64,
    norm_bytes: u64,
    loss_bytes: u64,
    loss: Vec<f32>,
    params: Vec<f32>,
    formula_padded: u64,
    paper: f64,
    secs: f64,
}

fn run_stage<P: Param>(c: &Communicator, o: &Options, corpus: &Corpus, stage: Stage) -> Res<Mine> {
    let adam = AdamW { lr: o.lr, weight_decay: 0.01, ..AdamW::default() };
    let mut z = Zero::<P>::new(c, stage, &o.model.specs(), &o.model.init(o.seed), adam)?;
    z.meter().reset_peak();
    let mut m = Mine {
        sent: vec![],
        recv: vec![],
        state: 0,
        peak: 0,
        norm_bytes: 0,
        loss_bytes: 0,
        loss: vec![],
        params: vec![],
        formula_padded: z.formula_bytes() as u64,
        paper: z.paper_bytes(),
        secs: 0.0,
    };
    let t0 = Instant::now();
    for step in 0..o.steps {
        let (ids, targets) = corpus.batch(o.seed, step, c.rank(), o.batch, o.model.ctx)?;
        let before = traffic(c);
        let loss = forward_backward(&o.model, &mut z, &ids, &targets)?;
        let rep = z.step()?;
        let after = traffic(c);
        m.sent.push(after.0 - before.0 - rep.scalar_sent);
        m.recv.push(after.1 - before.1 - rep.scalar_recv);
        m.norm_bytes = rep.scalar_sent;
        // The mean loss over the ranks: a scalar, counted apart.
        let mut l = [loss];
        c.all_reduce_in_place(&mut l, ReduceOp::Avg)?;
        m.loss_bytes = traffic(c).0 - after.0;
        m.loss.push(l[0]);
        m.state = z.meter().now() as u64;
    }
    m.secs = t0.elapsed().as_secs_f64() / o.steps.max(1) as f64;
    m.peak = z.meter().peak() as u64;
    m.params = z.full_params()?;
    Ok(m)
}

fn gather_u64(c: &Communicator, mine: &[u64]) -> Res<Vec<Vec<u64>>> {
    let mut all = vec![0u64; mine.len() * c.size()];
    c.all_gather(mine, &mut all)?;
    Ok(all.chunks(mine.len().max(1)).map(|x| x.to_vec()).collect())
}

/// Trains every stage of `o` on this rank and returns the report every
/// rank agrees on (JSON; see docs/ZERO.md).
pub fn run(c: &Communicator, o: &Options) -> Res<Value> {
    if o.bf16 { run_typed::<bf16>(c, o) } else { run_typed::<f32>(c, o) }
}

fn run_typed<P: Param>(c: &Communicator, o: &Options) -> Res<Value> {
    let corpus = Corpus::new(crate::data::CORPUS);
    let n = c.size();
    let mut stages = serde_json::Map::new();
    let mut ddp: Option<(Vec<f32>, Vec<u64>)> = None;
    for &stage in &o.stages {
        let m = run_stage::<P>(c, o, &corpus, stage)?;
        let diff = ddp.as_ref().map(|(p, _)| p.iter().zip(&m.params).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max));
        let mut d = [diff.unwrap_or(0.0)];
        c.all_reduce_in_place(&mut d, ReduceOp::Max)?;
        let identical = same_on_every_rank(c, &m.params)?;
        let steady = m.sent.windows(2).all(|w| w[0] == w[1]) && m.recv.windows(2).all(|w| w[0] == w[1]);
        let first = |v: &[u64]| v.first().copied().unwrap_or(0);
        let rss = peak_rss().unwrap_or(0);
        let rows = gather_u64(
            c,
            &[first(&m.sent), first(&m.recv), m.state, m.peak, m.norm_bytes, m.loss_bytes, u64::from(steady), rss],
        )?;
        let col = |i: usize| rows.iter().map(|r| r[i]).collect::<Vec<u64>>();
        let sent = col(0);
        if stage == Stage::Ddp {
            ddp = Some((m.params.clone(), sent.clone()));
        }
        let ratio = ddp.as_ref().map(|(_, s)| sent[0] as f64 / s[0].max(1) as f64);
        let mut secs = [m.secs];
        c.all_reduce_in_place(&mut secs, ReduceOp::Max)?;
        stages.insert(
            stage.key().into(),
            json!({
                "sent_bytes_per_step": sent,
                "recv_bytes_per_step": col(1),
                "bytes_same_every_step": col(6).iter().all(|&s| s == 1),
                "ratio_to_ddp": ratio,
                "state_bytes_per_rank": col(2).iter().max(),
                "state_bytes_by_rank": col(2),
                "formula_state_bytes_per_rank": m.paper,
                "formula_padded_state_bytes_per_rank": m.formula_padded,
                "peak_bytes_by_rank": col(3),
                "peak_rss_bytes_by_rank": col(7),
                "scalar_bytes_per_step": {"grad_norm": col(4), "loss": col(5)},
                "loss": m.loss,
                "max_abs_param_diff_vs_ddp": diff.map(|_| d[0]),
                "ranks_identical": identical,
                "seconds_per_step": secs[0],
            }),
        );
    }
    let layout = oxccl_zero::Layout::new(&o.model.specs(), n)?;
    let elem = size_of::<P>() as u64;
    let ring = 2 * (n as u64 - 1) * (layout.padded() / n) as u64 * elem;
    Ok(json!({
        "nranks": n,
        "params": o.model.params(),
        "padded_params": layout.padded(),
        "param_type": P::NAME,
        "steps": o.steps,
        "batch": o.batch,
        "model": o.model,
        "ring_all_reduce_bytes_per_rank": ring,
        "stages": stages,
    }))
}
