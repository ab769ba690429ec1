//! nccl-tests' command line: the same short and long options (getopt_long
//! style: `-b 8`, `-b8`, `--minbytes 8`, `--minbytes=8`), the same
//! defaults (nccl-tests' `src/common.cu`), sizes with K/M/G suffixes.
//! Unlike nccl-tests, a bad value is an error, not a silent default.

use oxccl::{DataType, ReduceOp};
use std::path::PathBuf;

/// How the per-rank times of one measurement become the reported time
/// (`-a`): nccl-tests' 0=RANK0, 1=AVG, 2=MIN, 3=MAX.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Average {
    /// Rank 0's time.
    Rank0,
    /// The mean over ranks (the default).
    Mean,
    /// The fastest rank.
    Min,
    /// The slowest rank.
    Max,
}

/// Everything the command line sets.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// `-t`: ranks per process, as threads.
    pub nthreads: usize,
    /// `-g`: GPUs per thread (ranks per thread on device buffers; 1 on host).
    pub ngpus: usize,
    /// `-H`/`--mem` (oxccl): `gpu` runs on device buffers, `host` (default)
    /// on host memory.
    pub gpu: bool,
    /// `-P`/`--ranks_per_gpu` (oxccl): how many of a process's ranks may
    /// share one GPU (default 1, as NCCL before 2.30).
    pub ranks_per_gpu: usize,
    /// `-b`: first size in bytes.
    pub min_bytes: usize,
    /// `-e`: last size in bytes.
    pub max_bytes: usize,
    /// `-i`: increment when `-f` is 1.
    pub step_bytes: usize,
    /// `-f`: multiplier between sizes (1: add `-i` instead).
    pub step_factor: usize,
    /// `-n`: timed iterations per size.
    pub iters: usize,
    /// `-m`: operations aggregated (grouped) per timed iteration.
    pub agg_iters: usize,
    /// `-w`: warm-up iterations per size.
    pub warmup_iters: usize,
    /// `-N`: how many times the size sweep runs (0: forever).
    pub run_cycles: usize,
    /// `-p`: parallel init (ranks always initialise concurrently here).
    pub parallel_init: bool,
    /// `-c`: check iterations per measurement (0: no check).
    pub check: usize,
    /// `-o`: the operator, `None` for `all`.
    pub op: Option<ReduceOp>,
    /// `-d`: the type, `None` for `all`.
    pub dtype: Option<DataType>,
    /// `-r`: the root, `None` for `all` (nccl-tests: `-1`).
    pub root: Option<usize>,
    /// `-z`: 0 no, 1 wait and barrier after each operation, 2 wait only.
    pub blocking: u8,
    /// `-y`: accepted for compatibility (no streams on host).
    pub stream_null: bool,
    /// `-T`: seconds before a stuck operation fails (0: oxccl's default).
    pub timeout: u64,
    /// `-C`: label the time column `cputime`.
    pub report_cputime: bool,
    /// `-S`: a timestamp at the end of each row.
    pub report_timestamps: bool,
    /// `-J`: write a JSON record of the run to this file.
    pub output_file: Option<PathBuf>,
    /// `-a`: how per-rank times combine.
    pub average: Average,
    /// `-u`: misalign buffers by this many elements.
    pub unalign: usize,
    /// `-I`: per-iteration timing columns.
    pub per_iter_timing: bool,
    /// `-A`/`--program` (oxccl): benchmark this researcher's program (a
    /// JSON file) instead of the built-in algorithms.
    pub program: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            nthreads: 1,
            ngpus: 1,
            gpu: false,
            ranks_per_gpu: 1,
            min_bytes: 32 << 20,
            max_bytes: 32 << 20,
            step_bytes: 1 << 20,
            step_factor: 1,
            iters: 20,
            agg_iters: 1,
            warmup_iters: 1,
            run_cycles: 1,
            parallel_init: false,
            check: 1,
            op: Some(ReduceOp::Sum),
            dtype: Some(DataType::Float32),
            root: Some(0),
            blocking: 0,
            stream_null: false,
            timeout: 0,
            report_cputime: false,
            report_timestamps: false,
            output_file: None,
            average: Average::Mean,
            unalign: 0,
            per_iter_timing: false,
            program: None,
        }
    }
}

/// What the command line asks for.
#[derive(Debug, PartialEq)]
pub enum Command {
    /// Run the benchmark.
    Run(Box<Options>),
    /// Print the usage (`-h`).
    Help,
}

/// (short, long) for every option; all take a value except `-h`.
const OPTIONS: &[(char, &str)] = &[
    ('t', "nthreads"),
    ('g', "ngpus"),
    ('b', "minbytes"),
    ('e', "maxbytes"),
    ('i', "stepbytes"),
    ('f', "stepfactor"),
    ('n', "iters"),
    ('m', "agg_iters"),
    ('w', "warmup_iters"),
    ('N', "run_cycles"),
    ('p', "parallel_init"),
    ('c', "check"),
    ('o', "op"),
    ('d', "datatype"),
    ('r', "root"),
    ('z', "blocking"),
    ('y', "stream_null"),
    ('T', "timeout"),
    ('G', "cudagraph"),
    ('C', "report_cputime"),
    ('S', "report_timestamps"),
    ('J', "output_file"),
    ('a', "average"),
    ('R', "local_register"),
    ('x', "cta_policy"),
    ('D', "device_implementation"),
    ('V', "device_cta_count"),
    ('M', "memory"),
    ('u', "unalign"),
    ('I', "per_iter_timing"),
    ('H', "mem"),
    ('P', "ranks_per_gpu"),
    ('A', "program"),
];

/// The usage text, in nccl-tests' shape.
pub fn usage(prog: &str) -> String {
    let lines = [
        "[-t,--nthreads <num threads>] ranks of this process, as threads",
        "[-g,--ngpus <gpus per thread>] ranks per thread on GPUs; 1 on host",
        "[-H,--mem <host/gpu>] buffers in host memory (default) or on GPUs (oxccl)",
        "[-P,--ranks_per_gpu <num>] ranks of this process that may share one GPU (default 1; oxccl)",
        "[-A,--program <file.json>] benchmark this program (oxccl's IR, verified when loaded) (oxccl)",
        "[-b,--minbytes <min size in bytes>] (K/M/G suffixes; default 32M)",
        "[-e,--maxbytes <max size in bytes>] (default 32M)",
        "[-i,--stepbytes <increment size>] (default 1M)",
        "[-f,--stepfactor <increment factor>]",
        "[-n,--iters <iteration count>] (default 20)",
        "[-m,--agg_iters <aggregated iteration count>]",
        "[-w,--warmup_iters <warmup iteration count>] (default 1)",
        "[-N,--run_cycles <cycle count> run & print each cycle (default: 1; 0=infinite)]",
        "[-p,--parallel_init <0/1>]",
        "[-c,--check <check iteration count>] (0: no check)",
        "[-o,--op <sum/prod/min/max/avg/mulsum/all>]",
        "[-d,--datatype <int8/uint8/int32/uint32/int64/uint64/half/float/double/bfloat16/f8e4m3/f8e5m2/all>]",
        "[-r,--root <root/all>] (-1 = all)",
        "[-z,--blocking <0/1/2> 1=wait for completion and barrier, 2=wait without barrier]",
        "[-y,--stream_null <0/1>] (no effect on host)",
        "[-T,--timeout <time in seconds>]",
        "[-C,--report_cputime <0/1>]",
        "[-S,--report_timestamps <0/1> report timestamps (default 0)]",
        "[-J,--output_file <file.json> write a JSON record of the run]",
        "[-a,--average <0/1/2/3> report average iteration time <0=RANK0/1=AVG/2=MIN/3=MAX>]",
        "[-u,--unalign <index of first element> Misalign source and destination buffers (default: 0)]",
        "[-I,--per_iter_timing <0/1> per-iteration timing (default: 0)]",
        "[-G,-R,-x,-D,-V,-M: GPU options, accepted only at their default]",
        "[-h,--help]",
    ];
    let mut s = format!("USAGE: {prog} \n\t");
    for l in lines {
        s.push_str(l);
        s.push_str(" \n\t");
    }
    s.push('\n');
    s
}

/// A non-negative integer as strtol(…, 0) reads it: decimal or `0x` hex.
pub fn parse_int(flag: &str, v: &str) -> Result<i64, String> {
    let t = v.trim();
    let (neg, body) = match t.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let parsed = match body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
        Some(hex) => i64::from_str_radix(hex, 16),
        None => body.parse::<i64>(),
    };
    match parsed {
        Ok(n) if neg => Ok(-n),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("invalid value {v:?} for {flag}: expected an integer")),
    }
}

fn parse_uint(flag: &str, v: &str, min: i64, max: i64) -> Result<usize, String> {
    let n = parse_int(flag, v)?;
    if n < min || n > max {
        return Err(format!("invalid value {v:?} for {flag}: expected {min}..={max}"));
    }
    Ok(n as usize)
}

/// A size in bytes: a number with an optional K, M or G (binary units,
/// as nccl-tests' `parsesize`), optionally followed by `B`.
pub fn parse_size(flag: &str, v: &str) -> Result<usize, String> {
    oxccl_core::size::parse_size(v)
        .ok_or_else(|| format!("invalid size {v:?} for {flag}: expected {}", oxccl_core::size::SIZE_FORMS))
}

fn set(o: &mut Options, flag: char, v: &str) -> Result<(), String> {
    let name = format!("-{flag}");
    let f = name.as_str();
    let bool01 = |v: &str| parse_uint(f, v, 0, 1).map(|n| n == 1);
    match flag {
        't' => o.nthreads = parse_uint(f, v, 1, 1024)?,
        'g' => {
            o.ngpus = parse_uint(f, v, 1, 1024)?;
        }
        'H' => {
            o.gpu = match v {
                "gpu" | "device" | "cuda" => true,
                "host" => false,
                _ => return Err(format!("-H {v}: expected host or gpu")),
            }
        }
        'P' => o.ranks_per_gpu = parse_uint(f, v, 1, 1024)?,
        'A' => o.program = Some(PathBuf::from(v)),
        'b' => o.min_bytes = parse_size(f, v)?,
        'e' => o.max_bytes = parse_size(f, v)?,
        'i' => o.step_bytes = parse_size(f, v)?,
        'f' => o.step_factor = parse_uint(f, v, 1, 1 << 20)?,
        'n' => o.iters = parse_uint(f, v, 1, i32::MAX as i64)?,
        'm' => o.agg_iters = parse_uint(f, v, 1, 1 << 20)?,
        'w' => o.warmup_iters = parse_uint(f, v, 0, i32::MAX as i64)?,
        'N' => o.run_cycles = parse_uint(f, v, 0, i32::MAX as i64)?,
        'p' => o.parallel_init = bool01(v)?,
        'c' => o.check = parse_uint(f, v, 0, i32::MAX as i64)?,
        'o' => o.op = if v == "all" { None } else { Some(v.parse().map_err(|e| format!("-o: {e}"))?) },
        'd' => o.dtype = if v == "all" { None } else { Some(v.parse().map_err(|e| format!("-d: {e}"))?) },
        'r' => {
            o.root = match v {
                "all" => None,
                _ if parse_int(f, v)? == -1 => None,
                _ => Some(parse_uint(f, v, 0, i32::MAX as i64)?),
            }
        }
        'z' => o.blocking = parse_uint(f, v, 0, 2)? as u8,
        'y' => o.stream_null = bool01(v)?,
        'T' => o.timeout = parse_uint(f, v, 0, i32::MAX as i64)? as u64,
        'C' => o.report_cputime = bool01(v)?,
        'S' => o.report_timestamps = bool01(v)?,
        'J' => {
            let p = PathBuf::from(v);
            let json = p.extension().is_some_and(|e| e.eq_ignore_ascii_case("json"));
            if !json {
                return Err(format!("-J {v}: only JSON output is supported; name the file *.json"));
            }
            o.output_file = Some(p);
        }
        'a' => {
            o.average = match parse_uint(f, v, 0, 3)? {
                0 => Average::Rank0,
                1 => Average::Mean,
                2 => Average::Min,
                _ => Average::Max,
            }
        }
        'u' => o.unalign = parse_uint(f, v, 0, 1 << 20)?,
        'I' => o.per_iter_timing = bool01(v)?,
        'V' => {
            parse_uint(f, v, 1, 128)?;
        }
        'G' | 'R' | 'D' | 'M' | 'x' => {
            let off = if flag == 'x' { -1 } else { 0 };
            if parse_int(f, v)? != off {
                return Err(format!("-{flag} {v}: not implemented by oxccl-perf; it can only be {off}"));
            }
        }
        _ => unreachable!("option table and setter disagree on -{flag}"),
    }
    Ok(())
}

/// Parses the arguments after the program name (and after the collective
/// name, for `oxccl-perf COLL`).
pub fn parse(args: &[String]) -> Result<Command, String> {
    let mut o = Options::default();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        i += 1;
        if a == "-h" || a == "--help" {
            return Ok(Command::Help);
        }
        let (flag, inline) = if let Some(long) = a.strip_prefix("--") {
            let (name, val) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (long, None),
            };
            let Some(&(c, _)) = OPTIONS.iter().find(|(_, l)| *l == name) else {
                return Err(format!("unknown option --{name}"));
            };
            (c, val)
        } else if let Some(short) = a.strip_prefix('-').filter(|s| !s.is_empty()) {
            let c = short.chars().next().expect("not empty");
            if !OPTIONS.iter().any(|(s, _)| *s == c) {
                return Err(format!("unknown option -{c}"));
            }
            let rest = &short[c.len_utf8()..];
            (c, (!rest.is_empty()).then(|| rest.to_string()))
        } else {
            return Err(format!("unexpected argument {a:?}; options start with -"));
        };
        let value = match inline {
            Some(v) => v,
            None => {
                let v = args.get(i).ok_or_else(|| format!("option -{flag} needs a value"))?;
                i += 1;
                v.clone()
            }
        };
        set(&mut o, flag, &value)?;
    }
    if o.min_bytes > o.max_bytes {
        return Err(format!("invalid sizes for 'minbytes' and 'maxbytes': {} > {}", o.min_bytes, o.max_bytes));
    }
    if o.step_factor <= 1 && o.step_bytes == 0 && o.min_bytes < o.max_bytes {
        return Err("-i 0 with -f 1: the sizes would never reach maxbytes".into());
    }
    if o.step_factor > 1 && o.min_bytes == 0 && o.max_bytes > 0 {
        return Err("-b 0 with -f > 1: the sizes would never grow; start at 1 byte or more".into());
    }
    if !o.gpu && (o.ngpus != 1 || o.ranks_per_gpu != 1) {
        return Err(format!(
            "-g {} -P {}: GPU options; on host memory (the default, -H host) use -g 1 and -t for ranks",
            o.ngpus, o.ranks_per_gpu
        ));
    }
    Ok(Command::Run(Box::new(o)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Options, String> {
        let v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        match parse(&v)? {
            Command::Run(o) => Ok(*o),
            Command::Help => Err("help".into()),
        }
    }

    #[test]
    fn defaults_are_nccl_tests_defaults() {
        let o = run(&[]).unwrap();
        assert_eq!((o.min_bytes, o.max_bytes, o.step_bytes, o.step_factor), (32 << 20, 32 << 20, 1 << 20, 1));
        assert_eq!((o.iters, o.warmup_iters, o.agg_iters, o.check, o.run_cycles), (20, 1, 1, 1, 1));
        assert_eq!(
            (o.op, o.dtype, o.root, o.average),
            (Some(ReduceOp::Sum), Some(DataType::Float32), Some(0), Average::Mean)
        );
    }

    #[test]
    fn short_long_and_attached_forms() {
        let o = run(&["-b", "8", "-e128M", "--stepfactor", "4", "--iters=7", "-t", "3", "-d", "half", "-o", "max"])
            .unwrap();
        assert_eq!((o.min_bytes, o.max_bytes, o.step_factor, o.iters, o.nthreads), (8, 128 << 20, 4, 7, 3));
        assert_eq!((o.dtype, o.op), (Some(DataType::Float16), Some(ReduceOp::Max)));
        let o = run(&["-d", "all", "-o", "all", "-r", "all", "-a", "3", "-J", "x.json", "-I", "1"]).unwrap();
        assert_eq!((o.dtype, o.op, o.root, o.average, o.per_iter_timing), (None, None, None, Average::Max, true));
        assert_eq!(run(&["-r", "-1"]).unwrap().root, None);
        assert_eq!(run(&["-r", "2"]).unwrap().root, Some(2));
        assert_eq!(run(&["-g", "1", "-G", "0", "-x", "-1", "-y", "1"]).unwrap().ngpus, 1);
        let g = run(&["-H", "gpu", "-g", "2", "--ranks_per_gpu=4"]).unwrap();
        assert_eq!((g.gpu, g.ngpus, g.ranks_per_gpu), (true, 2, 4));
        assert!(run(&["-g", "2"]).unwrap_err().contains("-H host"));
        assert!(run(&["-H", "tpu"]).unwrap_err().contains("host or gpu"));
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("-b", "8").unwrap(), 8);
        assert_eq!(parse_size("-b", "1K").unwrap(), 1024);
        assert_eq!(parse_size("-b", "1.5m").unwrap(), 3 << 19);
        assert_eq!(parse_size("-b", "2G").unwrap(), 2 << 30);
        assert_eq!(parse_size("-b", "32MB").unwrap(), 32 << 20);
        for bad in ["", "x", "8Q", "-1", "1KK", "M"] {
            assert!(parse_size("-b", bad).unwrap_err().contains("-b"), "{bad}");
        }
    }

    #[test]
    fn bad_input_is_an_error_naming_it() {
        let cases: &[(&[&str], &str)] = &[
            (&["-q", "1"], "unknown option -q"),
            (&["--bogus=1"], "--bogus"),
            (&["-n"], "needs a value"),
            (&["-n", "x"], "-n"),
            (&["-n", "0"], "-n"),
            (&["-g", "2"], "-g 2"),
            (&["-d", "float128"], "float128"),
            (&["-o", "xor"], "xor"),
            (&["-a", "4"], "-a"),
            (&["-z", "3"], "-z"),
            (&["-b", "1M", "-e", "1K"], "minbytes"),
            (&["-G", "1"], "not implemented"),
            (&["-J", "out.csv"], "JSON"),
            (&["-b", "0", "-e", "8", "-f", "2"], "never grow"),
            (&["stray"], "stray"),
        ];
        for (args, needle) in cases {
            let e = run(args).unwrap_err();
            assert!(e.contains(needle), "{args:?}: {e}");
        }
        assert_eq!(run(&["-h"]).unwrap_err(), "help");
        assert!(usage("all_reduce_perf").contains("--minbytes"));
    }
}
