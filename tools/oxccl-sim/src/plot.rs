//! `--plot FILE.png`: the sweep's predicted busbw against size, one curve
//! per algorithm (log-log), drawn by the repository's `tools/plot` script
//! (matplotlib, as `tools/compare-peers --plot` draws measured curves). The
//! script is built into the binary; it needs `python3`, and installs
//! Debian's python3-matplotlib with apt-get when no Python here has it.

use crate::sweep::{Row, bandwidths};
use oxccl_algo::CollKind;
use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;

/// The drawing script (`tools/plot`).
const SCRIPT: &str = include_str!("../../plot");

/// The plot's description for `tools/plot`: one series per algorithm,
/// busbw in GB/s (nccl-tests' bus factor) at each size; a size an
/// algorithm could not price is a gap.
pub fn spec(kind: CollKind, names: &[String], rows: &[Row], title: &str, caption: &str) -> Value {
    let series: Vec<Value> = names
        .iter()
        .enumerate()
        .map(|(a, name)| {
            let (xs, ys): (Vec<u64>, Vec<Option<f64>>) = rows
                .iter()
                .filter(|r| r.coll.size_bytes() > 0)
                .map(|r| {
                    let t = r.times.get(a).copied().unwrap_or(0.0);
                    let busbw = bandwidths(kind, &r.coll, t).1;
                    (r.coll.size_bytes() as u64, (busbw > 0.0 && busbw.is_finite()).then_some(busbw))
                })
                .unzip();
            json!({"label": name, "x": xs, "y": ys})
        })
        .collect();
    json!({
        "title": title, "caption": caption, "xlabel": "size", "ylabel": "predicted busbw (GB/s)",
        "xscale": "log", "yscale": "log", "xbytes": true, "series": series,
    })
}

/// Draws `spec` into `out` with the built-in script.
pub fn draw(spec: &Value, out: &Path) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("oxccl-sim-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("--plot: creating {}: {e}", dir.display()))?;
    let result = (|| {
        let (script, data) = (dir.join("plot.py"), dir.join("spec.json"));
        std::fs::write(&script, SCRIPT).map_err(|e| format!("--plot: writing {}: {e}", script.display()))?;
        std::fs::write(&data, spec.to_string()).map_err(|e| format!("--plot: writing {}: {e}", data.display()))?;
        let status = Command::new("python3")
            .arg(&script)
            .arg(&data)
            .arg(out)
            .status()
            .map_err(|e| format!("--plot needs python3 (with matplotlib, or apt-get to install it): {e}"))?;
        if !status.success() {
            return Err(format!("--plot: drawing {} failed ({status}); the script said why above", out.display()));
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl_algo::Collective;

    #[test]
    fn one_series_per_algorithm_with_busbw_and_gaps() {
        let row = |count: usize, times: Vec<f64>| Row { coll: Collective::new(CollKind::AllReduce, 4, count), times };
        // 4 ranks: busbw = algbw · 2·3/4.
        let rows = [row(0, vec![1e-6, 1e-6]), row(1 << 18, vec![1e-3, 0.0])];
        let names = ["ring".to_string(), "tree".to_string()];
        let s = spec(CollKind::AllReduce, &names, &rows, "t", "c");
        let series = s["series"].as_array().unwrap();
        assert_eq!(series.len(), 2);
        assert_eq!(series[0]["label"], "ring");
        assert_eq!(series[0]["x"], json!([1u64 << 20]), "size 0 is left out (no log position)");
        let busbw = series[0]["y"][0].as_f64().unwrap();
        assert!((busbw - (1u64 << 20) as f64 / 1e-3 / 1e9 * 1.5).abs() < 1e-9, "{busbw}");
        assert_eq!(series[1]["y"], json!([null]), "an unpriced size is a gap");
        assert_eq!(
            (s["xscale"].as_str(), s["yscale"].as_str(), s["caption"].as_str()),
            (Some("log"), Some("log"), Some("c"))
        );
    }
}
