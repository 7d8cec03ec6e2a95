//! Scalar conversions between f32 and the 8-bit codes: round-to-nearest-even with saturation
//! (the semantics of PTX `cvt.rn.satfinite.{e4m3,e5m2}x2.f32`), and the 256-entry decode tables.
//!
//! The conversion works on the bits of the f32 itself, so no intermediate rounding (to f16, say)
//! can creep in: normal results round the f32 mantissa directly, subnormal results are rounded by
//! one f32 addition whose unit in the last place equals the code's subnormal step.

/// Exponent bias and mantissa width of one FP8 encoding, and its largest finite code.
#[derive(Clone, Copy)]
struct Fp8 {
    man: u32,
    bias: u32,
    max_code: u32,
}

const E4M3: Fp8 = Fp8 {
    man: 3,
    bias: 7,
    // 0x7F is NaN in the fn variant; 0x7E = 1.75 * 2^8 = 448.
    max_code: 0x7E,
};

const E5M2: Fp8 = Fp8 {
    man: 2,
    bias: 15,
    // 0x7C is Inf; 0x7B = 1.75 * 2^15 = 57344.
    max_code: 0x7B,
};

/// Code of `|x|` (as the f32 bits `abs`, at most +Inf) with RNE and saturation; no sign.
#[inline(always)]
fn round_abs(abs: u32, f: Fp8) -> u32 {
    let min_normal_bits = (127 + 1 - f.bias) << 23;
    if abs < min_normal_bits {
        // Subnormal code: `magic` has an ulp equal to the subnormal step, so the (RNE) f32 sum
        // holds round(|x| / step) in its low mantissa bits. A result of 2^man is the smallest
        // normal code, which is what the bit pattern means too.
        let magic_bits = (127 + 1 - f.bias - f.man + 23) << 23;
        (f32::from_bits(abs) + f32::from_bits(magic_bits)).to_bits() - magic_bits
    } else {
        // Normal code: round the f32 mantissa to `man` bits (ties to even); a carry moves into
        // the exponent as it should. Then rebias the exponent and saturate.
        let shift = 23 - f.man;
        let lsb = (abs >> shift) & 1;
        let rounded = (abs + (1 << (shift - 1)) - 1 + lsb) >> shift;
        (rounded - ((127 - f.bias) << f.man)).min(f.max_code)
    }
}

#[inline(always)]
fn to_fp8(x: f32, f: Fp8) -> u8 {
    let bits = x.to_bits();
    let sign = (bits >> 24) & 0x80;
    let abs = bits & 0x7FFF_FFFF;
    if abs > 0x7F80_0000 {
        return (0x7F | sign) as u8; // NaN stays NaN (a NaN code in both formats)
    }
    (round_abs(abs, f) | sign) as u8
}

/// f32 to FP8 E4M3 (fn variant, no Inf): round to nearest even, saturate to ±448 (±Inf too);
/// NaN gives the NaN code 0x7F (with the sign of the input).
#[inline]
pub fn f32_to_e4m3(x: f32) -> u8 {
    to_fp8(x, E4M3)
}

/// f32 to FP8 E5M2: round to nearest even, saturate to ±57344 (±Inf too); NaN gives 0x7F (with
/// the sign of the input).
#[inline]
pub fn f32_to_e5m2(x: f32) -> u8 {
    to_fp8(x, E5M2)
}

/// f32 to symmetric INT8: round half to even of `x` clamped to [-127, 127], as a two's
/// complement byte. `x` must not be NaN (the codec never passes one).
#[inline]
pub fn f32_to_int8(x: f32) -> u8 {
    // 1.5 * 2^23 has an ulp of 1: adding it rounds (RNE) to an integer held in the low bits.
    const MAGIC: f32 = 12_582_912.0;
    let clamped = x.clamp(-127.0, 127.0);
    ((clamped + MAGIC).to_bits() as i32 - MAGIC.to_bits() as i32) as i8 as u8
}

const fn fp8_value(code: u8, f: Fp8, e_special: u32) -> f32 {
    let negative = code & 0x80 != 0;
    let e = ((code as u32) >> f.man) & ((1 << (7 - f.man)) - 1);
    let m = (code as u32) & ((1 << f.man) - 1);
    let mag = if e == e_special && (f.man == 2 || m == (1 << f.man) - 1) {
        // E4M3: only S.1111.111 is NaN. E5M2: exponent 31 is Inf (m = 0) or NaN.
        if f.man == 2 && m == 0 {
            f32::INFINITY
        } else {
            f32::NAN
        }
    } else if e == 0 {
        // Subnormal: m * 2^(1 - bias - man), both factors exact in f32.
        m as f32 * f32::from_bits((127 + 1 - f.bias - f.man) << 23)
    } else {
        f32::from_bits(((e + 127 - f.bias) << 23) | (m << (23 - f.man)))
    };
    if negative {
        -mag
    } else {
        mag
    }
}

const fn table(format: u8) -> [f32; 256] {
    let mut t = [0.0f32; 256];
    let mut c = 0;
    while c < 256 {
        t[c] = match format {
            0 => fp8_value(c as u8, E4M3, 15),
            1 => fp8_value(c as u8, E5M2, 31),
            _ => c as u8 as i8 as f32,
        };
        c += 1;
    }
    t
}

/// The value of every E4M3 code (0x7F and 0xFF are NaN).
pub static E4M3_VALUES: [f32; 256] = table(0);
/// The value of every E5M2 code (0x7C/0xFC are ±Inf, 0x7D..0x7F and 0xFD..0xFF NaN).
pub static E5M2_VALUES: [f32; 256] = table(1);
/// The value of every INT8 code (two's complement; -128 is never produced by the encoder).
pub static INT8_VALUES: [f32; 256] = table(2);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        assert_eq!(f32_to_e4m3(448.0), 0x7E);
        assert_eq!(f32_to_e4m3(1e30), 0x7E);
        assert_eq!(f32_to_e4m3(f32::NEG_INFINITY), 0xFE);
        assert_eq!(f32_to_e4m3(1.0), 0x38);
        assert_eq!(f32_to_e4m3(2f32.powi(-9)), 0x01);
        assert_eq!(f32_to_e4m3(2f32.powi(-10)), 0x00); // tie to even (zero)
        assert_eq!(f32_to_e5m2(57344.0), 0x7B);
        assert_eq!(f32_to_e5m2(61440.0), 0x7B); // tie that would round to Inf saturates
        assert_eq!(f32_to_e5m2(2f32.powi(-16)), 0x01);
        assert_eq!(f32_to_int8(2.5), 2);
        assert_eq!(f32_to_int8(3.5), 4);
        assert_eq!(f32_to_int8(-2.5) as i8, -2);
        assert_eq!(f32_to_int8(-1000.0) as i8, -127);
        assert_eq!(E4M3_VALUES[0x7E], 448.0);
        assert_eq!(E4M3_VALUES[0x01], 2f32.powi(-9));
        assert!(E4M3_VALUES[0x7F].is_nan());
        assert_eq!(E5M2_VALUES[0xFB], -57344.0);
        assert_eq!(E5M2_VALUES[0x7C], f32::INFINITY);
        assert_eq!(INT8_VALUES[0x81], -127.0);
    }
}
