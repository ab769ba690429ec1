//! Property tests: random rank counts, counts, roots and chunk sizes.

use crate::common;

use oxccl_algo::algos::{Algorithm, BuildOptions, build};
use oxccl_algo::verify::verify;
use oxccl_algo::{CollKind, Collective};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_algorithm_verifies(
        n in 1usize..40,
        count in 0usize..5000,
        root in 0usize..40,
        chunk in 1usize..700,
        max_chunks in 1usize..9,
        pick in 0usize..64,
    ) {
        let pairs: Vec<(Algorithm, CollKind)> = Algorithm::ALL
            .iter()
            .flat_map(|a| a.kinds().iter().map(move |k| (*a, *k)))
            .collect();
        let (algo, kind) = pairs[pick % pairs.len()];
        let c = Collective::new(kind, n, count).with_root(root % n);
        let p = build(algo, &c, &BuildOptions { chunk_bytes: chunk * 4, max_chunks }).unwrap();
        let r = verify(&p);
        prop_assert!(r.is_ok(), "{} {}: {}", algo, c, r.unwrap_err());
        let r = r.unwrap();
        prop_assert_eq!(r.total_sent(), common::expected_total(algo, &c));
        if let Some(want) = common::expected_sent(algo, &c) {
            prop_assert_eq!(r.sent_bytes, want);
        }
    }
}
