//! A soft queue pair: the user's handle ([`SoftQp`]) and the engine thread
//! that plays the HCA for it (requester and responder of one RC
//! connection).

use super::packet::{Nak, PSN_MASK, Packet, psn_before};
use super::{CqInner, DevInner, Entry, local_devices};
use crate::rdma::verbs::{
    Access, AsyncEvent, Completion, Connect, Opcode, Qp, QpCaps, QpState, RecvWr, SendWr, Status, WcOpcode,
};
use crate::{Error, Result};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

const HELLO_MAGIC: &[u8; 8] = b"OXSOFTQP";
const HELLO_LEN: usize = 24;

/// What the engine is told.
enum Ev {
    Connect(Connect),
    Post(SendWr, u64, Instant),
    Packet(Packet),
    Attach(Wire),
    LinkDown(String),
    Fail,
    Stop,
}

/// How packets reach the peer QP.
enum Wire {
    Tcp(TcpStream),
    Local(mpsc::Sender<Ev>),
}

/// Who the QP is connected to.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Remote {
    ip: Ipv4Addr,
    port: u16,
    qpn: u32,
}

/// What the handle and the engine share.
pub(crate) struct Shared {
    dev: Arc<DevInner>,
    qpn: u32,
    cq: Arc<CqInner>,
    caps: QpCaps,
    state: Mutex<QpState>,
    rq: Mutex<VecDeque<RecvWr>>,
    posted: AtomicU64,
    retired: Arc<AtomicU64>,
    tx: Mutex<mpsc::Sender<Ev>>,
    /// The peer once connected, and a stream accepted before that.
    remote: Mutex<(Option<Remote>, Option<TcpStream>)>,
    /// Set by [`SoftQp`]'s drop: from then on the engine touches no
    /// memory (ibv_destroy_qp's promise).
    destroyed: AtomicBool,
}

impl Shared {
    /// The device's checked access (see `DevInner::access`), unless this
    /// QP was destroyed: checked under the registration table's lock,
    /// which destroying takes once, so no access runs after it.
    fn access(&self, key: u32, addr: u64, len: u64, need: Access, f: impl FnOnce()) -> bool {
        let mut ran = false;
        let allowed = self.dev.access(key, addr, len, need, || {
            if !self.destroyed.load(Ordering::Acquire) {
                f();
                ran = true;
            }
        });
        allowed && ran
    }

    fn send(&self, ev: Ev) {
        let _ = self.tx.lock().send(ev);
    }

    /// Breaks the link (a port going down).
    pub(crate) fn link_down(&self) {
        self.send(Ev::LinkDown("the port went down".into()));
    }

    /// Adds a completion (`retire`: the send-queue position it retires);
    /// false if the CQ overflowed.
    fn push(
        &self,
        wr_id: u64,
        status: Status,
        opcode: WcOpcode,
        len: u32,
        imm: Option<u32>,
        retire: Option<u64>,
    ) -> bool {
        let wc = Completion { wr_id, status, opcode, byte_len: len, imm, qpn: self.qpn, vendor_err: 0 };
        self.cq.push(Entry { wc, retire: retire.map(|s| (self.retired.clone(), s)) })
    }

    /// Completes send work request `wr`, the `seq`-th posted.
    fn send_done(&self, wr: &SendWr, seq: u64, status: Status, len: u32) -> bool {
        self.push(wr.wr_id, status, wc_of(wr.op), len, None, Some(seq))
    }

    /// Completes receive `wr_id`.
    fn recv_done(&self, wr_id: u64, status: Status, len: u32, imm: Option<u32>) -> bool {
        self.push(wr_id, status, WcOpcode::RecvImm, len, imm, None)
    }

    /// Takes a stream the device accepted for this QP.
    fn offer(self: &Arc<Self>, s: TcpStream, from: Remote) {
        let mut r = self.remote.lock();
        match r.0 {
            Some(peer) if peer == from => {
                drop(r);
                self.attach_tcp(s)
            }
            Some(_) => tracing::warn!(qpn = self.qpn, "soft HCA: a stream from an unexpected peer was dropped"),
            None => r.1 = Some(s),
        }
    }

    fn attach_tcp(self: &Arc<Self>, s: TcpStream) {
        let _ = s.set_nodelay(true);
        let Ok(mut rd) = s.try_clone() else {
            self.send(Ev::LinkDown("cannot clone the link's socket".into()));
            return;
        };
        let tx = self.tx.lock().clone();
        let spawned = std::thread::Builder::new().name("oxccl-softhca-rx".into()).spawn(move || {
            loop {
                match Packet::read_from(&mut rd) {
                    Ok(Some(p)) => {
                        if tx.send(Ev::Packet(p)).is_err() {
                            return;
                        }
                    }
                    Ok(None) => {
                        let _ = tx.send(Ev::LinkDown("the peer closed the link".into()));
                        return;
                    }
                    Err(e) => {
                        let _ = tx.send(Ev::LinkDown(e.to_string()));
                        return;
                    }
                }
            }
        });
        if spawned.is_err() {
            self.send(Ev::LinkDown("cannot start the link's reader".into()));
        }
        self.send(Ev::Attach(Wire::Tcp(s)));
    }
}

/// The user's handle of a soft QP.
pub struct SoftQp {
    sh: Arc<Shared>,
}

impl SoftQp {
    pub(crate) fn new(dev: Arc<DevInner>, cq: Arc<CqInner>, caps: QpCaps, qpn: u32) -> Result<SoftQp> {
        let (tx, rx) = mpsc::channel();
        let sh = Arc::new(Shared {
            dev: dev.clone(),
            qpn,
            cq,
            caps,
            state: Mutex::new(QpState::Init),
            rq: Mutex::new(VecDeque::new()),
            posted: AtomicU64::new(0),
            retired: Arc::new(AtomicU64::new(0)),
            tx: Mutex::new(tx),
            remote: Mutex::new((None, None)),
            destroyed: AtomicBool::new(false),
        });
        dev.qps.lock().insert(qpn, Arc::downgrade(&sh));
        let eng = Engine::new(sh.clone(), rx);
        std::thread::Builder::new()
            .name(format!("oxccl-softhca-qp{qpn}"))
            .spawn(move || eng.run())
            .map_err(|e| Error::System(format!("soft HCA: thread: {e}")))?;
        Ok(SoftQp { sh })
    }
}

impl Drop for SoftQp {
    /// Like `ibv_destroy_qp`: once this returns, the QP touches no memory
    /// (an access in progress holds the registration table; taking it once
    /// waits for that one, and later ones see `destroyed`).
    fn drop(&mut self) {
        self.sh.destroyed.store(true, Ordering::Release);
        drop(self.sh.dev.mrs.lock());
        self.sh.dev.qps.lock().remove(&self.sh.qpn);
        self.sh.send(Ev::Stop);
    }
}

impl Qp for SoftQp {
    fn qpn(&self) -> u32 {
        self.sh.qpn
    }

    fn state(&self) -> QpState {
        *self.sh.state.lock()
    }

    fn connect(&mut self, c: &Connect) -> Result<()> {
        let dev = &self.sh.dev;
        let g = c.remote_gid;
        if !crate::rdma::env::gid_is_ipv4_mapped(&g) {
            return Err(Error::invalid(format!(
                "soft HCA {}: QP {} can only reach IPv4-mapped GIDs (a soft device's index 1)",
                dev.name, self.sh.qpn
            )));
        }
        let remote = Remote { ip: Ipv4Addr::new(g[12], g[13], g[14], g[15]), port: c.remote_lid, qpn: c.remote_qpn };
        {
            let mut st = self.sh.state.lock();
            if *st != QpState::Init {
                return Err(Error::InvalidUsage(format!("soft HCA: QP {} connected twice", self.sh.qpn)));
            }
            *st = QpState::Rts;
        }
        let parked = {
            let mut r = self.sh.remote.lock();
            r.0 = Some(remote);
            r.1.take()
        };
        let me = (dev.ip.octets(), dev.port, self.sh.qpn);
        let initiator = me < (remote.ip.octets(), remote.port, remote.qpn);
        self.sh.send(Ev::Connect(*c));
        if !initiator {
            // The peer connects; a stream it already opened was parked.
            if let Some(s) = parked {
                self.sh.attach_tcp(s);
            }
            return Ok(());
        }
        let local = local_devices().lock().get(&(remote.ip, remote.port)).and_then(Weak::upgrade);
        if let Some(peer_dev) = local {
            let Some(peer) = peer_dev.qps.lock().get(&remote.qpn).and_then(Weak::upgrade) else {
                return Err(Error::Remote(format!("soft HCA: no QP {} on {}", remote.qpn, peer_dev.name)));
            };
            let mine = self.sh.tx.lock().clone();
            let theirs = peer.tx.lock().clone();
            self.sh.send(Ev::Attach(Wire::Local(theirs)));
            peer.send(Ev::Attach(Wire::Local(mine)));
            return Ok(());
        }
        let addr = SocketAddr::from((remote.ip, remote.port));
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
            .map_err(|e| Error::Remote(format!("soft HCA: QP {} cannot reach {addr}: {e}", self.sh.qpn)))?;
        let mut hello = [0u8; HELLO_LEN];
        hello[..8].copy_from_slice(HELLO_MAGIC);
        hello[8..12].copy_from_slice(&remote.qpn.to_le_bytes());
        hello[12..16].copy_from_slice(&self.sh.qpn.to_le_bytes());
        hello[16..20].copy_from_slice(&dev.ip.octets());
        hello[20..22].copy_from_slice(&dev.port.to_le_bytes());
        s.write_all(&hello).map_err(|e| Error::Remote(format!("soft HCA: QP {} to {addr}: {e}", self.sh.qpn)))?;
        self.sh.attach_tcp(s);
        Ok(())
    }

    fn fail(&mut self) -> Result<()> {
        *self.sh.state.lock() = QpState::Error;
        self.sh.send(Ev::Fail);
        Ok(())
    }

    fn post_send(&mut self, wrs: &[SendWr]) -> Result<()> {
        let st = *self.sh.state.lock();
        if st != QpState::Rts && st != QpState::Error {
            return Err(Error::InvalidUsage(format!(
                "post_send on QP {} of {} in state {st:?}: queue pairs send only once connected (RTS)",
                self.sh.qpn, self.sh.dev.name
            )));
        }
        for wr in wrs {
            let posted = self.sh.posted.load(Ordering::Relaxed);
            let out = posted - self.sh.retired.load(Ordering::Acquire);
            if out >= self.sh.caps.max_send_wr as u64 {
                return Err(Error::System(format!(
                    "post_send on QP {} of {}: the send queue is full ({out} work requests outstanding, max_send_wr {})",
                    self.sh.qpn, self.sh.dev.name, self.sh.caps.max_send_wr
                )));
            }
            if matches!(wr.op, Opcode::Read) && wr.len == 0 {
                return Err(Error::invalid("post_send: an RDMA READ of 0 bytes"));
            }
            self.sh.posted.store(posted + 1, Ordering::Relaxed);
            self.sh.send(Ev::Post(*wr, posted + 1, Instant::now()));
        }
        Ok(())
    }

    fn post_recv(&mut self, wrs: &[RecvWr]) -> Result<()> {
        let st = *self.sh.state.lock();
        if st == QpState::Reset {
            return Err(Error::InvalidUsage(format!("post_recv on QP {} in state RESET", self.sh.qpn)));
        }
        for wr in wrs {
            if *self.sh.state.lock() == QpState::Error {
                self.sh.recv_done(wr.wr_id, Status::WrFlush, 0, None);
                continue;
            }
            let mut rq = self.sh.rq.lock();
            if rq.len() >= self.sh.caps.max_recv_wr as usize {
                return Err(Error::System(format!(
                    "post_recv on QP {} of {}: the receive queue is full (max_recv_wr {})",
                    self.sh.qpn, self.sh.dev.name, self.sh.caps.max_recv_wr
                )));
            }
            rq.push_back(*wr);
        }
        Ok(())
    }
}

/// A work request the engine holds.
struct Out {
    wr: SendWr,
    seq: u64,
    psn: u32,
    posted: Instant,
    sent: bool,
}

/// The IB RNR timer table, in microseconds, by the 5-bit code.
fn rnr_delay(code: u8) -> Duration {
    const US: [u64; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840, 5120, 7680, 10240,
        15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520,
    ];
    Duration::from_micros(US[(code & 31) as usize])
}

struct Engine {
    sh: Arc<Shared>,
    rx: mpsc::Receiver<Ev>,
    wire: Option<Wire>,
    /// Packets sent before the link was attached (delivered on attach).
    backlog: Vec<Packet>,
    /// The link broke: packets go nowhere from now on.
    broken: bool,
    connected: bool,
    early: Vec<Packet>,
    // Requester.
    ack_timeout: Duration,
    retry_cnt: u32,
    rnr_retry: u8,
    rnr_timer: Duration,
    pending: VecDeque<Out>,
    next_psn: u32,
    ack_clock: Instant,
    retries: u32,
    rnr_left: u8,
    resend_at: Option<Instant>,
    // Responder.
    expect: u32,
    rng: u64,
}

impl Engine {
    fn new(sh: Arc<Shared>, rx: mpsc::Receiver<Ev>) -> Engine {
        let rng = 0x9e37_79b9_7f4a_7c15 ^ sh.qpn as u64;
        Engine {
            sh,
            rx,
            wire: None,
            backlog: Vec::new(),
            broken: false,
            connected: false,
            early: Vec::new(),
            ack_timeout: Duration::from_secs(4),
            retry_cnt: 7,
            rnr_retry: 7,
            rnr_timer: rnr_delay(12),
            pending: VecDeque::new(),
            next_psn: 0,
            ack_clock: Instant::now(),
            retries: 0,
            rnr_left: 7,
            resend_at: None,
            expect: 0,
            rng,
        }
    }

    fn run(mut self) {
        loop {
            let wait = self.next_deadline().map_or(Duration::from_millis(200), |d| {
                d.saturating_duration_since(Instant::now()).max(Duration::from_micros(50))
            });
            match self.rx.recv_timeout(wait) {
                Ok(Ev::Stop) => break,
                Ok(ev) => self.handle(ev),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
            self.pump();
            self.check_timeout();
        }
        if let Some(Wire::Tcp(s)) = &self.wire {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    fn state(&self) -> QpState {
        *self.sh.state.lock()
    }

    fn next_deadline(&self) -> Option<Instant> {
        let mut d: Option<Instant> = None;
        let mut at = |t: Instant| d = Some(d.map_or(t, |x: Instant| x.min(t)));
        if self.pending.iter().any(|o| o.sent) {
            at(self.ack_clock + self.ack_timeout);
        }
        if let Some(t) = self.resend_at {
            at(t);
        }
        if let (Some(late), Some(o)) = (self.sh.dev.opts.late_read, self.pending.iter().find(|o| !o.sent)) {
            at(o.posted + late);
        }
        d
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Connect(c) => {
                self.ack_timeout = Duration::from_secs_f64(c.ack_timeout_secs());
                self.retry_cnt = c.retry_cnt as u32;
                self.rnr_retry = c.rnr_retry;
                self.rnr_left = c.rnr_retry;
                self.rnr_timer = rnr_delay(c.min_rnr_timer);
                self.next_psn = c.local_psn & PSN_MASK;
                self.expect = c.remote_psn & PSN_MASK;
                self.connected = true;
                for p in std::mem::take(&mut self.early) {
                    self.incoming(p);
                }
            }
            Ev::Post(wr, seq, at) => {
                if self.state() == QpState::Error {
                    self.sh.send_done(&wr, seq, Status::WrFlush, 0);
                    return;
                }
                let psn = self.next_psn;
                self.next_psn = (self.next_psn + 1) & PSN_MASK;
                self.pending.push_back(Out { wr, seq, psn, posted: at, sent: false });
            }
            Ev::Packet(p) if !self.connected => self.early.push(p),
            Ev::Packet(p) => self.incoming(p),
            Ev::Attach(w) => {
                if !self.broken {
                    self.wire = Some(w);
                    for p in std::mem::take(&mut self.backlog) {
                        self.transmit(p);
                    }
                }
            }
            Ev::LinkDown(why) => {
                tracing::debug!(qpn = self.sh.qpn, "soft HCA: link down: {why}");
                if let Some(Wire::Tcp(s)) = self.wire.take() {
                    let _ = s.shutdown(Shutdown::Both);
                }
                self.wire = None;
                self.broken = true;
                self.backlog.clear();
            }
            Ev::Fail => self.fail_qp(None),
            Ev::Stop => {}
        }
    }

    fn transmit(&mut self, p: Packet) {
        let ok = match &mut self.wire {
            Some(Wire::Tcp(s)) => p.write_to(s).is_ok(),
            Some(Wire::Local(t)) => t.send(Ev::Packet(p)).is_ok(),
            None if self.broken => true, // nowhere to go: the peer never acknowledges
            None => {
                self.backlog.push(p);
                true
            }
        };
        if !ok {
            self.wire = None;
            self.broken = true;
        }
    }

    /// Sends the held work requests whose time has come, in order.
    fn pump(&mut self) {
        if self.state() == QpState::Error || !self.connected {
            return;
        }
        let now = Instant::now();
        if self.resend_at.is_some_and(|t| now < t) {
            return;
        }
        self.resend_at = None;
        let late = self.sh.dev.opts.late_read;
        let mut i = 0;
        while i < self.pending.len() {
            let o = &self.pending[i];
            if o.sent {
                i += 1;
                continue;
            }
            if late.is_some_and(|l| now < o.posted + l) {
                return;
            }
            let (wr, psn) = (o.wr, o.psn);
            let p = match wr.op {
                Opcode::Write | Opcode::WriteImm(_) => {
                    let mut data = vec![0u8; wr.len as usize];
                    let dst = data.as_mut_ptr() as u64;
                    // SAFETY: the source lies in a live registration (access
                    // checks it and holds it meanwhile); data is a fresh
                    // buffer of that length.
                    let read = || unsafe { DevInner::copy(wr.local, dst, wr.len as usize) };
                    if wr.len > 0 && !self.sh.access(wr.lkey, wr.local, wr.len as u64, Access::default(), read) {
                        let bad = self.pending.remove(i).expect("index in range");
                        return self.fail_qp(Some((bad, Status::LocProt)));
                    }
                    let imm = if let Opcode::WriteImm(v) = wr.op { Some(v) } else { None };
                    Packet::Write { psn, addr: wr.remote, rkey: wr.rkey, imm, data }
                }
                Opcode::Read => {
                    if !self.sh.access(wr.lkey, wr.local, wr.len as u64, Access::LOCAL, || ()) {
                        let bad = self.pending.remove(i).expect("index in range");
                        return self.fail_qp(Some((bad, Status::LocProt)));
                    }
                    Packet::ReadReq { psn, addr: wr.remote, rkey: wr.rkey, len: wr.len }
                }
            };
            if !self.pending.iter().any(|o| o.sent) {
                self.ack_clock = Instant::now();
            }
            self.pending[i].sent = true;
            self.transmit(p);
            i += 1;
        }
    }

    fn check_timeout(&mut self) {
        if !self.pending.iter().any(|o| o.sent) || self.ack_clock.elapsed() < self.ack_timeout {
            return;
        }
        self.retries += 1;
        self.ack_clock = Instant::now();
        if self.retries > self.retry_cnt {
            let first = self.pending.pop_front().expect("a sent request is pending");
            self.fail_qp(Some((first, Status::RetryExc)));
        }
    }

    /// Completes `o` successfully (a completion if it asked for one).
    fn complete(&mut self, o: Out, byte_len: u32) {
        if !o.wr.signaled {
            return;
        }
        if !self.sh.send_done(&o.wr, o.seq, Status::Success, byte_len) {
            self.fail_qp(None);
        }
    }

    /// Completes every request before `psn` (implicitly acknowledged).
    fn ack_before(&mut self, psn: u32) {
        while let Some(o) = self.pending.front() {
            if !(o.sent && psn_before(o.psn, psn)) {
                break;
            }
            if matches!(o.wr.op, Opcode::Read) {
                break; // a READ completes only with its response
            }
            let o = self.pending.pop_front().expect("front exists");
            self.complete(o, 0);
        }
        self.retries = 0;
        self.ack_clock = Instant::now();
    }

    fn incoming(&mut self, p: Packet) {
        match p {
            Packet::Ack { psn } => {
                self.ack_before((psn + 1) & PSN_MASK);
                self.rnr_left = self.rnr_retry;
            }
            Packet::ReadResp { psn, data } => {
                self.ack_before(psn);
                if self.pending.front().is_some_and(|o| o.psn == psn) {
                    let o = self.pending.pop_front().expect("front exists");
                    let n = data.len().min(o.wr.len as usize);
                    let src = data.as_ptr() as u64;
                    // SAFETY: access checks the destination against a live
                    // registration with local write rights and holds it.
                    let place = || unsafe { DevInner::copy(src, o.wr.local, n) };
                    if !self.sh.access(o.wr.lkey, o.wr.local, n as u64, Access::LOCAL, place) {
                        return self.fail_qp(Some((o, Status::LocProt)));
                    }
                    self.complete(o, n as u32);
                }
            }
            Packet::Nak { psn, why } => {
                self.ack_before(psn);
                if self.pending.front().is_none_or(|o| o.psn != psn) {
                    return;
                }
                match why {
                    Nak::Rnr if self.rnr_retry < 7 && self.rnr_left == 0 => {
                        let o = self.pending.pop_front().expect("front exists");
                        self.fail_qp(Some((o, Status::RnrRetryExc)));
                    }
                    Nak::Rnr => {
                        if self.rnr_retry < 7 {
                            self.rnr_left -= 1;
                        }
                        for o in &mut self.pending {
                            o.sent = false;
                        }
                        self.resend_at = Some(Instant::now() + self.rnr_timer);
                    }
                    Nak::RemAccess | Nak::RemInvReq => {
                        let o = self.pending.pop_front().expect("front exists");
                        let st = if why == Nak::RemAccess { Status::RemAccess } else { Status::RemInvReq };
                        self.fail_qp(Some((o, st)));
                    }
                }
            }
            Packet::Write { psn, .. } | Packet::ReadReq { psn, .. } if self.state() == QpState::Error => {
                let _ = psn; // a failed QP drops requests: the requester times out
            }
            Packet::Write { psn, addr, rkey, imm, data } => {
                if !self.in_sequence(psn) {
                    return;
                }
                let need = Access { local_write: false, remote_write: true, remote_read: false };
                let zero_imm = data.is_empty() && imm.is_some();
                if !zero_imm && !self.sh.access(rkey, addr, data.len() as u64, need, || ()) {
                    return self.access_error(psn);
                }
                let recv = match imm {
                    Some(_) => {
                        let r = self.sh.rq.lock().pop_front();
                        if r.is_none() {
                            return self.transmit(Packet::Nak { psn, why: Nak::Rnr });
                        }
                        r
                    }
                    None => None,
                };
                if !zero_imm {
                    let mut placed = false;
                    let sh = self.sh.clone();
                    sh.access(rkey, addr, data.len() as u64, need, || {
                        self.place(addr, &data);
                        placed = true;
                    });
                    if !placed {
                        // Deregistered since the check above.
                        return self.access_error(psn);
                    }
                }
                if let (Some(r), Some(v)) = (recv, imm)
                    && !self.sh.recv_done(r.wr_id, Status::Success, data.len() as u32, Some(v))
                {
                    return self.fail_qp(None);
                }
                self.expect = (psn + 1) & PSN_MASK;
                self.transmit(Packet::Ack { psn });
            }
            Packet::ReadReq { psn, addr, rkey, len } => {
                if !self.in_sequence(psn) {
                    return;
                }
                let need = Access { local_write: false, remote_write: false, remote_read: true };
                let mut data = vec![0u8; len as usize];
                let dst = data.as_mut_ptr() as u64;
                // SAFETY: access checks the range against a live
                // registration that grants remote reads, and holds it.
                let read = || unsafe { DevInner::copy(addr, dst, len as usize) };
                if !self.sh.access(rkey, addr, len as u64, need, read) {
                    return self.access_error(psn);
                }
                self.expect = (psn + 1) & PSN_MASK;
                self.transmit(Packet::ReadResp { psn, data });
            }
        }
    }

    /// Whether request `psn` is the next expected; duplicates are
    /// acknowledged again, requests after a refused one are dropped until
    /// it is sent again.
    fn in_sequence(&mut self, psn: u32) -> bool {
        if psn == self.expect {
            return true;
        }
        if psn_before(psn, self.expect) {
            let last = self.expect.wrapping_sub(1) & PSN_MASK;
            self.transmit(Packet::Ack { psn: last });
        }
        false
    }

    fn access_error(&mut self, psn: u32) {
        self.transmit(Packet::Nak { psn, why: Nak::RemAccess });
        self.sh.dev.event(AsyncEvent::QpError(self.sh.qpn));
        self.fail_qp(None);
    }

    /// Places a WRITE's data (poisoned and shuffled if asked).
    fn place(&mut self, addr: u64, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        if !self.sh.dev.opts.shuffle {
            // SAFETY: the caller holds the registration (DevInner::access)
            // that covers the destination with remote write rights.
            unsafe { DevInner::copy(data.as_ptr() as u64, addr, data.len()) };
            return;
        }
        let poison = vec![0xa5u8; data.len()];
        // SAFETY: as above.
        unsafe { DevInner::copy(poison.as_ptr() as u64, addr, data.len()) };
        const PIECE: usize = 4096;
        let mut order: Vec<usize> = (0..data.len().div_ceil(PIECE)).collect();
        for i in (1..order.len()).rev() {
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            order.swap(i, (self.rng % (i as u64 + 1)) as usize);
        }
        for (k, i) in order.into_iter().enumerate() {
            let (a, b) = (i * PIECE, ((i + 1) * PIECE).min(data.len()));
            // SAFETY: as above; a..b lies inside data.
            unsafe { DevInner::copy(data[a..].as_ptr() as u64, addr + a as u64, b - a) };
            if k % 16 == 15 {
                std::thread::yield_now();
            }
        }
    }

    /// Moves the QP to the error state: `first` completes with its status,
    /// everything else outstanding (receives too) with WR_FLUSH_ERR.
    fn fail_qp(&mut self, first: Option<(Out, Status)>) {
        *self.sh.state.lock() = QpState::Error;
        if let Some((o, st)) = first {
            self.sh.send_done(&o.wr, o.seq, st, 0);
        }
        for o in std::mem::take(&mut self.pending) {
            self.sh.send_done(&o.wr, o.seq, Status::WrFlush, 0);
        }
        let rq: Vec<RecvWr> = self.sh.rq.lock().drain(..).collect();
        for r in rq {
            self.sh.recv_done(r.wr_id, Status::WrFlush, 0, None);
        }
    }
}

fn wc_of(op: Opcode) -> WcOpcode {
    match op {
        Opcode::Read => WcOpcode::Read,
        _ => WcOpcode::Write,
    }
}

/// Accepts streams for the device's QPs until the device is dropped; each
/// reads its hello on a thread of its own, so a silent connection holds up
/// no real QP.
pub(crate) fn accept_loop(l: TcpListener, dev: Weak<DevInner>) {
    let Some(what) = dev.upgrade().map(|d| format!("soft HCA {}", d.name)) else { return };
    let closed = |d: &DevInner| d.closed.load(Ordering::Acquire);
    let weak = dev.clone();
    crate::rdma::accept_while(l, dev, Duration::from_millis(5), &what, closed, |_, s, _| {
        let w = weak.clone();
        let _ = std::thread::Builder::new().name("oxccl-softhca-hello".into()).spawn(move || hello(s, &w));
    });
}

/// Reads a stream's hello (5 s at most) and hands it to its QP.
fn hello(mut s: TcpStream, dev: &Weak<DevInner>) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut h = [0u8; HELLO_LEN];
    let ok = s.read_exact(&mut h).is_ok() && &h[..8] == HELLO_MAGIC;
    let Some(d) = dev.upgrade() else { return };
    if !ok {
        tracing::warn!(device = %d.name, "soft HCA: dropped a connection without a valid hello");
        return;
    }
    let _ = s.set_read_timeout(None);
    let dst = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes"));
    let from = Remote {
        qpn: u32::from_le_bytes(h[12..16].try_into().expect("4 bytes")),
        ip: Ipv4Addr::new(h[16], h[17], h[18], h[19]),
        port: u16::from_le_bytes([h[20], h[21]]),
    };
    match d.qps.lock().get(&dst).and_then(Weak::upgrade) {
        Some(q) => q.offer(s, from),
        None => tracing::warn!(device = %d.name, "soft HCA: a stream for unknown QP {dst} was dropped"),
    }
}
