//! Starting N ranks of a program on this machine, torchrun-style, with the bootstrap store
//! hosted by the launcher.
//!
//! Each child gets its own process group, so that stopping a rank also stops whatever it
//! started (a shell's children, a Python's workers). When one rank fails the others get
//! SIGTERM, then SIGKILL after [`GRACE`]; SIGINT/SIGTERM sent to the launcher are forwarded.
//! A launcher killed outright takes its ranks with it, whatever the command is: a watcher
//! process forked before the ranks (see `Watcher`) kills every rank's process group when the
//! launcher goes, and each rank also has `PR_SET_PDEATHSIG`. The store is
//! bound to loopback and needs the random secret the ranks get in `FERROCOMM_STORE_SECRET`.
//! A rank that timed out waiting for another leaves a report in the store, so the launcher
//! names the rank that stalled. At start-up it removes shared-memory segments left in
//! `/dev/shm` by ranks of earlier jobs that died during set-up.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{mpsc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::bootstrap::{new_secret, StoreKey, TcpStoreServer, TIMED_OUT};
use crate::error::{Error, Result};

/// How long stopped ranks get between SIGTERM and SIGKILL.
pub const GRACE: Duration = Duration::from_secs(3);

/// How often the launcher looks at its children.
const POLL: Duration = Duration::from_millis(20);

/// What to launch.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    /// Number of ranks (processes), at least 1.
    pub nprocs: usize,
    /// The program every rank runs (a path, or a name looked up on `PATH`).
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra variables for every rank, applied after the launcher's own.
    pub env: Vec<(String, String)>,
    /// Prefix every output line with `[rank K] `.
    pub prefix_output: bool,
    /// Stop every rank (exit code 124) when the job runs longer than this.
    pub timeout: Option<Duration>,
}

/// Runs the job; returns the first non-zero exit code of a rank (128 + signal for a rank killed
/// by a signal), or 0 when every rank succeeds.
pub fn launch(spec: &LaunchSpec) -> Result<i32> {
    if spec.nprocs == 0 || spec.nprocs > crate::config::MAX_WORLD_SIZE {
        return Err(Error::InvalidArgument(format!(
            "launch: the number of ranks must be at least 1 and at most {}, got {}",
            crate::config::MAX_WORLD_SIZE,
            spec.nprocs
        )));
    }
    for name in crate::host::remove_stale_segments(std::path::Path::new("/dev/shm")) {
        eprintln!("ferrocomm launch: removed /dev/shm/{name}, left by a job whose rank 0 died");
    }
    let secret = new_secret();
    let store = TcpStoreServer::bind("127.0.0.1", 0, &StoreKey::from_secret(&secret))?;
    let master_port = free_port()?;
    let launcher = std::process::id();
    let _signals = ForwardSignals::install();
    let watcher = Watcher::start(spec.nprocs)?;
    let register = watcher.register_fd();

    let (done_tx, done_rx) = mpsc::channel::<()>();
    let mut readers = 0usize;
    let mut ranks: Vec<Rank> = Vec::with_capacity(spec.nprocs);
    for rank in 0..spec.nprocs {
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", spec.nprocs.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("LOCAL_WORLD_SIZE", spec.nprocs.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", master_port.to_string())
            .env("FERROCOMM_STORE_ADDR", "127.0.0.1")
            .env("FERROCOMM_STORE_PORT", store.port().to_string())
            .env("FERROCOMM_STORE_EXTERNAL", "1")
            .env("FERROCOMM_STORE_SECRET", &secret)
            // Its own group: a signal to -pid reaches everything the rank started.
            .process_group(0);
        // SAFETY: the closure runs in the child between fork and exec and only makes
        // async-signal-safe system calls (getpid, write, prctl, getppid), allocating nothing.
        unsafe {
            cmd.pre_exec(move || {
                // Registered before the rank runs anything: no moment where it could outlive
                // the launcher unknown to the watcher.
                Watcher::register(register)?;
                die_with_parent(launcher)
            });
        }
        for (k, v) in &spec.env {
            cmd.env(k, v);
        }
        if spec.prefix_output {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                stop(&mut ranks);
                return Err(Error::io(
                    format!("launch: cannot start '{}' for rank {rank}", spec.program),
                    e,
                ));
            }
        };
        if spec.prefix_output {
            let prefix = format!("[rank {rank}] ").into_bytes();
            if let Some(out) = child.stdout.take() {
                spawn_prefixer(out, prefix.clone(), false, done_tx.clone());
                readers += 1;
            }
            if let Some(err) = child.stderr.take() {
                spawn_prefixer(err, prefix, true, done_tx.clone());
                readers += 1;
            }
        }
        ranks.push(Rank {
            rank,
            pid: child.id() as i32,
            child,
            status: None,
        });
    }
    drop(done_tx);

    let start = Instant::now();
    let mut first_failure: Option<i32> = None;
    let mut named_stall = false;
    // When the stop began (SIGTERM sent); SIGKILL follows GRACE later.
    let mut stopping: Option<Instant> = None;
    let mut killed = false;
    loop {
        for r in ranks.iter_mut().filter(|r| r.status.is_none()) {
            if let Some(st) = r
                .child
                .try_wait()
                .map_err(|e| Error::io(format!("launch: waiting for rank {}", r.rank), e))?
            {
                r.status = Some(st);
                let code = exit_code(st);
                if code != 0 && first_failure.is_none() {
                    first_failure = Some(code);
                    report(r.rank, st, spec.nprocs > 1);
                }
            }
        }
        if ranks.iter().all(|r| r.status.is_some()) {
            break;
        }
        if first_failure.is_some() && !named_stall {
            named_stall = true;
            name_stalled(&store, &ranks);
        }
        if stopping.is_none() {
            let sig = SIGNALLED.swap(0, Ordering::SeqCst);
            if sig != 0 {
                eprintln!("ferrocomm launch: got signal {sig}, passing it to the ranks");
                first_failure.get_or_insert(128 + sig);
                signal_all(&ranks, sig);
                stopping = Some(Instant::now());
            } else if first_failure.is_some() {
                signal_all(&ranks, libc::SIGTERM);
                stopping = Some(Instant::now());
            } else if spec.timeout.is_some_and(|t| start.elapsed() > t) {
                eprintln!(
                    "ferrocomm launch: the job ran past its timeout of {:?}; stopping it",
                    spec.timeout.unwrap_or_default()
                );
                first_failure = Some(124);
                named_stall = true;
                name_stalled(&store, &ranks);
                signal_all(&ranks, libc::SIGTERM);
                stopping = Some(Instant::now());
            }
        }
        if let Some(t) = stopping {
            if !killed && t.elapsed() >= GRACE {
                signal_all(&ranks, libc::SIGKILL);
                killed = true;
            }
        }
        thread::sleep(POLL);
    }
    if first_failure.is_some() && !killed {
        // Whatever the ranks left behind in their groups goes too.
        signal_all(&ranks, libc::SIGKILL);
    }
    // Let the prefixers drain; one held open by a process a rank left running is abandoned.
    let drain_deadline = Instant::now() + Duration::from_secs(2);
    for _ in 0..readers {
        let left = drain_deadline.saturating_duration_since(Instant::now());
        if done_rx.recv_timeout(left).is_err() {
            break;
        }
    }
    drop(store);
    // Every rank was waited for: the watcher has nothing left to do.
    watcher.finish();
    Ok(first_failure.unwrap_or(0))
}

/// A small process that outlives a launcher killed outright (SIGKILL, the OOM killer) just
/// long enough to kill every rank's process group.
///
/// `PR_SET_PDEATHSIG` reaches only the process the launcher started: a rank that is a wrapper
/// (`ferrocomm launch -- bash train.sh`) dies, and what it started (the Python rank) is
/// reparented and runs on. The watcher is forked before any rank and holds the read end of a
/// pipe whose write end only the launcher holds (close-on-exec, so no rank inherits it past
/// its exec). Each rank writes its pid there between fork and exec, before it runs anything;
/// when the pipe reports end of file the launcher is gone, however it died, and the watcher
/// sends SIGKILL to each rank's process group (the rank's pid: each rank leads its own), which
/// holds everything the rank started unless that moved itself out of the group (`setsid`) on
/// purpose. When the job ends normally the launcher writes 0 and the watcher exits without
/// a signal. It runs in a session of its own, so a terminal's SIGINT or SIGHUP for the
/// launcher's group does not take it away first.
///
/// A cgroup would also hold processes that leave their group, but it needs a writable cgroup
/// subtree (a systemd delegation, root), which containers and CI machines often lack; the
/// watcher needs nothing. The watcher is a fork without exec of a multi-threaded process, so
/// between fork and exit it makes only async-signal-safe system calls and allocates nothing.
struct Watcher {
    pid: libc::pid_t,
    /// The launcher's write end of the pipe.
    tx: libc::c_int,
}

impl Watcher {
    /// Forks the watcher for a job of `nprocs` ranks.
    fn start(nprocs: usize) -> Result<Watcher> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: pipe2 writes two descriptors into the array it is given, which has room.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(Error::io(
                "launch: a pipe for the watcher",
                io::Error::last_os_error(),
            ));
        }
        let (rx, tx) = (fds[0], fds[1]);
        // Where the watcher keeps the pids: allocated here, since the forked child may not
        // allocate (another thread may have held the allocator's lock at the fork).
        let mut pids = vec![0 as libc::pid_t; nprocs];
        // SAFETY: fork has no memory-safety preconditions; the child only runs `watch`, which
        // is async-signal-safe, and never returns.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: in the child, `rx` is the pipe's read end and `pids` a buffer of
            // `nprocs` pids of this process's own (copy-on-write) memory.
            unsafe { watch(rx, pids.as_mut_ptr(), pids.len()) }
        }
        // SAFETY: `rx` is this process's descriptor, unused from here on.
        unsafe { libc::close(rx) };
        if pid < 0 {
            let e = io::Error::last_os_error();
            // SAFETY: as above, for `tx`.
            unsafe { libc::close(tx) };
            return Err(Error::io("launch: starting the watcher process", e));
        }
        Ok(Watcher { pid, tx })
    }

    /// The descriptor a rank registers itself on (between fork and exec).
    fn register_fd(&self) -> libc::c_int {
        self.tx
    }

    /// Run in a rank between fork and exec: tells the watcher this rank's pid.
    fn register(fd: libc::c_int) -> io::Result<()> {
        // SAFETY: getpid has no preconditions.
        let me = unsafe { libc::getpid() }.to_le_bytes();
        // SAFETY: writes 4 bytes from a live local array; a write of at most PIPE_BUF bytes to
        // a pipe is atomic, so messages of several ranks never interleave.
        let n = unsafe { libc::write(fd, me.as_ptr().cast(), me.len()) };
        if n != me.len() as isize {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The job is over, every rank waited for: the watcher exits without a signal, and is
    /// reaped.
    fn finish(mut self) {
        let done = 0 as libc::pid_t;
        // SAFETY: writes 4 bytes from a live local to the launcher's own descriptor.
        unsafe { libc::write(self.tx, done.to_le_bytes().as_ptr().cast(), 4) };
        self.close_and_reap();
    }

    fn close_and_reap(&mut self) {
        if self.tx >= 0 {
            // SAFETY: closes the launcher's own descriptor, then waits for its own child.
            unsafe {
                libc::close(self.tx);
                libc::waitpid(self.pid, std::ptr::null_mut(), 0);
            }
            self.tx = -1;
        }
    }
}

impl Drop for Watcher {
    /// `launch` returning early (a rank that could not start, a failed wait): the pipe closes
    /// without the word that the job is over, as if the launcher had died, and the watcher
    /// kills whatever registered.
    fn drop(&mut self) {
        self.close_and_reap();
    }
}

/// The watcher's life: records the pids ranks send on `rx` (at most `cap`, into `pids`) until
/// the launcher says the job is over (a 0) or is gone (end of file), then kills every rank's
/// process group in the second case and exits.
///
/// # Safety
/// To be called only in a child just forked: it uses async-signal-safe system calls alone,
/// writes only within `pids[..cap]`, and never returns.
unsafe fn watch(rx: libc::c_int, pids: *mut libc::pid_t, cap: usize) -> ! {
    // SAFETY: plain system calls on this process's own descriptors and signal dispositions,
    // and writes within the `cap` pids the caller provided.
    unsafe {
        libc::setsid();
        for sig in [
            libc::SIGINT,
            libc::SIGTERM,
            libc::SIGHUP,
            libc::SIGQUIT,
            libc::SIGPIPE,
        ] {
            libc::signal(sig, libc::SIG_IGN);
        }
        // Keep no descriptor of the launcher but the pipe: not the store's socket, not the
        // write end of the pipe (or no end of file would ever come), not the launcher's
        // output (whoever reads it waits for every writer).
        close_all_but(rx);
        let mut n = 0usize;
        let mut done = false;
        loop {
            let mut msg = [0u8; 4];
            let mut got = 0usize;
            while got < 4 {
                let r = libc::read(rx, msg.as_mut_ptr().add(got).cast(), 4 - got);
                if r > 0 {
                    got += r as usize;
                } else if r < 0 && *libc::__errno_location() == libc::EINTR {
                    continue;
                } else {
                    break;
                }
            }
            if got < 4 {
                break; // end of file: the launcher is gone
            }
            let pid = libc::pid_t::from_le_bytes(msg);
            if pid == 0 {
                done = true;
                break;
            }
            if n < cap {
                *pids.add(n) = pid;
                n += 1;
            }
        }
        if !done {
            for i in 0..n {
                libc::kill(-*pids.add(i), libc::SIGKILL);
            }
        }
        libc::_exit(0)
    }
}

/// Closes every descriptor of this process except `keep` (async-signal-safe).
///
/// # Safety
/// Only for a process that uses none of the descriptors it closes (a freshly forked watcher).
unsafe fn close_all_but(keep: libc::c_int) {
    let keep = keep as libc::c_uint;
    // SAFETY: close_range and close on this process's own descriptors.
    unsafe {
        let below = keep == 0 || libc::syscall(libc::SYS_close_range, 0u32, keep - 1, 0u32) == 0;
        let above = libc::syscall(libc::SYS_close_range, keep + 1, libc::c_uint::MAX, 0u32) == 0;
        if !(below && above) {
            // No close_range (kernels before 5.9): one by one, up to a bound far past any
            // descriptor a launcher holds.
            for fd in 0..65536 {
                if fd != keep {
                    libc::close(fd as libc::c_int);
                }
            }
        }
    }
}

struct Rank {
    rank: usize,
    pid: i32,
    child: Child,
    status: Option<ExitStatus>,
}

fn exit_code(st: ExitStatus) -> i32 {
    match (st.code(), st.signal()) {
        (Some(c), _) => c,
        (None, Some(sig)) => 128 + sig,
        (None, None) => 1,
    }
}

fn report(rank: usize, st: ExitStatus, others: bool) {
    let what = match st.signal() {
        Some(sig) => format!("was killed by signal {sig} (exit code {})", 128 + sig),
        None => format!("exited with code {}", exit_code(st)),
    };
    let tail = if others {
        "; stopping the other ranks"
    } else {
        ""
    };
    eprintln!("ferrocomm launch: rank {rank} {what}{tail}");
}

/// Set in a rank between fork and exec: SIGKILL when the launcher dies, also when it already
/// has (the rank was then reparented before the request took effect).
fn die_with_parent(launcher: u32) -> io::Result<()> {
    use rustix::process::{getppid, set_parent_process_death_signal, Pid, Signal};
    set_parent_process_death_signal(Some(Signal::KILL))?;
    if getppid().map(Pid::as_raw_pid) != Some(launcher as i32) {
        return Err(io::Error::other(
            "the launcher exited before the rank started",
        ));
    }
    Ok(())
}

/// Prints which ranks the timed-out ranks were waiting for (their reports under
/// [`TIMED_OUT`] in the store), once the job is being stopped.
fn name_stalled(store: &TcpStoreServer, ranks: &[Rank]) {
    let rank_of = |pid: i32| {
        // The report names the process in the host backend; a rank's process group has the
        // pid of the process the launcher started.
        // SAFETY: getpgid has no memory-safety preconditions.
        let group = unsafe { libc::getpgid(pid) };
        ranks
            .iter()
            .find(|r| r.pid == pid || r.pid == group)
            .map(|r| r.rank)
    };
    let mut waited: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
    for (key, value) in store.entries_containing(&format!("/{TIMED_OUT}")) {
        let reporter = key.rsplit('/').next().and_then(|p| p.parse::<i32>().ok());
        let missing = std::str::from_utf8(&value)
            .ok()
            .and_then(|v| v.trim().parse::<i32>().ok());
        if let (Some(by), Some(stalled)) = (reporter.and_then(rank_of), missing.and_then(rank_of)) {
            waited.entry(stalled).or_default().push(by);
        }
    }
    for (stalled, mut by) in waited {
        by.sort_unstable();
        by.dedup();
        let by: Vec<String> = by.iter().map(|r| r.to_string()).collect();
        eprintln!(
            "ferrocomm launch: rank {stalled} stalled: rank(s) {} timed out waiting for it",
            by.join(", ")
        );
    }
}

/// Sends `sig` to the process group of every rank (also of ranks that exited: what they started
/// may still run).
fn signal_all(ranks: &[Rank], sig: i32) {
    for r in ranks {
        // SAFETY: kill has no memory-safety preconditions; a negative pid names the process
        // group the rank leads (set up by process_group(0) at spawn).
        unsafe {
            libc::kill(-r.pid, sig);
        }
    }
}

/// Kills ranks already started when a later one could not be.
fn stop(ranks: &mut [Rank]) {
    signal_all(ranks, libc::SIGKILL);
    for r in ranks {
        let _ = r.child.wait();
    }
}

fn free_port() -> Result<u16> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| Error::io("launch: finding a free port for MASTER_PORT", e))
}

/// Copies `src` line by line to our stdout (or stderr), each line behind `prefix`.
fn spawn_prefixer(
    src: impl Read + Send + 'static,
    prefix: Vec<u8>,
    to_stderr: bool,
    done: mpsc::Sender<()>,
) {
    thread::spawn(move || {
        let mut src = BufReader::new(src);
        let mut line = Vec::new();
        let mut buf = Vec::new();
        loop {
            line.clear();
            match src.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            if line.last() != Some(&b'\n') {
                line.push(b'\n');
            }
            buf.clear();
            buf.extend_from_slice(&prefix);
            buf.extend_from_slice(&line);
            // One write of a whole line under the lock, so lines of ranks never interleave.
            let r = if to_stderr {
                io::stderr().lock().write_all(&buf)
            } else {
                let mut out = io::stdout().lock();
                out.write_all(&buf).and_then(|_| out.flush())
            };
            if r.is_err() {
                break;
            }
        }
        let _ = done.send(());
    });
}

/// The last SIGINT/SIGTERM the launcher received, 0 if none since it was last looked at.
static SIGNALLED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // Only an atomic store: the one thing safe to do in a signal handler here.
    SIGNALLED.store(sig, Ordering::SeqCst);
}

/// Launches running in this process, and the handlers they replaced (restored by the last one).
static HANDLERS: Mutex<(usize, Vec<(i32, libc::sigaction)>)> = Mutex::new((0, Vec::new()));

/// Catches SIGINT and SIGTERM while alive, so that the launcher passes them to its ranks
/// instead of dying and leaving them behind.
struct ForwardSignals;

impl ForwardSignals {
    fn install() -> Self {
        let mut h = HANDLERS.lock().unwrap_or_else(|p| p.into_inner());
        if h.0 == 0 {
            SIGNALLED.store(0, Ordering::SeqCst);
            for sig in [libc::SIGINT, libc::SIGTERM] {
                // SAFETY: sigaction is plain data, valid when zeroed; the handler only does an
                // atomic store, which is async-signal-safe; `old` is a valid out pointer.
                unsafe {
                    let mut act: libc::sigaction = std::mem::zeroed();
                    act.sa_sigaction = on_signal as *const () as libc::sighandler_t;
                    act.sa_flags = libc::SA_RESTART;
                    libc::sigemptyset(&mut act.sa_mask);
                    let mut old: libc::sigaction = std::mem::zeroed();
                    if libc::sigaction(sig, &act, &mut old) == 0 {
                        h.1.push((sig, old));
                    }
                }
            }
        }
        h.0 += 1;
        ForwardSignals
    }
}

impl Drop for ForwardSignals {
    fn drop(&mut self) {
        let mut h = HANDLERS.lock().unwrap_or_else(|p| p.into_inner());
        h.0 -= 1;
        if h.0 == 0 {
            for (sig, old) in h.1.drain(..) {
                // SAFETY: `old` was filled in by sigaction when the handler was installed.
                unsafe {
                    libc::sigaction(sig, &old, std::ptr::null_mut());
                }
            }
        }
    }
}
