//! Hooks on a Rust communicator (host backend, ranks as threads): the pre- and post-hooks see
//! every call in order with its arguments and one op id per call, until removed; an abort hook
//! runs once, at the first abort.

mod host_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferrocomm::hooks::{PostHookArgs, PreHookArgs};
use ferrocomm::{CallKind, CallOpts, Input, ReduceOp, View, ViewMut};
use host_support::*;

/// What a hook saw.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    /// Name, op id, the reduction, the root or peer, the element count of the output.
    Pre(&'static str, u64, Option<ReduceOp>, Option<usize>, usize),
    /// Name, op id, whether the call succeeded.
    Post(&'static str, u64, bool),
}

fn pre(a: &PreHookArgs<'_>) -> Seen {
    let (op, who, count) = match a.call {
        CallKind::AllReduce { op, output, .. } => (Some(*op), None, output.count()),
        CallKind::Broadcast { root, output, .. } => (None, Some(*root), output.count()),
        CallKind::Send { data, peer } => (None, Some(*peer), data.count()),
        CallKind::Recv { out, peer } => (None, Some(*peer), out.count()),
        _ => (None, None, 0),
    };
    Seen::Pre(a.name, a.op_id, op, who, count)
}

#[test]
fn hooks_see_every_call_in_order_with_its_arguments_until_removed() {
    let dir = std::env::temp_dir().join(format!("ferrocomm-hooks-{}", std::process::id()));
    let mut cfg = config(8192, Duration::from_secs(30));
    cfg.trace_dir = Some(dir.clone());
    let seen = run_ranks(2, &cfg, |comm| {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let hpre = comm.register_pre_hook(Arc::new(move |a: &PreHookArgs<'_>| {
            s.lock().unwrap().push(pre(a))
        }));
        let s = seen.clone();
        let hpost = comm.register_post_hook(Arc::new(move |a: &PostHookArgs<'_>| {
            s.lock()
                .unwrap()
                .push(Seen::Post(a.name, a.op_id, a.result.is_ok()))
        }));
        let aborts = Arc::new(Mutex::new(0));
        let a = aborts.clone();
        let habort = comm
            .register_abort_hook(Arc::new(move || *a.lock().unwrap() += 1))
            .unwrap();
        let removed = Arc::new(Mutex::new(0));
        let r = removed.clone();
        comm.register_abort_hook(Arc::new(move || *r.lock().unwrap() += 1))
            .unwrap()
            .remove();

        let o = CallOpts::default();
        let me = comm.rank();
        let x = vec![me as f32 + 1.0; 16];
        let mut y = vec![0.0f32; 16];
        comm.all_reduce(
            Input::Buf(View::host(&x)),
            ViewMut::host(&mut y),
            ReduceOp::Max,
            &o,
        )
        .unwrap();
        assert!(y.iter().all(|&v| v == 2.0), "{y:?}");
        let mut b = vec![me as f32; 8];
        comm.broadcast(Input::InPlace, ViewMut::host(&mut b), 1, &o)
            .unwrap();
        assert!(b.iter().all(|&v| v == 1.0), "{b:?}");
        if me == 0 {
            comm.send(View::host(&x[..4]), 1, &o).unwrap();
        } else {
            comm.recv(ViewMut::host(&mut y[..4]), 0, &o).unwrap();
        }
        comm.barrier(&o).unwrap();
        hpre.remove();
        hpost.remove();
        // Removed: this call is seen by nobody.
        comm.barrier(&o).unwrap();
        comm.abort();
        comm.abort();
        assert!(comm.barrier(&o).is_err(), "a call after abort()");
        habort.remove();
        let got = seen.lock().unwrap().clone();
        let (aborts, removed) = (*aborts.lock().unwrap(), *removed.lock().unwrap());
        (got, aborts, removed)
    });
    for (rank, (got, aborts, removed)) in seen.iter().enumerate() {
        assert_eq!(*aborts, 1, "rank {rank}: the abort hook runs once");
        assert_eq!(*removed, 0, "rank {rank}: a removed abort hook never runs");
        let ids: Vec<u64> = got
            .iter()
            .filter_map(|s| match s {
                Seen::Pre(_, id, ..) => Some(*id),
                _ => None,
            })
            .collect();
        assert_eq!(ids.len(), 4, "rank {rank}: {got:?}");
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "rank {rank}: {ids:?}");
        let p2p = if rank == 0 {
            Seen::Pre("send", ids[2], None, Some(1), 4)
        } else {
            Seen::Pre("recv", ids[2], None, Some(0), 4)
        };
        let p2p_name = if rank == 0 { "send" } else { "recv" };
        let want = vec![
            Seen::Pre("all_reduce", ids[0], Some(ReduceOp::Max), None, 16),
            Seen::Post("all_reduce", ids[0], true),
            Seen::Pre("broadcast", ids[1], None, Some(1), 8),
            Seen::Post("broadcast", ids[1], true),
            p2p,
            Seen::Post(p2p_name, ids[2], true),
            Seen::Pre("barrier", ids[3], None, None, 0),
            Seen::Post("barrier", ids[3], true),
        ];
        assert_eq!(*got, want, "rank {rank}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
