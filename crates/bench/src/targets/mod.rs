//! Targets: what the bench measures and how fio reaches it — parsing
//! `--target`/`--compare`, starting and stopping the servers the bench runs
//! itself (an ephemeral Basalt server, qemu-nbd, nbdkit, tgtd, and the
//! iSCSI-to-NBD bridge), creating and deleting the Basalt volume, and
//! accounting their CPU time.
//!
//! Invariants:
//! - Every peer the bench starts serves the same kind of backing: a sparse
//!   file of the same size in the same work directory (one filesystem);
//!   tgtd's is preallocated instead of sparse.
//! - iSCSI targets are reached through the bridge: qemu-nbd exporting
//!   QEMU's iSCSI driver (libiscsi) as NBD on a Unix socket, since fio's nbd
//!   engine is the bench's network client. Both iSCSI targets go through the
//!   same bridge; their CPU accounting is the target server's alone.
//! - Processes are only ever signalled by the PID of a child started here;
//!   each runs in its own process group (a Ctrl-C at the terminal reaches
//!   the bench, which stops them in order) and dies with the bench
//!   (PR_SET_PDEATHSIG — SIGKILL for tgtd, which ignores SIGTERM and is
//!   stopped with tgtadm — or nbdkit's `--exit-with-parent`).
//! - A target is usable once `start` returns: fio has read 4 KiB from it
//!   with the engine it will use. `stop` (also on drop) deletes the volume
//!   the bench created and stops the servers it started.

mod checks;
mod iscsi;
mod processes;

use checks::*;
use iscsi::*;
use processes::*;

pub use checks::{check_work_dir, is_loopback_host};
pub use iscsi::{
    tgtadm_argv, tgtadm_setup_args, tgtadm_stop_args, tgtd_args, tgtd_control_number,
    BRIDGE_INITIATOR, TGT_IQN,
};
pub(crate) use processes::ServerProcess;
pub use processes::{cpu_seconds, parse_stat_cpu};

use crate::fio::process::{self, Invocation};
use crate::fio::{jobfile, FileEngine, Fio, TargetIo};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::AtomicBool;
use std::thread;
use std::time::{Duration, Instant};

/// The volume (export) name the bench creates and peers export.
pub const EXPORT: &str = "bench";
/// How long a server gets to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a server gets to exit after SIGTERM before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// The NBD port of a basalt server when only its API URL is known.
const DEFAULT_NBD_PORT: u16 = 10809;
/// How long a tgtadm call may take.
const TOOL_TIMEOUT: Duration = Duration::from_secs(10);

/// The iSCSI target name of a Basalt volume
/// (`basalt_volume::iscsi_target_name`).
pub fn basalt_iqn(volume: &str) -> String {
    format!("iqn.2026-11.io.basalt:volume:{volume}")
}

/// A target as named on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetSpec {
    /// A Basalt volume (ephemeral server, or a running one).
    Basalt,
    /// The ephemeral Basalt server's volume over iSCSI, through the bridge
    /// (qemu-nbd exporting QEMU's libiscsi driver as NBD).
    BasaltIscsi,
    /// qemu-nbd serving a sparse file, started by the bench as its users
    /// start it (no `--shared`: qemu-nbd's default).
    QemuNbd,
    /// The same with `--shared=N` (N: the most connections a cell opens),
    /// as earlier versions of the bench started it: a second row, since
    /// qemu-nbd measured slower that way.
    QemuNbdShared,
    /// nbdkit's file plugin serving a sparse file, started by the bench.
    Nbdkit,
    /// Linux's user-space iSCSI target tgtd serving a preallocated file
    /// (`--bstype rdwr`), started as its users start it, through the bridge.
    Tgt,
    /// fio directly on a sparse file: the physical limit.
    File,
    /// Any NBD URI.
    Nbd(String),
    /// An existing file or block device.
    Path(PathBuf),
}

const VALID_TARGETS: &str = "basalt, basalt-iscsi, qemu-nbd, qemu-nbd-shared, nbdkit, tgt, file, \
     nbd://HOST:PORT/EXPORT, or the path of an existing file or block device";

#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("unknown target {0:?}; targets are: {VALID_TARGETS}")]
    Unknown(String),
    #[error("target {0} is given twice")]
    Duplicate(String),
    #[error("target {0}: no such file or block device")]
    NoSuchPath(PathBuf),
    #[error("target {0} is neither a regular file nor a block device")]
    NotFileOrDevice(PathBuf),
    #[error("target {device} is mounted on {mount}; refusing to write to it")]
    Mounted { device: PathBuf, mount: String },
    #[error("{tool} is not installed (needed for target {tool}); install it with `sudo apt-get install {package}`")]
    ToolMissing {
        tool: &'static str,
        package: &'static str,
    },
    #[error("cannot start {name}: {detail}")]
    StartFailed { name: String, detail: String },
    #[error("target {name} is unreachable: {detail}")]
    Unreachable { name: String, detail: String },
    #[error("the basalt server refused to {action}: {detail}")]
    Api { action: String, detail: String },
    #[error("work directory {0} does not support O_DIRECT (tmpfs before Linux 6.6?); pass --work-dir on another filesystem")]
    NoDirectIo(PathBuf),
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> TargetError {
    let context = context.into();
    move |source| TargetError::Io { context, source }
}

impl TargetSpec {
    pub fn parse(text: &str) -> Result<TargetSpec, TargetError> {
        let text = text.trim();
        Ok(match text {
            "basalt" => TargetSpec::Basalt,
            "basalt-iscsi" => TargetSpec::BasaltIscsi,
            "qemu-nbd" => TargetSpec::QemuNbd,
            "qemu-nbd-shared" => TargetSpec::QemuNbdShared,
            "nbdkit" => TargetSpec::Nbdkit,
            "tgt" => TargetSpec::Tgt,
            "file" => TargetSpec::File,
            _ if text.starts_with("nbd://")
                || text.starts_with("nbds://")
                || text.starts_with("nbd+unix://") =>
            {
                TargetSpec::Nbd(text.to_string())
            }
            _ if text.contains('/') || Path::new(text).exists() => {
                TargetSpec::Path(PathBuf::from(text))
            }
            _ => return Err(TargetError::Unknown(text.to_string())),
        })
    }

    /// Parses a comma-separated list (`--compare`).
    pub fn parse_list(text: &str) -> Result<Vec<TargetSpec>, TargetError> {
        let mut specs: Vec<TargetSpec> = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let spec = TargetSpec::parse(part)?;
            if specs.contains(&spec) {
                return Err(TargetError::Duplicate(spec.name()));
            }
            specs.push(spec);
        }
        if specs.is_empty() {
            return Err(TargetError::Unknown(text.to_string()));
        }
        Ok(specs)
    }

    /// The target's name in results: the keyword, URI or path.
    pub fn name(&self) -> String {
        match self {
            TargetSpec::Basalt => "basalt".into(),
            TargetSpec::BasaltIscsi => "basalt-iscsi".into(),
            TargetSpec::QemuNbd => "qemu-nbd".into(),
            TargetSpec::QemuNbdShared => "qemu-nbd-shared".into(),
            TargetSpec::Nbdkit => "nbdkit".into(),
            TargetSpec::Tgt => "tgt".into(),
            TargetSpec::File => "file".into(),
            TargetSpec::Nbd(uri) => uri.clone(),
            TargetSpec::Path(p) => p.display().to_string(),
        }
    }

    /// Whether the bench creates the target's backing itself (in the work
    /// directory, reachable only from this machine).
    pub fn local_only(&self, basalt: &BasaltServer) -> bool {
        match self {
            TargetSpec::Basalt => matches!(basalt, BasaltServer::Ephemeral { .. }),
            TargetSpec::BasaltIscsi
            | TargetSpec::QemuNbd
            | TargetSpec::QemuNbdShared
            | TargetSpec::Nbdkit
            | TargetSpec::Tgt
            | TargetSpec::File => true,
            TargetSpec::Nbd(_) | TargetSpec::Path(_) => false,
        }
    }

    /// A directory name for the target's raw outputs.
    pub fn slug(&self) -> String {
        match self {
            TargetSpec::Nbd(uri) => format!(
                "nbd-{}",
                sanitize(uri.split_once("://").map_or(uri.as_str(), |(_, r)| r))
            ),
            TargetSpec::Path(p) => format!("path-{}", sanitize(&p.display().to_string())),
            other => other.name(),
        }
    }
}

fn sanitize(text: &str) -> String {
    let s: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    s.trim_matches(|c| c == '_' || c == '.')
        .chars()
        .take(80)
        .collect()
}

/// How the `basalt` target reaches Basalt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BasaltServer {
    /// Start `EXE server` on a temporary data directory, stop it at the end.
    Ephemeral { exe: PathBuf },
    /// A running server, found as the CLI finds it.
    Running {
        api_url: String,
        token: String,
        /// `HOST:PORT` of its NBD listener, when known.
        nbd_address: Option<String>,
    },
}

/// What starting targets needs.
pub struct TargetContext<'a> {
    /// Where backing files and server data go (one filesystem).
    pub work_dir: &'a Path,
    /// Volume / backing file size.
    pub size_bytes: u64,
    pub basalt: &'a BasaltServer,
    /// Concurrent NBD connections a cell may open (qemu-nbd `--shared`).
    pub max_connections: u32,
    pub fio: &'a Fio,
    /// Load hosts (fio client/server); probes run there too.
    pub hosts: &'a [String],
    pub interrupted: &'a AtomicBool,
}

/// A started, usable target.
pub struct Target {
    pub spec: TargetSpec,
    pub name: String,
    /// Directory name of its raw outputs.
    pub slug: String,
    pub io: TargetIo,
    /// Size in bytes, when known.
    pub size_bytes: Option<u64>,
    /// How it is set up, for the summary's parameters.
    pub details: BTreeMap<String, Value>,
    /// (tool, version) of the peer and the bridge, for the summary's
    /// versions.
    pub versions: Vec<(&'static str, String)>,
    server: Option<ServerProcess>,
    /// The iSCSI-to-NBD bridge (qemu-nbd) in front of `server`; stopped
    /// first, and not in the CPU accounting.
    bridge: Option<ServerProcess>,
    volume: Option<(BasaltApi, String)>,
    stopped: bool,
}

impl Target {
    /// The PID of the server the bench started, for CPU accounting.
    pub fn server_pid(&self) -> Option<u32> {
        self.server.as_ref().map(ServerProcess::pid)
    }

    /// CPU seconds of the server the bench started, so far.
    pub fn server_cpu_seconds(&self) -> Option<f64> {
        self.server_pid().and_then(cpu_seconds)
    }

    /// Takes on the peer server the bench started: `tool` names it and its
    /// program (for the versions), `how` says how it runs.
    fn adopt(&mut self, server: ServerProcess, tool: (&'static str, &Path), how: String) {
        self.server = Some(server);
        let (name, program) = tool;
        self.versions
            .extend(crate::machine::tool_version(program).map(|v| (name, v)));
        self.details.insert("server".into(), json!(how));
    }

    /// Whether a server the bench started (or the bridge) has died.
    pub fn server_died(&mut self) -> Option<String> {
        [self.bridge.as_mut(), self.server.as_mut()]
            .into_iter()
            .flatten()
            .find_map(|server| {
                let status = server.exited()?;
                Some(format!(
                    "{} exited during the run ({status}): {}",
                    server.name,
                    server.log_tail()
                ))
            })
    }

    /// Deletes the volume the bench created and stops the server it
    /// started; returns what went wrong (the run's results stand).
    pub fn stop(&mut self) -> Vec<String> {
        if self.stopped {
            return vec![];
        }
        self.stopped = true;
        let mut problems = Vec::new();
        if let Some(mut bridge) = self.bridge.take() {
            if let Err(e) = bridge.terminate() {
                problems.push(e);
            }
        }
        if let Some((api, name)) = self.volume.take() {
            if let Err(e) = api.delete_volume(&name) {
                problems.push(format!("cannot delete volume {name}: {e}"));
            }
        }
        if let Some(mut server) = self.server.take() {
            if let Err(e) = server.terminate() {
                problems.push(e);
            }
        }
        problems
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        for problem in self.stop() {
            tracing::warn!("{problem}");
        }
    }
}

/// The REST calls the bench makes to a basalt server.
#[derive(Clone)]
struct BasaltApi {
    base: String,
    token: String,
    agent: ureq::Agent,
}

impl BasaltApi {
    fn new(base: &str, token: &str) -> BasaltApi {
        BasaltApi {
            base: base.trim_end_matches('/').to_string(),
            token: token.to_string(),
            agent: ureq::AgentBuilder::new()
                .timeout_connect(Duration::from_secs(5))
                .timeout(Duration::from_secs(120))
                .build(),
        }
    }

    fn send(&self, method: &str, path: &str, body: Option<Value>) -> Result<(), String> {
        let request = self
            .agent
            .request(method, &format!("{}{path}", self.base))
            .set("Authorization", &format!("Bearer {}", self.token));
        let result = match body {
            Some(body) => request.send_json(body),
            None => request.call(),
        };
        match result {
            Ok(_) => Ok(()),
            Err(ureq::Error::Status(code, response)) => {
                let text = response.into_string().unwrap_or_default();
                let message = serde_json::from_str::<Value>(&text)
                    .ok()
                    .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_string))
                    .unwrap_or_else(|| format!("HTTP {code}: {}", text.trim()));
                Err(message)
            }
            Err(ureq::Error::Transport(t)) => Err(format!(
                "cannot reach the basalt server at {}: {t}",
                self.base
            )),
        }
    }

    fn create_volume(&self, name: &str, size: u64) -> Result<(), String> {
        self.send(
            "POST",
            "/api/v1/volumes",
            Some(json!({"name": name, "size": size})),
        )
    }

    /// Deletes a volume, retrying while fio's connections are closing.
    fn delete_volume(&self, name: &str) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.send("DELETE", &format!("/api/v1/volumes/{name}"), None) {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() < deadline && e.contains("in use") => {
                    thread::sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// `basalt server` arguments for a server the bench starts: every client
/// listener on 127.0.0.1, on a port the kernel picks (the server reports
/// them in its server.json); NBD over plain TCP, as its peers serve it.
pub(crate) const EPHEMERAL_LISTENERS: [&str; 9] = [
    "--nbd-insecure",
    "--nbd-listen",
    "127.0.0.1:0",
    "--nvme-listen",
    "127.0.0.1:0",
    "--iscsi-listen",
    "127.0.0.1:0",
    "--api-listen",
    "127.0.0.1:0",
];

/// A free TCP port on 127.0.0.1 (free when asked; the server binds it next).
pub(crate) fn free_port() -> Result<u16, TargetError> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(io_err("cannot find a free port"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(io_err("cannot find a free port"))
}

/// Waits until `port` on 127.0.0.1 accepts connections, or the server exits.
fn wait_listening(server: &mut ServerProcess, port: u16) -> Result<(), TargetError> {
    wait_ready(server, &format!("listening on 127.0.0.1:{port}"), || {
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200))
            .is_ok()
    })
}

/// Waits until `ready` (the server is `what`), or the server exits.
fn wait_ready(
    server: &mut ServerProcess,
    what: &str,
    mut ready: impl FnMut() -> bool,
) -> Result<(), TargetError> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Some(status) = server.exited() {
            return Err(server.died(status));
        }
        if ready() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(TargetError::StartFailed {
                name: server.name.clone(),
                detail: format!("not {what} after {START_TIMEOUT:?}: {}", server.log_tail()),
            });
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// The path of `tool` in PATH.
pub(crate) fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

pub(crate) fn require(tool: &'static str, package: &'static str) -> Result<PathBuf, TargetError> {
    which(tool).ok_or(TargetError::ToolMissing { tool, package })
}

/// A sparse file of `size` bytes.
fn sparse_file(path: &Path, size: u64) -> Result<(), TargetError> {
    let file =
        fs::File::create(path).map_err(io_err(format!("cannot create {}", path.display())))?;
    file.set_len(size)
        .map_err(io_err(format!("cannot size {}", path.display())))
}

/// A file of `size` bytes with every block allocated (posix_fallocate).
fn preallocated_file(path: &Path, size: u64) -> Result<(), TargetError> {
    use std::os::fd::AsRawFd;
    let file =
        fs::File::create(path).map_err(io_err(format!("cannot create {}", path.display())))?;
    let len = libc::off_t::try_from(size).map_err(|_| TargetError::Io {
        context: format!("cannot size {}", path.display()),
        source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
    })?;
    // SAFETY: posix_fallocate on a file descriptor we own.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
    if rc != 0 {
        return Err(TargetError::Io {
            context: format!("cannot preallocate {}", path.display()),
            source: std::io::Error::from_raw_os_error(rc),
        });
    }
    Ok(())
}

/// Capacity of the ephemeral server's data file for a volume of `size`:
/// room for the volume, its metadata and journal.
fn basalt_capacity(size: u64) -> u64 {
    let capacity = size + size / 4 + (256 << 20);
    capacity.div_ceil(1 << 20) << 20
}

#[derive(serde::Deserialize)]
struct ServerJson {
    api_url: String,
    nbd: String,
    /// The iSCSI portal (`HOST:PORT`).
    #[serde(default)]
    iscsi: Option<String>,
    pid: u32,
}

/// Starts an ephemeral `basalt server` with `extra` arguments (its data
/// directory and log are named after the target, so `basalt` and
/// `basalt-iscsi` each run their own), creates the bench volume on it and
/// records both in `target`.
fn start_ephemeral(
    exe: &Path,
    extra: &[String],
    ctx: &TargetContext<'_>,
    target: &mut Target,
) -> Result<ServerJson, TargetError> {
    let dir = ctx.work_dir.join(&target.slug);
    let capacity = basalt_capacity(ctx.size_bytes);
    let mut cmd = Command::new(exe);
    cmd.arg("server")
        .arg("--data-dir")
        .arg(&dir)
        .arg("--capacity")
        .arg(capacity.to_string())
        .args(EPHEMERAL_LISTENERS)
        .args(extra);
    let log = ctx.work_dir.join(format!("{}.log", target.slug));
    let server = target
        .server
        .insert(ServerProcess::spawn("basalt server", cmd, log)?);
    let info = wait_server_json(server, &dir)?;
    let token = fs::read_to_string(dir.join("api-token"))
        .map_err(io_err("cannot read the ephemeral server's api-token"))?;
    let api = BasaltApi::new(&info.api_url, token.trim());
    api.create_volume(EXPORT, ctx.size_bytes)
        .map_err(|detail| TargetError::Api {
            action: format!("create volume {EXPORT}"),
            detail,
        })?;
    target.volume = Some((api, EXPORT.to_string()));
    let mut server = "ephemeral all-in-one basalt server (sparse data file)".to_string();
    if !extra.is_empty() {
        server = format!("{server}, with {}", extra.join(" "));
    }
    target.details.insert("server".into(), json!(server));
    target
        .details
        .insert("data_file_capacity_bytes".into(), json!(capacity));
    Ok(info)
}

/// Starts (or, for targets that exist, checks) one target.
pub fn start(spec: &TargetSpec, ctx: &TargetContext<'_>) -> Result<Target, TargetError> {
    let name = spec.name();
    let mut target = Target {
        spec: spec.clone(),
        name: name.clone(),
        slug: spec.slug(),
        io: TargetIo::Nbd { uri: String::new() },
        size_bytes: Some(ctx.size_bytes),
        details: BTreeMap::new(),
        versions: Vec::new(),
        server: None,
        bridge: None,
        volume: None,
        stopped: false,
    };
    let work = ctx.work_dir;
    let io = match spec {
        TargetSpec::Basalt => match ctx.basalt {
            BasaltServer::Ephemeral { exe } => {
                let info = start_ephemeral(exe, &[], ctx, &mut target)?;
                TargetIo::Nbd {
                    uri: format!("nbd://{}/{EXPORT}", info.nbd),
                }
            }
            BasaltServer::Running {
                api_url,
                token,
                nbd_address,
            } => {
                let api = BasaltApi::new(api_url, token);
                let volume = format!(
                    "bench-{}-{}",
                    std::process::id(),
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_secs())
                        .unwrap_or(0)
                );
                api.create_volume(&volume, ctx.size_bytes)
                    .map_err(|detail| {
                        if detail.starts_with("cannot reach") {
                            TargetError::Unreachable {
                                name: name.clone(),
                                detail,
                            }
                        } else {
                            TargetError::Api {
                                action: format!("create volume {volume}"),
                                detail,
                            }
                        }
                    })?;
                target.volume = Some((api, volume.clone()));
                let nbd = match nbd_address {
                    Some(a) => a.clone(),
                    None => {
                        let host = api_url
                            .split_once("://")
                            .map_or(api_url.as_str(), |(_, r)| r)
                            .split(['/', '?'])
                            .next()
                            .unwrap_or("");
                        let host = match host.rsplit_once(':') {
                            Some((h, p)) if p.chars().all(|c| c.is_ascii_digit()) => h,
                            _ => host,
                        };
                        format!("{host}:{DEFAULT_NBD_PORT}")
                    }
                };
                target.details.insert(
                    "server".into(),
                    json!(format!("running basalt server at {api_url}")),
                );
                TargetIo::Nbd {
                    uri: format!("nbd://{nbd}/{volume}"),
                }
            }
        },
        TargetSpec::BasaltIscsi => {
            let BasaltServer::Ephemeral { exe } = ctx.basalt else {
                return Err(TargetError::StartFailed {
                    name,
                    detail: "basalt-iscsi runs its own ephemeral basalt server (allowing the \
                             bridge's initiator); it cannot use a running server \
                             (--data-dir, --url)"
                        .into(),
                });
            };
            let info = start_ephemeral(exe, &basalt_iscsi_args(), ctx, &mut target)?;
            let portal = info.iscsi.ok_or_else(|| TargetError::StartFailed {
                name: name.clone(),
                detail: "its server.json names no iSCSI portal".into(),
            })?;
            let server = target
                .details
                .get("server")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            target.details.insert(
                "server".into(),
                json!(format!(
                    "{server}; iSCSI target {}, LUN 0, through the bridge",
                    basalt_iqn(EXPORT)
                )),
            );
            start_bridge(ctx, &mut target, &portal, &basalt_iqn(EXPORT), 0)?
        }
        TargetSpec::Tgt => {
            let tgtd = require("tgtd", "tgt")?;
            let tgtadm = require("tgtadm", "tgt")?;
            let image = work.join("tgt.img");
            preallocated_file(&image, ctx.size_bytes)?;
            let (server, port) = start_tgtd(&tgtd, &tgtadm, &image, work)?;
            target.adopt(
                server,
                ("tgtd", &tgtd),
                format!(
                    "tgtd -f -C N --iscsi portal=127.0.0.1:PORT, then tgtadm: target {TGT_IQN}, \
                     LUN 1 --bstype rdwr on a preallocated file, bound to ALL (tgt's defaults \
                     otherwise, so buffered I/O); through the bridge"
                ),
            );
            start_bridge(ctx, &mut target, &format!("127.0.0.1:{port}"), TGT_IQN, 1)?
        }
        TargetSpec::QemuNbd | TargetSpec::QemuNbdShared => {
            let shared = (*spec == TargetSpec::QemuNbdShared).then_some(ctx.max_connections);
            let qemu = require("qemu-nbd", "qemu-utils")?;
            let image = work.join(format!("{name}.img"));
            sparse_file(&image, ctx.size_bytes)?;
            let mut started = None;
            let mut last_error = None;
            for aio in ["io_uring", "native"] {
                let port = free_port()?;
                let mut cmd = Command::new(&qemu);
                cmd.args(["-f", "raw", "--cache=none"])
                    .arg(format!("--aio={aio}"))
                    .args(["-x", EXPORT, "-b", "127.0.0.1"])
                    .arg("-p")
                    .arg(port.to_string())
                    .arg("-t");
                if let Some(n) = shared {
                    cmd.arg(format!("--shared={n}"));
                }
                cmd.arg(&image);
                let mut server =
                    ServerProcess::spawn("qemu-nbd", cmd, work.join(format!("{name}-{aio}.log")))?;
                match wait_listening(&mut server, port) {
                    Ok(()) => {
                        started = Some((server, port, aio));
                        break;
                    }
                    Err(e) => {
                        let _ = server.terminate();
                        last_error = Some(e);
                    }
                }
            }
            let Some((server, port, aio)) = started else {
                return Err(last_error.unwrap_or(TargetError::StartFailed {
                    name,
                    detail: "no AIO mode worked".into(),
                }));
            };
            target.adopt(
                server,
                ("qemu-nbd", &qemu),
                match shared {
                    Some(n) => format!(
                        "qemu-nbd -f raw --cache=none --aio={aio} -t --shared={n} (sparse file)"
                    ),
                    None => format!(
                        "qemu-nbd -f raw --cache=none --aio={aio} -t (sparse file; qemu-nbd's defaults otherwise)"
                    ),
                },
            );
            target.details.insert("aio".into(), json!(aio));
            TargetIo::Nbd {
                uri: format!("nbd://127.0.0.1:{port}/{EXPORT}"),
            }
        }
        TargetSpec::Nbdkit => {
            let nbdkit = require("nbdkit", "nbdkit")?;
            let image = work.join("nbdkit.img");
            sparse_file(&image, ctx.size_bytes)?;
            let port = free_port()?;
            let mut cmd = Command::new(&nbdkit);
            cmd.args(["--exit-with-parent", "-f", "-i", "127.0.0.1", "-p"])
                .arg(port.to_string())
                .args(["-e", EXPORT, "file"])
                .arg(format!("file={}", image.display()))
                .arg("cache=none");
            let mut server = ServerProcess::spawn("nbdkit", cmd, work.join("nbdkit.log"))?;
            wait_listening(&mut server, port)?;
            target.adopt(
                server,
                ("nbdkit", &nbdkit),
                "nbdkit file plugin, cache=none (sparse file)".into(),
            );
            TargetIo::Nbd {
                uri: format!("nbd://127.0.0.1:{port}/{EXPORT}"),
            }
        }
        TargetSpec::File => {
            let image = work.join("file.img");
            sparse_file(&image, ctx.size_bytes)?;
            target.details.insert(
                "server".into(),
                json!("none: fio directly on a sparse file (O_DIRECT)"),
            );
            TargetIo::File {
                path: image,
                engine: FileEngine::IoUring,
            }
        }
        TargetSpec::Nbd(uri) => {
            target.size_bytes = None;
            TargetIo::Nbd { uri: uri.clone() }
        }
        TargetSpec::Path(path) => {
            if ctx.hosts.is_empty() || ctx.hosts.iter().all(|h| is_loopback_host(h)) {
                target.size_bytes = Some(path_size(path)?);
                check_not_mounted(path)?;
            } else {
                target.size_bytes = None;
            }
            TargetIo::File {
                path: path.clone(),
                engine: FileEngine::IoUring,
            }
        }
    };
    target.io = probe(ctx, &name, io, work)?;
    target.details.insert(
        "engine".into(),
        json!(target.io.engine(crate::profiles::EngineKind::Async)),
    );
    match &target.io {
        TargetIo::Nbd { uri } => target.details.insert("uri".into(), json!(uri)),
        TargetIo::File { path, .. } => target.details.insert("path".into(), json!(path)),
    };
    if let Some(size) = target.size_bytes {
        target.details.insert("size_bytes".into(), json!(size));
    }
    Ok(target)
}

/// Waits for the ephemeral server's `server.json` (naming our child).
fn wait_server_json(server: &mut ServerProcess, dir: &Path) -> Result<ServerJson, TargetError> {
    let path = dir.join("server.json");
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Some(status) = server.exited() {
            return Err(server.died(status));
        }
        if let Ok(text) = fs::read_to_string(&path) {
            if let Ok(info) = serde_json::from_str::<ServerJson>(&text) {
                if info.pid == server.pid() {
                    return Ok(info);
                }
            }
        }
        if Instant::now() > deadline {
            return Err(TargetError::StartFailed {
                name: server.name.clone(),
                detail: format!(
                    "no {} after {START_TIMEOUT:?}: {}",
                    path.display(),
                    server.log_tail()
                ),
            });
        }
        thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests;
