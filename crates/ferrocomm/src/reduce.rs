//! Host-side element arithmetic: reductions in a fixed rank order, f32 accumulation for
//! narrow float types.
//!
//! [`reduce_bytes`] folds its inputs in the order given (rank 0..n-1), so every rank that
//! reduces the same inputs gets the same bits (docs/design.md, rule 5). f16, bf16 and FP8 inputs are
//! widened to f32, reduced there and rounded once at the end (rule 6); f32 reduces in f32, f64 in
//! f64, integers in their own type with wrap-around. The operator is matched once per block of
//! elements, never per element, so the inner loops are plain slice loops the compiler vectorizes.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::error::{Error, Result};
use crate::types::{DataType, ReduceOp};

impl ReduceOp {
    /// Whether this operator is defined for `dtype`; an error that says why otherwise.
    ///
    /// Arithmetic ops work on every type (Avg on integers truncates, as in NCCL); PremulSum
    /// needs a float type; bitwise ops need an integer type.
    pub fn check(self, dtype: DataType, collective: &'static str) -> Result<()> {
        let ok = match self {
            ReduceOp::Sum | ReduceOp::Prod | ReduceOp::Min | ReduceOp::Max | ReduceOp::Avg => true,
            ReduceOp::PremulSum(s) => dtype.is_float() && s.is_finite(),
            ReduceOp::BitAnd | ReduceOp::BitOr | ReduceOp::BitXor => dtype.is_integer(),
        };
        if ok {
            Ok(())
        } else {
            Err(Error::UnsupportedOp {
                collective,
                op: self,
                dtype,
            })
        }
    }
}

/// Elements processed per block: the accumulator block stays in L1 while every input streams by.
const BLOCK: usize = 1024;

/// Element types reduced in their own arithmetic.
trait Native: bytemuck::Pod + Default {
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn min(self, o: Self) -> Self;
    fn max(self, o: Self) -> Self;
    fn and(self, o: Self) -> Self;
    fn or(self, o: Self) -> Self;
    fn xor(self, o: Self) -> Self;
    /// Divides by the number of ranks (integers truncate, as NCCL's Avg does).
    fn div_count(self, n: usize) -> Self;
    /// Multiplies by a PreMulSum scalar (floats only; `ReduceOp::check` keeps integers out).
    fn scale(self, s: f64) -> Self;
}

macro_rules! native_int {
    ($($t:ty),*) => {$(
        impl Native for $t {
            #[inline(always)] fn add(self, o: Self) -> Self { self.wrapping_add(o) }
            #[inline(always)] fn mul(self, o: Self) -> Self { self.wrapping_mul(o) }
            #[inline(always)] fn min(self, o: Self) -> Self { Ord::min(self, o) }
            #[inline(always)] fn max(self, o: Self) -> Self { Ord::max(self, o) }
            #[inline(always)] fn and(self, o: Self) -> Self { self & o }
            #[inline(always)] fn or(self, o: Self) -> Self { self | o }
            #[inline(always)] fn xor(self, o: Self) -> Self { self ^ o }
            #[inline(always)] fn div_count(self, n: usize) -> Self { self / (n as $t) }
            #[inline(always)] fn scale(self, s: f64) -> Self { self.wrapping_mul(s as $t) }
        }
    )*};
}
native_int!(i8, u8, i32, u32, i64, u64);

macro_rules! native_float {
    ($($t:ty),*) => {$(
        impl Native for $t {
            #[inline(always)] fn add(self, o: Self) -> Self { self + o }
            #[inline(always)] fn mul(self, o: Self) -> Self { self * o }
            #[inline(always)] fn min(self, o: Self) -> Self { <$t>::min(self, o) }
            #[inline(always)] fn max(self, o: Self) -> Self { <$t>::max(self, o) }
            // Bitwise ops on floats are refused by `ReduceOp::check`; these keep the generic
            // code total without ever being reached.
            #[inline(always)] fn and(self, o: Self) -> Self { <$t>::from_bits(self.to_bits() & o.to_bits()) }
            #[inline(always)] fn or(self, o: Self) -> Self { <$t>::from_bits(self.to_bits() | o.to_bits()) }
            #[inline(always)] fn xor(self, o: Self) -> Self { <$t>::from_bits(self.to_bits() ^ o.to_bits()) }
            #[inline(always)] fn div_count(self, n: usize) -> Self { self / (n as $t) }
            #[inline(always)] fn scale(self, s: f64) -> Self { self * (s as $t) }
        }
    )*};
}
native_float!(f32, f64);

/// `acc = x` (or `s * x` for PreMulSum): the first input of a fold.
fn first<T: Native>(op: ReduceOp, acc: &mut [T], x: &[T]) {
    match op {
        ReduceOp::PremulSum(s) => {
            for (a, &b) in acc.iter_mut().zip(x) {
                *a = b.scale(s);
            }
        }
        _ => acc.copy_from_slice(x),
    }
}

/// `acc = acc op x`, one operator per call so each loop is monomorphic.
fn combine<T: Native>(op: ReduceOp, acc: &mut [T], x: &[T]) {
    macro_rules! each {
        ($f:expr) => {
            for (a, &b) in acc.iter_mut().zip(x) {
                *a = $f(*a, b);
            }
        };
    }
    match op {
        ReduceOp::Sum | ReduceOp::Avg => each!(T::add),
        ReduceOp::Prod => each!(T::mul),
        ReduceOp::Min => each!(T::min),
        ReduceOp::Max => each!(T::max),
        ReduceOp::BitAnd => each!(T::and),
        ReduceOp::BitOr => each!(T::or),
        ReduceOp::BitXor => each!(T::xor),
        ReduceOp::PremulSum(s) => each!(|a: T, b: T| a.add(b.scale(s))),
    }
}

/// What remains after the fold: Avg divides by the number of inputs.
fn finish<T: Native>(op: ReduceOp, acc: &mut [T], n: usize) {
    if op == ReduceOp::Avg {
        for a in acc.iter_mut() {
            *a = a.div_count(n);
        }
    }
}

fn reduce_native<T: Native>(op: ReduceOp, inputs: &[&[T]], out: &mut [T]) {
    for (b, o) in out.chunks_mut(BLOCK).enumerate() {
        let r = b * BLOCK..b * BLOCK + o.len();
        first(op, o, &inputs[0][r.clone()]);
        for x in &inputs[1..] {
            combine(op, o, &x[r.clone()]);
        }
        finish(op, o, inputs.len());
    }
}

/// Narrow float types: converted to f32 for arithmetic, rounded once at the end.
trait Narrow: bytemuck::Pod {
    fn widen(src: &[Self], dst: &mut [f32]);
    fn narrow(src: &[f32], dst: &mut [Self]);
}

impl Narrow for f16 {
    fn widen(src: &[Self], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst)
    }
    fn narrow(src: &[f32], dst: &mut [Self]) {
        dst.convert_from_f32_slice(src)
    }
}

impl Narrow for bf16 {
    fn widen(src: &[Self], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst)
    }
    fn narrow(src: &[f32], dst: &mut [Self]) {
        dst.convert_from_f32_slice(src)
    }
}

/// Every FP8 code's value, computed at compile time (decoding is a table look-up).
const fn fp8_table(e5m2: bool) -> [f32; 256] {
    let mut t = [0.0f32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = if e5m2 {
            float8::F8E5M2::from_bits(i as u8).to_f32()
        } else {
            float8::F8E4M3::from_bits(i as u8).to_f32()
        };
        i += 1;
    }
    t
}
static E4M3_VALUES: [f32; 256] = fp8_table(false);
static E5M2_VALUES: [f32; 256] = fp8_table(true);

/// An FP8 code as its raw byte, tagged with its format.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(transparent)]
struct E4M3(u8);
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(transparent)]
struct E5M2(u8);

impl Narrow for E4M3 {
    fn widen(src: &[Self], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = E4M3_VALUES[s.0 as usize];
        }
    }
    fn narrow(src: &[f32], dst: &mut [Self]) {
        // float8 rounds to nearest even and saturates to the largest finite value.
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = E4M3(float8::F8E4M3::from_f32(s).to_bits());
        }
    }
}

impl Narrow for E5M2 {
    fn widen(src: &[Self], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = E5M2_VALUES[s.0 as usize];
        }
    }
    fn narrow(src: &[f32], dst: &mut [Self]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = E5M2(float8::F8E5M2::from_f32(s).to_bits());
        }
    }
}

fn reduce_narrow<T: Narrow>(op: ReduceOp, inputs: &[&[T]], out: &mut [T]) {
    let mut acc = [0f32; BLOCK];
    let mut tmp = [0f32; BLOCK];
    for (b, o) in out.chunks_mut(BLOCK).enumerate() {
        let r = b * BLOCK..b * BLOCK + o.len();
        let (acc, tmp) = (&mut acc[..o.len()], &mut tmp[..o.len()]);
        T::widen(&inputs[0][r.clone()], tmp);
        first(op, acc, tmp);
        for x in &inputs[1..] {
            T::widen(&x[r.clone()], tmp);
            combine(op, acc, tmp);
        }
        finish(op, acc, inputs.len());
        T::narrow(acc, o);
    }
}

/// Runs `f` on typed views of the byte buffers, copying into aligned storage only when a buffer
/// is not aligned for `T` (user pointers made with `from_raw` may not be).
fn typed<T: bytemuck::Pod>(inputs: &[&[u8]], out: &mut [u8], f: impl FnOnce(&[&[T]], &mut [T])) {
    let owned: Vec<Option<Vec<T>>> = inputs
        .iter()
        .map(|b| match bytemuck::try_cast_slice::<u8, T>(b) {
            Ok(_) => None,
            Err(_) => Some(aligned_copy(b)),
        })
        .collect();
    let ins: Vec<&[T]> = inputs
        .iter()
        .zip(&owned)
        .map(|(b, o)| match o {
            Some(v) => v.as_slice(),
            None => bytemuck::cast_slice(b),
        })
        .collect();
    match bytemuck::try_cast_slice_mut::<u8, T>(out) {
        Ok(o) => f(&ins, o),
        Err(_) => {
            let mut tmp: Vec<T> = vec![T::zeroed(); out.len() / std::mem::size_of::<T>()];
            f(&ins, &mut tmp);
            out.copy_from_slice(bytemuck::cast_slice(&tmp));
        }
    }
}

/// Reduces `inputs` element by element, in the order given, into `out`.
///
/// Every input and `out` hold the same number of bytes, a multiple of `dtype.size()`. Avg divides
/// by `inputs.len()`.
pub fn reduce_bytes(dtype: DataType, op: ReduceOp, inputs: &[&[u8]], out: &mut [u8]) -> Result<()> {
    op.check(dtype, "reduce")?;
    if inputs.is_empty()
        || inputs.iter().any(|i| i.len() != out.len())
        || out.len() % dtype.size() != 0
    {
        return Err(Error::InvalidArgument(format!(
            "reduce_bytes: {} inputs of lengths {:?} for an output of {} bytes of {dtype}",
            inputs.len(),
            inputs.iter().map(|i| i.len()).collect::<Vec<_>>(),
            out.len()
        )));
    }
    match dtype {
        DataType::F32 => typed::<f32>(inputs, out, |i, o| reduce_native(op, i, o)),
        DataType::F64 => typed::<f64>(inputs, out, |i, o| reduce_native(op, i, o)),
        DataType::I8 => typed::<i8>(inputs, out, |i, o| reduce_native(op, i, o)),
        DataType::U8 => typed::<u8>(inputs, out, |i, o| reduce_native(op, i, o)),
        DataType::I32 => typed::<i32>(inputs, out, |i, o| reduce_native(op, i, o)),
        DataType::U32 => typed::<u32>(inputs, out, |i, o| reduce_native(op, i, o)),
        DataType::I64 => typed::<i64>(inputs, out, |i, o| reduce_native(op, i, o)),
        DataType::U64 => typed::<u64>(inputs, out, |i, o| reduce_native(op, i, o)),
        DataType::F16 => typed::<f16>(inputs, out, |i, o| reduce_narrow(op, i, o)),
        DataType::BF16 => typed::<bf16>(inputs, out, |i, o| reduce_narrow(op, i, o)),
        DataType::F8E4M3 => typed::<E4M3>(inputs, out, |i, o| reduce_narrow(op, i, o)),
        DataType::F8E5M2 => typed::<E5M2>(inputs, out, |i, o| reduce_narrow(op, i, o)),
    }
    Ok(())
}

/// Widens float elements of `dtype` (f32, f16, bf16, FP8) to f32: `dst.len()` elements.
pub fn to_f32(dtype: DataType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    let n = dst.len();
    let bytes = &src[..n * dtype.size()];
    match dtype {
        DataType::F32 => dst.copy_from_slice(&aligned_copy::<f32>(bytes)),
        DataType::F16 => widen_bytes::<f16>(bytes, dst),
        DataType::BF16 => widen_bytes::<bf16>(bytes, dst),
        DataType::F8E4M3 => widen_bytes::<E4M3>(bytes, dst),
        DataType::F8E5M2 => widen_bytes::<E5M2>(bytes, dst),
        other => return Err(not_narrow(other)),
    }
    Ok(())
}

/// Rounds f32 values to `dtype` (once, nearest even, FP8 saturating) into `dst`'s bytes.
pub fn from_f32(dtype: DataType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    let dst = &mut dst[..src.len() * dtype.size()];
    match dtype {
        DataType::F32 => dst.copy_from_slice(bytemuck::cast_slice(src)),
        DataType::F16 => narrow_bytes::<f16>(src, dst),
        DataType::BF16 => narrow_bytes::<bf16>(src, dst),
        DataType::F8E4M3 => narrow_bytes::<E4M3>(src, dst),
        DataType::F8E5M2 => narrow_bytes::<E5M2>(src, dst),
        other => return Err(not_narrow(other)),
    }
    Ok(())
}

/// A copy of possibly unaligned bytes as properly aligned elements.
fn aligned_copy<T: bytemuck::Pod>(b: &[u8]) -> Vec<T> {
    let mut v = vec![T::zeroed(); b.len() / std::mem::size_of::<T>()];
    bytemuck::cast_slice_mut::<T, u8>(&mut v).copy_from_slice(b);
    v
}

fn not_narrow(d: DataType) -> Error {
    Error::InvalidArgument(format!(
        "{d} has no f32 form (only f32, f16, bf16 and FP8 do)"
    ))
}

fn widen_bytes<T: Narrow>(src: &[u8], dst: &mut [f32]) {
    match bytemuck::try_cast_slice::<u8, T>(src) {
        Ok(s) => T::widen(s, dst),
        Err(_) => T::widen(&aligned_copy::<T>(src), dst),
    }
}

fn narrow_bytes<T: Narrow>(src: &[f32], dst: &mut [u8]) {
    match bytemuck::try_cast_slice_mut::<u8, T>(dst) {
        Ok(d) => T::narrow(src, d),
        Err(_) => {
            let mut tmp = vec![T::zeroed(); src.len()];
            T::narrow(src, &mut tmp);
            dst.copy_from_slice(bytemuck::cast_slice(&tmp));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    const OPS: [ReduceOp; 9] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
        ReduceOp::PremulSum(0.75),
        ReduceOp::BitAnd,
        ReduceOp::BitOr,
        ReduceOp::BitXor,
    ];

    /// Random bytes of a valid value of `d` (no NaN codes), and the value as f64 or i128.
    fn random_elem(d: DataType, rng: &mut impl Rng) -> Vec<u8> {
        match d {
            DataType::F32 => rng.random_range(-4.0f32..4.0).to_le_bytes().to_vec(),
            DataType::F64 => rng.random_range(-4.0f64..4.0).to_le_bytes().to_vec(),
            DataType::F16 => f16::from_f32(rng.random_range(-4.0..4.0))
                .to_le_bytes()
                .to_vec(),
            DataType::BF16 => bf16::from_f32(rng.random_range(-4.0..4.0))
                .to_le_bytes()
                .to_vec(),
            DataType::F8E4M3 => {
                vec![float8::F8E4M3::from_f32(rng.random_range(-4.0..4.0)).to_bits()]
            }
            DataType::F8E5M2 => {
                vec![float8::F8E5M2::from_f32(rng.random_range(-4.0..4.0)).to_bits()]
            }
            _ => (0..d.size()).map(|_| rng.random()).collect(),
        }
    }

    #[test]
    fn every_dtype_and_op_matches_the_reference() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for d in DataType::ALL {
            for op in OPS {
                if op.check(d, "t").is_err() {
                    assert!(reduce_bytes(d, op, &[&[0u8; 8]], &mut [0u8; 8]).is_err());
                    continue;
                }
                for ranks in [1usize, 2, 3, 8] {
                    // Lengths around the block size exercise the block loop and its tail.
                    let n = [1usize, 37, BLOCK + 3][ranks % 3];
                    let inputs: Vec<Vec<u8>> = (0..ranks)
                        .map(|_| (0..n).flat_map(|_| random_elem(d, &mut rng)).collect())
                        .collect();
                    let refs: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
                    let mut out = vec![0xA5u8; n * d.size()];
                    reduce_bytes(d, op, &refs, &mut out).unwrap();
                    // The one reference (crate::reference): the same fold, element by element.
                    let want = crate::reference::reduce_in_rank_order(d, op, &inputs);
                    let es = d.size();
                    for i in 0..n {
                        let at = i * es..(i + 1) * es;
                        assert_eq!(
                            out[at.clone()],
                            want[at],
                            "{d} {op} ranks={ranks} element {i}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn unaligned_buffers_give_the_same_result() {
        let a: Vec<f32> = (0..100).map(|i| i as f32 * 0.5 - 7.0).collect();
        let b: Vec<f32> = (0..100).map(|i| (i * i) as f32 * 0.01).collect();
        let mut ab = vec![0u8; 401];
        ab[1..].copy_from_slice(bytemuck::cast_slice(&a));
        let mut out = vec![0u8; 401];
        reduce_bytes(
            DataType::F32,
            ReduceOp::Sum,
            &[&ab[1..], bytemuck::cast_slice(&b)],
            &mut out[1..],
        )
        .unwrap();
        for i in 0..100 {
            let got = f32::from_le_bytes(out[1 + 4 * i..5 + 4 * i].try_into().unwrap());
            assert_eq!(got, a[i] + b[i]);
        }
    }

    #[test]
    fn fp8_saturates_and_narrow_types_round_once() {
        // 3 x 200 = 600 exceeds E4M3's 448: saturates instead of becoming NaN.
        let x = [float8::F8E4M3::from_f32(200.0).to_bits()];
        let mut out = [0u8];
        reduce_bytes(DataType::F8E4M3, ReduceOp::Sum, &[&x, &x, &x], &mut out).unwrap();
        assert_eq!(float8::F8E4M3::from_bits(out[0]).to_f32(), 448.0);
        // bf16: 1 + 2^-8 + 2^-8 summed in f32 is 1 + 2^-7, exactly representable; summing in
        // bf16 would round each step back to 1 (a tie, to even).
        let one = bf16::from_f32(1.0).to_le_bytes();
        let tiny = bf16::from_f32(2f32.powi(-8)).to_le_bytes();
        let mut o = [0u8; 2];
        reduce_bytes(DataType::BF16, ReduceOp::Sum, &[&one, &tiny, &tiny], &mut o).unwrap();
        assert_eq!(bf16::from_le_bytes(o).to_f32(), 1.0 + 2f32.powi(-7));
    }
}
