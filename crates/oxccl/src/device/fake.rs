//! A device made of host memory, for testing the device path's host side:
//! "device memory" is a table of byte vectors addressed as `(index + 1) <<
//! 32 | offset`, and each stream is a thread running its work in order.

use super::backend::{Backend, Marker, Pinned, Words};
use super::{CudaStream, DeviceBuf};
use crate::buf::{Owned, Region};
use oxccl_core::{Error, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

type Work = Box<dyn FnOnce() + Send>;

#[derive(Default)]
pub(crate) struct FakeWords {
    counters: [AtomicU64; 2],
    status: AtomicU32,
    abort: AtomicBool,
}

impl Words for FakeWords {
    fn get(&self, i: usize) -> u64 {
        self.counters[i].load(Ordering::Acquire)
    }
    fn set(&self, i: usize, v: u64) {
        self.counters[i].store(v, Ordering::Release)
    }
    fn abort(&self) {
        self.abort.store(true, Ordering::Release)
    }
    fn status(&self) -> u32 {
        self.status.load(Ordering::Acquire)
    }
}

#[derive(Default)]
struct State {
    mem: Mutex<Vec<Vec<u8>>>,
    words: FakeWords,
}

impl State {
    fn locate(&self, b: DeviceBuf) -> Result<(usize, usize)> {
        let (i, off) = ((b.addr() >> 32) as usize, (b.addr() & 0xffff_ffff) as usize);
        let mem = self.mem.lock();
        match i.checked_sub(1).and_then(|i| mem.get(i)) {
            Some(v) if off + b.len() <= v.len() => Ok((i - 1, off)),
            _ => Err(Error::invalid(format!("{:#x}+{} is not fake device memory", b.addr(), b.len()))),
        }
    }
}

/// The fake device.
pub(crate) struct Fake {
    st: Arc<State>,
    streams: Mutex<HashMap<u64, mpsc::Sender<Work>>>,
    /// Every marker handed out (to tell what is still queued).
    markers: Mutex<Vec<Arc<AtomicBool>>>,
    /// What fakes made by [`Fake::beside`] share (ranks on one device).
    shared: Arc<Shared>,
    /// Each staging allocation takes this long (to let others run ahead).
    slow_pinned: Mutex<Duration>,
}

/// What several fakes record together.
#[derive(Default)]
pub(crate) struct Shared {
    /// Markers made by any of them so far.
    created: AtomicU64,
    /// Each staging allocation: (bytes, markers of this fake not yet
    /// passed then, markers made by any fake so far).
    pinned: Mutex<Vec<(usize, usize, u64)>>,
}

struct FakePinned {
    _mem: Owned,
    region: Region,
}

impl Pinned for FakePinned {
    fn region(&self) -> Region {
        self.region
    }
}

struct FakeMarker(Arc<AtomicBool>);

impl Marker for FakeMarker {
    fn done(&self) -> Result<bool> {
        Ok(self.0.load(Ordering::Acquire))
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Fake {
    pub fn new() -> Arc<Fake> {
        Fake::beside(&Arc::default())
    }

    /// A fake recording into `shared` with others (its memory, streams and
    /// words are its own).
    pub fn beside(shared: &Arc<Shared>) -> Arc<Fake> {
        Arc::new(Fake {
            st: Arc::default(),
            streams: Mutex::default(),
            markers: Mutex::default(),
            shared: shared.clone(),
            slow_pinned: Mutex::default(),
        })
    }

    /// Each staging allocation so far, by this fake and those beside it:
    /// (bytes, markers of the allocating fake not yet passed then, markers
    /// made by all of them so far).
    pub fn pinned_log(&self) -> Vec<(usize, usize, u64)> {
        self.shared.pinned.lock().clone()
    }

    /// Makes each staging allocation take `d`.
    pub fn slow_pinned(&self, d: Duration) {
        *self.slow_pinned.lock() = d;
    }

    /// A zeroed device allocation of `len` bytes.
    pub fn alloc(&self, len: usize) -> DeviceBuf {
        let mut mem = self.st.mem.lock();
        mem.push(vec![0; len]);
        DeviceBuf::new((mem.len() as u64) << 32, len)
    }

    pub fn write(&self, b: DeviceBuf, bytes: &[u8]) {
        let (i, off) = self.st.locate(b).unwrap();
        self.st.mem.lock()[i][off..off + bytes.len()].copy_from_slice(bytes);
    }

    pub fn read(&self, b: DeviceBuf) -> Vec<u8> {
        let (i, off) = self.st.locate(b).unwrap();
        self.st.mem.lock()[i][off..off + b.len()].to_vec()
    }

    fn enqueue(&self, s: CudaStream, w: Work) -> Result<()> {
        let mut streams = self.streams.lock();
        let tx = streams.entry(s.0).or_insert_with(|| {
            let (tx, rx) = mpsc::channel::<Work>();
            std::thread::spawn(move || {
                for w in rx {
                    w();
                }
            });
            tx
        });
        tx.send(w).map_err(|_| Error::Internal("fake stream gone".into()))
    }
}

impl Backend for Fake {
    fn words(&self) -> &dyn Words {
        &self.st.words
    }

    fn pinned(&self, bytes: usize) -> Result<Box<dyn Pinned>> {
        let pending = {
            let mut markers = self.markers.lock();
            markers.retain(|m| !m.load(Ordering::Acquire));
            markers.len()
        };
        let created = self.shared.created.load(Ordering::Acquire);
        self.shared.pinned.lock().push((bytes, pending, created));
        std::thread::sleep(*self.slow_pinned.lock());
        let mut mem = Owned::zeroed(bytes);
        let region = mem.region();
        Ok(Box::new(FakePinned { _mem: mem, region }))
    }

    fn check(&self, _what: &str, buf: DeviceBuf) -> Result<()> {
        self.st.locate(buf).map(|_| ())
    }

    fn enqueue_d2h(&self, s: CudaStream, dst: Region, src: DeviceBuf) -> Result<()> {
        let (i, off) = self.st.locate(src)?;
        let st = self.st.clone();
        self.enqueue(
            s,
            Box::new(move || {
                let mem = st.mem.lock();
                dst.write(|d| d.copy_from_slice(&mem[i][off..off + d.len()])).unwrap();
            }),
        )
    }

    fn enqueue_h2d(&self, s: CudaStream, dst: DeviceBuf, src: Region) -> Result<()> {
        let (i, off) = self.st.locate(dst)?;
        let st = self.st.clone();
        self.enqueue(s, Box::new(move || src.read(|b| st.mem.lock()[i][off..off + b.len()].copy_from_slice(b))))
    }

    fn enqueue_signal(&self, s: CudaStream, i: usize, v: u64) -> Result<()> {
        let st = self.st.clone();
        self.enqueue(s, Box::new(move || st.words.set(i, v)))
    }

    fn enqueue_wait(&self, s: CudaStream, i: usize, v: u64, timeout: Duration) -> Result<()> {
        let st = self.st.clone();
        self.enqueue(
            s,
            Box::new(move || {
                let start = Instant::now();
                while st.words.get(i) < v {
                    let code = if st.words.abort.load(Ordering::Acquire) {
                        2
                    } else if start.elapsed() > timeout {
                        1
                    } else {
                        std::thread::sleep(Duration::from_micros(20));
                        continue;
                    };
                    let _ = st.words.status.compare_exchange(0, code, Ordering::AcqRel, Ordering::Acquire);
                    return;
                }
            }),
        )
    }

    fn enqueue_after(&self, s: CudaStream, m: &dyn Marker) -> Result<()> {
        let flag = m.as_any().downcast_ref::<FakeMarker>().expect("a fake marker").0.clone();
        self.enqueue(
            s,
            Box::new(move || {
                while !flag.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_micros(20));
                }
            }),
        )
    }

    fn marker(&self, s: CudaStream) -> Result<Box<dyn Marker>> {
        let flag = Arc::new(AtomicBool::new(false));
        let f2 = flag.clone();
        self.markers.lock().push(flag.clone());
        self.shared.created.fetch_add(1, Ordering::AcqRel);
        self.enqueue(s, Box::new(move || f2.store(true, Ordering::Release)))?;
        Ok(Box::new(FakeMarker(flag)))
    }

    fn synchronize(&self, s: CudaStream, timeout: Duration) -> Result<()> {
        let m = self.marker(s)?;
        let start = Instant::now();
        while !m.done()? {
            if start.elapsed() > timeout {
                return Err(Error::Timeout(format!("fake stream {} still busy after {timeout:.0?}", s.0)));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        Ok(())
    }
}
