//! The one error type of the library.

use std::time::Duration;

use crate::types::{DataType, ParseError, ReduceOp};

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong, with enough context to act on it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    #[error("{collective}: {what} has {got} elements, expected {expected}")]
    SizeMismatch {
        collective: &'static str,
        what: &'static str,
        got: usize,
        expected: usize,
    },

    #[error("{collective}: dtype mismatch: {what} is {got}, expected {expected}")]
    DtypeMismatch {
        collective: &'static str,
        what: &'static str,
        got: DataType,
        expected: DataType,
    },

    #[error("{collective}: reduce op {op} is not defined for dtype {dtype}")]
    UnsupportedOp {
        collective: &'static str,
        op: ReduceOp,
        dtype: DataType,
    },

    #[error("{collective}: {what} rank {rank} is out of range for a communicator of {size} ranks")]
    RankOutOfRange {
        collective: &'static str,
        what: &'static str,
        rank: usize,
        size: usize,
    },

    #[error("{collective}: this backend ({backend}) does not support {what}")]
    Unsupported {
        collective: &'static str,
        backend: &'static str,
        what: String,
    },

    #[error(
        "{collective} timed out after {timeout:?} on rank {rank} waiting for rank {missing} \
         (it died, hangs, or never called {collective})"
    )]
    Timeout {
        collective: &'static str,
        rank: usize,
        missing: usize,
        timeout: Duration,
    },

    #[error(
        "collective mismatch at call #{seq}: rank {rank} called {mine} but rank {peer} called {theirs}"
    )]
    Mismatch {
        seq: u64,
        rank: usize,
        mine: String,
        peer: usize,
        theirs: String,
    },

    #[error("rank {peer} failed or exited while {collective} was running on rank {rank}")]
    PeerFailed {
        collective: &'static str,
        rank: usize,
        peer: usize,
    },

    #[error("missing environment variable {var}: {why}")]
    MissingEnv { var: &'static str, why: String },

    #[error("environment variable {var}={value:?} is invalid: {why}")]
    BadEnv {
        var: &'static str,
        value: String,
        why: String,
    },

    #[error("store: {0}")]
    Store(String),

    #[error("store: timed out after {timeout:?} waiting for key '{key}'")]
    StoreTimeout { key: String, timeout: Duration },

    /// A joint step through the store (`tag`, such as `settings`) that some ranks never joined.
    #[error(
        "store: rank {rank} timed out after {timeout:?} at '{tag}' waiting for {}: {} of {world} \
         ranks never joined (not started, crashed, or created a communicator under another name)",
        rank_list(missing), missing.len()
    )]
    RendezvousTimeout {
        tag: String,
        rank: usize,
        world: usize,
        /// The ranks that had not joined when the wait ended, in order.
        missing: Vec<usize>,
        timeout: Duration,
    },

    #[error("{library} is not available: {why}")]
    LibraryMissing { library: &'static str, why: String },

    #[error("CUDA: {0}")]
    Cuda(String),

    #[error("NCCL: {0}")]
    Nccl(String),

    #[error("kernel compile of {source_name} failed:\n{log}")]
    KernelCompile { source_name: String, log: String },

    #[error("communicator '{0}' has been finalized")]
    Finalized(String),

    #[error("I/O: {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl From<ParseError> for Error {
    fn from(e: ParseError) -> Self {
        Error::InvalidArgument(e.0)
    }
}

impl Error {
    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

/// "rank 3" or "ranks 1, 2 and 5".
fn rank_list(ranks: &[usize]) -> String {
    let names: Vec<String> = ranks.iter().map(usize::to_string).collect();
    match names.as_slice() {
        [] => "no rank".into(),
        [one] => format!("rank {one}"),
        [head @ .., last] => format!("ranks {} and {last}", head.join(", ")),
    }
}
