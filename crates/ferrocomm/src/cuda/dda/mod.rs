//! Direct data access: IPC staging shared by the ranks of one host, mapped by every peer, and
//! everything that runs on it ([`Dda`] and its executors), each call one launch on the caller's
//! stream:
//!
//! - this module: the staging layout, its set-up (allocation, IPC exchange, the peer-write
//!   check), the kernel modules and the arguments every kernel starts from;
//! - `all_reduce`: the push / flat (pulled, streamed, copy engines, LL128) / tree all-reduce;
//! - [`collectives`]: all-gather, reduce-scatter, all-to-all(v), broadcast, reduce, send/recv;
//! - [`lowp`]: their block-scaled low-precision forms;
//! - [`fused_norm`]: the fused all-reduce + residual add + RMSNorm.
//!
//! It imports nothing of the cuda backend above it but the kernel registry and NVML.

use std::collections::HashMap;
use std::ffi::c_void;
use std::time::Duration;

use super::kernels;
use crate::backend::{call_timeout, CommContext};
use crate::bootstrap::{agree, store_barrier};
use crate::config::Config;
use crate::driver::result;
use crate::driver::{self, Function};
use crate::error::{Error, Result};
use crate::plan::DdaCaps;
use crate::types::DataType;

mod all_reduce;
pub mod collectives;
pub(crate) mod fused_norm;
pub(super) mod ipc;
pub(crate) mod lowp;

use all_reduce::CopyEngine;
pub use all_reduce::{ce_chunk, flat_grid};
pub use fused_norm::residual_rmsnorm;
pub use lowp::quantize_on_device;

/// The u32 word of the host-mapped error page that the watcher raises (to the failed peer + 1)
/// when a peer died or gave up: every kernel's wait ends at its next look (`FC_ABORT_WORD`).
const ABORT_WORD: usize = 16;

/// The flight recorder's marks: u64 words after the first 4 KiB of the host-mapped error
/// page, word `record mod MARK_WORDS` holding `record + 1` once a kernel of call `record` ran
/// (`pdl_wait_mark` in all_reduce.cu). A word is overwritten by a call MARK_WORDS records
/// later; a dump then no longer sees the older call's mark and tells its state from the calls
/// after it on its stream instead.
const MARK_WORDS: usize = 4096;
const MARKS_OFF: usize = 4096;
/// Bytes of the host-mapped page: the error record and abort word, then the marks.
const HOST_PAGE_BYTES: usize = MARKS_OFF + MARK_WORDS * 8;

/// The byte offset of the mark of record `record` in the host-mapped page.
fn mark_offset(record: u64) -> usize {
    MARKS_OFF + (record % MARK_WORDS as u64) as usize * 8
}

/// Bytes of a rank's set-up message before its bus id: the IPC message of its staging.
use ipc::IPC_MSG_BYTES;
/// Most ranks the kernels handle (`FC_MAX_RANKS` in all_reduce.cu).
pub const MAX_RANKS: usize = 16;
/// Flag slots per barrier and parity (`FC_MAX_BLOCKS`): the largest grid of flat and tree.
pub const MAX_BLOCKS: usize = 256;
const FLAGS_BYTES: usize = 2 * 2 * MAX_BLOCKS * MAX_RANKS * 4;
const STATE_OFF: usize = FLAGS_BYTES;
const VERIFY_OFF: usize = STATE_OFF + 64;
/// What rank r writes into every peer's verify word r at start-up: VERIFY_MAGIC + r.
const VERIFY_MAGIC: u32 = 0x5eed_0000;
/// The word [`Dda::barrier_word`] all-reduces (local; state bytes 2048..4096 are otherwise
/// unused: the kernels' block epochs end at 1024 + 4 x MAX_BLOCKS).
const BARRIER_WORD_OFF: usize = STATE_OFF + 2048;
/// Hello and payload-barrier words of collectives.cu (written by peers), in the state area.
pub(super) const COLL_HELLO_OFF: usize = STATE_OFF + 4096;
pub(super) const COLL_BAR_OFF: usize = STATE_OFF + 8192;
const STATE_BYTES: usize = 8192 + 2 * COLL_MAX_ROUNDS * MAX_BLOCKS * MAX_RANKS * 8;
pub(super) use crate::plan::COLL_MAX_ROUNDS;
/// Warps per block of the flat kernel (`FC_FLAT_WARPS`): each warp is one pipeline.
const FLAT_WARPS: usize = 16;
/// Chunk flags of the push-write stream kernel (flat beyond the staging): u64 [data, ack][2 parities][blocks x warps][ranks].
const CFLAGS_OFF: usize = STATE_OFF + STATE_BYTES;
const CFLAGS_BYTES: usize = 2 * 2 * MAX_BLOCKS * FLAT_WARPS * MAX_RANKS * 8;
/// Chunk slots per (warp, sender) in flat (`FC_FLAT_SLOTS`): double buffering.
const FLAT_SLOTS: usize = 2;
/// Smallest and largest flat chunk of one warp: a small message spreads over warps of at least
/// 512 bytes (one 16-byte vector per lane), a large one streams in chunks of at most 8 KiB.
const FLAT_MIN_CHUNK: usize = 512;
const FLAT_MAX_CHUNK: usize = 8 << 10;
/// The copy-engine all-reduce's words (`CE_*` in all_reduce.cu) in the state area, after the
/// barrier word: SEQ, LAST, ARRIVED, DONE, then the chunk flags from word 16: 320 bytes, inside
/// the state area's free 2048..4096.
const CE_WORDS_OFF: usize = STATE_OFF + 3072;
const CE_SEQ_WORD: usize = 0;
const CE_FLAGS_WORD: usize = 16;
/// Most chunks of one copy-engine all-reduce (`FC_CE_MAX_CHUNKS`), and the chunk sizes it aims
/// at: about eight chunks (the first arrives while the rest are in flight), at least 1 MiB each
/// (each costs two copies).
pub const CE_MAX_CHUNKS: usize = 64;
const CE_TARGET_CHUNKS: usize = 8;
const CE_MIN_CHUNK: usize = 1 << 20;
// The words sit after the barrier word, inside the state area's free bytes 2048..4096.
const _: () = assert!(
    CE_WORDS_OFF >= BARRIER_WORD_OFF + 16
        && CE_WORDS_OFF + 4 * (CE_FLAGS_WORD + CE_MAX_CHUNKS) <= STATE_OFF + 4096
);
/// Threads per block of the copy-engine reduction (one block per SM): its blocks spin until
/// their chunks land, and a copy between two buffers of one GPU (ranks sharing a GPU) runs as a
/// kernel that needs room beside them, which blocks of more threads left none of
/// (docs/tuning.md, "Where the built-in limits come from").
const CE_THREADS: u32 = 256;
/// Largest push payload per rank (LL lines double it, and every rank holds every sender's).
const PUSH_CAP_MAX: usize = 512 << 10;

/// Where a peer's staging starts in this process's mapping of the peer's allocation (mapped
/// at `mapped`, `size` bytes long): at the offset `off` the peer sent, when the `total` bytes
/// of a staging from there lie inside the allocation; `None` otherwise (a corrupt or forged
/// offset would make every access through the mapping stray outside it).
pub(crate) fn peer_staging(mapped: u64, size: u64, off: u64, total: u64) -> Option<u64> {
    let end = off.checked_add(total)?;
    if end > size {
        return None;
    }
    mapped.checked_add(off)
}

fn round_up(n: usize, a: usize) -> usize {
    n.div_ceil(a) * a
}

/// Where everything sits in one rank's IPC allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagingLayout {
    /// Offset of the push region: two parities of a slot per sender, each `push_cap` of payload in
    /// LL lines (twice its bytes).
    pub push_off: usize,
    /// Payload bytes per sender of one push parity.
    pub push_cap: usize,
    /// Largest part the collectives send in LL lines (`FERROCOMM_LL_MAX_BYTES`, else the tuning
    /// table's `ll.max_part_bytes`; at most
    /// `push_cap`).
    pub ll_max: usize,
    /// Offset of the staging's two parities.
    pub staging_off: usize,
    /// Bytes of one staging parity (the largest flat/tree message per rank).
    pub staging_bytes: usize,
    /// The copy-engine all-reduce's receive region (`FERROCOMM_ALLREDUCE_CE_MIN_BYTES`; two
    /// ranks only): `ce_bytes` (0: off) after the staging's two parities.
    pub ce_off: usize,
    /// Bytes of the copy-engine receive region (one staging parity when on, 0 when off).
    pub ce_bytes: usize,
    /// The LL128 all-reduce's lines (`FERROCOMM_ALLREDUCE_LL128_MAX_BYTES`): at `ll128_off`, two
    /// parities of `world - 1` rows (one per peer) of `ll128_row` bytes, the lines of
    /// `ll128_cap` payload bytes (0: off).
    pub ll128_off: usize,
    /// Bytes of LL128 payload per row (0: off).
    pub ll128_cap: usize,
    /// Bytes of one LL128 row: the lines of `ll128_cap`, flags included, rounded up to 4 KiB.
    pub ll128_row: usize,
    /// Bytes of the whole allocation, from offset 0 to the end of the LL128 rows.
    pub total: usize,
}

/// Payload bytes of one LL128 line (`LL128_WORDS` 8-byte words; the 16th is the flag).
pub const LL128_PAYLOAD: usize = 15 * 8;
/// Threads per block of the LL128 kernel, and blocks per SM (its `__launch_bounds__(512, 2)`
/// keeps it within 64 registers, so two are resident): 1024 threads an SM, as in the SM copy
/// kernel that carried the link's bandwidth each way (docs/tuning.md, "Where the built-in limits come from").
const LL128_THREADS: u32 = 512;
const LL128_BLOCKS_PER_SM: usize = 2;

/// Bytes of the LL128 lines that carry `bytes` of payload (whole 128-byte lines).
pub fn ll128_line_bytes(bytes: usize) -> usize {
    bytes.div_ceil(LL128_PAYLOAD) * 128
}

/// Largest message (bytes per rank) the push kernel takes.
pub fn push_capacity(cfg: &Config) -> usize {
    round_up(PUSH_CAP_MAX.min(cfg.cuda_staging_bytes.max(16)), 16)
}

/// The allocation layout for `world` ranks under `cfg`.
pub fn staging_layout(cfg: &Config, world: usize) -> StagingLayout {
    let push_cap = push_capacity(cfg);
    let push_off = CFLAGS_OFF + CFLAGS_BYTES;
    let push_bytes = 2 * world * 2 * push_cap;
    let staging_off = round_up(push_off + push_bytes, 4096);
    // At least one flat block's slots for 16 ranks (16 warps x 16 senders x 2 slots x 16 B).
    let staging_bytes = round_up(cfg.cuda_staging_bytes.max(8192), 4096);
    let ce_on = world == 2 && cfg.thresholds.ce_min.is_some_and(|m| m > 0);
    let ce_bytes = if ce_on { staging_bytes } else { 0 };
    let ce_off = staging_off + 2 * staging_bytes;
    // LL128 rows: whole lines of at most the staging's payload, 4 KiB apart.
    let ll128_cap = match cfg.thresholds.ll128_max {
        Some(m) if world >= 2 => round_up(m.min(staging_bytes), 8),
        _ => 0,
    };
    let ll128_row = round_up(ll128_line_bytes(ll128_cap), 4096);
    let ll128_off = ce_off + ce_bytes;
    StagingLayout {
        push_off,
        push_cap,
        ll_max: cfg
            .thresholds
            .ll_max
            .unwrap_or(cfg.tuning.ll_max_bytes)
            .min(push_cap),
        staging_off,
        staging_bytes,
        ce_off,
        ce_bytes,
        ll128_off,
        ll128_cap,
        ll128_row,
        total: ll128_off + 2 * (world.max(1) - 1) * ll128_row,
    }
}

/// What direct access has for `world` ranks under `cfg`, for the planner: the staging
/// layout's sizes, the copy engines' smallest all-reduce where they are set up (`ce_min`), the
/// NVLink verdict that LL128 lines need. A communicator reports its own (`Dda::caps`, after its
/// start-up checks); `ferrocomm info` plans from the configuration with this.
pub fn dda_caps(cfg: &Config, world: usize, ce_min: Option<usize>, ll128_links: bool) -> DdaCaps {
    let layout = staging_layout(cfg, world);
    DdaCaps {
        staging_bytes: layout.staging_bytes,
        push_cap: layout.push_cap,
        ce_bytes: layout.ce_bytes,
        ce_min: ce_min.filter(|_| layout.ce_bytes > 0),
        ll128_cap: layout.ll128_cap,
        ll128_links,
        ll_max: layout.ll_max,
        a2av_lp: crate::plan::a2av_lp_fits(cfg, layout.staging_bytes),
    }
}

/// Kernel arguments; the same layout as `struct Args` in all_reduce.cu.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct Args {
    staging: [u64; MAX_RANKS],
    push: [u64; MAX_RANKS],
    flags: [u64; MAX_RANKS],
    state: u64,
    error: u64,
    input: u64,
    output: u64,
    count: u64,
    staging_bytes: u64,
    push_cap: u64,
    timeout_ns: u64,
    pub(super) int_div: i64,
    pub(super) pre: f32,
    pub(super) post_div: f32,
    rank: u32,
    world: u32,
    pub(super) has_pre: u32,
    pub(super) has_div: u32,
    chunk_bytes: u64,
    cflag_off: u64,
    hello_off: u64,
    pub(super) sig: u32,
    pad_: u32,
    ce_words_off: u64,
    ll128_off: u64,
    ll128_row: u64,
    /// The flight recorder's mark: the host-mapped word the call's kernels write `mark_id`
    /// to once they run (0: none), see [`Dda::began`].
    mark: u64,
    mark_id: u64,
}

impl Args {
    /// Runs a one-rank communicator's kernel as one of `world` ranks whose every peer is this
    /// rank itself (its staging read as each peer's): the local traffic of a `world`-rank
    /// kernel on one GPU, for measurement only (the kernels that take it skip their barriers;
    /// results are not the call's).
    pub(super) fn loopback(&mut self, world: u32) {
        let own = self.staging[self.rank as usize];
        self.world = world;
        for s in self.staging.iter_mut().take(world as usize) {
            *s = own;
        }
    }

    /// Arguments for a kernel that uses no staging or flags (the standalone encoder).
    pub(super) fn standalone(input: u64, output: u64, count: u64) -> Args {
        Args {
            staging: [0; MAX_RANKS],
            push: [0; MAX_RANKS],
            flags: [0; MAX_RANKS],
            state: 0,
            error: 0,
            input,
            output,
            count,
            staging_bytes: 0,
            push_cap: 0,
            timeout_ns: 0,
            int_div: 1,
            pre: 1.0,
            post_div: 1.0,
            rank: 0,
            world: 1,
            has_pre: 0,
            has_div: 0,
            chunk_bytes: 0,
            cflag_off: 0,
            hello_off: 0,
            sig: 0,
            pad_: 0,
            ce_words_off: 0,
            ll128_off: 0,
            ll128_row: 0,
            mark: 0,
            mark_id: 0,
        }
    }
}

/// One kernel unit's module (a group of entry points of one element type).
struct Module {
    /// Held so that its functions stay valid (unloaded when the `Dda` goes).
    _module: driver::Module,
    funcs: HashMap<String, Function>,
    /// CTAs of 512 threads per SM of each low-precision kernel (their grids are one wave).
    lp_per_sm: HashMap<&'static str, u32>,
}

/// The kernel units of this device: loaded at start-up where their code is at hand (built in
/// or cached), the others at the first call that needs one (compiled then, that unit alone).
struct Units {
    arch: String,
    cfg: Config,
    /// `cells[variant * Group::ALL.len() + group.index()]`.
    cells: Vec<std::sync::OnceLock<Module>>,
    /// One load at a time (a compile takes seconds: others wait for it instead of repeating it).
    loading: std::sync::Mutex<()>,
}

impl Units {
    fn new(cfg: &Config, arch: &str) -> Units {
        let n = kernels::VARIANTS.len() * kernels::Group::ALL.len();
        Units {
            arch: arch.into(),
            cfg: cfg.clone(),
            cells: (0..n).map(|_| std::sync::OnceLock::new()).collect(),
            loading: std::sync::Mutex::new(()),
        }
    }

    fn cell(&self, dtype: DataType, group: kernels::Group) -> Option<&std::sync::OnceLock<Module>> {
        let v = kernels::variant_index(dtype)?;
        self.cells
            .get(v * kernels::Group::ALL.len() + group.index())
    }

    /// The module of `dtype`'s unit of `group`, loaded now if it is not yet (compiled first
    /// where needed; `ready_only`: not compiled, `None` then). The context must be current.
    fn module(
        &self,
        dtype: DataType,
        group: kernels::Group,
        ready_only: bool,
    ) -> Result<Option<&Module>> {
        let cell = self.cell(dtype, group).ok_or_else(|| Error::Unsupported {
            collective: "direct access",
            backend: "cuda",
            what: format!("kernels for {dtype}"),
        })?;
        if let Some(m) = cell.get() {
            return Ok(Some(m));
        }
        let _one = self.loading.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = cell.get() {
            return Ok(Some(m));
        }
        let Some(unit) = kernels::load_unit(dtype, group, &self.arch, &self.cfg, ready_only)?
        else {
            return Ok(None);
        };
        if self.cfg.debug {
            eprintln!(
                "ferrocomm: {dtype} {} kernels for {}: {}",
                group.name(),
                self.arch,
                unit.source
            );
        }
        // A module whose functions are not all there is unloaded as it drops here.
        let m = module_functions(dtype, group, unit.module)?;
        Ok(Some(cell.get_or_init(|| m)))
    }
}

/// A kernel name assembled from `parts` in `buf`: launches look their kernel up by name on every
/// call, and this keeps the heap out of it.
pub(super) fn kernel_name<'a>(buf: &'a mut [u8; 64], parts: &[&str]) -> &'a str {
    let mut len = 0;
    for p in parts {
        buf[len..len + p.len()].copy_from_slice(p.as_bytes());
        len += p.len();
    }
    std::str::from_utf8(&buf[..len]).expect("kernel names are ASCII")
}

/// One rank's DDA resources.
pub struct Dda {
    pub(super) rank: usize,
    pub(super) world: usize,
    layout: StagingLayout,
    own: u64,
    /// Every rank's allocation base as mapped here (own included).
    bases: Vec<u64>,
    opened: Vec<ipc::Opened>,
    /// Kernels are launched with programmatic dependent launch (`FERROCOMM_PDL`, sm_90).
    pub(super) pdl: bool,
    pub(super) error_host: *mut u32,
    error_dev: u64,
    units: Units,
    pub(super) sm_count: u32,
    pub(super) timeout: Duration,
    /// The timeout the latest kernel was launched with, in nanoseconds: what a timeout record
    /// found by a later call reports (the record does not say).
    kernel_timeout_ns: std::sync::atomic::AtomicU64,
    /// `FERROCOMM_DEBUG`: a kernel's timeout record is printed whole (peer, phase, block), once
    /// (the record is sticky: every later call finds it again).
    debug: bool,
    timeout_shown: std::sync::atomic::AtomicBool,
    /// The copy-engine all-reduce (`FERROCOMM_ALLREDUCE_CE_MIN_BYTES`), when on.
    ce: Option<CopyEngine>,
    /// The LL128 all-reduce runs: set (`FERROCOMM_ALLREDUCE_LL128_MAX_BYTES`) and every pair
    /// of ranks on one GPU or joined by NVLink (agreed by every rank at set-up).
    ll128_on: bool,
    /// What the planner is told ([`Dda::caps`]), from the layout, the copy engine and the LL128
    /// verdict.
    caps: DdaCaps,
    /// The peer whose failure raised the abort word, + 1 (0: none).
    aborted_by: std::sync::atomic::AtomicU64,
}

// SAFETY: the raw pointers are device addresses and a pinned host page owned by this struct;
// the backend serialises every use behind its call lock.
unsafe impl Send for Dda {}
// SAFETY: as above.
unsafe impl Sync for Dda {}

impl Dda {
    /// Allocates and zeroes this rank's staging, exchanges IPC handles through the store, opens
    /// every peer's allocation once, loads the kernels and proves that peer writes land.
    /// The context of `ctx.device` must be current on this thread.
    ///
    /// Every rank ends with the same outcome: a rank whose part fails (kernels, allocation,
    /// opening a peer's memory, the peer-write check) still reports at each exchange, so its
    /// peers drop direct access too (and NCCL carries the communicator on every rank) instead
    /// of launching kernels that wait for it.
    pub fn new(ctx: &CommContext, arch: &str, sm_count: u32) -> Result<Dda> {
        let (rank, world, t) = (ctx.rank, ctx.size, ctx.timeout());
        let store = &*ctx.store;
        let prepared = Self::prepare(ctx, arch, sm_count);
        let local = match &prepared {
            Ok((_, msg)) => Ok(msg.clone()),
            Err(e) => Err(e.to_string()),
        };
        let handles = match agree(store, "dda/ipc", rank, world, local, t)? {
            Ok(h) => h,
            // The same message on every rank, except that a library missing here stays that
            // error on this rank.
            Err(failed) => {
                return Err(match prepared {
                    Err(e @ Error::LibraryMissing { .. }) => e,
                    _ => peers_failed(&failed),
                })
            }
        };
        let (mut me, _) = prepared?;
        let wrote = me.open_peers(&handles).and_then(|()| me.write_to_peers());
        // Every rank has written (or given up) before any rank reads what arrived.
        store_barrier(store, "dda/verify", world, t)?;
        let checked = wrote.and_then(|()| me.check_peer_writes());
        // The LL128 lines' links, judged by each rank for its own peers; every rank's verdict
        // travels with its report, so all run LL128 or none does.
        let links = me.ll128_links(&handles);
        let local = checked
            .map(|()| vec![u8::from(links.is_ok())])
            .map_err(|e| e.to_string());
        // Also the barrier after which everyone has read its words and collectives may start.
        match agree(store, "dda/verified", rank, world, local, t)? {
            Ok(verdicts) => {
                me.ll128_on = me.layout.ll128_cap > 0 && verdicts.iter().all(|v| v == &[1]);
                if me.layout.ll128_cap > 0 && !me.ll128_on {
                    let why = match links {
                        Err(e) => e,
                        Ok(()) => {
                            let r = verdicts.iter().position(|v| v != &[1]).unwrap_or(0);
                            format!("rank {r} could not show NVLink to all its peers")
                        }
                    };
                    eprintln!(
                        "ferrocomm: rank {rank}: FERROCOMM_ALLREDUCE_LL128_MAX_BYTES is set but \
                         the LL128 all-reduce stays off ({why}); flat all-reduces pull"
                    );
                }
                let ce_min = me.ce.as_ref().map(|ce| ce.min_bytes);
                me.caps = dda_caps(&ctx.config, world, ce_min, me.ll128_on);
                Ok(me)
            }
            Err(failed) => Err(peers_failed(&failed)),
        }
    }

    /// This rank's part before any exchange: kernels, the zeroed staging and error page, and
    /// the message its peers need to open the staging (IPC handle of the allocation, offset).
    fn prepare(ctx: &CommContext, arch: &str, sm_count: u32) -> Result<(Dda, Vec<u8>)> {
        let (rank, world) = (ctx.rank, ctx.size);
        if world > MAX_RANKS {
            return Err(Error::Unsupported {
                collective: "init",
                backend: "cuda",
                what: format!("direct access for {world} ranks (at most {MAX_RANKS})"),
            });
        }
        let layout = staging_layout(&ctx.config, world);

        // Kernels first: loading them (or compiling what is missing) needs no peer.
        let units = load_units(&ctx.config, arch)?;
        let pdl = driver::pdl_for_current_device(&ctx.config)?;

        // Owned by `me` from here on, so that Drop frees whatever was allocated when a later
        // step fails (and skips what was not).
        let mut me = Dda {
            rank,
            world,
            layout,
            own: 0,
            bases: vec![0; world],
            opened: Vec::new(),
            pdl,
            error_host: std::ptr::null_mut(),
            error_dev: 0,
            units,
            sm_count,
            timeout: ctx.timeout(),
            kernel_timeout_ns: std::sync::atomic::AtomicU64::new(0),
            debug: ctx.config.debug,
            timeout_shown: std::sync::atomic::AtomicBool::new(false),
            ce: None,
            ll128_on: false,
            caps: dda_caps(&ctx.config, world, None, false),
            aborted_by: std::sync::atomic::AtomicU64::new(0),
        };
        if layout.ce_bytes > 0 {
            let min = ctx.config.thresholds.ce_min.unwrap_or(0);
            me.ce = Some(CopyEngine::new(min)?);
        }
        // NOT the async pool (stream.alloc): legacy IPC cannot share pool memory.
        me.own = result::mem_alloc(layout.total, "cuMemAlloc (DDA staging)")?;
        // Flags, epochs and LL lines start at zero: epoch 1 is the first call (docs/design.md, rule 5: sentinel
        // state initialised before first use; the store exchange below orders it).
        // SAFETY: `own` holds `layout.total` bytes.
        unsafe { result::memset_d8(me.own, 0, layout.total) }?;
        // Pinned, device-mapped host memory: the error record, the abort word, the marks.
        let error_host =
            result::mem_host_alloc_mapped(HOST_PAGE_BYTES, "cuMemHostAlloc (error record)")?;
        me.error_host = error_host.cast();
        // SAFETY: the page was just allocated with HOST_PAGE_BYTES bytes.
        unsafe { std::ptr::write_bytes(error_host.cast::<u8>(), 0, HOST_PAGE_BYTES) };
        // SAFETY: `error_host` is a mapped pinned allocation.
        me.error_dev = unsafe { result::mem_host_get_device_pointer(error_host) }?;
        me.bases[rank] = me.own;
        // Synchronous context-wide wait so the memset is done before peers write.
        result::ctx_synchronize("cuCtxSynchronize")?;

        // docs/design.md, rule 7: share the allocation base plus the offset of our buffer inside it.
        let mut msg = Vec::with_capacity(IPC_MSG_BYTES + 16);
        msg.extend_from_slice(&ipc::export(me.own, "the DDA staging")?);
        if layout.ll128_cap > 0 {
            // The LL128 all-reduce's link check needs every GPU's bus id, after the handle (an
            // unknown one is empty: no link can be shown, so it stays off).
            if let Ok(dev) = result::ctx_get_device() {
                msg.extend_from_slice(super::nvml::pci_bus_id(dev).unwrap_or_default().as_bytes());
            }
        }
        Ok((me, msg))
    }

    /// Whether this rank's links to its peers carry LL128 lines (every peer on this GPU or
    /// joined to it by NVLink; every rank's bus id follows its handle in the set-up messages);
    /// `Ok` when the LL128 all-reduce is not set.
    fn ll128_links(&self, handles: &[Vec<u8>]) -> std::result::Result<(), String> {
        if self.layout.ll128_cap == 0 {
            return Ok(());
        }
        let bus =
            |m: &Vec<u8>| String::from_utf8_lossy(&m[IPC_MSG_BYTES.min(m.len())..]).into_owned();
        let own = bus(&handles[self.rank]);
        if own.is_empty() {
            return Err("this GPU's PCI bus id is unknown".into());
        }
        let peers: Vec<(usize, String)> = handles
            .iter()
            .enumerate()
            .filter(|(r, _)| *r != self.rank)
            .map(|(r, m)| (r, bus(m)))
            .collect();
        super::nvml::ll128_links(&own, &peers, super::nvml::nvlink_between)
    }

    /// Opens every peer's staging from the messages of [`Dda::prepare`], once per peer.
    fn open_peers(&mut self, handles: &[Vec<u8>]) -> Result<()> {
        for (peer, m) in handles.iter().enumerate() {
            if peer == self.rank {
                continue;
            }
            let who = format!("rank {peer}'s staging");
            let opened = ipc::open(m, self.layout.total as u64, &who)?;
            self.bases[peer] = opened.ptr;
            self.opened.push(opened);
        }
        Ok(())
    }

    /// The peer-write check, first half: a kernel writes this rank's word into every peer's
    /// memory through the mappings (drivers can claim P2P falsely, docs/design.md rule 7).
    fn write_to_peers(&self) -> Result<()> {
        let f = self.func(DataType::F32, "fc_verify_write")?;
        let mut a = self.base_args(0, 0, 0);
        let mut m = VERIFY_MAGIC;
        let mut off = VERIFY_OFF as u64;
        let mut params: [*mut c_void; 3] = [
            (&mut a as *mut Args).cast(),
            (&mut m as *mut u32).cast(),
            (&mut off as *mut u64).cast(),
        ];
        // SAFETY: the parameters match fc_verify_write(Args, u32, u64); stream 0 is legacy.
        // A plain launch: a synchronize follows, so there is nothing to overlap, and start-up
        // never depends on programmatic launch.
        unsafe {
            driver::launch(f, 1, 32, 0, &mut params, false, || {
                "launching the peer-write check".into()
            })
        }?;
        result::ctx_synchronize("peer-write check")
    }

    /// The second half, after every rank wrote: each peer's word arrived in this GPU's memory.
    fn check_peer_writes(&self) -> Result<()> {
        let mut got = [0u32; MAX_RANKS];
        // SAFETY: reads `world` u32 of our own allocation into a large enough buffer.
        unsafe {
            result::memcpy_dtoh(
                got.as_mut_ptr().cast(),
                self.own + VERIFY_OFF as u64,
                4 * self.world,
                "reading the peer-write check",
            )
        }?;
        for (peer, v) in got.iter().take(self.world).enumerate() {
            let want = VERIFY_MAGIC + peer as u32;
            if *v != want {
                return Err(Error::Cuda(format!(
                    "a value rank {peer} wrote into this GPU's memory over the peer mapping \
                     never arrived (read {v:#x}, expected {want:#x}); peer-to-peer access does \
                     not work between these GPUs"
                )));
            }
        }
        Ok(())
    }

    pub fn layout(&self) -> StagingLayout {
        self.layout
    }

    /// What `get` finds about kernel `name` in the module of `dtype`, or the error naming it.
    fn kernel_entry<T>(
        &self,
        dtype: DataType,
        name: &str,
        collective: &'static str,
        get: impl FnOnce(&Module) -> Option<T>,
    ) -> Result<T> {
        let group = kernels::group_of(name).ok_or_else(|| Error::Unsupported {
            collective,
            backend: "cuda",
            what: format!("kernel {name} (no such entry point)"),
        })?;
        self.units
            .module(dtype, group, false)?
            .and_then(get)
            .ok_or_else(|| Error::Unsupported {
                collective,
                backend: "cuda",
                what: format!("kernel {name} for {dtype}"),
            })
    }

    pub(super) fn func(&self, dtype: DataType, name: &str) -> Result<Function> {
        self.kernel_entry(dtype, name, "direct access", |m| m.funcs.get(name).copied())
    }

    /// CTAs of the low-precision kernel `name` that run at once on this GPU (one wave): a CTA
    /// that waits for its peers' same-index CTAs must never wait behind CTAs of its own grid that
    /// cannot start. Every rank computes the same number (same kernel, same GPU model), so
    /// tile-to-CTA maps agree. Measured once, when the module is loaded.
    pub(super) fn lp_wave(&self, dtype: DataType, name: &str) -> Result<u32> {
        let per_sm = self.kernel_entry(dtype, name, "low precision", |m| {
            m.lp_per_sm.get(name).copied()
        })?;
        Ok((self.sm_count.max(1) * per_sm).min(MAX_BLOCKS as u32))
    }

    pub(super) fn base_args(&self, input: u64, output: u64, count: u64) -> Args {
        // The running call's timeout: a kernel that waits longer for a peer gives up.
        let timeout_ns = call_timeout(self.timeout).as_nanos().min(u64::MAX as u128) as u64;
        self.kernel_timeout_ns
            .store(timeout_ns, std::sync::atomic::Ordering::Relaxed);
        let mut a = Args {
            staging: [0; MAX_RANKS],
            push: [0; MAX_RANKS],
            flags: [0; MAX_RANKS],
            state: self.own + STATE_OFF as u64,
            error: self.error_dev,
            input,
            output,
            count,
            staging_bytes: self.layout.staging_bytes as u64,
            push_cap: self.layout.push_cap as u64,
            timeout_ns,
            int_div: 1,
            pre: 1.0,
            post_div: 1.0,
            rank: self.rank as u32,
            world: self.world as u32,
            has_pre: 0,
            has_div: 0,
            chunk_bytes: 0,
            cflag_off: CFLAGS_OFF as u64,
            hello_off: COLL_HELLO_OFF as u64,
            sig: 0,
            pad_: 0,
            ce_words_off: CE_WORDS_OFF as u64,
            ll128_off: self.layout.ll128_off as u64,
            ll128_row: self.layout.ll128_row as u64,
            mark: 0,
            mark_id: 0,
        };
        if let Some(record) = crate::backend::call_mark() {
            // Word `record mod MARK_WORDS` of the error page's tail; `record + 1`, so that a
            // word never written (0) names no call.
            a.mark = self.error_dev + mark_offset(record) as u64;
            a.mark_id = record + 1;
            crate::backend::note_marked();
        }
        for (r, b) in self.bases.iter().enumerate() {
            a.flags[r] = *b;
            a.push[r] = *b + self.layout.push_off as u64;
            a.staging[r] = *b + self.layout.staging_off as u64;
        }
        a
    }

    /// Ends every kernel's wait of this communicator, running or to come, because `peer`
    /// died or gave up: raises the abort word the kernels poll beside their timeout. Called
    /// by the watcher's thread, without the call lock.
    pub fn raise_abort(&self, peer: usize) {
        let _ = self.aborted_by.compare_exchange(
            0,
            peer as u64 + 1,
            std::sync::atomic::Ordering::AcqRel,
            std::sync::atomic::Ordering::Relaxed,
        );
        // SAFETY: the page stays mapped for our lifetime and holds 1024 words; kernels only read
        // this one (a volatile store from the host reaches their uncached loads).
        unsafe {
            std::ptr::write_volatile(
                self.error_host.add(ABORT_WORD),
                (peer as u32).saturating_add(1),
            )
        };
    }

    /// The timeout a kernel recorded, if any (sticky: the communicator is unusable after one),
    /// or the peer whose failure raised the abort word.
    pub fn check_error(&self, collective: &'static str) -> Result<()> {
        let by = self.aborted_by.load(std::sync::atomic::Ordering::Acquire);
        if by != 0 {
            return Err(Error::PeerFailed {
                collective,
                rank: self.rank,
                peer: by as usize - 1,
            });
        }
        // SAFETY: the host page stays mapped for our lifetime; the kernel writes word 0 last.
        let w = unsafe { std::ptr::read_volatile(self.error_host) };
        if w == 0 {
            return Ok(());
        }
        if w != 1 {
            // Bad input found by collectives.cu (not sticky).
            return self.take_input_error(collective, w);
        }
        // SAFETY: as above, words 1..3.
        let [peer, phase, block] =
            [1, 2, 3].map(|i| unsafe { std::ptr::read_volatile(self.error_host.add(i)) });
        if self.debug
            && !self
                .timeout_shown
                .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            eprintln!(
                "ferrocomm: rank {} {collective}: a kernel's wait for rank {peer}: Timed out \
                 (phase {phase}, block {block})",
                self.rank
            );
        }
        let peer = peer as usize;
        Err(Error::Timeout {
            collective,
            rank: self.rank,
            missing: peer,
            timeout: match self
                .kernel_timeout_ns
                .load(std::sync::atomic::Ordering::Relaxed)
            {
                0 => self.timeout,
                ns => Duration::from_nanos(ns),
            },
        })
    }

    /// Tells this rank's kernels (every wait, the windows' `fc_win_wait` too) that the
    /// communicator was aborted: they end at their next look. The abort word then names this
    /// rank (a peer's failure, [`Dda::raise_abort`], names the peer, and is kept).
    pub fn set_aborted(&self) {
        // SAFETY: the host page stays mapped for our lifetime; word ABORT_WORD is this flag's
        // (read by the kernels only).
        unsafe {
            let w = self.error_host.add(ABORT_WORD);
            if std::ptr::read_volatile(w) == 0 {
                std::ptr::write_volatile(w, (self.rank as u32).saturating_add(1));
            }
        }
    }

    /// Whether a kernel of the call with flight-recorder record id `record` has run past its
    /// grid dependency (its mark is in the host page), which also says that every operation
    /// before it on its stream had completed. False too when a call `MARK_WORDS` records
    /// later took the word.
    pub fn began(&self, record: u64) -> bool {
        // SAFETY: the host page stays mapped for our lifetime and holds the marks at
        // mark_offset (aligned u64 words, written by kernels only).
        let w = unsafe {
            std::ptr::read_volatile(
                self.error_host
                    .cast::<u8>()
                    .add(mark_offset(record))
                    .cast::<u64>(),
            )
        };
        w == record.wrapping_add(1)
    }

    /// The device address of the abort word ([`Dda::set_aborted`], [`Dda::raise_abort`]).
    pub(in crate::cuda) fn abort_flag(&self) -> u64 {
        self.error_dev + 4 * ABORT_WORD as u64
    }

    /// The device address of the error record the kernels fill ([`Dda::check_error`] reads it).
    pub(in crate::cuda) fn error_record(&self) -> u64 {
        self.error_dev
    }

    /// `t` in nanoseconds for a kernel that waits for a peer, noted for the report of its
    /// timeout (as [`Dda::base_args`] does for the collectives).
    pub(in crate::cuda) fn arm_timeout(&self, t: Duration) -> u64 {
        let ns = t.as_nanos().min(u64::MAX as u128) as u64;
        self.kernel_timeout_ns
            .store(ns, std::sync::atomic::Ordering::Relaxed);
        ns
    }

    /// What direct access has on this communicator, for the planner: computed once, when the
    /// set-up checks have decided it.
    pub fn caps(&self) -> DdaCaps {
        self.caps
    }

    /// A device word of this rank's own (16-byte aligned) for the backend's barrier: a push
    /// all-reduce of it with Max meets every rank and leaves its value as it was.
    pub fn barrier_word(&self) -> u64 {
        self.own + BARRIER_WORD_OFF as u64
    }
}

impl Drop for Dda {
    fn drop(&mut self) {
        // The copy stream drains first: its copies write into the peers' memory, whose mappings
        // close next. Errors at teardown are ignored because nothing can act on them.
        if let Some(ce) = &self.ce {
            let _ = ce.stream.synchronize("copy stream at teardown");
        }
        // The peers' mappings close as their last user drops (a window may still map the same
        // allocation).
        self.opened.clear();
        // SAFETY: each pointer was allocated exactly once by `new` (null when set-up failed
        // before allocating it) and nothing uses it after the communicator.
        unsafe {
            if self.own != 0 {
                let _ = result::mem_free(self.own);
            }
            if !self.error_host.is_null() {
                let _ = result::mem_free_host(self.error_host.cast());
            }
        }
    }
}

/// The size in bytes of `struct name` in a kernel source, from its fields (`u64`, `i64`, `u32`,
/// `i32`, `float`, arrays of a number or `FC_MAX_RANKS`), laid out as C does: every field at a
/// multiple of its size, the whole padded to its widest. The Rust mirrors of the kernels'
/// argument structs are passed by value into the launch: their tests compare `size_of` with this,
/// so a field added on one side only fails a test instead of shifting every later argument.
#[cfg(test)]
pub(super) fn c_struct_size(src: &str, name: &str) -> usize {
    let head = format!("struct {name} {{");
    let body = &src[src.find(&head).expect("struct in source") + head.len()..];
    let body = &body[..body.find("};").expect("end of struct")];
    let (mut at, mut widest) = (0usize, 1usize);
    for line in body.lines() {
        let decl = line.split("//").next().unwrap().trim();
        if decl.is_empty() {
            continue;
        }
        let decl = decl.strip_suffix(';').expect("one field per line");
        let (ty, field) = decl.split_once(' ').expect("type and name");
        let size = match ty {
            "u64" | "i64" => 8,
            "u32" | "i32" | "float" => 4,
            other => panic!("field type {other} in struct {name}"),
        };
        let count = match field.trim().split_once('[') {
            None => 1,
            Some((_, n)) => match n.trim_end_matches(']') {
                "FC_MAX_RANKS" => MAX_RANKS,
                n => n.parse().expect("array length"),
            },
        };
        at = at.next_multiple_of(size) + size * count;
        widest = widest.max(size);
    }
    at.next_multiple_of(widest)
}

/// The error every rank returns when direct access failed on some rank: each failing rank and
/// its reason, so the message is the same everywhere.
fn peers_failed(failed: &[(usize, String)]) -> Error {
    let list: Vec<String> = failed
        .iter()
        .map(|(r, why)| format!("rank {r}: {why}"))
        .collect();
    Error::Cuda(format!(
        "direct access could not be set up on every rank ({})",
        list.join("; ")
    ))
}

/// The kernel units of a GPU of `arch`: every unit whose code is at hand (built in, cached)
/// loaded now, so that calls find their kernels without a compile or a load (CUDA graph capture
/// included); the start-up check's unit compiled now if it is not. The others are compiled at
/// the first call that needs them, which needs NVRTC (or built-in PTX) there: without either,
/// direct access is refused now rather than failing a call later.
fn load_units(cfg: &Config, arch: &str) -> Result<Units> {
    let units = Units::new(cfg, arch);
    units.module(DataType::F32, kernels::Group::Setup, false)?;
    let mut missing = Vec::new();
    // A GPU older than a group's oldest architecture has no such unit (its calls are refused).
    for (d, g) in kernels::units_for(arch) {
        if units.module(d, g, true)?.is_none() {
            missing.push((d, g));
        }
    }
    if let Some(&(d, g)) = missing.first() {
        // A unit a call may need must be obtainable then: NVRTC, or PTX the driver compiles.
        if let Err(e) = driver::libs::ensure_nvrtc(cfg) {
            if kernels::code_source(d, g, arch, cfg)?.is_none() {
                return Err(e);
            }
        }
    }
    Ok(units)
}

/// The entry points of `dtype`'s unit of `group` in `module`, and the low-precision kernels'
/// occupancy.
fn module_functions(
    dtype: DataType,
    group: kernels::Group,
    module: driver::Module,
) -> Result<Module> {
    let mut funcs = HashMap::new();
    for name in group.entries() {
        let f = module
            .function(&name)
            .map_err(|e| Error::Cuda(format!("{e} ({dtype})")))?;
        funcs.insert(name, f);
    }
    let mut lp_per_sm = HashMap::new();
    if group == kernels::Group::LowPrecision {
        for name in kernels::LOWP_ENTRIES {
            // 512-thread CTAs, static shared memory only.
            let what = format!("occupancy of {name} ({dtype})");
            let n = result::occupancy_max_active_blocks(funcs[name], 512, 0, &what)?;
            lp_per_sm.insert(name, n.max(1) as u32);
        }
    }
    Ok(Module {
        _module: module,
        funcs,
        lp_per_sm,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_staging_must_lie_inside_its_allocation() {
        let (p, size, total) = (0x7f00_0000_0000u64, 1u64 << 20, 1u64 << 19);
        assert_eq!(peer_staging(p, size, 0, total), Some(p));
        assert_eq!(
            peer_staging(p, size, size - total, total),
            Some(p + size - total)
        );
        assert_eq!(peer_staging(p, size, size - total + 1, total), None);
        assert_eq!(peer_staging(p, size, u64::MAX, total), None);
        assert_eq!(peer_staging(p, size, u64::MAX - total + 1, total), None);
        assert_eq!(peer_staging(p, size, 0, size + 1), None);
        assert_eq!(peer_staging(u64::MAX - 8, size, 16, 16), None);
    }

    #[test]
    fn kernel_constants_match_the_host_and_fit_the_free_state() {
        let src = kernels::ALL_REDUCE_SOURCE;
        for def in [
            format!("#define CE_SEQ {CE_SEQ_WORD} "),
            format!("#define CE_FLAGS {CE_FLAGS_WORD} "),
            format!("#define FC_CE_MAX_CHUNKS {CE_MAX_CHUNKS}\n"),
            format!("#define FC_ABORT_WORD {ABORT_WORD}\n"),
            // The LL128 line: the host sizes rows and grids by its payload.
            format!("#define LL128_WORDS {}\n", LL128_PAYLOAD / 8),
            // Its grid: two blocks an SM only if the kernel is built to fit two.
            format!("__launch_bounds__({LL128_THREADS}, {LL128_BLOCKS_PER_SM}) fc_ll128_"),
        ] {
            assert!(
                src.contains(&def),
                "all_reduce.cu lacks `{}`",
                def.trim_end()
            );
        }
    }

    #[test]
    fn args_layout_matches_the_kernel() {
        let src = kernels::ALL_REDUCE_SOURCE;
        assert_eq!(std::mem::size_of::<Args>(), c_struct_size(src, "Args"));
        assert_eq!(std::mem::align_of::<Args>(), 8);
    }
}
