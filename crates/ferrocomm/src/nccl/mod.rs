//! NCCL, loaded dynamically: the fallback for what direct access does not win, and the baseline.
//!
//! [`Nccl`] is one NCCL communicator with a method per collective on raw device pointers;
//! [`new_backend`] wraps it as a [`Backend`] of its own (backend name `nccl`), and the cuda
//! backend holds one underneath its direct-access paths.

mod sys;

use std::ffi::{c_int, c_void, CStr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::CudaContext;

use crate::comm::{Backend, CallOpts, CommContext, Splits};
use crate::config::Config;
use crate::cuda::cu;
use crate::error::{Error, Result};
use crate::select::{self, Algo, Capabilities, Collective};
use crate::types::{DataType, ReduceOp};
use crate::view::{Input, View, ViewMut};

/// The libnccl files we try, in order.
fn candidates(cfg: &Config) -> Vec<PathBuf> {
    let mut c = Vec::new();
    if let Some(p) = &cfg.nccl_lib {
        c.push(p.clone());
        return c;
    }
    c.push(PathBuf::from("libnccl.so.2"));
    c.push(PathBuf::from("libnccl.so"));
    for d in crate::cuda::libs::python_lib_dirs(cfg, &["nccl/lib"]) {
        c.push(d.join("libnccl.so.2"));
    }
    c
}

static LIB: OnceLock<std::result::Result<sys::Lib, String>> = OnceLock::new();

fn lib(cfg: &Config) -> Result<&'static sys::Lib> {
    LIB.get_or_init(|| {
        let mut tried = Vec::new();
        for p in candidates(cfg) {
            // SAFETY: every candidate is a libnccl by name; loading runs its initialisers.
            match unsafe { sys::Lib::load(&p) } {
                Ok(l) => return Ok(l),
                Err(e) => tried.push(format!("{}: {e}", p.display())),
            }
        }
        Err(tried.join("; "))
    })
    .as_ref()
    .map_err(|why| Error::LibraryMissing {
        library: "libnccl",
        why: format!("set FERROCOMM_NCCL_LIB to a libnccl.so.2 ({why})"),
    })
}

/// The libnccl that would be used, and its version (`2.28.3`), for `ferrocomm info`.
pub fn probe(cfg: &Config) -> Result<(PathBuf, String)> {
    let l = lib(cfg)?;
    let mut v: c_int = 0;
    check(
        l,
        // SAFETY: out-parameter.
        unsafe { (l.ncclGetVersion)(&mut v) },
        "ncclGetVersion",
        None,
    )?;
    let (major, minor, patch) = if v >= 10000 {
        (v / 10000, (v % 10000) / 100, v % 100)
    } else {
        (v / 1000, (v % 1000) / 100, v % 100)
    };
    Ok((l.path.clone(), format!("{major}.{minor}.{patch}")))
}

fn check(l: &sys::Lib, r: sys::NcclResult, what: &str, comm: Option<sys::NcclComm>) -> Result<()> {
    if r == sys::SUCCESS {
        return Ok(());
    }
    // SAFETY: NCCL returns static C strings (or NULL).
    let s = unsafe { (l.ncclGetErrorString)(r) };
    let mut msg = if s.is_null() {
        format!("{what}: error {r}")
    } else {
        // SAFETY: non-null C string owned by NCCL.
        format!("{what}: {}", unsafe { CStr::from_ptr(s) }.to_string_lossy())
    };
    if let Some(c) = comm {
        // SAFETY: live communicator; NCCL keeps the string.
        let last = unsafe { (l.ncclGetLastError)(c) };
        if !last.is_null() {
            // SAFETY: non-null C string owned by NCCL.
            let t = unsafe { CStr::from_ptr(last) }.to_string_lossy();
            if !t.is_empty() {
                msg.push_str(&format!(" ({t})"));
            }
        }
    }
    Err(Error::Nccl(msg))
}

/// NCCL's code for a dtype.
fn nccl_dtype(d: DataType) -> c_int {
    match d {
        DataType::I8 => 0,
        DataType::U8 => 1,
        DataType::I32 => 2,
        DataType::U32 => 3,
        DataType::I64 => 4,
        DataType::U64 => 5,
        DataType::F16 => 6,
        DataType::F32 => 7,
        DataType::F64 => 8,
        DataType::BF16 => 9,
        DataType::F8E4M3 => 10,
        DataType::F8E5M2 => 11,
    }
}

/// One NCCL communicator.
pub struct Nccl {
    lib: &'static sys::Lib,
    comm: sys::NcclComm,
}

// SAFETY: an NCCL communicator may be used from any thread; the owners serialise calls.
unsafe impl Send for Nccl {}
// SAFETY: as above.
unsafe impl Sync for Nccl {}

/// A reduction operator as NCCL takes it; PremulSum ops are created per call and destroyed.
struct Op<'a> {
    nccl: &'a Nccl,
    op: c_int,
    created: bool,
}

impl Drop for Op<'_> {
    fn drop(&mut self) {
        if self.created {
            // SAFETY: an op created on this communicator; destroying after enqueue is allowed.
            unsafe { (self.nccl.lib.ncclRedOpDestroy)(self.op, self.nccl.comm) };
        }
    }
}

impl Nccl {
    /// Joins the NCCL communicator of `ctx` (rank 0 publishes the unique id through the store).
    /// The device's context must be current on this thread.
    pub fn new(ctx: &CommContext) -> Result<Nccl> {
        let l = lib(&ctx.config)?;
        crate::config::apply_nccl_env_defaults();
        let key = "nccl/unique_id";
        let mut id = sys::UniqueId { internal: [0; 128] };
        if ctx.rank == 0 {
            check(
                l,
                // SAFETY: out-parameter.
                unsafe { (l.ncclGetUniqueId)(&mut id) },
                "ncclGetUniqueId",
                None,
            )?;
            ctx.store.set(key, &id.internal)?;
        } else {
            let v = ctx.store.get(key, ctx.timeout())?;
            if v.len() != 128 {
                return Err(Error::Nccl(format!(
                    "the unique id from rank 0 has {} bytes, expected 128",
                    v.len()
                )));
            }
            id.internal.copy_from_slice(&v);
        }
        let mut comm: sys::NcclComm = std::ptr::null_mut();
        // SAFETY: out-parameter; blocks until all ranks joined.
        let r =
            unsafe { (l.ncclCommInitRank)(&mut comm, ctx.size as c_int, id, ctx.rank as c_int) };
        check(
            l,
            r,
            &format!("ncclCommInitRank (rank {} of {})", ctx.rank, ctx.size),
            None,
        )?;
        Ok(Nccl { lib: l, comm })
    }

    fn ok(&self, r: sys::NcclResult, what: &str) -> Result<()> {
        check(self.lib, r, what, Some(self.comm))
    }

    fn op(&self, op: ReduceOp, dtype: DataType, collective: &'static str) -> Result<Op<'_>> {
        let code = match op {
            ReduceOp::Sum => 0,
            ReduceOp::Prod => 1,
            ReduceOp::Max => 2,
            ReduceOp::Min => 3,
            ReduceOp::Avg => 4,
            ReduceOp::PremulSum(s) => {
                let mut scalar = [0u8; 8];
                match dtype {
                    DataType::F64 => scalar.copy_from_slice(&s.to_le_bytes()),
                    DataType::F32 => scalar[..4].copy_from_slice(&(s as f32).to_le_bytes()),
                    DataType::F16 => {
                        scalar[..2].copy_from_slice(&half::f16::from_f64(s).to_le_bytes())
                    }
                    DataType::BF16 => {
                        scalar[..2].copy_from_slice(&half::bf16::from_f64(s).to_le_bytes())
                    }
                    DataType::F8E4M3 => scalar[0] = float8::F8E4M3::from_f64(s).to_bits(),
                    DataType::F8E5M2 => scalar[0] = float8::F8E5M2::from_f64(s).to_bits(),
                    _ => {
                        return Err(Error::UnsupportedOp {
                            collective,
                            op,
                            dtype,
                        })
                    }
                }
                let mut out: c_int = 0;
                // SAFETY: the scalar is read immediately (host-immediate residence).
                let r = unsafe {
                    (self.lib.ncclRedOpCreatePreMulSum)(
                        &mut out,
                        scalar.as_mut_ptr().cast(),
                        nccl_dtype(dtype),
                        sys::SCALAR_HOST_IMMEDIATE,
                        self.comm,
                    )
                };
                self.ok(r, "ncclRedOpCreatePreMulSum")?;
                return Ok(Op {
                    nccl: self,
                    op: out,
                    created: true,
                });
            }
            other => {
                return Err(Error::Unsupported {
                    collective,
                    backend: "nccl",
                    what: format!("reduce op {other}"),
                })
            }
        };
        Ok(Op {
            nccl: self,
            op: code,
            created: false,
        })
    }

    fn stream(s: u64) -> sys::CuStream {
        s as sys::CuStream
    }

    pub fn all_reduce(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: u64,
    ) -> Result<()> {
        let o = self.op(op, dtype, "all_reduce")?;
        // SAFETY: device pointers of `count` elements validated by the caller.
        let r = unsafe {
            (self.lib.ncclAllReduce)(
                send as *const c_void,
                recv as *mut c_void,
                count,
                nccl_dtype(dtype),
                o.op,
                self.comm,
                Self::stream(stream),
            )
        };
        self.ok(r, "ncclAllReduce")
    }

    #[allow(clippy::too_many_arguments)]
    pub fn reduce(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
        stream: u64,
    ) -> Result<()> {
        let o = self.op(op, dtype, "reduce")?;
        // SAFETY: as for all_reduce.
        let r = unsafe {
            (self.lib.ncclReduce)(
                send as *const c_void,
                recv as *mut c_void,
                count,
                nccl_dtype(dtype),
                o.op,
                root as c_int,
                self.comm,
                Self::stream(stream),
            )
        };
        self.ok(r, "ncclReduce")
    }

    pub fn broadcast(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        root: usize,
        stream: u64,
    ) -> Result<()> {
        // SAFETY: as for all_reduce.
        let r = unsafe {
            (self.lib.ncclBroadcast)(
                send as *const c_void,
                recv as *mut c_void,
                count,
                nccl_dtype(dtype),
                root as c_int,
                self.comm,
                Self::stream(stream),
            )
        };
        self.ok(r, "ncclBroadcast")
    }

    pub fn all_gather(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        stream: u64,
    ) -> Result<()> {
        // SAFETY: `recv` holds size * count elements (checked by the communicator).
        let r = unsafe {
            (self.lib.ncclAllGather)(
                send as *const c_void,
                recv as *mut c_void,
                count,
                nccl_dtype(dtype),
                self.comm,
                Self::stream(stream),
            )
        };
        self.ok(r, "ncclAllGather")
    }

    pub fn reduce_scatter(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: u64,
    ) -> Result<()> {
        let o = self.op(op, dtype, "reduce_scatter")?;
        // SAFETY: `send` holds size * count elements (checked by the communicator).
        let r = unsafe {
            (self.lib.ncclReduceScatter)(
                send as *const c_void,
                recv as *mut c_void,
                count,
                nccl_dtype(dtype),
                o.op,
                self.comm,
                Self::stream(stream),
            )
        };
        self.ok(r, "ncclReduceScatter")
    }

    /// Grouped point-to-point: `sends`/`recvs` are (peer, pointer, count) triples.
    pub fn exchange(
        &self,
        sends: &[(usize, u64, usize)],
        recvs: &[(usize, u64, usize)],
        dtype: DataType,
        stream: u64,
        what: &str,
    ) -> Result<()> {
        let dt = nccl_dtype(dtype);
        // SAFETY: group calls bracket the point-to-point enqueues below.
        self.ok(unsafe { (self.lib.ncclGroupStart)() }, "ncclGroupStart")?;
        let mut first_err = Ok(());
        for &(peer, p, n) in sends {
            // SAFETY: `p` holds `n` elements (checked by the communicator).
            let r = unsafe {
                (self.lib.ncclSend)(
                    p as *const c_void,
                    n,
                    dt,
                    peer as c_int,
                    self.comm,
                    Self::stream(stream),
                )
            };
            if first_err.is_ok() {
                first_err = self.ok(r, &format!("{what}: ncclSend to {peer}"));
            }
        }
        for &(peer, p, n) in recvs {
            // SAFETY: `p` holds room for `n` elements (checked by the communicator).
            let r = unsafe {
                (self.lib.ncclRecv)(
                    p as *mut c_void,
                    n,
                    dt,
                    peer as c_int,
                    self.comm,
                    Self::stream(stream),
                )
            };
            if first_err.is_ok() {
                first_err = self.ok(r, &format!("{what}: ncclRecv from {peer}"));
            }
        }
        // SAFETY: closes the group opened above.
        let end = self.ok(unsafe { (self.lib.ncclGroupEnd)() }, "ncclGroupEnd");
        first_err.and(end)
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        // SAFETY: the communicator was created by `new` and is destroyed once.
        unsafe { (self.lib.ncclCommDestroy)(self.comm) };
    }
}

/// Raw pointer of an input, or of the output for in place.
pub(crate) fn in_ptr(input: &Input<'_>, output: &ViewMut<'_>) -> u64 {
    match input {
        Input::InPlace => output.ptr() as u64,
        Input::Buf(v) => v.ptr() as u64,
    }
}

/// Collectives NCCL carries, on raw pointers from views (shared by the nccl and cuda backends).
pub(crate) struct NcclOps {
    pub nccl: Nccl,
    pub rank: usize,
    pub size: usize,
    /// A 4-byte device word for `barrier`.
    pub barrier_word: u64,
}

impl NcclOps {
    pub fn new(ctx: &CommContext) -> Result<NcclOps> {
        let nccl = Nccl::new(ctx)?;
        let mut w: u64 = 0;
        cu(
            // SAFETY: out-parameter; the context is current.
            unsafe { cudarc::driver::sys::cuMemAlloc_v2(&mut w, 64) },
            "cuMemAlloc (barrier)",
        )?;
        Ok(NcclOps {
            nccl,
            rank: ctx.rank,
            size: ctx.size,
            barrier_word: w,
        })
    }

    pub fn all_reduce(
        &self,
        input: Input<'_>,
        output: ViewMut<'_>,
        op: ReduceOp,
        opts: &CallOpts,
    ) -> Result<()> {
        let s = in_ptr(&input, &output);
        self.nccl.all_reduce(
            s,
            output.ptr() as u64,
            output.count(),
            output.dtype(),
            op,
            opts.stream,
        )
    }

    pub fn reduce(
        &self,
        input: Input<'_>,
        output: ViewMut<'_>,
        op: ReduceOp,
        root: usize,
        opts: &CallOpts,
    ) -> Result<()> {
        let s = in_ptr(&input, &output);
        self.nccl.reduce(
            s,
            output.ptr() as u64,
            output.count(),
            output.dtype(),
            op,
            root,
            opts.stream,
        )
    }

    pub fn broadcast(
        &self,
        input: Input<'_>,
        output: ViewMut<'_>,
        root: usize,
        opts: &CallOpts,
    ) -> Result<()> {
        let s = if self.rank == root {
            in_ptr(&input, &output)
        } else {
            output.ptr() as u64
        };
        self.nccl.broadcast(
            s,
            output.ptr() as u64,
            output.count(),
            output.dtype(),
            root,
            opts.stream,
        )
    }

    pub fn all_gather(&self, input: Input<'_>, output: ViewMut<'_>, opts: &CallOpts) -> Result<()> {
        let n = output.count() / self.size;
        let es = output.dtype().size();
        let s = match input {
            Input::InPlace => output.ptr() as u64 + (self.rank * n * es) as u64,
            Input::Buf(v) => v.ptr() as u64,
        };
        self.nccl
            .all_gather(s, output.ptr() as u64, n, output.dtype(), opts.stream)
    }

    pub fn reduce_scatter(
        &self,
        input: Input<'_>,
        output: ViewMut<'_>,
        op: ReduceOp,
        opts: &CallOpts,
    ) -> Result<()> {
        let es = output.dtype().size();
        let (s, r, n) = match input {
            Input::InPlace => {
                let n = output.count() / self.size;
                let base = output.ptr() as u64;
                (base, base + (self.rank * n * es) as u64, n)
            }
            Input::Buf(v) => (v.ptr() as u64, output.ptr() as u64, output.count()),
        };
        self.nccl
            .reduce_scatter(s, r, n, output.dtype(), op, opts.stream)
    }

    /// A stream-ordered copy of an in-place buffer, so sends read the original data.
    fn scratch_copy(&self, src: u64, bytes: usize, stream: u64) -> Result<u64> {
        let mut p: u64 = 0;
        let st = stream as cudarc::driver::sys::CUstream;
        // SAFETY: stream-ordered allocation and copy on the caller's stream (capturable).
        unsafe {
            cu(
                cudarc::driver::sys::cuMemAllocAsync(&mut p, bytes.max(1), st),
                "cuMemAllocAsync (all_to_all scratch)",
            )?;
            cu(
                cudarc::driver::sys::cuMemcpyDtoDAsync_v2(p, src, bytes, st),
                "cuMemcpyDtoDAsync (all_to_all scratch)",
            )?;
        }
        Ok(p)
    }

    fn free_scratch(p: u64, stream: u64) -> Result<()> {
        // SAFETY: frees the allocation made by scratch_copy, after the sends on this stream.
        cu(
            unsafe {
                cudarc::driver::sys::cuMemFreeAsync(p, stream as cudarc::driver::sys::CUstream)
            },
            "cuMemFreeAsync",
        )
    }

    pub fn all_to_all(&self, input: Input<'_>, output: ViewMut<'_>, opts: &CallOpts) -> Result<()> {
        let n = output.count() / self.size;
        let splits = Splits::packed(vec![n; self.size], vec![n; self.size]);
        self.all_to_all_v(input, output, &splits, opts)
    }

    pub fn all_to_all_v(
        &self,
        input: Input<'_>,
        output: ViewMut<'_>,
        splits: &Splits,
        opts: &CallOpts,
    ) -> Result<()> {
        let es = output.dtype().size();
        let (src, scratch) = match input {
            Input::InPlace => {
                let p = self.scratch_copy(output.ptr() as u64, output.bytes_len(), opts.stream)?;
                (p, Some(p))
            }
            Input::Buf(v) => (v.ptr() as u64, None),
        };
        let dst = output.ptr() as u64;
        let sends: Vec<_> = (0..self.size)
            .map(|p| {
                (
                    p,
                    src + (splits.send_displs[p] * es) as u64,
                    splits.send_counts[p],
                )
            })
            .collect();
        let recvs: Vec<_> = (0..self.size)
            .map(|p| {
                (
                    p,
                    dst + (splits.recv_displs[p] * es) as u64,
                    splits.recv_counts[p],
                )
            })
            .collect();
        let r = self
            .nccl
            .exchange(&sends, &recvs, output.dtype(), opts.stream, "all_to_all");
        if let Some(p) = scratch {
            Self::free_scratch(p, opts.stream)?;
        }
        r
    }

    /// Returns once every rank has called it: an NCCL all-reduce of one word, then a wait for
    /// the caller's stream.
    pub fn barrier(&self, opts: &CallOpts) -> Result<()> {
        self.nccl.all_reduce(
            self.barrier_word,
            self.barrier_word,
            1,
            DataType::I32,
            ReduceOp::Sum,
            opts.stream,
        )?;
        // SAFETY: waits for the caller's stream.
        cu(
            unsafe {
                cudarc::driver::sys::cuStreamSynchronize(
                    opts.stream as cudarc::driver::sys::CUstream,
                )
            },
            "barrier: cuStreamSynchronize",
        )
    }

    pub fn send(&self, data: View<'_>, peer: usize, opts: &CallOpts) -> Result<()> {
        self.nccl.exchange(
            &[(peer, data.ptr() as u64, data.count())],
            &[],
            data.dtype(),
            opts.stream,
            "send",
        )
    }

    pub fn recv(&self, out: ViewMut<'_>, peer: usize, opts: &CallOpts) -> Result<()> {
        self.nccl.exchange(
            &[],
            &[(peer, out.ptr() as u64, out.count())],
            out.dtype(),
            opts.stream,
            "recv",
        )
    }
}

impl Drop for NcclOps {
    fn drop(&mut self) {
        // SAFETY: allocated once in `new`.
        unsafe { cudarc::driver::sys::cuMemFree_v2(self.barrier_word) };
    }
}

/// NCCL alone behind the [`Backend`] trait (backend name `nccl`).
pub struct NcclBackend {
    ctx: Arc<CudaContext>,
    ops: NcclOps,
    device: u32,
    config: Arc<Config>,
    size: usize,
    lock: Mutex<()>,
}

/// NCCL alone as the backend of `ctx`.
pub fn new_backend(ctx: &CommContext) -> Result<Box<dyn Backend>> {
    let cuda = crate::cuda::open_context(ctx.device)?;
    cuda.bind_to_thread()
        .map_err(|e| Error::Cuda(format!("binding the context: {e:?}")))?;
    let ops = NcclOps::new(ctx)?;
    let device = match ctx.device {
        crate::types::Device::Cuda(d) => d,
        crate::types::Device::Host => 0,
    };
    Ok(Box::new(NcclBackend {
        ctx: cuda,
        ops,
        device,
        config: ctx.config.clone(),
        size: ctx.size,
        lock: Mutex::new(()),
    }))
}

/// Checks that every view of a call is memory of `device` (and that the pointer says so).
pub(crate) fn check_views(
    collective: &'static str,
    device: u32,
    views: &[(&str, u64, crate::types::Device, usize)],
) -> Result<()> {
    for &(what, p, dev, bytes) in views {
        if dev != crate::types::Device::Cuda(device) {
            return Err(Error::InvalidArgument(format!(
                "{collective}: {what} is on {dev}, this communicator serves cuda:{device}"
            )));
        }
        if bytes == 0 {
            continue;
        }
        let d = crate::cuda::pointer_device(p, collective, what)?;
        if d != device {
            return Err(Error::InvalidArgument(format!(
                "{collective}: {what} pointer {p:#x} is memory of cuda:{d}, this communicator \
                 serves cuda:{device}"
            )));
        }
    }
    Ok(())
}

pub(crate) fn views_of<'a>(
    input: &Input<'a>,
    output: &ViewMut<'a>,
) -> Vec<(&'static str, u64, crate::types::Device, usize)> {
    let mut v = vec![(
        "output",
        output.ptr() as u64,
        output.device(),
        output.bytes_len(),
    )];
    if let Input::Buf(i) = input {
        v.push(("input", i.ptr() as u64, i.device(), i.bytes_len()));
    }
    v
}

impl NcclBackend {
    fn enter(&self) -> Result<std::sync::MutexGuard<'_, ()>> {
        let g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.ctx
            .bind_to_thread()
            .map_err(|e| Error::Cuda(format!("binding the context: {e:?}")))?;
        Ok(g)
    }
}

impl Backend for NcclBackend {
    fn name(&self) -> &'static str {
        "nccl"
    }
    fn all_reduce(
        &self,
        input: Input<'_>,
        output: ViewMut<'_>,
        op: ReduceOp,
        opts: &CallOpts,
    ) -> Result<()> {
        let _g = self.enter()?;
        check_views("all_reduce", self.device, &views_of(&input, &output))?;
        self.ops.all_reduce(input, output, op, opts)
    }
    fn reduce(
        &self,
        input: Input<'_>,
        output: ViewMut<'_>,
        op: ReduceOp,
        root: usize,
        opts: &CallOpts,
    ) -> Result<()> {
        let _g = self.enter()?;
        check_views("reduce", self.device, &views_of(&input, &output))?;
        self.ops.reduce(input, output, op, root, opts)
    }
    fn broadcast(
        &self,
        input: Input<'_>,
        output: ViewMut<'_>,
        root: usize,
        opts: &CallOpts,
    ) -> Result<()> {
        let _g = self.enter()?;
        check_views("broadcast", self.device, &views_of(&input, &output))?;
        self.ops.broadcast(input, output, root, opts)
    }
    fn all_gather(&self, input: Input<'_>, output: ViewMut<'_>, opts: &CallOpts) -> Result<()> {
        let _g = self.enter()?;
        check_views("all_gather", self.device, &views_of(&input, &output))?;
        self.ops.all_gather(input, output, opts)
    }
    fn reduce_scatter(
        &self,
        input: Input<'_>,
        output: ViewMut<'_>,
        op: ReduceOp,
        opts: &CallOpts,
    ) -> Result<()> {
        let _g = self.enter()?;
        check_views("reduce_scatter", self.device, &views_of(&input, &output))?;
        self.ops.reduce_scatter(input, output, op, opts)
    }
    fn all_to_all(&self, input: Input<'_>, output: ViewMut<'_>, opts: &CallOpts) -> Result<()> {
        let _g = self.enter()?;
        check_views("all_to_all", self.device, &views_of(&input, &output))?;
        self.ops.all_to_all(input, output, opts)
    }
    fn all_to_all_v(
        &self,
        input: Input<'_>,
        output: ViewMut<'_>,
        splits: &Splits,
        opts: &CallOpts,
    ) -> Result<()> {
        let _g = self.enter()?;
        check_views("all_to_all_v", self.device, &views_of(&input, &output))?;
        self.ops.all_to_all_v(input, output, splits, opts)
    }
    fn barrier(&self, opts: &CallOpts) -> Result<()> {
        let _g = self.enter()?;
        self.ops.barrier(opts)
    }
    fn send(&self, data: View<'_>, peer: usize, opts: &CallOpts) -> Result<()> {
        let _g = self.enter()?;
        check_views(
            "send",
            self.device,
            &[("data", data.ptr() as u64, data.device(), data.bytes_len())],
        )?;
        self.ops.send(data, peer, opts)
    }
    fn recv(&self, out: ViewMut<'_>, peer: usize, opts: &CallOpts) -> Result<()> {
        let _g = self.enter()?;
        check_views(
            "recv",
            self.device,
            &[("out", out.ptr() as u64, out.device(), out.bytes_len())],
        )?;
        self.ops.recv(out, peer, opts)
    }
    fn algo_for(
        &self,
        coll: Collective,
        bytes_per_rank: usize,
        dtype: DataType,
        opts: &CallOpts,
    ) -> Result<Algo> {
        let caps = Capabilities {
            push: false,
            nccl: true,
            staging_bytes: Some(0),
            multi_host: true,
        };
        let _ = self.size;
        select::select(
            coll,
            bytes_per_rank,
            self.size,
            dtype,
            opts.algo.0,
            &caps,
            &self.config,
        )
    }
}
