//! Inputs and their check: random values that every rank can recompute for any rank (a
//! counter-based hash of seed, row, rank and index), poison for outputs, and the count of
//! wrong elements (exact for integers and data movement, a tolerance for float reductions).

use ferrocomm::reference::{decode, encode, epsilon, is_signed, round_to, wrap, Value};
use ferrocomm::{DataType, Format, ReduceOp};

use super::sizes::{A2avCounts, Coll, Shape};

/// The eps of the bench's all_reduce_rmsnorm calls.
pub const RMSNORM_EPS: f32 = 1e-6;

/// A well-mixed 64-bit hash (splitmix64's finalizer).
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Largest magnitude of a generated integer: small enough that sums over many ranks never
/// overflow, so that the expected average is unambiguous.
fn int_range(dtype: DataType) -> i128 {
    match dtype.size() {
        1 => 7,
        _ => 1000,
    }
}

/// The input value of element `i` on rank `rank` for a row salted with `salt`. Never zero.
pub fn value(dtype: DataType, seed: u64, salt: u64, rank: usize, i: usize) -> Value {
    let h = mix(seed ^ mix(salt ^ mix(((rank as u64) << 40) ^ i as u64)));
    if dtype.is_float() {
        // +-[0.5, 1.5): no zeros, no cancellation to denormals, exact in every float dtype
        // after rounding to it.
        let u = (h >> 11) as f64 / (1u64 << 53) as f64;
        let mag = 0.5 + u;
        let x = if h & 1 == 1 { -mag } else { mag };
        Value::Float(round_to(dtype, x))
    } else {
        let r = int_range(dtype);
        let m = 1 + (h >> 8) as i128 % r;
        Value::Int(if is_signed(dtype) && h & 1 == 1 {
            -m
        } else {
            m
        })
    }
}

/// Threads for one pass over `n` elements: the machine's, but one per 64 Ki elements at most, so
/// small buffers stay on the calling thread.
fn workers(n: usize) -> usize {
    let hw = std::thread::available_parallelism().map_or(1, |p| p.get());
    hw.min(n >> 16).max(1)
}

/// Elements per run when `n` elements are split between the workers, `None` for a single run.
fn run_elems(n: usize) -> Option<usize> {
    let per = n.div_ceil(workers(n)).max(1);
    (per < n).then_some(per)
}

/// Splits `buf` (elements of `e` bytes) into one run of whole elements per worker and sums what
/// `f(first element index, run)` returns for each. A 256 MB output takes tens of seconds on one
/// thread: the expected value of every element is recomputed from every rank's input.
fn par_sum<F: Fn(usize, &[u8]) -> u64 + Sync>(buf: &[u8], e: usize, f: F) -> u64 {
    let Some(per) = run_elems(buf.len() / e) else {
        return f(0, buf);
    };
    let f = &f;
    std::thread::scope(|sc| {
        let runs: Vec<_> = buf
            .chunks(per * e)
            .enumerate()
            .map(|(k, run)| sc.spawn(move || f(k * per, run)))
            .collect();
        runs.into_iter()
            .map(|h| h.join().expect("a check thread panicked"))
            .sum()
    })
}

/// As [`par_sum`], for filling `buf`: `f(first element index, run)` writes its run.
fn par_fill<F: Fn(usize, &mut [u8]) + Sync>(buf: &mut [u8], e: usize, f: F) {
    let Some(per) = run_elems(buf.len() / e) else {
        return f(0, buf);
    };
    let f = &f;
    std::thread::scope(|sc| {
        for (k, run) in buf.chunks_mut(per * e).enumerate() {
            sc.spawn(move || f(k * per, run));
        }
    });
}

/// Fills `out` with poison: NaN for floats, a value outside the generated range for integers.
pub fn poison(dtype: DataType, out: &mut [u8]) {
    let byte = if dtype.is_float() { 0xFF } else { 0x7F };
    out.fill(byte);
}

/// Which elements a run checks and what they should hold.
#[derive(Debug, Clone)]
pub struct Checker {
    pub shape: Shape,
    pub op: ReduceOp,
    pub root: usize,
    pub seed: u64,
    pub salt: u64,
    /// Low-precision wire format in effect for this row (widens the float tolerance).
    pub low_precision: Option<Format>,
    /// All-to-all-v: for each receiving rank, its parts in the order they land, as (sender,
    /// where the part starts in the sender's input, elements); empty for the other collectives.
    pub a2av: Vec<Vec<(usize, usize, usize)>>,
}

/// Expected value of one output element with the slack allowed around it.
struct Want {
    val: Value,
    tol: f64,
}

impl Checker {
    /// The checker of one row (`a2av` filled in for the all-to-all-v).
    pub fn new(
        shape: Shape,
        op: ReduceOp,
        root: usize,
        seed: u64,
        salt: u64,
        low_precision: Option<Format>,
    ) -> Checker {
        let n = shape.world;
        let a2av = if shape.coll.uneven() {
            let sends: Vec<Vec<usize>> = (0..n)
                .map(|r| A2avCounts::new(shape.count, n, r).send)
                .collect();
            (0..n)
                .map(|d| {
                    (0..n)
                        .map(|s| (s, A2avCounts::displ(&sends[s], d), sends[s][d]))
                        .collect()
                })
                .collect()
        } else {
            Vec::new()
        };
        Checker {
            shape,
            op,
            root,
            seed,
            salt,
            low_precision,
            a2av,
        }
    }

    fn x(&self, rank: usize, i: usize) -> Value {
        value(self.shape.dtype, self.seed, self.salt, rank, i)
    }

    /// Rank `rank`'s input element `i`.
    #[cfg(test)]
    pub fn input(&self, rank: usize, i: usize) -> Value {
        self.x(rank, i)
    }

    /// The bytes of rank `rank`'s out-of-place input buffer.
    pub fn input_bytes(&self, rank: usize) -> Vec<u8> {
        let e = self.shape.dtype.size();
        let mut b = vec![0u8; self.shape.in_count * e];
        par_fill(&mut b, e, |first, run| {
            for (i, c) in run.chunks_exact_mut(e).enumerate() {
                encode(self.shape.dtype, self.x(rank, first + i), c);
            }
        });
        b
    }

    /// The bytes the in-place buffer starts with on `rank` (the input where the collective
    /// reads it; poison elsewhere).
    pub fn inplace_bytes(&self, rank: usize) -> Vec<u8> {
        let s = &self.shape;
        let e = s.dtype.size();
        let mut b = vec![0u8; s.inplace_count * e];
        poison(s.dtype, &mut b);
        let part = s.count / s.world;
        let (start, len) = match s.coll {
            // The rank's own part sits at its offset in the gathered buffer.
            Coll::AllGather => (rank * part, part),
            Coll::Broadcast if rank != self.root => (0, 0),
            _ => (0, s.inplace_count),
        };
        par_fill(&mut b[start * e..(start + len) * e], e, |first, run| {
            for (i, c) in run.chunks_exact_mut(e).enumerate() {
                encode(s.dtype, self.x(rank, first + i), c);
            }
        });
        b
    }

    /// Reduces element `i` over all ranks; the tolerance grows with the rank count. One pass
    /// over the ranks, no allocation (it runs for every element of every checked output).
    fn reduced(&self, i: usize) -> Want {
        let s = &self.shape;
        let n = s.world;
        if !s.dtype.is_float() {
            let int = |r| match self.x(r, i) {
                Value::Int(v) => v,
                Value::Float(x) => x as i128,
            };
            let (mut sum, mut prod, mut min, mut max) = (0i128, 1i128, i128::MAX, i128::MIN);
            for r in 0..n {
                let v = int(r);
                sum += v;
                prod = wrap(s.dtype, prod * v);
                min = min.min(v);
                max = max.max(v);
            }
            let v = match self.op {
                ReduceOp::Sum => wrap(s.dtype, sum),
                ReduceOp::Avg => wrap(s.dtype, sum / n as i128),
                ReduceOp::Prod => prod,
                ReduceOp::Min if n > 0 => min,
                ReduceOp::Max if n > 0 => max,
                _ => 0,
            };
            return Want {
                val: Value::Int(v),
                tol: 0.0,
            };
        }
        let (mut sum, mut prod, mut abs_sum, mut abs_max) = (0f64, 1f64, 0f64, 0f64);
        let (mut min, mut max) = (f64::INFINITY, f64::NEG_INFINITY);
        for r in 0..n {
            let x = match self.x(r, i) {
                Value::Float(x) => x,
                Value::Int(v) => v as f64,
            };
            sum += x;
            prod *= x;
            abs_sum += x.abs();
            abs_max = abs_max.max(x.abs());
            min = min.min(x);
            max = max.max(x);
        }
        let eps = epsilon(s.dtype);
        let nf = n as f64;
        let (v, tol) = match self.op {
            ReduceOp::Sum => (sum, eps * nf * abs_sum),
            ReduceOp::Avg => (sum / nf, eps * nf * abs_sum / nf),
            ReduceOp::Prod => (prod, eps * nf * prod.abs()),
            ReduceOp::Min => (min, 0.0),
            ReduceOp::Max => (max, 0.0),
            _ => (0.0, 0.0),
        };
        let lp = match (self.low_precision, self.op) {
            // Quantized at most once per phase (two phases for two-shot): each term is off by
            // at most a code step of its block's absmax.
            (Some(f), ReduceOp::Sum | ReduceOp::Avg) => {
                let scale = if self.op == ReduceOp::Avg { 1.0 } else { nf };
                2.0 * lp_step(f) * abs_max * scale
            }
            _ => 0.0,
        };
        Want {
            val: Value::Float(v),
            tol: tol + lp,
        }
    }

    /// A value moved unchanged (or, in low precision, quantized once).
    fn moved(&self, v: Value) -> Want {
        let tol = match (self.low_precision, v) {
            (Some(f), Value::Float(x)) => lp_step(f) * x.abs().max(1.5),
            _ => 0.0,
        };
        Want { val: v, tol }
    }

    /// What output element `j` of `rank` should hold, `None` for elements the collective does
    /// not write.
    fn want(&self, rank: usize, j: usize, in_place: bool) -> Option<Want> {
        let s = &self.shape;
        let n = s.world;
        let part = s.count / n;
        Some(match s.coll {
            // Checked row by row (count_wrong_rmsnorm).
            Coll::AllReduceRmsNorm => return None,
            Coll::AllReduce => self.reduced(j),
            Coll::Reduce if rank == self.root => self.reduced(j),
            Coll::Reduce => return None,
            Coll::Broadcast => self.moved(self.x(self.root, j)),
            Coll::AllGather => self.moved(self.x(j / part, j % part)),
            Coll::ReduceScatter if in_place => {
                if j / part != rank {
                    return None;
                }
                self.reduced(j)
            }
            Coll::ReduceScatter => self.reduced(rank * part + j),
            Coll::AllToAll => self.moved(self.x(j / part, rank * part + j % part)),
            Coll::AllToAllV | Coll::DeviceAllToAllV => {
                // The part element j falls in, and its place in the sender's input.
                let mut at = 0;
                for &(s, start, len) in &self.a2av[rank] {
                    if j < at + len {
                        return Some(self.moved(self.x(s, start + j - at)));
                    }
                    at += len;
                }
                return None;
            }
            Coll::SendRecv | Coll::Put => self.moved(self.x((rank + n - 1) % n, j)),
        })
    }

    /// Number of wrong elements in `out` (the output buffer of `rank` as bytes).
    pub fn count_wrong(&self, rank: usize, out: &[u8], in_place: bool) -> u64 {
        if self.shape.coll == Coll::AllReduceRmsNorm {
            return self.count_wrong_rmsnorm(rank, out);
        }
        let e = self.shape.dtype.size();
        par_sum(out, e, |first, run| {
            self.count_wrong_run(rank, first, run, in_place)
        })
    }

    /// Wrong elements among `run`, output elements `first..` of `rank`.
    fn count_wrong_run(&self, rank: usize, first: usize, run: &[u8], in_place: bool) -> u64 {
        let d = self.shape.dtype;
        let e = d.size();
        let mut wrong = 0;
        for (k, b) in run.chunks_exact(e).enumerate() {
            let Some(w) = self.want(rank, first + k, in_place) else {
                continue;
            };
            let ok = match (decode(d, b), w.val) {
                (Value::Int(g), Value::Int(x)) => g == x,
                (Value::Float(g), Value::Float(x)) => {
                    // Saturating types may clamp the exact value: compare with it rounded.
                    let xr = round_to(d, x);
                    g == xr || (g - x).abs() <= w.tol || (g - xr).abs() <= w.tol
                }
                _ => false,
            };
            if !ok {
                wrong += 1;
            }
        }
        wrong
    }

    /// all_reduce_rmsnorm: wrong elements of `out` (normalized rows, then the new residual)
    /// against the library's host arithmetic (`rmsnorm::norm_rows`) on the all-reduced rows.
    /// The residual must match exactly (the sum is in rank order, rounded once, as the
    /// reference's), the rows within a few roundings of the row's norm (the sum of squares is
    /// ordered differently on a GPU); low precision widens both by a code step per rank.
    fn count_wrong_rmsnorm(&self, rank: usize, out: &[u8]) -> u64 {
        let s = &self.shape;
        let (n, h, d, e) = (s.count, s.hidden, s.dtype, s.dtype.size());
        let widen = |b: &[u8]| {
            let mut v = vec![0.0f32; b.len() / e];
            ferrocomm::reduce::to_f32(d, b, &mut v).map(|_| v)
        };
        let inputs: Vec<Vec<u8>> = (0..s.world).map(|r| self.input_bytes(r)).collect();
        let xs: Vec<&[u8]> = inputs.iter().map(|b| &b[..n * e]).collect();
        let mut sum = vec![0u8; n * e];
        let own = &inputs[rank];
        let parts = (|| -> ferrocomm::Result<_> {
            ferrocomm::reduce::reduce_bytes(d, ReduceOp::Sum, &xs, &mut sum)?;
            Ok((
                widen(&sum)?,
                widen(&own[n * e..2 * n * e])?,
                widen(&own[2 * n * e..])?,
                widen(&out[..n * e])?,
                widen(&out[n * e..2 * n * e])?,
            ))
        })();
        // Not a float dtype: the plan refuses those; count everything wrong rather than panic.
        let Ok((sum_f, res, w, got_y, got_r)) = parts else {
            return (2 * n) as u64;
        };
        let want = ferrocomm::rmsnorm::norm_rows(&sum_f, &res, &w, RMSNORM_EPS, d, None);
        let u = epsilon(d);
        let lp = self
            .low_precision
            .map_or(0.0, |f| 2.0 * lp_step(f) * s.world as f64);
        let mut wrong = 0;
        for row in 0..n / h {
            let span = row * h..(row + 1) * h;
            let r_max = want.residual[span.clone()]
                .iter()
                .chain(&sum_f[span.clone()])
                .fold(0.0f64, |m, v| m.max(v.abs() as f64));
            let y_max = want.y[span.clone()]
                .iter()
                .fold(0.0f64, |m, v| m.max(v.abs() as f64));
            for i in span {
                let (gr, wr) = (got_r[i] as f64, want.residual[i] as f64);
                if !(gr == wr || (gr - wr).abs() <= lp * r_max) {
                    wrong += 1;
                }
                let (gy, wy) = (got_y[i] as f64, want.y[i] as f64);
                let tol = 4.0 * u * (wy.abs() + y_max) + 4.0 * lp * y_max;
                if !(gy == wy || (gy - wy).abs() <= tol) {
                    wrong += 1;
                }
            }
        }
        wrong
    }

    /// Index of the first output element a check looks at (for the corruption test hook).
    pub fn first_checked(&self, rank: usize, in_place: bool) -> Option<usize> {
        let count = if in_place {
            self.shape.inplace_count
        } else {
            self.shape.out_count
        };
        (0..count).find(|&j| self.want(rank, j, in_place).is_some())
    }
}

/// The code step of a low-precision format relative to its block's absmax.
fn lp_step(f: Format) -> f64 {
    match f {
        Format::E4M3 => 2f64.powi(-3),
        Format::E5M2 => 2f64.powi(-2),
        Format::Int8 => 1.0 / 127.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checker(coll: Coll, dtype: DataType, world: usize, count: usize, op: ReduceOp) -> Checker {
        let shape = Shape::new(coll, count * dtype.size(), dtype, world).unwrap();
        Checker::new(shape, op, 0, 7, 11, None)
    }

    #[test]
    fn values_are_random_nonzero_and_round_trip() {
        for d in DataType::ALL {
            let mut seen = std::collections::HashSet::new();
            for i in 0..200 {
                let v = value(d, 1, 2, 3, i);
                let mut b = [0u8; 8];
                encode(d, v, &mut b);
                assert_eq!(decode(d, &b), v, "{d}");
                match v {
                    Value::Float(x) => assert!(x != 0.0 && x.is_finite()),
                    Value::Int(i) => assert!(i != 0),
                }
                seen.insert(format!("{v:?}"));
            }
            assert!(seen.len() > 5, "{d}: values should vary");
        }
        assert_ne!(
            value(DataType::F32, 1, 2, 0, 5),
            value(DataType::F32, 1, 2, 1, 5)
        );
    }

    #[test]
    fn integers_wrap_like_hardware() {
        assert_eq!(wrap(DataType::I8, 130), -126);
        assert_eq!(wrap(DataType::U8, -1), 255);
        assert_eq!(wrap(DataType::I64, i64::MAX as i128 + 1), i64::MIN as i128);
    }

    /// Computes an all_reduce output the way a backend would and checks it.
    fn reduce_like_backend(c: &Checker) -> Vec<u8> {
        let s = c.shape;
        let e = s.dtype.size();
        let mut out = vec![0u8; s.count * e];
        for j in 0..s.count {
            let v = match (c.input(0, j), s.dtype.is_float()) {
                (Value::Float(_), true) => {
                    // Accumulate in f32 in rank order, as the library does for narrow types.
                    let mut acc = 0f32;
                    for r in 0..s.world {
                        if let Value::Float(x) = c.input(r, j) {
                            acc += x as f32;
                        }
                    }
                    Value::Float(acc as f64)
                }
                _ => {
                    let mut acc = 0i128;
                    for r in 0..s.world {
                        if let Value::Int(x) = c.input(r, j) {
                            acc += x;
                        }
                    }
                    Value::Int(wrap(s.dtype, acc))
                }
            };
            encode(s.dtype, v, &mut out[j * e..(j + 1) * e]);
        }
        out
    }

    #[test]
    fn correct_sums_pass_and_wrong_ones_are_counted() {
        for d in [
            DataType::F32,
            DataType::BF16,
            DataType::F16,
            DataType::I32,
            DataType::U8,
        ] {
            let c = checker(Coll::AllReduce, d, 4, 257, ReduceOp::Sum);
            let mut out = reduce_like_backend(&c);
            assert_eq!(c.count_wrong(0, &out, false), 0, "{d}");
            let e = d.size();
            poison(d, &mut out[..e]);
            // Off by far more than the tolerance.
            let v = match decode(d, &out[5 * e..]) {
                Value::Float(x) => Value::Float(x + 0.5),
                Value::Int(i) => Value::Int(i + 1),
            };
            encode(d, v, &mut out[5 * e..6 * e]);
            assert_eq!(c.count_wrong(0, &out, false), 2, "{d}");
        }
    }

    #[test]
    fn poison_is_always_wrong() {
        let c = checker(Coll::AllGather, DataType::F32, 2, 64, ReduceOp::Sum);
        let mut out = vec![0u8; 64 * 4];
        poison(DataType::F32, &mut out);
        assert_eq!(c.count_wrong(1, &out, false), 64);
    }

    #[test]
    fn data_movement_layouts() {
        // all_to_all: rank 1's output part j comes from rank j's part 1.
        let c = checker(Coll::AllToAll, DataType::I64, 3, 6, ReduceOp::Sum);
        let mut out = vec![0u8; 6 * 8];
        for j in 0..6 {
            let v = c.input(j / 2, 2 + j % 2);
            encode(DataType::I64, v, &mut out[j * 8..]);
        }
        assert_eq!(c.count_wrong(1, &out, false), 0);
        assert_eq!(c.count_wrong(0, &out, false), 6);
        // reduce_scatter in place checks only the rank's own part.
        let c = checker(Coll::ReduceScatter, DataType::I32, 2, 8, ReduceOp::Max);
        let mut out = vec![0u8; 8 * 4];
        poison(DataType::I32, &mut out);
        for j in 4..8 {
            let m = (0..2)
                .map(|r| c.input(r, j))
                .fold(Value::Int(i128::MIN), |a, b| match (a, b) {
                    (Value::Int(a), Value::Int(b)) => Value::Int(a.max(b)),
                    _ => a,
                });
            encode(DataType::I32, m, &mut out[j * 4..]);
        }
        assert_eq!(c.count_wrong(1, &out, true), 0);
        assert_eq!(c.first_checked(1, true), Some(4));
        // reduce: only the root is checked.
        let c = checker(Coll::Reduce, DataType::F32, 2, 4, ReduceOp::Sum);
        assert_eq!(c.count_wrong(1, &[0xFF; 16], false), 0);
        assert_eq!(c.count_wrong(0, &[0xFF; 16], false), 4);
    }

    /// Buffers large enough to be checked and filled by several threads: every element lands
    /// where the sequential pass puts it, and wrong elements at the runs' edges are all counted.
    #[test]
    fn large_buffers_are_checked_and_filled_in_runs() {
        let part = 150_001; // odd: the runs split inside parts, not on their edges
        let c = checker(Coll::AllGather, DataType::F32, 2, 2 * part, ReduceOp::Sum);
        // Several runs wherever the machine has several threads (one otherwise).
        let hw = std::thread::available_parallelism().map_or(1, |p| p.get());
        assert_eq!(run_elems(2 * part).is_some(), hw > 1, "{hw} threads");
        assert!(workers(2 * part) >= 1);
        let input = c.input_bytes(1);
        for i in [0, 1, 65_535, 65_536, part - 1] {
            assert_eq!(
                decode(DataType::F32, &input[i * 4..]),
                c.input(1, i),
                "element {i}"
            );
        }
        let inplace = c.inplace_bytes(1);
        assert_eq!(&inplace[part * 4..], &input[..]);
        assert!(matches!(decode(DataType::F32, &inplace[..4]), Value::Float(x) if x.is_nan()));
        let mut out = vec![0u8; 2 * part * 4];
        for j in 0..2 * part {
            encode(
                DataType::F32,
                c.input(j / part, j % part),
                &mut out[j * 4..],
            );
        }
        assert_eq!(c.count_wrong(0, &out, false), 0);
        let bad = [0, 65_535, 65_536, part, 2 * part - 1];
        for j in bad {
            poison(DataType::F32, &mut out[j * 4..(j + 1) * 4]);
        }
        assert_eq!(c.count_wrong(0, &out, false), bad.len() as u64);
        // A reduction too: the sum of both ranks, one element off.
        let c = checker(Coll::AllReduce, DataType::F32, 2, 200_003, ReduceOp::Sum);
        let mut out = reduce_like_backend(&c);
        assert_eq!(c.count_wrong(1, &out, false), 0);
        poison(DataType::F32, &mut out[4 * 131_072..4 * 131_073]);
        assert_eq!(c.count_wrong(1, &out, false), 1);
    }

    #[test]
    fn all_to_all_v_layout() {
        use crate::bench::sizes::A2avCounts;
        let (world, count) = (3, 61);
        let c = checker(Coll::AllToAllV, DataType::I32, world, count, ReduceOp::Sum);
        for rank in 0..world {
            // Rank `rank`'s output as a backend builds it: the part from each sender s, taken
            // from where s's part for `rank` starts in s's input.
            let mine = A2avCounts::new(count, world, rank);
            let mut out = vec![0u8; count * 4];
            let mut j = 0;
            for s in 0..world {
                let theirs = A2avCounts::new(count, world, s);
                let start = A2avCounts::displ(&theirs.send, rank);
                assert_eq!(theirs.send[rank], mine.recv[s]);
                for o in 0..mine.recv[s] {
                    encode(DataType::I32, c.input(s, start + o), &mut out[j * 4..]);
                    j += 1;
                }
            }
            assert_eq!(c.count_wrong(rank, &out, false), 0, "rank {rank}");
            // Parts in the wrong order are wrong.
            let other = (rank + 1) % world;
            assert!(c.count_wrong(other, &out, false) > 0);
        }
    }

    #[test]
    fn inplace_buffers_hold_the_input_where_it_is_read() {
        let c = checker(Coll::AllGather, DataType::F32, 2, 4, ReduceOp::Sum);
        let b = c.inplace_bytes(1);
        assert_eq!(decode(DataType::F32, &b[8..]), c.input(1, 0));
        assert!(matches!(decode(DataType::F32, &b[..4]), Value::Float(x) if x.is_nan()));
    }
}
