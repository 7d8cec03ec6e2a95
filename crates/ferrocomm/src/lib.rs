//! ferrocomm: direct-data-access collectives for the GPUs of one node, NCCL underneath, and a
//! shared-memory host backend that serves CPU buffers and is the reference for GPU results.
//!
//! ```text
//! Communicator (comm) ── select ── host | cuda | nccl backends
//!        bootstrap (Store, TCP) · quant (block codecs) · config (environment)
//! ```
#![deny(unsafe_op_in_unsafe_fn)]

pub mod bootstrap;
pub mod comm;
pub mod config;
pub mod cuda;
pub mod error;
pub mod host;
pub mod launch;
pub mod nccl;
pub mod quant;
pub mod reduce;
pub mod rmsnorm;
pub mod select;
pub mod types;
pub mod view;

pub use comm::{
    AlgoChoice, Backend, CallOpts, CommContext, CommOptions, Communicator, DeviceCounts,
    LowPrecisionChoice, P2pOp, PackedCounts, Splits,
};
pub use config::Config;
pub use error::{Error, Result};
pub use quant::Format;
pub use rmsnorm::{AllReduceRmsNorm, Fp8Rows};
pub use select::{Algo, Collective};
pub use types::{DataType, Device, Element, ReduceOp, F8E4M3, F8E5M2};
pub use view::{Input, View, ViewMut};
