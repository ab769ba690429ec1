//! The program IR for Python researchers: programs travel as the IR's JSON
//! text (what `oxccl.algo.Program` writes), and come back as dicts.

use crate::errors::IntoPy;
use oxccl::programs;
use oxccl_algo::algos::{self, Algorithm, BuildOptions};
use oxccl_algo::cost::{Link, Topology, parse_bandwidth, parse_latency};
use oxccl_algo::ir::Program;
use oxccl_algo::verify::{VerifyOptions, verify_with};
use oxccl_algo::{Collective, sim};
use pyo3::prelude::*;
use pyo3::types::PyDict;

fn program(json: &str) -> PyResult<Program> {
    Program::from_json(json).py()
}

/// Verifies a program (out of place, and in place where it claims to be
/// in-place safe): bytes each rank sends and receives, messages, steps;
/// or `oxccl.errors.InvalidProgram` naming the rank, channel and step.
#[pyfunction]
#[pyo3(signature = (json, slots=2, in_place=false))]
pub fn verify<'py>(py: Python<'py>, json: &str, slots: usize, in_place: bool) -> PyResult<Bound<'py, PyDict>> {
    let p = program(json)?;
    let r = py.detach(|| verify_with(&p, &VerifyOptions { slots, in_place })).py()?;
    let d = PyDict::new(py);
    d.set_item("sent_bytes", r.sent_bytes)?;
    d.set_item("recv_bytes", r.recv_bytes)?;
    d.set_item("messages", r.messages)?;
    d.set_item("steps", r.steps)?;
    Ok(d)
}

/// A bandwidth in bytes per second: a number, or text with units
/// (`"25GB/s"`, `"100Gbit/s"`).
fn bandwidth(v: &Bound<'_, PyAny>) -> PyResult<f64> {
    match v.extract::<String>() {
        Ok(s) => parse_bandwidth(&s).py(),
        Err(_) => v.extract(),
    }
}

/// A latency in seconds: a number, or text with units (`"2us"`).
fn latency(v: &Bound<'_, PyAny>) -> PyResult<f64> {
    match v.extract::<String>() {
        Ok(s) => parse_latency(&s).py(),
        Err(_) => v.extract(),
    }
}

/// Simulates a program on `nodes` nodes of `ranks_per_node` ranks: the
/// predicted time, each rank's finish, bytes within and between nodes,
/// messages, steps, and nccl-tests' algorithm bandwidth.
#[pyfunction]
#[pyo3(signature = (json, nodes, ranks_per_node, intra_bw, intra_lat, inter_bw, inter_lat, reduce_bw=None, copy_bw=None))]
// The arguments are the Python function's keyword arguments, one each.
#[allow(clippy::too_many_arguments)]
pub fn simulate<'py>(
    py: Python<'py>,
    json: &str,
    nodes: usize,
    ranks_per_node: usize,
    intra_bw: &Bound<'py, PyAny>,
    intra_lat: &Bound<'py, PyAny>,
    inter_bw: &Bound<'py, PyAny>,
    inter_lat: &Bound<'py, PyAny>,
    reduce_bw: Option<&Bound<'py, PyAny>>,
    copy_bw: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    let p = program(json)?;
    let intra = Link::new(bandwidth(intra_bw)?, latency(intra_lat)?);
    let inter = Link::new(bandwidth(inter_bw)?, latency(inter_lat)?);
    let mut topo = Topology::new(nodes, ranks_per_node, intra, inter);
    if let Some(b) = reduce_bw {
        topo = topo.with_reduce_bw(bandwidth(b)?);
    }
    if let Some(b) = copy_bw {
        topo = topo.with_copy_bw(bandwidth(b)?);
    }
    let r = py.detach(|| sim::simulate(&p, &topo)).py()?;
    let d = PyDict::new(py);
    d.set_item("time", r.time)?;
    d.set_item("rank_finish", r.rank_finish.clone())?;
    d.set_item("intra_bytes", r.intra_bytes)?;
    d.set_item("inter_bytes", r.inter_bytes)?;
    d.set_item("messages", r.messages)?;
    d.set_item("steps", r.steps)?;
    d.set_item("algbw_gbs", r.algbw_gbs(p.collective.size_bytes()))?;
    Ok(d)
}

/// Verifies and registers a program for this process (the same program
/// again is the same entry); its name, which `algo=` selects.
#[pyfunction]
pub fn register(json: &str) -> PyResult<String> {
    let id = programs::register(program(json)?).py()?;
    Ok(programs::name(id))
}

/// A built-in algorithm's program (`ring`, `tree`, ...) for a collective,
/// as JSON: a starting point for one's own.
#[pyfunction]
#[pyo3(signature = (algo, kind, nranks, count, dtype="float32", root=0))]
pub fn build(algo: &str, kind: &str, nranks: usize, count: usize, dtype: &str, root: usize) -> PyResult<String> {
    let a: Algorithm = algo.parse().py()?;
    let coll = Collective { kind: kind.parse().py()?, nranks, count, root, dtype: crate::ops::dtype(dtype).py()? };
    Ok(algos::build(a, &coll, &BuildOptions::default()).py()?.to_json())
}

/// A program's steps, one line each.
#[pyfunction]
pub fn listing(json: &str) -> PyResult<String> {
    Ok(program(json)?.listing())
}
