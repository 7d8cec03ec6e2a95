//! `Communicator`: the public API every backend serves.
//!
//! Every call takes one path: its method (or a binding's [`CallDesc`]) describes it as a
//! [`CallKind`], which is checked here once for every backend ([`CallKind::check`]: sizes,
//! dtypes, ops, roots) and handed to the backend's one entry ([`Backend::run`]). A backend
//! receives only calls that make sense locally; checks that need the other ranks (different
//! collectives or counts at the same step) are the backend's, because only it sees the peers.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::backend::{check_timeout, CallTimeout, CommLive, ABORT_CALLED};
pub use crate::backend::{
    AlgoChoice, Backend, Call, CallDesc, CallKind, CallOpts, CommContext, DeviceCounts, P2pOp,
    PackedCounts, Splits,
};
use crate::bootstrap::{self, PrefixStore, Store};
use crate::config::{BackendChoice, Config};
use crate::driver::Completion;
use crate::error::{Error, Result};
pub use crate::plan::LowPrecisionChoice;
use crate::plan::{Collective, Plan};
use crate::rmsnorm::{AllReduceRmsNorm, Shape as RmsNormShape};
use crate::types::{read_count, DataType, Device, ReduceOp};
use crate::view::{Input, View, ViewMut};
use crate::window::{AllGatherP, Window, WindowParts};

mod failure;

/// How to create a communicator ([`Communicator::new`]). Unset fields come from the
/// environment, as torchrun and `ferrocomm launch` set it; every rank passes the same `name`.
///
/// How the ranks meet: through `store` when one is given (a [`crate::bootstrap::MemStore`] for
/// ranks that are threads of one process, or any [`Store`]); otherwise through a TCP store,
/// hosted by `ferrocomm launch` (`FERROCOMM_STORE_ADDR`/`FERROCOMM_STORE_PORT`) or else by rank
/// 0 at `MASTER_ADDR`:`MASTER_PORT` (`MASTER_PORT + 1` under torchrun, whose own store holds
/// `MASTER_PORT`). A one-rank communicator with a store given needs no environment at all.
#[derive(Clone, Default)]
pub struct CommOptions {
    /// The communicator's name, the same on every rank (empty: `default`). Communicators of
    /// different names, or created one after another under one name, never share store keys.
    pub name: String,
    /// Which backend to build (`None`: `FERROCOMM_BACKEND`, by default `auto`: the CUDA backend
    /// when the device is a GPU, the host backend otherwise).
    pub backend: Option<BackendChoice>,
    /// The device whose buffers the collectives take (`None`: GPU `local_rank` when there is a
    /// GPU and the backend is not `host`, else [`Device::Host`]).
    pub device: Option<Device>,
    /// This rank, below `size` (`None`: `RANK`, or `OMPI_COMM_WORLD_RANK`).
    pub rank: Option<usize>,
    /// The number of ranks (`None`: `WORLD_SIZE`, or `OMPI_COMM_WORLD_SIZE`).
    pub size: Option<usize>,
    /// This rank among those on its machine (`None`: `LOCAL_RANK`, else `rank`); picks the
    /// default GPU.
    pub local_rank: Option<usize>,
    /// The number of ranks on this machine (`None`: `LOCAL_WORLD_SIZE`, else `size`).
    pub local_size: Option<usize>,
    /// The store the ranks meet through (`None`: the TCP store the environment names, as above).
    pub store: Option<Arc<dyn Store>>,
    /// How long a rank waits for its peers, at creation and in every collective (`None`:
    /// `FERROCOMM_TIMEOUT_S`, 300 s by default); a peer that does not arrive in time is named in
    /// the error.
    pub timeout: Option<Duration>,
    /// Every setting (`None`: [`Config::from_env`], the `FERROCOMM_*` variables); `timeout`
    /// above overrides its timeout.
    pub config: Option<Config>,
}

impl CommOptions {
    /// Options with `name` and everything else from the environment.
    pub fn new(name: impl Into<String>) -> Self {
        CommOptions {
            name: name.into(),
            ..Default::default()
        }
    }
}

/// A group of ranks that run collectives together.
pub struct Communicator {
    /// Dropped first: marks this rank closed for the peers' watchers and stops the thread
    /// before the backend goes.
    watch: Option<crate::watch::Watch>,
    ctx: CommContext,
    root_store: Arc<dyn Store>,
    backend: Arc<dyn Backend>,
    /// The flight recorder of this communicator's calls.
    flight: Arc<crate::flight::FlightRecorder>,
    /// The hooks registered on it.
    hooks: Arc<crate::hooks::Hooks>,
    /// Calls compared across ranks so far (`FERROCOMM_CHECK_CALLS`).
    checked: AtomicU64,
    /// Collective calls made or refused so far: the number of the latest (peers' refusals
    /// name calls by it).
    calls: Arc<AtomicU64>,
    /// What became of this rank's recent collective calls (taken by the backend, or not): a
    /// peer's refusal of a call this rank took aborts the backend's waits; of a call this rank
    /// refused too, or has not reached, it does not.
    outcomes: Arc<failure::Outcomes>,
    /// The plans `FERROCOMM_DEBUG` has printed (each once, as printed).
    plans_seen: Mutex<HashSet<(Collective, String)>>,
    /// Finalized, aborted ([`Communicator::abort`]) and the timeout of later calls
    /// ([`Communicator::set_timeout`]), shared with the communicator's windows.
    live: Arc<CommLive>,
}

/// Instances per communicator name and rank in this process, so that communicators created in
/// the same order on every rank get the same, distinct store prefixes (also when several ranks
/// are threads of one process).
fn next_instance(name: &str, rank: usize) -> u64 {
    static COUNTS: OnceLock<Mutex<HashMap<(String, usize), u64>>> = OnceLock::new();
    let mut m = COUNTS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let c = m.entry((name.to_string(), rank)).or_insert(0);
    *c += 1;
    *c - 1
}

/// Every rank must build the same kind of backend with the same shared settings
/// ([`Config::shared_settings`]): ranks that chose different thresholds, staging sizes or
/// low-precision formats would run different kernels or lay out their buffers differently and
/// wait for each other, or corrupt each other's data. Refused here with every differing
/// variable and each rank's value.
fn check_settings_agree(ctx: &CommContext, backend: &str) -> Result<()> {
    if ctx.size == 1 {
        return Ok(());
    }
    let mut mine = vec![("backend", "FERROCOMM_BACKEND / device", backend.to_string())];
    mine.extend(ctx.config.shared_settings());
    let text: String = mine.iter().map(|(n, _, v)| format!("{n}={v}\n")).collect();
    let all = crate::bootstrap::all_gather_bytes(
        &*ctx.store,
        "settings",
        ctx.rank,
        ctx.size,
        text.as_bytes(),
        ctx.timeout(),
    )?;
    let ranks: Vec<std::collections::BTreeMap<String, String>> = all
        .iter()
        .map(|b| {
            String::from_utf8_lossy(b)
                .lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .collect();
    let mut diffs = Vec::new();
    for (name, var, _) in &mine {
        let vals: Vec<&str> = ranks
            .iter()
            .map(|m| m.get(*name).map_or("(not sent)", |v| v.as_str()))
            .collect();
        if vals.iter().any(|v| *v != vals[0]) {
            let each: Vec<String> = vals
                .iter()
                .enumerate()
                .map(|(r, v)| format!("rank {r} {v}"))
                .collect();
            diffs.push(format!("{var} ({name}): {}", each.join(", ")));
        }
    }
    if diffs.is_empty() {
        return Ok(());
    }
    Err(Error::InvalidArgument(format!(
        "communicator '{}': settings differ between ranks, and every rank must use the same \
         (docs/config.md): {}",
        ctx.name,
        diffs.join("; ")
    )))
}

impl Communicator {
    /// Creates a communicator: finds rank and size, connects to the store, builds the backend.
    /// Every rank must call it with the same name.
    pub fn new(opts: CommOptions) -> Result<Self> {
        let mut config = match opts.config {
            Some(c) => c,
            None => Config::from_env()?,
        };
        if let Some(t) = opts.timeout {
            config.timeout = check_timeout(t)?;
        }
        let l = &config.launch;
        let rank = opts.rank.or(l.rank).ok_or(Error::MissingEnv {
            var: "RANK",
            why: "no rank given and neither RANK nor OMPI_COMM_WORLD_RANK is set".into(),
        })?;
        let size = opts.size.or(l.world_size).ok_or(Error::MissingEnv {
            var: "WORLD_SIZE",
            why: "no size given and neither WORLD_SIZE nor OMPI_COMM_WORLD_SIZE is set".into(),
        })?;
        if size == 0 || rank >= size {
            return Err(Error::InvalidArgument(format!(
                "rank {rank} is not below size {size}"
            )));
        }
        if size > crate::config::MAX_WORLD_SIZE {
            return Err(Error::InvalidArgument(format!(
                "a communicator of {size} ranks is larger than the largest accepted ({})",
                crate::config::MAX_WORLD_SIZE
            )));
        }
        let local_rank = opts.local_rank.or(l.local_rank).unwrap_or(rank);
        let local_size = opts.local_size.or(l.local_world_size).unwrap_or(size);
        let root_store: Arc<dyn Store> = match opts.store {
            Some(s) => s,
            None => bootstrap::connect_from_env(&config, rank, size)?,
        };
        let name = if opts.name.is_empty() {
            "default".to_string()
        } else {
            opts.name
        };
        let prefix = format!("ferrocomm/{name}#{}", next_instance(&name, rank));
        let choice = opts.backend.unwrap_or(config.backend);
        Self::build(
            name,
            prefix,
            (0..size).collect(),
            rank,
            size,
            local_rank,
            local_size,
            opts.device,
            choice,
            root_store,
            Arc::new(config),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn build(
        name: String,
        prefix: String,
        global_ranks: Vec<usize>,
        rank: usize,
        size: usize,
        local_rank: usize,
        local_size: usize,
        device: Option<Device>,
        choice: BackendChoice,
        root_store: Arc<dyn Store>,
        config: Arc<Config>,
    ) -> Result<Self> {
        let store: Arc<dyn Store> = Arc::new(PrefixStore::new(prefix.clone(), root_store.clone()));
        let device = match (device, choice) {
            (
                Some(Device::Cuda(_)),
                BackendChoice::Auto | BackendChoice::Cuda | BackendChoice::Nccl,
            )
            | (Some(Device::Host), _) => device.unwrap_or(Device::Host),
            (Some(Device::Cuda(_)), BackendChoice::Host) => {
                return Err(Error::InvalidArgument(
                    "the host backend cannot serve a CUDA device".into(),
                ))
            }
            (None, BackendChoice::Host) => Device::Host,
            (None, BackendChoice::Cuda | BackendChoice::Nccl) => Device::Cuda(local_rank as u32),
            (None, BackendChoice::Auto) => {
                if crate::cuda::gpu_count() > 0 {
                    Device::Cuda(local_rank as u32)
                } else {
                    Device::Host
                }
            }
        };
        // This machine's tuning table, where it has one and FERROCOMM_TUNING names none: the
        // host's, or the GPUs' (their model, count and links).
        let config = if config.tuning_file.is_none() {
            let key = match device {
                Device::Host => crate::config::tuning::host_key(),
                Device::Cuda(_) => crate::cuda::machine_key(),
            };
            let mut c = (*config).clone();
            c.use_machine_table(&key)?;
            Arc::new(c)
        } else {
            config
        };
        let ctx = CommContext {
            name,
            prefix,
            rank,
            size,
            local_rank,
            local_size,
            device,
            store,
            config,
            peers: Arc::new(crate::backend::PeerState::new(size)),
        };
        let kind = match (choice, device) {
            (BackendChoice::Nccl, _) => "nccl",
            (_, Device::Host) => "host",
            (_, Device::Cuda(_)) => "cuda",
        };
        check_settings_agree(&ctx, kind)?;
        failure::agree_trace_job(&ctx)?;
        // Before the backend: its waits read what the watcher sees.
        let watch = crate::watch::Watch::start(&ctx)?;
        let backend: Arc<dyn Backend> = match (choice, device) {
            (BackendChoice::Nccl, _) => crate::nccl::new_backend(&ctx)?.into(),
            (_, Device::Host) => Arc::new(crate::host::HostBackend::new(&ctx)?),
            (_, Device::Cuda(_)) => crate::cuda::new_backend(&ctx)?.into(),
        };
        if ctx.config.debug {
            // One line in one write, as print_plan's (stderr is shared by the ranks).
            let line = format!(
                "ferrocomm: communicator '{}' rank {}/{} backend {} device {} tuning table {} \
                 (digest {})\n",
                ctx.name,
                rank,
                size,
                backend.name(),
                device,
                ctx.config.tuning.source,
                ctx.config.tuning.digest
            );
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        }
        let flight = failure::recorder(&ctx, kind, global_ranks, &backend)?;
        let live = Arc::new(CommLive::new(&ctx.name, ctx.timeout()));
        let comm = Communicator {
            watch,
            ctx,
            root_store,
            backend,
            flight,
            hooks: Arc::default(),
            checked: 0.into(),
            calls: Arc::default(),
            outcomes: Arc::default(),
            plans_seen: Mutex::default(),
            live,
        };
        comm.arm_watch();
        Ok(comm)
    }

    /// This rank, in `0..size`.
    pub fn rank(&self) -> usize {
        self.ctx.rank
    }
    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.ctx.size
    }
    /// The name every rank created it with.
    pub fn name(&self) -> &str {
        &self.ctx.name
    }
    /// The device its buffers live on.
    pub fn device(&self) -> Device {
        self.ctx.device
    }
    /// The backend's name (`host`, `cuda`, `nccl`).
    pub fn backend_name(&self) -> &'static str {
        self.backend.name()
    }
    /// The configuration it was created with.
    pub fn config(&self) -> &Config {
        &self.ctx.config
    }
    /// The store its ranks met through (also usable by the caller for its own keys).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.ctx.store
    }

    /// How a call with these parameters runs on this communicator: its [`Plan`] (engine,
    /// algorithm, form, low-precision codec), printed as the bench's path column shows it
    /// (`flat`, `flat-ce`, `nccl`, `lp-tree`, ...). Reductions are planned as a Sum, the
    /// pointers as aligned; `bytes_per_rank` counts as [`CallKind::shape`] does.
    pub fn algo_for(
        &self,
        coll: Collective,
        bytes_per_rank: usize,
        dtype: DataType,
        opts: &CallOpts,
    ) -> Result<Plan> {
        self.backend.plan_for(coll, bytes_per_rank, dtype, opts)
    }

    /// Checks one call ([`CallKind::check`]) and hands it to the backend, with the hooks and
    /// the flight recorder around it: the one path every call takes, from the methods below
    /// and from a binding's [`CallDesc`]. A collective call this rank refuses (its arguments
    /// are wrong here) fails on the peers at once ([`Communicator::refuse`]). With
    /// `FERROCOMM_DEBUG` the call's plan is printed the first time it comes up (once per
    /// collective and plan).
    fn run(&self, kind: CallKind<'_>, opts: &CallOpts) -> Result<()> {
        let name = kind.name().name();
        kind.check(self.rank(), self.size())
            .inspect_err(|e| self.refuse_for(kind.name(), e))?;
        if let CallKind::AllToAllVDynamicPacked { counts, .. } = &kind {
            if counts.send.device() == Device::Host && counts.recv.device() == Device::Host {
                // Counts in host memory: read here and run as the all-to-all-v they describe,
                // with its checks.
                let (dt, unit) = (counts.send.dtype(), counts.unit);
                let read = |v: &View<'_>| -> Vec<usize> {
                    let b = v.host_bytes().unwrap_or(&[]);
                    (0..self.size())
                        .map(|i| read_count(dt, b, i).saturating_mul(unit))
                        .collect()
                };
                let splits = Splits::packed(read(&counts.send), read(&counts.recv));
                let CallKind::AllToAllVDynamicPacked { input, output, .. } = kind else {
                    unreachable!("matched above")
                };
                let kind = CallKind::AllToAllV {
                    input: Input::Buf(input),
                    output,
                    splits: &splits,
                };
                return self.run(kind, opts);
            }
        }
        let backend = self.live(name)?;
        let timeout = self.live.timeout_for(opts)?;
        let _timeout = CallTimeout::enter(timeout);
        let op_id = crate::flight::next_op_id();
        if self.hooks.any() {
            self.hooks.pre(&crate::hooks::PreHookArgs {
                op_id,
                name,
                call: &kind,
                opts,
            });
        }
        let r = self.run_recorded(backend, kind, opts, timeout, op_id);
        if self.hooks.any() {
            self.hooks.post(&crate::hooks::PostHookArgs {
                op_id,
                name,
                result: &r,
            });
        }
        r
    }

    /// Runs the call a binding described by plain values: [`CallDesc::kind`] turns it into its
    /// [`CallKind`], then it takes the path of every call (checked once, handed to the backend).
    ///
    /// # Safety
    /// As for [`CallDesc::kind`]: every buffer of `desc` holds its elements on its device,
    /// readable (and writable where the call writes), and stays valid and unaliased until the
    /// call is complete (for CUDA: until its work on the stream has finished).
    pub unsafe fn run_desc(&self, desc: &CallDesc) -> Result<()> {
        // SAFETY: forwarded from this function's contract.
        let kind = unsafe { desc.kind() }.inspect_err(|e| self.refuse_for(desc.name, e))?;
        self.run(kind, &desc.opts)
    }

    /// The plan `kind` runs ([`crate::backend::plan_call`]): asked once per call, handed to
    /// the backend with the call. With `FERROCOMM_DEBUG` it is printed the first time it comes
    /// up (the fused call's plans are counted with the all-reduces: they carry their norm
    /// form).
    fn plan_once(
        &self,
        backend: &dyn Backend,
        kind: &CallKind<'_>,
        opts: &CallOpts,
    ) -> Result<Plan> {
        let (rank, world) = (self.ctx.rank, self.ctx.size);
        let plan = crate::backend::plan_call(backend, kind, rank, world, opts)?;
        if self.ctx.config.debug {
            let (bytes, dtype) = kind.shape(rank, world);
            self.print_plan(kind.collective(), kind.name().name(), bytes, dtype, plan);
        }
        Ok(plan)
    }

    /// With `FERROCOMM_DEBUG`: prints the plan of a call named `name` (of `coll`, whose plans
    /// it is counted with) the first time it comes up.
    fn print_plan(&self, coll: Collective, name: &str, bytes: usize, dtype: DataType, plan: Plan) {
        let first = self
            .plans_seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((coll, format!("{plan} {}", plan.detail())));
        if first {
            // One write of the whole line, so that ranks sharing a terminal or a pipe do not
            // interleave their lines.
            let detail = match plan.detail() {
                d if d.is_empty() => d,
                d => format!(" ({d})"),
            };
            let line = format!(
                "ferrocomm: rank {} '{}': {name} of {bytes} bytes per rank ({dtype}) runs \
                 {plan}{detail}\n",
                self.ctx.rank, self.ctx.name,
            );
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        }
    }

    /// How long later calls wait for a peer at each wait (the creation timeout until
    /// [`Communicator::set_timeout`]; a call's [`CallOpts::timeout`] overrides it).
    pub fn timeout(&self) -> Duration {
        self.live.timeout()
    }

    /// Sets the timeout of later calls, longer or shorter than the creation timeout: every wait
    /// for a peer (on the host, in the direct-access kernels, NCCL's watchdog) of a call that
    /// starts afterwards uses it. Positive and at most [`crate::config::MAX_TIMEOUT`].
    pub fn set_timeout(&self, timeout: Duration) -> Result<()> {
        self.live.set_timeout(timeout)
    }

    /// A [`Completion`] recorded on `stream` (the calling thread's current context's) after
    /// the calls issued on it so far: what an async call's work object holds. `None` on the
    /// host backend, whose calls have finished when they return.
    pub fn mark(&self, stream: u64) -> Result<Option<Completion>> {
        self.live("mark")?.mark(stream)
    }

    /// Waits for `c` (a point [`Communicator::mark`] recorded after some calls) as
    /// [`Completion::wait`] does, then fails naming the peer when one died or gave up: its
    /// death ended those calls' kernels early, so what they wrote is no result.
    pub fn wait(&self, c: &Completion, limit: Option<Duration>) -> Result<bool> {
        let done = c.wait(limit)?;
        if let Some((peer, _)) = self.ctx.peers.failure() {
            return Err(Error::PeerFailed {
                collective: "wait",
                rank: self.ctx.rank,
                peer,
            });
        }
        Ok(done)
    }

    /// The backend, unless the communicator was finalized or aborted here, or lost a peer
    /// (then a call of `collective` fails naming it).
    fn live(&self, collective: &'static str) -> Result<&dyn Backend> {
        // This rank's own finalize or abort first: a peer that failed afterwards (or gave up
        // when it saw this rank abort) is not what the caller needs to hear.
        self.live.check()?;
        if let Some((peer, _)) = self.ctx.peers.failure() {
            return Err(Error::PeerFailed {
                collective,
                rank: self.ctx.rank,
                peer,
            });
        }
        Ok(&*self.backend)
    }

    /// Gives up on the communicator (torchcomms' abort): the abort hooks run, every later
    /// call fails with [`Error::Aborted`] at once, the peers' watchers learn it within
    /// milliseconds and fail their communicators naming this rank ([`Error::PeerFailed`]:
    /// their waiting host collectives and direct-access kernels end), an NCCL communicator
    /// underneath is aborted (its kernels exit), and the flight recorder is dumped. May be
    /// called from any thread, also while a call runs; the memory is released on drop.
    pub fn abort(&self) {
        self.abort_because(ABORT_CALLED);
    }

    /// [`Communicator::abort`] for a reason of the caller's (a binding aborts a communicator
    /// whose call timed out: `all_reduce timed out`), which later calls' [`Error::Aborted`]
    /// gives. The first reason stays.
    pub fn abort_because(&self, why: &str) {
        if self.live.abort(why) {
            self.hooks.abort();
            if let Some(w) = &self.watch {
                w.announce_abort();
            }
            self.backend.abort(self.live.abort_why());
            self.dump_for_failure(self.live.abort_why());
        }
    }

    /// Whether [`Communicator::abort`] was called.
    pub fn is_aborted(&self) -> bool {
        self.live.is_aborted()
    }

    /// Sums (or otherwise reduces) `input` over all ranks into `output` on every rank.
    pub fn all_reduce(
        &self,
        input: Input<'_>,
        output: ViewMut<'_>,
        op: ReduceOp,
        opts: &CallOpts,
    ) -> Result<()> {
        self.run(CallKind::AllReduce { input, output, op }, opts)
    }

    /// Sums `call.x` over all ranks, adds the residual and RMS-normalizes every row, in one
    /// call (optionally also as FP8 with a scale per row): see [`crate::rmsnorm`]. Every rank
    /// passes the same shape, dtype, eps and FP8 choice; the host backend checks that, the
    /// cuda backend's all-reduce the total size.
    pub fn all_reduce_rmsnorm(&self, call: AllReduceRmsNorm<'_>, opts: &CallOpts) -> Result<()> {
        self.run(CallKind::AllReduceRmsNorm(call), opts)
    }

    /// How an all_reduce_rmsnorm of `shape` runs on this communicator: its [`Plan`], the
    /// norm's form included (`fused-flat`, `fused-tree`, or the all-reduce's path and `+norm`).
    /// Pointers are planned as aligned. Backends without the call refuse.
    pub fn rmsnorm_algo_for(&self, shape: RmsNormShape, opts: &CallOpts) -> Result<Plan> {
        self.live(crate::rmsnorm::NAME)?
            .rmsnorm_plan_for(shape, opts)
    }

    /// Reduces `input` over all ranks into `output` on `root` (other ranks' outputs are not
    /// written).
    pub fn reduce(
        &self,
        input: Input<'_>,
        output: ViewMut<'_>,
        op: ReduceOp,
        root: usize,
        opts: &CallOpts,
    ) -> Result<()> {
        let kind = CallKind::Reduce {
            input,
            output,
            op,
            root,
        };
        self.run(kind, opts)
    }

    /// Copies `root`'s input into every rank's `output` (the input is read on root only).
    pub fn broadcast(
        &self,
        input: Input<'_>,
        output: ViewMut<'_>,
        root: usize,
        opts: &CallOpts,
    ) -> Result<()> {
        let kind = CallKind::Broadcast {
            input,
            output,
            root,
        };
        self.run(kind, opts)
    }

    /// Concatenates every rank's input (in rank order) into `output`, which holds
    /// `size * input.count()` elements.
    pub fn all_gather(&self, input: Input<'_>, output: ViewMut<'_>, opts: &CallOpts) -> Result<()> {
        self.run(CallKind::AllGather { input, output }, opts)
    }

    /// Reduces `input` (`size * n` elements) over all ranks and leaves part `rank` (n elements)
    /// in `output`. In place, `output` is the whole `size * n` buffer.
    pub fn reduce_scatter(
        &self,
        input: Input<'_>,
        output: ViewMut<'_>,
        op: ReduceOp,
        opts: &CallOpts,
    ) -> Result<()> {
        self.run(CallKind::ReduceScatter { input, output, op }, opts)
    }

    /// Every rank sends part `j` of its input to rank `j`; input and output hold `size * n`.
    pub fn all_to_all(&self, input: Input<'_>, output: ViewMut<'_>, opts: &CallOpts) -> Result<()> {
        self.run(CallKind::AllToAll { input, output }, opts)
    }

    /// All-to-all with per-peer counts and offsets (in elements). A rank's part to itself must
    /// have the same count on both sides (`send_counts[rank] == recv_counts[rank]`).
    pub fn all_to_all_v(
        &self,
        input: Input<'_>,
        output: ViewMut<'_>,
        splits: &Splits,
        opts: &CallOpts,
    ) -> Result<()> {
        let kind = CallKind::AllToAllV {
            input,
            output,
            splits,
        };
        self.run(kind, opts)
    }

    /// All-to-all-v for mixture-of-experts dispatch, with the counts in device memory (written
    /// by an earlier kernel; no host synchronisation, CUDA-graph capturable).
    ///
    /// Counts and the capacity are in units of `counts.unit` elements (1: elements; a row's
    /// length: rows). `input` holds the parts for rank 0, 1, ... back to back,
    /// `counts.send[p]` units for rank `p`; the part from rank `s` lands at unit
    /// `s * counts.capacity` of `output` (which holds `size * capacity * unit` elements) and
    /// `counts.recv[s]` receives its length; output past that length is left untouched. A
    /// negative count sends nothing. A part longer than the capacity, or send counts past the
    /// input, are truncated and reported as an error (by the receiving, resp. sending rank),
    /// nothing is written past a buffer: the cuda backend reports it from the next call on
    /// this communicator; the host backend (counts in host memory) from this call, once the
    /// exchange is complete and `counts.recv` written. Every rank must pass the same capacity,
    /// unit and dtype. The nccl backend refuses ([`Error::Unsupported`]).
    pub fn all_to_all_v_dynamic(
        &self,
        input: View<'_>,
        output: ViewMut<'_>,
        counts: DeviceCounts<'_>,
        opts: &CallOpts,
    ) -> Result<()> {
        let kind = CallKind::AllToAllVDynamic {
            input,
            output,
            counts,
        };
        self.run(kind, opts)
    }

    /// All-to-all-v with both sides' counts in memory the caller's earlier work wrote, the
    /// output packed (NCCLX's `device_alltoallv_single`): `input` holds `counts.send[p]` units
    /// for rank `p` back to back, and the part from rank `s` lands at the sum of
    /// `counts.recv[..s]` in `output`. Counts are in units of `counts.unit` elements; a
    /// negative count is 0.
    ///
    /// Counts in device memory (cuda backend): no host synchronisation, CUDA-graph capturable.
    /// A part whose length differs from the one its receiver expects (ranks that disagree),
    /// receive counts past the output, send counts past the input and parts larger than a
    /// staging slot (`FERROCOMM_CUDA_STAGING_BYTES / ranks`) are reported by the next call on
    /// this communicator, on every rank; what fits is moved and nothing is written past a
    /// buffer. Counts in host memory (any backend): read here and run as
    /// [`Communicator::all_to_all_v`], with its checks.
    pub fn all_to_all_v_dynamic_packed(
        &self,
        input: View<'_>,
        output: ViewMut<'_>,
        counts: PackedCounts<'_>,
        opts: &CallOpts,
    ) -> Result<()> {
        let kind = CallKind::AllToAllVDynamicPacked {
            input,
            output,
            counts,
        };
        self.run(kind, opts)
    }

    /// A new window for one-sided communication ([`crate::window`]): every rank makes its
    /// windows in the same order, then registers a buffer in it ([`Window::register`]).
    pub fn new_window<'b>(&self) -> Result<Window<'b>> {
        self.window_with_slots(1)
    }

    /// A persistent all-gather into `output` ([`AllGatherP`]): collective, `output` (every
    /// rank's part of `output.count() / size` elements, in rank order) is registered once and
    /// each [`AllGatherP::exec`] writes every rank's input straight into every peer's output.
    /// The registration's waits for the peers are bounded by the timeout of `opts`.
    pub fn all_gather_p_init<'b>(
        &self,
        output: ViewMut<'b>,
        opts: &CallOpts,
    ) -> Result<AllGatherP<'b>> {
        AllGatherP::init(self.window_with_slots(AllGatherP::SLOTS)?, output, opts)
    }

    fn window_with_slots<'b>(&self, slots: usize) -> Result<Window<'b>> {
        let engine = self.live("new_window")?.new_window(slots)?;
        Window::new(WindowParts {
            live: self.live.clone(),
            store: self.ctx.store.clone(),
            rank: self.ctx.rank,
            size: self.ctx.size,
            device: self.ctx.device,
            engine,
            slots,
        })
    }

    /// Returns once every rank has called it.
    pub fn barrier(&self, opts: &CallOpts) -> Result<()> {
        self.run(CallKind::Barrier, opts)
    }

    /// Sends `data` to `peer`, which must call [`Communicator::recv`] with the same count.
    ///
    /// As NCCL's, a send may wait until the peer receives: two ranks that both send to each
    /// other first (or both receive first) must pair the calls in
    /// [`Communicator::batch_send_recv`]. In a two-rank communicator on the cuda backend a
    /// message goes by direct access (`FERROCOMM_P2P_MAX_BYTES`), where such a pair of sends
    /// is reported as calls that disagree between the ranks instead of waiting.
    pub fn send(&self, data: View<'_>, peer: usize, opts: &CallOpts) -> Result<()> {
        self.run(CallKind::Send { data, peer }, opts)
    }

    /// Receives from `peer` into `out`.
    pub fn recv(&self, out: ViewMut<'_>, peer: usize, opts: &CallOpts) -> Result<()> {
        self.run(CallKind::Recv { out, peer }, opts)
    }

    /// Sends and receives issued together (NCCL's group, torch's `batch_isend_irecv`): they
    /// progress at once, so a batch may hold a send to a peer and a receive from it in either
    /// order without waiting on itself. Between two ranks, sends and receives match in the
    /// order issued (a batch's in its order), each receive the size and dtype of its send.
    /// Only the ranks named take part.
    pub fn batch_send_recv(&self, ops: Vec<P2pOp<'_>>, opts: &CallOpts) -> Result<()> {
        self.run(CallKind::BatchSendRecv { ops }, opts)
    }

    /// A communicator of the ranks listed (in that order). Ranks not listed get `None` and need
    /// not call; listed ranks must all call with the same list and name. It starts with this
    /// communicator's current [`Communicator::timeout`].
    pub fn split(&self, ranks: &[usize], name: &str) -> Result<Option<Communicator>> {
        self.live("split")?;
        let mut seen = vec![false; self.size()];
        for &r in ranks {
            if r >= self.size() {
                return Err(Error::RankOutOfRange {
                    collective: "split",
                    what: "listed",
                    rank: r,
                    size: self.size(),
                });
            }
            if std::mem::replace(&mut seen[r], true) {
                return Err(Error::InvalidArgument(format!(
                    "split: rank {r} is listed twice"
                )));
            }
        }
        let Some(new_rank) = ranks.iter().position(|&r| r == self.rank()) else {
            return Ok(None);
        };
        let list: Vec<String> = ranks.iter().map(|r| r.to_string()).collect();
        let full = format!("{}/{}", self.ctx.name, name);
        let prefix = format!(
            "{}/split/{name}[{}]#{}",
            self.ctx.prefix,
            list.join(","),
            next_instance(&format!("{}/{full}", self.ctx.prefix), self.rank())
        );
        let choice = match self.backend.name() {
            "host" => BackendChoice::Host,
            "nccl" => BackendChoice::Nccl,
            _ => BackendChoice::Cuda,
        };
        // The new communicator starts with this one's current timeout (set_timeout's, if any),
        // also for its creation.
        let mut config = (*self.ctx.config).clone();
        config.timeout = self.timeout();
        let global: Vec<usize> = ranks
            .iter()
            .map(|&r| self.flight.info().ranks.get(r).copied().unwrap_or(r))
            .collect();
        Communicator::build(
            full,
            prefix,
            global,
            new_rank,
            ranks.len(),
            0,
            ranks.len(),
            Some(self.ctx.device),
            choice,
            self.root_store.clone(),
            Arc::new(config),
        )
        .map(Some)
    }

    /// Releases the backend's resources now; later calls fail with [`Error::Finalized`].
    pub fn finalize(&self) -> Result<()> {
        self.live.finalize();
        self.leave();
        Ok(())
    }
}
