//! One thin function per CUDA driver call ferrocomm makes (cudarc's `result` layer, for the
//! calls cudarc's own safe types do not cover): the call, its out-parameters returned, its
//! status turned into [`Error::Cuda`] naming `what` was being done. Nothing here keeps state;
//! the safe types of [`super`] build on these. Every function links the NVIDIA documentation of
//! the call it wraps; those whose pointers or handles the driver uses without being able to
//! check them are `unsafe`, with the hazards in a `# Safety` section.

use std::ffi::{c_char, c_void, CStr};

use cudarc::driver::sys;

use super::cu;
use crate::error::Result;

/// Bytes of a legacy IPC memory handle ([`ipc_get_mem_handle`]).
pub(crate) const IPC_HANDLE_BYTES: usize = 64;

/// Waits for all work of the current context ([cuCtxSynchronize]).
///
/// [cuCtxSynchronize]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__CTX.html
pub(crate) fn ctx_synchronize(what: &str) -> Result<()> {
    // SAFETY: no arguments; fails cleanly without a current context.
    cu(unsafe { sys::cuCtxSynchronize() }, what)
}

/// The device of the current context ([cuCtxGetDevice]), its ordinal.
///
/// [cuCtxGetDevice]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__CTX.html
pub(crate) fn ctx_get_device() -> Result<i32> {
    let mut dev: sys::CUdevice = 0;
    // SAFETY: out-parameter.
    cu(unsafe { sys::cuCtxGetDevice(&mut dev) }, "cuCtxGetDevice")?;
    Ok(dev)
}

/// The current context as an address ([cuCtxGetCurrent]): a key that tells contexts apart
/// (0: none is current).
///
/// [cuCtxGetCurrent]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__CTX.html
pub(crate) fn ctx_get_current() -> Result<usize> {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: out-parameter.
    cu(unsafe { sys::cuCtxGetCurrent(&mut ctx) }, "cuCtxGetCurrent")?;
    Ok(ctx as usize)
}

/// An attribute of device `dev` ([cuDeviceGetAttribute]).
///
/// [cuDeviceGetAttribute]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__DEVICE.html
pub(crate) fn device_get_attribute(attr: sys::CUdevice_attribute, dev: i32) -> Result<i32> {
    let mut v = 0i32;
    cu(
        // SAFETY: out-parameter; an unknown device is an error code.
        unsafe { sys::cuDeviceGetAttribute(&mut v, attr, dev) },
        "cuDeviceGetAttribute",
    )?;
    Ok(v)
}

/// The PCI bus id of device `dev` (`0000:19:00.0`) ([cuDeviceGetPCIBusId]).
///
/// [cuDeviceGetPCIBusId]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__DEVICE.html
pub(crate) fn device_get_pci_bus_id(dev: i32) -> Result<String> {
    let mut buf = [0 as c_char; 32];
    cu(
        // SAFETY: the driver writes at most `len` bytes, NUL-terminated.
        unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, dev) },
        "cuDeviceGetPCIBusId",
    )?;
    // SAFETY: NUL-terminated within the buffer (the driver's contract; the last byte stays 0
    // for an id of at most 31 characters).
    let id = unsafe { CStr::from_ptr(buf.as_ptr()) };
    Ok(id.to_string_lossy().into_owned())
}

/// `bytes` of device memory in the current context ([cuMemAlloc]): not the stream-ordered
/// pool, so that legacy IPC can share it.
///
/// [cuMemAlloc]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
pub(crate) fn mem_alloc(bytes: usize, what: &str) -> Result<u64> {
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: out-parameter; a context is current or the call fails.
    cu(unsafe { sys::cuMemAlloc_v2(&mut p, bytes) }, what)?;
    Ok(p)
}

/// Frees memory of [`mem_alloc`] ([cuMemFree]).
///
/// # Safety
/// `p` came from [`mem_alloc`] in the current context, is freed once, and no work still uses
/// it.
///
/// [cuMemFree]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
pub(crate) unsafe fn mem_free(p: u64) -> Result<()> {
    // SAFETY: the caller's contract.
    cu(unsafe { sys::cuMemFree_v2(p) }, "cuMemFree")
}

/// Sets `bytes` bytes at `p` to `value` ([cuMemsetD8]; synchronous for the host).
///
/// # Safety
/// `p` is device memory of the current context holding `bytes` bytes.
///
/// [cuMemsetD8]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
pub(crate) unsafe fn memset_d8(p: u64, value: u8, bytes: usize) -> Result<()> {
    // SAFETY: the caller's contract.
    cu(unsafe { sys::cuMemsetD8_v2(p, value, bytes) }, "cuMemsetD8")
}

/// `bytes` of pinned host memory mapped into the device's address space and usable from every
/// context ([cuMemHostAlloc] with `DEVICEMAP | PORTABLE`).
///
/// [cuMemHostAlloc]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
pub(crate) fn mem_host_alloc_mapped(bytes: usize, what: &str) -> Result<*mut c_void> {
    let mut p: *mut c_void = std::ptr::null_mut();
    let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
    // SAFETY: out-parameter.
    cu(unsafe { sys::cuMemHostAlloc(&mut p, bytes, flags) }, what)?;
    Ok(p)
}

/// Frees memory of [`mem_host_alloc_mapped`] ([cuMemFreeHost]).
///
/// # Safety
/// `p` came from [`mem_host_alloc_mapped`], is freed once, and neither the host nor a kernel
/// uses it any more.
///
/// [cuMemFreeHost]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
pub(crate) unsafe fn mem_free_host(p: *mut c_void) -> Result<()> {
    // SAFETY: the caller's contract.
    cu(unsafe { sys::cuMemFreeHost(p) }, "cuMemFreeHost")
}

/// The device address of mapped pinned host memory ([cuMemHostGetDevicePointer]).
///
/// # Safety
/// `p` is memory of [`mem_host_alloc_mapped`].
///
/// [cuMemHostGetDevicePointer]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
pub(crate) unsafe fn mem_host_get_device_pointer(p: *mut c_void) -> Result<u64> {
    let mut d: sys::CUdeviceptr = 0;
    cu(
        // SAFETY: the caller's contract; out-parameter.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, p, 0) },
        "cuMemHostGetDevicePointer",
    )?;
    Ok(d)
}

/// The allocation that holds device address `p`: its base and size ([cuMemGetAddressRange]).
///
/// [cuMemGetAddressRange]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
pub(crate) fn mem_get_address_range(p: u64, what: &str) -> Result<(u64, usize)> {
    let (mut base, mut size): (sys::CUdeviceptr, usize) = (0, 0);
    cu(
        // SAFETY: out-parameters; an address the driver does not know is an error code.
        unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, p) },
        what,
    )?;
    Ok((base, size))
}

/// Copies `bytes` from device address `src` to host memory `dst` ([cuMemcpyDtoH];
/// synchronous).
///
/// # Safety
/// `dst` holds `bytes` writable bytes; `src` is device memory holding `bytes` bytes.
///
/// [cuMemcpyDtoH]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
pub(crate) unsafe fn memcpy_dtoh(
    dst: *mut c_void,
    src: u64,
    bytes: usize,
    what: &str,
) -> Result<()> {
    // SAFETY: the caller's contract.
    cu(unsafe { sys::cuMemcpyDtoH_v2(dst, src, bytes) }, what)
}

/// Enqueues a copy of `bytes` from `src` to `dst` (device memory, or mapped into this
/// context) on `stream` ([cuMemcpyDtoDAsync]).
///
/// # Safety
/// Both ranges hold `bytes` bytes and stay valid until the stream has run the copy; `stream`
/// is a live stream of the current context (0: the legacy stream).
///
/// [cuMemcpyDtoDAsync]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
pub(crate) unsafe fn memcpy_dtod_async(
    dst: u64,
    src: u64,
    bytes: usize,
    stream: u64,
    what: &str,
) -> Result<()> {
    cu(
        // SAFETY: the caller's contract.
        unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream as sys::CUstream) },
        what,
    )
}

/// `bytes` (at least 1) of stream-ordered device memory, usable by work enqueued on `stream`
/// after this ([cuMemAllocAsync]; capturable into a CUDA graph).
///
/// # Safety
/// `stream` is a live stream of the current context (0: the legacy stream).
///
/// [cuMemAllocAsync]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MALLOC__ASYNC.html
pub(crate) unsafe fn mem_alloc_async(bytes: usize, stream: u64, what: &str) -> Result<u64> {
    let mut p: sys::CUdeviceptr = 0;
    cu(
        // SAFETY: the caller's contract; out-parameter.
        unsafe { sys::cuMemAllocAsync(&mut p, bytes.max(1), stream as sys::CUstream) },
        what,
    )?;
    Ok(p)
}

/// Frees memory of [`mem_alloc_async`] once the work enqueued on `stream` before this is done
/// ([cuMemFreeAsync]).
///
/// # Safety
/// `p` came from [`mem_alloc_async`], is freed once; `stream` is a live stream of the current
/// context after whose earlier work nothing uses `p`.
///
/// [cuMemFreeAsync]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MALLOC__ASYNC.html
pub(crate) unsafe fn mem_free_async(p: u64, stream: u64) -> Result<()> {
    cu(
        // SAFETY: the caller's contract.
        unsafe { sys::cuMemFreeAsync(p, stream as sys::CUstream) },
        "cuMemFreeAsync",
    )
}

/// The legacy IPC handle of the allocation starting at `base` ([cuIpcGetMemHandle]): 64 bytes
/// another process opens with [`ipc_open_mem_handle`].
///
/// [cuIpcGetMemHandle]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
pub(crate) fn ipc_get_mem_handle(base: u64) -> Result<[u8; IPC_HANDLE_BYTES]> {
    let mut handle = std::mem::MaybeUninit::<sys::CUipcMemHandle>::zeroed();
    cu(
        // SAFETY: out-parameter; an address that starts no cuMemAlloc allocation is an error code.
        unsafe { sys::cuIpcGetMemHandle(handle.as_mut_ptr(), base) },
        "cuIpcGetMemHandle",
    )?;
    // SAFETY: initialised by the call; the handle is 64 plain bytes.
    Ok(unsafe {
        std::mem::transmute::<sys::CUipcMemHandle, [u8; IPC_HANDLE_BYTES]>(handle.assume_init())
    })
}

/// Maps another process's allocation into this context from its handle
/// ([cuIpcOpenMemHandle], `LAZY_ENABLE_PEER_ACCESS`: peer access turned on for the mapping).
///
/// # Safety
/// `handle` came from [`ipc_get_mem_handle`] in a live process on this host; the mapping is
/// closed once with [`ipc_close_mem_handle`] and not used after.
///
/// [cuIpcOpenMemHandle]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
pub(crate) unsafe fn ipc_open_mem_handle(
    handle: &[u8; IPC_HANDLE_BYTES],
    what: &str,
) -> Result<u64> {
    // SAFETY: the handle is 64 plain bytes.
    let h = unsafe { std::mem::transmute::<[u8; IPC_HANDLE_BYTES], sys::CUipcMemHandle>(*handle) };
    let mut p: sys::CUdeviceptr = 0;
    let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
    cu(
        // SAFETY: the caller's contract; out-parameter.
        unsafe { sys::cuIpcOpenMemHandle_v2(&mut p, h, flags) },
        what,
    )?;
    Ok(p)
}

/// Unmaps memory of [`ipc_open_mem_handle`] ([cuIpcCloseMemHandle]).
///
/// # Safety
/// `p` came from [`ipc_open_mem_handle`], is closed once, and no work still uses it.
///
/// [cuIpcCloseMemHandle]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
pub(crate) unsafe fn ipc_close_mem_handle(p: u64) -> Result<()> {
    cu(
        // SAFETY: the caller's contract.
        unsafe { sys::cuIpcCloseMemHandle(p) },
        "cuIpcCloseMemHandle",
    )
}

/// Waits until `stream` has run everything enqueued on it ([cuStreamSynchronize]).
///
/// # Safety
/// `stream` is a live stream of the current context (0: the legacy stream).
///
/// [cuStreamSynchronize]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
pub(crate) unsafe fn stream_synchronize(stream: u64, what: &str) -> Result<()> {
    cu(
        // SAFETY: the caller's contract.
        unsafe { sys::cuStreamSynchronize(stream as sys::CUstream) },
        what,
    )
}

/// How many blocks of `block` threads (and `smem` bytes of dynamic shared memory) of `f` fit on
/// one multiprocessor at once ([cuOccupancyMaxActiveBlocksPerMultiprocessor]).
///
/// [cuOccupancyMaxActiveBlocksPerMultiprocessor]: https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__OCCUPANCY.html
pub(crate) fn occupancy_max_active_blocks(
    f: super::Function,
    block: u32,
    smem: usize,
    what: &str,
) -> Result<i32> {
    let mut n = 0i32;
    cu(
        // SAFETY: out-parameter; `f` is a live function (the type's invariant).
        unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut n, f.raw(), block as i32, smem)
        },
        what,
    )?;
    Ok(n)
}
