//! Which path a communicator's device buffers take, decided from what
//! every rank tells the others when its first device call sets up (a
//! [`Card`] each, gathered through the bootstrap): all ranks decide the
//! same from the same cards.

use crate::config::DevicePath;

/// Most ranks the direct kernels serve (`OXCCL_MAX_RANKS` of cuda/args.h).
pub(crate) const MAX_DIRECT_RANKS: usize = 16;

const MAGIC: &[u8; 4] = b"OXDV";
/// Bytes of an encoded card.
pub(crate) const CARD_BYTES: usize = 112;

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
    /// `cuIpcGetMemHandle` of the allocation.
    pub handle: [u8; 64],
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
        b.extend_from_slice(&[0, 0]);
        b.extend_from_slice(&self.handle);
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
            handle: b[48..112].try_into().expect("64 bytes"),
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
    Direct { blocks: u32, window: u64, peers: Vec<Reach> },
}

/// Decides the route for rank `me` from every rank's card and host
/// identity. An error (on every rank) when some rank demands the direct
/// path and it cannot work.
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
            return Some(format!("rank {r} could not export a device window through CUDA IPC"));
        }
        let me_c = &cards[me];
        if let Some(r) = cards.iter().position(|c| c.pid == me_c.pid && c.uuid != me_c.uuid) {
            return Some(format!("rank {r} is in this process on another GPU (peer pointers need peer access)"));
        }
        None
    };
    match why_not() {
        Some(reason) => match cards.iter().position(|c| c.wants == DevicePath::Direct) {
            Some(r) => {
                Err(format!("rank {r} asked for the direct device path (OXCCL_DEVICE_PATH=direct), but {reason}"))
            }
            None => Ok(Route::Staged(reason)),
        },
        None => {
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
            let blocks = cards.iter().map(|c| c.blocks).min().unwrap_or(1);
            let window = cards.iter().map(|c| c.window).min().unwrap_or(0);
            Ok(Route::Direct { blocks, window, peers })
        }
    }
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
            handle: [pid as u8; 64],
        }
    }

    #[test]
    fn cards_survive_the_wire_and_bad_ones_are_named() {
        let c = Card { blocks: 7, window: 12345, ..card(42, 3, DevicePath::Direct) };
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
}
