//! Kernel launches: every kernel of the cuda backend goes through [`launch`], which uses a
//! programmatic dependent launch (PDL) where it may and a plain `cuLaunchKernel` otherwise.
//!
//! With PDL (`CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`, sm_90 and newer) a kernel
//! is scheduled while the previous kernel on its stream is still finishing, which hides most of
//! the ~1 µs between back-to-back kernels. Every kernel of ours begins with
//! `griddepcontrol.wait` (`pdl_wait` in kernels/all_reduce.cu), which returns only once the
//! previous grid has completed and its memory is visible, so stream order still holds for every
//! byte a kernel touches. Under stream capture the attribute becomes a programmatic edge of the
//! graph (CUDA 12.3 and newer), so graph replays overlap the same way.
//!
//! PDL is used when `FERROCOMM_PDL` is on (the default), the device is sm_90 or newer and the
//! driver exports `cuLaunchKernelEx`; otherwise launches are plain and the kernels' wait returns
//! at once.

use std::ffi::c_void;
use std::sync::OnceLock;

use cudarc::driver::sys;

use super::{cu_lazy, Function};
use crate::config::Config;
use crate::error::Result;

/// Whether kernels use PDL: the switch is on, the device is sm_90 or newer (griddepcontrol
/// exists there only) and the driver has `cuLaunchKernelEx`.
pub(crate) fn use_pdl(switch: bool, cc_major: i32, has_launch_ex: bool) -> bool {
    switch && cc_major >= 9 && has_launch_ex
}

/// Whether kernels launched on the current context's device use PDL under `cfg`. A context
/// must be current.
pub(crate) fn pdl_for_current_device(cfg: &Config) -> Result<bool> {
    if !cfg.pdl {
        return Ok(false);
    }
    let major = super::current_device_attribute(
        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
    )?;
    Ok(use_pdl(cfg.pdl, major, launch_ex_present()))
}

/// Whether the driver exports `cuLaunchKernelEx` (CUDA 11.8 and newer). cudarc's dynamically
/// loaded wrapper panics on a missing symbol, so we look it up ourselves before ever calling it.
fn launch_ex_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| {
        if !super::libs::driver_present() {
            return false;
        }
        // SAFETY: libcuda is present (checked above), so `culib` loads it without panicking;
        // `get` only looks the symbol up, the pointer is dropped uncalled.
        unsafe {
            sys::culib()
                .get::<unsafe extern "C" fn()>(b"cuLaunchKernelEx\0")
                .is_ok()
        }
    })
}

/// The launch attribute that lets a kernel overlap the previous one on its stream.
fn pdl_attribute() -> sys::CUlaunchAttribute {
    // SAFETY: the union is plain data (integers and structs of integers); all zeros is a valid
    // value of every member.
    let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
    value.programmaticStreamSerializationAllowed = 1;
    sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        pad: [0; 4],
        value,
    }
}

/// Launches `f` with `blocks` x `threads` (1-D, no dynamic shared memory) on `stream`, with
/// programmatic dependent launch when `pdl` is set ([`pdl_for_current_device`])
/// ([cuLaunchKernelEx](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html)).
/// `what` names the launch in an error; it is built only then (launches are on every call's
/// path).
///
/// # Safety
/// - `f` is a kernel of the current context whose parameter list is exactly the values `params`
///   points to, in order (types and layout as in the kernel source), and every pointer inside
///   them satisfies what the kernel reads and writes;
/// - `stream` is 0 (the legacy stream) or a live stream of the current context;
/// - with `pdl`, the kernel executes `griddepcontrol.wait` before touching any memory the
///   previous work on the stream may use, and `pdl` came from [`pdl_for_current_device`] for this
///   device (so `cuLaunchKernelEx` exists).
pub(crate) unsafe fn launch(
    f: Function,
    blocks: u32,
    threads: u32,
    stream: u64,
    params: &mut [*mut c_void],
    pdl: bool,
    what: impl FnOnce() -> String,
) -> Result<()> {
    let (f, hstream) = (f.raw(), stream as sys::CUstream);
    if pdl {
        let mut attrs = [pdl_attribute()];
        let config = sys::CUlaunchConfig {
            gridDimX: blocks,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: threads,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: 0,
            hStream: hstream,
            attrs: attrs.as_mut_ptr(),
            numAttrs: attrs.len() as u32,
        };
        // SAFETY: the caller's contract covers `f`, `params` and the stream; `config` and
        // `attrs` outlive the call, which copies them.
        let r =
            unsafe { sys::cuLaunchKernelEx(&config, f, params.as_mut_ptr(), std::ptr::null_mut()) };
        cu_lazy(r, what)
    } else {
        // SAFETY: as above, without attributes.
        let r = unsafe {
            sys::cuLaunchKernel(
                f,
                blocks,
                1,
                1,
                threads,
                1,
                1,
                0,
                hstream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        cu_lazy(r, what)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pdl_needs_the_switch_sm90_and_the_driver_entry() {
        assert!(use_pdl(true, 9, true));
        assert!(use_pdl(true, 10, true));
        assert!(!use_pdl(false, 9, true));
        assert!(!use_pdl(true, 8, true));
        assert!(!use_pdl(true, 9, false));
    }

    #[test]
    fn switched_off_needs_no_driver() {
        // FERROCOMM_PDL=0 answers before touching the driver (none on this machine).
        let cfg = Config::from_lookup(|k| (k == "FERROCOMM_PDL").then(|| "0".to_string())).unwrap();
        assert!(!pdl_for_current_device(&cfg).unwrap());
    }

    #[test]
    fn attribute_has_the_driver_layout() {
        // CUlaunchAttribute: u32 id, 4 bytes of padding, a 64-byte value union.
        assert_eq!(std::mem::size_of::<sys::CUlaunchAttribute>(), 72);
        let a = pdl_attribute();
        assert_eq!(a.id as u32, 6);
        // SAFETY: the attribute is plain data of 72 bytes.
        let bytes: [u8; 72] = unsafe { std::mem::transmute(a) };
        assert_eq!(&bytes[8..12], &1i32.to_ne_bytes());
        assert!(bytes[..4] == 6u32.to_ne_bytes() && bytes[12..].iter().all(|b| *b == 0));
    }
}
