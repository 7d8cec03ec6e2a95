//! The CUDA backend: direct data access (DDA) over NVLink through IPC-mapped staging buffers,
//! with NCCL underneath for what DDA does not cover or does not win.
//!
//! - [`kernels`]: the kernel registry: each unit's code (built in, cached, or compiled with
//!   NVRTC at first use) and its module; `kernel_units` (which kernels compile together),
//!   `nvrtc` and `kernel_cache` (the disk cache and its lock) are shared with the build script;
//! - `launch`: the one kernel launch (programmatic dependent launch on sm_90 when enabled);
//! - `dda`: IPC staging, peer mapping and checks; `dda::all_reduce`: the push / flat / tree
//!   all-reduce launches;
//! - [`collectives`]: direct-access all-gather, reduce-scatter, all-to-all(v), broadcast, reduce;
//! - `fused_norm`: the fused all-reduce + RMSNorm (the all-reduce, then one norm launch);
//! - `backend`: the [`Backend`] that chooses between DDA and NCCL per call;
//! - [`nvml`]: whether two GPUs are joined by NVLink (the LL128 all-reduce needs it);
//! - `window`: one-sided communication (puts, signals, waits on IPC-mapped buffers).
//!
//! Beyond the backend, the items below are public for the programs that size and check the
//! direct-access paths from outside the crate: the staging layout and its sizes
//! ([`staging_layout`], [`push_capacity`], [`ll128_line_bytes`], [`flat_grid`], [`ce_chunk`]) for
//! the integration tests, [`quantize_on_device`] for the low-precision GPU check program and
//! [`residual_rmsnorm`] for `ferrocomm bench`.

mod backend;
pub mod collectives;
mod dda;
mod fused_norm;
pub mod kernel_cache;
mod kernel_units;
pub mod kernels;
mod launch;
mod lowp;
pub mod nvml;
mod nvrtc;
mod window;

use crate::backend::{Backend, CommContext};
use crate::config::Config;
use crate::error::Result;

pub use dda::{
    ce_chunk, flat_grid, ll128_line_bytes, push_capacity, staging_layout, StagingLayout,
    CE_MAX_CHUNKS, LL128_PAYLOAD,
};
pub use fused_norm::residual_rmsnorm;
pub use lowp::quantize_on_device;

pub(crate) use crate::driver::{cu, cu_lazy, open_context};
/// The driver leaf's library probing and device count, where they were first found.
pub use crate::driver::{gpu_count, libs};

/// The CUDA backend for `ctx` (DDA where possible, NCCL for the rest).
pub fn new_backend(ctx: &CommContext) -> Result<Box<dyn Backend>> {
    Ok(Box::new(backend::CudaBackend::new(ctx)?))
}

/// Device memory one communicator of `world` ranks allocates for DDA on each GPU, in bytes
/// (flags and state, push buffers, double-buffered staging); see docs/cuda-backend.md.
pub fn staging_memory_bytes(cfg: &Config, world: usize) -> usize {
    staging_layout(cfg, world).total
}

/// What direct access has for `world` ranks under `cfg`, for the planner: the staging
/// layout's sizes, the copy engines' smallest all-reduce where they are set up (`ce_min`), the
/// NVLink verdict that LL128 lines need. A communicator reports its own (`dda::Dda`'s, after its
/// start-up checks); `ferrocomm info` plans from the configuration with this.
pub fn dda_caps(
    cfg: &Config,
    world: usize,
    ce_min: Option<usize>,
    ll128_links: bool,
) -> crate::plan::DdaCaps {
    let layout = staging_layout(cfg, world);
    crate::plan::DdaCaps {
        staging_bytes: layout.staging_bytes,
        push_cap: layout.push_cap,
        ce_bytes: layout.ce_bytes,
        ce_min: ce_min.filter(|_| layout.ce_bytes > 0),
        ll128_cap: layout.ll128_cap,
        ll128_links,
        ll_max: layout.ll_max,
        a2av_lp: lowp::a2av_lp_fits(cfg, layout.staging_bytes),
    }
}

/// This machine's host name (compared through the store to prove all ranks share one host).
pub(crate) fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into the buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) };
    if rc != 0 {
        return String::from("unknown-host");
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}
