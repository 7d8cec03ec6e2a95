//! What every executor serves: one call's description ([`Call`]: a [`CallKind`] with its
//! operands, and the [`CallOpts`]), its checks, and the [`Backend`] trait.
//!
//! A call is described once: [`crate::comm::Communicator`]'s methods build its [`CallKind`]
//! (a binding's plain-value [`CallDesc`] becomes one in [`CallDesc::kind`], the one place that
//! turns names and addresses into a call), [`CallKind::check`] checks its arguments for every
//! backend, and the backend's one entry, [`Backend::run`], dispatches it once to its executor,
//! which checks the buffers against its device with [`check_buffers`]. This module sits below
//! the communicator, so that backends never import the communicator that builds them.

mod desc;

pub use desc::{CallDesc, CallName, CountsDesc, Fp8Desc, NormDesc, RawBuf};

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::bootstrap::Store;
use crate::config::Config;
use crate::driver::Completion;
use crate::error::{Error, Result};
use crate::plan::{Algo, CallShape, Collective, Engine, LowPrecisionChoice, Operands, Plan};
use crate::types::{DataType, Device, ReduceOp};
use crate::view::{Input, View, ViewMut};

/// Per-call options.
#[derive(Debug, Clone, Default)]
pub struct CallOpts {
    /// CUDA stream (a `CUstream` as an integer; 0 is the legacy default stream). Ignored by the
    /// host backend.
    pub stream: u64,
    /// Algorithm for this call; `Auto` lets selection decide.
    pub algo: AlgoChoice,
    /// Low precision for this call, overriding the environment.
    pub low_precision: LowPrecisionChoice,
    /// How long this call waits for a peer at each of its waits (`None`: the communicator's
    /// timeout, [`crate::Communicator::set_timeout`]). A call that waits longer fails with
    /// [`Error::Timeout`] naming the peer, as with the communicator's own timeout.
    pub timeout: Option<Duration>,
}

/// Per-call algorithm request (a newtype so that `CallOpts::default()` means automatic).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AlgoChoice(pub Algo);

impl Default for AlgoChoice {
    fn default() -> Self {
        AlgoChoice(Algo::Auto)
    }
}

impl CallOpts {
    /// Options for work enqueued on `stream`, everything else automatic.
    pub fn on_stream(stream: u64) -> Self {
        CallOpts {
            stream,
            ..Default::default()
        }
    }
    /// Forces `algo` for this call.
    pub fn with_algo(mut self, algo: Algo) -> Self {
        self.algo = AlgoChoice(algo);
        self
    }
    /// Sets this call's low precision, overriding the environment.
    pub fn with_low_precision(mut self, lp: LowPrecisionChoice) -> Self {
        self.low_precision = lp;
        self
    }
    /// Bounds each of this call's waits for a peer by `timeout` instead of the communicator's.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Options from plain values, as a binding receives a call's hints: the stream, an
    /// algorithm name ([`Algo`]'s), a low-precision hint ([`LowPrecisionChoice::from_hint`],
    /// `on` meaning `cfg`'s format) and a timeout in seconds (positive, at most
    /// [`crate::config::MAX_TIMEOUT`]); `None` leaves each as the default.
    pub fn from_hints(
        stream: u64,
        algo: Option<&str>,
        low_precision: Option<&str>,
        timeout_s: Option<f64>,
        cfg: &Config,
    ) -> Result<CallOpts> {
        let mut o = CallOpts::on_stream(stream);
        if let Some(a) = algo {
            o = o.with_algo(a.parse::<Algo>()?);
        }
        if let Some(lp) = low_precision {
            o = o.with_low_precision(LowPrecisionChoice::from_hint(lp, cfg.low_precision.format)?);
        }
        if let Some(t) = timeout_s {
            let t = crate::config::timeout_from_secs(t)
                .map_err(|why| Error::InvalidArgument(format!("timeout {why}")))?;
            o = o.with_timeout(t);
        }
        Ok(o)
    }
}

thread_local! {
    /// The timeout of the call this thread is running, while it runs ([`CallTimeout`]).
    static CALL_TIMEOUT: Cell<Option<Duration>> = const { Cell::new(None) };
}

/// How long the call this thread is running waits for a peer at each wait: the call's
/// [`CallOpts::timeout`], else the communicator's timeout when the call started, as the
/// communicator put in force for the call; `outside` when no call runs on this thread
/// (creation, split, helper threads). The executors read it at every wait and put it in the
/// arguments of every kernel that waits for peers, so the timeout needs no plumbing through
/// each collective.
pub(crate) fn call_timeout(outside: Duration) -> Duration {
    CALL_TIMEOUT.get().unwrap_or(outside)
}

thread_local! {
    /// The number of the collective call this thread is running on its communicator (0: none).
    static CALL_NO: Cell<u64> = const { Cell::new(0) };
}

/// The number of the collective call this thread is running (0 outside one): a wait for a
/// peer that refused this very call ends ([`PeerState::refused`]).
pub(crate) fn call_no() -> u64 {
    CALL_NO.get()
}

thread_local! {
    /// Whether the backend has begun to exchange data for the call this thread is running
    /// ([`began_exchange`]).
    static EXCHANGING: Cell<bool> = const { Cell::new(false) };
}

/// Called by a backend once the call this thread runs has begun to exchange data with the
/// peers: an error it returns after that (a fault it found while the call ran, as the
/// device-count all-to-all-v's counts past the input) is no refusal, since the peers took part.
pub(crate) fn began_exchange() {
    EXCHANGING.set(true);
}

/// Whether [`began_exchange`] was called since [`CallNo::enter`] on this thread.
pub(crate) fn exchanging() -> bool {
    EXCHANGING.get()
}

thread_local! {
    /// The flight recorder's record id of the eager CUDA call this thread is running, for the
    /// call's kernels to write once they run ([`CallMark`]); and whether a kernel took it.
    static CALL_MARK: Cell<Option<u64>> = const { Cell::new(None) };
    static MARKED: Cell<bool> = const { Cell::new(false) };
}

/// The record id of the call this thread runs, where its kernels are to mark their start
/// (docs/reliability.md, "CUDA calls"); a backend that puts it in a kernel's arguments calls
/// [`note_marked`].
pub(crate) fn call_mark() -> Option<u64> {
    CALL_MARK.get()
}

/// Called by a backend that launched a kernel carrying [`call_mark`]: the recorder then needs
/// no completion point for the call.
pub(crate) fn note_marked() {
    MARKED.set(true);
}

/// A call's mark in force on this thread until the guard drops (then the one before it, and
/// whether that call's kernels took it, are back: a call made from inside another).
pub(crate) struct CallMark(Option<u64>, bool);

impl CallMark {
    pub(crate) fn enter(record: Option<u64>) -> CallMark {
        CallMark(CALL_MARK.replace(record), MARKED.replace(false))
    }

    /// Whether a kernel of the call took the mark ([`note_marked`]).
    pub(crate) fn taken(&self) -> bool {
        MARKED.get()
    }
}

impl Drop for CallMark {
    fn drop(&mut self) {
        CALL_MARK.set(self.0);
        MARKED.set(self.1);
    }
}

/// A collective call's number in force on this thread until the guard drops.
pub(crate) struct CallNo(u64);

impl CallNo {
    pub(crate) fn enter(n: u64) -> CallNo {
        EXCHANGING.set(false);
        CallNo(CALL_NO.replace(n))
    }
}

impl Drop for CallNo {
    fn drop(&mut self) {
        CALL_NO.set(self.0);
    }
}

/// A call's timeout in force on this thread until the guard drops (then the one before it,
/// for a call made from inside another, is back).
pub(crate) struct CallTimeout(Option<Duration>);

impl CallTimeout {
    pub(crate) fn enter(timeout: Duration) -> CallTimeout {
        CallTimeout(CALL_TIMEOUT.replace(Some(timeout)))
    }
}

impl Drop for CallTimeout {
    fn drop(&mut self) {
        CALL_TIMEOUT.set(self.0);
    }
}

/// `t` when it is a timeout we take: positive and at most [`crate::config::MAX_TIMEOUT`].
pub(crate) fn check_timeout(t: Duration) -> Result<Duration> {
    if t.is_zero() || t > crate::config::MAX_TIMEOUT {
        return Err(Error::InvalidArgument(format!(
            "timeout {t:?} must be positive and at most {:?}",
            crate::config::MAX_TIMEOUT
        )));
    }
    Ok(t)
}

/// The reason [`crate::Communicator::abort`] gives.
pub(crate) const ABORT_CALLED: &str = "abort() was called";

/// What a communicator shares with the windows made from it: whether it may still be used
/// (finalize, abort, and why it was aborted) and the timeout of later calls
/// ([`crate::Communicator::set_timeout`]).
pub(crate) struct CommLive {
    name: String,
    finalized: AtomicBool,
    aborted: AtomicBool,
    /// Why it was aborted ([`CommLive::abort`]); the first reason stays.
    abort_why: OnceLock<String>,
    /// In nanoseconds (at most [`crate::config::MAX_TIMEOUT`], which fits).
    timeout_ns: AtomicU64,
    /// Windows made so far: each one's store keys are its own.
    windows: AtomicU64,
}

impl CommLive {
    pub(crate) fn new(name: &str, timeout: Duration) -> CommLive {
        CommLive {
            name: name.to_string(),
            finalized: false.into(),
            aborted: false.into(),
            abort_why: OnceLock::new(),
            timeout_ns: AtomicU64::new(timeout.as_nanos() as u64),
            windows: AtomicU64::new(0),
        }
    }

    /// Refuses a call on a finalized or aborted communicator.
    pub(crate) fn check(&self) -> Result<()> {
        if self.finalized.load(Ordering::Acquire) {
            return Err(Error::Finalized(self.name.clone()));
        }
        if self.aborted.load(Ordering::Acquire) {
            return Err(Error::Aborted {
                communicator: self.name.clone(),
                why: self.abort_why().to_string(),
            });
        }
        Ok(())
    }

    pub(crate) fn finalize(&self) {
        self.finalized.store(true, Ordering::Release);
    }

    /// Marks the communicator aborted because of `why`; whether this call did (the first one).
    pub(crate) fn abort(&self, why: &str) -> bool {
        // The reason first, then the flag that makes calls read it.
        let _ = self.abort_why.set(why.to_string());
        !self.aborted.swap(true, Ordering::AcqRel)
    }

    pub(crate) fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }

    /// Why it was aborted (the first reason given; set before the flag).
    pub(crate) fn abort_why(&self) -> &str {
        self.abort_why.get().map_or(ABORT_CALLED, |s| s.as_str())
    }

    pub(crate) fn timeout(&self) -> Duration {
        Duration::from_nanos(self.timeout_ns.load(Ordering::Relaxed))
    }

    pub(crate) fn set_timeout(&self, t: Duration) -> Result<()> {
        let t = check_timeout(t)?;
        self.timeout_ns
            .store(t.as_nanos() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// The timeout in force for a call with `opts`, checked.
    pub(crate) fn timeout_for(&self, opts: &CallOpts) -> Result<Duration> {
        match opts.timeout {
            Some(t) => check_timeout(t),
            None => Ok(self.timeout()),
        }
    }

    pub(crate) fn next_window(&self) -> u64 {
        self.windows.fetch_add(1, Ordering::Relaxed)
    }
}

/// Per-peer element counts and offsets of an all-to-all-v.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Splits {
    /// Elements this rank sends to each rank.
    pub send_counts: Vec<usize>,
    /// Where each rank's part starts in the input, in elements.
    pub send_displs: Vec<usize>,
    /// Elements this rank receives from each rank.
    pub recv_counts: Vec<usize>,
    /// Where each rank's part lands in the output, in elements.
    pub recv_displs: Vec<usize>,
}

impl Splits {
    /// Splits packed back to back in rank order. A displacement past `usize::MAX` stays at
    /// `usize::MAX` (never wraps), so [`crate::comm::Communicator::all_to_all_v`] refuses it as
    /// past the buffer.
    pub fn packed(send_counts: Vec<usize>, recv_counts: Vec<usize>) -> Self {
        let prefix = |c: &[usize]| {
            c.iter()
                .scan(0usize, |acc, &n| {
                    let d = *acc;
                    *acc = acc.saturating_add(n);
                    Some(d)
                })
                .collect()
        };
        Splits {
            send_displs: prefix(&send_counts),
            recv_displs: prefix(&recv_counts),
            send_counts,
            recv_counts,
        }
    }
}

/// The device-side counts of [`crate::comm::Communicator::all_to_all_v_dynamic`].
#[derive(Debug)]
pub struct DeviceCounts<'a> {
    /// `size` integers (i32, u32, i64 or u64): units this rank sends to each rank, its input
    /// packed in rank order. On the cuda backend written by earlier work on the stream, never
    /// read by the host; on the host backend, host memory like the data.
    pub send: View<'a>,
    /// `size` integers of the same type: units received from each rank, written by the call.
    pub recv: ViewMut<'a>,
    /// Output units reserved per sender: the part from rank `s` lands at unit `s * capacity`.
    pub capacity: usize,
    /// Elements per unit, at least 1: 1 counts elements; a row's length counts rows (tokens of
    /// `hidden` elements, as torch's split sizes count the first dimension).
    pub unit: usize,
}

impl<'a> DeviceCounts<'a> {
    /// Counts of single elements (`unit` 1).
    pub fn elements(send: View<'a>, recv: ViewMut<'a>, capacity: usize) -> Self {
        DeviceCounts {
            send,
            recv,
            capacity,
            unit: 1,
        }
    }
}

/// One operation of [`crate::comm::Communicator::batch_send_recv`].
#[derive(Debug)]
pub enum P2pOp<'a> {
    /// `data` to rank `peer`, which receives it with a receive of the same size and dtype.
    Send {
        /// The data sent.
        data: View<'a>,
        /// The receiving rank.
        peer: usize,
    },
    /// From rank `peer` into `out`.
    Recv {
        /// Where the message lands.
        out: ViewMut<'a>,
        /// The sending rank.
        peer: usize,
    },
}

impl P2pOp<'_> {
    /// The rank at the other end.
    pub fn peer(&self) -> usize {
        match self {
            P2pOp::Send { peer, .. } | P2pOp::Recv { peer, .. } => *peer,
        }
    }

    /// The message as the planner weighs it on `rank` (a send or receive of its bytes; a
    /// message to `rank` itself is [`Operands::ToSelf`]).
    pub fn plan_shape(&self, rank: usize) -> CallShape {
        let (coll, bytes, dtype) = match self {
            P2pOp::Send { data, .. } => (Collective::Send, data.bytes_len(), data.dtype()),
            P2pOp::Recv { out, .. } => (Collective::Recv, out.bytes_len(), out.dtype()),
        };
        CallShape {
            operands: if self.peer() == rank {
                Operands::ToSelf
            } else {
                Operands::Plain
            },
            ..CallShape::of(coll, bytes, dtype)
        }
    }
}

/// The counts of [`crate::comm::Communicator::all_to_all_v_dynamic_packed`], in units of `unit` elements.
#[derive(Debug)]
pub struct PackedCounts<'a> {
    /// `size` integers (i32, u32, i64 or u64): units this rank sends to each rank, its input
    /// packed in rank order.
    pub send: View<'a>,
    /// `size` integers of the same type: units this rank receives from each rank, packed in
    /// rank order into the output (read, not written).
    pub recv: View<'a>,
    /// Elements per unit, at least 1 (see [`DeviceCounts::unit`]).
    pub unit: usize,
}

/// Why a peer failed, as the communicator's watcher saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Its process ended without closing the communicator.
    Died,
    /// It called `abort()` (or gave up after a timeout or a failure of its own).
    Aborted,
}

/// What a communicator's watcher ([`crate::watch`]) knows of its peers, read by the backends'
/// waits: the first peer that failed (died without closing the communicator, or aborted it),
/// and every peer that is gone (failed, or left after closing it).
#[derive(Debug)]
pub struct PeerState {
    /// 0: none; else (peer + 1) | why << 32 (1: died, 2: aborted).
    failed: std::sync::atomic::AtomicU64,
    gone: Vec<std::sync::atomic::AtomicBool>,
    /// Per peer: the number of the latest collective call it refused (0: none), and why.
    refused: Vec<std::sync::atomic::AtomicU64>,
    refused_why: std::sync::Mutex<Vec<String>>,
}

impl PeerState {
    /// No peer failed or gone, for `world` ranks.
    pub fn new(world: usize) -> PeerState {
        PeerState {
            failed: 0.into(),
            gone: (0..world).map(|_| false.into()).collect(),
            refused: (0..world).map(|_| 0.into()).collect(),
            refused_why: std::sync::Mutex::new(vec![String::new(); world]),
        }
    }

    /// The number of the latest collective call peer `p` refused (0: none).
    pub fn refused(&self, p: usize) -> u64 {
        self.refused
            .get(p)
            .map_or(0, |r| r.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// A peer that refused call `n`, and why.
    pub fn refusal_of(&self, n: u64) -> Option<(usize, String)> {
        if n == 0 {
            return None;
        }
        let p = (0..self.refused.len()).find(|&p| self.refused(p) == n)?;
        let why = self
            .refused_why
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(p)
            .cloned()
            .unwrap_or_default();
        Some((p, why))
    }

    /// Records that `p` refused call `n` because `why`.
    pub(crate) fn set_refused(&self, p: usize, n: u64, why: String) {
        if let Some(w) = self
            .refused_why
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(p)
        {
            *w = why;
        }
        if let Some(r) = self.refused.get(p) {
            r.store(n, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// The first peer that failed, and how.
    pub fn failure(&self) -> Option<(usize, Failure)> {
        let w = self.failed.load(std::sync::atomic::Ordering::Acquire);
        if w == 0 {
            return None;
        }
        let why = if w >> 32 == 2 {
            Failure::Aborted
        } else {
            Failure::Died
        };
        Some(((w & 0xffff_ffff) as usize - 1, why))
    }

    /// Whether peer `p` has failed or left.
    pub fn gone(&self, p: usize) -> bool {
        self.gone
            .get(p)
            .is_some_and(|g| g.load(std::sync::atomic::Ordering::Acquire))
    }

    /// Records that `p` failed; true when it is the communicator's first failure.
    pub(crate) fn set_failed(&self, p: usize, why: Failure) -> bool {
        let code = match why {
            Failure::Died => 1u64,
            Failure::Aborted => 2,
        };
        self.failed
            .compare_exchange(
                0,
                (p as u64 + 1) | code << 32,
                std::sync::atomic::Ordering::AcqRel,
                std::sync::atomic::Ordering::Acquire,
            )
            .is_ok()
    }

    /// Records that `p` is gone.
    pub(crate) fn set_gone(&self, p: usize) {
        if let Some(g) = self.gone.get(p) {
            g.store(true, std::sync::atomic::Ordering::Release);
        }
    }
}

/// What a backend is told when it is created.
#[derive(Clone)]
pub struct CommContext {
    /// The communicator's name as the user gave it.
    pub name: String,
    /// Unique key prefix of this communicator instance in the store.
    pub prefix: String,
    /// This rank, in `0..size`.
    pub rank: usize,
    /// The number of ranks.
    pub size: usize,
    /// Ranks of this communicator on this host, and this rank's index among them, as the
    /// launcher said; backends that care verify it through the store (hostnames).
    pub local_rank: usize,
    /// The number of this communicator's ranks on this host.
    pub local_size: usize,
    /// The device the communicator's buffers live on.
    pub device: Device,
    /// The communicator's own store (keys already prefixed).
    pub store: Arc<dyn Store>,
    /// The configuration in effect.
    pub config: Arc<Config>,
    /// What the communicator's watcher knows of the peers (never updated when it has none).
    pub peers: Arc<PeerState>,
}

impl CommContext {
    /// How long a backend waits for a peer before failing ([`Config::timeout`]).
    pub fn timeout(&self) -> Duration {
        self.config.timeout
    }
}

/// One call as the communicator hands it to a backend, its arguments checked
/// ([`crate::comm::Communicator`] builds it once per call): the collective with its buffers,
/// operator, root or peer, splits or counts, and the call's options.
#[derive(Debug)]
pub struct Call<'a> {
    /// The collective and its operands.
    pub kind: CallKind<'a>,
    /// The call's options.
    pub opts: &'a CallOpts,
    /// How it runs: the planner's answer for this call ([`plan_call`]), asked once; the
    /// backend's executors run it as it says.
    pub plan: Plan,
}

/// The collective of a [`Call`] and its operands.
#[derive(Debug)]
pub enum CallKind<'a> {
    /// Sum (or another reduction) of every rank's input, in every rank's output.
    AllReduce {
        /// Every rank's contribution, or the output itself.
        input: Input<'a>,
        /// Where the reduction lands.
        output: ViewMut<'a>,
        /// The reduction.
        op: ReduceOp,
    },
    /// Reduction of every rank's input into the root's output.
    Reduce {
        /// Every rank's contribution, or the output itself.
        input: Input<'a>,
        /// Where the reduction lands (written on the root only).
        output: ViewMut<'a>,
        /// The reduction.
        op: ReduceOp,
        /// The rank that receives the result.
        root: usize,
    },
    /// The root's input copied to every rank's output.
    Broadcast {
        /// The root's data (read on the root only), or the output itself.
        input: Input<'a>,
        /// Where the data lands.
        output: ViewMut<'a>,
        /// The rank whose data is sent.
        root: usize,
    },
    /// Every rank's input concatenated in rank order.
    AllGather {
        /// This rank's part, or the output itself (its part already at its offset).
        input: Input<'a>,
        /// `size` times the input, in rank order.
        output: ViewMut<'a>,
    },
    /// Reduction of every rank's input, part `rank` left on rank `rank`.
    ReduceScatter {
        /// `size` parts, or the output itself (then the whole `size`-part buffer).
        input: Input<'a>,
        /// This rank's reduced part.
        output: ViewMut<'a>,
        /// The reduction.
        op: ReduceOp,
    },
    /// Part `j` of every rank's input sent to rank `j`.
    AllToAll {
        /// `size` equal parts, or the output itself.
        input: Input<'a>,
        /// `size` equal parts, part `i` from rank `i`.
        output: ViewMut<'a>,
    },
    /// All-to-all with per-rank counts and displacements.
    AllToAllV {
        /// The parts, or the output itself.
        input: Input<'a>,
        /// The received parts, where the splits say.
        output: ViewMut<'a>,
        /// The counts and displacements.
        splits: &'a Splits,
    },
    /// All-to-all-v whose counts live in device memory.
    AllToAllVDynamic {
        /// The parts, packed in rank order.
        input: View<'a>,
        /// `size * capacity` units, part `s` at unit `s * capacity`.
        output: ViewMut<'a>,
        /// The counts and the output's layout.
        counts: DeviceCounts<'a>,
    },
    /// All-to-all-v with both sides' counts in device memory, the output packed.
    AllToAllVDynamicPacked {
        /// The parts, packed in rank order.
        input: View<'a>,
        /// The received parts, packed in rank order.
        output: ViewMut<'a>,
        /// The counts of both sides.
        counts: PackedCounts<'a>,
    },
    /// Returns once every rank has entered it.
    Barrier,
    /// A message to one rank.
    Send {
        /// The data sent.
        data: View<'a>,
        /// The receiving rank.
        peer: usize,
    },
    /// A message from one rank.
    Recv {
        /// Where the message lands.
        out: ViewMut<'a>,
        /// The sending rank.
        peer: usize,
    },
    /// Sends and receives issued together.
    BatchSendRecv {
        /// The operations; between two ranks they match in the order issued.
        ops: Vec<P2pOp<'a>>,
    },
    /// The fused all-reduce + residual add + RMSNorm ([`crate::rmsnorm`]); backends without
    /// it refuse.
    AllReduceRmsNorm(crate::rmsnorm::AllReduceRmsNorm<'a>),
}

impl CallKind<'_> {
    /// The call's name, as bindings and error messages spell it.
    pub fn name(&self) -> CallName {
        match self {
            CallKind::AllReduce { .. } => CallName::AllReduce,
            CallKind::Reduce { .. } => CallName::Reduce,
            CallKind::Broadcast { .. } => CallName::Broadcast,
            CallKind::AllGather { .. } => CallName::AllGather,
            CallKind::ReduceScatter { .. } => CallName::ReduceScatter,
            CallKind::AllToAll { .. } => CallName::AllToAll,
            CallKind::AllToAllV { .. } => CallName::AllToAllV,
            CallKind::AllToAllVDynamic { .. } => CallName::AllToAllVDynamic,
            CallKind::AllToAllVDynamicPacked { .. } => CallName::AllToAllVDynamicPacked,
            CallKind::Barrier => CallName::Barrier,
            CallKind::Send { .. } => CallName::Send,
            CallKind::Recv { .. } => CallName::Recv,
            CallKind::BatchSendRecv { .. } => CallName::BatchSendRecv,
            CallKind::AllReduceRmsNorm(_) => CallName::AllReduceRmsNorm,
        }
    }

    /// The collective, as the planner names it (the batch as its sends and receives: `Send`;
    /// the fused call as the all-reduce it starts with).
    pub fn collective(&self) -> Collective {
        self.name().collective()
    }

    /// The size and element type the planner weighs for this call on `rank` of `world`, as
    /// [`Backend::plan_for`]'s callers count it (the bench's bytes per rank): the output of an
    /// all-reduce, reduce or broadcast, one rank's part of an all-gather or reduce-scatter, the
    /// whole output of an all-to-all, `world` × the largest crossing part of an all-to-all-v
    /// (the input of one with device counts), the largest message of a batch, the fused call's
    /// rows.
    pub fn shape(&self, rank: usize, world: usize) -> (usize, DataType) {
        let part = |out: &ViewMut<'_>| out.bytes_len() / world.max(1);
        match self {
            CallKind::AllReduce { output, .. }
            | CallKind::Reduce { output, .. }
            | CallKind::Broadcast { output, .. }
            | CallKind::AllToAll { output, .. } => (output.bytes_len(), output.dtype()),
            CallKind::AllGather { output, .. } => (part(output), output.dtype()),
            CallKind::ReduceScatter { input, output, .. } => match input {
                Input::InPlace => (part(output), output.dtype()),
                Input::Buf(_) => (output.bytes_len(), output.dtype()),
            },
            CallKind::AllToAllV { output, splits, .. } => {
                let crossing = (0..world)
                    .filter(|&p| p != rank)
                    .flat_map(|p| [splits.send_counts.get(p), splits.recv_counts.get(p)])
                    .flatten()
                    .max()
                    .copied()
                    .unwrap_or(0);
                let es = output.dtype().size();
                (
                    crossing.saturating_mul(es).saturating_mul(world),
                    output.dtype(),
                )
            }
            CallKind::AllToAllVDynamic { input, output, .. }
            | CallKind::AllToAllVDynamicPacked { input, output, .. } => {
                (input.bytes_len(), output.dtype())
            }
            CallKind::Barrier => (0, DataType::U8),
            CallKind::Send { data, .. } => (data.bytes_len(), data.dtype()),
            CallKind::Recv { out, .. } => (out.bytes_len(), out.dtype()),
            CallKind::BatchSendRecv { ops } => ops
                .iter()
                .map(|op| match op {
                    P2pOp::Send { data, .. } => (data.bytes_len(), data.dtype()),
                    P2pOp::Recv { out, .. } => (out.bytes_len(), out.dtype()),
                })
                .max_by_key(|&(bytes, _)| bytes)
                .unwrap_or((0, DataType::U8)),
            CallKind::AllReduceRmsNorm(call) => {
                let s = call.shape();
                (s.x_bytes(), s.dtype)
            }
        }
    }

    /// The call as the planner weighs it on `rank` of `world` ([`CallShape`]): its
    /// [`CallKind::shape`], the reduction, whether its pointers are aligned, and what its
    /// operands rule out (an all-to-all-v in place with uneven counts, a message to the rank
    /// itself, counts in device memory). The batch is planned message by message
    /// ([`plan_call`]); this is its largest message.
    pub fn plan_shape(&self, rank: usize, world: usize) -> CallShape {
        let (bytes, dtype) = self.shape(rank, world);
        let op = match self {
            CallKind::AllReduce { op, .. }
            | CallKind::Reduce { op, .. }
            | CallKind::ReduceScatter { op, .. } => *op,
            _ => ReduceOp::Sum,
        };
        let operands = match self {
            CallKind::AllToAllV {
                input: Input::InPlace,
                splits,
                ..
            } if splits.send_counts != splits.recv_counts => Operands::UnevenInPlace,
            CallKind::AllToAllVDynamic { .. } | CallKind::AllToAllVDynamicPacked { .. } => {
                Operands::DeviceCounts
            }
            CallKind::Send { peer, .. } | CallKind::Recv { peer, .. } if *peer == rank => {
                Operands::ToSelf
            }
            _ => Operands::Plain,
        };
        CallShape {
            coll: self.collective(),
            bytes_per_rank: bytes,
            dtype,
            op,
            aligned: self.aligned(),
            operands,
        }
    }

    /// Checks the call's arguments on `rank` of `size` ranks, for every backend (sizes,
    /// dtypes, ops, roots and peers, splits and counts): a backend receives only calls that make
    /// sense locally. Checks that need the other ranks (different collectives or counts at the
    /// same step) are the backend's, because only it sees the peers. Nothing is read or
    /// written.
    pub fn check(&self, rank: usize, size: usize) -> Result<()> {
        let c = self.name().name();
        match self {
            CallKind::AllReduce { input, output, op } => {
                op.check(output.dtype(), c)?;
                check_input(c, input, output, output.count())
            }
            CallKind::Reduce {
                input,
                output,
                op,
                root,
            } => {
                op.check(output.dtype(), c)?;
                check_rank(c, "root", *root, size)?;
                check_input(c, input, output, output.count())
            }
            CallKind::Broadcast {
                input,
                output,
                root,
            } => {
                check_rank(c, "root", *root, size)?;
                if rank == *root {
                    check_input(c, input, output, output.count())?;
                }
                Ok(())
            }
            CallKind::AllGather { input, output } => {
                let n = part_count(c, output.count(), size)?;
                check_input(c, input, output, n)
            }
            CallKind::ReduceScatter { input, output, op } => {
                op.check(output.dtype(), c)?;
                if let Input::InPlace = input {
                    part_count(c, output.count(), size)?;
                }
                check_input(c, input, output, output.count().saturating_mul(size))
            }
            CallKind::AllToAll { input, output } => {
                part_count(c, output.count(), size)?;
                check_input(c, input, output, output.count())
            }
            CallKind::AllToAllV {
                input,
                output,
                splits,
            } => check_splits(c, rank, size, input, output, splits),
            CallKind::AllToAllVDynamic {
                input,
                output,
                counts,
            } => {
                check_same(c, input, output)?;
                let unit = counts.unit;
                check_units(c, unit, &[("input", input.count())])?;
                let want = counts
                    .capacity
                    .checked_mul(unit)
                    .and_then(|x| x.checked_mul(size))
                    .ok_or_else(|| {
                        Error::InvalidArgument(format!(
                            "{c}: a capacity of {} units of {unit} elements overflows",
                            counts.capacity
                        ))
                    })?;
                if output.count() != want {
                    return Err(Error::SizeMismatch {
                        collective: c,
                        what: "output",
                        got: output.count(),
                        expected: want,
                    });
                }
                check_counts(
                    c,
                    size,
                    (counts.send.dtype(), counts.send.count()),
                    (counts.recv.dtype(), counts.recv.count()),
                )
            }
            CallKind::AllToAllVDynamicPacked {
                input,
                output,
                counts,
            } => {
                check_same(c, input, output)?;
                check_units(
                    c,
                    counts.unit,
                    &[("input", input.count()), ("output", output.count())],
                )?;
                check_counts(
                    c,
                    size,
                    (counts.send.dtype(), counts.send.count()),
                    (counts.recv.dtype(), counts.recv.count()),
                )
            }
            CallKind::Barrier => Ok(()),
            CallKind::Send { peer, .. } | CallKind::Recv { peer, .. } => {
                check_peer(c, *peer, rank, size)
            }
            CallKind::BatchSendRecv { ops } => ops
                .iter()
                .try_for_each(|op| check_peer(c, op.peer(), rank, size)),
            CallKind::AllReduceRmsNorm(call) => call.check().map(|_| ()),
        }
    }

    /// Every buffer of the call, for [`check_buffers`] and [`CallKind::aligned`].
    fn buffers(&self) -> Vec<BufferRef> {
        let v = |what, b: &View<'_>| {
            BufferRef::new(what, b.ptr() as u64, b.device(), b.dtype(), b.count())
        };
        let m = |what, b: &ViewMut<'_>| {
            BufferRef::new(what, b.ptr() as u64, b.device(), b.dtype(), b.count())
        };
        let io = |input: &Input<'_>, output: &ViewMut<'_>| {
            let mut out = vec![m("output", output)];
            if let Input::Buf(i) = input {
                out.push(v("input", i));
            }
            out
        };
        match self {
            CallKind::AllReduce { input, output, .. }
            | CallKind::Reduce { input, output, .. }
            | CallKind::Broadcast { input, output, .. }
            | CallKind::AllGather { input, output }
            | CallKind::ReduceScatter { input, output, .. }
            | CallKind::AllToAll { input, output }
            | CallKind::AllToAllV { input, output, .. } => io(input, output),
            CallKind::AllToAllVDynamic {
                input,
                output,
                counts,
            } => vec![
                m("output", output),
                v("input", input),
                v("send_counts", &counts.send),
                m("recv_counts", &counts.recv),
            ],
            CallKind::AllToAllVDynamicPacked {
                input,
                output,
                counts,
            } => vec![
                m("output", output),
                v("input", input),
                v("send_counts", &counts.send),
                v("recv_counts", &counts.recv),
            ],
            CallKind::Barrier => Vec::new(),
            CallKind::Send { data, .. } => vec![v("data", data)],
            CallKind::Recv { out, .. } => vec![m("out", out)],
            CallKind::BatchSendRecv { ops } => ops
                .iter()
                .map(|op| match op {
                    P2pOp::Send { data, .. } => v("send data", data),
                    P2pOp::Recv { out, .. } => m("recv out", out),
                })
                .collect(),
            CallKind::AllReduceRmsNorm(call) => {
                let mut out = vec![m("out", &call.out)];
                if let Input::Buf(x) = &call.x {
                    out.push(v("x", x));
                }
                out.push(m("residual_out", &call.residual_out));
                if let Input::Buf(r) = &call.residual {
                    out.push(v("residual", r));
                }
                out.push(v("weight", &call.weight));
                if let Some(q) = &call.fp8 {
                    out.push(m("fp8 codes", &q.codes));
                    out.push(match &q.scale {
                        crate::rmsnorm::Fp8Scale::PerRow(s) => m("fp8 scales", s),
                        crate::rmsnorm::Fp8Scale::Given(s) => v("fp8 scale", s),
                    });
                }
                out
            }
        }
    }

    /// Whether every buffer of the call starts at a multiple of its element size, the one
    /// look at alignment a call gets (the low-precision kernels and the cuda backend's
    /// all-reduce and fused call need it; an empty buffer counts as aligned).
    pub fn aligned(&self) -> bool {
        self.buffers()
            .iter()
            .all(|b| b.bytes == 0 || b.ptr % b.elem as u64 == 0)
    }
}

/// One buffer of a call as [`check_buffers`] looks at it.
struct BufferRef {
    /// Its name in the call (`output`, `send_counts`, ...).
    what: &'static str,
    ptr: u64,
    device: Device,
    bytes: usize,
    /// Bytes of one element.
    elem: usize,
}

impl BufferRef {
    fn new(what: &'static str, ptr: u64, device: Device, dtype: DataType, count: usize) -> Self {
        BufferRef {
            what,
            ptr,
            device,
            bytes: count.saturating_mul(dtype.size()),
            elem: dtype.size(),
        }
    }
}

/// Checks that every buffer of `kind` is memory of `device`, the device a backend serves: host
/// memory for the host backend; for a CUDA device also the address itself, which the driver
/// must know as memory of that GPU (a buffer named cuda:1 that is really cuda:0's, or host
/// memory, is refused before a kernel touches it). Every backend calls it once per call, with
/// its context current.
pub fn check_buffers(kind: &CallKind<'_>, device: Device) -> Result<()> {
    let c = kind.name().name();
    for BufferRef {
        what,
        ptr: p,
        device: dev,
        bytes,
        ..
    } in kind.buffers()
    {
        if dev != device {
            return Err(Error::InvalidArgument(match device {
                Device::Host => {
                    format!("{c}: the host backend needs host buffers, {what} is on {dev}")
                }
                Device::Cuda(_) => {
                    format!("{c}: {what} is on {dev}, this communicator serves {device}")
                }
            }));
        }
        let Device::Cuda(d) = device else { continue };
        if bytes == 0 {
            continue;
        }
        let on = crate::driver::pointer_device(p, c, what)?;
        if on != d {
            return Err(Error::InvalidArgument(format!(
                "{c}: {what} pointer {p:#x} is memory of cuda:{on}, this communicator serves \
                 cuda:{d}"
            )));
        }
    }
    Ok(())
}

/// `rank` (a root, a peer, ...: `what`) must name a rank of `size`.
fn check_rank(c: &'static str, what: &'static str, rank: usize, size: usize) -> Result<()> {
    if rank >= size {
        return Err(Error::RankOutOfRange {
            collective: c,
            what,
            rank,
            size,
        });
    }
    Ok(())
}

/// A point-to-point peer: a rank of `size`, not this `rank` itself.
fn check_peer(c: &'static str, peer: usize, rank: usize, size: usize) -> Result<()> {
    check_rank(c, "peer", peer, size)?;
    if peer == rank {
        return Err(Error::InvalidArgument(format!(
            "{c}: peer {peer} is this rank itself"
        )));
    }
    Ok(())
}

/// `count / size`, or an error when the output's `count` does not divide by the number of ranks.
fn part_count(c: &'static str, count: usize, size: usize) -> Result<usize> {
    if count % size != 0 {
        return Err(Error::InvalidArgument(format!(
            "{c}: output has {count} elements, which does not divide into {size} equal parts"
        )));
    }
    Ok(count / size)
}

/// An all-to-all-v's splits: one entry per rank each, every part inside its buffer, in place
/// only with the same offsets on both sides, and this rank's part to itself of one count.
fn check_splits(
    c: &'static str,
    rank: usize,
    n: usize,
    input: &Input<'_>,
    output: &ViewMut<'_>,
    splits: &Splits,
) -> Result<()> {
    for (what, v) in [
        ("send_counts", &splits.send_counts),
        ("send_displs", &splits.send_displs),
        ("recv_counts", &splits.recv_counts),
        ("recv_displs", &splits.recv_displs),
    ] {
        if v.len() != n {
            return Err(Error::InvalidArgument(format!(
                "{c}: {what} has {} entries, expected one per rank ({n})",
                v.len()
            )));
        }
    }
    let in_count = match input {
        Input::InPlace => output.count(),
        Input::Buf(v) => {
            check_same(c, v, output)?;
            v.count()
        }
    };
    for p in 0..n {
        check_part(
            c,
            ("input", "for", in_count),
            p,
            splits.send_displs[p],
            splits.send_counts[p],
        )?;
        check_part(
            c,
            ("output", "from", output.count()),
            p,
            splits.recv_displs[p],
            splits.recv_counts[p],
        )?;
    }
    if matches!(input, Input::InPlace) && splits.send_displs != splits.recv_displs {
        return Err(Error::InvalidArgument(format!(
            "{c}: in place needs the same offsets for sending and receiving"
        )));
    }
    // The own part is copied locally, never exchanged: a difference is this rank's mistake,
    // refused here rather than by each backend's copy.
    if splits.send_counts[rank] != splits.recv_counts[rank] {
        return Err(Error::InvalidArgument(format!(
            "{c}: rank {rank} sends {} elements to itself but expects {}",
            splits.send_counts[rank], splits.recv_counts[rank]
        )));
    }
    Ok(())
}

/// A part of an all-to-all-v buffer (`buf`: its name, "for"/"from", its element count) for or
/// from rank `p`, `count` elements at `displ`: it must end inside the buffer, the end computed
/// without overflow.
fn check_part(
    c: &'static str,
    (buf, dir, len): (&str, &str, usize),
    p: usize,
    displ: usize,
    count: usize,
) -> Result<()> {
    match displ.checked_add(count) {
        Some(end) if end <= len => Ok(()),
        Some(end) => Err(Error::InvalidArgument(format!(
            "{c}: part {dir} rank {p} ends at element {end}, past the {buf}'s {len}"
        ))),
        None => Err(Error::InvalidArgument(format!(
            "{c}: part {dir} rank {p} (displacement {displ} + count {count}) overflows; the \
             {buf} has {len} elements"
        ))),
    }
}

/// The unit of the device-count all-to-all-v calls: at least one element, and each of `bufs`
/// (name, element count) a whole number of units.
fn check_units(c: &'static str, unit: usize, bufs: &[(&str, usize)]) -> Result<()> {
    if unit == 0 {
        return Err(Error::InvalidArgument(format!(
            "{c}: the unit of the counts must be at least one element"
        )));
    }
    for &(what, n) in bufs {
        if n % unit != 0 {
            return Err(Error::InvalidArgument(format!(
                "{c}: the {what}'s {n} elements are not a whole number of units of {unit} elements"
            )));
        }
    }
    Ok(())
}

/// The counts of the device-count all-to-all-v calls, each given as (dtype, count): `size`
/// integers each, one integer type for both.
fn check_counts(
    c: &'static str,
    size: usize,
    send: (DataType, usize),
    recv: (DataType, usize),
) -> Result<()> {
    for (what, (d, n)) in [("send_counts", send), ("recv_counts", recv)] {
        if !matches!(
            d,
            DataType::I32 | DataType::U32 | DataType::I64 | DataType::U64
        ) {
            return Err(Error::InvalidArgument(format!(
                "{c}: {what} must be i32, u32, i64 or u64, not {d}"
            )));
        }
        if n != size {
            return Err(Error::SizeMismatch {
                collective: c,
                what,
                got: n,
                expected: size,
            });
        }
    }
    if send.0 != recv.0 {
        return Err(Error::DtypeMismatch {
            collective: c,
            what: "recv_counts",
            got: recv.0,
            expected: send.0,
        });
    }
    Ok(())
}

fn check_same(c: &'static str, input: &View<'_>, output: &ViewMut<'_>) -> Result<()> {
    if input.dtype() != output.dtype() {
        return Err(Error::DtypeMismatch {
            collective: c,
            what: "input",
            got: input.dtype(),
            expected: output.dtype(),
        });
    }
    if input.device() != output.device() {
        return Err(Error::InvalidArgument(format!(
            "{c}: input is on {} but output is on {}",
            input.device(),
            output.device()
        )));
    }
    Ok(())
}

/// An out-of-place input must match the output's dtype and device and hold `expected` elements.
fn check_input(
    c: &'static str,
    input: &Input<'_>,
    output: &ViewMut<'_>,
    expected: usize,
) -> Result<()> {
    if let Input::Buf(v) = input {
        check_same(c, v, output)?;
        if v.count() != expected {
            return Err(Error::SizeMismatch {
                collective: c,
                what: "input",
                got: v.count(),
                expected,
            });
        }
    }
    Ok(())
}

/// What every backend implements: one entry that runs a checked call ([`Backend::run`]), and
/// the plans it would run. Arguments have been validated by [`crate::comm::Communicator`]
/// ([`CallKind::check`]); each backend checks the buffers against its device
/// ([`check_buffers`]).
pub trait Backend: Send + Sync {
    /// The backend's name (`host`, `cuda`, `nccl`).
    fn name(&self) -> &'static str;
    /// A [`Completion`] recorded on `stream` after the calls issued on it so far, for the work
    /// object of an async call; `None` where calls have finished when they return (the host
    /// backend).
    fn mark(&self, stream: u64) -> Result<Option<Completion>> {
        let _ = stream;
        Ok(None)
    }
    /// Whether the stream has passed `point` (one [`Backend::mark`] recorded), asked from any
    /// thread (the flight recorder's dumps run on the watcher's too): `None` when it cannot
    /// tell.
    fn passed(&self, point: &Completion) -> Option<bool> {
        let _ = point;
        None
    }
    /// Whether a kernel of the call with flight-recorder record id `record` has begun on the
    /// GPU (it wrote its mark), asked from any thread: `None` when the backend marks no call.
    fn began(&self, record: u64) -> Option<bool> {
        let _ = record;
        None
    }
    /// Gives up on the communicator ([`crate::Communicator::abort`]): peers waiting on this
    /// rank learn it where the backend can tell them (the host backend's failed flag), and an
    /// NCCL communicator is aborted (its kernels exit). Direct-access kernels that wait for this
    /// rank end at their timeout. `why` is the communicator's reason. Default: nothing to
    /// tell.
    fn abort(&self, why: &str) {
        let _ = why;
    }
    /// A peer died or gave up on the communicator (its watcher saw it): whatever waits for
    /// it must end now. Default: nothing (the host backend's waits read [`PeerState`]).
    fn peer_failed(&self, peer: usize) {
        let _ = peer;
    }
    /// An error an earlier call left on this rank for the next call to report (a direct-access
    /// kernel's record: ranks that disagreed on the call, bad device-side counts, a timeout),
    /// taken: a record that is cleared once reported is reported here once. The communicator
    /// asks before each collective call, ahead of the peers' refusals of that call, so that
    /// the call reports this rank's own error rather than a peer's and nothing is left over
    /// for a later call. Default: none (a call reports what it meets itself).
    fn earlier_error(&self, collective: &'static str) -> Result<()> {
        let _ = collective;
        Ok(())
    }
    /// A peer refused a collective call this rank has issued (its arguments were wrong
    /// there): whatever waits for it in that call must end. Default: as a failed peer (the
    /// communicator's kernels and NCCL are ended; it is aborted).
    fn peer_refused(&self, peer: usize) {
        self.peer_failed(peer);
    }
    /// Whether `stream` is being captured into a CUDA graph (the flight recorder records a
    /// captured call as such). Default: never (no streams).
    fn capturing(&self, stream: u64) -> bool {
        let _ = stream;
        false
    }
    /// Runs one checked call: the one entry the communicator uses, which hands the call to the
    /// backend's executor of its kind. A call the backend cannot serve is refused with
    /// [`Error::Unsupported`] ([`unsupported`]).
    fn run(&self, call: Call<'_>) -> Result<()>;
    /// The plan of a call of `shape` on this backend: what the call runs, decided by
    /// [`crate::plan`]. Every plan of a call comes from here ([`plan_call`], [`Backend::plan_for`]).
    fn plan(&self, shape: &CallShape, opts: &CallOpts) -> Result<Plan>;
    /// The plan of a call of `coll` with `bytes_per_rank` (a Sum for the reductions, aligned
    /// pointers, plain operands): [`Backend::plan`]'s. The bench's path column, `algo_for` and
    /// `ferrocomm info` print it.
    fn plan_for(
        &self,
        coll: Collective,
        bytes_per_rank: usize,
        dtype: DataType,
        opts: &CallOpts,
    ) -> Result<Plan> {
        self.plan(&CallShape::of(coll, bytes_per_rank, dtype), opts)
    }
    /// This rank's part of a new window with `slots` signal counters per peer (see
    /// [`crate::window`]). Backends without one-sided communication refuse.
    fn new_window(&self, slots: usize) -> Result<Box<dyn WindowBackend>> {
        let _ = slots;
        Err(Error::Unsupported {
            collective: "new_window",
            backend: self.name(),
            what: "one-sided communication (windows)".into(),
        })
    }
    /// The plan of an all_reduce_rmsnorm of `shape` (pointers aligned), its
    /// [`crate::plan::NormForm`] in `norm`: what the call runs. Backends without the call
    /// refuse, as the call does.
    fn rmsnorm_plan_for(&self, shape: crate::rmsnorm::Shape, opts: &CallOpts) -> Result<Plan> {
        let _ = (shape, opts);
        Err(unsupported(CallName::AllReduceRmsNorm, self.name()))
    }
}

/// The plan of `kind` on `rank` of `world` on `backend`: the one place a call's plan is asked
/// for (the communicator asks once per call, prints it under `FERROCOMM_DEBUG` and hands it to
/// [`Backend::run`]). The fused call: [`Backend::rmsnorm_plan_for`]. A batch of messages: each
/// message's plan; the batch runs on one engine, so where any message's plan is not direct
/// access the batch takes that one (NCCL's group), else its largest message's.
pub fn plan_call(
    backend: &dyn Backend,
    kind: &CallKind<'_>,
    rank: usize,
    world: usize,
    opts: &CallOpts,
) -> Result<Plan> {
    match kind {
        CallKind::AllReduceRmsNorm(call) => backend.rmsnorm_plan_for(call.shape(), opts),
        CallKind::BatchSendRecv { ops } => {
            let mut largest: Option<(usize, Plan)> = None;
            for op in ops {
                let shape = op.plan_shape(rank);
                let p = backend.plan(&shape, opts)?;
                if p.engine == Engine::Nccl {
                    return Ok(p);
                }
                let bytes = shape.bytes_per_rank;
                if largest.as_ref().is_none_or(|(b, _)| bytes > *b) {
                    largest = Some((bytes, p));
                }
            }
            match largest {
                Some((_, p)) => Ok(p),
                None => backend.plan(&CallShape::of(Collective::Send, 0, DataType::U8), opts),
            }
        }
        _ => backend.plan(&kind.plan_shape(rank, world), opts),
    }
}

/// What a backend answers for a call it does not have (`backend`: its name): the device-count
/// all-to-all-v calls without counts in device memory, the fused all-reduce + RMSNorm.
pub fn unsupported(call: CallName, backend: &'static str) -> Error {
    Error::Unsupported {
        collective: call.name(),
        backend,
        what: match call {
            CallName::AllReduceRmsNorm => "the fused all-reduce + RMSNorm".into(),
            CallName::AllToAllVDynamic | CallName::AllToAllVDynamicPacked => {
                "counts in device memory".into()
            }
            other => other.name().into(),
        },
    }
}

// ---------------------------------------------------------------------------------------------
// One-sided communication

/// Most signal counters a window keeps per peer (the persistent all-gather uses two).
pub const MAX_WINDOW_SLOTS: usize = 8;

/// A rank's part of one window ([`crate::window::Window`]): what an executor serves so that
/// peers write into the buffer this rank registered and this rank into theirs, and order those
/// writes with signals. The window checks every argument first (ranks, slots, sizes, dtypes,
/// and the offset and length of every put against the target's buffer, in checked
/// arithmetic); an executor moves bytes and counts signals.
///
/// Signals are counters: `signal(dst, slot)` adds one to `dst`'s counter of this rank's
/// signals in `slot`, and `wait_signal(peer, slot)` waits for the next one of `peer`'s (the
/// count this rank has consumed, plus one). A signal is released after the sender's earlier
/// puts and a wait acquires it, so those puts are visible once the wait returns (on CUDA: to
/// later work on the waiting stream).
pub trait WindowBackend: Send + Sync {
    /// Prepares the `bytes` at `ptr` (on the communicator's device) for peers to map, and this
    /// rank's signal counters: returns the message the peers need (it travels through the
    /// store), or why the memory cannot be shared.
    fn export(&mut self, ptr: u64, bytes: usize) -> Result<Vec<u8>>;
    /// Maps every rank's buffer (`bytes` long) and counters from the messages of
    /// [`WindowBackend::export`], `msgs[r]` from rank `r` (this rank's own included).
    fn import(&mut self, msgs: &[Vec<u8>], bytes: usize) -> Result<()>;
    /// Every rank has mapped every other's: names or handles kept only for that may go.
    fn settled(&mut self) {}
    /// Waits until the window operations this rank issued have finished (before its peers
    /// release their buffers).
    fn quiesce(&self) -> Result<()>;
    /// Unmaps the peers' buffers and counters and releases this rank's (every rank has
    /// quiesced, or set-up failed).
    fn release(&mut self);
    /// Copies `bytes` from `src` (this rank's memory) to byte `offset` of rank `dst`'s buffer.
    fn put(&self, src: u64, bytes: usize, dst: usize, offset: usize, stream: u64) -> Result<()>;
    /// Adds one to rank `dst`'s counter `slot` of this rank's signals, after this rank's
    /// earlier puts (release at system scope).
    fn signal(&self, dst: usize, slot: usize, stream: u64) -> Result<()>;
    /// Waits for the next signal `slot` from `peer` (acquire at system scope), at most
    /// `timeout`; ended by an abort. The host backend waits here; on CUDA the stream waits.
    fn wait_signal(&self, peer: usize, slot: usize, stream: u64, timeout: Duration) -> Result<()>;
    /// Where rank `rank`'s buffer is mapped in this process (this rank's: the buffer itself);
    /// `None` before [`WindowBackend::import`].
    fn remote(&self, rank: usize) -> Option<u64>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_made_inside_another_keeps_the_outer_calls_mark() {
        let outer = CallMark::enter(Some(7));
        assert_eq!(call_mark(), Some(7));
        assert!(!outer.taken());
        note_marked();
        {
            let inner = CallMark::enter(Some(8));
            assert_eq!(call_mark(), Some(8));
            assert!(!inner.taken(), "the inner call's kernels took nothing yet");
            note_marked();
            assert!(inner.taken());
        }
        assert_eq!(call_mark(), Some(7));
        assert!(outer.taken(), "the outer call's own kernel took its mark");
        drop(outer);
        assert_eq!(call_mark(), None);
        let unmarked = CallMark::enter(None);
        assert!(!unmarked.taken());
    }
}
