//! `oxccl._oxccl._Comm`: a communicator as Python holds it.

use crate::errors::{IntoPy, to_py};
use crate::interrupt::Watch;
use crate::ops;
use oxccl::{Communicator, Config, CudaStream, Error, Kind, UniqueId, programs};
use oxccl_algo::ir::Program;
use parking_lot::{MappedRwLockReadGuard, RwLock, RwLockReadGuard};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use std::sync::Arc;
use std::time::Duration;

/// A new unique id (NCCL's `ncclGetUniqueId`), as the hex text every rank
/// passes to `init`. The process that makes it runs the bootstrap root, on
/// the interface `OXCCL_SOCKET_IFNAME` selects.
#[pyfunction]
pub fn unique_id() -> PyResult<String> {
    Ok(oxccl::unique_id().py()?.to_string())
}

/// The indices of a collective's kind, element type and reduction, by
/// name, for `_Comm.coll` (an unknown name raises, naming it).
#[pyfunction]
pub fn codes(kind: &str, dtype: &str, op: &str) -> PyResult<(usize, usize, usize)> {
    ops::codes(kind, dtype, op).py()
}

/// One communicator.
#[pyclass(name = "_Comm", module = "oxccl._oxccl", frozen)]
pub struct Comm {
    /// `None` once closed. Calls hold the read lock while they run, so
    /// `close` waits for calls in flight.
    inner: RwLock<Option<Communicator>>,
    /// Its calls in flight, for Ctrl-C.
    watch: Arc<Watch>,
}

impl Comm {
    fn new(c: Communicator) -> Comm {
        Comm { watch: Watch::new(&c), inner: RwLock::new(Some(c)) }
    }

    /// Runs `f`, a call on `c` (this communicator) that may block, with the
    /// GIL released: Ctrl-C meanwhile aborts the communicator and raises
    /// `KeyboardInterrupt` (or whatever Python's SIGINT handler does)
    /// instead of the call's error.
    fn blocking<T: Send>(&self, py: Python<'_>, f: impl FnOnce() -> oxccl::Result<T> + Send) -> PyResult<T> {
        let (r, interrupted) = self.watch.call(|| py.detach(f));
        if r.is_err() && interrupted {
            py.check_signals()?;
        }
        r.py()
    }

    /// The communicator, or the error of a closed one.
    fn get(&self) -> PyResult<MappedRwLockReadGuard<'_, Communicator>> {
        RwLockReadGuard::try_map(self.inner.read(), Option::as_ref)
            .map_err(|_| to_py(Error::InvalidUsage("the communicator is closed".into())))
    }
}

/// A [`Config`] from the keyword arguments Python passed (`None` or a dict
/// of `timeout` in seconds, `algo`, `transport`, `programs` as JSON texts,
/// `encrypt`, `deterministic`).
fn config(opts: Option<&Bound<'_, PyDict>>) -> PyResult<Config> {
    let mut c = Config::default();
    let Some(opts) = opts else { return Ok(c) };
    for (k, v) in opts.iter() {
        let key: String = k.extract()?;
        match key.as_str() {
            "timeout" => {
                if v.is_none() {
                    continue;
                }
                let s: f64 = v.extract()?;
                if !(s.is_finite() && s > 0.0) {
                    return Err(to_py(Error::invalid(format!(
                        "timeout must be a positive number of seconds, got {s}"
                    ))));
                }
                c.timeout = Some(Duration::from_secs_f64(s));
            }
            "algo" => c.algo = v.extract()?,
            "transport" => {
                let t: Option<String> = v.extract()?;
                c.transport = t.map(|t| t.parse::<Kind>()).transpose().py()?;
            }
            "encrypt" => c.encrypt = v.extract()?,
            "deterministic" => c.deterministic = v.extract()?,
            "programs" => {
                let texts: Vec<String> = v.extract()?;
                for t in texts {
                    c.programs.push(programs::register(Program::from_json(&t).py()?).py()?);
                }
            }
            other => {
                return Err(to_py(Error::invalid(format!(
                    "unknown communicator option {other:?}; expected timeout, algo, transport, programs, encrypt or deterministic"
                ))));
            }
        }
    }
    Ok(c)
}

#[pymethods]
impl Comm {
    /// Rank `rank` of `nranks` joins the communicator of `uid` (blocks
    /// until every rank has).
    #[staticmethod]
    #[pyo3(signature = (uid, nranks, rank, opts=None))]
    fn init(py: Python<'_>, uid: &str, nranks: usize, rank: usize, opts: Option<&Bound<'_, PyDict>>) -> PyResult<Comm> {
        let id: UniqueId = uid.parse().py()?;
        let cfg = config(opts)?;
        let inner = py.detach(|| Communicator::init(&id, nranks, rank, cfg)).py()?;
        Ok(Comm::new(inner))
    }

    /// The communicator the launcher's environment describes (torchrun,
    /// mpirun, srun, oxccl-run).
    #[staticmethod]
    fn from_env(py: Python<'_>) -> PyResult<Comm> {
        Ok(Comm::new(py.detach(Communicator::from_env).py()?))
    }

    /// `n` ranks as threads of this process.
    #[staticmethod]
    #[pyo3(signature = (n, opts=None))]
    fn init_threads(py: Python<'_>, n: usize, opts: Option<&Bound<'_, PyDict>>) -> PyResult<Vec<Comm>> {
        let cfg = config(opts)?;
        let comms = py.detach(|| Communicator::init_threads_with(n, cfg)).py()?;
        Ok(comms.into_iter().map(Comm::new).collect())
    }

    /// This rank.
    #[getter]
    fn rank(&self) -> PyResult<usize> {
        Ok(self.get()?.rank())
    }

    /// The number of ranks.
    #[getter]
    fn size(&self) -> PyResult<usize> {
        Ok(self.get()?.size())
    }

    /// The unique id, as text.
    #[getter]
    fn uid(&self) -> PyResult<String> {
        Ok(self.get()?.id().to_string())
    }

    /// Runs `ops` (see `ops`) as one launch, with the GIL released:
    /// operations on device memory enqueued on `streams` (`cudaStream_t`s
    /// as integers; 0 is the legacy default stream), those on host memory
    /// run to their end. The caller keeps every buffer alive until it
    /// returns (device ones until their streams pass the launch).
    fn launch(&self, py: Python<'_>, ops: Vec<Bound<'_, PyTuple>>, streams: Vec<u64>) -> PyResult<()> {
        let c = self.get()?;
        let ops = ops::parse(&ops, &c)?;
        let streams: Vec<CudaStream> = streams.into_iter().map(CudaStream::from_raw).collect();
        // SAFETY: `launch` returns when the host operations have ended; the
        // Python caller holds the objects that own the buffers until then
        // (see `ops::buffer`), and device tensors until their streams pass.
        self.blocking(py, || unsafe { c.launch(&ops, &streams) })
    }

    /// One collective outside a group: what `launch([("coll", …)],
    /// streams)` runs, with the kind, element type and reduction as the
    /// indices `codes` gave (nothing to parse, no list to walk: the way of
    /// every small call).
    // The arguments are the Python method's, one each (a tuple or class
    // would be built in Python on every small call).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (codes, send, recv, count, scalar, root, streams))]
    fn coll(
        &self,
        py: Python<'_>,
        codes: (usize, usize, usize),
        send: Option<ops::Span>,
        recv: ops::Span,
        count: usize,
        scalar: f64,
        root: i64,
        streams: Vec<u64>,
    ) -> PyResult<()> {
        let c = self.get()?;
        let op = ops::coll(&c, codes, send, recv, count, scalar, root).py()?;
        let streams: Vec<CudaStream> = streams.into_iter().map(CudaStream::from_raw).collect();
        // SAFETY: as in `launch`.
        self.blocking(py, || unsafe { c.launch(std::slice::from_ref(&op), &streams) })
    }

    /// Waits for `stream` and reports any error of the device path.
    fn device_synchronize(&self, py: Python<'_>, stream: u64) -> PyResult<()> {
        let c = &*self.get()?;
        self.blocking(py, || c.device_synchronize(CudaStream::from_raw(stream)))
    }

    /// NCCL's `ncclCommSplit`: `None` for ranks that pass no color.
    #[pyo3(signature = (color, key))]
    fn split(&self, py: Python<'_>, color: Option<u32>, key: i32) -> PyResult<Option<Comm>> {
        let c = &*self.get()?;
        Ok(self.blocking(py, || c.split(color, key))?.map(Comm::new))
    }

    /// NCCL's `ncclCommShrink`: this communicator without `exclude`.
    #[pyo3(signature = (exclude, after_failure=false))]
    fn shrink(&self, py: Python<'_>, exclude: Vec<usize>, after_failure: bool) -> PyResult<Comm> {
        let c = &*self.get()?;
        let inner =
            self.blocking(py, || if after_failure { c.shrink_after_failure(&exclude) } else { c.shrink(&exclude) });
        Ok(Comm::new(inner?))
    }

    /// Stops every operation of this rank; calls in flight, here and on
    /// the other ranks, fail.
    fn abort(&self) -> PyResult<()> {
        self.get()?.abort();
        Ok(())
    }

    /// Leaves the communicator (telling the peers, so they do not take it
    /// for a death) and frees it; later calls raise. Waits for calls in
    /// flight. Closing twice does nothing.
    fn close(&self, py: Python<'_>) {
        py.detach(|| drop(self.inner.write().take()));
    }

    /// Whether `close` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.read().is_none()
    }

    /// The error that poisoned this communicator, if any.
    fn async_error(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        Ok(self.get()?.async_error().map(|e| to_py(e).into_value(py).into_any()))
    }

    /// Bytes moved with each peer: dicts of `peer`, `transport`, `sent`,
    /// `recv`, `put`, `got`.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        self.get()?
            .stats()
            .into_iter()
            .map(|s| {
                let d = PyDict::new(py);
                d.set_item("peer", s.peer)?;
                d.set_item("transport", s.kind.map(|k| k.to_string()))?;
                d.set_item("sent", s.sent)?;
                d.set_item("recv", s.recv)?;
                d.set_item("put", s.put)?;
                d.set_item("got", s.got)?;
                Ok(d)
            })
            .collect()
    }

    /// The transport to `peer` (`mem`, `shm`, `tcp`), once connected.
    fn transport_to(&self, peer: usize) -> PyResult<Option<String>> {
        Ok(self.get()?.transport_to(peer).map(|k| k.to_string()))
    }

    /// What the tuner runs for a call (an algorithm or a program's name).
    #[pyo3(signature = (kind, count, dtype, root=0))]
    fn choice(&self, kind: &str, count: usize, dtype: &str, root: usize) -> PyResult<String> {
        let kind: oxccl::CollKind = kind.parse().py()?;
        Ok(self.get()?.choice(kind, count, ops::dtype(dtype).py()?, root).py()?.to_string())
    }
}
