//! `ferrocomm bench`: an nccl-tests-compatible benchmark of ferrocomm's collectives, with NCCL
//! in the same run.
//!
//! Without RANK/WORLD_SIZE in the environment the command starts `-g N` ranks itself (this
//! same binary, through `ferrocomm::launch`); under torchrun, `ferrocomm launch` or mpirun each
//! process is one rank. Everything that can be refused is refused before a rank starts.

mod args;
mod check;
mod engine;
mod gpu;
mod json;
mod output;
mod plot;
mod rank;
mod sizes;
mod table;
mod timing;

use anyhow::bail;
use ferrocomm::config::BackendChoice;
use ferrocomm::launch::{launch, LaunchSpec};
use ferrocomm::{Algo, Config};

pub use args::BenchArgs;

/// The flag the parent adds to the command line of the ranks it starts.
const AS_RANK: &str = "--as-rank";

pub fn run(args: BenchArgs) -> anyhow::Result<i32> {
    let plan = args.plan()?;
    let cfg = Config::from_env()?;
    let command_line: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .filter(|a| a != AS_RANK)
        .collect();
    if args.as_rank {
        return rank::run(&plan, cfg, command_line);
    }
    if let Some(world) = cfg.launch.world_size {
        // Started by torchrun / ferrocomm launch / mpirun: this process is one rank.
        if let Some(g) = plan.ranks.filter(|&g| g != 1 && g != world) {
            bail!(
                "-g {g} starts ranks itself, but this process is already rank {} of {world} \
                 (RANK/WORLD_SIZE are set): leave -g out",
                cfg.launch.rank.unwrap_or(0)
            );
        }
        return rank::run(&plan, cfg, command_line);
    }

    let n = plan.ranks.unwrap_or(1);
    plan.check_world(n)?;
    let backend = plan.backend.map_or(cfg.backend, |b| b.choice());
    let gpus = crate::info::gpu_count();
    let on_host = backend == BackendChoice::Host || gpus == 0;
    match backend {
        BackendChoice::Cuda | BackendChoice::Nccl if gpus == 0 => {
            bail!("the {backend:?} backend needs a GPU and none was found (use --backend host)")
        }
        BackendChoice::Host => {}
        _ if gpus > 0 && n > gpus => {
            bail!("-g {n} asks for {n} ranks (one per GPU) but this machine has {gpus} GPUs")
        }
        _ => {}
    }
    if on_host {
        if plan.vs_nccl {
            bail!("--vs nccl needs GPUs: the host backend has no NCCL to compare with");
        }
        if plan.algo == Algo::Nccl {
            bail!("--algo nccl needs GPUs: the host backend has no NCCL");
        }
        if matches!(plan.mode, args::Mode::Graph { .. }) {
            bail!("-G (CUDA graph mode) needs a GPU; the host backend runs eager or --isolated");
        }
    }
    let mut child_args: Vec<String> = command_line.iter().skip(1).cloned().collect();
    child_args.push(AS_RANK.into());
    let spec = LaunchSpec {
        nprocs: n,
        program: std::env::current_exe()?.display().to_string(),
        args: child_args,
        env: Vec::new(),
        prefix_output: false,
        timeout: None,
    };
    launch(&spec).map_err(|e| anyhow::anyhow!("{e}"))
}
