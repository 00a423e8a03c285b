//! Test support for the end-to-end tests of the `basalt` binary.
//!
//! Every test starts its own `basalt server` in a fresh temporary data
//! directory, with NBD and API listening on port 0, and learns the ports
//! from `DIR/server.json`, so tests run in parallel. Real clients (qemu-img,
//! qemu-io, nbdinfo, nbdcopy, fio, python3-libnbd) are required: a missing
//! tool fails the test with a message pointing at `scripts/test.sh`, which
//! installs them. Nothing is ever skipped silently.
//!
//! Processes are only ever signalled by the PID of a child this code
//! started. Servers and clients may run inside a network namespace of a
//! [`netns::TestNet`] (see [`in_netns`]).
#![allow(dead_code)]

pub mod cluster;
pub mod guest;
pub mod netns;
pub mod plaintext;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

/// The binary under test: the workspace's `basalt`, or $BASALT_TEST_BIN (to run
/// these tests against another build of it).
pub fn bin() -> String {
    std::env::var("BASALT_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_basalt").to_string())
}
pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * 1024;
pub const GIB: u64 = 1024 * MIB;

/// How long a server gets to write server.json.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Default limit for one external command.
pub const CMD_TIMEOUT: Duration = Duration::from_secs(120);

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

pub fn nbdsh_script(name: &str) -> PathBuf {
    let p = workspace_root().join("tests/nbdsh").join(name);
    assert!(p.exists(), "missing test script {}", p.display());
    p
}

// ---------------------------------------------------------------------------
// External tools

fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| {
            p.metadata()
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

/// The path of an external tool; fails the test (never skips) when missing.
pub fn require_tool(name: &str) -> PathBuf {
    match find_in_path(name) {
        Some(p) => p,
        None => panic!(
            "required tool `{name}` was not found in PATH. These end-to-end tests need real \
             NBD clients; run `scripts/test.sh` (as root it installs fio, qemu-utils, libnbd-bin, \
             python3-libnbd and nbdkit with apt-get), or install them yourself."
        ),
    }
}

/// A python3 interpreter that can `import nbd` (Debian's python3-libnbd lives in
/// /usr/bin/python3's dist-packages; a pyenv/venv python3 earlier in PATH can't see it).
pub fn python_nbd() -> PathBuf {
    static PY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PY.get_or_init(|| {
        let mut tried = Vec::new();
        let mut cands: Vec<PathBuf> = vec![PathBuf::from("/usr/bin/python3")];
        if let Some(p) = find_in_path("python3") {
            cands.push(p);
        }
        for c in cands {
            if !c.exists() {
                continue;
            }
            let ok = Command::new(&c)
                .args(["-c", "import nbd"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if ok {
                return Ok(c);
            }
            tried.push(c.display().to_string());
        }
        Err(format!(
            "no python3 with the libnbd bindings (`import nbd`) found (tried: {}). Run \
             `scripts/test.sh`, which installs python3-libnbd, or `apt-get install python3-libnbd`.",
            tried.join(", ")
        ))
    })
    .clone()
    .unwrap_or_else(|e| panic!("{e}"))
}

/// PATH with the directory of the libnbd-capable python3 first, so `nbdsh`
/// (a shell wrapper around `python3 -m nbd`) finds the right interpreter.
pub fn path_for_nbdsh() -> String {
    let py = python_nbd();
    let dir = py.parent().unwrap().display().to_string();
    let old = std::env::var("PATH").unwrap_or_default();
    format!("{dir}:{old}")
}

// ---------------------------------------------------------------------------
// Running commands

#[derive(Debug)]
pub struct CmdOutput {
    pub cmdline: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl CmdOutput {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    pub fn describe(&self) -> String {
        format!(
            "command: {}\nstatus: {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.cmdline, self.status, self.stdout, self.stderr
        )
    }

    /// Asserts exit status 0 and returns stdout.
    #[track_caller]
    pub fn ok(&self) -> &str {
        assert!(
            self.status.success(),
            "command failed:\n{}",
            self.describe()
        );
        &self.stdout
    }

    /// Asserts the CLI error convention: exit `code`, and stderr is exactly
    /// one line starting with `error:`. Returns that line.
    #[track_caller]
    pub fn cli_error(&self, code: i32) -> String {
        assert_eq!(
            self.code(),
            Some(code),
            "expected exit code {code}:\n{}",
            self.describe()
        );
        let err = self.stderr.trim_end();
        let lines: Vec<&str> = err.lines().collect();
        assert!(
            code == 2 || lines.len() == 1,
            "expected exactly one line on stderr:\n{}",
            self.describe()
        );
        assert!(
            lines.first().is_some_and(|l| l.starts_with("error:")),
            "expected stderr to start with `error:`:\n{}",
            self.describe()
        );
        lines[0].to_string()
    }
}

fn cmdline(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Makes `cmd` run inside network namespace `netns` (one of a
/// [`netns::TestNet`]'s); `None` leaves it in the test's own.
pub fn in_netns(cmd: &mut Command, netns: Option<&str>) {
    if let Some(ns) = netns {
        basalt_etcd_fixture::netns::command_in(cmd, ns);
    }
}

/// Seconds on CLOCK_MONOTONIC, the clock python's `time.monotonic()` reads:
/// lets a test compare its own events with times a client script reports.
pub fn monotonic_secs() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we pass.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// Runs a command to completion with a time limit (killing it, by its PID, on timeout).
#[track_caller]
pub fn run_cmd(cmd: &mut Command, timeout: Duration) -> CmdOutput {
    let line = cmdline(cmd);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run `{line}`: {e}"));
    let out = child.stdout.take().unwrap();
    let err = child.stderr.take().unwrap();
    let t_out = thread::spawn(move || read_all(out));
    let t_err = thread::spawn(move || read_all(err));
    let Some(status) = wait_timeout(&mut child, timeout) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "`{line}` did not finish within {timeout:?}; killed it. stderr so far:\n{}",
            t_err.join().unwrap_or_default()
        );
    };
    CmdOutput {
        cmdline: line,
        status,
        stdout: t_out.join().unwrap_or_default(),
        stderr: t_err.join().unwrap_or_default(),
    }
}

fn read_all(mut r: impl Read) -> String {
    let mut buf = Vec::new();
    let _ = r.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait().expect("wait") {
            return Some(st);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// Runs qemu-io on a raw `uri` with one `-c` per command.
pub fn qemu_io(uri: &str, cmds: &[&str]) -> CmdOutput {
    let mut args: Vec<&str> = vec!["-f", "raw", uri];
    for c in cmds {
        args.push("-c");
        args.push(c);
    }
    tool("qemu-io", args)
}

/// Runs an external tool (which must exist) with args.
#[track_caller]
pub fn tool<I, S>(name: &str, args: I) -> CmdOutput
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let path = require_tool(name);
    let mut cmd = Command::new(path);
    cmd.args(args);
    run_cmd(&mut cmd, CMD_TIMEOUT)
}

/// Runs one of tests/nbdsh/*.py with the libnbd-capable python3.
#[track_caller]
pub fn nbd_script<I, S>(script: &str, args: I) -> CmdOutput
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = python_cmd(script);
    cmd.args(args);
    run_cmd(&mut cmd, CMD_TIMEOUT)
}

/// `nbdtool.py fill`: writes the pattern of `seed` from `offset` on until
/// ENOSPC or the volume's end; returns (bytes written, whether it ended with
/// ENOSPC). Unless `bare`, the tool also checks that the connection stays
/// usable after ENOSPC (a read back, an overwrite, a flush).
#[track_caller]
pub fn nbd_fill(uri: &str, seed: u64, offset: u64, bare: bool) -> (u64, bool) {
    let (seed, offset) = (seed.to_string(), offset.to_string());
    let mut args = vec!["fill", uri, "--seed", &seed, "--offset", &offset];
    if bare {
        args.push("--bare");
    }
    let out = nbd_script("nbdtool.py", args);
    let line = out.ok().lines().last().unwrap_or_default().to_string();
    let v: Value = serde_json::from_str(&line)
        .unwrap_or_else(|e| panic!("fill output ({e}):\n{}", out.describe()));
    (
        v["filled"].as_u64().unwrap_or(0),
        v["enospc"].as_bool().unwrap_or(false),
    )
}

/// `nbdtool.py trim` of `length` bytes at `offset`, then a flush.
#[track_caller]
pub fn nbd_trim(uri: &str, offset: u64, length: u64) {
    nbd_script(
        "nbdtool.py",
        [
            "trim",
            uri,
            "--offset",
            &offset.to_string(),
            "--length",
            &length.to_string(),
            "--flush",
        ],
    )
    .ok();
}

pub fn python_cmd(script: &str) -> Command {
    let mut cmd = Command::new(python_nbd());
    cmd.arg(nbdsh_script(script))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONUNBUFFERED", "1");
    cmd
}

/// A long-running child whose stdout lines are readable with a timeout.
pub struct Background {
    pub child: Child,
    pub name: String,
    lines: mpsc::Receiver<String>,
    pub seen: Vec<String>,
    stderr: Option<thread::JoinHandle<String>>,
    pub stdin: Option<ChildStdin>,
}

impl Background {
    pub fn spawn(mut cmd: Command) -> Background {
        let name = cmdline(&cmd);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run `{name}`: {e}"));
        let out = child.stdout.take().unwrap();
        let err = child.stderr.take().unwrap();
        let stdin = child.stdin.take();
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                match line {
                    Ok(l) => {
                        if tx.send(l).is_err() {
                            break;
                        }
                    }
                    Err(_) => break,
                }
            }
        });
        let stderr = Some(thread::spawn(move || read_all(err)));
        Background {
            child,
            name,
            lines: rx,
            seen: Vec::new(),
            stderr,
            stdin,
        }
    }

    /// Waits for a stdout line equal to `want`; panics (with everything seen) otherwise.
    #[track_caller]
    pub fn wait_line(&mut self, want: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    let hit = l.trim() == want;
                    self.seen.push(l);
                    if hit {
                        return;
                    }
                }
                Err(_) => {
                    let st = self.child.try_wait().ok().flatten();
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    let err = self.stderr.take().map(|t| t.join().unwrap_or_default());
                    panic!(
                        "`{}` did not print {want:?} within {timeout:?} (exit status {st:?}).\n\
                         --- stdout ---\n{}\n--- stderr ---\n{}",
                        self.name,
                        self.seen.join("\n"),
                        err.unwrap_or_default()
                    );
                }
            }
        }
    }

    /// The next stdout line (also kept in `seen`), or `None` if none came
    /// within `timeout` (or stdout ended).
    pub fn next_line(&mut self, timeout: Duration) -> Option<String> {
        let l = self.lines.recv_timeout(timeout).ok()?;
        self.seen.push(l.clone());
        Some(l)
    }

    /// Writes `line` and a newline to the child's stdin.
    #[track_caller]
    pub fn send_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin is still open");
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .unwrap_or_else(|e| panic!("cannot write {line:?} to `{}`: {e}", self.name));
    }

    /// Closes stdin, waits for exit, returns (status, stdout, stderr).
    pub fn finish(mut self, timeout: Duration) -> (ExitStatus, String, String) {
        drop(self.stdin.take());
        let st = wait_timeout(&mut self.child, timeout).unwrap_or_else(|| {
            let _ = self.child.kill();
            let _ = self.child.wait();
            panic!("`{}` did not exit within {timeout:?}", self.name)
        });
        while let Ok(l) = self.lines.recv_timeout(Duration::from_millis(200)) {
            self.seen.push(l);
        }
        let err = self
            .stderr
            .take()
            .map(|t| t.join().unwrap_or_default())
            .unwrap_or_default();
        (st, self.seen.join("\n"), err)
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

// ---------------------------------------------------------------------------
// Server

#[derive(Clone, Debug)]
pub struct ServerInfo {
    pub api_url: String,
    pub nbd: String,
    pub pid: u32,
}

/// A fresh directory under $TMPDIR, removed on drop unless the test failed.
fn fresh_dir() -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let p = std::env::temp_dir().join(format!(
        "basalt-e2e-{}-{}-{nanos}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    // Private, as the server keeps its data directory (it would fix and
    // log anything more open).
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&p)
        .expect("create test dir");
    p
}

/// A scratch directory for a test's own files (removed on drop unless the test failed).
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new() -> Scratch {
        Scratch(fresh_dir())
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if thread::panicking() {
            eprintln!("test failed; kept scratch dir {}", self.0.display());
        } else {
            let _ = fs::remove_dir_all(&self.0);
        }
    }
}

pub struct Server {
    path: PathBuf,
    child: Option<Child>,
    info: Option<ServerInfo>,
    args: Vec<String>,
    starts: u32,
    /// The network namespace the server (and its CLI) runs in.
    netns: Option<String>,
}

impl Server {
    /// Starts `basalt server --capacity CAPACITY` in a new temporary data dir.
    pub fn start(capacity: &str) -> Server {
        Server::start_with(capacity, &[])
    }

    pub fn start_with(capacity: &str, extra: &[&str]) -> Server {
        Server::start_on(capacity, extra, None)
    }

    /// [`Server::start_with`] on `host`: inside its network namespace,
    /// listening on its address (NBD, NVMe/TCP and API on port 0; the CLI
    /// runs there too). `None`: on 127.0.0.1 in the test's namespace.
    pub fn start_on(capacity: &str, extra: &[&str], host: Option<&netns::Host>) -> Server {
        Self::launch(capacity, extra, host, true)
    }

    /// A server whose NBD over TCP requires TLS with pre-shared keys
    /// (`--nbd-listen` without `--nbd-insecure`); `nbd_addr` is that
    /// address.
    pub fn start_tls(capacity: &str) -> Server {
        Self::launch(capacity, &[], None, false)
    }

    fn launch(capacity: &str, extra: &[&str], host: Option<&netns::Host>, plain: bool) -> Server {
        let path = fresh_dir();
        let ip = host.map_or("127.0.0.1".to_string(), |h| h.ip.to_string());
        let any_port = format!("{ip}:0");
        let mut args: Vec<String> = vec![
            "server".into(),
            "--data-dir".into(),
            path.display().to_string(),
            "--capacity".into(),
            capacity.into(),
        ];
        if plain {
            // The tests' clients speak NBD over TCP (the guest's kernel
            // client too); the Unix socket is tested on its own.
            args.push("--nbd-insecure".into());
        }
        args.extend([
            "--nbd-listen".into(),
            any_port.clone(),
            "--nvme-listen".into(),
            any_port.clone(),
            "--iscsi-listen".into(),
            any_port.clone(),
            "--api-listen".into(),
            any_port,
        ]);
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut s = Server {
            path,
            child: None,
            info: None,
            args,
            starts: 0,
            netns: host.map(|h| h.netns.clone()),
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        assert!(self.child.is_none(), "server already running");
        self.starts += 1;
        let log = fs::OpenOptions::new()
            .mode(0o600)
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("server log");
        let mut log2 = log.try_clone().unwrap();
        let _ = writeln!(
            log2,
            "===== test harness: start #{} of `basalt {}`",
            self.starts,
            self.args.join(" ")
        );
        let mut cmd = Command::new(bin());
        in_netns(&mut cmd, self.netns.as_deref());
        let child = cmd
            .args(&self.args)
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin()));
        let pid = child.id();
        self.child = Some(child);
        self.info = None;
        // server.json is written once listening. A stale one from a killed
        // predecessor may exist: only accept the one naming our child's pid.
        let deadline = Instant::now() + START_TIMEOUT;
        let json_path = self.path.join("server.json");
        loop {
            if let Some(st) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                panic!(
                    "basalt server exited with {st:?} before writing server.json.\n--- server log ---\n{}",
                    self.log()
                );
            }
            if let Ok(text) = fs::read_to_string(&json_path) {
                if let Ok(v) = serde_json::from_str::<Value>(&text) {
                    if v["pid"].as_u64() == Some(pid as u64) {
                        let info = ServerInfo {
                            api_url: v["api_url"]
                                .as_str()
                                .unwrap_or_else(|| panic!("server.json without api_url: {text}"))
                                .trim_end_matches('/')
                                .to_string(),
                            // Plain TCP, or TLS (Server::start_tls).
                            nbd: v["nbd"]
                                .as_str()
                                .or(v["nbd_tls"].as_str())
                                .unwrap_or_else(|| panic!("server.json without nbd: {text}"))
                                .to_string(),
                            pid,
                        };
                        if self.path.join("api-token").exists() {
                            self.info = Some(info);
                            return;
                        }
                    }
                }
            }
            if Instant::now() >= deadline {
                let _ = self.child.as_mut().unwrap().kill();
                let _ = self.child.as_mut().unwrap().wait();
                self.child = None;
                panic!(
                    "basalt server did not write server.json (with pid {pid}) and api-token \
                     within {START_TIMEOUT:?}.\n--- server log ---\n{}",
                    self.log()
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn data_dir(&self) -> &Path {
        &self.path
    }

    /// The network namespace the server runs in (`None`: the test's own).
    pub fn netns(&self) -> Option<&str> {
        self.netns.as_deref()
    }

    pub fn log_path(&self) -> PathBuf {
        self.path.join("server.log")
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn info(&self) -> &ServerInfo {
        self.info.as_ref().expect("server is not running")
    }

    pub fn pid(&self) -> u32 {
        self.info().pid
    }

    pub fn nbd_addr(&self) -> &str {
        &self.info().nbd
    }

    pub fn api_url(&self) -> &str {
        &self.info().api_url
    }

    /// The NVMe/TCP listen address from `server.json` (the host's view;
    /// discovery advertises `--nvme-advertise` if given).
    pub fn nvme_addr(&self) -> std::net::SocketAddr {
        let text = fs::read_to_string(self.path.join("server.json")).expect("server.json");
        let v: Value = serde_json::from_str(&text).expect("server.json is JSON");
        v["nvme"]
            .as_str()
            .unwrap_or_else(|| panic!("server.json without nvme: {text}"))
            .parse()
            .unwrap_or_else(|e| panic!("server.json's nvme address: {e}: {text}"))
    }

    pub fn uri(&self, volume: &str) -> String {
        format!("nbd://{}/{}", self.nbd_addr(), volume)
    }

    pub fn token(&self) -> String {
        fs::read_to_string(self.path.join("api-token"))
            .expect("api-token")
            .trim()
            .to_string()
    }

    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => c.try_wait().unwrap().is_none(),
            None => false,
        }
    }

    /// `basalt ARGS... --data-dir DIR`
    #[track_caller]
    pub fn cli(&self, args: &[&str]) -> CmdOutput {
        cli_in_netns(&self.path, args, self.netns())
    }

    /// The iSCSI portal from server.json.
    pub fn iscsi_addr(&self) -> std::net::SocketAddr {
        let text = fs::read_to_string(self.path.join("server.json")).expect("server.json");
        let v: Value = serde_json::from_str(&text).expect("server.json is JSON");
        v["iscsi"]
            .as_str()
            .unwrap_or_else(|| panic!("server.json without iscsi: {text}"))
            .parse()
            .unwrap_or_else(|e| panic!("server.json's iscsi address: {e}: {text}"))
    }

    /// The address the iSCSI target listens on. server.json names the
    /// advertised portal (the guest-side one with `--iscsi-advertise`), so
    /// it is read from the (latest start's) log line "iSCSI listening on
    /// ADDR (portal ...)".
    pub fn iscsi_listen_addr(&self) -> std::net::SocketAddr {
        let log = self.log();
        log.lines()
            .rev()
            .filter_map(|l| l.split("iSCSI listening on ").nth(1))
            .filter_map(|rest| rest.split_whitespace().next())
            .find_map(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no \"iSCSI listening on\" in the server log:\n{log}"))
    }

    /// Runs the CLI with `--output json`, asserting success; returns the parsed JSON.
    #[track_caller]
    pub fn cli_json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["--output", "json"]);
        let out = self.cli(&a);
        out.ok();
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| {
            panic!("--output json is not valid JSON ({e}):\n{}", out.describe())
        })
    }

    #[track_caller]
    pub fn create_volume(&self, name: &str, size: &str) {
        self.cli(&["volume", "create", name, "--size", size]).ok();
    }

    /// SIGKILL the server (by the PID of the child we started) and reap it.
    pub fn kill9(&mut self) {
        let mut child = self.child.take().expect("server is not running");
        child.kill().expect("kill -9");
        let st = child.wait().expect("wait");
        assert_eq!(
            st.signal(),
            Some(libc::SIGKILL),
            "server exited with {st:?} before it was killed.\n--- server log ---\n{}",
            self.log()
        );
        self.info = None;
    }

    /// Sends `sig` (SIGSTOP, SIGCONT …) to the running server, by the PID of
    /// the child we started.
    pub fn signal(&mut self, sig: libc::c_int) {
        let child = self.child.as_ref().expect("server is not running");
        // SAFETY: plain kill(2) on the PID of our own child, which has not been reaped yet.
        let rc = unsafe { libc::kill(child.id() as libc::pid_t, sig) };
        assert_eq!(rc, 0, "kill({sig}) failed");
    }

    /// SIGTERM the server and wait for it to exit; returns its exit status.
    pub fn sigterm(&mut self, timeout: Duration) -> ExitStatus {
        let mut child = self.child.take().expect("server is not running");
        let pid = child.id() as libc::pid_t;
        // SAFETY: plain kill(2) on the PID of our own child, which has not been reaped yet.
        let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
        assert_eq!(rc, 0, "kill(SIGTERM) failed");
        let st = wait_timeout(&mut child, timeout);
        self.info = None;
        match st {
            Some(st) => st,
            None => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "server did not exit within {timeout:?} of SIGTERM (killed it).\n\
                     --- server log ---\n{}",
                    self.log()
                );
            }
        }
    }

    /// Starts the server again on the same data dir with the same arguments.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "stop the server before restarting it");
        self.spawn();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            eprintln!(
                "test failed; kept data dir {} (server.log there). Last server log lines:\n{}",
                self.path.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        } else {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

/// `basalt ARGS... --data-dir DIR` for any directory (e.g. one without a server).
#[track_caller]
pub fn cli_in(dir: &Path, args: &[&str]) -> CmdOutput {
    cli_in_netns(dir, args, None)
}

/// [`cli_in`] inside network namespace `netns` (where the server's API
/// address is reachable).
#[track_caller]
pub fn cli_in_netns(dir: &Path, args: &[&str], netns: Option<&str>) -> CmdOutput {
    // `--data-dir` goes last, where both a global flag and a per-command flag
    // are accepted (data_dir_flag_before_the_subcommand checks the other form).
    let mut cmd = Command::new(bin());
    in_netns(&mut cmd, netns);
    cmd.args(args)
        .arg("--data-dir")
        .arg(dir)
        .env("NO_COLOR", "1");
    run_cmd(&mut cmd, Duration::from_secs(60))
}

// ---------------------------------------------------------------------------
// JSON helpers (tolerant of the exact response shapes)

/// The volume objects of `volume list --output json` (an array, or an object with `volumes`).
pub fn volume_list(v: &Value) -> Vec<Value> {
    match v {
        Value::Array(a) => a.clone(),
        Value::Object(o) => o
            .get("volumes")
            .and_then(|x| x.as_array())
            .cloned()
            .unwrap_or_else(|| panic!("volume list JSON has no `volumes` array: {v}")),
        _ => panic!("volume list JSON is neither an array nor an object: {v}"),
    }
}

pub fn find_volume(list: &Value, name: &str) -> Option<Value> {
    volume_list(list)
        .into_iter()
        .find(|x| x["name"].as_str() == Some(name))
}

/// A volume's size in bytes from its JSON (`size_bytes` or `size`; may be nested in `volume`).
#[track_caller]
pub fn volume_size(v: &Value) -> u64 {
    let v = if v.get("volume").is_some_and(|x| x.is_object()) {
        &v["volume"]
    } else {
        v
    };
    for k in ["size_bytes", "size"] {
        if let Some(n) = v.get(k).and_then(|x| x.as_u64()) {
            return n;
        }
    }
    panic!("no numeric size_bytes/size in volume JSON: {v}")
}

// ---------------------------------------------------------------------------
// HTTP (tiny HTTP/1.0 client, enough for the API tests)

pub struct HttpResponse {
    pub status: u16,
    pub headers: HashMap<String, String>,
    pub body: String,
}

impl HttpResponse {
    #[track_caller]
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("response body is not JSON ({e}): {}", self.body))
    }
}

pub fn http(
    base_url: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> HttpResponse {
    let hostport = base_url
        .strip_prefix("http://")
        .unwrap_or_else(|| panic!("api_url {base_url} is not http://"))
        .trim_end_matches('/');
    let mut s = TcpStream::connect(hostport).expect("connect to API");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.0\r\nHost: {hostport}\r\nAccept: */*\r\n");
    if let Some(t) = token {
        req.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    if let Some(b) = body {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        ));
    }
    req.push_str("Connection: close\r\n\r\n");
    if let Some(b) = body {
        req.push_str(b);
    }
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read API response");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("malformed HTTP response: {text:?}"));
    let mut lines = head.lines();
    let status_line = lines.next().unwrap_or_default();
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let mut headers = HashMap::new();
    for l in lines {
        if let Some((k, v)) = l.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let body = if headers
        .get("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    HttpResponse {
        status,
        headers,
        body,
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((len, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n..];
        s = s.strip_prefix("\r\n").unwrap_or(s);
    }
    out
}

// ---------------------------------------------------------------------------
// Randomness and patterns

/// Seed for randomized tests: $BASALT_TEST_SEED or the clock. Printed so a
/// failure can be replayed.
pub fn test_seed(test: &str) -> u64 {
    let seed = std::env::var("BASALT_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                % 1_000_000_007
        });
    eprintln!("{test}: seed {seed} (rerun with BASALT_TEST_SEED={seed})");
    seed
}

/// splitmix64
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo)
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// Compares two files' contents, describing the first difference.
#[track_caller]
pub fn assert_files_equal(a: &Path, b: &Path) {
    let x = fs::read(a).unwrap_or_else(|e| panic!("read {}: {e}", a.display()));
    let y = fs::read(b).unwrap_or_else(|e| panic!("read {}: {e}", b.display()));
    assert_eq!(
        x.len(),
        y.len(),
        "{} and {} differ in size",
        a.display(),
        b.display()
    );
    if let Some(i) = x.iter().zip(&y).position(|(p, q)| p != q) {
        panic!(
            "{} and {} differ first at byte {i} (4 KiB block {})",
            a.display(),
            b.display(),
            i / 4096
        );
    }
}

/// `nbdinfo --map --json URI` as (offset, length, type) triples, checked to
/// tile the export exactly.
#[track_caller]
pub fn nbd_map(uri: &str, size: u64) -> Vec<(u64, u64, u64)> {
    let out = tool("nbdinfo", ["--map", "--json", uri]);
    out.ok();
    let v: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "nbdinfo --map --json output is not JSON ({e}): {}",
            out.stdout
        )
    });
    let mut res = Vec::new();
    let mut pos = 0;
    for e in v.as_array().expect("map array") {
        let off = e["offset"].as_u64().unwrap();
        let len = e["length"].as_u64().unwrap();
        let ty = e["type"].as_u64().unwrap();
        assert_eq!(off, pos, "map not contiguous: {v}");
        pos += len;
        res.push((off, len, ty));
    }
    assert_eq!(pos, size, "map does not cover the export: {v}");
    res
}

/// Bytes of [off, off+len) that the map reports with type `ty` bits all set / clear.
pub fn map_bytes(map: &[(u64, u64, u64)], off: u64, len: u64, pred: impl Fn(u64) -> bool) -> u64 {
    map.iter()
        .filter(|(_, _, t)| pred(*t))
        .map(|&(o, l, _)| {
            let s = o.max(off);
            let e = (o + l).min(off + len);
            e.saturating_sub(s)
        })
        .sum()
}

/// What a run of libiscsi's `iscsi-test-cu` printed: its summary line's
/// tests (total, run, passed, failed), and everything it printed.
pub struct SuiteRun {
    pub total: u64,
    pub ran: u64,
    pub passed: u64,
    pub failed: u64,
    pub summary: String,
    pub log: String,
}

/// Reads `iscsi-test-cu`'s output; panics (with the output) if it printed
/// no run summary.
pub fn iscsi_suite_run(out: &CmdOutput) -> SuiteRun {
    let log = format!("{}{}", out.stdout, out.stderr);
    let summary = log
        .lines()
        .find(|l| l.trim_start().starts_with("tests "))
        .unwrap_or_else(|| panic!("no run summary:\n{log}"))
        .to_string();
    let n: Vec<u64> = summary
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let [total, ran, passed, failed, ..] = n[..] else {
        panic!("a run summary without its counts: {summary}\n{log}");
    };
    SuiteRun {
        total,
        ran,
        passed,
        failed,
        summary,
        log,
    }
}
