//! `ferrocomm bench`.

#[derive(clap::Args)]
pub struct BenchArgs {}

pub fn run(_args: BenchArgs) -> anyhow::Result<i32> {
    anyhow::bail!("bench is not built yet")
}
