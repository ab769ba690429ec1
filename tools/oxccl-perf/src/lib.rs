//! oxccl-perf: nccl-tests' benchmarks (`all_reduce_perf` and friends) on
//! oxccl communicators, with ranks as threads (`-t`) or as processes under
//! a launcher (`oxccl-run`, `mpirun`, `torchrun`, `srun`).
//!
//! Same binaries, flags, defaults, output columns and bus-bandwidth
//! factors as NVIDIA's nccl-tests, so scripts written for its output
//! parse this one. Modules:
//! - [`args`]: the command line;
//! - [`shape`]: per-collective counts, size sweeps, bandwidths;
//! - the inputs and the check: `oxccl_algo::exact`;
//! - [`bench`]: one rank's timing and check loop;
//! - [`gpu`]: device buffers (`-H gpu`);
//! - [`format`] and [`report`]: the text output and the JSON record;
//! - [`launch`]: threads, launcher processes, exit status.

pub mod args;
pub mod bench;
pub mod buffer;
pub mod format;
pub mod gpu;
pub mod launch;
pub mod report;
pub mod shape;

pub use oxccl::CollKind;

fn program_name(argv0: Option<&String>, fallback: &str) -> String {
    argv0
        .and_then(|a| std::path::Path::new(a).file_name())
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_else(|| fallback.to_string())
}

/// The body of `all_reduce_perf` and the other per-collective binaries.
pub fn main(kind: CollKind) -> ! {
    let argv: Vec<String> = std::env::args().collect();
    let prog = program_name(argv.first(), &format!("{}_perf", kind.name()));
    std::process::exit(launch::cli(kind, &prog, argv.get(1..).unwrap_or(&[]), &argv))
}

/// The body of `oxccl-perf COLLECTIVE [options]`.
pub fn main_named() -> ! {
    let argv: Vec<String> = std::env::args().collect();
    let names: Vec<&str> = CollKind::ALL.iter().map(|k| k.name()).collect();
    let usage = format!(
        "USAGE: oxccl-perf COLLECTIVE [options]\n       oxccl-perf -A PROGRAM.json [options]\n  COLLECTIVE: {}\n",
        names.join(" ")
    );
    let code = match argv.get(1).map(String::as_str) {
        None | Some("-h" | "--help") => {
            println!("{usage}  options: as all_reduce_perf -h shows");
            if argv.len() < 2 { launch::USAGE } else { 0 }
        }
        Some(a) if a.starts_with("-A") || a.starts_with("--program") => {
            let path = if a.contains('=') {
                a.split_once('=').map(|x| x.1.to_string())
            } else if a.len() > 2 && a.starts_with("-A") {
                Some(a[2..].to_string())
            } else {
                argv.get(2).cloned()
            };
            match path.as_deref().map(launch::program_kind) {
                Some(Ok(kind)) => launch::cli(kind, &format!("{}_perf", kind.name()), &argv[1..], &argv),
                Some(Err(e)) => {
                    eprintln!("oxccl-perf: {e}");
                    1
                }
                None => {
                    eprintln!("oxccl-perf: -A needs a program file\n{usage}");
                    launch::USAGE
                }
            }
        }
        Some(name) => match name.parse::<CollKind>() {
            Ok(kind) => launch::cli(kind, &format!("{}_perf", kind.name()), &argv[2..], &argv),
            Err(e) => {
                eprintln!("oxccl-perf: {e}\n{usage}");
                launch::USAGE
            }
        },
    };
    std::process::exit(code)
}
