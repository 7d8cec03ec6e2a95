//! The one-rank body: every collective at one rank, each result equal to the library's
//! reference ([`ferrocomm::reference::reduce_in_rank_order`] of the one rank's input, the input
//! itself for the movers) bit for bit, the input of a call out of place kept, nothing written
//! outside the output. `gpu_check_nccl` runs it on NCCL (the `nccl` backend, then the `cuda`
//! backend with NCCL forced); the host backend runs it at one rank.

use ferrocomm::plan::Engine;
use ferrocomm::reference::{self, Value};
use ferrocomm::{CallOpts, Collective, DataType, ReduceOp, Splits};
use rand::{Rng, SeedableRng};

use super::*;

/// The bodies of this module, by name (one rank).
pub const BODIES: [(&str, Body); 1] = [("one rank", host_one_rank)];

/// Whether `d` is reduced here (NCCL's dtypes: every one but FP8, which only moves).
fn reduced(d: DataType) -> bool {
    !matches!(d, DataType::F8E4M3 | DataType::F8E5M2)
}

/// The operators NCCL has for `d` (PremulSum with 0.5: exact in every float dtype).
fn ops_for(d: DataType) -> Vec<ReduceOp> {
    let mut ops = vec![
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];
    if d.is_float() {
        ops.push(ReduceOp::PremulSum(0.5));
    }
    ops
}

/// `count` random elements of `d` (never zero: a result of zeros would hide a copy that did
/// not happen).
fn values(d: DataType, count: usize, seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let es = d.size();
    let mut out = vec![0u8; count * es];
    for el in out.chunks_mut(es) {
        let v = if d.is_float() {
            let x: f64 = rng.random_range(0.05..2.0);
            Value::Float(if rng.random_bool(0.5) { -x } else { x })
        } else {
            let x: i128 = rng.random_range(1..100);
            let signed = matches!(d, DataType::I8 | DataType::I32 | DataType::I64);
            Value::Int(if signed && rng.random_bool(0.5) {
                -x
            } else {
                x
            })
        };
        reference::encode(d, v, el);
    }
    out
}

/// One call of the pass: which collective, and for the reductions the operator.
#[derive(Clone, Copy, Debug)]
pub enum Call {
    AllReduce(ReduceOp),
    Reduce(ReduceOp),
    ReduceScatter(ReduceOp),
    Broadcast,
    AllGather,
    AllToAll,
    AllToAllV,
}

impl Call {
    fn collective(self) -> Collective {
        match self {
            Call::AllReduce(_) => Collective::AllReduce,
            Call::Reduce(_) => Collective::Reduce,
            Call::ReduceScatter(_) => Collective::ReduceScatter,
            Call::Broadcast => Collective::Broadcast,
            Call::AllGather => Collective::AllGather,
            Call::AllToAll => Collective::AllToAll,
            Call::AllToAllV => Collective::AllToAllV,
        }
    }

    /// What one rank's output holds: the reference reduction of its input, or the input.
    fn expected(self, d: DataType, input: &[u8]) -> Vec<u8> {
        match self {
            Call::AllReduce(op) | Call::Reduce(op) | Call::ReduceScatter(op) => {
                reference::reduce_in_rank_order(d, op, &[input.to_vec()])
            }
            _ => input.to_vec(),
        }
    }
}

/// Runs `call` of `count` elements of `d` on the context's communicator with `opts`, `misalign`
/// elements off alignment, in place or not, and checks the plan (its engine must be `engine`),
/// the result and the guard bands.
#[allow(clippy::too_many_arguments)]
pub fn case(
    c: &mut Ctx,
    engine: Engine,
    label: &str,
    opts: &CallOpts,
    call: Call,
    d: DataType,
    count: usize,
    in_place: bool,
    misalign: usize,
    seed: u64,
) -> Res<()> {
    let es = d.size();
    let bytes = count * es;
    let off = misalign * es;
    let what = format!("{label}: {call:?} {d} n={count} in_place={in_place} misalign={misalign}");
    let comm = &c.comm;
    match comm.algo_for(call.collective(), bytes, d, opts) {
        Ok(p) if p.engine == engine => {}
        other => {
            c.expect(label, false, || {
                format!("{what}: planned {other:?}, not {engine:?}")
            });
            return Ok(());
        }
    }
    let input = values(d, count, seed);
    let want = call.expected(d, &input);
    let inb = c.buf(off + bytes)?;
    let outb = c.buf(off + bytes)?;
    inb.poison()?;
    outb.poison()?;
    let dev = c.dev;
    if in_place {
        outb.upload(off, &input)?;
    } else {
        inb.upload(off, &input)?;
    }
    // SAFETY: both buffers hold `off + bytes` bytes of this device and outlive the call (it is
    // synchronised below); the views cover `count` elements from `off`.
    let (i, o) = unsafe {
        let i = match in_place {
            true => Input::InPlace,
            false => Input::Buf(inb.view(off, count, d, dev)),
        };
        (i, outb.view_mut(off, count, d, dev))
    };
    let r = {
        match call {
            Call::AllReduce(op) => comm.all_reduce(i, o, op, opts),
            Call::Reduce(op) => comm.reduce(i, o, op, 0, opts),
            Call::ReduceScatter(op) => comm.reduce_scatter(i, o, op, opts),
            Call::Broadcast => comm.broadcast(i, o, 0, opts),
            Call::AllGather => comm.all_gather(i, o, opts),
            Call::AllToAll => comm.all_to_all(i, o, opts),
            Call::AllToAllV => {
                comm.all_to_all_v(i, o, &Splits::packed(vec![count], vec![count]), opts)
            }
        }
    };
    c.sync()?;
    if let Err(e) = r {
        c.expect(label, false, || format!("{what}: error {e}"));
        return Ok(());
    }
    let got = outb.download(off, bytes)?;
    let wrong = got
        .chunks(es)
        .zip(want.chunks(es))
        .filter(|(a, b)| a != b)
        .count();
    let guard = outb.guard_hits(off, bytes)?;
    // The input of a call out of place is left as it was.
    let input_kept = in_place || inb.download(off, bytes)? == input;
    c.expect(label, wrong == 0 && guard == 0 && input_kept, || {
        format!(
            "{what}: {wrong} elements differ from the reference, {guard} bytes written outside \
             the output, input kept {input_kept}"
        )
    });
    Ok(())
}

/// Every collective on the context's one-rank communicator with `opts`, each planned on
/// `engine`: every operator on every dtype reduced, the movers on every dtype, 1 and 4,097
/// elements, in place and not, aligned and not; a few MB each way; the barrier. Recorded under
/// `label`.
pub fn collectives(c: &mut Ctx, engine: Engine, label: &str, opts: &CallOpts) -> Res<()> {
    if c.world != 1 {
        return Err(format!("{label}: the one-rank cases need one rank, not {}", c.world).into());
    }
    // Every operator on every dtype reduced, then the movers on every dtype.
    let mut calls = Vec::new();
    for d in DataType::ALL.into_iter().filter(|&d| reduced(d)) {
        for op in ops_for(d) {
            let reductions = [
                Call::AllReduce(op),
                Call::Reduce(op),
                Call::ReduceScatter(op),
            ];
            calls.extend(reductions.map(|call| (call, d)));
        }
    }
    for d in DataType::ALL {
        let movers = [
            Call::Broadcast,
            Call::AllGather,
            Call::AllToAll,
            Call::AllToAllV,
        ];
        calls.extend(movers.map(|call| (call, d)));
    }
    let mut seed = 0u64;
    for (call, d) in calls {
        for count in [1usize, 4097] {
            seed += 1;
            let (in_place, misalign) = (seed % 2 == 0, usize::from(seed % 3 == 0));
            case(
                c, engine, label, opts, call, d, count, in_place, misalign, seed,
            )?;
        }
    }
    // A few MB each way, in place and not (100 KB on the host).
    let count_big = c.pick(100_003, 1_000_003);
    for (call, d) in [
        (Call::AllReduce(ReduceOp::Sum), DataType::BF16),
        (Call::AllReduce(ReduceOp::PremulSum(0.5)), DataType::F32),
        (Call::AllGather, DataType::F32),
        (Call::AllToAllV, DataType::BF16),
    ] {
        for in_place in [false, true] {
            seed += 1;
            case(
                c, engine, label, opts, call, d, count_big, in_place, 0, seed,
            )?;
        }
    }
    // The barrier (an NCCL all-reduce of one word, then a wait for the stream).
    let barrier = c.comm.barrier(opts);
    c.expect(label, barrier.is_ok(), || {
        format!("{label}: barrier {barrier:?}")
    });
    Ok(())
}

/// [`collectives`] on the host backend at one rank.
pub fn host_one_rank(c: &mut Ctx) -> Res<()> {
    collectives(c, Engine::Host, "one rank", &CallOpts::default())
}
