//! The host backend's fused all-reduce + residual add + RMSNorm ([`crate::rmsnorm`]): the
//! ranks agree on the call, all-reduce the partial rows, and every rank normalizes its copy of
//! the sum with [`rmsnorm::norm_rows`], the arithmetic GPU results are checked against.

use super::{Bufs, HostBackend};
use crate::backend::{CallKind, CallOpts};
use crate::error::{Error, Result};
use crate::plan::Plan;
use crate::reduce::{from_f32, to_f32};
use crate::rmsnorm::{self, AllReduceRmsNorm, Fp8Ref, Fp8Scale, Shape};
use crate::types::{DataType, ReduceOp};
use crate::view::{Input, View, ViewMut};

/// The bytes of a host buffer, or an error naming it.
fn host<'a>(v: Option<&'a [u8]>, what: &str) -> Result<&'a [u8]> {
    v.ok_or_else(|| {
        Error::InvalidArgument(format!(
            "{}: {what} is device memory; the host backend serves host memory",
            rmsnorm::NAME
        ))
    })
}

fn host_mut<'a>(v: Option<&'a mut [u8]>, what: &str) -> Result<&'a mut [u8]> {
    v.ok_or_else(|| {
        Error::InvalidArgument(format!(
            "{}: {what} is device memory; the host backend serves host memory",
            rmsnorm::NAME
        ))
    })
}

/// The f32 values of `n` elements of `dtype` in `bytes`.
fn widen(dtype: DataType, bytes: &[u8], n: usize) -> Result<Vec<f32>> {
    let mut v = vec![0.0f32; n];
    to_f32(dtype, bytes, &mut v)?;
    Ok(v)
}

impl HostBackend {
    pub(super) fn all_reduce_rmsnorm_impl(
        &self,
        call: AllReduceRmsNorm<'_>,
        plan: &Plan,
    ) -> Result<()> {
        let shape = call.shape();
        let AllReduceRmsNorm {
            x,
            mut out,
            residual,
            mut residual_out,
            weight,
            eps,
            fp8,
        } = call;
        let Shape {
            rows,
            hidden,
            dtype,
        } = shape;
        // Every rank sees every rank's call before anything is written, so ranks that
        // disagree (shape, dtype, eps, FP8) all fail with the same message and write nothing.
        let mine = shape.words(eps, rmsnorm::Fp8Mode::of(&fp8));
        let mut all = vec![0u64; mine.len() * self.world];
        let gather = CallKind::AllGather {
            input: Input::Buf(View::host(&mine)),
            output: ViewMut::host(&mut all),
        };
        self.run_own(gather, &CallOpts::default())?;
        let calls: Vec<&[u64]> = all.chunks(mine.len()).collect();
        if calls.iter().any(|w| *w != mine) {
            let each: Vec<String> = calls
                .iter()
                .enumerate()
                .map(|(r, w)| format!("rank {r}: {}", Shape::describe(w)))
                .collect();
            return Err(Error::InvalidArgument(format!(
                "{}: ranks disagree on the call ({})",
                rmsnorm::NAME,
                each.join("; ")
            )));
        }
        let n = rows * hidden;
        // The plain all-reduce's sum (its algorithm, low precision included), rounded once.
        let mut summed = match x {
            Input::InPlace => host(out.as_view().host_bytes(), "out")?.to_vec(),
            Input::Buf(v) => host(v.host_bytes(), "x")?.to_vec(),
        };
        // SAFETY: `summed` holds exactly `n` elements of `dtype` and outlives the call.
        let sum_view =
            unsafe { ViewMut::from_raw(summed.as_mut_ptr(), n, dtype, crate::types::Device::Host) };
        // The all-reduce the call's plan carries (the plain all-reduce's), as planned.
        let bufs = Bufs::new(&Input::InPlace, &sum_view);
        self.all_reduce_impl(&bufs, dtype, n, ReduceOp::Sum, &plan.norm_all_reduce())?;
        let sum = widen(dtype, &summed, n)?;
        let res = match residual {
            Input::InPlace => widen(
                dtype,
                host(residual_out.as_view().host_bytes(), "residual_out")?,
                n,
            )?,
            Input::Buf(v) => widen(dtype, host(v.host_bytes(), "residual")?, n)?,
        };
        let w = widen(dtype, host(weight.host_bytes(), "weight")?, hidden)?;
        let fp8_ref = match &fp8 {
            None => None,
            Some(q) => Some(match &q.scale {
                Fp8Scale::PerRow(_) => Fp8Ref::PerRow,
                Fp8Scale::Given(s) => {
                    Fp8Ref::Given(widen(DataType::F32, host(s.host_bytes(), "fp8 scale")?, 1)?[0])
                }
            }),
        };
        let normed = rmsnorm::norm_rows(&sum, &res, &w, eps, dtype, fp8_ref);
        from_f32(
            dtype,
            &normed.residual,
            host_mut(residual_out.host_bytes_mut(), "residual_out")?,
        )?;
        from_f32(dtype, &normed.y, host_mut(out.host_bytes_mut(), "out")?)?;
        if let Some(mut q) = fp8 {
            host_mut(q.codes.host_bytes_mut(), "fp8 codes")?.copy_from_slice(&normed.codes);
            if let Fp8Scale::PerRow(s) = &mut q.scale {
                from_f32(
                    DataType::F32,
                    &normed.scales,
                    host_mut(s.host_bytes_mut(), "fp8 scales")?,
                )?;
            }
        }
        Ok(())
    }
}
