//! The algorithm table is consistent: names and aliases unique and parsed
//! back, every collective an entry lists built, verified and priced at a
//! few rank counts, and none it does not list accepted.

use oxccl_algo::algos::estimate;
use oxccl_algo::algos::{Algorithm, BuildOptions, NCCL_ONLY, TABLE, build, is_nccl_only};
use oxccl_algo::cost::{Link, Topology};
use oxccl_algo::verify::verify;
use oxccl_algo::{CollKind, Collective};
use std::collections::HashSet;

const RANKS: [usize; 5] = [1, 2, 3, 5, 8];

#[test]
fn entries_follow_the_enum() {
    assert_eq!(Algorithm::ALL.len(), TABLE.len());
    for (i, (algo, spec)) in Algorithm::ALL.into_iter().zip(TABLE).enumerate() {
        assert_eq!(spec.algorithm, algo, "entry {i}");
        assert_eq!(algo.spec().name, spec.name);
        assert_eq!((algo.name(), algo.kinds(), algo.one_sided()), (spec.name, spec.collectives, spec.one_sided));
        assert_eq!(algo.to_string(), spec.name);
    }
}

#[test]
fn names_and_aliases_are_unique_and_parse_back() {
    let mut seen = HashSet::new();
    for spec in TABLE {
        for name in std::iter::once(&spec.name).chain(spec.aliases) {
            assert!(seen.insert(*name), "{name} names two algorithms");
            assert_eq!(*name, name.to_ascii_lowercase(), "{name}: names are lowercase");
            assert!(!name.is_empty() && !name.contains([',', ';', ':', '^', ' ']), "{name:?}: not a list item");
            assert!(!is_nccl_only(name), "{name} is also listed as an algorithm oxccl lacks");
            assert_eq!(name.parse::<Algorithm>().unwrap(), spec.algorithm, "{name}");
            assert_eq!(name.to_ascii_uppercase().parse::<Algorithm>().unwrap(), spec.algorithm, "{name} in capitals");
        }
        // The serde name (JSON) is a name too.
        let json = serde_json::to_string(&spec.algorithm).unwrap();
        assert_eq!(json.trim_matches('"').parse::<Algorithm>().unwrap(), spec.algorithm, "{json}");
        let unique: HashSet<_> = spec.collectives.iter().collect();
        assert_eq!(unique.len(), spec.collectives.len(), "{}: a collective listed twice", spec.name);
        assert!(!spec.collectives.is_empty(), "{} builds nothing", spec.name);
    }
    for name in NCCL_ONLY {
        assert!(name.parse::<Algorithm>().is_err(), "{name}");
        assert!(is_nccl_only(&name.to_ascii_uppercase()));
    }
    let e = "spiral".parse::<Algorithm>().unwrap_err().to_string();
    for spec in TABLE {
        assert!(e.contains(spec.name), "{e} does not offer {}", spec.name);
    }
}

#[test]
fn every_listed_collective_builds_verifies_and_has_a_cost() {
    let link = Link::new(25e9, 3e-6);
    let opts = BuildOptions { chunk_bytes: 64, max_chunks: 4 };
    for spec in TABLE {
        let mut built_one_sided = false;
        for &kind in spec.collectives {
            for n in RANKS {
                let topo = Topology::single_node(n, link).with_reduce_bw(40e9).with_copy_bw(80e9);
                for count in [0, 1, 7, 3 * n + 1] {
                    let c = Collective::new(kind, n, count).with_root(n - 1);
                    let what = format!("{} {c}", spec.name);
                    let p = build(spec.algorithm, &c, &opts).unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert_eq!((p.name.as_str(), p.collective), (spec.name, c), "{what}: program names");
                    verify(&p).unwrap_or_else(|e| panic!("{what}: {e}"));
                    built_one_sided |= p.has_one_sided();
                    let t = estimate(spec.algorithm, &c, &topo).unwrap_or_else(|| panic!("{what}: no cost"));
                    assert!(t.is_finite() && t >= 0.0, "{what}: cost {t}");
                    if n > 1 && c.size_bytes() > 0 {
                        assert!(t >= link.lat, "{what}: {t} s is less than one message");
                    }
                }
            }
        }
        // Priced with the links it uses: an entry whose programs read or
        // write peers' buffers must say so.
        assert!(!built_one_sided || spec.one_sided, "{} builds one-sided steps but is not one_sided", spec.name);
        assert!(!spec.one_sided || built_one_sided, "{} is one_sided but builds no one-sided step", spec.name);
    }
}

#[test]
fn unlisted_collectives_are_refused_and_unpriced() {
    let topo = Topology::single_node(4, Link::new(25e9, 3e-6));
    for spec in TABLE {
        for kind in CollKind::ALL.into_iter().filter(|k| !spec.collectives.contains(k)) {
            let c = Collective::new(kind, 4, 8);
            let e = build(spec.algorithm, &c, &BuildOptions::default()).unwrap_err().to_string();
            assert!(e.contains(spec.name) && e.contains(kind.name()), "{e}");
            assert_eq!(estimate(spec.algorithm, &c, &topo), None, "{} {kind}", spec.name);
        }
    }
}

#[test]
fn every_collective_has_an_algorithm() {
    for kind in CollKind::ALL {
        assert!(!Algorithm::for_kind(kind).is_empty(), "nothing builds {kind}");
    }
}
