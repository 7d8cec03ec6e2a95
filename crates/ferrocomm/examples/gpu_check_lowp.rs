//! Device check of the low-precision collectives of the cuda backend (run on 2 GPUs):
//!
//! ```text
//! ferrocomm launch -n 2 -- target/release/examples/gpu_check_lowp [--quick] [--no-timing] [--sanitize]
//! ferrocomm launch -n 1 -- target/release/examples/gpu_check_lowp --quant-time
//! ```
//!
//! `--no-timing` leaves out the quantization timing; `--sanitize` runs only a few small calls of
//! every kernel (see `sanitize_cases`), for compute-sanitizer (scripts/gpu_sanitize.sh);
//! `--quant-time` runs only the codec check and the quantization timing, on one GPU if need be
//! (for a profiler: `ncu -k regex:fc_lp_encode ...` replays the kernel with no peer waiting).
//!
//! The collectives' cases and the calls that disagree between ranks are the device cases' bodies
//! (`tests/cases/lowp.rs`, `tests/cases/disagreeing.rs`, which the host backend runs in CI) on
//! CUDA buffers; what only a GPU checks is here: the device codec and the quantization time.
//!
//! - GPU codec == CPU codec ([`quant::Codec::encode_from`]) byte for byte, every format, several
//!   block sizes, f32/bf16/f16 inputs, odd counts, special blocks (zeros, tiny, huge, NaN, -0);
//! - quantized all-reduce one-shot and two-shot == `quant::reference::{one_shot, two_shot}` bit
//!   for bit (inputs widen exactly, so bf16/f16 results are the reference rounded), 1 element to
//!   256 MB, odd counts, Avg, in place;
//! - all-gather, reduce-scatter, all-to-all == the codec's prediction, bit for bit;
//! - accuracy against an f64 sum (N(0,1)), no NaN/Inf, identical results on every rank;
//! - time of quantization alone;
//! - nothing written outside any output: every output is poisoned before the call and read
//!   back around the result, up to its guard band.
//!
//! Exits 1 on any mismatch or byte written outside an output.

use std::time::Instant;

use ferrocomm::quant::{Codec, Format};
use ferrocomm::{Algo, Config, DataType, ReduceOp};

mod support;
use support::cases::lowp::{self, all_reduce_case, all_to_all_v_cases, movers, random, to_dtype};
use support::cases::Body;
use support::*;

// ---------------------------------------------------------------- codec

/// Element counts of the full codec check: one element, odd counts around a few blocks, and one
/// of many blocks with a partial last one.
const CODEC_COUNTS: &[usize] = &[1, 13, 4099, 300_007];

/// Every format, block size and input dtype at the element counts `counts`.
fn codec_check(c: &mut Ctx, counts: &[usize]) -> Res<()> {
    let mut cases = 0;
    for fmt in Format::ALL {
        for block in [16usize, 32, 128, 512] {
            let codec = Codec::new(fmt, block)?;
            for dtype in [DataType::F32, DataType::BF16, DataType::F16] {
                for &n in counts {
                    let mut v = random(n, 7 + n as u64 + block as u64);
                    // Special blocks: zeros, tiny (subnormal scale), huge, NaN, -0.
                    if n > 10 * block {
                        v[..block].fill(0.0);
                        for (i, x) in v[block..2 * block].iter_mut().enumerate() {
                            *x = (i as f32 + 1.0) * 1e-39;
                        }
                        if dtype == DataType::F32 {
                            v[2 * block] = f32::MAX;
                            v[2 * block + 1] = -3.0e38;
                        }
                        v[3 * block + 5] = f32::NAN;
                        v[4 * block + 1] = -0.0;
                        v[5 * block + 2] = f32::INFINITY;
                    }
                    let (bytes, wide) = to_dtype(dtype, &v);
                    let mut want = vec![0u8; codec.encoded_bytes(n)];
                    codec.encode(&wide, &mut want);
                    let inb = c.buf(bytes.len())?;
                    inb.upload(0, &bytes)?;
                    let outb = c.buf(want.len())?;
                    outb.poison()?;
                    ferrocomm::cuda::quantize_on_device(
                        &c.cfg, &codec, dtype, inb.ptr, outb.ptr, n, 0, 1,
                    )?;
                    let got = outb.download(0, want.len())?;
                    let diff = got.iter().zip(&want).filter(|(a, b)| a != b).count();
                    let guard = outb.guard_hits(0, want.len())?;
                    cases += 1;
                    c.expect("lowp codec", diff == 0 && guard == 0, || {
                        format!(
                            "codec {fmt} B={block} {dtype} n={n}: {diff} bytes differ, {guard} \
                             written past the output"
                        )
                    });
                }
            }
        }
    }
    if c.rank == 0 {
        println!("codec: {cases} cases, GPU bytes == CPU Codec::encode bytes");
    }
    Ok(())
}

/// The handful of cases run under compute-sanitizer (memcheck, racecheck): the codec at two
/// counts (every format, block and dtype), then one low-precision call of each kind on an odd
/// bf16 count: all-reduce one-shot out of place and two-shot in place, all-gather,
/// reduce-scatter, all-to-all and all-to-all-v. No accuracy sweep, no timing.
fn sanitize_cases(c: &mut Ctx) -> Res<()> {
    codec_check(c, &[13, 4099])?;
    let e4 = Codec::new(Format::E4M3, c.cfg.low_precision.block)?;
    let n = 4099;
    let bf = DataType::BF16;
    for (k, (algo, in_place)) in [(Algo::Flat, false), (Algo::Tree, true)]
        .into_iter()
        .enumerate()
    {
        let seed = 70_000 + k as u64;
        all_reduce_case(c, &e4, bf, n, algo, ReduceOp::Sum, in_place, seed)?;
    }
    c.compare_hashes()?;
    movers(c, &[n], &[bf])?;
    all_to_all_v_cases(c, "", &[[[333, n], [n, 1]]], &[bf])?;
    // In pieces: a 1 MiB staging holds ~500 K bf16 elements per crossing part.
    let mut small = c.cfg.clone();
    small.cuda_staging_bytes = 1 << 20;
    let pieces = [[[333, 600_001], [600_001, 1]]];
    c.with_comm("gpu_check_lowp_sanitize_small", small, |c| {
        all_to_all_v_cases(c, " in pieces", &pieces, &[bf])
    })
}

/// Time of quantization alone (the fused kernels' encode step run by itself).
fn quant_cost(c: &mut Ctx) -> Res<()> {
    let codec = Codec::new(Format::E4M3, c.cfg.low_precision.block)?;
    let mut line = String::from("quantize alone (E4M3, encode kernel, one wave):");
    for (dtype, bytes) in [
        (DataType::BF16, 64usize << 20),
        (DataType::BF16, 256 << 20),
        (DataType::F32, 256 << 20),
    ] {
        let n = bytes / dtype.size();
        let inb = c.buf(bytes)?;
        // Random values in every block: a block of zeros takes the encoder's zero-scale exit
        // and skips its divisions, so a partly filled buffer would time less work.
        let chunk = to_dtype(dtype, &random(n.min(1 << 20), 1)).0;
        for off in (0..bytes).step_by(chunk.len()) {
            inb.upload(off, &chunk[..chunk.len().min(bytes - off)])?;
        }
        let outb = c.buf(codec.encoded_bytes(n))?;
        outb.poison()?;
        ferrocomm::cuda::quantize_on_device(&c.cfg, &codec, dtype, inb.ptr, outb.ptr, n, 0, 1)?;
        // Launches back to back and one wait: the time per launch is the kernel's.
        let reps = 50;
        let t = Instant::now();
        ferrocomm::cuda::quantize_on_device(&c.cfg, &codec, dtype, inb.ptr, outb.ptr, n, 0, reps)?;
        let us = t.elapsed().as_secs_f64() * 1e6 / reps as f64;
        let guard = outb.guard_hits(0, codec.encoded_bytes(n))?;
        c.expect("lowp quantize", guard == 0, || {
            format!(
                "quantize {dtype} {} MB: {guard} bytes written past the codes",
                bytes >> 20
            )
        });
        line += &format!(
            " {dtype} {} MB {us:.1} us ({:.0} GB/s read);",
            bytes >> 20,
            bytes as f64 / us / 1e3
        );
    }
    if c.rank == 0 {
        println!("{line}");
    }
    Ok(())
}

fn main() {
    run_main("gpu_check_lowp", real_main)
}

fn real_main() -> Res<i32> {
    let args = flags(&["--quick", "--sanitize", "--no-timing", "--quant-time"])?;
    let has = |f: &str| args.iter().any(|a| a == f);
    let (mut c, _cuda) = gpu_ctx("gpu_check_lowp", Config::from_env()?, has("--quick"))?;
    if c.rank == 0 {
        println!(
            "gpu_check_lowp: {} ranks, backend {}, block {}, staging {} MiB",
            c.world,
            c.comm.backend_name(),
            c.cfg.low_precision.block,
            c.cfg.cuda_staging_bytes >> 20
        );
    }
    let t = Instant::now();
    if has("--sanitize") {
        // Under compute-sanitizer kernels run 10-100x slower: one call of each kind.
        sanitize_cases(&mut c)?;
    } else if has("--quant-time") {
        // The encode kernel alone (any world size, one GPU is enough; no peer to wait for, so a
        // profiler may replay it): its bytes against the CPU codec, then its time.
        codec_check(&mut c, CODEC_COUNTS)?;
        quant_cost(&mut c)?;
    } else {
        full_suite(&mut c, has("--no-timing"))?;
    }
    c.compare_hashes()?;
    let secs = t.elapsed().as_secs_f64();
    report(
        &c,
        "gpu_check_lowp",
        &format!("all results correct ({secs:.1} s)"),
    )
}

/// Codec, the low-precision bodies (all-reduce, the other collectives, all-to-all-v whole and
/// in pieces, accuracy), the calls that disagree between ranks, then (unless `no_timing`) the
/// time of quantization alone.
fn full_suite(c: &mut Ctx, no_timing: bool) -> Res<()> {
    codec_check(c, CODEC_COUNTS)?;
    let mut bodies: Vec<(&str, Body)> = lowp::BODIES.to_vec();
    if c.world != 2 {
        bodies.retain(|(name, _)| !name.ends_with("all_to_all_v"));
    }
    for (_, body) in bodies {
        body(c)?;
    }
    disagreeing::low_precision(c)?;
    if !no_timing {
        quant_cost(c)?;
    }
    Ok(())
}
