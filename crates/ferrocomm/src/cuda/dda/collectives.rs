//! Direct-access all-gather, reduce-scatter, all-to-all(v), broadcast and reduce: the launch side
//! of kernels/collectives.cu. Each call is one kernel on the caller's stream, on the staging,
//! push lines and epochs the all-reduce uses (so calls of any collective interleave freely and
//! CUDA graphs capture them).
//!
//! Two protocols (see the head of collectives.cu): LL lines for parts up to the LL limit (the
//! tuning table's `ll.max_part_bytes`, `StagingLayout::ll_max`; no barrier), staged copies with
//! a per-block barrier above: the Plan's [`PartForm`], decided by the planner from values every
//! rank shares (part size, LL limit), so all ranks run the same kernel.

use std::ffi::c_void;

use super::{kernel_name, Args, Dda, COLL_BAR_OFF, MAX_BLOCKS, MAX_RANKS};
use crate::backend::Splits;
use crate::driver::launch;
use crate::error::{Error, Result};
use crate::plan::{A2avForm, Collective, PartForm, PartKind};
use crate::types::{DataType, ReduceOp};

const ERR_MISMATCH: u32 = 2;
const ERR_CAPACITY: u32 = 3;
const ERR_INPUT: u32 = 4;
const ERR_PEER_MISMATCH: u32 = 5;
const ERR_OUTPUT: u32 = 6;
const ERR_SLOT: u32 = 7;
const ERR_PEER_FAULT: u32 = 8;
/// `CArgs::count_flags`: i32/i64 counts (negative: nothing), receive counts given (packed).
const DYN_SIGNED: u32 = 1;
const DYN_PACKED: u32 = 2;

/// Extra kernel arguments; the same layout as `struct CArgs` in collectives.cu.
#[repr(C)]
#[derive(Clone, Copy)]
struct CArgs {
    scount: [u64; MAX_RANKS],
    sdispl: [u64; MAX_RANKS],
    rcount: [u64; MAX_RANKS],
    rdispl: [u64; MAX_RANKS],
    n: u64,
    es: u64,
    slot_bytes: u64,
    bar_off: u64,
    dyn_send: u64,
    dyn_recv: u64,
    cap: u64,
    in_count: u64,
    root: u32,
    sig: u32,
    count_bytes: u32,
    count_flags: u32,
    rounds: u32,
}

/// Entry point of a per-part collective, `fc_<kernel>_<form>[_<op>]` (form `ll`, `st` or `rw`,
/// the op for the reductions).
fn part_kernel<'a>(buf: &'a mut [u8; 64], kernel: &str, form: &str, op: Option<&str>) -> &'a str {
    match op {
        Some(op) => kernel_name(buf, &["fc_", kernel, "_", form, "_", op]),
        None => kernel_name(buf, &["fc_", kernel, "_", form]),
    }
}

fn round16(n: usize) -> usize {
    n.div_ceil(16) * 16
}

/// Staging bytes per sender slot for the staged all-to-all-v (every rank computes the same).
pub fn a2av_slot_bytes(staging_bytes: usize, world: usize) -> usize {
    (staging_bytes / world.max(1)) / 16 * 16
}

/// The order in which `rank` of a two-rank communicator runs a batch's messages by direct
/// access (each one call of both ranks, `PartCall::SendRecv`): (index in the batch, sender),
/// rank 0's messages first, then rank 1's, each side's in the order issued. `sends` tells, op by
/// op, a send from a receive. The other rank, batched or one call at a time, meets them in that
/// order whenever it too takes rank 0's messages first (as its batch does).
pub(in crate::cuda) fn two_rank_batch_order(
    rank: usize,
    sends: impl Iterator<Item = bool> + Clone,
) -> Vec<(usize, usize)> {
    (0..2)
        .flat_map(|sender| {
            sends
                .clone()
                .enumerate()
                .filter(move |&(_, send)| send == (sender == rank))
                .map(move |(k, _)| (k, sender))
        })
        .collect()
}

/// A call of the part kernels (`Dda::coll_part`), with what its kernel needs beyond the
/// buffers.
#[derive(Clone, Copy, Debug)]
pub enum PartCall {
    /// Every rank's `n` elements (`input`, the own part of `output` in place) into `output`
    /// (world * n elements).
    AllGather,
    /// Part `j` of every rank's `input` into part `i` of rank `j`'s `output`.
    AllToAll,
    /// `root`'s `input` (read on the root only) into every rank's `output`.
    Broadcast {
        /// The rank whose input is sent.
        root: usize,
    },
    /// One message between the two ranks of a two-rank communicator, on both of them:
    /// `sender`'s buffer into the other's. Both ranks take part in every message there, so it
    /// is the broadcast kernel rooted at the sender, in place (the sender's buffer is only
    /// read). The signature is the send's on both sides: a send meets only a receive of the
    /// same count and dtype from the same sender, and two ranks that both send (or receive)
    /// at once disagree on the root, which the kernel reports instead of waiting.
    SendRecv {
        /// The rank that sends.
        sender: usize,
    },
    /// `input` holds world * n elements (the whole buffer in place); part `rank` of the
    /// reduction goes to `output` (n elements; in place the own part).
    ReduceScatter(ReduceOp),
    /// The reduction of `n` elements into `root`'s `output`.
    Reduce {
        /// The reduction.
        op: ReduceOp,
        /// The rank whose output receives it.
        root: usize,
    },
}

/// A 32-bit signature of a call that every rank must make alike (collective, dtype, count, root,
/// op); kernels compare it across ranks and report a mismatch.
pub fn signature(
    coll: Collective,
    dtype: DataType,
    count: usize,
    root: usize,
    op: impl AsRef<[u8]>,
) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |b: &[u8]| {
        for x in b {
            h ^= *x as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    eat(&[coll.code(), dtype as u8]);
    eat(&(count as u64).to_le_bytes());
    eat(&(root as u64).to_le_bytes());
    eat(op.as_ref());
    (h ^ (h >> 32)) as u32
}

/// Kernel name suffix and scale factors of a reduction operator (as the all-reduce maps them).
fn op_parts(op: ReduceOp, coll: &'static str) -> Result<(&'static str, Option<f32>, bool)> {
    Ok(match op {
        ReduceOp::Sum => ("sum", None, false),
        ReduceOp::Avg => ("sum", None, true),
        ReduceOp::PremulSum(s) => ("sum", Some(s as f32), false),
        ReduceOp::Prod => ("prod", None, false),
        ReduceOp::Min => ("min", None, false),
        ReduceOp::Max => ("max", None, false),
        other => {
            return Err(Error::Unsupported {
                collective: coll,
                backend: "cuda",
                what: format!("op {other} in the direct-access kernels"),
            })
        }
    })
}

fn op_name(op: ReduceOp) -> String {
    format!("{op}")
}

/// Elements of one piece of the pair-by-pair all-to-all-v (`fc_all_to_all_v_pc`, above two
/// ranks): half a sender slot of `slot_bytes`, at most 1 GiB, in whole 16-byte vectors (so every
/// piece starts on one); so below 2^31 elements (bit 31 of the kernel's data word marks a pair's
/// last piece).
pub(in crate::cuda) fn a2av_pc_piece(slot_bytes: usize, es: usize) -> usize {
    ((slot_bytes / 2).min(1 << 30) / 16 * 16 / es).max(16 / es)
}

/// The largest count `rank` sends to or receives from another rank (its own part is copied
/// locally and never goes through the staging).
pub(in crate::cuda) fn a2av_largest_crossing(rank: usize, splits: &Splits) -> usize {
    (0..splits.send_counts.len())
        .filter(|&p| p != rank)
        .map(|p| splits.send_counts[p].max(splits.recv_counts[p]))
        .max()
        .unwrap_or(0)
}

/// The signature of a two-rank all-to-all-v: both crossing counts in rank order (rank 0 -> 1,
/// rank 1 -> 0), each taken from the rank's own view (what it sends, what it expects), so ranks
/// whose counts do not match get different ones; `what` names the form and anything else the
/// ranks must agree on.
pub(in crate::cuda) fn a2av_pair_signature(
    rank: usize,
    splits: &Splits,
    dtype: DataType,
    what: &str,
) -> u32 {
    let peer = 1 - rank;
    let (out, back) = (splits.send_counts[peer], splits.recv_counts[peer]);
    let (c01, c10) = if rank == 0 { (out, back) } else { (back, out) };
    signature(Collective::AllToAllV, dtype, c01, c10, what)
}

/// Where a two-rank all-to-all-v is cut into launches that each fit the staging: pieces of
/// `chunk` elements of every crossing part, as many as the largest crossing part needs (at least
/// one). The crossing counts are in both ranks' views, so both cut the call alike (more ranks
/// cut it pair by pair inside one kernel, [`a2av_pc_piece`]).
pub(in crate::cuda) fn a2av_pieces(rank: usize, splits: &Splits, chunk: usize) -> usize {
    a2av_largest_crossing(rank, splits)
        .div_ceil(chunk.max(1))
        .max(1)
}

/// Piece `i` of an all-to-all-v cut in pieces of `chunk` elements (see [`a2av_pieces`]): elements
/// `i * chunk ..` of every crossing part, up to `chunk` of them. The own part never goes through
/// the staging (it is copied locally), so it goes whole with piece 0 and empty with the others:
/// the number of pieces depends only on the crossing counts.
pub(in crate::cuda) fn a2av_piece(rank: usize, splits: &Splits, i: usize, chunk: usize) -> Splits {
    let off = i * chunk;
    let cut = |counts: &[usize], displs: &[usize]| -> (Vec<usize>, Vec<usize>) {
        (0..counts.len())
            .map(|p| {
                if p == rank {
                    (if i == 0 { counts[p] } else { 0 }, displs[p])
                } else {
                    let at = off.min(counts[p]);
                    ((counts[p] - at).min(chunk), displs[p] + at)
                }
            })
            .unzip()
    };
    let (send_counts, send_displs) = cut(&splits.send_counts, &splits.send_displs);
    let (recv_counts, recv_displs) = cut(&splits.recv_counts, &splits.recv_displs);
    Splits {
        send_counts,
        send_displs,
        recv_counts,
        recv_displs,
    }
}

impl Dda {
    /// Decodes and clears a bad-input record written by collectives.cu (codes 2..5).
    pub(in crate::cuda) fn take_input_error(
        &self,
        collective: &'static str,
        code: u32,
    ) -> Result<()> {
        // SAFETY: the host page stays mapped for our lifetime; words 1..3 were written before
        // word 0 (the kernel fences between them).
        let (peer, detail) = unsafe {
            (
                std::ptr::read_volatile(self.error_host.add(1)),
                std::ptr::read_volatile(self.error_host.add(2)),
            )
        };
        // SAFETY: as above; clearing word 0 makes the record free for the next report.
        unsafe { std::ptr::write_volatile(self.error_host, 0) };
        let what = match code {
            ERR_MISMATCH => format!(
                "a call that disagrees between ranks reached rank {}: rank {peer} sent signature \
                 or count {detail:#x}, which differs from this rank's (different counts, roots, \
                 dtypes or ops at the same step, or two ranks that both send, or both receive, \
                 at once: pair them in a batch_send_recv)",
                self.rank
            ),
            ERR_PEER_MISMATCH => format!(
                "an all_to_all_v whose counts disagree between ranks: rank {peer} received from \
                 rank {detail} a number of elements other than it expected (reported on every \
                 rank; this is rank {})",
                self.rank
            ),
            ERR_CAPACITY => format!(
                "all_to_all_v_dynamic on rank {}: rank {peer} sent {detail} units (of the \
                 counts), more than the capacity per peer; the part was truncated to the capacity",
                self.rank
            ),
            ERR_INPUT => format!(
                "all_to_all_v_dynamic on rank {}: the send counts add up to {detail} units, more \
                 than the input holds; the parts past the input were truncated",
                self.rank
            ),
            ERR_OUTPUT => format!(
                "all_to_all_v_dynamic_packed on rank {}: the receive counts add up to {detail} \
                 units, more than the output holds; the parts past the output were not written",
                self.rank
            ),
            ERR_SLOT => format!(
                "all_to_all_v_dynamic_packed on rank {}: rank {peer} sent a part of {detail} \
                 units, more than a staging slot holds (FERROCOMM_CUDA_STAGING_BYTES / ranks); \
                 the part was truncated",
                self.rank
            ),
            ERR_PEER_FAULT => {
                let (kind, who) = (detail >> 16, (detail & 0xffff).wrapping_sub(1));
                let found = match kind {
                    ERR_MISMATCH => format!(
                        "received from rank {who} a part whose length differs from the one it \
                         expected (the ranks' counts disagree)"
                    ),
                    ERR_OUTPUT => "has receive counts that add up past its output".into(),
                    ERR_INPUT => "has send counts that add up past its input".into(),
                    ERR_SLOT => {
                        format!("received from rank {who} a part larger than a staging slot")
                    }
                    _ => format!("reported fault {detail:#x}"),
                };
                format!(
                    "all_to_all_v_dynamic_packed: rank {peer} {found}; every rank reports it \
                     (this is rank {})",
                    self.rank
                )
            }
            other => format!("unknown error record {other} (peer {peer}, detail {detail})"),
        };
        Err(Error::InvalidArgument(format!(
            "{collective}: an earlier direct-access call failed: {what}"
        )))
    }

    fn cargs(&self) -> CArgs {
        CArgs {
            scount: [0; MAX_RANKS],
            sdispl: [0; MAX_RANKS],
            rcount: [0; MAX_RANKS],
            rdispl: [0; MAX_RANKS],
            n: 0,
            es: 1,
            slot_bytes: 0,
            bar_off: COLL_BAR_OFF as u64,
            dyn_send: 0,
            dyn_recv: 0,
            cap: 0,
            in_count: 0,
            root: 0,
            sig: 0,
            count_bytes: 8,
            count_flags: 0,
            rounds: 1,
        }
    }

    fn max_blocks(&self) -> usize {
        (self.sm_count as usize).clamp(1, MAX_BLOCKS)
    }

    /// Grid of an LL call with parts of `part_bytes` (256 threads, one 8-byte unit each).
    fn ll_grid(&self, part_bytes: usize) -> (u32, u32) {
        let units = part_bytes.div_ceil(8).max(1);
        (units.div_ceil(256).clamp(1, self.max_blocks()) as u32, 256)
    }

    /// Grid of a staged call: it must be the same on every rank (per-block barrier), so it
    /// depends only on the part size every rank shares.
    fn st_grid(&self, part_bytes: usize) -> (u32, u32) {
        let nvec = part_bytes.div_ceil(16).max(1);
        (nvec.div_ceil(512).clamp(1, self.max_blocks()) as u32, 512)
    }

    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        dtype: DataType,
        name: &str,
        mut a: Args,
        mut c: CArgs,
        grid: (u32, u32),
        stream: u64,
        what: impl FnOnce() -> String,
    ) -> Result<()> {
        let f = self.func(dtype, name)?;
        let mut params: [*mut c_void; 2] =
            [(&mut a as *mut Args).cast(), (&mut c as *mut CArgs).cast()];
        // SAFETY: `f` takes (Args, CArgs) by value, laid out as in the kernel source, and starts
        // with pdl_wait(); the user pointers were validated by the communicator and the backend
        // (device memory of this GPU, sizes checked), the staging offsets come from our own
        // layout.
        unsafe {
            launch(f, grid.0, grid.1, stream, &mut params, self.pdl, || {
                format!("launching {}", what())
            })
        }
    }

    /// Byte kernels live in every module; any dtype (fp8, int8 too) uses the f32 one.
    const MOVE_MODULE: DataType = DataType::F32;

    /// One call of the part kernels: `fc_<kernel>_ll[_<op>]` (NCCL-LL lines, no barrier) when
    /// a part of `n` elements fits the push buffer, `fc_<kernel>_st[_<op>]` (staged, per-block
    /// barriers) otherwise, as `parts` says. The part size, the element size, the root and the
    /// call's signature go into the collective arguments; the grid follows the part size (the
    /// same on every rank). `n` is the elements per rank (all-gather, reduce-scatter), per part
    /// (all-to-all: input and output hold world * n) or of the whole buffer (broadcast,
    /// reduce, a message); see [`PartCall`] for where `input` and `output` are read and written.
    #[allow(clippy::too_many_arguments)]
    pub fn coll_part(
        &self,
        call: PartCall,
        input: u64,
        output: u64,
        n: usize,
        dtype: DataType,
        parts: PartForm,
        stream: u64,
    ) -> Result<()> {
        use PartCall as P;
        let (coll, kernel, root, op) = match call {
            P::AllGather => (Collective::AllGather, "all_gather", 0, None),
            P::AllToAll => (Collective::AllToAll, "all_to_all", 0, None),
            P::Broadcast { root } => (Collective::Broadcast, "broadcast", root, None),
            P::SendRecv { sender } => (Collective::Send, "broadcast", sender, None),
            P::ReduceScatter(op) => (Collective::ReduceScatter, "reduce_scatter", 0, Some(op)),
            P::Reduce { op, root } => (Collective::Reduce, "reduce", root, Some(op)),
        };
        let (a, module, opname) = match op {
            Some(op) => {
                let (a, name) = self.reduction_args(input, output, n, op, kernel)?;
                (a, dtype, Some(name))
            }
            None => (
                self.base_args(input, output, n as u64),
                Self::MOVE_MODULE,
                None,
            ),
        };
        let sig = signature(coll, dtype, n, root, op.map(op_name).unwrap_or_default());
        let part = n * dtype.size();
        let mut c = self.cargs();
        c.n = n as u64;
        c.es = dtype.size() as u64;
        c.slot_bytes = round16(part) as u64;
        c.root = root as u32;
        c.sig = sig;
        let PartForm { form, rounds } = parts;
        c.rounds = rounds;
        let grid = if form == PartKind::Ll {
            self.ll_grid(part)
        } else {
            self.st_grid(part)
        };
        let mut buf = [0; 64];
        let name = part_kernel(&mut buf, kernel, form.kernel(), opname);
        self.launch(module, name, a, c, grid, stream, || match call {
            P::AllGather => format!("all_gather ({dtype}, {n} elements per rank)"),
            P::AllToAll => format!("all_to_all ({dtype}, {n} elements per part)"),
            P::Broadcast { root } => format!("broadcast ({dtype}, {n} elements, root {root})"),
            P::SendRecv { sender } => {
                let receiver = 1 - sender;
                format!("send ({dtype}, {n} elements, rank {sender} to rank {receiver})")
            }
            P::ReduceScatter(op) => {
                format!("reduce_scatter ({dtype} {op}, {n} elements per rank)")
            }
            P::Reduce { op, root } => {
                format!("reduce ({dtype} {op}, {n} elements, root {root})")
            }
        })
    }

    /// The arguments of a reducing kernel (PremulSum factor, Avg divisor) and the op's kernel
    /// suffix; ops the kernels lack are refused naming `coll`.
    pub(in crate::cuda) fn reduction_args(
        &self,
        input: u64,
        output: u64,
        n: usize,
        op: ReduceOp,
        coll: &'static str,
    ) -> Result<(Args, &'static str)> {
        let (opname, pre, div) = op_parts(op, coll)?;
        let mut a = self.base_args(input, output, n as u64);
        if let Some(s) = pre {
            a.has_pre = 1;
            a.pre = s;
        }
        if div {
            a.has_div = 1;
            a.post_div = self.world as f32;
            a.int_div = self.world as i64;
        }
        Ok((a, opname))
    }

    /// Grid of the all-to-all-v kernels: fixed, because ranks do not know each other's totals.
    fn a2av_grid(&self) -> (u32, u32) {
        ((self.sm_count as usize / 2).clamp(1, 64) as u32, 512)
    }

    /// Staging bytes per sender slot of all-to-all-v.
    pub fn a2av_slot(&self) -> usize {
        a2av_slot_bytes(self.layout().staging_bytes, self.world)
    }

    /// All-to-all-v with host counts (validated by the communicator) in the plan's `form`: at two
    /// ranks in LL lines or one launch per piece of a staging slot (see [`a2av_pieces`]); above
    /// two ranks one launch that moves every pair's part in pieces of half a slot (see
    /// [`a2av_pc_piece`]).
    pub fn coll_all_to_all_v(
        &self,
        input: u64,
        output: u64,
        splits: &Splits,
        dtype: DataType,
        form: A2avForm,
        stream: u64,
    ) -> Result<()> {
        let es = dtype.size();
        match form {
            A2avForm::Pairs => return self.pc_all_to_all_v(input, output, splits, dtype, stream),
            A2avForm::Lines => return self.ll_all_to_all_v(input, output, splits, dtype, stream),
            A2avForm::Pieces => {}
            A2avForm::DeviceCounts => {
                return Err(Error::InvalidArgument(
                    "all_to_all_v: host counts planned as device counts".into(),
                ))
            }
        }
        let chunk = self.a2av_slot() / es;
        let pieces = a2av_pieces(self.rank, splits, chunk);
        for i in 0..pieces {
            let s = a2av_piece(self.rank, splits, i, chunk);
            let mut c = self.a2av_cargs(&s, es);
            if self.world == 2 {
                // Both crossing counts and the piece: a mismatch is seen by both ranks.
                c.sig = a2av_pair_signature(self.rank, splits, dtype, &format!("piece {i}"));
            }
            let a = self.base_args(input, output, 0);
            // Every rank knows the piece's crossing counts: a grid as wide as the staged
            // all-to-all's for that size, never narrower than the fixed one (the own part,
            // which only this rank knows, is copied by the same grid).
            let (st, _) = self.st_grid(a2av_largest_crossing(self.rank, &s) * es);
            let grid = (st.max(self.a2av_grid().0), 512);
            self.launch(
                Self::MOVE_MODULE,
                "fc_all_to_all_v_st",
                a,
                c,
                grid,
                stream,
                || format!("all_to_all_v ({dtype}), piece {i} of {pieces}"),
            )?;
        }
        Ok(())
    }

    /// Kernel arguments holding the counts and displacements of `s` (elements of `es` bytes) and
    /// the all-to-all-v's staging slot per sender ([`Self::a2av_slot`]; the LL kernel has none).
    fn a2av_cargs(&self, s: &Splits, es: usize) -> CArgs {
        let mut c = self.cargs();
        c.slot_bytes = self.a2av_slot() as u64;
        for p in 0..self.world {
            c.scount[p] = s.send_counts[p] as u64;
            c.sdispl[p] = s.send_displs[p] as u64;
            c.rcount[p] = s.recv_counts[p] as u64;
            c.rdispl[p] = s.recv_displs[p] as u64;
        }
        c.es = es as u64;
        c
    }

    /// An all-to-all-v above two ranks: one launch on the fixed grid, every pair's part in pieces
    /// of half a slot (kernels/collectives.cu, `fc_all_to_all_v_pc`).
    fn pc_all_to_all_v(
        &self,
        input: u64,
        output: u64,
        splits: &Splits,
        dtype: DataType,
        stream: u64,
    ) -> Result<()> {
        let mut c = self.a2av_cargs(splits, dtype.size());
        c.n = a2av_pc_piece(self.a2av_slot(), dtype.size()) as u64;
        let a = self.base_args(input, output, 0);
        self.launch(
            Self::MOVE_MODULE,
            "fc_all_to_all_v_pc",
            a,
            c,
            self.a2av_grid(),
            stream,
            || format!("all_to_all_v ({dtype}, {} ranks, pair by pair)", self.world),
        )
    }

    /// A two-rank all-to-all-v whose crossing parts fit LL lines (the choice depends only on
    /// the crossing counts, which both ranks see): one launch, no barrier, a signature over both
    /// crossing counts. The grid is this rank's own (LL needs none in common), sized by its
    /// largest part, the own one included.
    fn ll_all_to_all_v(
        &self,
        input: u64,
        output: u64,
        splits: &Splits,
        dtype: DataType,
        stream: u64,
    ) -> Result<()> {
        let es = dtype.size();
        let mut c = self.a2av_cargs(splits, es);
        c.sig = a2av_pair_signature(self.rank, splits, dtype, "ll");
        let largest = (0..self.world)
            .map(|p| splits.send_counts[p].max(splits.recv_counts[p]))
            .max()
            .unwrap_or(0);
        let a = self.base_args(input, output, 0);
        self.launch(
            Self::MOVE_MODULE,
            "fc_all_to_all_v_ll",
            a,
            c,
            self.ll_grid(largest * es),
            stream,
            || format!("all_to_all_v ({dtype}, LL)"),
        )
    }

    /// All-to-all-v with counts in device memory (see `Communicator::all_to_all_v_dynamic`,
    /// and with `packed` `Communicator::all_to_all_v_dynamic_packed`, where `capacity` is the
    /// whole output): `in_count` and `capacity` in units of `unit` elements. The kernel moves
    /// whole units (its element is the unit, of any byte length and alignment).
    #[allow(clippy::too_many_arguments)]
    pub fn coll_all_to_all_dynamic(
        &self,
        input: u64,
        in_count: usize,
        output: u64,
        capacity: usize,
        unit: usize,
        packed: bool,
        send_counts: u64,
        recv_counts: u64,
        count_dtype: DataType,
        dtype: DataType,
        stream: u64,
    ) -> Result<()> {
        let es = dtype.size() * unit;
        let slot = self.a2av_slot();
        if !packed && capacity * es > slot {
            let of = if unit == 1 {
                format!("{dtype} elements")
            } else {
                format!("units of {unit} {dtype} elements")
            };
            return Err(Error::InvalidArgument(format!(
                "all_to_all_v_dynamic: a capacity of {capacity} {of} per peer needs {} bytes \
                 per peer, more than the {slot} bytes of staging per peer \
                 (FERROCOMM_CUDA_STAGING_BYTES / ranks)",
                capacity * es
            )));
        }
        let mut c = self.cargs();
        c.es = es as u64;
        c.slot_bytes = slot as u64;
        c.cap = capacity as u64;
        c.in_count = in_count as u64;
        c.dyn_send = send_counts;
        c.dyn_recv = recv_counts;
        c.count_bytes = count_dtype.size() as u32;
        c.count_flags = if matches!(count_dtype, DataType::I32 | DataType::I64) {
            DYN_SIGNED
        } else {
            0
        } | if packed { DYN_PACKED } else { 0 };
        // Parts up to this many bytes go in LL lines after their count, larger ones through
        // the staging (a pair's choice, by the count its sender announces: kernels/collectives.cu).
        // The last line of a sender's row carries the verdict.
        c.n = self.layout().ll_max.min(self.layout().push_cap - 16) as u64;
        c.sig = signature(
            Collective::AllToAllV,
            DataType::U8,
            es,
            packed as usize,
            "device counts",
        );
        let a = self.base_args(input, output, 0);
        self.launch(
            Self::MOVE_MODULE,
            "fc_all_to_all_dyn",
            a,
            c,
            self.a2av_grid(),
            stream,
            || format!("all_to_all_v_dynamic ({dtype}, capacity {capacity} x {unit})"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tuning::Tuning;
    use crate::cuda::kernels;
    use crate::plan::{
        self, part_form, st_rounds, staged_need, Algo, CudaCaps, Engine, LowPrecisionChoice, Plan,
        COLL_MAX_ROUNDS,
    };

    /// The built-in table's LL limit.
    fn ll_max() -> usize {
        Tuning::builtin().ll_max_bytes
    }

    /// Every rank's view of one all-to-all-v: its row (send) and column (receive) of `m`.
    fn views(m: &[Vec<usize>]) -> Vec<Splits> {
        (0..m.len())
            .map(|r| Splits::packed(m[r].clone(), m.iter().map(|row| row[r]).collect()))
            .collect()
    }

    /// The plan `rank` of `m.len()` ranks takes for its view `s` of the all-to-all-v of `m`
    /// (u8 elements, out of place, or in place), as the communicator asks for it.
    fn a2av_plan_of(rank: usize, s: &Splits, world: usize, in_place: bool) -> Plan {
        use crate::backend::CallKind;
        use crate::view::{Input, View, ViewMut};
        let cfg = crate::config::Config::default();
        let kernels = [DataType::U8];
        let caps = CudaCaps {
            world,
            dda: Some(crate::cuda::dda_caps(&cfg, world, None, false)),
            no_dda: "off",
            nccl: true,
            no_nccl: "absent",
            multi_host: false,
            kernel_dtypes: &kernels,
        };
        let input = vec![0u8; s.send_counts.iter().sum::<usize>()];
        let mut output = vec![0u8; s.recv_counts.iter().sum::<usize>().max(input.len())];
        let kind = CallKind::AllToAllV {
            input: if in_place {
                Input::InPlace
            } else {
                Input::Buf(View::host(&input))
            },
            output: ViewMut::host(&mut output),
            splits: s,
        };
        let shape = kind.plan_shape(rank, world);
        let (auto, default) = (Algo::Auto, LowPrecisionChoice::Default);
        plan::cuda_call_plan(&caps, &cfg, &shape, auto, default).unwrap()
    }

    #[test]
    fn all_to_all_v_plans_agree_between_ranks() {
        // Two ranks: skewed counts, own parts far larger than the crossing ones, zeros.
        for m in [
            vec![vec![5_000_000, 10], vec![3, 7]],
            vec![vec![0, 0], vec![0, 9_000_000]],
            vec![vec![1, 300_000], vec![4_194_305, 1]],
            vec![vec![1, 100], vec![200, 1]],
        ] {
            let plans: Vec<_> = views(&m)
                .iter()
                .enumerate()
                .map(|(r, s)| a2av_plan_of(r, s, 2, false))
                .collect();
            assert!(plans.iter().all(|p| *p == plans[0]), "{m:?}: {plans:?}");
            // The form follows the largest crossing part against the LL limit.
            let cross = m[0][1].max(m[1][0]);
            let want = if cross <= ll_max() {
                A2avForm::Lines
            } else {
                A2avForm::Pieces
            };
            assert_eq!(plans[0].a2av, Some(want), "{m:?}");
        }
        // The old rule (the larger of a rank's send and receive totals) split this call: rank 0
        // saw 20 MiB, rank 1 11 MiB, on both sides of the 16 MiB default.
        let mib = 1 << 20;
        let m = vec![vec![10 * mib, 10 * mib], vec![mib, mib]];
        let v = views(&m);
        assert_eq!(
            a2av_plan_of(0, &v[0], 2, false),
            a2av_plan_of(1, &v[1], 2, false)
        );
        // More than two: no size is seen by every rank, and the plan takes none (pair by pair
        // by direct access where forced; NCCL's by default, the same on every rank).
        let three = views(&[vec![1, 2, 3], vec![4, 5, 6], vec![7, 8_000_000, 9]]);
        let plans: Vec<_> = (0..3)
            .map(|r| a2av_plan_of(r, &three[r], 3, false))
            .collect();
        assert!(plans.iter().all(|p| *p == plans[0]), "{plans:?}");
        assert_eq!(plans[0].engine, Engine::Nccl);
        // In place with counts that differ from the receive counts (seen alike by both ranks
        // at two): NCCL's; with counts that keep every part's size: direct access.
        let uneven = views(&[vec![4, 6], vec![2, 8]]);
        let even = views(&[vec![4, 6], vec![6, 8]]);
        for r in 0..2 {
            assert_eq!(a2av_plan_of(r, &uneven[r], 2, true).engine, Engine::Nccl);
            assert_eq!(
                a2av_plan_of(r, &even[r], 2, true).a2av,
                Some(A2avForm::Lines)
            );
        }
    }

    #[test]
    fn pair_by_pair_pieces_are_whole_vectors_within_half_a_slot() {
        for slot in [16usize, 48, 1 << 20, (64 << 20) / 3 / 16 * 16, 1 << 40] {
            for es in [1usize, 2, 4, 8] {
                let p = a2av_pc_piece(slot, es);
                assert!(p >= 1 && (p * es) % 16 == 0, "slot {slot} es {es}: {p}");
                assert!(p * es <= (slot / 2).max(16), "slot {slot} es {es}: {p}");
                assert!(p < 1 << 31, "slot {slot} es {es}: {p}");
            }
        }
        assert_eq!(a2av_pc_piece(1 << 20, 2), 1 << 18);
    }

    #[test]
    fn all_to_all_v_pieces_cover_every_part_once_and_agree_between_ranks() {
        // Skewed, zero and odd counts, own parts far larger than the crossing ones; gaps
        // between the parts (displacements that are not packed).
        for m in [
            vec![vec![5_000, 10], vec![3, 7]],
            vec![vec![0, 0], vec![0, 9_001]],
            vec![vec![1, 4_096], vec![4_097, 100_000]],
            vec![vec![7, 0], vec![0, 7]],
        ] {
            let mut v = views(&m);
            for (r, s) in v.iter_mut().enumerate() {
                s.send_displs = s
                    .send_displs
                    .iter()
                    .enumerate()
                    .map(|(p, d)| d + 3 * p + r)
                    .collect();
                s.recv_displs = s
                    .recv_displs
                    .iter()
                    .enumerate()
                    .map(|(p, d)| d + 5 * p)
                    .collect();
            }
            for chunk in [1000, 4096, 1 << 20] {
                let n = a2av_pieces(0, &v[0], chunk);
                assert_eq!(n, a2av_pieces(1, &v[1], chunk), "{m:?} {chunk}");
                assert_eq!(n, (m[0][1].max(m[1][0])).div_ceil(chunk).max(1));
                // Elements of every part, by displacement, each covered once.
                let mut seen: Vec<[Vec<u32>; 2]> = v
                    .iter()
                    .map(|s| {
                        let len = |c: &[usize], d: &[usize]| c[1] + d[1];
                        [
                            vec![0; len(&s.send_counts, &s.send_displs)],
                            vec![0; len(&s.recv_counts, &s.recv_displs)],
                        ]
                    })
                    .collect();
                for i in 0..n {
                    let ps: Vec<Splits> = (0..2).map(|r| a2av_piece(r, &v[r], i, chunk)).collect();
                    for r in 0..2 {
                        let q = 1 - r;
                        // What r sends q in this piece is what q expects from r.
                        assert_eq!(ps[r].send_counts[q], ps[q].recv_counts[r], "{m:?} {i}");
                        assert!(ps[r].send_counts[q] <= chunk);
                        // The own part: whole in piece 0, empty after.
                        let own = if i == 0 { m[r][r] } else { 0 };
                        assert_eq!((ps[r].send_counts[r], ps[r].recv_counts[r]), (own, own));
                        for p in 0..2 {
                            let s = &ps[r];
                            for k in 0..s.send_counts[p] {
                                seen[r][0][s.send_displs[p] + k] += 1;
                            }
                            for k in 0..s.recv_counts[p] {
                                seen[r][1][s.recv_displs[p] + k] += 1;
                            }
                        }
                    }
                }
                for r in 0..2 {
                    for (side, counts, displs) in [
                        (0, &v[r].send_counts, &v[r].send_displs),
                        (1, &v[r].recv_counts, &v[r].recv_displs),
                    ] {
                        for p in 0..2 {
                            let part = &seen[r][side][displs[p]..displs[p] + counts[p]];
                            assert!(
                                part.iter().all(|&x| x == 1),
                                "{m:?} {chunk} rank {r} part {p}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn every_part_kernel_launched_exists() {
        let entries = kernels::entry_names();
        // Every form `part_form` picks, on both sides of each of its size bounds, names a kernel
        // that exists.
        let t = Tuning::builtin();
        let mut sizes = vec![0, 100, ll_max(), ll_max() + 1, 64 << 20];
        for k in [
            "all_gather",
            "all_to_all",
            "broadcast",
            "reduce_scatter",
            "reduce",
        ] {
            if let Some(min) = t.pipe_min(k) {
                sizes.extend([min - 1, min]);
            }
        }
        assert!(sizes.len() >= 11, "the three pipelined collectives' bounds");
        for part in sizes {
            let form = |k| part_form(&t, k, part, ll_max()).0.kernel();
            for k in ["all_gather", "all_to_all", "broadcast"] {
                let mut buf = [0; 64];
                let name = part_kernel(&mut buf, k, form(k), None);
                assert!(entries.iter().any(|e| e == name), "{name}");
            }
            for op in ["sum", "prod", "min", "max"] {
                for k in ["reduce_scatter", "reduce"] {
                    let mut buf = [0; 64];
                    let name = part_kernel(&mut buf, k, form(k), Some(op));
                    assert!(entries.iter().any(|e| e == name), "{name}");
                }
            }
        }
        let mut buf = [0; 64];
        let bad = part_kernel(&mut buf, "all_gather", "xx", None);
        assert!(!entries.iter().any(|e| e == bad));
    }

    #[test]
    fn large_data_moves_and_scatters_are_pipelined() {
        let cap = ll_max();
        let t = Tuning::builtin();
        // (collective, bytes of a part, the form expected)
        let table = [
            ("all_gather", 100, (PartKind::Ll, 1)),
            ("reduce_scatter", 100, (PartKind::Ll, 1)),
            ("reduce", cap + 1, (PartKind::Staged, 1)),
            ("all_gather", (8 << 20) - 1, (PartKind::Staged, 1)),
            ("all_gather", 8 << 20, (PartKind::Pipelined, 2)),
            ("all_gather", 16 << 20, (PartKind::Pipelined, 4)),
            ("reduce_scatter", 8 << 20, (PartKind::Staged, 1)),
            ("reduce_scatter", (16 << 20) - 1, (PartKind::Staged, 1)),
            ("reduce_scatter", 16 << 20, (PartKind::Pipelined, 4)),
            ("reduce_scatter", 32 << 20, (PartKind::Pipelined, 8)),
            ("all_gather", 64 << 20, (PartKind::Pipelined, 8)),
            ("all_to_all", (8 << 20) - 1, (PartKind::Staged, 1)),
            ("all_to_all", (8 << 20) + 6, (PartKind::Pipelined, 3)),
            ("all_to_all", 32 << 20, (PartKind::Pipelined, 8)),
            ("broadcast", 64 << 20, (PartKind::Staged, 1)),
            ("reduce", 64 << 20, (PartKind::Staged, 1)),
        ];
        for (k, part, want) in table {
            assert_eq!(part_form(&t, k, part, cap), want, "{k} of {part} bytes");
        }
    }

    #[test]
    fn rounds_follow_the_part_size() {
        let mb = 1 << 20;
        assert_eq!(st_rounds(0, 2 * mb), 1);
        assert_eq!(st_rounds(16, 2 * mb), 1);
        assert_eq!(st_rounds(2 * mb, 2 * mb), 1);
        assert_eq!(st_rounds(2 * mb + 1, 2 * mb), 2);
        assert_eq!(st_rounds(8 * mb, 2 * mb), 4);
        assert_eq!(st_rounds(16 * mb, 2 * mb), COLL_MAX_ROUNDS as u32);
        assert_eq!(st_rounds(64 * mb, 2 * mb), COLL_MAX_ROUNDS as u32);
        assert_eq!(st_rounds(100, 1), COLL_MAX_ROUNDS as u32);
        assert_eq!(st_rounds(100, 0), COLL_MAX_ROUNDS as u32);
        // The kernels index their barrier words with the same bound.
        let def = format!("#define FC_MAX_ROUNDS {COLL_MAX_ROUNDS} ");
        assert!(crate::cuda::kernels::COLLECTIVES_SOURCE.contains(&def));
    }

    #[test]
    fn cargs_layout_matches_the_kernel() {
        // 4 arrays of 16 u64, 8 u64, 5 u32 (padded to 8 bytes).
        assert_eq!(std::mem::size_of::<CArgs>(), 4 * 16 * 8 + 8 * 8 + 6 * 4);
        assert_eq!(std::mem::align_of::<CArgs>(), 8);
        let src = crate::cuda::kernels::COLLECTIVES_SOURCE;
        assert_eq!(
            std::mem::size_of::<CArgs>(),
            crate::cuda::dda::c_struct_size(src, "CArgs")
        );
    }

    #[test]
    fn both_ranks_run_a_batch_in_one_order() {
        // Rank 0: send a, recv b, send c; rank 1: recv a, send b, recv c (sends true).
        let (r0, r1) = ([true, false, true], [false, true, false]);
        let o0 = two_rank_batch_order(0, r0.into_iter());
        let o1 = two_rank_batch_order(1, r1.into_iter());
        assert_eq!(o0, vec![(0, 0), (2, 0), (1, 1)]);
        assert_eq!(o1, vec![(0, 0), (2, 0), (1, 1)]);
        // Every call pairs a send with a receive of the same sender, message for message.
        for ((k0, s0), (k1, s1)) in o0.iter().zip(&o1) {
            assert_eq!(s0, s1);
            assert_ne!(r0[*k0], r1[*k1]);
        }
        // A batch that only receives, against single sends on the other rank.
        assert_eq!(
            two_rank_batch_order(0, [false, false].into_iter()),
            vec![(0, 1), (1, 1)]
        );
        assert!(two_rank_batch_order(1, std::iter::empty()).is_empty());
    }

    #[test]
    fn signatures_separate_what_ranks_must_agree_on() {
        let s = signature(Collective::AllGather, DataType::BF16, 1000, 0, "");
        assert_eq!(
            s,
            signature(Collective::AllGather, DataType::BF16, 1000, 0, "")
        );
        assert_ne!(
            s,
            signature(Collective::AllGather, DataType::BF16, 1001, 0, "")
        );
        assert_ne!(
            s,
            signature(Collective::AllGather, DataType::F16, 1000, 0, "")
        );
        assert_ne!(
            s,
            signature(Collective::AllToAll, DataType::BF16, 1000, 0, "")
        );
        assert_ne!(
            signature(Collective::Broadcast, DataType::U8, 7, 0, ""),
            signature(Collective::Broadcast, DataType::U8, 7, 1, "")
        );
        assert_ne!(
            signature(Collective::Reduce, DataType::F32, 7, 0, "sum"),
            signature(Collective::Reduce, DataType::F32, 7, 0, "max")
        );
    }

    #[test]
    fn staging_needs_and_protocol_choice() {
        // One 16-byte-rounded slot per sender; broadcast needs one slot.
        assert_eq!(staged_need(Collective::AllGather, 1, 2), Some(32));
        assert_eq!(staged_need(Collective::ReduceScatter, 48, 4), Some(192));
        assert_eq!(staged_need(Collective::Broadcast, 17, 8), Some(32));
        assert_eq!(staged_need(Collective::Reduce, 0, 2), Some(0));
        assert_eq!(staged_need(Collective::AllToAllV, 100, 2), None);
        assert_eq!(a2av_slot_bytes(64 << 20, 3), (64 << 20) / 3 / 16 * 16);
        assert_eq!(a2av_slot_bytes(1000, 2) % 16, 0);
        assert!(plan::a2av_takes_ll(0, ll_max()));
        assert!(plan::a2av_takes_ll(ll_max(), ll_max()));
        assert!(!plan::a2av_takes_ll(ll_max() + 1, ll_max()));
        assert!(!plan::a2av_takes_ll(4096, 2048));
    }

    #[test]
    fn op_mapping_follows_the_all_reduce() {
        assert_eq!(op_parts(ReduceOp::Avg, "x").unwrap(), ("sum", None, true));
        assert_eq!(
            op_parts(ReduceOp::PremulSum(0.5), "x").unwrap(),
            ("sum", Some(0.5), false)
        );
        assert_eq!(op_parts(ReduceOp::Min, "x").unwrap().0, "min");
        assert!(op_parts(ReduceOp::BitAnd, "x").is_err());
    }
}
