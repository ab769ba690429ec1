//! The report as a table.

use serde_json::Value;
use std::fmt::Write;

fn mb(b: f64) -> String {
    format!("{:.3} MB", b / 1e6)
}

/// The human-readable form of a report from [`crate::run`].
pub fn render(r: &Value) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# {} ranks, {} parameters ({} padded), {} params/grads, {} steps; ring all-reduce of the buckets: {} per rank",
        r["nranks"],
        r["params"],
        r["padded_params"],
        r["param_type"].as_str().unwrap_or("?"),
        r["steps"],
        mb(r["ring_all_reduce_bytes_per_rank"].as_f64().unwrap_or(0.0))
    );
    let _ = writeln!(
        s,
        "{:<6} {:>12} {:>12} {:>6} {:>12} {:>12} {:>12} {:>9} {:>9} {:>10} {:>8} {:>8}",
        "stage",
        "sent/step",
        "recv/step",
        "xDDP",
        "state/rank",
        "formula",
        "peak/rank",
        "loss[0]",
        "loss[-1]",
        "max|d|DDP",
        "same",
        "s/step"
    );
    let Some(stages) = r["stages"].as_object() else { return s };
    for (name, st) in stages {
        let first = |k: &str| st[k].as_array().and_then(|a| a.first()).and_then(Value::as_f64).unwrap_or(0.0);
        let max = |k: &str| st[k].as_array().map(|a| a.iter().filter_map(Value::as_f64).fold(0.0, f64::max));
        let loss = st["loss"].as_array().cloned().unwrap_or_default();
        let l = |i: Option<&Value>| i.and_then(Value::as_f64).map(|x| format!("{x:.5}")).unwrap_or("-".into());
        let _ = writeln!(
            s,
            "{:<6} {:>12} {:>12} {:>6} {:>12} {:>12} {:>12} {:>9} {:>9} {:>10} {:>8} {:>8.3}",
            name,
            mb(first("sent_bytes_per_step")),
            mb(first("recv_bytes_per_step")),
            st["ratio_to_ddp"].as_f64().map(|x| format!("{x:.3}")).unwrap_or("-".into()),
            mb(st["state_bytes_per_rank"].as_f64().unwrap_or(0.0)),
            mb(st["formula_state_bytes_per_rank"].as_f64().unwrap_or(0.0)),
            mb(max("peak_bytes_by_rank").unwrap_or(0.0)),
            l(loss.first()),
            l(loss.last()),
            st["max_abs_param_diff_vs_ddp"].as_f64().map(|x| format!("{x:.2e}")).unwrap_or("-".into()),
            if st["ranks_identical"].as_bool() == Some(true) { "yes" } else { "NO" },
            st["seconds_per_step"].as_f64().unwrap_or(0.0),
        );
    }
    let _ = writeln!(
        s,
        "(bytes: buckets only, per rank, counted by Communicator::stats(); the gradient norm and loss scalars are in the JSON; \
         state: what the optimizer held between steps; formula: the ZeRO paper's for the unpadded parameters; \
         same: every rank holds identical parameters)"
    );
    s
}
