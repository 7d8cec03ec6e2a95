//! `ferrocomm::launch` with real processes: the ranks find the launcher's store through
//! `connect_from_env`.
//!
//! The ranks are this test binary again, running only the ignored `rank_process` test.

use std::time::Duration;

use ferrocomm::bootstrap::{all_gather_bytes, connect_from_env, store_barrier};
use ferrocomm::launch::{launch, LaunchSpec};
use ferrocomm::{Config, Error};

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
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn ranks_reach_the_launchers_store() {
    assert_eq!(launch(&spec(3, "gather")).unwrap(), 0);
}

#[test]
fn a_rank_failing_after_the_meeting_ends_the_job_with_its_code() {
    let t0 = std::time::Instant::now();
    assert_eq!(launch(&spec(3, "fail")).unwrap(), 7);
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
