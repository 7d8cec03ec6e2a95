//! `ferrocomm tune` on the host backend with 4 ranks, short: it measures flat and tree with the
//! bench, writes a table whose four-rank all-reduce rule is the crossover it measured, prints
//! the planner's choice beside the best, goes on from its kept runs, and the planner (`info`,
//! `--check`) then uses the table it wrote.

use std::path::{Path, PathBuf};
use std::process::Output;

mod cli_support;
use cli_support::{scratch, text};

/// `ferrocomm ARGS` with a deadline per rank and without a caller's rank variables or table.
fn ferrocomm(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut c = cli_support::ferrocomm();
    c.args(args).env("FERROCOMM_TIMEOUT_S", "60");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run ferrocomm")
}

fn ok(o: &Output) -> String {
    let (out, err) = text(o);
    assert_eq!(o.status.code(), Some(0), "stdout:\n{out}\nstderr:\n{err}");
    out
}

fn tmp(name: &str) -> PathBuf {
    scratch("tune", name)
}

/// The report's rows: (collective, bytes, chosen, best).
fn report_rows(out: &str) -> Vec<(String, usize, String, String)> {
    out.lines()
        .filter(|l| l.starts_with("all_reduce "))
        .map(|l| {
            let c: Vec<&str> = l.split_whitespace().collect();
            (c[0].into(), c[1].parse().unwrap(), c[2].into(), c[4].into())
        })
        .collect()
}

#[test]
fn tune_on_the_host_backend_writes_a_table_the_planner_uses() {
    let dir = tmp("host");
    let table = dir.join("table.json");
    let t = table.to_str().unwrap();
    let out = ok(&ferrocomm(
        &["tune", "-g", "4", "--backend", "host", "--short", "-o", t],
        &[],
    ));
    assert!(
        out.contains("# ferrocomm tune: host backend, 4 ranks, 2 runs (short)"),
        "{out}"
    );
    // Every size of the sweep, 1 KiB to 1 MiB by 4, with the planner's choice under the new
    // table and the best measured.
    let rows = report_rows(&out);
    let sizes: Vec<usize> = rows.iter().map(|r| r.1).collect();
    assert_eq!(
        sizes,
        [1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20],
        "{out}"
    );
    for (_, _, chosen, best) in &rows {
        assert!(["flat", "tree"].contains(&chosen.as_str()), "{out}");
        assert!(["flat", "tree"].contains(&best.as_str()), "{out}");
    }
    // The table: its first all-reduce rule is for exactly 4 ranks, flat up to the size the
    // choices switch at (flat at and below it, tree above), and it is the user's alone.
    let text = std::fs::read_to_string(&table).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let rule = &v["all_reduce"][0];
    assert_eq!(rule["worlds"], "4", "{text}");
    let flat_max = rule["flat_max"].as_u64().unwrap() as usize;
    for (_, size, chosen, _) in &rows {
        let want = if *size <= flat_max { "flat" } else { "tree" };
        assert_eq!(chosen, want, "{size} bytes, flat_max {flat_max}: {out}");
    }
    assert!(rule["measured"]
        .as_str()
        .unwrap()
        .starts_with("ferrocomm tune -g 4 (host, short)"));
    // The other world sizes keep the built-in rules.
    assert_eq!(v["all_reduce"][1]["worlds"], "1-2", "{text}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&table).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "{mode:o}");
    assert!(
        out.contains(&format!("# wrote {t} (all_reduce at 4 ranks: push <= ")),
        "{out}"
    );

    // The runs are kept: the same command measures nothing again and writes the same table.
    let runs = dir.join("table.json.runs");
    let kept: Vec<_> = std::fs::read_dir(&runs).unwrap().collect();
    assert_eq!(kept.len(), 2, "{kept:?}");
    let again = ok(&ferrocomm(
        &["tune", "-g", "4", "--backend", "host", "--short", "-o", t],
        &[],
    ));
    assert_eq!(report_rows(&again), rows);
    assert_eq!(std::fs::read_to_string(&table).unwrap(), text);

    // `--check` measures afresh and weighs the table's choices (on two busy cores some may
    // well be more than 5% off: exit status 1 then, with the sizes listed).
    let o = ferrocomm(
        &[
            "tune",
            "-g",
            "4",
            "--backend",
            "host",
            "--short",
            "--check",
            t,
        ],
        &[],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(&format!("# the choices of {t} against the measured best")),
        "{out}"
    );
    match o.status.code() {
        Some(0) => assert!(
            out.contains("# every choice within 5% of the best"),
            "{out}"
        ),
        Some(1) => assert!(
            out.contains("sizes where the table's choice is more than 5% slower"),
            "{out}"
        ),
        c => panic!("exit {c:?}: {out}"),
    }
    assert_eq!(report_rows(&out).len(), rows.len(), "{out}");

    // `info` shows the table in force and where it came from.
    let info = ok(&ferrocomm(&["info"], &[("FERROCOMM_TUNING", &table)]));
    assert!(
        info.contains(&format!("in force: FERROCOMM_TUNING={t} (digest ")),
        "{info}"
    );
    assert!(info.contains("all_reduce, 4 ranks: push <= "), "{info}");

    // Written to this machine's file (no -o), it is what a communicator here uses.
    let cache = tmp("cache");
    let out = ok(&ferrocomm(
        &["tune", "-g", "4", "--backend", "host", "--short"],
        &[("XDG_CACHE_HOME", &cache)],
    ));
    let written: Vec<_> = std::fs::read_dir(cache.join("ferrocomm/tuning"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".json"))
        .collect();
    assert_eq!(written.len(), 1, "{written:?}");
    assert!(written[0].starts_with("host-"), "{written:?}: {out}");
    let info = ok(&ferrocomm(&["info"], &[("XDG_CACHE_HOME", &cache)]));
    assert!(info.contains("in force: this machine's table "), "{info}");
    let file = cache.join("ferrocomm/tuning").join(&written[0]);
    assert!(
        info.contains(&format!("this machine's table: {} (there)", file.display())),
        "{info}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&cache);
}

#[test]
fn tune_refuses_what_it_cannot_do() {
    let o = ferrocomm(&["tune", "-g", "1", "--backend", "host"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("2 or more ranks"));
    let o = ferrocomm(&["tune", "-g", "2", "--backend", "tpu"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("host or cuda"));
}
