//! The host algorithms, chunked through the staging slots.
//!
//! Every rank has one slot of `slot_bytes`. A message larger than what one round can stage is
//! processed in chunks; all ranks derive the same chunking from the agreed signature. For the
//! collectives where every rank sends a different part to every peer (reduce-scatter,
//! all-to-all), a slot is cut into one region per peer.

use std::sync::atomic::Ordering;

use super::shm::LINE;
use super::{Bufs, HostBackend, Running, Signature};
use crate::backend::{DeviceCounts, Splits};
use crate::error::{Error, Result};
use crate::plan::{Algo, Collective, Plan};
use crate::reduce::reduce_bytes;
use crate::types::{read_count, write_count, DataType, ReduceOp};

/// `len` bytes at `ptr` as a slice.
///
/// # Safety
/// The bytes must be readable and, for the borrow, not written by anyone (the barrier
/// protocol guarantees this for a peer's slot between the barriers that publish and retire it).
pub(super) unsafe fn shared<'a>(ptr: *const u8, len: usize) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: per the caller's promise.
    unsafe { std::slice::from_raw_parts(ptr, len) }
}

/// `len` writable bytes at `ptr` as a slice.
///
/// # Safety
/// The bytes must be writable and accessed by nothing else for the borrow.
pub(super) unsafe fn exclusive<'a>(ptr: *mut u8, len: usize) -> &'a mut [u8] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: per the caller's promise.
    unsafe { std::slice::from_raw_parts_mut(ptr, len) }
}

/// Copies `len` bytes (nothing when `len` is 0, whatever the pointers).
///
/// # Safety
/// Both ranges must be valid, must not overlap, and must not be accessed concurrently.
pub(super) unsafe fn copy(src: *const u8, dst: *mut u8, len: usize) {
    if len > 0 {
        // SAFETY: per the caller's promise.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
    }
}

/// Bytes of one per-peer region when a slot is cut into `parts` regions (cache-line multiples
/// so that every region starts aligned).
pub(super) fn region_bytes(slot: usize, parts: usize) -> usize {
    let r = slot / parts;
    if r >= LINE {
        r / LINE * LINE
    } else {
        r / 8 * 8
    }
}

/// Stripe `r` of `n` over `len` elements, each stripe a multiple of `align` elements.
pub(super) fn stripe(len: usize, n: usize, r: usize, align: usize) -> (usize, usize) {
    let st = len.div_ceil(n).div_ceil(align) * align;
    let lo = (r * st).min(len);
    let hi = ((r + 1) * st).min(len);
    (lo, hi)
}

impl HostBackend {
    /// Reduces `len` elements at byte offset `at` of every rank's slot, in rank order 0..n-1 (so
    /// every rank that does it gets the same bits), into `dst`.
    ///
    /// # Safety
    /// Those slot bytes must be stable (between barriers), and `dst` must hold `len` elements
    /// that nothing else accesses meanwhile.
    unsafe fn reduce_slots(
        &self,
        dtype: DataType,
        op: ReduceOp,
        at: usize,
        len: usize,
        dst: *mut u8,
    ) -> Result<()> {
        let bytes = len * dtype.size();
        let ins: Vec<&[u8]> = (0..self.world)
            // SAFETY: per the caller: stable slot bytes.
            .map(|r| unsafe { shared(self.seg.slot(r).add(at), bytes) })
            .collect();
        // SAFETY: per the caller: `dst` is this call's own.
        let dst = unsafe { exclusive(dst, bytes) };
        reduce_bytes(dtype, op, &ins, dst)
    }

    /// Runs a chunked collective over `count` elements, `chunk` at a time: stage chunk 0 before
    /// the start barrier (its release also publishes the staged data), then per chunk: stage
    /// and barrier (after the first), consume, barrier (the consumed slots may be reused only
    /// after every rank has read them). `stage` and `consume` get the chunk's first element and
    /// its length.
    pub(super) fn chunked(
        &self,
        sig: &Signature,
        count: usize,
        chunk: usize,
        mut stage: impl FnMut(usize, usize),
        mut consume: impl FnMut(&mut Running<'_>, usize, usize) -> Result<()>,
    ) -> Result<()> {
        let nchunks = count.div_ceil(chunk);
        let range = |k: usize| (k * chunk, chunk.min(count - k * chunk));
        let mut call = self.begin(sig.coll)?;
        if nchunks > 0 {
            let (off, len) = range(0);
            stage(off, len);
        }
        call.start(sig)?;
        for k in 0..nchunks {
            let (off, len) = range(k);
            if k > 0 {
                stage(off, len);
                call.barrier()?;
            }
            consume(&mut call, off, len)?;
            call.barrier()?;
        }
        call.finish()
    }

    /// [`Self::chunked`] with a staging step that can fail (low-precision encoding). A rank
    /// that left the barrier protocol early would stall its peers, so every chunk still runs
    /// and the first staging error is returned once the call is over.
    pub(super) fn chunked_fallible(
        &self,
        sig: &Signature,
        count: usize,
        chunk: usize,
        mut stage: impl FnMut(usize, usize) -> Result<()>,
        consume: impl FnMut(&mut Running<'_>, usize, usize) -> Result<()>,
    ) -> Result<()> {
        let mut staged: Option<Error> = None;
        let stage = |off: usize, len: usize| {
            if let Err(e) = stage(off, len) {
                staged.get_or_insert(e);
            }
        };
        self.chunked(sig, count, chunk, stage, consume)?;
        staged.map_or(Ok(()), Err)
    }

    fn regions_for(&self, coll: Collective) -> Result<usize> {
        let region = region_bytes(self.seg.layout.slot_bytes, self.world);
        if region == 0 {
            return Err(Error::InvalidArgument(format!(
                "{}: FERROCOMM_HOST_SLOT_BYTES={} is too small for {} ranks",
                coll.name(),
                self.seg.layout.slot_bytes,
                self.world
            )));
        }
        Ok(region)
    }

    pub(super) fn all_reduce_impl(
        &self,
        bufs: &Bufs,
        dtype: DataType,
        count: usize,
        op: ReduceOp,
        plan: &Plan,
    ) -> Result<()> {
        let (coll, algo) = (Collective::AllReduce, plan.algo);
        if let Some(codec) = &plan.low_precision {
            return self.all_reduce_lp(bufs, dtype, count, op, algo, codec);
        }
        let (es, me, n, seg) = (dtype.size(), self.rank, self.world, &self.seg);
        let chunk = seg.layout.slot_bytes / es;
        let sig = Signature {
            op: Some(op),
            algo,
            ..Signature::of(coll, dtype, count)
        };
        let stage = |off: usize, len: usize| {
            // SAFETY: the input holds `count` elements; our own slot is ours until the barrier
            // that publishes it, and no peer reads it before then.
            unsafe { copy(bufs.input.add(off * es), seg.slot(me), len * es) }
        };
        match algo {
            Algo::Tree => {
                // Stripes of whole cache lines, so no two owners share a line of `reduced`.
                let align = (LINE / es).max(1);
                self.chunked(&sig, count, chunk, stage, |call, off, len| {
                    // Reduce-scatter: this rank reduces stripe `me` of every slot, in rank order.
                    let (lo, hi) = stripe(len, n, me, align);
                    // SAFETY: after the barrier no rank writes its slot until the end barrier;
                    // stripe `me` of `reduced` is written by this rank alone.
                    unsafe {
                        self.reduce_slots(dtype, op, lo * es, hi - lo, seg.reduced().add(lo * es))
                    }?;
                    call.barrier()?;
                    // All-gather: every rank, the owners included, copies the same reduced
                    // stripes, so results agree bit for bit (docs/design.md, rule 5).
                    // SAFETY: `reduced` is complete and unchanged until the end barrier; the
                    // output chunk is this call's own.
                    unsafe { copy(seg.reduced(), bufs.output.add(off * es), len * es) };
                    Ok(())
                })
            }
            _ => self.chunked(&sig, count, chunk, stage, |_, off, len| {
                // Flat: every rank reduces all slots in rank order 0..n-1.
                // SAFETY: slots are stable between this chunk's barriers; in place, the input
                // chunk was staged already, so overwriting it is fine; the output chunk belongs
                // to this call.
                unsafe { self.reduce_slots(dtype, op, 0, len, bufs.output.add(off * es)) }
            }),
        }
    }

    pub(super) fn reduce_impl(
        &self,
        bufs: &Bufs,
        dtype: DataType,
        count: usize,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let (es, me, seg) = (dtype.size(), self.rank, &self.seg);
        let chunk = seg.layout.slot_bytes / es;
        let sig = Signature {
            op: Some(op),
            root: Some(root),
            ..Signature::of(Collective::Reduce, dtype, count)
        };
        self.chunked(
            &sig,
            count,
            chunk,
            |off, len| {
                // SAFETY: as in all_reduce: our slot, the input's own range.
                unsafe { copy(bufs.input.add(off * es), seg.slot(me), len * es) }
            },
            |_, off, len| {
                if me != root {
                    return Ok(());
                }
                // SAFETY: slots are stable between barriers; the output is this call's.
                unsafe { self.reduce_slots(dtype, op, 0, len, bufs.output.add(off * es)) }
            },
        )
    }

    pub(super) fn broadcast_impl(
        &self,
        bufs: &Bufs,
        dtype: DataType,
        count: usize,
        root: usize,
    ) -> Result<()> {
        let (es, me, seg) = (dtype.size(), self.rank, &self.seg);
        let chunk = seg.layout.slot_bytes / es;
        let sig = Signature {
            root: Some(root),
            ..Signature::of(Collective::Broadcast, dtype, count)
        };
        self.chunked(
            &sig,
            count,
            chunk,
            |off, len| {
                if me == root {
                    // SAFETY: root's own slot and input range.
                    unsafe { copy(bufs.input.add(off * es), seg.slot(root), len * es) };
                }
            },
            |_, off, len| {
                // SAFETY: the root's slot is stable until the end barrier; out of place on the
                // root, input and output are distinct buffers.
                unsafe {
                    if me != root {
                        copy(seg.slot(root), bufs.output.add(off * es), len * es);
                    } else if !bufs.in_place {
                        copy(
                            bufs.input.add(off * es),
                            bufs.output.add(off * es),
                            len * es,
                        );
                    }
                }
                Ok(())
            },
        )
    }

    pub(super) fn all_gather_impl(
        &self,
        bufs: &Bufs,
        dtype: DataType,
        part: usize,
        plan: &Plan,
    ) -> Result<()> {
        let coll = Collective::AllGather;
        if let Some(codec) = &plan.low_precision {
            return self.all_gather_lp(bufs, dtype, part, codec);
        }
        let (es, me, n, seg) = (dtype.size(), self.rank, self.world, &self.seg);
        let chunk = seg.layout.slot_bytes / es;
        let input = bufs.gather_input(me, part * es);
        let sig = Signature::of(coll, dtype, part);
        self.chunked(
            &sig,
            part,
            chunk,
            |off, len| {
                // SAFETY: own slot, own input range.
                unsafe { copy(input.add(off * es), seg.slot(me), len * es) }
            },
            |_, off, len| {
                for r in 0..n {
                    if r == me && bufs.in_place {
                        continue;
                    }
                    // SAFETY: slots are stable between barriers; output part r is this call's.
                    unsafe {
                        copy(
                            seg.slot(r),
                            bufs.output.add((r * part + off) * es),
                            len * es,
                        )
                    };
                }
                Ok(())
            },
        )
    }

    /// The shape reduce-scatter and all-to-all share: in chunks, every part of the input (of
    /// `es`-byte elements) is copied into this rank's slot regions (part `p` into region `p`, for rank `p`), and after
    /// the barrier `receive(region, off, len)` takes elements `off..off + len` of this rank's
    /// part from every rank's region `me`.
    fn parts(
        &self,
        bufs: &Bufs,
        es: usize,
        part: usize,
        sig: &Signature,
        mut receive: impl FnMut(usize, usize, usize) -> Result<()>,
    ) -> Result<()> {
        let region = self.regions_for(sig.coll)?;
        self.chunked(
            sig,
            part,
            region / es,
            |off, len| {
                for p in 0..self.world {
                    // SAFETY: the input holds n * part elements; our slot is ours before the
                    // barrier and its regions are disjoint.
                    unsafe {
                        copy(
                            bufs.input.add((p * part + off) * es),
                            self.seg.slot(self.rank).add(p * region),
                            len * es,
                        )
                    }
                }
            },
            |_, off, len| receive(region, off, len),
        )
    }

    pub(super) fn reduce_scatter_impl(
        &self,
        bufs: &Bufs,
        dtype: DataType,
        part: usize,
        op: ReduceOp,
        plan: &Plan,
    ) -> Result<()> {
        let coll = Collective::ReduceScatter;
        if let Some(codec) = &plan.low_precision {
            return self.reduce_scatter_lp(bufs, dtype, part, op, codec);
        }
        let (es, me) = (dtype.size(), self.rank);
        let out = bufs.scatter_output(me, part * es);
        let sig = Signature {
            op: Some(op),
            ..Signature::of(coll, dtype, part)
        };
        self.parts(bufs, es, part, &sig, |region, off, len| {
            // SAFETY: regions `me` of every slot are stable between barriers; in place, chunk k
            // of our part was staged before we overwrite it.
            unsafe { self.reduce_slots(dtype, op, me * region, len, out.add(off * es)) }
        })
    }

    pub(super) fn all_to_all_impl(
        &self,
        bufs: &Bufs,
        dtype: DataType,
        part: usize,
        plan: &Plan,
    ) -> Result<()> {
        let coll = Collective::AllToAll;
        if let Some(codec) = &plan.low_precision {
            return self.all_to_all_lp(bufs, dtype, part, codec);
        }
        let (es, me, n, seg) = (dtype.size(), self.rank, self.world, &self.seg);
        let sig = Signature::of(coll, dtype, part);
        self.parts(bufs, es, part, &sig, |region, off, len| {
            for r in 0..n {
                let (src, at) = (seg.slot(r), (r * part + off) * es);
                // SAFETY: region `me` of slot r is stable between barriers; in place, chunk k
                // of every part was staged before being overwritten here.
                unsafe { copy(src.add(me * region), bufs.output.add(at), len * es) };
            }
            Ok(())
        })
    }

    /// Publishes this rank's all-to-all-v counts, passes the start barrier and checks that
    /// every sender's count matches its receiver's (unless the receive counts are learnt from
    /// the senders: `learn`). Returns the largest part of any rank and what each rank sends
    /// to this one.
    pub(super) fn all_to_all_v_start(
        &self,
        call: &mut Running<'_>,
        sig: &Signature,
        splits: &Splits,
        learn: bool,
    ) -> Result<(usize, Vec<usize>)> {
        let (me, n, seg) = (self.rank, self.world, &self.seg);
        for p in 0..n {
            // Relaxed: the start barrier's release publishes them.
            seg.count(me, p)
                .store(splits.send_counts[p] as u64, Ordering::Relaxed);
            if !learn {
                seg.count(me, n + p)
                    .store(splits.recv_counts[p] as u64, Ordering::Relaxed);
            }
        }
        call.start(sig)?;
        let mut max = 0;
        for i in 0..n {
            for j in 0..n {
                let sends = seg.count(i, j).load(Ordering::Relaxed);
                max = max.max(sends as usize);
                if learn {
                    continue;
                }
                let expects = seg.count(j, n + i).load(Ordering::Relaxed);
                if sends != expects {
                    // Every rank reads the same table and stops at the same pair.
                    call.barrier()?;
                    return Err(Error::Mismatch {
                        seq: call.seq(),
                        rank: me,
                        mine: format!("all_to_all_v: rank {i} sends {sends} elements to rank {j}"),
                        peer: j,
                        theirs: format!("rank {j} expects {expects} elements from rank {i}"),
                    });
                }
            }
        }
        let incoming = (0..n)
            .map(|i| seg.count(i, me).load(Ordering::Relaxed) as usize)
            .collect();
        Ok((max, incoming))
    }

    /// All-to-all-v in both precisions (`lp`: the signature's low-precision word): per round of
    /// up to `chunk` elements of every part, `send(src, dst, len)` stages our piece for rank `p`
    /// into region `p` of our slot, and after the barrier `recv(src, dst, len)` takes rank `r`'s
    /// piece for us from region `me` of its slot into the output. `src` and `dst` are valid for
    /// `len` elements (the encoded size of `len` elements in a region) and touched by nothing
    /// else meanwhile.
    ///
    /// With a `capacity` (all_to_all_v_dynamic), the receive side of `splits` is ignored: the
    /// part from rank `r` is what it sends, cut to `capacity`, at `r * capacity` in the output
    /// (which holds `n * capacity` elements). Returns what each rank sent to this one, uncut.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn all_to_all_v_rounds(
        &self,
        bufs: &Bufs,
        dtype: DataType,
        lp: u64,
        in_count: usize,
        splits: &Splits,
        capacity: Option<usize>,
        (region, chunk): (usize, usize),
        mut send: impl FnMut(*const u8, *mut u8, usize) -> Result<()>,
        mut recv: impl FnMut(*const u8, *mut u8, usize) -> Result<()>,
    ) -> Result<Vec<usize>> {
        let (es, me, n, seg) = (dtype.size(), self.rank, self.world, &self.seg);
        // The capacity is agreed on like a count: ranks with different capacities (or
        // dynamic against plain) fail the signature check.
        let sig = Signature {
            dtype: Some(dtype),
            lp,
            count: capacity.unwrap_or(0) as u64,
            dynamic: capacity.is_some(),
            ..Signature::new(Collective::AllToAllV)
        };
        // In place, parts may differ in size between sending and receiving, so a received part
        // could overwrite a neighbour's part not yet sent: send from a copy.
        let snapshot: Vec<u8>;
        let input = if bufs.in_place {
            // SAFETY: the in-place buffer holds `in_count` elements.
            snapshot = unsafe { shared(bufs.input, in_count * es) }.to_vec();
            snapshot.as_ptr()
        } else {
            bufs.input
        };
        let mut call = self.begin(sig.coll)?;
        let (max, incoming) =
            self.all_to_all_v_start(&mut call, &sig, splits, capacity.is_some())?;
        let (recv_counts, recv_displs) = match capacity {
            None => (splits.recv_counts.clone(), splits.recv_displs.clone()),
            Some(cap) => (
                incoming.iter().map(|&c| c.min(cap)).collect(),
                (0..n).map(|r| r * cap).collect(),
            ),
        };
        let piece = |count: usize, k: usize| count.saturating_sub(k * chunk).min(chunk);
        // The own part does not travel: copied as it is (through no codes with low precision).
        let own = recv_counts[me].min(splits.send_counts[me]) * es;
        // SAFETY: the part lies within the input and the output (checked by the communicator,
        // or cut to the capacity above); in place the source is the snapshot, so the two never
        // overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                input.wrapping_add(splits.send_displs[me] * es),
                bufs.output.wrapping_add(recv_displs[me] * es),
                own,
            )
        };
        for k in 0..max.div_ceil(chunk) {
            for p in (0..n).filter(|&p| p != me) {
                let len = piece(splits.send_counts[p], k);
                // The part lies within the input (checked by the communicator, or cut to it by
                // all_to_all_v_dynamic); our slot's region p is ours before the barrier.
                send(
                    input.wrapping_add((splits.send_displs[p] + k * chunk) * es),
                    seg.slot(me).wrapping_add(p * region),
                    len,
                )?;
            }
            call.barrier()?;
            for r in (0..n).filter(|&r| r != me) {
                let len = piece(recv_counts[r], k);
                // Region `me` of slot r is stable until the next barrier; the part lies within
                // the output (checked by the communicator, or cut to the capacity above).
                recv(
                    seg.slot(r).wrapping_add(me * region),
                    bufs.output.wrapping_add((recv_displs[r] + k * chunk) * es),
                    len,
                )?;
            }
            call.barrier()?;
        }
        call.finish()?;
        Ok(incoming)
    }

    pub(super) fn all_to_all_v_impl(
        &self,
        bufs: &Bufs,
        dtype: DataType,
        in_count: usize,
        splits: &Splits,
        plan: &Plan,
    ) -> Result<()> {
        let coll = Collective::AllToAllV;
        if let Some(codec) = &plan.low_precision {
            return self.all_to_all_v_lp(bufs, dtype, in_count, splits, codec);
        }
        let es = dtype.size();
        let region = self.regions_for(coll)?;
        let mv = |src: *const u8, dst: *mut u8, len: usize| {
            // SAFETY: in both directions the rounds hand over ranges valid for `len` elements
            // that nothing else touches meanwhile.
            unsafe { copy(src, dst, len * es) };
            Ok(())
        };
        let layout = (region, region / es);
        self.all_to_all_v_rounds(bufs, dtype, 0, in_count, splits, None, layout, mv, mv)?;
        Ok(())
    }

    /// All-to-all-v with counts in (host) memory: the rounds of [`Self::all_to_all_v_rounds`]
    /// with the send side derived from `counts.send` and the receive side learnt from the
    /// senders. Cut parts (past the input, past the capacity) are this call's error, returned
    /// once the exchange is complete and `counts.recv` is written, so every rank finishes the
    /// call and the communicator stays usable.
    pub(super) fn all_to_all_v_dynamic_impl(
        &self,
        bufs: &Bufs,
        dtype: DataType,
        in_count: usize,
        counts: DeviceCounts<'_>,
    ) -> Result<()> {
        let c = "all_to_all_v_dynamic";
        // Everything in elements here (parts are whole units: the input is, and so are the
        // counts); the counts written and the messages go back to units.
        let unit = counts.unit;
        let (me, n, cap) = (self.rank, self.world, counts.capacity * unit);
        let cdt = counts.send.dtype();
        let not_host = |what: &str, d| {
            Error::InvalidArgument(format!(
                "{c}: the host backend needs {what} in host memory, got them on {d}"
            ))
        };
        let send = counts
            .send
            .host_bytes()
            .ok_or_else(|| not_host("send_counts", counts.send.device()))?;
        let mut recv_view = counts.recv;
        let recv_device = recv_view.device();
        let recv = recv_view
            .host_bytes_mut()
            .ok_or_else(|| not_host("recv_counts", recv_device))?;
        // Parts are packed in rank order at the prefix sums of the requested counts; whatever
        // lies past the input is cut, as the cuda kernel does.
        let mut send_counts = Vec::with_capacity(n);
        let mut send_displs = Vec::with_capacity(n);
        let mut end = 0usize;
        for p in 0..n {
            let want = read_count(cdt, send, p).saturating_mul(unit);
            send_counts.push(want.min(in_count.saturating_sub(end)));
            send_displs.push(end.min(in_count));
            end = end.saturating_add(want);
        }
        let mut problems = Vec::new();
        if end > in_count {
            problems.push(format!(
                "the send counts add up to {} units, more than the input's {}; the parts past \
                 the input were cut",
                end / unit,
                in_count / unit
            ));
        }
        // From here the peers take part: the problems above are reported after the exchange.
        crate::backend::began_exchange();
        let splits = Splits {
            send_counts,
            send_displs,
            recv_counts: vec![0; n],
            recv_displs: vec![0; n],
        };
        let es = dtype.size();
        let region = self.regions_for(Collective::AllToAllV)?;
        let mv = |src: *const u8, dst: *mut u8, len: usize| {
            // SAFETY: as in all_to_all_v: the rounds hand over ranges valid for `len` elements
            // that nothing else touches meanwhile.
            unsafe { copy(src, dst, len * es) };
            Ok(())
        };
        let layout = (region, region / es);
        let incoming =
            self.all_to_all_v_rounds(bufs, dtype, 0, in_count, &splits, Some(cap), layout, mv, mv)?;
        for (s, &got) in incoming.iter().enumerate() {
            write_count(cdt, recv, s, got.min(cap) / unit);
            if got > cap {
                problems.push(format!(
                    "rank {s} sent {got} elements, more than the capacity of {cap}; the part \
                     was cut to the capacity"
                ));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "{c} on rank {me}: {}",
                problems.join("; ")
            )))
        }
    }
}
