//! Shared by the host backend's integration tests: ranks as threads, inputs regenerated from
//! seeds, and a plain element-by-element reference.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferrocomm::bootstrap::{MemStore, Store, StoreKey};
use ferrocomm::config::BackendChoice;
use ferrocomm::{CommOptions, Communicator, Config, DataType, ReduceOp};
use half::{bf16, f16};
use rand::{Rng, SeedableRng};

pub fn config(slot_bytes: usize, timeout: Duration) -> Config {
    Config {
        host_slot_bytes: slot_bytes,
        timeout,
        ..Config::default()
    }
}

/// The store key of the tests' TCP stores (parent and child processes derive the same).
pub fn key() -> StoreKey {
    StoreKey::from_secret("the host tests' store secret")
}

/// A name no other test in this process uses.
pub fn unique_name(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

pub fn communicator(
    store: Arc<dyn Store>,
    name: &str,
    rank: usize,
    n: usize,
    cfg: &Config,
) -> Communicator {
    Communicator::new(CommOptions {
        name: name.to_string(),
        rank: Some(rank),
        size: Some(n),
        store: Some(store),
        backend: Some(BackendChoice::Host),
        config: Some(cfg.clone()),
        ..Default::default()
    })
    .expect("host communicator")
}

/// Runs `f` on `n` threads, each with its rank's communicator; results in rank order.
pub fn run_ranks<R: Send>(n: usize, cfg: &Config, f: impl Fn(Communicator) -> R + Sync) -> Vec<R> {
    let store: Arc<dyn Store> = MemStore::new();
    let name = unique_name("t");
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (store, name, f) = (store.clone(), &name, &f);
                s.spawn(move || f(communicator(store, name, r, n, cfg)))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    })
}

/// `count` random elements of `d` as bytes, the same for the same (seed, rank).
pub fn input(d: DataType, count: usize, seed: u64, rank: usize, small_ints: bool) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(
        seed.wrapping_mul(1_000_003) ^ ((rank as u64 + 1) * 0x9E37_79B9),
    );
    let mut out = Vec::with_capacity(count * d.size());
    for _ in 0..count {
        let v: f32 = rng.random_range(-3.0..3.0);
        match d {
            DataType::F32 => out.extend_from_slice(&v.to_le_bytes()),
            DataType::F64 => out.extend_from_slice(&(rng.random_range(-3.0f64..3.0)).to_le_bytes()),
            DataType::F16 => out.extend_from_slice(&f16::from_f32(v).to_le_bytes()),
            DataType::BF16 => out.extend_from_slice(&bf16::from_f32(v).to_le_bytes()),
            DataType::F8E4M3 => out.push(float8::F8E4M3::from_f32(v).to_bits()),
            DataType::F8E5M2 => out.push(float8::F8E5M2::from_f32(v).to_bits()),
            _ if small_ints => {
                let x: i64 = rng.random_range(-5..=5);
                let x = if matches!(d, DataType::U8 | DataType::U32 | DataType::U64) {
                    x.unsigned_abs() as i64
                } else {
                    x
                };
                out.extend_from_slice(&x.to_le_bytes()[..d.size()]);
            }
            _ => out.extend((0..d.size()).map(|_| rng.random::<u8>())),
        }
    }
    out
}

fn widen(d: DataType, b: &[u8]) -> f64 {
    match d {
        DataType::F32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
        DataType::F64 => f64::from_le_bytes(b.try_into().unwrap()),
        DataType::F16 => f16::from_le_bytes(b.try_into().unwrap()).to_f32() as f64,
        DataType::BF16 => bf16::from_le_bytes(b.try_into().unwrap()).to_f32() as f64,
        DataType::F8E4M3 => float8::F8E4M3::from_bits(b[0]).to_f32() as f64,
        DataType::F8E5M2 => float8::F8E5M2::from_bits(b[0]).to_f32() as f64,
        _ => unreachable!(),
    }
}

fn narrow(d: DataType, v: f64) -> Vec<u8> {
    let f = v as f32;
    match d {
        DataType::F32 => f.to_le_bytes().to_vec(),
        DataType::F64 => v.to_le_bytes().to_vec(),
        DataType::F16 => f16::from_f32(f).to_le_bytes().to_vec(),
        DataType::BF16 => bf16::from_f32(f).to_le_bytes().to_vec(),
        DataType::F8E4M3 => vec![float8::F8E4M3::from_f32(f).to_bits()],
        DataType::F8E5M2 => vec![float8::F8E5M2::from_f32(f).to_bits()],
        _ => unreachable!(),
    }
}

fn int_of(d: DataType, b: &[u8]) -> i128 {
    let mut w = [0u8; 16];
    w[..b.len()].copy_from_slice(b);
    let u = i128::from_le_bytes(w);
    let bits = 8 * b.len() as u32;
    let signed = matches!(d, DataType::I8 | DataType::I32 | DataType::I64);
    if signed && u >= 1i128 << (bits - 1) {
        u - (1i128 << bits)
    } else {
        u
    }
}

/// Plain reference: fold element `i` of every rank's input in rank order, in f64 for f64, f32
/// (rounded after every step) for the other floats, wrapping integers; narrow once at the end.
pub fn reference(d: DataType, op: ReduceOp, inputs: &[Vec<u8>]) -> Vec<u8> {
    let es = d.size();
    let count = inputs[0].len() / es;
    let n = inputs.len();
    let mut out = Vec::with_capacity(count * es);
    for i in 0..count {
        let el = |r: usize| &inputs[r][i * es..(i + 1) * es];
        if d.is_float() {
            let rd = |v: f64| {
                if d == DataType::F64 {
                    v
                } else {
                    v as f32 as f64
                }
            };
            let s = match op {
                ReduceOp::PremulSum(s) => rd(s),
                _ => 1.0,
            };
            let mut a = widen(d, el(0));
            if let ReduceOp::PremulSum(_) = op {
                a = rd(a * s);
            }
            for r in 1..n {
                let x = widen(d, el(r));
                a = rd(match op {
                    ReduceOp::Sum | ReduceOp::Avg => a + x,
                    ReduceOp::Prod => a * x,
                    ReduceOp::Min => a.min(x),
                    ReduceOp::Max => a.max(x),
                    ReduceOp::PremulSum(_) => a + rd(x * s),
                    _ => unreachable!(),
                });
            }
            if op == ReduceOp::Avg {
                a = rd(a / n as f64);
            }
            out.extend(narrow(d, a));
        } else {
            let bits = 8 * es as u32;
            let wrap = |v: i128| {
                let m = 1i128 << bits;
                let u = v.rem_euclid(m);
                if matches!(d, DataType::I8 | DataType::I32 | DataType::I64) && u >= m / 2 {
                    u - m
                } else {
                    u
                }
            };
            let mut a = int_of(d, el(0));
            for r in 1..n {
                let x = int_of(d, el(r));
                a = wrap(match op {
                    ReduceOp::Sum | ReduceOp::Avg => a + x,
                    ReduceOp::Prod => a.wrapping_mul(x),
                    ReduceOp::Min => a.min(x),
                    ReduceOp::Max => a.max(x),
                    ReduceOp::BitAnd => a & x,
                    ReduceOp::BitOr => a | x,
                    ReduceOp::BitXor => a ^ x,
                    _ => unreachable!(),
                });
            }
            if op == ReduceOp::Avg {
                a /= n as i128;
            }
            out.extend_from_slice(&a.to_le_bytes()[..es]);
        }
    }
    out
}

pub const OPS: [ReduceOp; 9] = [
    ReduceOp::Sum,
    ReduceOp::Prod,
    ReduceOp::Min,
    ReduceOp::Max,
    ReduceOp::Avg,
    ReduceOp::PremulSum(0.625),
    ReduceOp::BitAnd,
    ReduceOp::BitOr,
    ReduceOp::BitXor,
];

pub const POISON: u8 = 0xA7;

/// A view of raw bytes as `dtype` elements.
pub fn view(d: DataType, b: &[u8]) -> ferrocomm::View<'_> {
    // SAFETY: `b` is a live host buffer of exactly count * size bytes, borrowed for the view.
    unsafe { ferrocomm::View::from_raw(b.as_ptr(), b.len() / d.size(), d, ferrocomm::Device::Host) }
}

pub fn view_mut(d: DataType, b: &mut [u8]) -> ferrocomm::ViewMut<'_> {
    // SAFETY: as for `view`, uniquely borrowed.
    unsafe {
        ferrocomm::ViewMut::from_raw(
            b.as_mut_ptr(),
            b.len() / d.size(),
            d,
            ferrocomm::Device::Host,
        )
    }
}

/// Byte buffers aligned for every dtype (Vec<u64> storage).
pub struct Aligned(Vec<u64>, usize);

impl Aligned {
    pub fn new(bytes: &[u8]) -> Self {
        let mut v = vec![0u64; bytes.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut v)[..bytes.len()].copy_from_slice(bytes);
        Aligned(v, bytes.len())
    }
    pub fn poisoned(len: usize) -> Self {
        Self::new(&vec![POISON; len])
    }
    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.0)[..self.1]
    }
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let n = self.1;
        &mut bytemuck::cast_slice_mut(&mut self.0)[..n]
    }
}
