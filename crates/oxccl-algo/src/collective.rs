//! What a collective computes: buffer sizes, in-place layouts and, for the
//! verifier, the contributions every output element must end up holding.

use oxccl_core::{DataType, Error, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The kinds of collective operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CollKind {
    /// Every rank ends with the reduction of all inputs.
    AllReduce,
    /// Rank `r` ends with block `r` of the reduction.
    ReduceScatter,
    /// Every rank ends with all inputs, concatenated in rank order.
    AllGather,
    /// Rank `r` ends with block `r` of every rank's input, in rank order.
    #[serde(rename = "alltoall", alias = "all_to_all")]
    AllToAll,
    /// Every rank ends with the root's input.
    Broadcast,
    /// The root ends with the reduction of all inputs.
    Reduce,
    /// The root ends with all inputs, concatenated in rank order.
    Gather,
    /// Rank `r` ends with block `r` of the root's input.
    Scatter,
    /// Rank `r` sends its input to `r + 1` and receives from `r - 1` (mod
    /// n), as nccl-tests' `sendrecv_perf` does.
    #[serde(rename = "sendrecv", alias = "send_recv")]
    SendRecv,
}

impl CollKind {
    /// Every kind.
    pub const ALL: [CollKind; 9] = [
        CollKind::AllReduce,
        CollKind::ReduceScatter,
        CollKind::AllGather,
        CollKind::AllToAll,
        CollKind::Broadcast,
        CollKind::Reduce,
        CollKind::Gather,
        CollKind::Scatter,
        CollKind::SendRecv,
    ];

    /// nccl-tests' name stem (`all_reduce`, `alltoall`, …).
    pub const fn name(self) -> &'static str {
        match self {
            CollKind::AllReduce => "all_reduce",
            CollKind::ReduceScatter => "reduce_scatter",
            CollKind::AllGather => "all_gather",
            CollKind::AllToAll => "alltoall",
            CollKind::Broadcast => "broadcast",
            CollKind::Reduce => "reduce",
            CollKind::Gather => "gather",
            CollKind::Scatter => "scatter",
            CollKind::SendRecv => "sendrecv",
        }
    }

    /// Whether the collective has a root.
    pub const fn is_rooted(self) -> bool {
        matches!(self, CollKind::Broadcast | CollKind::Reduce | CollKind::Gather | CollKind::Scatter)
    }

    /// Whether the collective reduces (takes a reduction operator).
    pub const fn reduces(self) -> bool {
        matches!(self, CollKind::AllReduce | CollKind::ReduceScatter | CollKind::Reduce)
    }

    /// nccl-tests' bus-bandwidth factor for `n` ranks (its PERFORMANCE.md):
    /// all-reduce `2(n-1)/n`; reduce-scatter, all-gather, all-to-all,
    /// gather, scatter `(n-1)/n`; broadcast, reduce, send/recv 1.
    pub fn busbw_factor(self, n: usize) -> f64 {
        let n = n.max(1) as f64;
        match self {
            CollKind::AllReduce => 2.0 * (n - 1.0) / n,
            CollKind::ReduceScatter
            | CollKind::AllGather
            | CollKind::AllToAll
            | CollKind::Gather
            | CollKind::Scatter => (n - 1.0) / n,
            CollKind::Broadcast | CollKind::Reduce | CollKind::SendRecv => 1.0,
        }
    }
}

impl fmt::Display for CollKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CollKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<CollKind> {
        let key: String = s.chars().filter(|c| *c != '_' && *c != '-').collect::<String>().to_ascii_lowercase();
        let key = key.strip_suffix("perf").unwrap_or(&key);
        CollKind::ALL
            .into_iter()
            .find(|k| k.name().replace('_', "") == key)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "unknown collective {s:?}; expected one of all_reduce reduce_scatter all_gather alltoall broadcast reduce gather scatter sendrecv"
                ))
            })
    }
}

/// One collective call, as far as an algorithm cares.
///
/// `count` follows NCCL's conventions: elements per rank buffer for
/// all-reduce, broadcast and reduce; the *receive* count per rank for
/// reduce-scatter and scatter; the *send* count per rank for all-gather and
/// gather; elements per peer block for all-to-all; the message for
/// send/recv.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Collective {
    /// What is computed.
    pub kind: CollKind,
    /// Number of ranks.
    pub nranks: usize,
    /// Element count (see the type's doc).
    pub count: usize,
    /// Root rank (rooted collectives; 0 otherwise).
    #[serde(default)]
    pub root: usize,
    /// Element type (for byte counts).
    pub dtype: DataType,
}

/// Which contributions an output range must hold: element `k` of the range
/// holds `input_r[base + k]` of every rank `r` in `ranks`, each once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expect {
    /// First output element.
    pub start: usize,
    /// Number of elements.
    pub len: usize,
    /// Contributing ranks.
    pub ranks: Vec<usize>,
    /// Index into the contributors' inputs of the range's first element.
    pub base: usize,
}

/// Where input and output sit in one buffer when a call is in place (NCCL's
/// conventions: `sendbuff == recvbuff` for all-reduce, `sendbuff ==
/// recvbuff + rank·count` for all-gather, `recvbuff == sendbuff +
/// rank·recvcount` for reduce-scatter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InPlaceLayout {
    /// Length of the one buffer.
    pub len: usize,
    /// Offset of the input in it.
    pub input_at: usize,
    /// Offset of the output in it.
    pub output_at: usize,
}

impl Collective {
    /// A collective of `kind` over `nranks` ranks, float32, root 0.
    pub fn new(kind: CollKind, nranks: usize, count: usize) -> Collective {
        Collective { kind, nranks, count, root: 0, dtype: DataType::Float32 }
    }

    /// The same with another root.
    pub fn with_root(mut self, root: usize) -> Collective {
        self.root = root;
        self
    }

    /// The same with another data type.
    pub fn with_dtype(mut self, dtype: DataType) -> Collective {
        self.dtype = dtype;
        self
    }

    /// Checks the description itself: at least one rank, root in range, and
    /// buffer sizes that fit in memory.
    pub fn validate(&self) -> Result<()> {
        if self.nranks == 0 {
            return Err(Error::invalid(format!("{}: nranks must be at least 1", self.kind)));
        }
        if self.root >= self.nranks {
            return Err(Error::invalid(format!(
                "{}: root {} is out of range for {} ranks",
                self.kind, self.root, self.nranks
            )));
        }
        let biggest = self.count.checked_mul(self.nranks).ok_or_else(|| {
            Error::invalid(format!("{}: count {} × {} ranks overflows", self.kind, self.count, self.nranks))
        })?;
        self.dtype.bytes(biggest).map(|_| ())
    }

    /// Elements in `rank`'s input buffer (0 where NCCL ignores the buffer:
    /// a non-root's input of broadcast and scatter).
    pub fn input_len(&self, rank: usize) -> usize {
        let (n, c, root) = (self.nranks, self.count, rank == self.root);
        match self.kind {
            CollKind::AllReduce | CollKind::AllGather | CollKind::Reduce | CollKind::Gather | CollKind::SendRecv => c,
            CollKind::ReduceScatter | CollKind::AllToAll => n * c,
            CollKind::Broadcast => {
                if root {
                    c
                } else {
                    0
                }
            }
            CollKind::Scatter => {
                if root {
                    n * c
                } else {
                    0
                }
            }
        }
    }

    /// Elements in `rank`'s output buffer (0 where NCCL ignores the buffer:
    /// a non-root's output of reduce and gather).
    pub fn output_len(&self, rank: usize) -> usize {
        let (n, c, root) = (self.nranks, self.count, rank == self.root);
        match self.kind {
            CollKind::AllReduce
            | CollKind::ReduceScatter
            | CollKind::Broadcast
            | CollKind::Scatter
            | CollKind::SendRecv => c,
            CollKind::AllGather | CollKind::AllToAll => n * c,
            CollKind::Reduce => {
                if root {
                    c
                } else {
                    0
                }
            }
            CollKind::Gather => {
                if root {
                    n * c
                } else {
                    0
                }
            }
        }
    }

    /// Where input and output sit when `rank`'s call is in place.
    pub fn in_place_layout(&self, rank: usize) -> InPlaceLayout {
        let (i, o) = (self.input_len(rank), self.output_len(rank));
        let at = rank * self.count;
        match self.kind {
            CollKind::AllGather | CollKind::Gather if o > i => InPlaceLayout { len: o, input_at: at, output_at: 0 },
            CollKind::ReduceScatter | CollKind::Scatter if i > o => {
                InPlaceLayout { len: i, input_at: 0, output_at: at }
            }
            _ => InPlaceLayout { len: i.max(o), input_at: 0, output_at: 0 },
        }
    }

    /// What `rank`'s output must hold when the collective is done.
    pub fn expected(&self, rank: usize) -> Vec<Expect> {
        let (n, c) = (self.nranks, self.count);
        let all: Vec<usize> = (0..n).collect();
        let one = |start, src: usize, base| Expect { start, len: c, ranks: vec![src], base };
        match self.kind {
            CollKind::AllReduce => vec![Expect { start: 0, len: c, ranks: all, base: 0 }],
            CollKind::ReduceScatter => vec![Expect { start: 0, len: c, ranks: all, base: rank * c }],
            CollKind::AllGather => (0..n).map(|j| one(j * c, j, 0)).collect(),
            CollKind::AllToAll => (0..n).map(|j| one(j * c, j, rank * c)).collect(),
            CollKind::Broadcast => vec![one(0, self.root, 0)],
            CollKind::Reduce if rank == self.root => vec![Expect { start: 0, len: c, ranks: all, base: 0 }],
            CollKind::Gather if rank == self.root => (0..n).map(|j| one(j * c, j, 0)).collect(),
            CollKind::Scatter => vec![one(0, self.root, rank * c)],
            CollKind::SendRecv => vec![one(0, (rank + n - 1) % n, 0)],
            CollKind::Reduce | CollKind::Gather => vec![],
        }
    }

    /// Bytes in the message size nccl-tests reports in its `size` column
    /// (the larger of a rank's send and receive buffers).
    pub fn size_bytes(&self) -> usize {
        let n = self.nranks;
        let c = self.count * self.dtype.size();
        match self.kind {
            CollKind::ReduceScatter
            | CollKind::AllGather
            | CollKind::AllToAll
            | CollKind::Gather
            | CollKind::Scatter => c * n,
            _ => c,
        }
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} of {} × {} on {} ranks", self.kind, self.count, self.dtype, self.nranks)?;
        if self.kind.is_rooted() {
            write!(f, " (root {})", self.root)?;
        }
        Ok(())
    }
}

/// The `i`-th of `parts` balanced pieces of `count` elements: `(offset,
/// len)`; the first `count % parts` pieces are one longer.
pub fn part(count: usize, parts: usize, i: usize) -> (usize, usize) {
    let (q, r) = (count / parts, count % parts);
    (i * q + i.min(r), q + usize::from(i < r))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_exactly() {
        for count in [0, 1, 7, 1000, 1_000_003] {
            for parts in 1..40 {
                let mut next = 0;
                for i in 0..parts {
                    let (off, len) = part(count, parts, i);
                    assert_eq!(off, next);
                    next += len;
                }
                assert_eq!(next, count);
            }
        }
    }

    #[test]
    fn names_parse_like_nccl_tests_binaries() {
        for k in CollKind::ALL {
            assert_eq!(k.name().parse::<CollKind>().unwrap(), k);
            assert_eq!(format!("{}_perf", k.name()).parse::<CollKind>().unwrap(), k);
        }
        assert_eq!("allreduce".parse::<CollKind>().unwrap(), CollKind::AllReduce);
        assert!("allscatter".parse::<CollKind>().is_err());
        // JSON uses the same names, and accepts the other spelling.
        for k in CollKind::ALL {
            assert_eq!(serde_json::to_string(&k).unwrap(), format!("\"{}\"", k.name()));
        }
        let k: CollKind = serde_json::from_str("\"all_to_all\"").unwrap();
        assert_eq!(k, CollKind::AllToAll);
    }

    #[test]
    fn validation_names_the_problem() {
        let c = Collective::new(CollKind::Broadcast, 4, 10).with_root(4);
        assert!(c.validate().unwrap_err().to_string().contains("root 4"));
        assert!(Collective::new(CollKind::AllGather, 0, 1).validate().is_err());
        assert!(Collective::new(CollKind::AllGather, 3, usize::MAX / 2).validate().is_err());
    }

    #[test]
    fn in_place_layouts_follow_nccl() {
        let ag = Collective::new(CollKind::AllGather, 4, 10);
        assert_eq!(ag.in_place_layout(2), InPlaceLayout { len: 40, input_at: 20, output_at: 0 });
        let rs = Collective::new(CollKind::ReduceScatter, 4, 10);
        assert_eq!(rs.in_place_layout(3), InPlaceLayout { len: 40, input_at: 0, output_at: 30 });
        let ar = Collective::new(CollKind::AllReduce, 4, 10);
        assert_eq!(ar.in_place_layout(1), InPlaceLayout { len: 10, input_at: 0, output_at: 0 });
    }
}
