//! `ferrocomm launch` leaves nothing behind when it is killed outright, whatever command its
//! ranks run, and refuses hostile options. Real processes; every wait has a deadline and waits
//! on a file or a process, never on time alone.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod cli_support;
use cli_support::{assert_gone_within, ferrocomm, gone, pids_when, scratch, start_job};

fn kill_and_reap(mut c: Child) {
    let _ = c.kill();
    let _ = c.wait();
}

#[test]
fn ranks_behind_a_wrapper_die_with_a_sigkilled_launcher() {
    let dir = scratch("hygiene", "wrapper");
    // The rank is a wrapper script that starts the real rank (here a sleep standing for
    // `python train.py`) as its child, without exec: SIGKILL to the launcher kills the wrapper
    // through PR_SET_PDEATHSIG, and the real rank must go too.
    let wrapper = dir.join("wrapper.sh");
    std::fs::write(
        &wrapper,
        "echo $$ > \"$DIR/wrapper.$RANK\"\n\
         sh -c 'echo $$ > \"$DIR/rank.$RANK\"; exec sleep 60'\n\
         echo the rank ended\n",
    )
    .unwrap();
    // A process of the same user started by hand, as a rank of another job would be: the
    // launcher's end must not touch it.
    let by_hand = Command::new("sleep").arg("60").spawn().unwrap();
    let wrapper = wrapper.to_str().unwrap();
    let launcher = start_job(2, &["bash", wrapper], &dir, Stdio::null());
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut pids = pids_when(&dir, "rank.", 2, deadline);
    pids.extend(pids_when(&dir, "wrapper.", 2, deadline));
    kill_and_reap(launcher);
    // No rank survives 2 s.
    assert_gone_within(&pids, Duration::from_secs(2), "the launcher was killed");
    assert!(!gone(by_hand.id()), "a process started by hand was killed");
    kill_and_reap(by_hand);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The pids of the children of `parent` (from /proc).
fn children_of(parent: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_string_lossy().parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // Fields after the parenthesised name: state, then the parent's pid.
            let ppid: u32 = stat
                .rsplit(')')
                .next()?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            (ppid == parent).then_some(pid)
        })
        .collect()
}

#[test]
fn a_job_that_ends_normally_leaves_no_watcher_behind() {
    let dir = scratch("hygiene", "normal");
    let go = dir.join("go");
    let st = Command::new("mkfifo").arg(&go).status().unwrap();
    assert!(st.success());
    // Each rank notes its launcher, then waits until the test opens and closes the FIFO.
    let script = "echo $PPID > \"$DIR/launcher.$RANK\"; read _ < \"$DIR/go\"; true";
    let mut launcher = start_job(2, &["sh", "-c", script], &dir, Stdio::null());
    let deadline = Instant::now() + Duration::from_secs(20);
    let lpid = pids_when(&dir, "launcher.", 2, deadline)[0];
    assert_eq!(lpid, launcher.id());
    // The two ranks and the watcher.
    let children = children_of(lpid);
    assert_eq!(children.len(), 3, "children of the launcher: {children:?}");
    // Let the ranks end: the job completes.
    drop(std::fs::OpenOptions::new().write(true).open(&go).unwrap());
    assert_eq!(launcher.wait().unwrap().code(), Some(0));
    assert_gone_within(&children, Duration::from_secs(2), "the job ended");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn hostile_counts_and_timeouts_are_refused() {
    for (args, says) in [
        (&["--timeout", "1e-320"][..], "nanosecond"),
        (&["--timeout", "5e-324"][..], "nanosecond"),
    ] {
        let o = ferrocomm()
            .args(["launch", "-n", "1"])
            .args(args)
            .args(["--", "true"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !matches!(o.status.code(), Some(0) | Some(101) | None),
            "{args:?}: {err}"
        );
        assert!(
            err.contains("timeout") && err.contains(says),
            "{args:?}: {err}"
        );
    }
    let o = ferrocomm()
        .args(["launch", "-n", "70000", "--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !matches!(o.status.code(), Some(0) | Some(101) | None),
        "{err}"
    );
    assert!(err.contains("65536") && err.contains("70000"), "{err}");
}
