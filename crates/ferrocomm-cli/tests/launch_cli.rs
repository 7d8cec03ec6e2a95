//! `ferrocomm launch` with real processes.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

mod cli_support;
use cli_support::{ferrocomm, pids_in, pids_when, run, scratch, start_job};

fn lines(b: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(b)
        .lines()
        .map(str::to_string)
        .collect()
}

/// The pids the `n` ranks of a job write into `dir`: the handshake, waited for with a deadline
/// only a rank that never starts reaches.
fn ranks_started(dir: &Path, n: usize) -> Vec<u32> {
    pids_when(dir, "", n, Instant::now() + Duration::from_secs(60))
}

fn assert_all_gone(pids: &[u32]) {
    // The launcher has killed them by the time it returns; 10 s leaves room for two loaded
    // cores to deliver that.
    cli_support::assert_gone_within(pids, Duration::from_secs(10), "the launcher ended");
}

#[test]
fn every_line_is_prefixed_and_every_rank_runs_once() {
    let o = run(
        "launch -n 3 -- sh -c",
        &["echo hi $RANK/$WORLD_SIZE; echo second $RANK; echo oops $RANK >&2"],
    );
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let out: BTreeSet<String> = lines(&o.stdout).into_iter().collect();
    let want: BTreeSet<String> = (0..3)
        .flat_map(|r| {
            [
                format!("[rank {r}] hi {r}/3"),
                format!("[rank {r}] second {r}"),
            ]
        })
        .collect();
    assert_eq!(out, want);
    assert_eq!(lines(&o.stdout).len(), 6);
    let err: BTreeSet<String> = lines(&o.stderr).into_iter().collect();
    let want: BTreeSet<String> = (0..3).map(|r| format!("[rank {r}] oops {r}")).collect();
    assert_eq!(err, want);
}

#[test]
fn no_prefix_passes_output_through() {
    let o = run("launch -n 2 --no-prefix sh -c", &["echo plain $RANK"]);
    assert_eq!(o.status.code(), Some(0));
    let out: BTreeSet<String> = lines(&o.stdout).into_iter().collect();
    assert_eq!(
        out,
        BTreeSet::from(["plain 0".to_string(), "plain 1".to_string()])
    );
}

#[test]
fn launch_environment_is_set() {
    let o = run(
        "launch -n 2 -- sh -c",
        &[
            "echo $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT \
         $FERROCOMM_STORE_PORT $FERROCOMM_STORE_EXTERNAL",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let mut rows: Vec<Vec<String>> = lines(&o.stdout)
        .iter()
        .map(|l| l.split_whitespace().skip(2).map(str::to_string).collect())
        .collect();
    rows.sort();
    assert_eq!(rows.len(), 2);
    for (r, row) in rows.iter().enumerate() {
        assert_eq!(row.len(), 8, "{row:?}");
        assert_eq!(row[0], r.to_string());
        assert_eq!(row[1], "2");
        assert_eq!(row[2], r.to_string());
        assert_eq!(row[3], "2");
        assert_eq!(row[4], "127.0.0.1");
        assert_eq!(row[7], "1");
    }
    let master: u16 = rows[0][5].parse().unwrap();
    let store: u16 = rows[0][6].parse().unwrap();
    assert!(master > 0 && store > 0 && master != store);
    assert_eq!(rows[1][5], rows[0][5]);
    assert_eq!(rows[1][6], rows[0][6]);
}

#[test]
fn a_failing_rank_stops_the_others() {
    let dir = scratch("launch", "fail");
    // Ranks 0 and 2 start a long sleeper, note its pid and their shell's, then say so through
    // a FIFO; rank 1 fails once it has heard from both (opened read-write, the FIFO never
    // reads an end of file between the two). --timeout ends the job if one never says it.
    let ready = dir.with_extension("ready");
    let _ = std::fs::remove_file(&ready);
    assert!(Command::new("mkfifo")
        .arg(&ready)
        .status()
        .unwrap()
        .success());
    let script = format!(
        "if [ $RANK = 1 ]; then exec 3<>{r}; read a <&3; read b <&3; exit 3; fi; \
         sleep 60 & echo $! > {d}/sleep.$RANK; echo $$ > {d}/sh.$RANK; echo up > {r}; wait",
        d = dir.display(),
        r = ready.display()
    );
    let t0 = Instant::now();
    let o = run("launch -n 3 --timeout 60 -- sh -c", &[&script]);
    let took = t0.elapsed();
    let _ = std::fs::remove_file(&ready);
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    // The bound is the behaviour under test: the others are stopped, not waited for (their
    // sleepers would take 60 s); 15 s leaves room for two loaded cores.
    assert!(took < Duration::from_secs(15), "took {took:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("rank 1 exited with code 3"), "{err}");
    let pids = pids_in(&dir, "");
    assert_eq!(pids.len(), 4, "sleepers and shells of ranks 0 and 2");
    assert_all_gone(&pids);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_rank_killed_by_a_signal_is_reported() {
    let o = run(
        "launch -n 2 -- sh -c",
        &["if [ $RANK = 0 ]; then kill -9 $$; fi; sleep 60"],
    );
    assert_eq!(o.status.code(), Some(128 + 9));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("rank 0 was killed by signal 9"), "{err}");
}

#[test]
fn sigterm_to_the_launcher_reaches_the_ranks() {
    let dir = scratch("launch", "term");
    let script = "sleep 60 & echo $! > \"$DIR/sleep.$RANK\"; wait";
    let mut child = start_job(2, &["sh", "-c", script], &dir, Stdio::piped());
    let pids = ranks_started(&dir, 2);
    let st = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let t0 = Instant::now();
    let code = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s.code();
        }
        // The bound is the behaviour under test: the launcher stops at the signal, not when
        // its ranks' 60 s sleepers end (10 s leaves room for two loaded cores).
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "launcher did not stop"
        );
        // The pause between two looks at the launcher (a wait for its exit, with the deadline
        // above).
        thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(code, Some(128 + 15));
    assert_all_gone(&pids);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn torchrun_spellings_are_accepted() {
    let show = "echo $WORLD_SIZE $MASTER_ADDR $MASTER_PORT";
    for (n, addr, port) in [
        ("--nproc_per_node", "--master_addr", "--master_port"),
        ("--nproc-per-node", "--master-addr", "--master-port"),
    ] {
        let o = run(
            "launch",
            &[
                n,
                "2",
                addr,
                "localhost",
                port,
                "29517",
                "--",
                "sh",
                "-c",
                show,
            ],
        );
        assert_eq!(o.status.code(), Some(0), "{n}: {o:?}");
        let rows: Vec<String> = lines(&o.stdout)
            .iter()
            .map(|l| l.split_whitespace().skip(2).collect::<Vec<_>>().join(" "))
            .collect();
        assert_eq!(rows, ["2 localhost 29517", "2 localhost 29517"], "{n}");
    }
    // --nproc_per_node=N, as torchrun users write it.
    let o = run("launch --nproc_per_node=3 -- sh -c", &[show]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert_eq!(lines(&o.stdout).len(), 3);
    for (flag, value, says) in [
        ("--master-port", "0", "1 to 65535"),
        ("--master_port", "70000", "70000"),
        ("--master-addr", "", "empty"),
    ] {
        let o = run("launch -n 1", &[flag, value, "--", "true"]);
        assert_eq!(o.status.code(), Some(2), "{flag} {value}: {o:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(says), "{flag} {value}: {err}");
    }
}

#[test]
fn bad_input_is_explained() {
    let o = run("launch -n 0 true", &[]);
    assert_ne!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stderr).contains("at least 1"));

    let o = run("launch -n 2", &[]);
    assert_ne!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stderr).contains("PROGRAM"));

    let o = run("launch -n 2 -- /nonexistent/ferrocomm-no-such-program", &[]);
    assert_ne!(o.status.code(), Some(0));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("/nonexistent/ferrocomm-no-such-program"),
        "{err}"
    );
}

#[test]
fn timeout_stops_the_job() {
    let t0 = Instant::now();
    let o = run("launch -n 2 --timeout 0.5 -- sleep 60", &[]);
    assert_eq!(o.status.code(), Some(124));
    // The bound is the behaviour under test: the job is stopped at its timeout, long before
    // its ranks' 60 s sleep ends (10 s leaves room for two loaded cores).
    assert!(t0.elapsed() < Duration::from_secs(10));
}

/// The library's first example, as README has a user run it: built with cargo, started by
/// `ferrocomm launch`.
#[test]
fn the_host_all_reduce_example_runs_under_the_launcher() {
    // The example belongs to the library crate: cargo builds it into this target directory
    // (already built and fresh when the whole workspace's tests were built).
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ferrocomm/Cargo.toml");
    let release = Path::new(env!("CARGO_BIN_EXE_ferrocomm"))
        .parent()
        .is_some_and(|d| d.ends_with("release"));
    let mut build = Command::new(cargo);
    build
        .args(["build", "--example", "host_all_reduce", "--manifest-path"])
        .arg(&manifest);
    if release {
        build.arg("--release");
    }
    let b = build.output().unwrap();
    assert!(b.status.success(), "{}", String::from_utf8_lossy(&b.stderr));
    // target/debug/ferrocomm -> target/debug/examples/host_all_reduce
    let example = Path::new(env!("CARGO_BIN_EXE_ferrocomm"))
        .with_file_name("examples")
        .join("host_all_reduce");
    let o = ferrocomm()
        .args(["launch", "-n", "3", "--"])
        .arg(&example)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let mut got = lines(&o.stdout);
    got.sort();
    assert_eq!(
        got,
        (0..3)
            .map(|r| format!(
                "[rank {r}] rank {r} of 3: all_reduce sum of 1000 floats = 6 (0 wrong)"
            ))
            .collect::<Vec<_>>()
    );
    // Started alone it says how to start it.
    let o = Command::new(&example).env_remove("RANK").output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("ferrocomm launch"));
}

#[test]
fn sigkill_to_the_launcher_takes_the_ranks_with_it() {
    let dir = scratch("launch", "kill");
    // Each rank is the sleeping process itself (exec), as a Python rank would be.
    let script = "echo $$ > \"$DIR/rank.$RANK\"; exec sleep 60";
    let mut child = start_job(3, &["sh", "-c", script], &dir, Stdio::null());
    let pids = ranks_started(&dir, 3);
    child.kill().unwrap();
    child.wait().unwrap();
    assert_all_gone(&pids);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn timeouts_too_long_for_a_duration_are_refused_without_a_panic() {
    for t in ["1e30", "1e19", "inf", "nan", "-1"] {
        let o = run("launch -n 1 --timeout", &[t, "--", "true"]);
        let err = String::from_utf8_lossy(&o.stderr);
        // An error exit (not 0, not a panic's 101) that names the option.
        assert!(
            !matches!(o.status.code(), Some(0) | Some(101) | None),
            "{t}: {err}"
        );
        assert!(
            err.contains("timeout") && !err.contains("panicked"),
            "{t}: {err}"
        );
    }
}

#[test]
fn every_job_gets_its_own_store_secret() {
    let secret = || {
        let o = run("launch -n 2 -- sh -c", &["echo $FERROCOMM_STORE_SECRET"]);
        assert_eq!(o.status.code(), Some(0), "{o:?}");
        let rows: BTreeSet<String> = lines(&o.stdout)
            .iter()
            .map(|l| l.split_whitespace().last().unwrap_or("").to_string())
            .collect();
        assert_eq!(rows.len(), 1, "ranks of one job share it: {rows:?}");
        rows.into_iter().next().unwrap()
    };
    let (a, b) = (secret(), secret());
    assert_eq!(a.len(), 64);
    assert!(a.bytes().all(|c| c.is_ascii_hexdigit()), "{a}");
    assert_ne!(a, b);
}
