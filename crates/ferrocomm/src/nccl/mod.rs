//! NCCL, loaded dynamically: the fallback for what direct access does not win, and the baseline.
//!
//! `Nccl` (crate-internal) is one NCCL communicator with a method per collective on raw
//! device pointers; [`NcclBackend`] runs calls on it as a [`Backend`] of its own (backend name
//! `nccl`, [`new_backend`]), and the cuda backend holds one underneath its direct-access paths
//! and hands it what they do not carry.

mod sys;
mod watchdog;

use std::ffi::{c_int, c_void, CStr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use cudarc::driver::CudaContext;

use crate::backend::{
    call_timeout, check_buffers, unsupported, Backend, Call, CallKind, CallOpts, CommContext,
    P2pOp, Splits,
};
use crate::config::Config;
use crate::driver::{
    bind, capturing_or_unknown as capturing, result, Completion, DeviceContext, Event, EventPool,
    PushedContext,
};
use crate::error::{Error, Result};
use crate::plan::{self, CallShape, Plan};
use crate::types::{DataType, Device, ReduceOp};
use crate::view::{Input, ViewMut};

/// The libnccl files we try, in order.
fn candidates(cfg: &Config) -> Vec<PathBuf> {
    let mut c = Vec::new();
    if let Some(p) = &cfg.nccl_lib {
        c.push(p.clone());
        return c;
    }
    c.push(PathBuf::from("libnccl.so.2"));
    c.push(PathBuf::from("libnccl.so"));
    for d in crate::driver::libs::python_lib_dirs(cfg, &["nccl/lib"]) {
        c.push(d.join("libnccl.so.2"));
    }
    c
}

static LIB: OnceLock<std::result::Result<sys::Lib, String>> = OnceLock::new();

fn lib(cfg: &Config) -> Result<&'static sys::Lib> {
    LIB.get_or_init(|| {
        let mut tried = Vec::new();
        for p in candidates(cfg) {
            // SAFETY: every candidate is a libnccl by name; loading runs its initialisers.
            match unsafe { sys::Lib::load(&p) } {
                Ok(l) => return Ok(l),
                Err(e) => tried.push(format!("{}: {e}", p.display())),
            }
        }
        Err(tried.join("; "))
    })
    .as_ref()
    .map_err(|why| Error::LibraryMissing {
        library: "libnccl",
        why: format!("set FERROCOMM_NCCL_LIB to a libnccl.so.2 ({why})"),
    })
}

/// NCCL's version code (22803 for 2.28.3; 2.8 and older: 2708 for 2.7.8).
fn version(l: &sys::Lib) -> Result<c_int> {
    let mut v: c_int = 0;
    check(
        l,
        // SAFETY: out-parameter.
        unsafe { (l.ncclGetVersion)(&mut v) },
        "ncclGetVersion",
        None,
    )?;
    Ok(v)
}

/// The libnccl that would be used, and its version (`2.28.3`), for `ferrocomm info`.
pub fn probe(cfg: &Config) -> Result<(PathBuf, String)> {
    let l = lib(cfg)?;
    let v = version(l)?;
    let (major, minor, patch) = if v >= 10000 {
        (v / 10000, (v % 10000) / 100, v % 100)
    } else {
        (v / 1000, (v % 1000) / 100, v % 100)
    };
    Ok((l.path.clone(), format!("{major}.{minor}.{patch}")))
}

/// NCCL's description of `r`, with the communicator's last error when there is one.
fn describe_error(l: &sys::Lib, r: sys::NcclResult, comm: Option<sys::NcclComm>) -> String {
    // SAFETY: NCCL returns static C strings (or NULL).
    let s = unsafe { (l.ncclGetErrorString)(r) };
    let mut msg = if s.is_null() {
        format!("error {r}")
    } else {
        // SAFETY: non-null C string owned by NCCL.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    };
    if let Some(c) = comm.filter(|c| !c.is_null()) {
        // SAFETY: live communicator; NCCL keeps the string.
        let last = unsafe { (l.ncclGetLastError)(c) };
        if !last.is_null() {
            // SAFETY: non-null C string owned by NCCL.
            let t = unsafe { CStr::from_ptr(last) }.to_string_lossy();
            if !t.is_empty() {
                msg.push_str(&format!(" ({t})"));
            }
        }
    }
    msg
}

fn check(l: &sys::Lib, r: sys::NcclResult, what: &str, comm: Option<sys::NcclComm>) -> Result<()> {
    if r == sys::SUCCESS {
        return Ok(());
    }
    Err(Error::Nccl(format!(
        "{what}: {}",
        describe_error(l, r, comm)
    )))
}

/// The asynchronous error of `comm`, if it has one (`ncclInProgress` is not an error).
fn async_error(l: &sys::Lib, comm: sys::NcclComm) -> Option<sys::NcclResult> {
    let get = l.ncclCommGetAsyncError?;
    if comm.is_null() {
        return None;
    }
    let mut a = sys::SUCCESS;
    // SAFETY: live communicator, out-parameter.
    let r = unsafe { get(comm, &mut a) };
    if r != sys::SUCCESS {
        return Some(r);
    }
    (a != sys::SUCCESS && a != sys::IN_PROGRESS).then_some(a)
}

/// Polls a nonblocking communicator until it leaves `ncclInProgress`, at most `timeout`.
/// `Some(code)` is the outcome (`ncclSuccess` or the error), `None` the deadline.
/// `None` when the deadline passes, or as soon as `stop` is set (an abort from another thread).
fn wait_ready(
    l: &sys::Lib,
    comm: sys::NcclComm,
    timeout: Duration,
    stop: Option<&AtomicBool>,
) -> Option<sys::NcclResult> {
    let Some(get) = l.ncclCommGetAsyncError else {
        return Some(sys::IN_PROGRESS);
    };
    let deadline = Instant::now() + timeout;
    let mut polls = 0u32;
    loop {
        let mut a = sys::IN_PROGRESS;
        // SAFETY: live communicator, out-parameter.
        let r = unsafe { get(comm, &mut a) };
        if r != sys::SUCCESS {
            return Some(r);
        }
        if a != sys::IN_PROGRESS {
            return Some(a);
        }
        if Instant::now() >= deadline || stop.is_some_and(|s| s.load(Ordering::Acquire)) {
            return None;
        }
        // Connection set-up takes milliseconds: yield first, then sleep briefly.
        if polls < 1000 {
            polls += 1;
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// A communicator handle that may cross to the abort thread.
struct SendComm(sys::NcclComm);
// SAFETY: NCCL communicators may be used from any thread; ownership moves with it.
unsafe impl Send for SendComm {}

/// `ncclCommAbort` with a deadline: it runs on a thread of its own, and if it has not returned
/// within `limit` (some NCCL releases hang in abort) the communicator is abandoned.
fn abort_bounded(
    l: &'static sys::Lib,
    comm: sys::NcclComm,
    dc: &Arc<DeviceContext>,
    limit: Duration,
) -> std::result::Result<(), String> {
    let Some(abort) = l.ncclCommAbort else {
        return Err("this libnccl has no ncclCommAbort; the communicator is abandoned".into());
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let c = SendComm(comm);
    let dc2 = dc.clone();
    let spawned = std::thread::Builder::new()
        .name("ferrocomm-nccl-abort".into())
        .spawn(move || {
            let c = c;
            let _ = dc2.enter_helper_thread();
            // SAFETY: a live communicator, aborted once (its owner forgets it).
            let r = unsafe { abort(c.0) };
            let _ = tx.send(r);
        });
    let r = match spawned {
        Ok(_) => match rx.recv_timeout(limit) {
            Ok(r) => r,
            Err(_) => {
                return Err(format!(
                    "ncclCommAbort did not return within {limit:?}; the communicator is abandoned"
                ))
            }
        },
        // SAFETY: as above, on this thread since no other could start.
        Err(_) => unsafe { abort(comm) },
    };
    check(l, r, "ncclCommAbort", None).map_err(|e| e.to_string())
}

/// The communicator handle and whether it can still be used.
struct CommState {
    /// Null once aborted or destroyed.
    comm: sys::NcclComm,
    /// Why the communicator was aborted; every later call fails with it.
    failed: Option<String>,
}

/// What a communicator's owner and its watchdog share.
struct Shared {
    lib: &'static sys::Lib,
    state: Mutex<CommState>,
    dc: Arc<DeviceContext>,
    timeout: Duration,
    /// "NCCL communicator of rank 0 of 2", for messages.
    describe: String,
    /// Set by [`Nccl::abort`] before it takes the state lock: a call waiting for NCCL under
    /// that lock stops waiting.
    aborting: AtomicBool,
    /// A one-rank communicator on an NCCL whose one-rank PreMulSum kernel leaves the last
    /// elements of some counts unwritten (before 2.29.7, NVIDIA/nccl#1950): such calls are
    /// issued in pieces it covers whole ([`one_rank_pieces`]).
    split_one_rank_premul: bool,
}

/// The first NCCL whose one-rank reduction kernel covers every count (NVIDIA/nccl#1950).
const ONE_RANK_FIXED: c_int = 22907;

/// `count` elements of `elem` bytes cut into at most two pieces `(first element, count)` that
/// NCCL's one-rank reduction kernel (before 2.29.7) writes whole. That kernel runs
/// `b = min(32, ceil(bytes / 16 KiB))` blocks over `b * round_up(count / b, 16 / elem)` elements
/// (the division rounded down): short of `count` when it rounds. The head is a multiple of
/// 16 KiB below 512 KiB (k blocks of exactly 16 KiB), else a multiple of 512 bytes (32 blocks of
/// a multiple of 16 bytes); the rest is under 16 KiB (one block).
fn one_rank_pieces(count: usize, elem: usize) -> Vec<(usize, usize)> {
    const BLOCK: usize = 16 << 10;
    let bytes = count.saturating_mul(elem);
    let mut pieces = Vec::with_capacity(3);
    let mut push = |first: usize, n: usize| {
        if n > 0 {
            pieces.push((first, n));
        }
    };
    let head = if bytes >= 32 * BLOCK {
        bytes / 512 * 512
    } else {
        bytes / BLOCK * BLOCK
    };
    push(0, head / elem);
    push(head / elem, count - head / elem);
    pieces
}

// SAFETY: the raw communicator is only touched under the mutex.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, CommState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks the communicator failed with `reason`, then aborts it (NCCL's kernels exit, the
    /// streams drain). Nothing is enqueued on it afterwards and Drop does not destroy it again.
    fn fail(&self, st: &mut CommState, reason: String) {
        if st.failed.is_some() {
            return;
        }
        st.failed = Some(reason);
        let comm = std::mem::replace(&mut st.comm, std::ptr::null_mut());
        if !comm.is_null() {
            if let Err(e) = abort_bounded(self.lib, comm, &self.dc, self.timeout) {
                if let Some(f) = st.failed.as_mut() {
                    f.push_str(&format!(" ({e})"));
                }
            }
        }
    }
}

/// What the watchdog thread acts on.
struct NcclGuard(Arc<Shared>);

impl watchdog::Guard for NcclGuard {
    fn async_error(&mut self) -> Option<String> {
        let st = self.0.lock();
        if st.failed.is_some() {
            return None;
        }
        async_error(self.0.lib, st.comm).map(|r| describe_error(self.0.lib, r, Some(st.comm)))
    }

    fn abort(&mut self, reason: &str) {
        let mut st = self.0.lock();
        self.0.fail(&mut st, reason.to_string());
    }
}

impl watchdog::Pending for Event {
    fn is_done(&mut self) -> std::result::Result<bool, String> {
        self.query()
    }
}

/// How often the watchdog polls the events of work in flight.
const WATCHDOG_TICK: Duration = Duration::from_millis(1);

/// One NCCL communicator, with a deadline on its initialisation and a watchdog on its work.
///
/// The communicator is nonblocking (`blocking = 0`) where the library allows it, so that no NCCL
/// call can block past `config.timeout`: a call that returns `ncclInProgress` is polled with
/// `ncclCommGetAsyncError` until it completes or the deadline passes, and the watchdog aborts the
/// communicator when enqueued work stays incomplete past the timeout (see the `watchdog` module).
pub(crate) struct Nccl {
    sh: Arc<Shared>,
    /// Calls may return `ncclInProgress`.
    nonblocking: bool,
    watchdog: Option<watchdog::Watchdog<Event>>,
    /// Operations enqueued so far (call #1 is the first, in timeout messages).
    seq: AtomicU64,
}

/// A reduction operator as NCCL takes it; PremulSum ops are created per call and destroyed.
struct RedOp {
    op: c_int,
    created: bool,
}

/// The communicator, locked for one call.
struct Live<'a> {
    sh: &'a Shared,
    st: &'a mut CommState,
    nonblocking: bool,
}

impl Live<'_> {
    fn lib(&self) -> &'static sys::Lib {
        self.sh.lib
    }

    fn comm(&self) -> sys::NcclComm {
        self.st.comm
    }

    /// The outcome of an NCCL call. On a nonblocking communicator `ncclInProgress` means the
    /// call is still being carried out: poll until it completes (the operation is then on the
    /// stream) or the deadline passes (the communicator is aborted). An error reported
    /// asynchronously while waiting also fails the communicator.
    fn ok(&mut self, r: sys::NcclResult, what: &str) -> Result<()> {
        if r == sys::IN_PROGRESS && self.nonblocking && !self.st.comm.is_null() {
            let timeout = call_timeout(self.sh.timeout);
            let stop = Some(&self.sh.aborting);
            return match wait_ready(self.sh.lib, self.st.comm, timeout, stop) {
                Some(sys::SUCCESS) => Ok(()),
                Some(code) => {
                    let reason = format!(
                        "{what} on {}: {}; communicator aborted",
                        self.sh.describe,
                        describe_error(self.sh.lib, code, Some(self.st.comm))
                    );
                    self.sh.fail(self.st, reason.clone());
                    Err(Error::Nccl(reason))
                }
                None if self.sh.aborting.load(Ordering::Acquire) => {
                    let reason = format!("{what} on {}: abort() was called", self.sh.describe);
                    self.sh.fail(self.st, reason.clone());
                    Err(Error::Nccl(reason))
                }
                None => {
                    let reason = format!(
                        "{what} on {}: Timed out after {timeout:?} without being carried out (a \
                         peer never made the matching call, died, or cannot be reached); \
                         communicator aborted",
                        self.sh.describe
                    );
                    self.sh.fail(self.st, reason.clone());
                    Err(Error::Nccl(reason))
                }
            };
        }
        check(self.sh.lib, r, what, Some(self.st.comm))
    }

    /// The outcome of a call inside a group: `ncclInProgress` there only means deferred to
    /// `ncclGroupEnd`, whose result [`Live::ok`] waits for.
    fn ok_in_group(&self, r: sys::NcclResult, what: &str) -> Result<()> {
        if r == sys::IN_PROGRESS {
            return Ok(());
        }
        check(self.sh.lib, r, what, Some(self.st.comm))
    }

    fn red_op(&mut self, op: ReduceOp, dtype: DataType, collective: &'static str) -> Result<RedOp> {
        let code = match op {
            ReduceOp::Sum => 0,
            ReduceOp::Prod => 1,
            ReduceOp::Max => 2,
            ReduceOp::Min => 3,
            ReduceOp::Avg => 4,
            ReduceOp::PremulSum(s) => {
                let mut scalar = [0u8; 8];
                match dtype {
                    DataType::F64 => scalar.copy_from_slice(&s.to_le_bytes()),
                    DataType::F32 => scalar[..4].copy_from_slice(&(s as f32).to_le_bytes()),
                    DataType::F16 => {
                        scalar[..2].copy_from_slice(&half::f16::from_f64(s).to_le_bytes())
                    }
                    DataType::BF16 => {
                        scalar[..2].copy_from_slice(&half::bf16::from_f64(s).to_le_bytes())
                    }
                    DataType::F8E4M3 => scalar[0] = float8::F8E4M3::from_f64(s).to_bits(),
                    DataType::F8E5M2 => scalar[0] = float8::F8E5M2::from_f64(s).to_bits(),
                    _ => {
                        return Err(Error::UnsupportedOp {
                            collective,
                            op,
                            dtype,
                        })
                    }
                }
                let mut out: c_int = 0;
                // SAFETY: the scalar is read immediately (host-immediate residence).
                let r = unsafe {
                    (self.lib().ncclRedOpCreatePreMulSum)(
                        &mut out,
                        scalar.as_mut_ptr().cast(),
                        nccl_dtype(dtype),
                        sys::SCALAR_HOST_IMMEDIATE,
                        self.comm(),
                    )
                };
                self.ok(r, "ncclRedOpCreatePreMulSum")?;
                return Ok(RedOp {
                    op: out,
                    created: true,
                });
            }
            other => {
                return Err(Error::Unsupported {
                    collective,
                    backend: "nccl",
                    what: format!("reduce op {other}"),
                })
            }
        };
        Ok(RedOp {
            op: code,
            created: false,
        })
    }

    /// Destroys a per-call operator once the call that used it has returned (NCCL allows it).
    /// One reducing NCCL call: `call` gets NCCL's op for `op` (a PremulSum op is created for
    /// this call and destroyed after it, whatever the call returned).
    fn reduce_with(
        &mut self,
        op: ReduceOp,
        dtype: DataType,
        count: usize,
        collective: &'static str,
        what: &str,
        call: impl Fn(&Self, c_int, usize, usize) -> sys::NcclResult,
    ) -> Result<()> {
        let o = self.red_op(op, dtype, collective)?;
        let pieces = if self.sh.split_one_rank_premul && matches!(op, ReduceOp::PremulSum(_)) {
            one_rank_pieces(count, dtype.size())
        } else {
            vec![(0, count)]
        };
        let mut res = Ok(());
        for (first, n) in pieces {
            let r = call(self, o.op, first * dtype.size(), n);
            res = self.ok(r, what);
            if res.is_err() {
                break;
            }
        }
        self.release(o);
        res
    }

    fn release(&mut self, o: RedOp) {
        if o.created && !self.st.comm.is_null() {
            // SAFETY: an op created on this communicator, no longer used.
            let r = unsafe { (self.lib().ncclRedOpDestroy)(o.op, self.comm()) };
            let _ = self.ok(r, "ncclRedOpDestroy");
        }
    }
}

/// Which NCCL reduction [`Nccl::reduction`] enqueues.
#[derive(Clone, Copy)]
pub(crate) enum Reduction {
    /// `ncclAllReduce`: the result on every rank.
    All,
    /// `ncclReduce`: the result on the root alone.
    To(usize),
    /// `ncclReduceScatter`: part `rank` of the result on rank `rank`.
    Scatter,
}

impl Nccl {
    /// Joins the NCCL communicator of `ctx` (rank 0 publishes the unique id through the store).
    /// The device's context must be current on this thread. Initialisation that has not
    /// completed within `ctx.timeout()` (a peer never joined) is aborted and reported.
    pub(crate) fn new(ctx: &CommContext) -> Result<Nccl> {
        let l = lib(&ctx.config)?;
        crate::config::apply_nccl_env_defaults();
        let key = "nccl/unique_id";
        let mut id = sys::UniqueId { internal: [0; 128] };
        if ctx.rank == 0 {
            check(
                l,
                // SAFETY: out-parameter.
                unsafe { (l.ncclGetUniqueId)(&mut id) },
                "ncclGetUniqueId",
                None,
            )?;
            ctx.store.set(key, &id.internal)?;
        } else {
            let v = ctx.store.get(key, ctx.timeout())?;
            if v.len() != 128 {
                return Err(Error::Nccl(format!(
                    "the unique id from rank 0 has {} bytes, expected 128",
                    v.len()
                )));
            }
            id.internal.copy_from_slice(&v);
        }
        let dc = Arc::new(DeviceContext::current()?);
        let timeout = ctx.timeout();
        let describe = format!("the NCCL communicator of rank {} of {}", ctx.rank, ctx.size);
        let (rank, size) = (ctx.rank as c_int, ctx.size as c_int);
        let mut comm: sys::NcclComm = std::ptr::null_mut();
        let nonblocking = match (l.ncclCommInitRankConfig, l.ncclCommGetAsyncError) {
            (Some(init), Some(_)) => {
                let mut config = sys::Config::nonblocking();
                // SAFETY: out-parameter and an initialised config (NCCL copies it).
                let r = unsafe { init(&mut comm, size, id, rank, &mut config) };
                let r = if r == sys::IN_PROGRESS && !comm.is_null() {
                    wait_ready(l, comm, timeout, None)
                } else {
                    Some(r)
                };
                match r {
                    Some(sys::SUCCESS) => {}
                    outcome => {
                        let why = match outcome {
                            Some(code) => describe_error(l, code, Some(comm)),
                            None => format!(
                                "Timed out after {timeout:?} without completing (a peer \
                                 never joined, died, or cannot be reached)"
                            ),
                        };
                        let mut msg = format!(
                            "ncclCommInitRankConfig (rank {} of {}): {why}",
                            ctx.rank, ctx.size
                        );
                        if !comm.is_null() {
                            match abort_bounded(l, comm, &dc, timeout) {
                                Ok(()) => msg.push_str("; communicator aborted"),
                                Err(e) => msg.push_str(&format!("; {e}")),
                            }
                        }
                        return Err(Error::Nccl(msg));
                    }
                }
                // NCCL_COMM_BLOCKING=1 in the environment overrides our config; calls then
                // block as before (no deadline on them).
                true
            }
            _ => {
                // NCCL before 2.14: only the blocking call exists.
                // SAFETY: out-parameter; blocks until all ranks joined.
                let r = unsafe { (l.ncclCommInitRank)(&mut comm, size, id, rank) };
                check(
                    l,
                    r,
                    &format!("ncclCommInitRank (rank {} of {})", ctx.rank, ctx.size),
                    None,
                )?;
                false
            }
        };
        let sh = Arc::new(Shared {
            lib: l,
            state: Mutex::new(CommState { comm, failed: None }),
            dc,
            timeout,
            describe,
            aborting: AtomicBool::new(false),
            split_one_rank_premul: ctx.size == 1 && version(l).is_ok_and(|v| v < ONE_RANK_FIXED),
        });
        let mut nccl = Nccl {
            sh: sh.clone(),
            nonblocking,
            watchdog: None,
            seq: AtomicU64::new(0),
        };
        // Without ncclCommAbort (NCCL before 2.4) hung work cannot be stopped: no watchdog.
        // FERROCOMM_NCCL_WATCHDOG=0 leaves NCCL unwatched (the bench's baseline, as nccl-tests).
        if ctx.config.nccl_watchdog
            && l.ncclCommAbort.is_some()
            && l.ncclCommGetAsyncError.is_some()
        {
            let dc = sh.dc.clone();
            let w = watchdog::Watchdog::start(
                sh.describe.clone(),
                WATCHDOG_TICK,
                move || dc.enter_helper_thread(),
                NcclGuard(sh.clone()),
            )
            .map_err(|e| Error::io("starting the NCCL watchdog thread", e))?;
            nccl.watchdog = Some(w);
        }
        Ok(nccl)
    }

    /// Aborts the communicator now (`ncclCommAbort`, bounded by the timeout): its kernels exit,
    /// later calls fail with `reason`. A call of another thread that waits for NCCL to carry
    /// out its operation stops waiting first (it holds the state lock meanwhile).
    pub(crate) fn abort(&self, reason: &str) {
        self.sh.aborting.store(true, Ordering::Release);
        let mut st = self.sh.lock();
        self.sh.fail(&mut st, reason.to_string());
    }

    /// Why the communicator failed (a timeout or an asynchronous error), once it has.
    pub(crate) fn failure(&self) -> Option<String> {
        self.sh.lock().failed.clone()
    }

    /// Runs one operation: refuses it on a failed communicator, reports an asynchronous error
    /// as its error, lets `enqueue` issue the NCCL calls, then (outside graph capture) records
    /// an event after it on `stream` for the watchdog.
    fn run(
        &self,
        what: &'static str,
        stream: u64,
        enqueue: impl FnOnce(&mut Live<'_>) -> Result<()>,
    ) -> Result<()> {
        let mut st = self.sh.lock();
        if let Some(why) = &st.failed {
            return Err(Error::Nccl(format!(
                "{what} refused: the communicator failed earlier: {why}"
            )));
        }
        if let Some(code) = async_error(self.sh.lib, st.comm) {
            let reason = format!(
                "{} reported an asynchronous error: {}; communicator aborted",
                self.sh.describe,
                describe_error(self.sh.lib, code, Some(st.comm))
            );
            self.sh.fail(&mut st, reason.clone());
            return Err(Error::Nccl(format!("{what} refused: {reason}")));
        }
        let mut live = Live {
            sh: &self.sh,
            st: &mut st,
            nonblocking: self.nonblocking,
        };
        enqueue(&mut live)?;
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let Some(w) = &self.watchdog else {
            return Ok(());
        };
        // During capture the operation only becomes a graph node: nothing runs that the
        // watchdog could follow, and an event record would join the graph.
        if w.failure().is_some() || capturing(stream) {
            return Ok(());
        }
        let ev = match w.recycled() {
            Some(e) => e,
            None => Event::new("cuEventCreate (NCCL watchdog)")?,
        };
        ev.record(stream, "cuEventRecord (NCCL watchdog)")?;
        drop(st);
        w.watch(ev, what, seq, call_timeout(self.sh.timeout));
        Ok(())
    }

    fn stream(s: u64) -> sys::CuStream {
        s as sys::CuStream
    }

    /// A reduction of `count` elements from `send` into `recv` (device addresses, equal when in
    /// place) on `stream`: `ncclAllReduce`, `ncclReduce` into `recv` on the root, or
    /// `ncclReduceScatter` (`send` holds `size * count` elements, part `rank` reduced into
    /// `recv`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn reduction(
        &self,
        kind: Reduction,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: u64,
    ) -> Result<()> {
        let (collective, what) = match kind {
            Reduction::All => ("all_reduce", "ncclAllReduce"),
            Reduction::To(_) => ("reduce", "ncclReduce"),
            Reduction::Scatter => ("reduce_scatter", "ncclReduceScatter"),
        };
        self.run(collective, stream, |live| {
            live.reduce_with(op, dtype, count, collective, what, |live, o, at, n| {
                let (src, dst) = (
                    (send + at as u64) as *const c_void,
                    (recv + at as u64) as *mut c_void,
                );
                let (dt, comm, s) = (nccl_dtype(dtype), live.comm(), Self::stream(stream));
                // SAFETY: device pointers of `count` elements (for the reduce-scatter, `send` of
                // `size * count`) validated by the communicator; a piece (one rank only, where
                // `send` holds `count`) lies within both buffers.
                unsafe {
                    match kind {
                        Reduction::All => (live.lib().ncclAllReduce)(src, dst, n, dt, o, comm, s),
                        Reduction::To(root) => {
                            (live.lib().ncclReduce)(src, dst, n, dt, o, root as c_int, comm, s)
                        }
                        Reduction::Scatter => {
                            (live.lib().ncclReduceScatter)(src, dst, n, dt, o, comm, s)
                        }
                    }
                }
            })
        })
    }

    /// A data move of `count` elements from `send` into `recv` on `stream`: `ncclBroadcast` of
    /// the root's `send` into every rank's `recv`, or `ncclAllGather` of every rank's `count`
    /// elements, concatenated in rank order into `recv` (size * count elements).
    pub(crate) fn data_move(
        &self,
        root: Option<usize>,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        stream: u64,
    ) -> Result<()> {
        let (collective, what) = match root {
            Some(_) => ("broadcast", "ncclBroadcast"),
            None => ("all_gather", "ncclAllGather"),
        };
        self.run(collective, stream, |live| {
            let (src, dst) = (send as *const c_void, recv as *mut c_void);
            let (dt, comm, s) = (nccl_dtype(dtype), live.comm(), Self::stream(stream));
            // SAFETY: device pointers of `count` elements (`recv` of size * count for the
            // all-gather), checked by the communicator.
            let r = unsafe {
                match root {
                    Some(root) => {
                        (live.lib().ncclBroadcast)(src, dst, count, dt, root as c_int, comm, s)
                    }
                    None => (live.lib().ncclAllGather)(src, dst, count, dt, comm, s),
                }
            };
            live.ok(r, what)
        })
    }

    /// Grouped point-to-point: `sends`/`recvs` are (peer, pointer, count) triples.
    pub(crate) fn exchange(
        &self,
        sends: &[(usize, u64, usize)],
        recvs: &[(usize, u64, usize)],
        dtype: DataType,
        stream: u64,
        what: &'static str,
    ) -> Result<()> {
        let sends = sends.iter().map(|&(peer, p, n)| (true, peer, p, n, dtype));
        let recvs = recvs.iter().map(|&(peer, p, n)| (false, peer, p, n, dtype));
        let ops: Vec<_> = sends.chain(recvs).collect();
        self.exchange_ops(&ops, stream, what)
    }

    /// Grouped point-to-point in the order given: (send?, peer, pointer, count, dtype).
    pub(crate) fn exchange_ops(
        &self,
        ops: &[(bool, usize, u64, usize, DataType)],
        stream: u64,
        what: &'static str,
    ) -> Result<()> {
        self.run(what, stream, |live| {
            let l = live.lib();
            // SAFETY: group calls bracket the point-to-point enqueues below.
            live.ok_in_group(unsafe { (l.ncclGroupStart)() }, "ncclGroupStart")?;
            let mut first_err = Ok(());
            for &(send, peer, p, n, dtype) in ops {
                let dt = nccl_dtype(dtype);
                let (comm, s) = (live.comm(), Self::stream(stream));
                // SAFETY: `p` holds (or has room for) `n` elements, checked by the communicator.
                let r = unsafe {
                    if send {
                        (l.ncclSend)(p as *const c_void, n, dt, peer as c_int, comm, s)
                    } else {
                        (l.ncclRecv)(p as *mut c_void, n, dt, peer as c_int, comm, s)
                    }
                };
                if first_err.is_ok() {
                    let call = if send { "ncclSend to" } else { "ncclRecv from" };
                    first_err = live.ok_in_group(r, &format!("{what}: {call} {peer}"));
                }
            }
            // SAFETY: closes the group opened above (always, so that NCCL's group state is
            // reset even after an error); with a nonblocking communicator it may return
            // ncclInProgress, which `ok` waits out.
            let end = live.ok(
                unsafe { (l.ncclGroupEnd)() },
                &format!("{what}: ncclGroupEnd"),
            );
            first_err.and(end)
        })
    }

    /// Releases a healthy communicator without blocking past the timeout: finalize (nonblocking)
    /// and wait for it, then destroy; abort instead when that fails, times out, or the
    /// communicator reports an asynchronous error.
    fn close(&self, comm: sys::NcclComm) {
        let l = self.sh.lib;
        let abort = || {
            let _ = abort_bounded(l, comm, &self.sh.dc, self.sh.timeout);
        };
        if async_error(l, comm).is_some() {
            return abort();
        }
        match (self.nonblocking, l.ncclCommFinalize) {
            (true, Some(finalize)) => {
                // SAFETY: a live communicator with no call of ours in progress.
                let r = unsafe { finalize(comm) };
                let r = if r == sys::IN_PROGRESS {
                    wait_ready(l, comm, self.sh.timeout, None)
                } else {
                    Some(r)
                };
                if r == Some(sys::SUCCESS) {
                    // SAFETY: finalized; destroy frees the rest without blocking.
                    unsafe { (l.ncclCommDestroy)(comm) };
                } else {
                    abort();
                }
            }
            _ => {
                // SAFETY: the communicator was created by `new` and is destroyed once.
                unsafe { (l.ncclCommDestroy)(comm) };
            }
        }
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        // Teardown runs in the communicator's context, whatever thread drops it.
        let _pushed = PushedContext::push(self.sh.dc.ctx);
        // The watchdog must be stopped before the communicator goes: it could abort it (or
        // query its events) while it is destroyed.
        drop(self.watchdog.take());
        let mut st = self.sh.lock();
        // An aborted communicator is already freed: never destroy it again.
        if st.failed.is_some() || st.comm.is_null() {
            return;
        }
        let comm = std::mem::replace(&mut st.comm, std::ptr::null_mut());
        st.failed = Some("the communicator was destroyed".into());
        drop(st);
        self.close(comm);
    }
}

/// NCCL's code for a dtype.
fn nccl_dtype(d: DataType) -> c_int {
    match d {
        DataType::I8 => 0,
        DataType::U8 => 1,
        DataType::I32 => 2,
        DataType::U32 => 3,
        DataType::I64 => 4,
        DataType::U64 => 5,
        DataType::F16 => 6,
        DataType::F32 => 7,
        DataType::F64 => 8,
        DataType::BF16 => 9,
        DataType::F8E4M3 => 10,
        DataType::F8E5M2 => 11,
    }
}

/// NCCL behind the [`Backend`] trait: the `nccl` backend, and the executor the cuda backend
/// hands what direct access does not carry.
pub struct NcclBackend {
    /// Declared first so that it drops (closes the communicator) while the context below is
    /// still held; the barrier word is freed in `Drop` before.
    nccl: Nccl,
    /// A 4-byte device word for `barrier`.
    barrier_word: u64,
    /// Events of async calls' work objects (the pool holds the context: work objects may
    /// outlive the backend).
    events: Arc<EventPool>,
    ctx: Arc<CudaContext>,
    device: u32,
    rank: usize,
    size: usize,
    config: Arc<Config>,
    lock: Mutex<()>,
}

/// NCCL alone as the backend of `ctx`.
pub fn new_backend(ctx: &CommContext) -> Result<Box<dyn Backend>> {
    let cuda = crate::driver::open_context(ctx.device)?;
    bind(&cuda)?;
    Ok(Box::new(NcclBackend::new(ctx, cuda)?))
}

impl NcclBackend {
    /// Joins the NCCL communicator of `ctx` on the device of `cuda`, whose context must be
    /// current on this thread.
    pub(crate) fn new(ctx: &CommContext, cuda: Arc<CudaContext>) -> Result<NcclBackend> {
        let nccl = Nccl::new(ctx)?;
        // The context is current (the caller's contract).
        let barrier_word = result::mem_alloc(64, "cuMemAlloc (barrier)")?;
        let device = match ctx.device {
            Device::Cuda(d) => d,
            Device::Host => 0,
        };
        Ok(NcclBackend {
            nccl,
            barrier_word,
            events: Arc::new(EventPool::new(cuda.clone())),
            ctx: cuda,
            device,
            rank: ctx.rank,
            size: ctx.size,
            config: ctx.config.clone(),
            lock: Mutex::new(()),
        })
    }

    /// Aborts the NCCL communicator (see `Nccl::abort`): not under the call lock, since a call
    /// may be running on another thread (one waiting for NCCL stops waiting).
    /// `ncclCommAbort` runs on a helper thread that makes the device's context current.
    pub(crate) fn abort_nccl(&self, why: &str) {
        self.nccl.abort(why);
    }

    fn enter(&self) -> Result<std::sync::MutexGuard<'_, ()>> {
        let g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        bind(&self.ctx)?;
        Ok(g)
    }

    /// Runs one checked call on NCCL: its collective on the buffers' device addresses, on
    /// `opts.stream`. The caller holds the context current and has checked the buffers
    /// ([`check_buffers`]): [`Backend::run`] does both, and so does the cuda backend before
    /// it hands a call over.
    pub(crate) fn execute(&self, kind: CallKind<'_>, opts: &CallOpts) -> Result<()> {
        let stream = opts.stream;
        match kind {
            CallKind::AllReduce { input, output, op } => self.nccl.reduction(
                Reduction::All,
                input.address(&output),
                output.ptr() as u64,
                output.count(),
                output.dtype(),
                op,
                stream,
            ),
            CallKind::Reduce {
                input,
                output,
                op,
                root,
            } => self.nccl.reduction(
                Reduction::To(root),
                input.address(&output),
                output.ptr() as u64,
                output.count(),
                output.dtype(),
                op,
                stream,
            ),
            CallKind::Broadcast {
                input,
                output,
                root,
            } => {
                // Only the root's input is read: elsewhere NCCL gets the output twice.
                let send = if self.rank == root {
                    input.address(&output)
                } else {
                    output.ptr() as u64
                };
                let (recv, n, dt) = (output.ptr() as u64, output.count(), output.dtype());
                self.nccl.data_move(Some(root), send, recv, n, dt, stream)
            }
            CallKind::AllGather { input, output } => {
                let n = output.count() / self.size;
                let send = input.part_address(&output, n, self.rank);
                let (recv, dt) = (output.ptr() as u64, output.dtype());
                self.nccl.data_move(None, send, recv, n, dt, stream)
            }
            CallKind::ReduceScatter { input, output, op } => {
                let (send, recv, n) = input.scatter_addresses(&output, self.size, self.rank);
                self.nccl.reduction(
                    Reduction::Scatter,
                    send,
                    recv,
                    n,
                    output.dtype(),
                    op,
                    stream,
                )
            }
            CallKind::AllToAll { input, output } => {
                let n = output.count() / self.size;
                let splits = Splits::packed(vec![n; self.size], vec![n; self.size]);
                self.all_to_all_v(input, output, &splits, stream)
            }
            CallKind::AllToAllV {
                input,
                output,
                splits,
            } => self.all_to_all_v(input, output, splits, stream),
            CallKind::Barrier => self.barrier(stream),
            CallKind::Send { data, peer } => self.nccl.exchange(
                &[(peer, data.ptr() as u64, data.count())],
                &[],
                data.dtype(),
                stream,
                "send",
            ),
            CallKind::Recv { out, peer } => self.nccl.exchange(
                &[],
                &[(peer, out.ptr() as u64, out.count())],
                out.dtype(),
                stream,
                "recv",
            ),
            CallKind::BatchSendRecv { ops } => {
                // One NCCL group of the batch's sends and receives, in its order.
                let ops: Vec<_> = ops
                    .iter()
                    .map(|op| match op {
                        P2pOp::Send { data, peer } => {
                            (true, *peer, data.ptr() as u64, data.count(), data.dtype())
                        }
                        P2pOp::Recv { out, peer } => {
                            (false, *peer, out.ptr() as u64, out.count(), out.dtype())
                        }
                    })
                    .collect();
                self.nccl.exchange_ops(&ops, stream, "batch_send_recv")
            }
            kind @ (CallKind::AllToAllVDynamic { .. }
            | CallKind::AllToAllVDynamicPacked { .. }
            | CallKind::AllReduceRmsNorm(_)) => Err(unsupported(kind.name(), "nccl")),
        }
    }

    /// The all-to-all-v as one NCCL group of sends and receives; in place, the sends read a
    /// stream-ordered copy of the buffer, so that they read the original data.
    fn all_to_all_v(
        &self,
        input: Input<'_>,
        output: ViewMut<'_>,
        splits: &Splits,
        stream: u64,
    ) -> Result<()> {
        let es = output.dtype().size();
        let (src, scratch) = match input {
            Input::InPlace => {
                let p = scratch_copy(output.ptr() as u64, output.bytes_len(), stream)?;
                (p, Some(p))
            }
            Input::Buf(v) => (v.ptr() as u64, None),
        };
        let dst = output.ptr() as u64;
        let part = |base: u64, displ: usize| base + (displ * es) as u64;
        let sends: Vec<_> = (0..self.size)
            .map(|p| (p, part(src, splits.send_displs[p]), splits.send_counts[p]))
            .collect();
        let recvs: Vec<_> = (0..self.size)
            .map(|p| (p, part(dst, splits.recv_displs[p]), splits.recv_counts[p]))
            .collect();
        let r = self
            .nccl
            .exchange(&sends, &recvs, output.dtype(), stream, "all_to_all");
        if let Some(p) = scratch {
            free_scratch(p, stream)?;
        }
        r
    }

    /// Returns once every rank has called it: an NCCL all-reduce of one word, then a wait for
    /// the caller's stream.
    fn barrier(&self, stream: u64) -> Result<()> {
        let w = self.barrier_word;
        self.nccl.reduction(
            Reduction::All,
            w,
            w,
            1,
            DataType::I32,
            ReduceOp::Sum,
            stream,
        )?;
        // SAFETY: waits for the caller's stream, a live stream of this context (the watchdog
        // aborts the communicator if the all-reduce hangs, so this returns).
        unsafe { result::stream_synchronize(stream, "barrier: cuStreamSynchronize") }?;
        match self.nccl.failure() {
            Some(why) => Err(Error::Nccl(format!("barrier: {why}"))),
            None => Ok(()),
        }
    }
}

impl Drop for NcclBackend {
    fn drop(&mut self) {
        let _ = bind(&self.ctx);
        // SAFETY: allocated once in `new`, freed once here; nothing uses it after the backend.
        // An error at teardown is ignored: nothing can act on it.
        let _ = unsafe { result::mem_free(self.barrier_word) };
    }
}

/// A stream-ordered copy of an in-place buffer, so sends read the original data.
fn scratch_copy(src: u64, bytes: usize, stream: u64) -> Result<u64> {
    // SAFETY: stream-ordered allocation and copy on the caller's stream (a live stream of this
    // context; capturable): `src` holds `bytes` (the call's checked output).
    unsafe {
        let p = result::mem_alloc_async(bytes, stream, "cuMemAllocAsync (all_to_all scratch)")?;
        result::memcpy_dtod_async(
            p,
            src,
            bytes,
            stream,
            "cuMemcpyDtoDAsync (all_to_all scratch)",
        )?;
        Ok(p)
    }
}

/// Frees the allocation made by [`scratch_copy`] after the sends on `stream`.
fn free_scratch(p: u64, stream: u64) -> Result<()> {
    // SAFETY: the allocation of scratch_copy, freed once, stream-ordered after its users.
    unsafe { result::mem_free_async(p, stream) }
}

impl Backend for NcclBackend {
    fn name(&self) -> &'static str {
        "nccl"
    }

    fn abort(&self, why: &str) {
        self.abort_nccl(why);
    }

    fn peer_failed(&self, peer: usize) {
        self.abort_nccl(&format!("rank {peer} died or gave up on the communicator"));
    }

    fn capturing(&self, stream: u64) -> bool {
        crate::driver::capturing_or_unknown(stream)
    }

    fn mark(&self, stream: u64) -> Result<Option<Completion>> {
        let _g = self.enter()?;
        self.events.record(stream).map(Some)
    }

    fn passed(&self, point: &Completion) -> Option<bool> {
        // Not under the call lock: a dump may run while a call waits.
        self.ctx.bind_to_thread().ok()?;
        point.is_done().ok()
    }
    fn run(&self, call: Call<'_>) -> Result<()> {
        let _g = self.enter()?;
        check_buffers(&call.kind, Device::Cuda(self.device))?;
        self.execute(call.kind, call.opts)
    }

    fn plan(&self, shape: &CallShape, opts: &CallOpts) -> Result<Plan> {
        plan::nccl_plan(
            shape.coll,
            shape.bytes_per_rank,
            self.size,
            shape.dtype,
            opts.algo.0,
            &self.config,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::one_rank_pieces;

    /// Elements NCCL's one-rank reduction kernel (before 2.29.7) writes for a call of `count`
    /// elements of `elem` bytes: its grid and its per-block range, as in its source.
    fn nccl_covers(count: usize, elem: usize) -> usize {
        let blocks = 32.min((count * elem).div_ceil(16 << 10));
        let per_pack = 16 / elem;
        (blocks * (count / blocks).next_multiple_of(per_pack)).min(count)
    }

    #[test]
    fn pieces_are_written_whole_where_one_call_is_not() {
        let mut short = 0;
        for elem in [1usize, 2, 4, 8] {
            let mut counts: Vec<usize> = (1..5000).collect();
            counts.extend((0..2000).map(|i| 1 + i * 7919 % (3 << 20)));
            counts.extend([
                (16 << 10) + 1,
                (512 << 10) / elem + 1,
                (64 << 20) / elem + 3,
            ]);
            for count in counts {
                short += usize::from(nccl_covers(count, elem) < count);
                let pieces = one_rank_pieces(count, elem);
                assert!(
                    !pieces.is_empty() && pieces.len() <= 2,
                    "{count}x{elem}: {pieces:?}"
                );
                let mut next = 0;
                for &(first, n) in &pieces {
                    assert_eq!(first, next, "{count}x{elem}: pieces {pieces:?} leave a gap");
                    assert_eq!(
                        nccl_covers(n, elem),
                        n,
                        "{count}x{elem}: piece {n} not whole"
                    );
                    // Each piece starts at a multiple of 512 bytes: the buffer's alignment kept.
                    assert_eq!(first * elem % 512, 0);
                    next = first + n;
                }
                assert_eq!(next, count, "{count}x{elem}: {pieces:?}");
            }
        }
        // The model does see the fault the pieces avoid (4097 floats: 2 blocks of 2048).
        assert_eq!(nccl_covers(4097, 4), 4096);
        assert!(short > 100, "{short}");
    }
}
