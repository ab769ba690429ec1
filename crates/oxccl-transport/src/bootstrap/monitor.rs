//! The monitor thread: reads the star's connections, files all-gather
//! pieces, and turns EOFs and abort notices into recorded failures.
//!
//! It also beats: every [`BEAT`] each end of every connection sends a
//! heartbeat. A process that is stopped (SIGSTOP, a debugger) or hung as
//! a whole keeps its sockets open and its kernel keeps answering TCP, so
//! nothing else would tell it from a slow peer; silence for half the
//! communicator's timeout (at least [`MIN_SILENCE`]) is declared a failure
//! of that rank, before its peers' own waits time out blaming whichever
//! live neighbour they were waiting for.

use std::io::{ErrorKind, Read};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::frame::{self, Dec, FrameBuf, tag};
use super::{Shared, sealed, sys};
use crate::Error;
use crate::seal::Opener;

struct Conn {
    rank: usize,
    stream: TcpStream,
    buf: FrameBuf,
    open: bool,
    /// When anything last arrived.
    heard: Instant,
    /// Encrypting: what opens its sealed frames.
    opener: Option<Opener>,
}

/// Runs until [`Bootstrap::close`](super::Bootstrap::close) writes to
/// `wake` (or closes it).
pub(super) fn run(shared: Arc<Shared>, readers: Vec<(usize, TcpStream, Option<Opener>)>, mut wake: UnixStream) {
    let mut conns: Vec<Conn> = readers
        .into_iter()
        .map(|(rank, stream, opener)| Conn {
            rank,
            stream,
            buf: FrameBuf::default(),
            open: true,
            heard: Instant::now(),
            opener,
        })
        .collect();
    let mut chunk = vec![0u8; 64 << 10];
    let silence = (shared.timeout / 2).max(MIN_SILENCE);
    let mut beat = Instant::now();
    loop {
        if shared.closed.load(Ordering::Acquire) {
            return;
        }
        if beat.elapsed() >= BEAT {
            beat = Instant::now();
            heartbeat(&shared, &mut conns, silence);
        }
        let open: Vec<usize> = (0..conns.len()).filter(|&i| conns[i].open).collect();
        let mut fds: Vec<libc::pollfd> = Vec::with_capacity(open.len() + 1);
        fds.push(libc::pollfd { fd: wake.as_raw_fd(), events: libc::POLLIN, revents: 0 });
        fds.extend(open.iter().map(|&i| libc::pollfd {
            fd: conns[i].stream.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }));
        let wait = BEAT.saturating_sub(beat.elapsed()).as_millis().max(1) as i32;
        if let Err(e) = sys::poll(&mut fds, wait) {
            tracing::warn!(rank = shared.rank, "bootstrap monitor: poll failed: {e}");
            std::thread::sleep(std::time::Duration::from_millis(50));
            continue;
        }
        if fds[0].revents != 0 {
            let _ = wake.read(&mut [0u8; 8]);
            if shared.closed.load(Ordering::Acquire) {
                return;
            }
        }
        for (j, &i) in open.iter().enumerate() {
            if fds[j + 1].revents != 0 {
                service(&shared, &mut conns[i], &mut chunk);
            }
        }
    }
}

/// Reads what has arrived on `c` and handles every complete frame.
fn service(sh: &Shared, c: &mut Conn, chunk: &mut [u8]) {
    // A bounded number of reads per turn, so one busy peer cannot starve
    // the others.
    for _ in 0..64 {
        match sys::recv_nowait(c.stream.as_raw_fd(), chunk) {
            Ok(0) => {
                c.open = false;
                connection_lost(sh, c.rank, "its connection closed");
                return;
            }
            Ok(n) => {
                c.heard = Instant::now();
                c.buf.push(&chunk[..n]);
                loop {
                    match c.buf.next() {
                        Ok(Some((t, payload))) => {
                            let r = sealed::receive(c.opener.as_mut(), t, payload)
                                .and_then(|(t, payload)| handle(sh, c.rank, t, &payload));
                            if let Err(why) = r {
                                c.open = false;
                                protocol_error(sh, c.rank, &why);
                                return;
                            }
                        }
                        Ok(None) => break,
                        Err(why) => {
                            c.open = false;
                            protocol_error(sh, c.rank, &why);
                            return;
                        }
                    }
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => {
                c.open = false;
                connection_lost(sh, c.rank, &format!("its connection failed: {e}"));
                return;
            }
        }
    }
}

/// How often each end of a connection beats.
const BEAT: Duration = Duration::from_secs(1);
/// The least silence declared a failure.
const MIN_SILENCE: Duration = Duration::from_secs(10);

/// Beats on every open connection, and declares the ranks silent for
/// longer than `silence` (that did not say goodbye) stopped or hung.
fn heartbeat(sh: &Shared, conns: &mut [Conn], silence: Duration) {
    let beat = frame::frame(tag::HEARTBEAT, &[]);
    for c in conns.iter_mut().filter(|c| c.open) {
        // Best effort: a broken connection is found by its reader.
        let _ = sh.send(c.rank, &beat);
        let idx = if sh.rank == 0 { c.rank } else { 0 };
        let quiet = c.heard.elapsed();
        if quiet > silence && !sh.state.lock().gone[idx] && !sh.closed.load(Ordering::Acquire) {
            c.open = false;
            let msg = format!(
                "{} has not answered for {:.0?} (the bootstrap's heartbeat, every {BEAT:?}): its process is stopped \
                 (SIGSTOP, a debugger) or hung, or its host is unreachable",
                sh.describe(c.rank),
                quiet
            );
            declare(sh, c.rank, msg);
        }
    }
}

/// The connection to `rank` ended: a death unless it said goodbye or we
/// are closing.
fn connection_lost(sh: &Shared, rank: usize, how: &str) {
    let idx = if sh.rank == 0 { rank } else { 0 };
    if sh.closed.load(Ordering::Acquire) || sh.state.lock().gone[idx] {
        return;
    }
    let msg = format!("{} died: {how} without a goodbye", sh.describe(rank));
    declare(sh, rank, msg);
}

fn protocol_error(sh: &Shared, rank: usize, why: &str) {
    if sh.closed.load(Ordering::Acquire) {
        return;
    }
    let msg = format!("{} broke the bootstrap protocol ({why}); treating it as dead", sh.describe(rank));
    declare(sh, rank, msg);
}

/// On rank 0 tells the others of a failure of `rank`, then records it:
/// telling first, since recording wakes this rank's calls, which may end
/// the process before a later broadcast went out (the others would then
/// blame rank 0's exit instead).
fn declare(sh: &Shared, rank: usize, msg: String) {
    if sh.rank == 0 {
        sh.broadcast_failure(&msg, Some(rank));
    }
    sh.record_failure(Error::Remote(msg));
}

/// Handles one frame from `from`; an error is a protocol violation.
fn handle(sh: &Shared, from: usize, t: u8, payload: &[u8]) -> Result<(), String> {
    match (sh.rank == 0, t) {
        (true, tag::GATHER) => {
            let mut d = Dec::new(payload);
            let seq = d.u64()?;
            let data = d.rest();
            if data.len() > frame::MAX_CONTRIBUTION {
                return Err(format!("all-gather contribution of {} bytes", data.len()));
            }
            let mut st = sh.state.lock();
            let n = sh.nranks;
            let slot = &mut st.gathers.entry(seq).or_insert_with(|| vec![None; n])[from];
            if slot.is_some() {
                return Err(format!("contributed twice to all_gather #{seq}"));
            }
            *slot = Some(data.to_vec());
            sh.cond.notify_all();
            Ok(())
        }
        (true, tag::ABORT) => {
            let reason = String::from_utf8_lossy(payload);
            let msg = format!("rank {from} aborted: {reason}");
            // Tell first (see `declare`).
            sh.broadcast_failure(&msg, Some(from));
            sh.record_failure(Error::Remote(msg));
            Ok(())
        }
        (false, tag::RESULT) => {
            let (seq, parts) = frame::decode_result(payload, sh.nranks)?;
            let mut st = sh.state.lock();
            st.results.insert(seq, parts);
            sh.cond.notify_all();
            Ok(())
        }
        (false, tag::FAILURE) => {
            sh.record_failure(Error::Remote(String::from_utf8_lossy(payload).into_owned()));
            Ok(())
        }
        (_, tag::HEARTBEAT) => Ok(()),
        (_, tag::GOODBYE) => {
            let idx = if sh.rank == 0 { from } else { 0 };
            sh.state.lock().gone[idx] = true;
            sh.cond.notify_all();
            let done = payload.try_into().map(u64::from_le_bytes).map_err(|_| "a goodbye of a bad length")?;
            sh.note_left(idx, done);
            Ok(())
        }
        (false, tag::LEFT) => {
            let bad = || format!("a LEFT notice of {} bytes", payload.len());
            let k = payload.get(..4).and_then(|b| b.try_into().ok()).map(u32::from_le_bytes).ok_or_else(bad)?;
            let done = payload.get(4..12).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes).ok_or_else(bad)?;
            if k as usize >= sh.nranks {
                return Err(format!("a LEFT notice for rank {k} of {}", sh.nranks));
            }
            sh.note_left(k as usize, done);
            Ok(())
        }
        (_, tag::ASK) => super::query::on_ask(sh, from, payload),
        (_, tag::ANSWER) => super::query::on_answer(sh, from, payload),
        (_, t) => Err(format!("unexpected message tag {t}")),
    }
}
