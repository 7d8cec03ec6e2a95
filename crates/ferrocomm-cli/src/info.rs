//! `ferrocomm info`.

#[derive(clap::Args)]
pub struct InfoArgs {}

pub fn run(_args: InfoArgs) -> anyhow::Result<i32> {
    anyhow::bail!("info is not built yet")
}
