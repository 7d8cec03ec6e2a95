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
use crate::plan::{region, tile, LpForm, LpKernel, LpKind, LpMove};
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

/// Launches `f`, a lowp kernel taking (Args, Lp) by value (both laid out as in the kernel
/// source; every lowp kernel starts with pdl_wait()), on `grid` blocks of [`WARPS`] warps.
///
/// # Safety
/// As [`launch`]: `f` is a function of the current context, every pointer in `a` and `l` is
/// device memory of that context holding what the kernel reads and writes there.
unsafe fn launch_lp(
    f: Function,
    grid: u32,
    stream: u64,
    pdl: bool,
    a: &mut Args,
    l: &mut Lp,
    what: impl FnOnce() -> String,
) -> Result<()> {
    let mut params: [*mut c_void; 2] = [(a as *mut Args).cast(), (l as *mut Lp).cast()];
    // SAFETY: per the caller's promise; `params` points at one Args and one Lp, as `f` takes.
    unsafe { launch(f, grid, (WARPS * 32) as u32, stream, &mut params, pdl, what) }
}

impl Dda {
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
        // SAFETY: `f` is a lowp kernel of the current context; the pointers inside were
        // validated by the communicator (device memory of this GPU holding the counts the
        // strides and chunk sizes imply).
        unsafe {
            launch_lp(f, grid, stream, self.pdl, &mut a, &mut l, || {
                format!("launching {name} ({})", what())
            })
        }
    }

    /// One low-precision collective of `part` elements per part on `stream`, cut and moved as
    /// its plan's `form` says ([`crate::plan::lp_form`]). Pointers: all-reduce `input`/`output`
    /// hold `part` elements; all-gather `input` holds `part` and `output` `world * part`;
    /// reduce-scatter `input` `world * part` and `output` `part`; all-to-all both `world *
    /// part`. `avg` divides sums by the world size.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn lp_collective(
        &self,
        form: &LpForm,
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
        let (kind, chunk) = (form.kind, form.chunk.max(1));
        let push = form.moves == LpMove::Push;
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
            let last = off + len == part;
            let one_shot = match if last { form.last_kernel } else { form.kernel } {
                LpKernel::Wide => "fc_lp_move_wide",
                LpKernel::Plain => "fc_lp_move",
            };
            let (name, grid) = match kind {
                LpKind::AllToAllV => {
                    return Err(Error::InvalidArgument(
                        "all_to_all_v: a low-precision form run as an all-to-all".into(),
                    ))
                }
                LpKind::Tree => ("fc_lp_tree", grid_for(tiles.div_ceil(world))),
                LpKind::Flat => {
                    l.reduce = 1;
                    l.split = u32::from(form.split);
                    (one_shot, grid_for(units))
                }
                LpKind::AllGather => {
                    l.out_stride = part as u64;
                    l.split = u32::from(form.split);
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
                    l.split = u32::from(form.split);
                    l.in_stride = part as u64;
                    l.out_stride = part as u64;
                    (one_shot, grid_for(units))
                }
            };
            let grid = grid.min(self.lp_wave(dtype, name)?);
            self.lp_launch(name, dtype, a, l, grid, stream, || {
                format!(
                    "{} {} {dtype}, {len} of {part} elements",
                    kind.collective().name(),
                    codec.format
                )
            })?;
            off += len;
        }
        Ok(())
    }

    /// A low-precision all-to-all-v on two ranks as its plan's `form` says
    /// ([`crate::plan::lp_a2av_form`]: pieces of `form.chunk` elements of both crossing parts,
    /// push or pull): every part a rank sends the other is quantized once, the own part copied
    /// exactly.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn lp_all_to_all_v(
        &self,
        form: &LpForm,
        codec: &Codec,
        dtype: DataType,
        input: u64,
        output: u64,
        splits: &Splits,
        stream: u64,
    ) -> Result<()> {
        let world = self.world;
        let rank = self.rank;
        let chunk = form.chunk.max(1);
        let pieces = a2av_pieces(rank, splits, chunk);
        // The plain kernel at every size: the wide one has no per-part counts (kernels/lowp.cu).
        let name = "fc_lp_move";
        let wave = self.lp_wave(dtype, name)?;
        for i in 0..pieces {
            let s = a2av_piece(rank, splits, i, chunk);
            let len = a2av_largest_crossing(rank, &s);
            let a = self.base_args(input, output, len as u64);
            let mut l = Lp {
                block: codec.block as u32,
                format: format_code(codec.format),
                nin: world as u32,
                region: region(codec, chunk) as u64,
                push: u32::from(form.moves == LpMove::Push),
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
                    codec.format,
                    a2av_largest_crossing(rank, splits)
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
    let pdl = driver::pdl_for_current_device(cfg)?;
    for _ in 0..launches.max(1) {
        // SAFETY: fc_lp_encode of the current context; the caller promises `count` elements at
        // `input` and the encoded size at `output`, device memory of the current context;
        // `pdl` was decided for this context's device.
        unsafe {
            launch_lp(f, grid, stream, pdl, &mut a, &mut l, || {
                "launching fc_lp_encode".into()
            })
        }?;
    }
    // SAFETY: waits for the launches above on the caller's stream (a live stream of the
    // current context, the function's contract).
    unsafe { result::stream_synchronize(stream, "fc_lp_encode") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{a2av_codec_fits, lp_a2av_form};
    use crate::types::Collective;

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
        for m in [
            [[5_000_000, 10], [3_000_001, 7]],
            [[0, 0], [0, 9_000_000]],
            [[1, 1 << 20], [(1 << 20) + 1, 1]],
            [[4, 0], [0, 4]],
            // Crossing parts of several chunks, one each way, and an own part larger still.
            [[90_000_000, 40 << 20], [70_000_001, 3]],
        ] {
            let v = views2(m);
            // Each rank's plan, from the largest crossing part it sees.
            let plans =
                [0, 1].map(|r| lp_a2av_form(a2av_largest_crossing(r, &v[r]), &codec, staging));
            assert_eq!(plans[0], plans[1], "{m:?}");
            let p = plans[0];
            let cross = m[0][1].max(m[1][0]);
            assert_eq!(a2av_largest_crossing(0, &v[0]), cross, "{m:?}");
            // Every piece's region fits the staging, as push or pull lays them out (a region
            // per part either way at two ranks).
            assert!(2 * region(&codec, p.chunk) <= staging, "{m:?} {p:?}");
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
        // Blocks above 128: the codec does not fit (the plan goes full precision).
        assert!(a2av_codec_fits(&codec, staging));
        assert!(!a2av_codec_fits(
            &Codec::new(Format::E4M3, 512).unwrap(),
            staging
        ));
    }
}
