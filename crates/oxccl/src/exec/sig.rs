//! Call signatures: every two-sided message of a collective carries, in
//! its transport tag, what the sending rank was asked to do (kind, type,
//! operator, root, the collective's number on the communicator); the
//! receiver compares it with its own call's. Ranks whose calls disagree get
//! an error naming both ranks and what differs, instead of wrong data or a
//! hang (`OXCCL_CHECK=1` still compares every argument before the call;
//! this costs nothing: the tag rides in the header every message has).
//!
//! The count is not in the signature: a different count gives messages of
//! a different length, an error of its own.
//!
//! Layout (64 bits): a marker byte (so 0, "untagged", never matches), then
//! kind 4 bits, type 4, operator 4, root 20 bits, number 24 bits (both
//! compared modulo their width).

use oxccl_algo::collective::CollKind;
use oxccl_core::{DataType, Error, ReduceOp};

const MARK: u64 = 0xa5;
const ROOT_BITS: u32 = 20;
const SEQ_BITS: u32 = 24;
const OPS: [&str; 6] = ["sum", "prod", "max", "min", "avg", "mulsum"];

// The tag carries a kind's index in CollKind::ALL in 4 bits.
const _: () = assert!(CollKind::ALL.len() <= 16, "a collective kind no longer fits the tag's 4 bits");

/// One collective call's signature.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sig {
    kind: u8,
    dtype: u8,
    /// Index in [`OPS`] plus one; 0 where the kind does not reduce.
    op: u8,
    /// Where the kind has a root; 0 otherwise.
    root: u32,
    seq: u32,
}

impl Sig {
    /// The signature of collective number `seq` (counted over collectives
    /// only) of `kind` on `dtype`.
    pub fn new(kind: CollKind, dtype: DataType, op: ReduceOp, root: usize, seq: u64) -> Sig {
        let k = CollKind::ALL.iter().position(|&c| c == kind).unwrap_or(0) as u8;
        let t = DataType::ALL.iter().position(|&d| d == dtype).unwrap_or(0) as u8;
        let op = if kind.reduces() { OPS.iter().position(|&n| n == op.name()).map_or(0, |i| i as u8 + 1) } else { 0 };
        Sig {
            kind: k,
            dtype: t,
            op,
            root: if kind.is_rooted() { root as u32 & ((1 << ROOT_BITS) - 1) } else { 0 },
            seq: seq as u32 & ((1 << SEQ_BITS) - 1),
        }
    }

    /// The same signature for collective number `seq`.
    pub fn numbered(self, seq: u64) -> Sig {
        Sig { seq: seq as u32 & ((1 << SEQ_BITS) - 1), ..self }
    }

    /// The tag that carries it.
    pub fn tag(&self) -> u64 {
        MARK << 56
            | u64::from(self.kind & 15) << 52
            | u64::from(self.dtype & 15) << 48
            | u64::from(self.op & 15) << 44
            | u64::from(self.root) << SEQ_BITS
            | u64::from(self.seq)
    }

    /// The signature a tag carries; `None` for an untagged message or one
    /// that is not a collective's.
    fn of(tag: u64) -> Option<Sig> {
        (tag >> 56 == MARK).then_some(Sig {
            kind: (tag >> 52 & 15) as u8,
            dtype: (tag >> 48 & 15) as u8,
            op: (tag >> 44 & 15) as u8,
            root: (tag >> SEQ_BITS & ((1 << ROOT_BITS) - 1)) as u32,
            seq: (tag & ((1 << SEQ_BITS) - 1)) as u32,
        })
    }

    fn kind(&self) -> Option<CollKind> {
        CollKind::ALL.get(usize::from(self.kind)).copied()
    }

    /// The collective's number (modulo 2^24): the key its call is
    /// published under.
    pub fn number(&self) -> u64 {
        u64::from(self.seq)
    }

    /// The call as published for peers: this signature's tag and `count`.
    pub fn record(&self, count: u64) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.tag().to_le_bytes());
        b[8..].copy_from_slice(&count.to_le_bytes());
        b
    }

    /// A published call: (tag, count).
    pub fn read_record(b: &[u8]) -> Option<(u64, u64)> {
        Some((u64::from_le_bytes(b.get(..8)?.try_into().ok()?), u64::from_le_bytes(b.get(8..16)?.try_into().ok()?)))
    }

    /// In words: `all_reduce #7 (float, sum)`, `broadcast #3 (int8, root 2)`.
    fn describe(&self) -> String {
        let kind = self.kind().map_or_else(|| format!("collective kind {}", self.kind), |k| k.name().to_string());
        let dtype = DataType::ALL
            .get(usize::from(self.dtype))
            .map_or_else(|| format!("type {}", self.dtype), |d| d.to_string());
        let mut parts = vec![dtype];
        if self.op > 0 {
            parts.push(OPS.get(usize::from(self.op) - 1).map_or_else(|| format!("op {}", self.op), |o| o.to_string()));
        }
        if self.kind().is_some_and(CollKind::is_rooted) {
            parts.push(format!("root {}", self.root));
        }
        format!("{kind} #{} ({})", self.seq, parts.join(", "))
    }

    /// An error unless `tag`, from `peer`'s message, is this call's
    /// signature (`me`: this rank).
    pub fn check(&self, tag: u64, me: usize, peer: usize) -> Result<(), Error> {
        if tag == self.tag() {
            return Ok(());
        }
        let mine = self.describe();
        let Some(theirs) = Sig::of(tag) else {
            return Err(Error::InvalidUsage(format!(
                "rank {me} runs {mine}, but rank {peer} sent a message that is not a collective's \
                 (a send of its own, or a different oxccl version): the ranks' calls disagree"
            )));
        };
        let same_kind = self.kind == theirs.kind;
        let differ: Vec<&str> = [
            ("the collective", !same_kind),
            ("the data type", self.dtype != theirs.dtype),
            ("the operator", same_kind && self.op != theirs.op),
            ("the root", same_kind && self.root != theirs.root),
            ("the collective's number", self.seq != theirs.seq),
        ]
        .into_iter()
        .filter_map(|(name, d)| d.then_some(name))
        .collect();
        let seq = if self.seq != theirs.seq {
            "; a differing number means one rank called collectives the other did not"
        } else {
            ""
        };
        Err(Error::InvalidUsage(format!(
            "rank {me} runs {mine}, but rank {peer} runs {}: the ranks' calls disagree ({} differ{}{seq})",
            theirs.describe(),
            differ.join(", "),
            if differ.len() == 1 { "s" } else { "" }
        )))
    }
}

/// What arrivals are checked against: a task's signature (if it has one),
/// its count, and this rank.
#[derive(Clone, Copy)]
pub(crate) struct Expect {
    pub sig: Option<Sig>,
    pub count: u64,
    pub me: usize,
}

impl Expect {
    /// An error unless `tag`, on something from `peer`, is the signature.
    pub fn tag(&self, tag: u64, peer: usize) -> Result<(), Error> {
        self.sig.map_or(Ok(()), |s| s.check(tag, self.me, peer))
    }

    /// An error unless `peer`'s buffers, exposed for a call tagged `tag`
    /// of `count` elements, are for this very call: the same signature and
    /// the same count (a count that differs would otherwise show as an
    /// access outside the peer's buffers, or as a wait that times out).
    pub fn exposure(&self, tag: u64, count: u64, peer: usize) -> Result<(), Error> {
        self.tag(tag, peer)?;
        match self.sig {
            Some(s) if count != self.count => Err(Error::InvalidUsage(format!(
                "rank {} runs {} of {} elements, but rank {peer} runs it of {count} elements: the ranks' calls \
                 disagree (the count differs)",
                self.me,
                s.describe(),
                self.count
            ))),
            _ => Ok(()),
        }
    }

    /// The tag to send with.
    pub fn own(&self) -> u64 {
        self.sig.map_or(0, |s| s.tag())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_names_what_differs() {
        let a = Sig::new(CollKind::AllReduce, DataType::Float32, ReduceOp::Sum, 3, 7);
        assert_eq!(Sig::of(a.tag()), Some(Sig { root: 0, ..a }), "all_reduce has no root");
        assert!(a.check(a.tag(), 0, 1).is_ok());
        let b = Sig::new(CollKind::AllReduce, DataType::Int32, ReduceOp::Sum, 0, 7);
        let e = a.check(b.tag(), 1, 0).unwrap_err().to_string();
        assert!(e.contains("rank 1 runs all_reduce #7 (float, sum)"), "{e}");
        assert!(e.contains("rank 0 runs all_reduce #7 (int32, sum)"), "{e}");
        assert!(e.contains("(the data type differs)"), "{e}");
        let c = Sig::new(CollKind::Broadcast, DataType::Float32, ReduceOp::Max, 2, 8);
        let e = a.check(c.tag(), 0, 5).unwrap_err().to_string();
        assert!(e.contains("broadcast #8 (float, root 2)"), "{e}");
        assert!(e.contains("(the collective, the collective's number differ; a differing number"), "{e}");
        let e = a.check(0, 0, 5).unwrap_err().to_string();
        assert!(e.contains("not a collective's"), "{e}");
    }

    #[test]
    fn an_exposure_of_another_count_is_named() {
        let s = Sig::new(CollKind::AllReduce, DataType::Float32, ReduceOp::Sum, 0, 4);
        let x = Expect { sig: Some(s), count: 1000, me: 2 };
        assert!(x.exposure(s.tag(), 1000, 1).is_ok());
        let e = x.exposure(s.tag(), 1200, 1).unwrap_err();
        assert!(matches!(e, Error::InvalidUsage(_)), "{e}");
        let e = e.to_string();
        assert!(e.contains("rank 2 runs all_reduce #4 (float, sum) of 1000 elements"), "{e}");
        assert!(e.contains("rank 1 runs it of 1200 elements") && e.contains("the count differs"), "{e}");
        // The signature is checked first; untagged tasks compare nothing.
        let other = Sig::new(CollKind::AllReduce, DataType::Int32, ReduceOp::Sum, 0, 4);
        assert!(x.exposure(other.tag(), 1000, 1).unwrap_err().to_string().contains("the data type differs"));
        assert!(Expect { sig: None, count: 0, me: 0 }.exposure(0, 5, 1).is_ok());
    }

    #[test]
    fn every_field_counts() {
        let base = Sig::new(CollKind::Reduce, DataType::Float64, ReduceOp::Max, 1, 100);
        let others = [
            Sig::new(CollKind::AllReduce, DataType::Float64, ReduceOp::Max, 1, 100),
            Sig::new(CollKind::Reduce, DataType::Int64, ReduceOp::Max, 1, 100),
            Sig::new(CollKind::Reduce, DataType::Float64, ReduceOp::Min, 1, 100),
            Sig::new(CollKind::Reduce, DataType::Float64, ReduceOp::Avg, 1, 100),
            Sig::new(CollKind::Reduce, DataType::Float64, ReduceOp::Max, 0, 100),
            Sig::new(CollKind::Reduce, DataType::Float64, ReduceOp::Max, 1, 101),
        ];
        for o in others {
            assert_ne!(o.tag(), base.tag(), "{o:?}");
        }
        // Per-rank scalars of PreMulSum may differ; operators of kinds that
        // do not reduce are not compared.
        let p = |s| Sig::new(CollKind::AllReduce, DataType::Float32, ReduceOp::PreMulSum { scalar: s }, 0, 1);
        assert_eq!(p(1.0).tag(), p(2.0).tag());
        let g = |op| Sig::new(CollKind::AllGather, DataType::Int8, op, 0, 1);
        assert_eq!(g(ReduceOp::Sum).tag(), g(ReduceOp::Max).tag());
        // Numbers compare modulo 2^24.
        let w = |seq| Sig::new(CollKind::AllGather, DataType::Int8, ReduceOp::Sum, 0, seq);
        assert_eq!(w(5).tag(), w(5 + (1 << 24)).tag());
    }
}
