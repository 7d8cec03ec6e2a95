//! The shared-memory segment of one communicator and its layout.
//!
//! Rank 0 creates a POSIX shared-memory object under a random name, publishes the name through
//! the communicator's store, every rank maps it, and once all have (a store barrier) rank 0
//! unlinks the name: the memory lives exactly as long as some rank maps it, and nothing is left
//! in /dev/shm if a rank crashes later.
//!
//! Layout (every part starts on its own cache-line pair):
//!
//! ```text
//! header    magic, world, slot bytes, p2p bytes, total
//! ctl[n]    per rank: epoch (barrier arrivals), pid, failed flag
//! sig[n]    per rank: signature of the current call (seq, collective, dtype, count, op, root)
//! counts[n] per rank: all-to-all-v send and receive counts (2n words)
//! pairs[n*n] per ordered pair (src, dst): sent/acked message chunks, then p2p_bytes of data
//! slots[n]  per rank: slot_bytes of staging
//! reduced   slot_bytes: reduced stripes of the tree all-reduce
//! ```

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::bootstrap::{store_barrier, Store};
use crate::error::{Error, Result};

/// Two cache lines: x86's adjacent-line prefetcher pairs lines, so flags written by different
/// ranks sit 128 bytes apart to avoid false sharing.
pub(crate) const LINE: usize = 128;
const MAGIC: u64 = 0x6665_7272_6f73_686d; // "ferroshm"

/// Words of a signature record.
pub(crate) const SIG_WORDS: usize = 8;

/// Offsets of every part of the segment, the same on every rank (all derive it from the same
/// world size and configuration, which rank 0 records in the header and the others check).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    pub world: usize,
    pub slot_bytes: usize,
    pub p2p_bytes: usize,
    ctl: usize,
    sig: usize,
    counts: usize,
    counts_stride: usize,
    pairs: usize,
    pair_stride: usize,
    slots: usize,
    reduced: usize,
    pub total: usize,
}

impl Layout {
    /// The layout for `world` ranks with `slot_bytes` of staging each; an error naming
    /// `FERROCOMM_HOST_SLOT_BYTES` when the segment's size would not fit in a `usize` (every
    /// offset below is then in range too: each is at most the total).
    pub fn new(world: usize, slot_bytes: usize) -> Result<Layout> {
        let too_big = || {
            Error::InvalidArgument(format!(
                "host backend: a shared segment for {world} ranks with \
                 FERROCOMM_HOST_SLOT_BYTES={slot_bytes} does not fit in memory's address range"
            ))
        };
        let add = |a: usize, b: usize| a.checked_add(b).ok_or_else(too_big);
        let mul = |a: usize, b: usize| a.checked_mul(b).ok_or_else(too_big);
        let up = |x: usize, to: usize| mul(x.div_ceil(to), to);
        // Staging is cut at cache-line multiples so that every chunk, stripe and part starts
        // aligned for any element type.
        let slot_bytes = slot_bytes / LINE * LINE;
        let p2p_bytes = (slot_bytes / 4).clamp(4096, 256 << 10) / LINE * LINE;
        let ctl = LINE;
        let sig = add(ctl, mul(world, LINE)?)?;
        let counts = add(sig, mul(world, LINE)?)?;
        let counts_stride = up(mul(mul(2, world)?, 8)?, LINE)?;
        let pairs = add(counts, mul(world, counts_stride)?)?;
        let pair_stride = LINE + p2p_bytes;
        let slots = up(add(pairs, mul(mul(world, world)?, pair_stride)?)?, 4096)?;
        let reduced = add(slots, mul(world, slot_bytes)?)?;
        let total = add(reduced, slot_bytes)?;
        // mmap and ftruncate take signed sizes.
        if i64::try_from(total).is_err() || isize::try_from(total).is_err() {
            return Err(too_big());
        }
        Ok(Layout {
            world,
            slot_bytes,
            p2p_bytes,
            ctl,
            sig,
            counts,
            counts_stride,
            pairs,
            pair_stride,
            slots,
            reduced,
            total,
        })
    }
}

/// The mapped segment. All access to shared state goes through atomics (flags) or through raw
/// staging pointers whose use the barrier protocol orders.
pub(crate) struct Segment {
    map: memmap2::MmapRaw,
    pub layout: Layout,
}

// SAFETY: the mapping is plain shared memory; every concurrent access to it goes through
// atomics, and staging bytes are only touched in protocol phases that exclude concurrent writes.
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

/// Control words of one ordered pair's mailbox.
pub(crate) struct PairCtl<'a> {
    /// Chunks the sender has written (release after the data).
    pub sent: &'a AtomicU64,
    /// Chunks the receiver has consumed (release after copying out).
    pub acked: &'a AtomicU64,
    /// Total bytes of the message in flight and its dtype code, for the receiver's check.
    pub msg_bytes: &'a AtomicU64,
    pub msg_dtype: &'a AtomicU64,
    /// Written by the receiver: the message it waits for (its first chunk's number + 1), its
    /// size and dtype code, so that a sender that comes later checks its own against them.
    pub expect: &'a AtomicU64,
    pub expect_bytes: &'a AtomicU64,
    pub expect_dtype: &'a AtomicU64,
    /// Written by the receiver: the latest message (first chunk's number + 1) it refused for
    /// a size or dtype that differed, and the size it expected; the sender reports it.
    pub refused: &'a AtomicU64,
    pub refused_bytes: &'a AtomicU64,
}

impl Segment {
    /// Creates (rank 0) or opens (other ranks) the communicator's segment, maps it, and unlinks
    /// its name once every rank has mapped it.
    pub fn establish(
        store: &dyn Store,
        rank: usize,
        world: usize,
        slot_bytes: usize,
        timeout: Duration,
    ) -> Result<Segment> {
        let layout = Layout::new(world, slot_bytes)?;
        let ctx = |what: &str| format!("host backend rank {rank}: {what}");
        let seg = if rank == 0 {
            let need = format!(
                "{} ranks with FERROCOMM_HOST_SLOT_BYTES={}",
                layout.world, layout.slot_bytes
            );
            // From here on the name goes away whatever happens (the guard unlinks it).
            let (name, file, unlink) =
                create_file(layout.total, &need, "lower FERROCOMM_HOST_SLOT_BYTES", &ctx)?;
            let seg = Segment::map(file, layout, &|w| ctx(&format!("{name}: {w}")))?;
            seg.write_header();
            store.set("host/shm_name", name.as_bytes())?;
            seg.claim(rank);
            store_barrier(store, "host/mapped", world, timeout)?;
            drop(unlink);
            seg
        } else {
            let name = store.get("host/shm_name", timeout)?;
            let name = String::from_utf8_lossy(&name).into_owned();
            let file = open_file(&name, "rank 0", &ctx)?;
            let seg = Segment::map(file, layout, &|w| ctx(&format!("{name}: {w}")))?;
            seg.check_header(rank)?;
            seg.claim(rank);
            store_barrier(store, "host/mapped", world, timeout)?;
            seg
        };
        Ok(seg)
    }

    fn map(file: File, layout: Layout, ctx: &dyn Fn(&str) -> String) -> Result<Segment> {
        let len = owned_len(&file, ctx)?;
        if len != layout.total as u64 {
            return Err(Error::InvalidArgument(ctx(&format!(
                "the shared segment has {len} bytes but this rank expects {} (ranks disagree on \
                 the world size or FERROCOMM_HOST_SLOT_BYTES)",
                layout.total
            ))));
        }
        let map = map_file(&file, layout.total, ctx)?;
        Ok(Segment { map, layout })
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off % 8 == 0 && off + 8 <= self.layout.total);
        // SAFETY: `off` is 8-aligned and in bounds (layout offsets are multiples of LINE plus
        // multiples of 8); the mapping is page-aligned and lives as long as `self`; shared words
        // are only ever accessed atomically.
        unsafe { &*(self.map.as_mut_ptr().add(off) as *const AtomicU64) }
    }

    fn write_header(&self) {
        let l = &self.layout;
        for (i, v) in [l.world, l.slot_bytes, l.p2p_bytes, l.total]
            .into_iter()
            .enumerate()
        {
            self.word(8 + 8 * i).store(v as u64, Ordering::Relaxed);
        }
        // release: the header is complete before the magic says so.
        self.word(0).store(MAGIC, Ordering::Release);
    }

    fn check_header(&self, rank: usize) -> Result<()> {
        let l = &self.layout;
        let mine = [l.world, l.slot_bytes, l.p2p_bytes, l.total];
        let theirs: Vec<usize> = (0..4)
            .map(|i| self.word(8 + 8 * i).load(Ordering::Relaxed) as usize)
            .collect();
        if self.word(0).load(Ordering::Acquire) != MAGIC || theirs != mine {
            return Err(Error::InvalidArgument(format!(
                "host backend rank {rank}: the shared segment was made for (world, slot bytes) = \
                 ({}, {}) but this rank has ({}, {}); ranks disagree on the world size or \
                 FERROCOMM_HOST_SLOT_BYTES",
                theirs[0], theirs[1], mine[0], mine[1]
            )));
        }
        Ok(())
    }

    /// Records this rank's pid so that peers can tell when it has died.
    fn claim(&self, rank: usize) {
        self.pid(rank)
            .store(std::process::id() as u64, Ordering::Release);
    }

    /// Barrier arrivals of rank `r` (monotonically increasing epochs).
    pub fn epoch(&self, r: usize) -> &AtomicU64 {
        self.word(self.layout.ctl + r * LINE)
    }
    pub fn pid(&self, r: usize) -> &AtomicU64 {
        self.word(self.layout.ctl + r * LINE + 8)
    }
    /// Nonzero once rank `r` has given up on the communicator (timeout or dead peer).
    pub fn failed(&self, r: usize) -> &AtomicU64 {
        self.word(self.layout.ctl + r * LINE + 16)
    }
    pub fn sig(&self, r: usize, i: usize) -> &AtomicU64 {
        debug_assert!(i < SIG_WORDS);
        self.word(self.layout.sig + r * LINE + 8 * i)
    }
    /// All-to-all-v counts of rank `r`: words 0..n are sends to each peer, n..2n receives.
    pub fn count(&self, r: usize, i: usize) -> &AtomicU64 {
        debug_assert!(i < 2 * self.layout.world);
        self.word(self.layout.counts + r * self.layout.counts_stride + 8 * i)
    }
    pub fn pair(&self, src: usize, dst: usize) -> PairCtl<'_> {
        let base = self.layout.pairs + (src * self.layout.world + dst) * self.layout.pair_stride;
        PairCtl {
            sent: self.word(base),
            acked: self.word(base + 64),
            msg_bytes: self.word(base + 8),
            msg_dtype: self.word(base + 16),
            expect: self.word(base + 72),
            expect_bytes: self.word(base + 80),
            expect_dtype: self.word(base + 88),
            refused: self.word(base + 96),
            refused_bytes: self.word(base + 104),
        }
    }
    /// Data area of the (src, dst) mailbox: `p2p_bytes` bytes.
    pub fn pair_data(&self, src: usize, dst: usize) -> *mut u8 {
        let base = self.layout.pairs + (src * self.layout.world + dst) * self.layout.pair_stride;
        // SAFETY: in bounds of the mapping by construction of the layout.
        unsafe { self.map.as_mut_ptr().add(base + LINE) }
    }
    /// Staging slot of rank `r`: `slot_bytes` bytes.
    pub fn slot(&self, r: usize) -> *mut u8 {
        // SAFETY: in bounds of the mapping by construction of the layout.
        unsafe {
            self.map
                .as_mut_ptr()
                .add(self.layout.slots + r * self.layout.slot_bytes)
        }
    }
    /// Reduced-stripe area of the tree all-reduce: `slot_bytes` bytes.
    pub fn reduced(&self) -> *mut u8 {
        // SAFETY: in bounds of the mapping by construction of the layout.
        unsafe { self.map.as_mut_ptr().add(self.layout.reduced) }
    }
}

/// Opens the segment `name` (`/ferrocomm-...`), creating it (mode 0600) when `create`, the way
/// `shm_open` does but never through a symbolic link: whoever can write `/dev/shm` could plant
/// one at the name to steer a rank into another file (`O_NOFOLLOW` when opening; `O_EXCL`
/// when creating, which also refuses any file already there).
pub(crate) fn open_segment(name: &str, create: bool) -> rustix::io::Result<rustix::fd::OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    let path = format!("/dev/shm{name}");
    let mut flags = OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    if create {
        flags |= OFlags::CREATE | OFlags::EXCL;
    }
    rustix::fs::open(path.as_str(), flags, Mode::RUSR | Mode::WUSR)
}

/// Creates a segment file of `bytes` bytes under a fresh name (`/ferrocomm-<pid>-<16 hex
/// digits>`, mode 0600, `O_EXCL`, never through a link) and reserves its memory. The guard
/// unlinks the name when dropped. `need` says what asked for the memory and `lower` what to
/// lower, in the error of a full `/dev/shm`.
pub(crate) fn create_file(
    bytes: usize,
    need: &str,
    lower: &str,
    ctx: &dyn Fn(&str) -> String,
) -> Result<(String, File, UnlinkGuard)> {
    let name = format!(
        "/ferrocomm-{}-{:016x}",
        std::process::id(),
        rand::random::<u64>()
    );
    let fd = open_segment(&name, true)
        .map_err(|e| Error::io(ctx(&format!("creating {name}")), e.into()))?;
    let unlink = UnlinkGuard(Some(name.clone()));
    rustix::fs::ftruncate(&fd, bytes as u64)
        .map_err(|e| Error::io(ctx(&format!("sizing {name} to {bytes} bytes")), e.into()))?;
    reserve(&fd, bytes, &name, need, lower, ctx)?;
    Ok((name, File::from(fd), unlink))
}

/// Opens the segment file `name` that `maker` (a peer) created and published: a name of the
/// form [`create_file`] makes, never through a symbolic link, this user's with mode 600
/// (checked again when it is mapped).
pub(crate) fn open_file(name: &str, maker: &str, ctx: &dyn Fn(&str) -> String) -> Result<File> {
    if !is_segment_name(name) {
        return Err(Error::InvalidArgument(ctx(&format!(
            "the store names the shared segment {name:?}, which is not a name {maker} \
             makes (/ferrocomm-<pid>-<16 hex digits>)"
        ))));
    }
    let fd = open_segment(name, false).map_err(|e| {
        let what = if e == rustix::io::Errno::LOOP {
            format!(
                "{name} is a symbolic link, not the segment {maker} made; refusing to \
                 follow it"
            )
        } else {
            format!(
                "opening {name} (created by {maker}; all ranks of a host communicator \
                 must run on one machine)"
            )
        };
        Error::io(ctx(&what), e.into())
    })?;
    Ok(File::from(fd))
}

/// The length of a segment file, once its owner and mode are this user's and 600.
pub(crate) fn owned_len(file: &File, ctx: &dyn Fn(&str) -> String) -> Result<u64> {
    let meta = file
        .metadata()
        .map_err(|e| Error::io(ctx("fstat of the segment"), e))?;
    check_owner(meta.uid(), meta.mode(), &ctx)?;
    Ok(meta.len())
}

/// Maps the first `len` bytes of a segment file, shared and writable.
pub(crate) fn map_file(
    file: &File,
    len: usize,
    ctx: &dyn Fn(&str) -> String,
) -> Result<memmap2::MmapRaw> {
    memmap2::MmapOptions::new()
        .len(len)
        .map_raw(file)
        .map_err(|e| Error::io(ctx("mmap of the segment"), e))
}

/// Reserves the memory of a segment just sized to `total` bytes, so that a full `/dev/shm` is
/// this error (naming the size needed, what needs it and the space left) instead of a SIGBUS
/// at the first touch of a page that tmpfs cannot back.
fn reserve(
    fd: &rustix::fd::OwnedFd,
    total: usize,
    name: &str,
    need: &str,
    lower: &str,
    ctx: &dyn Fn(&str) -> String,
) -> Result<()> {
    let r = match test_seam::reserve_failure() {
        Some(e) => Err(e),
        None => rustix::fs::fallocate(fd, rustix::fs::FallocateFlags::empty(), 0, total as u64),
    };
    r.map_err(|e| {
        let left = rustix::fs::fstatvfs(fd)
            .map(|v| format!("{} bytes", v.f_bavail.saturating_mul(v.f_frsize)))
            .unwrap_or_else(|_| "an unknown number of bytes".into());
        let what = format!(
            "reserving the shared segment {name}: {need} need {total} bytes of /dev/shm, which \
             has {left} left (free space there, enlarge it or {lower})"
        );
        Error::io(ctx(&what), e.into())
    })
}

/// A failure of the reservation made to order, for the unit tests of a full `/dev/shm`: in
/// test builds of this crate only (never an environment variable or anything a user could set).
mod test_seam {
    #[cfg(test)]
    thread_local! {
        static FAIL: std::cell::Cell<Option<rustix::io::Errno>> = const { std::cell::Cell::new(None) };
    }

    /// The failure the next reservation on this thread reports instead of reserving.
    #[cfg(test)]
    pub(super) fn fail_next_reserve(e: rustix::io::Errno) {
        FAIL.with(|f| f.set(Some(e)));
    }

    #[cfg(test)]
    pub(super) fn reserve_failure() -> Option<rustix::io::Errno> {
        FAIL.with(|f| f.take())
    }

    #[cfg(not(test))]
    pub(super) fn reserve_failure() -> Option<rustix::io::Errno> {
        None
    }
}

/// Whether `name` is one [`Segment::establish`] makes: `/ferrocomm-<pid>-<16 hex digits>`.
pub(crate) fn is_segment_name(name: &str) -> bool {
    segment_creator(name.strip_prefix('/').unwrap_or("")).is_some() && name.starts_with('/')
}

/// The creator's pid of a segment's file name (`ferrocomm-<pid>-<16 hex digits>`).
fn segment_creator(file: &str) -> Option<u32> {
    let (pid, hex) = file.strip_prefix("ferrocomm-")?.split_once('-')?;
    let hex_ok = hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit());
    let pid_ok = !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit());
    if hex_ok && pid_ok {
        pid.parse().ok()
    } else {
        None
    }
}

/// A segment must belong to this user and be open to no one else (rank 0 creates it 0600):
/// one made by anyone else could be read or written behind the job's back.
pub(crate) fn check_owner(uid: u32, mode: u32, ctx: &dyn Fn(&str) -> String) -> Result<()> {
    let me = rustix::process::getuid().as_raw();
    if uid != me || mode & 0o777 != 0o600 {
        return Err(Error::InvalidArgument(ctx(&format!(
            "the shared segment belongs to uid {uid} with mode {:o}, but must belong to this \
             user (uid {me}) with mode 600; refusing to map it",
            mode & 0o7777
        ))));
    }
    Ok(())
}

/// Removes this user's segments in `dir` (`/dev/shm`) whose creator process is gone: left by
/// a rank 0 killed during set-up, before every rank had mapped the segment. Returns the names
/// removed.
pub fn remove_stale_segments(dir: &std::path::Path) -> Vec<String> {
    let me = rustix::process::getuid().as_raw();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = segment_creator(&name) else {
            continue;
        };
        let mine = e.metadata().is_ok_and(|m| m.uid() == me);
        // Only "no such process" counts as gone (EPERM: alive, another user's).
        let alive = rustix::process::Pid::from_raw(pid as i32).is_some_and(|p| {
            !matches!(
                rustix::process::test_kill_process(p),
                Err(rustix::io::Errno::SRCH)
            )
        });
        if mine && !alive && std::fs::remove_file(e.path()).is_ok() {
            removed.push(name);
        }
    }
    removed
}

/// Unlinks a shared-memory name when dropped (after every rank mapped it, or on failure).
pub(crate) struct UnlinkGuard(pub(crate) Option<String>);

impl Drop for UnlinkGuard {
    fn drop(&mut self) {
        if let Some(n) = self.0.take() {
            // Nothing useful to do if it is already gone.
            let _ = rustix::shm::unlink(n.as_str());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::MemStore;

    #[test]
    fn layouts_past_the_address_range_are_refused() {
        for (world, slot) in [
            (2, usize::MAX),
            (2, 6148914691236517248),
            (usize::MAX / 64, 4096),
            (1 << 33, 4096),
        ] {
            let e = Layout::new(world, slot).unwrap_err().to_string();
            assert!(e.contains("FERROCOMM_HOST_SLOT_BYTES"), "{e}");
        }
        let l = Layout::new(3, 8192).unwrap();
        assert!(l.reduced + l.slot_bytes == l.total && l.slots % 4096 == 0);
    }

    /// A segment another process made, mode `mode`, of the size rank 1 expects, with a header
    /// that passes the check; published in a store as rank 0 would.
    fn forged(mode: u32, name: &str) -> std::sync::Arc<MemStore> {
        let layout = Layout::new(2, 8192).unwrap();
        let fd = rustix::shm::open(
            name,
            rustix::shm::OFlags::CREATE | rustix::shm::OFlags::EXCL | rustix::shm::OFlags::RDWR,
            rustix::fs::Mode::from_raw_mode(0o600),
        )
        .unwrap();
        rustix::fs::fchmod(&fd, rustix::fs::Mode::from_raw_mode(mode)).unwrap();
        rustix::fs::ftruncate(&fd, layout.total as u64).unwrap();
        let map = memmap2::MmapOptions::new()
            .len(layout.total)
            .map_raw(&File::from(fd))
            .unwrap();
        let seg = Segment { map, layout };
        seg.write_header();
        let store = MemStore::new();
        store.set("host/shm_name", name.as_bytes()).unwrap();
        store
    }

    #[test]
    fn a_segment_open_to_others_is_refused_naming_it() {
        let name = format!("/ferrocomm-{}-{:016x}", std::process::id(), 0xf0e1d2u64);
        let store = forged(0o666, &name);
        let r = Segment::establish(&*store, 1, 2, 8192, Duration::from_millis(200));
        let _ = rustix::shm::unlink(name.as_str());
        let e = r
            .err()
            .expect("mapped a world-writable segment")
            .to_string();
        assert!(e.contains(&name) && e.contains("mode 666"), "{e}");
    }

    #[test]
    fn a_name_rank0_would_not_make_is_refused() {
        for name in [
            "/evil",
            "/ferrocomm-1-xyz",
            "/ferrocomm-1-0123456789abcdef/../x",
            "",
        ] {
            let store = MemStore::new();
            store.set("host/shm_name", name.as_bytes()).unwrap();
            let e = Segment::establish(&*store, 1, 2, 8192, Duration::from_millis(200))
                .err()
                .expect("opened a foreign name")
                .to_string();
            assert!(e.contains("not a name rank 0"), "{name}: {e}");
        }
    }

    #[test]
    fn a_symlink_at_a_segment_name_is_refused() {
        // A file that passes every other check (this user's, mode 600, the size and header rank
        // 1 expects), and a link to it at a name of the form rank 0 makes: with
        // fs.protected_symlinks=0 (or a link planted by the job's own user), following it
        // would map whatever the link points to.
        let target = format!("/ferrocomm-{}-{:016x}", std::process::id(), 0x5a5a01u64);
        let link = format!("/ferrocomm-{}-{:016x}", std::process::id(), 0x5a5a02u64);
        forged(0o600, &target);
        let link_path = format!("/dev/shm{link}");
        std::os::unix::fs::symlink(format!("/dev/shm{target}"), &link_path).unwrap();
        let store = MemStore::new();
        store.set("host/shm_name", link.as_bytes()).unwrap();
        let opened = Segment::establish(&*store, 1, 2, 8192, Duration::from_millis(200));
        let created = open_segment(&link, true).map(drop);
        let _ = std::fs::remove_file(&link_path);
        let _ = rustix::shm::unlink(target.as_str());
        let e = opened.err().expect("followed a symlink").to_string();
        assert!(e.contains("symbolic link") && e.contains(&link), "{e}");
        // Creating at a planted name fails too (O_EXCL), rather than writing through it.
        assert_eq!(created, Err(rustix::io::Errno::EXIST));
    }

    /// The segment rank 0 of a one-rank communicator makes, every byte of it written: a full
    /// /dev/shm either refuses it at creation or kills the process with SIGBUS here.
    fn establish_and_touch(slot: usize) -> Result<()> {
        let store = MemStore::new();
        let seg = Segment::establish(&*store, 0, 1, slot, Duration::from_secs(5))?;
        // SAFETY: the slot lies inside the mapping (the layout's), which `seg` keeps alive.
        unsafe { std::ptr::write_bytes(seg.slot(0), 0x5a, seg.layout.slot_bytes) };
        Ok(())
    }

    #[test]
    fn a_full_dev_shm_is_a_clear_error_naming_the_sizes() {
        test_seam::fail_next_reserve(rustix::io::Errno::NOSPC);
        let e = establish_and_touch(8192).unwrap_err().to_string();
        let total = Layout::new(1, 8192).unwrap().total;
        assert!(
            e.contains("No space left")
                && e.contains(&format!("need {total} bytes"))
                && e.contains("left")
                && e.contains("FERROCOMM_HOST_SLOT_BYTES=8192"),
            "{e}"
        );
        // The segment's name went away with the failure.
        let name = e
            .split_whitespace()
            .find(|w| w.starts_with("/ferrocomm-"))
            .unwrap();
        assert!(
            !std::path::Path::new(&format!("/dev/shm{name}")).exists(),
            "{e}"
        );
    }

    #[test]
    #[ignore = "entry point of the child that a_full_tmpfs_is_refused_at_creation starts"]
    fn full_tmpfs_child() {
        match establish_and_touch(4 << 20) {
            Ok(()) => println!("SEGMENT MADE AND TOUCHED"),
            Err(e) => println!("SEGMENT REFUSED: {e}"),
        }
    }

    #[test]
    fn a_full_tmpfs_is_refused_at_creation_not_with_sigbus() {
        // A 1 MiB tmpfs on /dev/shm in a private mount namespace (as root, or in a user
        // namespace that maps this user to root), and a segment of 8 MiB. Where `unshare` can
        // make no such namespace, a_full_dev_shm_is_a_clear_error_naming_the_sizes (the
        // reservation failing to order) is the test of this path.
        let root = rustix::process::getuid().is_root();
        let mut cmd = std::process::Command::new("unshare");
        cmd.arg("--mount");
        if !root {
            cmd.arg("--map-root-user");
        }
        let out = cmd
            .args([
                "sh",
                "-c",
                "mount -t tmpfs -o size=1m tmpfs /dev/shm && echo MOUNTED && exec \"$1\" \
                 --exact host::shm::tests::full_tmpfs_child --ignored --nocapture",
                "sh",
            ])
            .arg(std::env::current_exe().unwrap())
            .output();
        let Ok(out) = out else {
            eprintln!("no unshare here: the injected failure is the test");
            return;
        };
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !text.contains("MOUNTED") {
            eprintln!("no private mount namespace here: the injected failure is the test");
            return;
        }
        // Killed by SIGBUS, the child prints nothing after MOUNTED and has no exit code.
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let total = Layout::new(1, 4 << 20).unwrap().total;
        assert!(
            text.contains("SEGMENT REFUSED")
                && text.contains(&format!("need {total} bytes"))
                && text.contains("which has"),
            "{text}"
        );
    }

    #[test]
    fn stale_segments_of_dead_creators_are_removed_and_live_ones_kept() {
        let dir = std::env::temp_dir().join(format!("ferrocomm-shm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A pid that is gone: a child that has exited and been reaped.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let stale = format!("ferrocomm-{dead}-00000000000000aa");
        let live = format!("ferrocomm-{}-00000000000000bb", std::process::id());
        let other = "ferrocomm-notapid-00000000000000cc".to_string();
        for n in [&stale, &live, &other] {
            std::fs::write(dir.join(n), b"x").unwrap();
        }
        assert_eq!(remove_stale_segments(&dir), vec![stale.clone()]);
        assert!(!dir.join(&stale).exists());
        assert!(dir.join(&live).exists() && dir.join(&other).exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
