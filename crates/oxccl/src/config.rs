//! Configuration: an explicit [`Config`] first, then `OXCCL_*` variables,
//! then defaults.
//!
//! The environment is read here and nowhere else: [`Config::resolve`]
//! decides every setting once, and [`Resolved::fabric_options`] hands the
//! transports their typed settings, so a field a program sets is never
//! overridden by a variable a transport reads on its own. The bootstrap
//! interface of a fresh id comes the same way ([`Config::unique_id`],
//! [`unique_id`]).

use crate::programs::{self, ProgramId};
use oxccl_core::{Error, Result};
use oxccl_transport::Kind;
use oxccl_transport::fabric::{FabricOptions, ShmOptions, TcpOptions};
use oxccl_transport::id::UniqueId;
use std::time::Duration;

pub use oxccl_transport::fabric::RdmaOptions;
pub use oxccl_transport::rdma::env::{HcaFilter, IbOptions, IbProvider};

/// What a communicator may be told. Every field left `None` falls back to
/// its environment variable, then to the default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// Deadline of every wait (`OXCCL_TIMEOUT`, seconds; default 300).
    pub timeout: Option<Duration>,
    /// Force one transport between all ranks (`OXCCL_TRANSPORT=tcp|shm`;
    /// `mem` is used only among ranks of one process).
    pub transport: Option<Kind>,
    /// Network interface for TCP (`OXCCL_SOCKET_IFNAME`, NCCL's syntax).
    pub socket_ifname: Option<String>,
    /// Algorithm selection (`OXCCL_ALGO`, NCCL's grammar).
    pub algo: Option<String>,
    /// Compare every collective's arguments across ranks first
    /// (`OXCCL_CHECK=1`).
    pub check: Option<bool>,
    /// Bytes of each connection's FIFO (`OXCCL_BUFFSIZE`; default 4 MiB
    /// for memory and shared memory, 512 KiB for TCP, whose smaller
    /// chunks pipeline better through the kernel's socket buffers).
    pub buffsize: Option<usize>,
    /// Sockets per TCP connection (`OXCCL_NSOCKS`; default 2).
    pub nsocks: Option<usize>,
    /// How long a waiting rank polls (yielding the core to anyone
    /// runnable) before it sleeps until a peer rings (`OXCCL_SPIN_US`,
    /// microseconds; default 2000; 0 sleeps at once).
    pub spin: Option<Duration>,
    /// How device buffers travel (`OXCCL_DEVICE_PATH`): `auto` (default:
    /// direct where every rank is on one host and CUDA IPC works, else
    /// staged), `direct` (an error where it cannot work) or `staged`.
    pub device_path: Option<DevicePath>,
    /// Bytes of each rank's device window for the direct path
    /// (`OXCCL_DEVICE_WINDOW`; default 8 MiB).
    pub device_window: Option<usize>,
    /// Thread blocks of a direct collective kernel (`OXCCL_DEVICE_BLOCKS`,
    /// 1 to 64; default 16). Ranks sharing a GPU must fit on it together.
    pub device_blocks: Option<usize>,
    /// Bytes per pipelined chunk of the staged path (`OXCCL_STAGE_CHUNK`;
    /// default 4 MiB).
    pub stage_chunk: Option<usize>,
    /// What runs a collective on the direct path (`OXCCL_DEVICE_EXEC`):
    /// `auto` (default: the hand-written kernel, but the device executor
    /// for gather and scatter and wherever `OXCCL_ALGO` or a program file
    /// names the algorithm), `program` (the executor for every collective
    /// on the direct path; a program it cannot run is an error saying why)
    /// or `kernel`.
    pub device_exec: Option<DeviceExec>,
    /// Bytes of every device FIFO connection of the executor
    /// (`OXCCL_DEVICE_FIFO`; default 512 KiB, 8 slots): a program's
    /// messages may be half of it. The same on every rank.
    pub device_fifo: Option<usize>,
    /// Researchers' programs this communicator may run
    /// ([`crate::programs`]), besides those `OXCCL_ALGO_FILE` names
    /// (comma-separated JSON files, loaded and verified at init).
    pub programs: Vec<ProgramId>,
    /// Whether shared memory may read and write peers' memory directly
    /// (`process_vm_readv`, cross-memory attach) where the kernel allows it
    /// (`OXCCL_SHM_CMA`; default on).
    pub cma: Option<bool>,
    /// Messages of at least this many bytes go over shared memory by
    /// reference, copied once by the receiver straight from the sender's
    /// buffer (`OXCCL_SINGLE_COPY_MIN`: bytes, `auto` (default: from where
    /// this machine's measured single copy beats the FIFO's two, perhaps
    /// never) or `off`).
    pub single_copy_min: Option<SingleCopy>,
    /// Encrypt TCP data connections after their authenticated handshake
    /// (AES-256-GCM keyed from the communicator's secret; `OXCCL_ENCRYPT`,
    /// default off). Every rank must agree: init fails naming a rank that
    /// differs.
    pub encrypt: Option<bool>,
    /// Reproducible reductions (`OXCCL_DETERMINISTIC=1`; default off):
    /// every floating-point all-reduce, reduce-scatter and reduce computes
    /// each element in the canonical order of [`oxccl_algo::canon`]
    /// (the balanced tree over the ranks in rank order), whatever the
    /// size, algorithm, transport or placement, so the same inputs give
    /// the same bits. The tuner then runs only programs the verifier
    /// proves canonical. Every rank must agree: init fails naming a rank
    /// that differs.
    pub deterministic: Option<bool>,
    /// RDMA settings: `None` reads the `OXCCL_IB_*` variables (see
    /// `oxccl_transport::rdma::env`; a bad value fails init, naming it),
    /// then the defaults; `Some` is used as it is and no `OXCCL_IB_*`
    /// variable is read (start from `RdmaOptions::default()`).
    pub rdma: Option<RdmaOptions>,
    /// A topology file that replaces discovery (`OXCCL_TOPO_FILE`, JSON
    /// as `OXCCL_TOPO_DUMP_FILE` writes it, or as small as
    /// `{"hosts":[{"id":"a","ranks":[0,2]},{"id":"b","ranks":[1,3]}]}`):
    /// which ranks algorithms treat as sharing a host (transports still
    /// use shared memory wherever processes really share one). Every rank
    /// must read the same grouping: init fails naming a rank that differs.
    pub topo_file: Option<std::path::PathBuf>,
    /// Rank 0 writes the communicator's topology here as JSON at init
    /// (`OXCCL_TOPO_DUMP_FILE`).
    pub topo_dump_file: Option<std::path::PathBuf>,
    /// Channels a collective runs on (`OXCCL_NCHANNELS`, 1 to 16; device
    /// collectives at most 4, the device FIFOs' channels):
    /// the data is cut into that many parts, each the algorithm's program
    /// on connections of its own, run concurrently
    /// ([`oxccl_algo::channels`]). By default the tuner chooses per
    /// collective: one channel per rail between hosts (interfaces, HCA
    /// ports) where the collective is large enough to give each a share
    /// worth its latency ([`crate::tuner::min_channel_bytes`]), else one.
    /// `OXCCL_MIN_NCHANNELS` and `OXCCL_MAX_NCHANNELS` bound it. Every
    /// rank must agree.
    pub nchannels: Option<usize>,
}

/// When shared memory sends a message by reference
/// ([`Config::single_copy_min`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SingleCopy {
    /// From the measured crossover of this machine (perhaps never).
    #[default]
    Auto,
    /// From this many bytes on.
    From(usize),
    /// Never.
    Off,
}

impl std::str::FromStr for SingleCopy {
    type Err = Error;
    fn from_str(s: &str) -> Result<SingleCopy> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(SingleCopy::Auto),
            "off" | "never" | "0" => Ok(SingleCopy::Off),
            n => oxccl_core::size::parse_size(n).map(SingleCopy::From).ok_or_else(|| {
                Error::invalid(format!(
                    "OXCCL_SINGLE_COPY_MIN={s:?}: expected auto, off or {}",
                    oxccl_core::size::SIZE_FORMS
                ))
            }),
        }
    }
}

/// How device buffers travel between ranks ([`Config::device_path`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DevicePath {
    /// Direct where possible, else staged.
    #[default]
    Auto,
    /// Kernels read the peers' GPU memory (CUDA IPC or one process).
    Direct,
    /// Through host memory and the host transports.
    Staged,
}

/// What runs collectives on the direct device path (see
/// [`Config::device_exec`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceExec {
    /// The hand-written kernel, the executor where an algorithm is named
    /// or the kernel has none.
    #[default]
    Auto,
    /// The device executor wherever it can run the program.
    Program,
    /// The hand-written kernel only.
    Kernel,
}

impl std::str::FromStr for DeviceExec {
    type Err = Error;
    fn from_str(s: &str) -> Result<DeviceExec> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(DeviceExec::Auto),
            "program" | "executor" => Ok(DeviceExec::Program),
            "kernel" => Ok(DeviceExec::Kernel),
            _ => Err(Error::invalid(format!("OXCCL_DEVICE_EXEC={s:?}: expected auto, program or kernel"))),
        }
    }
}

impl std::str::FromStr for DevicePath {
    type Err = Error;
    fn from_str(s: &str) -> Result<DevicePath> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(DevicePath::Auto),
            "direct" | "ipc" => Ok(DevicePath::Direct),
            "staged" | "host" => Ok(DevicePath::Staged),
            _ => Err(Error::invalid(format!("OXCCL_DEVICE_PATH={s:?}: expected auto, direct or staged"))),
        }
    }
}

/// A [`Config`] with every field decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// See [`Config::timeout`].
    pub timeout: Duration,
    /// See [`Config::transport`].
    pub transport: Option<Kind>,
    /// See [`Config::socket_ifname`].
    pub socket_ifname: Option<String>,
    /// See [`Config::algo`].
    pub algo: Option<String>,
    /// Where `algo` came from: `Config::algo`, `OXCCL_ALGO` or
    /// `NCCL_ALGO` (the log says what decided an algorithm).
    pub algo_from: String,
    /// See [`Config::check`].
    pub check: bool,
    /// See [`Config::buffsize`].
    pub buffsize: usize,
    /// The FIFO of TCP connections (the same as `buffsize` when set).
    pub tcp_buffsize: usize,
    /// See [`Config::nsocks`].
    pub nsocks: usize,
    /// See [`Config::spin`].
    pub spin: Duration,
    /// See [`Config::topo_file`].
    pub topo_file: Option<std::path::PathBuf>,
    /// See [`Config::topo_dump_file`].
    pub topo_dump_file: Option<std::path::PathBuf>,
    /// See [`Config::nchannels`]: the count asked for and the bounds.
    pub nchannels: ChannelSettings,
    /// See [`Config::device_path`].
    pub device_path: DevicePath,
    /// See [`Config::device_window`].
    pub device_window: usize,
    /// See [`Config::device_blocks`].
    pub device_blocks: usize,
    /// See [`Config::stage_chunk`].
    pub stage_chunk: usize,
    /// See [`Config::device_exec`].
    pub device_exec: DeviceExec,
    /// See [`Config::device_fifo`] (a multiple of 128).
    pub device_fifo: usize,
    /// [`Config::programs`] and those of `OXCCL_ALGO_FILE`.
    pub programs: Vec<ProgramId>,
    /// See [`Config::cma`].
    pub cma: bool,
    /// See [`Config::single_copy_min`].
    pub single_copy: SingleCopy,
    /// See [`Config::encrypt`].
    pub encrypt: bool,
    /// See [`Config::deterministic`].
    pub deterministic: bool,
    /// See [`Config::rdma`].
    pub rdma: RdmaOptions,
}

impl Resolved {
    /// What the transports are built with: the shared settings, and each
    /// provider's own.
    pub fn fabric_options(&self) -> FabricOptions {
        FabricOptions {
            transport: self.transport,
            buffsize: self.buffsize,
            timeout: self.timeout,
            shm: ShmOptions {
                cma: self.cma,
                single_copy_min: match self.single_copy {
                    SingleCopy::Auto => None,
                    SingleCopy::From(n) => Some(n),
                    SingleCopy::Off => Some(usize::MAX),
                },
            },
            tcp: TcpOptions {
                streams: self.nsocks,
                buffer: self.tcp_buffsize,
                encrypt: self.encrypt,
                ifname: self.socket_ifname.clone(),
                ..FabricOptions::default().tcp
            },
            rdma: self.rdma.clone(),
        }
    }
}

/// Whether `NCCL_*` names stand in for their `OXCCL_*` twins.
static NCCL_NAMES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The `OXCCL_*` variables whose `NCCL_*` names NCCL's users know.
pub const NCCL_TWINS: [&str; 6] = ["DEBUG", "DEBUG_FILE", "ALGO", "SOCKET_IFNAME", "BUFFSIZE", "COMM_ID"];

/// From now on, in this process, `NCCL_DEBUG`, `NCCL_DEBUG_FILE`,
/// `NCCL_ALGO`, `NCCL_SOCKET_IFNAME`, `NCCL_BUFFSIZE` and `NCCL_COMM_ID`
/// are read where their `OXCCL_*` twin is unset (the twin wins when both
/// are set). The C ABI turns this on: its users set NCCL's names.
pub fn honour_nccl_names() {
    NCCL_NAMES.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Variable `name` (an `OXCCL_*` name), or its `NCCL_*` twin where
/// [`honour_nccl_names`] is on: the name that was set and its trimmed,
/// non-empty value.
pub fn lookup(name: &str) -> Option<(String, String)> {
    let get = |n: &str| std::env::var(n).ok().map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
    if let Some(v) = get(name) {
        return Some((name.to_string(), v));
    }
    let twin = name.strip_prefix("OXCCL_").filter(|t| NCCL_TWINS.contains(t))?;
    if !NCCL_NAMES.load(std::sync::atomic::Ordering::Relaxed) {
        return None;
    }
    let nccl = format!("NCCL_{twin}");
    get(&nccl).map(|v| (nccl, v))
}

fn env(name: &str) -> Option<String> {
    lookup(name).map(|(_, v)| v)
}

/// An explicit setting, else variable `name`, else `default`.
fn num_setting<T: std::str::FromStr>(explicit: Option<T>, name: &str, default: T) -> Result<T> {
    match explicit {
        Some(v) => Ok(v),
        None => Ok(parse_num(name)?.unwrap_or(default)),
    }
}

fn parse_num<T: std::str::FromStr>(name: &str) -> Result<Option<T>> {
    match lookup(name) {
        None => Ok(None),
        Some((name, v)) => v.parse().map(Some).map_err(|_| Error::invalid(format!("{name}={v:?} is not a number"))),
    }
}

/// A size variable (`4M`, `512K`, bytes): an error names it and what it
/// accepts.
fn parse_bytes(name: &str) -> Result<Option<usize>> {
    match lookup(name) {
        None => Ok(None),
        Some((name, v)) => oxccl_core::size::parse_size(&v)
            .map(Some)
            .ok_or_else(|| Error::invalid(format!("{name}={v:?}: expected {}", oxccl_core::size::SIZE_FORMS))),
    }
}

/// An explicit size, else size variable `name`, else `default`.
fn size_setting(explicit: Option<usize>, name: &str, default: usize) -> Result<usize> {
    match explicit {
        Some(v) => Ok(v),
        None => Ok(parse_bytes(name)?.unwrap_or(default)),
    }
}

/// Checks a size setting against its range; the error names the variable
/// that set it (or the `Config` field, when set explicitly).
fn in_range(what: &str, name: &str, explicit: bool, v: usize, lo: usize, hi: usize) -> Result<()> {
    if (lo..=hi).contains(&v) {
        return Ok(());
    }
    let set_by = if explicit {
        "Config".to_string()
    } else {
        lookup(name).map(|(n, s)| format!("{n}={s:?}")).unwrap_or_else(|| name.to_string())
    };
    let human = |b: usize| match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    };
    let range = if hi == usize::MAX {
        format!("at least {}", human(lo))
    } else {
        format!("between {} and {}", human(lo), human(hi))
    };
    Err(Error::invalid(format!("{set_by}: {what} {v} must be {range}")))
}

/// Parses a transport name (`OXCCL_TRANSPORT`).
pub fn parse_kind(s: &str) -> Result<Kind> {
    s.parse::<Kind>().map_err(|e| match e {
        Error::InvalidArgument(m) => Error::invalid(format!("OXCCL_TRANSPORT: {m}")),
        other => other,
    })
}

/// A boolean variable: `1`/`0`, `true`/`false`, `yes`/`no`, `on`/`off`.
fn parse_bool(name: &str) -> Result<Option<bool>> {
    match env(name).map(|v| v.to_ascii_lowercase()) {
        None => Ok(None),
        Some(v) => match v.as_str() {
            "1" | "true" | "yes" | "on" => Ok(Some(true)),
            "0" | "false" | "no" | "off" => Ok(Some(false)),
            _ => Err(Error::invalid(format!("{name}={v:?}: expected 1 or 0"))),
        },
    }
}

/// A fresh id on the interface `OXCCL_SOCKET_IFNAME` (or, where the C ABI
/// honours NCCL's names, `NCCL_SOCKET_IFNAME`) selects, else the default
/// one ([`Config::unique_id`] of the default configuration). What
/// `ncclGetUniqueId` and Python's `unique_id` return.
pub fn unique_id() -> Result<UniqueId> {
    Config::default().unique_id()
}

impl Config {
    /// A fresh id (rank 0's bootstrap listener bound now) on the interface
    /// [`socket_ifname`](Config::socket_ifname) selects, else
    /// `OXCCL_SOCKET_IFNAME`, else the default one
    /// ([`UniqueId::new_on`]).
    pub fn unique_id(&self) -> Result<UniqueId> {
        UniqueId::new_on(self.ifname().as_deref())
    }

    /// See [`Config::socket_ifname`].
    fn ifname(&self) -> Option<String> {
        self.socket_ifname.clone().or_else(|| env("OXCCL_SOCKET_IFNAME"))
    }

    /// Fills every unset field from the environment and defaults; an
    /// error names a malformed variable.
    pub fn resolve(&self) -> Result<Resolved> {
        let timeout = match self.timeout {
            Some(t) => t,
            None => match env("OXCCL_TIMEOUT") {
                None => Duration::from_secs(300),
                Some(v) => {
                    let s: f64 =
                        v.parse().map_err(|_| Error::invalid(format!("OXCCL_TIMEOUT={v:?} is not seconds")))?;
                    if !(s > 0.0 && s.is_finite()) {
                        return Err(Error::invalid(format!("OXCCL_TIMEOUT={v:?} must be positive")));
                    }
                    Duration::from_secs_f64(s)
                }
            },
        };
        let transport = match self.transport {
            Some(k) => Some(k),
            None => env("OXCCL_TRANSPORT").map(|v| parse_kind(&v)).transpose()?,
        };
        let check = match self.check {
            Some(c) => c,
            None => env("OXCCL_CHECK").is_some_and(|v| v != "0"),
        };
        let (buffsize, tcp_buffsize) = match self.buffsize {
            Some(b) => (b, b),
            None => match parse_bytes("OXCCL_BUFFSIZE")? {
                Some(b) => (b, b),
                None => (4 << 20, 512 << 10),
            },
        };
        in_range("buffer size", "OXCCL_BUFFSIZE", self.buffsize.is_some(), buffsize, 16 << 10, 1 << 30)?;
        let nsocks = num_setting(self.nsocks, "OXCCL_NSOCKS", 2)?;
        if !(1..=16).contains(&nsocks) {
            let set_by = match self.nsocks {
                Some(_) => "Config::nsocks".to_string(),
                None => lookup("OXCCL_NSOCKS").map_or_else(|| "OXCCL_NSOCKS".into(), |(n, v)| format!("{n}={v:?}")),
            };
            return Err(Error::invalid(format!("{set_by}: sockets per connection {nsocks} must be 1 to 16")));
        }
        let spin = match self.spin {
            Some(s) => s,
            None => Duration::from_micros(parse_num("OXCCL_SPIN_US")?.unwrap_or(2000)),
        };
        if spin > Duration::from_secs(1) {
            return Err(Error::invalid(format!("spin time {spin:?} must be at most 1 s")));
        }
        let device_path = match self.device_path {
            Some(p) => p,
            None => env("OXCCL_DEVICE_PATH").map(|v| v.parse()).transpose()?.unwrap_or_default(),
        };
        let device_window = size_setting(self.device_window, "OXCCL_DEVICE_WINDOW", 8 << 20)?;
        in_range(
            "device window",
            "OXCCL_DEVICE_WINDOW",
            self.device_window.is_some(),
            device_window,
            64 << 10,
            1 << 30,
        )?;
        let device_blocks = num_setting(self.device_blocks, "OXCCL_DEVICE_BLOCKS", 16)?;
        if !(1..=64).contains(&device_blocks) {
            return Err(Error::invalid(format!("device blocks {device_blocks} must be 1 to 64")));
        }
        let device_exec = match self.device_exec {
            Some(e) => e,
            None => env("OXCCL_DEVICE_EXEC").map(|v| v.parse()).transpose()?.unwrap_or_default(),
        };
        let device_fifo = size_setting(self.device_fifo, "OXCCL_DEVICE_FIFO", 512 << 10)?;
        in_range("device FIFO", "OXCCL_DEVICE_FIFO", self.device_fifo.is_some(), device_fifo, 4 << 10, 64 << 20)?;
        let stage_chunk = size_setting(self.stage_chunk, "OXCCL_STAGE_CHUNK", 4 << 20)?;
        in_range("stage chunk", "OXCCL_STAGE_CHUNK", self.stage_chunk.is_some(), stage_chunk, 1, usize::MAX)?;
        let mut programs = self.programs.clone();
        for file in env("OXCCL_ALGO_FILE").iter().flat_map(|v| v.split(',')).map(str::trim).filter(|f| !f.is_empty()) {
            for id in programs::load(file).map_err(|e| prefix("OXCCL_ALGO_FILE", e))? {
                if !programs.contains(&id) {
                    programs.push(id);
                }
            }
        }
        let cma = match self.cma {
            Some(c) => c,
            None => parse_bool("OXCCL_SHM_CMA")?.unwrap_or(true),
        };
        let encrypt = match self.encrypt {
            Some(e) => e,
            None => parse_bool("OXCCL_ENCRYPT")?.unwrap_or(false),
        };
        let deterministic = match self.deterministic {
            Some(d) => d,
            None => parse_bool("OXCCL_DETERMINISTIC")?.unwrap_or(false),
        };
        let single_copy = match self.single_copy_min {
            Some(s) => s,
            None => env("OXCCL_SINGLE_COPY_MIN").map(|v| v.parse()).transpose()?.unwrap_or_default(),
        };
        let (algo, algo_from) = match &self.algo {
            Some(a) => (Some(a.clone()), "Config::algo".to_string()),
            None => match lookup("OXCCL_ALGO") {
                Some((name, v)) => (Some(v), name),
                None => (None, "OXCCL_ALGO".to_string()),
            },
        };
        let rdma = match &self.rdma {
            Some(r) => r.clone(),
            None => RdmaOptions::from_lookup(env)?,
        };
        Ok(Resolved {
            rdma,
            programs,
            cma,
            encrypt,
            deterministic,
            single_copy,
            device_path,
            device_window: device_window / 256 * 256,
            device_blocks,
            stage_chunk,
            device_exec,
            device_fifo: device_fifo / 128 * 128,
            timeout,
            transport,
            socket_ifname: self.ifname(),
            algo,
            algo_from,
            check,
            buffsize: buffsize.next_power_of_two(),
            tcp_buffsize: tcp_buffsize.next_power_of_two(),
            nsocks,
            spin,
            nchannels: self.channels()?,
            topo_file: self.topo_file.clone().or_else(|| env("OXCCL_TOPO_FILE").map(Into::into)),
            topo_dump_file: self.topo_dump_file.clone().or_else(|| env("OXCCL_TOPO_DUMP_FILE").map(Into::into)),
        })
    }
}

impl Config {
    /// [`Config::nchannels`] within `OXCCL_MIN_NCHANNELS` and
    /// `OXCCL_MAX_NCHANNELS`; an error names a setting out of 1 to 16.
    fn channels(&self) -> Result<ChannelSettings> {
        let max = oxccl_algo::channels::MAX;
        let check = |what: &str, v: usize| {
            if (1..=max).contains(&v) {
                Ok(v)
            } else {
                Err(Error::invalid(format!("{what}: {v} channels; use 1 to {max}")))
            }
        };
        let want = match self.nchannels {
            Some(n) => Some(check("Config::nchannels", n)?),
            None => parse_num("OXCCL_NCHANNELS")?.map(|n| check("OXCCL_NCHANNELS", n)).transpose()?,
        };
        let lo = parse_num("OXCCL_MIN_NCHANNELS")?.map_or(Ok(1), |n| check("OXCCL_MIN_NCHANNELS", n))?;
        let hi = parse_num("OXCCL_MAX_NCHANNELS")?.map_or(Ok(max), |n| check("OXCCL_MAX_NCHANNELS", n))?;
        if lo > hi {
            return Err(Error::invalid(format!("OXCCL_MIN_NCHANNELS={lo} is above OXCCL_MAX_NCHANNELS={hi}")));
        }
        Ok(ChannelSettings { want: want.map(|w| w.clamp(lo, hi)), lo, hi })
    }
}

/// `OXCCL_NCHANNELS` (or [`Config::nchannels`]) and its bounds, resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelSettings {
    /// The count asked for, within the bounds; `None`: the tuner's.
    pub want: Option<usize>,
    /// `OXCCL_MIN_NCHANNELS` (default 1).
    pub lo: usize,
    /// `OXCCL_MAX_NCHANNELS` (default 16).
    pub hi: usize,
}

impl ChannelSettings {
    /// What the tuner may choose among where traffic between hosts
    /// spreads over `rails`: the count asked for, or up to one channel
    /// per rail (within the bounds).
    pub fn choice(&self, rails: usize) -> crate::tuner::ChannelChoice {
        match self.want {
            Some(n) => crate::tuner::ChannelChoice { rails, ..crate::tuner::ChannelChoice::fixed(n) },
            None => {
                crate::tuner::ChannelChoice { fixed: false, lo: self.lo, most: rails.clamp(self.lo, self.hi), rails }
            }
        }
    }
}

fn prefix(what: &str, e: Error) -> Error {
    match e {
        Error::InvalidArgument(m) => Error::invalid(format!("{what}: {m}")),
        Error::InvalidProgram(m) => Error::program(format!("{what}: {m}")),
        other => other,
    }
}

/// Where log lines go: stderr, or the file `OXCCL_DEBUG_FILE` names
/// (NCCL's `%h` and `%p` become the host name and the process id).
fn log_file() -> Option<std::fs::File> {
    let (name, pattern) = lookup("OXCCL_DEBUG_FILE")?;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let path = pattern.replace("%h", host.trim()).replace("%p", &std::process::id().to_string());
    match std::fs::OpenOptions::new().create(true).append(true).open(&path) {
        Ok(f) => Some(f),
        Err(e) => {
            eprintln!("oxccl: {name}={pattern:?}: cannot open {path:?} ({e}); logging to stderr");
            None
        }
    }
}

/// The level `OXCCL_DEBUG` asks for, upper case (`None`: unset).
fn debug_level() -> Option<String> {
    env("OXCCL_DEBUG").map(|v| v.to_ascii_uppercase())
}

/// The second handle on the log file, for [`announce`].
static ANNOUNCE: std::sync::OnceLock<Option<parking_lot::Mutex<std::fs::File>>> = std::sync::OnceLock::new();

/// Starts logging to stderr (or `OXCCL_DEBUG_FILE`) at `OXCCL_DEBUG`'s
/// level (`WARN`, `INFO`, `TRACE`; NCCL's `VERSION` and `ABORT` read as
/// WARN, `VERSION` printing only [`announce`]'s line), once per process.
/// Without the variable, warnings are still printed. Colour only on a
/// terminal.
///
/// A message logged before this runs is lost (`tracing` drops events that
/// no subscriber sees), so every public entry point that can log calls it
/// first: [`Communicator::init`](crate::Communicator::init),
/// [`from_env`](crate::Communicator::from_env),
/// [`with_launch_secret`](crate::with_launch_secret) (before its warning),
/// the C ABI's set-up.
pub fn init_logging() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        use std::io::IsTerminal;
        let level = match debug_level().as_deref() {
            Some("TRACE") => "oxccl=trace,oxccl_transport=trace",
            Some("INFO") => "oxccl=info,oxccl_transport=info",
            Some("DEBUG") => "oxccl=debug,oxccl_transport=debug",
            Some("NONE") | Some("OFF") => "off",
            _ => "oxccl=warn,oxccl_transport=warn",
        };
        let file = log_file();
        let _ = ANNOUNCE.set(file.as_ref().and_then(|f| f.try_clone().ok()).map(parking_lot::Mutex::new));
        let builder =
            tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::new(level)).with_target(false);
        let _ = match file {
            Some(f) => builder.with_ansi(false).with_writer(std::sync::Mutex::new(f)).try_init(),
            None => builder.with_ansi(std::io::stderr().is_terminal()).with_writer(std::io::stderr).try_init(),
        };
    });
}

/// Prints `line` where the logs go when `OXCCL_DEBUG` is `VERSION`,
/// `INFO`, `DEBUG` or `TRACE` (NCCL prints its version line so).
pub fn announce(line: &str) {
    use std::io::Write;
    init_logging();
    if !matches!(debug_level().as_deref(), Some("VERSION" | "INFO" | "DEBUG" | "TRACE")) {
        return;
    }
    match ANNOUNCE.get().and_then(|f| f.as_ref()) {
        Some(f) => {
            let _ = writeln!(f.lock(), "{line}");
        }
        None => eprintln!("{line}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explicit_algo_says_where_it_came_from() {
        let r = Config { algo: Some("ring".into()), ..Default::default() }.resolve().unwrap();
        assert_eq!((r.algo.as_deref(), r.algo_from.as_str()), (Some("ring"), "Config::algo"));
    }
}
