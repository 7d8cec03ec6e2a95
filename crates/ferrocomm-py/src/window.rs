//! Windows, the persistent all-gather and shared host memory for `ferrocomm._window`.
//!
//! A window holds its communicator's Python object, so that its calls share the
//! communicator's work thread: on the host backend an async call (or any call once the thread
//! exists) is queued there, in order with the collectives; on CUDA a call enqueues on the
//! caller's stream with the GIL released, followed by a completion when `mark` asks for one.
//! Registered buffers are held by the Python layer (as collectives' buffers are).

use std::sync::{Arc, RwLock};

use ferrocomm::{AllGatherP, CallOpts, Communicator, Error, SharedMem, Window};
use pyo3::prelude::*;

use super::{invalid, py_err, raw, Issued, PyBuf, PyComm};

/// One window of a communicator (`ferrocomm._window.Window` wraps it).
#[pyclass(frozen, module = "ferrocomm._native", name = "Window")]
pub(crate) struct PyWindow {
    comm: Py<PyComm>,
    /// `'static`: the Python layer keeps the registered tensor alive while it is registered
    /// (or the caller promised to, `owning=False`), as torchcomms' windows do.
    win: Arc<RwLock<Window<'static>>>,
}

/// A persistent all-gather (`ferrocomm._window.AllGatherPHandle` wraps it).
#[pyclass(frozen, module = "ferrocomm._native", name = "AllGatherP")]
pub(crate) struct PyAllGatherP {
    comm: Py<PyComm>,
    /// `None` once freed.
    ag: Arc<RwLock<Option<AllGatherP<'static>>>>,
}

/// Shared host memory a window on the host backend can register (`ferrocomm.shared_empty`).
#[pyclass(frozen, module = "ferrocomm._native", name = "SharedMem")]
pub(crate) struct PySharedMem {
    mem: SharedMem,
}

// SAFETY: the mapping is plain shared memory, valid as long as the object; Python code reads
// and writes it through the arrays made over it, as any other memory.
unsafe impl Sync for PySharedMem {}
// SAFETY: as above.
unsafe impl Send for PySharedMem {}

#[pymethods]
impl PySharedMem {
    /// The address of the first byte.
    #[getter]
    fn ptr(&self) -> u64 {
        self.mem.as_mut_ptr() as u64
    }
    /// Its size in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.mem.len()
    }
}

/// `nbytes` of shared host memory (zeroed) that the ranks of a host communicator can map.
#[pyfunction]
pub(crate) fn shared_alloc(py: Python<'_>, nbytes: usize) -> PyResult<PySharedMem> {
    SharedMem::new(nbytes)
        .map(|mem| PySharedMem { mem })
        .map_err(|e| py_err(py, e))
}

/// A view of a buffer the Python layer keeps alive for as long as the native side may use it.
fn view(b: &PyBuf) -> ferrocomm::Result<ferrocomm::View<'static>> {
    let b = raw(b)?;
    // SAFETY: the Python layer holds the object behind the buffer until the call (or its
    // work) is done, and a registered buffer until it is deregistered.
    Ok(unsafe { b.view() })
}

/// The options of a window call on `stream` with its own `timeout` (seconds; None: the
/// communicator's).
fn opts(comm: &PyComm, stream: u64, timeout: Option<f64>) -> ferrocomm::Result<CallOpts> {
    CallOpts::from_hints(stream, None, None, timeout, comm.inner.config())
}

type Op = Box<dyn FnOnce() -> ferrocomm::Result<()> + Send>;

/// Runs one window operation of `comm` as its collectives run ([`PyComm::issue`]), its
/// queued work bounded by `timeout` (seconds; None: the communicator's).
fn issue(
    py: Python<'_>,
    comm: &PyComm,
    name: &'static str,
    (op, async_op, mark, stream, timeout): (Op, bool, bool, u64, Option<f64>),
) -> PyResult<Option<Issued>> {
    let limit = comm.work_limit(&opts(comm, 0, timeout).map_err(|e| py_err(py, e))?);
    let exec = move |_: &Communicator| op();
    comm.issue(py, name, limit, exec, (async_op, mark, stream))
}

fn poisoned() -> Error {
    invalid("the window's lock was poisoned by a panic".into())
}

impl PyWindow {
    /// Runs `f` on the window, read-locked, as window operation `name` ([`issue`]).
    fn issue_op(
        &self,
        py: Python<'_>,
        name: &'static str,
        f: impl FnOnce(&Window<'static>) -> ferrocomm::Result<()> + Send + 'static,
        (async_op, mark, stream, timeout): (bool, bool, u64, Option<f64>),
    ) -> PyResult<Option<Issued>> {
        let win = self.win.clone();
        let op: Op = Box::new(move || f(&*win.read().map_err(|_| poisoned())?));
        issue(
            py,
            self.comm.get(),
            name,
            (op, async_op, mark, stream, timeout),
        )
    }
}

#[pymethods]
impl PyWindow {
    /// Registers `buf` (collective; see `Window::register`).
    fn register(&self, py: Python<'_>, buf: PyBuf) -> PyResult<()> {
        let win = self.win.clone();
        let r = py.detach(move || {
            let b = raw(&buf)?;
            // SAFETY: as `view`: the Python layer holds the tensor while it is registered.
            let v = unsafe { b.view_mut() };
            win.write().map_err(|_| poisoned())?.register(v)
        });
        r.map_err(|e| py_err(py, e))
    }

    /// Releases the registered buffer (collective).
    fn deregister(&self, py: Python<'_>) -> PyResult<()> {
        let win = self.win.clone();
        py.detach(move || win.write().map_err(|_| poisoned())?.deregister())
            .map_err(|e| py_err(py, e))
    }

    /// `src` into rank `dst`'s buffer at element `offset`.
    #[pyo3(signature = (src, dst, offset, stream=0, async_op=false, mark=false))]
    #[allow(clippy::too_many_arguments)]
    fn put(
        &self,
        py: Python<'_>,
        src: PyBuf,
        dst: usize,
        offset: usize,
        stream: u64,
        async_op: bool,
        mark: bool,
    ) -> PyResult<Option<Issued>> {
        let put = move |w: &Window<'static>| {
            w.put(view(&src)?, dst, offset, &CallOpts::on_stream(stream))
        };
        self.issue_op(py, "put", put, (async_op, mark, stream, None))
    }

    /// Signals rank `dst`.
    #[pyo3(signature = (dst, stream=0, async_op=false, mark=false))]
    fn signal(
        &self,
        py: Python<'_>,
        dst: usize,
        stream: u64,
        async_op: bool,
        mark: bool,
    ) -> PyResult<Option<Issued>> {
        let signal = move |w: &Window<'static>| w.signal(dst, &CallOpts::on_stream(stream));
        self.issue_op(py, "signal", signal, (async_op, mark, stream, None))
    }

    /// Waits for the next signal from rank `peer`; `timeout` in seconds (None: the
    /// communicator's).
    #[pyo3(signature = (peer, stream=0, async_op=false, mark=false, timeout=None))]
    fn wait_signal(
        &self,
        py: Python<'_>,
        peer: usize,
        stream: u64,
        async_op: bool,
        mark: bool,
        timeout: Option<f64>,
    ) -> PyResult<Option<Issued>> {
        let o = opts(self.comm.get(), stream, timeout).map_err(|e| py_err(py, e))?;
        let wait = move |w: &Window<'static>| w.wait_signal(peer, &o);
        self.issue_op(py, "wait_signal", wait, (async_op, mark, stream, timeout))
    }

    /// Where rank `rank`'s buffer is mapped in this process.
    fn remote_ptr(&self, py: Python<'_>, rank: usize) -> PyResult<u64> {
        let w = self.win.read().map_err(|_| py_err(py, poisoned()))?;
        w.remote_ptr(rank)
            .map(|p| p as u64)
            .map_err(|e| py_err(py, e))
    }

    /// `"unified"`: how this rank reaches `peer`'s buffer.
    fn access_type(&self, py: Python<'_>, peer: usize) -> PyResult<&'static str> {
        let w = self.win.read().map_err(|_| py_err(py, poisoned()))?;
        w.access_type(peer)
            .map(|a| match a {
                ferrocomm::AccessType::Unified => "unified",
                ferrocomm::AccessType::Separate => "separate",
            })
            .map_err(|e| py_err(py, e))
    }

    /// The registered buffer's size in bytes (0: none).
    #[getter]
    fn size_bytes(&self) -> usize {
        self.win.read().map(|w| w.size_bytes()).unwrap_or(0)
    }
}

#[pymethods]
impl PyAllGatherP {
    /// Gathers every rank's `input` into every rank's registered output.
    #[pyo3(signature = (input, stream=0, async_op=false, mark=false, timeout=None))]
    fn exec(
        &self,
        py: Python<'_>,
        input: PyBuf,
        stream: u64,
        async_op: bool,
        mark: bool,
        timeout: Option<f64>,
    ) -> PyResult<Option<Issued>> {
        let o = opts(self.comm.get(), stream, timeout).map_err(|e| py_err(py, e))?;
        let ag = self.ag.clone();
        let op: Op = Box::new(move || {
            let v = view(&input)?;
            match ag.read().map_err(|_| poisoned())?.as_ref() {
                Some(ag) => ag.exec(v, &o),
                None => Err(invalid(
                    "all_gather_p_exec: the handle has been freed".into(),
                )),
            }
        });
        issue(
            py,
            self.comm.get(),
            "all_gather_p_exec",
            (op, async_op, mark, stream, timeout),
        )
    }

    /// Releases the registered output (collective); a second call does nothing.
    fn free(&self, py: Python<'_>) -> PyResult<()> {
        let ag = self.ag.clone();
        py.detach(move || {
            let taken = ag.write().map_err(|_| poisoned())?.take();
            match taken {
                Some(a) => a.free(),
                None => Ok(()),
            }
        })
        .map_err(|e| py_err(py, e))
    }
}

/// A new window of `comm` (`PyComm.new_window`).
pub(crate) fn new_window(py: Python<'_>, comm: Py<PyComm>) -> PyResult<PyWindow> {
    let inner = comm.get().inner.clone();
    let win = inner.new_window().map_err(|e| py_err(py, e))?;
    Ok(PyWindow {
        comm,
        win: Arc::new(RwLock::new(win)),
    })
}

/// A persistent all-gather into `output` (`PyComm.all_gather_p_init`; collective), its
/// registration bounded by `timeout` seconds (None: the communicator's timeout).
pub(crate) fn all_gather_p_init(
    py: Python<'_>,
    comm: Py<PyComm>,
    output: PyBuf,
    timeout: Option<f64>,
) -> PyResult<PyAllGatherP> {
    let inner = comm.get().inner.clone();
    let o = opts(comm.get(), 0, timeout).map_err(|e| py_err(py, e))?;
    let r = py.detach(move || {
        let b = raw(&output)?;
        // SAFETY: the Python layer holds the output until the handle is freed.
        inner.all_gather_p_init(unsafe { b.view_mut() }, &o)
    });
    let ag = r.map_err(|e| py_err(py, e))?;
    Ok(PyAllGatherP {
        comm,
        ag: Arc::new(RwLock::new(Some(ag))),
    })
}
