//! `ferrocomm._native`: the thin native layer under the Python package `ferrocomm`.
//!
//! Python describes every call once, as a tuple of plain values ([`PyCall`]): buffers as
//! (address, element count, dtype name, device index; -1 is host memory), the CUDA stream as an
//! integer (`__cuda_array_interface__` loses bf16 and fails on fp8, and plain values keep this
//! layer free of numpy and torch). This layer reads the tuple into ferrocomm's own
//! [`CallDesc`] and hands it to [`Communicator::run_desc`], which turns it into the call and
//! checks it; it keeps no call types of its own. The Python layer checks contiguity and devices
//! and keeps the objects alive; this layer releases the GIL around every collective, runs async
//! host calls on a worker thread, and turns errors into the exception classes of
//! `ferrocomm._errors`.

use std::borrow::Cow;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ferrocomm::bootstrap::Store;
use ferrocomm::config::BackendChoice;
use ferrocomm::{
    CallDesc, CallOpts, Collective, CommOptions, Communicator, Config, CountsDesc, DataType,
    Device, Error, Fp8Desc, NormDesc, RawBuf, ReduceOp, Splits,
};
use pyo3::exceptions::{PyRuntimeError, PyTimeoutError};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedStr;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyList, PyType};

mod window;

// ---------------------------------------------------------------------------------------------
// Errors

/// The `ferrocomm._errors` class an error becomes.
fn error_class(e: &Error) -> &'static str {
    match e {
        Error::InvalidArgument(_)
        | Error::SizeMismatch { .. }
        | Error::DtypeMismatch { .. }
        | Error::UnsupportedOp { .. }
        | Error::RankOutOfRange { .. }
        // Ranks that called different collectives or shapes: a caller's error, as docs/python.md
        // lists size and dtype mismatches.
        | Error::Mismatch { .. }
        | Error::BadEnv { .. }
        | Error::MissingEnv { .. } => "FerrocommValueError",
        // Another rank's arguments were wrong: the caller's error, on that rank.
        Error::PeerRefused { .. } => "FerrocommValueError",
        Error::Timeout { .. } | Error::StoreTimeout { .. } | Error::RendezvousTimeout { .. } => {
            "FerrocommTimeout"
        }
        Error::Unsupported { .. } | Error::LibraryMissing { .. } => "FerrocommUnsupported",
        Error::PeerFailed { .. } => "FerrocommPeerFailed",
        _ => "FerrocommError",
    }
}

/// An error as it crosses threads: exception class and message.
type ErrInfo = (&'static str, String);

fn info(e: &Error) -> ErrInfo {
    (error_class(e), e.to_string())
}

fn raise(py: Python<'_>, (class, msg): ErrInfo) -> PyErr {
    static MODULE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let cls = MODULE
        .get_or_try_init(py, || {
            py.import("ferrocomm._errors")
                .map(|m| m.into_any().unbind())
        })
        .and_then(|m| m.bind(py).getattr(class))
        .and_then(|c| c.cast_into::<PyType>().map_err(PyErr::from));
    match cls {
        Ok(cls) => PyErr::from_type(cls, msg),
        Err(_) => PyRuntimeError::new_err(msg),
    }
}

fn py_err(py: Python<'_>, e: Error) -> PyErr {
    raise(py, info(&e))
}

fn invalid(msg: String) -> Error {
    Error::InvalidArgument(msg)
}

// ---------------------------------------------------------------------------------------------
// A store implemented by a Python object (torch's TCPStore, or anything with its methods)

/// Calls `set`/`get`/`wait`/`check`/`add`/`delete_key` on a Python object, taking the GIL for
/// each call. Collectives run with the GIL released, so a backend may use the store from any
/// thread.
struct PyStore {
    obj: Py<PyAny>,
}

impl PyStore {
    fn timedelta<'py>(py: Python<'py>, t: Duration) -> PyResult<Bound<'py, PyAny>> {
        let kw = PyDict::new(py);
        kw.set_item("seconds", t.as_secs_f64())?;
        py.import("datetime")?
            .getattr("timedelta")?
            .call((), Some(&kw))
    }

    fn map_err(py: Python<'_>, e: PyErr, key: &str, timeout: Duration) -> Error {
        let msg = e.to_string();
        let lower = msg.to_ascii_lowercase();
        let is_timeout = e.is_instance_of::<PyTimeoutError>(py)
            || e.get_type(py)
                .name()
                .map(|n| n.to_string().contains("Timeout"))
                .unwrap_or(false)
            || lower.contains("timeout")
            || lower.contains("timed out");
        if is_timeout {
            Error::StoreTimeout {
                key: key.to_string(),
                timeout,
            }
        } else {
            Error::Store(format!("key '{key}': {msg}"))
        }
    }

    fn wait_keys(&self, py: Python<'_>, keys: &[&str], timeout: Duration) -> PyResult<()> {
        let td = Self::timedelta(py, timeout)?;
        let list = PyList::new(py, keys)?;
        self.obj.bind(py).call_method1("wait", (list, td))?;
        Ok(())
    }
}

impl Store for PyStore {
    fn set(&self, key: &str, value: &[u8]) -> ferrocomm::Result<()> {
        Python::attach(|py| {
            self.obj
                .bind(py)
                .call_method1("set", (key, PyBytes::new(py, value)))
                .map(|_| ())
                .map_err(|e| Self::map_err(py, e, key, Duration::ZERO))
        })
    }

    fn get(&self, key: &str, timeout: Duration) -> ferrocomm::Result<Vec<u8>> {
        Python::attach(|py| {
            let r = (|| -> PyResult<Vec<u8>> {
                // `wait` takes our deadline; `get` alone would wait for the store's own one.
                self.wait_keys(py, &[key], timeout)?;
                self.obj.bind(py).call_method1("get", (key,))?.extract()
            })();
            r.map_err(|e| Self::map_err(py, e, key, timeout))
        })
    }

    fn check(&self, key: &str) -> ferrocomm::Result<bool> {
        Python::attach(|py| {
            let list =
                PyList::new(py, [key]).map_err(|e| Self::map_err(py, e, key, Duration::ZERO))?;
            self.obj
                .bind(py)
                .call_method1("check", (list,))
                .and_then(|v| v.extract())
                .map_err(|e| Self::map_err(py, e, key, Duration::ZERO))
        })
    }

    fn add(&self, key: &str, delta: i64) -> ferrocomm::Result<i64> {
        Python::attach(|py| {
            self.obj
                .bind(py)
                .call_method1("add", (key, delta))
                .and_then(|v| v.extract())
                .map_err(|e| Self::map_err(py, e, key, Duration::ZERO))
        })
    }

    fn delete(&self, key: &str) -> ferrocomm::Result<bool> {
        Python::attach(|py| {
            self.obj
                .bind(py)
                .call_method1("delete_key", (key,))
                .and_then(|v| v.extract())
                .map_err(|e| Self::map_err(py, e, key, Duration::ZERO))
        })
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> ferrocomm::Result<()> {
        Python::attach(|py| {
            self.wait_keys(py, keys, timeout)
                .map_err(|e| Self::map_err(py, e, &keys.join(","), timeout))
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Work: host collectives issued with async_op=True run on one worker thread per communicator

#[derive(Default)]
struct WorkState {
    result: Mutex<Option<Result<(), ErrInfo>>>,
    done: Condvar,
}

impl WorkState {
    fn finish(&self, r: Result<(), ErrInfo>) {
        let mut g = self.result.lock().unwrap_or_else(|e| e.into_inner());
        *g = Some(r);
        self.done.notify_all();
    }

    /// Waits until the work is done or `limit` has passed (`None` on timeout).
    fn wait(&self, limit: Duration) -> Option<Result<(), ErrInfo>> {
        let deadline = Instant::now() + limit;
        let mut g = self.result.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(r) = g.as_ref() {
                return Some(r.clone());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            g = self
                .done
                .wait_timeout(g, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// A call the worker thread runs on the communicator ([`PyComm::submit`]).
type Exec = Box<dyn FnOnce(&Communicator) -> ferrocomm::Result<()> + Send>;

struct Worker {
    tx: mpsc::Sender<Job>,
    thread: JoinHandle<()>,
}

impl Worker {
    fn start(name: &str) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name(format!("ferrocomm-{name}"))
            .spawn(move || {
                // Jobs run in submission order: the order every rank issued its collectives.
                while let Ok(job) = rx.recv() {
                    job();
                }
            })?;
        Ok(Worker { tx, thread })
    }
}

/// A host collective running on the communicator's worker thread.
#[pyclass(frozen, module = "ferrocomm._native")]
struct NativeWork {
    state: Arc<WorkState>,
    /// How long `wait` waits at most: beyond the collective's own timeout the work is stuck.
    limit: Duration,
    collective: &'static str,
}

#[pymethods]
impl NativeWork {
    /// Whether the collective has finished (successfully or not).
    fn is_completed(&self) -> bool {
        self.state
            .result
            .lock()
            .map(|g| g.is_some())
            .unwrap_or(true)
    }

    /// Blocks (GIL released) until the collective has finished; raises its error.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        let limit = match timeout {
            Some(0.0) => Duration::ZERO,
            Some(t) => ferrocomm::config::timeout_from_secs(t)
                .map_err(|why| py_err(py, invalid(format!("wait: timeout {why}"))))?,
            None => self.limit,
        };
        let state = self.state.clone();
        match py.detach(move || state.wait(limit)) {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(raise(py, e)),
            None => Err(raise(
                py,
                (
                    "FerrocommTimeout",
                    format!(
                        "{}: Timed out after {:?} waiting for the work (still pending)",
                        self.collective, limit
                    ),
                ),
            )),
        }
    }
}

/// The point of a CUDA stream right after an async call ([`ferrocomm::Completion`]): the
/// Python work object orders the caller's stream after it, polls it or waits for it.
#[pyclass(frozen, module = "ferrocomm._native", name = "Completion")]
struct NativeCompletion {
    inner: ferrocomm::Completion,
    /// The call's name, for a timeout's message (borrowed on the hot path).
    collective: Cow<'static, str>,
}

#[pymethods]
impl NativeCompletion {
    /// Whether the stream has passed the call.
    fn is_completed(&self, py: Python<'_>) -> PyResult<bool> {
        self.inner.is_done().map_err(|e| py_err(py, e))
    }

    /// Makes `stream`'s later work wait for the call (the host does not block).
    fn order(&self, py: Python<'_>, stream: u64) -> PyResult<()> {
        self.inner.order(stream).map_err(|e| py_err(py, e))
    }

    /// Blocks (GIL released) until the stream has passed the call; `timeout` in seconds (None:
    /// as long as it takes) raises FerrocommTimeout when it passes first.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        let limit = match timeout {
            // 0: one look, as the host work's wait takes it.
            Some(0.0) => Some(Duration::ZERO),
            Some(t) => Some(
                ferrocomm::config::timeout_from_secs(t)
                    .map_err(|why| py_err(py, invalid(format!("wait: timeout {why}"))))?,
            ),
            None => None,
        };
        match py.detach(|| self.inner.wait(limit)) {
            Ok(true) => Ok(()),
            Ok(false) => Err(raise(
                py,
                (
                    "FerrocommTimeout",
                    format!(
                        "{} (CUDA): Timed out after {:?} waiting for the work (still pending)",
                        self.collective,
                        limit.unwrap_or_default()
                    ),
                ),
            )),
            Err(e) => Err(py_err(py, e)),
        }
    }
}

/// Removes a hook registered natively (torchcomms' RemovableHandle).
#[pyclass(frozen, module = "ferrocomm._native")]
struct NativeHookHandle {
    inner: ferrocomm::hooks::HookHandle,
}

#[pymethods]
impl NativeHookHandle {
    fn remove(&self) {
        self.inner.remove();
    }
}

/// The analysis of every rank's flight-recorder dumps in `dir` (`ferrocomm trace DIR`).
#[pyfunction]
fn analyze_traces(py: Python<'_>, dir: String) -> PyResult<String> {
    py.detach(move || ferrocomm::trace::analyze(std::path::Path::new(&dir)))
        .map_err(|e| py_err(py, e))
}

/// The next op id of the process (hooks pair their pre and post calls with it).
#[pyfunction]
fn next_op_id() -> u64 {
    ferrocomm::flight::next_op_id()
}

/// What `run` hands back for an async call: the host worker's work, or a CUDA completion.
#[derive(IntoPyObject)]
enum Issued {
    Host(NativeWork),
    Cuda(NativeCompletion),
}

// ---------------------------------------------------------------------------------------------
// The call description

/// A buffer as `_comm.py` hands it over: `(address, element count, dtype name, device index or
/// -1 for host memory)`.
type PyBuf = (u64, usize, PyBackedStr, i64);

/// One call as `_comm.py` describes it (`Comm._issue` builds the tuple, once per call), for
/// ferrocomm's [`CallDesc`]: name, output, input (None: in place), (op name, PreMulSum factor),
/// root or peer, (CUDA stream, algo hint, low-precision hint, timeout in seconds), then the
/// splits, counts (send, recv, capacity, unit), batch ((is_send, buffer, peer), ...) and norm
/// operands (residual or None, residual_out, weight, eps, (codes, scales, given) or None: per-row
/// scales written, or with `given` one scale read) of the calls that have them, None elsewhere.
#[derive(FromPyObject)]
struct PyCall(
    PyBackedStr,
    Option<PyBuf>,
    Option<PyBuf>,
    (PyBackedStr, f64),
    usize,
    PyOpts,
    Option<[Vec<usize>; 4]>,
    Option<(PyBuf, PyBuf, usize, usize)>,
    Option<Vec<(bool, PyBuf, usize)>>,
    Option<NormOperands>,
);

/// A call's options: (stream, algo hint, low-precision hint, timeout in seconds).
type PyOpts = (u64, Option<PyBackedStr>, Option<PyBackedStr>, Option<f64>);

/// The norm operands of [`PyCall`].
type NormOperands = (
    Option<PyBuf>,
    PyBuf,
    PyBuf,
    f32,
    Option<(PyBuf, PyBuf, bool)>,
);

fn raw(b: &PyBuf) -> ferrocomm::Result<RawBuf> {
    let (ptr, count, dtype, dev) = b;
    let device = match u32::try_from(*dev) {
        Ok(i) => Device::Cuda(i),
        Err(_) if *dev < 0 => Device::Host,
        Err(_) => return Err(invalid(format!("bad device {dev}"))),
    };
    RawBuf::new(*ptr, *count, dtype.parse()?, device)
}

impl PyCall {
    /// The call's [`CallDesc`] (names parsed, buffers checked as address ranges); `cfg` gives
    /// the format of a low-precision hint `on`.
    fn desc(&self, cfg: &Config) -> ferrocomm::Result<CallDesc> {
        let PyCall(
            name,
            output,
            input,
            (op, factor),
            peer,
            (stream, algo, low_precision, timeout),
            splits,
            counts,
            batch,
            norm,
        ) = self;
        let mut d = CallDesc::new(name.parse()?);
        d.output = output.as_ref().map(raw).transpose()?;
        d.input = input.as_ref().map(raw).transpose()?;
        d.op = ReduceOp::named(op, *factor)?;
        d.peer = *peer;
        d.splits = splits.clone().map(|[sc, sd, rc, rd]| Splits {
            send_counts: sc,
            send_displs: sd,
            recv_counts: rc,
            recv_displs: rd,
        });
        if let Some((send, recv, capacity, unit)) = counts {
            d.counts = Some(CountsDesc {
                send: raw(send)?,
                recv: raw(recv)?,
                capacity: *capacity,
                unit: *unit,
            });
        }
        for (send, b, peer) in batch.iter().flatten() {
            d.batch.push((*send, raw(b)?, *peer));
        }
        if let Some((residual, residual_out, weight, eps, fp8)) = norm {
            d.norm = Some(NormDesc {
                residual: residual.as_ref().map(raw).transpose()?,
                residual_out: raw(residual_out)?,
                weight: raw(weight)?,
                eps: *eps,
                fp8: match fp8 {
                    Some((codes, scale, given)) => Some(Fp8Desc {
                        codes: raw(codes)?,
                        scale: raw(scale)?,
                        given: *given,
                    }),
                    None => None,
                },
            });
        }
        d.opts = CallOpts::from_hints(
            *stream,
            algo.as_deref(),
            low_precision.as_deref(),
            *timeout,
            cfg,
        )?;
        Ok(d)
    }
}

fn parse_backend(s: &str) -> ferrocomm::Result<BackendChoice> {
    s.parse()
        .map_err(|why: String| invalid(format!("unknown backend '{s}': {why}")))
}

// ---------------------------------------------------------------------------------------------
// The communicator

#[pyclass(frozen, module = "ferrocomm._native", name = "Comm")]
struct PyComm {
    inner: Arc<Communicator>,
    worker: Mutex<Option<Worker>>,
}

impl PyComm {
    fn wrap(c: Communicator) -> Self {
        PyComm {
            inner: Arc::new(c),
            worker: Mutex::new(None),
        }
    }

    /// Bound on waiting for queued work: the call's timeout (its own, else the
    /// communicator's), twice, plus slack: beyond it the work is stuck.
    fn work_limit(&self, opts: &CallOpts) -> Duration {
        opts.timeout.unwrap_or_else(|| self.inner.timeout()) * 2 + Duration::from_secs(10)
    }

    /// Queues `exec` (a call whose buffers the Python layer keeps alive until the work object
    /// reports completion) on the worker thread, started on first use; `limit` bounds waiting
    /// for it.
    fn submit(
        &self,
        collective: &'static str,
        limit: Duration,
        exec: Exec,
    ) -> ferrocomm::Result<NativeWork> {
        let state = Arc::new(WorkState::default());
        let comm = self.inner.clone();
        let st = state.clone();
        let job: Job = Box::new(move || {
            let r = exec(&comm);
            st.finish(r.map_err(|e| info(&e)));
        });
        let mut w = self.worker.lock().unwrap_or_else(|e| e.into_inner());
        if w.is_none() {
            *w = Some(
                Worker::start(self.inner.name())
                    .map_err(|e| Error::io("starting the async work thread", e))?,
            );
        }
        let worker = w.as_ref().expect("worker started above");
        worker
            .tx
            .send(job)
            .map_err(|_| invalid("the communicator's work thread has stopped".into()))?;
        Ok(NativeWork {
            state,
            limit,
            collective,
        })
    }

    fn has_worker(&self) -> bool {
        self.worker.lock().map(|w| w.is_some()).unwrap_or(false)
    }

    /// Runs `exec`, one call of `collective` (`limit` bounds waiting for it when queued):
    /// queued on the worker thread when the host backend runs it with `async_op` (or once a
    /// worker exists, so that calls stay in order), else issued here with the GIL released,
    /// followed by a completion on `stream` when `mark` asks for one (a CUDA call's async work
    /// object). Returns the host worker's work, the completion, or None when the call has been
    /// issued already. The collectives ([`PyComm::run`]) and the windows' calls go through it.
    fn issue<F>(
        &self,
        py: Python<'_>,
        collective: &'static str,
        limit: Duration,
        exec: F,
        (async_op, mark, stream): (bool, bool, u64),
    ) -> PyResult<Option<Issued>>
    where
        F: FnOnce(&Communicator) -> ferrocomm::Result<()> + Send + 'static,
    {
        let host = self.inner.device() == Device::Host;
        if host && (async_op || self.has_worker()) {
            let work = self
                .submit(collective, limit, Box::new(exec))
                .map_err(|e| py_err(py, e))?;
            if async_op {
                return Ok(Some(Issued::Host(work)));
            }
            work.wait(py, None)?;
            return Ok(None);
        }
        let comm = self.inner.clone();
        let r = py.detach(move || {
            exec(&comm)?;
            // In the same release of the GIL: an async call's completion, right after it.
            if mark {
                comm.mark(stream)
            } else {
                Ok(None)
            }
        });
        r.map(|c| {
            c.map(|inner| {
                Issued::Cuda(NativeCompletion {
                    inner,
                    collective: Cow::Borrowed(collective),
                })
            })
        })
        .map_err(|e| py_err(py, e))
    }
}

#[pymethods]
impl PyComm {
    #[getter]
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    #[getter]
    fn size(&self) -> usize {
        self.inner.size()
    }
    #[getter]
    fn name(&self) -> String {
        self.inner.name().to_string()
    }
    #[getter]
    fn backend(&self) -> &'static str {
        self.inner.backend_name()
    }
    /// `-1` for host memory, else the CUDA device index.
    #[getter]
    fn device_index(&self) -> i64 {
        match self.inner.device() {
            Device::Host => -1,
            Device::Cuda(i) => i as i64,
        }
    }
    /// The timeout of later calls ([`Communicator::timeout`]), in seconds.
    #[getter]
    fn timeout_s(&self) -> f64 {
        self.inner.timeout().as_secs_f64()
    }
    /// Whether the communicator was aborted ([`Communicator::is_aborted`]).
    #[getter]
    fn is_aborted(&self) -> bool {
        self.inner.is_aborted()
    }

    /// Gives up on the communicator ([`Communicator::abort_because`]), for `reason` when
    /// given.
    #[pyo3(signature = (reason=None))]
    fn abort(&self, reason: Option<&str>) {
        match reason {
            Some(why) => self.inner.abort_because(why),
            None => self.inner.abort(),
        }
    }

    /// Tells the peers that this rank has left (the interpreter exits): its process ending is
    /// no failure for them.
    fn leave(&self) {
        self.inner.leave();
    }

    /// Refuses the next collective call on this rank (`why`: an argument wrong here, found
    /// by the Python layer): the peers fail it at once instead of waiting for this rank.
    fn refuse(&self, collective: &str, why: &str) {
        self.inner.refuse(collective, why);
    }

    /// The peer whose failure (death, or its abort) the watcher saw, if any.
    fn failed_peer(&self) -> Option<usize> {
        self.inner.failed_peer()
    }

    /// The directory the flight recorder's dumps go to.
    #[getter]
    fn trace_dir(&self) -> String {
        self.inner.trace_dir().display().to_string()
    }

    /// Dumps the flight recorder (torch's format) to `path`, or into the trace directory;
    /// returns the file's path.
    #[pyo3(signature = (path=None))]
    fn dump_flight_recorder(&self, py: Python<'_>, path: Option<String>) -> PyResult<String> {
        let comm = self.inner.clone();
        py.detach(move || comm.dump_flight_recorder(path.as_deref().map(std::path::Path::new)))
            .map(|p| p.display().to_string())
            .map_err(|e| py_err(py, e))
    }

    /// The flight recorder's calls recorded at or after record id `since`, as torch's JSON
    /// dump (`only_active`: those not completed).
    fn flight_recorder_json(&self, since: u64, only_active: bool) -> String {
        let r = self.inner.flight_recorder().clone();
        ferrocomm::flight::dump_value(&[r], since, only_active, "on demand").to_string()
    }

    /// Turns the flight recorder on with `capacity` calls (when it is off); the record id
    /// the next call gets and the calls recorded so far.
    fn flight_recorder_enable(&self, capacity: usize) -> (u64, u64) {
        let r = self.inner.flight_recorder();
        r.enable(capacity);
        (ferrocomm::flight::FlightRecorder::watermark(), r.len())
    }

    /// Calls recorded so far (0 when off) and the next record id.
    fn flight_recorder_len(&self) -> (u64, u64) {
        (
            self.inner.flight_recorder().len(),
            ferrocomm::flight::FlightRecorder::watermark(),
        )
    }

    /// Registers `f` (no arguments), called once when the communicator is aborted (by
    /// abort(), or because a peer died or gave up), on the thread that aborts it.
    fn register_abort_hook(&self, py: Python<'_>, f: Py<PyAny>) -> PyResult<NativeHookHandle> {
        let hook = move || {
            Python::attach(|py| {
                if let Err(e) = f.call0(py) {
                    e.print(py);
                }
            })
        };
        self.inner
            .register_abort_hook(Arc::new(hook))
            .map(|h| NativeHookHandle { inner: h })
            .map_err(|e| py_err(py, e))
    }

    /// Sets the timeout of later calls, in seconds ([`Communicator::set_timeout`]): longer or
    /// shorter than the creation timeout.
    fn set_timeout(&self, py: Python<'_>, seconds: f64) -> PyResult<()> {
        ferrocomm::config::timeout_from_secs(seconds)
            .map_err(|why| invalid(format!("set_timeout: timeout {why}")))
            .and_then(|t| self.inner.set_timeout(t))
            .map_err(|e| py_err(py, e))
    }

    /// How a call would run: its plan, printed as the bench's algo column (for tests and
    /// debugging).
    #[pyo3(signature = (collective, nbytes, dtype, algo=None, low_precision=None))]
    fn algo_for(
        &self,
        py: Python<'_>,
        collective: &str,
        nbytes: usize,
        dtype: &str,
        algo: Option<&str>,
        low_precision: Option<&str>,
    ) -> PyResult<String> {
        let r = (|| -> ferrocomm::Result<String> {
            let coll: Collective = collective.parse()?;
            let opts = CallOpts::from_hints(0, algo, low_precision, None, self.inner.config())?;
            Ok(self
                .inner
                .algo_for(coll, nbytes, dtype.parse()?, &opts)?
                .to_string())
        })();
        r.map_err(|e| py_err(py, e))
    }

    /// Runs one call, described once by `_comm.py` ([`PyCall`]), as [`PyComm::issue`] runs
    /// calls.
    fn run(
        &self,
        py: Python<'_>,
        call: PyCall,
        async_op: bool,
        mark: bool,
    ) -> PyResult<Option<Issued>> {
        let desc = call.desc(self.inner.config()).map_err(|e| py_err(py, e))?;
        let (collective, limit) = (desc.name.name(), self.work_limit(&desc.opts));
        let stream = desc.opts.stream;
        // SAFETY: the Python caller holds the buffers' objects for the whole call (and, when it
        // is queued, in the work object until it reports completion); CUDA calls only enqueue on
        // the stream, where torch's caching allocator keeps the memory until the stream has
        // passed it (the usual contract of stream-ordered collectives).
        let exec = move |comm: &Communicator| unsafe { comm.run_desc(&desc) };
        self.issue(py, collective, limit, exec, (async_op, mark, stream))
    }

    /// A completion recorded on `stream` after the calls issued on it so far (for an async
    /// call of `collective` whose outputs were copied out after it); None on the host backend.
    fn mark(
        &self,
        py: Python<'_>,
        stream: u64,
        collective: &str,
    ) -> PyResult<Option<NativeCompletion>> {
        let collective = Cow::Owned(collective.to_string());
        self.inner
            .mark(stream)
            .map(|c| c.map(|inner| NativeCompletion { inner, collective }))
            .map_err(|e| py_err(py, e))
    }

    /// A new window of this communicator (one-sided communication, `ferrocomm._window`).
    fn new_window(slf: Py<Self>, py: Python<'_>) -> PyResult<window::PyWindow> {
        window::new_window(py, slf)
    }

    /// A persistent all-gather into `output` (collective; `ferrocomm._window`), registered
    /// within `timeout` seconds (None: the communicator's timeout).
    #[pyo3(signature = (output, timeout=None))]
    fn all_gather_p_init(
        slf: Py<Self>,
        py: Python<'_>,
        output: PyBuf,
        timeout: Option<f64>,
    ) -> PyResult<window::PyAllGatherP> {
        window::all_gather_p_init(py, slf, output, timeout)
    }

    /// A communicator of `ranks` (in that order), or None on ranks not listed.
    fn split(&self, py: Python<'_>, ranks: Vec<usize>, name: &str) -> PyResult<Option<PyComm>> {
        let comm = self.inner.clone();
        let name = name.to_string();
        py.detach(move || comm.split(&ranks, &name))
            .map(|o| o.map(PyComm::wrap))
            .map_err(|e| py_err(py, e))
    }

    /// Waits for queued work, stops the worker thread and finalizes the communicator.
    fn finalize(&self, py: Python<'_>) -> PyResult<()> {
        let worker = self.worker.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(Worker { tx, thread }) = worker {
            drop(tx);
            // Outside the GIL: queued jobs may use a Python store.
            py.detach(move || thread.join())
                .map_err(|_| PyRuntimeError::new_err("ferrocomm work thread panicked"))?;
        }
        let comm = self.inner.clone();
        py.detach(move || comm.finalize())
            .map_err(|e| py_err(py, e))
    }
}

/// Creates a communicator; every rank calls it with the same name.
#[pyfunction]
#[pyo3(signature = (name, backend="ferrocomm", device=None, *, rank=None, size=None,
                    local_rank=None, local_size=None, timeout_s=None, store=None))]
#[allow(clippy::too_many_arguments)]
fn new_comm(
    py: Python<'_>,
    name: String,
    backend: &str,
    device: Option<&str>,
    rank: Option<usize>,
    size: Option<usize>,
    local_rank: Option<usize>,
    local_size: Option<usize>,
    timeout_s: Option<f64>,
    store: Option<Py<PyAny>>,
) -> PyResult<PyComm> {
    let opts = (|| -> ferrocomm::Result<CommOptions> {
        let config = Config::from_env()?;
        let backend = parse_backend(backend)?;
        let device = match device.map(|d| d.trim().to_ascii_lowercase()) {
            None => None,
            // "cuda" without an index is this rank's GPU on its host (LOCAL_RANK).
            Some(d) if d == "cuda" || d == "gpu" => {
                let lr = local_rank
                    .or(config.launch.local_rank)
                    .or(rank)
                    .or(config.launch.rank)
                    .unwrap_or(0);
                Some(Device::Cuda(lr as u32))
            }
            Some(d) => Some(d.parse::<Device>()?),
        };
        let timeout = match timeout_s {
            None => None,
            Some(t) => Some(
                ferrocomm::config::timeout_from_secs(t)
                    .map_err(|why| invalid(format!("timeout {why}")))?,
            ),
        };
        let mut o = CommOptions::new(name);
        o.backend = Some(backend);
        o.device = device;
        o.rank = rank;
        o.size = size;
        o.local_rank = local_rank;
        o.local_size = local_size;
        o.timeout = timeout;
        o.store = store.map(|obj| Arc::new(PyStore { obj }) as Arc<dyn Store>);
        o.config = Some(config);
        Ok(o)
    })()
    .map_err(|e| py_err(py, e))?;
    py.detach(move || Communicator::new(opts))
        .map(PyComm::wrap)
        .map_err(|e| py_err(py, e))
}

/// Names ferrocomm accepts for a dtype (canonical name), or raises.
#[pyfunction]
fn dtype_name(py: Python<'_>, name: &str) -> PyResult<&'static str> {
    name.parse::<DataType>()
        .map(|d| d.name())
        .map_err(|e| py_err(py, e.into()))
}

/// The CUDA kernels built into this library, read back and checked without a GPU
/// (`kernels::check_builtin`): `{"targets": [...], "nvrtc": (major, minor) or None, "notes":
/// [...], "checked": [{"target", "units", "symbols", "bytes", "compressed_bytes"}, ...]}`.
#[pyfunction]
fn builtin_kernels(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    use ferrocomm::cuda::kernels;
    let checked = py
        .detach(kernels::check_builtin)
        .map_err(|e| py_err(py, e))?;
    let d = pyo3::types::PyDict::new(py);
    d.set_item("targets", kernels::builtin_targets())?;
    d.set_item("nvrtc", kernels::builtin_nvrtc())?;
    d.set_item("notes", kernels::builtin_notes().to_vec())?;
    let rows = pyo3::types::PyList::empty(py);
    for c in checked {
        let r = pyo3::types::PyDict::new(py);
        r.set_item("target", c.target)?;
        r.set_item("units", c.units)?;
        r.set_item("symbols", c.symbols)?;
        r.set_item("bytes", c.bytes)?;
        r.set_item("compressed_bytes", c.compressed_bytes)?;
        rows.append(r)?;
    }
    d.set_item("checked", rows)?;
    Ok(d)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyComm>()?;
    m.add_class::<NativeWork>()?;
    m.add_class::<NativeCompletion>()?;
    m.add_class::<NativeHookHandle>()?;
    m.add_function(wrap_pyfunction!(analyze_traces, m)?)?;
    m.add_function(wrap_pyfunction!(next_op_id, m)?)?;
    m.add_class::<window::PyWindow>()?;
    m.add_class::<window::PyAllGatherP>()?;
    m.add_class::<window::PySharedMem>()?;
    m.add_function(wrap_pyfunction!(window::shared_alloc, m)?)?;
    m.add_function(wrap_pyfunction!(new_comm, m)?)?;
    m.add_function(wrap_pyfunction!(dtype_name, m)?)?;
    m.add_function(wrap_pyfunction!(builtin_kernels, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
