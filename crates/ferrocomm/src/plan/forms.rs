//! The forms the direct-access executors take, decided from plain values: how a flat
//! all-reduce moves its data, how a staged collective's parts move and in how many rounds, how
//! an all-to-all-v runs, and which engine carries a window put.

use std::fmt;

use crate::config::tuning::Tuning;
use crate::config::Thresholds;
use crate::types::Collective;

use super::{a2av_without_agreed_size, DdaCaps};

/// How an all-to-all-v runs by the cuda backend's direct access ([`super::cuda_call_plan`]).
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

/// Rounds of a staged collective's pipeline (`FC_MAX_ROUNDS` of the kernels): barrier words per
/// block, sender and parity.
pub const COLL_MAX_ROUNDS: usize = 8;

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
}
