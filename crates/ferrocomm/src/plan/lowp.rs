//! Low precision by the cuda backend's direct access: how a call's records are cut into
//! launches and moved (push or pull, split or not, the plain or the wide kernel), decided from
//! the part's size, the codec and the staging.

use std::fmt;

use crate::config::tuning::Tuning;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::quant::{Codec, Format};
use crate::types::Collective;

use super::DdaCaps;

/// Which low-precision kernel family a call runs by direct access (one launch per chunk).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LpKind {
    /// One-shot all-reduce (every rank sums every rank's quantized input).
    Flat,
    /// Two-shot all-reduce (owners sum and re-quantize their stripe).
    Tree,
    /// All-gather.
    AllGather,
    /// Reduce-scatter.
    ReduceScatter,
    /// All-to-all.
    AllToAll,
    /// All-to-all-v at two ranks (the one-shot kernel on pieces of both crossing parts).
    AllToAllV,
}

impl LpKind {
    /// The collective it implements.
    pub fn collective(self) -> Collective {
        match self {
            LpKind::Flat | LpKind::Tree => Collective::AllReduce,
            LpKind::AllGather => Collective::AllGather,
            LpKind::ReduceScatter => Collective::ReduceScatter,
            LpKind::AllToAll => Collective::AllToAll,
            LpKind::AllToAllV => Collective::AllToAllV,
        }
    }
}

/// Where a low-precision call's records go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LpMove {
    /// Stored into the receivers' staging, a region per sender.
    Push,
    /// Left in the sender's staging for the receivers to read.
    Pull,
}

/// The one-shot kernel a chunk runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LpKernel {
    /// `fc_lp_move` (the two-shot all-reduce: `fc_lp_tree`).
    Plain,
    /// `fc_lp_move_wide`: two CTAs per SM, registers capped.
    Wide,
}

impl fmt::Display for LpKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LpKernel::Plain => "plain",
            LpKernel::Wide => "wide",
        })
    }
}

/// How a low-precision call by direct access runs: launches of `chunk` elements per part (the
/// last takes what is left), each pushing or pulling its records, split or not, on the plain
/// or the wide kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LpForm {
    /// The kernel family.
    pub kind: LpKind,
    /// Push or pull.
    pub moves: LpMove,
    /// Elements per part of one launch (whole tiles; 0 for an empty call).
    pub chunk: usize,
    /// A push of one part leaves its odd groups in the sender's staging for the receivers to
    /// pull ([`lp_split`]).
    pub split: bool,
    /// The kernel of a launch of a whole chunk.
    pub kernel: LpKernel,
    /// The kernel of the last launch (which may hold fewer elements).
    pub last_kernel: LpKernel,
}

/// Elements a warp of the low-precision kernels handles at once (`lp_tile`): 128, or one block
/// when blocks are larger.
pub fn tile(codec: &Codec) -> usize {
    codec.block.max(128)
}

/// Staging bytes of one encoded part of `len` elements (16-aligned, so every region starts
/// where the kernels' 4-byte code loads are aligned).
pub fn region(codec: &Codec, len: usize) -> usize {
    codec.encoded_bytes(len).div_ceil(16) * 16
}

/// Encoded regions one staging parity holds for `kind` at `world` ranks, (pull, push). Pull
/// (the sender's staging): one per input part, so one for the all-reduce and the all-gather;
/// push (the receivers' staging): one per sender.
fn regions_per_parity(kind: LpKind, world: usize) -> (usize, usize) {
    match kind {
        LpKind::Tree => (1, 1),
        LpKind::ReduceScatter | LpKind::AllToAll | LpKind::AllToAllV => (world, world),
        LpKind::Flat | LpKind::AllGather => (1, world),
    }
}

/// Largest chunk (elements per part, whole tiles) whose `nparts` encodings fit in `staging`
/// bytes (0 when not even one tile does).
fn chunk_limit(staging: usize, nparts: usize, codec: &Codec) -> usize {
    let room = staging / nparts.max(1);
    let t = tile(codec);
    let mut c = room / (codec.block + 4) * codec.block / t * t;
    while c > 0 && region(codec, c) > room {
        c -= t;
    }
    c
}

/// How a one-shot collective of `part` elements per part is cut: whether it pushes (records
/// stored into the receivers' staging, a region per sender, at most `push_most` elements per
/// chunk; 0 where push cannot run) or pulls (records in the sender's staging, at most
/// `pull_most`, at least one tile), and the elements per chunk (equal chunks of whole tiles,
/// not full ones and a small remainder). Push wherever it needs no more chunks (kernel
/// launches) than pull: push wins with as many chunks and loses where it needs more
/// (docs/tuning.md, "Where the built-in limits come from").
fn lp_cut(
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

/// The `split` argument of a low-precision one-shot kernel (all-reduce, all-gather,
/// all-to-all) that pushes (`push`) or pulls: 1 where a push leaves its odd groups in the
/// sender's staging for the receivers to pull, so that half the records cross the link while
/// the quantizer runs, the other half while the receivers decode the first (two ranks, groups).
pub fn lp_split(push: bool, codec: &Codec, world: usize) -> u32 {
    u32::from(push && codec.block <= 128 && world == 2)
}

/// Whether a low-precision one-shot all-reduce or all-gather (`splits_kind`; the other kinds
/// never) pushes even where pull would need fewer chunks: the staging holds a region per
/// sender for the push (`push_most`, its largest chunk, is not 0) and the push splits
/// ([`lp_split`]), which overlaps the link with the quantizer and the decode.
pub fn lp_push_first(push_most: usize, codec: &Codec, world: usize, splits_kind: bool) -> bool {
    push_most > 0 && lp_split(true, codec, world) == 1 && splits_kind
}

/// How a low-precision call of `kind` with `part` elements of `es` bytes per part runs at
/// `world` ranks on `dda`'s staging: the chunk (`lp_cut`; push first where
/// [`lp_push_first`] says so, the grouped quantizer's blocks of up to 128 only, and never where
/// the staging holds no region per sender), the split ([`lp_split`]; the all-reduce, the
/// all-gather and the all-to-all) and the kernels (the wide one for chunks from the table's
/// `low_precision.wide_min_bytes`; the two-shot all-reduce has one kernel). Refused where the
/// staging holds less than one tile per part.
pub fn lp_form(
    kind: LpKind,
    part: usize,
    es: usize,
    world: usize,
    codec: &Codec,
    dda: &DdaCaps,
    tuning: &Tuning,
) -> Result<LpForm> {
    let staging = dda.staging_bytes;
    let (pull_parts, push_parts) = regions_per_parity(kind, world);
    let pull_most = chunk_limit(staging, pull_parts, codec);
    let t = tile(codec);
    if pull_most == 0 {
        return Err(Error::InvalidArgument(format!(
            "{}: FERROCOMM_CUDA_STAGING_BYTES={staging} holds less than one low-precision tile \
             of {t} elements per rank",
            kind.collective().name()
        )));
    }
    let push_most = if codec.block <= 128 {
        chunk_limit(staging, push_parts, codec)
    } else {
        0
    };
    let splits_kind = matches!(kind, LpKind::Flat | LpKind::AllGather);
    let pull_most = if lp_push_first(push_most, codec, world, splits_kind) {
        push_most
    } else {
        pull_most
    };
    let (push, chunk) = match part {
        0 => (false, 0),
        _ => lp_cut(kind, part, pull_most, push_most, t),
    };
    let split = matches!(kind, LpKind::Flat | LpKind::AllGather | LpKind::AllToAll)
        && lp_split(push, codec, world) == 1;
    let kernel = |len: usize| {
        if kind != LpKind::Tree && len.saturating_mul(es) >= tuning.lp_wide_min_bytes {
            LpKernel::Wide
        } else {
            LpKernel::Plain
        }
    };
    let last = match chunk {
        0 => 0,
        c => part - (part.div_ceil(c) - 1) * c,
    };
    Ok(LpForm {
        kind,
        moves: if push { LpMove::Push } else { LpMove::Pull },
        chunk,
        split,
        kernel: kernel(chunk),
        last_kernel: kernel(last),
    })
}

/// How a two-rank low-precision all-to-all-v whose largest crossing part holds `cross`
/// elements runs on a staging of `staging` bytes (the same on both ranks: the crossing counts
/// are in both views): launches of the one-shot kernel in all-to-all mode, each on a piece of
/// `chunk` elements of both crossing parts, push or pull as `lp_cut` cuts an all-to-all of
/// `cross` elements per part; the plain kernel (the wide one has no per-part counts), no
/// split. Only where [`a2av_codec_fits`].
pub fn lp_a2av_form(cross: usize, codec: &Codec, staging: usize) -> LpForm {
    let (pull_parts, push_parts) = regions_per_parity(LpKind::AllToAllV, 2);
    let pull_most = chunk_limit(staging, pull_parts, codec);
    let push_most = chunk_limit(staging, push_parts, codec);
    let t = tile(codec);
    let (push, chunk) = lp_cut(LpKind::AllToAllV, cross.max(1), pull_most, push_most, t);
    LpForm {
        kind: LpKind::AllToAllV,
        moves: if push { LpMove::Push } else { LpMove::Pull },
        chunk,
        split: false,
        kernel: LpKernel::Plain,
        last_kernel: LpKernel::Plain,
    }
}

/// Whether a two-rank low-precision all-to-all-v can run with `codec` on a staging of `staging`
/// bytes per parity: blocks of at most 128 (the per-part counts are handled by the grouped
/// kernels only) and room for one tile per part.
pub fn a2av_codec_fits(codec: &Codec, staging: usize) -> bool {
    let (pull_parts, _) = regions_per_parity(LpKind::AllToAllV, 2);
    codec.block <= 128 && chunk_limit(staging, pull_parts, codec) > 0
}

/// Whether the two-rank low-precision all-to-all-v fits a staging of `staging` bytes with the
/// configured block ([`a2av_codec_fits`]; every format's records have the same size).
pub fn a2av_lp_fits(cfg: &Config, staging: usize) -> bool {
    Codec::new(Format::E4M3, cfg.low_precision.block).is_ok_and(|c| a2av_codec_fits(&c, staging))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_low_precision_push_splits_at_two_ranks_with_small_blocks() {
        let small = Codec::new(Format::E4M3, 128).unwrap();
        let large = Codec::new(Format::E4M3, 256).unwrap();
        // Split: a push of blocks up to 128 at two ranks, nothing else.
        assert_eq!(lp_split(true, &small, 2), 1);
        assert_eq!(lp_split(false, &small, 2), 0);
        assert_eq!(lp_split(true, &small, 3), 0);
        assert_eq!(lp_split(true, &large, 2), 0);
        // Push first: only where the staging holds the push, the push splits and the kind is
        // an all-reduce or all-gather.
        assert!(lp_push_first(1, &small, 2, true));
        assert!(!lp_push_first(0, &small, 2, true));
        assert!(!lp_push_first(1, &small, 2, false));
        assert!(!lp_push_first(1, &small, 4, true));
        assert!(!lp_push_first(1, &large, 2, true));
    }

    /// (push, chunk, the most a chunk may hold) for two ranks and a 64 MiB staging parity.
    fn plan2(kind: LpKind, bytes: usize, es: usize) -> (bool, usize, usize) {
        let (pull_parts, push_parts) = regions_per_parity(kind, 2);
        let codec = Codec::new(Format::E4M3, 128).unwrap();
        let most = |nparts| chunk_limit(64 << 20, nparts, &codec);
        let (pull, push) = (most(pull_parts), most(push_parts));
        let (p, c) = lp_cut(kind, bytes / es, pull, push, 128);
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
        assert_eq!(lp_cut(LpKind::Flat, 1000, pull, push, 128), (false, 256));
        assert_eq!(
            lp_cut(LpKind::AllGather, 100, pull, push, 128),
            (false, 128)
        );
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
