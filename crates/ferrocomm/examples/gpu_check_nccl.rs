//! NCCL on one GPU, one rank (run on a GPU machine; NCCL refuses two ranks on one GPU, so this
//! is how a machine with a single GPU runs NCCL at all):
//!
//! ```text
//! ferrocomm launch -n 1 -- target/release/examples/gpu_check_nccl
//! ```
//!
//! The collectives' cases are the device cases' one-rank body (`tests/cases/one_rank.rs`, which
//! the host backend runs at one rank in CI):
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
//! Prints the tally (a row per group of checks) and a verdict; exits 1 on any failure.

use std::time::{Duration, Instant};

use cudarc::driver::sys;
use ferrocomm::config::BackendChoice;
use ferrocomm::plan::Engine;
use ferrocomm::{Algo, CallOpts, Config, DataType, Input, ReduceOp, ViewMut};

mod support;
use support::cases::one_rank::{case, collectives, Call};
use support::*;

/// The watchdog's timeout path on one rank (see the module doc).
fn watchdog(c: &mut Ctx) -> Res<()> {
    let timeout = Duration::from_secs(3);
    let verdict = |c: &mut Ctx, what: String, ok: bool| c.expect("watchdog", ok, || what);
    // The watchdog acts within a few of its ticks after the timeout; 20 s of slack is for a
    // machine busy with something else, and still far from "never".
    let limit = timeout + Duration::from_secs(20);
    let mut cfg = c.cfg.clone();
    cfg.timeout = timeout;
    if !cfg.nccl_watchdog {
        let what = "watchdog: FERROCOMM_NCCL_WATCHDOG=0 in the environment turns it off";
        verdict(c, what.into(), false);
        return Ok(());
    }
    let comm = comm_with("gpu_check_nccl_watchdog", cfg)?;
    let dev = c.dev;
    let word = MappedWord::new()?;
    let blocked = new_stream()?;
    let free = new_stream()?;
    let n = 1024usize;
    let b = Buf::new(n * 4)?;
    b.poison()?;
    b.upload(0, &gen(DataType::F32, n, 99, 0, false))?;
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
    verdict(
        c,
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
            verdict(
                c,
                format!(
                    "watchdog: refused after {:.2} s (not before the 3 s timeout, within \
                     {limit:?}) naming the call and the timeout: {e}",
                    after.as_secs_f64()
                ),
                *after >= timeout && *after <= limit && named,
            );
        }
        None => verdict(
            c,
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
    verdict(
        c,
        format!("watchdog: a later call is refused too: {again:?}"),
        again.is_err(),
    );
    // Set the word: the blocked stream drains (queued behind the wait is the watchdog's event;
    // in place on one rank NCCL enqueued nothing).
    word.set(1);
    // SAFETY: a live stream of this context.
    let drained = unsafe { sys::cuStreamSynchronize(blocked as sys::CUstream) }.result();
    verdict(
        c,
        format!("watchdog: the blocked stream drains once released: {drained:?}"),
        drained.is_ok(),
    );
    let guard = b.guard_hits(0, n * 4)?;
    verdict(
        c,
        format!("watchdog: {guard} bytes written past the blocked call's buffer"),
        guard == 0,
    );
    let t = Instant::now();
    drop(comm);
    let took = t.elapsed();
    verdict(
        c,
        format!("watchdog: dropping the aborted communicator took {took:?}"),
        took <= limit,
    );
    // A fresh communicator works.
    let sum = Call::AllReduce(ReduceOp::Sum);
    c.with_comm("gpu_check_nccl_after", c.cfg.clone(), |c| {
        let (label, f32) = ("after the watchdog", DataType::F32);
        let opts = CallOpts::default();
        case(c, Engine::Nccl, label, &opts, sum, f32, 1000, false, 0, 7)
    })
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
    let mut cfg = Config::from_env()?;
    cfg.backend = BackendChoice::Nccl;
    let (mut c, _cuda) = gpu_ctx("gpu_check_nccl", cfg.clone(), false)?;
    if c.world != 1 {
        let n = c.world;
        return Err(
            format!("gpu_check_nccl runs on one rank (ferrocomm launch -n 1 --), not {n}").into(),
        );
    }
    let (path, version) = ferrocomm::nccl::probe(&cfg)?;
    println!(
        "gpu_check_nccl: one rank on {} of {} GPUs, NCCL {version} from {}",
        c.dev,
        ferrocomm::cuda::gpu_count(),
        path.display()
    );
    let t = Instant::now();
    let (nccl, default) = (
        CallOpts::default().with_algo(Algo::Nccl),
        CallOpts::default(),
    );
    collectives(&mut c, Engine::Nccl, "nccl backend", &default)?;
    cfg.backend = BackendChoice::Cuda;
    c.with_comm("gpu_check_nccl_cuda", cfg, |c| {
        collectives(c, Engine::Nccl, "cuda backend, NCCL forced", &nccl)
    })?;
    watchdog(&mut c)?;
    let secs = t.elapsed().as_secs_f64();
    report(
        &c,
        "gpu_check_nccl",
        &format!("all results correct ({secs:.1} s)"),
    )
}
