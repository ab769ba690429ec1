//! NVRTC compiles every module (each data type × operator) for compute_80
//! and compute_90 without a warning. Needs libnvrtc (no GPU): skipped with a
//! message when it is absent, unless `OXCCL_REQUIRE_NVRTC=1` (CI sets it).

use std::sync::Mutex;
use std::time::Instant;

use oxccl_core::DataType;
use oxccl_cuda::CudaError;
use oxccl_cuda::kernels::{self, ENTRY_POINTS, KernelOp};

use crate::common;
use common::have_nvrtc;

#[test]
fn every_dtype_and_op_compiles_for_sm80_and_sm90() {
    if !have_nvrtc() {
        return;
    }
    let (major, minor) = kernels::nvrtc_version().unwrap();

    let jobs: Vec<(u32, DataType, KernelOp)> = [80, 90]
        .into_iter()
        .flat_map(|arch| DataType::ALL.into_iter().flat_map(move |d| KernelOp::ALL.map(|op| (arch, d, op))))
        .collect();
    assert_eq!(jobs.len(), 96);
    let next = Mutex::new(jobs.iter());
    let failures = Mutex::new(Vec::<String>::new());
    // One module's compile time and size, from the run below (each module
    // is compiled once: through the process's cache, which the other tests
    // of this binary then find filled).
    let one = Mutex::new(None);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).min(8);
    let t = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let Some(&(arch, dtype, op)) = next.lock().unwrap().next() else { break };
                    let t = Instant::now();
                    match kernels::ptx(arch, dtype, op) {
                        Ok(ptx) => {
                            if (arch, dtype, op) == (90, DataType::Float32, KernelOp::Sum) {
                                *one.lock().unwrap() = Some((t.elapsed().as_secs_f64(), ptx.as_str().len()));
                            }
                            let text = ptx.as_str();
                            let target = format!(".target sm_{arch}");
                            let missing: Vec<_> = ENTRY_POINTS
                                .iter()
                                .filter(|e| !text.contains(&format!(".entry {e}(")))
                                .chain((!text.contains(&target)).then_some(&".target"))
                                .collect();
                            if !missing.is_empty() {
                                failures.lock().unwrap().push(format!("{arch} {dtype} {op}: PTX lacks {missing:?}"));
                            }
                        }
                        Err(e) => failures.lock().unwrap().push(e.to_string()),
                    }
                }
            });
        }
    });
    let all_s = t.elapsed().as_secs_f64();
    let failures = failures.into_inner().unwrap();
    assert!(failures.is_empty(), "{} of 96 modules failed:\n{}", failures.len(), failures.join("\n\n"));
    let (one_s, one_len) = one.into_inner().unwrap().expect("f32 sum for compute_90 is one of the 96");
    eprintln!(
        "NVRTC {major}.{minor}: one module (f32 sum, compute_90) {one_s:.2} s ({one_len} bytes of PTX); \
         all 96 (48 × compute_80/90) {all_s:.2} s on {threads} threads"
    );
}

#[test]
fn the_cache_compiles_once_and_the_device_arch_is_clamped_to_nvrtc() {
    if !have_nvrtc() {
        return;
    }
    let a = kernels::ptx(80, DataType::Int8, KernelOp::Max).unwrap();
    let t = Instant::now();
    let b = kernels::ptx(80, DataType::Int8, KernelOp::Max).unwrap();
    assert!(std::sync::Arc::ptr_eq(&a, &b), "a second call must return the cached PTX");
    assert!(t.elapsed().as_millis() < 50, "cache hit took {:?}", t.elapsed());
    let c = kernels::ptx(90, DataType::Int8, KernelOp::Max).unwrap();
    assert_ne!(a.as_str(), c.as_str(), "compute_80 and compute_90 are different modules");

    let archs = kernels::supported_archs().unwrap();
    assert!(archs.contains(&80) && archs.contains(&90), "{archs:?}");
    assert_eq!(kernels::arch_for_device(90).unwrap(), 90);
    let highest = *archs.last().unwrap();
    assert_eq!(kernels::arch_for_device(highest + 500).unwrap(), highest);
    assert!(matches!(kernels::arch_for_device(10), Err(CudaError::Unavailable(m)) if m.contains("1.0")));
}
