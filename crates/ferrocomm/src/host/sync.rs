//! Waiting on peers: backoff, deadlines and dead-peer detection.

use std::time::{Duration, Instant};

/// How often a waiter checks whether the peer it waits for is still alive.
const LIVENESS_EVERY: Duration = Duration::from_millis(20);

/// Why a wait ended without its condition.
pub(crate) enum Stop {
    /// The deadline passed.
    Timeout,
    /// The peer's process is gone, or it gave up on the communicator.
    PeerFailed,
    /// This rank gave up on the communicator (`abort`, from another thread).
    Aborted,
    /// The peer refused the call (its arguments were wrong there).
    Refused,
}

/// Spins a little, then yields, then sleeps briefly: many ranks on few cores still progress
/// quickly (a spinning rank would otherwise hold the core its peer needs).
pub(crate) struct Backoff {
    iter: u32,
    deadline: Instant,
    next_check: Instant,
}

impl Backoff {
    pub fn new(timeout: Duration) -> Backoff {
        let now = Instant::now();
        Backoff {
            iter: 0,
            deadline: now + timeout,
            next_check: now + LIVENESS_EVERY,
        }
    }

    /// One pause between two looks at a flag. `alive` is asked now and then whether the peer
    /// still lives; `Err` ends the wait.
    pub fn pause(&mut self, alive: impl FnOnce() -> bool) -> Result<(), Stop> {
        self.iter = self.iter.saturating_add(1);
        if self.iter < 64 {
            std::hint::spin_loop();
            return Ok(());
        }
        if self.iter < 64 + 512 {
            std::thread::yield_now();
        } else {
            let extra = (self.iter - 576).min(9);
            std::thread::sleep(Duration::from_micros(10 << (extra / 3)));
        }
        let now = Instant::now();
        if now >= self.next_check {
            self.next_check = now + LIVENESS_EVERY;
            if !alive() {
                return Err(Stop::PeerFailed);
            }
        }
        if now >= self.deadline {
            return Err(Stop::Timeout);
        }
        Ok(())
    }
}
