//! Shared by the TCP store's integration tests: the secret their servers and clients hold, a
//! free port, and a configuration read from given settings with that secret.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::TcpListener;

use ferrocomm::bootstrap::StoreKey;
use ferrocomm::Config;

/// The store secret of these tests (FERROCOMM_STORE_SECRET unless a test sets another).
pub const SECRET: &str = "the tcp store tests' secret";

/// The key of [`SECRET`], which every test's server and clients (and children) hold.
pub fn key() -> StoreKey {
    StoreKey::from_secret(SECRET)
}

/// A port nothing listens on at the moment of asking.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The configuration of the settings `pairs` (name, value) and nothing else of the
/// environment, with FERROCOMM_STORE_SECRET at [`SECRET`] unless `pairs` sets it.
pub fn cfg(pairs: &[(&str, String)]) -> Config {
    let mut m: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    m.entry("FERROCOMM_STORE_SECRET".into())
        .or_insert_with(|| SECRET.into());
    Config::from_lookup(move |k| m.get(k).cloned()).unwrap()
}
