//! Block-scaled low-precision formats: B codes plus one f32 scale (absmax / format max) per block.
//!
//! This module defines the wire layout once; the CPU codec ([`Codec`]) and the CUDA kernels both
//! follow it, and tests hold them to each other bit for bit.
//!
//! # Wire layout
//!
//! `n` elements, block size `B` (a power of two, 16..=4096), `nb = ceil(n / B)` blocks. Block `i`
//! covers elements `i*B .. min((i+1)*B, n)` and is a record at byte offset `i * (4 + B)`:
//!
//! ```text
//! | scale: f32, little endian (4 bytes) | code[0] | code[1] | ... | code[len-1] |   len = B, or
//!                                                                                n - (nb-1)*B for the last block
//! ```
//!
//! so `encoded_bytes(n) = 4 * nb + n`, and a block-aligned range of elements is a contiguous
//! range of bytes ([`Codec::encoded_offset`]). There is no padding and no header.
//!
//! # Encoding one block
//!
//! 1. `absmax = max |x|` over the block. Computed as the integer maximum of `bits(x) & 0x7fffffff`,
//!    which orders NaN above Inf above every finite value.
//! 2. `scale = absmax / M` in f32 (round to nearest), where `M` = [`Format::max`]: 448 (E4M3),
//!    57344 (E5M2), 127 (INT8). Special cases, in this order:
//!    - `absmax` is NaN or Inf (some element is NaN or ±Inf): `scale` = NaN (bits `0x7fc00000`)
//!      and every code is 0. **The whole block decodes to NaN.**
//!    - `scale * M` overflows f32 (only when `absmax` is within about an ulp of `f32::MAX`):
//!      `scale` is lowered by one ulp, so the largest code decodes finite.
//!    - `scale == 0` (`absmax` is 0, or so small, below `M * 2^-150`, that the division
//!      underflows): every code is 0, and the block decodes to +0.
//!    - Between those, when `absmax < M * 2^-126` (about 5e-36 for E4M3) the scale is an f32
//!      subnormal with fewer significant bits; nothing special is done, the absolute error
//!      just grows to at most about `M * 2^-150` (3e-43 for E4M3).
//! 3. `code = convert(x / scale)`, the quotient an IEEE f32 division (correctly rounded; not a
//!    multiply by the reciprocal), converted with round to nearest even and saturation:
//!    - E4M3 (the `fn` variant, no Inf, 0x7f/0xff are NaN): finite max ±448 (0x7e/0xfe); every
//!      larger magnitude (the quotient can exceed 448 by an f32 rounding) gives ±448. Subnormals
//!      (steps of 2^-9) are kept, not flushed.
//!    - E5M2: saturate to ±57344 (0x7b/0xfb), never Inf (0x7c); subnormal steps of 2^-16.
//!    - INT8: round half to even of the quotient clamped to [-127, 127], stored as a two's
//!      complement byte (-128 is never produced).
//!
//!    These are the semantics of PTX `cvt.rn.satfinite.e4m3x2.f32` / `.e5m2x2.f32` and of
//!    `cvt.rni.s32.f32` plus a clamp. Kernels must divide with `__fdiv_rn` (or `/` without
//!    fast math) and must not flush to zero: subnormal quotients and scales are part of the
//!    format. Step 1 is an integer `max` on the bit patterns there too.
//!
//! A negative zero gives the code 0x80 in the FP8 formats (and decodes to -0.0).
//!
//! # Decoding
//!
//! `value = f32(code) * scale` (one f32 multiply; a 256-entry table gives `f32(code)`). Finite
//! input never decodes to NaN or Inf. The all-reduce reductions built on this are in
//! [`reference`](mod@reference): one-shot and two-shot, f32 accumulation in rank order.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

mod codec;
pub mod fp8;
pub mod reference;

pub use codec::{block_scale, Codec, Widen, SCALE_BYTES};

/// The code format of a low-precision block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Format {
    /// FP8 E4M3 (finite max 448).
    E4M3,
    /// FP8 E5M2 (finite max 57344).
    E5M2,
    /// Symmetric INT8 (max 127).
    Int8,
}

impl Format {
    /// Every format, in a stable order.
    pub const ALL: [Format; 3] = [Format::E4M3, Format::E5M2, Format::Int8];

    /// The name used in `FERROCOMM_LP_FORMAT` and the bench (`e4m3`, `e5m2`, `int8`).
    pub const fn name(self) -> &'static str {
        match self {
            Format::E4M3 => "e4m3",
            Format::E5M2 => "e5m2",
            Format::Int8 => "int8",
        }
    }

    /// The largest finite magnitude a code can hold.
    pub const fn max(self) -> f32 {
        match self {
            Format::E4M3 => 448.0,
            Format::E5M2 => 57344.0,
            Format::Int8 => 127.0,
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Format {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "e4m3" | "fp8" | "f8e4m3" | "float8_e4m3fn" => Ok(Format::E4M3),
            "e5m2" | "f8e5m2" | "float8_e5m2" => Ok(Format::E5M2),
            "int8" | "i8" => Ok(Format::Int8),
            other => Err(Error::InvalidArgument(format!(
                "unknown low-precision format '{other}' (expected e4m3, e5m2 or int8)"
            ))),
        }
    }
}
