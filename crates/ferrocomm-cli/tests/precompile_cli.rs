//! `ferrocomm precompile`: refusals. The compile path itself is `kernels::cubin`, which the
//! library's cuda_kernels tests exercise for every module.

use std::process::Command;

fn ferrocomm() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ferrocomm"))
}

#[test]
fn a_non_cuda_architecture_is_refused() {
    let out = ferrocomm()
        .args([
            "precompile",
            "--arch",
            "gfx942",
            "--cache",
            "/tmp/fc-precompile-never",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("gfx942") && err.contains("sm_90"), "{err}");
    assert!(!std::path::Path::new("/tmp/fc-precompile-never").exists());
}

#[test]
fn a_missing_nvrtc_is_named() {
    let out = ferrocomm()
        .args(["precompile", "--cache", "/tmp/fc-precompile-never2"])
        .env("FERROCOMM_NVRTC_LIB", "/nonexistent/libnvrtc.so.13")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("libnvrtc"), "{err}");
}
