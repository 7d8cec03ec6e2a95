//! A TCP key-value store: one server (rank 0 or the launcher), clients everywhere else.
//!
//! Wire protocol (our own; integers little-endian, `bytes` = `len: u32` then the bytes).
//! A connection opens with a handshake in which each side proves it holds the job's
//! [`StoreKey`] (HMAC-SHA-256 over both sides' fresh nonces, see `auth.rs`); talking to some
//! other service on the port (torchrun's agent store, say) fails at once with a clear error:
//!
//! ```text
//! client: MAGIC nonce_c[32]
//! server: MAGIC nonce_s[32] tag("server", nonce_c, nonce_s)
//! client: tag("client", nonce_s, nonce_c)
//! server: OK | ERROR msg (and hangs up)
//! ```
//!
//! Then each request is one op byte and its fields, answered by one status byte and its fields:
//!
//! ```text
//! SET    key value             -> OK | ERROR msg
//! GET    key timeout_ms: u64   -> OK value | TIMEOUT
//! CHECK  key                   -> OK u8
//! ADD    key delta: i64        -> OK i64 | ERROR msg
//! DELETE key                   -> OK u8
//! ```
//!
//! A connection serves one request at a time; a client keeps a pool of connections so that a
//! thread blocked in `get` never holds up another thread's `set`.
//!
//! The server bounds what anyone reaching its port can take: [`MAX_HANDSHAKING`] connections
//! still in their handshake (each given [`HANDSHAKE_TIMEOUT`]), [`MAX_CONNECTIONS`] in all,
//! keys of [`MAX_KEY`] bytes, values of [`MAX_VALUE`], [`MAX_TOTAL`] bytes stored, a request
//! begun must arrive within [`REQUEST_TIMEOUT`], and failing `accept`s (out of descriptors) back
//! off instead of spinning.

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

use super::auth::{NONCE, TAG};
use super::{decode_i64, Store, StoreKey};

const MAGIC: [u8; 4] = *b"FCS2";

const OP_SET: u8 = 1;
const OP_GET: u8 = 2;
const OP_CHECK: u8 = 3;
const OP_ADD: u8 = 4;
const OP_DELETE: u8 = 5;

const ST_OK: u8 = 0;
const ST_TIMEOUT: u8 = 1;
const ST_ERROR: u8 = 2;

/// Largest key accepted, in bytes.
pub const MAX_KEY: usize = 4 << 10;
/// Largest value accepted, in bytes: ferrocomm stores names, handles and short reports of a
/// few hundred bytes per rank.
pub const MAX_VALUE: usize = 256 << 10;
/// Most bytes (keys and values) one server holds.
pub const MAX_TOTAL: usize = 64 << 20;
/// Most connections one server serves at once.
pub const MAX_CONNECTIONS: usize = 1024;
/// Most connections still in their handshake at once; more are closed at once.
pub const MAX_HANDSHAKING: usize = 64;
/// How long a new connection has to complete its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the rest of a request may take to arrive once its first byte has.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

const LABEL_SERVER: &[u8] = b"ferrocomm store server\0";
const LABEL_CLIENT: &[u8] = b"ferrocomm store client\0";

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

/// A length-prefixed field of at most `max` bytes (`what` names it in the error).
fn read_bytes(r: &mut impl Read, what: &str, max: usize) -> io::Result<Vec<u8>> {
    let n = u32::from_le_bytes(read_array(r)?) as usize;
    if n > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a {what} of {n} bytes exceeds the limit of {max}"),
        ));
    }
    let mut v = vec![0u8; n];
    r.read_exact(&mut v)?;
    Ok(v)
}

fn read_key(r: &mut impl Read) -> io::Result<String> {
    String::from_utf8(read_bytes(r, "key", MAX_KEY)?)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "key is not UTF-8"))
}

// ---------------------------------------------------------------------------------------------
// Server

struct ServerState {
    map: HashMap<String, Vec<u8>>,
    /// Bytes of every key and value in `map`.
    stored: usize,
    /// Connections in their handshake.
    handshaking: usize,
    stopping: bool,
    /// Open connections (clones), shut down when the server stops so clients see it at once.
    conns: HashMap<u64, TcpStream>,
    next_conn: u64,
}

struct Shared {
    state: Mutex<ServerState>,
    changed: Condvar,
    key: StoreKey,
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
    /// Listens on `host:port`; port 0 picks a free port (see [`TcpStoreServer::port`]). Only
    /// clients holding `key` are served.
    pub fn bind(host: &str, port: u16, key: &StoreKey) -> Result<Self> {
        let listener = TcpListener::bind((host, port))
            .map_err(|e| Error::io(format!("store server: cannot listen on {host}:{port}"), e))?;
        let local = listener
            .local_addr()
            .map_err(|e| Error::io("store server: local address", e))?;
        let shared = Arc::new(Shared {
            state: Mutex::new(ServerState {
                map: HashMap::new(),
                stored: 0,
                handshaking: 0,
                stopping: false,
                conns: HashMap::new(),
                next_conn: 0,
            }),
            changed: Condvar::new(),
            key: key.clone(),
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

    /// The entries whose key contains `part` (read in process, by the launcher hosting it).
    pub fn entries_containing(&self, part: &str) -> Vec<(String, Vec<u8>)> {
        let st = self.shared.lock();
        let mut v: Vec<_> = st
            .map
            .iter()
            .filter(|(k, _)| k.contains(part))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        v.sort();
        v
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
    let mut pause = Duration::from_millis(10);
    for stream in listener.incoming() {
        if shared.lock().stopping {
            return;
        }
        let stream = match stream {
            Ok(s) => {
                pause = Duration::from_millis(10);
                s
            }
            Err(_) => {
                // Out of descriptors (EMFILE) or memory: wait for connections to close instead
                // of spinning on the error.
                thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let id = {
            let mut st = shared.lock();
            if st.handshaking >= MAX_HANDSHAKING || st.conns.len() >= MAX_CONNECTIONS {
                // Closed unanswered: the client reports that the store gave no handshake reply.
                continue;
            }
            st.handshaking += 1;
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
            let mut st = shared.lock();
            st.conns.remove(&id);
            st.handshaking -= 1;
        }
    }
}

/// The server's side of the handshake: whether the client proved it holds the key.
fn greet(s: &mut TcpStream, key: &StoreKey) -> io::Result<bool> {
    s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    let hello = read_array::<{ 4 + NONCE }>(s)?;
    if hello[..4] != MAGIC {
        return Ok(false); // not one of ours: hang up
    }
    let theirs = &hello[4..];
    let mine = rand::random::<[u8; NONCE]>();
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&mine);
    out.extend_from_slice(&key.tag(LABEL_SERVER, theirs, &mine));
    s.write_all(&out)?;
    let tag = read_array::<TAG>(s)?;
    if !key.verify(LABEL_CLIENT, &mine, theirs, &tag) {
        let mut out = vec![ST_ERROR];
        write_bytes(&mut out, b"wrong store secret");
        s.write_all(&out)?;
        return Ok(false);
    }
    s.write_all(&[ST_OK])?;
    s.set_read_timeout(None)?;
    Ok(true)
}

/// Serves one client until it disconnects or the server stops.
fn serve(mut s: TcpStream, sh: &Shared) -> io::Result<()> {
    let greeted = greet(&mut s, &sh.key);
    sh.lock().handshaking -= 1;
    if !greeted? {
        return Ok(());
    }
    let mut out = Vec::new();
    loop {
        // An idle connection waits for its next request as long as it likes; once a request
        // has begun, the rest must follow promptly.
        let op = match read_array::<1>(&mut s) {
            Ok([op]) => op,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        };
        s.set_read_timeout(Some(REQUEST_TIMEOUT))?;
        let key = read_key(&mut s)?;
        out.clear();
        match op {
            OP_SET => {
                let value = match read_bytes(&mut s, "value", MAX_VALUE) {
                    Ok(v) => v,
                    Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                        // Answered, then hung up: the rest of the value is not read.
                        out.push(ST_ERROR);
                        write_bytes(&mut out, format!("set '{key}': {e}").as_bytes());
                        s.write_all(&out)?;
                        return Ok(());
                    }
                    Err(e) => return Err(e),
                };
                let mut st = sh.lock();
                let old = st.map.get(&key).map_or(0, |v| key.len() + v.len());
                let total = st.stored - old + key.len() + value.len();
                if total > MAX_TOTAL {
                    drop(st);
                    out.push(ST_ERROR);
                    write_bytes(
                        &mut out,
                        format!(
                            "set '{key}': the store holds {MAX_TOTAL} bytes at most, and this \
                             value of {} bytes would pass it",
                            value.len()
                        )
                        .as_bytes(),
                    );
                } else {
                    st.stored = total;
                    st.map.insert(key, value);
                    drop(st);
                    sh.changed.notify_all();
                    out.push(ST_OK);
                }
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
                    Ok(Some(_)) if st.stored + key.len() + 20 > MAX_TOTAL => {
                        out.push(ST_ERROR);
                        write_bytes(
                            &mut out,
                            format!("add to '{key}': the store is full ({MAX_TOTAL} bytes)")
                                .as_bytes(),
                        );
                    }
                    Ok(Some(new)) => {
                        let text = new.to_string().into_bytes();
                        let old = st.map.get(&key).map_or(0, |v| key.len() + v.len());
                        st.stored = st.stored - old + key.len() + text.len();
                        st.map.insert(key, text);
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
                let mut st = sh.lock();
                let had = match st.map.remove(&key) {
                    Some(v) => {
                        st.stored -= key.len() + v.len();
                        true
                    }
                    None => false,
                };
                out.extend_from_slice(&[ST_OK, had as u8]);
            }
            _ => return Ok(()), // protocol violation: hang up
        }
        s.set_read_timeout(None)?;
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
    key: StoreKey,
    idle: Mutex<Vec<TcpStream>>,
}

impl TcpStore {
    /// Connects to the server at `host:port` holding `key`, retrying until `timeout` has passed
    /// (the server may start after its clients).
    pub fn connect(host: &str, port: u16, key: &StoreKey, timeout: Duration) -> Result<Self> {
        let name = format!("{host}:{port}");
        let start = Instant::now();
        let deadline = start.checked_add(timeout);
        let mut pause = Duration::from_millis(20);
        let mut last_err;
        loop {
            match (host, port).to_socket_addrs() {
                Ok(addrs) => {
                    let addrs: Vec<SocketAddr> = addrs.collect();
                    match open(&name, &addrs, key, Duration::from_secs(2)) {
                        Ok(s) => {
                            return Ok(TcpStore {
                                name,
                                addrs,
                                key: key.clone(),
                                idle: Mutex::new(vec![s]),
                            })
                        }
                        Err(Attempt::Fatal(e)) => return Err(e),
                        Err(Attempt::Retry(e)) => last_err = e,
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
        let mut s =
            match pooled {
                Some(s) => s,
                // One attempt only: the server was up once, so a refusal now means it is gone.
                None => open(&self.name, &self.addrs, &self.key, Duration::from_secs(5)).map_err(
                    |a| match a {
                        Attempt::Fatal(e) => e,
                        Attempt::Retry(e) => self.gone(&io::Error::other(e)),
                    },
                )?,
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

    fn request(op: u8, key: &str) -> Result<Vec<u8>> {
        if key.len() > MAX_KEY {
            return Err(Error::InvalidArgument(format!(
                "store: a key of {} bytes is longer than the store's limit of {MAX_KEY}",
                key.len()
            )));
        }
        let mut req = vec![op];
        write_bytes(&mut req, key.as_bytes());
        Ok(req)
    }
}

/// Reads an `OK` or an `ERROR msg` answer.
fn read_status(s: &mut TcpStream) -> io::Result<std::result::Result<(), String>> {
    Ok(match read_array::<1>(s)?[0] {
        ST_OK => Ok(()),
        _ => Err(String::from_utf8_lossy(&read_bytes(s, "message", MAX_VALUE)?).into_owned()),
    })
}

enum Attempt {
    /// Worth another try (nobody listening yet, or the server too busy to answer): why not.
    Retry(String),
    Fatal(Error),
}

/// Opens one connection and runs the client's side of the handshake.
fn open(
    name: &str,
    addrs: &[SocketAddr],
    key: &StoreKey,
    connect_timeout: Duration,
) -> Result<TcpStream, Attempt> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no addresses");
    for a in addrs {
        match TcpStream::connect_timeout(a, connect_timeout) {
            Ok(mut s) => {
                let _ = s.set_nodelay(true);
                return handshake(name, &mut s, key).map(|_| s);
            }
            Err(e) => last = e,
        }
    }
    Err(Attempt::Retry(last.to_string()))
}

fn handshake(name: &str, s: &mut TcpStream, key: &StoreKey) -> Result<(), Attempt> {
    let mine = rand::random::<[u8; NONCE]>();
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(&mine);
    let magic = s
        .set_read_timeout(Some(Duration::from_secs(10)))
        .and_then(|_| s.write_all(&hello))
        .and_then(|_| read_array::<4>(s));
    let no_reply = |e: io::Error| {
        // Closed or silent: a server at its connection limit closes new connections unanswered.
        Attempt::Retry(format!(
            "{name} accepted the connection but gave no handshake reply ({e}); the server may \
             be overwhelmed by connections"
        ))
    };
    if magic.map_err(no_reply)? != MAGIC {
        return Err(Attempt::Fatal(Error::Store(format!(
            "{name} accepted a connection but is not a ferrocomm store (another service on \
             that port? under torchrun the store uses MASTER_PORT+1)"
        ))));
    }
    let reply = read_array::<{ NONCE + TAG }>(s).map_err(no_reply)?;
    let (theirs, tag) = reply.split_at(NONCE);
    let refused = |why: &str| {
        Attempt::Fatal(Error::Store(format!(
            "the store at {name} {why} (another job's store, or FERROCOMM_STORE_SECRET differs \
             between the processes of this job; see docs/security.md)"
        )))
    };
    if !key.verify(LABEL_SERVER, &mine, theirs, tag) {
        return Err(refused("does not hold this job's secret"));
    }
    let proof = key.tag(LABEL_CLIENT, theirs, &mine);
    match s.write_all(&proof).and_then(|_| read_status(s)) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(refused("refused this process's secret")),
        Err(e) => Err(Attempt::Retry(format!(
            "{name} closed the connection during the handshake ({e})"
        ))),
    }
}

impl Store for TcpStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        if value.len() > MAX_VALUE {
            return Err(Error::InvalidArgument(format!(
                "store: the value of '{key}' has {} bytes, more than the store's limit of \
                 {MAX_VALUE}",
                value.len()
            )));
        }
        let mut req = Self::request(OP_SET, key)?;
        write_bytes(&mut req, value);
        self.call(&req, REPLY_TIMEOUT, read_status)?
            .map_err(|e| Error::Store(format!("the store at {} refused: {e}", self.name)))
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let mut req = Self::request(OP_GET, key)?;
        let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        req.extend_from_slice(&ms.to_le_bytes());
        let found = self.call(
            &req,
            timeout.saturating_add(GET_SLACK),
            |s| match read_array::<1>(s)?[0] {
                ST_OK => read_bytes(s, "value", MAX_VALUE).map(Some),
                _ => Ok(None),
            },
        )?;
        found.ok_or_else(|| Error::StoreTimeout {
            key: key.to_string(),
            timeout,
        })
    }

    fn check(&self, key: &str) -> Result<bool> {
        let req = Self::request(OP_CHECK, key)?;
        self.call(&req, REPLY_TIMEOUT, |s| Ok(read_array::<2>(s)?[1] != 0))
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let mut req = Self::request(OP_ADD, key)?;
        req.extend_from_slice(&delta.to_le_bytes());
        let r = self.call(&req, REPLY_TIMEOUT, |s| match read_array::<1>(s)?[0] {
            ST_OK => Ok(Ok(i64::from_le_bytes(read_array(s)?))),
            _ => Ok(Err(String::from_utf8_lossy(&read_bytes(
                s, "message", MAX_VALUE,
            )?)
            .into_owned())),
        })?;
        r.map_err(Error::Store)
    }

    fn delete(&self, key: &str) -> Result<bool> {
        let req = Self::request(OP_DELETE, key)?;
        self.call(&req, REPLY_TIMEOUT, |s| Ok(read_array::<2>(s)?[1] != 0))
    }
}

// ---------------------------------------------------------------------------------------------
// From the launch environment

/// Servers started by [`connect_from_env`], one per (host, port), alive for the process, so that
/// several communicators created in one process share one server.
static SERVERS: OnceLock<Mutex<HashMap<(String, u16), TcpStoreServer>>> = OnceLock::new();

/// Starts the process's server for `host:port` unless it already runs; returns its port.
fn ensure_server(host: &str, port: u16, key: &StoreKey) -> Result<u16> {
    let mut servers = SERVERS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(s) = servers.get(&(host.to_string(), port)) {
        return Ok(s.port());
    }
    // Listen on the interface the ranks were told to meet at (`host` names this machine as
    // the others see it): loopback stays loopback, an address is that interface alone.
    let server = TcpStoreServer::bind(host, port, key)?;
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
    let key = StoreKey::from_config(cfg)?;
    if rank == 0 && !l.store_external {
        port = ensure_server(&host, port, &key)?;
    }
    Ok(Arc::new(TcpStore::connect(&host, port, &key, cfg.timeout)?))
}
