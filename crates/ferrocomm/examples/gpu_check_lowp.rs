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

use std::time::{Duration, Instant};

use ferrocomm::bootstrap::all_gather_bytes;
use ferrocomm::quant::{reference, Codec, Format};
use ferrocomm::{
    Algo, CallOpts, Communicator, Config, DataType, Device, Input, LowPrecisionChoice, ReduceOp,
    Splits, View, ViewMut,
};
use half::{bf16, f16};
use rand::{Rng, SeedableRng};

mod support;
use support::*;

/// f32 values, rounded to `dtype` (so they widen back exactly), as element bytes and as f32.
fn to_dtype(dtype: DataType, v: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let mut bytes = Vec::with_capacity(v.len() * dtype.size());
    let mut wide = Vec::with_capacity(v.len());
    for &x in v {
        match dtype {
            DataType::F32 => {
                bytes.extend_from_slice(&x.to_le_bytes());
                wide.push(x);
            }
            DataType::BF16 => {
                let h = bf16::from_f32(x);
                bytes.extend_from_slice(&h.to_le_bytes());
                wide.push(h.to_f32());
            }
            _ => {
                let h = f16::from_f32(x);
                bytes.extend_from_slice(&h.to_le_bytes());
                wide.push(h.to_f32());
            }
        }
    }
    (bytes, wide)
}

/// f32 results rounded to `dtype`, as bytes (the kernels round with RNE as `half` does).
fn round_bytes(dtype: DataType, v: &[f32]) -> Vec<u8> {
    to_dtype(dtype, v).0
}

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let v: f32 = rng.random_range(-3.0..3.0);
            v * if rng.random_bool(0.01) { 50.0 } else { 1.0 }
        })
        .collect()
}

struct Ctx {
    rank: usize,
    world: usize,
    dev: u32,
    cfg: Config,
    failures: Vec<String>,
    passed: usize,
    seq: u64,
}

impl Ctx {
    fn same_everywhere(&mut self, comm: &Communicator, bytes: &[u8]) -> Res<bool> {
        self.seq += 1;
        let h = fnv(bytes).to_le_bytes();
        let all = all_gather_bytes(
            &**comm.store(),
            &format!("lpchk/{}", self.seq),
            self.rank,
            self.world,
            &h,
            Duration::from_secs(120),
        )?;
        Ok(all.iter().all(|v| v.as_slice() == h))
    }
    fn verdict(&mut self, what: String, ok: bool) {
        if ok {
            self.passed += 1;
        } else {
            if self.rank == 0 {
                eprintln!("FAIL {what}");
            }
            self.failures.push(what);
        }
    }
}

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
                    let inb = Buf::new(bytes.len())?;
                    inb.upload(0, &bytes)?;
                    let outb = Buf::new(want.len())?;
                    outb.poison()?;
                    ferrocomm::cuda::quantize_on_device(
                        &c.cfg, &codec, dtype, inb.ptr, outb.ptr, n, 0, 1,
                    )?;
                    let got = outb.download(0, want.len())?;
                    let diff = got.iter().zip(&want).filter(|(a, b)| a != b).count();
                    let guard = outb.guard_hits(0, want.len())?;
                    cases += 1;
                    c.verdict(
                        format!(
                            "codec {fmt} B={block} {dtype} n={n}: {diff} bytes differ, {guard} \
                             written past the output"
                        ),
                        diff == 0 && guard == 0,
                    );
                }
            }
        }
    }
    if c.rank == 0 {
        println!("codec: {cases} cases, GPU bytes == CPU Codec::encode bytes");
    }
    Ok(())
}

// ---------------------------------------------------------------- all-reduce

#[allow(clippy::too_many_arguments)]
fn all_reduce_case(
    c: &mut Ctx,
    comm: &Communicator,
    codec: &Codec,
    dtype: DataType,
    n: usize,
    algo: Algo,
    op: ReduceOp,
    in_place: bool,
    seed: u64,
) -> Res<Option<Vec<f32>>> {
    let inputs: Vec<Vec<f32>> = (0..c.world)
        .map(|r| to_dtype(dtype, &random(n, seed * 977 + r as u64)).1)
        .collect();
    let (bytes, _) = to_dtype(dtype, &inputs[c.rank]);
    let inb = Buf::new(bytes.len())?;
    let outb = Buf::new(bytes.len())?;
    outb.poison()?;
    let opts = CallOpts::default()
        .with_algo(algo)
        .with_low_precision(LowPrecisionChoice::On(codec.format));
    let dev = Device::Cuda(c.dev);
    // SAFETY: both buffers hold `n` elements of this device and outlive the synchronised call.
    let res = unsafe {
        let o = ViewMut::from_raw(outb.ptr as *mut u8, n, dtype, dev);
        if in_place {
            outb.upload(0, &bytes)?;
            comm.all_reduce(Input::InPlace, o, op, &opts)
        } else {
            inb.upload(0, &bytes)?;
            let i = View::from_raw(inb.ptr as *const u8, n, dtype, dev);
            comm.all_reduce(Input::Buf(i), o, op, &opts)
        }
    };
    sync()?;
    let what = format!(
        "all_reduce {} {algo} {} B={} {dtype} n={n} {op:?} inplace={in_place}",
        codec.format, "", codec.block
    );
    if let Err(e) = res {
        c.verdict(format!("{what}: error {e}"), false);
        return Ok(None);
    }
    let got = outb.download(0, bytes.len())?;
    let guard = outb.guard_hits(0, bytes.len())?;
    let mut want = if algo == Algo::Tree {
        if op == ReduceOp::Avg {
            // The owner divides before quantizing.
            let s: Vec<f32> = reference::one_shot(codec, &inputs)
                .iter()
                .map(|x| x / c.world as f32)
                .collect();
            codec.quantize_dequantize(&s)
        } else {
            reference::two_shot(codec, &inputs)
        }
    } else {
        reference::one_shot(codec, &inputs)
    };
    if op == ReduceOp::Avg && algo != Algo::Tree {
        want.iter_mut().for_each(|x| *x /= c.world as f32);
    }
    let want_b = round_bytes(dtype, &want);
    let es = dtype.size();
    let wrong = got
        .chunks(es)
        .zip(want_b.chunks(es))
        .filter(|(a, b)| a != b)
        .count();
    let same = c.same_everywhere(comm, &got)?;
    c.verdict(
        format!(
            "{what}: {wrong} elements differ from the reference, {guard} bytes written past \
             the output, identical on all ranks: {same}"
        ),
        wrong == 0 && guard == 0 && same,
    );
    Ok((dtype == DataType::F32).then(|| {
        got.chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }))
}

fn all_reduce_checks(c: &mut Ctx, comm: &Communicator, quick: bool) -> Res<()> {
    let e4 = Codec::new(Format::E4M3, c.cfg.low_precision.block)?;
    let mut k = 0u64;
    let mut counts = vec![
        1usize,
        3,
        127,
        129,
        1000,
        4097,
        65_537,
        262_145,
        (1 << 20) / 4 + 3,
    ];
    if !quick {
        counts.extend([(16 << 20) / 4 + 1, (64 << 20) / 4 - 5, (256 << 20) / 4]);
    }
    for &n in &counts {
        for algo in [Algo::Flat, Algo::Tree] {
            k += 1;
            all_reduce_case(
                c,
                comm,
                &e4,
                DataType::F32,
                n,
                algo,
                ReduceOp::Sum,
                k % 3 == 0,
                k,
            )?;
        }
    }
    for dtype in [DataType::BF16, DataType::F16] {
        let big = if quick || dtype == DataType::F16 {
            2_000_001
        } else {
            64 << 20
        };
        for &n in &[5usize, 4099, 1_000_003, big] {
            for algo in [Algo::Flat, Algo::Tree] {
                k += 1;
                all_reduce_case(c, comm, &e4, dtype, n, algo, ReduceOp::Sum, false, k)?;
            }
        }
    }
    for fmt in [Format::E5M2, Format::Int8] {
        let codec = Codec::new(fmt, c.cfg.low_precision.block)?;
        for algo in [Algo::Flat, Algo::Tree] {
            k += 1;
            all_reduce_case(
                c,
                comm,
                &codec,
                DataType::F32,
                777_777,
                algo,
                ReduceOp::Sum,
                false,
                k,
            )?;
            k += 1;
            all_reduce_case(
                c,
                comm,
                &codec,
                DataType::BF16,
                777_777,
                algo,
                ReduceOp::Avg,
                true,
                k,
            )?;
        }
    }
    if c.rank == 0 {
        println!("all_reduce: {k} cases checked against quant::reference (bit for bit)");
    }
    Ok(())
}

/// Relative L2 and max abs error of one-shot (and two-shot) on N(0,1), and finiteness.
fn accuracy(c: &mut Ctx, comm: &Communicator, codec: &Codec, label: &str) -> Res<()> {
    let n = 1 << 20;
    let inputs: Vec<Vec<f32>> = (0..c.world)
        .map(|r| reference::Data::Normal.generate(n, 4242 + r as u64))
        .collect();
    let exact = reference::exact_sum(&inputs);
    let inb = Buf::new(n * 4)?;
    let outb = Buf::new(n * 4)?;
    let dev = Device::Cuda(c.dev);
    let mut line = format!("accuracy {label} N(0,1) {} ranks:", c.world);
    for algo in [Algo::Flat, Algo::Tree] {
        inb.upload(0, &to_dtype(DataType::F32, &inputs[c.rank]).0)?;
        outb.poison()?;
        let opts = CallOpts::default()
            .with_algo(algo)
            .with_low_precision(LowPrecisionChoice::On(codec.format));
        // SAFETY: n f32 of this device each, synchronised below.
        unsafe {
            let i = View::from_raw(inb.ptr as *const u8, n, DataType::F32, dev);
            let o = ViewMut::from_raw(outb.ptr as *mut u8, n, DataType::F32, dev);
            comm.all_reduce(Input::Buf(i), o, ReduceOp::Sum, &opts)?;
        }
        sync()?;
        let got: Vec<f32> = outb
            .download(0, n * 4)?
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let guard = outb.guard_hits(0, n * 4)?;
        let st = reference::error_stats(&got, &exact, None);
        let finite = got.iter().all(|x| x.is_finite());
        let same = c.same_everywhere(comm, &to_dtype(DataType::F32, &got).0)?;
        line += &format!(
            " {algo}: rel L2 {:.3}% max abs {:.3e} finite {finite} identical {same};",
            st.rel_l2 * 100.0,
            st.max_abs
        );
        let limit = match (codec.format, algo) {
            (Format::E4M3, Algo::Flat) => Some(0.035),
            (Format::Int8, Algo::Flat) if codec.block == 32 => Some(0.007),
            _ => None,
        };
        c.verdict(
            format!(
                "accuracy {label} {algo}: rel L2 {} finite {finite} same {same}, {guard} bytes \
                 written past the output",
                st.rel_l2
            ),
            finite && same && guard == 0 && limit.is_none_or(|l| st.rel_l2 <= l),
        );
    }
    if c.rank == 0 {
        println!("{line}");
    }
    Ok(())
}

// ---------------------------------------------------------------- the other collectives

/// All-gather, reduce-scatter and all-to-all (E4M3) of `parts` elements per part, each dtype.
fn movers(c: &mut Ctx, comm: &Communicator, parts: &[usize], dtypes: &[DataType]) -> Res<()> {
    let codec = Codec::new(Format::E4M3, c.cfg.low_precision.block)?;
    let w = c.world;
    let dev = Device::Cuda(c.dev);
    let opts = CallOpts::default().with_low_precision(LowPrecisionChoice::On(Format::E4M3));
    for (k, &part) in parts.iter().enumerate() {
        for &dtype in dtypes {
            let es = dtype.size();
            // Full-size input of every rank (all-gather uses part `rank` of it).
            let all: Vec<Vec<f32>> = (0..w)
                .map(|r| to_dtype(dtype, &random(w * part, 5000 + k as u64 * 10 + r as u64)).1)
                .collect();
            let mine = to_dtype(dtype, &all[c.rank]).0;
            let inb = Buf::new(mine.len())?;
            inb.upload(0, &mine)?;
            let outb = Buf::new(w * part * es)?;
            let qd = |x: &[f32]| codec.quantize_dequantize(x);
            let slice = |r: usize, p: usize| &all[r][p * part..(p + 1) * part];
            // all_gather: part r of the output = Q(rank r's part r).
            outb.poison()?;
            // SAFETY: sizes as the collectives require; synchronised before reading.
            unsafe {
                let i = View::from_raw(
                    (inb.ptr + (c.rank * part * es) as u64) as *const u8,
                    part,
                    dtype,
                    dev,
                );
                let o = ViewMut::from_raw(outb.ptr as *mut u8, w * part, dtype, dev);
                comm.all_gather(Input::Buf(i), o, &opts)?;
            }
            sync()?;
            let want: Vec<f32> = (0..w).flat_map(|r| qd(slice(r, r))).collect();
            let got = outb.download(0, w * part * es)?;
            let same = c.same_everywhere(comm, &got)?;
            let guard = outb.guard_hits(0, w * part * es)?;
            c.verdict(
                format!("all_gather {dtype} part={part} same={same} guard hits {guard}"),
                got == round_bytes(dtype, &want) && same && guard == 0,
            );
            // reduce_scatter: one-shot sum of part `rank` over ranks.
            outb.poison()?;
            // SAFETY: as above.
            unsafe {
                let i = View::from_raw(inb.ptr as *const u8, w * part, dtype, dev);
                let o = ViewMut::from_raw(outb.ptr as *mut u8, part, dtype, dev);
                comm.reduce_scatter(Input::Buf(i), o, ReduceOp::Sum, &opts)?;
            }
            sync()?;
            let parts: Vec<&[f32]> = (0..w).map(|r| slice(r, c.rank)).collect();
            let want = reference::one_shot(&codec, &parts);
            let got = outb.download(0, part * es)?;
            let guard = outb.guard_hits(0, part * es)?;
            c.verdict(
                format!("reduce_scatter {dtype} part={part} guard hits {guard}"),
                got == round_bytes(dtype, &want) && guard == 0,
            );
            // all_to_all: part r of the output = Q(rank r's part `rank`), our own part as it is.
            outb.poison()?;
            // SAFETY: as above.
            unsafe {
                let i = View::from_raw(inb.ptr as *const u8, w * part, dtype, dev);
                let o = ViewMut::from_raw(outb.ptr as *mut u8, w * part, dtype, dev);
                comm.all_to_all(Input::Buf(i), o, &opts)?;
            }
            sync()?;
            let want: Vec<f32> = (0..w)
                .flat_map(|r| match r == c.rank {
                    true => slice(r, r).to_vec(),
                    false => qd(slice(r, c.rank)),
                })
                .collect();
            let got = outb.download(0, w * part * es)?;
            let guard = outb.guard_hits(0, w * part * es)?;
            c.verdict(
                format!("all_to_all {dtype} part={part} guard hits {guard}"),
                got == round_bytes(dtype, &want) && guard == 0,
            );
            // The same in place (the input uploaded into the poisoned output buffer).
            outb.poison()?;
            outb.upload(0, &mine)?;
            // SAFETY: as above.
            unsafe {
                let o = ViewMut::from_raw(outb.ptr as *mut u8, w * part, dtype, dev);
                comm.all_to_all(Input::InPlace, o, &opts)?;
            }
            sync()?;
            let got = outb.download(0, w * part * es)?;
            let guard = outb.guard_hits(0, w * part * es)?;
            c.verdict(
                format!("all_to_all in place {dtype} part={part} guard hits {guard}"),
                got == round_bytes(dtype, &want) && guard == 0,
            );
        }
    }
    if c.rank == 0 {
        println!("all_gather / reduce_scatter / all_to_all: checked against the codec");
    }
    Ok(())
}

/// Count matrices of the all-to-all-v check: skewed (a crossing part of 9 M elements: 36 MB of
/// f32 and 18 MB of bf16, both through the plain kernel, in one piece of a 64 MiB staging),
/// odd, zero parts each way.
const A2AV_COUNTS: &[[[usize; 2]; 2]] = &[
    [[333, 70_001], [3_000_017, 1]],
    [[4099, 0], [17, 5]],
    [[0, 1], [1, 0]],
    [[1_000, 9_000_001], [129, 2_000]],
    // Symmetric (also in place): crossing parts of 5,000,003 each way, own parts that differ.
    [[77, 5_000_003], [5_000_003, 4_101]],
];

/// Low-precision all-to-all-v (two ranks): count matrices `m[s][d]` (elements rank s sends to
/// rank d) with skewed, odd and zero counts, the parts packed in rank order. Rank r's output part
/// from rank s is Q(rank s's part for r) rounded to the dtype, its own part exact; anything else
/// (a full-precision path, a part decoded short or long) fails the byte comparison. Symmetric
/// matrices (every part keeps its size) run in place too.
fn all_to_all_v_cases(
    c: &mut Ctx,
    comm: &Communicator,
    what: &str,
    matrices: &[[[usize; 2]; 2]],
    dtypes: &[DataType],
) -> Res<()> {
    if c.world != 2 {
        return Ok(());
    }
    let codec = Codec::new(Format::E4M3, c.cfg.low_precision.block)?;
    let dev = Device::Cuda(c.dev);
    let opts = CallOpts::default().with_low_precision(LowPrecisionChoice::On(Format::E4M3));
    let me = c.rank;
    for (k, m) in matrices.iter().enumerate() {
        for &dtype in dtypes {
            let es = dtype.size();
            // Every rank's whole input (its parts packed in rank order), on every rank.
            let inputs: Vec<Vec<f32>> = (0..2)
                .map(|s| {
                    let n = m[s][0] + m[s][1];
                    to_dtype(dtype, &random(n, 9000 + 10 * k as u64 + s as u64)).1
                })
                .collect();
            let part = |s: usize, d: usize| {
                let at = if d == 0 { 0 } else { m[s][0] };
                &inputs[s][at..at + m[s][d]]
            };
            let splits = Splits::packed(m[me].to_vec(), vec![m[0][me], m[1][me]]);
            let mine = to_dtype(dtype, &inputs[me]).0;
            let out_n = m[0][me] + m[1][me];
            let want: Vec<f32> = (0..2)
                .flat_map(|s| match s == me {
                    true => part(s, me).to_vec(),
                    false => codec.quantize_dequantize(part(s, me)),
                })
                .collect();
            // Out of place; in place too where every part keeps its size (a symmetric matrix).
            for in_place in [false, true] {
                if in_place && m[0][1] != m[1][0] {
                    continue;
                }
                let inb = Buf::new(mine.len().max(es))?;
                let outb = Buf::new(out_n.max(1) * es)?;
                outb.poison()?;
                if in_place {
                    outb.upload(0, &mine)?;
                } else {
                    inb.upload(0, &mine)?;
                }
                // SAFETY: sizes as the splits say; synchronised before reading.
                unsafe {
                    let o = ViewMut::from_raw(outb.ptr as *mut u8, out_n, dtype, dev);
                    let input = if in_place {
                        Input::InPlace
                    } else {
                        let n = inputs[me].len();
                        Input::Buf(View::from_raw(inb.ptr as *const u8, n, dtype, dev))
                    };
                    comm.all_to_all_v(input, o, &splits, &opts)?;
                }
                sync()?;
                let got = outb.download(0, out_n * es)?;
                let guard = outb.guard_hits(0, out_n * es)?;
                c.verdict(
                    format!(
                        "all_to_all_v{what} {dtype} counts {m:?} in_place={in_place} guard hits \
                         {guard}"
                    ),
                    got == round_bytes(dtype, &want) && guard == 0,
                );
            }
        }
    }
    if c.rank == 0 {
        println!("all_to_all_v{what}: checked against the codec");
    }
    Ok(())
}

/// The handful of cases run under compute-sanitizer (memcheck, racecheck): the codec at two
/// counts (every format, block and dtype), then one low-precision call of each kind on an odd
/// bf16 count: all-reduce one-shot out of place and two-shot in place, all-gather,
/// reduce-scatter, all-to-all and all-to-all-v. No accuracy sweep, no timing.
fn sanitize_cases(c: &mut Ctx, comm: &Communicator) -> Res<()> {
    codec_check(c, &[13, 4099])?;
    let e4 = Codec::new(Format::E4M3, c.cfg.low_precision.block)?;
    let n = 4099;
    for (k, (algo, in_place)) in [(Algo::Flat, false), (Algo::Tree, true)]
        .into_iter()
        .enumerate()
    {
        let seed = 70_000 + k as u64;
        all_reduce_case(
            c,
            comm,
            &e4,
            DataType::BF16,
            n,
            algo,
            ReduceOp::Sum,
            in_place,
            seed,
        )?;
    }
    movers(c, comm, &[n], &[DataType::BF16])?;
    all_to_all_v_cases(c, comm, "", &[[[333, n], [n, 1]]], &[DataType::BF16])?;
    // In pieces: a 1 MiB staging holds ~500 K bf16 elements per crossing part.
    let mut small = c.cfg.clone();
    small.cuda_staging_bytes = 1 << 20;
    let comm = comm_with("gpu_check_lowp_sanitize_small", small)?;
    all_to_all_v_cases(
        c,
        &comm,
        " in pieces",
        &[[[333, 600_001], [600_001, 1]]],
        &[DataType::BF16],
    )
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
        let inb = Buf::new(bytes)?;
        // Random values in every block: a block of zeros takes the encoder's zero-scale exit
        // and skips its divisions, so a partly filled buffer would time less work.
        let chunk = to_dtype(dtype, &random(n.min(1 << 20), 1)).0;
        for off in (0..bytes).step_by(chunk.len()) {
            inb.upload(off, &chunk[..chunk.len().min(bytes - off)])?;
        }
        let outb = Buf::new(codec.encoded_bytes(n))?;
        outb.poison()?;
        ferrocomm::cuda::quantize_on_device(&c.cfg, &codec, dtype, inb.ptr, outb.ptr, n, 0, 1)?;
        // Launches back to back and one wait: the time per launch is the kernel's.
        let reps = 50;
        let t = Instant::now();
        ferrocomm::cuda::quantize_on_device(&c.cfg, &codec, dtype, inb.ptr, outb.ptr, n, 0, reps)?;
        let us = t.elapsed().as_secs_f64() * 1e6 / reps as f64;
        let guard = outb.guard_hits(0, codec.encoded_bytes(n))?;
        c.verdict(
            format!(
                "quantize {dtype} {} MB: {guard} bytes written past the codes",
                bytes >> 20
            ),
            guard == 0,
        );
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
    let quick = args.iter().any(|a| a == "--quick");
    let quant_time = args.iter().any(|a| a == "--quant-time");
    let sanitize = args.iter().any(|a| a == "--sanitize");
    let no_timing = args.iter().any(|a| a == "--no-timing");
    let cfg = Config::from_env()?;
    let comm = comm_with("gpu_check_lowp", cfg.clone())?;
    let (rank, world) = (comm.rank(), comm.size());
    let Device::Cuda(dev) = comm.device() else {
        return Err("gpu_check_lowp needs a GPU".into());
    };
    let cuda = cudarc::driver::CudaContext::new(dev as usize)?;
    cuda.bind_to_thread()?;
    // The guard bands are read back after every call: first, that the read-back sees writes.
    Buf::guard_self_check(Device::Cuda(dev))?;
    let mut c = Ctx {
        rank,
        world,
        dev,
        cfg: cfg.clone(),
        failures: Vec::new(),
        passed: 0,
        seq: 0,
    };
    if rank == 0 {
        println!(
            "gpu_check_lowp: {world} ranks, backend {}, block {}, staging {} MiB",
            comm.backend_name(),
            cfg.low_precision.block,
            cfg.cuda_staging_bytes >> 20
        );
    }
    let t = Instant::now();
    if sanitize {
        // Under compute-sanitizer kernels run 10-100x slower: one call of each kind.
        sanitize_cases(&mut c, &comm)?;
    } else if quant_time {
        // The encode kernel alone (any world size, one GPU is enough; no peer to wait for, so a
        // profiler may replay it): its bytes against the CPU codec, then its time.
        codec_check(&mut c, CODEC_COUNTS)?;
        quant_cost(&mut c)?;
    } else {
        full_suite(&mut c, &comm, quick, no_timing)?;
    }
    if rank == 0 {
        println!(
            "gpu_check_lowp: {} passed, {} failed, {:.1} s",
            c.passed,
            c.failures.len(),
            t.elapsed().as_secs_f64()
        );
    }
    Ok(if c.failures.is_empty() { 0 } else { 1 })
}

/// Codec, all-reduce and the other collectives at every size, accuracy, then (unless
/// `no_timing`) the time of quantization alone.
fn full_suite(c: &mut Ctx, comm: &Communicator, quick: bool, no_timing: bool) -> Res<()> {
    let cfg = c.cfg.clone();
    codec_check(c, CODEC_COUNTS)?;
    all_reduce_checks(c, comm, quick)?;
    movers(
        c,
        comm,
        // 17,000,003 elements: parts of 34 MB (bf16) and 68 MB (f32) run the wide one-shot
        // kernel (from 32 MiB), in a single chunk.
        &[1, 333, 70_001, 3_000_017, 17_000_003],
        &[DataType::F32, DataType::BF16],
    )?;
    all_to_all_v_cases(c, comm, "", A2AV_COUNTS, &[DataType::F32, DataType::BF16])?;
    // The same counts cut into pieces (one launch each): a 4 MiB staging holds ~2 M elements
    // per crossing part, so the 9 M-element part takes five.
    let mut small = cfg.clone();
    small.cuda_staging_bytes = 4 << 20;
    let comm_small = comm_with("gpu_check_lowp_small", small)?;
    all_to_all_v_cases(
        c,
        &comm_small,
        " in pieces",
        A2AV_COUNTS,
        &[DataType::F32, DataType::BF16],
    )?;
    drop(comm_small);
    let e4 = Codec::new(Format::E4M3, cfg.low_precision.block)?;
    accuracy(c, comm, &e4, &format!("e4m3 B={}", cfg.low_precision.block))?;
    // INT8 with 32-element blocks needs its own communicator (the block is a config setting).
    let mut cfg32 = cfg.clone();
    cfg32.low_precision.block = 32;
    let comm32 = comm_with("gpu_check_lowp_b32", cfg32)?;
    accuracy(c, &comm32, &Codec::new(Format::Int8, 32)?, "int8 B=32")?;
    accuracy(c, &comm32, &Codec::new(Format::E4M3, 32)?, "e4m3 B=32")?;
    drop(comm32);
    disagreeing_calls(c, &cfg)?;
    if !no_timing {
        quant_cost(c)?;
    }
    Ok(())
}

/// Calls whose counts differ between ranks (rank r passes n + r elements), one-shot and two-shot
/// all-reduce, all-gather and a chunked all-reduce, each on a communicator of its own with a 3 s
/// timeout: the call itself returns (kernels run asynchronously) and the next call on the
/// communicator reports "disagrees between ranks", on every rank; never a hang or a timeout.
fn disagreeing_calls(c: &mut Ctx, cfg: &Config) -> Res<()> {
    let dev = Device::Cuda(c.dev);
    let me = c.rank;
    let w = c.world;
    let b = Buf::new(64 << 20)?;
    b.poison()?;
    b.upload(0, &to_dtype(DataType::BF16, &random(1 << 20, 7)).0)?;
    // (what, elements on rank 0, all-reduce algorithm, all-gather instead, staging bytes)
    for (k, (what, n, algo, gather, staging)) in [
        ("all_reduce flat", 100_000usize, Algo::Flat, false, None),
        ("all_reduce tree", 100_000, Algo::Tree, false, None),
        ("all_gather", 70_001, Algo::Flat, true, None),
        // Two chunks of ~10M elements.
        (
            "all_reduce flat, in chunks",
            20_000_000,
            Algo::Flat,
            false,
            Some(16usize << 20),
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let mut cfg2 = cfg.clone();
        cfg2.timeout = Duration::from_secs(3);
        if let Some(bytes) = staging {
            cfg2.cuda_staging_bytes = bytes;
        }
        let comm = comm_with(&format!("gpu_check_lowp_bad{k}"), cfg2)?;
        let mine = n + me;
        let opts = CallOpts::default()
            .with_algo(algo)
            .with_low_precision(LowPrecisionChoice::On(Format::E4M3));
        let count = if gather { mine * w } else { mine };
        // SAFETY: 64 MiB of this device hold every count here in bf16.
        let first = unsafe {
            let o = ViewMut::from_raw(b.ptr as *mut u8, count, DataType::BF16, dev);
            if gather {
                comm.all_gather(Input::InPlace, o, &opts)
            } else {
                comm.all_reduce(Input::InPlace, o, ReduceOp::Sum, &opts)
            }
        };
        sync()?;
        // SAFETY: as above.
        let next = unsafe {
            let o = ViewMut::from_raw(b.ptr as *mut u8, 1024, DataType::BF16, dev);
            comm.all_reduce(Input::InPlace, o, ReduceOp::Sum, &opts)
        };
        sync()?;
        let shown = format!("{next:?}");
        let ok = first.is_ok() && shown.contains("disagrees between ranks");
        if me == 0 && ok {
            println!("mismatch ({what}): {shown}");
        }
        c.verdict(
            format!("{what}: counts {n} + rank: first {first:?}, then {shown}"),
            ok,
        );
        // After a timeout the communicator is unusable; a mismatch leaves it usable.
        std::mem::forget(comm);
    }
    // The calls' values are not checked, but none may write past the buffer.
    let guard = b.guard_hits(0, b.bytes)?;
    c.verdict(
        format!("disagreeing calls: {guard} bytes written past the buffer"),
        guard == 0,
    );
    Ok(())
}
