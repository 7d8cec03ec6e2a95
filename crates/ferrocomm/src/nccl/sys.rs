//! The few libnccl entry points ferrocomm calls, resolved with `dlopen`/`dlsym` from a library
//! file we choose (cudarc's loader only tries fixed names, none of them `libnccl.so.2`).
//!
//! Declarations follow `nccl.h` of NCCL 2.28 (<https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/api.html>).

#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};

pub type NcclComm = *mut c_void;
pub type NcclResult = c_int;
pub type CuStream = *mut c_void;

/// `ncclUniqueId`: 128 opaque bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    pub internal: [u8; 128],
}

pub const SUCCESS: NcclResult = 0;
/// `ncclScalarHostImmediate`: the PreMulSum factor is read on the host at enqueue time.
pub const SCALAR_HOST_IMMEDIATE: c_int = 1;

macro_rules! nccl_fns {
    ($($name:ident : fn($($arg:ty),*) -> $ret:ty;)*) => {
        /// Resolved entry points of one loaded libnccl.
        #[allow(non_snake_case)]
        pub struct Lib {
            /// The file the library was loaded from.
            pub path: PathBuf,
            _handle: *mut c_void,
            $(pub $name: unsafe extern "C" fn($($arg),*) -> $ret,)*
        }

        impl Lib {
            /// Loads `path` (a file path, or a bare soname for the system search) and resolves
            /// every entry point.
            ///
            /// # Safety
            /// Loading a library runs its initialisers; `path` must be a libnccl.
            pub unsafe fn load(path: &Path) -> Result<Lib, String> {
                let c = CString::new(path.as_os_str().as_encoded_bytes())
                    .map_err(|_| "path contains a NUL byte".to_string())?;
                // SAFETY: `c` is a valid C string; RTLD_GLOBAL so that one copy serves the process.
                let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
                if h.is_null() {
                    return Err(dl_error());
                }
                $(
                    // SAFETY: `h` is a live handle and the name a C string literal.
                    let sym = unsafe { libc::dlsym(h, concat!(stringify!($name), "\0").as_ptr().cast()) };
                    if sym.is_null() {
                        return Err(format!("{} lacks {}", path.display(), stringify!($name)));
                    }
                    // SAFETY: the symbol has the C signature declared in nccl.h.
                    let $name = unsafe {
                        std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> $ret>(sym)
                    };
                )*
                let path = loaded_path(h, path);
                Ok(Lib { path, _handle: h, $($name,)* })
            }
        }
    };
}

nccl_fns! {
    ncclGetVersion: fn(*mut c_int) -> NcclResult;
    ncclGetUniqueId: fn(*mut UniqueId) -> NcclResult;
    ncclCommInitRank: fn(*mut NcclComm, c_int, UniqueId, c_int) -> NcclResult;
    ncclCommDestroy: fn(NcclComm) -> NcclResult;
    ncclGetErrorString: fn(NcclResult) -> *const c_char;
    ncclGetLastError: fn(NcclComm) -> *const c_char;
    ncclAllReduce: fn(*const c_void, *mut c_void, usize, c_int, c_int, NcclComm, CuStream) -> NcclResult;
    ncclReduce: fn(*const c_void, *mut c_void, usize, c_int, c_int, c_int, NcclComm, CuStream) -> NcclResult;
    ncclBroadcast: fn(*const c_void, *mut c_void, usize, c_int, c_int, NcclComm, CuStream) -> NcclResult;
    ncclAllGather: fn(*const c_void, *mut c_void, usize, c_int, NcclComm, CuStream) -> NcclResult;
    ncclReduceScatter: fn(*const c_void, *mut c_void, usize, c_int, c_int, NcclComm, CuStream) -> NcclResult;
    ncclSend: fn(*const c_void, usize, c_int, c_int, NcclComm, CuStream) -> NcclResult;
    ncclRecv: fn(*mut c_void, usize, c_int, c_int, NcclComm, CuStream) -> NcclResult;
    ncclGroupStart: fn() -> NcclResult;
    ncclGroupEnd: fn() -> NcclResult;
    ncclRedOpCreatePreMulSum: fn(*mut c_int, *mut c_void, c_int, c_int, NcclComm) -> NcclResult;
    ncclRedOpDestroy: fn(c_int, NcclComm) -> NcclResult;
}

// SAFETY: the handle and function pointers are process-global and NCCL's API is thread-safe
// per communicator (callers serialise use of one communicator).
unsafe impl Send for Lib {}
// SAFETY: as above; nothing in `Lib` is mutated after loading.
unsafe impl Sync for Lib {}

fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a C string valid until the next dl* call on this thread.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "dlopen failed".into()
    } else {
        // SAFETY: non-null, NUL-terminated (checked above).
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// The file a handle came from (a bare soname resolves to a path through the link map).
fn loaded_path(h: *mut c_void, asked: &Path) -> PathBuf {
    let mut map: *mut libc::c_void = std::ptr::null_mut();
    // SAFETY: RTLD_DI_LINKMAP writes a `struct link_map *` into `map` for a live handle.
    let rc = unsafe {
        libc::dlinfo(
            h,
            libc::RTLD_DI_LINKMAP,
            (&mut map as *mut *mut c_void).cast(),
        )
    };
    if rc == 0 && !map.is_null() {
        // `struct link_map { ElfW(Addr) l_addr; char *l_name; ... }`.
        // SAFETY: glibc's link_map starts with l_addr then l_name (a C string owned by ld.so).
        let name = unsafe { *(map as *const *const c_char).add(1) };
        if !name.is_null() {
            // SAFETY: l_name is NUL-terminated and lives as long as the library stays loaded.
            let s = unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned();
            if !s.is_empty() {
                return PathBuf::from(s);
            }
        }
    }
    asked.to_path_buf()
}
