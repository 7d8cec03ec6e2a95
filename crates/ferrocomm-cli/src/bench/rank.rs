//! One rank of the benchmark: builds the communicator(s) and buffers, runs every row (ours and,
//! under `--vs nccl`, NCCL's right after it for the same size), and sends its samples to rank 0,
//! which prints the table and writes the JSON and the plot.

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::Context as _;
use ferrocomm::config::BackendChoice;
use ferrocomm::{
    AllReduceRmsNorm, CallOpts, CommOptions, Communicator, Config, DataType, Device, Format, Input,
    LowPrecisionChoice, PackedCounts, ReduceOp, Splits, View, ViewMut, Window,
};

use super::args::Plan;
use super::check::{self, Checker};
use super::engine::{Engine, HostEngine};
use super::json::{self, RankInfo, RunContext};
use super::output::Outputs;
use super::sizes::{A2avCounts, Coll, Shape};
use super::table::{self, Measure, Row, Versus};
use super::timing::{self, Timing};

/// One rank's results for one row, sent to rank 0 through the store.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct RankRow {
    oop: Vec<f64>,
    ip: Option<Vec<f64>>,
    wrong_oop: Option<u64>,
    wrong_ip: Option<u64>,
    nccl_oop: Option<Vec<f64>>,
    nccl_ip: Option<Vec<f64>>,
}

/// Low-precision format in effect for this row, if any (for the check's tolerance): the
/// codec of the call's plan, for the reductions that go low precision (Sum and Avg).
fn lp_format(call: &ferrocomm::Plan, shape: &Shape, op: ReduceOp) -> Option<Format> {
    let op_ok = !shape.coll.reduces() || matches!(op, ReduceOp::Sum | ReduceOp::Avg);
    call.low_precision.filter(|_| op_ok).map(|c| c.format)
}

/// The plan a row's call runs, as the path column prints it. all_reduce_rmsnorm prints its
/// norm's form; on NCCL it runs NCCL's all-reduce, then the norm kernel (`nccl+norm`).
fn call_plan(
    comm: &Communicator,
    plan: &Plan,
    shape: &Shape,
    dtype: DataType,
    opts: &CallOpts,
) -> ferrocomm::Result<ferrocomm::Plan> {
    let bytes = shape.bytes_per_rank();
    if plan.coll == Coll::Put {
        // Puts are no collective of the planner's: the path column names the put's engine
        // (put_path); this plan only stands in for it.
        return Ok(ferrocomm::Plan::on_gpu(ferrocomm::Algo::Direct, None));
    }
    if plan.coll != Coll::AllReduceRmsNorm {
        return comm.algo_for(plan.coll.collective(), bytes, dtype, opts);
    }
    if comm.backend_name() == "nccl" {
        let all_reduce = comm.algo_for(plan.coll.collective(), bytes, dtype, opts)?;
        return Ok(ferrocomm::Plan {
            norm: Some(ferrocomm::plan::NormForm::TwoLaunch),
            ..all_reduce
        });
    }
    let norm = ferrocomm::rmsnorm::Shape {
        rows: shape.count.checked_div(shape.hidden).unwrap_or(0),
        hidden: shape.hidden,
        dtype,
    };
    comm.rmsnorm_algo_for(norm, opts)
}

/// How a put of `bytes` runs, as the path column prints it: the host backend's copy, or the
/// engine [`ferrocomm::plan::put_engine`] picks on CUDA (`ce`, `kernel`).
fn put_path(comm: &Communicator, bytes: usize) -> String {
    match comm.device() {
        Device::Host => "host".into(),
        Device::Cuda(_) => {
            ferrocomm::plan::put_engine(bytes, &comm.config().thresholds).to_string()
        }
    }
}

/// A ring: send to the next rank, receive from the previous. Even ranks send first and odd
/// ranks receive first, so blocking sends cannot wait on each other in a cycle.
fn ring_send_recv(
    comm: &Communicator,
    data: View<'_>,
    out: ViewMut<'_>,
    opts: &CallOpts,
) -> ferrocomm::Result<()> {
    let (r, n) = (comm.rank(), comm.size());
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    if r % 2 == 0 {
        comm.send(data, next, opts)
            .and_then(|()| comm.recv(out, prev, opts))
    } else {
        comm.recv(out, prev, opts)
            .and_then(|()| comm.send(data, next, opts))
    }
}

/// Everything one side (ours or NCCL's) of a row needs.
struct Side<'a> {
    comm: &'a Communicator,
    opts: CallOpts,
    /// `put`: the window over every rank's output buffer (ours; NCCL's side sends).
    win: Option<&'a Window<'static>>,
}

struct RowCtx<'a> {
    plan: &'a Plan,
    timing: &'a Timing,
    shape: Shape,
    op: ReduceOp,
    root: usize,
    checker: Checker,
    rank: usize,
    /// All-to-all-v: this rank's counts, made once per row (not in the timed calls).
    splits: Option<Splits>,
}

impl RowCtx<'_> {
    /// Puts fresh inputs in place: the input buffer and a poisoned output, or the in-place
    /// buffer.
    fn prepare(&self, engine: &mut dyn Engine, in_place: bool) -> anyhow::Result<()> {
        let s = &self.shape;
        let e = s.dtype.size();
        if s.coll == Coll::DeviceAllToAllV {
            // The counts where an earlier kernel would have left them: in the engine's memory,
            // written before the timed calls (which never read them on the host).
            let sp = self
                .splits
                .as_ref()
                .expect("all-to-all-v rows carry their counts");
            let counts: Vec<u8> = (sp.send_counts.iter().chain(&sp.recv_counts))
                .flat_map(|&c| (c as i64).to_ne_bytes())
                .collect();
            engine.upload_counts(&counts)?;
        }
        if in_place {
            engine.upload_out(&self.checker.inplace_bytes(self.rank))
        } else {
            engine.upload_in(&self.checker.input_bytes(self.rank))?;
            let mut poison = vec![0u8; s.out_count * e];
            check::poison(s.dtype, &mut poison);
            engine.upload_out(&poison)
        }
    }

    /// Issues one collective of this row on the engine's buffers.
    fn issue(&self, engine: &dyn Engine, side: &Side<'_>, in_place: bool) -> anyhow::Result<()> {
        let (comm, opts, s) = (side.comm, &side.opts, &self.shape);
        let (d, dev) = (s.dtype, engine.device());
        let out_count = if in_place {
            s.inplace_count
        } else {
            s.out_count
        };
        // SAFETY: the engine allocated both buffers for the largest shape of the run on `dev`;
        // they live as long as the engine, which outlives every call and graph replay here, and
        // the bench touches them only between synchronizations.
        let output = unsafe { ViewMut::from_raw(engine.out_ptr(), out_count, d, dev) };
        // SAFETY: as above, for the input buffer.
        let in_view = unsafe { View::from_raw(engine.in_ptr(), s.in_count, d, dev) };
        let input = if in_place {
            Input::InPlace
        } else {
            Input::Buf(in_view)
        };
        let (op, root) = (self.op, self.root);
        match s.coll {
            Coll::AllReduce => comm.all_reduce(input, output, op, opts),
            Coll::Reduce => comm.reduce(input, output, op, root, opts),
            Coll::Broadcast => comm.broadcast(input, output, root, opts),
            Coll::AllGather => comm.all_gather(input, output, opts),
            Coll::ReduceScatter => comm.reduce_scatter(input, output, op, opts),
            Coll::AllToAll => comm.all_to_all(input, output, opts),
            Coll::AllToAllV => match &self.splits {
                Some(sp) => comm.all_to_all_v(input, output, sp, opts),
                None => unreachable!("all-to-all-v rows carry their counts"),
            },
            // NCCL has no device counts: its side runs its all-to-all-v, the same exchange.
            Coll::DeviceAllToAllV if comm.backend_name() == "nccl" => match &self.splits {
                Some(sp) => comm.all_to_all_v(input, output, sp, opts),
                None => unreachable!("all-to-all-v rows carry their counts"),
            },
            Coll::DeviceAllToAllV => {
                let Input::Buf(input) = input else {
                    unreachable!("all-to-all-v rows are out of place")
                };
                let n = s.world;
                // SAFETY: the engine's counts buffer (COUNTS_BYTES, on `dev`) holds this row's
                // send then receive counts as i64 (`prepare`); it lives as long as the engine.
                let (send, recv) = unsafe {
                    let p = engine.counts_ptr();
                    (
                        View::from_raw(p, n, DataType::I64, dev),
                        View::from_raw(p.add(n * 8), n, DataType::I64, dev),
                    )
                };
                let counts = PackedCounts {
                    send,
                    recv,
                    unit: 1,
                };
                comm.all_to_all_v_dynamic_packed(input, output, counts, opts)
            }
            Coll::AllReduceRmsNorm => {
                let (n, h, e) = (s.count, s.hidden, d.size());
                let (inp, outp) = (engine.in_ptr(), output.ptr());
                // NCCL has no fused call: its side is NCCL's all-reduce into out, then the
                // norm kernel alone (the unfused pair).
                let nccl = comm.backend_name() == "nccl";
                // SAFETY: the engine's buffers hold this row's layout (Shape::of_run: input
                // rows | residual | weight, output rows | residual) on `dev`, for as long as
                // the engine lives; the parts do not overlap.
                let call = unsafe {
                    let x = View::from_raw(inp, n, d, dev);
                    let out = ViewMut::from_raw(outp, n, d, dev);
                    if nccl {
                        let sum = ViewMut::from_raw(outp, n, d, dev);
                        comm.all_reduce(Input::Buf(x), sum, ReduceOp::Sum, opts)?;
                    }
                    AllReduceRmsNorm {
                        x: if nccl { Input::InPlace } else { Input::Buf(x) },
                        residual: Input::Buf(View::from_raw(inp.add(n * e), n, d, dev)),
                        weight: View::from_raw(inp.add(2 * n * e), h, d, dev),
                        out,
                        residual_out: ViewMut::from_raw(outp.add(n * e), n, d, dev),
                        eps: check::RMSNORM_EPS,
                        fp8: None,
                    }
                };
                match (nccl, dev) {
                    (true, Device::Cuda(g)) => {
                        ferrocomm::cuda::residual_rmsnorm(comm.config(), g, call, opts.stream)
                    }
                    _ => comm.all_reduce_rmsnorm(call, opts),
                }
            }
            Coll::SendRecv => ring_send_recv(comm, in_view, output, opts),
            Coll::Put => match side.win {
                // The ring by puts: into the next rank's output, then its signal, then the
                // previous rank's.
                Some(win) => {
                    let (r, n) = (comm.rank(), comm.size());
                    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
                    // SAFETY: the engine's input buffer, as above, seen as its bytes.
                    let bytes = unsafe {
                        View::from_raw(engine.in_ptr(), s.in_count * d.size(), DataType::U8, dev)
                    };
                    win.put(bytes, next, 0, opts)
                        .and_then(|()| win.signal(next, opts))
                        .and_then(|()| win.wait_signal(prev, opts))
                }
                None => ring_send_recv(comm, in_view, output, opts),
            },
        }
        .with_context(|| self.what(side, in_place))
    }

    /// Times one side; returns this rank's samples.
    fn time(
        &self,
        engine: &mut dyn Engine,
        side: &Side<'_>,
        in_place: bool,
    ) -> anyhow::Result<Vec<f64>> {
        self.prepare(engine, in_place)?;
        let engine: &dyn Engine = engine;
        let barrier_opts = CallOpts::on_stream(engine.stream());
        let scratch = line_up_word(self.plan, engine);
        timing::measure(
            engine,
            self.timing,
            &mut || Ok(side.comm.barrier(&barrier_opts)?),
            // The same line-up for both sides (the communicator's own choice for four bytes):
            // each rank's start event follows it on the stream, so the measurement starts where
            // the ranks leave it together, whenever their hosts got back from the barrier.
            &mut || {
                let Some(p) = scratch else { return Ok(()) };
                // SAFETY: the engine's four-byte scratch on `dev`, used by nothing else; it
                // lives as long as the engine.
                let word = unsafe { ViewMut::from_raw(p, 1, DataType::I32, engine.device()) };
                Ok(side
                    .comm
                    .all_reduce(Input::InPlace, word, ReduceOp::Max, &barrier_opts)?)
            },
            &mut || self.issue(engine, side, in_place),
        )
    }

    /// Runs once on fresh inputs and poisoned outputs and counts wrong elements.
    fn check(
        &self,
        engine: &mut dyn Engine,
        side: &Side<'_>,
        in_place: bool,
    ) -> anyhow::Result<u64> {
        self.prepare(engine, in_place)?;
        let put = side.win.is_some();
        let line_up = CallOpts::on_stream(engine.stream());
        if put {
            // Every output is poisoned before any rank puts into it.
            engine.sync()?;
            side.comm.barrier(&line_up)?;
        }
        self.issue(engine, side, in_place)?;
        engine.sync()?;
        let s = &self.shape;
        let count = if in_place {
            s.inplace_count
        } else {
            s.out_count
        };
        let mut got = vec![0u8; count * s.dtype.size()];
        engine.download_out(&mut got)?;
        let corrupt_rank = if s.coll == Coll::Reduce {
            self.root
        } else {
            s.world - 1
        };
        if self.plan.corrupt && !in_place && self.rank == corrupt_rank {
            // Test hook: one element of this rank's result goes bad, as a broken kernel would
            // leave it.
            if let Some(j) = self.checker.first_checked(self.rank, in_place) {
                let e = s.dtype.size();
                check::poison(s.dtype, &mut got[j * e..(j + 1) * e]);
            }
        }
        if put {
            // No rank's next puts land in an output another is still reading.
            side.comm.barrier(&line_up)?;
        }
        Ok(self.checker.count_wrong(self.rank, &got, in_place))
    }

    fn what(&self, side: &Side<'_>, in_place: bool) -> String {
        format!(
            "{} ({}) of {} bytes {} {} on rank {}",
            self.shape.coll.name(),
            side.comm.backend_name(),
            self.shape.size,
            self.shape.dtype,
            if in_place { "in place" } else { "out of place" },
            self.rank
        )
    }
}

/// The header's backend line.
fn backend_line(comm: &Communicator, plan: &Plan, gpus: usize) -> String {
    match (comm.backend_name(), gpus) {
        ("host", 0) => "host (no GPU found)".into(),
        ("host", _) if plan.backend.is_some() => "host (--backend host)".into(),
        ("host", _) => "host (host buffers; FERROCOMM_BACKEND=host)".into(),
        (b, n) => format!("{b} ({n} GPUs visible)"),
    }
}

fn publish<T: serde::Serialize>(comm: &Communicator, key: &str, v: &T) -> anyhow::Result<()> {
    comm.store()
        .set(key, &serde_json::to_vec(v)?)
        .with_context(|| format!("store: publishing {key}"))
}

fn collect<T: serde::de::DeserializeOwned>(
    comm: &Communicator,
    key: &str,
    timeout: Duration,
) -> anyhow::Result<T> {
    let b = comm
        .store()
        .get(key, timeout)
        .with_context(|| format!("store: waiting for {key}"))?;
    let _ = comm.store().delete(key);
    Ok(serde_json::from_slice(&b)?)
}

/// Runs this rank; rank 0 prints. Returns the exit code (1 when any element was wrong).
pub fn run(plan: &Plan, cfg: Config, command_line: Vec<String>) -> anyhow::Result<i32> {
    let timeout = cfg.timeout;
    let mut opts = CommOptions::new("bench");
    opts.backend = plan.backend.map(|b| b.choice());
    opts.config = Some(cfg.clone());
    let comm = Communicator::new(opts).context("creating the benchmark's communicator")?;
    let (rank, world) = (comm.rank(), comm.size());
    plan.check_world(world)?;
    let nccl = if plan.vs_nccl {
        let mut o = CommOptions::new("bench-nccl");
        o.backend = Some(BackendChoice::Nccl);
        o.device = Some(comm.device());
        // The baseline is NCCL as nccl-tests runs it: no completion events of our watchdog.
        let mut raw = cfg.clone();
        raw.nccl_watchdog = false;
        o.config = Some(raw);
        Some(Communicator::new(o).context("creating the NCCL communicator for --vs nccl")?)
    } else {
        None
    };

    // Buffers for the largest shape of the run.
    let (mut in_max, mut out_max) = (0, 0);
    for &d in &plan.dtypes {
        for &s in &plan.sizes {
            let sh = Shape::of_run(plan.coll, s, d, world, plan.hidden)?;
            in_max = in_max.max(sh.in_count * d.size());
            out_max = out_max.max(sh.out_count.max(sh.inplace_count) * d.size());
        }
    }
    let mut engine: Box<dyn Engine> = match comm.device() {
        Device::Host => Box::new(HostEngine::new(in_max, out_max)?),
        Device::Cuda(i) => Box::new(super::gpu::CudaEngine::new(i, in_max, out_max)?),
    };
    // put: every rank's output buffer in one window, registered once (declared after the
    // engine, so dropped before it).
    let mut window = if plan.coll == Coll::Put {
        let mut w = comm.new_window().context("put: creating the window")?;
        // SAFETY: the engine's output buffer holds at least `out_max` bytes (one at least) on
        // the communicator's device and lives as long as the engine, which outlives the window.
        let out = unsafe {
            ViewMut::from_raw(
                engine.out_ptr(),
                out_max.max(1),
                DataType::U8,
                comm.device(),
            )
        };
        w.register(out)
            .context("put: registering the output buffer in the window")?;
        Some(w)
    } else {
        None
    };

    let me = RankInfo {
        rank,
        pid: std::process::id(),
        host: crate::info::hostname(),
        device: comm.device().to_string(),
    };
    publish(&comm, &format!("bench/info/{rank}"), &me)?;
    let gpus = crate::info::gpu_count();
    let backend = backend_line(&comm, plan, gpus);
    let mut ranks = Vec::new();
    if rank == 0 {
        for r in 0..world {
            ranks.push(collect::<RankInfo>(
                &comm,
                &format!("bench/info/{r}"),
                timeout,
            )?);
        }
        let device_start = line_up_word(plan, engine.as_ref()).is_some();
        print!(
            "{}",
            header_text(plan, world, &backend, &ranks, device_start)
        );
    }

    let timing = Timing {
        mode: plan.mode,
        iters: plan.iters,
        warmup: plan.warmup,
        reps: plan.reps,
        blocking: plan.blocking,
    };
    let lp_choice = plan
        .low_precision
        .map_or(LowPrecisionChoice::Default, LowPrecisionChoice::On);
    let ours_opts = CallOpts::on_stream(engine.stream())
        .with_algo(plan.algo)
        .with_low_precision(lp_choice);
    let roots = plan.roots(world);
    let total = plan.dtypes.len() * plan.ops.len() * roots.len() * plan.sizes.len();
    let bar = (rank == 0 && std::io::stderr().is_terminal() && total > 1).then(|| {
        let b = indicatif::ProgressBar::new(total as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} sizes {elapsed} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });

    // Rank 0's files, rewritten after every size (see output.rs).
    let files = plan.json.is_some() || plan.plot.is_some();
    let outputs = (rank == 0 && files).then(|| {
        let title = format!(
            "{} {} on {} ranks, {} ({})",
            plan.coll.name(),
            plan.dtypes
                .iter()
                .map(|d| d.name())
                .collect::<Vec<_>>()
                .join(","),
            world,
            backend,
            plan.mode.describe()
        );
        let context = plan.json.is_some().then(|| RunContext {
            date: json::now_iso8601(),
            hostname: crate::info::hostname(),
            command_line,
            git_revision: json::git_revision(),
            ferrocomm_version: env!("CARGO_PKG_VERSION"),
            backend: backend.clone(),
            world_size: world,
            ranks,
            system: crate::info::probe_system(&cfg),
            env: crate::info::env_entries(&cfg),
        });
        let device_start = line_up_word(plan, engine.as_ref()).is_some();
        Outputs::new(plan, device_start, context, title, total)
    });
    let mut rows: Vec<Row> = Vec::new();
    let mut my_wrong = 0u64;
    let mut idx = 0u64;
    for &dtype in &plan.dtypes {
        for &op in &plan.ops {
            for &root in &roots {
                for &size in &plan.sizes {
                    let shape = Shape::of_run(plan.coll, size, dtype, world, plan.hidden)?;
                    let call = call_plan(&comm, plan, &shape, dtype, &ours_opts)
                        .with_context(|| format!("--algo {} for size {size}", plan.algo))?;
                    let checker = Checker::new(
                        shape,
                        op,
                        root,
                        plan.seed,
                        idx,
                        lp_format(&call, &shape, op),
                    );
                    let ctx = RowCtx {
                        plan,
                        timing: &timing,
                        shape,
                        op,
                        root,
                        checker,
                        rank,
                        splits: shape
                            .coll
                            .uneven()
                            .then(|| A2avCounts::new(shape.count, shape.world, rank).splits()),
                    };
                    let algo = if plan.coll == Coll::Put {
                        put_path(&comm, shape.bytes_per_rank())
                    } else {
                        call.to_string()
                    };
                    let ours = Side {
                        comm: &comm,
                        opts: ours_opts.clone(),
                        win: window.as_ref(),
                    };
                    // The all-to-all-v's parts differ between send and receive: out of place only.
                    let has_ip = !(matches!(plan.coll, Coll::SendRecv | Coll::Put)
                        || plan.coll == Coll::AllReduceRmsNorm
                        || plan.coll.uneven());
                    if idx == 0 {
                        // The first size once untimed on our side: ours is measured first, and
                        // on 2xH200 the first row of a run came out up to 42% slower than the
                        // next, larger size (four of five collectives) while NCCL, measured after
                        // ours, did not (run 2026-11-30-h200x2-checks-coll, commit 2a43a1c).
                        ctx.time(engine.as_mut(), &ours, false)?;
                    }
                    let mut rr = RankRow {
                        oop: ctx.time(engine.as_mut(), &ours, false)?,
                        ..Default::default()
                    };
                    if plan.check {
                        rr.wrong_oop = Some(ctx.check(engine.as_mut(), &ours, false)?);
                    }
                    if has_ip {
                        rr.ip = Some(ctx.time(engine.as_mut(), &ours, true)?);
                        if plan.check {
                            rr.wrong_ip = Some(ctx.check(engine.as_mut(), &ours, true)?);
                        }
                    }
                    // NCCL right after ours, for the same size: both see the same machine state.
                    if let Some(nc) = &nccl {
                        let theirs = Side {
                            comm: nc,
                            opts: CallOpts::on_stream(engine.stream()),
                            win: None,
                        };
                        rr.nccl_oop = Some(ctx.time(engine.as_mut(), &theirs, false)?);
                        if has_ip {
                            rr.nccl_ip = Some(ctx.time(engine.as_mut(), &theirs, true)?);
                        }
                    }
                    my_wrong += rr.wrong_oop.unwrap_or(0) + rr.wrong_ip.unwrap_or(0);
                    publish(&comm, &format!("bench/row/{idx}/{rank}"), &rr)?;
                    if rank == 0 {
                        let mut all = Vec::with_capacity(world);
                        for r in 0..world {
                            all.push(collect::<RankRow>(
                                &comm,
                                &format!("bench/row/{idx}/{r}"),
                                timeout,
                            )?);
                        }
                        let row = combine_row(plan, &shape, op, root, algo.to_string(), &all);
                        let text = table::line(&row);
                        match &bar {
                            Some(b) => {
                                b.suspend(|| println!("{text}"));
                                b.inc(1);
                            }
                            None => println!("{text}"),
                        }
                        rows.push(row);
                        if rows.len() < total {
                            if let Some(o) = &outputs {
                                o.save(&rows, false)?;
                            }
                        }
                    }
                    idx += 1;
                }
            }
        }
    }
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    // Everyone leaves together: no rank tears its communicator down under a peer.
    comm.barrier(&CallOpts::on_stream(engine.stream()))?;
    engine.sync()?;
    if let Some(w) = window.as_mut() {
        w.deregister().context("put: releasing the window")?;
    }
    if rank != 0 {
        // A rank that leaves with a failure makes the launcher stop the others: wait until rank 0
        // has printed the summary (which counts this rank's wrong values too).
        collect::<bool>(&comm, &format!("bench/done/{rank}"), timeout)?;
        return Ok(i32::from(my_wrong > 0));
    }

    if let Some(o) = &outputs {
        o.save(&rows, true)?;
    }
    let summary = table::summarize(&rows);
    print!("{}", table::footer(&summary));
    std::io::Write::flush(&mut std::io::stdout())?;
    for r in 1..world {
        publish(&comm, &format!("bench/done/{r}"), &true)?;
    }
    Ok(i32::from(summary.wrong > 0))
}

/// The word of the device-side line-up before each measurement, where one runs: a GPU engine,
/// not `--host-start`.
fn line_up_word(plan: &Plan, engine: &dyn Engine) -> Option<*mut u8> {
    engine.scratch().filter(|_| plan.device_start)
}

fn header_text(
    plan: &Plan,
    world: usize,
    backend: &str,
    ranks: &[RankInfo],
    device_start: bool,
) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let step = match plan.step {
        super::args::Step::Factor(f) => format!("{f}(factor)"),
        super::args::Step::Bytes(b) => format!("{b}(bytes)"),
    };
    let _ = writeln!(
        s,
        "# ferrocomm bench {}: nranks {world} minBytes {} maxBytes {} step: {step} warmup iters: \
         {} iters: {} reps: {} mode: {} start: {} validation: {} blocking: {}",
        plan.coll.name(),
        plan.min_bytes,
        plan.max_bytes,
        plan.warmup,
        plan.iters,
        plan.reps,
        plan.mode.describe(),
        if device_start { "device" } else { "host" },
        u8::from(plan.check),
        u8::from(plan.blocking),
    );
    let _ = writeln!(s, "# Backend: {backend}");
    let lp = plan
        .low_precision
        .map_or("environment".to_string(), |f| f.to_string());
    let _ = writeln!(
        s,
        "# Algorithm: {}  Low precision: {lp}{}",
        plan.algo,
        if plan.vs_nccl {
            "  NCCL: same run, ratio = ours / NCCL"
        } else {
            ""
        }
    );
    let _ = writeln!(s, "#\n# Using devices");
    for r in ranks {
        let _ = writeln!(
            s,
            "#  Rank {:2} Pid {:6} on {:>10} device {}",
            r.rank, r.pid, r.host, r.device
        );
    }
    let _ = writeln!(s, "#");
    s.push_str(&table::header(plan.vs_nccl));
    s
}

/// Builds the printed row from every rank's samples.
fn combine_row(
    plan: &Plan,
    shape: &Shape,
    op: ReduceOp,
    root: usize,
    algo: String,
    all: &[RankRow],
) -> Row {
    let fig = |pick: &dyn Fn(&RankRow) -> Option<&Vec<f64>>| -> Option<f64> {
        let per: Option<Vec<Vec<f64>>> = all.iter().map(|r| pick(r).cloned()).collect();
        per.map(|p| timing::combine(plan.mode, &p))
    };
    let measure = |secs: f64, wrong: Option<u64>| {
        let (algbw, busbw) = shape.bandwidths(secs);
        Measure {
            time_us: secs * 1e6,
            algbw,
            busbw,
            wrong,
        }
    };
    let sum_wrong = |pick: &dyn Fn(&RankRow) -> Option<u64>| -> Option<u64> {
        all.iter().map(pick).sum::<Option<u64>>()
    };
    let oop_s = fig(&|r| Some(&r.oop)).unwrap_or(f64::NAN);
    let oop = measure(oop_s, sum_wrong(&|r| r.wrong_oop));
    let ip_s = fig(&|r| r.ip.as_ref());
    let ip = ip_s.map(|s| measure(s, sum_wrong(&|r| r.wrong_ip)));
    let nccl = fig(&|r| r.nccl_oop.as_ref()).map(|n_oop| {
        let n_ip = fig(&|r| r.nccl_ip.as_ref());
        Versus {
            oop_time_us: n_oop * 1e6,
            oop_busbw: shape.bandwidths(n_oop).1,
            oop_ratio: oop_s / n_oop,
            ip_time_us: n_ip.map(|s| s * 1e6),
            ip_busbw: n_ip.map(|s| shape.bandwidths(s).1),
            ip_ratio: ip_s.zip(n_ip).map(|(a, b)| a / b),
        }
    });
    Row {
        collective: shape.coll.name(),
        size: shape.size,
        count: shape.count,
        dtype: shape.dtype.name(),
        redop: if shape.coll.reduces() {
            op.name()
        } else {
            "none"
        },
        root: if shape.coll.rooted() { root as i64 } else { -1 },
        algo,
        oop,
        ip,
        nccl,
    }
}
