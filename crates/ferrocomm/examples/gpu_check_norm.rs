//! Device check of the fused all-reduce + residual add + RMSNorm (`all_reduce_rmsnorm`) of the
//! cuda backend:
//!
//! ```text
//! ferrocomm launch -n 2 -- target/release/examples/gpu_check_norm [--share-gpus] [--quick]
//! ```
//!
//! - every dtype (f32, f16, bf16), the model hidden sizes 8 / 4096 / 5120 / 8192 / 16384 and
//!   odd row counts (few, where the norm runs its wide kernels, more than
//!   `FERROCOMM_RMSNORM_WIDE_MAX_ROWS`, and enough that the one-launch kernels stage four rows
//!   at a time), in and out of place, buffers off 16 bytes (one element),
//!   FP8 rows off, with a scale per row or with one given scale (saturating), each all-reduce
//!   algorithm (push, flat, tree, auto), full precision and E4M3 / INT8 on the wire (one
//!   launch: the rows cross as block-scaled records); inputs regenerated from seeds on every
//!   rank; at one rank the local form (the norm kernel on x itself);
//! - against the host reference on the same inputs: the residual bit for bit (the sum is the
//!   all-reduce's, in rank order, so it equals the host's; with low precision the low-precision
//!   all-reduce's, `quant::reference::one_shot` or `two_shot` as the plan's algorithm says),
//!   `out` and the FP8 rows within the bounds of `rmsnorm::compare` against the exact f64
//!   result on that sum (the FP8 rows dequantized within half an E4M3 step);
//! - identical results on every rank; nothing written past any output (guard bands);
//! - a CUDA graph of several calls captured once and replayed, outputs poisoned between
//!   replays, every replay checked;
//! - with `FERROCOMM_RMSNORM_FUSED=1` the calls that direct access takes run in one launch
//!   (a per-call flat or tree forces the one-shot or the two-shot form, auto chooses by
//!   `FERROCOMM_RMSNORM_FLAT_MAX_BYTES`), checked the same way, and ranks that disagree on a
//!   call (eps, FP8 rows, rows, the form) must see "disagrees between ranks" at the next call
//!   on every rank, after which a matching call works again.
//!
//! The eager cases are the device cases' body (`tests/cases/norm.rs`, which the host backend
//! runs in CI) on CUDA buffers; the graph replays and the disagreeing calls are this program's.
//!
//! Exits 1 on any mismatch, 2 on an error.

use std::time::Duration;

use ferrocomm::bootstrap::store_barrier;
use ferrocomm::quant::Format;
use ferrocomm::{Algo, Config, DataType, Device};

mod support;
use support::cases::norm::{self, check, Bufs, Case};
use support::*;

/// Several calls captured in one graph on a stream of our own, replayed three times with the
/// outputs poisoned (and in-place inputs reloaded) before each replay.
fn graph(c: &mut Ctx) -> Res<()> {
    let plan = [
        (DataType::BF16, 3, 4096, true, true, Algo::Auto),
        (DataType::BF16, 1, 8, false, true, Algo::Push),
        (DataType::F16, 5, 8192, false, false, Algo::Flat),
        (DataType::F32, 7, 40, true, true, Algo::Tree),
    ];
    let cases: Vec<Case> = plan
        .iter()
        .enumerate()
        .map(|(k, &(d, rows, hidden, in_place, fp8, algo))| Case {
            d,
            rows,
            hidden,
            eps: 1e-6,
            in_place,
            fp8,
            // The tree case takes one given scale (read again at every replay), the flat one
            // E4M3 on the wire.
            given: (algo == Algo::Tree).then_some(0.05),
            lp: (algo == Algo::Flat).then_some(Format::E4M3),
            algo,
            seed: 1000 + k as u64,
            // The push case's buffers off 16 bytes, replayed too.
            misalign: algo == Algo::Push,
        })
        .collect();
    let bufs: Vec<Bufs> = cases.iter().map(|k| Bufs::new(c, k)).collect::<Res<_>>()?;
    for (k, b) in cases.iter().zip(&bufs) {
        b.load(k, c.rank)?;
    }
    let stream = new_stream()?;
    let issue = || -> Res<()> {
        for (k, b) in cases.iter().zip(&bufs) {
            b.call(&c.comm, k, c.dev, stream)?;
        }
        Ok(())
    };
    let graph = Graph::capture(stream, issue)?;
    for replay in 0..3 {
        for (k, b) in cases.iter().zip(&bufs) {
            b.load(k, c.rank)?;
        }
        graph.launch(stream)?;
        stream_sync(stream)?;
        for (k, b) in cases.iter().zip(&bufs) {
            check(c, k, b, &format!("graph replay {replay}"))?;
        }
    }
    Ok(())
}

/// Calls that disagree between ranks, one launch each (see the module doc), on a communicator
/// of their own with a short timeout; left unfreed at the end (a kernel that gave up may still
/// hold its staging).
fn mismatch(c: &mut Ctx) -> Res<()> {
    let mut cfg_m: Config = c.cfg.clone();
    cfg_m.timeout = Duration::from_secs(20);
    let comm = comm_with("gpu_check_norm_mismatch", cfg_m)?;
    let r = c.rank;
    let base = Case {
        d: DataType::BF16,
        rows: 5,
        hidden: 4096,
        eps: 1e-6,
        in_place: false,
        fp8: false,
        given: None,
        lp: None,
        algo: Algo::Flat,
        seed: 5000,
        misalign: false,
    };
    let cases = [
        (
            "eps differs",
            Case {
                eps: 1e-6 * (1 + r) as f32,
                ..base
            },
        ),
        (
            "FP8 rows on rank 0 only",
            Case {
                fp8: r == 0,
                ..base
            },
        ),
        (
            "a given FP8 scale on rank 0, a scale per row elsewhere",
            Case {
                fp8: true,
                given: (r == 0).then_some(0.02),
                ..base
            },
        ),
        (
            "E4M3 on the wire on rank 0 only",
            Case {
                lp: (r == 0).then_some(Format::E4M3),
                ..base
            },
        ),
        (
            "rows differ",
            Case {
                rows: 5 + r,
                ..base
            },
        ),
        (
            "one-shot against two-shot",
            Case {
                algo: [Algo::Flat, Algo::Tree][r % 2],
                ..base
            },
        ),
    ];
    let stream = new_stream()?;
    let good = Bufs::new(c, &base)?;
    for (what, case) in cases {
        let b = Bufs::new(c, &case)?;
        b.load(&case, r)?;
        let first = b.call(&comm, &case, c.dev, stream);
        sync()?;
        good.load(&base, r)?;
        let next = good.call(&comm, &base, c.dev, stream);
        sync()?;
        let shown = format!("{next:?}");
        let label = format!("mismatch ({what})");
        let reported = first.is_ok() && shown.contains("disagrees between ranks");
        if reported && r == 0 {
            println!("{label}: reported: {shown}");
        }
        c.expect("fused norm mismatch", reported, || {
            format!("{label}: not reported: {first:?} then {shown}")
        });
        if !reported && shown.contains("Timeout") {
            break; // sticky: the communicator is done
        }
        // A matching call works again, with the right results.
        good.load(&base, r)?;
        match good.call(&comm, &base, c.dev, stream) {
            Ok(()) => {
                sync()?;
                check(c, &base, &good, &format!("after {label}"))?;
            }
            Err(e) => c.expect("fused norm mismatch", false, || {
                format!("after {label}: {e}")
            }),
        }
    }
    store_barrier(
        &**c.comm.store(),
        "normchk/mismatch-done",
        c.world,
        Duration::from_secs(120),
    )?;
    std::mem::forget(comm);
    Ok(())
}

fn real_main() -> Res<i32> {
    let args = flags(&["--quick"])?;
    let quick = args.iter().any(|a| a == "--quick");
    let cfg = Config::from_env()?;
    let comm = comm_with("gpu_check_norm", cfg.clone())?;
    let (rank, world) = (comm.rank(), comm.size());
    let Device::Cuda(dev) = comm.device() else {
        return Err("gpu_check_norm needs a GPU".into());
    };
    let cuda = cudarc::driver::CudaContext::new(dev as usize)?;
    cuda.bind_to_thread()?;
    // The guard bands are read back after every call: first, that the read-back sees writes.
    Buf::guard_self_check(Device::Cuda(dev))?;
    let fused = cfg.thresholds.rmsnorm_fused;
    if rank == 0 {
        println!(
            "gpu_check_norm: {world} ranks, backend {}, one launch (FERROCOMM_RMSNORM_FUSED) {}, \
             one-shot up to {} bytes (FERROCOMM_RMSNORM_FLAT_MAX_BYTES)",
            comm.backend_name(),
            if fused { "on" } else { "off" },
            cfg.thresholds
                .rmsnorm_flat_max
                .map_or("the default".to_string(), |b| b.to_string())
        );
    }
    let mut c = cuda_ctx(comm, cfg, quick);
    norm::eager(&mut c)?;
    graph(&mut c)?;
    // Disagreeing calls need a second rank.
    if fused && world > 1 {
        mismatch(&mut c)?;
    }
    c.compare_hashes()?;
    for f in &c.failures {
        eprintln!("FAIL rank {rank}: {f}");
    }
    let failed = c.failures.len();
    let cases: usize = c.tally.values().map(|t| t.cases).sum();
    println!(
        "gpu_check_norm rank {rank}: {} passed, {failed} failed",
        cases.saturating_sub(failed)
    );
    Ok(i32::from(c.failed()))
}

fn main() {
    run_main("gpu_check_norm", real_main)
}
