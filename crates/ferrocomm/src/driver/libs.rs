//! Finding NVIDIA's shared libraries before cudarc asks for them.
//!
//! cudarc's dynamic loading tries fixed names (`libnvrtc.so`, `libnvrtc.so.13`, ...) through the
//! ordinary `dlopen` search (LD_LIBRARY_PATH, the ld cache), and panics when none loads. So we
//! probe first (`is_culib_present`), and when a library is not on that path we load it by full
//! path with RTLD_GLOBAL: a later `dlopen("libnvrtc.so.13")` from cudarc then finds the already
//! loaded object by its soname.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::config::Config;
use crate::error::{Error, Result};

/// Whether libcuda (the driver) can be loaded.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the candidate names and closes them again.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

pub(crate) fn nvrtc_present() -> bool {
    // SAFETY: as for `driver_present`.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Directories under the Python prefixes of `cfg` that NVIDIA's wheels install into:
/// `<prefix>/lib/python3.*/{site,dist}-packages/nvidia/<sub>` for each `sub`.
pub fn python_lib_dirs(cfg: &Config, subs: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for prefix in &cfg.python_prefixes {
        let lib = prefix.join("lib");
        let Ok(rd) = std::fs::read_dir(&lib) else {
            continue;
        };
        let mut pys: Vec<PathBuf> = rd
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
            .map(|e| e.path())
            .collect();
        pys.sort();
        for py in pys.iter().rev() {
            for pk in ["site-packages", "dist-packages"] {
                for sub in subs {
                    let d = py.join(pk).join("nvidia").join(sub);
                    if d.is_dir() {
                        out.push(d);
                    }
                }
            }
        }
    }
    out
}

/// Loads one library file for the whole process (RTLD_GLOBAL); the handle is kept forever.
pub fn preload(path: &Path) -> std::result::Result<(), String> {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: `c` is a valid C string; loading runs the library's initialisers, which is what
    // loading it later through cudarc would do too.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if h.is_null() {
        // SAFETY: dlerror returns NULL or a valid C string.
        let e = unsafe { libc::dlerror() };
        let msg = if e.is_null() {
            "dlopen failed".to_string()
        } else {
            // SAFETY: non-null C string from dlerror.
            unsafe { std::ffi::CStr::from_ptr(e) }
                .to_string_lossy()
                .into_owned()
        };
        return Err(msg);
    }
    Ok(())
}

/// The NVRTC files we try, in order, when the system path has none.
pub fn nvrtc_candidates(cfg: &Config) -> Vec<PathBuf> {
    let name = "libnvrtc.so.13";
    let mut c = Vec::new();
    // An explicit path is the only candidate: a wrong setting is an error, not a silent search.
    if let Some(p) = &cfg.nvrtc_lib {
        if p.is_dir() {
            c.push(p.join(name));
        } else {
            c.push(p.clone());
        }
        return c;
    }
    for d in [
        "/usr/local/cuda/lib64",
        "/usr/local/cuda/targets/x86_64-linux/lib",
        "/usr/local/cuda-13.0/lib64",
    ] {
        c.push(Path::new(d).join(name));
    }
    for d in python_lib_dirs(cfg, &["cu13/lib", "cuda_nvrtc/lib"]) {
        c.push(d.join(name));
    }
    c
}

/// Makes NVRTC loadable by cudarc, or says where we looked.
pub fn ensure_nvrtc(cfg: &Config) -> Result<()> {
    static DONE: Mutex<bool> = Mutex::new(false);
    let mut done = DONE.lock().unwrap_or_else(|e| e.into_inner());
    if *done {
        return Ok(());
    }
    // An explicit path wins over whatever the system path has.
    let explicit = cfg.nvrtc_lib.is_some();
    if !explicit && nvrtc_present() {
        *done = true;
        return Ok(());
    }
    let mut tried = Vec::new();
    for p in nvrtc_candidates(cfg) {
        if !p.exists() {
            if explicit {
                tried.push(format!(
                    "{} (FERROCOMM_NVRTC_LIB) does not exist",
                    p.display()
                ));
            }
            continue;
        }
        // NVRTC dlopens its builtins library by soname at compile time; load it from the same
        // directory first so that lookup finds it without LD_LIBRARY_PATH.
        if let Some(dir) = p.parent() {
            if let Ok(rd) = std::fs::read_dir(dir) {
                for e in rd.filter_map(|e| e.ok()) {
                    let n = e.file_name().to_string_lossy().into_owned();
                    if n.starts_with("libnvrtc-builtins.so") {
                        let _ = preload(&e.path());
                    }
                }
            }
        }
        match preload(&p) {
            Ok(()) if nvrtc_present() => {
                *done = true;
                return Ok(());
            }
            Ok(()) => tried.push(format!("{} (loaded, but not found by soname)", p.display())),
            Err(e) => tried.push(format!("{}: {e}", p.display())),
        }
    }
    if !explicit && nvrtc_present() {
        *done = true;
        return Ok(());
    }
    Err(Error::LibraryMissing {
        library: "libnvrtc",
        why: format!(
            "not on the library path, FERROCOMM_NVRTC_LIB unset or wrong, and no python \
             nvidia/cu13/lib wheel found (install nvidia-cuda-nvrtc==13.0.88){}",
            if tried.is_empty() {
                String::new()
            } else {
                format!("; tried: {}", tried.join("; "))
            }
        ),
    })
}
