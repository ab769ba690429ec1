//! Which path a communicator's device buffers take, decided from what
//! every rank tells the others when its first device call sets up (a
//! [`Card`] each, gathered through the bootstrap): all ranks decide the
//! same from the same cards.

use crate::config::DevicePath;

/// Most ranks the direct kernels serve (`OXCCL_MAX_RANKS` of cuda/args.h).
pub(crate) const MAX_DIRECT_RANKS: usize = 16;

const MAGIC: &[u8; 4] = b"OXDV";
/// Bytes of an encoded card.
pub(crate) const CARD_BYTES: usize = 116;

/// What one rank tells the others about its GPU and its window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Card {
    pub pid: u32,
    /// The GPU's UUID.
    pub uuid: [u8; 16],
    /// The window allocation (flags, then the window) in the owner's
    /// address space, for ranks of the same process.
    pub base: u64,
    /// Usable window bytes (after the flag area).
    pub window: u64,
    /// Thread blocks the rank would launch.
    pub blocks: u32,
    /// The rank's configured path.
    pub wants: DevicePath,
    /// Whether the rank allocated a window and could export it.
    pub ready: bool,
    /// Whether the rank's context on its GPU goes through MPS (kernels of
    /// different processes then run at the same time, not time-sliced).
    pub mps: bool,
    /// The GPU's compute mode (`CU_DEVICE_ATTRIBUTE_COMPUTE_MODE`).
    pub compute_mode: u8,
    /// `cuIpcGetMemHandle` of the allocation.
    pub handle: [u8; 64],
    /// Blocks of the direct kernel the GPU holds at once (multiprocessors ×
    /// blocks each can hold at the kernel's block size; 0: unknown).
    pub resident: u32,
}

impl Card {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(CARD_BYTES);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&self.pid.to_le_bytes());
        b.extend_from_slice(&self.uuid);
        b.extend_from_slice(&self.base.to_le_bytes());
        b.extend_from_slice(&self.window.to_le_bytes());
        b.extend_from_slice(&self.blocks.to_le_bytes());
        b.push(match self.wants {
            DevicePath::Staged => 0,
            DevicePath::Auto => 1,
            DevicePath::Direct => 2,
        });
        b.push(self.ready as u8);
        b.push(self.mps as u8);
        b.push(self.compute_mode);
        b.extend_from_slice(&self.handle);
        b.extend_from_slice(&self.resident.to_le_bytes());
        debug_assert_eq!(b.len(), CARD_BYTES);
        b
    }

    /// Decodes rank `rank`'s card, or says what is wrong with it.
    pub fn decode(rank: usize, b: &[u8]) -> Result<Card, String> {
        if b.len() != CARD_BYTES || &b[..4] != MAGIC {
            return Err(format!("rank {rank} sent a malformed device card ({} bytes)", b.len()));
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let wants = match b[44] {
            0 => DevicePath::Staged,
            1 => DevicePath::Auto,
            2 => DevicePath::Direct,
            x => return Err(format!("rank {rank} sent an unknown device path {x}")),
        };
        Ok(Card {
            pid: u32_at(4),
            uuid: b[8..24].try_into().expect("16 bytes"),
            base: u64_at(24),
            window: u64_at(32),
            blocks: u32_at(40),
            wants,
            ready: b[45] != 0,
            mps: b[46] != 0,
            compute_mode: b[47],
            handle: b[48..112].try_into().expect("64 bytes"),
            resident: u32_at(112),
        })
    }
}

/// How this rank reaches a peer's window on the direct path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Reach {
    /// Its own.
    Own,
    /// A rank of this process on the same GPU: a plain pointer.
    Pointer(u64),
    /// Another process: open its IPC handle.
    Ipc([u8; 64]),
}

/// The decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// Through host memory; the reason (for the log).
    Staged(String),
    /// Kernels over the peers' windows.
    Direct {
        /// Blocks every rank launches.
        blocks: u32,
        window: u64,
        peers: Vec<Reach>,
        /// Ranks whose kernels share this rank's GPU (itself included).
        on_gpu: u32,
        /// Why `blocks` is below what the ranks asked for (for the log).
        capped: Option<String>,
        /// Why the direct path may crawl, taken anyway because a rank
        /// demanded it (for a warning).
        warning: Option<String>,
    },
}

/// The name of compute mode `m`.
fn compute_mode_name(m: u8) -> &'static str {
    match m {
        0 => "default",
        1 => "exclusive thread",
        2 => "prohibited",
        3 => "exclusive process",
        _ => "unknown",
    }
}

/// Ranks `(a, b)`, of different processes on the same GPU, whose kernels
/// the GPU time-slices: without MPS, kernels of different processes never
/// run at the same time, so one that spins waiting for the other's
/// advances only when the GPU switches contexts (milliseconds each).
fn time_sliced(cards: &[Card], hosts: &[&str]) -> Option<(usize, usize)> {
    (0..cards.len()).find_map(|a| {
        (a + 1..cards.len()).find_map(|b| {
            let (x, y) = (&cards[a], &cards[b]);
            let shared = x.uuid == y.uuid && hosts.get(a) == hosts.get(b) && x.pid != y.pid;
            (shared && !(x.mps && y.mps)).then_some((a, b))
        })
    })
}

/// The most blocks each rank may launch so that every rank's kernel is
/// resident at once on every GPU: the least over the GPUs of the blocks
/// the GPU holds divided by the ranks on it (kernels that wait for each
/// other must all run; a block that waits for one that cannot start
/// waits forever). `None` when no card says what its GPU holds.
pub(crate) fn grid_cap(cards: &[Card]) -> Option<u32> {
    let mut cap: Option<u32> = None;
    for c in cards {
        let on_gpu = cards.iter().filter(|d| d.uuid == c.uuid).count() as u32;
        let holds = cards.iter().filter(|d| d.uuid == c.uuid && d.resident > 0).map(|d| d.resident).min();
        if let Some(h) = holds {
            let each = h / on_gpu;
            cap = Some(cap.map_or(each, |x| x.min(each)));
        }
    }
    cap
}

/// How many ranks of the communicator run in rank `me`'s process (itself
/// included).
pub(crate) fn process_ranks(me: usize, cards: &[Card], hosts: &[&str]) -> usize {
    (0..cards.len()).filter(|&q| cards[q].pid == cards[me].pid && hosts.get(q) == hosts.get(me)).count()
}

/// Decides the route for rank `me` from every rank's card and host
/// identity. An error (on every rank) when some rank demands the direct
/// path and it cannot work. Ranks that share a GPU from different
/// processes take the staged path unless MPS is on, or a rank demands the
/// direct path (then with a warning).
pub(crate) fn decide(me: usize, cards: &[Card], hosts: &[&str]) -> Result<Route, String> {
    let why_not = || -> Option<String> {
        if let Some(r) = cards.iter().position(|c| c.wants == DevicePath::Staged) {
            return Some(format!("rank {r} asked for the staged path (OXCCL_DEVICE_PATH=staged)"));
        }
        if cards.len() > MAX_DIRECT_RANKS {
            return Some(format!("{} ranks: the direct kernels serve at most {MAX_DIRECT_RANKS}", cards.len()));
        }
        if let Some(r) = hosts.iter().position(|h| *h != hosts[0]) {
            return Some(format!("rank {r} is on another host than rank 0"));
        }
        if let Some(r) = cards.iter().position(|c| !c.ready) {
            return Some(format!(
                "rank {r} could not set up the direct path (a device window exported through CUDA IPC, and the \
                 kernels; its log says which)"
            ));
        }
        let me_c = &cards[me];
        if let Some(r) = cards.iter().position(|c| c.pid == me_c.pid && c.uuid != me_c.uuid) {
            return Some(format!("rank {r} is in this process on another GPU (peer pointers need peer access)"));
        }
        if grid_cap(cards) == Some(0) {
            return Some(format!(
                "a GPU cannot hold one block of the direct kernel of each of its ranks at once ({} ranks)",
                cards.len()
            ));
        }
        None
    };
    let demanded = cards.iter().position(|c| c.wants == DevicePath::Direct);
    if let Some(reason) = why_not() {
        return match demanded {
            Some(r) => {
                Err(format!("rank {r} asked for the direct device path (OXCCL_DEVICE_PATH=direct), but {reason}"))
            }
            None => Ok(Route::Staged(reason)),
        };
    }
    let slow = time_sliced(cards, hosts).map(|(a, b)| {
        format!(
            "ranks {a} and {b} share a GPU from different processes without MPS (compute mode {}): the GPU \
             time-slices their kernels, so a kernel waiting for the other's advances only at context switches",
            compute_mode_name(cards[a].compute_mode)
        )
    });
    let warning = match (slow, demanded) {
        (Some(reason), None) => {
            return Ok(Route::Staged(format!("{reason}; start the MPS daemon for the direct path")));
        }
        (Some(reason), Some(r)) => {
            Some(format!("rank {r} asked for the direct path (OXCCL_DEVICE_PATH=direct), but {reason}"))
        }
        (None, _) => None,
    };
    let mine = &cards[me];
    let peers = cards
        .iter()
        .enumerate()
        .map(|(q, c)| {
            if q == me {
                Reach::Own
            } else if c.pid == mine.pid {
                Reach::Pointer(c.base)
            } else {
                Reach::Ipc(c.handle)
            }
        })
        .collect();
    let asked = cards.iter().map(|c| c.blocks).min().unwrap_or(1);
    let window = cards.iter().map(|c| c.window).min().unwrap_or(0);
    let on_gpu = cards.iter().filter(|c| c.uuid == mine.uuid).count() as u32;
    let (blocks, capped) = match grid_cap(cards) {
        Some(cap) if cap < asked => (
            cap,
            Some(format!(
                "{cap} blocks per rank instead of {asked}: every rank's kernel must be resident at once, and a GPU \
                 holding {} blocks of it is shared by {on_gpu} ranks",
                cards.iter().filter(|c| c.uuid == mine.uuid).map(|c| c.resident).min().unwrap_or(0)
            )),
        ),
        _ => (asked, None),
    };
    Ok(Route::Direct { blocks, window, peers, on_gpu, capped, warning })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card(pid: u32, gpu: u8, wants: DevicePath) -> Card {
        Card {
            pid,
            uuid: [gpu; 16],
            base: 0x1000 * pid as u64,
            window: 8 << 20,
            blocks: 16,
            wants,
            ready: true,
            mps: true,
            compute_mode: 0,
            handle: [pid as u8; 64],
            resident: 132,
        }
    }

    #[test]
    fn cards_survive_the_wire_and_bad_ones_are_named() {
        let c = Card {
            blocks: 7,
            window: 12345,
            mps: false,
            compute_mode: 3,
            resident: 264,
            ..card(42, 3, DevicePath::Direct)
        };
        assert_eq!(Card::decode(0, &c.encode()).unwrap(), c);
        let mut bad = c.encode();
        bad[44] = 9;
        assert!(Card::decode(5, &bad).unwrap_err().contains("rank 5"));
        assert!(Card::decode(2, &bad[..50]).unwrap_err().contains("rank 2"));
    }

    #[test]
    fn processes_on_one_host_use_ipc_and_threads_use_pointers() {
        let cards = [card(10, 0, DevicePath::Auto), card(10, 0, DevicePath::Auto), card(11, 0, DevicePath::Auto)];
        let Route::Direct { peers, blocks, .. } = decide(0, &cards, &["h"; 3]).unwrap() else { panic!() };
        assert_eq!(peers, vec![Reach::Own, Reach::Pointer(0xa000), Reach::Ipc([11; 64])]);
        assert_eq!(blocks, 16);
        let mut few = cards.clone();
        few[2].blocks = 4;
        few[1].window = 1 << 20;
        let Route::Direct { blocks, window, .. } = decide(2, &few, &["h"; 3]).unwrap() else { panic!() };
        assert_eq!((blocks, window), (4, 1 << 20));
    }

    #[test]
    fn staged_when_direct_cannot_work_and_an_error_when_it_was_demanded() {
        let cards = [card(10, 0, DevicePath::Auto), card(11, 0, DevicePath::Auto)];
        assert!(matches!(decide(0, &cards, &["a", "b"]), Ok(Route::Staged(r)) if r.contains("another host")));
        let mut not_ready = cards.clone();
        not_ready[1].ready = false;
        assert!(matches!(decide(0, &not_ready, &["a"; 2]), Ok(Route::Staged(r)) if r.contains("rank 1")));
        let two_gpus = [card(10, 0, DevicePath::Auto), card(10, 1, DevicePath::Auto)];
        assert!(matches!(decide(0, &two_gpus, &["a"; 2]), Ok(Route::Staged(_))));
        let forced = [card(10, 0, DevicePath::Direct), card(11, 0, DevicePath::Auto)];
        let e = decide(1, &forced, &["a", "b"]).unwrap_err();
        assert!(e.contains("rank 0 asked for the direct") && e.contains("another host"), "{e}");
        let staged = [card(10, 0, DevicePath::Staged), card(11, 0, DevicePath::Auto)];
        assert!(matches!(decide(1, &staged, &["a"; 2]), Ok(Route::Staged(r)) if r.contains("rank 0 asked")));
        let many: Vec<Card> = (0..17).map(|p| card(p, 0, DevicePath::Auto)).collect();
        assert!(matches!(decide(0, &many, &["a"; 17]), Ok(Route::Staged(r)) if r.contains("at most 16")));
    }

    #[test]
    fn processes_sharing_a_gpu_without_mps_are_staged_unless_direct_is_demanded() {
        let no_mps = |pid, wants| Card { mps: false, ..card(pid, 0, wants) };
        // Threads of one process share a context: direct, MPS or not.
        let threads = [no_mps(10, DevicePath::Auto), no_mps(10, DevicePath::Auto)];
        assert!(matches!(decide(0, &threads, &["h"; 2]), Ok(Route::Direct { warning: None, .. })));
        // Processes on one GPU without MPS: staged, saying why.
        let procs = [no_mps(10, DevicePath::Auto), no_mps(11, DevicePath::Auto)];
        let Ok(Route::Staged(why)) = decide(1, &procs, &["h"; 2]) else { panic!() };
        assert!(why.contains("ranks 0 and 1") && why.contains("without MPS") && why.contains("compute mode default"));
        // One of them without MPS is enough.
        let half = [card(10, 0, DevicePath::Auto), no_mps(11, DevicePath::Auto)];
        assert!(matches!(decide(0, &half, &["h"; 2]), Ok(Route::Staged(_))));
        // With MPS on both: direct. On different GPUs: nothing is time-sliced.
        let mps = [card(10, 0, DevicePath::Auto), card(11, 0, DevicePath::Auto)];
        assert!(matches!(decide(0, &mps, &["h"; 2]), Ok(Route::Direct { warning: None, .. })));
        let apart = [no_mps(10, DevicePath::Auto), Card { mps: false, ..card(11, 1, DevicePath::Auto) }];
        assert!(matches!(decide(0, &apart, &["h"; 2]), Ok(Route::Direct { warning: None, .. })));
        // OXCCL_DEVICE_PATH=direct overrides, with a warning.
        let forced = [no_mps(10, DevicePath::Auto), no_mps(11, DevicePath::Direct)];
        let Ok(Route::Direct { warning: Some(w), .. }) = decide(0, &forced, &["h"; 2]) else { panic!() };
        assert!(w.contains("rank 1 asked for the direct path") && w.contains("time-slices"), "{w}");
        assert_eq!(process_ranks(0, &threads, &["h"; 2]), 2);
        assert_eq!(process_ranks(0, &procs, &["h"; 2]), 1);
        assert_eq!(process_ranks(0, &threads, &["a", "b"]), 1);
    }

    #[test]
    fn the_grid_is_capped_so_that_every_rank_sharing_a_gpu_is_resident() {
        let on = |pid, gpu, resident| Card { resident, ..card(pid, gpu, DevicePath::Auto) };
        // 132 SMs holding one block each, 16 ranks asking 16 blocks: 8 each.
        let crowd: Vec<Card> = (0..16).map(|_| on(10, 0, 132)).collect();
        assert_eq!(grid_cap(&crowd), Some(8));
        let Ok(Route::Direct { blocks, on_gpu, capped: Some(why), .. }) = decide(3, &crowd, &["h"; 16]) else {
            panic!()
        };
        assert_eq!((blocks, on_gpu), (8, 16));
        assert!(why.contains("8 blocks per rank instead of 16"), "{why}");
        // Room for everyone: the ranks' own choice, not capped.
        let two = [on(10, 0, 132), on(10, 0, 132)];
        assert!(matches!(decide(0, &two, &["h"; 2]), Ok(Route::Direct { blocks: 16, capped: None, .. })));
        // The tightest GPU decides for everyone (every rank launches the same grid).
        let mixed = [on(10, 0, 40), on(10, 0, 40), on(10, 1, 200), on(11, 1, 200)];
        assert_eq!(grid_cap(&mixed), Some(20));
        // Unknown (0) says nothing; a GPU that cannot hold one block each is staged.
        assert_eq!(grid_cap(&[on(10, 0, 0)]), None);
        let tiny: Vec<Card> = (0..4).map(|_| on(10, 0, 3)).collect();
        assert!(matches!(decide(0, &tiny, &["h"; 4]), Ok(Route::Staged(r)) if r.contains("cannot hold")));
    }
}
