//! The host backend: ranks are processes (or threads) on one machine sharing one memory segment.
//!
//! - `shm`: the segment, its layout, creation and clean-up;
//! - `sync`: waiting with backoff, deadlines and dead-peer detection;
//! - this module: the call protocol (signature check, epoch barriers) every collective follows;
//! - `collectives`: the algorithms (flat and tree all-reduce, data movement), chunked through
//!   the staging slots; `lowp`: their block-scaled low-precision forms; `p2p`: send and receive through per-pair mailboxes.
//!
//! A collective call runs as: stage the first chunk into this rank's slot, write the call's
//! signature, start barrier, compare every rank's signature, then per chunk: (stage, barrier)
//! consume, barrier. The last barrier of a call is an end barrier: nobody reuses a slot or a
//! signature record before every rank has finished reading it (docs/design.md, rule 3).

mod collectives;
mod fused_norm;
mod lowp;
mod p2p;
pub(crate) mod shm;
mod sync;
mod window;

pub use shm::remove_stale_segments;
pub use window::SharedMem;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::backend::{
    call_timeout, check_buffers, unsupported, Backend, Call, CallKind, CallName, CallOpts,
    CommContext, P2pOp, WindowBackend,
};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::plan::{self, Algo, CallShape, Collective, Plan};
use crate::types::{DataType, Device, ReduceOp};
use crate::view::{Input, ViewMut};

use shm::{Segment, SIG_WORDS};
use sync::{Backoff, Stop};

/// Why a call stopped by [`Backend::abort`] while it waited reports the communicator aborted.
pub(super) const ABORTED_DURING_CALL: &str = "abort() was called while the call waited";

/// Shared-memory backend of one communicator.
pub struct HostBackend {
    /// Shared with the communicator's windows (peers' pids and failed flags).
    seg: Arc<Segment>,
    rank: usize,
    world: usize,
    cfg: Arc<Config>,
    /// The communicator's store, where a timeout is reported for the launcher.
    store: Arc<dyn crate::bootstrap::Store>,
    /// Collectives run one at a time per communicator (their epochs and sequence numbers).
    state: Mutex<CallState>,
    /// Sends and receives are ordered per pair through the mailboxes; one at a time per rank.
    p2p: Mutex<()>,
    /// Per peer: the latest refusal of a send of ours its receive reported (p2p.rs).
    p2p_refused_seen: Mutex<Vec<u64>>,
    /// The communicator's name, for [`Error::Aborted`].
    name: String,
    /// Set by `abort`: a wait of this rank's running call ends too (a window's as well).
    aborted: Arc<AtomicBool>,
    /// The communicator's watcher's verdicts: a wait for a peer that died ends at once.
    peers: Arc<crate::backend::PeerState>,
}

#[derive(Default)]
struct CallState {
    /// Barriers passed so far (the same number on every rank).
    epoch: u64,
    /// Collective calls so far.
    seq: u64,
    /// Set after a timeout or a dead peer: the epochs no longer agree, so later calls fail fast.
    broken: Option<usize>,
}

/// What every rank of a call must agree on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Signature {
    pub coll: Collective,
    pub dtype: Option<DataType>,
    pub count: u64,
    pub op: Option<ReduceOp>,
    pub root: Option<usize>,
    /// The algorithm chosen (ranks with different thresholds would otherwise disagree).
    pub algo: Algo,
    /// Low-precision wire format (0: full precision) and block size.
    pub lp: u64,
    /// all_to_all_v_dynamic (an all-to-all-v whose `count` is the capacity per sender).
    pub dynamic: bool,
}

impl Signature {
    pub fn new(coll: Collective) -> Self {
        Signature {
            coll,
            dtype: None,
            count: 0,
            op: None,
            root: None,
            algo: Algo::Direct,
            lp: 0,
            dynamic: false,
        }
    }

    /// The signature of a call of `count` elements of `dtype` (the rest as [`Signature::new`]).
    pub fn of(coll: Collective, dtype: DataType, count: usize) -> Self {
        Signature {
            dtype: Some(dtype),
            count: count as u64,
            ..Signature::new(coll)
        }
    }

    fn words(&self, seq: u64) -> [u64; SIG_WORDS - 1] {
        let code = self.coll.code() as u64
            | (self.dtype.map_or(0xff, |d| d.code()) as u64) << 8
            | (self.op.map_or(0xff, |o| o.code()) as u64) << 16
            | (algo_code(self.algo) as u64) << 24
            | (self.dynamic as u64) << 32;
        let scalar = match self.op {
            Some(ReduceOp::PremulSum(s)) => s.to_bits(),
            _ => 0,
        };
        [
            seq,
            code,
            self.count,
            scalar,
            self.root.map_or(u64::MAX, |r| r as u64),
            self.lp,
            0,
        ]
    }

    fn describe(w: &[u64]) -> String {
        let coll = Collective::ALL
            .iter()
            .find(|c| c.code() as u64 == w[1] & 0xff)
            .map_or("?", |c| c.name());
        let mut s = if w[1] >> 32 & 1 == 1 {
            format!("{coll}_dynamic(capacity={}", w[2])
        } else {
            format!("{coll}(count={}", w[2])
        };
        if let Some(d) = DataType::from_code(((w[1] >> 8) & 0xff) as u8) {
            s += &format!(", dtype={d}");
        }
        let op = (w[1] >> 16) & 0xff;
        if op != 0xff {
            let name = ReduceOp::name_of_code(op).unwrap_or("?");
            s += &format!(", op={name}");
            if op == 5 {
                s += &format!("({})", f64::from_bits(w[3]));
            }
        }
        if w[4] != u64::MAX {
            s += &format!(", root={}", w[4]);
        }
        s += &format!(
            ", algo={}",
            ALGOS[((w[1] >> 24) & 0xff) as usize % ALGOS.len()]
        );
        if w[5] != 0 {
            s += &format!(", low precision {}", lowp::describe_lp_word(w[5]));
        }
        s + ")"
    }
}

const ALGOS: [&str; 6] = ["auto", "push", "flat", "tree", "direct", "nccl"];

fn algo_code(a: Algo) -> u8 {
    ALGOS.iter().position(|n| *n == a.name()).unwrap_or(0) as u8
}

/// One collective call in progress: holds the call lock and counts barriers.
pub(crate) struct Running<'a> {
    b: &'a HostBackend,
    st: MutexGuard<'a, CallState>,
    coll: Collective,
    /// Barriers since the start barrier (a call needs at least one: the end barrier).
    after_start: usize,
}

impl HostBackend {
    /// Runs a call of this backend's own (inside another call) on its plan, as the
    /// communicator runs a user's.
    pub(super) fn run_own(&self, kind: CallKind<'_>, opts: &CallOpts) -> Result<()> {
        let plan = crate::backend::plan_call(self, &kind, self.rank, self.world, opts)?;
        self.run(Call { kind, opts, plan })
    }

    /// The host backend of `ctx`: maps the communicator's shared-memory segment (rank 0 creates it,
    /// the others open it once the store says it exists).
    pub fn new(ctx: &CommContext) -> Result<HostBackend> {
        let seg = Segment::establish(
            &*ctx.store,
            ctx.rank,
            ctx.size,
            ctx.config.host_slot_bytes,
            ctx.timeout(),
        )?;
        Ok(HostBackend {
            seg: Arc::new(seg),
            rank: ctx.rank,
            world: ctx.size,
            cfg: ctx.config.clone(),
            store: ctx.store.clone(),
            state: Mutex::new(CallState::default()),
            p2p: Mutex::new(()),
            p2p_refused_seen: Mutex::new(vec![0; ctx.size]),
            name: ctx.name.clone(),
            aborted: Arc::new(AtomicBool::new(false)),
            peers: ctx.peers.clone(),
        })
    }

    /// How long the running call waits for a peer ([`call_timeout`]).
    fn timeout(&self) -> Duration {
        call_timeout(self.cfg.timeout)
    }

    /// Takes the call lock; fails fast when an earlier failure left the communicator unusable.
    fn begin(&self, coll: Collective) -> Result<Running<'_>> {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(peer) = st.broken {
            return Err(Error::PeerFailed {
                collective: coll.name(),
                rank: self.rank,
                peer,
            });
        }
        Ok(Running {
            b: self,
            st,
            coll,
            after_start: 0,
        })
    }

    /// Waits until `ready` holds, watching `peer`: its failed flag, the watcher's verdict on
    /// its process (in any PID namespace), the deadline.
    fn wait_on(&self, peer: usize, ready: impl FnMut() -> bool) -> std::result::Result<(), Stop> {
        wait_for_peer(
            &self.seg,
            &self.aborted,
            &self.peers,
            peer,
            self.timeout(),
            ready,
        )
    }

    /// Leaves `timed_out/<our pid>` = the pid of `peer` in the store, so that a launcher
    /// hosting it names the rank that stalled rather than the one that gave up first.
    fn report_timeout(&self, peer: usize) {
        let pid = self.seg.pid(peer).load(Ordering::Relaxed);
        let key = format!("{}{}", crate::bootstrap::TIMED_OUT, std::process::id());
        // Best effort: the timeout error is what matters to this rank.
        let _ = self.store.set(&key, pid.to_string().as_bytes());
    }

    /// The error of a wait of `collective` (a collective's or point-to-point call's name) on
    /// `peer` that ended with `stop`.
    fn stop_error(&self, stop: Stop, collective: &'static str, peer: usize) -> Error {
        match stop {
            Stop::Timeout => {
                self.report_timeout(peer);
                Error::Timeout {
                    collective,
                    rank: self.rank,
                    missing: peer,
                    timeout: self.timeout(),
                }
            }
            Stop::PeerFailed => Error::PeerFailed {
                collective,
                rank: self.rank,
                peer: self.culprit(peer),
            },
            Stop::Aborted => Error::Aborted {
                communicator: self.name.clone(),
                why: ABORTED_DURING_CALL.into(),
            },
            Stop::Refused => {
                let call = crate::backend::call_no();
                // The rank that refused, which need not be the one waited for.
                let (peer, why) = self.peers.refusal_of(call).unwrap_or((peer, String::new()));
                Error::PeerRefused {
                    collective,
                    call,
                    rank: self.rank,
                    peer,
                    why,
                }
            }
        }
    }

    /// The rank to name for a failure seen on `peer`: the peer that died, when the watcher or
    /// `peer`'s failed flag (which carries the rank whose death made it give up) says which.
    fn culprit(&self, peer: usize) -> usize {
        if let Some((dead, _)) = self.peers.failure() {
            return dead;
        }
        match self.seg.failed(peer).load(Ordering::Relaxed) {
            v if v >= 2 && ((v - 2) as usize) < self.world => (v - 2) as usize,
            _ => peer,
        }
    }
}

/// Waits until `ready` holds, at most `timeout`, watching `peer` of the communicator whose
/// segment is `seg`: its process, its failed flag, and this rank's `aborted`.
pub(crate) fn wait_for_peer(
    seg: &Segment,
    aborted: &AtomicBool,
    peers: &crate::backend::PeerState,
    peer: usize,
    timeout: Duration,
    mut ready: impl FnMut() -> bool,
) -> std::result::Result<(), Stop> {
    let mut backoff = Backoff::new(timeout);
    while !ready() {
        // This rank's abort first: it also sets this rank's failed flag, which a wait for a
        // signal from itself watches.
        if aborted.load(Ordering::Relaxed) {
            return Err(Stop::Aborted);
        }
        if seg.failed(peer).load(Ordering::Relaxed) != 0 {
            return Err(Stop::PeerFailed);
        }
        let n = crate::backend::call_no();
        if n != 0 && peers.refused(peer) == n {
            return Err(Stop::Refused);
        }
        // A refusal of this call by any rank ends the wait too: `peer` may be late, or may
        // have learned of the refusal before making the call, failed it at its start and
        // left. Looked at with the liveness, every few milliseconds (it reads every rank).
        let refused = || n != 0 && peers.refusal_of(n).is_some();
        // The watcher's verdict on the peer's process (in any PID namespace).
        if let Err(stop) = backoff.pause(|| !peers.gone(peer) && !refused()) {
            // The peer may have arrived and exited between the look and the liveness check
            // (the last barrier of a run): what it published still counts. A peer gone after
            // a refusal left because of it (the watcher records refusals before deaths).
            return if ready() {
                Ok(())
            } else if refused() {
                Err(Stop::Refused)
            } else {
                Err(stop)
            };
        }
    }
    Ok(())
}

impl Running<'_> {
    /// Barrier over all ranks with a fresh epoch.
    ///
    /// Each rank publishes its epoch with release (its staging writes happen before) and reads
    /// the others' with acquire (their staging writes become visible): docs/design.md, rules 1-2. Epochs
    /// only grow and the comparison is `>=`: a peer already at the next barrier has certainly
    /// passed this one, and a value can never come back (no ABA).
    pub fn barrier(&mut self) -> Result<()> {
        let seg = &self.b.seg;
        self.st.epoch += 1;
        let e = self.st.epoch;
        seg.epoch(self.b.rank).store(e, Ordering::Release);
        for p in 0..self.b.world {
            if let Err(stop) = self
                .b
                .wait_on(p, || seg.epoch(p).load(Ordering::Acquire) >= e)
            {
                return Err(self.fail(stop, p));
            }
        }
        self.after_start += 1;
        Ok(())
    }

    /// Records the failure so that peers and later calls stop waiting on this communicator.
    fn fail(&mut self, stop: Stop, peer: usize) -> Error {
        let e = self.b.stop_error(stop, self.coll.name(), peer);
        // The flag carries the rank that died (+ 2), so that peers name it too.
        let flag = match &e {
            Error::PeerFailed { peer, .. } => *peer as u64 + 2,
            _ => 1,
        };
        self.st.broken = Some(match &e {
            Error::PeerFailed { peer, .. } => *peer,
            _ => peer,
        });
        self.b
            .seg
            .failed(self.b.rank)
            .store(flag, Ordering::Relaxed);
        e
    }

    /// Publishes the signature, passes the start barrier and checks that every rank called the
    /// same thing. On a mismatch every rank sees the same records, so every rank fails; one more
    /// barrier keeps the records in place until all have compared.
    pub fn start(&mut self, sig: &Signature) -> Result<()> {
        self.st.seq += 1;
        let seg = &self.b.seg;
        let me = self.b.rank;
        let mine = sig.words(self.st.seq);
        for (i, w) in mine.iter().enumerate() {
            // Relaxed: the barrier's release store of the epoch publishes these.
            seg.sig(me, i).store(*w, Ordering::Relaxed);
        }
        self.barrier()?;
        self.after_start = 0;
        let compared = SIG_WORDS - 2; // the last word is per-rank data, not agreed on
        for p in 0..self.b.world {
            let theirs: Vec<u64> = (0..SIG_WORDS - 1)
                .map(|i| seg.sig(p, i).load(Ordering::Relaxed))
                .collect();
            if theirs[..compared] != mine[..compared] {
                self.barrier()?;
                return Err(Error::Mismatch {
                    seq: self.st.seq,
                    rank: me,
                    mine: Signature::describe(&mine),
                    peer: p,
                    theirs: Signature::describe(&theirs),
                });
            }
        }
        Ok(())
    }

    /// The end barrier, unless the call already passed one after the start barrier.
    pub fn finish(mut self) -> Result<()> {
        if self.after_start == 0 {
            self.barrier()?;
        }
        Ok(())
    }

    pub fn seq(&self) -> u64 {
        self.st.seq
    }
}

/// A collective's buffers as raw host pointers (in place, the input pointer is the output's).
pub(crate) struct Bufs {
    pub input: *const u8,
    pub output: *mut u8,
    pub in_place: bool,
}

impl Bufs {
    /// The host addresses of a call's buffers (their device checked by [`check_buffers`]).
    fn new(input: &Input<'_>, output: &ViewMut<'_>) -> Bufs {
        let (input, in_place) = match input {
            Input::InPlace => (output.ptr() as *const u8, true),
            Input::Buf(v) => (v.ptr(), false),
        };
        Bufs {
            input,
            output: output.ptr(),
            in_place,
        }
    }

    /// The input of all-gather: in place, this rank's part already sits at its offset in the
    /// full output (pointer arithmetic only).
    pub fn gather_input(&self, rank: usize, part_bytes: usize) -> *const u8 {
        if self.in_place {
            self.output.wrapping_add(rank * part_bytes)
        } else {
            self.input
        }
    }

    /// The output of reduce-scatter: in place, the result goes to this rank's part of the full
    /// buffer (pointer arithmetic only).
    pub fn scatter_output(&self, rank: usize, part_bytes: usize) -> *mut u8 {
        if self.in_place {
            self.output.wrapping_add(rank * part_bytes)
        } else {
            self.output
        }
    }
}

impl Backend for HostBackend {
    fn name(&self) -> &'static str {
        "host"
    }

    fn peer_refused(&self, peer: usize) {
        // The waits of the call see the refusal themselves (PeerState).
        let _ = peer;
    }

    fn abort(&self, _why: &str) {
        // The flag a failed call sets: peers waiting on this rank stop at once (PeerFailed);
        // this rank's own running call stops at its next look.
        self.aborted.store(true, Ordering::Relaxed);
        self.seg.failed(self.rank).store(1, Ordering::Relaxed);
    }

    /// Runs one call as its plan says ([`plan::host_call_plan`]: the algorithm and the codec),
    /// on the buffers' host addresses.
    fn run(&self, call: Call<'_>) -> Result<()> {
        check_buffers(&call.kind, Device::Host)?;
        let plan = &call.plan;
        match call.kind {
            CallKind::AllReduce { input, output, op } => {
                let bufs = Bufs::new(&input, &output);
                let (n, dt) = (output.count(), output.dtype());
                self.all_reduce_impl(&bufs, dt, n, op, plan)
            }
            CallKind::Reduce {
                input,
                output,
                op,
                root,
            } => {
                let bufs = Bufs::new(&input, &output);
                self.reduce_impl(&bufs, output.dtype(), output.count(), op, root)
            }
            CallKind::Broadcast {
                input,
                output,
                root,
            } => {
                // Only the root reads its input; elsewhere it may be anything (or in place).
                let input = if self.rank == root {
                    input
                } else {
                    Input::InPlace
                };
                let bufs = Bufs::new(&input, &output);
                self.broadcast_impl(&bufs, output.dtype(), output.count(), root)
            }
            CallKind::AllGather { input, output } => {
                let bufs = Bufs::new(&input, &output);
                let (part, dt) = (output.count() / self.world, output.dtype());
                self.all_gather_impl(&bufs, dt, part, plan)
            }
            CallKind::ReduceScatter { input, output, op } => {
                let bufs = Bufs::new(&input, &output);
                let dt = output.dtype();
                // In place, the output is the whole buffer of every rank's parts.
                let part = if bufs.in_place {
                    output.count() / self.world
                } else {
                    output.count()
                };
                self.reduce_scatter_impl(&bufs, dt, part, op, plan)
            }
            CallKind::AllToAll { input, output } => {
                let bufs = Bufs::new(&input, &output);
                let part = output.count() / self.world;
                self.all_to_all_impl(&bufs, output.dtype(), part, plan)
            }
            CallKind::AllToAllV {
                input,
                output,
                splits,
            } => {
                let bufs = Bufs::new(&input, &output);
                let in_count = match &input {
                    Input::InPlace => output.count(),
                    Input::Buf(v) => v.count(),
                };
                let dt = output.dtype();
                self.all_to_all_v_impl(&bufs, dt, in_count, splits, plan)
            }
            CallKind::AllToAllVDynamic {
                input,
                output,
                counts,
            } => {
                let bufs = Bufs::new(&Input::Buf(input), &output);
                self.all_to_all_v_dynamic_impl(&bufs, output.dtype(), input.count(), counts)
            }
            // Counts in host memory never get here (the communicator runs them as the
            // all-to-all-v they describe), and the host has no device memory.
            CallKind::AllToAllVDynamicPacked { .. } => {
                Err(unsupported(CallName::AllToAllVDynamicPacked, self.name()))
            }
            CallKind::Barrier => {
                let mut call = self.begin(Collective::Barrier)?;
                call.start(&Signature::new(Collective::Barrier))?;
                call.finish()
            }
            CallKind::Send { data, peer } => self.p2p_impl("send", &[P2pOp::Send { data, peer }]),
            CallKind::Recv { out, peer } => self.p2p_impl("recv", &[P2pOp::Recv { out, peer }]),
            CallKind::BatchSendRecv { ops } => self.p2p_impl("batch_send_recv", &ops),
            CallKind::AllReduceRmsNorm(call) => self.all_reduce_rmsnorm_impl(call, plan),
        }
    }

    fn new_window(&self, slots: usize) -> Result<Box<dyn WindowBackend>> {
        Ok(Box::new(window::HostWindow::new(
            self.seg.clone(),
            self.aborted.clone(),
            self.peers.clone(),
            self.rank,
            self.world,
            slots,
            self.name.clone(),
        )))
    }

    fn plan(&self, shape: &CallShape, opts: &CallOpts) -> Result<Plan> {
        let (algo, lp) = (opts.algo.0, opts.low_precision);
        plan::host_call_plan(shape, self.world, algo, lp, &self.cfg)
    }

    fn rmsnorm_plan_for(&self, shape: crate::rmsnorm::Shape, opts: &CallOpts) -> Result<Plan> {
        // The all-reduce (its own plan, low precision included), then the norm.
        let all_reduce =
            self.plan_for(Collective::AllReduce, shape.x_bytes(), shape.dtype, opts)?;
        Ok(Plan {
            norm: Some(plan::NormForm::TwoLaunch),
            ..all_reduce
        })
    }
}
