//! AdamW on fp32 master weights, elementwise (so a slice updated on its own
//! gives the same bits as the same elements updated in the whole).

use crate::param::Param;
use serde::{Deserialize, Serialize};

/// AdamW's hyperparameters, and clipping.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdamW {
    /// Learning rate.
    pub lr: f32,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Added to the denominator.
    pub eps: f32,
    /// Decoupled weight decay.
    pub weight_decay: f32,
    /// Clip gradients to this global L2 norm (none when `None`).
    pub max_grad_norm: Option<f32>,
}

impl Default for AdamW {
    fn default() -> AdamW {
        AdamW { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0, max_grad_norm: Some(1.0) }
    }
}

impl AdamW {
    /// The factor that clips a gradient of global norm `norm` (1 when no
    /// clipping applies).
    pub fn clip_factor(&self, norm: f64) -> f32 {
        match self.max_grad_norm {
            Some(max) if norm > f64::from(max) => (f64::from(max) / (norm + 1e-6)) as f32,
            _ => 1.0,
        }
    }

    /// Step `step` (counted from 1) over equal-length slices: the gradient
    /// is `grad × scale` (scale folds in averaging and clipping); writes
    /// the new working parameters into `out`.
    // AdamW's state is three slices beside the gradient and the output, each
    // borrowed on its own (a struct of them would be built and taken apart
    // at every call for nothing).
    #[allow(clippy::too_many_arguments)]
    pub fn update<P: Param>(
        &self,
        step: u64,
        master: &mut [f32],
        m: &mut [f32],
        v: &mut [f32],
        grad: &[P],
        scale: f32,
        out: &mut [P],
    ) {
        let n = master.len();
        assert!(m.len() == n && v.len() == n && grad.len() == n && out.len() == n, "AdamW slices differ in length");
        let t = step.min(i32::MAX as u64) as i32;
        let bc1 = 1.0 - self.beta1.powi(t);
        let bc2 = 1.0 - self.beta2.powi(t);
        for i in 0..n {
            let g = grad[i].to_f32() * scale;
            let mut w = master[i];
            w -= self.lr * self.weight_decay * w;
            m[i] = self.beta1 * m[i] + (1.0 - self.beta1) * g;
            v[i] = self.beta2 * v[i] + (1.0 - self.beta2) * g * g;
            let mhat = m[i] / bc1;
            let vhat = v[i] / bc2;
            w -= self.lr * mhat / (vhat.sqrt() + self.eps);
            master[i] = w;
            out[i] = P::from_f32(w);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_step_moves_by_lr_against_the_gradient() {
        let a = AdamW { weight_decay: 0.0, ..AdamW::default() };
        let (mut w, mut m, mut v, mut out) = (vec![1.0f32, 1.0], vec![0.0; 2], vec![0.0; 2], vec![0.0f32; 2]);
        a.update(1, &mut w, &mut m, &mut v, &[2.0f32, -3.0], 1.0, &mut out);
        assert!((w[0] - (1.0 - 1e-3)).abs() < 1e-6, "{w:?}");
        assert!((w[1] - (1.0 + 1e-3)).abs() < 1e-6, "{w:?}");
        assert_eq!(out, w);
    }

    #[test]
    fn clipping() {
        let a = AdamW { max_grad_norm: Some(1.0), ..AdamW::default() };
        assert_eq!(a.clip_factor(0.5), 1.0);
        assert!((a.clip_factor(4.0) - 0.25).abs() < 1e-6);
        assert_eq!(AdamW { max_grad_norm: None, ..a }.clip_factor(1e9), 1.0);
    }
}
