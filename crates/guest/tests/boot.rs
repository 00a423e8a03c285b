//! The harness end to end: real Debian packages, a real QEMU guest.
//!
//! Needs what the harness needs (apt with package lists, qemu-system-x86,
//! cc); `scripts/test.sh` installs qemu-system-x86. The first run downloads
//! the packages (about 75 MB) into the cache.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::thread;
use std::time::Duration;

use basalt_guest::{Error, Forward, Guest, GuestConfig};

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_test_writer()
        .try_init();
}

/// A host server that answers each connection's first line with
/// `echo: LINE` and closes; serves `n` connections.
fn echo_server(n: usize) -> (SocketAddr, thread::JoinHandle<Vec<String>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = thread::spawn(move || {
        let mut seen = Vec::new();
        for _ in 0..n {
            let (s, _) = l.accept().unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            let line = line.trim().to_string();
            (&s).write_all(format!("echo: {line}\n").as_bytes())
                .unwrap();
            seen.push(line);
        }
        seen
    });
    (addr, t)
}

/// One boot checks what every later test relies on: the tools start (all
/// their libraries, real or stubbed, load), the modules are loaded, the
/// block devices exist, forwards carry several concurrent connections while
/// nothing else is reachable, and the script's exit status comes back.
#[test]
fn guest_runs_tools_reaches_forwards_only_and_reports_exit_status() {
    init_tracing();
    let (addr, server) = echo_server(2);
    let script = r#"
set -eux
cat /proc/version
for m in nbd nvme_tcp nvme_fabrics nvme_core iscsi_tcp ext4 virtio_net; do
    test -d /sys/module/$m
done
test -b /dev/nbd0
test -c /dev/nvme-fabrics
nbd-client -h 2>&1 | grep -q 'nbd-client version'
nvme version
fio --version
mkfs.ext4 -V
fsck.ext4 -V
# two connections at once through the forward
( echo one | nc 10.0.2.100 7000 > /tmp/a ) &
( echo two | nc 10.0.2.100 7000 > /tmp/b ) &
wait
grep -qx 'echo: one' /tmp/a
grep -qx 'echo: two' /tmp/b
# restrict=on: the user network's gateway (the host) is not reachable
if echo x | nc -w 3 10.0.2.2 22; then echo "gateway reachable"; exit 1; fi
echo all-checks-passed
exit 7
"#;
    let config = GuestConfig {
        forwards: vec![Forward::new(7000, addr)],
        timeout: Duration::from_secs(180),
        ..GuestConfig::default()
    };
    let run = Guest::boot(config, script).unwrap();
    assert_eq!(run.exit_code, 7, "script failed:\n{}", run.console_tail(60));
    assert!(run.console_log.contains("all-checks-passed"));
    assert!(!run.success());
    assert!(matches!(
        run.clone().ensure_success(),
        Err(Error::ScriptFailed { code: 7, .. })
    ));
    let mut seen = server.join().unwrap();
    seen.sort();
    assert_eq!(seen, ["one", "two"]);
    eprintln!(
        "boot to script: {:?}, whole run: {:?}",
        run.boot_time.unwrap(),
        run.duration
    );
}

#[test]
fn a_guest_that_does_not_finish_is_killed_with_the_console_tail() {
    init_tracing();
    let config = GuestConfig {
        timeout: Duration::from_secs(30),
        ..GuestConfig::default()
    };
    let started = std::time::Instant::now();
    let err = Guest::boot(config, "echo about-to-hang\nsleep 1000\n").unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(60));
    match err {
        Error::Timeout { phase, tail, .. } => {
            assert_eq!(phase, "the script was running");
            assert!(tail.contains("about-to-hang"), "{tail}");
        }
        other => panic!("expected a timeout, got {other}"),
    }
}

/// A guest that dies without reporting (here: a kernel panic) is a boot
/// error carrying the console tail, not a hang until the timeout.
#[test]
fn a_guest_that_crashes_is_a_boot_error_with_the_console_tail() {
    init_tracing();
    let config = GuestConfig {
        timeout: Duration::from_secs(120),
        ..GuestConfig::default()
    };
    let started = std::time::Instant::now();
    let err = Guest::boot(
        config,
        "echo crashing-now\necho c > /proc/sysrq-trigger\nsleep 60\n",
    )
    .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
    match err {
        Error::Boot { tail, .. } => {
            assert!(tail.contains("crashing-now"), "{tail}");
            assert!(tail.contains("Kernel panic"), "{tail}");
        }
        other => panic!("expected a boot error, got {other}"),
    }
}
