//! The package on a GPU: CUDA tensors through the device path, alone and
//! in groups that mix them with host buffers (tests/python/gpu_device.py).
//! Needs a CUDA GPU and a torch built for it, so `#[ignore]`d; the GPU
//! check runs it.

mod common;

use common::{imports, manifest, package, python};
use std::process::Command;

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_tensors_and_mixed_groups() {
    let python = python().expect("a python3 with numpy (OXCCL_PYTHON)");
    assert!(imports(&python, "torch"), "{python} cannot import torch");
    let dir = manifest().join("tests/python");
    let out = Command::new(&python)
        .args(["-m", "unittest", "-v", "gpu_device"])
        .current_dir(&dir)
        .env("PYTHONPATH", package("gpu"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("run python");
    let text = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert!(out.status.success() && !text.contains("skipped"), "the GPU Python tests did not all pass:\n{text}");
}
