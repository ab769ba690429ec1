//! Flat buckets: one per layer, each padded so it splits evenly over the
//! ranks. Every rank builds the same layout, so every rank issues the same
//! collectives in the same order.

use oxccl::{Error, Result};
use serde::{Deserialize, Serialize};
use std::ops::Range;

/// One named parameter tensor, flattened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tensor {
    /// Its name (unique in the model).
    pub name: String,
    /// Its number of elements.
    pub numel: usize,
}

impl Tensor {
    /// A tensor of `numel` elements.
    pub fn new(name: impl Into<String>, numel: usize) -> Tensor {
        Tensor { name: name.into(), numel }
    }
}

/// A layer: the unit ZeRO-3 gathers and frees, and one bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerSpec {
    /// Its name (for messages).
    pub name: String,
    /// Its tensors, in the model's canonical order.
    pub tensors: Vec<Tensor>,
}

/// A layer's flat bucket.
#[derive(Clone, Debug)]
pub struct Bucket {
    /// The layer's name.
    pub name: String,
    /// The layer's tensors with their offsets in the bucket.
    pub tensors: Vec<(Tensor, usize)>,
    /// Elements without padding.
    pub numel: usize,
    /// Elements with padding (a multiple of the ranks).
    pub padded: usize,
    /// Elements per rank (`padded / nranks`).
    pub shard: usize,
    /// Where this bucket starts in the canonical (unpadded) order.
    pub canonical_start: usize,
}

impl Bucket {
    /// The elements `rank` owns.
    pub fn own(&self, rank: usize) -> Range<usize> {
        rank * self.shard..(rank + 1) * self.shard
    }
}

/// Every layer's bucket for a number of ranks.
#[derive(Clone, Debug)]
pub struct Layout {
    /// Buckets, in layer order.
    pub buckets: Vec<Bucket>,
    /// The number of ranks the buckets are padded for.
    pub nranks: usize,
}

impl Layout {
    /// Lays out `layers` over `nranks` ranks. Errors on no layers, an empty
    /// or repeated tensor name, or zero ranks.
    pub fn new(layers: &[LayerSpec], nranks: usize) -> Result<Layout> {
        if nranks == 0 {
            return Err(Error::invalid("oxccl-zero: a layout needs at least one rank"));
        }
        if layers.is_empty() {
            return Err(Error::invalid("oxccl-zero: the model has no layers"));
        }
        let mut seen = std::collections::HashSet::new();
        let mut buckets = Vec::with_capacity(layers.len());
        let mut canonical_start = 0;
        for l in layers {
            if l.tensors.is_empty() {
                return Err(Error::invalid(format!("oxccl-zero: layer {:?} has no tensors", l.name)));
            }
            let mut tensors = Vec::with_capacity(l.tensors.len());
            let mut off = 0;
            for t in &l.tensors {
                if t.name.is_empty() || !seen.insert(t.name.clone()) {
                    return Err(Error::invalid(format!(
                        "oxccl-zero: layer {:?}: tensor name {:?} is empty or used twice",
                        l.name, t.name
                    )));
                }
                tensors.push((t.clone(), off));
                off += t.numel;
            }
            let padded = off.div_ceil(nranks).max(1) * nranks;
            buckets.push(Bucket {
                name: l.name.clone(),
                tensors,
                numel: off,
                padded,
                shard: padded / nranks,
                canonical_start,
            });
            canonical_start += off;
        }
        Ok(Layout { buckets, nranks })
    }

    /// Parameters without padding (Ψ).
    pub fn params(&self) -> usize {
        self.buckets.iter().map(|b| b.numel).sum()
    }

    /// Parameters with padding.
    pub fn padded(&self) -> usize {
        self.buckets.iter().map(|b| b.padded).sum()
    }

    /// Every tensor, in canonical order.
    pub fn tensors(&self) -> impl Iterator<Item = &Tensor> {
        self.buckets.iter().flat_map(|b| b.tensors.iter().map(|(t, _)| t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(sizes: &[&[usize]]) -> Vec<LayerSpec> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, ts)| LayerSpec {
                name: format!("l{i}"),
                tensors: ts.iter().enumerate().map(|(j, &n)| Tensor::new(format!("l{i}.t{j}"), n)).collect(),
            })
            .collect()
    }

    #[test]
    fn pads_to_a_multiple_of_the_ranks() {
        let l = Layout::new(&spec(&[&[3, 4], &[1], &[8]]), 3).unwrap();
        assert_eq!(l.params(), 16);
        let b: Vec<_> = l.buckets.iter().map(|b| (b.numel, b.padded, b.shard, b.canonical_start)).collect();
        assert_eq!(b, [(7, 9, 3, 0), (1, 3, 1, 7), (8, 9, 3, 8)]);
        assert_eq!(l.padded(), 21);
        assert_eq!(l.buckets[0].tensors[1].1, 3);
        assert_eq!(l.buckets[2].own(2), 6..9);
    }

    #[test]
    fn bad_specs_are_named() {
        assert!(Layout::new(&[], 2).unwrap_err().to_string().contains("no layers"));
        let mut s = spec(&[&[3], &[4]]);
        s[1].tensors[0].name = "l0.t0".into();
        assert!(Layout::new(&s, 2).unwrap_err().to_string().contains("\"l0.t0\""));
        assert!(Layout::new(&spec(&[&[1]]), 0).is_err());
    }
}
