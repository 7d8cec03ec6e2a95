//! A peer killed with SIGKILL mid-call: the survivors' calls fail within a second naming it,
//! their flight recorders are dumped, and the analysis of the dumps names it. Also a rank in a
//! PID namespace of its own: alive, it is never taken for dead; killed, it is named as fast.
//!
//! This test binary re-executes itself as the ranks (processes meeting through a TCP store);
//! each rank reports on stdout what the parent needs.

mod host_support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use ferrocomm::bootstrap::TcpStoreServer;
use ferrocomm::{CallOpts, Error, Input, ReduceOp, View, ViewMut};
use host_support::*;

const CHILD: &str = "FERROCOMM_PEER_DEATH_CHILD";

/// CLOCK_MONOTONIC in nanoseconds: one clock for every process of the host.
fn mono_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

fn trace_dir(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ferrocomm-death-{tag}-{}", std::process::id()))
}

/// Starts rank `r` of `n` (under `wrap`, a command prefix, when given), its stdout piped.
fn spawn_rank(r: usize, n: usize, scenario: &str, port: u16, dir: &Path, wrap: &[&str]) -> Child {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = match wrap.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    use std::os::unix::process::CommandExt;
    cmd.args([
        "--ignored",
        "--exact",
        "death_rank",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD, scenario)
    .env("TEST_STORE_PORT", port.to_string())
    .env("TEST_TRACE_DIR", dir)
    .env("RANK", r.to_string())
    .env("WORLD_SIZE", n.to_string())
    .stdout(Stdio::piped())
    // Its own process group: the parent can kill it with whatever it forked.
    .process_group(0);
    cmd.spawn().unwrap()
}

/// Reads `out` until a line holding `tag` (the test harness may have printed the test's name
/// before it on the same line); returns the rest of the line.
fn line_after(out: &mut BufReader<ChildStdout>, tag: &str, deadline: Instant) -> String {
    let mut l = String::new();
    loop {
        assert!(Instant::now() < deadline, "no '{tag}' line in time");
        l.clear();
        let n = out.read_line(&mut l).unwrap();
        assert!(n > 0, "the rank's output ended before '{tag}'");
        if let Some(at) = l.find(tag) {
            return l[at + tag.len()..].trim().to_string();
        }
    }
}

fn kill_group(c: &Child) {
    let pg = rustix::process::Pid::from_raw(c.id() as i32).unwrap();
    let _ = rustix::process::kill_process_group(pg, rustix::process::Signal::KILL);
}

/// One rank, in a child process (run by the tests below, not by itself).
#[test]
#[ignore = "entry point of the rank processes that the other tests start"]
fn death_rank() {
    let scenario = std::env::var(CHILD).expect("started by a parent test");
    let (rank, n, store) = child_rank_store();
    let mut cfg = config(8192, Duration::from_secs(30));
    cfg.trace_dir = Some(std::env::var("TEST_TRACE_DIR").unwrap().into());
    let comm = communicator(store, "death", rank, n, &cfg);
    let o = CallOpts::default();
    let x = vec![rank as f32 + 1.0; 1000];
    let mut y = vec![0.0f32; 1000];
    let sum = |comm: &ferrocomm::Communicator, y: &mut [f32]| {
        comm.all_reduce(
            Input::Buf(View::host(&x)),
            ViewMut::host(y),
            ReduceOp::Sum,
            &o,
        )
    };
    // Rank 1 joins the first call late (alive meanwhile): nobody may take it for dead.
    if scenario == "pidns" && rank == 1 {
        std::thread::sleep(Duration::from_millis(800));
    }
    sum(&comm, &mut y).unwrap();
    let want = (n * (n + 1) / 2) as f32;
    assert!(y.iter().all(|&v| v == want), "{}", y[0]);
    if rank == 1 {
        println!("PARKED");
        // Parked until the parent kills it.
        let _ = std::io::stdin().read_line(&mut String::new());
        std::thread::sleep(Duration::from_secs(60));
        return;
    }
    println!("CALLING");
    let e = sum(&comm, &mut y).unwrap_err();
    println!("FAILED {} {e}", mono_ns());
    assert!(matches!(e, Error::PeerFailed { peer: 1, .. }), "{e}");
    // Later calls fail at once, naming it too.
    let e = comm.barrier(&o).unwrap_err();
    assert!(matches!(e, Error::PeerFailed { peer: 1, .. }), "{e}");
    println!("DONE");
}

/// Runs `scenario` with `n` ranks, rank 1 under `wrap`; kills rank 1 once the others call;
/// returns each survivor's time from the kill to its error, and the trace directory.
fn kill_rank_1(n: usize, scenario: &str, wrap: &[&str]) -> (Vec<Duration>, PathBuf) {
    let server = TcpStoreServer::bind("127.0.0.1", 0, &key()).unwrap();
    let dir = trace_dir(scenario);
    let _ = std::fs::remove_dir_all(&dir);
    let mut kids: Vec<Child> = (0..n)
        .map(|r| {
            let w: &[&str] = if r == 1 { wrap } else { &[] };
            spawn_rank(r, n, scenario, server.port(), &dir, w)
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut outs: Vec<BufReader<ChildStdout>> = kids
        .iter_mut()
        .map(|k| BufReader::new(k.stdout.take().unwrap()))
        .collect();
    line_after(&mut outs[1], "PARKED", deadline);
    for (r, out) in outs.iter_mut().enumerate() {
        if r != 1 {
            line_after(out, "CALLING", deadline);
        }
    }
    kill_group(&kids[1]);
    let killed = mono_ns();
    let mut took = Vec::new();
    for (r, out) in outs.iter_mut().enumerate() {
        if r == 1 {
            continue;
        }
        let failed = line_after(out, "FAILED", deadline);
        let t: u64 = failed.split_whitespace().next().unwrap().parse().unwrap();
        assert!(failed.contains("rank 1 failed"), "rank {r}: {failed}");
        took.push(Duration::from_nanos(t.saturating_sub(killed)));
        line_after(out, "DONE", deadline);
    }
    for (r, k) in kids.iter_mut().enumerate() {
        let st = k.wait().unwrap();
        if r != 1 {
            assert_eq!(st.code(), Some(0), "rank {r}");
        }
    }
    (took, dir)
}

#[test]
fn a_rank_killed_mid_call_is_named_by_every_survivor_within_a_second() {
    let (took, dir) = kill_rank_1(3, "kill", &[]);
    for t in &took {
        assert!(*t < Duration::from_secs(1), "SIGKILL to error took {t:?}");
    }
    // Each survivor dumped its flight recorder; the analysis names the dead rank.
    for r in [0, 2] {
        assert!(
            dir.join(format!("ferrocomm_trace_rank_{r}")).exists(),
            "rank {r}'s dump"
        );
    }
    assert!(!dir.join("ferrocomm_trace_rank_1").exists());
    let report = ferrocomm::trace::analyze(&dir).unwrap();
    assert!(report.contains("no dump from rank 1"), "{report}");
    assert!(
        report.contains("rank 1 is missing from call #2"),
        "{report}"
    );
    assert!(
        report.contains("saw the communicator fail: rank 1"),
        "{report}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_rank_in_its_own_pid_namespace_is_alive_until_killed() {
    // Root, or a user namespace that maps this user to root, can make a PID namespace.
    let mut wrap = vec!["unshare", "--pid", "--fork"];
    if !rustix::process::getuid().is_root() {
        wrap.push("--map-root-user");
    }
    let probe = Command::new(wrap[0]).args(&wrap[1..]).arg("true").status();
    assert!(
        probe.is_ok_and(|s| s.success()),
        "`{}` cannot make a PID namespace here",
        wrap.join(" ")
    );
    let (took, dir) = kill_rank_1(2, "pidns", &wrap);
    assert!(
        took[0] < Duration::from_secs(1),
        "SIGKILL to error took {:?}",
        took[0]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
