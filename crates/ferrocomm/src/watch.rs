//! The watcher of one communicator: a thread that learns within milliseconds that a peer
//! process on this host died or gave up on the communicator, and reports it once.
//!
//! The ranks share a small segment in `/dev/shm` (made like the host backend's: mode 600,
//! `O_EXCL`/`O_NOFOLLOW`, its name gone once every rank mapped it) with one line per rank: its
//! pid, its PID namespace, a token of its process and its state (live, closed, aborted). How a
//! peer's death is seen depends on where it runs:
//!
//! - a peer in this process's PID namespace (detected by comparing `/proc/self/ns/pid`): a
//!   pidfd (`pidfd_open`), which `poll` reports readable once the process has exited; opened
//!   before the set-up's last barrier, so it names the peer itself and never a later process
//!   that reused its pid. A killed process holding a GPU context can take seconds to get there
//!   (the driver tears the context down first, slower while another context keeps the GPU
//!   busy), so every tick the watcher also reads the peer's `/proc/PID/stat`: a process all of
//!   whose threads are exiting (`PF_EXITING`) is dead already;
//! - a peer in another PID namespace (containers sharing `/dev/shm`), or where `pidfd_open` is
//!   refused: a lock the peer holds on its byte of the segment (`fcntl` record locks belong to
//!   the process, are not inherited by `fork`, and the kernel drops them when the process
//!   dies, whatever its namespace). Unlike a heartbeat, a peer that is alive but not scheduled
//!   (a loaded host, a stopped process) is never taken for dead; the call's timeout covers it.
//!
//! A peer that stops with its state `closed` (its communicator dropped or finalized) has left,
//! which is no failure; any other death, or a peer's `abort()`, is one: the watcher records it
//! in [`PeerState`] (the backends' waits read it) and calls the communicator's handler once, on
//! its own thread. Ranks that are threads of one process (the same token) are not watched.
//! Communicators whose ranks span hosts have no watcher (NCCL's own error handling and the
//! watchdog cover them).

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::backend::{CommContext, PeerState};
use crate::bootstrap::{all_gather_bytes, store_barrier};
use crate::error::{Error, Result};
use crate::host::shm::{check_owner, is_segment_name, open_segment, UnlinkGuard};

/// How often the watcher looks at what `poll` cannot tell it (state words, other-namespace
/// peers' locks): well under the second a failure must take to surface.
const TICK: Duration = Duration::from_millis(20);
/// Bytes of one rank's line (two cache lines, as in the host segment).
const LINE: usize = 128;
const MAGIC: u64 = 0x6665_7272_6f77_6174; // "ferrowat"
/// Where the lock bytes start (past the lines; a record lock may lie beyond the end of file).
const LOCK_BASE: i64 = 1 << 20;
/// Bytes of a rank's text (why it refused a call), after the lines.
const TEXT: usize = 512;

/// A rank's state word.
const LIVE: u64 = 1;
const CLOSED: u64 = 2;
const ABORTED: u64 = 3;

pub use crate::backend::Failure;

/// The handler a watcher calls once, on its thread, when a peer fails.
pub(crate) type OnFailure = Box<dyn Fn(usize, Failure) + Send + Sync>;
/// The handler a watcher calls when a peer refused a collective call (peer, call number).
pub(crate) type OnRefusal = Box<dyn Fn(usize, u64) + Send + Sync>;

/// A token of this process: ranks with the same token are threads of one process.
fn process_token() -> u64 {
    static TOKEN: OnceLock<u64> = OnceLock::new();
    *TOKEN.get_or_init(|| rand::random::<u64>() | 1)
}

/// This process's PID namespace as (device, inode) of `/proc/self/ns/pid`; (0, 0) when it
/// cannot be read (then no peer counts as sharing it).
fn pid_namespace() -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid")
        .map(|m| (m.dev(), m.ino()))
        .unwrap_or((0, 0))
}

/// The host this process runs on: its name and this boot of it (two machines of one name, or
/// a container's name reused, differ in the boot id).
fn host_identity() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    format!("{}/{}", crate::bootstrap::hostname(), boot.trim())
}

/// The mapped lines of the ranks.
struct Lines {
    map: memmap2::MmapRaw,
    /// Kept open: this rank's lock lives as long as the descriptor (and the process).
    file: std::fs::File,
    world: usize,
}

// SAFETY: the mapping is shared memory accessed only through atomics.
unsafe impl Send for Lines {}
// SAFETY: as above.
unsafe impl Sync for Lines {}

impl Lines {
    fn bytes(world: usize) -> usize {
        (LINE + TEXT) * world + LINE
    }

    /// Word `i` (0..16) of rank `r`'s line; `r == world` is the header.
    fn word(&self, r: usize, i: usize) -> &AtomicU64 {
        assert!(
            r <= self.world && i < LINE / 8,
            "watch segment word out of range"
        );
        let off = if r == self.world { 0 } else { LINE * (r + 1) } + 8 * i;
        // SAFETY: in bounds (checked above against the mapping's length, LINE * (world + 1));
        // 8-aligned (the mapping is page-aligned); shared words are only accessed atomically.
        unsafe { &*(self.map.as_mut_ptr().add(off) as *const AtomicU64) }
    }
    fn pid(&self, r: usize) -> &AtomicU64 {
        self.word(r, 0)
    }
    fn ns(&self, r: usize) -> (&AtomicU64, &AtomicU64) {
        (self.word(r, 1), self.word(r, 2))
    }
    fn token(&self, r: usize) -> &AtomicU64 {
        self.word(r, 3)
    }
    fn state(&self, r: usize) -> &AtomicU64 {
        self.word(r, 4)
    }
    /// The number of the latest collective call rank `r` refused (0: none).
    fn refused(&self, r: usize) -> &AtomicU64 {
        self.word(r, 5)
    }

    /// Rank `r`'s text area: words (accessed atomically) after every line.
    fn text_word(&self, r: usize, i: usize) -> &AtomicU64 {
        assert!(
            r < self.world && i < TEXT / 8,
            "watch segment text out of range"
        );
        let off = LINE * (self.world + 1) + TEXT * r + 8 * i;
        // SAFETY: in bounds (the mapping is (LINE + TEXT) * world + LINE bytes), 8-aligned,
        // only accessed atomically.
        unsafe { &*(self.map.as_mut_ptr().add(off) as *const AtomicU64) }
    }

    fn write_text(&self, r: usize, text: &str) {
        let b = text.as_bytes();
        let n = b.len().min(TEXT - 8);
        self.text_word(r, 0).store(n as u64, Ordering::Relaxed);
        for (i, c) in b[..n].chunks(8).enumerate() {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.text_word(r, i + 1)
                .store(u64::from_le_bytes(w), Ordering::Relaxed);
        }
    }

    fn read_text(&self, r: usize) -> String {
        let n = (self.text_word(r, 0).load(Ordering::Relaxed) as usize).min(TEXT - 8);
        let mut b = Vec::with_capacity(n + 8);
        for i in 0..n.div_ceil(8) {
            b.extend_from_slice(
                &self
                    .text_word(r, i + 1)
                    .load(Ordering::Relaxed)
                    .to_le_bytes(),
            );
        }
        b.truncate(n);
        String::from_utf8_lossy(&b).into_owned()
    }

    /// Sets (`lock`) or tests (`!lock`, then: whether another process holds it) rank `r`'s
    /// lock byte with a process-associated record lock.
    fn lock_byte(&self, r: usize, lock: bool) -> std::io::Result<bool> {
        // SAFETY: a zeroed `flock` is a valid value of the plain C struct.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = libc::F_WRLCK as _;
        fl.l_whence = libc::SEEK_SET as _;
        fl.l_start = LOCK_BASE + r as i64;
        fl.l_len = 1;
        let cmd = if lock { libc::F_SETLK } else { libc::F_GETLK };
        // SAFETY: a valid descriptor we own and a valid `flock` it reads and (F_GETLK) writes.
        let rc = unsafe { libc::fcntl(self.file.as_raw_fd(), cmd, &mut fl) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(lock || i32::from(fl.l_type) != libc::F_UNLCK)
    }
}

/// How this rank watches one peer.
enum Probe {
    /// A thread of this process: nothing to watch.
    Same,
    /// A pidfd of the peer's process, and its pid.
    Pidfd(OwnedFd, u32),
    /// The peer's lock byte.
    Lock,
}

struct Shared {
    lines: Lines,
    rank: usize,
    peers: Arc<PeerState>,
    stop: std::sync::atomic::AtomicBool,
    handler: OnceLock<OnFailure>,
    refusal_handler: OnceLock<OnRefusal>,
}

/// A running watcher; dropping it marks this rank closed and stops the thread.
pub(crate) struct Watch {
    shared: Arc<Shared>,
    /// Written on drop to wake the thread from `poll`.
    wake: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

impl Watch {
    /// Sets up the watcher of the communicator of `ctx` (every rank calls it at creation):
    /// `None` when the ranks span hosts or the communicator has one rank. Its failures go to
    /// `ctx.peers`; [`Watch::on_failure`] adds the handler.
    pub(crate) fn start(ctx: &CommContext) -> Result<Option<Watch>> {
        let (rank, world, t) = (ctx.rank, ctx.size, ctx.timeout());
        if world < 2 {
            return Ok(None);
        }
        let host = host_identity();
        let hosts = all_gather_bytes(&*ctx.store, "watch/hosts", rank, world, host.as_bytes(), t)?;
        if hosts.iter().any(|h| h != host.as_bytes()) {
            return Ok(None);
        }
        let lines = establish(ctx)?;
        let me = process_token();
        let (dev, ino) = pid_namespace();
        lines
            .pid(rank)
            .store(u64::from(std::process::id()), Ordering::Relaxed);
        lines.ns(rank).0.store(dev, Ordering::Relaxed);
        lines.ns(rank).1.store(ino, Ordering::Relaxed);
        lines.token(rank).store(me, Ordering::Relaxed);
        lines
            .lock_byte(rank, true)
            .map_err(|e| Error::io(format!("watcher of rank {rank}: taking its lock"), e))?;
        // release: the line is complete before a peer reads it after the barrier.
        lines.state(rank).store(LIVE, Ordering::Release);
        store_barrier(&*ctx.store, "watch/claimed", world, t)?;
        let mut probes = Vec::with_capacity(world);
        for p in 0..world {
            let live = lines.state(p).load(Ordering::Acquire) == LIVE;
            if p == rank || lines.token(p).load(Ordering::Relaxed) == me {
                probes.push(Probe::Same);
                continue;
            }
            if !live {
                return Err(Error::InvalidArgument(format!(
                    "watcher of rank {rank}: rank {p} did not claim its line of the watch segment"
                )));
            }
            let shared_ns = dev != 0
                && (
                    lines.ns(p).0.load(Ordering::Relaxed),
                    lines.ns(p).1.load(Ordering::Relaxed),
                ) == (dev, ino);
            let pid = lines.pid(p).load(Ordering::Relaxed);
            let fd = if shared_ns {
                i32::try_from(pid)
                    .ok()
                    .and_then(rustix::process::Pid::from_raw)
                    .and_then(|p| {
                        rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok()
                    })
            } else {
                None
            };
            probes.push(match (fd, u32::try_from(pid)) {
                (Some(fd), Ok(pid)) => Probe::Pidfd(fd, pid),
                _ => Probe::Lock,
            });
        }
        // Every pidfd names the peer itself: a peer that died before this barrier never joins it.
        store_barrier(&*ctx.store, "watch/armed", world, t)?;
        let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| Error::io("watcher: creating its wake pipe", e.into()))?;
        let shared = Arc::new(Shared {
            lines,
            rank,
            peers: ctx.peers.clone(),
            stop: false.into(),
            handler: OnceLock::new(),
            refusal_handler: OnceLock::new(),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("ferrocomm-watch-{rank}"))
            .spawn(move || run(&s, &probes, &read))
            .map_err(|e| Error::io("starting the watcher thread", e))?;
        Ok(Some(Watch {
            shared,
            wake: write,
            thread: Some(thread),
        }))
    }

    /// Sets the handler called once when a peer fails (after creation, when the communicator
    /// exists). A failure seen before is handed over now.
    pub(crate) fn on_failure(&self, f: OnFailure) {
        if self.shared.handler.set(f).is_ok() {
            if let Some((p, why)) = self.shared.peers.failure() {
                if let Some(h) = self.shared.handler.get() {
                    h(p, why);
                }
            }
        }
    }

    /// Tells the peers that this rank refused collective call `n` (`why`): their waits in that
    /// call end, and they fail it (a later announcement replaces an earlier one).
    pub(crate) fn announce_refusal(&self, n: u64, why: &str) {
        let s = &self.shared;
        s.lines.write_text(s.rank, why);
        // release: the text before the number that announces it.
        s.lines.refused(s.rank).store(n, Ordering::Release);
    }

    /// Sets the handler of peers' refusals (called on the watcher's thread, after
    /// [`PeerState`] records the refusal).
    pub(crate) fn on_refusal(&self, f: OnRefusal) {
        let _ = self.shared.refusal_handler.set(f);
    }

    /// Tells the peers that this rank has left (finalized or about to exit): its death later is
    /// no failure for them.
    pub(crate) fn announce_leave(&self) {
        let s = &self.shared;
        let _ = s.lines.state(s.rank).compare_exchange(
            LIVE,
            CLOSED,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }

    /// Tells the peers that this rank gave up on the communicator: their watchers fail it.
    pub(crate) fn announce_abort(&self) {
        let s = &self.shared;
        s.lines.state(s.rank).store(ABORTED, Ordering::Release);
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        // A rank that leaves is no failure (unless it aborted before).
        self.announce_leave();
        let s = &self.shared;
        s.stop.store(true, Ordering::Release);
        let _ = rustix::io::write(&self.wake, &[1]);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Creates (rank 0) or opens the segment, as the host backend does its own.
fn establish(ctx: &CommContext) -> Result<Lines> {
    let (rank, world, t) = (ctx.rank, ctx.size, ctx.timeout());
    let bytes = Lines::bytes(world);
    let what = |w: &str| format!("watcher of rank {rank}: {w}");
    let (fd, unlink) = if rank == 0 {
        let name = format!(
            "/ferrocomm-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        );
        let fd = open_segment(&name, true)
            .map_err(|e| Error::io(what(&format!("creating {name}")), e.into()))?;
        let unlink = UnlinkGuard(Some(name.clone()));
        rustix::fs::ftruncate(&fd, bytes as u64)
            .map_err(|e| Error::io(what(&format!("sizing {name}")), e.into()))?;
        (fd, Some((unlink, name)))
    } else {
        let name = ctx.store.get("watch/shm_name", t)?;
        let name = String::from_utf8_lossy(&name).into_owned();
        if !is_segment_name(&name) {
            return Err(Error::InvalidArgument(what(&format!(
                "the store names the watch segment {name:?}, which is not a name rank 0 makes"
            ))));
        }
        let fd = open_segment(&name, false)
            .map_err(|e| Error::io(what(&format!("opening {name}")), e.into()))?;
        (fd, None)
    };
    let file = std::fs::File::from(fd);
    let meta = file
        .metadata()
        .map_err(|e| Error::io(what("fstat of the watch segment"), e))?;
    {
        use std::os::unix::fs::MetadataExt;
        check_owner(meta.uid(), meta.mode(), &|w: &str| what(w))?;
    }
    if meta.len() != bytes as u64 {
        return Err(Error::InvalidArgument(what(&format!(
            "the watch segment has {} bytes, {bytes} expected (ranks disagree on the world size)",
            meta.len()
        ))));
    }
    let map = memmap2::MmapOptions::new()
        .len(bytes)
        .map_raw(&file)
        .map_err(|e| Error::io(what("mmap of the watch segment"), e))?;
    let lines = Lines { map, file, world };
    if let Some((_, name)) = &unlink {
        lines.word(world, 1).store(world as u64, Ordering::Relaxed);
        // release: the header is complete before the magic says so (and the name is out).
        lines.word(world, 0).store(MAGIC, Ordering::Release);
        ctx.store.set("watch/shm_name", name.as_bytes())?;
    } else if lines.word(world, 0).load(Ordering::Acquire) != MAGIC
        || lines.word(world, 1).load(Ordering::Relaxed) != world as u64
    {
        return Err(Error::InvalidArgument(what(
            "the watch segment was made for another world size",
        )));
    }
    store_barrier(&*ctx.store, "watch/mapped", world, t)?;
    drop(unlink);
    Ok(lines)
}

/// The watcher thread: waits in `poll` for a pidfd (a peer's exit) or the wake pipe, and looks
/// at the state words and locks every [`TICK`].
fn run(s: &Shared, probes: &[Probe], wake: &OwnedFd) {
    use rustix::event::{poll, PollFd, PollFlags};
    let timeout = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: TICK.as_nanos() as _,
    };
    let watched: Vec<usize> = (0..probes.len())
        .filter(|&p| !matches!(probes[p], Probe::Same))
        .collect();
    let mut left = watched.clone();
    loop {
        let mut fds: Vec<PollFd<'_>> = vec![PollFd::new(wake, PollFlags::IN)];
        let pidfd_peers: Vec<usize> = left
            .iter()
            .copied()
            .filter(|&p| matches!(probes[p], Probe::Pidfd(..)))
            .collect();
        for &p in &pidfd_peers {
            if let Probe::Pidfd(fd, _) = &probes[p] {
                fds.push(PollFd::new(fd, PollFlags::IN));
            }
        }
        // EINTR and the like: the next round looks again.
        let _ = poll(&mut fds, Some(&timeout));
        if s.stop.load(Ordering::Acquire) {
            return;
        }
        // Exited, or exiting: the pidfd was not readable when `poll` returned, so the pid
        // still named the peer when its stat was read after (a reused pid needs the peer
        // reaped, which needs it exited).
        let exited: Vec<usize> = pidfd_peers
            .iter()
            .zip(&fds[1..])
            .filter(|(&p, f)| {
                !f.revents().is_empty() || matches!(probes[p], Probe::Pidfd(_, pid) if exiting(pid))
            })
            .map(|(&p, _)| p)
            .collect();
        // Threads of this process refuse calls too: every peer's word is read.
        for p in (0..probes.len()).filter(|&p| p != s.rank) {
            let n = s.lines.refused(p).load(Ordering::Acquire);
            if n > s.peers.refused(p) {
                s.peers.set_refused(p, n, s.lines.read_text(p));
                if let Some(h) = s.refusal_handler.get() {
                    h(p, n);
                }
            }
        }
        let mut still = Vec::with_capacity(left.len());
        for &p in &left {
            let state = s.lines.state(p).load(Ordering::Acquire);
            let dead = exited.contains(&p)
                || (matches!(probes[p], Probe::Lock)
                    && !s.lines.lock_byte(p, false).unwrap_or(true));
            if state == ABORTED {
                report(s, p, Failure::Aborted);
            } else if dead && state == CLOSED {
                s.peers.set_gone(p);
            } else if dead {
                report(s, p, Failure::Died);
            } else {
                still.push(p);
            }
        }
        left = still;
        if left.is_empty() {
            // Every peer has left or failed: nothing more to learn.
            return;
        }
    }
}

/// The kernel's flag of a task that has begun to exit (`PF_EXITING` in `/proc/PID/stat`).
const PF_EXITING: u64 = 0x4;

/// The state letter and flags of a task from its `/proc/.../stat` text (the command name, in
/// parentheses, may hold anything: the fields start after its last `)`).
fn stat_state_flags(stat: &str) -> Option<(char, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_ascii_whitespace();
    let state = f.next()?.chars().next()?;
    // state ppid pgrp session tty_nr tpgid flags
    let flags = f.nth(5)?.parse().ok()?;
    Some((state, flags))
}

/// Whether process `pid` is exiting: every thread of it has begun to exit (a leader that
/// ended with `pthread_exit` while other threads run is exiting alone, and the process lives
/// on). False when it cannot tell (then its pidfd tells, once it has exited).
fn exiting(pid: u32) -> bool {
    let leader = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| stat_state_flags(&s));
    if !matches!(leader, Some((_, f)) if f & PF_EXITING != 0) {
        return false;
    }
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|t| {
        // A thread gone meanwhile has exited.
        std::fs::read_to_string(t.path().join("stat"))
            .ok()
            .and_then(|s| stat_state_flags(&s))
            .is_none_or(|(_, f)| f & PF_EXITING != 0)
    })
}

/// Records peer `p`'s failure; the first one of the communicator goes to the handler.
fn report(s: &Shared, p: usize, why: Failure) {
    s.peers.set_gone(p);
    if s.peers.set_failed(p, why) {
        if let Some(h) = s.handler.get() {
            h(p, why);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_gives_state_and_flags_whatever_the_command_name() {
        let line = "4242 (a) b (c)) R 1 4242 4242 0 -1 4194564 120 0 0 0 3 1 0 0 20 0 7";
        assert_eq!(stat_state_flags(line), Some(('R', 4_194_564)));
        assert_eq!(stat_state_flags("4242 (x) Z"), None);
        assert_eq!(stat_state_flags("garbage"), None);
    }

    #[test]
    fn a_live_process_is_not_exiting_and_an_exited_one_is() {
        assert!(!exiting(std::process::id()));
        // A child that exited and is not reaped yet: a zombie whose one task is exiting.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let fd = rustix::process::pidfd_open(
            rustix::process::Pid::from_raw(pid as i32).unwrap(),
            rustix::process::PidfdFlags::empty(),
        )
        .unwrap();
        let mut fds = [rustix::event::PollFd::new(
            &fd,
            rustix::event::PollFlags::IN,
        )];
        rustix::event::poll(&mut fds, None).unwrap();
        assert!(exiting(pid), "pid {pid}");
        child.wait().unwrap();
    }

    #[test]
    fn the_namespace_and_token_are_stable() {
        assert_eq!(process_token(), process_token());
        let (dev, ino) = pid_namespace();
        assert!(dev != 0 || ino != 0, "/proc/self/ns/pid unreadable");
        assert_eq!(pid_namespace(), (dev, ino));
    }
}
