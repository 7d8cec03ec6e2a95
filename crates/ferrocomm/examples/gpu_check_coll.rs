//! Device correctness check of the direct-access all-gather, reduce-scatter, all-to-all(v),
//! broadcast, reduce, send/recv and device-count all-to-all-v (run on a GPU machine):
//!
//! ```text
//! ferrocomm launch -n 2 -- target/release/examples/gpu_check_coll [--quick] [--sanitize]
//! ```
//!
//! The cases are the device cases' bodies (`tests/cases/coll.rs`, which the host backend runs
//! in CI) on CUDA buffers: random data (never zeros), outputs poisoned before every call (and a
//! poisoned guard past the end that must stay untouched), every result compared with the
//! library's reference; sizes 0, odd, unaligned, up to 64 MB; every root; uneven all-to-all-v
//! counts with zeros; counts that disagree between ranks (`tests/cases/disagreeing.rs`). What only
//! a GPU checks is here: CUDA graph capture and replay, back-to-back mixed collectives, and the
//! packed form's faults (its verdict round). `--sanitize` runs only a small set of calls that reaches every kernel
//! form (see `sanitize_cases`), for compute-sanitizer (scripts/gpu_sanitize.sh). Exits 1 on any
//! wrong element.

use std::time::Instant;

use ferrocomm::{Algo, CallOpts, Communicator, Config, DataType, Input};

mod support;
use support::cases::coll::{self, Coll};
use support::cases::{gen_bytes_fast, Body};
use support::*;

/// The handful of cases run under compute-sanitizer (memcheck, racecheck): every direct-access
/// kernel at least once in each form it has. All-gather, all-to-all, reduce-scatter, broadcast
/// and reduce (roots 0 and the last rank), and at two ranks send/recv both ways, at an LL size and
/// a staged size, in and out of place, aligned and one element off; all-gather,
/// reduce-scatter and all-to-all (in and out of place) at a pipelined size; byte moves; every
/// reduction kernel (avg, prod, min, max on f32, f16, u32, i64); all-to-all-v with uneven counts
/// and a zero, in and out of place; device-count all-to-all-v with i32 and i64 counts, a
/// truncated part and the counts the kernel must not trust. Counts are odd throughout.
fn sanitize_cases(c: &mut Ctx) -> Res<()> {
    let ll_max = c.cfg.tuning.ll_max_bytes;
    let w = c.world;
    let mut seed = 60_000u64;
    let direct = Algo::Direct;
    // Elements per part: LL lines up to 8-byte elements, staged from 1-byte elements.
    let (n_ll, n_st) = (3001usize, 300_001usize);
    assert!(n_ll * 8 <= ll_max && n_st > ll_max);
    let mut colls = vec![
        Coll::AllGather,
        Coll::AllToAll,
        Coll::ReduceScatter(OpK::Sum),
        Coll::Broadcast(0),
        Coll::Broadcast(w - 1),
        Coll::Reduce(OpK::Sum, 0),
        Coll::Reduce(OpK::Sum, w - 1),
    ];
    // Direct point-to-point (two ranks): both directions.
    if w == 2 {
        colls.extend([Coll::SendRecv(0), Coll::SendRecv(w - 1)]);
    }
    for coll in colls {
        for (k, n) in [n_ll, n_st].into_iter().enumerate() {
            for in_place in [false, true] {
                seed += 1;
                let misalign = (k + in_place as usize) % 2;
                coll::run_one(c, coll, DataType::BF16, n, direct, in_place, misalign, seed)?;
            }
        }
    }
    // The pipelined kernels (from their smallest part): out of place one element off, in place.
    for (coll, kernel, in_place) in [
        (Coll::AllGather, "all_gather", false),
        (Coll::ReduceScatter(OpK::Sum), "reduce_scatter", true),
        (Coll::AllToAll, "all_to_all", false),
        (Coll::AllToAll, "all_to_all", true),
    ] {
        seed += 1;
        let n_rw = c.cfg.tuning.pipe_min(kernel).expect("pipelined") / 2 + 3;
        let misalign = !in_place as usize;
        coll::run_one(
            c,
            coll,
            DataType::BF16,
            n_rw,
            direct,
            in_place,
            misalign,
            seed,
        )?;
    }
    // Other element sizes: byte moves; every reduction kernel (sum with the division of avg,
    // prod, min, max) on 2-, 4- and 8-byte elements.
    for (k, n) in [n_ll, n_st].into_iter().enumerate() {
        for coll in [Coll::AllGather, Coll::AllToAll, Coll::Broadcast(w - 1)] {
            seed += 1;
            coll::run_one(c, coll, DataType::U8, n, direct, k == 1, 0, seed)?;
        }
        for (d, op) in [
            (DataType::F32, OpK::Avg),
            (DataType::F16, OpK::Prod),
            (DataType::U32, OpK::Min),
            (DataType::I64, OpK::Max),
        ] {
            for coll in [Coll::ReduceScatter(op), Coll::Reduce(op, w - 1)] {
                seed += 1;
                coll::run_one(c, coll, d, n, direct, k == 0, k, seed)?;
            }
        }
    }
    // Uneven counts: small and large parts, and rank 0 sends nothing to the last rank (in
    // place: to itself, as in-place counts must be symmetric).
    let counts = |zero: (usize, usize), sizes: [usize; 2], shift: usize| -> Vec<Vec<usize>> {
        (0..w)
            .map(|s| {
                (0..w)
                    .map(|r| match (s, r) == zero {
                        true => 0,
                        false => sizes[(s + r + shift) % 2],
                    })
                    .collect()
            })
            .collect()
    };
    let none = (w, w);
    let (bf, f32) = (DataType::BF16, DataType::F32);
    let uneven = counts((0, w - 1), [3001, 50_001], 0);
    coll::a2av_call(c, "sanitize", &uneven, bf, false, 1, direct, 61_001)?;
    let uneven0 = counts((0, 0), [3001, 50_001], 0);
    coll::a2av_call(c, "sanitize", &uneven0, f32, true, 0, direct, 61_002)?;
    // Small parts: the LL form at two ranks.
    let small = counts(none, [7, 1001], 0);
    coll::a2av_call(c, "sanitize LL", &small, bf, false, 1, direct, 61_003)?;
    coll::a2av_call(c, "sanitize LL", &small, f32, true, 0, direct, 61_004)?;
    // In pieces: a 1 MiB staging, crossing parts of 600 KB (two or more pieces at every world).
    let mut small_cfg = c.cfg.clone();
    small_cfg.cuda_staging_bytes = 1 << 20;
    let big = counts(none, [300_007, 3], 1);
    c.with_comm("gpu_check_coll_sanitize_pieces", small_cfg, |c| {
        coll::a2av_call(c, "sanitize pieces", &big, bf, false, 1, direct, 61_005)
    })?;
    let (i32_, i64_) = (DataType::I32, DataType::I64);
    let m = uneven;
    coll::dynamic_call(c, "sanitize", &m, 60_000, 1, bf, i32_, false, 62_001)?;
    coll::dynamic_call(
        c,
        "sanitize",
        &m,
        50_001,
        1,
        DataType::U8,
        i64_,
        false,
        62_002,
    )?;
    // Packed (both sides' counts on the device, the verdict round): rows of 3 bf16.
    coll::packed_call(c, "sanitize", &m, 3, bf, i32_, 62_005)?;
    // Rows of 3 bf16 (6 bytes): parts at every alignment.
    coll::dynamic_call(c, "sanitize rows", &m, 50_001, 3, bf, i64_, false, 62_004)?;
    // Every rank receives one part longer than the capacity: truncated, reported by the next
    // call; the other parts are short or empty.
    let cap = 3001;
    let m: Vec<Vec<usize>> = (0..w)
        .map(|s| {
            (0..w)
                .map(|r| match r == (s + 1) % w {
                    true => cap + 77,
                    false => [0, 7, 1001][(s + r) % 3],
                })
                .collect()
        })
        .collect();
    coll::dynamic_call(c, "sanitize", &m, cap, 1, f32, i32_, true, 62_003)?;
    coll::dynamic_faults(c)
}

/// The packed device-count all-to-all-v's faults, each made by one rank (counts that disagree
/// with a peer's, receive counts past its output, send counts past its input): what fits is
/// moved, nothing is written past the output, and the next call fails on every rank with a
/// message naming the fault (the kernels' verdict round); the call after it works.
fn packed_faults(c: &mut Ctx) -> Res<()> {
    let (w, me) = (c.world, c.rank);
    // Faults, each made by one rank; every rank's next call must fail naming it.
    let dtype = DataType::F32;
    for (k, fault) in ["disagree", "output", "input"].into_iter().enumerate() {
        let seed = 9800 + k as u64;
        let mut m = coll::splits_for(w, seed, 3000);
        for row in m.iter_mut() {
            for x in row.iter_mut() {
                *x += 1; // no zero parts: the faulty part always exists
            }
        }
        let bad = w - 1;
        let inputs: Vec<Vec<u8>> = (0..w)
            .map(|r| gen_bytes_fast(m[r].iter().sum::<usize>() * 4, seed, r))
            .collect();
        let mut send: Vec<i64> = m[me].iter().map(|&x| x as i64).collect();
        let mut recv: Vec<i64> = (0..w).map(|s| m[s][me] as i64).collect();
        let total: usize = (0..w).map(|s| m[s][me]).sum();
        let mut out_units = total;
        let needle = match fault {
            "disagree" => {
                if me == bad {
                    recv[0] += 1; // expects one more element from rank 0 than it sends
                    out_units += 1;
                }
                "differs from"
            }
            "output" => {
                if me == bad {
                    out_units -= 1;
                }
                "past its output"
            }
            _ => {
                if me == bad {
                    send[w - 1] += 7; // 7 elements past the end of its input
                }
                "past its input"
            }
        };
        let (r, _, guard) = coll::run_packed(
            c,
            &inputs[me],
            dtype,
            DataType::I64,
            &send,
            &recv,
            out_units,
            1,
        )?;
        c.record(
            "a2av_dynamic_packed_faults",
            format!("{fault} on rank {bad}: the call itself, {m:?}"),
            r,
            0,
            guard,
        );
        let next = [c.next_call()?, c.next_call()?];
        let t = c.tally.entry("bad_input".into()).or_default();
        t.cases += 1;
        // The faulty rank names its own fault; the others name the faulty rank's (or, for a
        // disagreement, the receiver's mismatch).
        let first_ok = match &next[0] {
            Err(e) => {
                let m = e.to_string();
                if me == bad || fault == "disagree" {
                    m.contains("disagree") || m.contains(needle) || m.contains("more than")
                } else {
                    m.contains(needle) && m.contains(&format!("rank {bad}"))
                }
            }
            Ok(()) => false,
        };
        if !first_ok || next[1].is_err() {
            t.errors += 1;
            c.failures
                .push(format!("packed fault {fault}: next calls gave {next:?}"));
        } else if me == 0 {
            println!(
                "packed fault {fault} reported: {}",
                next[0].as_ref().unwrap_err()
            );
        }
    }
    Ok(())
}

/// A mix of every collective (LL and staged sizes) captured once and replayed; then the same
/// mix back to back without synchronisation on the default stream.
fn graph_and_race(c: &mut Ctx) -> Res<()> {
    let replays = if c.quick { 10 } else { 50 };
    let (w, me, dev) = (c.world, c.rank, c.dev);
    let d = DataType::BF16;
    let es = 2;
    let mut plan: Vec<(Coll, usize)> = vec![
        (Coll::AllGather, 100),
        (Coll::ReduceScatter(OpK::Sum), 70_001),
        (Coll::AllToAll, 9),
        (Coll::Broadcast(w - 1), 300_000),
        (Coll::Reduce(OpK::Max, 0), 1234),
        (Coll::AllGather, 40_000),
        (Coll::AllToAll, 65_536),
        (Coll::Broadcast(0), 7),
        (Coll::ReduceScatter(OpK::Min), 5),
        (Coll::Reduce(OpK::Sum, w - 1), 200_000),
    ];
    if coll::has_p2p(&c.comm) {
        // Messages both ways, an LL size and a staged one.
        plan.extend([
            (Coll::SendRecv(0), 3001),
            (Coll::SendRecv(w - 1), 150_001),
            (Coll::SendRecv(w - 1), 17),
        ]);
    }
    let maxn = 300_000 * w;
    let inputs: Vec<Vec<u8>> = (0..w).map(|r| gen(d, maxn, 77, r, false)).collect();
    let inb = Buf::new(maxn * es)?;
    inb.upload(0, &inputs[me])?;
    let outs: Vec<Buf> = plan
        .iter()
        .map(|_| Buf::new(maxn * es))
        .collect::<Res<_>>()?;
    let issue = |comm: &Communicator, stream: u64| -> ferrocomm::Result<()> {
        for (k, (coll, n)) in plan.iter().enumerate() {
            let (in_n, out_n) = coll.lens(*n, w);
            // SAFETY: buffers of this device with room for every part; they outlive the work.
            let (i, o) = unsafe {
                (
                    inb.view(0, in_n, d, dev),
                    outs[k].view_mut(0, out_n, d, dev),
                )
            };
            coll.call(comm, Input::Buf(i), o, &CallOpts::on_stream(stream))?;
        }
        Ok(())
    };
    let verify = |c: &mut Ctx, key: &str| -> Res<()> {
        for (k, (coll, n)) in plan.iter().enumerate() {
            let len = coll.lens(*n, w).1;
            let got = outs[k].download(0, len * es)?;
            let Some(wrong) = coll.wrong(d, *n, me, &inputs, &got) else {
                continue;
            };
            let guard = outs[k].guard_hits(0, len * es)?;
            c.record(
                key,
                format!("{key} op {k} {coll:?} n={n}"),
                Ok(()),
                wrong,
                guard,
            );
        }
        Ok(())
    };
    // Graph.
    let stream = new_stream()?;
    // The buffers outlive the graph (dropped at the end of the statement).
    Graph::capture(stream, || Ok(issue(&c.comm, stream)?))?
        .replay_poisoned(stream, replays, &outs)?;
    verify(c, "graph")?;
    // Back to back, no sync, several rounds, default stream.
    for o in &outs {
        o.poison()?;
    }
    sync()?;
    let t0 = Instant::now();
    for _ in 0..20 {
        issue(&c.comm, 0)?;
    }
    sync()?;
    if c.rank == 0 {
        println!(
            "race: {} mixed calls back to back in {:.1} ms",
            20 * plan.len(),
            t0.elapsed().as_secs_f64() * 1e3
        );
    }
    verify(c, "race")
}

/// A root out of range (refused before anything runs) and calls whose counts differ between
/// ranks ([`disagreeing::collectives`]): clear errors, nothing hangs.
fn bad_input(c: &mut Ctx) -> Res<()> {
    let (w, b) = (c.world, Buf::new(64)?);
    // SAFETY: 10 f32 of this device's buffer; the call is refused before it touches them.
    let r = unsafe {
        c.comm.broadcast(
            Input::InPlace,
            b.view_mut(0, 10, DataType::F32, c.dev),
            w,
            &CallOpts::default(),
        )
    };
    let refused = matches!(r, Err(ferrocomm::Error::RankOutOfRange { .. }));
    c.expect("bad_input", refused, || {
        format!("broadcast root {w} gave {r:?}")
    });
    disagreeing::collectives(c)
}

fn main() {
    run_main("gpu_check_coll", real_main)
}

fn real_main() -> Res<i32> {
    // `--no-timing` is accepted (and means nothing here: no timing runs) so that every check
    // program takes the same flags.
    let args = flags(&["--quick", "--sanitize", "--no-timing"])?;
    let has = |f: &str| args.iter().any(|a| a == f);
    let mut cfg = Config::from_env()?;
    cfg.cuda_staging_bytes = cfg.cuda_staging_bytes.max(128 << 20);
    let t0 = Instant::now();
    let (mut c, _cuda) = gpu_ctx("gpu_check_coll", cfg, has("--quick"))?;
    if c.rank == 0 {
        let (backend, init) = (c.comm.backend_name(), t0.elapsed().as_secs_f64());
        println!(
            "gpu_check_coll: {} ranks, backend {backend}, init {init:.2} s",
            c.world
        );
    }
    let steps: Vec<(&str, Body)> = if has("--sanitize") {
        // Under compute-sanitizer kernels run 10-100x slower: a few calls of every kernel form.
        vec![("sanitize", sanitize_cases)]
    } else {
        let mut steps = coll::BODIES.to_vec();
        steps.extend([
            ("packed faults", packed_faults as Body),
            ("graph+race", graph_and_race),
            ("bad input", bad_input),
        ]);
        steps
    };
    run_bodies(&mut c, &steps)?;
    report(&c, "gpu_check_coll", "all results correct")
}
