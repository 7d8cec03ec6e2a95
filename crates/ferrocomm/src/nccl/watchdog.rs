//! The watchdog of one NCCL communicator: a thread that follows the completion of enqueued work
//! and aborts the communicator when some of it stays incomplete past the timeout.
//!
//! NCCL kernels wait for their peers without a deadline; a peer that died or never made the
//! matching call leaves them spinning and the caller's stream never drains. As torch's
//! ProcessGroupNCCL does, we record a completion marker (a CUDA event) after every operation
//! enqueued outside graph capture and hand it to this thread, which polls the markers at a short
//! cadence. When one is still pending after the timeout, or the communicator reports an
//! asynchronous error, the [`Guard`] aborts the communicator (NCCL's kernels then exit and the
//! streams drain) and the watchdog records the reason; the owner refuses every later call with it.
//!
//! The logic is generic over the marker ([`Pending`]), the guarded communicator ([`Guard`]) and
//! the clock ([`Clock`]) so that it is tested on the CPU with fake markers and a clock the test
//! moves, without waiting for real timeouts.
//!
//! Hot-path cost per operation: one marker (recycled from a pool, created only when the pool is
//! empty) and one channel send. The thread sleeps on the channel while nothing is in flight and
//! polls every `tick` while something is.

use std::collections::VecDeque;
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A completion marker of enqueued work (a recorded CUDA event, or a fake in tests).
pub(crate) trait Pending: Send + 'static {
    /// Whether the work before the marker has completed; `Err` when that cannot be told.
    fn is_done(&mut self) -> Result<bool, String>;
}

/// The communicator a watchdog guards.
pub(crate) trait Guard: Send + 'static {
    /// An asynchronous error the communicator reports, if any (NCCL: `ncclCommGetAsyncError`).
    fn async_error(&mut self) -> Option<String>;
    /// Makes hung work exit (NCCL: `ncclCommAbort`) and marks the communicator failed with
    /// `reason`. Called at most once, from the watchdog thread.
    fn abort(&mut self, reason: &str);
}

/// Where the watchdog reads the time: [`Instant::now`] in use, a clock the test moves in tests.
pub(crate) type Clock = Arc<dyn Fn() -> Instant + Send + Sync>;

/// Markers kept for reuse at most; beyond that completed ones are dropped (destroyed).
const POOL_CAP: usize = 1024;
/// How often an idle watchdog still asks the communicator for asynchronous errors.
const IDLE_TICK: Duration = Duration::from_millis(100);

/// One watched operation.
struct Watched<E> {
    marker: E,
    what: &'static str,
    seq: u64,
    since: Instant,
    /// How long the operation may stay incomplete (its call's timeout).
    timeout: Duration,
}

struct Shared<E> {
    /// Completed markers, ready for reuse.
    free: Mutex<Vec<E>>,
    /// Why the communicator failed; set once, before the guard aborts it.
    failure: OnceLock<String>,
    /// The time an operation starts being watched and is compared with its timeout.
    now: Clock,
}

/// The watchdog thread of one communicator and its channel.
pub(crate) struct Watchdog<E: Pending> {
    tx: Option<mpsc::Sender<Watched<E>>>,
    shared: Arc<Shared<E>>,
    thread: Option<JoinHandle<()>>,
}

impl<E: Pending> Watchdog<E> {
    /// Starts the thread. `setup` runs first on it (making the device's context current);
    /// `describe` names the communicator in failure messages ("rank 0 of 2").
    pub fn start<G: Guard>(
        describe: String,
        tick: Duration,
        setup: impl FnOnce() -> Result<(), String> + Send + 'static,
        guard: G,
    ) -> std::io::Result<Watchdog<E>> {
        Self::start_with_clock(describe, tick, Arc::new(Instant::now), setup, guard)
    }

    /// [`Watchdog::start`] with the time read from `now`.
    fn start_with_clock<G: Guard>(
        describe: String,
        tick: Duration,
        now: Clock,
        setup: impl FnOnce() -> Result<(), String> + Send + 'static,
        guard: G,
    ) -> std::io::Result<Watchdog<E>> {
        let (tx, rx) = mpsc::channel::<Watched<E>>();
        let shared = Arc::new(Shared {
            free: Mutex::new(Vec::new()),
            failure: OnceLock::new(),
            now,
        });
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("ferrocomm-nccl-watchdog".into())
            .spawn(move || {
                let mut guard = guard;
                if let Err(e) = setup() {
                    let reason =
                        format!("the watchdog of {describe} could not start ({e}); aborted");
                    let _ = sh.failure.set(reason.clone());
                    guard.abort(&reason);
                    return;
                }
                let mut run = Run {
                    rx,
                    shared: sh,
                    guard,
                    describe,
                    tick,
                    inflight: VecDeque::new(),
                };
                run.main();
            })?;
        Ok(Watchdog {
            tx: Some(tx),
            shared,
            thread: Some(thread),
        })
    }

    /// A completed marker to reuse, if the pool has one.
    pub fn recycled(&self) -> Option<E> {
        self.shared
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
    }

    /// Hands the marker recorded after operation `seq` (`what`) to the thread. After a failure
    /// the marker is dropped: the owner refuses calls by then, nothing more is watched.
    pub fn watch(&self, marker: E, what: &'static str, seq: u64, timeout: Duration) {
        if self.failure().is_some() {
            return;
        }
        if let Some(tx) = &self.tx {
            // A send fails only when the thread has ended (after a failure); the marker is
            // dropped with the error.
            let _ = tx.send(Watched {
                marker,
                what,
                seq,
                since: (self.shared.now)(),
                timeout,
            });
        }
    }

    /// Why the watchdog gave up on the communicator, once it has.
    pub fn failure(&self) -> Option<&str> {
        self.shared.failure.get().map(String::as_str)
    }
}

impl<E: Pending> Drop for Watchdog<E> {
    fn drop(&mut self) {
        // Closing the channel wakes an idle thread at once and ends a busy one within a tick;
        // the owner destroys the communicator only after this join.
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The state of the watchdog thread.
struct Run<E, G> {
    rx: mpsc::Receiver<Watched<E>>,
    shared: Arc<Shared<E>>,
    guard: G,
    describe: String,
    tick: Duration,
    inflight: VecDeque<Watched<E>>,
}

impl<E: Pending, G: Guard> Run<E, G> {
    fn main(&mut self) {
        loop {
            if self.inflight.is_empty() {
                // Nothing to follow: sleep on the channel (no wake-ups while idle beyond the
                // occasional asynchronous-error check).
                match self.rx.recv_timeout(IDLE_TICK) {
                    Ok(w) => self.inflight.push_back(w),
                    Err(RecvTimeoutError::Timeout) => {
                        if let Some(e) = self.guard.async_error() {
                            self.fail(format!(
                                "{} reported an asynchronous error: {e}; communicator aborted",
                                self.describe
                            ));
                            return;
                        }
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
            let mut closed = false;
            loop {
                match self.rx.try_recv() {
                    Ok(w) => self.inflight.push_back(w),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        closed = true;
                        break;
                    }
                }
            }
            if let Err(reason) = self.poll() {
                self.fail(reason);
                return;
            }
            if closed {
                return;
            }
            if !self.inflight.is_empty() {
                std::thread::sleep(self.tick);
            }
        }
    }

    /// Queries every marker in flight, recycles the completed ones, and says why the
    /// communicator must be aborted, if it must.
    fn poll(&mut self) -> Result<(), String> {
        let mut done = Vec::new();
        let mut hung: Option<(&'static str, u64, Duration, Duration)> = None;
        let mut broken: Option<String> = None;
        let mut keep = VecDeque::with_capacity(self.inflight.len());
        while let Some(mut w) = self.inflight.pop_front() {
            match w.marker.is_done() {
                Ok(true) => done.push(w.marker),
                Ok(false) => {
                    // Read after the query: work seen pending was pending for at least this long.
                    let waited = (self.shared.now)().saturating_duration_since(w.since);
                    if waited > w.timeout && hung.is_none() {
                        hung = Some((w.what, w.seq, waited, w.timeout));
                    }
                    keep.push_back(w);
                }
                Err(e) => {
                    if broken.is_none() {
                        broken = Some(format!(
                            "{} (call #{}) on {}: cannot tell whether it completed: {e}; \
                             communicator aborted",
                            w.what, w.seq, self.describe
                        ));
                    }
                    keep.push_back(w);
                }
            }
        }
        self.inflight = keep;
        if !done.is_empty() {
            let mut free = self.shared.free.lock().unwrap_or_else(|e| e.into_inner());
            let room = POOL_CAP.saturating_sub(free.len());
            free.extend(done.into_iter().take(room));
        }
        if let Some(b) = broken {
            return Err(b);
        }
        let async_err = self.guard.async_error();
        if let Some((what, seq, waited, timeout)) = hung {
            let mut reason = format!(
                "{what} (call #{seq}) on {}: Timed out after {:?} without completing \
                 (waited {:.1} s): a peer died, hangs, or never made the matching call; \
                 communicator aborted",
                self.describe,
                timeout,
                waited.as_secs_f64()
            );
            if let Some(e) = async_err {
                reason.push_str(&format!(" (NCCL reported: {e})"));
            }
            return Err(reason);
        }
        if let Some(e) = async_err {
            return Err(format!(
                "{} reported an asynchronous error: {e}; communicator aborted",
                self.describe
            ));
        }
        Ok(())
    }

    /// Records the failure, then aborts (so callers see the reason before the abort returns)
    /// and drops every marker still in flight.
    fn fail(&mut self, reason: String) {
        let _ = self.shared.failure.set(reason.clone());
        self.guard.abort(&reason);
        self.inflight.clear();
    }
}

#[cfg(test)]
mod tests {
    //! The watchdog thread runs for real; the time it compares with the timeouts is a clock the
    //! test moves, and the test waits for what the thread did (queries, checks for asynchronous
    //! errors, aborts) on a condition variable, never for a while: the outcome does not depend
    //! on how fast a loaded machine runs either side.
    use super::*;
    use std::collections::BTreeSet;
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
    use std::sync::Condvar;

    /// What the watchdog thread has done so far.
    #[derive(Default)]
    struct Log {
        /// Ids of the fake markers it has queried at least once.
        queried: BTreeSet<usize>,
        /// Calls of `Guard::async_error`: one at the end of every poll of work in flight and
        /// one per idle tick, so two more of them mean a whole round has run since.
        async_checks: usize,
        aborts: Vec<String>,
    }

    /// [`Log`] and a condition variable to wait for it with.
    #[derive(Default)]
    struct Seen {
        log: Mutex<Log>,
        changed: Condvar,
    }

    /// Waits for the watchdog at most this long: only a broken watchdog comes near it.
    const PATIENCE: Duration = Duration::from_secs(60);

    impl Seen {
        fn note(&self, f: impl FnOnce(&mut Log)) {
            f(&mut self.log.lock().unwrap());
            self.changed.notify_all();
        }

        /// Waits until `cond` holds for the log.
        fn wait_for(&self, what: &str, cond: impl Fn(&Log) -> bool) {
            let (log, timed_out) = self
                .changed
                .wait_timeout_while(self.log.lock().unwrap(), PATIENCE, |l| !cond(l))
                .unwrap();
            assert!(
                !timed_out.timed_out(),
                "waited {PATIENCE:?} for {what}; the watchdog queried {:?}, checked for \
                 asynchronous errors {} times, aborted {:?}",
                log.queried,
                log.async_checks,
                log.aborts
            );
        }

        /// Waits until the watchdog has run a whole round (taken what was sent to it, polled
        /// it, checked for an asynchronous error) that began after this call.
        fn round(&self) {
            let k = self.log.lock().unwrap().async_checks;
            self.wait_for("a round of the watchdog", |l| l.async_checks >= k + 2);
        }

        fn aborts(&self) -> Vec<String> {
            self.log.lock().unwrap().aborts.clone()
        }
    }

    /// A clock that stands still until the test moves it.
    struct FakeClock {
        start: Instant,
        ns: AtomicU64,
    }

    impl FakeClock {
        fn new() -> Arc<FakeClock> {
            Arc::new(FakeClock {
                start: Instant::now(),
                ns: AtomicU64::new(0),
            })
        }

        fn advance(&self, d: Duration) {
            self.ns.fetch_add(d.as_nanos() as u64, Ordering::SeqCst);
        }

        fn clock(self: &Arc<Self>) -> Clock {
            let c = self.clone();
            Arc::new(move || c.start + Duration::from_nanos(c.ns.load(Ordering::SeqCst)))
        }
    }

    /// A marker that completes when its flag is set (never, if nobody sets it).
    struct Fake {
        done: Arc<AtomicBool>,
        id: usize,
        queries: Arc<AtomicUsize>,
        seen: Arc<Seen>,
    }

    impl Pending for Fake {
        fn is_done(&mut self) -> Result<bool, String> {
            self.queries.fetch_add(1, Ordering::Relaxed);
            // The flag is read before the query is noted: a test that sees the query noted
            // after setting the flag knows the watchdog saw it set.
            let done = self.done.load(Ordering::Acquire);
            self.seen.note(|l| {
                l.queried.insert(self.id);
            });
            Ok(done)
        }
    }

    struct Broken;
    impl Pending for Broken {
        fn is_done(&mut self) -> Result<bool, String> {
            Err("CUDA_ERROR_ILLEGAL_ADDRESS".into())
        }
    }

    #[derive(Clone, Default)]
    struct FakeGuard {
        seen: Arc<Seen>,
        async_error: Arc<Mutex<Option<String>>>,
    }

    impl Guard for FakeGuard {
        fn async_error(&mut self) -> Option<String> {
            let e = self.async_error.lock().unwrap().clone();
            self.seen.note(|l| l.async_checks += 1);
            e
        }
        fn abort(&mut self, reason: &str) {
            self.seen.note(|l| l.aborts.push(reason.to_string()));
        }
    }

    fn fake(g: &FakeGuard, id: usize, done: bool) -> (Fake, Arc<AtomicBool>) {
        let flag = Arc::new(AtomicBool::new(done));
        (
            Fake {
                done: flag.clone(),
                id,
                queries: Arc::new(AtomicUsize::new(0)),
                seen: g.seen.clone(),
            },
            flag,
        )
    }

    fn start<E: Pending>(g: &FakeGuard, clock: &Arc<FakeClock>) -> Watchdog<E> {
        Watchdog::start_with_clock(
            "rank 0 of 2".into(),
            Duration::from_millis(1),
            clock.clock(),
            || Ok(()),
            g.clone(),
        )
        .unwrap()
    }

    #[test]
    fn a_never_completing_operation_fails_after_the_timeout_and_aborts_once() {
        let (g, clock) = (FakeGuard::default(), FakeClock::new());
        let w: Watchdog<Fake> = start(&g, &clock);
        let (m, _never) = fake(&g, 1, false);
        w.watch(m, "all_reduce", 7, Duration::from_millis(50));
        g.seen
            .wait_for("the marker's first query", |l| l.queried.contains(&1));
        // Pending for exactly the timeout: not yet hung.
        clock.advance(Duration::from_millis(50));
        g.seen.round();
        assert!(w.failure().is_none(), "{:?}", w.failure());
        assert!(g.seen.aborts().is_empty());
        // A millisecond more, and it is.
        clock.advance(Duration::from_millis(1));
        g.seen.wait_for("the abort", |l| !l.aborts.is_empty());
        let f = w.failure().unwrap().to_string();
        assert!(f.contains("all_reduce (call #7) on rank 0 of 2"), "{f}");
        assert!(
            f.contains(": Timed out after 50ms without completing (waited 0.1 s)"),
            "{f}"
        );
        assert!(f.contains("aborted"), "{f}");
        // The thread has ended once dropped: the guard was told once, with the same reason.
        drop(w);
        assert_eq!(g.seen.aborts(), vec![f]);
    }

    #[test]
    fn an_asynchronous_error_fails_without_waiting_for_the_timeout() {
        let (g, clock) = (FakeGuard::default(), FakeClock::new());
        let w: Watchdog<Fake> = start(&g, &clock);
        let (m, _never) = fake(&g, 2, false);
        w.watch(m, "all_gather", 1, Duration::from_millis(60_000));
        g.seen
            .wait_for("the marker's first query", |l| l.queried.contains(&2));
        g.seen.round();
        assert!(w.failure().is_none());
        *g.async_error.lock().unwrap() =
            Some("remote process exited or there was a network error".into());
        // The clock never moves: only the error can fail the communicator.
        g.seen.wait_for("the abort", |l| !l.aborts.is_empty());
        let f = w.failure().unwrap().to_string();
        assert!(
            f.contains("rank 0 of 2 reported an asynchronous error: remote process exited"),
            "{f}"
        );
        drop(w);
        assert_eq!(g.seen.aborts(), vec![f]);
    }

    #[test]
    fn an_idle_watchdog_reports_an_asynchronous_error() {
        let (g, clock) = (FakeGuard::default(), FakeClock::new());
        *g.async_error.lock().unwrap() = Some("unhandled system error".into());
        let w: Watchdog<Fake> = start(&g, &clock);
        g.seen.wait_for("the abort", |l| !l.aborts.is_empty());
        assert!(w.failure().unwrap().contains("unhandled system error"));
        drop(w);
        assert_eq!(g.seen.aborts().len(), 1);
    }

    #[test]
    fn completed_markers_are_recycled_and_nothing_fails() {
        let (g, clock) = (FakeGuard::default(), FakeClock::new());
        let w: Watchdog<Fake> = start(&g, &clock);
        assert!(w.recycled().is_none());
        let mut flags = Vec::new();
        for i in 0..10 {
            let (m, f) = fake(&g, i, false);
            flags.push(f);
            w.watch(m, "all_reduce", i as u64, Duration::from_millis(50));
        }
        g.seen.wait_for("every marker queried while pending", |l| {
            l.queried.len() == 10
        });
        // Completed late, but within the timeout.
        clock.advance(Duration::from_millis(45));
        for f in &flags {
            f.store(true, Ordering::Release);
        }
        g.seen.round();
        let mut got = Vec::new();
        while let Some(m) = w.recycled() {
            got.push(m.id);
        }
        got.sort_unstable();
        assert_eq!(got, (0..10).collect::<Vec<_>>());
        // Well past the timeout: completed work never counts as hung.
        clock.advance(Duration::from_millis(80));
        g.seen.round();
        assert!(w.failure().is_none(), "{:?}", w.failure());
        assert!(g.seen.aborts().is_empty());
    }

    #[test]
    fn a_recycled_marker_is_watched_again() {
        let (g, clock) = (FakeGuard::default(), FakeClock::new());
        let w: Watchdog<Fake> = start(&g, &clock);
        let (m, _) = fake(&g, 5, true);
        w.watch(m, "send", 1, Duration::from_millis(40));
        g.seen.round();
        let m = w.recycled().expect("the completed marker back in the pool");
        assert_eq!(m.id, 5);
        // Reused for work that hangs: the watchdog follows it like a new one.
        m.done.store(false, Ordering::Release);
        let queries = m.queries.clone();
        let before = queries.load(Ordering::Relaxed);
        w.watch(m, "recv", 2, Duration::from_millis(40));
        g.seen.round();
        assert!(queries.load(Ordering::Relaxed) > before);
        assert!(w.failure().is_none());
        clock.advance(Duration::from_millis(41));
        g.seen.wait_for("the abort", |l| !l.aborts.is_empty());
        assert!(w.failure().unwrap().contains("recv (call #2)"));
    }

    #[test]
    fn a_failed_watchdog_refuses_further_work() {
        let (g, clock) = (FakeGuard::default(), FakeClock::new());
        let w: Watchdog<Fake> = start(&g, &clock);
        let (m, _never) = fake(&g, 1, false);
        w.watch(m, "all_reduce", 1, Duration::from_millis(20));
        g.seen
            .wait_for("the marker's first query", |l| l.queried.contains(&1));
        clock.advance(Duration::from_millis(21));
        g.seen.wait_for("the abort", |l| !l.aborts.is_empty());
        let (m2, _) = fake(&g, 2, true);
        let queries = m2.queries.clone();
        w.watch(m2, "all_reduce", 2, Duration::from_millis(20));
        assert!(w.recycled().is_none());
        // Once the thread has ended (the drop joins it): never queried, no second abort.
        drop(w);
        assert_eq!(queries.load(Ordering::Relaxed), 0);
        assert_eq!(g.seen.aborts().len(), 1);
    }

    #[test]
    fn a_marker_that_cannot_be_queried_fails_the_communicator() {
        let (g, clock) = (FakeGuard::default(), FakeClock::new());
        let w: Watchdog<Broken> = start(&g, &clock);
        w.watch(Broken, "reduce_scatter", 4, Duration::from_millis(10_000));
        g.seen.wait_for("the abort", |l| !l.aborts.is_empty());
        let f = w.failure().unwrap().to_string();
        assert!(f.contains("reduce_scatter (call #4)"), "{f}");
        assert!(f.contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{f}");
        drop(w);
        assert_eq!(g.seen.aborts(), vec![f]);
    }

    #[test]
    fn a_failed_setup_fails_the_communicator() {
        let g = FakeGuard::default();
        let w: Watchdog<Fake> = Watchdog::start(
            "rank 1 of 2".into(),
            Duration::from_millis(1),
            || Err("cuCtxSetCurrent: CUDA_ERROR_INVALID_CONTEXT".into()),
            g.clone(),
        )
        .unwrap();
        g.seen.wait_for("the abort", |l| !l.aborts.is_empty());
        assert!(w.failure().unwrap().contains("CUDA_ERROR_INVALID_CONTEXT"));
        drop(w);
        assert_eq!(g.seen.aborts().len(), 1);
    }

    #[test]
    fn drop_joins_promptly_idle_or_busy() {
        // The bound is the behaviour under test: dropping must not wait for the watched
        // operation's 60 s timeout (nor for anything else). 10 s leaves room for a machine
        // whose cores are busy with other work.
        let prompt = Duration::from_secs(10);
        let (g, clock) = (FakeGuard::default(), FakeClock::new());
        let w: Watchdog<Fake> = start(&g, &clock);
        let t = Instant::now();
        drop(w);
        assert!(t.elapsed() < prompt, "idle drop took {:?}", t.elapsed());

        let w: Watchdog<Fake> = start(&g, &clock);
        let (m, _never) = fake(&g, 1, false);
        w.watch(m, "all_reduce", 1, Duration::from_millis(60_000));
        g.seen
            .wait_for("the marker's first query", |l| l.queried.contains(&1));
        let t = Instant::now();
        drop(w);
        assert!(t.elapsed() < prompt, "busy drop took {:?}", t.elapsed());
        // Dropping is not a failure: nothing was aborted.
        assert!(g.seen.aborts().is_empty());
    }
}
