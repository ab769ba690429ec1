//! No string literal in the sources carries a run of spaces inside a line:
//! the mark of a message broken over two source lines without a `\`
//! continuation (rustfmt then indents the second half into the text, and
//! users read "secret:                      it is not our rank 0").

use oxccl_e2e::tree::rust_files;
use std::path::PathBuf;

/// The string literals of `line` with a run of 8 or more spaces between
/// two other characters (quotes split naively: escaped quotes and
/// characters in quotes are rare enough not to matter here). Literals that
/// start with a space or `#` are tables and their headers, aligned on
/// purpose.
fn runs_in(line: &str) -> Vec<String> {
    let code = line.trim_start();
    if code.starts_with("//") {
        return Vec::new();
    }
    let mut found = Vec::new();
    for (i, part) in code.replace("\\\"", "").split('"').enumerate() {
        if i % 2 == 1 && !part.starts_with([' ', '#']) {
            let bytes = part.as_bytes();
            let mut k = 0;
            while k < bytes.len() {
                if bytes[k] == b' ' {
                    let start = k;
                    while k < bytes.len() && bytes[k] == b' ' {
                        k += 1;
                    }
                    if k - start >= 8 && start > 0 && k < bytes.len() {
                        found.push(part.to_string());
                    }
                } else {
                    k += 1;
                }
            }
        }
    }
    found
}

#[test]
fn no_message_carries_a_run_of_spaces() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for d in ["crates", "tools", "tests"] {
        rust_files(&root.join(d), &mut files);
    }
    assert!(files.len() > 100, "{} Rust files found under {}", files.len(), root.display());
    let mut bad = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for (n, line) in text.lines().enumerate() {
            for s in runs_in(line) {
                bad.push(format!("{}:{}: {s:?}", f.strip_prefix(&root).unwrap_or(f).display(), n + 1));
            }
        }
    }
    assert!(bad.is_empty(), "string literals with a run of spaces (a missing `\\` continuation?):\n{}", bad.join("\n"));
}

#[test]
fn the_check_sees_a_broken_message_and_passes_a_table() {
    assert_eq!(runs_in(r#"  "secret:                      it is not""#).len(), 1);
    assert!(runs_in(r#"  "{:>10} {:>14}""#).is_empty());
    assert!(runs_in(r#"  // "a comment:            with spaces""#).is_empty());
    assert!(runs_in(r#"  "ends in spaces        ""#).is_empty());
    assert!(runs_in(r##"  "#       size         count      type""##).is_empty());
}
