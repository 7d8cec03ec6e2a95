//! The all-reduce bodies: every dtype and operator at sizes of 1 to 32,771 elements with every
//! algorithm of the device, in and out of place, aligned and one element off; large bf16 and
//! f32 sums (up to 256 MB per rank on a GPU); two communicators used alternately; a staging
//! area far smaller than the message. Every result is also compared across ranks (bit
//! identical).

use ferrocomm::{Algo, CallOpts, Communicator, DataType};

use super::*;

/// The bodies of this module, by name.
pub const BODIES: [(&str, Body); 3] = [
    ("all_reduce", matrix),
    ("all_reduce two communicators", two_comms),
    ("all_reduce small staging", small_staging),
];

/// One all-reduce call.
#[derive(Clone, Copy)]
pub struct Case {
    pub dtype: DataType,
    pub op: OpK,
    pub count: usize,
    pub algo: Algo,
    pub in_place: bool,
    /// Element offset of the pointers (1 = not 16-byte aligned).
    pub misalign: usize,
}

impl Case {
    /// A sum of `count` elements, out of place, from aligned pointers.
    pub fn sum(dtype: DataType, count: usize, algo: Algo) -> Case {
        Case {
            dtype,
            op: OpK::Sum,
            count,
            algo,
            in_place: false,
            misalign: 0,
        }
    }
}

/// Runs `cs` on `comm` (the context's when `None`) on `stream` and checks it: every element
/// against the reference, the bytes around the output; the result's hash is kept for
/// [`Ctx::compare_hashes`], which every body that runs it calls at its end.
/// Push forced above its capacity is refused by design: counted as a refusal, not a case.
pub fn run_case(
    c: &mut Ctx,
    comm: Option<&Communicator>,
    cs: &Case,
    seed: u64,
    stream: u64,
) -> Res<()> {
    let comm = comm.unwrap_or(&c.comm);
    let (es, dev) = (cs.dtype.size(), c.dev);
    let bytes = cs.count * es;
    let key = format!("all_reduce {}", cs.algo.name());
    let prod = cs.op == OpK::Prod;
    let inputs: Vec<Vec<u8>> = (0..c.world)
        .map(|r| gen(cs.dtype, cs.count, seed, r, prod))
        .collect();
    let off = cs.misalign * es;
    let inb = c.buf(bytes + off)?;
    let outb = c.buf(bytes + off)?;
    outb.poison()?;
    let opts = CallOpts::on_stream(stream).with_algo(cs.algo);
    let input = if cs.in_place {
        outb.upload(off, &inputs[c.rank])?;
        Input::InPlace
    } else {
        inb.upload(off, &inputs[c.rank])?;
        // SAFETY: `count` elements of this device's buffer, alive until after the sync below.
        Input::Buf(unsafe { inb.view(off, cs.count, cs.dtype, dev) })
    };
    // SAFETY: as above.
    let out = unsafe { outb.view_mut(off, cs.count, cs.dtype, dev) };
    let res = comm.all_reduce(input, out, cs.op.op(), &opts);
    c.sync()?;
    let what = format!(
        "all_reduce {:?} {} n={} {} in_place={} misalign={}",
        cs.op, cs.dtype, cs.count, cs.algo, cs.in_place, cs.misalign
    );
    if let Err(e) = &res {
        let refused = matches!(e, ferrocomm::Error::InvalidArgument(_));
        if refused
            && cs.algo == Algo::Push
            && !c.host()
            && bytes > ferrocomm::cuda::push_capacity(comm.config())
        {
            c.tally.entry(key).or_default().refusals += 1;
            return Ok(());
        }
        c.record(&key, what, res, 0, 0);
        return Ok(());
    }
    let got = outb.download(off, bytes)?;
    let parts: Vec<&[u8]> = inputs.iter().map(|v| &v[..]).collect();
    let (wrong, first) = check_reduce(cs.dtype, cs.op, &parts, &got);
    let guard = outb.guard_hits(off, bytes)?;
    c.hash(&key, what.clone(), &got);
    c.record(&key, format!("{what} ({first})"), Ok(()), wrong, guard);
    Ok(())
}

/// Every dtype and operator at sizes of 1 to 32,771 elements (1 to 1,029 on the host; half of
/// them with `--quick` and on the host) with every algorithm, in and out of place, aligned and one element off; then
/// bf16 and f32 sums of 256 KB to 256 MB per rank (32 to 160 KiB on the host), push only up to
/// 512 KB.
pub fn matrix(c: &mut Ctx) -> Res<()> {
    let mut seed = 1u64;
    let small: &[usize] = c.pick(
        &[1, 3, 7, 33, 1000, 1029],
        &[1, 3, 7, 8, 33, 1000, 4097, 32771],
    );
    let algos = c.algos.clone();
    for d in REDUCE_TYPES {
        for &op in OpK::all_for(d) {
            for (si, &n) in small.iter().enumerate() {
                if c.quick && si % 2 == 1 {
                    continue;
                }
                for (ai, &algo) in algos.iter().enumerate() {
                    seed += 1;
                    let cs = Case {
                        dtype: d,
                        op,
                        count: n,
                        algo,
                        in_place: (si + ai) % 2 == 0,
                        misalign: usize::from((si + ai) % 3 == 0),
                    };
                    run_case(c, None, &cs, seed, 0)?;
                }
            }
        }
    }
    let big: &[usize] = match (c.host(), c.quick) {
        (true, _) => &[32 << 10, (160 << 10) + 2],
        (false, true) => &[1 << 20, (4 << 20) + 2, (24 << 20) + 24, 64 << 20],
        (false, false) => &[
            256 << 10,
            1 << 20,
            (4 << 20) + 2,
            16 << 20,
            (24 << 20) + 24,
            64 << 20,
            256 << 20,
        ],
    };
    for d in [DataType::BF16, DataType::F32] {
        for &b in big {
            for &algo in &algos {
                if algo == Algo::Push && b > (512 << 10) {
                    continue;
                }
                seed += 1;
                let cs = Case {
                    in_place: seed % 2 == 0,
                    // Odd sizes also run from pointers off 16-byte alignment (scalar path).
                    misalign: usize::from(b % 16 != 0),
                    ..Case::sum(d, b / d.size(), algo)
                };
                run_case(c, None, &cs, seed, 0)?;
            }
        }
    }
    c.compare_hashes()
}

/// Two communicators of the same ranks used alternately, 40 calls of 1,000 to 39,883 elements
/// (to 4,783 on the host), every algorithm but NCCL.
pub fn two_comms(c: &mut Ctx) -> Res<()> {
    let comm2 = (c.new_comm)("cases_all_reduce_b", c.cfg.clone())?;
    let algos: Vec<Algo> = c
        .algos
        .iter()
        .copied()
        .filter(|&a| a != Algo::Nccl)
        .collect();
    let step = c.pick(97, 997);
    for k in 0..40u64 {
        let cs = Case {
            in_place: k % 2 == 0,
            ..Case::sum(
                DataType::F32,
                1000 + k as usize * step,
                algos[k as usize % algos.len()],
            )
        };
        let which = if k % 2 == 0 { None } else { Some(&comm2) };
        run_case(c, which, &cs, 10_000 + k, 0)?;
    }
    c.compare_hashes()
}

/// A staging area far smaller than the message (1 MiB on a GPU, 4 KiB slots on the host): flat
/// streams it through many small chunk slots (the writer waits for the reader's
/// acknowledgements).
pub fn small_staging(c: &mut Ctx) -> Res<()> {
    let mut cfg = c.cfg.clone();
    cfg.cuda_staging_bytes = 1 << 20;
    cfg.host_slot_bytes = 4 << 10;
    let comm = (c.new_comm)("cases_all_reduce_small_staging", cfg)?;
    let (bf, f32) = (DataType::BF16, DataType::F32);
    let sizes = if c.host() {
        [
            (bf, 40_003, Algo::Flat),
            (f32, 20_001, Algo::Flat),
            (bf, 30_000, Algo::Auto),
            (f32, 1003, Algo::Flat),
        ]
    } else {
        [
            (bf, (8 << 20) + 3, Algo::Flat),
            (f32, (2 << 20) + 1, Algo::Flat),
            (bf, 3 << 20, Algo::Auto),
            (f32, 100_003, Algo::Flat),
        ]
    };
    for (k, (d, n, algo)) in sizes.into_iter().enumerate() {
        let cs = Case {
            in_place: k % 2 == 0,
            misalign: k % 2,
            ..Case::sum(d, n, algo)
        };
        run_case(c, Some(&comm), &cs, 30_000 + k as u64, 0)?;
    }
    c.compare_hashes()
}
