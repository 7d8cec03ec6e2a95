//! Host backend failures: a rank that never arrives, ranks that disagree on the call, and a
//! process that dies mid-run. Nothing may hang; every error names the rank at fault.

mod host_support;
mod thread_state;

use std::time::{Duration, Instant};

use ferrocomm::{
    CallOpts, Communicator, Config, DataType, Error, Input, ReduceOp, Splits, View, ViewMut,
};
use host_support::*;

/// Runs `f` on every rank of `n` but `absent`, which stays alive without calling anything until
/// the others have returned: the peer their timeouts name. `None` for the absent rank.
fn with_rank_absent<R: Send>(
    n: usize,
    cfg: &Config,
    absent: usize,
    f: impl Fn(&Communicator) -> R + Sync,
) -> Vec<Option<R>> {
    let (done, wait) = std::sync::mpsc::channel::<()>();
    let wait = std::sync::Mutex::new(wait);
    run_ranks(n, cfg, |comm| {
        if comm.rank() == absent {
            for _ in 1..n {
                let _ = wait.lock().unwrap().recv_timeout(Duration::from_secs(20));
            }
            return None;
        }
        let r = f(&comm);
        done.send(()).unwrap();
        Some(r)
    })
}

/// Rank 0's result of [`with_rank_absent`] (rank 1 absent): a timeout after `after`, naming
/// rank 1 and `after`, well before the communicator's own timeout of a minute.
fn expect_timeout_naming_rank_1(results: Vec<Option<(Error, Duration)>>, after: Duration) {
    let (e, took) = results.into_iter().next().unwrap().unwrap();
    assert!(
        matches!(e, Error::Timeout { missing: 1, timeout, .. } if timeout == after),
        "{e}"
    );
    // The bounds are the behaviour under test: not before `after`, and long before the
    // communicator's 60 s (30 s leaves room for two loaded cores).
    assert!(
        took >= after && took < Duration::from_secs(30),
        "waited {took:?}"
    );
}

/// An all-reduce of 100 floats with `opts`: how long it took and its error.
fn lone_all_reduce(comm: &Communicator, opts: &CallOpts) -> (Error, Duration) {
    let t0 = Instant::now();
    let x = vec![1.0f32; 100];
    let mut y = vec![0.0f32; 100];
    let e = comm
        .all_reduce(
            Input::Buf(View::host(&x)),
            ViewMut::host(&mut y),
            ReduceOp::Sum,
            opts,
        )
        .unwrap_err();
    (e, t0.elapsed())
}

#[test]
fn ranks_that_never_join_are_named_when_creation_times_out() {
    // Ranks 0 and 2 of 4 start; 1 and 3 never do.
    let timeout = Duration::from_millis(300);
    let store: std::sync::Arc<dyn ferrocomm::bootstrap::Store> =
        ferrocomm::bootstrap::MemStore::new();
    let name = unique_name("join");
    let cfg = config(4096, timeout);
    let errs: Vec<Error> = std::thread::scope(|s| {
        let hs: Vec<_> = [0, 2]
            .map(|r| {
                let (store, name, cfg) = (store.clone(), &name, &cfg);
                s.spawn(move || {
                    ferrocomm::Communicator::new(ferrocomm::CommOptions {
                        name: name.clone(),
                        rank: Some(r),
                        size: Some(4),
                        store: Some(store),
                        backend: Some(ferrocomm::config::BackendChoice::Host),
                        config: Some(cfg.clone()),
                        ..Default::default()
                    })
                    .err()
                    .expect("created without ranks 1 and 3")
                })
            })
            .into_iter()
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (e, r) in errs.iter().zip([0, 2]) {
        match e {
            Error::RendezvousTimeout {
                rank,
                world,
                missing,
                ..
            } => assert_eq!(
                (*rank, *world, missing.as_slice()),
                (r, 4, &[1, 3][..]),
                "{e}"
            ),
            other => panic!("rank {r}: {other}"),
        }
        let text = e.to_string();
        assert!(
            text.contains("waiting for ranks 1 and 3: 2 of 4 ranks never joined"),
            "{text}"
        );
    }
}

#[test]
fn a_rank_that_never_arrives_is_named_in_the_timeout() {
    let timeout = Duration::from_millis(300);
    let results = with_rank_absent(3, &config(4096, timeout), 2, |comm| {
        let (e, took) = lone_all_reduce(comm, &CallOpts::default());
        // A second call fails at once: the communicator is unusable after a timeout.
        let again = comm.barrier(&CallOpts::default()).unwrap_err();
        (e, took, again)
    });
    for (r, res) in results.into_iter().enumerate().take(2) {
        let (e, took, again) = res.unwrap();
        match e {
            Error::Timeout {
                collective,
                rank,
                missing,
                ..
            } => {
                assert_eq!((collective, rank, missing), ("all_reduce", r, 2), "{e}");
            }
            other => panic!("rank {r}: expected a timeout, got {other}"),
        }
        // The bounds are the behaviour under test: the timeout fires, not before it is due
        // and without hanging (30 s leaves room for two loaded cores).
        assert!(
            took >= timeout && took < Duration::from_secs(30),
            "rank {r} waited {took:?}"
        );
        assert!(
            matches!(again, Error::PeerFailed { peer: 2, .. }),
            "{again}"
        );
    }
}

/// A call's own timeout bounds its waits instead of the communicator's: a rank that never
/// arrives is named after 300 ms although the communicator would wait a minute, and the error
/// says 300 ms.
#[test]
fn a_call_timeout_shorter_than_the_communicators_is_the_one_that_counts() {
    let call = Duration::from_millis(300);
    let results = with_rank_absent(2, &config(4096, Duration::from_secs(60)), 1, |comm| {
        lone_all_reduce(comm, &CallOpts::default().with_timeout(call))
    });
    expect_timeout_naming_rank_1(results, call);
}

/// `set_timeout` moves the timeout of later calls both ways: past the creation timeout (a peer
/// arriving after it still meets this rank) and below it (a peer that never arrives is named
/// sooner). Zero is refused.
#[test]
fn set_timeout_lengthens_and_shortens_later_calls() {
    let created = Duration::from_millis(300);
    let late = Duration::from_millis(1200);
    // Rank 0 tells rank 1 its thread and when it enters the all-reduce.
    let (entering, entered) = std::sync::mpsc::channel::<(i32, Instant)>();
    let entered = std::sync::Mutex::new(entered);
    let results = run_ranks(2, &config(4096, created), |comm| {
        assert_eq!(comm.timeout(), created);
        assert!(comm.set_timeout(Duration::ZERO).is_err());
        comm.set_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!(comm.timeout(), Duration::from_secs(30));
        // A split starts with the parent's current timeout.
        let sub = comm.split(&[1, 0], "sub").unwrap().unwrap();
        assert_eq!(sub.timeout(), Duration::from_secs(30));
        let x = vec![comm.rank() as f32 + 1.0; 64];
        let mut y = vec![0.0f32; 64];
        if comm.rank() == 0 {
            entering.send((thread_state::id(), Instant::now())).unwrap();
        } else {
            let (tid, t0) = entered
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(60))
                .expect("rank 0 about to call");
            thread_state::wait_until_asleep(tid, "rank 0 waiting in its all_reduce");
            // The lateness is the behaviour under test: rank 1 arrives four creation timeouts
            // after rank 0 began to wait for it.
            std::thread::sleep(late.saturating_sub(t0.elapsed()));
        }
        let t0 = Instant::now();
        comm.all_reduce(
            Input::Buf(View::host(&x)),
            ViewMut::host(&mut y),
            ReduceOp::Sum,
            &CallOpts::default(),
        )
        .map(|_| (y[0], t0.elapsed()))
    });
    let (sum, waited) = results[0].as_ref().unwrap();
    assert_eq!(*sum, 3.0);
    // Rank 0 really waited past the creation timeout.
    assert!(*waited > created, "rank 0 waited {waited:?}");
    assert_eq!(results[1].as_ref().unwrap().0, 3.0);

    let short = Duration::from_millis(200);
    let results = with_rank_absent(2, &config(4096, Duration::from_secs(60)), 1, |comm| {
        comm.set_timeout(short).unwrap();
        lone_all_reduce(comm, &CallOpts::default())
    });
    expect_timeout_naming_rank_1(results, short);
}

/// `abort` tells a peer waiting on this rank at once (not after its 60 s timeout), and every
/// later call of the aborted communicator fails with `Aborted`.
#[test]
fn abort_fails_a_waiting_peer_at_once() {
    let (waiting, waiter) = std::sync::mpsc::channel::<i32>();
    let waiter = std::sync::Mutex::new(waiter);
    let results = run_ranks(2, &config(4096, Duration::from_secs(60)), |comm| {
        if comm.rank() == 0 {
            let tid = waiter
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(60))
                .expect("rank 1 about to call");
            thread_state::wait_until_asleep(tid, "rank 1 waiting in its all_reduce");
            comm.abort();
            let again = comm.barrier(&CallOpts::default()).unwrap_err();
            return (again, Duration::ZERO);
        }
        waiting.send(thread_state::id()).unwrap();
        lone_all_reduce(&comm, &CallOpts::default())
    });
    let (again, _) = &results[0];
    assert!(matches!(again, Error::Aborted { .. }), "{again}");
    let (e, took) = &results[1];
    assert!(
        matches!(
            e,
            Error::PeerFailed {
                peer: 0,
                rank: 1,
                ..
            }
        ),
        "{e}"
    );
    // The bound is the behaviour under test: at once, not after the 60 s timeout (30 s leaves
    // room for two loaded cores).
    assert!(*took < Duration::from_secs(30), "rank 1 waited {took:?}");
}

/// `abort` from another thread also ends this rank's own running call (waiting for a rank that
/// never comes, on a 60 s communicator), with `Aborted`.
#[test]
fn abort_from_another_thread_ends_the_running_call() {
    let results = with_rank_absent(2, &config(4096, Duration::from_secs(60)), 1, |comm| {
        let caller = thread_state::id();
        std::thread::scope(|s| {
            s.spawn(|| {
                thread_state::wait_until_asleep(caller, "rank 0 waiting in its all_reduce");
                comm.abort();
            });
            lone_all_reduce(comm, &CallOpts::default())
        })
    });
    let (e, took) = results.into_iter().next().unwrap().unwrap();
    assert!(matches!(e, Error::Aborted { .. }), "{e}");
    // The bound is the behaviour under test: the abort ends the call, not the 60 s timeout
    // (30 s leaves room for two loaded cores).
    assert!(took < Duration::from_secs(30), "waited {took:?}");
}

fn expect_mismatch_everywhere(results: Vec<ferrocomm::Result<()>>) {
    for (r, res) in results.into_iter().enumerate() {
        match res {
            Err(Error::Mismatch { rank, .. }) => assert_eq!(rank, r),
            other => panic!("rank {r}: expected a mismatch, got {other:?}"),
        }
    }
}

#[test]
fn different_calls_at_the_same_step_fail_on_every_rank() {
    let cfg = config(4096, Duration::from_secs(20));
    for n in [2, 3, 4] {
        run_ranks(n, &cfg, |comm| {
            let me = comm.rank();
            let o = CallOpts::default();
            let x = vec![1.5f32; 64];
            let mut y = vec![0.0f32; 64];
            // Different counts.
            let count = if me == n - 1 { 63 } else { 64 };
            let r = comm.all_reduce(
                Input::Buf(View::host(&x[..count])),
                ViewMut::host(&mut y[..count]),
                ReduceOp::Sum,
                &o,
            );
            assert!(matches!(r, Err(Error::Mismatch { .. })), "counts: {r:?}");
            // Different dtypes.
            let xd = vec![1.5f64; 64];
            let mut yd = vec![0.0f64; 64];
            let r = if me == 0 {
                all_reduce_sum(&comm, &xd, &mut yd, &o)
            } else {
                all_reduce_sum(&comm, &x, &mut y, &o)
            };
            let e = r.unwrap_err();
            assert!(matches!(e, Error::Mismatch { .. }), "dtypes: {e}");
            assert!(
                e.to_string().contains("double") && e.to_string().contains("float"),
                "{e}"
            );
            // Different collectives.
            let r = if me == 1 {
                comm.broadcast(Input::Buf(View::host(&x)), ViewMut::host(&mut y), 0, &o)
            } else {
                all_reduce_sum(&comm, &x, &mut y, &o)
            };
            assert!(
                matches!(r, Err(Error::Mismatch { .. })),
                "collectives: {r:?}"
            );
            // Different ops and roots.
            let op = if me == 0 {
                ReduceOp::Max
            } else {
                ReduceOp::Sum
            };
            assert!(matches!(
                comm.all_reduce(Input::Buf(View::host(&x)), ViewMut::host(&mut y), op, &o),
                Err(Error::Mismatch { .. })
            ));
            assert!(matches!(
                comm.reduce(
                    Input::Buf(View::host(&x)),
                    ViewMut::host(&mut y),
                    ReduceOp::Sum,
                    me % 2,
                    &o
                ),
                Err(Error::Mismatch { .. })
            ));
            // Still usable afterwards.
            y.fill(f32::NAN);
            all_reduce_sum(&comm, &x, &mut y, &o).unwrap();
            assert!(y.iter().all(|&v| v == 1.5 * n as f32));
        });
        // All-to-all-v whose counts disagree between a sender and its receiver.
        let res = run_ranks(n, &cfg, |comm| {
            let me = comm.rank();
            let mut recv = vec![4usize; n];
            if me == 1 {
                recv[0] = 3;
            }
            let splits = Splits::packed(vec![4; n], recv.clone());
            let x = vec![2.0f32; 4 * n];
            let mut y = vec![0.0f32; recv.iter().sum()];
            comm.all_to_all_v(
                Input::Buf(View::host(&x)),
                ViewMut::host(&mut y),
                &splits,
                &CallOpts::default(),
            )
        });
        expect_mismatch_everywhere(res);
    }
}

/// A rank's part to itself with different send and receive counts is refused on that rank
/// before anything runs (no exchange, no timeout), and the communicator stays usable.
#[test]
fn an_all_to_all_v_own_part_that_changes_size_is_refused() {
    run_ranks(2, &config(4096, Duration::from_secs(20)), |comm| {
        let me = comm.rank();
        let mut recv = vec![4usize; 2];
        recv[me] = 5;
        let splits = Splits::packed(vec![4; 2], recv);
        let x = vec![2.0f32; 8];
        let mut y = vec![0.0f32; 9];
        let r = comm.all_to_all_v(
            Input::Buf(View::host(&x)),
            ViewMut::host(&mut y),
            &splits,
            &CallOpts::default(),
        );
        let Err(Error::InvalidArgument(m)) = r else {
            panic!("rank {me}: {r:?}");
        };
        assert!(
            m.contains(&format!(
                "rank {me} sends 4 elements to itself but expects 5"
            )),
            "{m}"
        );
        let splits = Splits::packed(vec![4; 2], vec![4; 2]);
        comm.all_to_all_v(
            Input::Buf(View::host(&x)),
            ViewMut::host(&mut y[..8]),
            &splits,
            &CallOpts::default(),
        )
        .unwrap();
        assert!(y[..8].iter().all(|&v| v == 2.0));
    });
}

#[test]
fn mismatched_send_and_recv_sizes_are_reported() {
    let res = run_ranks(2, &config(4096, Duration::from_secs(20)), |comm| {
        let d = DataType::I32;
        let x = input(d, 10_000, 3, 0, false); // several mailbox chunks: drained on mismatch
        if comm.rank() == 0 {
            comm.send(view(d, &x), 1, &CallOpts::default())
        } else {
            let mut y = vec![0i32; 9_999];
            comm.recv(ViewMut::host(&mut y), 0, &CallOpts::default())
        }
    });
    // Both sides fail: the receiver was there while the sender sent its chunks.
    assert!(
        matches!(res[0], Err(Error::Mismatch { peer: 1, .. })),
        "{:?}",
        res[0]
    );
    assert!(
        matches!(res[1], Err(Error::Mismatch { peer: 0, .. })),
        "{:?}",
        res[1]
    );
}

#[test]
fn ranks_with_different_settings_are_refused_at_creation() {
    use ferrocomm::bootstrap::{MemStore, Store};
    use ferrocomm::config::BackendChoice;
    use ferrocomm::{CommOptions, Communicator};
    use std::sync::Arc;
    let store: Arc<dyn Store> = MemStore::new();
    let name = unique_name("settings");
    let errs: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..3)
            .map(|r| {
                let (store, name) = (store.clone(), &name);
                s.spawn(move || {
                    let mut c = config(4096, Duration::from_secs(10));
                    if r == 2 {
                        c.thresholds.flat_max = Some(1000);
                        c.host_slot_bytes = 8192;
                    }
                    Communicator::new(CommOptions {
                        name: name.clone(),
                        rank: Some(r),
                        size: Some(3),
                        store: Some(store),
                        backend: Some(BackendChoice::Host),
                        config: Some(c),
                        ..Default::default()
                    })
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_else(|| "created".into())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for e in &errs {
        assert_eq!(e, &errs[0], "every rank gives the same reason");
    }
    let e = &errs[0];
    assert!(e.contains("settings differ between ranks"), "{e}");
    assert!(
        e.contains(
            "FERROCOMM_ALLREDUCE_FLAT_MAX_BYTES (thresholds.flat_max): rank 0 default, \
             rank 1 default, rank 2 1000"
        ),
        "{e}"
    );
    assert!(
        e.contains(
            "FERROCOMM_HOST_SLOT_BYTES (host_slot_bytes): rank 0 4096, rank 1 4096, rank 2 8192"
        ),
        "{e}"
    );
    // Agreeing ranks still come up (the same store, another name).
    let ok = run_ranks(3, &config(4096, Duration::from_secs(10)), |c| c.size());
    assert_eq!(ok, vec![3, 3, 3]);
}

#[test]
fn low_precision_on_one_rank_only_is_a_named_mismatch() {
    use ferrocomm::{Format, LowPrecisionChoice};
    let cfg = config(4096, Duration::from_secs(20));
    let res = run_ranks(2, &cfg, |comm| {
        let o = if comm.rank() == 0 {
            CallOpts::default().with_low_precision(LowPrecisionChoice::On(Format::E5M2))
        } else {
            CallOpts::default()
        };
        let x = vec![1.25f32; 3000];
        let mut y = vec![f32::NAN; 3000];
        let r = all_reduce_sum(&comm, &x, &mut y, &o);
        (r.map_err(|e| e.to_string()), y)
    });
    for (r, (e, y)) in res.iter().enumerate() {
        let e = e.as_ref().expect_err("a mismatch");
        assert!(e.contains("collective mismatch"), "rank {r}: {e}");
        assert!(e.contains("low precision e5m2, block 128"), "rank {r}: {e}");
        assert!(y.iter().all(|v| v.is_nan()), "rank {r}: output written");
    }
}
