//! The `ferrocomm` command: `bench`, `launch`, `info`, `precompile`, `tune`, `trace`.

mod bench;
mod info;
mod launch;
mod precompile;
mod tune;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "ferrocomm",
    version,
    about = "Direct-data-access collectives: benchmark, launcher, system info"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
// Parsed once per process: the size of the bench's flags does not matter.
#[allow(clippy::large_enum_variant)]
enum Command {
    /// Benchmark a collective (nccl-tests' flags and table), NCCL side by side.
    Bench(bench::BenchArgs),
    /// Start N ranks of a program with torchrun's variables set.
    Launch(launch::LaunchArgs),
    /// GPUs, links, libraries, thresholds and settings in effect.
    Info(info::InfoArgs),
    /// Compile every kernel for a GPU architecture into the kernel cache (needs NVRTC only).
    Precompile(precompile::PrecompileArgs),
    /// Time every candidate on this machine and write the tuning table the planner then uses.
    Tune(tune::TuneArgs),
    /// Read every rank's flight-recorder dump in DIR: the first call where the ranks diverge,
    /// and which rank is missing or stuck.
    Trace(TraceArgs),
}

#[derive(clap::Args)]
struct TraceArgs {
    /// The directory of the dumps (FERROCOMM_TRACE_DIR, or the one a failure's message names).
    dir: std::path::PathBuf,
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Bench(a) => bench::run(a),
        Command::Launch(a) => launch::run(a),
        Command::Info(a) => info::run(a),
        Command::Precompile(a) => precompile::run(a),
        Command::Tune(a) => tune::run(a),
        Command::Trace(a) => ferrocomm::trace::analyze(&a.dir)
            .map(|report| {
                print!("{report}");
                0
            })
            .map_err(anyhow::Error::from),
    };
    match code {
        Ok(c) => std::process::exit(c),
        Err(e) => {
            eprintln!("ferrocomm: error: {e:#}");
            std::process::exit(2);
        }
    }
}
