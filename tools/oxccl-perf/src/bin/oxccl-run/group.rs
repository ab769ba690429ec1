//! Signalling the ranks' process groups without `unsafe`: the standard
//! library sends only SIGKILL, and only to one process, so this runs
//! `kill(1)` (procps), or the shell's built-in `kill` where that is missing.

use std::process::{Command, Stdio};

/// Names of the signals oxccl-run sends or forwards, by number.
pub fn name(sig: i32) -> &'static str {
    match sig {
        1 => "HUP",
        2 => "INT",
        3 => "QUIT",
        6 => "ABRT",
        9 => "KILL",
        11 => "SEGV",
        13 => "PIPE",
        15 => "TERM",
        _ => "",
    }
}

/// Sends signal `sig` (a name such as `TERM`) to every process group in
/// `pgids`. Groups that are gone are skipped silently; the error says why
/// no `kill` could be run at all.
pub fn signal(pgids: &[u32], sig: &str) -> Result<(), String> {
    if pgids.is_empty() {
        return Ok(());
    }
    let targets: Vec<String> = pgids.iter().map(|p| format!("-{p}")).collect();
    let quiet = |c: &mut Command| {
        c.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    };
    let mut direct = Command::new("kill");
    direct.args(["-s", sig, "--"]).args(&targets);
    quiet(&mut direct);
    // A non-zero status means some group was already gone: that is fine.
    if direct.status().is_ok() {
        return Ok(());
    }
    let mut shell = Command::new("/bin/sh");
    shell.args(["-c", "kill -s \"$0\" -- \"$@\"", sig]).args(&targets);
    quiet(&mut shell);
    shell.status().map(|_| ()).map_err(|e| format!("cannot run kill(1) or /bin/sh to send SIG{sig}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::time::{Duration, Instant};

    #[test]
    fn a_group_and_its_children_are_stopped() {
        // sh in a group of its own, with a child sleep in the same group.
        let mut c = Command::new("sh").args(["-c", "sleep 30 & wait"]).process_group(0).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let t = Instant::now();
        signal(&[c.id()], "TERM").unwrap();
        let st = c.wait().unwrap();
        assert!(t.elapsed() < Duration::from_secs(5));
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(st.signal(), Some(15), "{st:?}");
        // A group that does not exist is no error.
        signal(&[c.id()], "KILL").unwrap();
        assert_eq!(name(15), "TERM");
    }
}
