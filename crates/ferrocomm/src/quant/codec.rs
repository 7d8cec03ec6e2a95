//! The CPU block codec: encode f32 (or f16/bf16) to the wire layout of [`crate::quant`] and decode
//! it back, a block at a time.

use half::{bf16, f16, slice::HalfFloatSliceExt};

use super::fp8::{self, E4M3_VALUES, E5M2_VALUES, INT8_VALUES};
use super::Format;
use crate::error::{Error, Result};

/// Bytes of the scale that heads every block record.
pub const SCALE_BYTES: usize = 4;

/// A block-scaled codec: one format and one block size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Codec {
    /// The code format.
    pub format: Format,
    /// Elements per block that share one f32 scale.
    pub block: usize,
}

/// An input element type the codec reads directly (widened to f32 a block at a time).
pub trait Widen: Copy {
    /// `src` as f32: `src` itself for f32, else converted into `scratch` (at least as long).
    fn widen<'a>(src: &'a [Self], scratch: &'a mut [f32]) -> &'a [f32];
}

impl Widen for f32 {
    fn widen<'a>(src: &'a [f32], _: &'a mut [f32]) -> &'a [f32] {
        src
    }
}

impl Widen for f16 {
    fn widen<'a>(src: &'a [f16], scratch: &'a mut [f32]) -> &'a [f32] {
        let out = &mut scratch[..src.len()];
        src.convert_to_f32_slice(out);
        out
    }
}

impl Widen for bf16 {
    fn widen<'a>(src: &'a [bf16], scratch: &'a mut [f32]) -> &'a [f32] {
        let out = &mut scratch[..src.len()];
        src.convert_to_f32_slice(out);
        out
    }
}

/// The scale of a block whose largest magnitude is `absmax` (see the module doc of
/// [`crate::quant`]): `absmax / max`, one ulp less when `scale * max` would overflow f32, and
/// NaN for a non-finite `absmax`.
pub fn block_scale(format: Format, absmax: f32) -> f32 {
    if !absmax.is_finite() {
        return f32::NAN;
    }
    let max = format.max();
    let scale = absmax / max;
    if (scale * max).is_infinite() {
        // Only for absmax within an ulp or so of f32::MAX: the largest code must decode finite.
        f32::from_bits(scale.to_bits() - 1)
    } else {
        scale
    }
}

/// max |x| of a block as f32 bits compared as integers: NaN (any payload) > Inf > every finite
/// value, so one NaN or Inf anywhere makes the result non-finite without a special case.
#[inline]
fn absmax(x: &[f32]) -> f32 {
    f32::from_bits(x.iter().fold(0u32, |m, v| m.max(v.to_bits() & 0x7FFF_FFFF)))
}

impl Codec {
    /// The smallest block size.
    pub const MIN_BLOCK: usize = 16;
    /// The largest block size.
    pub const MAX_BLOCK: usize = 4096;

    /// A codec for `format` with `block` elements per scale (a power of two, 16..=4096).
    pub fn new(format: Format, block: usize) -> Result<Codec> {
        if !block.is_power_of_two() || !(Self::MIN_BLOCK..=Self::MAX_BLOCK).contains(&block) {
            return Err(Error::InvalidArgument(format!(
                "low-precision block size {block} must be a power of two in {}..={}",
                Self::MIN_BLOCK,
                Self::MAX_BLOCK
            )));
        }
        Ok(Codec { format, block })
    }

    /// Number of blocks (records) for `n` elements.
    pub fn blocks(&self, n: usize) -> usize {
        n.div_ceil(self.block)
    }

    /// Bytes of the encoding of `n` elements: one f32 scale per block plus one byte per element.
    pub fn encoded_bytes(&self, n: usize) -> usize {
        SCALE_BYTES * self.blocks(n) + n
    }

    /// Byte offset of the record of the block that starts at element `elem` (a multiple of the
    /// block size): a block-aligned slice of the elements is a contiguous slice of the encoding.
    pub fn encoded_offset(&self, elem: usize) -> usize {
        debug_assert_eq!(elem % self.block, 0, "offset {elem} is not block aligned");
        (elem / self.block) * (SCALE_BYTES + self.block)
    }

    fn record(&self) -> usize {
        SCALE_BYTES + self.block
    }

    /// Encode `src` into `out` (`out.len() == encoded_bytes(src.len())`).
    pub fn encode(&self, src: &[f32], out: &mut [u8]) {
        self.encode_from(src, out)
    }

    /// Encode f32, f16 or bf16 elements without a full-size temporary.
    pub fn encode_from<T: Widen>(&self, src: &[T], out: &mut [u8]) {
        assert_eq!(
            out.len(),
            self.encoded_bytes(src.len()),
            "quant encode: output has {} bytes, {} elements need {}",
            out.len(),
            src.len(),
            self.encoded_bytes(src.len())
        );
        let mut scratch = [0.0f32; Self::MAX_BLOCK];
        for (x, rec) in src.chunks(self.block).zip(out.chunks_mut(self.record())) {
            self.encode_block(T::widen(x, &mut scratch), rec);
        }
    }

    fn encode_block(&self, x: &[f32], rec: &mut [u8]) {
        let (scale_bytes, codes) = rec.split_at_mut(SCALE_BYTES);
        let scale = block_scale(self.format, absmax(x));
        scale_bytes.copy_from_slice(&scale.to_le_bytes());
        // Zero scale (all zeros, or absmax / max underflowed) or NaN scale (NaN/Inf in the
        // block): codes are all 0; they decode to 0 and NaN respectively.
        if !(scale > 0.0 && scale.is_finite()) {
            codes.fill(0);
            return;
        }
        // The quotient is an IEEE division. The CUDA kernels compute the same correctly rounded
        // quotient, by division or (scales from 2^-64) by a reciprocal multiply with one FMA
        // correction that gives the division's codes (tests::reciprocal_quotient_codes).
        match self.format {
            Format::E4M3 => {
                for (c, &v) in codes.iter_mut().zip(x) {
                    *c = fp8::f32_to_e4m3(v / scale);
                }
            }
            Format::E5M2 => {
                for (c, &v) in codes.iter_mut().zip(x) {
                    *c = fp8::f32_to_e5m2(v / scale);
                }
            }
            Format::Int8 => {
                for (c, &v) in codes.iter_mut().zip(x) {
                    *c = fp8::f32_to_int8(v / scale);
                }
            }
        }
    }

    /// The value of each of the 256 codes of this format.
    pub fn values(&self) -> &'static [f32; 256] {
        match self.format {
            Format::E4M3 => &E4M3_VALUES,
            Format::E5M2 => &E5M2_VALUES,
            Format::Int8 => &INT8_VALUES,
        }
    }

    fn check_encoded(&self, what: &str, enc: &[u8], n: usize) {
        assert_eq!(
            enc.len(),
            self.encoded_bytes(n),
            "quant {what}: encoding has {} bytes, {n} elements need {}",
            enc.len(),
            self.encoded_bytes(n)
        );
    }

    /// Decode `enc` into `out`; the element count is `out.len()`.
    pub fn decode(&self, enc: &[u8], out: &mut [f32]) {
        self.check_encoded("decode", enc, out.len());
        let values = self.values();
        for (rec, o) in enc.chunks(self.record()).zip(out.chunks_mut(self.block)) {
            let (scale, codes) = split_record(rec);
            for (o, &c) in o.iter_mut().zip(codes) {
                *o = values[c as usize] * scale;
            }
        }
    }

    /// `acc[i] += decoded[i]`, in f32; the element count is `acc.len()`.
    pub fn decode_add(&self, enc: &[u8], acc: &mut [f32]) {
        self.check_encoded("decode_add", enc, acc.len());
        let values = self.values();
        for (rec, a) in enc.chunks(self.record()).zip(acc.chunks_mut(self.block)) {
            let (scale, codes) = split_record(rec);
            for (a, &c) in a.iter_mut().zip(codes) {
                *a += values[c as usize] * scale;
            }
        }
    }

    /// Encode then decode: what a peer sees of `src`.
    pub fn quantize_dequantize(&self, src: &[f32]) -> Vec<f32> {
        let mut enc = vec![0u8; self.encoded_bytes(src.len())];
        self.encode(src, &mut enc);
        let mut out = vec![0.0f32; src.len()];
        self.decode(&enc, &mut out);
        out
    }
}

#[inline]
fn split_record(rec: &[u8]) -> (f32, &[u8]) {
    let (s, codes) = rec.split_at(SCALE_BYTES);
    (f32::from_le_bytes([s[0], s[1], s[2], s[3]]), codes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    /// The kernels' quotient for scales from `LP_RCP_MIN` (lowp.cu `lp_quot`): `x * y` with
    /// `y = 1/s` correctly rounded, one FMA correction, the sign of `x` put on a zero.
    fn reciprocal_quotient(x: f32, s: f32, y: f32) -> f32 {
        let q = x * y;
        let r = (-q).mul_add(s, x);
        let q = r.mul_add(y, q);
        f32::from_bits(q.to_bits() | (x.to_bits() & 0x8000_0000))
    }

    fn code(format: Format, q: f32) -> u8 {
        match format {
            Format::E4M3 => fp8::f32_to_e4m3(q),
            Format::E5M2 => fp8::f32_to_e5m2(q),
            Format::Int8 => fp8::f32_to_int8(q),
        }
    }

    /// The reciprocal multiply gives the division's code for every block scale from 2^-64: on
    /// random blocks over the whole exponent range, on values next to every rounding boundary
    /// between two codes (the ties and the f32 neighbours on both sides), and on zeros, signed
    /// zeros and subnormal inputs.
    #[test]
    fn reciprocal_quotient_codes() {
        const RCP_MIN: f32 = 5.421_011e-20; // 2^-64, lowp.cu LP_RCP_MIN
        assert_eq!(RCP_MIN, 2f32.powi(-64));
        let mut rng = StdRng::seed_from_u64(0x5eed_0001);
        let mut checked = 0u64;
        for format in Format::ALL {
            let values = Codec::new(format, 32).unwrap().values();
            // Boundaries between adjacent finite non-negative codes, in units of the scale.
            let mut cuts: Vec<f32> = values
                .iter()
                .copied()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .collect();
            cuts.sort_by(f32::total_cmp);
            cuts.dedup();
            let mids: Vec<f64> = cuts
                .windows(2)
                .map(|w| (w[0] as f64 + w[1] as f64) / 2.0)
                .collect();
            let mut check = |x: f32, s: f32| {
                let y = 1.0 / s;
                let (want, got) = (
                    code(format, x / s),
                    code(format, reciprocal_quotient(x, s, y)),
                );
                assert_eq!(
                    want, got,
                    "{format}: x = {x:e} ({:#010x}), s = {s:e} ({:#010x}): division code {want:#04x}, reciprocal code {got:#04x}",
                    x.to_bits(),
                    s.to_bits()
                );
                checked += 1;
            };
            for _ in 0..4000 {
                // A block's absmax anywhere from where its scale is 2^-64 up to f32::MAX.
                let lo = (RCP_MIN * format.max()).log2();
                let e = rng.random_range(lo..128.0f32);
                let absmax = (2f32.powf(e)).min(f32::MAX);
                let s = block_scale(format, absmax);
                if !(s >= RCP_MIN && s.is_finite()) {
                    continue;
                }
                for _ in 0..64 {
                    let x = absmax * rng.random_range(-1.0f32..=1.0);
                    check(x, s);
                    // Any f32 bit pattern at or below absmax (small and subnormal ones too).
                    let b = rng.random_range(0..=absmax.to_bits());
                    check(f32::from_bits(b), s);
                    check(-f32::from_bits(b), s);
                }
                // Next to each boundary between codes: the nearest f32 to mid * s and its
                // neighbours, both signs.
                for &m in &mids {
                    let x = (m * s as f64) as f32;
                    if !x.is_finite() || x.abs() > absmax {
                        continue;
                    }
                    for x in [
                        f32::from_bits(x.to_bits() - 1),
                        x,
                        f32::from_bits(x.to_bits() + 1),
                    ] {
                        check(x, s);
                        check(-x, s);
                    }
                }
                for x in [
                    0.0,
                    -0.0,
                    f32::from_bits(1),
                    -f32::from_bits(1),
                    absmax,
                    -absmax,
                ] {
                    check(x, s);
                }
            }
        }
        assert!(checked > 2_000_000, "{checked} pairs checked");
    }
}
