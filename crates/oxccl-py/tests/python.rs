//! Runs the package's Python tests (tests/python: the package on numpy
//! arrays, torch tensors and buffers, oxccl.algo, and PyTorch's own DDP
//! and ZeroRedundancyOptimizer on the "oxccl" backend) against the module
//! cargo just built, laid out as `pip install` lays it out.
//!
//! Needs a Python 3 with numpy (and torch for the torch.distributed
//! tests): `OXCCL_PYTHON`, else the first of `/usr/bin/python3`,
//! `python3` that imports numpy. Without one the test says so and passes,
//! unless `OXCCL_REQUIRE_PYTHON=1` (CI) makes that a failure;
//! `OXCCL_REQUIRE_TORCH=1` does the same for torch.

use std::path::{Path, PathBuf};
use std::process::Command;

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The package as pip installs it: python/oxccl plus the native module.
fn package() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("target/<profile>/deps");
    let lib = [deps.join("lib_oxccl.so"), deps.parent().unwrap().join("lib_oxccl.so")]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("lib_oxccl.so not built next to {}", deps.display()));
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("pypkg");
    let pkg = root.join("oxccl");
    let _ = std::fs::remove_dir_all(&pkg);
    std::fs::create_dir_all(&pkg).expect("create the package directory");
    for e in std::fs::read_dir(manifest().join("python/oxccl")).expect("python/oxccl") {
        let p = e.expect("entry").path();
        if p.extension().is_some_and(|x| x == "py") {
            std::fs::copy(&p, pkg.join(p.file_name().unwrap())).expect("copy a source");
        }
    }
    std::fs::copy(&lib, pkg.join("_oxccl.abi3.so")).expect("copy the native module");
    root
}

fn imports(python: &str, module: &str) -> bool {
    Command::new(python).args(["-c", &format!("import {module}")]).output().is_ok_and(|o| o.status.success())
}

fn python() -> Option<String> {
    if let Ok(p) = std::env::var("OXCCL_PYTHON") {
        return Some(p);
    }
    ["/usr/bin/python3", "python3"].into_iter().find(|p| imports(p, "numpy")).map(str::to_string)
}

fn required(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v == "1")
}

fn run_suite(python: &str, root: &Path) {
    let dir = manifest().join("tests/python");
    let out = Command::new(python)
        .args(["-m", "unittest", "discover", "-v", "-s"])
        .arg(&dir)
        .arg("-t")
        .arg(&dir)
        .current_dir(&dir)
        .env("PYTHONPATH", root)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("run python");
    let text = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert!(out.status.success(), "the Python tests failed:\n{text}");
    let ran = text.lines().filter(|l| l.ends_with(" ... ok")).count();
    assert!(ran >= 15, "only {ran} Python tests passed:\n{text}");
    if required("OXCCL_REQUIRE_TORCH") {
        assert!(!text.contains("skipped 'torch is not installed'"), "torch tests skipped:\n{text}");
    }
}

#[test]
fn python_package_and_torch_backend() {
    let Some(python) = python() else {
        assert!(!required("OXCCL_REQUIRE_PYTHON"), "OXCCL_REQUIRE_PYTHON=1 but no python3 with numpy was found");
        eprintln!("skipped: no python3 with numpy (install python3-numpy, python3-torch; CI does)");
        return;
    };
    if required("OXCCL_REQUIRE_TORCH") {
        assert!(imports(&python, "torch"), "OXCCL_REQUIRE_TORCH=1 but {python} cannot import torch");
    }
    run_suite(&python, &package());
}
