//! NCCL's C types as Rust sees them (layouts checked against
//! `include/nccl.h` by the tests), and the readers of caller structs.

use oxccl::{Error, Result};
use std::ffi::{c_char, c_int, c_uint};

/// `NCCL_API_MAGIC`.
pub const API_MAGIC: c_uint = 0xcafe_beef;
/// The NCCL API version implemented: 2.32.3.
pub const VERSION_CODE: c_int = 23203;
/// `NCCL_CONFIG_UNDEF_INT`.
pub const UNDEF_INT: c_int = c_int::MIN;
/// The magic of `NCCL_SIM_INFO_INITIALIZER`.
pub const SIM_MAGIC: c_uint = 0x7468_5283;

/// `ncclUniqueId`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueIdC {
    /// The 128 bytes.
    pub internal: [c_char; 128],
}

/// `ncclConfig_t` (NCCL 2.32's, tagged `ncclConfig_v23100`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(non_snake_case, missing_docs)]
pub struct ConfigC {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub blocking: c_int,
    pub cgaClusterSize: c_int,
    pub minCTAs: c_int,
    pub maxCTAs: c_int,
    pub netName: *const c_char,
    pub splitShare: c_int,
    pub trafficClass: c_int,
    pub commName: *const c_char,
    pub collnetEnable: c_int,
    pub CTAPolicy: c_int,
    pub shrinkShare: c_int,
    pub nvlsCTAs: c_int,
    pub nChannelsPerNetPeer: c_int,
    pub nvlinkCentricSched: c_int,
    pub graphUsageMode: c_int,
    pub numRmaCtx: c_int,
    pub maxP2pPeers: c_int,
    pub graphStreamOrdering: c_int,
    pub launchOrderImplicit: c_int,
    pub numRmaSig: c_int,
    pub rmaEagerInit: c_int,
    pub hostCftMode: c_int,
    pub nvlsHostMode: c_int,
}

/// `ncclSimInfo_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(non_snake_case, missing_docs)]
pub struct SimInfoC {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub estimatedTime: f32,
}

/// `ncclCollConfig_t` (2.32): only its header is read.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(missing_docs)]
pub struct CollConfigHead {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
}

/// What oxccl takes from a caller's `ncclConfig_t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// `blocking` (default 1).
    pub blocking: bool,
}

/// Reads a caller's config as NCCL does: `size` first, at most that many
/// bytes of it, the magic checked, fields newer than the caller's
/// `version` ignored. NULL is the default configuration.
pub(crate) fn read_config(p: *const ConfigC) -> Result<Options> {
    if p.is_null() {
        return Ok(Options { blocking: true });
    }
    // SAFETY: a non-NULL config points at least at its `size` field (every
    // NCCL version's struct starts with it).
    let size = unsafe { std::ptr::read_unaligned(p.cast::<usize>()) };
    if size < 16 {
        return Err(Error::invalid(format!(
            "config.size is {size}: initialise the config with NCCL_CONFIG_INITIALIZER"
        )));
    }
    let mut c = [0u8; std::mem::size_of::<ConfigC>()];
    let n = size.min(c.len());
    // SAFETY: the caller's struct has `size` bytes; we copy at most that.
    unsafe { std::ptr::copy_nonoverlapping(p.cast::<u8>(), c.as_mut_ptr(), n) };
    let int_at = |off: usize| -> c_int {
        if off + 4 <= n { c_int::from_ne_bytes(c[off..off + 4].try_into().expect("4 bytes")) } else { UNDEF_INT }
    };
    let magic = int_at(8) as c_uint;
    if magic != API_MAGIC {
        return Err(Error::invalid(format!(
            "config.magic is {magic:#x}, not NCCL_API_MAGIC (0xcafebeef): initialise the config with NCCL_CONFIG_INITIALIZER"
        )));
    }
    let version = int_at(12);
    // `blocking` exists from NCCL 2.14 on.
    let blocking = if version >= 21400 { int_at(16) } else { UNDEF_INT };
    Ok(Options { blocking: blocking != 0 })
}

/// `ncclEncryptionConfig_t` (NCCL 2.32).
#[repr(C)]
pub struct EncryptionC {
    /// `sizeof(ncclEncryptionConfig_t)`.
    pub size: usize,
    /// `NCCL_API_MAGIC`.
    pub magic: c_uint,
    /// The caller's `NCCL_VERSION_CODE`.
    pub version: c_uint,
    /// `ncclEncryptionMode_t`: 0 none, 1 PSK.
    pub mode: c_int,
    /// The pre-shared key (PSK mode), a C string.
    pub psk: *const c_char,
}

/// Reads an `ncclEncryptionConfig_t`: `None` for mode NONE, the key for
/// mode PSK; an error naming the field that is wrong.
pub(crate) fn read_encryption(p: *const EncryptionC) -> Result<Option<Vec<u8>>> {
    if p.is_null() {
        return Err(Error::invalid("config (the ncclEncryptionConfig_t*) is NULL"));
    }
    // SAFETY: a non-NULL config points at least at its `size` field.
    let size = unsafe { std::ptr::read_unaligned(p.cast::<usize>()) };
    if size < std::mem::size_of::<EncryptionC>() {
        return Err(Error::invalid(format!(
            "config.size is {size}, not sizeof(ncclEncryptionConfig_t): initialise it with \
             NCCL_ENCRYPTION_CONFIG_INITIALIZER"
        )));
    }
    // SAFETY: the caller's struct is at least as large as ours (checked).
    let c = unsafe { std::ptr::read_unaligned(p) };
    if c.magic != API_MAGIC {
        return Err(Error::invalid(format!(
            "config.magic is {:#x}, not NCCL_API_MAGIC: initialise it with NCCL_ENCRYPTION_CONFIG_INITIALIZER",
            c.magic
        )));
    }
    match c.mode {
        0 => Ok(None),
        1 if c.psk.is_null() => Err(Error::invalid("config.psk is NULL in NCCL_ENCRYPTION_MODE_PSK")),
        1 => {
            // SAFETY: a non-NULL psk is a NUL-terminated string (NCCL's
            // contract for the field).
            let key = unsafe { std::ffi::CStr::from_ptr(c.psk) }.to_bytes().to_vec();
            if key.is_empty() {
                return Err(Error::invalid("config.psk is empty in NCCL_ENCRYPTION_MODE_PSK"));
            }
            Ok(Some(key))
        }
        m => Err(Error::invalid(format!(
            "config.mode is {m}: expected NCCL_ENCRYPTION_MODE_NONE (0) or NCCL_ENCRYPTION_MODE_PSK (1)"
        ))),
    }
}

/// Checks a per-call config (`ncclAllReduceConfig` …): NULL or an
/// initialised one; its options do not change what oxccl does.
pub(crate) fn check_coll_config(p: *const CollConfigHead) -> Result<()> {
    if p.is_null() {
        return Ok(());
    }
    // SAFETY: a non-NULL per-call config starts with this header.
    let h = unsafe { std::ptr::read_unaligned(p) };
    if h.magic != API_MAGIC {
        return Err(Error::invalid(format!(
            "config.magic is {:#x}, not NCCL_API_MAGIC: initialise it with NCCL_COLLCONFIG_INITIALIZER",
            h.magic
        )));
    }
    Ok(())
}

/// Writes `v` through the caller's out-pointer `p` (`what` names it).
pub(crate) fn out<T>(p: *mut T, v: T, what: &str) -> Result<()> {
    if p.is_null() {
        return Err(Error::invalid(format!("{what} is NULL")));
    }
    // SAFETY: a non-NULL out-pointer of NCCL's API points at a writable T.
    unsafe { std::ptr::write_unaligned(p, v) };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_are_read_as_nccl_reads_them() {
        assert!(read_config(std::ptr::null()).unwrap().blocking);
        let mut c: ConfigC = default_config();
        c.size = std::mem::size_of::<ConfigC>();
        c.magic = API_MAGIC;
        c.version = VERSION_CODE as c_uint;
        c.blocking = 0;
        assert!(!read_config(&c).unwrap().blocking);
        c.blocking = UNDEF_INT;
        assert!(read_config(&c).unwrap().blocking);
        c.magic = 0;
        let e = read_config(&c).unwrap_err().to_string();
        assert!(e.contains("NCCL_CONFIG_INITIALIZER"), "{e}");
        // An old caller (2.12) has no `blocking`: the default holds.
        let mut c2 = c;
        c2.magic = API_MAGIC;
        c2.version = 21200;
        c2.blocking = 0;
        assert!(read_config(&c2).unwrap().blocking);
    }

    fn default_config() -> ConfigC {
        ConfigC {
            size: 0,
            magic: 0,
            version: 0,
            blocking: UNDEF_INT,
            cgaClusterSize: UNDEF_INT,
            minCTAs: UNDEF_INT,
            maxCTAs: UNDEF_INT,
            netName: std::ptr::null(),
            splitShare: UNDEF_INT,
            trafficClass: UNDEF_INT,
            commName: std::ptr::null(),
            collnetEnable: UNDEF_INT,
            CTAPolicy: UNDEF_INT,
            shrinkShare: UNDEF_INT,
            nvlsCTAs: UNDEF_INT,
            nChannelsPerNetPeer: UNDEF_INT,
            nvlinkCentricSched: UNDEF_INT,
            graphUsageMode: UNDEF_INT,
            numRmaCtx: UNDEF_INT,
            maxP2pPeers: UNDEF_INT,
            graphStreamOrdering: UNDEF_INT,
            launchOrderImplicit: UNDEF_INT,
            numRmaSig: UNDEF_INT,
            rmaEagerInit: UNDEF_INT,
            hostCftMode: UNDEF_INT,
            nvlsHostMode: UNDEF_INT,
        }
    }
}
