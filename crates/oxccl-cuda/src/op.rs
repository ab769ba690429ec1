//! [`KernelOp`]: the operator a kernel module is built for.

use oxccl_core::ReduceOp;
use std::fmt;

/// The operator a module is built for (`OXCCL_OP`). `Avg` and `PreMulSum`
/// run the `Sum` module with flags in the arguments ([`KernelOp::of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum KernelOp {
    /// Sum (integers wrap); also `Avg` and `PreMulSum`.
    Sum = 0,
    /// Product (integers wrap).
    Prod = 1,
    /// Maximum (`fmaxf` semantics on floats).
    Max = 2,
    /// Minimum (`fminf` semantics on floats).
    Min = 3,
}

impl KernelOp {
    /// Every operator, in `OXCCL_OP` order.
    pub const ALL: [KernelOp; 4] = [KernelOp::Sum, KernelOp::Prod, KernelOp::Max, KernelOp::Min];

    /// The module that runs `op`.
    pub fn of(op: ReduceOp) -> KernelOp {
        match op {
            ReduceOp::Prod => KernelOp::Prod,
            ReduceOp::Max => KernelOp::Max,
            ReduceOp::Min => KernelOp::Min,
            ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PreMulSum { .. } => KernelOp::Sum,
        }
    }

    /// `sum`, `prod`, `max` or `min`.
    pub const fn name(self) -> &'static str {
        match self {
            KernelOp::Sum => "sum",
            KernelOp::Prod => "prod",
            KernelOp::Max => "max",
            KernelOp::Min => "min",
        }
    }
}

impl fmt::Display for KernelOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_op_of_reduce_op() {
        assert_eq!(KernelOp::of(ReduceOp::Avg), KernelOp::Sum);
        assert_eq!(KernelOp::of(ReduceOp::PreMulSum { scalar: 2.0 }), KernelOp::Sum);
        assert_eq!(KernelOp::of(ReduceOp::Min), KernelOp::Min);
        assert_eq!(KernelOp::ALL.map(|o| o as u32), [0, 1, 2, 3]);
        assert_eq!(KernelOp::Prod.to_string(), "prod");
    }
}
