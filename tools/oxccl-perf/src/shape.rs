//! What one row measures: nccl-tests' per-collective element counts
//! (`getCollByteCount`), the sizes a sweep visits, and the bandwidths
//! (`getBw`, doc/PERFORMANCE.md).

use oxccl::{CollKind, DataType};

/// Element counts of one call, as nccl-tests' `getCollByteCount` gives
/// them for a size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Elements of each rank's send buffer.
    pub send: usize,
    /// Elements of each rank's receive buffer (what the check examines).
    pub recv: usize,
    /// The `count` argument of the call (oxccl's `count` convention is
    /// the same as NCCL's).
    pub param: usize,
    /// In place, the input sits at `send_inplace × rank` in the receive buffer.
    pub send_inplace: usize,
    /// In place, the output sits at `recv_inplace × rank` in the receive buffer.
    pub recv_inplace: usize,
}

impl Shape {
    /// The shape of `kind` for a size of `bytes` on `nranks` ranks:
    /// `count = bytes / type size`, and the split collectives take
    /// `count / nranks` elements per rank (the count rounded down to a
    /// multiple of the rank count), as nccl-tests did until v2.13.12 and
    /// as the peer benchmarks (`tools/peers`) do, so that every size of a
    /// sweep that leaves an element per rank runs with it. (nccl-tests
    /// since v2.13.12 also rounds a rank's part down to 16 bytes, so below
    /// 16 bytes per rank it runs count 0.) A size that leaves no element
    /// per rank is still printed and run, with count 0.
    pub fn new(kind: CollKind, bytes: usize, dtype: DataType, nranks: usize) -> Shape {
        let count = bytes / dtype.size();
        let n = nranks.max(1);
        let base = count / n;
        let whole = |c| Shape { send: c, recv: c, param: c, send_inplace: 0, recv_inplace: 0 };
        match kind {
            CollKind::AllReduce | CollKind::Broadcast | CollKind::Reduce | CollKind::SendRecv => whole(count),
            CollKind::AllGather | CollKind::Gather => {
                Shape { send: base, recv: base * n, param: base, send_inplace: base, recv_inplace: 0 }
            }
            CollKind::ReduceScatter | CollKind::Scatter => {
                Shape { send: base * n, recv: base, param: base, send_inplace: 0, recv_inplace: base }
            }
            CollKind::AllToAll => {
                Shape { send: base * n, recv: base * n, param: base, send_inplace: 0, recv_inplace: 0 }
            }
        }
    }

    /// The `size` column: the larger of the send and receive buffers, in
    /// bytes.
    pub fn size_bytes(&self, dtype: DataType) -> usize {
        self.send.max(self.recv) * dtype.size()
    }
}

/// The sizes of a sweep: from `min` to `max` inclusive, times `factor`
/// when it is above 1, else plus `step`.
pub fn sweep(min: usize, max: usize, step: usize, factor: usize) -> impl Iterator<Item = usize> {
    let mut next = Some(min);
    std::iter::from_fn(move || {
        let s = next.filter(|&s| s <= max)?;
        let grown = if factor > 1 { s.checked_mul(factor) } else { s.checked_add(step) };
        next = grown.filter(|&g| g > s);
        Some(s)
    })
}

/// The warm-up sizes: `min`, doubling, up to `max` (nccl-tests warms up
/// every size with a factor of 2).
pub fn warmup_sizes(min: usize, max: usize) -> impl Iterator<Item = usize> {
    sweep(min.max(1), max, 0, 2).chain((min == 0).then_some(0))
}

/// Algorithm and bus bandwidth in GB/s for `bytes` (the `size` column)
/// moved in `seconds`: `algbw = size / time`, `busbw = algbw × factor`.
pub fn bandwidth(kind: CollKind, bytes: usize, seconds: f64, nranks: usize) -> (f64, f64) {
    let alg = bytes as f64 / 1.0e9 / seconds;
    (alg, alg * bus_factor(kind, nranks))
}

/// nccl-tests' bus-bandwidth factor (its `*GetBw` functions; the same as
/// [`CollKind::busbw_factor`]).
pub fn bus_factor(kind: CollKind, nranks: usize) -> f64 {
    kind.busbw_factor(nranks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_nccl_tests() {
        // 1 MiB of floats on 4 ranks.
        let s = Shape::new(CollKind::AllReduce, 1 << 20, DataType::Float32, 4);
        assert_eq!((s.send, s.recv, s.param, s.size_bytes(DataType::Float32)), (1 << 18, 1 << 18, 1 << 18, 1 << 20));
        let g = Shape::new(CollKind::AllGather, 1 << 20, DataType::Float32, 4);
        assert_eq!((g.send, g.recv, g.param, g.send_inplace), (1 << 16, 1 << 18, 1 << 16, 1 << 16));
        let r = Shape::new(CollKind::ReduceScatter, 1 << 20, DataType::Float32, 4);
        assert_eq!((r.send, r.recv, r.recv_inplace), (1 << 18, 1 << 16, 1 << 16));
        let a = Shape::new(CollKind::AllToAll, 1 << 20, DataType::Float32, 4);
        assert_eq!((a.send, a.recv, a.param), (1 << 18, 1 << 18, 1 << 16));
        // Per-rank counts round down to whole elements: 1000 B of int8 over
        // 3 ranks is 333 per rank; of doubles, 125 → 41.
        assert_eq!(Shape::new(CollKind::AllGather, 1000, DataType::Int8, 3).param, 333);
        assert_eq!(Shape::new(CollKind::Scatter, 1000, DataType::Float64, 3).param, 41);
        assert_eq!(Shape::new(CollKind::Gather, 1000, DataType::Float64, 3).size_bytes(DataType::Float64), 984);
        // Below 16 bytes per rank the split collectives still move what
        // there is: 8 B of floats on 2 ranks is one float each.
        for kind in [CollKind::AllGather, CollKind::ReduceScatter, CollKind::AllToAll, CollKind::Gather] {
            let s = Shape::new(kind, 8, DataType::Float32, 2);
            assert_eq!((s.param, s.size_bytes(DataType::Float32)), (1, 8), "{kind}");
        }
        let a = Shape::new(CollKind::AllToAll, 12, DataType::Int8, 4);
        assert_eq!((a.send, a.recv, a.param), (12, 12, 3));
        // Too small to split: zero, printed and run as nccl-tests does.
        assert_eq!(Shape::new(CollKind::AllGather, 8, DataType::Float32, 4).size_bytes(DataType::Float32), 0);
        assert_eq!(Shape::new(CollKind::Scatter, 2, DataType::Float64, 2).param, 0);
        // Sizes that are not whole elements round down.
        assert_eq!(Shape::new(CollKind::Broadcast, 10, DataType::Float64, 2).param, 1);
    }

    #[test]
    fn sweeps() {
        assert_eq!(sweep(8, 1 << 20, 0, 4).collect::<Vec<_>>(), [8, 32, 128, 512, 2048, 8192, 32768, 131072, 524288]);
        assert_eq!(sweep(100, 400, 100, 1).collect::<Vec<_>>(), [100, 200, 300, 400]);
        assert_eq!(sweep(5, 5, 0, 1).collect::<Vec<_>>(), [5]);
        assert_eq!(sweep(usize::MAX - 1, usize::MAX, 0, 2).count(), 1);
        assert_eq!(warmup_sizes(8, 64).collect::<Vec<_>>(), [8, 16, 32, 64]);
        assert_eq!(warmup_sizes(0, 0).collect::<Vec<_>>(), [0]);
    }

    #[test]
    fn bandwidths_follow_performance_md() {
        let (alg, bus) = bandwidth(CollKind::AllReduce, 1_000_000_000, 1.0, 4);
        assert_eq!((alg, bus), (1.0, 1.5));
        assert_eq!(bandwidth(CollKind::AllGather, 2_000_000_000, 1.0, 4), (2.0, 1.5));
        assert_eq!(bandwidth(CollKind::Broadcast, 3_000_000_000, 1.0, 8), (3.0, 3.0));
        for k in [CollKind::ReduceScatter, CollKind::AllToAll, CollKind::Gather, CollKind::Scatter] {
            assert_eq!(bus_factor(k, 8), 7.0 / 8.0, "{k}");
        }
        for k in [CollKind::Reduce, CollKind::SendRecv] {
            assert_eq!(bus_factor(k, 8), 1.0, "{k}");
        }
    }
}
