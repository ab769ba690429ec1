//! The workspace's source tree, for the tests that check the sources
//! themselves (module structure, messages).

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, recursively, appended to `out` (build
/// output, `target`, and hidden folders left out).
pub fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        let name = e.file_name();
        if p.is_dir() {
            if name != "target" && !name.to_string_lossy().starts_with('.') {
                rust_files(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}
