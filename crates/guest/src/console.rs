//! The guest's serial console as the host sees it: a thread copies QEMU's
//! stdout (the serial port) into memory as it arrives, noting when the
//! init's marker lines appear; the harness reads the text, its tail and the
//! markers at any time.
//!
//! Invariants:
//! - Only markers carrying this boot's nonce count, so nothing the script
//!   prints (or an earlier boot's log) can fake an exit status.
//! - The capture never blocks QEMU: the thread reads until EOF (QEMU exited
//!   or was killed) whatever the harness does.

use std::io::Read;
use std::process::ChildStdout;
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Instant;

use crate::image::{MARK_EXIT, MARK_READY, MARK_SETUP_FAILED};

/// What the init reported, as far as seen.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Markers {
    /// The guest's uptime (seconds) when the script started.
    pub ready_uptime: Option<f64>,
    pub setup_failed: Option<String>,
    pub exit_code: Option<i32>,
}

/// Finds this boot's marker lines in console text.
pub fn parse_markers(text: &str, nonce: &str) -> Markers {
    let mut m = Markers::default();
    for line in text.lines() {
        let line = line.trim_end_matches('\r');
        let Some((mark, rest)) = line.split_once(' ') else {
            continue;
        };
        let Some(value) = rest.strip_prefix(nonce).and_then(|r| r.strip_prefix(' ')) else {
            continue;
        };
        match mark {
            MARK_READY => m.ready_uptime = value.trim().parse().ok(),
            MARK_SETUP_FAILED => m.setup_failed = Some(value.trim().to_string()),
            MARK_EXIT => m.exit_code = value.trim().parse().ok(),
            _ => {}
        }
    }
    m
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().map(|l| l.trim_end_matches('\r')).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[derive(Default)]
struct State {
    bytes: Vec<u8>,
    /// When the ready marker was first seen.
    ready_at: Option<Instant>,
}

/// A running capture.
pub struct Console {
    state: Arc<Mutex<State>>,
    thread: Option<JoinHandle<()>>,
}

impl Console {
    /// Starts copying `stdout`; with `echo`, every line also goes to the
    /// test's stderr as it arrives (captured by the test harness unless
    /// `--nocapture`).
    pub fn capture(mut stdout: ChildStdout, nonce: String, echo: bool) -> Console {
        let state = Arc::new(Mutex::new(State::default()));
        let st = state.clone();
        let ready = format!("{MARK_READY} {nonce} ");
        let thread = thread::spawn(move || {
            let mut buf = [0u8; 16 * 1024];
            let mut line = Vec::new();
            loop {
                let n = match stdout.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                };
                if echo {
                    for &b in &buf[..n] {
                        if b == b'\n' {
                            eprintln!(
                                "guest| {}",
                                String::from_utf8_lossy(&line).trim_end_matches('\r')
                            );
                            line.clear();
                        } else {
                            line.push(b);
                        }
                    }
                }
                let mut s = match st.lock() {
                    Ok(s) => s,
                    Err(poisoned) => poisoned.into_inner(),
                };
                let from = s.bytes.len().saturating_sub(ready.len() + 64);
                s.bytes.extend_from_slice(&buf[..n]);
                if s.ready_at.is_none()
                    && String::from_utf8_lossy(&s.bytes[from..]).contains(&ready)
                {
                    s.ready_at = Some(Instant::now());
                }
            }
        });
        Console {
            state,
            thread: Some(thread),
        }
    }

    /// Everything captured so far (lossily decoded).
    pub fn text(&self) -> String {
        let s = match self.state.lock() {
            Ok(s) => s,
            Err(poisoned) => poisoned.into_inner(),
        };
        String::from_utf8_lossy(&s.bytes).into_owned()
    }

    /// When this boot's ready marker arrived.
    pub fn ready_at(&self) -> Option<Instant> {
        match self.state.lock() {
            Ok(s) => s.ready_at,
            Err(poisoned) => poisoned.into_inner().ready_at,
        }
    }

    /// Waits for the capture to reach EOF (call after QEMU exited) and
    /// returns the whole text.
    pub fn finish(mut self) -> String {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.text()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_markers_with_this_nonce_count() {
        let text = "boot\r\nBASALT-GUEST-READY n1 2.51\r\n\
            BASALT-GUEST-EXIT n0 0\r\n\
            echo BASALT-GUEST-EXIT n1 0\r\n\
            BASALT-GUEST-EXIT n1 3\r\n";
        let m = parse_markers(text, "n1");
        assert_eq!(m.ready_uptime, Some(2.51));
        assert_eq!(m.exit_code, Some(3));
        assert_eq!(m.setup_failed, None);
        assert_eq!(parse_markers(text, "n2"), Markers::default());
        let f = parse_markers("BASALT-GUEST-SETUP-FAILED n1 insmod nbd\n", "n1");
        assert_eq!(f.setup_failed.as_deref(), Some("insmod nbd"));
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(tail("a\r\nb\nc\n", 2), "b\nc");
        assert_eq!(tail("a", 5), "a");
        assert_eq!(tail("", 5), "");
    }

    #[test]
    fn capture_reads_to_eof_and_times_the_ready_marker() {
        let mut child = std::process::Command::new("sh")
            .args([
                "-c",
                "echo hello; echo 'BASALT-GUEST-READY xyz 1.5'; echo bye",
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let c = Console::capture(child.stdout.take().unwrap(), "xyz".into(), false);
        child.wait().unwrap();
        let start = Instant::now();
        let text = c.finish();
        assert!(text.contains("hello") && text.ends_with("bye\n"), "{text}");
        assert!(start.elapsed().as_secs() < 5);
        assert_eq!(parse_markers(&text, "xyz").ready_uptime, Some(1.5));
    }
}
