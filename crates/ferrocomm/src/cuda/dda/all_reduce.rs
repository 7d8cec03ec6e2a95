//! The direct-access all-reduce executor: the launch of push, flat (pulled, streamed, by the
//! copy engines or in LL128 lines) and tree kernels on the staging the parent module maps.

use std::ffi::c_void;

use super::{
    kernel_name, round_up, Args, Dda, CE_FLAGS_WORD, CE_MAX_CHUNKS, CE_MIN_CHUNK, CE_SEQ_WORD,
    CE_TARGET_CHUNKS, CE_THREADS, CE_WORDS_OFF, FLAT_MAX_CHUNK, FLAT_MIN_CHUNK, FLAT_SLOTS,
    FLAT_WARPS, LL128_BLOCKS_PER_SM, LL128_PAYLOAD, LL128_THREADS, MAX_BLOCKS,
};
use crate::driver::{launch, result, Event, Function, Stream};
use crate::error::{Error, Result};
use crate::plan::{Algo, FlatForm, Plan};
use crate::types::{DataType, ReduceOp};

/// What the copy-engine all-reduce needs besides the region: the smallest message it takes, and
/// a stream of its own for the copies (forked from and joined back to the caller's by events,
/// so graph capture follows it).
pub(super) struct CopyEngine {
    pub(super) min_bytes: usize,
    pub(super) stream: Stream,
    fork: Event,
    join: Event,
}

impl CopyEngine {
    /// Creates the stream and events in the current context.
    pub(super) fn new(min_bytes: usize) -> Result<CopyEngine> {
        Ok(CopyEngine {
            min_bytes,
            stream: Stream::non_blocking("cuStreamCreate (copy engine)")?,
            fork: Event::new("cuEventCreate (copy engine)")?,
            join: Event::new("cuEventCreate (copy engine)")?,
        })
    }

    /// Orders the copy stream after the work enqueued so far on `main` (a live stream of this
    /// context, or the legacy one).
    fn fork_from(&self, main: u64) -> Result<()> {
        self.fork.record(main, "copy engine: recording the fork")?;
        self.fork
            .wait_in(self.stream.raw(), "copy engine: waiting for the fork")
    }

    /// Orders `main`'s later work after everything enqueued on the copy stream so far.
    fn join_into(&self, main: u64) -> Result<()> {
        self.join
            .record(self.stream.raw(), "copy engine: recording the join")?;
        self.join.wait_in(main, "copy engine: waiting for the join")
    }

    /// Enqueues a copy of `len` bytes from `src` to `dst` on the copy stream.
    ///
    /// # Safety
    /// Both ranges are device memory of (or mapped into) this context, valid until the copy
    /// stream has run it.
    unsafe fn copy(&self, dst: u64, src: u64, len: usize) -> Result<()> {
        // SAFETY: the caller's contract; the stream is ours.
        unsafe {
            result::memcpy_dtod_async(dst, src, len, self.stream.raw(), "copy engine: a copy")
        }
    }
}

/// Chunk size of a copy-engine all-reduce of `bytes` per rank: about eight chunks of at least
/// 1 MiB, never more than [`CE_MAX_CHUNKS`], a multiple of 16.
/// Both ranks compute the same value (the flags are per chunk).
pub fn ce_chunk(bytes: usize) -> usize {
    let c = bytes
        .div_ceil(CE_TARGET_CHUNKS)
        .max(CE_MIN_CHUNK)
        .max(bytes.div_ceil(CE_MAX_CHUNKS));
    round_up(c, 16)
}

impl Dda {
    /// Launches one all-reduce kernel on `stream` as `plan` says (its algorithm and, for a flat
    /// one, its form: [`crate::plan::cuda_call_plan`] decided them).
    #[allow(clippy::too_many_arguments)]
    pub fn all_reduce(
        &self,
        plan: &Plan,
        input: u64,
        output: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: u64,
    ) -> Result<()> {
        // The op's kernel suffix and its PremulSum factor / Avg divisor in the arguments.
        let (mut a, opname) = self.reduction_args(input, output, count, op, "all_reduce")?;
        let algo = plan.algo;
        let (aname, threads, units) = match algo {
            Algo::Push => ("push", 256u32, (count * dtype.size()).div_ceil(8)),
            Algo::Flat => ("flat", 512, (count * dtype.size()).div_ceil(16)),
            Algo::Tree => (
                "tree",
                512,
                (count * dtype.size()).div_ceil(16).div_ceil(self.world),
            ),
            other => {
                return Err(Error::InvalidArgument(format!(
                    "all_reduce: {other} is not a direct-access algorithm"
                )))
            }
        };
        let bytes = count * dtype.size();
        let form = match (algo, plan.form) {
            (Algo::Flat, None) => {
                return Err(Error::InvalidArgument(
                    "all_reduce: a flat plan without its form (pulled, streamed, copy engines \
                     or LL128)"
                        .into(),
                ))
            }
            (Algo::Flat, form) => form,
            _ => None,
        };
        let aname = form.map_or(aname, FlatForm::kernel);
        // What every rank must agree on (the kernels compare it through their hello words):
        // count, dtype, the operator with its Avg divisor, the algorithm.
        // (Spelled on the stack, as the kernel name: no allocation per call.)
        let avg = if a.has_div != 0 { "/avg" } else { "" };
        let mut buf = [0; 64];
        let what = kernel_name(&mut buf, &[aname, "/", opname, avg]);
        a.sig = super::collectives::signature(
            crate::plan::Collective::AllReduce,
            dtype,
            count,
            0,
            what,
        );
        let f = self.func(
            dtype,
            kernel_name(&mut [0; 64], &["fc_", aname, "_", opname]),
        )?;
        let max_blocks = (self.sm_count as usize).clamp(1, MAX_BLOCKS);
        let (blocks, threads) = match form {
            Some(FlatForm::CopyEngine) => {
                return self.all_reduce_ce(&mut a, f, bytes, max_blocks as u32, stream)
            }
            Some(FlatForm::Ll128) => {
                // Four lines per warp and step; any grid (the lines name no block).
                let warp_steps = bytes.div_ceil(LL128_PAYLOAD).div_ceil(4);
                let cap = (LL128_BLOCKS_PER_SM * max_blocks).min(MAX_BLOCKS);
                let blocks = warp_steps
                    .div_ceil(LL128_THREADS as usize / 32)
                    .clamp(1, cap);
                (blocks as u32, LL128_THREADS)
            }
            Some(FlatForm::Stream) => {
                let (g, chunk) =
                    flat_grid(bytes, max_blocks, self.world, self.layout.staging_bytes);
                a.chunk_bytes = chunk as u64;
                (g as u32, threads)
            }
            _ => (
                units.div_ceil(threads as usize).clamp(1, max_blocks) as u32,
                threads,
            ),
        };
        let mut params: [*mut c_void; 1] = [(&mut a as *mut Args).cast()];
        // SAFETY: `f` takes one `Args` by value, laid out as in the kernel source, and starts
        // with pdl_wait(); the pointers inside were validated by the caller (device memory of
        // this GPU, `count` elements).
        unsafe {
            launch(f, blocks, threads, stream, &mut params, self.pdl, || {
                format!("launching all_reduce ({aname}, {dtype}, {count} elements)")
            })
        }
    }

    /// The copy-engine all-reduce (two ranks; all_reduce.cu's `ce` section): on `stream`, the
    /// gate, then the fork to the copy stream, which copies every chunk of the input into the
    /// peer's region followed by the chunk's flag (this call's epoch, from the SEQ word the gate
    /// wrote), while `reduce` (fc_ce_<op>) runs on `stream`; the copy stream joins `stream`
    /// after it. `a` is the call's arguments with its signature.
    fn all_reduce_ce(
        &self,
        a: &mut Args,
        reduce: Function,
        bytes: usize,
        blocks: u32,
        stream: u64,
    ) -> Result<()> {
        let ce = self
            .ce
            .as_ref()
            .expect("the caller checked the copy engine is on");
        let chunk = ce_chunk(bytes);
        a.chunk_bytes = chunk as u64;
        let what = || format!("the copy-engine all-reduce ({bytes} bytes per rank)");
        let gate = self.func(DataType::F32, "fc_ce_gate")?;
        let peer = self.bases[1 - self.rank];
        let (words, peer_words) = (self.own + CE_WORDS_OFF as u64, peer + CE_WORDS_OFF as u64);
        let region = peer + self.layout.ce_off as u64;
        let mut params: [*mut c_void; 1] = [(a as *mut Args).cast()];
        // SAFETY: fc_ce_gate takes one `Args` by value (this call's, pointers into our
        // allocation and the peers'), starts with pdl_wait() and touches only the CE words.
        unsafe {
            launch(gate, 1, 32, stream, &mut params, self.pdl, || {
                format!("launching the gate of {}", what())
            })
        }?;
        ce.fork_from(stream)?;
        let seq = words + 4 * CE_SEQ_WORD as u64;
        for (k, off) in (0..bytes).step_by(chunk).enumerate() {
            let len = chunk.min(bytes - off);
            let o = off as u64;
            let flag = peer_words + 4 * (CE_FLAGS_WORD + k) as u64;
            // SAFETY: the input holds `bytes` (validated by the communicator) and the peer's
            // region `ce_bytes` >= `bytes`; the SEQ word and the peer's flag words are inside
            // the allocations mapped here.
            unsafe { ce.copy(region + o, a.input + o, len) }?;
            // SAFETY: as above (4 bytes).
            unsafe { ce.copy(flag, seq, 4) }?;
        }
        // SAFETY: `reduce` takes one `Args` by value and starts with pdl_wait(); the user
        // pointers were validated by the caller, the region and words are ours.
        unsafe {
            launch(
                reduce,
                blocks,
                CE_THREADS,
                stream,
                &mut params,
                self.pdl,
                || format!("launching the reduction of {}", what()),
            )
        }?;
        ce.join_into(stream)
    }
}

/// Grid (blocks of 16 warps) and per-warp chunk size of the push-write stream kernel for `bytes`
/// per rank: warps of at least `FLAT_MIN_CHUNK` (up to one block per SM), chunks of at most
/// `FLAT_MAX_CHUNK`, and every warp's `world * FLAT_SLOTS` slots inside one staging parity.
/// Both ranks compute the same values (warp g's flags pair it with warp g of every peer).
pub fn flat_grid(
    bytes: usize,
    max_blocks: usize,
    world: usize,
    staging_bytes: usize,
) -> (usize, usize) {
    let vbytes = round_up(bytes.max(1), 16);
    let per_block_slots = FLAT_WARPS * world * FLAT_SLOTS * 16;
    let grid = vbytes
        .div_ceil(FLAT_MIN_CHUNK * FLAT_WARPS)
        .min(max_blocks)
        .min((staging_bytes / per_block_slots).max(1))
        .max(1);
    let groups = grid * FLAT_WARPS;
    let slot_cap = (staging_bytes / (groups * world * FLAT_SLOTS)) / 16 * 16;
    let chunk = round_up(vbytes.div_ceil(groups), 16)
        .min(FLAT_MAX_CHUNK)
        .min(slot_cap)
        .max(16);
    (grid, chunk)
}
