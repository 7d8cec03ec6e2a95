//! ferrocomm: direct-data-access collectives for the GPUs of one node, NCCL underneath, and a
//! shared-memory host backend that serves CPU buffers and is the reference for GPU results.
//!
//! A [`Communicator`] is a group of ranks (processes, or threads of one process) that run
//! collectives together: [`Communicator::all_reduce`], `all_gather`, `reduce_scatter`,
//! `all_to_all`, `broadcast`, `reduce`, `send`/`recv` and `barrier`, and one-sided
//! communication through windows ([`Communicator::new_window`], [`window`]: puts into a peer's
//! buffer ordered by signals; the persistent all-gather). Every rank creates it with
//! the same name from [`CommOptions`]; what a rank leaves unset comes from the environment
//! (torchrun's `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, which `ferrocomm launch`
//! sets). Buffers are passed as views: [`View`]/[`ViewMut`] of host slices, or of CUDA
//! pointers on a GPU communicator; [`Input::InPlace`] reduces the output buffer in place.
//!
//! The backend is chosen per communicator: `cuda` (direct access over NVLink, NCCL for what it
//! does not win) when the device is a GPU, `host` (processes or threads sharing memory) for CPU
//! buffers or on a machine without a GPU, `nccl` on request (see [`config::BackendChoice`] and
//! `FERROCOMM_BACKEND`).
//!
//! # Example
//!
//! Four ranks as threads of one process, meeting through an in-process store, sum a vector on
//! the host backend. Separate processes do the same with no store given: each reads its rank
//! from the environment (see `examples/host_all_reduce.rs`, started with
//! `ferrocomm launch -n 4 -- target/debug/examples/host_all_reduce`).
//!
//! ```
//! use ferrocomm::bootstrap::MemStore;
//! use ferrocomm::config::BackendChoice;
//! use ferrocomm::{CallOpts, CommOptions, Communicator, Input, ReduceOp, View, ViewMut};
//!
//! let store = MemStore::new();
//! let size = 4;
//! let sums: Vec<Vec<f32>> = std::thread::scope(|s| {
//!     let ranks: Vec<_> = (0..size)
//!         .map(|rank| {
//!             let store = store.clone();
//!             s.spawn(move || -> ferrocomm::Result<Vec<f32>> {
//!                 let comm = Communicator::new(CommOptions {
//!                     rank: Some(rank),
//!                     size: Some(size),
//!                     store: Some(store),
//!                     backend: Some(BackendChoice::Host),
//!                     ..CommOptions::new("doc")
//!                 })?;
//!                 let mine = vec![rank as f32 + 1.0; 1000];
//!                 let mut sum = vec![0.0f32; 1000];
//!                 comm.all_reduce(
//!                     Input::Buf(View::host(&mine)),
//!                     ViewMut::host(&mut sum),
//!                     ReduceOp::Sum,
//!                     &CallOpts::default(),
//!                 )?;
//!                 Ok(sum)
//!             })
//!         })
//!         .collect();
//!     ranks.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
//! });
//! // 1 + 2 + 3 + 4 in every element, on every rank.
//! assert!(sums.iter().all(|s| s.iter().all(|&x| x == 10.0)));
//! ```
//!
//! # Layers
//!
//! ```text
//! Communicator (comm), window ── plan ── backend (traits, call types) ── host | cuda | nccl executors
//!        cuda, nccl ── driver (CUDA driver leaf)
//!        ground: types · error · view · config (environment) · quant (block codecs) · reduce · bootstrap (Store, TCP)
//! ```
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod backend;
pub mod bootstrap;
pub mod comm;
pub mod config;
pub mod cuda;
pub mod driver;
pub mod error;
pub mod flight;
pub mod hooks;
pub mod host;
pub mod launch;
pub mod nccl;
pub mod plan;
pub mod quant;
pub mod reduce;
pub mod reference;
pub mod rmsnorm;
pub mod trace;
pub mod types;
pub mod view;
pub mod watch;
pub mod window;

pub use backend::{
    AlgoChoice, Backend, Call, CallDesc, CallKind, CallName, CallOpts, CommContext, CountsDesc,
    DeviceCounts, Fp8Desc, NormDesc, P2pOp, PackedCounts, RawBuf, Splits,
};
pub use comm::{CommOptions, Communicator};
pub use config::tuning;
pub use config::Config;
pub use driver::Completion;
pub use error::{Error, Result};
/// The planner's former name.
#[doc(hidden)]
pub use plan as select;
pub use plan::{LowPrecisionChoice, Plan};
pub use quant::Format;
pub use rmsnorm::{AllReduceRmsNorm, Fp8Rows, Fp8Scale};
pub use types::{Algo, Collective, DataType, Device, Element, ReduceOp, F8E4M3, F8E5M2};
pub use view::{Input, View, ViewMut};
pub use window::{AccessType, AllGatherP, SharedMem, Window};
