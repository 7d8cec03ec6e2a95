//! The three timing modes and how samples become one figure.
//!
//! - eager: `iters` back-to-back operations timed together, divided by `iters` (nccl-tests);
//! - graph: `ops` operations captured in one CUDA graph, the graph replayed `iters` times,
//!   divided by `iters * ops`;
//! - isolated: a barrier, then one operation timed alone; the slowest rank's time counts.
//!
//! Eager and graph repeat the measurement `reps` times; isolated takes `iters` measurements.
//! The figure reported is the median.

use super::args::Mode;
use super::engine::{Engine, Work};

/// Median of the samples (the mean of the middle two for an even count).
pub fn median(samples: &[f64]) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut v = samples.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// One figure from every rank's samples (seconds per operation).
///
/// Isolated measurements are taken at the same moment on every rank (after a barrier): the
/// operation takes as long as its slowest rank, so take the max per measurement, then the
/// median. Eager and graph measurements are medians per rank, and the slowest rank counts.
pub fn combine(mode: Mode, per_rank: &[Vec<f64>]) -> f64 {
    match mode {
        Mode::Isolated => {
            let n = per_rank.iter().map(Vec::len).min().unwrap_or(0);
            let worst: Vec<f64> = (0..n)
                .map(|i| per_rank.iter().map(|s| s[i]).fold(f64::MIN, f64::max))
                .collect();
            median(&worst)
        }
        Mode::Eager | Mode::Graph { .. } => {
            per_rank.iter().map(|s| median(s)).fold(f64::MIN, f64::max)
        }
    }
}

/// What a measurement needs besides the engine.
pub struct Timing {
    pub mode: Mode,
    pub iters: usize,
    pub warmup: usize,
    pub reps: usize,
    pub blocking: bool,
}

/// Runs warm-up and the measurements of one row; returns this rank's samples (seconds per
/// operation). `barrier` lines the ranks up before every measurement and leaves the device
/// idle; `align` is issued right after it and not waited for, so that the measurement starts
/// where the ranks leave it on their devices (a small collective on the stream; a no-op on the
/// host, whose collectives return when done, and with `--host-start`).
///
/// Without `align` each rank's start event is recorded when its host gets back from the
/// barrier, and the ranks' hosts do not get back together: the first rank's first operation
/// waits for the last rank, and that wait counts in every sample of the slowest rank's time.
pub fn measure(
    engine: &dyn Engine,
    t: &Timing,
    barrier: &mut dyn FnMut() -> anyhow::Result<()>,
    align: &mut dyn FnMut() -> anyhow::Result<()>,
    op: &mut dyn FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<Vec<f64>> {
    for _ in 0..t.warmup {
        op()?;
    }
    engine.sync()?;
    // Every measurement starts with the ranks lined up and the device idle.
    let mut timed = |work: &mut Work<'_>| -> anyhow::Result<f64> {
        barrier()?;
        engine.sync()?;
        align()?;
        engine.time(work)
    };
    let mut samples = Vec::new();
    match t.mode {
        Mode::Eager => {
            for _ in 0..t.reps {
                let s = timed(&mut || {
                    for _ in 0..t.iters {
                        op()?;
                        if t.blocking {
                            engine.sync()?;
                        }
                    }
                    Ok(())
                })?;
                samples.push(s / t.iters as f64);
            }
        }
        Mode::Graph { ops } => {
            let graph = engine.capture(&mut || {
                for _ in 0..ops {
                    op()?;
                }
                Ok(())
            })?;
            // One replay to warm the graph itself up.
            graph.launch()?;
            engine.sync()?;
            for _ in 0..t.reps {
                let s = timed(&mut || {
                    for _ in 0..t.iters {
                        graph.launch()?;
                    }
                    Ok(())
                })?;
                samples.push(s / (t.iters * ops) as f64);
            }
        }
        Mode::Isolated => {
            for _ in 0..t.iters {
                samples.push(timed(&mut *op)?);
            }
        }
    }
    Ok(samples)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::engine::HostEngine;

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn combining_ranks() {
        let r = vec![vec![1.0, 5.0, 1.0], vec![2.0, 1.0, 2.0]];
        // Isolated: per-measurement max = [2, 5, 2] -> 2.
        assert_eq!(combine(Mode::Isolated, &r), 2.0);
        // Eager: medians 1 and 2 -> slowest 2.
        assert_eq!(combine(Mode::Eager, &[vec![1.0, 1.0, 9.0], vec![3.0]]), 3.0);
    }

    #[test]
    fn measurement_counts_follow_the_mode() {
        let e = HostEngine::new(8, 8).unwrap();
        let (mut ops, mut barriers, mut aligns) = (0, 0, 0);
        let t = Timing {
            mode: Mode::Eager,
            iters: 4,
            warmup: 2,
            reps: 3,
            blocking: false,
        };
        let s = measure(
            &e,
            &t,
            &mut || {
                barriers += 1;
                Ok(())
            },
            &mut || {
                aligns += 1;
                Ok(())
            },
            &mut || {
                ops += 1;
                Ok(())
            },
        )
        .unwrap();
        assert_eq!((s.len(), ops, barriers, aligns), (3, 2 + 12, 3, 3));
        let t = Timing {
            mode: Mode::Isolated,
            ..t
        };
        let (mut ops, mut barriers) = (0, 0);
        // Every measurement: barrier, then the line-up, then the timed work.
        let order = std::cell::RefCell::new(String::new());
        let s = measure(
            &e,
            &t,
            &mut || {
                barriers += 1;
                order.borrow_mut().push('b');
                Ok(())
            },
            &mut || {
                order.borrow_mut().push('a');
                Ok(())
            },
            &mut || {
                ops += 1;
                order.borrow_mut().push('o');
                Ok(())
            },
        )
        .unwrap();
        assert_eq!((s.len(), ops, barriers), (4, 2 + 4, 4));
        assert_eq!(order.into_inner(), "oo".to_string() + &"bao".repeat(4));
        let t = Timing {
            mode: Mode::Graph { ops: 2 },
            ..t
        };
        assert!(measure(&e, &t, &mut || Ok(()), &mut || Ok(()), &mut || Ok(())).is_err());
    }
}
