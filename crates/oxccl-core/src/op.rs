//! Reduction operators, numbered and named as NCCL and nccl-tests do.

use crate::dtype::DataType;
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A reduction operator.
///
/// [`ReduceOp::to_nccl`] gives NCCL's `ncclRedOp_t` value for the built-in
/// operators (`ncclSum` = 0, `ncclProd` = 1, `ncclMax` = 2, `ncclMin` = 3,
/// `ncclAvg` = 4). `PreMulSum` is the operator `ncclRedOpCreatePreMulSum`
/// creates: every rank multiplies its input by its own scalar, then the
/// products are summed.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReduceOp {
    /// Sum (integers wrap).
    Sum,
    /// Product (integers wrap).
    Prod,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
    /// Sum divided by the number of ranks (integers: truncating division).
    Avg,
    /// Sum of `scalar × input` where each rank supplies its own scalar.
    PreMulSum {
        /// This rank's multiplier, as f64 (converted to the element type
        /// when applied).
        scalar: f64,
    },
}

impl ReduceOp {
    /// The built-in operators, in NCCL's order, then `PreMulSum` with scalar 1.
    pub const ALL: [ReduceOp; 6] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Avg,
        ReduceOp::PreMulSum { scalar: 1.0 },
    ];

    /// The name nccl-tests prints in its `redop` column.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Avg => "avg",
            ReduceOp::PreMulSum { .. } => "mulsum",
        }
    }

    /// NCCL's `ncclRedOp_t` value; `PreMulSum` has none of its own (NCCL hands
    /// out dynamic values from `ncclNumOps` = 5 on), so it reports 5.
    pub const fn to_nccl(self) -> i32 {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Prod => 1,
            ReduceOp::Max => 2,
            ReduceOp::Min => 3,
            ReduceOp::Avg => 4,
            ReduceOp::PreMulSum { .. } => 5,
        }
    }

    /// The built-in operator for an `ncclRedOp_t` value.
    pub fn from_nccl(value: i32) -> Result<ReduceOp> {
        Ok(match value {
            0 => ReduceOp::Sum,
            1 => ReduceOp::Prod,
            2 => ReduceOp::Max,
            3 => ReduceOp::Min,
            4 => ReduceOp::Avg,
            _ => {
                return Err(Error::invalid(format!("reduce op {value} is not a built-in ncclRedOp_t (0..=4)")));
            }
        })
    }

    /// Whether this operator is defined for `dtype`. Every operator is
    /// defined for every type today; the check exists so that callers ask
    /// (and the error names both) rather than assume.
    pub fn check(self, dtype: DataType) -> Result<()> {
        if let ReduceOp::PreMulSum { scalar } = self
            && !scalar.is_finite()
        {
            return Err(Error::invalid(format!("premulsum scalar {scalar} for {dtype} is not finite")));
        }
        Ok(())
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReduceOp {
    type Err = Error;

    /// Parses nccl-tests' names (`sum prod min max avg mulsum`); `mulsum`
    /// gets scalar 1.
    fn from_str(s: &str) -> Result<ReduceOp> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "sum" => ReduceOp::Sum,
            "prod" => ReduceOp::Prod,
            "max" => ReduceOp::Max,
            "min" => ReduceOp::Min,
            "avg" => ReduceOp::Avg,
            "mulsum" | "premulsum" => ReduceOp::PreMulSum { scalar: 1.0 },
            _ => {
                return Err(Error::invalid(format!(
                    "unknown reduce op {s:?}; expected one of sum prod max min avg mulsum"
                )));
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_numbers_and_names() {
        for (i, op) in ReduceOp::ALL.iter().take(5).enumerate() {
            assert_eq!(op.to_nccl(), i as i32);
            assert_eq!(ReduceOp::from_nccl(i as i32).unwrap(), *op);
            assert_eq!(op.name().parse::<ReduceOp>().unwrap(), *op);
        }
        assert_eq!("mulsum".parse::<ReduceOp>().unwrap().name(), "mulsum");
        assert!(ReduceOp::from_nccl(5).unwrap_err().to_string().contains('5'));
        assert!("xor".parse::<ReduceOp>().is_err());
        let bad = ReduceOp::PreMulSum { scalar: f64::NAN };
        assert!(bad.check(DataType::Float32).unwrap_err().to_string().contains("float"));
    }
}
