//! Windows on the host backend: every rank's registered buffer lies in shared memory that
//! every peer maps, so a put is a copy into the peer's mapping and a signal an atomic add to
//! a counter in the peer's signal segment.
//!
//! A buffer must lie in a [`SharedMem`] (a named segment of its process, created like the
//! communicator's own: mode 600, `O_EXCL`, never through a link). At registration each rank
//! also creates a signal segment (a cache-line pair per sender holding its slots' counters),
//! publishes both names, and maps every peer's; the signal segment's name goes once every
//! rank has mapped it. A signal is `fetch_add(1, Release)` on the counter, after the sender's
//! copies in program order; a wait loads it with `Acquire` until it passes the count
//! consumed, watching the peer's process, its failed flag, this rank's abort and the
//! deadline (the backend's own waits).

use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::shm::{create_file, map_file, open_file, owned_len, Segment, UnlinkGuard, LINE};
use super::sync::Stop;
use super::wait_for_peer;
use crate::backend::{WindowBackend, MAX_WINDOW_SLOTS};
use crate::error::{Error, Result};

// A sender's counters fit in its line.
const _: () = assert!(MAX_WINDOW_SLOTS * 8 <= LINE);

/// Host memory the ranks of a host communicator can map: a shared-memory segment of this
/// process, under a name its peers open (this user's only, mode 600) for as long as it lives.
/// A window on the host backend registers buffers that lie in one, and peers write into them
/// directly. The memory starts zeroed.
pub struct SharedMem {
    inner: Arc<Allocation>,
}

struct Allocation {
    name: String,
    map: memmap2::MmapRaw,
    /// Unlinks the name when the allocation goes.
    _unlink: UnlinkGuard,
}

/// Every live [`SharedMem`] of this process, so that a window finds the one holding a buffer.
static ALLOCATIONS: Mutex<Vec<Weak<Allocation>>> = Mutex::new(Vec::new());

impl SharedMem {
    /// `bytes` of shared memory (at least one), reserved in `/dev/shm` now: a full `/dev/shm`
    /// is this error rather than a SIGBUS later.
    pub fn new(bytes: usize) -> Result<SharedMem> {
        if bytes == 0 || isize::try_from(bytes).is_err() {
            return Err(Error::InvalidArgument(format!(
                "shared memory of {bytes} bytes (at least one, at most isize::MAX)"
            )));
        }
        let ctx = |what: &str| format!("shared memory for a window: {what}");
        let need = format!("a shared buffer of {bytes} bytes");
        let (name, file, unlink) = create_file(bytes, &need, "allocate less", &ctx)?;
        let map = map_file(&file, bytes, &ctx)?;
        let inner = Arc::new(Allocation {
            name,
            map,
            _unlink: unlink,
        });
        let mut all = ALLOCATIONS.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(&inner));
        Ok(SharedMem { inner })
    }

    /// The first byte.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.inner.map.as_mut_ptr()
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.inner.map.len()
    }

    /// Whether it holds no byte (never: it holds at least one).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The live allocation holding the `bytes` at `ptr`, and where they start in it.
    fn find(ptr: u64, bytes: usize) -> Option<(Arc<Allocation>, usize)> {
        let all = ALLOCATIONS.lock().unwrap_or_else(|e| e.into_inner());
        all.iter().filter_map(Weak::upgrade).find_map(|a| {
            let base = a.map.as_ptr() as u64;
            let off = ptr.checked_sub(base)?;
            let end = off.checked_add(bytes as u64)?;
            (end <= a.map.len() as u64).then(|| (a.clone(), off as usize))
        })
    }
}

impl std::fmt::Debug for SharedMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedMem({} bytes, {})", self.len(), self.inner.name)
    }
}

/// One rank's part of a window on the host backend.
pub(crate) struct HostWindow {
    /// The communicator's segment: every peer's pid and failed flag, for the waits.
    seg: Arc<Segment>,
    aborted: Arc<AtomicBool>,
    /// The communicator's watcher's verdicts on every peer's process.
    watch: Arc<crate::backend::PeerState>,
    rank: usize,
    world: usize,
    slots: usize,
    name: String,
    own: Option<Own>,
    /// Every rank's buffer and signal counters as mapped here, once imported.
    peers: Vec<Mapped>,
    /// Signals consumed per (peer, slot).
    consumed: Vec<AtomicU64>,
}

/// This rank's registered buffer and signal segment.
struct Own {
    mem: Arc<Allocation>,
    offset: usize,
    signals: memmap2::MmapRaw,
    /// The signal segment's name, until every peer has mapped it.
    signals_name: Option<UnlinkGuard>,
}

/// A rank's buffer and signal counters as mapped in this process (this rank's own: its
/// allocation and segment, kept alive by [`Own`]).
struct Mapped {
    base: *mut u8,
    bytes: usize,
    signals: *const AtomicU64,
    _maps: Option<(memmap2::MmapRaw, memmap2::MmapRaw)>,
}

// SAFETY: the raw pointers point into mappings this struct owns (or, for this rank's own
// entry, that `own` keeps alive); shared counters are only accessed atomically, and buffer
// bytes are written by puts whose order with readers the signals give.
unsafe impl Send for HostWindow {}
// SAFETY: as above.
unsafe impl Sync for HostWindow {}

impl HostWindow {
    pub(crate) fn new(
        seg: Arc<Segment>,
        aborted: Arc<AtomicBool>,
        watch: Arc<crate::backend::PeerState>,
        rank: usize,
        world: usize,
        slots: usize,
        name: String,
    ) -> HostWindow {
        HostWindow {
            seg,
            aborted,
            watch,
            rank,
            world,
            slots,
            name,
            own: None,
            peers: Vec::new(),
            consumed: Vec::new(),
        }
    }

    /// Bytes of a signal segment: a line pair per sender.
    fn signal_bytes(&self) -> usize {
        self.world * LINE
    }

    /// The counter of `sender`'s signals in `slot` within a signal segment mapped at `base`.
    fn counter(&self, base: *const AtomicU64, sender: usize, slot: usize) -> &AtomicU64 {
        debug_assert!(sender < self.world && slot < self.slots);
        // SAFETY: `base` maps `world * LINE` bytes (checked when mapped) and lives as long as
        // `self`; line `sender` holds at least `MAX_WINDOW_SLOTS` 8-byte counters.
        unsafe { &*base.add(sender * LINE / 8 + slot) }
    }

    fn mapped(&self, rank: usize) -> Result<&Mapped> {
        self.peers.get(rank).ok_or_else(|| {
            Error::InvalidArgument(format!("window: rank {rank}'s buffer is not mapped"))
        })
    }
}

/// Appends a length-prefixed string.
fn put_str(msg: &mut Vec<u8>, s: &str) {
    msg.extend_from_slice(&(s.len() as u16).to_le_bytes());
    msg.extend_from_slice(s.as_bytes());
}

/// A registration message read with bounds checks: every field must be there.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn str(&mut self) -> Option<&'a str> {
        let n = u16::from_le_bytes(self.take(2)?.try_into().ok()?) as usize;
        std::str::from_utf8(self.take(n)?).ok()
    }
}

impl WindowBackend for HostWindow {
    fn export(&mut self, ptr: u64, bytes: usize) -> Result<Vec<u8>> {
        let Some((mem, offset)) = SharedMem::find(ptr, bytes) else {
            return Err(Error::InvalidArgument(
                "tensor_register: on the host backend a window's buffer must lie in shared \
                 memory its peers can map (ferrocomm.shared_empty in Python, SharedMem in \
                 Rust); this one does not"
                    .into(),
            ));
        };
        let ctx = |what: &str| format!("window signals of rank {}: {what}", self.rank);
        let need = format!("the window signals of {} ranks", self.world);
        let (name, file, unlink) =
            create_file(self.signal_bytes(), &need, "use fewer ranks", &ctx)?;
        let signals = map_file(&file, self.signal_bytes(), &ctx)?;
        let mut msg = Vec::new();
        put_str(&mut msg, &mem.name);
        msg.extend_from_slice(&(offset as u64).to_le_bytes());
        msg.extend_from_slice(&(bytes as u64).to_le_bytes());
        put_str(&mut msg, &name);
        self.own = Some(Own {
            mem,
            offset,
            signals,
            signals_name: Some(unlink),
        });
        Ok(msg)
    }

    fn import(&mut self, msgs: &[Vec<u8>], bytes: usize) -> Result<()> {
        let own = self
            .own
            .as_ref()
            .ok_or_else(|| Error::InvalidArgument("window: nothing exported".into()))?;
        let mut peers = Vec::with_capacity(self.world);
        for (r, m) in msgs.iter().enumerate() {
            if r == self.rank {
                peers.push(Mapped {
                    // SAFETY: `offset + bytes` lies inside the allocation (found so).
                    base: unsafe { own.mem.map.as_mut_ptr().add(own.offset) },
                    bytes,
                    signals: own.signals.as_ptr().cast(),
                    _maps: None,
                });
                continue;
            }
            let ctx =
                |what: &str| format!("window of rank {}, rank {r}'s buffer: {what}", self.rank);
            let malformed = || Error::InvalidArgument(ctx("a malformed registration message"));
            let mut rd = Reader(m);
            let buf_name = rd.str().ok_or_else(malformed)?;
            let offset = rd.u64().ok_or_else(malformed)?;
            let len = rd.u64().ok_or_else(malformed)?;
            let sig_name = rd.str().ok_or_else(malformed)?;
            if len != bytes as u64 {
                return Err(malformed());
            }
            let maker = format!("rank {r}");
            let file = open_file(buf_name, &maker, &ctx)?;
            let file_len = owned_len(&file, &ctx)?;
            let end = offset
                .checked_add(len)
                .filter(|&e| e <= file_len)
                .ok_or_else(|| {
                    Error::InvalidArgument(ctx(&format!(
                        "{len} bytes at offset {offset} do not lie inside {buf_name}"
                    )))
                })?;
            let buf = map_file(&file, end as usize, &ctx)?;
            let sig = map_signals(sig_name, &maker, self.signal_bytes(), &ctx)?;
            peers.push(Mapped {
                // SAFETY: `offset + len` is inside the mapping just made.
                base: unsafe { buf.as_mut_ptr().add(offset as usize) },
                bytes,
                signals: sig.as_ptr().cast(),
                _maps: Some((buf, sig)),
            });
        }
        self.peers = peers;
        self.consumed = (0..self.world * self.slots)
            .map(|_| AtomicU64::new(0))
            .collect();
        Ok(())
    }

    fn settled(&mut self) {
        if let Some(own) = &mut self.own {
            own.signals_name = None;
        }
    }

    fn quiesce(&self) -> Result<()> {
        // Host operations have finished when they return.
        Ok(())
    }

    fn release(&mut self) {
        self.peers.clear();
        self.consumed.clear();
        self.own = None;
    }

    fn put(&self, src: u64, bytes: usize, dst: usize, offset: usize, _stream: u64) -> Result<()> {
        let m = self.mapped(dst)?;
        // The window checked the range; a second look costs nothing next to the copy.
        if offset.checked_add(bytes).is_none_or(|end| end > m.bytes) {
            return Err(Error::InvalidArgument(format!(
                "put: {bytes} bytes at byte {offset} past rank {dst}'s window of {} bytes",
                m.bytes
            )));
        }
        // SAFETY: the target range lies inside rank `dst`'s mapped buffer (checked above);
        // `src` holds `bytes` readable bytes (the caller's view). `copy` allows an overlap.
        unsafe { std::ptr::copy(src as *const u8, m.base.add(offset), bytes) };
        Ok(())
    }

    fn signal(&self, dst: usize, slot: usize, _stream: u64) -> Result<()> {
        let m = self.mapped(dst)?;
        // release: the puts this thread made before are visible to whoever acquires this count.
        self.counter(m.signals, self.rank, slot)
            .fetch_add(1, Ordering::Release);
        Ok(())
    }

    fn wait_signal(&self, peer: usize, slot: usize, _stream: u64, timeout: Duration) -> Result<()> {
        let own = self.mapped(self.rank)?;
        let incoming = self.counter(own.signals, peer, slot);
        let consumed = &self.consumed[peer * self.slots + slot];
        let want = consumed.load(Ordering::Relaxed) + 1;
        // acquire: what the peer put before its signal is visible once the count is seen.
        let r = wait_for_peer(&self.seg, &self.aborted, &self.watch, peer, timeout, || {
            incoming.load(Ordering::Acquire) >= want
        });
        match r {
            Ok(()) => {
                consumed.store(want, Ordering::Relaxed);
                Ok(())
            }
            Err(Stop::Timeout) => Err(Error::Timeout {
                collective: "wait_signal",
                rank: self.rank,
                missing: peer,
                timeout,
            }),
            // A refused collective call is no concern of a window's wait (none runs in it), but
            // a peer that refused one has failed the communicator.
            Err(Stop::PeerFailed | Stop::Refused) => Err(Error::PeerFailed {
                collective: "wait_signal",
                rank: self.rank,
                peer,
            }),
            Err(Stop::Aborted) => Err(Error::Aborted {
                communicator: self.name.clone(),
                why: super::ABORTED_DURING_CALL.into(),
            }),
        }
    }

    fn remote(&self, rank: usize) -> Option<u64> {
        self.peers.get(rank).map(|m| m.base as u64)
    }
}

/// Maps a peer's signal segment, which must be exactly `bytes` long.
fn map_signals(
    name: &str,
    maker: &str,
    bytes: usize,
    ctx: &dyn Fn(&str) -> String,
) -> Result<memmap2::MmapRaw> {
    let file: File = open_file(name, maker, ctx)?;
    let len = owned_len(&file, ctx)?;
    if len != bytes as u64 {
        return Err(Error::InvalidArgument(ctx(&format!(
            "the signal segment {name} has {len} bytes, expected {bytes} (ranks disagree on \
             the world size)"
        ))));
    }
    map_file(&file, bytes, ctx)
}
