//! Running fio: finding it and checking its version, and running one job
//! file to completion — locally or on load hosts in fio's client/server
//! mode — with a time limit, while the caller watches (progress, CPU).
//!
//! Invariants: fio is only ever signalled by the PID of the child started
//! here (SIGINT when the run is interrupted, SIGKILL at the time limit);
//! everything it printed is returned, whatever happened.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// The oldest fio with everything the job files use: the nbd engine and
/// `offset_increment` percentages (both new in fio 3.16).
pub const MIN_VERSION: (u32, u32) = (3, 16);

const INSTALL_HINT: &str = "install it with `sudo apt-get install fio` (Debian/Ubuntu; \
     the package includes the nbd engine), or put a fio >= 3.16 in PATH";

#[derive(Debug, thiserror::Error)]
pub enum FioError {
    #[error("fio is not installed (no `{0}` in PATH); {INSTALL_HINT}")]
    Missing(String),
    #[error("cannot run {path}: {source}")]
    Spawn {
        path: String,
        source: std::io::Error,
    },
    #[error("`{path} --version` printed {output:?}, not a fio version; {INSTALL_HINT}")]
    UnknownVersion { path: String, output: String },
    #[error("{version} is too old: basalt bench needs fio 3.16 or newer; {INSTALL_HINT}")]
    TooOld { version: String },
}

/// A usable fio binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fio {
    pub path: PathBuf,
    /// As fio prints it, e.g. `fio-3.33`.
    pub version: String,
}

/// `fio-3.33` → (3, 33); also `fio-3.33-12-gabcdef`, `fio-3.1`.
pub fn parse_version(text: &str) -> Option<(u32, u32)> {
    let rest = text.trim().strip_prefix("fio-")?;
    let mut parts = rest.split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor_text: String = parts
        .next()?
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    Some((major, minor_text.parse().ok()?))
}

impl Fio {
    /// Finds fio (`path` as a command name or path) and checks its version.
    pub fn find(path: &Path) -> Result<Fio, FioError> {
        let shown = path.display().to_string();
        let output = Command::new(path)
            .arg("--version")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => FioError::Missing(shown.clone()),
                _ => FioError::Spawn {
                    path: shown.clone(),
                    source: e,
                },
            })?;
        let text = String::from_utf8_lossy(&output.stdout).trim().to_string();
        let version = parse_version(&text).ok_or_else(|| FioError::UnknownVersion {
            path: shown.clone(),
            output: text.clone(),
        })?;
        if version < MIN_VERSION {
            return Err(FioError::TooOld { version: text });
        }
        Ok(Fio {
            path: path.to_path_buf(),
            version: text,
        })
    }
}

/// A load host as given (`HOST`, `HOST:PORT`, `[V6]:PORT`) in fio's
/// `--client` syntax (`HOST`, `HOST,PORT`, `ip6:V6,PORT`).
pub fn client_arg(host: &str) -> String {
    if let Some(rest) = host.strip_prefix('[') {
        if let Some((addr, tail)) = rest.split_once(']') {
            return match tail.strip_prefix(':') {
                Some(port) => format!("ip6:{addr},{port}"),
                None => format!("ip6:{addr}"),
            };
        }
    }
    match host.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') => format!("{name},{port}"),
        _ => host.to_string(),
    }
}

/// How a fio run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    Exited,
    /// Killed at the time limit.
    TimedOut,
    /// Stopped with SIGINT because the bench was interrupted.
    Interrupted,
}

/// Everything about one finished fio run.
#[derive(Debug)]
pub struct Finished {
    pub status: Option<ExitStatus>,
    pub ending: Ending,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
    pub command: String,
}

impl Finished {
    pub fn success(&self) -> bool {
        self.ending == Ending::Exited && self.status.is_some_and(|s| s.success())
    }
}

/// One run of fio on a job file.
pub struct Invocation<'a> {
    pub job_file: &'a Path,
    /// Load hosts (client/server mode); empty: run locally.
    pub hosts: &'a [String],
    /// fio's working directory (it may leave files there).
    pub cwd: &'a Path,
    pub timeout: Duration,
}

fn read_all(mut r: impl Read + Send + 'static) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    })
}

/// Runs fio to completion. `watch` is called about every 100 ms with the
/// time since fio started; `interrupted` is polled as often.
pub fn run(
    fio: &Fio,
    inv: &Invocation<'_>,
    interrupted: &AtomicBool,
    watch: &mut dyn FnMut(Duration),
) -> Result<Finished, FioError> {
    let mut cmd = Command::new(&fio.path);
    for host in inv.hosts {
        cmd.arg(format!("--client={}", client_arg(host)));
    }
    // Not directly after a --client: fio would send the job file to that
    // client only. After another option, every client gets it.
    cmd.arg("--output-format=json+");
    cmd.arg(inv.job_file)
        .current_dir(inv.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let command = std::iter::once(fio.path.to_string_lossy().into_owned())
        .chain(cmd.get_args().map(|a| a.to_string_lossy().into_owned()))
        .collect::<Vec<_>>()
        .join(" ");
    let start = Instant::now();
    let mut child = cmd.spawn().map_err(|e| FioError::Spawn {
        path: fio.path.display().to_string(),
        source: e,
    })?;
    let stdout = child.stdout.take().map(read_all);
    let stderr = child.stderr.take().map(read_all);
    let pid = child.id();
    let mut ending = Ending::Exited;
    let mut sigint_at: Option<Instant> = None;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) => {}
            Err(_) => break None,
        }
        let elapsed = start.elapsed();
        if elapsed > inv.timeout {
            let _ = child.kill();
            ending = Ending::TimedOut;
            break child.wait().ok();
        }
        if interrupted.load(Ordering::Relaxed) {
            match sigint_at {
                None => {
                    if let Ok(pid) = libc::pid_t::try_from(pid) {
                        // SAFETY: kill(2) on the PID of our own child, which
                        // has not been reaped yet (try_wait said so).
                        unsafe { libc::kill(pid, libc::SIGINT) };
                    }
                    sigint_at = Some(Instant::now());
                    ending = Ending::Interrupted;
                }
                Some(at) if at.elapsed() > Duration::from_secs(10) => {
                    let _ = child.kill();
                    break child.wait().ok();
                }
                Some(_) => {}
            }
        }
        watch(elapsed);
        thread::sleep(Duration::from_millis(100));
    };
    let join = |h: Option<thread::JoinHandle<String>>| {
        h.map(|h| h.join().unwrap_or_default()).unwrap_or_default()
    };
    Ok(Finished {
        status,
        ending,
        stdout: join(stdout),
        stderr: join(stderr),
        elapsed: start.elapsed(),
        command,
    })
}

/// The last lines of `text` (at most `lines` lines and about `chars`
/// characters), for error messages.
pub fn tail(text: &str, lines: usize, chars: usize) -> String {
    let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut picked: Vec<&str> = Vec::new();
    let mut total = 0;
    for line in all.iter().rev().take(lines) {
        if total + line.len() > chars && !picked.is_empty() {
            break;
        }
        total += line.len();
        picked.push(line);
    }
    picked.reverse();
    let mut out = picked.join(" | ");
    if out.len() > chars {
        let cut = out
            .char_indices()
            .map(|(i, _)| i)
            .take_while(|&i| i <= chars)
            .last()
            .unwrap_or(0);
        out.truncate(cut);
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(parse_version("fio-3.33\n"), Some((3, 33)));
        assert_eq!(parse_version("fio-3.16"), Some((3, 16)));
        assert_eq!(parse_version("fio-3.1"), Some((3, 1)));
        assert_eq!(parse_version("fio-3.35-12-gabcdef"), Some((3, 35)));
        assert_eq!(parse_version("fio-2.2.10"), Some((2, 2)));
        assert_eq!(parse_version("3.33"), None);
        assert_eq!(parse_version(""), None);
        assert!(parse_version("fio-3.15").unwrap() < MIN_VERSION);
        assert!(parse_version("fio-3.33").unwrap() >= MIN_VERSION);
        assert!(parse_version("fio-4.0").unwrap() >= MIN_VERSION);
    }

    #[test]
    fn missing_fio_says_how_to_install() {
        let err = Fio::find(Path::new("fio-does-not-exist-here")).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, FioError::Missing(_)), "{msg}");
        assert!(msg.contains("apt-get install fio"), "{msg}");
        let old = FioError::TooOld {
            version: "fio-3.1".into(),
        }
        .to_string();
        assert!(
            old.contains("3.16") && old.contains("apt-get install fio"),
            "{old}"
        );
    }

    #[test]
    fn client_args() {
        assert_eq!(client_arg("h1"), "h1");
        assert_eq!(client_arg("127.0.0.1:8765"), "127.0.0.1,8765");
        assert_eq!(client_arg("[::1]:8765"), "ip6:::1,8765");
        assert_eq!(client_arg("[::1]"), "ip6:::1");
        assert_eq!(client_arg("::1"), "::1");
    }

    #[test]
    fn tails() {
        let text = "a\n\nb\nc\nd\n";
        assert_eq!(tail(text, 2, 100), "c | d");
        assert_eq!(tail(text, 10, 100), "a | b | c | d");
        assert_eq!(tail("", 3, 10), "");
        let long = "x".repeat(50);
        assert_eq!(tail(&long, 3, 10).chars().count(), 11);
    }
}
