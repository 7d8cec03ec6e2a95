//! The one error type of the library.

use std::time::Duration;

use crate::types::{DataType, ParseError, ReduceOp};

/// The library's `Result`, with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong, with enough context to act on it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An argument or setting that is wrong whatever the peers do; the text names it.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    #[error("{collective}: {what} has {got} elements, expected {expected}")]
    /// A buffer whose element count does not fit the collective's shape.
    SizeMismatch {
        /// The collective that checked it (`all_reduce`, ...).
        collective: &'static str,
        /// Which buffer (`output`, `input`, ...).
        what: &'static str,
        /// Its element count.
        got: usize,
        /// The count the call's shape needs.
        expected: usize,
    },

    #[error("{collective}: dtype mismatch: {what} is {got}, expected {expected}")]
    /// A buffer whose element type differs from the call's.
    DtypeMismatch {
        /// The collective that checked it.
        collective: &'static str,
        /// Which buffer.
        what: &'static str,
        /// Its element type.
        got: DataType,
        /// The call's element type.
        expected: DataType,
    },

    #[error("{collective}: reduce op {op} is not defined for dtype {dtype}")]
    /// A reduction that has no meaning for the element type (a bitwise op on floats, ...).
    UnsupportedOp {
        /// The collective that checked it.
        collective: &'static str,
        /// The reduction asked for.
        op: ReduceOp,
        /// The element type it was asked on.
        dtype: DataType,
    },

    #[error("{collective}: {what} rank {rank} is out of range for a communicator of {size} ranks")]
    /// A peer or root rank that is not in the communicator.
    RankOutOfRange {
        /// The collective that checked it.
        collective: &'static str,
        /// Which rank argument (`root`, `peer`, ...).
        what: &'static str,
        /// The rank given.
        rank: usize,
        /// The communicator's size.
        size: usize,
    },

    #[error("{collective}: this backend ({backend}) does not support {what}")]
    /// A call the chosen backend does not implement; another backend may.
    Unsupported {
        /// The collective asked for.
        collective: &'static str,
        /// The backend's name (`host`, `cuda`, `nccl`).
        backend: &'static str,
        /// What it lacks (a dtype, an algorithm, a buffer location).
        what: String,
    },

    #[error(
        "{collective} on rank {rank}: Timed out after {timeout:?} waiting for rank {missing} \
         (it died, hangs, or never called {collective})"
    )]
    /// A collective that waited past its timeout for a peer.
    Timeout {
        /// The collective that waited.
        collective: &'static str,
        /// The rank that waited.
        rank: usize,
        /// The rank it was waiting for.
        missing: usize,
        /// How long it waited.
        timeout: Duration,
    },

    #[error(
        "collective mismatch at call #{seq}: rank {rank} called {mine} but rank {peer} called {theirs}"
    )]
    /// Ranks that called different collectives (or shapes) at the same point of the sequence.
    Mismatch {
        /// The call's sequence number on this communicator.
        seq: u64,
        /// This rank.
        rank: usize,
        /// This rank's call, described.
        mine: String,
        /// The rank that disagreed.
        peer: usize,
        /// The peer's call, described.
        theirs: String,
    },

    #[error("rank {peer} failed or exited while {collective} was running on rank {rank}")]
    /// A peer that died or left while a collective was running.
    PeerFailed {
        /// The collective that was running.
        collective: &'static str,
        /// This rank.
        rank: usize,
        /// The rank that failed.
        peer: usize,
    },

    #[error(
        "{collective} (call #{call}) on rank {rank}: rank {peer} refused this call ({why}), so \
         it fails on every rank"
    )]
    /// A collective call that another rank refused (its arguments were wrong there): it fails
    /// on every rank at once instead of waiting for the refusing rank.
    PeerRefused {
        /// The collective.
        collective: &'static str,
        /// The call's number on the communicator.
        call: u64,
        /// This rank.
        rank: usize,
        /// The rank that refused it.
        peer: usize,
        /// That rank's error.
        why: String,
    },

    /// An environment variable that is needed and unset.
    #[error("missing environment variable {var}: {why}")]
    MissingEnv {
        /// The variable's name.
        var: &'static str,
        /// Why it is needed here.
        why: String,
    },

    #[error("environment variable {var}={value:?} is invalid: {why}")]
    /// An environment variable whose value does not parse or is out of range.
    BadEnv {
        /// The variable's name.
        var: &'static str,
        /// Its value as found.
        value: String,
        /// What is wrong with it.
        why: String,
    },

    /// A failure of the rendezvous store (connection, protocol, authentication).
    #[error("store: {0}")]
    Store(String),

    /// A store key that no rank set within the timeout.
    #[error("store: Timed out after {timeout:?} waiting for key '{key}'")]
    StoreTimeout {
        /// The key waited for.
        key: String,
        /// How long it waited.
        timeout: Duration,
    },

    /// A joint step through the store (`tag`, such as `settings`) that some ranks never joined.
    #[error(
        "store: rank {rank} at '{tag}': Timed out after {timeout:?} waiting for {}: {} of {world} \
         ranks never joined (not started, crashed, or created a communicator under another name)",
        rank_list(missing), missing.len()
    )]
    RendezvousTimeout {
        /// The step's name.
        tag: String,
        /// This rank.
        rank: usize,
        /// The number of ranks expected.
        world: usize,
        /// The ranks that had not joined when the wait ended, in order.
        missing: Vec<usize>,
        /// How long it waited.
        timeout: Duration,
    },

    /// A shared library loaded at run time that could not be found or lacks a symbol.
    #[error("{library} is not available: {why}")]
    LibraryMissing {
        /// The library (`libcuda`, `libnccl`, `libnvrtc`, ...).
        library: &'static str,
        /// Why loading it failed.
        why: String,
    },

    /// A CUDA driver call that failed, with the driver's own error string.
    #[error("CUDA: {0}")]
    Cuda(String),

    /// An NCCL call that failed, with NCCL's own error string.
    #[error("NCCL: {0}")]
    Nccl(String),

    /// A kernel that NVRTC failed to compile.
    #[error("kernel compile of {source_name} failed:\n{log}")]
    KernelCompile {
        /// The kernel source's name.
        source_name: String,
        /// The compiler's log.
        log: String,
    },

    /// A call on a communicator after `finalize`; the text is its name.
    #[error("communicator '{0}' has been finalized")]
    Finalized(String),

    /// A call on a communicator after `abort`.
    #[error("communicator '{communicator}' has been aborted ({why})")]
    Aborted {
        /// The communicator's name.
        communicator: String,
        /// Why it was aborted (`abort() was called`, or the reason the caller gave).
        why: String,
    },

    #[error("I/O: {context}: {source}")]
    /// An operating-system I/O error, with what was being done.
    Io {
        /// What was being done.
        context: String,
        /// The error itself.
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
