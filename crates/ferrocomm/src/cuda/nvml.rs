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

/// The PCI bus id of CUDA device `dev` as the driver writes it (`0000:1b:00.0`).
pub fn pci_bus_id(dev: i32) -> Result<String, String> {
    crate::driver::result::device_get_pci_bus_id(dev).map_err(|e| e.to_string())
}

/// Whether NVML reports an NVLink path between the GPUs at bus ids `a` and `b`; an error says
/// what failed (no NVML, a bus id it does not know).
pub fn nvlink_between(a: &str, b: &str) -> Result<bool, String> {
    let (Ok(ca), Ok(cb)) = (CString::new(a), CString::new(b)) else {
        return Err("a PCI bus id holds a NUL byte".into());
    };
    let nvml = Nvml::open()?;
    nvml.call("nvmlInit_v2", || {
        // SAFETY: no arguments; paired with nvmlShutdown below.
        unsafe { (nvml.init)() }
    })?;
    let asked = (|| {
        let (da, db) = (nvml.device(&ca, a)?, nvml.device(&cb, b)?);
        let mut status: c_int = -1;
        nvml.call("nvmlDeviceGetP2PStatus", || {
            // SAFETY: two handles from NVML and an out-parameter of the documented type.
            unsafe { (nvml.p2p)(da, db, P2P_CAPS_NVLINK, &mut status) }
        })?;
        Ok(status == P2P_STATUS_OK)
    })();
    // SAFETY: pairs the successful nvmlInit_v2 above.
    unsafe { (nvml.shutdown)() };
    asked
}

/// The NVML entry points used here, from the library loaded for one question (closed on drop).
struct Nvml {
    lib: *mut c_void,
    init: InitFn,
    by_bus: ByBusFn,
    p2p: P2pFn,
    err: ErrFn,
    shutdown: InitFn,
}

impl Nvml {
    fn open() -> Result<Nvml, String> {
        let name = CString::new("libnvidia-ml.so.1").expect("no NUL in a literal");
        // SAFETY: dlopen of the driver's library by soname; closed by Drop (or below).
        let lib = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if lib.is_null() {
            return Err("libnvidia-ml.so.1 (NVML) could not be loaded".into());
        }
        let sym = |s: &str| {
            let c = CString::new(s).expect("no NUL in a symbol name");
            // SAFETY: `lib` is a live handle; a missing symbol gives NULL.
            unsafe { libc::dlsym(lib, c.as_ptr()) }
        };
        let names = [
            "nvmlInit_v2",
            "nvmlDeviceGetHandleByPciBusId_v2",
            "nvmlDeviceGetP2PStatus",
            "nvmlErrorString",
            "nvmlShutdown",
        ];
        let [init, by_bus, p2p, err, shutdown] = names.map(sym);
        if let Some(i) = [init, by_bus, p2p, err, shutdown]
            .iter()
            .position(|p| p.is_null())
        {
            // SAFETY: opened above, nothing of it used.
            unsafe { libc::dlclose(lib) };
            return Err(format!("NVML lacks {}", names[i]));
        }
        // SAFETY: the symbols have these C signatures in every NVML since CUDA 8 (nvml.h).
        unsafe {
            Ok(Nvml {
                lib,
                init: std::mem::transmute::<*mut c_void, InitFn>(init),
                by_bus: std::mem::transmute::<*mut c_void, ByBusFn>(by_bus),
                p2p: std::mem::transmute::<*mut c_void, P2pFn>(p2p),
                err: std::mem::transmute::<*mut c_void, ErrFn>(err),
                shutdown: std::mem::transmute::<*mut c_void, InitFn>(shutdown),
            })
        }
    }

    /// `f`'s NVML return code as a result, the error named by NVML and `what`.
    fn call(&self, what: &str, f: impl FnOnce() -> c_int) -> Result<(), String> {
        match f() {
            NVML_SUCCESS => Ok(()),
            r => {
                // SAFETY: nvmlErrorString returns a static NUL-terminated string for any code.
                let s = unsafe { CStr::from_ptr((self.err)(r)) }.to_string_lossy();
                Err(format!("{what}: {s}"))
            }
        }
    }

    /// NVML's handle of the GPU at bus id `bus` (`text` for the message).
    fn device(&self, bus: &CStr, text: &str) -> Result<Device, String> {
        let mut d: Device = std::ptr::null_mut();
        self.call(&format!("nvmlDeviceGetHandleByPciBusId_v2({text})"), || {
            // SAFETY: a NUL-terminated bus id and an out-parameter; NVML is initialised.
            unsafe { (self.by_bus)(bus.as_ptr(), &mut d) }
        })?;
        Ok(d)
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        // SAFETY: `lib` came from dlopen and none of its functions is called after this.
        unsafe { libc::dlclose(self.lib) };
    }
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
