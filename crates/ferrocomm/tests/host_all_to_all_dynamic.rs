//! Host backend `all_to_all_v_dynamic`, ranks as threads: random uneven counts (zeros and
//! negatives included) in every count dtype, exactly fitting capacities, overflowing parts and
//! counts past the input, every element and count compared with a plain reference, and guard
//! bytes after the output and the counts that must stay untouched; counts of elements and of
//! rows (units of several elements).

mod host_support;

use std::time::Duration;

use ferrocomm::{CallOpts, Communicator, DataType, DeviceCounts, Error, PackedCounts, Splits};
use host_support::*;
use rand::{Rng, SeedableRng};

/// Small slots so that parts span several rounds.
const SLOT: usize = 4096;
const GUARD: usize = 64;
const COUNT_DTYPES: [DataType; 4] = [DataType::I32, DataType::U32, DataType::I64, DataType::U64];

fn cfg() -> ferrocomm::Config {
    config(SLOT, Duration::from_secs(30))
}

/// One call as every rank sees it: `want[s][p]` units of `unit` elements from rank `s` to rank
/// `p` (negative: nothing), rank `s`'s input holding `in_count[s]` units.
struct Case {
    d: DataType,
    cdt: DataType,
    unit: usize,
    cap: usize,
    want: Vec<Vec<i64>>,
    in_count: Vec<usize>,
    seed: u64,
}

impl Case {
    fn input(&self, r: usize) -> Vec<u8> {
        input(self.d, self.in_count[r] * self.unit, self.seed, r, false)
    }

    /// Bytes per unit.
    fn us(&self) -> usize {
        self.d.size() * self.unit
    }

    /// What rank `s` really sends to `p`: its count, cut where the input ends.
    fn sent(&self, s: usize, p: usize) -> usize {
        let w = |q: usize| self.want[s][q].max(0) as usize;
        let off: usize = (0..p).map(w).sum();
        w(p).min(self.in_count[s].saturating_sub(off))
    }

    /// Plain reference for rank `me`: output bytes (poison where nothing arrives), the received
    /// counts, and whether the call must fail on this rank.
    fn expected(&self, me: usize) -> (Vec<u8>, Vec<usize>, bool) {
        let (n, es) = (self.want.len(), self.us());
        let mut out = vec![POISON; n * self.cap * es];
        let mut recv = Vec::new();
        let mut fails = (0..n)
            .map(|p| self.want[me][p].max(0) as usize)
            .sum::<usize>()
            > self.in_count[me];
        for s in 0..n {
            let got = self.sent(s, me);
            fails |= got > self.cap;
            let take = got.min(self.cap);
            let off: usize = (0..me).map(|q| self.want[s][q].max(0) as usize).sum();
            if take > 0 {
                let src = &self.input(s)[off * es..(off + take) * es];
                out[s * self.cap * es..][..take * es].copy_from_slice(src);
            }
            recv.push(take);
        }
        (out, recv, fails)
    }
}

fn encode(cdt: DataType, v: &[i64]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| match cdt {
            DataType::I32 => (x as i32).to_ne_bytes().to_vec(),
            DataType::U32 => (x as u32).to_ne_bytes().to_vec(),
            DataType::I64 => x.to_ne_bytes().to_vec(),
            _ => (x as u64).to_ne_bytes().to_vec(),
        })
        .collect()
}

fn decode(cdt: DataType, b: &[u8]) -> Vec<usize> {
    b.chunks(cdt.size())
        .map(|c| match cdt {
            DataType::I32 => i32::from_ne_bytes(c.try_into().unwrap()) as usize,
            DataType::U32 => u32::from_ne_bytes(c.try_into().unwrap()) as usize,
            DataType::I64 => i64::from_ne_bytes(c.try_into().unwrap()) as usize,
            _ => u64::from_ne_bytes(c.try_into().unwrap()) as usize,
        })
        .collect()
}

/// Runs `case` on `comm` and checks output, guard bytes, received counts and the error.
fn check(comm: &Communicator, case: &Case, what: &str) {
    let (me, n, es) = (comm.rank(), comm.size(), case.us());
    // Input followed by random bytes that must never arrive anywhere.
    let mut inp = case.input(me);
    let in_len = inp.len();
    inp.extend(input(DataType::U8, GUARD, case.seed ^ 0xdead, me, false));
    let inbuf = Aligned::new(&inp);
    let out_len = n * case.cap * es;
    let mut out = Aligned::poisoned(out_len + GUARD);
    let send = Aligned::new(&encode(case.cdt, &case.want[me]));
    let mut recv = Aligned::poisoned(n * case.cdt.size() + GUARD);
    let counts = DeviceCounts {
        send: view(case.cdt, send.bytes()),
        recv: view_mut(case.cdt, &mut recv.bytes_mut()[..n * case.cdt.size()]),
        capacity: case.cap,
        unit: case.unit,
    };
    let r = comm.all_to_all_v_dynamic(
        view(case.d, &inbuf.bytes()[..in_len]),
        view_mut(case.d, &mut out.bytes_mut()[..out_len]),
        counts,
        &CallOpts::default(),
    );
    let (want_out, want_recv, fails) = case.expected(me);
    match (&r, fails) {
        (Ok(()), false) => {}
        (Err(Error::InvalidArgument(m)), true) => {
            assert!(m.contains("all_to_all_v_dynamic on rank"), "{what}: {m}")
        }
        _ => panic!("{what}, rank {me}: got {r:?}, expected failure: {fails}"),
    }
    assert_eq!(
        &out.bytes()[..out_len],
        &want_out[..],
        "{what}, rank {me}: output"
    );
    assert!(
        out.bytes()[out_len..].iter().all(|&b| b == POISON),
        "{what}, rank {me}: written past the output"
    );
    let rb = recv.bytes();
    assert_eq!(
        decode(case.cdt, &rb[..n * case.cdt.size()]),
        want_recv,
        "{what}, rank {me}: received counts"
    );
    assert!(
        rb[n * case.cdt.size()..].iter().all(|&b| b == POISON),
        "{what}, rank {me}: written past the counts"
    );
}

/// A random count table: a quarter zeros, some negative (signed count types), some parts
/// several regions long.
fn table(n: usize, cdt: DataType, rng: &mut impl Rng) -> Vec<Vec<i64>> {
    let signed = matches!(cdt, DataType::I32 | DataType::I64);
    (0..n)
        .map(|_| {
            (0..n)
                .map(|_| match rng.random_range(0..8) {
                    0 | 1 => 0,
                    2 if signed => -rng.random_range(1..1000),
                    3 => rng.random_range(300..900),
                    _ => rng.random_range(1..40),
                })
                .collect()
        })
        .collect()
}

fn cases(n: usize) -> Vec<(String, Case)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(n as u64 * 7919);
    let dtypes = [DataType::F32, DataType::BF16, DataType::U8, DataType::F64];
    let mut out = Vec::new();
    for (i, cdt) in COUNT_DTYPES.into_iter().enumerate() {
        let d = dtypes[i];
        let mut want = table(n, cdt, &mut rng);
        // At least one part several regions long (and a capacity it can overflow).
        want[0][n - 1] = rng.random_range(300..900);
        // Rank n-1 sends something, so that cutting its input in half cuts a part.
        want[n - 1][0] = rng.random_range(1..40);
        let total = |s: usize| want[s].iter().map(|&x| x.max(0) as usize).sum::<usize>();
        let largest = want
            .iter()
            .flatten()
            .map(|&x| x.max(0) as usize)
            .max()
            .unwrap();
        let fit = Case {
            d,
            cdt,
            unit: 1,
            cap: largest,
            in_count: (0..n).map(|s| total(s) + s * 3).collect(),
            want: want.clone(),
            seed: 100 + i as u64,
        };
        // The largest parts overflow a capacity one below them.
        let overflow = Case {
            cap: largest - 1,
            seed: 200 + i as u64,
            want: want.clone(),
            in_count: fit.in_count.clone(),
            ..fit
        };
        // Rank n-1's input ends halfway through its counts.
        let short = Case {
            cap: largest,
            in_count: (0..n)
                .map(|s| if s == n - 1 { total(s) / 2 } else { total(s) })
                .collect(),
            want: want.clone(),
            seed: 300 + i as u64,
            ..overflow
        };
        // The cases test what they say (the reference agrees on which ranks fail).
        let fails = |c: &Case| (0..n).filter(|&r| c.expected(r).2).count();
        assert_eq!(fails(&fit), 0);
        assert!(fails(&overflow) > 0 && fails(&short) > 0);
        // The same counts as rows: bf16 rows of 3 elements (6 bytes: parts at every alignment),
        // u8 rows of 5, f32 rows of 64.
        let unit = [3, 5, 64, 1][i];
        let rows = |c: &Case, seed: u64| Case {
            d: [DataType::BF16, DataType::U8, DataType::F32, d][i],
            unit,
            want: c.want.clone(),
            in_count: c.in_count.clone(),
            seed,
            ..*c
        };
        if unit > 1 {
            let (rf, ro, rs) = (rows(&fit, 400), rows(&overflow, 500), rows(&short, 600));
            assert!(fails(&rf) == 0 && fails(&ro) > 0 && fails(&rs) > 0);
            out.push((format!("{cdt} {} rows of {unit} exact fit", rf.d), rf));
            out.push((format!("{cdt} {} rows of {unit} overflow", ro.d), ro));
            out.push((format!("{cdt} {} rows of {unit} past the input", rs.d), rs));
        }
        out.push((format!("{cdt} {d} exact fit"), fit));
        out.push((format!("{cdt} {d} overflow"), overflow));
        out.push((format!("{cdt} {d} past the input"), short));
    }
    out
}

#[test]
fn dynamic_counts_match_the_reference() {
    for n in [2, 3, 4] {
        let cases = cases(n);
        run_ranks(n, &cfg(), |comm| {
            for (what, case) in &cases {
                check(&comm, case, &format!("n={n} {what}"));
            }
            // The failed calls left the communicator usable.
            comm.barrier(&CallOpts::default()).unwrap();
        });
    }
}

#[test]
fn capacity_dtype_and_collective_must_agree() {
    let n = 3;
    run_ranks(n, &cfg(), |comm| {
        let me = comm.rank();
        let sends = encode(DataType::I64, &[1, 2, 3]);
        let send = Aligned::new(&sends);
        let inp = Aligned::new(&input(DataType::F32, 6, 9, me, false));
        let call = |cap: usize, d: DataType| {
            let mut out = Aligned::poisoned(n * cap * d.size());
            let mut recv = Aligned::poisoned(n * 8);
            comm.all_to_all_v_dynamic(
                view(d, &inp.bytes()[..6 * d.size()]),
                view_mut(d, out.bytes_mut()),
                DeviceCounts {
                    send: view(DataType::I64, send.bytes()),
                    recv: view_mut(DataType::I64, recv.bytes_mut()),
                    capacity: cap,
                    unit: 1,
                },
                &CallOpts::default(),
            )
        };
        // A unit of no elements, an input that is not whole units: refused before anything
        // is exchanged, naming what is wrong.
        for (unit, what) in [
            (0, "at least one element"),
            (4, "whole number of units of 4"),
        ] {
            let mut out = Aligned::poisoned(n * 3 * 4 * 4);
            let mut recv = Aligned::poisoned(n * 8);
            let e = comm
                .all_to_all_v_dynamic(
                    view(DataType::F32, &inp.bytes()[..24]),
                    view_mut(DataType::F32, out.bytes_mut()),
                    DeviceCounts {
                        send: view(DataType::I64, send.bytes()),
                        recv: view_mut(DataType::I64, recv.bytes_mut()),
                        capacity: 3,
                        unit,
                    },
                    &CallOpts::default(),
                )
                .unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
            assert!(e.to_string().contains(what), "{e}");
            assert!(out.bytes().iter().all(|&b| b == POISON));
        }
        // Rank 1 disagrees on the capacity, then on the dtype: every rank fails.
        let cap = if me == 1 { 4 } else { 3 };
        let e = call(cap, DataType::F32).unwrap_err();
        assert!(matches!(e, Error::Mismatch { .. }), "{e}");
        assert!(e.to_string().contains("capacity="), "{e}");
        let d = if me == 1 {
            DataType::I32
        } else {
            DataType::F32
        };
        let e = call(3, d).unwrap_err();
        assert!(matches!(e, Error::Mismatch { .. }), "{e}");
        // Dynamic on rank 0 against a plain all-to-all-v elsewhere.
        let e = if me == 0 {
            call(3, DataType::F32).unwrap_err()
        } else {
            let mut out = Aligned::poisoned(6 * 4);
            // Valid counts on this rank (its own part keeps its size); the peers' disagree.
            let counts = vec![if me == 1 { 2 } else { 3 }, 0, 0];
            let mut send = vec![1, 2, 3];
            send[me] = counts[me];
            comm.all_to_all_v(
                ferrocomm::Input::Buf(view(DataType::F32, inp.bytes())),
                view_mut(DataType::F32, out.bytes_mut()),
                &Splits::packed(send, counts),
                &CallOpts::default(),
            )
            .unwrap_err()
        };
        assert!(matches!(e, Error::Mismatch { .. }), "{e}");
        // Agreement again: a correct call succeeds.
        call(3, DataType::F32).unwrap();
    });
}

/// `all_to_all_v_dynamic_packed` with counts in host memory (NCCLX's device_alltoallv_single
/// layout: the output packed at the prefix sums of the receive counts): random counts of
/// elements and of rows, zeros and negatives, every byte compared with a plain reference, the
/// output's tail past the parts untouched; the checks of a unit and of counts.
#[test]
fn packed_counts_match_the_reference() {
    for n in [2, 3, 4] {
        let mut rng = rand::rngs::StdRng::seed_from_u64(n as u64 * 31);
        let cases: Vec<(DataType, DataType, usize, Vec<Vec<i64>>)> = (0..6)
            .map(|k| {
                let cdt = COUNT_DTYPES[k % 4];
                let d = [DataType::BF16, DataType::F32, DataType::U8][k % 3];
                let unit = [1, 3, 1, 5, 64, 2][k];
                (d, cdt, unit, table(n, cdt, &mut rng))
            })
            .collect();
        run_ranks(n, &cfg(), |comm| {
            let me = comm.rank();
            for (k, (d, cdt, unit, want)) in cases.iter().enumerate() {
                let us = d.size() * unit;
                let sent = |s: usize, p: usize| want[s][p].max(0) as usize;
                let ins: Vec<Vec<u8>> = (0..n)
                    .map(|s| {
                        input(
                            *d,
                            (0..n).map(|p| sent(s, p)).sum::<usize>() * unit,
                            k as u64,
                            s,
                            false,
                        )
                    })
                    .collect();
                let recv_total: usize = (0..n).map(|s| sent(s, me)).sum();
                let tail = 7 * us;
                let mut out = Aligned::poisoned(recv_total * us + tail);
                let send_c = Aligned::new(&encode(*cdt, &want[me]));
                let recv_c: Vec<i64> = (0..n).map(|s| want[s][me]).collect();
                let recv_c = Aligned::new(&encode(*cdt, &recv_c));
                let inbuf = Aligned::new(&ins[me]);
                comm.all_to_all_v_dynamic_packed(
                    view(*d, &inbuf.bytes()[..ins[me].len()]),
                    view_mut(*d, out.bytes_mut()),
                    PackedCounts {
                        send: view(*cdt, send_c.bytes()),
                        recv: view(*cdt, recv_c.bytes()),
                        unit: *unit,
                    },
                    &CallOpts::default(),
                )
                .unwrap();
                let mut expect = Vec::new();
                for (s, inp) in ins.iter().enumerate() {
                    let off: usize = (0..me).map(|p| sent(s, p)).sum();
                    expect.extend_from_slice(&inp[off * us..(off + sent(s, me)) * us]);
                }
                expect.resize(expect.len() + tail, POISON);
                assert_eq!(out.bytes(), &expect[..], "n={n} case {k} rank {me}");
            }
            // A unit of no elements, an output that is not whole units, float counts.
            let one = Aligned::new(&encode(DataType::I64, &vec![1; n]));
            let fone = Aligned::new(&vec![0u8; 4 * n]);
            let inp = Aligned::new(&input(DataType::F32, 4 * n, 1, me, false));
            let mut out = Aligned::poisoned(4 * 4 * n + 4);
            for (unit, out_len, cdt, what) in [
                (0, 4 * 4 * n, DataType::I64, "at least one element"),
                (4, 4 * 4 * n + 4, DataType::I64, "output's"),
                (1, 4 * 4 * n, DataType::F32, "must be i32"),
            ] {
                let counts = if cdt == DataType::F32 { &fone } else { &one };
                let e = comm
                    .all_to_all_v_dynamic_packed(
                        view(DataType::F32, inp.bytes()),
                        view_mut(DataType::F32, &mut out.bytes_mut()[..out_len]),
                        PackedCounts {
                            send: view(cdt, counts.bytes()),
                            recv: view(cdt, counts.bytes()),
                            unit,
                        },
                        &CallOpts::default(),
                    )
                    .unwrap_err();
                assert!(e.to_string().contains(what), "{e}");
            }
            assert!(out.bytes().iter().all(|&b| b == POISON));
            comm.barrier(&CallOpts::default()).unwrap();
        });
    }
}
