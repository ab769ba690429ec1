//! # The shared test kit of oxccl's end-to-end tests
//!
//! One exact-input generator and reference for every test: inputs from
//! [`oxccl_algo::exact::Pattern`] (small integers chosen per type and
//! operator so that any reduction order gives the same bits), checked bit
//! for bit against the reference it computes from the contributions
//! [`Collective::expected`] names. oxccl-perf's check uses the same.
//!
//! - [`run_case`]: one collective on one rank, in or out of place, output
//!   checked and input left alone;
//! - [`matrix`]: every collective × type × operator × count × placement;
//! - [`on_threads`]: ranks as threads over a chosen transport;
//! - [`canon`]: order-sensitive inputs and the canonical order of the
//!   deterministic mode, computed independently;
//! - [`child`]: ranks as processes (the test binary is its own child);
//! - [`netns`]: two "hosts", network namespaces joined by veth;
//! - [`tree`]: the workspace's Rust sources, for tests of the sources;
//! - [`skip_or_fail`]: a test that cannot run here says why, or fails
//!   where CI set the `OXCCL_REQUIRE_*` variable that names what it needs.

pub mod canon;
pub mod child;
pub mod netns;
pub mod tree;

pub use oxccl_skip::{required, skip_or_fail};

use oxccl::{CollKind, Communicator, Config, DataType, Kind, ReduceOp, Spec};
use oxccl_algo::collective::Collective;
use oxccl_algo::exact::{Pattern, premul_scalar};
use std::time::Duration;

/// Every data type.
pub const DTYPES: [DataType; 12] = DataType::ALL;

/// A configuration for tests: a 60 s timeout and, if given, a forced
/// transport.
pub fn config(transport: Option<Kind>) -> Config {
    Config { timeout: Some(Duration::from_secs(60)), transport, ..Config::default() }
}

/// Every rank of `n` joins one communicator on a thread of its own with
/// the configuration `cfg(rank)`, each expected to fail: the errors, by
/// rank (panics where a rank's init succeeds).
pub fn init_failures(n: usize, cfg: impl Fn(usize) -> Config) -> Vec<String> {
    let id = config(None).unique_id().unwrap();
    let handles: Vec<_> = (0..n)
        .map(|r| {
            let cfg = cfg(r);
            std::thread::spawn(move || Communicator::init(&id, n, r, cfg).err().map(|e| e.to_string()))
        })
        .collect();
    handles
        .into_iter()
        .enumerate()
        .map(|(r, h)| h.join().unwrap().unwrap_or_else(|| panic!("rank {r}'s init succeeded")))
        .collect()
}

/// Runs `f` on every rank of an `n`-thread communicator made with `cfg`;
/// panics with the first failure.
pub fn on_threads(n: usize, cfg: Config, f: impl Fn(&Communicator) -> Result<(), String> + Sync) {
    let comms = Communicator::init_threads_with(n, cfg).expect("init_threads");
    std::thread::scope(|s| {
        let handles: Vec<_> = comms.iter().map(|c| s.spawn(|| f(c))).collect();
        for h in handles {
            if let Err(e) = h.join().expect("rank thread panicked") {
                panic!("{e}");
            }
        }
    });
}

/// `len` zeroed bytes, 8-aligned (any element type may live there).
pub fn zeroed(len: usize) -> Vec<u64> {
    vec![0u64; len.div_ceil(8)]
}

/// The first `len` bytes of `v`.
pub fn bytes(v: &[u64], len: usize) -> &[u8] {
    &bytemuck::cast_slice(v)[..len]
}

/// The first `len` bytes of `v`, writable.
pub fn bytes_mut(v: &mut [u64], len: usize) -> &mut [u8] {
    &mut bytemuck::cast_slice_mut(v)[..len]
}

/// The same seed on every rank for one case.
fn seed(kind: CollKind, count: usize, op: ReduceOp, root: usize) -> u64 {
    let k = CollKind::ALL.iter().position(|x| *x == kind).unwrap_or(0) as u64;
    (count as u64).wrapping_mul(0x9e37_79b9) ^ (k << 40) ^ ((op.to_nccl() as u64) << 48) ^ ((root as u64) << 56)
}

/// The operator rank `rank` passes for `op` (mulsum's scalar differs per
/// rank, as the pattern expects).
pub fn rank_op(op: ReduceOp, rank: usize) -> ReduceOp {
    match op {
        ReduceOp::PreMulSum { .. } => ReduceOp::PreMulSum { scalar: premul_scalar(rank) },
        o => o,
    }
}

/// This rank's input for a case, and the pattern that checks it.
pub fn input_of(coll: &Collective, op: ReduceOp, rank: usize) -> (Vec<u64>, Pattern) {
    let p = Pattern::new(coll.kind, coll.dtype, op, coll.nranks, seed(coll.kind, coll.count, op, coll.root));
    let len = coll.input_len(rank) * coll.dtype.size();
    let mut v = zeroed(len);
    p.fill(rank, bytes_mut(&mut v, len));
    (v, p)
}

/// Runs one collective on `comm` (in place or not) and checks the output
/// bit for bit, and that the input was left alone.
pub fn run_case(
    comm: &Communicator,
    kind: CollKind,
    dtype: DataType,
    count: usize,
    op: ReduceOp,
    root: usize,
    in_place: bool,
) -> Result<(), String> {
    let (n, rank) = (comm.size(), comm.rank());
    let coll = Collective { kind, nranks: n, count, root, dtype };
    let es = dtype.size();
    let (ni, no) = (coll.input_len(rank) * es, coll.output_len(rank) * es);
    let (input, p) = input_of(&coll, op, rank);
    let my_op = rank_op(op, rank);
    let what = format!("rank {rank}/{n} {kind} {dtype} count {count} {} root {root} in_place {in_place}", op.name());
    let wrong = if in_place {
        let l = coll.in_place_layout(rank);
        let mut buf = zeroed(l.len * es);
        let whole = bytes_mut(&mut buf, l.len * es);
        whole[l.input_at * es..][..ni].copy_from_slice(bytes(&input, ni));
        comm.collective_bytes(Spec::new(kind, count, dtype).with_op(my_op).with_root(root), None, whole)
            .map_err(|e| format!("{what}: {e}"))?;
        p.count_wrong(&coll, rank, &whole[l.output_at * es..][..no], None, 0)
    } else {
        let mut out = zeroed(no);
        let keep = input.clone();
        comm.collective_bytes(
            Spec::new(kind, count, dtype).with_op(my_op).with_root(root),
            Some(bytes(&input, ni)),
            bytes_mut(&mut out, no),
        )
        .map_err(|e| format!("{what}: {e}"))?;
        if input != keep {
            return Err(format!("{what}: the send buffer was modified"));
        }
        p.count_wrong(&coll, rank, bytes(&out, no), None, 0)
    };
    if wrong > 0 {
        return Err(format!("{what}: {wrong} wrong elements"));
    }
    Ok(())
}

/// The collectives a communicator runs as calls (send/recv is not one).
pub fn kinds() -> impl Iterator<Item = CollKind> {
    CollKind::ALL.into_iter().filter(|k| *k != CollKind::SendRecv)
}

/// The operators `kind` is tried with on `dtype`: every one it takes, or
/// just Sum for collectives that do not reduce.
pub fn ops(kind: CollKind, dtype: DataType) -> Vec<ReduceOp> {
    if !kind.reduces() {
        return vec![ReduceOp::Sum];
    }
    ReduceOp::ALL.into_iter().filter(|o| o.check(dtype).is_ok()).collect()
}

/// Every (kind, dtype, op, in_place) case for `counts`, run on this rank;
/// the number of cases, or the first failure.
pub fn matrix(comm: &Communicator, counts: &[usize], dtypes: &[DataType]) -> Result<usize, String> {
    let mut cases = 0;
    for kind in kinds() {
        for &dtype in dtypes {
            for op in ops(kind, dtype) {
                for &count in counts {
                    for in_place in [false, true] {
                        let root = if kind.is_rooted() { (count + 1) % comm.size() } else { 0 };
                        run_case(comm, kind, dtype, count, op, root, in_place)?;
                        cases += 1;
                    }
                }
            }
        }
    }
    Ok(cases)
}
