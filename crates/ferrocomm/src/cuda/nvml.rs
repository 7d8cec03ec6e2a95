//! Whether two GPUs are joined by NVLink, asked of NVML (the driver's `libnvidia-ml.so.1`,
//! loaded at run time and closed again). The LL128 all-reduce relies on a warp's 128-byte line
//! reaching the peer whole, which holds over NVLink and not over PCIe, so it runs only where
//! every pair of ranks is joined by NVLink (or shares one GPU). NVML names GPUs by PCI bus id,
//! whatever `CUDA_VISIBLE_DEVICES` hides from this process.

use std::ffi::{c_char, c_int, c_void, CStr, CString};

const NVML_SUCCESS: c_int = 0;
/// `NVML_P2P_CAPS_INDEX_NVLINK` and `NVML_P2P_STATUS_OK` of nvml.h.
const P2P_CAPS_NVLINK: c_int = 2;
const P2P_STATUS_OK: c_int = 0;

type Device = *mut c_void;
type InitFn = unsafe extern "C" fn() -> c_int;
type ByBusFn = unsafe extern "C" fn(*const c_char, *mut Device) -> c_int;
type P2pFn = unsafe extern "C" fn(Device, Device, c_int, *mut c_int) -> c_int;
type ErrFn = unsafe extern "C" fn(c_int) -> *const c_char;

/// The PCI bus id of `dev` as the driver writes it (`0000:1b:00.0`).
pub fn pci_bus_id(dev: cudarc::driver::sys::CUdevice) -> Result<String, String> {
    let mut buf = [0 as c_char; 32];
    // SAFETY: the buffer holds `len` bytes; the driver writes a NUL-terminated string.
    let r = unsafe {
        cudarc::driver::sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as c_int, dev)
    };
    if r != cudarc::driver::sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuDeviceGetPCIBusId failed: {r:?}"));
    }
    // SAFETY: NUL-terminated by the driver, inside `buf`.
    Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned())
}

/// Whether NVML reports an NVLink path between the GPUs at bus ids `a` and `b`; an error says
/// what failed (no NVML, a bus id it does not know).
pub fn nvlink_between(a: &str, b: &str) -> Result<bool, String> {
    let (ca, cb) = match (CString::new(a), CString::new(b)) {
        (Ok(ca), Ok(cb)) => (ca, cb),
        _ => return Err("a PCI bus id holds a NUL byte".into()),
    };
    let name = CString::new("libnvidia-ml.so.1").expect("no NUL in a literal");
    // SAFETY: dlopen of the driver's library by soname; closed below.
    let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        return Err("libnvidia-ml.so.1 (NVML) could not be loaded".into());
    }
    let sym = |s: &str| {
        let c = CString::new(s).expect("no NUL in a symbol name");
        // SAFETY: `h` is a live handle; a missing symbol gives NULL.
        unsafe { libc::dlsym(h, c.as_ptr()) }
    };
    let (init, by_bus, p2p, err, shutdown) = (
        sym("nvmlInit_v2"),
        sym("nvmlDeviceGetHandleByPciBusId_v2"),
        sym("nvmlDeviceGetP2PStatus"),
        sym("nvmlErrorString"),
        sym("nvmlShutdown"),
    );
    let out = if [init, by_bus, p2p, err, shutdown]
        .iter()
        .any(|p| p.is_null())
    {
        Err(
            "NVML lacks nvmlInit_v2, nvmlDeviceGetHandleByPciBusId_v2 or nvmlDeviceGetP2PStatus"
                .into(),
        )
    } else {
        // SAFETY: the symbols have these C signatures in every NVML since CUDA 8 (nvml.h).
        let (init, by_bus, p2p, err, shutdown) = unsafe {
            (
                std::mem::transmute::<*mut c_void, InitFn>(init),
                std::mem::transmute::<*mut c_void, ByBusFn>(by_bus),
                std::mem::transmute::<*mut c_void, P2pFn>(p2p),
                std::mem::transmute::<*mut c_void, ErrFn>(err),
                std::mem::transmute::<*mut c_void, InitFn>(shutdown),
            )
        };
        let what = |call: &str, r: c_int| {
            // SAFETY: nvmlErrorString returns a static NUL-terminated string for any code.
            let s = unsafe { CStr::from_ptr(err(r)) }.to_string_lossy();
            format!("{call}: {s}")
        };
        // SAFETY: plain calls with out-parameters of the documented types; every successful
        // nvmlInit_v2 is paired with nvmlShutdown.
        unsafe {
            match init() {
                NVML_SUCCESS => {
                    let (mut da, mut db) = (std::ptr::null_mut(), std::ptr::null_mut());
                    let mut status: c_int = -1;
                    let r = match by_bus(ca.as_ptr(), &mut da) {
                        NVML_SUCCESS => match by_bus(cb.as_ptr(), &mut db) {
                            NVML_SUCCESS => match p2p(da, db, P2P_CAPS_NVLINK, &mut status) {
                                NVML_SUCCESS => Ok(status == P2P_STATUS_OK),
                                r => Err(what("nvmlDeviceGetP2PStatus", r)),
                            },
                            r => Err(what(&format!("nvmlDeviceGetHandleByPciBusId_v2({b})"), r)),
                        },
                        r => Err(what(&format!("nvmlDeviceGetHandleByPciBusId_v2({a})"), r)),
                    };
                    shutdown();
                    r
                }
                r => Err(what("nvmlInit_v2", r)),
            }
        }
    };
    // SAFETY: `h` came from dlopen above and nothing of it is used after this.
    unsafe { libc::dlclose(h) };
    out
}

/// Whether the LL128 lines may run between this rank (its GPU at `own`) and the peers at
/// `peers` (rank, bus id): every peer on the same GPU or joined by NVLink according to `ask`
/// (`nvlink_between` outside tests). An error names the first peer that is not, and why.
pub fn ll128_links(
    own: &str,
    peers: &[(usize, String)],
    ask: impl Fn(&str, &str) -> Result<bool, String>,
) -> Result<(), String> {
    for (r, bus) in peers {
        if bus.eq_ignore_ascii_case(own) {
            continue;
        }
        match ask(own, bus) {
            Ok(true) => {}
            Ok(false) => {
                return Err(format!(
                    "rank {r}'s GPU ({bus}) is not joined to this one ({own}) by NVLink"
                ))
            }
            Err(e) => return Err(format!("NVLink to rank {r}'s GPU ({bus}) unknown: {e}")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peers(list: &[(usize, &str)]) -> Vec<(usize, String)> {
        list.iter().map(|(r, b)| (*r, b.to_string())).collect()
    }

    #[test]
    fn ll128_needs_nvlink_or_the_same_gpu_to_every_peer() {
        let nv = |a: &str, b: &str| Ok(a.ends_with('0') && b.ends_with('0'));
        let own = "0000:1B:00.0";
        // The same GPU (bus ids compared without case), or NVLink: allowed.
        assert!(ll128_links(own, &peers(&[(1, "0000:1b:00.0")]), nv).is_ok());
        assert!(ll128_links(own, &peers(&[(1, "0000:2c:00.0"), (2, "0000:3d:00.0")]), nv).is_ok());
        // One peer over PCIe: refused, naming it.
        let e =
            ll128_links(own, &peers(&[(1, "0000:2c:00.0"), (3, "0000:4e:00.1")]), nv).unwrap_err();
        assert!(e.contains("rank 3") && e.contains("0000:4e:00.1"), "{e}");
        // NVML's failure is a refusal too, with its reason.
        let fails = |_: &str, _: &str| Err("nvmlInit_v2: Driver Not Loaded".to_string());
        let e = ll128_links(own, &peers(&[(1, "0000:2c:00.0")]), fails).unwrap_err();
        assert!(
            e.contains("rank 1") && e.contains("Driver Not Loaded"),
            "{e}"
        );
        // Nobody else: nothing to ask.
        assert!(ll128_links(own, &[], fails).is_ok());
    }

    #[test]
    fn nvml_questions_fail_with_a_reason_never_a_panic() {
        // Here (no GPU) NVML is absent or knows no such bus; on a GPU machine the made-up bus
        // ids are unknown to it. Either way an error that says what failed.
        let e = nvlink_between("0000:ff:1f.7", "0000:fe:1f.7").unwrap_err();
        assert!(e.contains("NVML") || e.contains("nvml"), "{e}");
        assert!(nvlink_between("0000:ff:1f.7\0", "x").is_err());
    }
}
