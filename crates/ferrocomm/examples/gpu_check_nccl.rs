//! NCCL on one GPU, one rank (run on a GPU machine; NCCL refuses two ranks on one GPU, so this
//! is how a machine with a single GPU runs NCCL at all):
//!
//! ```text
//! ferrocomm launch -n 1 -- target/release/examples/gpu_check_nccl
//! ```
//!
//! - Every collective NCCL carries (all-reduce, reduce, broadcast, all-gather, reduce-scatter,
//!   all-to-all, all-to-all-v, barrier) on a one-rank communicator of the `nccl` backend (NCCL
//!   alone), then on one of the `cuda` backend with the NCCL engine forced per call
//!   (`Algo::Nccl`): every reduction operator NCCL has on every dtype it reduces, the data
//!   movers on every dtype (FP8 included), in place and not, aligned and not. Each call's plan
//!   must say NCCL ([`Communicator::algo_for`]); each result must equal the library's reference
//!   ([`ferrocomm::reference::reduce_in_rank_order`] of the one rank's input, the input itself
//!   for the movers) bit for bit, and nothing may be written outside the output (guard bands).
//!   PreMulSum runs on the floats NCCL's one-rank kernel has (not FP8) with the factor 0.5,
//!   exact in every dtype.
//! - The NCCL watchdog's timeout path. On one rank NCCL never waits for a peer: it refuses a
//!   send to itself without the matching receive (`ncclInvalidUsage`), and runs a one-rank
//!   collective as a copy (or nothing, in place) on the caller's stream. So the call is made to
//!   wait on its stream: the stream first waits for a word that nobody sets
//!   (`cuStreamWaitValue32` on pinned host memory mapped for the device), then the all-reduce is
//!   enqueued on it with a communicator timeout of 3 s. The watchdog's completion marker (an
//!   event after the call) stays pending; after the timeout, never before, the watchdog must
//!   abort the communicator, and every later call must be refused naming the call and the
//!   timeout. Then the host sets the word (a plain store: no stream operation that the device
//!   could queue behind the waiting one), the stream must drain, dropping the communicator must
//!   be bounded, and a fresh communicator must work.
//!
//! Prints one line per group and a summary; exits 1 on any failure.

use std::time::{Duration, Instant};

use cudarc::driver::sys;
use ferrocomm::config::BackendChoice;
use ferrocomm::plan::Engine;
use ferrocomm::reference::{self, Value};
use ferrocomm::{
    Algo, CallOpts, Collective, Communicator, Config, DataType, Device, Input, ReduceOp, Splits,
    View, ViewMut,
};
use rand::{Rng, SeedableRng};

mod support;
use support::*;

struct Ctx {
    dev: u32,
    passed: usize,
    failures: Vec<String>,
}

impl Ctx {
    fn verdict(&mut self, what: String, ok: bool) {
        if ok {
            self.passed += 1;
        } else {
            eprintln!("FAIL {what}");
            self.failures.push(what);
        }
    }
}

/// The dtypes NCCL reduces (FP8 only moves here, see the module doc).
const REDUCED: [DataType; 10] = [
    DataType::F32,
    DataType::F64,
    DataType::F16,
    DataType::BF16,
    DataType::I8,
    DataType::U8,
    DataType::I32,
    DataType::U32,
    DataType::I64,
    DataType::U64,
];

/// The operators NCCL has for `d`.
fn ops_for(d: DataType) -> Vec<ReduceOp> {
    let mut ops = vec![
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];
    if d.is_float() {
        ops.push(ReduceOp::PremulSum(0.5));
    }
    ops
}

/// `count` random elements of `d` (never zero: a result of zeros would hide a copy that did
/// not happen).
fn gen(d: DataType, count: usize, seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let es = d.size();
    let mut out = vec![0u8; count * es];
    for el in out.chunks_mut(es) {
        let v = if d.is_float() {
            let x: f64 = rng.random_range(0.05..2.0);
            Value::Float(if rng.random_bool(0.5) { -x } else { x })
        } else {
            let x: i128 = rng.random_range(1..100);
            let signed = matches!(d, DataType::I8 | DataType::I32 | DataType::I64);
            Value::Int(if signed && rng.random_bool(0.5) {
                -x
            } else {
                x
            })
        };
        reference::encode(d, v, el);
    }
    out
}

/// One call of the pass: which collective, and for the reductions the operator.
#[derive(Clone, Copy, Debug)]
enum Call {
    AllReduce(ReduceOp),
    Reduce(ReduceOp),
    ReduceScatter(ReduceOp),
    Broadcast,
    AllGather,
    AllToAll,
    AllToAllV,
}

impl Call {
    fn collective(self) -> Collective {
        match self {
            Call::AllReduce(_) => Collective::AllReduce,
            Call::Reduce(_) => Collective::Reduce,
            Call::ReduceScatter(_) => Collective::ReduceScatter,
            Call::Broadcast => Collective::Broadcast,
            Call::AllGather => Collective::AllGather,
            Call::AllToAll => Collective::AllToAll,
            Call::AllToAllV => Collective::AllToAllV,
        }
    }

    /// What one rank's output holds: the reference reduction of its input, or the input.
    fn expected(self, d: DataType, input: &[u8]) -> Vec<u8> {
        match self {
            Call::AllReduce(op) | Call::Reduce(op) | Call::ReduceScatter(op) => {
                reference::reduce_in_rank_order(d, op, &[input.to_vec()])
            }
            _ => input.to_vec(),
        }
    }
}

/// Runs `call` of `count` elements of `d` on `comm` with `opts`, `misalign` elements off
/// alignment, in place or not, and checks plan, result and guard bands.
#[allow(clippy::too_many_arguments)]
fn case(
    c: &mut Ctx,
    comm: &Communicator,
    label: &str,
    opts: &CallOpts,
    call: Call,
    d: DataType,
    count: usize,
    in_place: bool,
    misalign: usize,
    seed: u64,
) -> Res<()> {
    let es = d.size();
    let bytes = count * es;
    let off = misalign * es;
    let what = format!("{label}: {call:?} {d} n={count} in_place={in_place} misalign={misalign}");
    match comm.algo_for(call.collective(), bytes, d, opts) {
        Ok(p) if p.engine == Engine::Nccl => {}
        other => {
            c.verdict(format!("{what}: planned {other:?}, not NCCL"), false);
            return Ok(());
        }
    }
    let input = gen(d, count, seed);
    let want = call.expected(d, &input);
    let inb = Buf::new(off + bytes)?;
    let outb = Buf::new(off + bytes)?;
    inb.poison()?;
    outb.poison()?;
    let dev = Device::Cuda(c.dev);
    if in_place {
        outb.upload(off, &input)?;
    } else {
        inb.upload(off, &input)?;
    }
    // SAFETY: both buffers hold `off + bytes` bytes of this device and outlive the call (it is
    // synchronised below); the views cover `count` elements from `off`.
    let r = unsafe {
        let o = ViewMut::from_raw((outb.ptr + off as u64) as *mut u8, count, d, dev);
        let i = if in_place {
            Input::InPlace
        } else {
            Input::Buf(View::from_raw(
                (inb.ptr + off as u64) as *const u8,
                count,
                d,
                dev,
            ))
        };
        match call {
            Call::AllReduce(op) => comm.all_reduce(i, o, op, opts),
            Call::Reduce(op) => comm.reduce(i, o, op, 0, opts),
            Call::ReduceScatter(op) => comm.reduce_scatter(i, o, op, opts),
            Call::Broadcast => comm.broadcast(i, o, 0, opts),
            Call::AllGather => comm.all_gather(i, o, opts),
            Call::AllToAll => comm.all_to_all(i, o, opts),
            Call::AllToAllV => {
                comm.all_to_all_v(i, o, &Splits::packed(vec![count], vec![count]), opts)
            }
        }
    };
    sync()?;
    if let Err(e) = r {
        c.verdict(format!("{what}: error {e}"), false);
        return Ok(());
    }
    let got = outb.download(off, bytes)?;
    let wrong = got
        .chunks(es)
        .zip(want.chunks(es))
        .filter(|(a, b)| a != b)
        .count();
    let guard = outb.guard_hits(off, bytes)?;
    // The input of a call out of place is left as it was.
    let input_kept = in_place || inb.download(off, bytes)? == input;
    c.verdict(
        format!(
            "{what}: {wrong} elements differ from the reference, {guard} bytes written outside \
             the output, input kept {input_kept}"
        ),
        wrong == 0 && guard == 0 && input_kept,
    );
    Ok(())
}

/// Every collective on `comm` (one rank) with `opts`.
fn collectives(c: &mut Ctx, comm: &Communicator, label: &str, opts: &CallOpts) -> Res<()> {
    let before = (c.passed, c.failures.len());
    let mut seed = 0u64;
    let mut k = 0usize;
    let mut next = |seed: &mut u64| {
        *seed += 1;
        k += 1;
        (k % 2 == 0, k % 3 == 0)
    };
    for d in REDUCED {
        for op in ops_for(d) {
            for call in [
                Call::AllReduce(op),
                Call::Reduce(op),
                Call::ReduceScatter(op),
            ] {
                for count in [1usize, 4097] {
                    let (in_place, odd) = next(&mut seed);
                    case(
                        c,
                        comm,
                        label,
                        opts,
                        call,
                        d,
                        count,
                        in_place,
                        usize::from(odd),
                        seed,
                    )?;
                }
            }
        }
    }
    for d in DataType::ALL {
        for call in [
            Call::Broadcast,
            Call::AllGather,
            Call::AllToAll,
            Call::AllToAllV,
        ] {
            for count in [1usize, 4097] {
                let (in_place, odd) = next(&mut seed);
                case(
                    c,
                    comm,
                    label,
                    opts,
                    call,
                    d,
                    count,
                    in_place,
                    usize::from(odd),
                    seed,
                )?;
            }
        }
    }
    // A few MB each way, in place and not.
    for (call, d) in [
        (Call::AllReduce(ReduceOp::Sum), DataType::BF16),
        (Call::AllReduce(ReduceOp::PremulSum(0.5)), DataType::F32),
        (Call::AllGather, DataType::F32),
        (Call::AllToAllV, DataType::BF16),
    ] {
        for in_place in [false, true] {
            seed += 1;
            case(c, comm, label, opts, call, d, 1_000_003, in_place, 0, seed)?;
        }
    }
    // The barrier (an NCCL all-reduce of one word, then a wait for the stream).
    let barrier = comm.barrier(opts);
    c.verdict(format!("{label}: barrier {barrier:?}"), barrier.is_ok());
    println!(
        "{label}: {} calls checked, {} failed",
        c.passed - before.0 + c.failures.len() - before.1,
        c.failures.len() - before.1
    );
    Ok(())
}

/// The watchdog's timeout path on one rank (see the module doc).
fn watchdog(c: &mut Ctx, cfg: &Config) -> Res<()> {
    let timeout = Duration::from_secs(3);
    // The watchdog acts within a few of its ticks after the timeout; 20 s of slack is for a
    // machine busy with something else, and still far from "never".
    let limit = timeout + Duration::from_secs(20);
    let mut cfg_w = cfg.clone();
    cfg_w.timeout = timeout;
    if !cfg_w.nccl_watchdog {
        c.verdict(
            "watchdog: FERROCOMM_NCCL_WATCHDOG=0 in the environment turns it off".into(),
            false,
        );
        return Ok(());
    }
    let mut o = options("gpu_check_nccl_watchdog", cfg_w);
    o.backend = Some(BackendChoice::Nccl);
    let comm = Communicator::new(o)?;
    let dev = Device::Cuda(c.dev);
    let word = MappedWord::new()?;
    let blocked = new_stream()?;
    let free = new_stream()?;
    let n = 1024usize;
    let b = Buf::new(n * 4)?;
    b.poison()?;
    b.upload(0, &gen(DataType::F32, n, 99))?;
    let probe = Buf::new(4)?;
    // From here on nothing may wait for the whole device (a synchronising copy or memset, a
    // context synchronisation) until the word is set: it would wait for the blocked stream.
    cu(
        // SAFETY: a live stream of this context and the device address of a mapped word that
        // outlives it (the stream is synchronised below, after the word is set).
        unsafe {
            sys::cuStreamWaitValue32_v2(
                blocked as sys::CUstream,
                word.device,
                1,
                sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
            )
        },
        "cuStreamWaitValue32",
    )?;
    // Before the call: the watchdog's clock for it starts inside it.
    let t0 = Instant::now();
    // SAFETY: `n` f32 of this device, alive until the blocked stream is synchronised below.
    let first = unsafe {
        comm.all_reduce(
            Input::InPlace,
            ViewMut::from_raw(b.ptr as *mut u8, n, DataType::F32, dev),
            ReduceOp::Sum,
            &CallOpts::on_stream(blocked),
        )
    };
    c.verdict(
        format!("watchdog: the call on the blocked stream is enqueued: {first:?}"),
        first.is_ok(),
    );
    // Calls on the free stream go through until the watchdog gives up on the communicator;
    // the first refused one says why. (In place on one rank NCCL enqueues nothing for them;
    // nothing here waits for a stream, which the device might serialise behind the waiting
    // one.)
    let refused = loop {
        // SAFETY: one f32 of this device, alive until the end of this function.
        let r = unsafe {
            comm.all_reduce(
                Input::InPlace,
                ViewMut::from_raw(probe.ptr as *mut u8, 1, DataType::F32, dev),
                ReduceOp::Sum,
                &CallOpts::on_stream(free),
            )
        };
        match r {
            Err(e) => break Some((e.to_string(), t0.elapsed())),
            Ok(()) if t0.elapsed() > limit => break None,
            // The pause between two probes of a wait with the deadline above.
            Ok(()) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    match &refused {
        Some((e, after)) => {
            println!(
                "watchdog: calls refused after {:.2} s: {e}",
                after.as_secs_f64()
            );
            let named = e.contains("all_reduce (call #")
                && e.contains("Timed out after 3s without completing")
                && e.contains("aborted");
            c.verdict(
                format!(
                    "watchdog: refused after {:.2} s (not before the 3 s timeout, within \
                     {limit:?}) naming the call and the timeout: {e}",
                    after.as_secs_f64()
                ),
                *after >= timeout && *after <= limit && named,
            );
        }
        None => c.verdict(
            format!("watchdog: calls still accepted {limit:?} after a call that never ran"),
            false,
        ),
    }
    // Refused for good.
    // SAFETY: as for the probes.
    let again = unsafe {
        comm.all_reduce(
            Input::InPlace,
            ViewMut::from_raw(probe.ptr as *mut u8, 1, DataType::F32, dev),
            ReduceOp::Sum,
            &CallOpts::on_stream(free),
        )
    };
    c.verdict(
        format!("watchdog: a later call is refused too: {again:?}"),
        again.is_err(),
    );
    // Set the word: the blocked stream drains (queued behind the wait is the watchdog's event;
    // in place on one rank NCCL enqueued nothing).
    word.set(1);
    // SAFETY: a live stream of this context.
    let drained = unsafe { sys::cuStreamSynchronize(blocked as sys::CUstream) }.result();
    c.verdict(
        format!("watchdog: the blocked stream drains once released: {drained:?}"),
        drained.is_ok(),
    );
    let guard = b.guard_hits(0, n * 4)?;
    c.verdict(
        format!("watchdog: {guard} bytes written past the blocked call's buffer"),
        guard == 0,
    );
    let t = Instant::now();
    drop(comm);
    let took = t.elapsed();
    c.verdict(
        format!("watchdog: dropping the aborted communicator took {took:?}"),
        took <= limit,
    );
    // A fresh communicator works.
    let mut o = options("gpu_check_nccl_after", cfg.clone());
    o.backend = Some(BackendChoice::Nccl);
    let fresh = Communicator::new(o)?;
    case(
        c,
        &fresh,
        "after the watchdog",
        &CallOpts::default(),
        Call::AllReduce(ReduceOp::Sum),
        DataType::F32,
        1000,
        false,
        0,
        7,
    )
}

/// A 32-bit word of pinned host memory mapped for the device: the host sets it with a plain
/// store, a stream waits for it with `cuStreamWaitValue32`.
struct MappedWord {
    host: *mut u32,
    device: u64,
}

impl MappedWord {
    fn new() -> Res<MappedWord> {
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        cu(
            // SAFETY: out-parameter; the context is current.
            unsafe {
                sys::cuMemHostAlloc(
                    &mut p,
                    4,
                    sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE,
                )
            },
            "cuMemHostAlloc",
        )?;
        let mut w = MappedWord {
            host: p.cast(),
            device: 0,
        };
        w.set(0);
        cu(
            // SAFETY: `p` was allocated with DEVICEMAP just above.
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut w.device, p, 0) },
            "cuMemHostGetDevicePointer",
        )?;
        Ok(w)
    }

    fn set(&self, v: u32) {
        // SAFETY: a live, aligned allocation of 4 bytes; volatile, since the device reads it.
        unsafe { std::ptr::write_volatile(self.host, v) };
    }
}

impl Drop for MappedWord {
    fn drop(&mut self) {
        // SAFETY: allocated once by cuMemHostAlloc; the stream waiting on it has drained.
        unsafe { sys::cuMemFreeHost(self.host.cast()) };
    }
}

fn main() {
    run_main("gpu_check_nccl", real_main)
}

fn real_main() -> Res<i32> {
    flags(&[])?;
    if shared_gpus() {
        return Err("gpu_check_nccl runs one rank with NCCL: --share-gpus does not apply".into());
    }
    let cfg = Config::from_env()?;
    let mut o = options("gpu_check_nccl", cfg.clone());
    o.backend = Some(BackendChoice::Nccl);
    let comm = Communicator::new(o)?;
    if comm.size() != 1 {
        return Err(format!(
            "gpu_check_nccl runs on one rank (ferrocomm launch -n 1 --), not {}",
            comm.size()
        )
        .into());
    }
    let Device::Cuda(dev) = comm.device() else {
        return Err("gpu_check_nccl needs a GPU".into());
    };
    let (path, version) = ferrocomm::nccl::probe(&cfg)?;
    println!(
        "gpu_check_nccl: one rank on cuda:{dev} of {} GPUs, NCCL {version} from {}",
        ferrocomm::cuda::gpu_count(),
        path.display()
    );
    let cuda = cudarc::driver::CudaContext::new(dev as usize)?;
    cuda.bind_to_thread()?;
    // The guard bands are read back after every call: first, that the read-back sees writes.
    Buf::guard_self_check(Device::Cuda(dev))?;
    let mut c = Ctx {
        dev,
        passed: 0,
        failures: Vec::new(),
    };
    let t = Instant::now();
    collectives(&mut c, &comm, "nccl backend", &CallOpts::default())?;
    drop(comm);
    let mut o = options("gpu_check_nccl_cuda", cfg.clone());
    o.backend = Some(BackendChoice::Cuda);
    let comm = Communicator::new(o)?;
    collectives(
        &mut c,
        &comm,
        "cuda backend, NCCL forced",
        &CallOpts::default().with_algo(Algo::Nccl),
    )?;
    drop(comm);
    watchdog(&mut c, &cfg)?;
    println!(
        "gpu_check_nccl: {} passed, {} failed, {:.1} s",
        c.passed,
        c.failures.len(),
        t.elapsed().as_secs_f64()
    );
    println!(
        "{}",
        if c.failures.is_empty() {
            "gpu_check_nccl: all results correct"
        } else {
            "gpu_check_nccl: FAILED"
        }
    );
    Ok(if c.failures.is_empty() { 0 } else { 1 })
}
