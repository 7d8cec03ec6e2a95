//! `ferrocomm precompile`: fills the kernel cache ahead of time for a GPU architecture the
//! library has no built-in kernels for, on any machine with NVRTC.
//!
//! A GPU whose architecture is built in (see `ferrocomm info`) compiles nothing. Another one
//! compiles, at the first call that needs it, each kernel unit it lacks. A container image or a
//! CI job can run this once for the GPUs' architecture and ship the cache
//! (`FERROCOMM_KERNEL_CACHE`): start-up then only loads cubins, without NVRTC.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use ferrocomm::cuda::kernels::{self, CodeSource};
use ferrocomm::{Config, DataType};

#[derive(clap::Args)]
pub struct PrecompileArgs {
    /// GPU architecture to compile for (`sm_90` for H100/H200, `sm_120` for RTX 50)
    #[arg(long, default_value = "sm_90")]
    arch: String,
    /// Kernel cache directory (default: FERROCOMM_KERNEL_CACHE or ~/.cache/ferrocomm)
    #[arg(long)]
    cache: Option<PathBuf>,
}

/// What one dtype's units came to.
#[derive(Default)]
struct Tally {
    units: usize,
    bytes: usize,
    /// Units per source (`built-in`, `cached`, `compiled`, ...).
    by_source: BTreeMap<String, usize>,
    compile_time: Duration,
}

pub fn run(args: PrecompileArgs) -> anyhow::Result<i32> {
    let arch = args.arch.trim().to_ascii_lowercase();
    let valid = arch
        .strip_prefix("sm_")
        .is_some_and(|n| n.len() >= 2 && n.chars().all(|c| c.is_ascii_digit() || c == 'a'));
    if !valid {
        bail!("--arch {arch:?} is not a CUDA architecture such as sm_90");
    }
    let mut cfg = Config::from_env().context("reading the environment")?;
    if let Some(c) = args.cache {
        cfg.kernel_cache = c;
    }
    let units = kernels::units_for(arch.trim_end_matches('a'));
    let t0 = Instant::now();
    // What a GPU of this architecture would compile; nothing when every unit is at hand.
    let mut todo = Vec::new();
    let mut tally: BTreeMap<usize, Tally> = BTreeMap::new();
    for &(d, g) in &units {
        let t = tally
            .entry(kernels::variant_index(d).unwrap_or(0))
            .or_default();
        t.units += 1;
        match kernels::code_source(d, g, &arch, &cfg)? {
            Some(src) => *t.by_source.entry(src.to_string()).or_default() += 1,
            None => todo.push((d, g)),
        }
    }
    if !todo.is_empty() {
        ferrocomm::cuda::libs::ensure_nvrtc(&cfg)?;
        let known = kernels::nvrtc_supported_archs()?;
        let number = kernels::target_number(arch.trim_end_matches('a')).unwrap_or(0) as i32;
        if !known.contains(&number) {
            bail!(
                "NVRTC {:?} does not compile for {arch} (it knows {known:?})",
                kernels::nvrtc_version()?
            );
        }
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        let done = kernels::parallel_map(&todo, threads, |&(d, g)| {
            let t = Instant::now();
            kernels::code(d, g, &arch, &cfg).map(|c| (c, t.elapsed()))
        });
        for (&(d, g), r) in todo.iter().zip(done) {
            let (code, took) =
                r.with_context(|| format!("compiling the {d} {} kernels for {arch}", g.name()))?;
            let t = tally
                .entry(kernels::variant_index(d).unwrap_or(0))
                .or_default();
            t.bytes += code.bytes.len();
            t.compile_time += took;
            *t.by_source.entry(code.source.to_string()).or_default() += 1;
        }
    }
    for (v, t) in &tally {
        let parts: Vec<String> = t
            .by_source
            .iter()
            .map(|(src, n)| format!("{n} {src}"))
            .collect();
        let d: DataType = kernels::VARIANTS[*v].0;
        let compiled = t.by_source.get(&CodeSource::Compiled.to_string()).copied();
        println!(
            "{:<9} {:>2} units: {}{}",
            d.name(),
            t.units,
            parts.join(", "),
            compiled.map_or(String::new(), |_| format!(
                " ({} bytes, {:.1} s of compiles)",
                t.bytes,
                t.compile_time.as_secs_f64()
            ))
        );
    }
    if todo.is_empty() {
        println!(
            "nothing to compile for {arch}: every unit is built in or cached ({})",
            cfg.kernel_cache.display()
        );
    } else {
        println!(
            "kernels for {arch} cached in {} ({:.1} s)",
            cfg.kernel_cache.display(),
            t0.elapsed().as_secs_f64()
        );
    }
    Ok(0)
}
