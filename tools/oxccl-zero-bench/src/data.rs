//! The training text and its batches.

use crate::model::{Res, SplitMix};
use candle_core::{Device, Tensor};

/// The public-domain text shipped with the bench (see `data/README.md`).
pub const CORPUS: &str = include_str!("../data/corpus.txt");

/// A character-level view of a text.
pub struct Corpus {
    ids: Vec<u32>,
    /// The characters, sorted; a character's id is its index.
    pub vocab: Vec<char>,
}

impl Corpus {
    /// Encodes `text`.
    pub fn new(text: &str) -> Corpus {
        let mut vocab: Vec<char> = text.chars().collect();
        vocab.sort_unstable();
        vocab.dedup();
        let ids = text.chars().map(|c| vocab.binary_search(&c).expect("in the vocabulary") as u32).collect();
        Corpus { ids, vocab }
    }

    /// Characters in the text.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether the text is empty.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Rank `rank`'s batch of step `step`: `batch` windows of `ctx`
    /// characters at seeded random places, and the same shifted by one
    /// (the targets). Different ranks see different windows.
    pub fn batch(&self, seed: u64, step: u64, rank: usize, batch: usize, ctx: usize) -> Res<(Tensor, Tensor)> {
        if self.len() <= ctx + 1 {
            return Err(format!("the text has {} characters, fewer than a context of {ctx} needs", self.len()).into());
        }
        let mut rng = SplitMix(seed ^ step.wrapping_mul(0x1000_0001) ^ (rank as u64).wrapping_mul(0x9E37_79B9));
        let (mut x, mut y) = (Vec::with_capacity(batch * ctx), Vec::with_capacity(batch * ctx));
        for _ in 0..batch {
            let at = (rng.next_u64() % (self.len() - ctx - 1) as u64) as usize;
            x.extend_from_slice(&self.ids[at..at + ctx]);
            y.extend_from_slice(&self.ids[at + 1..at + ctx + 1]);
        }
        Ok((Tensor::from_vec(x, (batch, ctx), &Device::Cpu)?, Tensor::from_vec(y, (batch, ctx), &Device::Cpu)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_and_batches() {
        let c = Corpus::new(CORPUS);
        assert!(c.len() > 5000 && c.vocab.len() > 40 && c.vocab.len() < 100, "{} {}", c.len(), c.vocab.len());
        let (x, y) = c.batch(1, 0, 0, 3, 16).unwrap();
        let (x, y) = (x.to_vec2::<u32>().unwrap(), y.to_vec2::<u32>().unwrap());
        assert_eq!(x[1][1..], y[1][..15], "targets are the inputs shifted by one");
        let (x1, _) = c.batch(1, 0, 1, 3, 16).unwrap();
        assert_ne!(x, x1.to_vec2::<u32>().unwrap(), "ranks see different windows");
    }
}
