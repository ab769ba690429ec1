//! `-H gpu`: the benchmark's buffers on a GPU. Host mirrors of the same
//! size are filled and checked as on host; the bytes a call reads are
//! copied up before it and the bytes the check reads copied down after.

use oxccl::{CudaStream, DeviceBuf, Error, Result};
use oxccl_cuda::{DevMem, Device, Stream};

/// One rank's GPU, stream and buffers.
pub struct Gpu {
    /// The GPU.
    pub dev: Device,
    stream: Stream,
    send: DevMem,
    recv: DevMem,
}

fn err(e: impl std::fmt::Display) -> Error {
    Error::System(e.to_string())
}

impl Gpu {
    /// Buffers of `bytes` each on GPU `ordinal`, and a stream.
    pub fn new(ordinal: usize, bytes: usize) -> Result<Gpu> {
        let dev = Device::open(ordinal).map_err(err)?;
        let stream = dev.new_stream().map_err(err)?;
        let send = dev.alloc_zeroed(bytes.max(1)).map_err(err)?;
        let recv = dev.alloc_zeroed(bytes.max(1)).map_err(err)?;
        Ok(Gpu { dev, stream, send, recv })
    }

    /// The stream, as oxccl takes it.
    pub fn stream(&self) -> CudaStream {
        CudaStream::from_raw(self.stream.raw() as usize as u64)
    }

    /// Bytes `[at, at + len)` of the send (`false`) or receive buffer.
    pub fn buf(&self, recv: bool, at: usize, len: usize) -> DeviceBuf {
        let m = if recv { &self.recv } else { &self.send };
        DeviceBuf::new(m.addr() + at as u64, len)
    }

    /// Copies `host[at..at + len]` up into the same bytes of a buffer.
    pub fn upload(&self, recv: bool, host: &[u8], at: usize, len: usize) -> Result<()> {
        let m = if recv { &self.recv } else { &self.send };
        m.write(at, &host[at..at + len]).map_err(err)
    }

    /// Copies bytes `[at, at + len)` of the receive buffer down into `host`.
    pub fn download(&self, host: &mut [u8], at: usize, len: usize) -> Result<()> {
        self.recv.read(at, &mut host[at..at + len]).map_err(err)
    }
}

/// The GPU of a process's `local`-th rank: ranks fill GPUs in order,
/// `per_gpu` to a GPU; an error when there are too few.
pub fn ordinal(local: usize, per_gpu: usize, count: usize) -> std::result::Result<usize, String> {
    let d = local / per_gpu.max(1);
    if d < count {
        Ok(d)
    } else {
        Err(format!(
            "rank {local} of this process needs GPU {d}, but {count} GPU(s) are visible; \
             let ranks share a GPU with -P (ranks per GPU)"
        ))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ranks_fill_gpus_in_order() {
        assert_eq!(super::ordinal(3, 1, 8), Ok(3));
        assert_eq!(super::ordinal(3, 4, 1), Ok(0));
        assert_eq!(super::ordinal(5, 2, 4), Ok(2));
        assert!(super::ordinal(1, 1, 1).unwrap_err().contains("-P"));
    }
}
