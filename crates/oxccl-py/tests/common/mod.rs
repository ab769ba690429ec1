//! What the Python harnesses share: the package as `pip install` lays it
//! out (python/oxccl plus the native module cargo just built), and the
//! Python to run it with.

use std::path::PathBuf;
use std::process::Command;

/// This crate's directory.
pub fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The package as pip installs it: python/oxccl plus the native module,
/// in a folder of this harness's own (`name`: harnesses run at once).
pub fn package(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("target/<profile>/deps");
    let lib = [deps.join("lib_oxccl.so"), deps.parent().unwrap().join("lib_oxccl.so")]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("lib_oxccl.so not built next to {}", deps.display()));
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("pypkg-{name}"));
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
    // The metadata pip writes, with pyproject's entry points (PyTorch 2.x
    // finds the backend through them).
    let info = root.join("oxccl-0.0.0.dist-info");
    let _ = std::fs::remove_dir_all(&info);
    std::fs::create_dir_all(&info).expect("create the dist-info directory");
    std::fs::write(info.join("METADATA"), "Metadata-Version: 2.1\nName: oxccl\nVersion: 0.0.0\n").expect("METADATA");
    std::fs::write(info.join("entry_points.txt"), entry_points()).expect("entry_points.txt");
    root
}

/// pyproject.toml's `[project.entry-points."G"]` tables as pip writes them
/// (`[G]` then `name = value` lines).
fn entry_points() -> String {
    let toml = std::fs::read_to_string(manifest().join("pyproject.toml")).expect("pyproject.toml");
    let mut out = String::new();
    let mut inside = false;
    for line in toml.lines().map(str::trim) {
        if let Some(group) = line.strip_prefix("[project.entry-points.").and_then(|g| g.strip_suffix(']')) {
            out.push_str(&format!("[{}]\n", group.trim_matches('"')));
            inside = true;
        } else if line.starts_with('[') {
            inside = false;
        } else if inside && line.contains('=') && !line.starts_with('#') {
            out.push_str(&line.replace('"', ""));
            out.push('\n');
        }
    }
    assert!(out.contains("torch.distributed.backends"), "no entry points in pyproject.toml");
    out
}

/// Whether `python` imports `module`.
pub fn imports(python: &str, module: &str) -> bool {
    Command::new(python).args(["-c", &format!("import {module}")]).output().is_ok_and(|o| o.status.success())
}

/// `OXCCL_PYTHON`, else the first of `/usr/bin/python3`, `python3` that
/// imports numpy.
pub fn python() -> Option<String> {
    if let Ok(p) = std::env::var("OXCCL_PYTHON") {
        return Some(p);
    }
    ["/usr/bin/python3", "python3"].into_iter().find(|p| imports(p, "numpy")).map(str::to_string)
}
