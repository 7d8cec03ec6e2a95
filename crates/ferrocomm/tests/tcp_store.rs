//! The TCP store across threads and across real processes.
//!
//! Cross-process tests start this test binary again as the child, running only the ignored
//! `child_process` test with a role in `FERROCOMM_TEST_CHILD_ROLE`.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use ferrocomm::bootstrap::{
    all_gather_bytes, connect_from_env, store_barrier, PrefixStore, Store, TcpStore,
    TcpStoreServer, MAX_VALUE,
};
use ferrocomm::Error;

mod store_support;
use store_support::{cfg, free_port, key};

mod thread_state;

const ROLE: &str = "FERROCOMM_TEST_CHILD_ROLE";
const T: Duration = Duration::from_secs(10);

fn spawn_child(role: &str, env: &[(&str, String)]) -> Child {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", "child_process", "--ignored", "--nocapture"])
        .env(ROLE, role)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    c.spawn().unwrap()
}

fn wait_child(mut c: Child, limit: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(st) = c.try_wait().unwrap() {
            return st;
        }
        if start.elapsed() > limit {
            let _ = c.kill();
            panic!("child did not finish within {limit:?}");
        }
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
#[ignore = "entry point of the child processes that the other tests start"]
fn child_process() {
    let role = std::env::var(ROLE).expect("started by a test with FERROCOMM_TEST_CHILD_ROLE set");
    let var = |k: &str| std::env::var(k).unwrap();
    match role.as_str() {
        // One rank of a gather over a server the parent hosts.
        "rank" => {
            let port: u16 = var("TEST_PORT").parse().unwrap();
            let rank: usize = var("TEST_RANK").parse().unwrap();
            let world: usize = var("TEST_WORLD").parse().unwrap();
            let s = TcpStore::connect("127.0.0.1", port, &key(), T).unwrap();
            s.add("arrivals", 10 + rank as i64).unwrap();
            store_barrier(&s, "start", world, T).unwrap();
            let payload = format!("payload of rank {rank}").into_bytes();
            let all = all_gather_bytes(&s, "g", rank, world, &payload, T).unwrap();
            for (r, v) in all.iter().enumerate() {
                assert_eq!(v, format!("payload of rank {r}").as_bytes());
            }
            s.set(&format!("done/{rank}"), &[rank as u8 * 7 + 1])
                .unwrap();
        }
        // A server that reports its port and lives until killed (or until the test that
        // started it closes its stdin, by ending).
        "server" => {
            let srv = TcpStoreServer::bind("127.0.0.1", 0, &key()).unwrap();
            println!("PORT {}", srv.port());
            let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
            drop(srv);
        }
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn set_get_check_add_delete() {
    let srv = TcpStoreServer::bind("127.0.0.1", 0, &key()).unwrap();
    assert_ne!(srv.port(), 0);
    let s = TcpStore::connect("127.0.0.1", srv.port(), &key(), T).unwrap();
    assert!(!s.check("k").unwrap());
    s.set("k", b"\x00value\xff").unwrap();
    assert!(s.check("k").unwrap());
    assert_eq!(s.get("k", T).unwrap(), b"\x00value\xff");
    s.set("k", b"second").unwrap();
    assert_eq!(s.get("k", T).unwrap(), b"second");
    assert_eq!(s.add("c", 5).unwrap(), 5);
    assert_eq!(s.add("c", -7).unwrap(), -2);
    // Counters are decimal text, readable by get.
    assert_eq!(s.get("c", T).unwrap(), b"-2");
    s.set("n", b"41").unwrap();
    assert_eq!(s.add("n", 1).unwrap(), 42);
    let e = s.add("k", 1).unwrap_err().to_string();
    assert!(e.contains("not an integer"), "{e}");
    assert!(s.delete("k").unwrap());
    assert!(!s.delete("k").unwrap());
    assert!(!s.check("k").unwrap());
    // Empty and the largest values round-trip.
    s.set("empty", b"").unwrap();
    assert_eq!(s.get("empty", T).unwrap(), b"");
    let big: Vec<u8> = (0..MAX_VALUE as u32)
        .map(|i| i.wrapping_mul(2654435761) as u8)
        .collect();
    s.set("big", &big).unwrap();
    assert_eq!(s.get("big", T).unwrap(), big);
}

#[test]
fn threads_meet_through_the_server() {
    let srv = TcpStoreServer::bind("127.0.0.1", 0, &key()).unwrap();
    let port = srv.port();
    let world = 4;
    let hs: Vec<_> = (0..world)
        .map(|r| {
            thread::spawn(move || {
                let s = TcpStore::connect("127.0.0.1", port, &key(), T).unwrap();
                let n = s.add("count", 1).unwrap();
                store_barrier(&s, "b", world, T).unwrap();
                let all = all_gather_bytes(&s, "g", r, world, &[r as u8, 0xa5], T).unwrap();
                (n, all)
            })
        })
        .collect();
    let mut counts: Vec<i64> = Vec::new();
    for h in hs {
        let (n, all) = h.join().unwrap();
        counts.push(n);
        let want: Vec<Vec<u8>> = (0..world).map(|r| vec![r as u8, 0xa5]).collect();
        assert_eq!(all, want);
    }
    counts.sort();
    assert_eq!(counts, vec![1, 2, 3, 4]);
}

#[test]
fn one_client_shared_by_threads_does_not_block_on_a_waiting_get() {
    let srv = TcpStoreServer::bind("127.0.0.1", 0, &key()).unwrap();
    let s = Arc::new(TcpStore::connect("127.0.0.1", srv.port(), &key(), T).unwrap());
    let s2 = s.clone();
    let (tid_tx, tid) = std::sync::mpsc::channel();
    let waiter = thread::spawn(move || {
        tid_tx.send(thread_state::id()).unwrap();
        s2.get("late", T).unwrap()
    });
    let tid = tid.recv().unwrap();
    thread_state::wait_until_asleep(tid, "the get waiting for its key");
    // This set goes over a second connection while the first waits in get.
    s.set("late", b"here").unwrap();
    assert_eq!(waiter.join().unwrap(), b"here");
    s.wait(&["late"], T).unwrap();
}

#[test]
fn get_times_out_with_the_key() {
    let srv = TcpStoreServer::bind("127.0.0.1", 0, &key()).unwrap();
    let s = TcpStore::connect("127.0.0.1", srv.port(), &key(), T).unwrap();
    let t0 = Instant::now();
    match s.get("never", Duration::from_millis(200)) {
        Err(Error::StoreTimeout { key, timeout }) => {
            assert_eq!(key, "never");
            assert_eq!(timeout, Duration::from_millis(200));
        }
        other => panic!("expected a store timeout, got {other:?}"),
    }
    // The bound is the behaviour under test: the get waited its whole timeout.
    assert!(t0.elapsed() >= Duration::from_millis(200));
    // The connection stays usable after a timeout.
    s.set("after", b"1").unwrap();
    assert_eq!(s.get("after", T).unwrap(), b"1");
}

#[test]
fn nobody_listening_fails_clearly_within_the_deadline() {
    let port = free_port();
    let t0 = Instant::now();
    let e = match TcpStore::connect("127.0.0.1", port, &key(), Duration::from_millis(600)) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("connected to a port nobody listens on"),
    };
    let took = t0.elapsed();
    assert!(e.contains(&format!("127.0.0.1:{port}")), "{e}");
    assert!(e.contains("could not connect"), "{e}");
    // The bounds are the behaviour under test: the whole deadline is used, and not much
    // more (5 s leaves room for two loaded cores).
    assert!(
        took >= Duration::from_millis(600),
        "gave up early: {took:?}"
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[test]
fn clients_may_start_before_the_server() {
    let port = free_port();
    let (tid_tx, tid) = std::sync::mpsc::channel();
    let client = thread::spawn(move || {
        tid_tx.send(thread_state::id()).unwrap();
        let s = TcpStore::connect("127.0.0.1", port, &key(), T).unwrap();
        s.get("k", T).unwrap()
    });
    // The client has been refused at least once and waits to try again.
    thread_state::wait_until_asleep(tid.recv().unwrap(), "the client's pause between attempts");
    let srv = TcpStoreServer::bind("127.0.0.1", port, &key()).unwrap();
    let s = TcpStore::connect("127.0.0.1", srv.port(), &key(), T).unwrap();
    s.set("k", b"v").unwrap();
    assert_eq!(client.join().unwrap(), b"v");
}

#[test]
fn another_service_on_the_port_is_rejected() {
    use std::io::{Read, Write};
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let t = thread::spawn(move || {
        let (mut c, _) = l.accept().unwrap();
        let mut hello = [0u8; 36];
        c.read_exact(&mut hello).unwrap();
        let _ = c.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n....");
    });
    let e = match TcpStore::connect("127.0.0.1", port, &key(), T) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("accepted a service that is not a store"),
    };
    assert!(e.contains("not a ferrocomm store"), "{e}");
    t.join().unwrap();
}

#[test]
fn a_service_that_hangs_up_gives_no_handshake_reply() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let t = thread::spawn(move || {
        // Every connection closed at once, as a server at its connection limit does.
        for c in l.incoming() {
            drop(c);
            if stop2.load(std::sync::atomic::Ordering::Acquire) {
                return;
            }
        }
    });
    let e = match TcpStore::connect("127.0.0.1", port, &key(), Duration::from_millis(300)) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("connected to a service that hangs up"),
    };
    // One more connection wakes the accepting thread to see the stop.
    stop.store(true, std::sync::atomic::Ordering::Release);
    drop(std::net::TcpStream::connect(("127.0.0.1", port)).unwrap());
    t.join().unwrap();
    assert!(e.contains("no handshake reply"), "{e}");
    assert!(!e.contains("not a ferrocomm store"), "{e}");
}

/// A thread of `s` waiting in a get of a key nobody sets (60 s), asleep in it when this
/// returns; it ends with the get's result and how long it took.
fn waiting_get(s: &Arc<TcpStore>) -> thread::JoinHandle<(ferrocomm::Result<Vec<u8>>, Duration)> {
    let s2 = s.clone();
    let (tid_tx, tid) = std::sync::mpsc::channel();
    let waiter = thread::spawn(move || {
        tid_tx.send(thread_state::id()).unwrap();
        let t0 = Instant::now();
        (s2.get("never", Duration::from_secs(60)), t0.elapsed())
    });
    thread_state::wait_until_asleep(tid.recv().unwrap(), "the get waiting for its key");
    waiter
}

#[test]
fn dropped_server_fails_waiting_and_later_calls() {
    let srv = TcpStoreServer::bind("127.0.0.1", 0, &key()).unwrap();
    let addr = format!("127.0.0.1:{}", srv.port());
    let s = Arc::new(TcpStore::connect("127.0.0.1", srv.port(), &key(), T).unwrap());
    s.set("a", b"1").unwrap();
    let waiter = waiting_get(&s);
    drop(srv);
    let (r, took) = waiter.join().unwrap();
    let e = r.unwrap_err().to_string();
    assert!(e.contains("went away") && e.contains(&addr), "{e}");
    // The bound is the behaviour under test: at once, not after the get's 60 s (30 s leaves
    // room for two loaded cores).
    assert!(took < Duration::from_secs(30), "took {took:?}");
    let e = s.set("b", b"2").unwrap_err().to_string();
    assert!(e.contains("went away") && e.contains(&addr), "{e}");
}

#[test]
fn prefixes_share_one_server_without_colliding() {
    let srv = TcpStoreServer::bind("127.0.0.1", 0, &key()).unwrap();
    let inner: Arc<dyn Store> =
        Arc::new(TcpStore::connect("127.0.0.1", srv.port(), &key(), T).unwrap());
    let a = PrefixStore::new("comm_a", inner.clone());
    let b = PrefixStore::new("comm_b", inner.clone());
    a.set("x", b"from a").unwrap();
    b.set("x", b"from b").unwrap();
    assert_eq!(a.add("n", 3).unwrap(), 3);
    assert_eq!(b.add("n", 5).unwrap(), 5);
    assert_eq!(a.get("x", T).unwrap(), b"from a");
    assert_eq!(b.get("x", T).unwrap(), b"from b");
    assert!(a.delete("x").unwrap());
    assert!(!a.check("x").unwrap());
    assert!(b.check("x").unwrap());
    assert_eq!(inner.get("comm_b/n", T).unwrap(), b"5");
}

#[test]
fn processes_meet_through_the_server() {
    let srv = TcpStoreServer::bind("127.0.0.1", 0, &key()).unwrap();
    let world = 3;
    let kids: Vec<Child> = (0..world)
        .map(|r| {
            spawn_child(
                "rank",
                &[
                    ("TEST_PORT", srv.port().to_string()),
                    ("TEST_RANK", r.to_string()),
                    ("TEST_WORLD", world.to_string()),
                ],
            )
        })
        .collect();
    for k in kids {
        assert!(wait_child(k, Duration::from_secs(30)).success());
    }
    let s = TcpStore::connect("127.0.0.1", srv.port(), &key(), T).unwrap();
    // 10 + 11 + 12 from the three ranks.
    assert_eq!(s.add("arrivals", 0).unwrap(), 33);
    for r in 0..world {
        assert_eq!(
            s.get(&format!("done/{r}"), T).unwrap(),
            vec![r as u8 * 7 + 1]
        );
        assert_eq!(
            s.get(&format!("g/{r}"), T).unwrap(),
            format!("payload of rank {r}").as_bytes()
        );
    }
}

#[test]
fn killed_server_process_fails_the_client_promptly() {
    let mut child = spawn_child("server", &[]);
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let port: u16 = loop {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "child exited early");
        if let Some(p) = line.trim().strip_prefix("PORT ") {
            break p.parse().unwrap();
        }
    };
    let s = Arc::new(TcpStore::connect("127.0.0.1", port, &key(), T).unwrap());
    s.set("k", b"v").unwrap();
    assert_eq!(s.get("k", T).unwrap(), b"v");
    let waiter = waiting_get(&s);
    child.kill().unwrap();
    child.wait().unwrap();
    let (r, took) = waiter.join().unwrap();
    let e = r.unwrap_err().to_string();
    assert!(e.contains("went away"), "{e}");
    // The bound is the behaviour under test: at once, not after the get's 60 s (30 s leaves
    // room for two loaded cores).
    assert!(took < Duration::from_secs(30), "took {took:?}");
    let e = s.check("k").unwrap_err().to_string();
    assert!(e.contains(&format!("127.0.0.1:{port}")), "{e}");
}

#[test]
fn connect_from_env_rank0_hosts_one_server_per_process() {
    let port = free_port();
    let c = cfg(&[
        ("MASTER_ADDR", "127.0.0.1".into()),
        ("MASTER_PORT", port.to_string()),
        ("FERROCOMM_TIMEOUT_S", "10".into()),
    ]);
    let world = 3;
    let (tid_tx, tids) = std::sync::mpsc::channel();
    let hs: Vec<_> = (1..world)
        .map(|r| {
            let (c, tid_tx) = (c.clone(), tid_tx.clone());
            thread::spawn(move || {
                tid_tx.send(thread_state::id()).unwrap();
                let s = connect_from_env(&c, r, world).unwrap();
                all_gather_bytes(&*s, "env", r, world, &[r as u8 + 100], T).unwrap()
            })
        })
        .collect();
    // Ranks 1 and 2 try rank 0's server before it exists.
    for tid in tids.iter().take(world - 1) {
        thread_state::wait_until_asleep(tid, "a rank's pause between attempts to connect");
    }
    let s0 = connect_from_env(&c, 0, world).unwrap();
    let got0 = all_gather_bytes(&*s0, "env", 0, world, &[100], T).unwrap();
    assert_eq!(got0, vec![vec![100], vec![101], vec![102]]);
    for h in hs {
        assert_eq!(h.join().unwrap(), got0);
    }
    // A second communicator in this process reuses the server (binding again would fail).
    let again = connect_from_env(&c, 0, world).unwrap();
    assert_eq!(again.get("env/2", T).unwrap(), vec![102]);
}

/// A port held by a listener (the torchrun agent's store) whose next port was free a moment
/// ago. Other processes on the machine take ports too: a pair found free can lose its second
/// port before the store binds it, so the caller retries on another pair.
fn agent_port_with_a_free_next() -> (TcpListener, u16) {
    for _ in 0..1000 {
        let agent = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = agent.local_addr().unwrap().port();
        if port < u16::MAX && TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            return (agent, port);
        }
    }
    panic!("no free port with a free next port in 1000 tries");
}

#[test]
fn connect_from_env_uses_the_next_port_under_torchrun_and_names_missing_port() {
    // The torchrun agent's store holds MASTER_PORT; ours must not touch it.
    let mut tries = 0;
    let (agent, port, s) = loop {
        let (agent, port) = agent_port_with_a_free_next();
        let c = cfg(&[
            ("MASTER_PORT", port.to_string()),
            ("TORCHELASTIC_RUN_ID", "job".into()),
            ("FERROCOMM_TIMEOUT_S", "5".into()),
        ]);
        match connect_from_env(&c, 0, 1) {
            Ok(s) => break (agent, port, s),
            // Taken by another process between the check and the bind: another pair.
            Err(Error::Io { source, .. })
                if source.kind() == std::io::ErrorKind::AddrInUse && tries < 20 =>
            {
                tries += 1
            }
            Err(e) => panic!("store on the port after MASTER_PORT: {e}"),
        }
    };
    s.set("k", b"v").unwrap();
    let direct = TcpStore::connect("127.0.0.1", port + 1, &key(), T).unwrap();
    assert_eq!(direct.get("k", T).unwrap(), b"v");
    drop(agent);

    match connect_from_env(&cfg(&[]), 1, 2) {
        Err(Error::MissingEnv { var, .. }) => assert_eq!(var, "MASTER_PORT"),
        Err(e) => panic!("expected a missing MASTER_PORT, got {e}"),
        Ok(_) => panic!("connected without a port"),
    }
}

#[test]
fn rank0_listens_on_master_addr_alone() {
    // 127.0.0.2 is loopback too, but another address: a server bound to it (not to 0.0.0.0)
    // refuses connections to 127.0.0.1.
    let port = free_port();
    let c = cfg(&[
        ("MASTER_ADDR", "127.0.0.2".into()),
        ("MASTER_PORT", port.to_string()),
        ("FERROCOMM_TIMEOUT_S", "5".into()),
    ]);
    let s = connect_from_env(&c, 0, 1).unwrap();
    s.set("k", b"v").unwrap();
    let there = TcpStore::connect("127.0.0.2", port, &key(), T).unwrap();
    assert_eq!(there.get("k", T).unwrap(), b"v");
    let e = match TcpStore::connect("127.0.0.1", port, &key(), Duration::from_millis(300)) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("the server listens beyond MASTER_ADDR"),
    };
    assert!(e.contains("could not connect"), "{e}");
}

#[test]
fn external_store_is_not_started_by_rank0() {
    let srv = TcpStoreServer::bind("127.0.0.1", 0, &key()).unwrap();
    let c = cfg(&[
        ("MASTER_PORT", free_port().to_string()),
        ("FERROCOMM_STORE_PORT", srv.port().to_string()),
        ("FERROCOMM_STORE_EXTERNAL", "1".into()),
        ("FERROCOMM_TIMEOUT_S", "5".into()),
    ]);
    let s0 = connect_from_env(&c, 0, 2).unwrap();
    s0.set("who", b"rank0").unwrap();
    let mine = TcpStore::connect("127.0.0.1", srv.port(), &key(), T).unwrap();
    assert_eq!(mine.get("who", T).unwrap(), b"rank0");
}
