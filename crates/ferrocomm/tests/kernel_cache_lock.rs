//! The kernel cache's lock between processes (`ferrocomm::cuda::kernel_cache`), with a fake
//! compile step in real processes: this test binary run again as a child (`FC_LOCK_ROLE` set),
//! which reports the cache's events on stdout, one line each.
//!
//! - a compiler killed while it holds the lock: the waiting process takes over and compiles;
//! - a compiler that finishes: the waiting process reads its entry and compiles nothing;
//! - a compiler that never finishes: the waiting process gives up at its deadline and compiles.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use ferrocomm::cuda::kernel_cache::{cached_or_compile, Event, Origin};

const FILE: &str = "unit-sm_90-nvrtc13.0.cubin";
/// Upper bound for a child's next line (a process start on two loaded cores takes far less).
const LINE_DEADLINE: Duration = Duration::from_secs(60);

/// The child: takes the entry through the cache. Role `hold`: its compile reports itself and
/// then waits for a line on stdin (never, if killed first); `quick`: compiles at once. The
/// wait for another holder is `FC_LOCK_WAIT_MS`.
fn child(role: &str, dir: &Path) {
    let wait = Duration::from_millis(std::env::var("FC_LOCK_WAIT_MS").unwrap().parse().unwrap());
    let mut out = std::io::stdout();
    let mut say = |e: Event<'_>| {
        let line = match e {
            Event::Compiling => "compiling".to_string(),
            Event::Waiting { .. } => "waiting".to_string(),
            Event::GaveUp { .. } => "gave up".to_string(),
        };
        // On a line of its own: the harness's "test NAME ... " precedes it without a newline.
        writeln!(out, "\nFCLOCK {line}").unwrap();
        out.flush().unwrap();
    };
    let (bytes, origin) =
        cached_or_compile::<std::io::Error>(dir, FILE, false, wait, &mut say, || {
            if role == "hold" {
                let mut line = String::new();
                std::io::stdin().read_line(&mut line)?;
            }
            Ok([b"\x7fELF".as_slice(), role.as_bytes()].concat())
        })
        .unwrap();
    let origin = if origin == Origin::Cached {
        "cached"
    } else {
        "compiled"
    };
    println!(
        "\nFCLOCK done {origin} {}",
        String::from_utf8_lossy(&bytes[4..])
    );
}

struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Proc {
    fn start(test: &str, role: &str, dir: &Path, wait_ms: u64) -> Proc {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--nocapture", "--test-threads", "1"])
            .env("FC_LOCK_ROLE", role)
            .env("FC_LOCK_DIR", dir)
            .env("FC_LOCK_WAIT_MS", wait_ms.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                // The harness's own lines are not the child's.
                if let Some(event) = l.strip_prefix("FCLOCK ") {
                    let _ = tx.send(event.to_string());
                }
            }
        });
        Proc {
            stdin: child.stdin.take(),
            child,
            lines,
        }
    }

    fn next(&self) -> String {
        self.lines
            .recv_timeout(LINE_DEADLINE)
            .expect("the child said nothing more")
    }

    fn finish(mut self) -> String {
        drop(self.stdin.take());
        let status = self.child.wait().unwrap();
        assert!(status.success(), "child exited with {status}");
        let mut rest = String::new();
        if let Some(mut o) = self.child.stdout.take() {
            let _ = o.read_to_string(&mut rest);
        }
        rest
    }
}

/// Runs the child role when this binary was started as one; true then.
fn as_child() -> bool {
    match std::env::var("FC_LOCK_ROLE") {
        Ok(role) => {
            child(&role, Path::new(&std::env::var("FC_LOCK_DIR").unwrap()));
            true
        }
        Err(_) => false,
    }
}

fn fresh_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("fc-lock-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn a_killed_compiler_does_not_block_the_next() {
    if as_child() {
        return;
    }
    let dir = fresh_dir("killed");
    let test = "a_killed_compiler_does_not_block_the_next";
    let mut a = Proc::start(test, "hold", &dir, 60_000);
    assert_eq!(a.next(), "compiling");
    let b = Proc::start(test, "quick", &dir, 60_000);
    assert_eq!(b.next(), "waiting");
    // Killed while holding the lock: the kernel drops its flock.
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    assert_eq!(b.next(), "compiling");
    assert_eq!(b.next(), "done compiled quick");
    b.finish();
    assert_eq!(std::fs::read(dir.join(FILE)).unwrap(), b"\x7fELFquick");
    // The winner removed its lock file; the killed one's partial work left nothing behind.
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left, vec![FILE.to_string()]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_waiting_process_reads_what_the_compiler_wrote() {
    if as_child() {
        return;
    }
    let dir = fresh_dir("finished");
    let test = "a_waiting_process_reads_what_the_compiler_wrote";
    let mut a = Proc::start(test, "hold", &dir, 60_000);
    assert_eq!(a.next(), "compiling");
    let b = Proc::start(test, "quick", &dir, 60_000);
    assert_eq!(b.next(), "waiting");
    // Let the holder finish its compile.
    writeln!(a.stdin.as_mut().unwrap()).unwrap();
    assert_eq!(a.next(), "done compiled hold");
    a.finish();
    assert_eq!(
        b.next(),
        "done cached hold",
        "the waiter compiled instead of reading"
    );
    b.finish();
    // A later process reads the entry without a lock or a compile.
    let c = Proc::start(test, "quick", &dir, 60_000);
    assert_eq!(c.next(), "done cached hold");
    c.finish();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_stuck_compiler_is_waited_for_until_the_deadline() {
    if as_child() {
        return;
    }
    let dir = fresh_dir("stuck");
    let test = "a_stuck_compiler_is_waited_for_until_the_deadline";
    let mut a = Proc::start(test, "hold", &dir, 60_000);
    assert_eq!(a.next(), "compiling");
    let t0 = std::time::Instant::now();
    let b = Proc::start(test, "quick", &dir, 300);
    assert_eq!(b.next(), "waiting");
    assert_eq!(b.next(), "gave up");
    assert!(t0.elapsed() >= Duration::from_millis(300));
    assert_eq!(b.next(), "compiling");
    assert_eq!(b.next(), "done compiled quick");
    b.finish();
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    assert_eq!(std::fs::read(dir.join(FILE)).unwrap(), b"\x7fELFquick");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn entries_of_another_user_or_writable_by_others_are_not_read() {
    if as_child() {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let dir = fresh_dir("trust");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(FILE);
    std::fs::write(&path, b"\x7fELFplanted").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let read = ferrocomm::cuda::kernel_cache::read_entry(&path, false);
    assert_eq!(read, None, "a world-writable entry was trusted");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(
        ferrocomm::cuda::kernel_cache::read_entry(&path, false).as_deref(),
        Some(b"\x7fELFplanted".as_slice())
    );
    // A symbolic link is not followed; a file that is no cubin is no entry.
    let link = dir.join("link.cubin");
    std::os::unix::fs::symlink(&path, &link).unwrap();
    assert_eq!(
        ferrocomm::cuda::kernel_cache::read_entry(&link, false),
        None
    );
    std::fs::write(dir.join("bad.cubin"), b"not an elf").unwrap();
    assert_eq!(
        ferrocomm::cuda::kernel_cache::read_entry(&dir.join("bad.cubin"), false),
        None
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
