//! Happens-before tracking for one-sided accesses and concurrent channels.
//!
//! Each process (a rank's channel) carries a vector clock. Signals and
//! messages release the sender's clock and the matching wait or receive
//! acquires it. Every access to a rank's buffers is recorded with its
//! process and epoch; an access that conflicts with an earlier one (same
//! elements, at least one write, different processes) must find that
//! access in its clock, or the two race. Each rank's buffers start out
//! "written" by the rank itself at epoch 1, so a peer may touch them only
//! after hearing from the rank; when the rank returns, every access by
//! others must be in its clock (nobody is still using its memory).

/// A recorded access.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rec {
    pub(crate) start: usize,
    pub(crate) end: usize,
    pub(crate) write: bool,
    pub(crate) proc: usize,
    epoch: u32,
    /// Step index of the access in its channel (`usize::MAX`: the rank's
    /// entry into the collective).
    pub(crate) pc: usize,
}

pub(crate) struct Clocks {
    vc: Vec<Vec<u32>>,
    first_proc: Vec<usize>,
    records: Vec<[Vec<Rec>; 3]>,
}

impl Clocks {
    /// `procs[r]`: channels of rank `r`; `lens[r]`: its physical buffers.
    pub(crate) fn new(procs: &[usize], lens: &[[usize; 3]]) -> Clocks {
        // Clock entries: one per process, then one per rank for its entry
        // into the collective (which wrote its buffers).
        let real: usize = procs.iter().sum();
        let total = real + procs.len();
        let mut first_proc = Vec::with_capacity(procs.len());
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
        let records = lens
            .iter()
            .enumerate()
            .map(|(r, l)| {
                l.map(|len| {
                    let entry = Rec {
                        start: 0,
                        end: len,
                        write: true,
                        proc: real + r,
                        epoch: 1,
                        pc: usize::MAX,
                    };
                    if len > 0 { vec![entry] } else { Vec::new() }
                })
            })
            .collect();
        Clocks {
            vc,
            first_proc,
            records,
        }
    }

    /// The rank entry pseudo-process `proc` stands for, if it is one.
    pub(crate) fn entry_of(&self, proc: usize) -> Option<usize> {
        let real = self.vc.len();
        (proc >= real).then(|| proc - real)
    }

    /// Hands out `p`'s clock and starts a new epoch.
    pub(crate) fn release(&mut self, p: usize) -> Vec<u32> {
        let c = self.vc[p].clone();
        self.vc[p][p] += 1;
        c
    }

    /// Merges a released clock into `p`'s.
    pub(crate) fn acquire(&mut self, p: usize, clock: &[u32]) {
        for (a, b) in self.vc[p].iter_mut().zip(clock) {
            *a = (*a).max(*b);
        }
    }

    /// Records an access by `p` to `owner`'s buffer `buf`, `[start, end)`;
    /// returns the earlier access it races with, if any.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn access(
        &mut self,
        p: usize,
        pc: usize,
        owner: usize,
        buf: usize,
        start: usize,
        end: usize,
        write: bool,
    ) -> Result<(), Rec> {
        if start == end {
            return Ok(());
        }
        let clock = &self.vc[p];
        let recs = &mut self.records[owner][buf];
        for r in recs.iter() {
            let overlaps = r.start < end && start < r.end;
            if overlaps && r.proc != p && (r.write || write) && clock[r.proc] < r.epoch {
                return Err(*r);
            }
        }
        if write {
            // Every overlapping access is ordered before this write, so a
            // later access ordered after this write is ordered after them.
            recs.retain(|r| !(start <= r.start && r.end <= end));
        }
        recs.push(Rec {
            start,
            end,
            write,
            proc: p,
            epoch: clock[p],
            pc,
        });
        Ok(())
    }

    /// The first access to `rank`'s buffers by another rank that `rank`
    /// has not heard the end of when it returns: `(buffer, access)`.
    pub(crate) fn unfinished(&self, rank: usize) -> Option<(usize, Rec)> {
        let (lo, hi) = (self.first_proc[rank], self.first_proc[rank + 1]);
        let mut end = vec![0u32; self.vc[0].len()];
        for c in &self.vc[lo..hi] {
            for (a, b) in end.iter_mut().zip(c) {
                *a = (*a).max(*b);
            }
        }
        self.records[rank]
            .iter()
            .enumerate()
            .find_map(|(buf, recs)| {
                recs.iter()
                    .find(|r| {
                        r.pc != usize::MAX && !(lo..hi).contains(&r.proc) && end[r.proc] < r.epoch
                    })
                    .map(|r| (buf, *r))
            })
    }
}
