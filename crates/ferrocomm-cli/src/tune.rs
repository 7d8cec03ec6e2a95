//! `ferrocomm tune`: times every candidate of every choice the tuning table makes on this
//! machine, with the bench's harness (`ferrocomm bench --algo A --json`, one run per collective
//! and candidate, in CUDA graphs on GPUs), finds the sizes where the best changes and writes
//! the table; `--check FILE` re-measures and lists the sizes where FILE's choice is more than
//! 5% slower than the best. Each run's JSON is kept beside the output, so an interrupted tune
//! (or one stopped by `--max-minutes`) goes on where it stopped.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context as _};
use ferrocomm::config::BackendChoice;
use ferrocomm::plan::{host_algo, select, Caps};
use ferrocomm::tuning::{AllReduceRule, DirectRule, TableSource, Tuning, Worlds};
use ferrocomm::{Algo, Collective, Config, DataType};

/// Tune the planner's thresholds on this machine and write them as a tuning table.
#[derive(clap::Args, Debug)]
pub struct TuneArgs {
    /// Ranks to tune for (one per GPU on the cuda backend; processes on the host backend).
    #[arg(short = 'g', long = "ngpus")]
    pub ranks: usize,
    /// The table to write (default: this machine's table under the cache directory, which
    /// every communicator here then uses).
    #[arg(short = 'o', long)]
    pub output: Option<PathBuf>,
    /// Re-measure and list the sizes where this table's choice is more than 5% slower than the
    /// best (exit status 1 when there is one); writes nothing.
    #[arg(long)]
    pub check: Option<PathBuf>,
    /// `host` or `cuda` (default: cuda where there are GPUs, else host).
    #[arg(long)]
    pub backend: Option<String>,
    /// Stop starting runs after this many minutes; what was measured is kept, and the same
    /// command goes on from there.
    #[arg(long, default_value_t = 120.0)]
    pub max_minutes: f64,
    /// Fewer sizes and iterations: a check of the mechanism, not a tune.
    #[arg(long)]
    pub short: bool,
}

/// One measurement run: a collective and a forced candidate.
#[derive(Debug, Clone)]
struct Run {
    coll: Collective,
    algo: Algo,
    /// `-e` of the run (a candidate that cannot take larger calls stops there).
    max_bytes: usize,
}

/// The sizes (bytes per rank) and the bench's iteration flags of a tune.
struct Sweep {
    min: usize,
    max: usize,
    iters: &'static str,
    warmup: &'static str,
}

impl Sweep {
    fn new(short: bool) -> Sweep {
        if short {
            Sweep {
                min: 1 << 10,
                max: 1 << 20,
                iters: "3",
                warmup: "1",
            }
        } else {
            Sweep {
                min: 1 << 10,
                max: 256 << 20,
                iters: "20",
                warmup: "5",
            }
        }
    }
}

/// The candidates of every choice on `backend` with `ranks`, and the largest size each takes.
fn runs(backend: BackendChoice, sweep: &Sweep, staging: usize) -> Vec<Run> {
    let run = |coll, algo, max_bytes: usize| Run {
        coll,
        algo,
        max_bytes: max_bytes.min(sweep.max),
    };
    if backend == BackendChoice::Host {
        // The host backend's one size choice: the all-reduce's flat or tree.
        return vec![
            run(Collective::AllReduce, Algo::Flat, usize::MAX),
            run(Collective::AllReduce, Algo::Tree, usize::MAX),
        ];
    }
    let mut v = vec![
        run(Collective::AllReduce, Algo::Push, 512 << 10),
        run(Collective::AllReduce, Algo::Flat, usize::MAX),
        run(Collective::AllReduce, Algo::Tree, staging),
        run(Collective::AllReduce, Algo::Nccl, usize::MAX),
    ];
    for coll in [
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllToAll,
        Collective::Broadcast,
        Collective::Reduce,
    ] {
        v.push(run(coll, Algo::Direct, staging));
        v.push(run(coll, Algo::Nccl, usize::MAX));
    }
    v
}

/// `1K`, `64M`: the bench's size flags.
fn size_flag(n: usize) -> String {
    match n {
        n if n >= 1 << 30 && n % (1 << 30) == 0 => format!("{}G", n >> 30),
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{}M", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{}K", n >> 10),
        n => n.to_string(),
    }
}

/// Runs the bench for `run` into `json` (rank 0 writes it).
fn measure(
    run: &Run,
    ranks: usize,
    backend: BackendChoice,
    sweep: &Sweep,
    json: &Path,
) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("bench")
        .arg(run.coll.name())
        .args(["-g", &ranks.to_string()])
        .args(["-b", &size_flag(sweep.min), "-e", &size_flag(run.max_bytes)])
        .args(["-f", "4", "-n", sweep.iters, "-w", sweep.warmup])
        .args(["--algo", &run.algo.to_string()])
        .arg("--json")
        .arg(json)
        .args(["-c", "0"]);
    if backend == BackendChoice::Host {
        cmd.args(["--backend", "host"]);
    } else {
        cmd.args(["-G", "10", "--backend", "cuda"]);
    }
    // The bench's own table is not this command's output.
    let out = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .context("starting the bench")?;
    if !out.status.success() {
        bail!(
            "`ferrocomm bench {} --algo {}` failed ({}):\n{}{}",
            run.coll.name(),
            run.algo,
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// The bytes per rank the planner weighs for a bench row of `size` (nccl-tests' size: the
/// all-gather's output and the reduce-scatter's input, which hold a part per rank).
fn plan_bytes(coll: Collective, size: usize, world: usize) -> usize {
    match coll {
        Collective::AllGather | Collective::ReduceScatter => size / world.max(1),
        _ => size,
    }
}

/// Bytes per rank as the planner counts them -> µs per call (out of place) of one run's JSON.
fn read_times(json: &Path, coll: Collective, world: usize) -> anyhow::Result<BTreeMap<usize, f64>> {
    let text = std::fs::read_to_string(json).with_context(|| format!("{}", json.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text)?;
    let rows = v["rows"]
        .as_array()
        .with_context(|| format!("{}: no rows", json.display()))?;
    let mut out = BTreeMap::new();
    for r in rows {
        let (Some(size), Some(t)) = (r["size"].as_u64(), r["oop"]["time_us"].as_f64()) else {
            bail!("{}: a row without size or time: {r}", json.display());
        };
        out.insert(plan_bytes(coll, size as usize, world), t);
    }
    if out.is_empty() {
        bail!("{}: no rows", json.display());
    }
    Ok(out)
}

/// The measured times of one collective: size -> (candidate, µs) for each candidate measured.
type Times = BTreeMap<usize, Vec<(Algo, f64)>>;

/// The times of every collective measured, in the order of the runs.
type Measured = Vec<(Collective, Times)>;

/// The time of `algo` in a row.
fn time_of(row: &[(Algo, f64)], algo: Algo) -> Option<f64> {
    row.iter().find(|(a, _)| *a == algo).map(|&(_, t)| t)
}

/// The cuts of `order` (candidates by size, smallest first) over the measured sizes that lose
/// least: cut `i` is the largest size of `order[i]` (0: none of it), the last candidate takes
/// the rest. Minimizes the sum over sizes of chosen time / best time; a size where the chosen
/// candidate was not measured counts as lost badly.
fn best_cuts(times: &Times, order: &[Algo]) -> Vec<usize> {
    let sizes: Vec<usize> = times.keys().copied().collect();
    let marks: Vec<usize> = std::iter::once(0).chain(sizes.iter().copied()).collect();
    let cost = |cuts: &[usize]| -> f64 {
        sizes
            .iter()
            .map(|s| {
                let i = cuts.iter().position(|c| s <= c).unwrap_or(cuts.len());
                let row = &times[s];
                let best = row.iter().map(|&(_, t)| t).fold(f64::INFINITY, f64::min);
                time_of(row, order[i]).map_or(1e6, |t| t / best)
            })
            .sum()
    };
    // Every non-decreasing choice of cuts from the marks (a dozen sizes, three cuts at most).
    let n = order.len() - 1;
    let mut best: (f64, Vec<usize>) = (f64::INFINITY, vec![0; n]);
    let mut idx = vec![0usize; n];
    loop {
        let cuts: Vec<usize> = idx.iter().map(|&i| marks[i]).collect();
        let c = cost(&cuts);
        if c < best.0 {
            best = (c, cuts);
        }
        // The next non-decreasing index vector.
        let mut k = n;
        loop {
            if k == 0 {
                return best.1;
            }
            k -= 1;
            if idx[k] + 1 < marks.len() {
                idx[k] += 1;
                for j in k + 1..n {
                    idx[j] = idx[k];
                }
                break;
            }
        }
    }
}

/// The table in force with the measured rules for `world` ranks in front.
fn tuned_table(
    base: &Tuning,
    world: usize,
    backend: BackendChoice,
    measured: &Measured,
    about: &str,
) -> anyhow::Result<Tuning> {
    let mut t = base.clone();
    let worlds = Worlds {
        lo: world,
        hi: world,
    };
    let (push0, _, tree0) = base.all_reduce(world);
    if let Some((_, times)) = measured.iter().find(|(c, _)| *c == Collective::AllReduce) {
        let rule = if backend == BackendChoice::Host {
            let cuts = best_cuts(times, &[Algo::Flat, Algo::Tree]);
            AllReduceRule {
                worlds,
                push_max: push0.min(cuts[0]),
                flat_max: cuts[0],
                tree_max: tree0.max(cuts[0]),
                measured: about.to_string(),
            }
        } else {
            let cuts = best_cuts(times, &[Algo::Push, Algo::Flat, Algo::Tree, Algo::Nccl]);
            AllReduceRule {
                worlds,
                push_max: cuts[0],
                flat_max: cuts[1],
                tree_max: cuts[2],
                measured: about.to_string(),
            }
        };
        t.all_reduce.retain(|r| r.worlds != worlds);
        t.all_reduce.insert(0, rule);
    }
    for (coll, times) in measured {
        let coll = *coll;
        if coll == Collective::AllReduce {
            continue;
        }
        let cuts = best_cuts(times, &[Algo::Direct, Algo::Nccl]);
        let largest = *times.keys().last().expect("measured");
        let rule = DirectRule {
            collectives: vec![coll],
            worlds,
            // Direct access best up to the largest size measured: no limit of its own.
            max: (cuts[0] < largest).then_some(cuts[0]),
            measured: about.to_string(),
        };
        t.direct_max
            .retain(|r| !(r.worlds == worlds && r.collectives == vec![coll]));
        t.direct_max.insert(0, rule);
    }
    t.machine = about.to_string();
    // Through the text and back: the digest of the new rules, and the table's own checks.
    Ok(Tuning::parse(&t.to_json(), TableSource::BuiltIn)?)
}

/// What the planner picks for `coll` of `bytes` at `world` ranks under `cfg`'s table.
fn planned(
    cfg: &Config,
    backend: BackendChoice,
    coll: Collective,
    bytes: usize,
    world: usize,
) -> Algo {
    let dt = DataType::F32;
    if backend == BackendChoice::Host {
        return host_algo(coll, bytes, world, dt, Algo::Auto, cfg).unwrap_or(Algo::Direct);
    }
    let caps = Caps {
        push: true,
        nccl: true,
        staging_bytes: Some(cfg.cuda_staging_bytes),
        multi_host: false,
    };
    match select(coll, bytes, world, dt, Algo::Auto, &caps, cfg) {
        Ok(Algo::Auto) | Err(_) => Algo::Direct,
        Ok(a) => a,
    }
}

/// Prints, per collective and size, the planner's choice under `cfg` beside the measured best
/// and the margin; returns the sizes where the choice is more than `tolerance` slower.
fn report(
    cfg: &Config,
    backend: BackendChoice,
    world: usize,
    measured: &Measured,
    tolerance: f64,
) -> Vec<String> {
    let mut slow = Vec::new();
    println!(
        "{:<16} {:>10}  {:<8} {:>10}  {:<8} {:>10}  {:>7}",
        "collective", "bytes", "chosen", "us", "best", "us", "margin"
    );
    for (coll, times) in measured {
        let coll = *coll;
        for (&size, row) in times {
            let (best, best_t) = row
                .iter()
                .copied()
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .expect("a measured row");
            let chosen = planned(cfg, backend, coll, size, world);
            let chosen_t = time_of(row, chosen);
            let margin = chosen_t.map(|t| t / best_t - 1.0);
            println!(
                "{:<16} {:>10}  {:<8} {:>10}  {:<8} {:>10.2}  {:>7}",
                coll.name(),
                size,
                chosen.to_string(),
                chosen_t.map_or("-".into(), |t| format!("{t:.2}")),
                best.to_string(),
                best_t,
                margin.map_or("-".into(), |m| format!("{:+.1}%", m * 100.0))
            );
            if margin.is_none_or(|m| m > tolerance) {
                slow.push(format!(
                    "{} {size} bytes: {chosen} {} against {best} {best_t:.2} us",
                    coll.name(),
                    chosen_t.map_or("not measured".into(), |t| format!("{t:.2} us"))
                ));
            }
        }
    }
    slow
}

pub fn run(args: TuneArgs) -> anyhow::Result<i32> {
    let mut cfg = Config::from_env()?;
    let gpus = crate::info::gpu_count();
    let backend = match args.backend.as_deref() {
        Some("host") => BackendChoice::Host,
        Some("cuda") => BackendChoice::Cuda,
        None if gpus > 0 => BackendChoice::Cuda,
        None => BackendChoice::Host,
        Some(other) => bail!("--backend {other:?}: host or cuda"),
    };
    if args.ranks < 2 || args.ranks > ferrocomm::config::MAX_WORLD_SIZE {
        bail!("-g {}: tune for 2 or more ranks", args.ranks);
    }
    if backend == BackendChoice::Cuda && gpus == 0 {
        bail!("the cuda backend needs a GPU and none was found (use --backend host)");
    }
    let key = if backend == BackendChoice::Host {
        ferrocomm::tuning::host_key()
    } else {
        ferrocomm::cuda::machine_key()
    };
    cfg.use_machine_table(&key)?;
    let sweep = Sweep::new(args.short);
    let runs = runs(backend, &sweep, cfg.cuda_staging_bytes);
    let out = match (&args.check, &args.output) {
        (Some(_), _) => None,
        (None, Some(p)) => Some(p.clone()),
        (None, None) => Some(ferrocomm::tuning::machine_file(&cfg.tuning_dir, &key)),
    };
    // Where the runs' JSON is kept (resumable); a check measures afresh.
    let work = match &out {
        Some(p) => PathBuf::from(format!("{}.runs", p.display())),
        None => std::env::temp_dir().join(format!("ferrocomm-tune-check-{}", std::process::id())),
    };
    std::fs::create_dir_all(&work).with_context(|| format!("{}", work.display()))?;
    println!(
        "# ferrocomm tune: {} backend, {} ranks, {} runs ({}), sizes {} to {} bytes per rank",
        if backend == BackendChoice::Host {
            "host"
        } else {
            "cuda"
        },
        args.ranks,
        runs.len(),
        if args.short { "short" } else { "full" },
        sweep.min,
        sweep.max
    );
    if backend == BackendChoice::Cuda && args.ranks > gpus {
        println!(
            "# {} ranks share {gpus} GPU(s): these timings mean nothing for a machine of one GPU \
             per rank (a check of the mechanism only)",
            args.ranks
        );
    }
    let bar = if std::io::stderr().is_terminal() {
        indicatif::ProgressBar::new(runs.len() as u64)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} runs {elapsed} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let start = Instant::now();
    let mut measured: Measured = Vec::new();
    let mut missing = 0;
    for r in &runs {
        let json = work.join(format!("{}-{}.json", r.coll.name(), r.algo));
        bar.set_message(format!("{} {}", r.coll.name(), r.algo));
        let have = read_times(&json, r.coll, args.ranks).ok();
        let times = match have {
            Some(t) => t,
            None if start.elapsed().as_secs_f64() > args.max_minutes * 60.0 => {
                missing += 1;
                bar.inc(1);
                continue;
            }
            None => {
                measure(r, args.ranks, backend, &sweep, &json)?;
                read_times(&json, r.coll, args.ranks)?
            }
        };
        let i = match measured.iter().position(|(c, _)| *c == r.coll) {
            Some(i) => i,
            None => {
                measured.push((r.coll, Times::new()));
                measured.len() - 1
            }
        };
        for (size, t) in times {
            measured[i].1.entry(size).or_default().push((r.algo, t));
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    if missing > 0 {
        println!(
            "# stopped after {} minutes (--max-minutes) with {missing} of {} runs to go: run the \
             same command again to go on (measured runs are kept in {})",
            args.max_minutes,
            runs.len(),
            work.display()
        );
        return Ok(3);
    }
    if let Some(file) = &args.check {
        let mut checked = cfg.clone();
        checked.tuning = std::sync::Arc::new(Tuning::read(file, TableSource::Env(file.clone()))?);
        println!(
            "# the choices of {} against the measured best",
            file.display()
        );
        let slow = report(&checked, backend, args.ranks, &measured, 0.05);
        let _ = std::fs::remove_dir_all(&work);
        if slow.is_empty() {
            println!("# every choice within 5% of the best");
            return Ok(0);
        }
        println!(
            "# {} sizes where the table's choice is more than 5% slower:",
            slow.len()
        );
        for s in slow {
            println!("slower: {s}");
        }
        return Ok(1);
    }
    let out = out.expect("an output where nothing is checked");
    let about = format!(
        "ferrocomm tune -g {} ({}{}) on {}, {} ranks{}",
        args.ranks,
        if backend == BackendChoice::Host {
            "host"
        } else {
            "cuda"
        },
        if args.short { ", short" } else { "" },
        crate::info::hostname(),
        args.ranks,
        if backend == BackendChoice::Cuda && args.ranks > gpus {
            ", ranks sharing GPUs: not a measurement"
        } else {
            ""
        }
    );
    let table = tuned_table(&cfg.tuning, args.ranks, backend, &measured, &about)?;
    if let Some(d) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(d).with_context(|| format!("{}", d.display()))?;
    }
    write_private(&out, &table.to_json())?;
    let mut tuned = cfg.clone();
    tuned.tuning = std::sync::Arc::new(Tuning::read(&out, TableSource::Env(out.clone()))?);
    println!("# the planner's choice with the new table against the measured best");
    report(&tuned, backend, args.ranks, &measured, f64::INFINITY);
    let r = &tuned.tuning.all_reduce[0];
    println!(
        "# wrote {} (all_reduce at {} ranks: push <= {}, flat <= {}, tree <= {})",
        out.display(),
        args.ranks,
        r.push_max,
        r.flat_max,
        r.tree_max
    );
    Ok(0)
}

/// Writes `text` to `path` readable and writable by this user only (the table is refused
/// otherwise), through a file renamed into place.
fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let tmp = PathBuf::from(format!("{}.tmp{}", path.display(), std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("{}", tmp.display()))?;
    f.write_all(text.as_bytes())?;
    drop(f);
    std::fs::rename(&tmp, path).with_context(|| format!("{}", path.display()))?;
    Ok(())
}
