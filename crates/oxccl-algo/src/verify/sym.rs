//! Symbolic buffer contents over intervals.
//!
//! An element's symbolic value is the set of contributions it holds: ranks
//! `R` and an input index `i` meaning "Σ over r ∈ R of input_r[i]". A run
//! of elements whose index grows by one per element is one [`Piece`], so a
//! whole block of a million elements is a single value and the verifier's
//! cost follows the number of distinct runs, not the element count.

use std::collections::BTreeMap;
use std::fmt;
use std::rc::Rc;

/// A set of ranks (bitset).
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct Ranks(Vec<u64>);

impl Ranks {
    pub(crate) fn single(rank: usize) -> Ranks {
        let mut w = vec![0u64; rank / 64 + 1];
        w[rank / 64] |= 1 << (rank % 64);
        Ranks(w)
    }

    pub(crate) fn from_iter(ranks: impl IntoIterator<Item = usize>) -> Ranks {
        let mut s = Ranks(Vec::new());
        for r in ranks {
            if s.0.len() <= r / 64 {
                s.0.resize(r / 64 + 1, 0);
            }
            s.0[r / 64] |= 1 << (r % 64);
        }
        s
    }

    /// The lowest rank in both sets.
    pub(crate) fn first_common(&self, other: &Ranks) -> Option<usize> {
        self.0.iter().zip(&other.0).enumerate().find_map(|(i, (a, b))| {
            let both = a & b;
            (both != 0).then(|| i * 64 + both.trailing_zeros() as usize)
        })
    }

    pub(crate) fn union(&self, other: &Ranks) -> Ranks {
        let (long, short) = if self.0.len() >= other.0.len() { (self, other) } else { (other, self) };
        let mut w = long.0.clone();
        for (a, b) in w.iter_mut().zip(&short.0) {
            *a |= b;
        }
        Ranks(w)
    }

    /// Ranks in `self` but not in `other`.
    pub(crate) fn minus(&self, other: &Ranks) -> Vec<usize> {
        self.iter().filter(|r| !other.contains(*r)).collect()
    }

    pub(crate) fn contains(&self, r: usize) -> bool {
        self.0.get(r / 64).is_some_and(|w| w & (1 << (r % 64)) != 0)
    }

    /// The ranks as `lo..hi` when they are contiguous (and not empty).
    pub(crate) fn interval(&self) -> Option<std::ops::Range<usize>> {
        let count: u32 = self.0.iter().map(|w| w.count_ones()).sum();
        let (i, w) = self.0.iter().enumerate().find(|(_, w)| **w != 0)?;
        let lo = i * 64 + w.trailing_zeros() as usize;
        let hi = lo + count as usize;
        let last = self
            .0
            .iter()
            .enumerate()
            .rev()
            .find(|(_, w)| **w != 0)
            .map(|(i, w)| i * 64 + 63 - w.leading_zeros() as usize)?;
        (last + 1 == hi).then_some(lo..hi)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().enumerate().flat_map(|(i, w)| (0..64).filter(move |b| w & (1 << b) != 0).map(move |b| i * 64 + b))
    }
}

impl fmt::Display for Ranks {
    /// `{0-3,5}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v: Vec<usize> = self.iter().collect();
        f.write_str("{")?;
        let mut i = 0;
        while i < v.len() {
            let mut j = i;
            while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
                j += 1;
            }
            if i > 0 {
                f.write_str(",")?;
            }
            if j > i {
                write!(f, "{}-{}", v[i], v[j])?;
            } else {
                write!(f, "{}", v[i])?;
            }
            i = j + 1;
        }
        f.write_str("}")
    }
}

/// The first reduction in a value's history that left the canonical
/// order ([`crate::canon`]): where it ran and what it combined.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Departure {
    pub(crate) rank: usize,
    pub(crate) chan: usize,
    pub(crate) pc: usize,
    /// The input index of the first element it combined so.
    pub(crate) element: usize,
    pub(crate) left: Rc<Ranks>,
    pub(crate) right: Rc<Ranks>,
}

/// Where a reduction runs, to name it when it departs from the canonical
/// order over `nranks`.
pub(crate) struct Site {
    pub(crate) nranks: usize,
    pub(crate) rank: usize,
    pub(crate) chan: usize,
    pub(crate) pc: usize,
}

impl Site {
    /// Whether reducing `a` with `b` is a node of the canonical tree.
    fn canonical(&self, a: &Ranks, b: &Ranks) -> bool {
        match (a.interval(), b.interval()) {
            (Some(x), Some(y)) => crate::canon::siblings(self.nranks, x, y),
            _ => false,
        }
    }
}

/// The value of the first element of a run.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Val {
    /// Never written.
    Undef,
    /// Σ over `ranks` of `input[base]` (the run's k-th element: `base + k`);
    /// `off`: reduced in an order that is not the canonical one, and where
    /// that began.
    Sym { ranks: Rc<Ranks>, base: usize, off: Option<Rc<Departure>> },
}

impl Val {
    pub(crate) fn input(rank: usize) -> Val {
        Val::Sym { ranks: Rc::new(Ranks::single(rank)), base: 0, off: None }
    }

    fn at(&self, k: usize) -> Val {
        match self {
            Val::Undef => Val::Undef,
            Val::Sym { ranks, base, off } => Val::Sym { ranks: ranks.clone(), base: base + k, off: off.clone() },
        }
    }

    fn continues(&self, len: usize, next: &Val) -> bool {
        match (self, next) {
            (Val::Undef, Val::Undef) => true,
            (Val::Sym { ranks: a, base: x, off: o }, Val::Sym { ranks: b, base: y, off: p }) => {
                let same_off = match (o, p) {
                    (None, None) => true,
                    (Some(o), Some(p)) => Rc::ptr_eq(o, p),
                    _ => false,
                };
                x + len == *y && (Rc::ptr_eq(a, b) || a == b) && same_off
            }
            _ => false,
        }
    }
}

impl fmt::Display for Val {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Val::Undef => f.write_str("nothing (never written)"),
            Val::Sym { ranks, base, .. } => write!(f, "input[{base}] of ranks {ranks}"),
        }
    }
}

/// A run of `len` elements starting with value `val`.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Piece {
    pub(crate) len: usize,
    pub(crate) val: Val,
}

/// Why two runs cannot be reduced together; `at` is the element offset
/// into the operands.
pub(crate) enum Clash {
    Undef { at: usize, operand: usize },
    Index { at: usize, a: Val, b: Val },
    Twice { at: usize, rank: usize },
}

/// Element-wise reduction of two equally long piece lists at `site`.
pub(crate) fn combine(a: &[Piece], b: &[Piece], site: &Site) -> Result<Vec<Piece>, Clash> {
    let mut out: Vec<Piece> = Vec::with_capacity(a.len().max(b.len()));
    let (mut i, mut j, mut ai, mut bj, mut at) = (0, 0, 0, 0, 0);
    // One departure for every run of this reduction with the same operands,
    // so that the runs still merge.
    let mut made: Option<Rc<Departure>> = None;
    while i < a.len() && j < b.len() {
        let (pa, pb) = (&a[i], &b[j]);
        let n = (pa.len - ai).min(pb.len - bj);
        if n > 0 {
            let (va, vb) = (pa.val.at(ai), pb.val.at(bj));
            let val = match (&va, &vb) {
                (Val::Undef, _) => return Err(Clash::Undef { at, operand: 0 }),
                (_, Val::Undef) => return Err(Clash::Undef { at, operand: 1 }),
                (Val::Sym { ranks: ra, base: x, off: oa }, Val::Sym { ranks: rb, base: y, off: ob }) => {
                    if x != y {
                        return Err(Clash::Index { at, a: va.clone(), b: vb.clone() });
                    }
                    if let Some(rank) = ra.first_common(rb) {
                        return Err(Clash::Twice { at, rank });
                    }
                    let off = oa.clone().or_else(|| ob.clone()).or_else(|| {
                        if site.canonical(ra, rb) {
                            return None;
                        }
                        if let Some(d) = &made
                            && d.left == *ra
                            && d.right == *rb
                        {
                            return Some(d.clone());
                        }
                        let d = Rc::new(Departure {
                            rank: site.rank,
                            chan: site.chan,
                            pc: site.pc,
                            element: *x,
                            left: ra.clone(),
                            right: rb.clone(),
                        });
                        made = Some(d.clone());
                        Some(d)
                    });
                    Val::Sym { ranks: Rc::new(ra.union(rb)), base: *x, off }
                }
            };
            push(&mut out, Piece { len: n, val });
        }
        ai += n;
        bj += n;
        at += n;
        if ai == pa.len {
            i += 1;
            ai = 0;
        }
        if bj == pb.len {
            j += 1;
            bj = 0;
        }
    }
    Ok(out)
}

/// The offset of the first undefined element, if any.
pub(crate) fn first_undef(pieces: &[Piece]) -> Option<usize> {
    let mut at = 0;
    for p in pieces {
        if p.val == Val::Undef && p.len > 0 {
            return Some(at);
        }
        at += p.len;
    }
    None
}

fn push(out: &mut Vec<Piece>, p: Piece) {
    if p.len == 0 {
        return;
    }
    if let Some(last) = out.last_mut()
        && last.val.continues(last.len, &p.val)
    {
        last.len += p.len;
        return;
    }
    out.push(p);
}

/// One buffer's contents: runs keyed by their start offset, covering
/// `[0, len)`; reads and writes cost `O(log runs)` plus the runs touched.
pub(crate) struct SymBuf {
    runs: BTreeMap<usize, Piece>,
    len: usize,
}

impl SymBuf {
    pub(crate) fn undef(len: usize) -> SymBuf {
        let mut runs = BTreeMap::new();
        if len > 0 {
            runs.insert(0, Piece { len, val: Val::Undef });
        }
        SymBuf { runs, len }
    }

    /// The contents of `[off, off + len)`.
    pub(crate) fn read(&self, off: usize, len: usize) -> Vec<Piece> {
        debug_assert!(off + len <= self.len);
        let mut out = Vec::new();
        if len == 0 {
            return out;
        }
        let end = off + len;
        let first = self.runs.range(..=off).next_back().map(|(s, _)| *s).unwrap_or(0);
        for (&s, p) in self.runs.range(first..end) {
            let from = off.max(s);
            let to = end.min(s + p.len);
            push(&mut out, Piece { len: to - from, val: p.val.at(from - s) });
        }
        out
    }

    /// Makes `at` the start of a run.
    fn split(&mut self, at: usize) {
        if at >= self.len {
            return;
        }
        let (&s, p) = self.runs.range_mut(..=at).next_back().expect("runs cover the buffer");
        if s < at {
            let tail = Piece { len: s + p.len - at, val: p.val.at(at - s) };
            p.len = at - s;
            self.runs.insert(at, tail);
        }
    }

    /// Merges the run starting at `at` into the one before it when the
    /// values continue.
    fn merge_at(&mut self, at: usize) {
        let Some(p) = self.runs.get(&at) else { return };
        let Some((_, prev)) = self.runs.range(..at).next_back() else {
            return;
        };
        if prev.val.continues(prev.len, &p.val) {
            let add = p.len;
            self.runs.remove(&at);
            self.runs.range_mut(..at).next_back().expect("checked above").1.len += add;
        }
    }

    /// Replaces `[off, off + Σ len)` with `data`.
    pub(crate) fn write(&mut self, off: usize, data: &[Piece]) {
        let len: usize = data.iter().map(|p| p.len).sum();
        if len == 0 {
            return;
        }
        let end = off + len;
        debug_assert!(end <= self.len);
        self.split(off);
        self.split(end);
        let old: Vec<usize> = self.runs.range(off..end).map(|(s, _)| *s).collect();
        for s in old {
            self.runs.remove(&s);
        }
        let mut at = off;
        for p in data.iter().filter(|p| p.len > 0) {
            self.runs.insert(at, p.clone());
            at += p.len;
        }
        self.merge_at(end);
        self.merge_at(off);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sym(ranks: &[usize], base: usize, len: usize) -> Piece {
        Piece { len, val: Val::Sym { ranks: Rc::new(Ranks::from_iter(ranks.iter().copied())), base, off: None } }
    }

    const SITE: Site = Site { nranks: 4, rank: 0, chan: 0, pc: 0 };

    #[test]
    fn writes_split_and_merge_runs() {
        let mut b = SymBuf::undef(100);
        b.write(10, &[sym(&[1], 10, 20)]);
        b.write(30, &[sym(&[1], 30, 10)]);
        assert_eq!(b.runs.len(), 3, "contiguous runs merge");
        assert!(b.read(10, 30) == vec![sym(&[1], 10, 30)]);
        b.write(15, &[sym(&[2], 0, 5)]);
        let r = b.read(0, 100);
        assert_eq!(r.iter().map(|p| p.len).collect::<Vec<_>>(), vec![10, 5, 5, 20, 60]);
        assert!(r[3] == sym(&[1], 20, 20));
        b.write(0, &[Piece { len: 100, val: Val::Undef }]);
        assert_eq!(b.runs.len(), 1);
    }

    #[test]
    fn combine_detects_clashes() {
        let a = [sym(&[0], 0, 4), sym(&[0], 4, 4)];
        let b = [sym(&[1, 2], 0, 8)];
        let c = combine(&a, &b, &SITE).ok().unwrap();
        assert_eq!(c.len(), 1);
        assert!(matches!(&c[0].val, Val::Sym { base: 0, off: Some(_), .. }), "{{0}} ⊕ {{1,2}} is not canonical");
        assert!(matches!(combine(&c, &b, &SITE), Err(Clash::Twice { at: 0, rank: 1 })));
        assert!(matches!(combine(&[sym(&[3], 1, 8)], &b, &SITE), Err(Clash::Index { at: 0, .. })));
        let u = [sym(&[3], 0, 2), Piece { len: 6, val: Val::Undef }];
        assert!(matches!(combine(&u, &b, &SITE), Err(Clash::Undef { at: 2, operand: 0 })));
        let (x, y) = ([sym(&[0, 1], 0, 8)], [sym(&[2, 3], 0, 8)]);
        assert!(combine(&x, &y, &SITE).ok().unwrap() == vec![sym(&[0, 1, 2, 3], 0, 8)], "canonical: no departure");
        assert_eq!(Ranks::from_iter([0, 1, 2, 3, 5, 9, 10]).to_string(), "{0-3,5,9-10}");
        assert_eq!(Ranks::from_iter([0, 1, 2, 3, 5]).interval(), None);
        assert_eq!(Ranks::from_iter(60..70).interval(), Some(60..70));
        assert_eq!(Ranks::from_iter([]).interval(), None);
    }
}
