//! Shared by the end-to-end tests: inputs with exactly representable
//! values, an independent reference (f64 arithmetic over the contributions
//! `Collective::expected` names), and a runner generic over element types.
#![allow(dead_code)]

pub mod child;

use oxccl::{CollKind, Communicator, DataType, Element, ReduceOp};
use oxccl_algo::collective::Collective;

/// Rank `r`'s input element `i` for `op` on `dtype`: small integers, so
/// every type holds them and every reduction of up to 8 ranks exactly.
pub fn value(op: ReduceOp, dtype: DataType, r: usize, i: usize) -> f64 {
    let fp8 = matches!(dtype, DataType::Float8E4M3 | DataType::Float8E5M2);
    match op {
        ReduceOp::Avg => (i % 3) as f64,
        ReduceOp::Prod => {
            if (i + r).is_multiple_of(3) {
                2.0
            } else {
                1.0
            }
        }
        ReduceOp::Max | ReduceOp::Min => ((i * 5 + r * 11) % 7) as f64,
        _ => ((i * 7 + r * 3) % if fp8 { 2 } else { 4 }) as f64,
    }
}

fn combine(op: ReduceOp, vals: &[f64]) -> f64 {
    match op {
        ReduceOp::Sum => vals.iter().sum(),
        ReduceOp::Prod => vals.iter().product(),
        ReduceOp::Max => vals.iter().copied().fold(f64::MIN, f64::max),
        ReduceOp::Min => vals.iter().copied().fold(f64::MAX, f64::min),
        ReduceOp::Avg => vals.iter().sum::<f64>() / vals.len() as f64,
        ReduceOp::PreMulSum { scalar } => vals.iter().map(|v| v * scalar).sum(),
    }
}

/// What `rank`'s output must hold.
pub fn reference(coll: &Collective, op: ReduceOp, rank: usize) -> Vec<f64> {
    let mut out = vec![0.0; coll.output_len(rank)];
    for e in coll.expected(rank) {
        for k in 0..e.len {
            let vals: Vec<f64> = e.ranks.iter().map(|&r| value(op, coll.dtype, r, e.base + k)).collect();
            out[e.start + k] = if coll.kind.reduces() { combine(op, &vals) } else { vals[0] };
        }
    }
    out
}

/// Runs one collective on `comm` with typed buffers, in place or not, and
/// checks the output (and that the input was left alone).
pub fn run_case<T: Element + PartialEq>(
    comm: &Communicator,
    kind: CollKind,
    count: usize,
    op: ReduceOp,
    root: usize,
    in_place: bool,
) -> Result<(), String> {
    let (n, rank) = (comm.size(), comm.rank());
    let coll = Collective { kind, nranks: n, count, root, dtype: T::DTYPE };
    let ni = coll.input_len(rank);
    let no = coll.output_len(rank);
    let input: Vec<T> = (0..ni).map(|i| T::from_scalar(value(op, T::DTYPE, rank, i))).collect();
    let want: Vec<T> = reference(&coll, op, rank).into_iter().map(T::from_scalar).collect();
    let what =
        format!("rank {rank}/{n} {kind} {} count {count} {} root {root} in_place {in_place}", T::DTYPE, op.name());
    let got: Vec<T> = if in_place {
        let l = coll.in_place_layout(rank);
        let mut buf = vec![T::from_scalar(0.0); l.len];
        buf[l.input_at..l.input_at + ni].copy_from_slice(&input);
        comm.collective_bytes(kind, None, bytemuck::cast_slice_mut(&mut buf), count, T::DTYPE, op, root)
            .map_err(|e| format!("{what}: {e}"))?;
        buf[l.output_at..l.output_at + no].to_vec()
    } else {
        let mut out = vec![T::from_scalar(0.0); no];
        let keep = input.clone();
        comm.collective_bytes(
            kind,
            Some(bytemuck::cast_slice(&input)),
            bytemuck::cast_slice_mut(&mut out),
            count,
            T::DTYPE,
            op,
            root,
        )
        .map_err(|e| format!("{what}: {e}"))?;
        if input != keep {
            return Err(format!("{what}: the input changed"));
        }
        out
    };
    if got != want {
        let bad = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
        return Err(format!("{what}: element {bad} is {:?}, expected {:?}", got.get(bad), want.get(bad)));
    }
    Ok(())
}

/// The collectives a communicator runs as calls (send/recv is not one).
pub fn kinds() -> impl Iterator<Item = CollKind> {
    CollKind::ALL.into_iter().filter(|k| *k != CollKind::SendRecv)
}

/// The operators `kind` is tried with on `dtype`: every one it takes
/// (PreMulSum with scalar 2), or just Sum for collectives that do not reduce.
pub fn ops(kind: CollKind, dtype: DataType) -> Vec<ReduceOp> {
    if !kind.reduces() {
        return vec![ReduceOp::Sum];
    }
    ReduceOp::ALL
        .into_iter()
        .map(|o| if let ReduceOp::PreMulSum { .. } = o { ReduceOp::PreMulSum { scalar: 2.0 } } else { o })
        .filter(|o| o.check(dtype).is_ok())
        .collect()
}

/// Every (kind, dtype, op, in_place) case for `counts`, run on this rank;
/// the first failure.
pub fn matrix(comm: &Communicator, counts: &[usize], dtypes: &[DataType]) -> Result<usize, String> {
    let mut cases = 0;
    for kind in kinds() {
        for &dtype in dtypes {
            for op in ops(kind, dtype) {
                for &count in counts {
                    for in_place in [false, true] {
                        let root = if kind.is_rooted() { (count + 1) % comm.size() } else { 0 };
                        oxccl_core::with_element_type!(dtype, T => run_case::<T>(comm, kind, count, op, root, in_place))?;
                        cases += 1;
                    }
                }
            }
        }
    }
    Ok(cases)
}

/// Every data type.
pub const DTYPES: [DataType; 12] = DataType::ALL;
