//! Extreme values at the public entry points on the host backend: sizes, counts,
//! displacements, units and timeouts near `usize::MAX`, `i64::MAX` and beyond what a duration
//! holds. Every call either succeeds with the right result or fails with a clear error; none
//! writes outside its buffers, panics or crashes the process.

mod host_support;

use std::time::Duration;

use ferrocomm::config::BackendChoice;
use ferrocomm::{
    CallOpts, CommOptions, Communicator, Config, Error, Input, PackedCounts, Splits, View, ViewMut,
};
use host_support::*;
use proptest::prelude::*;
use proptest::test_runner::{Config as PropConfig, RngAlgorithm, TestRng, TestRunner};

const GUARD: f32 = -7.5;

/// A runner with a fixed seed: every rank of a test draws the same cases in the same order.
fn runner(cases: u32) -> TestRunner {
    let cfg = PropConfig {
        cases,
        failure_persistence: None,
        ..PropConfig::default()
    };
    TestRunner::new_with_rng(cfg, TestRng::deterministic_rng(RngAlgorithm::ChaCha))
}

fn invalid(e: &Error) -> bool {
    matches!(e, Error::InvalidArgument(_))
}

#[test]
fn splits_whose_sums_overflow_are_refused() {
    let cfg = config(8192, Duration::from_secs(5));
    run_ranks(1, &cfg, |comm| {
        let x = [1.0f32, 2.0, 3.0, 4.0];
        let mut y = [GUARD; 4];
        let splits = Splits {
            send_counts: vec![usize::MAX],
            send_displs: vec![1],
            recv_counts: vec![usize::MAX],
            recv_displs: vec![1],
        };
        let e = comm
            .all_to_all_v(
                Input::Buf(View::host(&x)),
                ViewMut::host(&mut y),
                &splits,
                &CallOpts::default(),
            )
            .unwrap_err();
        assert!(invalid(&e) && e.to_string().contains("overflows"), "{e}");
        assert_eq!(y, [GUARD; 4]);
        // Packed sizes whose prefix sums pass usize::MAX stay refused, not wrapped.
        let packed = Splits::packed(vec![usize::MAX], vec![usize::MAX]);
        assert_eq!(packed.send_displs, vec![0]);
        let p3 = Splits::packed(vec![3, usize::MAX, 2], vec![0, 1, 2]);
        assert_eq!(p3.send_displs, vec![0, 3, usize::MAX]);
    });
}

/// The report's Python case, through the packed all-to-all-v with counts in host memory: rows
/// of 4 elements, split sizes near i64::MAX whose element counts and prefix sums overflow.
#[test]
fn packed_counts_near_i64_max_are_refused_on_every_rank() {
    let cfg = config(8192, Duration::from_secs(5));
    let errs = run_ranks(3, &cfg, |comm| {
        let me = comm.rank();
        let x = [1.0f32; 12];
        let mut y = [GUARD; 12];
        let (send, recv): ([i64; 3], [i64; 3]) = match me {
            0 => ([0, 1, i64::MAX], [1, 1, 1]),
            1 => ([1, 1, 1], [1, i64::MAX, 1]),
            _ => ([i64::MAX, i64::MAX, 1], [i64::MAX, 1, i64::MAX]),
        };
        let r = comm.all_to_all_v_dynamic_packed(
            View::host(&x),
            ViewMut::host(&mut y),
            PackedCounts {
                send: View::host(&send),
                recv: View::host(&recv),
                unit: 4,
            },
            &CallOpts::default(),
        );
        assert_eq!(y, [GUARD; 12], "rank {me} wrote its output");
        r.unwrap_err()
    });
    for (r, e) in errs.iter().enumerate() {
        assert!(invalid(e), "rank {r}: {e}");
    }
}

/// A count or displacement: small, or at the edges of usize.
fn extreme() -> impl Strategy<Value = usize> {
    prop_oneof![
        0usize..6,
        Just(usize::MAX),
        Just(usize::MAX - 1),
        Just(usize::MAX / 2 + 1),
        Just(1usize << 62),
        Just(i64::MAX as usize),
    ]
}

#[test]
fn all_to_all_v_with_extreme_splits_never_writes_outside() {
    let cfg = config(8192, Duration::from_secs(5));
    run_ranks(1, &cfg, |comm| {
        let mut runner = runner(300);
        runner
            .run(
                &(extreme(), extreme(), extreme(), extreme()),
                |(sc, sd, rc, rd)| {
                    let x = [1.0f32, 2.0, 3.0, 4.0, 5.0];
                    // Four elements of output between guards.
                    let mut backing = [GUARD; 8];
                    let splits = Splits {
                        send_counts: vec![sc],
                        send_displs: vec![sd],
                        recv_counts: vec![rc],
                        recv_displs: vec![rd],
                    };
                    let r = comm.all_to_all_v(
                        Input::Buf(View::host(&x[..4])),
                        ViewMut::host(&mut backing[2..6]),
                        &splits,
                        &CallOpts::default(),
                    );
                    prop_assert_eq!(&backing[..2], &[GUARD; 2]);
                    prop_assert_eq!(&backing[6..], &[GUARD; 2]);
                    match r {
                        Ok(()) => {
                            prop_assert!(sc == rc && sd + sc <= 4 && rd + rc <= 4);
                            for i in 0..sc {
                                prop_assert_eq!(backing[2 + rd + i], x[sd + i]);
                            }
                        }
                        Err(e) => prop_assert!(invalid(&e), "{}", e),
                    }
                    Ok(())
                },
            )
            .unwrap();
    });
}

#[test]
fn packed_all_to_all_v_with_extreme_counts_and_units_never_writes_outside() {
    let cfg = config(8192, Duration::from_secs(5));
    run_ranks(1, &cfg, |comm| {
        let counts = prop_oneof![
            -3i64..5,
            Just(i64::MAX),
            Just(i64::MIN),
            Just(i64::MAX / 2 + 1)
        ];
        let units = prop_oneof![Just(1usize), Just(2), Just(4), Just(usize::MAX), Just(0)];
        let mut runner = runner(200);
        runner
            .run(&(counts.clone(), counts, units), |(s, r, unit)| {
                let x = [1.0f32, 2.0, 3.0, 4.0];
                let mut backing = [GUARD; 8];
                let res = comm.all_to_all_v_dynamic_packed(
                    View::host(&x),
                    ViewMut::host(&mut backing[2..6]),
                    PackedCounts {
                        send: View::host(&[s]),
                        recv: View::host(&[r]),
                        unit,
                    },
                    &CallOpts::default(),
                );
                prop_assert_eq!(&backing[..2], &[GUARD; 2]);
                prop_assert_eq!(&backing[6..], &[GUARD; 2]);
                if let Err(e) = res {
                    prop_assert!(invalid(&e), "{}", e);
                }
                Ok(())
            })
            .unwrap();
    });
}

#[test]
fn collectives_with_mismatched_sizes_and_bad_roots_fail_cleanly() {
    let cfg = config(8192, Duration::from_secs(5));
    run_ranks(2, &cfg, |comm| {
        let mut runner = runner(64);
        runner
            .run(
                &(0usize..40, 0usize..40, extreme()),
                |(n_in, n_out, root)| {
                    let x = vec![1.0f32; n_in];
                    let mut y = vec![GUARD; n_out];
                    // Sizes are checked on each rank before any exchange, so an error here is
                    // local and the other rank makes the same choice (same inputs on both).
                    let o = CallOpts::default();
                    let ar = all_reduce_sum(&comm, &x, &mut y, &o);
                    prop_assert_eq!(ar.is_ok(), n_in == n_out);
                    if ar.is_ok() {
                        prop_assert!(y.iter().all(|&v| v == 2.0));
                    }
                    if root >= 2 {
                        let e = comm
                            .broadcast(Input::InPlace, ViewMut::host(&mut y), root, &o)
                            .unwrap_err();
                        prop_assert!(matches!(e, Error::RankOutOfRange { .. }), "{}", e);
                    }
                    Ok(())
                },
            )
            .unwrap();
    });
}

#[test]
fn a_slot_size_past_the_address_range_is_refused() {
    // Through the environment: bounded before any arithmetic.
    for v in ["18446744073709551615", "6148914691236517248", "2G"] {
        let e = Config::from_lookup(|k| (k == "FERROCOMM_HOST_SLOT_BYTES").then(|| v.into()))
            .unwrap_err();
        let s = e.to_string();
        assert!(
            matches!(
                e,
                Error::BadEnv {
                    var: "FERROCOMM_HOST_SLOT_BYTES",
                    ..
                }
            ),
            "{s}"
        );
        assert!(s.contains(v), "{s}");
    }
    // Set in the configuration directly: the layout's checked arithmetic refuses it.
    for slot in [usize::MAX, usize::MAX / 3 + 1, 6148914691236517248] {
        let cfg = config(slot, Duration::from_secs(2));
        let e = Communicator::new(CommOptions {
            name: unique_name("slot"),
            rank: Some(0),
            size: Some(1),
            store: Some(ferrocomm::bootstrap::MemStore::new()),
            backend: Some(BackendChoice::Host),
            config: Some(cfg),
            ..Default::default()
        })
        .err()
        .expect("a communicator with a slot past the address range");
        assert!(
            invalid(&e) && e.to_string().contains("FERROCOMM_HOST_SLOT_BYTES"),
            "{e}"
        );
    }
}

#[test]
fn timeouts_past_what_a_duration_holds_are_clear_errors() {
    for v in ["1e19", "1e30", "inf", "NaN", "-1", "0"] {
        let e =
            Config::from_lookup(|k| (k == "FERROCOMM_TIMEOUT_S").then(|| v.into())).unwrap_err();
        assert!(
            matches!(
                e,
                Error::BadEnv {
                    var: "FERROCOMM_TIMEOUT_S",
                    ..
                }
            ),
            "{v}: {e}"
        );
    }
    let c = Config::from_lookup(|k| (k == "FERROCOMM_TIMEOUT_S").then(|| "1e9".into())).unwrap();
    assert_eq!(c.timeout, Duration::from_secs(1_000_000_000));
    for t in [
        Duration::MAX,
        Duration::ZERO,
        Duration::from_secs(u64::MAX / 2),
    ] {
        let e = Communicator::new(CommOptions {
            name: unique_name("timeout"),
            rank: Some(0),
            size: Some(1),
            store: Some(ferrocomm::bootstrap::MemStore::new()),
            backend: Some(BackendChoice::Host),
            timeout: Some(t),
            config: Some(Config::default()),
            ..Default::default()
        })
        .err()
        .expect("a communicator with an unusable timeout");
        assert!(invalid(&e) && e.to_string().contains("timeout"), "{e}");
    }
}
