//! The TCP store against an attacker on the same machine who gets between the ranks and the
//! store (a relay on an address a rank tries, or a squatter on one of the addresses of
//! MASTER_ADDR), who holds handshakes open byte by byte, or who fills the store with tiny
//! entries. Loopback only, every loop bounded; attackers pace themselves, nothing sleeps to
//! order events.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use ferrocomm::bootstrap::{
    all_gather_bytes, connect_from_env, store_barrier, ServerLimits, Store, TcpStore,
    TcpStoreServer, ENTRY_OVERHEAD,
};
use ferrocomm::Error;

mod store_support;
use store_support::{cfg, free_port, key};

const T: Duration = Duration::from_secs(20);

/// The handshake's messages from the client (hello, proof) and from the server (hello and tag,
/// status), in bytes: frames start after them.
const HANDSHAKE_UP: &[usize] = &[4 + 32, 32];
const HANDSHAKE_DOWN: &[usize] = &[4 + 32 + 32, 1];

/// What a relay does to the traffic it passes on.
#[derive(Clone, Copy, Debug)]
enum Tamper {
    /// Passes everything unchanged (and records it).
    Nothing,
    /// Flips a bit of the first request frame of every connection.
    AlterRequest,
    /// Flips a bit of the first answer frame of every connection.
    AlterAnswer,
    /// Sends the first request frame of every connection twice.
    ReplayRequest,
    /// Sends a frame of its own making before the first request of every connection.
    InjectRequest,
}

/// A relay on a free loopback port that connects each client to `target` and passes the bytes
/// on, recording every byte it sees (both directions) in the returned buffer.
fn relay(target: u16, tamper: Tamper) -> (u16, Arc<Mutex<Vec<u8>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    thread::spawn(move || {
        for c in l.incoming() {
            let Ok(client) = c else { return };
            let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                return;
            };
            let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let (up_seen, down_seen) = (seen2.clone(), seen2.clone());
            thread::spawn(move || pump(client, server, HANDSHAKE_UP, tamper, true, up_seen));
            thread::spawn(move || pump(s2, c2, HANDSHAKE_DOWN, tamper, false, down_seen));
        }
    });
    (port, seen)
}

/// Copies `from` to `to`: the handshake's bytes as they come, then frame by frame, tampering
/// with the first frame as `tamper` says for this direction (`up`: client to server).
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    handshake: &[usize],
    tamper: Tamper,
    up: bool,
    seen: Arc<Mutex<Vec<u8>>>,
) {
    let pass = |to: &mut TcpStream, b: &[u8]| {
        seen.lock().unwrap().extend_from_slice(b);
        to.write_all(b)
    };
    for &n in handshake {
        let mut msg = vec![0u8; n];
        if from.read_exact(&mut msg).is_err() || pass(&mut to, &msg).is_err() {
            return;
        }
    }
    for n in 0.. {
        let mut len = [0u8; 4];
        if from.read_exact(&mut len).is_err() {
            break;
        }
        let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
        if from.read_exact(&mut body).is_err() {
            break;
        }
        let mut frame = len.to_vec();
        frame.extend_from_slice(&body);
        let first = n == 0;
        let sent = match tamper {
            Tamper::AlterRequest if up && first => {
                frame[4] ^= 0x20;
                pass(&mut to, &frame)
            }
            Tamper::AlterAnswer if !up && first => {
                frame[4] ^= 0x20;
                pass(&mut to, &frame)
            }
            Tamper::ReplayRequest if up && first => {
                pass(&mut to, &frame).and_then(|_| pass(&mut to, &frame))
            }
            Tamper::InjectRequest if up && first => {
                let mut forged = len.to_vec();
                forged.extend(body.iter().map(|b| b.wrapping_add(1)));
                pass(&mut to, &forged).and_then(|_| pass(&mut to, &frame))
            }
            _ => pass(&mut to, &frame),
        };
        if sent.is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}

/// `world` threads meet through the store at `port` (a gather and a barrier, under keys and
/// values a test can look for); each thread's outcome, in rank order.
fn job(port: u16, world: usize, timeout: Duration) -> Vec<ferrocomm::Result<Vec<Vec<u8>>>> {
    let hs: Vec<_> = (0..world)
        .map(|r| {
            thread::spawn(move || {
                let s = TcpStore::connect("127.0.0.1", port, &key(), timeout)?;
                store_barrier(&s, "plain/barrier-key", world, timeout)?;
                s.set("plain/host/shm_name", b"/ferrocomm-4242-00000000deadbeef")?;
                let mine = format!("plain-value-of-rank-{r}").into_bytes();
                all_gather_bytes(&s, "plain/gather-key", r, world, &mine, timeout)
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn a_relay_sees_only_ciphertext_and_the_job_completes() {
    let srv = TcpStoreServer::bind("127.0.0.1", 0, &key()).unwrap();
    let (port, seen) = relay(srv.port(), Tamper::Nothing);
    for got in job(port, 3, T) {
        let want: Vec<Vec<u8>> = (0..3)
            .map(|r| format!("plain-value-of-rank-{r}").into_bytes())
            .collect();
        assert_eq!(got.unwrap(), want);
    }
    let seen = seen.lock().unwrap().clone();
    assert!(seen.len() > 1000, "the relay passed {} bytes", seen.len());
    for plain in [
        &b"plain/"[..],
        b"barrier-key",
        b"shm_name",
        b"/ferrocomm-4242",
        b"gather-key",
        b"plain-value-of-rank",
    ] {
        assert!(
            !seen.windows(plain.len()).any(|w| w == plain),
            "the relay read {:?}",
            String::from_utf8_lossy(plain)
        );
    }
}

#[test]
fn frames_a_relay_alters_replays_or_injects_are_refused_and_end_the_job() {
    for tamper in [
        Tamper::AlterRequest,
        Tamper::AlterAnswer,
        Tamper::ReplayRequest,
        Tamper::InjectRequest,
    ] {
        let srv = TcpStoreServer::bind("127.0.0.1", 0, &key()).unwrap();
        let (port, _) = relay(srv.port(), tamper);
        let t0 = Instant::now();
        // Every rank's first request or answer is tampered with (a replay is noticed at the
        // request after it): every rank ends with the clear error, none waits for the others
        // until its timeout.
        for (r, got) in job(port, 2, T).into_iter().enumerate() {
            let e = match got {
                Err(Error::Store(e)) => e,
                other => panic!("{tamper:?}: rank {r} got {other:?}"),
            };
            assert!(
                e.contains("failed authentication") && e.contains("tampering"),
                "{tamper:?}: rank {r}: {e}"
            );
        }
        assert!(
            t0.elapsed() < T,
            "{tamper:?}: the ranks waited for their timeout"
        );
        // Nothing the relay did reached the store's entries; the store serves others on.
        let direct = TcpStore::connect("127.0.0.1", srv.port(), &key(), T).unwrap();
        assert!(!direct.check("plain/host/shm_name").unwrap(), "{tamper:?}");
    }
}

#[test]
fn a_client_that_saw_tampering_refuses_every_later_call() {
    let srv = TcpStoreServer::bind("127.0.0.1", 0, &key()).unwrap();
    let (port, _) = relay(srv.port(), Tamper::AlterAnswer);
    let s = TcpStore::connect("127.0.0.1", port, &key(), T).unwrap();
    let first = s.set("k", b"v").unwrap_err().to_string();
    assert!(first.contains("an answer failed authentication"), "{first}");
    // Its next call would open a fresh connection (whose first answer the relay alters too),
    // but it does not even try: once is enough to know.
    for e in [
        s.get("k", T).unwrap_err(),
        s.check("k").unwrap_err(),
        s.add("n", 1).unwrap_err(),
    ] {
        assert_eq!(e.to_string(), first);
    }
}

/// Connections that a stranger opened to `port` and keeps sending bytes of a hello on, one
/// byte per connection every `every`; for each, when the server closed it (measured from its
/// connect), or `None` if it was still open after `limit`.
fn hold_handshakes(
    conns: Vec<TcpStream>,
    every: Duration,
    limit: Duration,
) -> Vec<Option<Duration>> {
    let mut conns: Vec<(TcpStream, Instant, Option<Duration>)> = conns
        .into_iter()
        .map(|c| {
            c.set_nonblocking(true).unwrap();
            (c, Instant::now(), None)
        })
        .collect();
    let hello = b"FCS3 a slow hello that never ends, one byte at a time....";
    let start = Instant::now();
    for i in 0.. {
        for (c, opened, closed) in conns.iter_mut().filter(|c| c.2.is_none()) {
            let mut b = [0u8; 16];
            let gone = match c.read(&mut b) {
                Ok(0) => true,
                Ok(_) => false,
                Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
            };
            if gone || c.write_all(&hello[i % hello.len()..][..1]).is_err() {
                *closed = Some(opened.elapsed());
            }
        }
        if conns.iter().all(|c| c.2.is_some()) || start.elapsed() > limit {
            break;
        }
        // The attacker's pace: a byte per connection every `every`.
        thread::sleep(every);
    }
    conns.into_iter().map(|c| c.2).collect()
}

#[test]
fn slow_handshakes_are_cut_at_their_deadline_and_the_job_completes() {
    // Every handshake slot taken by a stranger who sends a byte every 300 ms: each read comes
    // well within any per-read timeout, but the whole handshake has 1 s.
    let limits = ServerLimits {
        handshake: Duration::from_secs(1),
        max_handshaking: 8,
        ..ServerLimits::default()
    };
    let srv = TcpStoreServer::bind_with("127.0.0.1", 0, &key(), limits).unwrap();
    let port = srv.port();
    let slow: Vec<TcpStream> = (0..8)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    // The job starts while the stranger holds every slot; its clients retry until served.
    let ranks = thread::spawn(move || job(port, 3, T));
    let closed = hold_handshakes(slow, Duration::from_millis(300), Duration::from_secs(15));
    for (i, c) in closed.iter().enumerate() {
        let c = c.unwrap_or_else(|| panic!("slow connection {i} still open after 15 s"));
        // The hello has 36 bytes, 10.8 s at this pace: closed at the 1 s deadline instead (with
        // room for a loaded machine).
        assert!(
            c < Duration::from_secs(6),
            "slow connection {i} closed after {c:?}"
        );
    }
    for got in ranks.join().unwrap() {
        assert_eq!(got.unwrap().len(), 3);
    }
}

#[test]
fn tiny_entries_are_charged_what_they_cost() {
    // 4 million tiny SETs must not take the server far past its total: each entry is charged
    // ENTRY_OVERHEAD beyond its bytes, so a 1 MiB store holds at most 1 MiB / ENTRY_OVERHEAD
    // entries of any size.
    let total = 1 << 20;
    let limits = ServerLimits {
        max_stored: total,
        ..ServerLimits::default()
    };
    let srv = TcpStoreServer::bind_with("127.0.0.1", 0, &key(), limits).unwrap();
    let s = TcpStore::connect("127.0.0.1", srv.port(), &key(), T).unwrap();
    let most = total / ENTRY_OVERHEAD;
    let mut refused = None;
    for i in 0..2 * most {
        if let Err(e) = s.set(&format!("t{i}"), b"") {
            refused = Some((i, e.to_string()));
            break;
        }
    }
    let (held, e) = refused.expect("the store took twice what its total allows");
    assert!(held <= most, "held {held} tiny entries, at most {most} fit");
    assert!(
        held > most * 9 / 10,
        "refused early, after {held} of {most}"
    );
    assert!(
        e.contains(&total.to_string()) && e.contains("per entry"),
        "{e}"
    );
    // Counters are entries too.
    let e = s.add("counter", 1).unwrap_err().to_string();
    assert!(e.contains("full"), "{e}");
    assert!(s.delete("t0").unwrap());
    assert_eq!(s.add("counter", 1).unwrap(), 1);
}

#[test]
fn a_name_of_every_interface_is_refused_on_every_rank() {
    for (var, host) in [
        ("MASTER_ADDR", "0"),
        ("MASTER_ADDR", "0.0.0.0"),
        ("MASTER_ADDR", "::"),
        ("FERROCOMM_STORE_ADDR", "0.0.0.0"),
    ] {
        let c = cfg(&[
            (var, host.to_string()),
            ("MASTER_PORT", free_port().to_string()),
            ("FERROCOMM_TIMEOUT_S", "2".into()),
        ]);
        for rank in [0, 1] {
            match connect_from_env(&c, rank, 2) {
                Err(Error::BadEnv { var: v, value, why }) => {
                    assert_eq!((v, value.as_str()), (var, host));
                    assert!(why.contains("every interface"), "{why}");
                }
                Err(e) => panic!("{var}={host}, rank {rank}: {e}"),
                Ok(_) => panic!("{var}={host}, rank {rank}: connected"),
            }
        }
    }
    let e = TcpStoreServer::bind("0.0.0.0", 0, &key()).err().unwrap();
    assert!(e.to_string().contains("every interface"), "{e}");
}

/// Whether this machine has IPv6 loopback (a listener can bind `[::1]`).
fn ipv6_loopback() -> bool {
    TcpListener::bind("[::1]:0").is_ok()
}

#[test]
fn a_squatter_on_one_address_of_the_name_is_an_error_never_a_fallback() {
    let port = free_port();
    let v4: SocketAddr = ([127, 0, 0, 1], port).into();
    let v6: SocketAddr = (std::net::Ipv6Addr::LOCALHOST, port).into();
    if !ipv6_loopback() {
        // Without IPv6 loopback no process can listen on [::1], the squatter included: the
        // server takes 127.0.0.1 alone, and a client trying [::1] reaches no one.
        let srv =
            TcpStoreServer::bind_addrs("localhost", &[v6, v4], &key(), Default::default()).unwrap();
        assert_eq!(srv.local_addrs(), vec![v4]);
        assert!(TcpStream::connect(v6).is_err());
        eprintln!("no IPv6 loopback: checked that [::1] is skipped and unreachable");
        return;
    }
    // A stranger listens on [::1]:port before rank 0 starts; the name rank 0 was given
    // resolves to [::1] and 127.0.0.1, as localhost does with the usual `::1 localhost` line.
    let squatter = TcpListener::bind(v6).unwrap();
    let e = TcpStoreServer::bind_addrs("localhost", &[v6, v4], &key(), Default::default())
        .err()
        .expect("rank 0 listened beside a squatter");
    let e = e.to_string();
    assert!(
        e.contains(&v6.to_string()) && e.contains("localhost"),
        "{e}"
    );
    drop(squatter);
    // Unsquatted, both addresses are served: a client may try either.
    let srv =
        TcpStoreServer::bind_addrs("localhost", &[v6, v4], &key(), Default::default()).unwrap();
    assert_eq!(srv.local_addrs(), vec![v6, v4]);
    for host in ["::1", "127.0.0.1"] {
        let s = TcpStore::connect(host, port, &key(), T).unwrap();
        s.set(&format!("from {host}"), b"1").unwrap();
    }
    let s = TcpStore::connect("127.0.0.1", port, &key(), T).unwrap();
    assert!(s.check("from ::1").unwrap() && s.check("from 127.0.0.1").unwrap());
    drop(srv);

    // End to end, as a job runs: rank 0 given MASTER_ADDR=localhost on a machine whose
    // /etc/hosts lists localhost as ::1 and 127.0.0.1. That needs a private mount namespace
    // (to give this rank such an /etc/hosts); where `unshare` cannot make one, the checks above
    // are the test.
    let squatter = TcpListener::bind(v6).unwrap();
    match rank0_with_dual_stack_localhost(port) {
        None => eprintln!("no private mount namespace here: checked through bind_addrs only"),
        Some(out) => assert!(
            out.contains("RANK0 REFUSED") && out.contains(&v6.to_string()),
            "{out}"
        ),
    }
    drop(squatter);
}

/// Runs `dual_stack_rank0` in a private mount namespace whose /etc/hosts says localhost is
/// ::1 and 127.0.0.1; its output, or `None` where no such namespace can be made.
fn rank0_with_dual_stack_localhost(port: u16) -> Option<String> {
    let hosts = std::env::temp_dir().join(format!("ferrocomm-hosts-{}", std::process::id()));
    std::fs::write(&hosts, "::1 localhost\n127.0.0.1 localhost\n").unwrap();
    let exe = std::env::current_exe().unwrap();
    let script = "mount --bind \"$1\" /etc/hosts && exec \"$2\" --exact dual_stack_rank0 \
                  --ignored --nocapture";
    // As root a mount namespace alone; otherwise a user namespace maps this user to root.
    let root = rustix::process::getuid().is_root();
    let mut cmd = Command::new("unshare");
    cmd.arg("--mount");
    if !root {
        cmd.arg("--map-root-user");
    }
    let out = cmd
        .args(["sh", "-c", script, "sh"])
        .arg(&hosts)
        .arg(&exe)
        .env("FERROCOMM_TEST_PORT", port.to_string())
        .output();
    let _ = std::fs::remove_file(&hosts);
    let out = out.ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.contains("RANK0 STARTED").then_some(text)
}

#[test]
#[ignore = "entry point of the rank 0 that a test starts in a private mount namespace"]
fn dual_stack_rank0() {
    let port = std::env::var("FERROCOMM_TEST_PORT").unwrap();
    let resolved: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(&("localhost", 1))
        .unwrap()
        .collect();
    assert!(
        resolved.len() >= 2,
        "localhost resolves to {resolved:?} only"
    );
    println!("RANK0 STARTED");
    let c = cfg(&[
        ("MASTER_ADDR", "localhost".into()),
        ("MASTER_PORT", port),
        ("FERROCOMM_TIMEOUT_S", "5".into()),
    ]);
    match connect_from_env(&c, 0, 2) {
        Ok(_) => println!("RANK0 SERVED (it listened beside the squatter)"),
        Err(e) => println!("RANK0 REFUSED: {e}"),
    }
}
