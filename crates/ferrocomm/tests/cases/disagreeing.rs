//! Calls that disagree between ranks, for each family of calls (the all-reduce, the other
//! collectives, low precision, the fused norm): every rank makes its own version of a call
//! (another count, operator, algorithm, wire format, eps, FP8 rows, rows or form) on a
//! communicator of the family's own. The disagreement is reported on every rank, never a hang
//! or a timeout: by the call itself on the host backend (every rank compares every rank's call
//! before anything moves), by the next call on a GPU (the call returns before its kernels find
//! the disagreement on the device). A matching call then works with the right values, and
//! nothing is written past the family's buffer (its guard band).

use std::time::Duration;

use ferrocomm::bootstrap::store_barrier;
use ferrocomm::plan::LowPrecisionChoice;
use ferrocomm::quant::{Codec, Format};
use ferrocomm::{Algo, CallOpts, DataType, Input, ReduceOp, Splits};

use super::coll::Coll;
use super::*;

/// The bodies of this module, by name.
pub const BODIES: [(&str, Body); 4] = [
    ("disagreeing all_reduce", all_reduce),
    ("disagreeing collectives", collectives),
    ("disagreeing low precision", low_precision),
    ("disagreeing fused norm", fused_norm),
];

/// What the host backend's report of a disagreement says (a signature mismatch; the fused
/// norm's comparison of the calls).
const HOST_SAYS: [&str; 2] = ["collective mismatch", "ranks disagree on the call"];
/// What a GPU's next call says (the rank that saw it; a peer's verdict of an all-to-all-v's
/// counts above two ranks).
const GPU_SAYS: [&str; 2] = ["disagrees between ranks", "counts disagree between ranks"];

/// What one rank calls, on the family's buffer.
pub enum Call {
    /// An all-reduce in place of the first `n` elements.
    AllReduce(usize, ReduceOp, CallOpts),
    /// An all-gather in place of `n` elements per rank.
    AllGather(usize, CallOpts),
    /// A direct all-to-all-v of these send and receive counts: the input at the buffer's
    /// start, the output from its middle.
    AllToAllV(Vec<usize>, Vec<usize>),
    /// A direct send of `n` elements to the peer given.
    Send(usize, usize),
    /// A direct receive of `n` elements from the peer given.
    Recv(usize, usize),
    /// A fused all-reduce + RMSNorm on buffers of its own.
    Norm(norm::Case),
}

impl Call {
    /// Issues the call on the context's communicator and waits for its work; the outer error
    /// is the check's own (a buffer too small, CUDA), the inner one the call's.
    fn issue(&self, c: &Ctx, b: &Buf, d: DataType) -> Res<Res<()>> {
        let (comm, dev, w) = (&c.comm, c.dev, c.world);
        // Elements read from the buffer's start and written from byte `at`: an all-to-all-v's
        // output from the middle, every other call's in place.
        let (ins, outs, at) = match self {
            Call::AllReduce(n, ..) | Call::Send(n, _) | Call::Recv(n, _) => (*n, *n, 0),
            Call::AllGather(n, _) => (n * w, n * w, 0),
            Call::AllToAllV(s, r) => (s.iter().sum(), r.iter().sum(), b.bytes / 2),
            Call::Norm(case) => {
                let nb = norm::Bufs::new(c, case)?;
                nb.load(case, c.rank)?;
                let r = nb.call(comm, case, dev, 0);
                c.sync()?;
                // Its own buffers, not the family's: nothing written outside them.
                let hits = nb.guard_hits(case)?;
                if hits > 0 {
                    return Err(format!("{hits} bytes written outside the norm's buffers").into());
                }
                return Ok(r);
            }
        };
        let fits = |n: usize, room: usize| n.checked_mul(d.size()).is_some_and(|x| x <= room);
        if !fits(ins, if at > 0 { at } else { b.bytes }) || !fits(outs, b.bytes - at) {
            return Err(format!("{ins} and {outs} {d} overflow a buffer of {}", b.bytes).into());
        }
        let direct = CallOpts::default().with_algo(Algo::Direct);
        // SAFETY: every view lies inside the buffer (checked above), which is of this device
        // and outlives the call; the sync below ends the call's use of it.
        let r = unsafe {
            let o = || b.view_mut(at, outs, d, dev);
            match self {
                Call::AllReduce(_, op, opts) => comm.all_reduce(Input::InPlace, o(), *op, opts),
                Call::AllGather(_, opts) => comm.all_gather(Input::InPlace, o(), opts),
                Call::AllToAllV(s, r) => {
                    let splits = Splits::packed(s.clone(), r.clone());
                    comm.all_to_all_v(Input::Buf(b.view(0, ins, d, dev)), o(), &splits, &direct)
                }
                Call::Send(_, peer) => comm.send(b.view(0, ins, d, dev), *peer, &direct),
                Call::Recv(_, peer) => comm.recv(o(), *peer, &direct),
                Call::Norm(_) => unreachable!("issued above"),
            }
        };
        c.sync()?;
        Ok(r.map_err(Into::into))
    }
}

/// The calls of one family that ranks make differently, and what they run on.
pub struct Family {
    /// The tally's key, and the communicator's name.
    pub key: &'static str,
    /// The communicator's timeout on a GPU (the host keeps the context's).
    pub timeout_s: u64,
    /// Its staging size on a GPU, where the cases need one of their own.
    pub staging: Option<usize>,
    /// The buffer's element type and bytes.
    pub dtype: DataType,
    pub bytes: usize,
    /// (what, this rank's call).
    pub cases: Vec<(String, Call)>,
    /// A call every rank makes alike on the context's communicator, its results checked.
    pub matching: fn(&mut Ctx) -> Res<()>,
}

/// Runs `fam`'s cases on a communicator of its own (see the module doc); it is left unfreed on
/// a GPU, where a kernel that gave up may still hold its stream.
pub fn run(c: &mut Ctx, fam: Family) -> Res<()> {
    let d = fam.dtype;
    let b = c.buf(fam.bytes)?;
    b.poison()?;
    b.upload(
        0,
        &gen(d, (fam.bytes / d.size()).min(1 << 20), 77, c.rank, false),
    )?;
    let mut cfg = c.cfg.clone();
    if !c.host() {
        cfg.timeout = Duration::from_secs(fam.timeout_s);
        cfg.cuda_staging_bytes = fam.staging.unwrap_or(cfg.cuda_staging_bytes);
    }
    let comm = (c.new_comm)(&fam.key.replace(' ', "_"), cfg)?;
    let main = std::mem::replace(&mut c.comm, comm);
    let r = cases(c, &fam, &b);
    let comm = std::mem::replace(&mut c.comm, main);
    let done = format!("{}/done", fam.key);
    store_barrier(&**c.comm.store(), &done, c.world, Duration::from_secs(120))?;
    if c.host() {
        drop(comm);
    } else {
        std::mem::forget(comm);
    }
    r?;
    let hits = b.guard_hits(0, b.bytes)?;
    c.expect(fam.key, hits == 0, || {
        format!("{}: {hits} bytes written past the buffer", fam.key)
    });
    c.compare_hashes()
}

fn cases(c: &mut Ctx, fam: &Family, b: &Buf) -> Res<()> {
    for (k, (what, call)) in fam.cases.iter().enumerate() {
        let label = format!("{} {k} ({what})", fam.key);
        let first = call.issue(c, b, fam.dtype)?;
        let (reported, shown) = if c.host() {
            let shown = first.as_ref().err().map_or("Ok".into(), |e| e.to_string());
            (HOST_SAYS.iter().any(|s| shown.contains(s)), shown)
        } else {
            let shown = format!("{:?}", c.next_call()?);
            let says = GPU_SAYS.iter().any(|s| shown.contains(s));
            (first.is_ok() && says, shown)
        };
        if reported && c.rank == 0 {
            println!("{label}: reported: {shown}");
        }
        c.expect(fam.key, reported, || {
            format!("{label}: not reported: {first:?}, then {shown}")
        });
        if !reported && shown.contains("Timeout") {
            break; // a timeout is sticky: the communicator is done
        }
        // The communicator works again: failures of the matching call name the case before.
        let before = c.failures.len();
        (fam.matching)(c)?;
        for f in &mut c.failures[before..] {
            *f = format!("after {label}: {f}");
        }
    }
    Ok(())
}

/// All-reduce calls with counts that change the grid or not, operators and algorithms (push,
/// flat, tree and the streaming flat: 300,000 f32 beyond a 1 MiB staging); push only where
/// the device has it.
pub fn all_reduce(c: &mut Ctx) -> Res<()> {
    let r = c.rank;
    let ar = |n, op, algo| Call::AllReduce(n, op, CallOpts::default().with_algo(algo));
    let (sum, flat, push) = (ReduceOp::Sum, Algo::Flat, Algo::Push);
    let mut cases = vec![
        ("flat, grids differ", ar(100_000 + r * 60_000, sum, flat)),
        (
            "tree, sum against max",
            ar(5000, [sum, ReduceOp::Max][r % 2], Algo::Tree),
        ),
        ("flat streaming, 300,000 + rank", ar(300_000 + r, sum, flat)),
        (
            "flat, avg against sum",
            ar(7000, [ReduceOp::Avg, sum][r % 2], flat),
        ),
    ];
    if c.algos.contains(&push) {
        cases.insert(0, ("push, 100 + rank elements", ar(100 + r, sum, push)));
        cases.insert(3, ("push against flat", ar(3000, sum, [push, flat][r % 2])));
    }
    run(
        c,
        Family {
            key: "disagreeing all_reduce",
            timeout_s: 20,
            staging: Some(1 << 20),
            dtype: DataType::F32,
            bytes: 4 << 20,
            cases: cases.into_iter().map(|(w, x)| (w.into(), x)).collect(),
            matching: |c| {
                let cs = all_reduce::Case::sum(DataType::F32, 1000, Algo::Auto);
                all_reduce::run_case(c, None, &cs, 40_100, 0)
            },
        },
    )
}

/// Counts that differ between ranks (LL and staged sizes): all-gather; all-to-all-v at two
/// ranks (rank 1 expects one element more than rank 0 sends) and above (only rank 1 sees both
/// counts: the kernels' verdict round tells every rank); on a GPU at two ranks, direct sends on
/// both ranks at once and a receive one element longer than its send (the host backend's
/// mailboxes buffer a message: two sends are no disagreement there).
pub fn collectives(c: &mut Ctx) -> Res<()> {
    let (w, me) = (c.world, c.rank);
    let direct = CallOpts::default().with_algo(Algo::Direct);
    let sizes = [100usize, 60_000, 120_000];
    let mut cases: Vec<(String, Call)> = Vec::new();
    for n in sizes {
        let what = format!("all_gather, {n} + rank elements");
        cases.push((what, Call::AllGather(n + me, direct.clone())));
    }
    for n in sizes {
        let (send, recv) = if w == 2 {
            match me {
                0 => (vec![5, n], vec![5, n]),
                _ => (vec![n, 5], vec![n + 1, 5]),
            }
        } else {
            let send = (0..w).map(|q| if (me, q) == (0, 1) { n } else { 5 });
            let recv = (0..w).map(|s| if (me, s) == (1, 0) { n + 1 } else { 5 });
            (send.collect(), recv.collect())
        };
        let what = format!("all_to_all_v, {n} elements, {w} ranks");
        cases.push((what, Call::AllToAllV(send, recv)));
    }
    for n in sizes.into_iter().filter(|_| w == 2 && !c.host()) {
        cases.push((
            format!("send on both ranks, {n} elements"),
            Call::Send(n, 1 - me),
        ));
        let longer = if me == 0 {
            Call::Send(n, 1)
        } else {
            Call::Recv(n + 1, 0)
        };
        cases.push((format!("recv of {n} + 1 elements"), longer));
    }
    run(
        c,
        Family {
            key: "disagreeing collectives",
            timeout_s: 3,
            staging: None,
            dtype: DataType::F32,
            bytes: 4 << 20,
            cases,
            matching: |c| {
                coll::run_one(
                    c,
                    Coll::AllGather,
                    DataType::F32,
                    1001,
                    Algo::Auto,
                    false,
                    0,
                    40_200,
                )
            },
        },
    )
}

/// Low-precision (E4M3) calls whose counts differ (rank r passes n + r elements): one-shot and
/// two-shot all-reduce, all-gather, and an all-reduce in chunks (two of ~10 M elements in a 16
/// MiB staging on a GPU).
pub fn low_precision(c: &mut Ctx) -> Res<()> {
    let me = c.rank;
    let lp = |algo| {
        let o = CallOpts::default().with_algo(algo);
        o.with_low_precision(LowPrecisionChoice::On(Format::E4M3))
    };
    let (sum, flat) = (ReduceOp::Sum, Algo::Flat);
    let chunked = c.pick(200_000, 20_000_000) + me;
    let cases = [
        (
            "all_reduce flat",
            Call::AllReduce(100_000 + me, sum, lp(flat)),
        ),
        (
            "all_reduce tree",
            Call::AllReduce(100_000 + me, sum, lp(Algo::Tree)),
        ),
        // A low-precision all-gather runs by direct access whatever is asked.
        ("all_gather", Call::AllGather(70_001 + me, lp(Algo::Direct))),
        (
            "all_reduce flat, in chunks",
            Call::AllReduce(chunked, sum, lp(flat)),
        ),
    ];
    run(
        c,
        Family {
            key: "disagreeing low precision",
            timeout_s: 3,
            staging: Some(16 << 20),
            dtype: DataType::BF16,
            bytes: c.pick(4 << 20, 64 << 20),
            cases: cases.into_iter().map(|(w, x)| (w.into(), x)).collect(),
            matching: |c| {
                let e4 = Codec::new(Format::E4M3, c.cfg.low_precision.block)?;
                let (bf, sum) = (DataType::BF16, ReduceOp::Sum);
                lowp::all_reduce_case(c, &e4, bf, 1024, Algo::Flat, sum, false, 40_300)?;
                Ok(())
            },
        },
    )
}

/// The fused norm's base call (5 rows of 4096 bf16, flat) and the one every rank checks.
const NORM_BASE: norm::Case = norm::Case {
    d: DataType::BF16,
    rows: 5,
    hidden: 4096,
    eps: 1e-6,
    in_place: false,
    fp8: false,
    given: None,
    lp: None,
    algo: Algo::Flat,
    seed: 5000,
    misalign: 0,
};

/// Fused norm calls (one launch each on a GPU, `FERROCOMM_RMSNORM_FUSED=1`) whose eps, FP8
/// rows, FP8 scale, wire format, rows or form (one-shot against two-shot) differ.
pub fn fused_norm(c: &mut Ctx) -> Res<()> {
    type Change = fn(&mut norm::Case, usize);
    let changes: [(&str, Change); 6] = [
        ("eps differs", |k, r| k.eps *= (1 + r) as f32),
        ("FP8 rows on rank 0 only", |k, r| k.fp8 = r == 0),
        (
            "a given FP8 scale on rank 0, a scale per row elsewhere",
            |k, r| (k.fp8, k.given) = (true, (r == 0).then_some(0.02)),
        ),
        ("E4M3 on the wire on rank 0 only", |k, r| {
            k.lp = (r == 0).then_some(Format::E4M3)
        }),
        ("rows differ", |k, r| k.rows += r),
        ("one-shot against two-shot", |k, r| {
            k.algo = [Algo::Flat, Algo::Tree][r % 2]
        }),
    ];
    let cases = changes.into_iter().map(|(what, change)| {
        let mut case = NORM_BASE;
        change(&mut case, c.rank);
        (what.to_string(), Call::Norm(case))
    });
    run(
        c,
        Family {
            key: "disagreeing fused norm",
            timeout_s: 20,
            staging: None,
            dtype: DataType::BF16,
            bytes: 64,
            cases: cases.collect(),
            matching: |c| {
                let b = norm::Bufs::new(c, &NORM_BASE)?;
                b.load(&NORM_BASE, c.rank)?;
                let r = b.call(&c.comm, &NORM_BASE, c.dev, 0);
                c.sync()?;
                if let Err(e) = r {
                    c.expect("fused norm", false, || format!("matching: {e}"));
                    return Ok(());
                }
                norm::check(c, &NORM_BASE, &b, "matching")
            },
        },
    )
}
