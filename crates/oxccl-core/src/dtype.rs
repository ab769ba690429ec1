//! Element types, numbered and named as NCCL and nccl-tests number and name them.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The element type of a collective's buffers.
///
/// The discriminants are NCCL's `ncclDataType_t` values (`ncclInt8` = 0 …
/// `ncclFloat8e5m2` = 11), so the C ABI converts with [`DataType::from_nccl`]
/// and `as i32`. [`fmt::Display`] prints the name nccl-tests prints in its
/// `type` column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(i32)]
pub enum DataType {
    /// `int8_t`.
    Int8 = 0,
    /// `uint8_t`.
    Uint8 = 1,
    /// `int32_t`.
    Int32 = 2,
    /// `uint32_t`.
    Uint32 = 3,
    /// `int64_t`.
    Int64 = 4,
    /// `uint64_t`.
    Uint64 = 5,
    /// IEEE 754 binary16 (`half`).
    Float16 = 6,
    /// IEEE 754 binary32 (`float`).
    Float32 = 7,
    /// IEEE 754 binary64 (`double`).
    Float64 = 8,
    /// bfloat16: the upper half of a binary32.
    Bfloat16 = 9,
    /// OCP FP8 E4M3 ("FN": no infinities, one NaN pattern per sign, max 448).
    Float8E4M3 = 10,
    /// OCP FP8 E5M2 (IEEE-like: infinities and NaNs, max 57344).
    Float8E5M2 = 11,
}

impl DataType {
    /// Every data type, in NCCL's order.
    pub const ALL: [DataType; 12] = [
        DataType::Int8,
        DataType::Uint8,
        DataType::Int32,
        DataType::Uint32,
        DataType::Int64,
        DataType::Uint64,
        DataType::Float16,
        DataType::Float32,
        DataType::Float64,
        DataType::Bfloat16,
        DataType::Float8E4M3,
        DataType::Float8E5M2,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DataType::Int8 | DataType::Uint8 | DataType::Float8E4M3 | DataType::Float8E5M2 => 1,
            DataType::Float16 | DataType::Bfloat16 => 2,
            DataType::Int32 | DataType::Uint32 | DataType::Float32 => 4,
            DataType::Int64 | DataType::Uint64 | DataType::Float64 => 8,
        }
    }

    /// The name nccl-tests prints for this type (`int8` … `half`, `float`,
    /// `double`, `bfloat16`, `f8e4m3`, `f8e5m2`).
    pub const fn name(self) -> &'static str {
        match self {
            DataType::Int8 => "int8",
            DataType::Uint8 => "uint8",
            DataType::Int32 => "int32",
            DataType::Uint32 => "uint32",
            DataType::Int64 => "int64",
            DataType::Uint64 => "uint64",
            DataType::Float16 => "half",
            DataType::Float32 => "float",
            DataType::Float64 => "double",
            DataType::Bfloat16 => "bfloat16",
            DataType::Float8E4M3 => "f8e4m3",
            DataType::Float8E5M2 => "f8e5m2",
        }
    }

    /// NCCL's `ncclDataType_t` value.
    pub const fn to_nccl(self) -> i32 {
        self as i32
    }

    /// The type for an `ncclDataType_t` value; NCCL's aliases (`ncclChar` = 0,
    /// `ncclInt` = 2, `ncclHalf` = 6, `ncclFloat` = 7, `ncclDouble` = 8) are the
    /// same numbers.
    pub fn from_nccl(value: i32) -> Result<DataType> {
        DataType::ALL
            .get(usize::try_from(value).unwrap_or(usize::MAX))
            .copied()
            .ok_or_else(|| Error::invalid(format!("data type {value} is not an ncclDataType_t (0..=11)")))
    }

    /// Floating-point types (reductions run in floating point, `avg` divides).
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::Float16
                | DataType::Float32
                | DataType::Float64
                | DataType::Bfloat16
                | DataType::Float8E4M3
                | DataType::Float8E5M2
        )
    }

    /// Signed integer types.
    pub const fn is_signed_int(self) -> bool {
        matches!(self, DataType::Int8 | DataType::Int32 | DataType::Int64)
    }

    /// Number of bytes `count` elements occupy, or an error naming the
    /// overflow.
    pub fn bytes(self, count: usize) -> Result<usize> {
        count
            .checked_mul(self.size())
            .ok_or_else(|| Error::invalid(format!("{count} elements of {self} overflow the address space")))
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DataType {
    type Err = Error;

    /// Accepts nccl-tests' names and the common aliases people type
    /// (`float32`, `f32`, `fp16`, `bf16`, `int`, `char`, `e4m3` …).
    fn from_str(s: &str) -> Result<DataType> {
        let t = match s.to_ascii_lowercase().as_str() {
            "int8" | "i8" | "char" => DataType::Int8,
            "uint8" | "u8" => DataType::Uint8,
            "int32" | "i32" | "int" => DataType::Int32,
            "uint32" | "u32" => DataType::Uint32,
            "int64" | "i64" => DataType::Int64,
            "uint64" | "u64" => DataType::Uint64,
            "half" | "float16" | "f16" | "fp16" => DataType::Float16,
            "float" | "float32" | "f32" | "fp32" => DataType::Float32,
            "double" | "float64" | "f64" | "fp64" => DataType::Float64,
            "bfloat16" | "bf16" => DataType::Bfloat16,
            "f8e4m3" | "fp8e4m3" | "float8e4m3" | "e4m3" => DataType::Float8E4M3,
            "f8e5m2" | "fp8e5m2" | "float8e5m2" | "e5m2" => DataType::Float8E5M2,
            _ => {
                return Err(Error::invalid(format!(
                    "unknown data type {s:?}; expected one of int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 f8e4m3 f8e5m2"
                )));
            }
        };
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_numbers_names_and_sizes() {
        let names = "int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 f8e4m3 f8e5m2";
        let sizes = [1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1];
        for (i, (name, t)) in names.split(' ').zip(DataType::ALL).enumerate() {
            assert_eq!(t.to_nccl(), i as i32);
            assert_eq!(DataType::from_nccl(i as i32).unwrap(), t);
            assert_eq!(t.to_string(), name);
            assert_eq!(name.parse::<DataType>().unwrap(), t);
            assert_eq!(t.size(), sizes[i]);
        }
        assert!(DataType::from_nccl(12).unwrap_err().to_string().contains("12"));
        assert!(DataType::from_nccl(-1).is_err());
        assert!("float128".parse::<DataType>().unwrap_err().to_string().contains("float128"));
        assert!(DataType::Float64.bytes(usize::MAX / 4).is_err());
    }
}
