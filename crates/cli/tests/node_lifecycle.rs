//! The `basalt` binary end to end: a real server process on a temporary data
//! directory with ports picked by the OS, driven by the CLI's client
//! commands, stopped with SIGTERM and started again.

use serde_json::Value;
use std::io::Read;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_basalt");

/// A `basalt server` child process; killed if a test fails while it runs.
struct ServerProcess {
    child: Option<Child>,
    dir: PathBuf,
    log: PathBuf,
    out: PathBuf,
}

impl ServerProcess {
    fn spawn(dir: &Path, extra: &[&str]) -> ServerProcess {
        let log = dir.with_extension("stderr");
        let out = dir.with_extension("stdout");
        let child = Command::new(BIN)
            .args(["server", "--data-dir"])
            .arg(dir)
            .args([
                "--nbd-insecure",
                "--nbd-listen",
                "127.0.0.1:0",
                "--nvme-listen",
                "127.0.0.1:0",
                "--iscsi-listen",
                "127.0.0.1:0",
                "--api-listen",
                ":0",
            ])
            .args(extra)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        ServerProcess {
            child: Some(child),
            dir: dir.to_path_buf(),
            log,
            out,
        }
    }

    /// Waits until server.json names a live server; returns it.
    fn wait_ready(&mut self) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(text) = std::fs::read_to_string(self.dir.join("server.json")) {
                if let Ok(v) = serde_json::from_str::<Value>(&text) {
                    return v;
                }
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "server exited with {status} before it was ready:\n{}",
                    self.stderr()
                );
            }
            assert!(
                Instant::now() < deadline,
                "server not ready in 30 s:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for the process to exit by itself.
    fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "server did not exit in 30 s:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends SIGTERM and waits for the exit status.
    fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = self.child.as_ref().unwrap().id() as libc::pid_t;
        // SAFETY: plain syscall aimed at our own child process.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        self.wait_exit()
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn stdout(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs a client command against `dir`'s server.
fn basalt(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .arg("--data-dir")
        .arg(dir)
        .env_remove("BASALT_URL")
        .env_remove("BASALT_TOKEN")
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts success and returns stdout.
fn ok(o: Output) -> String {
    assert!(
        o.status.success(),
        "status {}: {}{}",
        o.status,
        stdout(&o),
        stderr(&o)
    );
    stdout(&o)
}

/// Asserts exit status 1 with one `error: …` line; returns it.
fn fails(o: Output) -> String {
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let err = stderr(&o);
    assert!(
        err.starts_with("error: ") && err.lines().count() == 1,
        "{err:?}"
    );
    err
}

#[test]
fn server_serves_volumes_and_stops_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("node");
    let mut server =
        ServerProcess::spawn(&dir, &["--capacity", "256M", "--demo-volume", "demo:64M"]);
    let info = server.wait_ready();
    let nbd = info["nbd"].as_str().unwrap().to_string();
    assert!(
        !nbd.ends_with(":0") && !info["api_url"].as_str().unwrap().ends_with(":0"),
        "{info}"
    );
    assert_eq!(
        info["pid"].as_u64(),
        Some(server.child.as_ref().unwrap().id() as u64)
    );
    // The printed lines work as printed: run the qemu-img and nbdinfo ones.
    let socket = info["nbd_socket"].as_str().unwrap().to_string();
    let stdout = server.stdout();
    for tool in ["qemu-img info ", "nbdinfo "] {
        let line = stdout
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with(tool))
            .unwrap_or_else(|| panic!("no `{tool}` line:\n{stdout}"));
        assert!(
            line.contains(&format!("'nbd+unix:///demo?socket={socket}'")),
            "{line}"
        );
        let out = std::process::Command::new("sh")
            .args(["-c", line])
            .output()
            .unwrap();
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("67108864"),
            "{line}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(server.stdout().contains("--ioengine=nbd"));
    let log = server.stderr();
    assert!(
        log.contains(&nbd) && log.contains(info["api_url"].as_str().unwrap()),
        "{log}"
    );
    let token = std::fs::read_to_string(dir.join("api-token")).unwrap();
    let node: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("node.json")).unwrap()).unwrap();
    assert_eq!(node["backing"], "file");

    // The NBD port speaks NBD.
    let mut magic = [0u8; 8];
    TcpStream::connect(&nbd)
        .unwrap()
        .read_exact(&mut magic)
        .unwrap();
    assert_eq!(&magic, b"NBDMAGIC");

    // Client commands.
    let list = ok(basalt(&dir, &["volume", "list"]));
    let mut lines = list.lines();
    assert!(lines.next().unwrap().starts_with("NAME"), "{list}");
    assert!(lines.next().unwrap().starts_with("demo  64 MiB"), "{list}");
    let created = ok(basalt(&dir, &["volume", "create", "db", "--size", "32M"]));
    assert!(
        created.starts_with("created volume db (32 MiB)"),
        "{created}"
    );
    assert!(created.contains(&format!("nbd://{nbd}/db")), "{created}");
    let shown: Value =
        serde_json::from_str(&ok(basalt(&dir, &["volume", "show", "db", "-o", "json"]))).unwrap();
    assert_eq!(shown["size_bytes"], 32 << 20);
    let resized = ok(basalt(&dir, &["volume", "resize", "db", "--size", "48M"]));
    assert_eq!(resized.trim(), "resized volume db to 48 MiB");
    let err = fails(basalt(&dir, &["volume", "resize", "db", "--size", "16M"]));
    assert!(err.contains("--allow-shrink"), "{err}");
    ok(basalt(
        &dir,
        &["volume", "resize", "db", "--size", "16M", "--allow-shrink"],
    ));
    let listed: Value =
        serde_json::from_str(&ok(basalt(&dir, &["volume", "list", "--output", "json"]))).unwrap();
    let names: Vec<_> = listed["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["db", "demo"]);
    let status = ok(basalt(&dir, &["status"]));
    // A table: "field:" then the value, aligned to the longest field.
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")).map(str::trim))
            .unwrap_or_default()
            .to_string()
    };
    assert!(field("provisioned").starts_with("80 MiB"), "{status}");
    assert_eq!(field("nbd"), nbd, "{status}");
    assert_eq!(field("data checksums"), "on, no errors", "{status}");
    assert_eq!(
        ok(basalt(&dir, &["volume", "delete", "db"])).trim(),
        "deleted volume db"
    );

    // Errors: one line, exit 1; usage errors exit 2.
    let err = fails(basalt(&dir, &["volume", "show", "db"]));
    assert_eq!(err.trim(), "error: no volume named \"db\"");
    let err = fails(basalt(&dir, &["volume", "create", "demo", "--size", "4M"]));
    assert!(err.contains("already exists"), "{err}");
    let err = fails(basalt(&dir, &["volume", "create", "huge", "--size", "1T"]));
    assert!(err.contains("not enough capacity"), "{err}");
    let err = fails(basalt(&dir, &["volume", "create", "x", "--size", "ten"]));
    assert!(err.contains("invalid size \"ten\""), "{err}");
    let usage = basalt(&dir, &["volume", "create", "x"]);
    assert_eq!(usage.status.code(), Some(2), "{}", stderr(&usage));
    let err = fails(
        Command::new(BIN)
            .args(["status", "--data-dir"])
            .arg(&dir)
            .args(["--token", "wrong"])
            .output()
            .unwrap(),
    );
    assert!(err.contains("invalid token"), "{err}");

    // A second server on the same directory is refused.
    let mut second = ServerProcess::spawn(&dir, &[]);
    let status = second.wait_exit();
    assert_eq!(status.code(), Some(1));
    assert!(
        second.stderr().contains("another process"),
        "{}",
        second.stderr()
    );

    // SIGTERM: exit 0, server.json removed, store marked clean.
    assert_eq!(server.terminate().code(), Some(0), "{}", server.stderr());
    assert!(!dir.join("server.json").exists());
    assert!(
        server.stderr().contains("store closed cleanly"),
        "{}",
        server.stderr()
    );
    let err = fails(basalt(&dir, &["volume", "list"]));
    assert!(err.contains("no basalt server is running"), "{err}");

    // Restart: no --capacity needed, same token, volumes kept.
    let mut again = ServerProcess::spawn(&dir, &["--capacity", "1G"]);
    again.wait_ready();
    assert_eq!(
        std::fs::read_to_string(dir.join("api-token")).unwrap(),
        token
    );
    assert!(
        again.stderr().contains("--capacity 1 GiB ignored"),
        "{}",
        again.stderr()
    );
    let list = ok(basalt(&dir, &["volume", "list"]));
    assert!(list.contains("demo") && !list.contains("db "), "{list}");
    assert_eq!(again.terminate().code(), Some(0));
}

#[test]
fn first_start_needs_a_capacity() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("node");
    let mut server = ServerProcess::spawn(&dir, &[]);
    assert_eq!(server.wait_exit().code(), Some(1));
    assert!(
        server.stderr().contains("--capacity is required"),
        "{}",
        server.stderr()
    );
    assert!(!dir.join("node.json").exists());
}

#[test]
fn a_lost_catalog_is_not_reconciled_against_the_store() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("node");
    let mut server = ServerProcess::spawn(&dir, &["--capacity", "64M"]);
    server.wait_ready();
    assert_eq!(server.terminate().code(), Some(0));
    std::fs::remove_file(dir.join("catalog.redb")).unwrap();
    let mut server = ServerProcess::spawn(&dir, &[]);
    assert_eq!(server.wait_exit().code(), Some(1));
    assert!(
        server.stderr().contains("refusing to start"),
        "{}",
        server.stderr()
    );
}

#[test]
fn client_explains_a_missing_or_dead_server() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("node");
    let err = fails(basalt(&dir, &["status"]));
    assert!(
        err.contains("no basalt server is running") && err.contains("basalt server --data-dir"),
        "{err}"
    );

    // A server.json left behind by a process that is gone.
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("api-token"), "t\n").unwrap();
    std::fs::write(
        dir.join("server.json"),
        r#"{"api_url": "http://127.0.0.1:9", "nbd": "127.0.0.1:9", "pid": 4194303}"#,
    )
    .unwrap();
    let err = fails(basalt(&dir, &["volume", "list"]));
    assert!(err.contains("(pid 4194303) is not running"), "{err}");

    let err = fails(
        Command::new(BIN)
            .args(["status", "--url", "http://127.0.0.1:9", "--token", "t"])
            .output()
            .unwrap(),
    );
    assert!(
        err.contains("cannot reach the basalt server at http://127.0.0.1:9"),
        "{err}"
    );
}

/// `basalt store check` and `basalt store upgrade` work on a stopped node
/// only, and report in one line of error otherwise.
#[test]
fn store_commands_check_and_upgrade_a_stopped_node() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("node");
    let err = fails(basalt(&dir, &["store", "check"]));
    assert!(err.contains("no node"), "{err}");
    let mut server =
        ServerProcess::spawn(&dir, &["--capacity", "256M", "--demo-volume", "demo:64M"]);
    server.wait_ready();
    let err = fails(basalt(&dir, &["store", "check"]));
    assert!(
        err.contains("server.json") && err.contains("stop it"),
        "{err}"
    );
    assert_eq!(server.terminate().code(), Some(0), "{}", server.stderr());

    let out = ok(basalt(&dir, &["store", "upgrade", "--dry-run"]));
    assert!(
        out.contains("format version 2") && out.contains("nothing to do"),
        "{out}"
    );
    let out = ok(basalt(&dir, &["store", "check"]));
    assert!(
        out.contains("closed cleanly") && out.contains("consistent"),
        "{out}"
    );
    // The checked store is closed cleanly and serves again.
    let mut again = ServerProcess::spawn(&dir, &[]);
    again.wait_ready();
    let list = ok(basalt(&dir, &["volume", "list"]));
    assert!(list.contains("demo"), "{list}");
    assert_eq!(again.terminate().code(), Some(0), "{}", again.stderr());
}
