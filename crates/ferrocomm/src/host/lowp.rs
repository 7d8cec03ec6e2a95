//! Low-precision collectives: block-scaled codes travel through the slots instead of raw data.
//!
//! Inputs are widened to f32 and encoded once; sums are taken in f32 in rank order, starting
//! from rank 0's decoded values (as [`crate::quant::reference::one_shot`] does). Tree all-reduce:
//! the owner of a stripe sums it, quantizes once into `reduced`, and every rank, the owner
//! included, decodes that same stripe (docs/design.md, rule 5). Chunks and stripes are whole blocks, so a
//! block-aligned part of an encoding is a contiguous slice of it (`Codec::encoded_offset`).

use super::collectives::{exclusive, region_bytes, shared, stripe};
use super::{Bufs, HostBackend, Signature};
use crate::backend::Splits;
use crate::error::{Error, Result};
use crate::plan::{Algo, Collective};
use crate::quant::{Codec, Format, SCALE_BYTES};
use crate::reduce::{from_f32, to_f32};
use crate::types::{DataType, ReduceOp};

/// The signature word of a codec: ranks must agree on format and block.
fn lp_word(c: &Codec) -> u64 {
    let f = Format::ALL.iter().position(|f| *f == c.format).unwrap_or(0) as u64;
    (f + 1) | (c.block as u64) << 8
}

/// The codec a signature word names, for mismatch messages ("e4m3, block 128").
pub(super) fn describe_lp_word(w: u64) -> String {
    match Format::ALL.get(((w & 0xff) as usize).wrapping_sub(1)) {
        Some(f) => format!("{f}, block {}", w >> 8),
        None => format!("{w:#x}"),
    }
}

/// Widens `len` elements at `src` and encodes them into `dst`.
///
/// # Safety
/// `src` holds `len` elements of `dtype`; `dst` has `codec.encoded_bytes(len)` writable bytes
/// that nobody else touches meanwhile.
unsafe fn encode(
    codec: &Codec,
    dtype: DataType,
    src: *const u8,
    len: usize,
    dst: *mut u8,
    wide: &mut Vec<f32>,
) -> Result<()> {
    wide.resize(len, 0.0);
    // SAFETY: per the caller's promise.
    to_f32(dtype, unsafe { shared(src, len * dtype.size()) }, wide)?;
    // SAFETY: per the caller's promise.
    codec.encode(wide, unsafe { exclusive(dst, codec.encoded_bytes(len)) });
    Ok(())
}

/// Decodes `len` elements from `src` and rounds them into `out` as `dtype`.
///
/// # Safety
/// `src` holds `codec.encoded_bytes(len)` stable bytes; `out` has `len` writable elements.
unsafe fn decode(
    codec: &Codec,
    dtype: DataType,
    src: *const u8,
    len: usize,
    out: *mut u8,
    wide: &mut Vec<f32>,
) -> Result<()> {
    wide.resize(len, 0.0);
    // SAFETY: per the caller's promise.
    codec.decode(unsafe { shared(src, codec.encoded_bytes(len)) }, wide);
    // SAFETY: per the caller's promise.
    from_f32(dtype, wide, unsafe { exclusive(out, len * dtype.size()) })
}

/// Sums the encodings at `srcs` (each of `len` elements) in order into `acc`, then divides by
/// the count for Avg.
///
/// # Safety
/// Every source holds `codec.encoded_bytes(len)` stable bytes.
unsafe fn sum(
    codec: &Codec,
    srcs: impl Iterator<Item = *const u8>,
    len: usize,
    op: ReduceOp,
    acc: &mut Vec<f32>,
) {
    acc.resize(len, 0.0);
    let eb = codec.encoded_bytes(len);
    let mut n = 0;
    for (r, s) in srcs.enumerate() {
        // SAFETY: per the caller's promise.
        let enc = unsafe { shared(s, eb) };
        if r == 0 {
            codec.decode(enc, acc);
        } else {
            codec.decode_add(enc, acc);
        }
        n += 1;
    }
    if op == ReduceOp::Avg {
        let d = n as f32;
        acc.iter_mut().for_each(|a| *a /= d);
    }
}

impl HostBackend {
    /// Elements per chunk: whole blocks whose encoding fits `room` bytes.
    fn lp_chunk(&self, coll: Collective, codec: &Codec, room: usize) -> Result<usize> {
        let c = room / (codec.block + SCALE_BYTES) * codec.block;
        if c == 0 {
            return Err(Error::InvalidArgument(format!(
                "{}: FERROCOMM_HOST_SLOT_BYTES={} leaves {room} bytes per rank, less than one \
                 low-precision block of {} elements",
                coll.name(),
                self.seg.layout.slot_bytes,
                codec.block
            )));
        }
        Ok(c)
    }

    pub(super) fn all_reduce_lp(
        &self,
        bufs: &Bufs,
        dtype: DataType,
        count: usize,
        op: ReduceOp,
        algo: Algo,
        codec: &Codec,
    ) -> Result<()> {
        let coll = Collective::AllReduce;
        let (es, me, n, seg) = (dtype.size(), self.rank, self.world, &self.seg);
        let chunk = self.lp_chunk(coll, codec, seg.layout.slot_bytes)?;
        let sig = Signature {
            op: Some(op),
            algo,
            lp: lp_word(codec),
            ..Signature::of(coll, dtype, count)
        };
        let (mut wide, mut acc) = (Vec::new(), Vec::new());
        let mut stage = |off: usize, len: usize| {
            // SAFETY: the input's own range; our slot is ours until the barrier.
            unsafe {
                encode(
                    codec,
                    dtype,
                    bufs.input.add(off * es),
                    len,
                    seg.slot(me),
                    &mut wide,
                )
            }
        };
        match algo {
            Algo::Tree => {
                self.chunked_fallible(&sig, count, chunk, &mut stage, |call, off, len| {
                    let (lo, hi) = stripe(len, n, me, codec.block);
                    // An empty stripe (fewer blocks than ranks) may start at an unaligned `len`.
                    if hi > lo {
                        let at = codec.encoded_offset(lo);
                        // SAFETY: slots are stable until the end barrier; our stripe of `reduced`
                        // is written by us alone (stripes are whole blocks, so whole records).
                        unsafe {
                            sum(
                                codec,
                                (0..n).map(|r| seg.slot(r).add(at) as *const u8),
                                hi - lo,
                                op,
                                &mut acc,
                            );
                            // Quantize the reduced stripe once; everyone decodes these same codes.
                            codec.encode(
                                &acc,
                                exclusive(seg.reduced().add(at), codec.encoded_bytes(hi - lo)),
                            );
                        }
                    }
                    call.barrier()?;
                    // SAFETY: `reduced` is complete and stable until the end barrier.
                    unsafe {
                        decode(
                            codec,
                            dtype,
                            seg.reduced(),
                            len,
                            bufs.output.add(off * es),
                            &mut acc,
                        )
                    }
                })
            }
            _ => self.chunked_fallible(&sig, count, chunk, &mut stage, |_, off, len| {
                // SAFETY: slots are stable between the chunk's barriers; the output is ours.
                unsafe {
                    sum(
                        codec,
                        (0..n).map(|r| seg.slot(r) as *const u8),
                        len,
                        op,
                        &mut acc,
                    );
                    from_f32(dtype, &acc, exclusive(bufs.output.add(off * es), len * es))
                }
            }),
        }
    }

    pub(super) fn all_gather_lp(
        &self,
        bufs: &Bufs,
        dtype: DataType,
        part: usize,
        codec: &Codec,
    ) -> Result<()> {
        let coll = Collective::AllGather;
        let (es, me, n, seg) = (dtype.size(), self.rank, self.world, &self.seg);
        let chunk = self.lp_chunk(coll, codec, seg.layout.slot_bytes)?;
        let input = bufs.gather_input(me, part * es);
        let sig = Signature {
            lp: lp_word(codec),
            ..Signature::of(coll, dtype, part)
        };
        let (mut wide, mut acc) = (Vec::new(), Vec::new());
        self.chunked_fallible(
            &sig,
            part,
            chunk,
            |off, len| {
                // SAFETY: our input range; our slot.
                unsafe {
                    encode(
                        codec,
                        dtype,
                        input.add(off * es),
                        len,
                        seg.slot(me),
                        &mut wide,
                    )
                }
            },
            |_, off, len| {
                // Every part is decoded, ours too, so that all ranks hold the same values.
                for r in 0..n {
                    // SAFETY: slots are stable between barriers; output part r is ours.
                    unsafe {
                        decode(
                            codec,
                            dtype,
                            seg.slot(r),
                            len,
                            bufs.output.add((r * part + off) * es),
                            &mut acc,
                        )?
                    };
                }
                Ok(())
            },
        )
    }

    /// The shape reduce-scatter and all-to-all share: in chunks, every part of the input
    /// (but our own when `skip_own`) is encoded into this rank's slot regions (part `p` into
    /// region `p`, for rank `p`), and after the barrier `receive(region, off, len)` takes
    /// elements `off..off + len` of this rank's part from every rank's region `me`.
    #[allow(clippy::too_many_arguments)]
    fn parts_lp(
        &self,
        bufs: &Bufs,
        dtype: DataType,
        part: usize,
        codec: &Codec,
        sig: &Signature,
        skip_own: bool,
        mut receive: impl FnMut(usize, usize, usize) -> Result<()>,
    ) -> Result<()> {
        let (me, n, seg) = (self.rank, self.world, &self.seg);
        let region = region_bytes(seg.layout.slot_bytes, n);
        let chunk = self.lp_chunk(sig.coll, codec, region)?;
        let mut wide = Vec::new();
        self.chunked_fallible(
            sig,
            part,
            chunk,
            |off, len| {
                for p in (0..n).filter(|&p| !(skip_own && p == me)) {
                    // SAFETY: the input holds n parts; our slot is ours before the barrier and
                    // its regions are disjoint.
                    unsafe {
                        encode(
                            codec,
                            dtype,
                            bufs.input.add((p * part + off) * dtype.size()),
                            len,
                            seg.slot(me).add(p * region),
                            &mut wide,
                        )?
                    };
                }
                Ok(())
            },
            |_, off, len| receive(region, off, len),
        )
    }

    pub(super) fn reduce_scatter_lp(
        &self,
        bufs: &Bufs,
        dtype: DataType,
        part: usize,
        op: ReduceOp,
        codec: &Codec,
    ) -> Result<()> {
        let coll = Collective::ReduceScatter;
        let (es, me, n, seg) = (dtype.size(), self.rank, self.world, &self.seg);
        let out = bufs.scatter_output(me, part * es);
        let sig = Signature {
            op: Some(op),
            lp: lp_word(codec),
            ..Signature::of(coll, dtype, part)
        };
        let mut acc = Vec::new();
        // Every rank's part `me` is summed, ours too, through the codes (the one-shot sum).
        self.parts_lp(bufs, dtype, part, codec, &sig, false, |region, off, len| {
            // SAFETY: regions `me` are stable between barriers; the output chunk is ours.
            unsafe {
                sum(
                    codec,
                    (0..n).map(|r| seg.slot(r).add(me * region) as *const u8),
                    len,
                    op,
                    &mut acc,
                );
                from_f32(dtype, &acc, exclusive(out.add(off * es), len * es))
            }
        })
    }

    pub(super) fn all_to_all_lp(
        &self,
        bufs: &Bufs,
        dtype: DataType,
        part: usize,
        codec: &Codec,
    ) -> Result<()> {
        let coll = Collective::AllToAll;
        let (es, me, n, seg) = (dtype.size(), self.rank, self.world, &self.seg);
        let sig = Signature {
            lp: lp_word(codec),
            ..Signature::of(coll, dtype, part)
        };
        let mut acc = Vec::new();
        // Our own part does not travel: copied as it is (in place it is already there).
        self.parts_lp(bufs, dtype, part, codec, &sig, true, |region, off, len| {
            if !bufs.in_place {
                let at = (me * part + off) * es;
                // SAFETY: both buffers hold n parts and are distinct (not in place).
                unsafe {
                    std::ptr::copy_nonoverlapping(bufs.input.add(at), bufs.output.add(at), len * es)
                };
            }
            for r in (0..n).filter(|&r| r != me) {
                // SAFETY: region `me` of slot r is stable between barriers; in place, chunk k
                // of every part was staged before being overwritten.
                unsafe {
                    decode(
                        codec,
                        dtype,
                        seg.slot(r).add(me * region),
                        len,
                        bufs.output.add((r * part + off) * es),
                        &mut acc,
                    )?
                };
            }
            Ok(())
        })
    }

    pub(super) fn all_to_all_v_lp(
        &self,
        bufs: &Bufs,
        dtype: DataType,
        in_count: usize,
        splits: &Splits,
        codec: &Codec,
    ) -> Result<()> {
        let coll = Collective::AllToAllV;
        let region = region_bytes(self.seg.layout.slot_bytes, self.world);
        let chunk = self.lp_chunk(coll, codec, region)?;
        let (mut wide, mut acc) = (Vec::new(), Vec::new());
        // The rounds hand over a piece of `len` elements of the buffer and its encoding in a
        // slot region, touched by nothing else meanwhile.
        // SAFETY: as above.
        let send = |src, dst, len| unsafe { encode(codec, dtype, src, len, dst, &mut wide) };
        // SAFETY: as above.
        let recv = |src, dst, len| unsafe { decode(codec, dtype, src, len, dst, &mut acc) };
        let layout = (region, chunk);
        let lp = lp_word(codec);
        self.all_to_all_v_rounds(bufs, dtype, lp, in_count, splits, None, layout, send, recv)?;
        Ok(())
    }
}
