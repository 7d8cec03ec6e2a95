//! Host backend collectives, ranks as threads: every collective, dtype and op, in place and out
//! of place, world sizes 1, 2, 3, 4 and 8, checked element by element against a plain reference.

mod host_support;

use std::time::Duration;

use ferrocomm::{
    Algo, CallOpts, Collective, Communicator, DataType, Error, Input, P2pOp, ReduceOp, Splits,
};
use host_support::*;

const WORLDS: [usize; 5] = [1, 2, 3, 4, 8];
/// Small slots so that the counts below span several chunks.
const SLOT: usize = 4096;

fn cfg() -> ferrocomm::Config {
    config(SLOT, Duration::from_secs(30))
}

/// Counts: empty, one, a prime, not a multiple of any block, and several slots long.
fn counts(d: DataType) -> [usize; 5] {
    [0, 1, 7, 1029, 3 * SLOT / d.size() + 5]
}

fn all_inputs(d: DataType, count: usize, seed: u64, n: usize, small: bool) -> Vec<Vec<u8>> {
    (0..n).map(|r| input(d, count, seed, r, small)).collect()
}

/// Runs one collective out of place and in place and checks both against `want`.
/// `call(comm, input, output)`; in place the buffer starts as `inplace_start`.
#[allow(clippy::too_many_arguments)]
fn check_both(
    comm: &Communicator,
    what: &str,
    d: DataType,
    inp: &[u8],
    out_len: usize,
    inplace_start: Option<Vec<u8>>,
    want: Option<&[u8]>,
    call: &dyn Fn(&Communicator, Input<'_>, ferrocomm::ViewMut<'_>) -> ferrocomm::Result<()>,
) {
    let inbuf = Aligned::new(inp);
    let mut out = Aligned::poisoned(out_len);
    call(
        comm,
        Input::Buf(view(d, inbuf.bytes())),
        view_mut(d, out.bytes_mut()),
    )
    .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(
        inbuf.bytes(),
        inp,
        "{what}: input modified (rank {})",
        comm.rank()
    );
    match want {
        Some(w) => assert_eq!(out.bytes(), w, "{what} out of place, rank {}", comm.rank()),
        None => assert!(
            out.bytes().iter().all(|&b| b == POISON),
            "{what}: output written"
        ),
    }
    if let Some(start) = inplace_start {
        let mut buf = Aligned::new(&start);
        call(comm, Input::InPlace, view_mut(d, buf.bytes_mut()))
            .unwrap_or_else(|e| panic!("{what} in place: {e}"));
        if let Some(w) = want {
            let got = &buf.bytes()[..w.len().min(buf.bytes().len())];
            assert_eq!(got, w, "{what} in place, rank {}", comm.rank());
        }
    }
}

#[test]
fn all_reduce_every_dtype_op_and_algorithm() {
    for n in WORLDS {
        // Inputs and references are computed once and shared by the rank threads.
        let mut cases = Vec::new();
        let mut seed = 0;
        for d in DataType::ALL {
            for op in OPS {
                if op.check(d, "t").is_err() {
                    continue;
                }
                for algo in [Algo::Flat, Algo::Tree] {
                    for (i, &count) in counts(d).iter().enumerate() {
                        // Larger worlds: fewer cases, to keep the suite fast on two cores.
                        let multi_chunk = i == 4;
                        let few_dtypes = [
                            DataType::F32,
                            DataType::BF16,
                            DataType::F8E5M2,
                            DataType::I32,
                            DataType::U8,
                        ];
                        if n >= 4
                            && (i < 2
                                || (multi_chunk && op != ReduceOp::Sum)
                                || !few_dtypes.contains(&d))
                        {
                            continue;
                        }
                        seed += 1;
                        let ins = all_inputs(d, count, seed, n, op == ReduceOp::Prod);
                        let want = reference(d, op, &ins);
                        cases.push((d, op, algo, count, ins, want));
                    }
                }
            }
        }
        run_ranks(n, &cfg(), |comm| {
            for (d, op, algo, count, ins, want) in &cases {
                let (d, op) = (*d, *op);
                let opts = CallOpts::default().with_algo(*algo);
                let mine = &ins[comm.rank()];
                check_both(
                    &comm,
                    &format!("all_reduce {d} {op} {algo} n={n} count={count}"),
                    d,
                    mine,
                    mine.len(),
                    Some(mine.clone()),
                    Some(want),
                    &|c, i, o| c.all_reduce(i, o, op, &opts),
                );
            }
        });
    }
}

#[test]
fn all_reduce_algorithm_follows_selection() {
    let mut c = cfg();
    c.thresholds.flat_max = Some(1000);
    let algos = run_ranks(2, &c, |comm| {
        let o = CallOpts::default();
        (
            comm.algo_for(Collective::AllReduce, 1000, DataType::F32, &o)
                .unwrap()
                .algo,
            comm.algo_for(Collective::AllReduce, 1001, DataType::F32, &o)
                .unwrap()
                .algo,
            comm.algo_for(Collective::AllGather, 1 << 30, DataType::F32, &o)
                .unwrap()
                .algo,
            comm.algo_for(
                Collective::AllGather,
                8,
                DataType::F32,
                &o.clone().with_algo(Algo::Tree),
            )
            .is_err(),
        )
    });
    assert_eq!(algos[0], (Algo::Flat, Algo::Tree, Algo::Direct, true));
}

#[test]
fn algo_for_is_the_plan_info_prints() {
    // `ferrocomm info` prints plan::host_plan on a machine without a GPU; a communicator's
    // algo_for must give the same plan, printed the same, for every shape.
    let mut c = cfg();
    c.thresholds.flat_max = Some(1000);
    c.low_precision.enabled = true;
    let world = 2;
    let colls = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllToAll,
        Collective::Broadcast,
        Collective::Send,
    ];
    let shapes: Vec<(Collective, usize, DataType)> = colls
        .iter()
        .flat_map(|&coll| {
            [
                (8, DataType::F32),
                (4096, DataType::BF16),
                (4096, DataType::I32),
            ]
            .map(|(bytes, d)| (coll, bytes, d))
        })
        .collect();
    let got = run_ranks(world, &c, |comm| {
        shapes
            .iter()
            .map(|&(coll, bytes, d)| {
                comm.algo_for(coll, bytes, d, &CallOpts::default())
                    .unwrap()
                    .to_string()
            })
            .collect::<Vec<_>>()
    });
    let want: Vec<String> = shapes
        .iter()
        .map(|&(coll, bytes, d)| {
            ferrocomm::plan::host_plan(
                coll,
                bytes,
                world,
                d,
                Algo::Auto,
                ferrocomm::LowPrecisionChoice::Default,
                &c,
            )
            .unwrap()
            .to_string()
        })
        .collect();
    assert_eq!(got[0], want);
    assert_eq!(got[1], want);
    // The plans differ where they should: low precision for floats, tree above flat_max.
    assert_eq!(&want[..3], ["lp-flat", "lp-tree", "tree"]);
}

#[test]
fn reduce_and_broadcast_from_every_root() {
    for n in WORLDS {
        run_ranks(n, &cfg(), |comm| {
            let mut seed = 1000;
            for d in [DataType::F32, DataType::BF16, DataType::I64, DataType::U8] {
                let mut roots = vec![0, n / 2, n - 1];
                roots.dedup();
                for root in roots {
                    let is_root = comm.rank() == root;
                    let big = if d.size() == 4 {
                        3 * SLOT / 4 + 5
                    } else {
                        SLOT / d.size() + 1
                    };
                    for count in [0, 7, big] {
                        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg] {
                            seed += 1;
                            let ins = all_inputs(d, count, seed, n, false);
                            let want = reference(d, op, &ins);
                            let mine = &ins[comm.rank()];
                            check_both(
                                &comm,
                                &format!("reduce {d} {op} root={root} n={n} count={count}"),
                                d,
                                mine,
                                mine.len(),
                                Some(mine.clone()),
                                // Only the root's output is written.
                                if is_root { Some(&want) } else { None },
                                &|c, i, o| c.reduce(i, o, op, root, &CallOpts::default()),
                            );
                        }
                        seed += 1;
                        let data = input(d, count, seed, root, false);
                        let mine = input(d, count, seed, comm.rank(), false);
                        check_both(
                            &comm,
                            &format!("broadcast {d} root={root} n={n} count={count}"),
                            d,
                            if is_root { &data } else { &mine },
                            data.len(),
                            Some(if is_root { data.clone() } else { mine.clone() }),
                            Some(&data),
                            &|c, i, o| c.broadcast(i, o, root, &CallOpts::default()),
                        );
                    }
                }
            }
        });
    }
}

#[test]
fn all_gather_and_all_to_all() {
    for n in WORLDS {
        run_ranks(n, &cfg(), |comm| {
            let me = comm.rank();
            let mut seed = 2000;
            for d in [DataType::F32, DataType::F16, DataType::F64, DataType::I8] {
                for part in [0, 1, 7, 1029, SLOT / d.size() + 3] {
                    seed += 1;
                    let ins = all_inputs(d, part, seed, n, false);
                    let want: Vec<u8> = ins.concat();
                    let mut start = vec![POISON; want.len()];
                    let pb = part * d.size();
                    start[me * pb..(me + 1) * pb].copy_from_slice(&ins[me]);
                    check_both(
                        &comm,
                        &format!("all_gather {d} n={n} part={part}"),
                        d,
                        &ins[me],
                        want.len(),
                        Some(start),
                        Some(&want),
                        &|c, i, o| c.all_gather(i, o, &CallOpts::default()),
                    );

                    seed += 1;
                    // Rank r's input holds n parts; part p goes to rank p.
                    let ins = all_inputs(d, n * part, seed, n, false);
                    let want: Vec<u8> = (0..n)
                        .flat_map(|r| ins[r][me * pb..(me + 1) * pb].to_vec())
                        .collect();
                    check_both(
                        &comm,
                        &format!("all_to_all {d} n={n} part={part}"),
                        d,
                        &ins[me],
                        want.len(),
                        Some(ins[me].clone()),
                        Some(&want),
                        &|c, i, o| c.all_to_all(i, o, &CallOpts::default()),
                    );
                }
            }
        });
    }
}

#[test]
fn reduce_scatter_every_op() {
    for n in WORLDS {
        run_ranks(n, &cfg(), |comm| {
            let me = comm.rank();
            let mut seed = 3000;
            for d in [
                DataType::F32,
                DataType::BF16,
                DataType::F8E4M3,
                DataType::I32,
                DataType::U64,
            ] {
                for op in OPS {
                    if op.check(d, "t").is_err() {
                        continue;
                    }
                    for part in [0, 7, SLOT / d.size() + 3] {
                        if n >= 4 && part > 7 && op != ReduceOp::Sum {
                            continue;
                        }
                        seed += 1;
                        let ins = all_inputs(d, n * part, seed, n, op == ReduceOp::Prod);
                        let pb = part * d.size();
                        let mine: Vec<Vec<u8>> = ins
                            .iter()
                            .map(|v| v[me * pb..(me + 1) * pb].to_vec())
                            .collect();
                        let want = reference(d, op, &mine);
                        let what = format!("reduce_scatter {d} {op} n={n} part={part}");
                        check_both(
                            &comm,
                            &what,
                            d,
                            &ins[me],
                            pb,
                            None,
                            Some(&want),
                            &|c, i, o| c.reduce_scatter(i, o, op, &CallOpts::default()),
                        );
                        // In place: the whole buffer is the input; the result lands in part `me`.
                        let mut buf = Aligned::new(&ins[me]);
                        comm.reduce_scatter(
                            Input::InPlace,
                            view_mut(d, buf.bytes_mut()),
                            op,
                            &CallOpts::default(),
                        )
                        .unwrap();
                        assert_eq!(
                            &buf.bytes()[me * pb..(me + 1) * pb],
                            &want[..],
                            "{what} in place"
                        );
                    }
                }
            }
        });
    }
}

#[test]
fn all_to_all_v_uneven_parts() {
    for n in WORLDS {
        run_ranks(n, &cfg(), |comm| {
            let me = comm.rank();
            let d = DataType::F32;
            for round in 0..3u64 {
                // Elements rank i sends to rank j: varied, some zero, some longer than a region.
                let c = |i: usize, j: usize| {
                    ((i * 7 + j * 13 + round as usize * 5) % 11) * (1 + (i + j) % 3 * 150)
                };
                let seed = 4000 + round;
                let send_counts: Vec<usize> = (0..n).map(|j| c(me, j)).collect();
                let recv_counts: Vec<usize> = (0..n).map(|i| c(i, me)).collect();
                let splits = Splits::packed(send_counts.clone(), recv_counts.clone());
                let totals: Vec<usize> = (0..n).map(|i| (0..n).map(|j| c(i, j)).sum()).collect();
                let ins: Vec<Vec<u8>> = (0..n)
                    .map(|r| input(d, totals[r], seed, r, false))
                    .collect();
                let es = d.size();
                let mut want = Vec::new();
                for i in 0..n {
                    let off: usize = (0..me).map(|j| c(i, j)).sum();
                    want.extend_from_slice(&ins[i][off * es..(off + c(i, me)) * es]);
                }
                let out_len = recv_counts.iter().sum::<usize>() * es;
                check_both(
                    &comm,
                    &format!("all_to_all_v n={n} round={round}"),
                    d,
                    &ins[me],
                    out_len,
                    None,
                    Some(&want),
                    &|cm, i, o| cm.all_to_all_v(i, o, &splits, &CallOpts::default()),
                );
                // In place needs equal offsets: send and receive equal, padded parts.
                let pad = (0..n)
                    .flat_map(|i| (0..n).map(move |j| (i, j)))
                    .map(|(i, j)| c(i, j))
                    .max()
                    .unwrap();
                let sp = Splits {
                    send_displs: (0..n).map(|j| j * pad).collect(),
                    recv_displs: (0..n).map(|j| j * pad).collect(),
                    send_counts: send_counts.clone(),
                    recv_counts: recv_counts.clone(),
                };
                let mut buf = Aligned::poisoned(n * pad * es);
                let mut off = 0;
                for j in 0..n {
                    let b = &ins[me][off * es..(off + c(me, j)) * es];
                    buf.bytes_mut()[j * pad * es..j * pad * es + b.len()].copy_from_slice(b);
                    off += c(me, j);
                }
                comm.all_to_all_v(
                    Input::InPlace,
                    view_mut(d, buf.bytes_mut()),
                    &sp,
                    &CallOpts::default(),
                )
                .unwrap();
                let mut woff = 0;
                for i in 0..n {
                    let len = c(i, me) * es;
                    assert_eq!(
                        &buf.bytes()[i * pad * es..i * pad * es + len],
                        &want[woff..woff + len],
                        "in place from {i}"
                    );
                    woff += len;
                }
            }
        });
    }
}

#[test]
fn barrier_and_point_to_point() {
    for n in [2, 3, 4, 8] {
        run_ranks(n, &cfg(), |comm| {
            let me = comm.rank();
            let d = DataType::I32;
            comm.barrier(&CallOpts::default()).unwrap();
            // A ring where everyone sends first: one-chunk messages do not block the sender.
            for count in [0usize, 5, 100] {
                let msg = input(d, count, 77 + count as u64, me, false);
                comm.send(view(d, &msg), (me + 1) % n, &CallOpts::default())
                    .unwrap();
                let from = (me + n - 1) % n;
                let mut got = Aligned::poisoned(count * 4);
                comm.recv(view_mut(d, got.bytes_mut()), from, &CallOpts::default())
                    .unwrap();
                assert_eq!(
                    got.bytes(),
                    &input(d, count, 77 + count as u64, from, false)[..]
                );
            }
            // Several mailbox-sized chunks between pairs (0,1), (2,3)... at the same time.
            let big = 20_000;
            let peer = me ^ 1;
            if peer < n {
                let msg = input(d, big, 99, me, false);
                let mut got = Aligned::poisoned(big * 4);
                if me % 2 == 0 {
                    comm.send(view(d, &msg), peer, &CallOpts::default())
                        .unwrap();
                    comm.recv(view_mut(d, got.bytes_mut()), peer, &CallOpts::default())
                        .unwrap();
                } else {
                    comm.recv(view_mut(d, got.bytes_mut()), peer, &CallOpts::default())
                        .unwrap();
                    comm.send(view(d, &msg), peer, &CallOpts::default())
                        .unwrap();
                }
                assert_eq!(got.bytes(), &input(d, big, 99, peer, false)[..]);
            }
            comm.barrier(&CallOpts::default()).unwrap();
        });
    }
}

/// One batch: `data` to rank `next`, and from rank `prev` into `out`.
fn ring<'a>(
    d: DataType,
    data: &'a [u8],
    out: &'a mut [u8],
    next: usize,
    prev: usize,
) -> Vec<P2pOp<'a>> {
    vec![
        P2pOp::Send {
            data: view(d, data),
            peer: next,
        },
        P2pOp::Recv {
            out: view_mut(d, out),
            peer: prev,
        },
    ]
}

#[test]
fn batched_sends_and_receives() {
    for n in [2, 3, 4] {
        run_ranks(n, &cfg(), |comm| {
            let me = comm.rank();
            let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
            let o = CallOpts::default();
            // A ring of messages many mailboxes long, every rank sending before it receives:
            // one batch moves both, where a send then a receive would wait forever.
            let big = 50_000;
            let d = DataType::F32;
            let msg = input(d, big, 5, me, false);
            let mut got = Aligned::poisoned(big * 4);
            comm.batch_send_recv(ring(d, &msg, got.bytes_mut(), next, prev), &o)
                .unwrap();
            assert_eq!(got.bytes(), &input(d, big, 5, prev, false)[..]);
            // Two messages each way between every pair, of two dtypes, in order, the receives
            // listed first: messages of a pair and direction match in order.
            let mut sends = Vec::new();
            let mut want = Vec::new();
            for p in (0..n).filter(|&p| p != me) {
                for (k, dt) in [DataType::I64, DataType::BF16].into_iter().enumerate() {
                    // Elements from rank s to rank r: several mailboxes, no two alike.
                    let len = |s: usize, r: usize| 3000 * (k + 1) + 7 * s + r;
                    let seed = 60 + k as u64;
                    sends.push((dt, input(dt, len(me, p), seed, me, false), p));
                    want.push((dt, input(dt, len(p, me), seed, p, false), p));
                }
            }
            let mut outs: Vec<Aligned> =
                want.iter().map(|w| Aligned::poisoned(w.1.len())).collect();
            let mut ops: Vec<P2pOp<'_>> = Vec::new();
            for ((dt, _, p), out) in want.iter().zip(outs.iter_mut()) {
                ops.push(P2pOp::Recv {
                    out: view_mut(*dt, out.bytes_mut()),
                    peer: *p,
                });
            }
            for (dt, data, p) in &sends {
                ops.push(P2pOp::Send {
                    data: view(*dt, data),
                    peer: *p,
                });
            }
            comm.batch_send_recv(ops, &o).unwrap();
            for (w, out) in want.iter().zip(&outs) {
                assert_eq!(out.bytes(), &w.1[..], "from rank {}", w.2);
            }
            // A receive of another size than its send: this batch fails on the receiver, the
            // message is drained; the sender fails in this batch (the receive was there first)
            // or reports it at its next send or receive with that peer, whose messages move.
            let short = input(d, 10, 8, me, false);
            let mut got = Aligned::poisoned(if me == 0 { 44 } else { 40 });
            let r = comm.batch_send_recv(ring(d, &short, got.bytes_mut(), next, prev), &o);
            // Rank 0 receives, and its previous rank sends, the mismatched message.
            let sender = next == 0;
            let sender_learned_later = sender && r.is_ok();
            if me == 0 || (sender && !sender_learned_later) {
                assert!(matches!(r, Err(Error::Mismatch { .. })), "{r:?}");
            } else if !sender {
                r.unwrap();
            }
            let mut fine = Aligned::poisoned(40);
            let r = comm.batch_send_recv(ring(d, &short, fine.bytes_mut(), next, prev), &o);
            if sender_learned_later {
                let e = r.unwrap_err().to_string();
                assert!(
                    e.contains("refused by its receive, which expected 44 bytes"),
                    "{e}"
                );
            } else {
                r.unwrap();
            }
            assert_eq!(fine.bytes(), &input(d, 10, 8, prev, false)[..]);
            // A peer out of range or this rank itself: refused before anything moves.
            for (bad, what) in [(n, "out of range"), (me, "itself")] {
                let e = comm
                    .batch_send_recv(
                        vec![P2pOp::Send {
                            data: view(d, &short),
                            peer: bad,
                        }],
                        &o,
                    )
                    .unwrap_err();
                assert!(e.to_string().contains(what), "{e}");
            }
            comm.barrier(&o).unwrap();
        });
    }
}

#[test]
fn large_all_reduce_64_mb() {
    let count = (64 << 20) / 4;
    // A cheap generator: 16M elements per rank through StdRng are slow in debug builds.
    let gen = |rank: u64| -> Vec<f32> {
        let mut x = 0x2545_F491_4F6C_DD1D_u64 ^ (rank + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (0..count)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 40) as f32 / (1u64 << 20) as f32 - 8.0
            })
            .collect()
    };
    let ins = [gen(0), gen(1)];
    let outs = run_ranks(2, &config(4 << 20, Duration::from_secs(60)), |comm| {
        let mine = &ins[comm.rank()];
        let mut out = vec![f32::NAN; count];
        comm.all_reduce(
            Input::Buf(ferrocomm::View::host(mine)),
            ferrocomm::ViewMut::host(&mut out),
            ReduceOp::Sum,
            &CallOpts::default().with_algo(Algo::Tree),
        )
        .unwrap();
        let bad = (0..count).find(|&i| out[i] != ins[0][i] + ins[1][i]);
        assert_eq!(bad, None, "first wrong element");
        out
    });
    assert!(outs[0] == outs[1]);
}
