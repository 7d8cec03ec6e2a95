//! The low-precision all-reduce computed on the CPU exactly as the collectives do it, and the
//! error measures used to judge it against an f64 sum. Backends' tests compare their results with
//! these bit for bit; the accuracy report (`examples/quant_accuracy.rs`) is built on them.

use std::ops::Range;

use super::Codec;

/// One-shot: every rank quantizes its input once, and every rank sums the dequantized inputs of
/// all ranks in rank order (0..world) in f32. The sum starts from rank 0's decoded values (not
/// from +0.0), so a -0.0 stays -0.0.
pub fn one_shot<S: AsRef<[f32]>>(codec: &Codec, inputs: &[S]) -> Vec<f32> {
    let n = check_inputs(inputs);
    let mut enc = vec![0u8; codec.encoded_bytes(n)];
    let mut acc = vec![0.0f32; n];
    for (r, x) in inputs.iter().enumerate() {
        codec.encode(x.as_ref(), &mut enc);
        if r == 0 {
            codec.decode(&enc, &mut acc);
        } else {
            codec.decode_add(&enc, &mut acc);
        }
    }
    acc
}

/// Block-aligned stripes of `n` elements for `world` ranks: the blocks are split as evenly as
/// possible, rank `r` owning blocks `r * nb / world .. (r + 1) * nb / world`. Some stripes are
/// empty when there are fewer blocks than ranks.
pub fn stripes(n: usize, block: usize, world: usize) -> Vec<Range<usize>> {
    let nb = n.div_ceil(block);
    (0..world)
        .map(|r| {
            let lo = (r * nb / world * block).min(n);
            let hi = ((r + 1) * nb / world * block).min(n);
            lo..hi
        })
        .collect()
}

/// Two-shot: each stripe owner sums the dequantized inputs of its stripe over all ranks in rank
/// order in f32 (as [`one_shot`] does), quantizes that sum once, and every rank, the owner too,
/// takes the dequantized result. Because stripes are block aligned, the result does not depend
/// on how the stripes are cut: it equals `quantize_dequantize(one_shot(inputs))`.
pub fn two_shot<S: AsRef<[f32]>>(codec: &Codec, inputs: &[S]) -> Vec<f32> {
    let n = check_inputs(inputs);
    let mut out = vec![0.0f32; n];
    for stripe in stripes(n, codec.block, inputs.len()) {
        let parts: Vec<&[f32]> = inputs.iter().map(|x| &x.as_ref()[stripe.clone()]).collect();
        let reduced = one_shot(codec, &parts);
        let mut enc = vec![0u8; codec.encoded_bytes(reduced.len())];
        codec.encode(&reduced, &mut enc);
        codec.decode(&enc, &mut out[stripe]);
    }
    out
}

/// The exact-as-f64 sum over ranks (f32 inputs widen exactly; with few ranks the f64 sum is
/// exact or within an f64 rounding, far below any f32 effect).
pub fn exact_sum<S: AsRef<[f32]>>(inputs: &[S]) -> Vec<f64> {
    let n = check_inputs(inputs);
    let mut acc = vec![0.0f64; n];
    for x in inputs {
        for (a, &v) in acc.iter_mut().zip(x.as_ref()) {
            *a += v as f64;
        }
    }
    acc
}

/// How far a result is from a reference.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ErrorStats {
    /// ||got - want||_2 / ||want||_2 (0 when both are zero).
    pub rel_l2: f64,
    /// max |got - want|.
    pub max_abs: f64,
}

/// Error of `got` against `want`, restricted to the elements where `keep` is true (all of them
/// when `keep` is `None`).
pub fn error_stats(got: &[f32], want: &[f64], keep: Option<&[bool]>) -> ErrorStats {
    assert_eq!(got.len(), want.len(), "error_stats: lengths differ");
    let (mut err2, mut ref2, mut max_abs) = (0.0f64, 0.0f64, 0.0f64);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if keep.is_some_and(|k| !k[i]) {
            continue;
        }
        let d = g as f64 - w;
        err2 += d * d;
        ref2 += w * w;
        // NaN must not hide behind f64::max, which ignores it.
        max_abs = if d.is_nan() || max_abs.is_nan() {
            f64::NAN
        } else {
            max_abs.max(d.abs())
        };
    }
    let rel_l2 = if err2 == 0.0 {
        0.0
    } else {
        (err2 / ref2).sqrt()
    };
    ErrorStats { rel_l2, max_abs }
}

fn check_inputs<S: AsRef<[f32]>>(inputs: &[S]) -> usize {
    assert!(
        !inputs.is_empty(),
        "reference all-reduce needs at least one rank"
    );
    let n = inputs[0].as_ref().len();
    for (r, x) in inputs.iter().enumerate() {
        assert_eq!(
            x.as_ref().len(),
            n,
            "rank {r} has {} elements, rank 0 has {n}",
            x.as_ref().len()
        );
    }
    n
}

/// Synthetic inputs for accuracy checks, reproducible from a seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Data {
    /// N(0, 1).
    Normal,
    /// Student-t with 3 degrees of freedom (heavy tails, infinite fourth moment).
    StudentT3,
    /// Laplace(0, 1).
    Laplace,
    /// N(0, 1) with 0.1% of the elements (random positions) multiplied by 1000.
    Outliers,
}

impl Data {
    /// Every distribution, in a stable order.
    pub const ALL: [Data; 4] = [Data::Normal, Data::StudentT3, Data::Laplace, Data::Outliers];

    /// The distribution's name, as the accuracy tables (`examples/quant_accuracy.rs`) head it.
    pub const fn name(self) -> &'static str {
        match self {
            Data::Normal => "normal N(0,1)",
            Data::StudentT3 => "student-t (3 dof)",
            Data::Laplace => "laplace",
            Data::Outliers => "normal + 0.1% outliers x1000",
        }
    }

    /// `n` values; different seeds give independent streams (one per rank, say).
    pub fn generate(self, n: usize, seed: u64) -> Vec<f32> {
        use rand::{rngs::StdRng, Rng, SeedableRng};
        let mut rng = StdRng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15);
        fn normal(rng: &mut StdRng) -> f64 {
            // Box-Muller; 1 - u keeps the logarithm's argument in (0, 1].
            let u: f64 = rng.random();
            let v: f64 = rng.random();
            (-2.0 * (1.0 - u).ln()).sqrt() * (std::f64::consts::TAU * v).cos()
        }
        (0..n)
            .map(|_| match self {
                Data::Normal => normal(&mut rng) as f32,
                Data::StudentT3 => {
                    let z = normal(&mut rng);
                    let chi2: f64 = (0..3).map(|_| normal(&mut rng).powi(2)).sum();
                    (z / (chi2 / 3.0).sqrt()) as f32
                }
                Data::Laplace => {
                    // A random sign times an Exp(1) variable.
                    let e = -(1.0 - rng.random::<f64>()).ln();
                    (if rng.random::<bool>() { e } else { -e }) as f32
                }
                Data::Outliers => {
                    let z = normal(&mut rng) as f32;
                    if rng.random_range(0..1000) == 0 {
                        z * 1000.0
                    } else {
                        z
                    }
                }
            })
            .collect()
    }
}
