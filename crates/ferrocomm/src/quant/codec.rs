//! The CPU block codec: encode f32 (or f16/bf16) to the wire layout of [`crate::quant`] and decode
//! it back, a block at a time.

use half::{bf16, f16, slice::HalfFloatSliceExt};

use super::fp8::{self, E4M3_VALUES, E5M2_VALUES, INT8_VALUES};
use super::Format;
use crate::error::{Error, Result};

/// Bytes of the scale that heads every block record.
pub const SCALE_BYTES: usize = 4;

/// A block-scaled codec: one format and one block size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Codec {
    pub format: Format,
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
    pub const MIN_BLOCK: usize = 16;
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
        // The quotient is an IEEE division, not a multiply by 1/scale: the CUDA kernels divide
        // too (correctly rounded), so both produce the same codes.
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
