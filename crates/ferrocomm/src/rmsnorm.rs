//! The fused all-reduce + residual add + RMSNorm call, the boundary of a tensor-parallel
//! transformer layer: its description, its argument checks and its row arithmetic.
//!
//! For `rows x hidden` elements and every row:
//!
//! ```text
//! s = round(sum over ranks of x)                (f32, ranks in order 0..n: the all-reduce)
//! r = round(s + residual)                       -> residual_out
//! y = round(r * 1/sqrt(mean(r^2) + eps) * w)    -> out            (f32 arithmetic)
//! codes, scale = E4M3 of y, one scale per row   -> fp8 (optional)
//! codes = E4M3 of y / s, one given scale s       -> fp8 with a given scale (optional)
//! ```
//!
//! `round` is the rounding to the element type (bf16, f16 or f32). The sum is the plain
//! all-reduce's, rounded once (low precision on the wire applies as it does there), and the
//! norm is taken of the stored residual: the call gives what `all_reduce`, the add and
//! `rms_norm(residual_out)` give one after the other, up to the order of the sum of squares. The FP8 form of a row is the row of `out` block-scaled as the
//! low-precision format scales a block ([`crate::quant`]): `scale = absmax / 448`, each code
//! `e4m3(y / scale)` (nearest even, saturating); an all-zero row has scale 0 and codes 0. With a
//! scale given for the whole tensor (FP8 GEMMs with static activation scales take one), each code
//! is `e4m3(y / scale)` with that scale; a scale that is not finite and positive gives codes 0.
//!
//! [`norm_rows`] is that arithmetic on the host: the host backend runs it and tests and GPU
//! check programs compare against it.

use crate::error::{Error, Result};
use crate::quant::{block_scale, fp8, Format};
use crate::types::{DataType, Device};
use crate::view::{Input, View, ViewMut};

/// The name errors and signatures use.
pub const NAME: &str = "all_reduce_rmsnorm";

/// Row lengths must be a multiple of this (whole 16-byte vectors of bf16).
pub const HIDDEN_MULTIPLE: usize = 8;

/// The FP8 outputs: one E4M3 code per element of `out`, and the scales.
#[derive(Debug)]
pub struct Fp8Rows<'a> {
    /// `rows * hidden` elements of [`DataType::F8E4M3`].
    pub codes: ViewMut<'a>,
    /// How the codes are scaled.
    pub scale: Fp8Scale<'a>,
}

/// The scale of [`Fp8Rows`]: one per row, computed by the call, or one for the tensor, given.
#[derive(Debug)]
pub enum Fp8Scale<'a> {
    /// `rows` elements of [`DataType::F32`], written: each row's `absmax(y) / 448`.
    PerRow(ViewMut<'a>),
    /// One element of [`DataType::F32`], read (on the device of the rows, so that a CUDA graph
    /// replay reads its current value): every code is `e4m3(y / scale)`.
    Given(View<'a>),
}

impl Fp8Scale<'_> {
    /// Whether the scale is given (one for the tensor) rather than computed per row.
    pub fn is_given(&self) -> bool {
        matches!(self, Fp8Scale::Given(_))
    }
}

/// One fused call. Buffers hold `rows * hidden` elements of one dtype (f32, f16 or bf16), row
/// after row; `weight` holds `hidden`.
#[derive(Debug)]
pub struct AllReduceRmsNorm<'a> {
    /// This rank's partial sums; [`Input::InPlace`]: they are in `out` (and replaced by `y`).
    pub x: Input<'a>,
    /// Receives the normalized rows `y`.
    pub out: ViewMut<'a>,
    /// The residual added to the sum; [`Input::InPlace`]: it is in `residual_out`.
    pub residual: Input<'a>,
    /// Receives `r = sum + residual`, the next layer's residual.
    pub residual_out: ViewMut<'a>,
    /// The norm's weight (`hidden` elements, the dtype of the rows).
    pub weight: View<'a>,
    /// Added to the mean square (finite, at least 0).
    pub eps: f32,
    /// Also `y` as FP8, with one scale per row or one given scale.
    pub fp8: Option<Fp8Rows<'a>>,
}

/// Whether a call asks for FP8 rows, and how they are scaled (what every rank must agree on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fp8Mode {
    /// No FP8 output.
    Off = 0,
    /// One scale per row, computed.
    PerRow = 1,
    /// One scale for the tensor, given.
    Given = 2,
}

impl Fp8Mode {
    /// The mode of a call's FP8 outputs.
    pub fn of(fp8: &Option<Fp8Rows<'_>>) -> Fp8Mode {
        match fp8 {
            None => Fp8Mode::Off,
            Some(q) if q.scale.is_given() => Fp8Mode::Given,
            Some(_) => Fp8Mode::PerRow,
        }
    }
}

/// The shape of a checked call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Rows of the call (each rank holds all of them).
    pub rows: usize,
    /// Elements per row.
    pub hidden: usize,
    /// The element type of the rows, the residual and the weight.
    pub dtype: DataType,
}

impl Shape {
    /// The bytes of x per rank (rows × hidden elements of `dtype`; saturating, the shape was
    /// checked against the buffers), as the plan weighs them.
    pub fn x_bytes(&self) -> usize {
        self.rows
            .saturating_mul(self.hidden)
            .saturating_mul(self.dtype.size())
    }

    /// What every rank of a call must agree on, as words (for the host backend's exchange).
    pub fn words(&self, eps: f32, fp8: Fp8Mode) -> [u64; 5] {
        [
            self.rows as u64,
            self.hidden as u64,
            self.dtype.code() as u64,
            fp8 as u64,
            eps.to_bits() as u64,
        ]
    }

    /// [`Shape::words`] in words for an error message.
    pub fn describe(w: &[u64]) -> String {
        let dtype = u8::try_from(w[2])
            .ok()
            .and_then(DataType::from_code)
            .map_or("?", |d| d.name());
        format!(
            "{} rows x hidden {} of {dtype}, eps {}, fp8 {}",
            w[0],
            w[1],
            f32::from_bits(w[4] as u32),
            match w[3] {
                0 => "off",
                1 => "on, a scale per row",
                _ => "on, a given scale",
            }
        )
    }
}

impl AllReduceRmsNorm<'_> {
    /// The call's shape as its buffers give it (rows of the weight's length in `out`), for a
    /// call [`AllReduceRmsNorm::check`] has accepted.
    pub fn shape(&self) -> Shape {
        let hidden = self.weight.count();
        Shape {
            rows: self.out.count().checked_div(hidden).unwrap_or(0),
            hidden,
            dtype: self.out.dtype(),
        }
    }

    /// Checks the buffers against each other and returns the call's shape, or an error naming
    /// what is wrong. Nothing is read or written.
    pub fn check(&self) -> Result<Shape> {
        let c = NAME;
        let dtype = self.out.dtype();
        if !matches!(dtype, DataType::F32 | DataType::F16 | DataType::BF16) {
            return Err(Error::InvalidArgument(format!(
                "{c}: rows of {dtype} are not supported (float, half or bfloat16)"
            )));
        }
        let hidden = self.weight.count();
        if hidden == 0 || hidden % HIDDEN_MULTIPLE != 0 {
            return Err(Error::InvalidArgument(format!(
                "{c}: the hidden size (the weight's {hidden} elements) must be a positive \
                 multiple of {HIDDEN_MULTIPLE}"
            )));
        }
        let count = self.out.count();
        if count % hidden != 0 {
            return Err(Error::InvalidArgument(format!(
                "{c}: out has {count} elements, not a whole number of rows of {hidden}"
            )));
        }
        let rows = count / hidden;
        let device = self.out.device();
        let mut bufs: Vec<(&'static str, usize, usize, DataType, Device, usize)> = vec![(
            "out",
            self.out.ptr() as usize,
            self.out.bytes_len(),
            dtype,
            self.out.device(),
            count,
        )];
        if let Input::Buf(v) = &self.x {
            bufs.push((
                "x",
                v.ptr() as usize,
                v.bytes_len(),
                v.dtype(),
                v.device(),
                count,
            ));
        }
        let ro = &self.residual_out;
        bufs.push((
            "residual_out",
            ro.ptr() as usize,
            ro.bytes_len(),
            ro.dtype(),
            ro.device(),
            count,
        ));
        if let Input::Buf(v) = &self.residual {
            bufs.push((
                "residual",
                v.ptr() as usize,
                v.bytes_len(),
                v.dtype(),
                v.device(),
                count,
            ));
        }
        let w = &self.weight;
        bufs.push((
            "weight",
            w.ptr() as usize,
            w.bytes_len(),
            w.dtype(),
            w.device(),
            hidden,
        ));
        if let Some(q) = &self.fp8 {
            let k = &q.codes;
            bufs.push((
                "fp8 codes",
                k.ptr() as usize,
                k.bytes_len(),
                k.dtype(),
                k.device(),
                count,
            ));
            let (what, ptr, bytes, dt, dev, want) = match &q.scale {
                Fp8Scale::PerRow(s) => {
                    let p = s.ptr() as usize;
                    ("fp8 scales", p, s.bytes_len(), s.dtype(), s.device(), rows)
                }
                Fp8Scale::Given(s) => {
                    let p = s.ptr() as usize;
                    ("fp8 scale", p, s.bytes_len(), s.dtype(), s.device(), 1)
                }
            };
            bufs.push((what, ptr, bytes, dt, dev, want));
        }
        for &(what, _, _, d, dev, _) in &bufs {
            let want = match what {
                "fp8 codes" => DataType::F8E4M3,
                "fp8 scales" | "fp8 scale" => DataType::F32,
                _ => dtype,
            };
            if d != want {
                return Err(Error::DtypeMismatch {
                    collective: c,
                    what,
                    got: d,
                    expected: want,
                });
            }
            if dev != device {
                return Err(Error::InvalidArgument(format!(
                    "{c}: {what} is on {dev} but out is on {device}"
                )));
            }
        }
        for &(what, _, bytes, d, _, want) in &bufs {
            let got = bytes / d.size();
            if got != want {
                return Err(Error::SizeMismatch {
                    collective: c,
                    what,
                    got,
                    expected: want,
                });
            }
        }
        // Distinct buffers must not overlap (the same buffer in and out is said by InPlace).
        for (i, a) in bufs.iter().enumerate() {
            for b in &bufs[i + 1..] {
                if a.2 > 0 && b.2 > 0 && a.1 < b.1 + b.2 && b.1 < a.1 + a.2 {
                    return Err(Error::InvalidArgument(format!(
                        "{c}: {} and {} overlap (pass the input as in place instead)",
                        a.0, b.0
                    )));
                }
            }
        }
        if !self.eps.is_finite() || self.eps < 0.0 {
            return Err(Error::InvalidArgument(format!(
                "{c}: eps must be finite and at least 0, got {}",
                self.eps
            )));
        }
        Ok(Shape {
            rows,
            hidden,
            dtype,
        })
    }
}

/// The rows a call writes, as f32 values already rounded to the element type.
#[derive(Debug, Clone, PartialEq)]
pub struct Normed {
    /// `r`, rounded (the new residual).
    pub residual: Vec<f32>,
    /// `y`, rounded.
    pub y: Vec<f32>,
    /// E4M3 codes of `y` (empty without FP8).
    pub codes: Vec<u8>,
    /// One scale per row (empty without FP8).
    pub scales: Vec<f32>,
}

/// `f32` rounded to `dtype` (f32, f16, bf16) and back.
fn round_to(dtype: DataType, v: f32) -> f32 {
    match dtype {
        DataType::F16 => half::f16::from_f32(v).to_f32(),
        DataType::BF16 => half::bf16::from_f32(v).to_f32(),
        _ => v,
    }
}

/// The FP8 output a reference computation makes: codes with a scale per row, or with one
/// given scale.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fp8Ref {
    /// One scale per row, `absmax(y) / 448`.
    PerRow,
    /// This scale for every row.
    Given(f32),
}

/// The E4M3 code of `y / scale`, 0 where the scale is not finite and positive.
fn code_of(y: f32, scale: f32) -> u8 {
    if scale > 0.0 && scale.is_finite() {
        fp8::f32_to_e4m3(y / scale)
    } else {
        0
    }
}

/// The residual add, norm and FP8 encoding of every row (see the module doc): `sum` is the
/// all-reduced rows, `residual` and `weight` the inputs, as f32 values of the element type.
/// With a given scale, `Normed::scales` holds that one scale.
pub fn norm_rows(
    sum: &[f32],
    residual: &[f32],
    weight: &[f32],
    eps: f32,
    dtype: DataType,
    fp8: Option<Fp8Ref>,
) -> Normed {
    let hidden = weight.len();
    assert!(hidden > 0 && sum.len() % hidden == 0 && residual.len() == sum.len());
    let rows = sum.len() / hidden;
    let mut out = Normed {
        residual: Vec::with_capacity(sum.len()),
        y: Vec::with_capacity(sum.len()),
        codes: Vec::with_capacity(if fp8.is_some() { sum.len() } else { 0 }),
        scales: match fp8 {
            Some(Fp8Ref::Given(s)) => vec![s],
            Some(Fp8Ref::PerRow) => Vec::with_capacity(rows),
            None => Vec::new(),
        },
    };
    for (s, res) in sum.chunks(hidden).zip(residual.chunks(hidden)) {
        let start = out.residual.len();
        let mut squares = 0.0f32;
        for (a, b) in s.iter().zip(res) {
            let r = round_to(dtype, a + b);
            squares += r * r;
            out.residual.push(r);
        }
        let inv = 1.0 / (squares / hidden as f32 + eps).sqrt();
        let mut absmax = 0u32;
        for (r, w) in out.residual[start..].iter().zip(weight) {
            let y = round_to(dtype, r * inv * w);
            // NaN (any payload) > Inf > finite as bits: a non-finite row gets a NaN scale.
            absmax = absmax.max(y.to_bits() & 0x7FFF_FFFF);
            out.y.push(y);
        }
        let scale = match fp8 {
            None => continue,
            Some(Fp8Ref::Given(s)) => s,
            Some(Fp8Ref::PerRow) => {
                let s = block_scale(Format::E4M3, f32::from_bits(absmax));
                out.scales.push(s);
                s
            }
        };
        out.codes
            .extend(out.y[start..].iter().map(|&y| code_of(y, scale)));
    }
    out
}

/// The exact result of a call (f64, nothing rounded): the reference results are compared with.
#[derive(Debug, Clone)]
pub struct Exact {
    /// Elements per row.
    pub hidden: usize,
    /// The sum over ranks.
    pub sum: Vec<f64>,
    /// `sum + residual`.
    pub residual: Vec<f64>,
    /// The normalized rows.
    pub y: Vec<f64>,
    /// The weight.
    pub weight: Vec<f64>,
    /// `1 / sqrt(mean(r^2) + eps)` of every row.
    pub inv: Vec<f64>,
}

/// The exact rows of a call whose ranks' partial rows are `inputs` (every rank's in rank
/// order), with `residual` and `weight` (`hidden` values), as f64 values.
pub fn exact_rows<S: AsRef<[f64]>>(
    inputs: &[S],
    residual: &[f64],
    weight: &[f64],
    eps: f64,
) -> Exact {
    let hidden = weight.len();
    let mut sum = vec![0.0; residual.len()];
    for x in inputs {
        for (a, b) in sum.iter_mut().zip(x.as_ref()) {
            *a += b;
        }
    }
    let r: Vec<f64> = sum.iter().zip(residual).map(|(a, b)| a + b).collect();
    let mut y = Vec::with_capacity(r.len());
    let mut invs = Vec::with_capacity(r.len() / hidden.max(1));
    for row in r.chunks(hidden) {
        let ms = row.iter().map(|v| v * v).sum::<f64>() / hidden as f64;
        let inv = 1.0 / (ms + eps).sqrt();
        invs.push(inv);
        y.extend(row.iter().zip(weight).map(|(v, w)| v * inv * w));
    }
    Exact {
        hidden,
        sum,
        residual: r,
        y,
        weight: weight.to_vec(),
        inv: invs,
    }
}

/// Unit roundoff of the rows' element type.
fn unit_roundoff(dtype: DataType) -> f64 {
    match dtype {
        DataType::BF16 => 2f64.powi(-8),
        DataType::F16 => 2f64.powi(-11),
        _ => 2f64.powi(-24),
    }
}

/// Largest `|v|` of each row.
fn row_max(v: &[f64], hidden: usize) -> Vec<f64> {
    v.chunks(hidden)
        .map(|r| r.iter().fold(0.0f64, |m, x| m.max(x.abs())))
        .collect()
}

/// Whether `got` (a call's results as f32 values) matches `want` within the rounding the
/// computation allows: `r` two roundings (the sum's, then `r`'s) past an f32 sum; `y` the
/// effect of those on `y` itself and on the row's norm, plus two roundings; for FP8 the scale
/// within that of `absmax(y) / 448` and every dequantized code within half an E4M3 step (2^-4
/// relative, `scale * 2^-10` for the subnormal codes) of `y` (saturated at 448 steps of a given
/// scale; `fp8`'s flag says the scale is given, one for the tensor). The first element out of
/// bounds is the error.
pub fn compare(
    dtype: DataType,
    want: &Exact,
    residual: &[f32],
    y: &[f32],
    fp8: Option<(&[u8], &[f32], bool)>,
) -> std::result::Result<(), String> {
    let u = unit_roundoff(dtype);
    let h = want.hidden;
    let n = want.residual.len();
    if residual.len() != n || y.len() != n {
        return Err(format!(
            "{} residual and {} y values for {n} elements",
            residual.len(),
            y.len()
        ));
    }
    let noise = 2f64.powi(-20);
    let s_max = row_max(&want.sum, h);
    let r_max = row_max(&want.residual, h);
    let y_max = row_max(&want.y, h);
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    // Relative error of a row's 1/rms from the rounding of its r.
    let rel_inv: Vec<f64> = want
        .sum
        .chunks(h)
        .zip(want.residual.chunks(h))
        .map(|(s, r)| {
            let rn = norm(r);
            if rn > 0.0 {
                u * (norm(s) + rn) / rn
            } else {
                0.0
            }
        })
        .collect();
    let mut y_tol_max = vec![0.0f64; y_max.len()];
    for i in 0..n {
        let (row, col) = (i / h, i % h);
        let e = want.residual[i];
        let tol_r = u * (want.sum[i].abs() + e.abs()) + noise * (s_max[row] + r_max[row]);
        if (residual[i] as f64 - e).abs() > tol_r || residual[i].is_nan() {
            return Err(format!(
                "residual_out row {row} col {col}: got {}, want {e} (tolerance {tol_r:e})",
                residual[i]
            ));
        }
        let e = want.y[i];
        let tol = want.inv[row] * want.weight[col].abs() * tol_r
            + e.abs() * (rel_inv[row] + 3.0 * u)
            + noise * y_max[row];
        y_tol_max[row] = y_tol_max[row].max(tol);
        if (y[i] as f64 - e).abs() > tol || y[i].is_nan() {
            return Err(format!(
                "out row {row} col {col}: got {}, want {e} (tolerance {tol:e})",
                y[i]
            ));
        }
    }
    let Some((codes, scales, given)) = fp8 else {
        return Ok(());
    };
    let rows = n.checked_div(h).unwrap_or(0);
    if codes.len() != n || scales.len() != if given { 1 } else { rows } {
        return Err(format!(
            "{} FP8 codes and {} scales for {rows} rows of {h}",
            codes.len(),
            scales.len()
        ));
    }
    let values = crate::quant::Codec::new(Format::E4M3, crate::quant::Codec::MIN_BLOCK)
        .map_err(|e| e.to_string())?
        .values();
    for row in 0..rows {
        let s = scales[if given { 0 } else { row }] as f64;
        if given && !(s > 0.0 && s.is_finite()) {
            // An unusable given scale: every code 0.
            if let Some(col) = codes[row * h..(row + 1) * h].iter().position(|&c| c != 0) {
                return Err(format!(
                    "fp8 row {row} col {col}: code {:#04x} with the unusable scale {s}, want 0",
                    codes[row * h + col]
                ));
            }
            continue;
        }
        let want_s = y_max[row] / 448.0;
        if !given && ((s - want_s).abs() > y_tol_max[row] / 448.0 + 2.0 * u * want_s || s.is_nan())
        {
            return Err(format!("fp8 scale of row {row}: got {s}, want {want_s}"));
        }
        for col in 0..h {
            let i = row * h + col;
            // A given scale saturates what lies past 448 steps of it.
            let e = want.y[i].clamp(-448.0 * s, 448.0 * s);
            let got = values[codes[i] as usize] as f64 * s;
            let tol =
                (e.abs() + y_tol_max[row]) * 2f64.powi(-4) + s * 2f64.powi(-10) + y_tol_max[row];
            if (got - e).abs() > tol || got.is_nan() {
                return Err(format!(
                    "fp8 row {row} col {col}: code {:#04x} x scale {s} = {got}, want {e} \
                     (tolerance {tol:e})",
                    codes[i]
                ));
            }
        }
    }
    Ok(())
}
