//! The master key: 32 random bytes the operator keeps (a file of 64 hex
//! digits, mode 0600, or a command that prints them, so Vault, Barbican or
//! a KMS can hold it), identified by a digest so a store knows which key
//! wrapped each data key.
//!
//! Invariants:
//! - A key file is read only if no one but its owner can read or write it
//!   (mode 0600 or stricter); a missing file is created 0600 with a fresh
//!   key, written and synced before it is used.
//! - The id is a digest of the key under a fixed label, not the key: it
//!   says whether two keys are the same and nothing more.

use aes_kw::KekAes256;
use rand::RngCore;
use sha2::{Digest, Sha256};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

/// Where the server gets its master key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeySource {
    /// A file of 64 hex digits; created with a fresh key if missing.
    File(PathBuf),
    /// A shell command whose standard output is the 64 hex digits.
    Command(String),
}

#[derive(Debug, thiserror::Error)]
pub enum MasterKeyError {
    #[error("master key file {path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("master key file {path} has mode {mode:04o}: it must be readable by its owner only (chmod 600)")]
    Permissions { path: PathBuf, mode: u32 },
    #[error("{what} does not hold a master key: it must be 64 hexadecimal digits (32 bytes)")]
    Malformed { what: String },
    #[error("master key command `{command}` failed: {detail}")]
    Command { command: String, detail: String },
    #[error("the data key was wrapped by master key {wanted:08x}, and this server has master key {have:08x}")]
    WrongMasterKey { wanted: u32, have: u32 },
    #[error("the wrapped data key does not unwrap with this master key (damaged, or wrapped by another key)")]
    Damaged,
    #[error("unknown key suite {0}: written by a newer Basalt")]
    UnknownSuite(u8),
}

/// The master key, in memory only.
pub struct MasterKey {
    key: Zeroizing<[u8; 32]>,
    id: u32,
}

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MasterKey({:08x})", self.id)
    }
}

impl MasterKey {
    pub fn from_bytes(bytes: [u8; 32]) -> MasterKey {
        let key = Zeroizing::new(bytes);
        let mut h = Sha256::new();
        h.update(b"basalt master key id v1\0");
        h.update(&key[..]);
        let d = h.finalize();
        let id = u32::from_be_bytes([d[0], d[1], d[2], d[3]]);
        MasterKey { key, id }
    }

    /// A fresh random key.
    pub fn generate() -> MasterKey {
        let mut k = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut k);
        let m = MasterKey::from_bytes(k);
        k.fill(0);
        m
    }

    /// Which key this is (a digest, safe to log and store).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Parses 64 hex digits (surrounding whitespace ignored).
    pub fn parse(text: &str, what: &str) -> Result<MasterKey, MasterKeyError> {
        let malformed = || MasterKeyError::Malformed { what: what.into() };
        let t = text.trim();
        if t.len() != 64 || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(malformed());
        }
        let mut k = [0u8; 32];
        for (i, out) in k.iter_mut().enumerate() {
            *out = u8::from_str_radix(&t[2 * i..2 * i + 2], 16).map_err(|_| malformed())?;
        }
        let m = MasterKey::from_bytes(k);
        k.fill(0);
        Ok(m)
    }

    /// The key as 64 hex digits and a newline (a key file's content).
    fn to_hex(&self) -> Zeroizing<String> {
        let mut s = Zeroizing::new(String::with_capacity(65));
        for b in self.key.iter() {
            s.push_str(&format!("{b:02x}"));
        }
        s.push('\n');
        s
    }

    /// Loads the key from `source`; a missing key file is created.
    pub fn load(source: &KeySource) -> Result<MasterKey, MasterKeyError> {
        match source {
            KeySource::File(path) => Self::load_or_create_file(path),
            KeySource::Command(cmd) => Self::from_command(cmd),
        }
    }

    /// Reads the key file at `path`, refusing one others can read; a
    /// missing file is created (0600) with a fresh key.
    pub fn load_or_create_file(path: &Path) -> Result<MasterKey, MasterKeyError> {
        let io = |error| MasterKeyError::Io {
            path: path.to_path_buf(),
            error,
        };
        match std::fs::metadata(path) {
            Ok(meta) => {
                let mode = meta.permissions().mode() & 0o7777;
                if mode & 0o077 != 0 {
                    return Err(MasterKeyError::Permissions {
                        path: path.to_path_buf(),
                        mode,
                    });
                }
                let text = Zeroizing::new(std::fs::read_to_string(path).map_err(io)?);
                Self::parse(&text, &format!("master key file {}", path.display()))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key = MasterKey::generate();
                key.write_new_file(path)?;
                Ok(key)
            }
            Err(e) => Err(io(e)),
        }
    }

    /// Writes the key to a new file at `path` (mode 0600, refused if it
    /// exists), synced with its directory before returning.
    pub fn write_new_file(&self, path: &Path) -> Result<(), MasterKeyError> {
        let io = |error| MasterKeyError::Io {
            path: path.to_path_buf(),
            error,
        };
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(io)?;
        f.write_all(self.to_hex().as_bytes()).map_err(io)?;
        f.sync_all().map_err(io)?;
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io)?;
        Ok(())
    }

    /// Runs `command` with `sh -c` and parses what it prints.
    pub fn from_command(command: &str) -> Result<MasterKey, MasterKeyError> {
        let failed = |detail: String| MasterKeyError::Command {
            command: command.into(),
            detail,
        };
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(command)
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .output()
            .map_err(|e| failed(e.to_string()))?;
        let stdout = Zeroizing::new(out.stdout);
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let line = err.lines().next().unwrap_or("").trim();
            return Err(failed(format!("{}: {line}", out.status)));
        }
        let text = Zeroizing::new(String::from_utf8_lossy(&stdout).into_owned());
        Self::parse(&text, &format!("the output of `{command}`"))
    }

    fn kek(&self) -> KekAes256 {
        KekAes256::new(&(*self.key).into())
    }

    pub(crate) fn wrap_blob(&self, plain: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; plain.len() + 8];
        self.kek()
            .wrap(plain, &mut out)
            .expect("a data key is a whole number of 8-byte blocks");
        out
    }

    pub(crate) fn unwrap_blob(&self, blob: &[u8]) -> Result<Vec<u8>, MasterKeyError> {
        if blob.len() < 24 || !blob.len().is_multiple_of(8) {
            return Err(MasterKeyError::Damaged);
        }
        let mut out = vec![0u8; blob.len() - 8];
        self.kek()
            .unwrap(blob, &mut out)
            .map_err(|_| MasterKeyError::Damaged)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_3394_wraps_a_256_bit_key_under_a_256_bit_kek() {
        // RFC 3394 section 4.6.
        let mut kek = [0u8; 32];
        for (i, b) in kek.iter_mut().enumerate() {
            *b = i as u8;
        }
        let hex = |s: &str| -> Vec<u8> {
            (0..s.len() / 2)
                .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
                .collect()
        };
        let plain = hex("00112233445566778899AABBCCDDEEFF000102030405060708090A0B0C0D0E0F");
        let master = MasterKey::from_bytes(kek);
        let wrapped = master.wrap_blob(&plain);
        assert_eq!(
            wrapped,
            hex("28C9F404C4B810F4CBCCB35CFB87F8263F5786E2D80ED326CBC7F0E71A99F43BFB988B9B7A02DD21")
        );
        assert_eq!(master.unwrap_blob(&wrapped).unwrap(), plain);
    }
}
