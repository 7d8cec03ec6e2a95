//! A TCP key-value store: one server (rank 0 or the launcher), clients everywhere else.
//!
//! Wire protocol (our own; integers little-endian, `bytes` = `len: u32` then the bytes):
//! a client opens with the 4-byte magic [`MAGIC`] and the server echoes it, so that talking to
//! some other service on the port (torchrun's agent store, say) fails at once with a clear error.
//! Then each request is one op byte and its fields, answered by one status byte and its fields:
//!
//! ```text
//! SET    key value             -> OK
//! GET    key timeout_ms: u64   -> OK value | TIMEOUT
//! CHECK  key                   -> OK u8
//! ADD    key delta: i64        -> OK i64 | ERROR msg
//! DELETE key                   -> OK u8
//! ```
//!
//! A connection serves one request at a time; a client keeps a pool of connections so that a
//! thread blocked in `get` never holds up another thread's `set`.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs,
};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::error::{Error, Result};

use super::{decode_i64, Store};

const MAGIC: [u8; 4] = *b"FCS1";

const OP_SET: u8 = 1;
const OP_GET: u8 = 2;
const OP_CHECK: u8 = 3;
const OP_ADD: u8 = 4;
const OP_DELETE: u8 = 5;

const ST_OK: u8 = 0;
const ST_TIMEOUT: u8 = 1;
const ST_ERROR: u8 = 2;

/// Largest key or value accepted, so that a corrupt length cannot make us allocate without bound.
const MAX_FIELD: usize = 1 << 30;

/// How long a request other than `get` may wait for its answer before the store is declared gone.
const REPLY_TIMEOUT: Duration = Duration::from_secs(60);

/// Extra time a client gives the server to answer a `get` beyond the `get`'s own timeout.
const GET_SLACK: Duration = Duration::from_secs(10);

fn write_bytes(buf: &mut Vec<u8>, b: &[u8]) {
    buf.extend_from_slice(&(b.len() as u32).to_le_bytes());
    buf.extend_from_slice(b);
}

fn read_array<const N: usize>(r: &mut impl Read) -> io::Result<[u8; N]> {
    let mut a = [0u8; N];
    r.read_exact(&mut a)?;
    Ok(a)
}

fn read_bytes(r: &mut impl Read) -> io::Result<Vec<u8>> {
    let n = u32::from_le_bytes(read_array(r)?) as usize;
    if n > MAX_FIELD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("field of {n} bytes exceeds the limit of {MAX_FIELD}"),
        ));
    }
    let mut v = vec![0u8; n];
    r.read_exact(&mut v)?;
    Ok(v)
}

fn read_key(r: &mut impl Read) -> io::Result<String> {
    String::from_utf8(read_bytes(r)?)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "key is not UTF-8"))
}

// ---------------------------------------------------------------------------------------------
// Server

struct ServerState {
    map: HashMap<String, Vec<u8>>,
    stopping: bool,
    /// Open connections (clones), shut down when the server stops so clients see it at once.
    conns: HashMap<u64, TcpStream>,
    next_conn: u64,
}

struct Shared {
    state: Mutex<ServerState>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, ServerState> {
        // A panicking connection thread must not take the store down with it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The store server: a map and a condition variable, one thread per client connection.
/// It stops (and every client's next or pending call fails) when dropped.
pub struct TcpStoreServer {
    shared: Arc<Shared>,
    local: SocketAddr,
    accept: Option<JoinHandle<()>>,
}

impl TcpStoreServer {
    /// Listens on `host:port`; port 0 picks a free port (see [`TcpStoreServer::port`]).
    pub fn bind(host: &str, port: u16) -> Result<Self> {
        let listener = TcpListener::bind((host, port))
            .map_err(|e| Error::io(format!("store server: cannot listen on {host}:{port}"), e))?;
        let local = listener
            .local_addr()
            .map_err(|e| Error::io("store server: local address", e))?;
        let shared = Arc::new(Shared {
            state: Mutex::new(ServerState {
                map: HashMap::new(),
                stopping: false,
                conns: HashMap::new(),
                next_conn: 0,
            }),
            changed: Condvar::new(),
        });
        let sh = shared.clone();
        let accept = thread::Builder::new()
            .name(format!("ferrocomm-store-{}", local.port()))
            .spawn(move || accept_loop(listener, sh))
            .map_err(|e| Error::io("store server: spawning the accept thread", e))?;
        Ok(TcpStoreServer {
            shared,
            local,
            accept: Some(accept),
        })
    }

    /// The port actually bound.
    pub fn port(&self) -> u16 {
        self.local.port()
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }
}

impl Drop for TcpStoreServer {
    fn drop(&mut self) {
        {
            let mut st = self.shared.lock();
            st.stopping = true;
            for c in st.conns.values() {
                let _ = c.shutdown(Shutdown::Both);
            }
            st.conns.clear();
        }
        self.shared.changed.notify_all();
        // Wake the accept thread, which is blocked in accept(), by connecting once.
        let mut wake = self.local;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake.ip() {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
            });
        }
        if TcpStream::connect_timeout(&wake, Duration::from_secs(1)).is_ok() {
            if let Some(h) = self.accept.take() {
                let _ = h.join();
            }
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for stream in listener.incoming() {
        if shared.lock().stopping {
            return;
        }
        let Ok(stream) = stream else { continue };
        let _ = stream.set_nodelay(true);
        let id = {
            let mut st = shared.lock();
            let id = st.next_conn;
            st.next_conn += 1;
            if let Ok(c) = stream.try_clone() {
                st.conns.insert(id, c);
            }
            id
        };
        let sh = shared.clone();
        let spawned = thread::Builder::new()
            .name("ferrocomm-store-conn".into())
            .spawn(move || {
                let _ = serve(stream, &sh);
                sh.lock().conns.remove(&id);
            });
        if spawned.is_err() {
            shared.lock().conns.remove(&id);
        }
    }
}

/// Serves one client until it disconnects or the server stops.
fn serve(mut s: TcpStream, sh: &Shared) -> io::Result<()> {
    if read_array::<4>(&mut s)? != MAGIC {
        return Ok(()); // not one of ours: hang up
    }
    s.write_all(&MAGIC)?;
    let mut out = Vec::new();
    loop {
        let op = match read_array::<1>(&mut s) {
            Ok([op]) => op,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        };
        let key = read_key(&mut s)?;
        out.clear();
        match op {
            OP_SET => {
                let value = read_bytes(&mut s)?;
                sh.lock().map.insert(key, value);
                sh.changed.notify_all();
                out.push(ST_OK);
            }
            OP_GET => {
                let ms = u64::from_le_bytes(read_array(&mut s)?);
                let deadline = Instant::now().checked_add(Duration::from_millis(ms));
                let mut st = sh.lock();
                loop {
                    if st.stopping {
                        return Ok(());
                    }
                    if let Some(v) = st.map.get(&key) {
                        out.push(ST_OK);
                        write_bytes(&mut out, v);
                        break;
                    }
                    let left = match deadline {
                        Some(d) => d.saturating_duration_since(Instant::now()),
                        None => Duration::from_secs(3600),
                    };
                    if left.is_zero() {
                        out.push(ST_TIMEOUT);
                        break;
                    }
                    st = sh
                        .changed
                        .wait_timeout(st, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
            OP_CHECK => {
                let has = sh.lock().map.contains_key(&key);
                out.extend_from_slice(&[ST_OK, has as u8]);
            }
            OP_ADD => {
                let delta = i64::from_le_bytes(read_array(&mut s)?);
                let mut st = sh.lock();
                let cur = st.map.get(&key).map(|v| decode_i64(&key, v)).transpose();
                match cur.map(|c| c.unwrap_or(0).checked_add(delta)) {
                    Ok(Some(new)) => {
                        st.map.insert(key, new.to_string().into_bytes());
                        drop(st);
                        sh.changed.notify_all();
                        out.push(ST_OK);
                        out.extend_from_slice(&new.to_le_bytes());
                    }
                    Ok(None) => {
                        out.push(ST_ERROR);
                        write_bytes(&mut out, format!("add to '{key}' overflows i64").as_bytes());
                    }
                    Err(e) => {
                        out.push(ST_ERROR);
                        write_bytes(&mut out, e.to_string().as_bytes());
                    }
                }
            }
            OP_DELETE => {
                let had = sh.lock().map.remove(&key).is_some();
                out.extend_from_slice(&[ST_OK, had as u8]);
            }
            _ => return Ok(()), // protocol violation: hang up
        }
        s.write_all(&out)?;
    }
}

// ---------------------------------------------------------------------------------------------
// Client

/// A client of a [`TcpStoreServer`].
pub struct TcpStore {
    /// `host:port` as given, for messages.
    name: String,
    addrs: Vec<SocketAddr>,
    idle: Mutex<Vec<TcpStream>>,
}

impl TcpStore {
    /// Connects to the server at `host:port`, retrying until `timeout` has passed (the server
    /// may start after its clients).
    pub fn connect(host: &str, port: u16, timeout: Duration) -> Result<Self> {
        let name = format!("{host}:{port}");
        let start = Instant::now();
        let deadline = start.checked_add(timeout);
        let mut pause = Duration::from_millis(20);
        let mut last_err;
        loop {
            match (host, port).to_socket_addrs() {
                Ok(addrs) => {
                    let addrs: Vec<SocketAddr> = addrs.collect();
                    match open(&name, &addrs, Duration::from_secs(2)) {
                        Ok(s) => {
                            return Ok(TcpStore {
                                name,
                                addrs,
                                idle: Mutex::new(vec![s]),
                            })
                        }
                        Err(Attempt::Fatal(e)) => return Err(e),
                        Err(Attempt::Retry(e)) => last_err = e.to_string(),
                    }
                }
                Err(e) => last_err = format!("cannot resolve {host}: {e}"),
            }
            let left = deadline.map_or(pause, |d| d.saturating_duration_since(Instant::now()));
            if left.is_zero() {
                return Err(Error::Store(format!(
                    "could not connect to the store at {name} within {:.1?} ({last_err}); \
                     is the server (rank 0 or the launcher) running and reachable?",
                    start.elapsed()
                )));
            }
            thread::sleep(pause.min(left));
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// The address this client talks to, as `host:port`.
    pub fn addr(&self) -> &str {
        &self.name
    }

    fn gone(&self, e: &io::Error) -> Error {
        Error::Store(format!(
            "the store at {} went away (its server, rank 0 or the launcher, exited or \
             closed the connection): {e}",
            self.name
        ))
    }

    /// Sends `req` and hands the connection to `reply` to read the answer.
    fn call<T>(
        &self,
        req: &[u8],
        wait: Duration,
        reply: impl FnOnce(&mut TcpStream) -> io::Result<T>,
    ) -> Result<T> {
        let pooled = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut s = match pooled {
            Some(s) => s,
            // One attempt only: the server was up once, so a refusal now means it is gone.
            None => open(&self.name, &self.addrs, Duration::from_secs(5)).map_err(|a| match a {
                Attempt::Fatal(e) => e,
                Attempt::Retry(e) => self.gone(&e),
            })?,
        };
        let r = s
            .set_read_timeout(Some(wait))
            .and_then(|_| s.write_all(req))
            .and_then(|_| reply(&mut s));
        match r {
            Ok(v) => {
                self.idle.lock().unwrap_or_else(|p| p.into_inner()).push(s);
                Ok(v)
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Err(Error::Store(format!(
                    "the store at {} did not answer within {wait:.1?}",
                    self.name
                )))
            }
            Err(e) => Err(self.gone(&e)),
        }
    }

    fn request(op: u8, key: &str) -> Vec<u8> {
        let mut req = vec![op];
        write_bytes(&mut req, key.as_bytes());
        req
    }
}

enum Attempt {
    Retry(io::Error),
    Fatal(Error),
}

/// Opens one connection and checks the server speaks our protocol.
fn open(name: &str, addrs: &[SocketAddr], connect_timeout: Duration) -> Result<TcpStream, Attempt> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no addresses");
    for a in addrs {
        match TcpStream::connect_timeout(a, connect_timeout) {
            Ok(mut s) => {
                let _ = s.set_nodelay(true);
                let hello = s
                    .set_read_timeout(Some(Duration::from_secs(10)))
                    .and_then(|_| s.write_all(&MAGIC))
                    .and_then(|_| read_array::<4>(&mut s));
                return match hello {
                    Ok(m) if m == MAGIC => Ok(s),
                    Ok(_) | Err(_) => Err(Attempt::Fatal(Error::Store(format!(
                        "{name} accepted a connection but is not a ferrocomm store (another \
                         service on that port? under torchrun the store uses MASTER_PORT+1)"
                    )))),
                };
            }
            Err(e) => last = e,
        }
    }
    Err(Attempt::Retry(last))
}

impl Store for TcpStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let mut req = Self::request(OP_SET, key);
        write_bytes(&mut req, value);
        self.call(&req, REPLY_TIMEOUT, |s| read_array::<1>(s).map(|_| ()))
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let mut req = Self::request(OP_GET, key);
        let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        req.extend_from_slice(&ms.to_le_bytes());
        let found = self.call(
            &req,
            timeout.saturating_add(GET_SLACK),
            |s| match read_array::<1>(s)?[0] {
                ST_OK => read_bytes(s).map(Some),
                _ => Ok(None),
            },
        )?;
        found.ok_or_else(|| Error::StoreTimeout {
            key: key.to_string(),
            timeout,
        })
    }

    fn check(&self, key: &str) -> Result<bool> {
        let req = Self::request(OP_CHECK, key);
        self.call(&req, REPLY_TIMEOUT, |s| Ok(read_array::<2>(s)?[1] != 0))
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let mut req = Self::request(OP_ADD, key);
        req.extend_from_slice(&delta.to_le_bytes());
        let r = self.call(&req, REPLY_TIMEOUT, |s| match read_array::<1>(s)?[0] {
            ST_OK => Ok(Ok(i64::from_le_bytes(read_array(s)?))),
            _ => Ok(Err(String::from_utf8_lossy(&read_bytes(s)?).into_owned())),
        })?;
        r.map_err(Error::Store)
    }

    fn delete(&self, key: &str) -> Result<bool> {
        let req = Self::request(OP_DELETE, key);
        self.call(&req, REPLY_TIMEOUT, |s| Ok(read_array::<2>(s)?[1] != 0))
    }
}

// ---------------------------------------------------------------------------------------------
// From the launch environment

/// Servers started by [`connect_from_env`], one per (host, port), alive for the process, so that
/// several communicators created in one process share one server.
static SERVERS: OnceLock<Mutex<HashMap<(String, u16), TcpStoreServer>>> = OnceLock::new();

/// Starts the process's server for `host:port` unless it already runs; returns its port.
fn ensure_server(host: &str, port: u16) -> Result<u16> {
    let mut servers = SERVERS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(s) = servers.get(&(host.to_string(), port)) {
        return Ok(s.port());
    }
    // Listen on loopback only when the ranks meet on loopback; otherwise on every interface,
    // since `host` names this machine as the others see it.
    let loopback = host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    let server = TcpStoreServer::bind(if loopback { host } else { "0.0.0.0" }, port)?;
    let bound = server.port();
    servers.insert((host.to_string(), port), server);
    Ok(bound)
}

/// Connects to (or on rank 0, starts) the store named by the launch environment.
///
/// Address: `FERROCOMM_STORE_ADDR`, else `MASTER_ADDR`, else 127.0.0.1. Port:
/// `FERROCOMM_STORE_PORT`, else `MASTER_PORT + 1` under torchrun (whose agent already listens on
/// `MASTER_PORT`), else `MASTER_PORT`. Rank 0 hosts the server unless `FERROCOMM_STORE_EXTERNAL`
/// says the launcher does; every rank, rank 0 too, is a client.
pub fn connect_from_env(cfg: &Config, rank: usize, world: usize) -> Result<Arc<dyn Store>> {
    let l = &cfg.launch;
    let host = l
        .store_addr
        .clone()
        .or_else(|| l.master_addr.clone())
        .unwrap_or_else(|| "127.0.0.1".to_string());
    let mut port = match (l.store_port, l.master_port) {
        (Some(p), _) => p,
        (None, Some(p)) if l.under_torchelastic => p.checked_add(1).ok_or(Error::BadEnv {
            var: "MASTER_PORT",
            value: p.to_string(),
            why: "under torchrun the store uses MASTER_PORT+1, which must be a valid port".into(),
        })?,
        (None, Some(p)) => p,
        (None, None) => {
            return Err(Error::MissingEnv {
                var: "MASTER_PORT",
                why: format!(
                    "rank {rank} of {world} needs the bootstrap store's port \
                     (set MASTER_PORT or FERROCOMM_STORE_PORT, or start with torchrun or \
                     ferrocomm launch)"
                ),
            })
        }
    };
    if rank == 0 && !l.store_external {
        port = ensure_server(&host, port)?;
    }
    Ok(Arc::new(TcpStore::connect(&host, port, cfg.timeout)?))
}
