//! `ferrocomm trace DIR` on the flight-recorder dumps of three ranks (threads of this test,
//! on the host backend): a rank that skips a call, and a rank that dies before dumping.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use ferrocomm::bootstrap::{MemStore, Store};
use ferrocomm::config::BackendChoice;
use ferrocomm::{CallOpts, CommOptions, Communicator, Config, Input, ReduceOp, View, ViewMut};

fn trace(dir: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ferrocomm"))
        .arg("trace")
        .arg(dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// Three ranks as threads, each running `f` with its communicator; dumps go to a fresh dir.
fn ranks(tag: &str, f: impl Fn(&Communicator) + Sync) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("ferrocomm-trace-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store: Arc<dyn Store> = MemStore::new();
    let cfg = Config {
        timeout: Duration::from_millis(1500),
        trace_dir: Some(dir.clone()),
        ..Config::default()
    };
    std::thread::scope(|s| {
        for rank in 0..3 {
            let (store, cfg, f) = (store.clone(), cfg.clone(), &f);
            s.spawn(move || {
                let comm = Communicator::new(CommOptions {
                    rank: Some(rank),
                    size: Some(3),
                    store: Some(store),
                    backend: Some(BackendChoice::Host),
                    config: Some(cfg),
                    ..CommOptions::new(format!("trace-{tag}"))
                })
                .unwrap();
                f(&comm);
            });
        }
    });
    dir
}

fn sum(comm: &Communicator, n: usize) -> ferrocomm::Result<()> {
    let x = vec![1.0f32; n];
    let mut y = vec![0.0f32; n];
    comm.all_reduce(
        Input::Buf(View::host(&x)),
        ViewMut::host(&mut y),
        ReduceOp::Sum,
        &CallOpts::default(),
    )
}

#[test]
fn a_rank_that_skips_a_call_is_named_with_the_call() {
    // Ranks 0 and 2 make four all-reduces; rank 1 skips the third: at its third call the others
    // are at their third too (same description), at the fourth they wait for it and time out.
    let dir = ranks("skip", |comm| {
        for i in 0..4 {
            if comm.rank() == 1 && i == 2 {
                continue;
            }
            let r = sum(comm, 256);
            if comm.rank() == 1 || i < 3 {
                r.unwrap();
            } else {
                assert!(r.is_err());
            }
        }
        if comm.rank() == 1 {
            comm.dump_flight_recorder(None).unwrap();
        }
    });
    let report = trace(&dir);
    assert!(report.contains("3 of 3 ranks dumped"), "{report}");
    assert!(report.contains("first divergence at call #4"), "{report}");
    assert!(
        report.contains("rank 1 never called it: its last call is #3"),
        "{report}"
    );
    assert!(
        report.contains("rank 1 is missing from call #4"),
        "{report}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn ranks_that_agree_have_no_divergence() {
    let dir = ranks("agree", |comm| {
        sum(comm, 64).unwrap();
        comm.barrier(&CallOpts::default()).unwrap();
        comm.dump_flight_recorder(None).unwrap();
    });
    let report = trace(&dir);
    assert!(
        report.contains("no divergence: every rank made calls #1 to #2 and finished them"),
        "{report}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
