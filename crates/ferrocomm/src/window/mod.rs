//! One-sided communication: windows (torchcomms' `TorchCommWindow`) and the persistent
//! all-gather built on them.
//!
//! A [`Window`] is made by [`crate::Communicator::new_window`] on every rank in the same order.
//! [`Window::register`] is collective: every rank registers a buffer of the same dtype and
//! element count, and every rank maps every peer's (CUDA IPC on the cuda backend, shared
//! memory on the host backend). Then a rank writes into a peer's buffer with
//! [`Window::put`], with no call on the peer's side, and orders those writes with
//! [`Window::signal`] and [`Window::wait_signal`]: a signal is released after the sender's
//! earlier puts to that peer, and a wait acquires it, so the puts are visible to the waiting
//! rank (on CUDA: to later work on the waiting stream) once its wait returns.
//! [`Window::remote_ptr`] gives a peer's buffer as mapped in this process.
//!
//! On CUDA every operation is enqueued on the caller's stream, host-free and capturable in a
//! CUDA graph (the signal counters live in device memory, so replays keep counting). On the
//! host backend the calls run on the calling thread; a registered buffer there must live in
//! memory peers can map: a [`SharedMem`].
//!
//! This module checks every argument once (ranks, dtypes, devices, the offset and length of
//! every put against the target's buffer, with checked arithmetic); the executors'
//! [`WindowBackend`] parts only move bytes and count signals.

mod all_gather_p;

use std::marker::PhantomData;
use std::sync::Arc;

pub use crate::host::SharedMem;
pub use all_gather_p::AllGatherP;

use crate::backend::{CallOpts, CommLive, WindowBackend, MAX_WINDOW_SLOTS};
use crate::bootstrap::{agree, store_barrier, Store};
use crate::error::{Error, Result};
use crate::types::{DataType, Device};
use crate::view::{View, ViewMut};

/// How a rank reaches a peer's window buffer (torchcomms' `TorchCommWinAccessType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessType {
    /// Loads and stores reach the peer's memory directly: a CUDA IPC mapping over NVLink or
    /// PCIe, or shared memory on the host backend. Every window of ferrocomm's is this.
    Unified,
    /// The peer's memory is reached through a network (not used by ferrocomm).
    Separate,
}

/// The buffer every rank registered (the same dtype and count on every rank).
#[derive(Debug, Clone, Copy)]
struct Registered {
    count: usize,
    dtype: DataType,
}

/// One window of a communicator: a buffer on every rank that every peer can write into.
///
/// `'b` is the lifetime of the buffer registered in it. Dropping a registered window releases
/// this rank's mappings without waiting for the peers; [`Window::deregister`] is the
/// collective way out.
pub struct Window<'b> {
    live: Arc<CommLive>,
    store: Arc<dyn Store>,
    rank: usize,
    size: usize,
    device: Device,
    /// This window's store prefix, the same on every rank (windows are made in the same order).
    key: String,
    slots: usize,
    engine: Box<dyn WindowBackend>,
    reg: Option<Registered>,
    /// Registrations so far (each one's store keys are its own).
    generation: u64,
    _buf: PhantomData<&'b mut [u8]>,
}

/// What a [`Window`] is made from: the communicator's state and an executor's part.
pub(crate) struct WindowParts {
    pub live: Arc<CommLive>,
    pub store: Arc<dyn Store>,
    pub rank: usize,
    pub size: usize,
    pub device: Device,
    pub engine: Box<dyn WindowBackend>,
    pub slots: usize,
}

/// The message every rank sends at registration before its executor's part: dtype code and
/// element count.
const DESC_BYTES: usize = 9;

impl<'b> Window<'b> {
    pub(crate) fn new(p: WindowParts) -> Result<Window<'b>> {
        if p.slots == 0 || p.slots > MAX_WINDOW_SLOTS {
            return Err(Error::InvalidArgument(format!(
                "new_window: {} signal slots (1 to {MAX_WINDOW_SLOTS})",
                p.slots
            )));
        }
        let id = p.live.next_window();
        Ok(Window {
            live: p.live,
            store: p.store,
            rank: p.rank,
            size: p.size,
            device: p.device,
            key: format!("window/{id}"),
            slots: p.slots,
            engine: p.engine,
            reg: None,
            generation: 0,
            _buf: PhantomData,
        })
    }

    /// Registers `buf` in the window: collective, every rank registers a buffer of the same
    /// dtype and element count on the communicator's device, and every rank maps every
    /// peer's. A buffer whose memory cannot be shared (on CUDA: not from `cuMemAlloc` or
    /// `cudaMalloc`, for example torch's expandable segments; on the host backend: not in a
    /// [`SharedMem`]), an empty one, one on another device, a window with a buffer already,
    /// or ranks that register different dtypes or counts: refused on every rank, nothing
    /// registered and nothing written.
    pub fn register(&mut self, buf: ViewMut<'b>) -> Result<()> {
        let timeout = self.live.timeout();
        self.register_checked(buf, timeout, |_| Ok(()))
    }

    /// [`Window::register`] with `check` run on this rank's buffer first (its error is
    /// reported to every rank as a bad registration is), each wait for the peers bounded by
    /// `timeout`.
    pub(crate) fn register_checked(
        &mut self,
        buf: ViewMut<'b>,
        timeout: std::time::Duration,
        check: impl FnOnce(&ViewMut<'b>) -> Result<()>,
    ) -> Result<()> {
        let c = "tensor_register";
        self.live.check()?;
        self.generation += 1;
        let tag = format!("{}/{}", self.key, self.generation);
        let already = self.reg.is_some();
        // This rank's checks and its message for the peers. A failure is reported to every
        // rank through the agreement below, so no rank waits for one that gave up.
        let local = (|| -> Result<Vec<u8>> {
            if already {
                return Err(Error::InvalidArgument(format!(
                    "{c}: this window has a registered buffer already (tensor_deregister first)"
                )));
            }
            if buf.device() != self.device {
                return Err(Error::InvalidArgument(format!(
                    "{c}: the tensor is on {} but the communicator on {}",
                    buf.device(),
                    self.device
                )));
            }
            if buf.count() == 0 {
                return Err(Error::InvalidArgument(format!(
                    "{c}: the tensor is empty (a window needs at least one element)"
                )));
            }
            check(&buf)?;
            let mut msg = Vec::with_capacity(DESC_BYTES + 80);
            msg.push(buf.dtype().code());
            msg.extend_from_slice(&(buf.count() as u64).to_le_bytes());
            msg.extend(self.engine.export(buf.ptr() as u64, buf.bytes_len())?);
            Ok(msg)
        })();
        let (reported, own_error) = split_outcome(local);
        let fail = |w: &mut Self, e: Error| -> Result<()> {
            // `already`: the registered buffer stays; otherwise whatever the executor set up
            // (all of an export, or part of one that failed) is released.
            if !already {
                w.engine.release();
            }
            Err(e)
        };
        let msgs = match agree(
            &*self.store,
            &format!("{tag}/desc"),
            self.rank,
            self.size,
            reported,
            timeout,
        ) {
            Err(e) => return fail(self, e),
            Ok(Err(failed)) => return fail(self, refused(c, own_error, &failed)),
            Ok(Ok(m)) => m,
        };
        let descs = match describe_all(c, &msgs) {
            Ok(d) => d,
            Err(e) => return fail(self, e),
        };
        let (dtype, count) = descs[self.rank];
        if descs.iter().any(|&d| d != (dtype, count)) {
            let each: Vec<String> = descs
                .iter()
                .enumerate()
                .map(|(r, (d, n))| format!("rank {r} {d} x {n}"))
                .collect();
            return fail(
                self,
                Error::InvalidArgument(format!(
                    "{c}: ranks registered different buffers ({}); every rank registers the \
                     same dtype and element count",
                    each.join(", ")
                )),
            );
        }
        let payloads: Vec<Vec<u8>> = msgs.iter().map(|m| m[DESC_BYTES..].to_vec()).collect();
        let (mapped, own_error) = split_outcome(
            self.engine
                .import(&payloads, buf.bytes_len())
                .map(|()| Vec::new()),
        );
        match agree(
            &*self.store,
            &format!("{tag}/mapped"),
            self.rank,
            self.size,
            mapped,
            timeout,
        ) {
            Err(e) => return fail(self, e),
            Ok(Err(failed)) => return fail(self, refused(c, own_error, &failed)),
            Ok(Ok(_)) => {}
        }
        self.engine.settled();
        self.reg = Some(Registered { count, dtype });
        Ok(())
    }

    /// Releases the registered buffer: collective. Every rank's window operations issued
    /// before it finish first (on CUDA the device is synchronized), then every rank unmaps.
    /// Not during CUDA graph capture.
    pub fn deregister(&mut self) -> Result<()> {
        let c = "tensor_deregister";
        self.live.check()?;
        if self.reg.is_none() {
            return Err(Error::InvalidArgument(format!(
                "{c}: no buffer is registered in this window"
            )));
        }
        self.engine.quiesce()?;
        // No rank releases its buffer while a peer may still be writing into it.
        let tag = format!("{}/{}/released", self.key, self.generation);
        store_barrier(&*self.store, &tag, self.size, self.live.timeout())?;
        self.engine.release();
        self.reg = None;
        Ok(())
    }

    /// The registered buffer's element type and count (the same on every rank), if any.
    pub fn registered(&self) -> Option<(DataType, usize)> {
        self.reg.map(|r| (r.dtype, r.count))
    }

    /// The registered buffer's size in bytes (0 when none is registered).
    pub fn size_bytes(&self) -> usize {
        self.reg.map_or(0, |r| r.count * r.dtype.size())
    }

    /// Writes `src` into rank `dst_rank`'s buffer at element `target_offset`, with no call on
    /// `dst_rank`'s side: on CUDA enqueued on `opts.stream` (by the copy engine or a kernel,
    /// as [`crate::plan::put_engine`] decides), on the host backend copied before it returns.
    /// `dst_rank` may be this rank. `src` has the window's dtype, lives on the communicator's
    /// device and must not overlap the range it is written to; elements `target_offset ..
    /// target_offset + src.count()` must lie in the target's buffer. Refused with nothing
    /// written otherwise.
    pub fn put(
        &self,
        src: View<'_>,
        dst_rank: usize,
        target_offset: usize,
        opts: &CallOpts,
    ) -> Result<()> {
        let c = "put";
        let reg = self.ready(c)?;
        self.check_rank(c, "dst_rank", dst_rank)?;
        if src.dtype() != reg.dtype {
            return Err(Error::DtypeMismatch {
                collective: c,
                what: "tensor",
                got: src.dtype(),
                expected: reg.dtype,
            });
        }
        if src.device() != self.device {
            return Err(Error::InvalidArgument(format!(
                "{c}: the tensor is on {} but the window on {}",
                src.device(),
                self.device
            )));
        }
        let (offset, bytes) = put_range(reg.count, reg.dtype.size(), target_offset, src.count())
            .map_err(|why| {
                Error::InvalidArgument(format!(
                    "{c}: {} elements at target_offset_nelems {target_offset} {why} of rank \
                     {dst_rank}'s window ({} elements)",
                    src.count(),
                    reg.count
                ))
            })?;
        if bytes == 0 {
            return Ok(());
        }
        self.engine
            .put(src.ptr() as u64, bytes, dst_rank, offset, opts.stream)
    }

    /// Signals rank `dst_rank` (which may be this rank) after this rank's earlier puts to it:
    /// its next [`Window::wait_signal`] for this rank returns, and those puts are visible to it
    /// then. On CUDA enqueued on `opts.stream`.
    pub fn signal(&self, dst_rank: usize, opts: &CallOpts) -> Result<()> {
        self.signal_slot(dst_rank, 0, opts)
    }

    /// Waits for the next signal from `peer_rank`: on the host backend here, on CUDA by
    /// `opts.stream` (later work on it sees what the peer put before signalling). Bounded by
    /// the call's timeout (else the communicator's): a wait that runs out fails with
    /// [`Error::Timeout`] naming the peer (on CUDA at the communicator's next call, as the
    /// kernels' timeouts are). An abort of the communicator ends it.
    pub fn wait_signal(&self, peer_rank: usize, opts: &CallOpts) -> Result<()> {
        self.wait_slot(peer_rank, 0, opts)
    }

    pub(crate) fn signal_slot(&self, dst_rank: usize, slot: usize, opts: &CallOpts) -> Result<()> {
        let c = "signal";
        self.ready(c)?;
        self.check_rank(c, "dst_rank", dst_rank)?;
        debug_assert!(slot < self.slots);
        self.engine.signal(dst_rank, slot, opts.stream)
    }

    pub(crate) fn wait_slot(&self, peer_rank: usize, slot: usize, opts: &CallOpts) -> Result<()> {
        let c = "wait_signal";
        self.ready(c)?;
        self.check_rank(c, "peer_rank", peer_rank)?;
        debug_assert!(slot < self.slots);
        let timeout = self.live.timeout_for(opts)?;
        self.engine
            .wait_signal(peer_rank, slot, opts.stream, timeout)
    }

    /// Where rank `rank`'s registered buffer is mapped in this process (a host address on the
    /// host backend, a device address on CUDA; this rank's: its own buffer). Peers may write
    /// into it at any time: read what a peer put only after a [`Window::wait_signal`] for its
    /// signal.
    pub fn remote_ptr(&self, rank: usize) -> Result<*mut u8> {
        let c = "map_remote_tensor";
        self.ready(c)?;
        self.check_rank(c, "rank", rank)?;
        let p = self.engine.remote(rank).ok_or_else(|| {
            Error::InvalidArgument(format!("{c}: rank {rank}'s buffer is not mapped"))
        })?;
        Ok(p as *mut u8)
    }

    /// How this rank reaches `peer_rank`'s buffer (torchcomms' `get_attr`).
    pub fn access_type(&self, peer_rank: usize) -> Result<AccessType> {
        let c = "get_attr";
        self.ready(c)?;
        self.check_rank(c, "peer_rank", peer_rank)?;
        Ok(AccessType::Unified)
    }

    /// The registered buffer, or why an operation cannot run (finalized or aborted
    /// communicator, nothing registered).
    fn ready(&self, c: &'static str) -> Result<Registered> {
        self.live.check()?;
        self.reg.ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{c}: no buffer is registered in this window (tensor_register first)"
            ))
        })
    }

    fn check_rank(&self, collective: &'static str, what: &'static str, rank: usize) -> Result<()> {
        if rank >= self.size {
            return Err(Error::RankOutOfRange {
                collective,
                what,
                rank,
                size: self.size,
            });
        }
        Ok(())
    }

    /// This rank and the number of ranks.
    pub(crate) fn rank_size(&self) -> (usize, usize) {
        (self.rank, self.size)
    }

    /// The timeout of a call with `opts` (its own, else the communicator's), checked.
    pub(crate) fn timeout_for(&self, opts: &CallOpts) -> Result<std::time::Duration> {
        self.live.timeout_for(opts)
    }
}

impl Drop for Window<'_> {
    fn drop(&mut self) {
        if self.reg.take().is_some() {
            // Without the collective step: this rank's work finishes first (the mappings of
            // peers' memory close after it), errors have nowhere to go.
            let _ = self.engine.quiesce();
            self.engine.release();
        }
    }
}

/// The byte offset and length of a put of `n` elements of `elem` bytes at element `offset`
/// into a buffer of `count` elements, or why it does not fit (checked arithmetic: the offset
/// and length come from the user).
pub(crate) fn put_range(
    count: usize,
    elem: usize,
    offset: usize,
    n: usize,
) -> std::result::Result<(usize, usize), &'static str> {
    let end = offset.checked_add(n).ok_or("overflow the end")?;
    if end > count {
        return Err("end past the end");
    }
    // Within a buffer of `count` elements, which exists: no overflow.
    Ok((offset * elem, n * elem))
}

/// Every rank's (dtype, count) from its registration message.
fn describe_all(c: &'static str, msgs: &[Vec<u8>]) -> Result<Vec<(DataType, usize)>> {
    msgs.iter()
        .enumerate()
        .map(|(r, m)| {
            let bad = || Error::InvalidArgument(format!("{c}: rank {r} sent a malformed message"));
            if m.len() < DESC_BYTES {
                return Err(bad());
            }
            let dtype = DataType::from_code(m[0]).ok_or_else(bad)?;
            let count = u64::from_le_bytes(m[1..DESC_BYTES].try_into().expect("8 bytes"));
            Ok((dtype, usize::try_from(count).map_err(|_| bad())?))
        })
        .collect()
}

/// A rank's outcome of a joint step as [`agree`] takes it, and its own error kept whole.
fn split_outcome(r: Result<Vec<u8>>) -> (std::result::Result<Vec<u8>, String>, Option<Error>) {
    match r {
        Ok(m) => (Ok(m), None),
        Err(e) => (Err(e.to_string()), Some(e)),
    }
}

/// The error of a joint step of `c` that some ranks failed: this rank's own error when it
/// failed, else every failing rank's reason.
fn refused(c: &'static str, own: Option<Error>, failed: &[(usize, String)]) -> Error {
    if let Some(e) = own {
        return e;
    }
    let list: Vec<String> = failed
        .iter()
        .map(|(r, why)| format!("rank {r}: {why}"))
        .collect();
    Error::InvalidArgument(format!("{c} refused on every rank ({})", list.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_put_must_end_inside_the_buffer() {
        assert_eq!(put_range(10, 4, 0, 10), Ok((0, 40)));
        assert_eq!(put_range(10, 4, 7, 3), Ok((28, 12)));
        assert_eq!(put_range(10, 4, 10, 0), Ok((40, 0)));
        assert_eq!(put_range(10, 4, 8, 3), Err("end past the end"));
        assert_eq!(put_range(10, 4, 11, 0), Err("end past the end"));
        assert_eq!(put_range(10, 2, usize::MAX, 2), Err("overflow the end"));
        assert_eq!(put_range(10, 2, 2, usize::MAX - 1), Err("overflow the end"));
    }
}
