//! Tests of link parsing, topologies and the closed forms.

use super::*;
use crate::algos::{Algorithm, estimate};
use crate::collective::CollKind;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
}

#[test]
fn bandwidths_parse_with_every_unit() {
    for (text, want) in [
        ("450GB/s", 450e9),
        ("50 GB/s", 50e9),
        ("100Gb/s", 12.5e9),
        ("25GiB/s", 25.0 * 1073741824.0),
        ("1.5TB/s", 1.5e12),
        ("800MB/s", 800e6),
        ("10KB/s", 1e4),
        ("10kB/s", 1e4),
        ("8b/s", 1.0),
        ("1e3B/s", 1e3),
        ("400Gbps", 50e9),
    ] {
        assert!(close(parse_bandwidth(text).unwrap(), want), "{text}");
    }
    assert_eq!(parse_bandwidth("inf").unwrap(), f64::INFINITY);
    for bad in ["", "GB/s", "450", "450GB", "450XB/s", "-5GB/s", "0GB/s", "fastGB/s"] {
        let e = parse_bandwidth(bad).unwrap_err().to_string();
        assert!(e.contains("bandwidth") && e.contains("450GB/s"), "{bad}: {e}");
    }
}

#[test]
fn latencies_parse_with_every_unit() {
    for (text, want) in [("0.6us", 0.6e-6), ("5 us", 5e-6), ("500ns", 500e-9), ("2ms", 2e-3), ("1s", 1.0)] {
        assert!(close(parse_latency(text).unwrap(), want), "{text}");
    }
    assert_eq!(parse_latency("0").unwrap(), 0.0);
    assert_eq!(parse_latency("0µs").unwrap(), 0.0);
    for bad in ["5", "us", "5 parsecs", "-1us", ""] {
        assert!(parse_latency(bad).unwrap_err().to_string().contains("latency"), "{bad}");
    }
}

#[test]
fn links_parse_and_print() {
    let l: Link = "450GB/s,0.6us".parse().unwrap();
    assert!(close(l.bw, 450e9) && close(l.lat, 0.6e-6));
    assert_eq!(l.to_string(), "450GB/s,600ns");
    let back: Link = l.to_string().parse().unwrap();
    assert!(close(back.bw, l.bw) && close(back.lat, l.lat));
    let l: Link = " 100Gb/s , 2us ".parse().unwrap();
    assert!(close(l.bw, 12.5e9) && close(l.lat, 2e-6));
    let e = "450GB/s".parse::<Link>().unwrap_err().to_string();
    assert!(e.contains("BANDWIDTH,LATENCY"), "{e}");
    let e = "450GB/s,fast".parse::<Link>().unwrap_err().to_string();
    assert!(e.contains("latency") && e.contains("450GB/s,fast"), "{e}");
}

#[test]
fn topology_places_ranks_by_node() {
    let t = Topology::new(4, 8, Link::new(450e9, 0.6e-6), Link::new(50e9, 5e-6));
    assert_eq!((t.nranks(), t.node_of(7), t.node_of(8), t.node_of(31)), (32, 0, 1, 3));
    assert_eq!(t.link(0, 7), t.intra);
    assert_eq!(t.link(7, 8), t.inter);
    assert_eq!(t.bottleneck(), Link::new(50e9, 5e-6));
    t.validate().unwrap();
    assert!(Topology { nodes: 0, ..t }.validate().is_err());
    assert!(t.with_reduce_bw(0.0).validate().unwrap_err().to_string().contains("reduce"));
    assert!(Topology { intra: Link::new(1e9, -1.0), ..t }.validate().is_err());
}

#[test]
fn closed_forms_match_their_textbook_shapes() {
    let l = Link::new(1e9, 1e-6);
    // Ring: 2(n-1)α + 2(n-1)/n·S/B + (n-1)/n·S·γ.
    assert!(close(ring_all_reduce(8, 8000, l, 1e-10), 14e-6 + 14000e-9 + 7000e-10));
    assert_eq!(ring_all_reduce(1, 8000, l, 0.0), 0.0);
    assert!(close(ring_all_gather(4, 4000, l), 3e-6 + 3000e-9));
    // RHD matches the ring's bandwidth term with log-many latencies.
    assert!(close(rhd_all_reduce(8, 8000, l, 0.0), 6e-6 + 14000e-9));
    assert!(close(rhd_all_reduce(6, 8000, l, 0.0), 4e-6 + 12000e-9 + 2.0 * (1e-6 + 8000e-9)));
    assert!(close(tree_all_reduce(8, 0, l, 0.0), 6e-6));
    assert!(close(tree_all_reduce(5, 0, l, 0.0), 6e-6));
    assert_eq!(log2_ceil(1), 0.0);
    assert_eq!(log2_ceil(1024), 10.0);
    let c = Collective::new(CollKind::AllReduce, 8, 2000);
    let t = Topology::single_node(8, l);
    assert!(close(estimate(Algorithm::Ring, &c, &t).unwrap(), ring_all_reduce(8, 8000, l, 0.0)));
    assert!(estimate(Algorithm::Pairwise, &c, &t).is_none());
}
