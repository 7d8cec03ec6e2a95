//! The device cases: checks of the collectives written once and run on every device. Each body
//! takes a [`Ctx`] (a communicator, its device, the sizes to run at) and records what it found
//! in the context's tally: random data (never zeros), outputs and the guard band past them
//! poisoned before every call and read back after it, results compared with
//! [`ferrocomm::reference`] (bytes for data movement, f64 / exact integers for reductions).
//!
//! The host backend runs every body in CI (`tests/device_cases.rs`, ranks as threads, buffers
//! in host memory); the GPU check programs (`examples/gpu_check*.rs`) run the same bodies on
//! CUDA buffers and keep only what a GPU alone can check (graph capture, races, the
//! sanitizer's cases, faults found on the device). Both include this module by path (an
//! example and an integration test cannot import each other).
#![allow(dead_code)]

pub mod all_reduce;
pub mod coll;
pub mod disagreeing;
pub mod lowp;
pub mod norm;
pub mod one_rank;

use std::collections::BTreeMap;

use cudarc::driver::sys;
use ferrocomm::bootstrap::all_gather_bytes;
use ferrocomm::{
    reference, Algo, CallOpts, Communicator, Config, DataType, Device, Input, ReduceOp,
};
use ferrocomm::{View, ViewMut};
use rand::{Rng, SeedableRng};

pub type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// One body: a family of cases run on the context's communicator.
pub type Body = fn(&mut Ctx) -> Res<()>;

pub fn cu(r: sys::CUresult, what: &str) -> Res<()> {
    r.result().map_err(|e| format!("{what}: {e:?}").into())
}

/// Synchronises the current CUDA context (the check programs' buffers and streams).
pub fn sync() -> Res<()> {
    // SAFETY: plain context synchronisation.
    cu(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")
}

// ---------------------------------------------------------------- buffers

/// Bytes after every buffer's `bytes`, poisoned with the rest, to catch writes past the end.
pub const GUARD: usize = 64;
pub const POISON: u8 = 0xA7;

/// A buffer of `bytes` with a guard band after it, in host memory or on the current CUDA
/// context (cuMemAlloc); every access goes through its methods, which copy as the device needs.
pub struct Buf {
    pub ptr: u64,
    pub bytes: usize,
    /// The host allocation (8-byte words: aligned for every dtype); `None` on CUDA.
    host: Option<*mut [u64]>,
}

impl Buf {
    /// Bytes allocated: `bytes`, the guard band, and room for a 16-byte misalignment.
    fn alloc_bytes(&self) -> usize {
        self.bytes + GUARD + 16
    }

    /// A buffer of the current CUDA context.
    pub fn new(bytes: usize) -> Res<Buf> {
        Buf::on(Device::Cuda(0), bytes)
    }

    /// A buffer of `dev`: host memory, or the current CUDA context's (that of the GPU `dev`).
    pub fn on(dev: Device, bytes: usize) -> Res<Buf> {
        let total = bytes + GUARD + 16;
        if dev == Device::Host {
            let words: Box<[u64]> = vec![0u64; total.div_ceil(8)].into_boxed_slice();
            let host = Box::into_raw(words);
            return Ok(Buf {
                ptr: host as *mut u64 as u64,
                bytes,
                host: Some(host),
            });
        }
        let mut p = 0u64;
        cu(
            // SAFETY: out-parameter; the context is current.
            unsafe { sys::cuMemAlloc_v2(&mut p, total) },
            "cuMemAlloc",
        )?;
        Ok(Buf {
            ptr: p,
            bytes,
            host: None,
        })
    }

    pub fn device(&self, ord: u32) -> Device {
        if self.host.is_some() {
            Device::Host
        } else {
            Device::Cuda(ord)
        }
    }

    fn check(&self, off: usize, len: usize) -> Res<()> {
        match off.checked_add(len) {
            Some(end) if end <= self.alloc_bytes() => Ok(()),
            _ => Err(format!(
                "[{off}, +{len}) beyond the allocation of {} bytes",
                self.alloc_bytes()
            )
            .into()),
        }
    }

    /// Copies `data` in and waits until it has landed: a copy from pageable memory may return
    /// before its DMA is done, and neither it nor a memset is ordered with the non-blocking
    /// streams some checks run on.
    pub fn upload(&self, off: usize, data: &[u8]) -> Res<()> {
        self.check(off, data.len())?;
        if self.host.is_some() {
            // SAFETY: in bounds (checked); nothing else accesses the buffer meanwhile.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    data.as_ptr(),
                    (self.ptr as *mut u8).add(off),
                    data.len(),
                )
            };
            return Ok(());
        }
        cu(
            // SAFETY: in bounds (checked).
            unsafe {
                sys::cuMemcpyHtoD_v2(self.ptr + off as u64, data.as_ptr().cast(), data.len())
            },
            "cuMemcpyHtoD",
        )?;
        sync()
    }

    pub fn download_into(&self, off: usize, out: &mut [u8]) -> Res<()> {
        self.check(off, out.len())?;
        if self.host.is_some() {
            // SAFETY: in bounds (checked).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (self.ptr as *const u8).add(off),
                    out.as_mut_ptr(),
                    out.len(),
                )
            };
            return Ok(());
        }
        cu(
            // SAFETY: in bounds (checked).
            unsafe {
                sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), self.ptr + off as u64, out.len())
            },
            "cuMemcpyDtoH",
        )
    }

    pub fn download(&self, off: usize, len: usize) -> Res<Vec<u8>> {
        let mut out = vec![0u8; len];
        if len > 0 {
            self.download_into(off, &mut out)?;
        }
        Ok(out)
    }

    /// Bytes outside the output `[off, off + len)` that no longer hold [`POISON`]: the room
    /// before it and everything after it to the end of the allocation (the rest of the buffer
    /// and the guard band). Each is a write outside the output, a failure of the call that wrote
    /// it; the buffer is poisoned ([`Buf::poison`]) before the call, its input (in place)
    /// uploaded inside the output.
    pub fn guard_hits(&self, off: usize, len: usize) -> Res<usize> {
        self.check(off, len)?;
        let end = off + len;
        let before = self.download(0, off)?;
        let after = self.download(end, self.alloc_bytes() - end)?;
        Ok(before
            .iter()
            .chain(&after)
            .filter(|&&b| b != POISON)
            .count())
    }

    /// The negative control of [`Buf::guard_hits`], run before the cases: a byte written just
    /// before an output, just after it and at the end of the guard band are each seen, and
    /// nothing else.
    pub fn guard_self_check(dev: Device) -> Res<()> {
        let b = Buf::on(dev, 100)?;
        b.poison()?;
        let clean = b.guard_hits(4, 90)?;
        for at in [3usize, 94, b.alloc_bytes() - 1] {
            b.upload(at, &[0])?;
        }
        let hits = b.guard_hits(4, 90)?;
        if clean != 0 || hits != 3 {
            return Err(format!(
                "the guard band read-back is broken: {clean} bytes hit when none were written, \
                 {hits} when 3 were"
            )
            .into());
        }
        Ok(())
    }

    /// Fills the whole allocation, guard band included, with [`POISON`].
    pub fn poison(&self) -> Res<()> {
        if self.host.is_some() {
            // SAFETY: the whole allocation.
            unsafe { std::ptr::write_bytes(self.ptr as *mut u8, POISON, self.alloc_bytes()) };
            return Ok(());
        }
        cu(
            // SAFETY: the whole allocation.
            unsafe { sys::cuMemsetD8_v2(self.ptr, POISON, self.alloc_bytes()) },
            "cuMemsetD8",
        )?;
        sync()
    }

    /// A view of `count` elements of `dtype` from byte `off` on `dev`.
    ///
    /// # Safety
    /// The buffer must be of `dev` (see [`Buf::on`]), outlive the view's use and hold `off` +
    /// `count` elements; the caller synchronises before reading it back.
    pub unsafe fn view(&self, off: usize, count: usize, dtype: DataType, dev: Device) -> View<'_> {
        debug_assert!(off + count * dtype.size() <= self.alloc_bytes());
        // SAFETY: as the caller promises.
        unsafe { View::from_raw((self.ptr + off as u64) as *const u8, count, dtype, dev) }
    }

    /// A mutable view, as [`Buf::view`].
    ///
    /// # Safety
    /// As for [`Buf::view`]; nothing else writes the range while the view is in use.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn view_mut(
        &self,
        off: usize,
        count: usize,
        dtype: DataType,
        dev: Device,
    ) -> ViewMut<'_> {
        debug_assert!(off + count * dtype.size() <= self.alloc_bytes());
        // SAFETY: as the caller promises.
        unsafe { ViewMut::from_raw((self.ptr + off as u64) as *mut u8, count, dtype, dev) }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        match self.host {
            // SAFETY: made by Box::into_raw in `on`, freed once.
            Some(h) => drop(unsafe { Box::from_raw(h) }),
            // SAFETY: allocated once in `on`.
            None => unsafe {
                sys::cuMemFree_v2(self.ptr);
            },
        }
    }
}

// ---------------------------------------------------------------- data and references

/// Random element bytes of `rank` for case `seed` (every rank can compute every rank's data):
/// floats of magnitude 0.05..1 (0.5..1.5 for a product), integers 1..1000 of either sign (1..3
/// for a product), any nonzero byte for the byte types.
pub fn gen(dtype: DataType, count: usize, seed: u64, rank: usize, prod: bool) -> Vec<u8> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed.wrapping_mul(1_000_003) + rank as u64);
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

/// Large byte inputs are cheaper as a keyed pattern than as RNG output (no zero byte).
pub fn gen_bytes_fast(bytes: usize, seed: u64, rank: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (rank as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
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

/// The dtypes every reduction is checked on.
pub const REDUCE_TYPES: [DataType; 7] = [
    DataType::F32,
    DataType::F16,
    DataType::BF16,
    DataType::I32,
    DataType::U32,
    DataType::I64,
    DataType::U64,
];

/// A reduction operator as the checks name it (PremulSum with the factor 0.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum OpK {
    Sum,
    Avg,
    Prod,
    Min,
    Max,
    PremulSum,
}

impl OpK {
    pub fn op(self) -> ReduceOp {
        match self {
            OpK::Sum => ReduceOp::Sum,
            OpK::Avg => ReduceOp::Avg,
            OpK::Prod => ReduceOp::Prod,
            OpK::Min => ReduceOp::Min,
            OpK::Max => ReduceOp::Max,
            OpK::PremulSum => ReduceOp::PremulSum(0.5),
        }
    }

    /// The operators of `d`: all six on floats, all but PremulSum on integers.
    pub fn all_for(d: DataType) -> &'static [OpK] {
        const ALL: [OpK; 6] = [
            OpK::Sum,
            OpK::Avg,
            OpK::Prod,
            OpK::Min,
            OpK::Max,
            OpK::PremulSum,
        ];
        if d.is_float() {
            &ALL
        } else {
            &ALL[..5]
        }
    }
}

/// Whether `got` is the reduction by `op` of the `n` ranks' elements `el(0..n)` (element bytes
/// of `dtype`), by the library's reference ([`ferrocomm::reference::expected`]): floats against
/// the f64 result within the dtype's rounding (relative to the sum of magnitudes), integers
/// exactly with the dtype's wrap-around.
pub fn element_ok<'a>(
    dtype: DataType,
    op: OpK,
    n: usize,
    el: impl Fn(usize) -> &'a [u8],
    got: &[u8],
) -> bool {
    let xs: Vec<reference::Value> = (0..n).map(|r| reference::decode(dtype, el(r))).collect();
    let (want, scale) = reference::expected(dtype, op.op(), &xs);
    let rel = match dtype {
        DataType::F32 => 2e-6,
        DataType::F16 => 1.5e-3,
        _ => 1e-2,
    };
    reference::within(reference::decode(dtype, got), want, scale, rel)
}

/// Wrong elements of `got`, the reduction by `op` of `parts` (one slice per rank), and a
/// description of the first.
pub fn check_reduce(dtype: DataType, op: OpK, parts: &[&[u8]], got: &[u8]) -> (usize, String) {
    let es = dtype.size();
    let mut wrong = 0;
    let mut first = String::new();
    for i in 0..got.len() / es {
        let el = |r: usize| &parts[r][i * es..(i + 1) * es];
        let g = &got[i * es..(i + 1) * es];
        if !element_ok(dtype, op, parts.len(), el, g) {
            if wrong == 0 {
                first = format!("element {i}: got {g:?}");
            }
            wrong += 1;
        }
    }
    (wrong, first)
}

/// Elements (of `es` bytes) that differ between `want` and `got`.
pub fn diff_bytes(want: &[u8], got: &[u8], es: usize) -> usize {
    want.chunks(es.max(1))
        .zip(got.chunks(es.max(1)))
        .filter(|(a, b)| a != b)
        .count()
}

/// FNV-1a of a result, compared across ranks to prove they agree bit for bit.
pub fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf29ce484222325u64, |h, x| {
        (h ^ *x as u64).wrapping_mul(0x100000001b3)
    })
}

/// Bytes of `got` that are not [`POISON`] (an output that must stay unwritten).
pub fn written(got: &[u8]) -> usize {
    got.iter().filter(|&&b| b != POISON).count()
}

// ---------------------------------------------------------------- context and tally

/// What one family of cases found (a row of the summary).
#[derive(Default)]
pub struct Tally {
    pub cases: usize,
    pub wrong: usize,
    /// Bytes written outside an output (before it, after it, in the guard band).
    pub guard: usize,
    /// Results that were not bit-identical on every rank.
    pub mismatch: usize,
    pub errors: usize,
    /// Calls refused by design (a forced algorithm above its capacity), not counted as cases.
    pub refusals: usize,
}

/// Makes a communicator of the same ranks named `name` with settings `cfg` (every rank makes
/// it, in the same order).
pub type NewComm = Box<dyn Fn(&str, Config) -> Res<Communicator>>;

/// What a body runs on: the communicator, its device, the settings it was made with, how
/// large to run, and the tally the body adds to.
pub struct Ctx {
    pub comm: Communicator,
    pub rank: usize,
    pub world: usize,
    pub dev: Device,
    pub cfg: Config,
    /// Fewer sizes and rounds (`--quick`).
    pub quick: bool,
    /// The all-reduce algorithms to run (the device's; a program may leave one out).
    pub algos: Vec<Algo>,
    pub new_comm: NewComm,
    /// Exchanges of result hashes so far (a key of their own for each).
    seq: u64,
    /// Hashes of results not yet compared across ranks: (tally key, case, hash).
    hashes: Vec<(String, String, u64)>,
    pub tally: BTreeMap<String, Tally>,
    pub failures: Vec<String>,
}

impl Ctx {
    pub fn new(comm: Communicator, cfg: Config, quick: bool, new_comm: NewComm) -> Ctx {
        let algos = if comm.device() == Device::Host {
            vec![Algo::Flat, Algo::Tree, Algo::Auto]
        } else {
            vec![Algo::Push, Algo::Flat, Algo::Tree, Algo::Nccl, Algo::Auto]
        };
        Ctx {
            algos,
            seq: 0,
            hashes: Vec::new(),
            rank: comm.rank(),
            world: comm.size(),
            dev: comm.device(),
            comm,
            cfg,
            quick,
            new_comm,
            tally: BTreeMap::new(),
            failures: Vec::new(),
        }
    }

    /// Whether the cases run on host memory (the host backend: smaller sizes, same code).
    pub fn host(&self) -> bool {
        self.dev == Device::Host
    }

    /// `host` on the host backend, `gpu` on a GPU.
    pub fn pick<T>(&self, host: T, gpu: T) -> T {
        if self.host() {
            host
        } else {
            gpu
        }
    }

    /// A buffer of this context's device.
    pub fn buf(&self, bytes: usize) -> Res<Buf> {
        Buf::on(self.dev, bytes)
    }

    /// Waits for the work of this rank's calls (a no-op on the host, whose calls return done).
    pub fn sync(&self) -> Res<()> {
        if self.host() {
            Ok(())
        } else {
            sync()
        }
    }

    /// Runs `f` with a communicator of the same ranks made with `cfg` in place of this one.
    pub fn with_comm<T>(
        &mut self,
        name: &str,
        cfg: Config,
        f: impl FnOnce(&mut Ctx) -> Res<T>,
    ) -> Res<T> {
        let comm = (self.new_comm)(name, cfg)?;
        let main = std::mem::replace(&mut self.comm, comm);
        let r = f(self);
        self.comm = main;
        r
    }

    /// Records one call: its result, its wrong elements and the bytes it wrote outside its
    /// output, under `key`; a failure is described by `what`.
    pub fn record(
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

    /// Records a check of one expected outcome (an error reported, a call working) under `key`.
    pub fn expect(&mut self, key: &str, ok: bool, what: impl FnOnce() -> String) {
        let t = self.tally.entry(key.to_string()).or_default();
        t.cases += 1;
        if !ok {
            t.errors += 1;
            self.failures.push(what());
        }
    }

    /// A small in-place all-gather, the call that follows a fault: it reports what the
    /// kernels found on the device in the call before.
    pub fn next_call(&self) -> Res<ferrocomm::Result<()>> {
        let b = self.buf(64)?;
        // SAFETY: 2 * world f32 fit the 64 bytes (+ guard) of this device's buffer, alive until
        // after the sync.
        let r = unsafe {
            self.comm.all_gather(
                Input::InPlace,
                b.view_mut(0, 2 * self.world.min(8), DataType::F32, self.dev),
                &CallOpts::default(),
            )
        };
        self.sync()?;
        Ok(r)
    }

    /// A fault of the call `r` that the backend must report naming `needle`: the host backend
    /// from the call itself (it sees the counts before it moves anything), the CUDA kernels,
    /// which find it on the device, from the next call; the call after that works. Returns the
    /// call's result as far as its data goes (Ok where the fault was reported as it must be).
    pub fn reported(
        &mut self,
        what: &str,
        r: ferrocomm::Result<()>,
        needle: &str,
    ) -> Res<ferrocomm::Result<()>> {
        let shows =
            |r: &ferrocomm::Result<()>| matches!(r, Err(e) if e.to_string().contains(needle));
        let (r, first) = if self.host() {
            let ok = shows(&r);
            (if ok { Ok(()) } else { r }, ok)
        } else {
            let next = self.next_call()?;
            let ok = shows(&next);
            if ok && self.rank == 0 {
                println!("{what} reported: {}", next.as_ref().unwrap_err());
            }
            (r, ok)
        };
        let after = self.next_call()?;
        let ok = first && after.is_ok();
        self.expect("bad_input", ok, || {
            format!("{what}: expected an error naming {needle:?}, then a working call (after: {after:?})")
        });
        Ok(r)
    }

    /// Keeps the hash of a result of case `what` (tally `key`) for [`Ctx::compare_hashes`].
    pub fn hash(&mut self, key: &str, what: String, got: &[u8]) {
        self.hashes.push((key.to_string(), what, fnv(got)));
    }

    /// Compares the results hashed since the last comparison with every rank's (one exchange
    /// through the store): each that differs is a failure of its case.
    pub fn compare_hashes(&mut self) -> Res<()> {
        self.seq += 1;
        let mine: Vec<u8> = self.hashes.iter().flat_map(|h| h.2.to_le_bytes()).collect();
        let all = all_gather_bytes(
            &**self.comm.store(),
            &format!("cases/hash/{}", self.seq),
            self.rank,
            self.world,
            &mine,
            std::time::Duration::from_secs(120),
        )?;
        for (k, (key, what, _)) in std::mem::take(&mut self.hashes).into_iter().enumerate() {
            let at = k * 8..(k + 1) * 8;
            if all
                .iter()
                .any(|v| v.get(at.clone()) != Some(&mine[at.clone()]))
            {
                self.tally.entry(key).or_default().mismatch += 1;
                self.failures
                    .push(format!("{what}: the result differs between ranks"));
            }
        }
        Ok(())
    }

    /// Whether any case failed on this rank.
    pub fn failed(&self) -> bool {
        self.tally
            .values()
            .any(|t| t.wrong + t.guard + t.mismatch + t.errors > 0)
            || !self.failures.is_empty()
    }
}
