//! `ferrocomm precompile`: refusals, and an architecture built in needs nothing. The compile
//! path itself is `kernels::code`, which the library's cuda_kernels tests exercise.

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
        // sm_75: no built-in cubin runs there, and the built-in PTX is for sm_90 and newer.
        .args([
            "precompile",
            "--arch",
            "sm_75",
            "--cache",
            "/tmp/fc-precompile-never2",
        ])
        .env("FERROCOMM_NVRTC_LIB", "/nonexistent/libnvrtc.so.13")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("libnvrtc"), "{err}");
}

#[test]
fn a_built_in_architecture_compiles_nothing() {
    let out = ferrocomm()
        .args([
            "precompile",
            "--arch",
            "sm_90",
            "--cache",
            "/tmp/fc-precompile-never3",
        ])
        .env("FERROCOMM_NVRTC_LIB", "/nonexistent/libnvrtc.so.13")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("nothing to compile for sm_90"), "{text}");
    assert!(text.contains("bfloat16  10 units: 10 built-in"), "{text}");
    assert!(!std::path::Path::new("/tmp/fc-precompile-never3").exists());
}
