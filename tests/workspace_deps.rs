//! The layering of the workspace: libraries live in `crates/`, programs in
//! `tools/`, and nothing in `crates/` depends on anything in `tools/` —
//! not as a normal, build or dev dependency, on no target. A library that
//! needs a tool's code needs that code moved into a crate (as the
//! planner's formulas moved from `tools/oxccl-plan` to `crates/oxccl-plan`).
//!
//! The dependencies are cargo's own view (`cargo metadata --no-deps`), so
//! `workspace = true` inheritance, renamed and target-specific
//! dependencies are resolved as cargo resolves them; and every
//! `crates/*/Cargo.toml` must be a workspace member, or its dependencies
//! would go unchecked.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root: the directory above this package (`tests/`).
pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

/// `cargo metadata --no-deps` of the workspace whose manifest is
/// `root/Cargo.toml`.
pub(crate) fn metadata(root: &Path) -> Value {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline", "--manifest-path"])
        .arg(root.join("Cargo.toml"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata of {} failed: {}",
        root.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON")
}

/// `path` relative to `root`, symbolic links resolved where the path
/// exists (cargo may print either form).
fn relative(root: &Path, path: &Path) -> Option<PathBuf> {
    let root = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    path.strip_prefix(&root).ok().map(Path::to_path_buf)
}

/// The directory of a package's manifest, relative to `root`.
pub(crate) fn package_dir(root: &Path, package: &Value) -> Option<PathBuf> {
    let manifest = Path::new(package["manifest_path"].as_str()?);
    relative(root, manifest.parent()?)
}

/// Every dependency of a package under `root/crates` on a path under
/// `root/tools`, as `crates/a: normal dependency b (tools/b)`.
fn crates_on_tools(root: &Path, meta: &Value) -> Vec<String> {
    let mut found = Vec::new();
    for package in meta["packages"].as_array().expect("packages") {
        let Some(dir) = package_dir(root, package).filter(|d| d.starts_with("crates")) else { continue };
        for dep in package["dependencies"].as_array().expect("dependencies") {
            let Some(path) = dep["path"].as_str() else { continue };
            let Some(target) = relative(root, Path::new(path)).filter(|p| p.starts_with("tools")) else { continue };
            let kind = dep["kind"].as_str().unwrap_or("normal");
            let on = dep["target"].as_str().map_or(String::new(), |t| format!(" on {t}"));
            found.push(format!(
                "{}: {kind} dependency{on} {} ({})",
                dir.display(),
                dep["name"].as_str().unwrap_or("?"),
                target.display()
            ));
        }
    }
    found.sort();
    found
}

/// Every `root/crates/*/Cargo.toml` that is not a workspace member.
fn unchecked_crates(root: &Path, meta: &Value) -> Vec<String> {
    let members: Vec<PathBuf> =
        meta["packages"].as_array().expect("packages").iter().filter_map(|p| package_dir(root, p)).collect();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(root.join("crates")).expect("crates/ is readable") {
        let dir = entry.expect("a crates/ entry").path();
        if dir.join("Cargo.toml").is_file() {
            let rel = relative(root, &dir).expect("under the root");
            if !members.contains(&rel) {
                missing.push(rel.display().to_string());
            }
        }
    }
    missing.sort();
    missing
}

#[test]
fn no_crate_depends_on_a_tool() {
    let root = workspace_root();
    let meta = metadata(&root);
    let unchecked = unchecked_crates(&root, &meta);
    assert!(
        unchecked.is_empty(),
        "these crates are not workspace members, so their dependencies are not checked: {unchecked:?}; \
         add them to [workspace] members in Cargo.toml"
    );
    let bad = crates_on_tools(&root, &meta);
    assert!(
        bad.is_empty(),
        "crates under crates/ depend on tools/ (move the code they need into a crate):\n  {}",
        bad.join("\n  ")
    );
}

/// Writes `text` to `root/rel`, making its directory.
fn write(root: &Path, rel: &str, text: &str) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().expect("a file in a directory")).expect("mkdir");
    std::fs::write(&path, text).expect("write");
}

/// A library package's manifest with its `src/lib.rs`.
fn package(root: &Path, dir: &str, name: &str, deps: &str) {
    let manifest = format!("[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n{deps}");
    write(root, &format!("{dir}/Cargo.toml"), &manifest);
    write(root, &format!("{dir}/src/lib.rs"), "");
}

/// The check itself, on a workspace made to break the rule every way:
/// through `workspace = true`, as a build, a dev and a target-specific
/// dependency, and with a crate that is not a member.
#[test]
fn the_check_finds_every_kind_of_dependency_on_a_tool() {
    let root = std::env::temp_dir().join(format!("oxccl-workspace-deps-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    write(
        &root,
        "Cargo.toml",
        "[workspace]\nresolver = \"2\"\nmembers = [\"crates/a\", \"crates/b\", \"crates/c\", \"tools/t\"]\n\n\
         [workspace.dependencies]\nt = { path = \"tools/t\" }\n",
    );
    package(&root, "tools/t", "t", "");
    package(&root, "crates/c", "c", "");
    package(
        &root,
        "crates/a",
        "a",
        "[dependencies]\nt.workspace = true\nc = { path = \"../c\" }\n\n[build-dependencies]\nt = { path = \"../../tools/t\" }\n",
    );
    package(
        &root,
        "crates/b",
        "b",
        "[dev-dependencies]\ntool = { package = \"t\", path = \"../../tools/t\" }\n\n\
         [target.'cfg(unix)'.dependencies]\nt = { path = \"../../tools/t\" }\n",
    );
    package(&root, "crates/stray", "stray", "");
    let meta = metadata(&root);
    let bad = crates_on_tools(&root, &meta);
    let unchecked = unchecked_crates(&root, &meta);
    let _ = std::fs::remove_dir_all(&root);
    assert_eq!(
        bad,
        [
            "crates/a: build dependency t (tools/t)",
            "crates/a: normal dependency t (tools/t)",
            "crates/b: dev dependency t (tools/t)",
            "crates/b: normal dependency on cfg(unix) t (tools/t)",
        ]
    );
    assert_eq!(unchecked, ["crates/stray"]);
}
