//! `ferrocomm launch`: start N ranks of a program with torchrun's variables set.

use anyhow::{bail, Context};
use ferrocomm::launch::{launch, LaunchSpec};

#[derive(clap::Args)]
#[command(after_help = "Example: ferrocomm launch -n 4 -- python train.py --steps 10")]
pub struct LaunchArgs {
    /// Number of ranks to start.
    #[arg(short = 'n', long = "nprocs", visible_alias = "nproc-per-node")]
    nprocs: usize,
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
    if args.nprocs == 0 {
        bail!("launch: -n must be at least 1 (the number of ranks to start)");
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
    let spec = LaunchSpec {
        nprocs: args.nprocs,
        program: program.clone(),
        args: rest.to_vec(),
        env: Vec::new(),
        prefix_output: !args.no_prefix,
        timeout,
    };
    // The library error already names its cause; anyhow's chain would repeat it.
    launch(&spec).map_err(|e| anyhow::anyhow!("{e}"))
}
