//! The C ABI as C programs see it: the header compiles in C and C++
//! without CUDA, declares nothing the library does not export, has NCCL's
//! layouts and values, and C programs linked to the library run every
//! collective on host memory (ranks as threads, in groups, as processes,
//! under mpirun) and get NCCL's error codes.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn here() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Where the built library is, with its `libnccl.so.2` name: the test
/// binary's own directory (`target/<profile>/deps`), where cargo rebuilds
/// the library for the tests (the copy one level up is refreshed only by
/// builds of the library itself).
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe.parent().expect("target/<profile>/deps").to_path_buf();
    assert!(dir.join("libnccl.so").exists(), "libnccl.so not built in {}", dir.display());
    let so2 = dir.join("libnccl.so.2");
    if std::fs::metadata(&so2).is_err() {
        let _ = std::fs::remove_file(&so2);
        // Tests run in parallel: another may have made the link meanwhile.
        match std::os::unix::fs::symlink("libnccl.so", &so2) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => panic!("link libnccl.so.2: {e}"),
            _ => {}
        }
    }
    dir
}

/// A scratch directory of its own for each caller (tests run in parallel
/// and may build the same program: one writing a binary another runs
/// fails with "Text file busy").
fn scratch(name: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = lib_dir().join("c-abi-tests").join(format!("{name}-{}-{k}", std::process::id()));
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

fn have(tool: &str) -> bool {
    Command::new(tool).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
}

/// Compiles `src` (in tests/c) with `cc` against the header and the library.
fn build(cc: &str, src: &str, extra: &[&str]) -> PathBuf {
    let name = src.trim_start_matches("../").trim_end_matches(".c");
    let out = scratch(name).join(name);
    let lib = lib_dir();
    let status = Command::new(cc)
        .args(["-O1", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(here().join("include"))
        .arg("-I")
        .arg(here().join("tests/c"))
        .arg(match src.strip_prefix("../") {
            Some(example) => here().join("examples").join(example),
            None => here().join("tests/c").join(src),
        })
        .arg("-L")
        .arg(&lib)
        .args(["-l:libnccl.so", "-lpthread", "-lm"])
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(extra)
        .arg("-o")
        .arg(&out)
        .status()
        .unwrap_or_else(|e| panic!("cannot run {cc}: {e}"));
    assert!(status.success(), "{cc} {src} failed");
    out
}

/// Runs a command with a deadline (killed after it), small oxccl timeouts;
/// its stdout.
fn run(cmd: &mut Command, limit: Duration) -> String {
    // cargo test's LD_LIBRARY_PATH names target/<profile> first, whose copy
    // of the library may be stale (see lib_dir): it would win over the
    // binary's rpath.
    cmd.env("LD_LIBRARY_PATH", lib_dir()).env("OXCCL_TIMEOUT", "30").stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    let start = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("{cmd:?} ran past {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{cmd:?} failed ({}):\n{stdout}\n{stderr}", out.status);
    stdout.into_owned()
}

#[test]
fn header_compiles_in_c_and_cpp_without_cuda() {
    let dir = scratch("header");
    let src = dir.join("h.c");
    std::fs::write(
        &src,
        "#include \"nccl.h\"\nint main(void) { ncclConfig_t c = NCCL_CONFIG_INITIALIZER; ncclSimInfo_t s = \
         NCCL_SIM_INFO_INITIALIZER; ncclCollConfig_t cc = NCCL_COLLCONFIG_INITIALIZER; cudaStream_t st = 0; \
         (void)c; (void)s; (void)cc; (void)st; return 0; }\n",
    )
    .unwrap();
    let cpp = dir.join("h.cpp");
    std::fs::copy(&src, &cpp).unwrap();
    for (cc, file, std) in [("gcc", &src, "-std=c99"), ("gcc", &src, "-std=c11"), ("g++", &cpp, "-std=c++11")] {
        for no_cuda in [false, true] {
            let mut c = Command::new(cc);
            c.args(["-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-pedantic", std, "-I"])
                .arg(here().join("include"));
            if no_cuda {
                c.arg("-DOXCCL_NO_CUDA_RUNTIME");
            }
            let st = c.arg(file).status().expect(cc);
            assert!(st.success(), "nccl.h does not compile with {cc} {std} (no CUDA headers forced: {no_cuda})");
        }
    }
}

#[test]
fn every_declared_function_is_exported_with_its_pnccl_twin() {
    let header = std::fs::read_to_string(here().join("include/nccl.h")).unwrap();
    let declared: Vec<String> = header
        .lines()
        .filter_map(|l| l.trim().strip_prefix("OXCCL_API("))
        .filter_map(|l| l.split(',').nth(1))
        .map(|n| n.trim().to_string())
        .collect();
    assert!(declared.len() >= 73, "only {} functions found in nccl.h", declared.len());
    let nm = Command::new("nm").args(["-D", "--defined-only"]).arg(lib_dir().join("libnccl.so")).output().expect("nm");
    let syms: std::collections::HashSet<String> = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .map(String::from)
        .collect();
    let missing: Vec<String> =
        declared.iter().flat_map(|n| [format!("nccl{n}"), format!("pnccl{n}")]).filter(|s| !syms.contains(s)).collect();
    assert!(missing.is_empty(), "declared in nccl.h but not exported: {missing:?}");
    let so = Command::new("readelf").arg("-d").arg(lib_dir().join("libnccl.so")).output().expect("readelf");
    assert!(String::from_utf8_lossy(&so.stdout).contains("[libnccl.so.2]"), "soname is not libnccl.so.2");
}

#[test]
fn layouts_and_values_are_nccls() {
    let bin = build("gcc", "layout.c", &[]);
    let out = run(&mut Command::new(bin), Duration::from_secs(30));
    let got: std::collections::HashMap<&str, i64> =
        out.lines().filter_map(|l| l.split_once(' ')).map(|(k, v)| (k, v.parse().unwrap())).collect();
    use nccl::abi::{CollConfigHead, ConfigC, EncryptionC, SimInfoC};
    use std::mem::{offset_of, size_of};
    let want: [(&str, i64); 36] = [
        ("sizeof.ncclUniqueId", 128),
        ("sizeof.ncclConfig_t", 120),
        ("sizeof.ncclSimInfo_t", 24),
        ("sizeof.ncclCollConfig_t", 72),
        ("sizeof.ncclRedOp_t", 4),
        ("sizeof.ncclDataType_t", 4),
        ("sizeof.ncclEncryptionConfig_t", 32),
        ("ncclEncryptionConfig_t.mode", 16),
        ("ncclEncryptionConfig_t.psk", 24),
        ("ncclConfig_t.blocking", 16),
        ("ncclConfig_t.netName", 32),
        ("ncclConfig_t.commName", 48),
        ("ncclConfig_t.graphStreamOrdering", 92),
        ("ncclConfig_t.nvlsHostMode", 112),
        ("ncclSimInfo_t.estimatedTime", 16),
        ("ncclCollConfig_t.launchCompletionEvent", 64),
        ("init.size", 120),
        ("init.magic", 0xcafe_beef),
        ("init.version", 23203),
        ("init.blocking", i32::MIN as i64),
        ("init.nvlsHostMode", i32::MIN as i64),
        ("sim.magic", 0x7468_5283),
        ("ncclSuccess", 0),
        ("ncclInProgress", 7),
        ("ncclTimeout", 8),
        ("ncclNumResults", 9),
        ("ncclAvg", 4),
        ("ncclNumOps", 5),
        ("ncclMaxRedOp", 0x7fff_ffff),
        ("ncclBfloat16", 9),
        ("ncclFloat8e4m3", 10),
        ("ncclFloat8e5m2", 11),
        ("ncclNumTypes", 12),
        ("ncclScalarHostImmediate", 1),
        ("NCCL_SPLIT_NOCOLOR", -1),
        ("NCCL_CONFIG_UNDEF_INT", i32::MIN as i64),
    ];
    for (k, v) in want {
        assert_eq!(got.get(k), Some(&v), "{k}");
    }
    // The Rust side reads the same layouts.
    assert_eq!(size_of::<ConfigC>() as i64, got["sizeof.ncclConfig_t"]);
    assert_eq!(offset_of!(ConfigC, blocking) as i64, got["ncclConfig_t.blocking"]);
    assert_eq!(offset_of!(ConfigC, commName) as i64, got["ncclConfig_t.commName"]);
    assert_eq!(offset_of!(ConfigC, nvlsHostMode) as i64, got["ncclConfig_t.nvlsHostMode"]);
    assert_eq!(size_of::<SimInfoC>() as i64, got["sizeof.ncclSimInfo_t"]);
    assert_eq!(offset_of!(SimInfoC, estimatedTime) as i64, got["ncclSimInfo_t.estimatedTime"]);
    assert_eq!(size_of::<CollConfigHead>(), 16);
    assert_eq!(size_of::<EncryptionC>() as i64, got["sizeof.ncclEncryptionConfig_t"]);
    assert_eq!(offset_of!(EncryptionC, psk) as i64, got["ncclEncryptionConfig_t.psk"]);
    assert_eq!(nccl::abi::VERSION_CODE as i64, got["init.version"]);
    assert_eq!(nccl::error::NUM_RESULTS as i64, got["ncclNumResults"]);
}

#[test]
fn every_collective_type_and_op_as_threads_driven_by_one_thread_in_groups() {
    let bin = build("gcc", "colls.c", &[]);
    for n in 1..=8 {
        let out = run(Command::new(&bin).args(["group", &n.to_string()]), Duration::from_secs(240));
        assert!(out.contains("PASS"), "{n} ranks: {out}");
    }
    // OXCCL_CHECK's comparison waits for every rank: one thread driving
    // three must not deadlock on it.
    let out = run(Command::new(&bin).args(["group", "3"]).env("OXCCL_CHECK", "1"), Duration::from_secs(240));
    assert!(out.contains("PASS"), "with OXCCL_CHECK=1: {out}");
}

#[test]
fn every_collective_type_and_op_as_pthreads_and_as_processes() {
    let bin = build("gcc", "colls.c", &[]);
    let out = run(Command::new(&bin).args(["threads", "4"]), Duration::from_secs(240));
    assert!(out.contains("PASS"), "{out}");
    let out = run(Command::new(&bin).args(["procs", "3"]), Duration::from_secs(240));
    assert_eq!(out.matches("checks").count(), 3, "{out}");
    assert!(out.contains("PASS"), "{out}");
}

#[test]
fn errors_codes_nonblocking_init_and_destroyed_handles() {
    let bin = build("gcc", "errors.c", &[]);
    let out = run(&mut Command::new(bin), Duration::from_secs(120));
    assert!(out.contains("PASS"), "{out}");
}

#[test]
fn mpi_programs_bootstrap_through_the_nccl_api() {
    if !have("mpicc") || !have("mpirun") {
        oxccl_skip::skip_or_fail(
            "OXCCL_REQUIRE_MPI",
            "mpicc/mpirun not installed (apt install libopenmpi-dev openmpi-bin)",
        );
        return;
    }
    let bin = build("mpicc", "mpi.c", &[]);
    let mut cmd = Command::new("mpirun");
    cmd.args(["--allow-run-as-root", "--oversubscribe", "-np", "4"]).arg(bin);
    cmd.env("OMPI_MCA_rmaps_base_oversubscribe", "1");
    let out = run(&mut cmd, Duration::from_secs(120));
    assert!(out.contains("PASS 4 ranks"), "{out}");
}

#[test]
fn nccl_variables_are_honoured_and_oxccl_twins_win() {
    let bin = build("gcc", "env.c", &[]);
    let dir = scratch("env-logs");
    // NCCL_DEBUG=VERSION prints the version line, into NCCL_DEBUG_FILE
    // (%p: the process id).
    let log = dir.join("nccl.%p.log");
    let out = run(
        Command::new(&bin).arg("ok").env("NCCL_DEBUG", "VERSION").env("NCCL_DEBUG_FILE", &log),
        Duration::from_secs(60),
    );
    assert!(out.contains("PASS"), "{out}");
    let logs: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert_eq!(logs.len(), 1, "one log file, named with the pid");
    let text = std::fs::read_to_string(logs[0].path()).unwrap();
    assert!(text.contains("NCCL version 2.32.3"), "{text:?}");
    assert!(!logs[0].file_name().to_string_lossy().contains("%p"));
    // A malformed NCCL_BUFFSIZE is refused by its name; the OXCCL_ twin wins.
    let out =
        run(Command::new(&bin).args(["fail", "NCCL_BUFFSIZE"]).env("NCCL_BUFFSIZE", "lots"), Duration::from_secs(60));
    assert!(out.contains("PASS"), "{out}");
    let out = run(
        Command::new(&bin).arg("ok").env("NCCL_BUFFSIZE", "lots").env("OXCCL_BUFFSIZE", "1048576"),
        Duration::from_secs(60),
    );
    assert!(out.contains("PASS"), "{out}");
    // NCCL_ALGO reaches the tuner: an algorithm that does not exist is named.
    let out =
        run(Command::new(&bin).args(["fail", "nosuchalgo"]).env("NCCL_ALGO", "nosuchalgo"), Duration::from_secs(60));
    assert!(out.contains("PASS"), "{out}");
    let out =
        run(Command::new(&bin).arg("ok").env("NCCL_ALGO", "ring").env("NCCL_PROTO", "LL128"), Duration::from_secs(60));
    assert!(out.contains("PASS"), "{out}");
}

/// OXCCL_DETERMINISTIC reaches the C ABI: the canonical order's bits
/// whatever NCCL_ALGO's list leaves (the tuner's pick, the ordered
/// algorithm), a refusal naming the mode for one it does not prove
/// canonical, and other bits without the mode.
#[test]
fn the_deterministic_mode_is_read_from_the_environment() {
    let bin = build("gcc", "deterministic.c", &[]);
    let limit = Duration::from_secs(60);
    for algo in ["", "ordered"] {
        let out = run(Command::new(&bin).arg("canon").env("OXCCL_DETERMINISTIC", "1").env("NCCL_ALGO", algo), limit);
        assert!(out.contains("PASS"), "NCCL_ALGO={algo:?}: {out}");
    }
    let out = run(Command::new(&bin).arg("refused").env("OXCCL_DETERMINISTIC", "1").env("NCCL_ALGO", "ring"), limit);
    assert!(out.contains("PASS"), "{out}");
    let out = run(Command::new(&bin).arg("differs").env("OXCCL_DETERMINISTIC", "0").env("NCCL_ALGO", "ring"), limit);
    assert!(out.contains("PASS"), "{out}");
}

#[test]
fn the_readme_example_runs() {
    let bin = build("gcc", "../allreduce.c", &[]);
    let out = run(&mut Command::new(bin), Duration::from_secs(60));
    assert!(out.contains("rank 3 holds 6"), "{out}");
}
