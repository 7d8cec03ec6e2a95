//! The persistent all-gather (NCCLX's `all_gather_p`): the output is registered in a window
//! once, and each execution puts every rank's input straight into every peer's output, with
//! no staging copy.
//!
//! One execution on each rank, all on the caller's stream (or the calling thread on the host
//! backend):
//!
//! 1. signal every peer on the `ready` slot: this rank's output may be written again (what it
//!    did with the previous result was issued before);
//! 2. copy its own input into its own part of the output (nothing in place);
//! 3. for each peer, from the next rank on: wait for the peer's `ready`, put the input into
//!    the peer's output at this rank's part, signal the peer on the `data` slot;
//! 4. wait for every peer's `data`: every part has landed.
//!
//! Every rank signals `ready` before it waits for anything, so no rank waits for one that
//! waits for it. On CUDA the whole sequence is kernels and copies on one stream, capturable
//! in a CUDA graph and replayed with new inputs (the counters live on the device).

use crate::backend::CallOpts;
use crate::error::{Error, Result};
use crate::view::{View, ViewMut};

use super::Window;

/// A persistent all-gather: [`crate::Communicator::all_gather_p_init`] registers the output,
/// [`AllGatherP::exec`] runs it (as often as wanted, with new inputs), [`AllGatherP::free`]
/// releases it (collective; dropping it releases this rank's part alone).
pub struct AllGatherP<'b> {
    win: Window<'b>,
    /// Elements of each rank's part.
    part: usize,
    /// The output's address, for the in-place check.
    output: u64,
}

/// Slot of "my output may be written" and slot of "my part has landed in yours".
const READY: usize = 0;
const DATA: usize = 1;

impl<'b> AllGatherP<'b> {
    /// Signal slots per peer the window needs.
    pub(crate) const SLOTS: usize = 2;

    /// Registers `output` in `win` (collective; each wait for the peers bounded by the
    /// timeout of `opts`, else the communicator's). Its count must divide by the number of
    /// ranks and be the same on every rank; refused on every rank otherwise.
    pub(crate) fn init(
        mut win: Window<'b>,
        output: ViewMut<'b>,
        opts: &CallOpts,
    ) -> Result<AllGatherP<'b>> {
        let (_, size) = win.rank_size();
        let count = output.count();
        let addr = output.ptr() as u64;
        let timeout = win.timeout_for(opts)?;
        win.register_checked(output, timeout, |o| {
            if o.count() % size != 0 {
                return Err(Error::InvalidArgument(format!(
                    "all_gather_p_init: the output's {} elements do not divide into {size} \
                     equal parts",
                    o.count()
                )));
            }
            Ok(())
        })?;
        Ok(AllGatherP {
            win,
            part: count / size,
            output: addr,
        })
    }

    /// Gathers every rank's `input` (the output's dtype, `output.count() / size` elements on
    /// the communicator's device) into every rank's output, part `r` from rank `r`; `input`
    /// may be this rank's own part of the output (in place). Collective. On CUDA enqueued on
    /// `opts.stream`; each wait for a peer is bounded by the call's timeout (else the
    /// communicator's).
    pub fn exec(&self, input: View<'_>, opts: &CallOpts) -> Result<()> {
        let c = "all_gather_p_exec";
        let (rank, size) = self.win.rank_size();
        let Some((dtype, _)) = self.win.registered() else {
            return Err(Error::InvalidArgument(format!(
                "{c}: the handle has been freed"
            )));
        };
        if input.dtype() != dtype {
            return Err(Error::DtypeMismatch {
                collective: c,
                what: "input",
                got: input.dtype(),
                expected: dtype,
            });
        }
        if input.count() != self.part {
            return Err(Error::SizeMismatch {
                collective: c,
                what: "input",
                got: input.count(),
                expected: self.part,
            });
        }
        let offset = rank * self.part;
        let in_place = input.ptr() as u64 == self.output + (offset * dtype.size()) as u64;
        let peers = (1..size).map(|k| (rank + k) % size);
        for p in peers.clone() {
            self.win.signal_slot(p, READY, opts)?;
        }
        if !in_place {
            self.win.put(input, rank, offset, opts)?;
        }
        for p in peers.clone() {
            self.win.wait_slot(p, READY, opts)?;
            self.win.put(input, p, offset, opts)?;
            self.win.signal_slot(p, DATA, opts)?;
        }
        for p in peers {
            self.win.wait_slot(p, DATA, opts)?;
        }
        Ok(())
    }

    /// Elements of each rank's part (the input's count).
    pub fn part_count(&self) -> usize {
        self.part
    }

    /// Releases the registered output: collective (every rank's executions finish first).
    pub fn free(mut self) -> Result<()> {
        self.win.deregister()
    }
}
