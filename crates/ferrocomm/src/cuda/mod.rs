//! The CUDA backend: direct data access (DDA) over NVLink through IPC-mapped staging buffers,
//! with NCCL underneath for what DDA does not cover or does not win.
//!
//! - `backend`: the [`Backend`] that chooses between DDA and NCCL per call;
//! - `dda`: direct data access and everything that runs on it: IPC staging, peer mapping and
//!   checks, the all-reduce, the other collectives ([`collectives`]), their low-precision forms
//!   and the fused all-reduce + RMSNorm;
//! - [`kernels`]: the kernel registry: each unit's code (built in, cached, or compiled with
//!   NVRTC at first use) and its module; `kernel_units` (which kernels compile together),
//!   `nvrtc` and [`kernel_cache`] (the disk cache and its lock) are shared with the build script;
//! - [`nvml`]: whether two GPUs are joined by NVLink (the LL128 all-reduce needs it);
//! - `window`: one-sided communication (puts, signals, waits on IPC-mapped buffers of
//!   `dda::ipc`).
//!
//! Every driver call goes through [`crate::driver`] (launches included). The arrows point
//! down: `backend` uses `dda`, which uses `kernels` and `nvml`; none imports back.
//!
//! Beyond the backend, the items below are public for the programs that size and check the
//! direct-access paths from outside the crate: the staging layout and its sizes
//! ([`staging_layout`], [`push_capacity`], [`ll128_line_bytes`], [`flat_grid`], [`ce_chunk`]) for
//! the integration tests, [`quantize_on_device`] for the low-precision GPU check program and
//! [`residual_rmsnorm`] for `ferrocomm bench`.

mod backend;
mod dda;
pub mod kernel_cache;
mod kernel_units;
pub mod kernels;
pub mod nvml;
mod nvrtc;
mod window;

use crate::backend::{Backend, CommContext};
use crate::config::Config;
use crate::error::Result;

pub use dda::{
    ce_chunk, collectives, dda_caps, flat_grid, ll128_line_bytes, push_capacity,
    quantize_on_device, residual_rmsnorm, staging_layout, StagingLayout, CE_MAX_CHUNKS,
    LL128_PAYLOAD,
};

/// The driver layer's library probing and device count, where they were first found.
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

/// This machine's key for its tuning table ([`crate::config::tuning::machine_key`]): the first GPU's
/// model, the GPU count, and how GPUs 0 and 1 are joined (`cuda-nvidia-h200-x8-nvlink`;
/// `pcie` without NVLink between them, `one` for a single GPU, `links-unknown` without NVML).
pub fn machine_key() -> String {
    let n = gpu_count();
    let name = crate::driver::device_name(0).unwrap_or_else(|_| "unknown-gpu".into());
    let links = if n < 2 {
        "one"
    } else {
        match (nvml::pci_bus_id(0), nvml::pci_bus_id(1)) {
            (Ok(a), Ok(b)) => match nvml::nvlink_between(&a, &b) {
                Ok(true) => "nvlink",
                Ok(false) => "pcie",
                Err(_) => "links-unknown",
            },
            _ => "links-unknown",
        }
    };
    crate::config::tuning::machine_key(&["cuda", &name, &format!("x{n}"), links])
}
