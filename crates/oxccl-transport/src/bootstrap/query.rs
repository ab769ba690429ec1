//! What a rank may learn of another's calls after init, without a call
//! of its own: a rank publishes small records under keys
//! ([`Bootstrap::publish`]: the engine publishes each collective it runs
//! under its number); another rank asks for one ([`Bootstrap::ask`]) and
//! the owner's monitor thread answers from what it holds, so a rank
//! blocked in a call still answers. Questions and answers travel through
//! rank 0's monitor. The engine uses it to name both sides of calls that
//! disagree in a way the messages cannot show (a count that differs).

use std::sync::atomic::{AtomicU64, Ordering, fence};
use std::time::{Duration, Instant};

use super::frame::{self, Dec, Enc, tag};
use super::{Bootstrap, Shared};

/// Records kept per rank (the latest; older keys are forgotten).
pub(super) const KEPT: usize = 64;
/// Bytes of one record.
pub const RECORD: usize = 32;

/// The records a rank published, by key modulo [`KEPT`]: a seqlock per
/// slot, so that publishing (once per collective, on the call path) is
/// plain stores, and the monitor thread reads without a lock. One writer
/// at a time ([`Bootstrap::publish`]'s contract); readers retry while a
/// write is under way.
pub(super) struct Records {
    slots: Vec<Slot>,
}

/// One record: `ver` is odd while it is written, 0 until the first.
#[derive(Default)]
struct Slot {
    ver: AtomicU64,
    key: AtomicU64,
    words: [AtomicU64; RECORD / 8],
}

impl Default for Records {
    fn default() -> Records {
        Records { slots: (0..KEPT).map(|_| Slot::default()).collect() }
    }
}

impl Records {
    fn slot(&self, key: u64) -> &Slot {
        &self.slots[(key % KEPT as u64) as usize]
    }

    /// Stores `v` under `key`. One writer at a time: a second one at once
    /// could leave a torn record (never unsound, only a wrong answer).
    fn put(&self, key: u64, v: &[u8; RECORD]) {
        let s = self.slot(key);
        let ver = s.ver.load(Ordering::Relaxed);
        s.ver.store(ver | 1, Ordering::Relaxed);
        fence(Ordering::Release);
        s.key.store(key, Ordering::Relaxed);
        for (w, b) in s.words.iter().zip(v.chunks_exact(8)) {
            w.store(u64::from_le_bytes(b.try_into().expect("8 bytes")), Ordering::Relaxed);
        }
        s.ver.store((ver | 1).wrapping_add(1), Ordering::Release);
    }

    fn get(&self, key: u64) -> Option<[u8; RECORD]> {
        let s = self.slot(key);
        loop {
            let before = s.ver.load(Ordering::Acquire);
            if before == 0 {
                return None;
            }
            if before & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let k = s.key.load(Ordering::Relaxed);
            let mut v = [0u8; RECORD];
            for (w, b) in s.words.iter().zip(v.chunks_exact_mut(8)) {
                b.copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
            }
            fence(Ordering::Acquire);
            if s.ver.load(Ordering::Relaxed) == before {
                return (k == key).then_some(v);
            }
        }
    }
}

impl Bootstrap {
    /// Publishes `what` (at most [`RECORD`] bytes, zero-padded) under
    /// `key`; other ranks may [`ask`](Bootstrap::ask) for it. The latest
    /// [`KEPT`] keys are kept. Plain stores, no lock: the caller makes
    /// sure one thread publishes at a time (the engine publishes under
    /// its lock); two at once may leave one record torn.
    pub fn publish(&self, key: u64, what: &[u8]) {
        let mut v = [0u8; RECORD];
        let n = what.len().min(RECORD);
        v[..n].copy_from_slice(&what[..n]);
        self.shared.records.put(key, &v);
    }

    /// What `rank` published under `key`: `None` if it did not (yet, or
    /// any more), or no answer came within `wait` (it is gone, the star
    /// is broken). Must not be called from a failure callback.
    pub fn ask(&self, rank: usize, key: u64, wait: Duration) -> Option<[u8; RECORD]> {
        let sh = &*self.shared;
        if rank == sh.rank {
            return sh.records.get(key);
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
        let _ = sh.send(0, &answer(qid, other, sh.records.get(key)));
        return Ok(());
    }
    // To rank 0, for `other`.
    if other == 0 {
        let _ = sh.send(from, &answer(qid, 0, sh.records.get(key)));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: u64) -> [u8; RECORD] {
        let mut v = [0u8; RECORD];
        for (i, b) in v.iter_mut().enumerate() {
            *b = (key as u8).wrapping_mul(31).wrapping_add(i as u8);
        }
        v
    }

    #[test]
    fn records_keep_the_latest_keys_and_forget_older_ones() {
        let r = Records::default();
        assert_eq!(r.get(5), None, "nothing published yet");
        r.put(5, &record(5));
        assert_eq!(r.get(5), Some(record(5)));
        r.put(5 + KEPT as u64, &record(7));
        assert_eq!(r.get(5), None, "its slot now holds a later key");
        assert_eq!(r.get(5 + KEPT as u64), Some(record(7)));
        // Keys 0 and u64::MAX are keys like the others.
        assert_eq!(r.get(u64::MAX), None, "its slot was never written");
        assert_eq!(r.get(0), None, "its slot was never written");
        r.put(u64::MAX, &record(9));
        assert_eq!(r.get(u64::MAX), Some(record(9)));
        r.put(0, &record(1));
        assert_eq!(r.get(0), Some(record(1)));
    }

    #[test]
    fn a_reader_never_sees_a_torn_record_while_the_writer_writes() {
        let r = Records::default();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                for round in 0..200_000u64 {
                    // Every write lands in slot 3, under keys that differ.
                    r.put(3 + KEPT as u64 * (round % 4), &record(round));
                }
                stop.store(true, Ordering::Release);
            });
            let mut seen = 0u64;
            loop {
                // One more pass after the writer is done: the slot is
                // then sure to hold a record.
                let done = stop.load(Ordering::Acquire);
                for q in 0..4 {
                    if let Some(v) = r.get(3 + KEPT as u64 * q) {
                        let first = v[0];
                        let key = (0..=255u8).find(|k| k.wrapping_mul(31) == first).expect("a written byte");
                        assert_eq!(v, record(key as u64), "a record mixing two writes");
                        assert_eq!(key as u64 % 4, q, "a key from one write, the bytes from another");
                        seen += 1;
                    }
                }
                if done {
                    break;
                }
            }
            assert!(seen > 0, "the reader saw no record at all");
        });
    }
}
