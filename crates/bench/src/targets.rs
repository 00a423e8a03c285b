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
/// The iSCSI initiator name the bridge logs in with (the ephemeral basalt
/// server of `basalt-iscsi` allows it with `--iscsi-allow-initiator`).
pub const BRIDGE_INITIATOR: &str = "iqn.2026-11.io.basalt:bench-bridge";
/// The target name under which the bench's tgtd serves its file.
const TGT_IQN: &str = "iqn.2026-11.io.basalt:bench-tgt";
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

/// A server process the bench started.
pub(crate) struct ServerProcess {
    name: String,
    child: Child,
    log: PathBuf,
    /// Commands (program and arguments) that make it exit, for a server
    /// that ignores SIGTERM (tgtd); empty: SIGTERM.
    stop_commands: Vec<Vec<String>>,
    /// Files it leaves behind (tgtd's control socket), removed once it
    /// stopped.
    leftovers: Vec<PathBuf>,
}

impl ServerProcess {
    /// Starts `cmd` with output to `log`, in its own process group, set to
    /// receive SIGTERM if the bench dies. Call from the thread that stops it
    /// (PR_SET_PDEATHSIG follows the spawning thread).
    pub(crate) fn spawn(
        name: &str,
        cmd: Command,
        log: PathBuf,
    ) -> Result<ServerProcess, TargetError> {
        Self::spawn_with(name, cmd, log, libc::SIGTERM, Vec::new(), Vec::new())
    }

    /// The same for a server that ignores SIGTERM: `stop_commands` stop it
    /// (retried until it exits), and it gets SIGKILL if the bench dies;
    /// `leftovers` are removed once it stopped.
    pub(crate) fn spawn_stopped_by(
        name: &str,
        cmd: Command,
        log: PathBuf,
        stop_commands: Vec<Vec<String>>,
        leftovers: Vec<PathBuf>,
    ) -> Result<ServerProcess, TargetError> {
        Self::spawn_with(name, cmd, log, libc::SIGKILL, stop_commands, leftovers)
    }

    fn spawn_with(
        name: &str,
        mut cmd: Command,
        log: PathBuf,
        death_signal: libc::c_int,
        stop_commands: Vec<Vec<String>>,
        leftovers: Vec<PathBuf>,
    ) -> Result<ServerProcess, TargetError> {
        let out =
            fs::File::create(&log).map_err(io_err(format!("cannot create {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(io_err(format!("cannot open {}", log.display())))?;
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        // SAFETY: prctl(2) is async-signal-safe and touches no memory of the
        // parent; this runs in the child between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, death_signal);
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| TargetError::StartFailed {
            name: name.to_string(),
            detail: format!("cannot run {}: {e}", cmd.get_program().to_string_lossy()),
        })?;
        Ok(ServerProcess {
            name: name.to_string(),
            child,
            log,
            stop_commands,
            leftovers,
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    pub(crate) fn log_tail(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        process::tail(&text, 6, 600)
    }

    pub(crate) fn died(&mut self, status: ExitStatus) -> TargetError {
        TargetError::StartFailed {
            name: self.name.clone(),
            detail: format!("it exited ({status}): {}", self.log_tail()),
        }
    }

    /// SIGKILL (as a crash would), and reaps it.
    pub(crate) fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Whether it exits before `until`.
    fn exits_by(&mut self, until: Instant) -> bool {
        loop {
            if self.exited().is_some() {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM by PID (or its stop commands, retried: tgtd refuses to
    /// delete a target while a session is still closing), then SIGKILL
    /// after `STOP_TIMEOUT`.
    pub(crate) fn terminate(&mut self) -> Result<(), String> {
        let stopped = self.stop_or_kill();
        for path in &self.leftovers {
            let _ = fs::remove_file(path);
        }
        stopped
    }

    fn stop_or_kill(&mut self) -> Result<(), String> {
        if self.exited().is_some() {
            return Ok(());
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        if self.stop_commands.is_empty() {
            if let Ok(pid) = libc::pid_t::try_from(self.pid()) {
                // SAFETY: kill(2) on our own child, not yet reaped.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
            if self.exits_by(deadline) {
                return Ok(());
            }
        } else {
            while Instant::now() < deadline {
                for argv in &self.stop_commands {
                    let _ = run_tool(argv);
                }
                if self.exits_by(deadline.min(Instant::now() + Duration::from_secs(1))) {
                    return Ok(());
                }
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        Err(format!(
            "{} (pid {}) did not stop within {STOP_TIMEOUT:?} of {}; killed it",
            self.name,
            self.pid(),
            if self.stop_commands.is_empty() {
                "SIGTERM"
            } else {
                "its stop commands"
            }
        ))
    }
}

/// Runs a tool (program and arguments) to completion within
/// `TOOL_TIMEOUT`; its output, or why it failed.
fn run_tool(argv: &[String]) -> Result<String, String> {
    let (program, args) = argv.split_first().ok_or("no command")?;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    let deadline = Instant::now() + TOOL_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{} timed out", argv.join(" ")));
            }
        }
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{program}: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!(
            "{} failed ({}): {}",
            argv.join(" "),
            out.status,
            process::tail(&String::from_utf8_lossy(&out.stderr), 3, 300)
        ))
    }
}

/// User + system CPU seconds from the text of /proc/PID/stat.
pub fn parse_stat_cpu(stat: &str, ticks_per_sec: f64) -> Option<f64> {
    // The command name (field 2) is in parentheses and may contain spaces
    // and parentheses; the fields after the last ')' start at field 3.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / ticks_per_sec)
}

/// A process's user + system CPU seconds so far (all its threads).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks <= 0 {
        return None;
    }
    parse_stat_cpu(&stat, ticks as f64)
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

/// Refuses a work directory where files cannot be opened with O_DIRECT
/// (tmpfs before Linux 6.6, some FUSE filesystems): the targets' backing
/// files would be cached and the comparison meaningless. Returns the name of
/// the directory's filesystem type for the summary (`tmpfs` means the data
/// lives in RAM, so the CPU rather than a disk is the limit).
pub fn check_work_dir(dir: &Path) -> Result<&'static str, TargetError> {
    use std::os::unix::fs::OpenOptionsExt;
    let probe = dir.join(format!(".basalt-bench-direct-probe.{}", std::process::id()));
    let opened = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_DIRECT)
        .open(&probe);
    let _ = fs::remove_file(&probe);
    match opened {
        Ok(_) => Ok(filesystem_kind(dir)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            Err(TargetError::NoDirectIo(dir.to_path_buf()))
        }
        Err(e) => Err(TargetError::Io {
            context: format!(
                "cannot create a file in the work directory {}",
                dir.display()
            ),
            source: e,
        }),
    }
}

/// The filesystem type of `dir`, by its statfs magic, for common ones.
fn filesystem_kind(dir: &Path) -> &'static str {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c_path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return "unknown";
    };
    // SAFETY: statfs is plain old data; all-zero is a valid value.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid NUL-terminated path and a statfs buffer we own.
    let rc = unsafe { libc::statfs(c_path.as_ptr(), &mut stat) };
    if rc != 0 {
        return "unknown";
    }
    #[allow(clippy::unnecessary_cast)]
    match stat.f_type as i64 {
        0x0102_1994 => "tmpfs",
        0xEF53 => "ext4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x794C_7630 => "overlayfs",
        _ => "other",
    }
}

/// Whether a load host (`HOST`, `HOST:PORT`, `[V6]:PORT`) is this machine's
/// loopback; unresolvable hosts are not.
pub fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split_once(']').map_or(rest, |(a, _)| a)
    } else {
        match host.rsplit_once(':') {
            Some((n, _)) if !n.contains(':') => n,
            _ => host,
        }
    };
    match (name, 0u16).to_socket_addrs() {
        Ok(addrs) => {
            let addrs: Vec<_> = addrs.collect();
            !addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback())
        }
        Err(_) => false,
    }
}

/// Checks that fio reaches the target; on files, picks io_uring or, if
/// fio cannot use it here, libaio.
fn probe(
    ctx: &TargetContext<'_>,
    name: &str,
    io: TargetIo,
    dir: &Path,
) -> Result<TargetIo, TargetError> {
    let candidates: Vec<TargetIo> = match &io {
        TargetIo::File { path, .. } => [FileEngine::IoUring, FileEngine::Libaio]
            .into_iter()
            .map(|engine| TargetIo::File {
                path: path.clone(),
                engine,
            })
            .collect(),
        TargetIo::Nbd { .. } => vec![io.clone()],
    };
    let mut last_error = String::new();
    for candidate in candidates {
        let text = jobfile::probe(&candidate).map_err(|e| TargetError::Unreachable {
            name: name.to_string(),
            detail: e.to_string(),
        })?;
        let job = dir.join(format!("probe-{}.fio", sanitize(name)));
        fs::write(&job, text).map_err(io_err(format!("cannot write {}", job.display())))?;
        let finished = process::run(
            ctx.fio,
            &Invocation {
                job_file: &job,
                hosts: ctx.hosts,
                cwd: dir,
                timeout: Duration::from_secs(60),
            },
            ctx.interrupted,
            &mut |_| {},
        )
        .map_err(|e| TargetError::Unreachable {
            name: name.to_string(),
            detail: e.to_string(),
        })?;
        let _ = fs::remove_file(&job);
        let ok = finished.success()
            && crate::fio::parse::parse_report(&finished.stdout)
                .ok()
                .is_some_and(|r| crate::fio::parse::metrics(&r).is_ok());
        if ok {
            return Ok(candidate);
        }
        // What fio said besides its JSON document.
        let said = format!(
            "{}\n{}",
            crate::fio::parse::split_output(&finished.stdout).preamble,
            finished.stderr
        );
        last_error = process::tail(&said, 3, 400);
        if last_error.contains("engine nbd not loadable") {
            last_error.push_str(" (this fio has no nbd engine; install Debian's fio package)");
        }
        if last_error.is_empty() {
            last_error = format!("fio exited with {:?}", finished.status);
        }
    }
    Err(TargetError::Unreachable {
        name: name.to_string(),
        detail: last_error,
    })
}

/// Size of a regular file or block device.
fn path_size(path: &Path) -> Result<u64, TargetError> {
    let meta = fs::metadata(path).map_err(|_| TargetError::NoSuchPath(path.to_path_buf()))?;
    if meta.is_file() {
        return Ok(meta.len());
    }
    if meta.file_type().is_block_device() {
        let mut f =
            fs::File::open(path).map_err(io_err(format!("cannot open {}", path.display())))?;
        return f
            .seek(SeekFrom::End(0))
            .map_err(io_err(format!("cannot size {}", path.display())));
    }
    Err(TargetError::NotFileOrDevice(path.to_path_buf()))
}

/// Refuses a block device that is mounted (by device number).
fn check_not_mounted(path: &Path) -> Result<(), TargetError> {
    let Ok(meta) = fs::metadata(path) else {
        return Ok(());
    };
    if !meta.file_type().is_block_device() {
        return Ok(());
    }
    let mut mounts = String::new();
    if fs::File::open("/proc/self/mounts")
        .and_then(|mut f| f.read_to_string(&mut mounts))
        .is_err()
    {
        return Ok(());
    }
    for line in mounts.lines() {
        let mut parts = line.split_whitespace();
        let (Some(source), Some(mount)) = (parts.next(), parts.next()) else {
            continue;
        };
        if !source.starts_with('/') {
            continue;
        }
        if let Ok(m) = fs::metadata(source) {
            if m.file_type().is_block_device() && m.rdev() == meta.rdev() {
                return Err(TargetError::Mounted {
                    device: path.to_path_buf(),
                    mount: mount.to_string(),
                });
            }
        }
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

/// `basalt-iscsi`'s ephemeral server arguments beyond the listeners.
fn basalt_iscsi_args() -> Vec<String> {
    vec!["--iscsi-allow-initiator".into(), BRIDGE_INITIATOR.into()]
}

/// The bridge's qemu-nbd arguments: QEMU's iSCSI driver (libiscsi) on
/// `iqn` LUN `lun` at `portal`, exported as NBD export `bench` on the Unix
/// socket `socket` to up to `shared` clients, persistent (`-t`), without
/// the host page cache (`--cache=none`).
pub(crate) fn bridge_args(
    portal: &str,
    iqn: &str,
    lun: u32,
    shared: u32,
    socket: &Path,
) -> Vec<String> {
    vec![
        "-t".into(),
        "--cache=none".into(),
        format!("--shared={shared}"),
        "-x".into(),
        EXPORT.into(),
        "-k".into(),
        socket.display().to_string(),
        "--image-opts".into(),
        format!(
            "driver=iscsi,transport=tcp,portal={portal},target={iqn},lun={lun},\
             initiator-name={BRIDGE_INITIATOR}"
        ),
    ]
}

/// Starts the bridge in front of an iSCSI LUN (qemu-nbd, see
/// [`bridge_args`]) and records it in `target`; fio reaches it over NBD.
fn start_bridge(
    ctx: &TargetContext<'_>,
    target: &mut Target,
    portal: &str,
    iqn: &str,
    lun: u32,
) -> Result<TargetIo, TargetError> {
    let qemu = require("qemu-nbd", "qemu-utils")?;
    let socket = ctx.work_dir.join(format!("{}-bridge.sock", target.slug));
    let args = bridge_args(portal, iqn, lun, ctx.max_connections, &socket);
    let mut cmd = Command::new(&qemu);
    cmd.args(&args);
    let log = ctx.work_dir.join(format!("{}-bridge.log", target.slug));
    let bridge = target
        .bridge
        .insert(ServerProcess::spawn("qemu-nbd (iSCSI bridge)", cmd, log)?);
    wait_ready(
        bridge,
        &format!("listening on {}", socket.display()),
        || UnixStream::connect(&socket).is_ok(),
    )?;
    target
        .versions
        .extend(crate::machine::tool_version(&qemu).map(|v| ("qemu-nbd", v)));
    target.details.insert(
        "bridge".into(),
        json!(format!(
            "qemu-nbd {} (QEMU's iSCSI driver, libiscsi, exported as NBD; fio's nbd engine drives it)",
            args.join(" ")
        )),
    );
    Ok(TargetIo::Nbd {
        uri: format!("nbd+unix:///{EXPORT}?socket={}", socket.display()),
    })
}

/// tgtd's arguments: in the foreground, control socket number `control`
/// (/var/run/tgtd/socket.N), one iSCSI portal on 127.0.0.1.
fn tgtd_args(control: u16, port: u16) -> Vec<String> {
    vec![
        "-f".into(),
        "-C".into(),
        control.to_string(),
        "--iscsi".into(),
        format!("portal=127.0.0.1:{port}"),
    ]
}

/// A number for tgtd's control socket (`-C`, at most 32767) that no
/// socket in /var/run/tgtd has yet.
fn tgtd_control_number() -> Result<u16, TargetError> {
    loop {
        let control = 10_000 + free_port()? % 22_768;
        if !Path::new(&format!("/var/run/tgtd/socket.{control}")).exists() {
            return Ok(control);
        }
    }
}

/// A tgtadm command line on control socket `control`.
fn tgtadm_argv(tgtadm: &Path, control: u16, args: &[&str]) -> Vec<String> {
    let mut argv = vec![
        tgtadm.display().to_string(),
        "-C".into(),
        control.to_string(),
    ];
    argv.extend(args.iter().map(|a| a.to_string()));
    argv
}

/// The tgtadm commands that set up the `tgt` target: target 1 named
/// `TGT_IQN`, LUN 1 on `image` with the rdwr backing store (LUN 0 is tgt's
/// controller), open to every initiator.
fn tgtadm_setup_args(tgtadm: &Path, control: u16, image: &Path) -> Vec<Vec<String>> {
    let image = image.display().to_string();
    [
        vec![
            "--lld", "iscsi", "--op", "new", "--mode", "target", "--tid", "1", "-T", TGT_IQN,
        ],
        vec![
            "--lld",
            "iscsi",
            "--op",
            "new",
            "--mode",
            "logicalunit",
            "--tid",
            "1",
            "--lun",
            "1",
            "--bstype",
            "rdwr",
            "-b",
            &image,
        ],
        vec![
            "--lld", "iscsi", "--op", "bind", "--mode", "target", "--tid", "1", "-I", "ALL",
        ],
    ]
    .iter()
    .map(|args| tgtadm_argv(tgtadm, control, args))
    .collect()
}

/// The tgtadm commands that stop tgtd (it ignores SIGTERM): offline, delete
/// the target (forcing its sessions out), delete the system.
fn tgtadm_stop_args(tgtadm: &Path, control: u16) -> Vec<Vec<String>> {
    [
        &[
            "--op", "update", "--mode", "sys", "--name", "State", "-v", "offline",
        ][..],
        &[
            "--lld", "iscsi", "--op", "delete", "--mode", "target", "--tid", "1", "--force",
        ],
        &["--op", "delete", "--mode", "system"],
    ]
    .iter()
    .map(|args| tgtadm_argv(tgtadm, control, args))
    .collect()
}

/// Starts tgtd as its users start it and sets up its target with tgtadm;
/// returns it and its iSCSI port. tgtd that cannot bind its portal (the
/// port taken since it was picked) listens on every address at 3260
/// instead, so the portal it reports is checked, before any LUN exists,
/// and another port tried.
fn start_tgtd(
    tgtd: &Path,
    tgtadm: &Path,
    image: &Path,
    work: &Path,
) -> Result<(ServerProcess, u16), TargetError> {
    let mut last_error = None;
    for attempt in 1..=3 {
        let port = free_port()?;
        let control = tgtd_control_number()?;
        let mut cmd = Command::new(tgtd);
        cmd.args(tgtd_args(control, port));
        let mut server = ServerProcess::spawn_stopped_by(
            "tgtd",
            cmd,
            work.join(format!("tgtd-{attempt}.log")),
            tgtadm_stop_args(tgtadm, control),
            ["", ".lock"]
                .iter()
                .map(|suffix| PathBuf::from(format!("/var/run/tgtd/socket.{control}{suffix}")))
                .collect(),
        )?;
        let failed = |detail: String| TargetError::StartFailed {
            name: "tgtd".into(),
            detail,
        };
        let show_sys = tgtadm_argv(tgtadm, control, &["--op", "show", "--mode", "sys"]);
        let show_portals = tgtadm_argv(
            tgtadm,
            control,
            &["--lld", "iscsi", "--op", "show", "--mode", "portal"],
        );
        let result = wait_ready(&mut server, "answering tgtadm", || {
            run_tool(&show_sys).is_ok()
        })
        .and_then(|()| {
            let portals = run_tool(&show_portals).map_err(failed)?;
            if !portals.contains(&format!("127.0.0.1:{port},")) {
                return Err(failed(format!(
                    "its portal 127.0.0.1:{port} did not open (port taken?); it has: {}",
                    portals.trim()
                )));
            }
            for argv in tgtadm_setup_args(tgtadm, control, image) {
                run_tool(&argv).map_err(failed)?;
            }
            Ok(())
        })
        .and_then(|()| wait_listening(&mut server, port));
        match result {
            Ok(()) => return Ok((server, port)),
            Err(e) => {
                let _ = server.terminate();
                last_error = Some(e);
            }
        }
    }
    Err(last_error.unwrap_or(TargetError::StartFailed {
        name: "tgtd".into(),
        detail: "no attempt made".into(),
    }))
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
mod tests {
    use super::*;

    #[test]
    fn parses_targets() {
        assert_eq!(TargetSpec::parse("basalt").unwrap(), TargetSpec::Basalt);
        assert_eq!(TargetSpec::parse("qemu-nbd").unwrap(), TargetSpec::QemuNbd);
        assert_eq!(
            TargetSpec::parse("qemu-nbd-shared").unwrap(),
            TargetSpec::QemuNbdShared
        );
        assert_eq!(TargetSpec::parse("nbdkit").unwrap(), TargetSpec::Nbdkit);
        assert_eq!(
            TargetSpec::parse("basalt-iscsi").unwrap(),
            TargetSpec::BasaltIscsi
        );
        assert_eq!(TargetSpec::parse(" tgt ").unwrap(), TargetSpec::Tgt);
        assert_eq!(TargetSpec::parse("file").unwrap(), TargetSpec::File);
        assert_eq!(
            TargetSpec::parse("nbd://10.0.0.1:10809/db").unwrap(),
            TargetSpec::Nbd("nbd://10.0.0.1:10809/db".into())
        );
        assert_eq!(
            TargetSpec::parse("/dev/nvme0n1").unwrap(),
            TargetSpec::Path("/dev/nvme0n1".into())
        );
        let err = TargetSpec::parse("qemu").unwrap_err().to_string();
        assert!(
            err.contains(
                "basalt, basalt-iscsi, qemu-nbd, qemu-nbd-shared, nbdkit, tgt, file, nbd://"
            ),
            "{err}"
        );
        assert!(TargetSpec::parse("iscsi").is_err());
        assert!(TargetSpec::parse("tgtd").is_err());
    }

    #[test]
    fn iscsi_targets_are_named_and_local() {
        let basalt = BasaltServer::Ephemeral {
            exe: "basalt".into(),
        };
        for (spec, name) in [
            (TargetSpec::BasaltIscsi, "basalt-iscsi"),
            (TargetSpec::Tgt, "tgt"),
        ] {
            assert_eq!(spec.name(), name);
            assert_eq!(spec.slug(), name);
            assert_eq!(TargetSpec::parse(&spec.name()).unwrap(), spec);
            assert!(spec.local_only(&basalt));
        }
    }

    #[test]
    fn iscsi_command_lines() {
        // The ephemeral server of basalt-iscsi lets the bridge log in.
        assert_eq!(
            basalt_iscsi_args(),
            ["--iscsi-allow-initiator", BRIDGE_INITIATOR]
        );
        assert!(EPHEMERAL_LISTENERS.contains(&"--iscsi-listen"));
        assert_eq!(basalt_iqn(EXPORT), "iqn.2026-11.io.basalt:volume:bench");
        // The bridge: QEMU's iSCSI driver exported as NBD on a Unix socket.
        assert_eq!(
            bridge_args(
                "127.0.0.1:3260",
                &basalt_iqn(EXPORT),
                0,
                12,
                Path::new("/w/basalt-iscsi-bridge.sock")
            )
            .join(" "),
            "-t --cache=none --shared=12 -x bench -k /w/basalt-iscsi-bridge.sock --image-opts \
             driver=iscsi,transport=tcp,portal=127.0.0.1:3260,\
             target=iqn.2026-11.io.basalt:volume:bench,lun=0,\
             initiator-name=iqn.2026-11.io.basalt:bench-bridge"
        );
        // tgtd as its users start it, set up and stopped with tgtadm.
        assert_eq!(
            tgtd_args(12345, 3261).join(" "),
            "-f -C 12345 --iscsi portal=127.0.0.1:3261"
        );
        let tgtadm = Path::new("/usr/sbin/tgtadm");
        let setup: Vec<String> = tgtadm_setup_args(tgtadm, 7, Path::new("/w/tgt.img"))
            .iter()
            .map(|a| a.join(" "))
            .collect();
        assert_eq!(
            setup,
            [
                "/usr/sbin/tgtadm -C 7 --lld iscsi --op new --mode target --tid 1 \
                 -T iqn.2026-11.io.basalt:bench-tgt",
                "/usr/sbin/tgtadm -C 7 --lld iscsi --op new --mode logicalunit --tid 1 --lun 1 \
                 --bstype rdwr -b /w/tgt.img",
                "/usr/sbin/tgtadm -C 7 --lld iscsi --op bind --mode target --tid 1 -I ALL",
            ]
        );
        let stop: Vec<String> = tgtadm_stop_args(tgtadm, 7)
            .iter()
            .map(|a| a.join(" "))
            .collect();
        assert_eq!(
            stop,
            [
                "/usr/sbin/tgtadm -C 7 --op update --mode sys --name State -v offline",
                "/usr/sbin/tgtadm -C 7 --lld iscsi --op delete --mode target --tid 1 --force",
                "/usr/sbin/tgtadm -C 7 --op delete --mode system",
            ]
        );
        let control = tgtd_control_number().unwrap();
        assert!((10_000..=32_767).contains(&control), "{control}");
    }

    #[test]
    fn stop_commands_stop_a_server_that_ignores_sigterm() {
        let dir = tempfile::tempdir().unwrap();
        let flag = dir.path().join("stop");
        // A shell that ignores SIGTERM and exits once the flag file exists.
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(format!(
            "trap '' TERM; while [ ! -e {} ]; do sleep 0.05; done",
            flag.display()
        ));
        let mut server = ServerProcess::spawn_stopped_by(
            "stubborn",
            cmd,
            dir.path().join("stubborn.log"),
            vec![vec!["touch".into(), flag.display().to_string()]],
            vec![flag.clone()],
        )
        .unwrap();
        assert!(server.exited().is_none());
        assert_eq!(server.terminate(), Ok(()));
        assert!(server.exited().is_some());
        assert!(!flag.exists(), "leftovers are removed");
        assert!(run_tool(&["false".to_string()]).is_err());
        assert_eq!(run_tool(&["echo".into(), "hi".into()]).unwrap(), "hi\n");
    }

    #[test]
    fn preallocated_files_have_their_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tgt.img");
        preallocated_file(&path, 1 << 20).unwrap();
        let meta = fs::metadata(&path).unwrap();
        assert_eq!(meta.len(), 1 << 20);
        assert!(meta.blocks() * 512 >= 1 << 20, "{} blocks", meta.blocks());
    }

    #[test]
    fn parses_compare_lists() {
        let list = TargetSpec::parse_list("basalt,qemu-nbd, nbdkit,file").unwrap();
        assert_eq!(
            list,
            [
                TargetSpec::Basalt,
                TargetSpec::QemuNbd,
                TargetSpec::Nbdkit,
                TargetSpec::File
            ]
        );
        assert!(matches!(
            TargetSpec::parse_list("file,file"),
            Err(TargetError::Duplicate(_))
        ));
        assert!(TargetSpec::parse_list(",").is_err());
        let iscsi = TargetSpec::parse_list("basalt-iscsi, tgt").unwrap();
        assert_eq!(iscsi, [TargetSpec::BasaltIscsi, TargetSpec::Tgt]);
        assert!(TargetSpec::parse_list("tgt,tgt").is_err());
    }

    #[test]
    fn slugs_are_file_names() {
        assert_eq!(TargetSpec::Basalt.slug(), "basalt");
        assert_eq!(
            TargetSpec::Nbd("nbd://127.0.0.1:10809/db".into()).slug(),
            "nbd-127.0.0.1_10809_db"
        );
        assert_eq!(TargetSpec::Path("/dev/sdb".into()).slug(), "path-dev_sdb");
    }

    #[test]
    fn cpu_from_proc_stat() {
        // Field 14 utime = 150, field 15 stime = 50; the name has a space
        // and a parenthesis.
        let stat =
            "1234 (basalt (x) y) S 1 1234 1234 0 -1 4194560 100 0 0 0 150 50 0 0 20 0 9 0 100 0 0";
        assert_eq!(parse_stat_cpu(stat, 100.0), Some(2.0));
        assert_eq!(parse_stat_cpu("garbage", 100.0), None);
        let me = cpu_seconds(std::process::id());
        assert!(me.is_some_and(|s| s >= 0.0));
    }

    #[test]
    fn loopback_hosts() {
        assert!(is_loopback_host("127.0.0.1"));
        assert!(is_loopback_host("127.0.0.1:8765"));
        assert!(is_loopback_host("localhost"));
        assert!(is_loopback_host("[::1]:8765"));
        assert!(!is_loopback_host("192.0.2.1"));
        assert!(!is_loopback_host("no-such-host.invalid"));
    }

    #[test]
    fn capacity_has_room() {
        let gib = 1u64 << 30;
        assert!(basalt_capacity(gib) >= gib + gib / 4);
        assert_eq!(basalt_capacity(gib) % (1 << 20), 0);
    }
}
