//! `--json FILE`: every row and the context of the run (machine, libraries, settings, revision,
//! date, command line), for tools and for the results archive.

use std::time::{SystemTime, UNIX_EPOCH};

use super::args::Plan;
use super::table::{Row, Summary};
use crate::info::{EnvEntry, SystemInfo};

/// One rank as it reported itself.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RankInfo {
    pub rank: usize,
    pub pid: u32,
    pub host: String,
    pub device: String,
}

/// Where and how the run happened.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunContext {
    /// UTC, ISO 8601.
    pub date: String,
    pub hostname: String,
    pub command_line: Vec<String>,
    /// The commit the binary was built from, when built inside a git checkout.
    pub git_revision: Option<String>,
    pub ferrocomm_version: &'static str,
    /// The backend that ran (`host`, `cuda`, `nccl`) and why, as in the table's header.
    pub backend: String,
    pub world_size: usize,
    pub ranks: Vec<RankInfo>,
    pub system: SystemInfo,
    /// Every variable of `Config::table()` with its value and source.
    pub env: Vec<EnvEntry>,
}

/// The plan as the file shows it: in the words of the header and the rows.
#[derive(Debug, serde::Serialize)]
pub struct PlanJson<'a> {
    #[serde(flatten)]
    pub plan: &'a Plan,
    /// Where each measurement starts, as in the header: `device` (a device-side line-up) or
    /// `host`.
    pub start: &'static str,
    /// Element types by the rows' names (`float`, `half`, ...).
    pub dtypes: Vec<&'static str>,
    /// Reduction operators by the rows' names; absent for collectives that do not reduce.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ops: Option<Vec<&'static str>>,
}

impl<'a> PlanJson<'a> {
    /// `device_start`: whether the measurements start on the device in this run.
    pub fn new(plan: &'a Plan, device_start: bool) -> Self {
        PlanJson {
            plan,
            start: if device_start { "device" } else { "host" },
            dtypes: plan.dtypes.iter().map(|d| d.name()).collect(),
            ops: plan
                .coll
                .reduces()
                .then(|| plan.ops.iter().map(|o| o.name()).collect()),
        }
    }
}

/// The whole file.
#[derive(Debug, serde::Serialize)]
pub struct Report<'a> {
    pub context: &'a RunContext,
    pub plan: PlanJson<'a>,
    pub mode: String,
    pub rows: &'a [Row],
    pub summary: Progress,
}

/// The footer's totals over the rows written, and how far the sweep got.
#[derive(Debug, serde::Serialize)]
pub struct Progress {
    #[serde(flatten)]
    pub totals: Summary,
    /// False until every size has run: the file is rewritten after each one, so a sweep cut
    /// short leaves the rows it finished, marked incomplete.
    pub complete: bool,
    pub rows_done: usize,
    pub rows_planned: usize,
}

pub fn git_revision() -> Option<String> {
    let r = env!("FERROCOMM_GIT_REVISION");
    (!r.is_empty()).then(|| r.to_string())
}

/// Days since 1970-01-01 to a civil (proleptic Gregorian) date.
fn civil(days: i64) -> (i64, u32, u32) {
    // Eras of 400 years (146097 days) starting on March 1st, so that leap days end a year.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// A Unix time as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn iso8601(unix_secs: i64) -> String {
    let (y, mo, d) = civil(unix_secs.div_euclid(86_400));
    let s = unix_secs.rem_euclid(86_400);
    format!(
        "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}Z",
        s / 3600,
        (s / 60) % 60,
        s % 60
    )
}

pub fn now_iso8601() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    iso8601(secs)
}

/// The file's text.
pub fn render(report: &Report<'_>) -> anyhow::Result<Vec<u8>> {
    let mut text = serde_json::to_vec_pretty(report)?;
    text.push(b'\n');
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::table::Measure;

    #[test]
    fn dates() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso8601(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(iso8601(1_709_210_096), "2024-02-29T12:34:56Z");
        assert_eq!(iso8601(4_102_444_799), "2099-12-31T23:59:59Z");
    }

    #[test]
    fn report_holds_rows_and_context() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            a: crate::bench::BenchArgs,
        }
        let plan = Cli::try_parse_from(["b", "all_reduce", "-b", "1K", "-e", "2K", "-f", "2"])
            .unwrap()
            .a
            .plan()
            .unwrap();
        let ctx = RunContext {
            date: iso8601(0),
            hostname: "h".into(),
            command_line: vec!["ferrocomm".into(), "bench".into()],
            git_revision: Some("abc".into()),
            ferrocomm_version: "0.1.0",
            backend: "host (no GPU found)".into(),
            world_size: 2,
            ranks: vec![],
            system: SystemInfo::default(),
            env: vec![],
        };
        let m = Measure {
            time_us: 3.5,
            algbw: 0.29,
            busbw: 0.29,
            wrong: Some(0),
        };
        let rows = vec![Row {
            collective: "all_reduce",
            size: 1024,
            count: 256,
            dtype: "float",
            redop: "sum",
            root: -1,
            algo: "flat".into(),
            oop: m,
            ip: Some(m),
            nccl: None,
        }];
        let r = Report {
            context: &ctx,
            plan: PlanJson::new(&plan, false),
            mode: "eager".into(),
            rows: &rows,
            summary: Progress {
                totals: crate::bench::table::summarize(&rows),
                complete: true,
                rows_done: 1,
                rows_planned: 1,
            },
        };
        let v: serde_json::Value = serde_json::to_value(&r).unwrap();
        assert_eq!(v["rows"][0]["size"], 1024);
        assert_eq!(v["rows"][0]["oop"]["time_us"], 3.5);
        assert_eq!(v["rows"][0]["oop"]["wrong"], 0);
        assert_eq!(v["rows"][0]["algo"], "flat");
        assert_eq!(v["context"]["git_revision"], "abc");
        assert_eq!(v["context"]["backend"], "host (no GPU found)");
        assert_eq!(v["plan"]["sizes"], serde_json::json!([1024, 2048]));
        // The plan in the rows' and the header's words.
        assert_eq!(v["plan"]["start"], "host");
        assert_eq!(v["plan"]["dtypes"], serde_json::json!(["float"]));
        assert_eq!(v["plan"]["ops"], serde_json::json!(["sum"]));
        assert!(v["plan"].get("device_start").is_none(), "{}", v["plan"]);
        let gather = Cli::try_parse_from(["b", "all_gather", "-d", "half,bfloat16"])
            .unwrap()
            .a
            .plan()
            .unwrap();
        let g = serde_json::to_value(PlanJson::new(&gather, true)).unwrap();
        assert_eq!(g["start"], "device");
        assert_eq!(g["dtypes"], serde_json::json!(["half", "bfloat16"]));
        assert!(g.get("ops").is_none(), "all_gather has no ops: {g}");
        assert_eq!(v["summary"]["wrong"], 0);
    }
}
