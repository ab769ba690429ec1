//! nccl-tests' text output, character for character: its printf formats
//! (`src/util.cu`), its float-fitting helper (`getFloatStr`) and C's `%g`
//! and `%e`.

use std::time::{SystemTime, UNIX_EPOCH};

/// C's `%*.{prec}e`: mantissa, `e`, sign, at least two exponent digits.
pub fn c_exp(value: f64, prec: usize, width: usize) -> String {
    let s = format!("{value:.prec$e}");
    let s = match s.split_once('e') {
        Some((m, e)) => {
            let e: i32 = e.parse().expect("Rust's exponent is an integer");
            format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.unsigned_abs())
        }
        None => s,
    };
    format!("{s:>width$}")
}

fn special(value: f64) -> Option<&'static str> {
    match value {
        v if v.is_nan() => Some("nan"),
        v if v == f64::INFINITY => Some("inf"),
        v if v == f64::NEG_INFINITY => Some("-inf"),
        _ => None,
    }
}

/// C's `%g` (six significant digits, trailing zeros removed, exponent
/// form below 1e-4 and from 1e6).
pub fn c_g(value: f64) -> String {
    if let Some(s) = special(value) {
        return s.to_string();
    }
    if value == 0.0 {
        return if value.is_sign_negative() { "-0" } else { "0" }.to_string();
    }
    const P: i32 = 6;
    let sci = format!("{value:.*e}", (P - 1) as usize);
    let exp: i32 = sci.split_once('e').map(|(_, e)| e.parse().expect("exponent")).expect("an exponent");
    let trim = |s: &str| -> String {
        if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s.to_string() }
    };
    if !(-4..P).contains(&exp) {
        let (m, _) = sci.split_once('e').expect("an exponent");
        format!("{}e{}{:02}", trim(m), if exp < 0 { '-' } else { '+' }, exp.unsigned_abs())
    } else {
        trim(&format!("{value:.*}", (P - 1 - exp) as usize))
    }
}

/// nccl-tests' `getFloatStr`: `value` in `width` columns, with as many
/// decimals as fit (2, 1, 0), else in exponent form.
pub fn fit(value: f64, width: usize) -> String {
    if let Some(s) = special(value) {
        return format!("{s:>width$}");
    }
    let mut power = 0;
    let mut val = 1.0f64;
    while value >= val && power < 400 {
        power += 1;
        val *= 10.0;
    }
    if power + 2 < width {
        format!("{value:>width$.2}")
    } else if power + 1 < width {
        format!("{value:>width$.1}")
    } else if power < width + 1 {
        format!("{value:>width$.0}")
    } else if width >= 7 {
        c_exp(value, 1, width)
    } else {
        c_exp(value, 0, width)
    }
}

/// `YYYY-MM-DD HH:MM:SS` in UTC (nccl-tests uses local time; std has no
/// time zones).
pub fn timestamp(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Which optional columns a run prints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Columns {
    /// `-C 1`: the time column is `cputime`.
    pub cputime: bool,
    /// `-S 1`: a timestamp ends each row.
    pub timestamps: bool,
    /// `-I 1`: per-iteration columns after each block.
    pub per_iter: bool,
}

/// The header: `#`, then the block titles, the column names and units.
pub fn header(c: Columns) -> String {
    let t = if c.cputime { "cputime" } else { "time" };
    let (pad, lbl, fmt) = if c.timestamps { (19, "timestamp", "%Y-%m-%d %H:%M:%S") } else { (0, "", "") };
    let lead = |a: &str, b: &str| format!("# {a:>10}  {b:>12}  {:>8}  {:>6}  {:>6}", "", "", "");
    let (title, names, units) = if c.per_iter {
        (
            "              out-of-place (+ per-iteration)                                in-place (+ per-iteration)\n",
            format!(
                "  {t:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>7}  {:>7}  {:>7}",
                "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99", "i_cv%"
            ),
            format!(
                "  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>7}  {:>7}  {:>7}",
                "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)", "(%)"
            ),
        )
    } else {
        (
            "           out-of-place                       in-place          \n",
            format!("  {t:>7}  {:>6}  {:>6}  {:>6}", "algbw", "busbw", "#wrong"),
            format!("  {:>7}  {:>6}  {:>6}  {:>6}", "(us)", "(GB/s)", "(GB/s)", ""),
        )
    };
    let mut s = String::from("#\n");
    s += &lead("", "");
    s += title;
    s += &format!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}{names}{names} {lbl:>pad$}\n",
        "size", "count", "type", "redop", "root"
    );
    s += &format!("# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}{units}{units} {fmt:>pad$}\n", "(B)", "(elements)", "", "", "");
    s
}

/// The start of a row: size, count, type, redop, root.
pub fn row_start(bytes: usize, count: usize, type_name: &str, op_name: &str, root: i64) -> String {
    format!("{bytes:>12}  {count:>12}  {type_name:>8}  {op_name:>6}  {root:>6}")
}

/// One block of a row: time (µs), algbw, busbw, #wrong (`None`: N/A, no
/// check).
pub fn block(time_us: f64, algbw: f64, busbw: f64, wrong: Option<u64>) -> String {
    let (t, a, b) = (fit(time_us, 7), fit(algbw, 6), fit(busbw, 6));
    match wrong {
        Some(w) => format!("  {t:>7}  {a:>6}  {b:>6}  {:>6}", c_g(w as f64)),
        None => format!("  {t:>7}  {a:>6}  {b:>6}    N/A"),
    }
}

/// Per-iteration statistics of one block (`-I`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct IterStats {
    /// Fastest iteration, seconds.
    pub min: f64,
    /// Slowest iteration, seconds.
    pub max: f64,
    /// Mean, seconds.
    pub avg: f64,
    /// Median, seconds.
    pub p50: f64,
    /// 95th percentile (nearest rank), seconds.
    pub p95: f64,
    /// 99th percentile (nearest rank), seconds.
    pub p99: f64,
    /// Standard deviation, seconds.
    pub stdev: f64,
}

impl IterStats {
    /// Statistics of `times` (seconds; not empty), as nccl-tests computes them.
    pub fn of(times: &[f64]) -> IterStats {
        let mut s = times.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let pct = |p: usize| s[((n * p).div_ceil(100)).saturating_sub(1).min(n - 1)];
        let avg = s.iter().sum::<f64>() / n as f64;
        let var = s.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / n as f64;
        IterStats { min: s[0], max: s[n - 1], avg, p50: s[n / 2], p95: pct(95), p99: pct(99), stdev: var.sqrt() }
    }

    /// Coefficient of variation in percent.
    pub fn cv_pct(&self) -> f64 {
        if self.avg > 0.0 { self.stdev / self.avg * 100.0 } else { 0.0 }
    }

    /// The four columns: i_min, i_max, i_p99 (µs), i_cv%.
    pub fn columns(&self) -> String {
        let f = |v: f64| fit(v, 7);
        format!(
            "  {:>7}  {:>7}  {:>7}  {:>7}",
            f(self.min * 1e6),
            f(self.max * 1e6),
            f(self.p99 * 1e6),
            f(self.cv_pct())
        )
    }
}

/// The footer: out-of-bounds count, average bus bandwidth (with the
/// verdict against `min_bw`, nccl-tests' `NCCL_TESTS_MIN_BW`), the end
/// line.
pub fn footer(errors: u64, avg_bw: f64, min_bw: Option<f64>, prog: &str) -> String {
    let verdict = match min_bw {
        None => "",
        Some(m) if avg_bw < m * 0.9 => "FAILED",
        Some(_) => "OK",
    };
    let ok = if errors > 0 { "FAILED" } else { "OK" };
    format!(
        "# {:<20} : {errors} {ok}\n# {:<20} : {} {verdict}\n#\n# Collective test concluded: {prog}\n#\n\n",
        "Out of bounds values",
        "Avg bus bandwidth",
        c_g(avg_bw)
    )
}

#[cfg(test)]
mod tests;
