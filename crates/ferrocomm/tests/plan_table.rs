//! The planner's decisions as a table: every collective, every world from 1 to 16, sizes on
//! both sides of every threshold, every override (per call and from the environment), for the
//! capabilities of each backend. The table is compared with `tests/plan_table.golden`, recorded
//! from the decisions as they stood, so that moving or reshaping the planner is shown to change
//! no decision. A decision that changes on purpose is recorded again with
//! `FERROCOMM_BLESS=1 cargo test -p ferrocomm --test plan_table` (refused when `CI` is set),
//! which prints what changed and fails once, and is reviewed in the diff.

use std::fmt::Write;

use ferrocomm::config::Config;
use ferrocomm::plan::{
    a2av_form, cuda_all_reduce, cuda_call_plan, cuda_collective, cuda_rmsnorm, cuda_rmsnorm_plan,
    flat_form, low_precision, lp_a2av_form, lp_all_reduce, lp_form, part_form, select, CallShape,
    Caps, CudaCaps, DdaCaps, LowPrecisionChoice, LpForm, LpKind, Operands, Plan,
};
use ferrocomm::quant::Codec;
use ferrocomm::tuning::Tuning;
use ferrocomm::{Algo, Collective, DataType, Format, ReduceOp};

/// The configuration the settings `set` (name, value) give, nothing else read.
fn config_of(set: &[(&str, &str)]) -> Config {
    Config::from_lookup(|k| {
        set.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    })
    .expect("the table's settings parse")
}

/// Sizes on both sides of every threshold (defaults, the overrides below, the stagings).
fn sizes() -> Vec<usize> {
    let marks = [
        1usize << 10,
        2 << 20,
        16 << 10,
        32 << 10,
        64 << 10,
        256 << 10,
        512 << 10,
        1 << 20,
        4 << 20,
        8 << 20,
        16 << 20,
        32 << 20,
        64 << 20,
    ];
    let mut s = vec![0, 1, 1 << 40];
    for m in marks {
        s.extend([m - 1, m, m + 1]);
    }
    s.sort_unstable();
    s.dedup();
    s
}

fn caps() -> Vec<(&'static str, Caps)> {
    let cuda = Caps {
        push: true,
        nccl: true,
        staging_bytes: Some(64 << 20),
        multi_host: false,
    };
    vec![
        ("cuda", cuda),
        (
            "cuda-staging-8m",
            Caps {
                staging_bytes: Some(8 << 20),
                ..cuda
            },
        ),
        (
            "cuda-unbounded",
            Caps {
                staging_bytes: None,
                ..cuda
            },
        ),
        (
            "cuda-no-nccl",
            Caps {
                nccl: false,
                ..cuda
            },
        ),
        (
            "host",
            Caps {
                push: false,
                nccl: false,
                staging_bytes: None,
                multi_host: false,
            },
        ),
        (
            "nccl-multi-host",
            Caps {
                push: false,
                nccl: true,
                staging_bytes: None,
                multi_host: true,
            },
        ),
    ]
}

/// Configurations from environment variables (name, settings).
fn configs() -> Vec<(String, Config)> {
    let mut sets: Vec<Vec<(&str, &str)>> = vec![vec![]];
    for a in ["push", "flat", "tree", "direct", "nccl"] {
        sets.push(vec![("FERROCOMM_ALGO", a)]);
    }
    sets.push(vec![
        ("FERROCOMM_ALLREDUCE_PUSH_MAX_BYTES", "1K"),
        ("FERROCOMM_ALLREDUCE_FLAT_MAX_BYTES", "2M"),
        ("FERROCOMM_ALLREDUCE_TREE_MAX_BYTES", "16M"),
    ]);
    sets.push(vec![("FERROCOMM_ALLREDUCE_PUSH_MAX_BYTES", "0")]);
    for v in [
        "FERROCOMM_ALLGATHER_MAX_BYTES",
        "FERROCOMM_REDUCESCATTER_MAX_BYTES",
        "FERROCOMM_ALLTOALL_MAX_BYTES",
        "FERROCOMM_BROADCAST_MAX_BYTES",
        "FERROCOMM_P2P_MAX_BYTES",
    ] {
        sets.push(vec![(v, "1M")]);
    }
    sets.push(vec![("FERROCOMM_P2P_MAX_BYTES", "0")]);
    sets.into_iter()
        .map(|set| {
            let name = if set.is_empty() {
                "default".to_string()
            } else {
                set.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            };
            let cfg = config_of(&set);
            (name, cfg)
        })
        .collect()
}

/// Consecutive sizes with the same answer, as `lo..hi answer` (the last open-ended).
fn runs(sizes: &[usize], answer: impl Fn(usize) -> String) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut start = 0;
    let answers: Vec<String> = sizes.iter().map(|&s| answer(s)).collect();
    for i in 1..=sizes.len() {
        if i == sizes.len() || answers[i] != answers[start] {
            let hi = if i == sizes.len() {
                String::new()
            } else {
                sizes[i - 1].to_string()
            };
            out.push(format!("{}..{hi} {}", sizes[start], answers[start]));
            start = i;
        }
    }
    out.join(", ")
}

/// Lines `head worlds: runs`, worlds with the same runs grouped.
fn by_world(t: &mut String, head: &str, row: impl Fn(usize) -> String) {
    let mut groups: Vec<(usize, usize, String)> = Vec::new();
    for world in 1..=16 {
        let r = row(world);
        match groups.last_mut() {
            Some((_, hi, last)) if *last == r => *hi = world,
            _ => groups.push((world, world, r)),
        }
    }
    for (lo, hi, r) in groups {
        writeln!(t, "{head} w{lo}-{hi}: {r}").expect("writing to a string");
    }
}

fn algo_text(r: ferrocomm::Result<Algo>) -> String {
    match r {
        Ok(a) => a.name().to_string(),
        Err(_) => "refused".to_string(),
    }
}

fn algorithm_table() -> String {
    let sizes = sizes();
    let mut t = String::new();
    let configs = configs();
    for (cname, caps) in caps() {
        for (fname, cfg) in &configs {
            // The per-call requests with the default configuration; automatic choice with
            // every configuration.
            let requests: &[Algo] = if fname == "default" {
                &Algo::ALL
            } else {
                &Algo::ALL[..1]
            };
            for &req in requests {
                for coll in Collective::ALL {
                    let head = format!("{cname} {fname} {req} {}", coll.name());
                    by_world(&mut t, &head, |world| {
                        runs(&sizes, |bytes| {
                            algo_text(select(coll, bytes, world, DataType::BF16, req, &caps, cfg))
                        })
                    });
                }
            }
        }
    }
    t
}

/// The cuda backend's direct access as a two-rank communicator has it by default (but a push
/// cap of 64 KiB), and with the copy engines and LL128 lines on.
fn dda_caps() -> Vec<(&'static str, DdaCaps)> {
    let base = DdaCaps {
        staging_bytes: 64 << 20,
        push_cap: 64 << 10,
        ce_bytes: 0,
        ce_min: None,
        ll128_cap: 0,
        ll128_links: false,
        ll_max: 256 << 10,
        a2av_lp: true,
    };
    vec![
        ("dda", base),
        (
            "dda-staging-8m",
            DdaCaps {
                staging_bytes: 8 << 20,
                ..base
            },
        ),
        (
            "dda-ce",
            DdaCaps {
                ce_bytes: 64 << 20,
                ce_min: Some(4 << 20),
                ..base
            },
        ),
        (
            "dda-ll128",
            DdaCaps {
                ll128_cap: 16 << 20,
                ll128_links: true,
                ..base
            },
        ),
        (
            "dda-ll128-pcie",
            DdaCaps {
                ll128_cap: 16 << 20,
                ..base
            },
        ),
    ]
}

/// A communicator of `world` ranks on the cuda backend with `dda` (direct access) and NCCL
/// where `nccl`, whose reduction kernels take `kernels`.
fn cuda_caps(world: usize, dda: Option<DdaCaps>, nccl: bool, kernels: &[DataType]) -> CudaCaps<'_> {
    CudaCaps {
        world,
        dda,
        no_dda: "off",
        nccl,
        no_nccl: "absent",
        multi_host: false,
        kernel_dtypes: kernels,
    }
}

/// Lines `head collective worlds: runs` of the cuda backend's choice for every collective but
/// the all-reduce and the barrier (bf16, a Sum for the reductions), on `cuda` under `cfg`.
fn collective_rows<'k>(
    t: &mut String,
    head: &str,
    cuda: &dyn Fn(usize) -> CudaCaps<'k>,
    cfg: &Config,
    req: Algo,
) {
    let sizes = sizes();
    for coll in Collective::ALL {
        if matches!(coll, Collective::AllReduce | Collective::Barrier) {
            continue;
        }
        let op =
            matches!(coll, Collective::Reduce | Collective::ReduceScatter).then_some(ReduceOp::Sum);
        by_world(t, &format!("{head} {}", coll.name()), |world| {
            runs(&sizes, |bytes| {
                let part = match coll {
                    Collective::AllToAll | Collective::AllToAllV => bytes / world,
                    _ => bytes,
                };
                let (c, dt) = (cuda(world), DataType::BF16);
                algo_text(cuda_collective(&c, cfg, coll, bytes, part, dt, op, req))
            })
        });
    }
}

fn cuda_table() -> String {
    let sizes = sizes();
    let mut t = String::new();
    let cfg = Config::default();
    let kernels = [DataType::F32, DataType::F16, DataType::BF16, DataType::I32];
    let mut variants: Vec<(String, Option<DdaCaps>, bool)> = Vec::new();
    for (name, d) in dda_caps() {
        variants.push((name.to_string(), Some(d), true));
    }
    variants.push(("dda-no-nccl".into(), Some(dda_caps()[0].1), false));
    variants.push(("no-dda".into(), None, true));
    variants.push(("no-dda-no-nccl".into(), None, false));
    for (name, dda, nccl) in &variants {
        let cuda = |world| cuda_caps(world, *dda, *nccl, &kernels);
        for req in Algo::ALL {
            for (dtype, op) in [
                (DataType::BF16, ReduceOp::Sum),
                (DataType::F8E4M3, ReduceOp::Sum),
                (DataType::I32, ReduceOp::BitAnd),
            ] {
                let head = format!("{name} {req} all_reduce {dtype} {op}");
                by_world(&mut t, &head, |world| {
                    runs(&sizes, |bytes| {
                        algo_text(cuda_all_reduce(&cuda(world), &cfg, bytes, dtype, op, req))
                    })
                });
            }
            if !matches!(req, Algo::Auto | Algo::Direct | Algo::Nccl) {
                continue;
            }
            collective_rows(&mut t, &format!("{name} {req}"), &cuda, &cfg, req);
        }
        if let Some(d) = dda {
            let r = runs(&sizes, |bytes| flat_form(d, bytes).kernel().to_string());
            writeln!(t, "{name} flat form: {r}").expect("writing to a string");
            for kernel in [
                "all_gather",
                "reduce_scatter",
                "all_to_all",
                "broadcast",
                "reduce",
            ] {
                let r = runs(&sizes, |bytes| {
                    let (form, rounds) = part_form(&Tuning::builtin(), kernel, bytes, d.ll_max);
                    format!("{form}x{rounds}")
                });
                writeln!(t, "{name} {kernel} part form: {r}").expect("writing to a string");
            }
            // The all-to-all-v's form (its size counts `world` of its largest crossing part).
            let head = format!("{name} all_to_all_v form");
            by_world(&mut t, &head, |world| {
                runs(&sizes, |bytes| {
                    a2av_form(world, bytes / world, d.ll_max).to_string()
                })
            });
            // Low precision (e4m3, blocks of 128, bf16): push or pull, split, the kernels of
            // the whole chunks and of the last launch, and the launches.
            let e4 = Codec::new(Format::E4M3, 128).expect("a codec");
            let lp_text = |r: ferrocomm::Result<LpForm>, part: usize| match r {
                Ok(f) => format!(
                    "{:?}{} {}/{} x{}",
                    f.moves,
                    if f.split { "-split" } else { "" },
                    f.kernel,
                    f.last_kernel,
                    if f.chunk == 0 {
                        0
                    } else {
                        part.div_ceil(f.chunk)
                    }
                ),
                Err(_) => "refused".to_string(),
            };
            for kind in [
                LpKind::Flat,
                LpKind::Tree,
                LpKind::AllGather,
                LpKind::ReduceScatter,
                LpKind::AllToAll,
            ] {
                let head = format!("{name} low-precision {kind:?} form");
                by_world(&mut t, &head, |world| {
                    runs(&sizes, |bytes| {
                        // One rank's part in elements (the all-to-all counts its whole output).
                        let part = match kind {
                            LpKind::AllToAll => bytes / world / 2,
                            _ => bytes / 2,
                        };
                        let r = lp_form(kind, part, 2, world, &e4, d, &Tuning::builtin());
                        lp_text(r, part)
                    })
                });
            }
            let r = runs(&sizes, |bytes| {
                let part = bytes / 2 / 2;
                lp_text(Ok(lp_a2av_form(part, &e4, d.staging_bytes)), part.max(1))
            });
            writeln!(t, "{name} low-precision AllToAllV form w2: {r}")
                .expect("writing to a string");
        }
    }
    for req in Algo::ALL {
        for cfg_algo in Algo::ALL {
            let r: Vec<String> = (1..=16)
                .map(|w| lp_all_reduce(req, cfg_algo, w).name().to_string())
                .collect();
            writeln!(
                t,
                "low-precision all_reduce {req} (configured {cfg_algo}): {}",
                r.join(" ")
            )
            .expect("writing to a string");
        }
    }
    t
}

/// The cuda backend's choices under each configuration of [`configs`] (automatic choice, and a
/// per-call request of the algorithm the environment forces), on direct access as a two-rank
/// communicator has it, with a small staging, and without direct access.
fn cuda_settings_table() -> String {
    let sizes = sizes();
    let mut t = String::new();
    let kernels = [DataType::F32, DataType::F16, DataType::BF16, DataType::I32];
    let mut variants: Vec<(&str, Option<DdaCaps>, bool)> = dda_caps()[..2]
        .iter()
        .map(|&(n, d)| (n, Some(d), true))
        .collect();
    variants.push(("dda-no-nccl", Some(dda_caps()[0].1), false));
    variants.push(("no-dda", None, true));
    for (fname, cfg) in configs().iter().skip(1) {
        for (name, dda, nccl) in &variants {
            let cuda = |world| cuda_caps(world, *dda, *nccl, &kernels);
            let mut requests = vec![Algo::Auto];
            if cfg.algo != Algo::Auto {
                requests.push(cfg.algo);
            }
            for req in requests {
                let head = format!("{fname} {name} {req} all_reduce");
                by_world(&mut t, &head, |world| {
                    runs(&sizes, |bytes| {
                        let (dt, sum) = (DataType::BF16, ReduceOp::Sum);
                        algo_text(cuda_all_reduce(&cuda(world), cfg, bytes, dt, sum, req))
                    })
                });
                collective_rows(&mut t, &format!("{fname} {name} {req}"), &cuda, cfg, req);
            }
        }
    }
    t
}

/// The whole plan of a call on the cuda backend (its path and the forms the path does not
/// name), for every collective and operand kind, request and low-precision choice, and of an
/// all_reduce_rmsnorm (rows of 4096 bf16, or one row where the size is not whole rows).
fn cuda_plan_table() -> String {
    let sizes = sizes();
    let mut t = String::new();
    let kernels = [DataType::F32, DataType::F16, DataType::BF16, DataType::I32];
    let mut variants: Vec<(&str, Option<DdaCaps>, bool)> = dda_caps()
        .iter()
        .map(|&(n, d)| (n, Some(d), true))
        .collect();
    variants.push(("dda-no-nccl", Some(dda_caps()[0].1), false));
    variants.push(("no-dda", None, true));
    let plan_text = |r: ferrocomm::Result<Plan>| match r {
        Ok(p) => match p.detail() {
            d if d.is_empty() => p.to_string(),
            d => format!("{p} [{d}]"),
        },
        Err(_) => "refused".to_string(),
    };
    let choices = [
        ("default", LowPrecisionChoice::Default),
        ("e4m3", LowPrecisionChoice::On(Format::E4M3)),
    ];
    let fused = Config::from_lookup(|k| (k == "FERROCOMM_RMSNORM_FUSED").then(|| "1".into()))
        .expect("the setting parses");
    let default = Config::default();
    for (name, dda, nccl) in &variants {
        let cuda = |world| cuda_caps(world, *dda, *nccl, &kernels);
        for req in [Algo::Auto, Algo::Push, Algo::Tree, Algo::Direct, Algo::Nccl] {
            for (chname, choice) in choices {
                for coll in Collective::ALL {
                    let mut operands = vec![("plain", Operands::Plain, true)];
                    if coll == Collective::AllReduce {
                        operands.push(("unaligned", Operands::Plain, false));
                    }
                    if matches!(coll, Collective::Send | Collective::Recv) {
                        operands.push(("to-self", Operands::ToSelf, true));
                    }
                    if coll == Collective::AllToAllV {
                        operands.push(("uneven-in-place", Operands::UnevenInPlace, true));
                        operands.push(("device-counts", Operands::DeviceCounts, true));
                    }
                    for (oname, ops, aligned) in operands {
                        let head = format!("{name} {req} {chname} {} {oname}", coll.name());
                        by_world(&mut t, &head, |world| {
                            runs(&sizes, |bytes| {
                                let shape = CallShape {
                                    aligned,
                                    operands: ops,
                                    ..CallShape::of(coll, bytes, DataType::BF16)
                                };
                                plan_text(cuda_call_plan(
                                    &cuda(world),
                                    &default,
                                    &shape,
                                    req,
                                    choice,
                                ))
                            })
                        });
                    }
                }
                let head = format!("{name} {req} {chname} all_reduce_rmsnorm");
                by_world(&mut t, &head, |world| {
                    runs(&sizes, |bytes| {
                        let (rows, hidden) = if bytes % 8192 == 0 {
                            (bytes / 8192, 4096)
                        } else {
                            (1, bytes / 2)
                        };
                        let shape = ferrocomm::rmsnorm::Shape {
                            rows,
                            hidden,
                            dtype: DataType::BF16,
                        };
                        plan_text(cuda_rmsnorm_plan(&cuda(world), &fused, &shape, req, choice))
                    })
                });
            }
        }
    }
    t
}

fn low_precision_table() -> String {
    let sizes = sizes();
    let mut t = String::new();
    let sets: Vec<Vec<(&str, &str)>> = vec![
        vec![],
        vec![("FERROCOMM_LOW_PRECISION", "1")],
        vec![("RCCL_LOW_PRECISION_ENABLE", "1")],
        vec![
            ("FERROCOMM_LOW_PRECISION", "1"),
            ("FERROCOMM_LP_MIN_BYTES", "1M"),
            ("FERROCOMM_LP_FORMAT", "e5m2"),
            ("FERROCOMM_LP_BLOCK", "64"),
        ],
        vec![
            ("FERROCOMM_LOW_PRECISION", "1"),
            ("FERROCOMM_LP_ALL_REDUCE", "0"),
            ("FERROCOMM_LP_ALL_GATHER", "0"),
        ],
        vec![
            ("FERROCOMM_LOW_PRECISION", "1"),
            ("FERROCOMM_LP_REDUCE_SCATTER", "0"),
            ("FERROCOMM_LP_ALL_TO_ALL", "0"),
        ],
    ];
    let choices = [
        ("default", LowPrecisionChoice::Default),
        ("off", LowPrecisionChoice::Off),
        ("e4m3", LowPrecisionChoice::On(Format::E4M3)),
        ("int8", LowPrecisionChoice::On(Format::Int8)),
    ];
    let dtypes = [
        DataType::F32,
        DataType::BF16,
        DataType::F16,
        DataType::I32,
        DataType::F8E4M3,
    ];
    let ops = [
        None,
        Some(ReduceOp::Sum),
        Some(ReduceOp::Avg),
        Some(ReduceOp::Max),
    ];
    for set in sets {
        let cfg = config_of(&set);
        let fname = format!("{set:?}");
        for (chname, choice) in choices {
            for coll in Collective::ALL {
                for floor in [0, Tuning::builtin().cuda_lp_min_bytes] {
                    // The dtype/op pairs with the same answers share a line.
                    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
                    for dtype in dtypes {
                        for op in ops {
                            let r = runs(&sizes, |bytes| {
                                match low_precision(coll, dtype, op, bytes, choice, &cfg, floor) {
                                    Ok(None) => "full".to_string(),
                                    Ok(Some(c)) => format!("{}/{}", c.format.name(), c.block),
                                    Err(_) => "refused".to_string(),
                                }
                            });
                            let pair =
                                format!("{dtype}/{}", op.map_or("-".into(), |o| o.to_string()));
                            match rows.iter_mut().find(|(x, _)| *x == r) {
                                Some((_, pairs)) => pairs.push(pair),
                                None => rows.push((r, vec![pair])),
                            }
                        }
                    }
                    for (r, pairs) in rows {
                        writeln!(
                            t,
                            "{fname} {chname} {} floor={floor} {}: {r}",
                            coll.name(),
                            pairs.join(",")
                        )
                        .expect("writing to a string");
                    }
                }
            }
        }
    }
    t
}

/// The cuda backend's all_reduce_rmsnorm forms: one launch off (the default) and on, with the
/// one-shot threshold set, a small staging, low precision on the wire, and without direct access.
fn rmsnorm_table() -> String {
    let sizes = sizes();
    let mut t = String::new();
    let kernels = [DataType::F32, DataType::F16, DataType::BF16, DataType::I32];
    let sets: Vec<Vec<(&str, &str)>> = vec![
        vec![("FERROCOMM_RMSNORM_FUSED", "0")],
        vec![("FERROCOMM_RMSNORM_FUSED", "1")],
        vec![
            ("FERROCOMM_RMSNORM_FUSED", "1"),
            ("FERROCOMM_RMSNORM_FLAT_MAX_BYTES", "64K"),
        ],
        vec![
            ("FERROCOMM_RMSNORM_FUSED", "1"),
            ("FERROCOMM_ALLREDUCE_FLAT_MAX_BYTES", "1M"),
        ],
    ];
    let mut variants: Vec<(&str, Option<DdaCaps>)> =
        dda_caps()[..2].iter().map(|&(n, d)| (n, Some(d))).collect();
    variants.push(("no-dda", None));
    for set in sets {
        let cfg = config_of(&set);
        let fname = format!("{set:?}");
        for (name, dda) in &variants {
            let cuda = |world| cuda_caps(world, *dda, true, &kernels);
            for req in [Algo::Auto, Algo::Push, Algo::Flat, Algo::Tree, Algo::Nccl] {
                for lp in [false, true] {
                    let head = format!("{fname} {name} {req} lp={lp} all_reduce_rmsnorm");
                    by_world(&mut t, &head, |world| {
                        runs(&sizes, |bytes| {
                            cuda_rmsnorm(&cuda(world), &cfg, bytes, DataType::BF16, req, lp, lp)
                                .to_string()
                        })
                    });
                }
            }
        }
    }
    t
}

#[test]
fn the_planner_decides_as_recorded() {
    let table = format!(
        "# algorithm: capabilities configuration request collective worlds: sizes answer\n{}\
         # low precision: settings choice collective floor dtype/op pairs: sizes answer\n{}\
         # cuda: direct access request collective worlds: sizes answer\n{}\
         # cuda all_reduce_rmsnorm: settings direct access request low precision worlds: sizes \
         answer\n{}\
         # cuda under settings: settings direct access request collective worlds: sizes \
         answer\n{}\
         # cuda plans: direct access request low precision collective operands worlds: sizes \
         plan\n{}",
        algorithm_table(),
        low_precision_table(),
        cuda_table(),
        rmsnorm_table(),
        cuda_settings_table(),
        cuda_plan_table()
    );
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/plan_table.golden");
    let bless = std::env::var_os("FERROCOMM_BLESS").is_some();
    let ci = std::env::var_os("CI").is_some();
    if let Err(e) = compare_or_record(std::path::Path::new(path), &table, bless, ci) {
        panic!("{e}");
    }
}

/// The lines of a unified diff that show at most.
const DIFF_LINES: usize = 200;

/// What changed from `recorded` to `now`, as a unified diff of lines (at most [`DIFF_LINES`]).
fn what_changed(recorded: &str, now: &str) -> String {
    let diff = similar::TextDiff::from_lines(recorded, now);
    let text = diff
        .unified_diff()
        .context_radius(1)
        .header("recorded", "now")
        .to_string();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = lines[..lines.len().min(DIFF_LINES)].join("\n");
    if lines.len() > DIFF_LINES {
        out.push_str(&format!(
            "\n... {} more lines of diff",
            lines.len() - DIFF_LINES
        ));
    }
    out
}

/// Compares `table` with the recorded one at `path`. With `bless` it records `table` there
/// instead, unless `ci` (a run that records what it then checks can never fail, so recording
/// is a person's act, reviewed in the diff), and fails when that changed anything, showing
/// what: a run that recorded a new table is not a run that checked the planner.
fn compare_or_record(
    path: &std::path::Path,
    table: &str,
    bless: bool,
    ci: bool,
) -> Result<(), String> {
    if bless && ci {
        return Err(
            "FERROCOMM_BLESS is refused when CI is set: the decision table is recorded \
                    by hand and reviewed, never by the run that checks it"
                .into(),
        );
    }
    let recorded = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()));
    if bless {
        if recorded.as_deref() == Ok(table) {
            return Ok(());
        }
        std::fs::write(path, table).map_err(|e| format!("writing {}: {e}", path.display()))?;
        let changes = what_changed(recorded.as_deref().unwrap_or(""), table);
        return Err(format!(
            "FERROCOMM_BLESS recorded a new decision table in {}; review what changed (also \
             in git diff) and run again without FERROCOMM_BLESS:\n{changes}",
            path.display()
        ));
    }
    let recorded = recorded?;
    if recorded != table {
        return Err(format!(
            "the planner's decisions differ from the recorded table ({}):\n{}",
            path.display(),
            what_changed(&recorded, table)
        ));
    }
    Ok(())
}

#[test]
fn blessing_is_refused_under_ci_and_shows_what_it_changed() {
    let dir = std::env::temp_dir().join(format!("ferrocomm-plan-bless-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("table.golden");
    let old = "a 1\nb push\nc 3\n";
    let new = "a 1\nb flat\nc 3\n";
    std::fs::write(&path, old).unwrap();
    // Under CI: refused, nothing written.
    let e = compare_or_record(&path, new, true, true).unwrap_err();
    assert!(e.contains("refused when CI is set"), "{e}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), old);
    // A plain run shows the change and fails.
    let e = compare_or_record(&path, new, false, false).unwrap_err();
    assert!(e.contains("-b push") && e.contains("+b flat"), "{e}");
    assert!(!e.contains("-a 1") && !e.contains("-c 3"), "{e}");
    // Blessing records it, says what changed, and does not count as a check.
    let e = compare_or_record(&path, new, true, false).unwrap_err();
    assert!(e.contains("recorded a new decision table"), "{e}");
    assert!(e.contains("-b push") && e.contains("+b flat"), "{e}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), new);
    // Now it matches, with or without blessing.
    compare_or_record(&path, new, true, false).unwrap();
    compare_or_record(&path, new, false, true).unwrap();
    // A long change is cut, saying how much is left out.
    let many: String = (0..500).map(|i| format!("row {i}\n")).collect();
    let e = what_changed("", &many);
    assert_eq!(e.lines().count(), DIFF_LINES + 1);
    assert!(e.ends_with("more lines of diff"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_table_holds_the_decisions_it_names() {
    // A few rows read by hand, so that the recorded table is known to say what it seems to.
    let t = algorithm_table();
    assert!(
        t.contains(
            "cuda default auto all_reduce w1-2: 0..65536 push, 65537..33554432 flat, \
             33554433.. nccl"
        ),
        "{}",
        t.lines()
            .find(|l| l.contains("cuda default auto all_reduce"))
            .unwrap_or("")
    );
    assert!(t.contains("host default auto send w1-16: 0.. direct"));
    assert!(t.contains("cuda default auto send w3-16: 0.. nccl"));
    let n = rmsnorm_table();
    assert!(n.contains(
        "[(\"FERROCOMM_RMSNORM_FUSED\", \"0\")] dda auto lp=false all_reduce_rmsnorm w1-16: 0.. all-reduce+norm"
    ));
    assert!(n.contains(
        "[(\"FERROCOMM_RMSNORM_FUSED\", \"1\")] dda auto lp=false all_reduce_rmsnorm w1-1: 0.. local"
    ));
    assert!(n.contains(
        "[(\"FERROCOMM_RMSNORM_FUSED\", \"1\")] dda auto lp=false all_reduce_rmsnorm w2-2: \
         0..33554432 fused-flat, 33554433.. all-reduce+norm"
    ));
    assert!(n.contains(
        "[(\"FERROCOMM_RMSNORM_FUSED\", \"1\"), (\"FERROCOMM_RMSNORM_FLAT_MAX_BYTES\", \"64K\")] \
         dda auto lp=false all_reduce_rmsnorm w2-16: 0..65536 fused-flat, 65537..33554432 \
         fused-tree, 33554433.. all-reduce+norm"
    ));
    // Low precision in one launch: the records of a call to the staging's size fit once.
    assert!(n.contains(
        "[(\"FERROCOMM_RMSNORM_FUSED\", \"1\")] dda auto lp=true all_reduce_rmsnorm w1-2: \
         0..33554432 fused-flat, 33554433..67108864 fused-tree, 67108865.. all-reduce+norm"
    ));
    let lp = low_precision_table();
    assert!(lp.contains(
        "[(\"FERROCOMM_LOW_PRECISION\", \"1\")] default all_reduce floor=4194304 \
         float/-,float/sum,float/avg,bfloat16/-,bfloat16/sum,bfloat16/avg,half/-,half/sum,half/avg: 0..4194303 full, 4194304.. e4m3/128"
    ));
}

#[test]
fn the_table_s_direct_access_is_the_default_configuration_s() {
    // All but the push cap, which the table keeps at the default push threshold (64 KiB) so
    // that a forced push meets its limit within the swept sizes.
    let (_, base) = dda_caps()[0];
    let default = ferrocomm::cuda::dda_caps(&Config::default(), 2, None, false);
    assert_eq!(default.push_cap, 512 << 10);
    assert_eq!(
        base,
        ferrocomm::plan::DdaCaps {
            push_cap: 64 << 10,
            ..default
        }
    );
}
