//! The CUDA driver layer: every call ferrocomm makes into the NVIDIA driver goes through this
//! module, separated as cudarc separates its own: cudarc's raw `sys` declarations (named only
//! here); `result`, one thin function per call that turns the driver's status into a
//! [`Result`]; and safe types that own what they create (contexts, `Stream`s, `Event`s and
//! [`Completion`]s, loaded `Module`s and their `Function`s, launches). Both GPU backends build
//! on it; it imports no backend.
//!
//! - [`libs`]: finding libcuda / libnvrtc / libnccl before cudarc touches them (absent = error,
//!   no panic);
//! - `result`: the thin calls (memory, IPC handles, copies, streams, occupancy);
//! - `launch`: kernel launches, with programmatic dependent launch on sm_90.

pub(crate) mod launch;
pub mod libs;
pub(crate) mod result;

pub(crate) use launch::{launch, pdl_for_current_device};

use std::ffi::CString;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::{sys, sys as drv, CudaContext};

use crate::error::{Error, Result};
use crate::types::Device;

/// A device attribute ([`current_device_attribute`]): cudarc's enum of the driver's.
pub(crate) use cudarc::driver::sys::CUdevice_attribute as DeviceAttribute;

/// The flags cudarc's safe stream, event and graph types take, for a program that drives a GPU
/// with them (the bench): the driver's enums, named here so that `sys` stays in this layer.
pub use cudarc::driver::sys::{
    CUevent_flags as EventFlags, CUgraphInstantiate_flags as GraphInstantiateFlags,
    CUstreamCaptureMode as CaptureMode,
};

/// Number of CUDA devices visible, 0 when the driver library is absent or fails to start.
pub fn gpu_count() -> usize {
    if !libs::driver_present() {
        return 0;
    }
    if cudarc::driver::result::init().is_err() {
        return 0;
    }
    cudarc::driver::result::device::get_count()
        .map(|n| n.max(0) as usize)
        .unwrap_or(0)
}

/// Starts the driver ([cuInit]); the error says why it would not (no device, a driver too old).
///
/// [cuInit]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__INITIALIZE.html
pub fn init() -> Result<()> {
    if !libs::driver_present() {
        return Err(Error::Cuda("libcuda is not present on this machine".into()));
    }
    cudarc::driver::result::init().map_err(|e| Error::Cuda(format!("cuInit: {e}")))
}

/// The CUDA version the driver supports, as (major, minor) ([cuDriverGetVersion]; after
/// [`init`]).
///
/// [cuDriverGetVersion]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__VERSION.html
pub fn driver_version() -> Result<(i32, i32)> {
    let mut v = 0i32;
    cu(
        // SAFETY: out-parameter of one int.
        unsafe { sys::cuDriverGetVersion(&mut v) },
        "cuDriverGetVersion",
    )?;
    Ok((v / 1000, (v % 1000) / 10))
}

/// The driver's handle of visible device `ordinal`, checked against the count ([cuDeviceGet]).
///
/// [cuDeviceGet]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__DEVICE.html
fn device(ordinal: usize) -> Result<sys::CUdevice> {
    let n = gpu_count();
    if ordinal >= n {
        return Err(Error::InvalidArgument(format!(
            "no CUDA device {ordinal} ({n} visible)"
        )));
    }
    cudarc::driver::result::device::get(ordinal as i32)
        .map_err(|e| Error::Cuda(format!("cuDeviceGet({ordinal}): {e:?}")))
}

/// The model of CUDA device `ordinal` as the driver names it (`NVIDIA H200`).
pub fn device_name(ordinal: usize) -> Result<String> {
    cudarc::driver::result::device::get_name(device(ordinal)?)
        .map_err(|e| Error::Cuda(format!("cuDeviceGetName({ordinal}): {e:?}")))
}

/// The compute capability of device `ordinal` as (major, minor) (`(9, 0)` on an H200).
pub fn device_compute_capability(ordinal: usize) -> Result<(i32, i32)> {
    let d = device(ordinal)?;
    let major = result::device_get_attribute(
        DeviceAttribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        d,
    )?;
    let minor = result::device_get_attribute(
        DeviceAttribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
        d,
    )?;
    Ok((major, minor))
}

/// The bytes of memory on device `ordinal` ([cuDeviceTotalMem]).
///
/// [cuDeviceTotalMem]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__DEVICE.html
pub fn device_total_memory(ordinal: usize) -> Result<usize> {
    let d = device(ordinal)?;
    // SAFETY: `d` came from cuDeviceGet.
    unsafe { cudarc::driver::result::device::total_mem(d) }
        .map_err(|e| Error::Cuda(format!("cuDeviceTotalMem({ordinal}): {e:?}")))
}

/// The PCI bus id of device `ordinal` (`0000:19:00.0`).
pub fn device_pci_bus_id(ordinal: usize) -> Result<String> {
    result::device_get_pci_bus_id(device(ordinal)?)
}

/// Whether device `a` can map the memory of device `b` ([cuDeviceCanAccessPeer]).
///
/// [cuDeviceCanAccessPeer]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__PEER__ACCESS.html
pub fn can_access_peer(a: usize, b: usize) -> Result<bool> {
    let (da, db) = (device(a)?, device(b)?);
    let mut ok = 0i32;
    // SAFETY: both devices came from cuDeviceGet; one int is written.
    let r = unsafe { sys::cuDeviceCanAccessPeer(&mut ok, da, db) };
    cu(r, "cuDeviceCanAccessPeer")?;
    Ok(ok == 1)
}

/// Turns a driver result into our error, naming the call.
pub(crate) fn cu(r: sys::CUresult, what: &str) -> Result<()> {
    cu_lazy(r, || what.to_string())
}

/// [`cu`] for the per-call paths (kernel launches): the description is built only on failure.
pub(crate) fn cu_lazy(r: sys::CUresult, what: impl FnOnce() -> String) -> Result<()> {
    r.result()
        .map_err(|e| Error::Cuda(format!("{}: {e:?}", what())))
}

/// Opens the primary context of `device` for this process, with cudarc's event tracking off
/// (it synchronizes and breaks graph capture).
pub(crate) fn open_context(device: Device) -> Result<Arc<CudaContext>> {
    let Device::Cuda(ordinal) = device else {
        return Err(Error::InvalidArgument(
            "the cuda backend needs a CUDA device".into(),
        ));
    };
    if !libs::driver_present() {
        return Err(Error::LibraryMissing {
            library: "libcuda",
            why: "the NVIDIA driver library (libcuda.so.1) is not on the library path".into(),
        });
    }
    let n = gpu_count();
    if ordinal as usize >= n {
        return Err(Error::InvalidArgument(format!(
            "device cuda:{ordinal} does not exist ({n} visible)"
        )));
    }
    let ctx = CudaContext::new(ordinal as usize)
        .map_err(|e| Error::Cuda(format!("creating the context of cuda:{ordinal}: {e:?}")))?;
    // SAFETY: ferrocomm never hands CudaSlices across streams; all its buffers are raw
    // allocations whose stream use it orders itself.
    unsafe { ctx.disable_event_tracking() };
    Ok(ctx)
}

/// Makes `ctx` the calling thread's current context.
pub(crate) fn bind(ctx: &CudaContext) -> Result<()> {
    ctx.bind_to_thread()
        .map_err(|e| Error::Cuda(format!("binding the context: {e:?}")))
}

/// An attribute of the device of the current context (the caller made a context current).
pub(crate) fn current_device_attribute(a: DeviceAttribute) -> Result<i32> {
    result::device_get_attribute(a, result::ctx_get_device()?)
}

/// The device a pointer lives on, or an error when it is not CUDA memory.
pub(crate) fn pointer_device(ptr: u64, collective: &'static str, what: &str) -> Result<u32> {
    let mut ord: i32 = -1;
    // SAFETY: DEVICE_ORDINAL writes one int; an unknown pointer is reported as an error code.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut ord as *mut i32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS || ord < 0 {
        return Err(Error::InvalidArgument(format!(
            "{collective}: {what} pointer {ptr:#x} is not CUDA device memory ({r:?})"
        )));
    }
    Ok(ord as u32)
}

/// Whether `stream` is being captured into a CUDA graph.
pub(crate) fn capturing(stream: u64) -> Result<bool> {
    let mut s = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    cu(
        // SAFETY: out-parameter for a stream of this context.
        unsafe { sys::cuStreamIsCapturing(stream as sys::CUstream, &mut s) },
        "cuStreamIsCapturing",
    )?;
    Ok(s != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// Whether `stream` is being captured into a CUDA graph (an error counts as capturing: then no
/// event is recorded, which is always safe).
pub(crate) fn capturing_or_unknown(stream: u64) -> bool {
    let mut s = drv::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: out-parameter for a stream of the current context.
    let r = unsafe { drv::cuStreamIsCapturing(stream as drv::CUstream, &mut s) };
    r != drv::CUresult::CUDA_SUCCESS
        || s != drv::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
}

/// A device's context, kept alive (primary context retained) for helper threads (the NCCL
/// watchdog and abort threads), which make it current.
pub(crate) struct DeviceContext {
    pub(crate) ctx: drv::CUcontext,
    dev: drv::CUdevice,
}

// SAFETY: a CUcontext may be made current on any thread.
unsafe impl Send for DeviceContext {}
// SAFETY: as above; never mutated.
unsafe impl Sync for DeviceContext {}

impl DeviceContext {
    /// The calling thread's current context, its device's primary context retained.
    pub(crate) fn current() -> Result<DeviceContext> {
        let mut ctx: drv::CUcontext = std::ptr::null_mut();
        // SAFETY: out-parameter.
        cu(unsafe { drv::cuCtxGetCurrent(&mut ctx) }, "cuCtxGetCurrent")?;
        if ctx.is_null() {
            return Err(Error::Cuda(
                "NCCL needs the device's context current on the calling thread".into(),
            ));
        }
        let mut dev: drv::CUdevice = 0;
        // SAFETY: out-parameter; a context is current.
        cu(unsafe { drv::cuCtxGetDevice(&mut dev) }, "cuCtxGetDevice")?;
        let mut primary: drv::CUcontext = std::ptr::null_mut();
        cu(
            // SAFETY: out-parameter; released in Drop.
            unsafe { drv::cuDevicePrimaryCtxRetain(&mut primary, dev) },
            "cuDevicePrimaryCtxRetain",
        )?;
        Ok(DeviceContext { ctx, dev })
    }

    /// Prepares a helper thread of ours (watchdog, abort): the context current, and the
    /// thread's capture mode thread-local, so that its event queries and NCCL's teardown never
    /// invalidate a graph another thread is capturing in the default (global) mode.
    pub(crate) fn enter_helper_thread(&self) -> std::result::Result<(), String> {
        // SAFETY: the context is alive (primary retained by self).
        let r = unsafe { drv::cuCtxSetCurrent(self.ctx) };
        r.result().map_err(|e| format!("cuCtxSetCurrent: {e:?}"))?;
        let mut mode = drv::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        // SAFETY: in/out parameter; sets this thread's mode only (the thread is ours, the
        // previous mode is not restored).
        let r = unsafe { drv::cuThreadExchangeStreamCaptureMode(&mut mode) };
        r.result()
            .map_err(|e| format!("cuThreadExchangeStreamCaptureMode: {e:?}"))
    }
}

impl Drop for DeviceContext {
    fn drop(&mut self) {
        // SAFETY: retained once in `current`.
        unsafe { drv::cuDevicePrimaryCtxRelease_v2(self.dev) };
    }
}

/// Makes a context current for a scope and restores the caller's afterwards.
pub(crate) struct PushedContext;

impl PushedContext {
    pub(crate) fn push(ctx: drv::CUcontext) -> Option<PushedContext> {
        // SAFETY: a live context; popped in Drop.
        let r = unsafe { drv::cuCtxPushCurrent_v2(ctx) };
        (r == drv::CUresult::CUDA_SUCCESS).then_some(PushedContext)
    }
}

impl Drop for PushedContext {
    fn drop(&mut self) {
        let mut old: drv::CUcontext = std::ptr::null_mut();
        // SAFETY: pops the context pushed in `push`.
        unsafe { drv::cuCtxPopCurrent_v2(&mut old) };
    }
}

/// A CUDA event without timing (a completion marker, as the NCCL watchdog's).
pub(crate) struct Event(pub(crate) drv::CUevent);

// SAFETY: events may be queried and destroyed from any thread.
unsafe impl Send for Event {}

impl Event {
    /// A new event; `what` names it in an error.
    pub(crate) fn new(what: &str) -> Result<Event> {
        let mut e: drv::CUevent = std::ptr::null_mut();
        cu(
            // SAFETY: out-parameter; no timing, so recording and querying stay cheap.
            unsafe {
                drv::cuEventCreate(&mut e, drv::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
            },
            what,
        )?;
        Ok(Event(e))
    }

    /// Records the event on `stream` (a stream of the current context, as the event's)
    /// ([cuEventRecord]); `what` names it in an error. Re-recording replaces the last point.
    ///
    /// [cuEventRecord]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html
    pub(crate) fn record(&self, stream: u64, what: &str) -> Result<()> {
        cu(
            // SAFETY: a live event; the caller's stream belongs to the current context.
            unsafe { drv::cuEventRecord(self.0, stream as drv::CUstream) },
            what,
        )
    }

    /// Makes `stream`'s later work wait for the event's last record, without blocking the
    /// host ([cuStreamWaitEvent]); `what` names it in an error.
    ///
    /// [cuStreamWaitEvent]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
    pub(crate) fn wait_in(&self, stream: u64, what: &str) -> Result<()> {
        cu(
            // SAFETY: a live event; the caller's stream belongs to the current context.
            unsafe { drv::cuStreamWaitEvent(stream as drv::CUstream, self.0, 0) },
            what,
        )
    }

    /// Whether the work before the event's record has finished.
    pub(crate) fn query(&self) -> std::result::Result<bool, String> {
        // SAFETY: a live event, recorded on a stream of this context.
        match unsafe { drv::cuEventQuery(self.0) } {
            drv::CUresult::CUDA_SUCCESS => Ok(true),
            drv::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(format!("cuEventQuery: {e:?}")),
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once (pending work keeps it valid until done).
        unsafe { drv::cuEventDestroy_v2(self.0) };
    }
}

/// A stream of ours (not the caller's), non-blocking with respect to the legacy stream,
/// destroyed on drop.
pub(crate) struct Stream(drv::CUstream);

// SAFETY: a stream may be used and destroyed from any thread.
unsafe impl Send for Stream {}
// SAFETY: enqueueing on one stream from several threads is allowed by the driver.
unsafe impl Sync for Stream {}

impl Stream {
    /// A new stream in the current context ([cuStreamCreate], `NON_BLOCKING`); `what` names
    /// it in an error.
    ///
    /// [cuStreamCreate]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
    pub(crate) fn non_blocking(what: &str) -> Result<Stream> {
        let mut s: drv::CUstream = std::ptr::null_mut();
        let flags = drv::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: out-parameter; a context is current or the call fails.
        cu(unsafe { drv::cuStreamCreate(&mut s, flags) }, what)?;
        Ok(Stream(s))
    }

    /// The stream as the integer the rest of the crate passes streams as.
    pub(crate) fn raw(&self) -> u64 {
        self.0 as u64
    }

    /// Waits until the stream has run everything enqueued on it.
    pub(crate) fn synchronize(&self, what: &str) -> Result<()> {
        // SAFETY: a live stream of ours.
        unsafe { result::stream_synchronize(self.raw(), what) }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: created once by `non_blocking`, destroyed once; errors at teardown are
        // ignored because nothing can act on them.
        unsafe { drv::cuStreamDestroy_v2(self.0) };
    }
}

/// A kernel of a loaded [`Module`]: a handle valid while its module stays loaded.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Function(drv::CUfunction);

// SAFETY: a function handle may be launched from any thread of the process.
unsafe impl Send for Function {}
// SAFETY: as above; the handle is never mutated.
unsafe impl Sync for Function {}

impl Function {
    pub(crate) fn raw(self) -> drv::CUfunction {
        self.0
    }
}

/// A loaded module of compiled kernels (a cubin), unloaded on drop unless
/// [`Module::keep_loaded`].
pub(crate) struct Module(drv::CUmodule);

// SAFETY: a module may be used and unloaded from any thread.
unsafe impl Send for Module {}
// SAFETY: looking functions up is allowed from several threads.
unsafe impl Sync for Module {}

impl Module {
    /// Loads `image` for the current context's device ([cuModuleLoadData]): a complete cubin,
    /// or PTX ending in its NUL, which the driver compiles as it loads; `what` names the load
    /// in an error.
    ///
    /// [cuModuleLoadData]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MODULE.html
    pub(crate) fn load(image: &[u8], what: &str) -> Result<Module> {
        let cubin = image.len() >= 4 && &image[..4] == b"\x7fELF";
        // The driver reads PTX up to its NUL: one inside the slice keeps it in bounds.
        let ptx = !cubin && image.last() == Some(&0);
        if !cubin && !ptx {
            return Err(Error::Cuda(format!(
                "{what}: the image is neither a cubin nor NUL-terminated PTX"
            )));
        }
        let mut m: drv::CUmodule = std::ptr::null_mut();
        cu(
            // SAFETY: out-parameter; the image is an ELF cubin or NUL-terminated text, which the
            // driver parses (and refuses with an error code when it is not code for this device).
            unsafe { drv::cuModuleLoadData(&mut m, image.as_ptr().cast()) },
            what,
        )?;
        Ok(Module(m))
    }

    /// The kernel `name` of the module ([cuModuleGetFunction]).
    ///
    /// [cuModuleGetFunction]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MODULE.html
    pub(crate) fn function(&self, name: &str) -> Result<Function> {
        let c = CString::new(name)
            .map_err(|_| Error::InvalidArgument(format!("kernel name {name:?} holds a NUL")))?;
        let mut f: drv::CUfunction = std::ptr::null_mut();
        cu(
            // SAFETY: a live module, a NUL-terminated name, an out-parameter.
            unsafe { drv::cuModuleGetFunction(&mut f, self.0, c.as_ptr()) },
            name,
        )?;
        Ok(Function(f))
    }

    /// Keeps the module loaded for the rest of the process (its functions stay valid): for
    /// kernels cached once per process.
    pub(crate) fn keep_loaded(self) {
        std::mem::forget(self);
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: loaded once by `load`, unloaded once; nothing launches its functions after.
        unsafe { drv::cuModuleUnload(self.0) };
    }
}

/// Events kept for [`Completion`]s: an event goes back here when its completion is dropped, so
/// a run of async calls creates events only for the calls in flight at one time.
pub(crate) struct EventPool {
    /// Declared first: the events are destroyed while the context below is still held.
    free: Mutex<Vec<Event>>,
    /// The context the events belong to, held as long as a completion may use one (a work
    /// object can outlive its communicator).
    _ctx: Arc<CudaContext>,
}

/// Events a pool keeps for reuse; beyond that a returned event is destroyed.
const POOL_KEEP: usize = 64;

impl EventPool {
    /// An empty pool of events of `ctx`.
    pub(crate) fn new(ctx: Arc<CudaContext>) -> EventPool {
        EventPool {
            free: Mutex::default(),
            _ctx: ctx,
        }
    }

    /// A completion recorded on `stream` (a stream of the calling thread's current context,
    /// where the pool's events are created too).
    pub(crate) fn record(self: &Arc<Self>, stream: u64) -> Result<Completion> {
        let reused = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let event = match reused {
            Some(e) => e,
            None => Event::new("cuEventCreate (work completion)")?,
        };
        // Re-recording an event no completion refers to any more is allowed.
        event.record(stream, "cuEventRecord (work completion)")?;
        Ok(Completion {
            event: Some(event),
            pool: Arc::clone(self),
        })
    }
}

/// The point of a CUDA stream right after a call: what an async call's work object asks
/// whether the call has finished, orders another stream after, or waits for.
/// ([`crate::Communicator::mark`] records one.)
pub struct Completion {
    /// Some until dropped (then handed back to the pool).
    event: Option<Event>,
    pool: Arc<EventPool>,
}

// SAFETY: the event is only queried, waited on and made a dependency of other streams, which
// the driver allows from any thread at once; it is re-recorded only after the drop.
unsafe impl Sync for Completion {}

impl Completion {
    fn event(&self) -> drv::CUevent {
        self.event.as_ref().expect("present until dropped").0
    }

    /// Whether the stream has passed the point ([cuEventQuery]). An error for a point recorded
    /// while the stream was captured into a CUDA graph (it never runs as such).
    ///
    /// [cuEventQuery]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html
    pub fn is_done(&self) -> Result<bool> {
        self.event
            .as_ref()
            .expect("present until dropped")
            .query()
            .map_err(|e| Error::Cuda(format!("{e} (work completion)")))
    }

    /// Makes `stream`'s later work wait for the point, without blocking the host
    /// ([cuStreamWaitEvent]); also while `stream` is captured (a graph dependency).
    ///
    /// [cuStreamWaitEvent]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
    pub fn order(&self, stream: u64) -> Result<()> {
        cu(
            // SAFETY: a live event; the caller's stream on the same device.
            unsafe { drv::cuStreamWaitEvent(stream as drv::CUstream, self.event(), 0) },
            "cuStreamWaitEvent (work completion)",
        )
    }

    /// Blocks until the stream has passed the point, or `limit` has passed (then `Ok(false)`);
    /// `None` waits as long as it takes ([cuEventSynchronize]).
    ///
    /// [cuEventSynchronize]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html
    pub fn wait(&self, limit: Option<Duration>) -> Result<bool> {
        // A limit past the clock's range waits as long as it takes.
        let deadline = limit.and_then(|l| Instant::now().checked_add(l));
        let Some(deadline) = deadline else {
            cu(
                // SAFETY: a live event.
                unsafe { drv::cuEventSynchronize(self.event()) },
                "cuEventSynchronize (work completion)",
            )?;
            return Ok(true);
        };
        loop {
            if self.is_done()? {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        if let Some(e) = self.event.take() {
            let mut free = self.pool.free.lock().unwrap_or_else(|p| p.into_inner());
            if free.len() < POOL_KEEP {
                free.push(e);
            }
        }
    }
}

/// A copy of `bytes` bytes of device memory at `ptr`, taken once the device has finished the
/// work issued so far (the input of a call may still be being written on its stream): for the
/// opt-in NaN check of CUDA inputs. The pointer's own context is made current for the copy.
pub(crate) fn copy_to_host(ptr: u64, bytes: usize) -> Result<Vec<u8>> {
    let mut ctx: drv::CUcontext = std::ptr::null_mut();
    cu(
        // SAFETY: CONTEXT writes one CUcontext; an unknown pointer is an error code.
        unsafe {
            drv::cuPointerGetAttribute(
                (&mut ctx as *mut drv::CUcontext).cast(),
                drv::CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT,
                ptr,
            )
        },
        "the context of a buffer to check",
    )?;
    let _pushed = PushedContext::push(ctx)
        .ok_or_else(|| Error::Cuda("making a buffer's context current".into()))?;
    result::ctx_synchronize("waiting for the work before a buffer to check")?;
    let mut out = vec![0u8; bytes];
    // SAFETY: `out` holds `bytes` bytes; the caller's view says `ptr` holds as many.
    unsafe {
        result::memcpy_dtoh(
            out.as_mut_ptr().cast(),
            ptr,
            bytes,
            "copying a buffer to check",
        )
    }?;
    Ok(out)
}
