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
//! counts with zeros. What only a GPU checks is here: CUDA graph capture and replay, back-to-back
//! mixed collectives, and faults the kernels find on the device (disagreeing counts, the packed
//! form's verdict round). `--sanitize` runs only a small set of calls that reaches every kernel
//! form (see `sanitize_cases`), for compute-sanitizer (scripts/gpu_sanitize.sh). Exits 1 on any
//! wrong element.

use std::time::{Duration, Instant};

use ferrocomm::bootstrap::store_barrier;
use ferrocomm::ViewMut;
use ferrocomm::{Algo, CallOpts, Communicator, Config, DataType, Device, Input, Splits, View};

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

/// Disagreeing counts and roots out of range: clear errors, nothing hangs.
fn bad_input(c: &mut Ctx) -> Res<()> {
    let cfg = &c.cfg;
    let w = c.world;
    let me = c.rank;
    let dev = c.dev;
    let b = Buf::new(4 << 20)?;
    let mut ok = 0;
    let mut total = 0;
    // Root out of range: refused before anything runs.
    // SAFETY: 4 MiB of this device.
    let r = unsafe {
        c.comm.broadcast(
            Input::InPlace,
            ViewMut::from_raw(b.ptr as *mut u8, 10, DataType::F32, dev),
            w,
            &CallOpts::default(),
        )
    };
    total += 1;
    if matches!(r, Err(ferrocomm::Error::RankOutOfRange { .. })) {
        ok += 1;
    } else {
        c.failures.push(format!("broadcast root {w} gave {r:?}"));
    }
    // Calls whose counts differ between ranks (LL and staged sizes), on a separate
    // communicator: the next call on it must report "disagrees between ranks" on every rank.
    let mut cfg2: Config = cfg.clone();
    cfg2.timeout = Duration::from_secs(3);
    let comm = comm_with("gpu_check_coll_bad", cfg2)?;
    let p = b.ptr;
    type BadCall = (String, Box<dyn Fn(&Communicator) -> ferrocomm::Result<()>>);
    let mut cases: Vec<BadCall> = Vec::new();
    for n in [100usize, 60_000, 120_000] {
        // Rank r gathers n + r elements.
        let call = move |comm: &Communicator| {
            // SAFETY: 4 MiB of this device is enough for w * 120_003 f32.
            unsafe {
                let o = ViewMut::from_raw(p as *mut u8, (n + me) * w, DataType::F32, dev);
                comm.all_gather(
                    Input::InPlace,
                    o,
                    &CallOpts::default().with_algo(Algo::Direct),
                )
            }
        };
        cases.push((format!("all_gather, {n} + rank elements"), Box::new(call)));
    }
    for n in [100usize, 60_000, 120_000] {
        if w != 2 {
            break;
        }
        // All-to-all-v: rank 1 expects one element more than rank 0 sends.
        let call = move |comm: &Communicator| {
            let splits = Splits::packed(
                if me == 0 { vec![5, n] } else { vec![n, 5] },
                if me == 0 { vec![5, n] } else { vec![n + 1, 5] },
            );
            let half = 2 << 20;
            // SAFETY: 4 MiB of this device: the input (n + 5 f32) below half of it, the
            // output (n + 6) above.
            unsafe {
                let i = View::from_raw(p as *const u8, n + 5, DataType::F32, dev);
                let o = ViewMut::from_raw((p + half) as *mut u8, n + 6, DataType::F32, dev);
                let opts = CallOpts::default().with_algo(Algo::Direct);
                comm.all_to_all_v(Input::Buf(i), o, &splits, &opts)
            }
        };
        cases.push((format!("all_to_all_v, {n} elements"), Box::new(call)));
    }
    for n in [100usize, 60_000, 120_000] {
        if w == 2 {
            break;
        }
        // More ranks: 5 elements between any two ranks, but rank 0 sends n to rank 1, which
        // expects n + 1. Only rank 1 sees both counts; the kernel's verdict words carry what it
        // found to every rank, so every rank reports it.
        let call = move |comm: &Communicator| {
            let send: Vec<usize> = (0..w)
                .map(|q| if me == 0 && q == 1 { n } else { 5 })
                .collect();
            let recv: Vec<usize> = (0..w)
                .map(|s| if me == 1 && s == 0 { n + 1 } else { 5 })
                .collect();
            let (ni, no) = (send.iter().sum(), recv.iter().sum());
            let splits = Splits::packed(send, recv);
            let half = 2 << 20;
            // SAFETY: 4 MiB of this device: the input (at most n + 5 * w f32) below half of
            // it, the output (at most n + 1 + 5 * w) above.
            unsafe {
                let i = View::from_raw(p as *const u8, ni, DataType::F32, dev);
                let o = ViewMut::from_raw((p + half) as *mut u8, no, DataType::F32, dev);
                let opts = CallOpts::default().with_algo(Algo::Direct);
                comm.all_to_all_v(Input::Buf(i), o, &splits, &opts)
            }
        };
        cases.push((
            format!("all_to_all_v, {n} elements, {w} ranks"),
            Box::new(call),
        ));
    }
    for n in [100usize, 60_000, 120_000] {
        if w != 2 {
            break;
        }
        // Both ranks send at once (each a root of its own message), then a receive one
        // element longer than its send.
        let both_send = move |comm: &Communicator| {
            // SAFETY: 4 MiB of this device holds 120_000 f32.
            unsafe {
                let i = View::from_raw(p as *const u8, n, DataType::F32, dev);
                let opts = CallOpts::default().with_algo(Algo::Direct);
                comm.send(i, 1 - me, &opts)
            }
        };
        cases.push((
            format!("send on both ranks, {n} elements"),
            Box::new(both_send),
        ));
        let longer = move |comm: &Communicator| {
            let opts = CallOpts::default().with_algo(Algo::Direct);
            // SAFETY: as above, n + 1 f32.
            unsafe {
                if me == 0 {
                    comm.send(
                        View::from_raw(p as *const u8, n, DataType::F32, dev),
                        1,
                        &opts,
                    )
                } else {
                    let o = ViewMut::from_raw(p as *mut u8, n + 1, DataType::F32, dev);
                    comm.recv(o, 0, &opts)
                }
            }
        };
        cases.push((format!("recv of {n} + 1 elements"), Box::new(longer)));
    }
    for (k, (what, call)) in cases.iter().enumerate() {
        let first = call(&comm);
        sync()?;
        // SAFETY: as above.
        let next = unsafe {
            comm.all_gather(
                Input::InPlace,
                ViewMut::from_raw(p as *mut u8, 4 * w, DataType::F32, dev),
                &CallOpts::default(),
            )
        };
        sync()?;
        total += 1;
        let shown = format!("{next:?}");
        // "disagrees between ranks" where the rank saw it, "counts disagree between ranks"
        // where a peer did (all-to-all-v above two ranks).
        if first.is_ok() && shown.contains("disagree") && shown.contains("between ranks") {
            ok += 1;
            if me == 0 {
                println!("mismatch {k} ({what}): {shown}");
            }
        } else {
            c.failures.push(format!(
                "count mismatch {k} ({what}) not reported: {first:?} then {shown}"
            ));
        }
        if shown.contains("Timeout") {
            break; // a timeout is sticky: the communicator is done
        }
    }
    std::mem::forget(comm);
    let t = c.tally.entry("bad_input".into()).or_default();
    t.cases += total;
    t.errors += total - ok;
    Ok(())
}

fn main() {
    run_main("gpu_check_coll", real_main)
}

fn real_main() -> Res<i32> {
    // `--no-timing` is accepted (and means nothing here: no timing runs) so that every check
    // program takes the same flags.
    let args = flags(&["--quick", "--sanitize", "--no-timing"])?;
    let quick = args.iter().any(|a| a == "--quick");
    let sanitize = args.iter().any(|a| a == "--sanitize");
    let mut cfg = Config::from_env()?;
    cfg.cuda_staging_bytes = cfg.cuda_staging_bytes.max(128 << 20);
    let t0 = Instant::now();
    let comm = comm_with("gpu_check_coll", cfg.clone())?;
    let (rank, world) = (comm.rank(), comm.size());
    let Device::Cuda(ord) = comm.device() else {
        return Err("gpu_check_coll needs a GPU".into());
    };
    if rank == 0 {
        println!(
            "gpu_check_coll: {world} ranks, backend {}, init {:.2} s",
            comm.backend_name(),
            t0.elapsed().as_secs_f64()
        );
    }
    let cuda = cudarc::driver::CudaContext::new(ord as usize)?;
    cuda.bind_to_thread()?;
    // The guard bands are read back after every call: first, that the read-back sees writes.
    Buf::guard_self_check(Device::Cuda(ord))?;
    let mut c = cuda_ctx(comm, cfg, quick);
    let steps: Vec<(&str, Body)> = if sanitize {
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
    for (name, f) in steps {
        let t = Instant::now();
        f(&mut c)?;
        store_barrier(
            &**c.comm.store(),
            &format!("step/{name}"),
            world,
            Duration::from_secs(120),
        )?;
        if rank == 0 {
            println!("{name} done in {:.1} s", t.elapsed().as_secs_f64());
        }
    }
    report(&c, "gpu_check_coll", "all results correct")
}
