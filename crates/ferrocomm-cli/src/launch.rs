//! `ferrocomm launch`: start N ranks of a program with torchrun's variables set.

use anyhow::{bail, Context};
use ferrocomm::launch::{launch, LaunchSpec};

#[derive(clap::Args)]
#[command(
    after_help = "Example: ferrocomm launch -n 4 -- python train.py --steps 10\n\
torchrun's spellings work too: --nproc_per_node 4 --master_addr 127.0.0.1 --master_port 29500"
)]
pub struct LaunchArgs {
    /// Number of ranks to start.
    #[arg(
        short = 'n',
        long = "nprocs",
        visible_alias = "nproc-per-node",
        alias = "nproc_per_node"
    )]
    nprocs: usize,
    /// MASTER_ADDR for the ranks (torch's rendezvous); default 127.0.0.1.
    #[arg(long = "master-addr", alias = "master_addr", value_name = "ADDR")]
    master_addr: Option<String>,
    /// MASTER_PORT for the ranks (torch's rendezvous); default a free port.
    #[arg(long = "master-port", alias = "master_port", value_name = "PORT")]
    master_port: Option<u16>,
    /// Do not prefix output lines with "[rank K] ".
    #[arg(long)]
    no_prefix: bool,
    /// Stop every rank (exit code 124) when the job runs longer than this many seconds.
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<f64>,
    /// The program and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM [ARGS]..."
    )]
    command: Vec<String>,
}

pub fn run(args: LaunchArgs) -> anyhow::Result<i32> {
    if args.nprocs == 0 || args.nprocs > ferrocomm::config::MAX_WORLD_SIZE {
        bail!(
            "launch: -n must be at least 1 and at most {} (the number of ranks to start), got {}",
            ferrocomm::config::MAX_WORLD_SIZE,
            args.nprocs
        );
    }
    let timeout = match args.timeout {
        Some(s) => match ferrocomm::config::timeout_from_secs(s) {
            Ok(d) => Some(d),
            Err(why) => bail!("launch: --timeout {why}"),
        },
        None => None,
    };
    let (program, rest) = args
        .command
        .split_first()
        .context("launch: no program given")?;
    // The launcher's own MASTER_ADDR/MASTER_PORT, overridden (the spec's variables come last).
    let mut env = Vec::new();
    if let Some(addr) = args.master_addr {
        if addr.trim().is_empty() {
            bail!("launch: --master-addr must name a host, got an empty string");
        }
        env.push(("MASTER_ADDR".to_string(), addr));
    }
    if let Some(port) = args.master_port {
        if port == 0 {
            bail!("launch: --master-port must be a port number from 1 to 65535, got 0");
        }
        env.push(("MASTER_PORT".to_string(), port.to_string()));
    }
    let spec = LaunchSpec {
        nprocs: args.nprocs,
        program: program.clone(),
        args: rest.to_vec(),
        env,
        prefix_output: !args.no_prefix,
        timeout,
    };
    // The library error already names its cause; anyhow's chain would repeat it.
    launch(&spec).map_err(|e| anyhow::anyhow!("{e}"))
}
