//! The kernel cache on disk with the real compiler (NVRTC; no GPU): a miss
//! compiles and writes the entry, a hit compiles nothing, a corrupt entry
//! is compiled again and replaced whole, a directory that cannot be written
//! costs nothing but the cache, and two processes filling one cache at once
//! leave only whole entries. Skipped with a message without NVRTC, unless
//! `OXCCL_REQUIRE_NVRTC=1` (CI sets it).

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use oxccl_core::DataType;
use oxccl_cuda::cache::{DiskCache, Key, Lookup};
use oxccl_cuda::kernels::{self, KernelOp};

use crate::common;
use common::have_nvrtc;

fn temp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("oxccl-kcache-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    let _ = std::fs::remove_file(&d);
    d
}

/// The key `image_with` uses for a device of sm_90 (a CUBIN when this NVRTC targets sm_90).
fn key_for_90(dtype: DataType, op: KernelOp) -> Key {
    let nvrtc = kernels::nvrtc_version().unwrap();
    let (arch, cubin) = kernels::pick_arch(90, &kernels::supported_archs().unwrap()).unwrap();
    Key { cubin, arch, dtype, op, nvrtc }
}

#[test]
fn a_miss_compiles_and_writes_a_hit_compiles_nothing_a_corrupt_entry_is_replaced() {
    if !have_nvrtc() {
        return;
    }
    let root = temp("cycle");
    let disk = DiskCache::new(&root);
    let (dtype, op) = (DataType::Int8, KernelOp::Max);
    let key = key_for_90(dtype, op);

    let t = Instant::now();
    let compiled = kernels::image_with(Some(&disk), 90, dtype, op, true).unwrap();
    let cold = t.elapsed();
    assert!(compiled.bytes().starts_with(b"\x7fELF"), "sm_90 gets a CUBIN");
    assert_eq!(disk.get(&key), Lookup::Hit(compiled.bytes().to_vec()), "the miss wrote the entry");

    let t = Instant::now();
    let again = kernels::image_with(Some(&disk), 90, dtype, op, true).unwrap();
    let warm = t.elapsed();
    assert_eq!(again.bytes(), compiled.bytes());
    // A stand-in entry proves the hit is read, not compiled.
    disk.put(&key, b"\x7fELF stand-in").unwrap();
    let read = kernels::image_with(Some(&disk), 90, dtype, op, true).unwrap();
    assert_eq!(read.bytes(), b"\x7fELF stand-in");
    eprintln!("one module for sm_90: compiled {cold:?}, read from the cache {warm:?}");

    // Flip a payload byte: detected, compiled again, the entry rewritten whole.
    let path = disk.path(&key);
    let mut raw = std::fs::read(&path).unwrap();
    *raw.last_mut().unwrap() ^= 0x55;
    std::fs::write(&path, &raw).unwrap();
    assert!(matches!(disk.get(&key), Lookup::Corrupt(_)));
    let fixed = kernels::image_with(Some(&disk), 90, dtype, op, true).unwrap();
    assert_eq!(fixed.bytes(), compiled.bytes());
    assert_eq!(disk.get(&key), Lookup::Hit(compiled.bytes().to_vec()));

    // Not reading (`image_fresh`'s way) compiles even over a whole entry.
    disk.put(&key, b"\x7fELF stand-in").unwrap();
    let fresh = kernels::image_with(Some(&disk), 90, dtype, op, false).unwrap();
    assert_eq!(fresh.bytes(), compiled.bytes());
    assert_eq!(disk.get(&key), Lookup::Hit(compiled.bytes().to_vec()), "and replaces the entry");
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn a_directory_that_cannot_be_written_only_costs_the_cache() {
    if !have_nvrtc() {
        return;
    }
    // Where the folder should be there is a file: nothing can be made
    // under it, whoever runs the test (root ignores permission bits).
    let root = temp("blocked");
    std::fs::write(&root, b"not a folder").unwrap();
    let disk = DiskCache::new(&root);
    let img = kernels::image_with(Some(&disk), 90, DataType::Uint8, KernelOp::Sum, true).unwrap();
    assert!(!img.bytes().is_empty());
    assert_eq!(disk.get(&key_for_90(DataType::Uint8, KernelOp::Sum)), Lookup::Miss);
    std::fs::remove_file(&root).unwrap();

    // A read-only folder, where permissions bind (not as root).
    let ro = temp("readonly");
    std::fs::create_dir_all(ro.join("kernels")).unwrap();
    let mut perm = std::fs::metadata(ro.join("kernels")).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o555);
    std::fs::set_permissions(ro.join("kernels"), perm.clone()).unwrap();
    let disk = DiskCache::new(&ro);
    let img = kernels::image_with(Some(&disk), 90, DataType::Uint8, KernelOp::Sum, true).unwrap();
    assert!(!img.bytes().is_empty());
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
    std::fs::set_permissions(ro.join("kernels"), perm).unwrap();
    std::fs::remove_dir_all(&ro).unwrap();
}

#[test]
fn two_processes_filling_one_cache_at_once_leave_whole_entries() {
    if !have_nvrtc() {
        return;
    }
    let root = temp("race");
    let tool = env!("CARGO_BIN_EXE_oxccl-kernel-cache");
    let fill = || {
        Command::new(tool)
            .args(["fill", "--arch", "90", "--dtype", "float32,bfloat16", "--op", "sum", "--threads", "1", "--dir"])
            .arg(&root)
            .spawn()
            .expect("start oxccl-kernel-cache")
    };
    let (mut a, mut b) = (fill(), fill());
    assert!(a.wait().unwrap().success() && b.wait().unwrap().success());
    let disk = DiskCache::new(&root);
    let names: Vec<String> =
        std::fs::read_dir(disk.dir()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(names.len(), 2, "two entries and no temporary file: {names:?}");
    for dtype in [DataType::Float32, DataType::Bfloat16] {
        assert!(matches!(disk.get(&key_for_90(dtype, KernelOp::Sum)), Lookup::Hit(b) if b.starts_with(b"\x7fELF")));
    }
    // A third fill finds both and compiles nothing.
    let out = Command::new(tool)
        .args(["fill", "--arch", "90", "--dtype", "float32,bfloat16", "--op", "sum", "--dir"])
        .arg(&root)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("0 compiled, 2 already there"), "{text}");
    std::fs::remove_dir_all(&root).unwrap();
}
