//! `scale::instantiate`: a program written for count C, verified at many
//! other counts N, with its byte counts computed independently.

use crate::common;

use oxccl_algo::algos::{Algorithm, BuildOptions, build};
use oxccl_algo::scale::{check_aligned, instantiate, one_sided_peers, one_sided_peers_all};
use oxccl_algo::verify::{Report, VerifyOptions, verify, verify_with};
use oxccl_algo::{Buf, CollKind, Collective, Program, Slice, Step};

const RANKS: [usize; 6] = [1, 2, 3, 4, 5, 8];
const SMALL: [usize; 8] = [1, 2, 3, 4, 5, 6, 7, 16];

/// The smallest prime above `x`.
fn prime_above(x: usize) -> usize {
    (x + 1..).find(|&p| p > 1 && (2..p).take_while(|d| d * d <= p).all(|d| p % d != 0)).unwrap()
}

/// The counts each program written for `c` is instantiated at.
fn targets(c: usize) -> Vec<usize> {
    let mut v = vec![0, 1, c - 1, c, c + 1, 2 * c + 3, 1000, prime_above(10 * c)];
    v.sort_unstable();
    v.dedup();
    v
}

/// The rule, written out again independently of the library: element `j`
/// of a program for `c` sits at this index of the program for `n`.
fn pos(c: usize, n: usize, j: usize) -> usize {
    let (q, r) = (n / c, n % c);
    let (block, k) = (j / c, j % c);
    block * n + k * q + k.min(r)
}

fn scaled_len(c: usize, n: usize, s: &Slice) -> u64 {
    (pos(c, n, s.off + s.len) - pos(c, n, s.off)) as u64
}

/// Bytes each rank sends and receives when `p` (written for its own count)
/// runs at `n`: every message and one-sided transfer of `p`, scaled.
fn scaled_bytes(p: &Program, n: usize) -> (Vec<u64>, Vec<u64>) {
    let (c, e) = (p.collective.count, p.collective.dtype.size() as u64);
    let nr = p.ranks.len();
    let (mut sent, mut recv) = (vec![0u64; nr], vec![0u64; nr]);
    for (r, rp) in p.ranks.iter().enumerate() {
        for step in rp.steps() {
            let (from, to, s) = match step {
                Step::Send { peer, src } | Step::RecvReduceSend { send: peer, src, .. } => (r, *peer, src),
                Step::RecvCopySend { send, dst, .. } | Step::RecvReduceCopySend { send, dst, .. } => (r, *send, dst),
                Step::Put { peer, src, .. } => (r, *peer, src),
                Step::Get { peer, src, .. } | Step::GetReduce { peer, src, .. } => (*peer, r, src),
                _ => continue,
            };
            let bytes = scaled_len(c, n, s) * e;
            sent[from] += bytes;
            recv[to] += bytes;
        }
    }
    (sent, recv)
}

/// The built-in algorithms, all index-aligned but `ordered`: its scratch
/// holds the canonical tree's unfinished subtrees one pipeline chunk at a
/// time (slots reused from chunk to chunk; one slot per element would
/// take several times the buffer), so it runs at the count it was built
/// for, as every built-in program does.
const ALIGNED: [Algorithm; 11] = [
    Algorithm::Ring,
    Algorithm::Hier,
    Algorithm::Bruck,
    Algorithm::Tree,
    Algorithm::Rhd,
    Algorithm::Doubling,
    Algorithm::OneShot,
    Algorithm::TwoShot,
    Algorithm::Direct,
    Algorithm::Pairwise,
    Algorithm::Linear,
];

#[test]
fn the_ordered_algorithm_is_not_index_aligned_and_says_so() {
    assert_eq!(ALIGNED.len() + 1, Algorithm::ALL.len());
    let p = build(Algorithm::Ordered, &Collective::new(CollKind::AllReduce, 3, 7), &BuildOptions::default()).unwrap();
    let e = check_aligned(&p).unwrap_err().to_string();
    assert!(e.contains("not index-aligned") && e.contains("scratch"), "{e}");
}

/// The (algorithm, collective) pairs whose programs do not depend on the
/// count beyond it scaling every slice (no balanced split of the count,
/// one pipeline chunk at these sizes): instantiating them is building them.
fn count_independent(algo: Algorithm, kind: CollKind) -> bool {
    use CollKind::*;
    match algo {
        Algorithm::OneShot | Algorithm::Doubling | Algorithm::Direct | Algorithm::Pairwise | Algorithm::Linear => true,
        // `hier` is the ring on one host (pairwise exchange for all-to-all).
        Algorithm::Ring => matches!(kind, ReduceScatter | AllGather | Broadcast | Reduce),
        Algorithm::Hier => matches!(kind, ReduceScatter | AllGather | AllToAll),
        Algorithm::Tree => matches!(kind, Broadcast | Reduce),
        Algorithm::Rhd => matches!(kind, ReduceScatter | AllGather),
        Algorithm::TwoShot => false,
        Algorithm::Bruck => true,
        Algorithm::Ordered => kind == ReduceScatter,
    }
}

/// Verifies `p` out of place and, where it claims so, in place; returns
/// the out-of-place report.
fn verify_both(p: &Program, what: &str) -> Report {
    let r = verify(p).unwrap_or_else(|e| panic!("{what}: {e}"));
    if p.in_place {
        verify_with(p, &VerifyOptions { in_place: true, ..Default::default() })
            .unwrap_or_else(|e| panic!("{what} in place: {e}"));
    }
    r
}

#[test]
fn every_built_in_program_runs_at_every_count() {
    let opts = BuildOptions::default();
    let (mut runs, mut same_as_built) = (0, 0);
    for algo in ALIGNED {
        for &kind in algo.kinds() {
            assert!(Algorithm::for_kind(kind).contains(&algo));
            for n in RANKS {
                let roots: Vec<usize> = if kind.is_rooted() { (0..n).collect() } else { vec![0] };
                for root in roots {
                    for c in SMALL {
                        let coll = Collective::new(kind, n, c).with_root(root);
                        let p = build(algo, &coll, &opts).unwrap();
                        // Every built-in program is index-aligned.
                        check_aligned(&p).unwrap_or_else(|e| panic!("{algo} {coll}: {e}"));
                        for big_n in targets(c) {
                            let what = format!("{algo} {coll} at count {big_n}");
                            let q = instantiate(&p, big_n).unwrap_or_else(|e| panic!("{what}: {e}"));
                            assert_eq!(q.collective, Collective { count: big_n, ..coll }, "{what}");
                            assert_eq!((q.step_count(), q.in_place, &q.name), (p.step_count(), p.in_place, &p.name));
                            let report = verify_both(&q, &what);
                            let (sent, recv) = scaled_bytes(&p, big_n);
                            assert_eq!(report.sent_bytes, sent, "{what}: bytes sent");
                            assert_eq!(report.recv_bytes, recv, "{what}: bytes received");
                            let built_n = Collective { count: big_n, ..coll };
                            assert_eq!(report.total_sent(), common::expected_total(algo, &built_n), "{what}");
                            if let (true, Some(want)) =
                                (count_independent(algo, kind), common::expected_sent(algo, &built_n))
                            {
                                assert_eq!(report.sent_bytes, want, "{what}: the algorithm's per-rank volume");
                            }
                            if count_independent(algo, kind) && big_n > 0 {
                                let built = build(algo, &built_n, &opts).unwrap();
                                assert_eq!(q, built, "{what}: differs from the program built for {big_n}");
                                same_as_built += 1;
                            }
                            runs += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(runs > 19_000 && same_as_built > 15_000, "{runs} runs, {same_as_built} equal to a build");
}

#[test]
fn pipelined_programs_are_aligned_and_run_at_every_count() {
    // Small chunks cut every slice into pipeline pieces: the pieces of a
    // message line up on both ends, so the programs stay aligned.
    let opts = BuildOptions { chunk_bytes: 8, max_chunks: 3 };
    for algo in ALIGNED {
        for &kind in algo.kinds() {
            for n in RANKS {
                for c in [7, 16] {
                    let coll = Collective::new(kind, n, c).with_root(n / 2);
                    let p = build(algo, &coll, &opts).unwrap();
                    check_aligned(&p).unwrap_or_else(|e| panic!("{algo} {coll} in chunks: {e}"));
                    for big_n in targets(c) {
                        let q = instantiate(&p, big_n).unwrap();
                        let what = format!("{algo} {coll} in chunks at count {big_n}");
                        let report = verify_both(&q, &what);
                        assert_eq!(report.sent_bytes, scaled_bytes(&p, big_n).0, "{what}");
                    }
                }
            }
        }
    }
}

#[test]
fn at_multiples_of_the_count_even_split_programs_are_the_built_ones() {
    // Algorithms that split the count in balanced parts are not
    // count-independent: at N = 3 a ring written for C = 6 on 3 ranks has
    // blocks of 2, 1 and 0 elements (the rule gives the first elements of
    // every block the remainder), where the ring built for 3 has 1, 1, 1.
    // When C divides N the rule is uniform scaling and, for balanced
    // splits of C into equal parts, gives the program built for N, bytes
    // and all.
    let opts = BuildOptions::default();
    for n in [2, 3, 4, 8] {
        let coll = Collective::new(CollKind::AllReduce, n, 2 * n);
        for algo in [Algorithm::Ring, Algorithm::TwoShot, Algorithm::Rhd, Algorithm::Tree] {
            let p = build(algo, &coll, &opts).unwrap();
            for m in [1, 5, 100] {
                let big = Collective { count: m * 2 * n, ..coll };
                let (got, built) = (instantiate(&p, big.count).unwrap(), build(algo, &big, &opts).unwrap());
                assert_eq!(got, built, "{algo} {big}");
                let (a, b) = (verify(&got).unwrap(), verify(&built).unwrap());
                assert_eq!((a.sent_bytes, a.recv_bytes), (b.sent_bytes, b.recv_bytes), "{algo} {big}");
            }
        }
    }
    let p = build(Algorithm::Ring, &Collective::new(CollKind::AllReduce, 3, 6), &opts).unwrap();
    let r = verify(&instantiate(&p, 3).unwrap()).unwrap();
    // Rank r sends every block once and block r-1 twice (it starts the
    // reduce-scatter of r-1 and forwards r-1 in the all-gather).
    assert_eq!(r.sent_bytes, [12, 20, 16]);
}

/// The README's hand-written 2-rank all-reduce of 4 floats.
const README: &str = include_str!("../../../../tests/programs/hand.json");

#[test]
fn the_readme_program_runs_at_every_count() {
    let p = Program::from_json(README).unwrap();
    check_aligned(&p).unwrap();
    for n in (0..=40).chain([997, 1 << 20]) {
        let q = instantiate(&p, n).unwrap();
        let r = verify(&q).unwrap_or_else(|e| panic!("count {n}: {e}"));
        // Each rank sends the half it does not reduce, then the half it
        // reduced: ⌈n/2⌉ + ⌊n/2⌋ elements for rank 0 (block [0, pos(2))
        // is the longer half), the same for rank 1.
        assert_eq!(r.sent_bytes, vec![4 * n as u64; 2], "count {n}");
        assert_eq!(r.messages, 4);
    }
    // At 5: the first half is 3 elements, the second 2.
    let q = instantiate(&p, 5).unwrap();
    assert_eq!(q.ranks[0].channels[0][0], Step::Send { peer: 1, src: Slice::input(3, 2) });
    assert_eq!(q.ranks[1].channels[0][3], Step::Recv { peer: 0, dst: Slice::output(0, 3) });
    // At 1 the second half is empty: the steps stay, with empty slices.
    let q = instantiate(&p, 1).unwrap();
    assert_eq!(q.ranks[1].channels[0][0], Step::Send { peer: 0, src: Slice::input(0, 1) });
    assert_eq!(
        q.ranks[1].channels[0][1],
        Step::RecvReduce { peer: 0, src: Slice::input(1, 0), dst: Slice::output(1, 0) }
    );
}

/// A correct 2-rank all-gather of 3 elements that stages two of rank 0's
/// elements one place further in scratch: right at 3 (and at every
/// multiple), but the staged copy is not index-aligned.
fn misaligned() -> Program {
    let mut p = Program::new("staged", Collective::new(CollKind::AllGather, 2, 3));
    p.ranks[0].scratch = 3;
    let steps0 = [
        Step::Copy { src: Slice::input(0, 3), dst: Slice::output(0, 3) },
        Step::Copy { src: Slice::input(0, 2), dst: Slice::scratch(1, 2) },
        Step::Send { peer: 1, src: Slice::scratch(1, 2) },
        Step::Send { peer: 1, src: Slice::input(2, 1) },
        Step::Recv { peer: 1, dst: Slice::output(3, 3) },
    ];
    let steps1 = [
        Step::Copy { src: Slice::input(0, 3), dst: Slice::output(3, 3) },
        Step::Recv { peer: 0, dst: Slice::output(0, 2) },
        Step::Recv { peer: 0, dst: Slice::output(2, 1) },
        Step::Send { peer: 0, src: Slice::input(0, 3) },
    ];
    for s in steps0 {
        p.push(0, 0, s);
    }
    for s in steps1 {
        p.push(1, 0, s);
    }
    p
}

#[test]
fn a_misaligned_program_runs_only_at_multiples() {
    let p = misaligned();
    verify(&p).unwrap();
    let e = check_aligned(&p).unwrap_err();
    assert!(matches!(e, oxccl_core::Error::InvalidProgram(_)), "{e:?}");
    let e = e.to_string();
    for part in ["rank 0 channel 0 step 1", "input[0..2]", "scratch[1..3]", "not index-aligned", "(0 and 1)"] {
        assert!(e.contains(part), "{e:?} does not mention {part:?}");
    }
    for n in [0, 3, 6, 9, 300] {
        let q = instantiate(&p, n).unwrap_or_else(|e| panic!("count {n}: {e}"));
        let r = verify(&q).unwrap_or_else(|e| panic!("count {n}: {e}"));
        assert_eq!(r.sent_bytes, vec![4 * n as u64; 2]);
    }
    for n in [1, 2, 4, 5, 7, 1000] {
        let e = instantiate(&p, n).unwrap_err().to_string();
        for part in ["rank 0 channel 0 step 1", "not index-aligned", "multiples of its count 3", &format!("not at {n}")]
        {
            assert!(e.contains(part), "count {n}: {e:?} does not mention {part:?}");
        }
    }
    // The scaled staging would really break: at 4, input[0..2] is 3
    // elements but scratch[1..3] only 2 (the rule applied by hand).
    assert_eq!((scaled_len(3, 4, &Slice::input(0, 2)), scaled_len(3, 4, &Slice::scratch(1, 2))), (3, 2));
}

#[test]
fn a_misaligned_message_names_both_ends() {
    // Rank 1 receives rank 0's input[0..2] at output[1..3]: same length,
    // another offset within the block.
    let mut p = Program::new("shifted", Collective::new(CollKind::SendRecv, 2, 4));
    p.push(0, 0, Step::Send { peer: 1, src: Slice::input(0, 2) });
    p.push(1, 0, Step::Recv { peer: 0, dst: Slice::output(1, 2) });
    let e = check_aligned(&p).unwrap_err().to_string();
    for part in ["rank 1 channel 0 step 0", "rank 0 channel 0 step 0", "input[0..2]", "output[1..3]"] {
        assert!(e.contains(part), "{e:?} does not mention {part:?}");
    }
    // Matching is by order on the connection: the second send pairs with
    // the second receive.
    let mut p = Program::new("order", Collective::new(CollKind::SendRecv, 2, 4));
    p.push(0, 0, Step::Send { peer: 1, src: Slice::input(0, 2) });
    p.push(0, 0, Step::Send { peer: 1, src: Slice::input(2, 2) });
    p.push(1, 0, Step::Recv { peer: 0, dst: Slice::output(0, 2) });
    p.push(1, 0, Step::Recv { peer: 0, dst: Slice::output(0, 2) });
    let e = check_aligned(&p).unwrap_err().to_string();
    assert!(e.contains("rank 1 channel 0 step 1") && e.contains("rank 0 channel 0 step 1"), "{e}");
}

#[test]
fn edge_cases_are_refused_with_reasons() {
    let p = build(Algorithm::Ring, &Collective::new(CollKind::AllReduce, 4, 0), &BuildOptions::default()).unwrap();
    assert_eq!(instantiate(&p, 0).unwrap(), p);
    let e = instantiate(&p, 5).unwrap_err().to_string();
    assert!(e.contains("count 0") && e.contains("not 5"), "{e}");
    let p = Program::from_json(README).unwrap();
    let e = instantiate(&p, usize::MAX / 2).unwrap_err().to_string();
    assert!(e.contains("hand: at count") && e.contains("overflow the address space"), "{e}");
    // A slice far outside its buffer is named, not a panic.
    let mut bad = p.clone();
    bad.ranks[0].channels[0][0] = Step::Send { peer: 1, src: Slice::new(Buf::Input, usize::MAX - 1, 1) };
    let e = instantiate(&bad, 8).unwrap_err().to_string();
    assert!(e.contains("rank 0 channel 0 step 0") && e.contains("overflows"), "{e}");
}

#[test]
fn one_sided_peers_of_the_direct_algorithms() {
    let opts = BuildOptions::default();
    let p = build(Algorithm::Direct, &Collective::new(CollKind::Broadcast, 5, 8).with_root(2), &opts).unwrap();
    let root = one_sided_peers(&p, 2);
    assert_eq!((root.accesses, root.accessed_by), (vec![], vec![0, 1, 3, 4]));
    let leaf = one_sided_peers(&p, 4);
    assert_eq!((leaf.accesses, leaf.accessed_by), (vec![2], vec![]));
    let p = build(Algorithm::OneShot, &Collective::new(CollKind::AllReduce, 4, 8), &opts).unwrap();
    let all = one_sided_peers(&p, 1);
    assert_eq!((all.accesses, all.accessed_by), (vec![0, 2, 3], vec![0, 2, 3]));
    let p = build(Algorithm::Ring, &Collective::new(CollKind::AllReduce, 4, 8), &opts).unwrap();
    assert_eq!(one_sided_peers(&p, 0), Default::default());
}

/// The peers of `rank` found by reading every rank's steps for that rank
/// alone (what `one_sided_peers` did before it came from the one pass of
/// `one_sided_peers_all`): the reference the one pass is checked against.
fn peers_of_one_rank(p: &oxccl_algo::ir::Program, rank: usize) -> oxccl_algo::scale::OneSidedPeers {
    use oxccl_algo::ir::Step;
    let mut out = oxccl_algo::scale::OneSidedPeers::default();
    for (r, rp) in p.ranks.iter().enumerate() {
        for step in rp.steps() {
            if let Step::Put { peer, .. } | Step::Get { peer, .. } | Step::GetReduce { peer, .. } = step {
                if r == rank {
                    out.accesses.push(*peer);
                } else if *peer == rank {
                    out.accessed_by.push(r);
                }
            }
        }
    }
    for v in [&mut out.accesses, &mut out.accessed_by] {
        v.sort_unstable();
        v.dedup();
    }
    out
}

#[test]
fn one_sided_peers_of_every_rank_at_once_are_each_ranks() {
    let opts = BuildOptions::default();
    let mut checked = 0;
    for algo in Algorithm::ALL {
        for &kind in algo.kinds() {
            for n in [1, 2, 3, 5, 8] {
                let c = Collective::new(kind, n, 40).with_root(n - 1);
                let Ok(p) = build(algo, &c, &opts) else { continue };
                let all = one_sided_peers_all(&p);
                assert_eq!(all.len(), n);
                for (r, peers) in all.iter().enumerate() {
                    assert_eq!(*peers, peers_of_one_rank(&p, r), "{algo} {kind} n {n} rank {r}");
                    assert_eq!(*peers, one_sided_peers(&p, r), "{algo} {kind} n {n} rank {r}");
                }
                checked += p.has_one_sided() as usize;
            }
        }
    }
    assert!(checked > 10, "{checked} one-sided programs");
}
