//! Embeds the git revision the binary was built from (for `ferrocomm bench --json`).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

fn main() {
    let rev = git(&["rev-parse", "HEAD"]).unwrap_or_default();
    println!("cargo:rustc-env=FERROCOMM_GIT_REVISION={rev}");
    // Rebuild when HEAD moves: HEAD itself (branch switches) and the branch's ref.
    for p in [
        git(&["rev-parse", "--git-path", "HEAD"]),
        git(&["rev-parse", "--symbolic-full-name", "HEAD"])
            .and_then(|r| git(&["rev-parse", "--git-path", &r])),
    ]
    .into_iter()
    .flatten()
    {
        println!("cargo:rerun-if-changed={p}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
