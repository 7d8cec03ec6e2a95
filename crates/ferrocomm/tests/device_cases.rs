//! The device cases (`tests/cases`, the bodies the GPU check programs run on CUDA) on the host
//! backend: ranks as threads, buffers in host memory, 2, 3 and 4 ranks, at the sizes the
//! bodies choose for the host. A failure names the body, the rank and the cases.

mod cases;
mod host_support;

use std::sync::Arc;
use std::time::Duration;

use cases::{Body, Buf, Ctx};
use ferrocomm::bootstrap::{MemStore, Store};
use ferrocomm::Device;
use host_support::{communicator, config, unique_name};

/// Cases run so far on this rank.
fn cases(c: &Ctx) -> usize {
    c.tally.values().map(|t| t.cases).sum()
}

/// Runs `bodies` on `n` ranks of the host backend; panics with every rank's failures.
fn run(n: usize, bodies: &[(&str, Body)]) {
    Buf::guard_self_check(Device::Host).expect("the guard band read-back");
    // Small slots: the sizes below span many chunks and every staged path.
    let cfg = config(64 << 10, Duration::from_secs(60));
    let store: Arc<dyn Store> = MemStore::new();
    let prefix = unique_name("cases");
    let failures: Vec<Vec<String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (store, prefix, cfg) = (store.clone(), &prefix, &cfg);
                s.spawn(move || {
                    let comm = communicator(store.clone(), prefix, r, n, cfg);
                    let (p, st) = (prefix.clone(), store.clone());
                    let new_comm: cases::NewComm = Box::new(move |name, cfg| {
                        Ok(communicator(st.clone(), &format!("{p}-{name}"), r, n, &cfg))
                    });
                    let mut c = Ctx::new(comm, cfg.clone(), true, new_comm);
                    let mut out = Vec::new();
                    for (name, body) in bodies {
                        let before = c.failures.len();
                        let cases_before = cases(&c);
                        if let Err(e) = body(&mut c) {
                            out.push(format!("{name}: {e}"));
                            break;
                        }
                        assert!(cases(&c) > cases_before, "{name}: no case ran");
                        out.extend(c.failures[before..].iter().map(|f| format!("{name}: {f}")));
                    }
                    if c.failed() && out.is_empty() {
                        out.push("a tally shows failures".into());
                    }
                    out
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    });
    let bad: Vec<String> = failures
        .iter()
        .enumerate()
        .flat_map(|(r, f)| f.iter().take(10).map(move |x| format!("rank {r}: {x}")))
        .collect();
    assert!(bad.is_empty(), "{n} ranks:\n{}", bad.join("\n"));
}

/// One test per table of bodies and world size.
macro_rules! host_tests {
    ($($name:ident: $bodies:expr, $n:expr;)*) => {
        $(
            #[test]
            fn $name() {
                run($n, &$bodies);
            }
        )*
    };
}

host_tests! {
    collectives_at_2_ranks: cases::coll::BODIES, 2;
    collectives_at_3_ranks: cases::coll::BODIES, 3;
    collectives_at_4_ranks: cases::coll::BODIES, 4;
    all_reduce_at_2_ranks: cases::all_reduce::BODIES, 2;
    all_reduce_at_3_ranks: cases::all_reduce::BODIES, 3;
    all_reduce_at_4_ranks: cases::all_reduce::BODIES, 4;
    low_precision_at_2_ranks: cases::lowp::BODIES, 2;
    // All but the all-to-all-v, whose count matrices are for two ranks.
    low_precision_at_3_ranks: cases::lowp::BODIES[..3], 3;
    fused_norm_at_1_rank: cases::norm::BODIES, 1;
    every_collective_at_1_rank: cases::one_rank::BODIES, 1;
    fused_norm_at_2_ranks: cases::norm::BODIES, 2;
    fused_norm_at_3_ranks: cases::norm::BODIES, 3;
    disagreeing_calls_at_2_ranks: cases::disagreeing::BODIES, 2;
    disagreeing_calls_at_3_ranks: cases::disagreeing::BODIES, 3;
    disagreeing_calls_at_4_ranks: cases::disagreeing::BODIES, 4;
}
