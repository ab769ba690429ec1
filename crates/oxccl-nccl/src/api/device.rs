//! The host side of NCCL's device API (`nccl_device/host.h`; NCCL 2.28 and
//! later): what PyTorch and other NCCL clients link against whether or not
//! they use it, so a drop-in library must export it.
//!
//! oxccl has no device-initiated communication (its kernels are launched by
//! the host, one collective at a time), so what needs it is refused with
//! `ncclInvalidUsage` and a message that says so: device communicators,
//! windows' device pointers, GIN/LSA/CFT resource requirements. What is a
//! plain fact of the communicator is answered: its properties (with
//! `deviceApiSupport` false) and its teams. A rank's memory is
//! load/store-accessible to itself only, as far as this API is concerned:
//! its LSA team is the rank alone, and its rail team is then the world.

use super::comms::get;
use crate::handle::Comm;
use crate::nccl_api;
use oxccl::Error;
use std::ffi::{c_int, c_void};

/// `NCCL_API_MAGIC` (nccl.h): the magic of versioned structs.
const API_MAGIC: u32 = 0xcafe_beef;

/// `ncclTeam_t` (nccl_device/core.h): `nRanks` ranks, this one's index,
/// and the stride between consecutive members' world ranks.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TeamC {
    /// Members.
    pub n_ranks: c_int,
    /// This rank's index in the team.
    pub rank: c_int,
    /// World-rank distance between consecutive members.
    pub stride: c_int,
}

/// `ncclCommProperties_t` (nccl_device/host.h, NCCL 2.32): the caller sets
/// `size`, `magic` and `version` (`NCCL_COMM_PROPERTIES_INITIALIZER`).
#[repr(C)]
pub struct PropertiesC {
    size: usize,
    magic: u32,
    version: u32,
    rank: c_int,
    n_ranks: c_int,
    cuda_dev: c_int,
    nvml_dev: c_int,
    device_api_support: bool,
    multimem_support: bool,
    gin_type: c_int,
    n_lsa_teams: c_int,
    host_rma_support: bool,
    railed_gin_type: c_int,
    comm_hash: u64,
    gin_min_stride: c_int,
    gin_connection_type: c_int,
    gin_support: [bool; 64],
    dev_comm_runtime_version_size: usize,
    cft_support: bool,
    cft_multicast_support: bool,
    cft_counted_support: bool,
}

/// The refusal of what needs device-initiated communication.
fn no_device_api(what: &str) -> oxccl::Result<()> {
    Err(Error::InvalidUsage(format!(
        "{what} is part of NCCL's device API (device-initiated communication), which oxccl does not \
         implement; ncclCommQueryProperties reports deviceApiSupport = false"
    )))
}

/// The communicator's hash: its unique id's nonce folded (FNV-1a; never
/// its secret), the same on every rank.
fn hash_of(c: &Comm) -> u64 {
    let id = c.comm().map(|x| x.id().nonce().to_vec()).unwrap_or_default();
    id.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

/// The team of the world, of this rank alone (LSA), or of the rails.
fn team(comm: *const c_void, which: &str) -> TeamC {
    let Ok(c) = get(comm) else {
        crate::error::set_last(&format!("{which}: comm is not a live communicator"));
        return TeamC { n_ranks: 0, rank: 0, stride: 0 };
    };
    match which {
        "lsa" | "cft" => TeamC { n_ranks: 1, rank: 0, stride: 1 },
        _ => TeamC { n_ranks: c.nranks as c_int, rank: c.rank as c_int, stride: 1 },
    }
}

nccl_api! {
    /// `ncclCommQueryProperties`: rank, size, device and hash; no device
    /// API, multimem, GIN, host RMA or CFT; one LSA team per rank.
    fn ncclCommQueryProperties / pncclCommQueryProperties(comm_h: *const c_void, props: *mut PropertiesC) {
        let c = get(comm_h)?;
        if props.is_null() {
            return Err(Error::invalid("props is NULL"));
        }
        // SAFETY: a non-NULL props points at the caller's struct, whose
        // first fields (size, magic) every version has.
        let (size, magic) = unsafe { ((*props).size, (*props).magic) };
        if magic != API_MAGIC {
            return Err(Error::invalid(format!(
                "props->magic is {magic:#x}, not NCCL_API_MAGIC {API_MAGIC:#x}: initialize it with \
                 NCCL_COMM_PROPERTIES_INITIALIZER"
            )));
        }
        if size < std::mem::size_of::<PropertiesC>() {
            return Err(Error::invalid(format!(
                "props->size is {size}, smaller than ncclCommProperties_t of NCCL 2.32 ({} bytes)",
                std::mem::size_of::<PropertiesC>()
            )));
        }
        let cuda_dev = c.cuda_device;
        let filled = PropertiesC {
            size,
            magic,
            version: crate::abi::VERSION_CODE as u32,
            rank: c.rank as c_int,
            n_ranks: c.nranks as c_int,
            cuda_dev,
            nvml_dev: cuda_dev,
            device_api_support: false,
            multimem_support: false,
            gin_type: 0,
            n_lsa_teams: c.nranks as c_int,
            host_rma_support: false,
            railed_gin_type: 0,
            comm_hash: hash_of(&c),
            gin_min_stride: 0,
            gin_connection_type: 0,
            gin_support: [false; 64],
            dev_comm_runtime_version_size: 0,
            cft_support: false,
            cft_multicast_support: false,
            cft_counted_support: false,
        };
        // SAFETY: props is non-NULL and, by its size, holds a whole PropertiesC.
        unsafe { std::ptr::write_unaligned(props, filled) };
        Ok(())
    }

    /// `ncclDevCommCreate`: refused (no device API).
    fn ncclDevCommCreate / pncclDevCommCreate(comm_h: *const c_void, reqs: *const c_void, out_dev_comm: *mut c_void) {
        get(comm_h)?;
        let _ = (reqs, out_dev_comm);
        no_device_api("ncclDevCommCreate")
    }

    /// `ncclDevCommDestroy`: refused (no device communicator was ever made).
    fn ncclDevCommDestroy / pncclDevCommDestroy(comm_h: *const c_void, dev_comm: *const c_void) {
        get(comm_h)?;
        let _ = dev_comm;
        no_device_api("ncclDevCommDestroy")
    }

    /// `ncclGetLsaMultimemDevicePointer`: refused.
    fn ncclGetLsaMultimemDevicePointer / pncclGetLsaMultimemDevicePointer(win: *mut c_void, offset: usize, out_ptr: *mut *mut c_void) {
        let _ = (win, offset, out_ptr);
        no_device_api("ncclGetLsaMultimemDevicePointer")
    }

    /// `ncclGetMultimemDevicePointer`: refused.
    fn ncclGetMultimemDevicePointer / pncclGetMultimemDevicePointer(win: *mut c_void, offset: usize, multimem: *mut c_void, out_ptr: *mut *mut c_void) {
        let _ = (win, offset, multimem, out_ptr);
        no_device_api("ncclGetMultimemDevicePointer")
    }

    /// `ncclGetLsaDevicePointer`: refused.
    fn ncclGetLsaDevicePointer / pncclGetLsaDevicePointer(win: *mut c_void, offset: usize, lsa_rank: c_int, out_ptr: *mut *mut c_void) {
        let _ = (win, offset, lsa_rank, out_ptr);
        no_device_api("ncclGetLsaDevicePointer")
    }

    /// `ncclGetPeerDevicePointer`: refused.
    fn ncclGetPeerDevicePointer / pncclGetPeerDevicePointer(win: *mut c_void, offset: usize, peer: c_int, out_ptr: *mut *mut c_void) {
        let _ = (win, offset, peer, out_ptr);
        no_device_api("ncclGetPeerDevicePointer")
    }

    /// `ncclGetMultimemDeviceLeInfo`: refused.
    fn ncclGetMultimemDeviceLeInfo / pncclGetMultimemDeviceLeInfo(win: *mut c_void, offset: usize, le_id: *mut u32, le_offset: *mut usize) {
        let _ = (win, offset, le_id, le_offset);
        no_device_api("ncclGetMultimemDeviceLeInfo")
    }

    /// `ncclGetCftDeviceLeInfo`: refused.
    fn ncclGetCftDeviceLeInfo / pncclGetCftDeviceLeInfo(win: *mut c_void, offset: usize, peer_cft: c_int, cft_team: TeamC, le_id: *mut u32, le_offset: *mut usize) {
        let _ = (win, offset, peer_cft, cft_team, le_id, le_offset);
        no_device_api("ncclGetCftDeviceLeInfo")
    }

    /// `ncclGetPeerDeviceLeInfo`: refused.
    fn ncclGetPeerDeviceLeInfo / pncclGetPeerDeviceLeInfo(win: *mut c_void, offset: usize, peer_world: c_int, le_id: *mut u32, le_offset: *mut usize) {
        let _ = (win, offset, peer_world, le_id, le_offset);
        no_device_api("ncclGetPeerDeviceLeInfo")
    }

    /// `ncclLsaBarrierCreateRequirement`: refused.
    fn ncclLsaBarrierCreateRequirement / pncclLsaBarrierCreateRequirement(team: TeamC, n_barriers: c_int, out_handle: *mut c_void, out_req: *mut c_void) {
        let _ = (team, n_barriers, out_handle, out_req);
        no_device_api("ncclLsaBarrierCreateRequirement")
    }

    /// `ncclGinBarrierCreateRequirement`: refused.
    fn ncclGinBarrierCreateRequirement / pncclGinBarrierCreateRequirement(comm_h: *const c_void, team: TeamC, n_barriers: c_int, out_handle: *mut c_void, out_req: *mut c_void) {
        let _ = (comm_h, team, n_barriers, out_handle, out_req);
        no_device_api("ncclGinBarrierCreateRequirement")
    }

    /// `ncclLLA2ACreateRequirement`: refused.
    fn ncclLLA2ACreateRequirement / pncclLLA2ACreateRequirement(n_blocks: c_int, n_slots: c_int, out_handle: *mut c_void, out_req: *mut c_void) {
        let _ = (n_blocks, n_slots, out_handle, out_req);
        no_device_api("ncclLLA2ACreateRequirement")
    }

    /// `ncclGinOutboxCreateRequirement`: refused.
    fn ncclGinOutboxCreateRequirement / pncclGinOutboxCreateRequirement(n_blocks: c_int, size_log2: c_int, out_handle: *mut c_void, out_req: *mut c_void) {
        let _ = (n_blocks, size_log2, out_handle, out_req);
        no_device_api("ncclGinOutboxCreateRequirement")
    }

    /// `ncclGinInboxA2ACreateRequirement`: refused.
    fn ncclGinInboxA2ACreateRequirement / pncclGinInboxA2ACreateRequirement(peers: TeamC, n_blocks: c_int, size_log2: c_int, out_handle: *mut c_void, out_req: *mut c_void) {
        let _ = (peers, n_blocks, size_log2, out_handle, out_req);
        no_device_api("ncclGinInboxA2ACreateRequirement")
    }
}

/// Defines exported functions that return a value other than
/// `ncclResult_t`, each with its `pnccl*` twin.
macro_rules! plain_api {
    ($( $(#[$m:meta])* fn $name:ident / $pname:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty $body:block )*) => { $(
        $(#[$m])*
        #[unsafe(no_mangle)]
        pub extern "C" fn $name($($arg: $ty),*) -> $ret $body

        #[doc = concat!("[`", stringify!($name), "`] under its profiling name.")]
        #[unsafe(no_mangle)]
        pub extern "C" fn $pname($($arg: $ty),*) -> $ret {
            $name($($arg),*)
        }
    )* };
}

plain_api! {
    /// `ncclTeamWorld`: every rank, stride 1.
    fn ncclTeamWorld / pncclTeamWorld(comm: *const c_void) -> TeamC {
        team(comm, "world")
    }

    /// `ncclTeamLsa`: this rank alone (see the module's note).
    fn ncclTeamLsa / pncclTeamLsa(comm: *const c_void) -> TeamC {
        team(comm, "lsa")
    }

    /// `ncclTeamRail`: the ranks of this rank's LSA index on every LSA team: the world.
    fn ncclTeamRail / pncclTeamRail(comm: *const c_void) -> TeamC {
        team(comm, "rail")
    }

    /// `ncclTeamCft`: no collective fabric; this rank alone.
    fn ncclTeamCft / pncclTeamCft(comm: *const c_void, mode: c_int) -> TeamC {
        let _ = mode;
        team(comm, "cft")
    }

    /// `ncclTeamCftMultimem`: no multicast fabric; this rank alone.
    fn ncclTeamCftMultimem / pncclTeamCftMultimem(comm: *const c_void) -> TeamC {
        team(comm, "cft")
    }

    /// `ncclTeamRankToWorld`: the world rank of `rank` of `team` (NCCL's
    /// rule: this rank's world rank plus the index distance times the stride).
    fn ncclTeamRankToWorld / pncclTeamRankToWorld(comm: *const c_void, team: TeamC, rank: c_int) -> c_int {
        match get(comm) {
            Ok(c) => c.rank as c_int + (rank - team.rank) * team.stride,
            Err(_) => -1,
        }
    }

    /// `ncclTeamRankToLsa`: the LSA rank of `rank` of `team` (this rank's
    /// LSA rank is 0: its LSA team is itself).
    fn ncclTeamRankToLsa / pncclTeamRankToLsa(comm: *const c_void, team: TeamC, rank: c_int) -> c_int {
        match get(comm) {
            Ok(_) => (rank - team.rank) * team.stride,
            Err(_) => -1,
        }
    }

    /// `ncclLLA2ACalcSlots`: NCCL's formula, `maxElts × ⌈maxEltSize / 8⌉`.
    fn ncclLLA2ACalcSlots / pncclLLA2ACalcSlots(max_elts: c_int, max_elt_size: c_int) -> c_int {
        max_elts.saturating_mul((max_elt_size.max(0) + 7) / 8)
    }
}

/// `ncclResetDebugInitInternal`: NVIDIA's library exports it for its own
/// plugins; logging is set up once per process here, so nothing to reset.
#[unsafe(no_mangle)]
pub extern "C" fn ncclResetDebugInitInternal() {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::comms::{ncclCommDestroy, ncclCommInitAll};

    /// Two host communicators (ranks as threads of this process).
    fn comms() -> [*mut c_void; 2] {
        let mut c: [*mut c_void; 2] = [std::ptr::null_mut(); 2];
        // SAFETY: `c` holds 2 handles; a NULL device list is devices 0 and 1 (host memory here).
        assert_eq!(unsafe { ncclCommInitAll(c.as_mut_ptr().cast(), 2, std::ptr::null()) }, 0);
        c
    }

    fn last() -> String {
        // SAFETY: `last` returns this thread's NUL-terminated message, alive until its next failure.
        unsafe { std::ffi::CStr::from_ptr(crate::error::last()) }.to_string_lossy().into_owned()
    }

    fn blank(size: usize, magic: u32) -> PropertiesC {
        // SAFETY: PropertiesC is plain data; all zeroes is a valid value.
        let mut p: PropertiesC = unsafe { std::mem::zeroed() };
        (p.size, p.magic, p.version) = (size, magic, crate::abi::VERSION_CODE as u32);
        p
    }

    #[test]
    fn properties_say_rank_size_and_no_device_api() {
        let c = comms();
        for (r, &h) in c.iter().enumerate() {
            let mut p = blank(std::mem::size_of::<PropertiesC>(), API_MAGIC);
            // SAFETY: `h` is live; `p` is a whole, initialized struct.
            assert_eq!(unsafe { ncclCommQueryProperties(h, &mut p) }, 0);
            assert_eq!((p.rank, p.n_ranks, p.device_api_support, p.multimem_support), (r as c_int, 2, false, false));
            assert_eq!(p.n_lsa_teams, 2);
            let mut q = blank(std::mem::size_of::<PropertiesC>(), API_MAGIC);
            // SAFETY: as above.
            assert_eq!(unsafe { ncclCommQueryProperties(c[0], &mut q) }, 0);
            assert_eq!(p.comm_hash, q.comm_hash, "one hash on every rank");
        }
        let mut bad = blank(std::mem::size_of::<PropertiesC>(), 0x1234);
        // SAFETY: as above.
        assert_ne!(unsafe { ncclCommQueryProperties(c[0], &mut bad) }, 0);
        assert!(last().contains("NCCL_API_MAGIC"), "{}", last());
        assert_eq!(bad.rank, 0, "a refused call writes nothing");
        let mut small = blank(16, API_MAGIC);
        // SAFETY: as above.
        assert_ne!(unsafe { ncclCommQueryProperties(c[0], &mut small) }, 0);
        assert!(last().contains("props->size is 16"), "{}", last());
        for h in c {
            // SAFETY: live handles, destroyed once.
            assert_eq!(unsafe { ncclCommDestroy(h) }, 0);
        }
    }

    #[test]
    fn teams_compose_and_the_device_api_is_refused_by_name() {
        let c = comms();
        let world = ncclTeamWorld(c[1]);
        assert_eq!(world, TeamC { n_ranks: 2, rank: 1, stride: 1 });
        assert_eq!(ncclTeamLsa(c[1]), TeamC { n_ranks: 1, rank: 0, stride: 1 });
        assert_eq!(ncclTeamRail(c[1]), world);
        assert_eq!(pncclTeamRankToWorld(c[1], world, 0), 0);
        assert_eq!(ncclTeamRankToWorld(c[0], ncclTeamWorld(c[0]), 1), 1);
        assert_eq!(ncclTeamRankToLsa(c[1], ncclTeamLsa(c[1]), 0), 0);
        assert_eq!(ncclLLA2ACalcSlots(32, 16), 64);
        assert_eq!(ncclTeamWorld(std::ptr::null()).n_ranks, 0, "no communicator, an empty team");
        let mut out = std::ptr::null_mut();
        // SAFETY: a live handle; the requirements are never read (refused first).
        let rc = unsafe { ncclDevCommCreate(c[0], std::ptr::null(), (&mut out as *mut *mut c_void).cast()) };
        assert_eq!(rc, 5, "ncclInvalidUsage");
        let msg = last();
        assert!(msg.contains("ncclDevCommCreate") && msg.contains("device API"), "{msg}");
        // SAFETY: arguments are never read.
        assert_eq!(unsafe { pncclGetPeerDevicePointer(std::ptr::null_mut(), 0, 1, &mut out) }, 5);
        for h in c {
            // SAFETY: live handles, destroyed once.
            assert_eq!(unsafe { ncclCommDestroy(h) }, 0);
        }
    }
}
