//! `oxccl-kernel-cache`: fills the kernel cache ahead of time (no GPU
//! needed, only NVRTC), or says where it is and what it holds.
//!
//! ```text
//! oxccl-kernel-cache fill --arch 90,100 [--dir D] [--threads N] [--dtype float32,bfloat16] [--op sum]
//! oxccl-kernel-cache list [--dir D]
//! ```
//! `--dir` defaults to what the library reads: `OXCCL_CACHE_DIR`, else the
//! user's cache directory (`~/.cache/oxccl`).

use std::path::PathBuf;
use std::time::Instant;

use clap::{Parser, Subcommand};
use oxccl_core::DataType;
use oxccl_cuda::KernelOp;
use oxccl_cuda::cache::DiskCache;
use oxccl_cuda::kernels;

fn parse_op(s: &str) -> Result<KernelOp, String> {
    KernelOp::ALL.into_iter().find(|o| o.name() == s).ok_or_else(|| format!("{s:?} is none of sum, prod, max, min"))
}

#[derive(Parser)]
#[command(about = "Fill or list oxccl's kernel cache (compiled CUDA modules, reused across processes)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Compile every module (each type × operator) for the given architectures into the cache.
    Fill {
        /// Compute capabilities as major×10+minor, comma separated (90: H100/H200, 100: B200, 80: A100).
        #[arg(long, value_delimiter = ',', default_value = "90")]
        arch: Vec<u32>,
        /// The cache directory (default: OXCCL_CACHE_DIR, else ~/.cache/oxccl).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Compiler threads (default: the machine's cores).
        #[arg(long)]
        threads: Option<usize>,
        /// Only these element types (default: every one), by NCCL's names or oxccl's.
        #[arg(long, value_delimiter = ',')]
        dtype: Vec<DataType>,
        /// Only these operators (sum, prod, max, min; default: every one).
        #[arg(long, value_delimiter = ',', value_parser = parse_op)]
        op: Vec<KernelOp>,
    },
    /// The cache directory and its entries.
    List {
        /// The cache directory (default: OXCCL_CACHE_DIR, else ~/.cache/oxccl).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

fn cache_at(dir: Option<PathBuf>) -> DiskCache {
    match dir.map(DiskCache::new).or_else(DiskCache::from_env) {
        Some(c) => c,
        None => fail("no cache directory: OXCCL_CACHE_DIR is off or empty and no HOME is set; pass --dir".into()),
    }
}

fn fail(msg: String) -> ! {
    eprintln!("oxccl-kernel-cache: {msg}");
    std::process::exit(1)
}

fn main() {
    match Cli::parse().cmd {
        Cmd::Fill { arch, dir, threads, dtype, op } => {
            let dtypes = if dtype.is_empty() { DataType::ALL.to_vec() } else { dtype };
            let ops = if op.is_empty() { KernelOp::ALL.to_vec() } else { op };
            let cache = cache_at(dir);
            let threads = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
            let t0 = Instant::now();
            let filled = kernels::fill(&cache, &arch, &dtypes, &ops, threads).unwrap_or_else(|e| fail(e.to_string()));
            let made = filled.iter().filter(|f| !f.present).count();
            let (v0, v1) = filled.first().map_or((0, 0), |f| f.key.nvrtc);
            println!(
                "{}: {} modules for {:?} by NVRTC {v0}.{v1}: {made} compiled, {} already there, in {:.1} s",
                cache.dir().display(),
                filled.len(),
                arch,
                filled.len() - made,
                t0.elapsed().as_secs_f64()
            );
        }
        Cmd::List { dir } => {
            let cache = cache_at(dir);
            println!("{}", cache.dir().display());
            let mut names: Vec<String> = std::fs::read_dir(cache.dir())
                .map(|d| {
                    d.filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|n| !n.starts_with('.')).collect()
                })
                .unwrap_or_default();
            names.sort();
            for n in &names {
                println!("  {n}");
            }
            println!("{} entries", names.len());
        }
    }
}
