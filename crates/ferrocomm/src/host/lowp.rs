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

/// One side of a low-precision call's wire: the codec, the buffers' element type, and the f32
/// values an encode, decode or sum works in (a call's stage and its consume each hold one).
struct Coder<'c> {
    codec: &'c Codec,
    dtype: DataType,
    wide: Vec<f32>,
}

impl<'c> Coder<'c> {
    fn new(codec: &'c Codec, dtype: DataType) -> Self {
        Coder {
            codec,
            dtype,
            wide: Vec::new(),
        }
    }

    /// Widens `len` elements at `src` and encodes them into `dst`.
    ///
    /// # Safety
    /// `src` holds `len` elements of the dtype; `dst` has `codec.encoded_bytes(len)` writable
    /// bytes that nobody else touches meanwhile.
    unsafe fn encode(&mut self, src: *const u8, len: usize, dst: *mut u8) -> Result<()> {
        let (codec, wide) = (self.codec, &mut self.wide);
        wide.resize(len, 0.0);
        // SAFETY: per the caller's promise.
        let src = unsafe { shared(src, len * self.dtype.size()) };
        to_f32(self.dtype, src, wide)?;
        // SAFETY: per the caller's promise.
        codec.encode(wide, unsafe { exclusive(dst, codec.encoded_bytes(len)) });
        Ok(())
    }

    /// Decodes `len` elements from `src` and rounds them into `out` as the dtype.
    ///
    /// # Safety
    /// `src` holds `codec.encoded_bytes(len)` stable bytes; `out` has `len` writable elements.
    unsafe fn decode(&mut self, src: *const u8, len: usize, out: *mut u8) -> Result<()> {
        self.wide.resize(len, 0.0);
        // SAFETY: per the caller's promise.
        let enc = unsafe { shared(src, self.codec.encoded_bytes(len)) };
        self.codec.decode(enc, &mut self.wide);
        // SAFETY: per the caller's promise.
        unsafe { self.round_into(len, out) }
    }

    /// Sums the encodings at `srcs` (each of `len` elements) in order into the f32 values, then
    /// divides by the count for Avg.
    ///
    /// # Safety
    /// Every source holds `codec.encoded_bytes(len)` stable bytes.
    unsafe fn sum(&mut self, srcs: impl Iterator<Item = *const u8>, len: usize, op: ReduceOp) {
        let acc = &mut self.wide;
        acc.resize(len, 0.0);
        let eb = self.codec.encoded_bytes(len);
        let mut n = 0;
        for (r, s) in srcs.enumerate() {
            // SAFETY: per the caller's promise.
            let enc = unsafe { shared(s, eb) };
            if r == 0 {
                self.codec.decode(enc, acc);
            } else {
                self.codec.decode_add(enc, acc);
            }
            n += 1;
        }
        if op == ReduceOp::Avg {
            let d = n as f32;
            acc.iter_mut().for_each(|a| *a /= d);
        }
    }

    /// [`Coder::sum`], rounded into `out` as the dtype.
    ///
    /// # Safety
    /// As [`Coder::sum`]; `out` has `len` writable elements.
    unsafe fn sum_into(
        &mut self,
        srcs: impl Iterator<Item = *const u8>,
        len: usize,
        op: ReduceOp,
        out: *mut u8,
    ) -> Result<()> {
        // SAFETY: per the caller's promise.
        unsafe {
            self.sum(srcs, len, op);
            self.round_into(len, out)
        }
    }

    /// The first `len` f32 values rounded into `out` as the dtype.
    ///
    /// # Safety
    /// `out` has `len` writable elements.
    unsafe fn round_into(&self, len: usize, out: *mut u8) -> Result<()> {
        // SAFETY: per the caller's promise.
        let out = unsafe { exclusive(out, len * self.dtype.size()) };
        from_f32(self.dtype, &self.wide[..len], out)
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
        let (mut enc, mut dec) = (Coder::new(codec, dtype), Coder::new(codec, dtype));
        let mut stage = |off: usize, len: usize| {
            // SAFETY: the input's own range; our slot is ours until the barrier.
            unsafe { enc.encode(bufs.input.add(off * es), len, seg.slot(me)) }
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
                            let slots = (0..n).map(|r| seg.slot(r).add(at) as *const u8);
                            dec.sum(slots, hi - lo, op);
                            // Quantize the reduced stripe once; everyone decodes these same codes.
                            codec.encode(
                                &dec.wide,
                                exclusive(seg.reduced().add(at), codec.encoded_bytes(hi - lo)),
                            );
                        }
                    }
                    call.barrier()?;
                    // SAFETY: `reduced` is complete and stable until the end barrier.
                    unsafe { dec.decode(seg.reduced(), len, bufs.output.add(off * es)) }
                })
            }
            _ => self.chunked_fallible(&sig, count, chunk, &mut stage, |_, off, len| {
                let slots = (0..n).map(|r| seg.slot(r) as *const u8);
                // SAFETY: slots are stable between the chunk's barriers; the output is ours.
                unsafe { dec.sum_into(slots, len, op, bufs.output.add(off * es)) }
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
        let (mut enc, mut dec) = (Coder::new(codec, dtype), Coder::new(codec, dtype));
        self.chunked_fallible(
            &sig,
            part,
            chunk,
            // SAFETY: our input range; our slot.
            |off, len| unsafe { enc.encode(input.add(off * es), len, seg.slot(me)) },
            |_, off, len| {
                // Every part is decoded, ours too, so that all ranks hold the same values.
                for r in 0..n {
                    // SAFETY: slots are stable between barriers; output part r is ours.
                    unsafe {
                        dec.decode(seg.slot(r), len, bufs.output.add((r * part + off) * es))?
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
        let mut enc = Coder::new(codec, dtype);
        self.chunked_fallible(
            sig,
            part,
            chunk,
            |off, len| {
                for p in (0..n).filter(|&p| !(skip_own && p == me)) {
                    // SAFETY: the input holds n parts; our slot is ours before the barrier and
                    // its regions are disjoint.
                    unsafe {
                        let src = bufs.input.add((p * part + off) * dtype.size());
                        enc.encode(src, len, seg.slot(me).add(p * region))?
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
        let mut dec = Coder::new(codec, dtype);
        // Every rank's part `me` is summed, ours too, through the codes (the one-shot sum).
        self.parts_lp(bufs, dtype, part, codec, &sig, false, |region, off, len| {
            // SAFETY: regions `me` are stable between barriers; the output chunk is ours.
            unsafe {
                let slots = (0..n).map(|r| seg.slot(r).add(me * region) as *const u8);
                dec.sum_into(slots, len, op, out.add(off * es))
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
        let mut dec = Coder::new(codec, dtype);
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
                    let out = bufs.output.add((r * part + off) * es);
                    dec.decode(seg.slot(r).add(me * region), len, out)?
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
        let (mut enc, mut dec) = (Coder::new(codec, dtype), Coder::new(codec, dtype));
        // The rounds hand over a piece of `len` elements of the buffer and its encoding in a
        // slot region, touched by nothing else meanwhile.
        // SAFETY: as above.
        let send = |src, dst, len| unsafe { enc.encode(src, len, dst) };
        // SAFETY: as above.
        let recv = |src, dst, len| unsafe { dec.decode(src, len, dst) };
        let layout = (region, chunk);
        let lp = lp_word(codec);
        self.all_to_all_v_rounds(bufs, dtype, lp, in_count, splits, None, layout, send, recv)?;
        Ok(())
    }
}
