//! Rank 0's files (`--json`, `--plot`), rewritten after every finished size so that a sweep cut
//! short (a time limit, SIGTERM or SIGINT, an error on a later size) keeps every row it measured.
//!
//! Each file is written beside its final name and renamed over it, so a reader (or a kill) never
//! sees half a file; a SIGTERM/SIGINT that arrives during a write takes effect right after it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};

use anyhow::Context as _;

use super::args::Plan;
use super::json::{self, Progress, Report, RunContext};
use super::table::{self, Row};

/// What rank 0 writes, and what it needs to write it again after each size.
pub struct Outputs<'a> {
    plan: &'a Plan,
    /// The JSON's context (present when the plan asks for JSON).
    context: Option<RunContext>,
    title: String,
    planned: usize,
}

impl<'a> Outputs<'a> {
    /// Prepares the files the plan asks for; `planned` rows in all, `title` for the plot.
    pub fn new(plan: &'a Plan, context: Option<RunContext>, title: String, planned: usize) -> Self {
        hold::install();
        Outputs {
            plan,
            context,
            title,
            planned,
        }
    }

    /// Writes the files for the rows done so far; `complete` once the sweep has finished.
    pub fn save(&self, rows: &[Row], complete: bool) -> anyhow::Result<()> {
        let _held = hold::Held::begin();
        if let (Some(path), Some(context)) = (&self.plan.json, &self.context) {
            let report = Report {
                context,
                plan: self.plan,
                mode: self.plan.mode.describe(),
                rows,
                summary: Progress {
                    totals: table::summarize(rows),
                    complete,
                    rows_done: rows.len(),
                    rows_planned: self.planned,
                },
            };
            replace(path, |tmp| json::write(tmp, &report))?;
        }
        if let Some(path) = &self.plan.plot {
            if !rows.is_empty() {
                replace(path, |tmp| super::plot::draw(tmp, &self.title, rows))?;
            }
        }
        Ok(())
    }
}

/// A temporary name beside `path`, with the same extension (the plot's encoder picks the image
/// format from it).
fn temp_beside(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map_or_else(|| "out".into(), |n| n.to_string_lossy().into_owned());
    let ext = path
        .extension()
        .map_or_else(|| "tmp".into(), |e| e.to_string_lossy().into_owned());
    path.with_file_name(format!(".{name}.{}.partial.{ext}", std::process::id()))
}

/// Writes `path` through a temporary file renamed over it.
fn replace(path: &Path, write: impl FnOnce(&Path) -> anyhow::Result<()>) -> anyhow::Result<()> {
    let tmp = temp_beside(path);
    let r = write(&tmp).and_then(|()| {
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
    fn replacing_leaves_the_old_file_when_the_write_fails() {
        let d = std::env::temp_dir().join(format!("ferrocomm-output-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("r.png");
        assert_eq!(
            temp_beside(&p).file_name().unwrap().to_str().unwrap(),
            format!(".r.png.{}.partial.png", std::process::id())
        );
        replace(&p, |t| Ok(std::fs::write(t, b"one")?)).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"one");
        let e = replace(&p, |t| {
            std::fs::write(t, b"tw")?;
            anyhow::bail!("cut short")
        });
        assert!(e.is_err());
        assert_eq!(std::fs::read(&p).unwrap(), b"one");
        let left: Vec<_> = std::fs::read_dir(&d).unwrap().collect();
        assert_eq!(left.len(), 1, "the temporary file is removed");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
