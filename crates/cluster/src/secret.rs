//! The cluster secret, and the proofs that authenticate the two ends of a
//! peer connection with it.
//!
//! Job: keep the 32-byte secret every node of a cluster shares (read from a
//! file only its user can read, never stored in etcd), and compute and check
//! the HMAC-SHA256 proofs of the peer handshake (`peer`): the acceptor proves
//! itself in its Hello, the dialer in the `Auth` frame after it, each over
//! both Hellos — so both nonces — and its own role, so no proof can be
//! replayed on another connection or reflected back to its sender.
//!
//! Invariants:
//! - the secret file is refused unless only its owner may read it (mode
//!   0600 or stricter), and a missing one is created with a fresh random
//!   secret in mode 0600;
//! - proofs are compared in constant time;
//! - the secret never appears in logs or `Debug` output.

use basalt_peer_wire::{NONCE_LEN, PROOF_LEN};
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Bytes of the secret.
pub const SECRET_LEN: usize = 32;

/// The secret every node of a cluster shares.
#[derive(Clone)]
pub struct ClusterSecret([u8; SECRET_LEN]);

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret(…)")
    }
}

/// Why the secret file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("cluster secret file {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("cluster secret file {path} is readable by other users (mode {mode:o}); chmod 600 it")]
    TooOpen { path: String, mode: u32 },
    #[error("cluster secret file {path} holds {len} bytes; it must hold {SECRET_LEN} hex-encoded bytes ({} hex digits)", SECRET_LEN * 2)]
    Malformed { path: String, len: usize },
}

/// Which end of a connection a proof comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Dialer,
    Acceptor,
}

/// What both ends said in their Hellos: the transcript every proof covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HelloFields {
    pub cluster: [u8; 16],
    pub node: u32,
    pub boot: u64,
    pub nonce: [u8; NONCE_LEN],
}

impl ClusterSecret {
    /// A secret from its bytes (tests, and nodes that get it another way).
    pub fn from_bytes(bytes: [u8; SECRET_LEN]) -> ClusterSecret {
        ClusterSecret(bytes)
    }

    /// A fresh random secret.
    pub fn generate() -> ClusterSecret {
        let mut bytes = [0u8; SECRET_LEN];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        ClusterSecret(bytes)
    }

    /// Reads the secret from `path` (hex, one line), or creates the file
    /// with a fresh secret if it does not exist; the bool says whether it
    /// was created (the other nodes need a copy). Creation is atomic (a
    /// complete temporary file linked into place), so nodes started
    /// together on one file agree on one secret and never read half of it.
    pub fn load_or_create(path: &Path) -> Result<(ClusterSecret, bool), SecretError> {
        let shown = path.display().to_string();
        let io = |source| SecretError::Io {
            path: shown.clone(),
            source,
        };
        if !path.exists() {
            let mut tmp = path.as_os_str().to_owned();
            tmp.push(format!(".{}.tmp", std::process::id()));
            let tmp = std::path::PathBuf::from(tmp);
            let secret = ClusterSecret::generate();
            let written = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)
                .and_then(|mut file| {
                    file.write_all(format!("{}\n", hex(&secret.0)).as_bytes())?;
                    file.sync_all()
                });
            let linked = written.and_then(|()| fs::hard_link(&tmp, path));
            let _ = fs::remove_file(&tmp);
            match linked {
                Ok(()) => return Ok((secret, true)),
                // Another node created it meanwhile: use theirs.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io(e)),
            }
        }
        let mode = fs::metadata(path).map_err(io)?.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(SecretError::TooOpen { path: shown, mode });
        }
        let text = fs::read_to_string(path).map_err(io)?;
        let bytes = unhex(text.trim()).filter(|b| b.len() == SECRET_LEN);
        match bytes.and_then(|b| <[u8; SECRET_LEN]>::try_from(b).ok()) {
            Some(b) => Ok((ClusterSecret(b), false)),
            None => Err(SecretError::Malformed {
                path: shown,
                len: text.trim().len() / 2,
            }),
        }
    }

    fn mac(&self, role: Role, dialer: &HelloFields, acceptor: &HelloFields) -> Hmac<Sha256> {
        // HMAC takes keys of any length; 32 bytes never fails.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
        mac.update(b"basalt peer handshake v5\0");
        mac.update(match role {
            Role::Dialer => b"dialer\0",
            Role::Acceptor => b"accept\0",
        });
        for h in [dialer, acceptor] {
            mac.update(&h.cluster);
            mac.update(&h.node.to_le_bytes());
            mac.update(&h.boot.to_le_bytes());
            mac.update(&h.nonce);
        }
        mac
    }

    /// The proof `role` sends over the two Hellos.
    pub fn proof(
        &self,
        role: Role,
        dialer: &HelloFields,
        acceptor: &HelloFields,
    ) -> [u8; PROOF_LEN] {
        self.mac(role, dialer, acceptor)
            .finalize()
            .into_bytes()
            .into()
    }

    /// Whether `proof` is `role`'s proof over the two Hellos (constant time).
    pub fn verify(
        &self,
        role: Role,
        dialer: &HelloFields,
        acceptor: &HelloFields,
        proof: &[u8; PROOF_LEN],
    ) -> bool {
        self.mac(role, dialer, acceptor).verify_slice(proof).is_ok()
    }
}

/// A fresh nonce for a Hello.
pub fn nonce() -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    rand::rngs::OsRng.fill_bytes(&mut n);
    n
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(node: u32, nonce: u8) -> HelloFields {
        HelloFields {
            cluster: [7; 16],
            node,
            boot: 3,
            nonce: [nonce; NONCE_LEN],
        }
    }

    #[test]
    fn proofs_bind_the_secret_the_role_and_both_nonces() {
        let s = ClusterSecret::from_bytes([1; SECRET_LEN]);
        let (d, a) = (hello(1, 0xd), hello(2, 0xa));
        let p = s.proof(Role::Acceptor, &d, &a);
        assert!(s.verify(Role::Acceptor, &d, &a, &p));
        // Another secret, the other role (a reflected proof), or another
        // connection's nonce: refused.
        assert!(!ClusterSecret::from_bytes([2; SECRET_LEN]).verify(Role::Acceptor, &d, &a, &p));
        assert!(!s.verify(Role::Dialer, &d, &a, &p));
        assert!(!s.verify(Role::Acceptor, &hello(1, 0xe), &a, &p));
        assert!(!s.verify(Role::Acceptor, &d, &hello(2, 0xb), &p));
    }

    #[test]
    fn the_file_is_created_private_and_refused_when_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        let (a, created) = ClusterSecret::load_or_create(&path).unwrap();
        assert!(created);
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let (b, created) = ClusterSecret::load_or_create(&path).unwrap();
        assert!(!created);
        assert_eq!(a.0, b.0);
        assert_eq!(format!("{a:?}"), "ClusterSecret(…)");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let err = ClusterSecret::load_or_create(&path)
            .unwrap_err()
            .to_string();
        assert!(err.contains("chmod 600"), "{err}");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        fs::write(&path, "abcd\n").unwrap();
        let err = ClusterSecret::load_or_create(&path)
            .unwrap_err()
            .to_string();
        assert!(err.contains("64 hex digits"), "{err}");
    }
}
