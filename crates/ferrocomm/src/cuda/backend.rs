//! The cuda [`Backend`]: all-reduce by direct access (push / flat / tree) where it applies,
//! NCCL for everything else and above the size limits.

use std::sync::{Arc, Mutex};

use cudarc::driver::CudaContext;

use super::dda::collectives::{self, PartCall};
use super::dda::{fused_norm, Dda};
use super::kernels;
use crate::backend::{
    check_buffers, Backend, Call, CallKind, CallOpts, CommContext, P2pOp, WindowBackend,
};
use crate::bootstrap::all_gather_bytes;
use crate::config::Config;
use crate::driver::{
    bind, capturing, open_context, result, Completion, DeviceAttribute, Event, EventPool,
};
use crate::error::{Error, Result};
use crate::nccl::NcclBackend;
use crate::plan::{self, Algo, CallShape, CudaCaps, Engine, LpForm, PartForm, Plan};
use crate::quant::Codec;
use crate::types::{DataType, Device, ReduceOp};
use crate::view::{Input, View, ViewMut};

pub struct CudaBackend {
    cuda: Arc<CudaContext>,
    /// Events of async calls' work objects (the pool holds the context: work objects may
    /// outlive the backend).
    events: Arc<EventPool>,
    device: u32,
    rank: usize,
    size: usize,
    config: Arc<Config>,
    /// Shared with the communicator's windows (their kernels, error record and abort flag).
    dda: Option<Arc<Dda>>,
    /// Why direct access is off (for errors when a call asks for it).
    no_dda: String,
    nccl: Option<NcclBackend>,
    no_nccl: String,
    multi_host: bool,
    state: Mutex<CallState>,
}

/// Serialises calls and remembers the last stream, so that DDA kernels issued on different
/// streams still run one after the other (the protocol needs calls in order on every rank).
struct CallState {
    last_stream: Option<u64>,
    event: Event,
}

impl CudaBackend {
    pub fn new(ctx: &CommContext) -> Result<CudaBackend> {
        let cuda = open_context(ctx.device)?;
        bind(&cuda)?;
        let Device::Cuda(device) = ctx.device else {
            unreachable!("open_context accepts only CUDA devices")
        };
        // DDA needs every rank on this host: the launcher's word, confirmed by host names.
        let host = crate::bootstrap::hostname();
        let hosts = all_gather_bytes(
            &*ctx.store,
            "cuda/hosts",
            ctx.rank,
            ctx.size,
            host.as_bytes(),
            ctx.timeout(),
        )?;
        let one_host = hosts.iter().all(|h| h == host.as_bytes());
        let multi_host = !one_host || ctx.local_size < ctx.size;

        let (nccl, no_nccl) = match NcclBackend::new(ctx, cuda.clone()) {
            Ok(n) => (Some(n), String::new()),
            Err(e @ Error::LibraryMissing { .. }) => (None, e.to_string()),
            Err(e) => return Err(e),
        };

        let (dda, no_dda) = if multi_host {
            (
                None,
                format!(
                    "ranks span several hosts (local_size {} < size {} or host names differ)",
                    ctx.local_size, ctx.size
                ),
            )
        } else {
            match setup_dda(ctx, &cuda) {
                Ok(d) => (Some(Arc::new(d)), String::new()),
                Err(e) => {
                    if nccl.is_none() {
                        return Err(e);
                    }
                    if ctx.config.debug {
                        eprintln!(
                            "ferrocomm: rank {}: direct access off, NCCL carries every collective: {e}",
                            ctx.rank
                        );
                    }
                    (None, e.to_string())
                }
            }
        };
        if multi_host && nccl.is_none() {
            return Err(Error::LibraryMissing {
                library: "libnccl",
                why: format!("ranks span several hosts and NCCL is missing: {no_nccl}"),
            });
        }
        // Timing off makes record and wait cheap.
        let event = Event::new("cuEventCreate")?;
        if ctx.config.debug {
            eprintln!(
                "ferrocomm: rank {} cuda:{device}: dda {} ({} MiB staging, programmatic \
                 dependent launch {}, copy-engine all-reduce {}), nccl {}",
                ctx.rank,
                if dda.is_some() { "on" } else { "off" },
                super::dda::staging_layout(&ctx.config, ctx.size).total >> 20,
                if dda.as_ref().is_some_and(|d| d.pdl) {
                    "on"
                } else {
                    "off"
                },
                if dda.as_ref().is_some_and(|d| d.layout().ce_bytes > 0) {
                    "on"
                } else {
                    "off"
                },
                if nccl.is_some() { "on" } else { "off" },
            );
        }
        Ok(CudaBackend {
            events: Arc::new(EventPool::new(cuda.clone())),
            cuda,
            device,
            rank: ctx.rank,
            size: ctx.size,
            config: ctx.config.clone(),
            dda,
            no_dda,
            nccl,
            no_nccl,
            multi_host,
            state: Mutex::new(CallState {
                last_stream: None,
                event,
            }),
        })
    }

    /// What this communicator has, for the planner.
    fn cuda_caps(&self) -> CudaCaps<'_> {
        CudaCaps {
            world: self.size,
            dda: self.dda.as_deref().map(Dda::caps),
            no_dda: &self.no_dda,
            nccl: self.nccl.is_some(),
            no_nccl: &self.no_nccl,
            multi_host: self.multi_host,
            kernel_dtypes: &kernels::DTYPES,
        }
    }

    fn nccl(&self, collective: &'static str) -> Result<&NcclBackend> {
        self.nccl.as_ref().ok_or_else(|| Error::Unsupported {
            collective,
            backend: "cuda",
            what: format!("{collective} without NCCL ({})", self.no_nccl),
        })
    }

    fn enter(&self) -> Result<std::sync::MutexGuard<'_, CallState>> {
        let g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        bind(&self.cuda)?;
        Ok(g)
    }

    /// Orders this call after the previous one when the caller switched streams.
    fn follow(&self, st: &mut CallState, stream: u64) -> Result<()> {
        if let Some(prev) = st.last_stream {
            if prev != stream && !capturing(stream)? && !capturing(prev)? {
                st.event.record(prev, "cuEventRecord")?;
                st.event.wait_in(stream, "cuStreamWaitEvent")?;
            }
        }
        st.last_stream = Some(stream);
        Ok(())
    }
}

impl CudaBackend {
    /// Direct access, the codec and the form of the records when `plan` goes low precision.
    fn low_precision(&self, plan: &Plan) -> Option<(&Dda, Codec, LpForm)> {
        match (self.dda.as_deref(), plan.low_precision, plan.lp) {
            (Some(d), Some(c), Some(form)) => Some((d, c, form)),
            _ => None,
        }
    }

    /// Direct access and the form of the parts when `plan` runs a staged kernel, `None` for
    /// NCCL; reports an error an earlier kernel recorded.
    fn staged(&self, plan: &Plan, c: &'static str) -> Result<Option<(&Dda, PartForm)>> {
        let Some(d) = self.dda.as_deref() else {
            return Ok(None);
        };
        d.check_error(c)?;
        match (plan.algo, plan.parts) {
            (Algo::Direct, None) => Err(Error::InvalidArgument(format!(
                "{c}: a direct-access plan without the form of its parts"
            ))),
            (_, parts) => Ok(parts.map(|p| (d, p))),
        }
    }

    /// Runs `kind` (any call but the all-reduce, already ordered after the previous one) by
    /// direct access where `plan` says so: low precision, a staged kernel or a call of its own;
    /// `None` leaves it to NCCL.
    fn direct(&self, kind: &CallKind<'_>, plan: &Plan, opts: &CallOpts) -> Result<Option<()>> {
        let s = opts.stream;
        let (size, rank) = (self.size, self.rank);
        let lp = || self.low_precision(plan);
        let ran = match kind {
            CallKind::AllReduce { .. } | CallKind::AllReduceRmsNorm(_) => {
                unreachable!("run by run")
            }
            // The rooted part kernels, on the whole buffer.
            CallKind::Reduce { input, output, .. } | CallKind::Broadcast { input, output, .. } => {
                let (call, c) = match *kind {
                    CallKind::Reduce { op, root, .. } => (PartCall::Reduce { op, root }, "reduce"),
                    CallKind::Broadcast { root, .. } => (PartCall::Broadcast { root }, "broadcast"),
                    _ => unreachable!("matched above"),
                };
                let (n, dt) = (output.count(), output.dtype());
                let (i, o) = (input.address(output), output.ptr() as u64);
                self.staged(plan, c)?
                    .map(|(d, parts)| d.coll_part(call, i, o, n, dt, parts, s))
            }
            CallKind::AllGather { input, output } => {
                let (dt, part) = (output.dtype(), output.count() / size);
                let (i, o) = (input.part_address(output, part, rank), output.ptr() as u64);
                match lp() {
                    Some((d, c, form)) => {
                        Some(d.lp_collective(&form, &c, dt, i, o, part, false, s))
                    }
                    None => self.staged(plan, "all_gather")?.map(|(d, parts)| {
                        d.coll_part(PartCall::AllGather, i, o, part, dt, parts, s)
                    }),
                }
            }
            CallKind::ReduceScatter { input, output, op } => {
                let dt = output.dtype();
                let (i, o, part) = input.scatter_addresses(output, size, rank);
                let avg = *op == ReduceOp::Avg;
                match lp() {
                    Some((d, c, form)) => Some(d.lp_collective(&form, &c, dt, i, o, part, avg, s)),
                    None => self.staged(plan, "reduce_scatter")?.map(|(d, parts)| {
                        d.coll_part(PartCall::ReduceScatter(*op), i, o, part, dt, parts, s)
                    }),
                }
            }
            CallKind::AllToAll { input, output } => {
                let (dt, part) = (output.dtype(), output.count() / size);
                let (i, o) = (input.address(output), output.ptr() as u64);
                match lp() {
                    Some((d, c, form)) => {
                        Some(d.lp_collective(&form, &c, dt, i, o, part, false, s))
                    }
                    None => self.staged(plan, "all_to_all")?.map(|(d, parts)| {
                        d.coll_part(PartCall::AllToAll, i, o, part, dt, parts, s)
                    }),
                }
            }
            CallKind::AllToAllV {
                input,
                output,
                splits,
            } => {
                let dt = output.dtype();
                let (i, o) = (input.address(output), output.ptr() as u64);
                // Low precision (two ranks, planned on the crossing counts, which both ranks
                // see). In place as the full-precision kernels (every part keeps its size, which
                // the plan requires, and Communicator keeps its place): the warp that reads a
                // group of part p to send it is the one that writes the group received into part
                // p, after the barrier (kernels/lowp.cu, as in the all-to-all).
                match (lp(), self.dda.as_deref(), plan.a2av) {
                    (Some((d, c, form)), _, _) => {
                        Some(d.lp_all_to_all_v(&form, &c, dt, i, o, splits, s))
                    }
                    (None, Some(d), Some(form)) => {
                        Some(d.coll_all_to_all_v(i, o, splits, dt, form, s))
                    }
                    _ => None,
                }
            }
            CallKind::AllToAllVDynamic {
                input,
                output,
                counts,
            } => {
                let layout = (counts.capacity, counts.unit, false);
                let recv = counts.recv.ptr() as u64;
                let c = "all_to_all_v_dynamic";
                Some(self.dynamic(c, input, output, &counts.send, recv, layout, s))
            }
            CallKind::AllToAllVDynamicPacked {
                input,
                output,
                counts,
            } => {
                let layout = (output.count() / counts.unit, counts.unit, true);
                let recv = counts.recv.ptr() as u64;
                let c = "all_to_all_v_dynamic_packed";
                Some(self.dynamic(c, input, output, &counts.send, recv, layout, s))
            }
            CallKind::Barrier => match (plan.engine, self.dda.as_deref()) {
                (Engine::Direct, Some(d)) => Some(barrier(d, s)),
                _ => None,
            },
            // A message by direct access: the broadcast kernel rooted at the sender, in place.
            CallKind::Send { data, .. } => {
                let (buf, n, dt) = (data.ptr() as u64, data.count(), data.dtype());
                let sender = PartCall::SendRecv { sender: rank };
                self.staged(plan, "send")?
                    .map(|(d, p)| d.coll_part(sender, buf, buf, n, dt, p, s))
            }
            CallKind::Recv { out, peer } => {
                let (buf, n, dt) = (out.ptr() as u64, out.count(), out.dtype());
                let sender = PartCall::SendRecv { sender: *peer };
                self.staged(plan, "recv")?
                    .map(|(d, p)| d.coll_part(sender, buf, buf, n, dt, p, s))
            }
            CallKind::BatchSendRecv { ops } => self
                .direct_batch(ops, plan, opts)?
                .map(|(d, parts)| batch_send_recv(d, rank, ops, &parts, s)),
        };
        ran.transpose()
    }

    /// The device-count all-to-all-v calls (counts checked by the communicator): direct
    /// access, one launch. `recv` is the receive counts' address; `(capacity, unit, packed)`
    /// as `Dda::coll_all_to_all_dynamic` takes them.
    #[allow(clippy::too_many_arguments)]
    fn dynamic(
        &self,
        c: &'static str,
        input: &View<'_>,
        output: &ViewMut<'_>,
        send: &View<'_>,
        recv: u64,
        (capacity, unit, packed): (usize, usize, bool),
        stream: u64,
    ) -> Result<()> {
        let Some(d) = self.dda.as_deref() else {
            return Err(Error::Unsupported {
                collective: c,
                backend: "cuda",
                what: format!("device-side counts without direct access ({})", self.no_dda),
            });
        };
        d.check_error(c)?;
        d.coll_all_to_all_dynamic(
            input.ptr() as u64,
            input.count() / unit,
            output.ptr() as u64,
            capacity,
            unit,
            packed,
            send.ptr() as u64,
            recv,
            send.dtype(),
            output.dtype(),
            stream,
        )
    }

    /// Direct access and the form of each message's parts where the batch's `plan` runs by
    /// direct access (every message of it does: [`crate::backend::plan_call`]); `None`: the
    /// batch is one NCCL group.
    fn direct_batch(
        &self,
        ops: &[P2pOp<'_>],
        plan: &Plan,
        opts: &CallOpts,
    ) -> Result<Option<(&Dda, Vec<PartForm>)>> {
        if plan.engine != Engine::Direct {
            return Ok(None);
        }
        let mut dda = None;
        let mut parts = Vec::with_capacity(ops.len());
        for op in ops {
            let p = self.plan(&op.plan_shape(self.rank), opts)?;
            let Some((d, form)) = self.staged(&p, "batch_send_recv")? else {
                return Err(Error::InvalidArgument(
                    "batch_send_recv: a message of a direct-access batch planned for NCCL".into(),
                ));
            };
            dda = Some(d);
            parts.push(form);
        }
        Ok(dda.map(|d| (d, parts)))
    }
}

/// The barrier by direct access: every rank meets in one push kernel (no NCCL needed), a
/// one-word all-reduce with Max, which leaves the word as it was. A peer that never comes makes
/// the kernel give up after the timeout, and check_error names it.
fn barrier(d: &Dda, stream: u64) -> Result<()> {
    let w = d.barrier_word();
    let push = Plan::on_gpu(Algo::Push, None);
    d.all_reduce(&push, w, w, 1, DataType::I32, ReduceOp::Max, stream)?;
    // SAFETY: waits for the caller's stream (a live stream of this context); the kernel ends
    // by the timeout at the latest.
    unsafe { result::stream_synchronize(stream, "barrier: cuStreamSynchronize") }?;
    d.check_error("barrier")
}

/// A batch of sends and receives by direct access, message `k` in the form `parts[k]`, in the
/// order both ranks of the pair agree on.
fn batch_send_recv(
    d: &Dda,
    rank: usize,
    ops: &[P2pOp<'_>],
    parts: &[PartForm],
    stream: u64,
) -> Result<()> {
    let sends = ops.iter().map(|op| matches!(op, P2pOp::Send { .. }));
    for (k, sender) in collectives::two_rank_batch_order(rank, sends) {
        let (ptr, n, dt) = match &ops[k] {
            P2pOp::Send { data, .. } => (data.ptr() as u64, data.count(), data.dtype()),
            P2pOp::Recv { out, .. } => (out.ptr() as u64, out.count(), out.dtype()),
        };
        d.coll_part(
            PartCall::SendRecv { sender },
            ptr,
            ptr,
            n,
            dt,
            parts[k],
            stream,
        )?;
    }
    Ok(())
}

fn setup_dda(ctx: &CommContext, cuda: &CudaContext) -> Result<Dda> {
    let (major, minor) = cuda
        .compute_capability()
        .map_err(|e| Error::Cuda(format!("compute capability: {e:?}")))?;
    if major < 7 {
        return Err(Error::Unsupported {
            collective: "init",
            backend: "cuda",
            what: format!("direct access on sm_{major}{minor} (needs sm_70 or newer)"),
        });
    }
    let sms = cuda
        .attribute(DeviceAttribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(|e| Error::Cuda(format!("SM count: {e:?}")))?;
    let arch = format!("sm_{major}{minor}");
    let arch: &'static str = Box::leak(arch.into_boxed_str());
    Dda::new(ctx, arch, sms.max(1) as u32)
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // What the backend holds (events, staging, NCCL) is released in its context.
        let _ = bind(&self.cuda);
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn abort(&self, why: &str) {
        // Not under the call lock: a call may be running on another thread (one waiting for
        // NCCL stops waiting, see Nccl::abort).
        if let Some(n) = &self.nccl {
            n.abort_nccl(why);
        }
        // A window's wait polls this flag.
        if let Some(d) = self.dda.as_deref() {
            d.set_aborted();
        }
    }

    fn new_window(&self, slots: usize) -> Result<Box<dyn WindowBackend>> {
        let Some(d) = &self.dda else {
            return Err(Error::Unsupported {
                collective: "new_window",
                backend: "cuda",
                what: format!("windows without direct access ({})", self.no_dda),
            });
        };
        Ok(Box::new(super::window::CudaWindow::new(
            self.cuda.clone(),
            d.clone(),
            self.config.clone(),
            self.device,
            slots,
        )))
    }

    fn earlier_error(&self, collective: &'static str) -> Result<()> {
        // The record is host memory (no context needed); under the call lock, as every call's
        // own look at it.
        let _st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.dda
            .as_deref()
            .map_or(Ok(()), |d| d.check_error(collective))
    }

    fn peer_failed(&self, peer: usize) {
        // Kernels waiting for the peer end at their next look; NCCL is aborted (its kernels
        // exit) from the same thread.
        if let Some(d) = &self.dda {
            d.raise_abort(peer);
        }
        if let Some(n) = &self.nccl {
            n.peer_failed(peer);
        }
    }

    fn capturing(&self, stream: u64) -> bool {
        // Asked before the call runs (the flight recorder's mark), maybe on a thread where no
        // context is current yet: without one the query fails, which reads as "capturing",
        // so that answer is checked again with the backend's context current (the common
        // answer costs one driver call).
        crate::driver::capturing_or_unknown(stream)
            && (bind(&self.cuda).is_err() || crate::driver::capturing_or_unknown(stream))
    }

    fn mark(&self, stream: u64) -> Result<Option<Completion>> {
        bind(&self.cuda)?;
        self.events.record(stream).map(Some)
    }

    fn passed(&self, point: &Completion) -> Option<bool> {
        bind(&self.cuda).ok()?;
        point.is_done().ok()
    }

    fn began(&self, record: u64) -> Option<bool> {
        self.dda.as_deref().map(|d| d.began(record))
    }

    fn run(&self, call: Call<'_>) -> Result<()> {
        let opts = call.opts;
        if let CallKind::AllReduceRmsNorm(norm) = call.kind {
            // Its own locking: the two-launch form's all-reduce takes the call lock itself.
            bind(&self.cuda)?;
            let kind = CallKind::AllReduceRmsNorm(norm);
            check_buffers(&kind, Device::Cuda(self.device))?;
            let aligned = kind.aligned();
            let CallKind::AllReduceRmsNorm(norm) = kind else {
                unreachable!("built above")
            };
            return self.all_reduce_rmsnorm(norm, aligned, &call.plan, opts);
        }
        let mut st = self.enter()?;
        check_buffers(&call.kind, Device::Cuda(self.device))?;
        let aligned = call.kind.aligned();
        let st = &mut *st;
        if let Some(d) = self.dda.as_deref() {
            d.check_error(call.kind.name().name())?;
        }
        let plan = &call.plan;
        if let CallKind::AllReduce { input, output, op } = call.kind {
            return self.planned_all_reduce(st, input, output, op, aligned, plan, opts);
        }
        // Every other call is ordered after the previous one first, then runs by direct access
        // where the plan says so, else on NCCL.
        self.follow(st, opts.stream)?;
        if self.direct(&call.kind, plan, opts)?.is_some() {
            return Ok(());
        }
        self.on_nccl(call.kind, opts)
    }

    fn plan(&self, shape: &CallShape, opts: &CallOpts) -> Result<Plan> {
        let (caps, cfg) = (self.cuda_caps(), &self.config);
        plan::cuda_call_plan(&caps, cfg, shape, opts.algo.0, opts.low_precision)
    }

    fn rmsnorm_plan_for(&self, shape: crate::rmsnorm::Shape, opts: &CallOpts) -> Result<Plan> {
        plan::cuda_rmsnorm_plan(
            &self.cuda_caps(),
            &self.config,
            &shape,
            opts.algo.0,
            opts.low_precision,
        )
    }
}

/// The all-reduce and the fused all-reduce + RMSNorm of [`CudaBackend::run`] (the other calls
/// run in [`CudaBackend::direct`] or on NCCL), and the hand-over to NCCL.
impl CudaBackend {
    /// Hands a call direct access does not carry to NCCL (or refuses it without NCCL).
    fn on_nccl(&self, kind: CallKind<'_>, opts: &CallOpts) -> Result<()> {
        self.nccl(kind.name().name())?.execute(kind, opts)
    }

    #[allow(clippy::too_many_arguments)]
    fn planned_all_reduce(
        &self,
        st: &mut CallState,
        input: Input<'_>,
        output: ViewMut<'_>,
        op: ReduceOp,
        aligned: bool,
        plan: &Plan,
        opts: &CallOpts,
    ) -> Result<()> {
        let dtype = output.dtype();
        let count = output.count();
        if count == 0 {
            return Ok(());
        }
        if !aligned {
            return Err(Error::InvalidArgument(format!(
                "all_reduce: pointers must be aligned to the element size ({} bytes)",
                dtype.size()
            )));
        }
        let (ip, op_ptr) = (input.address(&output), output.ptr() as u64);
        self.follow(st, opts.stream)?;
        if let Some((d, codec, form)) = self.low_precision(plan) {
            let avg = op == ReduceOp::Avg;
            return d.lp_collective(&form, &codec, dtype, ip, op_ptr, count, avg, opts.stream);
        }
        match (*plan, self.dda.as_deref()) {
            (
                Plan {
                    engine: Engine::Direct,
                    ..
                },
                Some(d),
            ) => d.all_reduce(plan, ip, op_ptr, count, dtype, op, opts.stream),
            _ => self.on_nccl(CallKind::AllReduce { input, output, op }, opts),
        }
    }

    /// The fused call, as its plan (the call's one, [`Backend::rmsnorm_plan_for`]'s) says: one
    /// launch by direct access, the norm alone on x for one rank, or the all-reduce the plan
    /// carries ([`Plan::norm_all_reduce`], run under the call lock as planned) followed by the
    /// norm's launch.
    fn all_reduce_rmsnorm(
        &self,
        call: crate::rmsnorm::AllReduceRmsNorm<'_>,
        aligned: bool,
        plan: &Plan,
        opts: &CallOpts,
    ) -> Result<()> {
        let shape = call.shape();
        let form = plan.norm.unwrap_or(plan::NormForm::TwoLaunch);
        // With direct access the kernel comes from its rmsnorm unit (loaded at start-up where
        // built in or cached, else compiled now).
        let loaded = match self.dda.as_deref() {
            Some(d) => Some(fused_norm::NormKernel::from_unit(
                |name| d.func(shape.dtype, name),
                d.pdl,
                d.sm_count,
            )?),
            None => None,
        };
        match (form, self.dda.as_deref()) {
            (plan::NormForm::FusedFlat | plan::NormForm::FusedTree, Some(d)) => {
                // A one-launch form at one rank in full precision is the loopback measurement
                // (FERROCOMM_RMSNORM_LOOPBACK) the plan chose.
                let loopback = (d.world == 1 && plan.low_precision.is_none())
                    .then_some(self.config.rmsnorm_loopback)
                    .flatten();
                let mut st = self.enter()?;
                self.follow(&mut st, opts.stream)?;
                let lp = plan.low_precision.as_ref();
                return fused_norm::run_fused(d, form, lp, call, shape, aligned, opts, loopback);
            }
            (plan::NormForm::Local, _) => {
                return fused_norm::run_local(&self.config, call, shape, opts, loaded);
            }
            _ => {}
        }
        let all_reduce = plan.norm_all_reduce();
        fused_norm::run(&self.config, call, shape, opts, loaded, |x, out| {
            let mut st = self.enter()?;
            if let Some(d) = self.dda.as_deref() {
                d.check_error("all_reduce")?;
            }
            let sum = ReduceOp::Sum;
            self.planned_all_reduce(&mut st, x, out, sum, aligned, &all_reduce, opts)
        })
    }
}
