//! oxccl's `libnccl.so.2` exports every function a real NCCL client links
//! against, so the dynamic loader can load that client with oxccl alone:
//!
//! - every NCCL function PyTorch 2.15.0's `libtorch_cuda.so` imports
//!   (`tests/data/torch-2.15.0-nccl-imports.txt`, read off the PyPI wheel);
//! - every function NVIDIA's `libnccl.so.2` of the version oxccl claims
//!   exports (`libnccl-exports.txt`, which `.ci/nvidia-nccl-h` writes beside
//!   NVIDIA's header; without it the test says so and skips that part,
//!   unless `OXCCL_REQUIRE_NCCL_H` is set, as CI does);
//! - and `ncclGetVersion` satisfies PyTorch's reading of the version
//!   (`major = v / 10000`, `minor = v / 100 % 100`, `patch = v % 100`): at
//!   least the NCCL the client was built with.
//!
//! The library's symbols are read with `nm -D` (binutils, which every
//! machine with a C toolchain has).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

fn here() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The cdylib cargo built for this test, beside it (`target/<profile>/deps/libnccl.so`).
fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let lib = exe.parent().expect("target/<profile>/deps").join("libnccl.so");
    assert!(lib.is_file(), "{} was not built (cargo test builds the cdylib with the tests)", lib.display());
    lib
}

/// The functions a library defines (`T`) or defines weakly (`W`).
fn exports() -> BTreeSet<String> {
    let lib = library();
    let out = Command::new("nm").arg("-D").arg("--defined-only").arg(&lib).output();
    let out = match out {
        Ok(o) if o.status.success() => o,
        Ok(o) => panic!("nm -D {} failed: {}", lib.display(), String::from_utf8_lossy(&o.stderr)),
        Err(e) => panic!("nm (binutils) cannot run: {e}; install binutils"),
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            [_, "T" | "W", name] => Some(name.to_string()),
            _ => None,
        })
        .collect()
}

/// The names of a list file: one a line, `#` comments.
fn names(text: &str) -> BTreeSet<String> {
    text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(str::to_string).collect()
}

#[test]
fn every_nccl_function_torch_imports_is_exported() {
    let text = std::fs::read_to_string(here().join("tests/data/torch-2.15.0-nccl-imports.txt")).unwrap();
    let wanted = names(&text);
    assert_eq!(wanted.len(), 51, "the list read off torch 2.15.0 has 51 functions");
    let ours = exports();
    let missing: Vec<_> = wanted.difference(&ours).collect();
    assert!(missing.is_empty(), "torch 2.15.0 cannot load against oxccl's libnccl.so.2; it lacks {missing:?}");
}

#[test]
fn every_function_nvidias_library_exports_is_exported() {
    let list = match std::env::var_os("OXCCL_NCCL_H") {
        Some(h) => PathBuf::from(h).with_file_name("libnccl-exports.txt"),
        None => here().join("../../target/nvidia-nccl/libnccl-exports.txt"),
    };
    let Ok(text) = std::fs::read_to_string(&list) else {
        let why = format!("{} was not found: run .ci/nvidia-nccl-h, which writes it", list.display());
        oxccl_skip::skip_or_fail("OXCCL_REQUIRE_NCCL_H", why);
        return;
    };
    let nvidia = names(&text);
    assert!(nvidia.len() > 150 && nvidia.contains("ncclAllReduce"), "{} is not an export list", list.display());
    let ours = exports();
    let missing: Vec<_> = nvidia.difference(&ours).collect();
    assert!(missing.is_empty(), "NVIDIA's libnccl.so.2 exports what oxccl's does not: {missing:?}");
}

#[test]
fn the_version_reads_as_at_least_the_one_torch_was_built_with() {
    let text = std::fs::read_to_string(here().join("tests/data/torch-2.15.0-nccl-imports.txt")).unwrap();
    let built: Vec<u32> = text
        .lines()
        .find_map(|l| l.strip_prefix("# torch-nccl-version "))
        .expect("the list names torch's NCCL")
        .split('.')
        .map(|x| x.parse().unwrap())
        .collect();
    let mut v = 0;
    // SAFETY: `v` is a valid out-pointer.
    assert_eq!(unsafe { nccl::api_for_benches::ncclGetVersion(&mut v) }, 0);
    let (major, minor, patch) = (v / 10000, v / 100 % 100, v % 100);
    assert_eq!((major, minor, patch), (2, 32, 3), "ncclGetVersion gave {v}");
    assert!([major as u32, minor as u32, patch as u32] >= [built[0], built[1], built[2]], "{v} < {built:?}");
}
