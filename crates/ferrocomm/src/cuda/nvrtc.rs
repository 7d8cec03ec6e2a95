//! NVRTC calls: one CUDA C++ source to a cubin or to PTX, the compiler's version and the
//! architectures it knows. The caller has made NVRTC loadable (cudarc panics on a call into a
//! library it cannot load): the library through `libs::ensure_nvrtc`, the build script through
//! its own search.
//!
//! The crate's build script includes this file too (it compiles the built-in cubins), so it
//! depends on std and cudarc's NVRTC declarations alone.

use std::ffi::{c_char, CString};

use cudarc::nvrtc::sys as nvrtc;

/// What went wrong in NVRTC.
#[derive(Debug)]
pub enum NvrtcError {
    /// A call failed (`what`, NVRTC's result code).
    Call { what: &'static str, code: String },
    /// The source did not compile: NVRTC's log.
    Compile { source_name: String, log: String },
    /// A source, name or option holds a NUL byte.
    Nul(String),
}

impl std::fmt::Display for NvrtcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NvrtcError::Call { what, code } => write!(f, "{what}: NVRTC error {code}"),
            NvrtcError::Compile { source_name, log } => {
                write!(f, "{source_name} does not compile:\n{log}")
            }
            NvrtcError::Nul(what) => write!(f, "{what} holds a NUL byte"),
        }
    }
}

fn check(r: nvrtc::nvrtcResult, what: &'static str) -> Result<(), NvrtcError> {
    if r == nvrtc::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(NvrtcError::Call {
            what,
            code: format!("{r:?}"),
        })
    }
}

/// NVRTC's version (major, minor).
pub fn version() -> Result<(i32, i32), NvrtcError> {
    let (mut ma, mut mi) = (0, 0);
    // SAFETY: plain out-parameters; NVRTC is loadable (module contract).
    let r = unsafe { nvrtc::nvrtcVersion(&mut ma, &mut mi) };
    check(r, "nvrtcVersion")?;
    Ok((ma, mi))
}

/// The real architectures NVRTC compiles for (`90` for sm_90), ascending.
pub fn supported_archs() -> Result<Vec<i32>, NvrtcError> {
    let mut n: std::ffi::c_int = 0;
    // SAFETY: out-parameter.
    let r = unsafe { nvrtc::nvrtcGetNumSupportedArchs(&mut n) };
    check(r, "nvrtcGetNumSupportedArchs")?;
    let mut archs = vec![0; n.clamp(0, 1024) as usize];
    if !archs.is_empty() {
        // SAFETY: `archs` holds the number of entries NVRTC reported (at most 1024 kept; NVRTC
        // knows a few dozen).
        let r = unsafe { nvrtc::nvrtcGetSupportedArchs(archs.as_mut_ptr()) };
        check(r, "nvrtcGetSupportedArchs")?;
    }
    Ok(archs)
}

/// Compiles `src` with `options`; returns PTX (NUL-terminated, as `cuModuleLoadData` takes it)
/// when `ptx`, else the cubin. A compile error carries NVRTC's log.
pub fn compile(
    source_name: &str,
    src: &str,
    options: &[String],
    ptx: bool,
) -> Result<Vec<u8>, NvrtcError> {
    let csrc = CString::new(src).map_err(|_| NvrtcError::Nul(source_name.into()))?;
    let cname = CString::new(source_name).map_err(|_| NvrtcError::Nul("the source name".into()))?;
    let opts = options
        .iter()
        .map(|o| CString::new(o.as_str()).map_err(|_| NvrtcError::Nul(format!("option {o:?}"))))
        .collect::<Result<Vec<_>, _>>()?;
    let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
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
    // SAFETY: `prog` was created above; the option pointers outlive the call.
    let r = unsafe { nvrtc::nvrtcCompileProgram(prog, ptrs.len() as i32, ptrs.as_ptr()) };
    let out = if r != nvrtc::nvrtcResult::NVRTC_SUCCESS {
        Err(NvrtcError::Compile {
            source_name: source_name.into(),
            log: program_log(prog),
        })
    } else {
        output(prog, ptx)
    };
    // SAFETY: destroys the program created above, once.
    unsafe { nvrtc::nvrtcDestroyProgram(&mut prog) };
    out
}

/// The compiled program's PTX or cubin.
fn output(prog: nvrtc::nvrtcProgram, ptx: bool) -> Result<Vec<u8>, NvrtcError> {
    let mut n = 0usize;
    if ptx {
        // SAFETY: compiled program; out-parameter.
        let r = unsafe { nvrtc::nvrtcGetPTXSize(prog, &mut n) };
        check(r, "nvrtcGetPTXSize")?;
        let mut buf = vec![0u8; n];
        // SAFETY: `buf` has the size NVRTC reported (the NUL included).
        let r = unsafe { nvrtc::nvrtcGetPTX(prog, buf.as_mut_ptr().cast()) };
        check(r, "nvrtcGetPTX")?;
        Ok(buf)
    } else {
        // SAFETY: compiled program; out-parameter.
        let r = unsafe { nvrtc::nvrtcGetCUBINSize(prog, &mut n) };
        check(r, "nvrtcGetCUBINSize")?;
        let mut buf = vec![0u8; n];
        // SAFETY: `buf` has the size NVRTC reported.
        let r = unsafe { nvrtc::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast()) };
        check(r, "nvrtcGetCUBIN")?;
        Ok(buf)
    }
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
