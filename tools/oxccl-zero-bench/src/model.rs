//! A small GPT-style character model (token and position embeddings,
//! pre-norm transformer blocks, a final norm and an output projection)
//! whose forward and backward come from candle, one layer at a time: the
//! forward keeps only each layer's input; the backward recomputes a layer's
//! forward from that input with its parameters as variables and lets
//! candle's autograd give the parameters' and the input's gradients. So a
//! layer's parameters are needed only while it runs, which is what ZeRO-3
//! gathers and frees.

use candle_core::{D, DType, Device, Tensor, Var};
use candle_nn::ops::{layer_norm_slow, softmax};
use oxccl_zero::{LayerSpec, Param, Tensor as Named, Zero};

/// The model's shape.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct ModelConfig {
    /// Characters in the vocabulary.
    pub vocab: usize,
    /// Width of the residual stream.
    pub dim: usize,
    /// Transformer blocks.
    pub blocks: usize,
    /// Attention heads (dividing `dim`).
    pub heads: usize,
    /// Context length.
    pub ctx: usize,
}

/// Boxed errors of the bench.
pub type Res<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// A layer's tensors: name and shape.
type Shapes = Vec<(String, Vec<usize>)>;

impl ModelConfig {
    /// Layers: the embeddings, the blocks, the head.
    pub fn layers(&self) -> usize {
        self.blocks + 2
    }

    /// Layer `l`'s tensors, in canonical order.
    pub fn shapes(&self, l: usize) -> Shapes {
        let (d, v) = (self.dim, self.vocab);
        let t = |n: String, s: &[usize]| (n, s.to_vec());
        if l == 0 {
            return vec![t("embed.tokens".into(), &[v, d]), t("embed.positions".into(), &[self.ctx, d])];
        }
        if l == self.blocks + 1 {
            return vec![t("head.norm.g".into(), &[d]), t("head.norm.b".into(), &[d]), t("head.out".into(), &[d, v])];
        }
        let b = format!("block{}", l - 1);
        vec![
            t(format!("{b}.norm1.g"), &[d]),
            t(format!("{b}.norm1.b"), &[d]),
            t(format!("{b}.attn.qkv.w"), &[d, 3 * d]),
            t(format!("{b}.attn.qkv.b"), &[3 * d]),
            t(format!("{b}.attn.proj.w"), &[d, d]),
            t(format!("{b}.attn.proj.b"), &[d]),
            t(format!("{b}.norm2.g"), &[d]),
            t(format!("{b}.norm2.b"), &[d]),
            t(format!("{b}.mlp.fc.w"), &[d, 4 * d]),
            t(format!("{b}.mlp.fc.b"), &[4 * d]),
            t(format!("{b}.mlp.proj.w"), &[4 * d, d]),
            t(format!("{b}.mlp.proj.b"), &[d]),
        ]
    }

    /// The layers as the optimizer sees them.
    pub fn specs(&self) -> Vec<LayerSpec> {
        (0..self.layers())
            .map(|l| LayerSpec {
                name: match l {
                    0 => "embed".into(),
                    l if l == self.blocks + 1 => "head".into(),
                    l => format!("block{}", l - 1),
                },
                tensors: self.shapes(l).into_iter().map(|(n, s)| Named::new(n, s.iter().product())).collect(),
            })
            .collect()
    }

    /// Parameters in all.
    pub fn params(&self) -> usize {
        self.specs().iter().flat_map(|l| &l.tensors).map(|t| t.numel).sum()
    }

    /// Initial parameters from `seed`, canonical order: weights normal
    /// with σ = 0.02 (projections into the residual stream scaled by
    /// 1/√(2·blocks), as GPT-2 does), norms' gains 1, biases 0.
    pub fn init(&self, seed: u64) -> Vec<f32> {
        let mut rng = SplitMix(seed);
        let mut out = Vec::with_capacity(self.params());
        for l in 0..self.layers() {
            for (name, shape) in self.shapes(l) {
                let n: usize = shape.iter().product();
                let sigma = if name.ends_with("proj.w") { 0.02 / (2.0 * self.blocks as f32).sqrt() } else { 0.02 };
                if name.ends_with(".g") {
                    out.extend(std::iter::repeat_n(1.0, n));
                } else if shape.len() == 1 {
                    out.extend(std::iter::repeat_n(0.0, n));
                } else {
                    out.extend((0..n).map(|_| rng.normal() * sigma));
                }
            }
        }
        out
    }
}

/// splitmix64: a seeded, platform-independent stream (the data order and
/// the initial weights must be the same on every rank and every run).
pub struct SplitMix(pub u64);

impl SplitMix {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1).
    fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 + 0.5) / (1u64 << 24) as f32
    }

    /// Standard normal (Box–Muller).
    fn normal(&mut self) -> f32 {
        let (a, b) = (self.uniform(), self.uniform());
        (-2.0 * a.ln()).sqrt() * (2.0 * std::f32::consts::PI * b).cos()
    }
}

/// One layer's computation. `x` is token ids `(B, T)` for the embeddings,
/// else the hidden state `(B, T, dim)`; the head returns the mean
/// cross-entropy against `targets`.
fn forward(cfg: &ModelConfig, l: usize, p: &[Tensor], x: &Tensor, targets: &Tensor) -> Res<Tensor> {
    let d = cfg.dim;
    let linear = |x: &Tensor, w: &Tensor, b: &Tensor| -> Res<Tensor> { Ok(x.matmul(w)?.broadcast_add(b)?) };
    if l == 0 {
        let (b, t) = x.dims2()?;
        let tok = p[0].index_select(&x.flatten_all()?, 0)?.reshape((b, t, d))?;
        return Ok(tok.broadcast_add(&p[1].narrow(0, 0, t)?)?);
    }
    let (b, t, _) = x.dims3()?;
    if l == cfg.blocks + 1 {
        let h = layer_norm_slow(x, &p[0], &p[1], 1e-5)?.reshape((b * t, d))?;
        let logits = h.matmul(&p[2])?;
        return Ok(candle_nn::loss::cross_entropy(&logits, &targets.flatten_all()?)?);
    }
    let (nh, hd) = (cfg.heads, d / cfg.heads);
    let h = layer_norm_slow(x, &p[0], &p[1], 1e-5)?.reshape((b * t, d))?;
    let qkv = linear(&h, &p[2], &p[3])?.reshape((b, t, 3, nh, hd))?;
    let part = |i: usize| -> Res<Tensor> { Ok(qkv.narrow(2, i, 1)?.squeeze(2)?.transpose(1, 2)?.contiguous()?) };
    let (q, k, v) = (part(0)?, part(1)?, part(2)?);
    let att = (q.matmul(&k.t()?.contiguous()?)? * (1.0 / (hd as f64).sqrt()))?;
    let att = softmax(&att.broadcast_add(&causal_mask(t, x.device())?)?, D::Minus1)?;
    let y = att.matmul(&v)?.transpose(1, 2)?.contiguous()?.reshape((b * t, d))?;
    let x = (x + linear(&y, &p[4], &p[5])?.reshape((b, t, d))?)?;
    let h = layer_norm_slow(&x, &p[6], &p[7], 1e-5)?.reshape((b * t, d))?;
    let h = linear(&linear(&h, &p[8], &p[9])?.gelu()?, &p[10], &p[11])?;
    Ok((x + h.reshape((b, t, d))?)?)
}

fn causal_mask(t: usize, dev: &Device) -> Res<Tensor> {
    let m: Vec<f32> = (0..t * t).map(|i| if i % t > i / t { -1e9 } else { 0.0 }).collect();
    Ok(Tensor::from_vec(m, (t, t), dev)?)
}

/// Layer `l`'s parameters as tensors, from the optimizer's flat slice.
fn tensors<P: Param>(cfg: &ModelConfig, l: usize, flat: &[P]) -> Res<Vec<Tensor>> {
    let mut at = 0;
    cfg.shapes(l)
        .into_iter()
        .map(|(_, s)| {
            let n: usize = s.iter().product();
            let v: Vec<f32> = flat[at..at + n].iter().map(|x| x.to_f32()).collect();
            at += n;
            Ok(Tensor::from_vec(v, s, &Device::Cpu)?)
        })
        .collect()
}

/// One training step's forward and backward, driving `z` as a model
/// should (gather before use, free after, gradients handed over layer by
/// layer as the backward produces them, in reverse layer order). Returns
/// this rank's loss; the caller then calls [`Zero::step`].
pub fn forward_backward<P: Param>(cfg: &ModelConfig, z: &mut Zero<'_, P>, ids: &Tensor, targets: &Tensor) -> Res<f32> {
    let nl = cfg.layers();
    let mut inputs = Vec::with_capacity(nl);
    let mut x = ids.clone();
    z.prefetch(0)?;
    let mut loss = 0.0;
    for l in 0..nl {
        if l + 1 < nl {
            z.prefetch(l + 1)?;
        }
        let p = tensors(cfg, l, z.params(l)?)?;
        let y = forward(cfg, l, &p, &x, targets)?;
        z.release(l)?;
        inputs.push(std::mem::replace(&mut x, y));
    }
    loss += x.to_scalar::<f32>()?;
    let mut grad_out: Option<Tensor> = None;
    for l in (0..nl).rev() {
        let p = tensors(cfg, l, z.params(l)?)?;
        if l > 0 {
            z.prefetch(l - 1)?;
        }
        let vars: Vec<Var> = p.iter().map(Var::from_tensor).collect::<Result<_, _>>()?;
        let ps: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
        let input = if l > 0 { Some(Var::from_tensor(&inputs[l])?) } else { None };
        let x = input.as_ref().map(|v| v.as_tensor().clone()).unwrap_or_else(|| inputs[0].clone());
        let out = forward(cfg, l, &ps, &x, targets)?;
        let objective = match &grad_out {
            None => out,
            Some(g) => (out * g)?.sum_all()?,
        };
        let grads = objective.backward()?;
        z.release(l)?;
        let mut flat = Vec::with_capacity(z.layout().buckets[l].numel);
        for v in &ps {
            match grads.get(v) {
                Some(g) => flat.extend(g.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?),
                None => flat.extend(std::iter::repeat_n(0.0, v.elem_count())),
            }
        }
        z.reduce_grads(l, &flat)?;
        grad_out = match &input {
            Some(v) => Some(grads.get(v.as_tensor()).ok_or("no gradient for a layer's input")?.clone()),
            None => None,
        };
    }
    Ok(loss)
}
