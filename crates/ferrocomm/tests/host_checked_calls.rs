//! Calls that are wrong on one side: a send and a receive whose sizes differ fail on both
//! sides; a collective one rank refuses (its arguments) fails at once on the others; with
//! FERROCOMM_CHECK_CALLS a collective that differs fails on every rank before it runs; with
//! FERROCOMM_NAN_CHECK an input holding a NaN is refused naming the rank and the call.

mod host_support;

use std::sync::mpsc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ferrocomm::{CallOpts, Error, Input, ReduceOp, View, ViewMut};
use host_support::*;

#[test]
fn a_send_and_a_receive_of_different_sizes_fail_on_both_sides() {
    let cfg = config(8192, Duration::from_secs(20));
    let o = CallOpts::default();
    // Several chunks (the mailbox holds 4 KiB): the receiver is there while the sender sends.
    let r = run_ranks(2, &cfg, |comm| {
        if comm.rank() == 0 {
            comm.send(View::host(&vec![1.0f32; 10_000]), 1, &o)
                .unwrap_err()
        } else {
            comm.recv(ViewMut::host(&mut vec![0.0f32; 9_000]), 0, &o)
                .unwrap_err()
        }
    });
    assert!(
        r[0].to_string().contains("send of 40000 bytes") && r[0].to_string().contains("36000"),
        "{}",
        r[0]
    );
    assert!(
        r[1].to_string().contains("recv of 36000 bytes") && r[1].to_string().contains("40000"),
        "{}",
        r[1]
    );
    // One chunk, sent before the receive exists: the send returns (the message waits in the
    // mailbox); the receive fails; the sender's next call with that peer reports it.
    let (sent_tx, sent_rx) = mpsc::channel::<()>();
    let (recvd_tx, recvd_rx) = mpsc::channel::<()>();
    let (sent_rx, recvd_rx) = (Mutex::new(sent_rx), Mutex::new(recvd_rx));
    let r = run_ranks(2, &cfg, |comm| {
        if comm.rank() == 0 {
            comm.send(View::host(&[1.0f32; 8]), 1, &o).unwrap();
            sent_tx.send(()).unwrap();
            recvd_rx.lock().unwrap().recv().unwrap();
            comm.send(View::host(&[1.0f32; 8]), 1, &o).unwrap_err()
        } else {
            sent_rx.lock().unwrap().recv().unwrap();
            let e = comm
                .recv(ViewMut::host(&mut [0.0f32; 6]), 0, &o)
                .unwrap_err();
            recvd_tx.send(()).unwrap();
            e
        }
    });
    assert!(r[1].to_string().contains("recv of 24 bytes"), "{}", r[1]);
    assert!(
        r[0].to_string()
            .contains("refused by its receive, which expected 24 bytes"),
        "{}",
        r[0]
    );
}

#[test]
fn a_collective_one_rank_refuses_fails_at_once_on_the_others() {
    let cfg = config(8192, Duration::from_secs(30));
    let o = CallOpts::default();
    let r = run_ranks(3, &cfg, |comm| {
        let t0 = Instant::now();
        let x = vec![1.0f32; 64];
        // Rank 1's output is too small for the gather: refused there alone.
        let mut out = vec![0.0f32; if comm.rank() == 1 { 100 } else { 192 }];
        let e = comm
            .all_gather(Input::Buf(View::host(&x)), ViewMut::host(&mut out), &o)
            .unwrap_err();
        (e, t0.elapsed())
    });
    assert!(matches!(r[1].0, Error::InvalidArgument(_)), "{}", r[1].0);
    for rank in [0, 2] {
        refused_at_once(rank, &r[rank], 1, "does not divide into 3 equal parts");
    }
}

/// Asserts that `rank`'s call #1 failed with `peer`'s refusal, saying `says`, well before the
/// 30 s timeout (the bound is the behaviour under test, with room for two loaded cores).
fn refused_at_once(rank: usize, (e, took): &(Error, Duration), peer: usize, says: &str) {
    assert!(
        matches!(e, Error::PeerRefused { peer: p, call: 1, .. } if *p == peer),
        "rank {rank}: {e}"
    );
    assert!(e.to_string().contains(says), "{e}");
    assert!(
        *took < Duration::from_secs(10),
        "rank {rank} waited {took:?}"
    );
}

#[test]
fn a_refused_call_fails_at_once_on_a_rank_waiting_for_a_late_peer() {
    // Rank 0 is in the call, waiting for rank 1, which has not made it yet (a loaded machine;
    // or a rank that learned of the refusal first, failed the call at its start and exited);
    // meanwhile rank 2 refuses it. Rank 0 fails at once with rank 2's refusal, not at its
    // timeout, nor by taking rank 1's absence for a failure.
    let cfg = config(8192, Duration::from_secs(30));
    let o = CallOpts::default();
    let (calling_tx, calling_rx) = mpsc::channel::<()>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let (calling_rx, done_rx) = (Mutex::new(calling_rx), Mutex::new(done_rx));
    let r = run_ranks(3, &cfg, |comm| {
        let t0 = Instant::now();
        let x = vec![1.0f32; 64];
        let mut out = vec![0.0f32; 192];
        let mut call = || comm.all_gather(Input::Buf(View::host(&x)), ViewMut::host(&mut out), &o);
        let e = match comm.rank() {
            0 => {
                calling_tx.send(()).unwrap();
                let e = call().unwrap_err();
                done_tx.send(()).unwrap();
                e
            }
            1 => {
                done_rx.lock().unwrap().recv().unwrap();
                call().unwrap_err()
            }
            _ => {
                calling_rx.lock().unwrap().recv().unwrap();
                comm.refuse("all_gather", "refused by the test");
                Error::InvalidArgument("refused by the test".into())
            }
        };
        (e, t0.elapsed())
    });
    for rank in [0, 1] {
        refused_at_once(rank, &r[rank], 2, "refused by the test");
    }
}

#[test]
fn a_collective_every_rank_refuses_fails_with_each_ranks_own_error_and_the_communicator_goes_on() {
    // Each rank sees the others' refusals of the same call while refusing it itself: that is
    // no peer failure (nothing of the call was taken anywhere), so the next call runs.
    let cfg = config(8192, Duration::from_secs(30));
    let o = CallOpts::default();
    let r = run_ranks(3, &cfg, |comm| {
        let x = vec![1.0f32; 64];
        let mut out = vec![0.0f32; 100];
        let e = comm
            .all_gather(Input::Buf(View::host(&x)), ViewMut::host(&mut out), &o)
            .unwrap_err();
        let mut z = vec![comm.rank() as f32 + 1.0; 8];
        comm.all_reduce(Input::InPlace, ViewMut::host(&mut z), ReduceOp::Sum, &o)
            .unwrap();
        assert!(z.iter().all(|&v| v == 6.0), "{z:?}");
        e
    });
    for (rank, e) in r.iter().enumerate() {
        assert!(matches!(e, Error::InvalidArgument(_)), "rank {rank}: {e}");
    }
}

#[test]
fn checked_calls_fail_at_the_call_that_differs_and_nothing_runs() {
    let mut cfg = config(8192, Duration::from_secs(30));
    cfg.check_calls = true;
    let o = CallOpts::default();
    let r = run_ranks(3, &cfg, |comm| {
        let mut y = vec![1.0f32; if comm.rank() == 2 { 9 } else { 8 }];
        let e = comm
            .all_reduce(Input::InPlace, ViewMut::host(&mut y), ReduceOp::Sum, &o)
            .unwrap_err();
        // Nothing ran: the output is untouched and the communicator goes on.
        assert!(y.iter().all(|&v| v == 1.0));
        let mut z = vec![1.0f32; 8];
        comm.all_reduce(Input::InPlace, ViewMut::host(&mut z), ReduceOp::Sum, &o)
            .unwrap();
        assert_eq!(z[0], 3.0);
        e
    });
    for (rank, e) in r.iter().enumerate() {
        assert!(
            matches!(e, Error::Mismatch { seq: 1, .. }),
            "rank {rank}: {e}"
        );
        assert!(e.to_string().contains("count=9"), "rank {rank}: {e}");
    }
}

#[test]
fn a_nan_in_an_input_is_refused_naming_rank_call_and_element() {
    let mut cfg = config(8192, Duration::from_secs(30));
    cfg.nan_check = true;
    let o = CallOpts::default();
    let r = run_ranks(2, &cfg, |comm| {
        let mut x = vec![1.0f32; 16];
        if comm.rank() == 1 {
            x[5] = f32::NAN;
        }
        let mut y = vec![0.0f32; 16];
        all_reduce_sum(&comm, &x, &mut y, &o).unwrap_err()
    });
    assert!(
        r[1].to_string().contains(
            "all_reduce (call #1) on rank 1: the input holds a NaN or infinity at element 5"
        ),
        "{}",
        r[1]
    );
    assert!(
        matches!(r[0], Error::PeerRefused { peer: 1, .. }),
        "{}",
        r[0]
    );
}
