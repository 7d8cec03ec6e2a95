//! The kernel registry: CUDA C++ sources (header-free), one module per element type, compiled
//! with NVRTC for the device's own architecture to a cubin and cached on disk.
//!
//! Cache key = hash of (source, defines, options) + arch + NVRTC version, so an edited kernel, a
//! different GPU or another NVRTC never reuses a stale cubin.

use std::ffi::{c_char, CString};
use std::path::{Path, PathBuf};

use cudarc::nvrtc::sys as nvrtc;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::types::DataType;

/// The all-reduce source (push, flat, tree, stream for one element type per module).
pub const ALL_REDUCE_SOURCE: &str = include_str!("../../kernels/all_reduce.cu");
/// Its name in logs and cache files.
pub const ALL_REDUCE_NAME: &str = "all_reduce.cu";
/// The low-precision kernels, appended to the modules of the float types.
pub const LOWP_SOURCE: &str = include_str!("../../kernels/lowp.cu");
/// Entry points of lowp.cu (f32, f16 and bf16 modules only).
pub const LOWP_ENTRIES: [&str; 4] = [
    "fc_lp_encode",
    "fc_lp_move",
    "fc_lp_move_wide",
    "fc_lp_tree",
];

/// The residual add + RMSNorm after an all-reduce (the fused all_reduce_rmsnorm call),
/// appended after lowp.cu to the modules of the float types.
pub const RMSNORM_SOURCE: &str = include_str!("../../kernels/rmsnorm.cu");
/// Entry points of rmsnorm.cu (f32, f16 and bf16 modules only).
pub const RMSNORM_ENTRIES: [&str; 3] = ["fc_rmsnorm", "fc_fused_flat", "fc_fused_tree"];

/// Whether the module of `dtype` holds the low-precision kernels (and the RMSNorm).
pub fn has_lowp(dtype: DataType) -> bool {
    matches!(dtype, DataType::F32 | DataType::F16 | DataType::BF16)
}

/// The other collectives (all-gather, reduce-scatter, all-to-all(v), broadcast, reduce),
/// appended to the all-reduce source in every module.
pub const COLLECTIVES_SOURCE: &str = include_str!("../../kernels/collectives.cu");

/// Data-movement entry points of collectives.cu (byte kernels, `(Args, CArgs)`).
pub const COLL_ENTRIES: [&str; 12] = [
    "fc_all_gather_ll",
    "fc_all_gather_st",
    "fc_all_gather_rw",
    "fc_all_to_all_ll",
    "fc_all_to_all_st",
    "fc_all_to_all_rw",
    "fc_all_to_all_v_st",
    "fc_all_to_all_v_ll",
    "fc_all_to_all_v_pc",
    "fc_all_to_all_dyn",
    "fc_broadcast_ll",
    "fc_broadcast_st",
];
/// Reduction entry points of collectives.cu, one per operator: `<prefix>_<op>`.
pub const COLL_OP_ENTRIES: [&str; 5] = [
    "fc_reduce_scatter_ll",
    "fc_reduce_ll",
    "fc_reduce_scatter_st",
    "fc_reduce_scatter_rw",
    "fc_reduce_st",
];

/// Algorithms with an entry point per operator: `fc_<algo>_<op>`.
pub const ALGOS: [&str; 6] = ["push", "flat", "tree", "stream", "ce", "ll128"];
/// Operators compiled into every module (Avg and PremulSum run on `sum` with scale factors).
pub const OPS: [&str; 4] = ["sum", "prod", "min", "max"];
/// Entry points beside the per-operator ones.
pub const EXTRA_ENTRIES: [&str; 2] = ["fc_verify_write", "fc_ce_gate"];

/// Element types the direct-access kernels handle, with the define that selects each.
pub const VARIANTS: [(DataType, &str); 7] = [
    (DataType::F32, "FC_T_F32"),
    (DataType::F16, "FC_T_F16"),
    (DataType::BF16, "FC_T_BF16"),
    (DataType::I32, "FC_T_I32"),
    (DataType::U32, "FC_T_U32"),
    (DataType::I64, "FC_T_I64"),
    (DataType::U64, "FC_T_U64"),
];

/// The element types of [`VARIANTS`], in order.
pub const DTYPES: [DataType; VARIANTS.len()] = {
    let mut d = [DataType::F32; VARIANTS.len()];
    let mut i = 0;
    while i < d.len() {
        d[i] = VARIANTS[i].0;
        i += 1;
    }
    d
};

/// Whether the direct-access kernels handle `dtype`.
pub fn supports(dtype: DataType) -> bool {
    VARIANTS.iter().any(|(d, _)| *d == dtype)
}

/// Every entry point name a module must export.
pub fn entry_names() -> Vec<String> {
    let mut v: Vec<String> = ALGOS
        .iter()
        .flat_map(|a| OPS.iter().map(move |o| format!("fc_{a}_{o}")))
        .collect();
    v.extend(EXTRA_ENTRIES.iter().map(|s| s.to_string()));
    v.extend(COLL_ENTRIES.iter().map(|s| s.to_string()));
    v.extend(
        COLL_OP_ENTRIES
            .iter()
            .flat_map(|p| OPS.iter().map(move |o| format!("{p}_{o}"))),
    );
    v
}

/// Every entry point the module of `dtype` exports.
pub fn entry_names_for(dtype: DataType) -> Vec<String> {
    let mut v = entry_names();
    if has_lowp(dtype) {
        v.extend(LOWP_ENTRIES.iter().map(|s| s.to_string()));
        v.extend(RMSNORM_ENTRIES.iter().map(|s| s.to_string()));
    }
    v
}

/// The full source of the module for `dtype` (define line + shared source, + lowp.cu and
/// rmsnorm.cu for the float types).
pub fn module_source(dtype: DataType) -> Option<String> {
    VARIANTS.iter().find(|(d, _)| *d == dtype).map(|(_, def)| {
        let (lowp, norm) = if has_lowp(dtype) {
            (LOWP_SOURCE, RMSNORM_SOURCE)
        } else {
            ("", "")
        };
        format!("#define {def} 1\n{ALL_REDUCE_SOURCE}\n{COLLECTIVES_SOURCE}\n{lowp}\n{norm}")
    })
}

fn options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "-std=c++17".into(),
        "--device-as-default-execution-space".into(),
    ]
}

/// The NVRTC version (major, minor). NVRTC must be loadable ([`crate::driver::libs::ensure_nvrtc`]).
pub fn nvrtc_version() -> Result<(i32, i32)> {
    // cudarc panics on a call into a library it cannot load: ask first.
    if !crate::driver::libs::nvrtc_present() {
        return Err(Error::LibraryMissing {
            library: "libnvrtc",
            why: "not loaded (see `ferrocomm info`)".into(),
        });
    }
    let (mut ma, mut mi) = (0, 0);
    // SAFETY: plain out-parameters.
    let r = unsafe { nvrtc::nvrtcVersion(&mut ma, &mut mi) };
    check(r, "nvrtcVersion")?;
    Ok((ma, mi))
}

fn check(r: nvrtc::nvrtcResult, what: &str) -> Result<()> {
    if r == nvrtc::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(Error::Cuda(format!("{what}: NVRTC error {r:?}")))
    }
}

/// Compiles the module for `dtype` to a cubin for `arch` (`sm_90`). A compile error carries
/// NVRTC's log.
pub fn compile(dtype: DataType, arch: &str, cfg: &Config) -> Result<Vec<u8>> {
    crate::driver::libs::ensure_nvrtc(cfg)?;
    let src = module_source(dtype).ok_or_else(|| Error::Unsupported {
        collective: "all_reduce",
        backend: "cuda",
        what: format!("dtype {dtype} in the direct-access kernels"),
    })?;
    compile_source(&format!("{ALL_REDUCE_NAME}[{dtype}]"), &src, arch)
}

/// Compiles one CUDA C++ source to a cubin for `arch`. NVRTC must be loadable
/// ([`crate::driver::libs::ensure_nvrtc`]); a compile error is [`Error::KernelCompile`] with the log.
pub fn compile_source(source_name: &str, src: &str, arch: &str) -> Result<Vec<u8>> {
    let source_name = source_name.to_string();
    let csrc = CString::new(src).map_err(|e| Error::Cuda(e.to_string()))?;
    let cname = CString::new(source_name.clone()).map_err(|e| Error::Cuda(e.to_string()))?;
    let mut prog: nvrtc::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: valid C strings, no headers.
    let r = unsafe {
        nvrtc::nvrtcCreateProgram(
            &mut prog,
            csrc.as_ptr(),
            cname.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    check(r, "nvrtcCreateProgram")?;
    let opts: Vec<CString> = options(arch)
        .into_iter()
        .map(|o| CString::new(o).expect("options have no NUL"))
        .collect();
    let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    // SAFETY: `prog` was created above; the option pointers outlive the call.
    let r = unsafe { nvrtc::nvrtcCompileProgram(prog, ptrs.len() as i32, ptrs.as_ptr()) };
    let out = if r != nvrtc::nvrtcResult::NVRTC_SUCCESS {
        Err(Error::KernelCompile {
            source_name,
            log: program_log(prog),
        })
    } else {
        let mut n = 0usize;
        // SAFETY: compiled program; out-parameter.
        let r = unsafe { nvrtc::nvrtcGetCUBINSize(prog, &mut n) };
        check(r, "nvrtcGetCUBINSize").and_then(|_| {
            let mut buf = vec![0u8; n];
            // SAFETY: `buf` has the size NVRTC reported.
            let r = unsafe { nvrtc::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast()) };
            check(r, "nvrtcGetCUBIN").map(|_| buf)
        })
    };
    // SAFETY: destroys the program created above, once.
    unsafe { nvrtc::nvrtcDestroyProgram(&mut prog) };
    out
}

fn program_log(prog: nvrtc::nvrtcProgram) -> String {
    let mut n = 0usize;
    // SAFETY: live program; out-parameter.
    if unsafe { nvrtc::nvrtcGetProgramLogSize(prog, &mut n) } != nvrtc::nvrtcResult::NVRTC_SUCCESS {
        return "(no log)".into();
    }
    let mut buf = vec![0u8; n.max(1)];
    // SAFETY: `buf` holds the reported size.
    unsafe { nvrtc::nvrtcGetProgramLog(prog, buf.as_mut_ptr().cast()) };
    String::from_utf8_lossy(&buf)
        .trim_end_matches('\0')
        .to_string()
}

/// FNV-1a, 64 bits: enough to key a cache (a collision would need a deliberate attack).
fn fnv64(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in *p {
            h ^= *b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The cache file for `dtype` on `arch` with NVRTC `ver`.
pub fn cache_path(cache: &Path, dtype: DataType, arch: &str, ver: (i32, i32)) -> PathBuf {
    let src = module_source(dtype).unwrap_or_default();
    let opts = options(arch).join(" ");
    let h = fnv64(&[src.as_bytes(), opts.as_bytes()]);
    cache.join(format!(
        "all_reduce-{}-{h:016x}-{arch}-nvrtc{}.{}.cubin",
        dtype.name(),
        ver.0,
        ver.1
    ))
}

/// The cubin for `dtype`: from the disk cache, or compiled now and stored there.
pub fn cubin(dtype: DataType, arch: &str, cfg: &Config) -> Result<Vec<u8>> {
    crate::driver::libs::ensure_nvrtc(cfg)?;
    let ver = nvrtc_version()?;
    let path = cache_path(&cfg.kernel_cache, dtype, arch, ver);
    if let Ok(b) = std::fs::read(&path) {
        if b.len() > 4 && &b[..4] == b"\x7fELF" {
            return Ok(b);
        }
    }
    let bin = compile(dtype, arch, cfg)?;
    // A failed cache write only costs a compile next time.
    if std::fs::create_dir_all(&cfg.kernel_cache).is_ok() {
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, &bin).is_ok() {
            let _ = std::fs::rename(&tmp, &path);
        }
    }
    Ok(bin)
}

/// The module of `dtype`'s kernels for the device of the current context (its own `sm_XY`),
/// from the disk cache or compiled now, loaded; `what` names the load in an error. For kernels a
/// caller loads outside a communicator's start-up (it keeps the module for the process's life).
pub(crate) fn load_on_current_device(
    dtype: DataType,
    cfg: &Config,
    what: &'static str,
) -> Result<crate::driver::Module> {
    use crate::driver::{current_device_attribute, DeviceAttribute as A};
    let arch = format!(
        "sm_{}{}",
        current_device_attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        current_device_attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?
    );
    let bin = cubin(dtype, &arch, cfg)?;
    crate::driver::Module::load(&bin, what)
}
