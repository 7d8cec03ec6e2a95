//! Windows and the persistent all-gather on the host backend, ranks as threads sharing one
//! process (the segments are real shared memory, mapped once per rank as separate processes
//! map them): puts with signals in a ring over many rounds, a pipeline with no receive, puts
//! at random offsets against a reference, overlapping puts from two ranks to disjoint ranges,
//! a peer's buffer read through its mapping, refused registrations and puts with nothing
//! written, waits ended by a timeout or an abort, and the persistent all-gather over 1,000
//! executions. python/tests/test_window.py runs the same as separate processes.

mod host_support;

use std::sync::Barrier;
use std::time::{Duration, Instant};

use ferrocomm::{CallOpts, Communicator, DataType, Error, SharedMem, View, ViewMut};
use host_support::*;
use rand::{Rng, SeedableRng};

fn cfg() -> ferrocomm::Config {
    config(8192, Duration::from_secs(30))
}

/// `n` f32 of shared memory, and a view of them.
struct Buf {
    mem: SharedMem,
    n: usize,
}

impl Buf {
    fn new(n: usize) -> Buf {
        Buf {
            mem: SharedMem::new(n * 4).unwrap(),
            n,
        }
    }
    fn view_mut(&self) -> ViewMut<'_> {
        // SAFETY: the memory holds `n` f32 and lives as long as `self`; peers write into it
        // only through the window it is registered in.
        unsafe {
            ViewMut::from_raw(
                self.mem.as_mut_ptr(),
                self.n,
                DataType::F32,
                ferrocomm::Device::Host,
            )
        }
    }
    fn read(&self) -> Vec<f32> {
        // SAFETY: `n` f32 in live memory; the tests read after the waits that order the puts.
        unsafe { std::slice::from_raw_parts(self.mem.as_mut_ptr().cast::<f32>(), self.n) }.to_vec()
    }
    fn fill(&self, v: f32) {
        // SAFETY: as above; nothing writes into it while the tests fill it (before registering
        // or after a barrier).
        unsafe {
            std::slice::from_raw_parts_mut(self.mem.as_mut_ptr().cast::<f32>(), self.n).fill(v)
        }
    }
}

fn o() -> CallOpts {
    CallOpts::default()
}

#[test]
fn a_ring_of_puts_with_signals_over_many_rounds() {
    for n in [2, 3, 4] {
        run_ranks(n, &cfg(), |comm| {
            let (rank, size) = (comm.rank(), comm.size());
            let count = 64;
            let buf = Buf::new(count * size);
            buf.fill(-1.0);
            let mut win = comm.new_window().unwrap();
            win.register(buf.view_mut()).unwrap();
            let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
            for round in 0..300u32 {
                let data: Vec<f32> = (0..count)
                    .map(|i| (round * 1000 + rank as u32 * 100 + i as u32) as f32)
                    .collect();
                win.put(View::host(&data), next, rank * count, &o())
                    .unwrap();
                win.signal(next, &o()).unwrap();
                win.wait_signal(prev, &o()).unwrap();
                let got = buf.read();
                let want: Vec<f32> = (0..count)
                    .map(|i| (round * 1000 + prev as u32 * 100 + i as u32) as f32)
                    .collect();
                assert_eq!(
                    &got[prev * count..(prev + 1) * count],
                    &want[..],
                    "round {round}"
                );
                // The peer writes the next round only after this rank's reply: the ring's
                // other direction tells it this rank has read.
                win.signal(prev, &o()).unwrap();
                win.wait_signal(next, &o()).unwrap();
            }
            win.deregister().unwrap();
        });
    }
}

#[test]
fn a_pipeline_puts_forward_with_no_receive() {
    let n = 4;
    let stages = run_ranks(n, &cfg(), |comm| {
        let (rank, size) = (comm.rank(), comm.size());
        let count = 1000;
        let buf = Buf::new(count);
        let mut win = comm.new_window().unwrap();
        win.register(buf.view_mut()).unwrap();
        let mut seen = Vec::new();
        for micro in 0..50 {
            // Stage 0 makes the activations, every later stage adds its rank and passes on.
            let act: Vec<f32> = if rank == 0 {
                (0..count).map(|i| (micro * count + i) as f32).collect()
            } else {
                win.wait_signal(rank - 1, &o()).unwrap();
                let mut a = buf.read();
                // The buffer is free again: tell the previous stage.
                win.signal(rank - 1, &o()).unwrap();
                a.iter_mut().for_each(|x| *x += rank as f32);
                a
            };
            seen.push(act[count - 1]);
            if rank + 1 < size {
                if micro > 0 {
                    win.wait_signal(rank + 1, &o()).unwrap();
                }
                win.put(View::host(&act), rank + 1, 0, &o()).unwrap();
                win.signal(rank + 1, &o()).unwrap();
            }
        }
        if rank + 1 < size {
            win.wait_signal(rank + 1, &o()).unwrap();
        }
        win.deregister().unwrap();
        seen
    });
    let added: usize = (1..n).sum();
    for (micro, last) in stages[n - 1].iter().enumerate() {
        assert_eq!(
            *last,
            (micro * 1000 + 999 + added) as f32,
            "micro-batch {micro}"
        );
    }
    assert_eq!(stages[n - 1].len(), 50);
}

#[test]
fn puts_at_random_offsets_match_a_reference() {
    let n = 3;
    run_ranks(n, &cfg(), |comm| {
        let (rank, size) = (comm.rank(), comm.size());
        let count = 4096;
        let buf = Buf::new(count);
        buf.fill(0.0);
        let mut win = comm.new_window().unwrap();
        win.register(buf.view_mut()).unwrap();
        // Every rank replays every rank's generator: rank r writes pieces into rank (r+1)'s
        // buffer, so the target knows what must have landed.
        let pieces = |r: usize| {
            let mut rng = rand::rngs::StdRng::seed_from_u64(77 + r as u64);
            (0..200)
                .map(|k| {
                    let len = rng.random_range(1..64);
                    let off = rng.random_range(0..count - len);
                    let val: Vec<f32> = (0..len)
                        .map(|i| (k * 100 + i) as f32 + r as f32 * 0.5)
                        .collect();
                    (off, val)
                })
                .collect::<Vec<_>>()
        };
        let to = (rank + 1) % size;
        for (off, val) in pieces(rank) {
            win.put(View::host(&val), to, off, &o()).unwrap();
        }
        win.signal(to, &o()).unwrap();
        let from = (rank + size - 1) % size;
        win.wait_signal(from, &o()).unwrap();
        let mut want = vec![0.0f32; count];
        for (off, val) in pieces(from) {
            want[off..off + val.len()].copy_from_slice(&val);
        }
        assert_eq!(buf.read(), want);
        win.deregister().unwrap();
    });
}

#[test]
fn two_ranks_put_into_disjoint_ranges_of_one_buffer_at_once() {
    let n = 3;
    run_ranks(n, &cfg(), |comm| {
        let rank = comm.rank();
        let count = 1 << 16;
        let buf = Buf::new(count);
        buf.fill(-5.0);
        let mut win = comm.new_window().unwrap();
        win.register(buf.view_mut()).unwrap();
        // Ranks 1 and 2 each write their half of rank 0's buffer, element by element
        // interleaved in time (many small puts), while rank 0 waits for both.
        if rank > 0 {
            let half = count / 2;
            let base = (rank - 1) * half;
            for chunk in 0..half / 256 {
                let v: Vec<f32> = (0..256)
                    .map(|i| (rank * 1_000_000 + chunk * 256 + i) as f32)
                    .collect();
                win.put(View::host(&v), 0, base + chunk * 256, &o())
                    .unwrap();
            }
            win.signal(0, &o()).unwrap();
        } else {
            win.wait_signal(1, &o()).unwrap();
            win.wait_signal(2, &o()).unwrap();
            let got = buf.read();
            for (i, x) in got.iter().enumerate() {
                let (r, j) = (1 + i / (count / 2), i % (count / 2));
                assert_eq!(*x, (r * 1_000_000 + j) as f32, "element {i}");
            }
        }
        win.deregister().unwrap();
    });
}

#[test]
fn a_peer_buffer_read_through_its_mapping_after_the_signal() {
    run_ranks(2, &cfg(), |comm| {
        let rank = comm.rank();
        let buf = Buf::new(100);
        buf.fill(rank as f32);
        let mut win = comm.new_window().unwrap();
        win.register(buf.view_mut()).unwrap();
        if rank == 0 {
            // Its own buffer, written in place, then announced.
            buf.fill(42.0);
            win.signal(1, &o()).unwrap();
            win.wait_signal(1, &o()).unwrap();
        } else {
            win.wait_signal(0, &o()).unwrap();
            let p = win.remote_ptr(0).unwrap();
            // SAFETY: rank 0's 100 f32 as mapped here; rank 0 wrote them before its signal.
            let peer = unsafe { std::slice::from_raw_parts(p.cast::<f32>(), 100) };
            assert!(peer.iter().all(|&x| x == 42.0));
            assert_eq!(win.remote_ptr(1).unwrap(), buf.mem.as_mut_ptr());
            assert_eq!(win.access_type(0).unwrap(), ferrocomm::AccessType::Unified);
            win.signal(0, &o()).unwrap();
        }
        win.deregister().unwrap();
    });
}

/// Every rank's buffer still holds `fill` (nothing was written).
fn untouched(buf: &Buf, fill: f32) {
    assert!(
        buf.read().iter().all(|&x| x == fill),
        "the buffer was written"
    );
}

#[test]
fn bad_puts_are_refused_on_every_rank_with_nothing_written() {
    run_ranks(3, &cfg(), |comm| {
        let (rank, size) = (comm.rank(), comm.size());
        let buf = Buf::new(10);
        buf.fill(7.0);
        let mut win = comm.new_window().unwrap();
        win.register(buf.view_mut()).unwrap();
        let to = (rank + 1) % size;
        let four = [1.0f32; 4];
        let msg = |r: ferrocomm::Result<()>| r.unwrap_err().to_string();
        let e = msg(win.put(View::host(&four), to, 7, &o()));
        assert!(
            e.contains("target_offset_nelems 7") && e.contains("past the end"),
            "{e}"
        );
        let e = msg(win.put(View::host(&four), to, usize::MAX - 1, &o()));
        assert!(e.contains("overflow"), "{e}");
        let ints = [1i32; 2];
        let e = msg(win.put(View::host(&ints), to, 0, &o()));
        assert!(
            e.contains("dtype mismatch") && e.contains("int32") && e.contains("float"),
            "{e}"
        );
        let e = msg(win.put(View::host(&four), size, 0, &o()));
        assert!(e.contains("dst_rank rank 3 is out of range"), "{e}");
        let e = msg(win.signal(size + 4, &o()));
        assert!(e.contains("out of range"), "{e}");
        let e = msg(win.wait_signal(size, &o()));
        assert!(e.contains("out of range"), "{e}");
        // Nothing landed anywhere: every rank checks its own buffer after all have tried.
        comm.barrier(&o()).unwrap();
        untouched(&buf, 7.0);
        comm.barrier(&o()).unwrap();
        // A put that exactly fills the end is taken.
        win.put(View::host(&four[..3]), to, 7, &o()).unwrap();
        win.signal(to, &o()).unwrap();
        win.wait_signal((rank + size - 1) % size, &o()).unwrap();
        assert_eq!(&buf.read()[6..], &[7.0, 1.0, 1.0, 1.0]);
        win.deregister().unwrap();
        let e = msg(win.put(View::host(&four), to, 0, &o()));
        assert!(e.contains("no buffer is registered"), "{e}");
    });
}

#[test]
fn mismatched_registrations_are_refused_on_every_rank() {
    let errs = run_ranks(3, &cfg(), |comm| {
        let rank = comm.rank();
        // Rank 2 registers a longer buffer.
        let buf = Buf::new(if rank == 2 { 12 } else { 10 });
        buf.fill(3.0);
        let ok = Buf::new(10);
        let mut win = comm.new_window().unwrap();
        let e = win.register(buf.view_mut()).unwrap_err().to_string();
        untouched(&buf, 3.0);
        // The window stays usable: buffers of equal size register.
        win.register(ok.view_mut()).unwrap();
        win.deregister().unwrap();
        e
    });
    for e in &errs {
        assert!(
            e.contains("rank 0 float x 10, rank 1 float x 10, rank 2 float x 12"),
            "{e}"
        );
    }
    // A dtype that differs, and memory peers cannot map (a plain Vec) on one rank only.
    let errs = run_ranks(2, &cfg(), |comm| {
        let rank = comm.rank();
        let mem = SharedMem::new(64).unwrap();
        let mut private = vec![0.0f32; 16];
        let dt = if rank == 0 {
            DataType::F32
        } else {
            DataType::I32
        };
        // SAFETY: 16 four-byte elements of live shared memory.
        let v = unsafe { ViewMut::from_raw(mem.as_mut_ptr(), 16, dt, ferrocomm::Device::Host) };
        let mut win = comm.new_window().unwrap();
        let dtype = win.register(v).unwrap_err().to_string();
        let v = if rank == 1 {
            ViewMut::host(&mut private)
        } else {
            // SAFETY: as above.
            unsafe {
                ViewMut::from_raw(mem.as_mut_ptr(), 16, DataType::F32, ferrocomm::Device::Host)
            }
        };
        let private_err = win.register(v).unwrap_err().to_string();
        (dtype, private_err)
    });
    for (dtype, private_err) in &errs {
        assert!(
            dtype.contains("rank 0 float x 16, rank 1 int32 x 16"),
            "{dtype}"
        );
        assert!(private_err.contains("shared memory"), "{private_err}");
    }
    assert!(errs[0].1.contains("refused on every rank") && errs[0].1.contains("rank 1:"));
}

#[test]
fn a_wait_times_out_naming_the_peer_and_an_abort_ends_one() {
    let cfg = config(8192, Duration::from_secs(30));
    let go = Barrier::new(2);
    run_ranks(2, &cfg, |comm| {
        let rank = comm.rank();
        let buf = Buf::new(8);
        let mut win = comm.new_window().unwrap();
        win.register(buf.view_mut()).unwrap();
        if rank == 0 {
            let t0 = Instant::now();
            let short = CallOpts::default().with_timeout(Duration::from_millis(300));
            let e = win.wait_signal(1, &short).unwrap_err();
            assert!(matches!(e, Error::Timeout { missing: 1, .. }), "{e}");
            assert!(e.to_string().contains("wait_signal"), "{e}");
            assert!(t0.elapsed() < Duration::from_secs(20));
            go.wait();
        } else {
            go.wait();
        }
        win.deregister().unwrap();
    });
    // An abort from another thread ends a wait (the wait's own timeout is 30 s): whether it
    // comes before the wait starts or during it, the wait fails with Aborted.
    run_ranks(1, &cfg, |comm| {
        let buf = Buf::new(8);
        let mut win = comm.new_window().unwrap();
        win.register(buf.view_mut()).unwrap();
        let started = Barrier::new(2);
        std::thread::scope(|s| {
            let h = s.spawn(|| {
                started.wait();
                win.wait_signal(0, &o())
            });
            started.wait();
            let t0 = Instant::now();
            comm.abort();
            let e = h.join().unwrap().unwrap_err();
            assert!(matches!(e, Error::Aborted { .. }), "{e}");
            assert!(t0.elapsed() < Duration::from_secs(20));
        });
        let e = win.put(View::host(&[1.0f32]), 0, 0, &o()).unwrap_err();
        assert!(matches!(e, Error::Aborted { .. }), "{e}");
    });
}

#[test]
fn persistent_all_gather_over_a_thousand_executions() {
    for n in [2, 3, 4] {
        run_ranks(n, &cfg(), |comm: Communicator| {
            let (rank, size) = (comm.rank(), comm.size());
            let part = 33;
            let out = Buf::new(part * size);
            let ag = comm.all_gather_p_init(out.view_mut(), &o()).unwrap();
            for it in 0..1000usize {
                let input: Vec<f32> = (0..part)
                    .map(|i| (it * 10_000 + rank * 100 + i) as f32)
                    .collect();
                ag.exec(View::host(&input), &o()).unwrap();
                let got = out.read();
                for r in 0..size {
                    for i in 0..part {
                        assert_eq!(
                            got[r * part + i],
                            (it * 10_000 + r * 100 + i) as f32,
                            "it {it}"
                        );
                    }
                }
            }
            // In place: the input is this rank's part of the output.
            out.fill(0.0);
            // SAFETY: this rank's part of the registered output, read by the call only.
            let mine = unsafe {
                let p = out.mem.as_mut_ptr().cast::<f32>().add(rank * part);
                std::slice::from_raw_parts_mut(p, part).fill(rank as f32 + 0.5);
                View::from_raw(p.cast(), part, DataType::F32, ferrocomm::Device::Host)
            };
            ag.exec(mine, &o()).unwrap();
            let got = out.read();
            for r in 0..size {
                assert!(got[r * part..(r + 1) * part]
                    .iter()
                    .all(|&x| x == r as f32 + 0.5));
            }
            let e = ag
                .exec(View::host(&[0.0f32; 5]), &o())
                .unwrap_err()
                .to_string();
            assert!(e.contains("input has 5 elements, expected 33"), "{e}");
            ag.free().unwrap();
        });
    }
}
