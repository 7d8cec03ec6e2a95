//! Device correctness and timing check of the cuda backend's all-reduce (run on a GPU machine):
//!
//! ```text
//! ferrocomm launch -n 2 -- target/release/examples/gpu_check [--quick] [--no-timing] [--full-timing] [--sanitize]
//! ```
//!
//! The correctness cases are the device cases' bodies (`tests/cases/all_reduce.rs`, which the
//! host backend runs in CI) on CUDA buffers: every result compared element by element with the
//! library's reference on random data (never zeros), outputs poisoned before each call and read
//! back around the result (a byte changed before it, after it or in the guard band past the
//! buffer is a write out of bounds), its hash compared across ranks (bit-identical results);
//! so are the all-reduce calls that disagree between ranks (`tests/cases/disagreeing.rs`).
//! What only a GPU checks is here: back-to-back races, CUDA graph replays, foreign pointers,
//! barriers and timeouts, NCCL's watchdog, the timing table.
//! Exits 1 on any wrong element or guard byte.

use std::time::{Duration, Instant};

use cudarc::driver::sys;
use ferrocomm::bootstrap::{all_gather_bytes, store_barrier};
use ferrocomm::{
    Algo, CallOpts, Communicator, Config, DataType, Device, Input, ReduceOp, View, ViewMut,
};
use rand::{Rng, SeedableRng};

mod support;
use support::cases::all_reduce::{self, run_case, Case};
use support::cases::coll::{self, Coll};
use support::*;

/// A sum in place over `n` f32 of `b`, a buffer of `dev`.
fn sum_in_place(
    comm: &Communicator,
    b: &Buf,
    n: usize,
    dev: Device,
    opts: &CallOpts,
) -> ferrocomm::Result<()> {
    assert!(n * 4 <= b.bytes);
    // SAFETY: `n` f32 of a buffer of this device (asserted), alive until after the caller's
    // synchronisation.
    let o = unsafe { b.view_mut(0, n, DataType::F32, dev) };
    comm.all_reduce(Input::InPlace, o, ReduceOp::Sum, opts)
}

const ALGOS: [Algo; 5] = [Algo::Push, Algo::Flat, Algo::Tree, Algo::Nccl, Algo::Auto];

/// The algorithms a case list runs here: all of [`ALGOS`], less NCCL under `--share-gpus`.
fn algos() -> Vec<Algo> {
    ALGOS
        .into_iter()
        .filter(|&a| a != Algo::Nccl || !shared_gpus())
        .collect()
}

/// The handful of cases run under compute-sanitizer (memcheck, racecheck).
fn sanitize_cases(c: &mut Ctx) -> Res<()> {
    let mut seed = 40_000u64;
    for d in [DataType::F32, DataType::BF16] {
        for (k, &n) in [1usize, 33, 4097, 70_001].iter().enumerate() {
            for algo in algos() {
                seed += 1;
                let cs = Case {
                    in_place: k % 2 == 0,
                    misalign: k % 2,
                    ..Case::sum(d, n, algo)
                };
                run_case(c, None, &cs, seed, 0)?;
            }
        }
    }
    Ok(())
}

/// Many back-to-back calls with varying sizes and algorithms, no sync in between.
fn race(c: &mut Ctx) -> Res<()> {
    let calls = if c.quick { 300 } else { 10_000 };
    let d = DataType::BF16;
    let es = d.size();
    let max_n = 70_000usize;
    let mut rng = rand::rngs::StdRng::seed_from_u64(4242);
    let plan: Vec<(usize, Algo)> = (0..calls)
        .map(|_| {
            let n = rng.random_range(1..max_n);
            // NCCL is the last: under --share-gpus the draw leaves it out.
            let a = [Algo::Push, Algo::Flat, Algo::Tree, Algo::Auto, Algo::Nccl]
                [rng.random_range(0..if shared_gpus() { 4 } else { 5 })];
            (n, a)
        })
        .collect();
    let inputs: Vec<Vec<u8>> = (0..c.world).map(|r| gen(d, max_n, 777, r, false)).collect();
    let inb = Buf::new(max_n * es)?;
    inb.upload(0, &inputs[c.rank])?;
    let outs: Vec<Buf> = (0..calls)
        .map(|_| Buf::new(max_n * es))
        .collect::<Res<_>>()?;
    for o in &outs {
        o.poison()?;
    }
    sync()?;
    let dev = c.dev;
    let t0 = Instant::now();
    for (k, (n, a)) in plan.iter().enumerate() {
        // SAFETY: buffers of this device, large enough, alive until the sync below.
        unsafe {
            let i = View::from_raw(inb.ptr as *const u8, *n, d, dev);
            let o = ViewMut::from_raw(outs[k].ptr as *mut u8, *n, d, dev);
            c.comm.all_reduce(
                Input::Buf(i),
                o,
                ReduceOp::Sum,
                &CallOpts::default().with_algo(*a),
            )?;
        }
    }
    sync()?;
    let el = t0.elapsed();
    let key = "race ".to_string();
    let (wrong_total, guard_total) = check_outputs(c, "race call", &plan, &outs, &inputs)?;
    let t = c.tally.entry(key).or_default();
    t.cases += calls;
    t.wrong += wrong_total;
    t.guard += guard_total;
    if c.rank == 0 {
        println!(
            "race: {calls} back-to-back calls in {:.1} ms",
            el.as_secs_f64() * 1e3
        );
    }
    Ok(())
}

/// Stream capture of a mix of algorithms, replayed many times.
fn graph(c: &mut Ctx) -> Res<()> {
    let replays = if c.quick { 20 } else { 1_000 };
    let d = DataType::BF16;
    let es = d.size();
    let plan: [(usize, Algo); 8] = [
        (512, Algo::Push),
        (3000, Algo::Flat),
        (70001, Algo::Tree),
        (8, Algo::Push),
        (200_000, Algo::Flat),
        (65536, Algo::Auto),
        (5, Algo::Tree),
        (
            1024,
            if shared_gpus() {
                Algo::Auto
            } else {
                Algo::Nccl
            },
        ),
    ];
    let max_n = 200_000;
    let inputs: Vec<Vec<u8>> = (0..c.world).map(|r| gen(d, max_n, 99, r, false)).collect();
    let inb = Buf::new(max_n * es)?;
    inb.upload(0, &inputs[c.rank])?;
    let outs: Vec<Buf> = plan
        .iter()
        .map(|_| Buf::new(max_n * es))
        .collect::<Res<_>>()?;
    let stream = new_stream()?;
    let dev = c.dev;
    let issue = || -> Res<()> {
        for (k, (n, a)) in plan.iter().enumerate() {
            // SAFETY: buffers of this device with room for `n`; they outlive the graph.
            let (i, o) = unsafe { (inb.view(0, *n, d, dev), outs[k].view_mut(0, *n, d, dev)) };
            let opts = CallOpts::on_stream(stream).with_algo(*a);
            c.comm.all_reduce(Input::Buf(i), o, ReduceOp::Sum, &opts)?;
        }
        Ok(())
    };
    Graph::capture(stream, issue)?.replay_poisoned(stream, replays, &outs)?;
    let (wrong_total, guard_total) = check_outputs(c, "graph op", &plan, &outs, &inputs)?;
    let t = c.tally.entry("graph".into()).or_default();
    t.cases += plan.len() * replays;
    t.wrong += wrong_total;
    t.guard += guard_total;
    Ok(())
}

/// Checks the bf16 sums `outs[k]` of calls `plan[k]` (count, algorithm) against the inputs'
/// first elements, and the bytes around them (poisoned before): failures named `what k`;
/// returns (wrong elements, bytes written outside the outputs).
fn check_outputs(
    c: &mut Ctx,
    what: &str,
    plan: &[(usize, Algo)],
    outs: &[Buf],
    inputs: &[Vec<u8>],
) -> Res<(usize, usize)> {
    let d = DataType::BF16;
    let es = d.size();
    let (mut wrong_total, mut guard_total) = (0, 0);
    for (k, (n, a)) in plan.iter().enumerate() {
        let mut got = vec![0u8; n * es];
        outs[k].download_into(0, &mut got)?;
        let ins: Vec<Vec<u8>> = inputs.iter().map(|v| v[..n * es].to_vec()).collect();
        let parts: Vec<&[u8]> = ins.iter().map(|v| &v[..]).collect();
        let (w, first) = check_reduce(d, OpK::Sum, &parts, &got);
        let g = outs[k].guard_hits(0, n * es)?;
        if w > 0 || g > 0 {
            c.failures.push(format!(
                "{what} {k} ({a}, n={n}): {w} wrong ({first}), {g} bytes written outside the \
                 output"
            ));
        }
        wrong_total += w;
        guard_total += g;
    }
    Ok((wrong_total, guard_total))
}

/// Memory of another GPU, and host memory, passed as this GPU's: every rank makes the same
/// calls and each is refused before anything is launched, with an error naming the pointer's
/// device (or saying it is not device memory); the communicator works afterwards.
fn foreign_pointers(c: &mut Ctx) -> Res<()> {
    let mut ndev = 0i32;
    cu(
        // SAFETY: out-parameter.
        unsafe { sys::cuDeviceGetCount(&mut ndev) },
        "cuDeviceGetCount",
    )?;
    let (dev, Device::Cuda(ord)) = (c.dev, c.dev) else {
        unreachable!("gpu_check runs on a GPU")
    };
    let n = 4096usize;
    let mut cases: Vec<(String, u64, &str)> = Vec::new();
    let host = vec![0u8; n * 4 + 64];
    cases.push((
        "host memory".into(),
        host.as_ptr() as u64,
        "not CUDA device memory",
    ));
    let other = (ord as i32 + 1) % ndev.max(1);
    // This GPU's context, bound again after each visit to the other GPU's.
    let own = cudarc::driver::CudaContext::new(ord as usize)?;
    let foreign = if other != ord as i32 {
        let ctx = cudarc::driver::CudaContext::new(other as usize)?;
        let b = Buf::new(n * 4)?;
        own.bind_to_thread()?;
        Some((ctx, b))
    } else {
        None
    };
    let want_other = format!("memory of cuda:{other}");
    if let Some((_, b)) = &foreign {
        cases.push((format!("memory of cuda:{other}"), b.ptr, &want_other));
    }
    let t = c.tally.entry("foreign_ptr".into()).or_default();
    for (what, ptr, want) in &cases {
        t.cases += 1;
        // SAFETY: the call must refuse before touching `ptr` (that is what is checked); `ptr`
        // holds n f32 in either case.
        let r = unsafe {
            c.comm.all_reduce(
                Input::InPlace,
                ViewMut::from_raw(*ptr as *mut u8, n, DataType::F32, dev),
                ReduceOp::Sum,
                &CallOpts::default(),
            )
        };
        match r {
            Err(e) if e.to_string().contains(want) => {
                if c.rank == 0 {
                    println!("{what} refused: {e}");
                }
            }
            other => {
                t.errors += 1;
                c.failures
                    .push(format!("{what} passed as cuda:{ord}: {other:?}"));
            }
        }
    }
    if let Some((ctx, b)) = foreign {
        ctx.bind_to_thread()?;
        drop(b);
        // Dropping a context binds it to the thread first (and this one is then destroyed), so
        // it goes before this GPU's context is bound again.
        drop(ctx);
        own.bind_to_thread()?;
    }
    // The communicator still works.
    let cs = Case::sum(DataType::F32, 777, Algo::Auto);
    run_case(c, None, &cs, 40_000, 0)
}

/// The other collectives on the main communicator (NCCL's where it has it), f32, 1001 elements
/// per part, out of place: broadcast, reduce and reduce-scatter (max), all-gather, all-to-all,
/// and at two ranks with NCCL send/recv.
fn others(c: &mut Ctx) -> Res<()> {
    let w = c.world;
    let mut colls = vec![
        Coll::Broadcast(1 % w),
        Coll::Reduce(OpK::Max, 0),
        Coll::AllGather,
        Coll::ReduceScatter(OpK::Max),
        Coll::AllToAll,
    ];
    // Point to point goes through NCCL, which ranks sharing a GPU run without.
    if w == 2 && !shared_gpus() {
        colls.push(Coll::SendRecv(0));
    }
    for (k, coll) in colls.into_iter().enumerate() {
        coll::run_one(
            c,
            coll,
            DataType::F32,
            1001,
            Algo::Auto,
            false,
            0,
            45_000 + k as u64,
        )?;
    }
    c.comm.barrier(&CallOpts::default())?;
    Ok(())
}

/// Records a failure when anything was written past the end of `b` (its guard band, poisoned
/// before `b` was filled): the buffer of fault cases, whose contents are not checked.
fn check_band(c: &mut Ctx, what: &str, b: &Buf) -> Res<()> {
    let hits = b.guard_hits(0, b.bytes)?;
    if hits > 0 {
        c.tally.entry(what.into()).or_default().guard += hits;
        c.failures
            .push(format!("{what}: {hits} bytes written past the buffer"));
    }
    Ok(())
}

/// Ends a group of cases on a communicator of their own: every rank waits for the others, then
/// leaves the communicator unfreed (after a timeout it is unusable, and a kernel that gave up
/// may have left work on its stream).
fn retire(c: &Ctx, tag: &str, comm: Communicator) -> Res<()> {
    store_barrier(&**c.comm.store(), tag, c.world, Duration::from_secs(120))?;
    std::mem::forget(comm);
    Ok(())
}

/// The backend's barrier: it waits for the last rank (rank 0 arrives 0.3 s late, everyone else
/// must wait that long), and a rank that never comes makes it fail with a timeout naming a
/// missing rank instead of hanging.
fn barrier_checks(c: &mut Ctx) -> Res<()> {
    let (rank, world) = (c.rank, c.world);
    let late = Duration::from_millis(300);
    let o = CallOpts::default();
    c.comm.barrier(&o)?;
    if rank == 0 {
        std::thread::sleep(late);
    }
    let t = Instant::now();
    let r = c.comm.barrier(&o);
    let waited = t.elapsed();
    let tally = c.tally.entry("barrier".into()).or_default();
    tally.cases += 1;
    match r {
        Err(e) => {
            tally.errors += 1;
            c.failures.push(format!("barrier: {e}"));
        }
        Ok(()) if rank != 0 && waited < late - Duration::from_millis(50) => {
            tally.errors += 1;
            c.failures.push(format!(
                "barrier returned after {:.3} s, before rank 0 (0.3 s late) arrived",
                waited.as_secs_f64()
            ));
        }
        Ok(()) => {}
    }

    let mut cfg_t = c.cfg.clone();
    cfg_t.timeout = Duration::from_secs(2);
    let comm = Communicator::new(options("gpu_check_barrier_timeout", cfg_t.clone()))?;
    let last = world - 1;
    if rank == last {
        let t = Instant::now();
        let r = comm.barrier(&o);
        let tally = c.tally.entry("barrier".into()).or_default();
        tally.cases += 1;
        match r {
            Err(ferrocomm::Error::Timeout { missing, .. }) if missing != last => println!(
                "barrier alone: timeout after {:.2} s naming rank {missing}",
                t.elapsed().as_secs_f64()
            ),
            other => {
                tally.errors += 1;
                c.failures
                    .push(format!("a barrier no other rank joined returned {other:?}"));
            }
        }
    }
    // The lone rank's communicator is unusable; the others never ran a kernel on it.
    retire(c, "barrier-timeout-done", comm)?;

    // A 4 MB flat all-reduce no other rank joins (by the copy engines when
    // FERROCOMM_ALLREDUCE_CE_MIN_BYTES says so: its gate passes, its copies land in the idle
    // peer, its reduction waits for chunks that never come; in LL128 lines under
    // FERROCOMM_ALLREDUCE_LL128_MAX_BYTES: its fold waits for lines that never come): the next
    // call names a missing rank after the 2 s timeout instead of waiting.
    let comm = Communicator::new(options("gpu_check_flat_timeout", cfg_t))?;
    if rank == last {
        let n = 1 << 20;
        let b = Buf::new(4 * n)?;
        b.poison()?;
        b.upload(0, &gen(DataType::F32, n, 78, rank, false))?;
        let t = Instant::now();
        let first = sum_in_place(&comm, &b, n, c.dev, &o.clone().with_algo(Algo::Flat));
        sync()?;
        let next = comm.barrier(&o);
        let tally = c.tally.entry("flat-timeout".into()).or_default();
        tally.cases += 1;
        match (first, next) {
            (Ok(()), Err(ferrocomm::Error::Timeout { missing, .. })) if missing != last => {
                println!(
                    "flat all_reduce alone: timeout after {:.2} s naming rank {missing}",
                    t.elapsed().as_secs_f64()
                )
            }
            other => {
                tally.errors += 1;
                c.failures.push(format!(
                    "a flat all_reduce no other rank joined, then a barrier: {other:?}"
                ));
            }
        }
        check_band(c, "flat-timeout", &b)?;
    }
    retire(c, "flat-timeout-done", comm)
}

// ---------------------------------------------------------------- timing

fn timing(c: &mut Ctx, quick: bool) -> Res<()> {
    let d = DataType::BF16;
    let sizes: Vec<usize> = if quick {
        vec![1 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20]
    } else {
        vec![
            1 << 10,
            4 << 10,
            16 << 10,
            64 << 10,
            256 << 10,
            512 << 10,
            1 << 20,
            4 << 20,
            16 << 20,
            64 << 20,
            256 << 20,
        ]
    };
    let per_graph = 10;
    let replays = 20;
    let stream = new_stream()?;
    let buf = Buf::new(256 << 20)?;
    buf.poison()?;
    let init = gen(d, 1 << 20, 5, c.rank, false);
    for k in 0..128 {
        buf.upload(k * init.len(), &init)?;
    }
    sync()?;
    let dev = c.dev;
    let mut rows = Vec::new();
    for &b in &sizes {
        let n = b / d.size();
        let mut row = vec![format!("{b:>10}")];
        let mut nccl_us = f64::NAN;
        let mut best = (f64::INFINITY, "");
        for algo in [Algo::Nccl, Algo::Push, Algo::Flat, Algo::Tree, Algo::Auto] {
            if algo == Algo::Push && b > (512 << 10) {
                row.push(format!("{:>9}", "-"));
                continue;
            }
            store_barrier(
                &**c.comm.store(),
                &format!("t/{b}/{}", algo.name()),
                c.world,
                Duration::from_secs(120),
            )?;
            let issue = || -> Res<()> {
                for _ in 0..per_graph {
                    // SAFETY: `n` elements of this device's buffer, which outlives the graph.
                    let o = unsafe { buf.view_mut(0, n, d, dev) };
                    // Sum of in-place repeated sums grows; Max keeps values bounded and does the
                    // same work.
                    let opts = CallOpts::on_stream(stream).with_algo(algo);
                    c.comm
                        .all_reduce(Input::InPlace, o, ReduceOp::Max, &opts)
                        .map_err(|e| format!("timing {b} {algo}: {e}"))?;
                }
                Ok(())
            };
            let graph = Graph::capture(stream, issue)?;
            for _ in 0..3 {
                graph.launch(stream)?;
            }
            stream_sync(stream)?;
            let us = time_us(stream, || {
                (0..replays).try_for_each(|_| graph.launch(stream))
            })? / (per_graph * replays) as f64;
            if algo == Algo::Nccl {
                nccl_us = us;
            } else if algo != Algo::Auto && us < best.0 {
                best = (us, algo.name());
            }
            row.push(format!("{us:>9.2}"));
        }
        let auto_algo = c
            .comm
            .algo_for(ferrocomm::Collective::AllReduce, b, d, &CallOpts::default())?
            .algo;
        row.push(format!("{:>6}", auto_algo.name()));
        row.push(format!("{:>6}", best.1));
        row.push(format!("{:>6.2}x", nccl_us / best.0));
        rows.push(row.join(" "));
    }
    // The timed calls' values are not checked, but none may write past the buffer.
    check_band(c, "timing", &buf)?;
    if c.rank == 0 {
        println!("\nall_reduce bf16 (max), {per_graph} ops per CUDA graph x {replays} replays, us per op (rank 0)");
        println!(
            "{:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6} {:>6} {:>7}",
            "bytes", "nccl", "push", "flat", "tree", "auto", "auto=", "best", "nccl/best"
        );
        for r in rows {
            println!("{r}");
        }
    }
    Ok(())
}

/// Microseconds the work `launch` enqueues on `stream` takes, by events around it.
fn time_us(stream: u64, launch: impl FnOnce() -> Res<()>) -> Res<f64> {
    let s = stream as sys::CUstream;
    let mut ev: [sys::CUevent; 2] = [std::ptr::null_mut(); 2];
    for e in &mut ev {
        // SAFETY: out-parameter.
        cu(unsafe { sys::cuEventCreate(e, 0) }, "cuEventCreate")?;
    }
    let mut ms = 0f32;
    // SAFETY: events of this context recorded on a stream of it, destroyed once below.
    let r = unsafe {
        cu(sys::cuEventRecord(ev[0], s), "cuEventRecord")
            .and_then(|()| launch())
            .and_then(|()| cu(sys::cuEventRecord(ev[1], s), "cuEventRecord"))
            .and_then(|()| cu(sys::cuEventSynchronize(ev[1]), "cuEventSynchronize"))
            .and_then(|()| cu(sys::cuEventElapsedTime_v2(&mut ms, ev[0], ev[1]), "elapsed"))
    };
    for e in ev {
        // SAFETY: created above.
        unsafe { sys::cuEventDestroy_v2(e) };
    }
    r.map(|()| ms as f64 * 1e3)
}

// ---------------------------------------------------------------- main

/// NCCL with a peer that never arrives. NCCL's kernels have no timeout of their own: the
/// communicator's watchdog aborts it once the operation has been pending for config.timeout,
/// NCCL's kernels exit, the stream drains, and the next call reports NCCL and the timeout. A first
/// call on both ranks connects NCCL's channels for this size, so that rank 0's second call is
/// really enqueued and hangs on the device; had it still needed its connections, it would wait
/// in ncclInProgress and the call itself would report the timeout (accepted too).
fn nccl_timeout(c: &mut Ctx) -> Res<()> {
    let cfg = c.cfg.clone();
    let (rank, world, dev) = (c.rank, c.world, c.dev);
    let mut cfg_n = cfg.clone();
    cfg_n.timeout = Duration::from_secs(3);
    let limit = cfg_n.timeout + Duration::from_secs(10);
    let o6 = options("gpu_check_nccl_timeout", cfg_n);
    // NCCL's own initialisation now has the 3 s deadline too: if it is that slow here, every
    // rank learns it and the case is reported instead of desynchronising the ranks.
    let comm6 = Communicator::new(o6);
    let all_up = all_gather_bytes(
        &**c.comm.store(),
        "nccl-timeout-init",
        rank,
        world,
        &[comm6.is_ok() as u8],
        Duration::from_secs(120),
    )?
    .iter()
    .all(|v| v[0] == 1);
    let comm6 = match comm6 {
        Ok(cm) if all_up => cm,
        other => {
            c.failures.push(format!(
                "nccl timeout check: a communicator with a 3 s timeout did not come up on every \
                 rank (here: {})",
                other.err().map_or("up".to_string(), |e| e.to_string())
            ));
            return Ok(());
        }
    };
    let n6 = (1 << 20) / 4; // 1 MiB of f32
    let warm = Case::sum(DataType::F32, n6, Algo::Nccl);
    run_case(c, Some(&comm6), &warm, 40_000, 0)?;
    if rank == 0 {
        // Rank 1 skips this call: it never enqueues its part.
        let b = Buf::new(n6 * 4)?;
        b.poison()?;
        b.upload(0, &gen(DataType::F32, n6, 40_001, 0, false))?;
        let nccl_opts = CallOpts::default().with_algo(Algo::Nccl);
        let call = || sum_in_place(&comm6, &b, n6, dev, &nccl_opts);
        let t = Instant::now();
        let first = call();
        // Returns once the watchdog has aborted the communicator.
        let synced = sync();
        let waited = t.elapsed();
        let second = call();
        let msg = match (&first, &second) {
            (Err(e), _) | (Ok(()), Err(e)) => e.to_string(),
            (Ok(()), Ok(())) => String::new(),
        };
        let named = msg.contains("NCCL") && msg.contains("timeout");
        if synced.is_ok() && waited <= limit && named {
            println!(
                "nccl timeout: the stream drained after {:.2} s; next call: {msg}",
                waited.as_secs_f64()
            );
        } else {
            c.failures.push(format!(
                "nccl timeout check: sync {synced:?} after {:.2} s (limit {} s); first \
                 {first:?}; second {second:?}",
                waited.as_secs_f64(),
                limit.as_secs()
            ));
        }
        check_band(c, "nccl-timeout", &b)?;
    }
    // Rank 1 keeps its communicator until rank 0 is done: dropping it earlier could give rank 0
    // a remote error instead of the timeout being tested.
    store_barrier(
        &**c.comm.store(),
        "nccl-timeout-done",
        world,
        Duration::from_secs(120),
    )?;
    // Rank 0's communicator is aborted (its drop frees nothing more). Rank 1's never had work
    // hang: its drop finalizes it and, if its peer's abort makes that fail or it does not
    // complete within the timeout, aborts it; either way the drop is bounded.
    let t = Instant::now();
    drop(comm6);
    if t.elapsed() > limit {
        c.failures.push(format!(
            "nccl timeout check: dropping the communicator took {:.2} s (limit {} s)",
            t.elapsed().as_secs_f64(),
            limit.as_secs()
        ));
    }
    // Both ranks go on with a fresh communicator (the default timeout).
    let o7 = options("gpu_check_nccl_after_timeout", cfg.clone());
    let comm7 = Communicator::new(o7)?;
    let after = Case {
        count: n6 + 3,
        ..warm
    };
    run_case(c, Some(&comm7), &after, 40_002, 0)
}

/// Two hosts of one GPU each, simulated: NCCL must carry everything, and a forced flat
/// all-reduce is refused.
fn two_hosts(c: &mut Ctx) -> Res<()> {
    let mut o = options("gpu_check_2hosts", c.cfg.clone());
    (o.local_size, o.local_rank, o.device) = (Some(1), Some(0), Some(c.dev));
    let comm = Communicator::new(o)?;
    let ar = ferrocomm::Collective::AllReduce;
    let a = comm
        .algo_for(ar, 1024, DataType::BF16, &CallOpts::default())?
        .algo;
    c.expect("two hosts", a == Algo::Nccl, || {
        format!("two-host simulation chose {a}, not nccl")
    });
    for (k, algo) in [Algo::Auto, Algo::Nccl].into_iter().enumerate() {
        let cs = Case::sum(DataType::BF16, 5000, algo);
        run_case(c, Some(&comm), &cs, 20_000 + k as u64, 0)?;
    }
    let flat = CallOpts::default().with_algo(Algo::Flat);
    let refused = sum_in_place(&comm, &Buf::new(64)?, 8, c.dev, &flat).is_err();
    c.expect("two hosts", refused, || {
        "two-host simulation accepted a forced flat all-reduce".into()
    });
    Ok(())
}

/// A peer that never arrives: rank 0 alone calls, the kernel gives up after the timeout and
/// the next call reports which rank was missing.
fn lone_timeout(c: &mut Ctx) -> Res<()> {
    let mut cfg = c.cfg.clone();
    cfg.timeout = Duration::from_secs(2);
    let comm = Communicator::new(options("gpu_check_timeout", cfg))?;
    if c.rank == 0 {
        let b = Buf::new(4096)?;
        let flat = CallOpts::default().with_algo(Algo::Flat);
        let first = sum_in_place(&comm, &b, 1024, c.dev, &flat);
        let t = Instant::now();
        sync()?;
        let waited = t.elapsed();
        let second = sum_in_place(&comm, &b, 1024, c.dev, &flat);
        let ok = matches!(
            (&first, &second),
            (Ok(()), Err(ferrocomm::Error::Timeout { missing: 1, .. }))
        );
        if ok {
            let (s, e) = (waited.as_secs_f64(), second.as_ref().unwrap_err());
            println!("timeout: kernel gave up after {s:.2} s; next call: {e}");
        }
        c.expect("timeout", ok, || {
            format!("timeout check: first {first:?}, second {second:?}")
        });
    }
    retire(c, "timeout-done", comm)
}

fn main() {
    run_main("gpu_check", real_main)
}

fn real_main() -> Res<i32> {
    let args = flags(&["--quick", "--no-timing", "--full-timing", "--sanitize"])?;
    let has = |f: &str| args.iter().any(|a| a == f);
    // `--full-timing`: quick correctness with the full timing table.
    let (quick, no_timing, sanitize, full_timing) = (
        has("--quick"),
        has("--no-timing"),
        has("--sanitize"),
        has("--full-timing"),
    );
    let mut cfg = Config::from_env()?;
    // Room for the largest tested message in flat/tree.
    cfg.cuda_staging_bytes = cfg.cuda_staging_bytes.max(256 << 20);
    let t0 = Instant::now();
    let (mut c, _cuda) = gpu_ctx("gpu_check", cfg.clone(), quick)?;
    if c.rank == 0 {
        let nccl = if shared_gpus() {
            format!("off ({NO_NCCL}: the NCCL cases, the two-host and NCCL timeout checks and the timing are left out)")
        } else {
            let (p, v) = ferrocomm::nccl::probe(&cfg)?;
            format!("{v} from {}", p.display())
        };
        println!(
            "gpu_check: {} ranks on {} GPUs, backend {}, NCCL {nccl}, DDA memory {} MiB per GPU, init {:.2} s",
            c.world,
            ferrocomm::cuda::gpu_count(),
            c.comm.backend_name(),
            ferrocomm::cuda::staging_memory_bytes(&cfg, c.world) >> 20,
            t0.elapsed().as_secs_f64()
        );
    }
    c.algos = algos();
    if sanitize {
        // Under compute-sanitizer every access is checked and kernels run far slower: a few
        // sizes of every algorithm, in and out of place, aligned and not, then the summary.
        sanitize_cases(&mut c)?;
    } else {
        // The all-reduce matrix, two communicators used alternately, a small staging; then
        // what only a GPU checks.
        let mut bodies = all_reduce::BODIES.to_vec();
        bodies.extend([
            ("race", race as Body),
            ("graph", graph),
            ("other collectives", others),
            ("foreign pointers", foreign_pointers),
            ("barriers", barrier_checks),
            ("disagreeing calls", disagreeing::all_reduce),
        ]);
        // What needs NCCL (two hosts simulated, its timeout) or GPUs of one's own (a lone
        // rank's timeout, the timing) is left out where ranks share GPUs.
        if !shared_gpus() {
            bodies.extend([
                ("two hosts", two_hosts as Body),
                ("timeout", lone_timeout),
                ("nccl timeout", nccl_timeout),
            ]);
        }
        run_bodies(&mut c, &bodies)?;
        if !no_timing && !shared_gpus() {
            timing(&mut c, quick && !full_timing)?;
        }
    }
    c.compare_hashes()?;
    report(
        &c,
        "gpu_check",
        "all results correct and identical on every rank",
    )
}
