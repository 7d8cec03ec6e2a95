//! Shared by the host backend's integration tests: ranks as threads, inputs regenerated from
//! seeds, and a plain element-by-element reference.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferrocomm::bootstrap::{MemStore, Store, StoreKey, TcpStore};
use ferrocomm::config::BackendChoice;
use ferrocomm::{
    CallOpts, CommOptions, Communicator, Config, DataType, Element, Input, ReduceOp, View, ViewMut,
};
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

/// A rank process's place, as its parent test started it: (`RANK`, `WORLD_SIZE`) and the TCP
/// store at `TEST_STORE_PORT` on this host (a 20 s connect deadline).
pub fn child_rank_store() -> (usize, usize, Arc<dyn Store>) {
    let env = |k: &str| std::env::var(k).unwrap().parse::<usize>().unwrap();
    let port = u16::try_from(env("TEST_STORE_PORT")).expect("a port");
    let store = TcpStore::connect("127.0.0.1", port, &key(), Duration::from_secs(20))
        .expect("the parent's store");
    (env("RANK"), env("WORLD_SIZE"), Arc::new(store))
}

/// A sum of every rank's `x` into `y` (out of place), the call most tests make.
pub fn all_reduce_sum<T: Element>(
    comm: &Communicator,
    x: &[T],
    y: &mut [T],
    o: &CallOpts,
) -> ferrocomm::Result<()> {
    comm.all_reduce(
        Input::Buf(View::host(x)),
        ViewMut::host(y),
        ReduceOp::Sum,
        o,
    )
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

/// Plain reference: element by element, every rank's input folded in rank order (the library's
/// one reference, [`ferrocomm::reference::reduce_in_rank_order`]).
pub fn reference(d: DataType, op: ReduceOp, inputs: &[Vec<u8>]) -> Vec<u8> {
    ferrocomm::reference::reduce_in_rank_order(d, op, inputs)
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
