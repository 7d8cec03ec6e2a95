//! Hostile values in the environment of a real process: a `BadEnv` error naming the
//! variable, never an abort, a panic or a value silently ignored. Each case runs this test
//! binary again as a child (the ignored `child`) with the variables set, since they are read
//! from the process environment.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::process::Command;

use ferrocomm::bootstrap::MemStore;
use ferrocomm::config::BackendChoice;
use ferrocomm::{CommOptions, Communicator, Config, Error};

#[test]
#[ignore = "entry point of the child processes that the other tests start"]
fn child() {
    // A communicator from the environment alone, as a rank started by a launcher makes it.
    let r = Config::from_env().and_then(|c| {
        Communicator::new(CommOptions {
            backend: Some(BackendChoice::Host),
            config: Some(c),
            ..CommOptions::new("hostile")
        })
    });
    match r {
        Ok(_) => println!("CREATED"),
        Err(Error::BadEnv { var, why, .. }) => println!("BADENV {var}: {why}"),
        Err(e) => println!("OTHER {e}"),
    }
}

/// Runs `child` with `vars` set (and no other launch variables); its exit code and output.
fn run(vars: &[(&str, &OsStr)]) -> (Option<i32>, String) {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", "child", "--ignored", "--nocapture"]);
    for v in [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "FERROCOMM_STORE_SECRET",
        "FERROCOMM_TIMEOUT_S",
    ] {
        c.env_remove(v);
    }
    for (k, v) in vars {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr),
    )
}

#[test]
fn hostile_world_sizes_ranks_and_timeouts_are_bad_env_errors() {
    let s = |v: &'static str| OsStr::new(v);
    for (vars, var) in [
        // Once an abort allocating 26 TB in the store gather, and a capacity-overflow panic.
        (
            vec![("RANK", s("0")), ("WORLD_SIZE", s("1099511627776"))],
            "WORLD_SIZE",
        ),
        (
            vec![("RANK", s("0")), ("WORLD_SIZE", s("4611686018427387904"))],
            "WORLD_SIZE",
        ),
        (vec![("RANK", s("70000")), ("WORLD_SIZE", s("2"))], "RANK"),
        (
            vec![
                ("RANK", s("0")),
                ("WORLD_SIZE", s("2")),
                ("LOCAL_WORLD_SIZE", s("1e9")),
            ],
            "LOCAL_WORLD_SIZE",
        ),
        // Once taken as no time at all.
        (
            vec![
                ("RANK", s("0")),
                ("WORLD_SIZE", s("1")),
                ("FERROCOMM_TIMEOUT_S", s("1e-320")),
            ],
            "FERROCOMM_TIMEOUT_S",
        ),
    ] {
        let (code, out) = run(&vars);
        assert_eq!(code, Some(0), "{vars:?}: the process died: {out}");
        assert!(out.contains(&format!("BADENV {var}:")), "{vars:?}: {out}");
    }
}

#[test]
fn a_store_secret_that_is_not_utf8_is_an_error_not_ignored() {
    // Once ignored: the key file's key was used instead, and the rank joined no job it meant to.
    let secret = OsStr::from_bytes(b"a secret of sixteen bytes or more \xff\xfe");
    let (code, out) = run(&[
        ("RANK", OsStr::new("0")),
        ("WORLD_SIZE", OsStr::new("1")),
        ("FERROCOMM_STORE_SECRET", secret),
    ]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("BADENV FERROCOMM_STORE_SECRET: is not valid UTF-8"),
        "{out}"
    );
    assert!(!out.contains("sixteen"), "the secret was shown: {out}");
}

#[test]
fn a_communicator_larger_than_the_largest_world_is_refused() {
    for size in [1usize << 17, 1 << 40, usize::MAX] {
        let e = Communicator::new(CommOptions {
            rank: Some(0),
            size: Some(size),
            store: Some(MemStore::new()),
            backend: Some(BackendChoice::Host),
            config: Some(Config::default()),
            ..CommOptions::new("huge")
        })
        .err()
        .expect("a communicator of more ranks than accepted");
        assert!(matches!(e, Error::InvalidArgument(_)), "{size}: {e}");
    }
}
