//! Rust mirrors of `cuda/args.h`: the kernels' argument blocks and constants.
//! `tests/cuda/layout.rs` compiles the header with the C compiler and checks every
//! field's offset and every constant against these.
#![allow(unsafe_code)]

use crate::error::{CudaError, Result, invalid};

/// `OXCCL_MAX_SRCS`: sources (and destinations) of one reduce launch.
pub const MAX_SRCS: usize = 16;
/// `OXCCL_MAX_RANKS`: ranks of one collective launch.
pub const MAX_RANKS: usize = 16;
/// `OXCCL_MAX_BLOCKS`: blocks of one collective launch.
pub const MAX_BLOCKS: usize = 64;
/// `OXCCL_FLAG_BYTES`: bytes of each rank's flag area (zeroed before first use).
pub const FLAG_BYTES: usize = 16384;
// The flag area (flags[MAX_RANKS][MAX_BLOCKS], then epochs[MAX_BLOCKS]) fits.
const _: () = assert!((MAX_RANKS + 1) * MAX_BLOCKS * 8 <= FLAG_BYTES);
/// `OXCCL_STATUS_OK`.
pub const STATUS_OK: u32 = 0;
/// `OXCCL_STATUS_TIMEOUT`: a wait inside the kernel passed `timeout_ns`.
pub const STATUS_TIMEOUT: u32 = 1;
/// `OXCCL_STATUS_ABORTED`: the host set the abort word (`status[1]`).
pub const STATUS_ABORTED: u32 = 2;
/// `OXCCL_STATUS_INVALID`: the kernel found its arguments unusable and wrote nothing.
pub const STATUS_INVALID: u32 = 3;

/// `oxccl_collective`'s algorithm (`oxccl_coll_args.coll`, `OXCCL_COLL_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Coll {
    /// All-reduce, every rank reads every window (`OXCCL_COLL_ALL_REDUCE_ONE_SHOT`).
    AllReduceOneShot = 0,
    /// All-reduce as reduce-scatter then all-gather over the windows.
    AllReduceTwoShot = 1,
    /// Reduce-scatter.
    ReduceScatter = 2,
    /// All-gather.
    AllGather = 3,
    /// Broadcast from `root`.
    Broadcast = 4,
    /// Reduce to `root`.
    Reduce = 5,
    /// All-to-all.
    AllToAll = 6,
}

impl Coll {
    /// Every algorithm, in `OXCCL_COLL_*` order.
    pub const ALL: [Coll; 7] = [
        Coll::AllReduceOneShot,
        Coll::AllReduceTwoShot,
        Coll::ReduceScatter,
        Coll::AllGather,
        Coll::Broadcast,
        Coll::Reduce,
        Coll::AllToAll,
    ];
}

/// `struct oxccl_reduce_args`: `dsts[j][i] = fin(op(pre(srcs[0][i]),
/// srcs[1][i], …))` for `i < count`, every address a device address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ReduceArgs {
    /// Source addresses; the first `nsrcs` are used.
    pub srcs: [u64; MAX_SRCS],
    /// Destination addresses; the first `ndsts` are used. A destination may equal a source.
    pub dsts: [u64; MAX_SRCS],
    /// Elements.
    pub count: u64,
    /// Premul scalar for `srcs[0]` (when `premul` is 1).
    pub scale: f64,
    /// Sources used, 1..=16 (1: copy, or scale/average one source).
    pub nsrcs: u32,
    /// Destinations used, 1..=16.
    pub ndsts: u32,
    /// 1: multiply `srcs[0]` by `scale` first.
    pub premul: u32,
    /// 0: none; else divide the result by it.
    pub avg_div: u32,
}

/// `struct oxccl_coll_args`: one whole collective over the ranks' windows.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CollArgs {
    /// Rank q's window, as addressable from this rank (its own included).
    pub window: [u64; MAX_RANKS],
    /// Rank q's flag area ([`FLAG_BYTES`], zeroed at allocation), as addressable here.
    pub flags: [u64; MAX_RANKS],
    /// This rank's input.
    pub send: u64,
    /// This rank's output.
    pub recv: u64,
    /// NCCL's count for the collective.
    pub count: u64,
    /// Usable bytes of every window.
    pub window_bytes: u64,
    /// A single wait inside the kernel gives up after this long.
    pub timeout_ns: u64,
    /// Address of `u32[2]` in host-mapped memory: `[0]` status code, `[1]` abort request.
    pub status: u64,
    /// Premul scalar of this rank's input.
    pub scale: f64,
    /// Ranks, 1..=16.
    pub nranks: u32,
    /// This rank.
    pub rank: u32,
    /// Root of broadcast and reduce.
    pub root: u32,
    /// The algorithm ([`Coll`] as u32).
    pub coll: u32,
    /// 1: multiply this rank's input by `scale` first.
    pub premul: u32,
    /// 1: divide reductions by `nranks`.
    pub avg: u32,
    /// Padding (keep 0).
    pub pad0: u32,
    /// Padding (keep 0).
    pub pad1: u32,
}

// SAFETY: #[repr(C)] plain-old-data (integers and f64, no padding the kernel
// reads), laid out exactly as `struct oxccl_reduce_args` (tests/cuda/layout.rs
// checks every offset against the C compiler's), so passing it by value as a
// kernel parameter is what the kernel expects.
unsafe impl cudarc::driver::DeviceRepr for ReduceArgs {}
// SAFETY: as for ReduceArgs, against `struct oxccl_coll_args`.
unsafe impl cudarc::driver::DeviceRepr for CollArgs {}

impl ReduceArgs {
    /// Checks the counts and flags and that every used address is non-zero.
    /// Errors name the field.
    pub fn validate(&self) -> Result<()> {
        let check_n = |what: &str, n: u32| {
            if n == 0 || n as usize > MAX_SRCS {
                return Err(invalid(format!("reduce: {what} is {n}; it must be 1..={MAX_SRCS}")));
            }
            Ok(())
        };
        check_n("nsrcs", self.nsrcs)?;
        check_n("ndsts", self.ndsts)?;
        if self.premul > 1 {
            return Err(invalid(format!("reduce: premul is {}; it must be 0 or 1", self.premul)));
        }
        if self.count == 0 {
            return Ok(());
        }
        for (what, addrs, n) in [("srcs", &self.srcs, self.nsrcs), ("dsts", &self.dsts, self.ndsts)] {
            if let Some(i) = addrs[..n as usize].iter().position(|&a| a == 0) {
                return Err(invalid(format!("reduce: {what}[{i}] is a null address ({what} used: {n})")));
            }
        }
        Ok(())
    }
}

impl CollArgs {
    /// Checks the rank numbers, the algorithm, the addresses the kernel uses
    /// and the launch shape (`grid` blocks of `block` threads). Errors name the field.
    pub fn validate(&self, grid: u32, block: u32) -> Result<()> {
        let n = self.nranks;
        let bad = |msg: String| -> Result<()> { Err(invalid(format!("collective: {msg}"))) };
        if n == 0 || n as usize > MAX_RANKS {
            return bad(format!("nranks is {n}; it must be 1..={MAX_RANKS}"));
        }
        if self.rank >= n {
            return bad(format!("rank {} is not below nranks {n}", self.rank));
        }
        if self.root >= n {
            return bad(format!("root {} is not below nranks {n}", self.root));
        }
        if self.coll as usize >= Coll::ALL.len() {
            return bad(format!("coll is {}; it must be 0..={} (OXCCL_COLL_*)", self.coll, Coll::ALL.len() - 1));
        }
        if self.premul > 1 || self.avg > 1 {
            return bad(format!("premul {} and avg {} must be 0 or 1", self.premul, self.avg));
        }
        if grid == 0 || grid as usize > MAX_BLOCKS {
            return bad(format!("grid of {grid} blocks; it must be 1..={MAX_BLOCKS} (OXCCL_MAX_BLOCKS)"));
        }
        if block < n || block > 1024 {
            return bad(format!("blocks of {block} threads; they must be nranks ({n})..=1024"));
        }
        if self.timeout_ns == 0 {
            return bad("timeout_ns is 0; every wait needs a deadline".into());
        }
        if self.status == 0 || !self.status.is_multiple_of(4) {
            return bad(format!("status address {:#x} is null or not 4-byte aligned", self.status));
        }
        if self.window_bytes < 16 * u64::from(n) {
            return bad(format!(
                "window of {} bytes; it must hold at least 16 bytes per rank ({} bytes)",
                self.window_bytes,
                16 * n
            ));
        }
        for q in 0..n as usize {
            if self.window[q] == 0 || self.flags[q] == 0 || !self.flags[q].is_multiple_of(8) {
                return bad(format!(
                    "rank {q}'s window {:#x} or flag area {:#x} is null (or the flags are not 8-byte aligned)",
                    self.window[q], self.flags[q]
                ));
            }
        }
        Ok(())
    }
}

/// The error for a kernel's status code (`status[0]`): `Ok` for
/// [`STATUS_OK`], [`CudaError::Timeout`] / [`CudaError::Aborted`] naming
/// `what` otherwise.
pub fn check_status(code: u32, what: &str) -> Result<()> {
    match code {
        STATUS_OK => Ok(()),
        STATUS_TIMEOUT => Err(CudaError::Timeout(format!("{what}: a wait inside the kernel passed its deadline"))),
        STATUS_ABORTED => Err(CudaError::Aborted(format!("{what}: the kernel stopped on the host's abort request"))),
        STATUS_INVALID => {
            Err(CudaError::Invalid(format!("{what}: the kernel rejected its arguments and wrote nothing")))
        }
        other => Err(CudaError::Invalid(format!("{what}: the kernel wrote unknown status code {other}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good_coll() -> CollArgs {
        let mut a =
            CollArgs { nranks: 2, rank: 1, timeout_ns: 1, status: 0x1000, window_bytes: 4096, ..Default::default() };
        for q in 0..2 {
            a.window[q] = 0x10_0000 * (q as u64 + 1);
            a.flags[q] = 0x20_0000 * (q as u64 + 1);
        }
        a
    }

    #[test]
    fn sizes_are_those_of_the_header() {
        assert_eq!(std::mem::size_of::<ReduceArgs>(), 16 * 8 * 2 + 8 + 8 + 4 * 4);
        assert_eq!(std::mem::size_of::<CollArgs>(), 16 * 8 * 2 + 8 * 6 + 8 + 4 * 8);
    }

    #[test]
    fn reduce_validation_names_the_field() {
        let mut a = ReduceArgs { nsrcs: 2, ndsts: 1, count: 4, ..Default::default() };
        a.srcs[0] = 0x100;
        a.dsts[0] = 0x200;
        assert!(a.validate().unwrap_err().to_string().contains("srcs[1]"));
        a.srcs[1] = 0x300;
        a.validate().unwrap();
        a.nsrcs = 17;
        assert!(a.validate().unwrap_err().to_string().contains("nsrcs is 17"));
        a.nsrcs = 2;
        a.ndsts = 0;
        assert!(a.validate().unwrap_err().to_string().contains("ndsts is 0"));
    }

    #[test]
    fn coll_validation_names_the_field() {
        good_coll().validate(16, 512).unwrap();
        let e = |a: CollArgs, g, b| a.validate(g, b).unwrap_err().to_string();
        assert!(e(CollArgs { rank: 2, ..good_coll() }, 16, 512).contains("rank 2"));
        assert!(e(CollArgs { coll: 7, ..good_coll() }, 16, 512).contains("coll is 7"));
        assert!(e(good_coll(), 65, 512).contains("65 blocks"));
        assert!(e(good_coll(), 16, 1).contains("1 threads"));
        assert!(e(CollArgs { timeout_ns: 0, ..good_coll() }, 16, 512).contains("timeout_ns"));
        let mut a = good_coll();
        a.flags[1] = 0;
        assert!(e(a, 16, 512).contains("rank 1"));
    }

    #[test]
    fn status_codes_map_to_errors() {
        check_status(STATUS_OK, "x").unwrap();
        assert!(
            matches!(check_status(STATUS_TIMEOUT, "all_reduce"), Err(CudaError::Timeout(m)) if m.contains("all_reduce"))
        );
        assert!(matches!(check_status(STATUS_ABORTED, "x"), Err(CudaError::Aborted(_))));
        assert!(check_status(9, "x").unwrap_err().to_string().contains('9'));
    }
}
