//! The files of a node's data directory and how they are read and written.
//!
//! - `node.json`: which backing the store lives on; written once, after the
//!   store is formatted, so its presence means the node was initialised.
//! - `basalt.data`: the data file (unless the store is on a device).
//! - `catalog.redb`: the catalog.
//! - `api-token`: the admin token, mode 0600, created at first start.
//! - `server.json`: where a running server listens; present only while it
//!   runs (written after both listeners are bound, removed at shutdown).
//!
//! Files other processes read (`node.json`, `server.json`) are replaced
//! atomically (write to a temporary file, then rename).
//!
//! Invariant: once a server has started on it, the directory is 0700 and
//! everything in it 0600 (directories 0700), so no other local user can
//! read a volume's bytes or the credentials (see [`DataDir::create`]).

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Where the store of a node lives.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "backing", rename_all = "lowercase")]
pub enum Backing {
    /// A data file created by basalt.
    File {
        path: PathBuf,
        /// The size the file was created with.
        capacity_bytes: u64,
        preallocated: bool,
    },
    /// A block device (or file) given with `--device`.
    Device { path: PathBuf },
}

impl Backing {
    pub fn path(&self) -> &Path {
        match self {
            Backing::File { path, .. } | Backing::Device { path } => path,
        }
    }
}

/// `node.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeConfig {
    #[serde(flatten)]
    pub backing: Backing,
    /// The store's id, checked at every start so the catalog in this
    /// directory is never reconciled against another store.
    pub store_id: String,
}

/// `server.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServerInfo {
    pub api_url: String,
    /// NBD's TCP address (only with --nbd-insecure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbd: Option<String>,
    /// NBD's TCP address requiring TLS with a pre-shared key (only with
    /// --nbd-listen without --nbd-insecure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbd_tls: Option<String>,
    /// NBD's Unix socket (absent in files of older servers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbd_socket: Option<String>,
    /// NVMe/TCP listen address (absent in files of older servers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvme: Option<String>,
    /// iSCSI portal (absent in files of older servers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iscsi: Option<String>,
    pub pid: u32,
}

impl ServerInfo {
    /// The NBD URIs of `export`: over the Unix socket, then over TCP when
    /// the server serves it (TLS with a key from `basalt nbd-key create`,
    /// whose identity and key file the URI leaves to fill in; or plain with
    /// --nbd-insecure).
    pub fn nbd_uris(&self, export: &str) -> impl Iterator<Item = String> {
        let unix = self
            .nbd_socket
            .as_ref()
            .map(|socket| format!("nbd+unix:///{export}?socket={socket}"));
        let tls = self
            .nbd_tls
            .as_ref()
            .map(|addr| format!("nbds://IDENTITY@{addr}/{export}?tls-psk-file=KEYS.psk"));
        let tcp = self
            .nbd
            .as_ref()
            .map(|addr| format!("nbd://{addr}/{export}"));
        unix.into_iter().chain(tls).chain(tcp)
    }
}

/// A node's data directory.
#[derive(Clone, Debug)]
pub struct DataDir {
    root: PathBuf,
}

impl DataDir {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        DataDir { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn data_file(&self) -> PathBuf {
        self.root.join("basalt.data")
    }

    pub fn catalog(&self) -> PathBuf {
        self.root.join("catalog.redb")
    }

    pub fn node_json(&self) -> PathBuf {
        self.root.join("node.json")
    }

    pub fn api_token(&self) -> PathBuf {
        self.root.join("api-token")
    }

    pub fn server_json(&self) -> PathBuf {
        self.root.join("server.json")
    }

    /// Creates the directory (and parents) if missing, and makes it private:
    /// the directory and every directory under it 0700, every file 0600
    /// (a volume's bytes are in the data file, the admin token in
    /// `api-token`). Modes that allowed more are fixed, each with a log line.
    /// The server also sets its umask to 077 first, so that everything it
    /// creates later (the store, the catalog, logs) is private from birth.
    pub fn create(&self) -> Result<()> {
        fs::create_dir_all(&self.root)
            .with_context(|| format!("cannot create data directory {}", self.root.display()))?;
        make_private(&self.root)
    }

    /// `node.json`, or `None` before the first start.
    pub fn read_node(&self) -> Result<Option<NodeConfig>> {
        read_json(&self.node_json())
    }

    pub fn write_node(&self, node: &NodeConfig) -> Result<()> {
        write_json_atomically(&self.node_json(), node)
    }

    /// `server.json`, or `None` if no server is running on this directory.
    pub fn read_server(&self) -> Result<Option<ServerInfo>> {
        read_json(&self.server_json())
    }

    pub fn write_server(&self, info: &ServerInfo) -> Result<()> {
        write_json_atomically(&self.server_json(), info)
    }

    pub fn remove_server(&self) -> Result<()> {
        match fs::remove_file(self.server_json()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("cannot remove {}", self.server_json().display()))
            }
            _ => Ok(()),
        }
    }

    /// The admin token, read from `api-token`.
    pub fn read_token(&self) -> Result<String> {
        let path = self.api_token();
        let token = fs::read_to_string(&path)
            .with_context(|| format!("cannot read the API token from {}", path.display()))?;
        let token = token.trim().to_string();
        if token.is_empty() {
            bail!("the API token file {} is empty", path.display());
        }
        Ok(token)
    }

    /// The admin token: the one in `api-token`, or a new one (32 random
    /// bytes from the OS, hex) written there with mode 0600.
    pub fn load_or_create_token(&self) -> Result<String> {
        let path = self.api_token();
        let token = new_token()?;
        let created = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path);
        match created {
            Ok(mut file) => {
                file.write_all(format!("{token}\n").as_bytes())
                    .and_then(|()| file.sync_all())
                    .with_context(|| format!("cannot write {}", path.display()))?;
                tracing::info!(path = %path.display(), "generated the admin API token");
                Ok(token)
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let mode = fs::metadata(&path)
                    .with_context(|| format!("cannot stat {}", path.display()))?
                    .permissions()
                    .mode();
                if mode & 0o077 != 0 {
                    tracing::warn!(path = %path.display(), mode = format!("{:o}", mode & 0o777),
                        "the API token file is readable by other users; chmod 600 it");
                }
                self.read_token()
            }
            Err(e) => Err(e).with_context(|| format!("cannot create {}", path.display())),
        }
    }
}

/// Restricts `path` (a directory: 0700; a file: 0600) and, for a
/// directory, everything under it. Symbolic links are left alone (a link
/// in the data directory may point at the store's device, whose mode is
/// the administrator's), and so is a block device given as the store.
fn make_private(path: &Path) -> Result<()> {
    let meta =
        fs::symlink_metadata(path).with_context(|| format!("cannot stat {}", path.display()))?;
    let kind = meta.file_type();
    let want = if kind.is_dir() {
        0o700
    } else if kind.is_file() {
        0o600
    } else {
        return Ok(());
    };
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        let fixed = mode & want;
        fs::set_permissions(path, fs::Permissions::from_mode(fixed))
            .with_context(|| format!("cannot restrict the mode of {}", path.display()))?;
        tracing::warn!(path = %path.display(), from = format!("{mode:o}"), to = format!("{fixed:o}"),
            "data directory entry was readable by other users; restricted it");
    }
    if kind.is_dir() {
        let entries =
            fs::read_dir(path).with_context(|| format!("cannot list {}", path.display()))?;
        for entry in entries {
            let entry = entry.with_context(|| format!("cannot list {}", path.display()))?;
            make_private(&entry.path())?;
        }
    }
    Ok(())
}

/// Makes every file and directory this process creates from now on private
/// to its user (umask 077): the server's data directory holds volume bytes
/// and credentials.
pub fn private_umask() {
    // SAFETY: umask(2) only sets the process's file mode creation mask.
    unsafe { libc::umask(0o077) };
}

/// 32 bytes from the OS random number generator, as 64 hex digits.
fn new_token() -> Result<String> {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng
        .try_fill_bytes(&mut bytes)
        .context("the OS random number generator failed")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Option<T>> {
    match fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .with_context(|| format!("{} is not valid", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

fn write_json_atomically<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let tmp = path.with_extension("json.tmp");
    let mut text = serde_json::to_string_pretty(value).context("cannot encode JSON")?;
    text.push('\n');
    (|| {
        let mut file = fs::File::create(&tmp)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        fs::rename(&tmp, path)
    })()
    .with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_is_created_once_with_private_mode() {
        let dir = tempfile::tempdir().unwrap();
        let data = DataDir::new(dir.path());
        let token = data.load_or_create_token().unwrap();
        assert_eq!(token.len(), 64);
        assert!(token.chars().all(|c| c.is_ascii_hexdigit()));
        let mode = fs::metadata(data.api_token()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(data.load_or_create_token().unwrap(), token, "reused");
        assert_eq!(data.read_token().unwrap(), token);
    }

    #[test]
    fn node_and_server_files_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let data = DataDir::new(dir.path());
        assert!(data.read_node().unwrap().is_none());
        let node = NodeConfig {
            backing: Backing::File {
                path: data.data_file(),
                capacity_bytes: 1 << 30,
                preallocated: false,
            },
            store_id: "s".into(),
        };
        data.write_node(&node).unwrap();
        assert_eq!(data.read_node().unwrap(), Some(node));
        let text = fs::read_to_string(data.node_json()).unwrap();
        assert!(text.contains("\"backing\": \"file\""), "{text}");

        let info = ServerInfo {
            api_url: "http://127.0.0.1:1".into(),
            nbd: Some("127.0.0.1:2".into()),
            nbd_socket: None,
            nbd_tls: None,
            nvme: Some("127.0.0.1:4".into()),
            iscsi: Some("127.0.0.1:5".into()),
            pid: 3,
        };
        data.write_server(&info).unwrap();
        assert_eq!(data.read_server().unwrap(), Some(info));
        data.remove_server().unwrap();
        data.remove_server().unwrap();
        assert!(data.read_server().unwrap().is_none());
    }
}
