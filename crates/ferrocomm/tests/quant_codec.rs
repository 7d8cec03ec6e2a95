//! The block codec against the `float8` crate, an f64 error bound, and its wire layout.

use ferrocomm::quant::fp8::{
    f32_to_e4m3, f32_to_e5m2, f32_to_int8, E4M3_VALUES, E5M2_VALUES, INT8_VALUES,
};
use ferrocomm::quant::reference::Data;
use ferrocomm::quant::{block_scale, Codec, Format, SCALE_BYTES};
use ferrocomm::Error;
use proptest::prelude::*;

fn float8_e4m3(x: f32) -> u8 {
    // Saturate first: the comparison must not depend on float8's overflow behaviour.
    float8::F8E4M3::from_f32(x.clamp(-448.0, 448.0)).to_bits()
}

fn float8_e5m2(x: f32) -> u8 {
    float8::F8E5M2::from_f32(x.clamp(-57344.0, 57344.0)).to_bits()
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

#[test]
fn every_code_decodes_like_float8_and_round_trips() {
    for c in 0..=255u8 {
        let e4 = float8::F8E4M3::from_bits(c).to_f32();
        let e5 = float8::F8E5M2::from_bits(c).to_f32();
        assert!(
            same(E4M3_VALUES[c as usize], e4),
            "e4m3 {c:#04x}: {} vs {e4}",
            E4M3_VALUES[c as usize]
        );
        assert!(
            same(E5M2_VALUES[c as usize], e5),
            "e5m2 {c:#04x}: {} vs {e5}",
            E5M2_VALUES[c as usize]
        );
        assert_eq!(INT8_VALUES[c as usize], c as i8 as f32);
        if !e4.is_nan() {
            assert_eq!(f32_to_e4m3(e4), c, "e4m3 round trip of {e4}");
        }
        if e5.is_finite() {
            assert_eq!(f32_to_e5m2(e5), c, "e5m2 round trip of {e5}");
        }
        if c != 0x80 {
            assert_eq!(
                f32_to_int8(c as i8 as f32),
                c,
                "int8 round trip of {}",
                c as i8
            );
        }
    }
    // -128 is not a code the encoder produces: it saturates to -127.
    assert_eq!(f32_to_int8(-128.0) as i8, -127);
}

/// Every code value, every midpoint between neighbouring codes (a tie), and one f32 ulp either
/// side of each: the places where rounding can go wrong.
fn critical_points(values: &[f32; 256]) -> Vec<f32> {
    let mut pos: Vec<f32> = values[..128]
        .iter()
        .copied()
        .filter(|v| v.is_finite())
        .collect();
    pos.sort_by(f32::total_cmp);
    let mut pts = Vec::new();
    for w in pos.windows(2) {
        // The midpoint of two codes needs one more mantissa bit than a code: exact in f32.
        let mid = ((w[0] as f64 + w[1] as f64) / 2.0) as f32;
        for p in [w[0], mid, w[1]] {
            pts.extend([p, f32::from_bits(p.to_bits() + 1)]);
            if p > 0.0 {
                pts.push(f32::from_bits(p.to_bits() - 1));
            }
        }
    }
    let max = *pos.last().unwrap();
    pts.extend([
        max * 1.03125,
        max * 1.0625,
        max * 1.1,
        max * 2.0,
        f32::MAX,
        f32::INFINITY,
    ]);
    let neg: Vec<f32> = pts.iter().map(|p| -p).collect();
    pts.extend(neg);
    pts
}

#[test]
fn fp8_rounding_matches_float8_at_ties_and_edges() {
    for x in critical_points(&E4M3_VALUES) {
        assert_eq!(f32_to_e4m3(x), float8_e4m3(x), "e4m3 of {x:e}");
    }
    for x in critical_points(&E5M2_VALUES) {
        assert_eq!(f32_to_e5m2(x), float8_e5m2(x), "e5m2 of {x:e}");
    }
}

#[test]
fn fp8_rounding_matches_float8_on_a_sweep_of_f32() {
    // Every 331st f32 bit pattern from 0 to +Inf, both signs: all binades, subnormals included.
    let mut bits = 0u32;
    while bits <= 0x7F80_0000 {
        for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
            assert_eq!(f32_to_e4m3(x), float8_e4m3(x), "e4m3 of {x:e}");
            assert_eq!(f32_to_e5m2(x), float8_e5m2(x), "e5m2 of {x:e}");
        }
        bits += 331;
    }
}

#[test]
fn nan_converts_to_a_nan_code() {
    for x in [f32::NAN, -f32::NAN, f32::from_bits(0x7F80_0001)] {
        assert!(E4M3_VALUES[f32_to_e4m3(x) as usize].is_nan());
        assert!(E5M2_VALUES[f32_to_e5m2(x) as usize].is_nan());
    }
}

fn int8_spec(q: f32) -> u8 {
    q.round_ties_even().clamp(-127.0, 127.0) as i8 as u8
}

/// A block of data at a random magnitude (2^exp), with some zeros and negative zeros mixed in.
fn block_data() -> impl Strategy<Value = Vec<f32>> {
    (
        -140i32..=120,
        prop::collection::vec((-1.0f32..1.0, 0u8..20), 1..600),
    )
        .prop_map(|(e, v)| {
            let m = 2f32.powi(e.clamp(-126, 127)) * if e < -126 { 2f32.powi(e + 126) } else { 1.0 };
            v.into_iter()
                .map(|(x, kind)| match kind {
                    0 => 0.0,
                    1 => -0.0,
                    2 => x * 1e-30 * m, // far below the block's scale: subnormal codes or zero
                    _ => x * m,
                })
                .collect()
        })
}

fn codecs() -> impl Strategy<Value = Codec> {
    (prop::sample::select(Format::ALL.to_vec()), 4u32..=12)
        .prop_map(|(f, p)| Codec::new(f, 1 << p).unwrap())
}

/// The half-ulp of the code grid at |q| (q = x / scale).
fn half_ulp(format: Format, q: f64) -> f64 {
    let (man, min_normal_exp) = match format {
        Format::E4M3 => (3, -6),
        Format::E5M2 => (2, -14),
        Format::Int8 => return 0.5,
    };
    let e = if q == 0.0 {
        min_normal_exp
    } else {
        (q.abs().log2().floor() as i32).max(min_normal_exp)
    };
    0.5 * 2f64.powi(e - man)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_f32_converts_like_float8(bits in any::<u32>()) {
        let x = f32::from_bits(bits);
        prop_assume!(!x.is_nan());
        prop_assert_eq!(f32_to_e4m3(x), float8_e4m3(x));
        prop_assert_eq!(f32_to_e5m2(x), float8_e5m2(x));
    }

    #[test]
    fn encode_follows_the_spec_and_the_error_bound(codec in codecs(), x in block_data()) {
        let mut enc = vec![0xA5u8; codec.encoded_bytes(x.len())];
        codec.encode(&x, &mut enc);
        let mut dec = vec![f32::NAN; x.len()];
        codec.decode(&enc, &mut dec);
        let m = codec.format.max();
        for (b, xs) in x.chunks(codec.block).enumerate() {
            let rec = &enc[b * (SCALE_BYTES + codec.block)..][..SCALE_BYTES + xs.len()];
            let scale = f32::from_le_bytes(rec[..4].try_into().unwrap());
            let absmax = xs.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            prop_assert_eq!(scale.to_bits(), (absmax / m).to_bits());
            for (i, &v) in xs.iter().enumerate() {
                let code = rec[SCALE_BYTES + i];
                let got = dec[b * codec.block + i];
                if scale == 0.0 {
                    prop_assert_eq!(code, 0);
                    prop_assert!(got == 0.0 && v.abs() <= absmax);
                    continue;
                }
                let q = v / scale;
                let want = match codec.format {
                    Format::E4M3 => float8_e4m3(q),
                    Format::E5M2 => float8_e5m2(q),
                    Format::Int8 => int8_spec(q),
                };
                prop_assert_eq!(code, want, "element {} = {:e}, scale {:e}", i, v, scale);
                prop_assert_eq!(got.to_bits(), (codec.values()[code as usize] * scale).to_bits());
                // f64 bound: half an ulp of the grid, plus the f32 roundings of the quotient and
                // of the decode multiply (a few parts in 2^24 of the value).
                let err = (got as f64 - v as f64).abs();
                let bound = half_ulp(codec.format, v as f64 / scale as f64) * scale as f64
                    + (v.abs() as f64 + got.abs() as f64) * 2f64.powi(-23)
                    + f32::from_bits(1) as f64
                    // A subnormal scale is rounded to a multiple of 2^-149, so absmax / scale
                    // can exceed the format max and saturate by up to max * 2^-150.
                    + if scale < f32::MIN_POSITIVE { m as f64 * 2f64.powi(-150) } else { 0.0 };
                prop_assert!(err <= bound, "{}: |{:e} - {:e}| = {:e} > {:e}", codec.format, got, v, err, bound);
            }
        }
    }

    #[test]
    fn f16_and_bf16_inputs_encode_like_their_f32_values(codec in codecs(), x in prop::collection::vec(-70000.0f32..70000.0, 0..700)) {
        let h: Vec<half::f16> = x.iter().map(|&v| half::f16::from_f32(v)).collect();
        let b: Vec<half::bf16> = x.iter().map(|&v| half::bf16::from_f32(v)).collect();
        let hf: Vec<f32> = h.iter().map(|v| v.to_f32()).collect();
        let bf: Vec<f32> = b.iter().map(|v| v.to_f32()).collect();
        let n = codec.encoded_bytes(x.len());
        let (mut e1, mut e2) = (vec![1u8; n], vec![2u8; n]);
        codec.encode_from(&h, &mut e1);
        codec.encode(&hf, &mut e2);
        prop_assert_eq!(&e1, &e2);
        codec.encode_from(&b, &mut e1);
        codec.encode(&bf, &mut e2);
        prop_assert_eq!(&e1, &e2);
    }
}

#[test]
fn block_size_is_validated() {
    for b in [0, 1, 8, 15, 24, 100, 8192, 5000] {
        assert!(
            matches!(Codec::new(Format::E4M3, b), Err(Error::InvalidArgument(_))),
            "block {b}"
        );
    }
    for p in 4..=12 {
        assert_eq!(Codec::new(Format::Int8, 1 << p).unwrap().block, 1 << p);
    }
}

#[test]
fn layout_for_any_length() {
    for format in Format::ALL {
        for block in [16, 32, 128, 4096] {
            let codec = Codec::new(format, block).unwrap();
            for n in [
                0usize, 1, 2, 3, 7, 15, 16, 17, 31, 127, 128, 129, 1021, 4096, 4099, 10007,
            ] {
                let nb = n.div_ceil(block);
                assert_eq!(codec.encoded_bytes(n), 4 * nb + n);
                let x = Data::Laplace.generate(n, n as u64);
                let mut enc = vec![0xEEu8; codec.encoded_bytes(n)];
                codec.encode(&x, &mut enc);
                for i in 0..nb {
                    let xs = &x[i * block..((i + 1) * block).min(n)];
                    let off = i * (4 + block);
                    assert_eq!(codec.encoded_offset(i * block), off);
                    let scale = f32::from_le_bytes(enc[off..off + 4].try_into().unwrap());
                    let absmax = xs.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                    assert_eq!(scale, block_scale(format, absmax));
                    // The largest element of the block takes the largest code.
                    let imax = xs.iter().position(|v| v.abs() == absmax).unwrap();
                    let c = enc[off + 4 + imax];
                    assert_eq!(
                        codec.values()[c as usize].abs(),
                        format.max(),
                        "{format} n={n} block {i}"
                    );
                }
                let mut dec = vec![f32::NAN; n];
                codec.decode(&enc, &mut dec);
                assert!(
                    dec.iter().all(|v| v.is_finite()),
                    "{format} B={block} n={n}"
                );
                assert_eq!(dec, codec.quantize_dequantize(&x));
                // decode_add adds exactly the decoded values.
                let base = Data::Normal.generate(n, 99);
                let mut acc = base.clone();
                codec.decode_add(&enc, &mut acc);
                for i in 0..n {
                    assert_eq!(acc[i].to_bits(), (base[i] + dec[i]).to_bits());
                }
            }
        }
    }
}

#[test]
fn values_near_f32_max_stay_finite() {
    let top = f32::MAX;
    let near: Vec<f32> = (0..4096u32)
        .map(|i| {
            let v = f32::from_bits(top.to_bits() - (i * 7919) % 300_000);
            if i % 3 == 0 {
                -v
            } else if i % 5 == 0 {
                v * 1e-6
            } else {
                v
            }
        })
        .collect();
    for format in Format::ALL {
        for block in [16, 64, 128, 4096] {
            let codec = Codec::new(format, block).unwrap();
            let dec = codec.quantize_dequantize(&near);
            for (i, (&d, &x)) in dec.iter().zip(&near).enumerate() {
                assert!(
                    d.is_finite(),
                    "{format} B={block} element {i}: {x:e} decodes to {d}"
                );
                // Large elements keep their value to well within the format's relative precision.
                if x.abs() > 1e37 {
                    assert!(
                        ((d as f64 - x as f64) / x as f64).abs() < 0.07,
                        "{format}: {x:e} -> {d:e}"
                    );
                }
            }
        }
        // The overflow guard: absmax = f32::MAX still gives a scale whose top code is finite.
        let s = block_scale(format, f32::MAX);
        assert!(s > 0.0 && (s * format.max()).is_finite());
    }
}

#[test]
fn nan_or_inf_poisons_exactly_its_block() {
    for format in Format::ALL {
        let codec = Codec::new(format, 32).unwrap();
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut x = Data::Normal.generate(100, 7);
            x[40] = bad; // block 1 of 0..=3
            let dec = codec.quantize_dequantize(&x);
            for (i, d) in dec.iter().enumerate() {
                assert_eq!(
                    d.is_nan(),
                    (32..64).contains(&i),
                    "{format} {bad} element {i} = {d}"
                );
            }
            let mut enc = vec![0u8; codec.encoded_bytes(100)];
            codec.encode(&x, &mut enc);
            let off = codec.encoded_offset(32);
            assert_eq!(
                u32::from_le_bytes(enc[off..off + 4].try_into().unwrap()),
                0x7FC0_0000
            );
            assert!(enc[off + 4..off + 36].iter().all(|&c| c == 0));
        }
    }
}

#[test]
fn zero_and_underflowing_blocks_decode_to_zero() {
    for format in Format::ALL {
        let codec = Codec::new(format, 16).unwrap();
        let mut x = vec![0.0f32; 48];
        x[16..32].fill(f32::from_bits(1)); // absmax / max underflows to 0
        x[32..48].copy_from_slice(&Data::Normal.generate(16, 3));
        let dec = codec.quantize_dequantize(&x);
        assert!(dec[..32].iter().all(|&d| d == 0.0 && d.is_sign_positive()));
        // The ordinary block next to them is unaffected: its largest element survives exactly
        // to within the format's precision.
        let imax = (32..48)
            .max_by(|&a, &b| x[a].abs().total_cmp(&x[b].abs()))
            .unwrap();
        assert!(
            (dec[imax] - x[imax]).abs() <= x[imax].abs() * 0.07,
            "{format}"
        );
        assert!(dec[32..].iter().all(|d| d.is_finite()));
    }
}
