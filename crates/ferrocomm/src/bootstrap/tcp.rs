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
//! or, when the server has had no handshake slot free for a while (see below), only
//!
//! ```text
//! server: BUSY (and hangs up)
//! ```
//!
//! which the client takes as "try again" until its own deadline.
//!
//! Everything after it travels in sealed frames (`channel.rs`: ChaCha20-Poly1305 under keys of
//! this connection alone, derived from the job's key and both nonces, a frame counter per
//! direction as the nonce), so that whoever relays the connection reads nothing and can change,
//! replay or add nothing. Each request is one frame, an op byte and its fields, answered by one
//! frame, a status byte and its fields:
//!
//! ```text
//! SET    key value             -> OK | ERROR msg
//! GET    key timeout_ms: u64   -> OK value | TIMEOUT | ERROR msg
//! CHECK  key                   -> OK u8 | ERROR msg
//! ADD    key delta: i64        -> OK i64 | ERROR msg
//! DELETE key                   -> OK u8 | ERROR msg
//! (a frame that does not open) -> FORGED msg (and hangs up)
//! ```
//!
//! A connection serves one request at a time; a client keeps a pool of connections so that a
//! thread blocked in `get` never holds up another thread's `set`.
//!
//! The server bounds what anyone reaching its port can take ([`ServerLimits`]): connections
//! still in their handshake, each with a deadline for the whole handshake; connections in all;
//! keys of [`MAX_KEY`] bytes, values of [`MAX_VALUE`]; the memory its entries take, each
//! charged [`ENTRY_OVERHEAD`] beyond its key and value; a deadline for the rest of a request
//! once its first byte has arrived; and failing `accept`s (out of descriptors) back off
//! instead of spinning.
//!
//! A connection that arrives while every handshake slot (or connection) is taken is never
//! closed unanswered: it waits for a slot, holding nothing of the server's but its socket
//! (later ones wait in the kernel's listen queue, since the accepting thread waits with it).
//! Legitimate handshakes take milliseconds, so a burst of clients, or clients slowed by a loaded
//! machine, get their slots in turn. Only when no slot has been given back for
//! [`ServerLimits::slot_wait`] (every slot held by connections that are not finishing: a
//! stranger holding them) are new connections answered BUSY at once, and clients try again.

use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::error::{Error, Result};

use super::auth::{NONCE, TAG};
use super::channel::{read_by, write_by, Direction, FrameError};
use super::{decode_i64, Store, StoreKey};

/// Opens every connection; a new value for every change of the protocol, so that processes of
/// another version are told at once instead of misreading each other.
const MAGIC: [u8; 4] = *b"FCS3";
/// The server's whole answer to a hello when it has had no handshake slot free for
/// [`ServerLimits::slot_wait`]: come back later. (A client that predates it takes it for a
/// store of another version, which is what it is talking to.)
const BUSY: [u8; 4] = *b"FCSW";

const OP_SET: u8 = 1;
const OP_GET: u8 = 2;
const OP_CHECK: u8 = 3;
const OP_ADD: u8 = 4;
const OP_DELETE: u8 = 5;

const ST_OK: u8 = 0;
const ST_TIMEOUT: u8 = 1;
const ST_ERROR: u8 = 2;
/// A request frame did not open at the server: something on the way altered or forged it.
const ST_FORGED: u8 = 3;

/// Largest key accepted, in bytes.
pub const MAX_KEY: usize = 4 << 10;
/// Largest value accepted, in bytes: ferrocomm stores names, handles and short reports of a
/// few hundred bytes per rank.
pub const MAX_VALUE: usize = 256 << 10;
/// Most memory one server's entries may take by default: their keys and values, and
/// [`ENTRY_OVERHEAD`] for each.
pub const MAX_TOTAL: usize = 64 << 20;
/// What one entry costs beyond its key and value bytes, charged against the server's total:
/// the map's slot (a `String` and a `Vec`, 48 bytes, with its control byte and the table's
/// spare capacity) and the allocator's headers and rounding of the two heap blocks. Without
/// it, millions of tiny entries would take many times the memory the total allows.
pub const ENTRY_OVERHEAD: usize = 128;
/// Most connections one server serves at once by default.
pub const MAX_CONNECTIONS: usize = 1024;
/// Most connections in their handshake at once by default; more wait for a slot.
pub const MAX_HANDSHAKING: usize = 64;
/// How long, by default, a new connection waits for a handshake slot (or room among the
/// connections) when none has been given back meanwhile, before it is answered BUSY: far
/// longer than legitimate handshakes hold their slots (milliseconds), far shorter than
/// [`HANDSHAKE_TIMEOUT`], after which slots held by a stranger come back.
pub const SLOT_WAIT: Duration = Duration::from_secs(1);
/// How long a new connection has for its whole handshake by default, from when the server
/// starts reading it, however its bytes are spaced.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a request (or the server's answer to it) may take to cross once its first byte
/// has, by default.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest request frame: an op, a key, a value (or a timeout or a delta).
const MAX_REQUEST: usize = 1 + 4 + MAX_KEY + 4 + MAX_VALUE;
/// Largest answer frame: a status and a value, or a message that may quote a key.
const MAX_REPLY: usize = 1 + 4 + MAX_VALUE + MAX_KEY;

/// What one store server lets its clients take. [`Default`] holds the values of the
/// constants above, which every server of ferrocomm uses; tests shorten them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerLimits {
    /// The whole handshake of a new connection, from when its slot was given to it.
    pub handshake: Duration,
    /// The rest of a request once its first byte has arrived, and the writing of its answer.
    pub request: Duration,
    /// Connections in their handshake at once; more wait for a slot.
    pub max_handshaking: usize,
    /// Connections at once; more wait for one to close.
    pub max_connections: usize,
    /// How long a new connection waits for a slot (or room) while none is given back, before
    /// it is answered BUSY and closed.
    pub slot_wait: Duration,
    /// Bytes of keys and values plus [`ENTRY_OVERHEAD`] per entry.
    pub max_stored: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            handshake: HANDSHAKE_TIMEOUT,
            request: REQUEST_TIMEOUT,
            max_handshaking: MAX_HANDSHAKING,
            max_connections: MAX_CONNECTIONS,
            slot_wait: SLOT_WAIT,
            max_stored: MAX_TOTAL,
        }
    }
}

const LABEL_SERVER: &[u8] = b"ferrocomm store server\0";
const LABEL_CLIENT: &[u8] = b"ferrocomm store client\0";

/// How long a request other than `get` may wait for its answer before the store is declared gone.
const REPLY_TIMEOUT: Duration = Duration::from_secs(60);

/// Extra time a client gives the server to answer a `get` beyond the `get`'s own timeout.
const GET_SLACK: Duration = Duration::from_secs(10);

/// How long a client gives the server for the whole handshake.
const CLIENT_HANDSHAKE: Duration = Duration::from_secs(10);

fn write_bytes(buf: &mut Vec<u8>, b: &[u8]) {
    buf.extend_from_slice(&(b.len() as u32).to_le_bytes());
    buf.extend_from_slice(b);
}

/// The fields of a decrypted frame, read front to back.
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        if n > self.0.len() {
            return Err("a message shorter than its fields".into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> std::result::Result<[u8; N], String> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    /// A length-prefixed field of at most `max` bytes (`what` names it in the error).
    fn bytes(&mut self, what: &str, max: usize) -> std::result::Result<&'a [u8], String> {
        let n = u32::from_le_bytes(self.array()?) as usize;
        if n > max {
            return Err(format!("a {what} of {n} bytes exceeds the limit of {max}"));
        }
        self.take(n)
    }

    fn key(&mut self) -> std::result::Result<String, String> {
        std::str::from_utf8(self.bytes("key", MAX_KEY)?)
            .map(str::to_string)
            .map_err(|_| "key is not UTF-8".to_string())
    }

    fn message(&mut self) -> String {
        self.bytes("message", MAX_REPLY)
            .map(|m| String::from_utf8_lossy(m).into_owned())
            .unwrap_or_else(|e| e)
    }
}

// ---------------------------------------------------------------------------------------------
// Server

struct ServerState {
    map: HashMap<String, Vec<u8>>,
    /// What `map` costs: every key and value, and [`ENTRY_OVERHEAD`] per entry.
    stored: usize,
    /// Connections in their handshake.
    handshaking: usize,
    /// Since when every handshake slot (or connection) has been taken with none given back:
    /// new connections wait for one until [`ServerLimits::slot_wait`] after it.
    full_since: Option<Instant>,
    stopping: bool,
    /// Open connections (clones), shut down when the server stops so clients see it at once.
    conns: HashMap<u64, TcpStream>,
    next_conn: u64,
}

impl ServerState {
    /// What the map would cost with the value of `key` replaced by (or set to) `len` bytes.
    fn cost_with(&self, key: &str, len: usize) -> usize {
        let old = self
            .map
            .get(key)
            .map_or(0, |v| entry_cost(key.len(), v.len()));
        self.stored - old + entry_cost(key.len(), len)
    }
}

struct Shared {
    state: Mutex<ServerState>,
    /// Entries changed (what a `get` waits for).
    changed: Condvar,
    /// A handshake slot or a connection was given back (what a waiting new connection waits
    /// for), or the server is stopping.
    room: Condvar,
    key: StoreKey,
    limits: ServerLimits,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, ServerState> {
        // A panicking connection thread must not take the store down with it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Tells connections waiting for a slot that one came back (`st` is the locked state).
    fn room_freed(&self, st: &mut ServerState) {
        st.full_since = None;
        self.room.notify_all();
    }
}

/// What an entry of `key_len` and `value_len` bytes is charged.
fn entry_cost(key_len: usize, value_len: usize) -> usize {
    key_len + value_len + ENTRY_OVERHEAD
}

/// The store server: a map and a condition variable, one accept thread per address it listens
/// on and one thread per client connection. It stops (and every client's next or pending call
/// fails) when dropped.
pub struct TcpStoreServer {
    shared: Arc<Shared>,
    /// Every address listened on (one port), with its accept thread.
    listeners: Vec<(SocketAddr, Option<JoinHandle<()>>)>,
}

impl TcpStoreServer {
    /// Listens on every address `host` resolves to, on `port` (0 picks a free port, the same
    /// on every address; see [`TcpStoreServer::port`]), with the default [`ServerLimits`].
    /// Only clients holding `key` are served.
    ///
    /// A client tries each address `host` resolves to, so the server listens on all of them or
    /// fails: an address another process holds (someone waiting for the ranks there) is an
    /// error naming it, never skipped. An address that is not this machine's is skipped (no
    /// process here can listen on it, so no one here can answer a client there). A host that
    /// names every interface (`0.0.0.0`, `::`) is refused: the store listens where the ranks
    /// were told to meet, nowhere else.
    pub fn bind(host: &str, port: u16, key: &StoreKey) -> Result<Self> {
        Self::bind_with(host, port, key, ServerLimits::default())
    }

    /// [`TcpStoreServer::bind`] with other limits.
    pub fn bind_with(host: &str, port: u16, key: &StoreKey, limits: ServerLimits) -> Result<Self> {
        let addrs = listen_addrs(host, port)?;
        Self::bind_addrs(host, &addrs, key, limits)
    }

    /// Listens on each of `addrs` (resolved from `host`, which messages name), all on the
    /// port of the first (0: a free one).
    pub fn bind_addrs(
        host: &str,
        addrs: &[SocketAddr],
        key: &StoreKey,
        limits: ServerLimits,
    ) -> Result<Self> {
        if let Some(a) = addrs.iter().find(|a| a.ip().is_unspecified()) {
            return Err(every_interface(host, a));
        }
        let requested = addrs.first().map_or(0, SocketAddr::port);
        // A free port picked on the first address may be taken on another: pick again.
        let mut tries = if requested == 0 { 8 } else { 1 };
        let listeners = loop {
            tries -= 1;
            match listen_on_all(host, addrs) {
                Err((e, true)) if tries > 0 && requested == 0 => drop(e),
                Err((e, _)) => return Err(e),
                Ok(l) => break l,
            }
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(ServerState {
                map: HashMap::new(),
                stored: 0,
                handshaking: 0,
                full_since: None,
                stopping: false,
                conns: HashMap::new(),
                next_conn: 0,
            }),
            changed: Condvar::new(),
            room: Condvar::new(),
            key: key.clone(),
            limits,
        });
        let mut server = TcpStoreServer {
            shared,
            listeners: Vec::new(),
        };
        for (local, listener) in listeners {
            let sh = server.shared.clone();
            let accept = thread::Builder::new()
                .name(format!("ferrocomm-store-{}", local.port()))
                .spawn(move || accept_loop(listener, sh))
                // Dropping `server` stops the accept threads already started.
                .map_err(|e| Error::io("store server: spawning an accept thread", e))?;
            server.listeners.push((local, Some(accept)));
        }
        Ok(server)
    }

    /// The port actually bound.
    pub fn port(&self) -> u16 {
        self.local_addr().port()
    }

    /// The first address listened on.
    pub fn local_addr(&self) -> SocketAddr {
        self.listeners[0].0
    }

    /// Every address listened on.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners.iter().map(|(a, _)| *a).collect()
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

/// The addresses to listen on for `host:port`, or why none.
fn listen_addrs(host: &str, port: u16) -> Result<Vec<SocketAddr>> {
    let mut addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| Error::io(format!("store server: cannot resolve {host}"), e))?
        .collect();
    addrs.dedup();
    if addrs.is_empty() {
        return Err(Error::Store(format!(
            "store server: {host} resolves to no address"
        )));
    }
    Ok(addrs)
}

fn every_interface(host: &str, a: &SocketAddr) -> Error {
    Error::InvalidArgument(format!(
        "store server: {host} names every interface ({}), and the store listens on the \
         address the ranks reach rank 0 at alone: set MASTER_ADDR (or FERROCOMM_STORE_ADDR) \
         to that address (127.0.0.1 when every rank runs on this machine)",
        a.ip()
    ))
}

/// Binds every address of `addrs` on one port; on failure the error and whether it was a
/// port picked on an earlier address that is in use on a later one.
fn listen_on_all(
    host: &str,
    addrs: &[SocketAddr],
) -> std::result::Result<Vec<(SocketAddr, TcpListener)>, (Error, bool)> {
    let mut port = addrs.first().map_or(0, SocketAddr::port);
    let mut bound = Vec::new();
    let mut absent = Vec::new();
    for a in addrs {
        let mut a = *a;
        a.set_port(port);
        match TcpListener::bind(a).and_then(|l| Ok((l.local_addr()?, l))) {
            Ok((local, l)) => {
                port = local.port();
                bound.push((local, l));
            }
            // Not an address of this machine: no process here can listen there either.
            Err(e) if e.kind() == io::ErrorKind::AddrNotAvailable => absent.push((a, e)),
            Err(e) => {
                let picked = !bound.is_empty() && e.kind() == io::ErrorKind::AddrInUse;
                let why = format!(
                    "store server: cannot listen on {a}, one of the addresses {host} resolves \
                     to (a client may try any of them, so the store listens on all of them; \
                     another process holding one is an error, never skipped)"
                );
                return Err((Error::io(why, e), picked));
            }
        }
    }
    if bound.is_empty() {
        let (a, e) = absent.remove(0);
        return Err((
            Error::io(format!("store server: cannot listen on {a} ({host})"), e),
            false,
        ));
    }
    for (a, e) in absent {
        tracing::info!("store server: {a} ({host}) is not an address of this machine: {e}");
    }
    Ok(bound)
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
        self.shared.room.notify_all();
        // Wake each accept thread, blocked in accept(), by connecting once.
        for (addr, accept) in &mut self.listeners {
            if TcpStream::connect_timeout(addr, Duration::from_secs(1)).is_ok() {
                if let Some(h) = accept.take() {
                    let _ = h.join();
                }
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
        let id = match admit(&shared, &stream) {
            Admission::Slot(id) => id,
            Admission::Busy => {
                turn_away(stream);
                continue;
            }
            Admission::Stopping => return,
        };
        let sh = shared.clone();
        let spawned = thread::Builder::new()
            .name("ferrocomm-store-conn".into())
            .spawn(move || {
                let _listed = Listed(&sh, id);
                let slot = HandshakeSlot(&sh);
                let _ = serve(stream, slot, &sh);
            });
        if spawned.is_err() {
            // No thread to serve it (out of memory or threads): the client is told to come
            // back, as when every slot is taken, instead of being closed unanswered.
            let listed = {
                let mut st = shared.lock();
                st.handshaking -= 1;
                shared.room_freed(&mut st);
                st.conns.remove(&id)
            };
            if let Some(c) = listed {
                turn_away(c);
            }
        }
    }
}

/// What becomes of a new connection.
enum Admission {
    /// It has a handshake slot (counted in `handshaking`) and is listed under this id: serve it.
    Slot(u64),
    /// No slot came back for [`ServerLimits::slot_wait`]: answer BUSY.
    Busy,
    Stopping,
}

/// Takes a handshake slot for the new connection `s` and lists it, waiting while every slot
/// (or connection) is taken until one is given back, or until none has been for
/// [`ServerLimits::slot_wait`].
///
/// Meanwhile this accept thread accepts nothing more, so later connections wait in the
/// kernel's listen queue at no cost to the server. A burst of legitimate clients, each holding
/// its slot for milliseconds, is served in turn however many arrive at once and however
/// loaded the machine; only slots held without progress (a stranger's connections, cut at
/// their handshake deadline) make new connections wait the whole `slot_wait`, after which
/// they are answered BUSY at once until a slot comes back.
fn admit(shared: &Shared, s: &TcpStream) -> Admission {
    let l = &shared.limits;
    let mut st = shared.lock();
    loop {
        if st.stopping {
            return Admission::Stopping;
        }
        if st.handshaking < l.max_handshaking && st.conns.len() < l.max_connections {
            st.handshaking += 1;
            let id = st.next_conn;
            st.next_conn += 1;
            if let Ok(c) = s.try_clone() {
                st.conns.insert(id, c);
            }
            return Admission::Slot(id);
        }
        let now = Instant::now();
        let since = *st.full_since.get_or_insert(now);
        let left = since
            .checked_add(l.slot_wait)
            .map_or(Duration::from_secs(3600), |until| {
                until.saturating_duration_since(now)
            });
        if left.is_zero() {
            return Admission::Busy;
        }
        st = shared
            .room
            .wait_timeout(st, left)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

/// Answers BUSY and closes, without ever blocking the accepting thread. What the client sent
/// of its hello is read first: a socket closed with unread bytes resets the connection, which
/// can destroy the answer before the client reads it.
fn turn_away(mut s: TcpStream) {
    use std::io::{Read, Write};
    if s.set_nonblocking(true).is_err() {
        return;
    }
    let mut hello = [0u8; 4 + NONCE];
    let _ = s.read(&mut hello);
    // Four bytes always fit the empty send buffer of a new connection.
    let _ = s.write(&BUSY);
    let _ = s.shutdown(Shutdown::Write);
}

/// The server's side of the handshake, all of it by `deadline`: the connection's two
/// directions when the client proved it holds the key.
fn greet(
    s: &mut TcpStream,
    key: &StoreKey,
    deadline: Instant,
) -> io::Result<Option<(Direction, Direction)>> {
    let mut hello = [0u8; 4 + NONCE];
    read_by(s, &mut hello, Some(deadline))?;
    if hello[..4] != MAGIC {
        return Ok(None); // not one of ours: hang up
    }
    let theirs = &hello[4..];
    let mine = rand::random::<[u8; NONCE]>();
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&mine);
    out.extend_from_slice(&key.tag(LABEL_SERVER, theirs, &mine));
    write_by(s, &out, deadline)?;
    let mut tag = [0u8; TAG];
    read_by(s, &mut tag, Some(deadline))?;
    if !key.verify(LABEL_CLIENT, &mine, theirs, &tag) {
        let mut out = vec![ST_ERROR];
        write_bytes(&mut out, b"wrong store secret");
        write_by(s, &out, deadline)?;
        return Ok(None);
    }
    write_by(s, &[ST_OK], deadline)?;
    let (up, down) = key.session_keys(theirs, &mine);
    Ok(Some((Direction::new(&up), Direction::new(&down))))
}

/// A connection's place among those in their handshake, given back however the handshake
/// ends, a panic included: places never given back would, `max_handshaking` times over, make
/// the server close every new connection unanswered, legitimate clients' too.
struct HandshakeSlot<'a>(&'a Shared);

impl Drop for HandshakeSlot<'_> {
    fn drop(&mut self) {
        let mut st = self.0.lock();
        st.handshaking -= 1;
        self.0.room_freed(&mut st);
    }
}

/// A connection's entry in the server's list of open connections, removed however its thread
/// ends (entries left behind would count against `max_connections` forever).
struct Listed<'a>(&'a Shared, u64);

impl Drop for Listed<'_> {
    fn drop(&mut self) {
        let mut st = self.0.lock();
        st.conns.remove(&self.1);
        self.0.room_freed(&mut st);
    }
}

/// Serves one client until it disconnects, breaks the protocol or the server stops.
fn serve(mut s: TcpStream, slot: HandshakeSlot<'_>, sh: &Shared) -> io::Result<()> {
    let limits = &sh.limits;
    // The handshake's time counts from here: time the server took to get to it (waiting for
    // the slot, starting this thread on a loaded machine) is not the client's.
    let greeted = match Instant::now().checked_add(limits.handshake) {
        Some(deadline) => greet(&mut s, &sh.key, deadline),
        None => Err(io::Error::other("handshake deadline out of range")),
    };
    drop(slot);
    let Some((mut up, mut down)) = greeted? else {
        return Ok(());
    };
    loop {
        // An idle connection waits for its next request as long as it likes; once a request
        // has begun, the rest must follow by the deadline.
        let (reply, go_on) = match up.read(&mut s, MAX_REQUEST, None, Some(limits.request)) {
            Ok(req) => match execute(&req, sh) {
                Some(reply) => (reply, true),
                None => return Ok(()), // stopping
            },
            Err(FrameError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(FrameError::Io(e)) => return Err(e),
            Err(FrameError::TooLong(n)) => (
                refusal(
                    ST_ERROR,
                    &format!("a request of {n} bytes is longer than any the store takes"),
                ),
                false,
            ),
            Err(FrameError::Forged) => (
                refusal(
                    ST_FORGED,
                    "a request from this process failed authentication at the store",
                ),
                false,
            ),
        };
        let frame = down.seal(&reply)?;
        let deadline = Instant::now()
            .checked_add(limits.request)
            .ok_or_else(|| io::Error::other("request deadline out of range"))?;
        write_by(&mut s, &frame, deadline)?;
        if !go_on {
            return Ok(());
        }
    }
}

fn refusal(status: u8, msg: &str) -> Vec<u8> {
    let mut out = vec![status];
    write_bytes(&mut out, msg.as_bytes());
    out
}

/// Carries out one request: the answer, or `None` when the server is stopping.
fn execute(req: &[u8], sh: &Shared) -> Option<Vec<u8>> {
    let mut f = Fields(req);
    let parsed = f.array::<1>().and_then(|[op]| Ok((op, f.key()?)));
    let (op, key) = match parsed {
        Ok(p) => p,
        Err(e) => return Some(refusal(ST_ERROR, &e)),
    };
    let max_stored = sh.limits.max_stored;
    let mut out = vec![ST_OK];
    match op {
        OP_SET => {
            let value = match f.bytes("value", MAX_VALUE) {
                Ok(v) => v,
                Err(e) => return Some(refusal(ST_ERROR, &format!("set '{key}': {e}"))),
            };
            let mut st = sh.lock();
            let total = st.cost_with(&key, value.len());
            if total > max_stored {
                return Some(refusal(
                    ST_ERROR,
                    &format!(
                        "set '{key}': the store holds {max_stored} bytes at most (keys, values \
                         and {ENTRY_OVERHEAD} per entry), and this value of {} bytes would \
                         pass it",
                        value.len()
                    ),
                ));
            }
            st.stored = total;
            st.map.insert(key, value.to_vec());
            drop(st);
            sh.changed.notify_all();
        }
        OP_GET => {
            let ms = match f.array::<8>() {
                Ok(a) => u64::from_le_bytes(a),
                Err(e) => return Some(refusal(ST_ERROR, &e)),
            };
            let deadline = Instant::now().checked_add(Duration::from_millis(ms));
            let mut st = sh.lock();
            loop {
                if st.stopping {
                    return None;
                }
                if let Some(v) = st.map.get(&key) {
                    write_bytes(&mut out, v);
                    break;
                }
                let left = match deadline {
                    Some(d) => d.saturating_duration_since(Instant::now()),
                    None => Duration::from_secs(3600),
                };
                if left.is_zero() {
                    out[0] = ST_TIMEOUT;
                    break;
                }
                st = sh
                    .changed
                    .wait_timeout(st, left)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        }
        OP_CHECK => out.push(sh.lock().map.contains_key(&key) as u8),
        OP_ADD => {
            let delta = match f.array::<8>() {
                Ok(a) => i64::from_le_bytes(a),
                Err(e) => return Some(refusal(ST_ERROR, &e)),
            };
            let mut st = sh.lock();
            let cur = match st.map.get(&key).map(|v| decode_i64(&key, v)).transpose() {
                Ok(c) => c.unwrap_or(0),
                Err(e) => return Some(refusal(ST_ERROR, &e.to_string())),
            };
            let Some(new) = cur.checked_add(delta) else {
                return Some(refusal(ST_ERROR, &format!("add to '{key}' overflows i64")));
            };
            let text = new.to_string().into_bytes();
            let total = st.cost_with(&key, text.len());
            if total > max_stored {
                return Some(refusal(
                    ST_ERROR,
                    &format!("add to '{key}': the store is full ({max_stored} bytes)"),
                ));
            }
            st.stored = total;
            st.map.insert(key, text);
            drop(st);
            sh.changed.notify_all();
            out.extend_from_slice(&new.to_le_bytes());
        }
        OP_DELETE => {
            let mut st = sh.lock();
            let had = match st.map.remove(&key) {
                Some(v) => {
                    st.stored -= entry_cost(key.len(), v.len());
                    true
                }
                None => false,
            };
            out.push(had as u8);
        }
        other => return Some(refusal(ST_ERROR, &format!("unknown request {other}"))),
    }
    Some(out)
}

// ---------------------------------------------------------------------------------------------
// Client

/// One connection of a client, past its handshake.
struct Channel {
    s: TcpStream,
    /// Requests (client to server).
    up: Direction,
    /// Answers (server to client).
    down: Direction,
}

/// A client of a [`TcpStoreServer`].
pub struct TcpStore {
    /// `host:port` as given, for messages.
    name: String,
    addrs: Vec<SocketAddr>,
    key: StoreKey,
    idle: Mutex<Vec<Channel>>,
    /// Set once a frame on one of its connections failed authentication: every later call
    /// fails with this message, since something on the way is tampering with the traffic.
    tampered: Mutex<Option<String>>,
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
                        Ok(ch) => {
                            return Ok(TcpStore {
                                name,
                                addrs,
                                key: key.clone(),
                                idle: Mutex::new(vec![ch]),
                                tampered: Mutex::new(None),
                            })
                        }
                        Err(Attempt::Fatal(e)) => return Err(e),
                        Err(Attempt::Retry(e) | Attempt::Busy(e)) => last_err = e,
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

    /// Records that the traffic was tampered with and returns the error every call gets now.
    fn tampered(&self, what: &str) -> Error {
        let msg = format!(
            "{what} the store at {}: it was altered, replayed or injected on the way, so \
             something between this process and the store is tampering with the connection; \
             every later call of this process to the store fails",
            self.name
        );
        let mut t = self.tampered.lock().unwrap_or_else(|p| p.into_inner());
        Error::Store(t.get_or_insert(msg).clone())
    }

    /// Sends the request `req` and returns the answer's fields after its status, the status
    /// (`ST_OK` or `ST_TIMEOUT`), or the store's refusal as an error.
    fn call(&self, req: &[u8], wait: Duration) -> Result<(u8, Vec<u8>)> {
        if let Some(t) = self
            .tampered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            return Err(Error::Store(t));
        }
        let pooled = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut ch = match pooled {
            Some(ch) => ch,
            None => self.reopen(wait)?,
        };
        let deadline = Instant::now().checked_add(wait);
        let sent = ch.up.seal(req).and_then(|frame| match deadline {
            Some(d) => write_by(&mut ch.s, &frame, d),
            None => std::io::Write::write_all(&mut ch.s, &frame),
        });
        let reply = match sent {
            Ok(()) => ch.down.read(&mut ch.s, MAX_REPLY, deadline, None),
            Err(e) => Err(FrameError::Io(e)),
        };
        let reply = match reply {
            Ok(r) => r,
            Err(FrameError::Forged) => {
                return Err(self.tampered("an answer failed authentication from"))
            }
            Err(FrameError::TooLong(n)) => {
                return Err(self.gone(&io::Error::other(format!(
                    "an answer of {n} bytes, longer than any the store sends"
                ))))
            }
            Err(FrameError::Io(e))
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(Error::Store(format!(
                    "the store at {} did not answer within {wait:.1?}",
                    self.name
                )))
            }
            Err(FrameError::Io(e)) => return Err(self.gone(&e)),
        };
        let mut f = Fields(&reply);
        let status = f
            .array::<1>()
            .map_err(|e| self.gone(&io::Error::other(e)))?[0];
        match status {
            ST_OK | ST_TIMEOUT => {
                self.idle.lock().unwrap_or_else(|p| p.into_inner()).push(ch);
                Ok((status, f.0.to_vec()))
            }
            ST_FORGED => Err(self.tampered("a request failed authentication at")),
            _ => {
                // The server answered a refusal on a connection that stays in step.
                self.idle.lock().unwrap_or_else(|p| p.into_inner()).push(ch);
                Err(Error::Store(format!(
                    "the store at {} refused: {}",
                    self.name,
                    f.message()
                )))
            }
        }
    }

    /// A new connection for a call that found none idle (another thread's call holds each):
    /// a server that answers BUSY is alive and is asked again, with back-off, for up to
    /// `wait`; any other failure means it is gone (it was up once, so nobody listening or a
    /// connection closed unanswered is its process exiting).
    fn reopen(&self, wait: Duration) -> Result<Channel> {
        let deadline = Instant::now().checked_add(wait);
        let mut pause = Duration::from_millis(20);
        loop {
            match open(&self.name, &self.addrs, &self.key, Duration::from_secs(5)) {
                Ok(ch) => return Ok(ch),
                Err(Attempt::Fatal(e)) => return Err(e),
                Err(Attempt::Retry(e)) => return Err(self.gone(&io::Error::other(e))),
                Err(Attempt::Busy(e)) => {
                    let left =
                        deadline.map_or(pause, |d| d.saturating_duration_since(Instant::now()));
                    if left.is_zero() {
                        return Err(Error::Store(format!("{e}; tried for {wait:.1?}")));
                    }
                    // Back-off between tries, not an ordering of events.
                    thread::sleep(pause.min(left));
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
            }
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

enum Attempt {
    /// The server answered BUSY: every handshake slot stayed taken. Worth another try whenever
    /// the caller still has time (the server is alive and will serve it): why not.
    Busy(String),
    /// Worth another try while connecting (nobody listening yet, or the connection closed
    /// unanswered): why not.
    Retry(String),
    Fatal(Error),
}

/// Opens one connection and runs the client's side of the handshake.
fn open(
    name: &str,
    addrs: &[SocketAddr],
    key: &StoreKey,
    connect_timeout: Duration,
) -> Result<Channel, Attempt> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no addresses");
    for a in addrs {
        match TcpStream::connect_timeout(a, connect_timeout) {
            Ok(mut s) => {
                let _ = s.set_nodelay(true);
                let (up, down) = handshake(name, &mut s, key)?;
                return Ok(Channel { s, up, down });
            }
            Err(e) => last = e,
        }
    }
    Err(Attempt::Retry(last.to_string()))
}

fn handshake(
    name: &str,
    s: &mut TcpStream,
    key: &StoreKey,
) -> Result<(Direction, Direction), Attempt> {
    let deadline = Instant::now() + CLIENT_HANDSHAKE;
    let mine = rand::random::<[u8; NONCE]>();
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(&mine);
    let mut magic = [0u8; 4];
    let sent = write_by(s, &hello, deadline).and_then(|_| read_by(s, &mut magic, Some(deadline)));
    let no_reply = |e: io::Error| {
        // A ferrocomm server answers every connection (BUSY when it cannot serve it yet), so
        // a close or a reset here is its process going away, or another service.
        Attempt::Retry(format!(
            "{name} accepted the connection but gave no handshake reply ({e}): the process \
             listening there closed it unanswered (exiting, or another service)"
        ))
    };
    sent.map_err(no_reply)?;
    if magic == BUSY {
        return Err(Attempt::Busy(format!(
            "{name} is busy and gave no handshake reply: all of its handshake slots (or \
             connections) stayed taken by others (a stranger holding them, or far more clients \
             at once than it serves)"
        )));
    }
    if magic != MAGIC {
        return Err(Attempt::Fatal(Error::Store(format!(
            "{name} accepted a connection but is not a ferrocomm store of this version \
             (another service on that port? under torchrun the store uses MASTER_PORT+1)"
        ))));
    }
    let mut reply = [0u8; NONCE + TAG];
    read_by(s, &mut reply, Some(deadline)).map_err(no_reply)?;
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
    let mut status = [0u8; 1];
    match write_by(s, &proof, deadline).and_then(|_| read_by(s, &mut status, Some(deadline))) {
        Ok(()) if status[0] == ST_OK => {
            let (up, down) = key.session_keys(&mine, theirs);
            Ok((Direction::new(&up), Direction::new(&down)))
        }
        // The reason that follows adds nothing the client does not know.
        Ok(()) => Err(refused("refused this process's secret")),
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
        self.call(&req, REPLY_TIMEOUT).map(|_| ())
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let mut req = Self::request(OP_GET, key)?;
        let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        req.extend_from_slice(&ms.to_le_bytes());
        match self.call(&req, timeout.saturating_add(GET_SLACK))? {
            (ST_OK, fields) => Fields(&fields)
                .bytes("value", MAX_VALUE)
                .map(<[u8]>::to_vec)
                .map_err(|e| self.gone(&io::Error::other(e))),
            _ => Err(Error::StoreTimeout {
                key: key.to_string(),
                timeout,
            }),
        }
    }

    fn check(&self, key: &str) -> Result<bool> {
        let req = Self::request(OP_CHECK, key)?;
        let (_, fields) = self.call(&req, REPLY_TIMEOUT)?;
        Ok(fields.first().is_some_and(|&b| b != 0))
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let mut req = Self::request(OP_ADD, key)?;
        req.extend_from_slice(&delta.to_le_bytes());
        let (_, fields) = self.call(&req, REPLY_TIMEOUT)?;
        Fields(&fields)
            .array::<8>()
            .map(i64::from_le_bytes)
            .map_err(|e| self.gone(&io::Error::other(e)))
    }

    fn delete(&self, key: &str) -> Result<bool> {
        let req = Self::request(OP_DELETE, key)?;
        let (_, fields) = self.call(&req, REPLY_TIMEOUT)?;
        Ok(fields.first().is_some_and(|&b| b != 0))
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
    // Listen on the interfaces the ranks were told to meet at (`host` names this machine as
    // the others see it): loopback stays loopback, an address is that interface alone, and a
    // name is every address it resolves to, since a client may try any of them.
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
    let (var, host) = match (&l.store_addr, &l.master_addr) {
        (Some(a), _) => ("FERROCOMM_STORE_ADDR", a.clone()),
        (None, Some(a)) => ("MASTER_ADDR", a.clone()),
        (None, None) => ("MASTER_ADDR", "127.0.0.1".to_string()),
    };
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
    // Every rank refuses a name of every interface (0, 0.0.0.0, ::), not rank 0 alone: the
    // store never listens on all of them.
    if let Some(a) = (host.as_str(), port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut it| it.find(|a| a.ip().is_unspecified()))
    {
        return Err(Error::BadEnv {
            var,
            value: host.clone(),
            why: format!(
                "names every interface ({}); the store listens on the address the ranks reach \
                 rank 0 at alone: set it to that address (127.0.0.1 when every rank runs on \
                 this machine)",
                a.ip()
            ),
        });
    }
    let key = StoreKey::from_config(cfg)?;
    if rank == 0 && !l.store_external {
        port = ensure_server(&host, port, &key)
            .map_err(|e| port_taken(e, var_of_port(l.store_port.is_some()), port))?;
    }
    Ok(Arc::new(TcpStore::connect(&host, port, &key, cfg.timeout)?))
}

/// The variable the store's port came from.
fn var_of_port(store_port_set: bool) -> &'static str {
    if store_port_set {
        "FERROCOMM_STORE_PORT"
    } else {
        "MASTER_PORT"
    }
}

/// A store server that cannot listen because its port is taken says which variable to
/// change: under a launcher other than torchrun (a Kubernetes PyTorchJob, SLURM, mpirun),
/// torch.distributed's own store holds MASTER_PORT once `init_process_group` ran.
fn port_taken(e: Error, var: &'static str, port: u16) -> Error {
    let in_use =
        matches!(&e, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::AddrInUse);
    if !in_use {
        return e;
    }
    Error::BadEnv {
        var,
        value: port.to_string(),
        why: format!(
            "{e}: another process holds the port (torch.distributed's store does once \
             init_process_group ran: create the communicator after it from Python, which meets \
             through torch's store, or set FERROCOMM_STORE_PORT to a free port)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn a_request_sent_byte_by_byte_is_cut_at_its_deadline() {
        let key = StoreKey::from_secret("a secret of the store's unit tests");
        let limits = ServerLimits {
            request: Duration::from_millis(600),
            ..ServerLimits::default()
        };
        let srv = TcpStoreServer::bind_with("127.0.0.1", 0, &key, limits).unwrap();
        let addrs = srv.local_addrs();
        let Ok(mut ch) = open("test", &addrs, &key, Duration::from_secs(5)) else {
            panic!("no connection to the store");
        };
        // An authenticated client (the job's own user) sends a SET a byte every 100 ms: 94
        // bytes would take 9.4 s, each read well within any per-read timeout.
        let mut req = vec![OP_SET];
        write_bytes(&mut req, b"slow key");
        write_bytes(&mut req, &[0u8; 56]);
        let frame = ch.up.seal(&req).unwrap();
        ch.s.set_nonblocking(true).unwrap();
        let t0 = Instant::now();
        let mut closed = None;
        for b in &frame {
            let mut buf = [0u8; 64];
            let gone = match ch.s.read(&mut buf) {
                Ok(0) => true,
                Ok(_) => false,
                Err(e) => e.kind() != io::ErrorKind::WouldBlock,
            };
            if gone || ch.s.write_all(&[*b]).is_err() {
                closed = Some(t0.elapsed());
                break;
            }
            // The slow client's pace.
            thread::sleep(Duration::from_millis(100));
        }
        let closed = closed.expect("the server read the whole slow request");
        assert!(closed < Duration::from_secs(5), "closed after {closed:?}");
        // Nothing of it was stored, and the server serves others on.
        let s = TcpStore::connect("127.0.0.1", srv.port(), &key, Duration::from_secs(5)).unwrap();
        assert!(!s.check("slow key").unwrap());
    }

    #[test]
    fn handshake_slots_come_back_however_handshakes_end() {
        let key = StoreKey::from_secret("a secret of the store's unit tests");
        let limits = ServerLimits {
            handshake: Duration::from_millis(300),
            max_handshaking: 2,
            ..ServerLimits::default()
        };
        let srv = TcpStoreServer::bind_with("127.0.0.1", 0, &key, limits).unwrap();
        let port = srv.port();
        let other = StoreKey::from_secret("another job's secret");
        // Ten times over the slots: hung up at once, half a hello, a wrong magic, silence until
        // the deadline, the wrong secret.
        for round in 0..10 {
            let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
            match round % 5 {
                0 => drop(c),
                1 => c.write_all(b"FCS3\x01").unwrap(),
                2 => c.write_all(&[b'X'; 36]).unwrap(),
                3 => {
                    let mut b = [0u8; 1];
                    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    // Closed by the server at the deadline.
                    assert!(matches!(c.read(&mut b), Ok(0) | Err(_)));
                }
                _ => assert!(
                    TcpStore::connect("127.0.0.1", port, &other, Duration::from_secs(5)).is_err()
                ),
            }
        }
        // Every slot given back (the last threads may still be finishing).
        let deadline = Instant::now() + Duration::from_secs(10);
        while srv.shared.lock().handshaking != 0 {
            assert!(
                Instant::now() < deadline,
                "handshake slots were not given back"
            );
            thread::sleep(Duration::from_millis(10));
        }
        let s = TcpStore::connect("127.0.0.1", port, &key, Duration::from_secs(5)).unwrap();
        s.set("k", b"v").unwrap();
    }

    #[test]
    fn an_entry_is_charged_at_least_what_it_takes() {
        // The map's slot, two heap blocks of the smallest size the allocator hands out (16
        // bytes with an 8-byte header, rounded to 32) and the table's control byte.
        let slot = std::mem::size_of::<(String, Vec<u8>)>() + 1;
        assert!(
            ENTRY_OVERHEAD >= slot + 2 * 32,
            "{ENTRY_OVERHEAD} < {}",
            slot + 64
        );
        assert_eq!(entry_cost(3, 5), 8 + ENTRY_OVERHEAD);
    }

    /// A server on loopback with `limits`, and its key.
    fn limited_server(limits: ServerLimits) -> (StoreKey, TcpStoreServer) {
        let key = StoreKey::from_secret("a secret of the store's unit tests");
        let srv = TcpStoreServer::bind_with("127.0.0.1", 0, &key, limits).unwrap();
        (key, srv)
    }

    /// Waits until `cond` holds of the server's state, failing the test after 20 s.
    fn until(srv: &TcpStoreServer, what: &str, cond: impl Fn(&ServerState) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cond(&srv.shared.lock()) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// A legitimate client slowed by a loaded machine: it completes its handshake, but only
    /// after `pause` between the server's reply and its own proof (well inside the deadline).
    fn slow_handshake(port: u16, key: &StoreKey, pause: Duration) -> io::Result<()> {
        let mut s = TcpStream::connect(("127.0.0.1", port))?;
        let mine = [7u8; NONCE];
        s.write_all(&[&MAGIC[..], &mine].concat())?;
        let mut reply = [0u8; 4 + NONCE + TAG];
        s.set_read_timeout(Some(Duration::from_secs(20)))?;
        s.read_exact(&mut reply)?;
        let theirs = &reply[4..4 + NONCE];
        thread::sleep(pause); // the slowed client's pace
        s.write_all(&key.tag(LABEL_CLIENT, theirs, &mine))?;
        let mut status = [0u8; 1];
        s.read_exact(&mut status)?;
        assert_eq!(status[0], ST_OK);
        Ok(())
    }

    #[test]
    fn clients_past_the_handshake_slots_wait_for_one_instead_of_being_reset() {
        // Two slots, held by two legitimate but slowed clients; meanwhile sixteen more connect
        // at once, each trying once. They wait for the slots to come back and are served in
        // turn: none is closed unanswered.
        let (key, srv) = limited_server(ServerLimits {
            max_handshaking: 2,
            slot_wait: Duration::from_secs(10),
            ..ServerLimits::default()
        });
        let port = srv.port();
        let slow: Vec<_> = (0..2)
            .map(|_| {
                let key = key.clone();
                thread::spawn(move || slow_handshake(port, &key, Duration::from_millis(300)))
            })
            .collect();
        until(&srv, "the slow clients to hold both slots", |st| {
            st.handshaking == 2
        });
        let addrs = srv.local_addrs();
        let start = std::sync::Barrier::new(16);
        let tries: Vec<std::result::Result<(), String>> = thread::scope(|sc| {
            let hs: Vec<_> = (0..16)
                .map(|_| {
                    sc.spawn(|| {
                        start.wait();
                        match open("test", &addrs, &key, Duration::from_secs(5)) {
                            Ok(_) => Ok(()),
                            Err(Attempt::Busy(e) | Attempt::Retry(e)) => Err(e),
                            Err(Attempt::Fatal(e)) => Err(e.to_string()),
                        }
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (i, t) in tries.iter().enumerate() {
            assert!(t.is_ok(), "client {i}: {t:?}");
        }
        for h in slow {
            h.join().unwrap().unwrap();
        }
    }

    #[test]
    fn slots_held_past_the_wait_answer_busy_and_a_call_tries_again_until_served() {
        // A stranger holds the only slot, silent, until its handshake deadline (3 s); a new
        // connection waits 200 ms for it and is then answered BUSY, never closed unanswered.
        let (key, srv) = limited_server(ServerLimits {
            handshake: Duration::from_secs(3),
            max_handshaking: 1,
            slot_wait: Duration::from_millis(200),
            ..ServerLimits::default()
        });
        let port = srv.port();
        let s =
            Arc::new(TcpStore::connect("127.0.0.1", port, &key, Duration::from_secs(10)).unwrap());
        // The client's one connection is taken by a get that waits for the key.
        let getter = {
            let s = s.clone();
            thread::spawn(move || s.get("k", Duration::from_secs(60)))
        };
        let idle = || s.idle.lock().unwrap().len();
        let deadline = Instant::now() + Duration::from_secs(20);
        while idle() != 0 {
            assert!(
                Instant::now() < deadline,
                "the get never took the connection"
            );
            thread::sleep(Duration::from_millis(5));
        }
        let _stranger = TcpStream::connect(("127.0.0.1", port)).unwrap();
        until(&srv, "the stranger to hold the slot", |st| {
            st.handshaking == 1
        });
        match open("test", &srv.local_addrs(), &key, Duration::from_secs(5)) {
            Err(Attempt::Busy(e)) => assert!(e.contains("busy"), "{e}"),
            Err(Attempt::Retry(e)) => panic!("closed unanswered: {e}"),
            Err(Attempt::Fatal(e)) => panic!("{e}"),
            Ok(_) => panic!("served while the only slot was held"),
        }
        // A set now needs a connection of its own: it is told BUSY until the stranger is cut
        // at its deadline, tries again, and is served.
        s.set("k", b"v").unwrap();
        assert_eq!(getter.join().unwrap().unwrap(), b"v");
    }
}
