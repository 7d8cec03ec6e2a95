//! The planner: how a call runs (its algorithm, and whether it goes low precision, with which
//! codec), decided from plain values (the call's shape, what the backend has, the
//! configuration). Every backend consults it; it imports no backend.

use std::fmt;

use crate::config::tuning::Tuning;
use crate::config::{Config, Thresholds};
use crate::error::{Error, Result};
use crate::quant::{Codec, Format};
pub use crate::types::{Algo, Collective};
use crate::types::{DataType, ReduceOp};

/// Per-call low-precision override.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LowPrecisionChoice {
    /// Follow the environment (`FERROCOMM_LOW_PRECISION` and the per-collective switches).
    #[default]
    Default,
    /// Full precision for this call.
    Off,
    /// Low precision in this format, whatever the environment says (still only for
    /// Sum/Avg on f32/f16/bf16).
    On(Format),
}

impl LowPrecisionChoice {
    /// A per-call hint as users spell it: `default`/`auto`/`env` (or empty), `off` (`0`,
    /// `false`, `no`, `none`), `on` (`1`, `true`, `yes`: the configured `format`), or a format
    /// name (`e4m3`, `e5m2`, `int8`).
    pub fn from_hint(hint: &str, format: Format) -> crate::error::Result<Self> {
        Ok(match hint.trim().to_ascii_lowercase().as_str() {
            "" | "default" | "auto" | "env" => LowPrecisionChoice::Default,
            "off" | "0" | "false" | "no" | "none" => LowPrecisionChoice::Off,
            "on" | "1" | "true" | "yes" => LowPrecisionChoice::On(format),
            f => LowPrecisionChoice::On(f.parse()?),
        })
    }
}

/// Which engine carries a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Engine {
    /// The host backend (shared memory between processes).
    Host,
    /// The cuda backend's direct access (kernels on IPC-mapped staging).
    Direct,
    /// NCCL.
    Nccl,
}

/// How one call runs, as the planner decided it: the bench's path column, `algo_for`'s callers
/// and `ferrocomm info` print it through its one [`fmt::Display`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Plan {
    /// Who carries the call: the host backend, direct access or NCCL.
    pub engine: Engine,
    /// The algorithm; for a low-precision call, the low-precision path's (flat or tree
    /// all-reduce, direct for the others).
    pub algo: Algo,
    /// How a flat all-reduce moves its data, where the backend has forms.
    pub form: Option<FlatForm>,
    /// The codec of a low-precision call; `None` for full precision.
    pub low_precision: Option<Codec>,
    /// How a full-precision staged collective of the cuda backend's direct access moves its
    /// parts ([`part_form`]); `None` elsewhere (the all-to-all-v picks per piece).
    pub parts: Option<PartForm>,
    /// How an all_reduce_rmsnorm runs ([`cuda_rmsnorm`], [`cuda_rmsnorm_plan`]); `None` for every
    /// other call.
    pub norm: Option<NormForm>,
    /// How an all-to-all-v by the cuda backend's direct access moves its parts ([`A2avForm`]);
    /// `None` elsewhere.
    pub a2av: Option<A2avForm>,
    /// How a low-precision call by the cuda backend's direct access cuts and moves its records
    /// ([`lp_form`], [`lp_a2av_form`]); `None` elsewhere (the fused call's one launch included).
    pub lp: Option<LpForm>,
}

/// How an all-to-all-v runs by the cuda backend's direct access ([`cuda_call_plan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum A2avForm {
    /// Two ranks, crossing parts up to the LL limit: one launch in LL lines, no barrier.
    Lines,
    /// Two ranks, larger crossing parts: one staged launch per piece of a staging slot.
    Pieces,
    /// Above two ranks: one launch that moves every pair's part in pieces of half a slot.
    Pairs,
    /// Counts in device memory: one launch that reads them there.
    DeviceCounts,
}

impl fmt::Display for A2avForm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            A2avForm::Lines => "lines",
            A2avForm::Pieces => "pieces",
            A2avForm::Pairs => "pairs",
            A2avForm::DeviceCounts => "device-counts",
        })
    }
}

/// One call as the planner weighs it: plain values every rank computes alike from its own
/// operands (`CallKind::plan_shape`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CallShape {
    /// The collective.
    pub coll: Collective,
    /// Its size as [`Plan`]'s callers count it (`CallKind::shape`).
    pub bytes_per_rank: usize,
    /// The element type.
    pub dtype: DataType,
    /// The reduction of a reducing collective; `Sum` for the others.
    pub op: ReduceOp,
    /// Every pointer is aligned to the element size (the low-precision kernels need it).
    pub aligned: bool,
    /// What the operands rule out, whatever the size.
    pub operands: Operands,
}

impl CallShape {
    /// A call of `coll` with `bytes_per_rank` of `dtype`: a Sum for the reductions, pointers
    /// aligned, plain operands (what the bench, `algo_for` and `ferrocomm info` plan).
    pub fn of(coll: Collective, bytes_per_rank: usize, dtype: DataType) -> CallShape {
        CallShape {
            coll,
            bytes_per_rank,
            dtype,
            op: ReduceOp::Sum,
            aligned: true,
            operands: Operands::Plain,
        }
    }
}

/// What a call's operands rule out for the cuda backend's direct access.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operands {
    /// Nothing.
    Plain,
    /// An all-to-all-v in place whose send counts differ from its receive counts: a part would
    /// overwrite data not yet sent (the direct-access kernels keep every part in its place).
    UnevenInPlace,
    /// A message to the rank itself (direct access moves messages between two ranks).
    ToSelf,
    /// An all-to-all-v whose counts are in device memory: direct access only (the kernel reads
    /// them there).
    DeviceCounts,
}

/// How a staged collective's parts move ([`part_form`]); [`PartKind::kernel`] names it in the
/// kernels' entry points (`fc_<collective>_<kernel>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PartKind {
    /// In LL lines: the flag beside the data, no barrier.
    Ll,
    /// Through the staging, with a barrier per block.
    Staged,
    /// Through the staging in rounds (a pipeline).
    Pipelined,
}

impl PartKind {
    /// `ll`, `st` or `rw`: the form in the kernels' entry points and the bench's path detail.
    pub fn kernel(self) -> &'static str {
        match self {
            PartKind::Ll => "ll",
            PartKind::Staged => "st",
            PartKind::Pipelined => "rw",
        }
    }
}

impl fmt::Display for PartKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kernel())
    }
}

/// The kernel form of a staged collective's parts and its rounds ([`part_form`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PartForm {
    /// LL lines, staged, or staged in rounds.
    pub form: PartKind,
    /// Rounds of a pipelined part; 1 otherwise.
    pub rounds: u32,
}

impl fmt::Display for Plan {
    /// `lp-` and the path for a low-precision call (`lp-flat`, `lp-tree`, `lp-direct`); else
    /// the algorithm, with the form where the name alone does not say it (`flat-ce`,
    /// `flat-ll128`).
    /// An all_reduce_rmsnorm prints its form: `fused-flat` or `fused-tree` for one launch
    /// (`lp-fused-flat`, `lp-fused-tree` with the rows as low-precision records), `local` for
    /// one rank, the all-reduce's own path and `+norm` for two (`flat+norm`, `lp-tree+norm`,
    /// `nccl+norm`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.norm {
            Some(form @ (NormForm::FusedFlat | NormForm::FusedTree)) => {
                let lp = if self.low_precision.is_some() {
                    "lp-"
                } else {
                    ""
                };
                return write!(f, "{lp}{form}");
            }
            Some(form @ NormForm::Local) => return write!(f, "{form}"),
            Some(NormForm::TwoLaunch) => {
                let all_reduce = Plan {
                    norm: None,
                    ..*self
                };
                return write!(f, "{all_reduce}+norm");
            }
            None => {}
        }
        if self.low_precision.is_some() {
            return write!(f, "lp-{}", self.algo);
        }
        match self.form {
            Some(form @ (FlatForm::CopyEngine | FlatForm::Ll128)) => {
                write!(f, "{}-{}", self.algo, form.kernel())
            }
            _ => write!(f, "{}", self.algo),
        }
    }
}

impl Plan {
    /// The forms the path does not name, for `FERROCOMM_DEBUG`: the parts of a staged
    /// collective (`parts ll`, `parts st`, `parts rw x4`), the all-to-all-v's form
    /// (`a2av pieces`), and how a low-precision call moves its records (`lp push, chunks of
    /// 4194304 (plain, the last plain), split`); empty where there are none.
    pub fn detail(&self) -> String {
        let mut d = Vec::new();
        if let Some(p) = self.parts {
            d.push(match p.rounds {
                1 => format!("parts {}", p.form),
                r => format!("parts {} x{r}", p.form),
            });
        }
        if let Some(a) = self.a2av {
            d.push(format!("a2av {a}"));
        }
        if let Some(l) = self.lp {
            let moves = match l.moves {
                LpMove::Push => "push",
                LpMove::Pull => "pull",
            };
            d.push(format!(
                "lp {moves}, chunks of {} ({}, the last {}){}",
                l.chunk,
                l.kernel,
                l.last_kernel,
                if l.split { ", split" } else { "" }
            ));
        }
        d.join(", ")
    }

    /// A full-precision plan of the cuda backend: NCCL's engine for [`Algo::Nccl`], direct
    /// access for every other algorithm.
    pub fn on_gpu(algo: Algo, form: Option<FlatForm>) -> Plan {
        Plan {
            engine: if algo == Algo::Nccl {
                Engine::Nccl
            } else {
                Engine::Direct
            },
            algo,
            form,
            low_precision: None,
            parts: None,
            norm: None,
            a2av: None,
            lp: None,
        }
    }
}

/// How a window put on the cuda backend moves its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PutEngine {
    /// `cuMemcpyAsync` into the peer's mapping: no SM busy, a fixed cost of its own.
    CopyEngine,
    /// A copy kernel on the caller's stream: the lower latency for small puts.
    Kernel,
}

impl fmt::Display for PutEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PutEngine::CopyEngine => "ce",
            PutEngine::Kernel => "kernel",
        })
    }
}

/// The smallest put the copy engine carries by default (`FERROCOMM_PUT_CE_MIN_BYTES`): not
/// tuned by a measurement yet (`ferrocomm bench put` measures both engines).
pub const PUT_CE_MIN_BYTES: usize = 256 << 10;

/// The engine of a window put of `bytes` under `t`: the copy engine from
/// `FERROCOMM_PUT_CE_MIN_BYTES` ([`PUT_CE_MIN_BYTES`] by default) on, a kernel below it.
pub fn put_engine(bytes: usize, t: &Thresholds) -> PutEngine {
    if bytes >= t.put_ce_min.unwrap_or(PUT_CE_MIN_BYTES) {
        PutEngine::CopyEngine
    } else {
        PutEngine::Kernel
    }
}

/// What a backend can do, so that selection never picks an algorithm it lacks.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    /// The barrier-free push one-shot all-reduce is available.
    pub push: bool,
    /// NCCL is available underneath.
    pub nccl: bool,
    /// Largest message (bytes per rank) that fits the direct-access staging in one piece;
    /// `None` when the backend chunks larger messages itself.
    pub staging_bytes: Option<usize>,
    /// Ranks span several hosts: direct access is never attempted.
    pub multi_host: bool,
}

/// The collectives whose direct access ends at a size limit ([`direct_max_setting`], the
/// tuning table's `direct_max`): all but the all-reduce (its own thresholds) and the point-to-point
/// calls.
pub const DIRECT_LIMITED: [Collective; 6] = [
    Collective::AllGather,
    Collective::ReduceScatter,
    Collective::AllToAll,
    Collective::AllToAllV,
    Collective::Broadcast,
    Collective::Reduce,
];

/// The setting that limits direct access for `coll` (bytes per rank; `None`: the tuning table's,
/// [`Tuning::direct_max`]) and the environment variable that sets it. The all-to-all and the
/// all-to-all-v share one, broadcast and reduce another, send and recv a third (two-rank
/// communicators only: see [`select`]).
pub fn direct_max_setting(t: &Thresholds, coll: Collective) -> (Option<usize>, &'static str) {
    match coll {
        Collective::AllGather => (t.all_gather_max, "FERROCOMM_ALLGATHER_MAX_BYTES"),
        Collective::ReduceScatter => (t.reduce_scatter_max, "FERROCOMM_REDUCESCATTER_MAX_BYTES"),
        Collective::AllToAll | Collective::AllToAllV => {
            (t.all_to_all_max, "FERROCOMM_ALLTOALL_MAX_BYTES")
        }
        Collective::Send | Collective::Recv => (t.p2p_max, "FERROCOMM_P2P_MAX_BYTES"),
        _ => (t.broadcast_max, "FERROCOMM_BROADCAST_MAX_BYTES"),
    }
}

/// Whether `coll` is a point-to-point call.
fn p2p(coll: Collective) -> bool {
    matches!(coll, Collective::Send | Collective::Recv)
}

/// Whether no count of an all-to-all-v of `world` ranks is seen by every rank (each sees its own
/// row and column of the count matrix): above two ranks. Its choice can then take no size.
pub fn a2av_without_agreed_size(world: usize) -> bool {
    world > 2
}

/// Chooses the algorithm for one collective call.
///
/// `requested` is the per-call choice (or the `FERROCOMM_ALGO` default); an explicit choice
/// the backend cannot do is an error rather than a silent substitute.
pub fn select(
    coll: Collective,
    bytes_per_rank: usize,
    world: usize,
    dtype: DataType,
    requested: Algo,
    caps: &Caps,
    cfg: &Config,
) -> Result<Algo> {
    let _ = dtype;
    let requested = if requested == Algo::Auto {
        cfg.algo
    } else {
        requested
    };
    let fits = |n: usize| caps.staging_bytes.is_none_or(|s| n <= s);
    if requested != Algo::Auto {
        let ok = match requested {
            Algo::Nccl => caps.nccl,
            Algo::Push => caps.push && coll == Collective::AllReduce && fits(bytes_per_rank),
            Algo::Flat | Algo::Tree => {
                matches!(coll, Collective::AllReduce) && !caps.multi_host && fits(bytes_per_rank)
            }
            Algo::Direct => {
                coll != Collective::AllReduce
                    && !caps.multi_host
                    && fits(bytes_per_rank)
                    && (!p2p(coll) || world == 2 || !caps.nccl)
            }
            Algo::Auto => true,
        };
        if ok {
            return Ok(requested);
        }
        // A forced algorithm from the environment that does not apply to this collective falls
        // through to automatic choice; a per-call request is honoured or refused.
        if requested != cfg.algo {
            return Err(Error::InvalidArgument(format!(
                "algorithm {requested} cannot run {} of {bytes_per_rank} bytes per rank on this backend",
                coll.name()
            )));
        }
    }
    if caps.multi_host && caps.nccl {
        // DDA is never attempted across hosts.
        return Ok(Algo::Nccl);
    }
    let t = &cfg.thresholds;
    match coll {
        Collective::AllReduce => {
            let (push_d, flat_d, tree_d) = cfg.tuning.all_reduce(world);
            let push_max = t.push_max.unwrap_or(push_d);
            let flat_max = t.flat_max.unwrap_or(flat_d);
            let tree_max = t.tree_max.unwrap_or(tree_d);
            if caps.push && bytes_per_rank <= push_max && fits(bytes_per_rank) {
                Ok(Algo::Push)
            } else if bytes_per_rank <= flat_max && fits(bytes_per_rank) {
                Ok(Algo::Flat)
            } else if caps.nccl && (bytes_per_rank > tree_max || !fits(bytes_per_rank)) {
                Ok(Algo::Nccl)
            } else {
                Ok(Algo::Tree)
            }
        }
        Collective::Barrier => Ok(Algo::Direct),
        // Point-to-point goes direct at two ranks only, where both ranks take part in every
        // message (a broadcast rooted at its sender); NCCL's otherwise (the host backend's own
        // path where there is no NCCL).
        Collective::Send | Collective::Recv if world != 2 => {
            Ok(if caps.nccl { Algo::Nccl } else { Algo::Direct })
        }
        // Above two ranks the all-to-all-v runs pair by pair and its choice can take no size (no
        // count is seen by every rank); the pair-by-pair kernel lost to NCCL's below 4 MB and
        // won above (docs/tuning.md, "Where the built-in limits come from"): without a size to go by, NCCL (never slower than NCCL), direct
        // access when forced or without NCCL.
        Collective::AllToAllV if a2av_without_agreed_size(world) => {
            Ok(if caps.nccl { Algo::Nccl } else { Algo::Direct })
        }
        other => {
            let limit = direct_max_setting(t, other)
                .0
                .or_else(|| cfg.tuning.direct_max(other, world));
            let above = limit.is_some_and(|l| bytes_per_rank > l);
            if caps.nccl && (above || !fits(bytes_per_rank)) {
                Ok(Algo::Nccl)
            } else {
                Ok(Algo::Direct)
            }
        }
    }
}

/// Whether one call goes low precision, and with which codec: the rule every backend follows.
///
/// A per-call `On(format)` forces it and `Off` forbids it; `Default` follows the global switch,
/// the per-collective switch and the minimum size (`FERROCOMM_LP_MIN_BYTES`, else
/// `default_min_bytes`, the backend's tuned value). Whatever was asked, only Sum/Avg reductions
/// (and the non-reducing all-gather / all-to-all, `op = None`) of f32/f16/bf16 qualify.
pub fn low_precision(
    coll: Collective,
    dtype: DataType,
    op: Option<ReduceOp>,
    bytes_per_rank: usize,
    choice: LowPrecisionChoice,
    cfg: &Config,
    default_min_bytes: usize,
) -> Result<Option<Codec>> {
    let lp = &cfg.low_precision;
    let format = match choice {
        LowPrecisionChoice::Off => return Ok(None),
        LowPrecisionChoice::On(f) => f,
        LowPrecisionChoice::Default => {
            let switch = match coll {
                Collective::AllReduce => lp.all_reduce,
                Collective::AllGather => lp.all_gather,
                Collective::ReduceScatter => lp.reduce_scatter,
                Collective::AllToAll | Collective::AllToAllV => lp.all_to_all,
                _ => false,
            };
            if !lp.enabled || !switch || bytes_per_rank < lp.min_bytes.unwrap_or(default_min_bytes)
            {
                return Ok(None);
            }
            lp.format
        }
    };
    let lp_coll = matches!(
        coll,
        Collective::AllReduce
            | Collective::AllGather
            | Collective::ReduceScatter
            | Collective::AllToAll
            | Collective::AllToAllV
    );
    if !lp_coll
        || !matches!(dtype, DataType::F32 | DataType::F16 | DataType::BF16)
        || op.is_some_and(|o| !matches!(o, ReduceOp::Sum | ReduceOp::Avg))
    {
        return Ok(None);
    }
    Codec::new(format, lp.block).map(Some)
}

// ---------------------------------------------------------------------------------------------
// The host backend: every call runs in shared memory.

/// What the host backend has: no push kernel, no NCCL, no staging limit (it chunks).
pub const HOST_CAPS: Caps = Caps {
    push: false,
    nccl: false,
    staging_bytes: None,
    multi_host: false,
};

/// The host backend's algorithm: the all-reduce flat or tree ([`select`]'s push is flat
/// there), every other collective direct.
pub fn host_algo(
    coll: Collective,
    bytes_per_rank: usize,
    world: usize,
    dtype: DataType,
    requested: Algo,
    cfg: &Config,
) -> Result<Algo> {
    let a = select(
        coll,
        bytes_per_rank,
        world,
        dtype,
        requested,
        &HOST_CAPS,
        cfg,
    )?;
    Ok(match (coll, a) {
        (Collective::AllReduce, Algo::Tree) => Algo::Tree,
        (Collective::AllReduce, _) => Algo::Flat,
        _ => Algo::Direct,
    })
}

/// The host backend's codec for one call: [`low_precision`] with no size floor of its own
/// (low precision whenever asked); `op` counts for the reducing collectives only.
pub fn host_low_precision(
    coll: Collective,
    dtype: DataType,
    op: ReduceOp,
    bytes_per_rank: usize,
    choice: LowPrecisionChoice,
    cfg: &Config,
) -> Result<Option<Codec>> {
    let op = matches!(
        coll,
        Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce
    )
    .then_some(op);
    low_precision(coll, dtype, op, bytes_per_rank, choice, cfg, 0)
}

/// The plan of one host-backend call of `bytes_per_rank` (a Sum for the reductions): what
/// `ferrocomm info` prints on a machine without a GPU ([`host_call_plan`]).
pub fn host_plan(
    coll: Collective,
    bytes_per_rank: usize,
    world: usize,
    dtype: DataType,
    requested: Algo,
    choice: LowPrecisionChoice,
    cfg: &Config,
) -> Result<Plan> {
    let shape = CallShape::of(coll, bytes_per_rank, dtype);
    host_call_plan(&shape, world, requested, choice, cfg)
}

/// The size low precision weighs for a call of `bytes_per_rank` (as [`Plan`]'s callers count
/// it) at `world` ranks: one rank's part (the all-to-all's output and the all-to-all-v's
/// `world` × largest crossing part over the world), the message itself for the others.
fn lp_bytes(coll: Collective, bytes_per_rank: usize, world: usize) -> usize {
    match coll {
        Collective::AllToAll | Collective::AllToAllV => bytes_per_rank / world.max(1),
        _ => bytes_per_rank,
    }
}

/// The plan of one host-backend call: what the host backend runs. Its algorithm
/// ([`host_algo`]) and its codec ([`host_low_precision`], on one rank's part).
pub fn host_call_plan(
    shape: &CallShape,
    world: usize,
    requested: Algo,
    choice: LowPrecisionChoice,
    cfg: &Config,
) -> Result<Plan> {
    let CallShape {
        coll,
        bytes_per_rank: bytes,
        dtype,
        op,
        ..
    } = *shape;
    let lp = lp_bytes(coll, bytes, world);
    let codec = host_low_precision(coll, dtype, op, lp, choice, cfg)?;
    Ok(Plan {
        engine: Engine::Host,
        algo: host_algo(coll, bytes, world, dtype, requested, cfg)?,
        form: None,
        low_precision: codec,
        parts: None,
        norm: None,
        a2av: None,
        lp: None,
    })
}

/// The plan of one call on the plain NCCL backend: NCCL for everything (an explicit request for
/// another algorithm is refused by [`select`]), full precision.
pub fn nccl_plan(
    coll: Collective,
    bytes_per_rank: usize,
    world: usize,
    dtype: DataType,
    requested: Algo,
    cfg: &Config,
) -> Result<Plan> {
    let caps = Caps {
        push: false,
        nccl: true,
        staging_bytes: Some(0),
        multi_host: true,
    };
    Ok(Plan {
        engine: Engine::Nccl,
        algo: select(coll, bytes_per_rank, world, dtype, requested, &caps, cfg)?,
        form: None,
        low_precision: None,
        parts: None,
        norm: None,
        a2av: None,
        lp: None,
    })
}

// ---------------------------------------------------------------------------------------------
// The cuda backend: what direct access has, and how each call runs there.

/// Rounds of a staged collective's pipeline (`FC_MAX_ROUNDS` of the kernels): barrier words per
/// block, sender and parity.
pub const COLL_MAX_ROUNDS: usize = 8;

/// What the cuda backend's direct access has on one communicator (its staging layout and its
/// links), as plain values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DdaCaps {
    /// Bytes per rank of one staging parity (`FERROCOMM_CUDA_STAGING_BYTES`).
    pub staging_bytes: usize,
    /// Largest push all-reduce, bytes per rank.
    pub push_cap: usize,
    /// The copy engines' region, bytes per rank (0: off).
    pub ce_bytes: usize,
    /// The smallest flat all-reduce the copy engines take
    /// (`FERROCOMM_ALLREDUCE_CE_MIN_BYTES`); `None` where they are not set up.
    pub ce_min: Option<usize>,
    /// Largest flat all-reduce in LL128 lines, bytes per rank (0: off).
    pub ll128_cap: usize,
    /// Every pair of ranks shares a GPU or is joined by NVLink (NVML's verdict, the same on
    /// every rank): LL128 lines cannot tear.
    pub ll128_links: bool,
    /// Largest part the collectives send in LL lines (`FERROCOMM_LL_MAX_BYTES`).
    pub ll_max: usize,
    /// The two-rank low-precision all-to-all-v fits the staging with the configured block (its
    /// tiles: a capacity check of the executor; the format leaves the record sizes alike).
    pub a2av_lp: bool,
}

/// What the cuda backend has for a call, as plain values.
#[derive(Debug, Clone, Copy)]
pub struct CudaCaps<'a> {
    /// The number of ranks.
    pub world: usize,
    /// Direct access; `None` when it is off, `no_dda` says why.
    pub dda: Option<DdaCaps>,
    /// Why direct access is off (read only when `dda` is `None`).
    pub no_dda: &'a str,
    /// NCCL underneath; `no_nccl` says why not where it is absent.
    pub nccl: bool,
    /// Why NCCL is absent (read only when `nccl` is false).
    pub no_nccl: &'a str,
    /// Ranks span several hosts.
    pub multi_host: bool,
    /// The element types the direct-access reduction kernels are built for.
    pub kernel_dtypes: &'a [DataType],
}

impl CudaCaps<'_> {
    /// The capabilities [`select`] weighs.
    pub fn caps(&self) -> Caps {
        Caps {
            push: self.dda.is_some(),
            nccl: self.nccl,
            staging_bytes: Some(self.dda.as_ref().map_or(0, |d| d.staging_bytes)),
            multi_host: self.multi_host || self.dda.is_none(),
        }
    }

    /// Whether the direct-access reduction kernels handle `dtype`.
    pub fn kernels_take(&self, dtype: DataType) -> bool {
        self.kernel_dtypes.contains(&dtype)
    }
}

/// How a flat all-reduce moves its data ([`flat_form`]); `kernel` names its entry points
/// (`fc_<kernel>_<op>`) and the bench's path detail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FlatForm {
    /// Every rank pulls its peers' inputs from their staging (one-shot).
    Pull,
    /// Streamed through chunk slots by push-write, for messages larger than the staging.
    Stream,
    /// The copy engines move the data into the peer's memory; the SMs only reduce (two ranks).
    CopyEngine,
    /// In 128-byte lines with the flag inside, no barrier (NCCL's LL128; NVLink between every pair).
    Ll128,
}

impl FlatForm {
    /// The name in its kernels' entry points (`fc_<kernel>_<op>`) and the bench's path detail.
    pub fn kernel(self) -> &'static str {
        match self {
            FlatForm::Pull => "flat",
            FlatForm::Stream => "stream",
            FlatForm::CopyEngine => "ce",
            FlatForm::Ll128 => "ll128",
        }
    }
}

/// Whether the copy engines carry a flat all-reduce of `bytes` per rank (`ce_bytes`: their
/// region, 0 when off) and `FERROCOMM_ALLREDUCE_CE_MIN_BYTES` = `min_bytes`: from that size up
/// to the region's, never an empty one.
pub fn ce_takes(ce_bytes: usize, min_bytes: usize, bytes: usize) -> bool {
    bytes > 0 && bytes >= min_bytes && bytes <= ce_bytes
}

/// Whether a flat all-reduce of `bytes` per rank moves in LL128 lines: on (`ll128_cap` > 0)
/// and at most the cap, which is at most the staging (a streamed message never does).
pub fn ll128_takes(ll128_cap: usize, bytes: usize) -> bool {
    bytes > 0 && bytes <= ll128_cap
}

/// How a flat all-reduce of `bytes` per rank moves its data under `dda` (the one place that
/// decides):
/// by the copy engines from `FERROCOMM_ALLREDUCE_CE_MIN_BYTES` up to their region, else in
/// LL128 lines up to `FERROCOMM_ALLREDUCE_LL128_MAX_BYTES` where every link is NVLink, else
/// pulled from the staging when it fits (faster at every size measured there), else
/// streamed through chunk slots by push-write. (Neither region is larger than the staging:
/// a streamed message is never theirs.)
pub fn flat_form(dda: &DdaCaps, bytes: usize) -> FlatForm {
    if dda
        .ce_min
        .is_some_and(|min| ce_takes(dda.ce_bytes, min, bytes))
    {
        FlatForm::CopyEngine
    } else if dda.ll128_links && ll128_takes(dda.ll128_cap, bytes) {
        FlatForm::Ll128
    } else if bytes > dda.staging_bytes {
        FlatForm::Stream
    } else {
        FlatForm::Pull
    }
}

/// `n` rounded up to a whole number of 16-byte vectors.
fn round16(n: usize) -> usize {
    n.div_ceil(16) * 16
}

/// Staging bytes one staged call needs in each receiver (one parity), or `None` when the
/// collective has no fixed layout (all-to-all-v: slots of [`crate::cuda::collectives::a2av_slot_bytes`]).
pub fn staged_need(coll: Collective, part_bytes: usize, world: usize) -> Option<usize> {
    match coll {
        Collective::AllGather
        | Collective::ReduceScatter
        | Collective::AllToAll
        | Collective::Reduce => Some(world * round16(part_bytes)),
        Collective::Broadcast | Collective::Send | Collective::Recv => Some(round16(part_bytes)),
        _ => None,
    }
}

/// Whether a call with parts of `part_bytes` uses LL lines (`ll_max`: the largest LL part,
/// `StagingLayout::ll_max`), for every collective with LL kernels: the data movers, and the
/// reductions since their LL kernels wait for the peer's lines only (as the push all-reduce).
/// (Earlier LL reductions that waited for a hello first lost at every size: docs/tuning.md, "Where the built-in limits come from".)
fn use_ll(part_bytes: usize, ll_max: usize) -> bool {
    part_bytes <= ll_max
}

/// Whether an all-to-all-v at two ranks moves its parts in one LL launch rather than in staged
/// pieces: its largest crossing part (`largest_crossing_bytes`, the larger of the two counts
/// the pair exchanges, which both ranks know) fits an LL part (`ll_max`, `use_ll`).
pub fn a2av_takes_ll(largest_crossing_bytes: usize, ll_max: usize) -> bool {
    use_ll(largest_crossing_bytes, ll_max)
}

/// The kernel form of a call of `kernel` with parts of `part_bytes` (`ll_max`: the largest LL
/// part) and its rounds: LL lines, staged, or pipelined staged (parts from
/// the table's smallest pipelined part of `kernel`, in rounds of its round size, at most
/// [`COLL_MAX_ROUNDS`]; the figures are in the table, `tuning.json`).
pub fn part_form(
    tuning: &Tuning,
    kernel: &str,
    part_bytes: usize,
    ll_max: usize,
) -> (PartKind, u32) {
    if use_ll(part_bytes, ll_max) {
        (PartKind::Ll, 1)
    } else if tuning.pipe_min(kernel).is_some_and(|min| part_bytes >= min) {
        (
            PartKind::Pipelined,
            st_rounds(part_bytes, tuning.pipe_round_bytes),
        )
    } else {
        (PartKind::Staged, 1)
    }
}

/// Rounds of a pipelined staged call with parts of `part_bytes`: one per `round_bytes` (rounded
/// up), at most `COLL_MAX_ROUNDS`. Every rank computes the same from the part size.
pub fn st_rounds(part_bytes: usize, round_bytes: usize) -> u32 {
    part_bytes
        .div_ceil(round_bytes.max(1))
        .clamp(1, COLL_MAX_ROUNDS) as u32
}

/// The all-reduce algorithm of the cuda backend: direct access (push, flat, tree) where
/// it can take the call, else NCCL; an explicit request that cannot run is an error.
pub fn cuda_all_reduce(
    cuda: &CudaCaps<'_>,
    cfg: &Config,
    bytes: usize,
    dtype: DataType,
    op: ReduceOp,
    requested: Algo,
) -> Result<Algo> {
    let dda_ok = cuda.dda.is_some()
        && cuda.kernels_take(dtype)
        && !matches!(op, ReduceOp::BitAnd | ReduceOp::BitOr | ReduceOp::BitXor);
    if !dda_ok {
        if matches!(requested, Algo::Push | Algo::Flat | Algo::Tree) {
            return Err(Error::Unsupported {
                collective: "all_reduce",
                backend: "cuda",
                what: format!(
                    "{requested} for {dtype} {op}: {}",
                    if cuda.dda.is_none() {
                        cuda.no_dda.to_string()
                    } else {
                        "the direct-access kernels do not handle this dtype/op".into()
                    }
                ),
            });
        }
        if !cuda.nccl {
            return Err(Error::Unsupported {
                collective: "all_reduce",
                backend: "cuda",
                what: format!("{dtype} {op} without NCCL ({})", cuda.no_nccl),
            });
        }
        return Ok(Algo::Nccl);
    }
    // Flat streams any size through its chunk slots; only tree is bounded by the staging.
    let staging = cuda.dda.as_ref().map_or(0, |d| d.staging_bytes);
    let caps = Caps {
        staging_bytes: None,
        ..cuda.caps()
    };
    let mut a = select(
        Collective::AllReduce,
        bytes,
        cuda.world,
        dtype,
        requested,
        &caps,
        cfg,
    )?;
    if a == Algo::Tree && bytes > staging {
        if requested == Algo::Tree {
            return Err(Error::InvalidArgument(format!(
                "all_reduce: tree takes at most {staging} bytes per rank (the staging size), got {bytes}"
            )));
        }
        a = if cuda.nccl { Algo::Nccl } else { Algo::Flat };
    }
    let push_cap = cuda.dda.as_ref().map_or(0, |d| d.push_cap);
    if a == Algo::Push && bytes > push_cap {
        if requested == Algo::Push {
            return Err(Error::InvalidArgument(format!(
                "all_reduce: push takes at most {push_cap} bytes per rank, got {bytes}"
            )));
        }
        a = Algo::Flat;
    }
    if matches!(a, Algo::Direct | Algo::Auto) {
        a = Algo::Flat;
    }
    Ok(a)
}

/// How the cuda backend runs one all_reduce_rmsnorm ([`cuda_rmsnorm`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NormForm {
    /// The backend's all-reduce (its own [`cuda_all_reduce`] plan, low precision included),
    /// then the norm kernel: two launches.
    TwoLaunch,
    /// One launch, one-shot: every rank reduces every row, then adds and normalizes it.
    FusedFlat,
    /// One launch, two-shot: each rank reduces, adds and normalizes its stripe of rows, then
    /// every rank gathers the others' normalized rows.
    FusedTree,
    /// A communicator of one rank: its x is the sum, so one launch of the norm kernel reads it
    /// directly (no staging copy, no barrier).
    Local,
}

impl fmt::Display for NormForm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NormForm::TwoLaunch => "all-reduce+norm",
            NormForm::FusedFlat => "fused-flat",
            NormForm::FusedTree => "fused-tree",
            NormForm::Local => "local",
        })
    }
}

/// How the cuda backend runs an all_reduce_rmsnorm of `bytes` (x, per rank) of `dtype`: one
/// launch where `FERROCOMM_RMSNORM_FUSED` is on, direct access takes the dtype and the request
/// is not push or NCCL: a per-call flat or tree asks for that form (two launches when the
/// staging cannot hold it), auto takes the one-shot up to `FERROCOMM_RMSNORM_FLAT_MAX_BYTES`
/// (default: the all-reduce's flat threshold) and the two-shot above while the staging holds it
/// (twice the message in full precision: x's rows and the published residual rows; once as
/// records). With low precision on the wire (`low_precision`) the one-launch forms carry the
/// rows as the codec's records where `lp_rows` says a row is whole blocks the kernel takes
/// ([`rows_take_codec`]); otherwise the two launches. A communicator of one rank takes the
/// local form (the norm kernel on x itself) for every request but NCCL's, with or without
/// direct access, where the kernels take the dtype and nothing goes low precision. Everything
/// else: the two launches. Every rank decides alike (the settings are shared, the sizes agreed).
pub fn cuda_rmsnorm(
    cuda: &CudaCaps<'_>,
    cfg: &Config,
    bytes: usize,
    dtype: DataType,
    requested: Algo,
    low_precision: bool,
    lp_rows: bool,
) -> NormForm {
    let t = &cfg.thresholds;
    let requested = if requested == Algo::Auto {
        cfg.algo
    } else {
        requested
    };
    let takes = t.rmsnorm_fused
        && cuda.kernels_take(dtype)
        && matches!(dtype, DataType::F32 | DataType::F16 | DataType::BF16);
    if cuda.world == 1 && takes && !low_precision && requested != Algo::Nccl {
        return NormForm::Local;
    }
    let Some(dda) = cuda.dda.as_ref() else {
        return NormForm::TwoLaunch;
    };
    if !takes
        || (low_precision && !lp_rows)
        || cuda.multi_host
        || matches!(requested, Algo::Push | Algo::Nccl | Algo::Direct)
    {
        return NormForm::TwoLaunch;
    }
    let flat_fits = bytes <= dda.staging_bytes;
    let tree_fits = if low_precision {
        flat_fits
    } else {
        bytes.checked_mul(2).is_some_and(|b| b <= dda.staging_bytes)
    };
    // A forced form the staging cannot hold takes the two launches, whose all-reduce honours
    // the same request (or refuses it) as a plain all-reduce does.
    match requested {
        Algo::Flat if flat_fits => NormForm::FusedFlat,
        Algo::Tree if tree_fits => NormForm::FusedTree,
        Algo::Flat | Algo::Tree => NormForm::TwoLaunch,
        _ => {
            let flat_max = t
                .rmsnorm_flat_max
                .or(t.flat_max)
                .unwrap_or(cfg.tuning.all_reduce(cuda.world).1);
            if bytes <= flat_max && flat_fits {
                NormForm::FusedFlat
            } else if tree_fits {
                NormForm::FusedTree
            } else {
                NormForm::TwoLaunch
            }
        }
    }
}

/// Whether rows of `hidden` elements of `dtype` can cross as `codec`'s block-scaled records
/// inside the one-launch kernels: a row is a whole number of blocks, and a block is at least one
/// 16-byte vector and at most a warp of them (its absmax is one segmented shuffle).
pub fn rows_take_codec(hidden: usize, dtype: DataType, codec: &Codec) -> bool {
    let per_vector = 16 / dtype.size().max(1);
    codec.block % per_vector == 0 && codec.block / per_vector <= 32 && hidden % codec.block == 0
}

/// The plan of one all_reduce_rmsnorm of `shape` on the cuda backend, pointers aligned, with its
/// [`NormForm`] in `norm` ([`cuda_rmsnorm`]; low precision weighed as the call's all-reduce
/// weighs it, [`low_precision`] with the cuda size floor, for `choice`): one launch is the fused
/// kernel by direct access (flat or tree), with the codec of its records when the rows cross in
/// low precision; the local form of one rank; or two launches, which carry the all-reduce's
/// own [`cuda_all_reduce_plan`]. The executor runs this plan as it is.
pub fn cuda_rmsnorm_plan(
    cuda: &CudaCaps<'_>,
    cfg: &Config,
    shape: &crate::rmsnorm::Shape,
    requested: Algo,
    choice: LowPrecisionChoice,
) -> Result<Plan> {
    let (bytes, dtype) = (shape.x_bytes(), shape.dtype);
    let codec = low_precision(
        Collective::AllReduce,
        dtype,
        Some(ReduceOp::Sum),
        bytes,
        choice,
        cfg,
        cfg.tuning.cuda_lp_min_bytes,
    )?;
    let lp_rows = codec
        .as_ref()
        .is_some_and(|c| rows_take_codec(shape.hidden, dtype, c));
    let norm = cuda_rmsnorm(cuda, cfg, bytes, dtype, requested, codec.is_some(), lp_rows);
    let fused = |algo| Plan {
        low_precision: codec,
        ..Plan::on_gpu(algo, None)
    };
    let plan = match norm {
        NormForm::FusedFlat => fused(Algo::Flat),
        NormForm::FusedTree => fused(Algo::Tree),
        NormForm::Local => Plan::on_gpu(Algo::Direct, None),
        NormForm::TwoLaunch => {
            cuda_all_reduce_plan(cuda, cfg, bytes, dtype, ReduceOp::Sum, requested, choice)?
        }
    };
    Ok(Plan {
        norm: Some(norm),
        ..plan
    })
}

/// The plan of one all-reduce of `bytes` per rank on the cuda backend (pointers aligned to the
/// element size, which the backend requires): low precision by direct access when
/// [`low_precision`] says so (with the cuda size floor, the table's `cuda_lp_min_bytes`) on the path of
/// [`lp_all_reduce`]; else [`cuda_all_reduce`]'s algorithm, a flat one with its
/// [`flat_form`]. The executor runs this plan as it is.
pub fn cuda_all_reduce_plan(
    cuda: &CudaCaps<'_>,
    cfg: &Config,
    bytes: usize,
    dtype: DataType,
    op: ReduceOp,
    requested: Algo,
    choice: LowPrecisionChoice,
) -> Result<Plan> {
    if cuda.dda.is_some() {
        let coll = Collective::AllReduce;
        let lp_min = cfg.tuning.cuda_lp_min_bytes;
        let lp = low_precision(coll, dtype, Some(op), bytes, choice, cfg, lp_min)?;
        if let (Some(codec), Some(d)) = (lp, &cuda.dda) {
            let algo = lp_all_reduce(requested, cfg.algo, cuda.world);
            let kind = if algo == Algo::Tree {
                LpKind::Tree
            } else {
                LpKind::Flat
            };
            let part = bytes / dtype.size().max(1);
            let form = lp_form(kind, part, dtype.size(), cuda.world, &codec, d, &cfg.tuning)?;
            return Ok(Plan {
                engine: Engine::Direct,
                algo,
                form: None,
                low_precision: Some(codec),
                parts: None,
                norm: None,
                a2av: None,
                lp: Some(form),
            });
        }
    }
    let algo = cuda_all_reduce(cuda, cfg, bytes, dtype, op, requested)?;
    let form = match (&cuda.dda, algo) {
        (Some(d), Algo::Flat) => Some(flat_form(d, bytes)),
        _ => None,
    };
    Ok(Plan::on_gpu(algo, form))
}

/// The plan of one call of `coll` with `bytes_per_rank` (as [`Plan`]'s callers count it: the
/// output of an all-reduce, one rank's part of an all-gather or reduce-scatter, the whole
/// output of an all-to-all, `world` × the largest crossing part of an all-to-all-v) on the
/// cuda backend, a Sum for the reductions, pointers aligned: [`cuda_all_reduce_plan`] for the
/// all-reduce; low precision by direct access where [`low_precision`] says so (the all-to-all-v
/// at two ranks, where its tiles fit); else [`cuda_collective`]'s algorithm (the barrier a
/// push by direct access, else NCCL's; point-to-point above two ranks NCCL's), a staged
/// collective by direct access with its [`PartForm`]. `op` counts for the reductions.
#[allow(clippy::too_many_arguments)]
pub fn cuda_plan(
    cuda: &CudaCaps<'_>,
    cfg: &Config,
    coll: Collective,
    bytes_per_rank: usize,
    dtype: DataType,
    op: ReduceOp,
    requested: Algo,
    choice: LowPrecisionChoice,
) -> Result<Plan> {
    let world = cuda.world;
    if coll == Collective::AllReduce {
        return cuda_all_reduce_plan(cuda, cfg, bytes_per_rank, dtype, op, requested, choice);
    }
    // The size low precision weighs: one rank's part.
    let lp_shape = match coll {
        Collective::ReduceScatter => Some((Some(op), bytes_per_rank)),
        Collective::AllGather => Some((None, bytes_per_rank)),
        Collective::AllToAll => Some((None, bytes_per_rank / world)),
        Collective::AllToAllV if world == 2 => Some((None, bytes_per_rank / world)),
        _ => None,
    };
    if let (Some(d), Some((op, bytes))) = (&cuda.dda, lp_shape) {
        let lp_min = cfg.tuning.cuda_lp_min_bytes;
        let lp = low_precision(coll, dtype, op, bytes, choice, cfg, lp_min)?;
        if let Some(codec) = lp.filter(|_| coll != Collective::AllToAllV || d.a2av_lp) {
            // One rank's part, in elements.
            let (es, part) = (dtype.size().max(1), bytes / dtype.size().max(1));
            let form = match coll {
                Collective::AllGather => LpKind::AllGather,
                Collective::ReduceScatter => LpKind::ReduceScatter,
                Collective::AllToAll => LpKind::AllToAll,
                _ => LpKind::AllToAllV,
            };
            let form = if form == LpKind::AllToAllV {
                lp_a2av_form(part, &codec, d.staging_bytes)
            } else {
                lp_form(form, part, es, world, &codec, d, &cfg.tuning)?
            };
            return Ok(Plan {
                engine: Engine::Direct,
                algo: Algo::Direct,
                form: None,
                low_precision: Some(codec),
                parts: None,
                norm: None,
                a2av: None,
                lp: Some(form),
            });
        }
    }
    if coll == Collective::Barrier && cuda.dda.is_some() {
        // Direct access meets every rank in a one-word push all-reduce.
        return Ok(Plan::on_gpu(Algo::Push, None));
    }
    let p2p = matches!(coll, Collective::Send | Collective::Recv);
    if coll == Collective::Barrier || p2p && world != 2 {
        if !cuda.nccl {
            return Err(Error::Unsupported {
                collective: coll.name(),
                backend: "cuda",
                what: format!("{} without NCCL ({})", coll.name(), cuda.no_nccl),
            });
        }
        return Ok(Plan::on_gpu(Algo::Nccl, None));
    }
    // (Above two ranks the all-to-all-v's choice takes no size: select's own rule.)
    let part = match coll {
        Collective::AllToAll | Collective::AllToAllV => bytes_per_rank / world,
        _ => bytes_per_rank,
    };
    let op = matches!(coll, Collective::Reduce | Collective::ReduceScatter).then_some(op);
    let algo = cuda_collective(cuda, cfg, coll, bytes_per_rank, part, dtype, op, requested)?;
    let parts = match (&cuda.dda, algo, staged_kernel(coll)) {
        (Some(d), Algo::Direct, Some(kernel)) => {
            let (form, rounds) = part_form(&cfg.tuning, kernel, part, d.ll_max);
            Some(PartForm { form, rounds })
        }
        _ => None,
    };
    let a2av = match (&cuda.dda, algo, coll) {
        (Some(d), Algo::Direct, Collective::AllToAllV) => Some(a2av_form(world, part, d.ll_max)),
        _ => None,
    };
    Ok(Plan {
        parts,
        a2av,
        ..Plan::on_gpu(algo, None)
    })
}

/// How an all-to-all-v of `world` ranks whose largest crossing part is `crossing_bytes` runs by
/// direct access: pair by pair above two ranks (no count is seen by every rank), else in LL
/// lines where that part fits them ([`a2av_takes_ll`]), else in staged pieces.
pub fn a2av_form(world: usize, crossing_bytes: usize, ll_max: usize) -> A2avForm {
    if a2av_without_agreed_size(world) {
        A2avForm::Pairs
    } else if a2av_takes_ll(crossing_bytes, ll_max) {
        A2avForm::Lines
    } else {
        A2avForm::Pieces
    }
}

/// The plan of one call of `shape` on the cuda backend, `requested` per call and `choice` of
/// low precision: [`cuda_plan`] where the operands allow direct access (full precision where
/// the pointers are not aligned to the element size); what the operands rule out
/// ([`Operands`]) goes to NCCL, or is refused where direct access was asked for. A message
/// between ranks of a communicator of other than two goes to NCCL (refused where direct
/// access was asked for); device-side counts run by direct access only.
pub fn cuda_call_plan(
    cuda: &CudaCaps<'_>,
    cfg: &Config,
    shape: &CallShape,
    requested: Algo,
    choice: LowPrecisionChoice,
) -> Result<Plan> {
    let coll = shape.coll;
    let refuse = |what: String| Error::Unsupported {
        collective: coll.name(),
        backend: "cuda",
        what,
    };
    let p2p = matches!(coll, Collective::Send | Collective::Recv);
    let why_not = match shape.operands {
        Operands::DeviceCounts => {
            return match cuda.dda {
                Some(_) => Ok(Plan {
                    a2av: Some(A2avForm::DeviceCounts),
                    ..Plan::on_gpu(Algo::Direct, None)
                }),
                None => Err(refuse(format!(
                    "device-side counts without direct access ({})",
                    cuda.no_dda
                ))),
            };
        }
        _ if p2p && cuda.world != 2 => Some(
            "direct access for point-to-point between the two ranks of a two-rank communicator \
             only",
        ),
        Operands::ToSelf => Some("direct access for a message to the rank itself"),
        Operands::UnevenInPlace => {
            Some("direct access in place with send counts that differ from receive counts")
        }
        Operands::Plain => None,
    };
    if let Some(why) = why_not {
        if requested == Algo::Direct {
            return Err(refuse(why.into()));
        }
        if !cuda.nccl {
            return Err(refuse(format!(
                "{} without NCCL ({})",
                coll.name(),
                cuda.no_nccl
            )));
        }
        return Ok(Plan::on_gpu(Algo::Nccl, None));
    }
    let choice = if shape.aligned {
        choice
    } else {
        LowPrecisionChoice::Off
    };
    let (bytes, dtype, op) = (shape.bytes_per_rank, shape.dtype, shape.op);
    cuda_plan(cuda, cfg, coll, bytes, dtype, op, requested, choice)
}

/// The staged kernel that carries `coll` by direct access (`fc_<kernel>_<form>`): a message
/// between two ranks is a broadcast rooted at its sender; `None` for the all-reduce and the
/// all-to-all-v, which have kernels of their own.
pub fn staged_kernel(coll: Collective) -> Option<&'static str> {
    match coll {
        Collective::AllGather => Some("all_gather"),
        Collective::ReduceScatter => Some("reduce_scatter"),
        Collective::AllToAll => Some("all_to_all"),
        Collective::Reduce => Some("reduce"),
        Collective::Broadcast | Collective::Send | Collective::Recv => Some("broadcast"),
        _ => None,
    }
}

/// How one call of a collective other than all-reduce runs on the cuda backend.
///
/// `part_bytes` is what the staging must hold per sender (see [`staged_need`]); `op` is set for
/// reductions. Auto falls back to NCCL where direct access cannot take the call; an explicit
/// `direct` that cannot run is an error.
#[allow(clippy::too_many_arguments)]
pub fn cuda_collective(
    cuda: &CudaCaps<'_>,
    cfg: &Config,
    coll: Collective,
    bytes_per_rank: usize,
    part_bytes: usize,
    dtype: DataType,
    op: Option<ReduceOp>,
    requested: Algo,
) -> Result<Algo> {
    let (world, caps) = (cuda.world, &cuda.caps());
    let why_not = match &cuda.dda {
        None => Some("direct access is off on this communicator".to_string()),
        Some(_) if op.is_some() && !cuda.kernels_take(dtype) => {
            Some(format!("the reduction kernels do not handle {dtype}"))
        }
        Some(_)
            if matches!(
                op,
                Some(ReduceOp::BitAnd | ReduceOp::BitOr | ReduceOp::BitXor)
            ) =>
        {
            Some("bitwise operators are NCCL's".into())
        }
        Some(d) => {
            let staging = d.staging_bytes;
            let fits = match staged_need(coll, part_bytes, world) {
                Some(need) => need <= staging,
                // All-to-all-v goes in pieces of a slot at every size: launches of pieces at
                // two ranks (a2av_pieces), pair by pair in one kernel above (a2av_pc_piece).
                None => true,
            };
            if fits {
                None
            } else {
                Some(format!(
                    "{part_bytes} bytes per part do not fit the staging ({staging} bytes)"
                ))
            }
        }
    };
    if let Some(why) = why_not {
        if requested == Algo::Direct {
            return Err(Error::Unsupported {
                collective: coll.name(),
                backend: "cuda",
                what: format!("direct access for this call: {why}"),
            });
        }
        return if caps.nccl {
            Ok(Algo::Nccl)
        } else {
            Err(Error::Unsupported {
                collective: coll.name(),
                backend: "cuda",
                what: format!("this call without NCCL ({why})"),
            })
        };
    }
    // The staging was judged above, part by part (select's own check compares the bytes per
    // rank with the staging, which refuses all-to-all-v calls that run in pieces).
    let caps = Caps {
        staging_bytes: None,
        ..*caps
    };
    let a = select(coll, bytes_per_rank, world, dtype, requested, &caps, cfg)?;
    Ok(match a {
        Algo::Nccl => Algo::Nccl,
        _ => Algo::Direct,
    })
}

/// The all-reduce algorithm of a low-precision call, flat or tree: an explicit flat/tree request
/// (per call or `FERROCOMM_ALGO`) is followed; otherwise one-shot up to 2 ranks (one
/// quantization, the same NVLink traffic as two-shot there) and two-shot above (O(N) instead of
/// O(N^2) traffic).
pub fn lp_all_reduce(requested: Algo, cfg_algo: Algo, world: usize) -> Algo {
    let r = if requested == Algo::Auto {
        cfg_algo
    } else {
        requested
    };
    match r {
        Algo::Flat | Algo::Push => Algo::Flat,
        Algo::Tree => Algo::Tree,
        _ if world <= 2 => Algo::Flat,
        _ => Algo::Tree,
    }
}

// ---------------------------------------------------------------------------------------------
// Low precision by the cuda backend's direct access: how the records are cut and moved.

/// Which low-precision kernel family a call runs by direct access (one launch per chunk).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LpKind {
    /// One-shot all-reduce (every rank sums every rank's quantized input).
    Flat,
    /// Two-shot all-reduce (owners sum and re-quantize their stripe).
    Tree,
    /// All-gather.
    AllGather,
    /// Reduce-scatter.
    ReduceScatter,
    /// All-to-all.
    AllToAll,
    /// All-to-all-v at two ranks (the one-shot kernel on pieces of both crossing parts).
    AllToAllV,
}

impl LpKind {
    /// The collective it implements.
    pub fn collective(self) -> Collective {
        match self {
            LpKind::Flat | LpKind::Tree => Collective::AllReduce,
            LpKind::AllGather => Collective::AllGather,
            LpKind::ReduceScatter => Collective::ReduceScatter,
            LpKind::AllToAll => Collective::AllToAll,
            LpKind::AllToAllV => Collective::AllToAllV,
        }
    }
}

/// Where a low-precision call's records go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LpMove {
    /// Stored into the receivers' staging, a region per sender.
    Push,
    /// Left in the sender's staging for the receivers to read.
    Pull,
}

/// The one-shot kernel a chunk runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LpKernel {
    /// `fc_lp_move` (the two-shot all-reduce: `fc_lp_tree`).
    Plain,
    /// `fc_lp_move_wide`: two CTAs per SM, registers capped.
    Wide,
}

impl fmt::Display for LpKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LpKernel::Plain => "plain",
            LpKernel::Wide => "wide",
        })
    }
}

/// How a low-precision call by direct access runs: launches of `chunk` elements per part (the
/// last takes what is left), each pushing or pulling its records, split or not, on the plain
/// or the wide kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LpForm {
    /// The kernel family.
    pub kind: LpKind,
    /// Push or pull.
    pub moves: LpMove,
    /// Elements per part of one launch (whole tiles; 0 for an empty call).
    pub chunk: usize,
    /// A push of one part leaves its odd groups in the sender's staging for the receivers to
    /// pull ([`lp_split`]).
    pub split: bool,
    /// The kernel of a launch of a whole chunk.
    pub kernel: LpKernel,
    /// The kernel of the last launch (which may hold fewer elements).
    pub last_kernel: LpKernel,
}

/// Elements a warp of the low-precision kernels handles at once (`lp_tile`): 128, or one block
/// when blocks are larger.
pub fn tile(codec: &Codec) -> usize {
    codec.block.max(128)
}

/// Staging bytes of one encoded part of `len` elements (16-aligned, so every region starts
/// where the kernels' 4-byte code loads are aligned).
pub fn region(codec: &Codec, len: usize) -> usize {
    codec.encoded_bytes(len).div_ceil(16) * 16
}

/// Encoded regions one staging parity holds for `kind` at `world` ranks, (pull, push). Pull
/// (the sender's staging): one per input part, so one for the all-reduce and the all-gather;
/// push (the receivers' staging): one per sender.
fn regions_per_parity(kind: LpKind, world: usize) -> (usize, usize) {
    match kind {
        LpKind::Tree => (1, 1),
        LpKind::ReduceScatter | LpKind::AllToAll | LpKind::AllToAllV => (world, world),
        LpKind::Flat | LpKind::AllGather => (1, world),
    }
}

/// Largest chunk (elements per part, whole tiles) whose `nparts` encodings fit in `staging`
/// bytes (0 when not even one tile does).
fn chunk_limit(staging: usize, nparts: usize, codec: &Codec) -> usize {
    let room = staging / nparts.max(1);
    let t = tile(codec);
    let mut c = room / (codec.block + 4) * codec.block / t * t;
    while c > 0 && region(codec, c) > room {
        c -= t;
    }
    c
}

/// How a one-shot collective of `part` elements per part is cut: whether it pushes (records
/// stored into the receivers' staging, a region per sender, at most `push_most` elements per
/// chunk; 0 where push cannot run) or pulls (records in the sender's staging, at most
/// `pull_most`, at least one tile), and the elements per chunk (equal chunks of whole tiles,
/// not full ones and a small remainder). Push wherever it needs no more chunks (kernel
/// launches) than pull: push wins with as many chunks and loses where it needs more
/// (docs/tuning.md, "Where the built-in limits come from").
fn lp_cut(
    kind: LpKind,
    part: usize,
    pull_most: usize,
    push_most: usize,
    tile: usize,
) -> (bool, usize) {
    let push = kind != LpKind::Tree
        && push_most > 0
        && part.div_ceil(push_most) <= part.div_ceil(pull_most);
    let most = if push { push_most } else { pull_most };
    (
        push,
        part.div_ceil(part.div_ceil(most)).div_ceil(tile) * tile,
    )
}

/// The `split` argument of a low-precision one-shot kernel (all-reduce, all-gather,
/// all-to-all) that pushes (`push`) or pulls: 1 where a push leaves its odd groups in the
/// sender's staging for the receivers to pull, so that half the records cross the link while
/// the quantizer runs, the other half while the receivers decode the first (two ranks, groups).
pub fn lp_split(push: bool, codec: &Codec, world: usize) -> u32 {
    u32::from(push && codec.block <= 128 && world == 2)
}

/// Whether a low-precision one-shot all-reduce or all-gather (`splits_kind`; the other kinds
/// never) pushes even where pull would need fewer chunks: the staging holds a region per
/// sender for the push (`push_most`, its largest chunk, is not 0) and the push splits
/// ([`lp_split`]), which overlaps the link with the quantizer and the decode.
pub fn lp_push_first(push_most: usize, codec: &Codec, world: usize, splits_kind: bool) -> bool {
    push_most > 0 && lp_split(true, codec, world) == 1 && splits_kind
}

/// How a low-precision call of `kind` with `part` elements of `es` bytes per part runs at
/// `world` ranks on `dda`'s staging: the chunk (`lp_cut`; push first where
/// [`lp_push_first`] says so, the grouped quantizer's blocks of up to 128 only, and never where
/// the staging holds no region per sender), the split ([`lp_split`]; the all-reduce, the
/// all-gather and the all-to-all) and the kernels (the wide one for chunks from the table's
/// `low_precision.wide_min_bytes`; the two-shot all-reduce has one kernel). Refused where the
/// staging holds less than one tile per part.
pub fn lp_form(
    kind: LpKind,
    part: usize,
    es: usize,
    world: usize,
    codec: &Codec,
    dda: &DdaCaps,
    tuning: &Tuning,
) -> Result<LpForm> {
    let staging = dda.staging_bytes;
    let (pull_parts, push_parts) = regions_per_parity(kind, world);
    let pull_most = chunk_limit(staging, pull_parts, codec);
    let t = tile(codec);
    if pull_most == 0 {
        return Err(Error::InvalidArgument(format!(
            "{}: FERROCOMM_CUDA_STAGING_BYTES={staging} holds less than one low-precision tile \
             of {t} elements per rank",
            kind.collective().name()
        )));
    }
    let push_most = if codec.block <= 128 {
        chunk_limit(staging, push_parts, codec)
    } else {
        0
    };
    let splits_kind = matches!(kind, LpKind::Flat | LpKind::AllGather);
    let pull_most = if lp_push_first(push_most, codec, world, splits_kind) {
        push_most
    } else {
        pull_most
    };
    let (push, chunk) = match part {
        0 => (false, 0),
        _ => lp_cut(kind, part, pull_most, push_most, t),
    };
    let split = matches!(kind, LpKind::Flat | LpKind::AllGather | LpKind::AllToAll)
        && lp_split(push, codec, world) == 1;
    let kernel = |len: usize| {
        if kind != LpKind::Tree && len.saturating_mul(es) >= tuning.lp_wide_min_bytes {
            LpKernel::Wide
        } else {
            LpKernel::Plain
        }
    };
    let last = match chunk {
        0 => 0,
        c => part - (part.div_ceil(c) - 1) * c,
    };
    Ok(LpForm {
        kind,
        moves: if push { LpMove::Push } else { LpMove::Pull },
        chunk,
        split,
        kernel: kernel(chunk),
        last_kernel: kernel(last),
    })
}

/// How a two-rank low-precision all-to-all-v whose largest crossing part holds `cross`
/// elements runs on a staging of `staging` bytes (the same on both ranks: the crossing counts
/// are in both views): launches of the one-shot kernel in all-to-all mode, each on a piece of
/// `chunk` elements of both crossing parts, push or pull as `lp_cut` cuts an all-to-all of
/// `cross` elements per part; the plain kernel (the wide one has no per-part counts), no
/// split. Only where [`a2av_codec_fits`].
pub fn lp_a2av_form(cross: usize, codec: &Codec, staging: usize) -> LpForm {
    let (pull_parts, push_parts) = regions_per_parity(LpKind::AllToAllV, 2);
    let pull_most = chunk_limit(staging, pull_parts, codec);
    let push_most = chunk_limit(staging, push_parts, codec);
    let t = tile(codec);
    let (push, chunk) = lp_cut(LpKind::AllToAllV, cross.max(1), pull_most, push_most, t);
    LpForm {
        kind: LpKind::AllToAllV,
        moves: if push { LpMove::Push } else { LpMove::Pull },
        chunk,
        split: false,
        kernel: LpKernel::Plain,
        last_kernel: LpKernel::Plain,
    }
}

/// Whether a two-rank low-precision all-to-all-v can run with `codec` on a staging of `staging`
/// bytes per parity: blocks of at most 128 (the per-part counts are handled by the grouped
/// kernels only) and room for one tile per part.
pub fn a2av_codec_fits(codec: &Codec, staging: usize) -> bool {
    let (pull_parts, _) = regions_per_parity(LpKind::AllToAllV, 2);
    codec.block <= 128 && chunk_limit(staging, pull_parts, codec) > 0
}

/// Whether the two-rank low-precision all-to-all-v fits a staging of `staging` bytes with the
/// configured block ([`a2av_codec_fits`]; every format's records have the same size).
pub fn a2av_lp_fits(cfg: &Config, staging: usize) -> bool {
    Codec::new(Format::E4M3, cfg.low_precision.block).is_ok_and(|c| a2av_codec_fits(&c, staging))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_put_takes_the_copy_engine_from_the_threshold_on() {
        let default = Thresholds::default();
        assert_eq!(put_engine(0, &default), PutEngine::Kernel);
        assert_eq!(
            put_engine(PUT_CE_MIN_BYTES - 1, &default),
            PutEngine::Kernel
        );
        assert_eq!(
            put_engine(PUT_CE_MIN_BYTES, &default),
            PutEngine::CopyEngine
        );
        assert_eq!(put_engine(1 << 30, &default), PutEngine::CopyEngine);
        let set = Thresholds {
            put_ce_min: Some(4096),
            ..Default::default()
        };
        assert_eq!(put_engine(4095, &set), PutEngine::Kernel);
        assert_eq!(put_engine(4096, &set), PutEngine::CopyEngine);
        // 0: every put by the copy engine; usize::MAX: every one by a kernel.
        let all_ce = Thresholds {
            put_ce_min: Some(0),
            ..Default::default()
        };
        assert_eq!(put_engine(1, &all_ce), PutEngine::CopyEngine);
        let none = Thresholds {
            put_ce_min: Some(usize::MAX),
            ..Default::default()
        };
        assert_eq!(put_engine(usize::MAX - 1, &none), PutEngine::Kernel);
        assert_eq!(PutEngine::CopyEngine.to_string(), "ce");
        assert_eq!(PutEngine::Kernel.to_string(), "kernel");
    }

    #[test]
    fn a_plan_prints_as_the_path_it_takes() {
        let full = |algo, form| Plan {
            engine: Engine::Direct,
            algo,
            form,
            low_precision: None,
            parts: None,
            norm: None,
            a2av: None,
            lp: None,
        };
        assert_eq!(full(Algo::Flat, Some(FlatForm::Pull)).to_string(), "flat");
        assert_eq!(full(Algo::Flat, Some(FlatForm::Stream)).to_string(), "flat");
        assert_eq!(
            full(Algo::Flat, Some(FlatForm::CopyEngine)).to_string(),
            "flat-ce"
        );
        assert_eq!(
            full(Algo::Flat, Some(FlatForm::Ll128)).to_string(),
            "flat-ll128"
        );
        assert_eq!(full(Algo::Nccl, None).to_string(), "nccl");
        let lp = Plan {
            low_precision: Some(Codec::new(Format::E4M3, 128).unwrap()),
            ..full(Algo::Tree, None)
        };
        assert_eq!(lp.to_string(), "lp-tree");
    }

    fn gpu(staging: usize) -> Caps {
        Caps {
            push: true,
            nccl: true,
            staging_bytes: Some(staging),
            multi_host: false,
        }
    }

    #[test]
    fn data_movers_go_direct_up_to_their_thresholds() {
        let cfg = Config::default();
        let caps = gpu(64 << 20);
        let pick = |coll, bytes, world| {
            select(coll, bytes, world, DataType::BF16, Algo::Auto, &caps, &cfg).unwrap()
        };
        // The equal-part all-to-all runs in rounds up to the staging (64 MiB at 2 ranks); the
        // all-to-all-v has no limit of its own (it runs in pieces; the staging is judged by the
        // backend, which these capabilities stand for only in part).
        assert_eq!(pick(Collective::AllToAll, 64 << 20, 2), Algo::Direct);
        assert_eq!(pick(Collective::AllToAll, (64 << 20) + 1, 2), Algo::Nccl);
        let free = Caps {
            staging_bytes: None,
            ..caps
        };
        let v = |bytes| {
            select(
                Collective::AllToAllV,
                bytes,
                2,
                DataType::BF16,
                Algo::Auto,
                &free,
                &cfg,
            )
        };
        assert_eq!(v(1 << 40).unwrap(), Algo::Direct);
        // Above two ranks: NCCL unless forced, or without NCCL.
        let v4 = |requested, caps: &Caps| {
            select(
                Collective::AllToAllV,
                0,
                4,
                DataType::BF16,
                requested,
                caps,
                &cfg,
            )
            .unwrap()
        };
        assert_eq!(v4(Algo::Auto, &free), Algo::Nccl);
        assert_eq!(v4(Algo::Direct, &free), Algo::Direct);
        let no_nccl = Caps {
            nccl: false,
            ..free
        };
        assert_eq!(v4(Algo::Auto, &no_nccl), Algo::Direct);
        assert_eq!(pick(Collective::AllGather, 32 << 20, 4), Algo::Direct);
        assert_eq!(pick(Collective::AllGather, (32 << 20) + 1, 4), Algo::Nccl);
        // Above 4 ranks every default halves (the all-to-all-v has none).
        assert_eq!(cfg.tuning.direct_max(Collective::AllToAllV, 8), None);
        for coll in DIRECT_LIMITED
            .into_iter()
            .filter(|&c| c != Collective::AllToAllV)
        {
            let limit = |world| cfg.tuning.direct_max(coll, world).expect("a default limit");
            let (two, eight) = (limit(2), limit(8));
            assert_eq!(eight * 2, two, "{}", coll.name());
            assert_eq!(pick(coll, eight, 8), Algo::Direct, "{}", coll.name());
            assert_eq!(pick(coll, eight + 1, 8), Algo::Nccl, "{}", coll.name());
        }
        // A smaller staging caps every threshold.
        let small = gpu(8 << 20);
        let pick_small = |bytes| {
            select(
                Collective::AllToAll,
                bytes,
                2,
                DataType::BF16,
                Algo::Auto,
                &small,
                &cfg,
            )
            .unwrap()
        };
        assert_eq!(pick_small(8 << 20), Algo::Direct);
        assert_eq!(pick_small((8 << 20) + 1), Algo::Nccl);
    }

    #[test]
    fn each_limit_is_set_by_the_variable_it_names() {
        for coll in DIRECT_LIMITED {
            let (unset, var) = direct_max_setting(&Config::default().thresholds, coll);
            assert_eq!(unset, None, "{}", coll.name());
            let cfg = Config::from_lookup(|k| (k == var).then(|| "1M".to_string())).unwrap();
            let (set, _) = direct_max_setting(&cfg.thresholds, coll);
            assert_eq!(set, Some(1 << 20), "{} ({var})", coll.name());
        }
    }

    #[test]
    fn a_set_threshold_replaces_the_default() {
        let mut cfg = Config::default();
        cfg.thresholds.all_to_all_max = Some(1 << 20);
        let caps = gpu(64 << 20);
        for coll in [Collective::AllToAll, Collective::AllToAllV] {
            let pick =
                |bytes| select(coll, bytes, 2, DataType::BF16, Algo::Auto, &caps, &cfg).unwrap();
            assert_eq!(pick(1 << 20), Algo::Direct, "{}", coll.name());
            assert_eq!(pick((1 << 20) + 1), Algo::Nccl, "{}", coll.name());
        }
    }

    #[test]
    fn point_to_point_goes_direct_between_two_ranks_only() {
        let caps = gpu(64 << 20);
        let mut cfg = Config::default();
        for coll in [Collective::Send, Collective::Recv] {
            let pick = |bytes, world, algo, caps: &Caps, cfg: &Config| {
                select(coll, bytes, world, DataType::BF16, algo, caps, cfg)
            };
            let auto = |bytes, world, cfg: &Config| pick(bytes, world, Algo::Auto, &caps, cfg);
            assert_eq!(auto(1024, 2, &cfg).unwrap(), Algo::Direct);
            assert_eq!(auto(64 << 20, 2, &cfg).unwrap(), Algo::Direct);
            assert_eq!(auto((64 << 20) + 1, 2, &cfg).unwrap(), Algo::Nccl);
            // Above two ranks a message leaves the other ranks out: NCCL, and a forced direct
            // is refused, unless there is no NCCL (the host backend's own path).
            assert_eq!(auto(1024, 4, &cfg).unwrap(), Algo::Nccl);
            assert!(pick(1024, 4, Algo::Direct, &caps, &cfg).is_err());
            let host = Caps {
                push: false,
                nccl: false,
                staging_bytes: None,
                multi_host: false,
            };
            assert_eq!(
                pick(1024, 4, Algo::Auto, &host, &cfg).unwrap(),
                Algo::Direct
            );
            assert_eq!(
                pick(1024, 4, Algo::Direct, &host, &cfg).unwrap(),
                Algo::Direct
            );
            // Its own limit; 0 leaves only empty messages to direct access.
            cfg.thresholds.p2p_max = Some(0);
            assert_eq!(auto(0, 2, &cfg).unwrap(), Algo::Direct);
            assert_eq!(auto(1, 2, &cfg).unwrap(), Algo::Nccl);
            cfg.thresholds.p2p_max = Some(1 << 20);
            assert_eq!(auto(1 << 20, 2, &cfg).unwrap(), Algo::Direct);
            assert_eq!(auto((1 << 20) + 1, 2, &cfg).unwrap(), Algo::Nccl);
            assert_eq!(
                direct_max_setting(&cfg.thresholds, coll),
                (Some(1 << 20), "FERROCOMM_P2P_MAX_BYTES")
            );
            cfg.thresholds.p2p_max = None;
        }
    }

    /// Direct access as on 2xH200: 64 MiB of staging, push to 512 KiB, LL to 256 KiB, no copy
    /// engine or LL128 region.
    fn two_h200_dda() -> DdaCaps {
        DdaCaps {
            staging_bytes: 64 << 20,
            push_cap: 512 << 10,
            ce_bytes: 0,
            ce_min: None,
            ll128_cap: 0,
            ll128_links: false,
            ll_max: 256 << 10,
            a2av_lp: true,
        }
    }

    /// A communicator of `world` ranks as on H200s ([`two_h200_dda`]'s direct access, NCCL
    /// underneath) whose reduction kernels take `kernels`.
    fn h200_caps(world: usize, kernels: &[DataType]) -> CudaCaps<'_> {
        CudaCaps {
            world,
            dda: Some(two_h200_dda()),
            no_dda: "off",
            nccl: true,
            no_nccl: "absent",
            multi_host: false,
            kernel_dtypes: kernels,
        }
    }

    #[test]
    fn a_cuda_plan_names_what_each_call_runs() {
        let dda = two_h200_dda();
        let kernels = [DataType::F32, DataType::BF16];
        let caps = |world, dda, nccl| CudaCaps {
            world,
            dda,
            no_dda: "off",
            nccl,
            no_nccl: "absent",
            multi_host: false,
            kernel_dtypes: &kernels,
        };
        let mut cfg = Config::default();
        let plan = |c: &CudaCaps<'_>, cfg: &Config, coll, bytes| {
            let d = LowPrecisionChoice::Default;
            let (dt, sum) = (DataType::BF16, ReduceOp::Sum);
            cuda_plan(c, cfg, coll, bytes, dt, sum, Algo::Auto, d).map(|p| p.to_string())
        };
        let two = caps(2, Some(dda), true);
        assert_eq!(
            plan(&two, &cfg, Collective::AllReduce, 1024).unwrap(),
            "push"
        );
        assert_eq!(
            plan(&two, &cfg, Collective::AllReduce, 1 << 30).unwrap(),
            "nccl"
        );
        // The barrier meets in a push kernel by direct access, else in NCCL, else nowhere.
        assert_eq!(plan(&two, &cfg, Collective::Barrier, 0).unwrap(), "push");
        let no_dda = caps(2, None, true);
        assert_eq!(plan(&no_dda, &cfg, Collective::Barrier, 0).unwrap(), "nccl");
        assert!(plan(&caps(2, None, false), &cfg, Collective::Barrier, 0).is_err());
        // Point-to-point direct between two ranks only.
        assert_eq!(plan(&two, &cfg, Collective::Send, 1024).unwrap(), "direct");
        let four = caps(4, Some(dda), true);
        assert_eq!(plan(&four, &cfg, Collective::Send, 1024).unwrap(), "nccl");
        // A staged collective carries the form of its parts (the all-gather's kernel: LL lines
        // to ll_max, staged, pipelined in rounds of 4 MiB from 8 MiB); NCCL's none.
        let parts = |c: &CudaCaps<'_>, coll, bytes| {
            let (dt, sum, d) = (DataType::BF16, ReduceOp::Sum, LowPrecisionChoice::Default);
            cuda_plan(c, &cfg, coll, bytes, dt, sum, Algo::Auto, d)
                .unwrap()
                .parts
        };
        let form = |form, rounds| Some(PartForm { form, rounds });
        assert_eq!(
            parts(&two, Collective::AllGather, 1024),
            form(PartKind::Ll, 1)
        );
        assert_eq!(
            parts(&two, Collective::AllGather, 1 << 20),
            form(PartKind::Staged, 1)
        );
        assert_eq!(
            parts(&two, Collective::AllGather, 16 << 20),
            form(PartKind::Pipelined, 4)
        );
        assert_eq!(parts(&two, Collective::AllGather, 64 << 20), None);
        // The all-to-all's part is its output over the world; a message is a broadcast.
        assert_eq!(
            parts(&two, Collective::AllToAll, 32 << 20),
            form(PartKind::Pipelined, 4)
        );
        assert_eq!(
            parts(&two, Collective::Send, 1 << 20),
            form(PartKind::Staged, 1)
        );
        assert_eq!(parts(&two, Collective::AllReduce, 1024), None);
        // Low precision from the cuda floor (4 MiB of one rank's part) up.
        cfg.low_precision.enabled = true;
        let ag = |bytes| plan(&two, &cfg, Collective::AllGather, bytes).unwrap();
        assert_eq!(
            (ag(1 << 20), ag(4 << 20)),
            ("direct".into(), "lp-direct".into())
        );
        // The all-to-all counts its whole output; the all-to-all-v goes low precision at two
        // ranks where its tiles fit.
        let a2a = plan(&two, &cfg, Collective::AllToAll, 8 << 20).unwrap();
        assert_eq!(a2a, "lp-direct");
        let a2av = |c: &CudaCaps<'_>| plan(c, &cfg, Collective::AllToAllV, 8 << 20).unwrap();
        assert_eq!(a2av(&two), "lp-direct");
        let tight = DdaCaps {
            a2av_lp: false,
            ..dda
        };
        assert_eq!(a2av(&caps(2, Some(tight), true)), "direct");
        assert_eq!(a2av(&four), "nccl");
        assert_eq!(
            plan(&two, &cfg, Collective::AllReduce, 4 << 20).unwrap(),
            "lp-flat"
        );
        assert_eq!(
            plan(&four, &cfg, Collective::AllReduce, 4 << 20).unwrap(),
            "lp-tree"
        );
    }

    #[test]
    fn the_operands_rule_out_direct_access_in_the_plan() {
        let kernels = [DataType::F32, DataType::BF16];
        let caps = |world, nccl| CudaCaps {
            nccl,
            ..h200_caps(world, &kernels)
        };
        let cfg = Config::default();
        let shape = |coll, bytes, operands| CallShape {
            operands,
            ..CallShape::of(coll, bytes, DataType::BF16)
        };
        let plan = |c: &CudaCaps<'_>, s: &CallShape, req| {
            cuda_call_plan(c, &cfg, s, req, LowPrecisionChoice::Default)
        };
        let (two, four) = (caps(2, true), caps(4, true));
        let send = shape(Collective::Send, 1024, Operands::Plain);
        let to_self = shape(Collective::Send, 1024, Operands::ToSelf);
        let uneven = shape(Collective::AllToAllV, 2048, Operands::UnevenInPlace);
        let device = shape(Collective::AllToAllV, 2048, Operands::DeviceCounts);
        // A message between the two ranks: direct access in LL lines.
        let p = plan(&two, &send, Algo::Auto).unwrap();
        assert_eq!(
            (p.engine, p.parts.map(|p| p.form)),
            (Engine::Direct, Some(PartKind::Ll))
        );
        // To the rank itself, between ranks of four, in place with uneven counts: NCCL's, and
        // refused naming why where direct access is asked for.
        for (c, s, why) in [
            (&two, &to_self, "to the rank itself"),
            (&four, &send, "two-rank communicator only"),
            (&two, &uneven, "send counts that differ"),
        ] {
            assert_eq!(
                plan(c, s, Algo::Auto).unwrap().engine,
                Engine::Nccl,
                "{why}"
            );
            let e = plan(c, s, Algo::Direct).unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
            // Without NCCL, nothing can carry them.
            let no_nccl = CudaCaps { nccl: false, ..*c };
            let e = plan(&no_nccl, s, Algo::Auto).unwrap_err().to_string();
            assert!(e.contains("without NCCL"), "{e}");
        }
        // Device-side counts: direct access only.
        let p = plan(&two, &device, Algo::Auto).unwrap();
        assert_eq!(
            (p.engine, p.a2av),
            (Engine::Direct, Some(A2avForm::DeviceCounts))
        );
        let off = CudaCaps { dda: None, ..two };
        let e = plan(&off, &device, Algo::Auto).unwrap_err().to_string();
        assert!(
            e.contains("device-side counts without direct access"),
            "{e}"
        );
        // The all-to-all-v's form: LL lines to the LL limit of its largest crossing part (the
        // size counts two of them), staged pieces above, pair by pair above two ranks.
        let ll = two_h200_dda().ll_max;
        let a2av = |c: &CudaCaps<'_>, bytes| {
            let s = shape(Collective::AllToAllV, bytes, Operands::Plain);
            plan(c, &s, Algo::Direct).unwrap().a2av
        };
        assert_eq!(a2av(&two, 2 * ll), Some(A2avForm::Lines));
        assert_eq!(a2av(&two, 2 * ll + 2), Some(A2avForm::Pieces));
        assert_eq!(a2av(&four, 0), Some(A2avForm::Pairs));
        assert_eq!(a2av(&four, 1 << 30), Some(A2avForm::Pairs));
        // Pointers off the element size: full precision, whatever was asked.
        let fp8 = LowPrecisionChoice::On(Format::E4M3);
        let ar = |aligned| {
            let s = CallShape {
                aligned,
                ..CallShape::of(Collective::AllReduce, 8 << 20, DataType::BF16)
            };
            cuda_call_plan(&two, &cfg, &s, Algo::Auto, fp8)
                .unwrap()
                .low_precision
        };
        assert!(ar(true).is_some());
        assert_eq!(ar(false), None);
    }

    #[test]
    fn the_low_precision_form_is_the_plan_s() {
        let dda = two_h200_dda();
        let t = Tuning::builtin();
        let e4 = Codec::new(Format::E4M3, 128).unwrap();
        let form = |kind, bytes: usize| lp_form(kind, bytes / 2, 2, 2, &e4, &dda, &t).unwrap();
        // One push launch, split, up to a region per sender; the wide kernel from the table's
        // 32 MiB on.
        let small = form(LpKind::Flat, 16 << 20);
        assert_eq!(
            (small.moves, small.chunk, small.split, small.last_kernel),
            (LpMove::Push, 8 << 20, true, LpKernel::Plain)
        );
        let big = form(LpKind::Flat, 32 << 20);
        assert_eq!((big.moves, big.last_kernel), (LpMove::Push, LpKernel::Wide));
        // 64 MiB: one pull chunk where push needs two... but push first where it splits
        // (two ranks, blocks of 128): two push launches of 32 MiB, both wide.
        let two = form(LpKind::Flat, 64 << 20);
        assert_eq!(two.moves, LpMove::Push);
        assert_eq!((64usize << 20) / 2 / two.chunk, 2);
        assert_eq!(
            (two.kernel, two.last_kernel),
            (LpKernel::Wide, LpKernel::Wide)
        );
        // Two-shot: never pushes, never wide.
        let tree = form(LpKind::Tree, 64 << 20);
        assert_eq!((tree.moves, tree.kernel), (LpMove::Pull, LpKernel::Plain));
        // A last launch smaller than the wide size runs the plain kernel: a reduce-scatter of
        // 100 elements short of 32 Mi bf16 per part, on a staging whose two regions hold about
        // 19 Mi elements each, runs two launches: 16 Mi (32 MiB, wide) and the rest (plain).
        let roomy = DdaCaps {
            staging_bytes: 40 << 20,
            ..dda
        };
        let part = (32usize << 20) - 100;
        let cut = lp_form(LpKind::ReduceScatter, part, 2, 2, &e4, &roomy, &t).unwrap();
        assert_eq!(
            (cut.chunk, part.div_ceil(cut.chunk)),
            (16 << 20, 2),
            "{cut:?}"
        );
        assert_eq!(
            (cut.kernel, cut.last_kernel),
            (LpKernel::Wide, LpKernel::Plain)
        );
        // The all-reduce's plan carries it; an empty call cuts nothing; a staging that holds
        // no tile is refused naming the setting.
        let kernels = [DataType::BF16];
        let caps = h200_caps(2, &kernels);
        let cfg = Config::default();
        let fp8 = LowPrecisionChoice::On(Format::E4M3);
        let plan = |c: &CudaCaps<'_>, coll, bytes| {
            cuda_plan(
                c,
                &cfg,
                coll,
                bytes,
                DataType::BF16,
                ReduceOp::Sum,
                Algo::Auto,
                fp8,
            )
        };
        assert_eq!(
            plan(&caps, Collective::AllReduce, 16 << 20).unwrap().lp,
            Some(small)
        );
        assert_eq!(
            plan(&caps, Collective::AllReduce, 0)
                .unwrap()
                .lp
                .unwrap()
                .chunk,
            0
        );
        let tiny = CudaCaps {
            dda: Some(DdaCaps {
                staging_bytes: 100,
                ..dda
            }),
            ..caps
        };
        let e = plan(&tiny, Collective::AllGather, 1 << 20)
            .unwrap_err()
            .to_string();
        assert!(e.contains("FERROCOMM_CUDA_STAGING_BYTES=100"), "{e}");
        // The all-to-all-v's: its largest crossing part (the size counts two), plain kernel.
        let a2av = plan(&caps, Collective::AllToAllV, 64 << 20)
            .unwrap()
            .lp
            .unwrap();
        assert_eq!(a2av, lp_a2av_form(16 << 20, &e4, dda.staging_bytes));
        assert_eq!(
            (a2av.kind, a2av.kernel, a2av.split),
            (LpKind::AllToAllV, LpKernel::Plain, false)
        );
    }

    #[test]
    fn the_detail_names_the_forms_the_path_does_not() {
        let kernels = [DataType::BF16];
        let caps = |world| h200_caps(world, &kernels);
        let cfg = Config::default();
        let detail = |world, coll, bytes, choice| {
            let (bf16, sum) = (DataType::BF16, ReduceOp::Sum);
            let p = cuda_plan(
                &caps(world),
                &cfg,
                coll,
                bytes,
                bf16,
                sum,
                Algo::Direct,
                choice,
            );
            p.unwrap().detail()
        };
        let (d, fp8) = (
            LowPrecisionChoice::Off,
            LowPrecisionChoice::On(Format::E4M3),
        );
        assert_eq!(detail(2, Collective::AllGather, 1024, d), "parts ll");
        assert_eq!(detail(2, Collective::AllGather, 1 << 20, d), "parts st");
        assert_eq!(detail(2, Collective::AllGather, 16 << 20, d), "parts rw x4");
        assert_eq!(detail(2, Collective::AllToAllV, 1024, d), "a2av lines");
        assert_eq!(detail(4, Collective::AllToAllV, 1024, d), "a2av pairs");
        assert_eq!(
            detail(2, Collective::AllGather, 2 << 20, fp8),
            "lp push, chunks of 1048576 (plain, the last plain), split"
        );
        let full = Plan::on_gpu(Algo::Nccl, None);
        assert_eq!(full.detail(), "");
    }

    #[test]
    fn parts_take_ll_up_to_the_ll_limit_then_staged_or_rounds() {
        // The all-to-all-v's choice at two ranks: its largest crossing part against ll_max.
        assert!(a2av_takes_ll(0, 2048));
        assert!(a2av_takes_ll(2048, 2048));
        assert!(!a2av_takes_ll(2049, 2048));
        assert!(!a2av_takes_ll(4096, 2048));
        // The staged collectives take the same limit, then rounds from their pipeline floor.
        assert_eq!(
            part_form(&Tuning::builtin(), "all_gather", 2048, 2048),
            (PartKind::Ll, 1)
        );
        assert_eq!(
            part_form(&Tuning::builtin(), "all_gather", 2049, 2048),
            (PartKind::Staged, 1)
        );
        assert_eq!(
            part_form(&Tuning::builtin(), "all_gather", 8 << 20, 2048),
            (PartKind::Pipelined, 2)
        );
        assert_eq!(
            part_form(&Tuning::builtin(), "broadcast", 64 << 20, 2048),
            (PartKind::Staged, 1)
        );
    }

    #[test]
    fn the_low_precision_push_splits_at_two_ranks_with_small_blocks() {
        let small = Codec::new(Format::E4M3, 128).unwrap();
        let large = Codec::new(Format::E4M3, 256).unwrap();
        // Split: a push of blocks up to 128 at two ranks, nothing else.
        assert_eq!(lp_split(true, &small, 2), 1);
        assert_eq!(lp_split(false, &small, 2), 0);
        assert_eq!(lp_split(true, &small, 3), 0);
        assert_eq!(lp_split(true, &large, 2), 0);
        // Push first: only where the staging holds the push, the push splits and the kind is
        // an all-reduce or all-gather.
        assert!(lp_push_first(1, &small, 2, true));
        assert!(!lp_push_first(0, &small, 2, true));
        assert!(!lp_push_first(1, &small, 2, false));
        assert!(!lp_push_first(1, &small, 4, true));
        assert!(!lp_push_first(1, &large, 2, true));
    }

    #[test]
    fn an_rmsnorm_plan_prints_its_norm_form() {
        let dda = two_h200_dda();
        let kernels = [DataType::F32, DataType::BF16];
        let caps = |dda| CudaCaps {
            world: 2,
            dda,
            no_dda: "off",
            nccl: true,
            no_nccl: "absent",
            multi_host: false,
            kernel_dtypes: &kernels,
        };
        let cfg = Config::from_lookup(|_| None).unwrap();
        let (two, no_dda) = (caps(Some(dda)), caps(None));
        let bf16 = DataType::BF16;
        let default = LowPrecisionChoice::Default;
        let fp8 = LowPrecisionChoice::On(Format::E4M3);
        // Rows of 4096 bf16 (8 KiB): `bytes` of them; a byte count that is not whole rows of
        // 8 KiB is one row of that many bytes (not whole 128-element blocks where it is odd).
        let sh = |bytes: usize| {
            let (rows, hidden) = if bytes % 8192 == 0 {
                (bytes / 8192, 4096)
            } else {
                (1, bytes / 2)
            };
            crate::rmsnorm::Shape {
                rows,
                hidden,
                dtype: bf16,
            }
        };
        let plan = |c: &CudaCaps<'_>, cfg: &Config, bytes, req, lp| {
            cuda_rmsnorm_plan(c, cfg, &sh(bytes), req, lp)
        };
        let text =
            |c: &CudaCaps<'_>, bytes, req, lp| plan(c, &cfg, bytes, req, lp).unwrap().to_string();
        // One launch by direct access: one-shot to the flat threshold (32 MiB at two ranks, or
        // as set), two-shot above while twice the message fits the staging, or as requested.
        assert_eq!(text(&two, 64 << 10, Algo::Auto, default), "fused-flat");
        assert_eq!(text(&two, 24 << 20, Algo::Auto, default), "fused-flat");
        let low = Config::from_lookup(|k| {
            (k == "FERROCOMM_RMSNORM_FLAT_MAX_BYTES").then(|| "1048576".to_string())
        })
        .unwrap();
        let tree = plan(&two, &low, 2 << 20, Algo::Auto, default).unwrap();
        assert_eq!(tree.to_string(), "fused-tree");
        assert_eq!(text(&two, 1 << 20, Algo::Tree, default), "fused-tree");
        let fused = plan(&two, &cfg, 1 << 20, Algo::Auto, default).unwrap();
        assert_eq!((fused.engine, fused.algo), (Engine::Direct, Algo::Flat));
        assert_eq!(fused.norm, Some(NormForm::FusedFlat));
        // Low precision on the wire in one launch: the rows cross as the codec's records.
        assert_eq!(text(&two, 8 << 20, Algo::Auto, fp8), "lp-fused-flat");
        assert_eq!(text(&two, 8 << 20, Algo::Tree, fp8), "lp-fused-tree");
        // The records of a 48 MiB call fit the 64 MiB staging once (the full-precision
        // two-shot needs twice).
        assert_eq!(text(&two, 48 << 20, Algo::Auto, fp8), "lp-fused-tree");
        let lp = plan(&two, &cfg, 8 << 20, Algo::Auto, fp8).unwrap();
        assert_eq!(lp.norm, Some(NormForm::FusedFlat));
        assert_eq!(
            lp.low_precision,
            Some(Codec::new(Format::E4M3, 128).unwrap())
        );
        // Two launches carry the all-reduce's own path: beyond the staging, NCCL asked for,
        // low precision with rows that are not whole blocks, no direct access.
        assert_eq!(text(&two, 48 << 20, Algo::Auto, default), "nccl+norm");
        assert_eq!(text(&two, 1 << 20, Algo::Nccl, default), "nccl+norm");
        assert_eq!(text(&two, (8 << 20) + 16, Algo::Auto, fp8), "lp-flat+norm");
        assert_eq!(text(&no_dda, 1 << 20, Algo::Auto, default), "nccl+norm");
        // One rank: the norm kernel on x itself, with or without direct access, whatever the
        // request but NCCL's.
        let one = CudaCaps { world: 1, ..two };
        let one_no_dda = CudaCaps { world: 1, ..no_dda };
        for req in [Algo::Auto, Algo::Push, Algo::Flat, Algo::Tree] {
            assert_eq!(text(&one, 1 << 20, req, default), "local", "{req}");
            assert_eq!(text(&one_no_dda, 64 << 20, req, default), "local", "{req}");
        }
        assert_eq!(text(&one, 1 << 20, Algo::Nccl, default), "nccl+norm");
        // Low precision asked for at one rank quantizes as at any world size (one launch).
        assert_eq!(text(&one, 8 << 20, Algo::Auto, fp8), "lp-fused-flat");
        let local = plan(&one, &cfg, 1 << 20, Algo::Auto, default).unwrap();
        assert_eq!(local.norm, Some(NormForm::Local));
        // At every size and request the plan is what the executor runs: one launch by direct
        // access in full precision, flat or tree as its form says; or the two launches, whose
        // all-reduce is exactly the plain all-reduce's plan (and refuses where it refuses).
        for req in [Algo::Auto, Algo::Push, Algo::Flat, Algo::Tree, Algo::Nccl] {
            for bytes in [0, 1 << 10, 4 << 20, 32 << 20, (32 << 20) + 2, 64 << 20] {
                for choice in [default, fp8, LowPrecisionChoice::Off] {
                    let case = format!("{req} {bytes} {choice:?}");
                    let ar =
                        cuda_all_reduce_plan(&two, &cfg, bytes, bf16, ReduceOp::Sum, req, choice);
                    match plan(&two, &cfg, bytes, req, choice) {
                        Ok(p) => match p.norm {
                            Some(NormForm::FusedFlat | NormForm::FusedTree) => {
                                let algo = if p.norm == Some(NormForm::FusedFlat) {
                                    Algo::Flat
                                } else {
                                    Algo::Tree
                                };
                                assert_eq!((p.engine, p.algo), (Engine::Direct, algo), "{case}");
                                // The records are the codec the all-reduce would take.
                                let want = low_precision(
                                    Collective::AllReduce,
                                    bf16,
                                    Some(ReduceOp::Sum),
                                    bytes,
                                    choice,
                                    &cfg,
                                    cfg.tuning.cuda_lp_min_bytes,
                                )
                                .unwrap();
                                assert_eq!(p.low_precision, want, "{case}");
                                if let Some(c) = &want {
                                    assert!(rows_take_codec(sh(bytes).hidden, bf16, c), "{case}");
                                }
                                assert!(bytes <= two.dda.as_ref().unwrap().staging_bytes, "{case}");
                            }
                            Some(NormForm::TwoLaunch) => {
                                let ar = ar.unwrap();
                                assert_eq!(Plan { norm: None, ..p }, ar, "{case}");
                            }
                            Some(NormForm::Local) => panic!("{case}: two ranks ran the local form"),
                            None => panic!("{case}: no norm form"),
                        },
                        // Only the all-reduce of two launches refuses (push above its cap).
                        Err(_) => assert!(ar.is_err(), "{case}"),
                    }
                }
            }
        }
    }

    /// (push, chunk, the most a chunk may hold) for two ranks and a 64 MiB staging parity.
    fn plan2(kind: LpKind, bytes: usize, es: usize) -> (bool, usize, usize) {
        let (pull_parts, push_parts) = regions_per_parity(kind, 2);
        let codec = Codec::new(Format::E4M3, 128).unwrap();
        let most = |nparts| chunk_limit(64 << 20, nparts, &codec);
        let (pull, push) = (most(pull_parts), most(push_parts));
        let (p, c) = lp_cut(kind, bytes / es, pull, push, 128);
        (p, c, if p { push } else { pull })
    }

    #[test]
    fn push_where_it_needs_no_more_chunks_than_pull() {
        let pc = |kind, bytes, es| {
            let (p, c, _) = plan2(kind, bytes, es);
            (p, c)
        };
        assert_eq!(pc(LpKind::Flat, 16 << 20, 2), (true, 8 << 20));
        assert_eq!(pc(LpKind::AllGather, 4 << 20, 4), (true, 1 << 20));
        assert_eq!(pc(LpKind::AllToAll, 16 << 20, 2), (true, 8 << 20));
        // 64 MiB of bf16: one pull chunk (32 Mi elements, wide kernel), not two push ones.
        assert_eq!(pc(LpKind::Flat, 64 << 20, 2), (false, 32 << 20));
        // Parts of 64 MiB (32 Mi bf16 elements): two regions either way, so push.
        assert_eq!(pc(LpKind::ReduceScatter, 64 << 20, 2), (true, 16 << 20));
        assert!(pc(LpKind::AllToAll, 256 << 20, 2).0);
        // Two-shot never pushes.
        assert!(!pc(LpKind::Tree, 1 << 20, 2).0);
    }

    #[test]
    fn no_push_where_it_cannot_run() {
        // A staging that holds one tile per rank but not one per sender (4 ranks, E4M3 B=128:
        // a tile's records are 132 bytes): pull, not an error.
        let codec = Codec::new(Format::E4M3, 128).unwrap();
        let (pull, push) = (chunk_limit(300, 1, &codec), chunk_limit(300, 4, &codec));
        assert_eq!((pull, push), (256, 0));
        assert_eq!(lp_cut(LpKind::Flat, 1000, pull, push, 128), (false, 256));
        assert_eq!(
            lp_cut(LpKind::AllGather, 100, pull, push, 128),
            (false, 128)
        );
    }

    #[test]
    fn the_chunk_limit_fits_its_records() {
        for block in [16, 32, 128, 256] {
            let codec = Codec::new(Format::E4M3, block).unwrap();
            for (staging, nparts) in [(64 << 20, 1), (64 << 20, 2), (1 << 20, 8), (8192, 3)] {
                let c = chunk_limit(staging, nparts, &codec);
                let t = tile(&codec);
                assert_eq!(c % t, 0, "{block} {staging} {nparts}");
                assert!(
                    region(&codec, c) * nparts <= staging,
                    "{block} {staging} {nparts}"
                );
                // The largest such: one more tile would not fit.
                assert!(
                    region(&codec, c + t) > staging / nparts,
                    "{block} {staging} {nparts}"
                );
            }
        }
        // Less room than one tile: nothing.
        assert_eq!(
            chunk_limit(100, 1, &Codec::new(Format::E4M3, 128).unwrap()),
            0
        );
    }

    #[test]
    fn chunks_are_equal_whole_tiles_within_the_staging() {
        for (kind, bytes, es) in [
            (LpKind::Flat, 256 << 20, 2),
            (LpKind::Flat, (256 << 20) + 6, 2),
            (LpKind::AllToAll, 200 << 20, 4),
            (LpKind::Tree, 100 << 20, 4),
            (LpKind::AllGather, 3 << 20, 2),
            (LpKind::AllGather, 130, 2),
        ] {
            let part = bytes / es;
            let (_, chunk, limit) = plan2(kind, bytes, es);
            let n = part.div_ceil(chunk);
            assert_eq!(chunk % 128, 0, "{kind:?} {bytes}");
            assert!(chunk <= limit, "{kind:?} {bytes}: {chunk} > {limit}");
            assert_eq!(
                n,
                part.div_ceil(limit),
                "{kind:?} {bytes}: more chunks than needed"
            );
            // Equal: the last chunk is short of the others by less than a tile per chunk.
            assert!(
                part - (n - 1) * chunk + 128 * n > chunk,
                "{kind:?} {bytes}: {chunk} x {n}"
            );
        }
    }
}
