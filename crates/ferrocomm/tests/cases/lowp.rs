//! The low-precision bodies: quantized all-reduce one-shot (flat) and two-shot (tree) bit for
//! bit against `quant::reference` (inputs widen exactly, so bf16/f16 results are the reference
//! rounded), 1 element to 256 MB on a GPU, odd counts, Avg, in place, every format; all-gather,
//! reduce-scatter, all-to-all(-v) against the codec's prediction, bit for bit; accuracy against an
//! f64 sum (N(0,1)), no NaN/Inf; results identical on every rank; nothing written outside any
//! output.

use ferrocomm::quant::{reference, Codec, Format};
use ferrocomm::{Algo, CallOpts, DataType, Input, LowPrecisionChoice, ReduceOp, Splits};
use half::{bf16, f16};
use rand::{Rng, SeedableRng};

use super::*;

/// The bodies of this module, by name.
/// The last, all-to-all-v, runs at two ranks only (its count matrices are 2 x 2).
pub const BODIES: [(&str, Body); 4] = [
    ("low precision all_reduce", all_reduce_checks),
    ("low precision movers", movers_body),
    ("low precision accuracy", accuracy_body),
    ("low precision all_to_all_v", all_to_all_v_body),
];

/// f32 values, rounded to `dtype` (so they widen back exactly), as element bytes and as f32.
pub fn to_dtype(dtype: DataType, v: &[f32]) -> (Vec<u8>, Vec<f32>) {
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
pub fn round_bytes(dtype: DataType, v: &[f32]) -> Vec<u8> {
    to_dtype(dtype, v).0
}

pub fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let v: f32 = rng.random_range(-3.0..3.0);
            v * if rng.random_bool(0.01) { 50.0 } else { 1.0 }
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
pub fn all_reduce_case(
    c: &mut Ctx,
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
    let inb = c.buf(bytes.len())?;
    let outb = c.buf(bytes.len())?;
    outb.poison()?;
    let opts = CallOpts::default()
        .with_algo(algo)
        .with_low_precision(LowPrecisionChoice::On(codec.format));
    let dev = c.dev;
    let input = if in_place {
        outb.upload(0, &bytes)?;
        Input::InPlace
    } else {
        inb.upload(0, &bytes)?;
        // SAFETY: `n` elements of this device's buffer, alive until after the sync below.
        Input::Buf(unsafe { inb.view(0, n, dtype, dev) })
    };
    // SAFETY: as above.
    let out = unsafe { outb.view_mut(0, n, dtype, dev) };
    let res = c.comm.all_reduce(input, out, op, &opts);
    c.sync()?;
    let what = format!(
        "all_reduce {} {algo} {} B={} {dtype} n={n} {op:?} inplace={in_place}",
        codec.format, "", codec.block
    );
    if let Err(e) = res {
        c.expect("lowp all_reduce", false, || format!("{what}: error {e}"));
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
    c.hash("lowp all_reduce", what.clone(), &got);
    c.expect("lowp all_reduce", wrong == 0 && guard == 0, || {
        format!(
            "{what}: {wrong} elements differ from the reference, {guard} bytes written past \
             the output"
        )
    });
    Ok((dtype == DataType::F32).then(|| {
        got.chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }))
}

/// Quantized all-reduce of f32 at sizes of 1 element to 256 MB (to 256 KB with `--quick`, to
/// 64 K elements on the host), flat and tree, every third in place; bf16 and f16 up to 64 M
/// elements (2 M with `--quick`, 100 K on the host); E5M2 and INT8, f32 sums and bf16 averages
/// in place.
pub fn all_reduce_checks(c: &mut Ctx) -> Res<()> {
    let quick = c.quick;
    let e4 = Codec::new(Format::E4M3, c.cfg.low_precision.block)?;
    let mut k = 0u64;
    let mut counts = vec![1usize, 3, 127, 129, 1000, 4097, 65_537];
    if !c.host() {
        counts.extend([262_145, (1 << 20) / 4 + 3]);
    }
    if !quick && !c.host() {
        counts.extend([(16 << 20) / 4 + 1, (64 << 20) / 4 - 5, (256 << 20) / 4]);
    }
    for &n in &counts {
        for algo in [Algo::Flat, Algo::Tree] {
            k += 1;
            all_reduce_case(c, &e4, DataType::F32, n, algo, ReduceOp::Sum, k % 3 == 0, k)?;
        }
    }
    for dtype in [DataType::BF16, DataType::F16] {
        let big = if quick || dtype == DataType::F16 {
            2_000_001
        } else {
            64 << 20
        };
        let sizes = c.pick([5usize, 4099, 30_001, 100_003], [5, 4099, 1_000_003, big]);
        for n in sizes {
            for algo in [Algo::Flat, Algo::Tree] {
                k += 1;
                all_reduce_case(c, &e4, dtype, n, algo, ReduceOp::Sum, false, k)?;
            }
        }
    }
    let n = c.pick(77_777, 777_777);
    for fmt in [Format::E5M2, Format::Int8] {
        let codec = Codec::new(fmt, c.cfg.low_precision.block)?;
        for algo in [Algo::Flat, Algo::Tree] {
            k += 1;
            all_reduce_case(c, &codec, DataType::F32, n, algo, ReduceOp::Sum, false, k)?;
            k += 1;
            all_reduce_case(c, &codec, DataType::BF16, n, algo, ReduceOp::Avg, true, k)?;
        }
    }
    if c.rank == 0 {
        println!("all_reduce: {k} cases checked against quant::reference (bit for bit)");
    }
    c.compare_hashes()
}

/// Relative L2 and max abs error of one-shot (and two-shot) on N(0,1), and finiteness.
pub fn accuracy(c: &mut Ctx, codec: &Codec, label: &str) -> Res<()> {
    let n = c.pick(1 << 16, 1 << 20);
    let inputs: Vec<Vec<f32>> = (0..c.world)
        .map(|r| reference::Data::Normal.generate(n, 4242 + r as u64))
        .collect();
    let exact = reference::exact_sum(&inputs);
    let inb = c.buf(n * 4)?;
    let outb = c.buf(n * 4)?;
    let dev = c.dev;
    let mut line = format!("accuracy {label} N(0,1) {} ranks:", c.world);
    for algo in [Algo::Flat, Algo::Tree] {
        inb.upload(0, &to_dtype(DataType::F32, &inputs[c.rank]).0)?;
        outb.poison()?;
        let opts = CallOpts::default()
            .with_algo(algo)
            .with_low_precision(LowPrecisionChoice::On(codec.format));
        // SAFETY: n f32 of this device each, synchronised below.
        let (i, o) = unsafe {
            (
                inb.view(0, n, DataType::F32, dev),
                outb.view_mut(0, n, DataType::F32, dev),
            )
        };
        c.comm.all_reduce(Input::Buf(i), o, ReduceOp::Sum, &opts)?;
        c.sync()?;
        let got: Vec<f32> = outb
            .download(0, n * 4)?
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let guard = outb.guard_hits(0, n * 4)?;
        let st = reference::error_stats(&got, &exact, None);
        let finite = got.iter().all(|x| x.is_finite());
        let what = format!("accuracy {label} {algo}");
        c.hash(
            "lowp accuracy",
            what.clone(),
            &to_dtype(DataType::F32, &got).0,
        );
        line += &format!(
            " {algo}: rel L2 {:.3}% max abs {:.3e} finite {finite};",
            st.rel_l2 * 100.0,
            st.max_abs
        );
        let limit = match (codec.format, algo) {
            (Format::E4M3, Algo::Flat) => Some(0.035),
            (Format::Int8, Algo::Flat) if codec.block == 32 => Some(0.007),
            _ => None,
        };
        let ok = finite && guard == 0 && limit.is_none_or(|l| st.rel_l2 <= l);
        c.expect("lowp accuracy", ok, || {
            format!(
                "{what}: rel L2 {} finite {finite}, {guard} bytes written past the output",
                st.rel_l2
            )
        });
    }
    if c.rank == 0 {
        println!("{line}");
    }
    c.compare_hashes()
}

/// Accuracy of E4M3 at the configured block, and of INT8 and E4M3 with 32-element blocks (a
/// communicator of their own: the block is a config setting).
pub fn accuracy_body(c: &mut Ctx) -> Res<()> {
    let block = c.cfg.low_precision.block;
    accuracy(
        c,
        &Codec::new(Format::E4M3, block)?,
        &format!("e4m3 B={block}"),
    )?;
    let mut cfg32 = c.cfg.clone();
    cfg32.low_precision.block = 32;
    c.with_comm("cases_lowp_b32", cfg32, |c| {
        accuracy(c, &Codec::new(Format::Int8, 32)?, "int8 B=32")?;
        accuracy(c, &Codec::new(Format::E4M3, 32)?, "e4m3 B=32")
    })
}

/// All-gather, reduce-scatter and all-to-all (E4M3) of `parts` elements per part, each dtype.
pub fn movers(c: &mut Ctx, parts: &[usize], dtypes: &[DataType]) -> Res<()> {
    let codec = Codec::new(Format::E4M3, c.cfg.low_precision.block)?;
    let w = c.world;
    let dev = c.dev;
    let opts = CallOpts::default().with_low_precision(LowPrecisionChoice::On(Format::E4M3));
    for (k, &part) in parts.iter().enumerate() {
        for &dtype in dtypes {
            let es = dtype.size();
            // Full-size input of every rank (all-gather uses part `rank` of it).
            let all: Vec<Vec<f32>> = (0..w)
                .map(|r| to_dtype(dtype, &random(w * part, 5000 + k as u64 * 10 + r as u64)).1)
                .collect();
            let mine = to_dtype(dtype, &all[c.rank]).0;
            let inb = c.buf(mine.len())?;
            inb.upload(0, &mine)?;
            let outb = c.buf(w * part * es)?;
            let qd = |x: &[f32]| codec.quantize_dequantize(x);
            let slice = |r: usize, p: usize| &all[r][p * part..(p + 1) * part];
            // all_gather: part r of the output = Q(rank r's part r).
            outb.poison()?;
            // SAFETY: sizes as the collectives require; synchronised before reading.
            let (i, o) = unsafe {
                (
                    inb.view(c.rank * part * es, part, dtype, dev),
                    outb.view_mut(0, w * part, dtype, dev),
                )
            };
            c.comm.all_gather(Input::Buf(i), o, &opts)?;
            c.sync()?;
            let want: Vec<f32> = (0..w).flat_map(|r| qd(slice(r, r))).collect();
            let got = outb.download(0, w * part * es)?;
            let what = format!("all_gather {dtype} part={part}");
            c.hash("lowp movers", what.clone(), &got);
            let guard = outb.guard_hits(0, w * part * es)?;
            let ok = got == round_bytes(dtype, &want) && guard == 0;
            c.expect("lowp movers", ok, || format!("{what}: guard hits {guard}"));
            // reduce_scatter: one-shot sum of part `rank` over ranks.
            outb.poison()?;
            // SAFETY: as above.
            let (i, o) = unsafe {
                (
                    inb.view(0, w * part, dtype, dev),
                    outb.view_mut(0, part, dtype, dev),
                )
            };
            c.comm
                .reduce_scatter(Input::Buf(i), o, ReduceOp::Sum, &opts)?;
            c.sync()?;
            let parts: Vec<&[f32]> = (0..w).map(|r| slice(r, c.rank)).collect();
            let want = reference::one_shot(&codec, &parts);
            let got = outb.download(0, part * es)?;
            let guard = outb.guard_hits(0, part * es)?;
            let ok = got == round_bytes(dtype, &want) && guard == 0;
            c.expect("lowp movers", ok, || {
                format!("reduce_scatter {dtype} part={part} guard hits {guard}")
            });
            // all_to_all: part r of the output = Q(rank r's part `rank`), our own part as it is.
            outb.poison()?;
            // SAFETY: as above.
            let (i, o) = unsafe {
                (
                    inb.view(0, w * part, dtype, dev),
                    outb.view_mut(0, w * part, dtype, dev),
                )
            };
            c.comm.all_to_all(Input::Buf(i), o, &opts)?;
            c.sync()?;
            let want: Vec<f32> = (0..w)
                .flat_map(|r| match r == c.rank {
                    true => slice(r, r).to_vec(),
                    false => qd(slice(r, c.rank)),
                })
                .collect();
            let got = outb.download(0, w * part * es)?;
            let guard = outb.guard_hits(0, w * part * es)?;
            let ok = got == round_bytes(dtype, &want) && guard == 0;
            c.expect("lowp movers", ok, || {
                format!("all_to_all {dtype} part={part} guard hits {guard}")
            });
            // The same in place (the input uploaded into the poisoned output buffer).
            outb.poison()?;
            outb.upload(0, &mine)?;
            // SAFETY: as above.
            let o = unsafe { outb.view_mut(0, w * part, dtype, dev) };
            c.comm.all_to_all(Input::InPlace, o, &opts)?;
            c.sync()?;
            let got = outb.download(0, w * part * es)?;
            let guard = outb.guard_hits(0, w * part * es)?;
            let ok = got == round_bytes(dtype, &want) && guard == 0;
            c.expect("lowp movers", ok, || {
                format!("all_to_all in place {dtype} part={part} guard hits {guard}")
            });
        }
    }
    if c.rank == 0 {
        println!("all_gather / reduce_scatter / all_to_all: checked against the codec");
    }
    c.compare_hashes()
}

/// [`movers`] at parts of 1 to 17,000,003 elements (17 M: parts of 34 MB of bf16 and 68 MB of
/// f32 run the wide one-shot kernel, from 32 MiB, in a single chunk; to 7,001 on the host), f32
/// and bf16.
pub fn movers_body(c: &mut Ctx) -> Res<()> {
    let parts = c.pick(
        &[1usize, 333, 7001][..],
        &[1, 333, 70_001, 3_000_017, 17_000_003],
    );
    movers(c, parts, &[DataType::F32, DataType::BF16])
}

/// Count matrices of the all-to-all-v check: skewed (a crossing part of 9 M elements: 36 MB of
/// f32 and 18 MB of bf16, both through the plain kernel, in one piece of a 64 MiB staging),
/// odd, zero parts each way.
pub const A2AV_COUNTS: &[[[usize; 2]; 2]] = &[
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
pub fn all_to_all_v_cases(
    c: &mut Ctx,
    what: &str,
    matrices: &[[[usize; 2]; 2]],
    dtypes: &[DataType],
) -> Res<()> {
    if c.world != 2 {
        return Ok(());
    }
    let codec = Codec::new(Format::E4M3, c.cfg.low_precision.block)?;
    let dev = c.dev;
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
                let inb = c.buf(mine.len().max(es))?;
                let outb = c.buf(out_n.max(1) * es)?;
                outb.poison()?;
                if in_place {
                    outb.upload(0, &mine)?;
                } else {
                    inb.upload(0, &mine)?;
                }
                // SAFETY: sizes as the splits say; synchronised before reading.
                let o = unsafe { outb.view_mut(0, out_n, dtype, dev) };
                let input = if in_place {
                    Input::InPlace
                } else {
                    // SAFETY: as above.
                    Input::Buf(unsafe { inb.view(0, inputs[me].len(), dtype, dev) })
                };
                c.comm.all_to_all_v(input, o, &splits, &opts)?;
                c.sync()?;
                let got = outb.download(0, out_n * es)?;
                let guard = outb.guard_hits(0, out_n * es)?;
                let ok = got == round_bytes(dtype, &want) && guard == 0;
                c.expect("lowp all_to_all_v", ok, || {
                    format!(
                        "all_to_all_v{what} {dtype} counts {m:?} in_place={in_place} guard hits \
                         {guard}"
                    )
                });
            }
        }
    }
    if c.rank == 0 {
        println!("all_to_all_v{what}: checked against the codec");
    }
    Ok(())
}

/// The host's count matrices: [`A2AV_COUNTS`] with the large parts a hundredth as long.
const A2AV_COUNTS_HOST: &[[[usize; 2]; 2]] = &[
    [[333, 7001], [30_017, 1]],
    [[4099, 0], [17, 5]],
    [[0, 1], [1, 0]],
    [[1_000, 90_001], [129, 2_000]],
    [[77, 50_003], [50_003, 4_101]],
];

/// [`all_to_all_v_cases`] on the count matrices whole, then cut into pieces (one launch each): a
/// 4 MiB staging holds ~2 M elements per crossing part, so the 9 M-element part takes five (on
/// the host, slots of 4 KiB: many pieces).
pub fn all_to_all_v_body(c: &mut Ctx) -> Res<()> {
    let counts = c.pick(A2AV_COUNTS_HOST, A2AV_COUNTS);
    let dtypes = [DataType::F32, DataType::BF16];
    all_to_all_v_cases(c, "", counts, &dtypes)?;
    let mut small = c.cfg.clone();
    small.cuda_staging_bytes = 4 << 20;
    small.host_slot_bytes = 4 << 10;
    c.with_comm("cases_lowp_small", small, |c| {
        all_to_all_v_cases(c, " in pieces", counts, &dtypes)
    })
}
