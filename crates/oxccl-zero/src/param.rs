//! The element types parameters and gradients travel in.

use oxccl::Element;
use oxccl::half::{bf16, f16};

/// A parameter or gradient element: `f32`, `bf16` or `f16`. Master
/// weights and moments are always `f32`.
pub trait Param: Element + Default + Send + Sync + 'static {
    /// Widens to `f32` (exact).
    fn to_f32(self) -> f32;
    /// Narrows from `f32`, to nearest even.
    fn from_f32(x: f32) -> Self;
    /// The name used in checkpoints and tables.
    const NAME: &'static str;
}

impl Param for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(x: f32) -> f32 {
        x
    }
    const NAME: &'static str = "f32";
}

impl Param for bf16 {
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(x: f32) -> bf16 {
        bf16::from_f32(x)
    }
    const NAME: &'static str = "bf16";
}

impl Param for f16 {
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(x: f32) -> f16 {
        f16::from_f32(x)
    }
    const NAME: &'static str = "f16";
}
