//! Rank 0's files (`--json`, `--plot`), rewritten after every finished size so that a sweep cut
//! short (a time limit, SIGTERM or SIGINT, an error on a later size) keeps every row it measured.
//!
//! Each file is first made in memory (the plot takes seconds in a debug build), then written
//! beside its final name and renamed over it, so a reader never sees half a file. A SIGTERM/SIGINT
//! that arrives while a file is made ends the process at once (nothing is on disk yet); one that
//! arrives while the bytes are written and renamed (milliseconds) takes effect right after, well
//! inside the launcher's grace before SIGKILL: no temporary file is left behind.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};

use anyhow::Context as _;

use super::args::Plan;
use super::json::{self, Progress, Report, RunContext};
use super::table::{self, Row};

/// What rank 0 writes, and what it needs to write it again after each size.
pub struct Outputs<'a> {
    plan: &'a Plan,
    /// Whether the measurements start on the device (as the header says).
    device_start: bool,
    /// The JSON's context (present when the plan asks for JSON).
    context: Option<RunContext>,
    title: String,
    planned: usize,
}

impl<'a> Outputs<'a> {
    /// Prepares the files the plan asks for; `planned` rows in all, `title` for the plot.
    pub fn new(
        plan: &'a Plan,
        device_start: bool,
        context: Option<RunContext>,
        title: String,
        planned: usize,
    ) -> Self {
        hold::install();
        Outputs {
            plan,
            device_start,
            context,
            title,
            planned,
        }
    }

    /// Writes the files for the rows done so far; `complete` once the sweep has finished.
    pub fn save(&self, rows: &[Row], complete: bool) -> anyhow::Result<()> {
        let mut files: Vec<(&Path, Vec<u8>)> = Vec::new();
        if let (Some(path), Some(context)) = (&self.plan.json, &self.context) {
            let report = Report {
                context,
                plan: json::PlanJson::new(self.plan, self.device_start),
                mode: self.plan.mode.describe(),
                rows,
                summary: Progress {
                    totals: table::summarize(rows),
                    complete,
                    rows_done: rows.len(),
                    rows_planned: self.planned,
                },
            };
            files.push((path, json::render(&report)?));
        }
        if let Some(path) = &self.plan.plot {
            if !rows.is_empty() {
                files.push((path, super::plot::render(&self.title, rows)?));
            }
        }
        // Only the writes are held: both files show the same rows once a signal takes effect.
        let _held = hold::Held::begin();
        for (path, bytes) in files {
            replace(path, &bytes)?;
        }
        Ok(())
    }
}

/// A temporary name beside `path` (same directory, so the rename cannot cross file systems).
fn temp_beside(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map_or_else(|| "out".into(), |n| n.to_string_lossy().into_owned());
    path.with_file_name(format!(".{name}.{}.partial", std::process::id()))
}

/// Writes `bytes` to `path` through a temporary file renamed over it.
fn replace(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let tmp = temp_beside(path);
    let r = std::fs::write(&tmp, bytes)
        .with_context(|| format!("writing {}", tmp.display()))
        .and_then(|()| {
            std::fs::rename(&tmp, path)
                .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
        });
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

/// Holding SIGTERM and SIGINT back while the files are written.
mod hold {
    use super::*;

    /// 0: no write under way; 1: writing; otherwise the signal that arrived during the write.
    static STATE: AtomicI32 = AtomicI32::new(0);

    /// Ends the process the way the signal would have without our handler.
    fn die(sig: i32) {
        // SAFETY: signal and raise are async-signal-safe and have no memory preconditions;
        // with the default disposition back, raise terminates the process.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }

    extern "C" fn on_signal(sig: libc::c_int) {
        // Only atomics and `die`: all async-signal-safe. During a write the signal waits for
        // its end; a second one during the same write changes nothing.
        if let Err(0) = STATE.compare_exchange(1, sig, Ordering::SeqCst, Ordering::SeqCst) {
            die(sig);
        }
    }

    /// Catches SIGTERM and SIGINT for the rest of the process (rank 0 with files to write).
    pub fn install() {
        for sig in [libc::SIGTERM, libc::SIGINT] {
            // SAFETY: sigaction is plain data, valid when zeroed; the handler touches only an
            // atomic and async-signal-safe calls. SA_RESTART keeps the store's blocking reads
            // going when a signal is held back.
            unsafe {
                let mut act: libc::sigaction = std::mem::zeroed();
                act.sa_sigaction = on_signal as *const () as libc::sighandler_t;
                act.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut act.sa_mask);
                libc::sigaction(sig, &act, std::ptr::null_mut());
            }
        }
    }

    /// A write under way; a signal held back during it is acted on when it drops.
    pub struct Held;

    impl Held {
        pub fn begin() -> Self {
            STATE.store(1, Ordering::SeqCst);
            Held
        }
    }

    impl Drop for Held {
        fn drop(&mut self) {
            let sig = STATE.swap(0, Ordering::SeqCst);
            if sig > 1 {
                die(sig);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replacing_leaves_the_old_file_when_the_rename_fails() {
        let d = std::env::temp_dir().join(format!("ferrocomm-output-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("r.png");
        assert_eq!(
            temp_beside(&p).file_name().unwrap().to_str().unwrap(),
            format!(".r.png.{}.partial", std::process::id())
        );
        replace(&p, b"one").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"one");
        replace(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        // A directory in the way: the rename fails and the temporary file goes.
        let blocked = d.join("dir");
        std::fs::create_dir_all(blocked.join("inside")).unwrap();
        assert!(replace(&blocked, b"three").is_err());
        assert!(blocked.join("inside").is_dir());
        let mut left: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["dir", "r.png"], "the temporary file is removed");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
