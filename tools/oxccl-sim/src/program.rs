//! `--program FILE.json`: a hand-written (or emitted) program, priced at
//! its own count in one row, or instantiated at every size of a sweep.

use crate::sweep::{Row, Table};
use crate::{Args, count_of, plain, topology};
use oxccl_algo::cost::Topology;
use oxccl_algo::sim::{Simulator, simulate};
use oxccl_algo::verify::verify;
use oxccl_algo::{Collective, Program, scale};
use std::path::Path;

/// Reads, checks, verifies and prices the program at `path`.
pub fn run(args: &Args, path: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let program = Program::from_json(&text).map_err(|e| format!("{}: {}", path.display(), plain(&e)))?;
    let coll = program.collective;
    if let Some(kind) = args.collective.filter(|&k| k != coll.kind) {
        return Err(format!("{} is a {} program, not {kind}", path.display(), coll.kind));
    }
    let n = program.ranks.len();
    if n == 0 {
        return Err(format!("{} has no ranks", path.display()));
    }
    let (nodes, rpn) = match (args.nodes, args.ranks_per_node) {
        (Some(a), Some(b)) => (a, b),
        (Some(a), None) if a > 0 && n % a == 0 => (a, n / a),
        (None, Some(b)) if b > 0 && n % b == 0 => (n / b, b),
        (None, None) => (1, n),
        (a, b) => {
            return Err(format!(
                "{} has {n} ranks, which {} nodes × {} ranks per node do not place",
                path.display(),
                a.map_or("?".into(), |a| a.to_string()),
                b.map_or("?".into(), |b| b.to_string())
            ));
        }
    };
    if args.sweeps() {
        let topo = topology(args, nodes, rpn)?;
        return sweep(args, path, &program, &topo);
    }
    if !args.no_verify {
        print_verified(path, &program)?;
    }
    let topo = topology(args, nodes, rpn)?;
    let report =
        simulate(&args.placed(&topo, &program), &topo).map_err(|e| format!("{}: {}", path.display(), plain(&e)))?;
    println!("# oxccl-sim: program {:?} ({}), {} ranks on {topo}", program.name, path.display(), n);
    let fin = &report.rank_finish;
    let first = fin.iter().copied().fold(f64::INFINITY, f64::min);
    println!(
        "# {} steps, {} messages, {} bytes within nodes, {} bytes between nodes; ranks finish between {:.3} and {:.3} us",
        report.steps,
        report.messages,
        report.intra_bytes,
        report.inter_bytes,
        first * 1e6,
        report.time * 1e6
    );
    println!("#");
    let mut table = Table::new(coll.kind, args.op, vec![program.name.clone()]);
    table.print_header();
    table.print_row(&Row { coll, times: vec![report.time] });
    table.print_footer();
    Ok(())
}

/// Verifies `program` (in place too where it claims so) and prints what
/// it proved, or says what is wrong.
fn print_verified(path: &Path, program: &Program) -> Result<(), String> {
    let coll = program.collective;
    let v = verify(program).map_err(|e| {
        format!("{}: not a correct {} program at count {}: {}", path.display(), coll.kind, coll.count, plain(&e))
    })?;
    let in_place = if program.in_place { " and in place" } else { "" };
    println!(
        "# verified: computes {coll} out of place{in_place}; bytes sent per rank: max {}, total {}",
        v.max_sent(),
        v.total_sent()
    );
    if coll.kind.reduces() {
        match &v.departure {
            None => println!("# order: canonical (runs under OXCCL_DETERMINISTIC=1)"),
            Some(d) => println!("# order: not canonical (refused under OXCCL_DETERMINISTIC=1): {d}"),
        }
    }
    Ok(())
}

/// The program instantiated at every size of the sweep, each verified
/// (unless `--no-verify`) and priced; a size the program cannot run at
/// gets a `#` line saying why.
fn sweep(args: &Args, path: &Path, program: &Program, topo: &Topology) -> Result<(), String> {
    let coll = program.collective;
    let sizes = args.sizes()?;
    let aligned = scale::check_aligned(program);
    println!(
        "# oxccl-sim: program {:?} ({}), written for count {}, {} ranks on {topo}",
        program.name,
        path.display(),
        coll.count,
        coll.nranks
    );
    match &aligned {
        Ok(()) => println!("# index-aligned: instantiated at each size's count by oxccl_algo::scale"),
        Err(e) => println!(
            "# not index-aligned, so it runs only at multiples of count {}: {}",
            coll.count,
            plain(e).trim_start_matches(&format!("{}: ", program.name))
        ),
    }
    let mut sim = Simulator::new();
    let mut rows: Vec<(Collective, Result<f64, String>)> = Vec::with_capacity(sizes.len());
    for size in sizes {
        let count = count_of(coll.kind, coll.nranks, coll.dtype, size);
        let target = Collective { count, ..coll };
        let p = match scale::instantiate(program, count) {
            Ok(p) => p,
            Err(_) if aligned.is_err() && coll.count > 0 && !count.is_multiple_of(coll.count) => {
                let why = format!("not index-aligned, it runs only at multiples of count {}", coll.count);
                rows.push((target, Err(why)));
                continue;
            }
            Err(e) => {
                rows.push((target, Err(plain(&e))));
                continue;
            }
        };
        if !args.no_verify {
            print_verified(path, &p)?;
        }
        let r = sim
            .simulate(&args.placed(topo, &p), topo)
            .map_err(|e| format!("{} at count {count}: {}", path.display(), plain(&e)))?;
        rows.push((target, Ok(r.time)));
    }
    println!("#");
    let mut table = Table::new(coll.kind, args.op, vec![program.name.clone()]);
    table.print_header();
    let skipped = rows.iter().filter(|(_, r)| r.is_err()).count();
    for (c, r) in &rows {
        match r {
            Ok(t) => table.print_row(&Row { coll: *c, times: vec![*t] }),
            Err(why) => table.print_skipped(c, why),
        }
    }
    table.print_footer();
    if let Some(out) = &args.plot {
        let priced: Vec<Row> =
            rows.iter().filter_map(|(c, r)| r.as_ref().ok().map(|t| Row { coll: *c, times: vec![*t] })).collect();
        let title = format!("{}: {}, {} ranks, predicted busbw\n{topo}", program.name, coll.kind, coll.nranks);
        let spec =
            crate::plot::spec(coll.kind, std::slice::from_ref(&program.name), &priced, &title, &crate::caption());
        crate::plot::draw(&spec, out)?;
        eprintln!("oxccl-sim: wrote {}", out.display());
    }
    if skipped > 0 {
        eprintln!(
            "oxccl-sim: {} cannot run at {skipped} of {} sizes (see the '#' lines in their place)",
            path.display(),
            rows.len()
        );
    }
    Ok(())
}
