//! Running a sweep of (size, algorithm) simulations on worker threads, and
//! printing the results in nccl-tests' columns.

use oxccl_algo::Program;
use oxccl_algo::algos::{Algorithm, BuildOptions, build_into_on, build_on};
use oxccl_algo::cost::Topology;
use oxccl_algo::ir::Step;
use oxccl_algo::placement::Placement;
use oxccl_algo::sim::{Bound, Simulator};
use oxccl_algo::{CollKind, Collective};
use oxccl_core::ReduceOp;
use std::sync::{Condvar, Mutex};
use std::time::Instant;

/// The sizes of a sweep, as nccl-tests steps them: from `min` to `max`
/// multiplying by `factor`, or adding `step` when given.
pub fn sizes(min: u64, max: u64, factor: u64, step: Option<u64>) -> Result<Vec<u64>, String> {
    if min > max {
        return Err(format!("-b {min} is larger than -e {max}"));
    }
    match step {
        Some(0) => return Err("-i must be at least 1 byte".into()),
        None if factor < 2 && min != max => return Err("-f must be at least 2 (or give -i)".into()),
        _ => {}
    }
    let mut out = vec![min];
    loop {
        let last = *out.last().unwrap_or(&min);
        let next = match step {
            Some(s) => last.checked_add(s),
            None if last == 0 => Some(1),
            None => last.checked_mul(factor),
        };
        match next {
            Some(n) if n <= max && n > last => out.push(n),
            _ => break,
        }
        if out.len() > 10_000 {
            return Err("the sweep has more than 10000 sizes; raise -f or -i".into());
        }
    }
    Ok(out)
}

/// A rough count of the steps `algo`'s program for `coll` has: schedules
/// the biggest first and keeps their sum within memory.
fn estimate_steps(algo: Algorithm, coll: &Collective, opts: &BuildOptions) -> u64 {
    let (n, c) = (coll.nranks as u64, coll.count as u64);
    let chunks = |len: u64| opts.chunking(len as usize, coll.dtype.size()) as u64;
    let log = u64::from(n.max(1).next_power_of_two().trailing_zeros()) + 1;
    match (algo, coll.kind) {
        (Algorithm::Ring, CollKind::AllReduce) => 2 * n * c.min(n) * chunks(c / n.max(1)) + n,
        (Algorithm::Ring, _) => 2 * n * n * chunks(c) + n,
        (Algorithm::Tree, _) => 8 * n * chunks(c / 2) + n,
        (Algorithm::Rhd, _) => 4 * n * log,
        (Algorithm::Doubling, _) => 2 * n * log + 4 * n,
        _ => 4 * n * n,
    }
}

/// `algo`'s program for `coll` on `placement` cut into `channels` parts
/// (`oxccl_algo::channels::build`), or on one channel where it cannot be
/// cut, with the reason (as the library does under `OXCCL_NCHANNELS`).
pub fn build(
    algo: Algorithm,
    coll: &Collective,
    opts: &BuildOptions,
    placement: &Placement,
    channels: usize,
) -> oxccl_core::Result<(Program, Option<String>)> {
    if channels <= 1 {
        return build_on(algo, coll, opts, placement).map(|p| (p, None));
    }
    match oxccl_algo::channels::build(algo, coll, opts, placement, channels) {
        Ok(p) => Ok((p, None)),
        Err(e) => build_on(algo, coll, opts, placement).map(|p| (p, Some(crate::plain(&e)))),
    }
}

/// Bytes of memory one step costs while simulated: the program's step and
/// the simulator's 12-byte compiled step, with slack.
const BYTES_PER_STEP: u64 = std::mem::size_of::<Step>() as u64 + 16;

/// One simulation to run: (size index, algorithm index, bytes it may use).
type Job = (usize, usize, u64);

/// What the workers share: the jobs not yet started, the bytes the running
/// ones hold, and whether one failed.
struct Pending {
    jobs: Vec<Job>,
    used: u64,
    failed: bool,
}

/// The jobs not yet started and the memory the running ones hold: a
/// worker takes the biggest pending job that fits in the budget next to
/// the running ones (any job when nothing runs), or waits for memory.
struct Pool {
    state: Mutex<Pending>,
    freed: Condvar,
    budget: u64,
}

impl Pool {
    /// The next job (size, algorithm, bytes), or `None` when all are
    /// taken or one failed.
    fn take(&self) -> Option<Job> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if st.failed || st.jobs.is_empty() {
                return None;
            }
            let used = st.used;
            let fits = |&(_, _, bytes): &Job| used == 0 || used + bytes <= self.budget;
            if let Some(j) = st.jobs.iter().position(fits) {
                let job = st.jobs.remove(j);
                st.used += job.2;
                return Some(job);
            }
            st = self.freed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn release(&self, bytes: u64, failed: bool) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.used -= bytes;
        st.failed |= failed;
        self.freed.notify_all();
    }
}

/// Memory the sweep may use: 4/5 of what the system has available (Linux
/// `MemAvailable`), 8 GiB where that cannot be read.
fn memory_budget() -> u64 {
    let avail = std::fs::read_to_string("/proc/meminfo").ok().and_then(|text| {
        let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    });
    avail.map_or(8 << 30, |b| b / 5 * 4)
}

/// What one simulation found: seconds, what bounds them, and why the
/// program runs on one channel where more were asked for and it could
/// not be split.
pub type Priced = (f64, Bound, Option<String>);

/// Simulates every collective with every algorithm on `threads` threads;
/// returns the times in seconds and what bounds each, `[size][algorithm]`. Programs are built
/// on `placement` (the topology's shape, numbered blocked or cyclically),
/// cut into `channels` parts where they can be ([`build`]), and priced on
/// the links its ranks take.
// What to price (collectives, algorithms, options), where (topology,
// placement, channels) and how (threads, verbosity): each a command-line
// option of its own, passed as given.
#[allow(clippy::too_many_arguments)]
pub fn run(
    colls: &[Collective],
    algos: &[Algorithm],
    opts: &BuildOptions,
    topo: &Topology,
    placement: &Placement,
    channels: usize,
    threads: usize,
    verbose: bool,
) -> Result<Vec<Vec<Priced>>, String> {
    // A part's chunks are smaller, but there are `channels` of them.
    let steps = |a: usize, i: usize| estimate_steps(algos[a], &colls[i], opts).saturating_mul(channels.max(1) as u64);
    let mut jobs: Vec<Job> = (0..colls.len())
        .flat_map(|i| (0..algos.len()).map(move |a| (i, a)))
        .map(|(i, a)| (i, a, steps(a, i).saturating_mul(BYTES_PER_STEP)))
        .collect();
    jobs.sort_by_key(|&(i, a, bytes)| (std::cmp::Reverse(bytes), i, a));
    let workers = threads.min(jobs.len());
    let pool = Pool {
        state: Mutex::new(Pending { jobs, used: 0, failed: false }),
        freed: Condvar::new(),
        budget: memory_budget(),
    };
    // The topology numbers ranks blocked: rename the placement's ranks so.
    let new = placement.blocked_number();
    let relabel = new.iter().enumerate().any(|(r, &b)| r != b).then_some(new);
    type Cell = Option<Result<Priced, String>>;
    let results: Mutex<Vec<Vec<Cell>>> = Mutex::new(vec![vec![None; algos.len()]; colls.len()]);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                let mut sim = Simulator::new();
                // One program per worker, rebuilt in place: a 4096-rank ring
                // is gigabytes of steps, and fresh pages cost more than the
                // steps themselves.
                let mut prog = Program::new("", colls[0]);
                while let Some((i, a, bytes)) = pool.take() {
                    let t0 = Instant::now();
                    let mut single = None;
                    let built = match channels {
                        0 | 1 => build_into_on(algos[a], &colls[i], opts, placement, &mut prog),
                        _ => build(algos[a], &colls[i], opts, placement, channels).map(|(p, why)| {
                            (prog, single) = (p, why);
                        }),
                    };
                    let out = built.and_then(|()| {
                        let t1 = Instant::now();
                        let r = match relabel.as_deref() {
                            None => sim.simulate(&prog, topo),
                            Some(new) => sim.simulate(&prog.relabeled(new), topo),
                        };
                        if verbose {
                            let steps = r.as_ref().map_or(0, |r| r.steps);
                            eprintln!(
                                "# {:>8} {:>12} B: {steps:>10} steps, build {:.2}s, simulate {:.2}s",
                                algos[a].name(),
                                colls[i].size_bytes(),
                                (t1 - t0).as_secs_f64(),
                                t1.elapsed().as_secs_f64()
                            );
                        }
                        r
                    });
                    let out = out
                        .map(|r| (r.time, r.bound(), single))
                        .map_err(|e| format!("{} of {} bytes: {e}", algos[a], colls[i].size_bytes()));
                    if bytes > 4 << 30 {
                        // Give back the buffers a huge program grew.
                        sim = Simulator::new();
                        prog = Program::new("", colls[0]);
                    }
                    let failed = out.is_err();
                    results.lock().unwrap_or_else(|e| e.into_inner())[i][a] = Some(out);
                    pool.release(bytes, failed);
                }
            });
        }
    });
    let results = results.into_inner().unwrap_or_else(|e| e.into_inner());
    let mut out = Vec::with_capacity(colls.len());
    for row in results {
        let mut times = Vec::with_capacity(algos.len());
        for cell in row {
            match cell {
                Some(Ok(t)) => times.push(t),
                Some(Err(e)) => return Err(e),
                None => return Err("a simulation did not run (an earlier one failed)".into()),
            }
        }
        out.push(times);
    }
    Ok(out)
}

/// nccl-tests' number format: `digits` wide, as many decimals as fit.
pub fn float_str(value: f64, digits: usize) -> String {
    let mut power = 0;
    let mut v = 1.0;
    while value >= v && power < 400 {
        v *= 10.0;
        power += 1;
    }
    if power + 2 < digits {
        format!("{value:>digits$.2}")
    } else if power + 1 < digits {
        format!("{value:>digits$.1}")
    } else if power < digits + 1 {
        format!("{value:>digits$.0}")
    } else {
        format!("{value:>digits$.1e}")
    }
}

/// One line of the table: a collective and each algorithm's time.
pub struct Row {
    /// What was priced.
    pub coll: Collective,
    /// Seconds, one per algorithm.
    pub times: Vec<f64>,
}

/// The printed table: nccl-tests' leading columns, then `time algbw busbw`
/// per algorithm and the name of the fastest.
pub struct Table {
    kind: CollKind,
    op: ReduceOp,
    names: Vec<String>,
    busbw_sum: Vec<f64>,
    best_sum: f64,
    rows: usize,
}

/// nccl-tests' algbw and busbw in GB/s of `c` taking `t` seconds (0 for
/// a time that is not positive).
pub fn bandwidths(kind: CollKind, c: &Collective, t: f64) -> (f64, f64) {
    let algbw = if t > 0.0 { c.size_bytes() as f64 / t / 1e9 } else { 0.0 };
    (algbw, algbw * kind.busbw_factor(c.nranks))
}

impl Table {
    /// A table for `kind` comparing `names`.
    pub fn new(kind: CollKind, op: ReduceOp, names: Vec<String>) -> Table {
        let k = names.len();
        Table { kind, op, names, busbw_sum: vec![0.0; k], best_sum: 0.0, rows: 0 }
    }

    /// Prints the three header lines.
    pub fn print_header(&self) {
        let mut l1 = format!("#{:>51}", "");
        let mut l2 = "#       size         count      type   redop    root".to_string();
        let mut l3 = format!("#        (B)    (elements){:>27}", "");
        for name in &self.names {
            l1.push_str(&format!("  {name:>23}"));
            l2.push_str("     time   algbw   busbw");
            l3.push_str("     (us)  (GB/s)  (GB/s)");
        }
        l2.push_str("  best");
        println!("{l1}");
        println!("{l2}");
        println!("{l3}");
    }

    /// nccl-tests' leading columns: size, count, type, redop, root.
    fn lead(&self, c: &Collective) -> String {
        let root = if self.kind.is_rooted() { c.root as i64 } else { -1 };
        let op = if self.kind.reduces() { self.op.name() } else { "none" };
        format!("{:>12}  {:>12}  {:>8}  {op:>6}  {root:>6}", c.size_bytes(), c.count, c.dtype.name())
    }

    /// Prints, in place of a row, a `#` line with the leading columns and
    /// why the size was not priced (parsers of nccl-tests' output skip it).
    pub fn print_skipped(&self, c: &Collective, why: &str) {
        let lead = self.lead(c);
        println!("#{}  cannot run: {why}", lead.strip_prefix(' ').unwrap_or(&lead));
    }

    /// Prints one row and accumulates the averages.
    pub fn print_row(&mut self, row: &Row) {
        let c = &row.coll;
        let mut line = self.lead(c);
        let mut best: Option<(usize, f64)> = None;
        for (a, &t) in row.times.iter().enumerate() {
            let (algbw, busbw) = bandwidths(self.kind, c, t);
            self.busbw_sum[a] += busbw;
            line.push_str(&format!("  {}  {algbw:>6.2}  {busbw:>6.2}", float_str(t * 1e6, 7)));
            if best.is_none_or(|(_, bt)| t < bt) {
                best = Some((a, t));
            }
        }
        if let Some((a, t)) = best {
            self.best_sum += bandwidths(self.kind, c, t).1;
            line.push_str(&format!("  {}", self.names[a]));
        }
        self.rows += 1;
        println!("{line}");
    }

    /// Prints nccl-tests' closing lines: the average bus bandwidth of each
    /// algorithm and of the best one per size.
    pub fn print_footer(&self) {
        let rows = self.rows.max(1) as f64;
        for (name, sum) in self.names.iter().zip(&self.busbw_sum) {
            println!("# Avg bus bandwidth    : {:.4} ({name})", sum / rows);
        }
        if self.names.len() > 1 {
            println!("# Avg bus bandwidth    : {:.4} (best per size)", self.best_sum / rows);
        }
        println!("#");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_step_like_nccl_tests() {
        assert_eq!(sizes(8, 64, 2, None).unwrap(), vec![8, 16, 32, 64]);
        assert_eq!(sizes(8, 100, 2, None).unwrap(), vec![8, 16, 32, 64]);
        assert_eq!(sizes(0, 4, 2, None).unwrap(), vec![0, 1, 2, 4]);
        assert_eq!(sizes(10, 30, 2, Some(10)).unwrap(), vec![10, 20, 30]);
        assert_eq!(sizes(32, 32, 1, None).unwrap(), vec![32]);
        assert!(sizes(64, 8, 2, None).is_err());
        assert!(sizes(8, 64, 1, None).is_err());
        assert_eq!(sizes(8, 8 << 30, 2, None).unwrap().len(), 31);
    }

    #[test]
    fn floats_fit_seven_columns_like_nccl_tests() {
        assert_eq!(float_str(13.984, 7), "  13.98");
        assert_eq!(float_str(123456.7, 7), " 123457");
        assert_eq!(float_str(12345.67, 7), "12345.7");
        assert_eq!(float_str(0.0, 7), "   0.00");
        assert_eq!(float_str(123456789.0, 7), "  1.2e8");
    }
}
