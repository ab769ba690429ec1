//! What each subcommand prints: tables with `#` notes, or one JSON
//! object; `--explain` adds the formulas.

use crate::table::Table;
use oxccl_algo::algos::BuildOptions;
use oxccl_algo::cost::{Link, format_bandwidth};
use oxccl_plan::comm::{CommPlan, MAX_STEPS};
use oxccl_plan::memory::{Reserve, Stage};
use oxccl_plan::pipeline::Bubble;
use oxccl_plan::plan::{MemoryPlan, MinGpusPlan};
use oxccl_plan::units::{format_bytes, format_count, format_gb_gib, gb, gib, short};
use oxccl_plan::variants::Variant;
use serde::Serialize;
use serde_json::Value;

/// How to print.
#[derive(Clone, Copy, Debug)]
pub struct Out {
    /// One JSON object instead of tables.
    pub json: bool,
    /// Add the formulas.
    pub explain: bool,
}

impl Out {
    /// `value` as JSON (with an `"explain"` array when asked), or `text`
    /// followed by the explanation.
    fn emit(self, value: impl Serialize, text: String, explain: Vec<String>) -> String {
        if self.json {
            let mut v = serde_json::to_value(value).unwrap_or(Value::Null);
            if let (true, Value::Object(m)) = (self.explain, &mut v) {
                m.insert("explain".into(), explain.into());
            }
            return serde_json::to_string_pretty(&v).unwrap_or_default() + "\n";
        }
        if !self.explain {
            return text;
        }
        let mut t = text + "\nFormulas:\n";
        for l in explain {
            t += &format!("  {l}\n");
        }
        t
    }
}

/// The link a subcommand timed with, and whether its latency was the
/// default.
#[derive(Clone, Copy, Debug)]
pub struct LinkUsed {
    /// β and α.
    pub link: Link,
    /// `--latency` was not given: α is the default.
    pub latency_assumed: bool,
}

impl LinkUsed {
    /// `β = 25GB/s, α = 5 us`, saying when α is the default.
    fn words(&self) -> String {
        let assumed = if self.latency_assumed {
            " (assumed: the --latency default, oxccl-sim's inter-node link; give --latency to change it)"
        } else {
            ""
        };
        format!("β = {}, α = {}{assumed}", format_bandwidth(self.link.bw), time(self.link.lat))
    }

    /// The link's fields for JSON output.
    fn insert(&self, v: &mut Value) {
        if let Value::Object(m) = v {
            m.insert("bandwidth_bytes_per_s".into(), self.link.bw.into());
            m.insert("latency_s".into(), self.link.lat.into());
            m.insert("latency_assumed".into(), self.latency_assumed.into());
        }
    }
}

/// The reserve a subcommand kept free on each GPU, and whether it was
/// the default.
#[derive(Clone, Copy, Debug)]
pub struct ReserveUsed {
    /// As given, or [`Reserve::DEFAULT`].
    pub rule: Reserve,
    /// The bytes it keeps free.
    pub bytes: f64,
    /// The GPU's memory.
    pub gpu_mem: f64,
    /// `--reserve` was not given.
    pub assumed: bool,
}

impl ReserveUsed {
    /// A `# reserve:` line.
    fn line(&self) -> String {
        let why = match (self.assumed, self.bytes > 0.0) {
            (true, _) => {
                "the default, for activations, workspace, fragmentation and the CUDA context; --reserve to change it"
            }
            (false, true) => "--reserve",
            (false, false) => "--reserve: model states may fill the whole GPU",
        };
        format!("# reserve: {} kept free on each GPU ({why})\n", self.rule.describe(self.gpu_mem))
    }

    /// `reserve_rule` and `reserve_assumed` for JSON output (the bytes
    /// are the plan's `reserve`).
    fn insert(&self, v: &mut Value) {
        if let Value::Object(m) = v {
            m.insert("reserve_rule".into(), serde_json::to_value(self.rule).unwrap_or(Value::Null));
            m.insert("reserve_assumed".into(), self.assumed.into());
        }
    }
}

/// What the command line chose that the plan does not record.
#[derive(Clone, Copy, Debug, Default)]
pub struct Given {
    /// Only this stage.
    pub stage: Option<Stage>,
    /// The reserve, with a GPU size.
    pub reserve: Option<ReserveUsed>,
    /// The link, with a bandwidth.
    pub link: Option<LinkUsed>,
}

impl Given {
    /// The stages to print.
    fn stages(&self) -> Vec<Stage> {
        self.stage.map_or(Stage::ALL.to_vec(), |s| vec![s])
    }
}

/// Seconds with a unit and four significant digits: `75.15 ms`.
fn time(t: f64) -> String {
    let (v, unit) = match t {
        0.0 => (0.0, "s"),
        t if t < 1e-6 => (t * 1e9, "ns"),
        t if t < 1e-3 => (t * 1e6, "us"),
        t if t < 1.0 => (t * 1e3, "ms"),
        t => (t, "s"),
    };
    format!("{} {unit}", short(v))
}

fn variant_line(v: &Variant) -> String {
    match v {
        Variant::Zero(b) => format!(
            "variant zero: P = {} (weights) + G = {} (gradients) + O = {} (optimizer) bytes per parameter",
            short(b.param),
            short(b.grad),
            short(b.optimizer)
        ),
        Variant::Deepspeed { largest_layer } | Variant::DeepspeedLegacy { largest_layer } => {
            format!("variant {}: DeepSpeed's estimator, largest layer L = {}", v.key(), format_count(*largest_layer))
        }
        Variant::Megatron { precision } => format!("variant megatron: {}", precision.describe()),
    }
}

fn step_words(stage: Stage) -> &'static str {
    match stage {
        Stage::Ddp => "2Ψ: all-reduce grads",
        Stage::Zero1 | Stage::Zero2 => "2Ψ: reduce-scatter grads, all-gather params",
        Stage::Zero3 => "3Ψ: all-gather params ×2, reduce-scatter grads",
    }
}

/// `oxccl-plan memory`: every stage, or with `--stage` one, whose answer
/// is then flat at the top level of the JSON (as `min-gpus` does).
pub fn memory(p: &MemoryPlan, given: &Given, out: Out) -> String {
    let timed = p.stages.ddp.comm_per_step.time_s.is_some();
    let mut headers = vec!["stage", "formula", ">GB/GPU", ">GiB/GPU"];
    if p.gpu_mem.is_some() {
        headers.push("fits");
    }
    headers.extend(["step communication (ring)", ">sent/rank GB"]);
    if timed {
        headers.push(">comm time");
    }
    let mut t = Table::new(&headers);
    let mut notes = Vec::new();
    let stages = given.stages();
    for &s in &stages {
        let m = p.stages.get(s);
        let num = |v: Option<f64>| v.map_or("n/a".to_string(), short);
        let mut row = vec![s.label().to_string(), m.formula.clone().unwrap_or("—".into()), num(m.gb), num(m.gib)];
        if p.gpu_mem.is_some() {
            row.push(m.fits.map_or("n/a", |f| if f { "yes" } else { "no" }).to_string());
        }
        row.push(step_words(s).to_string());
        row.push(short(gb(m.comm_per_step.sent_per_rank)));
        if let Some(ts) = m.comm_per_step.time_s {
            row.push(time(ts));
        }
        t.row(row);
        for n in m.reason.iter().chain(&m.note) {
            notes.push(format!("# {}: {n}\n", s.label()));
        }
    }
    let mut text = format!(
        "# oxccl-plan memory: Ψ = {} parameters; N = {} data-parallel × tp {} × pp {} = {} GPUs; Ψ' = Ψ/(tp·pp) = {} per model-parallel rank\n# {}\n",
        format_count(p.params as f64),
        p.dp,
        p.tp,
        p.pp,
        p.gpus,
        format_count(p.params_per_rank),
        variant_line(&p.variant),
    );
    if let Some(m) = p.gpu_mem {
        text += &format!("# fits: model states + reserve ≤ GPU {}\n", format_gb_gib(m));
    }
    if let Some(r) = &given.reserve {
        text += &r.line();
    }
    if let Some(l) = &given.link {
        text += &format!("# comm time: ring closed forms over a link of {}\n", l.words());
    }
    text += "#\n";
    text += &t.render();
    text += &notes.concat();
    let mut ex = Vec::new();
    let (psi, n) = (p.params_per_rank, p.dp);
    ex.push(format!(
        "Ψ' = Ψ/(tp·pp) = {}/({}·{}) = {}; N = {n}; the formulas' Ψ is Ψ'",
        format_count(p.params as f64),
        p.tp,
        p.pp,
        format_count(psi)
    ));
    ex.extend(p.variant.details());
    for &s in &stages {
        let m = p.stages.get(s);
        match (&m.formula, m.bytes_per_rank) {
            (Some(f), Some(b)) => {
                ex.push(format!("{:<7} {} = {f} = {} bytes = {}", s.label(), m.symbolic, short(b), format_gb_gib(b)))
            }
            _ => ex.push(format!("{:<7} — (no formula in --variant {})", s.label(), p.variant.key())),
        }
    }
    let (pb, gb_el) = p.variant.element_bytes();
    ex.push(format!(
        "step communication (ZeRO paper §7), S = Ψ'·{} B for gradients, Ψ'·{} B for parameters:",
        short(gb_el),
        short(pb)
    ));
    ex.push("  DDP all-reduce(grads) = 2Ψ; ZeRO-1/2 reduce-scatter(grads) + all-gather(params) = 2Ψ;".into());
    ex.push("  ZeRO-3 all-gather(params) forward + backward + reduce-scatter(grads) = 3Ψ".into());
    ex.push("ring bytes sent per rank: all-reduce 2(N−1)/N·S; reduce-scatter, all-gather (N−1)/N·S".into());
    if timed {
        ex.push("comm time: ring closed forms, all-reduce 2(N−1)(α + S/(Nβ)), RS/AG (N−1)(α + S/(Nβ))".into());
    }
    ex.push(format!("source: {}", p.source));
    let mut v = serde_json::to_value(p).unwrap_or(Value::Null);
    if let Some(r) = &given.reserve {
        r.insert(&mut v);
    }
    if let Some(l) = &given.link {
        l.insert(&mut v);
    }
    if let (Some(stage), Value::Object(m)) = (given.stage, &mut v) {
        let mut all = m.remove("stages").unwrap_or(Value::Null);
        m.insert("stage".into(), stage.key().into());
        if let Some(Value::Object(one)) = all.get_mut(stage.key()).map(Value::take) {
            m.extend(one);
        }
    }
    out.emit(v, text, ex)
}

/// `oxccl-plan min-gpus`: one stage's answer flat at the top level, or
/// all four under `"stages"`.
pub fn min_gpus(p: &MinGpusPlan, given: &Given, out: Out) -> String {
    let single = given.stage.is_some();
    let mut t = Table::new(&["stage", ">min GPUs", ">dp", ">tp·pp", ">GB/GPU", ">GiB/GPU"]);
    let mut notes = Vec::new();
    for a in &p.answers {
        let opt = |v: Option<u64>| v.map_or("none".to_string(), |x| x.to_string());
        let b = a.bytes_per_rank;
        t.row(vec![
            a.stage.label().into(),
            opt(a.min_gpus),
            a.dp.map_or("-".into(), |x| x.to_string()),
            (p.tp * p.pp).to_string(),
            b.map_or("-".into(), |b| short(gb(b))),
            b.map_or("-".into(), |b| short(gib(b))),
        ]);
        if let Some(r) = &a.reason {
            notes.push(format!("# {}: no GPU count fits: {r}\n", a.stage.label()));
        }
    }
    let mut text = format!(
        "# oxccl-plan min-gpus: Ψ = {} parameters, tp {} × pp {}, GPUs of {}\n{}# {}\n# min GPUs = dp·tp·pp, the smallest dp whose model states fit\n#\n",
        format_count(p.params as f64),
        p.tp,
        p.pp,
        format_gb_gib(p.gpu_mem),
        given.reserve.map_or(String::new(), |r| r.line()),
        variant_line(&p.variant),
    );
    text += &t.render();
    text += &notes.concat();
    let mut ex = vec![
        "bytes per GPU = a·Ψ' + b·Ψ'/N + c, Ψ' = Ψ/(tp·pp), N = dp".to_string(),
        "fits when bytes + reserve ≤ GPU memory; min N = ⌈b·Ψ'/(mem − reserve − a·Ψ' − c)⌉".into(),
        "no N fits when a·Ψ' + c alone fills the GPU (a > 0: DDP, ZeRO-1, ZeRO-2); then tp·pp ≥ ⌊a·Ψ/(mem − reserve − c)⌋ + 1 would".into(),
    ];
    for a in &p.answers {
        ex.push(format!("{:<7} {}", a.stage.label(), p.variant.symbolic(a.stage)));
    }
    ex.extend(p.variant.details());
    ex.push(format!("source: {}", p.source));
    let mut v = serde_json::to_value(p).unwrap_or(Value::Null);
    if let Some(r) = &given.reserve {
        r.insert(&mut v);
    }
    if let Value::Object(m) = &mut v {
        let answers = m.remove("answers").unwrap_or(Value::Null);
        match answers {
            Value::Array(list) if single => {
                if let Some(Value::Object(one)) = list.into_iter().next() {
                    m.extend(one);
                }
            }
            Value::Array(list) => {
                let stages: serde_json::Map<String, Value> = p
                    .answers
                    .iter()
                    .zip(list)
                    .map(|(a, mut v)| {
                        if let Value::Object(o) = &mut v {
                            o.remove("stage");
                        }
                        (a.stage.key().to_string(), v)
                    })
                    .collect();
                m.insert("stages".into(), Value::Object(stages));
            }
            _ => {}
        }
    }
    out.emit(v, text, ex)
}

/// `oxccl-plan comm`.
pub fn comm(p: &CommPlan, link: &LinkUsed, opts: &BuildOptions, out: Out) -> String {
    let (n, s) = (p.ranks, p.bytes);
    let mut t = Table::new(&["collective", ">closed form", ">simulated", ">sim/closed", ">sent/rank"]);
    let c = &p.closed_form;
    let rows = [
        ("all_reduce", c.all_reduce_s, p.sent_per_rank.all_reduce),
        ("reduce_scatter", c.reduce_scatter_s, p.sent_per_rank.reduce_scatter),
        ("all_gather", c.all_gather_s, p.sent_per_rank.all_gather),
    ];
    for (i, (name, closed, sent)) in rows.into_iter().enumerate() {
        let (sim, ratio) = match (&p.simulated, &p.sim_over_closed) {
            (Some(sim), Some(r)) => {
                let pick = |t: &oxccl_plan::comm::RingTimes| [t.all_reduce_s, t.reduce_scatter_s, t.all_gather_s][i];
                let ratio = pick(r);
                (time(pick(&sim.times)), if ratio.is_finite() { format!("{ratio:.3}") } else { "-".into() })
            }
            _ => ("-".into(), "-".into()),
        };
        t.row(vec![name.into(), time(closed), sim, ratio, format_bytes(sent)]);
    }
    let reduce = p.reduce_bw_bytes_per_s.map_or("reductions free".to_string(), |r| {
        format!("reductions at {} (γ = 1/{})", format_bandwidth(r), format_bandwidth(r))
    });
    let mut text = format!(
        "# oxccl-plan comm: ring collectives of S = {} on N = {n} ranks; link {}; {reduce}\n",
        format_gb_gib(s as f64),
        link.words(),
    );
    text += "# closed form: the textbook ring, all-reduce 2(N−1)(α + S/(Nβ)), reduce-scatter and all-gather (N−1)(α + S/(Nβ))\n";
    match (&p.simulated, &p.simulation_skipped) {
        (Some(sim), _) => {
            let capped = sim.chunks_capped_from.map_or(String::new(), |k| {
                format!(", down from oxccl-sim's {k} to bound the simulation at {MAX_STEPS} steps")
            });
            text += &format!(
                "# simulated: oxccl_algo::sim on the ring programs oxccl-sim builds (k = {} pipeline chunk{} per block of at most {} bytes{capped});\n#   {}\n",
                sim.chunks,
                if sim.chunks == 1 { "" } else { "s" },
                opts.chunk_bytes,
                sim.topology
            );
            text += "#   every chunk pays α per hop: all-reduce ≈ 2(N−1)(k·α + S/(Nβ)) with k chunks\n";
            if sim.rs_ag_bytes != s {
                text += &format!(
                    "#   reduce-scatter and all-gather simulated at {} bytes (S rounded down to N one-byte blocks)\n",
                    sim.rs_ag_bytes
                );
            }
        }
        (None, Some(why)) => text += &format!("# simulated: skipped: {why}\n"),
        (None, None) => {}
    }
    text += "#\n";
    text += &t.render();
    let ex = vec![
        "α = latency per message, β = bandwidth (bytes/s), S = the whole buffer, N = ranks".to_string(),
        "all-reduce      2(N−1)·(α + S/(N·β))  [+ (N−1)/N·S·γ with --reduce-bw]".into(),
        "reduce-scatter  (N−1)·(α + S/(N·β))   [+ (N−1)/N·S·γ with --reduce-bw]".into(),
        "all-gather      (N−1)·(α + S/(N·β))".into(),
        "bytes sent per rank: all-reduce 2(N−1)/N·S, reduce-scatter and all-gather (N−1)/N·S".into(),
        "closed forms: oxccl_algo::cost::{ring_all_reduce, ring_reduce_scatter, ring_all_gather}".into(),
        "simulation: oxccl_algo::algos::build(Ring) + oxccl_algo::sim::simulate on Topology::one_rank_per_node(N, link)"
            .into(),
    ];
    let mut v = serde_json::to_value(p).unwrap_or(Value::Null);
    if let Value::Object(m) = &mut v {
        m.insert("latency_assumed".into(), link.latency_assumed.into());
    }
    out.emit(v, text, ex)
}

/// `oxccl-plan bubble`.
pub fn bubble(b: &Bubble, out: Out) -> String {
    let (p, m, v) = (b.stages, b.microbatches, b.interleave);
    let mut text =
        format!("# oxccl-plan bubble: p = {p} pipeline stages, m = {m} micro-batches, v = {v} chunks per stage\n#\n");
    let mut t = Table::new(&["quantity", ">value", "formula"]);
    let vm = if v == 1 { "m".to_string() } else { "v·m".to_string() };
    t.row(vec![
        "bubble fraction of the step".into(),
        format!("{:.4}", b.bubble_fraction),
        format!("(p−1)/({vm}+p−1) = {}/{}", p - 1, v * m + p - 1),
    ]);
    t.row(vec![
        "bubble over ideal compute".into(),
        format!("{:.4}", b.bubble_over_ideal),
        format!("(p−1)/{vm} = {}/{}", p - 1, v * m),
    ]);
    t.row(vec![
        "pipeline efficiency".into(),
        format!("{:.4}", b.efficiency),
        format!("{vm}/({vm}+p−1) = {}/{}", v * m, v * m + p - 1),
    ]);
    text += &t.render();
    let ex = vec![
        "a step is m + p − 1 micro-batch slots per stage, p − 1 of them idle (GPipe and 1F1B alike)".to_string(),
        "bubble fraction = (p−1)/(m+p−1); over ideal time (p−1)/m".into(),
        "interleaved (Megatron-LM, v chunks per stage; Narayanan et al. SC'21 §2.2): (p−1)/(v·m) of ideal".into(),
    ];
    out.emit(b, text, ex)
}
