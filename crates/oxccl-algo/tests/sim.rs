//! The simulator against the closed forms of the cost model, on the
//! programs the algorithms generate.

use oxccl_algo::algos::{Algorithm, BuildOptions, build};
use oxccl_algo::cost::{Link, Topology, log2_ceil, rhd_all_reduce, ring_all_reduce};
use oxccl_algo::sim::simulate;
use oxccl_algo::{CollKind, Collective, Program};

const ONE_CHUNK: BuildOptions = BuildOptions { chunk_bytes: usize::MAX, max_chunks: 1 };

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs()
}

/// Both uniform shapes of `n` ranks: one node, and one rank per node.
fn uniform(n: usize, link: Link) -> [Topology; 2] {
    [Topology::single_node(n, link), Topology::one_rank_per_node(n, link)]
}

fn all_reduce(algo: Algorithm, n: usize, count: usize, opts: &BuildOptions) -> Program {
    build(algo, &Collective::new(CollKind::AllReduce, n, count), opts).unwrap()
}

#[test]
fn ring_all_reduce_reproduces_the_closed_form() {
    // 2(n-1)·α + 2(n-1)/n·S/B (+ (n-1)/n·S·γ): with one chunk per block
    // every rank sends and receives one block per hop, all hops in step.
    let link = Link::new(50e9, 5e-6);
    for n in [2, 3, 4, 5, 8, 13, 16, 64] {
        for per_rank in [1, 1000, 1 << 16] {
            let count = n * per_rank;
            let p = all_reduce(Algorithm::Ring, n, count, &ONE_CHUNK);
            let s = count * 4;
            for topo in uniform(n, link) {
                let t = simulate(&p, &topo).unwrap().time;
                let want = ring_all_reduce(n, s, link, 0.0);
                assert!(rel(t, want) < 1e-9, "n={n} count={count} {topo}: {t} vs {want}");
                let topo = topo.with_reduce_bw(200e9);
                let t = simulate(&p, &topo).unwrap().time;
                let want = ring_all_reduce(n, s, link, topo.gamma());
                assert!(rel(t, want) < 1e-9, "n={n} count={count} {topo}: {t} vs {want}");
            }
        }
    }
}

#[test]
fn ring_chunks_keep_the_bandwidth_term_and_add_latency() {
    // The ring runs its chunks one after the other (each a full pass of
    // 2(n-1) hops), so k chunks cost 2k(n-1)·α + 2(n-1)/n·S/B.
    let (n, k, link) = (8, 4, Link::new(50e9, 5e-6));
    let count = n * k * 1000;
    let p = all_reduce(Algorithm::Ring, n, count, &BuildOptions { chunk_bytes: 1000 * 4, max_chunks: 64 });
    let t = simulate(&p, &Topology::single_node(n, link)).unwrap().time;
    let want = ring_all_reduce(n, count * 4, link, 0.0) + 2.0 * (k - 1) as f64 * (n - 1) as f64 * link.lat;
    assert!(rel(t, want) < 1e-9, "{t} vs {want}");
}

#[test]
fn rhd_all_reduce_reproduces_the_closed_form() {
    // 2·log2(n)·α + 2(n-1)/n·S/B for n a power of two: partners exchange
    // both ways at once on full-duplex ports.
    let link = Link::new(50e9, 5e-6);
    for n in [2, 4, 8, 32, 256] {
        let count = n * 4096;
        let p = all_reduce(Algorithm::Rhd, n, count, &ONE_CHUNK);
        for topo in uniform(n, link) {
            let t = simulate(&p, &topo).unwrap().time;
            let want = rhd_all_reduce(n, count * 4, link, 0.0);
            assert!(rel(t, want) < 1e-9, "n={n} {topo}: {t} vs {want}");
        }
    }
}

#[test]
fn tree_all_reduce_pays_two_log_n_latencies() {
    // Each of the two trees carries half the data on its own channel.
    // NCCL's binary tree over n = 2^m ranks has depth m (0 → n/2 → n/4 ±
    // … → the odd leaves), and so has its mirror. A chunk climbs m hops to
    // the root, where the broadcast starts and descends m hops; an inner
    // rank receives both children's zero-cost messages at the same time
    // and forwards to both children at once. With infinite bandwidth the
    // time is exactly 2·m·α.
    let inf = Link::new(f64::INFINITY, 1e-6);
    for m in 1..=9 {
        let n = 1usize << m;
        let p = all_reduce(Algorithm::Tree, n, 2, &BuildOptions::default());
        for topo in uniform(n, inf) {
            let t = simulate(&p, &topo).unwrap().time;
            assert!(rel(t, 2.0 * m as f64 * inf.lat) < 1e-12, "n={n}: {t}");
        }
        // At 8 bytes on a real link the latency term is all there is: 2·m
        // hops, plus a few 4-byte transfers.
        let link = Link::new(450e9, 0.6e-6);
        let t = simulate(&p, &Topology::single_node(n, link)).unwrap().time / link.lat;
        assert!((2.0 * m as f64..2.0 * m as f64 + 0.01).contains(&t), "n={n}: {t}·α");
    }
    // Other rank counts: depth at most ⌈log2 n⌉ and at least ⌊log2 n⌋.
    for n in [3, 5, 6, 7, 12, 100, 1000] {
        let p = all_reduce(Algorithm::Tree, n, 2, &BuildOptions::default());
        let t = simulate(&p, &Topology::single_node(n, inf)).unwrap().time / inf.lat;
        let (hi, lo) = (2.0 * log2_ceil(n), 2.0 * (log2_ceil(n) - 1.0));
        assert!(t <= hi + 1e-9 && t >= lo, "n={n}: {t}·α not in [{lo}, {hi}]");
    }
}

#[test]
fn tree_beats_ring_when_small_and_ring_wins_when_large() {
    let topo = Topology::new(16, 8, "450GB/s,0.6us".parse().unwrap(), "50GB/s,5us".parse().unwrap());
    let time = |algo, count| {
        let p = all_reduce(algo, 128, count, &BuildOptions::default());
        simulate(&p, &topo).unwrap().time
    };
    assert!(time(Algorithm::Tree, 1024) < time(Algorithm::Ring, 1024) / 5.0);
    assert!(time(Algorithm::Ring, 1 << 26) < time(Algorithm::Tree, 1 << 26));
}

#[test]
fn every_generated_program_runs_to_completion() {
    // The simulator pairs messages by connection exactly as the verifier
    // does: every program the algorithms generate must finish, and it
    // prices the same whatever the topology's shape as long as the links
    // are the same.
    let link = Link::new(10e9, 2e-6);
    for kind in CollKind::ALL {
        for algo in Algorithm::for_kind(kind) {
            for n in 1..=9 {
                for count in [0, 1, 7, 100] {
                    let coll = Collective::new(kind, n, count).with_root(n / 2);
                    let p = build(algo, &coll, &BuildOptions { chunk_bytes: 16 * 4, max_chunks: 4 }).unwrap();
                    let [a, b] = uniform(n, link);
                    let ra = simulate(&p, &a).unwrap_or_else(|e| panic!("{algo} {coll}: {e}"));
                    let rb = simulate(&p, &b).unwrap();
                    assert!(rel(ra.time, rb.time) < 1e-12 || ra.time == rb.time, "{algo} {coll}");
                    assert_eq!(ra.intra_bytes, rb.inter_bytes, "{algo} {coll}");
                    if count > 0 && n > 1 && kind != CollKind::SendRecv {
                        assert!(ra.time >= link.lat, "{algo} {coll}: {}", ra.time);
                    }
                }
            }
        }
    }
}

#[test]
fn program_json_round_trip_prices_the_same() {
    let p = all_reduce(Algorithm::Tree, 6, 1000, &BuildOptions { chunk_bytes: 100 * 4, max_chunks: 8 });
    let back = Program::from_json(&p.to_json()).unwrap();
    let topo = Topology::new(3, 2, Link::new(100e9, 1e-6), Link::new(12.5e9, 3e-6));
    assert_eq!(simulate(&p, &topo).unwrap(), simulate(&back, &topo).unwrap());
}
