//! The flight recorder: per communicator, a ring of the latest calls (what, how big, on which
//! stream, when, and how it ended), dumped in the format of torch's flight recorder so that
//! `python -m torch.distributed.flight_recorder.fr_trace DIR` and `ferrocomm trace DIR`
//! analyze the dumps of every rank.
//!
//! The call path pays a few plain stores into a slot allocated at creation (no allocation,
//! no lock: a slot is a seqlock, written by the calling thread and read by a dump on any
//! thread). What costs more is resolved when a dump is made: the plan a call ran (the planner
//! is a pure function of what the slot holds), names and sizes as torch spells them.
//!
//! A dump describes the process: every live communicator's calls, one file per rank
//! (`ferrocomm_trace_rank_<global rank>`) in `FERROCOMM_TRACE_DIR` (default: a per-job
//! directory under the temporary directory, mode 700).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::backend::{Backend, CallKind, CallName, CallOpts, P2pOp};
use crate::driver::Completion;
use crate::error::{Error, Result};
use crate::plan::{Algo, LowPrecisionChoice};
use crate::quant::Format;
use crate::types::{DataType, ReduceOp};
use crate::view::Input;

/// One line on stderr, written whole (ranks and threads sharing a terminal or a pipe do not
/// interleave their lines).
macro_rules! say {
    ($($t:tt)*) => {{
        let line = format!("{}\n", format_args!($($t)*));
        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    }};
}
pub(crate) use say;

/// The version of torch's dump format these dumps follow (its analyzer checks it).
pub const FORMAT_VERSION: &str = "2.10";
/// The file name of rank `r`'s dump is this prefix and `r`.
pub const FILE_PREFIX: &str = "ferrocomm_trace_rank_";

/// How a recorded call stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallState {
    /// Issued: enqueued on a CUDA stream (not known to have started).
    Scheduled,
    /// Running on the host.
    Started,
    /// Returned successfully (host), or known finished.
    Completed,
    /// Returned an error other than a timeout.
    Failed,
    /// Waited past its timeout for a peer.
    TimedOut,
    /// Captured into a CUDA graph: recorded once, at capture; its replays are not calls.
    Captured,
    /// Enqueued on a CUDA stream, and its kernel began on the GPU (every call before it on
    /// the stream completed); nothing shows its end, since no later call of that stream
    /// began: it may be running still, or done.
    Began,
}

impl CallState {
    const ALL: [CallState; 7] = [
        CallState::Scheduled,
        CallState::Started,
        CallState::Completed,
        CallState::Failed,
        CallState::TimedOut,
        CallState::Captured,
        CallState::Began,
    ];

    /// The name in a dump (torch's `scheduled`, `started`, `completed`, and ours).
    pub const fn name(self) -> &'static str {
        match self {
            CallState::Scheduled => "scheduled",
            CallState::Started => "started",
            CallState::Completed => "completed",
            CallState::Failed => "failed",
            CallState::TimedOut => "timed out",
            CallState::Captured => "captured",
            CallState::Began => "began",
        }
    }
}

/// The operation as torch's analyzer knows it (its COLLECTIVES, P2P and `coalesced`).
fn torch_name(call: CallName) -> &'static str {
    match call {
        CallName::AllReduce | CallName::AllReduceRmsNorm => "all_reduce",
        CallName::Reduce => "reduce",
        CallName::Broadcast => "broadcast",
        CallName::AllGather => "all_gather",
        CallName::ReduceScatter => "reduce_scatter",
        CallName::AllToAll
        | CallName::AllToAllV
        | CallName::AllToAllVDynamic
        | CallName::AllToAllVDynamicPacked => "all_to_all",
        CallName::Barrier => "all_reduce_barrier",
        CallName::Send => "send",
        CallName::Recv => "recv",
        CallName::BatchSendRecv => "coalesced",
    }
}

/// torch's name of a dtype (`c10::toString` of its ScalarType).
fn torch_dtype(d: DataType) -> &'static str {
    match d {
        DataType::F32 => "Float",
        DataType::F64 => "Double",
        DataType::F16 => "Half",
        DataType::BF16 => "BFloat16",
        DataType::F8E4M3 => "Float8_e4m3fn",
        DataType::F8E5M2 => "Float8_e5m2",
        DataType::I8 => "Char",
        DataType::U8 => "Byte",
        DataType::I32 => "Int",
        DataType::U32 => "UInt32",
        DataType::I64 => "Long",
        DataType::U64 => "UInt64",
    }
}

const FORMATS: [Format; 3] = [Format::E4M3, Format::E5M2, Format::Int8];
const NO_PEER: u64 = u64::MAX;

/// Words of a row (a slot's record as read). A slot stores the first [`STORED`] of them; the
/// state is kept in the top byte of the code word, so that a slot fills two cache lines.
const W_RECORD: usize = 0;
const W_OP_ID: usize = 1;
const W_SEQ: usize = 2;
const W_P2P_SEQ: usize = 3;
/// kind | dtype << 8 | op << 16 | algo << 24 | low precision << 32 (0 default, 1 off, 2 + format)
const W_CODE: usize = 4;
const W_IN: usize = 5;
const W_OUT: usize = 6;
const W_PEER: usize = 7;
const W_STREAM: usize = 8;
const W_CREATED: usize = 9;
const W_STARTED: usize = 10;
const W_ENDED: usize = 11;
const W_THREAD: usize = 12;
const W_TIMEOUT: usize = 13;
const W_BYTES: usize = 14;
const W_STATE: usize = 15;
const WORDS: usize = 16;
/// Words a slot stores: every word of a row but the state.
const STORED: usize = 15;
/// Where the state sits in a slot's code word.
const STATE_SHIFT: u32 = 56;

/// One call's record: a seqlock (`version` odd while written) over plain words, two cache
/// lines. Each call has a slot of its own (the ring's counter `n`), written again only by the
/// call `capacity` calls later, and the slot's versions come from the lap `n / capacity`:
/// `begin` writes it under 4 lap + 1 and closes it at 4 lap + 2, with plain stores (the
/// recorder's cost is paid on every call, and a locked instruction would wait for a slot that
/// is not in the cache); `end`, when it has something to add, takes the slot from 4 lap + 2 to
/// 4 lap + 3 by compare-and-swap, so it never writes over a later lap's call, and closes it at
/// 4 lap + 4. Only more than `capacity` calls in flight at once on one communicator could have
/// two laps' `begin` write one slot together; a dump may then show a row mixed of the two.
#[repr(C, align(64))]
struct Slot {
    version: AtomicU64,
    w: [AtomicU64; STORED],
}

// Two cache lines: what `Slot::prefetch` fetches.
const _: () = assert!(std::mem::size_of::<Slot>() == 128);

impl Slot {
    fn new() -> Slot {
        Slot {
            version: 0.into(),
            w: std::array::from_fn(|_| 0.into()),
        }
    }

    /// Opens the slot for `begin`'s write in lap `lap`; returns the version that closes it.
    fn open(&self, lap: u64) -> u64 {
        self.version.store(4 * lap + 1, Ordering::Relaxed);
        // The odd version is visible before any word changes.
        std::sync::atomic::fence(Ordering::Release);
        4 * lap + 2
    }

    /// Opens the slot for `end`'s write after `begin` closed it at `closed`; `None` when a
    /// later call took the slot meanwhile. Returns the version that closes it.
    fn reopen(&self, closed: u64) -> Option<u64> {
        self.version
            .compare_exchange(closed, closed + 1, Ordering::Acquire, Ordering::Relaxed)
            .ok()?;
        std::sync::atomic::fence(Ordering::Release);
        Some(closed + 2)
    }

    /// Closes the slot (its version even again), publishing the words written.
    fn close(&self, v: u64) {
        self.version.store(v, Ordering::Release);
    }

    /// A consistent copy of the words, or `None` when a writer kept it busy.
    fn read(&self) -> Option<[u64; WORDS]> {
        for _ in 0..100 {
            let v0 = self.version.load(Ordering::Acquire);
            if v0 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let mut words = [0u64; WORDS];
            for (x, w) in words.iter_mut().zip(&self.w) {
                *x = w.load(Ordering::Relaxed);
            }
            std::sync::atomic::fence(Ordering::Acquire);
            if self.version.load(Ordering::Relaxed) == v0 {
                words[W_STATE] = words[W_CODE] >> STATE_SHIFT;
                words[W_CODE] &= (1 << STATE_SHIFT) - 1;
                return Some(words);
            }
        }
        None
    }

    /// Asks the CPU to bring the slot into its cache before it is written (a hint: it cannot
    /// fault and changes nothing; x86-64 only, elsewhere nothing).
    fn prefetch(&self) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let p = (self as *const Slot).cast::<i8>();
            // SAFETY: a prefetch reads nothing the program sees and cannot fault; both
            // addresses lie in this slot (two cache lines, 64-byte aligned).
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(p);
                _mm_prefetch::<_MM_HINT_T0>(p.add(64));
            }
        }
    }
}

/// The ring of one communicator.
/// A slot's point: the record it belongs to and the point itself.
type Point = Mutex<Option<(u64, Completion)>>;

struct Ring {
    slots: Box<[Slot]>,
    /// Per slot, for a CUDA call enqueued eagerly: a point recorded on its stream right after
    /// it, and the record it belongs to. A dump asks whether the stream passed it (then the
    /// call has completed); a call whose point is not passed yet is still scheduled there.
    points: Box<[Point]>,
    next: AtomicU64,
}

/// A scheduled CUDA call whose point (kept by [`FlightRecorder::attach`]) the stream has
/// passed has completed: its row says so, with the time it was found so.
fn resolve(w: &mut [u64; WORDS], point: &Point, backend: Option<&dyn Backend>) {
    let Some(backend) = backend else { return };
    let p = point.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((record, c)) = p.as_ref() {
        if *record == w[W_RECORD] && backend.passed(c) == Some(true) {
            w[W_STATE] = CallState::Completed as u64;
            w[W_ENDED] = now_ns();
        }
    }
}

/// The states of eager CUDA calls from stream order (`rows` sorted by record id): a call
/// whose kernel began ([`Backend::began`]: it ran past its grid dependency) or whose point
/// passed shows that every call before it on the same stream completed; the latest such call
/// of a stream that began but shows no end is [`CallState::Began`].
fn by_stream_order(rows: &mut [[u64; WORDS]], began: impl Fn(u64) -> bool) {
    let scheduled = CallState::Scheduled as u64;
    let began: Vec<bool> = rows
        .iter()
        .map(|w| w[W_STATE] == scheduled && began(w[W_RECORD]))
        .collect();
    // A stream: its handle, and for CUDA's per-thread default stream the thread too (that
    // handle names a different stream on each thread).
    let stream = |w: &[u64; WORDS]| {
        const PER_THREAD: u64 = 2; // CU_STREAM_PER_THREAD
        (
            w[W_STREAM],
            if w[W_STREAM] == PER_THREAD {
                w[W_THREAD]
            } else {
                0
            },
        )
    };
    // The latest record of each stream known to have begun or completed.
    let mut latest: HashMap<(u64, u64), u64> = HashMap::new();
    for (w, &b) in rows.iter().zip(&began) {
        if b || w[W_STATE] == CallState::Completed as u64 {
            latest.insert(stream(w), w[W_RECORD]);
        }
    }
    let now = now_ns();
    for (w, b) in rows.iter_mut().zip(began) {
        if w[W_STATE] != scheduled {
            continue;
        }
        if latest.get(&stream(w)).is_some_and(|&l| l > w[W_RECORD]) {
            w[W_STATE] = CallState::Completed as u64;
            w[W_ENDED] = now;
        } else if b {
            w[W_STATE] = CallState::Began as u64;
            // When the dump found it began (torch's time_discovered_started_ns).
            w[W_STARTED] = now;
        }
    }
}

/// Process-wide numbering: torch's record ids grow across every group of the process, and
/// torchcomms' op ids across every communicator.
static RECORD_ID: AtomicU64 = AtomicU64::new(0);
static OP_ID: AtomicU64 = AtomicU64::new(0);

/// The next op id of the process (the hooks' and the recorder's).
pub fn next_op_id() -> u64 {
    OP_ID.fetch_add(1, Ordering::Relaxed)
}

thread_local! {
    /// A small number for this thread (torch records a thread id).
    static THREAD_NO: u64 = {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        NEXT.fetch_add(1, Ordering::Relaxed)
    };
}

/// Nanoseconds since the Unix epoch at the kernel's last tick (CLOCK_REALTIME_COARSE: one tick
/// is 1/HZ, 1 to 10 ms; never ahead of [`now_ns`], so a call's created time is never after its
/// started or ended time; the calls of one tick share it): the created time of a call enqueued
/// on a CUDA stream, read in a few ns where the precise clock takes 25 to 40 (the recorder's
/// cost is paid on every call; a host call, whose times give its duration, reads the precise
/// clock). The coarse clock is Linux's (as is the rest of the crate: /dev/shm, pidfds).
fn coarse_now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::RealtimeCoarse);
    (t.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(t.tv_nsec as u64)
}

/// Nanoseconds since the Unix epoch (torch's `time_created_ns`).
fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Who a communicator is, for the dump's group table.
#[derive(Debug, Clone)]
pub struct GroupInfo {
    /// The communicator's name (torch's group name).
    pub name: String,
    /// Its store prefix, unique per communicator instance (the group's key).
    pub uid: String,
    /// The backend's name (torch's group description).
    pub desc: String,
    /// This rank in the communicator.
    pub rank: usize,
    /// The global rank (the first communicator's, through splits) of each of its ranks.
    pub ranks: Vec<usize>,
}

impl GroupInfo {
    /// This process's global rank.
    pub fn global_rank(&self) -> usize {
        self.ranks.get(self.rank).copied().unwrap_or(self.rank)
    }
}

/// The recorder of one communicator.
pub struct FlightRecorder {
    ring: OnceLock<Ring>,
    info: GroupInfo,
    /// Collective calls so far (torch's collective_seq_id counts from 1) and p2p calls.
    seq: AtomicU64,
    p2p_seq: AtomicU64,
    /// The backend, for the plans of a dump.
    backend: OnceLock<Weak<dyn Backend>>,
    /// Why the communicator failed, if it did (the first failure), for a dump.
    failure: Mutex<Option<String>>,
    /// Whether a failure already dumped (one dump per failure of the communicator).
    dumped: AtomicBool,
}

/// What `FlightRecorder::begin` hands to `FlightRecorder::end` (both crate-private).
#[derive(Debug, Clone, Copy)]
pub struct Token {
    slot: usize,
    /// The version `begin` closed the slot at.
    closed: u64,
    pub(crate) record: u64,
    /// The op id of the call (the hooks see the same).
    pub op_id: u64,
}

/// Every live recorder of the process, for a dump.
fn registry() -> &'static Mutex<Vec<Weak<FlightRecorder>>> {
    static R: OnceLock<Mutex<Vec<Weak<FlightRecorder>>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

impl FlightRecorder {
    /// A recorder keeping the latest `capacity` calls (0: off until [`FlightRecorder::enable`]).
    pub fn new(info: GroupInfo, capacity: usize) -> Arc<FlightRecorder> {
        let r = Arc::new(FlightRecorder {
            ring: OnceLock::new(),
            info,
            seq: 0.into(),
            p2p_seq: 0.into(),
            backend: OnceLock::new(),
            failure: Mutex::new(None),
            dumped: false.into(),
        });
        if capacity > 0 {
            r.enable(capacity);
        }
        let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
        reg.retain(|w| w.strong_count() > 0);
        reg.push(Arc::downgrade(&r));
        r
    }

    /// Turns the ring on with `capacity` slots when it is off (a ring on stays as it is).
    pub fn enable(&self, capacity: usize) {
        let capacity = capacity.clamp(1, crate::config::MAX_FLIGHT_RECORDER);
        let _ = self.ring.get_or_init(|| Ring {
            slots: (0..capacity).map(|_| Slot::new()).collect(),
            points: (0..capacity).map(|_| Default::default()).collect(),
            next: 0.into(),
        });
    }

    /// Whether calls are recorded.
    pub fn is_on(&self) -> bool {
        self.ring.get().is_some()
    }

    /// The group this recorder describes.
    pub fn info(&self) -> &GroupInfo {
        &self.info
    }

    /// The backend whose planner names the plans in a dump.
    pub(crate) fn set_backend(&self, b: Weak<dyn Backend>) {
        let _ = self.backend.set(b);
    }

    /// Records the start of a call (`None` when the recorder is off). `op_id` is the call's
    /// op id ([`next_op_id`]).
    pub(crate) fn begin(
        &self,
        kind: &CallKind<'_>,
        opts: &CallOpts,
        timeout: Duration,
        host: bool,
        op_id: u64,
    ) -> Option<Token> {
        let ring = self.ring.get()?;
        let k = kind.name();
        let (dtype, op, peer, inc, outc) = describe(kind, self.info.ranks.len());
        let (bytes, _) = kind.shape(self.info.rank, self.info.ranks.len());
        Some(self.write(
            ring,
            k,
            dtype,
            op,
            peer,
            (inc, outc),
            bytes,
            opts,
            timeout,
            host,
            op_id,
        ))
    }

    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        ring: &Ring,
        kind: CallName,
        dtype: Option<DataType>,
        op: Option<ReduceOp>,
        peer: u64,
        (inc, outc): (u64, u64),
        bytes: usize,
        opts: &CallOpts,
        timeout: Duration,
        host: bool,
        op_id: u64,
    ) -> Token {
        let record = RECORD_ID.fetch_add(1, Ordering::Relaxed);
        let (seq, p2p) = if kind.is_p2p() {
            (
                self.seq.load(Ordering::Relaxed),
                self.p2p_seq.fetch_add(1, Ordering::Relaxed) + 1,
            )
        } else {
            (self.seq.fetch_add(1, Ordering::Relaxed) + 1, 0)
        };
        let n = ring.next.fetch_add(1, Ordering::Relaxed);
        let len = ring.slots.len() as u64;
        let slot_no = (n % len) as usize;
        let slot = &ring.slots[slot_no];
        let lp: u64 = match opts.low_precision {
            LowPrecisionChoice::Default => 0,
            LowPrecisionChoice::Off => 1,
            LowPrecisionChoice::On(f) => {
                2 + FORMATS.iter().position(|x| *x == f).unwrap_or(0) as u64
            }
        };
        let algo = Algo::ALL
            .iter()
            .position(|a| *a == opts.algo.0)
            .unwrap_or(0) as u64;
        let code = CallName::ALL.iter().position(|x| *x == kind).unwrap_or(0) as u64
            | (dtype.map_or(0xff, |d| d.code()) as u64) << 8
            | (op.map_or(0xff, |o| o.code()) as u64) << 16
            | algo << 24
            | lp << 32;
        let now = if host { now_ns() } else { coarse_now_ns() };
        let state = if host {
            CallState::Started
        } else {
            CallState::Scheduled
        };
        let v = slot.open(n / len);
        let w = &slot.w;
        w[W_RECORD].store(record, Ordering::Relaxed);
        w[W_OP_ID].store(op_id, Ordering::Relaxed);
        w[W_SEQ].store(seq, Ordering::Relaxed);
        w[W_P2P_SEQ].store(p2p, Ordering::Relaxed);
        w[W_CODE].store(code | (state as u64) << STATE_SHIFT, Ordering::Relaxed);
        w[W_IN].store(inc, Ordering::Relaxed);
        w[W_OUT].store(outc, Ordering::Relaxed);
        w[W_PEER].store(peer, Ordering::Relaxed);
        w[W_STREAM].store(opts.stream, Ordering::Relaxed);
        w[W_CREATED].store(now, Ordering::Relaxed);
        w[W_STARTED].store(if host { now } else { 0 }, Ordering::Relaxed);
        w[W_ENDED].store(0, Ordering::Relaxed);
        w[W_THREAD].store(THREAD_NO.with(|t| *t), Ordering::Relaxed);
        w[W_TIMEOUT].store(
            timeout.as_nanos().min(u64::MAX as u128) as u64,
            Ordering::Relaxed,
        );
        w[W_BYTES].store(bytes as u64, Ordering::Relaxed);
        slot.close(v);
        Token {
            slot: slot_no,
            closed: v,
            record,
            op_id,
        }
    }

    /// Records how the call of `t` returned: on the host it has ended; a CUDA call that was
    /// enqueued stays scheduled (or captured, when its stream was being captured).
    pub(crate) fn end(&self, t: Token, r: &Result<()>, host: bool, captured: bool) {
        let Some(ring) = self.ring.get() else { return };
        let slot = &ring.slots[t.slot];
        let state = match r {
            Err(Error::Timeout { .. }) => CallState::TimedOut,
            Err(_) => CallState::Failed,
            Ok(()) if captured => CallState::Captured,
            Ok(()) if host => CallState::Completed,
            Ok(()) => CallState::Scheduled,
        };
        // An eager CUDA call that was enqueued stays as `begin` wrote it; a slot a later call
        // took meanwhile (a ring far too small for the calls in flight) is left to it.
        if state != CallState::Scheduled {
            if let Some(v) = slot.reopen(t.closed) {
                let code = slot.w[W_CODE].load(Ordering::Relaxed) & ((1 << STATE_SHIFT) - 1);
                slot.w[W_CODE].store(code | (state as u64) << STATE_SHIFT, Ordering::Relaxed);
                if host || r.is_err() {
                    slot.w[W_ENDED].store(now_ns(), Ordering::Relaxed);
                }
                slot.close(v);
            }
        }
        // The next call's slot, fetched while the caller goes on (it was last written
        // `capacity` calls ago, and is long out of the cache).
        let next = ring.next.load(Ordering::Relaxed) % ring.slots.len() as u64;
        ring.slots[next as usize].prefetch();
    }

    /// Keeps `point`, recorded on the stream of the call of `t` right after it was enqueued:
    /// a dump resolves the call's state from it (replacing the point of the slot's earlier
    /// call, which goes back to its pool).
    pub(crate) fn attach(&self, t: &Token, point: Completion) {
        let Some(ring) = self.ring.get() else { return };
        if let Some(m) = ring.points.get(t.slot) {
            let old = m
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .replace((t.record, point));
            drop(old);
        }
    }

    /// Notes why the communicator failed (the first time); true when this is the first
    /// failure noted, which is the one a dump is made for.
    pub(crate) fn note_failure(&self, why: &str) -> bool {
        let mut f = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        if f.is_none() {
            *f = Some(why.to_string());
        }
        !self.dumped.swap(true, Ordering::AcqRel)
    }

    /// The calls in the ring recorded at or after record id `since`, oldest first.
    fn entries(&self, since: u64, only_active: bool) -> Vec<Value> {
        let Some(ring) = self.ring.get() else {
            return Vec::new();
        };
        let backend = self.backend.get().and_then(Weak::upgrade);
        let mut rows: Vec<[u64; WORDS]> = ring
            .slots
            .iter()
            .zip(ring.points.iter())
            .filter_map(|(slot, point)| Some((slot.read()?, point)))
            .filter(|(w, _)| w[W_CREATED] != 0 && w[W_RECORD] >= since)
            .map(|(mut w, point)| {
                if w[W_STATE] == CallState::Scheduled as u64 {
                    resolve(&mut w, point, backend.as_deref());
                }
                w
            })
            .collect();
        rows.sort_by_key(|w| w[W_RECORD]);
        if let Some(b) = backend.as_deref() {
            by_stream_order(&mut rows, |record| b.began(record) == Some(true));
        }
        rows.iter()
            .filter(|w| !only_active || w[W_STATE] != CallState::Completed as u64)
            .map(|w| self.entry(w, backend.as_deref()))
            .collect()
    }

    fn entry(&self, w: &[u64; WORDS], backend: Option<&dyn Backend>) -> Value {
        let code = w[W_CODE];
        let kind = CallName::ALL[(code & 0xff) as usize % CallName::ALL.len()];
        let dtype = DataType::from_code(((code >> 8) & 0xff) as u8);
        let op = (code >> 16) & 0xff;
        let algo = Algo::ALL[((code >> 24) & 0xff) as usize % Algo::ALL.len()];
        let lp = match (code >> 32) & 0xff {
            0 => LowPrecisionChoice::Default,
            1 => LowPrecisionChoice::Off,
            f => LowPrecisionChoice::On(FORMATS[(f as usize - 2) % FORMATS.len()]),
        };
        let state = CallState::ALL[(w[W_STATE] as usize) % CallState::ALL.len()];
        let me = self.info.rank;
        let peer = w[W_PEER];
        let profiling = match kind {
            CallName::Send => format!("nccl:send {me}->{peer}"),
            CallName::Recv => format!("nccl:recv {me}<-{peer}"),
            k => format!("nccl:{}", torch_name(k)),
        };
        let sizes = |n: u64| {
            if kind == CallName::Barrier {
                json!([])
            } else {
                json!([[n]])
            }
        };
        let dt = |present: bool| match dtype {
            Some(d) if present && kind != CallName::Barrier => json!([torch_dtype(d)]),
            _ => json!([]),
        };
        let opts = CallOpts {
            stream: 0,
            algo: crate::backend::AlgoChoice(algo),
            low_precision: lp,
            timeout: None,
        };
        let plan = match (backend, dtype) {
            (Some(b), Some(d)) => b
                .plan_for(kind.collective(), w[W_BYTES] as usize, d, &opts)
                .map(|p| p.to_string())
                .unwrap_or_else(|e| format!("(no plan: {e})")),
            _ => String::new(),
        };
        let mut call = format!("{}(", kind.name());
        if kind != CallName::Barrier {
            call += &format!("count={}", w[W_OUT].max(w[W_IN]));
            if let Some(d) = dtype {
                call += &format!(", dtype={d}");
            }
        }
        if op != 0xff {
            let name = ReduceOp::name_of_code(op).unwrap_or("?");
            call += &format!(", op={name}");
        }
        if peer != NO_PEER {
            let what = if kind.is_p2p() { "peer" } else { "root" };
            call += &format!(", {what}={peer}");
        }
        call += ")";
        let opt_ns = |v: u64| if v == 0 { Value::Null } else { json!(v) };
        let duration = if w[W_ENDED] > w[W_STARTED] && w[W_STARTED] != 0 {
            json!((w[W_ENDED] - w[W_STARTED]) as f64 / 1e6)
        } else {
            Value::Null
        };
        let mut e = Map::new();
        e.insert("record_id".into(), json!(w[W_RECORD]));
        e.insert("pg_id".into(), json!(0));
        e.insert(
            "process_group".into(),
            json!([self.info.uid, self.info.desc]),
        );
        e.insert("collective_seq_id".into(), json!(w[W_SEQ]));
        e.insert("p2p_seq_id".into(), json!(w[W_P2P_SEQ]));
        e.insert("op_id".into(), json!(w[W_OP_ID]));
        e.insert("profiling_name".into(), json!(profiling));
        e.insert("time_created_ns".into(), json!(w[W_CREATED]));
        e.insert("duration_ms".into(), duration);
        let (inputs, outputs) = match kind {
            CallName::Recv => (0, w[W_OUT]),
            CallName::Send => (w[W_IN], 0),
            _ => (w[W_IN], w[W_OUT]),
        };
        e.insert(
            "input_sizes".into(),
            if kind == CallName::Recv {
                json!([])
            } else {
                sizes(inputs)
            },
        );
        e.insert("input_dtypes".into(), dt(kind != CallName::Recv));
        e.insert(
            "output_sizes".into(),
            if kind == CallName::Send {
                json!([])
            } else {
                sizes(outputs)
            },
        );
        e.insert("output_dtypes".into(), dt(kind != CallName::Send));
        // torch's three states: a call that ended (well or not) is completed there; ours
        // says how it ended.
        let torch_state = match state {
            CallState::Scheduled | CallState::Captured => "scheduled",
            CallState::Started | CallState::TimedOut | CallState::Began => "started",
            CallState::Completed | CallState::Failed => "completed",
        };
        e.insert("state".into(), json!(torch_state));
        e.insert("time_discovered_started_ns".into(), opt_ns(w[W_STARTED]));
        e.insert(
            "time_discovered_completed_ns".into(),
            if state == CallState::Completed {
                opt_ns(w[W_ENDED])
            } else {
                Value::Null
            },
        );
        e.insert(
            "retired".into(),
            json!(matches!(
                state,
                CallState::Completed | CallState::Failed | CallState::TimedOut
            )),
        );
        e.insert("timeout_ms".into(), json!(w[W_TIMEOUT] / 1_000_000));
        e.insert("is_p2p".into(), json!(kind.is_p2p()));
        e.insert("thread_id".into(), json!(w[W_THREAD].to_string()));
        e.insert("thread_name".into(), json!(""));
        e.insert("frames".into(), json!([]));
        // ferrocomm's own fields (torch's analyzer ignores keys it does not know).
        e.insert("ferrocomm_call".into(), json!(call));
        e.insert("ferrocomm_state".into(), json!(state.name()));
        e.insert("ferrocomm_plan".into(), json!(plan));
        e.insert("ferrocomm_stream".into(), json!(w[W_STREAM]));
        e.insert("ferrocomm_rank".into(), json!(me));
        e.insert("ferrocomm_ended_ns".into(), opt_ns(w[W_ENDED]));
        Value::Object(e)
    }

    /// Calls recorded so far (the ring keeps the latest of them).
    pub fn len(&self) -> u64 {
        self.ring
            .get()
            .map_or(0, |r| r.next.load(Ordering::Relaxed))
    }

    /// Whether no call was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The record id the next call will get (a watermark for [`dump_value`]'s `since`).
    pub fn watermark() -> u64 {
        RECORD_ID.load(Ordering::Relaxed)
    }
}

/// A call's dtype, op, root or peer, and element counts of input and output, as recorded.
fn describe(
    kind: &CallKind<'_>,
    world: usize,
) -> (Option<DataType>, Option<ReduceOp>, u64, u64, u64) {
    let inout = |input: &Input<'_>, out: usize, dflt: usize| match input {
        Input::Buf(v) => (v.count() as u64, out as u64),
        Input::InPlace => (dflt as u64, out as u64),
    };
    match kind {
        CallKind::AllReduce { input, output, op } => {
            let (i, o) = inout(input, output.count(), output.count());
            (Some(output.dtype()), Some(*op), NO_PEER, i, o)
        }
        CallKind::Reduce {
            input,
            output,
            op,
            root,
        } => {
            let (i, o) = inout(input, output.count(), output.count());
            (Some(output.dtype()), Some(*op), *root as u64, i, o)
        }
        CallKind::Broadcast {
            input,
            output,
            root,
        } => {
            let (i, o) = inout(input, output.count(), output.count());
            (Some(output.dtype()), None, *root as u64, i, o)
        }
        CallKind::AllGather { input, output } => {
            let (i, o) = inout(input, output.count(), output.count() / world.max(1));
            (Some(output.dtype()), None, NO_PEER, i, o)
        }
        CallKind::ReduceScatter { input, output, op } => match input {
            Input::Buf(v) => (
                Some(output.dtype()),
                Some(*op),
                NO_PEER,
                v.count() as u64,
                output.count() as u64,
            ),
            Input::InPlace => (
                Some(output.dtype()),
                Some(*op),
                NO_PEER,
                output.count() as u64,
                (output.count() / world.max(1)) as u64,
            ),
        },
        CallKind::AllToAll { input, output } => {
            let (i, o) = inout(input, output.count(), output.count());
            (Some(output.dtype()), None, NO_PEER, i, o)
        }
        CallKind::AllToAllV {
            input,
            output,
            splits,
        } => {
            let sent: usize = splits
                .send_counts
                .iter()
                .fold(0, |a, &b| a.saturating_add(b));
            let got: usize = splits
                .recv_counts
                .iter()
                .fold(0, |a, &b| a.saturating_add(b));
            let _ = input;
            (Some(output.dtype()), None, NO_PEER, sent as u64, got as u64)
        }
        CallKind::AllToAllVDynamic { input, output, .. } => (
            Some(output.dtype()),
            None,
            NO_PEER,
            input.count() as u64,
            output.count() as u64,
        ),
        CallKind::AllToAllVDynamicPacked { input, output, .. } => (
            Some(output.dtype()),
            None,
            NO_PEER,
            input.count() as u64,
            output.count() as u64,
        ),
        CallKind::Barrier => (None, None, NO_PEER, 0, 0),
        CallKind::Send { data, peer } => (
            Some(data.dtype()),
            None,
            *peer as u64,
            data.count() as u64,
            0,
        ),
        CallKind::Recv { out, peer } => {
            (Some(out.dtype()), None, *peer as u64, 0, out.count() as u64)
        }
        CallKind::BatchSendRecv { ops } => {
            let (mut s, mut r) = (0u64, 0u64);
            let mut dtype = None;
            for o in ops {
                match o {
                    P2pOp::Send { data, .. } => {
                        s += data.count() as u64;
                        dtype = Some(data.dtype());
                    }
                    P2pOp::Recv { out, .. } => {
                        r += out.count() as u64;
                        dtype = dtype.or(Some(out.dtype()));
                    }
                }
            }
            (dtype, None, NO_PEER, s, r)
        }
        // Recorded as the all-reduce it starts with, in elements of x.
        CallKind::AllReduceRmsNorm(call) => {
            let shape = call.shape();
            let n = (shape.x_bytes() / shape.dtype.size().max(1)) as u64;
            (Some(shape.dtype), Some(ReduceOp::Sum), NO_PEER, n, n)
        }
    }
}

/// The dump of `recorders` (those of one global rank) as a value in torch's format: version,
/// group table, status, entries recorded at or after `since`. `reason` says why it was made.
pub fn dump_value(
    recorders: &[Arc<FlightRecorder>],
    since: u64,
    only_active: bool,
    reason: &str,
) -> Value {
    let mut pg_config = Map::new();
    let mut pg_status = Map::new();
    let mut entries = Vec::new();
    let mut failures = Map::new();
    let mut rank = 0;
    for r in recorders {
        let i = &r.info;
        rank = i.global_rank();
        let ranks: Vec<String> = i.ranks.iter().map(usize::to_string).collect();
        pg_config.insert(
            i.uid.clone(),
            json!({"name": i.uid, "desc": i.desc, "ranks": format!("[{}]", ranks.join(", ")),
                   "ferrocomm_name": i.name}),
        );
        let mine = r.entries(since, only_active);
        let last = |pred: &dyn Fn(&Value) -> bool| {
            mine.iter()
                .filter(|e| pred(e))
                .filter_map(|e| e["collective_seq_id"].as_i64())
                .max()
                .unwrap_or(-1)
        };
        pg_status.insert(
            i.uid.clone(),
            json!({
                "last_enqueued_collective": last(&|_| true),
                "last_started_collective": last(&|e| e["state"] != "scheduled"),
                "last_completed_collective": last(&|e| e["state"] == "completed"),
            }),
        );
        if let Some(f) = r.failure.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            failures.insert(i.uid.clone(), json!(f));
        }
        entries.extend(mine);
    }
    entries.sort_by_key(|e| e["record_id"].as_u64().unwrap_or(0));
    json!({
        "version": FORMAT_VERSION,
        "comm_lib_version": format!("ferrocomm {}", env!("CARGO_PKG_VERSION")),
        "pg_config": pg_config,
        "pg_status": pg_status,
        "entries": entries,
        "ferrocomm": {
            "rank": rank,
            "pid": std::process::id(),
            "reason": reason,
            "failures": failures,
            "dumped_ns": now_ns(),
        },
    })
}

/// The live recorders of the process whose global rank is `rank` (every one when `None`).
fn live(rank: Option<usize>) -> Vec<Arc<FlightRecorder>> {
    let reg = registry().lock().unwrap_or_else(|e| e.into_inner());
    reg.iter()
        .filter_map(Weak::upgrade)
        .filter(|r| rank.is_none_or(|g| r.info.global_rank() == g))
        .collect()
}

/// The pickled dump of every live communicator of global rank `rank`.
pub fn dump_bytes(rank: usize, reason: &str) -> Result<Vec<u8>> {
    let v = dump_value(&live(Some(rank)), 0, false, reason);
    serde_pickle::to_vec(&v, serde_pickle::SerOptions::new())
        .map_err(|e| Error::InvalidArgument(format!("flight recorder: pickling the dump: {e}")))
}

/// The job's part of the default trace directory's name, agreed at the first communicator.
static JOB: OnceLock<String> = OnceLock::new();

/// Sets the job's name of the default trace directory (the first call wins).
pub(crate) fn set_job(job: &str) {
    let _ = JOB.set(job.to_string());
}

/// The directory dumps go to: `configured`, else `ferrocomm-trace-<uid>-<job>` in the
/// temporary directory.
pub fn trace_dir(configured: Option<&Path>) -> PathBuf {
    match configured {
        Some(p) => p.to_path_buf(),
        None => std::env::temp_dir().join(format!(
            "ferrocomm-trace-{}-{}",
            rustix::process::getuid().as_raw(),
            JOB.get().map_or("local", String::as_str)
        )),
    }
}

/// Makes `dir` (mode 700) unless it exists, and checks that it is a directory of this user
/// that nobody else can write (a hostile user could otherwise plant or swap dumps).
fn secure_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let what = |w: String| Error::InvalidArgument(format!("flight recorder: {w}"));
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(Error::io(
                format!("creating the trace directory {}", dir.display()),
                e,
            ))
        }
    }
    let m = std::fs::symlink_metadata(dir)
        .map_err(|e| Error::io(format!("examining {}", dir.display()), e))?;
    let me = rustix::process::getuid().as_raw();
    if !m.file_type().is_dir() {
        return Err(what(format!(
            "{} is not a directory (a symbolic link?)",
            dir.display()
        )));
    }
    if m.uid() != me || m.mode() & 0o022 != 0 {
        return Err(what(format!(
            "the trace directory {} belongs to uid {} with mode {:o}; it must be this user's \
             (uid {me}) and writable by nobody else",
            dir.display(),
            m.uid(),
            m.mode() & 0o7777
        )));
    }
    Ok(())
}

/// Writes `bytes` to `path` whole: a file of its own beside it first (created exclusively,
/// never through a link), then renamed over the name, so a reader never sees half a dump.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    // A name without the dumps' prefix and without trailing digits: torch's analyzer skips it.
    let tmp = dir.join(format!(
        ".partial-{}-{:x}.tmp",
        std::process::id(),
        rand::random::<u64>()
    ));
    let r = (|| -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r.map_err(|e| {
        Error::io(
            format!("writing the flight recorder's dump {}", path.display()),
            e,
        )
    })
}

/// Dumps every live communicator of global rank `rank` into `dir` (made when absent) as
/// `ferrocomm_trace_rank_<rank>`; returns the file's path.
pub fn dump_to_dir(dir: &Path, rank: usize, reason: &str) -> Result<PathBuf> {
    secure_dir(dir)?;
    let path = dir.join(format!("{FILE_PREFIX}{rank}"));
    write_file(&path, &dump_bytes(rank, reason)?)?;
    Ok(path)
}

/// Dumps every global rank of the process (one file each) into `dir`, for a signal.
pub fn dump_all(dir: &Path, reason: &str) -> Vec<Result<PathBuf>> {
    let mut ranks: Vec<usize> = live(None).iter().map(|r| r.info.global_rank()).collect();
    ranks.sort_unstable();
    ranks.dedup();
    ranks
        .into_iter()
        .map(|r| dump_to_dir(dir, r, reason))
        .collect()
}

/// Installs the SIGUSR1 handler once per process (`FERROCOMM_TRACE_ON_SIGUSR1`): a thread
/// that dumps every communicator into `dir` when the signal comes.
pub(crate) fn dump_on_sigusr1(dir: PathBuf) -> Result<()> {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    if INSTALLED.get().is_some() {
        return Ok(());
    }
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGUSR1])
        .map_err(|e| Error::io("installing the SIGUSR1 handler of the flight recorder", e))?;
    std::thread::Builder::new()
        .name("ferrocomm-sigusr1".into())
        .spawn(move || {
            for _ in signals.forever() {
                for r in dump_all(&dir, "SIGUSR1") {
                    match r {
                        Ok(p) => say!("ferrocomm: flight recorder dumped to {}", p.display()),
                        Err(e) => say!("ferrocomm: flight recorder dump failed: {e}"),
                    }
                }
            }
        })
        .map_err(|e| Error::io("starting the SIGUSR1 thread", e))?;
    let _ = INSTALLED.set(());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::{View, ViewMut};

    fn info() -> GroupInfo {
        GroupInfo {
            name: "t".into(),
            uid: format!("ferrocomm/t#{}", rand::random::<u32>()),
            desc: "host".into(),
            rank: 1,
            ranks: vec![4, 5, 6],
        }
    }

    #[test]
    fn stream_order_tells_which_eager_gpu_calls_completed() {
        // Records 1-6: 1, 2, 4 and 6 on stream 10, 3 and 5 on stream 20; the kernels of 2, 3
        // and 4 began (their marks), 1's mark was overwritten, 5 and 6 never began; 6 is
        // captured.
        let row = |record: u64, stream: u64, state: CallState| {
            let mut w = [0u64; WORDS];
            w[W_RECORD] = record;
            w[W_STREAM] = stream;
            w[W_STATE] = state as u64;
            w
        };
        let mut rows = [
            row(1, 10, CallState::Scheduled),
            row(2, 10, CallState::Scheduled),
            row(3, 20, CallState::Scheduled),
            row(4, 10, CallState::Scheduled),
            row(5, 20, CallState::Scheduled),
            row(6, 10, CallState::Captured),
            row(7, 30, CallState::Failed),
        ];
        by_stream_order(&mut rows, |r| matches!(r, 2..=4));
        let states: Vec<&str> = rows
            .iter()
            .map(|w| CallState::ALL[w[W_STATE] as usize].name())
            .collect();
        assert_eq!(
            states,
            [
                "completed",
                "completed",
                "began",
                "began",
                "scheduled",
                "captured",
                "failed"
            ]
        );
        // The per-thread default stream (handle 2) is a stream per thread: thread 1's call
        // that began says nothing of thread 2's earlier one.
        let mut rows = [
            row(1, 2, CallState::Scheduled),
            row(2, 2, CallState::Scheduled),
        ];
        rows[0][W_THREAD] = 2;
        rows[1][W_THREAD] = 1;
        by_stream_order(&mut rows, |r| r == 2);
        assert_eq!(rows[0][W_STATE], CallState::Scheduled as u64);
        assert_eq!(rows[1][W_STATE], CallState::Began as u64);
        assert_ne!(rows[1][W_STARTED], 0, "when the dump found it began");
        // A point that passed counts as much as a mark: 5's stream has 3 before it.
        let mut rows = [
            row(3, 20, CallState::Scheduled),
            row(5, 20, CallState::Completed),
        ];
        by_stream_order(&mut rows, |_| false);
        assert_eq!(rows[0][W_STATE], CallState::Completed as u64);
    }

    #[test]
    fn a_ring_keeps_the_latest_calls_in_order_with_their_state() {
        let r = FlightRecorder::new(info(), 3);
        let x = vec![1.0f32; 8];
        let mut y = vec![0.0f32; 8];
        let o = CallOpts::default();
        let t = Duration::from_secs(5);
        for i in 0..5u64 {
            let kind = CallKind::AllReduce {
                input: Input::Buf(View::host(&x)),
                output: ViewMut::host(&mut y),
                op: ReduceOp::Max,
            };
            let tok = r.begin(&kind, &o, t, true, 100 + i).unwrap();
            let res = if i == 4 {
                Err(Error::Timeout {
                    collective: "all_reduce",
                    rank: 1,
                    missing: 2,
                    timeout: t,
                })
            } else {
                Ok(())
            };
            r.end(tok, &res, true, false);
        }
        let e = r.entries(0, false);
        assert_eq!(e.len(), 3);
        let seqs: Vec<u64> = e
            .iter()
            .map(|e| e["collective_seq_id"].as_u64().unwrap())
            .collect();
        assert_eq!(seqs, [3, 4, 5]);
        assert_eq!(e[2]["ferrocomm_state"], "timed out");
        assert_eq!(e[1]["ferrocomm_state"], "completed");
        assert_eq!(e[1]["op_id"], 103);
        assert_eq!(e[0]["profiling_name"], "nccl:all_reduce");
        assert_eq!(e[0]["input_sizes"], json!([[8]]));
        assert_eq!(e[0]["input_dtypes"], json!(["Float"]));
        assert_eq!(
            e[0]["ferrocomm_call"],
            "all_reduce(count=8, dtype=float, op=max)"
        );
        let v = dump_value(std::slice::from_ref(&r), 0, false, "test");
        assert_eq!(v["pg_config"][&r.info.uid]["ranks"], "[4, 5, 6]");
        assert_eq!(v["ferrocomm"]["rank"], 5);
        assert_eq!(v["pg_status"][&r.info.uid]["last_completed_collective"], 4);
        // Only the calls that have not completed.
        assert_eq!(
            dump_value(&[r], 0, true, "test")["entries"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn a_call_ending_after_a_later_call_took_its_slot_leaves_that_call_alone() {
        // One slot: the second call takes it before the first ends (more calls in flight than
        // the ring holds). The first call's end (a failure) must not touch the second's row.
        let r = FlightRecorder::new(info(), 1);
        let x = vec![1.0f32; 8];
        let mut y = vec![0.0f32; 8];
        let o = CallOpts::default();
        let t = Duration::from_secs(5);
        let first = r.begin(&CallKind::Barrier, &o, t, true, 1).unwrap();
        let kind = CallKind::AllReduce {
            input: Input::Buf(View::host(&x)),
            output: ViewMut::host(&mut y),
            op: ReduceOp::Max,
        };
        let second = r.begin(&kind, &o, t, true, 2).unwrap();
        r.end(
            first,
            &Err(Error::Aborted {
                communicator: "t".into(),
                why: "test".into(),
            }),
            true,
            false,
        );
        let e = r.entries(0, false);
        assert_eq!(e.len(), 1);
        assert_eq!(e[0]["profiling_name"], "nccl:all_reduce", "{}", e[0]);
        assert_eq!(e[0]["state"], "started", "{}", e[0]);
        r.end(second, &Ok(()), true, false);
        let e = r.entries(0, false);
        assert_eq!(e[0]["state"], "completed", "{}", e[0]);
        assert_eq!(e[0]["profiling_name"], "nccl:all_reduce", "{}", e[0]);
    }

    #[test]
    fn an_off_recorder_records_nothing_until_enabled() {
        let r = FlightRecorder::new(info(), 0);
        let o = CallOpts::default();
        assert!(r
            .begin(&CallKind::Barrier, &o, Duration::from_secs(1), true, 0)
            .is_none());
        r.enable(4);
        let t = r
            .begin(&CallKind::Barrier, &o, Duration::from_secs(1), true, 1)
            .unwrap();
        r.end(t, &Ok(()), true, false);
        let e = r.entries(0, false);
        assert_eq!(e.len(), 1);
        assert_eq!(e[0]["profiling_name"], "nccl:all_reduce_barrier");
        assert_eq!(e[0]["input_sizes"], json!([]));
    }

    #[test]
    fn a_dump_goes_into_a_private_directory_whole() {
        let base =
            std::env::temp_dir().join(format!("ferrocomm-fr-test-{}", rand::random::<u64>()));
        std::fs::create_dir(&base).unwrap();
        let dir = base.join("traces");
        let r = FlightRecorder::new(info(), 2);
        let p = dump_to_dir(&dir, 5, "test").unwrap();
        assert_eq!(p, dir.join("ferrocomm_trace_rank_5"));
        let v: Value =
            serde_pickle::from_slice(&std::fs::read(&p).unwrap(), Default::default()).unwrap();
        assert_eq!(v["version"], FORMAT_VERSION);
        assert_eq!(v["ferrocomm"]["reason"], "test");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        // A directory others may write is refused.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = dump_to_dir(&dir, 5, "test").unwrap_err().to_string();
        assert!(e.contains("writable by nobody else"), "{e}");
        // So is a symbolic link in its place.
        let link = base.join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        let e = dump_to_dir(&link, 5, "test").unwrap_err().to_string();
        assert!(e.contains("not a directory"), "{e}");
        drop(r);
        std::fs::remove_dir_all(&base).unwrap();
    }
}
