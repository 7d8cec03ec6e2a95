//! NCCL, loaded dynamically: the fallback for what direct access does not win, and the baseline.

use crate::comm::{Backend, CommContext};
use crate::error::{Error, Result};

pub fn new_backend(_ctx: &CommContext) -> Result<Box<dyn Backend>> {
    Err(Error::LibraryMissing {
        library: "libnccl",
        why: "not built yet".into(),
    })
}
