//! Reading a pre-multiplication scalar of any element type from memory
//! (`ncclRedOpCreatePreMulSum`'s `scalar`).

use oxccl::half::{bf16, f16};
use oxccl::{DataType, Error, Result};
use oxccl_core::{F8E4M3, F8E5M2};

/// The value of one `dtype` element at `addr`: host memory is read
/// directly, device memory copied from the GPU.
pub fn read(addr: usize, dtype: DataType) -> Result<f64> {
    if addr == 0 {
        return Err(Error::invalid("the scalar is NULL"));
    }
    let mut b = [0u8; 8];
    let n = dtype.size();
    #[cfg(feature = "cuda")]
    if oxccl_cuda::is_device_memory(addr as u64) {
        oxccl_cuda::read_device(addr as u64, &mut b[..n])
            .map_err(|e| Error::invalid(format!("cannot read the scalar at {addr:#x} from the GPU: {e}")))?;
        return Ok(decode(&b[..n], dtype));
    }
    // SAFETY: the caller promises a readable element of `dtype` at a non-null
    // `addr` (NCCL's contract for the scalar); `n` <= 8 and the read is
    // unaligned-safe.
    unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, b.as_mut_ptr(), n) };
    Ok(decode(&b[..n], dtype))
}

/// The value of one element of `dtype` in `b` (native byte order).
pub fn decode(b: &[u8], dtype: DataType) -> f64 {
    let a = |n: usize| -> [u8; 8] {
        let mut x = [0u8; 8];
        x[..n].copy_from_slice(&b[..n]);
        x
    };
    let x = a(dtype.size());
    match dtype {
        DataType::Int8 => i8::from_ne_bytes([x[0]]) as f64,
        DataType::Uint8 => x[0] as f64,
        DataType::Int32 => i32::from_ne_bytes([x[0], x[1], x[2], x[3]]) as f64,
        DataType::Uint32 => u32::from_ne_bytes([x[0], x[1], x[2], x[3]]) as f64,
        DataType::Int64 => i64::from_ne_bytes(x) as f64,
        DataType::Uint64 => u64::from_ne_bytes(x) as f64,
        DataType::Float16 => f16::from_ne_bytes([x[0], x[1]]).to_f64(),
        DataType::Bfloat16 => bf16::from_ne_bytes([x[0], x[1]]).to_f64(),
        DataType::Float32 => f32::from_ne_bytes([x[0], x[1], x[2], x[3]]) as f64,
        DataType::Float64 => f64::from_ne_bytes(x),
        DataType::Float8E4M3 => bytemuck::cast::<u8, F8E4M3>(x[0]).to_f64(),
        DataType::Float8E5M2 => bytemuck::cast::<u8, F8E5M2>(x[0]).to_f64(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_decodes() {
        assert_eq!(decode(&(-3i8).to_ne_bytes(), DataType::Int8), -3.0);
        assert_eq!(decode(&7u64.to_ne_bytes(), DataType::Uint64), 7.0);
        assert_eq!(decode(&f16::from_f64(0.5).to_ne_bytes(), DataType::Float16), 0.5);
        assert_eq!(decode(&bf16::from_f64(-2.0).to_ne_bytes(), DataType::Bfloat16), -2.0);
        assert_eq!(decode(&1.25f32.to_ne_bytes(), DataType::Float32), 1.25);
        assert_eq!(decode(&[F8E4M3::from_f64(1.5).to_bits()], DataType::Float8E4M3), 1.5);
        assert_eq!(decode(&[F8E5M2::from_f64(-4.0).to_bits()], DataType::Float8E5M2), -4.0);
        let v = 0.75f64;
        assert_eq!(read(&v as *const f64 as usize, DataType::Float64).unwrap(), 0.75);
        assert!(read(0, DataType::Float64).unwrap_err().to_string().contains("NULL"));
    }
}
