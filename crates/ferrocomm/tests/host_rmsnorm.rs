//! The fused all-reduce + residual add + RMSNorm on the host backend, against the exact f64
//! result: every dtype, the model hidden sizes with odd row counts, eps, in and out of place,
//! FP8 on and off (a scale per row, or one given scale); and bad inputs refused on every rank
//! with nothing written.

mod host_support;

use std::time::Duration;

use ferrocomm::rmsnorm::{compare, exact_rows, Fp8Ref};
use ferrocomm::{
    AllReduceRmsNorm, CallOpts, Communicator, DataType, Device, Error, Fp8Rows, Fp8Scale, Input,
    View, ViewMut,
};
use host_support::{config, input, run_ranks};

const FLOATS: [DataType; 3] = [DataType::F32, DataType::F16, DataType::BF16];

fn view(b: &[u8], d: DataType) -> View<'_> {
    // SAFETY: `b` holds whole elements of `d` (made by `input` or sized by the caller) and is
    // borrowed for the view's life.
    unsafe { View::from_raw(b.as_ptr(), b.len() / d.size(), d, Device::Host) }
}

fn view_mut(b: &mut [u8], d: DataType) -> ViewMut<'_> {
    // SAFETY: as in `view`, borrowed mutably.
    unsafe { ViewMut::from_raw(b.as_mut_ptr(), b.len() / d.size(), d, Device::Host) }
}

fn values(d: DataType, b: &[u8]) -> Vec<f32> {
    let mut v = vec![0.0f32; b.len() / d.size()];
    ferrocomm::reduce::to_f32(d, b, &mut v).unwrap();
    v
}

fn f64s(d: DataType, b: &[u8]) -> Vec<f64> {
    values(d, b).into_iter().map(f64::from).collect()
}

/// One case's inputs: every rank's partial rows, the residual and the weight (the same on
/// every rank, as in a model).
struct Case {
    d: DataType,
    rows: usize,
    hidden: usize,
    eps: f32,
    seed: u64,
}

impl Case {
    fn x(&self, rank: usize) -> Vec<u8> {
        input(self.d, self.rows * self.hidden, self.seed, rank, false)
    }
    fn residual(&self) -> Vec<u8> {
        input(
            self.d,
            self.rows * self.hidden,
            self.seed ^ 0x5eed,
            99,
            false,
        )
    }
    fn weight(&self) -> Vec<u8> {
        input(self.d, self.hidden, self.seed ^ 0x3e16, 98, false)
    }
}

/// What one rank's call wrote: residual_out, out, FP8 codes and scales (the given scale, with
/// one given).
type Written = (Vec<u8>, Vec<u8>, Vec<u8>, Vec<u8>);

/// Runs `case` on `world` ranks; in place (x and residual overwritten) or into separate
/// outputs, without FP8 or with a scale per row or a given one.
fn run(world: usize, case: &Case, in_place: bool, fp8: Option<Fp8Ref>) -> Vec<Written> {
    let cfg = config(64 << 10, Duration::from_secs(30));
    let n = case.rows * case.hidden;
    let d = case.d;
    run_ranks(world, &cfg, |c: Communicator| {
        let mut x = case.x(c.rank());
        let x_before = x.clone();
        let mut res = case.residual();
        let res_before = res.clone();
        let w = case.weight();
        let mut out = vec![0u8; n * d.size()];
        let mut res_out = vec![0u8; n * d.size()];
        let mut codes = vec![0u8; n];
        let mut scales = match fp8 {
            Some(Fp8Ref::Given(s)) => s.to_le_bytes().to_vec(),
            _ => vec![0u8; case.rows * 4],
        };
        let given = scales.clone();
        let q = fp8.map(|f| Fp8Rows {
            codes: view_mut(&mut codes, DataType::F8E4M3),
            scale: match f {
                Fp8Ref::PerRow => Fp8Scale::PerRow(view_mut(&mut scales, DataType::F32)),
                Fp8Ref::Given(_) => Fp8Scale::Given(view(&given, DataType::F32)),
            },
        });
        let call = if in_place {
            AllReduceRmsNorm {
                x: Input::InPlace,
                out: view_mut(&mut x, d),
                residual: Input::InPlace,
                residual_out: view_mut(&mut res, d),
                weight: view(&w, d),
                eps: case.eps,
                fp8: q,
            }
        } else {
            AllReduceRmsNorm {
                x: Input::Buf(view(&x, d)),
                out: view_mut(&mut out, d),
                residual: Input::Buf(view(&res, d)),
                residual_out: view_mut(&mut res_out, d),
                weight: view(&w, d),
                eps: case.eps,
                fp8: q,
            }
        };
        c.all_reduce_rmsnorm(call, &CallOpts::default())
            .expect("all_reduce_rmsnorm");
        if in_place {
            (res, x, codes, scales)
        } else {
            // Out of place leaves the inputs alone.
            assert_eq!(x, x_before, "x was written out of place");
            assert_eq!(res, res_before, "residual was written out of place");
            (res_out, out, codes, scales)
        }
    })
}

fn check(world: usize, case: &Case, in_place: bool, fp8: Option<Fp8Ref>) {
    let got = run(world, case, in_place, fp8);
    let d = case.d;
    let inputs: Vec<Vec<f64>> = (0..world).map(|r| f64s(d, &case.x(r))).collect();
    let want = exact_rows(
        &inputs,
        &f64s(d, &case.residual()),
        &f64s(d, &case.weight()),
        case.eps as f64,
    );
    let label = format!(
        "{world} ranks {d} {} x {} eps {} {} fp8 {fp8:?}",
        case.rows,
        case.hidden,
        case.eps,
        if in_place { "in place" } else { "out of place" }
    );
    for (rank, (r, y, codes, scales)) in got.iter().enumerate() {
        // Bit for bit the same on every rank.
        assert_eq!(
            (r, y, codes, scales),
            (&got[0].0, &got[0].1, &got[0].2, &got[0].3),
            "{label}: rank {rank} differs from rank 0"
        );
        let scales = values(DataType::F32, scales);
        let q = fp8.map(|f| {
            (
                codes.as_slice(),
                scales.as_slice(),
                matches!(f, Fp8Ref::Given(_)),
            )
        });
        if let Err(e) = compare(d, &want, &values(d, r), &values(d, y), q) {
            panic!("{label}: rank {rank}: {e}");
        }
    }
}

#[test]
fn every_dtype_and_model_hidden_size_matches_the_exact_result() {
    let mut seed = 1;
    for d in FLOATS {
        for (hidden, rows) in [(8, 1), (4096, 3), (5120, 1), (8192, 5), (16384, 3)] {
            seed += 1;
            let case = Case {
                d,
                rows,
                hidden,
                eps: 1e-6,
                seed,
            };
            let fp8 = match seed % 3 {
                0 => None,
                1 => Some(Fp8Ref::PerRow),
                _ => Some(Fp8Ref::Given(0.004)),
            };
            check(2, &case, seed % 2 == 0, fp8);
        }
    }
}

#[test]
fn in_and_out_of_place_with_and_without_fp8_at_three_ranks() {
    for d in FLOATS {
        for in_place in [true, false] {
            for fp8 in [None, Some(Fp8Ref::PerRow), Some(Fp8Ref::Given(0.01))] {
                for eps in [0.0, 1e-5, 0.5] {
                    let case = Case {
                        d,
                        rows: 7,
                        hidden: 40,
                        eps,
                        seed: 77,
                    };
                    check(3, &case, in_place, fp8);
                }
            }
        }
    }
}

#[test]
fn one_rank_and_no_rows() {
    let case = Case {
        d: DataType::BF16,
        rows: 9,
        hidden: 64,
        eps: 1e-6,
        seed: 5,
    };
    check(1, &case, true, Some(Fp8Ref::PerRow));
    let empty = Case { rows: 0, ..case };
    check(2, &empty, false, Some(Fp8Ref::PerRow));
}

#[test]
fn a_given_scale_saturates_past_448_steps_and_an_unusable_one_gives_zero_codes() {
    let case = Case {
        d: DataType::BF16,
        rows: 5,
        hidden: 48,
        eps: 1e-6,
        seed: 11,
    };
    // y is of order 1: 1e-4 saturates most codes at +-448 steps, 1e3 makes most subnormal.
    for scale in [1e-4, 1e3, 0.0, -1.0, f32::NAN, f32::INFINITY] {
        for world in [2, 3] {
            check(world, &case, world == 2, Some(Fp8Ref::Given(scale)));
        }
    }
    // The saturated codes are +-448 (0x7e / 0xfe): out of place, one rank.
    let got = run(1, &case, false, Some(Fp8Ref::Given(1e-4)));
    let codes = &got[0].2;
    assert!(codes.iter().filter(|&&c| c & 0x7f == 0x7e).count() > codes.len() / 2);
    let zero = run(1, &case, false, Some(Fp8Ref::Given(f32::NAN)));
    assert!(zero[0].2.iter().all(|&c| c == 0));
}

#[test]
fn the_fp8_rows_are_the_e4m3_encoding_of_out() {
    // Codes decode within half an E4M3 step of the written out, which `compare` checks
    // against the exact rows; here: a zero row has scale 0 and zero codes.
    let cfg = config(64 << 10, Duration::from_secs(30));
    let d = DataType::F32;
    let got = run_ranks(2, &cfg, |c: Communicator| {
        let mut x = vec![0u8; 2 * 8 * 4];
        let mut res = vec![0u8; 2 * 8 * 4];
        res[32..].copy_from_slice(&[1.0f32; 8].map(f32::to_le_bytes).concat());
        let w = [2.0f32; 8].map(f32::to_le_bytes).concat();
        let mut codes = vec![0xffu8; 16];
        let mut scales = vec![0xffu8; 8];
        c.all_reduce_rmsnorm(
            AllReduceRmsNorm {
                x: Input::InPlace,
                out: view_mut(&mut x, d),
                residual: Input::InPlace,
                residual_out: view_mut(&mut res, d),
                weight: view(&w, d),
                eps: 1e-6,
                fp8: Some(Fp8Rows {
                    codes: view_mut(&mut codes, DataType::F8E4M3),
                    scale: Fp8Scale::PerRow(view_mut(&mut scales, DataType::F32)),
                }),
            },
            &CallOpts::default(),
        )
        .unwrap();
        (values(d, &x), codes, values(DataType::F32, &scales))
    });
    for (y, codes, scales) in got {
        assert_eq!(&y[..8], &[0.0; 8]);
        // Row of ones, weight 2: y = 2 / sqrt(1 + eps) everywhere, scale y / 448, codes 448
        // (0x7e).
        assert!((y[8] - 2.0).abs() < 1e-5 && y[8..].iter().all(|v| *v == y[8]));
        assert_eq!(scales, vec![0.0, y[8] / 448.0]);
        assert_eq!(&codes[..8], &[0u8; 8]);
        assert_eq!(&codes[8..], &[0x7eu8; 8]);
    }
}

/// Every rank calls with its own (rows, hidden, dtype of the weight, eps); all must fail with
/// an error containing `needle` and leave every buffer as it was.
fn refused(
    world: usize,
    per_rank: impl Fn(usize) -> (usize, usize, DataType, f32) + Sync,
    needle: &str,
) {
    let cfg = config(64 << 10, Duration::from_secs(20));
    let d = DataType::BF16;
    let errs = run_ranks(world, &cfg, |c: Communicator| {
        let (rows, hidden, wd, eps) = per_rank(c.rank());
        let mut x = input(d, rows * hidden, 3, c.rank(), false);
        let mut res = input(d, rows * hidden, 4, 0, false);
        let w = input(wd, hidden, 5, 0, false);
        let (x0, res0) = (x.clone(), res.clone());
        let mut codes = vec![0xabu8; rows * hidden];
        let mut scales = vec![0xabu8; rows * 4];
        let r = c.all_reduce_rmsnorm(
            AllReduceRmsNorm {
                x: Input::InPlace,
                out: view_mut(&mut x, d),
                residual: Input::InPlace,
                residual_out: view_mut(&mut res, d),
                weight: view(&w, wd),
                eps,
                fp8: Some(Fp8Rows {
                    codes: view_mut(&mut codes, DataType::F8E4M3),
                    scale: Fp8Scale::PerRow(view_mut(&mut scales, DataType::F32)),
                }),
            },
            &CallOpts::default(),
        );
        assert_eq!(x, x0, "rank {}: out written by a refused call", c.rank());
        assert_eq!(
            res,
            res0,
            "rank {}: residual written by a refused call",
            c.rank()
        );
        assert!(codes.iter().chain(&scales).all(|b| *b == 0xab));
        // The communicator still works after the refusal.
        let mut one = [1.0f32];
        c.all_reduce(
            Input::InPlace,
            ViewMut::host(&mut one),
            ferrocomm::ReduceOp::Sum,
            &CallOpts::default(),
        )
        .unwrap();
        assert_eq!(one[0], world as f32);
        r.expect_err("a bad call must fail")
    });
    for (rank, e) in errs.iter().enumerate() {
        let msg = e.to_string();
        assert!(
            msg.contains(needle),
            "rank {rank}: {msg:?} lacks {needle:?}"
        );
    }
}

#[test]
fn bad_inputs_fail_on_every_rank_and_write_nothing() {
    let bf = DataType::BF16;
    refused(2, |_| (3, 12, bf, 1e-6), "positive multiple of 8");
    refused(
        2,
        |_| (3, 16, DataType::F16, 1e-6),
        "weight is half, expected bfloat16",
    );
    refused(2, |_| (2, 16, bf, f32::NAN), "eps must be finite");
    refused(2, |_| (2, 16, bf, -1.0), "eps must be finite");
    // Ranks that disagree: the same element count in other rows, another eps.
    refused(
        2,
        |r| {
            if r == 0 {
                (4, 16, bf, 1e-6)
            } else {
                (2, 32, bf, 1e-6)
            }
        },
        "ranks disagree on the call (rank 0: 4 rows x hidden 16 of bfloat16, eps 0.000001, \
         fp8 on, a scale per row; rank 1: 2 rows x hidden 32",
    );
    refused(
        3,
        |r| (2, 16, bf, if r == 2 { 1e-5 } else { 1e-6 }),
        "rank 2: 2 rows x hidden 16 of bfloat16, eps 0.00001",
    );
}

#[test]
fn mismatched_buffers_are_named() {
    let cfg = config(64 << 10, Duration::from_secs(20));
    let d = DataType::F32;
    run_ranks(1, &cfg, |c: Communicator| {
        let x = vec![0u8; 32 * 4];
        let mut out = vec![0u8; 32 * 4];
        let res = vec![0u8; 24 * 4];
        let mut res_out = vec![0u8; 32 * 4];
        let w = vec![0u8; 16 * 4];
        let call = |x: &[u8], res: &[u8], out: &mut [u8], res_out: &mut [u8]| {
            c.all_reduce_rmsnorm(
                AllReduceRmsNorm {
                    x: Input::Buf(view(x, d)),
                    out: view_mut(out, d),
                    residual: Input::Buf(view(res, d)),
                    residual_out: view_mut(res_out, d),
                    weight: view(&w, d),
                    eps: 1e-6,
                    fp8: None,
                },
                &CallOpts::default(),
            )
        };
        let e = call(&x, &res, &mut out, &mut res_out).unwrap_err();
        assert!(
            matches!(
                e,
                Error::SizeMismatch {
                    what: "residual",
                    got: 24,
                    expected: 32,
                    ..
                }
            ),
            "{e}"
        );
        // x given separately but overlapping out.
        let mut both = [0u8; 48 * 4];
        let (a, b) = both.split_at_mut(16 * 4);
        let xv = view(&b[..32 * 4], d);
        let mut res_out2 = vec![0u8; 32 * 4];
        let e = c
            .all_reduce_rmsnorm(
                AllReduceRmsNorm {
                    x: Input::Buf(xv),
                    // SAFETY: deliberately overlapping `xv` (refused before any access).
                    out: unsafe { ViewMut::from_raw(a.as_mut_ptr(), 32, d, Device::Host) },
                    residual: Input::InPlace,
                    residual_out: view_mut(&mut res_out2, d),
                    weight: view(&w, d),
                    eps: 1e-6,
                    fp8: None,
                },
                &CallOpts::default(),
            )
            .unwrap_err();
        assert!(e.to_string().contains("out and x overlap"), "{e}");
    });
}
