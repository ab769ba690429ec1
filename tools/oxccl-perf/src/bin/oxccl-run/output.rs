//! `--tag-output`: copies a rank's stdout or stderr line by line, each line
//! prefixed with `[R] ` and written whole, so ranks' lines never mix.

use std::io::{BufRead, BufReader, Read, Write};
use std::sync::mpsc::Sender;
use std::thread::JoinHandle;

/// The prefix of rank `rank`'s lines among `np` ranks: `[R] `, R
/// right-aligned to the width of the largest rank.
pub fn prefix(rank: usize, np: usize) -> String {
    let width = np.saturating_sub(1).to_string().len();
    format!("[{rank:>width$}] ")
}

/// Copies `from` to `to` with `prefix` on every line (a last line without
/// a newline gets one), then sends `()` on `done`. Errors writing (a closed
/// stdout) are ignored, and reading goes on so the rank never blocks.
pub fn pump<R, W>(from: R, to: fn() -> W, prefix: String, done: Sender<()>) -> JoinHandle<()>
where
    R: Read + Send + 'static,
    W: Write + 'static,
{
    std::thread::spawn(move || {
        let mut r = BufReader::with_capacity(1 << 16, from);
        let mut line = Vec::with_capacity(256);
        let mut out = Vec::with_capacity(256);
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            out.clear();
            out.extend_from_slice(prefix.as_bytes());
            out.extend_from_slice(&line);
            if !line.ends_with(b"\n") {
                out.push(b'\n');
            }
            let mut w = to();
            let _ = w.write_all(&out).and_then(|_| w.flush());
        }
        let _ = done.send(());
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes() {
        assert_eq!(prefix(1, 4), "[1] ");
        assert_eq!(prefix(3, 16), "[ 3] ");
        assert_eq!(prefix(0, 1), "[0] ");
        assert_eq!(prefix(10, 11), "[10] ");
    }
}
