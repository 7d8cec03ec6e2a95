//! The few libnccl entry points ferrocomm calls, resolved with `dlopen`/`dlsym` from a library
//! file we choose (cudarc's loader only tries fixed names, none of them `libnccl.so.2`).
//!
//! Declarations follow `nccl.h` of NCCL 2.28 (<https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/api.html>).

#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
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
/// `ncclInProgress`: a nonblocking communicator is still working on the call; poll
/// `ncclCommGetAsyncError` until it says something else.
pub const IN_PROGRESS: NcclResult = 7;
/// `NCCL_CONFIG_UNDEF_INT` (`INT_MIN`): "let NCCL choose" for an integer field of [`Config`].
pub const CONFIG_UNDEF_INT: c_int = c_int::MIN;
/// `NCCL_API_MAGIC`, the `magic` of an initialised [`Config`].
pub const CONFIG_MAGIC: c_uint = 0xcafe_beef;
/// `NCCL_VERSION(2, 28, 0)`: the struct version [`Config`] has the layout of.
pub const CONFIG_VERSION: c_uint = 22800;

/// `ncclConfig_t` as NCCL 2.28 declares it (`struct ncclConfig_v22800`).
///
/// The struct is versioned and append-only: NCCL copies `min(size, its own sizeof)` bytes over
/// its defaults and then resets the fields newer than `version` (blocking needs 2.14; cgaClusterSize,
/// minCTAs, maxCTAs, netName 2.17; trafficClass 2.25; collnetEnable, CTAPolicy, shrinkShare,
/// nvlsCTAs 2.27; nChannelsPerNetPeer, nvlinkCentricSched 2.28). Later releases append fields
/// (graphUsageMode, numRmaCtx in 2.29, ...) that keep their defaults when we pass this prefix.
/// We set only `blocking`; everything else is left undefined so NCCL picks its default.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Config {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub blocking: c_int,
    pub cga_cluster_size: c_int,
    pub min_ctas: c_int,
    pub max_ctas: c_int,
    pub net_name: *const c_char,
    pub split_share: c_int,
    pub traffic_class: c_int,
    pub comm_name: *const c_char,
    pub collnet_enable: c_int,
    pub cta_policy: c_int,
    pub shrink_share: c_int,
    pub nvls_ctas: c_int,
    pub n_channels_per_net_peer: c_int,
    pub nvlink_centric_sched: c_int,
}

impl Config {
    /// What `NCCL_CONFIG_INITIALIZER` gives, with `blocking = 0`: every NCCL call on the
    /// communicator (its initialisation included) may return [`IN_PROGRESS`] instead of
    /// blocking, which is what lets us put a deadline on it.
    pub fn nonblocking() -> Config {
        let u = CONFIG_UNDEF_INT;
        Config {
            size: std::mem::size_of::<Config>(),
            magic: CONFIG_MAGIC,
            version: CONFIG_VERSION,
            blocking: 0,
            cga_cluster_size: u,
            min_ctas: u,
            max_ctas: u,
            net_name: std::ptr::null(),
            split_share: u,
            traffic_class: u,
            comm_name: std::ptr::null(),
            collnet_enable: u,
            cta_policy: u,
            shrink_share: u,
            nvls_ctas: u,
            n_channels_per_net_peer: u,
            nvlink_centric_sched: u,
        }
    }
}
/// `ncclScalarHostImmediate`: the PreMulSum factor is read on the host at enqueue time.
pub const SCALAR_HOST_IMMEDIATE: c_int = 1;

macro_rules! nccl_fns {
    (
        required { $($name:ident : fn($($arg:ty),*) -> $ret:ty;)* }
        optional { $($oname:ident : fn($($oarg:ty),*) -> $oret:ty;)* }
    ) => {
        /// Resolved entry points of one loaded libnccl. The optional ones are absent from old
        /// releases (the nonblocking API arrived in 2.14).
        #[allow(non_snake_case)]
        pub struct Lib {
            /// The file the library was loaded from.
            pub path: PathBuf,
            _handle: *mut c_void,
            $(pub $name: unsafe extern "C" fn($($arg),*) -> $ret,)*
            $(pub $oname: Option<unsafe extern "C" fn($($oarg),*) -> $oret>,)*
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
                $(
                    // SAFETY: `h` is a live handle and the name a C string literal.
                    let sym = unsafe { libc::dlsym(h, concat!(stringify!($oname), "\0").as_ptr().cast()) };
                    let $oname = if sym.is_null() {
                        None
                    } else {
                        // SAFETY: the symbol has the C signature declared in nccl.h.
                        Some(unsafe {
                            std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($oarg),*) -> $oret>(sym)
                        })
                    };
                )*
                let path = loaded_path(h, path);
                Ok(Lib { path, _handle: h, $($name,)* $($oname,)* })
            }
        }
    };
}

nccl_fns! {
    required {
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
    optional {
        ncclCommInitRankConfig: fn(*mut NcclComm, c_int, UniqueId, c_int, *mut Config) -> NcclResult;
        ncclCommGetAsyncError: fn(NcclComm, *mut NcclResult) -> NcclResult;
        ncclCommAbort: fn(NcclComm) -> NcclResult;
        ncclCommFinalize: fn(NcclComm) -> NcclResult;
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    /// Offsets of `struct ncclConfig_v22800` on x86-64 / aarch64 Linux (LP64).
    #[test]
    fn config_has_the_nccl_2_28_layout() {
        assert_eq!(std::mem::size_of::<Config>(), 80);
        assert_eq!(offset_of!(Config, magic), 8);
        assert_eq!(offset_of!(Config, version), 12);
        assert_eq!(offset_of!(Config, blocking), 16);
        assert_eq!(offset_of!(Config, max_ctas), 28);
        assert_eq!(offset_of!(Config, net_name), 32);
        assert_eq!(offset_of!(Config, split_share), 40);
        assert_eq!(offset_of!(Config, traffic_class), 44);
        assert_eq!(offset_of!(Config, comm_name), 48);
        assert_eq!(offset_of!(Config, collnet_enable), 56);
        assert_eq!(offset_of!(Config, nvls_ctas), 68);
        assert_eq!(offset_of!(Config, nvlink_centric_sched), 76);
        let c = Config::nonblocking();
        assert_eq!(c.size, 80);
        assert_eq!(c.magic, 0xcafebeef);
        assert_eq!(c.version, 22800);
        assert_eq!(c.blocking, 0);
        assert_eq!(c.min_ctas, i32::MIN);
        assert_eq!(c.nvlink_centric_sched, i32::MIN);
        assert!(c.net_name.is_null() && c.comm_name.is_null());
    }
}
