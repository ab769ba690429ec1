//! The kernel cache on disk: compiled modules kept across processes, so a
//! communicator's first collective compiles nothing once the cache is warm.
//!
//! Where: `OXCCL_CACHE_DIR` when set (empty or `off`: no disk cache), else
//! `$XDG_CACHE_HOME/oxccl`, else `$HOME/.cache/oxccl`; entries live in its
//! `kernels/` folder, one file per module:
//! `sm_90-bfloat16-sum-nvrtc13.0-<source hash>.cubin` (or `compute_90-….ptx`).
//!
//! An entry is keyed by what made it: the kind and architecture (CUBIN for
//! `sm_XX`, PTX for `compute_XX`), the type, the operator, the NVRTC version
//! and a hash of the kernel source and the NVRTC options. Its file starts with
//! a header that repeats the key's digest and carries the payload's length and
//! SHA-256, so a truncated, corrupt or mismatched file is detected (and
//! recompiled with a WARN), never loaded. Entries are written to a temporary
//! file and renamed into place: two processes filling the cache at once each
//! write whole files, and a reader sees either no file or a whole one. A
//! directory that is missing and cannot be made, or is read-only, costs only
//! an INFO line: the kernels are compiled as without a cache.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use oxccl_core::DataType;
use sha2::{Digest, Sha256};

use crate::op::KernelOp;

/// The variable that names the cache directory.
pub const ENV: &str = "OXCCL_CACHE_DIR";

/// The first line of every entry.
const MAGIC: &str = "oxccl-kernel-cache 1";

/// What one entry holds: a module compiled by NVRTC `nvrtc` for (arch,
/// dtype, op), as a CUBIN for `sm_<arch>` or PTX for `compute_<arch>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    /// CUBIN (`sm_<arch>`) rather than PTX (`compute_<arch>`).
    pub cubin: bool,
    /// The architecture, major × 10 + minor.
    pub arch: u32,
    /// The element type.
    pub dtype: DataType,
    /// The operator.
    pub op: KernelOp,
    /// The NVRTC (major, minor) that compiled it.
    pub nvrtc: (u32, u32),
}

impl Key {
    /// `sm_90` or `compute_90`.
    pub fn target(&self) -> String {
        format!("{}_{}", if self.cubin { "sm" } else { "compute" }, self.arch)
    }

    /// The entry's file name (the source hash in it ties it to this build's kernels).
    pub fn file_name(&self) -> String {
        format!(
            "{}-{}-{}-nvrtc{}.{}-{}.{}",
            self.target(),
            self.dtype.name(),
            self.op,
            self.nvrtc.0,
            self.nvrtc.1,
            &source_hash()[..16],
            if self.cubin { "cubin" } else { "ptx" }
        )
    }

    /// The SHA-256 (hex) of everything that decides the entry's bytes: the
    /// kernel source, the NVRTC options and version.
    pub fn digest(&self) -> String {
        let mut h = Sha256::new();
        h.update(source_hash().as_bytes());
        for o in crate::source::options_for(self.arch, self.dtype, self.op, self.cubin) {
            h.update(o.as_bytes());
            h.update([0]);
        }
        h.update(format!("nvrtc {}.{}", self.nvrtc.0, self.nvrtc.1).as_bytes());
        hex(&h.finalize())
    }
}

/// The SHA-256 (hex) of the kernel source ([`crate::source::source`]).
pub fn source_hash() -> &'static str {
    static HASH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HASH.get_or_init(|| hex(&Sha256::digest(crate::source::source().as_bytes())))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What a lookup found.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    /// A whole, matching entry: its payload.
    Hit(Vec<u8>),
    /// No entry.
    Miss,
    /// An entry that cannot be used, and why (truncated, corrupt, another key).
    Corrupt(String),
}

/// A kernel cache directory (its `kernels/` folder holds the entries).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskCache {
    dir: PathBuf,
}

impl DiskCache {
    /// The cache rooted at `root` (entries in `root/kernels`).
    pub fn new(root: impl Into<PathBuf>) -> DiskCache {
        DiskCache { dir: root.into().join("kernels") }
    }

    /// The cache the environment names ([`ENV`], else the user's cache
    /// directory); `None` when `OXCCL_CACHE_DIR` is empty or `off`, or no home is known.
    pub fn from_env() -> Option<DiskCache> {
        match std::env::var_os(ENV) {
            Some(v) if v.is_empty() || v == "off" => None,
            Some(v) => Some(DiskCache::new(v)),
            None => {
                let base =
                    std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()).map(PathBuf::from).or_else(|| {
                        std::env::var_os("HOME").filter(|v| !v.is_empty()).map(|h| Path::new(&h).join(".cache"))
                    })?;
                Some(DiskCache::new(base.join("oxccl")))
            }
        }
    }

    /// The folder holding the entries.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path of `key`'s entry.
    pub fn path(&self, key: &Key) -> PathBuf {
        self.dir.join(key.file_name())
    }

    /// The entry of `key`, checked against its header.
    pub fn get(&self, key: &Key) -> Lookup {
        let path = self.path(key);
        match fs::read(&path) {
            Ok(bytes) => match parse(&bytes, &key.digest()) {
                Ok(payload) => Lookup::Hit(payload.to_vec()),
                Err(why) => Lookup::Corrupt(format!("{}: {why}", path.display())),
            },
            Err(e) if matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::NotADirectory) => Lookup::Miss,
            Err(e) => Lookup::Corrupt(format!("{}: {e}", path.display())),
        }
    }

    /// Writes `payload` as `key`'s entry, atomically (a temporary file in
    /// the same folder, renamed into place). Returns the entry's path.
    pub fn put(&self, key: &Key, payload: &[u8]) -> io::Result<PathBuf> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        fs::create_dir_all(&self.dir)?;
        let path = self.path(key);
        let tmp = self.dir.join(format!(
            ".{}.{}.{}.tmp",
            key.file_name(),
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let written = (|| {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(header(&key.digest(), payload).as_bytes())?;
            f.write_all(payload)?;
            f.sync_all()?;
            fs::rename(&tmp, &path)
        })();
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        written.map(|()| path)
    }

    /// A CUBIN of `sm_<arch>` for (dtype, op) of this build's source made by
    /// any NVRTC (the newest first): what a device of that architecture
    /// loads as is, whichever NVRTC made it, as long as its driver is new
    /// enough for that NVRTC (which the driver checks when loading). Used
    /// where there is no NVRTC at all, to run what a pack filled elsewhere.
    pub fn prebuilt(&self, arch: u32, dtype: DataType, op: KernelOp) -> Option<(Key, Vec<u8>)> {
        let mut found: Vec<Key> = fs::read_dir(&self.dir)
            .ok()?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter_map(|name| {
                let v = version_in(&name, arch, dtype, op)?;
                let key = Key { cubin: true, arch, dtype, op, nvrtc: v };
                (key.file_name() == name).then_some(key)
            })
            .collect();
        found.sort_by_key(|k| std::cmp::Reverse(k.nvrtc));
        found.into_iter().find_map(|k| match self.get(&k) {
            Lookup::Hit(bytes) => Some((k, bytes)),
            _ => None,
        })
    }
}

/// The NVRTC version in an entry name of `sm_<arch>`, (dtype, op).
fn version_in(name: &str, arch: u32, dtype: DataType, op: KernelOp) -> Option<(u32, u32)> {
    let rest = name.strip_prefix(&format!("sm_{arch}-{}-{op}-nvrtc", dtype.name()))?;
    let (ver, _) = rest.split_once('-')?;
    let (a, b) = ver.split_once('.')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// An entry's header: magic, key digest, payload SHA-256 and length, a blank line.
fn header(digest: &str, payload: &[u8]) -> String {
    format!("{MAGIC}\nkey {digest}\nsha256 {}\nlen {}\n\n", hex(&Sha256::digest(payload)), payload.len())
}

/// The payload of an entry, if its header is whole and matches `digest`.
fn parse<'a>(bytes: &'a [u8], digest: &str) -> Result<&'a [u8], String> {
    let end = bytes.windows(2).position(|w| w == b"\n\n").ok_or("no header")?;
    let head = std::str::from_utf8(&bytes[..end]).map_err(|_| "the header is not text")?;
    let payload = &bytes[end + 2..];
    let mut lines = head.lines();
    if lines.next() != Some(MAGIC) {
        return Err(format!("not an oxccl kernel cache entry (the first line is not {MAGIC:?})"));
    }
    let mut field = |name: &str| {
        lines.next().and_then(|l| l.strip_prefix(name)).and_then(|l| l.strip_prefix(' ')).map(str::to_string)
    };
    let (key, sum, len) = (field("key"), field("sha256"), field("len"));
    let (Some(key), Some(sum), Some(len)) = (key, sum, len) else {
        return Err("the header lacks key, sha256 or len".into());
    };
    if key != digest {
        return Err("made for another source, options or NVRTC (its key differs)".into());
    }
    if len.parse::<usize>().ok() != Some(payload.len()) {
        return Err(format!("truncated: the header says {len} bytes, the file holds {}", payload.len()));
    }
    if hex(&Sha256::digest(payload)) != sum {
        return Err("corrupt: the payload's SHA-256 differs from the header's".into());
    }
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        Key { cubin: true, arch: 90, dtype: DataType::Bfloat16, op: KernelOp::Sum, nvrtc: (13, 0) }
    }

    fn temp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("oxccl-cache-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn names_say_target_type_op_version_and_source() {
        let k = key();
        let name = k.file_name();
        assert!(name.starts_with("sm_90-bfloat16-sum-nvrtc13.0-"), "{name}");
        assert!(name.ends_with(".cubin"));
        assert_eq!(version_in(&name, 90, DataType::Bfloat16, KernelOp::Sum), Some((13, 0)));
        assert_eq!(version_in(&name, 80, DataType::Bfloat16, KernelOp::Sum), None);
        let ptx = Key { cubin: false, ..k };
        assert!(ptx.file_name().starts_with("compute_90-") && ptx.file_name().ends_with(".ptx"));
        assert_ne!(ptx.digest(), k.digest());
        assert_ne!(Key { nvrtc: (13, 1), ..k }.digest(), k.digest());
        assert_ne!(Key { op: KernelOp::Max, ..k }.digest(), k.digest());
    }

    #[test]
    fn put_then_get_hits_and_a_missing_entry_misses() {
        let root = temp("hit");
        let c = DiskCache::new(&root);
        assert_eq!(c.get(&key()), Lookup::Miss);
        let path = c.put(&key(), b"\x7fELF payload").unwrap();
        assert_eq!(c.get(&key()), Lookup::Hit(b"\x7fELF payload".to_vec()));
        assert_eq!(c.get(&Key { op: KernelOp::Min, ..key() }), Lookup::Miss);
        let left: Vec<_> = fs::read_dir(c.dir()).unwrap().map(|e| e.unwrap().path()).collect();
        assert_eq!(left, vec![path], "no temporary file is left behind");
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn corrupt_truncated_and_foreign_entries_are_named_not_loaded() {
        let root = temp("corrupt");
        let c = DiskCache::new(&root);
        let path = c.put(&key(), b"0123456789").unwrap();
        let good = fs::read(&path).unwrap();
        let mut flipped = good.clone();
        *flipped.last_mut().unwrap() ^= 1;
        fs::write(&path, &flipped).unwrap();
        assert!(matches!(c.get(&key()), Lookup::Corrupt(w) if w.contains("SHA-256")));
        fs::write(&path, &good[..good.len() - 3]).unwrap();
        assert!(matches!(c.get(&key()), Lookup::Corrupt(w) if w.contains("truncated")));
        fs::write(&path, b"garbage").unwrap();
        assert!(matches!(c.get(&key()), Lookup::Corrupt(w) if w.contains("header")));
        let other = Key { nvrtc: (12, 9), ..key() };
        let text = String::from_utf8_lossy(&good).replace(&key().digest(), &other.digest());
        fs::write(&path, text.as_bytes()).unwrap();
        assert!(matches!(c.get(&key()), Lookup::Corrupt(w) if w.contains("another")));
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn prebuilt_takes_the_newest_usable_cubin_of_the_arch() {
        let root = temp("prebuilt");
        let c = DiskCache::new(&root);
        assert_eq!(c.prebuilt(90, DataType::Bfloat16, KernelOp::Sum), None);
        c.put(&Key { nvrtc: (12, 9), ..key() }, b"twelve").unwrap();
        c.put(&Key { nvrtc: (13, 1), ..key() }, b"thirteen").unwrap();
        c.put(&Key { cubin: false, nvrtc: (13, 2), ..key() }, b"ptx").unwrap();
        let (k, b) = c.prebuilt(90, DataType::Bfloat16, KernelOp::Sum).unwrap();
        assert_eq!((k.nvrtc, b.as_slice()), ((13, 1), &b"thirteen"[..]));
        fs::write(c.path(&k), b"torn").unwrap();
        let (k, _) = c.prebuilt(90, DataType::Bfloat16, KernelOp::Sum).unwrap();
        assert_eq!(k.nvrtc, (12, 9), "a corrupt newest entry is passed over");
        assert_eq!(c.prebuilt(80, DataType::Bfloat16, KernelOp::Sum), None);
        assert_eq!(c.prebuilt(90, DataType::Float32, KernelOp::Sum), None);
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn an_unmakeable_directory_fails_put_and_misses() {
        let root = temp("file");
        fs::write(&root, b"a file where the folder should be").unwrap();
        let c = DiskCache::new(&root);
        assert!(c.put(&key(), b"x").is_err());
        assert_eq!(c.get(&key()), Lookup::Miss);
        fs::remove_file(&root).unwrap();
    }
}
