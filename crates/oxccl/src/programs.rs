//! Researchers' programs as algorithms: a JSON [`Program`] (the IR of
//! oxccl-algo) registered under its name runs on real ranks like a
//! built-in algorithm, on every transport.
//!
//! ```no_run
//! # fn main() -> oxccl::Result<()> {
//! // Load and verify (or: OXCCL_ALGO_FILE=hand.json in the environment).
//! let ids = oxccl::programs::load("hand.json")?;
//! let config = oxccl::Config { programs: ids, algo: Some("hand".into()), ..Default::default() };
//! let comms = oxccl::Communicator::init_threads_with(2, config)?;
//! # Ok(()) }
//! ```
//!
//! A program is verified when it is registered ([`oxccl_algo::verify`]); a
//! broken one is refused with an error naming the rank, channel and step,
//! and nothing runs. A program written for count `C` runs at any count
//! by the rule of [`oxccl_algo::scale`]: each element becomes a
//! contiguous piece of `⌈N/C⌉` or `⌊N/C⌋` elements, which keeps every
//! guarantee the verifier proved when the program is index-aligned (and
//! at multiples of `C` when it is not). It runs for calls of its
//! collective kind, rank count and root, any data type and operator.
//!
//! Registration is process-wide (the same file loaded by several
//! communicators is one entry); a communicator considers the programs of
//! [`Config::programs`](crate::Config::programs) and of `OXCCL_ALGO_FILE`:
//! the tuner prices them with the simulator next to the built-in
//! algorithms, and `OXCCL_ALGO=name` selects one.

use oxccl_algo::algos::Algorithm;
use oxccl_algo::collective::Collective;
use oxccl_algo::ir::Program;
use oxccl_algo::{scale, verify};
use oxccl_core::{Error, Result};
use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};

/// A registered program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProgramId(u32);

/// What the registry keeps of a program.
pub(crate) struct Entry {
    pub program: Program,
    /// Whether it is index-aligned (runs at every count).
    pub aligned: bool,
    /// The file it was first loaded from ([`load`]), if any.
    pub file: Option<PathBuf>,
}

static REGISTRY: LazyLock<Mutex<Vec<Arc<Entry>>>> = LazyLock::new(|| Mutex::new(Vec::new()));

/// Verifies `program` and registers it under its name; its id. The same
/// program registered again gets the same id; another program under a
/// name already taken, or a built-in algorithm's name, is an error.
pub fn register(program: Program) -> Result<ProgramId> {
    register_from(program, None)
}

/// [`register`], remembering the file the program came from.
fn register_from(program: Program, file: Option<&Path>) -> Result<ProgramId> {
    let name = program.name.trim();
    if name.is_empty() || name.contains([',', ';', ':', '^']) || name.parse::<Algorithm>().is_ok() {
        return Err(Error::invalid(format!(
            "program name {:?}: use a non-empty name without , ; : ^ that is not a built-in algorithm's",
            program.name
        )));
    }
    {
        let reg = REGISTRY.lock();
        if let Some(i) = reg.iter().position(|e| e.program.name == program.name) {
            if reg[i].program == program {
                return Ok(ProgramId(i as u32));
            }
            return Err(Error::invalid(format!(
                "another program named {:?} is already registered in this process; rename one",
                program.name
            )));
        }
    }
    verify::verify(&program).map_err(|e| match e {
        Error::InvalidProgram(m) => Error::program(format!("program {:?} does not verify: {m}", program.name)),
        other => other,
    })?;
    let aligned = scale::check_aligned(&program).is_ok();
    let mut reg = REGISTRY.lock();
    if let Some(i) = reg.iter().position(|e| e.program == program) {
        return Ok(ProgramId(i as u32));
    }
    reg.push(Arc::new(Entry { program, aligned, file: file.map(Path::to_path_buf) }));
    Ok(ProgramId(reg.len() as u32 - 1))
}

/// Reads programs from a JSON file (one program, or an array of them),
/// verifies and registers each; their ids. Errors name the file.
pub fn load(path: impl AsRef<Path>) -> Result<Vec<ProgramId>> {
    let path = path.as_ref();
    let text =
        std::fs::read_to_string(path).map_err(|e| Error::invalid(format!("program file {}: {e}", path.display())))?;
    let progs: Vec<Program> = match serde_json::from_str::<Vec<Program>>(&text) {
        Ok(v) => v,
        Err(_) => vec![Program::from_json(&text).map_err(|e| named(e, path))?],
    };
    progs.into_iter().map(|p| register_from(p, Some(path)).map_err(|e| named(e, path))).collect()
}

fn named(e: Error, path: &Path) -> Error {
    let m = match &e {
        Error::InvalidArgument(m) | Error::InvalidProgram(m) => m.clone(),
        other => other.to_string(),
    };
    match e {
        Error::InvalidProgram(_) => Error::program(format!("{}: {m}", path.display())),
        _ => Error::invalid(format!("{}: {m}", path.display())),
    }
}

/// The entry of `id`.
pub(crate) fn get(id: ProgramId) -> Arc<Entry> {
    REGISTRY.lock()[id.0 as usize].clone()
}

/// The name `id` was registered under.
pub fn name(id: ProgramId) -> String {
    get(id).program.name.clone()
}

/// The file program `id` was first loaded from (`None`: registered from
/// memory).
pub fn file(id: ProgramId) -> Option<PathBuf> {
    get(id).file.clone()
}

/// The collective program `id` was written for (its count is the one it
/// was written at; it runs at others).
pub fn collective(id: ProgramId) -> Collective {
    get(id).program.collective
}

/// Whether program `id` is index-aligned, so it runs at every count (else
/// only at multiples of its count).
pub fn aligned(id: ProgramId) -> bool {
    get(id).aligned
}

/// Whether program `id` runs `coll` (kind, ranks and root; any type and
/// count, but a program that is not index-aligned only at multiples of
/// its count).
pub(crate) fn runs(id: ProgramId, coll: &Collective) -> bool {
    let e = get(id);
    let c = e.program.collective;
    let count_ok = e.aligned || (c.count != 0 && coll.count.is_multiple_of(c.count)) || coll.count == c.count;
    c.kind == coll.kind && c.nranks == coll.nranks && (!coll.kind.is_rooted() || c.root == coll.root) && count_ok
}

/// Program `id` at `coll`'s count and type.
pub(crate) fn instantiate(id: ProgramId, coll: &Collective) -> Result<Program> {
    let e = get(id);
    let c = e.program.collective;
    if c.kind != coll.kind || c.nranks != coll.nranks || (coll.kind.is_rooted() && c.root != coll.root) {
        return Err(Error::InvalidUsage(format!(
            "program {:?} is a {} of {} ranks{}; the call is a {} of {} ranks{}",
            e.program.name,
            c.kind,
            c.nranks,
            if c.kind.is_rooted() { format!(" rooted at {}", c.root) } else { String::new() },
            coll.kind,
            coll.nranks,
            if coll.kind.is_rooted() { format!(" rooted at {}", coll.root) } else { String::new() },
        )));
    }
    let mut p = scale::instantiate(&e.program, coll.count)?;
    p.collective.dtype = coll.dtype;
    Ok(p)
}
