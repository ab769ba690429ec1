//! What a rank may learn of another's calls after init, without a call
//! of its own: a rank publishes small records under keys
//! ([`Bootstrap::publish`]: the engine publishes each collective it runs
//! under its number); another rank asks for one ([`Bootstrap::ask`]) and
//! the owner's monitor thread answers from what it holds, so a rank
//! blocked in a call still answers. Questions and answers travel through
//! rank 0's monitor. The engine uses it to name both sides of calls that
//! disagree in a way the messages cannot show (a count that differs).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::frame::{self, Dec, Enc, tag};
use super::{Bootstrap, Shared};

/// Records kept per rank (the latest; older keys are forgotten).
pub(super) const KEPT: usize = 64;
/// Bytes of one record.
pub const RECORD: usize = 32;

/// The records a rank published, by key modulo [`KEPT`].
pub(super) struct Records {
    slots: Vec<Option<(u64, [u8; RECORD])>>,
}

impl Default for Records {
    fn default() -> Records {
        Records { slots: vec![None; KEPT] }
    }
}

impl Records {
    fn get(&self, key: u64) -> Option<[u8; RECORD]> {
        self.slots[(key % KEPT as u64) as usize].filter(|(k, _)| *k == key).map(|(_, v)| v)
    }
}

impl Bootstrap {
    /// Publishes `what` (at most [`RECORD`] bytes, zero-padded) under
    /// `key`; other ranks may [`ask`](Bootstrap::ask) for it. The latest
    /// [`KEPT`] keys are kept.
    pub fn publish(&self, key: u64, what: &[u8]) {
        let mut v = [0u8; RECORD];
        let n = what.len().min(RECORD);
        v[..n].copy_from_slice(&what[..n]);
        self.shared.records.lock().slots[(key % KEPT as u64) as usize] = Some((key, v));
    }

    /// What `rank` published under `key`: `None` if it did not (yet, or
    /// any more), or no answer came within `wait` (it is gone, the star
    /// is broken). Must not be called from a failure callback.
    pub fn ask(&self, rank: usize, key: u64, wait: Duration) -> Option<[u8; RECORD]> {
        let sh = &*self.shared;
        if rank == sh.rank {
            return sh.records.lock().get(key);
        }
        if rank >= sh.nranks || sh.closed.load(Ordering::Acquire) {
            return None;
        }
        let qid = {
            let mut st = sh.state.lock();
            st.next_query += 1;
            st.next_query
        };
        // To rank 0 the question names the rank asked; from rank 0, the
        // asking rank (itself).
        let (to, other) = if sh.rank == 0 { (rank, 0) } else { (0, rank) };
        let mut e = Enc::default();
        e.u64(qid).u32(other as u32).u64(key);
        if sh.send(to, &frame::frame(tag::ASK, &e.0)).is_err() {
            return None;
        }
        let end = Instant::now() + wait;
        let mut st = sh.state.lock();
        loop {
            if let Some(a) = st.answers.remove(&qid) {
                return a;
            }
            if sh.cond.wait_until(&mut st, end).timed_out() {
                return st.answers.remove(&qid).flatten();
            }
        }
    }
}

fn answer(qid: u64, other: usize, found: Option<[u8; RECORD]>) -> Vec<u8> {
    let mut e = Enc::default();
    e.u64(qid).u32(other as u32);
    match found {
        Some(v) => e.raw(&[1]).raw(&v),
        None => e.raw(&[0]),
    };
    frame::frame(tag::ANSWER, &e.0)
}

/// A question from `from`: rank 0 answers its own or passes it on; a
/// rank answers from its records.
pub(super) fn on_ask(sh: &Shared, from: usize, payload: &[u8]) -> Result<(), String> {
    let mut d = Dec::new(payload);
    let (qid, other, key) = (d.u64()?, d.u32()? as usize, d.u64()?);
    d.end()?;
    if other >= sh.nranks {
        return Err(format!("a question naming rank {other} of {}", sh.nranks));
    }
    if sh.rank != 0 {
        // From rank 0, on behalf of `other`.
        let _ = sh.send(0, &answer(qid, other, sh.records.lock().get(key)));
        return Ok(());
    }
    // To rank 0, for `other`.
    if other == 0 {
        let _ = sh.send(from, &answer(qid, 0, sh.records.lock().get(key)));
        return Ok(());
    }
    let mut e = Enc::default();
    e.u64(qid).u32(from as u32).u64(key);
    let gone = sh.state.lock().gone[other];
    if gone || sh.send(other, &frame::frame(tag::ASK, &e.0)).is_err() {
        let _ = sh.send(from, &answer(qid, other, None));
    }
    Ok(())
}

/// An answer from `from`: rank 0 passes it on unless it asked; a rank
/// files it.
pub(super) fn on_answer(sh: &Shared, from: usize, payload: &[u8]) -> Result<(), String> {
    let mut d = Dec::new(payload);
    let (qid, other) = (d.u64()?, d.u32()? as usize);
    let found = match d.u8()? {
        0 => None,
        _ => {
            let mut v = [0u8; RECORD];
            v.copy_from_slice(d.raw(RECORD)?);
            Some(v)
        }
    };
    d.end()?;
    if sh.rank == 0 && other != 0 {
        if other >= sh.nranks {
            return Err(format!("an answer for rank {other} of {}", sh.nranks));
        }
        let _ = sh.send(other, &answer(qid, from, found));
        return Ok(());
    }
    let mut st = sh.state.lock();
    // Answers nobody waits for any more (they came too late) go.
    st.answers.retain(|&q, _| q + 64 > qid);
    st.answers.insert(qid, found);
    sh.cond.notify_all();
    Ok(())
}
