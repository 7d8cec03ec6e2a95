//! A peer killed with SIGKILL while its partner waits in a direct-access kernel: the time from
//! the kill to the partner's error, for every kernel family (push, flat, tree, LL128, the
//! copy-engine all-reduce, the collectives, low precision, the fused all-reduce + RMSNorm,
//! send/recv). Two ranks share GPU 0 (NCCL left out, as `--share-gpus` does); one GPU suffices.
//!
//! Run as the parent (no RANK set): `gpu_peer_death [FAMILY...]`. For each family it starts a
//! store and the two ranks (this program again), waits until rank 1 is parked and rank 0 has
//! launched the family's kernel alone, kills rank 1, and reads from rank 0 the CLOCK_MONOTONIC
//! time of its error. Prints one line per family: `family plan ms PASS/FAIL watched synced
//! exited error` (watched: when the watcher's abort hook ran; synced: when the device's wait
//! ended; exited: when the killed rank had exited, its GPU context torn down; each in
//! ms from the kill), and `PASS` when the error names rank 1 within a second. Exit status 1
//! when a family does not.
//!
//! `--host` runs the same on the host backend (CPU buffers, no GPU): the harness itself, and
//! the host backend's own times, for the families it has.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ferrocomm::bootstrap::{StoreKey, TcpStoreServer};
use ferrocomm::{
    Algo, AllReduceRmsNorm, CallOpts, Communicator, Config, DataType, Format, Input,
    LowPrecisionChoice, ReduceOp, Splits, View, ViewMut,
};
use support::{Buf, Res};

/// A family: its name, the environment it needs, and the collective's element count.
type Family = (&'static str, &'static [(&'static str, &'static str)], usize);

/// Every family.
const FAMILIES: &[Family] = &[
    ("push", &[], 1024),
    ("flat", &[], 65536),
    ("tree", &[], 1 << 20),
    (
        "ll128",
        &[("FERROCOMM_ALLREDUCE_LL128_MAX_BYTES", "64M")],
        65536,
    ),
    (
        "copy_engine",
        &[("FERROCOMM_ALLREDUCE_CE_MIN_BYTES", "1")],
        1 << 20,
    ),
    ("all_gather", &[], 65536),
    ("reduce_scatter", &[], 65536),
    ("all_to_all", &[], 65536),
    ("all_to_all_v", &[], 65536),
    ("broadcast", &[], 65536),
    ("reduce", &[], 65536),
    ("lowp_all_reduce", &[], 1 << 20),
    ("lowp_all_gather", &[], 1 << 20),
    ("rmsnorm", &[], 8 * 4096),
    ("send_recv", &[], 65536),
];

const SECRET: &str = "gpu_peer_death's own store secret";

fn mono_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

fn main() {
    support::run_main("gpu_peer_death", || {
        match std::env::var("FC_DEATH_FAMILY") {
            Ok(f) => rank(&f),
            Err(_) => parent(),
        }
    })
}

fn parent() -> Res<i32> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let named: Vec<&String> = args.iter().filter(|a| *a != "--host").collect();
    let wanted: Vec<&Family> = FAMILIES
        .iter()
        .filter(|f| named.is_empty() || named.iter().any(|a| *a == f.0))
        .collect();
    if wanted.is_empty() {
        let names: Vec<&str> = FAMILIES.iter().map(|f| f.0).collect();
        return Err(format!("no family among {args:?} (families: {})", names.join(" ")).into());
    }
    let host = args.iter().any(|a| a == "--host");
    // The host backend has no push, tree, LL128 or copy-engine form of its own.
    let wanted: Vec<_> = wanted
        .into_iter()
        .filter(|f| !host || !matches!(f.0, "ll128" | "copy_engine" | "push" | "tree"))
        .collect();
    let exe = std::env::current_exe()?;
    let mut failed = 0;
    println!(
        "{:<18} {:<12} {:>10}  {:<4} {:>10} {:>10} {:>10}  error",
        "family", "plan", "ms", "", "watched", "synced", "exited"
    );
    for (name, env, _) in wanted {
        let server = TcpStoreServer::bind("127.0.0.1", 0, &StoreKey::from_secret(SECRET))?;
        let mut kids = Vec::new();
        for r in 0..2 {
            let mut c = Command::new(&exe);
            if host {
                c.env("FC_DEATH_HOST", "1");
            }
            c.env("FC_DEATH_FAMILY", name)
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", "2")
                .env("LOCAL_RANK", "0")
                .env("LOCAL_WORLD_SIZE", "2")
                .env("FERROCOMM_STORE_ADDR", "127.0.0.1")
                .env("FERROCOMM_STORE_PORT", server.port().to_string())
                .env("FERROCOMM_STORE_EXTERNAL", "1")
                .env("FERROCOMM_STORE_SECRET", SECRET)
                .env("FERROCOMM_TIMEOUT_S", "60")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped());
            for (k, v) in *env {
                c.env(k, v);
            }
            kids.push(c.spawn()?);
        }
        let deadline = Instant::now() + Duration::from_secs(240);
        let mut outs: Vec<_> = kids
            .iter_mut()
            .map(|k| BufReader::new(k.stdout.take().expect("piped")))
            .collect();
        let line = |out: &mut BufReader<_>, tag: &str| -> Res<String> {
            let mut l = String::new();
            loop {
                if Instant::now() > deadline {
                    return Err(format!("{name}: no {tag} in time").into());
                }
                l.clear();
                if out.read_line(&mut l)? == 0 {
                    return Err(format!("{name}: the rank's output ended before {tag}").into());
                }
                if let Some(rest) = l.trim_end().strip_prefix(tag) {
                    return Ok(rest.trim().to_string());
                }
            }
        };
        let result = (|| -> Res<(String, String, f64)> {
            line(&mut outs[1], "PARKED")?;
            let plan = line(&mut outs[0], "LAUNCHED")?;
            kids[1].kill()?;
            let killed = mono_ns();
            // When the killed rank had exited (its GPU context torn down).
            let pid = rustix::process::Pid::from_raw(kids[1].id() as i32);
            let reaped = std::thread::spawn(move || {
                let pidfd = pid.and_then(|p| {
                    rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok()
                })?;
                let mut fds = [rustix::event::PollFd::new(
                    &pidfd,
                    rustix::event::PollFlags::IN,
                )];
                rustix::event::poll(&mut fds, None).ok()?;
                Some(mono_ns())
            });
            // Until the error: when the watcher saw the death (the abort hook) and when the
            // device's wait ended, to tell the detection from the kernel's look.
            let (mut watched, mut synced) = (None, None);
            let err = loop {
                let l = line(&mut outs[0], "")?;
                let ms = |t: &str| -> Res<f64> {
                    Ok(t.parse::<u64>()?.saturating_sub(killed) as f64 / 1e6)
                };
                if let Some(t) = l.strip_prefix("WATCHED ") {
                    watched = Some(ms(t)?);
                } else if let Some(t) = l.strip_prefix("SYNCED ") {
                    synced = Some(ms(t)?);
                } else if let Some(e) = l.strip_prefix("ERROR ") {
                    break e.to_string();
                }
            };
            let (t, text) = err.split_once(' ').unwrap_or((&err, ""));
            let t: u64 = t.parse()?;
            let at = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
            Ok((
                plan,
                format!(
                    "{:>10} {:>10} {:>10}  {text}",
                    at(watched),
                    at(synced),
                    at(reaped
                        .join()
                        .ok()
                        .flatten()
                        .map(|t| t.saturating_sub(killed) as f64 / 1e6))
                ),
                t.saturating_sub(killed) as f64 / 1e6,
            ))
        })();
        for k in kids.iter_mut() {
            let _ = k.kill();
            let _ = k.wait();
        }
        match result {
            Ok((plan, text, ms)) => {
                let ok = ms < 1000.0 && text.contains("rank 1 failed or exited");
                println!(
                    "{name:<18} {plan:<12} {ms:>10.2}  {} {text}",
                    if ok { "PASS" } else { "FAIL" }
                );
                failed += usize::from(!ok);
            }
            Err(e) => {
                println!("{name:<18} {:<12} {:>10}  FAIL {e}", "-", "-");
                failed += 1;
            }
        }
    }
    Ok(i32::from(failed > 0))
}

/// One rank: both ranks run the family's call once (kernels compiled, everything set up); then
/// rank 1 parks and rank 0 launches the call alone and waits for the device.
fn rank(family: &str) -> Res<i32> {
    let (_, _, n) = FAMILIES
        .iter()
        .find(|f| f.0 == family)
        .ok_or_else(|| format!("unknown family {family}"))?;
    let mut cfg = Config::from_env()?;
    cfg.nccl_lib = Some(support::NO_NCCL.into());
    let host = std::env::var("FC_DEATH_HOST").is_ok();
    let mut o = ferrocomm::CommOptions::new(format!("death-{family}"));
    o.device = Some(if host {
        ferrocomm::Device::Host
    } else {
        ferrocomm::Device::Cuda(0)
    });
    o.config = Some(cfg);
    let comm = Communicator::new(o)?;
    let me = comm.rank();
    let stream = if host { 0 } else { support::new_stream()? };
    let bufs = Bufs::new(*n, host)?;
    let (plan, _) = call(&comm, family, &bufs, *n, stream)?;
    if !host {
        support::sync()?;
    }
    if me == 1 {
        println!("PARKED");
        let _ = std::io::stdin().read_line(&mut String::new());
        std::thread::sleep(Duration::from_secs(300));
        return Ok(0);
    }
    // Alone: the kernel waits for rank 1, which the parent kills now. (A host call waits in
    // the call itself: announced first.)
    if host {
        println!("LAUNCHED {plan}");
    }
    // The watcher's handler runs the abort hooks right after raising the abort word.
    let _watched =
        comm.register_abort_hook(std::sync::Arc::new(|| println!("WATCHED {}", mono_ns())))?;
    let issued = call(&comm, family, &bufs, *n, stream);
    if !host {
        println!("LAUNCHED {plan}");
    }
    let r: Result<(), String> = match issued {
        // A call that waits on the host ends with the error itself.
        Err(e) => Err(e.to_string()),
        Ok(_) => {
            // The kernel's wait ends (the abort word); waiting for the call's point says why,
            // and so does the next call.
            let point = comm.mark(stream);
            if !host {
                let synced = support::sync();
                println!("SYNCED {}", mono_ns());
                synced?;
            }
            point
                .and_then(|p| p.map_or(Ok(true), |p| comm.wait(&p, None)))
                .and_then(|_| comm.barrier(&CallOpts::on_stream(stream)))
                .map_err(|e| e.to_string())
        }
    };
    let t = mono_ns();
    match r {
        Err(e) => println!("ERROR {t} {e}"),
        Ok(()) => println!("ERROR {t} (none: the call went through without rank 1)"),
    }
    Ok(0)
}

/// Buffers big enough for every family at `n` elements: device memory, or host memory for
/// `--host`.
struct Bufs {
    a: Mem,
    b: Mem,
    c: Mem,
    d: Mem,
}

enum Mem {
    Device(Buf),
    Host(Vec<f32>),
}

impl Mem {
    fn ptr(&self) -> (u64, ferrocomm::Device) {
        match self {
            Mem::Device(b) => (b.ptr, ferrocomm::Device::Cuda(0)),
            Mem::Host(v) => (v.as_ptr() as u64, ferrocomm::Device::Host),
        }
    }
}

impl Bufs {
    fn new(n: usize, host: bool) -> Res<Bufs> {
        let big = 2 * n;
        let mem = || -> Res<Mem> {
            Ok(if host {
                Mem::Host(vec![1.0; big])
            } else {
                Mem::Device(Buf::new(4 * big)?)
            })
        };
        Ok(Bufs {
            a: mem()?,
            b: mem()?,
            c: mem()?,
            d: mem()?,
        })
    }
}

fn f32_view(b: &Mem, n: usize) -> View<'static> {
    let (p, d) = b.ptr();
    // SAFETY: `b` holds at least `n` f32 elements (Bufs::new) and outlives every call of this
    // program (the buffers are dropped after the last call is synchronized).
    unsafe { View::from_raw(p as *const u8, n, DataType::F32, d) }
}

fn f32_view_mut(b: &Mem, n: usize) -> ViewMut<'static> {
    let (p, d) = b.ptr();
    // SAFETY: as for `f32_view`; each call writes only its own output (host buffers are only
    // reached through these raw views).
    unsafe { ViewMut::from_raw(p as *mut u8, n, DataType::F32, d) }
}

/// Issues `family`'s call; returns its plan as the bench prints it.
fn call(comm: &Communicator, family: &str, b: &Bufs, n: usize, stream: u64) -> Res<(String, ())> {
    let o = CallOpts::on_stream(stream);
    let w = comm.size();
    let ar = |algo: Algo| -> Res<(String, ())> {
        let o = o.clone().with_algo(algo);
        let plan = comm.algo_for(ferrocomm::Collective::AllReduce, 4 * n, DataType::F32, &o)?;
        comm.all_reduce(
            Input::Buf(f32_view(&b.a, n)),
            f32_view_mut(&b.b, n),
            ReduceOp::Sum,
            &o,
        )?;
        Ok((plan.to_string(), ()))
    };
    let lp = o
        .clone()
        .with_low_precision(LowPrecisionChoice::On(Format::E4M3));
    let plan_of = |c: ferrocomm::Collective, bytes: usize, o: &CallOpts| {
        comm.algo_for(c, bytes, DataType::F32, o)
            .map(|p| p.to_string())
    };
    use ferrocomm::Collective as C;
    Ok(match family {
        "push" => ar(Algo::Push)?,
        "flat" | "ll128" | "copy_engine" => ar(Algo::Flat)?,
        "tree" => ar(Algo::Tree)?,
        "all_gather" => {
            comm.all_gather(Input::Buf(f32_view(&b.a, n)), f32_view_mut(&b.b, n * w), &o)?;
            (plan_of(C::AllGather, 4 * n, &o)?, ())
        }
        "reduce_scatter" => {
            comm.reduce_scatter(
                Input::Buf(f32_view(&b.a, n * w)),
                f32_view_mut(&b.b, n),
                ReduceOp::Sum,
                &o,
            )?;
            (plan_of(C::ReduceScatter, 4 * n, &o)?, ())
        }
        "all_to_all" => {
            comm.all_to_all(Input::Buf(f32_view(&b.a, n)), f32_view_mut(&b.b, n), &o)?;
            (plan_of(C::AllToAll, 4 * n, &o)?, ())
        }
        "all_to_all_v" => {
            let part = n / w;
            let s = Splits::packed(vec![part; w], vec![part; w]);
            comm.all_to_all_v(Input::Buf(f32_view(&b.a, n)), f32_view_mut(&b.b, n), &s, &o)?;
            (plan_of(C::AllToAllV, 4 * n, &o)?, ())
        }
        "broadcast" => {
            comm.broadcast(Input::Buf(f32_view(&b.a, n)), f32_view_mut(&b.b, n), 1, &o)?;
            (plan_of(C::Broadcast, 4 * n, &o)?, ())
        }
        "reduce" => {
            comm.reduce(
                Input::Buf(f32_view(&b.a, n)),
                f32_view_mut(&b.b, n),
                ReduceOp::Sum,
                1,
                &o,
            )?;
            (plan_of(C::Reduce, 4 * n, &o)?, ())
        }
        "lowp_all_reduce" => {
            comm.all_reduce(
                Input::Buf(f32_view(&b.a, n)),
                f32_view_mut(&b.b, n),
                ReduceOp::Sum,
                &lp,
            )?;
            (plan_of(C::AllReduce, 4 * n, &lp)?, ())
        }
        "lowp_all_gather" => {
            comm.all_gather(
                Input::Buf(f32_view(&b.a, n / w)),
                f32_view_mut(&b.b, n),
                &lp,
            )?;
            (plan_of(C::AllGather, 4 * n / w, &lp)?, ())
        }
        "rmsnorm" => {
            let hidden = 4096;
            let call = AllReduceRmsNorm {
                x: Input::Buf(f32_view(&b.a, n)),
                out: f32_view_mut(&b.b, n),
                residual: Input::Buf(f32_view(&b.c, n)),
                residual_out: f32_view_mut(&b.d, n),
                // The second half of `a`, after the rows of x.
                weight: f32_view(&b.a, 2 * n).sub(n, hidden),
                eps: 1e-6,
                fp8: None,
            };
            comm.all_reduce_rmsnorm(call, &o)?;
            ("fused".into(), ())
        }
        "send_recv" => {
            if comm.rank() == 0 {
                comm.recv(f32_view_mut(&b.b, n), 1, &o)?;
            } else {
                comm.send(f32_view(&b.a, n), 0, &o)?;
            }
            (plan_of(C::Send, 4 * n, &o)?, ())
        }
        other => return Err(format!("unknown family {other}").into()),
    })
}
