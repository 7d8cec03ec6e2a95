//! Builds the CUDA kernels into the library: every kernel unit (src/cuda/kernel_units.rs)
//! compiled with NVRTC for each target of `FERROCOMM_BUILD_ARCHS` (default below: cubins for the
//! GPUs users run, PTX for later ones), compressed with zstd, one frame per target, and
//! embedded (`OUT_DIR/builtin_kernels.rs`, included by src/cuda/kernels.rs).
//!
//! Compiles go through the library's own disk cache (FERROCOMM_KERNEL_CACHE, else
//! ~/.cache/ferrocomm), keyed by each unit's source and options, arch and NVRTC version: a later
//! build, of any checkout on the machine, compiles only the units whose source changed.
//!
//! Without NVRTC the library builds all the same, with no kernels inside (a warning says so):
//! a GPU then compiles the units it needs at first use.

#[path = "src/cuda/kernel_cache.rs"]
#[allow(dead_code)]
mod kernel_cache;
#[path = "src/cuda/kernel_units.rs"]
#[allow(dead_code)]
mod kernel_units;
#[path = "src/cuda/nvrtc.rs"]
#[allow(dead_code)]
mod nvrtc;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kernel_units::Group;

/// The targets built in unless `FERROCOMM_BUILD_ARCHS` says otherwise: cubins for sm_80 (A100;
/// it runs as it is on every sm_8x GPU: A10, A40, L4, L40, RTX 30/40), sm_90 (H100, H200) and
/// sm_100 (B200, GB200), PTX of sm_90 for every newer GPU (RTX 50, RTX PRO Blackwell: the
/// driver compiles it as it loads). Every unit takes one to four CPU minutes per target on a
/// loaded 2-core machine: sm_86, sm_89 and sm_120 cubins would double a cold build for GPUs the
/// ones above already serve.
const DEFAULT_TARGETS: &str = "sm_80,sm_90,sm_100,compute_90";

/// How long a build waits for another process compiling the same unit (another build, a
/// `ferrocomm precompile`) before compiling it too.
const LOCK_WAIT: Duration = Duration::from_secs(30 * 60);

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=kernels");
    for f in ["kernel_cache.rs", "kernel_units.rs", "nvrtc.rs"] {
        println!("cargo:rerun-if-changed=src/cuda/{f}");
    }
    for v in [
        "FERROCOMM_BUILD_ARCHS",
        "FERROCOMM_NVRTC_LIB",
        "FERROCOMM_KERNEL_CACHE",
        "CUDA_HOME",
        "CUDA_PATH",
        "PYO3_PYTHON",
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
    ] {
        println!("cargo:rerun-if-env-changed={v}");
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let built = build(&out);
    std::fs::write(out.join("builtin_kernels.rs"), index(&built))
        .expect("writing OUT_DIR/builtin_kernels.rs");
}

/// What the build put in.
struct Built {
    nvrtc: Option<(i32, i32)>,
    /// Why nothing (or not everything asked for) was built in.
    notes: Vec<String>,
    targets: Vec<Target>,
}

struct Target {
    name: String,
    file: PathBuf,
    raw_len: usize,
    /// (variant, group index, key, offset, length) per unit, in `kernel_units::units_for` order.
    units: Vec<(usize, usize, u64, usize, usize)>,
}

fn build(out: &Path) -> Built {
    let mut built = Built {
        nvrtc: None,
        notes: Vec::new(),
        targets: Vec::new(),
    };
    let asked = std::env::var("FERROCOMM_BUILD_ARCHS").unwrap_or_else(|_| DEFAULT_TARGETS.into());
    let asked: Vec<String> = asked
        .split([',', ' '])
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty())
        .collect();
    if asked.iter().any(|t| t == "none") || asked.is_empty() {
        built
            .notes
            .push("FERROCOMM_BUILD_ARCHS=none at build time".into());
        return built;
    }
    for t in &asked {
        if kernel_units::target_number(t).is_none() {
            panic!(
                "FERROCOMM_BUILD_ARCHS: {t:?} is not a CUDA target (sm_90 for a cubin, compute_90 \
                 for PTX; `none` builds no kernels in)"
            );
        }
    }
    if std::env::var_os("DOCS_RS").is_some() {
        built.notes.push("a docs.rs build".into());
        return built;
    }
    let lib = match find_nvrtc() {
        Ok(lib) => lib,
        Err(tried) => {
            let why = format!("no NVRTC at build time ({tried})");
            println!(
                "cargo:warning=ferrocomm: {why}: no CUDA kernels are built in, a GPU compiles \
                 the ones it needs at first use (NVRTC needed there). To build them in: \
                 FERROCOMM_NVRTC_LIB=<dir of libnvrtc.so.13> (pip install \
                 nvidia-cuda-nvrtc==13.0.88) or CUDA_HOME"
            );
            built.notes.push(why);
            return built;
        }
    };
    let ver = nvrtc::version().unwrap_or_else(|e| panic!("NVRTC at {}: {e}", lib.display()));
    built.nvrtc = Some(ver);
    let supported =
        nvrtc::supported_archs().unwrap_or_else(|e| panic!("NVRTC at {}: {e}", lib.display()));
    let mut targets = Vec::new();
    for t in asked {
        let n = kernel_units::target_number(&t).expect("checked above") as i32;
        if supported.contains(&n) {
            targets.push(t);
        } else {
            let note = format!(
                "{t}: NVRTC {}.{} does not compile for it (it knows {supported:?})",
                ver.0, ver.1
            );
            println!("cargo:warning=ferrocomm: {note}; left out of the built-in kernels");
            built.notes.push(note);
        }
    }
    let cache = cache_dir();
    let per_target: Vec<Vec<(usize, Group)>> =
        targets.iter().map(|t| kernel_units::units_for(t)).collect();
    let work: Vec<(usize, usize, Group)> = per_target
        .iter()
        .enumerate()
        .flat_map(|(t, us)| us.iter().map(move |&(v, g)| (t, v, g)))
        .collect();
    let jobs = std::env::var("NUM_JOBS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2usize);
    let t0 = Instant::now();
    let compiled = std::sync::atomic::AtomicUsize::new(0);
    let codes = kernel_cache::parallel_map(&work, jobs, |&(t, v, g)| {
        let target = &targets[t];
        let ptx = kernel_units::is_ptx(target);
        let file = kernel_units::cache_file(v, g, target, ver);
        let (bytes, origin) =
            kernel_cache::cached_or_compile(&cache, &file, ptx, LOCK_WAIT, &mut |_| {}, || {
                nvrtc::compile(
                    &format!("{} for {target}", kernel_units::unit_name(v, g)),
                    &kernel_units::unit_source(v, g),
                    &kernel_units::options(target),
                    ptx,
                )
            })
            .unwrap_or_else(|e| {
                panic!(
                    "the {} kernels for {target}: {e}",
                    kernel_units::unit_name(v, g)
                )
            });
        if origin == kernel_cache::Origin::Compiled {
            compiled.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        bytes
    });
    let compiled = compiled.into_inner();
    if compiled > 0 {
        println!(
            "cargo:warning=ferrocomm: compiled {compiled} of {} kernel units ({}) with NVRTC \
             {}.{} in {:.0} s, cached in {}",
            work.len(),
            targets.join(" "),
            ver.0,
            ver.1,
            t0.elapsed().as_secs_f64(),
            cache.display()
        );
    }
    // One zstd frame per target: a process decompresses only its GPU's.
    let frames = kernel_cache::parallel_map(&targets, jobs, |target| {
        let t = targets.iter().position(|x| x == target).expect("listed");
        let first = per_target[..t].iter().map(Vec::len).sum::<usize>();
        let mut raw = Vec::new();
        let mut table = Vec::new();
        for (u, &(v, g)) in per_target[t].iter().enumerate() {
            let bytes = &codes[first + u];
            table.push((
                v,
                g.index(),
                kernel_units::unit_key(v, g, target),
                raw.len(),
                bytes.len(),
            ));
            raw.extend_from_slice(bytes);
        }
        let mut enc = zstd::bulk::Compressor::new(9).expect("zstd level 9");
        enc.long_distance_matching(true).expect("zstd long mode");
        enc.window_log(27).expect("zstd window");
        let z = enc.compress(&raw).expect("zstd compresses");
        let file = out.join(format!("kernels-{target}.zst"));
        std::fs::write(&file, &z).expect("writing a compressed kernel frame");
        Target {
            name: target.clone(),
            file,
            raw_len: raw.len(),
            units: table,
        }
    });
    built.targets = frames;
    built
}

/// The index the library includes: every target's frame and where each unit lies in it.
fn index(b: &Built) -> String {
    let mut s = String::from("// Generated by crates/ferrocomm/build.rs.\n");
    let _ = writeln!(s, "static BUILTIN: Builtin = Builtin {{");
    let _ = writeln!(s, "    nvrtc: {:?},", b.nvrtc);
    let _ = writeln!(s, "    notes: &{:?},", b.notes);
    let _ = writeln!(s, "    targets: &[");
    for t in &b.targets {
        let _ = writeln!(s, "        BuiltinTarget {{");
        let _ = writeln!(s, "            target: {:?},", t.name);
        let _ = writeln!(s, "            raw_len: {},", t.raw_len);
        let _ = writeln!(s, "            data: include_bytes!({:?}),", t.file);
        let _ = writeln!(s, "            units: &[");
        for (v, g, key, off, len) in &t.units {
            let _ = writeln!(
                s,
                "                BuiltinUnit {{ variant: {v}, group: {g}, key: {key:#018x}, offset: {off}, len: {len} }},"
            );
        }
        let _ = writeln!(s, "            ],\n        }},");
    }
    let _ = writeln!(s, "    ],\n}};");
    s
}

/// The library's cache directory (as `Config` finds it).
fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("FERROCOMM_KERNEL_CACHE") {
        return PathBuf::from(d);
    }
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("ferrocomm")
}

/// Loads NVRTC for cudarc: FERROCOMM_NVRTC_LIB alone when set, else the library path, CUDA_HOME
/// or CUDA_PATH, /usr/local/cuda, NVIDIA's Python wheel (of the Python maturin builds for, the
/// active environment, or this checkout's .venv). Returns the file loaded, or what was tried.
fn find_nvrtc() -> Result<PathBuf, String> {
    const NAME: &str = "libnvrtc.so.13";
    let mut candidates = Vec::new();
    if let Some(p) = std::env::var_os("FERROCOMM_NVRTC_LIB").map(PathBuf::from) {
        candidates.push(if p.is_dir() { p.join(NAME) } else { p });
    } else {
        // SAFETY: only tries to dlopen cudarc's names and closes them again.
        if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Ok(PathBuf::from(NAME));
        }
        for var in ["CUDA_HOME", "CUDA_PATH"] {
            if let Some(d) = std::env::var_os(var).map(PathBuf::from) {
                candidates.push(d.join("lib64").join(NAME));
                candidates.push(d.join("targets/x86_64-linux/lib").join(NAME));
            }
        }
        for d in ["/usr/local/cuda/lib64", "/usr/local/cuda-13.0/lib64"] {
            candidates.push(Path::new(d).join(NAME));
        }
        candidates.extend(python_nvrtc_dirs().into_iter().map(|d| d.join(NAME)));
    }
    let mut tried = Vec::new();
    for c in &candidates {
        if !c.exists() {
            tried.push(format!("{} (absent)", c.display()));
            continue;
        }
        match preload(c) {
            // SAFETY: as above.
            Ok(()) if unsafe { cudarc::nvrtc::sys::is_culib_present() } => return Ok(c.clone()),
            Ok(()) => tried.push(format!("{} (loaded, not found by soname)", c.display())),
            Err(e) => tried.push(format!("{}: {e}", c.display())),
        }
    }
    if tried.is_empty() {
        tried.push("the library path".into());
    }
    Err(tried.join(", "))
}

/// Directories of NVIDIA's NVRTC wheel (`nvidia/cu13/lib`) that the Pythons at hand see.
fn python_nvrtc_dirs() -> Vec<PathBuf> {
    let mut pythons: Vec<PathBuf> = ["PYO3_PYTHON", "PYTHON_SYS_EXECUTABLE"]
        .iter()
        .filter_map(|v| std::env::var_os(v).map(PathBuf::from))
        .collect();
    for prefix in ["VIRTUAL_ENV", "CONDA_PREFIX"]
        .iter()
        .filter_map(|v| std::env::var_os(v).map(PathBuf::from))
    {
        pythons.push(prefix.join("bin/python3"));
    }
    // The checkout's own environment (scripts/test.sh makes it).
    if let Some(root) = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .and_then(|m| m.parent()?.parent().map(Path::to_path_buf))
    {
        pythons.push(root.join(".venv/bin/python3"));
    }
    pythons.push("python3".into());
    let script = "import os, nvidia\n\
                  for p in nvidia.__path__:\n    print(os.path.join(p, 'cu13', 'lib'))\n";
    let mut dirs = Vec::new();
    for py in pythons {
        let Ok(out) = std::process::Command::new(&py)
            .args(["-c", script])
            .output()
        else {
            continue;
        };
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let d = PathBuf::from(line.trim());
            if d.join("libnvrtc.so.13").exists() && !dirs.contains(&d) {
                dirs.push(d);
            }
        }
    }
    dirs
}

/// Loads `lib` (its `libnvrtc-builtins` first: NVRTC opens that by soname when it compiles)
/// for the whole process, so that cudarc's `dlopen("libnvrtc.so.13")` finds it.
fn preload(lib: &Path) -> Result<(), String> {
    let mut files: Vec<PathBuf> = lib
        .parent()
        .and_then(|d| std::fs::read_dir(d).ok())
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("libnvrtc-builtins.so")
        })
        .map(|e| e.path())
        .collect();
    files.push(lib.to_path_buf());
    for f in files {
        let c = std::ffi::CString::new(f.as_os_str().as_encoded_bytes())
            .map_err(|_| "a NUL in the path".to_string())?;
        // SAFETY: a NUL-terminated path; loading runs the library's initialisers, as loading it
        // through cudarc would.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if h.is_null() && f == lib {
            return Err("dlopen failed".into());
        }
    }
    Ok(())
}
