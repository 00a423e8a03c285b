//! Runs one guest in QEMU: the command line (TCG, one vCPU, the image's
//! `vmlinux` booted directly, the serial console on stdout, user networking
//! restricted to the forwards) and the process, which this module owns.
//!
//! Invariants:
//! - QEMU is only ever signalled through its own PID (the `Child` spawned
//!   here): killed and reaped when [`QemuProcess`] is dropped (timeout,
//!   error, panic unwinding), and killed by the kernel if the test process
//!   dies first (`PR_SET_PDEATHSIG`, tied to the spawning thread, which is
//!   the caller's and waits for QEMU).
//! - `-no-reboot` and `panic=-1`: a kernel panic or a reboot ends QEMU
//!   instead of looping.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStderr, ChildStdout, Command, ExitStatus, Stdio};

use crate::error::{Error, Result};
use crate::forward::{self, Forward};

/// The QEMU system emulator binary; `$BASALT_GUEST_QEMU` overrides it.
pub fn qemu_binary() -> OsString {
    std::env::var_os("BASALT_GUEST_QEMU").unwrap_or_else(|| "qemu-system-x86_64".into())
}

/// What one boot needs.
pub struct Spec<'a> {
    pub vmlinux: &'a Path,
    pub initrd: &'a Path,
    pub memory_mib: u32,
    pub nonce: &'a str,
    pub forwards: &'a [Forward],
}

/// The full QEMU invocation.
pub fn command(spec: &Spec<'_>) -> Command {
    let append = format!(
        "console=ttyS0 panic=-1 quiet loglevel=4 rdinit=/init basalt_nonce={}",
        spec.nonce
    );
    let mut cmd = Command::new(qemu_binary());
    cmd.args(["-accel", "tcg", "-smp", "1", "-m"])
        .arg(spec.memory_mib.to_string())
        .args([
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-serial",
            "stdio",
            "-no-reboot",
            "-kernel",
        ])
        .arg(spec.vmlinux)
        .arg("-initrd")
        .arg(spec.initrd)
        .arg("-append")
        .arg(append)
        .arg("-netdev")
        .arg(forward::netdev_arg(spec.forwards, forward::relay_path()))
        // No option ROM: the kernel is loaded directly, nothing network-boots.
        .args(["-device", "virtio-net-pci,netdev=net0,romfile="]);
    cmd
}

/// A running QEMU.
pub struct QemuProcess {
    child: Child,
}

impl QemuProcess {
    /// Spawns QEMU with stdout (the console) and stderr piped.
    pub fn spawn(mut cmd: Command) -> Result<(QemuProcess, ChildStdout, ChildStderr)> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: the closure only calls prctl(2), which is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|e| Error::MissingTool {
            tool: qemu_binary().to_string_lossy().into_owned(),
            detail: e.to_string(),
            hint: "install qemu-system-x86 (scripts/test.sh does)",
        })?;
        let (Some(out), Some(err)) = (child.stdout.take(), child.stderr.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(Error::io(
                "QEMU pipes",
                std::io::Error::other("stdout/stderr not captured"),
            ));
        };
        Ok((QemuProcess { child }, out, err))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status, if QEMU has exited.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        self.child
            .try_wait()
            .map_err(|e| Error::io("wait for QEMU", e))
    }

    /// SIGKILL (by PID) and reap.
    pub fn kill(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            tracing::warn!(pid = self.child.id(), "killing QEMU");
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

impl Drop for QemuProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
