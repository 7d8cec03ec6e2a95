//! The job's store key: where it comes from, the handshake that proves it, and the session
//! keys it yields.
//!
//! Every process of a job derives the same 32-byte key (see [`StoreKey::from_config`]); the
//! store server and its clients prove to each other that they hold it before any request, by
//! HMAC-SHA-256 over fresh random nonces, so that the key itself never travels and an
//! overheard handshake cannot be replayed. Tags are checked in constant time. Each connection
//! then gets keys of its own, derived from the job's key and both nonces (HKDF-SHA-256), which
//! seal everything that follows (`channel.rs`).

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use hkdf::Hkdf;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

use crate::config::Config;
use crate::error::{Error, Result};

/// Bytes of a nonce and of a tag.
pub(super) const NONCE: usize = 32;
pub(super) const TAG: usize = 32;

/// Shortest `FERROCOMM_STORE_SECRET` accepted.
const MIN_SECRET_CHARS: usize = 16;

/// The key a job's store server and clients share (never printed).
#[derive(Clone, PartialEq, Eq)]
pub struct StoreKey([u8; 32]);

impl std::fmt::Debug for StoreKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StoreKey(hidden)")
    }
}

/// A fresh random secret as text (64 hex digits), as `ferrocomm launch` gives its ranks in
/// `FERROCOMM_STORE_SECRET`.
pub fn new_secret() -> String {
    rand::random::<[u8; 32]>()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl StoreKey {
    /// The key of a secret text (every process given the same text derives the same key).
    pub fn from_secret(text: &str) -> StoreKey {
        StoreKey(
            Sha256::new()
                .chain_update(b"ferrocomm store key v1\0")
                .chain_update(text.as_bytes())
                .finalize()
                .into(),
        )
    }

    /// The job's key, from the first of:
    /// 1. `FERROCOMM_STORE_SECRET` (set by `ferrocomm launch`; at least 16 characters);
    /// 2. under torchrun with a run id (`TORCHELASTIC_RUN_ID`, random under `--standalone`):
    ///    the run id with `MASTER_ADDR` and `MASTER_PORT`;
    /// 3. this user's key file (`$XDG_CONFIG_HOME/ferrocomm/store-key`, else
    ///    `~/.config/ferrocomm/store-key`), created with 32 random bytes and mode 0600 on first
    ///    use, mixed with `MASTER_ADDR` and `MASTER_PORT`: the same for every job of this user
    ///    on this host (or on hosts sharing the home directory).
    pub fn from_config(cfg: &Config) -> Result<StoreKey> {
        let l = &cfg.launch;
        if let Some(s) = &l.store_secret {
            if s.0.chars().count() < MIN_SECRET_CHARS {
                return Err(Error::BadEnv {
                    var: "FERROCOMM_STORE_SECRET",
                    value: "(hidden)".into(),
                    why: format!("must have at least {MIN_SECRET_CHARS} characters"),
                });
            }
            return Ok(StoreKey::from_secret(&s.0));
        }
        let addr = l.master_addr.as_deref().unwrap_or("");
        let port = l.master_port.map(|p| p.to_string()).unwrap_or_default();
        if let Some(run) = l
            .run_id
            .as_deref()
            .filter(|r| !r.is_empty() && *r != "none")
        {
            return Ok(StoreKey::from_secret(&format!(
                "torchrun\0{run}\0{addr}\0{port}"
            )));
        }
        let Some(path) = &cfg.store_key_file else {
            return Err(Error::MissingEnv {
                var: "FERROCOMM_STORE_SECRET",
                why: "the bootstrap store needs a secret shared by the job's processes; set \
                      FERROCOMM_STORE_SECRET (or HOME, for a per-user key file), or start with \
                      ferrocomm launch or torchrun --standalone"
                    .into(),
            });
        };
        let file = read_key_file(path)?;
        let hex: String = file.iter().map(|b| format!("{b:02x}")).collect();
        Ok(StoreKey::from_secret(&format!(
            "keyfile\0{hex}\0{addr}\0{port}"
        )))
    }

    fn mac(&self, label: &[u8], first: &[u8], second: &[u8]) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0)
            .expect("HMAC takes keys of any length");
        m.update(label);
        m.update(first);
        m.update(second);
        m
    }

    /// The tag proving the key to the peer that sent `theirs`, over both nonces (`label`
    /// says which side speaks, so one side's tag never passes as the other's).
    pub(super) fn tag(&self, label: &[u8], theirs: &[u8], mine: &[u8]) -> [u8; TAG] {
        self.mac(label, theirs, mine).finalize().into_bytes().into()
    }

    /// Whether `tag` is the peer's proof over (our nonce, its nonce); constant time.
    pub(super) fn verify(&self, label: &[u8], mine: &[u8], theirs: &[u8], tag: &[u8]) -> bool {
        self.mac(label, mine, theirs).verify_slice(tag).is_ok()
    }

    /// The keys of one connection, (client to server, server to client), from the job's key
    /// and the handshake's nonces: fresh for every connection (both sides' nonces are random),
    /// and one per direction so that a frame reflected back to its sender never opens.
    pub(super) fn session_keys(
        &self,
        client_nonce: &[u8],
        server_nonce: &[u8],
    ) -> ([u8; 32], [u8; 32]) {
        let mut salt = Vec::with_capacity(client_nonce.len() + server_nonce.len());
        salt.extend_from_slice(client_nonce);
        salt.extend_from_slice(server_nonce);
        let kdf = Hkdf::<Sha256>::new(Some(&salt), &self.0);
        let (mut up, mut down) = ([0u8; 32], [0u8; 32]);
        // 32 bytes are far below HKDF-SHA-256's limit of 255 * 32.
        kdf.expand(b"ferrocomm store v3 client to server", &mut up)
            .expect("32 bytes of HKDF output");
        kdf.expand(b"ferrocomm store v3 server to client", &mut down)
            .expect("32 bytes of HKDF output");
        (up, down)
    }
}

/// Reads (creating it on first use) this user's key file: 32 bytes, owned by this user, mode
/// 0600, else an error naming the file.
fn read_key_file(path: &Path) -> Result<[u8; 32]> {
    let name = path.display();
    if !path.exists() {
        create_key_file(path)?;
    }
    let mut f = File::open(path).map_err(|e| Error::io(format!("store key: opening {name}"), e))?;
    let meta = f
        .metadata()
        .map_err(|e| Error::io(format!("store key: fstat of {name}"), e))?;
    let uid = rustix::process::getuid().as_raw();
    if meta.uid() != uid || meta.mode() & 0o077 != 0 || !meta.is_file() {
        return Err(Error::InvalidArgument(format!(
            "store key: {name} must be a file of this user (uid {uid}) readable by no one else \
             (mode 0600), but has uid {} and mode {:o}; remove it or set FERROCOMM_STORE_SECRET",
            meta.uid(),
            meta.mode() & 0o7777
        )));
    }
    let mut key = [0u8; 32];
    f.read_exact(&mut key).map_err(|e| {
        Error::io(
            format!("store key: reading 32 bytes from {name} (remove it to make a new one)"),
            e,
        )
    })?;
    Ok(key)
}

/// Writes a new key file whole before it appears under its name (a hard link of a complete
/// temporary file), so that ranks starting together never read a partial one; the first rank
/// to link wins and the others read its key.
fn create_key_file(path: &Path) -> Result<()> {
    let name = path.display();
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("store key: creating {}", dir.display()), e))?;
    let tmp = dir.join(format!(
        ".store-key.{}.{:016x}",
        std::process::id(),
        rand::random::<u64>()
    ));
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| {
            f.write_all(&rand::random::<[u8; 32]>())?;
            f.sync_all()
        })
        .and_then(|_| match fs::hard_link(&tmp, path) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
            _ => Ok(()),
        });
    let _ = fs::remove_file(&tmp);
    written.map_err(|e| Error::io(format!("store key: creating {name}"), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_verify_only_with_the_same_key_label_and_nonces() {
        let k = StoreKey::from_secret("a secret of this job");
        let other = StoreKey::from_secret("a secret of another job");
        let (a, b) = ([1u8; NONCE], [2u8; NONCE]);
        let t = k.tag(b"client", &a, &b);
        assert!(k.verify(b"client", &a, &b, &t));
        assert!(!other.verify(b"client", &a, &b, &t));
        assert!(!k.verify(b"server", &a, &b, &t));
        assert!(!k.verify(b"client", &b, &a, &t));
        assert!(!k.verify(b"client", &a, &b, &t[..31]));
        assert_ne!(new_secret(), new_secret());
        assert_eq!(new_secret().len(), 64);
    }

    #[test]
    fn session_keys_differ_by_direction_nonce_and_job() {
        let k = StoreKey::from_secret("a secret of this job");
        let (a, b) = ([1u8; NONCE], [2u8; NONCE]);
        let (up, down) = k.session_keys(&a, &b);
        assert_ne!(up, down);
        assert_eq!(k.session_keys(&a, &b), (up, down));
        assert_ne!(k.session_keys(&b, &a).0, up);
        assert_ne!(k.session_keys(&a, &[3u8; NONCE]).0, up);
        let other = StoreKey::from_secret("a secret of another job");
        assert_ne!(other.session_keys(&a, &b).0, up);
    }

    fn config(pairs: &[(&str, &str)]) -> Result<StoreKey> {
        let m: std::collections::HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        StoreKey::from_config(&Config::from_lookup(|k| m.get(k).cloned())?)
    }

    #[test]
    fn the_key_comes_from_the_secret_then_torchrun_then_the_key_file() {
        let dir = std::env::temp_dir().join(format!("ferrocomm-keyorder-{}", std::process::id()));
        let xdg = dir.display().to_string();
        let secret = "a secret of sixteen or more";
        let port = [("MASTER_ADDR", "10.0.0.1"), ("MASTER_PORT", "29500")];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut v: Vec<(&str, &str)> = port.to_vec();
            v.push(("XDG_CONFIG_HOME", &xdg));
            v.extend_from_slice(extra);
            config(&v)
        };
        let s = with(&[
            ("FERROCOMM_STORE_SECRET", secret),
            ("TORCHELASTIC_RUN_ID", "r1"),
        ]);
        assert_eq!(s.unwrap(), StoreKey::from_secret(secret));
        let r1 = with(&[("TORCHELASTIC_RUN_ID", "r1")]).unwrap();
        assert_ne!(r1, with(&[("TORCHELASTIC_RUN_ID", "r2")]).unwrap());
        assert_ne!(r1, StoreKey::from_secret(secret));
        // No run id ("none" is torchrun's default): this user's key file, one key per port.
        let f1 = with(&[("TORCHELASTIC_RUN_ID", "none")]).unwrap();
        assert_eq!(f1, with(&[]).unwrap());
        assert!(dir.join("ferrocomm").join("store-key").exists());
        let other_port = config(&[("XDG_CONFIG_HOME", &xdg), ("MASTER_PORT", "29501")]);
        assert_ne!(f1, other_port.unwrap());
        // A short secret is refused without showing it; nothing to derive a key from either.
        let e = with(&[("FERROCOMM_STORE_SECRET", "short")]).unwrap_err();
        assert!(
            matches!(
                e,
                Error::BadEnv {
                    var: "FERROCOMM_STORE_SECRET",
                    ..
                }
            ),
            "{e}"
        );
        assert!(!e.to_string().contains("short"), "{e}");
        let e = config(&[("MASTER_PORT", "29500")]).unwrap_err();
        assert!(
            matches!(
                e,
                Error::MissingEnv {
                    var: "FERROCOMM_STORE_SECRET",
                    ..
                }
            ),
            "{e}"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn key_file_is_created_private_and_refused_when_open_to_others() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("ferrocomm-key-{}", std::process::id()));
        let path = dir.join("sub").join("store-key");
        let k1 = read_key_file(&path).unwrap();
        assert_eq!(read_key_file(&path).unwrap(), k1);
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // Ranks starting together all read the one key the first of them wrote.
        let fresh = dir.join("race").join("store-key");
        let keys: Vec<[u8; 32]> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|_| s.spawn(|| read_key_file(&fresh).unwrap()))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(keys.iter().all(|k| *k == keys[0]));
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_key_file(&path).unwrap_err().to_string();
        assert!(e.contains("store-key") && e.contains("644"), "{e}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
