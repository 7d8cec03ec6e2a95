//! The tuning table: every size at which the planner's choice changes, as data. The built-in
//! table is `src/config/tuning.json` (each number with the run it was measured in); a table file of the
//! same format replaces it: `FERROCOMM_TUNING=FILE`, else the file `ferrocomm tune` writes for
//! this machine under the user's cache directory ([`machine_file`]). The environment's own
//! settings (`FERROCOMM_ALLREDUCE_PUSH_MAX_BYTES`, ...) still win over any table. The format is
//! docs/tuning.md's "The table file".

use std::fmt;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};

use super::{parse_size, MAX_ENV_BYTES, MAX_WORLD_SIZE};
use crate::error::{Error, Result};
use crate::types::Collective;

/// The built-in table's text.
pub const BUILTIN_JSON: &str = include_str!("tuning.json");

/// The table format this library reads (`"format"` in the file).
pub const FORMAT: u32 = 1;

/// Largest table file read (a table is a few KiB).
const MAX_FILE_BYTES: u64 = 1 << 20;

/// Where the table in force came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum TableSource {
    /// The built-in table.
    BuiltIn,
    /// `FERROCOMM_TUNING`.
    Env(PathBuf),
    /// This machine's file under the cache directory ([`machine_file`]).
    Machine(PathBuf),
}

impl fmt::Display for TableSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TableSource::BuiltIn => f.write_str("built in"),
            TableSource::Env(p) => write!(f, "FERROCOMM_TUNING={}", p.display()),
            TableSource::Machine(p) => write!(f, "this machine's table {}", p.display()),
        }
    }
}

/// A range of world sizes, `"2"`, `"3-4"` or `"5-"` in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Worlds {
    /// The smallest world size of the range.
    pub lo: usize,
    /// The largest (inclusive).
    pub hi: usize,
}

impl Worlds {
    fn parse(s: &str) -> std::result::Result<Worlds, String> {
        let num = |t: &str| {
            t.trim()
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=MAX_WORLD_SIZE).contains(n))
                .ok_or_else(|| format!("{t:?} is not a world size from 1 to {MAX_WORLD_SIZE}"))
        };
        let (lo, hi) = match s.split_once('-') {
            None => (num(s)?, num(s)?),
            Some((a, b)) if b.trim().is_empty() => (num(a)?, MAX_WORLD_SIZE),
            Some((a, b)) => (num(a)?, num(b)?),
        };
        if lo > hi {
            return Err(format!("worlds {s:?}: {lo} is above {hi}"));
        }
        Ok(Worlds { lo, hi })
    }

    fn contains(self, world: usize) -> bool {
        (self.lo..=self.hi).contains(&world)
    }
}

impl fmt::Display for Worlds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.lo == self.hi, self.hi == MAX_WORLD_SIZE) {
            (true, _) => write!(f, "{}", self.lo),
            (false, true) => write!(f, "{}-", self.lo),
            (false, false) => write!(f, "{}-{}", self.lo, self.hi),
        }
    }
}

/// The all-reduce's sizes at one range of world sizes (bytes per rank): push up to `push_max`,
/// flat up to `flat_max`, tree up to `tree_max`, NCCL above (the evaluator,
/// [`crate::plan::select`], also weighs what the backend has).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllReduceRule {
    /// The world sizes it applies to.
    pub worlds: Worlds,
    /// Largest push all-reduce.
    pub push_max: usize,
    /// Largest flat all-reduce.
    pub flat_max: usize,
    /// Largest tree all-reduce.
    pub tree_max: usize,
    /// Where the numbers were measured.
    pub measured: String,
}

/// The largest call (bytes per rank) of some collectives that direct access carries at a range
/// of world sizes; `max` `None`: no limit of its own (the staging still decides).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectRule {
    /// The collectives it applies to.
    pub collectives: Vec<Collective>,
    /// The world sizes it applies to.
    pub worlds: Worlds,
    /// The limit.
    pub max: Option<usize>,
    /// Where the number was measured.
    pub measured: String,
}

/// The table in force: the rules of each choice, first match wins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tuning {
    /// Where it came from.
    pub source: TableSource,
    /// What machine it describes (free text).
    pub machine: String,
    /// The all-reduce's rules.
    pub all_reduce: Vec<AllReduceRule>,
    /// The other collectives' direct-access limits.
    pub direct_max: Vec<DirectRule>,
    /// Smallest message the cuda backend sends in low precision by default.
    pub cuda_lp_min_bytes: usize,
    /// Where `cuda_lp_min_bytes` was measured.
    pub lp_measured: String,
    /// The smallest chunk (input bytes per part) a low-precision one-shot kernel runs as its
    /// wide form (two CTAs per SM).
    pub lp_wide_min_bytes: usize,
    /// Where `lp_wide_min_bytes` was measured.
    pub lp_wide_measured: String,
    /// The largest part (bytes) the cuda collectives send in LL lines; staged above
    /// (`FERROCOMM_LL_MAX_BYTES` wins over it).
    pub ll_max_bytes: usize,
    /// Where `ll_max_bytes` was measured.
    pub ll_measured: String,
    /// Bytes of one round of a pipelined staged collective.
    pub pipe_round_bytes: usize,
    /// The smallest part of each staged kernel that runs in rounds (kernels without one: never).
    pub pipe_min: Vec<(String, usize)>,
    /// Where the pipelining sizes were measured.
    pub pipe_measured: String,
    /// A digest of the rules (not of the source or the text): ranks compare it at start-up.
    pub digest: String,
}

/// The table in force as the configuration serializes it: where it came from and its digest.
pub fn serialize_in_force<S: serde::Serializer>(
    t: &Arc<Tuning>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    use serde::ser::SerializeStruct;
    let mut st = s.serialize_struct("Tuning", 2)?;
    st.serialize_field("source", &t.source.to_string())?;
    st.serialize_field("digest", &t.digest)?;
    st.end()
}

/// A size in the file: a number of bytes, or a string with a K/M/G suffix.
#[derive(Deserialize)]
#[serde(untagged)]
enum FileSize {
    Bytes(u64),
    Text(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileAllReduce {
    worlds: String,
    push_max: FileSize,
    flat_max: FileSize,
    tree_max: FileSize,
    #[serde(default)]
    measured: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDirect {
    collectives: Vec<String>,
    worlds: String,
    #[serde(default)]
    max: Option<FileSize>,
    #[serde(default)]
    measured: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileLowPrecision {
    cuda_min_bytes: FileSize,
    #[serde(default)]
    measured: String,
    /// Absent (a file of an earlier library): the built-in table's.
    #[serde(default)]
    wide_min_bytes: Option<FileSize>,
    #[serde(default)]
    wide_measured: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileLl {
    max_part_bytes: FileSize,
    #[serde(default)]
    measured: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FilePipelined {
    round_bytes: FileSize,
    min_part_bytes: std::collections::BTreeMap<String, FileSize>,
    #[serde(default)]
    measured: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileTable {
    format: u32,
    #[serde(default)]
    machine: String,
    all_reduce: Vec<FileAllReduce>,
    direct_max: Vec<FileDirect>,
    low_precision: FileLowPrecision,
    pipelined: FilePipelined,
    /// Absent (a file of an earlier library): the built-in table's.
    #[serde(default)]
    ll: Option<FileLl>,
}

/// The staged kernels that may run in rounds (`fc_<kernel>_rw`).
const PIPELINED_KERNELS: [&str; 5] = [
    "all_gather",
    "all_to_all",
    "reduce_scatter",
    "broadcast",
    "reduce",
];

impl Tuning {
    /// The built-in table (read once per process).
    pub fn builtin() -> Arc<Tuning> {
        static BUILTIN: OnceLock<Arc<Tuning>> = OnceLock::new();
        BUILTIN
            .get_or_init(|| {
                Arc::new(
                    Tuning::parse(BUILTIN_JSON, TableSource::BuiltIn)
                        .expect("the built-in table is valid"),
                )
            })
            .clone()
    }

    /// Reads a table from its JSON text; an error names what is wrong, and where.
    pub fn parse(text: &str, source: TableSource) -> Result<Tuning> {
        let bad = |why: String| Error::InvalidArgument(format!("tuning table ({source}): {why}"));
        let f: FileTable = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        if f.format != FORMAT {
            return Err(bad(format!(
                "format {} (this library reads format {FORMAT})",
                f.format
            )));
        }
        let size = |what: &str, s: &FileSize| -> Result<usize> {
            let n = match s {
                FileSize::Bytes(n) => usize::try_from(*n).ok(),
                FileSize::Text(t) => parse_size(t).ok(),
            };
            n.filter(|n| *n <= MAX_ENV_BYTES).ok_or_else(|| {
                let shown = match s {
                    FileSize::Bytes(n) => n.to_string(),
                    FileSize::Text(t) => format!("{t:?}"),
                };
                bad(format!(
                    "{what}: {shown} is not a size of at most {MAX_ENV_BYTES} bytes (a number, \
                     or a string with K, M or G)"
                ))
            })
        };
        let worlds =
            |what: &str, s: &str| Worlds::parse(s).map_err(|why| bad(format!("{what}: {why}")));
        let mut all_reduce = Vec::new();
        for (i, r) in f.all_reduce.iter().enumerate() {
            let at = format!("all_reduce[{i}]");
            all_reduce.push(AllReduceRule {
                worlds: worlds(&at, &r.worlds)?,
                push_max: size(&format!("{at}.push_max"), &r.push_max)?,
                flat_max: size(&format!("{at}.flat_max"), &r.flat_max)?,
                tree_max: size(&format!("{at}.tree_max"), &r.tree_max)?,
                measured: r.measured.clone(),
            });
        }
        // Every world size has an all-reduce rule.
        if let Some(w) =
            (1..=MAX_WORLD_SIZE).find(|&w| !all_reduce.iter().any(|r| r.worlds.contains(w)))
        {
            return Err(bad(format!("no all_reduce rule for a world of {w}")));
        }
        let mut direct_max = Vec::new();
        for (i, r) in f.direct_max.iter().enumerate() {
            let at = format!("direct_max[{i}]");
            let collectives = r
                .collectives
                .iter()
                .map(|c| {
                    c.parse::<Collective>()
                        .ok()
                        .filter(|c| !matches!(c, Collective::AllReduce | Collective::Barrier))
                        .ok_or_else(|| {
                            bad(format!(
                                "{at}: {c:?} is not a collective with a direct-access limit"
                            ))
                        })
                })
                .collect::<Result<Vec<_>>>()?;
            direct_max.push(DirectRule {
                collectives,
                worlds: worlds(&at, &r.worlds)?,
                max: r
                    .max
                    .as_ref()
                    .map(|m| size(&format!("{at}.max"), m))
                    .transpose()?,
                measured: r.measured.clone(),
            });
        }
        let mut pipe_min = Vec::new();
        for (k, s) in &f.pipelined.min_part_bytes {
            if !PIPELINED_KERNELS.contains(&k.as_str()) {
                return Err(bad(format!(
                    "pipelined.min_part_bytes: {k:?} is not a staged kernel ({})",
                    PIPELINED_KERNELS.join(", ")
                )));
            }
            pipe_min.push((
                k.clone(),
                size(&format!("pipelined.min_part_bytes.{k}"), s)?,
            ));
        }
        let pipe_round_bytes = size("pipelined.round_bytes", &f.pipelined.round_bytes)?;
        if pipe_round_bytes == 0 {
            return Err(bad("pipelined.round_bytes must be at least 1".into()));
        }
        let cuda_lp_min_bytes = size(
            "low_precision.cuda_min_bytes",
            &f.low_precision.cuda_min_bytes,
        )?;
        // Limits a file of an earlier library lacks are the built-in table's (which has them all).
        let builtin = || Tuning::builtin();
        let lp_wide_min_bytes = match &f.low_precision.wide_min_bytes {
            Some(s) => size("low_precision.wide_min_bytes", s)?,
            None => builtin().lp_wide_min_bytes,
        };
        let lp_wide_measured = match f.low_precision.wide_measured {
            Some(m) => m,
            None if f.low_precision.wide_min_bytes.is_some() => String::new(),
            None => builtin().lp_wide_measured.clone(),
        };
        let (ll_max_bytes, ll_measured) = match &f.ll {
            Some(l) => (
                size("ll.max_part_bytes", &l.max_part_bytes)?,
                l.measured.clone(),
            ),
            None => (builtin().ll_max_bytes, builtin().ll_measured.clone()),
        };
        let mut t = Tuning {
            source,
            machine: f.machine,
            all_reduce,
            direct_max,
            cuda_lp_min_bytes,
            lp_measured: f.low_precision.measured,
            lp_wide_min_bytes,
            lp_wide_measured,
            ll_max_bytes,
            ll_measured,
            pipe_round_bytes,
            pipe_min,
            pipe_measured: f.pipelined.measured,
            digest: String::new(),
        };
        t.digest = t.rules_digest();
        Ok(t)
    }

    /// Reads the table file at `path` (a file of this user's that no one else can write, not a
    /// symbolic link, at most 1 MiB).
    pub fn read(path: &Path, source: TableSource) -> Result<Tuning> {
        let bad =
            |why: String| Error::InvalidArgument(format!("tuning table {}: {why}", path.display()));
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| bad(format!("cannot open it ({e})")))?;
        let meta = f.metadata().map_err(|e| bad(e.to_string()))?;
        let me = rustix::process::geteuid().as_raw();
        if !meta.is_file() {
            return Err(bad("not a regular file".into()));
        }
        if meta.uid() != me || meta.mode() & 0o022 != 0 {
            return Err(bad(format!(
                "refused: owned by uid {} with mode {:o} (it must be yours and writable by no \
                 one else: it decides how every call runs)",
                meta.uid(),
                meta.mode() & 0o7777
            )));
        }
        if meta.len() > MAX_FILE_BYTES {
            return Err(bad(format!(
                "{} bytes, more than {MAX_FILE_BYTES}",
                meta.len()
            )));
        }
        let mut text = String::new();
        f.read_to_string(&mut text)
            .map_err(|e| bad(format!("not readable as UTF-8 text ({e})")))?;
        Tuning::parse(&text, source)
    }

    /// The table in force for `tuning_file` (`FERROCOMM_TUNING`) and this machine's `key` (see
    /// [`machine_file`]; `None`: not looked for): the file named, else this machine's file where
    /// it exists, else the built-in table.
    pub fn in_force(
        tuning_file: Option<&Path>,
        dir: &Path,
        key: Option<&str>,
    ) -> Result<Arc<Tuning>> {
        if let Some(p) = tuning_file {
            return Tuning::read(p, TableSource::Env(p.to_path_buf())).map(Arc::new);
        }
        if let Some(key) = key {
            let p = machine_file(dir, key);
            if std::fs::symlink_metadata(&p).is_ok() {
                return Tuning::read(&p, TableSource::Machine(p.clone())).map(Arc::new);
            }
        }
        Ok(Tuning::builtin())
    }

    /// The all-reduce's (push_max, flat_max, tree_max) at `world` ranks.
    pub fn all_reduce(&self, world: usize) -> (usize, usize, usize) {
        let r = self
            .all_reduce
            .iter()
            .find(|r| r.worlds.contains(world.max(1)))
            .expect("every world size has a rule (checked when read)");
        (r.push_max, r.flat_max, r.tree_max)
    }

    /// The direct-access limit of `coll` at `world` ranks: the first rule that names both;
    /// `None` where none does or it sets no limit.
    pub fn direct_max(&self, coll: Collective, world: usize) -> Option<usize> {
        self.direct_max
            .iter()
            .find(|r| r.worlds.contains(world.max(1)) && r.collectives.contains(&coll))
            .and_then(|r| r.max)
    }

    /// The smallest part of the staged `kernel` that runs in rounds; `None`: never.
    pub fn pipe_min(&self, kernel: &str) -> Option<usize> {
        self.pipe_min
            .iter()
            .find(|(k, _)| k == kernel)
            .map(|&(_, n)| n)
    }

    /// The table as JSON in the file format (what `ferrocomm tune` writes and `info` shows).
    pub fn to_json(&self) -> String {
        let all_reduce: Vec<serde_json::Value> = self
            .all_reduce
            .iter()
            .map(|r| {
                serde_json::json!({
                    "worlds": r.worlds.to_string(),
                    "push_max": r.push_max,
                    "flat_max": r.flat_max,
                    "tree_max": r.tree_max,
                    "measured": r.measured,
                })
            })
            .collect();
        let direct_max: Vec<serde_json::Value> = self
            .direct_max
            .iter()
            .map(|r| {
                let mut v = serde_json::json!({
                    "collectives": r.collectives.iter().map(|c| c.name()).collect::<Vec<_>>(),
                    "worlds": r.worlds.to_string(),
                    "measured": r.measured,
                });
                if let Some(m) = r.max {
                    v["max"] = m.into();
                }
                v
            })
            .collect();
        let pipe: serde_json::Map<String, serde_json::Value> = self
            .pipe_min
            .iter()
            .map(|(k, n)| (k.clone(), (*n).into()))
            .collect();
        let v = serde_json::json!({
            "format": FORMAT,
            "machine": self.machine,
            "all_reduce": all_reduce,
            "direct_max": direct_max,
            "low_precision": {
                "cuda_min_bytes": self.cuda_lp_min_bytes,
                "measured": self.lp_measured,
                "wide_min_bytes": self.lp_wide_min_bytes,
                "wide_measured": self.lp_wide_measured,
            },
            "ll": {
                "max_part_bytes": self.ll_max_bytes,
                "measured": self.ll_measured,
            },
            "pipelined": {
                "round_bytes": self.pipe_round_bytes,
                "min_part_bytes": pipe,
                "measured": self.pipe_measured,
            },
        });
        serde_json::to_string_pretty(&v).expect("serializes") + "\n"
    }

    /// A digest of what decides (every rule's numbers, not the text around them).
    fn rules_digest(&self) -> String {
        let mut s = String::new();
        for r in &self.all_reduce {
            s += &format!(
                "a{}:{}:{}:{}:{};",
                r.worlds, r.push_max, r.flat_max, r.tree_max, 0
            );
        }
        for r in &self.direct_max {
            let cs: Vec<&str> = r.collectives.iter().map(|c| c.name()).collect();
            s += &format!("d{}:{}:{:?};", cs.join(","), r.worlds, r.max);
        }
        s += &format!("l{};r{};", self.cuda_lp_min_bytes, self.pipe_round_bytes);
        s += &format!("w{};ll{};", self.lp_wide_min_bytes, self.ll_max_bytes);
        for (k, n) in &self.pipe_min {
            s += &format!("p{k}:{n};");
        }
        // FNV-1a, 64 bits: a digest to compare, not a defence (the ranks trust each other).
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in s.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        format!("{h:016x}")
    }
}

/// This machine's table file for `key` under `dir` (the cache directory's `tuning/`):
/// `<dir>/<key>.json`.
pub fn machine_file(dir: &Path, key: &str) -> PathBuf {
    dir.join(format!("{key}.json"))
}

/// The host backend's key on this machine: `host-<cpus>cpus` (the CPUs this process may use).
pub fn host_key() -> String {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    machine_key(&["host", &format!("{cpus}cpus")])
}

/// The key of a machine's table: the backend, and for GPUs the model, the count and the links
/// (`cuda-nvidia-h200-x8-nvlink`); every character outside `[a-z0-9.-]` becomes `-`.
pub fn machine_key(parts: &[&str]) -> String {
    let raw = parts.join("-").to_ascii_lowercase();
    let mut k: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    while k.contains("--") {
        k = k.replace("--", "-");
    }
    k.trim_matches('-').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_table_reads_and_cites_runs_that_exist() {
        let t = Tuning::builtin();
        assert_eq!(t.all_reduce(2), (64 << 10, 32 << 20, 32 << 20));
        assert_eq!(t.all_reduce(4), (32 << 10, 512 << 10, 8 << 20));
        assert_eq!(t.all_reduce(16), (16 << 10, 256 << 10, 64 << 20));
        assert_eq!(t.direct_max(Collective::AllToAllV, 2), None);
        assert_eq!(t.direct_max(Collective::AllGather, 8), Some(16 << 20));
        assert_eq!((t.ll_max_bytes, t.lp_wide_min_bytes), (256 << 10, 32 << 20));
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let cited = t
            .all_reduce
            .iter()
            .map(|r| &r.measured)
            .chain(t.direct_max.iter().map(|r| &r.measured))
            .chain([
                &t.lp_measured,
                &t.pipe_measured,
                &t.lp_wide_measured,
                &t.ll_measured,
            ]);
        for m in cited {
            assert!(
                !m.is_empty(),
                "every built-in number says where it was measured"
            );
            if let Some(rest) = m.strip_prefix("bench/results/") {
                let run = rest.split(':').next().unwrap();
                assert!(root.join("bench/results").join(run).is_dir(), "{run} cited");
            }
        }
        // Written out and read back, the same rules.
        let again = Tuning::parse(&t.to_json(), TableSource::BuiltIn).unwrap();
        assert_eq!(again, *t);
    }

    #[test]
    fn a_bad_table_is_refused_naming_what_is_wrong() {
        let with = |from: &str, to: &str| {
            let text = BUILTIN_JSON.replacen(from, to, 1);
            assert_ne!(text, BUILTIN_JSON, "{from} in the built-in table");
            Tuning::parse(&text, TableSource::BuiltIn)
                .unwrap_err()
                .to_string()
        };
        assert!(with("\"format\": 1", "\"format\": 2").contains("format 2"));
        assert!(with("\"push_max\": \"64K\"", "\"push_max\": \"64Q\"")
            .contains("all_reduce[0].push_max"));
        assert!(with("\"worlds\": \"5-\"", "\"worlds\": \"6-\"")
            .contains("no all_reduce rule for a world of 5"));
        assert!(with("\"worlds\": \"3-4\"", "\"worlds\": \"4-3\"").contains("4 is above 3"));
        assert!(
            with("\"all_gather\", \"reduce_scatter\"", "\"all_gathr\"").contains("\"all_gathr\"")
        );
        assert!(with("\"machine\"", "\"machin\"").contains("unknown field"));
        assert!(with("\"round_bytes\": \"4M\"", "\"round_bytes\": 0").contains("at least 1"));
        assert!(
            with("\"max_part_bytes\": \"256K\"", "\"max_part_bytes\": \"1T\"")
                .contains("ll.max_part_bytes")
        );
        assert!(
            with("\"wide_min_bytes\": \"32M\"", "\"wide_min_bytes\": \"32X\"")
                .contains("low_precision.wide_min_bytes")
        );
    }

    #[test]
    fn a_table_without_the_later_limits_takes_the_built_in_ones() {
        // A file of an earlier library: no LL limit, no wide kernel's size.
        let mut v: serde_json::Value = serde_json::from_str(BUILTIN_JSON).unwrap();
        v.as_object_mut().unwrap().remove("ll");
        let lp = v["low_precision"].as_object_mut().unwrap();
        lp.remove("wide_min_bytes");
        lp.remove("wide_measured");
        v["low_precision"]["cuda_min_bytes"] = "2M".into();
        let t = Tuning::parse(&v.to_string(), TableSource::BuiltIn).unwrap();
        let b = Tuning::builtin();
        assert_eq!(t.cuda_lp_min_bytes, 2 << 20);
        assert_eq!(
            (t.ll_max_bytes, t.lp_wide_min_bytes),
            (b.ll_max_bytes, b.lp_wide_min_bytes)
        );
        assert_eq!(t.ll_measured, b.ll_measured);
        // Set, they are the file's, and the digest tells the tables apart.
        v["ll"] = serde_json::json!({"max_part_bytes": "64K"});
        v["low_precision"]["wide_min_bytes"] = "8M".into();
        let t2 = Tuning::parse(&v.to_string(), TableSource::BuiltIn).unwrap();
        assert_eq!((t2.ll_max_bytes, t2.lp_wide_min_bytes), (64 << 10, 8 << 20));
        assert_ne!(t2.digest, t.digest);
    }

    #[test]
    fn machine_keys_are_plain_file_names() {
        assert_eq!(
            machine_key(&["cuda", "NVIDIA H200", "x8", "nvlink"]),
            "cuda-nvidia-h200-x8-nvlink"
        );
        assert_eq!(machine_key(&["host", "../../etc/x"]), "host-..-..-etc-x");
        assert!(!machine_key(&["a/b", "c d"]).contains('/'));
    }
}
