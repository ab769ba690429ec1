//! The optimizer's own memory accounting: every buffer it holds is a
//! [`Tracked`] that charges a shared [`Meter`] for its bytes while it lives,
//! so "freed" is measured, not assumed.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes held now and the most ever held at once.
#[derive(Debug, Default)]
pub struct Meter {
    now: AtomicUsize,
    peak: AtomicUsize,
}

impl Meter {
    /// Bytes held now.
    pub fn now(&self) -> usize {
        self.now.load(Ordering::Relaxed)
    }

    /// The most bytes held at once since creation or the last
    /// [`reset_peak`](Meter::reset_peak).
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// Starts a new peak from what is held now.
    pub fn reset_peak(&self) {
        self.peak.store(self.now(), Ordering::Relaxed);
    }

    fn add(&self, n: usize) {
        let now = self.now.fetch_add(n, Ordering::Relaxed) + n;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    fn sub(&self, n: usize) {
        self.now.fetch_sub(n, Ordering::Relaxed);
    }
}

/// A charge of some bytes against a meter, returned on drop.
#[derive(Debug)]
pub(crate) struct Charge {
    meter: Arc<Meter>,
    bytes: usize,
}

impl Charge {
    pub(crate) fn new(meter: &Arc<Meter>, bytes: usize) -> Charge {
        meter.add(bytes);
        Charge { meter: meter.clone(), bytes }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.meter.sub(self.bytes);
    }
}

/// A buffer whose bytes are on the meter while it lives.
#[derive(Debug)]
pub(crate) struct Tracked<T> {
    pub(crate) v: Vec<T>,
    pub(crate) charge: Charge,
}

impl<T: Clone + Default> Tracked<T> {
    /// `len` default elements.
    pub(crate) fn zeroed(meter: &Arc<Meter>, len: usize) -> Tracked<T> {
        let v = vec![T::default(); len];
        let charge = Charge::new(meter, std::mem::size_of_val(v.as_slice()));
        Tracked { v, charge }
    }

    /// Splits into the storage and its charge (to lend the storage to an
    /// asynchronous call while the bytes stay on the meter).
    pub(crate) fn split(self) -> (Vec<T>, Charge) {
        (self.v, self.charge)
    }

    /// Puts the two halves back together.
    pub(crate) fn join(v: Vec<T>, charge: Charge) -> Tracked<T> {
        Tracked { v, charge }
    }
}

/// This process's peak resident set size in bytes (`VmHWM`), where
/// `/proc` says.
pub fn peak_rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_come_and_go() {
        let m = Arc::new(Meter::default());
        let a: Tracked<f32> = Tracked::zeroed(&m, 10);
        assert_eq!(m.now(), 40);
        let b: Tracked<u16> = Tracked::zeroed(&m, 5);
        assert_eq!(m.now(), 50);
        drop(a);
        assert_eq!(m.now(), 10);
        assert_eq!(m.peak(), 50);
        let (v, c) = b.split();
        assert_eq!(m.now(), 10, "a lent buffer stays charged");
        drop(Tracked::join(v, c));
        assert_eq!(m.now(), 0);
        m.reset_peak();
        assert_eq!(m.peak(), 0);
    }

    #[test]
    fn rss_is_read() {
        assert!(peak_rss().unwrap() > 0);
    }
}
