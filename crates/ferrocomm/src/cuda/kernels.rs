//! The kernel registry at run time: each kernel unit's code for the device's architecture and
//! its CUDA module.
//!
//! A unit (`cuda/kernel_units.rs`) is one group of entry points of one element
//! type. Its code comes from, in order:
//! 1. the cubins built into the library for this architecture (crate build script; off with
//!    `FERROCOMM_BUILTIN_KERNELS=0`);
//! 2. the disk cache (`FERROCOMM_KERNEL_CACHE`), keyed by the unit's source hash and options,
//!    the arch and the NVRTC version, so an edited kernel, a different GPU or another NVRTC
//!    never reuses a stale cubin;
//! 3. a built-in cubin of an older GPU of the same major version (sm_80's on an sm_86), which
//!    runs there as it is;
//! 4. NVRTC, now: the unit alone, with one line on stderr first; processes compiling the same
//!    unit at once take turns through a lock file ([`kernel_cache`](super::kernel_cache));
//! 5. built-in PTX (newer GPUs without NVRTC), which the driver compiles as it loads.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

pub use super::kernel_cache::Origin;
use super::kernel_units::{self as units, VARIANTS as UNIT_VARIANTS};
pub use super::kernel_units::{
    is_ptx, target_number, Group, ALGOS, ALL_REDUCE_NAME, ALL_REDUCE_SOURCE, COLLECTIVES_SOURCE,
    COLL_ENTRIES, COLL_OP_ENTRIES, EXTRA_ENTRIES, LOWP_ENTRIES, LOWP_SOURCE, OPS, RMSNORM_ENTRIES,
    RMSNORM_SOURCE, WINDOW_ENTRIES, WINDOW_SOURCE,
};
use crate::config::Config;
use crate::driver::Module;
use crate::error::{Error, Result};
use crate::types::DataType;

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
    variant_index(dtype).is_some()
}

/// The position of `dtype` in [`VARIANTS`] (and in the unit table's variants).
pub fn variant_index(dtype: DataType) -> Option<usize> {
    VARIANTS.iter().position(|(d, _)| *d == dtype)
}

/// Whether `dtype` has the low-precision kernels (and the RMSNorm).
pub fn has_lowp(dtype: DataType) -> bool {
    variant_index(dtype).is_some_and(|v| UNIT_VARIANTS[v].float)
}

/// Every entry point of the all-reduce and the collectives (the groups of the f32 units,
/// less the low-precision and RMSNorm ones).
pub fn entry_names() -> Vec<String> {
    Group::ALL
        .into_iter()
        .filter(|g| !matches!(g, Group::LowPrecision | Group::RmsNorm))
        .flat_map(Group::entries)
        .collect()
}

/// Every entry point the units of `dtype` hold.
pub fn entry_names_for(dtype: DataType) -> Vec<String> {
    let Some(v) = variant_index(dtype) else {
        return Vec::new();
    };
    Group::ALL
        .into_iter()
        .filter(|g| g.applies(v))
        .flat_map(Group::entries)
        .collect()
}

/// The group whose unit holds entry point `name`.
pub fn group_of(name: &str) -> Option<Group> {
    static MAP: OnceLock<std::collections::HashMap<String, Group>> = OnceLock::new();
    MAP.get_or_init(|| {
        Group::ALL
            .into_iter()
            .flat_map(|g| g.entries().into_iter().map(move |e| (e, g)))
            .collect()
    })
    .get(name)
    .copied()
}

/// Every unit a GPU of `arch` (`sm_90`) runs: (dtype, group), dtypes in [`VARIANTS`] order.
pub fn units_for(arch: &str) -> Vec<(DataType, Group)> {
    units::units_for(arch)
        .into_iter()
        .map(|(v, g)| (VARIANTS[v].0, g))
        .collect()
}

/// The real architectures the loaded NVRTC compiles for (`90` for sm_90). NVRTC must be
/// loadable ([`crate::driver::libs::ensure_nvrtc`]).
pub fn nvrtc_supported_archs() -> Result<Vec<i32>> {
    nvrtc_version()?;
    super::nvrtc::supported_archs().map_err(nvrtc_error)
}

/// Runs `f` on every item on up to `threads` threads; results in the items' order.
pub fn parallel_map<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    super::kernel_cache::parallel_map(items, threads, f)
}

/// The full source of `dtype`'s unit of `group`.
pub fn unit_source(dtype: DataType, group: Group) -> Option<String> {
    let v = variant_index(dtype)?;
    group.applies(v).then(|| units::unit_source(v, group))
}

/// The error for a unit the GPU's architecture cannot run.
fn too_old(group: Group, arch: &str) -> Error {
    Error::Unsupported {
        collective: if group == Group::RmsNorm {
            "all_reduce_rmsnorm"
        } else {
            "low precision"
        },
        backend: "cuda",
        what: format!(
            "the {} kernels on {arch}: they need sm_{} or newer (FP8 conversions)",
            group.name(),
            group.min_arch()
        ),
    }
}

/// Whether a GPU of `arch` (`sm_80`) runs `group`'s kernels.
pub fn group_runs_on(group: Group, arch: &str) -> bool {
    target_number(arch).is_some_and(|n| n >= group.min_arch())
}

fn unsupported(dtype: DataType, group: Group) -> Error {
    Error::Unsupported {
        collective: "direct access",
        backend: "cuda",
        what: format!(
            "the {} kernels for dtype {dtype} (the direct-access kernels take {})",
            group.name(),
            DTYPES.map(|d| d.name()).join(", ")
        ),
    }
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
    super::nvrtc::version().map_err(nvrtc_error)
}

fn nvrtc_error(e: super::nvrtc::NvrtcError) -> Error {
    match e {
        super::nvrtc::NvrtcError::Compile { source_name, log } => {
            Error::KernelCompile { source_name, log }
        }
        other => Error::Cuda(other.to_string()),
    }
}

/// Compiles one CUDA C++ source for `target` (`sm_90`: a cubin; `compute_90`: PTX). NVRTC must
/// be loadable ([`crate::driver::libs::ensure_nvrtc`]); a compile error is [`Error::KernelCompile`] with
/// the log.
pub fn compile_source(source_name: &str, src: &str, target: &str) -> Result<Vec<u8>> {
    super::nvrtc::compile(source_name, src, &units::options(target), is_ptx(target))
        .map_err(nvrtc_error)
}

/// Compiles `dtype`'s unit of `group` for `target`, now, without the cache.
pub fn compile_unit(dtype: DataType, group: Group, target: &str, cfg: &Config) -> Result<Vec<u8>> {
    let v = variant_index(dtype)
        .filter(|&v| group.applies(v))
        .ok_or_else(|| unsupported(dtype, group))?;
    crate::driver::libs::ensure_nvrtc(cfg)?;
    compile_source(
        &format!("{ALL_REDUCE_NAME}[{} {}]", dtype.name(), group.name()),
        &units::unit_source(v, group),
        target,
    )
}

/// The cache file of `dtype`'s unit of `group` for `target` made by NVRTC `ver`.
pub fn cache_path(
    cache: &Path,
    dtype: DataType,
    group: Group,
    target: &str,
    ver: (i32, i32),
) -> Option<PathBuf> {
    let v = variant_index(dtype).filter(|&v| group.applies(v))?;
    Some(cache.join(units::cache_file(v, group, target, ver)))
}

// ---------------------------------------------------------------- built-in kernels

/// One unit's code inside a built-in target's frame.
struct BuiltinUnit {
    variant: usize,
    group: usize,
    /// `kernel_units::unit_key` at build time (the test holds it to the library's sources).
    key: u64,
    offset: usize,
    len: usize,
}

/// One target's units: a zstd frame of their code, one after the other.
struct BuiltinTarget {
    target: &'static str,
    raw_len: usize,
    data: &'static [u8],
    units: &'static [BuiltinUnit],
}

/// What the build put in.
struct Builtin {
    /// The NVRTC that compiled them.
    nvrtc: Option<(i32, i32)>,
    /// Why nothing, or not every target asked for, was built in.
    notes: &'static [&'static str],
    targets: &'static [BuiltinTarget],
}

include!(concat!(env!("OUT_DIR"), "/builtin_kernels.rs"));

/// The targets the crate's build makes when `FERROCOMM_BUILD_ARCHS` is unset (build.rs lists
/// them too; a test holds the two together).
pub const DEFAULT_BUILTIN_TARGETS: [&str; 4] = ["sm_80", "sm_90", "sm_100", "compute_90"];

/// The targets built into this library (`sm_90`, ..., `compute_90`), in build order.
pub fn builtin_targets() -> Vec<&'static str> {
    BUILTIN.targets.iter().map(|t| t.target).collect()
}

/// The NVRTC that compiled the built-in kernels; `None` when none are built in.
pub fn builtin_nvrtc() -> Option<(i32, i32)> {
    BUILTIN.nvrtc
}

/// Why no kernels, or not every target asked for, were built in.
pub fn builtin_notes() -> &'static [&'static str] {
    BUILTIN.notes
}

/// The built-in kernels' compressed size in bytes (what they add to the library).
pub fn builtin_compressed_bytes() -> usize {
    BUILTIN.targets.iter().map(|t| t.data.len()).sum()
}

/// The decompressed frame of built-in target `t`, kept for the process's life once asked for.
fn builtin_frame(t: &'static BuiltinTarget) -> Result<&'static [u8]> {
    static FRAMES: Mutex<Vec<(&'static str, &'static [u8])>> = Mutex::new(Vec::new());
    let mut frames = FRAMES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, f)) = frames.iter().find(|(n, _)| *n == t.target) {
        return Ok(f);
    }
    let raw = zstd::bulk::decompress(t.data, t.raw_len)
        .ok()
        .filter(|r| r.len() == t.raw_len)
        .ok_or_else(|| {
            Error::Cuda(format!(
                "the built-in kernels for {} do not decompress (the library is damaged)",
                t.target
            ))
        })?;
    let raw: &'static [u8] = Box::leak(raw.into_boxed_slice());
    frames.push((t.target, raw));
    Ok(raw)
}

/// The built-in code of unit (`v`, `g`) for `target` exactly.
fn builtin_unit(v: usize, g: Group, target: &str) -> Result<Option<&'static [u8]>> {
    let Some(t) = BUILTIN.targets.iter().find(|t| t.target == target) else {
        return Ok(None);
    };
    let Some(u) = t
        .units
        .iter()
        .find(|u| u.variant == v && u.group == g.index())
    else {
        return Ok(None);
    };
    let frame = builtin_frame(t)?;
    let end = u.offset.checked_add(u.len).filter(|&e| e <= frame.len());
    Ok(end.map(|e| &frame[u.offset..e]))
}

/// One built-in unit, decompressed: (target, dtype, group, code).
pub type BuiltinCode = (&'static str, DataType, Group, &'static [u8]);

/// Every built-in unit, decompressed.
pub fn builtin_units() -> Result<Vec<BuiltinCode>> {
    let mut out = Vec::new();
    for t in BUILTIN.targets {
        let frame = builtin_frame(t)?;
        for u in t.units {
            let (Some(&(dtype, _)), Some(&group)) =
                (VARIANTS.get(u.variant), Group::ALL.get(u.group))
            else {
                return Err(Error::Cuda(format!(
                    "built-in unit {}/{} unknown",
                    u.variant, u.group
                )));
            };
            let code = u
                .offset
                .checked_add(u.len)
                .and_then(|e| frame.get(u.offset..e))
                .ok_or_else(|| {
                    Error::Cuda(format!("built-in {} unit out of its frame", t.target))
                })?;
            out.push((t.target, dtype, group, code));
        }
    }
    Ok(out)
}

/// The key each built-in unit was compiled from, beside the key of the library's own source
/// for it: (target, dtype, group, built key, source key). They differ only when the build's
/// sources were not the library's.
pub fn builtin_keys() -> Vec<(&'static str, DataType, Group, u64, u64)> {
    BUILTIN
        .targets
        .iter()
        .flat_map(|t| {
            t.units.iter().filter_map(move |u| {
                let (dtype, _) = *VARIANTS.get(u.variant)?;
                let group = *Group::ALL.get(u.group)?;
                let now = units::unit_key(u.variant, group, t.target);
                Some((t.target, dtype, group, u.key, now))
            })
        })
        .collect()
}

/// What [`check_builtin`] found for one target.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TargetCheck {
    /// `sm_90`, or `compute_90` for PTX.
    pub target: &'static str,
    /// Units checked.
    pub units: usize,
    /// Kernel symbols found (every entry point of every unit).
    pub symbols: usize,
    /// The target's code, decompressed.
    pub bytes: usize,
    /// Its zstd frame in the library.
    pub compressed_bytes: usize,
}

/// Checks every built-in unit without a GPU: a cubin is a CUDA ELF file for its target's
/// architecture that defines every entry point the runtime looks up in it; PTX declares every
/// entry point for its target. Returns one line per target, or the first problem.
pub fn check_builtin() -> Result<Vec<TargetCheck>> {
    use object::read::elf::{ElfFile64, FileHeader as _};
    use object::{Object as _, ObjectSymbol as _};
    let bad = |what: String| Error::Cuda(format!("built-in kernels: {what}"));
    let all = builtin_units()?;
    let mut out = Vec::new();
    for t in BUILTIN.targets {
        let number = target_number(t.target).ok_or_else(|| bad(format!("target {}", t.target)))?;
        let mut check = TargetCheck {
            target: t.target,
            units: 0,
            symbols: 0,
            bytes: t.raw_len,
            compressed_bytes: t.data.len(),
        };
        for (_, dtype, group, code) in all.iter().filter(|u| u.0 == t.target) {
            let unit = format!("{} {dtype} {}", t.target, group.name());
            let entries = group.entries();
            if is_ptx(t.target) {
                let text = std::str::from_utf8(code.strip_suffix(&[0]).unwrap_or(code))
                    .map_err(|_| bad(format!("{unit}: PTX is not text")))?;
                if !text.contains(&format!(".target sm_{number}")) {
                    return Err(bad(format!("{unit}: PTX not for sm_{number}")));
                }
                for e in &entries {
                    if !text.contains(&format!(".entry {e}(")) {
                        return Err(bad(format!("{unit}: PTX lacks .entry {e}")));
                    }
                }
            } else {
                let elf = ElfFile64::<object::Endianness>::parse(*code)
                    .map_err(|e| bad(format!("{unit}: not an ELF file ({e})")))?;
                let header = elf.elf_header();
                let endian = elf.endian();
                if header.e_machine(endian) != object::elf::EM_CUDA {
                    return Err(bad(format!("{unit}: ELF machine is not CUDA")));
                }
                // ELF ABI 8 (CUDA 13) keeps the SM in bits 8-15 of e_flags.
                let sm = (header.e_flags(endian).0 >> 8) & 0xff;
                if sm != number {
                    return Err(bad(format!("{unit}: a cubin for sm_{sm}")));
                }
                for e in &entries {
                    let defined = elf.symbols().any(|s| {
                        s.name() == Ok(e.as_str())
                            && s.is_definition()
                            && s.kind() == object::SymbolKind::Text
                    });
                    if !defined {
                        return Err(bad(format!("{unit}: no kernel symbol {e}")));
                    }
                }
            }
            check.units += 1;
            check.symbols += entries.len();
        }
        out.push(check);
    }
    Ok(out)
}

// ---------------------------------------------------------------- code for a device

/// Where a unit's code for a device came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum CodeSource {
    /// Built into the library for this architecture.
    BuiltIn,
    /// Built in for an older GPU of the same major version (the target named), which runs it.
    BuiltInCompatible(&'static str),
    /// The disk cache.
    Cached,
    /// Compiled by this process with NVRTC.
    Compiled,
    /// Built-in PTX of the target named, compiled by the driver as it loads.
    BuiltInPtx(&'static str),
}

impl std::fmt::Display for CodeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CodeSource::BuiltIn => write!(f, "built-in"),
            CodeSource::BuiltInCompatible(t) => write!(f, "built-in ({t} cubin)"),
            CodeSource::Cached => write!(f, "cached"),
            CodeSource::Compiled => write!(f, "compiled"),
            CodeSource::BuiltInPtx(t) => write!(f, "built-in PTX ({t}, compiled by the driver)"),
        }
    }
}

/// A unit's code: a cubin, or NUL-terminated PTX.
#[derive(Debug, Clone)]
pub struct Code {
    /// The cubin or PTX (built-in code is borrowed from the decompressed frame).
    pub bytes: std::borrow::Cow<'static, [u8]>,
    /// Where it came from.
    pub source: CodeSource,
}

/// The cache entry of unit (`v`, `g`) for `arch`: the one of the loaded NVRTC's version where
/// NVRTC loads, else one of any version (a cache filled ahead of time by `ferrocomm
/// precompile`, used where no NVRTC is installed).
fn cached_unit(v: usize, g: Group, arch: &str, cfg: &Config) -> Option<Vec<u8>> {
    let ptx = is_ptx(arch);
    if crate::driver::libs::ensure_nvrtc(cfg).is_ok() {
        let ver = nvrtc_version().ok()?;
        return super::kernel_cache::read_entry(
            &cfg.kernel_cache.join(units::cache_file(v, g, arch, ver)),
            ptx,
        );
    }
    let stem = format!("{}-nvrtc", units::cache_stem(v, g, arch));
    let mut names: Vec<String> = std::fs::read_dir(&cfg.kernel_cache)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(&stem) && n.ends_with(if ptx { ".ptx" } else { ".cubin" }))
        .collect();
    names.sort();
    names
        .iter()
        .rev()
        .find_map(|n| super::kernel_cache::read_entry(&cfg.kernel_cache.join(n), ptx))
}

/// The built-in cubin of an older GPU of `arch`'s major version (the newest such), which runs
/// on `arch` as it is.
fn builtin_compatible(v: usize, g: Group, arch: &str) -> Result<Option<Code>> {
    let Some(n) = target_number(arch).filter(|_| !is_ptx(arch)) else {
        return Ok(None);
    };
    let fits = |m: u32| m / 10 == n / 10 && m < n;
    builtin_newest(v, g, false, fits, CodeSource::BuiltInCompatible)
}

/// Built-in PTX that a GPU of `arch` can run (the newest target not above it).
fn builtin_ptx(v: usize, g: Group, arch: &str) -> Result<Option<Code>> {
    let Some(n) = target_number(arch) else {
        return Ok(None);
    };
    builtin_newest(v, g, true, |m| m <= n, CodeSource::BuiltInPtx)
}

/// The built-in unit (`v`, `g`) of the newest target, PTX or cubin as `ptx` says, whose number
/// `fits`, its source named by `source`.
fn builtin_newest(
    v: usize,
    g: Group,
    ptx: bool,
    fits: impl Fn(u32) -> bool,
    source: fn(&'static str) -> CodeSource,
) -> Result<Option<Code>> {
    let mut best: Option<(u32, &'static str)> = None;
    for t in BUILTIN.targets.iter().filter(|t| is_ptx(t.target) == ptx) {
        if let Some(m) = target_number(t.target) {
            if fits(m) && best.is_none_or(|(b, _)| m > b) {
                best = Some((m, t.target));
            }
        }
    }
    let Some((_, target)) = best else {
        return Ok(None);
    };
    Ok(builtin_unit(v, g, target)?.map(|b| Code {
        bytes: b.into(),
        source: source(target),
    }))
}

/// The code of unit (`v`, `g`) for a GPU of `arch` that needs no compile: built-in for `arch`,
/// cached, or built in for an older GPU of the same major version. `None`: a compile is needed
/// (or the built-in PTX).
fn ready_code(v: usize, g: Group, arch: &str, cfg: &Config) -> Result<Option<Code>> {
    if cfg.builtin_kernels {
        if let Some(b) = builtin_unit(v, g, arch)? {
            return Ok(Some(Code {
                bytes: b.into(),
                source: CodeSource::BuiltIn,
            }));
        }
    }
    if let Some(b) = cached_unit(v, g, arch, cfg) {
        return Ok(Some(Code {
            bytes: b.into(),
            source: CodeSource::Cached,
        }));
    }
    if cfg.builtin_kernels {
        return builtin_compatible(v, g, arch);
    }
    Ok(None)
}

/// Why a GPU of `arch` compiles (for the line before it).
fn why_compile(arch: &str, cfg: &Config) -> String {
    if !cfg.builtin_kernels {
        "built-in kernels off: FERROCOMM_BUILTIN_KERNELS=0".into()
    } else if BUILTIN.targets.is_empty() {
        "this build has no built-in kernels".into()
    } else {
        format!("none built in for {arch}")
    }
}

/// Compiles unit (`v`, `g`) for `arch` through the cache: one line on stderr first (what, for
/// which GPU, about how long, where it is cached), and a wait, at most the configured timeout,
/// while another process compiles the same unit.
fn compile_cached(v: usize, g: Group, arch: &str, cfg: &Config) -> Result<Code> {
    crate::driver::libs::ensure_nvrtc(cfg)?;
    let ver = nvrtc_version()?;
    let name = units::unit_name(v, g);
    let file = units::cache_file(v, g, arch, ver);
    let ptx = is_ptx(arch);
    let mut say = |e: super::kernel_cache::Event<'_>| match e {
        super::kernel_cache::Event::Compiling => eprintln!(
            "ferrocomm: compiling the {name} kernels for {arch} ({}) with NVRTC {}.{}, about \
             {} s; cached in {}",
            why_compile(arch, cfg),
            ver.0,
            ver.1,
            g.about_seconds(),
            cfg.kernel_cache.display()
        ),
        super::kernel_cache::Event::Waiting { lock } => eprintln!(
            "ferrocomm: waiting for another process compiling the {name} kernels for {arch} \
             (lock {}, at most {} s)",
            lock.display(),
            cfg.timeout.as_secs()
        ),
        super::kernel_cache::Event::GaveUp { lock, waited } => eprintln!(
            "ferrocomm: {} still held after {:.0} s: compiling the {name} kernels here too",
            lock.display(),
            waited.as_secs_f64()
        ),
    };
    let (bytes, origin) = super::kernel_cache::cached_or_compile(
        &cfg.kernel_cache,
        &file,
        ptx,
        cfg.timeout,
        &mut say,
        || {
            super::nvrtc::compile(
                &format!("{ALL_REDUCE_NAME}[{name}]"),
                &units::unit_source(v, g),
                &units::options(arch),
                ptx,
            )
            .map_err(nvrtc_error)
        },
    )?;
    Ok(Code {
        bytes: bytes.into(),
        source: match origin {
            Origin::Cached => CodeSource::Cached,
            Origin::Compiled => CodeSource::Compiled,
        },
    })
}

/// The variant of `dtype` in the units of `group`, refused when the group has no unit of that
/// dtype or does not run on a GPU of `arch`.
fn variant_for(dtype: DataType, group: Group, arch: &str) -> Result<usize> {
    let v = variant_index(dtype)
        .filter(|&v| group.applies(v))
        .ok_or_else(|| unsupported(dtype, group))?;
    if !group_runs_on(group, arch) {
        return Err(too_old(group, arch));
    }
    Ok(v)
}

/// The code of `dtype`'s unit of `group` for a GPU of `arch` (`sm_90`), compiled now if
/// nothing else has it (see the module's doc for the order).
pub fn code(dtype: DataType, group: Group, arch: &str, cfg: &Config) -> Result<Code> {
    let v = variant_for(dtype, group, arch)?;
    if let Some(c) = ready_code(v, group, arch, cfg)? {
        return Ok(c);
    }
    match compile_cached(v, group, arch, cfg) {
        Ok(c) => Ok(c),
        Err(e @ Error::LibraryMissing { .. }) if cfg.builtin_kernels => {
            builtin_ptx(v, group, arch)?.ok_or(e)
        }
        Err(e) => Err(e),
    }
}

/// How a GPU of `arch` would get `dtype`'s unit of `group` now, without compiling anything:
/// `None` when it would compile it.
pub fn code_source(
    dtype: DataType,
    group: Group,
    arch: &str,
    cfg: &Config,
) -> Result<Option<CodeSource>> {
    let v = variant_for(dtype, group, arch)?;
    if let Some(c) = ready_code(v, group, arch, cfg)? {
        return Ok(Some(c.source));
    }
    if cfg.builtin_kernels && crate::driver::libs::ensure_nvrtc(cfg).is_err() {
        return Ok(builtin_ptx(v, group, arch)?.map(|c| c.source));
    }
    Ok(None)
}

// ---------------------------------------------------------------- modules

/// A unit's module loaded on the current context, and where its code came from.
pub(crate) struct LoadedUnit {
    pub module: Module,
    pub source: CodeSource,
}

/// Loads `dtype`'s unit of `group` on the current context (a GPU of `arch`): its code as
/// [`code`] finds it. A built-in or cached cubin the driver refuses (a driver older than the
/// NVRTC that made it) gives way to a compile here. `ready_only`: `None` instead of compiling.
pub(crate) fn load_unit(
    dtype: DataType,
    group: Group,
    arch: &str,
    cfg: &Config,
    ready_only: bool,
) -> Result<Option<LoadedUnit>> {
    let v = variant_for(dtype, group, arch)?;
    let what = format!("loading the {} kernels", units::unit_name(v, group));
    let refused = match ready_code(v, group, arch, cfg)? {
        Some(c) => match Module::load(&c.bytes, &what) {
            Ok(module) => {
                return Ok(Some(LoadedUnit {
                    module,
                    source: c.source,
                }))
            }
            Err(e) => Some((c.source, e)),
        },
        None => None,
    };
    if ready_only && refused.is_none() {
        return Ok(None);
    }
    let c = match compile_cached(v, group, arch, cfg) {
        Ok(c) => c,
        Err(e @ Error::LibraryMissing { .. }) if cfg.builtin_kernels && refused.is_none() => {
            builtin_ptx(v, group, arch)?.ok_or(e)?
        }
        Err(e) => {
            return Err(match refused {
                Some((src, first)) => Error::Cuda(format!(
                    "{what}: the driver refused the {src} code ({first}), and compiling failed: {e}"
                )),
                None => e,
            })
        }
    };
    if let (CodeSource::Cached, Some((src, e))) = (c.source, &refused) {
        // The refused code was this very cache entry.
        return Err(Error::Cuda(format!(
            "{what}: the driver refused the {src} code: {e}"
        )));
    }
    Ok(Some(LoadedUnit {
        module: Module::load(&c.bytes, &what)?,
        source: c.source,
    }))
}

/// The architecture of the current context's device: `sm_<major><minor>`.
pub(crate) fn current_arch() -> Result<String> {
    use crate::driver::{current_device_attribute, DeviceAttribute as A};
    Ok(format!(
        "sm_{}{}",
        current_device_attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        current_device_attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?
    ))
}

/// `dtype`'s unit of `group` for the device of the current context, loaded (compiled first if
/// needed); `what` names the load in an error. For kernels a caller loads outside a
/// communicator's start-up (it keeps the module for the process's life).
pub(crate) fn load_on_current_device(
    dtype: DataType,
    group: Group,
    cfg: &Config,
    what: &'static str,
) -> Result<Module> {
    let arch = current_arch()?;
    load_unit(dtype, group, &arch, cfg, false)?
        .map(|u| u.module)
        .ok_or_else(|| Error::Cuda(format!("{what}: no code")))
}
