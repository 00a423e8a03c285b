//! Context switches and CPU migrations of a server process over a cell,
//! counted by `perf stat` attached to it: every thread it has, and the
//! threads those start while the probe runs (perf's counters inherit).
//!
//! Why: a thread hand-off per I/O is a wake-up that costs tens of
//! microseconds on a VM, so switches per I/O tell a data path's structure
//! apart where IOPS alone do not.
//!
//! Invariant: the figures are absent, never zero, where perf is missing, not
//! permitted (`perf_event_paranoid`) or did not count; a probe never stops a
//! benchmark.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Counts of one probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Switches {
    pub context_switches: u64,
    pub cpu_migrations: u64,
}

/// A running `perf stat` attached to a process.
pub struct SwitchProbe {
    child: Child,
    out: PathBuf,
}

impl SwitchProbe {
    /// Starts counting for process `pid`, perf's report going to `out`;
    /// None if perf cannot be started.
    pub fn attach(pid: u32, out: &Path) -> Option<SwitchProbe> {
        let child = Command::new("perf")
            .args(["stat", "-e", "context-switches,cpu-migrations", "-x", ","])
            .arg("-p")
            .arg(pid.to_string())
            .arg("-o")
            .arg(out)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        Some(SwitchProbe {
            child,
            out: out.to_path_buf(),
        })
    }

    /// Stops counting (SIGINT makes perf print its counts) and reads them.
    pub fn finish(mut self) -> Option<Switches> {
        // SAFETY: kill(2) on the PID of a child we have not reaped yet.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGINT) };
        self.child.wait().ok()?;
        parse(&std::fs::read_to_string(&self.out).ok()?)
    }
}

impl Drop for SwitchProbe {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The counts from perf's CSV report (`-x ,`): `VALUE,UNIT,EVENT,…` lines;
/// None unless both events were counted.
pub fn parse(text: &str) -> Option<Switches> {
    let mut switches = None;
    let mut migrations = None;
    for line in text.lines() {
        let fields: Vec<&str> = line.split(',').collect();
        let (Some(value), Some(event)) = (fields.first(), fields.get(2)) else {
            continue;
        };
        let Ok(value) = value.trim().parse::<u64>() else {
            continue;
        };
        match event.trim() {
            "context-switches" | "cs" => switches = Some(value),
            "cpu-migrations" | "migrations" => migrations = Some(value),
            _ => {}
        }
    }
    Some(Switches {
        context_switches: switches?,
        cpu_migrations: migrations?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_perf_csv() {
        let text = "# started on Thu Nov 26 10:37:35 2026\n\n\
                    105,,context-switches,998776226,100.00,,\n\
                    3,,cpu-migrations,998781664,100.00,,\n";
        assert_eq!(
            parse(text),
            Some(Switches {
                context_switches: 105,
                cpu_migrations: 3
            })
        );
    }

    #[test]
    fn not_counted_is_absent() {
        let text = "<not counted>,,context-switches,0,100.00,,\n\
                    <not counted>,,cpu-migrations,0,100.00,,\n";
        assert_eq!(parse(text), None);
        assert_eq!(parse(""), None);
    }

    #[test]
    fn counts_a_busy_process() {
        if Command::new("perf").arg("--version").output().is_err() {
            eprintln!("perf not installed: skipped");
            return;
        }
        let dir = tempfile::tempdir().expect("a temporary directory");
        let out = dir.path().join("perf.txt");
        // A process that sleeps and wakes 200 times: ~200 switches.
        let mut sleeper = Command::new("sh")
            .args(["-c", "for i in $(seq 200); do sleep 0.005; done"])
            .spawn()
            .expect("sh");
        let probe = SwitchProbe::attach(sleeper.id(), &out);
        std::thread::sleep(std::time::Duration::from_millis(500));
        let counted = probe.and_then(SwitchProbe::finish);
        let _ = sleeper.kill();
        let _ = sleeper.wait();
        // perf may be present but not permitted: then nothing is claimed.
        if let Some(s) = counted {
            assert!(s.context_switches > 10, "{s:?}");
        }
    }
}
