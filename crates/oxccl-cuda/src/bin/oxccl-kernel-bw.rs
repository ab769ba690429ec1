//! `oxccl-kernel-bw [BYTES] [ITERS]`: oxccl's reduce kernel (2 sources, sum)
//! next to a device-to-device copy of the same size on GPU 0, for f32 and
//! bf16, as memory traffic (bytes read + written per second) and as a
//! fraction of the copy's. Default: 256 MiB, 20 iterations.

use oxccl_core::DataType;
use oxccl_cuda::{Device, bench};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let bytes = args.first().map_or(Ok(256 << 20), |a| a.parse::<usize>()).unwrap_or_else(|_| usage());
    let iters = args.get(1).map_or(Ok(20), |a| a.parse::<usize>()).unwrap_or_else(|_| usage());
    let dev = match Device::open(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("oxccl-kernel-bw: {e}");
            std::process::exit(1);
        }
    };
    println!("# {} (sm_{}), {} bytes per buffer, {iters} iterations", dev.name(), dev.arch(), bytes);
    println!("{:>10} {:>14} {:>14} {:>9}", "type", "copy GB/s", "reduce GB/s", "fraction");
    for dtype in [DataType::Float32, DataType::Bfloat16] {
        match bench::reduce_vs_copy(&dev, dtype, bytes, 2, iters) {
            Ok((copy, red)) => {
                println!(
                    "{:>10} {:>14.1} {:>14.1} {:>9.3}",
                    dtype.name(),
                    copy.gbps(),
                    red.gbps(),
                    red.gbps() / copy.gbps()
                )
            }
            Err(e) => {
                eprintln!("oxccl-kernel-bw: {dtype}: {e}");
                std::process::exit(1);
            }
        }
    }
}

fn usage() -> ! {
    eprintln!("usage: oxccl-kernel-bw [BYTES] [ITERS]");
    std::process::exit(2)
}
