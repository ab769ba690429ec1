//! Programs round-trip through JSON, and a hand-written one verifies.

use oxccl_algo::algos::{Algorithm, BuildOptions, build};
use oxccl_algo::verify::verify;
use oxccl_algo::{CollKind, Collective, Program};

#[test]
fn every_algorithm_round_trips() {
    for algo in Algorithm::ALL {
        for &kind in algo.kinds() {
            let c = Collective::new(kind, 5, 13).with_root(2);
            let p = build(algo, &c, &BuildOptions::default()).unwrap();
            let back = Program::from_json(&p.to_json()).unwrap();
            assert_eq!(back, p, "{algo} {kind}");
            assert_eq!(verify(&back).unwrap(), verify(&p).unwrap());
        }
    }
}

#[test]
fn hand_written_program_verifies_and_counts() {
    // Two ranks, all-reduce of 4 floats: exchange halves, reduce, exchange
    // results (reduce-scatter + all-gather by hand).
    let text = r#"{
      "name": "hand",
      "collective": {"kind": "all_reduce", "nranks": 2, "count": 4, "dtype": "float32"},
      "ranks": [
        {"channels": [[
          {"op": "send", "peer": 1, "src": "input[2..4]"},
          {"op": "recv_reduce", "peer": 1, "src": "input[0..2]", "dst": "output[0..2]"},
          {"op": "send", "peer": 1, "src": "output[0..2]"},
          {"op": "recv", "peer": 1, "dst": "output[2..4]"}
        ]]},
        {"channels": [[
          {"op": "send", "peer": 0, "src": "input[0..2]"},
          {"op": "recv_reduce", "peer": 0, "src": "input[2..4]", "dst": "output[2..4]"},
          {"op": "send", "peer": 0, "src": "output[2..4]"},
          {"op": "recv", "peer": 0, "dst": "output[0..2]"}
        ]]}
      ]
    }"#;
    let p = Program::from_json(text).unwrap();
    assert_eq!(p.collective, Collective::new(CollKind::AllReduce, 2, 4));
    let r = verify(&p).unwrap();
    assert_eq!(r.sent_bytes, vec![16, 16]);
    assert_eq!(r.messages, 4);
    let bad = text.replace("\"src\": \"input[2..4]\"}", "\"src\": \"input[2..5]\"}");
    assert!(verify(&Program::from_json(&bad).unwrap()).unwrap_err().to_string().contains("outside"));
    assert!(Program::from_json("{\"name\": 1}").unwrap_err().to_string().contains("line 1"));
}

#[test]
fn building_into_a_used_program_equals_a_fresh_build() {
    use oxccl_algo::algos::build_into;
    let mut reused = Program::new("", Collective::new(CollKind::AllReduce, 1, 0));
    // Alternate algorithms, sizes and rank counts so that leftovers would show.
    for (algo, kind, n, count) in [
        (Algorithm::Tree, CollKind::AllReduce, 9, 1000),
        (Algorithm::Ring, CollKind::AllReduce, 5, 10),
        (Algorithm::TwoShot, CollKind::AllReduce, 12, 77),
        (Algorithm::Rhd, CollKind::ReduceScatter, 3, 5),
        (Algorithm::Tree, CollKind::Broadcast, 7, 3),
    ] {
        let c = Collective::new(kind, n, count).with_root(n - 1);
        build_into(algo, &c, &BuildOptions::default(), &mut reused).unwrap();
        assert_eq!(reused, build(algo, &c, &BuildOptions::default()).unwrap(), "{algo} {c}");
    }
    // A failing build leaves the program alone.
    let before = reused.clone();
    let bad = Collective::new(CollKind::AllToAll, 4, 4);
    assert!(build_into(Algorithm::Ring, &bad, &BuildOptions::default(), &mut reused).is_err());
    assert_eq!(reused, before);
}
