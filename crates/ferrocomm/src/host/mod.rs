//! The host backend: ranks are processes on one machine sharing one memory segment.

use crate::comm::{Backend, CommContext};
use crate::error::{Error, Result};

pub struct HostBackend;

impl HostBackend {
    pub fn new(_ctx: &CommContext) -> Result<Box<dyn Backend>> {
        Err(Error::Unsupported {
            collective: "init",
            backend: "host",
            what: "not built yet".into(),
        })
    }
}
