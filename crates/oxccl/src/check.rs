//! `OXCCL_CHECK=1`: every rank's arguments of a collective are compared
//! through the bootstrap before it runs, so a mismatch is an error naming
//! the first rank that differs instead of a hang or corrupted data.

use oxccl_algo::collective::{CollKind, Collective};
use oxccl_core::{DataType, Error, ReduceOp, Result};
use oxccl_transport::bootstrap::Bootstrap;

fn encode(c: &Collective, op: ReduceOp) -> Vec<u8> {
    let mut v = Vec::with_capacity(32);
    v.push(CollKind::ALL.iter().position(|k| *k == c.kind).unwrap_or(255) as u8);
    v.extend_from_slice(&(c.count as u64).to_le_bytes());
    v.push(c.dtype.to_nccl() as u8);
    // PreMulSum's scalar may differ per rank; the operator may not.
    v.push(if c.kind.reduces() { op.to_nccl() as u8 } else { 0 });
    v.extend_from_slice(&(c.root as u64).to_le_bytes());
    v
}

fn describe(v: &[u8]) -> String {
    if v.len() != 19 {
        return format!("a malformed description ({} bytes)", v.len());
    }
    let kind = CollKind::ALL.get(v[0] as usize).map(|k| k.name()).unwrap_or("?");
    let count = u64::from_le_bytes(v[1..9].try_into().expect("8 bytes"));
    let dtype = DataType::from_nccl(v[9] as i32).map(|d| d.name()).unwrap_or("?");
    let root = u64::from_le_bytes(v[11..19].try_into().expect("8 bytes"));
    let op = ReduceOp::from_nccl(v[10] as i32).map(|o| o.name()).unwrap_or("?");
    format!("{kind} count {count} {dtype} op {op} root {root}")
}

/// Compares this call with every rank's; an error names the first rank
/// whose call differs from rank 0's.
pub(crate) fn compare(boot: &Bootstrap, c: &Collective, op: ReduceOp) -> Result<()> {
    let mine = encode(c, op);
    let all = boot.all_gather(&mine)?;
    if let Some((r, theirs)) = all.iter().enumerate().find(|(_, v)| **v != all[0]) {
        return Err(Error::InvalidUsage(format!(
            "OXCCL_CHECK: rank {r} called {} but rank 0 called {} (seen from rank {})",
            describe(theirs),
            describe(&all[0]),
            boot.rank()
        )));
    }
    Ok(())
}
