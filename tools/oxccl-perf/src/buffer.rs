//! Benchmark buffers: allocated once, zeroed, 64-byte aligned.

/// A byte buffer whose first byte is 64-byte aligned.
pub struct Buffer {
    raw: Vec<u64>,
    off: usize,
    len: usize,
}

impl Buffer {
    /// `len` zero bytes.
    pub fn new(len: usize) -> Buffer {
        let raw = vec![0u64; (len + 64).div_ceil(8)];
        let off = raw.as_ptr().cast::<u8>().align_offset(64);
        assert!(off < 64, "a u64 allocation reaches 64-byte alignment within 64 bytes");
        Buffer { raw, off, len }
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.raw)[self.off..self.off + self.len]
    }

    /// The bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.raw)[self.off..self.off + self.len]
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn aligned_and_sized() {
        for len in [0, 1, 63, 64, 1000, 1 << 20] {
            let mut b = super::Buffer::new(len);
            assert_eq!(b.bytes().len(), len);
            assert_eq!(b.bytes().as_ptr() as usize % 64, 0);
            b.bytes_mut().fill(7);
            assert!(b.bytes().iter().all(|&x| x == 7));
        }
    }
}
