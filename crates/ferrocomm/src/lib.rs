//! ferrocomm: direct-data-access collectives for the GPUs of one node, NCCL underneath, and a
//! shared-memory host backend that serves CPU buffers and is the reference for GPU results.
//!
//! ```text
//! Communicator (comm) ── plan ── backend (trait, call types) ── host | cuda | nccl executors
//!        cuda, nccl ── driver (CUDA driver leaf)
//!        ground: types · error · view · config (environment) · quant (block codecs) · reduce · bootstrap (Store, TCP)
//! ```
#![deny(unsafe_op_in_unsafe_fn)]

pub mod backend;
pub mod bootstrap;
pub mod comm;
pub mod config;
pub mod cuda;
pub mod driver;
pub mod error;
pub mod host;
pub mod launch;
pub mod nccl;
pub mod plan;
pub mod quant;
pub mod reduce;
pub mod reference;
pub mod types;
pub mod view;

pub use backend::{
    AlgoChoice, Backend, Call, CallKind, CallOpts, CommContext, DeviceCounts, P2pOp, PackedCounts,
    Splits,
};
pub use comm::{CommOptions, Communicator};
pub use config::Config;
pub use error::{Error, Result};
/// The planner's former name.
#[doc(hidden)]
pub use plan as select;
pub use plan::{LowPrecisionChoice, Plan};
pub use quant::Format;
pub use types::{Algo, Collective, DataType, Device, Element, ReduceOp, F8E4M3, F8E5M2};
pub use view::{Input, View, ViewMut};
