//! The rendezvous: rank 0 accepts and validates hellos; the other ranks
//! connect, say hello and wait for the table.

use std::io::{ErrorKind, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use super::frame::{self, Hello, tag};
use super::sealed::{self, Keys};
use super::{BootOptions, PeerInfo};
use crate::id::{UniqueId, listen, take_listener};
use crate::{Error, Result};

/// How long an accepted connection may take to send its hello and prove
/// it knows the secret.
const HELLO_DEADLINE: Duration = Duration::from_secs(2);
/// Most accepted connections still proving themselves; one more evicts the
/// oldest (a flood of strangers cannot exhaust threads or descriptors, nor
/// keep a rank out).
const MAX_UNPROVEN: usize = 64;

/// The labels of the bootstrap's proofs.
const ROOT_PROOF: &[u8] = b"oxccl-boot-root";
const RANK_PROOF: &[u8] = b"oxccl-boot-rank";
const DIFFERS_PROOF: &[u8] = b"oxccl-boot-differs";

/// Why an accepted connection did not become a rank.
enum Refused {
    /// It said nothing useful or proved nothing: a stranger, a stale id,
    /// or a rank whose secret differs (which cannot prove it).
    Unproven(String),
    /// It proved it holds this communicator's id under another key (or
    /// none where rank 0 has one): the ranks' keys differ.
    KeysDiffer(Hello),
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// Rank 0: accepts every other rank, then sends the table (sealed, when
/// encrypting). Returns the connections by rank (`None` at 0) with their
/// keys, the table and rank 0's IP.
#[allow(clippy::type_complexity)]
pub(super) fn root(
    id: &UniqueId,
    nranks: usize,
    host: &str,
    opts: &BootOptions,
    deadline: Instant,
) -> Result<(Vec<Option<(TcpStream, Option<Keys>)>>, Vec<PeerInfo>, IpAddr)> {
    let (addr, timeout) = (id.addr(), opts.timeout);
    let listener = match take_listener(id) {
        Some(l) => l,
        None => listen(addr).map_err(|e| {
            Error::System(format!(
                "rank 0 cannot listen on {addr}, the UniqueId's address: {e}; an id must be made on rank 0's host \
                 (UniqueId::new), and its port must be free"
            ))
        })?,
    };
    let listen_ip = listener.local_addr().map(|a| a.ip()).unwrap_or(addr.ip());
    let me = PeerInfo { rank: 0, host: host.to_string(), pid: std::process::id(), addr: listen_ip };
    if nranks == 1 {
        return Ok((vec![None], vec![me], listen_ip));
    }
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::System(format!("rank 0: cannot make the bootstrap listener non-blocking: {e}")))?;
    let mut arrived: Vec<Option<(TcpStream, Hello, SocketAddr)>> = (0..nranks).map(|_| None).collect();
    // Why connections for this communicator failed (the last few), for the
    // message if ranks stay missing: a rank whose secret differs fails on
    // its side at once, and is named here.
    let mut failed: Vec<String> = Vec::new();
    let mut count = 1;
    let (tx, rx) = mpsc::channel::<HelloReport>();
    let guests = std::sync::Arc::new(Guests::default());
    while count < nranks {
        if Instant::now() >= deadline {
            let missing: Vec<usize> = (1..nranks).filter(|&k| arrived[k].is_none()).collect();
            let mut msg = format!(
                "rank 0 gave up after {timeout:?}: only {count} of {nranks} ranks arrived at the rendezvous on {addr}; \
                 missing ranks {missing:?} (did they start, with this UniqueId and nranks {nranks}?)"
            );
            if !failed.is_empty() {
                msg.push_str(&format!("; connections that failed meanwhile: {}", failed.join("; ")));
            }
            let reject = frame::frame(tag::REJECT, msg.as_bytes());
            for (s, _, _) in arrived.iter_mut().flatten() {
                let _ = s.write_all(&reject);
            }
            return Err(Error::Timeout(msg));
        }
        accept_all(&listener, &guests, &tx, deadline, id);
        let mut next = rx.recv_timeout(Duration::from_millis(5)).ok();
        while let Some((mut stream, peer, hello)) = next {
            let hello = match hello {
                Ok(h) => h,
                Err(Refused::KeysDiffer(h)) => {
                    // Proven, so final: every rank that arrived is told.
                    let msg = format!(
                        "rank 0: rank {} (pid {} on {}, at {peer}) proved it holds this communicator's UniqueId, but \
                         under another encryption key: {SECRETS_DIFFER} (ncclSetEncryption keys that differ, or set on \
                         some ranks and not others): give every rank the same key",
                        h.rank,
                        h.pid,
                        h.host.split('/').next().unwrap_or("")
                    );
                    let reject = frame::frame(tag::REJECT, msg.as_bytes());
                    for (s, _, _) in arrived.iter_mut().flatten() {
                        let _ = s.write_all(&reject);
                    }
                    return Err(Error::InvalidUsage(msg));
                }
                Err(Refused::Unproven(why)) => {
                    // Connections that never said hello (strangers, the
                    // evicted) are many and say nothing: not worth a warning.
                    if why.starts_with(NO_HELLO) {
                        tracing::debug!("bootstrap rank 0 on {addr}: dropping connection from {peer}: {why}");
                    } else {
                        tracing::warn!("bootstrap rank 0 on {addr}: dropping connection from {peer}: {why}");
                    }
                    if why.contains(SECRETS_DIFFER) && !failed.contains(&why) {
                        if failed.len() == 4 {
                            failed.remove(0);
                        }
                        failed.push(why);
                    }
                    next = rx.try_recv().ok();
                    continue;
                }
            };
            if hello.nonce != id.nonce() {
                tracing::warn!(
                    "bootstrap rank 0 on {addr}: dropping connection from {peer} (rank {}): its UniqueId nonce \
                     differs (another communicator or a stale id)",
                    hello.rank
                );
                // Said, so that it does not take the close for a full door
                // and try again until its deadline.
                let why = format!(
                    "the rendezvous at {addr} serves another communicator: stale or foreign UniqueId? (rank {} of \
                     {}: its nonce is not this communicator's)",
                    hello.rank, hello.nranks
                );
                let _ = stream.write_all(&frame::frame(tag::REJECT, why.as_bytes()));
            } else if let Some(msg) = check_hello(&hello, nranks, &arrived) {
                tracing::warn!("bootstrap rank 0 on {addr}: refusing {peer}: {msg}");
                let _ = stream.write_all(&frame::frame(tag::REJECT, msg.as_bytes()));
            } else {
                let r = hello.rank as usize;
                arrived[r] = Some((stream, hello, peer));
                count += 1;
            }
            next = rx.try_recv().ok();
        }
    }
    drop(listener);
    let mut peers = vec![me];
    let mut root_ip = None;
    for (s, h, peer) in arrived.iter().skip(1).flatten() {
        root_ip = root_ip.or_else(|| s.local_addr().ok().map(|a| a.ip()));
        peers.push(PeerInfo { rank: h.rank as usize, host: h.host.clone(), pid: h.pid, addr: peer.ip() });
    }
    let root_ip = root_ip.unwrap_or(listen_ip);
    peers[0].addr = root_ip;
    let table = frame::encode_table(&peers);
    if table.len() > frame::MAX_TABLE {
        return Err(Error::invalid(format!("rank 0: the peer table of {} bytes is too large", table.len())));
    }
    let mut streams = vec![None];
    for (k, slot) in arrived.into_iter().enumerate().skip(1) {
        let Some((mut s, h, peer)) = slot else { continue };
        let _ = s.set_write_timeout(Some(remaining(deadline).max(Duration::from_millis(100))));
        let mut keys = opts.encrypt.then(|| Keys::new(id, k, &h.challenge, true));
        let sent = match &mut keys {
            Some(keys) => sealed::seal(&mut keys.seal, &table).and_then(|f| s.write_all(&f)),
            None => s.write_all(&table),
        };
        sent.map_err(|e| {
            Error::Remote(format!("rank {k} at {peer} vanished during the rendezvous (sending it the table: {e})"))
        })?;
        streams.push(Some((s, keys)));
    }
    Ok((streams, peers, root_ip))
}

/// What a hello thread reports: the connection, its peer, and its hello
/// (or why there is none).
type HelloReport = (TcpStream, SocketAddr, std::result::Result<Hello, Refused>);

/// The connections accepted at rank 0's door that are still proving
/// themselves, oldest first, each with a handle that closes it and
/// whether it is past its hello. At most [`MAX_UNPROVEN`] wait at once:
/// one more evicts the oldest that has not said hello yet (a real rank
/// says it at once), so strangers who connect and say nothing can delay a
/// real rank by one reconnection (its client tries again with backoff),
/// never keep it out. A connection past a hello of this communicator is
/// not evicted: it answers rank 0's challenge within a round trip, or
/// leaves at its deadline.
#[derive(Default)]
struct Guests {
    next: std::sync::atomic::AtomicU64,
    held: parking_lot::Mutex<std::collections::VecDeque<Guest>>,
    evicted: std::sync::atomic::AtomicUsize,
}

struct Guest {
    ticket: u64,
    handle: TcpStream,
    past_hello: bool,
}

impl Guests {
    /// Takes `stream` in, evicting the oldest guest that has not said
    /// hello if the door is full; its ticket, or `None` when every place
    /// is past its hello (the newcomer is closed and tries again).
    fn admit(&self, stream: &TcpStream, peer: SocketAddr) -> Option<u64> {
        use std::sync::atomic::Ordering;
        let handle = stream
            .try_clone()
            .map_err(|e| tracing::warn!("bootstrap: cannot hold {peer}'s connection ({e}); dropping it"))
            .ok()?;
        let ticket = self.next.fetch_add(1, Ordering::Relaxed);
        let evicted = {
            let mut held = self.held.lock();
            let evicted = if held.len() >= MAX_UNPROVEN {
                let i = held.iter().position(|g| !g.past_hello)?;
                held.remove(i)
            } else {
                None
            };
            held.push_back(Guest { ticket, handle, past_hello: false });
            evicted
        };
        if let Some(g) = evicted {
            // Its thread's read ends at once, and it reports the eviction.
            let n = self.evicted.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                tracing::warn!(
                    "bootstrap: {MAX_UNPROVEN} connections are still proving themselves; evicted the oldest silent \
                     one ({n} so far, last {})",
                    g.handle.peer_addr().map(|a| a.to_string()).unwrap_or_default()
                );
            }
            let _ = g.handle.shutdown(std::net::Shutdown::Both);
        }
        Some(ticket)
    }

    /// The guest with `ticket` said a hello of this communicator: it is
    /// evicted no more. False if it was evicted already.
    fn past_hello(&self, ticket: u64) -> bool {
        let mut held = self.held.lock();
        held.iter_mut().find(|g| g.ticket == ticket).map(|g| g.past_hello = true).is_some()
    }

    /// The guest with `ticket` proved itself or failed: it leaves. False
    /// if it was evicted (its connection is being shut down).
    fn leave(&self, ticket: u64) -> bool {
        let mut held = self.held.lock();
        let before = held.len();
        held.retain(|g| g.ticket != ticket);
        held.len() < before
    }
}

/// Accepts every pending connection, each read by its own short-lived
/// thread that reports the hello (or why there is none) on `tx`.
fn accept_all(
    listener: &TcpListener,
    guests: &std::sync::Arc<Guests>,
    tx: &mpsc::Sender<HelloReport>,
    deadline: Instant,
    id: &UniqueId,
) {
    loop {
        match listener.accept() {
            Ok((stream, peer)) => {
                let Some(ticket) = guests.admit(&stream, peer) else { continue };
                let tx = tx.clone();
                let id = *id;
                let g = guests.clone();
                let limit = HELLO_DEADLINE.min(remaining(deadline)).max(Duration::from_millis(10));
                let spawned = thread::Builder::new().name("oxccl-boot-hello".into()).spawn(move || {
                    let mut stream = stream;
                    let end = Instant::now() + limit;
                    let evicted = || Refused::Unproven(format!("{NO_HELLO}: evicted"));
                    let hello = read_hello(&mut stream, limit).map_err(Refused::Unproven).and_then(|h| {
                        // Past its hello, a rank of this communicator is
                        // evicted no more (unless it was already).
                        if h.nonce == id.nonce() && !g.past_hello(ticket) {
                            return Err(evicted());
                        }
                        prove_rank(&mut stream, &id, h, end)
                    });
                    let hello = if g.leave(ticket) { hello } else { hello.and(Err(evicted())) };
                    let _ = tx.send((stream, peer, hello));
                });
                if let Err(e) = spawned {
                    guests.leave(ticket);
                    tracing::warn!("bootstrap: cannot start a thread to read {peer}'s hello: {e}; dropping it");
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => {
                // ECONNABORTED, EMFILE, ...: log and retry on the next turn.
                tracing::warn!("bootstrap: accept failed: {e}");
                return;
            }
        }
    }
}

/// How the report of a connection that sent no hello begins.
const NO_HELLO: &str = "no hello";

fn read_hello(stream: &mut TcpStream, limit: Duration) -> std::result::Result<Hello, String> {
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(limit)).map_err(|e| e.to_string())?;
    match frame::read_frame(stream, frame::MAX_HELLO) {
        Ok((t, payload)) => Hello::decode(t, &payload).map_err(|e| format!("not an oxccl bootstrap hello: {e}")),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            Err(format!("{NO_HELLO} within {limit:?}"))
        }
        Err(e) if e.kind() == ErrorKind::UnexpectedEof => Err(format!("{NO_HELLO}: closed or evicted")),
        Err(e) => Err(format!("not an oxccl bootstrap hello: {e}")),
    }
}

/// Rank 0's side of the proof: answers the hello's challenge with a
/// challenge of its own and a proof of the secret, then checks the rank's
/// proof over that challenge and its hello. A connection that fails is
/// told why and never takes a rank's place.
fn prove_rank(stream: &mut TcpStream, id: &UniqueId, h: Hello, end: Instant) -> std::result::Result<Hello, Refused> {
    prove_rank_with(stream, id, h, end).map_err(|e| match e {
        Ok(h) => Refused::KeysDiffer(h),
        Err(why) => Refused::Unproven(why),
    })
}

/// [`prove_rank`], its refusal a proven keys-differ hello or why not.
fn prove_rank_with(
    stream: &mut TcpStream,
    id: &UniqueId,
    h: Hello,
    end: Instant,
) -> std::result::Result<Hello, std::result::Result<Hello, String>> {
    if h.nonce != id.nonce() {
        // Another communicator: leave it to the caller's warning.
        return Ok(h);
    }
    let secret = id.secret();
    let mine = crate::auth::challenge();
    let nonce = id.nonce();
    let proof = crate::auth::prove(&secret, &[ROOT_PROOF, &nonce, &h.challenge, &mine]);
    let mut payload = mine.to_vec();
    payload.extend_from_slice(&proof);
    // A keyed rank 0 also proves the id's base secret, so that a rank
    // holding the id under another key (or none) can tell.
    if id.keyed() {
        payload.extend_from_slice(&crate::auth::prove(&id.base(), &[ROOT_PROOF, &nonce, &h.challenge, &mine]));
    }
    let _ = stream.set_write_timeout(Some(remaining(end).max(Duration::from_millis(10))));
    stream
        .write_all(&frame::frame(tag::CHALLENGE, &payload))
        .map_err(|e| Err(format!("sending the challenge: {e}")))?;
    let _ = stream.set_read_timeout(Some(remaining(end).max(Duration::from_millis(10))));
    let refuse = |stream: &mut TcpStream, why: String| {
        let _ = stream.write_all(&frame::frame(tag::REJECT, why.as_bytes()));
        why
    };
    // A proof, or (1 KiB at most) why the rank refused ours.
    match frame::read_frame(stream, 1024) {
        Ok((tag::PROOF, p)) if crate::auth::verify(&secret, &[RANK_PROOF, &nonce, &mine, &h.encode()], &p) => Ok(h),
        Ok((tag::DIFFERS, p)) if crate::auth::verify(&id.base(), &[DIFFERS_PROOF, &nonce, &mine, &h.encode()], &p) => {
            Err(Ok(h))
        }
        Ok((tag::PROOF | tag::DIFFERS, _)) => Err(Err(refuse(
            stream,
            format!(
                "rank {} could not prove it knows the communicator's secret: its UniqueId is not rank 0's \
                 (a stranger, or an id with the right address and nonce but another secret)",
                h.rank
            ),
        ))),
        // The rank found rank 0's proof wrong, and says why.
        Ok((tag::REJECT, why)) => Err(Err(String::from_utf8_lossy(&why).chars().take(400).collect())),
        Ok((t, _)) => Err(Err(format!("answered the challenge with tag {t}, not a proof"))),
        Err(e) => Err(Err(format!("no proof of the secret within {HELLO_DEADLINE:?}: {e}"))),
    }
}

/// What both sides say when the ranks' secrets differ.
const SECRETS_DIFFER: &str = "the ranks' secrets or keys differ";

/// Why rank 0 refuses a hello with the right nonce, if it does.
fn check_hello(h: &Hello, nranks: usize, arrived: &[Option<(TcpStream, Hello, SocketAddr)>]) -> Option<String> {
    if h.version != frame::VERSION {
        return Some(format!(
            "rank {} speaks bootstrap protocol version {} but rank 0 speaks {}: every rank must run the same oxccl",
            h.rank,
            h.version,
            frame::VERSION
        ));
    }
    if h.nranks as usize != nranks {
        return Some(format!(
            "rank {} says nranks is {} but rank 0 says nranks is {nranks}: every rank must pass the same nranks",
            h.rank, h.nranks
        ));
    }
    let r = h.rank as usize;
    if r >= nranks {
        return Some(format!("rank {r} is out of range for nranks {nranks} (ranks are 0..{})", nranks - 1));
    }
    if r == 0 {
        return Some(format!(
            "rank 0 is already taken in this communicator (by pid {} on the rank-0 host): every rank must pass a \
             distinct rank",
            std::process::id()
        ));
    }
    if let Some((_, first, _)) = &arrived[r] {
        return Some(format!(
            "rank {r} is already taken in this communicator (by pid {} on {}): every rank must pass a distinct rank",
            first.pid,
            first.host.split('/').next().unwrap_or("")
        ));
    }
    None
}

/// A TCP connection to rank 0's rendezvous at `addr`, retrying refusals
/// (rank 0 not listening yet) with backoff until the deadline.
fn connect(addr: SocketAddr, rank: usize, timeout: Duration, deadline: Instant) -> Result<TcpStream> {
    let mut backoff = Duration::from_millis(10);
    // The last real connection error (a refusal, an unreachable network),
    // which is what the final message must name.
    let mut last: Option<std::io::Error> = None;
    loop {
        let left = remaining(deadline);
        let attempt = if left.is_zero() {
            Err(last.take().unwrap_or_else(|| std::io::Error::new(ErrorKind::TimedOut, "no attempt finished in time")))
        } else {
            TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(5)))
        };
        match attempt {
            Ok(s) => return Ok(s),
            Err(e) => {
                let left = remaining(deadline);
                if left.is_zero() {
                    return Err(Error::Timeout(format!(
                        "rank {rank} could not reach rank 0's rendezvous at {addr} within {timeout:?} (last error: \
                         {e}); is rank 0 running with this UniqueId, and is {addr} reachable from here?"
                    )));
                }
                last = Some(e);
                thread::sleep(backoff.min(left));
                backoff = (backoff * 2).min(Duration::from_millis(200));
            }
        }
    }
}

/// Ranks 1..: connects to rank 0 (retrying refusals until the deadline),
/// says hello, and waits for the table.
#[allow(clippy::type_complexity)]
pub(super) fn client(
    id: &UniqueId,
    nranks: usize,
    rank: usize,
    host: &str,
    opts: &BootOptions,
    deadline: Instant,
) -> Result<(TcpStream, Option<Keys>, Vec<PeerInfo>, IpAddr)> {
    let (addr, timeout) = (id.addr(), opts.timeout);
    let dropped = |what: &str| {
        Error::Remote(format!(
            "rendezvous at {addr} dropped us: stale or foreign UniqueId? (rank {rank} of {nranks}, {what})"
        ))
    };
    let hello = Hello {
        magic: frame::MAGIC,
        version: frame::VERSION,
        nonce: id.nonce(),
        rank: rank as u32,
        nranks: nranks as u32,
        pid: std::process::id(),
        host: host.to_string(),
        challenge: crate::auth::challenge(),
    };
    let secret = id.secret();
    let nonce = id.nonce();
    // Rank 0 closes connections beyond those it can check at once (many
    // ranks arriving together, or strangers holding its door): a
    // connection closed before its challenge came is tried again, with
    // backoff, until the deadline; what follows the challenge is final.
    let mut backoff = Duration::from_millis(10);
    let (mut stream, answer) = loop {
        let mut stream = connect(addr, rank, timeout, deadline)?;
        let _ = stream.set_nodelay(true);
        let _ = stream.set_write_timeout(Some(remaining(deadline).max(Duration::from_millis(1))));
        let _ = stream.set_read_timeout(Some(remaining(deadline).max(Duration::from_millis(1))));
        let answer = match stream.write_all(&hello.encode()) {
            // The challenge, or (1 KiB at most) why rank 0 refuses us.
            Ok(()) => frame::read_frame(&mut stream, 1024),
            Err(e) => Err(e),
        };
        let closed = |e: &std::io::Error| {
            matches!(
                e.kind(),
                ErrorKind::UnexpectedEof
                    | ErrorKind::ConnectionReset
                    | ErrorKind::ConnectionAborted
                    | ErrorKind::BrokenPipe
            )
        };
        match answer {
            Err(e) if closed(&e) && remaining(deadline) > backoff => {
                tracing::debug!("bootstrap rank {rank}: rank 0 at {addr} closed our connection ({e}); again");
                thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_millis(500));
            }
            answer => break (stream, answer),
        }
    };
    // Rank 0 proves it knows the secret before this rank proves it does
    // (and before anything of this rank's is believed).
    match answer {
        Ok((tag::CHALLENGE, p))
            if p.len() == crate::auth::CHALLENGE_LEN + crate::auth::PROOF_LEN
                || p.len() == crate::auth::CHALLENGE_LEN + 2 * crate::auth::PROOF_LEN =>
        {
            let (theirs, proofs) = p.split_at(crate::auth::CHALLENGE_LEN);
            let (proof, base_proof) = proofs.split_at(crate::auth::PROOF_LEN);
            let root_proves = |s: &crate::auth::Secret, proof: &[u8]| {
                crate::auth::verify(s, &[ROOT_PROOF, &nonce, &hello.challenge, theirs], proof)
            };
            // Rank 0 holds this id under another key (or none where this
            // rank has one) when its proof, or its proof of its base,
            // matches this rank's base: both sides can prove that.
            let base = id.base();
            if !root_proves(&secret, proof)
                && (root_proves(&base, proof) || (!base_proof.is_empty() && root_proves(&base, base_proof)))
            {
                let mine = crate::auth::prove(&base, &[DIFFERS_PROOF, &nonce, theirs, &hello.encode()]);
                let _ = stream.write_all(&frame::frame(tag::DIFFERS, &mine));
                return Err(Error::InvalidUsage(format!(
                    "rank {rank}: rank 0 at {addr} proved it holds this communicator's UniqueId, but under another \
                     encryption key: {SECRETS_DIFFER} (ncclSetEncryption keys that differ, or set on some ranks \
                     and not others): give every rank the same key"
                )));
            }
            if !root_proves(&secret, proof) {
                // Rank 0 knows this communicator's nonce but proves another
                // secret: most likely the ranks' secrets differ. Tell it
                // (it keeps waiting: a stranger could say the same).
                let why = format!(
                    "rank {rank} (pid {} on {host}): {SECRETS_DIFFER}: rank 0's proof does not match this rank's \
                     secret (UniqueIds that differ in their secret, OXCCL_SECRET or OXCCL_SECRET_FILE \
                     that differ, or ncclSetEncryption keys that differ)",
                    std::process::id()
                );
                let _ = stream.write_all(&frame::frame(tag::REJECT, why.as_bytes()));
                return Err(Error::InvalidUsage(format!(
                    "rank {rank}: the rendezvous at {addr} could not prove it knows this communicator's secret: \
                     {SECRETS_DIFFER} (rank 0 knows this communicator's nonce but holds another secret: UniqueIds \
                     that differ in their secret, OXCCL_SECRET or OXCCL_SECRET_FILE that differ, or \
                     ncclSetEncryption keys that differ), or a stranger answers on that address"
                )));
            }
            let mine = crate::auth::prove(&secret, &[RANK_PROOF, &nonce, theirs, &hello.encode()]);
            if let Err(e) = stream.write_all(&frame::frame(tag::PROOF, &mine)) {
                return Err(dropped(&format!("sending the proof: {e}")));
            }
        }
        Ok((tag::REJECT, payload)) => {
            return Err(Error::InvalidArgument(String::from_utf8_lossy(&payload).into_owned()));
        }
        Ok((t, _)) => {
            return Err(Error::Remote(format!("rank {rank}: rank 0 at {addr} answered the hello with tag {t}")));
        }
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            return Err(Error::Timeout(format!(
                "rank {rank} reached {addr} but got no challenge within {timeout:?}: is rank 0 of this \
                 communicator listening there?"
            )));
        }
        Err(e) => return Err(dropped(&format!("waiting for rank 0's challenge: {e}"))),
    }
    let mut keys = opts.encrypt.then(|| Keys::new(id, rank, &hello.challenge, false));
    let table = frame::read_frame(&mut stream, frame::MAX_TABLE);
    // Sealed or not, as this rank expects: a rank that disagrees with rank
    // 0 says so, to rank 0 too (in clear: the one frame it takes so).
    let mismatch = |stream: &mut TcpStream, why: String| {
        let _ = stream.write_all(&frame::frame(tag::ABORT, why.as_bytes()));
        Error::InvalidArgument(format!("rank {rank}: {why}"))
    };
    let table = match (table, &mut keys) {
        (Ok((tag::SEALED, mut payload)), Some(k)) => sealed::open(&mut k.open, &mut payload)
            .map_err(|e| Error::Remote(format!("rank {rank}: rank 0 at {addr} sent a table that does not open: {e}"))),
        (Ok((tag::SEALED, _)), None) => Err(mismatch(
            &mut stream,
            "rank 0 encrypts the bootstrap (OXCCL_ENCRYPT=1) but this rank does not: set OXCCL_ENCRYPT the same on \
             every rank"
                .into(),
        )),
        (Ok((tag::TABLE, _)), Some(_)) => Err(mismatch(
            &mut stream,
            "this rank encrypts (OXCCL_ENCRYPT=1) but rank 0 does not: set OXCCL_ENCRYPT the same on every rank".into(),
        )),
        (other, _) => other.map_err(|e| {
            if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) {
                Error::Timeout(format!(
                    "rank {rank} reached rank 0 at {addr} but the rendezvous did not complete within {timeout:?}: \
                     not all {nranks} ranks arrived"
                ))
            } else {
                dropped(&e.to_string())
            }
        }),
    }?;
    match table {
        (tag::TABLE, payload) => {
            let peers = frame::decode_table(&payload).map_err(|e| {
                Error::Remote(format!("rank {rank}: rank 0 at {addr} sent a malformed peer table: {e}"))
            })?;
            let ordered = peers.len() == nranks && peers.iter().enumerate().all(|(i, p)| p.rank == i);
            if !ordered {
                return Err(Error::Remote(format!(
                    "rank {rank}: rank 0 at {addr} sent a peer table of {} entries for nranks {nranks}",
                    peers.len()
                )));
            }
            let ip = stream.local_addr().map(|a| a.ip()).unwrap_or(peers[rank].addr);
            Ok((stream, keys, peers, ip))
        }
        (tag::REJECT, payload) => {
            let msg = String::from_utf8_lossy(&payload).into_owned();
            if msg.starts_with("rank 0 gave up") { Err(Error::Timeout(msg)) } else { Err(Error::InvalidArgument(msg)) }
        }
        (t, _) => Err(Error::Remote(format!("rank {rank}: rank 0 at {addr} answered the hello with tag {t}"))),
    }
}
