//! Snapshots of small programs: the exact steps an algorithm generates.

use oxccl_algo::algos::{Algorithm, BuildOptions, build};
use oxccl_algo::{CollKind, Collective};

fn listing(algo: Algorithm, kind: CollKind, n: usize, count: usize) -> String {
    let c = Collective::new(kind, n, count);
    build(algo, &c, &BuildOptions::default()).unwrap().listing()
}

#[test]
fn ring_all_reduce_three_ranks() {
    // Rank r completes block r, as ring reduce-scatter does, so that both
    // add the ranks' contributions in the same order (bit-equal sums in
    // every type: ZeRO's reduce-scatter matches DDP's all-reduce).
    let want = "\
ring (all_reduce of 6 × float on 3 ranks)
rank 0:
     0  send input[4..6] to 1
     1  recv-reduce-send input[2..4] + recv from 2 to 1
     2  recv-reduce-copy-send output[0..2] = input[0..2] + recv from 2, to 1
     3  recv-copy-send output[4..6] from 2 to 1
     4  recv output[2..4] from 2
rank 1:
     0  send input[0..2] to 2
     1  recv-reduce-send input[4..6] + recv from 0 to 2
     2  recv-reduce-copy-send output[2..4] = input[2..4] + recv from 0, to 2
     3  recv-copy-send output[0..2] from 0 to 2
     4  recv output[4..6] from 0
rank 2:
     0  send input[2..4] to 0
     1  recv-reduce-send input[0..2] + recv from 1 to 0
     2  recv-reduce-copy-send output[4..6] = input[4..6] + recv from 1, to 0
     3  recv-copy-send output[2..4] from 1 to 0
     4  recv output[0..2] from 1
";
    assert_eq!(listing(Algorithm::Ring, CollKind::AllReduce, 3, 6), want);
}

#[test]
fn double_tree_four_ranks() {
    // Tree 0: 0 → 2 → {1, 3}; tree 1 (mirrored): 3 → 1 → {2, 0}. Every
    // rank is an inner node of exactly one tree.
    let want = "\
tree (all_reduce of 4 × float on 4 ranks)
rank 0:
  channel 0:
     0  recv-reduce output[0..2] = input[0..2] + recv from 2
     1  send output[0..2] to 2
  channel 1:
     0  send input[2..4] to 1
     1  recv output[2..4] from 1
rank 1:
  channel 0:
     0  send input[0..2] to 2
     1  recv output[0..2] from 2
  channel 1:
     0  recv-reduce output[2..4] = input[2..4] + recv from 2
     1  recv-reduce-send output[2..4] + recv from 0 to 3
     2  recv-copy-send output[2..4] from 3 to 2
     3  send output[2..4] to 0
rank 2:
  channel 0:
     0  recv-reduce output[0..2] = input[0..2] + recv from 1
     1  recv-reduce-send output[0..2] + recv from 3 to 0
     2  recv-copy-send output[0..2] from 0 to 1
     3  send output[0..2] to 3
  channel 1:
     0  send input[2..4] to 1
     1  recv output[2..4] from 1
rank 3:
  channel 0:
     0  send input[0..2] to 2
     1  recv output[0..2] from 2
  channel 1:
     0  recv-reduce output[2..4] = input[2..4] + recv from 1
     1  send output[2..4] to 1
";
    let got = listing(Algorithm::Tree, CollKind::AllReduce, 4, 4);
    assert_eq!(got, want, "got:\n{got}");
}

#[test]
fn direct_reduce_three_ranks_root_one() {
    // Only the root and each other rank signal each other; the root reads
    // in rank order, its own input joining at its turn from scratch.
    let want = "\
direct (reduce of 2 × float on 3 ranks (root 1))
rank 0:
     0  signal 1
     1  wait for 1
rank 1, scratch 2:
     0  copy input[0..2] to scratch[0..2]
     1  wait for 2
     2  wait for 0
     3  get rank 0's input[0..2] into output[0..2]
     4  reduce output[0..2] = output[0..2] + scratch[0..2]
     5  get-reduce output[0..2] = output[0..2] + rank 2's input[0..2]
     6  signal 2
     7  signal 0
rank 2:
     0  signal 1
     1  wait for 1
";
    let c = Collective::new(CollKind::Reduce, 3, 2).with_root(1);
    let got = build(Algorithm::Direct, &c, &BuildOptions::default()).unwrap().listing();
    assert_eq!(got, want, "got:\n{got}");
}
