//! Runs the package's Python tests (tests/python: the package on numpy
//! arrays, torch tensors and buffers, oxccl.algo, and PyTorch's own DDP
//! and ZeroRedundancyOptimizer on the "oxccl" backend) against the module
//! cargo just built, laid out as `pip install` lays it out.
//!
//! Every Python test must pass, but those [`MAY_SKIP`] names, each with
//! the reason; any other skip is a failure.
//!
//! Needs a Python 3 with numpy (and torch for the torch.distributed
//! tests): `OXCCL_PYTHON`, else the first of `/usr/bin/python3`,
//! `python3` that imports numpy. Without one the test says so and passes,
//! unless `OXCCL_REQUIRE_PYTHON=1` (CI) makes that a failure;
//! `OXCCL_REQUIRE_TORCH=1` does the same for torch.

mod common;

use common::{imports, manifest, package, python};
use oxccl_skip::required;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The Python tests that may skip (test id, what the skip's reason says,
/// why it may); every other test must pass.
/// On PyTorch 2.x ([`python_package_and_torch_backend_on_torch_2`]) none may.
const MAY_SKIP: &[(&str, &str, &str)] = &[
    (
        "test_torch.Training.test_fsdp_moves_one_and_a_half_times_ddp",
        "no FSDP2 here",
        "FSDP2 is PyTorch 2.x's (Debian's torch 1.13, CI's, cannot even import its FSDP on Python 3.11); CI runs \
         the test on 2.15",
    ),
    (
        "test_torch.Torch2.",
        "takes no Python Backend",
        "every test of the class: what PyTorch 2.x calls (the flat forms, coalescing, DTensor, FSDP2, the \
         entry point, device:backend strings) does not exist in 1.13; CI runs them on 2.15",
    ),
    (
        "test_torch.Example.test_the_readmes_fsdp2_script_trains_on_2_processes",
        "has no FSDP2",
        "FSDP2 is PyTorch 2.x's; CI runs the script on 2.15",
    ),
];

/// A test's skip for want of torch, allowed only where torch may be absent.
const NO_TORCH: &str = "torch is not installed";

/// One suite at a time: each starts up to 4 processes per test, and its
/// failure tests time how soon a dead peer is named.
static ONE_SUITE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run_suite(python: &str, root: &Path, may_skip: &[(&str, &str, &str)]) {
    let _one = ONE_SUITE.lock().unwrap_or_else(|e| e.into_inner());
    let dir = manifest().join("tests/python");
    let report =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("python-outcomes-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&report);
    let out = Command::new(python)
        .arg(dir.join("outcomes.py"))
        .arg(&report)
        .current_dir(&dir)
        .env("PYTHONPATH", root)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("run python");
    let text = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert!(out.status.success(), "the Python tests failed:\n{text}");
    let outcomes: Vec<(String, String, String)> =
        serde_json::from_str(&std::fs::read_to_string(&report).expect("the Python tests' outcomes"))
            .expect("outcomes.py's JSON");
    let _ = std::fs::remove_file(&report);
    let mut wrong = Vec::new();
    let mut torch_skips = 0;
    for (id, outcome, detail) in &outcomes {
        // An entry ending in "." allows every test of that class.
        let allowed = may_skip
            .iter()
            .find(|(t, says, _)| (t == id || (t.ends_with('.') && id.starts_with(t))) && detail.contains(says));
        match (outcome.as_str(), allowed) {
            ("ok", _) => {}
            ("skipped", _) if detail == NO_TORCH => torch_skips += 1,
            ("skipped", Some((_, _, why))) => println!("allowed skip of {id}: {detail} ({why})"),
            ("skipped", None) => wrong.push(format!("{id} skipped ({detail}), and it is not one of MAY_SKIP")),
            _ => wrong.push(format!("{id}: {outcome} {detail}")),
        }
    }
    assert!(wrong.is_empty(), "Python tests that did not pass:\n{}\n\n{text}", wrong.join("\n"));
    let ran = outcomes.iter().filter(|(_, o, _)| o == "ok").count();
    assert!(ran >= 15, "only {ran} Python tests passed:\n{text}");
    if torch_skips > 0 {
        oxccl_skip::skip_or_fail("OXCCL_REQUIRE_TORCH", format!("{torch_skips} Python tests: {NO_TORCH}"));
    }
}

#[test]
fn python_package_and_torch_backend() {
    let Some(python) = python() else {
        let why = "no python3 with numpy (install python3-numpy, python3-torch; CI does)";
        oxccl_skip::skip_or_fail("OXCCL_REQUIRE_PYTHON", why);
        return;
    };
    if required("OXCCL_REQUIRE_TORCH") {
        assert!(imports(&python, "torch"), "OXCCL_REQUIRE_TORCH=1 but {python} cannot import torch");
    }
    run_suite(&python, &package("cpu"), MAY_SKIP);
}

/// The same suite on PyTorch 2.x (FSDP2, DTensor, the flat and coalesced
/// forms): `OXCCL_TORCH2_PYTHON` names a Python whose torch is 2.x (CI:
/// a venv with torch 2.15.0 from PyPI); without it the test says so and
/// passes, unless `OXCCL_REQUIRE_TORCH2=1` (CI) makes that a failure.
/// Every test must pass there: none may skip.
#[test]
fn python_package_and_torch_backend_on_torch_2() {
    let Some(python) = std::env::var("OXCCL_TORCH2_PYTHON").ok().filter(|p| !p.is_empty()) else {
        let why = "OXCCL_TORCH2_PYTHON is not set (a Python with torch 2.x and numpy: python3 -m venv v && \
                   v/bin/pip install torch numpy; CI does)";
        oxccl_skip::skip_or_fail("OXCCL_REQUIRE_TORCH2", why);
        return;
    };
    let v = Command::new(&python).args(["-c", "import numpy, torch; print(torch.__version__)"]).output();
    let version = v.ok().filter(|o| o.status.success()).map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let Some(version) = version else {
        panic!("OXCCL_TORCH2_PYTHON={python} cannot import numpy and torch");
    };
    assert!(version.starts_with("2."), "OXCCL_TORCH2_PYTHON={python} has torch {version}, not 2.x");
    println!("torch {version} at {python}");
    run_suite(&python, &package("cpu-torch2"), &[]);
}
