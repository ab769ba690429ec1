//! What global rank 0 prints, and the JSON record of `-J`: nccl-tests'
//! preamble, header, rows and footer, and its JSON schema (version 2:
//! `config`, `results` with `out_of_place` / `in_place` objects,
//! `out_of_bounds`, `average_bus_bandwidth`), with JSON booleans and an
//! integer root where nccl-tests writes strings.

use crate::args::Options;
use crate::format::{self, Columns, IterStats};
use serde_json::{Map, Value, json};
use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;
use std::time::SystemTime;

/// One rank's line of the `# Using devices` list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankInfo {
    /// Global rank.
    pub rank: usize,
    /// Process id.
    pub pid: u32,
    /// Host name (up to the first dot, as nccl-tests prints it).
    pub host: String,
    /// Index of the rank on its host.
    pub device: usize,
    /// Transports to the other ranks (`mem`, `shm`, `tcp`, joined by `+`;
    /// `self` alone).
    pub transport: String,
}

impl RankInfo {
    /// The line nccl-tests prints (`#  Rank %2d Group %2d Pid %6d on %10s
    /// device %2d [bus id] name`), with `cpu` for the bus id.
    pub fn line(&self) -> String {
        format!(
            "#  Rank {:>2} Group {:>2} Pid {:>6} on {:>10} device {:>2} [cpu] host memory, {} transport",
            self.rank, 0, self.pid, self.host, self.device, self.transport
        )
    }
}

struct Json {
    path: PathBuf,
    doc: Map<String, Value>,
    results: Vec<Value>,
    row: Map<String, Value>,
}

/// Prints rank 0's output and builds the JSON record.
pub struct Reporter {
    prog: String,
    columns: Columns,
    json: Option<Json>,
    out: std::io::Stdout,
}

/// Environment variables worth recording: oxccl's, NCCL's and launchers'.
fn recorded_env() -> Vec<Value> {
    let keep = |k: &str| {
        ["OXCCL_", "NCCL_", "OMPI_COMM_WORLD_", "PMI_", "SLURM_"].iter().any(|p| k.starts_with(p))
            || ["RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"].contains(&k)
    };
    let mut v: Vec<String> = std::env::vars().filter(|(k, _)| keep(k)).map(|(k, v)| format!("{k}={v}")).collect();
    v.sort();
    v.into_iter().map(Value::String).collect()
}

/// Creates `path` without overwriting: `path`, else `path.0`, `path.1` …
/// (nccl-tests' rule).
fn create_new(path: &std::path::Path) -> std::io::Result<(PathBuf, std::fs::File)> {
    let mut candidate = path.to_path_buf();
    for i in 0.. {
        match OpenOptions::new().write(true).create_new(true).open(&candidate) {
            Ok(f) => return Ok((candidate, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && i < 1000 => {
                candidate = PathBuf::from(format!("{}.{i}", path.display()));
            }
            Err(e) => return Err(e),
        }
    }
    unreachable!("the loop returns")
}

impl Reporter {
    /// A reporter for program `prog`; with `-J`, reserves the JSON file
    /// and says where it goes. A file that cannot be created is an error
    /// (nccl-tests prints "skipping json output" and exits 0, so a script
    /// loses its results without a sign); it comes before any rank has
    /// joined, and a launcher stops the other ranks.
    pub fn new(prog: &str, opts: &Options, argv: &[String]) -> Result<Reporter, String> {
        let columns = Columns {
            cputime: opts.report_cputime,
            timestamps: opts.report_timestamps,
            per_iter: opts.per_iter_timing,
        };
        let mut r = Reporter { prog: prog.to_string(), columns, json: None, out: std::io::stdout() };
        if let Some(p) = &opts.output_file {
            let (path, _) =
                create_new(p).map_err(|e| format!("-J {}: cannot create the JSON file: {e}", p.display()))?;
            r.print(&format!("# Writing JSON output to {}\n", path.display()));
            let mut doc = Map::new();
            doc.insert("version".into(), json!(2));
            doc.insert("start_time".into(), json!(format::timestamp(SystemTime::now())));
            doc.insert("args".into(), json!(argv));
            doc.insert("env".into(), Value::Array(recorded_env()));
            doc.insert("oxccl_version".into(), json!(env!("CARGO_PKG_VERSION")));
            r.json = Some(Json { path, doc, results: Vec::new(), row: Map::new() });
        }
        Ok(r)
    }

    fn print(&mut self, s: &str) {
        // A closed stdout (a pipe whose reader left) must not stop the ranks.
        let _ = self.out.write_all(s.as_bytes());
    }

    /// The version and parameter lines and the device list; `reduced`:
    /// the maximum size memory allows, when below `-e`.
    pub fn preamble(&mut self, o: &Options, ranks: &[RankInfo], reduced: Option<usize>) {
        let (step, how) = if o.step_factor > 1 { (o.step_factor, "factor") } else { (o.step_bytes, "bytes") };
        let mut s = format!("# nccl-tests version oxccl-perf-{v} oxccl={v}\n", v = env!("CARGO_PKG_VERSION"));
        s += &format!("# Collective test starting: {}\n", self.prog);
        s += &format!(
            "# nThread {} nGpus {} minBytes {} maxBytes {} step: {step}({how}) warmup iters: {} iters: {} agg iters: {} validation: {} graph: 0 unalign: {}\n",
            o.nthreads, o.ngpus, o.min_bytes, o.max_bytes, o.warmup_iters, o.iters, o.agg_iters, o.check, o.unalign
        );
        if o.blocking == 1 {
            s += "# Blocking Enabled: wait for completion and barrier after each collective \n";
        }
        if o.blocking == 2 {
            s += "# Blocking Enabled: wait for completion after each collective (no barrier) \n";
        }
        if o.per_iter_timing {
            s += "# Per-Iteration Report: host timing; i_* uses max over ranks \n";
        }
        if o.parallel_init {
            s += "# Parallel Init Enabled: threads call into NcclInitRank concurrently \n";
        }
        s += "#\n# Using devices\n";
        for r in ranks {
            s += &r.line();
            s.push('\n');
        }
        if let Some(m) = reduced {
            s += &format!("#\n# Reducing maxBytes to {m} due to memory limitation\n");
        }
        self.print(&s);
        if let Some(j) = &mut self.json {
            let mut c = json!({
                "nthreads": o.nthreads, "ngpus": o.ngpus, "minimum_bytes": o.min_bytes,
                "maximum_bytes": o.max_bytes, "warmup_iters": o.warmup_iters, "iterations": o.iters,
                "aggregated_iterations": o.agg_iters, "validation": o.check, "graph": 0,
                "blocking_collectives": o.blocking != 0, "per_iter_timing": o.per_iter_timing,
                "parallel_init": o.parallel_init,
            });
            let key = if o.step_factor > 1 { "step_factor" } else { "step_bytes" };
            c[key] = json!(step);
            c["devices"] = ranks
                .iter()
                .map(|r| {
                    json!({"rank": r.rank, "group": 0, "pid": r.pid, "hostname": r.host, "device": r.device,
                           "device_hex": "cpu", "device_info": format!("host memory, {} transport", r.transport)})
                })
                .collect();
            j.doc.insert("config".into(), c);
        }
        let h = format::header(self.columns);
        self.print(&h);
    }

    /// Starts a row.
    pub fn row_start(&mut self, bytes: usize, count: usize, type_name: &str, op_name: &str, root: i64) {
        let s = format::row_start(bytes, count, type_name, op_name, root);
        self.print(&s);
        if let Some(j) = &mut self.json {
            j.row = json!({"size": bytes, "count": count, "type": type_name, "redop": op_name, "root": root})
                .as_object()
                .cloned()
                .expect("an object");
        }
    }

    /// One block of the row (out of place, then in place); `iters`: the
    /// per-iteration times (max over ranks) with `-I`.
    pub fn block(
        &mut self,
        in_place: bool,
        time_us: f64,
        alg: f64,
        bus: f64,
        wrong: Option<u64>,
        iters: Option<&[f64]>,
    ) {
        let mut s = format::block(time_us, alg, bus, wrong);
        let stats = iters.filter(|t| !t.is_empty()).map(IterStats::of);
        if let Some(st) = &stats {
            s += &st.columns();
        }
        if in_place && self.columns.timestamps {
            s += &format!("{:>21}", format::timestamp(SystemTime::now()));
        }
        self.print(&s);
        if let Some(j) = &mut self.json {
            let place = if in_place { "in_place" } else { "out_of_place" };
            let time_key = if self.columns.cputime { "cpu_time" } else { "time" };
            let mut b = Map::new();
            b.insert(time_key.into(), json!(time_us));
            b.insert("alg_bw".into(), json!(alg));
            b.insert("bus_bw".into(), json!(bus));
            b.insert("nwrong".into(), wrong.map_or(Value::Null, |w| json!(w)));
            j.row.insert(place.into(), Value::Object(b));
            if let (Some(st), Some(t)) = (stats, iters) {
                let us: Vec<f64> = t.iter().map(|x| x * 1e6).collect();
                j.row.insert(
                    format!("{place}_per_iter"),
                    json!({"min_us": st.min * 1e6, "max_us": st.max * 1e6, "avg_us": st.avg * 1e6,
                           "p50_us": st.p50 * 1e6, "p95_us": st.p95 * 1e6, "p99_us": st.p99 * 1e6,
                           "stdev_us": st.stdev * 1e6, "cv_pct": st.cv_pct(), "times_us": us}),
                );
            }
        }
    }

    /// Ends a row.
    pub fn row_end(&mut self, iters: usize) {
        self.print("\n");
        if let Some(j) = &mut self.json {
            let mut row = std::mem::take(&mut j.row);
            row.insert("actual_iterations".into(), json!(iters));
            row.insert("experiment_name".into(), json!(""));
            j.results.push(Value::Object(row));
        }
    }

    /// The footer; `min_bw` is nccl-tests' `NCCL_TESTS_MIN_BW`.
    pub fn footer(&mut self, errors: u64, avg_bw: f64, min_bw: Option<f64>) {
        let s = format::footer(errors, avg_bw, min_bw, &self.prog);
        self.print(&s);
        if let Some(j) = &mut self.json {
            j.doc.insert("out_of_bounds".into(), json!({"count": errors, "okay": errors == 0}));
            let okay = min_bw.map_or(json!("unchecked"), |m| json!(avg_bw >= m * 0.9));
            let bw = if avg_bw.is_finite() { json!(avg_bw) } else { json!("nan") };
            j.doc.insert("average_bus_bandwidth".into(), json!({"bandwidth": bw, "okay": okay}));
        }
    }

    /// Writes the JSON record (with `errors`, the failures of the run).
    pub fn finish(mut self, errors: &[String]) -> Result<(), String> {
        let Some(mut j) = self.json.take() else { return Ok(()) };
        j.doc.insert("results".into(), Value::Array(j.results));
        j.doc.insert("errors".into(), json!(errors));
        j.doc.insert("end_time".into(), json!(format::timestamp(SystemTime::now())));
        let text = serde_json::to_string_pretty(&Value::Object(j.doc)).expect("JSON of plain values");
        std::fs::write(&j.path, text + "\n").map_err(|e| format!("-J {}: {e}", j.path.display()))
    }
}
