//! Every environment variable ferrocomm reads, read here and nowhere else.
//!
//! [`VARS`] is the table of variables with their defaults and meaning; `docs/config.md`
//! shows the same table (a test holds them together) and `ferrocomm info` prints the values
//! in effect with where each came from.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::quant::Format;
use crate::types::Algo;

pub mod tuning;

use tuning::{TableSource, Tuning};

/// One environment variable: its name, default (as text) and meaning.
#[derive(Debug, Clone, Copy)]
pub struct Var {
    /// The variable's name.
    pub name: &'static str,
    /// Its default, as `docs/config.md` and `ferrocomm info` show it.
    pub default: &'static str,
    /// What it does, in one paragraph.
    pub meaning: &'static str,
}

const fn var(name: &'static str, default: &'static str, meaning: &'static str) -> Var {
    Var {
        name,
        default,
        meaning,
    }
}

/// Every variable ferrocomm reads.
pub const VARS: &[Var] = &[
    var("FERROCOMM_TIMEOUT_S", "300", "Seconds a collective or bootstrap step waits for a peer before failing with a timeout (naming the missing rank where it can be known; NCCL work is aborted by the watchdog). Positive, at least 1 ns, at most 1e9."),
    var("FERROCOMM_BACKEND", "auto", "Backend when none is asked for: auto (cuda for GPU buffers when a GPU is present, host otherwise), host, cuda, nccl."),
    var("FERROCOMM_ALGO", "auto", "Force one algorithm for every collective that has it: auto, push, flat, tree, direct, nccl."),
    var("FERROCOMM_LOW_PRECISION", "0", "1 turns on block-scaled low-precision collectives (Sum/Avg on f32/f16/bf16 only)."),
    var("RCCL_LOW_PRECISION_ENABLE", "0", "Alias of FERROCOMM_LOW_PRECISION, accepted for people coming from RCCLX."),
    var("FERROCOMM_LP_FORMAT", "e4m3", "Low-precision wire format: e4m3, e5m2 or int8."),
    var("FERROCOMM_LP_BLOCK", "128", "Elements per block that share one f32 scale (a power of two, 16..4096)."),
    var("FERROCOMM_LP_MIN_BYTES", "0 (host), the tuning table's (cuda)", "Messages smaller than this stay full precision even when low precision is on."),
    var("FERROCOMM_LP_ALL_REDUCE", "1", "Per-collective switch: 0 keeps all_reduce full precision when low precision is on."),
    var("FERROCOMM_LP_ALL_GATHER", "1", "Per-collective switch for all_gather."),
    var("FERROCOMM_LP_REDUCE_SCATTER", "1", "Per-collective switch for reduce_scatter."),
    var("FERROCOMM_LP_ALL_TO_ALL", "1", "Per-collective switch for all_to_all and all_to_all_v."),
    var("FERROCOMM_ALLREDUCE_PUSH_MAX_BYTES", "the tuning table's, by world size (docs/tuning.md)", "Largest all-reduce (bytes per rank) that uses the barrier-free push one-shot."),
    var("FERROCOMM_ALLREDUCE_FLAT_MAX_BYTES", "the tuning table's, by world size (docs/tuning.md)", "Largest all-reduce that uses flat (one-shot pull); above it tree (two-shot)."),
    var("FERROCOMM_ALLREDUCE_CE_MIN_BYTES", "0 (off)", "CUDA backend, two ranks: flat all-reduces of at least this many bytes per rank (and at most the staging) move their data with the copy engines instead of the SMs (chunks into the peer's memory, the SMs only reduce); 0 keeps every one on the SMs. Adds one staging-sized region per rank when set."),
    var("FERROCOMM_ALLREDUCE_LL128_MAX_BYTES", "0 (off)", "CUDA backend: flat all-reduces of at most this many bytes per rank (and at most the staging) move in 128-byte lines with the flag inside (NCCL's LL128 form: no barrier, no fence; relies on a warp's 128-byte store reaching the peer whole, as over NVLink, so it runs only where NVML reports NVLink between every pair of ranks' GPUs) instead of the pull through the staging; 0 keeps the pull. Adds a region of 2 x (ranks - 1) x 16/15 of it per rank when set."),
    var("FERROCOMM_RMSNORM_FUSED", "1", "CUDA backend with direct access: 1 (the default) runs all_reduce_rmsnorm in one launch (the all-reduce, residual add, RMSNorm and E4M3 rows in one kernel: one-shot up to FERROCOMM_RMSNORM_FLAT_MAX_BYTES, two-shot above it while twice the message fits the staging); 0 runs the all-reduce, then the norm kernel. With low precision on the wire the rows cross as the codec's block-scaled records inside the one launch where a row is whole blocks of at most 32 16-byte vectors (hidden 4096 in bf16 with blocks of 128, say); other low-precision calls, and calls that go through NCCL or push, take the two launches either way. A communicator of one rank runs the norm kernel on x itself."),
    var("FERROCOMM_RMSNORM_FLAT_MAX_BYTES", "the all-reduce's flat threshold", "Largest one-launch all_reduce_rmsnorm (bytes of x per rank) that runs one-shot (every rank reduces every row); above it two-shot (each rank reduces and normalizes its stripe of rows, then every rank gathers them)."),
    var("FERROCOMM_RMSNORM_WIDE_MAX_ROWS", "1024", "CUDA backend: the largest all_reduce_rmsnorm (rows of x) whose norm kernel (a communicator of one rank's call, or the second of two launches) spreads each row over as many threads as hold it, one to four 16-byte vectors a thread (fc_rmsnorm_wide: a short chain of instructions per row, for calls of few rows); larger calls take four vectors a thread (fc_rmsnorm). At most 65535; 0 never. It fixes the order of a row's sum of squares, so every rank of a communicator must have the same (communicator creation refuses a mismatch)."),
    var("FERROCOMM_RMSNORM_LOOPBACK", "(off)", "Measurement only (scripts/norm_bench.py): a CUDA communicator of one rank runs all_reduce_rmsnorm's one-launch kernel of this many ranks (2 to 16; the one-shot, or the two-shot when the call asks for tree) with every peer's staging replaced by its own and no barrier, so that one GPU measures the local traffic of the multi-rank kernel. Results are not the call's."),
    var("FERROCOMM_ALLREDUCE_TREE_MAX_BYTES", "the tuning table's, by world size (docs/tuning.md)", "Largest all-reduce that uses tree on the cuda backend; above it NCCL."),
    var("FERROCOMM_ALLGATHER_MAX_BYTES", "the tuning table's, by world size (docs/tuning.md)", "Largest all-gather (input bytes per rank) done by direct access on cuda; above it NCCL."),
    var("FERROCOMM_REDUCESCATTER_MAX_BYTES", "the tuning table's, by world size (docs/tuning.md)", "Largest reduce-scatter (output bytes per rank) done by direct access on cuda."),
    var("FERROCOMM_ALLTOALL_MAX_BYTES", "the tuning table's, by world size (docs/tuning.md)", "Largest all-to-all (input bytes per rank) done by direct access on cuda; also the all-to-all-v at two ranks (above two its choice takes no size)."),
    var("FERROCOMM_LL_MAX_BYTES", "the tuning table's (256 KiB built in, docs/tuning.md)", "CUDA backend: largest part (bytes) that all-gather, all-to-all(-v), broadcast, reduce-scatter and reduce move in LL lines (flags beside the data, no barrier); larger parts take the staged protocol. At most the push buffer (512 KiB, or the staging size when smaller)."),
    var("FERROCOMM_PUT_CE_MIN_BYTES", "262144", "CUDA backend: a window put of at least this many bytes goes by the copy engine (cuMemcpyAsync into the peer's mapping, no SM busy), a smaller one by a copy kernel (lower latency). Not tuned by a measurement yet: `ferrocomm bench put` measures both."),
    var("FERROCOMM_BROADCAST_MAX_BYTES", "the tuning table's, by world size (docs/tuning.md)", "Largest broadcast/reduce done by direct access on cuda."),
    var("FERROCOMM_P2P_MAX_BYTES", "67108864", "Largest send/recv message done by direct access on cuda, in two-rank communicators only (a message is a broadcast rooted at its sender there); larger ones, and every one above two ranks, go through NCCL (0: every non-empty message)."),
    var("FERROCOMM_TUNING", "(this machine's table, else built in)", "A tuning table file (JSON, docs/tuning.md) that replaces the built-in table of the sizes at which the planner's choices change; unset: this machine's table under $XDG_CACHE_HOME/ferrocomm/tuning (what ferrocomm tune writes), else the built-in one. The file must be the user's and writable by no one else. The settings above still win over any table."),
    var("FERROCOMM_HOST_SLOT_BYTES", "4194304", "Host backend: bytes of shared-memory staging per rank (larger messages are processed in chunks of this size). 4096 to 1 GiB."),
    var("FERROCOMM_CUDA_STAGING_BYTES", "67108864", "CUDA backend: bytes of IPC staging per rank and buffer (direct access is limited to this size per rank). At most 16 GiB."),
    var("FERROCOMM_NCCL_WATCHDOG", "1", "1 follows every NCCL operation enqueued outside graph capture with a CUDA event and aborts the NCCL communicator when one stays incomplete past FERROCOMM_TIMEOUT_S; 0 leaves NCCL unwatched (as nccl-tests runs it: the bench's NCCL baseline does)."),
    var("FERROCOMM_PDL", "0", "CUDA backend: 1 launches the kernels with programmatic dependent launch on sm_90 and newer (a kernel is scheduled while the previous one on the stream finishes, and waits for it in griddepcontrol.wait); 0 launches them plainly."),
    var("FERROCOMM_NCCL_LIB", "(search)", "Path of libnccl.so to load; otherwise the system path, then torch's nvidia/nccl/lib."),
    var("FERROCOMM_NVRTC_LIB", "(search)", "Path of libnvrtc.so.13 (or its directory); when set it is the only NVRTC loaded (a wrong path is an error). Unset: the library path, /usr/local/cuda, then python's nvidia/cu13/lib or nvidia/cuda_nvrtc/lib."),
    var("FERROCOMM_KERNEL_CACHE", "$XDG_CACHE_HOME/ferrocomm or ~/.cache/ferrocomm", "Directory of compiled kernels (cubins keyed by source hash, arch and NVRTC version)."),
    var("FERROCOMM_BUILTIN_KERNELS", "1", "0: ignore the kernels built into the library and compile every unit a GPU needs with NVRTC (through the kernel cache), as for a GPU they were not built for."),
    var("FERROCOMM_STORE_ADDR", "MASTER_ADDR", "Host of the bootstrap TCP store: rank 0 listens on every address it resolves to (or fails naming the one it cannot take); a name of every interface (0, 0.0.0.0, ::) is refused."),
    var("FERROCOMM_STORE_PORT", "MASTER_PORT (MASTER_PORT+1 under torchrun)", "Port of the bootstrap TCP store."),
    var("FERROCOMM_STORE_SECRET", "(derived)", "Secret the job's processes share to authenticate to the bootstrap store (at least 16 characters, UTF-8; never printed). ferrocomm launch sets a random one; unset, it is derived from torchrun's TORCHELASTIC_RUN_ID with MASTER_ADDR and MASTER_PORT, else from this user's key file $XDG_CONFIG_HOME/ferrocomm/store-key (see docs/security.md)."),
    var("FERROCOMM_STORE_EXTERNAL", "0", "1 when the store server runs outside the ranks (ferrocomm launch sets it); rank 0 then connects as a client."),
    var("FERROCOMM_FLIGHT_RECORDER", "2000", "Calls each communicator's flight recorder keeps (a ring of the latest; 0 turns it off): what every rank was doing, dumped on a timeout, a dead or aborted peer, abort(), SIGUSR1 (FERROCOMM_TRACE_ON_SIGUSR1) and on demand, in torch's flight-recorder format (docs/reliability.md). At most 1048576."),
    var("FERROCOMM_TRACE_DIR", "(temp dir)/ferrocomm-trace-<uid>-<job>", "Directory the flight recorder's dumps go to, one file per rank (ferrocomm_trace_rank_<rank>); created mode 700 when absent, refused when it is another user's, open to others or a symbolic link."),
    var("FERROCOMM_TRACE_ON_SIGUSR1", "0", "1 dumps the flight recorder of every communicator of the process when it receives SIGUSR1."),
    var("FERROCOMM_CHECK_CALLS", "0", "1 compares every collective call's description (collective, counts, dtype, op, root; an all-to-all-v's counts pairwise) across the ranks before it runs: a call that differs raises on every rank at that call, naming the ranks and what differs, and nothing runs. Sends and receives are not compared (their sizes are checked on both sides anyway). Costs a store round trip per call; the same on every rank."),
    var("FERROCOMM_NAN_CHECK", "0", "1 checks every call's floating-point input for NaN and infinity before it runs, raising on the rank that holds one, naming the call and the first bad element (host buffers; CUDA buffers are copied to the host for the check)."),
    var("FERROCOMM_DEBUG", "0", "1 prints the configuration to stderr at start-up (like NCCL_DEBUG=INFO) and each plan a communicator runs, the first time it runs it: the path the bench prints and, where there are any, the forms it does not name (the parts' LL, staged or pipelined kernel, the all-to-all-v's form, the low-precision records' push or pull, chunk and kernel)."),
    var("RANK", "-", "Global rank (torchrun), below WORLD_SIZE; OMPI_COMM_WORLD_RANK is read when RANK is absent."),
    var("WORLD_SIZE", "-", "Number of ranks (torchrun), 1 to 65536; OMPI_COMM_WORLD_SIZE otherwise."),
    var("LOCAL_RANK", "RANK", "Rank within this host, below LOCAL_WORLD_SIZE; selects the GPU (OMPI_COMM_WORLD_LOCAL_RANK otherwise)."),
    var("LOCAL_WORLD_SIZE", "WORLD_SIZE", "Ranks on this host, 1 to 65536 (OMPI_COMM_WORLD_LOCAL_SIZE otherwise); below WORLD_SIZE means several hosts."),
    var("MASTER_ADDR", "127.0.0.1", "Host of rank 0 (torchrun); rank 0 hosts the store there unless FERROCOMM_STORE_ADDR says otherwise."),
    var("MASTER_PORT", "-", "Port of rank 0 (torchrun)."),
];

/// Variables ferrocomm reads beside [`VARS`]: other programs' settings it follows.
const OTHER_VARS: &[&str] = &[
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "TORCHELASTIC_RUN_ID",
    "HOME",
    "XDG_CONFIG_HOME",
    "XDG_CACHE_HOME",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
];

/// Where a value in effect came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Source {
    /// The built-in default.
    Default,
    /// An environment variable.
    Env,
}

/// Which backend a communicator uses when the caller does not say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum BackendChoice {
    /// `host` for CPU buffers or without a GPU, `cuda` for GPU buffers when a GPU is present.
    Auto,
    /// The shared-memory host backend.
    Host,
    /// The CUDA backend: direct access over NVLink, NCCL for what it does not win.
    Cuda,
    /// NCCL for every collective.
    Nccl,
}

impl FromStr for BackendChoice {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" | "ferrocomm" => Ok(BackendChoice::Auto),
            "host" | "cpu" | "shm" => Ok(BackendChoice::Host),
            "cuda" | "dda" => Ok(BackendChoice::Cuda),
            "nccl" => Ok(BackendChoice::Nccl),
            _ => Err("expected auto, host, cuda or nccl".into()),
        }
    }
}

/// Low-precision settings.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LowPrecisionConfig {
    /// `FERROCOMM_LOW_PRECISION` (or `RCCL_LOW_PRECISION_ENABLE`): block-scaled codecs on.
    pub enabled: bool,
    /// `FERROCOMM_LP_FORMAT`: the wire format.
    pub format: Format,
    /// `FERROCOMM_LP_BLOCK`: elements per block that share one scale.
    pub block: usize,
    /// `None`: the backend's tuned default.
    pub min_bytes: Option<usize>,
    /// `FERROCOMM_LP_ALL_REDUCE`: all_reduce may use low precision.
    pub all_reduce: bool,
    /// `FERROCOMM_LP_ALL_GATHER`: all_gather may use low precision.
    pub all_gather: bool,
    /// `FERROCOMM_LP_REDUCE_SCATTER`: reduce_scatter may use low precision.
    pub reduce_scatter: bool,
    /// `FERROCOMM_LP_ALL_TO_ALL`: all_to_all and all_to_all_v may use low precision.
    pub all_to_all: bool,
}

/// Size thresholds in bytes per rank; `None` means "the default for this world size"
/// (see [`crate::plan`]).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Thresholds {
    /// `FERROCOMM_ALLREDUCE_PUSH_MAX_BYTES`: the largest all-reduce that uses push.
    pub push_max: Option<usize>,
    /// `FERROCOMM_ALLREDUCE_FLAT_MAX_BYTES`: the largest all-reduce that uses flat.
    pub flat_max: Option<usize>,
    /// `FERROCOMM_ALLREDUCE_TREE_MAX_BYTES`: the largest all-reduce that uses tree (cuda).
    pub tree_max: Option<usize>,
    /// `FERROCOMM_ALLREDUCE_CE_MIN_BYTES`: the smallest flat all-reduce whose data the copy
    /// engines move (two ranks; `None` or 0: off).
    pub ce_min: Option<usize>,
    /// `FERROCOMM_ALLREDUCE_LL128_MAX_BYTES`: the largest flat all-reduce that moves in LL128
    /// lines (`None` or 0: off).
    pub ll128_max: Option<usize>,
    /// `FERROCOMM_ALLGATHER_MAX_BYTES`: the largest all-gather done by direct access.
    pub all_gather_max: Option<usize>,
    /// `FERROCOMM_REDUCESCATTER_MAX_BYTES`: the largest reduce-scatter done by direct access.
    pub reduce_scatter_max: Option<usize>,
    /// `FERROCOMM_ALLTOALL_MAX_BYTES`: the largest all-to-all done by direct access.
    pub all_to_all_max: Option<usize>,
    /// `FERROCOMM_BROADCAST_MAX_BYTES`: the largest broadcast or reduce done by direct access.
    pub broadcast_max: Option<usize>,
    /// `FERROCOMM_P2P_MAX_BYTES`: the largest send/recv done by direct access (two ranks).
    pub p2p_max: Option<usize>,
    /// `FERROCOMM_LL_MAX_BYTES`: the largest part the cuda collectives send in LL lines.
    pub ll_max: Option<usize>,
    /// `FERROCOMM_PUT_CE_MIN_BYTES`: the smallest window put the copy engine carries (cuda).
    pub put_ce_min: Option<usize>,
    /// `FERROCOMM_RMSNORM_FUSED`: all_reduce_rmsnorm in one launch where direct access takes it.
    pub rmsnorm_fused: bool,
    /// `FERROCOMM_RMSNORM_FLAT_MAX_BYTES`: the largest one-shot one-launch all_reduce_rmsnorm.
    pub rmsnorm_flat_max: Option<usize>,
    /// `FERROCOMM_RMSNORM_WIDE_MAX_ROWS`: the most rows whose norm kernel takes the wide
    /// geometry (rows, not bytes; `None`: 1024, cuda/dda/fused_norm.rs).
    pub rmsnorm_wide_max_rows: Option<usize>,
}

/// How this process was launched: torchrun's or Open MPI's variables.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct LaunchEnv {
    /// `RANK` (or `OMPI_COMM_WORLD_RANK`).
    pub rank: Option<usize>,
    /// `WORLD_SIZE` (or `OMPI_COMM_WORLD_SIZE`).
    pub world_size: Option<usize>,
    /// `LOCAL_RANK` (or `OMPI_COMM_WORLD_LOCAL_RANK`).
    pub local_rank: Option<usize>,
    /// `LOCAL_WORLD_SIZE` (or `OMPI_COMM_WORLD_LOCAL_SIZE`).
    pub local_world_size: Option<usize>,
    /// `MASTER_ADDR`.
    pub master_addr: Option<String>,
    /// `MASTER_PORT`.
    pub master_port: Option<u16>,
    /// `FERROCOMM_STORE_ADDR`.
    pub store_addr: Option<String>,
    /// `FERROCOMM_STORE_PORT`.
    pub store_port: Option<u16>,
    /// `FERROCOMM_STORE_EXTERNAL`: the store server runs outside the ranks.
    pub store_external: bool,
    /// Set under torchrun, whose agent already listens on MASTER_PORT.
    pub under_torchelastic: bool,
    /// `TORCHELASTIC_RUN_ID`: torchrun's run id (random under `--standalone`).
    pub run_id: Option<String>,
    /// `FERROCOMM_STORE_SECRET` (see [`crate::bootstrap::StoreKey::from_config`]).
    #[serde(skip)]
    pub store_secret: Option<Secret>,
}

/// A secret read from the environment: never printed, serialized or shown by `info`.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("(hidden)")
    }
}

/// The configuration in effect.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Config {
    /// `FERROCOMM_TIMEOUT_S`: how long a collective or bootstrap step waits for a peer.
    pub timeout: Duration,
    /// `FERROCOMM_BACKEND`.
    pub backend: BackendChoice,
    /// `FERROCOMM_ALGO`.
    pub algo: Algo,
    /// The low-precision settings.
    pub low_precision: LowPrecisionConfig,
    /// The size thresholds of the planner set in the environment (each wins over the table).
    pub thresholds: Thresholds,
    /// The tuning table in force ([`crate::tuning`]): `FERROCOMM_TUNING`'s file, this machine's
    /// ([`Config::use_machine_table`]) or the built-in one; serialized as where it came from
    /// and its digest.
    #[serde(serialize_with = "tuning::serialize_in_force")]
    pub tuning: Arc<Tuning>,
    /// `FERROCOMM_TUNING`: the table file named.
    pub tuning_file: Option<PathBuf>,
    /// Where this machine's tables are (`$XDG_CACHE_HOME/ferrocomm/tuning`, or
    /// `~/.cache/ferrocomm/tuning`).
    pub tuning_dir: PathBuf,
    /// `FERROCOMM_HOST_SLOT_BYTES`: shared-memory staging per rank of the host backend.
    pub host_slot_bytes: usize,
    /// `FERROCOMM_CUDA_STAGING_BYTES`: IPC staging per rank and buffer of the cuda backend.
    pub cuda_staging_bytes: usize,
    /// `FERROCOMM_PDL`: launch the cuda backend's kernels with programmatic dependent launch
    /// where the device and driver allow it (see docs/cuda-backend.md).
    pub pdl: bool,
    /// `FERROCOMM_NCCL_WATCHDOG`: abort NCCL communicators whose work hangs (nccl/watchdog.rs).
    pub nccl_watchdog: bool,
    /// `FERROCOMM_RMSNORM_LOOPBACK`: measurement only, the ranks a one-rank communicator's
    /// fused call runs its one-launch kernel as (cuda/dda/fused_norm.rs).
    pub rmsnorm_loopback: Option<usize>,
    /// `FERROCOMM_NCCL_LIB`: the libnccl to load instead of searching.
    pub nccl_lib: Option<PathBuf>,
    /// `FERROCOMM_NVRTC_LIB`: the NVRTC to load instead of searching.
    pub nvrtc_lib: Option<PathBuf>,
    /// Python installation prefixes whose site-packages may hold NVIDIA's library wheels
    /// (`VIRTUAL_ENV`, `CONDA_PREFIX`, `~/.local`, `/usr/local`, `/usr`), searched for libnccl and
    /// libnvrtc when the system path lacks them.
    pub python_prefixes: Vec<PathBuf>,
    /// `FERROCOMM_KERNEL_CACHE`: the directory of compiled kernels.
    pub kernel_cache: PathBuf,
    /// `FERROCOMM_BUILTIN_KERNELS`: use the kernels built into the library (off: compile them).
    pub builtin_kernels: bool,
    /// This user's store key file (`$XDG_CONFIG_HOME/ferrocomm/store-key` or
    /// `~/.config/ferrocomm/store-key`; `None` without either variable).
    pub store_key_file: Option<PathBuf>,
    /// `FERROCOMM_DEBUG`: print the configuration and each new plan to stderr.
    pub debug: bool,
    /// `FERROCOMM_FLIGHT_RECORDER`: calls each communicator's flight recorder keeps (0: off).
    pub flight_recorder: usize,
    /// `FERROCOMM_TRACE_DIR`: where flight-recorder dumps go (`None`: a per-job directory
    /// under the temporary directory).
    pub trace_dir: Option<PathBuf>,
    /// `FERROCOMM_TRACE_ON_SIGUSR1`: dump every flight recorder of the process on SIGUSR1.
    pub trace_on_sigusr1: bool,
    /// `FERROCOMM_CHECK_CALLS`: compare every call's description across ranks first.
    pub check_calls: bool,
    /// `FERROCOMM_NAN_CHECK`: check inputs for NaN and infinity first.
    pub nan_check: bool,
    /// How this process was launched.
    pub launch: LaunchEnv,
    /// Variable name -> (value text, source) for every variable in [`VARS`].
    #[serde(skip)]
    pub sources: BTreeMap<&'static str, (String, Source)>,
}

impl Default for Config {
    fn default() -> Self {
        Config::from_lookup(|_| None).expect("defaults parse")
    }
}

struct Reader<'a> {
    lookup: &'a dyn Fn(&str) -> Option<String>,
    sources: BTreeMap<&'static str, (String, Source)>,
}

impl Reader<'_> {
    fn raw(&mut self, name: &'static str) -> Option<String> {
        debug_assert!(
            VARS.iter().any(|v| v.name == name),
            "{name} missing from VARS"
        );
        let v = (self.lookup)(name).filter(|s| !s.trim().is_empty());
        let (text, src) = match &v {
            Some(s) => (s.clone(), Source::Env),
            None => (
                VARS.iter()
                    .find(|v| v.name == name)
                    .map(|v| v.default.to_string())
                    .unwrap_or_default(),
                Source::Default,
            ),
        };
        self.sources.insert(name, (text, src));
        v
    }

    fn parse<T: FromStr>(&mut self, name: &'static str, why: &str) -> Result<Option<T>> {
        match self.raw(name) {
            None => Ok(None),
            Some(s) => s.trim().parse::<T>().map(Some).map_err(|_| Error::BadEnv {
                var: name,
                value: s,
                why: why.to_string(),
            }),
        }
    }

    fn flag(&mut self, name: &'static str, default: bool) -> Result<bool> {
        match self.raw(name) {
            None => Ok(default),
            Some(s) => match s.trim().to_ascii_lowercase().as_str() {
                "1" | "true" | "yes" | "on" => Ok(true),
                "0" | "false" | "no" | "off" => Ok(false),
                _ => Err(Error::BadEnv {
                    var: name,
                    value: s,
                    why: "expected 0 or 1".into(),
                }),
            },
        }
    }

    /// A byte size of at most `max` (sizes are used in layout arithmetic: bounded here, every
    /// sum and product of a few of them stays far from overflowing).
    fn bytes(&mut self, name: &'static str, max: usize) -> Result<Option<usize>> {
        match self.raw(name) {
            None => Ok(None),
            Some(s) => match parse_size(&s) {
                Ok(n) if n <= max => Ok(Some(n)),
                Ok(n) => Err(Error::BadEnv {
                    var: name,
                    value: s,
                    why: format!("{n} bytes is more than the largest accepted, {max}"),
                }),
                Err(why) => Err(Error::BadEnv {
                    var: name,
                    value: s,
                    why,
                }),
            },
        }
    }
}

/// Most calls a flight recorder keeps (`FERROCOMM_FLIGHT_RECORDER`): its ring is allocated at
/// creation, about 200 bytes a call.
pub const MAX_FLIGHT_RECORDER: usize = 1 << 20;

/// Largest size any byte-size variable accepts (1 TiB): thresholds only compare with it.
pub const MAX_ENV_BYTES: usize = 1 << 40;
/// Largest `FERROCOMM_HOST_SLOT_BYTES` (1 GiB of shared staging per rank).
pub const MAX_HOST_SLOT_BYTES: usize = 1 << 30;
/// Largest `FERROCOMM_CUDA_STAGING_BYTES` (16 GiB of device staging per rank and buffer).
pub const MAX_CUDA_STAGING_BYTES: usize = 1 << 34;
/// Largest `FERROCOMM_RMSNORM_WIDE_MAX_ROWS`: the wide norm kernel's grid holds every row,
/// at most one block a row, and a grid has at most 65535 blocks.
pub const MAX_WIDE_ROWS: usize = 65535;

/// Longest timeout accepted (about 31 years): beyond any job, and short enough that every
/// deadline computed from it (`Instant::now()` plus a few of it) is a valid instant.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(1_000_000_000);

/// Most ranks a communicator may have (`WORLD_SIZE`, `LOCAL_WORLD_SIZE`, a communicator's
/// size, `launch -n`): far beyond any job of GPUs ferrocomm serves, and small enough that
/// whatever is kept per rank (a store entry each at set-up, a pid each in `launch`) stays
/// small.
pub const MAX_WORLD_SIZE: usize = 1 << 16;

/// A timeout given in seconds (an environment variable, a command-line option, a Python
/// argument): positive, finite, at least a nanosecond and at most [`MAX_TIMEOUT`]; otherwise
/// why not.
pub fn timeout_from_secs(secs: f64) -> std::result::Result<Duration, String> {
    if secs.is_nan() || secs <= 0.0 {
        return Err(format!("must be a positive number of seconds, got {secs}"));
    }
    match Duration::try_from_secs_f64(secs) {
        // A tiny positive number such as 1e-320 would otherwise become no time at all.
        Ok(d) if d.is_zero() => Err(format!(
            "{secs} seconds is shorter than a nanosecond, the shortest timeout accepted"
        )),
        Ok(d) if d <= MAX_TIMEOUT => Ok(d),
        _ => Err(format!(
            "{secs} seconds is longer than the longest timeout accepted ({} s)",
            MAX_TIMEOUT.as_secs()
        )),
    }
}

/// Parses a byte size: a plain number or one with a K/M/G suffix (powers of 1024).
pub fn parse_size(s: &str) -> std::result::Result<usize, String> {
    let t = s.trim();
    let (num, mult) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1usize << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    num.trim()
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("'{s}' is not a size (a number with an optional K, M or G)"))
}

/// [`Config::shared_settings`]: each setting (its path in the serialized configuration) and the
/// variable that sets it.
const SHARED_SETTINGS: [(&str, &str); 28] = [
    ("algo", "FERROCOMM_ALGO"),
    ("check_calls", "FERROCOMM_CHECK_CALLS"),
    ("low_precision.enabled", "FERROCOMM_LOW_PRECISION"),
    ("low_precision.format", "FERROCOMM_LP_FORMAT"),
    ("low_precision.block", "FERROCOMM_LP_BLOCK"),
    ("low_precision.min_bytes", "FERROCOMM_LP_MIN_BYTES"),
    ("low_precision.all_reduce", "FERROCOMM_LP_ALL_REDUCE"),
    ("low_precision.all_gather", "FERROCOMM_LP_ALL_GATHER"),
    (
        "low_precision.reduce_scatter",
        "FERROCOMM_LP_REDUCE_SCATTER",
    ),
    ("low_precision.all_to_all", "FERROCOMM_LP_ALL_TO_ALL"),
    ("thresholds.push_max", "FERROCOMM_ALLREDUCE_PUSH_MAX_BYTES"),
    ("thresholds.flat_max", "FERROCOMM_ALLREDUCE_FLAT_MAX_BYTES"),
    ("thresholds.tree_max", "FERROCOMM_ALLREDUCE_TREE_MAX_BYTES"),
    ("thresholds.ce_min", "FERROCOMM_ALLREDUCE_CE_MIN_BYTES"),
    (
        "thresholds.ll128_max",
        "FERROCOMM_ALLREDUCE_LL128_MAX_BYTES",
    ),
    ("thresholds.all_gather_max", "FERROCOMM_ALLGATHER_MAX_BYTES"),
    (
        "thresholds.reduce_scatter_max",
        "FERROCOMM_REDUCESCATTER_MAX_BYTES",
    ),
    ("thresholds.all_to_all_max", "FERROCOMM_ALLTOALL_MAX_BYTES"),
    ("thresholds.broadcast_max", "FERROCOMM_BROADCAST_MAX_BYTES"),
    ("thresholds.p2p_max", "FERROCOMM_P2P_MAX_BYTES"),
    ("thresholds.put_ce_min", "FERROCOMM_PUT_CE_MIN_BYTES"),
    ("thresholds.ll_max", "FERROCOMM_LL_MAX_BYTES"),
    ("thresholds.rmsnorm_fused", "FERROCOMM_RMSNORM_FUSED"),
    (
        "thresholds.rmsnorm_flat_max",
        "FERROCOMM_RMSNORM_FLAT_MAX_BYTES",
    ),
    (
        "thresholds.rmsnorm_wide_max_rows",
        "FERROCOMM_RMSNORM_WIDE_MAX_ROWS",
    ),
    ("host_slot_bytes", "FERROCOMM_HOST_SLOT_BYTES"),
    ("cuda_staging_bytes", "FERROCOMM_CUDA_STAGING_BYTES"),
    ("tuning.digest", "FERROCOMM_TUNING"),
];

impl Config {
    /// The settings every rank of a communicator must share, because they decide algorithms,
    /// buffer layouts and what goes on the wire: (setting, its environment variable, value),
    /// the value as the configuration serializes it (`default` for an unset size).
    /// Communicator creation compares them across ranks and refuses a mismatch.
    pub fn shared_settings(&self) -> Vec<(&'static str, &'static str, String)> {
        let v = serde_json::to_value(self).expect("the configuration serializes");
        SHARED_SETTINGS
            .iter()
            .map(|&(path, var)| {
                let value = match v.pointer(&format!("/{}", path.replace('.', "/"))) {
                    None | Some(serde_json::Value::Null) => "default".to_string(),
                    Some(serde_json::Value::String(s)) => s.clone(),
                    Some(other) => other.to_string(),
                };
                (path, var, value)
            })
            .collect()
    }

    /// Reads the process environment. A variable ferrocomm reads whose value is not UTF-8 is
    /// a [`Error::BadEnv`], never taken as unset.
    pub fn from_env() -> Result<Self> {
        let not_utf8 = std::cell::Cell::new(None);
        let c = Self::from_lookup(|k| match std::env::var(k) {
            Ok(v) => Some(v),
            Err(std::env::VarError::NotPresent) => None,
            Err(std::env::VarError::NotUnicode(v)) => {
                let shown = if k == "FERROCOMM_STORE_SECRET" {
                    "(hidden)".to_string()
                } else {
                    v.to_string_lossy().into_owned()
                };
                // The first one found is reported.
                let first = not_utf8.take().or(Some((k.to_string(), shown)));
                not_utf8.set(first);
                None
            }
        });
        if let Some((name, value)) = not_utf8.take() {
            // Named after the table entry, whose name is 'static.
            let var = VARS
                .iter()
                .map(|v| v.name)
                .chain(OTHER_VARS.iter().copied())
                .find(|n| *n == name)
                .unwrap_or("(a variable ferrocomm reads)");
            return Err(Error::BadEnv {
                var,
                value,
                why: "is not valid UTF-8".into(),
            });
        }
        c
    }

    /// Reads variables through `lookup` (tests pass a map).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let mut r = Reader {
            lookup: &lookup,
            sources: BTreeMap::new(),
        };
        let timeout_s: f64 = r
            .parse(
                "FERROCOMM_TIMEOUT_S",
                "expected seconds (a positive number)",
            )?
            .unwrap_or(300.0);
        let timeout = timeout_from_secs(timeout_s).map_err(|why| Error::BadEnv {
            var: "FERROCOMM_TIMEOUT_S",
            value: timeout_s.to_string(),
            why,
        })?;
        let backend = match r.raw("FERROCOMM_BACKEND") {
            None => BackendChoice::Auto,
            Some(s) => s.parse().map_err(|why| Error::BadEnv {
                var: "FERROCOMM_BACKEND",
                value: s,
                why,
            })?,
        };
        let algo = match r.raw("FERROCOMM_ALGO") {
            None => Algo::Auto,
            Some(s) => s
                .parse()
                .map_err(|e: crate::types::ParseError| Error::BadEnv {
                    var: "FERROCOMM_ALGO",
                    value: s,
                    why: e.to_string(),
                })?,
        };
        let lp_on = r.flag("FERROCOMM_LOW_PRECISION", false)?;
        let lp_alias = r.flag("RCCL_LOW_PRECISION_ENABLE", false)?;
        let format = match r.raw("FERROCOMM_LP_FORMAT") {
            None => Format::E4M3,
            Some(s) => s.parse().map_err(|e: Error| Error::BadEnv {
                var: "FERROCOMM_LP_FORMAT",
                value: s,
                why: e.to_string(),
            })?,
        };
        let block: usize = r
            .parse("FERROCOMM_LP_BLOCK", "expected a power of two")?
            .unwrap_or(128);
        if !block.is_power_of_two() || !(16..=4096).contains(&block) {
            return Err(Error::BadEnv {
                var: "FERROCOMM_LP_BLOCK",
                value: block.to_string(),
                why: "must be a power of two between 16 and 4096".into(),
            });
        }
        let low_precision = LowPrecisionConfig {
            enabled: lp_on || lp_alias,
            format,
            block,
            min_bytes: r.bytes("FERROCOMM_LP_MIN_BYTES", MAX_ENV_BYTES)?,
            all_reduce: r.flag("FERROCOMM_LP_ALL_REDUCE", true)?,
            all_gather: r.flag("FERROCOMM_LP_ALL_GATHER", true)?,
            reduce_scatter: r.flag("FERROCOMM_LP_REDUCE_SCATTER", true)?,
            all_to_all: r.flag("FERROCOMM_LP_ALL_TO_ALL", true)?,
        };
        let thresholds = Thresholds {
            push_max: r.bytes("FERROCOMM_ALLREDUCE_PUSH_MAX_BYTES", MAX_ENV_BYTES)?,
            flat_max: r.bytes("FERROCOMM_ALLREDUCE_FLAT_MAX_BYTES", MAX_ENV_BYTES)?,
            tree_max: r.bytes("FERROCOMM_ALLREDUCE_TREE_MAX_BYTES", MAX_ENV_BYTES)?,
            ce_min: r.bytes("FERROCOMM_ALLREDUCE_CE_MIN_BYTES", MAX_ENV_BYTES)?,
            ll128_max: r.bytes("FERROCOMM_ALLREDUCE_LL128_MAX_BYTES", MAX_ENV_BYTES)?,
            all_gather_max: r.bytes("FERROCOMM_ALLGATHER_MAX_BYTES", MAX_ENV_BYTES)?,
            reduce_scatter_max: r.bytes("FERROCOMM_REDUCESCATTER_MAX_BYTES", MAX_ENV_BYTES)?,
            all_to_all_max: r.bytes("FERROCOMM_ALLTOALL_MAX_BYTES", MAX_ENV_BYTES)?,
            broadcast_max: r.bytes("FERROCOMM_BROADCAST_MAX_BYTES", MAX_ENV_BYTES)?,
            p2p_max: r.bytes("FERROCOMM_P2P_MAX_BYTES", MAX_ENV_BYTES)?,
            ll_max: r.bytes("FERROCOMM_LL_MAX_BYTES", MAX_ENV_BYTES)?,
            put_ce_min: r.bytes("FERROCOMM_PUT_CE_MIN_BYTES", MAX_ENV_BYTES)?,
            rmsnorm_fused: r.flag("FERROCOMM_RMSNORM_FUSED", true)?,
            rmsnorm_flat_max: r.bytes("FERROCOMM_RMSNORM_FLAT_MAX_BYTES", MAX_ENV_BYTES)?,
            rmsnorm_wide_max_rows: r.parse::<usize>(
                "FERROCOMM_RMSNORM_WIDE_MAX_ROWS",
                "expected a row count, 0 to 65535",
            )?,
        };
        if let Some(n) = thresholds
            .rmsnorm_wide_max_rows
            .filter(|&n| n > MAX_WIDE_ROWS)
        {
            return Err(Error::BadEnv {
                var: "FERROCOMM_RMSNORM_WIDE_MAX_ROWS",
                value: n.to_string(),
                why: format!("must be at most {MAX_WIDE_ROWS} (a block a row at most)"),
            });
        }
        let host_slot_bytes = r
            .bytes("FERROCOMM_HOST_SLOT_BYTES", MAX_HOST_SLOT_BYTES)?
            .unwrap_or(4 << 20);
        if host_slot_bytes < 4096 {
            return Err(Error::BadEnv {
                var: "FERROCOMM_HOST_SLOT_BYTES",
                value: host_slot_bytes.to_string(),
                why: "must be at least 4096".into(),
            });
        }
        let cuda_staging_bytes = r
            .bytes("FERROCOMM_CUDA_STAGING_BYTES", MAX_CUDA_STAGING_BYTES)?
            .unwrap_or(64 << 20);
        // Off by default: on 2xH200 it changed nothing measurable (docs/tuning.md).
        let pdl = r.flag("FERROCOMM_PDL", false)?;
        let nccl_watchdog = r.flag("FERROCOMM_NCCL_WATCHDOG", true)?;
        let rmsnorm_loopback =
            r.parse::<usize>("FERROCOMM_RMSNORM_LOOPBACK", "a rank count, 2 to 16")?;
        if let Some(w) = rmsnorm_loopback {
            if !(2..=16).contains(&w) {
                return Err(Error::BadEnv {
                    var: "FERROCOMM_RMSNORM_LOOPBACK",
                    value: w.to_string(),
                    why: "must be a rank count from 2 to 16".into(),
                });
            }
        }
        let nccl_lib = r.raw("FERROCOMM_NCCL_LIB").map(PathBuf::from);
        let nvrtc_lib = r.raw("FERROCOMM_NVRTC_LIB").map(PathBuf::from);
        let mut python_prefixes: Vec<PathBuf> = ["VIRTUAL_ENV", "CONDA_PREFIX"]
            .iter()
            .filter_map(|k| lookup(k).filter(|s| !s.is_empty()).map(PathBuf::from))
            .collect();
        if let Some(h) = lookup("HOME") {
            python_prefixes.push(PathBuf::from(h).join(".local"));
        }
        python_prefixes.extend(["/usr/local", "/usr", "/opt/conda"].map(PathBuf::from));
        let cache_base = lookup("XDG_CACHE_HOME")
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
            .or_else(|| lookup("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .unwrap_or_else(std::env::temp_dir)
            .join("ferrocomm");
        let kernel_cache = match r.raw("FERROCOMM_KERNEL_CACHE") {
            Some(p) => PathBuf::from(p),
            None => cache_base.clone(),
        };
        let tuning_file = r.raw("FERROCOMM_TUNING").map(PathBuf::from);
        let tuning = match &tuning_file {
            Some(p) => Arc::new(Tuning::read(p, TableSource::Env(p.clone())).map_err(|e| {
                Error::BadEnv {
                    var: "FERROCOMM_TUNING",
                    value: p.display().to_string(),
                    why: e.to_string(),
                }
            })?),
            None => Tuning::builtin(),
        };
        let builtin_kernels = r.flag("FERROCOMM_BUILTIN_KERNELS", true)?;
        let store_key_file = lookup("XDG_CONFIG_HOME")
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                lookup("HOME")
                    .filter(|s| !s.is_empty())
                    .map(|h| PathBuf::from(h).join(".config"))
            })
            .map(|d| d.join("ferrocomm").join("store-key"));
        let debug = r.flag("FERROCOMM_DEBUG", false)?;
        let flight_recorder = r
            .parse::<usize>("FERROCOMM_FLIGHT_RECORDER", "expected a number of calls")?
            .unwrap_or(2000);
        if flight_recorder > MAX_FLIGHT_RECORDER {
            return Err(Error::BadEnv {
                var: "FERROCOMM_FLIGHT_RECORDER",
                value: flight_recorder.to_string(),
                why: format!("at most {MAX_FLIGHT_RECORDER} calls"),
            });
        }
        let trace_dir = r.raw("FERROCOMM_TRACE_DIR").map(PathBuf::from);
        let trace_on_sigusr1 = r.flag("FERROCOMM_TRACE_ON_SIGUSR1", false)?;
        let check_calls = r.flag("FERROCOMM_CHECK_CALLS", false)?;
        let nan_check = r.flag("FERROCOMM_NAN_CHECK", false)?;
        let launch = read_launch(&mut r)?;
        Ok(Config {
            timeout,
            backend,
            algo,
            low_precision,
            thresholds,
            tuning,
            tuning_file,
            tuning_dir: cache_base.join("tuning"),
            host_slot_bytes,
            cuda_staging_bytes,
            pdl,
            nccl_watchdog,
            rmsnorm_loopback,
            nccl_lib,
            nvrtc_lib,
            python_prefixes,
            kernel_cache,
            builtin_kernels,
            store_key_file,
            debug,
            flight_recorder,
            trace_dir,
            trace_on_sigusr1,
            check_calls,
            nan_check,
            launch,
            sources: r.sources,
        })
    }

    /// Takes this machine's table (`<tuning_dir>/<key>.json`, [`tuning::machine_file`])
    /// where it exists and `FERROCOMM_TUNING` names none; an unreadable or invalid file there
    /// is an error naming it.
    pub fn use_machine_table(&mut self, key: &str) -> Result<()> {
        if self.tuning_file.is_none() {
            self.tuning = Tuning::in_force(None, &self.tuning_dir, Some(key))?;
        }
        Ok(())
    }

    /// (name, value in effect, source, meaning) for every variable, for `ferrocomm info`.
    pub fn table(&self) -> Vec<(&'static str, String, Source, &'static str)> {
        VARS.iter()
            .map(|v| {
                let (val, src) = self
                    .sources
                    .get(v.name)
                    .cloned()
                    .unwrap_or((v.default.to_string(), Source::Default));
                (v.name, val, src, v.meaning)
            })
            .collect()
    }
}

/// Sets NCCL's own variables that ferrocomm needs before NCCL is initialised, unless the user
/// set them: `NCCL_NVLS_ENABLE=0` (NVLink multicast is not to be used on these machines).
pub fn apply_nccl_env_defaults() {
    if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
        // SAFETY-free in edition 2021; called once before NCCL starts its threads.
        std::env::set_var("NCCL_NVLS_ENABLE", "0");
    }
}

fn read_launch(r: &mut Reader<'_>) -> Result<LaunchEnv> {
    // Ranks are below MAX_WORLD_SIZE, sizes at least 1 and at most it.
    let (lookup, parse_idx) = (r.lookup, |name: &'static str, s: String| {
        let size = name.ends_with("SIZE");
        let (lo, hi) = if size {
            (1, MAX_WORLD_SIZE)
        } else {
            (0, MAX_WORLD_SIZE - 1)
        };
        match s.trim().parse::<usize>() {
            Ok(n) if (lo..=hi).contains(&n) => Ok(n),
            Ok(_) | Err(_) => Err(Error::BadEnv {
                var: name,
                value: s,
                why: format!(
                    "expected {} from {lo} to {hi} (ferrocomm's largest world is \
                     {MAX_WORLD_SIZE} ranks)",
                    if size { "a number of ranks" } else { "a rank" }
                ),
            }),
        }
    });
    // torchrun first, then Open MPI's names for the same facts.
    let mut pick = |torch: &'static str, ompi: &'static str| -> Result<Option<usize>> {
        if let Some(s) = r.raw(torch) {
            return parse_idx(torch, s).map(Some);
        }
        match lookup(ompi).filter(|s| !s.trim().is_empty()) {
            Some(s) => parse_idx(torch, s).map(Some),
            None => Ok(None),
        }
    };
    let rank = pick("RANK", "OMPI_COMM_WORLD_RANK")?;
    let world_size = pick("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE")?;
    let local_rank = pick("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK")?;
    let local_world_size = pick("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE")?;
    let master_addr = r.raw("MASTER_ADDR");
    let master_port = r.parse::<u16>("MASTER_PORT", "expected a TCP port")?;
    let store_addr = r.raw("FERROCOMM_STORE_ADDR");
    let store_port = r.parse::<u16>("FERROCOMM_STORE_PORT", "expected a TCP port")?;
    let store_external = r.flag("FERROCOMM_STORE_EXTERNAL", false)?;
    let run_id = (r.lookup)("TORCHELASTIC_RUN_ID");
    let under_torchelastic = run_id.is_some();
    let store_secret = r.raw("FERROCOMM_STORE_SECRET").map(Secret);
    if store_secret.is_some() {
        // The table `info` prints shows that it is set, never its value.
        r.sources.insert(
            "FERROCOMM_STORE_SECRET",
            ("(set, hidden)".into(), Source::Env),
        );
    }
    for (var, rk, size, ws) in [
        ("RANK", rank, "WORLD_SIZE", world_size),
        (
            "LOCAL_RANK",
            local_rank,
            "LOCAL_WORLD_SIZE",
            local_world_size,
        ),
    ] {
        if let (Some(rk), Some(ws)) = (rk, ws) {
            if rk >= ws {
                return Err(Error::BadEnv {
                    var,
                    value: rk.to_string(),
                    why: format!("must be below {size}={ws}"),
                });
            }
        }
    }
    Ok(LaunchEnv {
        rank,
        world_size,
        local_rank,
        local_world_size,
        master_addr,
        master_port,
        store_addr,
        store_port,
        store_external,
        under_torchelastic,
        run_id,
        store_secret,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_secret_is_never_shown() {
        let secret = "do-not-print-this-secret";
        let c = Config::from_lookup(|k| (k == "FERROCOMM_STORE_SECRET").then(|| secret.into()))
            .unwrap();
        assert_eq!(c.launch.store_secret, Some(Secret(secret.into())));
        let shown = format!(
            "{c:?} {} {:?}",
            serde_json::to_string(&c).unwrap(),
            c.table()
        );
        assert!(!shown.contains(secret), "{shown}");
        assert!(shown.contains("(set, hidden)"), "{shown}");
    }

    #[test]
    fn shared_settings_cover_every_threshold_and_low_precision_field() {
        // Every field of these groups decides something ranks must agree on; a new field must be
        // added to shared_settings (with its variable) or this fails.
        let c = Config::default();
        let v = serde_json::to_value(&c).unwrap();
        let names: Vec<&str> = c.shared_settings().iter().map(|s| s.0).collect();
        for group in ["thresholds", "low_precision"] {
            for key in v[group].as_object().unwrap().keys() {
                let path = format!("{group}.{key}");
                assert!(
                    names.contains(&path.as_str()),
                    "{path} missing from shared_settings"
                );
            }
        }
        for (name, var, _) in c.shared_settings() {
            assert!(
                VARS.iter().any(|v| v.name == var),
                "{name}: {var} is not a known variable"
            );
            let pointer = format!("/{}", name.replace('.', "/"));
            assert!(
                v.pointer(&pointer).is_some(),
                "{name} is not a field of the configuration"
            );
        }
    }
    use std::collections::HashMap;

    fn cfg(pairs: &[(&str, &str)]) -> Result<Config> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(move |k| m.get(k).cloned())
    }

    #[test]
    fn defaults() {
        let c = cfg(&[]).unwrap();
        assert_eq!(c.timeout, Duration::from_secs(300));
        assert!(!c.low_precision.enabled);
        assert_eq!(c.low_precision.block, 128);
        assert_eq!(c.host_slot_bytes, 4 << 20);
        assert_eq!(c.sources["FERROCOMM_TIMEOUT_S"].1, Source::Default);
    }

    #[test]
    fn rcclx_alias_turns_low_precision_on() {
        let c = cfg(&[("RCCL_LOW_PRECISION_ENABLE", "1")]).unwrap();
        assert!(c.low_precision.enabled);
        let c = cfg(&[
            ("FERROCOMM_LOW_PRECISION", "1"),
            ("FERROCOMM_LP_FORMAT", "int8"),
        ])
        .unwrap();
        assert!(c.low_precision.enabled);
        assert_eq!(c.low_precision.format, Format::Int8);
    }

    #[test]
    fn bad_values_name_the_variable() {
        let e = cfg(&[("FERROCOMM_LP_BLOCK", "100")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("FERROCOMM_LP_BLOCK"), "{e}");
        let e = cfg(&[("FERROCOMM_TIMEOUT_S", "soon")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("FERROCOMM_TIMEOUT_S"), "{e}");
        let e = cfg(&[("RANK", "4"), ("WORLD_SIZE", "4")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("RANK"), "{e}");
    }

    #[test]
    fn sizes_and_sources() {
        let c = cfg(&[
            ("FERROCOMM_ALLREDUCE_FLAT_MAX_BYTES", "256K"),
            ("FERROCOMM_TIMEOUT_S", "2.5"),
        ])
        .unwrap();
        assert_eq!(c.thresholds.flat_max, Some(256 << 10));
        assert_eq!(c.timeout, Duration::from_millis(2500));
        assert_eq!(
            c.sources["FERROCOMM_ALLREDUCE_FLAT_MAX_BYTES"].1,
            Source::Env
        );
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert!(parse_size("12Q").is_err());
    }

    #[test]
    fn hostile_numbers_are_bad_env_errors() {
        for (var, value) in [
            ("WORLD_SIZE", "1099511627776"),
            ("WORLD_SIZE", "4611686018427387904"),
            ("WORLD_SIZE", "18446744073709551616"),
            ("WORLD_SIZE", "0"),
            ("WORLD_SIZE", "-1"),
            ("RANK", "65536"),
            ("LOCAL_WORLD_SIZE", "65537"),
            ("LOCAL_RANK", "99999999999999999999"),
            ("OMPI_COMM_WORLD_SIZE", "1099511627776"),
            ("FERROCOMM_TIMEOUT_S", "1e-320"),
            ("FERROCOMM_TIMEOUT_S", "1e-10"),
            ("FERROCOMM_TIMEOUT_S", "5e-324"),
            ("FERROCOMM_TIMEOUT_S", "1e30"),
            ("FERROCOMM_HOST_SLOT_BYTES", "18446744073709551615"),
            ("FERROCOMM_LP_MIN_BYTES", "99999999999999999999999"),
        ] {
            let e = cfg(&[(var, value)]).unwrap_err();
            let want = var.replace("OMPI_COMM_WORLD_SIZE", "WORLD_SIZE");
            assert!(
                matches!(&e, Error::BadEnv { var: v, .. } if *v == want),
                "{var}={value}: {e}"
            );
        }
        let e = cfg(&[("LOCAL_RANK", "2"), ("LOCAL_WORLD_SIZE", "2")]).unwrap_err();
        assert!(e.to_string().contains("LOCAL_WORLD_SIZE=2"), "{e}");
        let c = cfg(&[("WORLD_SIZE", "65536"), ("RANK", "65535")]).unwrap();
        assert_eq!(c.launch.world_size, Some(MAX_WORLD_SIZE));
        assert_eq!(timeout_from_secs(1e-9), Ok(Duration::from_nanos(1)));
    }

    #[test]
    fn open_mpi_variables() {
        let c = cfg(&[("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "2")]).unwrap();
        assert_eq!(c.launch.rank, Some(1));
        assert_eq!(c.launch.world_size, Some(2));
    }

    #[test]
    fn docs_list_every_variable() {
        let doc = include_str!("../../../docs/config.md");
        for v in VARS {
            assert!(
                doc.contains(&format!("`{}`", v.name)),
                "docs/config.md lacks {}",
                v.name
            );
        }
    }

    #[test]
    fn rmsnorm_wide_rows_take_a_row_count_up_to_a_grid() {
        let rows = |v| {
            cfg(&[("FERROCOMM_RMSNORM_WIDE_MAX_ROWS", v)])
                .map(|c| c.thresholds.rmsnorm_wide_max_rows)
        };
        assert_eq!(cfg(&[]).unwrap().thresholds.rmsnorm_wide_max_rows, None);
        assert_eq!(rows("0").unwrap(), Some(0));
        assert_eq!(rows(" 65535 ").unwrap(), Some(MAX_WIDE_ROWS));
        for bad in ["65536", "-1", "many", "1e3", "18446744073709551616"] {
            let e = rows(bad).unwrap_err().to_string();
            assert!(e.contains("FERROCOMM_RMSNORM_WIDE_MAX_ROWS"), "{bad}: {e}");
        }
        // Every rank must agree: it is one of the settings communicator creation compares.
        let c = cfg(&[("FERROCOMM_RMSNORM_WIDE_MAX_ROWS", "16")]).unwrap();
        assert!(c
            .shared_settings()
            .iter()
            .any(|(_, var, v)| *var == "FERROCOMM_RMSNORM_WIDE_MAX_ROWS" && v == "16"));
    }

    #[test]
    fn nccl_watchdog_switch() {
        assert!(cfg(&[]).unwrap().nccl_watchdog);
        assert!(
            !cfg(&[("FERROCOMM_NCCL_WATCHDOG", "0")])
                .unwrap()
                .nccl_watchdog
        );
        let e = cfg(&[("FERROCOMM_NCCL_WATCHDOG", "sometimes")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("FERROCOMM_NCCL_WATCHDOG"), "{e}");
    }

    #[test]
    fn pdl_switch() {
        assert!(!cfg(&[]).unwrap().pdl);
        assert!(!cfg(&[("FERROCOMM_PDL", "0")]).unwrap().pdl);
        assert!(cfg(&[("FERROCOMM_PDL", "1")]).unwrap().pdl);
        let e = cfg(&[("FERROCOMM_PDL", "maybe")]).unwrap_err().to_string();
        assert!(e.contains("FERROCOMM_PDL"), "{e}");
    }
}
