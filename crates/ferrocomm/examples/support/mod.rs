//! What the device check programs (`gpu_check`, `gpu_check_coll`, `gpu_check_lowp`,
//! `gpu_check_norm`, `gpu_check_nccl`) share: raw device buffers with a poisoned guard band and
//! its read-back, stream and sync helpers, the check of one reduced element against the
//! library's reference and a hash. Each program uses a part of it.
#![allow(dead_code)]

use cudarc::driver::sys;
use ferrocomm::{reference, CommOptions, Communicator, Config, DataType, ReduceOp};

pub type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// A communicator of its own named `name` with settings `cfg` (a smaller staging, another block
/// size, a short timeout: whatever a group of cases needs).
pub fn comm_with(name: &str, cfg: Config) -> Res<Communicator> {
    Ok(Communicator::new(options(name, cfg))?)
}

/// The options every check program creates its communicators with: `name`, `cfg`, and under
/// `--share-gpus` the device and settings of [`shared_gpus`].
pub fn options(name: &str, mut cfg: Config) -> CommOptions {
    let mut o = CommOptions::new(name);
    if shared_gpus() {
        let local = cfg.launch.local_rank.or(cfg.launch.rank).unwrap_or(0);
        let gpus = ferrocomm::cuda::gpu_count().max(1);
        o.device = Some(ferrocomm::Device::Cuda((local % gpus) as u32));
        // NCCL refuses two ranks on one GPU ("Duplicate GPU detected"): without it the
        // backend runs every collective through direct access or refuses it.
        cfg.nccl_lib = Some(NO_NCCL.into());
    }
    o.config = Some(cfg);
    o
}

/// The library path `--share-gpus` gives NCCL: none loads, so the backend runs without it.
pub const NO_NCCL: &str = "(no NCCL: ranks share GPUs)";

static SHARED_GPUS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// Whether `--share-gpus` was given: local rank r runs on GPU r mod (GPUs of the host), so a
/// world larger than the machine's GPU count runs the n-rank kernels (two or more processes
/// per GPU take turns on it: correctness only, no timing), without NCCL.
pub fn shared_gpus() -> bool {
    *SHARED_GPUS.get_or_init(|| false)
}

/// The program's flags, each one of `known` or `--share-gpus` (every program takes it, see
/// [`shared_gpus`]). Unknown ones are refused rather than ignored: a mistyped flag must not run
/// the full suite where a short one was meant (under compute-sanitizer that would run past its
/// limit).
pub fn flags(known: &[&str]) -> Res<Vec<String>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(a) = args
        .iter()
        .find(|a| !known.contains(&a.as_str()) && *a != "--share-gpus")
    {
        return Err(format!(
            "unknown argument {a:?} (flags: {}, --share-gpus)",
            known.join(", ")
        )
        .into());
    }
    let _ = SHARED_GPUS.set(args.iter().any(|a| a == "--share-gpus"));
    Ok(args)
}

/// Runs a check program's body and exits with its code (2 and the message on an error).
pub fn run_main(name: &str, body: fn() -> Res<i32>) -> ! {
    match body() {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("{name}: {e}");
            std::process::exit(2);
        }
    }
}

pub fn cu(r: sys::CUresult, what: &str) -> Res<()> {
    r.result().map_err(|e| format!("{what}: {e:?}").into())
}

/// Bytes after every buffer's `bytes`, poisoned with the rest, to catch writes past the end.
pub const GUARD: usize = 64;
pub const POISON: u8 = 0xA7;

/// A device buffer (cuMemAlloc) with a guard band after `bytes`.
pub struct Buf {
    pub ptr: u64,
    pub bytes: usize,
}

impl Buf {
    /// Bytes allocated: `bytes`, the guard band, and room for a 16-byte misalignment.
    fn alloc_bytes(&self) -> usize {
        self.bytes + GUARD + 16
    }

    pub fn new(bytes: usize) -> Res<Buf> {
        let mut p = 0u64;
        cu(
            // SAFETY: out-parameter; the context is current.
            unsafe { sys::cuMemAlloc_v2(&mut p, bytes + GUARD + 16) },
            "cuMemAlloc",
        )?;
        Ok(Buf { ptr: p, bytes })
    }

    /// Copies `data` in and waits until it has landed: a copy from pageable memory may return
    /// before its DMA is done, and neither it nor a memset is ordered with the non-blocking
    /// streams some checks run on.
    pub fn upload(&self, off: usize, data: &[u8]) -> Res<()> {
        assert!(off + data.len() <= self.alloc_bytes());
        cu(
            // SAFETY: in bounds (asserted).
            unsafe {
                sys::cuMemcpyHtoD_v2(self.ptr + off as u64, data.as_ptr().cast(), data.len())
            },
            "cuMemcpyHtoD",
        )?;
        sync()
    }

    pub fn download_into(&self, off: usize, out: &mut [u8]) -> Res<()> {
        assert!(off + out.len() <= self.alloc_bytes());
        cu(
            // SAFETY: in bounds (asserted).
            unsafe {
                sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), self.ptr + off as u64, out.len())
            },
            "cuMemcpyDtoH",
        )
    }

    pub fn download(&self, off: usize, len: usize) -> Res<Vec<u8>> {
        let mut out = vec![0u8; len];
        self.download_into(off, &mut out)?;
        Ok(out)
    }

    /// Bytes outside the output `[off, off + len)` that no longer hold [`POISON`]: the room
    /// before it and everything after it to the end of the allocation (the rest of the buffer
    /// and the guard band). Each is a write outside the output, a failure of the call that wrote
    /// it; the buffer is poisoned ([`Buf::poison`]) before the call, its input (in place)
    /// uploaded inside the output.
    pub fn guard_hits(&self, off: usize, len: usize) -> Res<usize> {
        let end = off
            .checked_add(len)
            .filter(|&e| e <= self.alloc_bytes())
            .ok_or_else(|| {
                format!(
                    "guard_hits: output [{off}, +{len}) beyond the allocation of {} bytes",
                    self.alloc_bytes()
                )
            })?;
        // (A copy of no bytes is left out rather than asked of the driver.)
        let before = if off == 0 {
            Vec::new()
        } else {
            self.download(0, off)?
        };
        let after = self.download(end, self.alloc_bytes() - end)?;
        Ok(before
            .iter()
            .chain(&after)
            .filter(|&&b| b != POISON)
            .count())
    }

    /// The negative control of [`Buf::guard_hits`], run by every program before its cases: a
    /// byte written just before an output, just after it and at the end of the guard band are
    /// each seen, and nothing else.
    pub fn guard_self_check() -> Res<()> {
        let b = Buf::new(100)?;
        b.poison()?;
        let clean = b.guard_hits(4, 90)?;
        for at in [3usize, 94, b.alloc_bytes() - 1] {
            cu(
                // SAFETY: one byte inside the allocation.
                unsafe { sys::cuMemsetD8_v2(b.ptr + at as u64, 0, 1) },
                "cuMemsetD8",
            )?;
        }
        sync()?;
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
        cu(
            // SAFETY: the whole allocation.
            unsafe { sys::cuMemsetD8_v2(self.ptr, POISON, self.alloc_bytes()) },
            "cuMemsetD8",
        )?;
        sync()
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: allocated once in `new`.
        unsafe { sys::cuMemFree_v2(self.ptr) };
    }
}

pub fn sync() -> Res<()> {
    // SAFETY: plain context synchronisation.
    cu(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")
}

/// A non-blocking stream of the current context, as an integer for `CallOpts::stream`.
pub fn new_stream() -> Res<u64> {
    let mut s: sys::CUstream = std::ptr::null_mut();
    // SAFETY: out-parameter.
    cu(unsafe { sys::cuStreamCreate(&mut s, 1) }, "cuStreamCreate")?;
    Ok(s as u64)
}

/// FNV-1a of a result, compared across ranks to prove they agree bit for bit.
pub fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf29ce484222325u64, |h, x| {
        (h ^ *x as u64).wrapping_mul(0x100000001b3)
    })
}

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
