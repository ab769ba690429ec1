//! Programs cut into channels (`oxccl_algo::channels`): every algorithm ×
//! collective × rank count × count × 2-4 parts verifies (out of place,
//! and in place where claimed), moves the bytes of its parts' programs
//! and uses channels of its own per part; or, where a message spans blocks,
//! is refused saying so.

use oxccl_algo::algos::{Algorithm, BuildOptions, build_on};
use oxccl_algo::channels;
use oxccl_algo::placement::Placement;
use oxccl_algo::verify::{VerifyOptions, verify, verify_with};
use oxccl_algo::{CollKind, Collective};

/// Pairs whose messages span blocks of a buffer with n blocks: recursive
/// halving and doubling move half the blocks at a time.
fn unsplittable(algo: Algorithm, kind: CollKind) -> bool {
    algo == Algorithm::Rhd && matches!(kind, CollKind::ReduceScatter | CollKind::AllGather)
}

#[test]
fn every_algorithm_splits_into_channels() {
    let opts = BuildOptions { chunk_bytes: 64, max_chunks: 4 };
    let (mut split, mut refused) = (0, 0);
    for algo in Algorithm::ALL {
        for &kind in algo.kinds() {
            for n in [1, 2, 3, 5, 8] {
                let at = if n == 8 { Placement::cyclic(2, 4) } else { Placement::flat(n) };
                for count in [0, 1, 7, 1000] {
                    for c in [2, 3, 4] {
                        let coll = Collective::new(kind, n, count).with_root(n / 2);
                        let what = format!("{algo} {coll} in {c} channels");
                        let one = build_on(algo, &coll, &opts, &at).unwrap();
                        let p = match channels::build(algo, &coll, &opts, &at, c) {
                            Ok(p) => p,
                            Err(e) => {
                                assert!(unsplittable(algo, kind), "{what}: {e}");
                                assert!(e.to_string().contains("cannot be split into channels"), "{what}: {e}");
                                refused += 1;
                                continue;
                            }
                        };
                        let report = verify(&p).unwrap_or_else(|e| panic!("{what}: {e}"));
                        if p.in_place {
                            verify_with(&p, &VerifyOptions { in_place: true, ..Default::default() })
                                .unwrap_or_else(|e| panic!("{what} in place: {e}"));
                        }
                        assert_eq!(p.in_place, one.in_place, "{what}");
                        // The parts' bytes, exactly (the whole program's
                        // differ where an algorithm's volume is not linear
                        // in the count).
                        let parts: u64 = (0..c)
                            .map(|k| {
                                let part = Collective { count: oxccl_algo::collective::part(count, c, k).1, ..coll };
                                verify(&build_on(algo, &part, &opts, &at).unwrap()).unwrap().total_sent()
                            })
                            .sum();
                        assert_eq!(report.total_sent(), parts, "{what}: bytes");
                        if count >= 1000 && n > 1 {
                            let width = one.ranks.iter().map(|r| r.channels.len()).max().unwrap();
                            let used = p.ranks.iter().map(|r| r.channels.len()).max().unwrap();
                            assert!(used > width, "{what}: {used} channels");
                        }
                        split += 1;
                    }
                }
            }
        }
    }
    assert!(split > 1500 && refused > 0, "{split} split, {refused} refused");
}

#[test]
fn zero_and_too_many_channels_are_refused() {
    let coll = Collective::new(CollKind::AllReduce, 4, 1 << 20);
    let at = Placement::blocked(2, 2);
    let opts = BuildOptions::default();
    let e = channels::build(Algorithm::Ring, &coll, &opts, &at, 0).unwrap_err().to_string();
    assert!(e.contains("0 channels"), "{e}");
    // Two trees a part: 9 parts need 18 channels.
    let e = channels::build(Algorithm::Tree, &coll, &opts, &at, 9).unwrap_err().to_string();
    assert!(e.contains("more than 16 channels"), "{e}");
    assert_eq!(
        channels::build(Algorithm::Ring, &coll, &opts, &at, 1).unwrap(),
        build_on(Algorithm::Ring, &coll, &opts, &at).unwrap()
    );
}
