//! What the device check programs (`gpu_check`, `gpu_check_coll`, `gpu_check_lowp`,
//! `gpu_check_norm`, `gpu_check_nccl`) share: the device cases ([`cases`]: the bodies, buffers
//! with a poisoned guard band, the references), their flags and communicators, a stream, a
//! hash and the summary. Each program uses a part of it.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{sys, CudaContext};
use ferrocomm::bootstrap::{all_gather_bytes, store_barrier};
use ferrocomm::{CommOptions, Communicator, Config, Device};

/// The device cases, the bodies the host backend's tests run too.
#[path = "../../tests/cases/mod.rs"]
pub mod cases;
#[allow(unused_imports)] // each program uses a part
pub use cases::{
    check_reduce, cu, diff_bytes, disagreeing, element_ok, fnv, gen, sync, written, Body, Buf, Ctx,
    OpK, Res, POISON,
};

/// A communicator of its own named `name` with settings `cfg` (a smaller staging, another block
/// size, a short timeout: whatever a group of cases needs).
pub fn comm_with(name: &str, cfg: Config) -> Res<Communicator> {
    Ok(Communicator::new(options(name, cfg))?)
}

/// The options every check program creates its communicators with: `name`, `cfg`, and under
/// `--share-gpus` the device and settings of [`shared_gpus`].
pub fn options(name: &str, mut cfg: Config) -> CommOptions {
    let mut o = CommOptions::new(name);
    if shared_gpus() {
        let local = cfg.launch.local_rank.or(cfg.launch.rank).unwrap_or(0);
        let gpus = ferrocomm::cuda::gpu_count().max(1);
        o.device = Some(Device::Cuda((local % gpus) as u32));
        // NCCL refuses two ranks on one GPU ("Duplicate GPU detected"): without it the
        // backend runs every collective through direct access or refuses it.
        cfg.nccl_lib = Some(NO_NCCL.into());
    }
    o.config = Some(cfg);
    o
}

/// The library path `--share-gpus` gives NCCL: none loads, so the backend runs without it.
pub const NO_NCCL: &str = "(no NCCL: ranks share GPUs)";

static SHARED_GPUS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// Whether `--share-gpus` was given: local rank r runs on GPU r mod (GPUs of the host), so a
/// world larger than the machine's GPU count runs the n-rank kernels (two or more processes
/// per GPU take turns on it: correctness only, no timing), without NCCL.
pub fn shared_gpus() -> bool {
    *SHARED_GPUS.get_or_init(|| false)
}

/// The program's flags, each one of `known` or `--share-gpus` (every program takes it, see
/// [`shared_gpus`]). Unknown ones are refused rather than ignored: a mistyped flag must not run
/// the full suite where a short one was meant (under compute-sanitizer that would run past its
/// limit).
pub fn flags(known: &[&str]) -> Res<Vec<String>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(a) = args
        .iter()
        .find(|a| !known.contains(&a.as_str()) && *a != "--share-gpus")
    {
        return Err(format!(
            "unknown argument {a:?} (flags: {}, --share-gpus)",
            known.join(", ")
        )
        .into());
    }
    let _ = SHARED_GPUS.set(args.iter().any(|a| a == "--share-gpus"));
    Ok(args)
}

/// Runs a check program's body and exits with its code (2 and the message on an error).
pub fn run_main(name: &str, body: fn() -> Res<i32>) -> ! {
    match body() {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("{name}: {e}");
            std::process::exit(2);
        }
    }
}

/// A non-blocking stream of the current context, as an integer for `CallOpts::stream`.
pub fn new_stream() -> Res<u64> {
    let mut s: sys::CUstream = std::ptr::null_mut();
    // SAFETY: out-parameter.
    cu(unsafe { sys::cuStreamCreate(&mut s, 1) }, "cuStreamCreate")?;
    Ok(s as u64)
}

/// A context for the device cases on `comm` (a GPU), whose further communicators are made as
/// [`comm_with`] makes them.
pub fn cuda_ctx(comm: Communicator, cfg: Config, quick: bool) -> Ctx {
    Ctx::new(comm, cfg, quick, Box::new(comm_with))
}

/// The context of check program `program` on the GPU its communicator (named `program`, made
/// with `cfg`) chose, that GPU's primary context bound to this thread for the buffers (the
/// handle returned keeps it), after the guard band's self-check.
pub fn gpu_ctx(program: &str, cfg: Config, quick: bool) -> Res<(Ctx, Arc<CudaContext>)> {
    let comm = comm_with(program, cfg.clone())?;
    let Device::Cuda(dev) = comm.device() else {
        return Err(
            format!("{program} needs a GPU (the communicator chose the host backend)").into(),
        );
    };
    let cuda = CudaContext::new(dev as usize)?;
    cuda.bind_to_thread()?;
    // The guard bands are read back after every call: first, that the read-back sees writes.
    Buf::guard_self_check(Device::Cuda(dev))?;
    Ok((cuda_ctx(comm, cfg, quick), cuda))
}

/// Runs `bodies` in turn, every rank waiting for the others after each; rank 0 prints each
/// one's time.
pub fn run_bodies(c: &mut Ctx, bodies: &[(&str, Body)]) -> Res<()> {
    for (name, body) in bodies {
        let t = Instant::now();
        body(c)?;
        let tag = format!("body/{name}");
        store_barrier(&**c.comm.store(), &tag, c.world, Duration::from_secs(120))?;
        if c.rank == 0 {
            println!("{name} done in {:.1} s", t.elapsed().as_secs_f64());
        }
    }
    Ok(())
}

/// Prints the tally (rank 0), this rank's first failures (stderr) and the verdict of every
/// rank as `{program}: FAILED` or `{program}: {correct}`; returns the exit code (1 where this
/// rank failed).
pub fn report(c: &Ctx, program: &str, correct: &str) -> Res<i32> {
    let (rank, world) = (c.rank, c.world);
    if rank == 0 {
        println!(
            "\ncorrectness (rank 0):\n{:<26} {:>7} {:>11} {:>10} {:>14} {:>7} {:>9}",
            "what", "cases", "wrong elems", "guard hits", "rank mismatch", "errors", "refusals"
        );
        for (k, t) in &c.tally {
            println!(
                "{:<26} {:>7} {:>11} {:>10} {:>14} {:>7} {:>9}",
                k, t.cases, t.wrong, t.guard, t.mismatch, t.errors, t.refusals
            );
        }
    }
    for f in c.failures.iter().take(30) {
        eprintln!("rank {rank}: FAIL {f}");
    }
    let bad = c.failed();
    let verdict = all_gather_bytes(
        &**c.comm.store(),
        "verdict",
        rank,
        world,
        &[bad as u8],
        Duration::from_secs(120),
    )?;
    if rank == 0 {
        if verdict.iter().any(|v| v[0] != 0) {
            println!("{program}: FAILED");
        } else {
            println!("{program}: {correct}");
        }
    }
    Ok(i32::from(bad))
}

/// A CUDA graph of the work captured on a stream (relaxed mode), instantiated once; destroyed
/// when dropped.
pub struct Graph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

impl Graph {
    /// Captures what `issue` enqueues on `stream` (a stream of our own, see [`new_stream`]); the
    /// capture ends whatever `issue` returned, and its error comes first.
    pub fn capture(stream: u64, issue: impl FnOnce() -> Res<()>) -> Res<Graph> {
        let s = stream as sys::CUstream;
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: a stream of this context, not being captured.
        let began = unsafe { sys::cuStreamBeginCapture_v2(s, mode) };
        cu(began, "cuStreamBeginCapture")?;
        let issued = issue();
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: ends the capture begun above; out-parameter.
        let ended = cu(
            unsafe { sys::cuStreamEndCapture(s, &mut graph) },
            "cuStreamEndCapture",
        );
        issued?;
        ended?;
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: a captured graph; out-parameter.
        let made = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
        if let Err(e) = cu(made, "cuGraphInstantiate") {
            // SAFETY: the graph made above, not instantiated.
            unsafe { sys::cuGraphDestroy(graph) };
            return Err(e);
        }
        Ok(Graph { graph, exec })
    }

    /// Launches the graph on `stream`.
    pub fn launch(&self, stream: u64) -> Res<()> {
        // SAFETY: an instantiated graph; its buffers outlive it (the caller's promise).
        cu(
            unsafe { sys::cuGraphLaunch(self.exec, stream as sys::CUstream) },
            "cuGraphLaunch",
        )
    }
}

impl Graph {
    /// Launches the graph `replays` times on `stream` and waits for them, `outs` poisoned
    /// (after the replays before) ahead of the last one: what the outputs hold then is that
    /// replay's.
    pub fn replay_poisoned(&self, stream: u64, replays: usize, outs: &[Buf]) -> Res<()> {
        for k in 0..replays {
            if k + 1 == replays {
                sync()?;
                for o in outs {
                    o.poison()?;
                }
            }
            self.launch(stream)?;
        }
        stream_sync(stream)
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: made once in `capture`; the caller has synchronised its launches.
        unsafe {
            sys::cuGraphExecDestroy(self.exec);
            sys::cuGraphDestroy(self.graph);
        }
    }
}

/// Waits for the work on `stream`.
pub fn stream_sync(stream: u64) -> Res<()> {
    // SAFETY: a stream of this context.
    cu(
        unsafe { sys::cuStreamSynchronize(stream as sys::CUstream) },
        "cuStreamSynchronize",
    )
}
