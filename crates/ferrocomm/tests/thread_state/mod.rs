//! Whether another thread of this process is asleep in the kernel: how a test knows that a
//! thread has reached the blocking wait it means to answer or interrupt (a call waiting for a
//! peer, a client waiting for its server), instead of sleeping for a while and hoping it has.
//!
//! A thread is asleep when its state in `/proc/self/task/TID/stat` is `S`. The threads watched
//! this way do nothing between telling the test their id and the wait under test that could put
//! them to sleep (no lock that another thread holds, no I/O), so once asleep they are in it.
#![allow(dead_code)]

use std::time::{Duration, Instant};

/// How long a test waits for a thread to fall asleep: only a thread that never reaches its
/// wait takes that long.
const PATIENCE: Duration = Duration::from_secs(60);

/// The calling thread's id as the kernel (and `/proc`) names it.
pub fn id() -> i32 {
    rustix::thread::gettid().as_raw_nonzero().get()
}

/// The state letter of thread `tid` of this process (`R` running, `S` asleep, ...), `None`
/// once it has ended.
pub fn state(tid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    // The state follows the parenthesised name, which may itself hold parentheses.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Waits until thread `tid` is asleep; `what` says what it should be waiting for, in the
/// failure message.
pub fn wait_until_asleep(tid: i32, what: &str) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match state(tid) {
            Some('S') => return,
            None => panic!("thread {tid} ended before {what}"),
            Some(_) => {}
        }
        assert!(
            Instant::now() < deadline,
            "thread {tid} not asleep after {PATIENCE:?}: never reached {what}"
        );
        // The pause between two looks at /proc (a thread asleep in a backoff wakes often, so
        // the looks come often too).
        std::thread::sleep(Duration::from_micros(200));
    }
}
