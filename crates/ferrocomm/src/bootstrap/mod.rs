//! Bootstrap: the key-value store ranks meet through, and the helpers built on it.

mod auth;
mod channel;
mod tcp;

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

pub use auth::{new_secret, StoreKey};
pub use tcp::{
    connect_from_env, ServerLimits, TcpStore, TcpStoreServer, ENTRY_OVERHEAD, HANDSHAKE_TIMEOUT,
    MAX_CONNECTIONS, MAX_HANDSHAKING, MAX_KEY, MAX_TOTAL, MAX_VALUE, REQUEST_TIMEOUT,
};

use crate::error::{Error, Result};

/// Key (in a communicator's store) under which a rank that timed out leaves the pid of the
/// rank it waited for, as `timed_out/<its own pid>`: `ferrocomm launch` reads it to name the
/// rank that stalled.
pub const TIMED_OUT: &str = "timed_out/";

/// A key-value store shared by all ranks (torch's `Store` semantics).
pub trait Store: Send + Sync {
    /// Sets `key` to `value`, replacing any earlier value.
    fn set(&self, key: &str, value: &[u8]) -> Result<()>;
    /// The value of `key`, waiting up to `timeout` for some rank to set it.
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>>;
    /// Whether `key` is set now.
    fn check(&self, key: &str) -> Result<bool>;
    /// Adds `delta` to the integer at `key` (0 when unset) and returns the new value.
    fn add(&self, key: &str, delta: i64) -> Result<i64>;
    /// Removes `key`; whether it existed.
    fn delete(&self, key: &str) -> Result<bool>;
    /// Waits until every key is set.
    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        for k in keys {
            let left = deadline.saturating_duration_since(Instant::now());
            self.get(k, left)?;
        }
        Ok(())
    }
}

/// A store that prefixes every key, so that several communicators share one server.
pub struct PrefixStore {
    prefix: String,
    inner: Arc<dyn Store>,
}

impl PrefixStore {
    /// A store whose keys are `inner`'s keys under `prefix`.
    pub fn new(prefix: impl Into<String>, inner: Arc<dyn Store>) -> Self {
        PrefixStore {
            prefix: prefix.into(),
            inner,
        }
    }
    fn key(&self, k: &str) -> String {
        format!("{}/{}", self.prefix, k)
    }
}

impl Store for PrefixStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.inner.set(&self.key(key), value)
    }
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.inner.get(&self.key(key), timeout)
    }
    fn check(&self, key: &str) -> Result<bool> {
        self.inner.check(&self.key(key))
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.inner.add(&self.key(key), delta)
    }
    fn delete(&self, key: &str) -> Result<bool> {
        self.inner.delete(&self.key(key))
    }
}

/// An in-process store (threads as ranks, tests, single-process communicators).
#[derive(Default)]
pub struct MemStore {
    map: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
}

impl MemStore {
    /// An empty store, shared by cloning the `Arc`.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }
}

impl Store for MemStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let mut m = self
            .map
            .lock()
            .map_err(|_| Error::Store("poisoned".into()))?;
        m.insert(key.to_string(), value.to_vec());
        self.changed.notify_all();
        Ok(())
    }
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        let mut m = self
            .map
            .lock()
            .map_err(|_| Error::Store("poisoned".into()))?;
        loop {
            if let Some(v) = m.get(key) {
                return Ok(v.clone());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::StoreTimeout {
                    key: key.to_string(),
                    timeout,
                });
            }
            m = self
                .changed
                .wait_timeout(m, left)
                .map_err(|_| Error::Store("poisoned".into()))?
                .0;
        }
    }
    fn check(&self, key: &str) -> Result<bool> {
        let m = self
            .map
            .lock()
            .map_err(|_| Error::Store("poisoned".into()))?;
        Ok(m.contains_key(key))
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let mut m = self
            .map
            .lock()
            .map_err(|_| Error::Store("poisoned".into()))?;
        let cur = m
            .get(key)
            .map(|v| decode_i64(key, v))
            .transpose()?
            .unwrap_or(0);
        let new = cur
            .checked_add(delta)
            .ok_or_else(|| Error::Store(format!("add to '{key}' overflows i64")))?;
        m.insert(key.to_string(), new.to_string().into_bytes());
        self.changed.notify_all();
        Ok(new)
    }
    fn delete(&self, key: &str) -> Result<bool> {
        let mut m = self
            .map
            .lock()
            .map_err(|_| Error::Store("poisoned".into()))?;
        Ok(m.remove(key).is_some())
    }
}

/// Counters are stored as decimal text, as torch's TCPStore does, so the two interoperate.
pub fn decode_i64(key: &str, v: &[u8]) -> Result<i64> {
    std::str::from_utf8(v)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| Error::Store(format!("value of '{key}' is not an integer")))
}

/// Every rank contributes `data` under `tag`; returns all ranks' contributions in rank order.
/// A rank that has not contributed within `timeout` ends the wait with
/// [`Error::RendezvousTimeout`], naming every rank still missing then.
pub fn all_gather_bytes(
    store: &dyn Store,
    tag: &str,
    rank: usize,
    world: usize,
    data: &[u8],
    timeout: Duration,
) -> Result<Vec<Vec<u8>>> {
    if world > crate::config::MAX_WORLD_SIZE || rank >= world {
        return Err(Error::InvalidArgument(format!(
            "store gather '{tag}': rank {rank} of {world} ranks (at most {} ranks)",
            crate::config::MAX_WORLD_SIZE
        )));
    }
    store.set(&format!("{tag}/{rank}"), data)?;
    let deadline = Instant::now() + timeout;
    let mut all = Vec::with_capacity(world);
    for r in 0..world {
        let left = deadline.saturating_duration_since(Instant::now());
        match store.get(&format!("{tag}/{r}"), left) {
            Ok(v) => all.push(v),
            Err(Error::StoreTimeout { .. }) => {
                // Rank r is missing; the later ones may be too (a look each, no wait).
                let mut missing = vec![r];
                for q in r + 1..world {
                    if !store.check(&format!("{tag}/{q}"))? {
                        missing.push(q);
                    }
                }
                return Err(Error::RendezvousTimeout {
                    tag: tag.to_string(),
                    rank,
                    world,
                    missing,
                    timeout,
                });
            }
            Err(e) => return Err(e),
        }
    }
    Ok(all)
}

/// The outcome of [`agree`]: every rank's payload in rank order, or every failure as
/// `(rank, reason)`.
pub type Agreement = std::result::Result<Vec<Vec<u8>>, Vec<(usize, String)>>;

/// A joint step where each rank's part can fail on that rank alone (opening a peer's memory,
/// a kernel cache, a device check): every rank reports its outcome under `tag`, and every rank
/// gets the same answer, either every rank's payload (in rank order) or every failure as
/// `(rank, reason)`. A rank that failed still takes part, so no peer waits for it until the
/// timeout, and no rank goes on with a set-up its peers have dropped. The outer error is the
/// store's (a rank that never reported within `timeout`).
pub fn agree(
    store: &dyn Store,
    tag: &str,
    rank: usize,
    world: usize,
    local: std::result::Result<Vec<u8>, String>,
    timeout: Duration,
) -> Result<Agreement> {
    let msg = match local {
        Ok(mut p) => {
            p.insert(0, 1);
            p
        }
        Err(why) => {
            let mut m = vec![0];
            m.extend_from_slice(why.as_bytes());
            m
        }
    };
    let all = all_gather_bytes(store, tag, rank, world, &msg, timeout)?;
    let mut payloads = Vec::with_capacity(world);
    let mut failed = Vec::new();
    for (r, m) in all.into_iter().enumerate() {
        match m.split_first() {
            Some((1, p)) => payloads.push(p.to_vec()),
            Some((0, why)) => failed.push((r, String::from_utf8_lossy(why).into_owned())),
            _ => failed.push((r, format!("sent a malformed report under '{tag}'"))),
        }
    }
    Ok(if failed.is_empty() {
        Ok(payloads)
    } else {
        Err(failed)
    })
}

/// A store-based barrier: returns once all `world` ranks have arrived at `tag`.
pub fn store_barrier(store: &dyn Store, tag: &str, world: usize, timeout: Duration) -> Result<()> {
    let n = store.add(&format!("{tag}/arrived"), 1)?;
    if n as usize == world {
        store.set(&format!("{tag}/done"), b"1")?;
    }
    store.get(&format!("{tag}/done"), timeout).map(|_| ())
}

/// This machine's host name: ranks compare it through the store to prove they share one host
/// (the cuda backend's direct access, the watcher's host identity).
pub(crate) fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into the buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) };
    if rc != 0 {
        return String::from("unknown-host");
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// The integration tests' helper that tells when another thread is asleep.
#[cfg(test)]
#[path = "../../tests/thread_state/mod.rs"]
mod thread_state;

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    #[test]
    fn mem_store_waits_and_counts() {
        let s = MemStore::new();
        let s2 = s.clone();
        let (tid_tx, tid) = std::sync::mpsc::channel();
        let t = thread::spawn(move || {
            tid_tx.send(thread_state::id()).unwrap();
            s2.get("k", Duration::from_secs(60)).unwrap()
        });
        thread_state::wait_until_asleep(tid.recv().unwrap(), "the get waiting for its key");
        s.set("k", b"v").unwrap();
        assert_eq!(t.join().unwrap(), b"v");
        assert_eq!(s.add("c", 3).unwrap(), 3);
        assert_eq!(s.add("c", -1).unwrap(), 2);
        let e = s.get("absent", Duration::from_millis(10)).unwrap_err();
        assert!(e.to_string().contains("absent"));
    }

    #[test]
    fn prefixes_keep_communicators_apart() {
        let s: Arc<dyn Store> = MemStore::new();
        let a = PrefixStore::new("a", s.clone());
        let b = PrefixStore::new("b", s.clone());
        a.set("x", b"1").unwrap();
        b.set("x", b"2").unwrap();
        assert_eq!(a.get("x", Duration::ZERO).unwrap(), b"1");
        assert_eq!(b.get("x", Duration::ZERO).unwrap(), b"2");
    }

    #[test]
    fn agree_gives_every_rank_the_same_outcome() {
        let run = |fail: &'static [usize]| {
            let s = MemStore::new();
            let hs: Vec<_> = (0..3)
                .map(|r| {
                    let s = s.clone();
                    thread::spawn(move || {
                        let local = if fail.contains(&r) {
                            Err(format!("no peer access on rank {r}"))
                        } else {
                            Ok(vec![10 + r as u8; r])
                        };
                        agree(&*s, "t", r, 3, local, Duration::from_secs(5)).unwrap()
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        };
        for got in run(&[]) {
            assert_eq!(got, Ok(vec![vec![], vec![11], vec![12, 12]]));
        }
        for got in run(&[2, 0]) {
            assert_eq!(
                got,
                Err(vec![
                    (0, "no peer access on rank 0".to_string()),
                    (2, "no peer access on rank 2".to_string())
                ])
            );
        }
        // A rank that never reports: the others get the store's timeout, not a hang.
        let s = MemStore::new();
        let e = agree(&*s, "t", 0, 2, Ok(vec![]), Duration::from_millis(50)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "store: rank 0 at 't': Timed out after 50ms waiting for rank 1: 1 of 2 ranks never \
             joined (not started, crashed, or created a communicator under another name)"
        );
    }

    #[test]
    fn a_gather_timeout_names_every_rank_that_never_joined() {
        let s = MemStore::new();
        // Of 6 ranks, 0, 2 and 4 arrive; 1, 3 and 5 never do.
        for r in [2, 4] {
            s.set(&format!("g/{r}"), b"x").unwrap();
        }
        let e = all_gather_bytes(&*s, "g", 0, 6, b"x", Duration::from_millis(30)).unwrap_err();
        match &e {
            Error::RendezvousTimeout {
                tag,
                rank,
                world,
                missing,
                ..
            } => assert_eq!(
                (tag.as_str(), *rank, *world, missing.clone()),
                ("g", 0, 6, vec![1, 3, 5])
            ),
            other => panic!("{other:?}"),
        }
        assert!(
            e.to_string()
                .contains("waiting for ranks 1, 3 and 5: 3 of 6 ranks never joined"),
            "{e}"
        );
    }

    #[test]
    fn a_gather_over_more_ranks_than_accepted_is_refused_before_any_allocation() {
        let s = MemStore::new();
        for (rank, world) in [(0, 1usize << 40), (0, usize::MAX), (3, 3)] {
            let e = all_gather_bytes(&*s, "g", rank, world, b"x", Duration::from_millis(10))
                .unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        }
    }

    #[test]
    fn gather_and_barrier_across_threads() {
        let s = MemStore::new();
        let hs: Vec<_> = (0..4)
            .map(|r| {
                let s = s.clone();
                thread::spawn(move || {
                    let t = Duration::from_secs(5);
                    store_barrier(&*s, "b0", 4, t).unwrap();
                    all_gather_bytes(&*s, "g", r, 4, &[r as u8], t).unwrap()
                })
            })
            .collect();
        for h in hs {
            assert_eq!(h.join().unwrap(), vec![vec![0], vec![1], vec![2], vec![3]]);
        }
    }
}
