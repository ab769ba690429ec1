//! The workspace's test layout (docs/CRATES.md, "Where a new test goes"):
//! every package links its integration tests into one binary, so that
//! `cargo test --workspace` links each crate's tests once. Besides it a
//! package may have only the targets named from outside: GPU tests (a
//! `gpu` in the name: tools/gpu-check packs and runs exactly those) and the
//! loom model (built on its own with `--cfg loom`). Benches are criterion's
//! (`cargo bench`).

use crate::workspace_deps::{metadata, package_dir, workspace_root};
use serde_json::Value;

/// The most test and bench targets the workspace may have: each is a
/// binary that `cargo test` or `cargo bench --no-run` links against the
/// whole dependency graph.
const MOST_TARGETS: usize = 25;

/// The integration-test targets that may stand beside a package's one
/// binary: GPU tests, and the loom model.
fn named_from_outside(name: &str) -> bool {
    name.contains("gpu") || name == "loom_ring"
}

fn targets_of<'a>(package: &'a Value, kind: &str) -> Vec<&'a str> {
    package["targets"]
        .as_array()
        .expect("targets")
        .iter()
        .filter(|t| t["kind"].as_array().is_some_and(|k| k.iter().any(|k| k == kind)))
        .map(|t| t["name"].as_str().expect("target name"))
        .collect()
}

#[test]
fn each_package_links_its_tests_into_one_binary() {
    let root = workspace_root();
    let meta = metadata(&root);
    let mut wrong = Vec::new();
    let mut total = 0;
    for package in meta["packages"].as_array().expect("packages") {
        let tests = targets_of(package, "test");
        total += tests.len() + targets_of(package, "bench").len();
        let plain: Vec<&str> = tests.iter().copied().filter(|t| !named_from_outside(t)).collect();
        if plain.len() > 1 {
            let dir = package_dir(&root, package).map(|d| d.display().to_string()).unwrap_or_default();
            wrong.push(format!(
                "{dir}: {} integration-test binaries ({}): one per package, a module of it for each file \
                 (docs/CRATES.md, \"Where a new test goes\")",
                plain.len(),
                plain.join(", ")
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert!(total <= MOST_TARGETS, "{total} test and bench targets in the workspace, more than {MOST_TARGETS}");
}
