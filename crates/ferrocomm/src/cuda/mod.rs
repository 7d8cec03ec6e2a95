//! The CUDA backend: direct data access (DDA) over NVLink through IPC-mapped staging buffers,
//! with NCCL underneath for what DDA does not cover or does not win.
//!
//! - [`libs`]: finding libcuda / libnvrtc before cudarc touches them (absent = error, no panic);
//! - [`kernels`]: the NVRTC kernel registry and its disk cache;
//! - `launch`: the one kernel launch (programmatic dependent launch on sm_90 when enabled);
//! - `dda`: IPC staging, peer checks and kernel launches for push / flat / tree all-reduce;
//! - [`collectives`]: direct-access all-gather, reduce-scatter, all-to-all(v), broadcast, reduce;
//! - `fused_norm`: the fused all-reduce + RMSNorm (the all-reduce, then one norm launch);
//! - `backend`: the [`Backend`] that chooses between DDA and NCCL per call;
//! - [`nvml`]: whether two GPUs are joined by NVLink (the LL128 all-reduce needs it).

mod backend;
pub mod collectives;
mod dda;
pub(crate) mod fused_norm;
pub mod kernels;
mod launch;
pub mod libs;
mod lowp;
pub mod nvml;

use std::sync::Arc;

use cudarc::driver::{sys, CudaContext};

use crate::comm::{Backend, CommContext};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::types::Device;

pub use dda::{
    ce_chunk, ce_takes, flat_grid, ll128_line_bytes, ll128_takes, push_capacity, staging_layout,
    StagingLayout, CE_MAX_CHUNKS, LL128_PAYLOAD,
};
pub use lowp::quantize_on_device;

/// Number of CUDA devices visible, 0 when the driver library is absent or fails to start.
pub fn gpu_count() -> usize {
    if !libs::driver_present() {
        return 0;
    }
    if cudarc::driver::result::init().is_err() {
        return 0;
    }
    cudarc::driver::result::device::get_count()
        .map(|n| n.max(0) as usize)
        .unwrap_or(0)
}

/// The CUDA backend for `ctx` (DDA where possible, NCCL for the rest).
pub fn new_backend(ctx: &CommContext) -> Result<Box<dyn Backend>> {
    Ok(Box::new(backend::CudaBackend::new(ctx)?))
}

/// Device memory one communicator of `world` ranks allocates for DDA on each GPU, in bytes
/// (flags and state, push buffers, double-buffered staging); see docs/cuda-backend.md.
pub fn staging_memory_bytes(cfg: &Config, world: usize) -> usize {
    staging_layout(cfg, world).total
}

/// Turns a driver result into our error, naming the call.
pub(crate) fn cu(r: sys::CUresult, what: &str) -> Result<()> {
    cu_lazy(r, || what.to_string())
}

/// [`cu`] for the per-call paths (kernel launches): the description is built only on failure.
pub(crate) fn cu_lazy(r: sys::CUresult, what: impl FnOnce() -> String) -> Result<()> {
    r.result()
        .map_err(|e| Error::Cuda(format!("{}: {e:?}", what())))
}

/// Opens the primary context of `device` for this process, with cudarc's event tracking off
/// (it synchronizes and breaks graph capture).
pub(crate) fn open_context(device: Device) -> Result<Arc<CudaContext>> {
    let Device::Cuda(ordinal) = device else {
        return Err(Error::InvalidArgument(
            "the cuda backend needs a CUDA device".into(),
        ));
    };
    if !libs::driver_present() {
        return Err(Error::LibraryMissing {
            library: "libcuda",
            why: "the NVIDIA driver library (libcuda.so.1) is not on the library path".into(),
        });
    }
    let n = gpu_count();
    if ordinal as usize >= n {
        return Err(Error::InvalidArgument(format!(
            "device cuda:{ordinal} does not exist ({n} visible)"
        )));
    }
    let ctx = CudaContext::new(ordinal as usize)
        .map_err(|e| Error::Cuda(format!("creating the context of cuda:{ordinal}: {e:?}")))?;
    // SAFETY: ferrocomm never hands CudaSlices across streams; all its buffers are raw
    // allocations whose stream use it orders itself.
    unsafe { ctx.disable_event_tracking() };
    Ok(ctx)
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

/// The device a pointer lives on, or an error when it is not CUDA memory.
pub(crate) fn pointer_device(ptr: u64, collective: &'static str, what: &str) -> Result<u32> {
    let mut ord: i32 = -1;
    // SAFETY: DEVICE_ORDINAL writes one int; an unknown pointer is reported as an error code.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut ord as *mut i32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS || ord < 0 {
        return Err(Error::InvalidArgument(format!(
            "{collective}: {what} pointer {ptr:#x} is not CUDA device memory ({r:?})"
        )));
    }
    Ok(ord as u32)
}
