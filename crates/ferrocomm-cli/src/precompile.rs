//! `ferrocomm precompile`: fills the kernel cache ahead of time, on any machine with NVRTC.
//!
//! The first communicator on a GPU compiles every kernel module with NVRTC (tens of seconds on a
//! cold cache). A container image or a CI job can run this once, for the GPUs' architecture,
//! and ship the cache (`FERROCOMM_KERNEL_CACHE`), so that start-up only loads cubins.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use ferrocomm::cuda::kernels;
use ferrocomm::Config;

#[derive(clap::Args)]
pub struct PrecompileArgs {
    /// GPU architecture to compile for (`sm_90` for H100/H200)
    #[arg(long, default_value = "sm_90")]
    arch: String,
    /// Kernel cache directory (default: FERROCOMM_KERNEL_CACHE or ~/.cache/ferrocomm)
    #[arg(long)]
    cache: Option<PathBuf>,
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
    let t0 = Instant::now();
    // One thread per module, as the backend does at start-up.
    let results: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = kernels::VARIANTS
            .iter()
            .map(|(d, _)| {
                let (cfg, arch) = (&cfg, arch.as_str());
                (
                    *d,
                    s.spawn(move || {
                        let t = Instant::now();
                        kernels::cubin(*d, arch, cfg).map(|b| (b.len(), t.elapsed()))
                    }),
                )
            })
            .collect();
        hs.into_iter()
            .map(|(d, h)| (d, h.join().expect("compile thread panicked")))
            .collect()
    });
    let mut done = Vec::new();
    for (d, r) in results {
        let (bytes, took) = r.with_context(|| format!("compiling the {d} kernels for {arch}"))?;
        done.push((d, bytes, took));
    }
    let ver = kernels::nvrtc_version().ok();
    for (d, bytes, took) in done {
        let path = ver.map(|v| kernels::cache_path(&cfg.kernel_cache, d, &arch, v));
        println!(
            "{:<9} {:>8} bytes  {:>6.2} s  {}",
            d.name(),
            bytes,
            took.as_secs_f64(),
            path.map(|p| p.display().to_string()).unwrap_or_default()
        );
    }
    println!(
        "kernels for {arch} cached in {} ({:.1} s)",
        cfg.kernel_cache.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(0)
}
