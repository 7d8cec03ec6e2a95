//! The disk cache of compiled kernels: one file per unit, target and NVRTC version, written
//! whole (a temporary file renamed into place) and compiled by one process at a time.
//!
//! Processes that need the same missing entry at once (the ranks of a job starting together,
//! two builds) take a lock file beside it: one compiles, the others wait, then read what it
//! wrote. The lock is `flock`, which the kernel drops when its holder dies, so a crashed
//! compiler blocks no one; a holder that never finishes is waited for until a deadline, after
//! which the waiter compiles itself.
//!
//! Only files owned by this user and writable by no one else are read back, opened without
//! following symbolic links: a directory shared with another user cannot hand us its code.
//!
//! The crate's build script includes this file too, so it depends on std and rustix alone.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{flock, FlockOperation, OFlags};

/// Where code came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Read from the cache (written by an earlier compile, perhaps while we waited for it).
    Cached,
    /// Compiled by this call.
    Compiled,
}

/// What the cache is about to do that takes long: the caller tells its user.
#[derive(Debug)]
pub enum Event<'a> {
    /// This process compiles the entry now.
    Compiling,
    /// Another process holds the entry's lock (it compiles it): this one waits.
    Waiting {
        /// The lock file.
        lock: &'a Path,
    },
    /// The holder did not finish within the wait: this process compiles the entry itself.
    GaveUp {
        /// The lock file.
        lock: &'a Path,
        /// How long this process waited.
        waited: Duration,
    },
}

/// Whether `bytes` can be a cache entry of this kind: a cubin is an ELF file, PTX text ends
/// with the NUL that `cuModuleLoadData` needs.
pub fn looks_valid(bytes: &[u8], ptx: bool) -> bool {
    if ptx {
        bytes.len() > 1 && bytes.last() == Some(&0)
    } else {
        bytes.len() > 4 && bytes.starts_with(b"\x7fELF")
    }
}

/// The entry at `path` if it exists, is ours, is writable by no one else and looks valid.
pub fn read_entry(path: &Path, ptx: bool) -> Option<Vec<u8>> {
    let mut f = OpenOptions::new()
        .read(true)
        .custom_flags(OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .ok()?;
    let meta = f.metadata().ok()?;
    if !meta.is_file()
        || meta.uid() != rustix::process::geteuid().as_raw()
        || meta.mode() & 0o022 != 0
    {
        return None;
    }
    let mut bytes = Vec::with_capacity(meta.len().min(1 << 30) as usize);
    f.read_to_end(&mut bytes).ok()?;
    looks_valid(&bytes, ptx).then_some(bytes)
}

/// Writes `bytes` as the entry at `path` (a file of our own, renamed into place); a failure
/// only costs a compile next time, so it is ignored.
pub fn write_entry(path: &Path, bytes: &[u8]) {
    let Some(dir) = path.parent() else { return };
    if std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .is_err()
    {
        return;
    }
    let tmp = temp_name(path);
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()));
    if written.is_err() || std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// A temporary name beside `path`, unique to this process and call.
fn temp_name(path: &Path) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(
        ".tmp{}.{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    path.with_file_name(name)
}

/// The entry `file` of `dir`, compiled by `compile` when missing. While another process holds
/// the entry's lock this one waits, at most `wait`, then reads what that one wrote (or compiles
/// itself, when the holder died without writing it or the wait ran out). `say` hears of the
/// compile and of the wait before they start.
pub fn cached_or_compile<E>(
    dir: &Path,
    file: &str,
    ptx: bool,
    wait: Duration,
    say: &mut dyn FnMut(Event<'_>),
    compile: impl FnOnce() -> Result<Vec<u8>, E>,
) -> Result<(Vec<u8>, Origin), E> {
    let path = dir.join(file);
    if let Some(b) = read_entry(&path, ptx) {
        return Ok((b, Origin::Cached));
    }
    let lock_path = dir.join(format!("{file}.lock"));
    let lock = lock_file(dir, &lock_path);
    let mut held = false;
    if let Some(lock) = &lock {
        held = try_lock(lock);
        if !held {
            say(Event::Waiting { lock: &lock_path });
            let t0 = Instant::now();
            held = lock_within(lock, t0 + wait);
            if !held {
                say(Event::GaveUp {
                    lock: &lock_path,
                    waited: t0.elapsed(),
                });
            }
        }
        // Whoever held the lock may have written the entry meanwhile.
        if let Some(b) = read_entry(&path, ptx) {
            return Ok((b, Origin::Cached));
        }
    }
    say(Event::Compiling);
    let bytes = compile();
    if let Ok(b) = &bytes {
        write_entry(&path, b);
    }
    if held {
        // Removed while held: whoever takes this lock after us reads the entry first, and a
        // process arriving later finds the entry without locking.
        let _ = std::fs::remove_file(&lock_path);
    }
    Ok((bytes?, Origin::Compiled))
}

/// Opens (creating) the lock file; `None` where the directory cannot hold one (read-only):
/// then every process compiles for itself.
fn lock_file(dir: &Path, path: &Path) -> Option<File> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .ok()?;
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .ok()
}

fn try_lock(f: &File) -> bool {
    flock(f, FlockOperation::NonBlockingLockExclusive).is_ok()
}

/// Takes the lock before `deadline`, looking every few milliseconds (flock has no timed wait).
fn lock_within(f: &File, deadline: Instant) -> bool {
    let mut pause = Duration::from_millis(5);
    loop {
        if try_lock(f) {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// Runs `f` on every item, on up to `threads` threads, each taking the next item as it
/// finishes one; results in the items' order.
pub fn parallel_map<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<Option<R>>> = Mutex::new((0..items.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, items.len().max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                let r = f(item);
                out.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(r);
            });
        }
    });
    out.into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .map(|r| r.expect("every item ran"))
        .collect()
}
