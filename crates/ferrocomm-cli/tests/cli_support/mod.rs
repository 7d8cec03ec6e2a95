//! Shared by the command-line tool's integration tests: the binary as a command, fresh scratch
//! directories, and the processes a launched job leaves (pid files waited for with a deadline,
//! processes checked gone through /proc).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// `ferrocomm` as a command, without a caller's rank variables or tuning table (a test run
/// inside a launched job must not join it).
pub fn ferrocomm() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferrocomm"));
    for v in [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "FERROCOMM_BACKEND",
        "FERROCOMM_TUNING",
    ] {
        c.env_remove(v);
    }
    c
}

/// `ferrocomm` with the words of `line` and then `extra` (a shell script, a path), run to the
/// end.
pub fn run(line: &str, extra: &[&str]) -> Output {
    ferrocomm()
        .args(words(line))
        .args(extra)
        .output()
        .expect("run ferrocomm")
}

/// `ferrocomm launch -n N -- COMMAND...` started in the background, `DIR` set to `dir` for
/// its ranks (where they write their pid files), standard output dropped, standard error to
/// `stderr`.
pub fn start_job(n: usize, command: &[&str], dir: &Path, stderr: Stdio) -> Child {
    ferrocomm()
        .args(["launch", "-n", &n.to_string(), "--"])
        .args(command)
        .env("DIR", dir)
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("start ferrocomm launch")
}

/// The words of `line` as arguments (`"bench all_reduce -g 2"`).
pub fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

/// Standard output and standard error as text.
pub fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// An empty directory of this test process, `ferrocomm-<test>-<name>-<pid>` under the system's
/// temporary directory (what an earlier run left there is removed).
pub fn scratch(test: &str, name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ferrocomm-{test}-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Whether `pid` is gone (absent, or a zombie waiting for its reaper).
pub fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state follows the parenthesised command name.
        Ok(s) => s
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
    }
}

/// The pids written into the files of `dir` whose names start with `prefix`.
pub fn pids_in(dir: &Path, prefix: &str) -> Vec<u32> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        // A file being written may still be empty.
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

/// [`pids_in`] once there are `n` of them, waited for until `deadline` (which only a process
/// that never starts reaches).
pub fn pids_when(dir: &Path, prefix: &str, n: usize, deadline: Instant) -> Vec<u32> {
    loop {
        let pids = pids_in(dir, prefix);
        if pids.len() >= n {
            return pids;
        }
        assert!(
            Instant::now() < deadline,
            "{n} '{prefix}' files did not appear in {}",
            dir.display()
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until every process of `pids` is gone, failing after `limit` (the bound the test
/// holds the launcher to) with the ones left.
pub fn assert_gone_within(pids: &[u32], limit: Duration, after: &str) {
    let t0 = Instant::now();
    while !pids.iter().all(|&p| gone(p)) {
        let alive: Vec<u32> = pids.iter().copied().filter(|&p| !gone(p)).collect();
        assert!(
            t0.elapsed() < limit,
            "still running {limit:?} after {after}: {alive:?}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}
