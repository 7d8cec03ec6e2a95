//! The fused all-reduce + residual add + RMSNorm (`all_reduce_rmsnorm`) body: every case of
//! [`cases`] issued once, then checked against the host reference on the same inputs: the
//! residual bit for bit (the sum is the all-reduce's, in rank order, so it equals the host's;
//! with low precision the low-precision all-reduce's, `quant::reference::one_shot` or
//! `two_shot` as the plan's algorithm says), `out` and the FP8 rows within the bounds of
//! `rmsnorm::compare` against the exact f64 result on that sum; identical results on every
//! rank; nothing written past any output (guard bands).

use ferrocomm::plan::LowPrecisionChoice;
use ferrocomm::quant::{reference, Format};
use ferrocomm::reduce::{reduce_bytes, to_f32};
use ferrocomm::rmsnorm::{compare, exact_rows, norm_rows, Fp8Ref, Shape};
use ferrocomm::{
    Algo, AllReduceRmsNorm, CallOpts, Communicator, DataType, Fp8Rows, Fp8Scale, ReduceOp,
};
use rand::{Rng, SeedableRng};

use super::*;

/// The bodies of this module, by name.
pub const BODIES: [(&str, Body); 1] = [("fused norm", eager)];

/// One call: the shape, the algorithm of its all-reduce and how it is issued.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub d: DataType,
    pub rows: usize,
    pub hidden: usize,
    pub eps: f32,
    pub in_place: bool,
    pub fp8: bool,
    /// With FP8 rows: one scale given for the tensor instead of a scale per row.
    pub given: Option<f32>,
    /// Low precision on the wire, asked for per call.
    pub lp: Option<Format>,
    pub algo: Algo,
    pub seed: u64,
    /// The ranks (bit r: rank r) whose every buffer is one element off 16 bytes (the FP8 codes
    /// one byte; the scales, f32, as allocated): the kernels' element-by-element paths. Ranks
    /// that differ run different entry points of one call (a plain one where aligned), which
    /// must meet and give the same bits.
    pub misalign: u64,
}

/// `n` random values of `d` as bytes (never NaN), the same on every rank for a seed.
fn rows_gen(d: DataType, n: usize, seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
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
        rows_gen(self.d, self.n(), self.seed * 131 + rank as u64)
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
        rows_gen(self.d, self.n(), self.seed * 131 + 97)
    }
    fn weight(&self) -> Vec<u8> {
        rows_gen(self.d, self.hidden, self.seed * 131 + 98)
    }
    fn misaligned(&self, rank: usize) -> bool {
        rank < 64 && self.misalign >> rank & 1 == 1
    }
    /// Where `rank`'s rows and weight start in their buffers (bytes).
    fn off(&self, rank: usize) -> usize {
        if self.misaligned(rank) {
            self.d.size()
        } else {
            0
        }
    }
    /// Where `rank`'s FP8 codes start in theirs.
    fn codes_off(&self, rank: usize) -> usize {
        usize::from(self.misaligned(rank))
    }
    pub fn label(&self, world: usize) -> String {
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
            match self.misalign {
                0 => String::new(),
                u64::MAX => " misaligned".to_string(),
                m => format!(" misaligned on ranks {m:#b}"),
            }
        )
    }
}

/// A case's device buffers: x (the partial rows, or out in place), out, residual, residual_out
/// (the residual in place), weight, codes, scales.
pub struct Bufs {
    /// Where this rank's rows, weight and codes start (bytes: `Case::off`, `Case::codes_off`).
    off: usize,
    codes_off: usize,
    x: Buf,
    out: Buf,
    res: Buf,
    res_out: Buf,
    w: Buf,
    codes: Buf,
    scales: Buf,
}

impl Bufs {
    pub fn new(ctx: &Ctx, c: &Case) -> Res<Bufs> {
        let b = c.n() * c.d.size();
        let bufs = Bufs {
            off: c.off(ctx.rank),
            codes_off: c.codes_off(ctx.rank),
            x: ctx.buf(b)?,
            out: ctx.buf(b)?,
            res: ctx.buf(b)?,
            res_out: ctx.buf(b)?,
            w: ctx.buf(c.hidden * c.d.size())?,
            codes: ctx.buf(c.n())?,
            scales: ctx.buf(c.scale_bytes())?,
        };
        Ok(bufs)
    }

    /// Poisons everything, then uploads the inputs (in place: into out and residual_out).
    pub fn load(&self, c: &Case, rank: usize) -> Res<()> {
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
        xb.upload(self.off, &c.x(rank))?;
        rb.upload(self.off, &c.residual())?;
        if let (true, Some(s)) = (c.fp8, c.given) {
            self.scales.upload(0, &s.to_le_bytes())?;
        }
        self.w.upload(self.off, &c.weight())
    }

    /// Bytes written outside this rank's inputs and outputs (in each buffer, the room before
    /// them and everything after them to the end of the guard band), for a call whose values
    /// are not checked ([`check`] reads the outputs' own).
    pub fn guard_hits(&self, c: &Case) -> Res<usize> {
        let rows = c.n() * c.d.size();
        let mut hits = 0;
        for (b, off, len) in [
            (&self.x, self.off, rows),
            (&self.out, self.off, rows),
            (&self.res, self.off, rows),
            (&self.res_out, self.off, rows),
            (&self.w, self.off, c.hidden * c.d.size()),
            (&self.codes, self.codes_off, c.n()),
            (&self.scales, 0, c.scale_bytes()),
        ] {
            hits += b.guard_hits(off, len)?;
        }
        Ok(hits)
    }

    /// Issues the call on `stream`.
    pub fn call(&self, comm: &Communicator, c: &Case, dv: Device, stream: u64) -> Res<()> {
        let (n, d) = (c.n(), c.d);
        let at = |b: &Buf| b.ptr + self.off as u64;
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
                        (self.codes.ptr + self.codes_off as u64) as *mut u8,
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

/// Downloads what `c` wrote and checks it against the host reference (see the module doc).
pub fn check(ctx: &mut Ctx, c: &Case, b: &Bufs, what: &str) -> Res<()> {
    let (n, d) = (c.n(), c.d);
    let label = format!("{} {what}", c.label(ctx.world));
    let read = |buf: &Buf, off: usize, bytes: usize| -> Res<(Vec<u8>, bool)> {
        Ok((buf.download(off, bytes)?, buf.guard_hits(off, bytes)? == 0))
    };
    let (y, g1) = read(&b.out, b.off, n * d.size())?;
    let (r, g2) = read(&b.res_out, b.off, n * d.size())?;
    let (codes, g3) = read(&b.codes, b.codes_off, n)?;
    let (scales, g4) = read(&b.scales, 0, c.scale_bytes())?;
    let mut problem = None;
    let fp8_written = !c.fp8 || (g3 && g4);
    if !(g1 && g2 && fp8_written) || (!c.fp8 && (codes.iter().chain(&scales).any(|&v| v != POISON)))
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
    let inputs: Vec<Vec<u8>> = (0..ctx.world).map(|r| c.x(r)).collect();
    let refs: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
    let mut sum = vec![0u8; n * d.size()];
    let lp_plan = match c.lp {
        Some(_) => Some(ctx.comm.rmsnorm_algo_for(c.shape(), &c.opts(0))?),
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
    ctx.hash("fused norm", label.clone(), &all);
    ctx.expect("fused norm", problem.is_none(), || {
        format!("{label}: {}", problem.unwrap_or_default())
    });
    Ok(())
}

/// The eager cases: every dtype, the model hidden sizes and odd row counts, in and out of
/// place, buffers off 16 bytes, FP8 rows (a scale per row or one given), each all-reduce
/// algorithm of the device, full precision and E4M3 / INT8 on the wire. On the host: the shapes
/// up to 1,031 rows of 64 and 90 rows of 128 on the wire (same forms).
pub fn cases(quick: bool, host: bool, algos: &[Algo]) -> Vec<Case> {
    let mut v = Vec::new();
    let mut seed = 1;
    // Up to FERROCOMM_RMSNORM_WIDE_MAX_ROWS (1024) rows the norm runs the wide kernels, above
    // it fc_rmsnorm (1031 rows). The one-launch kernels stage a row at a time where a block's
    // row slot stages fewer than four rows, four at a time from four (27,000 rows of 64: 2,112
    // rows a step on 132 SMs, so the one-shot's slots stage 13 rows, the two-shot's 7 at two
    // ranks and 5 at three: whole groups of four and a partial one). 2,111 rows of 1024: the
    // fused forms' row slots of 64 (bf16, f16) and 128 (f32) threads, 8 and 4 a block, each over
    // one to four steps: the slots synchronizing apart and prefetching their next rows.
    let shapes: &[(usize, usize)] = if host {
        &[(8, 1), (4096, 3), (40, 7), (64, 1031)]
    } else if quick {
        &[
            (8, 1),
            (4096, 3),
            (40, 7),
            (64, 1031),
            (64, 27000),
            (1024, 2111),
        ]
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
            (1024, 2111),
        ]
    };
    // Low precision on the wire: whole blocks of 128 per row take one launch (auto, flat,
    // tree), other rows (40) and push the two launches; E4M3 and INT8. 9,000 rows of 128: the
    // one-shot's slots read five rows each, last staged first.
    let lp_shapes: &[(usize, usize)] = if host {
        &[(4096, 3), (40, 7), (128, 90)]
    } else if quick {
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
    // Each (dtype, shape) with each algorithm: push only for small messages; the seed picks in
    // or out of place, FP8 rows and their scale.
    let mut add = |d: DataType, (hidden, rows): (usize, usize), order: [Algo; 4], wire: bool| {
        for algo in order {
            seed += 1;
            if !algos.contains(&algo) || (algo == Algo::Push && rows * hidden * d.size() > 64 << 10)
            {
                continue;
            }
            let lp = [Format::E4M3, Format::Int8][usize::from(seed % 4 == 0)];
            v.push(Case {
                d,
                rows,
                hidden,
                eps: if wire || seed % 2 == 0 { 1e-6 } else { 1e-5 },
                in_place: seed % 2 == 0,
                fp8: seed % 3 != 0,
                given: (seed % 3 != 0 && seed % 5 == 0).then_some(0.02),
                lp: wire.then_some(lp),
                algo,
                seed,
                // Every rank off 16 bytes, or rank 1 alone (the others' plain entries).
                misalign: match seed % 8 {
                    _ if wire => 0,
                    1 | 5 => u64::MAX,
                    3 => 0b10,
                    _ => 0,
                },
            });
        }
    };
    for d in [DataType::BF16, DataType::F32] {
        for &shape in lp_shapes {
            add(
                d,
                shape,
                [Algo::Auto, Algo::Flat, Algo::Tree, Algo::Push],
                true,
            );
        }
    }
    for d in [DataType::BF16, DataType::F16, DataType::F32] {
        for &shape in shapes {
            add(
                d,
                shape,
                [Algo::Auto, Algo::Push, Algo::Flat, Algo::Tree],
                false,
            );
        }
    }
    v
}

/// Every case of [`cases`] (the device's algorithms), issued eagerly and checked.
pub fn eager(c: &mut Ctx) -> Res<()> {
    let algos = c.algos.clone();
    for case in cases(c.quick, c.host(), &algos) {
        let b = Bufs::new(c, &case)?;
        b.load(&case, c.rank)?;
        b.call(&c.comm, &case, c.dev, 0)?;
        c.sync()?;
        check(c, &case, &b, "eager")?;
    }
    c.compare_hashes()
}
