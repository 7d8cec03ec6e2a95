//! Device check of the fused all-reduce + residual add + RMSNorm (`all_reduce_rmsnorm`) of the
//! cuda backend:
//!
//! ```text
//! ferrocomm launch -n 2 -- target/release/examples/gpu_check_norm [--share-gpus] [--quick]
//! ```
//!
//! - every dtype (f32, f16, bf16), the model hidden sizes 8 / 4096 / 5120 / 8192 / 16384 and
//!   odd row counts (few, where the norm runs its wide kernels, more than
//!   `FERROCOMM_RMSNORM_WIDE_MAX_ROWS`, and enough that the one-launch kernels stage four rows
//!   at a time), in and out of place, buffers off 16 bytes (one element),
//!   FP8 rows off, with a scale per row or with one given scale (saturating), each all-reduce
//!   algorithm (push, flat, tree, auto), full precision and E4M3 / INT8 on the wire (one
//!   launch: the rows cross as block-scaled records); inputs regenerated from seeds on every
//!   rank; at one rank the local form (the norm kernel on x itself);
//! - against the host reference on the same inputs: the residual bit for bit (the sum is the
//!   all-reduce's, in rank order, so it equals the host's; with low precision the low-precision
//!   all-reduce's, `quant::reference::one_shot` or `two_shot` as the plan's algorithm says),
//!   `out` and the FP8 rows within the bounds of `rmsnorm::compare` against the exact f64
//!   result on that sum (the FP8 rows dequantized within half an E4M3 step);
//! - identical results on every rank; nothing written past any output (guard bands);
//! - a CUDA graph of several calls captured once and replayed, outputs poisoned between
//!   replays, every replay checked;
//! - with `FERROCOMM_RMSNORM_FUSED=1` the calls that direct access takes run in one launch
//!   (a per-call flat or tree forces the one-shot or the two-shot form, auto chooses by
//!   `FERROCOMM_RMSNORM_FLAT_MAX_BYTES`), checked the same way, and ranks that disagree on a
//!   call (eps, FP8 rows, rows, the form) must see "disagrees between ranks" at the next call
//!   on every rank, after which a matching call works again.
//!
//! Exits 1 on any mismatch, 2 on an error.

use std::time::Duration;

use cudarc::driver::sys;
use ferrocomm::bootstrap::{all_gather_bytes, store_barrier};
use ferrocomm::plan::LowPrecisionChoice;
use ferrocomm::quant::{reference, Format};
use ferrocomm::reduce::{reduce_bytes, to_f32};
use ferrocomm::rmsnorm::{compare, exact_rows, norm_rows, Fp8Ref, Shape};
use ferrocomm::{
    Algo, AllReduceRmsNorm, CallOpts, Communicator, Config, DataType, Device, Fp8Rows, Fp8Scale,
    Input, ReduceOp, View, ViewMut,
};
use rand::{Rng, SeedableRng};

mod support;
use support::*;

/// One call: the shape, the algorithm of its all-reduce and how it is issued.
#[derive(Clone, Copy, Debug)]
struct Case {
    d: DataType,
    rows: usize,
    hidden: usize,
    eps: f32,
    in_place: bool,
    fp8: bool,
    /// With FP8 rows: one scale given for the tensor instead of a scale per row.
    given: Option<f32>,
    /// Low precision on the wire, asked for per call.
    lp: Option<Format>,
    algo: Algo,
    seed: u64,
    /// Every buffer one element off 16 bytes (the FP8 codes one byte; the scales, f32, as
    /// allocated): the kernels' element-by-element paths.
    misalign: bool,
}

/// `n` random values of `d` as bytes (never NaN), the same on every rank for a seed.
fn gen(d: DataType, n: usize, seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let v: Vec<f32> = (0..n).map(|_| rng.random_range(-3.0f32..3.0)).collect();
    let mut b = vec![0u8; n * d.size()];
    ferrocomm::reduce::from_f32(d, &v, &mut b).expect("float dtype");
    b
}

fn widen(d: DataType, b: &[u8]) -> Vec<f32> {
    let mut v = vec![0.0f32; b.len() / d.size()];
    to_f32(d, b, &mut v).expect("float dtype");
    v
}

impl Case {
    fn n(&self) -> usize {
        self.rows * self.hidden
    }
    fn x(&self, rank: usize) -> Vec<u8> {
        gen(self.d, self.n(), self.seed * 131 + rank as u64)
    }
    /// The call's options on `stream`.
    fn opts(&self, stream: u64) -> CallOpts {
        let opts = CallOpts::on_stream(stream).with_algo(self.algo);
        match self.lp {
            Some(f) => opts.with_low_precision(LowPrecisionChoice::On(f)),
            None => opts,
        }
    }
    fn shape(&self) -> Shape {
        Shape {
            rows: self.rows,
            hidden: self.hidden,
            dtype: self.d,
        }
    }
    /// Bytes of the scales buffer: one per row, or the one given.
    fn scale_bytes(&self) -> usize {
        if self.given.is_some() {
            4
        } else {
            self.rows * 4
        }
    }
    /// The FP8 output the host reference computes.
    fn fp8_ref(&self) -> Option<Fp8Ref> {
        self.fp8
            .then(|| self.given.map_or(Fp8Ref::PerRow, Fp8Ref::Given))
    }
    fn residual(&self) -> Vec<u8> {
        gen(self.d, self.n(), self.seed * 131 + 97)
    }
    fn weight(&self) -> Vec<u8> {
        gen(self.d, self.hidden, self.seed * 131 + 98)
    }
    /// Where the rows and the weight start in their buffers (bytes).
    fn off(&self) -> usize {
        if self.misalign {
            self.d.size()
        } else {
            0
        }
    }
    /// Where the FP8 codes start in theirs.
    fn codes_off(&self) -> usize {
        usize::from(self.misalign)
    }
    fn label(&self, world: usize) -> String {
        format!(
            "{world} ranks {} {}x{} eps {} {} fp8 {}{} algo {}{}{}",
            self.d,
            self.rows,
            self.hidden,
            self.eps,
            if self.in_place {
                "in place"
            } else {
                "out of place"
            },
            self.fp8,
            self.given.map_or(String::new(), |s| format!(" scale {s}")),
            self.algo,
            self.lp.map_or(String::new(), |f| format!(" wire {f:?}")),
            if self.misalign { " misaligned" } else { "" }
        )
    }
}

/// A case's device buffers: x (the partial rows, or out in place), out, residual, residual_out
/// (the residual in place), weight, codes, scales.
struct Bufs {
    x: Buf,
    out: Buf,
    res: Buf,
    res_out: Buf,
    w: Buf,
    codes: Buf,
    scales: Buf,
}

impl Bufs {
    fn new(c: &Case) -> Res<Bufs> {
        let b = c.n() * c.d.size();
        let bufs = Bufs {
            x: Buf::new(b)?,
            out: Buf::new(b)?,
            res: Buf::new(b)?,
            res_out: Buf::new(b)?,
            w: Buf::new(c.hidden * c.d.size())?,
            codes: Buf::new(c.n())?,
            scales: Buf::new(c.scale_bytes())?,
        };
        Ok(bufs)
    }

    /// Poisons everything, then uploads the inputs (in place: into out and residual_out).
    fn load(&self, c: &Case, rank: usize) -> Res<()> {
        for b in [
            &self.x,
            &self.out,
            &self.res,
            &self.res_out,
            &self.w,
            &self.codes,
            &self.scales,
        ] {
            b.poison()?;
        }
        let (xb, rb) = if c.in_place {
            (&self.out, &self.res_out)
        } else {
            (&self.x, &self.res)
        };
        xb.upload(c.off(), &c.x(rank))?;
        rb.upload(c.off(), &c.residual())?;
        if let (true, Some(s)) = (c.fp8, c.given) {
            self.scales.upload(0, &s.to_le_bytes())?;
        }
        self.w.upload(c.off(), &c.weight())
    }

    /// Issues the call on `stream`.
    fn call(&self, comm: &Communicator, c: &Case, dev: u32, stream: u64) -> Res<()> {
        let dv = Device::Cuda(dev);
        let (n, d) = (c.n(), c.d);
        let at = |b: &Buf| b.ptr + c.off() as u64;
        // SAFETY: every buffer holds what the view says (allocated for this case, with room
        // for the offset), alive until the caller has synchronized (graph replays: until the
        // graph is destroyed).
        let call = unsafe {
            AllReduceRmsNorm {
                x: if c.in_place {
                    Input::InPlace
                } else {
                    Input::Buf(View::from_raw(at(&self.x) as *const u8, n, d, dv))
                },
                out: ViewMut::from_raw(at(&self.out) as *mut u8, n, d, dv),
                residual: if c.in_place {
                    Input::InPlace
                } else {
                    Input::Buf(View::from_raw(at(&self.res) as *const u8, n, d, dv))
                },
                residual_out: ViewMut::from_raw(at(&self.res_out) as *mut u8, n, d, dv),
                weight: View::from_raw(at(&self.w) as *const u8, c.hidden, d, dv),
                eps: c.eps,
                fp8: c.fp8.then(|| Fp8Rows {
                    codes: ViewMut::from_raw(
                        (self.codes.ptr + c.codes_off() as u64) as *mut u8,
                        n,
                        DataType::F8E4M3,
                        dv,
                    ),
                    scale: match c.given {
                        Some(_) => Fp8Scale::Given(View::from_raw(
                            self.scales.ptr as *const u8,
                            1,
                            DataType::F32,
                            dv,
                        )),
                        None => Fp8Scale::PerRow(ViewMut::from_raw(
                            self.scales.ptr as *mut u8,
                            c.rows,
                            DataType::F32,
                            dv,
                        )),
                    },
                }),
            }
        };
        comm.all_reduce_rmsnorm(call, &c.opts(stream))?;
        Ok(())
    }
}

struct Ctx {
    comm: Communicator,
    rank: usize,
    world: usize,
    dev: u32,
    failures: Vec<String>,
    passed: usize,
    seq: u64,
}

impl Ctx {
    fn same_everywhere(&mut self, bytes: &[u8]) -> Res<bool> {
        self.seq += 1;
        let h = fnv(bytes).to_le_bytes();
        let all = all_gather_bytes(
            &**self.comm.store(),
            &format!("normchk/{}", self.seq),
            self.rank,
            self.world,
            &h,
            Duration::from_secs(120),
        )?;
        Ok(all.iter().all(|v| v.as_slice() == h))
    }

    fn verdict(&mut self, what: String, problem: Option<String>) {
        match problem {
            None => self.passed += 1,
            Some(p) => {
                eprintln!("FAIL rank {}: {what}: {p}", self.rank);
                self.failures.push(what);
            }
        }
    }

    /// Downloads what `c` wrote and checks it (see the module doc).
    fn check(&mut self, c: &Case, b: &Bufs, what: &str) -> Res<()> {
        let (n, d) = (c.n(), c.d);
        let label = format!("{} {what}", c.label(self.world));
        let read = |buf: &Buf, off: usize, bytes: usize| -> Res<(Vec<u8>, bool)> {
            Ok((buf.download(off, bytes)?, buf.guard_hits(off, bytes)? == 0))
        };
        let (y, g1) = read(&b.out, c.off(), n * d.size())?;
        let (r, g2) = read(&b.res_out, c.off(), n * d.size())?;
        let (codes, g3) = read(&b.codes, c.codes_off(), n)?;
        let (scales, g4) = read(&b.scales, 0, c.scale_bytes())?;
        let mut problem = None;
        let fp8_written = !c.fp8 || (g3 && g4);
        if !(g1 && g2 && fp8_written)
            || (!c.fp8 && (codes.iter().chain(&scales).any(|&v| v != POISON)))
        {
            problem = Some("written past an output, or FP8 rows written without FP8".to_string());
        }
        if let Some(s) = c.given {
            if scales != s.to_le_bytes() {
                problem = Some(format!("the given scale was overwritten: {scales:?}"));
            }
        }
        // The host reference on the same inputs: the all-reduce's sum (with low precision the
        // low-precision all-reduce's, one-shot or two-shot as the plan runs it, rounded to the
        // rows' type as it stores it), then norm_rows.
        let inputs: Vec<Vec<u8>> = (0..self.world).map(|r| c.x(r)).collect();
        let refs: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
        let mut sum = vec![0u8; n * d.size()];
        let lp_plan = match c.lp {
            Some(_) => Some(self.comm.rmsnorm_algo_for(c.shape(), &c.opts(0))?),
            None => None,
        };
        match lp_plan
            .as_ref()
            .and_then(|p| p.low_precision.map(|codec| (p, codec)))
        {
            Some((p, codec)) => {
                let xs: Vec<Vec<f32>> = inputs.iter().map(|x| widen(d, x)).collect();
                let lp_sum = if p.algo == Algo::Tree {
                    reference::two_shot(&codec, &xs)
                } else {
                    reference::one_shot(&codec, &xs)
                };
                ferrocomm::reduce::from_f32(d, &lp_sum, &mut sum)?;
            }
            None => reduce_bytes(d, ReduceOp::Sum, &refs, &mut sum)?,
        }
        let host = norm_rows(
            &widen(d, &sum),
            &widen(d, &c.residual()),
            &widen(d, &c.weight()),
            c.eps,
            d,
            c.fp8_ref(),
        );
        let got_r = widen(d, &r);
        if problem.is_none() && got_r != host.residual {
            let i = got_r
                .iter()
                .zip(&host.residual)
                .position(|(a, b)| a.to_bits() != b.to_bits())
                .unwrap_or(0);
            problem = Some(format!(
                "residual_out[{i}] = {} but the host reference has {}",
                got_r[i], host.residual[i]
            ));
        }
        if problem.is_none() {
            let f64s = |b: &[u8]| -> Vec<f64> { widen(d, b).into_iter().map(f64::from).collect() };
            // The exact rows of that sum: with low precision, the low-precision sum as the one
            // input (its rounding is the wire's, judged by the low-precision checks).
            let xs: Vec<Vec<f64>> = if c.lp.is_some() {
                vec![f64s(&sum)]
            } else {
                inputs.iter().map(|x| f64s(x)).collect()
            };
            let exact = exact_rows(&xs, &f64s(&c.residual()), &f64s(&c.weight()), c.eps as f64);
            let sc = widen(DataType::F32, &scales);
            let given = c.given.is_some();
            let q = c.fp8.then_some((codes.as_slice(), sc.as_slice(), given));
            problem = compare(d, &exact, &got_r, &widen(d, &y), q).err();
            // The host's own rows pass the same bounds (the reference is sound).
            if let Err(e) = compare(
                d,
                &exact,
                &host.residual,
                &host.y,
                c.fp8
                    .then_some((host.codes.as_slice(), host.scales.as_slice(), given)),
            ) {
                problem = Some(format!("the host reference itself: {e}"));
            }
        }
        let mut all = y;
        all.extend_from_slice(&r);
        if c.fp8 {
            all.extend_from_slice(&codes);
            all.extend_from_slice(&scales);
        }
        if !self.same_everywhere(&all)? && problem.is_none() {
            problem = Some("results differ between ranks".into());
        }
        self.verdict(label, problem);
        Ok(())
    }
}

fn cases(quick: bool) -> Vec<Case> {
    let mut v = Vec::new();
    let mut seed = 1;
    // Up to FERROCOMM_RMSNORM_WIDE_MAX_ROWS (1024) rows the norm runs the wide kernels, above
    // it fc_rmsnorm (1031 rows). The one-launch kernels stage a row at a time where a block's
    // row slot stages fewer than four rows, four at a time from four (27,000 rows of 64: 2,112
    // rows a step on 132 SMs, so the one-shot's slots stage 13 rows, the two-shot's 7 at two
    // ranks and 5 at three: whole groups of four and a partial one).
    let shapes: &[(usize, usize)] = if quick {
        &[(8, 1), (4096, 3), (40, 7), (64, 1031), (64, 27000)]
    } else {
        &[
            (8, 1),
            (4096, 3),
            (5120, 1),
            (8192, 5),
            (16384, 3),
            (40, 7),
            (4096, 129),
            (64, 1031),
            (64, 27000),
        ]
    };
    // Low precision on the wire: whole blocks of 128 per row take one launch (auto, flat,
    // tree), other rows (40) and push the two launches; E4M3 and INT8. 9,000 rows of 128: the
    // one-shot's slots read five rows each, last staged first.
    let lp_shapes: &[(usize, usize)] = if quick {
        &[(4096, 3), (40, 7), (128, 9000)]
    } else {
        &[
            (4096, 3),
            (8192, 5),
            (5120, 1),
            (40, 7),
            (4096, 129),
            (128, 9000),
        ]
    };
    for d in [DataType::BF16, DataType::F32] {
        for &(hidden, rows) in lp_shapes {
            for algo in [Algo::Auto, Algo::Flat, Algo::Tree, Algo::Push] {
                seed += 1;
                if algo == Algo::Push && rows * hidden * d.size() > 64 << 10 {
                    continue;
                }
                v.push(Case {
                    d,
                    rows,
                    hidden,
                    eps: 1e-6,
                    in_place: seed % 2 == 0,
                    fp8: seed % 3 != 0,
                    given: (seed % 3 != 0 && seed % 5 == 0).then_some(0.02),
                    lp: Some(if seed % 4 == 0 {
                        Format::Int8
                    } else {
                        Format::E4M3
                    }),
                    algo,
                    seed,
                    misalign: false,
                });
            }
        }
    }
    for d in [DataType::BF16, DataType::F16, DataType::F32] {
        for &(hidden, rows) in shapes {
            for algo in [Algo::Auto, Algo::Push, Algo::Flat, Algo::Tree] {
                seed += 1;
                // Push carries small messages only.
                if algo == Algo::Push && rows * hidden * d.size() > 64 << 10 {
                    continue;
                }
                v.push(Case {
                    d,
                    rows,
                    hidden,
                    eps: if seed % 2 == 0 { 1e-6 } else { 1e-5 },
                    in_place: seed % 2 == 0,
                    fp8: seed % 3 != 0,
                    given: (seed % 3 != 0 && seed % 5 == 0).then_some(0.02),
                    lp: None,
                    algo,
                    seed,
                    misalign: seed % 4 == 1,
                });
            }
        }
    }
    v
}

/// Several calls captured in one graph on a stream of our own, replayed three times with the
/// outputs poisoned (and in-place inputs reloaded) before each replay.
fn graph(c: &mut Ctx) -> Res<()> {
    let plan = [
        (DataType::BF16, 3, 4096, true, true, Algo::Auto),
        (DataType::BF16, 1, 8, false, true, Algo::Push),
        (DataType::F16, 5, 8192, false, false, Algo::Flat),
        (DataType::F32, 7, 40, true, true, Algo::Tree),
    ];
    let cases: Vec<Case> = plan
        .iter()
        .enumerate()
        .map(|(k, &(d, rows, hidden, in_place, fp8, algo))| Case {
            d,
            rows,
            hidden,
            eps: 1e-6,
            in_place,
            fp8,
            // The tree case takes one given scale (read again at every replay), the flat one
            // E4M3 on the wire.
            given: (algo == Algo::Tree).then_some(0.05),
            lp: (algo == Algo::Flat).then_some(Format::E4M3),
            algo,
            seed: 1000 + k as u64,
            // The push case's buffers off 16 bytes, replayed too.
            misalign: algo == Algo::Push,
        })
        .collect();
    let bufs: Vec<Bufs> = cases.iter().map(Bufs::new).collect::<Res<_>>()?;
    for (k, b) in cases.iter().zip(&bufs) {
        b.load(k, c.rank)?;
    }
    let stream = new_stream()?;
    let mut g: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: capture on our own stream; the buffers outlive the graph.
    unsafe {
        cu(
            sys::cuStreamBeginCapture_v2(
                stream as sys::CUstream,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            ),
            "cuStreamBeginCapture",
        )?;
    }
    let issued: Res<()> = cases
        .iter()
        .zip(&bufs)
        .try_for_each(|(k, b)| b.call(&c.comm, k, c.dev, stream));
    // SAFETY: ends the capture begun above, whatever the calls did.
    unsafe {
        cu(
            sys::cuStreamEndCapture(stream as sys::CUstream, &mut g),
            "cuStreamEndCapture",
        )?;
    }
    issued?;
    let mut ge: sys::CUgraphExec = std::ptr::null_mut();
    // SAFETY: a captured graph; instantiated once.
    unsafe {
        cu(
            sys::cuGraphInstantiateWithFlags(&mut ge, g, 0),
            "cuGraphInstantiate",
        )?
    };
    for replay in 0..3 {
        for (k, b) in cases.iter().zip(&bufs) {
            b.load(k, c.rank)?;
        }
        // SAFETY: an instantiated graph on our stream.
        unsafe {
            cu(
                sys::cuGraphLaunch(ge, stream as sys::CUstream),
                "cuGraphLaunch",
            )?;
        }
        sync()?;
        for (k, b) in cases.iter().zip(&bufs) {
            c.check(k, b, &format!("graph replay {replay}"))?;
        }
    }
    // SAFETY: destroyed once, after the last replay completed.
    unsafe {
        sys::cuGraphExecDestroy(ge);
        sys::cuGraphDestroy(g);
    }
    Ok(())
}

/// Calls that disagree between ranks, one launch each (see the module doc), on a communicator
/// of their own with a short timeout; left unfreed at the end (a kernel that gave up may still
/// hold its staging).
fn mismatch(c: &mut Ctx, cfg: &Config) -> Res<()> {
    let mut cfg_m = cfg.clone();
    cfg_m.timeout = Duration::from_secs(20);
    let comm = comm_with("gpu_check_norm_mismatch", cfg_m)?;
    let r = c.rank;
    let base = Case {
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
        misalign: false,
    };
    let cases = [
        (
            "eps differs",
            Case {
                eps: 1e-6 * (1 + r) as f32,
                ..base
            },
        ),
        (
            "FP8 rows on rank 0 only",
            Case {
                fp8: r == 0,
                ..base
            },
        ),
        (
            "a given FP8 scale on rank 0, a scale per row elsewhere",
            Case {
                fp8: true,
                given: (r == 0).then_some(0.02),
                ..base
            },
        ),
        (
            "E4M3 on the wire on rank 0 only",
            Case {
                lp: (r == 0).then_some(Format::E4M3),
                ..base
            },
        ),
        (
            "rows differ",
            Case {
                rows: 5 + r,
                ..base
            },
        ),
        (
            "one-shot against two-shot",
            Case {
                algo: [Algo::Flat, Algo::Tree][r % 2],
                ..base
            },
        ),
    ];
    let stream = new_stream()?;
    let good = Bufs::new(&base)?;
    for (what, case) in cases {
        let b = Bufs::new(&case)?;
        b.load(&case, r)?;
        let first = b.call(&comm, &case, c.dev, stream);
        sync()?;
        good.load(&base, r)?;
        let next = good.call(&comm, &base, c.dev, stream);
        sync()?;
        let shown = format!("{next:?}");
        let label = format!("mismatch ({what})");
        if first.is_ok() && shown.contains("disagrees between ranks") {
            if r == 0 {
                println!("{label}: reported: {shown}");
            }
            c.verdict(label.clone(), None);
        } else {
            c.verdict(
                label.clone(),
                Some(format!("not reported: {first:?} then {shown}")),
            );
            if shown.contains("Timeout") {
                break; // sticky: the communicator is done
            }
        }
        // A matching call works again, with the right results.
        good.load(&base, r)?;
        match good.call(&comm, &base, c.dev, stream) {
            Ok(()) => {
                sync()?;
                c.check(&base, &good, &format!("after {label}"))?;
            }
            Err(e) => c.verdict(format!("after {label}"), Some(e.to_string())),
        }
    }
    store_barrier(
        &**c.comm.store(),
        "normchk/mismatch-done",
        c.world,
        Duration::from_secs(120),
    )?;
    std::mem::forget(comm);
    Ok(())
}

fn real_main() -> Res<i32> {
    let args = flags(&["--quick"])?;
    let quick = args.iter().any(|a| a == "--quick");
    let cfg = Config::from_env()?;
    let comm = comm_with("gpu_check_norm", cfg.clone())?;
    let (rank, world) = (comm.rank(), comm.size());
    let Device::Cuda(dev) = comm.device() else {
        return Err("gpu_check_norm needs a GPU".into());
    };
    let cuda = cudarc::driver::CudaContext::new(dev as usize)?;
    cuda.bind_to_thread()?;
    // The guard bands are read back after every call: first, that the read-back sees writes.
    Buf::guard_self_check(Device::Cuda(dev))?;
    let fused = cfg.thresholds.rmsnorm_fused;
    if rank == 0 {
        println!(
            "gpu_check_norm: {world} ranks, backend {}, one launch (FERROCOMM_RMSNORM_FUSED) {}, \
             one-shot up to {} bytes (FERROCOMM_RMSNORM_FLAT_MAX_BYTES)",
            comm.backend_name(),
            if fused { "on" } else { "off" },
            cfg.thresholds
                .rmsnorm_flat_max
                .map_or("the default".to_string(), |b| b.to_string())
        );
    }
    let mut c = Ctx {
        comm,
        rank,
        world,
        dev,
        failures: Vec::new(),
        passed: 0,
        seq: 0,
    };
    let stream = new_stream()?;
    for case in cases(quick) {
        let b = Bufs::new(&case)?;
        b.load(&case, rank)?;
        b.call(&c.comm, &case, dev, stream)?;
        sync()?;
        c.check(&case, &b, "eager")?;
    }
    graph(&mut c)?;
    // Disagreeing calls need a second rank.
    if fused && world > 1 {
        mismatch(&mut c, &cfg)?;
    }
    let failed = c.failures.len();
    println!(
        "gpu_check_norm rank {rank}: {} passed, {failed} failed",
        c.passed
    );
    Ok(if failed == 0 { 0 } else { 1 })
}

fn main() {
    run_main("gpu_check_norm", real_main)
}
