//! The bodies of the collectives other than all-reduce: all-gather, all-to-all, broadcast,
//! reduce-scatter, reduce and send/recv across dtypes, operators, sizes (0, odd, unaligned, up
//! to 64 MB on a GPU), every root, in and out of place; all-to-all-v with uneven counts and
//! zeros, whole and in pieces; the device-count all-to-all-v (counts of elements and of rows,
//! overfull parts, counts it must not trust) and its packed form; batches of sends and
//! receives.

use ferrocomm::{
    Algo, CallOpts, Collective, Communicator, DataType, DeviceCounts, Input, P2pOp, PackedCounts,
    Splits, View, ViewMut,
};
use rand::{Rng, SeedableRng};

use super::*;

/// The bodies of this module, by name.
pub const BODIES: [(&str, Body); 6] = [
    ("matrix", matrix),
    ("all_to_all_v", a2av),
    ("all_to_all_v in pieces", a2av_in_pieces),
    ("dynamic", dynamic),
    ("dynamic packed", dynamic_packed),
    ("batches", batches),
];

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Coll {
    AllGather,
    AllToAll,
    Broadcast(usize),
    ReduceScatter(OpK),
    Reduce(OpK, usize),
    /// A message from the rank given to the next one (send on one, recv on the other; the
    /// rest take no part).
    SendRecv(usize),
}

impl Coll {
    fn key(self) -> &'static str {
        match self {
            Coll::AllGather => "all_gather",
            Coll::AllToAll => "all_to_all",
            Coll::Broadcast(_) => "broadcast",
            Coll::ReduceScatter(_) => "reduce_scatter",
            Coll::Reduce(..) => "reduce",
            Coll::SendRecv(_) => "send_recv",
        }
    }

    /// Elements of the input and of the output for `n` elements per part at `w` ranks.
    pub fn lens(self, n: usize, w: usize) -> (usize, usize) {
        match self {
            Coll::AllGather => (n, n * w),
            Coll::AllToAll => (n * w, n * w),
            Coll::Broadcast(_) | Coll::Reduce(..) | Coll::SendRecv(_) => (n, n),
            Coll::ReduceScatter(_) => (n * w, n),
        }
    }

    /// Issues the call (out of place unless `input` is in place) on `comm`.
    pub fn call(
        self,
        comm: &Communicator,
        input: Input<'_>,
        out: ViewMut<'_>,
        opts: &CallOpts,
    ) -> ferrocomm::Result<()> {
        match self {
            Coll::AllGather => comm.all_gather(input, out, opts),
            Coll::AllToAll => comm.all_to_all(input, out, opts),
            Coll::Broadcast(root) => comm.broadcast(input, out, root, opts),
            Coll::ReduceScatter(op) => comm.reduce_scatter(input, out, op.op(), opts),
            Coll::Reduce(op, root) => comm.reduce(input, out, op.op(), root, opts),
            Coll::SendRecv(sender) => {
                let Input::Buf(i) = input else {
                    unreachable!("point-to-point runs out of place")
                };
                p2p(comm, sender, i, out, opts)
            }
        }
    }

    /// Wrong elements of this rank's output `got` (its whole output, or the own part of an
    /// in-place reduce-scatter) for the ranks' `inputs`, `n` elements per part; `None` where
    /// this rank's output is not written.
    pub fn wrong(
        self,
        d: DataType,
        n: usize,
        me: usize,
        inputs: &[Vec<u8>],
        got: &[u8],
    ) -> Option<usize> {
        let (es, w) = (d.size(), inputs.len());
        let part = |v: &[u8], k: usize| v[k * n * es..(k + 1) * n * es].to_vec();
        Some(match self {
            Coll::AllGather => {
                let want: Vec<u8> = inputs.iter().flat_map(|v| part(v, 0)).collect();
                diff_bytes(&want, got, es)
            }
            Coll::AllToAll => {
                let want: Vec<u8> = inputs.iter().flat_map(|v| part(v, me)).collect();
                diff_bytes(&want, got, es)
            }
            Coll::Broadcast(root) => diff_bytes(&part(&inputs[root], 0), got, es),
            Coll::ReduceScatter(op) => {
                let parts: Vec<&[u8]> = inputs
                    .iter()
                    .map(|v| &v[me * n * es..(me + 1) * n * es])
                    .collect();
                check_reduce(d, op, &parts, got).0
            }
            Coll::Reduce(op, root) if me == root => {
                let parts: Vec<&[u8]> = inputs.iter().map(|v| &v[..n * es]).collect();
                check_reduce(d, op, &parts, got).0
            }
            Coll::SendRecv(s) if me == (s + 1) % w => diff_bytes(&part(&inputs[s], 0), got, es),
            Coll::Reduce(..) | Coll::SendRecv(_) => return None,
        })
    }
}

/// Whether this communicator can run point-to-point at all (not above two ranks without NCCL,
/// as with `--share-gpus`).
pub fn has_p2p(comm: &Communicator) -> bool {
    comm.size() > 1
        && comm
            .algo_for(Collective::Send, 4, DataType::BF16, &CallOpts::default())
            .is_ok()
}

/// The sender's send or the next rank's receive of one message from `sender` (`Coll::SendRecv`);
/// other ranks do nothing.
pub fn p2p(
    comm: &Communicator,
    sender: usize,
    input: View<'_>,
    out: ViewMut<'_>,
    opts: &CallOpts,
) -> ferrocomm::Result<()> {
    let (me, w) = (comm.rank(), comm.size());
    let to = (sender + 1) % w;
    if me == sender {
        comm.send(input, to, opts)
    } else if me == to {
        comm.recv(out, sender, opts)
    } else {
        Ok(())
    }
}

/// One call of `coll` with `n` elements per part, `misalign` elements off the buffers' start,
/// checked against the reference: the output, the guard bands around it, and that the input
/// of a send is only read.
#[allow(clippy::too_many_arguments)]
pub fn run_one(
    c: &mut Ctx,
    coll: Coll,
    dtype: DataType,
    n: usize,
    algo: Algo,
    in_place: bool,
    misalign: usize,
    seed: u64,
) -> Res<()> {
    let (w, me, dev) = (c.world, c.rank, c.dev);
    let es = dtype.size();
    let prod = matches!(
        coll,
        Coll::ReduceScatter(OpK::Prod) | Coll::Reduce(OpK::Prod, _)
    );
    let (in_n, out_n) = coll.lens(n, w);
    // Point-to-point has no in-place form.
    let in_place = in_place && !matches!(coll, Coll::SendRecv(_));
    let big = n * es > (1 << 20);
    let inputs: Vec<Vec<u8>> = (0..w)
        .map(|r| {
            if big && !matches!(coll, Coll::ReduceScatter(_) | Coll::Reduce(..)) {
                gen_bytes_fast(in_n * es, seed, r)
            } else {
                gen(dtype, in_n, seed, r, prod)
            }
        })
        .collect();
    let off = misalign * es;
    let buf_bytes = in_n.max(out_n) * es + off;
    let inb = c.buf(buf_bytes)?;
    let outb = c.buf(buf_bytes)?;
    outb.poison()?;
    inb.poison()?;
    let opts = CallOpts::default().with_algo(algo);
    // In place: the input sits where the collective expects it inside the output, and an
    // in-place reduce-scatter's output is the whole buffer.
    let out_view = if in_place && matches!(coll, Coll::ReduceScatter(_)) {
        n * w
    } else {
        out_n
    };
    let input = if in_place {
        let at = if coll == Coll::AllGather {
            me * n * es
        } else {
            0
        };
        outb.upload(off + at, &inputs[me])?;
        Input::InPlace
    } else {
        inb.upload(off, &inputs[me])?;
        // SAFETY: `in_n` elements of this device's buffer, alive until after the sync below.
        Input::Buf(unsafe { inb.view(off, in_n, dtype, dev) })
    };
    // SAFETY: as above, `out_view` elements from `off`.
    let r = coll.call(
        &c.comm,
        input,
        unsafe { outb.view_mut(off, out_view, dtype, dev) },
        &opts,
    );
    c.sync()?;
    // What the output must hold, and where.
    let got_off = match coll {
        Coll::ReduceScatter(_) if in_place => off + me * n * es,
        _ => off,
    };
    let got = outb.download(got_off, out_n * es)?;
    let guard = outb.guard_hits(off, out_view * es)?;
    let wrong = match coll.wrong(dtype, n, me, &inputs, &got) {
        Some(wrong) => wrong,
        // Outputs of ranks off the root (out of place) and of a sender are not written, and
        // a sender's buffer is only read.
        None if in_place => 0,
        None => {
            let sent = inb.download(off, in_n * es)?;
            written(&got).min(1) + diff_bytes(&inputs[me], &sent, es)
        }
    };
    let what = format!("{coll:?} {dtype} n={n} {algo} in_place={in_place} misalign={misalign}");
    c.record(coll.key(), what, r, wrong, guard);
    Ok(())
}

const MOVE_TYPES: [DataType; 5] = [
    DataType::BF16,
    DataType::F8E4M3,
    DataType::I8,
    DataType::F32,
    DataType::U64,
];

/// Every collective on every dtype it moves or reduces, sizes 0 to 70,003 elements (in and
/// out of place, aligned and one element off), every root and sender, direct access forced and
/// chosen; every operator of reduce-scatter and reduce; then bf16 moves and sums up to 64 MB
/// per buffer on a GPU (16 KiB on the host).
pub fn matrix(c: &mut Ctx) -> Res<()> {
    let (w, quick) = (c.world, c.quick);
    let mut seed = 1u64;
    let small: &[usize] = c.pick(
        &[0, 1, 3, 8, 33, 1000, 4097],
        &[0, 1, 3, 8, 33, 1000, 4097, 20_001, 70_003],
    );
    let mut colls = vec![Coll::AllGather, Coll::AllToAll];
    colls.extend((0..w).map(Coll::Broadcast));
    let p2p = has_p2p(&c.comm);
    if p2p {
        colls.extend((0..w).map(Coll::SendRecv));
    }
    for coll in &colls {
        for d in MOVE_TYPES {
            for (si, &n) in small.iter().enumerate() {
                if quick && si % 2 == 1 {
                    continue;
                }
                for (ai, algo) in [Algo::Direct, Algo::Auto].into_iter().enumerate() {
                    // Direct point-to-point is for two ranks only.
                    if matches!(coll, Coll::SendRecv(_)) && w != 2 && algo == Algo::Direct {
                        continue;
                    }
                    seed += 1;
                    let (ip, mis) = ((si + ai) % 2 == 0, (si + ai) % 3 / 2);
                    run_one(c, *coll, d, n, algo, ip, mis, seed)?;
                }
            }
        }
    }
    for d in REDUCE_TYPES {
        for &op in OpK::all_for(d) {
            for (si, &n) in small.iter().enumerate() {
                if quick && si % 2 == 0 {
                    continue;
                }
                seed += 1;
                let ip = (si + seed as usize) % 2 == 0;
                let mis = si % 3 / 2;
                let rs = Coll::ReduceScatter(op);
                run_one(c, rs, d, n, Algo::Direct, ip, mis, seed)?;
                let root = (si + seed as usize) % w;
                run_one(
                    c,
                    Coll::Reduce(op, root),
                    d,
                    n,
                    Algo::Direct,
                    !ip,
                    mis,
                    seed,
                )?;
            }
        }
    }
    // Large: bf16 sums and moves, direct and auto.
    let big: &[usize] = match (c.host(), quick) {
        (true, _) => &[(16 << 10) + 6],
        (false, true) => &[(1 << 20) + 3, 8 << 20],
        (false, false) => &[(1 << 20) + 3, 4 << 20, (32 << 20) / w],
    };
    let bf = DataType::BF16;
    for &b in big {
        let n = b / 2;
        for algo in [Algo::Direct, Algo::Auto] {
            seed += 1;
            let s = seed;
            run_one(c, Coll::AllGather, bf, n / w, algo, s % 2 == 0, 0, s)?;
            run_one(c, Coll::AllToAll, bf, n / w, algo, s % 2 == 1, 0, s)?;
            let root = s as usize % w;
            run_one(c, Coll::Broadcast(root), bf, n, algo, false, 0, s)?;
            run_one(
                c,
                Coll::ReduceScatter(OpK::Sum),
                bf,
                n / w,
                algo,
                false,
                0,
                s,
            )?;
            run_one(c, Coll::Reduce(OpK::Sum, 0), bf, n, algo, false, 0, s)?;
            if p2p && (w == 2 || algo == Algo::Auto) {
                run_one(c, Coll::SendRecv(root), bf, n, algo, false, 0, s)?;
            }
        }
    }
    // A 64 MB gathered output (128 KiB on the host).
    seed += 1;
    let n = c.pick(64 << 10, 32 << 20) / w;
    run_one(c, Coll::AllGather, bf, n, Algo::Direct, false, 0, seed)
}

/// Uneven counts with zeros and gaps; every rank derives every rank's splits from the seed.
pub fn splits_for(w: usize, seed: u64, max: usize) -> Vec<Vec<usize>> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    (0..w)
        .map(|_| {
            (0..w)
                .map(|_| match rng.random_range(0..4) {
                    0 => 0,
                    1 => rng.random_range(1..8),
                    _ => rng.random_range(1..max),
                })
                .collect()
        })
        .collect()
}

/// All-to-all-v on random count matrices: parts of up to 600,000 elements on a GPU (6,000 on
/// the host).
pub fn a2av(c: &mut Ctx) -> Res<()> {
    let rounds = if c.quick { 12 } else { 40 };
    let maxc = [
        10,
        c.pick(300, 3000),
        c.pick(3000, 70_000),
        c.pick(6000, 600_000),
    ];
    a2av_rounds(c, "round", rounds, 5000, &maxc)
}

/// All-to-all-v cut into pieces: a communicator whose 1 MiB staging has slots of 1 MiB / world,
/// and parts of up to 1.2 M elements, so a call at two ranks (one launch per piece of a slot)
/// takes up to 3 pieces of 1-byte elements, 5 of bf16, 10 of f32 and 19 of i64, and one above
/// (pair by pair in pieces of half a slot) up to 75 of i64 at four ranks; skewed, zero and odd
/// counts, in and out of place, direct access forced and chosen. On the host: slots of 4 KiB
/// and parts of up to 12,000 elements, as many pieces.
pub fn a2av_in_pieces(c: &mut Ctx) -> Res<()> {
    let mut small = c.cfg.clone();
    small.cuda_staging_bytes = 1 << 20;
    small.host_slot_bytes = 4 << 10;
    let rounds = if c.quick { 8 } else { 20 };
    let maxc = if c.host() {
        [12_000, 3001, 700, 9000]
    } else {
        [1_200_000, 300_001, 70_000, 900_000]
    };
    c.with_comm("cases_a2av_pieces", small, |c| {
        a2av_rounds(c, "pieces", rounds, 7000, &maxc)
    })
}

/// `rounds` all-to-all-v calls on random count matrices (parts of up to maxc[k % 4] elements),
/// dtypes in turn, every fifth in place, gaps between parts, direct access forced and automatic.
pub fn a2av_rounds(
    c: &mut Ctx,
    label: &str,
    rounds: usize,
    seed0: u64,
    maxc: &[usize; 4],
) -> Res<()> {
    let w = c.world;
    for k in 0..rounds {
        let seed = seed0 + k as u64;
        let m = splits_for(w, seed, maxc[k % 4]); // m[s][r]: elements s sends to r
        let dtype = [
            DataType::BF16,
            DataType::F8E4M3,
            DataType::F32,
            DataType::I64,
        ][k % 4];
        let in_place = k % 5 == 4;
        let m = if in_place {
            // In place needs equal offsets: symmetric counts.
            (0..w)
                .map(|s| (0..w).map(|r| m[s.min(r)][s.max(r)]).collect())
                .collect()
        } else {
            m
        };
        let gap = if in_place { 0 } else { k % 3 };
        let algo = if k % 2 == 0 { Algo::Direct } else { Algo::Auto };
        let label = format!("{label} {k}");
        a2av_call(c, &label, &m, dtype, in_place, gap, algo, seed)?;
    }
    Ok(())
}

/// One all-to-all-v call: `m[s][r]` elements from rank s to rank r, `gap` unused elements
/// after every part (send and receive side), checked against the inputs. In place, `m` must be
/// symmetric.
#[allow(clippy::too_many_arguments)]
pub fn a2av_call(
    c: &mut Ctx,
    label: &str,
    m: &[Vec<usize>],
    dtype: DataType,
    in_place: bool,
    gap: usize,
    algo: Algo,
    seed: u64,
) -> Res<()> {
    let (w, me, dev) = (c.world, c.rank, c.dev);
    let es = dtype.size();
    let send: Vec<usize> = m[me].clone();
    let recv: Vec<usize> = (0..w).map(|s| m[s][me]).collect();
    let displs = |cnt: &[usize]| -> Vec<usize> {
        let mut d = 0;
        cnt.iter()
            .map(|x| {
                let o = d;
                d += x + gap;
                o
            })
            .collect()
    };
    let splits = Splits {
        send_displs: displs(&send),
        recv_displs: displs(&recv),
        send_counts: send.clone(),
        recv_counts: recv.clone(),
    };
    let in_n = splits.send_displs[w - 1] + send[w - 1];
    let out_n = splits.recv_displs[w - 1] + recv[w - 1];
    let inputs: Vec<Vec<u8>> = (0..w)
        .map(|r| {
            let n: usize = m[r].iter().sum::<usize>() + gap * w;
            gen_bytes_fast(n * es, seed, r)
        })
        .collect();
    let part_of = |s: usize, r: usize| -> &[u8] {
        let d: usize = m[s][..r].iter().map(|x| x + gap).sum();
        &inputs[s][d * es..(d + m[s][r]) * es]
    };
    let inb = c.buf(in_n.max(out_n) * es)?;
    let outb = c.buf(in_n.max(out_n) * es)?;
    outb.poison()?;
    let opts = CallOpts::default().with_algo(algo);
    let input = if in_place {
        outb.upload(0, &inputs[me][..in_n * es])?;
        Input::InPlace
    } else {
        inb.upload(0, &inputs[me][..in_n * es])?;
        // SAFETY: this device's buffer holds the input; alive until after the sync below.
        Input::Buf(unsafe { inb.view(0, in_n, dtype, dev) })
    };
    // SAFETY: as above, the output.
    let out = unsafe { outb.view_mut(0, out_n, dtype, dev) };
    let r = c.comm.all_to_all_v(input, out, &splits, &opts);
    c.sync()?;
    let got = outb.download(0, out_n * es)?;
    let mut wrong = 0;
    for s in 0..w {
        let d = splits.recv_displs[s] * es;
        let want = part_of(s, me);
        wrong += diff_bytes(want, &got[d..d + want.len()], es);
    }
    let guard = outb.guard_hits(0, out_n * es)?;
    c.record(
        "all_to_all_v",
        format!("a2av {label} {dtype} {algo} counts {m:?} gap {gap} in_place={in_place}"),
        r,
        wrong,
        guard,
    );
    Ok(())
}

/// Device-count all-to-all-v: uneven counts with zeros, i32 and i64 counts, of elements and of
/// rows, overfull parts that must be truncated and reported; then the counts the kernel must
/// not trust ([`dynamic_faults`]).
pub fn dynamic(c: &mut Ctx) -> Res<()> {
    let w = c.world;
    let rounds = if c.quick { 6 } else { 16 };
    for k in 0..rounds {
        let seed = 9000 + k as u64;
        // Round 3 and every fourth after it: parts on both sides of the LL limit in one call.
        let cap = [16usize, 1000, 5000, c.pick(8000, 200_000)][k % 4];
        let overfull = k % 4 == 3 && k > 4;
        let mut m = splits_for(w, seed, cap + 1);
        if overfull {
            // Every rank receives one part that is too long.
            for s in 0..w {
                m[s][(s + 1) % w] = cap + 77;
            }
        }
        let dtype = [DataType::BF16, DataType::F32, DataType::U8][k % 3];
        let cdt = [DataType::I32, DataType::I64][k % 2];
        // Counts of rows from round 4: units of 3 f32, 5 u8 (parts at every byte alignment),
        // 2 u8, 64 bf16, 3 bf16, 7 f32.
        let unit = [1, 1, 1, 1, 3, 5, 1, 1, 2, 64, 1, 1, 3, 7, 1, 1][k];
        let label = format!("round {k}");
        dynamic_call(c, &label, &m, cap, unit, dtype, cdt, overfull, seed)?;
    }
    dynamic_faults(c)
}

/// `counts` as `cdt` (i32 or i64) in a buffer of this context's device.
pub fn counts_buf(c: &Ctx, cdt: DataType, counts: &[i64]) -> Res<Buf> {
    let enc: Vec<u8> = counts
        .iter()
        .flat_map(|&x| {
            if cdt == DataType::I32 {
                (x as i32).to_le_bytes().to_vec()
            } else {
                x.to_le_bytes().to_vec()
            }
        })
        .collect();
    let b = c.buf(counts.len() * 8)?;
    b.upload(0, &enc)?;
    Ok(b)
}

/// One packed device-count all-to-all-v (NCCLX's device_alltoallv_single): this rank's
/// `input` bytes, its send and receive counts (units of `unit` elements) uploaded as `cdt`, a
/// poisoned output of `out_units` units. Returns the call's result, the output's bytes and
/// writes past it.
#[allow(clippy::too_many_arguments)]
pub fn run_packed(
    c: &Ctx,
    input: &[u8],
    dtype: DataType,
    cdt: DataType,
    send: &[i64],
    recv: &[i64],
    out_units: usize,
    unit: usize,
) -> Res<(ferrocomm::Result<()>, Vec<u8>, usize)> {
    let (w, dev) = (c.world, c.dev);
    let es = dtype.size() * unit;
    let inb = c.buf(input.len().max(es))?;
    inb.upload(0, input)?;
    let outb = c.buf(out_units * es)?;
    outb.poison()?;
    let scb = counts_buf(c, cdt, send)?;
    let rcb = counts_buf(c, cdt, recv)?;
    c.sync()?;
    // SAFETY: buffers of this device of the sizes given; synchronised below.
    let r = unsafe {
        c.comm.all_to_all_v_dynamic_packed(
            inb.view(0, input.len() / dtype.size(), dtype, dev),
            outb.view_mut(0, out_units * unit, dtype, dev),
            PackedCounts {
                send: scb.view(0, w, cdt, dev),
                recv: rcb.view(0, w, cdt, dev),
                unit,
            },
            &CallOpts::default(),
        )
    };
    c.sync()?;
    let got = outb.download(0, out_units * es)?;
    let guard = outb.guard_hits(0, out_units * es)?;
    Ok((r, got, guard))
}

/// One packed device-count all-to-all-v: `m[s][r]` units of `unit` elements from rank s to
/// rank r, both sides' counts of type `cdt` in device memory, an output of exactly the units
/// received and a tail of 5 that must keep its poison.
pub fn packed_call(
    c: &mut Ctx,
    label: &str,
    m: &[Vec<usize>],
    unit: usize,
    dtype: DataType,
    cdt: DataType,
    seed: u64,
) -> Res<()> {
    let (w, me) = (c.world, c.rank);
    let us = dtype.size() * unit;
    let inputs: Vec<Vec<u8>> = (0..w)
        .map(|r| gen_bytes_fast(m[r].iter().sum::<usize>() * us, seed, r))
        .collect();
    let send: Vec<i64> = m[me].iter().map(|&x| x as i64).collect();
    let recv: Vec<i64> = (0..w).map(|s| m[s][me] as i64).collect();
    let total: usize = (0..w).map(|s| m[s][me]).sum();
    let tail = 5;
    let (r, got, guard) = run_packed(c, &inputs[me], dtype, cdt, &send, &recv, total + tail, unit)?;
    let mut want = Vec::new();
    for (s, inp) in inputs.iter().enumerate() {
        let off: usize = m[s][..me].iter().sum();
        want.extend_from_slice(&inp[off * us..(off + m[s][me]) * us]);
    }
    let wrong = diff_bytes(&want, &got[..total * us], dtype.size()) + written(&got[total * us..]);
    c.record(
        "a2av_dynamic_packed",
        format!("packed {label} {dtype} {cdt} counts x {unit}, counts {m:?}"),
        r,
        wrong,
        guard,
    );
    Ok(())
}

/// The packed device-count all-to-all-v (NCCLX's device_alltoallv_single): counts of both
/// sides in device memory, uneven with zeros, of elements and of rows, a tail of the output
/// past the parts that must keep its poison.
pub fn dynamic_packed(c: &mut Ctx) -> Res<()> {
    let w = c.world;
    let rounds = if c.quick { 5 } else { 12 };
    for k in 0..rounds {
        let seed = 9700 + k as u64;
        let m = splits_for(
            w,
            seed,
            [16usize, 1000, 5000, c.pick(6000, 60_000)][k % 4] + 1,
        );
        let unit = [1, 3, 1, 5, 7, 1, 64, 2, 1, 1, 3, 1][k];
        let dtype = [DataType::BF16, DataType::F32, DataType::U8][k % 3];
        let cdt = [DataType::I32, DataType::I64][k % 2];
        packed_call(c, &format!("round {k}"), &m, unit, dtype, cdt, seed)?;
    }
    Ok(())
}

/// What one device-count all-to-all-v left behind: the call's result, the output's bytes,
/// the counts received (as i64) and writes past the output (guard hits).
pub struct DynOut {
    pub r: ferrocomm::Result<()>,
    pub got: Vec<u8>,
    pub recv: Vec<i64>,
    pub guard: usize,
}

/// Runs one device-count all-to-all-v: this rank's `input` bytes (elements of `dtype`), its
/// send `counts` (units of `unit` elements) uploaded as `cdt` (i32 or i64), a poisoned output
/// of `cap` units per sender.
#[allow(clippy::too_many_arguments)]
pub fn run_dynamic(
    c: &Ctx,
    input: &[u8],
    dtype: DataType,
    cdt: DataType,
    counts: &[i64],
    cap: usize,
    unit: usize,
) -> Res<DynOut> {
    let (w, dev) = (c.world, c.dev);
    let in_n = input.len() / dtype.size();
    let es = dtype.size() * unit;
    let inb = c.buf(input.len().max(es))?;
    inb.upload(0, input)?;
    let outb = c.buf(w * cap * es)?;
    outb.poison()?;
    let scb = counts_buf(c, cdt, counts)?;
    let rcb = c.buf(w * 8)?;
    rcb.poison()?;
    c.sync()?;
    // SAFETY: buffers of this device of the sizes given; synchronised below.
    let r = unsafe {
        c.comm.all_to_all_v_dynamic(
            inb.view(0, in_n, dtype, dev),
            outb.view_mut(0, w * cap * unit, dtype, dev),
            DeviceCounts {
                send: scb.view(0, w, cdt, dev),
                recv: rcb.view_mut(0, w, cdt, dev),
                capacity: cap,
                unit,
            },
            &CallOpts::default(),
        )
    };
    c.sync()?;
    let got = outb.download(0, w * cap * es)?;
    let rc = rcb.download(0, w * cdt.size())?;
    let recv = rc
        .chunks(cdt.size())
        .map(|b| match b.len() {
            4 => i32::from_le_bytes(b.try_into().expect("4 bytes")) as i64,
            _ => i64::from_le_bytes(b.try_into().expect("8 bytes")),
        })
        .collect();
    let guard = outb.guard_hits(0, w * cap * es)?;
    Ok(DynOut {
        r,
        got,
        recv,
        guard,
    })
}

/// One device-count all-to-all-v: `m[s][r]` units of `unit` elements from rank s to rank r,
/// counts of type `cdt` in device memory, `cap` units of room per sender. With `overfull`, a
/// part longer than `cap` must arrive truncated and be reported ([`Ctx::reported`]).
#[allow(clippy::too_many_arguments)]
pub fn dynamic_call(
    c: &mut Ctx,
    label: &str,
    m: &[Vec<usize>],
    cap: usize,
    unit: usize,
    dtype: DataType,
    cdt: DataType,
    overfull: bool,
    seed: u64,
) -> Res<()> {
    let (w, me) = (c.world, c.rank);
    let es = dtype.size() * unit;
    let inputs: Vec<Vec<u8>> = (0..w)
        .map(|r| gen_bytes_fast(m[r].iter().sum::<usize>() * es, seed, r))
        .collect();
    let counts: Vec<i64> = m[me].iter().map(|&x| x as i64).collect();
    let mut out = run_dynamic(c, &inputs[me], dtype, cdt, &counts, cap, unit)?;
    let mut wrong = 0;
    for s in 0..w {
        let cnt = m[s][me].min(cap);
        let d: usize = m[s][..me].iter().sum();
        let want = &inputs[s][d * es..(d + cnt) * es];
        wrong += diff_bytes(want, &out.got[s * cap * es..s * cap * es + cnt * es], es);
        wrong += usize::from(out.recv[s] != cnt as i64);
    }
    let what = format!("dynamic {label} {dtype} {cdt} counts, cap {cap} x {unit}, counts {m:?}");
    if overfull {
        out.r = c.reported(&format!("overfull part ({what})"), out.r, "capacity")?;
    }
    c.record("a2av_dynamic", what, out.r, wrong, out.guard);
    Ok(())
}

/// Counts the kernel must not take at face value: a negative i32/i64 count sends nothing (the
/// receiver is told 0 and its part stays untouched); send counts that run past the end of the
/// input are cut there, the receiver is told only what exists (never a stale slot) and the
/// sender's fault is reported ([`Ctx::reported`]), after which the communicator works again.
pub fn dynamic_faults(c: &mut Ctx) -> Res<()> {
    let (w, me) = (c.world, c.rank);
    let dtype = DataType::F32;
    let es = 4;
    let cap = 300usize;
    for (k, (past_input, cdt)) in [
        (false, DataType::I32),
        (false, DataType::I64),
        (true, DataType::I32),
        (true, DataType::I64),
    ]
    .into_iter()
    .enumerate()
    {
        let seed = 9500 + k as u64;
        // Real part lengths (what exists in each input) and the counts each rank passes.
        let real = splits_for(w, seed, cap - 20);
        let mut claimed: Vec<Vec<i64>> = real
            .iter()
            .map(|r| r.iter().map(|&x| x as i64).collect())
            .collect();
        for s in 0..w {
            if past_input {
                claimed[s][w - 1] += 7; // 7 elements past the end of the input
            } else {
                claimed[s][(s + 1) % w] = -5;
            }
        }
        // What rank s's part for p really holds after the kernel's rules.
        let eff = |s: usize, p: usize| -> usize {
            if !past_input && p == (s + 1) % w {
                0
            } else {
                real[s][p]
            }
        };
        let in_len = |s: usize| -> usize { (0..w).map(|p| eff(s, p)).sum() };
        let inputs: Vec<Vec<u8>> = (0..w)
            .map(|r| gen_bytes_fast(in_len(r).max(1) * es, seed, r))
            .collect();
        let input = &inputs[me][..in_len(me) * es];
        let mut out = run_dynamic(c, input, dtype, cdt, &claimed[me], cap, 1)?;
        let mut wrong = 0;
        for (s, input) in inputs.iter().enumerate() {
            let cnt = eff(s, me);
            let d: usize = (0..me).map(|p| eff(s, p)).sum();
            let part = &out.got[s * cap * es..(s + 1) * cap * es];
            wrong += diff_bytes(&input[d * es..(d + cnt) * es], &part[..cnt * es], es);
            // Past the received length the output keeps its poison.
            wrong += written(&part[cnt * es..]);
            wrong += usize::from(out.recv[s] != cnt as i64);
        }
        let what = if past_input {
            "counts past the input"
        } else {
            "negative counts"
        };
        let what = format!("{what}, {cdt} counts {claimed:?}");
        if past_input {
            out.r = c.reported(&what, out.r, "send counts")?;
        } else {
            // Nothing to report: the next two calls work.
            for k in 0..2 {
                let next = c.next_call()?;
                c.expect("bad_input", next.is_ok(), || {
                    format!("{what}: call {k} after: {next:?}")
                });
            }
        }
        c.record("a2av_dynamic_faults", what, out.r, wrong, out.guard);
    }
    Ok(())
}

/// Batches of sends and receives (`batch_send_recv`): every rank sends two messages and receives
/// two, sends and receives interleaved in issue order, at LL sizes and a staged one: to the next
/// rank and the one after it (at two ranks both to the other one, by direct access, where both
/// ranks must meet every message in one order), random data, outputs poisoned, inputs checked
/// unchanged.
pub fn batches(c: &mut Ctx) -> Res<()> {
    if !has_p2p(&c.comm) {
        return Ok(());
    }
    let (w, me, dev) = (c.world, c.rank, c.dev);
    // Message j goes `hop(j)` ranks ahead.
    let hop = |j: usize| if w == 2 { 1 } else { 1 + j };
    let d = DataType::BF16;
    for (k, n) in [3001usize, c.pick(15_001, 150_001), 7]
        .into_iter()
        .enumerate()
    {
        let seed = 70_000 + k as u64;
        // Message j from rank s has n + j + s elements (every message its own size).
        let len = |s: usize, j: usize| n + j + s;
        let data = |s: usize, j: usize| gen(d, len(s, j), seed + j as u64, s, false);
        let from = |j: usize| (me + w - hop(j)) % w;
        let ins: Vec<Buf> = (0..2).map(|j| c.buf(len(me, j) * 2)).collect::<Res<_>>()?;
        let outs: Vec<Buf> = (0..2)
            .map(|j| c.buf(len(from(j), j) * 2))
            .collect::<Res<_>>()?;
        for j in 0..2 {
            ins[j].upload(0, &data(me, j))?;
            outs[j].poison()?;
        }
        c.sync()?;
        let mut ops = Vec::new();
        for j in 0..2 {
            // SAFETY: the buffers hold the lengths given and outlive the call (synchronised
            // below).
            unsafe {
                ops.push(P2pOp::Send {
                    data: ins[j].view(0, len(me, j), d, dev),
                    peer: (me + hop(j)) % w,
                });
                ops.push(P2pOp::Recv {
                    out: outs[j].view_mut(0, len(from(j), j), d, dev),
                    peer: from(j),
                });
            }
        }
        let r = c.comm.batch_send_recv(ops, &CallOpts::default());
        c.sync()?;
        let (mut wrong, mut guard) = (0, 0);
        for j in 0..2 {
            let got = outs[j].download(0, len(from(j), j) * 2)?;
            wrong += diff_bytes(&data(from(j), j), &got, 2);
            guard += outs[j].guard_hits(0, len(from(j), j) * 2)?;
            wrong += diff_bytes(&data(me, j), &ins[j].download(0, len(me, j) * 2)?, 2);
        }
        c.record("batch", format!("batch n={n}"), r, wrong, guard);
    }
    Ok(())
}
