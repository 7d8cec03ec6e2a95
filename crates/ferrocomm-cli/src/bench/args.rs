//! Command-line flags of `ferrocomm bench` (nccl-tests' spelling) and their validation into a
//! [`Plan`], before any rank starts.

use std::path::PathBuf;
use std::str::FromStr;

use anyhow::{bail, Context};
use ferrocomm::config::{parse_size, BackendChoice};
use ferrocomm::{Algo, DataType, Format, ReduceOp};

use super::sizes::{self, Coll};

/// Benchmark a collective; flags follow nccl-tests (`all_reduce_perf -b 8 -e 128M -f 2 -g 2`).
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// all_reduce, all_reduce_rmsnorm, all_gather, reduce_scatter, all_to_all, all_to_all_v,
    /// device_alltoallv, broadcast, reduce, sendrecv or put (one-sided puts with signals in a
    /// ring).
    pub collective: String,
    /// Smallest size in bytes (K, M, G are powers of 1024).
    #[arg(short = 'b', long = "minbytes", default_value = "32M")]
    pub minbytes: String,
    /// Largest size in bytes.
    #[arg(short = 'e', long = "maxbytes", default_value = "32M")]
    pub maxbytes: String,
    /// Multiply the size by this factor at each step (wins over -i when above 1).
    #[arg(short = 'f', long = "stepfactor")]
    pub stepfactor: Option<u64>,
    /// Add this many bytes at each step (when no factor is given).
    #[arg(short = 'i', long = "stepbytes")]
    pub stepbytes: Option<String>,
    /// Operations per measurement.
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    pub iters: usize,
    /// Warm-up operations before measuring each size.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 5)]
    pub warmup: usize,
    /// Reduction: sum, prod, min, max, avg, or all.
    #[arg(short = 'o', long = "op", default_value = "sum")]
    pub op: String,
    /// Element type: float, half, bfloat16, double, int8, ..., or all.
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    pub dtype: String,
    /// Root of broadcast and reduce: a rank, or all.
    #[arg(short = 'r', long = "root", default_value = "0")]
    pub root: String,
    /// Check results (1) or not (0).
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    pub check: u8,
    /// Wait for each operation to finish before starting the next (GPU; host calls block anyway).
    #[arg(short = 'z', long = "blocking", default_value_t = 0)]
    pub blocking: u8,
    /// CUDA graph mode: capture this many operations in one graph and replay it (0 = eager).
    #[arg(short = 'G', long = "cudagraph", default_value_t = 0)]
    pub graph: usize,
    /// Ranks to start (one process per GPU; on the host backend, processes).
    #[arg(short = 'g', long = "ngpus")]
    pub ranks: Option<usize>,
    /// Time single isolated operations (barrier, one operation, max over ranks).
    #[arg(long)]
    pub isolated: bool,
    /// Measurements per size (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Start each measurement on every host as it leaves the barrier. By default a GPU
    /// measurement starts where the ranks leave a one-element all-reduce on their streams
    /// (issued after the barrier, not timed), so the hosts' start skew is not counted.
    #[arg(long)]
    pub host_start: bool,
    /// Algorithm: auto, push, flat, tree, direct or nccl.
    #[arg(long, default_value = "auto")]
    pub algo: String,
    /// Run NCCL in the same run, size by size, and show our time over NCCL's.
    #[arg(long)]
    pub vs: Option<String>,
    /// Block-scaled low-precision wire format: e4m3, e5m2 or int8.
    #[arg(long = "low-precision")]
    pub low_precision: Option<String>,
    /// Backend: auto (cuda when a GPU is present, host otherwise), host, cuda or nccl.
    #[arg(long)]
    pub backend: Option<String>,
    /// Write every row and the run's context as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Draw time and bus bandwidth against size to this PNG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// all_reduce_rmsnorm: elements per row (a multiple of 8; every size a whole number of
    /// rows). Default 4096.
    #[arg(long)]
    pub hidden: Option<usize>,
    /// Seed of the random inputs (each rank derives its own stream from it).
    #[arg(long, default_value_t = 0x5eed)]
    pub seed: u64,
    /// Marks a rank started by `-g` (the parent passes it; not for users).
    #[arg(long, hide = true)]
    pub as_rank: bool,
    /// Test hook: perturbs one output element on the last rank after each checked run.
    #[arg(long, hide = true)]
    pub debug_corrupt: bool,
}

/// Timing mode of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// `iters` back-to-back launches timed together (nccl-tests' way).
    Eager,
    /// `ops` operations captured in one CUDA graph, replayed `iters` times.
    Graph { ops: usize },
    /// A barrier, then one timed operation; the slowest rank's time.
    Isolated,
}

impl Mode {
    pub fn describe(&self) -> String {
        match self {
            Mode::Eager => "eager".into(),
            Mode::Graph { ops } => format!("graph ({ops} ops per graph)"),
            Mode::Isolated => "isolated".into(),
        }
    }
}

/// Everything a rank needs to run the benchmark, validated.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Plan {
    pub coll: Coll,
    pub sizes: Vec<usize>,
    pub min_bytes: usize,
    pub max_bytes: usize,
    pub step: Step,
    /// The JSON writes these by the rows' names (`float`, `sum`), the ops for reducing
    /// collectives only (see `json::PlanJson`).
    #[serde(skip)]
    pub dtypes: Vec<DataType>,
    #[serde(skip)]
    pub ops: Vec<ReduceOp>,
    /// `None`: every rank in turn (`-r all`).
    pub root: Option<usize>,
    pub iters: usize,
    pub warmup: usize,
    pub reps: usize,
    pub check: bool,
    pub blocking: bool,
    pub mode: Mode,
    /// GPU measurements start after a device-side line-up (not `--host-start`). Asked for, not
    /// what happened (the host backend has no device): the JSON writes the start in effect.
    #[serde(skip)]
    pub device_start: bool,
    pub algo: Algo,
    pub vs_nccl: bool,
    pub low_precision: Option<Format>,
    pub backend: Option<BackendChoiceName>,
    pub ranks: Option<usize>,
    pub seed: u64,
    /// all_reduce_rmsnorm: elements per row (0 for the other collectives).
    pub hidden: usize,
    pub json: Option<PathBuf>,
    pub plot: Option<PathBuf>,
    pub corrupt: bool,
}

/// Size step of the sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Step {
    Factor(u64),
    Bytes(usize),
}

/// A backend choice that can be printed and serialized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoiceName {
    Auto,
    Host,
    Cuda,
    Nccl,
}

impl BackendChoiceName {
    pub fn choice(self) -> BackendChoice {
        match self {
            BackendChoiceName::Auto => BackendChoice::Auto,
            BackendChoiceName::Host => BackendChoice::Host,
            BackendChoiceName::Cuda => BackendChoice::Cuda,
            BackendChoiceName::Nccl => BackendChoice::Nccl,
        }
    }
}

/// Reduction ops `-o all` expands to (nccl-tests' list).
pub const ALL_OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Prod,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::Avg,
];

impl BenchArgs {
    /// Checks every flag and expands sizes, dtypes, ops and roots.
    pub fn plan(&self) -> anyhow::Result<Plan> {
        let coll = Coll::from_str(&self.collective)?;
        let min_bytes = parse_size(&self.minbytes).map_err(|e| anyhow::anyhow!("-b: {e}"))?;
        let max_bytes = parse_size(&self.maxbytes).map_err(|e| anyhow::anyhow!("-e: {e}"))?;
        if min_bytes == 0 {
            bail!("-b: the smallest size must be at least one element, not 0 bytes");
        }
        if min_bytes > max_bytes {
            bail!("-b {min_bytes} is larger than -e {max_bytes}");
        }
        let step = match (self.stepfactor, &self.stepbytes) {
            (Some(_), Some(_)) => bail!("give -f (step factor) or -i (step bytes), not both"),
            (Some(f), None) if f >= 2 => Step::Factor(f),
            (Some(1), None) | (None, None) => Step::Bytes(1 << 20),
            (Some(f), None) => bail!("-f {f}: the step factor must be 1 or more"),
            (None, Some(s)) => {
                let b = parse_size(s).map_err(|e| anyhow::anyhow!("-i: {e}"))?;
                if b == 0 && min_bytes != max_bytes {
                    bail!("-i 0 would never reach -e");
                }
                Step::Bytes(b)
            }
        };
        let sizes = sizes::sweep(min_bytes, max_bytes, step);
        let dtypes = parse_list(
            &self.dtype,
            "-d",
            || DataType::ALL.to_vec(),
            |s| DataType::from_str(s).map_err(|e| anyhow::anyhow!("{e}")),
        )?;
        let ops = if coll.reduces() {
            parse_list(
                &self.op,
                "-o",
                || ALL_OPS.to_vec(),
                |s| {
                    let op = ReduceOp::from_str(s).map_err(|e| anyhow::anyhow!("{e}"))?;
                    if !ALL_OPS.contains(&op) {
                        bail!("-o {s}: the bench runs sum, prod, min, max and avg");
                    }
                    Ok(op)
                },
            )?
        } else {
            // Data-movement collectives have no operator (nccl-tests prints "none").
            vec![ReduceOp::Sum]
        };
        for &d in &dtypes {
            for &op in &ops {
                if coll.reduces() {
                    op.check(d, coll.name())
                        .with_context(|| format!("-o {} -d {}", op.name(), d.name()))?;
                }
            }
        }
        let root = match self.root.trim() {
            "all" | "-1" => None,
            r => Some(
                r.parse::<usize>()
                    .map_err(|_| anyhow::anyhow!("-r {r}: expected a rank or 'all'"))?,
            ),
        };
        if self.check > 1 {
            bail!("-c {}: expected 0 or 1", self.check);
        }
        if self.blocking > 1 {
            bail!("-z {}: expected 0 or 1", self.blocking);
        }
        if self.iters == 0 {
            bail!("-n 0: at least one iteration is needed to time anything");
        }
        if self.reps == 0 {
            bail!("--reps 0: at least one measurement is needed");
        }
        let mode = match (self.graph, self.isolated) {
            (0, false) => Mode::Eager,
            (0, true) => Mode::Isolated,
            (n, false) => Mode::Graph { ops: n },
            (_, true) => bail!("-G (graph) and --isolated are different timing modes: pick one"),
        };
        let algo = Algo::from_str(&self.algo).map_err(|e| anyhow::anyhow!("--algo: {e}"))?;
        let vs_nccl = match self.vs.as_deref() {
            None => false,
            Some("nccl") => true,
            Some(other) => bail!("--vs {other}: only 'nccl' can be compared against"),
        };
        if vs_nccl && algo == Algo::Nccl {
            bail!("--vs nccl with --algo nccl would compare NCCL with itself");
        }
        let low_precision = self
            .low_precision
            .as_deref()
            .map(|s| Format::from_str(s).map_err(|e| anyhow::anyhow!("--low-precision: {e}")))
            .transpose()?;
        let backend = self
            .backend
            .as_deref()
            .map(|s| match BackendChoice::from_str(s) {
                Ok(BackendChoice::Auto) => Ok(BackendChoiceName::Auto),
                Ok(BackendChoice::Host) => Ok(BackendChoiceName::Host),
                Ok(BackendChoice::Cuda) => Ok(BackendChoiceName::Cuda),
                Ok(BackendChoice::Nccl) => Ok(BackendChoiceName::Nccl),
                Err(e) => Err(anyhow::anyhow!("--backend {s}: {e}")),
            })
            .transpose()?;
        if self.ranks == Some(0) {
            bail!("-g 0: at least one rank is needed");
        }
        let hidden = match (coll, self.hidden) {
            (Coll::AllReduceRmsNorm, h) => {
                let h = h.unwrap_or(4096);
                if h == 0 || h % 8 != 0 {
                    bail!("--hidden {h}: the row length must be a positive multiple of 8");
                }
                if let Some(d) = dtypes
                    .iter()
                    .find(|d| !matches!(d, DataType::F32 | DataType::F16 | DataType::BF16))
                {
                    bail!("-d {d}: all_reduce_rmsnorm runs float, half and bfloat16 rows");
                }
                h
            }
            (_, Some(h)) => bail!("--hidden {h}: only all_reduce_rmsnorm has rows"),
            (_, None) => 0,
        };
        if coll == Coll::AllReduceRmsNorm {
            // Whole rows at every size, before any rank starts.
            for &d in &dtypes {
                for &s in &sizes {
                    sizes::Shape::of_run(coll, s, d, 1, hidden)?;
                }
            }
        }
        if let Some(p) = &self.plot {
            if p.extension().and_then(|e| e.to_str()) != Some("png") {
                bail!(
                    "--plot {}: the plot is a PNG file (name it *.png)",
                    p.display()
                );
            }
        }
        Ok(Plan {
            coll,
            sizes,
            min_bytes,
            max_bytes,
            step,
            dtypes,
            ops,
            root,
            iters: self.iters,
            warmup: self.warmup,
            reps: self.reps,
            check: self.check == 1,
            blocking: self.blocking == 1,
            mode,
            device_start: !self.host_start,
            algo,
            vs_nccl,
            low_precision,
            backend,
            ranks: self.ranks,
            seed: self.seed,
            hidden,
            json: self.json.clone(),
            plot: self.plot.clone(),
            corrupt: self.debug_corrupt,
        })
    }
}

impl Plan {
    /// Checks what depends on the number of ranks: roots in range, every size divisible where
    /// the collective splits buffers into per-rank parts.
    pub fn check_world(&self, world: usize) -> anyhow::Result<()> {
        if let Some(r) = self.root {
            if self.coll.rooted() && r >= world {
                bail!("-r {r}: the root must be below the number of ranks ({world})");
            }
        }
        if matches!(self.coll, Coll::SendRecv | Coll::Put) && world < 2 {
            bail!("{} needs at least 2 ranks (-g 2)", self.coll.name());
        }
        for &d in &self.dtypes {
            for &s in &self.sizes {
                sizes::Shape::of_run(self.coll, s, d, world, self.hidden)?;
            }
        }
        Ok(())
    }

    /// Roots to run for this world size (`[-1]`-like single entry for unrooted collectives).
    pub fn roots(&self, world: usize) -> Vec<usize> {
        if !self.coll.rooted() {
            return vec![0];
        }
        match self.root {
            Some(r) => vec![r],
            None => (0..world).collect(),
        }
    }
}

fn parse_list<T>(
    text: &str,
    flag: &str,
    all: impl Fn() -> Vec<T>,
    one: impl Fn(&str) -> anyhow::Result<T>,
) -> anyhow::Result<Vec<T>> {
    let t = text.trim();
    if t.eq_ignore_ascii_case("all") {
        return Ok(all());
    }
    t.split(',')
        .map(|s| one(s.trim()).with_context(|| format!("{flag} {text}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn parse(line: &str) -> anyhow::Result<Plan> {
        let argv = std::iter::once("bench").chain(line.split_whitespace());
        Cli::try_parse_from(argv)?.args.plan()
    }

    #[test]
    fn sizes_follow_nccl_tests() {
        let p = parse("all_reduce -b 1K -e 64M -f 2").unwrap();
        assert_eq!(p.sizes.first(), Some(&1024));
        assert_eq!(p.sizes.last(), Some(&(64 << 20)));
        assert_eq!(p.sizes.len(), 17);
        let p = parse("all_reduce -b 1M -e 4M -i 1M").unwrap();
        assert_eq!(p.sizes, vec![1 << 20, 2 << 20, 3 << 20, 4 << 20]);
        let p = parse("all_reduce -b 8 -e 8").unwrap();
        assert_eq!(p.sizes, vec![8]);
        assert_eq!(parse("all_reduce").unwrap().sizes, vec![32 << 20]);
    }

    #[test]
    fn flags_map_to_the_plan() {
        let p = parse(
            "reduce -b 64 -e 64 -n 7 -w 3 -o max -d bfloat16 -r 1 -c 0 -z 1 --algo tree \
             --low-precision e5m2 -g 4",
        )
        .unwrap();
        assert_eq!(p.coll, Coll::Reduce);
        assert_eq!((p.iters, p.warmup), (7, 3));
        assert_eq!(p.ops, vec![ReduceOp::Max]);
        assert_eq!(p.dtypes, vec![DataType::BF16]);
        assert_eq!(p.root, Some(1));
        assert!(!p.check && p.blocking);
        assert_eq!(p.algo, Algo::Tree);
        assert_eq!(p.low_precision, Some(Format::E5M2));
        assert_eq!(p.ranks, Some(4));
        assert_eq!(p.mode, Mode::Eager);
        assert_eq!(
            parse("all_reduce -G 10").unwrap().mode,
            Mode::Graph { ops: 10 }
        );
        assert_eq!(parse("all_reduce --isolated").unwrap().mode, Mode::Isolated);
    }

    #[test]
    fn all_expands() {
        let p = parse("all_reduce -o all -d all -r all").unwrap();
        assert_eq!(p.ops.len(), 5);
        assert_eq!(p.dtypes.len(), DataType::ALL.len());
        assert_eq!(p.roots(3), vec![0]);
        let p = parse("broadcast -r all").unwrap();
        assert_eq!(p.roots(3), vec![0, 1, 2]);
        // Data movement ignores -o.
        assert_eq!(parse("all_gather -o max").unwrap().ops, vec![ReduceOp::Sum]);
        let p = parse("all_reduce -d float,half").unwrap();
        assert_eq!(p.dtypes, vec![DataType::F32, DataType::F16]);
    }

    fn err(line: &str) -> String {
        format!("{:#}", parse(line).unwrap_err())
    }

    #[test]
    fn bad_input_is_refused_with_a_reason() {
        assert!(err("all_scatter").contains("unknown collective"));
        assert!(err("all_reduce -d complex").contains("unknown dtype"));
        assert!(err("all_reduce -o xor").contains("unknown reduce op"));
        assert!(err("all_reduce -b 2M -e 1M").contains("larger than -e"));
        assert!(err("all_reduce -b 1Q").contains("-b"));
        assert!(err("all_reduce -f 2 -i 1M").contains("not both"));
        assert!(err("all_reduce -G 4 --isolated").contains("pick one"));
        assert!(err("all_reduce --algo ring").contains("unknown algorithm"));
        assert!(err("all_reduce --vs gloo").contains("only 'nccl'"));
        assert!(err("all_reduce --low-precision e3m4").contains("low-precision"));
        assert!(err("all_reduce -c 2").contains("-c"));
        assert!(err("all_reduce -g 0").contains("-g 0"));
        assert!(err("all_reduce --plot out.svg").contains("PNG"));
        assert!(err("broadcast -r one").contains("-r one"));
        assert!(err("all_reduce --bogus").contains("--bogus"));
    }

    #[test]
    fn rmsnorm_rows_come_from_hidden() {
        let p =
            parse("all_reduce_rmsnorm -b 8K -e 32K -f 2 -d bfloat16,float --hidden 1024").unwrap();
        assert_eq!((p.coll, p.hidden), (Coll::AllReduceRmsNorm, 1024));
        let s = sizes::Shape::of_run(p.coll, 8192, DataType::BF16, 2, p.hidden).unwrap();
        // Input: 4096 elements of rows, as many of residual, the weight; output rows + residual.
        assert_eq!((s.count, s.in_count, s.out_count), (4096, 9216, 8192));
        assert_eq!(
            parse("all_reduce_rmsnorm -b 8K -e 8K -d bfloat16")
                .unwrap()
                .hidden,
            4096
        );
        assert!(err("all_reduce_rmsnorm -b 8K -e 8K --hidden 12").contains("multiple of 8"));
        assert!(err("all_reduce_rmsnorm -b 8K -e 8K -d int32").contains("float, half and"));
        assert!(err("all_reduce_rmsnorm -b 1000 -e 1000 --hidden 8").contains("rows of"));
        assert!(err("all_reduce -b 8K -e 8K --hidden 8").contains("only all_reduce_rmsnorm"));
    }

    #[test]
    fn world_dependent_checks() {
        let p = parse("all_gather -b 1K -e 4K -f 2").unwrap();
        assert!(p.check_world(2).is_ok());
        let e = format!("{:#}", p.check_world(3).unwrap_err());
        assert!(e.contains("1024") && e.contains("3 ranks"), "{e}");
        let p = parse("reduce -r 2").unwrap();
        assert!(format!("{:#}", p.check_world(2).unwrap_err()).contains("-r 2"));
        assert!(p.check_world(4).is_ok());
        assert!(parse("sendrecv").unwrap().check_world(1).is_err());
        let e = format!("{:#}", parse("put").unwrap().check_world(1).unwrap_err());
        assert!(e.contains("put needs at least 2 ranks"), "{e}");
        assert!(parse("put").unwrap().check_world(2).is_ok());
        // 6 bytes is no whole number of doubles.
        let p = parse("all_reduce -b 6 -e 6 -d double").unwrap();
        assert!(format!("{:#}", p.check_world(1).unwrap_err()).contains("double"));
    }
}
