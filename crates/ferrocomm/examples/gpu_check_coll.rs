//! Device correctness check of the direct-access all-gather, reduce-scatter, all-to-all(v),
//! broadcast, reduce and device-count all-to-all-v (run on a GPU machine):
//!
//! ```text
//! ferrocomm launch -n 2 -- target/release/examples/gpu_check_coll [--quick] [--sanitize]
//! ```
//!
//! `--sanitize` runs only a small set of calls that reaches every kernel form (see
//! `sanitize_cases`), for compute-sanitizer (scripts/gpu_sanitize.sh).
//!
//! Random data (never zeros), outputs poisoned before every call (and a poisoned guard past
//! the end that must stay untouched), every result compared with a host reference (bytes for
//! data movement, f64 / exact integers for reductions). Sizes 0, odd, unaligned, up to 64 MB;
//! every root; uneven all-to-all-v counts with zeros; CUDA graph capture and replay;
//! back-to-back mixed collectives; disagreeing counts and overfull capacities. Exits 1 on any
//! wrong element.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cudarc::driver::sys;
use ferrocomm::bootstrap::{all_gather_bytes, store_barrier};
use ferrocomm::{
    Algo, CallOpts, Collective, Communicator, Config, DataType, Device, DeviceCounts, Input,
    PackedCounts, Splits, View, ViewMut,
};
use rand::{Rng, SeedableRng};

mod support;
use support::*;

// ---------------------------------------------------------------- data and references

/// Random element bytes of `rank` for case `seed` (every rank can compute every rank's data).
fn gen(dtype: DataType, count: usize, seed: u64, rank: usize, prod: bool) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed.wrapping_mul(1_000_003) + rank as u64);
    let mut out = Vec::with_capacity(count * dtype.size());
    for _ in 0..count {
        let f: f64 = if prod {
            rng.random_range(0.5..1.5)
        } else {
            let v: f64 = rng.random_range(0.05..1.0);
            if rng.random_bool(0.5) {
                -v
            } else {
                v
            }
        };
        let i: i64 = if prod {
            rng.random_range(1..=3)
        } else {
            rng.random_range(1..1000) * if rng.random_bool(0.5) { -1 } else { 1 }
        };
        match dtype {
            DataType::F32 => out.extend_from_slice(&(f as f32).to_le_bytes()),
            DataType::F16 => out.extend_from_slice(&half::f16::from_f64(f).to_le_bytes()),
            DataType::BF16 => out.extend_from_slice(&half::bf16::from_f64(f).to_le_bytes()),
            DataType::I32 => out.extend_from_slice(&(i as i32).to_le_bytes()),
            DataType::U32 => out.extend_from_slice(&(i.unsigned_abs() as u32).to_le_bytes()),
            DataType::I64 => out.extend_from_slice(&i.to_le_bytes()),
            DataType::U64 => out.extend_from_slice(&i.unsigned_abs().to_le_bytes()),
            // Bytes types: any nonzero byte (fp8 and int8 move as bytes).
            _ => {
                for _ in 0..dtype.size() {
                    out.push(rng.random_range(1..=255u8));
                }
            }
        }
    }
    out
}

/// Large byte inputs are cheaper as a keyed pattern than as RNG output.
fn gen_bytes_fast(bytes: usize, seed: u64, rank: usize) -> Vec<u8> {
    let mut x =
        seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ ((rank as u64 + 1) * 0xD1B5_4A32_D192_ED03);
    let mut v = Vec::with_capacity(bytes);
    while v.len() < bytes {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&(x | 0x0101_0101_0101_0101).to_le_bytes());
    }
    v.truncate(bytes);
    v
}

/// Wrong elements of `got` (elements [first, first+len) of every rank's input reduced).
fn check_reduce(dtype: DataType, op: OpK, parts: &[&[u8]], got: &[u8]) -> usize {
    let es = dtype.size();
    let n = parts.len();
    let mut wrong = 0;
    for i in 0..got.len() / es {
        let el = |r: usize| &parts[r][i * es..(i + 1) * es];
        let g = &got[i * es..(i + 1) * es];
        let ok = element_ok(dtype, op, n, el, g);
        if !ok {
            wrong += 1;
        }
    }
    wrong
}

fn diff_bytes(want: &[u8], got: &[u8], es: usize) -> usize {
    want.chunks(es.max(1))
        .zip(got.chunks(es.max(1)))
        .filter(|(a, b)| a != b)
        .count()
}

// ---------------------------------------------------------------- harness

#[derive(Default)]
struct Tally {
    cases: usize,
    wrong: usize,
    guard: usize,
    errors: usize,
}

struct Ctx {
    comm: Communicator,
    rank: usize,
    world: usize,
    dev: Device,
    tally: BTreeMap<String, Tally>,
    failures: Vec<String>,
}

impl Ctx {
    fn record(
        &mut self,
        key: &str,
        what: String,
        r: ferrocomm::Result<()>,
        wrong: usize,
        guard: usize,
    ) {
        let t = self.tally.entry(key.to_string()).or_default();
        t.cases += 1;
        match r {
            Err(e) => {
                t.errors += 1;
                self.failures.push(format!("{what}: error {e}"));
            }
            Ok(()) => {
                t.wrong += wrong;
                t.guard += guard;
                if wrong + guard > 0 {
                    self.failures.push(format!(
                        "{what}: {wrong} wrong elements, {guard} guard bytes hit"
                    ));
                }
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Coll {
    AllGather,
    AllToAll,
    Broadcast(usize),
    ReduceScatter(OpK),
    Reduce(OpK, usize),
    /// A message from the rank given to the next one (send on one, recv on the other; the
    /// rest take no part).
    SendRecv(usize),
}

/// Whether this communicator can run point-to-point at all (not above two ranks without NCCL,
/// as with `--share-gpus`).
fn has_p2p(comm: &Communicator) -> bool {
    comm.size() > 1
        && comm
            .algo_for(Collective::Send, 4, DataType::BF16, &CallOpts::default())
            .is_ok()
}

/// The sender's send or the next rank's receive of one message from `sender` (`Coll::SendRecv`);
/// other ranks do nothing.
fn p2p(
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

/// One call of `coll` with `n` elements per part, checked against the host reference.
#[allow(clippy::too_many_arguments)]
fn run_one(
    c: &mut Ctx,
    coll: Coll,
    dtype: DataType,
    n: usize,
    algo: Algo,
    in_place: bool,
    misalign: usize,
    seed: u64,
) -> Res<()> {
    let w = c.world;
    let es = dtype.size();
    let prod = matches!(
        coll,
        Coll::ReduceScatter(OpK::Prod) | Coll::Reduce(OpK::Prod, _)
    );
    // Elements of the input and output buffers.
    let (in_n, out_n) = match coll {
        Coll::AllGather => (n, n * w),
        Coll::AllToAll => (n * w, n * w),
        Coll::Broadcast(_) | Coll::Reduce(..) | Coll::SendRecv(_) => (n, n),
        Coll::ReduceScatter(_) => (n * w, n),
    };
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
    let inb = Buf::new(buf_bytes)?;
    let outb = Buf::new(buf_bytes)?;
    outb.poison()?;
    inb.poison()?;
    let me = c.rank;
    let dev = c.dev;
    let opts = CallOpts::default().with_algo(algo);
    let op_ptr = outb.ptr + off as u64;
    // In place: the input sits where the collective expects it inside the output.
    let r = unsafe {
        // SAFETY: the buffers hold `buf_bytes` (+ guard) of this device and outlive the call
        // (synchronised below).
        let o = ViewMut::from_raw(op_ptr as *mut u8, out_n, dtype, dev);
        let input = if in_place {
            match coll {
                Coll::AllGather => outb.upload(off + me * n * es, &inputs[me])?,
                _ => outb.upload(off, &inputs[me])?,
            }
            Input::InPlace
        } else {
            inb.upload(off, &inputs[me])?;
            Input::Buf(View::from_raw(
                (inb.ptr + off as u64) as *const u8,
                in_n,
                dtype,
                dev,
            ))
        };
        match coll {
            Coll::AllGather => c.comm.all_gather(input, o, &opts),
            Coll::AllToAll => c.comm.all_to_all(input, o, &opts),
            Coll::Broadcast(root) => c.comm.broadcast(input, o, root, &opts),
            Coll::ReduceScatter(op) => {
                let o = if in_place {
                    ViewMut::from_raw(op_ptr as *mut u8, n * w, dtype, dev)
                } else {
                    o
                };
                c.comm.reduce_scatter(input, o, op.op(), &opts)
            }
            Coll::Reduce(op, root) => c.comm.reduce(input, o, op.op(), root, &opts),
            Coll::SendRecv(sender) => {
                let Input::Buf(i) = input else {
                    unreachable!("point-to-point runs out of place")
                };
                p2p(&c.comm, sender, i, o, &opts)
            }
        }
    };
    sync()?;
    // What the output must hold, and where.
    let (got_off, got_len) = match coll {
        Coll::ReduceScatter(_) if in_place => (off + me * n * es, n * es),
        _ => (off, out_n * es),
    };
    let got = outb.download(got_off, got_len)?;
    let mut wrong = 0;
    let guard = if in_place && matches!(coll, Coll::ReduceScatter(_)) {
        outb.guard_hits(off, n * w * es)?
    } else {
        outb.guard_hits(off, out_n * es)?
    };
    match coll {
        Coll::AllGather => {
            let want: Vec<u8> = inputs.concat();
            wrong = diff_bytes(&want, &got, es);
        }
        Coll::AllToAll => {
            let want: Vec<u8> = (0..w)
                .flat_map(|s| inputs[s][me * n * es..(me + 1) * n * es].to_vec())
                .collect();
            wrong = diff_bytes(&want, &got, es);
        }
        Coll::Broadcast(root) => {
            wrong = diff_bytes(&inputs[root], &got, es);
        }
        Coll::ReduceScatter(op) => {
            let parts: Vec<&[u8]> = inputs
                .iter()
                .map(|v| &v[me * n * es..(me + 1) * n * es])
                .collect();
            wrong = check_reduce(dtype, op, &parts, &got);
        }
        Coll::Reduce(op, root) => {
            if me == root {
                let parts: Vec<&[u8]> = inputs.iter().map(|v| &v[..]).collect();
                wrong = check_reduce(dtype, op, &parts, &got);
            } else if !in_place {
                // Non-root outputs are not written.
                wrong = got.iter().filter(|b| **b != POISON).count().min(1);
            }
        }
        Coll::SendRecv(sender) => {
            if me == (sender + 1) % w {
                wrong = diff_bytes(&inputs[sender], &got, es);
            } else {
                // Nothing else is written (the sender's output stays poisoned) and the
                // sender's buffer is only read.
                wrong = got.iter().filter(|b| **b != POISON).count().min(1);
                let sent = inb.download(off, in_n * es)?;
                wrong += diff_bytes(&inputs[me], &sent, es);
            }
        }
    }
    let key = match coll {
        Coll::AllGather => "all_gather",
        Coll::AllToAll => "all_to_all",
        Coll::Broadcast(_) => "broadcast",
        Coll::ReduceScatter(_) => "reduce_scatter",
        Coll::Reduce(..) => "reduce",
        Coll::SendRecv(_) => "send_recv",
    };
    let what = format!("{coll:?} {dtype} n={n} {algo} in_place={in_place} misalign={misalign}");
    c.record(key, what, r, wrong, guard);
    Ok(())
}

const MOVE_TYPES: [DataType; 5] = [
    DataType::BF16,
    DataType::F8E4M3,
    DataType::I8,
    DataType::F32,
    DataType::U64,
];
const RED_TYPES: [DataType; 7] = [
    DataType::F32,
    DataType::F16,
    DataType::BF16,
    DataType::I32,
    DataType::U32,
    DataType::I64,
    DataType::U64,
];

/// The handful of cases run under compute-sanitizer (memcheck, racecheck): every direct-access
/// kernel at least once in each form it has. All-gather, all-to-all, reduce-scatter, broadcast
/// and reduce (roots 0 and the last rank), and at two ranks send/recv both ways, at an LL size and
/// a staged size, in and out of place, aligned and one element off; all-gather,
/// reduce-scatter and all-to-all (in and out of place) at a pipelined size; byte moves; every
/// reduction kernel (avg, prod, min, max on f32, f16, u32, i64); all-to-all-v with uneven counts
/// and a zero, in and out of place; device-count all-to-all-v with i32 and i64 counts, a
/// truncated part and the counts the kernel must not trust. Counts are odd throughout.
fn sanitize_cases(c: &mut Ctx, cfg: &Config) -> Res<()> {
    let ll_max = cfg.tuning.ll_max_bytes;
    let w = c.world;
    let mut seed = 60_000u64;
    // Elements per part: LL lines up to 8-byte elements, staged from 1-byte elements.
    let (n_ll, n_st) = (3001usize, 300_001usize);
    assert!(n_ll * 8 <= ll_max && n_st > ll_max);
    let colls = [
        Coll::AllGather,
        Coll::AllToAll,
        Coll::ReduceScatter(OpK::Sum),
        Coll::Broadcast(0),
        Coll::Broadcast(w - 1),
        Coll::Reduce(OpK::Sum, 0),
        Coll::Reduce(OpK::Sum, w - 1),
    ];
    // Direct point-to-point (two ranks): both directions.
    let p2p = [Coll::SendRecv(0), Coll::SendRecv(w - 1)];
    let p2p = if w == 2 { &p2p[..] } else { &[] };
    for &coll in colls.iter().chain(p2p) {
        for (k, n) in [n_ll, n_st].into_iter().enumerate() {
            for in_place in [false, true] {
                seed += 1;
                let misalign = (k + in_place as usize) % 2;
                run_one(
                    c,
                    coll,
                    DataType::BF16,
                    n,
                    Algo::Direct,
                    in_place,
                    misalign,
                    seed,
                )?;
            }
        }
    }
    // The pipelined kernels (from their smallest part): out of place one element off, in place.
    for (coll, kernel, in_place) in [
        (Coll::AllGather, "all_gather", false),
        (Coll::ReduceScatter(OpK::Sum), "reduce_scatter", true),
        (Coll::AllToAll, "all_to_all", false),
        (Coll::AllToAll, "all_to_all", true),
    ] {
        seed += 1;
        let n_rw = cfg.tuning.pipe_min(kernel).expect("pipelined") / 2 + 3;
        let misalign = !in_place as usize;
        run_one(
            c,
            coll,
            DataType::BF16,
            n_rw,
            Algo::Direct,
            in_place,
            misalign,
            seed,
        )?;
    }
    // Other element sizes: byte moves; every reduction kernel (sum with the division of avg,
    // prod, min, max) on 2-, 4- and 8-byte elements.
    for (k, n) in [n_ll, n_st].into_iter().enumerate() {
        for coll in [Coll::AllGather, Coll::AllToAll, Coll::Broadcast(w - 1)] {
            seed += 1;
            run_one(c, coll, DataType::U8, n, Algo::Direct, k == 1, 0, seed)?;
        }
        for (d, op) in [
            (DataType::F32, OpK::Avg),
            (DataType::F16, OpK::Prod),
            (DataType::U32, OpK::Min),
            (DataType::I64, OpK::Max),
        ] {
            for coll in [Coll::ReduceScatter(op), Coll::Reduce(op, w - 1)] {
                seed += 1;
                run_one(c, coll, d, n, Algo::Direct, k == 0, k, seed)?;
            }
        }
    }
    // Uneven counts: small and large parts, and rank 0 sends nothing to the last rank (in
    // place: to itself, as in-place counts must be symmetric).
    let uneven = |zero: (usize, usize)| -> Vec<Vec<usize>> {
        (0..w)
            .map(|s| {
                (0..w)
                    .map(|r| {
                        if (s, r) == zero {
                            0
                        } else {
                            [3001, 50_001][(s + r) % 2]
                        }
                    })
                    .collect()
            })
            .collect()
    };
    let direct = Algo::Direct;
    a2av_call(
        c,
        "sanitize",
        &uneven((0, w - 1)),
        DataType::BF16,
        false,
        1,
        direct,
        61_001,
    )?;
    a2av_call(
        c,
        "sanitize",
        &uneven((0, 0)),
        DataType::F32,
        true,
        0,
        direct,
        61_002,
    )?;
    // Small parts: the LL form at two ranks.
    let small: Vec<Vec<usize>> = (0..w)
        .map(|s| (0..w).map(|r| [7, 1001][(s + r) % 2]).collect())
        .collect();
    a2av_call(
        c,
        "sanitize LL",
        &small,
        DataType::BF16,
        false,
        1,
        direct,
        61_003,
    )?;
    a2av_call(
        c,
        "sanitize LL",
        &small,
        DataType::F32,
        true,
        0,
        direct,
        61_004,
    )?;
    // In pieces: a 1 MiB staging, crossing parts of 600 KB (two or more pieces at every world).
    let mut small_cfg = cfg.clone();
    small_cfg.cuda_staging_bytes = 1 << 20;
    let comm = comm_with("gpu_check_coll_sanitize_pieces", small_cfg)?;
    let main = std::mem::replace(&mut c.comm, comm);
    let big: Vec<Vec<usize>> = (0..w)
        .map(|s| (0..w).map(|r| [300_007, 3][(s + r + 1) % 2]).collect())
        .collect();
    let r = a2av_call(
        c,
        "sanitize pieces",
        &big,
        DataType::BF16,
        false,
        1,
        direct,
        61_005,
    );
    c.comm = main;
    r?;
    let m = uneven((0, w - 1));
    dynamic_call(
        c,
        "sanitize",
        &m,
        60_000,
        1,
        DataType::BF16,
        DataType::I32,
        false,
        62_001,
    )?;
    dynamic_call(
        c,
        "sanitize",
        &m,
        50_001,
        1,
        DataType::U8,
        DataType::I64,
        false,
        62_002,
    )?;
    // Packed (both sides' counts on the device, the verdict round): rows of 3 bf16.
    packed_call(c, "sanitize", &m, 3, DataType::BF16, DataType::I32, 62_005)?;
    // Rows of 3 bf16 (6 bytes): parts at every alignment.
    dynamic_call(
        c,
        "sanitize rows",
        &m,
        50_001,
        3,
        DataType::BF16,
        DataType::I64,
        false,
        62_004,
    )?;
    // Every rank receives one part longer than the capacity: truncated, reported by the next
    // call; the other parts are short or empty.
    let cap = 3001;
    let m: Vec<Vec<usize>> = (0..w)
        .map(|s| {
            (0..w)
                .map(|r| {
                    if r == (s + 1) % w {
                        cap + 77
                    } else {
                        [0, 7, 1001][(s + r) % 3]
                    }
                })
                .collect()
        })
        .collect();
    dynamic_call(
        c,
        "sanitize",
        &m,
        cap,
        1,
        DataType::F32,
        DataType::I32,
        true,
        62_003,
    )?;
    dynamic_faults(c)
}

fn matrix(c: &mut Ctx, quick: bool) -> Res<()> {
    let w = c.world;
    let mut seed = 1u64;
    let small: &[usize] = &[0, 1, 3, 8, 33, 1000, 4097, 20_001, 70_003];
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
                    run_one(
                        c,
                        *coll,
                        d,
                        n,
                        algo,
                        (si + ai) % 2 == 0,
                        (si + ai) % 3 / 2,
                        seed,
                    )?;
                }
            }
        }
    }
    for d in RED_TYPES {
        let ops: &[OpK] = if d.is_float() {
            &[
                OpK::Sum,
                OpK::Avg,
                OpK::Prod,
                OpK::Min,
                OpK::Max,
                OpK::PremulSum,
            ]
        } else {
            &[OpK::Sum, OpK::Avg, OpK::Prod, OpK::Min, OpK::Max]
        };
        for &op in ops {
            for (si, &n) in small.iter().enumerate() {
                if quick && si % 2 == 0 {
                    continue;
                }
                seed += 1;
                let ip = (si + seed as usize) % 2 == 0;
                let mis = si % 3 / 2;
                run_one(
                    c,
                    Coll::ReduceScatter(op),
                    d,
                    n,
                    Algo::Direct,
                    ip,
                    mis,
                    seed,
                )?;
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
    // Large: bf16 sums and moves up to 64 MB per buffer, direct and auto.
    let big: &[usize] = if quick {
        &[(1 << 20) + 3, 8 << 20]
    } else {
        &[(1 << 20) + 3, 4 << 20, (32 << 20) / w]
    };
    for &b in big {
        let n = b / 2;
        for algo in [Algo::Direct, Algo::Auto] {
            seed += 1;
            run_one(
                c,
                Coll::AllGather,
                DataType::BF16,
                n / w,
                algo,
                seed % 2 == 0,
                0,
                seed,
            )?;
            run_one(
                c,
                Coll::AllToAll,
                DataType::BF16,
                n / w,
                algo,
                seed % 2 == 1,
                0,
                seed,
            )?;
            run_one(
                c,
                Coll::Broadcast(seed as usize % w),
                DataType::BF16,
                n,
                algo,
                false,
                0,
                seed,
            )?;
            run_one(
                c,
                Coll::ReduceScatter(OpK::Sum),
                DataType::BF16,
                n / w,
                algo,
                false,
                0,
                seed,
            )?;
            run_one(
                c,
                Coll::Reduce(OpK::Sum, 0),
                DataType::BF16,
                n,
                algo,
                false,
                0,
                seed,
            )?;
            if p2p && (w == 2 || algo == Algo::Auto) {
                run_one(
                    c,
                    Coll::SendRecv(seed as usize % w),
                    DataType::BF16,
                    n,
                    algo,
                    false,
                    0,
                    seed,
                )?;
            }
        }
    }
    // 64 MB gathered output.
    seed += 1;
    run_one(
        c,
        Coll::AllGather,
        DataType::BF16,
        (32 << 20) / w,
        Algo::Direct,
        false,
        0,
        seed,
    )?;
    Ok(())
}

/// Uneven counts with zeros and gaps; every rank derives every rank's splits from the seed.
fn splits_for(w: usize, seed: u64, max: usize) -> Vec<Vec<usize>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
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

fn a2av(c: &mut Ctx, quick: bool) -> Res<()> {
    a2av_rounds(
        c,
        "round",
        if quick { 12 } else { 40 },
        5000,
        &[10, 3000, 70_000, 600_000],
    )
}

/// All-to-all-v cut into pieces: a communicator whose 1 MiB staging has slots of 1 MiB / world,
/// and parts of up to 1.2 M elements, so a call at two ranks (one launch per piece of a slot)
/// takes up to 3 pieces of 1-byte elements, 5 of bf16, 10 of f32 and 19 of i64, and one above
/// (pair by pair in pieces of half a slot) up to 75 of i64 at four ranks; skewed, zero and odd
/// counts, in and out of place, direct access forced and chosen.
fn a2av_in_pieces(c: &mut Ctx, cfg: &Config, quick: bool) -> Res<()> {
    let mut small = cfg.clone();
    small.cuda_staging_bytes = 1 << 20;
    let comm = comm_with("gpu_check_coll_small", small)?;
    let main = std::mem::replace(&mut c.comm, comm);
    let rounds = if quick { 8 } else { 20 };
    let r = a2av_rounds(
        c,
        "pieces",
        rounds,
        7000,
        &[1_200_000, 300_001, 70_000, 900_000],
    );
    c.comm = main;
    r
}

/// `rounds` all-to-all-v calls on random count matrices (parts of up to maxc[k % 4] elements),
/// dtypes in turn, every fifth in place, gaps between parts, direct access forced and automatic.
fn a2av_rounds(c: &mut Ctx, label: &str, rounds: usize, seed0: u64, maxc: &[usize; 4]) -> Res<()> {
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
        a2av_call(
            c,
            &format!("{label} {k}"),
            &m,
            dtype,
            in_place,
            gap,
            algo,
            seed,
        )?;
    }
    Ok(())
}

/// One all-to-all-v call: `m[s][r]` elements from rank s to rank r, `gap` unused elements
/// after every part (send and receive side), checked against the host reference. In place,
/// `m` must be symmetric.
#[allow(clippy::too_many_arguments)]
fn a2av_call(
    c: &mut Ctx,
    label: &str,
    m: &[Vec<usize>],
    dtype: DataType,
    in_place: bool,
    gap: usize,
    algo: Algo,
    seed: u64,
) -> Res<()> {
    let w = c.world;
    let me = c.rank;
    let dev = c.dev;
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
            let sc = &m[r];
            let n: usize = sc.iter().sum::<usize>() + gap * w;
            gen_bytes_fast(n * es, seed, r)
        })
        .collect();
    let part_of = |s: usize, r: usize| -> Vec<u8> {
        let d: usize = m[s][..r].iter().map(|x| x + gap).sum();
        inputs[s][d * es..(d + m[s][r]) * es].to_vec()
    };
    let inb = Buf::new(in_n.max(out_n) * es)?;
    let outb = Buf::new(in_n.max(out_n) * es)?;
    outb.poison()?;
    let opts = CallOpts::default().with_algo(algo);
    // SAFETY: buffers of this device large enough for the splits; synchronised below.
    let r = unsafe {
        let o = ViewMut::from_raw(outb.ptr as *mut u8, out_n, dtype, dev);
        let input = if in_place {
            outb.upload(0, &inputs[me][..in_n * es])?;
            Input::InPlace
        } else {
            inb.upload(0, &inputs[me][..in_n * es])?;
            Input::Buf(View::from_raw(inb.ptr as *const u8, in_n, dtype, dev))
        };
        c.comm.all_to_all_v(input, o, &splits, &opts)
    };
    sync()?;
    let got = outb.download(0, out_n * es)?;
    let mut wrong = 0;
    for s in 0..w {
        let d = splits.recv_displs[s] * es;
        let want = part_of(s, me);
        wrong += diff_bytes(&want, &got[d..d + want.len()], es);
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

/// Device-count all-to-all-v: counts uploaded to device memory, uneven with zeros, i32 and i64
/// counts, of elements and of rows, then an overfull part that must be truncated and reported.
fn dynamic(c: &mut Ctx, quick: bool) -> Res<()> {
    let w = c.world;
    let rounds = if quick { 6 } else { 16 };
    for k in 0..rounds {
        let seed = 9000 + k as u64;
        // Round 3 and every fourth after it: parts on both sides of the LL limit in one call.
        let cap = [16usize, 1000, 5000, 200_000][k % 4];
        let overfull = k % 4 == 3 && k > 4;
        let mut m = splits_for(w, seed, cap + 1);
        if overfull {
            // Every rank receives one part that is too long.
            for s in 0..w {
                m[s][(s + 1) % w] = cap + 77;
            }
        }
        let dtype = [DataType::BF16, DataType::F32, DataType::U8][k % 3];
        let cdt = if k % 2 == 0 {
            DataType::I32
        } else {
            DataType::I64
        };
        // Counts of rows from round 4: units of 3 f32, 5 u8 (parts at every byte alignment),
        // 2 u8, 64 bf16, 3 bf16, 7 f32.
        let unit = [1, 1, 1, 1, 3, 5, 1, 1, 2, 64, 1, 1, 3, 7, 1, 1][k];
        dynamic_call(
            c,
            &format!("round {k}"),
            &m,
            cap,
            unit,
            dtype,
            cdt,
            overfull,
            seed,
        )?;
    }
    dynamic_faults(c)
}

/// `counts` as `cdt` (i32 or i64) in a device buffer.
fn counts_buf(cdt: DataType, counts: &[i64]) -> Res<Buf> {
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
    let b = Buf::new(counts.len() * 8)?;
    b.upload(0, &enc)?;
    Ok(b)
}

/// One packed device-count all-to-all-v (NCCLX's device_alltoallv_single): this rank's
/// `input` bytes, its send and receive counts (units of `unit` elements) uploaded as `cdt`, a
/// poisoned output of `out_units` units. Returns the call's result, the output's bytes and
/// writes past it.
#[allow(clippy::too_many_arguments)]
fn run_packed(
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
    let inb = Buf::new(input.len().max(es))?;
    inb.upload(0, input)?;
    let outb = Buf::new(out_units * es)?;
    outb.poison()?;
    let scb = counts_buf(cdt, send)?;
    let rcb = counts_buf(cdt, recv)?;
    sync()?;
    // SAFETY: buffers of this device of the sizes given; synchronised below.
    let r = unsafe {
        c.comm.all_to_all_v_dynamic_packed(
            View::from_raw(inb.ptr as *const u8, input.len() / dtype.size(), dtype, dev),
            ViewMut::from_raw(outb.ptr as *mut u8, out_units * unit, dtype, dev),
            PackedCounts {
                send: View::from_raw(scb.ptr as *const u8, w, cdt, dev),
                recv: View::from_raw(rcb.ptr as *const u8, w, cdt, dev),
                unit,
            },
            &CallOpts::default(),
        )
    };
    sync()?;
    let got = outb.download(0, out_units * es)?;
    let guard = outb.guard_hits(0, out_units * es)?;
    Ok((r, got, guard))
}

/// One packed device-count all-to-all-v: `m[s][r]` units of `unit` elements from rank s to
/// rank r, both sides' counts of type `cdt` in device memory, an output of exactly the units
/// received and a tail of 5 that must keep its poison.
fn packed_call(
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
    let mut wrong = diff_bytes(&want, &got[..total * us], dtype.size());
    wrong += got[total * us..].iter().filter(|b| **b != POISON).count();
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
/// past the parts that must keep its poison; then faults one rank makes (counts that disagree
/// with a peer's, receive counts past its output, send counts past its input): what fits is
/// moved, nothing is written past the output, and the next call fails on every rank with a
/// message naming the fault; the call after it works.
fn dynamic_packed(c: &mut Ctx, quick: bool) -> Res<()> {
    let (w, me) = (c.world, c.rank);
    let rounds = if quick { 5 } else { 12 };
    for k in 0..rounds {
        let seed = 9700 + k as u64;
        let m = splits_for(w, seed, [16usize, 1000, 5000, 60_000][k % 4] + 1);
        let unit = [1, 3, 1, 5, 7, 1, 64, 2, 1, 1, 3, 1][k];
        let dtype = [DataType::BF16, DataType::F32, DataType::U8][k % 3];
        let cdt = if k % 2 == 0 {
            DataType::I32
        } else {
            DataType::I64
        };
        packed_call(c, &format!("round {k}"), &m, unit, dtype, cdt, seed)?;
    }
    // Faults, each made by one rank; every rank's next call must fail naming it.
    let dtype = DataType::F32;
    for (k, fault) in ["disagree", "output", "input"].into_iter().enumerate() {
        let seed = 9800 + k as u64;
        let mut m = splits_for(w, seed, 3000);
        for row in m.iter_mut() {
            for x in row.iter_mut() {
                *x += 1; // no zero parts: the faulty part always exists
            }
        }
        let bad = w - 1;
        let inputs: Vec<Vec<u8>> = (0..w)
            .map(|r| gen_bytes_fast(m[r].iter().sum::<usize>() * 4, seed, r))
            .collect();
        let mut send: Vec<i64> = m[me].iter().map(|&x| x as i64).collect();
        let mut recv: Vec<i64> = (0..w).map(|s| m[s][me] as i64).collect();
        let total: usize = (0..w).map(|s| m[s][me]).sum();
        let mut out_units = total;
        let needle = match fault {
            "disagree" => {
                if me == bad {
                    recv[0] += 1; // expects one more element from rank 0 than it sends
                    out_units += 1;
                }
                "differs from"
            }
            "output" => {
                if me == bad {
                    out_units -= 1;
                }
                "past its output"
            }
            _ => {
                if me == bad {
                    send[w - 1] += 7; // 7 elements past the end of its input
                }
                "past its input"
            }
        };
        let (r, _, guard) = run_packed(
            c,
            &inputs[me],
            dtype,
            DataType::I64,
            &send,
            &recv,
            out_units,
            1,
        )?;
        c.record(
            "a2av_dynamic_packed_faults",
            format!("{fault} on rank {bad}: the call itself, {m:?}"),
            r,
            0,
            guard,
        );
        let dev = c.dev;
        let b = Buf::new(64)?;
        let mut next = Vec::new();
        for _ in 0..2 {
            // SAFETY: 64 bytes of this device.
            next.push(unsafe {
                c.comm.all_gather(
                    Input::InPlace,
                    ViewMut::from_raw(b.ptr as *mut u8, 2 * w, DataType::F32, dev),
                    &CallOpts::default(),
                )
            });
            sync()?;
        }
        let t = c.tally.entry("bad_input".into()).or_default();
        t.cases += 1;
        // The faulty rank names its own fault; the others name the faulty rank's (or, for a
        // disagreement, the receiver's mismatch).
        let first_ok = match &next[0] {
            Err(e) => {
                let m = e.to_string();
                if me == bad || fault == "disagree" {
                    m.contains("disagree") || m.contains(needle) || m.contains("more than")
                } else {
                    m.contains(needle) && m.contains(&format!("rank {bad}"))
                }
            }
            Ok(()) => false,
        };
        if !first_ok || next[1].is_err() {
            t.errors += 1;
            c.failures
                .push(format!("packed fault {fault}: next calls gave {next:?}"));
        } else if me == 0 {
            println!(
                "packed fault {fault} reported: {}",
                next[0].as_ref().unwrap_err()
            );
        }
    }
    Ok(())
}

/// What one device-count all-to-all-v left behind: the call's result, the output's bytes,
/// the counts received (as i64) and writes past the output (guard hits).
struct DynOut {
    r: ferrocomm::Result<()>,
    got: Vec<u8>,
    recv: Vec<i64>,
    guard: usize,
}

/// Runs one device-count all-to-all-v: this rank's `input` bytes (elements of `dtype`), its
/// send `counts` (units of `unit` elements) uploaded as `cdt` (i32 or i64), a poisoned output
/// of `cap` units per sender.
#[allow(clippy::too_many_arguments)]
fn run_dynamic(
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
    let inb = Buf::new(input.len().max(es))?;
    inb.upload(0, input)?;
    let outb = Buf::new(w * cap * es)?;
    outb.poison()?;
    let scb = counts_buf(cdt, counts)?;
    let rcb = Buf::new(w * 8)?;
    rcb.poison()?;
    sync()?;
    // SAFETY: buffers of this device of the sizes given; synchronised below.
    let r = unsafe {
        c.comm.all_to_all_v_dynamic(
            View::from_raw(inb.ptr as *const u8, in_n, dtype, dev),
            ViewMut::from_raw(outb.ptr as *mut u8, w * cap * unit, dtype, dev),
            DeviceCounts {
                send: View::from_raw(scb.ptr as *const u8, w, cdt, dev),
                recv: ViewMut::from_raw(rcb.ptr as *mut u8, w, cdt, dev),
                capacity: cap,
                unit,
            },
            &CallOpts::default(),
        )
    };
    sync()?;
    let got = outb.download(0, w * cap * es)?;
    let rc = rcb.download(0, w * cdt.size())?;
    let recv = (0..w)
        .map(|s| {
            if cdt == DataType::I32 {
                i32::from_le_bytes(rc[s * 4..s * 4 + 4].try_into().unwrap()) as i64
            } else {
                i64::from_le_bytes(rc[s * 8..s * 8 + 8].try_into().unwrap())
            }
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
/// part longer than `cap` must arrive truncated and the next call must report it.
#[allow(clippy::too_many_arguments)]
fn dynamic_call(
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
    let w = c.world;
    let me = c.rank;
    let dev = c.dev;
    let es = dtype.size() * unit;
    let inputs: Vec<Vec<u8>> = (0..w)
        .map(|r| gen_bytes_fast(m[r].iter().sum::<usize>() * es, seed, r))
        .collect();
    let counts: Vec<i64> = m[me].iter().map(|&x| x as i64).collect();
    let out = run_dynamic(c, &inputs[me], dtype, cdt, &counts, cap, unit)?;
    let mut wrong = 0;
    for s in 0..w {
        let cnt = m[s][me].min(cap);
        let d: usize = m[s][..me].iter().sum();
        let want = &inputs[s][d * es..(d + cnt) * es];
        wrong += diff_bytes(want, &out.got[s * cap * es..s * cap * es + cnt * es], es);
        if out.recv[s] != cnt as i64 {
            wrong += 1;
        }
    }
    c.record(
        "a2av_dynamic",
        format!("dynamic {label} {dtype} {cdt} counts, cap {cap} x {unit}, counts {m:?}"),
        out.r,
        wrong,
        out.guard,
    );
    if overfull {
        // The truncation is reported by the next call, then the communicator works again.
        let b = Buf::new(64)?;
        // SAFETY: 64 bytes of this device.
        let next = unsafe {
            c.comm.all_gather(
                Input::InPlace,
                ViewMut::from_raw(b.ptr as *mut u8, 2 * w, DataType::F32, dev),
                &CallOpts::default(),
            )
        };
        sync()?;
        let ok = matches!(&next, Err(e) if e.to_string().contains("capacity"));
        let t = c.tally.entry("bad_input".into()).or_default();
        t.cases += 1;
        if !ok {
            t.errors += 1;
            c.failures
                .push(format!("overfull dynamic part was not reported: {next:?}"));
        } else if c.rank == 0 {
            println!("overfull capacity reported: {}", next.unwrap_err());
        }
    }
    Ok(())
}

/// Counts the kernel must not take at face value: a negative i32/i64 count sends nothing (the
/// receiver is told 0 and its part stays untouched); send counts that run past the end of the
/// input are cut there, the receiver is told only what exists (never a stale slot) and the
/// sender reports it from its next call, after which the communicator works again.
fn dynamic_faults(c: &mut Ctx) -> Res<()> {
    let w = c.world;
    let me = c.rank;
    let dev = c.dev;
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
        let in_len = |s: usize| -> usize {
            if past_input {
                real[s].iter().sum()
            } else {
                (0..w).map(|p| eff(s, p)).sum()
            }
        };
        let inputs: Vec<Vec<u8>> = (0..w)
            .map(|r| gen_bytes_fast(in_len(r).max(1) * es, seed, r))
            .collect();
        let out = run_dynamic(
            c,
            &inputs[me][..in_len(me) * es],
            dtype,
            cdt,
            &claimed[me],
            cap,
            1,
        )?;
        let mut wrong = 0;
        for (s, input) in inputs.iter().enumerate() {
            let cnt = eff(s, me);
            let d: usize = (0..me).map(|p| eff(s, p)).sum();
            let part = &out.got[s * cap * es..(s + 1) * cap * es];
            wrong += diff_bytes(&input[d * es..(d + cnt) * es], &part[..cnt * es], es);
            // Past the received length the output keeps its poison.
            wrong += part[cnt * es..].iter().filter(|b| **b != POISON).count();
            if out.recv[s] != cnt as i64 {
                wrong += 1;
            }
        }
        let what = if past_input {
            "counts past the input"
        } else {
            "negative counts"
        };
        c.record(
            "a2av_dynamic_faults",
            format!("{what}, {cdt} counts {claimed:?}"),
            out.r,
            wrong,
            out.guard,
        );
        // The next call: the sender of counts past its input reports it, once; a call after
        // that works on every rank.
        for attempt in 0..2 {
            let b = Buf::new(64)?;
            // SAFETY: 64 bytes of this device.
            let next = unsafe {
                c.comm.all_gather(
                    Input::InPlace,
                    ViewMut::from_raw(b.ptr as *mut u8, 2 * w, DataType::F32, dev),
                    &CallOpts::default(),
                )
            };
            sync()?;
            let expect_err = past_input && attempt == 0;
            let ok = match &next {
                Err(e) => expect_err && e.to_string().contains("send counts"),
                Ok(()) => !expect_err,
            };
            let t = c.tally.entry("bad_input".into()).or_default();
            t.cases += 1;
            if !ok {
                t.errors += 1;
                c.failures.push(format!(
                    "{what} ({cdt}), call {attempt} after: expected {}, got {next:?}",
                    if expect_err {
                        "the send-count error"
                    } else {
                        "success"
                    }
                ));
            } else if c.rank == 0 && expect_err {
                println!("counts past the input reported: {}", next.unwrap_err());
            }
        }
    }
    Ok(())
}

/// A mix of every collective (LL and staged sizes) captured once and replayed; then the same
/// mix back to back without synchronisation on the default stream.
fn graph_and_race(c: &mut Ctx, replays: usize) -> Res<()> {
    let w = c.world;
    let me = c.rank;
    let dev = c.dev;
    let d = DataType::BF16;
    let es = 2;
    let plan: Vec<(Coll, usize)> = vec![
        (Coll::AllGather, 100),
        (Coll::ReduceScatter(OpK::Sum), 70_001),
        (Coll::AllToAll, 9),
        (Coll::Broadcast(w - 1), 300_000),
        (Coll::Reduce(OpK::Max, 0), 1234),
        (Coll::AllGather, 40_000),
        (Coll::AllToAll, 65_536),
        (Coll::Broadcast(0), 7),
        (Coll::ReduceScatter(OpK::Min), 5),
        (Coll::Reduce(OpK::Sum, w - 1), 200_000),
    ];
    let mut plan = plan;
    if has_p2p(&c.comm) {
        // Messages both ways, an LL size and a staged one.
        plan.extend([
            (Coll::SendRecv(0), 3001),
            (Coll::SendRecv(w - 1), 150_001),
            (Coll::SendRecv(w - 1), 17),
        ]);
    }
    let maxn = 300_000 * w;
    let inputs: Vec<Vec<u8>> = (0..w).map(|r| gen(d, maxn, 77, r, false)).collect();
    let inb = Buf::new(maxn * es)?;
    inb.upload(0, &inputs[me])?;
    let outs: Vec<Buf> = plan
        .iter()
        .map(|_| Buf::new(maxn * es))
        .collect::<Res<_>>()?;
    let issue = |comm: &Communicator, stream: u64| -> ferrocomm::Result<()> {
        for (k, (coll, n)) in plan.iter().enumerate() {
            let o = CallOpts::on_stream(stream);
            // SAFETY: buffers of this device with room for every part; they outlive the work.
            unsafe {
                let i = |len: usize| Input::Buf(View::from_raw(inb.ptr as *const u8, len, d, dev));
                let out = |len: usize| ViewMut::from_raw(outs[k].ptr as *mut u8, len, d, dev);
                match *coll {
                    Coll::AllGather => comm.all_gather(i(*n), out(n * w), &o)?,
                    Coll::AllToAll => comm.all_to_all(i(n * w), out(n * w), &o)?,
                    Coll::Broadcast(r) => comm.broadcast(i(*n), out(*n), r, &o)?,
                    Coll::ReduceScatter(op) => {
                        comm.reduce_scatter(i(n * w), out(*n), op.op(), &o)?
                    }
                    Coll::Reduce(op, r) => comm.reduce(i(*n), out(*n), op.op(), r, &o)?,
                    Coll::SendRecv(s) => {
                        let Input::Buf(v) = i(*n) else { unreachable!() };
                        p2p(comm, s, v, out(*n), &o)?
                    }
                }
            }
        }
        Ok(())
    };
    let verify = |c: &mut Ctx, key: &str| -> Res<()> {
        for (k, (coll, n)) in plan.iter().enumerate() {
            let n = *n;
            let (wrong, len) = match *coll {
                Coll::AllGather => {
                    let got = outs[k].download(0, n * w * es)?;
                    let want: Vec<u8> = inputs.iter().flat_map(|v| v[..n * es].to_vec()).collect();
                    (diff_bytes(&want, &got, es), n * w)
                }
                Coll::AllToAll => {
                    let got = outs[k].download(0, n * w * es)?;
                    let want: Vec<u8> = (0..w)
                        .flat_map(|s| inputs[s][me * n * es..(me + 1) * n * es].to_vec())
                        .collect();
                    (diff_bytes(&want, &got, es), n * w)
                }
                Coll::Broadcast(r) => {
                    let got = outs[k].download(0, n * es)?;
                    (diff_bytes(&inputs[r][..n * es], &got, es), n)
                }
                Coll::ReduceScatter(op) => {
                    let got = outs[k].download(0, n * es)?;
                    let parts: Vec<&[u8]> = inputs
                        .iter()
                        .map(|v| &v[me * n * es..(me + 1) * n * es])
                        .collect();
                    (check_reduce(d, op, &parts, &got), n)
                }
                Coll::Reduce(op, r) => {
                    if me != r {
                        continue;
                    }
                    let got = outs[k].download(0, n * es)?;
                    let parts: Vec<&[u8]> = inputs.iter().map(|v| &v[..n * es]).collect();
                    (check_reduce(d, op, &parts, &got), n)
                }
                Coll::SendRecv(s) => {
                    if me != (s + 1) % w {
                        continue;
                    }
                    let got = outs[k].download(0, n * es)?;
                    (diff_bytes(&inputs[s][..n * es], &got, es), n)
                }
            };
            let guard = outs[k].guard_hits(0, len * es)?;
            c.record(
                key,
                format!("{key} op {k} {coll:?} n={n}"),
                Ok(()),
                wrong,
                guard,
            );
        }
        Ok(())
    };
    // Graph.
    let stream = new_stream()?;
    // SAFETY: capture on our own stream; buffers alive until the graph is destroyed.
    unsafe {
        cu(
            sys::cuStreamBeginCapture_v2(
                stream as sys::CUstream,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            ),
            "cuStreamBeginCapture",
        )?;
        let r = issue(&c.comm, stream);
        let mut g: sys::CUgraph = std::ptr::null_mut();
        cu(
            sys::cuStreamEndCapture(stream as sys::CUstream, &mut g),
            "end capture",
        )?;
        r?;
        let mut ge: sys::CUgraphExec = std::ptr::null_mut();
        cu(
            sys::cuGraphInstantiateWithFlags(&mut ge, g, 0),
            "instantiate",
        )?;
        for k in 0..replays {
            if k == replays - 1 {
                sync()?;
                for o in &outs {
                    o.poison()?;
                }
                sync()?;
            }
            cu(sys::cuGraphLaunch(ge, stream as sys::CUstream), "launch")?;
        }
        cu(sys::cuStreamSynchronize(stream as sys::CUstream), "sync")?;
        sys::cuGraphExecDestroy(ge);
        sys::cuGraphDestroy(g);
    }
    verify(c, "graph")?;
    // Back to back, no sync, several rounds, default stream.
    for o in &outs {
        o.poison()?;
    }
    sync()?;
    let t0 = Instant::now();
    for _ in 0..20 {
        issue(&c.comm, 0)?;
    }
    sync()?;
    if c.rank == 0 {
        println!(
            "race: {} mixed calls back to back in {:.1} ms",
            20 * plan.len(),
            t0.elapsed().as_secs_f64() * 1e3
        );
    }
    verify(c, "race")?;
    Ok(())
}

/// Batches of sends and receives (`batch_send_recv`): every rank sends two messages and receives
/// two, sends and receives interleaved in issue order, at LL sizes and a staged one: to the next
/// rank and the one after it (at two ranks both to the other one, by direct access, where both
/// ranks must meet every message in one order), random data, outputs poisoned, inputs checked
/// unchanged.
fn batches(c: &mut Ctx) -> Res<()> {
    let (w, me, dev) = (c.world, c.rank, c.dev);
    // Message j goes `hop(j)` ranks ahead.
    let hop = |j: usize| if w == 2 { 1 } else { 1 + j };
    let d = DataType::BF16;
    for (k, n) in [3001usize, 150_001, 7].into_iter().enumerate() {
        let seed = 70_000 + k as u64;
        // Message j from rank s has n + j + s elements (every message its own size).
        let len = |s: usize, j: usize| n + j + s;
        let data = |s: usize, j: usize| gen(d, len(s, j), seed + j as u64, s, false);
        let ins: Vec<Buf> = (0..2)
            .map(|j| Buf::new(len(me, j) * 2))
            .collect::<Res<_>>()?;
        let outs: Vec<Buf> = (0..2)
            .map(|j| Buf::new(len((me + w - hop(j)) % w, j) * 2))
            .collect::<Res<_>>()?;
        for j in 0..2 {
            ins[j].upload(0, &data(me, j))?;
            outs[j].poison()?;
        }
        sync()?;
        let r = {
            let mut ops = Vec::new();
            for j in 0..2 {
                let (to, from) = ((me + hop(j)) % w, (me + w - hop(j)) % w);
                // SAFETY: the buffers hold the lengths given and outlive the call (synchronised
                // below).
                unsafe {
                    ops.push(ferrocomm::P2pOp::Send {
                        data: View::from_raw(ins[j].ptr as *const u8, len(me, j), d, dev),
                        peer: to,
                    });
                    ops.push(ferrocomm::P2pOp::Recv {
                        out: ViewMut::from_raw(outs[j].ptr as *mut u8, len(from, j), d, dev),
                        peer: from,
                    });
                }
            }
            c.comm.batch_send_recv(ops, &CallOpts::default())
        };
        sync()?;
        let (mut wrong, mut guard) = (0, 0);
        for j in 0..2 {
            let from = (me + w - hop(j)) % w;
            let got = outs[j].download(0, len(from, j) * 2)?;
            wrong += diff_bytes(&data(from, j), &got, 2);
            guard += outs[j].guard_hits(0, len(from, j) * 2)?;
            wrong += diff_bytes(&data(me, j), &ins[j].download(0, len(me, j) * 2)?, 2);
        }
        c.record("batch", format!("batch n={n}"), r, wrong, guard);
    }
    Ok(())
}

/// Disagreeing counts and roots out of range: clear errors, nothing hangs.
fn bad_input(c: &mut Ctx, cfg: &Config) -> Res<()> {
    let w = c.world;
    let me = c.rank;
    let dev = c.dev;
    let b = Buf::new(4 << 20)?;
    let mut ok = 0;
    let mut total = 0;
    // Root out of range: refused before anything runs.
    // SAFETY: 4 MiB of this device.
    let r = unsafe {
        c.comm.broadcast(
            Input::InPlace,
            ViewMut::from_raw(b.ptr as *mut u8, 10, DataType::F32, dev),
            w,
            &CallOpts::default(),
        )
    };
    total += 1;
    if matches!(r, Err(ferrocomm::Error::RankOutOfRange { .. })) {
        ok += 1;
    } else {
        c.failures.push(format!("broadcast root {w} gave {r:?}"));
    }
    // Calls whose counts differ between ranks (LL and staged sizes), on a separate
    // communicator: the next call on it must report "disagrees between ranks" on every rank.
    let mut cfg2 = cfg.clone();
    cfg2.timeout = Duration::from_secs(3);
    let comm = comm_with("gpu_check_coll_bad", cfg2)?;
    let p = b.ptr;
    type BadCall = (String, Box<dyn Fn(&Communicator) -> ferrocomm::Result<()>>);
    let mut cases: Vec<BadCall> = Vec::new();
    for n in [100usize, 60_000, 120_000] {
        // Rank r gathers n + r elements.
        let call = move |comm: &Communicator| {
            // SAFETY: 4 MiB of this device is enough for w * 120_003 f32.
            unsafe {
                let o = ViewMut::from_raw(p as *mut u8, (n + me) * w, DataType::F32, dev);
                comm.all_gather(
                    Input::InPlace,
                    o,
                    &CallOpts::default().with_algo(Algo::Direct),
                )
            }
        };
        cases.push((format!("all_gather, {n} + rank elements"), Box::new(call)));
    }
    for n in [100usize, 60_000, 120_000] {
        if w != 2 {
            break;
        }
        // All-to-all-v: rank 1 expects one element more than rank 0 sends.
        let call = move |comm: &Communicator| {
            let splits = Splits::packed(
                if me == 0 { vec![5, n] } else { vec![n, 5] },
                if me == 0 { vec![5, n] } else { vec![n + 1, 5] },
            );
            let half = 2 << 20;
            // SAFETY: 4 MiB of this device: the input (n + 5 f32) below half of it, the
            // output (n + 6) above.
            unsafe {
                let i = View::from_raw(p as *const u8, n + 5, DataType::F32, dev);
                let o = ViewMut::from_raw((p + half) as *mut u8, n + 6, DataType::F32, dev);
                let opts = CallOpts::default().with_algo(Algo::Direct);
                comm.all_to_all_v(Input::Buf(i), o, &splits, &opts)
            }
        };
        cases.push((format!("all_to_all_v, {n} elements"), Box::new(call)));
    }
    for n in [100usize, 60_000, 120_000] {
        if w == 2 {
            break;
        }
        // More ranks: 5 elements between any two ranks, but rank 0 sends n to rank 1, which
        // expects n + 1. Only rank 1 sees both counts; the kernel's verdict words carry what it
        // found to every rank, so every rank reports it.
        let call = move |comm: &Communicator| {
            let send: Vec<usize> = (0..w)
                .map(|q| if me == 0 && q == 1 { n } else { 5 })
                .collect();
            let recv: Vec<usize> = (0..w)
                .map(|s| if me == 1 && s == 0 { n + 1 } else { 5 })
                .collect();
            let (ni, no) = (send.iter().sum(), recv.iter().sum());
            let splits = Splits::packed(send, recv);
            let half = 2 << 20;
            // SAFETY: 4 MiB of this device: the input (at most n + 5 * w f32) below half of
            // it, the output (at most n + 1 + 5 * w) above.
            unsafe {
                let i = View::from_raw(p as *const u8, ni, DataType::F32, dev);
                let o = ViewMut::from_raw((p + half) as *mut u8, no, DataType::F32, dev);
                let opts = CallOpts::default().with_algo(Algo::Direct);
                comm.all_to_all_v(Input::Buf(i), o, &splits, &opts)
            }
        };
        cases.push((
            format!("all_to_all_v, {n} elements, {w} ranks"),
            Box::new(call),
        ));
    }
    for n in [100usize, 60_000, 120_000] {
        if w != 2 {
            break;
        }
        // Both ranks send at once (each a root of its own message), then a receive one
        // element longer than its send.
        let both_send = move |comm: &Communicator| {
            // SAFETY: 4 MiB of this device holds 120_000 f32.
            unsafe {
                let i = View::from_raw(p as *const u8, n, DataType::F32, dev);
                let opts = CallOpts::default().with_algo(Algo::Direct);
                comm.send(i, 1 - me, &opts)
            }
        };
        cases.push((
            format!("send on both ranks, {n} elements"),
            Box::new(both_send),
        ));
        let longer = move |comm: &Communicator| {
            let opts = CallOpts::default().with_algo(Algo::Direct);
            // SAFETY: as above, n + 1 f32.
            unsafe {
                if me == 0 {
                    comm.send(
                        View::from_raw(p as *const u8, n, DataType::F32, dev),
                        1,
                        &opts,
                    )
                } else {
                    let o = ViewMut::from_raw(p as *mut u8, n + 1, DataType::F32, dev);
                    comm.recv(o, 0, &opts)
                }
            }
        };
        cases.push((format!("recv of {n} + 1 elements"), Box::new(longer)));
    }
    for (k, (what, call)) in cases.iter().enumerate() {
        let first = call(&comm);
        sync()?;
        // SAFETY: as above.
        let next = unsafe {
            comm.all_gather(
                Input::InPlace,
                ViewMut::from_raw(p as *mut u8, 4 * w, DataType::F32, dev),
                &CallOpts::default(),
            )
        };
        sync()?;
        total += 1;
        let shown = format!("{next:?}");
        // "disagrees between ranks" where the rank saw it, "counts disagree between ranks"
        // where a peer did (all-to-all-v above two ranks).
        if first.is_ok() && shown.contains("disagree") && shown.contains("between ranks") {
            ok += 1;
            if me == 0 {
                println!("mismatch {k} ({what}): {shown}");
            }
        } else {
            c.failures.push(format!(
                "count mismatch {k} ({what}) not reported: {first:?} then {shown}"
            ));
        }
        if shown.contains("Timeout") {
            break; // a timeout is sticky: the communicator is done
        }
    }
    std::mem::forget(comm);
    let t = c.tally.entry("bad_input".into()).or_default();
    t.cases += total;
    t.errors += total - ok;
    Ok(())
}

fn main() {
    run_main("gpu_check_coll", real_main)
}

fn real_main() -> Res<i32> {
    // `--no-timing` is accepted (and means nothing here: no timing runs) so that every check
    // program takes the same flags.
    let args = flags(&["--quick", "--sanitize", "--no-timing"])?;
    let quick = args.iter().any(|a| a == "--quick");
    let sanitize = args.iter().any(|a| a == "--sanitize");
    let mut cfg = Config::from_env()?;
    cfg.cuda_staging_bytes = cfg.cuda_staging_bytes.max(128 << 20);
    let t0 = Instant::now();
    let comm = comm_with("gpu_check_coll", cfg.clone())?;
    let rank = comm.rank();
    let world = comm.size();
    let dev = comm.device();
    let Device::Cuda(ord) = dev else {
        return Err("gpu_check_coll needs a GPU".into());
    };
    if rank == 0 {
        println!(
            "gpu_check_coll: {world} ranks, backend {}, init {:.2} s",
            comm.backend_name(),
            t0.elapsed().as_secs_f64()
        );
    }
    let cuda = cudarc::driver::CudaContext::new(ord as usize)?;
    cuda.bind_to_thread()?;
    // The guard bands are read back after every call: first, that the read-back sees writes.
    Buf::guard_self_check()?;
    let mut c = Ctx {
        comm,
        rank,
        world,
        dev,
        tally: BTreeMap::new(),
        failures: Vec::new(),
    };
    type Step<'a> = (&'a str, Box<dyn Fn(&mut Ctx) -> Res<()> + 'a>);
    let steps: Vec<Step> = if sanitize {
        // Under compute-sanitizer kernels run 10-100x slower: a few calls of every kernel form.
        vec![("sanitize", Box::new(|c| sanitize_cases(c, &cfg)))]
    } else {
        vec![
            ("matrix", Box::new(|c| matrix(c, quick))),
            ("all_to_all_v", Box::new(|c| a2av(c, quick))),
            (
                "all_to_all_v in pieces",
                Box::new(|c| a2av_in_pieces(c, &cfg, quick)),
            ),
            ("dynamic", Box::new(|c| dynamic(c, quick))),
            ("dynamic packed", Box::new(|c| dynamic_packed(c, quick))),
            (
                "graph+race",
                Box::new(|c| graph_and_race(c, if quick { 10 } else { 50 })),
            ),
            (
                "batches",
                Box::new(|c| if has_p2p(&c.comm) { batches(c) } else { Ok(()) }),
            ),
            ("bad input", Box::new(|c| bad_input(c, &cfg))),
        ]
    };
    for (name, f) in steps {
        let t = Instant::now();
        f(&mut c)?;
        store_barrier(
            &**c.comm.store(),
            &format!("step/{name}"),
            world,
            Duration::from_secs(120),
        )?;
        if rank == 0 {
            println!("{name} done in {:.1} s", t.elapsed().as_secs_f64());
        }
    }
    let bad = c.tally.values().any(|t| t.wrong + t.guard + t.errors > 0) || !c.failures.is_empty();
    if rank == 0 {
        println!(
            "\ncorrectness (rank 0):\n{:<15} {:>7} {:>12} {:>11} {:>7}",
            "what", "cases", "wrong elems", "guard hits", "errors"
        );
        for (k, t) in &c.tally {
            println!(
                "{:<15} {:>7} {:>12} {:>11} {:>7}",
                k, t.cases, t.wrong, t.guard, t.errors
            );
        }
    }
    for f in c.failures.iter().take(30) {
        eprintln!("rank {rank}: FAIL {f}");
    }
    let verdict = all_gather_bytes(
        &**c.comm.store(),
        "verdict",
        rank,
        world,
        &[bad as u8],
        Duration::from_secs(120),
    )?;
    if rank == 0 {
        println!(
            "{}",
            if verdict.iter().any(|v| v[0] != 0) {
                "gpu_check_coll: FAILED"
            } else {
                "gpu_check_coll: all results correct"
            }
        );
    }
    Ok(if bad { 1 } else { 0 })
}
