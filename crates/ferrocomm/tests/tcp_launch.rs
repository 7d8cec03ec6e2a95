//! `ferrocomm::launch` with real processes: the ranks find the launcher's store through
//! `connect_from_env`.
//!
//! The ranks are this test binary again, running only the ignored `rank_process` test.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrocomm::bootstrap::{all_gather_bytes, connect_from_env, store_barrier, Store};
use ferrocomm::config::BackendChoice;
use ferrocomm::launch::{launch, LaunchSpec};
use ferrocomm::{
    CallOpts, CommOptions, Communicator, Config, Error, Input, ReduceOp, View, ViewMut,
};

const T: Duration = Duration::from_secs(20);

fn spec(nprocs: usize, role: &str) -> LaunchSpec {
    LaunchSpec {
        nprocs,
        program: std::env::current_exe().unwrap().display().to_string(),
        args: ["--exact", "rank_process", "--ignored", "--nocapture"]
            .map(String::from)
            .to_vec(),
        env: vec![("FERROCOMM_TEST_RANK_ROLE".into(), role.into())],
        prefix_output: true,
        timeout: Some(Duration::from_secs(60)),
    }
}

#[test]
#[ignore = "entry point of the ranks that the other tests launch"]
fn rank_process() {
    let role = std::env::var("FERROCOMM_TEST_RANK_ROLE").expect("started by a launch test");
    let cfg = Config::from_env().unwrap();
    let rank = cfg.launch.rank.unwrap();
    let world = cfg.launch.world_size.unwrap();
    assert!(cfg.launch.store_external, "the launcher hosts the store");
    match role.as_str() {
        "gather" => {
            let s = connect_from_env(&cfg, rank, world).unwrap();
            store_barrier(&*s, "start", world, T).unwrap();
            let mine = format!("rank {rank} pid {}", std::process::id()).into_bytes();
            let all = all_gather_bytes(&*s, "pids", rank, world, &mine, T).unwrap();
            assert_eq!(all.len(), world);
            for (r, v) in all.iter().enumerate() {
                let v = String::from_utf8(v.clone()).unwrap();
                assert!(v.starts_with(&format!("rank {r} pid ")), "{v}");
            }
            // Distinct processes.
            let mut uniq = all.clone();
            uniq.sort();
            uniq.dedup();
            assert_eq!(uniq.len(), world);
            assert!(s.add("sum", rank as i64 + 1).unwrap() >= 1);
            store_barrier(&*s, "end", world, T).unwrap();
            let n = (world * (world + 1) / 2) as i64;
            assert_eq!(s.add("sum", 0).unwrap(), n);
        }
        // Rank 1 fails after the store meeting; the others wait for a key nobody sets.
        "fail" => {
            let s = connect_from_env(&cfg, rank, world).unwrap();
            store_barrier(&*s, "start", world, T).unwrap();
            if rank == 1 {
                std::process::exit(7);
            }
            let _ = s.get("never", Duration::from_secs(60));
            std::process::exit(0);
        }
        // A host communicator's all-reduce in which rank 1 never takes part: the others time
        // out (FERROCOMM_TIMEOUT_S) waiting for it.
        "stall" => {
            let comm = Communicator::new(CommOptions {
                backend: Some(BackendChoice::Host),
                config: Some(cfg),
                ..CommOptions::new("stall")
            })
            .unwrap();
            if rank == 1 {
                std::thread::sleep(Duration::from_secs(60));
            }
            let x = [1.0f32; 16];
            let mut y = [0.0f32; 16];
            let e = comm
                .all_reduce(
                    Input::Buf(View::host(&x)),
                    ViewMut::host(&mut y),
                    ReduceOp::Sum,
                    &CallOpts::default(),
                )
                .unwrap_err();
            assert!(matches!(e, Error::Timeout { missing: 1, .. }), "{e}");
            std::process::exit(1);
        }
        // Rank 0 notes its pid and sets up a host communicator that rank 1 never joins: it
        // waits in set-up, its segment in /dev/shm, until killed.
        // Rank 1 takes part until it would open the segment, and stops there.
        "setup" => {
            if rank == 0 {
                let f = std::env::var("TEST_PID_FILE").unwrap();
                std::fs::write(f, std::process::id().to_string()).unwrap();
            }
            let store = connect_from_env(&cfg, rank, world).unwrap();
            let store: Arc<dyn Store> = if rank == 1 {
                Arc::new(StopAtSegment(store))
            } else {
                store
            };
            let _ = Communicator::new(CommOptions {
                backend: Some(BackendChoice::Host),
                config: Some(cfg),
                store: Some(store),
                ..CommOptions::new("setup")
            });
            std::thread::sleep(Duration::from_secs(60));
        }
        "noop" => {}
        other => panic!("unknown role {other}"),
    }
}

/// A store that never answers a rank asking for the shared segment's name.
struct StopAtSegment(Arc<dyn Store>);

impl Store for StopAtSegment {
    fn set(&self, key: &str, value: &[u8]) -> ferrocomm::Result<()> {
        self.0.set(key, value)
    }
    fn get(&self, key: &str, timeout: Duration) -> ferrocomm::Result<Vec<u8>> {
        if key.ends_with("host/shm_name") {
            std::thread::sleep(Duration::from_secs(60));
        }
        self.0.get(key, timeout)
    }
    fn check(&self, key: &str) -> ferrocomm::Result<bool> {
        self.0.check(key)
    }
    fn add(&self, key: &str, delta: i64) -> ferrocomm::Result<i64> {
        self.0.add(key, delta)
    }
    fn delete(&self, key: &str) -> ferrocomm::Result<bool> {
        self.0.delete(key)
    }
}

/// Runs a launcher in a child process (this binary again), for its stderr.
#[test]
#[ignore = "entry point of the launcher process that a test starts"]
fn launcher_process() {
    let role = std::env::var("FERROCOMM_TEST_LAUNCHED_ROLE").expect("started by a test");
    let mut s = spec(3, &role);
    s.env.push(("FERROCOMM_TIMEOUT_S".into(), "1".into()));
    std::process::exit(launch(&s).unwrap());
}

#[test]
fn the_rank_that_stalled_is_named_not_the_one_that_gave_up() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "launcher_process", "--ignored", "--nocapture"])
        .env("FERROCOMM_TEST_LAUNCHED_ROLE", "stall")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("rank 1 stalled: rank(s) 0, 2 timed out waiting for it")
            || err.contains("rank 1 stalled: rank(s) 0 timed out")
            || err.contains("rank 1 stalled: rank(s) 2 timed out"),
        "{err}"
    );
}

/// This user's segments of process `pid` in /dev/shm.
fn segments_of(pid: u32) -> Vec<PathBuf> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with(&format!("ferrocomm-{pid}-")))
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_segment_left_by_a_rank0_killed_during_set_up_is_removed_by_the_next_launch() {
    let pid_file = std::env::temp_dir().join(format!("ferrocomm-setup-{}", std::process::id()));
    let _ = std::fs::remove_file(&pid_file);
    let mut s = spec(2, "setup");
    s.env
        .push(("TEST_PID_FILE".into(), pid_file.display().to_string()));
    let job = std::thread::spawn(move || launch(&s).unwrap());
    let deadline = Instant::now() + Duration::from_secs(30);
    let (pid, seg) = loop {
        assert!(
            Instant::now() < deadline,
            "rank 0 did not create its segment"
        );
        std::thread::sleep(Duration::from_millis(20));
        let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|p| p.trim().parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(seg) = segments_of(pid).pop() {
            break (pid, seg);
        }
    };
    // SAFETY: kill has no memory-safety preconditions; `pid` is rank 0, our grandchild.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    assert_eq!(job.join().unwrap(), 128 + 9);
    // Rank 0 died before unlinking its segment's name: the segment is left (another launch
    // running meanwhile, of this test binary or another, may already have removed it).
    assert_eq!(launch(&spec(1, "noop")).unwrap(), 0);
    assert!(!seg.exists(), "{} survived the next launch", seg.display());
    let _ = std::fs::remove_file(&pid_file);
}

#[test]
fn ranks_reach_the_launchers_store() {
    assert_eq!(launch(&spec(3, "gather")).unwrap(), 0);
}

#[test]
fn a_rank_failing_after_the_meeting_ends_the_job_with_its_code() {
    let t0 = std::time::Instant::now();
    assert_eq!(launch(&spec(3, "fail")).unwrap(), 7);
    // The bound is the behaviour under test: the others are stopped, not waited for (their
    // gets last 60 s); 20 s leaves room for two loaded cores.
    assert!(t0.elapsed() < Duration::from_secs(20));
}

#[test]
fn an_unstartable_program_is_named() {
    let mut s = spec(2, "gather");
    s.program = "/nonexistent/ferrocomm-rank".into();
    match launch(&s) {
        Err(e @ Error::Io { .. }) => {
            assert!(e.to_string().contains("/nonexistent/ferrocomm-rank"), "{e}")
        }
        other => panic!("expected an I/O error naming the program, got {other:?}"),
    }
    s.nprocs = 0;
    assert!(matches!(launch(&s), Err(Error::InvalidArgument(_))));
}
