//! Reading every rank's flight-recorder dumps together (`ferrocomm trace DIR`): for each
//! communicator, the first call where the ranks diverge (a rank that never made it, ranks that
//! made different calls, a call some rank did not finish) and which rank is missing or stuck.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Result};

/// One rank's dump.
struct Dump {
    rank: usize,
    v: Value,
}

/// Reads every dump in `dir` (files whose name ends in the rank: `<prefix><rank>`, as torch's
/// analyzer takes them).
fn read_dir(dir: &Path) -> Result<Vec<Dump>> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| Error::io(format!("reading the trace directory {}", dir.display()), e))?;
    let mut out = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 || name.starts_with('.') {
            continue;
        }
        let Ok(rank) = name[name.len() - digits..].parse::<usize>() else {
            continue;
        };
        let bytes = std::fs::read(e.path())
            .map_err(|err| Error::io(format!("reading {}", e.path().display()), err))?;
        let v: Value =
            serde_pickle::from_slice(&bytes, serde_pickle::DeOptions::new()).map_err(|err| {
                Error::InvalidArgument(format!(
                    "{} is not a flight-recorder dump: {err}",
                    e.path().display()
                ))
            })?;
        out.push(Dump { rank, v });
    }
    if out.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "no flight-recorder dump (a file named <prefix><rank>) in {}",
            dir.display()
        )));
    }
    out.sort_by_key(|d| d.rank);
    Ok(out)
}

/// "rank 3" or "ranks 1, 2 and 5".
fn ranks(r: &[usize]) -> String {
    let n: Vec<String> = r.iter().map(usize::to_string).collect();
    match n.as_slice() {
        [] => "no rank".into(),
        [one] => format!("rank {one}"),
        [head @ .., last] => format!("ranks {} and {last}", head.join(", ")),
    }
}

/// What a rank recorded of one call.
fn describe(e: &Value) -> String {
    e["ferrocomm_call"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| {
            format!(
                "{} in {} out {}",
                e["profiling_name"].as_str().unwrap_or("?"),
                e["input_sizes"],
                e["output_sizes"]
            )
        })
}

fn state(e: &Value) -> String {
    e["ferrocomm_state"]
        .as_str()
        .or_else(|| e["state"].as_str())
        .unwrap_or("?")
        .to_string()
}

/// The report of every communicator found in the dumps of `dir`.
pub fn analyze(dir: &Path) -> Result<String> {
    let dumps = read_dir(dir)?;
    let mut out = String::new();
    // Every group any dump names: uid -> (its member ranks, its name).
    let mut groups: BTreeMap<String, (Vec<usize>, String)> = BTreeMap::new();
    for d in &dumps {
        if let Some(cfg) = d.v["pg_config"].as_object() {
            for (uid, g) in cfg {
                let members: Vec<usize> = g["ranks"]
                    .as_str()
                    .unwrap_or("[]")
                    .trim_matches(|c| c == '[' || c == ']')
                    .split(',')
                    .filter_map(|t| t.trim().parse().ok())
                    .collect();
                let name = g["ferrocomm_name"].as_str().unwrap_or(uid).to_string();
                groups.entry(uid.clone()).or_insert((members, name));
            }
        }
    }
    for (uid, (members, name)) in &groups {
        report_group(&mut out, &dumps, uid, name, members);
    }
    Ok(out)
}

fn report_group(out: &mut String, dumps: &[Dump], uid: &str, name: &str, members: &[usize]) {
    let have: Vec<&Dump> = dumps.iter().filter(|d| members.contains(&d.rank)).collect();
    let dumped: Vec<usize> = have.iter().map(|d| d.rank).collect();
    let missing_dumps: Vec<usize> = members
        .iter()
        .copied()
        .filter(|r| !dumped.contains(r))
        .collect();
    let _ = writeln!(
        out,
        "communicator '{name}' ({uid}): {} of {} ranks dumped{}",
        dumped.len(),
        members.len(),
        if missing_dumps.is_empty() {
            String::new()
        } else {
            format!("; no dump from {}", ranks(&missing_dumps))
        }
    );
    for d in &have {
        if let Some(f) = d.v["ferrocomm"]["failures"][uid].as_str() {
            let _ = writeln!(out, "  rank {} saw the communicator fail: {f}", d.rank);
        }
    }
    // Collective calls per rank by sequence number.
    let mut calls: BTreeMap<usize, BTreeMap<u64, &Value>> = BTreeMap::new();
    for d in &have {
        let m = calls.entry(d.rank).or_default();
        for e in d.v["entries"].as_array().into_iter().flatten() {
            if e["process_group"][0].as_str() != Some(uid) || e["is_p2p"].as_bool() == Some(true) {
                continue;
            }
            if let Some(s) = e["collective_seq_id"].as_u64() {
                m.insert(s, e);
            }
        }
    }
    let first = calls
        .values()
        .filter_map(|m| m.keys().next().copied())
        .max()
        .unwrap_or(1);
    let last = calls
        .values()
        .filter_map(|m| m.keys().last().copied())
        .max()
        .unwrap_or(0);
    for seq in first..=last {
        let at: BTreeMap<usize, &Value> = calls
            .iter()
            .filter_map(|(r, m)| m.get(&seq).map(|e| (*r, *e)))
            .collect();
        let absent: Vec<usize> = dumped
            .iter()
            .copied()
            .filter(|r| !at.contains_key(r))
            .collect();
        let mut by_call: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (r, e) in &at {
            by_call.entry(describe(e)).or_default().push(*r);
        }
        let unfinished: Vec<usize> = at
            .iter()
            .filter(|(_, e)| !settled(&state(e)))
            .map(|(r, _)| *r)
            .collect();
        if absent.is_empty() && by_call.len() <= 1 && unfinished.is_empty() {
            continue;
        }
        let _ = writeln!(out, "  first divergence at call #{seq}:");
        for (call, rs) in &by_call {
            let states: BTreeSet<String> = rs.iter().map(|r| state(at[r])).collect();
            let states: Vec<String> = states.into_iter().collect();
            let _ = writeln!(
                out,
                "    {} called {call} ({})",
                ranks(rs),
                states.join(", ")
            );
        }
        for r in &absent {
            let last_call = calls[r]
                .iter()
                .next_back()
                .map(|(s, e)| format!("its last call is #{s} {} ({})", describe(e), state(e)))
                .unwrap_or_else(|| "it recorded no call".into());
            let _ = writeln!(out, "    rank {r} never called it: {last_call}");
        }
        // The verdict: who is missing, who differs, who is stuck.
        let mut culprits: Vec<String> = Vec::new();
        let not_there: Vec<usize> = absent.iter().chain(&missing_dumps).copied().collect();
        if !not_there.is_empty() {
            culprits.push(format!(
                "{} {} missing from call #{seq}{}",
                ranks(&not_there),
                if not_there.len() == 1 { "is" } else { "are" },
                if missing_dumps.is_empty() {
                    String::new()
                } else {
                    format!(" ({} left no dump: died?)", ranks(&missing_dumps))
                }
            ));
        }
        if by_call.len() > 1 {
            let majority = by_call.values().map(Vec::len).max().unwrap_or(0);
            let odd: Vec<usize> = by_call
                .values()
                .filter(|v| {
                    v.len() < majority
                        || by_call.values().filter(|w| w.len() == majority).count() > 1
                })
                .flatten()
                .copied()
                .collect();
            culprits.push(format!("{} made a different call", ranks(&odd)));
        }
        if not_there.is_empty() && by_call.len() <= 1 && !unfinished.is_empty() {
            culprits.push(format!(
                "{} did not finish it (stuck or failed)",
                ranks(&unfinished)
            ));
        }
        let _ = writeln!(out, "  => {}", culprits.join("; "));
        return;
    }
    if !missing_dumps.is_empty() {
        let _ = writeln!(
            out,
            "  => {} left no dump (died?); the dumped ranks agree up to call #{last}",
            ranks(&missing_dumps)
        );
    } else {
        let enqueued = calls
            .values()
            .flat_map(|m| m.values())
            .any(|e| matches!(state(e).as_str(), "scheduled" | "began"));
        let _ = writeln!(
            out,
            "  no divergence: every rank made calls #{first} to #{last}{}",
            if enqueued {
                " (finished, or enqueued on a CUDA stream: an enqueued call's end is not recorded)"
            } else {
                " and finished them"
            }
        );
    }
}

/// Whether a call in `state` is no sign of a hang by itself: it finished; or it was enqueued
/// on a CUDA stream (`scheduled`, or `began`: its kernel began, and no later call of its
/// stream shows its end) or captured into a CUDA graph (recorded once, at capture; its
/// replays are not calls). A rank that stopped in a CUDA call shows as the ranks that never
/// made the next one, or as a timeout or failure.
fn settled(state: &str) -> bool {
    matches!(state, "completed" | "scheduled" | "began" | "captured")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Writes rank `rank`'s dump of communicator "g" (ranks 0 and 1) with `calls`: (sequence
    /// number, call, state).
    fn dump(dir: &Path, rank: usize, calls: &[(u64, &str, &str)]) {
        let entries: Vec<Value> = calls
            .iter()
            .map(|(seq, call, st)| {
                json!({
                    "process_group": ["g", "cuda"], "collective_seq_id": seq, "is_p2p": false,
                    "profiling_name": "nccl:all_reduce", "state": "scheduled",
                    "ferrocomm_call": call, "ferrocomm_state": st,
                })
            })
            .collect();
        let v = json!({
            "pg_config": {"g": {"ranks": "[0, 1]", "ferrocomm_name": "g"}},
            "entries": entries,
            "ferrocomm": {"rank": rank, "failures": {}},
        });
        let bytes = serde_pickle::to_vec(&v, serde_pickle::SerOptions::new()).unwrap();
        std::fs::write(
            dir.join(format!("{}{rank}", crate::flight::FILE_PREFIX)),
            bytes,
        )
        .unwrap();
    }

    fn fresh(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!(
            "ferrocomm-trace-{tag}-{}-{}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::create_dir(&d).unwrap();
        d
    }

    const AR: &str = "all_reduce(count=8, dtype=float, op=sum)";

    #[test]
    fn enqueued_and_captured_cuda_calls_are_no_hang() {
        let d = fresh("cuda");
        let calls = [
            (1, AR, "scheduled"),
            (2, AR, "captured"),
            (3, AR, "scheduled"),
        ];
        dump(&d, 0, &calls);
        // Rank 1's kernels marked their start: #1 completed (#3 began after it), #3 began.
        dump(
            &d,
            1,
            &[(1, AR, "completed"), (2, AR, "captured"), (3, AR, "began")],
        );
        let r = analyze(&d).unwrap();
        assert!(
            r.contains("no divergence: every rank made calls #1 to #3 (finished, or enqueued"),
            "{r}"
        );
        assert!(!r.contains("did not finish"), "{r}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_rank_missing_after_enqueued_calls_is_named_at_that_call() {
        let d = fresh("missing");
        dump(
            &d,
            0,
            &[
                (1, AR, "scheduled"),
                (2, AR, "captured"),
                (3, AR, "scheduled"),
            ],
        );
        dump(&d, 1, &[(1, AR, "scheduled"), (2, AR, "captured")]);
        let r = analyze(&d).unwrap();
        assert!(r.contains("first divergence at call #3"), "{r}");
        assert!(
            r.contains("rank 1 never called it: its last call is #2"),
            "{r}"
        );
        assert!(r.contains("=> rank 1 is missing from call #3"), "{r}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_call_still_running_or_timed_out_on_one_rank_is_named() {
        let d = fresh("stuck");
        dump(&d, 0, &[(1, AR, "scheduled"), (2, AR, "completed")]);
        dump(&d, 1, &[(1, AR, "scheduled"), (2, AR, "timed out")]);
        let r = analyze(&d).unwrap();
        assert!(r.contains("first divergence at call #2"), "{r}");
        assert!(
            r.contains("=> rank 1 did not finish it (stuck or failed)"),
            "{r}"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }
}
