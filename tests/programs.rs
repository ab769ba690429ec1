//! Researchers' programs on real ranks: the README's hand-written program
//! registered and selected like a built-in algorithm, at every size, on
//! every transport; loaded from OXCCL_ALGO_FILE by processes; broken
//! programs refused before anything runs.

use oxccl::{CollKind, Communicator, Config, DataType, Kind, Program, ReduceOp, UniqueId, programs};
use oxccl_e2e::child::{self, fresh_id, output, spawn};
use oxccl_e2e::{on_threads, run_case};

/// The README's program: a 2-rank all-reduce of 4 floats, each rank
/// reducing one half.
pub const README_PROGRAM: &str = include_str!("programs/hand.json");

const COUNTS: [usize; 9] = [0, 1, 2, 3, 4, 5, 1000, 65_537, 1_000_003];

fn hand_config(transport: Option<Kind>) -> Config {
    let id = programs::register(Program::from_json(README_PROGRAM).unwrap()).unwrap();
    Config { programs: vec![id], algo: Some("hand".into()), ..oxccl_e2e::config(transport) }
}

#[test]
fn the_readme_program_runs_at_every_size_on_every_transport() {
    for transport in [None, Some(Kind::Shm), Some(Kind::Tcp)] {
        let cfg = hand_config(transport);
        let hand = oxccl::Choice::Program(cfg.programs[0]);
        on_threads(2, cfg, |c| {
            for count in COUNTS {
                let runs = c.choice(CollKind::AllReduce, count, DataType::Float32, 0).map_err(|e| e.to_string())?;
                if runs != hand {
                    return Err(format!("count {count}: {runs} runs, not the program"));
                }
                for dtype in [DataType::Float32, DataType::Bfloat16, DataType::Int64] {
                    for in_place in [false, true] {
                        run_case(c, CollKind::AllReduce, dtype, count, ReduceOp::Sum, 0, in_place)?;
                    }
                }
                run_case(c, CollKind::AllReduce, DataType::Float32, count, ReduceOp::Avg, 0, false)?;
            }
            // A two-sided program moves nothing one-sided.
            let s = c.stats();
            if s.iter().any(|p| p.put + p.got > 0) {
                return Err(format!("rank {}: one-sided traffic from a two-sided program: {s:?}", c.rank()));
            }
            Ok(())
        });
    }
}

#[test]
fn a_program_with_one_sided_steps_runs_on_every_transport() {
    // The built-in two-shot all-reduce for 3 ranks, as a researcher's
    // program: puts, gets, get-reduces, signals and waits.
    let coll = oxccl_algo::Collective::new(CollKind::AllReduce, 3, 6);
    let mut p = oxccl_algo::algos::build(oxccl_algo::algos::Algorithm::TwoShot, &coll, &Default::default()).unwrap();
    p.name = "my_twoshot".into();
    let id = programs::register(p).unwrap();
    for transport in [None, Some(Kind::Shm), Some(Kind::Tcp)] {
        let cfg =
            Config { programs: vec![id], algo: Some("allreduce:my_twoshot".into()), ..oxccl_e2e::config(transport) };
        on_threads(3, cfg, |c| {
            let runs = c.choice(CollKind::AllReduce, 7, DataType::Float32, 0).map_err(|e| e.to_string())?;
            if runs != oxccl::Choice::Program(id) {
                return Err(format!("{runs} runs, not the program"));
            }
            for count in [0, 1, 5, 6, 7, 1000, 100_003] {
                run_case(c, CollKind::AllReduce, DataType::Float32, count, ReduceOp::Sum, 0, false)?;
                run_case(c, CollKind::AllReduce, DataType::Float16, count, ReduceOp::Max, 0, true)?;
            }
            let got: u64 = c.stats().iter().map(|p| p.got).sum();
            if got == 0 {
                return Err(format!("rank {}: no one-sided reads", c.rank()));
            }
            Ok(())
        });
    }
}

/// One-shot all-reduce of 2 ranks written with two get-reduces of
/// different lengths on one channel (1 and 3 of its 4 elements): the
/// staging of the second must not be the size of the first.
const UNEVEN: &str = r#"{ "name": "uneven", "collective": {"kind": "all_reduce", "nranks": 2, "count": 4, "dtype": "float32"},
  "ranks": [
    {"channels": [[ {"op": "signal", "peer": 1}, {"op": "wait", "peer": 1},
                    {"op": "get_reduce", "peer": 1, "src": "input[0..1]", "acc": "input[0..1]", "dst": "output[0..1]"},
                    {"op": "get_reduce", "peer": 1, "src": "input[1..4]", "acc": "input[1..4]", "dst": "output[1..4]"},
                    {"op": "signal", "peer": 1}, {"op": "wait", "peer": 1} ]]},
    {"channels": [[ {"op": "signal", "peer": 0}, {"op": "wait", "peer": 0},
                    {"op": "get_reduce", "peer": 0, "src": "input[0..1]", "acc": "input[0..1]", "dst": "output[0..1]"},
                    {"op": "get_reduce", "peer": 0, "src": "input[1..4]", "acc": "input[1..4]", "dst": "output[1..4]"},
                    {"op": "signal", "peer": 0}, {"op": "wait", "peer": 0} ]]} ] }"#;

#[test]
fn get_reduces_of_different_lengths_on_one_channel() {
    let id = programs::register(Program::from_json(UNEVEN).unwrap()).unwrap();
    for transport in [None, Some(Kind::Shm), Some(Kind::Tcp)] {
        let cfg = Config { programs: vec![id], algo: Some("uneven".into()), ..oxccl_e2e::config(transport) };
        on_threads(2, cfg, |c| {
            for count in [4, 1000, 400_001] {
                run_case(c, CollKind::AllReduce, DataType::Float32, count, ReduceOp::Sum, 0, false)?;
            }
            Ok(())
        });
    }
}

#[test]
fn broken_programs_are_refused_naming_rank_and_step() {
    // Rank 1 reduces into the wrong half: output[0..2] ends up with rank
    // 0's half reduced twice.
    let broken = README_PROGRAM
        .replace(r#""src": "input[2..4]", "dst": "output[2..4]""#, r#""src": "input[0..2]", "dst": "output[0..2]""#)
        .replace(r#""name": "hand""#, r#""name": "broken""#);
    let e = programs::register(Program::from_json(&broken).unwrap()).unwrap_err().to_string();
    assert!(e.contains("broken") && e.contains("rank 1") && e.contains("step"), "{e}");
    // A deadlock: both ranks receive first.
    let stuck = r#"{ "name": "stuck", "collective": {"kind": "all_reduce", "nranks": 2, "count": 2, "dtype": "float32"},
      "ranks": [
        {"channels": [[ {"op": "recv_reduce", "peer": 1, "src": "input[0..2]", "dst": "output[0..2]"},
                        {"op": "send", "peer": 1, "src": "input[0..2]"} ]]},
        {"channels": [[ {"op": "recv_reduce", "peer": 0, "src": "input[0..2]", "dst": "output[0..2]"},
                        {"op": "send", "peer": 0, "src": "input[0..2]"} ]]} ] }"#;
    let e = programs::register(Program::from_json(stuck).unwrap()).unwrap_err().to_string();
    assert!(e.contains("stuck") && e.contains("rank 0") && e.contains("step 0") && e.contains("deadlock"), "{e}");
    // A built-in algorithm's name, and one name for two programs.
    let e = programs::register(Program::from_json(&README_PROGRAM.replace("\"hand\"", "\"ring\"")).unwrap());
    assert!(e.unwrap_err().to_string().contains("built-in"));
    programs::register(Program::from_json(README_PROGRAM).unwrap()).unwrap();
    let other = README_PROGRAM.replace("input[2..4]\"},", "input[2..4]\"} ,");
    assert_eq!(
        programs::register(Program::from_json(&other).unwrap()).unwrap(),
        programs::register(Program::from_json(README_PROGRAM).unwrap()).unwrap(),
        "the same program twice is one entry"
    );
    // Selecting a program for a communicator of another size is an error
    // at init, saying why.
    let cfg = hand_config(None);
    let e = Communicator::init_threads_with(3, cfg).unwrap_err().to_string();
    assert!(e.contains("hand") && e.contains("2 ranks") && e.contains('3'), "{e}");
}

/// The body of a rank in mode `hand` (the process tests below): the
/// program of `OXCCL_ALGO_FILE` on every count, checked.
pub(crate) fn hand_rank(id: &UniqueId, rank: usize, size: usize) {
    let result = Communicator::init(id, size, rank, Config::default()).map_err(|e| e.to_string()).and_then(|c| {
        for count in COUNTS {
            run_case(&c, CollKind::AllReduce, DataType::Float32, count, ReduceOp::Sum, 0, false)?;
        }
        Ok(())
    });
    child::report(result);
}

#[test]
fn processes_load_programs_from_oxccl_algo_file() {
    let dir = std::env::temp_dir().join(format!("oxccl-programs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("hand.json");
    std::fs::write(&file, README_PROGRAM).unwrap();
    for transport in ["shm", "tcp"] {
        let id = fresh_id();
        let envs =
            [("OXCCL_ALGO_FILE", file.to_str().unwrap()), ("OXCCL_ALGO", "hand"), ("OXCCL_TRANSPORT", transport)];
        let kids: Vec<_> = (0..2).map(|r| spawn(&[], &id, 2, r, "hand", &envs)).collect();
        for (r, k) in kids.into_iter().enumerate() {
            let (ok, out) = output(k);
            assert!(ok && out.contains("OK"), "rank {r} over {transport}:\n{out}");
        }
    }
    // A broken file: every rank refuses to start, naming the file, rank
    // and step.
    let broken = README_PROGRAM
        .replace(r#""src": "input[2..4]", "dst": "output[2..4]""#, r#""src": "input[0..2]", "dst": "output[0..2]""#);
    assert_ne!(broken, README_PROGRAM);
    std::fs::write(&file, broken).unwrap();
    let id = fresh_id();
    let envs = [("OXCCL_ALGO_FILE", file.to_str().unwrap())];
    let (ok, out) = output(spawn(&[], &id, 1, 0, "hand", &envs));
    assert!(!ok && out.contains("OXCCL_ALGO_FILE") && out.contains("hand.json") && out.contains("rank 1"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_readme_and_the_algorithms_page_show_this_program() {
    for doc in ["README.md", "docs/ALGORITHMS.md"] {
        let text = std::fs::read_to_string(format!("{}/../{doc}", env!("CARGO_MANIFEST_DIR"))).unwrap();
        assert!(text.contains(README_PROGRAM.trim()), "{doc}'s JSON program differs from tests/programs/hand.json");
    }
}
