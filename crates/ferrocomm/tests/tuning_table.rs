//! A tuning table file (`FERROCOMM_TUNING`, or this machine's file under the cache directory)
//! changes the planner's choice at exactly the sizes it says, the environment's own settings
//! still win over it, and a file another user could have written is refused.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use ferrocomm::config::Config;
use ferrocomm::plan::{
    cuda_plan, host_plan, select, Caps, CudaCaps, LowPrecisionChoice, LpKernel, PartKind, Plan,
};
use ferrocomm::tuning::{TableSource, Tuning, BUILTIN_JSON};
use ferrocomm::{Algo, Collective, DataType, ReduceOp};

const GPU: Caps = Caps {
    push: true,
    nccl: true,
    staging_bytes: Some(64 << 20),
    multi_host: false,
};

/// A fresh directory of this test's own.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ferrocomm-tuning-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The built-in table with its two-rank all-reduce rule set to push <= 8 KiB, flat <= 1 MiB,
/// tree never (NCCL above), written to `path` readable by its owner only.
fn write_table(path: &Path) {
    let from = r#""push_max": "64K", "flat_max": "32M", "tree_max": "32M""#;
    assert!(BUILTIN_JSON.contains(from), "the built-in two-rank rule");
    let text = BUILTIN_JSON.replacen(
        from,
        r#""push_max": "8K", "flat_max": "1M", "tree_max": "1M""#,
        1,
    );
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

fn config(vars: &[(&str, String)]) -> Config {
    let vars = vars.to_vec();
    Config::from_lookup(move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone()))
        .unwrap()
}

fn all_reduce(cfg: &Config, bytes: usize, world: usize) -> Algo {
    select(
        Collective::AllReduce,
        bytes,
        world,
        DataType::F32,
        Algo::Auto,
        &GPU,
        cfg,
    )
    .unwrap()
}

/// Sizes on both sides of every limit of either table.
fn sizes() -> Vec<usize> {
    let mut s = vec![0, 1];
    for m in [8usize << 10, 64 << 10, 1 << 20, 32 << 20, 64 << 20] {
        s.extend([m - 1, m, m + 1]);
    }
    s
}

#[test]
fn a_table_file_changes_the_choice_at_exactly_its_sizes() {
    let dir = scratch("file");
    let file = dir.join("table.json");
    write_table(&file);
    let builtin = config(&[]);
    let tuned = config(&[("FERROCOMM_TUNING", file.display().to_string())]);
    assert_eq!(builtin.tuning.source, TableSource::BuiltIn);
    assert_eq!(tuned.tuning.source, TableSource::Env(file.clone()));
    for bytes in sizes() {
        let (was, now) = (all_reduce(&builtin, bytes, 2), all_reduce(&tuned, bytes, 2));
        let want = if bytes <= 8 << 10 {
            Algo::Push
        } else if bytes <= 1 << 20 {
            Algo::Flat
        } else {
            Algo::Nccl
        };
        assert_eq!(now, want, "{bytes} bytes with the table");
        // The built-in choice everywhere else, and at other world sizes.
        let moved =
            (8 << 10) < bytes && bytes <= 64 << 10 || (1 << 20) < bytes && bytes <= 32 << 20;
        assert_eq!(was != now, moved, "{bytes} bytes: {was} before, {now} now");
        for world in [3, 4, 8] {
            assert_eq!(
                all_reduce(&builtin, bytes, world),
                all_reduce(&tuned, bytes, world),
                "{bytes} bytes at {world} ranks"
            );
        }
    }
    // The host backend's plan follows the same table: flat up to 1 MiB, tree above.
    let host = |cfg: &Config, bytes| {
        host_plan(
            Collective::AllReduce,
            bytes,
            2,
            DataType::F32,
            Algo::Auto,
            LowPrecisionChoice::Default,
            cfg,
        )
        .unwrap()
        .algo
    };
    assert_eq!(host(&tuned, 1 << 20), Algo::Flat);
    assert_eq!(host(&tuned, (1 << 20) + 1), Algo::Tree);
    assert_eq!(host(&builtin, (1 << 20) + 1), Algo::Flat);
    // The ranks compare the table's digest: it differs.
    let digest = |cfg: &Config| {
        cfg.shared_settings()
            .into_iter()
            .find(|(_, var, _)| *var == "FERROCOMM_TUNING")
            .expect("the table is a shared setting")
            .2
    };
    assert_ne!(digest(&builtin), digest(&tuned));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_environment_still_wins_over_the_table() {
    let dir = scratch("env");
    let file = dir.join("table.json");
    write_table(&file);
    let cfg = config(&[
        ("FERROCOMM_TUNING", file.display().to_string()),
        ("FERROCOMM_ALLREDUCE_PUSH_MAX_BYTES", "16K".into()),
    ]);
    assert_eq!(all_reduce(&cfg, 16 << 10, 2), Algo::Push);
    assert_eq!(all_reduce(&cfg, (16 << 10) + 1, 2), Algo::Flat);
    assert_eq!(all_reduce(&cfg, (1 << 20) + 1, 2), Algo::Nccl);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn this_machine_s_file_is_found_under_the_cache_directory() {
    let dir = scratch("machine");
    let mut cfg = config(&[("XDG_CACHE_HOME", dir.display().to_string())]);
    assert_eq!(cfg.tuning_dir, dir.join("ferrocomm").join("tuning"));
    // No file: the built-in table.
    cfg.use_machine_table("host-test").unwrap();
    assert_eq!(cfg.tuning.source, TableSource::BuiltIn);
    std::fs::create_dir_all(&cfg.tuning_dir).unwrap();
    let file = cfg.tuning_dir.join("host-test.json");
    write_table(&file);
    cfg.use_machine_table("host-test").unwrap();
    assert_eq!(cfg.tuning.source, TableSource::Machine(file.clone()));
    assert_eq!(all_reduce(&cfg, (8 << 10) + 1, 2), Algo::Flat);
    // FERROCOMM_TUNING wins over this machine's file.
    let other = dir.join("other.json");
    std::fs::write(&other, BUILTIN_JSON).unwrap();
    std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut named = config(&[
        ("XDG_CACHE_HOME", dir.display().to_string()),
        ("FERROCOMM_TUNING", other.display().to_string()),
    ]);
    named.use_machine_table("host-test").unwrap();
    assert_eq!(named.tuning.source, TableSource::Env(other));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_table_others_can_write_is_refused() {
    let dir = scratch("mode");
    let file = dir.join("table.json");
    write_table(&file);
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
    let e = Tuning::read(&file, TableSource::Env(file.clone())).unwrap_err();
    assert!(e.to_string().contains("writable by no one else"), "{e}");
    let vars = [("FERROCOMM_TUNING", file.display().to_string())];
    let e = Config::from_lookup(|k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone()))
        .unwrap_err();
    assert!(e.to_string().contains(&file.display().to_string()), "{e}");
    let missing = dir.join("missing.json");
    let e = Tuning::read(&missing, TableSource::Env(missing.clone())).unwrap_err();
    assert!(e.to_string().contains("cannot open"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The built-in table with `from` replaced by `to`, written to `path` readable by its owner
/// only.
fn write_changed(path: &Path, from: &str, to: &str) {
    assert!(BUILTIN_JSON.contains(from), "{from} in the built-in table");
    std::fs::write(path, BUILTIN_JSON.replacen(from, to, 1)).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// A scratch directory `name` holding the built-in table with `from` replaced by `to`, and
/// the configurations without it and with it (FERROCOMM_TUNING): (dir, file, built-in, tuned).
fn changed_table(name: &str, from: &str, to: &str) -> (PathBuf, PathBuf, Config, Config) {
    let dir = scratch(name);
    let file = dir.join("table.json");
    write_changed(&file, from, to);
    let tuned = config(&[("FERROCOMM_TUNING", file.display().to_string())]);
    (dir, file, config(&[]), tuned)
}

/// The plan of `coll` with `bytes` per rank (bf16, a Sum) on a two-rank cuda communicator whose
/// direct access is what `cfg` sets up.
fn cuda_two(cfg: &Config, coll: Collective, bytes: usize, choice: LowPrecisionChoice) -> Plan {
    let kernels = [DataType::F32, DataType::BF16];
    let caps = CudaCaps {
        world: 2,
        dda: Some(ferrocomm::cuda::dda_caps(cfg, 2, None, false)),
        no_dda: "off",
        nccl: true,
        no_nccl: "absent",
        multi_host: false,
        kernel_dtypes: &kernels,
    };
    let (bf16, sum) = (DataType::BF16, ReduceOp::Sum);
    cuda_plan(&caps, cfg, coll, bytes, bf16, sum, Algo::Auto, choice).unwrap()
}

#[test]
fn a_table_file_moves_the_ll_limit_at_exactly_its_size() {
    let (from, to) = (r#""max_part_bytes": "256K""#, r#""max_part_bytes": "64K""#);
    let (dir, file, builtin, tuned) = changed_table("ll", from, to);
    let env = config(&[
        ("FERROCOMM_TUNING", file.display().to_string()),
        ("FERROCOMM_LL_MAX_BYTES", "128K".into()),
    ]);
    let form = |cfg: &Config, coll, bytes| {
        let d = LowPrecisionChoice::Default;
        cuda_two(cfg, coll, bytes, d).parts.map(|p| p.form)
    };
    let colls = [
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::Send,
    ];
    let marks = [64usize << 10, 128 << 10, 256 << 10];
    for bytes in marks
        .iter()
        .flat_map(|&m| [m - 1, m, m + 1])
        .chain([1, 1 << 20])
    {
        let want = |limit: usize| {
            Some(if bytes <= limit {
                PartKind::Ll
            } else {
                PartKind::Staged
            })
        };
        for coll in colls {
            let case = format!("{} of {bytes} bytes", coll.name());
            assert_eq!(form(&builtin, coll, bytes), want(256 << 10), "{case}");
            assert_eq!(form(&tuned, coll, bytes), want(64 << 10), "{case}");
            // FERROCOMM_LL_MAX_BYTES still wins over the table.
            assert_eq!(form(&env, coll, bytes), want(128 << 10), "{case}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_table_file_moves_the_wide_kernel_at_exactly_its_size() {
    let (from, to) = (r#""wide_min_bytes": "32M""#, r#""wide_min_bytes": "8M""#);
    let (dir, _, builtin, tuned) = changed_table("wide", from, to);
    let fp8 = LowPrecisionChoice::On(ferrocomm::Format::E4M3);
    // Two ranks, bf16: a call up to 32 MiB per part is one launch (push, split), so its one
    // kernel is the last one's.
    let kernel = |cfg: &Config, coll, bytes| {
        let lp = cuda_two(cfg, coll, bytes, fp8)
            .lp
            .expect("a low-precision plan");
        assert!(lp.chunk * 2 >= bytes, "{bytes}: one launch");
        lp.last_kernel
    };
    let marks = [8usize << 20, 32 << 20];
    for bytes in marks.iter().flat_map(|&m| [m - 2, m, m + 2]) {
        let want = |limit: usize| {
            if bytes >= limit {
                LpKernel::Wide
            } else {
                LpKernel::Plain
            }
        };
        for coll in [Collective::AllReduce, Collective::AllGather] {
            let case = format!("{} of {bytes} bytes", coll.name());
            assert_eq!(kernel(&builtin, coll, bytes), want(32 << 20), "{case}");
            assert_eq!(kernel(&tuned, coll, bytes), want(8 << 20), "{case}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
