//! Windows on the cuda backend: every rank's registered buffer and signal counters are
//! mapped by every peer over CUDA IPC (the direct-access machinery's, `dda::ipc`), and every
//! operation is enqueued on the caller's stream: a put is a `cuMemcpyAsync` into the peer's
//! mapping or a copy kernel ([`plan::put_engine`] chooses by size), a signal and a wait are
//! one-thread kernels of kernels/window.cu. Nothing synchronizes the host, nothing is
//! allocated per call, and the counters live in device memory, so a sequence of puts,
//! signals and waits is capturable in a CUDA graph and counts on at every replay.
//!
//! A rank's signal block (one `cuMemAlloc`, zeroed, shared over IPC): `incoming[world][slots]`
//! (peers add to their row) then `consumed[world][slots]` (this rank's waits count there).
//! A wait that runs past its timeout fills the error record of direct access (the
//! communicator's next call reports it, naming the peer); an abort sets the flag the wait
//! polls.

use std::ffi::c_void;
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::CudaContext;

use super::dda::ipc::{self, Opened, IPC_MSG_BYTES};
use super::dda::Dda;
use crate::backend::WindowBackend;
use crate::config::Config;
use crate::driver::{self, result};
use crate::error::{Error, Result};
use crate::plan::{self, PutEngine};
use crate::types::DataType;

/// Kernel arguments; the same layout as `struct WinArgs` in window.cu.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct WinArgs {
    dst: u64,
    src: u64,
    bytes: u64,
    consumed: u64,
    error: u64,
    abort: u64,
    timeout_ns: u64,
    peer: u32,
    pad_: u32,
}

/// Threads per block of the put kernel (`__launch_bounds__(512)`) and the bytes one thread
/// moves per step of its grid stride.
const PUT_THREADS: u32 = 512;
const PUT_VEC: usize = 16;

/// Bytes of a registration message: the buffer's IPC message, its length, the signal
/// block's IPC message.
const MSG_BYTES: usize = IPC_MSG_BYTES + 8 + IPC_MSG_BYTES;

/// One rank's part of a window on the cuda backend.
pub(crate) struct CudaWindow {
    cuda: Arc<CudaContext>,
    dda: Arc<Dda>,
    config: Arc<Config>,
    device: u32,
    rank: usize,
    world: usize,
    slots: usize,
    /// This rank's signal block, from export to release.
    signals: Option<u64>,
    /// This rank's buffer.
    own: u64,
    /// Every rank's buffer and incoming counters as mapped here, once imported.
    peers: Vec<Peer>,
}

struct Peer {
    buf: u64,
    incoming: u64,
    /// The peer's mappings (none for this rank's own entry).
    _maps: Option<(Opened, Opened)>,
}

// SAFETY: device addresses and driver handles; the context is bound on every thread before
// use, and every operation is an enqueue on the caller's stream.
unsafe impl Send for CudaWindow {}
// SAFETY: as above; `&self` methods only enqueue work.
unsafe impl Sync for CudaWindow {}

impl CudaWindow {
    pub(crate) fn new(
        cuda: Arc<CudaContext>,
        dda: Arc<Dda>,
        config: Arc<Config>,
        device: u32,
        slots: usize,
    ) -> CudaWindow {
        CudaWindow {
            rank: dda.rank,
            world: dda.world,
            cuda,
            dda,
            config,
            device,
            slots,
            signals: None,
            own: 0,
            peers: Vec::new(),
        }
    }

    fn bind(&self) -> Result<()> {
        driver::bind(&self.cuda)
    }

    /// Bytes of one half of the signal block (`world * slots` counters).
    fn counters_bytes(&self) -> usize {
        self.world * self.slots * 8
    }

    /// Byte offset of sender `sender`'s counter `slot` in either half.
    fn counter_off(&self, sender: usize, slot: usize) -> u64 {
        ((sender * self.slots + slot) * 8) as u64
    }

    fn peer(&self, rank: usize) -> Result<&Peer> {
        self.peers.get(rank).ok_or_else(|| {
            Error::InvalidArgument(format!("window: rank {rank}'s buffer is not mapped"))
        })
    }

    /// Launches `name` of window.cu with `a` on `stream` (a plain launch: the window kernels
    /// gain nothing from an early start).
    fn launch(
        &self,
        name: &str,
        blocks: u32,
        threads: u32,
        mut a: WinArgs,
        stream: u64,
    ) -> Result<()> {
        // The window unit is f32's (the kernels move bytes), loaded at start-up where built in
        // or cached.
        let f = self.dda.func(DataType::F32, name)?;
        let mut params: [*mut c_void; 1] = [(&mut a as *mut WinArgs).cast()];
        // SAFETY: the parameters match `name(WinArgs)`; every address in `a` is a live
        // mapping of this window, this rank's signal block or the error page, and `stream` a
        // stream of this context (the caller's); no programmatic dependent launch.
        unsafe {
            driver::launch(f, blocks, threads, stream, &mut params, false, || {
                name.to_string()
            })
        }
    }
}

impl WindowBackend for CudaWindow {
    fn export(&mut self, ptr: u64, bytes: usize) -> Result<Vec<u8>> {
        self.bind()?;
        let c = "tensor_register";
        let d = crate::driver::pointer_device(ptr, c, "the tensor")?;
        if d != self.device {
            return Err(Error::InvalidArgument(format!(
                "{c}: the tensor is memory of cuda:{d}, this communicator serves cuda:{}",
                self.device
            )));
        }
        let buf = ipc::export(ptr, "the tensor").map_err(|e| {
            Error::InvalidArgument(format!(
                "{c}: the tensor's memory cannot be shared with the peers over CUDA IPC ({e}); \
                 windows need memory from cudaMalloc or cuMemAlloc (torch's default caching \
                 allocator), not from cuMemCreate (torch's expandable_segments) or the \
                 stream-ordered pool (cudaMallocAsync)"
            ))
        })?;
        // NOT the async pool: legacy IPC cannot share pool memory.
        let total = 2 * self.counters_bytes();
        let sig = result::mem_alloc(total, "cuMemAlloc (window signals)")?;
        self.signals = Some(sig);
        // Counters start at zero before any peer can add to them (the store exchange that
        // follows orders the peers after this synchronous memset).
        // SAFETY: `sig` holds `total` bytes of this context.
        unsafe { result::memset_d8(sig, 0, total) }?;
        result::ctx_synchronize("cuCtxSynchronize (window signals)")?;
        let counters = ipc::export(sig, "the window signals")?;
        self.own = ptr;
        let mut msg = Vec::with_capacity(MSG_BYTES);
        msg.extend_from_slice(&buf);
        msg.extend_from_slice(&(bytes as u64).to_le_bytes());
        msg.extend_from_slice(&counters);
        Ok(msg)
    }

    fn import(&mut self, msgs: &[Vec<u8>], bytes: usize) -> Result<()> {
        self.bind()?;
        let sig = self
            .signals
            .ok_or_else(|| Error::InvalidArgument("window: nothing exported".into()))?;
        let mut peers = Vec::with_capacity(self.world);
        for (r, m) in msgs.iter().enumerate() {
            if r == self.rank {
                peers.push(Peer {
                    buf: self.own,
                    incoming: sig,
                    _maps: None,
                });
                continue;
            }
            if m.len() != MSG_BYTES {
                return Err(Error::Cuda(format!(
                    "rank {r} sent a malformed window registration ({} bytes)",
                    m.len()
                )));
            }
            let len =
                u64::from_le_bytes(m[IPC_MSG_BYTES..IPC_MSG_BYTES + 8].try_into().expect("8"));
            if len != bytes as u64 {
                return Err(Error::Cuda(format!(
                    "rank {r} registered {len} bytes, this rank {bytes}"
                )));
            }
            let buf = ipc::open(
                &m[..IPC_MSG_BYTES],
                len,
                &format!("rank {r}'s window buffer"),
            )?;
            let counters = ipc::open(
                &m[IPC_MSG_BYTES + 8..],
                self.counters_bytes() as u64,
                &format!("rank {r}'s window signals"),
            )?;
            peers.push(Peer {
                buf: buf.ptr,
                incoming: counters.ptr,
                _maps: Some((buf, counters)),
            });
        }
        self.peers = peers;
        Ok(())
    }

    fn quiesce(&self) -> Result<()> {
        self.bind()?;
        // This rank's puts into peers have landed.
        result::ctx_synchronize("cuCtxSynchronize (window quiesce)")
    }

    fn release(&mut self) {
        if self.bind().is_err() {
            return;
        }
        self.peers.clear();
        if let Some(sig) = self.signals.take() {
            // SAFETY: allocated once by `export`, freed once; its peers have unmapped it or
            // never will use it (set-up failed, or every rank quiesced first). An error at
            // teardown has nowhere to go.
            let _ = unsafe { result::mem_free(sig) };
        }
        self.own = 0;
    }

    fn put(&self, src: u64, bytes: usize, dst: usize, offset: usize, stream: u64) -> Result<()> {
        self.bind()?;
        self.dda.check_error("put")?;
        let d = crate::driver::pointer_device(src, "put", "the tensor")?;
        if d != self.device {
            return Err(Error::InvalidArgument(format!(
                "put: the tensor is memory of cuda:{d}, this communicator serves cuda:{}",
                self.device
            )));
        }
        let target = self.peer(dst)?.buf + offset as u64;
        match plan::put_engine(bytes, &self.config.thresholds) {
            // SAFETY: `target .. target + bytes` lies inside rank `dst`'s mapped buffer (the
            // window checked the range) and `src` holds `bytes` of this device's memory; the
            // copy is ordered on the caller's stream.
            PutEngine::CopyEngine => unsafe {
                result::memcpy_dtod_async(target, src, bytes, stream, "cuMemcpyDtoDAsync (put)")
            },
            PutEngine::Kernel => {
                let per_block = PUT_THREADS as usize * PUT_VEC;
                let blocks = bytes
                    .div_ceil(per_block)
                    .clamp(1, 4 * self.dda.sm_count.max(1) as usize);
                let a = WinArgs {
                    dst: target,
                    src,
                    bytes: bytes as u64,
                    ..Default::default()
                };
                self.launch("fc_win_put", blocks as u32, PUT_THREADS, a, stream)
            }
        }
    }

    fn signal(&self, dst: usize, slot: usize, stream: u64) -> Result<()> {
        self.bind()?;
        self.dda.check_error("signal")?;
        let a = WinArgs {
            dst: self.peer(dst)?.incoming + self.counter_off(self.rank, slot),
            ..Default::default()
        };
        self.launch("fc_win_signal", 1, 32, a, stream)
    }

    fn wait_signal(&self, peer: usize, slot: usize, stream: u64, timeout: Duration) -> Result<()> {
        self.bind()?;
        self.dda.check_error("wait_signal")?;
        let sig = self
            .signals
            .ok_or_else(|| Error::InvalidArgument("window: nothing registered".into()))?;
        let off = self.counter_off(peer, slot);
        let a = WinArgs {
            dst: sig + off,
            consumed: sig + self.counters_bytes() as u64 + off,
            error: self.dda.error_record(),
            abort: self.dda.abort_flag(),
            timeout_ns: self.dda.arm_timeout(timeout),
            peer: peer as u32,
            ..Default::default()
        };
        self.launch("fc_win_wait", 1, 32, a, stream)
    }

    fn remote(&self, rank: usize) -> Option<u64> {
        self.peers.get(rank).map(|p| p.buf)
    }
}

impl Drop for CudaWindow {
    fn drop(&mut self) {
        if self.signals.is_some() {
            self.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn win_args_layout_matches_the_kernel() {
        let src = super::super::kernels::WINDOW_SOURCE;
        assert_eq!(
            std::mem::size_of::<WinArgs>(),
            super::super::dda::c_struct_size(src, "WinArgs")
        );
    }
}
