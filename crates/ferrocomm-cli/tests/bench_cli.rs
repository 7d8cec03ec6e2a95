//! `ferrocomm bench` as real processes: ranks started with -g, the nccl-tests table checked
//! row by row, the JSON and PNG outputs, the corruption hook, and refusals before any rank starts.

use std::path::PathBuf;
use std::process::{Command, Output};

mod cli_support;
use cli_support::{ferrocomm, scratch, text, words};

const BIN: &str = env!("CARGO_BIN_EXE_ferrocomm");

/// `ferrocomm bench` with the words of `line` and then `extra` (paths), with a deadline and
/// without a caller's rank variables.
fn bench_command(line: &str, extra: &[&str]) -> Command {
    let mut c = ferrocomm();
    c.arg("bench").args(words(line)).args(extra);
    // A rank that hangs fails the test instead of blocking it.
    c.env("FERROCOMM_TIMEOUT_S", "60");
    c
}

fn bench(line: &str, extra: &[&str]) -> Output {
    bench_command(line, extra).output().expect("run ferrocomm")
}

/// The data lines of the table, split into columns.
fn rows(stdout: &str) -> Vec<Vec<String>> {
    stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect()
}

fn tmp(name: &str) -> PathBuf {
    scratch("bench", name)
}

/// Asserts a clean run: exit 0, the expected sizes, #wrong 0 in both halves of every row.
fn assert_clean(o: &Output, sizes: &[usize]) -> Vec<Vec<String>> {
    let (out, err) = text(o);
    assert_eq!(o.status.code(), Some(0), "stdout:\n{out}\nstderr:\n{err}");
    let r = rows(&out);
    let got: Vec<usize> = r.iter().map(|c| c[0].parse().unwrap()).collect();
    assert_eq!(got, sizes, "{out}");
    for c in &r {
        assert_eq!(c[8], "0", "out-of-place #wrong in {c:?}");
        assert!(c[12] == "0" || c[12] == "N/A", "in-place #wrong in {c:?}");
    }
    assert!(out.contains("# Out of bounds values : 0 OK"), "{out}");
    assert!(out.contains("# Avg bus bandwidth"), "{out}");
    r
}

#[test]
fn all_reduce_two_ranks_with_json_and_plot() {
    let d = tmp("ar2");
    let (json, png) = (d.join("r.json"), d.join("r.png"));
    let o = bench(
        "all_reduce -g 2 -b 1K -e 64K -f 4 -n 3 -w 1 --reps 2",
        &[
            "--json",
            json.to_str().unwrap(),
            "--plot",
            png.to_str().unwrap(),
        ],
    );
    let r = assert_clean(&o, &[1024, 4096, 16384, 65536]);
    let (out, _) = text(&o);
    assert!(out.contains("# Backend: host (no GPU found)"), "{out}");
    assert!(out.contains("Rank  1"), "{out}");
    // size, count (floats), type, redop, root.
    assert_eq!(r[0][1..5], ["256", "float", "sum", "-1"]);
    for c in &r {
        let t: f64 = c[5].parse().unwrap();
        assert!(t > 0.0, "{c:?}");
        // busbw = algbw * 2(n-1)/n = algbw for 2 ranks.
        assert_eq!(c[6], c[7]);
        assert!(["push", "flat", "tree"].contains(&c[13].as_str()), "{c:?}");
    }
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let jrows = v["rows"].as_array().unwrap();
    assert_eq!(jrows.len(), 4);
    assert_eq!(jrows[3]["size"], 65536);
    assert_eq!(jrows[3]["oop"]["wrong"], 0);
    assert_eq!(v["summary"]["complete"], true);
    assert_eq!(v["summary"]["rows_done"], 4);
    assert_eq!(v["context"]["world_size"], 2);
    assert_eq!(v["context"]["ranks"].as_array().unwrap().len(), 2);
    assert!(v["context"]["command_line"][1] == "bench");
    assert!(v["context"]["env"].as_array().unwrap().len() > 10);
    assert!(v["context"]["date"].as_str().unwrap().ends_with('Z'));
    let png = std::fs::read(&png).unwrap();
    assert_eq!(&png[1..4], b"PNG");
    std::fs::remove_dir_all(&d).unwrap();
}

/// Reads the JSON if it is there and holds at least `rows` rows.
fn json_with_rows(path: &std::path::Path, rows: usize) -> Option<serde_json::Value> {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    (v["rows"].as_array()?.len() >= rows).then_some(v)
}

#[test]
fn a_sweep_stopped_by_sigterm_keeps_its_finished_rows() {
    let d = tmp("cut");
    let (json, png) = (d.join("r.json"), d.join("r.png"));
    // 4096 sizes: far more than get done before the signal.
    let mut c = bench_command(
        "all_reduce -g 2 -b 1K -e 4M -i 1K -n 2 -w 1 --reps 1",
        &[
            "--json",
            json.to_str().unwrap(),
            "--plot",
            png.to_str().unwrap(),
        ],
    );
    c.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    // Generous: a debug build on a loaded machine starts slowly; the wait ends at the third row.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    while json_with_rows(&json, 3).is_none() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the sweep ended before it was stopped"
        );
        assert!(std::time::Instant::now() < deadline, "no rows after 180 s");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // The launcher passes SIGTERM on to the ranks.
    // SAFETY: kill has no memory-safety preconditions; the pid is our child's.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let o = child.wait_with_output().unwrap();
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(128 + libc::SIGTERM), "{out}\n{err}");
    let v = json_with_rows(&json, 3).expect("the JSON parses and keeps its rows");
    let jrows = v["rows"].as_array().unwrap();
    for (i, r) in jrows.iter().enumerate() {
        assert_eq!(r["size"], 1024 * (i + 1), "{r}");
        assert_eq!(r["oop"]["wrong"], 0, "{r}");
        assert_eq!(r["ip"]["wrong"], 0, "{r}");
    }
    assert_eq!(v["summary"]["complete"], false);
    assert_eq!(v["summary"]["wrong"], 0);
    assert_eq!(v["summary"]["rows_done"], jrows.len());
    assert_eq!(v["summary"]["rows_planned"], 4096);
    // Rank 0 prints a row before it saves it.
    assert!(rows(&out).len() >= jrows.len(), "{out}");
    assert_eq!(&std::fs::read(&png).unwrap()[1..4], b"PNG");
    let mut names: Vec<String> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["r.json", "r.png"], "no temporary file is left");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn all_reduce_four_ranks_every_op_and_two_dtypes() {
    let o = bench(
        "all_reduce -g 4 -b 256 -e 4K -f 16 -n 2 -w 1 --reps 1 -o all -d bfloat16,int32",
        &[],
    );
    let r = assert_clean(&o, &[256, 4096].repeat(10));
    let ops: std::collections::BTreeSet<&str> = r.iter().map(|c| c[3].as_str()).collect();
    assert_eq!(ops.len(), 5);
    // all_reduce busbw factor for 4 ranks: 1.5.
    let (a, b): (f64, f64) = (r[1][6].parse().unwrap(), r[1][7].parse().unwrap());
    assert!((b - 1.5 * a).abs() <= 0.011 + 0.01 * b, "{:?}", r[1]);
}

#[test]
fn data_movement_and_rooted_collectives_on_three_ranks() {
    let common = "-g 3 -b 192 -e 768 -f 4 -n 2 -w 1 --reps 1";
    for coll in [
        "all_gather",
        "reduce_scatter",
        "all_to_all",
        "all_to_all_v",
        "device_alltoallv",
        "sendrecv",
        "put",
    ] {
        assert_clean(&bench(&format!("{coll} {common}"), &[]), &[192, 768]);
    }
    for coll in ["broadcast", "reduce"] {
        let o = bench(&format!("{coll} {common} -r all -d half"), &[]);
        let r = assert_clean(&o, &[192, 768, 192, 768, 192, 768]);
        let roots: Vec<&str> = r.iter().map(|c| c[4].as_str()).collect();
        assert_eq!(roots, ["0", "0", "1", "1", "2", "2"]);
    }
}

#[test]
fn isolated_mode_runs_and_checks() {
    let o = bench(
        "all_reduce -g 2 -b 4K -e 4K -n 5 -w 1 --isolated --algo tree",
        &[],
    );
    let r = assert_clean(&o, &[4096]);
    assert_eq!(r[0][13], "tree");
    assert!(text(&o).0.contains("mode: isolated"));
}

#[test]
fn corrupted_output_is_counted_and_fails_the_run() {
    let o = bench(
        "all_reduce -g 2 -b 1K -e 4K -f 2 -n 2 -w 1 --reps 1 --debug-corrupt",
        &[],
    );
    let (out, err) = text(&o);
    assert_ne!(o.status.code(), Some(0), "{out}\n{err}");
    let r = rows(&out);
    assert_eq!(r.len(), 3, "{out}\n{err}");
    for c in &r {
        assert_eq!(c[8], "1", "one perturbed element per checked run: {c:?}");
    }
    // The failing rank leaves only after rank 0 printed the summary (the launcher stops the
    // other ranks when one fails).
    assert!(
        out.contains("# Out of bounds values : 3 FAILED"),
        "{out}\n{err}"
    );
}

#[test]
fn corrupted_device_count_all_to_all_v_is_counted() {
    // The device-count row has its own call and its own counts buffer: a wrong element in its
    // output is found like any other.
    let o = bench(
        "device_alltoallv -g 3 -b 384 -e 384 -n 2 -w 1 --reps 1 --debug-corrupt",
        &[],
    );
    let (out, err) = text(&o);
    assert_ne!(o.status.code(), Some(0), "{out}\n{err}");
    let r = rows(&out);
    assert_eq!(r.len(), 1, "{out}\n{err}");
    assert_eq!(r[0][8], "1", "{out}\n{err}");
}

#[test]
fn joins_ranks_started_by_the_launcher() {
    let o = ferrocomm()
        .args(["launch", "-n", "2", "--", BIN, "bench", "all_reduce"])
        .args(["-b", "1K", "-e", "1K", "-n", "2", "-w", "1", "--reps", "1"])
        .env("FERROCOMM_TIMEOUT_S", "60")
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    // Only rank 0 prints the table (the launcher prefixes rank output).
    let lines: Vec<&str> = out.lines().filter(|l| l.contains("     1024 ")).collect();
    assert_eq!(lines.len(), 1, "{out}");
    assert!(lines[0].starts_with("[rank 0]"), "{out}");
    assert!(out.contains("nranks 2"), "{out}");
}

#[test]
fn bad_input_is_refused_before_ranks_start() {
    let cases = [
        ("all_scatter -g 2", "unknown collective"),
        ("all_reduce -d complex64", "unknown dtype"),
        ("all_reduce --frobnicate", "--frobnicate"),
        ("all_reduce -b 2M -e 1M", "larger than -e"),
        ("all_gather -g 3 -b 1K -e 1K", "does not divide"),
        ("broadcast -g 2 -r 5", "-r 5"),
        ("all_reduce -g 2 --vs nccl", "host backend has no NCCL"),
        ("all_reduce -g 2 -G 10", "needs a GPU"),
        ("all_reduce -g 2 --backend cuda", "needs a GPU"),
    ];
    for (args, want) in cases {
        let o = bench(args, &[]);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {out}\n{err}");
        assert!(err.contains(want), "{args:?}: expected '{want}' in:\n{err}");
        assert!(
            out.is_empty(),
            "{args:?}: a refused run prints no table:\n{out}"
        );
    }
}

#[test]
fn info_reports_devices_libraries_thresholds_and_sources() {
    let o = ferrocomm()
        .arg("info")
        .env("FERROCOMM_ALLREDUCE_PUSH_MAX_BYTES", "8K")
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    assert!(out.contains("no GPU") || out.contains("GPU 0:"), "{out}");
    assert!(out.contains("NCCL: ") && out.contains("NVRTC: "), "{out}");
    assert!(
        out.contains("2 ranks: push <= 8 KiB (env FERROCOMM_ALLREDUCE_PUSH_MAX_BYTES)"),
        "{out}"
    );
    assert!(out.contains("kernel cache: "), "{out}");
    assert!(out.contains("host: 4 MiB per rank"), "{out}");
    let o = ferrocomm().args(["info", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["system"]["gpus"].is_array());
    assert!(v["env"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["name"] == "FERROCOMM_TIMEOUT_S"));
}

/// The plans `ferrocomm info` prints (host backend, no GPU here) for `coll`: (size text, plan).
fn info_plans(env: &[(&str, &str)], coll: &str) -> Vec<(String, String)> {
    let o = ferrocomm()
        .arg("info")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    let plans = out.split("\n== Plans").nth(1).expect("a plans section");
    let line = plans
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{coll}: ")))
        .unwrap_or_else(|| panic!("no {coll} line in\n{out}"));
    line.split(", ")
        .map(|cell| {
            let (size, plan) = cell.rsplit_once(' ').expect("size and plan");
            (size.to_string(), plan.to_string())
        })
        .collect()
}

#[test]
fn bench_and_info_print_the_same_plan() {
    // Flat up to 16 KiB, tree above; low precision on or off.
    let flat = ("FERROCOMM_ALLREDUCE_FLAT_MAX_BYTES", "16K");
    for (lp, want) in [("0", ["flat", "tree"]), ("1", ["lp-flat", "lp-tree"])] {
        let env = [flat, ("FERROCOMM_LOW_PRECISION", lp)];
        let o = bench_command("all_reduce -g 2 -b 1K -e 64K -f 64 -n 2 -w 1", &[])
            .envs(env)
            .env("FERROCOMM_DEBUG", "1")
            .output()
            .unwrap();
        // FERROCOMM_DEBUG prints each plan a communicator runs once, as the algo column.
        let (_, err) = text(&o);
        let debug: Vec<&str> = err.lines().filter(|l| l.contains(" runs ")).collect();
        for (bytes, plan) in [(1024, want[0]), (65536, want[1])] {
            let line = format!("'bench': all_reduce of {bytes} bytes per rank (float) runs {plan}");
            let n = |rank| {
                debug
                    .iter()
                    .filter(|l| {
                        l.starts_with(&format!("ferrocomm: rank {rank} ")) && l.ends_with(&line)
                    })
                    .count()
            };
            assert_eq!((n(0), n(1)), (1, 1), "{line} in\n{err}");
        }
        let bench: Vec<String> = assert_clean(&o, &[1024, 65536])
            .into_iter()
            .map(|c| c[13].clone())
            .collect();
        assert_eq!(bench, want, "FERROCOMM_LOW_PRECISION={lp}");
        let info = info_plans(&env, "all_reduce");
        let at = |size: &str| {
            info.iter()
                .find(|(s, _)| s == size)
                .map(|(_, p)| p.clone())
                .unwrap_or_else(|| panic!("no {size} in {info:?}"))
        };
        assert_eq!([at("1 KiB"), at("64 KiB")], want, "{info:?}");
    }
}

#[test]
fn help_lists_every_collective() {
    let out = ferrocomm().args(["bench", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for c in [
        "all_reduce,",
        "all_reduce_rmsnorm",
        "all_gather",
        "reduce_scatter",
        "all_to_all,",
        "all_to_all_v",
        "device_alltoallv",
        "broadcast",
        "reduce ",
        "sendrecv",
    ] {
        assert!(help.contains(c), "bench --help lacks {c}:\n{help}");
    }
}
