//! `ferrocomm launch`.

#[derive(clap::Args)]
pub struct LaunchArgs {}

pub fn run(_args: LaunchArgs) -> anyhow::Result<i32> {
    anyhow::bail!("launch is not built yet")
}
