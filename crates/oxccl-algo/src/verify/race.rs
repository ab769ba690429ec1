//! Happens-before tracking for one-sided accesses and concurrent channels.
//!
//! Each process (a rank's channel) carries a vector clock. Signals and
//! messages release the sender's clock and the matching wait or receive
//! acquires it. Shadow memory (FastTrack's, compressed over runs of
//! elements) keeps, for every run of a buffer, its last write and the
//! latest read of each process since; an access that conflicts with one of
//! them (at least one write, different processes) must find it in its
//! clock, or the two race. Each rank's buffers start out
//! "written" by the rank itself at epoch 1, so a peer may touch them only
//! after hearing from the rank; when the rank returns, every access by
//! others must be in its clock (nobody is still using its memory).

use std::collections::BTreeMap;
use std::rc::Rc;

/// A recorded access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rec {
    pub(crate) write: bool,
    pub(crate) proc: usize,
    epoch: u32,
    /// Step index of the access in its channel (`usize::MAX`: the rank's
    /// entry into the collective).
    pub(crate) pc: usize,
}

/// The accesses that matter for a run of elements.
#[derive(Clone, Debug)]
struct Shadow {
    len: usize,
    write: Rec,
    reads: Vec<Rec>,
}

pub(crate) struct Clocks {
    vc: Vec<Vec<u32>>,
    /// The clock a process last released, while it still describes the
    /// process (no access or acquire since): consecutive releases share it.
    snap: Vec<Option<Rc<Vec<u32>>>>,
    first_proc: Vec<usize>,
    shadow: Vec<[BTreeMap<usize, Shadow>; 3]>,
}

impl Clocks {
    /// `procs[r]`: channels of rank `r`; `lens[r]`: its physical buffers.
    pub(crate) fn new(procs: &[usize], lens: &[[usize; 3]]) -> Clocks {
        // Clock entries: one per process, then one per rank for its entry
        // into the collective (which wrote its buffers).
        let real: usize = procs.iter().sum();
        let total = real + procs.len();
        let mut first_proc = Vec::with_capacity(procs.len() + 1);
        let mut vc = Vec::with_capacity(real);
        let mut next = 0;
        for (r, &k) in procs.iter().enumerate() {
            first_proc.push(next);
            for p in next..next + k {
                let mut c = vec![0u32; total];
                c[p] = 1;
                c[real + r] = 1;
                vc.push(c);
            }
            next += k;
        }
        first_proc.push(real);
        let shadow = lens
            .iter()
            .enumerate()
            .map(|(r, l)| {
                l.map(|len| {
                    let entry = Rec { write: true, proc: real + r, epoch: 1, pc: usize::MAX };
                    let mut m = BTreeMap::new();
                    if len > 0 {
                        m.insert(0, Shadow { len, write: entry, reads: Vec::new() });
                    }
                    m
                })
            })
            .collect();
        Clocks { snap: vec![None; vc.len()], vc, first_proc, shadow }
    }

    /// The rank entry pseudo-process `proc` stands for, if it is one.
    pub(crate) fn entry_of(&self, proc: usize) -> Option<usize> {
        let real = self.vc.len();
        (proc >= real).then(|| proc - real)
    }

    /// Hands out `p`'s clock and starts a new epoch.
    pub(crate) fn release(&mut self, p: usize) -> Rc<Vec<u32>> {
        if let Some(s) = &self.snap[p] {
            return s.clone();
        }
        let s = Rc::new(self.vc[p].clone());
        self.vc[p][p] += 1;
        self.snap[p] = Some(s.clone());
        s
    }

    /// Merges a released clock into `p`'s.
    pub(crate) fn acquire(&mut self, p: usize, clock: &[u32]) {
        let mut learned = false;
        for (a, b) in self.vc[p].iter_mut().zip(clock) {
            if *b > *a {
                *a = *b;
                learned = true;
            }
        }
        if learned {
            self.snap[p] = None;
        }
    }

    /// Records an access by `p` (at step `pc`) to `owner`'s buffer `buf`,
    /// elements `range`; returns the earlier access it races with and where.
    pub(crate) fn access(
        &mut self,
        (p, pc): (usize, usize),
        (owner, buf): (usize, usize),
        range: std::ops::Range<usize>,
        write: bool,
    ) -> Result<(), (Rec, usize, usize)> {
        let (start, end) = (range.start, range.end);
        if start == end {
            return Ok(());
        }
        let clock = &self.vc[p];
        let map = &mut self.shadow[owner][buf];
        split(map, start);
        split(map, end);
        let ordered = |r: &Rec| r.proc == p || clock[r.proc] >= r.epoch;
        for (&s, sh) in map.range(start..end) {
            let clash = if write {
                std::iter::once(&sh.write).chain(&sh.reads).find(|r| !ordered(r))
            } else {
                Some(&sh.write).filter(|r| !ordered(r))
            };
            if let Some(r) = clash {
                return Err((*r, s, s + sh.len));
            }
        }
        let me = Rec { write, proc: p, epoch: clock[p], pc };
        self.snap[p] = None;
        for sh in map.range_mut(start..end).map(|(_, sh)| sh) {
            if write {
                // Everything here is ordered before this write, so a later
                // access ordered after it is ordered after them too.
                sh.write = me;
                sh.reads.clear();
            } else if let Some(r) = sh.reads.iter_mut().find(|r| r.proc == p) {
                *r = me;
            } else {
                sh.reads.push(me);
            }
        }
        Ok(())
    }

    /// The first access to `rank`'s buffers by another rank that `rank`
    /// has not heard the end of when it returns: `(buffer, access, start,
    /// end)`.
    pub(crate) fn unfinished(&self, rank: usize) -> Option<(usize, Rec, usize, usize)> {
        let (lo, hi) = (self.first_proc[rank], self.first_proc[rank + 1]);
        let mut end = vec![0u32; self.vc[0].len()];
        for c in &self.vc[lo..hi] {
            for (a, b) in end.iter_mut().zip(c) {
                *a = (*a).max(*b);
            }
        }
        let foreign = |r: &Rec| r.pc != usize::MAX && !(lo..hi).contains(&r.proc) && end[r.proc] < r.epoch;
        self.shadow[rank].iter().enumerate().find_map(|(buf, map)| {
            map.iter().find_map(|(&s, sh)| {
                std::iter::once(&sh.write).chain(&sh.reads).find(|r| foreign(r)).map(|r| (buf, *r, s, s + sh.len))
            })
        })
    }
}

/// Makes `at` the start of a run of `map`.
fn split(map: &mut BTreeMap<usize, Shadow>, at: usize) {
    let Some((&s, sh)) = map.range_mut(..=at).next_back() else {
        return;
    };
    if s < at && at < s + sh.len {
        let mut tail = sh.clone();
        tail.len = s + sh.len - at;
        sh.len = at - s;
        map.insert(at, tail);
    }
}
