//! Algorithms that follow the hosts: the ring along [`Placement::ring`] and
//! the hierarchical algorithms, verified at several hosts × ranks-per-host
//! shapes numbered blocked and cyclically, out of place and in place, with
//! the elements that cross hosts counted against their formulas.

use oxccl_algo::algos::{Algorithm, BuildOptions, build, build_on};
use oxccl_algo::cost::{Link, Topology};
use oxccl_algo::placement::Placement;
use oxccl_algo::sim::{simulate, simulate_on};
use oxccl_algo::verify::{VerifyOptions, verify, verify_with};
use oxccl_algo::{CollKind, Collective, Program};

const SHAPES: [(usize, usize); 7] = [(2, 2), (2, 3), (3, 2), (3, 3), (4, 2), (2, 4), (3, 4)];
const COUNTS: [usize; 5] = [0, 1, 7, 1000, 1009];

fn placements() -> impl Iterator<Item = Placement> {
    SHAPES.into_iter().flat_map(|(h, l)| [Placement::blocked(h, l), Placement::cyclic(h, l)])
}

fn check(p: &Program, what: &str) {
    verify(p).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(p.in_place, "{what} claims in-place safety");
    verify_with(p, &VerifyOptions { in_place: true, ..Default::default() })
        .unwrap_or_else(|e| panic!("{what} in place: {e}"));
}

#[test]
fn ring_and_hier_verify_on_every_shape_and_numbering() {
    // Small chunks so that every phase pipelines several chunks.
    let opts = BuildOptions { chunk_bytes: 64, max_chunks: 4 };
    let mut runs = 0;
    for at in placements() {
        let n = at.nranks();
        for count in COUNTS {
            for (algo, kind) in [
                (Algorithm::Ring, CollKind::AllReduce),
                (Algorithm::Ring, CollKind::ReduceScatter),
                (Algorithm::Ring, CollKind::AllGather),
                (Algorithm::Hier, CollKind::AllReduce),
                (Algorithm::Hier, CollKind::ReduceScatter),
                (Algorithm::Hier, CollKind::AllGather),
                (Algorithm::Hier, CollKind::AllToAll),
                (Algorithm::Tree, CollKind::AllReduce),
            ] {
                let c = Collective::new(kind, n, count);
                let p = build_on(algo, &c, &opts, &at).unwrap();
                assert_eq!(p.name, algo.name());
                if algo == Algorithm::Hier && count >= 1000 && kind != CollKind::AllToAll {
                    // Two channels: one half's phase inside the hosts
                    // overlaps the other's across them.
                    assert_eq!(p.ranks[0].channels.len(), 2, "{c} on {at}");
                }
                check(&p, &format!("{algo} {c} on {at}"));
                runs += 1;
            }
            for kind in [CollKind::Broadcast, CollKind::Reduce] {
                for root in 0..n {
                    let c = Collective::new(kind, n, count).with_root(root);
                    let p = build_on(Algorithm::Ring, &c, &opts, &at).unwrap();
                    check(&p, &format!("ring {c} on {at}"));
                    // The chain crosses from host to host once each.
                    let crossing = at.crossing_elems(&p).unwrap();
                    assert_eq!(crossing, ((at.nhosts() - 1) * count) as u64, "ring {c} on {at}");
                }
            }
        }
    }
    assert_eq!(runs, 2 * SHAPES.len() * COUNTS.len() * 8);
}

/// Elements crossing hosts, per algorithm, for counts the blocks divide.
#[test]
fn elements_crossing_hosts_match_the_formulas() {
    let opts = BuildOptions::default();
    for at in placements() {
        let (n, h) = (at.nranks(), at.nhosts());
        let count = 4 * n * 3; // divisible by n, by L and by H·L
        let (nn, hh) = (n as u64, h as u64);
        let cross = |algo, kind, on: &Placement| {
            let c = Collective::new(kind, n, count);
            on.crossing_elems(&build_on(algo, &c, &opts, on).unwrap()).map(|x| (x, c))
        };
        let s = count as u64;
        // All-reduce: the ring that follows the hosts crosses H times, each
        // hop carrying 2(n-1)/n·S; hier 2(H-1)·S in all, the lower bound.
        let (ring, _) = cross(Algorithm::Ring, CollKind::AllReduce, &at).unwrap();
        assert_eq!(ring, hh * 2 * (nn - 1) * s / nn, "ring on {at}");
        let (hier, _) = cross(Algorithm::Hier, CollKind::AllReduce, &at).unwrap();
        assert_eq!(hier, 2 * (hh - 1) * s, "hier on {at}");
        // The trees over hosts: H-1 crossing edges each, half the data up
        // and down each: the same lower bound.
        let (tree, _) = cross(Algorithm::Tree, CollKind::AllReduce, &at).unwrap();
        assert_eq!(tree, 2 * (hh - 1) * s, "tree on {at}");
        // The rank-order ring built without a placement: every hop of it
        // crosses when the numbering is cyclic.
        let flat = build(Algorithm::Ring, &Collective::new(CollKind::AllReduce, n, count), &opts).unwrap();
        let rank_order = at.crossing_elems(&flat).unwrap();
        if at == Placement::cyclic(h, n / h) {
            assert_eq!(rank_order, 2 * (nn - 1) * s, "rank-order ring on {at}");
        } else {
            assert_eq!(rank_order, ring, "rank-order ring on {at}");
        }
        // Reduce-scatter and all-gather of S = n·count: the ring crosses H
        // times with (n-1) blocks each; hier sends each block across once
        // per other host: n(H-1) blocks.
        for kind in [CollKind::ReduceScatter, CollKind::AllGather] {
            let (ring, _) = cross(Algorithm::Ring, kind, &at).unwrap();
            assert_eq!(ring, hh * (nn - 1) * s, "ring {kind} on {at}");
            let (hier, _) = cross(Algorithm::Hier, kind, &at).unwrap();
            assert_eq!(hier, nn * (hh - 1) * s, "hier {kind} on {at}");
        }
    }
}

/// All-to-all aggregated per host and rail: the same bytes cross hosts as
/// pairwise exchange moves, in H-1 messages per rank instead of (H-1)·L.
#[test]
fn hier_all_to_all_sends_one_message_per_host_pair_and_rail() {
    let opts = BuildOptions::default();
    for at in placements() {
        let (n, h, l) = (at.nranks(), at.nhosts(), at.per_host().unwrap());
        let c = Collective::new(CollKind::AllToAll, n, 100);
        let crossing = |p: &Program| {
            let msgs: Vec<usize> = (0..n)
                .map(|r| p.ranks[r].steps().filter(|s| s.send_peer().is_some_and(|q| at.crosses(r, q))).count())
                .collect();
            (at.crossing_elems(p).unwrap(), msgs)
        };
        let (hier_elems, hier_msgs) = crossing(&build_on(Algorithm::Hier, &c, &opts, &at).unwrap());
        let (pair_elems, pair_msgs) = crossing(&build_on(Algorithm::Pairwise, &c, &opts, &at).unwrap());
        assert_eq!(hier_elems, pair_elems, "{at}");
        assert_eq!(hier_elems, (n * (h - 1) * l * 100) as u64, "{at}");
        assert!(hier_msgs.iter().all(|&m| m == h - 1), "{at}: {hier_msgs:?}");
        assert!(pair_msgs.iter().all(|&m| m == (h - 1) * l), "{at}: {pair_msgs:?}");
    }
}

#[test]
fn hier_is_the_ring_where_there_is_no_hierarchy() {
    let opts = BuildOptions::default();
    for at in [Placement::flat(5), Placement::cyclic(5, 1), Placement::from_keys(&[0, 0, 1, 1, 1])] {
        for kind in [CollKind::AllReduce, CollKind::ReduceScatter, CollKind::AllGather] {
            let c = Collective::new(kind, 5, 100);
            let (mut hier, ring) = (
                build_on(Algorithm::Hier, &c, &opts, &at).unwrap(),
                build_on(Algorithm::Ring, &c, &opts, &at).unwrap(),
            );
            assert_eq!(hier.name, "hier");
            hier.name = ring.name.clone();
            assert_eq!(hier, ring, "{kind} on {at}");
        }
    }
}

#[test]
fn a_placement_of_another_size_is_refused() {
    let c = Collective::new(CollKind::AllReduce, 4, 10);
    let e = build_on(Algorithm::Hier, &c, &BuildOptions::default(), &Placement::blocked(2, 3)).unwrap_err();
    assert!(e.to_string().contains("placement (2x3) has 6"), "{e}");
}

/// The simulator prices programs on the links they take: on cyclically
/// numbered hosts, the rank-order ring pays a network hop per step, the
/// ring that follows the hosts does not, and hier less again.
#[test]
fn the_simulator_sees_the_placement() {
    let (intra, inter): (Link, Link) = ("450GB/s,0.6us".parse().unwrap(), "50GB/s,5us".parse().unwrap());
    let topo = Topology::new(2, 4, intra, inter);
    let at = Placement::cyclic(2, 4);
    let c = Collective::new(CollKind::AllReduce, 8, 16 << 20);
    let opts = BuildOptions::default();
    let time = |p: &Program| simulate_on(p, &topo, &at).unwrap().time;
    let rank_order = time(&build(Algorithm::Ring, &c, &opts).unwrap());
    let ring = time(&build_on(Algorithm::Ring, &c, &opts, &at).unwrap());
    let hier = time(&build_on(Algorithm::Hier, &c, &opts, &at).unwrap());
    assert!(rank_order > 3.0 * ring, "rank-order {rank_order} ring {ring}");
    assert!(ring > 1.4 * hier, "ring {ring} hier {hier}");
    // On blocked numbering, the placement changes nothing.
    let blocked = Placement::blocked(2, 4);
    let p = build_on(Algorithm::Hier, &c, &opts, &blocked).unwrap();
    assert_eq!(simulate_on(&p, &topo, &blocked).unwrap(), simulate(&p, &topo).unwrap());
    let e = simulate_on(&p, &topo, &Placement::blocked(4, 2)).unwrap_err();
    assert!(e.to_string().contains("not the topology's 2 nodes × 4 ranks"), "{e}");
}

/// With a NIC per local rank (rail-optimized), the rail-aligned rings of
/// `hier` use every NIC; the single ring uses one.
#[test]
fn rails_carry_hier_and_not_the_single_ring() {
    let (intra, inter): (Link, Link) = ("450GB/s,0.6us".parse().unwrap(), "50GB/s,5us".parse().unwrap());
    let c = Collective::new(CollKind::AllReduce, 16, 64 << 20);
    let opts = BuildOptions::default();
    let at = Placement::blocked(2, 8);
    let (ring, hier) =
        (build_on(Algorithm::Ring, &c, &opts, &at).unwrap(), build_on(Algorithm::Hier, &c, &opts, &at).unwrap());
    let one = Topology::new(2, 8, intra, inter);
    let eight = one.with_nics(8);
    let t = |p: &Program, topo: &Topology| simulate(p, topo).unwrap().time;
    // The ring's crossings leave from local rank 7 and arrive at local
    // rank 0: one NIC each way, however many there are.
    assert!((t(&ring, &eight) - t(&ring, &one)).abs() < 1e-9 * t(&ring, &one));
    // hier's 8 rings across hosts each get a NIC of their own (what is
    // left is the phases inside the hosts: about 1 ms of the 1.9).
    assert!(t(&hier, &one) > 3.0 * t(&hier, &eight), "{} {}", t(&hier, &one), t(&hier, &eight));
    assert!(t(&ring, &eight) > 4.0 * t(&hier, &eight));
    assert!(Topology::new(2, 8, intra, inter).with_nics(0).validate().is_err());
    assert_eq!((eight.nic_of(0), eight.nic_of(7), eight.nic_of(8), eight.nic_of(15)), (0, 7, 8, 15));
    assert_eq!(one.with_nics(2).nic_of(5), 1);
}

/// The simulator says which link class bounds a result.
#[test]
fn the_simulator_names_the_bound() {
    use oxccl_algo::sim::Bound;
    let (intra, inter): (Link, Link) = ("450GB/s,0.6us".parse().unwrap(), "50GB/s,5us".parse().unwrap());
    let opts = BuildOptions::default();
    let big = Collective::new(CollKind::AllReduce, 16, 64 << 20);
    let at = Placement::blocked(2, 8);
    let topo = Topology::new(2, 8, intra, inter);
    let ring = simulate(&build_on(Algorithm::Ring, &big, &opts, &at).unwrap(), &topo).unwrap();
    assert!(matches!(ring.bound(), Bound::Nic(x) if x > 0.9), "{}", ring.bound());
    let one = Topology::single_node(8, intra);
    let c = Collective::new(CollKind::AllReduce, 8, 64 << 20);
    let r = simulate(&build(Algorithm::Ring, &c, &opts).unwrap(), &one).unwrap();
    assert!(matches!(r.bound(), Bound::Port(x) if x > 0.8), "{}", r.bound());
    assert_eq!(r.nic_busy, 0.0);
    let tiny = Collective::new(CollKind::AllReduce, 8, 2);
    let r = simulate(&build(Algorithm::Ring, &tiny, &opts).unwrap(), &one).unwrap();
    assert!(matches!(r.bound(), Bound::Latency(_)), "{}", r.bound());
}

/// Bruck's all-gather and reduce-scatter: ⌈log2 n⌉ messages per rank,
/// (n-1) blocks sent, correct in and out of place at every rank count.
#[test]
fn bruck_sends_log2_messages_and_verifies_in_place() {
    let opts = BuildOptions::default();
    for n in (1..=33).chain([64, 100]) {
        for count in [0, 1, 7, 1000] {
            for kind in [CollKind::AllGather, CollKind::ReduceScatter] {
                let c = Collective::new(kind, n, count);
                let p = build(Algorithm::Bruck, &c, &opts).unwrap();
                check(&p, &format!("bruck {c}"));
                let log = n.next_power_of_two().trailing_zeros() as usize;
                for (r, rp) in p.ranks.iter().enumerate() {
                    let sends = rp.steps().filter(|s| s.send_peer().is_some()).count();
                    assert_eq!(sends, if count > 0 { log } else { 0 }, "bruck {c}: rank {r}");
                }
                let report = verify(&p).unwrap();
                assert!(report.sent_bytes.iter().all(|&b| b == ((n - 1) * count * 4) as u64), "bruck {c}");
            }
        }
    }
}
