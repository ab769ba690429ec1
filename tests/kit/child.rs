//! Ranks as processes: the test binary is its own child. A `child` test
//! (ignored by default) is the rank's body, started with `--ignored --exact
//! child` and told what to do through `OXCCL_TEST_*` variables.

use oxccl::UniqueId;
use std::process::{Child, Command, Stdio};

/// What a child was started to do: (mode, id, rank, size), or `None`
/// when the `child` test runs on its own (not started by a test).
pub fn rank_env() -> Option<(String, UniqueId, usize, usize)> {
    let mode = std::env::var("OXCCL_TEST_MODE").ok()?;
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} not set"));
    let id: UniqueId = var("OXCCL_TEST_ID").parse().unwrap();
    Some((mode, id, var("OXCCL_TEST_RANK").parse().unwrap(), var("OXCCL_TEST_SIZE").parse().unwrap()))
}

/// Prints the child's outcome the way the parent reads it (`OK`, or
/// `ERROR …` and exit status 3).
pub fn report(result: Result<(), String>) {
    match result {
        Ok(()) => println!("OK"),
        Err(e) => {
            println!("ERROR {e}");
            std::process::exit(3);
        }
    }
}

/// A fresh id whose port rank 0 (a child) will bind.
pub fn fresh_id() -> UniqueId {
    let id = UniqueId::new().unwrap();
    drop(oxccl_transport::id::take_listener(&id));
    id
}

/// Starts rank `rank` of `size` in `mode` (under `prefix`, e.g. `ip netns
/// exec NS`), with `envs` added; its stdout is piped.
pub fn spawn(prefix: &[String], id: &UniqueId, size: usize, rank: usize, mode: &str, envs: &[(&str, &str)]) -> Child {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = if prefix.is_empty() {
        Command::new(&exe)
    } else {
        let mut c = Command::new(&prefix[0]);
        c.args(&prefix[1..]).arg(&exe);
        c
    };
    cmd.args(["--ignored", "--exact", "child", "--nocapture", "--test-threads=1"])
        .env("OXCCL_TEST_MODE", mode)
        .env("OXCCL_TEST_ID", id.to_string())
        .env("OXCCL_TEST_RANK", rank.to_string())
        .env("OXCCL_TEST_SIZE", size.to_string())
        .env("OXCCL_TIMEOUT", "60")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn a rank")
}

/// Waits for a child: whether it succeeded, and its stdout.
pub fn output(c: Child) -> (bool, String) {
    let out = c.wait_with_output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).to_string())
}
