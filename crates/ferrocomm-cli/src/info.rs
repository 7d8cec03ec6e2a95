//! `ferrocomm info`: GPUs, peer access, libraries, thresholds and settings in effect.
//!
//! The system probe here is also what `ferrocomm bench --json` records as the run's context.

use std::ffi::{c_int, c_void, CStr, CString};
use std::path::PathBuf;

use ferrocomm::config::Source;
use ferrocomm::plan::{direct_max_setting, DIRECT_LIMITED};
use ferrocomm::{Collective, Config};

/// Print GPUs, links, libraries, thresholds and settings in effect.
#[derive(clap::Args, Debug)]
pub struct InfoArgs {
    /// Print the same facts as JSON.
    #[arg(long)]
    pub json: bool,
    /// The GPU architecture whose kernels to report (default: each GPU's here, sm_90 without one)
    #[arg(long)]
    pub arch: Option<String>,
}

/// One GPU.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Gpu {
    pub index: usize,
    pub name: String,
    pub memory_bytes: usize,
    pub compute_capability: Option<(i32, i32)>,
    pub pci_bus_id: Option<String>,
}

/// A dynamically loaded library: where it was found and its version.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Library {
    pub found: bool,
    pub path: Option<String>,
    pub version: Option<String>,
    /// Why it was not found, or what was tried.
    pub note: Option<String>,
}

/// What the machine offers.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SystemInfo {
    pub hostname: String,
    pub gpus: Vec<Gpu>,
    /// CUDA driver version (`cuDriverGetVersion`), e.g. "13.0".
    pub cuda_driver: Option<String>,
    pub libcuda: Library,
    pub nccl: Library,
    pub nvrtc: Library,
    /// `peer_access[i][j]`: GPU i can map GPU j's memory (`cuDeviceCanAccessPeer`).
    pub peer_access: Vec<Vec<bool>>,
    /// `links[i][j]`: the link between GPU i and j as `nvidia-smi topo -m` names it (`NV18`,
    /// `PIX`, `SYS`, ...; `X` on the diagonal); empty when nvidia-smi is not there.
    pub links: Vec<Vec<String>>,
    /// How links were probed.
    pub link_note: String,
    /// NVLink between each pair of GPUs as NVML reports it (the LL128 all-reduce's check), or
    /// why NVML could not say; empty without GPUs.
    pub nvml: Vec<String>,
    /// This machine's key for its tuning table (`ferrocomm::tuning::host_key`, or
    /// `ferrocomm::cuda::machine_key` with GPUs).
    pub tuning_key: String,
}

/// The GPU-to-GPU part of `nvidia-smi topo -m`: one row per `GPU<i>` line, as many cells as
/// there are GPU columns in the header (escape codes and blank cells tolerated).
pub fn parse_topo(text: &str) -> Vec<Vec<String>> {
    let clean = |l: &str| {
        let mut out = String::new();
        let mut esc = false;
        for c in l.chars() {
            match (esc, c) {
                (false, '\u{1b}') => esc = true,
                (true, c) if c.is_ascii_alphabetic() => esc = false,
                (true, _) => {}
                (false, c) => out.push(c),
            }
        }
        out
    };
    let mut lines = text.lines().map(clean);
    let Some(header) = lines.find(|l| l.contains("GPU0")) else {
        return Vec::new();
    };
    let ngpu = header
        .split('\t')
        .filter(|c| c.trim().starts_with("GPU") && c.trim()[3..].parse::<u32>().is_ok())
        .count();
    lines
        .filter(|l| l.starts_with("GPU"))
        .take(ngpu)
        .map(|l| {
            l.split('\t')
                .skip(1)
                .take(ngpu)
                .map(|c| c.trim().to_string())
                .collect::<Vec<_>>()
        })
        .filter(|row| row.len() == ngpu)
        .collect()
}

/// Runs `nvidia-smi topo -m`; empty when it is not installed or fails.
fn probe_links() -> Vec<Vec<String>> {
    std::process::Command::new("nvidia-smi")
        .args(["topo", "-m"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| parse_topo(&String::from_utf8_lossy(&o.stdout)))
        .unwrap_or_default()
}

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// The file a loaded library came from, by the name it was opened with.
fn loaded_path(stem: &str) -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            std::path::Path::new(p)
                .file_name()
                .and_then(|f| f.to_str())
                .is_some_and(|f| f.starts_with(stem))
        })
        .map(String::from)
}

/// Opens the first library of `names` that loads; the handle stays open (the process keeps
/// using it, like cudarc does).
fn dlopen_first(names: &[String]) -> Option<(*mut c_void, String)> {
    for n in names {
        let Ok(c) = CString::new(n.as_str()) else {
            continue;
        };
        // SAFETY: `c` is a NUL-terminated path; dlopen has no other precondition. Loading runs
        // the library's constructors, which is what any user of these libraries does.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if !h.is_null() {
            return Some((h, n.clone()));
        }
    }
    None
}

fn dlsym(h: *mut c_void, name: &CStr) -> Option<*mut c_void> {
    // SAFETY: `h` is a live handle from dlopen and `name` is NUL-terminated.
    let p = unsafe { libc::dlsym(h, name.as_ptr()) };
    (!p.is_null()).then_some(p)
}

/// NCCL as the library itself would load it (FERROCOMM_NCCL_LIB, the system, torch's copy).
fn probe_nccl(cfg: &Config) -> Library {
    match ferrocomm::nccl::probe(cfg) {
        Ok((path, version)) => Library {
            found: true,
            path: Some(path.display().to_string()),
            version: Some(version),
            note: None,
        },
        Err(e) => Library {
            note: Some(e.to_string()),
            ..Default::default()
        },
    }
}

fn probe_nvrtc() -> Library {
    let mut names: Vec<String> = ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]
        .map(String::from)
        .to_vec();
    names.push("/usr/local/cuda/lib64/libnvrtc.so".into());
    let Some((h, name)) = dlopen_first(&names) else {
        return Library {
            note: Some(format!("not found (tried {})", names.join(", "))),
            ..Default::default()
        };
    };
    let version = dlsym(h, c"nvrtcVersion").and_then(|f| {
        // SAFETY: nvrtcVersion has the C signature `nvrtcResult (int*, int*)`.
        let f: extern "C" fn(*mut c_int, *mut c_int) -> c_int = unsafe { std::mem::transmute(f) };
        let (mut a, mut b) = (0, 0);
        (f(&mut a, &mut b) == 0).then(|| format!("{a}.{b}"))
    });
    Library {
        found: true,
        path: loaded_path("libnvrtc").or(Some(name)),
        version,
        note: None,
    }
}

/// GPUs, driver and peer access through ferrocomm's driver layer.
fn probe_cuda(info: &mut SystemInfo) {
    use ferrocomm::driver;
    if !driver::libs::driver_present() {
        info.libcuda.note = Some("libcuda not found: no GPU driver on this machine".into());
        info.link_note = "no GPU".into();
        return;
    }
    info.libcuda.found = true;
    if let Err(e) = driver::init() {
        info.libcuda.note = Some(format!("{e}"));
        info.link_note = "no usable GPU".into();
        return;
    }
    info.libcuda.path = loaded_path("libcuda");
    if let Ok((major, minor)) = driver::driver_version() {
        info.cuda_driver = Some(format!("{major}.{minor}"));
        info.libcuda.version = info.cuda_driver.clone();
    }
    let n = driver::gpu_count();
    for i in 0..n {
        info.gpus.push(Gpu {
            index: i,
            name: driver::device_name(i).unwrap_or_else(|e| format!("? ({e})")),
            memory_bytes: driver::device_total_memory(i).unwrap_or(0),
            compute_capability: driver::device_compute_capability(i).ok(),
            pci_bus_id: driver::device_pci_bus_id(i).ok(),
        });
    }
    info.peer_access = info
        .gpus
        .iter()
        .map(|a| {
            info.gpus
                .iter()
                .map(|b| {
                    a.index == b.index
                        || matches!(driver::can_access_peer(a.index, b.index), Ok(true))
                })
                .collect()
        })
        .collect();
    info.links = probe_links();
    info.nvml = probe_nvml(&info.gpus);
    info.link_note = if info.links.len() == info.gpus.len() {
        "peer access from cuDeviceCanAccessPeer, link kinds from `nvidia-smi topo -m`".into()
    } else {
        "peer access from cuDeviceCanAccessPeer (link kinds unknown: nvidia-smi topo -m \
         did not answer)"
            .into()
    };
}

/// One line per pair of GPUs: NVLink between them or not by NVML, as the LL128 all-reduce
/// checks its peers; with one GPU, whether NVML knows it (asked about itself).
fn probe_nvml(gpus: &[Gpu]) -> Vec<String> {
    let bus: Vec<(usize, &str)> = gpus
        .iter()
        .filter_map(|g| g.pci_bus_id.as_deref().map(|b| (g.index, b)))
        .collect();
    if let [(i, b)] = bus[..] {
        return vec![match ferrocomm::cuda::nvml::nvlink_between(b, b) {
            Ok(_) => format!("GPU{i}: known to NVML (one GPU: no pairs)"),
            Err(e) => format!("GPU{i}: NVML could not say ({e})"),
        }];
    }
    let mut out = Vec::new();
    for (k, &(i, a)) in bus.iter().enumerate() {
        for &(j, b) in &bus[k + 1..] {
            out.push(match ferrocomm::cuda::nvml::nvlink_between(a, b) {
                Ok(true) => format!("GPU{i}-GPU{j}: NVLink"),
                Ok(false) => format!("GPU{i}-GPU{j}: no NVLink (the LL128 all-reduce stays off)"),
                Err(e) => format!("GPU{i}-GPU{j}: unknown ({e})"),
            });
        }
    }
    out
}

/// GPUs the driver shows (0 without a driver), as the library counts them.
pub fn gpu_count() -> usize {
    ferrocomm::cuda::gpu_count()
}

/// Probes the machine. Never fails: what is missing is reported as missing.
pub fn probe_system(cfg: &Config) -> SystemInfo {
    let mut info = SystemInfo {
        hostname: hostname(),
        ..Default::default()
    };
    probe_cuda(&mut info);
    info.nccl = probe_nccl(cfg);
    info.nvrtc = probe_nvrtc();
    info.tuning_key = if info.gpus.is_empty() {
        ferrocomm::tuning::host_key()
    } else {
        ferrocomm::cuda::machine_key()
    };
    info
}

fn human(bytes: usize) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < U.len() {
        v /= 1024.0;
        i += 1;
    }
    if v.fract() == 0.0 {
        format!("{v} {}", U[i])
    } else {
        format!("{v:.1} {}", U[i])
    }
}

fn lib_line(name: &str, l: &Library) -> String {
    if l.found {
        format!(
            "{name}: {} (version {})",
            l.path.as_deref().unwrap_or("?"),
            l.version.as_deref().unwrap_or("unknown")
        )
    } else {
        format!("{name}: {}", l.note.as_deref().unwrap_or("not found"))
    }
}

/// A threshold in effect: the value, and whether the environment or the tuning table set it.
fn threshold(v: Option<usize>, table: usize, var: &str) -> String {
    match v {
        Some(b) => format!("{} (env {var})", human(b)),
        None => format!("{} (table)", human(table)),
    }
}

/// The tuning table in force: where it came from, then its rules as the planner reads them.
fn tuning_section(w: &mut String, cfg: &Config, sys: &SystemInfo) {
    use std::fmt::Write as _;
    let t = &cfg.tuning;
    let _ = writeln!(w, "\n== Tuning table");
    let _ = writeln!(
        w,
        "in force: {} (digest {}){}",
        t.source,
        t.digest,
        if t.machine.is_empty() {
            String::new()
        } else {
            format!("; {}", t.machine)
        }
    );
    for r in &t.all_reduce {
        let _ = writeln!(
            w,
            "all_reduce, {} ranks: push <= {}, flat <= {}, tree <= {}",
            r.worlds,
            human(r.push_max),
            human(r.flat_max),
            human(r.tree_max)
        );
    }
    for r in &t.direct_max {
        let names: Vec<&str> = r.collectives.iter().map(|c| c.name()).collect();
        let _ = writeln!(
            w,
            "{}, {} ranks: direct {}",
            names.join("/"),
            r.worlds,
            r.max
                .map_or("at every size".to_string(), |m| format!("<= {}", human(m)))
        );
    }
    let pipes: Vec<String> = t
        .pipe_min
        .iter()
        .map(|(k, n)| format!("{k} from {}", human(*n)))
        .collect();
    let _ = writeln!(
        w,
        "low precision on cuda from {}; parts in rounds of {}: {}",
        human(t.cuda_lp_min_bytes),
        human(t.pipe_round_bytes),
        pipes.join(", ")
    );
    if !sys.tuning_key.is_empty() {
        let file = ferrocomm::tuning::machine_file(&cfg.tuning_dir, &sys.tuning_key);
        let _ = writeln!(
            w,
            "this machine's table: {} ({})",
            file.display(),
            if file.exists() {
                "there"
            } else {
                "none: `ferrocomm tune` writes it"
            }
        );
    }
    let _ = writeln!(
        w,
        "(FERROCOMM_TUNING names a table file; the settings below win over the table)"
    );
}

/// The world size `info`'s plans are shown for.
const PLAN_WORLD: usize = 2;
/// The sizes (bytes per rank) `info`'s plans are shown for.
const PLAN_SIZES: [usize; 5] = [1 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20];
/// The collectives `info`'s plans are shown for.
const PLAN_COLLECTIVES: [Collective; 7] = [
    Collective::AllReduce,
    Collective::AllGather,
    Collective::ReduceScatter,
    Collective::AllToAll,
    Collective::Broadcast,
    Collective::Reduce,
    Collective::Send,
];

/// One line per collective: the [`ferrocomm::Plan`] this machine's backend gives each of
/// [`PLAN_SIZES`] (`all_reduce: 1 KiB flat, 64 KiB flat, ...`), a refusal as `error: ...`:
/// the host backend's without a GPU; with GPUs the cuda backend's, its direct access as the
/// configuration lays it out (the copy engines where set, LL128 lines where the first two GPUs
/// share NVLink or ranks share one GPU) and NCCL where the library was found.
pub fn plans(cfg: &Config, sys: &SystemInfo) -> Vec<String> {
    use ferrocomm::plan::{cuda_call_plan, host_call_plan, CallShape, CudaCaps};
    let (dt, auto, lp) = (
        ferrocomm::DataType::F32,
        ferrocomm::Algo::Auto,
        ferrocomm::LowPrecisionChoice::Default,
    );
    let nvlink = sys.gpus.len() < 2
        || sys
            .links
            .first()
            .and_then(|r| r.get(1))
            .is_some_and(|l| l.starts_with("NV"));
    let no_nccl = sys.nccl.note.clone().unwrap_or_default();
    let cuda = CudaCaps {
        world: PLAN_WORLD,
        dda: Some(ferrocomm::cuda::dda_caps(
            cfg,
            PLAN_WORLD,
            cfg.thresholds.ce_min.filter(|&m| m > 0),
            nvlink,
        )),
        no_dda: "",
        nccl: sys.nccl.found,
        no_nccl: &no_nccl,
        multi_host: false,
        kernel_dtypes: &ferrocomm::cuda::kernels::DTYPES,
    };
    PLAN_COLLECTIVES
        .iter()
        .map(|&coll| {
            let cells: Vec<String> = PLAN_SIZES
                .iter()
                .map(|&bytes| {
                    // What Backend::plan answers for the call (a Sum, aligned, plain operands).
                    let shape = CallShape::of(coll, bytes, dt);
                    let plan = if sys.gpus.is_empty() {
                        host_call_plan(&shape, PLAN_WORLD, auto, lp, cfg)
                    } else {
                        cuda_call_plan(&cuda, cfg, &shape, auto, lp)
                    };
                    match plan {
                        Ok(p) => format!("{} {p}", human(bytes)),
                        Err(e) => format!("{} error: {e}", human(bytes)),
                    }
                })
                .collect();
            format!("{}: {}", coll.name(), cells.join(", "))
        })
        .collect()
}

/// What the host backend runs (every communicator on a machine without a GPU): all-reduce flat
/// up to the flat threshold and tree above it (there is no NCCL to hand large ones to), every
/// other collective by direct access to shared memory at every size.
fn host_choices(w: &mut String, cfg: &Config) {
    use std::fmt::Write as _;
    let t = &cfg.thresholds;
    let _ = writeln!(w, "\n== Host backend (what runs here; bytes per rank)");
    for world in [2usize, 4, 8] {
        let (_, f, _) = cfg.tuning.all_reduce(world);
        let _ = writeln!(
            w,
            "{world} ranks: all_reduce flat <= {}, tree above",
            threshold(t.flat_max, f, "FERROCOMM_ALLREDUCE_FLAT_MAX_BYTES"),
        );
    }
    let _ = writeln!(
        w,
        "other collectives: direct through shared memory at every size"
    );
    let _ = writeln!(
        w,
        "chunks of {} per rank (FERROCOMM_HOST_SLOT_BYTES); FERROCOMM_ALGO={} forces one where it applies",
        human(cfg.host_slot_bytes),
        cfg.algo
    );
}

/// How a GPU of one architecture gets one dtype's kernel units.
#[derive(Debug, Clone, serde::Serialize)]
pub struct KernelModule {
    pub dtype: String,
    pub units: usize,
    /// Units per way (`built-in`, `cached`, `to be compiled`, ...).
    pub ways: Vec<(String, usize)>,
    /// About how many seconds of one core the units to be compiled take.
    pub compile_seconds: u32,
}

/// The kernels for one architecture.
#[derive(Debug, Clone, serde::Serialize)]
pub struct KernelReport {
    pub arch: String,
    /// Why this architecture (a GPU here, `--arch`, or the default).
    pub why: String,
    pub modules: Vec<KernelModule>,
}

/// The architectures `info` reports kernels for: `--arch`, else each distinct one of this
/// machine's GPUs, else sm_90.
pub fn kernel_archs(sys: &SystemInfo, arch: Option<&str>) -> Vec<(String, String)> {
    if let Some(a) = arch {
        return vec![(a.trim().to_ascii_lowercase(), "--arch".into())];
    }
    let mut out: Vec<(String, String)> = Vec::new();
    for g in &sys.gpus {
        if let Some((a, b)) = g.compute_capability {
            let arch = format!("sm_{a}{b}");
            if !out.iter().any(|(x, _)| *x == arch) {
                out.push((arch, format!("GPU {}", g.index)));
            }
        }
    }
    if out.is_empty() {
        out.push(("sm_90".into(), "no GPU here; `--arch` picks another".into()));
    }
    out
}

/// Per dtype, how a GPU of `arch` gets its kernel units now (nothing is compiled here).
pub fn kernel_report(cfg: &Config, arch: &str, why: &str) -> KernelReport {
    use ferrocomm::cuda::kernels;
    let mut modules: Vec<KernelModule> = Vec::new();
    for (d, _) in kernels::VARIANTS {
        let mut m = KernelModule {
            dtype: d.name().to_string(),
            units: 0,
            ways: Vec::new(),
            compile_seconds: 0,
        };
        let mut add = |way: String| match m.ways.iter_mut().find(|(w, _)| *w == way) {
            Some((_, n)) => *n += 1,
            None => m.ways.push((way, 1)),
        };
        for g in kernels::Group::ALL {
            if kernels::unit_source(d, g).is_none() {
                continue;
            }
            m.units += 1;
            if !kernels::group_runs_on(g, arch) {
                add(format!("not on {arch} (need sm_{})", g.min_arch()));
                continue;
            }
            match kernels::code_source(d, g, arch, cfg) {
                Ok(Some(src)) => add(src.to_string()),
                Ok(None) => {
                    add("to be compiled".into());
                    m.compile_seconds += g.about_seconds();
                }
                Err(e) => add(format!("refused: {e}")),
            }
        }
        modules.push(m);
    }
    KernelReport {
        arch: arch.to_string(),
        why: why.to_string(),
        modules,
    }
}

fn kernels_section(w: &mut String, cfg: &Config, reports: &[KernelReport]) {
    use ferrocomm::cuda::kernels;
    use std::fmt::Write as _;
    let targets = kernels::builtin_targets();
    let _ = writeln!(w, "\n== Kernels");
    if targets.is_empty() {
        let _ = writeln!(
            w,
            "built in: none ({}); a GPU compiles each unit it needs at first use",
            kernels::builtin_notes().join("; ")
        );
    } else {
        let (a, b) = kernels::builtin_nvrtc().unwrap_or_default();
        let _ = writeln!(
            w,
            "built in: {} (NVRTC {a}.{b}, {} compressed){}",
            targets.join(" "),
            human(kernels::builtin_compressed_bytes()),
            if cfg.builtin_kernels {
                ""
            } else {
                "; ignored: FERROCOMM_BUILTIN_KERNELS=0"
            }
        );
    }
    for r in reports {
        let _ = writeln!(w, "for {} ({}):", r.arch, r.why);
        for m in &r.modules {
            let ways: Vec<String> = m
                .ways
                .iter()
                .map(|(way, n)| {
                    if *n == m.units {
                        way.clone()
                    } else {
                        format!("{n} {way}")
                    }
                })
                .collect();
            let about = if m.compile_seconds > 0 {
                format!(" (about {} s of one core)", m.compile_seconds)
            } else {
                String::new()
            };
            let _ = writeln!(
                w,
                "  {:<9} {:>2} units: {}{about}",
                m.dtype,
                m.units,
                ways.join(", ")
            );
        }
    }
}

/// The report as text, without the kernels.
#[cfg(test)]
pub fn render(cfg: &Config, sys: &SystemInfo) -> String {
    render_with(cfg, sys, &[])
}

/// The report as text, with the kernels of `reports`.
pub fn render_with(cfg: &Config, sys: &SystemInfo, reports: &[KernelReport]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let w = &mut s;
    let _ = writeln!(
        w,
        "ferrocomm {} on {}",
        env!("CARGO_PKG_VERSION"),
        sys.hostname
    );
    let _ = writeln!(w, "\n== GPUs");
    if sys.gpus.is_empty() {
        let why = sys
            .libcuda
            .note
            .as_deref()
            .unwrap_or("the driver reports none");
        let _ = writeln!(w, "no GPU ({why}); collectives run on the host backend");
    }
    for g in &sys.gpus {
        let cc = g
            .compute_capability
            .map_or("?".into(), |(a, b)| format!("sm_{a}{b}"));
        let _ = writeln!(
            w,
            "GPU {}: {} ({}, {cc}, PCI {})",
            g.index,
            g.name,
            human(g.memory_bytes),
            g.pci_bus_id.as_deref().unwrap_or("?")
        );
    }
    if let Some(d) = &sys.cuda_driver {
        let _ = writeln!(w, "CUDA driver: {d}");
    }
    if sys.peer_access.len() > 1 {
        let _ = writeln!(w, "\n== Peer access ({})", sys.link_note);
        let head: String = (0..sys.peer_access.len())
            .map(|j| format!(" GPU{j:<6}"))
            .collect();
        let _ = writeln!(w, "      {head}");
        for (i, row) in sys.peer_access.iter().enumerate() {
            let cells: String = row
                .iter()
                .enumerate()
                .map(|(j, &ok)| {
                    let link = sys.links.get(i).and_then(|r| r.get(j));
                    let c = if i == j {
                        "X".to_string()
                    } else if ok {
                        // The link kind where known (NV18 = 18 NVLinks), else plain P2P.
                        link.map_or("P2P".to_string(), |l| format!("P2P/{l}"))
                    } else {
                        link.map_or("no".to_string(), |l| format!("no/{l}"))
                    };
                    format!(" {c:<9}")
                })
                .collect();
            let _ = writeln!(w, "GPU{i:<2} {cells}");
        }
    } else {
        let _ = writeln!(w, "links: {}", sys.link_note);
    }
    for line in &sys.nvml {
        let _ = writeln!(w, "NVML: {line}");
    }
    let _ = writeln!(w, "\n== Libraries");
    let _ = writeln!(w, "{}", lib_line("libcuda", &sys.libcuda));
    let _ = writeln!(w, "{}", lib_line("NVRTC", &sys.nvrtc));
    let _ = writeln!(w, "{}", lib_line("NCCL", &sys.nccl));
    let cache = &cfg.kernel_cache;
    let _ = writeln!(
        w,
        "kernel cache: {} ({})",
        cache.display(),
        if cache.is_dir() {
            "exists"
        } else {
            "not created yet"
        }
    );
    if !reports.is_empty() {
        kernels_section(w, cfg, reports);
    }

    let t = &cfg.thresholds;
    tuning_section(w, cfg, sys);
    if sys.gpus.is_empty() {
        host_choices(w, cfg);
    }
    let gpu_note = if sys.gpus.is_empty() {
        "; GPU backends only, none on this machine"
    } else {
        ""
    };
    let _ = writeln!(w, "\n== All-reduce thresholds (bytes per rank{gpu_note})");
    for world in [2usize, 4, 8] {
        let (p, f, tr) = cfg.tuning.all_reduce(world);
        let _ = writeln!(
            w,
            "{world} ranks: push <= {}, flat <= {}, tree <= {}, above: NCCL",
            threshold(t.push_max, p, "FERROCOMM_ALLREDUCE_PUSH_MAX_BYTES"),
            threshold(t.flat_max, f, "FERROCOMM_ALLREDUCE_FLAT_MAX_BYTES"),
            threshold(t.tree_max, tr, "FERROCOMM_ALLREDUCE_TREE_MAX_BYTES"),
        );
    }
    let _ = match t.ce_min.filter(|&m| m > 0) {
        Some(m) => writeln!(
            w,
            "2 ranks: flat all-reduces of {m} bytes and more (up to the staging) by the copy \
             engines (FERROCOMM_ALLREDUCE_CE_MIN_BYTES)"
        ),
        None => writeln!(
            w,
            "2 ranks: the copy engines carry no all-reduce (FERROCOMM_ALLREDUCE_CE_MIN_BYTES unset)"
        ),
    };
    let _ = match t.ll128_max.filter(|&m| m > 0) {
        Some(m) => writeln!(
            w,
            "flat all-reduces of at most {m} bytes (and the staging) in LL128 lines \
             (FERROCOMM_ALLREDUCE_LL128_MAX_BYTES)"
        ),
        None => writeln!(
            w,
            "flat all-reduces pull through the staging (FERROCOMM_ALLREDUCE_LL128_MAX_BYTES unset)"
        ),
    };
    let _ = writeln!(
        w,
        "\n== Direct-access limits (2 ranks; halved above 4 ranks{gpu_note})"
    );
    for coll in DIRECT_LIMITED {
        let (v, var) = direct_max_setting(t, coll);
        let _ = match (v, cfg.tuning.direct_max(coll, 2)) {
            (None, None) => writeln!(w, "{}: direct at every size (table)", coll.name()),
            (v, d) => writeln!(
                w,
                "{}: direct <= {}, above: NCCL",
                coll.name(),
                threshold(v, d.unwrap_or(0), var)
            ),
        };
    }
    let (v, var) = direct_max_setting(t, Collective::Send);
    let _ = writeln!(
        w,
        "send/recv: direct <= {} at two ranks only, otherwise: NCCL",
        threshold(
            v,
            cfg.tuning.direct_max(Collective::Send, 2).unwrap_or(0),
            var
        )
    );
    if cfg.algo != ferrocomm::Algo::Auto {
        let _ = writeln!(w, "forced algorithm: {} (FERROCOMM_ALGO)", cfg.algo);
    }

    let backend = if sys.gpus.is_empty() {
        "host backend"
    } else {
        "cuda backend, planned from the configuration (direct access on, as its start-up checks \
         find it)"
    };
    let _ = writeln!(
        w,
        "\n== Plans: {backend}, {PLAN_WORLD} ranks, float (bytes per rank: the path, as the \
         bench's algo column and FERROCOMM_DEBUG print it)"
    );
    for line in plans(cfg, sys) {
        let _ = writeln!(w, "{line}");
    }

    let lp = &cfg.low_precision;
    let _ = writeln!(w, "\n== Low precision");
    let _ = writeln!(
        w,
        "{}: format {}, block {} elements, min bytes {}, all_reduce {}, all_gather {}, \
         reduce_scatter {}, all_to_all {}",
        if lp.enabled { "on" } else { "off" },
        lp.format,
        lp.block,
        lp.min_bytes.map_or(
            format!(
                "backend default (cuda {}, host 0)",
                human(cfg.tuning.cuda_lp_min_bytes)
            ),
            human
        ),
        lp.all_reduce,
        lp.all_gather,
        lp.reduce_scatter,
        lp.all_to_all
    );

    let _ = writeln!(w, "\n== Staging memory per communicator");
    let _ = writeln!(
        w,
        "host: {} per rank (FERROCOMM_HOST_SLOT_BYTES) x ranks, e.g. {} for 2 ranks, {} for 8",
        human(cfg.host_slot_bytes),
        human(cfg.host_slot_bytes * 2),
        human(cfg.host_slot_bytes * 8)
    );
    let _ = writeln!(
        w,
        "cuda: {} per GPU for 2 ranks, {} for 8 (flags, push buffers, double-buffered staging \
         of FERROCOMM_CUDA_STAGING_BYTES = {})",
        human(ferrocomm::cuda::staging_memory_bytes(cfg, 2)),
        human(ferrocomm::cuda::staging_memory_bytes(cfg, 8)),
        human(cfg.cuda_staging_bytes)
    );

    let _ = writeln!(w, "\n== Environment (values in effect)");
    for (name, val, src, _) in cfg.table() {
        let from = match src {
            Source::Env => "env",
            Source::Default => "default",
        };
        let _ = writeln!(w, "{name:<36} {val:<40} {from}");
    }
    s
}

/// The report as JSON.
#[derive(serde::Serialize)]
struct InfoJson<'a> {
    system: &'a SystemInfo,
    config: &'a Config,
    env: Vec<EnvEntry>,
    kernel_cache: PathBuf,
    builtin_kernels: Vec<&'static str>,
    kernels: Vec<KernelReport>,
}

/// One environment variable in effect (for JSON reports).
#[derive(Debug, Clone, serde::Serialize)]
pub struct EnvEntry {
    pub name: &'static str,
    pub value: String,
    pub source: Source,
}

pub fn env_entries(cfg: &Config) -> Vec<EnvEntry> {
    cfg.table()
        .into_iter()
        .map(|(name, value, source, _)| EnvEntry {
            name,
            value,
            source,
        })
        .collect()
}

/// Writes to stdout; a reader that stops early (`| head`) is not an error.
fn emit(text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}

pub fn run(args: InfoArgs) -> anyhow::Result<i32> {
    let mut cfg = Config::from_env()?;
    let sys = probe_system(&cfg);
    // The table a communicator here would use: this machine's where it has one.
    cfg.use_machine_table(&sys.tuning_key)?;
    if let Some(a) = &args.arch {
        if ferrocomm::cuda::kernels::target_number(a.trim()).is_none() || a.starts_with("compute") {
            anyhow::bail!("--arch {a:?} is not a CUDA architecture such as sm_90");
        }
    }
    let reports: Vec<KernelReport> = kernel_archs(&sys, args.arch.as_deref())
        .iter()
        .map(|(arch, why)| kernel_report(&cfg, arch, why))
        .collect();
    if args.json {
        let j = InfoJson {
            system: &sys,
            config: &cfg,
            env: env_entries(&cfg),
            kernel_cache: cfg.kernel_cache.clone(),
            builtin_kernels: ferrocomm::cuda::kernels::builtin_targets(),
            kernels: reports,
        };
        emit(&(serde_json::to_string_pretty(&j)? + "\n"))?;
    } else {
        emit(&render_with(&cfg, &sys, &reports))?;
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_print_in_binary_units() {
        assert_eq!(human(4 << 20), "4 MiB");
        assert_eq!(human(64 << 10), "64 KiB");
        assert_eq!(human(1000), "1000 B");
        assert_eq!(human(3 << 19), "1.5 MiB");
    }

    #[test]
    fn topology_matrix_from_nvidia_smi() {
        // As printed on the 2xH200 machine (header underlined with escape codes).
        let text = "\t\u{1b}[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\u{1b}[0m\n\
                    GPU0\t X \tNV18\t0-31\t0\t\tN/A\n\
                    GPU1\tNV18\t X \t0-31\t0\t\tN/A\n\n\
                    Legend:\n\n  X    = Self\n";
        assert_eq!(
            parse_topo(text),
            vec![
                vec!["X".to_string(), "NV18".into()],
                vec!["NV18".into(), "X".into()]
            ]
        );
        assert!(parse_topo("").is_empty());
        assert!(parse_topo("No devices were found\n").is_empty());
        let sys = SystemInfo {
            peer_access: vec![vec![true, true], vec![true, true]],
            links: parse_topo(text),
            ..Default::default()
        };
        let r = render(&Config::default(), &sys);
        assert!(r.contains("P2P/NV18"), "{r}");
    }

    #[test]
    fn report_names_sources_and_thresholds() {
        let cfg = Config::from_lookup(|k| {
            (k == "FERROCOMM_ALLREDUCE_FLAT_MAX_BYTES").then(|| "256K".to_string())
        })
        .unwrap();
        let sys = SystemInfo {
            hostname: "h".into(),
            link_note: "no GPU".into(),
            ..Default::default()
        };
        let r = render(&cfg, &sys);
        assert!(r.contains("no GPU"), "{r}");
        // Without a GPU the host backend's choices come first, the GPU thresholds marked.
        let host = r.find("== Host backend").expect("host section");
        assert!(host < r.find("== All-reduce thresholds").unwrap(), "{r}");
        assert!(
            r.contains("2 ranks: all_reduce flat <= 256 KiB (env FERROCOMM_ALLREDUCE_FLAT_MAX_BYTES), tree above"),
            "{r}"
        );
        let flat4 = cfg.tuning.all_reduce(4).1;
        let plain = render(&Config::from_lookup(|_| None).unwrap(), &sys);
        assert!(
            plain.contains(&format!(
                "4 ranks: all_reduce flat <= {} (table), tree above",
                human(flat4)
            )),
            "{plain}"
        );
        assert!(
            r.contains("bytes per rank; GPU backends only, none on this machine"),
            "{r}"
        );
        let with_gpu = render(
            &cfg,
            &SystemInfo {
                gpus: vec![Gpu {
                    index: 0,
                    name: "H200".into(),
                    memory_bytes: 141 << 30,
                    compute_capability: Some((9, 0)),
                    pci_bus_id: None,
                }],
                ..sys.clone()
            },
        );
        assert!(!with_gpu.contains("== Host backend"), "{with_gpu}");
        assert!(!with_gpu.contains("none on this machine"), "{with_gpu}");
        assert!(
            r.contains("flat <= 256 KiB (env FERROCOMM_ALLREDUCE_FLAT_MAX_BYTES)"),
            "{r}"
        );
        let push2 = cfg.tuning.all_reduce(2).0;
        assert!(
            r.contains(&format!("push <= {} (table)", human(push2))),
            "{r}"
        );
        assert!(r.contains("host: 4 MiB per rank"), "{r}");
        // Direct-access limits: a default size, and the all-to-all-v's none.
        assert!(r.contains("all_gather: direct <= 32 MiB (table)"), "{r}");
        assert!(
            r.contains("all_to_all_v: direct at every size (table)"),
            "{r}"
        );
        // The table in force and where it came from.
        assert!(
            r.contains("== Tuning table\nin force: built in (digest "),
            "{r}"
        );
        assert!(
            r.contains("all_reduce, 1-2 ranks: push <= 64 KiB, flat <= 32 MiB, tree <= 32 MiB"),
            "{r}"
        );
        assert!(r
            .lines()
            .any(|l| l.starts_with("FERROCOMM_ALLREDUCE_FLAT_MAX_BYTES") && l.ends_with("env")));
    }

    #[test]
    fn kernels_per_module_built_in_cached_or_to_compile() {
        let mut cfg = Config::default();
        let sys = SystemInfo::default();
        assert_eq!(
            kernel_archs(&sys, None),
            vec![(
                "sm_90".to_string(),
                "no GPU here; `--arch` picks another".to_string()
            )]
        );
        let r = kernel_report(&cfg, "sm_90", "test");
        let bf16 = r.modules.iter().find(|m| m.dtype == "bfloat16").unwrap();
        assert_eq!(
            (bf16.units, bf16.ways.clone()),
            (10, vec![("built-in".to_string(), 10)])
        );
        let text = render_with(&cfg, &sys, &[r]);
        assert!(
            text.contains("== Kernels\nbuilt in: sm_80 sm_90 sm_100 compute_90"),
            "{text}"
        );
        assert!(text.contains("  bfloat16  10 units: built-in\n"), "{text}");
        // sm_86 runs sm_80's cubins; its FP8 units (low precision, norm) are not among them.
        cfg.kernel_cache = std::env::temp_dir().join("fc-info-no-cache");
        let r = kernel_report(&cfg, "sm_86", "test");
        let bf16 = r.modules.iter().find(|m| m.dtype == "bfloat16").unwrap();
        assert_eq!(bf16.ways[0], ("built-in (sm_80 cubin)".to_string(), 8));
        assert_eq!(bf16.ways[1], ("not on sm_86 (need sm_89)".to_string(), 2));
        // Built-in kernels off: everything is to be compiled, with an estimate.
        cfg.builtin_kernels = false;
        let r = kernel_report(&cfg, "sm_90", "test");
        let i32m = r.modules.iter().find(|m| m.dtype == "int32").unwrap();
        assert_eq!(i32m.ways, vec![("to be compiled".to_string(), 8)]);
        assert!(i32m.compile_seconds > 0);
        let text = render_with(&cfg, &sys, &[r]);
        assert!(
            text.contains("ignored: FERROCOMM_BUILTIN_KERNELS=0"),
            "{text}"
        );
    }

    #[test]
    fn plans_are_the_backend_s_own() {
        let cfg = Config::default();
        let plan_line = |sys: &SystemInfo| {
            plans(&cfg, sys)
                .into_iter()
                .find(|l| l.starts_with("all_reduce: "))
                .unwrap()
        };
        let host = SystemInfo::default();
        // 2 ranks, defaults: flat up to 32 MiB, tree above (no NCCL on the host backend).
        assert_eq!(
            plan_line(&host),
            "all_reduce: 1 KiB flat, 64 KiB flat, 1 MiB flat, 16 MiB flat, 256 MiB tree"
        );
        let gpus = SystemInfo {
            gpus: vec![Gpu {
                index: 0,
                name: "g".into(),
                memory_bytes: 1 << 30,
                compute_capability: Some((9, 0)),
                pci_bus_id: None,
            }],
            nccl: Library {
                found: true,
                ..Default::default()
            },
            ..Default::default()
        };
        // The cuda backend's: push to 64 KiB, flat to 32 MiB, NCCL above.
        assert_eq!(
            plan_line(&gpus),
            "all_reduce: 1 KiB push, 64 KiB push, 1 MiB flat, 16 MiB flat, 256 MiB nccl"
        );
        let r = render(&cfg, &gpus);
        assert!(r.contains("== Plans: cuda backend"), "{r}");
        assert!(r.contains("\nsend: 1 KiB direct,"), "{r}");
    }
}
