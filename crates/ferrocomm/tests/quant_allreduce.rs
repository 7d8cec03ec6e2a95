//! Accuracy and edge cases of the reference low-precision all-reduce (one-shot and two-shot).

use ferrocomm::quant::reference::{error_stats, exact_sum, one_shot, stripes, two_shot, Data};
use ferrocomm::quant::{Codec, Format};

const N: usize = 1 << 16;

fn inputs(data: Data, world: usize, n: usize) -> Vec<Vec<f32>> {
    (0..world)
        .map(|r| data.generate(n, 1000 + r as u64))
        .collect()
}

fn rel_l2(codec: &Codec, x: &[Vec<f32>], two: bool) -> f64 {
    let got = if two {
        two_shot(codec, x)
    } else {
        one_shot(codec, x)
    };
    error_stats(&got, &exact_sum(x), None).rel_l2
}

#[test]
fn e4m3_one_shot_normal_within_3_5_percent() {
    for world in [2, 8] {
        let x = inputs(Data::Normal, world, N);
        for block in [32, 64, 128, 256] {
            let e = rel_l2(&Codec::new(Format::E4M3, block).unwrap(), &x, false);
            assert!(e <= 0.035, "world {world} B={block}: {e}");
            // And it is really quantized: an unquantized sum would be far more accurate.
            assert!(e > 0.005, "world {world} B={block}: {e}");
        }
    }
}

#[test]
fn int8_block_32_one_shot_normal_within_0_7_percent() {
    for world in [2, 8] {
        let x = inputs(Data::Normal, world, N);
        let e = rel_l2(&Codec::new(Format::Int8, 32).unwrap(), &x, false);
        assert!(e <= 0.007 && e > 0.0005, "world {world}: {e}");
    }
}

#[test]
fn two_shot_is_the_quantized_one_shot_for_any_stripe_cut() {
    for format in Format::ALL {
        for block in [16, 128] {
            let codec = Codec::new(format, block).unwrap();
            for world in [1, 2, 3, 8] {
                for n in [0usize, 1, 5, 127, 1000, 4099] {
                    let x = inputs(Data::StudentT3, world, n);
                    let want = codec.quantize_dequantize(&one_shot(&codec, &x));
                    let mut got = vec![f32::NAN; n];
                    got.copy_from_slice(&two_shot(&codec, &x));
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{format} B={block} world={world} n={n}");
                    // Another block-aligned cut (one block per stripe) gives the same bits.
                    let mut per_block = vec![f32::NAN; n];
                    for lo in (0..n).step_by(block) {
                        let hi = (lo + block).min(n);
                        let parts: Vec<&[f32]> = x.iter().map(|v| &v[lo..hi]).collect();
                        let q = codec.quantize_dequantize(&one_shot(&codec, &parts));
                        per_block[lo..hi].copy_from_slice(&q);
                    }
                    let same = per_block
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "per-block cut: {format} B={block} world={world} n={n}"
                    );
                }
            }
        }
    }
}

#[test]
fn stripes_are_block_aligned_and_cover_everything() {
    for (n, block, world) in [
        (0, 16, 2),
        (1, 16, 8),
        (1000, 16, 3),
        (4099, 128, 8),
        (65536, 256, 7),
    ] {
        let s = stripes(n, block, world);
        assert_eq!(s.len(), world);
        assert_eq!(s[0].start, 0);
        assert_eq!(s[world - 1].end, n);
        for w in s.windows(2) {
            assert_eq!(w[0].end, w[1].start);
            assert!(w[1].start % block == 0 || w[1].start == n);
        }
        // Balanced: stripe lengths in whole blocks differ by at most one.
        let blocks: Vec<usize> = s.iter().map(|r| r.len().div_ceil(block)).collect();
        assert!(blocks.iter().max().unwrap() - blocks.iter().min().unwrap() <= 1);
    }
}

#[test]
fn one_shot_sums_in_rank_order() {
    let codec = Codec::new(Format::E5M2, 64).unwrap();
    let x = inputs(Data::Laplace, 5, 999);
    let got = one_shot(&codec, &x);
    let mut want = codec.quantize_dequantize(&x[0]);
    for r in &x[1..] {
        for (w, d) in want.iter_mut().zip(codec.quantize_dequantize(r)) {
            *w += d;
        }
    }
    assert!(got
        .iter()
        .zip(&want)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
}

#[test]
fn any_length_is_accurate_and_finite() {
    for format in Format::ALL {
        let bound = match format {
            Format::E4M3 => 0.05,
            Format::E5M2 => 0.1,
            Format::Int8 => 0.02,
        };
        for block in [16, 32, 256] {
            let codec = Codec::new(format, block).unwrap();
            for world in [1, 2, 8] {
                for n in [1usize, 2, 3, 13, 31, 257, 1009, 4111] {
                    let x = inputs(Data::Normal, world, n);
                    let want = exact_sum(&x);
                    for two in [false, true] {
                        let got = if two {
                            two_shot(&codec, &x)
                        } else {
                            one_shot(&codec, &x)
                        };
                        assert_eq!(got.len(), n);
                        assert!(got.iter().all(|v| v.is_finite()));
                        let e = error_stats(&got, &want, None).rel_l2;
                        assert!(
                            e <= bound,
                            "{format} B={block} world={world} n={n} two={two}: {e}"
                        );
                    }
                }
            }
        }
    }
    let codec = Codec::new(Format::E4M3, 128).unwrap();
    assert!(one_shot(&codec, &inputs(Data::Normal, 4, 0)).is_empty());
    assert!(two_shot(&codec, &inputs(Data::Normal, 4, 0)).is_empty());
}

#[test]
fn huge_values_stay_finite() {
    // Inputs up to f32::MAX / 16 across 8 ranks: the true sums are finite, and so must the
    // quantized ones be (the scale never lets a code decode above the block's absmax by more
    // than an f32 rounding).
    for format in Format::ALL {
        let codec = Codec::new(format, 32).unwrap();
        let x: Vec<Vec<f32>> = inputs(Data::Normal, 8, 3000)
            .into_iter()
            .map(|v| {
                v.iter()
                    .map(|z| (z / 6.0).clamp(-1.0, 1.0) * (f32::MAX / 16.0))
                    .collect()
            })
            .collect();
        let want = exact_sum(&x);
        for got in [one_shot(&codec, &x), two_shot(&codec, &x)] {
            assert!(got.iter().all(|v| v.is_finite()), "{format}");
            let e = error_stats(&got, &want, None);
            assert!(e.rel_l2 < 0.1 && e.max_abs.is_finite(), "{format}: {e:?}");
        }
    }
}

#[test]
fn error_stats_sees_nan() {
    let e = error_stats(&[1.0, f32::NAN, 2.0], &[1.0, 1.0, 2.5], None);
    assert!(e.max_abs.is_nan() && e.rel_l2.is_nan());
    let e = error_stats(
        &[1.0, f32::NAN, 2.0],
        &[1.0, 1.0, 2.5],
        Some(&[true, false, true]),
    );
    assert_eq!(e.max_abs, 0.5);
}
