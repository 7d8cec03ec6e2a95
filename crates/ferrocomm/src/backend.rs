//! What every executor serves: the [`Backend`] trait and the types of a call's arguments
//! (options, splits, device counts, point-to-point operations) and of a backend's creation.
//!
//! [`crate::comm::Communicator`] checks every call's arguments once and hands a backend only
//! calls that make sense locally; this module sits below it, so that backends never import the
//! communicator that builds them.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::bootstrap::Store;
use crate::config::Config;
use crate::driver::Completion;
use crate::error::{Error, Result};
use crate::plan::{Algo, Collective, LowPrecisionChoice, Plan};
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

/// A collective call's number in force on this thread until the guard drops.
pub(crate) struct CallNo(u64);

impl CallNo {
    pub(crate) fn enter(n: u64) -> CallNo {
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

/// What a communicator shares with the windows made from it: whether it may still be used
/// (finalize, abort) and the timeout of later calls ([`crate::Communicator::set_timeout`]).
pub(crate) struct CommLive {
    name: String,
    finalized: AtomicBool,
    aborted: AtomicBool,
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
            return Err(Error::Aborted(self.name.clone()));
        }
        Ok(())
    }

    pub(crate) fn finalize(&self) {
        self.finalized.store(true, Ordering::Release);
    }

    pub(crate) fn is_finalized(&self) -> bool {
        self.finalized.load(Ordering::Acquire)
    }

    /// Marks the communicator aborted; whether this call did (the first one).
    pub(crate) fn abort(&self) -> bool {
        !self.aborted.swap(true, Ordering::AcqRel)
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
}

/// The collective of a [`Call`] and its operands. (A fused collective, such as an all-reduce
/// followed by an RMSNorm, is one more variant, which backends without it refuse.)
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
}

impl CallKind<'_> {
    /// The collective, as the planner names it (the batch as its sends and receives: `Send`).
    pub fn collective(&self) -> Collective {
        match self {
            CallKind::AllReduce { .. } => Collective::AllReduce,
            CallKind::Reduce { .. } => Collective::Reduce,
            CallKind::Broadcast { .. } => Collective::Broadcast,
            CallKind::AllGather { .. } => Collective::AllGather,
            CallKind::ReduceScatter { .. } => Collective::ReduceScatter,
            CallKind::AllToAll { .. } => Collective::AllToAll,
            CallKind::AllToAllV { .. }
            | CallKind::AllToAllVDynamic { .. }
            | CallKind::AllToAllVDynamicPacked { .. } => Collective::AllToAllV,
            CallKind::Barrier => Collective::Barrier,
            CallKind::Send { .. } | CallKind::BatchSendRecv { .. } => Collective::Send,
            CallKind::Recv { .. } => Collective::Recv,
        }
    }
}

impl CallKind<'_> {
    /// The size and element type the planner weighs for this call on `rank` of `world`, as
    /// [`Backend::plan_for`]'s callers count it (the bench's bytes per rank): the output of an
    /// all-reduce, reduce or broadcast, one rank's part of an all-gather or reduce-scatter, the
    /// whole output of an all-to-all, `world` × the largest crossing part of an all-to-all-v
    /// (the input of one with device counts), the largest message of a batch.
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
        }
    }
}

/// What every backend implements. Arguments have been validated by [`crate::comm::Communicator`].
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
    /// Gives up on the communicator ([`crate::Communicator::abort`]): peers waiting on this
    /// rank learn it where the backend can tell them (the host backend's failed flag), and an
    /// NCCL communicator is aborted (its kernels exit). Direct-access kernels that wait for this
    /// rank end at their timeout. Default: nothing to tell.
    fn abort(&self) {}
    /// A peer died or gave up on the communicator (its watcher saw it): whatever waits for
    /// it must end now. Default: nothing (the host backend's waits read [`PeerState`]).
    fn peer_failed(&self, peer: usize) {
        let _ = peer;
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
    /// Runs one checked call: the one entry the communicator uses, which hands each
    /// collective to its method below.
    fn run(&self, call: Call<'_>) -> Result<()> {
        let opts = call.opts;
        match call.kind {
            CallKind::AllReduce { input, output, op } => self.all_reduce(input, output, op, opts),
            CallKind::Reduce {
                input,
                output,
                op,
                root,
            } => self.reduce(input, output, op, root, opts),
            CallKind::Broadcast {
                input,
                output,
                root,
            } => self.broadcast(input, output, root, opts),
            CallKind::AllGather { input, output } => self.all_gather(input, output, opts),
            CallKind::ReduceScatter { input, output, op } => {
                self.reduce_scatter(input, output, op, opts)
            }
            CallKind::AllToAll { input, output } => self.all_to_all(input, output, opts),
            CallKind::AllToAllV {
                input,
                output,
                splits,
            } => self.all_to_all_v(input, output, splits, opts),
            CallKind::AllToAllVDynamic {
                input,
                output,
                counts,
            } => self.all_to_all_v_dynamic(input, output, counts, opts),
            CallKind::AllToAllVDynamicPacked {
                input,
                output,
                counts,
            } => self.all_to_all_v_dynamic_packed(input, output, counts, opts),
            CallKind::Barrier => self.barrier(opts),
            CallKind::Send { data, peer } => self.send(data, peer, opts),
            CallKind::Recv { out, peer } => self.recv(out, peer, opts),
            CallKind::BatchSendRecv { ops } => self.batch_send_recv(ops, opts),
        }
    }
    /// All-reduce; see [`crate::comm::Communicator::all_reduce`].
    fn all_reduce(
        &self,
        input: Input<'_>,
        output: ViewMut<'_>,
        op: ReduceOp,
        opts: &CallOpts,
    ) -> Result<()>;
    /// Reduce to `root`; see [`crate::comm::Communicator::reduce`].
    fn reduce(
        &self,
        input: Input<'_>,
        output: ViewMut<'_>,
        op: ReduceOp,
        root: usize,
        opts: &CallOpts,
    ) -> Result<()>;
    /// Broadcast from `root`; see [`crate::comm::Communicator::broadcast`].
    fn broadcast(
        &self,
        input: Input<'_>,
        output: ViewMut<'_>,
        root: usize,
        opts: &CallOpts,
    ) -> Result<()>;
    /// All-gather; see [`crate::comm::Communicator::all_gather`].
    fn all_gather(&self, input: Input<'_>, output: ViewMut<'_>, opts: &CallOpts) -> Result<()>;
    /// Reduce-scatter; see [`crate::comm::Communicator::reduce_scatter`].
    fn reduce_scatter(
        &self,
        input: Input<'_>,
        output: ViewMut<'_>,
        op: ReduceOp,
        opts: &CallOpts,
    ) -> Result<()>;
    /// All-to-all; see [`crate::comm::Communicator::all_to_all`].
    fn all_to_all(&self, input: Input<'_>, output: ViewMut<'_>, opts: &CallOpts) -> Result<()>;
    /// All-to-all-v; see [`crate::comm::Communicator::all_to_all_v`].
    fn all_to_all_v(
        &self,
        input: Input<'_>,
        output: ViewMut<'_>,
        splits: &Splits,
        opts: &CallOpts,
    ) -> Result<()>;
    /// All-to-all-v whose counts live in device memory (see
    /// [`crate::comm::Communicator::all_to_all_v_dynamic`]). Backends without it refuse.
    fn all_to_all_v_dynamic(
        &self,
        input: View<'_>,
        output: ViewMut<'_>,
        counts: DeviceCounts<'_>,
        opts: &CallOpts,
    ) -> Result<()> {
        let _ = (input, output, counts, opts);
        Err(no_device_counts("all_to_all_v_dynamic", self.name()))
    }
    /// All-to-all-v with both sides' counts in device memory, the output packed (see
    /// [`crate::comm::Communicator::all_to_all_v_dynamic_packed`]; counts in host memory never reach the
    /// backend). Backends without it refuse.
    fn all_to_all_v_dynamic_packed(
        &self,
        input: View<'_>,
        output: ViewMut<'_>,
        counts: PackedCounts<'_>,
        opts: &CallOpts,
    ) -> Result<()> {
        let _ = (input, output, counts, opts);
        Err(no_device_counts("all_to_all_v_dynamic_packed", self.name()))
    }
    /// Barrier; see [`crate::comm::Communicator::barrier`].
    fn barrier(&self, opts: &CallOpts) -> Result<()>;
    /// The fused all-reduce + residual add + RMSNorm (see [`crate::rmsnorm`]), its arguments
    /// checked ([`crate::rmsnorm::AllReduceRmsNorm::check`] gave `shape`). Backends without it
    /// refuse.
    fn all_reduce_rmsnorm(
        &self,
        call: crate::rmsnorm::AllReduceRmsNorm<'_>,
        shape: crate::rmsnorm::Shape,
        opts: &CallOpts,
    ) -> Result<()> {
        let _ = (call, shape, opts);
        Err(Error::Unsupported {
            collective: crate::rmsnorm::NAME,
            backend: self.name(),
            what: "the fused all-reduce + RMSNorm".into(),
        })
    }
    /// Sends and receives issued together (see [`crate::comm::Communicator::batch_send_recv`]).
    fn batch_send_recv(&self, ops: Vec<P2pOp<'_>>, opts: &CallOpts) -> Result<()>;
    /// Send to `peer`; see [`crate::comm::Communicator::send`].
    fn send(&self, data: View<'_>, peer: usize, opts: &CallOpts) -> Result<()>;
    /// Receive from `peer`; see [`crate::comm::Communicator::recv`].
    fn recv(&self, out: ViewMut<'_>, peer: usize, opts: &CallOpts) -> Result<()>;
    /// The plan of a call of `coll` with `bytes_per_rank` (a Sum for the reductions, aligned
    /// pointers) on this backend: what the call runs, decided by [`crate::plan`]. The bench's
    /// path column, `algo_for`, `ferrocomm info` and `FERROCOMM_DEBUG` print it.
    fn plan_for(
        &self,
        coll: Collective,
        bytes_per_rank: usize,
        dtype: DataType,
        opts: &CallOpts,
    ) -> Result<Plan>;
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
    /// [`crate::plan::NormForm`] in `norm`: what [`Backend::all_reduce_rmsnorm`] runs. Backends
    /// without the call refuse, as the call does.
    fn rmsnorm_plan_for(&self, shape: crate::rmsnorm::Shape, opts: &CallOpts) -> Result<Plan> {
        let _ = (shape, opts);
        Err(Error::Unsupported {
            collective: crate::rmsnorm::NAME,
            backend: self.name(),
            what: "the fused all-reduce + RMSNorm".into(),
        })
    }
}

/// What a backend without the device-count all-to-all-v calls answers.
fn no_device_counts(collective: &'static str, backend: &'static str) -> Error {
    Error::Unsupported {
        collective,
        backend,
        what: "counts in device memory".into(),
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
