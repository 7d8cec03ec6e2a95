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
//! The eager cases and the disagreeing calls are the device cases' bodies (`tests/cases/norm.rs`,
//! `tests/cases/disagreeing.rs`, which the host backend runs in CI) on CUDA buffers; the graph
//! replays are this program's.
//!
//! Exits 1 on any mismatch, 2 on an error.

use ferrocomm::quant::Format;
use ferrocomm::{Algo, Config, DataType};

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
            misalign: if algo == Algo::Push { u64::MAX } else { 0 },
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

fn real_main() -> Res<i32> {
    let args = flags(&["--quick"])?;
    let quick = args.iter().any(|a| a == "--quick");
    let (mut c, _cuda) = gpu_ctx("gpu_check_norm", Config::from_env()?, quick)?;
    let fused = c.cfg.thresholds.rmsnorm_fused;
    if c.rank == 0 {
        println!(
            "gpu_check_norm: {} ranks, backend {}, one launch (FERROCOMM_RMSNORM_FUSED) {}, \
             one-shot up to {} bytes (FERROCOMM_RMSNORM_FLAT_MAX_BYTES)",
            c.world,
            c.comm.backend_name(),
            if fused { "on" } else { "off" },
            c.cfg
                .thresholds
                .rmsnorm_flat_max
                .map_or("the default".to_string(), |b| b.to_string())
        );
    }
    norm::eager(&mut c)?;
    graph(&mut c)?;
    // Disagreeing calls need a second rank, and one launch: with two, the norm runs on each
    // rank alone and nothing compares its eps or FP8 rows between ranks.
    if fused && c.world > 1 {
        disagreeing::fused_norm(&mut c)?;
    }
    c.compare_hashes()?;
    report(&c, "gpu_check_norm", "all results correct")
}

fn main() {
    run_main("gpu_check_norm", real_main)
}
