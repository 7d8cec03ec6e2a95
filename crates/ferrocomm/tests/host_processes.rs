//! Host backend across real processes: this test binary re-executes itself as the ranks, which
//! meet through a TCP store. Covers correct results, a rank that dies mid-run, and the shared
//! memory name being gone from /dev/shm once every rank has mapped it.

mod host_support;

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use ferrocomm::bootstrap::{Store, TcpStore, TcpStoreServer};
use ferrocomm::{CallOpts, DeviceCounts, Error, Input, ReduceOp, View, ViewMut};
use host_support::*;

const CHILD: &str = "FERROCOMM_HOST_TEST_CHILD";

fn spawn(n: usize, scenario: &str, port: u16) -> Vec<Child> {
    (0..n)
        .map(|r| {
            Command::new(std::env::current_exe().unwrap())
                .args([
                    "--ignored",
                    "--exact",
                    "child_rank",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD, scenario)
                .env("TEST_STORE_PORT", port.to_string())
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", n.to_string())
                .spawn()
                .unwrap()
        })
        .collect()
}

/// One rank, in a child process (run by the tests below, not by itself).
#[test]
#[ignore = "entry point of the rank processes that the other tests start"]
fn child_rank() {
    let scenario = std::env::var(CHILD).expect("started by a parent test");
    let (rank, n, store) = child_rank_store();
    let cfg = config(8192, Duration::from_secs(20));
    let comm = communicator(store.clone(), "procs", rank, n, &cfg);
    let o = CallOpts::default();
    let count = 5000;
    let x: Vec<f32> = (0..count)
        .map(|i| (i % 97) as f32 * 0.25 + rank as f32)
        .collect();
    let mut y = vec![f32::NAN; count];
    all_reduce_sum(&comm, &x, &mut y, &o).unwrap();
    let ranks_sum = (n * (n - 1) / 2) as f32;
    for (i, v) in y.iter().enumerate() {
        assert_eq!(
            *v,
            (i % 97) as f32 * 0.25 * n as f32 + ranks_sum,
            "element {i}"
        );
    }
    match scenario.as_str() {
        "collectives" => {
            let mut g = vec![f32::NAN; n * count];
            comm.all_gather(Input::Buf(View::host(&x)), ViewMut::host(&mut g), &o)
                .unwrap();
            for r in 0..n {
                assert_eq!(g[r * count + 1], 0.25 + r as f32);
            }
            // Mixture-of-experts dispatch: rank r sends 1 + 4 * ((r + p) % 3) elements to p.
            let part = |s: usize, p: usize| 1 + 4 * ((s + p) % 3);
            let (cap, me) = (9, rank);
            let sends: Vec<u64> = (0..n).map(|p| part(me, p) as u64).collect();
            let total: usize = (0..n).map(|p| part(me, p)).sum();
            let x: Vec<f32> = (0..total).map(|i| (me * 1000 + i) as f32).collect();
            let mut out = vec![f32::NAN; n * cap];
            let mut recv = vec![u64::MAX; n];
            comm.all_to_all_v_dynamic(
                View::host(&x),
                ViewMut::host(&mut out),
                DeviceCounts {
                    send: View::host(&sends),
                    recv: ViewMut::host(&mut recv),
                    capacity: cap,
                    unit: 1,
                },
                &o,
            )
            .unwrap();
            for s in 0..n {
                assert_eq!(recv[s], part(s, me) as u64, "count from {s}");
                let off: usize = (0..me).map(|p| part(s, p)).sum();
                for i in 0..cap {
                    let v = out[s * cap + i];
                    if i < part(s, me) {
                        assert_eq!(v, (s * 1000 + off + i) as f32, "from {s}, element {i}");
                    } else {
                        assert!(v.is_nan(), "from {s}, element {i} written");
                    }
                }
            }
            comm.barrier(&o).unwrap();
        }
        "die" => {
            if rank == 1 {
                std::process::exit(3);
            }
            let t0 = Instant::now();
            let e = comm
                .all_reduce(
                    Input::Buf(View::host(&x)),
                    ViewMut::host(&mut y),
                    ReduceOp::Sum,
                    &o,
                )
                .unwrap_err();
            println!("rank {rank}: {e} after {:?}", t0.elapsed());
            assert!(
                matches!(
                    e,
                    Error::PeerFailed { peer: 1, .. } | Error::Timeout { missing: 1, .. }
                ),
                "{e}"
            );
            // Dead-peer detection answers well before the 20 s timeout (the bound is the
            // behaviour under test; half the timeout leaves room for two loaded cores).
            assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
        }
        other => panic!("unknown scenario {other}"),
    }
    // Tells the parent that this rank really ran to the end.
    store.set(&format!("test/done/{rank}"), b"1").unwrap();
}

/// Which ranks reported that they ran to the end.
fn finished(port: u16, n: usize) -> Vec<bool> {
    let s = TcpStore::connect("127.0.0.1", port, &key(), Duration::from_secs(5)).unwrap();
    (0..n)
        .map(|r| s.check(&format!("test/done/{r}")).unwrap())
        .collect()
}

fn shm_names_of(pid: u32) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&format!("ferrocomm-{pid}-")))
                .collect()
        })
        .unwrap_or_default()
}

fn wait_all(children: Vec<Child>, deadline: Duration) -> Vec<Option<i32>> {
    let t0 = Instant::now();
    let mut children: Vec<(Child, Option<Option<i32>>)> =
        children.into_iter().map(|c| (c, None)).collect();
    while children.iter().any(|(_, s)| s.is_none()) {
        for (c, s) in children.iter_mut().filter(|(_, s)| s.is_none()) {
            if let Some(st) = c.try_wait().unwrap() {
                *s = Some(st.code());
            }
        }
        if t0.elapsed() > deadline {
            for (c, _) in children.iter_mut() {
                let _ = c.kill();
            }
            panic!("rank processes still running after {deadline:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    children.into_iter().map(|(_, s)| s.unwrap()).collect()
}

#[test]
fn ranks_as_processes_get_correct_results_and_leave_nothing_behind() {
    let server = TcpStoreServer::bind("127.0.0.1", 0, &key()).unwrap();
    let children = spawn(3, "collectives", server.port());
    let rank0 = children[0].id();
    let codes = wait_all(children, Duration::from_secs(60));
    assert_eq!(codes, vec![Some(0); 3]);
    assert_eq!(finished(server.port(), 3), vec![true; 3]);
    assert!(
        shm_names_of(rank0).is_empty(),
        "left in /dev/shm: {:?}",
        shm_names_of(rank0)
    );
}

#[test]
fn a_rank_that_dies_is_reported_without_hanging() {
    let server = TcpStoreServer::bind("127.0.0.1", 0, &key()).unwrap();
    let children = spawn(3, "die", server.port());
    // The dead child stays a zombie until reaped here; the others must notice it anyway.
    let codes = wait_all(children, Duration::from_secs(60));
    assert_eq!(codes, vec![Some(0), Some(3), Some(0)]);
    assert_eq!(finished(server.port(), 3), vec![true, false, true]);
}
