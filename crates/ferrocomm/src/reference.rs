//! Expected results, computed plainly on the CPU: the one reference the Rust tests, the GPU check
//! programs and `ferrocomm bench -c` compare collectives against.
//!
//! Elements are read and written as [`Value`]s (floats as f64, exact for every float dtype;
//! integers as i128 with the dtype's two's-complement wrap-around). Two references of a
//! reduction: [`reduce_in_rank_order`], the bits a rank-ordered fold gives (what the host
//! backend computes), and [`expected`], the exact f64 result with the magnitude a tolerance
//! scales with ([`within`]), for kernels whose order or accumulation differs.

use half::{bf16, f16};

use crate::types::{DataType, ReduceOp};

/// One element's value: floats as f64 (exact for every float dtype), integers as i128.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    /// A float element, exactly.
    Float(f64),
    /// An integer element, exactly.
    Int(i128),
}

impl Value {
    /// The value as f64 (an integer converted).
    pub fn as_f64(self) -> f64 {
        match self {
            Value::Float(x) => x,
            Value::Int(i) => i as f64,
        }
    }

    /// The value as i128 (a float truncated).
    pub fn as_i128(self) -> i128 {
        match self {
            Value::Int(i) => i,
            Value::Float(x) => x as i128,
        }
    }
}

/// Whether `dtype` is a signed integer type.
pub fn is_signed(dtype: DataType) -> bool {
    matches!(dtype, DataType::I8 | DataType::I32 | DataType::I64)
}

/// Wraps an integer into `dtype`'s range (two's complement, as the hardware does).
pub fn wrap(dtype: DataType, v: i128) -> i128 {
    let bits = dtype.size() as u32 * 8;
    let m = v.rem_euclid(1i128 << bits);
    if is_signed(dtype) && m >= 1i128 << (bits - 1) {
        m - (1i128 << bits)
    } else {
        m
    }
}

/// Rounds `x` to the nearest value of a float dtype (`x` itself for other dtypes).
pub fn round_to(dtype: DataType, x: f64) -> f64 {
    match dtype {
        DataType::F64 => x,
        DataType::F32 => x as f32 as f64,
        DataType::F16 => f16::from_f64(x).to_f64(),
        DataType::BF16 => bf16::from_f64(x).to_f64(),
        DataType::F8E4M3 => float8::F8E4M3::from_f32(x as f32).to_f32() as f64,
        DataType::F8E5M2 => float8::F8E5M2::from_f32(x as f32).to_f32() as f64,
        _ => x,
    }
}

/// Relative precision (machine epsilon) of a float dtype; 0 for integers.
pub fn epsilon(dtype: DataType) -> f64 {
    match dtype {
        DataType::F64 => f64::EPSILON,
        DataType::F32 => f32::EPSILON as f64,
        DataType::F16 => 2f64.powi(-10),
        DataType::BF16 => 2f64.powi(-7),
        DataType::F8E4M3 => 2f64.powi(-3),
        DataType::F8E5M2 => 2f64.powi(-2),
        _ => 0.0,
    }
}

/// Writes `v` as a `dtype` element at the start of `out` (floats rounded to nearest, integers
/// truncated to the dtype's width).
pub fn encode(dtype: DataType, v: Value, out: &mut [u8]) {
    let (x, i) = (v.as_f64(), v.as_i128());
    match dtype {
        DataType::F32 => out[..4].copy_from_slice(&(x as f32).to_le_bytes()),
        DataType::F64 => out[..8].copy_from_slice(&x.to_le_bytes()),
        DataType::F16 => out[..2].copy_from_slice(&f16::from_f64(x).to_le_bytes()),
        DataType::BF16 => out[..2].copy_from_slice(&bf16::from_f64(x).to_le_bytes()),
        DataType::F8E4M3 => out[0] = float8::F8E4M3::from_f32(x as f32).to_bits(),
        DataType::F8E5M2 => out[0] = float8::F8E5M2::from_f32(x as f32).to_bits(),
        DataType::I8 => out[0] = (i as i8) as u8,
        DataType::U8 => out[0] = i as u8,
        DataType::I32 => out[..4].copy_from_slice(&(i as i32).to_le_bytes()),
        DataType::U32 => out[..4].copy_from_slice(&(i as u32).to_le_bytes()),
        DataType::I64 => out[..8].copy_from_slice(&(i as i64).to_le_bytes()),
        DataType::U64 => out[..8].copy_from_slice(&(i as u64).to_le_bytes()),
    }
}

/// Reads a `dtype` element from the start of `b` (at least `dtype.size()` bytes).
pub fn decode(dtype: DataType, b: &[u8]) -> Value {
    let a2 = || [b[0], b[1]];
    let a4 = || [b[0], b[1], b[2], b[3]];
    let a8 = || [b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]];
    match dtype {
        DataType::F32 => Value::Float(f32::from_le_bytes(a4()) as f64),
        DataType::F64 => Value::Float(f64::from_le_bytes(a8())),
        DataType::F16 => Value::Float(f16::from_le_bytes(a2()).to_f64()),
        DataType::BF16 => Value::Float(bf16::from_le_bytes(a2()).to_f64()),
        DataType::F8E4M3 => Value::Float(float8::F8E4M3::from_bits(b[0]).to_f32() as f64),
        DataType::F8E5M2 => Value::Float(float8::F8E5M2::from_bits(b[0]).to_f32() as f64),
        DataType::I8 => Value::Int(b[0] as i8 as i128),
        DataType::U8 => Value::Int(b[0] as i128),
        DataType::I32 => Value::Int(i32::from_le_bytes(a4()) as i128),
        DataType::U32 => Value::Int(u32::from_le_bytes(a4()) as i128),
        DataType::I64 => Value::Int(i64::from_le_bytes(a8()) as i128),
        DataType::U64 => Value::Int(u64::from_le_bytes(a8()) as i128),
    }
}

/// The reduction by `op` of every rank's buffer (`inputs[r]`, whole `dtype` elements), element
/// by element, folded in rank order: in f64 for f64, in f32 rounded after every step for the
/// other floats, integers wrapping; each result narrowed once to `dtype`. These are the bits
/// the host backend's fixed-order reduction gives.
pub fn reduce_in_rank_order(dtype: DataType, op: ReduceOp, inputs: &[Vec<u8>]) -> Vec<u8> {
    let es = dtype.size();
    let count = inputs.first().map_or(0, |b| b.len() / es);
    let n = inputs.len();
    let mut out = vec![0u8; count * es];
    for i in 0..count {
        let el = |r: usize| decode(dtype, &inputs[r][i * es..(i + 1) * es]);
        let v = if dtype.is_float() {
            let rd = |v: f64| {
                if dtype == DataType::F64 {
                    v
                } else {
                    v as f32 as f64
                }
            };
            let s = match op {
                ReduceOp::PremulSum(s) => rd(s),
                _ => 1.0,
            };
            let mut a = el(0).as_f64();
            if let ReduceOp::PremulSum(_) = op {
                a = rd(a * s);
            }
            for r in 1..n {
                let x = el(r).as_f64();
                a = rd(match op {
                    ReduceOp::Prod => a * x,
                    ReduceOp::Min => a.min(x),
                    ReduceOp::Max => a.max(x),
                    ReduceOp::PremulSum(_) => a + rd(x * s),
                    _ => a + x,
                });
            }
            if op == ReduceOp::Avg {
                a = rd(a / n as f64);
            }
            Value::Float(a)
        } else {
            let mut a = el(0).as_i128();
            for r in 1..n {
                let x = el(r).as_i128();
                a = wrap(
                    dtype,
                    match op {
                        ReduceOp::Prod => a.wrapping_mul(x),
                        ReduceOp::Min => a.min(x),
                        ReduceOp::Max => a.max(x),
                        ReduceOp::BitAnd => a & x,
                        ReduceOp::BitOr => a | x,
                        ReduceOp::BitXor => a ^ x,
                        _ => a + x,
                    },
                );
            }
            if op == ReduceOp::Avg {
                a /= n as i128;
            }
            Value::Int(a)
        };
        encode(dtype, v, &mut out[i * es..(i + 1) * es]);
    }
    out
}

/// The exact reduction by `op` of the ranks' values `xs` (in rank order), and for floats the
/// magnitude a rounding error scales with (the sum of magnitudes for sums; 0 for min and max,
/// which are exact). Integers wrap as `dtype` does; their scale is 0.
pub fn expected(dtype: DataType, op: ReduceOp, xs: &[Value]) -> (Value, f64) {
    let n = xs.len();
    if dtype.is_float() {
        let xs: Vec<f64> = xs.iter().map(|v| v.as_f64()).collect();
        let mag: f64 = xs.iter().map(|x| x.abs()).sum();
        let (want, scale) = match op {
            ReduceOp::Avg => (xs.iter().sum::<f64>() / n as f64, mag / n as f64),
            ReduceOp::PremulSum(s) => (xs.iter().map(|x| x * s).sum::<f64>(), mag * s.abs()),
            ReduceOp::Prod => {
                let p: f64 = xs.iter().product();
                (p, p.abs() * n as f64)
            }
            ReduceOp::Min => (xs.iter().cloned().fold(f64::INFINITY, f64::min), 0.0),
            ReduceOp::Max => (xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max), 0.0),
            _ => (xs.iter().sum::<f64>(), mag),
        };
        (Value::Float(want), scale)
    } else {
        let xs: Vec<i128> = xs.iter().map(|v| v.as_i128()).collect();
        let w = |v: i128| wrap(dtype, v);
        let want = match op {
            ReduceOp::Avg => w(w(xs.iter().sum()) / n as i128),
            ReduceOp::Prod => w(xs.iter().product()),
            ReduceOp::Min => xs.iter().copied().min().unwrap_or(0),
            ReduceOp::Max => xs.iter().copied().max().unwrap_or(0),
            ReduceOp::BitAnd => xs.iter().fold(-1, |a, x| a & x),
            ReduceOp::BitOr => xs.iter().fold(0, |a, x| a | x),
            ReduceOp::BitXor => xs.iter().fold(0, |a, x| a ^ x),
            _ => w(xs.iter().sum()),
        };
        (Value::Int(w(want)), 0.0)
    }
}

/// Whether `got` matches `want` of [`expected`]: integers exactly, floats within `rel` times
/// the scale (plus 1e-30, so that an exact zero passes).
pub fn within(got: Value, want: Value, scale: f64, rel: f64) -> bool {
    match (got, want) {
        (Value::Int(g), Value::Int(w)) => g == w,
        (g, w) => (g.as_f64() - w.as_f64()).abs() <= rel * scale + 1e-30,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(dtype: DataType, vals: &[Value]) -> Vec<u8> {
        let es = dtype.size();
        let mut b = vec![0u8; vals.len() * es];
        for (i, v) in vals.iter().enumerate() {
            encode(dtype, *v, &mut b[i * es..(i + 1) * es]);
        }
        b
    }

    #[test]
    fn elements_round_trip_and_integers_wrap() {
        for (d, v) in [
            (DataType::F32, Value::Float(-1.25)),
            (DataType::BF16, Value::Float(3.0)),
            (DataType::F8E4M3, Value::Float(0.5)),
            (DataType::I8, Value::Int(-7)),
            (DataType::U64, Value::Int(1 << 40)),
        ] {
            assert_eq!(decode(d, &bytes(d, &[v])), v, "{d}");
        }
        assert_eq!(wrap(DataType::I8, 128), -128);
        assert_eq!(wrap(DataType::U8, -1), 255);
        assert_eq!(
            wrap(DataType::I32, i32::MAX as i128 + 2),
            i32::MIN as i128 + 1
        );
        assert_eq!(round_to(DataType::BF16, 1.0 + 2f64.powi(-9)), 1.0);
    }

    #[test]
    fn a_rank_ordered_fold_rounds_after_every_step() {
        // In f32, (1 + 2^-24) + 2^-24 rounds to 1 at each step; in f64 it would not.
        let d = DataType::F32;
        let e = 2f64.powi(-24);
        let inputs = [1.0, e, e].map(|x| bytes(d, &[Value::Float(x)]));
        let got = reduce_in_rank_order(d, ReduceOp::Sum, &inputs);
        assert_eq!(decode(d, &got), Value::Float(1.0));
        let ints = [100, 60].map(|x| bytes(DataType::I8, &[Value::Int(x)]));
        let sum = reduce_in_rank_order(DataType::I8, ReduceOp::Sum, &ints);
        assert_eq!(decode(DataType::I8, &sum), Value::Int(-96));
        let avg = reduce_in_rank_order(
            DataType::I32,
            ReduceOp::Avg,
            &[
                bytes(DataType::I32, &[Value::Int(7)]),
                bytes(DataType::I32, &[Value::Int(-2)]),
            ],
        );
        assert_eq!(decode(DataType::I32, &avg), Value::Int(2));
    }

    #[test]
    fn the_exact_result_and_its_tolerance() {
        let xs = [Value::Float(1.0), Value::Float(-3.0), Value::Float(0.5)];
        let (want, scale) = expected(DataType::F32, ReduceOp::Sum, &xs);
        assert_eq!((want, scale), (Value::Float(-1.5), 4.5));
        assert!(within(Value::Float(-1.5 + 1e-7), want, scale, 1e-7));
        assert!(!within(Value::Float(-1.5 + 1e-5), want, scale, 1e-7));
        let (max, exact) = expected(DataType::F32, ReduceOp::Max, &xs);
        assert_eq!((max, exact), (Value::Float(1.0), 0.0));
        let ints = [Value::Int(120), Value::Int(10)];
        assert_eq!(
            expected(DataType::I8, ReduceOp::Sum, &ints).0,
            Value::Int(-126)
        );
        assert_eq!(
            expected(DataType::I8, ReduceOp::BitOr, &ints).0,
            Value::Int(122)
        );
        assert!(!within(Value::Int(1), Value::Int(2), 10.0, 1.0));
    }
}
