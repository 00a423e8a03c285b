//! The processes the bench starts (servers, tgtd, the bridge) and the tools
//! it runs: spawning in their own process group, stopping by PID (or by the
//! commands a server needs, like tgtadm for tgtd), and their CPU time from
//! `/proc`.

use super::*;

/// A server process the bench started.
pub(crate) struct ServerProcess {
    pub(super) name: String,
    pub(super) child: Child,
    pub(super) log: PathBuf,
    /// Commands (program and arguments) that make it exit, for a server
    /// that ignores SIGTERM (tgtd); empty: SIGTERM.
    pub(super) stop_commands: Vec<Vec<String>>,
    /// Files it leaves behind (tgtd's control socket), removed once it
    /// stopped.
    pub(super) leftovers: Vec<PathBuf>,
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

    pub(super) fn spawn_with(
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
    pub(super) fn exits_by(&mut self, until: Instant) -> bool {
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

    pub(super) fn stop_or_kill(&mut self) -> Result<(), String> {
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
pub(super) fn run_tool(argv: &[String]) -> Result<String, String> {
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
