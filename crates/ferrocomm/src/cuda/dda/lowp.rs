//! Low-precision collectives by direct access: block-scaled FP8/INT8 codes (the wire layout of
//! [`crate::quant`]) travel through the staging buffers, sums are taken in f32 (kernels/lowp.cu).
//!
//! One-shot kernels quantize each input part once and store the records, in 16-byte aligned
//! groups, straight into the staging of the ranks that decode them (one slot per sender), so
//! every rank decodes from its own memory; two-shot encodes into its own staging and owners read
//! their stripe from the peers.
//! One kernel per chunk: a message whose encoding exceeds what one staging parity holds is cut
//! into equal block-aligned chunks, each a call of its own (its own epoch and parity), so every
//! rank launches the same sequence.

use std::ffi::c_void;

use super::collectives::{
    a2av_largest_crossing, a2av_pair_signature, a2av_piece, a2av_pieces, signature,
};
use super::{Args, Dda, COLL_BAR_OFF};
use crate::backend::Splits;
use crate::driver::{self, launch, result, DeviceAttribute, Function};
use crate::error::{Error, Result};
use crate::plan::{lp_push_first, lp_split, Algo, Collective};
use crate::quant::{Codec, Format};
use crate::types::DataType;

/// Warps per CTA of the lowp kernels (`LP_WARPS`, 512 threads).
const WARPS: usize = 16;
/// The flag area has slots for this many CTAs (`FC_MAX_BLOCKS`).
const MAX_GRID: usize = super::MAX_BLOCKS;

/// Second kernel argument; the same layout as `struct Lp` in lowp.cu.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Lp {
    in_stride: u64,
    out_stride: u64,
    region: u64,
    bar_off: u64,
    block: u32,
    format: u32,
    nin: u32,
    reduce: u32,
    push: u32,
    sig: u32,
    /// All-to-all-v (two ranks): the counts and displacements below replace the strides.
    v: u32,
    /// Push of one part (`nin` = 1): odd groups stay in the sender's staging and the receivers
    /// pull them after the barrier, while they decode the pushed ones.
    split: u32,
    scount: [u64; 2],
    sdispl: [u64; 2],
    rcount: [u64; 2],
    rdispl: [u64; 2],
}

pub(super) fn format_code(f: Format) -> u32 {
    match f {
        Format::E4M3 => 0,
        Format::E5M2 => 1,
        Format::Int8 => 2,
    }
}

/// Elements a warp handles at once (`lp_tile`): 128, or one block when blocks are larger.
fn tile(codec: &Codec) -> usize {
    codec.block.max(128)
}

/// How a one-shot collective of `part` elements per part is cut: whether it pushes (records
/// stored into the receivers' staging, a region per sender, at most `push_most` elements per
/// chunk; 0 where push cannot run) or pulls (records in the sender's staging, at most
/// `pull_most`, at least one tile), and the elements per chunk (equal chunks of whole tiles,
/// not full ones and a small remainder). Push wherever it needs no more chunks (kernel
/// launches) than pull: push wins with as many chunks and loses where it needs more
/// (docs/tuning.md, "Where the built-in limits come from").
fn plan(
    kind: LpKind,
    part: usize,
    pull_most: usize,
    push_most: usize,
    tile: usize,
) -> (bool, usize) {
    let push = kind != LpKind::Tree
        && push_most > 0
        && part.div_ceil(push_most) <= part.div_ceil(pull_most);
    let most = if push { push_most } else { pull_most };
    (
        push,
        part.div_ceil(part.div_ceil(most)).div_ceil(tile) * tile,
    )
}

/// How a low-precision all-to-all-v runs, the same on both ranks: launches of the one-shot
/// kernel in all-to-all mode, each on a piece of `chunk` elements of both crossing parts (the
/// part each rank sends the other; a rank's own part is copied exactly, as in the all-to-all,
/// whole with the first piece: cuda::collectives::a2av_piece), sized like an all-to-all of the
/// larger crossing part (`cross` elements).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::cuda) struct A2avPlan {
    pub cross: usize,
    pub chunk: usize,
    pub push: bool,
}

/// The plan of a low-precision all-to-all-v of `splits` on `rank`, or `None` where it cannot
/// run. Two ranks only: each rank sees its own row and column of the count matrix, and only at
/// two ranks do both see every count that decides (the crossing ones), so both take the same
/// path (`CallKind::shape` counts the largest crossing part); more ranks go full precision. `None` also where
/// the codec or the staging does not allow it ([`a2av_codec_fits`]).
pub(in crate::cuda) fn a2av_plan(
    rank: usize,
    splits: &Splits,
    codec: &Codec,
    staging: usize,
) -> Option<A2avPlan> {
    let world = splits.send_counts.len();
    if world != 2 || !a2av_codec_fits(codec, staging) {
        return None;
    }
    let cross = a2av_largest_crossing(rank, splits);
    let (pull_parts, push_parts) = regions_per_parity(LpKind::AllToAll, world);
    let pull_most = chunk_limit(staging, pull_parts, codec);
    let push_most = chunk_limit(staging, push_parts, codec);
    let (push, chunk) = plan(
        LpKind::AllToAll,
        cross.max(1),
        pull_most,
        push_most,
        tile(codec),
    );
    Some(A2avPlan { cross, chunk, push })
}

/// Whether a two-rank low-precision all-to-all-v can run with `codec` on a staging of `staging`
/// bytes per parity: blocks of at most 128 (the per-part counts are handled by the grouped
/// kernels only) and room for one tile per part.
pub(in crate::cuda) fn a2av_codec_fits(codec: &Codec, staging: usize) -> bool {
    let (pull_parts, _) = regions_per_parity(LpKind::AllToAll, 2);
    codec.block <= 128 && chunk_limit(staging, pull_parts, codec) > 0
}

/// Whether the two-rank low-precision all-to-all-v fits a staging of `staging` bytes with the
/// configured block ([`a2av_codec_fits`]; every format's records have the same size).
pub(in crate::cuda) fn a2av_lp_fits(cfg: &crate::config::Config, staging: usize) -> bool {
    Codec::new(Format::E4M3, cfg.low_precision.block).is_ok_and(|c| a2av_codec_fits(&c, staging))
}

/// The signature of one piece of a low-precision all-to-all-v: both crossing counts of the
/// whole call in rank order (collectives::a2av_pair_signature), the format, block size, dtype
/// and the piece's place.
fn a2av_signature(
    rank: usize,
    splits: &Splits,
    codec: &Codec,
    dtype: DataType,
    piece: usize,
) -> u32 {
    let what = format!(
        "low precision {} {} piece {piece}",
        codec.format, codec.block
    );
    a2av_pair_signature(rank, splits, dtype, &what)
}

/// Encoded regions one staging parity holds for `kind` at `world` ranks, (pull, push). Pull
/// (the sender's staging): one per input part, so one for the all-reduce and the all-gather;
/// push (the receivers' staging): one per sender.
fn regions_per_parity(kind: LpKind, world: usize) -> (usize, usize) {
    match kind {
        LpKind::Tree => (1, 1),
        LpKind::ReduceScatter | LpKind::AllToAll => (world, world),
        LpKind::Flat | LpKind::AllGather => (1, world),
    }
}

/// Largest chunk (elements per part, whole tiles) whose `nparts` encodings fit in `staging`
/// bytes (0 when not even one tile does).
fn chunk_limit(staging: usize, nparts: usize, codec: &Codec) -> usize {
    let room = staging / nparts;
    let t = tile(codec);
    let mut c = room / (codec.block + 4) * codec.block / t * t;
    while c > 0 && region(codec, c) > room {
        c -= t;
    }
    c
}

/// Staging bytes of one encoded part of `len` elements (16-aligned, so every region starts
/// where the kernels' 4-byte code loads are aligned).
fn region(codec: &Codec, len: usize) -> usize {
    codec.encoded_bytes(len).div_ceil(16) * 16
}

fn grid_for(tiles: usize) -> u32 {
    tiles.div_ceil(WARPS).clamp(1, MAX_GRID) as u32
}

/// The signature every rank's kernels compare at their barriers (lp_meet in kernels/lowp.cu): the
/// collective and algorithm, dtype, format, block size, Avg, the whole part and this chunk, so
/// ranks whose calls differ in any of them (or that are in another collective at the same step)
/// get a "disagrees between ranks" error from the first chunk on instead of a wrong result.
fn lp_signature(
    kind: LpKind,
    codec: &Codec,
    dtype: DataType,
    part: usize,
    len: usize,
    avg: bool,
) -> u32 {
    let what = format!(
        "low precision {kind:?} {} {} avg={avg} part={part}",
        codec.format, codec.block
    );
    signature(kind.collective(), dtype, len, 0, &what)
}

/// Which collective a chunked lowp launch implements.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(in crate::cuda) enum LpKind {
    /// One-shot all-reduce (every rank sums every rank's quantized input).
    Flat,
    /// Two-shot all-reduce (owners sum and re-quantize their stripe).
    Tree,
    AllGather,
    ReduceScatter,
    AllToAll,
}

impl LpKind {
    fn collective(self) -> Collective {
        match self {
            LpKind::Flat | LpKind::Tree => Collective::AllReduce,
            LpKind::AllGather => Collective::AllGather,
            LpKind::ReduceScatter => Collective::ReduceScatter,
            LpKind::AllToAll => Collective::AllToAll,
        }
    }

    /// The kind that runs a low-precision all-reduce of `algo` ([`crate::plan::lp_all_reduce`]).
    pub(in crate::cuda) fn of_all_reduce(algo: Algo) -> LpKind {
        match algo {
            Algo::Tree => LpKind::Tree,
            _ => LpKind::Flat,
        }
    }

    fn name(self) -> &'static str {
        self.collective().name()
    }
}

impl Dda {
    /// Largest chunk (elements per part, whole tiles) whose `nparts` encodings fit one parity.
    fn lp_chunk(&self, kind: LpKind, codec: &Codec, nparts: usize) -> Result<usize> {
        let c = chunk_limit(self.layout().staging_bytes, nparts, codec);
        let t = tile(codec);
        if c == 0 {
            return Err(Error::InvalidArgument(format!(
                "{}: FERROCOMM_CUDA_STAGING_BYTES={} holds less than one low-precision tile of \
                 {t} elements per rank",
                kind.name(),
                self.layout().staging_bytes
            )));
        }
        Ok(c)
    }

    #[allow(clippy::too_many_arguments)]
    fn lp_launch(
        &self,
        name: &str,
        dtype: DataType,
        mut a: Args,
        mut l: Lp,
        grid: u32,
        stream: u64,
        what: impl FnOnce() -> String,
    ) -> Result<()> {
        let f = self.func(dtype, name)?;
        let mut params: [*mut c_void; 2] =
            [(&mut a as *mut Args).cast(), (&mut l as *mut Lp).cast()];
        // SAFETY: `f` takes (Args, Lp) by value, both laid out as in the kernel source, and
        // starts with pdl_wait(); the pointers inside were validated by the communicator (device
        // memory of this GPU holding the counts the strides and chunk sizes imply).
        unsafe {
            launch(
                f,
                grid,
                (WARPS * 32) as u32,
                stream,
                &mut params,
                self.pdl,
                || format!("launching {name} ({})", what()),
            )
        }
    }

    /// One low-precision collective of `part` elements per part on `stream`, chunked to the
    /// staging size. Pointers: all-reduce `input`/`output` hold `part` elements; all-gather
    /// `input` holds `part` and `output` `world * part`; reduce-scatter `input` `world * part`
    /// and `output` `part`; all-to-all both `world * part`. `avg` divides sums by the world size.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn lp_collective(
        &self,
        kind: LpKind,
        codec: &Codec,
        dtype: DataType,
        input: u64,
        output: u64,
        part: usize,
        avg: bool,
        stream: u64,
    ) -> Result<()> {
        if part == 0 {
            return Ok(());
        }
        let world = self.world;
        let es = dtype.size() as u64;
        let (pull_parts, push_parts) = regions_per_parity(kind, world);
        let pull_most = self.lp_chunk(kind, codec, pull_parts)?;
        // Push is the grouped quantizer's (blocks up to 128): the tile path would quantize a
        // part once per receiver. A staging too small for a region per sender just means pull.
        let push_most = if codec.block <= 128 {
            chunk_limit(self.layout().staging_bytes, push_parts, codec)
        } else {
            0
        };
        // At two ranks the split push overlaps the link with the quantizer and the decode: it
        // is taken even where it needs more chunks than pull.
        let (push, chunk) = if lp_push_first(
            push_most,
            codec,
            world,
            matches!(kind, LpKind::Flat | LpKind::AllGather),
        ) {
            plan(kind, part, push_most, push_most, tile(codec))
        } else {
            plan(kind, part, pull_most, push_most, tile(codec))
        };
        let reduces = matches!(kind, LpKind::Flat | LpKind::Tree | LpKind::ReduceScatter);
        let mut off = 0usize;
        while off < part {
            let len = chunk.min(part - off);
            let at = off as u64 * es;
            let mut a = self.base_args(input + at, output + at, len as u64);
            if avg && reduces {
                a.has_div = 1;
                a.post_div = world as f32;
            }
            let mut l = Lp {
                block: codec.block as u32,
                format: format_code(codec.format),
                nin: 1,
                region: region(codec, len) as u64,
                push: push as u32,
                bar_off: COLL_BAR_OFF as u64,
                sig: lp_signature(kind, codec, dtype, part, len, avg),
                ..Lp::default()
            };
            let tiles = len.div_ceil(tile(codec));
            // Work units of the one-shot kernel: groups of four tiles for blocks up to 128.
            let units = if codec.block <= 128 {
                len.div_ceil(4 * tile(codec))
            } else {
                tiles
            };
            // Chunks from the tuning table's `low_precision.wide_min_bytes` up run the one-shot
            // family as `fc_lp_move_wide` (two CTAs per SM, registers capped).
            let one_shot = if len * es as usize >= self.lp_wide_min_bytes {
                "fc_lp_move_wide"
            } else {
                "fc_lp_move"
            };
            let (name, grid) = match kind {
                LpKind::Tree => ("fc_lp_tree", grid_for(tiles.div_ceil(world))),
                LpKind::Flat => {
                    l.reduce = 1;
                    l.split = lp_split(push, codec, world);
                    (one_shot, grid_for(units))
                }
                LpKind::AllGather => {
                    l.out_stride = part as u64;
                    l.split = lp_split(push, codec, world);
                    (one_shot, grid_for(units))
                }
                LpKind::ReduceScatter => {
                    l.nin = world as u32;
                    l.in_stride = part as u64;
                    l.reduce = 1;
                    (one_shot, grid_for(units))
                }
                LpKind::AllToAll => {
                    // The own part is copied, not encoded (kernels/lowp.cu).
                    l.nin = world as u32;
                    l.split = lp_split(push, codec, world);
                    l.in_stride = part as u64;
                    l.out_stride = part as u64;
                    (one_shot, grid_for(units))
                }
            };
            let grid = grid.min(self.lp_wave(dtype, name)?);
            self.lp_launch(name, dtype, a, l, grid, stream, || {
                format!(
                    "{} {} {dtype}, {len} of {part} elements",
                    kind.name(),
                    codec.format
                )
            })?;
            off += len;
        }
        Ok(())
    }

    /// A low-precision all-to-all-v on two ranks as `plan` (see [`a2av_plan`]) says: every
    /// part a rank sends the other is quantized once, the own part copied exactly.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn lp_all_to_all_v(
        &self,
        plan: A2avPlan,
        codec: &Codec,
        dtype: DataType,
        input: u64,
        output: u64,
        splits: &Splits,
        stream: u64,
    ) -> Result<()> {
        let world = self.world;
        let rank = self.rank;
        let pieces = a2av_pieces(rank, splits, plan.chunk);
        // The plain kernel at every size: the wide one has no per-part counts (kernels/lowp.cu).
        let name = "fc_lp_move";
        let wave = self.lp_wave(dtype, name)?;
        for i in 0..pieces {
            let s = a2av_piece(rank, splits, i, plan.chunk);
            let len = a2av_largest_crossing(rank, &s);
            let a = self.base_args(input, output, len as u64);
            let mut l = Lp {
                block: codec.block as u32,
                format: format_code(codec.format),
                nin: world as u32,
                region: region(codec, plan.chunk) as u64,
                push: plan.push as u32,
                bar_off: COLL_BAR_OFF as u64,
                sig: a2av_signature(rank, splits, codec, dtype, i),
                v: 1,
                ..Lp::default()
            };
            for p in 0..world {
                l.scount[p] = s.send_counts[p] as u64;
                l.sdispl[p] = s.send_displs[p] as u64;
                l.rcount[p] = s.recv_counts[p] as u64;
                l.rdispl[p] = s.recv_displs[p] as u64;
            }
            let grid = grid_for(len.div_ceil(4 * tile(codec))).min(wave);
            self.lp_launch(name, dtype, a, l, grid, stream, || {
                format!(
                    "all_to_all_v {} {dtype}, piece {i} of {pieces}, {} elements crossing",
                    codec.format, plan.cross
                )
            })?;
        }
        Ok(())
    }
}

/// Encodes `count` elements of `dtype` at device address `input` into `output`
/// (`codec.encoded_bytes(count)` bytes) with the collectives' own quantizer, on the current
/// context's device, `launches` times in a row on `stream` (at least once), then waits for them.
/// For tests that hold the GPU codec to [`Codec::encode`] byte for byte and for timing
/// quantization alone (many launches, one wait: the launches overlap, so the time is the
/// kernel's); the kernel module is compiled (or read from the kernel cache) and loaded once per
/// process and dtype. The grid is one wave of the GPU, as the fused kernels' is.
#[allow(clippy::too_many_arguments)]
pub fn quantize_on_device(
    cfg: &crate::config::Config,
    codec: &Codec,
    dtype: DataType,
    input: u64,
    output: u64,
    count: usize,
    stream: u64,
    launches: usize,
) -> Result<()> {
    use std::collections::HashMap;
    use std::sync::Mutex;
    // Per dtype: the kernel and the CTAs of one wave of this GPU.
    static FUNCS: Mutex<Option<HashMap<DataType, (Function, usize)>>> = Mutex::new(None);
    if !crate::cuda::kernels::has_lowp(dtype) {
        return Err(Error::Unsupported {
            collective: "quantize",
            backend: "cuda",
            what: format!("low precision for {dtype}"),
        });
    }
    let (f, wave) = {
        let mut g = FUNCS.lock().unwrap_or_else(|e| e.into_inner());
        let map = g.get_or_insert_with(HashMap::new);
        match map.get(&dtype) {
            Some(&(f, wave)) => (f, wave),
            None => {
                // A context must be current (documented).
                let module = crate::cuda::kernels::load_on_current_device(
                    dtype,
                    crate::cuda::kernels::Group::LowPrecision,
                    cfg,
                    "loading the lowp kernels",
                )?;
                let f = module.function("fc_lp_encode")?;
                // Kept loaded: its function is cached for the process.
                module.keep_loaded();
                // 512 threads, no dynamic shared memory.
                let block = (WARPS * 32) as u32;
                let what = "occupancy of fc_lp_encode";
                let per_sm = result::occupancy_max_active_blocks(f, block, 0, what)?;
                let sms = driver::current_device_attribute(
                    DeviceAttribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                )?;
                let wave = (per_sm.max(1) * sms.max(1)) as usize;
                map.insert(dtype, (f, wave));
                (f, wave)
            }
        }
    };
    let mut a = Args::standalone(input, output, count as u64);
    let mut l = Lp {
        block: codec.block as u32,
        format: format_code(codec.format),
        ..Lp::default()
    };
    // One wave, as the fused kernels run: each warp quantizes many groups in turn, with the
    // next group's loads in flight, so this times the quantizer they run.
    let grid = count.div_ceil(tile(codec) * WARPS * 4).clamp(1, wave) as u32;
    let mut params: [*mut c_void; 2] = [(&mut a as *mut Args).cast(), (&mut l as *mut Lp).cast()];
    let pdl = driver::pdl_for_current_device(cfg)?;
    for _ in 0..launches.max(1) {
        // SAFETY: fc_lp_encode(Args, Lp), which starts with pdl_wait(); the caller promises
        // `count` elements at `input` and the encoded size at `output`, device memory of the
        // current context; `pdl` was decided for this context's device.
        unsafe {
            launch(
                f,
                grid,
                (WARPS * 32) as u32,
                stream,
                &mut params,
                pdl,
                || "launching fc_lp_encode".into(),
            )
        }?;
    }
    // SAFETY: waits for the launches above on the caller's stream (a live stream of the
    // current context, the function's contract).
    unsafe { result::stream_synchronize(stream, "fc_lp_encode") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lp_layout_matches_the_kernel() {
        let src = crate::cuda::kernels::LOWP_SOURCE;
        assert_eq!(
            std::mem::size_of::<Lp>(),
            super::super::c_struct_size(src, "Lp")
        );
    }

    #[test]
    fn signatures_separate_what_ranks_must_agree_on() {
        let e4 = Codec::new(Format::E4M3, 128).unwrap();
        let sig = |kind, codec: &Codec, dtype, part, len, avg| {
            lp_signature(kind, codec, dtype, part, len, avg)
        };
        let base = sig(LpKind::Flat, &e4, DataType::BF16, 1000, 1000, false);
        assert_eq!(
            base,
            sig(LpKind::Flat, &e4, DataType::BF16, 1000, 1000, false)
        );
        let others = [
            sig(LpKind::Tree, &e4, DataType::BF16, 1000, 1000, false),
            sig(LpKind::AllGather, &e4, DataType::BF16, 1000, 1000, false),
            sig(
                LpKind::ReduceScatter,
                &e4,
                DataType::BF16,
                1000,
                1000,
                false,
            ),
            sig(LpKind::AllToAll, &e4, DataType::BF16, 1000, 1000, false),
            sig(LpKind::Flat, &e4, DataType::F16, 1000, 1000, false),
            sig(LpKind::Flat, &e4, DataType::BF16, 1001, 1000, false),
            sig(LpKind::Flat, &e4, DataType::BF16, 1000, 999, false),
            sig(LpKind::Flat, &e4, DataType::BF16, 1000, 1000, true),
            sig(
                LpKind::Flat,
                &Codec::new(Format::E5M2, 128).unwrap(),
                DataType::BF16,
                1000,
                1000,
                false,
            ),
            sig(
                LpKind::Flat,
                &Codec::new(Format::E4M3, 64).unwrap(),
                DataType::BF16,
                1000,
                1000,
                false,
            ),
            // The full-precision collective of the same shape (collectives.cu's words).
            signature(Collective::AllReduce, DataType::BF16, 1000, 0, "sum"),
        ];
        for (i, o) in others.iter().enumerate() {
            assert_ne!(base, *o, "case {i}");
        }
    }

    /// Both ranks' views (row and column) of a two-rank count matrix.
    fn views2(m: [[usize; 2]; 2]) -> [Splits; 2] {
        [0, 1].map(|r| Splits::packed(m[r].to_vec(), vec![m[0][r], m[1][r]]))
    }

    #[test]
    fn all_to_all_v_plans_agree_and_mismatches_are_signed_apart() {
        let codec = Codec::new(Format::E4M3, 128).unwrap();
        let staging = 64 << 20;
        let (pull_parts, push_parts) = regions_per_parity(LpKind::AllToAll, 2);
        for m in [
            [[5_000_000, 10], [3_000_001, 7]],
            [[0, 0], [0, 9_000_000]],
            [[1, 1 << 20], [(1 << 20) + 1, 1]],
            [[4, 0], [0, 4]],
            // Crossing parts of several chunks, one each way, and an own part larger still.
            [[90_000_000, 40 << 20], [70_000_001, 3]],
        ] {
            let v = views2(m);
            let plans = [0, 1].map(|r| a2av_plan(r, &v[r], &codec, staging));
            assert_eq!(plans[0], plans[1], "{m:?}");
            let p = plans[0].unwrap();
            let cross = m[0][1].max(m[1][0]);
            assert_eq!(p.cross, cross, "{m:?}");
            // Every piece's region fits the staging, as push or pull lays them out.
            let parts = if p.push { push_parts } else { pull_parts };
            assert!(parts * region(&codec, p.chunk) <= staging, "{m:?} {p:?}");
            let pieces = [0, 1].map(|r| a2av_pieces(r, &v[r], p.chunk));
            assert_eq!(pieces[0], pieces[1], "{m:?}");
            assert_eq!(pieces[0], cross.div_ceil(p.chunk).max(1), "{m:?}");
            for i in 0..pieces[0] {
                let sigs = [0, 1].map(|r| a2av_signature(r, &v[r], &codec, DataType::BF16, i));
                assert_eq!(sigs[0], sigs[1], "{m:?} piece {i}");
            }
        }
        let v = views2([[1, 2], [3, 4]]);
        let s0 = |i| a2av_signature(0, &v[0], &codec, DataType::BF16, i);
        assert_ne!(s0(0), s0(1), "pieces are signed apart");
        // Counts that do not match: rank 1 expects another count than rank 0 sends, or both
        // ranks send a and expect b (the same pair of numbers on both, in the other order).
        let mut v = views2([[1, 100], [200, 1]]);
        v[1].recv_counts[0] = 101;
        let s = |v: &[Splits; 2], r: usize| a2av_signature(r, &v[r], &codec, DataType::BF16, 0);
        assert_ne!(s(&v, 0), s(&v, 1));
        let v = [
            Splits::packed(vec![1, 100], vec![1, 200]),
            Splits::packed(vec![100, 1], vec![200, 1]),
        ];
        assert_ne!(s(&v, 0), s(&v, 1));
        // More than two ranks, blocks above 128: no plan (full precision).
        let three = Splits::packed(vec![1, 2, 3], vec![1, 2, 3]);
        assert_eq!(a2av_plan(0, &three, &codec, staging), None);
        let big = Codec::new(Format::E4M3, 512).unwrap();
        assert_eq!(
            a2av_plan(0, &views2([[1, 2], [3, 4]])[0], &big, staging),
            None
        );
    }

    /// (push, chunk, the most a chunk may hold) for two ranks and a 64 MiB staging parity.
    fn plan2(kind: LpKind, bytes: usize, es: usize) -> (bool, usize, usize) {
        let (pull_parts, push_parts) = regions_per_parity(kind, 2);
        let codec = Codec::new(Format::E4M3, 128).unwrap();
        let most = |nparts| chunk_limit(64 << 20, nparts, &codec);
        let (pull, push) = (most(pull_parts), most(push_parts));
        let (p, c) = plan(kind, bytes / es, pull, push, 128);
        (p, c, if p { push } else { pull })
    }

    #[test]
    fn push_where_it_needs_no_more_chunks_than_pull() {
        let pc = |kind, bytes, es| {
            let (p, c, _) = plan2(kind, bytes, es);
            (p, c)
        };
        assert_eq!(pc(LpKind::Flat, 16 << 20, 2), (true, 8 << 20));
        assert_eq!(pc(LpKind::AllGather, 4 << 20, 4), (true, 1 << 20));
        assert_eq!(pc(LpKind::AllToAll, 16 << 20, 2), (true, 8 << 20));
        // 64 MiB of bf16: one pull chunk (32 Mi elements, wide kernel), not two push ones.
        assert_eq!(pc(LpKind::Flat, 64 << 20, 2), (false, 32 << 20));
        // Parts of 64 MiB (32 Mi bf16 elements): two regions either way, so push.
        assert_eq!(pc(LpKind::ReduceScatter, 64 << 20, 2), (true, 16 << 20));
        assert!(pc(LpKind::AllToAll, 256 << 20, 2).0);
        // Two-shot never pushes.
        assert!(!pc(LpKind::Tree, 1 << 20, 2).0);
    }

    #[test]
    fn no_push_where_it_cannot_run() {
        // A staging that holds one tile per rank but not one per sender (4 ranks, E4M3 B=128:
        // a tile's records are 132 bytes): pull, not an error.
        let codec = Codec::new(Format::E4M3, 128).unwrap();
        let (pull, push) = (chunk_limit(300, 1, &codec), chunk_limit(300, 4, &codec));
        assert_eq!((pull, push), (256, 0));
        assert_eq!(plan(LpKind::Flat, 1000, pull, push, 128), (false, 256));
        assert_eq!(plan(LpKind::AllGather, 100, pull, push, 128), (false, 128));
    }

    #[test]
    fn the_chunk_limit_fits_its_records() {
        for block in [16, 32, 128, 256] {
            let codec = Codec::new(Format::E4M3, block).unwrap();
            for (staging, nparts) in [(64 << 20, 1), (64 << 20, 2), (1 << 20, 8), (8192, 3)] {
                let c = chunk_limit(staging, nparts, &codec);
                let t = tile(&codec);
                assert_eq!(c % t, 0, "{block} {staging} {nparts}");
                assert!(
                    region(&codec, c) * nparts <= staging,
                    "{block} {staging} {nparts}"
                );
                // The largest such: one more tile would not fit.
                assert!(
                    region(&codec, c + t) > staging / nparts,
                    "{block} {staging} {nparts}"
                );
            }
        }
        // Less room than one tile: nothing.
        assert_eq!(
            chunk_limit(100, 1, &Codec::new(Format::E4M3, 128).unwrap()),
            0
        );
    }

    #[test]
    fn chunks_are_equal_whole_tiles_within_the_staging() {
        for (kind, bytes, es) in [
            (LpKind::Flat, 256 << 20, 2),
            (LpKind::Flat, (256 << 20) + 6, 2),
            (LpKind::AllToAll, 200 << 20, 4),
            (LpKind::Tree, 100 << 20, 4),
            (LpKind::AllGather, 3 << 20, 2),
            (LpKind::AllGather, 130, 2),
        ] {
            let part = bytes / es;
            let (_, chunk, limit) = plan2(kind, bytes, es);
            let n = part.div_ceil(chunk);
            assert_eq!(chunk % 128, 0, "{kind:?} {bytes}");
            assert!(chunk <= limit, "{kind:?} {bytes}: {chunk} > {limit}");
            assert_eq!(
                n,
                part.div_ceil(limit),
                "{kind:?} {bytes}: more chunks than needed"
            );
            // Equal: the last chunk is short of the others by less than a tile per chunk.
            assert!(
                part - (n - 1) * chunk + 128 * n > chunk,
                "{kind:?} {bytes}: {chunk} x {n}"
            );
        }
    }
}
