//! What a communicator does when something goes wrong, and what it records so that one can
//! tell afterwards: the flight recorder around every call and its dumps, the watcher's
//! handler, hooks, and the opt-in checks of every call (`FERROCOMM_CHECK_CALLS`,
//! `FERROCOMM_NAN_CHECK`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::Communicator;
use crate::backend::{Backend, Call, CallKind, CallName, CallOpts, CommContext, P2pOp};
use crate::error::{Error, Result};
use crate::flight::{FlightRecorder, GroupInfo};
use crate::hooks::{AbortHook, HookHandle, PostHook, PreHook};
use crate::types::{DataType, Device};
use crate::view::{Input, View};

/// Every rank of the job's first communicator takes rank 0's name for the default trace
/// directory, so that all ranks dump into one directory.
pub(super) fn agree_trace_job(ctx: &CommContext) -> Result<()> {
    // Every rank of the communicator takes part whatever it knows already (another
    // communicator of this process may have set the name on one rank and not yet on another).
    if ctx.config.trace_dir.is_some() {
        return Ok(());
    }
    let job = if ctx.size == 1 {
        format!("{:08x}", rand::random::<u32>())
    } else if ctx.rank == 0 {
        let j = format!("{:08x}", rand::random::<u32>());
        ctx.store.set("trace/job", j.as_bytes())?;
        j
    } else {
        let j = ctx.store.get("trace/job", ctx.timeout())?;
        let j = String::from_utf8_lossy(&j).into_owned();
        if j.is_empty() || j.len() > 16 || !j.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::InvalidArgument(format!(
                "the store's trace job name {j:?} is not the hex name rank 0 makes"
            )));
        }
        j
    };
    crate::flight::set_job(&job);
    Ok(())
}

/// The flight recorder of a new communicator (its ring as `FERROCOMM_FLIGHT_RECORDER` says),
/// which names plans through `backend`; installs the SIGUSR1 dump when asked for.
pub(super) fn recorder(
    ctx: &CommContext,
    backend_kind: &str,
    global_ranks: Vec<usize>,
    backend: &Arc<dyn Backend>,
) -> Result<Arc<FlightRecorder>> {
    let info = GroupInfo {
        name: ctx.name.clone(),
        uid: ctx.prefix.clone(),
        desc: backend_kind.to_string(),
        rank: ctx.rank,
        ranks: global_ranks,
    };
    let r = FlightRecorder::new(info, ctx.config.flight_recorder);
    r.set_backend(Arc::downgrade(backend));
    if ctx.config.trace_on_sigusr1 {
        crate::flight::dump_on_sigusr1(crate::flight::trace_dir(ctx.config.trace_dir.as_deref()))?;
    }
    Ok(r)
}

impl Communicator {
    /// Hands the watcher (when there is one) what to do when a peer fails: give up on the
    /// backend's waits and kernels (direct-access kernels see the abort word, NCCL is
    /// aborted), run the abort hooks, dump the flight recorder.
    pub(super) fn arm_watch(&self) {
        let Some(w) = &self.watch else { return };
        let backend = Arc::downgrade(&self.backend);
        let flight = self.flight.clone();
        let hooks = self.hooks.clone();
        let (rank, name) = (self.ctx.rank, self.ctx.name.clone());
        let dir = self.trace_dir();
        let (refused_backend, outcomes) = (Arc::downgrade(&self.backend), self.outcomes.clone());
        let refusal_name = self.ctx.name.clone();
        w.on_refusal(Box::new(move |peer, n| {
            // A call the backend took waits for the peer (a kernel spinning on its flags): end
            // it. A call not taken yet fails at its start or, taken meanwhile, right after
            // (run_recorded looks again); a call this rank refused too waits for nothing, and
            // the communicator stays usable (every rank refused the same call).
            if outcomes.taken(n) {
                crate::flight::say!(
                    "ferrocomm: rank {rank} '{refusal_name}': rank {peer} refused call #{n}; \
                     it fails here too"
                );
                if let Some(b) = refused_backend.upgrade() {
                    b.peer_refused(peer);
                }
            }
        }));
        w.on_failure(Box::new(move |peer, why| {
            let what = match why {
                crate::watch::Failure::Died => "died",
                crate::watch::Failure::Aborted => "gave up on the communicator",
            };
            let reason = format!("rank {peer} {what}");
            crate::flight::say!(
                "ferrocomm: rank {rank} '{name}': {reason}; the communicator is aborted \
                 (calls fail naming rank {peer})"
            );
            if let Some(b) = backend.upgrade() {
                b.peer_failed(peer);
            }
            hooks.abort();
            if flight.note_failure(&reason) && flight.is_on() {
                report_dump(
                    rank,
                    crate::flight::dump_to_dir(&dir, flight.info().global_rank(), &reason),
                );
            }
        }));
    }

    /// Runs a checked call with the flight recorder around it (and the opt-in checks first).
    pub(super) fn run_recorded(
        &self,
        backend: &dyn Backend,
        kind: CallKind<'_>,
        opts: &CallOpts,
        timeout: Duration,
        op_id: u64,
    ) -> Result<()> {
        let host = self.ctx.device == Device::Host;
        let token = self.flight.begin(&kind, opts, timeout, host, op_id);
        // A recorded eager CUDA call's kernels mark their start for the recorder (no event
        // per call, docs/reliability.md); a captured call is recorded once, as captured.
        let captured = token.is_some() && !host && backend.capturing(opts.stream);
        let mark = crate::backend::CallMark::enter(
            token
                .as_ref()
                .filter(|_| !host && !captured)
                .map(|t| t.record),
        );
        let collective = !kind.name().is_p2p();
        // Collective calls are numbered; a call a peer refused fails here at once. (SeqCst
        // with the watcher's handler: one of the two sees the other.)
        let n = if collective {
            self.calls.fetch_add(1, Ordering::SeqCst) + 1
        } else {
            0
        };
        let _no = crate::backend::CallNo::enter(n);
        let name = kind.name().name();
        let stop = if collective {
            stop_before_run(
                backend.earlier_error(name),
                self.ctx.peers.refusal_of(n),
                name,
                n,
                self.ctx.rank,
            )
        } else {
            Ok(())
        };
        let r = stop
            .and_then(|()| self.checks(&kind))
            .and_then(|()| self.plan_once(backend, &kind, opts))
            .and_then(|plan| backend.run(Call { kind, opts, plan }));
        if let Err(e) = &r {
            // A fault found while the call ran, the peers taking part, is no refusal.
            if collective && is_refusal(e) && !crate::backend::exchanging() {
                self.announce_refusal(n, name, e);
            }
        }
        let r = match r {
            Ok(()) if collective => self.taken(backend, n, name),
            r => {
                if collective {
                    self.outcomes.set(n, false);
                }
                r
            }
        };
        let marked = mark.taken();
        drop(mark);
        if let Some(t) = token {
            self.end_recorded(backend, t, &r, opts.stream, captured, marked);
        }
        if let Err(e) = &r {
            self.after_error(e);
        }
        r
    }

    /// Records how a call returned; a CUDA call enqueued eagerly whose kernels did not take
    /// its mark (`marked`: NCCL, copies alone) gets a point on its stream, from which a dump
    /// tells whether it completed.
    fn end_recorded(
        &self,
        backend: &dyn Backend,
        t: crate::flight::Token,
        r: &Result<()>,
        stream: u64,
        captured: bool,
        marked: bool,
    ) {
        let host = self.ctx.device == Device::Host;
        let captured = captured && r.is_ok();
        if !host && r.is_ok() && !captured && !marked {
            if let Ok(Some(point)) = backend.mark(stream) {
                self.flight.attach(&t, point);
            }
        }
        self.flight.end(t, r, host, captured);
    }

    /// Records that the backend took collective call `n`; when a peer refused it meanwhile
    /// (the watcher's handler found it not taken yet), ends the backend's waits for it here and
    /// fails the call. (SeqCst, with the handler's store of the refusal before its look at the
    /// outcomes: one of the two sees the other.)
    fn taken(&self, backend: &dyn Backend, n: u64, collective: &'static str) -> Result<()> {
        self.outcomes.set(n, true);
        match self.ctx.peers.refusal_of(n) {
            None => Ok(()),
            Some(refusal) => {
                backend.peer_refused(refusal.0);
                Err(peer_refused(collective, n, self.ctx.rank, refusal))
            }
        }
    }

    /// Tells the peers that this rank refused collective call `n`: they fail it at once
    /// instead of waiting for this rank.
    fn announce_refusal(&self, n: u64, collective: &str, e: &Error) {
        if let Some(w) = &self.watch {
            w.announce_refusal(n, &format!("{collective} on rank {}: {e}", self.ctx.rank));
        }
    }

    /// A call of `name` that this rank's own arguments failed (`e`), before it was numbered:
    /// a collective is refused for the peers too ([`Communicator::refuse`]), so that they
    /// fail it at once instead of waiting for this rank.
    pub(super) fn refuse_for(&self, name: CallName, e: &Error) {
        if !name.is_p2p() && is_refusal(e) {
            self.refuse(name.name(), &e.to_string());
        }
    }

    /// Tells the peers' watchers that this rank has left the communicator (`finalize`, and a
    /// process about to exit): its process ending later is no failure for them.
    pub fn leave(&self) {
        if let Some(w) = &self.watch {
            w.announce_leave();
        }
    }

    /// Refuses the next collective call on this rank because `why` (an argument that is wrong
    /// here, found before the call reached the communicator): the peers fail that call at
    /// once instead of waiting for this rank. A layer above with checks of its own calls it.
    pub fn refuse(&self, collective: &str, why: &str) {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        self.outcomes.set(n, false);
        if let Some(w) = &self.watch {
            w.announce_refusal(n, &format!("{collective} on rank {}: {why}", self.ctx.rank));
        }
    }

    /// A call that failed because of the peers (a timeout, a dead peer, ranks that disagree)
    /// dumps the flight recorder, the first time.
    fn after_error(&self, e: &Error) {
        if matches!(
            e,
            Error::Timeout { .. } | Error::PeerFailed { .. } | Error::Mismatch { .. }
        ) {
            self.dump_for_failure(&e.to_string());
        }
    }

    /// Dumps the flight recorder into the trace directory for the communicator's first
    /// failure (`why`), and says where on stderr.
    pub(super) fn dump_for_failure(&self, why: &str) {
        if self.flight.note_failure(why) && self.flight.is_on() {
            report_dump(
                self.ctx.rank,
                crate::flight::dump_to_dir(
                    &self.trace_dir(),
                    self.flight.info().global_rank(),
                    why,
                ),
            );
        }
    }

    /// The directory the flight recorder's dumps go to (`FERROCOMM_TRACE_DIR`, else a
    /// per-job directory under the temporary directory).
    pub fn trace_dir(&self) -> PathBuf {
        crate::flight::trace_dir(self.ctx.config.trace_dir.as_deref())
    }

    /// Dumps the flight recorder of every communicator of this process that has this one's
    /// global rank, in torch's flight-recorder format: to `path`, or to
    /// `ferrocomm_trace_rank_<rank>` in [`Communicator::trace_dir`] when `None`. Returns
    /// the file written.
    pub fn dump_flight_recorder(&self, path: Option<&Path>) -> Result<PathBuf> {
        let rank = self.flight.info().global_rank();
        match path {
            None => crate::flight::dump_to_dir(&self.trace_dir(), rank, "on demand"),
            Some(p) => {
                crate::flight::write_file(p, &crate::flight::dump_bytes(rank, "on demand")?)?;
                Ok(p.to_path_buf())
            }
        }
    }

    /// The peer whose failure (death, or its abort) the watcher saw, if any: every later
    /// call fails naming it.
    pub fn failed_peer(&self) -> Option<usize> {
        self.ctx.peers.failure().map(|(p, _)| p)
    }

    /// This communicator's flight recorder.
    pub fn flight_recorder(&self) -> &Arc<FlightRecorder> {
        &self.flight
    }

    /// Registers `f`, called before every call with its op id, name and operands.
    pub fn register_pre_hook(&self, f: Arc<PreHook>) -> HookHandle {
        self.hooks.register_pre(f)
    }

    /// Registers `f`, called after every call with its op id, name and result.
    pub fn register_post_hook(&self, f: Arc<PostHook>) -> HookHandle {
        self.hooks.register_post(f)
    }

    /// Registers `f`, called once when the communicator is aborted (by
    /// [`Communicator::abort`], or because a peer died or gave up), before it gives up.
    pub fn register_abort_hook(&self, f: Arc<AbortHook>) -> Result<HookHandle> {
        self.hooks.register_abort(f)
    }

    /// The opt-in checks of a call before it runs.
    fn checks(&self, kind: &CallKind<'_>) -> Result<()> {
        let cfg = &self.ctx.config;
        if cfg.nan_check {
            nan_check(
                kind,
                self.ctx.rank,
                self.checked.load(Ordering::Relaxed) + 1,
            )?;
        }
        if cfg.check_calls && self.ctx.size > 1 && !kind.name().is_p2p() {
            self.check_call(kind)?;
        }
        Ok(())
    }

    /// `FERROCOMM_CHECK_CALLS`: every rank publishes its call's description in the store and
    /// compares it with every other rank's, so a call that differs fails on every rank at
    /// that call, before anything runs.
    fn check_call(&self, kind: &CallKind<'_>) -> Result<()> {
        let seq = self.checked.fetch_add(1, Ordering::Relaxed) + 1;
        let (me, n) = (self.ctx.rank, self.ctx.size);
        let mine = CheckedShape::of(kind);
        let store = &*self.ctx.store;
        let key = |r: usize, s: u64| format!("check/{s}/{r}");
        store.set(&key(me, seq), mine.encode().as_bytes())?;
        let mut all = Vec::with_capacity(n);
        for r in 0..n {
            if r == me {
                all.push(mine.clone());
                continue;
            }
            let b = self.check_get(&key(r, seq), r)?;
            all.push(CheckedShape::decode(&String::from_utf8_lossy(&b)));
        }
        // Every rank has published call `seq`, so every rank is done reading `seq - 1`.
        if seq > 1 {
            let _ = store.delete(&key(me, seq - 1));
        }
        for (r, theirs) in all.iter().enumerate() {
            if r == me {
                continue;
            }
            if theirs.shape != mine.shape {
                return Err(Error::Mismatch {
                    seq,
                    rank: me,
                    mine: mine.shape.clone(),
                    peer: r,
                    theirs: theirs.shape.clone(),
                });
            }
        }
        // All-to-all-v: what each rank sends to another must be what that one expects.
        if !mine.sends.is_empty() {
            for (s, d) in all.iter().enumerate() {
                for (t, e) in all.iter().enumerate() {
                    let (sent, want) = (d.sends.get(t), e.recvs.get(s));
                    if sent != want {
                        return Err(Error::InvalidArgument(format!(
                            "{} at call #{seq} (checked across ranks): rank {s} sends {} \
                             elements to rank {t}, which expects {} from it",
                            mine.name,
                            sent.map_or("no".into(), |v| v.to_string()),
                            want.map_or("none".into(), |v| v.to_string()),
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    /// A peer's description of the call being checked, waited for in slices so that a peer
    /// that died ends the wait at once.
    fn check_get(&self, key: &str, r: usize) -> Result<Vec<u8>> {
        let deadline = std::time::Instant::now() + self.timeout();
        loop {
            if let Some((peer, _)) = self.ctx.peers.failure() {
                return Err(Error::PeerFailed {
                    collective: "check of the call",
                    rank: self.ctx.rank,
                    peer,
                });
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout {
                    collective: "check of the call",
                    rank: self.ctx.rank,
                    missing: r,
                    timeout: self.timeout(),
                });
            }
            match self
                .ctx
                .store
                .get(key, left.min(Duration::from_millis(100)))
            {
                Ok(b) => return Ok(b),
                Err(Error::StoreTimeout { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// Says where a dump went (or why it could not be made), on stderr.
fn report_dump(rank: usize, r: Result<PathBuf>) {
    match r {
        Ok(p) => crate::flight::say!(
            "ferrocomm: rank {rank}: flight recorder dumped to {} (analyze every rank's with \
             `ferrocomm trace {}`)",
            p.display(),
            p.parent().unwrap_or(Path::new(".")).display()
        ),
        Err(e) => crate::flight::say!("ferrocomm: rank {rank}: flight recorder dump failed: {e}"),
    }
}

/// What became of this rank's last [`Outcomes::CALLS`] collective calls: taken by the
/// backend or not (refused here, or failed before anything was enqueued). The watcher's
/// handler reads it when a peer refuses call `n`, which may be some calls after this rank went
/// past `n` (the handler runs at the watcher's tick).
pub(crate) struct Outcomes {
    /// Per slot `n % CALLS`: `n << 1 | taken`, 0 for none yet.
    slots: Box<[AtomicU64]>,
}

impl Default for Outcomes {
    fn default() -> Outcomes {
        Outcomes {
            slots: (0..Outcomes::CALLS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl Outcomes {
    /// Calls remembered: more than any rank makes in a watcher's tick (20 ms), a call costing
    /// several microseconds of host time.
    const CALLS: u64 = 4096;

    fn set(&self, n: u64, taken: bool) {
        if let Some(s) = self.slots.get((n % Outcomes::CALLS) as usize) {
            s.store(n << 1 | u64::from(taken), Ordering::SeqCst);
        }
    }

    /// Whether a peer's refusal of call `n` must end this rank's waits: call `n` was taken
    /// here, or this rank is so far past it that its outcome is forgotten (a rank that
    /// enqueued that many calls behind a waiting one is stuck). Not reached yet, or not taken
    /// here (refused on this rank too): no.
    fn taken(&self, n: u64) -> bool {
        let Some(s) = self.slots.get((n % Outcomes::CALLS) as usize) else {
            return false;
        };
        let v = s.load(Ordering::SeqCst);
        let m = v >> 1;
        (m == n && v & 1 == 1) || m > n
    }
}

/// What ends collective call `n` on this rank before anything of it runs: an error an earlier
/// call left here (`earlier`, [`Backend::earlier_error`]), else a peer's refusal of `n`.
///
/// This rank's own error comes first. Where a kernel saw ranks disagree, every rank holds
/// such a record and refuses the next call with it, so the peers' refusals of that call
/// arrive as this rank makes it; one taken in the record's stead would leave the record for
/// the call after, which this rank alone would then refuse while its peers had taken it (their
/// communicator aborted).
fn stop_before_run(
    earlier: Result<()>,
    refusal: Option<(usize, String)>,
    collective: &'static str,
    n: u64,
    rank: usize,
) -> Result<()> {
    earlier?;
    match refusal {
        None => Ok(()),
        Some(r) => Err(peer_refused(collective, n, rank, r)),
    }
}

/// The error of call `n` on `rank` when `peer` refused it because `why`.
fn peer_refused(
    collective: &'static str,
    n: u64,
    rank: usize,
    (peer, why): (usize, String),
) -> Error {
    Error::PeerRefused {
        collective,
        call: n,
        rank,
        peer,
        why,
    }
}

/// Errors that refuse a call on this rank alone, before anything of it was enqueued here: its
/// own arguments, or an earlier call's record reported at this call ([`stop_before_run`]). The
/// peers must fail that call too, else they wait for this rank until the timeout.
fn is_refusal(e: &Error) -> bool {
    matches!(
        e,
        Error::InvalidArgument(_)
            | Error::SizeMismatch { .. }
            | Error::DtypeMismatch { .. }
            | Error::UnsupportedOp { .. }
            | Error::RankOutOfRange { .. }
    )
}

/// What `FERROCOMM_CHECK_CALLS` compares: the shape every rank must agree on, and an
/// all-to-all-v's counts, which must agree pairwise.
#[derive(Clone, Debug)]
struct CheckedShape {
    name: &'static str,
    shape: String,
    sends: Vec<usize>,
    recvs: Vec<usize>,
}

impl CheckedShape {
    fn of(kind: &CallKind<'_>) -> CheckedShape {
        let name = kind.name().name();
        let (shape, sends, recvs) = match kind {
            CallKind::AllReduce { output, op, .. } => (
                format!(
                    "all_reduce(count={}, dtype={}, op={op})",
                    output.count(),
                    output.dtype()
                ),
                vec![],
                vec![],
            ),
            CallKind::Reduce {
                output, op, root, ..
            } => (
                format!(
                    "reduce(count={}, dtype={}, op={op}, root={root})",
                    output.count(),
                    output.dtype()
                ),
                vec![],
                vec![],
            ),
            CallKind::Broadcast { output, root, .. } => (
                format!(
                    "broadcast(count={}, dtype={}, root={root})",
                    output.count(),
                    output.dtype()
                ),
                vec![],
                vec![],
            ),
            CallKind::AllGather { input, output } => (
                format!(
                    "all_gather(output count={}, dtype={}{})",
                    output.count(),
                    output.dtype(),
                    in_place(input)
                ),
                vec![],
                vec![],
            ),
            CallKind::ReduceScatter { input, output, op } => (
                format!(
                    "reduce_scatter(output count={}, dtype={}, op={op}{})",
                    output.count(),
                    output.dtype(),
                    in_place(input)
                ),
                vec![],
                vec![],
            ),
            CallKind::AllToAll { output, .. } => (
                format!(
                    "all_to_all(count={}, dtype={})",
                    output.count(),
                    output.dtype()
                ),
                vec![],
                vec![],
            ),
            CallKind::AllToAllV { output, splits, .. } => (
                format!("all_to_all_v(dtype={})", output.dtype()),
                splits.send_counts.clone(),
                splits.recv_counts.clone(),
            ),
            CallKind::AllToAllVDynamic { output, counts, .. } => (
                format!(
                    "all_to_all_v_dynamic(dtype={}, capacity={}, unit={})",
                    output.dtype(),
                    counts.capacity,
                    counts.unit
                ),
                vec![],
                vec![],
            ),
            CallKind::AllToAllVDynamicPacked { output, counts, .. } => (
                format!(
                    "all_to_all_v_dynamic_packed(dtype={}, unit={})",
                    output.dtype(),
                    counts.unit
                ),
                vec![],
                vec![],
            ),
            CallKind::Barrier => ("barrier()".into(), vec![], vec![]),
            CallKind::Send { .. } | CallKind::Recv { .. } | CallKind::BatchSendRecv { .. } => {
                (name.to_string(), vec![], vec![])
            }
            CallKind::AllReduceRmsNorm(call) => {
                let shape = call.shape();
                (
                    format!(
                        "{name}({})",
                        crate::rmsnorm::Shape::describe(
                            &shape.words(call.eps, crate::rmsnorm::Fp8Mode::of(&call.fp8))
                        )
                    ),
                    vec![],
                    vec![],
                )
            }
        };
        CheckedShape {
            name,
            shape,
            sends,
            recvs,
        }
    }

    fn encode(&self) -> String {
        let list = |v: &[usize]| v.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
        format!(
            "{}\n{}\n{}\n{}",
            self.name,
            self.shape,
            list(&self.sends),
            list(&self.recvs)
        )
    }

    fn decode(s: &str) -> CheckedShape {
        let mut l = s.split('\n');
        let name = l.next().unwrap_or("");
        let shape = l.next().unwrap_or("(unreadable)").to_string();
        let list = |x: Option<&str>| -> Vec<usize> {
            x.unwrap_or("")
                .split(',')
                .filter(|t| !t.is_empty())
                .map(|t| t.parse().unwrap_or(usize::MAX))
                .collect()
        };
        let _ = name;
        CheckedShape {
            name: "",
            shape,
            sends: list(l.next()),
            recvs: list(l.next()),
        }
    }
}

fn in_place(input: &Input<'_>) -> &'static str {
    match input {
        Input::InPlace => ", in place",
        Input::Buf(_) => "",
    }
}

/// `FERROCOMM_NAN_CHECK`: the first NaN or infinity in a floating-point input of the call
/// (`seq`: the call's number on this communicator) is an error naming the rank and the call.
fn nan_check(kind: &CallKind<'_>, rank: usize, seq: u64) -> Result<()> {
    let name = kind.name().name();
    let check = |v: &View<'_>, what: &str| -> Result<()> {
        if let Some(i) = first_not_finite(v)? {
            return Err(Error::InvalidArgument(format!(
                "{name} (call #{seq}) on rank {rank}: the {what} holds a NaN or infinity at \
                 element {i} (FERROCOMM_NAN_CHECK)"
            )));
        }
        Ok(())
    };
    let input_or_output = |input: &Input<'_>, output: &crate::view::ViewMut<'_>| match input {
        Input::Buf(v) => check(v, "input"),
        Input::InPlace => check(&output.as_view(), "input (in place)"),
    };
    match kind {
        CallKind::AllReduce { input, output, .. }
        | CallKind::Reduce { input, output, .. }
        | CallKind::ReduceScatter { input, output, .. }
        | CallKind::AllGather { input, output }
        | CallKind::AllToAll { input, output }
        | CallKind::AllToAllV { input, output, .. } => input_or_output(input, output),
        CallKind::Broadcast { .. } | CallKind::Barrier | CallKind::Recv { .. } => Ok(()),
        CallKind::AllToAllVDynamic { input, .. }
        | CallKind::AllToAllVDynamicPacked { input, .. } => check(input, "input"),
        CallKind::Send { data, .. } => check(data, "data sent"),
        CallKind::BatchSendRecv { ops } => ops.iter().try_for_each(|o| match o {
            P2pOp::Send { data, .. } => check(data, "data sent"),
            P2pOp::Recv { .. } => Ok(()),
        }),
        CallKind::AllReduceRmsNorm(call) => {
            input_or_output(&call.x, &call.out)?;
            match &call.residual {
                Input::Buf(v) => check(v, "residual"),
                Input::InPlace => check(&call.residual_out.as_view(), "residual (in place)"),
            }
        }
    }
}

/// The index of the first element of `v` that is NaN or infinite (floats only; CUDA memory
/// is copied to the host first).
fn first_not_finite(v: &View<'_>) -> Result<Option<usize>> {
    let d = v.dtype();
    if !d.is_float() || v.count() == 0 {
        return Ok(None);
    }
    let owned;
    let bytes: &[u8] = match v.host_bytes() {
        Some(b) => b,
        None => {
            owned = crate::driver::copy_to_host(v.ptr() as u64, v.bytes_len())?;
            &owned
        }
    };
    let es = d.size();
    let bad = |c: &[u8]| -> bool {
        match d {
            DataType::F32 => !f32::from_le_bytes(c.try_into().expect("4 bytes")).is_finite(),
            DataType::F64 => !f64::from_le_bytes(c.try_into().expect("8 bytes")).is_finite(),
            // Exponent all ones: infinity or NaN.
            DataType::F16 => u16::from_le_bytes([c[0], c[1]]) & 0x7c00 == 0x7c00,
            DataType::BF16 => u16::from_le_bytes([c[0], c[1]]) & 0x7f80 == 0x7f80,
            // E4M3 has no infinity; S.1111.111 is NaN.
            DataType::F8E4M3 => c[0] & 0x7f == 0x7f,
            DataType::F8E5M2 => c[0] & 0x7c == 0x7c,
            _ => false,
        }
    };
    Ok(bytes.chunks_exact(es).position(bad))
}

#[cfg(test)]
mod tests {
    use super::{is_refusal, stop_before_run, Outcomes};
    use crate::error::Error;

    /// The record a kernel leaves when ranks disagreed, as the cuda backend reports it.
    fn disagreement(rank: usize) -> Error {
        Error::InvalidArgument(format!(
            "all_reduce_rmsnorm: an earlier direct-access call failed: a call that disagrees \
             between ranks reached rank {rank}: rank 2 sent signature or count 0x1"
        ))
    }

    #[test]
    fn an_earlier_calls_record_is_reported_before_a_peers_refusal_and_refuses_the_call() {
        // A peer's refusal of call 2 has arrived, and this rank's record of call 1 waits: the
        // call reports the record (taken now, not left for call 3) and refuses call 2 too.
        let why = "all_reduce_rmsnorm on rank 2: ... disagrees between ranks ...".to_string();
        let e = stop_before_run(
            Err(disagreement(0)),
            Some((2, why.clone())),
            "all_reduce_rmsnorm",
            2,
            0,
        )
        .unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.contains("reached rank 0")),
            "{e}"
        );
        assert!(is_refusal(&e), "{e}");
        // No record here: the peer's refusal, naming the peer and the call.
        let e = stop_before_run(Ok(()), Some((2, why)), "all_reduce_rmsnorm", 2, 0).unwrap_err();
        assert!(
            matches!(&e, Error::PeerRefused { call: 2, rank: 0, peer: 2, why, .. }
                if why.contains("disagrees between ranks")),
            "{e}"
        );
        assert!(
            !is_refusal(&e),
            "a peer's refusal is not announced again: {e}"
        );
        // Neither: the call runs.
        assert!(stop_before_run(Ok(()), None, "all_reduce", 3, 0).is_ok());
        // A sticky record (a kernel's timeout) ends the call and is no refusal (the
        // communicator is done; the peers learn it by their own timeouts or its abort).
        let t = Error::Timeout {
            collective: "all_reduce",
            rank: 0,
            missing: 1,
            timeout: std::time::Duration::from_secs(1),
        };
        let e = stop_before_run(Err(t), None, "all_reduce", 4, 0).unwrap_err();
        assert!(matches!(e, Error::Timeout { missing: 1, .. }), "{e}");
        assert!(!is_refusal(&e));
    }

    #[test]
    fn a_refusal_ends_waits_only_for_a_call_taken_here() {
        let o = Outcomes::default();
        // Not reached yet: no.
        assert!(!o.taken(1));
        o.set(1, false);
        o.set(2, true);
        o.set(3, false);
        // Refused here too, though later calls were taken (the handler runs late): no.
        assert!(!o.taken(1));
        assert!(!o.taken(3));
        // Taken: yes.
        assert!(o.taken(2));
        assert!(!o.taken(4));
        // So far past call 1 that its slot holds a later call: its outcome is forgotten.
        o.set(1 + Outcomes::CALLS, false);
        assert!(o.taken(1));
        assert!(!o.taken(1 + Outcomes::CALLS));
    }
}
