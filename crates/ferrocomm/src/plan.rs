//! The planner: how a call runs (its engine, algorithm and forms, and whether it goes low
//! precision, with which codec), decided once per call from plain values (the call's shape,
//! what the backend has, the configuration). Every backend consults it; it imports no backend.
//!
//! A decision reads the tuning table's ordered rules for the collective ([`rules`]: sizes per
//! range of world sizes, first match wins) through one evaluator (`decide`); what a backend
//! or a call cannot run is ruled out in one place (`Can::check`: the backend's capabilities,
//! direct access's own limits, the operands) before a rule or a request is taken. The forms of
//! what direct access runs are computed in `plan/forms.rs` and, for low precision's records,
//! `plan/lowp.rs`.

use std::fmt;

use crate::config::{Config, Thresholds};
use crate::error::{Error, Result};
use crate::quant::{Codec, Format};
pub use crate::types::{Algo, Collective};
use crate::types::{DataType, ReduceOp};

mod forms;
mod lowp;
#[cfg(test)]
mod tests;

pub use forms::*;
pub use lowp::*;

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

    /// One rank's part at `world` ranks: the all-to-all's output over the world (the
    /// all-to-all-v's largest crossing part), the message itself for the others.
    pub fn part(&self, world: usize) -> usize {
        match self.coll {
            Collective::AllToAll | Collective::AllToAllV => self.bytes_per_rank / world.max(1),
            _ => self.bytes_per_rank,
        }
    }

    /// The reduction of a reducing collective (all-reduce, reduce-scatter, reduce); `None` for
    /// the others.
    pub fn reduction(&self) -> Option<ReduceOp> {
        let reduces = matches!(
            self.coll,
            Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce
        );
        reduces.then_some(self.op)
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
                return write!(f, "{}+norm", self.norm_all_reduce());
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

    /// The all-reduce of an all_reduce_rmsnorm's two launches ([`NormForm::TwoLaunch`]): the
    /// plan without its norm form, which the fused call's one plan carries (the executor runs
    /// it as it is, planning nothing again).
    pub fn norm_all_reduce(&self) -> Plan {
        Plan {
            norm: None,
            ..*self
        }
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
    /// Whether the direct-access reduction kernels handle `dtype`.
    pub fn kernels_take(&self, dtype: DataType) -> bool {
        self.kernel_dtypes.contains(&dtype)
    }
}

// ---------------------------------------------------------------------------------------------
// The table's rules: what each collective takes at which size.

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

/// The setting that limits direct access for `coll` (bytes per rank; `None`: the tuning
/// table's, [`crate::config::tuning::Tuning::direct_max`]) and the environment variable that
/// sets it. The all-to-all and the all-to-all-v share one, broadcast and reduce another, send
/// and recv a third (two-rank communicators only: see [`select`]).
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

/// One rule of a collective: `algo` for calls of at most `max` bytes per rank (`None`: any).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// The algorithm.
    pub algo: Algo,
    /// The largest call it takes, bytes per rank.
    pub max: Option<usize>,
}

/// The ordered rules of `coll` at `world` ranks, first match wins: the tuning table's sizes
/// (`cfg.tuning`), each replaced by its environment setting where one is set
/// (`FERROCOMM_ALLREDUCE_*_MAX_BYTES`, [`direct_max_setting`]):
/// - the all-reduce: push, flat, tree to the table's sizes, NCCL above;
/// - the barrier: direct access;
/// - the all-to-all-v above two ranks: NCCL, since its choice can take no size
///   ([`a2av_without_agreed_size`]) and the pair-by-pair kernel lost to NCCL's below 4 MB
///   and won above (docs/tuning.md, "Where the built-in limits come from"): NCCL is never
///   slower than NCCL;
/// - every other collective: direct access to its limit, NCCL above.
pub fn rules(coll: Collective, world: usize, cfg: &Config) -> [Option<Rule>; 4] {
    let t = &cfg.thresholds;
    let rule = |algo, max| Some(Rule { algo, max });
    let nccl = rule(Algo::Nccl, None);
    match coll {
        Collective::AllReduce => {
            let (push, flat, tree) = cfg.tuning.all_reduce(world);
            [
                rule(Algo::Push, Some(t.push_max.unwrap_or(push))),
                rule(Algo::Flat, Some(t.flat_max.unwrap_or(flat))),
                rule(Algo::Tree, Some(t.tree_max.unwrap_or(tree))),
                nccl,
            ]
        }
        Collective::Barrier => [rule(Algo::Direct, None), None, None, None],
        Collective::AllToAllV if a2av_without_agreed_size(world) => [nccl, None, None, None],
        other => {
            let limit = direct_max_setting(t, other)
                .0
                .or_else(|| cfg.tuning.direct_max(other, world));
            [rule(Algo::Direct, limit), nccl, None, None]
        }
    }
}

// ---------------------------------------------------------------------------------------------
// What can run: capability filtering, in one place.

/// Why an algorithm cannot carry a call; for direct access's own size limits, what a choice
/// forced by the environment (`FERROCOMM_ALGO`) takes instead.
struct Refusal {
    error: Error,
    instead: Option<Algo>,
}

/// What can carry one call of `coll` with `bytes` per rank at `world` ranks: the backend's
/// capabilities ([`Caps`]), and on the cuda backend why direct access cannot take the call at
/// all (`no_direct`) and the all-reduce's own limits (the push buffer, the staging for tree).
struct Can<'a> {
    coll: Collective,
    bytes: usize,
    world: usize,
    caps: Caps,
    /// Direct access cannot take this call at all, and why (the cuda backend: direct access
    /// off, its kernels lack the dtype or op, the staging cannot hold a part).
    no_direct: Option<String>,
    /// Largest push all-reduce, bytes per rank (the cuda backend's push buffer).
    push_cap: Option<usize>,
    /// Largest tree all-reduce, bytes per rank (the cuda backend's staging).
    tree_cap: Option<usize>,
    /// Why NCCL is absent, for the error where nothing else can carry the call.
    no_nccl: &'a str,
    /// The backend's name in errors.
    backend: &'static str,
}

/// Whether `a` is direct access for `coll` (push, flat, tree for the all-reduce; direct for
/// the others): what an explicit request of it asks for.
fn is_direct(coll: Collective, a: Algo) -> bool {
    match coll {
        Collective::AllReduce => matches!(a, Algo::Push | Algo::Flat | Algo::Tree),
        _ => a == Algo::Direct,
    }
}

impl<'a> Can<'a> {
    /// A backend's capabilities and nothing more (the host backend, NCCL's, the generic
    /// [`select`]).
    fn of(coll: Collective, bytes: usize, world: usize, caps: &Caps) -> Can<'a> {
        Can {
            coll,
            bytes,
            world,
            caps: *caps,
            no_direct: None,
            push_cap: None,
            tree_cap: None,
            no_nccl: "absent",
            backend: "this",
        }
    }

    /// The cuda backend's, for a call of `coll` with `bytes` per rank whose parts are
    /// `part_bytes` (what the staging must hold per sender, [`staged_need`]) of `dtype` and
    /// reduction `op` (`None` for the data movers).
    fn cuda(
        cuda: &'a CudaCaps<'a>,
        coll: Collective,
        bytes: usize,
        part_bytes: usize,
        dtype: DataType,
        op: Option<ReduceOp>,
    ) -> Can<'a> {
        let bitwise = matches!(
            op,
            Some(ReduceOp::BitAnd | ReduceOp::BitOr | ReduceOp::BitXor)
        );
        let no_direct = match &cuda.dda {
            None => Some(format!("direct access is off ({})", cuda.no_dda)),
            Some(_) if op.is_some() && !cuda.kernels_take(dtype) => {
                Some(format!("the reduction kernels do not handle {dtype}"))
            }
            Some(_) if bitwise => Some("bitwise operators are NCCL's".into()),
            Some(d) => match staged_need(coll, part_bytes, cuda.world) {
                // All-to-all-v goes in pieces of a slot at every size, and the all-reduce
                // streams or refuses by its own limits below.
                Some(need) if need > d.staging_bytes => Some(format!(
                    "{part_bytes} bytes per part do not fit the staging ({} bytes)",
                    d.staging_bytes
                )),
                _ => None,
            },
        };
        let dda = cuda.dda.as_ref();
        Can {
            coll,
            bytes,
            world: cuda.world,
            // Direct access judges its staging itself (no_direct, the all-reduce's caps).
            caps: Caps {
                push: true,
                nccl: cuda.nccl,
                staging_bytes: None,
                multi_host: cuda.multi_host,
            },
            no_direct,
            push_cap: dda.map(|d| d.push_cap),
            tree_cap: dda.map(|d| d.staging_bytes),
            no_nccl: cuda.no_nccl,
            backend: "cuda",
        }
    }

    /// Whether `a` can carry the call: NCCL where the backend has it; direct access on one
    /// host, for a call the staging holds (where the backend has a staging limit), the push
    /// all-reduce where the backend has it, point-to-point between the two ranks of a two-rank
    /// communicator only (where there is NCCL for the others); then direct access's own limits
    /// of the all-reduce.
    fn check(&self, a: Algo) -> std::result::Result<(), Refusal> {
        let Can {
            coll, bytes, caps, ..
        } = *self;
        let ar = coll == Collective::AllReduce;
        let direct = !caps.multi_host && caps.staging_bytes.is_none_or(|s| bytes <= s);
        let ok = match a {
            Algo::Nccl => caps.nccl,
            Algo::Push => caps.push && ar && direct,
            Algo::Flat | Algo::Tree => ar && direct,
            Algo::Direct => !ar && direct && (!p2p(coll) || self.world == 2 || !caps.nccl),
            Algo::Auto => true,
        };
        let refuse = |what: String, instead| {
            Err(Refusal {
                error: Error::InvalidArgument(what),
                instead,
            })
        };
        if !ok {
            return refuse(
                format!(
                    "algorithm {a} cannot run {} of {bytes} bytes per rank on {} backend",
                    coll.name(),
                    self.backend
                ),
                None,
            );
        }
        match (a, self.push_cap, self.tree_cap) {
            (Algo::Push, Some(cap), _) if bytes > cap => refuse(
                format!("all_reduce: push takes at most {cap} bytes per rank, got {bytes}"),
                Some(Algo::Flat),
            ),
            (Algo::Tree, _, Some(cap)) if bytes > cap => refuse(
                format!(
                    "all_reduce: tree takes at most {cap} bytes per rank (the staging size), \
                     got {bytes}"
                ),
                Some(if caps.nccl { Algo::Nccl } else { Algo::Flat }),
            ),
            _ => Ok(()),
        }
    }

    /// What runs where no rule's algorithm can: NCCL where direct access is never attempted
    /// (across hosts); else direct access, for the all-reduce tree (flat beyond the staging,
    /// which flat streams through).
    fn last_resort(&self) -> Algo {
        if self.caps.multi_host && self.caps.nccl {
            Algo::Nccl
        } else if self.coll == Collective::AllReduce {
            match self.check(Algo::Tree) {
                Err(Refusal {
                    instead: Some(a), ..
                }) => a,
                _ => Algo::Tree,
            }
        } else {
            Algo::Direct
        }
    }

    /// NCCL for a call direct access cannot take (`why`), whatever was asked but direct access
    /// itself (refused), and refused where there is no NCCL.
    fn nccl_instead(&self, requested: Algo, why: &str) -> Result<Algo> {
        let refuse = |what| Error::Unsupported {
            collective: self.coll.name(),
            backend: self.backend,
            what,
        };
        if is_direct(self.coll, requested) {
            return Err(refuse(format!("{requested} for this call: {why}")));
        }
        if !self.caps.nccl {
            return Err(refuse(format!(
                "this call without NCCL ({why}; NCCL: {})",
                self.no_nccl
            )));
        }
        Ok(Algo::Nccl)
    }
}

// ---------------------------------------------------------------------------------------------
// The evaluator.

/// The algorithm of one call: what can carry it (`Can`) under the request and the table.
///
/// Where direct access cannot take the call at all, NCCL (an explicit request of direct access
/// refused). Else a forced algorithm (`requested` per call, else `FERROCOMM_ALGO`) where it can
/// run; a per-call request that cannot is refused, the environment's takes what the refusal
/// names instead or falls through (as does a per-call request the environment forces too,
/// where it does not apply to the collective). Else the first of the table's [`rules`] that
/// holds the size and can run; else `Can::last_resort`.
fn decide(can: &Can<'_>, requested: Algo, cfg: &Config) -> Result<Algo> {
    if let Some(why) = &can.no_direct {
        return can.nccl_instead(requested, why);
    }
    let forced = if requested == Algo::Auto {
        cfg.algo
    } else {
        requested
    };
    if forced != Algo::Auto {
        match can.check(forced) {
            Ok(()) => return Ok(forced),
            Err(r) if requested != Algo::Auto && (r.instead.is_some() || forced != cfg.algo) => {
                return Err(r.error)
            }
            Err(Refusal {
                instead: Some(a), ..
            }) => return Ok(a),
            Err(_) => {}
        }
    }
    let chosen = rules(can.coll, can.world, cfg)
        .into_iter()
        .flatten()
        .find(|r| r.max.is_none_or(|m| can.bytes <= m) && can.check(r.algo).is_ok());
    Ok(chosen.map_or_else(|| can.last_resort(), |r| r.algo))
}

/// Chooses the algorithm for one collective call on a backend of `caps` (`decide` with
/// nothing but the backend's capabilities).
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
    decide(&Can::of(coll, bytes_per_rank, world, caps), requested, cfg)
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
// The host backend and the plain NCCL backend.

/// What the host backend has: no push kernel, no NCCL, no staging limit (it chunks).
pub const HOST_CAPS: Caps = Caps {
    push: false,
    nccl: false,
    staging_bytes: None,
    multi_host: false,
};

/// The host backend's algorithm ([`select`] on [`HOST_CAPS`]): the all-reduce flat or tree,
/// every other collective direct.
pub fn host_algo(
    coll: Collective,
    bytes_per_rank: usize,
    world: usize,
    dtype: DataType,
    requested: Algo,
    cfg: &Config,
) -> Result<Algo> {
    select(
        coll,
        bytes_per_rank,
        world,
        dtype,
        requested,
        &HOST_CAPS,
        cfg,
    )
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

/// The plan of one host-backend call: its algorithm ([`host_algo`]) and its codec
/// ([`low_precision`] on one rank's part, with no size floor of its own: low precision
/// whenever asked; `op` counts for the reducing collectives only).
pub fn host_call_plan(
    shape: &CallShape,
    world: usize,
    requested: Algo,
    choice: LowPrecisionChoice,
    cfg: &Config,
) -> Result<Plan> {
    let (coll, bytes, dtype) = (shape.coll, shape.bytes_per_rank, shape.dtype);
    let part = shape.part(world);
    let codec = low_precision(coll, dtype, shape.reduction(), part, choice, cfg, 0)?;
    Ok(Plan {
        engine: Engine::Host,
        low_precision: codec,
        ..Plan::on_gpu(host_algo(coll, bytes, world, dtype, requested, cfg)?, None)
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
    let algo = select(coll, bytes_per_rank, world, dtype, requested, &caps, cfg)?;
    Ok(Plan {
        engine: Engine::Nccl,
        ..Plan::on_gpu(algo, None)
    })
}

// ---------------------------------------------------------------------------------------------
// The cuda backend: direct access where it can take the call, else NCCL.

/// The all-reduce algorithm of the cuda backend (`decide` on what direct access can take):
/// push, flat, tree by direct access where its kernels take the dtype and op (push to its
/// buffer, tree to the staging, flat at any size), else NCCL; an explicit request that
/// cannot run is an error.
pub fn cuda_all_reduce(
    cuda: &CudaCaps<'_>,
    cfg: &Config,
    bytes: usize,
    dtype: DataType,
    op: ReduceOp,
    requested: Algo,
) -> Result<Algo> {
    let can = Can::cuda(cuda, Collective::AllReduce, bytes, bytes, dtype, Some(op));
    decide(&can, requested, cfg)
}

/// The algorithm of one call of a collective other than all-reduce on the cuda backend
/// (`decide` on what direct access can take): `part_bytes` is what the staging must hold per
/// sender ([`staged_need`]); `op` is set for reductions. Auto falls back to NCCL where direct
/// access cannot take the call; an explicit `direct` that cannot run is an error.
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
    let can = Can::cuda(cuda, coll, bytes_per_rank, part_bytes, dtype, op);
    decide(&can, requested, cfg)
}

/// The plan of one call of `shape` on the cuda backend, `requested` per call and `choice` of
/// low precision, in this order:
/// 1. what the operands rule out ([`Operands`]; a message between ranks of a communicator of
///    other than two) goes to NCCL, or is refused where direct access was asked for;
///    device-side counts run by direct access only;
/// 2. low precision by direct access where [`low_precision`] says so (`lp_plan`; never where
///    the pointers are not aligned to the element size);
/// 3. the barrier: a one-word push all-reduce by direct access, else NCCL's;
/// 4. the algorithm ([`cuda_all_reduce`], [`cuda_collective`]) with the forms of what direct
///    access runs: a flat all-reduce's [`flat_form`], a staged collective's [`PartForm`],
///    the all-to-all-v's [`A2avForm`].
pub fn cuda_call_plan(
    cuda: &CudaCaps<'_>,
    cfg: &Config,
    shape: &CallShape,
    requested: Algo,
    choice: LowPrecisionChoice,
) -> Result<Plan> {
    let (coll, bytes, world) = (shape.coll, shape.bytes_per_rank, cuda.world);
    let part = shape.part(world);
    let can = Can::cuda(cuda, coll, bytes, part, shape.dtype, shape.reduction());
    let ruled_out = match shape.operands {
        Operands::DeviceCounts => {
            return match cuda.dda {
                Some(_) => Ok(Plan {
                    a2av: Some(A2avForm::DeviceCounts),
                    ..Plan::on_gpu(Algo::Direct, None)
                }),
                None => Err(Error::Unsupported {
                    collective: coll.name(),
                    backend: "cuda",
                    what: format!("device-side counts without direct access ({})", cuda.no_dda),
                }),
            };
        }
        _ if p2p(coll) && world != 2 => Some(
            "direct access for point-to-point between the two ranks of a two-rank communicator \
             only",
        ),
        Operands::ToSelf => Some("direct access for a message to the rank itself"),
        Operands::UnevenInPlace => {
            Some("direct access in place with send counts that differ from receive counts")
        }
        Operands::Plain => None,
    };
    if let Some(why) = ruled_out {
        return Ok(Plan::on_gpu(can.nccl_instead(requested, why)?, None));
    }
    let choice = if shape.aligned {
        choice
    } else {
        LowPrecisionChoice::Off
    };
    if let Some(p) = lp_plan(cuda, cfg, shape, requested, choice)? {
        return Ok(p);
    }
    if coll == Collective::Barrier {
        // Direct access meets every rank in a one-word push all-reduce.
        let algo = match cuda.dda {
            Some(_) => Algo::Push,
            None => can.nccl_instead(Algo::Auto, "direct access is off")?,
        };
        return Ok(Plan::on_gpu(algo, None));
    }
    let algo = decide(&can, requested, cfg)?;
    let Some(d) = cuda.dda.as_ref().filter(|_| algo != Algo::Nccl) else {
        return Ok(Plan::on_gpu(algo, None));
    };
    Ok(Plan {
        parts: staged_kernel(coll).map(|kernel| {
            let (form, rounds) = part_form(&cfg.tuning, kernel, part, d.ll_max);
            PartForm { form, rounds }
        }),
        a2av: (coll == Collective::AllToAllV).then(|| a2av_form(world, part, d.ll_max)),
        ..Plan::on_gpu(algo, (algo == Algo::Flat).then(|| flat_form(d, bytes)))
    })
}

/// The plan of a low-precision call by direct access, or `None` where it runs in full
/// precision: where [`low_precision`] says so (with the cuda size floor, the table's
/// `cuda_lp_min_bytes`, on one rank's part) for the all-reduce (flat or tree as
/// [`lp_all_reduce`] says), the all-gather, the reduce-scatter, the all-to-all and the
/// two-rank all-to-all-v where its tiles fit the staging, with how its records are cut
/// ([`lp_form`], [`lp_a2av_form`]).
fn lp_plan(
    cuda: &CudaCaps<'_>,
    cfg: &Config,
    shape: &CallShape,
    requested: Algo,
    choice: LowPrecisionChoice,
) -> Result<Option<Plan>> {
    let Some(d) = &cuda.dda else {
        return Ok(None);
    };
    let (coll, dtype, world) = (shape.coll, shape.dtype, cuda.world);
    let kind = match coll {
        Collective::AllReduce => match lp_all_reduce(requested, cfg.algo, world) {
            Algo::Tree => LpKind::Tree,
            _ => LpKind::Flat,
        },
        Collective::ReduceScatter => LpKind::ReduceScatter,
        Collective::AllGather => LpKind::AllGather,
        Collective::AllToAll => LpKind::AllToAll,
        Collective::AllToAllV if world == 2 && d.a2av_lp => LpKind::AllToAllV,
        _ => return Ok(None),
    };
    // The size low precision weighs: one rank's part.
    let (op, bytes) = (shape.reduction(), shape.part(world));
    let floor = cfg.tuning.cuda_lp_min_bytes;
    let Some(codec) = low_precision(coll, dtype, op, bytes, choice, cfg, floor)? else {
        return Ok(None);
    };
    // The part in elements.
    let (es, part) = (dtype.size().max(1), bytes / dtype.size().max(1));
    let form = match kind {
        LpKind::AllToAllV => lp_a2av_form(part, &codec, d.staging_bytes),
        _ => lp_form(kind, part, es, world, &codec, d, &cfg.tuning)?,
    };
    let algo = match kind {
        LpKind::Flat => Algo::Flat,
        LpKind::Tree => Algo::Tree,
        _ => Algo::Direct,
    };
    Ok(Some(Plan {
        low_precision: Some(codec),
        lp: Some(form),
        ..Plan::on_gpu(algo, None)
    }))
}

/// The plan of one call of `coll` with `bytes_per_rank` (as [`Plan`]'s callers count it: the
/// output of an all-reduce, one rank's part of an all-gather or reduce-scatter, the whole
/// output of an all-to-all, `world` × the largest crossing part of an all-to-all-v) on the
/// cuda backend, pointers aligned, plain operands: [`cuda_call_plan`]'s. `op` counts for the
/// reductions.
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
    let shape = CallShape {
        op,
        ..CallShape::of(coll, bytes_per_rank, dtype)
    };
    cuda_call_plan(cuda, cfg, &shape, requested, choice)
}

// ---------------------------------------------------------------------------------------------
// The fused all-reduce + RMSNorm on the cuda backend.

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
/// low precision; the local form of one rank (or, with `FERROCOMM_RMSNORM_LOOPBACK` and direct
/// access, the one-launch kernel run as that many ranks on this one's staging: a measurement,
/// tree where asked, else flat); or two launches, which carry the all-reduce's own plan
/// ([`cuda_plan`] of the all-reduce, [`Plan::norm_all_reduce`]). The executor runs this plan
/// as it is.
pub fn cuda_rmsnorm_plan(
    cuda: &CudaCaps<'_>,
    cfg: &Config,
    shape: &crate::rmsnorm::Shape,
    requested: Algo,
    choice: LowPrecisionChoice,
) -> Result<Plan> {
    let (bytes, dtype) = (shape.x_bytes(), shape.dtype);
    let floor = cfg.tuning.cuda_lp_min_bytes;
    let sum = Some(ReduceOp::Sum);
    let codec = low_precision(Collective::AllReduce, dtype, sum, bytes, choice, cfg, floor)?;
    let lp_rows = codec
        .as_ref()
        .is_some_and(|c| rows_take_codec(shape.hidden, dtype, c));
    let norm = match cuda_rmsnorm(cuda, cfg, bytes, dtype, requested, codec.is_some(), lp_rows) {
        NormForm::Local if cfg.rmsnorm_loopback.is_some() && cuda.dda.is_some() => {
            if requested == Algo::Tree {
                NormForm::FusedTree
            } else {
                NormForm::FusedFlat
            }
        }
        form => form,
    };
    let fused = |algo| Plan {
        low_precision: codec,
        ..Plan::on_gpu(algo, None)
    };
    let plan = match norm {
        NormForm::FusedFlat => fused(Algo::Flat),
        NormForm::FusedTree => fused(Algo::Tree),
        NormForm::Local => Plan::on_gpu(Algo::Direct, None),
        NormForm::TwoLaunch => {
            let ar = Collective::AllReduce;
            cuda_plan(
                cuda,
                cfg,
                ar,
                bytes,
                dtype,
                ReduceOp::Sum,
                requested,
                choice,
            )?
        }
    };
    Ok(Plan {
        norm: Some(norm),
        ..plan
    })
}
