//! The fused all-reduce + residual add + RMSNorm call as plain values (see
//! `ferrocomm::rmsnorm`), for `Comm.all_reduce_rmsnorm`.

use ferrocomm::{AllReduceRmsNorm, CallOpts, Communicator, Fp8Rows, Fp8Scale, Input, ViewMut};

use crate::Buf;

/// One call, movable to the worker thread.
pub(crate) struct NormCall {
    pub x: Buf,
    /// None: in place into `x`.
    pub out: Option<Buf>,
    pub residual: Buf,
    /// None: in place into `residual`.
    pub residual_out: Option<Buf>,
    pub weight: Buf,
    pub eps: f32,
    /// FP8 codes and scales: per row (written), or one given (read) when the flag is set.
    pub fp8: Option<(Buf, Buf, bool)>,
    pub opts: CallOpts,
}

/// The input and the written buffer of a pair that may be in place (`out` None).
///
/// # Safety
/// As for `Buf::view_mut`, for both buffers.
unsafe fn pair<'a>(input: Buf, out: Option<Buf>) -> (Input<'a>, ViewMut<'a>) {
    // SAFETY: forwarded from this function's contract.
    unsafe {
        match out {
            None => (Input::InPlace, input.view_mut()),
            Some(o) => (Input::Buf(input.view()), o.view_mut()),
        }
    }
}

impl NormCall {
    /// Runs the call.
    ///
    /// # Safety
    /// The buffers must satisfy `Buf::view_mut`'s contract for the duration of the call.
    pub(crate) unsafe fn exec(&self, comm: &Communicator) -> ferrocomm::Result<()> {
        // SAFETY: forwarded from this function's contract (the Python layer holds the objects;
        // the written buffers are written by this call only).
        let call = unsafe {
            let (x, out) = pair(self.x, self.out);
            let (residual, residual_out) = pair(self.residual, self.residual_out);
            AllReduceRmsNorm {
                x,
                out,
                residual,
                residual_out,
                weight: self.weight.view(),
                eps: self.eps,
                fp8: self.fp8.map(|(c, s, given)| Fp8Rows {
                    codes: c.view_mut(),
                    scale: if given {
                        Fp8Scale::Given(s.view())
                    } else {
                        Fp8Scale::PerRow(s.view_mut())
                    },
                }),
            }
        };
        comm.all_reduce_rmsnorm(call, &self.opts)
    }
}
