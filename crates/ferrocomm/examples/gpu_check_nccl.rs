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
//! Prints one line per group and a summary; exits 1 on any failure.

use std::time::{Duration, Instant};

use cudarc::driver::sys;
use ferrocomm::config::BackendChoice;
use ferrocomm::plan::Engine;
use ferrocomm::{Algo, CallOpts, Communicator, Config, DataType, Device, Input, ReduceOp, ViewMut};

mod support;
use support::cases::one_rank::{case, collectives, Call};
use support::*;

/// What the program found: cases passed, failures.
#[derive(Default)]
struct Verdicts {
    passed: usize,
    failures: Vec<String>,
}

impl Verdicts {
    fn verdict(&mut self, what: String, ok: bool) {
        if ok {
            self.passed += 1;
        } else {
            eprintln!("FAIL {what}");
            self.failures.push(what);
        }
    }

    /// Runs the one-rank cases on `comm` with `opts` (planned on NCCL) under `label`, and
    /// takes in what they found.
    fn collectives(
        &mut self,
        comm: Communicator,
        cfg: &Config,
        label: &str,
        opts: &CallOpts,
    ) -> Res<()> {
        let mut c = cuda_ctx(comm, cfg.clone(), false);
        collectives(&mut c, Engine::Nccl, label, opts)?;
        self.take(label, c);
        Ok(())
    }

    /// Takes in what the cases run on `c` found.
    fn take(&mut self, label: &str, mut c: Ctx) {
        let cases: usize = c.tally.values().map(|t| t.cases).sum();
        let failed = c.failures.len();
        for f in &c.failures {
            eprintln!("FAIL {f}");
        }
        println!("{label}: {cases} calls checked, {failed} failed");
        self.passed += cases - failed;
        self.failures.append(&mut c.failures);
    }
}

/// The watchdog's timeout path on one rank (see the module doc).
fn watchdog(c: &mut Verdicts, dev: u32, cfg: &Config) -> Res<()> {
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
    let dev = Device::Cuda(dev);
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
    let label = "after the watchdog";
    let mut fresh = cuda_ctx(Communicator::new(o)?, cfg.clone(), false);
    let sum = Call::AllReduce(ReduceOp::Sum);
    let opts = CallOpts::default();
    case(
        &mut fresh,
        Engine::Nccl,
        label,
        &opts,
        sum,
        DataType::F32,
        1000,
        false,
        0,
        7,
    )?;
    c.take(label, fresh);
    Ok(())
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
    let mut c = Verdicts::default();
    let t = Instant::now();
    c.collectives(comm, &cfg, "nccl backend", &CallOpts::default())?;
    let mut o = options("gpu_check_nccl_cuda", cfg.clone());
    o.backend = Some(BackendChoice::Cuda);
    let comm = Communicator::new(o)?;
    let nccl = CallOpts::default().with_algo(Algo::Nccl);
    c.collectives(comm, &cfg, "cuda backend, NCCL forced", &nccl)?;
    watchdog(&mut c, dev, &cfg)?;
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
