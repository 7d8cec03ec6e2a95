//! The fused all-reduce + residual add + RMSNorm on CUDA memory ([`crate::rmsnorm`]), in the
//! form the plan chose ([`NormForm`]): two launches (the backend's own all-reduce leaves the
//! f32-accumulated sum in `out`, push / flat / tree by direct access or NCCL, low precision
//! included, then `fc_rmsnorm`, kernels/rmsnorm.cu, adds the residual and normalizes every
//! row on the same stream), one launch of the fused direct-access kernels (`fc_fused_flat`,
//! `fc_fused_tree`), or for a communicator of one rank `fc_rmsnorm` alone on x. No host
//! synchronisation, no allocation: CUDA-graph capturable like the all-reduce.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use crate::backend::{check_buffers, CallKind, CallOpts};
use crate::config::Config;
use crate::cuda::kernels;
use crate::driver::{self, launch, result, DeviceAttribute, Function};
use crate::error::{Error, Result};
use crate::plan::NormForm;
use crate::quant::Codec;
use crate::rmsnorm::{AllReduceRmsNorm, Fp8Mode, Fp8Scale, Shape, NAME};
use crate::types::{DataType, Device};
use crate::view::{Input, ViewMut};

/// Threads of a norm block (`NORM_THREADS` in kernels/rmsnorm.cu).
const NORM_THREADS: usize = 512;
/// Most 16-byte vectors a thread of `fc_rmsnorm` holds per chunk of a row (`NORM_V`).
const NORM_V: usize = 4;
/// The same for the fused forms, whose sums are reduced from every rank's staging
/// (`NORM_V_STAGED`).
const NORM_V_STAGED: usize = 2;
/// Most blocks of an `fc_rmsnorm` grid; its blocks stride over the rows past it.
const MAX_NORM_BLOCKS: usize = 65535;
/// The most rows whose norm takes the wide geometry by default
/// (`FERROCOMM_RMSNORM_WIDE_MAX_ROWS`): calls of up to 1,024 rows of bf16 4096 ran at 1.16 to
/// 1.45 times torch.compile's time with four vectors a thread, from 2,048 rows at 0.91 to 1.01
/// (bench/results/2026-12-03-h200-norm).
pub(crate) const WIDE_MAX_ROWS: usize = 1024;
/// The norm's entry points: `fc_rmsnorm` (four vectors a thread, every call), the wide
/// geometry's for 1, 2 and 4 vectors a thread (aligned buffers, no FP8 rows) and for every other
/// call, then `fc_rmsnorm_plain` (four vectors a thread, aligned buffers, no FP8 rows: without
/// the registers of the other paths, 128 registers and no spill where `fc_rmsnorm` spills 144
/// bytes; world 1 from 2,048 rows of bf16 at 0.91-0.98 of torch.compile's time where
/// `fc_rmsnorm` took 0.98-1.09, bench/results/2026-12-04-h200-norm-knobs).
const ENTRIES: [&str; 6] = [
    "fc_rmsnorm",
    "fc_rmsnorm_wide1",
    "fc_rmsnorm_wide2",
    "fc_rmsnorm_wide4",
    "fc_rmsnorm_wide",
    "fc_rmsnorm_plain",
];

/// Threads per row for rows of `shape` whose threads hold `v` vectors each: the row's 16-byte
/// vectors over `v`, in whole warps, 32 to 512. A row of at most `v * tpr` vectors stays in
/// registers (one pass). The order of a row's sum of squares follows from it, so every rank
/// computes it the same from the shape alone.
fn threads_per_row(shape: &Shape, v: usize) -> usize {
    let vectors = shape.hidden * shape.dtype.size() / 16;
    vectors
        .div_ceil(v)
        .next_multiple_of(32)
        .clamp(32, NORM_THREADS)
}

/// How a launch of the norm kernel lays the rows over threads. Chosen from the shape and
/// `FERROCOMM_RMSNORM_WIDE_MAX_ROWS` alone (the same on every rank: it fixes the order of a
/// row's sum of squares).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Geometry {
    /// 16-byte vectors a thread holds per chunk of a row.
    v: usize,
    /// Threads a row ([`threads_per_row`]).
    tpr: usize,
    /// The wide entry points (the row in one chunk, the grid holding every row) rather than
    /// `fc_rmsnorm`.
    wide: bool,
}

/// The norm's geometry for `shape`. Up to `wide_max_rows` rows (and at most
/// [`MAX_NORM_BLOCKS`]: a block a row at most) a row takes the fewest vectors a thread (1, 2 or
/// 4) that hold it in 512 threads: few rows are a chain of dependent instructions per thread,
/// which fewer vectors shorten, where many rows are a matter of bandwidth. Larger calls, and rows
/// past 4 x 512 vectors, take four vectors a thread in `fc_rmsnorm`: measured on one H200, the
/// fewest vectors a thread there (one for bf16 4096) ran 4,096 rows at 1.7 TB/s, four at
/// 3.1 TB/s (bench/results/2026-12-03-h200-norm-fewest, 2026-12-03-h200-norm), and a single row
/// took 3.0 µs either way (that kernel carries the registers, one block an SM, and the code of
/// every case; the wide entry points carry their own).
fn geometry(shape: &Shape, wide_max_rows: usize) -> Geometry {
    let vectors = shape.hidden * shape.dtype.size() / 16;
    if shape.rows <= wide_max_rows.min(MAX_NORM_BLOCKS) {
        if let Some(v) = [1, 2, 4]
            .into_iter()
            .find(|&v| vectors.div_ceil(v) <= NORM_THREADS)
        {
            return Geometry {
                v,
                tpr: threads_per_row(shape, v),
                wide: true,
            };
        }
    }
    Geometry {
        v: NORM_V,
        tpr: threads_per_row(shape, NORM_V),
        wide: false,
    }
}

/// Rows per block (and threads per block) for `rows` rows of `tpr` threads spread over at most
/// `blocks` blocks: as few rows a block as fill those blocks, so that a few rows run on as many
/// SMs (their loads in flight at once), up to what 512 threads hold. Which block runs a row
/// changes no result.
fn slots(rows: usize, tpr: usize, blocks: usize) -> (usize, u32) {
    let slots = rows.div_ceil(blocks.max(1)).clamp(1, NORM_THREADS / tpr);
    (slots, (slots * tpr) as u32)
}

/// The kernel's argument struct (`NormArgs` in kernels/rmsnorm.cu), field for field.
#[repr(C)]
#[derive(Clone, Copy)]
struct NormArgs {
    sum: u64,
    residual: u64,
    weight: u64,
    out: u64,
    residual_out: u64,
    codes: u64,
    scales: u64,
    rows: u64,
    hidden: u64,
    eps: f32,
    tpr: u32,
    fp8_given: u32,
    loopback: u32,
    lp_block: u32,
    lp_format: u32,
    v: u32,
    pad: u32,
}

impl NormArgs {
    /// Whether the call is the plain entry points' (every user buffer 16-byte aligned, no FP8
    /// rows), which those kernels assume; the fused ones also need full precision on the wire.
    fn plain(&self) -> bool {
        let ptrs = [
            self.sum,
            self.residual,
            self.weight,
            self.out,
            self.residual_out,
        ];
        self.codes == 0 && ptrs.iter().all(|p| p % 16 == 0)
    }

    /// The norm's arguments of `call`: the sum read from `sum`, the residual and the rest from
    /// the call's buffers; `tpr` threads per row.
    fn new(call: &AllReduceRmsNorm<'_>, sum: u64, shape: &Shape, tpr: u32) -> NormArgs {
        let fp8 = &call.fp8;
        let (scales, given) = match fp8.as_ref().map(|q| &q.scale) {
            None => (0, false),
            Some(Fp8Scale::PerRow(s)) => (s.ptr() as u64, false),
            Some(Fp8Scale::Given(s)) => (s.ptr() as u64, true),
        };
        NormArgs {
            sum,
            residual: call.residual.address(&call.residual_out),
            weight: call.weight.ptr() as u64,
            out: call.out.ptr() as u64,
            residual_out: call.residual_out.ptr() as u64,
            codes: fp8.as_ref().map_or(0, |q| q.codes.ptr() as u64),
            scales,
            rows: shape.rows as u64,
            hidden: shape.hidden as u64,
            eps: call.eps,
            tpr,
            fp8_given: given as u32,
            loopback: 0,
            lp_block: 0,
            lp_format: 0,
            v: NORM_V as u32,
            pad: 0,
        }
    }
}

/// The norm's entry points ([`ENTRIES`]) of `dtype` in the current context and the device's SM
/// count, loaded once per context and dtype.
fn functions(cfg: &Config, dtype: DataType) -> Result<([Function; 6], u32)> {
    /// (context, dtype) -> (the functions, the SM count).
    type Loaded = HashMap<(usize, DataType), ([Function; 6], u32)>;
    static FUNCS: Mutex<Option<Loaded>> = Mutex::new(None);
    let key = (result::ctx_get_current()?, dtype);
    let mut g = FUNCS.lock().unwrap_or_else(|e| e.into_inner());
    let map = g.get_or_insert_with(HashMap::new);
    if let Some(&loaded) = map.get(&key) {
        return Ok(loaded);
    }
    // The caller made the backend's context current.
    let module = kernels::load_on_current_device(
        dtype,
        kernels::Group::RmsNorm,
        cfg,
        "loading the rmsnorm kernel",
    )?;
    let fs = entry_points(|name| module.function(name))?;
    // Kept loaded: its functions are cached for the context.
    module.keep_loaded();
    let sms = driver::current_device_attribute(
        DeviceAttribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
    )?
    .max(1) as u32;
    map.insert(key, (fs, sms));
    Ok((fs, sms))
}

/// The norm's entry points (of the rows' dtype in the current context, in [`ENTRIES`] order:
/// `fc_rmsnorm`, the wide ones), whether launches use PDL, and the device's SM count.
#[derive(Clone, Copy)]
pub(crate) struct NormKernel {
    pub(crate) f: [Function; 6],
    pub(crate) pdl: bool,
    pub(crate) sm_count: u32,
}

impl NormKernel {
    /// The kernel from `func`, which looks an entry point up by name in the rmsnorm unit of the
    /// call's dtype.
    pub(crate) fn from_unit(
        func: impl FnMut(&str) -> Result<Function>,
        pdl: bool,
        sm_count: u32,
    ) -> Result<NormKernel> {
        Ok(NormKernel {
            f: entry_points(func)?,
            pdl,
            sm_count,
        })
    }
}

/// Every entry point of [`ENTRIES`], in its order, looked up by `func`.
fn entry_points(mut func: impl FnMut(&str) -> Result<Function>) -> Result<[Function; 6]> {
    let [a, b, c, d, e, f] = ENTRIES;
    Ok([func(a)?, func(b)?, func(c)?, func(d)?, func(e)?, func(f)?])
}

/// Which entry point ([`ENTRIES`] index) runs a launch of `g` on the buffers of `args`: where
/// every buffer allows 16-byte accesses and no FP8 rows are written, the one for the geometry's
/// vector count (`fc_rmsnorm_plain` for `fc_rmsnorm`'s four, the wide ones'), which assume
/// both; else `fc_rmsnorm` or `fc_rmsnorm_wide`.
fn entry(g: Geometry, args: &NormArgs) -> usize {
    match (g.wide, args.plain()) {
        (false, true) => return 5,
        (false, false) => return 0,
        (true, false) => return 4,
        (true, true) => {}
    }
    match g.v {
        1 => 1,
        2 => 2,
        _ => 3,
    }
}

/// Launches the norm on `stream` over the rows of `args` in the [`geometry`] of `shape` and
/// `wide_max_rows`: [`threads_per_row`] threads a row, the rows spread over the SMs ([`slots`]).
fn launch_norm(
    k: NormKernel,
    mut args: NormArgs,
    shape: &Shape,
    stream: u64,
    wide_max_rows: usize,
) -> Result<()> {
    let g = geometry(shape, wide_max_rows);
    args.tpr = g.tpr as u32;
    args.v = g.v as u32;
    let (slots, threads) = slots(shape.rows, g.tpr, k.sm_count as usize);
    let blocks = shape.rows.div_ceil(slots).clamp(1, MAX_NORM_BLOCKS);
    // The wide kernels take a row a slot and loop over none: their grid holds every row.
    debug_assert!(!g.wide || blocks * slots >= shape.rows);
    let e = entry(g, &args);
    let (f, pdl) = (k.f[e], k.pdl);
    let mut params = [(&mut args as *mut NormArgs).cast::<c_void>()];
    // SAFETY: `f` is an entry point of the rmsnorm unit of this dtype in the current context,
    // taking one NormArgs by value (layout checked against the source in the tests); every
    // pointer in it is memory of this device (check_buffers) holding the sizes the call's check
    // verified; the block is a whole number of rows of `tpr` threads (slots); a wide entry gets
    // its geometry (one chunk of `v` vectors a thread, a grid that holds every row: at most
    // MAX_NORM_BLOCKS rows) and, for those of a vector count and fc_rmsnorm_plain, 16-byte
    // aligned buffers and no FP8 rows (`entry`, NormArgs::plain); every entry starts with
    // griddepcontrol.wait, and `pdl` comes from the device.
    unsafe {
        launch(f, blocks as u32, threads, stream, &mut params, pdl, || {
            format!(
                "launching {} ({} rows of {} {})",
                ENTRIES[e], shape.rows, shape.hidden, shape.dtype
            )
        })
    }
}

/// The norm's entry points of the call's dtype: `loaded` where the backend loaded its modules
/// at start-up (direct access); otherwise the module is loaded now (not inside a graph capture:
/// the first call must run eagerly).
fn norm_function(cfg: &Config, dtype: DataType, loaded: Option<NormKernel>) -> Result<NormKernel> {
    match loaded {
        Some(l) => Ok(l),
        None => {
            let (f, sm_count) = functions(cfg, dtype)?;
            Ok(NormKernel {
                f,
                pdl: driver::pdl_for_current_device(cfg)?,
                sm_count,
            })
        }
    }
}

/// The most rows the norm lays out wide under `cfg` ([`geometry`]).
fn wide_max_rows(cfg: &Config) -> usize {
    cfg.thresholds
        .rmsnorm_wide_max_rows
        .unwrap_or(WIDE_MAX_ROWS)
}

/// Runs `call` (its buffers checked, [`check_buffers`]) in two launches on a backend: the sum
/// into `out` by `all_reduce` (the backend's own, with `opts`), then the norm on `opts.stream`.
/// The backend's context must be current. `loaded`: see [`norm_function`].
pub(crate) fn run(
    cfg: &Config,
    call: AllReduceRmsNorm<'_>,
    shape: Shape,
    opts: &CallOpts,
    loaded: Option<NormKernel>,
    all_reduce: impl FnOnce(Input<'_>, ViewMut<'_>) -> Result<()>,
) -> Result<()> {
    let kernel = norm_function(cfg, shape.dtype, loaded)?;
    let args = NormArgs::new(&call, call.out.ptr() as u64, &shape, 0);
    // The sum over ranks, in f32, rounded once into `out`.
    all_reduce(call.x, call.out)?;
    if shape.rows == 0 {
        return Ok(());
    }
    launch_norm(kernel, args, &shape, opts.stream, wide_max_rows(cfg))
}

/// Runs `call` of a communicator of one rank ([`NormForm::Local`]): its x is the sum, so one
/// launch of `fc_rmsnorm` reads it where it is, on `opts.stream`. The backend's context must be
/// current and the buffers checked ([`check_buffers`]). `loaded`: see [`norm_function`].
pub(crate) fn run_local(
    cfg: &Config,
    call: AllReduceRmsNorm<'_>,
    shape: Shape,
    opts: &CallOpts,
    loaded: Option<NormKernel>,
) -> Result<()> {
    let kernel = norm_function(cfg, shape.dtype, loaded)?;
    if shape.rows == 0 {
        return Ok(());
    }
    let args = NormArgs::new(&call, call.x.address(&call.out), &shape, 0);
    launch_norm(kernel, args, &shape, opts.stream, wide_max_rows(cfg))
}

/// The entry point of a one-launch call of `form` with the arguments `n`: the common call (every
/// user buffer 16-byte aligned, no FP8 rows, full precision on the wire) runs
/// `fc_fused_flat_plain` / `fc_fused_tree_plain`, the same protocol and arithmetic without the
/// registers of the paths it does not take (no spill where the general kernels spill 72 and 12
/// bytes; in loopback on one H200, bf16 4096 x 4096: one-shot 102 -> 74 µs, two-shot 83 -> 72 µs,
/// bench/results/2026-12-04-h200-norm-tree). Ranks may differ here (one rank's buffers aligned,
/// another's not): both kernels give the same bits and meet on the same flags, and the call's
/// signature names the form, not the entry.
fn fused_entry(form: NormForm, n: &NormArgs) -> &'static str {
    match (form, n.lp_block == 0 && n.plain()) {
        (NormForm::FusedFlat, true) => "fc_fused_flat_plain",
        (NormForm::FusedFlat, false) => "fc_fused_flat",
        (_, true) => "fc_fused_tree_plain",
        (_, false) => "fc_fused_tree",
    }
}

/// Grid and block of a one-launch call: rows of [`threads_per_row`]'s threads (one-shot: every
/// row; two-shot: the rows of a stripe) spread over at most one block per SM and
/// [`MAX_BLOCKS`](super::MAX_BLOCKS) (the flag slots), so every block is co-resident with
/// its peers' (they wait for each other). Every rank computes the same from the shape and the
/// SM count: (blocks, threads, threads per row).
fn fused_grid(form: NormForm, shape: Shape, world: usize, sm_count: u32) -> (u32, u32, u32) {
    let rows = match form {
        NormForm::FusedTree => shape.rows.div_ceil(world.max(1)),
        _ => shape.rows,
    };
    let tpr = threads_per_row(&shape, NORM_V_STAGED);
    let max_blocks = (sm_count as usize).clamp(1, super::MAX_BLOCKS);
    let (slots, threads) = slots(rows, tpr, max_blocks);
    (
        rows.div_ceil(slots).clamp(1, max_blocks) as u32,
        threads,
        tpr as u32,
    )
}

/// What every rank of a one-launch call must agree on, as the kernel compares it through the
/// hello words (ranks that disagree end with a mismatch error instead of a wrong result): the
/// kernel (`name`, so the form), rows, hidden, dtype, eps, the FP8 output asked for and the
/// low-precision codec of the wire. Spelled on the stack, the name's and the words' bytes: no
/// allocation per call.
fn fused_signature(
    name: &str,
    shape: &Shape,
    count: usize,
    eps: f32,
    fp8: Fp8Mode,
    codec: Option<&Codec>,
) -> u32 {
    let mut key = [0u8; 72];
    let n = name.len().min(24);
    key[..n].copy_from_slice(&name.as_bytes()[..n]);
    for (k, w) in shape.words(eps, fp8).iter().enumerate() {
        key[n + 8 * k..n + 8 * (k + 1)].copy_from_slice(&w.to_le_bytes());
    }
    let (format, block) = codec.map_or((u32::MAX, 0), |c| {
        (super::lowp::format_code(c.format), c.block as u32)
    });
    key[n + 40..n + 44].copy_from_slice(&format.to_le_bytes());
    key[n + 44..n + 48].copy_from_slice(&block.to_le_bytes());
    super::collectives::signature(
        crate::plan::Collective::AllReduce,
        shape.dtype,
        count,
        0,
        &key[..n + 48],
    )
}

/// Runs `call` in one launch of `fc_fused_flat` or `fc_fused_tree` (kernels/rmsnorm.cu) on the
/// direct-access staging of `dda`, on `opts.stream`: `form` is [`NormForm::FusedFlat`] or
/// [`NormForm::FusedTree`] as [`crate::plan::cuda_rmsnorm`] chose (the rows fit the staging).
/// The backend's context must be current, the buffers checked ([`check_buffers`], `aligned`
/// from [`crate::backend::CallKind::aligned`]) and the call ordered on the stream. With `codec` the
/// rows cross as its block-scaled records (the plan's low precision;
/// [`crate::plan::rows_take_codec`] holds). `loopback` (measurement only, one-rank communicators, `FERROCOMM_RMSNORM_LOOPBACK`):
/// the kernel runs as one of that many ranks whose every peer is this rank (see
/// [`super::Args::loopback`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_fused(
    dda: &super::Dda,
    form: NormForm,
    codec: Option<&Codec>,
    call: AllReduceRmsNorm<'_>,
    shape: Shape,
    aligned: bool,
    opts: &CallOpts,
    loopback: Option<usize>,
) -> Result<()> {
    let name = match form {
        NormForm::FusedFlat => "fc_fused_flat",
        NormForm::FusedTree => "fc_fused_tree",
        NormForm::TwoLaunch | NormForm::Local => {
            return Err(Error::InvalidArgument(format!(
                "{NAME}: {form} is not a one-launch direct-access form"
            )))
        }
    };
    dda.check_error(NAME)?;
    if !aligned {
        return Err(Error::InvalidArgument(format!(
            "{NAME}: pointers must be aligned to the element size ({} bytes)",
            shape.dtype.size()
        )));
    }
    let x_ptr = call.x.address(&call.out);
    if shape.rows == 0 {
        return Ok(());
    }
    let count = shape
        .rows
        .checked_mul(shape.hidden)
        .ok_or_else(|| Error::InvalidArgument(format!("{NAME}: rows x hidden overflows")))?;
    if let Some(c) = codec {
        if !crate::plan::rows_take_codec(shape.hidden, shape.dtype, c) {
            return Err(Error::InvalidArgument(format!(
                "{NAME}: rows of {} {} do not cross in one launch as blocks of {} (a row must be \
                 whole blocks of at most 32 16-byte vectors)",
                shape.hidden, shape.dtype, c.block
            )));
        }
    }
    // The staging must hold the rows (the planner's condition, checked again: a kernel past it
    // would write outside the staging): x's rows (as records with a codec), and for the
    // full-precision two-shot the published residual rows after them.
    let count_all = shape.rows.checked_mul(shape.hidden);
    let staged = match (form, codec) {
        (_, Some(c)) => count_all.map(|n| c.encoded_bytes(n)),
        (NormForm::FusedTree, None) => shape.x_bytes().checked_mul(2),
        _ => Some(shape.x_bytes()),
    };
    let room = dda.layout().staging_bytes;
    if staged.is_none_or(|b| b > room) {
        return Err(Error::InvalidArgument(format!(
            "{NAME}: {form} of {} rows of {} {} needs {} bytes of staging, the staging holds \
             {room} (FERROCOMM_CUDA_STAGING_BYTES)",
            shape.rows,
            shape.hidden,
            shape.dtype,
            staged.map_or("more than usize".to_string(), |b| b.to_string())
        )));
    }
    let world = loopback.unwrap_or(dda.world);
    let (blocks, threads, tpr) = fused_grid(form, shape, world, dda.sm_count);
    let mut n = NormArgs::new(&call, x_ptr, &shape, tpr);
    if let Some(c) = codec {
        n.lp_block = c.block as u32;
        n.lp_format = super::lowp::format_code(c.format);
    }
    let mut a = dda.base_args(x_ptr, call.out.ptr() as u64, count as u64);
    a.sig = fused_signature(name, &shape, count, call.eps, Fp8Mode::of(&call.fp8), codec);
    if let Some(w) = loopback {
        if dda.world != 1 || w == 0 || w > super::MAX_RANKS {
            return Err(Error::InvalidArgument(format!(
                "{NAME}: the loopback measurement runs on a communicator of one rank, as 1 to {} \
                 ranks (asked: {w} on a communicator of {})",
                super::MAX_RANKS,
                dda.world
            )));
        }
        a.loopback(w as u32);
        n.loopback = 1;
    }
    let entry = fused_entry(form, &n);
    let f = dda.func(shape.dtype, entry)?;
    let mut params: [*mut c_void; 2] = [
        (&mut a as *mut super::Args).cast(),
        (&mut n as *mut NormArgs).cast(),
    ];
    // SAFETY: `f` is fc_fused_flat or fc_fused_tree, or their plain entry for 16-byte aligned
    // buffers, no FP8 rows and no codec (fused_entry), of this dtype in the current context,
    // taking one Args and one NormArgs by value (layouts checked against the source in the
    // tests); every pointer in them is memory of this device (check_buffers) holding the sizes
    // the call's check verified, the staging holds the rows (the planner's condition); the
    // block is a whole number of rows of `tpr` threads (fused_grid); the kernel starts with
    // griddepcontrol.wait, and `dda.pdl` comes from the device.
    unsafe {
        launch(
            f,
            blocks,
            threads,
            opts.stream,
            &mut params,
            dda.pdl,
            || {
                format!(
                    "launching {entry} ({} rows of {} {})",
                    shape.rows, shape.hidden, shape.dtype
                )
            },
        )
    }
}

/// The residual add and norm alone, on `stream`: `call.out` already holds the all-reduced rows
/// (an all-reduce run before it on the stream, NCCL's say), so `call.x` must be
/// [`Input::InPlace`]. One launch of the kernel the fused call uses; the context of `device`
/// must be current.
pub fn residual_rmsnorm(
    cfg: &Config,
    device: u32,
    call: AllReduceRmsNorm<'_>,
    stream: u64,
) -> Result<()> {
    if !matches!(call.x, Input::InPlace) {
        return Err(Error::InvalidArgument(format!(
            "{NAME}: the norm alone reads the all-reduced rows from out; pass x in place"
        )));
    }
    let shape = call.check()?;
    // Its buffers checked as a backend checks a call's.
    let kind = CallKind::AllReduceRmsNorm(call);
    check_buffers(&kind, Device::Cuda(device))?;
    let CallKind::AllReduceRmsNorm(call) = kind else {
        unreachable!("built above")
    };
    run(
        cfg,
        call,
        shape,
        &CallOpts::on_stream(stream),
        None,
        |_, _| Ok(()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::Format;

    #[test]
    fn args_have_the_kernel_layout() {
        assert_eq!(
            std::mem::size_of::<NormArgs>(),
            super::super::c_struct_size(kernels::RMSNORM_SOURCE, "NormArgs")
        );
    }

    #[test]
    fn the_fused_signature_tells_every_disagreement_apart() {
        let shape = Shape {
            rows: 16,
            hidden: 4096,
            dtype: DataType::BF16,
        };
        let sig = |name, shape: &Shape, eps, fp8| {
            fused_signature(name, shape, shape.rows * shape.hidden, eps, fp8, None)
        };
        let base = sig("fc_fused_flat", &shape, 1e-5, Fp8Mode::Off);
        assert_eq!(base, sig("fc_fused_flat", &shape, 1e-5, Fp8Mode::Off));
        let rows = Shape { rows: 8, ..shape };
        let f32_rows = Shape {
            dtype: DataType::F32,
            ..shape
        };
        let others = [
            sig("fc_fused_tree", &shape, 1e-5, Fp8Mode::Off),
            sig("fc_fused_flat", &rows, 1e-5, Fp8Mode::Off),
            sig("fc_fused_flat", &f32_rows, 1e-5, Fp8Mode::Off),
            sig("fc_fused_flat", &shape, 1e-6, Fp8Mode::Off),
            sig("fc_fused_flat", &shape, 1e-5, Fp8Mode::PerRow),
            sig("fc_fused_flat", &shape, 1e-5, Fp8Mode::Given),
        ];
        for (k, o) in others.iter().enumerate() {
            assert_ne!(*o, base, "case {k}");
        }
        assert_ne!(others[4], others[5], "per-row and given scales");
        // The wire's codec: none, E4M3 blocks of 128, E5M2 blocks of 128, E4M3 blocks of 64.
        let codec = |f, b| Codec::new(f, b).unwrap();
        let lp = |c: Option<&Codec>| {
            fused_signature("fc_fused_flat", &shape, 16 * 4096, 1e-5, Fp8Mode::Off, c)
        };
        let (a, b, c) = (
            codec(Format::E4M3, 128),
            codec(Format::E5M2, 128),
            codec(Format::E4M3, 64),
        );
        let sigs = [lp(None), lp(Some(&a)), lp(Some(&b)), lp(Some(&c))];
        for i in 0..sigs.len() {
            for j in i + 1..sigs.len() {
                assert_ne!(sigs[i], sigs[j], "codecs {i} and {j}");
            }
        }
    }

    fn shape(rows: usize, hidden: usize, dtype: DataType) -> Shape {
        Shape {
            rows,
            hidden,
            dtype,
        }
    }

    #[test]
    fn a_row_is_held_by_whole_warps() {
        let tpr = |rows, hidden, dtype, v| threads_per_row(&shape(rows, hidden, dtype), v);
        // bf16 4096: 512 vectors of 16 bytes, four per thread: 128 threads a row.
        assert_eq!(tpr(1, 4096, DataType::BF16, NORM_V), 128);
        // Two per thread (the fused forms): 256 threads a row.
        assert_eq!(tpr(1, 4096, DataType::BF16, NORM_V_STAGED), 256);
        // bf16 8192 and f32 4096 alike by bytes: 1024 vectors.
        assert_eq!(tpr(1, 8192, DataType::BF16, NORM_V), 256);
        assert_eq!(tpr(1, 8192, DataType::F32, NORM_V), 512);
        // A narrow row still gets a whole warp; 3 warps for 384 vectors.
        assert_eq!(tpr(1, 8, DataType::F16, NORM_V), 32);
        assert_eq!(tpr(1, 3072, DataType::BF16, NORM_V), 96);
        // Longer rows than 512 threads hold take chunks: 512 threads.
        assert_eq!(tpr(1, 65536, DataType::F32, NORM_V), 512);
    }

    #[test]
    fn few_rows_are_laid_out_wide_and_many_four_vectors_a_thread() {
        let g = |rows, hidden, dtype| geometry(&shape(rows, hidden, dtype), WIDE_MAX_ROWS);
        let wide = |v, tpr| Geometry { v, tpr, wide: true };
        let four = |tpr| Geometry {
            v: NORM_V,
            tpr,
            wide: false,
        };
        // bf16 4096 (512 vectors): one a thread up to 1,024 rows, then four (128 threads).
        assert_eq!(g(1, 4096, DataType::BF16), wide(1, 512));
        assert_eq!(g(1024, 4096, DataType::BF16), wide(1, 512));
        assert_eq!(g(1025, 4096, DataType::BF16), four(128));
        assert_eq!(g(4096, 4096, DataType::BF16), four(128));
        // bf16 8192 and f32 4096 (1024 vectors): two; f32 8192: four, in 512 threads.
        assert_eq!(g(64, 8192, DataType::BF16), wide(2, 512));
        assert_eq!(g(64, 4096, DataType::F32), wide(2, 512));
        assert_eq!(g(64, 8192, DataType::F32), wide(4, 512));
        // Narrow rows: whole warps (3072 bf16: 384 vectors, 12 warps; 8 elements: one warp).
        assert_eq!(g(7, 3072, DataType::BF16), wide(1, 384));
        assert_eq!(g(7, 8, DataType::F16), wide(1, 32));
        // Past 4 x 512 vectors a row takes chunks of four vectors a thread at any row count.
        assert_eq!(g(1, 32768, DataType::BF16), four(512));
        // The threshold: 0 never, and never past a block a row.
        let s = shape(1, 4096, DataType::BF16);
        assert!(!geometry(&s, 0).wide);
        assert!(geometry(&s, 1).wide);
        let many = shape(MAX_NORM_BLOCKS + 1, 4096, DataType::BF16);
        assert!(!geometry(&many, usize::MAX).wide);
        assert!(geometry(&shape(MAX_NORM_BLOCKS, 8, DataType::F16), usize::MAX).wide);
    }

    fn args(ptr: u64, codes: u64) -> NormArgs {
        NormArgs {
            sum: ptr,
            residual: ptr,
            weight: ptr,
            out: ptr,
            residual_out: ptr,
            codes,
            scales: 0,
            rows: 1,
            hidden: 4096,
            eps: 1e-6,
            tpr: 0,
            fp8_given: 0,
            loopback: 0,
            lp_block: 0,
            lp_format: 0,
            v: 0,
            pad: 0,
        }
    }

    /// `a` with user buffer `field` (sum, residual, weight, out, residual_out) moved by `bytes`.
    fn off_by(mut a: NormArgs, field: usize, bytes: u64) -> NormArgs {
        let p = [
            &mut a.sum,
            &mut a.residual,
            &mut a.weight,
            &mut a.out,
            &mut a.residual_out,
        ];
        *p.into_iter().nth(field).unwrap() += bytes;
        a
    }

    #[test]
    fn the_entry_point_follows_the_geometry_the_alignment_and_fp8() {
        let names = |g, a: &NormArgs| ENTRIES[entry(g, a)];
        let wide = |v| Geometry {
            v,
            tpr: 512,
            wide: true,
        };
        let four = Geometry {
            v: NORM_V,
            tpr: 128,
            wide: false,
        };
        let aligned = args(1 << 20, 0);
        assert_eq!(names(wide(1), &aligned), "fc_rmsnorm_wide1");
        assert_eq!(names(wide(2), &aligned), "fc_rmsnorm_wide2");
        assert_eq!(names(wide(4), &aligned), "fc_rmsnorm_wide4");
        assert_eq!(names(four, &aligned), "fc_rmsnorm_plain");
        // FP8 rows, or any buffer off 16 bytes: the kernels that handle every call.
        assert_eq!(names(wide(1), &args(1 << 20, 1 << 21)), "fc_rmsnorm_wide");
        assert_eq!(names(four, &args(1 << 20, 1 << 21)), "fc_rmsnorm");
        for field in 0..5 {
            let a = off_by(aligned, field, 2);
            assert_eq!(names(wide(1), &a), "fc_rmsnorm_wide", "buffer {field}");
            assert_eq!(names(four, &a), "fc_rmsnorm", "buffer {field}");
        }
    }

    #[test]
    fn the_plain_fused_entries_take_aligned_full_precision_rows_without_fp8() {
        let aligned = args(1 << 20, 0);
        assert_eq!(
            fused_entry(NormForm::FusedFlat, &aligned),
            "fc_fused_flat_plain"
        );
        assert_eq!(
            fused_entry(NormForm::FusedTree, &aligned),
            "fc_fused_tree_plain"
        );
        let fp8 = args(1 << 20, 1 << 21);
        assert_eq!(fused_entry(NormForm::FusedFlat, &fp8), "fc_fused_flat");
        assert_eq!(fused_entry(NormForm::FusedTree, &fp8), "fc_fused_tree");
        let mut lp = aligned;
        lp.lp_block = 128;
        assert_eq!(fused_entry(NormForm::FusedFlat, &lp), "fc_fused_flat");
        assert_eq!(fused_entry(NormForm::FusedTree, &lp), "fc_fused_tree");
        for field in 0..5 {
            let a = off_by(aligned, field, 8);
            assert_eq!(
                fused_entry(NormForm::FusedFlat, &a),
                "fc_fused_flat",
                "{field}"
            );
            assert_eq!(
                fused_entry(NormForm::FusedTree, &a),
                "fc_fused_tree",
                "{field}"
            );
        }
        for e in [
            "fc_fused_flat_plain",
            "fc_fused_flat",
            "fc_fused_tree_plain",
            "fc_fused_tree",
        ] {
            assert!(kernels::RMSNORM_ENTRIES.contains(&e), "{e:?}");
        }
    }

    #[test]
    fn every_entry_point_is_in_the_unit() {
        for e in ENTRIES {
            assert!(kernels::RMSNORM_ENTRIES.contains(&e), "{e:?}");
        }
    }

    #[test]
    fn few_rows_spread_over_the_sms_and_many_fill_the_blocks() {
        // 64 rows over 132 SMs: a row a block; 4096 rows: 32 a block would do, 4 fit (128
        // threads a row); 3 warps a row: 5 rows in 480 threads.
        assert_eq!(slots(64, 128, 132), (1, 128));
        assert_eq!(slots(4096, 128, 132), (4, 512));
        assert_eq!(slots(100_000, 96, 132), (5, 480));
        assert_eq!(slots(300, 32, 132), (3, 96));
        for (rows, tpr, blocks) in [(1, 512, 132), (7, 160, 4), (0, 32, 132)] {
            let (n, threads) = slots(rows, tpr, blocks);
            assert!(n >= 1 && threads as usize == n * tpr && threads <= 512);
        }
    }

    #[test]
    fn a_fused_grid_takes_whole_rows_at_most_a_block_per_sm() {
        // bf16 4096 (256 threads a row): 3 rows take 3 blocks of one row.
        let s = shape(3, 4096, DataType::BF16);
        assert_eq!(fused_grid(NormForm::FusedFlat, s, 2, 132), (3, 256, 256));
        // Two-shot: blocks per stripe (129 rows over 3 ranks: 43, one row a block of 512).
        let s = shape(129, 16384, DataType::F32);
        assert_eq!(fused_grid(NormForm::FusedTree, s, 3, 132), (43, 512, 512));
        // At most one block per SM, as many rows a block as fit.
        let s = shape(100000, 8, DataType::F16);
        assert_eq!(fused_grid(NormForm::FusedFlat, s, 2, 132), (132, 512, 32));
        let s = shape(1000, 4096, DataType::BF16);
        assert_eq!(fused_grid(NormForm::FusedFlat, s, 2, 132), (132, 512, 256));
        // One row over three ranks: ranks 1 and 2 own none but run the same grid.
        let s = shape(1, 40, DataType::F32);
        assert_eq!(fused_grid(NormForm::FusedTree, s, 3, 132), (1, 32, 32));
    }
}
