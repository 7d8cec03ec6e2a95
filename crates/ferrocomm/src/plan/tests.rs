//! The planner's decisions, case by case (the whole table of them is tests/plan_table.rs).

use super::*;
use crate::config::tuning::Tuning;

#[test]
fn a_plan_prints_as_the_path_it_takes() {
    let full = Plan::on_gpu;
    assert_eq!(full(Algo::Flat, Some(FlatForm::Pull)).to_string(), "flat");
    assert_eq!(full(Algo::Flat, Some(FlatForm::Stream)).to_string(), "flat");
    assert_eq!(
        full(Algo::Flat, Some(FlatForm::CopyEngine)).to_string(),
        "flat-ce"
    );
    assert_eq!(
        full(Algo::Flat, Some(FlatForm::Ll128)).to_string(),
        "flat-ll128"
    );
    assert_eq!(full(Algo::Nccl, None).to_string(), "nccl");
    let lp = Plan {
        low_precision: Some(Codec::new(Format::E4M3, 128).unwrap()),
        ..full(Algo::Tree, None)
    };
    assert_eq!(lp.to_string(), "lp-tree");
}

fn gpu(staging: usize) -> Caps {
    Caps {
        push: true,
        nccl: true,
        staging_bytes: Some(staging),
        multi_host: false,
    }
}

#[test]
fn data_movers_go_direct_up_to_their_thresholds() {
    let cfg = Config::default();
    let caps = gpu(64 << 20);
    let pick = |coll, bytes, world| {
        select(coll, bytes, world, DataType::BF16, Algo::Auto, &caps, &cfg).unwrap()
    };
    // The equal-part all-to-all runs in rounds up to the staging (64 MiB at 2 ranks); the
    // all-to-all-v has no limit of its own (it runs in pieces; the staging is judged by the
    // backend, which these capabilities stand for only in part).
    assert_eq!(pick(Collective::AllToAll, 64 << 20, 2), Algo::Direct);
    assert_eq!(pick(Collective::AllToAll, (64 << 20) + 1, 2), Algo::Nccl);
    let free = Caps {
        staging_bytes: None,
        ..caps
    };
    let v = |bytes| {
        select(
            Collective::AllToAllV,
            bytes,
            2,
            DataType::BF16,
            Algo::Auto,
            &free,
            &cfg,
        )
    };
    assert_eq!(v(1 << 40).unwrap(), Algo::Direct);
    // Above two ranks: NCCL unless forced, or without NCCL.
    let v4 = |requested, caps: &Caps| {
        select(
            Collective::AllToAllV,
            0,
            4,
            DataType::BF16,
            requested,
            caps,
            &cfg,
        )
        .unwrap()
    };
    assert_eq!(v4(Algo::Auto, &free), Algo::Nccl);
    assert_eq!(v4(Algo::Direct, &free), Algo::Direct);
    let no_nccl = Caps {
        nccl: false,
        ..free
    };
    assert_eq!(v4(Algo::Auto, &no_nccl), Algo::Direct);
    assert_eq!(pick(Collective::AllGather, 32 << 20, 4), Algo::Direct);
    assert_eq!(pick(Collective::AllGather, (32 << 20) + 1, 4), Algo::Nccl);
    // Above 4 ranks every default halves (the all-to-all-v has none).
    assert_eq!(cfg.tuning.direct_max(Collective::AllToAllV, 8), None);
    for coll in DIRECT_LIMITED
        .into_iter()
        .filter(|&c| c != Collective::AllToAllV)
    {
        let limit = |world| cfg.tuning.direct_max(coll, world).expect("a default limit");
        let (two, eight) = (limit(2), limit(8));
        assert_eq!(eight * 2, two, "{}", coll.name());
        assert_eq!(pick(coll, eight, 8), Algo::Direct, "{}", coll.name());
        assert_eq!(pick(coll, eight + 1, 8), Algo::Nccl, "{}", coll.name());
    }
    // A smaller staging caps every threshold.
    let small = gpu(8 << 20);
    let pick_small = |bytes| {
        select(
            Collective::AllToAll,
            bytes,
            2,
            DataType::BF16,
            Algo::Auto,
            &small,
            &cfg,
        )
        .unwrap()
    };
    assert_eq!(pick_small(8 << 20), Algo::Direct);
    assert_eq!(pick_small((8 << 20) + 1), Algo::Nccl);
}

#[test]
fn each_limit_is_set_by_the_variable_it_names() {
    for coll in DIRECT_LIMITED {
        let (unset, var) = direct_max_setting(&Config::default().thresholds, coll);
        assert_eq!(unset, None, "{}", coll.name());
        let cfg = Config::from_lookup(|k| (k == var).then(|| "1M".to_string())).unwrap();
        let (set, _) = direct_max_setting(&cfg.thresholds, coll);
        assert_eq!(set, Some(1 << 20), "{} ({var})", coll.name());
    }
}

#[test]
fn a_set_threshold_replaces_the_default() {
    let mut cfg = Config::default();
    cfg.thresholds.all_to_all_max = Some(1 << 20);
    let caps = gpu(64 << 20);
    for coll in [Collective::AllToAll, Collective::AllToAllV] {
        let pick = |bytes| select(coll, bytes, 2, DataType::BF16, Algo::Auto, &caps, &cfg).unwrap();
        assert_eq!(pick(1 << 20), Algo::Direct, "{}", coll.name());
        assert_eq!(pick((1 << 20) + 1), Algo::Nccl, "{}", coll.name());
    }
}

#[test]
fn point_to_point_goes_direct_between_two_ranks_only() {
    let caps = gpu(64 << 20);
    let mut cfg = Config::default();
    for coll in [Collective::Send, Collective::Recv] {
        let pick = |bytes, world, algo, caps: &Caps, cfg: &Config| {
            select(coll, bytes, world, DataType::BF16, algo, caps, cfg)
        };
        let auto = |bytes, world, cfg: &Config| pick(bytes, world, Algo::Auto, &caps, cfg);
        assert_eq!(auto(1024, 2, &cfg).unwrap(), Algo::Direct);
        assert_eq!(auto(64 << 20, 2, &cfg).unwrap(), Algo::Direct);
        assert_eq!(auto((64 << 20) + 1, 2, &cfg).unwrap(), Algo::Nccl);
        // Above two ranks a message leaves the other ranks out: NCCL, and a forced direct
        // is refused, unless there is no NCCL (the host backend's own path).
        assert_eq!(auto(1024, 4, &cfg).unwrap(), Algo::Nccl);
        assert!(pick(1024, 4, Algo::Direct, &caps, &cfg).is_err());
        let host = Caps {
            push: false,
            nccl: false,
            staging_bytes: None,
            multi_host: false,
        };
        assert_eq!(
            pick(1024, 4, Algo::Auto, &host, &cfg).unwrap(),
            Algo::Direct
        );
        assert_eq!(
            pick(1024, 4, Algo::Direct, &host, &cfg).unwrap(),
            Algo::Direct
        );
        // Its own limit; 0 leaves only empty messages to direct access.
        cfg.thresholds.p2p_max = Some(0);
        assert_eq!(auto(0, 2, &cfg).unwrap(), Algo::Direct);
        assert_eq!(auto(1, 2, &cfg).unwrap(), Algo::Nccl);
        cfg.thresholds.p2p_max = Some(1 << 20);
        assert_eq!(auto(1 << 20, 2, &cfg).unwrap(), Algo::Direct);
        assert_eq!(auto((1 << 20) + 1, 2, &cfg).unwrap(), Algo::Nccl);
        assert_eq!(
            direct_max_setting(&cfg.thresholds, coll),
            (Some(1 << 20), "FERROCOMM_P2P_MAX_BYTES")
        );
        cfg.thresholds.p2p_max = None;
    }
}

/// Direct access as on 2xH200: 64 MiB of staging, push to 512 KiB, LL to 256 KiB, no copy
/// engine or LL128 region.
fn two_h200_dda() -> DdaCaps {
    DdaCaps {
        staging_bytes: 64 << 20,
        push_cap: 512 << 10,
        ce_bytes: 0,
        ce_min: None,
        ll128_cap: 0,
        ll128_links: false,
        ll_max: 256 << 10,
        a2av_lp: true,
    }
}

/// A communicator of `world` ranks as on H200s ([`two_h200_dda`]'s direct access, NCCL
/// underneath) whose reduction kernels take `kernels`.
fn h200_caps(world: usize, kernels: &[DataType]) -> CudaCaps<'_> {
    CudaCaps {
        world,
        dda: Some(two_h200_dda()),
        no_dda: "off",
        nccl: true,
        no_nccl: "absent",
        multi_host: false,
        kernel_dtypes: kernels,
    }
}

#[test]
fn a_cuda_plan_names_what_each_call_runs() {
    let dda = two_h200_dda();
    let kernels = [DataType::F32, DataType::BF16];
    let caps = |world, dda, nccl| CudaCaps {
        world,
        dda,
        no_dda: "off",
        nccl,
        no_nccl: "absent",
        multi_host: false,
        kernel_dtypes: &kernels,
    };
    let mut cfg = Config::default();
    let plan = |c: &CudaCaps<'_>, cfg: &Config, coll, bytes| {
        let d = LowPrecisionChoice::Default;
        let (dt, sum) = (DataType::BF16, ReduceOp::Sum);
        cuda_plan(c, cfg, coll, bytes, dt, sum, Algo::Auto, d).map(|p| p.to_string())
    };
    let two = caps(2, Some(dda), true);
    assert_eq!(
        plan(&two, &cfg, Collective::AllReduce, 1024).unwrap(),
        "push"
    );
    assert_eq!(
        plan(&two, &cfg, Collective::AllReduce, 1 << 30).unwrap(),
        "nccl"
    );
    // The barrier meets in a push kernel by direct access, else in NCCL, else nowhere.
    assert_eq!(plan(&two, &cfg, Collective::Barrier, 0).unwrap(), "push");
    let no_dda = caps(2, None, true);
    assert_eq!(plan(&no_dda, &cfg, Collective::Barrier, 0).unwrap(), "nccl");
    assert!(plan(&caps(2, None, false), &cfg, Collective::Barrier, 0).is_err());
    // Point-to-point direct between two ranks only.
    assert_eq!(plan(&two, &cfg, Collective::Send, 1024).unwrap(), "direct");
    let four = caps(4, Some(dda), true);
    assert_eq!(plan(&four, &cfg, Collective::Send, 1024).unwrap(), "nccl");
    // A staged collective carries the form of its parts (the all-gather's kernel: LL lines
    // to ll_max, staged, pipelined in rounds of 4 MiB from 8 MiB); NCCL's none.
    let parts = |c: &CudaCaps<'_>, coll, bytes| {
        let (dt, sum, d) = (DataType::BF16, ReduceOp::Sum, LowPrecisionChoice::Default);
        cuda_plan(c, &cfg, coll, bytes, dt, sum, Algo::Auto, d)
            .unwrap()
            .parts
    };
    let form = |form, rounds| Some(PartForm { form, rounds });
    assert_eq!(
        parts(&two, Collective::AllGather, 1024),
        form(PartKind::Ll, 1)
    );
    assert_eq!(
        parts(&two, Collective::AllGather, 1 << 20),
        form(PartKind::Staged, 1)
    );
    assert_eq!(
        parts(&two, Collective::AllGather, 16 << 20),
        form(PartKind::Pipelined, 4)
    );
    assert_eq!(parts(&two, Collective::AllGather, 64 << 20), None);
    // The all-to-all's part is its output over the world; a message is a broadcast.
    assert_eq!(
        parts(&two, Collective::AllToAll, 32 << 20),
        form(PartKind::Pipelined, 4)
    );
    assert_eq!(
        parts(&two, Collective::Send, 1 << 20),
        form(PartKind::Staged, 1)
    );
    assert_eq!(parts(&two, Collective::AllReduce, 1024), None);
    // Low precision from the cuda floor (4 MiB of one rank's part) up.
    cfg.low_precision.enabled = true;
    let ag = |bytes| plan(&two, &cfg, Collective::AllGather, bytes).unwrap();
    assert_eq!(
        (ag(1 << 20), ag(4 << 20)),
        ("direct".into(), "lp-direct".into())
    );
    // The all-to-all counts its whole output; the all-to-all-v goes low precision at two
    // ranks where its tiles fit.
    let a2a = plan(&two, &cfg, Collective::AllToAll, 8 << 20).unwrap();
    assert_eq!(a2a, "lp-direct");
    let a2av = |c: &CudaCaps<'_>| plan(c, &cfg, Collective::AllToAllV, 8 << 20).unwrap();
    assert_eq!(a2av(&two), "lp-direct");
    let tight = DdaCaps {
        a2av_lp: false,
        ..dda
    };
    assert_eq!(a2av(&caps(2, Some(tight), true)), "direct");
    assert_eq!(a2av(&four), "nccl");
    assert_eq!(
        plan(&two, &cfg, Collective::AllReduce, 4 << 20).unwrap(),
        "lp-flat"
    );
    assert_eq!(
        plan(&four, &cfg, Collective::AllReduce, 4 << 20).unwrap(),
        "lp-tree"
    );
}

#[test]
fn the_operands_rule_out_direct_access_in_the_plan() {
    let kernels = [DataType::F32, DataType::BF16];
    let caps = |world, nccl| CudaCaps {
        nccl,
        ..h200_caps(world, &kernels)
    };
    let cfg = Config::default();
    let shape = |coll, bytes, operands| CallShape {
        operands,
        ..CallShape::of(coll, bytes, DataType::BF16)
    };
    let plan = |c: &CudaCaps<'_>, s: &CallShape, req| {
        cuda_call_plan(c, &cfg, s, req, LowPrecisionChoice::Default)
    };
    let (two, four) = (caps(2, true), caps(4, true));
    let send = shape(Collective::Send, 1024, Operands::Plain);
    let to_self = shape(Collective::Send, 1024, Operands::ToSelf);
    let uneven = shape(Collective::AllToAllV, 2048, Operands::UnevenInPlace);
    let device = shape(Collective::AllToAllV, 2048, Operands::DeviceCounts);
    // A message between the two ranks: direct access in LL lines.
    let p = plan(&two, &send, Algo::Auto).unwrap();
    assert_eq!(
        (p.engine, p.parts.map(|p| p.form)),
        (Engine::Direct, Some(PartKind::Ll))
    );
    // To the rank itself, between ranks of four, in place with uneven counts: NCCL's, and
    // refused naming why where direct access is asked for.
    for (c, s, why) in [
        (&two, &to_self, "to the rank itself"),
        (&four, &send, "two-rank communicator only"),
        (&two, &uneven, "send counts that differ"),
    ] {
        assert_eq!(
            plan(c, s, Algo::Auto).unwrap().engine,
            Engine::Nccl,
            "{why}"
        );
        let e = plan(c, s, Algo::Direct).unwrap_err().to_string();
        assert!(e.contains(why), "{e}");
        // Without NCCL, nothing can carry them.
        let no_nccl = CudaCaps { nccl: false, ..*c };
        let e = plan(&no_nccl, s, Algo::Auto).unwrap_err().to_string();
        assert!(e.contains("without NCCL"), "{e}");
    }
    // Device-side counts: direct access only.
    let p = plan(&two, &device, Algo::Auto).unwrap();
    assert_eq!(
        (p.engine, p.a2av),
        (Engine::Direct, Some(A2avForm::DeviceCounts))
    );
    let off = CudaCaps { dda: None, ..two };
    let e = plan(&off, &device, Algo::Auto).unwrap_err().to_string();
    assert!(
        e.contains("device-side counts without direct access"),
        "{e}"
    );
    // The all-to-all-v's form: LL lines to the LL limit of its largest crossing part (the
    // size counts two of them), staged pieces above, pair by pair above two ranks.
    let ll = two_h200_dda().ll_max;
    let a2av = |c: &CudaCaps<'_>, bytes| {
        let s = shape(Collective::AllToAllV, bytes, Operands::Plain);
        plan(c, &s, Algo::Direct).unwrap().a2av
    };
    assert_eq!(a2av(&two, 2 * ll), Some(A2avForm::Lines));
    assert_eq!(a2av(&two, 2 * ll + 2), Some(A2avForm::Pieces));
    assert_eq!(a2av(&four, 0), Some(A2avForm::Pairs));
    assert_eq!(a2av(&four, 1 << 30), Some(A2avForm::Pairs));
    // Pointers off the element size: full precision, whatever was asked.
    let fp8 = LowPrecisionChoice::On(Format::E4M3);
    let ar = |aligned| {
        let s = CallShape {
            aligned,
            ..CallShape::of(Collective::AllReduce, 8 << 20, DataType::BF16)
        };
        cuda_call_plan(&two, &cfg, &s, Algo::Auto, fp8)
            .unwrap()
            .low_precision
    };
    assert!(ar(true).is_some());
    assert_eq!(ar(false), None);
}

#[test]
fn the_low_precision_form_is_the_plan_s() {
    let dda = two_h200_dda();
    let t = Tuning::builtin();
    let e4 = Codec::new(Format::E4M3, 128).unwrap();
    let form = |kind, bytes: usize| lp_form(kind, bytes / 2, 2, 2, &e4, &dda, &t).unwrap();
    // One push launch, split, up to a region per sender; the wide kernel from the table's
    // 32 MiB on.
    let small = form(LpKind::Flat, 16 << 20);
    assert_eq!(
        (small.moves, small.chunk, small.split, small.last_kernel),
        (LpMove::Push, 8 << 20, true, LpKernel::Plain)
    );
    let big = form(LpKind::Flat, 32 << 20);
    assert_eq!((big.moves, big.last_kernel), (LpMove::Push, LpKernel::Wide));
    // 64 MiB: one pull chunk where push needs two... but push first where it splits
    // (two ranks, blocks of 128): two push launches of 32 MiB, both wide.
    let two = form(LpKind::Flat, 64 << 20);
    assert_eq!(two.moves, LpMove::Push);
    assert_eq!((64usize << 20) / 2 / two.chunk, 2);
    assert_eq!(
        (two.kernel, two.last_kernel),
        (LpKernel::Wide, LpKernel::Wide)
    );
    // Two-shot: never pushes, never wide.
    let tree = form(LpKind::Tree, 64 << 20);
    assert_eq!((tree.moves, tree.kernel), (LpMove::Pull, LpKernel::Plain));
    // A last launch smaller than the wide size runs the plain kernel: a reduce-scatter of
    // 100 elements short of 32 Mi bf16 per part, on a staging whose two regions hold about
    // 19 Mi elements each, runs two launches: 16 Mi (32 MiB, wide) and the rest (plain).
    let roomy = DdaCaps {
        staging_bytes: 40 << 20,
        ..dda
    };
    let part = (32usize << 20) - 100;
    let cut = lp_form(LpKind::ReduceScatter, part, 2, 2, &e4, &roomy, &t).unwrap();
    assert_eq!(
        (cut.chunk, part.div_ceil(cut.chunk)),
        (16 << 20, 2),
        "{cut:?}"
    );
    assert_eq!(
        (cut.kernel, cut.last_kernel),
        (LpKernel::Wide, LpKernel::Plain)
    );
    // The all-reduce's plan carries it; an empty call cuts nothing; a staging that holds
    // no tile is refused naming the setting.
    let kernels = [DataType::BF16];
    let caps = h200_caps(2, &kernels);
    let cfg = Config::default();
    let fp8 = LowPrecisionChoice::On(Format::E4M3);
    let plan = |c: &CudaCaps<'_>, coll, bytes| {
        cuda_plan(
            c,
            &cfg,
            coll,
            bytes,
            DataType::BF16,
            ReduceOp::Sum,
            Algo::Auto,
            fp8,
        )
    };
    assert_eq!(
        plan(&caps, Collective::AllReduce, 16 << 20).unwrap().lp,
        Some(small)
    );
    assert_eq!(
        plan(&caps, Collective::AllReduce, 0)
            .unwrap()
            .lp
            .unwrap()
            .chunk,
        0
    );
    let tiny = CudaCaps {
        dda: Some(DdaCaps {
            staging_bytes: 100,
            ..dda
        }),
        ..caps
    };
    let e = plan(&tiny, Collective::AllGather, 1 << 20)
        .unwrap_err()
        .to_string();
    assert!(e.contains("FERROCOMM_CUDA_STAGING_BYTES=100"), "{e}");
    // The all-to-all-v's: its largest crossing part (the size counts two), plain kernel.
    let a2av = plan(&caps, Collective::AllToAllV, 64 << 20)
        .unwrap()
        .lp
        .unwrap();
    assert_eq!(a2av, lp_a2av_form(16 << 20, &e4, dda.staging_bytes));
    assert_eq!(
        (a2av.kind, a2av.kernel, a2av.split),
        (LpKind::AllToAllV, LpKernel::Plain, false)
    );
}

#[test]
fn the_detail_names_the_forms_the_path_does_not() {
    let kernels = [DataType::BF16];
    let caps = |world| h200_caps(world, &kernels);
    let cfg = Config::default();
    let detail = |world, coll, bytes, choice| {
        let (bf16, sum) = (DataType::BF16, ReduceOp::Sum);
        let p = cuda_plan(
            &caps(world),
            &cfg,
            coll,
            bytes,
            bf16,
            sum,
            Algo::Direct,
            choice,
        );
        p.unwrap().detail()
    };
    let (d, fp8) = (
        LowPrecisionChoice::Off,
        LowPrecisionChoice::On(Format::E4M3),
    );
    assert_eq!(detail(2, Collective::AllGather, 1024, d), "parts ll");
    assert_eq!(detail(2, Collective::AllGather, 1 << 20, d), "parts st");
    assert_eq!(detail(2, Collective::AllGather, 16 << 20, d), "parts rw x4");
    assert_eq!(detail(2, Collective::AllToAllV, 1024, d), "a2av lines");
    assert_eq!(detail(4, Collective::AllToAllV, 1024, d), "a2av pairs");
    assert_eq!(
        detail(2, Collective::AllGather, 2 << 20, fp8),
        "lp push, chunks of 1048576 (plain, the last plain), split"
    );
    let full = Plan::on_gpu(Algo::Nccl, None);
    assert_eq!(full.detail(), "");
}

#[test]
fn an_rmsnorm_plan_prints_its_norm_form() {
    let dda = two_h200_dda();
    let kernels = [DataType::F32, DataType::BF16];
    let caps = |dda| CudaCaps {
        world: 2,
        dda,
        no_dda: "off",
        nccl: true,
        no_nccl: "absent",
        multi_host: false,
        kernel_dtypes: &kernels,
    };
    let cfg = Config::from_lookup(|_| None).unwrap();
    let (two, no_dda) = (caps(Some(dda)), caps(None));
    let bf16 = DataType::BF16;
    let default = LowPrecisionChoice::Default;
    let fp8 = LowPrecisionChoice::On(Format::E4M3);
    // Rows of 4096 bf16 (8 KiB): `bytes` of them; a byte count that is not whole rows of
    // 8 KiB is one row of that many bytes (not whole 128-element blocks where it is odd).
    let sh = |bytes: usize| {
        let (rows, hidden) = if bytes % 8192 == 0 {
            (bytes / 8192, 4096)
        } else {
            (1, bytes / 2)
        };
        crate::rmsnorm::Shape {
            rows,
            hidden,
            dtype: bf16,
        }
    };
    let plan = |c: &CudaCaps<'_>, cfg: &Config, bytes, req, lp| {
        cuda_rmsnorm_plan(c, cfg, &sh(bytes), req, lp)
    };
    let text =
        |c: &CudaCaps<'_>, bytes, req, lp| plan(c, &cfg, bytes, req, lp).unwrap().to_string();
    // One launch by direct access: one-shot to the flat threshold (32 MiB at two ranks, or
    // as set), two-shot above while twice the message fits the staging, or as requested.
    assert_eq!(text(&two, 64 << 10, Algo::Auto, default), "fused-flat");
    assert_eq!(text(&two, 24 << 20, Algo::Auto, default), "fused-flat");
    let low = Config::from_lookup(|k| {
        (k == "FERROCOMM_RMSNORM_FLAT_MAX_BYTES").then(|| "1048576".to_string())
    })
    .unwrap();
    let tree = plan(&two, &low, 2 << 20, Algo::Auto, default).unwrap();
    assert_eq!(tree.to_string(), "fused-tree");
    assert_eq!(text(&two, 1 << 20, Algo::Tree, default), "fused-tree");
    let fused = plan(&two, &cfg, 1 << 20, Algo::Auto, default).unwrap();
    assert_eq!((fused.engine, fused.algo), (Engine::Direct, Algo::Flat));
    assert_eq!(fused.norm, Some(NormForm::FusedFlat));
    // Low precision on the wire in one launch: the rows cross as the codec's records.
    assert_eq!(text(&two, 8 << 20, Algo::Auto, fp8), "lp-fused-flat");
    assert_eq!(text(&two, 8 << 20, Algo::Tree, fp8), "lp-fused-tree");
    // The records of a 48 MiB call fit the 64 MiB staging once (the full-precision
    // two-shot needs twice).
    assert_eq!(text(&two, 48 << 20, Algo::Auto, fp8), "lp-fused-tree");
    let lp = plan(&two, &cfg, 8 << 20, Algo::Auto, fp8).unwrap();
    assert_eq!(lp.norm, Some(NormForm::FusedFlat));
    assert_eq!(
        lp.low_precision,
        Some(Codec::new(Format::E4M3, 128).unwrap())
    );
    // Two launches carry the all-reduce's own path: beyond the staging, NCCL asked for,
    // low precision with rows that are not whole blocks, no direct access.
    assert_eq!(text(&two, 48 << 20, Algo::Auto, default), "nccl+norm");
    assert_eq!(text(&two, 1 << 20, Algo::Nccl, default), "nccl+norm");
    assert_eq!(text(&two, (8 << 20) + 16, Algo::Auto, fp8), "lp-flat+norm");
    assert_eq!(text(&no_dda, 1 << 20, Algo::Auto, default), "nccl+norm");
    // One rank: the norm kernel on x itself, with or without direct access, whatever the
    // request but NCCL's.
    let one = CudaCaps { world: 1, ..two };
    let one_no_dda = CudaCaps { world: 1, ..no_dda };
    for req in [Algo::Auto, Algo::Push, Algo::Flat, Algo::Tree] {
        assert_eq!(text(&one, 1 << 20, req, default), "local", "{req}");
        assert_eq!(text(&one_no_dda, 64 << 20, req, default), "local", "{req}");
    }
    assert_eq!(text(&one, 1 << 20, Algo::Nccl, default), "nccl+norm");
    // Low precision asked for at one rank quantizes as at any world size (one launch).
    assert_eq!(text(&one, 8 << 20, Algo::Auto, fp8), "lp-fused-flat");
    let local = plan(&one, &cfg, 1 << 20, Algo::Auto, default).unwrap();
    assert_eq!(local.norm, Some(NormForm::Local));
    // The loopback measurement (FERROCOMM_RMSNORM_LOOPBACK) is the plan's: where the local form
    // would run with direct access, the one-launch kernel, tree where asked, else flat; without
    // direct access, or with low precision on the wire, the plan is as without it.
    let loopback =
        Config::from_lookup(|k| (k == "FERROCOMM_RMSNORM_LOOPBACK").then(|| "2".to_string()))
            .unwrap();
    let looped =
        |c: &CudaCaps<'_>, bytes, req, lp| plan(c, &loopback, bytes, req, lp).unwrap().to_string();
    assert_eq!(looped(&one, 1 << 20, Algo::Auto, default), "fused-flat");
    assert_eq!(looped(&one, 1 << 20, Algo::Flat, default), "fused-flat");
    assert_eq!(looped(&one, 1 << 20, Algo::Tree, default), "fused-tree");
    assert_eq!(looped(&one_no_dda, 1 << 20, Algo::Tree, default), "local");
    assert_eq!(looped(&one, 8 << 20, Algo::Tree, fp8), "lp-fused-tree");
    assert_eq!(looped(&two, 1 << 20, Algo::Auto, default), "fused-flat");
    // The two launches carry the plain all-reduce's plan, which the executor runs as it is.
    let two_launch = plan(&two, &cfg, 48 << 20, Algo::Auto, default).unwrap();
    assert_eq!(two_launch.norm, Some(NormForm::TwoLaunch));
    let ar = cuda_plan(
        &two,
        &cfg,
        Collective::AllReduce,
        48 << 20,
        bf16,
        ReduceOp::Sum,
        Algo::Auto,
        default,
    );
    assert_eq!(two_launch.norm_all_reduce(), ar.unwrap());
    // At every size and request the plan is what the executor runs: one launch by direct
    // access in full precision, flat or tree as its form says; or the two launches, whose
    // all-reduce is exactly the plain all-reduce's plan (and refuses where it refuses).
    for req in [Algo::Auto, Algo::Push, Algo::Flat, Algo::Tree, Algo::Nccl] {
        for bytes in [0, 1 << 10, 4 << 20, 32 << 20, (32 << 20) + 2, 64 << 20] {
            for choice in [default, fp8, LowPrecisionChoice::Off] {
                let case = format!("{req} {bytes} {choice:?}");
                let (ar, sum) = (Collective::AllReduce, ReduceOp::Sum);
                let ar = cuda_plan(&two, &cfg, ar, bytes, bf16, sum, req, choice);
                match plan(&two, &cfg, bytes, req, choice) {
                    Ok(p) => match p.norm {
                        Some(NormForm::FusedFlat | NormForm::FusedTree) => {
                            let algo = if p.norm == Some(NormForm::FusedFlat) {
                                Algo::Flat
                            } else {
                                Algo::Tree
                            };
                            assert_eq!((p.engine, p.algo), (Engine::Direct, algo), "{case}");
                            // The records are the codec the all-reduce would take.
                            let want = low_precision(
                                Collective::AllReduce,
                                bf16,
                                Some(ReduceOp::Sum),
                                bytes,
                                choice,
                                &cfg,
                                cfg.tuning.cuda_lp_min_bytes,
                            )
                            .unwrap();
                            assert_eq!(p.low_precision, want, "{case}");
                            if let Some(c) = &want {
                                assert!(rows_take_codec(sh(bytes).hidden, bf16, c), "{case}");
                            }
                            assert!(bytes <= two.dda.as_ref().unwrap().staging_bytes, "{case}");
                        }
                        Some(NormForm::TwoLaunch) => {
                            let ar = ar.unwrap();
                            assert_eq!(Plan { norm: None, ..p }, ar, "{case}");
                        }
                        Some(NormForm::Local) => panic!("{case}: two ranks ran the local form"),
                        None => panic!("{case}: no norm form"),
                    },
                    // Only the all-reduce of two launches refuses (push above its cap).
                    Err(_) => assert!(ar.is_err(), "{case}"),
                }
            }
        }
    }
}
