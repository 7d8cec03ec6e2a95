//! The fused all-reduce + residual add + RMSNorm on CUDA memory ([`crate::rmsnorm`]): the
//! backend's own all-reduce leaves the f32-accumulated sum in `out` (push / flat / tree by direct
//! access, or NCCL, chosen by size as for a plain all-reduce, low precision included), then one
//! launch of `fc_rmsnorm` (kernels/rmsnorm.cu) on the same stream adds the residual and
//! normalizes every row, FP8 rows included. No host synchronisation, no allocation: CUDA-graph
//! capturable like the all-reduce.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use crate::backend::{check_buffers, CallKind, CallOpts};
use crate::config::Config;
use crate::cuda::kernels;
use crate::driver::{self, launch, result, Function};
use crate::error::{Error, Result};
use crate::plan::NormForm;
use crate::rmsnorm::{AllReduceRmsNorm, Fp8Rows, Shape, NAME};
use crate::types::{DataType, Device};
use crate::view::{Input, View, ViewMut};

/// Threads of one row's block: a quarter of the row (32 to 512, whole warps).
fn threads_for(hidden: usize) -> u32 {
    (hidden / 4).next_multiple_of(32).clamp(32, 512) as u32
}

/// Blocks of the grid: one per row, grid-striding past this many rows.
const MAX_BLOCKS: usize = 8192;

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
    pad: u32,
}

impl NormArgs {
    /// The norm's arguments: the sum read from `sum`, the residual from `residual`, the rest
    /// from the call's buffers.
    #[allow(clippy::too_many_arguments)]
    fn new(
        sum: u64,
        residual: u64,
        weight: &View<'_>,
        out: &ViewMut<'_>,
        residual_out: &ViewMut<'_>,
        fp8: &Option<Fp8Rows<'_>>,
        shape: &Shape,
        eps: f32,
    ) -> NormArgs {
        NormArgs {
            sum,
            residual,
            weight: weight.ptr() as u64,
            out: out.ptr() as u64,
            residual_out: residual_out.ptr() as u64,
            codes: fp8.as_ref().map_or(0, |q| q.codes.ptr() as u64),
            scales: fp8.as_ref().map_or(0, |q| q.scales.ptr() as u64),
            rows: shape.rows as u64,
            hidden: shape.hidden as u64,
            eps,
            pad: 0,
        }
    }
}

/// `fc_rmsnorm` of `dtype` in the current context, loaded once per context and dtype.
fn function(cfg: &Config, dtype: DataType) -> Result<Function> {
    static FUNCS: Mutex<Option<HashMap<(usize, DataType), Function>>> = Mutex::new(None);
    let key = (result::ctx_get_current()?, dtype);
    let mut g = FUNCS.lock().unwrap_or_else(|e| e.into_inner());
    let map = g.get_or_insert_with(HashMap::new);
    if let Some(&f) = map.get(&key) {
        return Ok(f);
    }
    // The caller made the backend's context current.
    let module = kernels::load_on_current_device(dtype, cfg, "loading the rmsnorm kernel")?;
    let f = module.function("fc_rmsnorm")?;
    // Kept loaded: its function is cached for the context.
    module.keep_loaded();
    map.insert(key, f);
    Ok(f)
}

/// Runs `call` (its buffers checked, [`check_buffers`]) on a backend: the sum into `out` by
/// `all_reduce` (the backend's own, with `opts`), then the norm on `opts.stream`. The
/// backend's context must be current. `loaded` is `fc_rmsnorm` of the
/// call's dtype and whether launches use PDL, where the backend loaded its modules at start-up
/// (direct access); otherwise the module is loaded at the first call (not inside a graph
/// capture: the first call must run eagerly).
pub(crate) fn run(
    cfg: &Config,
    call: AllReduceRmsNorm<'_>,
    shape: Shape,
    opts: &CallOpts,
    loaded: Option<(Function, bool)>,
    all_reduce: impl FnOnce(Input<'_>, ViewMut<'_>) -> Result<()>,
) -> Result<()> {
    let AllReduceRmsNorm {
        x,
        mut out,
        residual,
        residual_out,
        weight,
        eps,
        fp8,
    } = call;
    let (f, pdl) = match loaded {
        Some(l) => l,
        None => (
            function(cfg, shape.dtype)?,
            driver::pdl_for_current_device(cfg)?,
        ),
    };
    let residual_ptr = residual.address(&residual_out);
    let mut args = NormArgs::new(
        out.ptr() as u64,
        residual_ptr,
        &weight,
        &out,
        &residual_out,
        &fp8,
        &shape,
        eps,
    );
    // The sum over ranks, in f32, rounded once into `out`.
    all_reduce(x, out.reborrow())?;
    if shape.rows == 0 {
        return Ok(());
    }
    let blocks = shape.rows.min(MAX_BLOCKS) as u32;
    let mut params = [(&mut args as *mut NormArgs).cast::<c_void>()];
    let threads = threads_for(shape.hidden);
    // SAFETY: `f` is fc_rmsnorm of this dtype in the current context, taking one NormArgs by
    // value (layout checked against the source in the tests); every pointer in it is memory of
    // this device (check_buffers) holding the sizes the call's check verified; the kernel starts
    // with griddepcontrol.wait, and `pdl` comes from pdl_for_current_device.
    unsafe {
        launch(f, blocks, threads, opts.stream, &mut params, pdl, || {
            format!(
                "launching fc_rmsnorm ({} rows of {} {})",
                shape.rows, shape.hidden, shape.dtype
            )
        })
    }
}

/// Grid and block of a one-launch call: one block per row (one-shot) or per row of a stripe
/// (two-shot), at most one per SM and [`MAX_BLOCKS`](super::MAX_BLOCKS) (the flag slots),
/// every block co-resident with its peers' (they wait for each other); a thread per 16-byte
/// vector of a row, whole warps, 32 to 512. Every rank computes the same from the shape.
fn fused_grid(form: NormForm, shape: Shape, world: usize, sm_count: u32) -> (u32, u32) {
    let rows = match form {
        NormForm::FusedTree => shape.rows.div_ceil(world.max(1)),
        _ => shape.rows,
    };
    let max_blocks = (sm_count as usize).clamp(1, super::MAX_BLOCKS);
    let vectors = shape.hidden * shape.dtype.size() / 16;
    (
        rows.clamp(1, max_blocks) as u32,
        vectors.next_multiple_of(32).clamp(32, 512) as u32,
    )
}

/// What every rank of a one-launch call must agree on, as the kernel compares it through the
/// hello words (ranks that disagree end with a mismatch error instead of a wrong result): the
/// kernel (`name`, so the form), rows, hidden, dtype, eps and whether FP8 rows are asked for.
/// Spelled on the stack, the name's and the words' bytes: no allocation per call.
fn fused_signature(name: &str, shape: &Shape, count: usize, eps: f32, fp8: bool) -> u32 {
    let mut key = [0u8; 64];
    let n = name.len().min(64 - 40);
    key[..n].copy_from_slice(&name.as_bytes()[..n]);
    for (k, w) in shape.words(eps, fp8).iter().enumerate() {
        key[n + 8 * k..n + 8 * (k + 1)].copy_from_slice(&w.to_le_bytes());
    }
    super::collectives::signature(
        crate::plan::Collective::AllReduce,
        shape.dtype,
        count,
        0,
        &key[..n + 40],
    )
}

/// Runs `call` in one launch of `fc_fused_flat` or `fc_fused_tree` (kernels/rmsnorm.cu) on the
/// direct-access staging of `dda`, on `opts.stream`: `form` is [`NormForm::FusedFlat`] or
/// [`NormForm::FusedTree`] as [`crate::plan::cuda_rmsnorm`] chose (the rows fit the staging).
/// The backend's context must be current, the buffers checked ([`check_buffers`], `aligned`
/// from [`crate::backend::CallKind::aligned`]) and the call ordered on the stream.
pub(crate) fn run_fused(
    dda: &super::Dda,
    form: NormForm,
    call: AllReduceRmsNorm<'_>,
    shape: Shape,
    aligned: bool,
    opts: &CallOpts,
) -> Result<()> {
    let name = match form {
        NormForm::FusedFlat => "fc_fused_flat",
        NormForm::FusedTree => "fc_fused_tree",
        NormForm::TwoLaunch => {
            return Err(Error::InvalidArgument(format!(
                "{NAME}: {form} is not a one-launch form"
            )))
        }
    };
    let AllReduceRmsNorm {
        x,
        out,
        residual,
        residual_out,
        weight,
        eps,
        fp8,
    } = call;
    dda.check_error(NAME)?;
    if !aligned {
        return Err(Error::InvalidArgument(format!(
            "{NAME}: pointers must be aligned to the element size ({} bytes)",
            shape.dtype.size()
        )));
    }
    let x_ptr = x.address(&out);
    let residual_ptr = residual.address(&residual_out);
    if shape.rows == 0 {
        return Ok(());
    }
    let count = shape
        .rows
        .checked_mul(shape.hidden)
        .ok_or_else(|| Error::InvalidArgument(format!("{NAME}: rows x hidden overflows")))?;
    let mut n = NormArgs::new(
        x_ptr,
        residual_ptr,
        &weight,
        &out,
        &residual_out,
        &fp8,
        &shape,
        eps,
    );
    let mut a = dda.base_args(x_ptr, out.ptr() as u64, count as u64);
    a.sig = fused_signature(name, &shape, count, eps, fp8.is_some());
    let f = dda.func(shape.dtype, name)?;
    let (blocks, threads) = fused_grid(form, shape, dda.world, dda.sm_count);
    let mut params: [*mut c_void; 2] = [
        (&mut a as *mut super::Args).cast(),
        (&mut n as *mut NormArgs).cast(),
    ];
    // SAFETY: `f` is fc_fused_flat / fc_fused_tree of this dtype in the current context,
    // taking one Args and one NormArgs by value (layouts checked against the source in the
    // tests); every pointer in them is memory of this device (check_buffers) holding the sizes
    // the call's check verified, the staging holds the rows (the planner's condition); the
    // kernel starts with griddepcontrol.wait, and `dda.pdl` comes from the device.
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
                    "launching {name} ({} rows of {} {})",
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
            fused_signature(name, shape, shape.rows * shape.hidden, eps, fp8)
        };
        let base = sig("fc_fused_flat", &shape, 1e-5, false);
        assert_eq!(base, sig("fc_fused_flat", &shape, 1e-5, false));
        let rows = Shape { rows: 8, ..shape };
        let f32_rows = Shape {
            dtype: DataType::F32,
            ..shape
        };
        let others = [
            sig("fc_fused_tree", &shape, 1e-5, false),
            sig("fc_fused_flat", &rows, 1e-5, false),
            sig("fc_fused_flat", &f32_rows, 1e-5, false),
            sig("fc_fused_flat", &shape, 1e-6, false),
            sig("fc_fused_flat", &shape, 1e-5, true),
        ];
        for (k, o) in others.iter().enumerate() {
            assert_ne!(*o, base, "case {k}");
        }
    }

    #[test]
    fn a_fused_grid_takes_whole_rows() {
        let shape = |rows, hidden, dtype| Shape {
            rows,
            hidden,
            dtype,
        };
        // bf16 4096: 512 vectors of 16 bytes, one thread each.
        let s = shape(3, 4096, DataType::BF16);
        assert_eq!(fused_grid(NormForm::FusedFlat, s, 2, 132), (3, 512));
        // Two-shot: blocks per stripe (129 rows over 3 ranks: 43).
        let s = shape(129, 16384, DataType::F32);
        assert_eq!(fused_grid(NormForm::FusedTree, s, 3, 132), (43, 512));
        // At most one block per SM; a narrow row still gets a whole warp.
        let s = shape(1000, 8, DataType::F16);
        assert_eq!(fused_grid(NormForm::FusedFlat, s, 2, 132), (132, 32));
        // One row over three ranks: ranks 1 and 2 own none but run the same grid.
        let s = shape(1, 40, DataType::F32);
        assert_eq!(fused_grid(NormForm::FusedTree, s, 3, 132), (1, 32));
    }

    #[test]
    fn a_row_gets_whole_warps_up_to_512_threads() {
        assert_eq!(threads_for(8), 32);
        assert_eq!(threads_for(4096), 512);
        assert_eq!(threads_for(520), 160);
        assert_eq!(threads_for(16384), 512);
    }
}
