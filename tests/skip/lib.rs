//! # How a test that cannot run here says so
//!
//! A test that needs hardware this machine lacks (a GPU, an HCA) is
//! `#[ignore]`d with the reason. A test that needs a tool, a package or a
//! privilege (a C compiler, iproute2 and root, Open MPI, Python, torch,
//! verbs.h, NVIDIA's nccl.h) says why it skips through [`skip_or_fail`],
//! which names the variable that turns that skip into a failure:
//!
//! ```no_run
//! # fn have_ip() -> bool { true }
//! if !have_ip() {
//!     oxccl_skip::skip_or_fail("OXCCL_REQUIRE_NETNS", "no `ip` (apt-get install iproute2)");
//!     return;
//! }
//! ```
//!
//! CI (`.ci/run`) installs what every test needs and sets every variable;
//! a test of this crate checks that each variable named in the workspace's
//! tests is exported there.
//!
//! | variable | what must be here |
//! |---|---|
//! | `OXCCL_REQUIRE_CC` | a C and a C++ compiler (`cc`, `c++`, or `$CC`, `$CXX`): the CUDA source emulation, the layout tests |
//! | `OXCCL_REQUIRE_NETNS` | root and iproute2: two hosts as network namespaces joined by veth |
//! | `OXCCL_REQUIRE_IBVERBS` | rdma-core's libibverbs and `<infiniband/verbs.h>` (libibverbs1, libibverbs-dev) |
//! | `OXCCL_REQUIRE_CMA` | this process may read its child's memory (`process_vm_readv`: root, or `ptrace_scope` 0) |
//! | `OXCCL_REQUIRE_MPI` | Open MPI (`mpicc`, `mpirun`) |
//! | `OXCCL_REQUIRE_PYTHON` | a `python3` with numpy |
//! | `OXCCL_REQUIRE_TORCH` | a `python3` with torch (the torch.distributed tests, the Gloo peer benchmark) |
//! | `OXCCL_REQUIRE_MATPLOTLIB` | a `python3` (or `/usr/bin/python3`) with matplotlib (python3-matplotlib): the plots of `oxccl-sim --plot` |
//! | `OXCCL_REQUIRE_NVRTC` | libnvrtc (no GPU needed) |
//! | `OXCCL_REQUIRE_NCCL_H` | NVIDIA's nccl.h (`OXCCL_NCCL_H`, or `target/nvidia-nccl/nccl.h`, which `.ci/nvidia-nccl-h` fetches) |
//!
//! A variable counts as set when it is neither empty nor `0`.

use std::panic::Location;

/// Whether `var` asks for the precondition it names: set, and neither
/// empty nor `0`.
pub fn required(var: &str) -> bool {
    std::env::var_os(var).is_some_and(|v| on(&v.to_string_lossy()))
}

fn on(value: &str) -> bool {
    !value.is_empty() && value != "0"
}

/// Says why the calling test does not run what it tests: prints
/// `SKIPPED <test>: <why>` and returns, so that the test returns; or,
/// where `var` is set ([`required`]), fails the test with the same words.
/// `var` names what is missing; it starts with `OXCCL_REQUIRE_`.
#[track_caller]
pub fn skip_or_fail(var: &str, why: impl std::fmt::Display) {
    match verdict(var, required(var), &test_name(Location::caller()), &why.to_string()) {
        Ok(skip) => eprintln!("{skip}"),
        Err(fail) => panic!("{fail}"),
    }
}

/// What [`skip_or_fail`] prints (`Ok`) or fails with (`Err`).
fn verdict(var: &str, required: bool, test: &str, why: &str) -> Result<String, String> {
    assert!(var.starts_with("OXCCL_REQUIRE_"), "skip_or_fail: {var} is not an OXCCL_REQUIRE_* variable");
    if required {
        Err(format!("{var} is set, so {test} may not skip: {why}"))
    } else {
        Ok(format!("SKIPPED {test}: {why} (set {var}=1 to make this a failure)"))
    }
}

/// The running test's name (libtest names each test's thread after it),
/// or where it called from.
fn test_name(at: &Location) -> String {
    match std::thread::current().name() {
        Some(name) if name != "main" => name.to_string(),
        _ => format!("the test at {}:{}", at.file(), at.line()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};

    const EXAMPLE: &str = "OXCCL_REQUIRE_EXAMPLE";

    #[test]
    fn a_variable_is_set_unless_empty_or_0() {
        assert!(on("1") && on("yes"));
        assert!(!on("") && !on("0"));
        assert!(!required("OXCCL_REQUIRE_EXAMPLE_NEVER_SET"));
    }

    #[test]
    fn a_skip_says_why_and_names_its_variable() {
        let said = verdict(EXAMPLE, false, "t", "no frobnicator").unwrap();
        assert_eq!(said, "SKIPPED t: no frobnicator (set OXCCL_REQUIRE_EXAMPLE=1 to make this a failure)");
        // Run for real, the variable unset: the call returns.
        skip_or_fail("OXCCL_REQUIRE_EXAMPLE_NEVER_SET", "an example");
    }

    #[test]
    fn a_required_skip_is_a_failure_naming_its_variable_and_test() {
        let e = verdict(EXAMPLE, true, "t", "no frobnicator").unwrap_err();
        assert_eq!(e, "OXCCL_REQUIRE_EXAMPLE is set, so t may not skip: no frobnicator");
        assert_eq!(test_name(Location::caller()), "tests::a_required_skip_is_a_failure_naming_its_variable_and_test");
    }

    #[test]
    fn only_require_variables_are_taken() {
        assert!(std::panic::catch_unwind(|| verdict("OXCCL_PYTHON", false, "t", "x")).is_err());
    }

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
    }

    /// Every `OXCCL_REQUIRE_*` name in `text`.
    fn names(text: &str, into: &mut BTreeSet<String>) {
        let mut rest = text;
        while let Some(i) = rest.find("OXCCL_REQUIRE_") {
            let tail = &rest[i..];
            let end =
                tail.find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')).unwrap_or(tail.len());
            into.insert(tail[..end].to_string());
            rest = &tail[end..];
        }
    }

    fn walk(dir: &Path, into: &mut BTreeSet<String>) {
        for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            if p.is_dir() {
                if !name.starts_with('.') && name != "target" && name != "__pycache__" {
                    walk(&p, into);
                }
            } else if name.ends_with(".rs") || name.ends_with(".py") {
                names(&std::fs::read_to_string(&p).unwrap(), into);
            }
        }
    }

    /// CI exports every variable a test of the workspace reads (this file's
    /// own examples aside), so that none of their skips passes there.
    #[test]
    fn ci_sets_every_require_variable() {
        let mut used = BTreeSet::new();
        for d in ["crates", "tests", "tools"] {
            walk(&root().join(d), &mut used);
        }
        used.retain(|v| !v.starts_with(EXAMPLE) && v != "OXCCL_REQUIRE_");
        for v in ["OXCCL_REQUIRE_NETNS", "OXCCL_REQUIRE_CC"] {
            assert!(used.contains(v), "{v} is no longer read by any test: {used:?}");
        }
        let ci = std::fs::read_to_string(root().join(".ci/run")).expect(".ci/run");
        let exported: BTreeSet<String> = ci
            .lines()
            .filter_map(|l| l.trim().strip_prefix("export "))
            .flat_map(|l| l.split_whitespace())
            .filter_map(|kv| kv.strip_suffix("=1"))
            .map(str::to_string)
            .collect();
        let missing: Vec<_> = used.difference(&exported).collect();
        assert!(missing.is_empty(), ".ci/run does not export {missing:?}=1 (it exports {exported:?})");
    }
}
